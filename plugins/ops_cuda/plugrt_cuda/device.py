"""CUDA's runtime objects: the device state (primary context), allocator, programs and graphs.

Everything runs on the context's legacy default stream, which orders plugrt's work
after work other libraries (torch, cupy) put on their blocking streams. A launch is
one cuLaunchKernel through ctypes with every argument prepared: the kernelParams
array points at one ctypes value per kernel parameter, and a call only rewrites the
values that changed since the previous call.
"""
from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Sequence
from typing import Any

from plugrt.compiler.ir import Signature
from plugrt.errors import DeviceUnavailable, Reason, UnsupportedError
from plugrt.hookspecs import DeviceInfo
from plugrt.hwqueue import PinnedStaging
from plugrt.launchargs import NO_CALL, PreparedCall, ctypes_packer
from plugrt.runtime import Allocator, DeviceState, Graph, Launch, LaunchLimits, Program, buffer_address
from plugrt_cuda import driver as D
from plugrt_cuda import peer, trampoline

_tls = threading.local()  # the context current on this thread (cuCtxSetCurrent is per thread)
#: what else holds a GPU's memory and can give it back: each release(state) frees what it keeps on `state`'s GPU
_releases_on_out_of_memory: list[Callable[[CUDAState], object]] = []


def on_out_of_memory(release: Callable[[CUDAState], object]) -> None:
  """Have CUDAAllocator call `release(state)` whenever it gives its cache back, which an allocation that fails for
  memory does before its one retry: for memory a part of plugrt-cuda keeps on a GPU beside the allocator's (cuvid's
  decoders kept for reuse). Registering the same function again changes nothing."""
  if release not in _releases_on_out_of_memory: _releases_on_out_of_memory.append(release)


class CUDAState(DeviceState):
  """One GPU: its primary context (shared with torch and cupy), attributes and timing events."""

  def __init__(self, info: DeviceInfo):
    lib = D.libcuda()
    if lib is None: raise UnsupportedError("libcuda.so.1 (the NVIDIA driver) is not installed")
    self.lib, self.index = lib, info.index
    D.call("cuInit", 0)
    count = ctypes.c_int()
    D.call("cuDeviceGetCount", ctypes.byref(count))
    if info.index >= count.value:  # the probe predicted more GPUs than the driver shows (a CUDA_VISIBLE_DEVICES it could not check)
      raise DeviceUnavailable(f"{info.canonical} does not exist: the CUDA driver sees {count.value} GPU{'s' if count.value != 1 else ''}"
                              f"{f' (indices 0-{count.value - 1})' if count.value > 1 else ''}", Reason.NO_DEVICE,
                              f"use an index below {count.value}; CUDA_VISIBLE_DEVICES decides which GPUs the driver shows")
    self.dev, self.ctx = ctypes.c_int(), ctypes.c_void_p()
    D.call("cuDeviceGet", ctypes.byref(self.dev), info.index)
    D.call("cuDevicePrimaryCtxRetain", ctypes.byref(self.ctx), self.dev)
    self.make_current()
    self.cc = (self.attr(D.CU_DEVICE_ATTRIBUTE_CC_MAJOR), self.attr(D.CU_DEVICE_ATTRIBUTE_CC_MINOR))
    self.arch = f"sm_{self.cc[0]}{self.cc[1]}"
    self.max_threads = self.attr(D.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK)
    name = ctypes.create_string_buffer(256)
    D.call("cuDeviceGetName", name, 256, self.dev)
    self.name = name.value.decode()
    D.call("cuDeviceGetPCIBusId", name, 256, self.dev)
    self.bus_id = name.value.decode().lower()  # "0000:18:00.0", as the kernel driver's proc files and `plugrt devices` name it
    # gridDim (2**31-1, 65535, 65535) and blockDim (1024, 1024, 64) as the driver reports them
    self.launch_limits = LaunchLimits(f"{info.canonical} ({self.name})", [self.attr(a) for a in D.CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM],
                                      [self.attr(a) for a in D.CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM], self.max_threads)
    self.start, self.end = ctypes.c_void_p(), ctypes.c_void_p()
    D.call("cuEventCreate", ctypes.byref(self.start), 0)
    D.call("cuEventCreate", ctypes.byref(self.end), 0)
    self.stream = ctypes.c_void_p(0)  # the legacy default stream

  def attr(self, which: int) -> int:
    v = ctypes.c_int()
    D.call("cuDeviceGetAttribute", ctypes.byref(v), which, self.dev)
    return v.value

  def make_current(self) -> None:
    if getattr(_tls, "ctx", None) != self.ctx.value:
      D.call("cuCtxSetCurrent", self.ctx)
      _tls.ctx = self.ctx.value

  def synchronize(self) -> None:
    self.make_current()
    D.call("cuCtxSynchronize")

  def timed(self, run: Any) -> float:
    """Seconds the GPU spent on what run() enqueues, measured with events."""
    D.check(self.lib.cuEventRecord(self.start, self.stream), "cuEventRecord")
    run()
    D.check(self.lib.cuEventRecord(self.end, self.stream), "cuEventRecord")
    D.check(self.lib.cuEventSynchronize(self.end), "cuEventSynchronize")
    ms = ctypes.c_float()
    D.call("cuEventElapsedTime", ctypes.byref(ms), self.start, self.end)
    return ms.value / 1e3


class Staging(PinnedStaging):
  """Host <-> device copies of pageable memory through pinned buffers (memory from host_array skips this).

  plugrt.hwqueue.PinnedStaging cuts a copy into chunks, each through one of a ring of pinned buffers, the host side
  split across threads, the DMA of one chunk overlapping the memcpy of the next. Here the buffers come from
  cuMemHostAlloc and each has an event recorded after its DMA (the token a later use of the buffer waits for).
  Everything is on the device's stream, so copies stay ordered with kernels; a copy-in returns once its DMAs ended.
  """
  CHUNK, RING = 64 << 20, 2  # the fastest of the sizes and counts bench/cuda_copy.py tries (docs/performance.md)

  def __init__(self, state: CUDAState):
    # host memcpy scales with threads: pieces of a chunk from 1 MiB go to the pool
    super().__init__(threading.Lock(), chunk=self.CHUNK, buffers=self.RING, parallel_min=1 << 20, thread_name="plugrt-cuda-copy")
    self.state, self.lib = state, state.lib
    self.events: list[ctypes.c_void_p] = []

  def _new_buffer(self) -> int:
    p, ev = ctypes.c_void_p(), ctypes.c_void_p()
    D.call("cuMemHostAlloc", ctypes.byref(p), ctypes.c_size_t(self.chunk), D.CU_MEMHOSTALLOC_PORTABLE)
    D.call("cuEventCreate", ctypes.byref(ev), 2)  # CU_EVENT_DISABLE_TIMING
    self.events.append(ev)
    return p.value  # type: ignore[return-value]

  def _to_device(self, dest: int, k: int, n: int) -> ctypes.c_void_p:
    lib = self.lib
    D.check(lib.cuMemcpyHtoDAsync_v2(ctypes.c_uint64(dest), ctypes.c_void_p(self.buffers[k]), ctypes.c_size_t(n), self.state.stream),
            "cuMemcpyHtoDAsync")
    D.check(lib.cuEventRecord(self.events[k], self.state.stream), "cuEventRecord")
    return self.events[k]

  def _from_device(self, k: int, src: int, n: int) -> ctypes.c_void_p:
    lib = self.lib
    D.check(lib.cuMemcpyDtoHAsync_v2(ctypes.c_void_p(self.buffers[k]), ctypes.c_uint64(src), ctypes.c_size_t(n), self.state.stream),
            "cuMemcpyDtoHAsync")
    D.check(lib.cuEventRecord(self.events[k], self.state.stream), "cuEventRecord")
    return self.events[k]

  def _wait(self, token: ctypes.c_void_p) -> None: D.check(self.lib.cuEventSynchronize(token), "cuEventSynchronize")

  def _copied_in(self) -> None:
    for ev in self.events: self._wait(ev)  # the caller may reuse its memory now


class CUDAAllocator(Allocator[int]):
  """Plain device allocations (cuMemAlloc, never managed memory); a handle is the device address.
  Copies of 4 MiB and more go through pinned staging buffers (Staging); smaller ones straight through the driver."""
  STAGED = 4 << 20
  supports_transfer = True
  supports_wrap = True

  def __init__(self, device: DeviceInfo):
    super().__init__(device)
    self.state: CUDAState = device.state  # type: ignore[assignment]
    self.lib = self.state.lib
    self.staging = Staging(self.state)

  def _alloc(self, nbytes: int, options: Any) -> int:
    self.state.make_current()
    ptr = ctypes.c_uint64()
    D.check(self.lib.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(nbytes)), f"cuMemAlloc of {nbytes} bytes")
    return ptr.value

  def _free(self, handle: int, nbytes: int, options: Any) -> None:
    self.state.make_current()
    D.check(self.lib.cuMemFree_v2(ctypes.c_uint64(handle)), "cuMemFree")

  def _offset(self, handle: int, offset: int, nbytes: int) -> int: return handle + offset

  def free_cache(self) -> int:
    freed = super().free_cache()
    for release in tuple(_releases_on_out_of_memory): release(self.state)  # the GPU's memory others keep (on_out_of_memory)
    return freed

  def _host_alloc(self, nbytes: int) -> tuple[int, Any]:
    self.state.make_current()
    p = ctypes.c_void_p()
    D.check(self.lib.cuMemHostAlloc(ctypes.byref(p), ctypes.c_size_t(nbytes), D.CU_MEMHOSTALLOC_PORTABLE), f"cuMemHostAlloc of {nbytes} bytes")
    lib = self.lib
    return p.value, lambda: lib.cuMemFreeHost(p)  # type: ignore[return-value]

  def _pinned(self, addr: int) -> bool:
    """Whether host memory is page-locked (from host_array or registered): then the DMA can read it directly."""
    mtype = ctypes.c_uint()
    return self.lib.cuPointerGetAttribute(ctypes.byref(mtype), D.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ctypes.c_uint64(addr)) == 0 and mtype.value == 1

  def _copyin(self, dest: int, src: memoryview) -> None:
    self.state.make_current()
    if src.nbytes >= self.STAGED and not self._pinned(addr := buffer_address(src)): return self.staging.copyin(dest, addr, src.nbytes)
    D.check(self.lib.cuMemcpyHtoD_v2(ctypes.c_uint64(dest), ctypes.c_void_p(buffer_address(src)), ctypes.c_size_t(src.nbytes)),
            "cuMemcpyHtoD")

  def _copyout(self, dest: memoryview, src: int) -> None:
    self.state.make_current()
    if dest.nbytes >= self.STAGED and not self._pinned(addr := buffer_address(dest)): return self.staging.copyout(addr, src, dest.nbytes)
    D.check(self.lib.cuMemcpyDtoH_v2(ctypes.c_void_p(buffer_address(dest)), ctypes.c_uint64(src), ctypes.c_size_t(dest.nbytes)),
            "cuMemcpyDtoH")

  def _copy(self, dest: int, src: int, nbytes: int) -> None:
    self.state.make_current()
    D.check(self.lib.cuMemcpyDtoD_v2(ctypes.c_uint64(dest), ctypes.c_uint64(src), ctypes.c_size_t(nbytes)), "cuMemcpyDtoD")

  def _transfer(self, dest: int, src: int, nbytes: int, src_dev: Any, dest_dev: Any) -> None:
    s, d = src_dev.info.state, dest_dev.info.state
    if s.ctx.value == d.ctx.value: return dest_dev.allocator._copy(dest, src, nbytes)  # one GPU (CUDA and CUDA:PTX share its context)
    peer.link(s, d).copy(dest, src, nbytes)  # between two GPUs: peer to peer where they can, else staged by the driver (peer.py)

  def peer_path(self, dest_dev: Any) -> str:
    """"peer" when copies from this GPU to `dest_dev` go GPU to GPU; else how the driver stages them and why."""
    d = dest_dev.info.state
    return "peer" if d.ctx.value == self.state.ctx.value else peer.link(self.state, d).path

  def _wrap(self, ptr: int, nbytes: int) -> int:
    """A device pointer from another library (torch, cupy): checked to be device memory of this GPU, then used as is."""
    self.state.make_current()
    mtype, ordinal = ctypes.c_uint(), ctypes.c_int()
    r = self.lib.cuPointerGetAttribute(ctypes.byref(mtype), D.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ctypes.c_uint64(ptr))
    if r != 0 or mtype.value not in (D.CU_MEMORYTYPE_DEVICE, D.CU_MEMORYTYPE_UNIFIED):
      raise UnsupportedError(f"{ptr:#x} is not CUDA device memory, so CUDA:{self.state.index} cannot wrap it",
                             "pass a device pointer (tensor.data_ptr() of a CUDA tensor), or copy host data in with copyin")
    D.check(self.lib.cuPointerGetAttribute(ctypes.byref(ordinal), D.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ctypes.c_uint64(ptr)),
            "cuPointerGetAttribute")
    if mtype.value == D.CU_MEMORYTYPE_DEVICE and ordinal.value != self.state.index:
      raise UnsupportedError(f"{ptr:#x} is memory of CUDA:{ordinal.value}, not CUDA:{self.state.index}", f"wrap it on CUDA:{ordinal.value}")
    return ptr

  def dlpack_device(self) -> tuple[int, int]: return (2, self.state.index)  # kDLCUDA
  def _pointer(self, handle: int) -> int: return handle


class _Launch(PreparedCall):
  """One prepared launch: its parameter objects and cuLaunchKernel's arguments (as a tuple and as the trampoline's
  slots), never changed once built (cuLaunchKernel copies the parameter values when it is called)."""
  __slots__ = ("args", "slots", "slots_ptr", "values")

  def __init__(self, values: list[Any], args: tuple, slots: Any):
    super().__init__()
    self.values, self.args, self.slots = values, args, slots
    self.slots_ptr = ctypes.c_void_p(ctypes.addressof(slots))


_PARAMS_SLOT = 10  # where the trampoline's slots hold cuLaunchKernel's kernelParams (see _encode's slots)


class CUDAProgram(Program):
  scalar_packer = staticmethod(ctypes_packer)  # 16-bit floats as their bits; IEEE rounding, out of range: inf
  self_contained = True  # a launch is its parameter block and cuLaunchKernel's arguments (Program.self_contained)

  def __init__(self, device: Any, name: str, lib: bytes, signature: Signature):
    super().__init__(device, name, lib, signature)
    self.state: CUDAState = device.info.state
    self.state.make_current()
    self.module, fn = ctypes.c_void_p(), ctypes.c_void_p()
    image = lib if lib[:4] == b"\x7fELF" else lib + b"\0"  # a cubin is an ELF image; PTX text must end in NUL
    D.call("cuModuleLoadData", ctypes.byref(self.module), ctypes.c_char_p(image))
    D.call("cuModuleGetFunction", ctypes.byref(fn), self.module, name.encode())
    self.fn = fn
    self._launch = self.state.lib.cuLaunchKernel
    self._launch_addr = ctypes.cast(self._launch, ctypes.c_void_p).value
    self._tramp = trampoline.make()  # the launch's eleven arguments as 8-byte slots, for the one-argument trampoline (see trampoline.py)
    self.launch_limits = self.state.launch_limits

  @staticmethod
  def _params(bufs: tuple, scalars: Sequence[Any]) -> tuple[list[Any], Any]:
    """cuLaunchKernel's kernelParams (each parameter's address) and the objects holding the values: the buffers'
    addresses in one array, then the packed scalars."""
    handles = (ctypes.c_uint64 * len(bufs))(*[b.handle for b in bufs])
    at = ctypes.addressof(handles)
    addrs = [at + 8 * i for i in range(len(bufs))] + [ctypes.addressof(v) for v in scalars]
    return [handles, *scalars], (ctypes.c_void_p * max(len(addrs), 1))(*addrs)

  def _encode(self, bufs: tuple, scalars: tuple, gs: tuple[int, int, int], ls: tuple[int, int, int]) -> _Launch:
    values, params = self._params(bufs, scalars)
    u, stream = ctypes.c_uint, self.state.stream
    args = (self.fn, u(gs[0]), u(gs[1]), u(gs[2]), u(ls[0]), u(ls[1]), u(ls[2]), u(0), stream, params, None)
    slots = (ctypes.c_uint64 * trampoline.SLOTS)(self._launch_addr, self.fn.value, *gs, *ls, 0, stream.value or 0, ctypes.addressof(params), 0)
    return self._launch_of(values, args, slots)

  def _rebind(self, last: PreparedCall, bufs: tuple) -> _Launch:
    """The scalars and sizes of `last` with other buffers (a kernel run on each new frame, each in memory of its own):
    last's packed scalar objects, never changed once built, are shared, and only the buffers' addresses are new."""
    assert isinstance(last, _Launch)
    values, params = self._params(bufs, last.values[1:])
    slots = (ctypes.c_uint64 * trampoline.SLOTS)(*last.slots)
    slots[_PARAMS_SLOT] = ctypes.addressof(params)
    return self._launch_of(values, last.args[:-2] + (params, None), slots)

  def _launch_of(self, values: list[Any], args: tuple, slots: Any) -> _Launch:
    p = _Launch(values, args, slots)
    p.submit = self._submitter(p.slots_ptr, args)  # (not p itself: a cycle would keep its buffers until the collector runs)
    return p

  def _submitter(self, slots_ptr: Any, args: tuple) -> Callable[[], None]:
    """The prepared call's submit, a closure over what it reads: this GPU's context made current on the calling thread
    when it is not (cuLaunchKernel launches in the current context), then one call of the trampoline (or cuLaunchKernel)."""
    st, ctx, tramp, launch, name = self.state, self.state.ctx, self._tramp, self._launch, self.name

    def submit() -> None:
      if getattr(_tls, "ctx", None) != ctx.value: st.make_current()
      if (r := tramp(slots_ptr) if tramp else launch(*args)) != 0: D.check(r, f"cuLaunchKernel({name})")
    return submit

  def _timed(self, prepared: PreparedCall) -> float: return self.state.timed(prepared.submit)

  def __del__(self) -> None:
    try:
      self.state.make_current()
      self.state.lib.cuModuleUnload(self.module)
    except Exception: pass  # interpreter shutdown


class CUDAGraph(Graph):
  """The launches captured once into a CUDA graph; a call replays the whole batch with one cuGraphLaunch."""

  def __init__(self, device: Any, launches: Sequence[Launch]):
    super().__init__(device, launches)
    self.state: CUDAState = device.info.state
    st = self.state
    st.make_current()
    stream, graph = ctypes.c_void_p(), ctypes.c_void_p()
    D.call("cuStreamCreate", ctypes.byref(stream), D.CU_STREAM_NON_BLOCKING)
    try:
      D.call("cuStreamBeginCapture_v2", stream, D.CU_STREAM_CAPTURE_MODE_RELAXED)
      try:
        for ln in self.launches:
          prg = ln.program
          prepared = prg._prepare(NO_CALL, ln.bufs, ln.vals, ln.global_size, ln.local_size)  # kept alive: its args point into it
          args = list(prepared.args)  # the graph copies the parameter values now
          args[8] = stream
          D.check(prg._launch(*args), f"cuLaunchKernel({prg.name}) while capturing")
      finally:
        D.call("cuStreamEndCapture", stream, ctypes.byref(graph))
      self.exec = ctypes.c_void_p()
      D.call("cuGraphInstantiateWithFlags", ctypes.byref(self.exec), graph, ctypes.c_ulonglong(0))
    finally:
      if graph.value: st.lib.cuGraphDestroy(graph)
      st.lib.cuStreamDestroy_v2(stream)
    self._launch_graph = st.lib.cuGraphLaunch

  def _replay(self) -> None:
    st = self.state
    if getattr(_tls, "ctx", None) != st.ctx.value: st.make_current()
    if (r := self._launch_graph(self.exec, st.stream)) != 0: D.check(r, "cuGraphLaunch")

  def _timed(self) -> float: return self.state.timed(self._replay)

  def __del__(self) -> None:
    try: self.state.lib.cuGraphExecDestroy(self.exec)
    except Exception: pass


def load_program(device: Any, name: str, lib: bytes, signature: Signature) -> CUDAProgram:
  if lib[:4] == b"\x7fELF":  # a cubin (PTX is text, which the driver's JIT parses and rejects by itself)
    from plugrt.elf import ET_EXEC, ET_REL, check_elf
    check_elf(lib, f"CUDA program {name}", (ET_EXEC, ET_REL), 190)  # EM_CUDA: a truncated cubin raises here, not in the driver
  return CUDAProgram(device, name, lib, signature)
