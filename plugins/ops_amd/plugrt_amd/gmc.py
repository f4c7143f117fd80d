"""The memory hub's GART and system aperture (GMC), as register writes computed from a memory-controller layout.

What the kernel's gmc_v11_0_gart_enable does on the MMHUB (mmhub_v3_0_gart_enable), minus the VM contexts 1-15 (that
belongs to VM set-up), as data: `gart_enable_ops(layout)` is the list of writes (`Write`: a whole register; `Update`:
read, set fields, write; `Put`: a documented default with fields set), `apply(regs, hub_base, ops)` performs them.
The layout is the kernel's (gmc_v11_0_vram_gtt_location): VRAM ("FB") at the MC address the MMHUB reports, the GART
(512 MiB, amdgpu_gart_size's default) placed high below the 48-bit hole on a 4 GiB boundary, no AGP aperture
(amdgpu_gmc_set_agp_default), the system aperture over the FB, its default page a VRAM scratch page.

plugrt's GART page table is flat (context 0, PAGE_TABLE_DEPTH 0) and starts with every entry invalid (zeroed); the
kernel points unbound entries at a dummy system page. The protection-fault default address is a *system* page in the
kernel (adev->dummy_page_addr, DMA-mapped): through sysfs BARs plugrt has no DMA mapping, so it leaves those two
registers alone unless given one. Register offsets and fields: mmhub_3_0_0_offset.h / _sh_mask.h; sources in
docs/research/amd-pci.md ("GMC"). Never run on an AMD GPU: tested against the fake register file.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from plugrt.errors import PlugrtError
from plugrt_amd.regs import GPURegisters

#: MMHUB 3.0.0 register dword offsets, segment 0 (mmhub_3_0_0_offset.h)
MMHUB_3_0_0 = {
  "MMVM_L2_CNTL": 0x700, "MMVM_L2_CNTL2": 0x701, "MMVM_L2_CNTL3": 0x702, "MMVM_L2_PROTECTION_FAULT_CNTL2": 0x709,
  "MMVM_L2_PROTECTION_FAULT_DEFAULT_ADDR_LO32": 0x70F, "MMVM_L2_PROTECTION_FAULT_DEFAULT_ADDR_HI32": 0x710,
  "MMVM_L2_CONTEXT1_IDENTITY_APERTURE_LOW_ADDR_LO32": 0x712, "MMVM_L2_CONTEXT1_IDENTITY_APERTURE_LOW_ADDR_HI32": 0x713,
  "MMVM_L2_CONTEXT1_IDENTITY_APERTURE_HIGH_ADDR_LO32": 0x714, "MMVM_L2_CONTEXT1_IDENTITY_APERTURE_HIGH_ADDR_HI32": 0x715,
  "MMVM_L2_CONTEXT_IDENTITY_PHYSICAL_OFFSET_LO32": 0x716, "MMVM_L2_CONTEXT_IDENTITY_PHYSICAL_OFFSET_HI32": 0x717,
  "MMVM_L2_CNTL4": 0x718, "MMVM_L2_BANK_SELECT_RESERVED_CID2": 0x71B, "MMVM_L2_CNTL5": 0x71E, "MMVM_CONTEXT0_CNTL": 0x740,
  "MMVM_L2_PROTECTION_FAULT_CNTL": 0x708, "MMVM_INVALIDATE_ENG0_SEM": 0x751, "MMVM_INVALIDATE_ENG0_REQ": 0x763,
  "MMVM_INVALIDATE_ENG0_ACK": 0x775,
  "MMVM_INVALIDATE_ENG0_ADDR_RANGE_LO32": 0x787, "MMVM_INVALIDATE_ENG0_ADDR_RANGE_HI32": 0x788,
  "MMVM_CONTEXT0_PAGE_TABLE_BASE_ADDR_LO32": 0x7AB, "MMVM_CONTEXT0_PAGE_TABLE_BASE_ADDR_HI32": 0x7AC,
  "MMVM_CONTEXT0_PAGE_TABLE_START_ADDR_LO32": 0x7CB, "MMVM_CONTEXT0_PAGE_TABLE_START_ADDR_HI32": 0x7CC,
  "MMVM_CONTEXT0_PAGE_TABLE_END_ADDR_LO32": 0x7EB, "MMVM_CONTEXT0_PAGE_TABLE_END_ADDR_HI32": 0x7EC,
  "MMMC_VM_SYSTEM_APERTURE_DEFAULT_ADDR_LSB": 0x8D8, "MMMC_VM_SYSTEM_APERTURE_DEFAULT_ADDR_MSB": 0x8D9,
  "MMMC_VM_FB_LOCATION_BASE": 0x8EC, "MMMC_VM_AGP_TOP": 0x8EE, "MMMC_VM_AGP_BOT": 0x8EF, "MMMC_VM_AGP_BASE": 0x8F0,
  "MMMC_VM_SYSTEM_APERTURE_LOW_ADDR": 0x8F1, "MMMC_VM_SYSTEM_APERTURE_HIGH_ADDR": 0x8F2, "MMMC_VM_MX_L1_TLB_CNTL": 0x8F3,
}
#: field masks (mmhub_3_0_0_sh_mask.h); a field's value is shifted to its mask's lowest set bit
FIELDS = {
  "MMMC_VM_MX_L1_TLB_CNTL": {"ENABLE_L1_TLB": 0x1, "SYSTEM_ACCESS_MODE": 0x18, "SYSTEM_APERTURE_UNMAPPED_ACCESS": 0x20,
                             "ENABLE_ADVANCED_DRIVER_MODEL": 0x40, "ECO_BITS": 0x780, "MTYPE": 0x3800},
  "MMVM_L2_CNTL": {"ENABLE_L2_CACHE": 0x1, "ENABLE_L2_FRAGMENT_PROCESSING": 0x2, "L2_PDE0_CACHE_TAG_GENERATION_MODE": 0x100,
                   "ENABLE_DEFAULT_PAGE_OUT_TO_SYSTEM_MEMORY": 0x800, "PDE_FAULT_CLASSIFICATION": 0x40000,
                   "CONTEXT1_IDENTITY_ACCESS_MODE": 0x180000, "IDENTITY_MODE_FRAGMENT_SIZE": 0x3E00000},
  "MMVM_L2_CNTL2": {"INVALIDATE_ALL_L1_TLBS": 0x1, "INVALIDATE_L2_CACHE": 0x2},
  "MMVM_L2_CNTL3": {"BANK_SELECT": 0x3F, "L2_CACHE_BIGK_FRAGMENT_SIZE": 0xF8000},
  "MMVM_L2_CNTL4": {"VMC_TAP_PDE_REQUEST_PHYSICAL": 0x40, "VMC_TAP_PTE_REQUEST_PHYSICAL": 0x80},
  "MMVM_L2_CNTL5": {"L2_CACHE_SMALLK_FRAGMENT_SIZE": 0x1F},
  "MMVM_CONTEXT0_CNTL": {"ENABLE_CONTEXT": 0x1, "PAGE_TABLE_DEPTH": 0x6, "RETRY_PERMISSION_OR_INVALID_PAGE_FAULT": 0x80},
  "MMVM_L2_PROTECTION_FAULT_CNTL2": {"ACTIVE_PAGE_MIGRATION_PTE_READ_RETRY": 0x40000},
  "MMVM_L2_PROTECTION_FAULT_CNTL": {"RANGE": 0x4, "PDE0": 0x8, "PDE1": 0x10, "PDE2": 0x20, "TRANSLATE_FURTHER": 0x40, "NACK": 0x80,
                                    "DUMMY_PAGE": 0x100, "VALID": 0x200, "READ": 0x400, "WRITE": 0x800, "EXECUTE": 0x1000},
  "MMVM_INVALIDATE_ENG0_REQ": {"PER_VMID_INVALIDATE_REQ": 0xFFFF, "FLUSH_TYPE": 0x70000, "INVALIDATE_L2_PTES": 0x80000,
                               "INVALIDATE_L2_PDE0": 0x100000, "INVALIDATE_L2_PDE1": 0x200000, "INVALIDATE_L2_PDE2": 0x400000,
                               "INVALIDATE_L1_PTES": 0x800000, "CLEAR_PROTECTION_FAULT_STATUS_ADDR": 0x1000000},
}
#: the defaults mmhub_v3_0.c starts CNTL3/4/5 from (regMMVM_L2_CNTLn_DEFAULT)
DEFAULTS = {"MMVM_L2_CNTL3": 0x80100007, "MMVM_L2_CNTL4": 0x000000C1, "MMVM_L2_CNTL5": 0x00003FE0}
MTYPE_UC = 3                          # soc21_enum.h
INVALIDATE_ENGINES, ENG_DISTANCE = 18, 2   # address-range registers: 2 dwords per engine
GART_ENGINE = 17                           # gmc_v11_0_flush_gpu_tlb: "Use register 17 for GART"; SEM/REQ/ACK 1 dword apart
PRIVATE_INVALIDATION = 1 << 25             # MMVM_L2_BANK_SELECT_RESERVED_CID2 bit 25 (RSERVED_CACHE_PRIVATE_INVALIDATION)
GART_SIZE = 512 << 20                 # gmc_v11_0_sw_init: amdgpu_gart_size -1 -> 512 MiB
MAX_MC = (1 << 47) - 1                # min(mc_mask 48-bit, AMDGPU_GMC_HOLE_START - 1)
FOUR_GB = 1 << 32
AGP_OFF = (0xFFFFFFFFFFFF, 0)         # amdgpu_gmc_set_agp_default: agp_start, agp_end
PTE_VALID = 1 << 0
SUPPORTED = {(3, 0, 0): MMHUB_3_0_0}


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


def field_set(reg: str, value: int, fields: tuple[tuple[str, int], ...]) -> int:
  for name, v in fields:
    mask = FIELDS[reg][name]
    shift = (mask & -mask).bit_length() - 1
    if v << shift & ~mask: raise ValueError(f"{reg}.{name} = {v} does not fit its mask 0x{mask:x}")
    value = (value & ~mask) | (v << shift)
  return value & 0xFFFFFFFF


def gart_enable_ops(lay: Layout) -> list[Write | Update]:
  """mmhub_v3_0_gart_enable's writes, in its order, without setup_vmid_config (VM contexts 1-15)."""
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
    Update("MMVM_L2_CNTL3", (("BANK_SELECT", 9), ("L2_CACHE_BIGK_FRAGMENT_SIZE", 6)), DEFAULTS["MMVM_L2_CNTL3"]),
    Update("MMVM_L2_CNTL4", (("VMC_TAP_PDE_REQUEST_PHYSICAL", 0), ("VMC_TAP_PTE_REQUEST_PHYSICAL", 0)), DEFAULTS["MMVM_L2_CNTL4"]),
    Update("MMVM_L2_CNTL5", (("L2_CACHE_SMALLK_FRAGMENT_SIZE", 0),), DEFAULTS["MMVM_L2_CNTL5"]),
    # enable_system_domain
    Update("MMVM_CONTEXT0_CNTL", (("ENABLE_CONTEXT", 1), ("PAGE_TABLE_DEPTH", 0), ("RETRY_PERMISSION_OR_INVALID_PAGE_FAULT", 0))),
    # disable_identity_aperture
    Write("MMVM_L2_CONTEXT1_IDENTITY_APERTURE_LOW_ADDR_LO32", 0xFFFFFFFF), Write("MMVM_L2_CONTEXT1_IDENTITY_APERTURE_LOW_ADDR_HI32", 0xF),
    Write("MMVM_L2_CONTEXT1_IDENTITY_APERTURE_HIGH_ADDR_LO32", 0), Write("MMVM_L2_CONTEXT1_IDENTITY_APERTURE_HIGH_ADDR_HI32", 0),
    Write("MMVM_L2_CONTEXT_IDENTITY_PHYSICAL_OFFSET_LO32", 0), Write("MMVM_L2_CONTEXT_IDENTITY_PHYSICAL_OFFSET_HI32", 0),
  ]
  # program_invalidation: every engine may invalidate the whole range
  for i in range(INVALIDATE_ENGINES):
    ops += [Write(f"MMVM_INVALIDATE_ENG{i}_ADDR_RANGE_LO32", 0xFFFFFFFF), Write(f"MMVM_INVALIDATE_ENG{i}_ADDR_RANGE_HI32", 0x1F)]
  return ops


def offset(table: dict[str, int], reg: str) -> int:
  """A register's dword offset in `table`; the invalidation engines are ENG0's plus ENG_DISTANCE per engine."""
  if reg in table: return table[reg]
  if reg.startswith("MMVM_INVALIDATE_ENG"):
    eng, rest = reg[len("MMVM_INVALIDATE_ENG"):].split("_", 1)
    return table[f"MMVM_INVALIDATE_ENG0_{rest}"] + int(eng) * ENG_DISTANCE
  raise KeyError(reg)


def apply(regs: GPURegisters, hub_base: int, ops: list[Write | Update], table: dict[str, int] = MMHUB_3_0_0) -> int:
  """Perform `ops` on the hub whose segment-0 base is `hub_base`; returns the number of register writes."""
  for op in ops:
    reg = hub_base + offset(table, op.reg)
    if isinstance(op, Write): value = op.value
    else: value = field_set(op.reg, regs.rreg(reg) if op.base is None else op.base, op.fields)
    regs.wreg(reg, value & 0xFFFFFFFF)
  return len(ops)


#: where plugrt puts the GART table and the default page: in the gap between the 9 MiB pre-OS framebuffer the kernel
#: keeps reserved and plugrt's PSP buffers at 16 MiB (psp.DEFAULT_BASE); a choice, not the kernel's (TTM places them)
TABLE_AT, SCRATCH_AT = 12 << 20, 13 << 20


class GMCUnsupported(ValueError):
  """A memory hub version whose registers plugrt does not know."""


class GMCTimeout(PlugrtError, RuntimeError):
  """The memory hub did not answer a TLB flush (its semaphore or acknowledge) within the bound."""


def invalidate_req(vmid: int, flush_type: int = 0) -> int:
  """mmhub_v3_0_get_invalidate_req: legacy invalidation of one VMID's L2 PTEs/PDEs and L1 PTEs."""
  return field_set("MMVM_INVALIDATE_ENG0_REQ", 0, (("PER_VMID_INVALIDATE_REQ", 1 << vmid), ("FLUSH_TYPE", flush_type),
                   ("INVALIDATE_L2_PTES", 1), ("INVALIDATE_L2_PDE0", 1), ("INVALIDATE_L2_PDE1", 1), ("INVALIDATE_L2_PDE2", 1),
                   ("INVALIDATE_L1_PTES", 1), ("CLEAR_PROTECTION_FAULT_STATUS_ADDR", 0)))


def flush_tlb(regs: GPURegisters, hub_base: int, table: dict[str, int], vmid: int = 0, timeout: float = 2.0,
              sleep: Callable[[float], None] = time.sleep, flush: Callable[[], None] | None = None) -> int:
  """gmc_v11_0_flush_gpu_tlb on the MMHUB before KIQ/MES exist: HDP flush, acquire engine 17's semaphore, request, wait
  for the VMID's acknowledge bit, release, then the private invalidation through BANK_SELECT_RESERVED_CID2. The kernel
  only logs a semaphore or acknowledge timeout; plugrt raises `GMCTimeout`. Returns the number of register writes."""
  sem, req, ack = (hub_base + table[f"MMVM_INVALIDATE_ENG0_{r}"] + GART_ENGINE for r in ("SEM", "REQ", "ACK"))
  if flush is not None: flush()

  def wait(what: str, reg: int, bit: int) -> None:
    end = time.monotonic() + timeout
    while not (v := regs.rreg(reg)) & bit:
      if time.monotonic() >= end:
        raise GMCTimeout(f"GMC: MMHUB TLB flush: {what} (dword 0x{reg:x} & 0x{bit:x}): still 0x{v:08x} after {timeout:g} s",
                         "the memory hub is not answering: reset the GPU")
      sleep(0.0005)

  wait(f"invalidation engine {GART_ENGINE}'s semaphore not acquired", sem, 1)
  regs.wreg(req, invalidate_req(vmid))
  wait(f"no acknowledge for VMID {vmid}", ack, 1 << vmid)
  regs.wreg(sem, 0)
  cid2 = hub_base + table["MMVM_L2_BANK_SELECT_RESERVED_CID2"]
  regs.wreg(cid2, regs.rreg(cid2) | PRIVATE_INVALIDATION)
  regs.rreg(cid2)                      # read back: the invalidation is done
  return 3                             # register writes: request, semaphore release, CID2


def enable(regs: GPURegisters, version: tuple[int, int, int], hub_base: int, fb_start: int, vram_size: int, phys_base: int,
           flush: Callable[[], None] | None = None, timeout: float = 2.0) -> str:
  """gmc_v11_0_gart_enable on the MMHUB: zero the GART table and default page in VRAM, program the hub (gart_enable),
  flush the HDP (`flush`), enable the protection-fault defaults, flush the GART's TLB; returns the step's text."""
  if (table := SUPPORTED.get(version)) is None:
    raise GMCUnsupported(f"GART set-up for MMHUB {'.'.join(map(str, version))} is not implemented (plugrt programs MMHUB 3.0.0)")
  lay = layout(fb_start, vram_size, phys_base, TABLE_AT, SCRATCH_AT)
  entries = (lay.gart_end - lay.gart_start + 1) >> 12
  regs.write_vram(TABLE_AT, bytes(entries * 8))           # every PTE invalid
  regs.write_vram(SCRATCH_AT, bytes(0x1000))
  n = apply(regs, hub_base, gart_enable_ops(lay), table)
  if flush is not None: flush()
  # set_fault_enable_default(true) (amdgpu_vm_fault_stop's default), then the GART's TLB flush on engine 17
  n += apply(regs, hub_base, [Update("MMVM_L2_PROTECTION_FAULT_CNTL", tuple((f, 1) for f in FIELDS["MMVM_L2_PROTECTION_FAULT_CNTL"]))], table)
  n += flush_tlb(regs, hub_base, table, 0, timeout, flush=flush)
  return (f"MMHUB {'.'.join(map(str, version))} GART enabled ({n} register writes, as gmc_v11_0_gart_enable without VM contexts "
          f"1-15; TLB flushed on engine {GART_ENGINE}): {(lay.gart_end - lay.gart_start + 1) >> 20} MiB at MC "
          f"0x{lay.gart_start:x}-0x{lay.gart_end:x}, flat table of "
          f"{entries} invalid entries at VRAM 0x{TABLE_AT:x}; system aperture MC 0x{lay.fb_start:x}-0x{lay.fb_end:x} (default page "
          f"VRAM 0x{SCRATCH_AT:x}); no AGP aperture; protection-fault default page not set (no DMA mapping through sysfs)")
