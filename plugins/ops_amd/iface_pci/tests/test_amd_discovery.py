"""IP discovery, register access, firmware names and the bring-up record, on synthetic tables and a fake register file."""
from __future__ import annotations

import os
import struct
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests"))
import fake_amdgpu

from plugrt_amd.device import AMDNotImplemented
from plugrt_amd_pci import bringup, discovery, firmware
from plugrt_amd_pci.discovery import DiscoveryError, IPBlock
from plugrt_amd_pci.regs import MM_INDEX, MM_INDEX_HI, GPURegisters, RegisterError

HW = discovery.HW_ID_BY_NAME


def test_build_then_parse_round_trips() -> None:
  blob = fake_amdgpu.table()
  assert len(blob) == discovery.DISCOVERY_TMR_SIZE
  t = discovery.parse(blob)
  assert t.summary() == "GC 11.0.0, MP0 13.0.0, MP1 13.0.0, SDMA0 6.0.0, NBIF 4.3.0, MMHUB 3.0.0"
  assert t.find("GC").bases == (0x1260, 0xA000, 0x1C000, 0x2402C00) and t.find("NBIF").bases == fake_amdgpu.NBIO_BASES
  assert t.gc == fake_amdgpu.GC_INFO and t.harvest == ((HW["VCN"], 1),) and t.tables == ("IP_DISCOVERY", "GC", "HARVEST_INFO")
  assert t.version_of("SDMA1") == (6, 0, 0) and t.find("GC", instance=1) is None and t.version_of("XGMI") is None
  # the header fields the kernel reads, at the offsets discovery.h gives
  sig, vmaj, _vmin, _sum, size = struct.unpack_from("<IHHHH", blob)
  off = struct.unpack_from("<H", blob, 12)[0]
  assert sig == 0x28211407 and vmaj == 2 and size < len(blob) and blob[off:off + 4] == b"IPDS"


def test_wide_bases_several_dies_and_skipped_entries() -> None:
  blocks = [IPBlock(HW["GC"], 0, 9, 4, 3, 0, (0x1_0000_2000, 0x3000), die=0), IPBlock(HW["GC"], 1, 9, 4, 3, 0, (0x4000,), die=1),
            IPBlock(HW["SDMA0"], 60, 4, 4, 2, 0, (0x10,), die=1),       # instance >= HWIP_MAX_INSTANCE: skipped like the driver
            IPBlock(HW["VCN"], 0, 4, 0, 3, 0x10, (0x20,), die=1)]       # v3 variant 1: harvested
  t = discovery.parse(discovery.build(blocks, ip_version=4, wide=True))
  assert [(b.name, b.instance, b.die) for b in t.blocks] == [("GC", 0, 0), ("GC", 1, 1), ("VCN", 0, 1)]
  assert t.find("GC").bases == (0x2000, 0x3000)                         # low 32 bits kept
  assert t.find("VCN", die=1).harvested and not t.find("GC").harvested and t.gc is None


def _fix_binary_checksum(blob: bytearray) -> bytearray:
  size = struct.unpack_from("<H", blob, 10)[0]
  struct.pack_into("<H", blob, 8, discovery.checksum(blob[10:size]))
  return blob


@pytest.mark.parametrize("corrupt, match", [
  (lambda b: b.__setitem__(0, 0), "binary signature is 0x28211400"),
  (lambda b: b.__setitem__(100, b[100] ^ 1), "binary checksum"),
  (lambda b: _fix_binary_checksum(b.__setitem__(100, b[100] ^ 1) or b), "IP_DISCOVERY table checksum"),
  (lambda b: _fix_binary_checksum(b.__setitem__(60, 0x41) or b), "table signature"),
  (lambda b: _fix_binary_checksum(struct.pack_into("<H", b, 10, 4) or b), "binary_size 4"),
  (lambda b: _fix_binary_checksum(struct.pack_into("<H", b, 60 + 14 + 2, 0x7FF0) or b), "outside|checksum"),
])
def test_corrupt_tables_are_typed_errors(corrupt, match: str) -> None:
  blob = bytearray(fake_amdgpu.table())
  corrupt(blob)
  with pytest.raises(DiscoveryError, match=match): discovery.parse(blob)


def test_gc_and_harvest_tables_are_checked() -> None:
  blob = bytearray(fake_amdgpu.table())
  goff = struct.unpack_from("<H", blob, 12 + 8 * discovery.GC)[0]
  bad = bytearray(blob); bad[goff + 20] ^= 0xFF
  with pytest.raises(DiscoveryError, match="GC table checksum"): discovery.parse(_fix_binary_checksum(bad))
  bad = bytearray(blob); bad[goff] = 0
  with pytest.raises(DiscoveryError, match="GC table id"): discovery.parse(_fix_binary_checksum(bad))
  hoff = struct.unpack_from("<H", blob, 12 + 8 * discovery.HARVEST_INFO)[0]
  bad = bytearray(blob); bad[hoff + 8] ^= 1
  with pytest.raises(DiscoveryError, match="harvest table checksum"): discovery.parse(_fix_binary_checksum(bad))
  with pytest.raises(DiscoveryError, match="outside"): discovery.parse(blob[:40])


def test_firmware_names_and_presence(tmp_path) -> None:
  t = discovery.parse(fake_amdgpu.table())
  names = [n.name for n in firmware.needs(t)]
  assert names == ["psp_13_0_0_sos.bin", "smu_13_0_0.bin", "sdma_6_0_0.bin", "gc_11_0_0_pfp.bin", "gc_11_0_0_me.bin",
                   "gc_11_0_0_mec.bin", "gc_11_0_0_rlc.bin", "gc_11_0_0_imu.bin"]
  (tmp_path / "psp_13_0_0_sos.bin.zst").write_bytes(b"x")
  (tmp_path / "smu_13_0_0.bin").write_bytes(b"x")
  rows, line = firmware.report(t, str(tmp_path))
  assert dict((n.name, p) for n, p in rows)["psp_13_0_0_sos.bin"].endswith(".zst")
  assert line.startswith(f"2 of 8 firmware files in {tmp_path}; missing sdma_6_0_0.bin, gc_11_0_0_pfp.bin")
  # GFX10 (navi21) names its firmware after the chip: reported as such, no invented names
  old = discovery.parse(discovery.build([IPBlock(HW["GC"], 0, 10, 3, 0, 0, (0,)), IPBlock(HW["MP0"], 0, 11, 0, 7, 0, (0,))]))
  assert [(n.block, n.legacy, n.name) for n in firmware.needs(old)] == [("MP0", True, ""), ("GC", True, "")]
  assert "chip-named firmware not mapped for MP0 11.0.7, GC 10.3.0" in firmware.report(old, str(tmp_path))[1]
  mi300 = discovery.parse(discovery.build([IPBlock(HW["GC"], 0, 9, 4, 3, 0, (0,)), IPBlock(HW["SDMA0"], 0, 4, 4, 2, 0, (0,))]))
  assert [n.name for n in firmware.needs(mi300)] == ["sdma_4_4_2.bin", "gc_9_4_3_mec.bin", "gc_9_4_3_rlc.bin"]


def test_registers_vram_and_the_nbio_pair() -> None:
  regs_file, vram = fake_amdgpu.fake_gpu()
  r = GPURegisters(regs_file)                   # no VRAM BAR: VRAM through MM_INDEX/MM_DATA
  assert r.vram_size() == 16 << 20
  assert r.read_vram(vram.size - discovery.DISCOVERY_TMR_OFFSET, 8)[:4] == struct.pack("<I", discovery.BINARY_SIGNATURE)
  assert ("w", MM_INDEX, ((vram.size - discovery.DISCOVERY_TMR_OFFSET) | 1 << 31)) in regs_file.log
  assert ("w", MM_INDEX_HI, 0) in regs_file.log
  with pytest.raises(RegisterError, match="not known before IP discovery"): r.rreg(fake_amdgpu.REG_BAR_SIZE // 4 + 5)
  r.use_nbio((4, 3, 0), fake_amdgpu.NBIO_BASES)
  assert r.smn_pair == (0x14, 0x15)
  r.wreg(0x40000, 0x1234)                       # beyond the BAR: index/data pair
  assert regs_file.smn[0x40000 * 4] == 0x1234 and r.rreg(0x40000) == 0x1234 and r.smn_read(0x200000) == 0
  with pytest.raises(RegisterError, match=r"NBIO 9\.9\.9"): r.use_nbio((9, 9, 9), fake_amdgpu.NBIO_BASES)
  with pytest.raises(RegisterError, match="not dword aligned"): r.read_vram(2, 4)
  dead, _ = fake_amdgpu.fake_gpu(memsize=0xFFFFFFFF)
  with pytest.raises(RegisterError, match="does not answer"): GPURegisters(dead).vram_size()


def test_bring_up_records_and_stops(tmp_path) -> None:
  regs_file, _ = fake_amdgpu.fake_gpu()
  b = bringup.bring_up(GPURegisters(regs_file), "AMD:0 through TEST", str(tmp_path))
  assert b.source == "VRAM" and b.table.find("GC").version == (11, 0, 0)
  with pytest.raises(AMDNotImplemented) as e: b.stop()
  msg = str(e.value)
  for part in ("AMD:0 through TEST: VRAM 16 MiB", "IP discovery read from VRAM: GC 11.0.0, MP0 13.0.0", "(6 SE, wave32)",
               "NBIO 4.3.0 index/data pair at dwords 0x14/0x15", "0 of 8 firmware files", "PSP firmware loading", "not implemented"):
    assert part in msg, (part, msg)
  assert "AMD_IFACE=KFD" in e.value.hint
  # a wrong signature in VRAM: the firmware file the kernel falls back to, else a typed error naming both
  blank, _ = fake_amdgpu.fake_gpu(blob=bytes(64))
  with pytest.raises(DiscoveryError, match=r"no binary signature at VRAM offset 0xff0000.*ip_discovery\.bin"):
    bringup.bring_up(GPURegisters(blank), "AMD:0", str(tmp_path))
  (tmp_path / "ip_discovery.bin").write_bytes(fake_amdgpu.table(gc=(11, 0, 3)))
  b = bringup.bring_up(GPURegisters(blank), "AMD:0", str(tmp_path))
  assert b.source.endswith("ip_discovery.bin") and "GC 11.0.3" in b.summary()
