"""The interface object of a GPU brought up without a driver: `DriverlessGPU`, a `plugrt_amd.iface.GPUInterface` on
plugrt's own VMID 8 and MEC queue (plugrt_amd_pci.compute, mec, vm), which the PCI interface's `PCIGPU` and the USB
interface's `USBGPU` are, each with its own host copy path (`HostPath`).

Memory: VRAM from plugrt's heap above the bring-up area (Compute.alloc: freed ranges reused first), each allocation
mapped into VMID 8 read/write/execute at VA `mec.VA_BASE + its VRAM offset`, TLBs flushed on both hubs. The CPU
reaches VRAM only through the VRAM BAR (BAR0): a sysfs mapping gives no DMA, so host copies are CPU copies through
that mapping (`BARPath`; the USB interface brings its own path: the bridge's SRAM window), after the queue is idle,
then an HDP flush; device-to-device copies too (no SDMA queue: the host reads the source whole through that path and
writes the destination). VRAM beyond a small BAR is usable by kernels, and refused for host access with
`BARTooSmall`. Host memory is never reachable by the GPU here (no GART mappings of system pages without an
IOMMU/DMA mapping): `from_blob` and every wrap is `NoDMA`.

Launches: the code object's image relocated into VRAM (compute.place), one kernarg block in VRAM per dispatch in
flight and the AQL packet on the MEC queue whose completion signal lives in VRAM (compute.submit), waits polled and
bounded by PLUGRT_AMD_TIMEOUT (mec.QueueError, a plugrt.hwqueue.QueueError); the GPU's time from the completion
signal's start_ts/end_ts (mec.ComputeQueue.gpu_seconds). Kernels with a private segment get the queue's scratch in
VRAM (plugrt_amd_pci.scratch), made or grown at load and again at a launch that finds it gone. A queue that timed out
is broken: later work is refused at once. **Never run on AMD hardware**: tested against the fake GPU
(plugins/ops_amd/tests, amd_pci_session).
"""
from __future__ import annotations

import ctypes
from typing import Any, Protocol

from plugrt.errors import LaunchError, UnsupportedError
from plugrt.hookspecs import DeviceInfo
from plugrt_amd import aql
from plugrt_amd.codeobject import CodeObject, KernelInfo
from plugrt_amd.iface import GPUInterface, Mem
from plugrt_amd_pci import compute, mec, scratch, vm

KFD_HINT = "use AMD_IFACE=KFD with the amdgpu kernel driver loaded"
RESET_HINT = "restart the process (and reset the GPU)"


class NoDMA(UnsupportedError):
  """What needs the GPU to reach host memory (from_blob, host buffers, SDMA copies): the PCI interface has no DMA."""


class BARTooSmall(UnsupportedError):
  """A buffer the CPU was asked to read or write lies beyond the VRAM BAR."""


class HostPath(Protocol):
  """How the host reads and writes VRAM at an offset (byte-exact, any alignment): the seam between the device's
  interface object (DriverlessGPU) and an interface's data path. `where` names it in errors and docs; `attach` runs
  once when the device opens (e.g. the bridge's SRAM mapped in VMID 8)."""
  where: str

  def attach(self, gpu: DriverlessGPU, info: DeviceInfo) -> None: ...
  def read(self, at: int, n: int, label: str) -> bytes: ...
  def write(self, at: int, data: bytes | memoryview, label: str) -> None: ...


class BARPath:
  """CPU copies through the VRAM BAR (`regs.vram`): byte-exact where the window copies bytes (a sysfs mapping), dword
  by dword with the edge dwords' other bytes kept where it has only dword accesses (a window of TLPs); VRAM past the
  BAR's `size` bytes is `BARTooSmall`."""
  where = "the VRAM BAR"

  def __init__(self, regs: Any, size: int):
    self.regs, self.size = regs, size

  def attach(self, gpu: DriverlessGPU, info: DeviceInfo) -> None: pass

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


def check_descriptor(info: Any, name: str, max_lds: int) -> None:
  """What the KFD path's check_dispatch refuses once per program, for the MEC queue: arguments of another size than
  the descriptor's kernarg_size, more LDS than the GPU has. Scratch is the queue's (plugrt_amd_pci.scratch), not refused."""
  d = info.descriptor
  if info.kernarg_size != d.kernarg_size:
    raise LaunchError(f"{name}: its arguments take {info.kernarg_size} bytes, its kernel descriptor's kernarg_size is {d.kernarg_size}",
                      "the kernarg layout must be the code object's (its .args metadata): recompile")
  if d.group_segment_fixed_size > max_lds:
    raise LaunchError(f"{name}: {d.group_segment_fixed_size} bytes of LDS, the GPU has {max_lds}", "use less shared memory")


class DriverlessGPU(GPUInterface):
  """One AMD GPU whose bring-up (`bringup`, a plugrt_amd_pci.bringup.BringUp) reached the MEC queue: `compute` (VMID 8,
  the VRAM heap, the MEC queue), `regs`, and `path`, the host's way to VRAM. An interface subclasses it with its
  `path` and `close`. Everything that submits or touches VRAM runs under the device's lock (`start`)."""
  kernarg_bytes = compute.KERNARG_SLOT
  reaches = "its VRAM"          # what memory the GPU reaches, for NoDMA's message

  def __init__(self, label: str, regs: Any, bringup: Any, path: HostPath):
    c = bringup.compute
    if c is None or c.queue is None:
      raise UnsupportedError(f"{label}: the {self.name} interface opened without a compute queue", KFD_HINT)
    self.label, self.regs, self.bringup, self.path = label, regs, bringup, path
    self.compute, self.queue = c, c.queue
    self.copy_path = path.where
    self.flush = bringup.hdp_flush or (lambda: None)
    gc = bringup.table.gc if bringup.table is not None else None
    self.max_lds = gc.lds_size * 1024 if gc is not None and gc.lds_size else 65536
    self.timeout = c.timeout
    self.failed = ""              # why the queue runs nothing more, once it stopped
    self.lock: Any = None

  @property
  def closed(self) -> bool: raise NotImplementedError

  @property
  def broken(self) -> str: return "the device is closed" if self.closed else self.failed

  def start(self, lock: Any, timeout: float, info: DeviceInfo) -> None:
    self.lock, self.label = lock, f"{info.name}:{info.index}"
    self.timeout = self.compute.timeout = timeout   # the compute context's own waits too: kernarg slots, TLB flushes
    self.path.attach(self, info)

  def _refuse(self, what: str) -> None:
    if (broken := self.broken): raise mec.QueueError(f"{self.label} cannot {what}: {broken}", RESET_HINT)

  # ---- the timeline: the MEC queue's completion signal, polled
  def wait(self, value: int) -> None:
    """Until `value` submissions completed; a timeout breaks the device (a stopped queue runs nothing more)."""
    if self.failed: raise mec.QueueError(f"{self.label}: {self.failed}", RESET_HINT)
    try: self.queue.wait(value, self.timeout)
    except mec.QueueError as e:
      self.failed = f"the MEC queue stopped: {e.message}"
      raise

  def synchronize(self) -> None:
    if self.closed: return
    if self.queue.completed() < self.queue.submitted: self.wait(self.queue.submitted)

  def clear_timestamps(self) -> None: self.queue.clear_timestamps()
  def gpu_seconds(self) -> float | None: return self.queue.gpu_seconds()

  # ---- memory: plugrt's VRAM heap in VMID 8, host access through `path`
  def read(self, va: int, n: int) -> bytes: return self.path.read(va - mec.VA_BASE, n, self.label)

  def write(self, va: int, data: bytes | memoryview) -> None:
    self.path.write(va - mec.VA_BASE, data, self.label)
    self.flush()                       # out of the HDP before the GPU reads it

  def alloc(self, size: int) -> Mem:
    try: va, _ = self.compute.alloc(size)
    except vm.VMError as e: raise MemoryError(e.message) from None
    return Mem(va, size)

  def free(self, mem: Mem) -> None:
    if not self.closed: self.compute.free(mem.va)

  def copyin(self, va: int, src: memoryview) -> None:
    with self.lock:
      self.synchronize()
      self.write(va, src)

  def copyout(self, dest: memoryview, va: int) -> None:
    with self.lock:
      self.synchronize()
      dest[:] = self.read(va, dest.nbytes)

  def copy(self, dest: int, src: int, nbytes: int) -> None:
    """By the CPU through the host path (the whole source read first, so overlapping views copy right)."""
    with self.lock:
      self.synchronize()
      self.write(dest, self.read(src, nbytes))

  def wrap(self, ptr: int, nbytes: int) -> int:
    raise NoDMA(f"{self.label} through {self.name} cannot wrap memory at 0x{ptr:x} (from_blob, DLPack): the GPU reaches only "
                f"{self.reaches}; the {self.name} interface sets up no DMA to host memory, so host memory and other runtimes' "
                "memory are out of its reach", f"copy the data in with Buffer.copyin ({self.path.where}), or {KFD_HINT}")

  # ---- programs and dispatch on the MEC queue
  def load(self, code: CodeObject) -> Mem: return Mem(compute.place(self.compute, code), code.image_size)

  def check_program(self, info: KernelInfo, name: str) -> None: check_descriptor(info, name, self.max_lds)

  def ensure_scratch(self, private_segment_size: int) -> None:
    self._refuse("make the queue's scratch")
    self.synchronize()                 # a queue that stops here breaks the device, as every wait does
    scratch.ensure(self.compute, private_segment_size)

  def prepare(self, kernel_object: int, grid: tuple[int, int, int], workgroup: tuple[int, int, int], group_segment_size: int,
              private_segment_size: int, needs_scratch: bool) -> tuple[bytes, int | None]:
    """(the AQL packet, its kernarg address set at dispatch; the private segment size when the kernel needs the queue's
    scratch, which a launch makes again where a failed growth took it away)."""
    return (aql.dispatch_packet(kernel_object, 0, grid, workgroup, group_segment_size, private_segment_size),
            private_segment_size if needs_scratch else None)

  def dispatch(self, prepared: tuple[bytes, int | None], kernargs: int, size: int, name: str) -> int:
    self._refuse(f"run {name}")
    packet, private = prepared
    if private is not None: scratch.ensure(self.compute, private)
    return compute.submit(self.compute, packet, ctypes.string_at(kernargs, size))
