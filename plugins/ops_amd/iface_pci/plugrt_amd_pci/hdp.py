"""The HDP (host data path) flush: what makes the CPU's writes through the VRAM BAR visible to the GPU's own agents.

CPU writes to VRAM go through the HDP, which may hold them; before an agent of the GPU (the PSP reading a ring frame,
a command buffer or a firmware image) reads what the CPU wrote, the kernel flushes it: psp_ring_cmd_submit flushes
before moving the write pointer, gmc_v11_0_gart_enable after programming the GART. On SOC21/SOC24 GPUs the flush is
a write of 0 to the HDP_MEM_FLUSH_CNTL register remapped into the register BAR's last 4 KiB page
(`MMIO_REG_HOLE_OFFSET` = 0x80000 - PAGE_SIZE with 4 KiB pages), the remap itself set by the NBIO block at init
(nbio_v4_3 / nbif_v6_3_1 `remap_hdp_registers`: BIF_BX0_REMAP_HDP_MEM_FLUSH_CNTL <- hole + 0, ..._REG_FLUSH_CNTL <-
hole + 4; hdp_v6_0_flush_hdp). Sources: docs/research/amd-pci.md ("HDP"). Never run on an AMD GPU.
"""
from __future__ import annotations

from plugrt_amd_pci.discovery import IPBlock
from plugrt_amd_pci.regs import GPURegisters
from plugrt_amd_pci.regtables.nbio import HDP_REMAP

HOLE = 0x80000 - 0x1000              # MMIO_REG_HOLE_OFFSET (nbio_v4_3.c, nbif_v6_3_1.c) with 4 KiB pages
MEM_FLUSH, REG_FLUSH = 0x0, 0x4      # KFD_MMIO_REMAP_HDP_MEM_FLUSH_CNTL / _REG_FLUSH_CNTL (uapi kfd_ioctl.h)


class HDP:
  """The flush of one GPU's HDP, after `remap()` pointed the flush registers at the BAR's hole."""

  def __init__(self, regs: GPURegisters, nbio: IPBlock):
    self.regs = regs
    self.mem_remap, self.reg_remap, seg = HDP_REMAP[nbio.version[:2]]
    self.base = nbio.bases[seg]
    self.flushes = 0

  def remap(self) -> None:
    self.regs.wreg(self.base + self.mem_remap, HOLE + MEM_FLUSH)
    self.regs.wreg(self.base + self.reg_remap, HOLE + REG_FLUSH)

  def flush(self) -> None:
    self.regs.wreg((HOLE + MEM_FLUSH) >> 2, 0)
    self.flushes += 1


def setup(regs: GPURegisters, nbio: IPBlock | None) -> tuple[HDP | None, str]:
  """The remapped HDP flush when plugrt knows this NBIO and the register BAR reaches the hole; else None and why."""
  if nbio is None: return None, "HDP flush not set up: no NBIO block in IP discovery"
  if nbio.version[:2] not in HDP_REMAP or len(nbio.bases) <= HDP_REMAP[nbio.version[:2]][2]:
    return None, f"HDP flush not set up: its remap registers are not known for NBIO {nbio.version_str} (writes through the BAR are not flushed)"
  if regs.mmio.size < HOLE + 0x1000:
    return None, f"HDP flush not set up: the {regs.mmio.size >> 10} KiB register BAR does not reach the remap hole at 0x{HOLE:x}"
  h = HDP(regs, nbio)
  h.remap()
  return h, f"HDP flush remapped to register BAR offset 0x{HOLE:x} (as the NBIO's remap_hdp_registers)"
