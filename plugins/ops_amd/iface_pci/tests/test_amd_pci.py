"""plugrt-amd-pci against a fake sysfs tree: the acknowledgement rules, unbind/rebind, BAR mapping, bring-up to where it stops."""
from __future__ import annotations

import os
import struct
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests"))
import fake_amdgpu

import plugrt_amd
import plugrt_amd_pci
from plugrt.context import DeviceInfo, PluginContext
from plugrt.errors import DeviceUnavailable
from plugrt.registry import Registry
from plugrt_amd.device import AcknowledgementRequired, AMDNotImplemented
from plugrt_amd_pci import sysfs
from plugrt_amd_pci.discovery import DiscoveryError

ADDR = "0000:03:00.0"


def info(index: int = 0, **env: str) -> DeviceInfo:
  return DeviceInfo("AMD", index, "LLVM", "PCI", context=PluginContext(env))


def tree(tmp_path, **kw):
  devices, drivers = fake_amdgpu.make_sysfs(str(tmp_path / "sys"), **kw)
  return devices, drivers, fake_amdgpu.KernelWrites(devices, drivers)


def test_without_acknowledgement_nothing_is_touched_and_the_command_is_given(tmp_path) -> None:
  devices, drivers, kernel = tree(tmp_path)
  with pytest.raises(AcknowledgementRequired) as e: plugrt_amd_pci.open_pci(info(), devices, drivers, kernel)
  assert "PLUGRT_AMD_ALLOW_UNBIND=1 is not set" in str(e.value) and f"{ADDR} is bound to amdgpu" in str(e.value)
  assert f"echo {ADDR} | sudo tee {devices}/{ADDR}/driver/unbind" in e.value.hint
  assert kernel.log == [] and os.path.islink(os.path.join(devices, ADDR, "driver"))
  # the function layer refuses the same way, and says how to bind it back
  fn = sysfs.PCIFunction(ADDR, devices, drivers, kernel)
  with pytest.raises(AcknowledgementRequired, match="does not unbind it without PLUGRT_AMD_ALLOW_UNBIND=1") as e: fn.take(allow_unbind=False)
  assert f"{drivers}/amdgpu/bind" in e.value.hint and kernel.log == []
  with pytest.raises(DeviceUnavailable, match=r"1 AMD GPU function\(s\) on PCI"): plugrt_amd_pci.open_pci(info(1), devices, drivers, kernel)


def test_acknowledged_open_unbinds_maps_reads_discovery_and_rebinds(tmp_path) -> None:
  devices, drivers, kernel = tree(tmp_path)
  fw = tmp_path / "fw"; fw.mkdir(); (fw / "gc_11_0_0_mec.bin.zst").write_bytes(b"x")
  with pytest.raises(AMDNotImplemented) as e:
    plugrt_amd_pci.open_pci(info(PLUGRT_AMD_ALLOW_UNBIND="1", PLUGRT_AMD_FIRMWARE=str(fw)), devices, drivers, kernel)
  msg = str(e.value)
  for part in (f"AMD:0 through PCI: {ADDR}: unbound amdgpu, BAR5 mapped (512 KiB), BAR0 (16 MiB)", "VRAM 16 MiB",
               "IP discovery read from VRAM: GC 11.0.0, MP0 13.0.0, MP1 13.0.0, SDMA0 6.0.0, NBIF 4.3.0", "1 of 8 firmware files",
               "released (disabled, bound back to amdgpu)", "PSP firmware loading", "not implemented"):
    assert part in msg, (part, msg)
  assert kernel.log == [(f"devices/{ADDR}/driver/unbind", ADDR), (f"devices/{ADDR}/enable", "1"), (f"devices/{ADDR}/enable", "0"),
                        ("drivers/amdgpu/bind", ADDR)]
  assert os.path.islink(os.path.join(devices, ADDR, "driver"))


def test_unbound_function_and_enabled_function(tmp_path) -> None:
  devices, drivers, kernel = tree(tmp_path, driver="", enabled=True)
  with pytest.raises(AMDNotImplemented, match=f"{ADDR}: BAR5 mapped") as e:
    plugrt_amd_pci.open_pci(info(PLUGRT_AMD_ALLOW_UNBIND="1"), devices, drivers, kernel)
  assert "released" not in str(e.value) and kernel.log == []          # nothing to undo: it was enabled and unbound


def test_a_driver_that_does_not_let_go(tmp_path) -> None:
  devices, drivers, _ = tree(tmp_path)
  stuck = fake_amdgpu.KernelWrites(devices, drivers, refuse_unbind=True)
  with pytest.raises(DeviceUnavailable, match="still bound to amdgpu after writing driver/unbind"):
    plugrt_amd_pci.open_pci(info(PLUGRT_AMD_ALLOW_UNBIND="1"), devices, drivers, stuck)
  assert [w for w, _ in stuck.log] == [f"devices/{ADDR}/driver/unbind"]


def test_small_vram_bar_falls_back_and_errors_still_rebind(tmp_path) -> None:
  # BAR0 of 8 MiB does not reach the table (16 MiB - 64 KiB); MM_INDEX/MM_DATA on a plain file read nothing: the firmware file
  devices, drivers, kernel = tree(tmp_path, bar0_mib=8)
  fw = tmp_path / "fw"; fw.mkdir()
  with pytest.raises(DiscoveryError, match="no binary signature"):
    plugrt_amd_pci.open_pci(info(PLUGRT_AMD_ALLOW_UNBIND="1", PLUGRT_AMD_FIRMWARE=str(fw)), devices, drivers, kernel)
  assert kernel.log[-1] == ("drivers/amdgpu/bind", ADDR) and os.path.islink(os.path.join(devices, ADDR, "driver"))
  (fw / "ip_discovery.bin").write_bytes(fake_amdgpu.table())
  with pytest.raises(AMDNotImplemented, match=r"BAR0 \(8 MiB\).*IP discovery read from .*ip_discovery\.bin: GC 11\.0\.0"):
    plugrt_amd_pci.open_pci(info(PLUGRT_AMD_ALLOW_UNBIND="1", PLUGRT_AMD_FIRMWARE=str(fw)), devices, drivers, kernel)


def test_psp_stage_on_a_gpu_whose_psp_does_not_answer_times_out_and_rebinds(tmp_path) -> None:
  # the fake sysfs BAR is a plain file: the MMHUB never acquires its invalidation semaphore, C2PMSG_35 never shows the
  # bootloader ready
  from plugrt_amd_pci.gmc import GMCTimeout
  from plugrt_amd_pci.psp import PSPTimeout
  devices, drivers, kernel = tree(tmp_path, vram_mib=64, bar0_mib=64)
  fw = tmp_path / "fw"; fw.mkdir(); (fw / "psp_13_0_0_sos.bin").write_bytes(fake_amdgpu.sos_file())
  def open_() -> None:
    plugrt_amd_pci.open_pci(info(PLUGRT_AMD_ALLOW_UNBIND="1", PLUGRT_AMD_FIRMWARE=str(fw)), devices, drivers, kernel, psp_timeout=0.05)
  with pytest.raises(GMCTimeout, match=r"invalidation engine 17's semaphore not acquired"): open_()
  assert kernel.log[-1] == ("drivers/amdgpu/bind", ADDR)
  with open(os.path.join(devices, ADDR, "resource5"), "r+b") as f:      # the semaphore and VMID 0's acknowledge read 1
    for reg in (fake_amdgpu.MM_ENG17[0], fake_amdgpu.MM_ENG17[2]):
      f.seek(reg * 4); f.write(struct.pack("<I", 1))
  with pytest.raises(PSPTimeout, match=r"bootloader not ready before loading kdb \(C2PMSG_35"): open_()
  assert kernel.log[-1] == ("drivers/amdgpu/bind", ADDR) and os.path.islink(os.path.join(devices, ADDR, "driver"))


def test_corrupt_table_in_vram(tmp_path) -> None:
  blob = bytearray(fake_amdgpu.table()); blob[200] ^= 0x55
  devices, drivers, kernel = tree(tmp_path, blob=bytes(blob))
  with pytest.raises(DiscoveryError, match="binary checksum"):
    plugrt_amd_pci.open_pci(info(PLUGRT_AMD_ALLOW_UNBIND="1"), devices, drivers, kernel)
  assert kernel.log[-1] == ("drivers/amdgpu/bind", ADDR)


def test_function_layer(tmp_path) -> None:
  devices, drivers, kernel = tree(tmp_path)
  fn = sysfs.PCIFunction(ADDR, devices, drivers, kernel)
  assert fn.driver() == "amdgpu" and fn.config(0, 2) == 0x1002 and fn.config(2, 2) == 0x744C and fn.config(9, 3) == 0x030000
  res = fn.resources()
  assert res[0].size == 16 << 20 and res[0].is_memory and res[5].size == 512 << 10 and not res[4].is_memory and res[1].size == 0
  with pytest.raises(DeviceUnavailable, match="BAR1 is not a memory BAR"): fn.map_bar(1)
  with pytest.raises(DeviceUnavailable, match="BAR4 is not a memory BAR"): fn.map_bar(4)
  bar = fn.map_bar(5)
  assert bar.read32(0xDE3 * 4) == 16
  bar.write32(0x10, 0xDEADBEEF)
  assert bar.read32(0x10) == 0xDEADBEEF and fn.map_bar(5) is bar
  from plugrt_amd_pci.regs import RegisterError
  with pytest.raises(RegisterError, match="outside BAR5"): bar.read32(512 << 10)
  bar.write(0x21, b"\x01\x02\x03")                        # byte-exact stores (the PCI device's copies through BAR0)
  assert bar.read(0x20, 5) == b"\x00\x01\x02\x03\x00"
  with pytest.raises(RegisterError, match=r"write of 2 bytes at 0x7ffff outside BAR5"): bar.write((512 << 10) - 1, b"ab")
  assert fn.release() == [] and bar.view is None
  with pytest.raises(DeviceUnavailable, match="BAR5 is unmapped"): bar.read(0, 1)
  with open(os.path.join(devices, ADDR, "resource5"), "rb") as f: f.seek(0x10); assert f.read(4) == bytes.fromhex("efbeadde")
  with pytest.raises(DeviceUnavailable, match=r"no PCI function 0000:09:00\.0"): sysfs.PCIFunction("0000:09:00.0", devices, drivers)
  with pytest.raises(DeviceUnavailable, match="returned 0 of 4 bytes"): fn.config(4096)


def test_registry_and_probe(tmp_path, monkeypatch) -> None:
  devices, _, _ = tree(tmp_path, driver="")
  monkeypatch.setattr(sysfs, "PCI_DEVICES", devices)
  monkeypatch.setattr(plugrt_amd, "PCI_DEVICES", devices)
  monkeypatch.setattr(plugrt_amd.pci_gpus, "__defaults__", (devices,))
  reg = Registry(plugins=[plugrt_amd, plugrt_amd_pci], env={"AMD_IFACE": "PCI", "PLUGRT_AMD_ALLOW_UNBIND": "1"}).load()
  with pytest.raises(AMDNotImplemented, match=r"AMD:0 through PCI: 0000:03:00\.0: BAR5 mapped.*GC 11\.0\.0"): reg.open("AMD")
  p = plugrt_amd_pci.probe(PluginContext({}))
  assert p.ok and "reads its IP discovery table" in p.detail and "boots its PSP" in p.detail
  assert "loads the SMU, SDMA and GC firmware through it" in p.detail and "sends the SMU its first messages" in p.detail
  assert "waits for the RLC autoload, sets up the CP and programs both memory hubs' GART" in p.detail
  assert "loads an AQL queue into the MEC and keeps the GPU for the device" in p.detail
  assert "only against the fake GPU, never on hardware" in p.detail and "host memory (from_blob), SDMA copies" in p.detail
  assert "not implemented" in p.detail
  assert sysfs.vfio_available(str(tmp_path / "no-vfio")) is False
