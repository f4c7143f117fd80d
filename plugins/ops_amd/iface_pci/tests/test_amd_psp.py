"""The PSP stage of the driverless bring-up: PSP firmware files, the MP0 bootloader, the KM ring and GFX commands, against
the fake MP0 in plugins/ops_amd/tests/fake_amdgpu.py (built from the kernel's psp_v13_0.c/amdgpu_psp.c behaviour)."""
from __future__ import annotations

import lzma
import os
import struct
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests"))
import fake_amdgpu

from plugrt.errors import Reason
from plugrt_amd.device import AMDNotImplemented
from plugrt_amd_pci import bringup, discovery, hdp, psp, psp_firmware
from plugrt_amd_pci.psp_firmware import FirmwareToolMissing, PSPFirmwareError
from plugrt_amd_pci.regs import GPURegisters

SOS = "psp_13_0_0_sos.bin"


# ---- firmware files ----------------------------------------------------------------------------------------------------

def test_sos_file_parses_with_every_binary() -> None:
  blob = fake_amdgpu.sos_file()
  fw = psp_firmware.parse(blob)
  assert fw.header.header_version == (2, 0) and fw.header.size_bytes == len(blob) and fw.crc_matches is True
  assert list(fw.binaries) == ["sos", "sys_drv", "kdb", "toc", "spl", "soc_drv", "intf_drv", "dbg_drv", "ras_drv"]
  kdb = fw.get("kdb")
  assert kdb.fw_type == 3 and kdb.version == 0x102 and kdb.data == bytes((2 * 37 + j) & 0xFF for j in range(0x380))
  assert blob[kdb.offset:kdb.offset + kdb.size] == kdb.data and kdb.offset >= fw.header.ucode_array_offset_bytes
  v21 = psp_firmware.parse(fake_amdgpu.sos_file(header_minor=1))        # v2.1: the aux index moves the table by 4 bytes
  assert v21.header.header_version == (2, 1) and v21.get("sos").data == fw.get("sos").data
  assert psp_firmware.parse(fake_amdgpu.sos_file(crc=False)).crc_matches is None
  ta = psp_firmware.parse(psp_firmware.build([(1, 7, b"asd!"), (4, 8, b"hdcp")]), kind="ta")
  assert list(ta.binaries) == ["asd", "hdcp"] and ta.get("hdcp").data == b"hdcp"


def test_v1_sos_header() -> None:
  # psp_firmware_header_v1_1: sOS @32, TOC @44, KDB @56 (legacy {version, offset, size}); sys_drv = the array up to the sOS
  array = 0x100
  payload = b"S" * 0x40 + b"O" * 0x20 + b"T" * 0x10 + b"K" * 0x8
  hdr = bytearray(array)
  psp_firmware.COMMON_HEADER.pack_into(hdr, 0, array + len(payload), 68, 1, 1, 11, 0, 5, len(payload), array, 0)
  struct.pack_into("<9I", hdr, 32, 9, 0x40, 0x20, 10, 0x60, 0x10, 11, 0x70, 0x8)
  fw = psp_firmware.parse(bytes(hdr) + payload)
  assert {n: b.data for n, b in fw.binaries.items()} == {"sos": b"O" * 0x20, "toc": b"T" * 0x10, "kdb": b"K" * 8, "sys_drv": b"S" * 0x40}


@pytest.mark.parametrize("corrupt, match", [
  (lambda b: b[:-4], "size_bytes is"),
  (lambda b: b[:20], "shorter than the 32-byte common header"),
  (lambda b: struct.pack_into("<I", b, 36 + 8, 0x7FFFFFF0) or b, "lies outside"),        # first descriptor's offset
  (lambda b: struct.pack_into("<I", b, 36 + 16, 1) or b, "listed twice"),               # second descriptor says sOS again
  (lambda b: struct.pack_into("<H", b, 8, 3) or b, "header version 3.0"),
  (lambda b: struct.pack_into("<I", b, 32, 400) or b, "run past the ucode array"),
  (lambda b: struct.pack_into("<I", b, 24, 0) or b, "ucode_array_offset_bytes 0x0"),
])
def test_corrupt_sos_files_are_typed_errors(corrupt, match: str) -> None:
  blob = bytearray(fake_amdgpu.sos_file())
  with pytest.raises(PSPFirmwareError, match=match): psp_firmware.parse(corrupt(blob))


def test_crc_mismatch_is_recorded_not_enforced() -> None:
  blob = bytearray(fake_amdgpu.sos_file())
  blob[-1] ^= 0xFF
  assert psp_firmware.parse(blob).crc_matches is False


def test_compressed_files(tmp_path, monkeypatch) -> None:
  blob = fake_amdgpu.sos_file()
  (tmp_path / (SOS + ".xz")).write_bytes(lzma.compress(blob))
  assert psp_firmware.load(str(tmp_path / (SOS + ".xz"))).get("sos").data == psp_firmware.parse(blob).get("sos").data
  (tmp_path / (SOS + ".zst")).write_bytes(b"\x28\xb5\x2f\xfd" + bytes(16))
  monkeypatch.setitem(sys.modules, "zstandard", None)          # as on a machine without the module
  with pytest.raises(FirmwareToolMissing, match="zstd-compressed") as e: psp_firmware.load(str(tmp_path / (SOS + ".zst")))
  assert "pip install zstandard" in e.value.hint and e.value.reason is Reason.MISSING_TOOLCHAIN
  (tmp_path / "bad.bin.xz").write_bytes(b"nope")
  with pytest.raises(PSPFirmwareError, match=r"not a valid \.xz"): psp_firmware.load(str(tmp_path / "bad.bin.xz"))
  with pytest.raises(PSPFirmwareError, match="cannot read"): psp_firmware.load(str(tmp_path / "missing.bin"))


# ---- the PSP on the fake MP0 -------------------------------------------------------------------------------------------

def gpu(tmp_path, sos: bytes | None = None, mp0=(13, 0, 0), mmhub=(3, 0, 0), window: bool = True, **kw):
  regs, vram = fake_amdgpu.fake_gpu(blob=fake_amdgpu.table(mp0=mp0, mmhub=mmhub), mib=64, gmc=12 if mmhub[0] == 4 else 11)
  sos = fake_amdgpu.sos_file() if sos is None else sos
  (tmp_path / f"psp_{'_'.join(map(str, mp0))}_sos.bin").write_bytes(sos)
  mp = fake_amdgpu.FakeMP0(regs, vram, sos, mp0=mp0, mmhub=mmhub, **kw)
  return GPURegisters(regs, vram if window else None), mp, vram


def test_psp_boots_creates_its_ring_and_sets_up_the_tmr(tmp_path) -> None:
  r, mp, vram = gpu(tmp_path)
  b = bringup.bring_up(r, "AMD:0 through TEST", str(tmp_path))
  assert mp.violations == [] and b.psp_booted
  assert mp.loaded == ["kdb", "spl", "sys_drv", "soc_drv", "intf_drv", "dbg_drv", "ras_drv", "sos"]
  assert [c for c, _ in mp.commands] == [psp.GFX_CMD_ID_LOAD_TOC, psp.GFX_CMD_ID_SETUP_TMR]
  at, size, phys = mp.tmr
  assert at % (1 << 20) == 0 and size == 0x500000 and phys == at and at >= psp.DEFAULT_BASE
  assert mp.destroyed == 1 and mp.ring is None                 # the ring is given back before the function is released
  with pytest.raises(AMDNotImplemented) as e: b.stop()
  msg = str(e.value)
  for part in ("1 of 8 firmware files", "header v2.0, sos 0x100", "crc32 matches", "HDP flush remapped to register BAR offset 0x7f000",
               "PSP bootloader loaded kdb, spl, sys_drv, soc_drv, intf_drv, dbg_drv, ras_drv, sos through a 1 MiB VRAM buffer at MC 0x8001000000",
               "sOS alive (C2PMSG_81 = 0x3a0001)", "PSP KM ring created (4096 bytes at MC 0x8001100000)",
               "GFX_CMD_ID_LOAD_TOC ok: the PSP asks for a 0x500000-byte TMR", "GFX_CMD_ID_SETUP_TMR ok: TMR at VRAM 0x1200000",
               "KM ring destroyed", "next, not implemented: loading the IP firmwares through the PSP ring (GFX_CMD_ID_LOAD_IP_FW",
               "SMU start-up", "MMHUB 3.0.0 GART enabled", "the GFXHUB's GART", "the MEC queue"):
    assert part in msg, (part, msg)
  # what the fence and command buffer hold is what the PSP wrote
  assert struct.unpack("<I", vram.read(0x1101000 + 0x1000, 4))[0] == 2


def test_psp14_loads_ipkeymgr_and_has_a_boot_time_tmr(tmp_path) -> None:
  parts = ("sos", "sys_drv", "kdb", "toc", "spl", "soc_drv", "intf_drv", "dbg_drv", "ras_drv", "ipkeymgr_drv")
  r, mp, _ = gpu(tmp_path, sos=fake_amdgpu.sos_file(parts=parts), mp0=(14, 0, 2), mmhub=(4, 1, 0))
  b = bringup.bring_up(r, "AMD:0", str(tmp_path))
  assert mp.violations == [] and b.psp_booted              # the fake checks the SPL command carries the KDB image
  assert mp.loaded == ["kdb", "spl", "sys_drv", "soc_drv", "intf_drv", "dbg_drv", "ras_drv", "ipkeymgr_drv", "sos"]
  assert [c for c, _ in mp.commands] == [psp.GFX_CMD_ID_LOAD_TOC] and "TMR set up by the PSP at boot (MP0 14.0.2)" in b.summary()
  # PSP 13 has no ipkeymgr_drv loader: the same file skips it
  r, mp, _ = gpu(tmp_path, sos=fake_amdgpu.sos_file(parts=parts))
  bringup.bring_up(r, "AMD:0", str(tmp_path))
  assert mp.violations == [] and "ipkeymgr_drv" not in mp.loaded


def test_a_bootloader_error_code_is_a_typed_error(tmp_path) -> None:
  r, mp, _ = gpu(tmp_path)
  mp.bl_error["sys_drv"] = 0x17
  with pytest.raises(psp.PSPCommandError, match=r"bootloader reported error 0x17 loading sys_drv \(C2PMSG_35 = 0x80000017\)") as e:
    bringup.bring_up(r, "AMD:0", str(tmp_path))
  assert e.value.status == 0x17 and e.value.cmd_id == psp.BL_LOAD_SYSDRV and mp.loaded == ["kdb", "spl", "sys_drv"]


def test_a_file_without_optional_parts_loads_only_what_it_has(tmp_path) -> None:
  r, mp, _ = gpu(tmp_path, sos=fake_amdgpu.sos_file(parts=("sos", "sys_drv", "kdb")))
  b = bringup.bring_up(r, "AMD:0", str(tmp_path))
  assert mp.violations == [] and mp.loaded == ["kdb", "sys_drv", "sos"]
  assert [c for c, _ in mp.commands] == [psp.GFX_CMD_ID_SETUP_TMR] and mp.tmr[1] == psp.TMR_DEFAULT_SIZE
  assert b.psp_booted


def test_a_running_sos_is_not_reloaded_and_a_left_ring_is_destroyed_first(tmp_path) -> None:
  r, mp, _ = gpu(tmp_path, sos_alive=0x3A0001)
  mp.reg(71, 0x1000)                                 # a ring left by the driver that had the GPU
  mp.ring = (0, 0x1000)
  b = bringup.bring_up(r, "AMD:0", str(tmp_path))
  assert mp.loaded == [] and mp.violations == [] and mp.destroyed == 2
  assert "sOS already running (C2PMSG_81 = 0x3a0001): bootloader loads skipped" in b.summary()
  assert "previous ring destroyed" in b.summary()


@pytest.mark.parametrize("hang, match", [
  ("bootloader", "bootloader did not finish loading kdb .C2PMSG_35 & 0x80000000 == 0x80000000.: still 0x00000000"),
  ("sos", "sOS did not start"),
  ("ring", "KM ring creation not acknowledged"),
  ("fence", "GFX_CMD_ID_LOAD_TOC: fence not written .want 1."),
])
def test_a_psp_that_stops_answering_is_a_bounded_typed_timeout(tmp_path, hang: str, match: str) -> None:
  r, mp, _ = gpu(tmp_path)
  mp.hang.add(hang)
  with pytest.raises(psp.PSPTimeout, match=match) as e: bringup.bring_up(r, "AMD:0", str(tmp_path), psp_timeout=0.05)
  assert "after 0.05 s" in str(e.value) and e.value.hint


def test_a_refused_command_decodes_the_status(tmp_path) -> None:
  r, mp, _ = gpu(tmp_path)
  mp.status[psp.GFX_CMD_ID_LOAD_TOC] = 0xFFFF000A
  with pytest.raises(psp.PSPCommandError, match="GFX_CMD_ID_LOAD_TOC failed with status TEE_ERROR_NOT_SUPPORTED") as e:
    bringup.bring_up(r, "AMD:0", str(tmp_path))
  assert e.value.status == 0xFFFF000A and e.value.cmd_id == 0x20
  r, mp, _ = gpu(tmp_path, sos=fake_amdgpu.sos_file(parts=("sos", "kdb")))
  mp.status[psp.GFX_CMD_ID_SETUP_TMR] = 0x1234
  with pytest.raises(psp.PSPCommandError, match="SETUP_TMR failed with status 0x00001234"): bringup.bring_up(r, "AMD:0", str(tmp_path))


def test_direct_ring_use_and_limits(tmp_path) -> None:
  r, mp, _ = gpu(tmp_path)
  t = discovery.parse(fake_amdgpu.table())
  flusher, line = hdp.setup(r, t.find("NBIF"))
  assert line == "HDP flush remapped to register BAR offset 0x7f000 (as the NBIO's remap_hdp_registers)"
  p = psp.PSP(r, t.find("MP0"), 64 << 20, *psp.vram_location(r, t), timeout=0.05, flush=flusher.flush)
  with pytest.raises(psp.PSPError, match="before the KM ring exists"): p.submit(psp.GFX_CMD_ID_LOAD_TOC)
  with pytest.raises(PSPFirmwareError, match="more than the 1 MiB buffer"): p.load_component("kdb", bytes((1 << 20) + 4), psp.BL_LOAD_KEY_DATABASE)
  p.boot(psp_firmware.parse(fake_amdgpu.sos_file()))
  p.ring_create()
  for _ in range(70):                               # more frames than the 4 KiB ring holds: the write pointer wraps
    with pytest.raises(psp.PSPCommandError, match="PSP_ERR_UNKNOWN_COMMAND"): p.submit(0x7F)
  assert mp.violations == [] and len(mp.commands) == 70 and mp.reg(67) == (70 * 16) % 1024
  assert flusher.flushes == 70 and r.mmio.hdp_flushes == 70            # one HDP flush per frame, before the write pointer
  p.flush = lambda: None                            # without it the PSP would read frames the HDP still holds
  with pytest.raises(psp.PSPCommandError): p.submit(0x7F)
  assert mp.violations == ["write pointer moved while CPU writes sit in the HDP (no flush)"]
  with pytest.raises(psp.PSPError, match="does not fit below"): p.setup_tmr(64 << 20)
  with pytest.raises(psp.PSPError, match="no room"): psp.PSP(r, t.find("MP0"), 16 << 20, 0)


def test_versions_plugrt_does_not_boot_are_recorded_or_refused(tmp_path) -> None:
  regs, _ = fake_amdgpu.fake_gpu(blob=fake_amdgpu.table(mp0=(13, 0, 6)))
  (tmp_path / "psp_13_0_6_sos.bin").write_bytes(fake_amdgpu.sos_file())
  b = bringup.bring_up(GPURegisters(regs), "AMD:0", str(tmp_path))
  assert "PSP boot for MP0 13.0.6 is not implemented" in b.summary() and not b.psp_booted
  with pytest.raises(AMDNotImplemented, match=r"PSP firmware loading \(SOS"): b.stop()
  regs, _ = fake_amdgpu.fake_gpu(blob=fake_amdgpu.table(mmhub=(9, 9, 9)), mib=64)
  (tmp_path / "psp_13_0_0_sos.bin").write_bytes(fake_amdgpu.sos_file())
  b = bringup.bring_up(GPURegisters(regs), "AMD:0", str(tmp_path))
  assert "PSP not booted: no MMMC_VM_FB_LOCATION_BASE register is known for MMHUB 9.9.9" in b.summary() and not b.psp_booted
  t = discovery.parse(fake_amdgpu.table(mmhub=(9, 9, 9)))
  with pytest.raises(psp.PSPUnsupported, match=r"MMHUB 9\.9\.9"): psp.vram_location(GPURegisters(regs), t)
  mp0 = discovery.parse(fake_amdgpu.table(mp0=(13, 0, 6))).find("MP0")
  with pytest.raises(psp.PSPUnsupported, match=r"MP0 13\.0\.6"): psp.PSP(GPURegisters(regs), mp0, 64 << 20, 0)


def test_no_sos_file_stops_before_the_psp(tmp_path) -> None:
  regs, vram = fake_amdgpu.fake_gpu(mib=64)
  b = bringup.bring_up(GPURegisters(regs, vram), "AMD:0", str(tmp_path))
  assert "PSP not booted: psp_13_0_0_sos.bin not found" in b.summary() and not b.psp_booted
  assert not any(reg >= fake_amdgpu.MP0_BASES[0] for op, reg, _ in regs.log if op == "w")      # nothing written to MP0


def test_vram_writes_through_mm_index(tmp_path) -> None:
  regs, vram = fake_amdgpu.fake_gpu(mib=64)
  r = GPURegisters(regs)                            # no VRAM window: MM_INDEX/MM_INDEX_HI/MM_DATA
  r.write_vram(0x2000004, b"\x01\x02\x03\x04\x05")
  assert vram.read(0x2000004, 8) == b"\x01\x02\x03\x04\x05\x00\x00\x00" and r.read_vram(0x2000004, 8) == vram.read(0x2000004, 8)
  from plugrt_amd_pci.regs import RegisterError
  with pytest.raises(RegisterError, match="not dword aligned"): r.write_vram(2, b"x")


def test_hdp_flush_needs_a_known_nbio_and_a_bar_that_reaches_the_hole() -> None:
  t = discovery.parse(fake_amdgpu.table())
  regs, _ = fake_amdgpu.fake_gpu(mib=64)
  assert hdp.setup(GPURegisters(regs), None)[0] is None
  nbio23 = discovery.parse(fake_amdgpu.table(nbio=(2, 3, 0))).find("NBIF")
  flusher, line = hdp.setup(GPURegisters(regs), nbio23)
  assert flusher is None and "not known for NBIO 2.3.0" in line
  small, _ = fake_amdgpu.fake_gpu(mib=64, size=256 << 10)
  flusher, line = hdp.setup(GPURegisters(small), t.find("NBIF"))
  assert flusher is None and "256 KiB register BAR does not reach the remap hole at 0x7f000" in line
  flusher, _ = hdp.setup(GPURegisters(regs), t.find("NBIF"))
  assert regs.regs[fake_amdgpu.NBIO_BASES[2] + 0x12D] == 0x7F000 and regs.regs[fake_amdgpu.NBIO_BASES[2] + 0x12E] == 0x7F004
