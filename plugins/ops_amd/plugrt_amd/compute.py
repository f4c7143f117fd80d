"""The compute half of the driverless bring-up on GC 11.0.0/11.0.2 (after the GFXHUB): golden registers, the compute
VMIDs' apertures, doorbell routing, plugrt's address space in VMID 8 and an AQL queue on the MEC; then `alloc` maps
VRAM for kernels, arguments and buffers, and `queue.submit` / `queue.wait` run packets.

Order (gfx_v11_0_hw_init after gfx_v11_0_gfxhub_enable): init_golden_registers, constants_init (init_compute_vmid),
nbio gc_doorbell_init, rlc_resume (under PSP loading: the SRM enable; the clear-state buffer is not set up),
cp_resume (compute enable, the queue). plugrt's VM (plugrt_amd.vm) is bound to VMID 8 on both hubs (the CP's
accesses go through the GFXHUB; the MMHUB's context 8 gets the same tables, as the kernel's VMIDs are per hub) and
both hubs' TLBs are flushed for it after every change. Never run on an AMD GPU: tested against the fake GPU.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from plugrt_amd import doorbell, gc_init, gmc, mec, vm
from plugrt_amd.discovery import DiscoveryTable
from plugrt_amd.gmc_regs import GFXHUBS, MMHUBS, Hub
from plugrt_amd.regs import GPURegisters

HEAP_ALIGN = 2 << 20                 # 2 MiB: whole fragments


@dataclass
class Compute:
  """plugrt's compute context on one GPU: its address space, queue and VRAM heap."""
  regs: GPURegisters
  space: vm.AddressSpace
  hubs: list[tuple[Hub, int]]
  heap: int                          # next free VRAM offset for `alloc`
  heap_end: int
  flush: Callable[[], None] | None = None
  timeout: float = 2.0
  queue: mec.ComputeQueue | None = None
  allocations: list[tuple[int, int, int]] = field(default_factory=list)   # (VA, VRAM offset, size)

  def bind(self) -> None:
    """Write the changed tables, point VMID 8 at them on both hubs and flush both hubs' TLBs for it."""
    self.space.commit(self.flush)
    for hub, base in self.hubs:
      gmc.set_page_table(self.regs, base, hub, mec.VMID, self.space.pd_address)
      gmc.flush_tlb(self.regs, base, hub, mec.VMID, self.timeout, flush=self.flush)

  def alloc(self, size: int, flags: int = vm.RWX) -> tuple[int, int]:
    """Map `size` bytes of fresh VRAM in VMID 8; returns (VA, VRAM offset). Write through `regs.write_vram(offset, ...)`."""
    size = (size + vm.PAGE - 1) & ~(vm.PAGE - 1)
    at = (self.heap + HEAP_ALIGN - 1) & ~(HEAP_ALIGN - 1) if size >= HEAP_ALIGN else self.heap
    if at + size > self.heap_end:
      raise vm.VMError(f"VM: no room for {size} bytes in plugrt's VRAM heap (0x{self.heap:x}-0x{self.heap_end:x})", "allocate less")
    va = mec.VA_BASE + at
    self.space.map(va, at, size, flags)
    self.bind()
    self.heap = at + size
    self.allocations.append((va, at, size))
    return va, at


def start(regs: GPURegisters, table: DiscoveryTable, mc_base: int, phys_base: int, heap: int, vram_size: int,
          flush: Callable[[], None] | None, timeout: float = 2.0) -> tuple[Compute | None, list[str]]:
  """Everything after the GFXHUB that plugrt implements, for GC 11.0.0/11.0.2 with MMHUB 3.0.0; (None, why) otherwise."""
  gc, mmhub, nbio = table.find("GC"), table.find("MMHUB"), table.find("NBIF")
  if gc is None or mmhub is None or gc.version not in GFXHUBS or mmhub.version not in MMHUBS:
    return None, ["compute not set up: plugrt sets it up on GC 11.0.0/11.0.2 with MMHUB 3.0.0"]
  steps = [gc_init.golden(regs, gc) or f"no golden registers known for GC {gc.version_str}", gc_init.init_compute_vmid(regs, gc)]
  line = doorbell.enable(regs, nbio)
  if line is None: return None, steps + [f"compute not set up: the doorbell routing of NBIO {nbio.version_str if nbio else '(none)'} is not known"]
  steps += [line, gc_init.rlc_resume(regs, gc)]
  space = vm.AddressSpace(regs, phys_base)
  lay = mec.Layout()
  space.map(lay.va(0), lay.at, mec.QUEUE_BYTES)
  hubs = [(MMHUBS[mmhub.version], mmhub.bases[0]), (GFXHUBS[gc.version], gc.bases[0])]
  c = Compute(regs, space, hubs, heap, vram_size - (1 << 20), flush, timeout)
  c.bind()
  steps.append(f"VMID {mec.VMID} bound on the MMHUB and GFXHUB, TLBs flushed: {space.describe()}")
  c.queue, qline = mec.setup(regs, gc, lay, mc_base, regs.doorbell, flush)
  steps.append(qline)
  return c, steps
