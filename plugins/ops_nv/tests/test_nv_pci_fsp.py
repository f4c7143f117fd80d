"""plugrt-nv-pci's Blackwell boot against the fake GB202 (fake_nvpci_gb.py): the FSP's chain of trust step by step, the
typed error of each way it fails (a malformed COT message, an FSP that never answers, an FSP error response, an FMC
error, bus mastering off, missing or malformed FMC files), GPU-MMU version 3 tables and the FMC file's ELF32 layout."""
from __future__ import annotations

import ctypes
import os
import struct

import fake_nvpci
import fake_nvpci_gb
import pytest
from fake_nvpci_board import ADDRESS, FakePCINV

from plugrt.context import DeviceInfo, PluginContext
from plugrt_nv_nvk.nvk import VASpace
from plugrt_nv_pci import boot_fsp, firmware, fsp, mmu, msgq
from plugrt_nv_pci.chips import GSP_VERSION
from plugrt_nv_pci.errors import FirmwareError, GSPError, MissingFirmware


@pytest.fixture
def gb(tmp_path):
  fake = FakePCINV("gb202", root=str(tmp_path))
  try: yield fake
  finally: fake.shutdown()


def open_gb(fake: FakePCINV, timeout: str = "0.3"):
  env = {**fake.env(), "PLUGRT_NV_BOOT_TIMEOUT": timeout}
  return fake.open(DeviceInfo("NV", 0, "PTX", "PCI", context=PluginContext(env)))


def failing(fake: FakePCINV, error: type = GSPError, reset: bool = True):
  """Open, expecting `error`; the function given back to its driver, reset first once the FSP was asked to boot."""
  with pytest.raises(error) as e: open_gb(fake)
  undo = [(f"devices/{ADDRESS}/reset", "1")] if reset else []
  assert fake.kernel.log[-2 - reset:] == [*undo, (f"devices/{ADDRESS}/enable", "0"), ("drivers/nvidia/bind", ADDRESS)]
  return e.value


def test_gb202_boots_through_the_fsp_and_makes_the_rm_objects(gb) -> None:
  iface = open_gb(gb)
  try:
    done = iface.rec.so_far()
    for part in ("chip GB202 (Blackwell", "FSP boot complete", "WPR2 down", f"firmware {GSP_VERSION} read", "WPR sizes for the FMC to lay out",
                 "GSP FMC and its boot parameters in host memory", "GSP_SET_SYSTEM_INFO and SET_REGISTRY queued",
                 "the FSP accepted the chain-of-trust message", "GSP FMC booted GSP-RM", "GSP-RM up", "WPR laid out by the FMC",
                 "BAR1 in physical mode", "RM objects over RPC (Blackwell: compute 0xcec0, copy 0xcab5, channel 0xca6f; sm_120, 170 SMs)"):
      assert part in done, (part, done)
    assert gb.violations() == [] and gb.gpu.responses == [0] and gb.gpu.fwsec_ran is False
    assert iface.pt.fmt is mmu.V3 and iface.pt.entries == 2 and iface.heap.holes[-1][1] == gb.gpu.meta.gspFwRsvdStart
    cot = gb.gpu.cot
    assert (cot.version, cot.size, cot.frtsVidmemOffset, cot.frtsVidmemSize) == (2, 860, boot_fsp.FRTS_FROM_END, 1 << 20)
  finally: iface.close()
  assert [f for f, _ in gb.gpu.gsp.received][-1] == msgq.Function.UNLOADING_GUEST_DRIVER
  assert iface.released == ["bus mastering off", "reset", "disabled", "bound back to nvidia"]


@pytest.mark.parametrize("garble,why", [
  (lambda p: struct.pack("<I", fsp.SOM) + p[4:], "MCTP header 0x80000000: not one packet"),
  (lambda p: p[:4] + struct.pack("<I", fsp.nvdm_header(fsp.NVDM_RESPONSE)) + p[8:], "not a vendor-PCI NVIDIA COT message"),
  (lambda p: p[:-64], "a COT payload of 796 bytes, not 860"),
  (lambda p: p[:8] + struct.pack("<H", 1) + p[10:], "COT version 1 size 860"),
])
def test_a_malformed_cot_message_is_refused_by_the_fsp(gb, monkeypatch, garble, why) -> None:
  real = fsp.packet
  monkeypatch.setattr(fsp, "packet", lambda t, payload: garble(real(t, payload)))
  e = failing(gb)
  assert e.step == "sending the chain-of-trust message to the FSP" and not e.timed_out
  assert "refused it with error 0xa1 (FSP_ERR_IFS_ERR_INVALID_DATA)" in e.message and e.reason == "FSP error 0xa1"
  assert gb.gpu.violations == [next(v for v in gb.gpu.violations if why in v)] and gb.gpu.gsp is None


def test_an_fsp_that_never_answers_times_out_with_its_queues(gb) -> None:
  gb.gpu.fsp_silent = True
  e = failing(gb)
  assert e.timed_out and e.step == "sending the chain-of-trust message to the FSP" and "the FSP's reply did not happen within 0.3 s" in e.message
  assert "message queue head/tail 0x0/0x0" in e.reason and gb.gpu.violations == []


def test_an_fsp_error_response_is_typed_with_its_code(gb) -> None:
  gb.gpu.fsp_error = 0x9F
  e = failing(gb)
  assert not e.timed_out and e.reason == "FSP error 0x9f" and "FSP_ERR_IFR_FILE_NOT_FOUND" in e.message and "firmware files" in e.hint


def test_an_fsp_boot_that_never_completes_times_out_with_its_scratch(gb) -> None:
  gb.gpu.regs[fsp.I2CS_SCRATCH] = 0
  gb.gpu.regs[fsp.SCRATCH_GROUP_2] = 0xDEAD
  e = failing(gb, reset=False)
  assert e.timed_out and e.step == "waiting for the FSP's boot" and "FSP scratch group 2: 0xdead, 0x0, 0x0, 0x0" in e.reason
  assert gb.gpu.responses == []


def test_an_fmc_error_in_the_gsp_mailbox_stops_the_boot(gb) -> None:
  gb.gpu.fmc_error = 0x21
  e = failing(gb)
  assert e.step == "waiting for the FSP to boot the GSP FMC" and "mailbox 0 = 0x21" in e.message and e.reason == "FMC error 0x21"


def test_the_fsp_needs_bus_mastering(gb, monkeypatch) -> None:
  monkeypatch.setattr("plugrt_nv_pci.sysfs.PCIFunction.bus_master", lambda self: None)
  e = failing(gb)
  assert "error 0x9e (FSP_ERR_IFS_ERR_INVALID_STATE)" in e.message
  assert gb.gpu.violations == ["the FSP read host memory with bus mastering off"]


def test_a_wrong_wpr_request_is_refused(gb, monkeypatch) -> None:
  """The booter flow's full WPR layout handed to the FSP flow: the FMC lays the region out itself and refuses it."""
  monkeypatch.setattr(boot_fsp, "wpr_request", lambda v, b, i: fake_nvpci.boot.wpr_layout(512 << 20, b, i))
  e = failing(gb)
  assert "FSP_ERR_IFS_ERR_INVALID_DATA" in e.message
  assert gb.gpu.violations == ["the WPR metadata is not a request of sizes for the FMC to lay out"]


def test_missing_and_malformed_fmc_files(gb) -> None:
  path = os.path.join(gb.fw_root, "nvidia/gb202/gsp", f"fmc-{GSP_VERSION}.bin")
  os.rename(path, path + ".gone")
  e = failing(gb, MissingFirmware, reset=False)
  assert e.path == path and e.package == "firmware-nvidia-graphics" and "the GSP FMC" in e.message
  fmc = dict(gb.firmware.fmc, signature=bytes(384))   # Hopper's signature size, not GB20x's
  with open(path, "wb") as f: f.write(fake_nvpci_gb.elf32(fmc))
  with pytest.raises(FirmwareError, match="its signature is 384 bytes, the FSP takes 96"): open_gb(gb)
  del fmc["publickey"]
  with open(path, "wb") as f: f.write(fake_nvpci_gb.elf32(fmc))
  with pytest.raises(FirmwareError, match="has no section publickey"): open_gb(gb)
  assert gb.gpu.responses == []


def test_fmc_file_sections_are_read_from_its_elf32_layout(gb) -> None:
  data = gb.firmware.files["fmc"]
  assert data[4] == 1  # ELFCLASS32, as extract-firmware-nouveau.py writes it
  parts = firmware.fmc(data, "fmc.bin", {"hash": 48, "signature": 96, "publickey": 97})
  assert (parts.image, parts.hash384, parts.signature, parts.public_key) == tuple(gb.firmware.fmc[k] for k in ("image", "hash", "signature",
                                                                                                              "publickey"))


def test_cot_payload_layout() -> None:
  """NVDM_PAYLOAD_COT is packed: the fields at the offsets kern_fsp_cot_payload.h gives them."""
  offsets = {f: getattr(fsp.CotPayload, f).offset for f, _ in fsp.CotPayload._fields_}
  assert offsets == {"version": 0, "size": 2, "gspFmcSysmemOffset": 4, "frtsSysmemOffset": 12, "frtsSysmemSize": 20, "frtsVidmemOffset": 24,
                     "frtsVidmemSize": 32, "hash384": 36, "publicKey": 84, "signature": 468, "gspBootArgsSysmemOffset": 852}
  p = fsp.cot_payload(0x1000, 0x2000, 0x1C00000, 1 << 20, b"h" * 48, b"k" * 97, b"s" * 96)
  raw = bytes(p)
  assert raw[36:84] == b"h" * 48 and raw[84:181] == b"k" * 97 and raw[181:468] == bytes(287) and raw[468:564] == b"s" * 96
  with pytest.raises(ValueError, match="signature is 384 bytes; the FSP of GB20x takes 96"):
    fsp.cot_payload(0, 0, 0, 0, b"h" * 48, b"k" * 97, b"s" * 384)
  assert ctypes.sizeof(boot_fsp.GspFmcBootParams) == 80 and boot_fsp.GspFmcBootParams.gspRmParams.offset == 40


def test_v3_page_tables_translate_as_the_mmu_reads_them() -> None:
  """plugrt's MMU v3 tables (57-bit VA, six levels), read back by the fake's independent walker."""
  vram = fake_nvpci.FakeVRAM(64)
  try:
    pt = mmu.PageTables(VASpace(16 << 20, 64 << 20), vram.write, lambda: None, mmu.V3)
    va, high = 0x10_0000_0000, (1 << 56) + (3 << 47) + 0x2000   # the second PDE4 entry
    pt.map(va, [0x100000, 0x300000], mmu.APERTURE_VIDEO)
    pt.map(high, [0x4_0000_3000], mmu.APERTURE_SYSTEM, volatile=True)
    walk = lambda a: fake_nvpci.translate(vram, pt.root, a, 3)
    assert [walk(va + 0x10), walk(va + 0x1FFF), walk(high + 4)] == [(0, 0x100010), (0, 0x300FFF), (2, 0x4_0000_3004)]
    assert walk(va + 0x2000) is None
    assert pt.entries == 2 and len(pt.tables) == 1 + 2 * 5
    with pytest.raises(ValueError, match="outside the 57-bit VA"): pt.map(1 << 57, [0], mmu.APERTURE_VIDEO)
  finally: vram.close()
