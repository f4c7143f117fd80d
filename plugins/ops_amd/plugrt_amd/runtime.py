"""AMD's runtime objects on an opened KFD interface: the device state (an AQL compute queue, an SDMA copy queue,
kernarg blocks), the allocator and programs.

The interface object (`DeviceInfo.iface_object`) is what plugrt-amd-kfd's `plugrt_open_interface` returns: a
`plugrt_amd_kfd.kfdev.KFDDevice` (on hardware, or on a fake KFD in tests). This module uses it by its methods
only (alloc/free, compute_queue, sdma_queue, kernarg_slots, check_dispatch, node, arch): a plugin never imports
another plugin's package.

Memory: buffers are VRAM the CPU does not map (no large-BAR requirement); host copies go through two GTT staging
buffers (plugrt.hwqueue.PinnedStaging) and the SDMA engine, device-to-device copies are one SDMA copy. Ordering
between the two engines is kept on the host: an SDMA copy first waits for the compute queue's last dispatch, a
dispatch after copies first waits for the SDMA queue's last fence (a copy is never in flight while a kernel reads
its memory). **None of this has run on AMD hardware**; it runs in CI against a fake KFD (plugins/ops_amd/tests).
"""
from __future__ import annotations

import ctypes
import weakref
from _thread import RLock
from functools import partial
from typing import Any

from plugrt.errors import CompileError, LaunchError, UnsupportedError
from plugrt.hookspecs import DeviceInfo
from plugrt.hwqueue import HCQProgram, HCQState, PinnedStaging, StagedAllocator, queue_timeout, round_up
from plugrt.ir import Signature
from plugrt.launchargs import PreparedCall, bytes_packer
from plugrt.runtime import LaunchLimits
from plugrt_amd import codeobject

KERNARG_SLOT, KERNARG_SLOTS = 4096, 256   # kernarg blocks: one per dispatch in flight (a v5 code object's hidden args take 256 bytes)
AQL_ENTRIES = 1024
STAGE = 16 << 20                          # two GTT staging buffers of this size for host copies
U32 = 1 << 32


class AMDState(HCQState):
  """One AMD GPU opened through KFD: `kfd` (the interface's KFDDevice), `compute` (AQLQueue) and `copy` (SDMAQueue),
  each with its own bounded timeline, and the kernarg blocks. `lock` is held around everything that submits."""

  def __init__(self, info: DeviceInfo):
    kfd = info.iface_object
    if kfd is None or not hasattr(kfd, "compute_queue"):
      raise UnsupportedError(f"{info.canonical}: AMD needs the KFD interface (plugrt-amd-kfd) to reach the GPU, and it was not opened",
                             "pip install plugrt-amd-kfd, and use AMD_IFACE=KFD")
    self.kfd, self.index, self.label = kfd, info.index, f"AMD:{info.index}"
    self.lock = RLock()
    timeout = queue_timeout(info.context, "PLUGRT_AMD_TIMEOUT")
    kfd.timeout = timeout
    self.compute = kfd.compute_queue(AQL_ENTRIES)
    self.copy = kfd.sdma_queue()
    self.kernarg_mem, self.kernargs = kfd.kernarg_slots(KERNARG_SLOT, KERNARG_SLOTS)
    self.max_lds = kfd.node.lds_bytes

  @property
  def broken(self) -> str: return self.compute.broken or self.copy.broken

  # a launch's wait and its time (HCQState): the compute queue's timeline, and the packet processor's timestamps
  def launch_wait(self, value: int) -> None: self.compute.wait(value)
  def launch_clock_start(self) -> None: self.compute.clear_timestamps()
  def launch_seconds(self) -> float | None: return self.compute.gpu_seconds()

  def after_dispatches(self) -> None:
    """Before an SDMA copy: the compute queue's work is done (a copy must not race a kernel on its memory)."""
    c = self.compute
    if c.value > c.done and c.completed() < c.value: c.wait(c.value)

  def after_copies(self) -> None:
    """Before a dispatch: the SDMA queue's copies are done."""
    s = self.copy
    if s.value > s.done and s.completed() < s.value: s.wait(s.value)

  def synchronize(self) -> None:
    with self.lock:
      self.compute.synchronize()
      self.copy.synchronize()

  def close(self) -> None:
    try:
      if not self.broken: self.synchronize()
    finally: self.kfd.close()


class AMDStaging(PinnedStaging):
  """Host copies through two GTT staging buffers and the SDMA engine; a token is the SDMA timeline value."""

  def __init__(self, state: AMDState, chunk: int):
    super().__init__(state.lock, chunk=chunk, buffers=2, parallel_min=4 << 20, align=4096, thread_name="plugrt-amd-copy")
    self.state = state
    self.mems: list[Any] = []

  def _new_buffer(self) -> int:
    self.mems.append(mem := self.state.kfd.alloc(self.chunk, "gtt"))
    return mem.va

  def _to_device(self, dest: int, k: int, n: int) -> int:
    self.state.after_dispatches()
    return self.state.copy.copy(dest, self.buffers[k], n)

  def _from_device(self, k: int, src: int, n: int) -> int:
    self.state.after_dispatches()
    return self.state.copy.copy(self.buffers[k], src, n)

  def _wait(self, token: int) -> None: self.state.copy.wait(token)

  def _copied_in(self) -> None: self.state.copy.synchronize()  # callers may free or reuse their memory, and expect the data landed


class AMDAllocator(StagedAllocator):
  """VRAM in the GPU's (= the process's) address space; a handle is its address. Host copies through GTT staging and
  SDMA, device copies by SDMA."""
  supports_wrap = True  # memory KFD shows this GPU can reach (plugrt's, a ROCm runtime's of this process, SVM): check_visible

  def __init__(self, device: DeviceInfo):
    super().__init__(device)
    self.state: AMDState = device.state
    self.staging = AMDStaging(self.state, STAGE)

  def _alloc(self, nbytes: int, options: Any) -> int:
    from plugrt.errors import OutOfMemoryError
    with self.state.lock:
      try: mem = self.state.kfd.alloc(nbytes, "vram", cpu=False)
      except OutOfMemoryError as e: raise MemoryError(str(e)) from None  # the core empties its cache and retries once
      self.mems[mem.va] = mem
    return mem.va

  def _free_memory(self, mem: Any) -> None: self.state.kfd.free(mem)

  def _wrap(self, ptr: int, nbytes: int) -> int:
    """ROCm memory (torch's ROCm tensors' data_ptr, DLPack device type 10) at its own address: KFD is asked whether this
    GPU reaches it (KFDDevice.check_visible); refused (KFDNotVisible, an UnsupportedError) otherwise, never copied."""
    with self.state.lock: self.state.kfd.check_visible(ptr, nbytes)
    return ptr

  def dlpack_device(self) -> tuple[int, int]: return (10, self.state.index)  # kDLROCM

  def _pointer(self, handle: int) -> int: return handle

  def _copy(self, dest: int, src: int, nbytes: int) -> None:
    st = self.state
    with st.lock:
      st.after_dispatches()
      st.copy.copy(dest, src, nbytes)


def _release_program(state: AMDState, mem: Any) -> None:
  try:
    with state.lock:
      if not state.broken:
        state.synchronize()
        state.kfd.free(mem)
  except Exception: pass  # interpreter shutdown, or a device that failed meanwhile


def kernel_info(name: str, lib: bytes, signature: Signature, max_kernarg: int) -> tuple[codeobject.CodeObject, Any]:
  """The code object and its kernel `name`, checked against the signature (argument sizes) and the kernarg block
  size; CompileError or UnsupportedError otherwise. Shared by the KFD and the PCI programs."""
  co = codeobject.parse(lib)
  if (info := co.kernels.get(name)) is None:
    raise CompileError(f"the code object for {name} holds no kernel {name} (it has {', '.join(co.kernels) or 'none'})")
  explicit = info.explicit_args
  want = [8] * len(signature.buffers) + [dt.itemsize for dt in signature.scalars]
  got = [a.size for a in explicit if a.kind == "global_buffer"] + [a.size for a in explicit if a.kind != "global_buffer"]
  if got != want: raise CompileError(f"code object for {name} takes arguments of sizes {got}, its signature needs {want}")
  if info.kernarg_size > max_kernarg:
    raise UnsupportedError(f"kernel {name} takes {info.kernarg_size} bytes of arguments; AMD passes up to {max_kernarg}")
  return co, info


class _Launch(PreparedCall):
  """A prepared dispatch: its AQL packet and kernarg bytes, never changed once built."""
  __slots__ = ("args", "packet")


class AMDProgram(HCQProgram):
  """An HSA code object loaded into executable VRAM (its image relocated to the load address, copied by SDMA); its
  descriptor checked once against the code object's kernarg size and the GPU's LDS (KFDDevice.check_dispatch). A
  launch copies its prepared kernarg segment (explicit arguments at the code object's offsets, then the hidden
  arguments: block counts, group sizes, grid dims) into a kernarg block and pushes its prepared AQL dispatch packet,
  under the device's lock (the queue, its kernarg blocks and timeline are the device's)."""
  scalar_packer = staticmethod(bytes_packer)

  def __init__(self, device: Any, name: str, lib: bytes, signature: Signature):
    super().__init__(device, name, lib, signature)
    st: AMDState = self.state
    co, info = kernel_info(name, lib, signature, KERNARG_SLOT)
    st.kfd.check_dispatch(info.descriptor, info.kernarg_size, (1, 1, 1), 0, name)  # static LDS only: plugrt has no dynamic LDS
    if info.private_segment_size or info.descriptor.compute_pgm_rsrc2 & 1:  # ENABLE_PRIVATE_SEGMENT: the queue's scratch, on demand
      with st.lock: st.compute.ensure_scratch(max(info.private_segment_size, 4))
    self.info, self.code = info, co
    with st.lock: self.mem = st.kfd.alloc(round_up(co.image_size, 4096) + 4096, "vram", cpu=False, executable=True)
    device.allocator._copyin(self.mem.va, memoryview(co.image(self.mem.va)))
    self.kernel_object = self.mem.va + info.kd_offset
    self.max_threads = min(1024, info.max_flat_workgroup_size or 1024)
    self.launch_limits = LaunchLimits(str(device), (U32 - 1,) * 3, (1024, 1024, 1024), self.max_threads)
    weakref.finalize(self, _release_program, st, self.mem)

  def _encode(self, bufs: tuple, scalars: tuple, gs: tuple[int, int, int], ls: tuple[int, int, int]) -> _Launch:
    items = tuple(g * n for g, n in zip(gs, ls))
    if max(items) >= U32:
      raise LaunchError(f"program {self.name}: {items} work-items; an AQL dispatch runs fewer than 2**32 per axis", "launch fewer groups")
    p = _Launch()
    p.args = ctypes.create_string_buffer(bytes(self.info.kernargs([b.handle for b in bufs], list(scalars), gs, ls)), max(self.info.kernarg_size, 1))
    p.packet = self.state.compute.prepare(self.kernel_object, 0, items, ls, self.info.group_segment_size, self.info.private_segment_size)
    p.submit = partial(self._submit, ctypes.addressof(p.args), self.info.kernarg_size, p.packet)
    return p

  def _submit(self, args: int, size: int, packet: Any) -> int:
    """The dispatch's kernarg bytes into a free kernarg block, and its packet onto the queue; the timeline value it signals."""
    st = self.state
    if st.broken: raise st.compute.error(f"{st.label} cannot run {self.name}: {st.broken}", "restart the process")
    st.after_copies()
    q, slots = st.compute, st.kernargs
    i = slots.take(q)
    addr = slots.base + i * slots.size
    ctypes.memmove(addr, args, size)
    slots.last_use[i] = value = q.push_args(packet, addr)
    return value

