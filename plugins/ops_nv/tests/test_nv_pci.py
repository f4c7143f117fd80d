"""plugrt-nv-pci against fake sysfs trees, fake firmware files and a fake GPU behind BAR0 (fake_nvpci.py): the probe,
the acknowledgement, take and give back, the chip table, the firmware files, the pre-boot checks, the GSP's arguments
and WPR layout, where the open path stops (FWSEC-FRTS), and, driven directly, the booter on SEC2, the CPU sequencer,
GSP_INIT_DONE and RPCs over the message queues, with the typed error of each way they fail."""
from __future__ import annotations

import os
import struct

import fake_nvpci
import fake_nvpci_board
import numpy as np
import pytest
from fake_nvpci import ADA, AMPERE, BLACKWELL, BOOTER_FAILED, HOPPER, FakeBAR0, FakeDMA, FakeFirmware, KernelWrites, make_sysfs

import plugrt_nv_pci
from plugrt import Buffer, dtypes
from plugrt.compiler import samples as K
from plugrt.context import DeviceInfo, PluginContext
from plugrt.errors import DeviceUnavailable, EnvError
from plugrt_nv.iface import NVError
from plugrt_nv_nvk.nvk import VASpace
from plugrt_nv_pci import boot, mmu, msgq, rpc
from plugrt_nv_pci.chips import GSP_VERSION, decode_boot42
from plugrt_nv_pci.errors import AcknowledgementRequired, FirmwareError, GSPError, MalformedRPC, MissingFirmware, RPCError
from plugrt_nv_pci.sysfs import PCIFunction
from plugrt_nvidia_toolchain import ptxas

A, B, H = "0000:01:00.0", "0000:02:00.0", "0000:18:00.0"


def info(index: int = 0, **env: str) -> DeviceInfo:
  return DeviceInfo("NV", index, "PTX", "PCI", context=PluginContext(env))


class Rig:
  """A fake tree with the given GPUs, firmware for ga102 and ad102, and a fake GPU per BOOT_42 for the BAR seam."""

  def __init__(self, tmp_path, gpus: list[tuple[str, int, str]], boot42: int, firmware: bool = True):
    self.devices, self.drivers = make_sysfs(str(tmp_path / "sys"), gpus)
    self.kernel = KernelWrites(self.devices)
    self.fw_root = str(tmp_path / "fw")
    self.fw = {c: FakeFirmware(self.fw_root, c) for c in ("ga102", "ad102")} if firmware else {}
    self.dma = FakeDMA()
    chip = {0x17: "ga102", 0x19: "ad102"}.get(boot42 >> 24)
    self.gpu = FakeBAR0(boot42, self.dma, self.fw.get(chip), config=os.path.join(self.devices, gpus[0][0], "config"), pci_address=gpus[0][0])
    self.mapped: list[int] = []

  def bars(self, fn, index):
    self.mapped.append(index)
    return self.gpu.vram if index == 1 else self.gpu

  def open(self, index: int = 0, **env: str):
    env = {"PLUGRT_NV_FIRMWARE": self.fw_root, "PLUGRT_NV_BOOT_TIMEOUT": "0.3", **env}
    return plugrt_nv_pci.open_pci(info(index, **env), self.devices, self.drivers, self.kernel, bars=self.bars, dma=lambda d: self.dma)


def test_probe_lists_candidates_by_generation_and_touches_nothing(tmp_path) -> None:
  rig = Rig(tmp_path, [(A, AMPERE[0], "nvidia"), (B, ADA[0], ""), (H, HOPPER[0], "nvidia")], AMPERE[1])
  before = sorted(os.walk(rig.devices))
  p = plugrt_nv_pci.probe_tree(rig.devices)
  assert p.ok and p.count == 2, p
  for part in (f"{A} (device 0x2204, Ampere GA10x, driver nvidia; bound to nvidia: opening takes it from every program that uses it; "
               "host memory through /proc/self/pagemap (no IOMMU translates its DMA))",
               f"{B} (device 0x2684, Ada AD10x, driver none; host memory through /proc/self/pagemap",
               f"{H} (device 0x2335, Hopper GH100", "Hopper (GH100) is not in the seeds' PCI list",
               "needs PLUGRT_NV_ALLOW_UNBIND=1", "never run on hardware", "tested end to end against fake GPUs only",
               "Blackwell GB20x, whose FSP boot has never met a real FSP"):
    assert part in p.detail, (part, p.detail)
  assert "0000:09:00.0" not in p.detail  # the AMD GPU beside them
  assert sorted(os.walk(rig.devices)) == before and rig.kernel.log == []
  only_h = Rig(tmp_path / "h", [(H, HOPPER[0], "nvidia")], HOPPER[1])
  p = plugrt_nv_pci.probe_tree(only_h.devices)
  assert not p.ok and "none is a GPU this interface boots" in p.detail and "bound to nvidia" in p.detail
  assert not plugrt_nv_pci.probe_tree(str(tmp_path / "nothing")).ok


def test_never_automatic() -> None:
  (spec,) = plugrt_nv_pci.plugrt_interfaces()
  assert spec.auto is False and spec.name == "PCI" and spec.device == "NV" and "never run on hardware" in spec.description


def test_without_acknowledgement_nothing_is_unbound(tmp_path) -> None:
  rig = Rig(tmp_path, [(A, AMPERE[0], "nvidia")], AMPERE[1])
  with pytest.raises(AcknowledgementRequired, match=r"PLUGRT_NV_ALLOW_UNBIND=1 is not set; 0000:01:00\.0 is bound to nvidia"):
    rig.open()
  with pytest.raises(AcknowledgementRequired): rig.open(PLUGRT_NV_ALLOW_UNBIND="0")
  with pytest.raises(EnvError, match="not an acknowledgement"): rig.open(PLUGRT_NV_ALLOW_UNBIND="yes")
  assert rig.kernel.log == [] and rig.mapped == [] and os.path.islink(os.path.join(rig.devices, A, "driver"))


def test_a_gpu_outside_the_table_is_refused_before_anything(tmp_path) -> None:
  rig = Rig(tmp_path, [(H, HOPPER[0], "nvidia")], HOPPER[1])
  with pytest.raises(DeviceUnavailable, match=r"Hopper \(GH100\) is not in the seeds' PCI list"): rig.open(PLUGRT_NV_ALLOW_UNBIND="1")
  with pytest.raises(DeviceUnavailable, match=r"1 NVIDIA GPU function\(s\) on PCI"): rig.open(1, PLUGRT_NV_ALLOW_UNBIND="1")
  assert rig.kernel.log == [] and rig.mapped == []


@pytest.mark.parametrize("gpu,chip,objects", [
  (AMPERE, "GA102", "RM objects over RPC (Ampere: compute 0xc7c0, copy 0xc7b5, channel 0xc56f; sm_86, 82 SMs)"),
  (ADA, "AD102", "RM objects over RPC (Ada: compute 0xc9c0, copy 0xc7b5, channel 0xc56f; sm_89, 128 SMs)")])
def test_open_boots_gsp_rm_makes_the_rm_objects_and_close_gives_the_gpu_back(tmp_path, gpu, chip, objects) -> None:
  rig = Rig(tmp_path, [(A, gpu[0], "nvidia")], gpu[1])
  iface = rig.open(PLUGRT_NV_ALLOW_UNBIND="1")
  try:
    done = iface.rec.so_far()
    for part in (f"chip {chip}", "GFW boot complete", "WPR2 down", "512 MiB of VRAM", f"firmware {GSP_VERSION} read", "GSP arguments in host memory",
                 "GSP_SET_SYSTEM_INFO and SET_REGISTRY queued", "FWSEC-FRTS ran (ucode 2, FRTS at 510 MiB), WPR2 up", "booter_load ran on SEC2",
                 "GSP-RM up (CPU sequencer ran 2 commands)", "BAR1 in physical mode", "GSP-RM's golden context", objects):
      assert part in done, (part, done)
    assert rig.gpu.violations == [] and rig.gpu.vram.violations == [] and rig.gpu.gsp.errors == [] and rig.gpu.booter_ok
    calls = [c[:2] for c in rig.gpu.gsp.rm.calls]
    # the golden context on the internal client first, then the device's client, its VA space and page directory
    assert calls[:5] == [("alloc", 0), ("alloc", 0x80), ("alloc", 0x2080), ("alloc", 0x90F1), ("control", rpc.CTRL_DEVICE_INFO_TABLE)]
    assert calls.index(("control", rpc.CTRL_PROMOTE_CTX)) < calls.index(("alloc", iface.classes.compute))
    assert calls[-1] == ("rpc", msgq.Function.SET_PAGE_DIRECTORY) and iface.description.endswith("never run on hardware")
    with open(os.path.join(rig.devices, A, "config"), "rb") as f: assert f.read(6)[4] & 4  # bus mastering on while open
  finally: iface.close()
  assert [f for f, _ in rig.gpu.gsp.received][-1] == msgq.Function.UNLOADING_GUEST_DRIVER
  assert rig.kernel.log == [(f"devices/{A}/driver/unbind", A), (f"devices/{A}/enable", "1"), (f"devices/{A}/reset", "1"),
                            (f"devices/{A}/enable", "0"), ("drivers/nvidia/bind", A)]
  assert iface.released == ["bus mastering off", "reset", "disabled", "bound back to nvidia"]
  with open(os.path.join(rig.devices, A, "config"), "rb") as f: assert not f.read(6)[4] & 4
  assert rig.mapped == [0, 1] and os.path.islink(os.path.join(rig.devices, A, "driver"))


def test_a_failing_fwsec_is_a_typed_error_and_the_gpu_is_reset(tmp_path) -> None:
  rig = Rig(tmp_path, [(A, AMPERE[0], "nvidia")], AMPERE[1])
  rig.gpu.regs[fake_nvpci.vbios.FUSE_GSP_UCODE1_VERSION + 4] = 0b1  # ucode version 1: the first signature, which the fake FWSEC refuses
  with pytest.raises(GSPError, match=r"FWSEC-FRTS did not set up WPR2 \(FRTS error code 0xbad") as e: rig.open(PLUGRT_NV_ALLOW_UNBIND="1")
  assert e.value.step == "running FWSEC-FRTS on the GSP's falcon" and "released: bus mastering off, reset, disabled, bound back" in str(e.value)
  assert rig.gpu.violations == ["the GSP falcon's DMEM is not FWSEC's data patched for FRTS"]
  rig.gpu.regs[fake_nvpci.vbios.FUSE_GSP_UCODE1_VERSION + 4] = 0b10  # version 2: no signature for it in the VBIOS
  with pytest.raises(GSPError, match="has no signature for ucode version 2"): rig.open(PLUGRT_NV_ALLOW_UNBIND="1")


def test_an_unreadable_vbios_is_a_typed_error(tmp_path) -> None:
  rig = Rig(tmp_path, [(A, AMPERE[0], "")], AMPERE[1])
  rig.gpu.rom.rom = bytes(0x100)
  with pytest.raises(GSPError, match="the VBIOS's FWSEC tables are not readable: no expansion-ROM signature at 0x0"):
    rig.open(PLUGRT_NV_ALLOW_UNBIND="1")


def test_missing_firmware_names_the_file_and_package(tmp_path) -> None:
  rig = Rig(tmp_path, [(A, AMPERE[0], "")], AMPERE[1], firmware=False)
  with pytest.raises(MissingFirmware) as e: rig.open(PLUGRT_NV_ALLOW_UNBIND="1")
  assert e.value.path == os.path.join(rig.fw_root, "nvidia/ga102/gsp", f"gsp-{GSP_VERSION}.bin") and e.value.package == "firmware-nvidia-graphics"
  assert "apt-get install firmware-nvidia-graphics" in e.value.hint and "released: bus mastering off, disabled" in str(e.value)
  FakeFirmware(rig.fw_root, "ga102")
  with open(os.path.join(rig.fw_root, "nvidia/ga102/gsp", f"gsp-{GSP_VERSION}.bin"), "wb") as f: f.write(b"not an elf")
  with pytest.raises(FirmwareError, match="is not a little-endian ELF file"): rig.open(PLUGRT_NV_ALLOW_UNBIND="1")


def test_a_truncated_booter_is_a_firmware_error(tmp_path) -> None:
  rig = Rig(tmp_path, [(A, AMPERE[0], "")], AMPERE[1])
  path = os.path.join(rig.fw_root, "nvidia/ga102/gsp", f"booter_load-{GSP_VERSION}.bin")
  with open(path, "r+b") as f: f.truncate(80)
  with pytest.raises(FirmwareError, match="booter_load"): rig.open(PLUGRT_NV_ALLOW_UNBIND="1")


def test_preboot_failures_are_typed(tmp_path) -> None:
  rig = Rig(tmp_path, [(A, AMPERE[0], "nvidia")], AMPERE[1])
  rig.gpu.regs[boot.WPR2_ADDR_HI] = 0x1234
  with pytest.raises(GSPError, match="a GSP already runs on this GPU") as e: rig.open(PLUGRT_NV_ALLOW_UNBIND="1")
  assert e.value.step == "checking that no GSP runs" and not e.value.timed_out and "bound back to nvidia" in str(e.value)
  rig.gpu.regs[boot.WPR2_ADDR_HI] = 0
  rig.gpu.regs[boot.SCRATCH_05_0] = 0x7F
  with pytest.raises(GSPError, match=r"the GFW boot-complete mark did not happen within 0\.3 s") as e: rig.open(PLUGRT_NV_ALLOW_UNBIND="1")
  assert e.value.timed_out and "0x118234 = 0x0000007f" in e.value.reason
  rig.gpu.regs[0xA00] = 0x17 << 24 | 9 << 20
  with pytest.raises(DeviceUnavailable, match="names a chip plugrt-nv-pci does not know"): rig.open(PLUGRT_NV_ALLOW_UNBIND="1")


def test_blackwell_is_identified_by_its_boot42() -> None:
  chip = decode_boot42(BLACKWELL[1])
  assert (chip.name, chip.generation.boot, chip.generation.mmu, chip.firmware_dir) == ("GB202", "fsp", 3, "nvidia/gb202/gsp")
  assert chip.signature_section == ".fwsignature_gb20x"  # its FSP boot: test_nv_pci_fsp.py


# ---- the GSP's arguments, the booter and GSP-RM, driven directly (the open path reaches them once FWSEC-FRTS is built)

def booted(tmp_path, gpu=AMPERE, wpr2: bool = True, tamper=None):
  rig = Rig(tmp_path, [(A, gpu[0], "")], gpu[1])
  PCIFunction(A, rig.devices, rig.drivers, rig.kernel).bus_master()  # what open_pci does after taking the function
  rec = boot.Record("NV through PCI")
  chip = boot.identify(rig.gpu, rec)
  fw = boot.load_firmware(rig.fw_root, chip, rec)
  args = boot.build_args(rig.dma, fw, boot.preboot_checks(rig.gpu, rec, 1.0), rec)
  if tamper is not None: tamper(args, fw)
  if wpr2: rig.gpu.regs[boot.WPR2_ADDR_HI] = 1  # what FWSEC-FRTS leaves
  return rig, rec, fw, args


def start(rig, args, fw, rec, timeout: float):
  """boot.start_gsp on the rig, with GSP_SET_SYSTEM_INFO and SET_REGISTRY queued as open_pci queues them."""
  return boot.start_gsp(rig.gpu, rig.gpu.vram.write, args, fw, rec, timeout, booter_at=1 << 20, before=fake_nvpci.init_messages(rig.gpu))


def test_wpr_layout_follows_the_driver_arithmetic() -> None:
  m = boot.wpr_layout(24 << 30, 0x3000, 0x2800000)
  assert m.gspFwHeapSize == 0x8100000  # 22 + 8 + 3 (96 KiB x 24 GiB) + 96 MiB: what the driver gives a 24 GiB GA102
  assert m.frtsOffset == (24 << 30) - (2 << 20) and m.gspFwWprEnd == m.frtsOffset + m.frtsSize == m.vgaWorkspaceOffset
  assert m.gspFwRsvdStart == m.nonWprHeapOffset == m.gspFwWprStart - (1 << 20) and m.gspFwOffset % 0x10000 == 0


@pytest.mark.parametrize("gpu", [AMPERE, ADA])
def test_booter_starts_gsp_rm_which_runs_the_sequencer_and_answers_rpcs(tmp_path, gpu) -> None:
  rig, rec, fw, args = booted(tmp_path, gpu)
  try:
    q = start(rig, args, fw, rec, 2.0)
    assert rig.gpu.violations == [] and rig.gpu.booter_ok and rig.gpu.gsp.errors == []
    assert rig.gpu.regs[0x1E0000] == 0x1234 and "GSP-RM up (CPU sequencer ran 2 commands)" in rec.so_far()
    # an RPC and its reply; a payload larger than one message goes out with continuation records and arrives whole
    echo = msgq.Function.ALLOC_MEMORY  # the fake answers a function it does not model with the payload it got
    assert q.call(echo, b"abc" * 4, "a call") == b"abc" * 4
    with pytest.raises(RPCError, match="the GSP found the message malformed"): q.call(msgq.Function.GSP_RM_CONTROL, b"abc", "a control")
    big = bytes(range(256)) * 400
    q.send(msgq.Function.SET_REGISTRY, big)
    rig.gpu.gsp.handlers[msgq.Function.GSP_RM_ALLOC] = lambda p: (0x1F, p)  # NV_ERR_INVALID_ARGUMENT
    with pytest.raises(RPCError, match=r"answered GSP_RM_ALLOC with NV_ERR_INVALID_ARGUMENT \(0x1f\)") as e: q.call(msgq.Function.GSP_RM_ALLOC, b"x")
    assert e.value.status == 0x1F and e.value.function == msgq.Function.GSP_RM_ALLOC
    assert (msgq.Function.SET_REGISTRY, big) in rig.gpu.gsp.received and rig.gpu.gsp.errors == []
    # a reply whose checksum does not add up: that call and every later one fail, typed
    rig.gpu.gsp.corrupt = True
    with pytest.raises(MalformedRPC, match="checksum of ALLOC_MEMORY does not add up"): q.call(echo, b"y")
    with pytest.raises(MalformedRPC, match="unreadable since status queue element"): q.call(echo, b"y")
  finally: rig.gpu.close()


def test_a_gsp_that_stops_answering_times_out_with_the_queue_positions(tmp_path) -> None:
  rig, rec, fw, args = booted(tmp_path)
  try:
    q = start(rig, args, fw, rec, 2.0)
    rig.gpu.gsp.silent = True
    q.timeout = 0.2
    with pytest.raises(GSPError, match=r"did not answer GSP_RM_CONTROL within 0\.2 s") as e:
      q.call(msgq.Function.GSP_RM_CONTROL, b"z", "a control")
    assert e.value.timed_out and e.value.step == "a control" and "status queue write pointer" in e.value.reason
  finally: rig.gpu.close()


def test_rm_refusals_over_rpc_are_typed_with_their_status(tmp_path) -> None:
  """What GSP-RM refuses comes back as an RPCError with the NV_STATUS (or RPC result) name, never as a handle."""
  rig, rec, fw, args = booted(tmp_path)
  try:
    r = rpc.RM(start(rig, args, fw, rec, 2.0))
    objs = rpc.open_objects(r)
    assert objs.classes.compute == 0xC7C0 and objs.gr["gpcs"] == 7 and objs.sm_version == 0x806
    with pytest.raises(RPCError, match="NV_ERR_INVALID_PARAM_STRUCT") as e: r.alloc(objs.root, 0x80, rpc.rm.SUBDEVICE_PARAMS(), "a device")
    assert e.value.status == 0x3A and e.value.function == msgq.Function.GSP_RM_ALLOC
    with pytest.raises(RPCError, match="an object with that handle exists already"): r.alloc(objs.device, 0x2080, rpc.rm.SUBDEVICE_PARAMS(),
                                                                                          handle=objs.subdevice)
    with pytest.raises(RPCError, match="NV_ERR_INVALID_OBJECT_PARENT"): r.alloc(objs.root, 0x2080, rpc.rm.SUBDEVICE_PARAMS(), "a subdevice")
    with pytest.raises(RPCError, match=r"NV_ERR_NOT_SUPPORTED \(0x56\)"): r.control(objs.subdevice, 0x20801201, rpc.rm.GR_INFO_PARAMS(), "GR info")
  finally: rig.gpu.close()


def test_booter_without_wpr2_fails_with_its_mailbox(tmp_path) -> None:
  rig, rec, fw, args = booted(tmp_path, wpr2=False)
  with pytest.raises(GSPError, match=f"booter_load failed on SEC2: mailbox 0 = {BOOTER_FAILED:#x}") as e:
    start(rig, args, fw, rec, 1.0)
  assert e.value.step == "running booter_load on SEC2" and "FWSEC-FRTS" in e.value.hint
  assert rig.gpu.violations == ["booter_load ran with WPR2 down (FWSEC-FRTS has not run)"]


def test_a_broken_radix3_table_is_caught_by_the_booter(tmp_path) -> None:
  def tamper(args, fw):  # the last level's first two entries swapped: every page is there, two in the wrong place
    first, second = args.radix3.pages[3:5]
    args.radix3.write(2 * 4096, struct.pack("<QQ", second, first))
  rig, rec, fw, args = booted(tmp_path, tamper=tamper)
  with pytest.raises(GSPError, match="booter_load failed"): start(rig, args, fw, rec, 1.0)
  assert rig.gpu.violations == ["the radix-3 table does not resolve to the GSP image"]


def test_a_gsp_that_never_starts_its_queue_times_out(tmp_path, monkeypatch) -> None:
  rig, rec, fw, args = booted(tmp_path)
  monkeypatch.setattr("fake_nvpci.FakeGSP.start", lambda self: None)  # the booter succeeds, GSP-RM never comes up
  with pytest.raises(GSPError, match=r"did not set up its status queue within 0\.3 s") as e:
    start(rig, args, fw, rec, 0.3)
  assert e.value.timed_out and e.value.step == "waiting for GSP-RM's status queue"


def test_an_unknown_sequencer_opcode_is_refused(tmp_path) -> None:
  rig, *_ = booted(tmp_path)
  seq = boot.Sequencer(rig.gpu, None, None, 0, 0.1)  # type: ignore[arg-type]
  with pytest.raises(GSPError, match="sent opcode 42"): seq.run(struct.pack("<II8I", 8, 1, *[0] * 8) + struct.pack("<I", 42))
  with pytest.raises(GSPError, match="REG_POLL is cut short"): seq.run(struct.pack("<II8I", 8, 3, *[0] * 8) + struct.pack("<3I", 2, 0x100, 1))
  rig.gpu.regs[0x100] = 0
  with pytest.raises(GSPError, match=r"register 0x100 to read 0x1 under mask 0x1 \(GSP sequencer error 7\)") as e:
    seq.run(struct.pack("<II8I", 8, 6, *[0] * 8) + struct.pack("<6I", 2, 0x100, 1, 1, 5, 7))
  assert e.value.timed_out


def test_page_tables_translate_as_the_mmu_reads_them() -> None:
  """plugrt's MMU v2 tables, read back by the fake's independent walker: video and system pages where they were put,
  nothing after unmapping, each table made once, the TLBs invalidated after each change."""
  vram = fake_nvpci.FakeVRAM(64)
  flushes = []
  pt = mmu.PageTables(VASpace(16 << 20, 64 << 20), vram.write, lambda: flushes.append(1))
  va, far = 0x10_0000_0000, 0x10_0000_0000 + (1 << 30) + (5 << 21)   # another PDE1 entry: its own PDE0 and PTE tables
  pt.map(va, [0x100000, 0x300000, 0x101000], mmu.APERTURE_VIDEO)
  pt.map(far, [0x4_0000_3000, 0x4_0000_9000], mmu.APERTURE_SYSTEM, volatile=True)
  walk = lambda a: fake_nvpci.translate(vram, pt.root, a)
  assert [walk(va + 0x10), walk(va + 0x1FFF), walk(va + 0x2000)] == [(0, 0x100010), (0, 0x300FFF), (0, 0x101000)]
  assert [walk(far), walk(far + 0x1004)] == [(2, 0x4_0000_3000), (2, 0x4_0000_9004)] and walk(va + 0x3000) is None
  assert len(pt.tables) == 1 + 1 + 1 + 2 + 2 and len(flushes) == 2 and pt.entries == 4  # one PDE2 and PDE1 table, two PDE0 and PTE tables
  pt.unmap(va, 2)
  assert walk(va) is None and walk(va + 0x2000) == (0, 0x101000) and len(flushes) == 3
  with pytest.raises(ValueError, match="outside the 49-bit VA"): pt.map(1 << 49, [0], mmu.APERTURE_VIDEO)


def test_message_checksum_zeroes_the_element() -> None:
  msg = msgq.pack_message(msgq.Function.GSP_RM_ALLOC, b"\x01\x02\x03", 5)
  _, _, _, seq, n = msgq.ELEMENT.unpack_from(msg)
  assert (seq, n, len(msg)) == (5, 1, msgq.MSG_SIZE) and msgq.checksum(msg[:0x50 + 3]) == 0
  assert msgq.RPC.unpack_from(msg, 0x30)[:5] == (3 << 24, 0x43505256, 0x23, 103, 0xFFFFFFFF)


# ---- NV through PCI end to end on the fake, and the typed error of each way the RM bring-up fails ---------------------

@pytest.fixture(params=["ga102", "ad102", "gb202"])
def nv_pci(request, plugrt_registry):
  """(the fake PCI GPU, plugrt-nv's device opened on it through plugrt-nv-pci) in a registry of NV and PYTHON."""
  if ptxas.path(os.environ) is None: pytest.skip("ptxas is not installed (pip install nvidia-cuda-nvcc)")
  fake = fake_nvpci_board.FakePCINV(request.param)
  try:
    with plugrt_registry(fake_nvpci_board.fake_pci_plugins(fake), env={**fake.env(), "PLUGRT_CACHE": "0"}) as reg: yield fake, reg.open("NV")
  finally: fake.shutdown()


def test_nv_through_pci_runs_kernels_and_copies_behind_the_page_tables(nv_pci) -> None:
  """The NV device on the PCIInterface: its command stream runs on fake_gpu's engine, which reaches memory only through
  the page tables plugrt wrote (VRAM through BAR1's memory file, host pages through their bus addresses); each channel
  is rung with the token GSP-RM gave it, runlist included."""
  fake, dev = nv_pci
  n = 3000
  x = np.arange(n, dtype=np.float32)
  out, xb, yb = Buffer(dev, n, dtypes.float32), Buffer.from_numpy(x, dev), Buffer.from_numpy(2 * x, dev)
  prg = dev.program(K.saxpy_kernel())
  prg(out, xb, yb, global_size=(12, 1, 1), local_size=(256, 1, 1), vals=(3.0, n), wait=True)
  assert np.array_equal(out.numpy(), 5 * x)
  c = Buffer(dev, n, dtypes.float32)
  out.copy_to(c)
  assert np.array_equal(c.numpy(), 5 * x)
  (engine,) = fake.gpu.engines.values()
  iface = dev.info.state.iface
  assert engine.runner.runs[-1] == ("saxpy", (12, 1, 1), (256, 1, 1)) and engine.root == iface.pt.root
  assert engine.doorbells == {t for t in fake.gpu.gsp.rm.tokens} and all(t >> 16 == 1 for t in engine.doorbells)  # GR0's runlist
  assert fake.gpu.tlb_flushes > 0 and fake.violations() == []
  for b in (out, xb):  # a buffer's GPU address is where the CPU sees it: VRAM (device memory) at its heap address
    assert fake_nvpci.translate(fake.gpu.vram, iface.pt.root, b.handle, iface.pt.fmt.version)[0] == mmu.APERTURE_VIDEO


def test_a_kernel_fault_is_gsp_rms_rc_event(nv_pci) -> None:
  """A dispatch the engine refuses (an access past its buffer) faults the channel; the fake GSP-RM reports it as
  RC_TRIGGERED (Xid 13) and an error log, which the launch's wait turns into an NVError, as for a real fault."""
  dev = nv_pci[1]
  prg = dev.program(K.saxpy_kernel())
  a = Buffer(dev, 4, dtypes.float32)
  with pytest.raises(NVError, match="Xid 13: graphics engine exception") as e:
    prg(a, a, a, global_size=(1 << 12, 1, 1), local_size=(256, 1, 1), vals=(1.0, 1 << 30), wait=True)
  assert not e.value.timed_out and "InterpreterError" in e.value.reason


def open_failing(tmp_path, monkeypatch, **env):
  rig = Rig(tmp_path, [(A, AMPERE[0], "nvidia")], AMPERE[1])
  with pytest.raises(Exception) as e: rig.open(PLUGRT_NV_ALLOW_UNBIND="1", **env)
  assert rig.kernel.log[-3:] == [(f"devices/{A}/reset", "1"), (f"devices/{A}/enable", "0"), ("drivers/nvidia/bind", A)]  # given back, reset
  return rig, e


def channels_refused(tmp_path) -> RPCError:
  """Open through PCI, then the channels (what the NV device asks first): the RPCError GSP-RM answers; closed after."""
  rig = Rig(tmp_path, [(A, AMPERE[0], "nvidia")], AMPERE[1])
  iface = rig.open(PLUGRT_NV_ALLOW_UNBIND="1")
  try:
    with pytest.raises(RPCError) as e: iface.channels(64)
  finally: iface.close()
  assert iface.released[-1] == "bound back to nvidia"
  return e.value


def test_a_channel_before_its_page_directory_is_gsp_rms_refusal(tmp_path, monkeypatch) -> None:
  """A wrong step: a channel on a VA space whose page directory GSP-RM was never given: NV_ERR_INVALID_STATE, typed."""
  monkeypatch.setattr(rpc.RM, "set_page_directory", lambda self, *a: None)
  e = channels_refused(tmp_path)
  assert e.status == 0x40 and e.message == "allocating the compute channel over RPC: the GSP answered GSP_RM_ALLOC with NV_ERR_INVALID_STATE (0x40)"


def test_a_compute_object_without_the_golden_context_is_refused(tmp_path, monkeypatch) -> None:
  monkeypatch.setattr("plugrt_nv_pci.gpu.PCIInterface._golden_context", lambda self: setattr(self, "runlists", {1: 1}))
  e = channels_refused(tmp_path)
  assert e.status == 0x40 and e.message.startswith("allocating the compute engine object over RPC: the GSP answered GSP_RM_ALLOC with "
                                                   "NV_ERR_INVALID_STATE")


def test_gsp_rm_without_its_system_info_never_finishes_init(tmp_path, monkeypatch) -> None:
  """A wrong step before the boot: GSP_SET_SYSTEM_INFO malformed; GSP-RM's init logs why and never says GSP_INIT_DONE."""
  monkeypatch.setattr(rpc, "system_info_of", lambda fn: bytes(100))
  e = open_failing(tmp_path, monkeypatch)[1]
  assert isinstance(e.value, GSPError) and e.value.timed_out and e.value.step == "waiting for GSP_INIT_DONE"
  assert "GSP-RM's error log: GSP_SET_SYSTEM_INFO of 100 bytes, not 928" in str(e.value)


def test_a_malformed_reply_is_a_typed_error(tmp_path, monkeypatch) -> None:
  """GSP-RM answering a control with fewer bytes than its header: MalformedRPC naming the step."""
  real = fake_nvpci.FakeRM.control
  monkeypatch.setattr(fake_nvpci.FakeRM, "control", lambda self, p: (0, b"xx") if rpc.CONTROL_HEADER.unpack_from(p)[2] == rpc.CTRL_DEVICE_INFO_TABLE
                      else real(self, p))
  e = open_failing(tmp_path, monkeypatch)[1]
  assert isinstance(e.value, MalformedRPC) and "GSP-RM answered reading the engines' runlists" in str(e.value)


def test_a_gsp_that_stops_answering_during_the_bring_up_times_out(tmp_path, monkeypatch) -> None:
  def silent(self, p):
    self.gpu.gsp.silent = True
  monkeypatch.setattr(fake_nvpci.FakeRM, "set_page_directory", silent)
  e = open_failing(tmp_path, monkeypatch)[1]
  assert isinstance(e.value, GSPError) and e.value.timed_out and "did not answer SET_PAGE_DIRECTORY within 0.3 s" in str(e.value)
  assert "GSP-RM did not unload" in str(e.value)


def test_the_booter_needs_bus_mastering(tmp_path, monkeypatch) -> None:
  monkeypatch.setattr(PCIFunction, "bus_master", lambda self: None)
  rig, e = open_failing(tmp_path, monkeypatch)
  assert isinstance(e.value, GSPError) and "booter_load failed on SEC2" in str(e.value)
  assert "booter_load ran with bus mastering off: the GPU cannot read host memory" in rig.gpu.violations
