"""The bridge's SRAM window (plugrt_amd_usb.sram) against the fake bridge, and the Bulk-Only data phases of the libusb
transport (out and in, residue, short phases, stalls) against a stand-in libusb."""
from __future__ import annotations

import ctypes
import os
import struct
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests"))
import fake_amdgpu

from plugrt_amd_pci.regs import GPURegisters
from plugrt_amd_usb import asm24, libusb, sram


def bridge() -> tuple[asm24.ASM24Bridge, fake_amdgpu.FakeASM24]:
  regs, vram = fake_amdgpu.fake_gpu()
  fake = fake_amdgpu.FakeASM24(regs, vram)
  return asm24.ASM24Bridge(fake), fake


def pattern(n: int, seed: int = 7) -> bytes: return bytes((i * seed + (i >> 9)) & 0xFF for i in range(n))


def test_write16_and_burst_shapes() -> None:
  assert sram.write16_cdb(128) == bytes([0x8A, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 128, 0, 0])
  with pytest.raises(ValueError): sram.write16_cdb(0)
  with pytest.raises(ValueError): sram.write16_cdb(1025)             # past the 512 KiB SRAM
  assert [len(p) for p in sram.burst(b"x" * 100)] == [512]
  assert [len(p) for p in sram.burst(b"x" * 0x4000)] == [0x4000]       # 16 KiB: still one command, not padded to 64 KiB
  assert [len(p) for p in sram.burst(b"x" * (0x4000 + 4))] == [0x10000]
  assert [len(p) for p in sram.burst(b"x" * 0x80000)] == [0x10000] * 8
  with pytest.raises(ValueError, match=r"1\.\.524288 bytes"): sram.burst(b"x" * (0x80000 + 1))


def test_small_and_large_bursts_land_at_the_start_of_the_sram() -> None:
  b, fake = bridge()
  assert sram.sram_write(b, pattern(100)) == sram.SRAM_BUS == 0x200000
  assert fake.sram[:100] == pattern(100) and fake.sram[100:512] == bytes(412) and fake.sram_pos == 0
  big = pattern(300 << 10, 13)
  fake.commands = 0
  sram.sram_write(b, big)
  assert fake.sram[:len(big)] == big and fake.sram_pos == 0 and not fake.sram_violations
  assert fake.commands == sram.commands(len(big)) == 5 * 6 + 4              # 5 x (WRITE(16) + 5 ack bytes) + burst end
  sram.sram_write(b, pattern(0x10000, 3))                                    # the next burst starts at 0 again
  assert fake.sram[:0x10000] == pattern(0x10000, 3) and fake.sram[0x10000:len(big)] == big[0x10000:]
  # the GPU's side: its DMA reads at bus 0x200000 + offset see the same bytes
  assert fake.dma_read(0x200000 + 0x1234, 16) == pattern(0x10000, 3)[0x1234:0x1244]
  # and the host reads the first 4 KiB back through XDATA 0xF000
  assert sram.sram_read(b, 0x100, 600) == pattern(0x10000, 3)[0x100:0x358]
  with pytest.raises(ValueError, match="first 4096 bytes"): sram.sram_read(b, 0xF00, 0x200)


def test_a_missing_ack_is_seen_by_the_fake() -> None:
  _, fake = bridge()
  fake.execute(sram.write16_cdb(1), 0, bytes(512))
  fake.execute(sram.write16_cdb(1), 0, bytes(512))
  assert any("before the previous one was acknowledged" in v for v in fake.sram_violations)


def test_request_count_for_one_mib_before_and_after() -> None:
  """The PSP's 1 MiB firmware buffer: dword memory TLPs into the VRAM BAR (before) against SRAM bursts (after)."""
  b, fake = bridge()
  gpu = asm24.find_gpu(b)
  regs = GPURegisters(asm24.BridgeMMIO(b, *gpu.bars[5]), asm24.BridgeMMIO(b, *gpu.bars[0]))
  fake.commands = 0
  regs.write_vram(0x10000, pattern(4096))                # 4 KiB through TLPs, counted, then scaled: 1 MiB would take minutes here
  assert fake.vram.read(0x10000, 4096) == pattern(4096)
  per_4k = fake.commands
  assert per_4k == 1024 * 16        # one XDATA byte per 0xE5: data 4, address 4 + 4, enables, type, trigger, start
  before = per_4k * 256
  fake.commands = 0
  data = pattern(1 << 20, 5)
  for pos in range(0, len(data), sram.SRAM_SIZE):        # the SRAM holds 512 KiB: two bursts, each handed to the GPU in turn
    sram.sram_write(b, data[pos:pos + sram.SRAM_SIZE])
    assert fake.dma_read(0x200000, sram.SRAM_SIZE) == data[pos:pos + sram.SRAM_SIZE]
  after = fake.commands
  assert (before, after) == (4_194_304, 104) and after == sram.commands(1 << 20) and fake.sram_commands == 16


class BulkLib:
  """libusb's bulk transfers for a Bulk-Only device that takes data-out phases into `received` and answers data-in
  phases with a pattern; `short`, `residue`, `stall` and `status` make the next command misbehave."""

  def __init__(self) -> None:
    self.received: list[bytes] = []
    self.pending: list[bytes] = []
    self.expect_out = 0
    self.tag = 0
    self.short = self.residue = self.status = 0
    self.stall = False
    self.cleared: list[int] = []

  def __getattr__(self, name):
    answers = {"libusb_open_device_with_vid_pid": 0x1234, "libusb_kernel_driver_active": 0, "libusb_error_name": b"LIBUSB_ERROR_PIPE"}
    return lambda *a: answers.get(name, 0)

  def libusb_init(self, ctx):
    ctx._obj.value = 0x99
    return 0

  def libusb_clear_halt(self, handle, ep):
    self.cleared.append(ep)
    return 0

  def libusb_bulk_transfer(self, handle, ep, buf, n, done, timeout):
    if ep == libusb.EP_OUT and self.expect_out:          # the data-out phase
      take = n - self.short
      self.received.append(bytes(buf.raw[:take]))
      self.expect_out = 0
      self.pending.append(self._csw(n - take + self.residue))
      done._obj.value = take
      return libusb.LIBUSB_ERROR_PIPE if self.stall else 0
    if ep == libusb.EP_OUT:                              # a CBW
      cbw = bytes(buf.raw[:n])
      self.tag, length, flags = struct.unpack_from("<IIB", cbw, 4)
      if length and not flags & 0x80: self.expect_out = length
      elif length:
        give = length - self.short
        self.pending.append(bytes(i & 0xFF for i in range(give)))
        self.pending.append(self._csw(length - give + self.residue))
      else: self.pending.append(self._csw(self.residue))
      done._obj.value = n
      return 0
    data = self.pending.pop(0)
    ctypes.memmove(buf, data, len(data))
    done._obj.value = len(data)
    return libusb.LIBUSB_ERROR_PIPE if self.stall and len(data) != libusb.CSW_SIZE else 0

  def _csw(self, residue: int) -> bytes: return struct.pack("<IIIB", libusb.CSW_SIGNATURE, self.tag, residue, self.status)


def transport() -> tuple[libusb.LibUSBTransport, BulkLib]:
  lib = BulkLib()
  return libusb.LibUSBTransport(0x174C, 0x2464, allow_detach=False, lib=lib), lib


def test_libusb_data_out_phase_of_a_64k_write() -> None:
  t, lib = transport()
  payload = pattern(0x10000)
  assert t.execute(sram.write16_cdb(128), 0, payload) == b""
  assert lib.received == [payload]
  assert t.execute(asm24.xdata_read_cdb(0xB220, 200), 200) == bytes(range(200))
  with pytest.raises(ValueError, match="one data phase"): t.execute(sram.write16_cdb(1), 4, bytes(512))


@pytest.mark.parametrize("fault, match", [("short", "moved 65024 bytes"), ("residue", "residue is 4"), ("status", "CSW status 1"),
                                          ("phase", "phase error")])
def test_libusb_data_out_faults(fault: str, match: str) -> None:
  t, lib = transport()
  if fault == "short": lib.short = 512
  if fault == "residue": lib.residue = 4
  if fault == "status": lib.status = 1
  if fault == "phase": lib.status = 2
  with pytest.raises(asm24.BridgeError, match=match): t.execute(sram.write16_cdb(128), 0, bytes(0x10000))


def test_libusb_stalled_phases_are_cleared_and_the_csw_read() -> None:
  t, lib = transport()
  lib.stall, lib.short = True, 4
  with pytest.raises(asm24.BridgeError, match="moved 60 bytes, the CSW's residue is 4"): t.execute(asm24.xdata_read_cdb(0xB220, 64), 64)
  assert lib.cleared == [libusb.EP_IN] and not lib.pending            # the CSW was still read after the cleared halt
  with pytest.raises(asm24.BridgeError, match="moved 508 bytes"): t.execute(sram.write16_cdb(1), 0, bytes(512))
  assert lib.cleared == [libusb.EP_IN, libusb.EP_OUT] and not lib.pending
