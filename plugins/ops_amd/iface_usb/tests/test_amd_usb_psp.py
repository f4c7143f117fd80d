"""The PSP boot and the IP firmware loads over USB: plugrt_amd_pci.psp and psp_load (the PCI path's code) with every buffer
the PSP reads handed over through the bridge's SRAM, mapped in the GART (plugrt_amd_usb.staging); against the fake
bridge, whose SRAM the fake PSP reads through a fake GART (context 0 of the MMHUB, decoded from its registers and the
table in VRAM)."""
from __future__ import annotations

import os
import sys
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests"))
import fake_amdfw
import fake_amdgpu

import plugrt_amd_usb
from plugrt.context import DeviceInfo, PluginContext
from plugrt_amd.device import AMDNotImplemented
from plugrt_amd_pci.psp_firmware import PSPFirmwareError
from plugrt_amd_usb import sram, staging
from plugrt_amd_usb.gpu import USBGPU

RDNA3 = dict(gc=(11, 0, 0), mp0=(13, 0, 0), mp1=(13, 0, 0), sdma=(6, 0, 0), mmhub=(3, 0, 0))
GART_START = 0x7FFF00000000           # the 32 MiB GART's start: (2^47 - 32 MiB) rounded down to 4 GiB


def setup(tmp_path, ip: bool = True, sos: bytes | None = None):
  regs, vram = fake_amdgpu.fake_gpu(blob=fake_amdgpu.table(**RDNA3), mib=64)
  sos = fake_amdgpu.sos_file() if sos is None else sos
  (tmp_path / "psp_13_0_0_sos.bin").write_bytes(sos)
  mp0 = fake_amdgpu.FakeMP0(regs, vram, sos, mp0=RDNA3["mp0"], mmhub=RDNA3["mmhub"])
  ipf = mp1 = None
  if ip:
    blobs, want = fake_amdfw.ip_files(RDNA3["gc"], RDNA3["mp1"], RDNA3["sdma"], 3)
    for name, blob in blobs.items(): (tmp_path / name).write_bytes(blob)
    mp1 = fake_amdfw.FakeMP1(regs, RDNA3["mp1"])
    ipf = fake_amdfw.FakeIPFirmware(mp0, want, mp1, fake_amdfw.FakeRLC(regs, RDNA3["gc"]))
    ipf.cp = fake_amdfw.FakeCP(regs)
  bridge = fake_amdgpu.FakeASM24(regs, vram, bar0_size=64 << 20)     # a 64 MiB VRAM BAR over the fake's 64 MiB VRAM
  gart = fake_amdgpu.FakeGART(regs, bridge.dma_read)
  mp0.gart = gart.read
  return bridge, mp0, ipf, mp1, gart


def open_(tmp_path, bridge, reaches_queue: bool = False) -> str:
  """What the open did: the error where bring-up stopped, or (`reaches_queue`) the kept GPU's bring-up record."""
  dev = DeviceInfo("AMD", 0, "LLVM", "USB", context=PluginContext({"PLUGRT_AMD_ALLOW_UNBIND": "1", "PLUGRT_AMD_FIRMWARE": str(tmp_path)}))
  if reaches_queue:
    gpu = plugrt_amd_usb.open_usb(dev, bridge, psp_timeout=0.2)
    assert isinstance(gpu, USBGPU) and gpu.bringup.compute.queue is not None
    gpu.close()
    return gpu.bringup.summary()
  with pytest.raises(AMDNotImplemented) as e: plugrt_amd_usb.open_usb(dev, bridge, psp_timeout=0.2)
  return str(e.value)


def test_psp_boot_and_ip_firmware_over_usb(tmp_path) -> None:
  bridge, mp0, ipf, mp1, gart = setup(tmp_path)
  t0 = time.monotonic()
  msg = open_(tmp_path, bridge, reaches_queue=True)
  assert mp0.violations == [] and gart.violations == [] and bridge.sram_violations == [] and mp1.violations == [], (mp0.violations, gart.violations)
  # the PCI path's order, every buffer read by the fake PSP from the bridge's SRAM through the GART's first page
  assert mp0.loaded == ["kdb", "spl", "sys_drv", "soc_drv", "intf_drv", "dbg_drv", "ras_drv", "sos"]
  assert mp0.buffers == [GART_START] * 9                     # 8 bootloader components and the TOC
  assert ipf.loaded[0] == "SMC" and ipf.loaded[-1] == "RLC_G" and len(ipf.loaded) == 24 and ipf.autoloaded
  assert min(gart.pages) == sram.SRAM_BUS and max(gart.pages) < sram.SRAM_BUS + sram.SRAM_SIZE
  # each buffer is one 512 KiB burst: 8 WRITE(16)s of 64 KiB; 9 + 24 buffers
  assert bridge.sram_commands == 8 * (9 + 24)
  for part in ("the USB bridge's SRAM mapped for the PSP: 128 GART entries (system, uncached) at MC 0x7fff00000000 -> bus 0x200000",
               "MMHUB 3.0.0 GART enabled", "32 MiB at MC 0x7fff00000000",
               "PSP bootloader loaded kdb, spl, sys_drv, soc_drv, intf_drv, dbg_drv, ras_drv, sos through the USB bridge's 512 KiB SRAM",
               "GFX_CMD_ID_LOAD_TOC ok", "IP firmware: 24 ucodes, each handed to the PSP through the USB bridge's 512 KiB SRAM",
               "GFX_CMD_ID_LOAD_IP_FW ok: SMC", "GFX_CMD_ID_SETUP_TMR ok", "GFX_CMD_ID_AUTOLOAD_RLC ok", "SMU ready", "RLC autoload complete",
               "RS64 CP set up", "GFXHUB (gfxhub_v3_0) GART enabled", "MEC compute queue"):
    assert part in msg, (part, msg)
  assert time.monotonic() - t0 < 60


def test_request_counts_of_the_psp_boot(tmp_path) -> None:
  """What the bootloader stage costs in bridge commands: the SRAM bursts against what the 1 MiB VRAM buffer would."""
  bridge, mp0, *_ = setup(tmp_path, ip=False)
  open_(tmp_path, bridge)
  assert mp0.violations == [] and len(mp0.loaded) == 8
  per_buffer = sram.commands(sram.SRAM_SIZE)
  assert per_buffer == 52 and bridge.sram_commands == 9 * 8        # 8 components and the TOC, 8 WRITE(16)s each
  # through TLPs, each component's 1 MiB VRAM buffer (cleared, as the kernel does) is 262,144 posted writes of 16 commands
  assert (9 * per_buffer, 9 * 262_144 * 16) == (468, 37_748_736)


def test_a_component_over_the_sram_is_a_typed_error(tmp_path) -> None:
  big = fake_amdgpu.sos_file(sizes={"sys_drv": sram.SRAM_SIZE + 4})
  bridge, mp0, *_ = setup(tmp_path, ip=False, sos=big)
  with pytest.raises(PSPFirmwareError, match="sys_drv is 524292 bytes, more than the USB bridge's 512 KiB SRAM"):
    plugrt_amd_usb.open_usb(DeviceInfo("AMD", 0, "LLVM", "USB", context=PluginContext(
      {"PLUGRT_AMD_ALLOW_UNBIND": "1", "PLUGRT_AMD_FIRMWARE": str(tmp_path)})), bridge, psp_timeout=0.2)
  assert mp0.loaded == ["kdb", "spl"]


def test_a_stale_gart_entry_is_seen_by_the_fake(tmp_path, monkeypatch) -> None:
  """Without the TLB flushes (the GART's and the one after the SRAM's entries), the fake GART refuses the PSP's reads."""
  bridge, mp0, _, _, gart = setup(tmp_path, ip=False)
  monkeypatch.setattr(staging.gmc, "flush_tlb", lambda *a, **k: 0)
  open_(tmp_path, bridge)
  assert any("after the last TLB flush" in v for v in gart.violations)
  assert any("does not hold the file's kdb" in v for v in mp0.violations)


def test_an_unaligned_staging_buffer_is_refused(tmp_path, monkeypatch) -> None:
  bridge, mp0, *_ = setup(tmp_path, ip=False)
  real = staging.SRAMStaging.put
  monkeypatch.setattr(staging.SRAMStaging, "put", lambda self, data: real(self, data) + 0x1000)
  from plugrt_amd_pci.psp import PSPError
  with pytest.raises(PSPError, match="kdb's buffer at MC 0x7fff00001000 is not 1 MiB aligned"):
    plugrt_amd_usb.open_usb(DeviceInfo("AMD", 0, "LLVM", "USB", context=PluginContext(
      {"PLUGRT_AMD_ALLOW_UNBIND": "1", "PLUGRT_AMD_FIRMWARE": str(tmp_path)})), bridge, psp_timeout=0.2)
  assert mp0.loaded == []


def test_without_a_gart_the_psp_is_not_booted_over_usb(tmp_path) -> None:
  """An MMHUB whose GART plugrt does not program: over USB the PSP cannot reach the SRAM, so it is not booted (recorded)."""
  regs, vram = fake_amdgpu.fake_gpu(blob=fake_amdgpu.table(**(RDNA3 | {"mmhub": (3, 0, 2)})), mib=64)
  sos = fake_amdgpu.sos_file()
  (tmp_path / "psp_13_0_0_sos.bin").write_bytes(sos)
  mp0 = fake_amdgpu.FakeMP0(regs, vram, sos, mp0=(13, 0, 0), mmhub=(3, 0, 2))
  msg = open_(tmp_path, fake_amdgpu.FakeASM24(regs, vram, bar0_size=64 << 20))
  assert "GART not set up: GART set-up for MMHUB 3.0.2 is not implemented" in msg
  assert "PSP not booted: the USB bridge's 512 KiB SRAM (bus 0x200000) is reached through the GART, which is not set up" in msg
  assert mp0.loaded == []
