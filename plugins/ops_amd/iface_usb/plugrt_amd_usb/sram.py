"""The ASM24xx bridge's SRAM window: the bulk data path between the host and the GPU behind the bridge.

A dword memory TLP per request moves 4 bytes for about seven XDATA commands; a 1 MiB firmware image written into
VRAM that way is 262,144 TLPs. The bridge's stock firmware has a bulk path instead, which is not a write into the
GPU's BAR: a SCSI WRITE(16) whose data-out phase (512-byte sectors) lands in the bridge's own 512 KiB SRAM, and the
SRAM is a PCIe *completer* at bus address 0x200000: the GPU reads it (and writes it) with its own DMA, as it reads
system memory. So a buffer the GPU only has to read (a PSP firmware image, an SDMA copy source) goes into the SRAM in
a few commands and is handed to the GPU by its bus address, mapped through the GART; VRAM itself is still written
with TLPs (no bridge-side engine that copies the SRAM into the BAR is documented for the stock firmware).

The protocol, as the public reference drives it (tinygrad's ASM24Controller.scsi_write; the meaning of the XDATA
writes is not public, they are sent as data): a burst starts at SRAM offset 0; one WRITE(16) per command, each
followed by XDATA 0x171 <- FF FF FF and then 0xCE6E <- 00 00; a burst over 16 KiB is padded to whole 64 KiB and sent
64 KiB per command, and ends with 0xCE40..0xCE43 <- 00 (one byte each). The host reads the SRAM back only through
XDATA reads at 0xF000 (255 bytes per command; the reference reads at most 4 KiB that way). Never run on a bridge.
"""
from __future__ import annotations

import struct

from plugrt_amd_usb.asm24 import ASM24Bridge

CDB_WRITE16 = 0x8A             # SCSI WRITE(16): opcode, flags, LBA (u64 BE), transfer length in sectors (u32 BE), group, control
SECTOR = 512
SRAM_SIZE = 0x80000            # 512 KiB
SRAM_BUS = 0x200000            # where PCIe requesters (the GPU) find the SRAM
SRAM_XDATA = 0xF000            # where the bridge's controller (XDATA reads) sees it
SRAM_READ_MAX = 0x1000         # the most the reference reads back through XDATA
CHUNK = 0x10000                # bytes per WRITE(16) in a burst over SMALL
SMALL = 0x4000                 # a burst up to this size is one command, padded to whole sectors only
ACK = ((0x171, b"\xff\xff\xff"), (0xCE6E, b"\x00\x00"))       # after every WRITE(16), in this order
BURST_END = tuple((0xCE40 + i, b"\x00") for i in range(4))    # after a burst over SMALL


def write16_cdb(sectors: int, lba: int = 0) -> bytes:
  if not 0 < sectors <= SRAM_SIZE // SECTOR: raise ValueError(f"a WRITE(16) to the bridge's SRAM is 1..{SRAM_SIZE // SECTOR} sectors, not {sectors}")
  return struct.pack(">BBQIBB", CDB_WRITE16, 0, lba, sectors, 0, 0)


def burst(data: bytes) -> list[bytes]:
  """The data-out phases of one burst: padded to sectors (up to SMALL) or to whole CHUNKs, CHUNK bytes per command."""
  if not 0 < len(data) <= SRAM_SIZE: raise ValueError(f"an SRAM burst is 1..{SRAM_SIZE} bytes (the bridge's SRAM), not {len(data)}")
  if len(data) <= SMALL: return [bytes(data) + bytes(-len(data) % SECTOR)]
  padded = bytes(data) + bytes(-len(data) % CHUNK)
  return [padded[i:i + CHUNK] for i in range(0, len(padded), CHUNK)]


def sram_write(bridge: ASM24Bridge, data: bytes) -> int:
  """Put `data` (at most 512 KiB) at the start of the bridge's SRAM; returns the bus address the GPU reads it at."""
  parts = burst(data)
  for part in parts:
    bridge.transport.execute(write16_cdb(len(part) // SECTOR), 0, part)
    for addr, value in ACK: bridge.xwrite(addr, value)
  if len(data) > SMALL:
    for addr, value in BURST_END: bridge.xwrite(addr, value)
  return SRAM_BUS


def sram_read(bridge: ASM24Bridge, offset: int, n: int) -> bytes:
  """`n` bytes the GPU left in the SRAM at `offset` (XDATA reads, 255 bytes per command; at most SRAM_READ_MAX)."""
  if not (0 <= offset and 0 < n and offset + n <= SRAM_READ_MAX):
    raise ValueError(f"the SRAM is read back through XDATA only in its first {SRAM_READ_MAX} bytes, not 0x{offset:x}+{n}")
  return bridge.xread(SRAM_XDATA + offset, n)


def commands(n: int) -> int:
  """Bridge commands to move `n` bytes into the SRAM window (bursts of at most SRAM_SIZE)."""
  total = 0
  for pos in range(0, n, SRAM_SIZE):
    size = min(SRAM_SIZE, n - pos)
    parts = 1 if size <= SMALL else -(-size // CHUNK)
    total += parts * (1 + sum(len(v) for _, v in ACK)) + (len(BURST_END) if size > SMALL else 0)
  return total
