"""plugrt-amd-usb against a fake ASM24xx bridge: command bytes, the TLP engine, the walk to the GPU, IP discovery over USB."""
from __future__ import annotations

import ctypes
import os
import struct
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests"))
import fake_amdgpu

import plugrt_amd_usb
from plugrt.context import DeviceInfo, PluginContext
from plugrt.errors import DeviceUnavailable, Reason
from plugrt_amd.device import AcknowledgementRequired, AMDNotImplemented
from plugrt_amd_pci.regs import MM_INDEX
from plugrt_amd_usb import asm24, libusb


def bridge(**kw) -> tuple[asm24.ASM24Bridge, fake_amdgpu.FakeASM24]:
  regs, vram = fake_amdgpu.fake_gpu()
  fake = fake_amdgpu.FakeASM24(regs, vram, **kw)
  return asm24.ASM24Bridge(fake), fake


def test_command_bytes() -> None:
  assert asm24.xdata_read_cdb(0xB220, 4) == bytes([0xE4, 0x04, 0x50, 0xB2, 0x20, 0x00])
  assert asm24.xdata_write_cdb(0xB296, 0x04) == bytes([0xE5, 0x04, 0x50, 0xB2, 0x96, 0x00])
  assert asm24.xdata_write_cdb(0x1C422, 0x02)[2] == 0x51                # XDATA bit 16 kept
  with pytest.raises(ValueError): asm24.xdata_read_cdb(0, 256)
  assert asm24.config_address(4, 0, 0, 0x10) == 0x04000010 and asm24.config_address(1, 3, 2, 0xFFC) == 0x011A0FFC
  assert asm24.posted(asm24.MWR32) and not asm24.posted(asm24.MRD32) and not asm24.posted(asm24.CFGWR1) and asm24.posted(0x30)
  c = libusb.cbw(7, asm24.xdata_read_cdb(0xB220, 4), 4, True)
  assert len(c) == 31 and c[:4] == b"USBC" and struct.unpack_from("<IIBBB", c, 4) == (7, 4, 0x80, 0, 6) and c[15:21] == bytes.fromhex("e40450b22000")
  assert libusb.parse_csw(struct.pack("<IIIB", 0x53425355, 7, 0, 0), 7) == (0, 0)
  with pytest.raises(ValueError, match="tag 8"): libusb.parse_csw(struct.pack("<IIIB", 0x53425355, 8, 0, 0), 7)


def test_tlp_engine_routing_and_retries() -> None:
  b, fake = bridge()
  assert b.cfg_read(0, 0, 0, 0, 2) == 0x174C and b.cfg_read(0, 0, 0, 2, 2) == 0x2464
  with pytest.raises(asm24.BridgeError, match="Unsupported Request"): b.cfg_read(4, 0, 0, 0)   # no bus numbers yet: not routed
  fake.fail_next = 3
  assert b.cfg_read(0, 0, 0, 0x0E, 1) == 1                                                      # retried past three engine errors
  fake.fail_next = 50
  with pytest.raises(asm24.BridgeError, match="error 11 times"): b.cfg_read(0, 0, 0, 0)
  fake.fail_next = 0
  with pytest.raises(ValueError, match="crosses a dword"): b.tlp(asm24.MRD32, 0x1003, size=2)
  # sub-dword requests: byte enables select the bytes written; reads shift the dword
  fake.funcs[0].cfg[0x3C:0x40] = bytes([0x11, 0x22, 0x33, 0x44])
  b.cfg_write(0, 0, 0, 0x3D, 0xAB, 1)
  b.cfg_write(0, 0, 0, 0x3E, 0xBEEF, 2)
  assert bytes(fake.funcs[0].cfg[0x3C:0x40]) == bytes([0x11, 0xAB, 0xEF, 0xBE])
  assert b.cfg_read(0, 0, 0, 0x3D, 1) == 0xAB and b.cfg_read(0, 0, 0, 0x3E, 2) == 0xBEEF


def test_walk_to_the_gpu_sizes_and_places_bars() -> None:
  b, fake = bridge()
  gpu = asm24.find_gpu(b)
  assert (gpu.bus, gpu.vendor, gpu.device, gpu.class_code >> 8, gpu.bridges) == (4, 0x1002, 0x744C, 0x0300, [0, 1, 2, 3])
  assert gpu.bars == {0: (8 << 30, 8 << 20), 2: ((8 << 30) + (8 << 20), 2 << 20), 5: (0x1000_0000, 512 << 10)}
  f = fake.funcs[4]
  assert f.bar(5) == 0x1000_0000 and f.bar(0) == 8 << 30 and f.memory
  assert [fake.funcs[i].secondary for i in range(4)] == [1, 2, 3, 4]
  mmio = asm24.BridgeMMIO(b, *gpu.bars[5])
  assert mmio.read32(0xDE3 * 4) == 16
  mmio.write32(0x40, 0xABCD)
  assert fake.regs.regs[0x10] == 0xABCD and fake.tlps[-1] == (asm24.MWR32, 0x1000_0040)
  from plugrt_amd_pci.regs import RegisterError
  with pytest.raises(RegisterError, match="outside"): mmio.read32(512 << 10)


def info(**env: str) -> DeviceInfo:
  return DeviceInfo("AMD", 0, "LLVM", "USB", context=PluginContext(env))


def test_open_reads_ip_discovery_over_usb(tmp_path) -> None:
  regs, vram = fake_amdgpu.fake_gpu()
  fake = fake_amdgpu.FakeASM24(regs, vram)
  with pytest.raises(AcknowledgementRequired, match="PLUGRT_AMD_ALLOW_UNBIND=1 is not set"): plugrt_amd_usb.open_usb(info(), fake)
  assert fake.commands == 0
  with pytest.raises(AMDNotImplemented) as e:
    plugrt_amd_usb.open_usb(info(PLUGRT_AMD_ALLOW_UNBIND="1", PLUGRT_AMD_FIRMWARE=str(tmp_path)), fake)
  msg = str(e.value)
  for part in ("AMD:0 through USB: GPU 0x1002:0x744c at bus 4 behind 4 bridge port(s); BAR0 at 0x200000000 (8192 KiB)",
               "VRAM 16 MiB", "IP discovery read from VRAM: GC 11.0.0, MP0 13.0.0", "NBIO 4.3.0", "0 of 8 firmware files", "not implemented",
               "PSP not booted: psp_13_0_0_sos.bin not found"):
    assert part in msg, (part, msg)
  # the table lies beyond the 8 MiB VRAM BAR: it came through MM_INDEX/MM_DATA in the register BAR
  assert any(op == "w" and reg == MM_INDEX for op, reg, _ in regs.log)
  assert [x for x in fake_amdgpu.fake_amdgpu_init_writes(fake)] == list(asm24.CONTROLLER_INIT)


def test_corrupt_table_over_usb() -> None:
  blob = bytearray(fake_amdgpu.table()); blob[300] ^= 1
  regs, vram = fake_amdgpu.fake_gpu(blob=bytes(blob))
  from plugrt_amd_pci.discovery import DiscoveryError
  with pytest.raises(DiscoveryError, match="binary checksum"):
    plugrt_amd_usb.open_usb(info(PLUGRT_AMD_ALLOW_UNBIND="1"), fake_amdgpu.FakeASM24(regs, vram, bar0_size=32 << 20))


def test_libusb_missing_is_a_typed_reason() -> None:
  with pytest.raises(DeviceUnavailable) as e: libusb.load("/nonexistent/libusb-1.0.so")
  assert e.value.reason is Reason.MISSING_TOOLCHAIN and "libusb" in e.value.hint


class FakeLib:
  """libusb's C functions as the transport calls them, for a device that answers Bulk-Only commands with `answer`."""

  def __init__(self, driver_active: int = 1):
    self.calls: list[str] = []
    self.driver_active = driver_active
    self.pending: list[bytes] = []
    self.sent: list[bytes] = []

  def __getattr__(self, name):
    def call(*args):
      self.calls.append(name)
      return {"libusb_open_device_with_vid_pid": 0x1234, "libusb_kernel_driver_active": self.driver_active,
              "libusb_error_name": b"LIBUSB_ERROR_IO"}.get(name, 0)
    return call

  def libusb_init(self, ctx):
    self.calls.append("libusb_init")
    ctx._obj.value = 0x99          # the context pointer libusb hands back
    return 0

  def libusb_bulk_transfer(self, handle, ep, buf, n, done, timeout):
    self.calls.append(f"bulk {ep:#x}")
    if ep == libusb.EP_OUT:
      cbw = bytes(buf.raw[:n]); self.sent.append(cbw)
      tag, length = struct.unpack_from("<II", cbw, 4)
      if length: self.pending.append(bytes(range(length)))
      self.pending.append(struct.pack("<IIIB", libusb.CSW_SIGNATURE, tag, 0, 0))
      data = b""
    else: data = self.pending.pop(0)
    ctypes.memmove(buf, data, len(data))
    done._obj.value = n if ep == libusb.EP_OUT else len(data)
    return 0


def test_libusb_transport_bulk_only_and_reattach() -> None:
  lib = FakeLib()
  t = libusb.LibUSBTransport(0x174C, 0x2464, allow_detach=True, lib=lib)
  assert t.execute(asm24.xdata_read_cdb(0xB220, 4), 4) == bytes([0, 1, 2, 3])
  assert t.execute(asm24.xdata_write_cdb(0xB296, 4)) == b""
  assert [struct.unpack_from("<I", c, 4)[0] for c in lib.sent] == [1, 2] and lib.sent[1][12] == 0
  t.close()
  assert lib.calls[:5] == ["libusb_init", "libusb_open_device_with_vid_pid", "libusb_kernel_driver_active",
                           "libusb_detach_kernel_driver", "libusb_claim_interface"]
  assert lib.calls[-4:] == ["libusb_release_interface", "libusb_attach_kernel_driver", "libusb_close", "libusb_exit"]
  with pytest.raises(DeviceUnavailable, match="held by a kernel driver"): libusb.LibUSBTransport(0x174C, 0x2464, False, lib=FakeLib())
