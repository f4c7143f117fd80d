"""The compute half of the driverless bring-up on GC 11.0.0/11.0.2 and 12.0.0/12.0.1 (after the GFXHUB): golden registers, the compute
VMIDs' apertures, doorbell routing, plugrt's address space in VMID 8 and an AQL queue on the MEC; then `alloc` maps
VRAM for arguments and buffers (`free` unmaps it and keeps the range for reuse: the PCI device's allocator), `load`
places a code object (its image relocated to where it lies, as the KFD path's Program does), `launch` writes a
kernarg block and submits the dispatch (scratch made or grown first where the kernel needs it: plugrt_amd_pci.scratch),
and `queue.wait` polls its completion.

Order (gfx_v11_0_hw_init after gfx_v11_0_gfxhub_enable): init_golden_registers, constants_init (init_compute_vmid),
nbio gc_doorbell_init, rlc_resume (under PSP loading: the SRM enable; the clear-state buffer is not set up),
cp_resume (compute enable, the queue). plugrt's VM (plugrt_amd_pci.vm) is bound to VMID 8 on both hubs (the CP's
accesses go through the GFXHUB; the MMHUB's context 8 gets the same tables, as the kernel's VMIDs are per hub) and
both hubs' TLBs are flushed for it after every change. GC 12 (gfx_v12_0_hw_init) differs in order and format only: its golden
registers come before the CP set-up (plugrt_amd_pci.bringup runs them there), its page tables use GMC 12's PTE MTYPE field
(plugrt_amd_pci.vm), and its MQD and HQD registers are GC 11's (plugrt_amd_pci.mec). Never run on an AMD GPU: tested against the
fake GPU.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from plugrt_amd import aql, codeobject
from plugrt_amd_pci import doorbell, gc_init, gmc, mec, scratch, vm
from plugrt_amd_pci.discovery import DiscoveryTable, GCInfo
from plugrt_amd_pci.gmc import GFXHUBS, MMHUBS, Hub
from plugrt_amd_pci.regs import GPURegisters

HEAP_ALIGN = 2 << 20                 # 2 MiB: whole fragments
KERNARG_SLOT, KERNARG_SLOTS = 4096, 64   # kernarg blocks, one per dispatch in flight (reused once that dispatch is done)
KERNARG_ADDRESS = aql.KernelDispatchPacket.kernarg_address.offset


@dataclass
class Compute:
  """plugrt's compute context on one GPU: its address space, queue and VRAM heap."""
  regs: GPURegisters
  space: vm.AddressSpace
  hubs: list[tuple[Hub, int]]
  heap: int                          # the top of the heap: VRAM above it is free
  heap_end: int
  flush: Callable[[], None] | None = None
  timeout: float = 2.0
  queue: mec.ComputeQueue | None = None
  kernargs: int = 0                   # VA of the kernarg blocks (0 until the first launch)
  kernargs_at: int = 0
  allocations: list[tuple[int, int, int]] = field(default_factory=list)   # (VA, VRAM offset, size)
  holes: list[tuple[int, int]] = field(default_factory=list)   # freed VRAM below `heap`: (offset, size), sorted, merged
  gc: GCInfo | None = None            # the discovery table's GC info (CUs, shader engines: scratch sizing)
  major: int = 11                     # the GC generation
  scratch: tuple[int, int] | None = None   # the queue's scratch (VA, bytes), made on demand by plugrt_amd_pci.scratch
  scratch_per_item: int = 0

  def bind(self) -> None:
    """Write the changed tables, point VMID 8 at them on both hubs and flush both hubs' TLBs for it."""
    self.space.commit(self.flush)
    for hub, base in self.hubs:
      gmc.set_page_table(self.regs, base, hub, mec.VMID, self.space.pd_address)
      gmc.flush_tlb(self.regs, base, hub, mec.VMID, self.timeout, flush=self.flush)

  def alloc(self, size: int, flags: int = vm.RWX) -> tuple[int, int]:
    """Map `size` bytes of VRAM in VMID 8 (a freed range first, first fit, else above the heap's top); returns (VA, VRAM
    offset). Sizes of 2 MiB or more are 2 MiB aligned (whole fragments). Write through `regs.write_vram(offset, ...)`."""
    size = (size + vm.PAGE - 1) & ~(vm.PAGE - 1)
    align = HEAP_ALIGN if size >= HEAP_ALIGN else vm.PAGE
    hole = next((a for h, n in self.holes if (a := (h + align - 1) & ~(align - 1)) + size <= h + n), None)
    at = hole if hole is not None else (self.heap + align - 1) & ~(align - 1)
    if hole is None and at + size > self.heap_end:
      free = sum(n for _, n in self.holes) + self.heap_end - self.heap
      raise vm.VMError(f"VM: no room for {size} bytes in plugrt's VRAM heap (0x{self.heap:x}-0x{self.heap_end:x}; {free} bytes "
                       "free, not in one range)", "allocate less")
    va = mec.VA_BASE + at
    self.space.map(va, at, size, flags)     # first: a VMError (no page table left) leaves the heap as it was
    if hole is not None: self._take(at, size)
    else:
      top, self.heap = self.heap, at + size
      if at > top: self._give(top, at - top)      # the alignment gap stays usable
    self.bind()
    self.allocations.append((va, at, size))
    return va, at

  def free(self, va: int) -> None:
    """Unmap the allocation at `va` (TLBs flushed) and keep its VRAM for the next `alloc`. The caller makes sure no
    queued work still uses it."""
    k = next((k for k, (a, _, _) in enumerate(self.allocations) if a == va), None)
    if k is None: raise vm.VMError(f"VM: no allocation at VA 0x{va:x}", "free only what alloc returned, once")
    _, at, size = self.allocations.pop(k)
    self.space.unmap(va)
    self.bind()
    self._give(at, size)

  def _give(self, at: int, size: int) -> None:
    """A free range back: merged with its neighbours, and with the heap's top when it reaches it."""
    holes = sorted([*self.holes, (at, size)])
    merged: list[tuple[int, int]] = []
    for h, n in holes:
      if merged and merged[-1][0] + merged[-1][1] == h: merged[-1] = (merged[-1][0], merged[-1][1] + n)
      else: merged.append((h, n))
    if merged and merged[-1][0] + merged[-1][1] == self.heap: self.heap = merged.pop()[0]
    self.holes = merged

  def _take(self, at: int, size: int) -> None:
    k, (h, n) = next((k, hn) for k, hn in enumerate(self.holes) if hn[0] <= at and at + size <= hn[0] + hn[1])
    self.holes[k:k + 1] = [r for r in ((h, at - h), (at + size, h + n - at - size)) if r[1]]

def start(regs: GPURegisters, table: DiscoveryTable, mc_base: int, phys_base: int, heap: int, vram_size: int,
          flush: Callable[[], None] | None, timeout: float = 2.0) -> tuple[Compute | None, list[str]]:
  """Everything after the GFXHUB that plugrt implements, for GC 11.0.0/11.0.2 with MMHUB 3.0.0 and GC 12.0.0/12.0.1
  with MMHUB 4.1.0; (None, why) otherwise."""
  gc, mmhub, nbio = table.find("GC"), table.find("MMHUB"), table.find("NBIF")
  if (gc is None or mmhub is None or gc.version not in GFXHUBS or mmhub.version not in MMHUBS
      or GFXHUBS[gc.version].gmc != MMHUBS[mmhub.version].gmc):
    return None, ["compute not set up: plugrt sets it up on GC 11.0.0/11.0.2 with MMHUB 3.0.0 and GC 12.0.0/12.0.1 with MMHUB 4.1.0"]
  gmc_gen = GFXHUBS[gc.version].gmc
  steps = [] if gmc_gen >= 12 else [gc_init.golden(regs, gc) or f"no golden registers known for GC {gc.version_str}"]
  steps.append(gc_init.init_compute_vmid(regs, gc))
  line = doorbell.enable(regs, nbio)
  if line is None: return None, steps + [f"compute not set up: the doorbell routing of NBIO {nbio.version_str if nbio else '(none)'} is not known"]
  steps += [line, gc_init.rlc_resume(regs, gc)]
  space = vm.AddressSpace(regs, phys_base, gmc=gmc_gen)
  lay = mec.Layout()
  space.map(lay.va(0), lay.at, mec.QUEUE_BYTES)
  hubs = [(MMHUBS[mmhub.version], mmhub.bases[0]), (GFXHUBS[gc.version], gc.bases[0])]
  c = Compute(regs, space, hubs, heap, vram_size - (1 << 20), flush, timeout, gc=table.gc, major=gc.version[0])
  c.bind()
  steps.append(f"VMID {mec.VMID} bound on the MMHUB and GFXHUB, TLBs flushed: {space.describe()}")
  c.queue, qline = mec.setup(regs, gc, lay, mc_base, regs.doorbell, flush)
  steps.append(qline)
  return c, steps


def place(c: Compute, co: codeobject.CodeObject) -> int:
  """Place a parsed code object in VMID 8: its image, relocated to its VA, written through the VRAM BAR (or the
  register window); returns the image's VA (a kernel's kernel_object is VA + its kd_offset)."""
  va, at = c.alloc(co.image_size)
  c.regs.write_vram(at, bytes(co.image(va)))
  if c.flush is not None: c.flush()
  return va


def load(c: Compute, blob: bytes) -> tuple[codeobject.CodeObject, int]:
  """`place` of a code object's bytes; returns the parsed object and the image's VA."""
  co = codeobject.parse(blob)
  return co, place(c, co)


def launch(c: Compute, co: codeobject.CodeObject, va: int, name: str, buffers: list[int], scalars: list[bytes],
           groups: tuple[int, int, int], local: tuple[int, int, int]) -> int:
  """One dispatch of kernel `name` of a loaded code object: its kernarg segment (codeobject.KernelInfo.kernargs:
  explicit and hidden arguments) and AQL packet through `submit`; returns what `queue.wait` takes."""
  info = co.kernels[name]
  if info.private_segment_size or info.descriptor.private_segment_enabled: scratch.ensure(c, info.private_segment_size)
  grid = (groups[0] * local[0], groups[1] * local[1], groups[2] * local[2])
  packet = aql.dispatch_packet(va + info.kd_offset, 0, grid, local, info.group_segment_size, info.private_segment_size)
  return submit(c, packet, bytes(info.kernargs(buffers, scalars, groups, local)))


def submit(c: Compute, packet: bytes, kernargs: bytes) -> int:
  """One dispatch: `kernargs` into the next kernarg block (once the dispatch that last used it is done), then the AQL
  `packet` with its kernarg address set to that block; returns what `queue.wait` takes."""
  assert c.queue is not None
  if not c.kernargs: c.kernargs, c.kernargs_at = c.alloc(KERNARG_SLOT * KERNARG_SLOTS)
  n = c.queue.submitted
  if n >= KERNARG_SLOTS: c.queue.wait(n - KERNARG_SLOTS + 1, c.timeout)      # the slot's previous dispatch is done
  slot = (n % KERNARG_SLOTS) * KERNARG_SLOT
  c.regs.write_vram(c.kernargs_at + slot, kernargs)
  return c.queue.submit(packet[:KERNARG_ADDRESS] + (c.kernargs + slot).to_bytes(8, "little") + packet[KERNARG_ADDRESS + 8:])
