"""AMD's runtime objects on an opened interface: the device state, the allocator and programs, one of each for every
interface (KFD, PCI, USB).

The interface object (`DeviceInfo.iface_object`) is what the interface plugin's `plugrt_open_interface` returns: a
`plugrt_amd.iface.GPUInterface` (plugrt-amd-kfd's `KFDGPU`, plugrt-amd-pci's `PCIGPU`, plugrt-amd-usb's `USBGPU`, or
a third party's). This module uses it by that contract only: a plugin never imports another plugin's package.

What is the same on every interface lives here: a program's code object checked against its signature, loaded once;
a launch's kernarg segment (explicit arguments at the code object's offsets, then the hidden ones: block counts, group
sizes, grid dims) and its AQL dispatch prepared once per new call, then submitted under the device's lock; the
timeline waits and the GPU's own time for `wait=True`. Where memory comes from, how the host reaches it and how a
dispatch is queued is the interface's. **None of this has run on AMD hardware**: it runs in CI against a fake KFD and
a fake GPU (plugins/ops_amd/tests).
"""
from __future__ import annotations

import ctypes
import weakref
from _thread import RLock
from functools import partial
from typing import Any

from plugrt.compiler.ir import Signature
from plugrt.errors import CompileError, LaunchError, UnsupportedError
from plugrt.hookspecs import DeviceInfo
from plugrt.hwqueue import HCQProgram, HCQState, StagedAllocator, queue_timeout
from plugrt.launchargs import PreparedCall, bytes_packer
from plugrt.runtime import LaunchLimits, check_nbytes
from plugrt_amd import codeobject
from plugrt_amd.iface import GPUInterface, Mem

U32 = 1 << 32


class AMDState(HCQState):
  """One AMD GPU opened through an interface (`iface`). `lock` is held around everything that submits or copies."""

  def __init__(self, info: DeviceInfo):
    iface = info.iface_object
    if not isinstance(iface, GPUInterface):
      raise UnsupportedError(f"{info.canonical}: the {info.interface or 'AMD'} interface gave the device no plugrt_amd.iface.GPUInterface",
                             "pip install plugrt-amd-kfd, and use AMD_IFACE=KFD")
    self.iface, self.index, self.label = iface, info.index, f"AMD:{info.index}"
    self.lock = RLock()
    iface.start(self.lock, queue_timeout(info.context, "PLUGRT_AMD_TIMEOUT"), info)
    self.max_lds = iface.max_lds

  @property
  def broken(self) -> str: return self.iface.broken

  # a launch's wait and its time (HCQState): the interface's timeline, and the packet processor's timestamps
  def launch_wait(self, value: int) -> None: self.iface.wait(value)
  def launch_clock_start(self) -> None: self.iface.clear_timestamps()
  def launch_seconds(self) -> float | None: return self.iface.gpu_seconds()

  def synchronize(self) -> None:
    with self.lock: self.iface.synchronize()

  def close(self) -> None:
    try:
      if not self.broken: self.synchronize()
    finally: self.iface.close()


class AMDAllocator(StagedAllocator):
  """Device memory from the interface; a handle is its GPU address (views are offsets). Host and device copies go the
  interface's way (`iface.copy_path`), copies between two AMD GPUs through the host."""

  def __init__(self, device: DeviceInfo):
    super().__init__(device)
    self.state: AMDState = device.state
    self.iface = iface = self.state.iface
    self.supports_wrap = iface.wraps   # what from_blob and the conformance suite see for this interface

  def _alloc(self, nbytes: int, options: Any) -> int:
    with self.state.lock:
      mem = self.iface.alloc(nbytes)   # MemoryError when full: the core empties its cache and retries once
      self.mems[mem.va] = mem
    return mem.va

  def _free_memory(self, mem: Any) -> None: self.iface.free(mem)

  def _copyin(self, dest: int, src: memoryview) -> None: self.iface.copyin(dest, src.cast("B"))

  def _copyout(self, dest: memoryview, src: int) -> None: self.iface.copyout(dest.cast("B"), src)

  def _copy(self, dest: int, src: int, nbytes: int) -> None: self.iface.copy(dest, src, nbytes)

  def wrap(self, ptr: int, nbytes: int, image: Any = None) -> int:
    """External memory at its own address where the interface reaches it (KFD: ROCm memory, SVM); where it never does,
    its refusal (an UnsupportedError naming why) in place of the core's generic one."""
    if self.supports_wrap: return super().wrap(ptr, nbytes, image)
    check_nbytes(nbytes)
    return self.iface.wrap(ptr, nbytes)

  def _wrap(self, ptr: int, nbytes: int) -> int:
    with self.state.lock: return self.iface.wrap(ptr, nbytes)

  def dlpack_device(self) -> tuple[int, int] | None:
    return None if self.iface.dlpack_type is None else (self.iface.dlpack_type, self.state.index)

  def _pointer(self, handle: int) -> int: return handle


def _release_program(state: AMDState, mem: Mem) -> None:
  try:
    with state.lock:
      if not state.broken:
        state.iface.synchronize()
        state.iface.free(mem)
  except Exception: pass  # interpreter shutdown, or a device that failed meanwhile


def kernel_info(name: str, lib: bytes, signature: Signature, max_kernarg: int) -> tuple[codeobject.CodeObject, Any]:
  """The code object and its kernel `name`, checked against the signature (argument sizes) and the kernarg block
  size; CompileError or UnsupportedError otherwise."""
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
  """A prepared dispatch: its kernarg bytes and the interface's prepared dispatch, never changed once built."""
  __slots__ = ("args", "packet")


class AMDProgram(HCQProgram):
  """An HSA code object loaded by the interface where the GPU executes it (its image relocated to the load address);
  its descriptor checked once (kernarg size, LDS), the queue's scratch made or grown when it has a private segment.
  A new call builds its kernarg segment (KernelInfo.kernargs) and the interface's prepared dispatch; every launch
  hands both to the interface's `dispatch`, under the device's lock (the queue, its kernarg blocks and timeline are
  the device's)."""
  scalar_packer = staticmethod(bytes_packer)

  def __init__(self, device: Any, name: str, lib: bytes, signature: Signature):
    super().__init__(device, name, lib, signature)
    st: AMDState = self.state
    iface = self.iface = st.iface
    co, info = kernel_info(name, lib, signature, iface.kernarg_bytes)
    iface.check_program(info, name)
    self.scratch = bool(info.private_segment_size or info.descriptor.private_segment_enabled)
    if self.scratch:                   # the queue's scratch, made or grown now
      with st.lock: iface.ensure_scratch(info.private_segment_size)
    with st.lock: self.mem = iface.load(co)
    self.info, self.code = info, co
    self.kernel_object = self.mem.va + info.kd_offset
    self.max_threads = min(1024, info.max_flat_workgroup_size or 1024)
    self.launch_limits = LaunchLimits(str(device), (U32 - 1,) * 3, (1024, 1024, 1024), self.max_threads)
    weakref.finalize(self, _release_program, st, self.mem)

  def _encode(self, bufs: tuple, scalars: tuple, gs: tuple[int, int, int], ls: tuple[int, int, int]) -> _Launch:
    items = (gs[0] * ls[0], gs[1] * ls[1], gs[2] * ls[2])
    if max(items) >= U32:
      raise LaunchError(f"program {self.name}: {items} work-items; an AQL dispatch runs fewer than 2**32 per axis", "launch fewer groups")
    info, p = self.info, _Launch()
    p.args = ctypes.create_string_buffer(bytes(info.kernargs([b.handle for b in bufs], list(scalars), gs, ls)), max(info.kernarg_size, 1))
    p.packet = self.iface.prepare(self.kernel_object, items, ls, info.group_segment_size, info.private_segment_size, self.scratch)
    p.submit = partial(self.iface.dispatch, p.packet, ctypes.addressof(p.args), info.kernarg_size, self.name)
    return p
