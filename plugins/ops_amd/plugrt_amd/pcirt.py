"""AMD's runtime objects on a GPU brought up without a driver (the PCI interface's `plugrt_amd_pci.gpu.PCIGPU`, or the
USB interface's `plugrt_amd_usb.gpu.USBGPU`, used by their attributes only): the device state, the allocator and
programs on plugrt's own VMID 8 and MEC queue (plugrt_amd.compute, mec, vm).

Memory: VRAM from plugrt's heap above the bring-up area (Compute.alloc: freed ranges reused first), each allocation
mapped into VMID 8 read/write/execute at VA `mec.VA_BASE + its VRAM offset`, TLBs flushed on both hubs. The CPU
reaches VRAM only through the VRAM BAR (BAR0): a sysfs mapping gives no DMA, so host copies are CPU copies through
that mapping (the interface may bring its own copy path instead, `gpu.host_path`, a `HostPath`: USB's goes through the
bridge's SRAM window), after the queue is idle, then an HDP flush; device-to-device copies too (no SDMA queue: the
host reads the source whole through that path and writes the destination). VRAM beyond a small BAR is usable by
kernels, and refused for host access with `BARTooSmall`. Host memory is never reachable by the GPU here (no GART
mappings of system pages without an IOMMU/DMA mapping): `from_blob` and every wrap is `NoDMA`.

Launches: the code object's image relocated into VRAM (compute.load), one kernarg block per dispatch in flight
(compute.launch), the AQL packet on the MEC queue whose completion signal lives in VRAM, waits polled and bounded by
PLUGRT_AMD_TIMEOUT (mec.QueueError, a plugrt.hwqueue.QueueError); `wait=True` returns the GPU's time (the
completion signal's start_ts/end_ts, mec.ComputeQueue.gpu_seconds), the host's where none was written. Kernels with
a private segment get the queue's scratch in VRAM (plugrt_amd.scratch), made or grown at load. A queue that timed out is broken: later work is
refused at once. **Never run on AMD hardware**: tested against the fake GPU (plugins/ops_amd/tests, amd_pci_session).
"""
from __future__ import annotations

import weakref
from _thread import RLock
from functools import partial
from typing import Any, Protocol

from plugrt.errors import LaunchError, UnsupportedError
from plugrt.hookspecs import DeviceInfo
from plugrt.hwqueue import HCQProgram, HCQState, queue_timeout
from plugrt.ir import Signature
from plugrt.launchargs import PreparedCall, bytes_packer
from plugrt.runtime import Allocator, LaunchLimits, check_nbytes
from plugrt_amd import compute, mec, scratch, vm
from plugrt_amd.runtime import kernel_info

U32 = 1 << 32
KFD_HINT = "use AMD_IFACE=KFD with the amdgpu kernel driver loaded"


class NoDMA(UnsupportedError):
  """What needs the GPU to reach host memory (from_blob, host buffers, SDMA copies): the PCI interface has no DMA."""


class BARTooSmall(UnsupportedError):
  """A buffer the CPU was asked to read or write lies beyond the VRAM BAR."""


class PCIState(HCQState):
  """One AMD GPU held by the PCI interface: `compute` (VMID 8, the VRAM heap, the MEC queue) and `gpu` (the interface
  object, closed with the device). `lock` is held around everything that submits or touches VRAM."""
  driverless = True

  def __init__(self, info: DeviceInfo):
    gpu = info.iface_object
    c = gpu.bringup.compute
    if c is None or c.queue is None:
      raise UnsupportedError(f"{info.canonical}: the {info.interface or 'PCI'} interface opened without a compute queue", KFD_HINT)
    self.gpu, self.compute, self.queue, self.regs = gpu, c, c.queue, gpu.regs
    self.index, self.label = info.index, f"AMD:{info.index}"
    self.lock = RLock()
    self.timeout = c.timeout = queue_timeout(info.context, "PLUGRT_AMD_TIMEOUT")   # c's: kernarg-slot and TLB-flush waits
    self.flush = gpu.bringup.hdp_flush or (lambda: None)
    self.path: HostPath = getattr(gpu, "host_path", None) or BARPath(gpu.regs, gpu.vram_bar_size)
    if (attach := getattr(self.path, "attach", None)) is not None: attach(self, info)    # e.g. the SRAM mapped in VMID 8
    gc = gpu.bringup.table.gc if gpu.bringup.table is not None else None
    self.max_lds = gc.lds_size * 1024 if gc is not None and gc.lds_size else 65536
    self.broken = ""

  def wait(self, value: int) -> None:
    """Until `value` submissions completed; a timeout breaks the device (a stopped queue runs nothing more)."""
    if self.broken: raise mec.QueueError(f"{self.label}: {self.broken}", "restart the process (and reset the GPU)")
    try: self.queue.wait(value, self.timeout)
    except mec.QueueError as e:
      self.broken = f"the MEC queue stopped: {e.message}"
      raise

  # a launch's time (HCQState): the packet processor's timestamps on the MEC queue
  def launch_clock_start(self) -> None: self.queue.clear_timestamps()
  def launch_seconds(self) -> float | None: return self.queue.gpu_seconds()

  def synchronize(self) -> None:
    with self.lock:
      if self.queue.completed() < self.queue.submitted: self.wait(self.queue.submitted)

  def close(self) -> None:
    try:
      if not self.broken: self.synchronize()
    finally: self.gpu.close()

  # ---- host access to VRAM: the interface's copy path (gpu.host_path), by default CPU copies through the VRAM BAR
  def read(self, va: int, n: int) -> bytes: return self.path.read(va - mec.VA_BASE, n, self.label)

  def write(self, va: int, data: bytes | memoryview) -> None:
    self.path.write(va - mec.VA_BASE, data, self.label)
    self.flush()                       # out of the HDP before the GPU reads it


class HostPath(Protocol):
  """How the host reads and writes VRAM at an offset (byte-exact, any alignment): the seam between the device
  (PCIState) and an interface's data path. `where` names it in errors and docs."""
  where: str

  def read(self, at: int, n: int, label: str) -> bytes: ...
  def write(self, at: int, data: bytes | memoryview, label: str) -> None: ...


class BARPath:
  """CPU copies through the VRAM BAR (`regs.vram`): byte-exact where the window copies bytes (a sysfs mapping), dword
  by dword with the edge dwords' other bytes kept where it has only dword accesses (a window of TLPs); VRAM past the
  BAR's `size` bytes is `BARTooSmall`."""
  where = "the VRAM BAR"

  def __init__(self, regs: Any, size: int):
    self.regs, self.size = regs, size

  def _check(self, at: int, n: int, what: str, label: str) -> None:
    if at + n > self.size:
      raise BARTooSmall(f"{label}: cannot {what} {n} bytes at VRAM 0x{at:x}: the VRAM BAR (BAR0) shows the CPU only the first "
                        f"{self.size >> 20} MiB of VRAM, and the PCI interface has no DMA to reach the rest (the buffer stays usable "
                        "by kernels)", "enable Resizable BAR (and Above 4G Decoding) in the firmware setup so BAR0 covers all "
                        f"VRAM, keep host-visible buffers small, or {KFD_HINT}")

  def read(self, at: int, n: int, label: str) -> bytes:
    self._check(at, n, "read", label)
    if (read := getattr(self.regs.vram, "read", None)) is not None: return read(at, n)
    return self.regs.read_vram_bytes(at, n)

  def write(self, at: int, data: bytes | memoryview, label: str) -> None:
    self._check(at, len(data), "write", label)
    if (write := getattr(self.regs.vram, "write", None)) is not None: return write(at, bytes(data))
    self.regs.write_vram_bytes(at, data)  # dword windows only: keeps the neighbouring bytes of the edge dwords


class PCIAllocator(Allocator[int]):
  """VRAM in VMID 8; a handle is its GPU address. Copies are CPU copies through the VRAM BAR, after the queue is
  idle (the core orders a copy after the work queued before it)."""
  supports_wrap = False                # no external memory (from_blob): `wrap` says why (NoDMA)

  def __init__(self, device: DeviceInfo):
    super().__init__(device)
    self.state: PCIState = device.state

  def _alloc(self, nbytes: int, options: Any) -> int:
    st = self.state
    with st.lock:
      try: va, _ = st.compute.alloc(nbytes)
      except vm.VMError as e: raise MemoryError(e.message) from None    # the core empties its cache and retries once
    return va

  def _free(self, handle: int, nbytes: int, options: Any) -> None:
    st = self.state
    with st.lock:
      if st.broken or st.gpu.closed: return
      st.synchronize()                 # no queued kernel may still use it
      st.compute.free(handle)

  def _offset(self, handle: int, offset: int, nbytes: int) -> int: return handle + offset

  def _copyin(self, dest: int, src: memoryview) -> None:
    with self.state.lock:
      self.state.synchronize()
      self.state.write(dest, src.cast("B"))

  def _copyout(self, dest: memoryview, src: int) -> None:
    with self.state.lock:
      self.state.synchronize()
      dest.cast("B")[:] = self.state.read(src, dest.nbytes)

  def _copy(self, dest: int, src: int, nbytes: int) -> None:
    """By the CPU through the BAR (the whole source read first, so overlapping views copy right)."""
    with self.state.lock:
      self.state.synchronize()
      self.state.write(dest, self.state.read(src, nbytes))

  def wrap(self, ptr: int, nbytes: int, image: Any = None) -> int:
    """Always NoDMA (an UnsupportedError, as the core's refusal), with the reason in place of the core's generic one."""
    check_nbytes(nbytes)
    via = self.device.interface or "PCI"
    raise NoDMA(f"{self.device.canonical} through {via} cannot wrap memory at 0x{ptr:x} (from_blob, DLPack): the GPU reaches only "
                f"its VRAM{' and the bridge SRAM' if via == 'USB' else ''}; the {via} interface sets up no DMA to host memory, so host "
                "memory and other runtimes' memory are out of its reach",
                f"copy the data in with Buffer.copyin ({self.state.path.where}), or {KFD_HINT}")


def _release_program(state: PCIState, va: int) -> None:
  try:
    with state.lock:
      if not state.broken and not state.gpu.closed:
        state.synchronize()
        state.compute.free(va)
  except Exception: pass  # interpreter shutdown, or a device that failed meanwhile


def check_descriptor(info: Any, name: str, max_lds: int) -> None:
  """What the KFD path's check_dispatch refuses once per program, for the PCI queue: arguments of another size than
  the descriptor's kernarg_size, more LDS than the GPU has. Scratch is the queue's (plugrt_amd.scratch), not refused."""
  d = info.descriptor
  if info.kernarg_size != d.kernarg_size:
    raise LaunchError(f"{name}: its arguments take {info.kernarg_size} bytes, its kernel descriptor's kernarg_size is {d.kernarg_size}",
                      "the kernarg layout must be the code object's (its .args metadata): recompile")
  if d.group_segment_fixed_size > max_lds:
    raise LaunchError(f"{name}: {d.group_segment_fixed_size} bytes of LDS, the GPU has {max_lds}", "use less shared memory")


class PCIProgram(HCQProgram):
  """A code object loaded into VRAM (mapped executable in VMID 8) and launched on the MEC queue: the kernarg segment
  (explicit arguments at the code object's offsets, then the hidden ones) in a kernarg block, one AQL dispatch packet,
  under the device's lock."""
  scalar_packer = staticmethod(bytes_packer)

  def __init__(self, device: Any, name: str, lib: bytes, signature: Signature):
    super().__init__(device, name, lib, signature)
    st: PCIState = self.state
    _, info = kernel_info(name, lib, signature, compute.KERNARG_SLOT)
    check_descriptor(info, name, st.max_lds)
    if info.private_segment_size or info.descriptor.private_segment_enabled:   # the queue's scratch, made or grown now
      with st.lock:
        if st.broken: raise mec.QueueError(f"{st.label} cannot load {name}: {st.broken}", "restart the process (and reset the GPU)")
        st.synchronize()                 # a queue that stops here breaks the device, as every wait does
        scratch.ensure(st.compute, info.private_segment_size)
    with st.lock: self.code, self.va = compute.load(st.compute, lib)
    self.info = info
    self.max_threads = min(1024, info.max_flat_workgroup_size or 1024)
    self.launch_limits = LaunchLimits(str(device), (U32 - 1,) * 3, (1024, 1024, 1024), self.max_threads)
    weakref.finalize(self, _release_program, st, self.va)

  def _encode(self, bufs: tuple, scalars: tuple, gs: tuple[int, int, int], ls: tuple[int, int, int]) -> PreparedCall:
    if max(g * n for g, n in zip(gs, ls)) >= U32:
      raise LaunchError(f"program {self.name}: {gs} groups of {ls}; an AQL dispatch runs fewer than 2**32 work-items per axis",
                        "launch fewer groups")
    return PreparedCall(submit=partial(self._submit, [b.handle for b in bufs], list(scalars), gs, ls))

  def _submit(self, handles: list[int], scalars: list[bytes], gs: tuple[int, int, int], ls: tuple[int, int, int]) -> int:
    st = self.state
    if st.broken: raise mec.QueueError(f"{st.label} cannot run {self.name}: {st.broken}", "restart the process (and reset the GPU)")
    return compute.launch(st.compute, self.code, self.va, self.name, handles, scalars, gs, ls)

