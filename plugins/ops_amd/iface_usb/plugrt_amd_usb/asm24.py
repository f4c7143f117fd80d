"""The ASMedia ASM24xx USB3-to-PCIe bridge as a PCIe requester: vendor SCSI commands, its TLP engine, and what lies behind it.

The bridge is a USB mass-storage device. Two vendor SCSI commands read and write its 8051 controller's XDATA space
(0xE4: read up to 255 bytes; 0xE5: write one byte), and a block of XDATA registers at 0xB210-0xB296 is a PCIe TLP
engine: the host writes the TLP's fmt/type, byte enables, address and (for writes) data, starts it, polls its status
and reads the completion. On that, `ASM24Bridge` gives PCIe configuration reads/writes (type 0 or 1) and 32-bit
memory reads/writes; `BridgeMMIO` is a window onto one GPU BAR for plugrt_amd_pci.regs, so the same IP discovery and
bring-up code runs over USB as over PCI; `find_gpu` walks the PCI-to-PCI bridges from bus 0 (assigning bus numbers
and memory windows, by the PCI-to-PCI bridge specification) to the AMD GPU and sizes and places its BARs.

`Transport` is the seam below: `execute(cdb, read, data)` runs one SCSI command (the libusb transport in
plugrt_amd_usb.libusb, or a fake bridge in tests). Facts and sources: docs/research/amd-pci.md ("USB"). Never run on
a real bridge.
"""
from __future__ import annotations

import struct
import time
from dataclasses import dataclass
from typing import Protocol

from plugrt.errors import PlugrtError

# vendor SCSI commands (6-byte CDBs: opcode, size or value, address bits 16-23, address bits 0-15 big-endian, 0)
CDB_XDATA_READ = 0xE4
CDB_XDATA_WRITE = 0xE5
XDATA_SELECT = 0x500000        # ORed into the 24-bit address: the controller's XDATA space
XDATA_MASK = 0x1FFFF
XDATA_READ_MAX = 0xFF
# the TLP engine's XDATA registers (big-endian multi-byte fields)
TLP_FMT_TYPE = 0xB210          # u8: PCIe fmt/type of the request
TLP_BYTE_ENABLE = 0xB217       # u8: first-dword byte enables
TLP_ADDR_LO = 0xB218           # u32: address bits 0-31 (dword aligned)
TLP_ADDR_HI = 0xB21C           # u32: address bits 32-63
TLP_DATA = 0xB220              # u32: write data in, completion data out
TLP_COMPLETION = 0xB22A        # u16: completion status (bits 13-15) and byte count (bits 0-11)
TLP_TRIGGER = 0xB254           # written 0x0F before start
TLP_CPL_FLAGS = 0xB284         # bit 0: the completion carried data (CplD)
TLP_STATUS = 0xB296            # write 0x04: start; read: bit 1 done, bit 0 error (write 0x01 to clear)
TLP_START, TLP_DONE, TLP_ERROR = 0x04, 0x02, 0x01
#: controller set-up the public reference writes before the first TLP (address, bytes); their meaning is not public
CONTROLLER_INIT = ((0x054B, b"\x20"), (0x054E, b"\x04"), (0x05A8, b"\x02"), (0x05F8, b"\x04"), (0x07EC, b"\x01\x00\x00\x00"),
                   (0xC422, b"\x02"), (0x0000, b"\x33"))
# PCIe TLP fmt/type bytes (PCI Express Base Specification: Fmt[2:0] Type[4:0])
MRD32, MWR32, CFGRD0, CFGRD1, CFGWR0, CFGWR1 = 0x20, 0x60, 0x04, 0x05, 0x44, 0x45
CPL_STATUS = {0: "successful", 1: "Unsupported Request", 2: "Configuration Request Retry Status", 4: "Completer Abort"}
# PCI configuration header fields (PCI Local Bus / PCI-to-PCI Bridge specifications)
PCI_VENDOR, PCI_COMMAND, PCI_CLASS_REV, PCI_HEADER_TYPE, PCI_BAR0 = 0x00, 0x04, 0x08, 0x0E, 0x10
PCI_BUSES, PCI_MEMORY_BASE, PCI_PREF_BASE, PCI_PREF_BASE_UPPER = 0x18, 0x20, 0x24, 0x28
CMD_MEMORY, CMD_MASTER = 0x2, 0x4


class BridgeError(PlugrtError, RuntimeError):
  """The bridge or the PCIe link answered with an error (the message names the request and the status)."""


class Transport(Protocol):
  """How SCSI commands reach the bridge (plugrt_amd_usb.libusb's Bulk-Only transport; a fake bridge in tests)."""

  def execute(self, cdb: bytes, read: int = 0, data: bytes = b"") -> bytes:
    """Run one SCSI command: with `read`, return the `read` bytes of its data-in phase; with `data`, send it as the
    data-out phase (plugrt_amd_usb.sram's WRITE(16)); a command has at most one of the two."""
    ...


def xdata_read_cdb(addr: int, size: int) -> bytes:
  if not 0 < size <= XDATA_READ_MAX: raise ValueError(f"an XDATA read is 1..{XDATA_READ_MAX} bytes, not {size}")
  a = (addr & XDATA_MASK) | XDATA_SELECT
  return struct.pack(">BBBHB", CDB_XDATA_READ, size, a >> 16, a & 0xFFFF, 0)


def xdata_write_cdb(addr: int, value: int) -> bytes:
  a = (addr & XDATA_MASK) | XDATA_SELECT
  return struct.pack(">BBBHB", CDB_XDATA_WRITE, value & 0xFF, a >> 16, a & 0xFFFF, 0)


def config_address(bus: int, dev: int, fn: int, offset: int) -> int:
  """The address field of a configuration request: bus, device, function, register (PCIe ECAM layout)."""
  if not (0 <= bus < 256 and 0 <= dev < 32 and 0 <= fn < 8 and 0 <= offset < 4096):
    raise ValueError(f"config address {bus:x}:{dev:x}.{fn} +0x{offset:x} out of range")
  return (bus << 24) | (dev << 19) | (fn << 16) | offset


def posted(fmt_type: int) -> bool:
  """Memory writes and messages get no completion."""
  return (fmt_type & 0xDF) == 0x40 or (fmt_type & 0xB8) == 0x30


class ASM24Bridge:
  """PCIe requests through an ASM24xx bridge's TLP engine, over `transport`."""

  def __init__(self, transport: Transport, retries: int = 10, timeout: float = 1.0):
    self.transport, self.retries, self.timeout = transport, retries, timeout

  def init(self) -> None:
    for addr, data in CONTROLLER_INIT: self.xwrite(addr, data)

  def xread(self, addr: int, n: int) -> bytes:
    out = b""
    for off in range(0, n, XDATA_READ_MAX):
      size = min(XDATA_READ_MAX, n - off)
      out += self.transport.execute(xdata_read_cdb(addr + off, size), size)
    return out

  def xwrite(self, addr: int, data: bytes) -> None:
    for i, v in enumerate(data): self.transport.execute(xdata_write_cdb(addr + i, v))

  def tlp(self, fmt_type: int, address: int, value: int | None = None, size: int = 4) -> int | None:
    """One request of `size` bytes (1-4, inside one dword) at `address`; returns the read value, or None for a write."""
    offset = address & 3
    if not 0 < size <= 4 - offset: raise ValueError(f"a {size}-byte request at 0x{address:x} crosses a dword")
    for _attempt in range(self.retries + 1):
      if value is not None: self.xwrite(TLP_DATA, struct.pack(">I", (value << (8 * offset)) & 0xFFFFFFFF))
      self.xwrite(TLP_ADDR_LO, struct.pack(">I", address & 0xFFFFFFFC))
      self.xwrite(TLP_ADDR_HI, struct.pack(">I", address >> 32))
      self.xwrite(TLP_BYTE_ENABLE, bytes([((1 << size) - 1) << offset]))
      self.xwrite(TLP_FMT_TYPE, bytes([fmt_type]))
      self.xwrite(TLP_TRIGGER, b"\x0f")
      self.xwrite(TLP_STATUS, bytes([TLP_START]))
      if posted(fmt_type): return None
      deadline = time.monotonic() + self.timeout
      while not (stat := self.xread(TLP_STATUS, 1)[0]) & (TLP_DONE | TLP_ERROR):
        if time.monotonic() > deadline: raise BridgeError(f"TLP 0x{fmt_type:02x} at 0x{address:x}: no completion in {self.timeout} s")
      if stat & TLP_ERROR:
        self.xwrite(TLP_STATUS, bytes([TLP_ERROR]))
        continue
      cpl = struct.unpack(">H", self.xread(TLP_COMPLETION, 2))[0]
      status, with_data = cpl >> 13, bool(self.xread(TLP_CPL_FLAGS, 1)[0] & 1)
      if status: raise BridgeError(f"TLP 0x{fmt_type:02x} at 0x{address:x}: completion status {CPL_STATUS.get(status, f'reserved ({status})')}",
                                   "the function or address is not there (is the GPU powered and the link up?)")
      if with_data != (value is None):
        raise BridgeError(f"TLP 0x{fmt_type:02x} at 0x{address:x}: a {'read' if value is None else 'write'} completed "
                          f"{'with' if with_data else 'without'} data")
      if value is not None: return None
      return (struct.unpack(">I", self.xread(TLP_DATA, 4))[0] >> (8 * offset)) & ((1 << (8 * size)) - 1)
    raise BridgeError(f"TLP 0x{fmt_type:02x} at 0x{address:x}: the engine reported an error {self.retries + 1} times")

  def cfg_read(self, bus: int, dev: int, fn: int, offset: int, size: int = 4) -> int:
    return int(self.tlp(CFGRD1 if bus else CFGRD0, config_address(bus, dev, fn, offset), None, size) or 0)

  def cfg_write(self, bus: int, dev: int, fn: int, offset: int, value: int, size: int = 4) -> None:
    self.tlp(CFGWR1 if bus else CFGWR0, config_address(bus, dev, fn, offset), value, size)

  def mem_read32(self, address: int) -> int: return int(self.tlp(MRD32, address) or 0)
  def mem_write32(self, address: int, value: int) -> None: self.tlp(MWR32, address, value & 0xFFFFFFFF)


class BridgeMMIO:
  """One BAR of the GPU behind the bridge as an MMIO (memory TLPs, one per dword)."""

  def __init__(self, bridge: ASM24Bridge, base: int, size: int):
    self.bridge, self.base, self.size = bridge, base, size

  def _check(self, offset: int) -> None:
    if offset & 3 or not 0 <= offset <= self.size - 4:
      from plugrt_amd_pci.regs import RegisterError
      raise RegisterError(f"access at 0x{offset:x} outside the {self.size}-byte BAR behind the bridge")

  def read32(self, offset: int) -> int:
    self._check(offset)
    return self.bridge.mem_read32(self.base + offset)

  def write32(self, offset: int, value: int) -> None:
    self._check(offset)
    self.bridge.mem_write32(self.base + offset, value)


@dataclass
class GPUBehindBridge:
  """The AMD GPU function find_gpu reached behind the bridge: its bus, ids, and the BARs it placed."""
  bus: int
  vendor: int
  device: int
  class_code: int
  bars: dict[int, tuple[int, int]]     # BAR index -> (address, size)
  bridges: list[int]                   # buses of the PCI-to-PCI bridges on the way


def _size_bar(b: ASM24Bridge, bus: int, off: int) -> tuple[int, bool, bool]:
  """(size, 64-bit, prefetchable) of the memory BAR at config offset `off` (0 size: I/O or unimplemented)."""
  orig = b.cfg_read(bus, 0, 0, off)
  if orig & 1: return 0, False, False                                  # I/O BAR
  wide, pref = (orig >> 1) & 3 == 2, bool(orig & 8)
  b.cfg_write(bus, 0, 0, off, 0xFFFFFFFF)
  lo = b.cfg_read(bus, 0, 0, off) & 0xFFFFFFF0
  hi = 0xFFFFFFFF
  if wide:
    b.cfg_write(bus, 0, 0, off + 4, 0xFFFFFFFF)
    hi = b.cfg_read(bus, 0, 0, off + 4)
  mask = (hi << 32 | lo) if wide else (0xFFFFFFFF00000000 | lo)
  return ((~mask) + 1) & 0xFFFFFFFFFFFFFFFF if lo or (wide and hi) else 0, wide, pref


def find_gpu(b: ASM24Bridge, vendor: int = 0x1002, max_depth: int = 8, mem_base: int = 0x1000_0000,
             pref_base: int = 8 << 30) -> GPUBehindBridge:
  """Walk type-1 (bridge) headers from bus 0, numbering buses and opening their windows, to the first `vendor`
  function with a type-0 header; size its memory BARs and place them (non-prefetchable from `mem_base`,
  prefetchable from `pref_base`, each aligned to its size); enable memory decoding and bus mastering."""
  bridges = []
  for bus in range(max_depth):
    vid = b.cfg_read(bus, 0, 0, PCI_VENDOR, 2)
    if vid == 0xFFFF: raise BridgeError(f"no function at {bus:02x}:00.0 behind the bridge", "is the GPU powered and seated?")
    if b.cfg_read(bus, 0, 0, PCI_HEADER_TYPE, 1) & 0x7F == 1:            # a PCI-to-PCI bridge: route the next bus through it
      b.cfg_write(bus, 0, 0, PCI_BUSES, (bus) | (bus + 1) << 8 | (max_depth) << 16 | (b.cfg_read(bus, 0, 0, PCI_BUSES) & 0xFF000000))
      b.cfg_write(bus, 0, 0, PCI_MEMORY_BASE, ((mem_base >> 16) & 0xFFF0) | 0xFFF0 << 16)
      b.cfg_write(bus, 0, 0, PCI_PREF_BASE, ((pref_base >> 16) & 0xFFF0) | 0xFFF0 << 16)
      b.cfg_write(bus, 0, 0, PCI_PREF_BASE_UPPER, pref_base >> 32)
      b.cfg_write(bus, 0, 0, PCI_PREF_BASE_UPPER + 4, 0xFFFFFFFF)
      b.cfg_write(bus, 0, 0, PCI_COMMAND, CMD_MEMORY | CMD_MASTER, 2)
      bridges.append(bus)
      continue
    if vid != vendor: raise BridgeError(f"{bus:02x}:00.0 behind the bridge is vendor 0x{vid:04x}, not 0x{vendor:04x}")
    bars: dict[int, tuple[int, int]] = {}
    nxt = {False: mem_base, True: pref_base}
    i = 0
    while i < 6:
      size, wide, pref = _size_bar(b, bus, PCI_BAR0 + 4 * i)
      if size:
        addr = (nxt[pref] + size - 1) // size * size
        nxt[pref] = addr + size
        b.cfg_write(bus, 0, 0, PCI_BAR0 + 4 * i, addr & 0xFFFFFFFF)
        if wide: b.cfg_write(bus, 0, 0, PCI_BAR0 + 4 * i + 4, addr >> 32)
        bars[i] = (addr, size)
      i += 2 if wide else 1
    b.cfg_write(bus, 0, 0, PCI_COMMAND, CMD_MEMORY | CMD_MASTER, 2)
    cls = b.cfg_read(bus, 0, 0, PCI_CLASS_REV) >> 8
    return GPUBehindBridge(bus, vid, b.cfg_read(bus, 0, 0, 2, 2), cls, bars, bridges)
  raise BridgeError(f"no vendor 0x{vendor:04x} function within {max_depth} buses behind the bridge")
