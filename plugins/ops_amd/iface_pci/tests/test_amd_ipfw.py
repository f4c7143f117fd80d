"""The IP-firmware stage of the driverless bring-up: IP firmware headers (plugrt_amd_pci.ucode), LOAD_IP_FW and
AUTOLOAD_RLC through the PSP (plugrt_amd_pci.psp_load) and the SMU mailbox (plugrt_amd_pci.smu), against the fake MP0/MP1 in
plugins/ops_amd/tests/fake_amdfw.py, whose firmware files are packed from the documented headers by its own code."""
from __future__ import annotations

import os
import struct
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests"))
import fake_amdfw
import fake_amdgpu

from plugrt_amd.device import AMDNotImplemented
from plugrt_amd_pci import bringup, hdp, psp, psp_load, smu, ucode
from plugrt_amd_pci.regs import GPURegisters

RDNA3 = dict(gc=(11, 0, 0), mp0=(13, 0, 0), mp1=(13, 0, 0), sdma=(6, 0, 0), mmhub=(3, 0, 0))
RDNA4 = dict(gc=(12, 0, 0), mp0=(14, 0, 2), mp1=(14, 0, 2), sdma=(7, 0, 0), mmhub=(4, 1, 0), nbio=(6, 3, 1))
SOS14 = ("sos", "sys_drv", "kdb", "toc", "spl", "soc_drv", "intf_drv", "dbg_drv", "ras_drv", "ipkeymgr_drv")
# the kernel's order (enum AMDGPU_UCODE_ID) for an RDNA3 board: SDMA, RS64 CP ucodes, their stacks, IMU, RLC parts, RLC_G
GC11_ORDER = ["SDMA_UCODE_TH0", "SDMA_UCODE_TH1", "CP_RS64_PFP", "CP_RS64_ME", "CP_RS64_MEC", "CP_RS64_PFP_P0_STACK",
              "CP_RS64_PFP_P1_STACK", "CP_RS64_ME_P0_STACK", "CP_RS64_ME_P1_STACK", "CP_RS64_MEC_P0_STACK", "CP_RS64_MEC_P1_STACK",
              "CP_RS64_MEC_P2_STACK", "CP_RS64_MEC_P3_STACK", "IMU_I", "IMU_D", "RLC_RESTORE_LIST_CNTL", "RLC_RESTORE_LIST_GPM_MEM",
              "RLC_RESTORE_LIST_SRM_MEM", "RLC_IRAM", "RLC_DRAM", "RLC_P", "RLC_V", "RLC_G"]
LOAD, AUTOLOAD, TOC, TMR = psp.GFX_CMD_ID_LOAD_IP_FW, psp_load.GFX_CMD_ID_AUTOLOAD_RLC, psp.GFX_CMD_ID_LOAD_TOC, psp.GFX_CMD_ID_SETUP_TMR


def gpu(tmp_path, v: dict = RDNA3, rlc_minor: int = 3, skip: tuple[str, ...] = (), if_version: int = 0x3D, **files):
  regs, vram = fake_amdgpu.fake_gpu(blob=fake_amdgpu.table(**v), mib=64, gmc=v["gc"][0])
  sos = fake_amdgpu.sos_file(parts=SOS14) if v["mp0"][0] == 14 else fake_amdgpu.sos_file()
  (tmp_path / f"psp_{'_'.join(map(str, v['mp0']))}_sos.bin").write_bytes(sos)
  blobs, want = fake_amdfw.ip_files(v["gc"], v["mp1"], v["sdma"], rlc_minor)
  for name, blob in (blobs | files).items():
    if name not in skip: (tmp_path / name).write_bytes(blob)
  mp0 = fake_amdgpu.FakeMP0(regs, vram, sos, mp0=v["mp0"], mmhub=v["mmhub"])
  mp1 = fake_amdfw.FakeMP1(regs, v["mp1"], if_version=if_version)
  ipf = fake_amdfw.FakeIPFirmware(mp0, want, mp1, fake_amdfw.FakeRLC(regs, v["gc"]))
  ipf.cp = fake_amdfw.FakeCP(regs)
  return GPURegisters(regs, vram), mp0, ipf, mp1


def names(mp0) -> list:
  return [c for c, _ in mp0.commands]


def test_rdna3_loads_every_ip_firmware_in_the_kernels_order_then_starts_the_smu(tmp_path) -> None:
  r, mp0, ipf, mp1 = gpu(tmp_path)
  b = bringup.bring_up(r, "AMD:0", str(tmp_path))
  assert mp0.violations == [] and mp1.violations == [] and ipf.autoloaded and b.smu_started
  # PSP 13.0.0 manages DF C-states in its PMFW: the SMU goes between LOAD_TOC and SETUP_TMR (psp_hw_start)
  assert names(mp0) == [TOC, LOAD, TMR] + [LOAD] * len(GC11_ORDER) + [AUTOLOAD]
  assert ipf.loaded == ["SMC"] + GC11_ORDER and b.ip_loaded == ipf.loaded
  assert mp1.messages == [(1, 0), (2, 0), (3, 0)] and mp0.destroyed == 1
  with pytest.raises(AMDNotImplemented) as e: b.stop()
  msg = str(e.value)
  for part in ("8 of 8 firmware files", "gc_11_0_0_rlc.bin (v2.3: RLC_RESTORE_LIST_CNTL", "IP firmware buffer: 24 ucodes",
               "GFX_CMD_ID_LOAD_IP_FW ok: SMC (8192 bytes from smu_13_0_0.bin) before SETUP_TMR",
               "GFX_CMD_ID_AUTOLOAD_RLC ok", "SMU ready (MP1_FIRMWARE_FLAGS = 0x1)", "TestMessage ok",
               "SMU firmware 0x004e4a00 (program 0, 78.74.0), driver interface 0x3d (the kernel's value)", "KM ring destroyed",
               "RLC autoload complete (CP_STAT 0, RLC_RLCS_BOOTLOAD_STATUS 0x80000018)",
               "RS64 CP set up: PFP start 0x2000 on 2 pipes, ME start 0x3000 on 2 pipes, MEC start 0x500004000 on 4 pipes",
               "GFXHUB (gfxhub_v3_0) GART enabled (141 register writes, as gfx_v11_0_gfxhub_enable, VM contexts 1-15 configured)",
               "golden registers: TCP_CNTL", "MEC compute queue: ME 1 pipe 0 queue 0, VMID 8, AQL",
               "next, not implemented: a plugrt device on this queue"):
    assert part in msg, (part, msg)
  assert msg.index("LOAD_TOC ok") < msg.index("SMC (8192") < msg.index("SETUP_TMR ok") < msg.index("AUTOLOAD_RLC ok") < msg.index("SMU ready")
  assert msg.index("SMU firmware") < msg.index("RLC autoload complete") < msg.index("KM ring destroyed")    # gfx hw_init after the SMU's
  assert ipf.rlc.done and b.rlc_ready and b.cp_ready
  # gfx_v11_0_config_gfx_rs64: start = (hi << 30 | lo >> 2) & 0xffffffff and hi >> 2, per pipe under its GRBM selection
  cp = ipf.cp
  assert cp.starts == {(0, 0): {"PFP_START": 0x800, "PFP_START_HI": 0, "ME_START": 0xC00, "ME_START_HI": 0},
                       (0, 1): {"PFP_START": 0x800, "PFP_START_HI": 0, "ME_START": 0xC00, "ME_START_HI": 0},
                       **{(1, p): {"MEC_START": 0x40001000, "MEC_START_HI": 1} for p in range(4)}}
  # ... then, before the queue, gfx_v11_0_cp_compute_enable: MEC pipes 0-3 active, not halted
  assert cp.pulses == {"CP_ME_CNTL": [0x3 << 18, 0, 0x3 << 20, 0], "CP_MEC_RS64_CNTL": [0xF << 16, 0, 0xF << 26]}
  assert r.rreg(fake_amdgpu.GC_BASES[1] + 0x900) == 0                       # GRBM selection back to ME 0 pipe 0
  # the GFXHUB (gfx_v11_0_gfxhub_enable) after the CP set-up: the MMHUB's GART and aperture in the GC's registers
  gc = fake_amdgpu.GC_BASES[0]
  assert msg.index("RS64 CP set up") < msg.index("GFXHUB (gfxhub_v3_0) GART enabled") < msg.index("KM ring destroyed") and b.gfxhub
  assert [r.rreg(gc + o) for o in (0x16F3, 0x1713, 0x1714, 0x167D, 0x167E)] == [0xC00001, 0xFFF00000, 0x7, 0x200000, 0x2000FF]
  assert r.rreg(gc + 0x167F) == 0x1859 and r.rreg(gc + 0x15BE) == 0x80130009 and r.rreg(gc + 0x1688) == 1
  assert r.rreg(gc + 0x1E1F) & 1 << 15 and r.rreg(gc + 0x15C4) == 0x1FFC                  # CP_DEBUG, fault defaults
  inv = r.mmio.gc_invalidation
  assert inv.requests == [0x00F80001, 0x00F80100] and inv.violations == []      # VMID 0 (GART), then plugrt's VMID 8


def test_rdna4_smu_first_no_setup_tmr_rs64_sdma_and_an_smn_mailbox(tmp_path) -> None:
  r, mp0, ipf, mp1 = gpu(tmp_path, RDNA4, rlc_minor=4, if_version=0x2E)
  b = bringup.bring_up(r, "AMD:0", str(tmp_path))
  assert mp0.violations == [] and mp1.violations == [] and b.smu_started
  assert names(mp0) == [TOC] + [LOAD] * (len(ipf.loaded)) + [AUTOLOAD]           # boot-time TMR: no SETUP_TMR
  assert ipf.loaded == ["SMC", "SDMA_RS64", "CP_RS64_PFP", "CP_RS64_ME", "CP_RS64_MEC", "CP_RS64_PFP_P0_STACK", "CP_RS64_ME_P0_STACK",
                        "CP_RS64_MEC_P0_STACK", "CP_RS64_MEC_P1_STACK", "IMU_I", "IMU_D", "GLOBAL_TAP_DELAYS", "SE0_TAP_DELAYS",
                        "SE1_TAP_DELAYS", "SE2_TAP_DELAYS", "SE3_TAP_DELAYS", "RLC_RESTORE_LIST_CNTL", "RLC_RESTORE_LIST_GPM_MEM",
                        "RLC_RESTORE_LIST_SRM_MEM", "RLC_IRAM", "RLC_DRAM", "RLC_G"]           # v2.4 has no RLC_P/RLC_V part
  assert mp1.msg_reg * 4 >= fake_amdgpu.REG_BAR_SIZE and mp1.messages == [(1, 0), (2, 0), (3, 0)]
  assert "SMC (8192 bytes from smu_14_0_2.bin) first of the IP firmwares" in b.summary() and b.rlc_ready and b.cp_ready and b.gfxhub
  assert "driver interface 0x2e (the kernel expects 0x26 (it only logs a difference; so does plugrt))" in b.summary()
  msg = b.summary()
  # gfx_v12_0_hw_init's order: autoload wait, golden registers (rev id 0 here), RS64 CP set-up, GFXHUB, then compute
  order = ["RLC autoload complete", "golden registers: DB_MEM_CONFIG &0x0000000f |0x0000000f, CB_HW_CONTROL_1",
           "RS64 CP set up: PFP start 0x2000 on 2 pipes, ME start 0x3000 on 2 pipes, MEC start 0x500004000 on 4 pipes",
           "GFXHUB (gfxhub_v12_0) GART enabled (141 register writes, as gfx_v12_0_gfxhub_enable", "no GDS on this GC (gfx_v12_0_init_compute_vmid)",
           "(nbif_v6_3_1_enable_doorbell_aperture, nbif_v6_3_1_gc_doorbell_init)", "gfx_v12_0_rlc_enable_srm",
           "HQD loaded (63 register writes, as gfx_v12_0_kiq_init_register)", "KM ring destroyed"]
  assert [msg.index(p) for p in order] == sorted(msg.index(p) for p in order), msg
  assert "MMHUB 4.1.0 GART enabled (142 register writes, as gmc_v12_0_gart_enable" in msg    # + the private invalidation
  with pytest.raises(AMDNotImplemented, match=r"next, not implemented: a plugrt device on this queue"): b.stop()
  # config_gfx_rs64 (GC 12: the same registers and pipes as GC 11), under each pipe's GRBM selection
  assert ipf.cp.starts[(1, 3)] == {"MEC_START": 0x40001000, "MEC_START_HI": 1}
  assert set(ipf.cp.starts) == {(0, 0), (0, 1), (1, 0), (1, 1), (1, 2), (1, 3)}
  # GMC 12's registers (mmhub_4_1_0 / gc_12_0_0 offsets) with GMC 12's fields: CONTEXT0 enabled flat, CONTEXT1-15 at depth 3
  mm, gc, regs = fake_amdgpu.MMHUB_BASES[0], fake_amdgpu.GC_BASES[0], r.mmio
  assert regs.regs[mm + 0x564] == 1 and regs.regs[gc + 0x1624] == 1 and regs.regs[mm + 0x55B] == 0x59 | 3 << 11
  assert regs.regs[mm + 0x565 + 7] == regs.regs[gc + 0x1625 + 7] == 0xAAA807                       # VMID 8: worked out from the masks
  assert [regs.regs[gc + o] for o in (0x16AF, 0x16B0, 0x1619, 0x161A)] == [0xFFF00000, 0x7, 0x200000, 0x2000FF]
  assert regs.regs[gc + 0x15C6] == 0x80130009 and regs.regs[gc + 0x1E1F] & 1 << 15 and regs.regs[gc + 0x15CC] == 0x1FFC
  assert regs.invalidation.requests == regs.gc_invalidation.requests == [0x00F80001, 0x00F80100] and regs.invalidation.violations == []
  # golden registers only on rev id 0 (RCC_STRAP0_RCC_DEV0_EPF0_STRAP0 bits 24-27)
  r, *_ = gpu(tmp_path, RDNA4, rlc_minor=4, if_version=0x2E)
  r.mmio.regs[fake_amdgpu.NBIO_BASES[2] + 0x1C] = 0x1 << 24
  b = bringup.bring_up(r, "AMD:0", str(tmp_path))
  assert "golden registers not programmed: rev id 1 (the kernel programs them on rev id 0 only, gfx_v12_0_init_golden_registers)" in b.summary()
  assert fake_amdgpu.GC_BASES[0] + 0x13D2 not in r.mmio.regs


def test_psp_13_0_10_loads_the_smu_after_setup_tmr(tmp_path) -> None:
  r, mp0, ipf, _ = gpu(tmp_path, RDNA3 | dict(mp0=(13, 0, 10), mp1=(13, 0, 10)))
  bringup.bring_up(r, "AMD:0", str(tmp_path))
  assert mp0.violations == [] and names(mp0)[:3] == [TOC, TMR, LOAD] and ipf.loaded[0] == "SMC"


def test_a_refused_load_names_the_firmware_and_status(tmp_path) -> None:
  r, mp0, ipf, _ = gpu(tmp_path)
  ipf.refuse[87] = 0xFFFF000A
  with pytest.raises(psp_load.IPFirmwareRefused, match=r"LOAD_IP_FW of CP_RS64_PFP \(GFX_FW_TYPE 87, \d+ bytes from gc_11_0_0_pfp.bin\) "
                     "failed with status TEE_ERROR_NOT_SUPPORTED") as e:
    bringup.bring_up(r, "AMD:0", str(tmp_path))
  assert (e.value.ucode, e.value.file, e.value.status, e.value.cmd_id) == ("CP_RS64_PFP", "gc_11_0_0_pfp.bin", 0xFFFF000A, LOAD)
  assert isinstance(e.value, psp.PSPCommandError) and "linux-firmware" in e.value.hint
  r, mp0, ipf, _ = gpu(tmp_path)
  mp0.status[AUTOLOAD] = 0x1234
  with pytest.raises(psp_load.IPFirmwareRefused, match="AUTOLOAD_RLC failed with status 0x00001234"): bringup.bring_up(r, "AMD:0", str(tmp_path))


@pytest.mark.parametrize("setup, error, match", [
  (lambda m: m.hang.add("ready"), smu.SMUTimeout, r"not ready \(MP1_FIRMWARE_FLAGS at SMN 0x3b10024"),
  (lambda m: m.hang.add("answer"), smu.SMUTimeout, r"no response to TestMessage \(C2PMSG_90\): still 0x00000000 after 0.05 s"),
  (lambda m: m.resp.update({2: 0xFE}), smu.SMUMessageError, r"GetSmuVersion \(param 0x0\) answered UnknownCmd"),
  (lambda m: m.resp.update({3: 0x77}), smu.SMUMessageError, r"GetDriverIfVersion \(param 0x0\) answered 0x77"),
])
def test_an_smu_that_does_not_answer_is_typed_and_bounded(tmp_path, setup, error, match: str) -> None:
  r, mp0, _, mp1 = gpu(tmp_path)
  setup(mp1)
  with pytest.raises(error, match=match) as e: bringup.bring_up(r, "AMD:0", str(tmp_path), psp_timeout=0.05)
  assert e.value.hint and mp0.violations == [] and mp1.violations == []
  if error is smu.SMUMessageError: assert e.value.response in (0xFE, 0x77)


def test_a_missing_ip_file_stops_before_any_load(tmp_path) -> None:
  r, mp0, _, _ = gpu(tmp_path, skip=("gc_11_0_0_imu.bin",))
  b = bringup.bring_up(r, "AMD:0", str(tmp_path))
  assert LOAD not in names(mp0) and b.psp_booted and not b.ip_loaded and not b.smu_started
  assert "IP firmware not loaded: gc_11_0_0_imu.bin not found" in b.summary()
  with pytest.raises(AMDNotImplemented, match="next, not implemented: loading the IP firmwares"): b.stop()


def test_an_mp1_without_a_known_mailbox_loads_but_does_not_start_the_smu(tmp_path) -> None:
  r, mp0, ipf, _ = gpu(tmp_path, RDNA3 | dict(mp1=(13, 0, 6)))
  b = bringup.bring_up(r, "AMD:0", str(tmp_path))
  assert mp0.violations == [] and ipf.autoloaded and not b.smu_started
  assert "SMU not started: the SMU mailbox of MP1 13.0.6 is not known to plugrt" in b.summary()
  with pytest.raises(AMDNotImplemented, match="next, not implemented: SMU start-up for this MP1"): b.stop()


def test_a_corrupt_ip_file_is_a_typed_error_before_the_psp_is_touched(tmp_path) -> None:
  blobs, _ = fake_amdfw.ip_files()
  bad = bytearray(blobs["gc_11_0_0_mec.bin"])
  struct.pack_into("<I", bad, 48, len(bad) - 16)            # the stack's offset: its bytes run past the end
  r, mp0, _, _ = gpu(tmp_path, **{"gc_11_0_0_mec.bin": bytes(bad)})
  with pytest.raises(ucode.UcodeError, match=r"gc_11_0_0_mec.bin: CP_RS64_MEC_P0_STACK at byte 0x[0-9a-f]+ \(\+\d+\) lies outside"):
    bringup.bring_up(r, "AMD:0", str(tmp_path))
  assert mp0.loaded == [] and mp0.commands == []


# ---- the headers alone ---------------------------------------------------------------------------------------------------

def test_header_versions_and_what_each_part_is() -> None:
  blobs, want = fake_amdfw.ip_files(rlc_minor=2)
  rlc = ucode.parse(blobs["gc_11_0_0_rlc.bin"], "rlc", "gc_11_0_0_rlc.bin")
  assert [u.name for u in rlc.ucodes] == ["RLC_RESTORE_LIST_CNTL", "RLC_RESTORE_LIST_GPM_MEM", "RLC_RESTORE_LIST_SRM_MEM", "RLC_IRAM",
                                          "RLC_DRAM", "RLC_G"]
  assert all(u.data == want[u.name] for u in rlc.ucodes) and rlc.header.header_version == (2, 2)
  mec = ucode.parse(blobs["gc_11_0_0_mec.bin"], "mec")
  assert mec.start_addr == 0x500004000 and [u.fw_type for u in mec.ucodes] == [89, 94, 95, 96, 97]
  rlc0 = ucode.parse(fake_amdfw.ip_files(rlc_minor=0)[0]["gc_11_0_0_rlc.bin"], "rlc")
  assert [u.name for u in rlc0.ucodes] == ["RLC_G"]


def test_v1_headers_and_skipped_parts() -> None:
  f = fake_amdfw._File((1, 0), bytes(range(256)) * 4)          # gfx v1.0 MEC: the last jt_size dwords are the jump table
  f.fields |= {36: 0xF0, 40: 0x10}
  mec = ucode.parse(f.done(44), "mec")
  assert [(u.name, u.fw_type, u.size) for u in mec.ucodes] == [("CP_MEC1", 4, 1024 - 64)]
  f = fake_amdfw._File((1, 0), b"\x11" * 64)
  assert [(u.name, u.fw_type) for u in ucode.parse(f.done(48), "sdma").ucodes] == [("SDMA0", 9)]
  blobs, _ = fake_amdfw.ip_files()
  rlc = bytearray(blobs["gc_11_0_0_rlc.bin"])
  struct.pack_into("<I", rlc, 176, 0)                          # RLC_P size 0: skipped, as fw_load_skip_check does
  parsed = ucode.parse(bytes(rlc), "rlc", "x/gc_11_0_0_rlc.bin")
  assert "RLC_P" not in [u.name for u in parsed.ucodes] and parsed.skipped == ("RLC_P",) and "skipped RLC_P" in parsed.describe()


@pytest.mark.parametrize("kind, corrupt, match", [
  ("sdma", lambda b: struct.pack_into("<H", b, 8, 9) or b, "sdma header version 9.0 is not one plugrt reads"),
  ("rlc", lambda b: struct.pack_into("<H", b, 10, 7) or b, "rlc header version 2.7"),
  ("imu", lambda b: struct.pack_into("<I", b, 32, 1 << 20) or b, "IMU_I at byte 0x100 .* lies outside"),
  ("smc", lambda b: b[:-4], "size_bytes is"),
  ("rlc", lambda b: struct.pack_into("<I", b, 24, 0x80) or b, "v2.3 rlc header needs byte 200, past the ucode array at byte 128"),
])
def test_corrupt_headers(kind: str, corrupt, match: str) -> None:
  blobs, _ = fake_amdfw.ip_files()
  name = {"sdma": "sdma_6_0_0.bin", "rlc": "gc_11_0_0_rlc.bin", "imu": "gc_11_0_0_imu.bin", "smc": "smu_13_0_0.bin"}[kind]
  with pytest.raises(ucode.UcodeError, match=match): ucode.parse(corrupt(bytearray(blobs[name])), kind, name)


def test_load_order_refuses_a_ucode_from_two_files() -> None:
  blobs, _ = fake_amdfw.ip_files()
  a = ucode.parse(blobs["gc_11_0_0_imu.bin"], "imu", "a.bin")
  b = ucode.parse(blobs["gc_11_0_0_imu.bin"], "imu", "b.bin")
  with pytest.raises(ucode.UcodeError, match=r"IMU_I comes from both a\.bin and b\.bin"): ucode.load_order([a, b])
  with pytest.raises(ValueError, match="unknown IP firmware kind"): ucode.parse(blobs["gc_11_0_0_imu.bin"], "vcn")


def test_the_loader_alone(tmp_path) -> None:
  from plugrt_amd_pci import discovery, psp_firmware
  r, mp0, ipf, _ = gpu(tmp_path)
  t = discovery.parse(fake_amdgpu.table())
  blobs, _ = fake_amdfw.ip_files()
  sdma = ucode.parse(blobs["sdma_6_0_0.bin"], "sdma", "sdma_6_0_0.bin")
  flusher, _ = hdp.setup(r, t.find("NBIF"))
  p = psp.PSP(r, t.find("MP0"), 64 << 20, *psp.vram_location(r, t), timeout=0.05, flush=flusher.flush)
  p.boot(psp_firmware.parse(fake_amdgpu.sos_file()))
  p.ring_create()
  loader = psp_load.IPLoader(p, [sdma])                  # no SMU, no RLC: no SMC load, no autoload
  assert "2 ucodes, 12 KiB at VRAM 0x1200000" in loader.place() and loader.load_smu() == []
  assert loader.load_rest() == ["GFX_CMD_ID_LOAD_IP_FW ok: SDMA_UCODE_TH0, SDMA_UCODE_TH1", "no RLC_G loaded: no RLC autoload"]
  assert mp0.violations == [] and ipf.loaded == ["SDMA_UCODE_TH0", "SDMA_UCODE_TH1"] and not ipf.autoloaded
  tight = psp.PSP(r, t.find("MP0"), 0x1200000 + (1 << 20) + 0x2000, *psp.vram_location(r, t))
  with pytest.raises(psp.PSPError, match=r"IP firmware buffer \(12 KiB at VRAM 0x1200000\) does not fit below 0x1202000"):
    psp_load.IPLoader(tight, [sdma]).place()


def test_an_rlc_that_does_not_finish_booting_is_a_bounded_typed_error(tmp_path) -> None:
  from plugrt_amd_pci import gfx
  r, _, ipf, _ = gpu(tmp_path)
  ipf.rlc.hang = True
  with pytest.raises(gfx.GFXTimeout, match=r"CP_STAT 0x80000000, RLC_RLCS_BOOTLOAD_STATUS 0x00000018 \(want 0 and bit 31\) after 0.05 s"):
    bringup.bring_up(r, "AMD:0", str(tmp_path), psp_timeout=0.05)
  r, _, _, _ = gpu(tmp_path, RDNA3 | dict(gc=(11, 0, 1)))          # an APU's GC: another status register, not known
  b = bringup.bring_up(r, "AMD:0", str(tmp_path))
  assert b.smu_started and not b.rlc_ready and "RLC autoload not awaited: its status register is not known for GC 11.0.1" in b.summary()
  with pytest.raises(AMDNotImplemented, match="next, not implemented: waiting for the RLC autoload to complete"): b.stop()


def test_f32_cp_files_are_recorded_not_set_up(tmp_path) -> None:
  r, _, ipf, _ = gpu(tmp_path)
  b = bringup.BringUp("AMD:0", table=fake_amdgpu.discovery.parse(fake_amdgpu.table()))
  ipf.rlc.start()
  bringup.wait_rlc(r, b, 0.05, [])                                 # no RS64 start addresses: a gfx v1 (F32) CP
  assert b.rlc_ready and not b.cp_ready and "CP not set up: the PFP/ME/MEC files are not RS64" in b.summary()


def test_the_gfxhub_flush_is_bounded_and_other_gfxhubs_are_recorded(tmp_path) -> None:
  from plugrt_amd_pci import gmc
  r, _, _, _ = gpu(tmp_path)
  r.mmio.gc_invalidation.hang.add("ack")
  with pytest.raises(gmc.GMCTimeout, match=r"GFXHUB \(gfxhub_v3_0\) TLB flush: no acknowledge for VMID 0"):
    bringup.bring_up(r, "AMD:0", str(tmp_path), psp_timeout=0.05)
  r, _, _, _ = gpu(tmp_path, RDNA3 | dict(gc=(11, 0, 3)))          # gfxhub_v3_0_3: not programmed
  b = bringup.bring_up(r, "AMD:0", str(tmp_path))
  assert b.cp_ready and not b.gfxhub and "GFXHUB not set up: GART set-up for the GFXHUB of GC 11.0.3 is not implemented" in b.summary()
  with pytest.raises(AMDNotImplemented, match="next, not implemented: the GFXHUB's GART and system aperture"): b.stop()
