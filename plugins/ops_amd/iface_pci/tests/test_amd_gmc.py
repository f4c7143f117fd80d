"""The MMHUB's GART and system aperture (plugrt_amd_pci.gmc) on the fake register file: the values the kernel's
mmhub_v3_0_gart_enable writes for a 64 MiB fake GPU, worked out by hand here from the kernel's field values and the
mmhub_3_0_0 masks (not from plugrt's tables)."""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests"))
import fake_amdgpu

from plugrt_amd.device import AMDNotImplemented
from plugrt_amd_pci import bringup, gmc
from plugrt_amd_pci.regs import GPURegisters

HUB = fake_amdgpu.MMHUB_BASES[0]


def run(tmp_path, mmhub=(3, 0, 0), preset: dict[int, int] | None = None):
  regs, vram = fake_amdgpu.fake_gpu(blob=fake_amdgpu.table(mmhub=mmhub), mib=64)
  sos = fake_amdgpu.sos_file()
  (tmp_path / "psp_13_0_0_sos.bin").write_bytes(sos)
  mp0 = fake_amdgpu.FakeMP0(regs, vram, sos, mmhub=mmhub)
  for off, v in (preset or {}).items(): regs.regs[HUB + off] = v
  vram.write(gmc.TABLE_AT, b"\xff" * 64)                   # stale bytes the table must not keep
  b = bringup.bring_up(GPURegisters(regs, vram), "AMD:0", str(tmp_path))
  return b, regs, vram, mp0


def reg(regs, off: int) -> int: return regs.regs.get(HUB + off, 0)


def test_gart_enable_writes_what_the_kernel_writes(tmp_path) -> None:
  b, regs, vram, mp0 = run(tmp_path, preset={0x700: 0xF0000000, 0x740: 0x100, 0x709: 0x3})
  assert b.gart and mp0.violations == [] and b.psp_booted
  # GART: 512 MiB, high below the 48-bit hole on a 4 GiB boundary: 0x7fff00000000-0x7fff1fffffff
  assert [reg(regs, o) for o in (0x7CB, 0x7CC, 0x7EB, 0x7EC)] == [0xFFF00000, 0x7, 0xFFF1FFFF, 0x7]
  assert (reg(regs, 0x7AB), reg(regs, 0x7AC)) == (0xC00000 | 1, 0)         # the table's physical address, PTE_VALID
  assert vram.read(gmc.TABLE_AT, 1 << 20) == bytes(1 << 20)                 # 131072 invalid entries
  # the FB at MC 0x80_0000_0000, 64 MiB: system aperture in 256 KiB units; no AGP (bottom above top)
  assert (reg(regs, 0x8F1), reg(regs, 0x8F2)) == (0x200000, 0x2000FF)
  assert (reg(regs, 0x8F0), reg(regs, 0x8EF), reg(regs, 0x8EE)) == (0, 0xFFFFFF, 0)
  assert (reg(regs, 0x8D8), reg(regs, 0x8D9)) == (0xD00, 0)                 # default page at VRAM 13 MiB
  assert HUB + 0x70F not in regs.regs and HUB + 0x710 not in regs.regs      # no system dummy page through sysfs
  assert reg(regs, 0x709) == 0x3 | 1 << 18                                  # ACTIVE_PAGE_MIGRATION_PTE_READ_RETRY, others kept
  assert reg(regs, 0x8F3) == 0x1 | 3 << 3 | 1 << 6 | 3 << 11                # L1 TLB on, system access 3, ADM, MTYPE_UC
  assert reg(regs, 0x700) == 0xF0000000 | 0x1 | 1 << 11 | 1 << 19          # L2 on, page-out to system, identity mode 1
  assert reg(regs, 0x701) == 0x3                                            # invalidate L1 TLBs and the L2
  assert (reg(regs, 0x702), reg(regs, 0x718), reg(regs, 0x71E)) == (0x80130009, 0x1, 0x3FE0)   # from the kernel's defaults
  assert reg(regs, 0x740) == 0x100 | 0x1                                    # context 0 on, depth 0, no retry
  assert [reg(regs, o) for o in range(0x712, 0x718)] == [0xFFFFFFFF, 0xF, 0, 0, 0, 0]
  assert [reg(regs, 0x787 + 2 * i) for i in range(18)] == [0xFFFFFFFF] * 18 and [reg(regs, 0x788 + 2 * i) for i in range(18)] == [0x1F] * 18
  assert len([r for op, r, _ in regs.log if op == "w" and HUB + 0x787 <= r < HUB + 0x7AB]) == 36    # exactly 18 engines
  # setup_vmid_config: contexts 1-15 on, depth 3, block size 0, every fault's default action, no retry, 48-bit range
  assert [reg(regs, 0x740 + c) for c in range(1, 16)] == [0x555407] * 15
  assert [reg(regs, 0x7CB + 2 * c) for c in range(1, 16)] == [0] * 15 and [reg(regs, 0x7CC + 2 * c) for c in range(1, 16)] == [0] * 15
  assert [reg(regs, 0x7EB + 2 * c) for c in range(1, 16)] == [0xFFFFFFFF] * 15 and [reg(regs, 0x7EC + 2 * c) for c in range(1, 16)] == [0xF] * 15
  # then, as gmc_v11_0_gart_enable: an HDP flush, the protection-fault defaults, the TLB flush of VMID 0 on engine 17
  writes = [r for op, r, _ in regs.log if op == "w"]
  at = writes.index(HUB + 0x788 + 34) + 1                                    # after the last gart_enable write
  assert writes[at:at + 2] == [0x7F000 >> 2, HUB + 0x708] and reg(regs, 0x708) == 0x1FFC
  assert writes[at + 2:at + 6] == [0x7F000 >> 2, HUB + 0x774, HUB + 0x762, HUB + 0x71B]     # flush, request, release, CID2
  inv = regs.invalidation
  assert inv.requests == [0x00F80001] and inv.violations == [] and not inv.held    # VMID 0: L2 PTEs/PDE0-2, L1 PTEs
  assert reg(regs, 0x71B) == 1 << 25                                         # the private invalidation
  msg = b.summary()
  assert "MMHUB 3.0.0 GART enabled (142 register writes" in msg and "512 MiB at MC 0x7fff00000000-0x7fff1fffffff" in msg
  assert msg.index("GART enabled") < msg.index("PSP bootloader loaded")     # GMC before the PSP, as the kernel
  with pytest.raises(AMDNotImplemented, match="the GFXHUB's GART and system aperture"): b.stop()   # no GC firmware here


def test_other_hubs_are_recorded_not_programmed(tmp_path) -> None:
  b, regs, _, mp0 = run(tmp_path, mmhub=(3, 0, 2))
  assert not b.gart and b.psp_booted and mp0.violations == []
  assert "GART not set up: GART set-up for MMHUB 3.0.2 is not implemented" in b.summary()
  assert HUB + 0x8F3 not in regs.regs
  with pytest.raises(AMDNotImplemented, match=r"GMC/GART and VM set-up \(system aperture"): b.stop()


def test_ops_and_fields() -> None:
  lay = gmc.layout(0x8000000000, 64 << 20, 0x100000000, gmc.TABLE_AT, gmc.SCRATCH_AT, dummy_page=0x12345678000)
  ops = gmc.gart_enable_ops(lay, gmc.MMHUB_V3_0)
  writes = {o.reg: o.value for o in ops if isinstance(o, gmc.Write)}
  assert writes["MMVM_L2_PROTECTION_FAULT_DEFAULT_ADDR_LO32"] == 0x12345678 and writes["MMVM_L2_PROTECTION_FAULT_DEFAULT_ADDR_HI32"] == 0
  assert writes["MMVM_CONTEXT0_PAGE_TABLE_BASE_ADDR_HI32"] == 1 and writes["MMMC_VM_SYSTEM_APERTURE_DEFAULT_ADDR_LSB"] == 0x100D00
  assert gmc.offset(gmc.MMHUB_V3_0, "MMVM_INVALIDATE_ENG17_ADDR_RANGE_HI32") == 0x788 + 34
  assert gmc.offset(gmc.GFXHUB_V3_0, "MMVM_INVALIDATE_ENG17_ADDR_RANGE_HI32") == 0x16D0 + 34
  with pytest.raises(ValueError, match="does not fit"): gmc.field_set("MMVM_CONTEXT0_CNTL", 0, (("PAGE_TABLE_DEPTH", 4),))
  with pytest.raises(gmc.GMCUnsupported, match=r"MMHUB 3\.0\.1 is not implemented"): gmc.enable(None, (3, 0, 1), 0, 0, 0, 0)


def test_gmc12_hubs_use_their_own_field_layout() -> None:
  """mmhub_4_1_0_sh_mask.h / gc_12_0_0_sh_mask.h moved CONTEXTn_CNTL's fields up a bit and narrowed the L1 TLB's MTYPE:
  the same operations must give other register values than on GMC 11 (worked out by hand from the masks)."""
  mm12, gc12 = gmc.MMHUBS[(4, 1, 0)], gmc.GFXHUBS[(12, 0, 1)]
  cntl = {11: 0, 12: 0}
  for gen, hub in ((11, gmc.MMHUB_V3_0), (12, mm12)):
    op = next(o for o in gmc.vmid_config_ops(hub) if o.reg == "MMVM_CONTEXT8_CNTL")
    cntl[gen] = gmc.field_set(op.field_reg, 0, op.fields, hub.masks)
  # ENABLE | depth 3 << 1 | block size 0 | no retry | the seven *_ENABLE_DEFAULT bits
  assert cntl == {11: 0x1 | 0x6 | 0x400 | 0x1000 | 0x4000 | 0x10000 | 0x40000 | 0x100000 | 0x400000,
                  12: 0x1 | 0x6 | 0x800 | 0x2000 | 0x8000 | 0x20000 | 0x80000 | 0x200000 | 0x800000}
  tlb = {g: gmc.field_set("MMMC_VM_MX_L1_TLB_CNTL", 0, (("ENABLE_L1_TLB", 1), ("SYSTEM_ACCESS_MODE", 3), ("ENABLE_ADVANCED_DRIVER_MODEL", 1),
                                                        ("MTYPE", gmc.MTYPE_UC)), h.masks) for g, h in ((11, gmc.MMHUB_V3_0), (12, gc12))}
  assert tlb == {11: 0x59 | 3 << 11, 12: 0x59 | 3 << 11} and gc12.masks["MMMC_VM_MX_L1_TLB_CNTL"]["MTYPE"] == 0x1800
  with pytest.raises(ValueError, match="does not fit"): gmc.field_set("MMMC_VM_MX_L1_TLB_CNTL", 0, (("MTYPE", 4),), gc12.masks)
  assert gmc.invalidate_req(8, masks=mm12.masks) == 0x00F80100            # the request's fields did not move
  assert gmc.offset(mm12, "MMVM_CONTEXT8_PAGE_TABLE_BASE_ADDR_LO32") == 0x5CF + 16 and gmc.offset(gc12, "MMVM_CONTEXT8_CNTL") == 0x1624 + 8
  assert gmc.offset(gc12, "MMVM_INVALIDATE_ENG17_ADDR_RANGE_HI32") == 0x166C + 34


@pytest.mark.parametrize("hang, match", [("sem", "invalidation engine 17's semaphore not acquired"), ("ack", "no acknowledge for VMID 0")])
def test_a_hub_that_does_not_answer_the_tlb_flush_is_a_bounded_typed_error(tmp_path, hang: str, match: str) -> None:
  regs, vram = fake_amdgpu.fake_gpu(mib=64)
  (tmp_path / "psp_13_0_0_sos.bin").write_bytes(fake_amdgpu.sos_file())
  fake_amdgpu.FakeMP0(regs, vram, fake_amdgpu.sos_file())
  regs.invalidation.hang.add(hang)
  with pytest.raises(gmc.GMCTimeout, match=match) as e: bringup.bring_up(GPURegisters(regs, vram), "AMD:0", str(tmp_path), psp_timeout=0.05)
  assert "after 0.05 s" in str(e.value) and "reset the GPU" in e.value.hint
