"""The KFD interface's object (`DeviceInfo.iface_object` of an AMD device opened through KFD): a
`plugrt_amd.iface.GPUInterface` over one `kfdev.KFDDevice`, with an AQL compute queue, an SDMA copy queue and 256
kernarg blocks of 4 KiB in GTT.

Memory: buffers are VRAM the CPU does not map (`alloc(n, "vram", cpu=False)`: no large-BAR requirement); host copies
go through two 16 MiB GTT staging buffers (plugrt.hwqueue.PinnedStaging) and the SDMA engine, device-to-device copies
are one SDMA copy. Ordering between the two engines is kept on the host: an SDMA copy first waits for the compute
queue's last dispatch, a dispatch after copies first waits for the SDMA queue's last fence (a copy is never in flight
while a kernel reads its memory). A dispatch takes a kernarg block (`CommandSlots.take`, which waits until the GPU
finished the block's last launch), copies the prepared kernarg segment into it (one memmove) and `push_args`es the
prepared AQL packet. **None of this has run on AMD hardware**; it runs in CI against a fake KFD (plugins/ops_amd/tests).
"""
from __future__ import annotations

import ctypes
from typing import Any

from plugrt.errors import OutOfMemoryError
from plugrt.hookspecs import DeviceInfo
from plugrt.hwqueue import PinnedStaging, round_up
from plugrt.runtime import buffer_address
from plugrt_amd.codeobject import CodeObject, KernelInfo
from plugrt_amd.iface import GPUInterface, Mem
from plugrt_amd_kfd.kfdev import KFDDevice, Prepared, check_dispatch

KERNARG_SLOT, KERNARG_SLOTS = 4096, 256   # kernarg blocks: one per dispatch in flight (a v5 code object's hidden args take 256 bytes)
AQL_ENTRIES = 1024
STAGE = 16 << 20                          # two GTT staging buffers of this size for host copies


class KFDGPU(GPUInterface):
  """One AMD GPU through KFD (`kfd`, the KFDDevice); `compute` (AQLQueue) and `copy` (SDMAQueue) once started, each
  with its own bounded timeline, and the kernarg blocks."""
  name = "KFD"
  kernarg_bytes = KERNARG_SLOT
  wraps = True            # memory KFD shows this GPU can reach (plugrt's, a ROCm runtime's of this process, SVM): check_visible
  dlpack_type = 10        # kDLROCM
  copy_path = "GTT staging buffers and the SDMA engine"

  def __init__(self, kfd: KFDDevice):
    self.kfd, self.label, self.arch = kfd, kfd.label, kfd.arch
    self.max_lds = kfd.node.lds_bytes
    self.compute: Any = None
    self.copy_queue: Any = None

  def start(self, lock: Any, timeout: float, info: DeviceInfo) -> None:
    kfd = self.kfd
    kfd.timeout = timeout
    self.lock = lock
    self.compute = kfd.compute_queue(AQL_ENTRIES)
    self.copy_queue = kfd.sdma_queue()
    self.kernarg_mem, self.kernargs = kfd.kernarg_slots(KERNARG_SLOT, KERNARG_SLOTS)
    self.staging = KFDStaging(self, STAGE)

  @property
  def broken(self) -> str:
    if self.kfd.closed: return "the device is closed"
    return (self.compute.broken or self.copy_queue.broken) if self.compute is not None else ""

  def after_dispatches(self) -> None:
    """Before an SDMA copy: the compute queue's work is done (a copy must not race a kernel on its memory)."""
    c = self.compute
    if c.value > c.done and c.completed() < c.value: c.wait(c.value)

  def after_copies(self) -> None:
    """Before a dispatch: the SDMA queue's copies are done."""
    s = self.copy_queue
    if s.value > s.done and s.completed() < s.value: s.wait(s.value)

  # ------------------------------------------------------------ memory
  def alloc(self, size: int) -> Mem:
    try: m = self.kfd.alloc(size, "vram", cpu=False)
    except OutOfMemoryError as e: raise MemoryError(str(e)) from None
    return Mem(m.va, m.size, m)

  def free(self, mem: Mem) -> None: self.kfd.free(mem.private)

  def copyin(self, va: int, src: memoryview) -> None: self.staging.copyin(va, buffer_address(src), src.nbytes)

  def copyout(self, dest: memoryview, va: int) -> None: self.staging.copyout(buffer_address(dest), va, dest.nbytes)

  def copy(self, dest: int, src: int, nbytes: int) -> None:
    with self.lock:
      self.after_dispatches()
      self.copy_queue.copy(dest, src, nbytes)

  def wrap(self, ptr: int, nbytes: int) -> int:
    """ROCm memory (torch's ROCm tensors' data_ptr, DLPack device type 10) at its own address: KFD is asked whether this
    GPU reaches it (KFDDevice.check_visible); refused (KFDNotVisible, an UnsupportedError) otherwise, never copied."""
    self.kfd.check_visible(ptr, nbytes)
    return ptr

  # ------------------------------------------------------------ programs and dispatch
  def load(self, code: CodeObject) -> Mem:
    """The image, relocated to its load address, copied by SDMA into executable VRAM."""
    m = self.kfd.alloc(round_up(code.image_size, 4096) + 4096, "vram", cpu=False, executable=True)
    mem = Mem(m.va, m.size, m)
    image = code.image(m.va)
    self.staging.copyin(m.va, buffer_address(memoryview(image)), len(image))
    return mem

  def check_program(self, info: KernelInfo, name: str) -> None:
    check_dispatch(info.descriptor, info.kernarg_size, (1, 1, 1), 0, name, self.max_lds)  # static LDS only: plugrt has no dynamic LDS

  def ensure_scratch(self, private_segment_size: int) -> None: self.compute.ensure_scratch(max(private_segment_size, 4))

  def prepare(self, kernel_object: int, grid: tuple[int, int, int], workgroup: tuple[int, int, int], group_segment_size: int,
              private_segment_size: int, needs_scratch: bool) -> Prepared:
    """The AQL packet (ensure_scratch gave the queue its scratch when the program loaded: it only grows)."""
    return self.compute.prepare(kernel_object, 0, grid, workgroup, group_segment_size, private_segment_size)

  def dispatch(self, prepared: Prepared, kernargs: int, size: int, name: str) -> int:
    """The dispatch's kernarg bytes into a free kernarg block, and its packet onto the queue; the timeline value it signals."""
    if (broken := self.broken): raise self.compute.error(f"{self.label} cannot run {name}: {broken}", "restart the process")
    self.after_copies()
    q, slots = self.compute, self.kernargs
    i = slots.take(q)
    addr = slots.base + i * slots.size
    ctypes.memmove(addr, kernargs, size)
    slots.last_use[i] = value = q.push_args(prepared, addr)
    return value

  # ------------------------------------------------------------ the timeline
  def wait(self, value: int) -> None: self.compute.wait(value)

  def synchronize(self) -> None:
    self.compute.synchronize()
    self.copy_queue.synchronize()

  def clear_timestamps(self) -> None: self.compute.clear_timestamps()

  def gpu_seconds(self) -> float | None: return self.compute.gpu_seconds()

  def close(self) -> None: self.kfd.close()


class KFDStaging(PinnedStaging):
  """Host copies through two GTT staging buffers and the SDMA engine; a token is the SDMA timeline value."""

  def __init__(self, gpu: KFDGPU, chunk: int):
    super().__init__(gpu.lock, chunk=chunk, buffers=2, parallel_min=4 << 20, align=4096, thread_name="plugrt-amd-copy")
    self.gpu = gpu
    self.mems: list[Any] = []

  def _new_buffer(self) -> int:
    self.mems.append(mem := self.gpu.kfd.alloc(self.chunk, "gtt"))
    return mem.va

  def _to_device(self, dest: int, k: int, n: int) -> int:
    self.gpu.after_dispatches()
    return self.gpu.copy_queue.copy(dest, self.buffers[k], n)

  def _from_device(self, k: int, src: int, n: int) -> int:
    self.gpu.after_dispatches()
    return self.gpu.copy_queue.copy(self.buffers[k], src, n)

  def _wait(self, token: int) -> None: self.gpu.copy_queue.wait(token)

  def _copied_in(self) -> None: self.gpu.copy_queue.synchronize()  # callers may free or reuse their memory, and expect the data landed
