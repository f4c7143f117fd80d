"""The memory hubs' GART and system aperture (GMC), as register writes computed from a memory-controller layout.

What the kernel's gmc_v11_0_gart_enable does on the MMHUB and gfx_v11_0_gfxhub_enable on the GFXHUB (their hubs'
gart_enable, the VM contexts 1-15's configuration included (their page tables: plugrt_amd_pci.vm); then the HDP
flush, the protection-fault defaults and the GART's TLB flush), as data: `gart_enable_ops(layout, hub)` is the list of
writes (`Write`: a whole register; `Update`: a read-modify-write of named fields, or fields set on a documented
default), `apply(regs, base, ops, hub)` performs them (the hubs: `Hub`, MMHUBS, GFXHUBS; their register tables:
plugrt_amd_pci.regtables.gmc). The layout is the kernel's (gmc_v11_0_vram_gtt_location): VRAM
("FB") at the MC address the MMHUB reports, the GART (512 MiB, amdgpu_gart_size's default) placed high below the
48-bit hole on a 4 GiB boundary, no AGP aperture (amdgpu_gmc_set_agp_default), the system aperture over the FB, its
default page a VRAM scratch page; both hubs share it and the one GART table.

plugrt's GART page table is flat (context 0, PAGE_TABLE_DEPTH 0) and starts with every entry invalid (zeroed); the
kernel points unbound entries at a dummy system page. The protection-fault default address is a *system* page in the
kernel (adev->dummy_page_addr, DMA-mapped): through sysfs BARs plugrt has no DMA mapping, so it leaves those two
registers alone unless given one. Sources: docs/research/amd-pci.md ("GMC"). Never run on an AMD GPU: tested against
the fake register file.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from plugrt.errors import PlugrtError
from plugrt_amd_pci.regs import GPURegisters, poll
from plugrt_amd_pci.regtables.gmc import (
  CTX_ADDR_DISTANCE,
  CTX_DISTANCE,
  FIELDS,
  FIELDS_12_MOVED,
  GC_11_0_0,
  GC_12_0_0,
  GC_DEFAULTS,
  MM_DEFAULTS,
  MMHUB_3_0_0,
  MMHUB_4_1_0,
)

MTYPE_UC = 3                          # soc21_enum.h
INVALIDATE_ENGINES, ENG_DISTANCE = 18, 2   # address-range registers: 2 dwords per engine
GART_ENGINE = 17                           # gmc_v11_0_flush_gpu_tlb: "Use register 17 for GART"; SEM/REQ/ACK 1 dword apart
PRIVATE_INVALIDATION = 1 << 25             # MMVM_L2_BANK_SELECT_RESERVED_CID2 bit 25 (RSERVED_CACHE_PRIVATE_INVALIDATION)
GART_SIZE = 512 << 20                 # gmc_v11_0_sw_init: amdgpu_gart_size -1 -> 512 MiB
GART_MIN = 32 << 20                   # amdgpu_device_check_arguments: a gartsize below 32 (MiB) is refused
MAX_MC = (1 << 47) - 1                # min(mc_mask 48-bit, AMDGPU_GMC_HOLE_START - 1)
FOUR_GB = 1 << 32
AGP_OFF = (0xFFFFFFFFFFFF, 0)         # amdgpu_gmc_set_agp_default: agp_start, agp_end
PTE_VALID = 1 << 0


@dataclass(frozen=True)
class Hub:
  """One memory hub: its register table and defaults, and what its TLB flush does beyond request/acknowledge (the
  invalidation semaphore and the private invalidation are the MMHUB's only: gmc_v11_0_flush_gpu_tlb)."""
  name: str
  offsets: dict[str, int]
  defaults: dict[str, int]
  semaphore: bool
  private_invalidation: bool
  cp_debug: bool                      # set_fault_enable_default also stops the CP halting on UTCL1 errors (gfxhub_v3_0)
  fields: dict[str, dict[str, int]] | None = None   # this hub's field masks where they differ from FIELDS (GMC 12)
  gmc: int = 11                       # the GMC generation whose kernel functions program it (the step's text)

  @property
  def masks(self) -> dict[str, dict[str, int]]: return self.fields or FIELDS


FIELDS_12 = FIELDS | FIELDS_12_MOVED
MMHUB_V3_0 = Hub("MMHUB 3.0.0", MMHUB_3_0_0, MM_DEFAULTS, semaphore=True, private_invalidation=True, cp_debug=False)
GFXHUB_V3_0 = Hub("GFXHUB (gfxhub_v3_0)", GC_11_0_0, GC_DEFAULTS, semaphore=False, private_invalidation=False, cp_debug=True)
#: GMC 12's hubs start CNTL3/4/5 from the same defaults as GMC 11's (regMMVM_L2_CNTLn_DEFAULT in mmhub_v4_1_0.c,
#: regGCVM_L2_CNTLn_DEFAULT in gfxhub_v12_0.c)
MMHUB_V4_1_0 = Hub("MMHUB 4.1.0", MMHUB_4_1_0, MM_DEFAULTS, semaphore=True, private_invalidation=True, cp_debug=False,
                   fields=FIELDS_12, gmc=12)
GFXHUB_V12_0 = Hub("GFXHUB (gfxhub_v12_0)", GC_12_0_0, GC_DEFAULTS, semaphore=False, private_invalidation=False, cp_debug=True,
                   fields=FIELDS_12, gmc=12)
#: hub versions plugrt programs: MMHUB by its IP version (mmhub_v3_0 is the default of gmc_v11_0_set_mmhub_funcs: plugrt
#: takes 3.0.0 of it; gmc_v12_0_set_mmhub_funcs: mmhub_v4_1_0 for 4.1.0); the GFXHUB by GC version (gfxhub_v3_0 serves GC
#: 11 except 11.0.3 and 11.5.x: plugrt takes the dGPUs; gmc_v12_0_set_gfxhub_funcs: gfxhub_v12_0 for GC 12.0.0/12.0.1)
MMHUBS = {(3, 0, 0): MMHUB_V3_0, (4, 1, 0): MMHUB_V4_1_0}
GFXHUBS = {(11, 0, 0): GFXHUB_V3_0, (11, 0, 2): GFXHUB_V3_0, (12, 0, 0): GFXHUB_V12_0, (12, 0, 1): GFXHUB_V12_0}


@dataclass(frozen=True)
class Layout:
  """The MC address space as the kernel lays it out for GMC 11, and where plugrt's GMC pages are (physical VRAM)."""
  fb_start: int
  fb_end: int
  gart_start: int
  gart_end: int
  table_pa: int                       # the GART page table (VRAM physical address)
  scratch_pa: int                     # the system aperture's default page (VRAM physical address)
  dummy_page: int | None = None       # a DMA address for protection faults (None: not available)
  agp_start: int = AGP_OFF[0]
  agp_end: int = AGP_OFF[1]


def layout(fb_start: int, vram_size: int, phys_base: int, table_at: int, scratch_at: int, gart_size: int = GART_SIZE,
           dummy_page: int | None = None) -> Layout:
  """amdgpu_gmc_vram_location + amdgpu_gmc_gart_location(HIGH); `*_at` are VRAM offsets."""
  gart_start = (MAX_MC - gart_size + 1) & ~(FOUR_GB - 1)
  return Layout(fb_start, fb_start + vram_size - 1, gart_start, gart_start + gart_size - 1, phys_base + table_at, phys_base + scratch_at,
                dummy_page)


@dataclass(frozen=True)
class Write:
  reg: str
  value: int


@dataclass(frozen=True)
class Update:
  reg: str
  fields: tuple[tuple[str, int], ...]
  base: int | None = None             # None: read the register first; else start from this default
  field_reg: str | None = None        # the register whose field masks apply (CONTEXT1's for contexts 1-15)


def field_set(reg: str, value: int, fields: tuple[tuple[str, int], ...], masks: dict[str, dict[str, int]] = FIELDS) -> int:
  """`value` with each named field of `reg` set (masks: the hub's table, `Hub.masks`; GMC 11's by default)."""
  for name, v in fields:
    mask = masks[reg][name]
    shift = (mask & -mask).bit_length() - 1
    if v << shift & ~mask: raise ValueError(f"{reg}.{name} = {v} does not fit its mask 0x{mask:x}")
    value = (value & ~mask) | (v << shift)
  return value & 0xFFFFFFFF


def gart_enable_ops(lay: Layout, hub: Hub) -> list[Write | Update]:
  """The hub's gart_enable writes (mmhub_v3_0 / gfxhub_v3_0), in their order, setup_vmid_config (contexts 1-15) included."""
  pt = lay.table_pa | PTE_VALID
  ops: list[Write | Update] = [
    # init_gart_aperture_regs (with setup_vm_pt_regs for context 0)
    Write("MMVM_CONTEXT0_PAGE_TABLE_BASE_ADDR_LO32", pt & 0xFFFFFFFF), Write("MMVM_CONTEXT0_PAGE_TABLE_BASE_ADDR_HI32", pt >> 32),
    Write("MMVM_CONTEXT0_PAGE_TABLE_START_ADDR_LO32", (lay.gart_start >> 12) & 0xFFFFFFFF),
    Write("MMVM_CONTEXT0_PAGE_TABLE_START_ADDR_HI32", lay.gart_start >> 44),
    Write("MMVM_CONTEXT0_PAGE_TABLE_END_ADDR_LO32", (lay.gart_end >> 12) & 0xFFFFFFFF),
    Write("MMVM_CONTEXT0_PAGE_TABLE_END_ADDR_HI32", lay.gart_end >> 44),
    # init_system_aperture_regs
    Write("MMMC_VM_AGP_BASE", 0), Write("MMMC_VM_AGP_BOT", lay.agp_start >> 24), Write("MMMC_VM_AGP_TOP", lay.agp_end >> 24),
    Write("MMMC_VM_SYSTEM_APERTURE_LOW_ADDR", min(lay.fb_start, lay.agp_start) >> 18),
    Write("MMMC_VM_SYSTEM_APERTURE_HIGH_ADDR", max(lay.fb_end, lay.agp_end) >> 18),
    Write("MMMC_VM_SYSTEM_APERTURE_DEFAULT_ADDR_LSB", (lay.scratch_pa >> 12) & 0xFFFFFFFF),
    Write("MMMC_VM_SYSTEM_APERTURE_DEFAULT_ADDR_MSB", lay.scratch_pa >> 44),
  ]
  if lay.dummy_page is not None:
    ops += [Write("MMVM_L2_PROTECTION_FAULT_DEFAULT_ADDR_LO32", (lay.dummy_page >> 12) & 0xFFFFFFFF),
            Write("MMVM_L2_PROTECTION_FAULT_DEFAULT_ADDR_HI32", lay.dummy_page >> 44)]
  ops += [
    Update("MMVM_L2_PROTECTION_FAULT_CNTL2", (("ACTIVE_PAGE_MIGRATION_PTE_READ_RETRY", 1),)),
    # init_tlb_regs
    Update("MMMC_VM_MX_L1_TLB_CNTL", (("ENABLE_L1_TLB", 1), ("SYSTEM_ACCESS_MODE", 3), ("ENABLE_ADVANCED_DRIVER_MODEL", 1),
                                      ("SYSTEM_APERTURE_UNMAPPED_ACCESS", 0), ("ECO_BITS", 0), ("MTYPE", MTYPE_UC))),
    # init_cache_regs (translate_further is off on GMC 11: BANK_SELECT 9, BIGK fragment 6)
    Update("MMVM_L2_CNTL", (("ENABLE_L2_CACHE", 1), ("ENABLE_L2_FRAGMENT_PROCESSING", 0), ("ENABLE_DEFAULT_PAGE_OUT_TO_SYSTEM_MEMORY", 1),
                            ("L2_PDE0_CACHE_TAG_GENERATION_MODE", 0), ("PDE_FAULT_CLASSIFICATION", 0),
                            ("CONTEXT1_IDENTITY_ACCESS_MODE", 1), ("IDENTITY_MODE_FRAGMENT_SIZE", 0))),
    Update("MMVM_L2_CNTL2", (("INVALIDATE_ALL_L1_TLBS", 1), ("INVALIDATE_L2_CACHE", 1))),
    Update("MMVM_L2_CNTL3", (("BANK_SELECT", 9), ("L2_CACHE_BIGK_FRAGMENT_SIZE", 6)), hub.defaults["MMVM_L2_CNTL3"]),
    Update("MMVM_L2_CNTL4", (("VMC_TAP_PDE_REQUEST_PHYSICAL", 0), ("VMC_TAP_PTE_REQUEST_PHYSICAL", 0)), hub.defaults["MMVM_L2_CNTL4"]),
    Update("MMVM_L2_CNTL5", (("L2_CACHE_SMALLK_FRAGMENT_SIZE", 0),), hub.defaults["MMVM_L2_CNTL5"]),
    # enable_system_domain
    Update("MMVM_CONTEXT0_CNTL", (("ENABLE_CONTEXT", 1), ("PAGE_TABLE_DEPTH", 0), ("RETRY_PERMISSION_OR_INVALID_PAGE_FAULT", 0))),
    # disable_identity_aperture
    Write("MMVM_L2_CONTEXT1_IDENTITY_APERTURE_LOW_ADDR_LO32", 0xFFFFFFFF), Write("MMVM_L2_CONTEXT1_IDENTITY_APERTURE_LOW_ADDR_HI32", 0xF),
    Write("MMVM_L2_CONTEXT1_IDENTITY_APERTURE_HIGH_ADDR_LO32", 0), Write("MMVM_L2_CONTEXT1_IDENTITY_APERTURE_HIGH_ADDR_HI32", 0),
    Write("MMVM_L2_CONTEXT_IDENTITY_PHYSICAL_OFFSET_LO32", 0), Write("MMVM_L2_CONTEXT_IDENTITY_PHYSICAL_OFFSET_HI32", 0),
  ]
  ops += vmid_config_ops(hub)
  # program_invalidation: every engine may invalidate the whole range
  for i in range(INVALIDATE_ENGINES):
    ops += [Write(f"MMVM_INVALIDATE_ENG{i}_ADDR_RANGE_LO32", 0xFFFFFFFF), Write(f"MMVM_INVALIDATE_ENG{i}_ADDR_RANGE_HI32", 0x1F)]
  return ops


#: GMC 11's VM: 48-bit addresses, 3 directory levels above the page tables, 9-bit blocks, 2 MiB fragments
#: (gmc_v11_0_sw_init: amdgpu_vm_adjust_size(adev, 256 * 1024, 9, 3, 48)); max_pfn = 2^48 / 4 KiB
VM_NUM_LEVEL, VM_BLOCK_SIZE, VM_MAX_PFN = 3, 9, 1 << 36
NORETRY = 1                           # amdgpu_gmc_noretry_set: on by default for GC 10.3 and later


def vmid_config_ops(hub: Hub | None = None) -> list[Write | Update]:
  """setup_vmid_config (mmhub_v3_0 / gfxhub_v3_0): contexts 1-15 enabled with a 4-level table (depth 3, block size
  9 - 9 = 0), every protection fault's default action on, no retry, the whole 48-bit range. Their page-table bases
  are set per VMID when a VM is bound (`set_page_table`)."""
  ops: list[Write | Update] = []
  masks = hub.masks if hub is not None else FIELDS
  fields = (("ENABLE_CONTEXT", 1), ("PAGE_TABLE_DEPTH", VM_NUM_LEVEL)) + tuple(
    (f, 1) for f in masks["MMVM_CONTEXT1_CNTL"] if f.endswith("_ENABLE_DEFAULT")) + (
    ("PAGE_TABLE_BLOCK_SIZE", VM_BLOCK_SIZE - 9), ("RETRY_PERMISSION_OR_INVALID_PAGE_FAULT", int(not NORETRY)))
  for ctx in range(1, 16):
    ops += [Update(f"MMVM_CONTEXT{ctx}_CNTL", fields, field_reg="MMVM_CONTEXT1_CNTL"),
            Write(f"MMVM_CONTEXT{ctx}_PAGE_TABLE_START_ADDR_LO32", 0), Write(f"MMVM_CONTEXT{ctx}_PAGE_TABLE_START_ADDR_HI32", 0),
            Write(f"MMVM_CONTEXT{ctx}_PAGE_TABLE_END_ADDR_LO32", (VM_MAX_PFN - 1) & 0xFFFFFFFF),
            Write(f"MMVM_CONTEXT{ctx}_PAGE_TABLE_END_ADDR_HI32", (VM_MAX_PFN - 1) >> 32)]
  return ops


def set_page_table(regs: GPURegisters, base: int, hub: Hub, vmid: int, pd_address: int) -> None:
  """setup_vm_pt_regs: a VMID's page-directory base (the root table's physical address | PTE_VALID, as
  amdgpu_gmc_pd_addr makes it) in CONTEXT<vmid>_PAGE_TABLE_BASE_ADDR_LO32/HI32."""
  regs.wreg(base + offset(hub, f"MMVM_CONTEXT{vmid}_PAGE_TABLE_BASE_ADDR_LO32"), pd_address & 0xFFFFFFFF)
  regs.wreg(base + offset(hub, f"MMVM_CONTEXT{vmid}_PAGE_TABLE_BASE_ADDR_HI32"), pd_address >> 32)


def offset(hub: Hub, reg: str) -> int:
  """A register's dword offset in `hub`; the invalidation engines are ENG0's plus ENG_DISTANCE per engine."""
  if reg in hub.offsets: return hub.offsets[reg]
  if reg.startswith("MMVM_INVALIDATE_ENG"):
    eng, rest = reg[len("MMVM_INVALIDATE_ENG"):].split("_", 1)
    return hub.offsets[f"MMVM_INVALIDATE_ENG0_{rest}"] + int(eng) * ENG_DISTANCE
  if reg.startswith("MMVM_CONTEXT"):
    ctx, rest = reg[len("MMVM_CONTEXT"):].split("_", 1)
    return hub.offsets[f"MMVM_CONTEXT0_{rest}"] + int(ctx) * (CTX_DISTANCE if rest == "CNTL" else CTX_ADDR_DISTANCE)
  raise KeyError(reg)


def apply(regs: GPURegisters, base: int, ops: list[Write | Update], hub: Hub) -> int:
  """Perform `ops` on `hub` whose segment-0 base is `base`; returns the number of register writes."""
  for op in ops:
    reg = base + offset(hub, op.reg)
    if isinstance(op, Write): value = op.value
    else: value = field_set(op.field_reg or op.reg, regs.rreg(reg) if op.base is None else op.base, op.fields, hub.masks)
    regs.wreg(reg, value & 0xFFFFFFFF)
  return len(ops)


#: where plugrt puts the GART table and the default page: in the gap between the 9 MiB pre-OS framebuffer the kernel
#: keeps reserved and plugrt's PSP buffers at 16 MiB (psp.DEFAULT_BASE); a choice, not the kernel's (TTM places them)
TABLE_AT, SCRATCH_AT = 12 << 20, 13 << 20


class GMCUnsupported(ValueError):
  """A memory hub version whose registers plugrt does not know."""


class GMCTimeout(PlugrtError, RuntimeError):
  """The memory hub did not answer a TLB flush (its semaphore or acknowledge) within the bound."""


def invalidate_req(vmid: int, flush_type: int = 0, masks: dict[str, dict[str, int]] = FIELDS) -> int:
  """mmhub_v3_0/v4_1_0_get_invalidate_req: legacy invalidation of one VMID's L2 PTEs/PDEs and L1 PTEs."""
  return field_set("MMVM_INVALIDATE_ENG0_REQ", 0, (("PER_VMID_INVALIDATE_REQ", 1 << vmid), ("FLUSH_TYPE", flush_type),
                   ("INVALIDATE_L2_PTES", 1), ("INVALIDATE_L2_PDE0", 1), ("INVALIDATE_L2_PDE1", 1), ("INVALIDATE_L2_PDE2", 1),
                   ("INVALIDATE_L1_PTES", 1), ("CLEAR_PROTECTION_FAULT_STATUS_ADDR", 0)), masks)


def flush_tlb(regs: GPURegisters, base: int, hub: Hub, vmid: int = 0, timeout: float = 2.0,
              sleep: Callable[[float], None] = time.sleep, flush: Callable[[], None] | None = None) -> int:
  """gmc_v11_0_flush_gpu_tlb before KIQ/MES exist, on invalidation engine 17: HDP flush; on the MMHUB acquire the
  engine's semaphore; request; wait for the VMID's acknowledge bit; release; on the MMHUB the private invalidation
  through BANK_SELECT_RESERVED_CID2. The kernel only logs a semaphore or acknowledge timeout; plugrt raises
  `GMCTimeout`. Returns the number of register writes."""
  sem, req, ack = (base + hub.offsets[f"MMVM_INVALIDATE_ENG0_{r}"] + GART_ENGINE for r in ("SEM", "REQ", "ACK"))
  if flush is not None: flush()

  def wait(what: str, reg: int, bit: int) -> None:
    ok, v = poll(lambda: regs.rreg(reg), lambda v: v & bit, timeout, sleep)
    if not ok:
      raise GMCTimeout(f"GMC: {hub.name} TLB flush: {what} (dword 0x{reg:x} & 0x{bit:x}): still 0x{v:08x} after {timeout:g} s",
                       "the memory hub is not answering: reset the GPU")

  if hub.semaphore: wait(f"invalidation engine {GART_ENGINE}'s semaphore not acquired", sem, 1)
  regs.wreg(req, invalidate_req(vmid, masks=hub.masks))
  wait(f"no acknowledge for VMID {vmid}", ack, 1 << vmid)
  writes = 1
  if hub.semaphore:
    regs.wreg(sem, 0)
    writes += 1
  if hub.private_invalidation:
    cid2 = base + hub.offsets["MMVM_L2_BANK_SELECT_RESERVED_CID2"]
    regs.wreg(cid2, regs.rreg(cid2) | PRIVATE_INVALIDATION)
    regs.rreg(cid2)                    # read back: the invalidation is done
    writes += 1
  return writes


def fault_defaults(hub: Hub) -> list[Write | Update]:
  """set_fault_enable_default(true) (amdgpu_vm_fault_stop's default): every *_PROTECTION_FAULT_ENABLE_DEFAULT on; the
  GFXHUB's also keeps the CP from halting on UTCL1 errors (CP_DEBUG)."""
  ops: list[Write | Update] = [Update("CP_DEBUG", (("CPG_UTCL1_ERROR_HALT_DISABLE", 1),))] if hub.cp_debug else []
  return ops + [Update("MMVM_L2_PROTECTION_FAULT_CNTL", tuple((f, 1) for f in hub.masks["MMVM_L2_PROTECTION_FAULT_CNTL"]))]


def enable_hub(regs: GPURegisters, hub: Hub, base: int, lay: Layout, flush: Callable[[], None] | None = None, timeout: float = 2.0) -> int:
  """gart_enable, HDP flush, fault defaults, TLB flush of VMID 0 (gmc_v11_0_gart_enable / gfx_v11_0_gfxhub_enable);
  returns the number of register writes."""
  n = apply(regs, base, gart_enable_ops(lay, hub), hub)
  if flush is not None: flush()
  n += apply(regs, base, fault_defaults(hub), hub)
  return n + flush_tlb(regs, base, hub, 0, timeout, flush=flush)


def enable(regs: GPURegisters, version: tuple[int, int, int], base: int, fb_start: int, vram_size: int, phys_base: int,
           flush: Callable[[], None] | None = None, timeout: float = 2.0, gart_size: int = GART_SIZE) -> tuple[Layout, str]:
  """The MMHUB's part (gmc_v11_0_gart_enable): zero the GART table and the default page in VRAM, then `enable_hub`;
  returns the layout (the GFXHUB gets the same later) and the step's text. `gart_size`: the USB interface asks for the
  kernel's smallest (GART_MIN), whose table it can zero through dword TLPs."""
  if (hub := MMHUBS.get(version)) is None:
    raise GMCUnsupported(f"GART set-up for MMHUB {'.'.join(map(str, version))} is not implemented (plugrt programs MMHUB 3.0.0 "
                         "and 4.1.0)")
  lay = layout(fb_start, vram_size, phys_base, TABLE_AT, SCRATCH_AT, gart_size)
  entries = (lay.gart_end - lay.gart_start + 1) >> 12
  regs.write_vram(TABLE_AT, bytes(entries * 8))           # every PTE invalid
  regs.write_vram(SCRATCH_AT, bytes(0x1000))
  n = enable_hub(regs, hub, base, lay, flush, timeout)
  return lay, (f"{hub.name} GART enabled ({n} register writes, as gmc_v{hub.gmc}_0_gart_enable, VM contexts 1-15 configured; TLB flushed "
               f"on engine {GART_ENGINE}): {(lay.gart_end - lay.gart_start + 1) >> 20} MiB at MC 0x{lay.gart_start:x}-0x{lay.gart_end:x}, "
               f"flat table of {entries} invalid entries at VRAM 0x{TABLE_AT:x}; system aperture MC 0x{lay.fb_start:x}-0x{lay.fb_end:x} "
               f"(default page VRAM 0x{SCRATCH_AT:x}); no AGP aperture; protection-fault default page not set (no DMA mapping "
               "through sysfs)")


def enable_gfxhub(regs: GPURegisters, gc_version: tuple[int, int, int], base: int, lay: Layout, flush: Callable[[], None] | None = None,
                  timeout: float = 2.0) -> str:
  """gfx_v11_0_gfxhub_enable on the GFXHUB (GC segment 0 at `base`), with the MMHUB's layout and GART table."""
  if (hub := GFXHUBS.get(gc_version)) is None:
    raise GMCUnsupported(f"GART set-up for the GFXHUB of GC {'.'.join(map(str, gc_version))} is not implemented "
                         "(plugrt programs GC 11.0.0 and 11.0.2's gfxhub_v3_0, GC 12.0.0 and 12.0.1's gfxhub_v12_0)")
  n = enable_hub(regs, hub, base, lay, flush, timeout)
  return f"{hub.name} GART enabled ({n} register writes, as gfx_v{hub.gmc}_0_gfxhub_enable, VM contexts 1-15 configured): the same GART and aperture"
