"""GC 11 initialisation as data, after the CP set-up and the GFXHUB: the golden registers and the compute VMIDs'
shader-memory apertures.

- Golden registers (gfx_v11_0_init_golden_registers): for GC 11.0.0 and 11.0.2 the kernel programs one entry,
  golden_settings_gc_11_0 = {TCP_CNTL (GC segment 1 + 0x19a2), and-mask 0x20000000, or-mask 0x20000000}
  (golden_settings_gc_11_0_1 is for the APUs 11.0.1/11.0.4 only); soc15_program_register_sequence writes the or-mask
  alone when the and-mask is 0xffffffff, else a read-modify-write (clear the and-mask bits, set or & and).
- gfx_v11_0_init_compute_vmid, for the KFD's VMIDs 8-15 (first_kfd_vmid 8 on GFX11, AMDGPU_NUM_VMID 16): under each
  VMID's GRBM selection (GRBM_GFX_CNTL.VMID), SH_MEM_CONFIG = DEFAULT_SH_MEM_CONFIG (ADDRESS_MODE 64-bit 0,
  ALIGNMENT_MODE UNALIGNED 3 << 2, INITIAL_INST_PREFETCH 3 << 14: 0xc00c), SH_MEM_BASES = LDS_APP_BASE 0x1 << 16 |
  SCRATCH_APP_BASE 0x2 (the LDS aperture at 0x1_0000_0000_0000 and scratch at 0x2_0000_0000_0000 in the VMID's
  space, bits 63:48), SPI_GDBG_PER_VMID_CNTL.TRAP_EN (bit 3) set; then GDS_VMID<n>_BASE/SIZE (2 dwords apart),
  GDS_GWS_VMID<n> and GDS_OA_VMID<n> zeroed. Offsets: gc_11_0_0_offset.h (SH_MEM_BASES 0x9e3 and SH_MEM_CONFIG 0x9e4 in
  segment 1; SPI_GDBG_PER_VMID_CNTL 0x1f72, GDS_VMID0_BASE 0x20a0, GDS_VMID0_SIZE 0x20a1, GDS_GWS_VMID0 0x20c0,
  GDS_OA_VMID0 0x20d0 in segment 0).
- gfx_v11_0_rlc_resume under PSP loading: gfx_v11_0_init_csb (the clear-state buffer's address and length in
  RLC_CSIB_ADDR_LO/HI/LENGTH: NOT done, it needs the gfx11_cs_data clear-state table the kernel compiles in) and
  gfx_v11_0_rlc_enable_srm: RLC_SRM_CNTL (segment 1 + 0x4c80) |= SRM_ENABLE (bit 0) | AUTO_INCR_ADDR (bit 1).

GC 12.0.0/12.0.1 (gfx_v12_0.c), where they differ:
- golden_settings_gc_12_0 = {DB_MEM_CONFIG (segment 0 + 0x13d2) &0xf |0xf, CB_HW_CONTROL_1 (0 + 0x1425) &0x03000000
  |0x03000000, GL2C_CTRL5 (1 + 0x2e19) &0x70 |0x20}, programmed only when adev->rev_id is 0; the rev id is
  RCC_STRAP0_RCC_DEV0_EPF0_STRAP0 (NBIF 6.3.1 segment 2 + 0x1c) bits 24-27 (nbif_v6_3_1_get_rev_id); and it comes right
  after the RLC autoload, before the CP set-up and the GFXHUB (gfx_v12_0_hw_init), so plugrt_amd_pci.bringup runs it there;
- gfx_v12_0_init_compute_vmid: the same SH_MEM_CONFIG/SH_MEM_BASES/TRAP_EN writes for VMIDs 8-15 (first_kfd_vmid 8 in
  gmc_v12_0.c; the same offsets in gc_12_0_0_offset.h; the field shifts taken as GC 11's, gc_12_0_0_sh_mask.h not read),
  and no GDS/GWS/OA clearing: GC 12 has no GDS registers (none in gc_12_0_0_offset.h);
- rlc_resume: gfx_v12_0_init_csb (not done) and gfx_v12_0_rlc_enable_srm, RLC_SRM_CNTL at the same place.
Never run on an AMD GPU: tested against the fake register file.
"""
from __future__ import annotations

from plugrt_amd_pci.discovery import IPBlock
from plugrt_amd_pci.gfx import grbm_select
from plugrt_amd_pci.regs import GPURegisters
from plugrt_amd_pci.regtables.gc import COMPUTE_VMID_REGS, GOLDEN_11, GOLDEN_12, GRBM_GFX_CNTL, RLC_SRM_CNTL
from plugrt_amd_pci.regtables.nbio import REV_ID

#: each GC version's golden settings (regtables.gc: gfx_v11_0.c's and gfx_v12_0.c's)
GOLDEN = {(11, 0, 0): GOLDEN_11, (11, 0, 2): GOLDEN_11, (12, 0, 0): GOLDEN_12, (12, 0, 1): GOLDEN_12}
#: GC versions whose golden settings the kernel applies on rev id 0 only (gfx_v12_0_init_golden_registers)
REV0_ONLY = {(12, 0, 0), (12, 0, 1)}
NO_GDS = {12}                                # GC majors without GDS/GWS/OA registers
FIRST_KFD_VMID, NUM_VMID = 8, 16
SH_MEM_CONFIG = 0 | 3 << 2 | 3 << 14        # DEFAULT_SH_MEM_CONFIG
SH_MEM_BASES = 0x1 << 16 | 0x2              # LDS_APP_BASE << SHARED_BASE (16), SCRATCH_APP_BASE (PRIVATE_BASE 0)
TRAP_EN = 1 << 3                             # SPI_GDBG_PER_VMID_CNTL.TRAP_EN (gc_11_0_0_sh_mask.h)
SRM_ENABLE_AUTO_INCR = 0x3                  # RLC_SRM_CNTL.SRM_ENABLE | AUTO_INCR_ADDR


def rev_id(regs: GPURegisters, nbio: IPBlock | None) -> int | None:
  """The ASIC's revision id as the NBIO's get_rev_id reads it; None for an NBIO plugrt has no strap register for."""
  if nbio is None or (where := REV_ID.get(nbio.version[:2])) is None or len(nbio.bases) <= where[1]: return None
  off, seg, mask = where
  return (regs.rreg(nbio.bases[seg] + off) & mask) >> ((mask & -mask).bit_length() - 1)


def golden(regs: GPURegisters, gc: IPBlock, nbio: IPBlock | None = None) -> str | None:
  """soc15_program_register_sequence of this GC's golden settings; None when plugrt has none for it (recorded). On GC
  12 the kernel applies them on rev id 0 only (read from `nbio`); otherwise the returned line says why not."""
  if (table := GOLDEN.get(gc.version)) is None: return None
  fn = f"gfx_v{gc.version[0]}_0_init_golden_registers"
  if gc.version in REV0_ONLY:
    if (rev := rev_id(regs, nbio)) is None: return f"golden registers not programmed: the rev id they depend on is not known for this NBIO ({fn})"
    if rev != 0: return f"golden registers not programmed: rev id {rev} (the kernel programs them on rev id 0 only, {fn})"
  for _, seg, off, and_mask, or_mask in table:
    reg = gc.bases[seg] + off
    value = or_mask if and_mask == 0xFFFFFFFF else (regs.rreg(reg) & ~and_mask) | (or_mask & and_mask)
    regs.wreg(reg, value & 0xFFFFFFFF)
  return "golden registers: " + ", ".join(f"{n} &0x{a:08x} |0x{o:08x}" for n, _, _, a, o in table) + f" ({fn})"


def init_compute_vmid(regs: GPURegisters, gc: IPBlock) -> str:
  """gfx_v11_0/v12_0_init_compute_vmid: the shader-memory apertures and trap enable of VMIDs 8-15, their GDS/GWS/OA
  cleared where the GC has them (GC 11)."""
  at = {n: gc.bases[seg] + off for n, (off, seg) in COMPUTE_VMID_REGS.items()}
  grbm = gc.bases[GRBM_GFX_CNTL[1]] + GRBM_GFX_CNTL[0]
  for vmid in range(FIRST_KFD_VMID, NUM_VMID):
    regs.wreg(grbm, grbm_select(0, 0, 0, vmid))
    regs.wreg(at["SH_MEM_CONFIG"], SH_MEM_CONFIG)
    regs.wreg(at["SH_MEM_BASES"], SH_MEM_BASES)
    regs.wreg(at["SPI_GDBG_PER_VMID_CNTL"], regs.rreg(at["SPI_GDBG_PER_VMID_CNTL"]) | TRAP_EN)
  regs.wreg(grbm, grbm_select(0, 0))
  fn = f"gfx_v{gc.version[0]}_0_init_compute_vmid"
  if gc.version[0] in NO_GDS:
    return (f"compute VMIDs {FIRST_KFD_VMID}-{NUM_VMID - 1}: SH_MEM_CONFIG 0x{SH_MEM_CONFIG:x}, SH_MEM_BASES 0x{SH_MEM_BASES:x}, "
            f"trap enabled; no GDS on this GC ({fn})")
  for vmid in range(FIRST_KFD_VMID, NUM_VMID):
    regs.wreg(at["GDS_VMID0_BASE"] + 2 * vmid, 0)
    regs.wreg(at["GDS_VMID0_SIZE"] + 2 * vmid, 0)
    regs.wreg(at["GDS_GWS_VMID0"] + vmid, 0)
    regs.wreg(at["GDS_OA_VMID0"] + vmid, 0)
  return (f"compute VMIDs {FIRST_KFD_VMID}-{NUM_VMID - 1}: SH_MEM_CONFIG 0x{SH_MEM_CONFIG:x}, SH_MEM_BASES 0x{SH_MEM_BASES:x}, "
          f"trap enabled, no GDS/GWS/OA ({fn})")


def rlc_resume(regs: GPURegisters, gc: IPBlock) -> str:
  """The PSP-loading branch of gfx_v11_0_rlc_resume, without init_csb: the RLC's save/restore machine enabled."""
  reg = gc.bases[RLC_SRM_CNTL[1]] + RLC_SRM_CNTL[0]
  regs.wreg(reg, regs.rreg(reg) | SRM_ENABLE_AUTO_INCR)
  return f"RLC save/restore machine enabled (gfx_v{gc.version[0]}_0_rlc_enable_srm; the clear-state buffer (init_csb) not set up)"

