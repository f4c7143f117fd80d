"""Doorbells on SOC21: the doorbell BAR (BAR2) and the NBIO set-up that routes its writes to the graphics core.

Each doorbell is a 64-bit slot of BAR2; the kernel numbers them in 64-bit units (AMDGPU_NAVI10_DOORBELL_*, used by
soc21_init_doorbell_index) and programs the CP with the dword index (`index * 2`): a queue's
CP_HQD_PQ_DOORBELL_CONTROL.DOORBELL_OFFSET and the MEC's doorbell range (CP_MEC_DOORBELL_RANGE_LOWER/UPPER, byte
offsets: KIQ * 2 << 2 and USERQUEUE_END * 2 << 2, gfx_v11_0_kiq_init_register). plugrt's one compute queue takes
MEC_RING0 (3), the kernel's first compute ring. A write reaches the CP only once NBIO routes it:
RCC_DEV0_EPF0_RCC_DOORBELL_APER_EN.BIF_DOORBELL_APER_EN (NBIO 4.3 segment 2 + 0xc0: nbio_v4_3_enable_doorbell_aperture,
from soc21_common_hw_init) and the GC's S2A doorbell entries (S2A_DOORBELL_ENTRY_0_CTRL 0x30000007 and
S2A_DOORBELL_ENTRY_3_CTRL 0x3000000d, NBIO 4.3 segment 3 + 0x4f7740 / 0x4f7743: nbio_v4_3_gc_doorbell_init, from
gfx_v11_0_hw_init). Offsets: nbio_4_3_0_offset.h (cross-checked with tinygrad's autogen tables). Never run on an AMD
GPU: tested against the fake.
"""
from __future__ import annotations

from plugrt_amd_pci.discovery import IPBlock
from plugrt_amd_pci.regs import MMIO, GPURegisters, RegisterError
from plugrt_amd_pci.regtables.nbio import DOORBELL

KIQ, MEC_RING0, USERQUEUE_END = 0x000, 0x003, 0x08A     # AMDGPU_NAVI10_DOORBELL_* (amdgpu_doorbell.h), 64-bit units
RANGE_LOWER, RANGE_UPPER = (KIQ * 2) << 2, (USERQUEUE_END * 2) << 2
#: the kernel function names of each NBIO's two steps (for the step's text)
FUNCS = {(4, 3): "nbio_v4_3", (6, 3): "nbif_v6_3_1"}


def enable(regs: GPURegisters, nbio: IPBlock | None) -> str | None:
  """The doorbell aperture and the GC's doorbell entries; None when plugrt does not know this NBIO (recorded)."""
  if nbio is None or (table := DOORBELL.get(nbio.version[:2])) is None or len(nbio.bases) <= max(s for _, s, _ in table.values()): return None
  off, seg, bit = table["RCC_DEV0_EPF0_RCC_DOORBELL_APER_EN"]
  regs.wreg(nbio.bases[seg] + off, regs.rreg(nbio.bases[seg] + off) | bit)
  for name in ("S2A_DOORBELL_ENTRY_0_CTRL", "S2A_DOORBELL_ENTRY_3_CTRL"):
    off, seg, value = table[name]
    regs.wreg(nbio.bases[seg] + off, value)
  f = FUNCS[nbio.version[:2]]
  return f"doorbells: NBIO {nbio.version_str} doorbell aperture on, GC doorbell entries 0/3 set ({f}_enable_doorbell_aperture, {f}_gc_doorbell_init)"


def ring(bar: MMIO | None, index: int, value: int) -> None:
  """Write the 64-bit doorbell `index` (64-bit units) in the doorbell BAR: one 8-byte store where the window can
  make one (the CP takes the whole value), else the low dword then the high."""
  if bar is None: raise RegisterError("no doorbell BAR is mapped", "map BAR2 (the PCI interface does; USB has no doorbell path)")
  at = index * 8
  if (write64 := getattr(bar, "write64", None)) is not None: return write64(at, value)
  bar.write32(at, value & 0xFFFFFFFF)
  bar.write32(at + 4, value >> 32)
