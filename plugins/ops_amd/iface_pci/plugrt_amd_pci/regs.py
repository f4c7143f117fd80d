"""Register and VRAM access of an AMD GPU with no kernel driver: the one seam the PCI and USB interfaces share.

An interface gives `GPURegisters` an `MMIO` window onto the GPU's register BAR (the sysfs resource file mapped by
plugrt-amd-pci, or memory TLPs through the USB bridge by plugrt-amd-usb) and, when it has one, a window onto the
VRAM BAR. On top of that:

- `rreg(reg)` / `wreg(reg, value)`: registers by dword offset, as amdgpu numbers them; a register beyond the mapped
  BAR goes through the NBIO block's index/data pair (the kernel's pcie_rreg: write the byte address to the index
  register, read the data register), known once IP discovery says which NBIO the GPU has (`use_nbio`);
- `smn_read(addr)` / `smn_write`: the same pair for system-management-network addresses;
- `read_vram(offset, n)`: through the VRAM BAR where it reaches, else through MM_INDEX/MM_INDEX_HI/MM_DATA (bit 31
  of MM_INDEX selects VRAM), as the kernel's amdgpu_device_mm_access does when VRAM is not CPU-visible;
- `write_vram(offset, data)`: the same two ways, for the buffers the PSP reads (plugrt_amd_pci.psp);
- `vram_size()`: RCC_CONFIG_MEMSIZE (MiB), the one register the driver reads before it knows any IP base.

Constants and their sources: docs/research/amd-pci.md. Nothing here has run on an AMD GPU.
"""
from __future__ import annotations

import struct
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from plugrt.errors import PlugrtError
from plugrt_amd_pci.regtables.nbio import SMN_PAIRS

# fixed register dword offsets (amdgpu_discovery.c; the same on every SOC15+ GPU)
MM_INDEX = 0x0
MM_DATA = 0x1
MM_INDEX_HI = 0x6
RCC_CONFIG_MEMSIZE = 0xDE3
MM_INDEX_VRAM = 1 << 31          # MM_INDEX bit 31: the address is VRAM, not a register
#: the register BAR: BAR5 on every GPU amdgpu drives since CIK (Bonaire); BAR2 on SI and older (amdgpu_device_init)
REGISTER_BAR = 5
REGISTER_BAR_PRE_CIK = 2
VRAM_BAR = 0
DOORBELL_BAR = 2


class RegisterError(PlugrtError, RuntimeError):
  """A register or VRAM access that cannot be made (out of range, no index/data pair known, the GPU not answering)."""


_T = TypeVar("_T")


def poll(read: Callable[[], _T], done: Callable[[_T], Any], timeout: float, sleep: Callable[[float], None] = time.sleep,
         interval: float = 0.0005) -> tuple[bool, _T]:
  """Read until `done(value)` or `timeout` seconds: (True, the value that was done), or (False, the last value read),
  for the caller's typed timeout error. The bounded wait of every bring-up step (PSP, SMU, hubs, RLC, the MEC queue)."""
  end = time.monotonic() + timeout
  while True:
    if done(v := read()): return True, v
    if time.monotonic() >= end: return False, v
    sleep(interval)


class MMIO(Protocol):
  """A 32-bit window onto one BAR: byte offsets, little-endian dwords."""
  size: int
  def read32(self, offset: int) -> int: ...
  def write32(self, offset: int, value: int) -> None: ...


class BufferMMIO:
  """MMIO over a writable buffer (an mmap of a sysfs resource file, or a bytearray in tests)."""

  def __init__(self, buf: memoryview | bytearray, size: int | None = None):
    self.view = memoryview(buf).cast("B")
    self.size = len(self.view) if size is None else size

  def read32(self, offset: int) -> int:
    if offset & 3 or not 0 <= offset <= self.size - 4: raise RegisterError(f"MMIO read at 0x{offset:x} outside the {self.size}-byte BAR")
    return struct.unpack_from("<I", self.view, offset)[0]

  def write32(self, offset: int, value: int) -> None:
    if offset & 3 or not 0 <= offset <= self.size - 4: raise RegisterError(f"MMIO write at 0x{offset:x} outside the {self.size}-byte BAR")
    struct.pack_into("<I", self.view, offset, value & 0xFFFFFFFF)

  def read(self, offset: int, n: int) -> bytes: return bytes(self.view[offset:offset + n])

  def write(self, offset: int, data: bytes) -> None: self.view[offset:offset + len(data)] = data

  def release(self) -> None: self.view.release()


class GPURegisters:
  """Registers and VRAM of one GPU through `mmio` (the register BAR) and, optionally, `vram` (the VRAM BAR) and
  `doorbell` (the doorbell BAR, plugrt_amd_pci.doorbell)."""

  def __init__(self, mmio: MMIO, vram: MMIO | None = None, doorbell: MMIO | None = None):
    self.mmio, self.vram, self.doorbell = mmio, vram, doorbell
    self.smn_pair: tuple[int, int] | None = None   # (index, data) register dword offsets once use_nbio() ran

  def rreg(self, reg: int) -> int:
    if reg * 4 < self.mmio.size: return self.mmio.read32(reg * 4)
    return self.smn_read(reg * 4)

  def wreg(self, reg: int, value: int) -> None:
    if reg * 4 < self.mmio.size: self.mmio.write32(reg * 4, value)
    else: self.smn_write(reg * 4, value)

  def use_nbio(self, version: tuple[int, int, int], bases: tuple[int, ...]) -> None:
    """Set the index/data pair from the NBIO (NBIF) block's version and register bases (from IP discovery)."""
    pair = SMN_PAIRS.get(version[:2])
    if pair is None:
      raise RegisterError(f"no index/data register pair is known for NBIO {'.'.join(map(str, version))}",
                          f"plugrt knows NBIO {', '.join(f'{a}.{b}' for a, b in SMN_PAIRS)}")
    (iseg, ioff), (dseg, doff) = pair
    if max(iseg, dseg) >= len(bases):
      raise RegisterError(f"NBIO {version} lists {len(bases)} register bases; the pair needs segment {max(iseg, dseg)}")
    self.smn_pair = (bases[iseg] + ioff, bases[dseg] + doff)

  def _pair(self, what: str) -> tuple[int, int]:
    if self.smn_pair is None:
      raise RegisterError(f"{what}: beyond the {self.mmio.size}-byte register BAR, and the NBIO index/data pair is not known before IP discovery")
    return self.smn_pair

  def smn_read(self, addr: int) -> int:
    index, data = self._pair(f"read of 0x{addr:x}")
    self.mmio.write32(index * 4, addr)
    self.mmio.read32(index * 4)          # the kernel reads the index back to post the write before reading data
    return self.mmio.read32(data * 4)

  def smn_write(self, addr: int, value: int) -> None:
    index, data = self._pair(f"write of 0x{addr:x}")
    self.mmio.write32(index * 4, addr)
    self.mmio.read32(index * 4)
    self.mmio.write32(data * 4, value)
    self.mmio.read32(data * 4)

  def vram_size(self) -> int:
    mib = self.rreg(RCC_CONFIG_MEMSIZE)
    if mib in (0, 0xFFFFFFFF):
      raise RegisterError(f"RCC_CONFIG_MEMSIZE reads 0x{mib:x}: the GPU does not answer register reads",
                          "the function may be in D3, its memory decoding off, or the link down; reset it (sysfs `reset`) or power-cycle")
    return mib << 20

  def read_vram(self, offset: int, n: int) -> bytes:
    """`n` bytes of VRAM at `offset` (both multiples of 4)."""
    if offset & 3 or n & 3: raise RegisterError(f"VRAM read at 0x{offset:x} of {n} bytes is not dword aligned")
    if self.vram is not None and offset + n <= self.vram.size:
      if (read := getattr(self.vram, "read", None)) is not None: return read(offset, n)
      return b"".join(struct.pack("<I", self.vram.read32(offset + i)) for i in range(0, n, 4))
    out = bytearray()
    hi = None
    for pos in range(offset, offset + n, 4):
      if pos >> 31 != hi: self.wreg(MM_INDEX_HI, (hi := pos >> 31))
      self.wreg(MM_INDEX, (pos & 0x7FFFFFFF) | MM_INDEX_VRAM)
      out += struct.pack("<I", self.rreg(MM_DATA))
    return bytes(out)

  def write_vram(self, offset: int, data: bytes) -> None:
    """Write `data` (padded with zeros to whole dwords) to VRAM at `offset` (a multiple of 4)."""
    if offset & 3: raise RegisterError(f"VRAM write at 0x{offset:x} is not dword aligned")
    data = bytes(data) + bytes(-len(data) % 4)
    if self.vram is not None and offset + len(data) <= self.vram.size:
      if (write := getattr(self.vram, "write", None)) is not None: return write(offset, data)
      for i in range(0, len(data), 4): self.vram.write32(offset + i, struct.unpack_from("<I", data, i)[0])
      return
    hi = None
    for i in range(0, len(data), 4):
      pos = offset + i
      if pos >> 31 != hi: self.wreg(MM_INDEX_HI, (hi := pos >> 31))
      self.wreg(MM_INDEX, (pos & 0x7FFFFFFF) | MM_INDEX_VRAM)
      self.wreg(MM_DATA, struct.unpack_from("<I", data, i)[0])

  def read_vram_bytes(self, at: int, n: int) -> bytes:
    """`n` bytes of VRAM at any `at`: the dwords that hold them, cut to the range."""
    lo = at & ~3
    return self.read_vram(lo, (at + n - lo + 3) & ~3)[at - lo:at - lo + n]

  def write_vram_bytes(self, at: int, data: bytes | memoryview) -> None:
    """Write `data` to VRAM at any `at`, byte-exact: the edge dwords of an unaligned range are read first and their
    other bytes kept (VRAM is written in whole dwords)."""
    lo, hi = at & ~3, (at + len(data) + 3) & ~3
    buf = bytearray(self.read_vram(lo, hi - lo)) if (lo, hi) != (at, at + len(data)) else bytearray(hi - lo)
    buf[at - lo:at - lo + len(data)] = data
    self.write_vram(lo, bytes(buf))
