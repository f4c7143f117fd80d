"""Command encoding, pure Python: push-buffer methods, GPFIFO entries, and QMDs (compute launch descriptors).

Nothing here touches a GPU; tests check every encoding against the documented bit layouts.
"""
from __future__ import annotations

import struct

from plugrt_nv.hw import SUBCH_COMPUTE, SUBCH_COPY, Compute, Copy, Host, QmdLayout

# ---------------------------------------------------------------- push buffer


def header(subch: int, offset: int, count: int) -> int:
  """An incrementing method header: `count` data words go to offset, offset+4, ... on subchannel `subch`."""
  assert offset % 4 == 0 and offset < 1 << 14 and 0 < count < 1 << 13 and 0 <= subch < 8
  return 1 << 29 | count << 16 | subch << 13 | offset >> 2


def method(subch: int, offset: int, *data: int) -> list[int]: return [header(subch, offset, len(data)), *data]


def gp_entry(va: int, words: int) -> int:
  """A GPFIFO entry running `words` 32-bit words of commands at GPU address `va`."""
  if va % 4 or va >= 1 << 40: raise ValueError(f"push buffer address {va:#x} must be 4-byte aligned and below 2^40")
  if not 0 < words < 1 << 21: raise ValueError(f"push buffer segment of {words} words is out of range")
  return va | 1 << 41 | words << 42  # LEVEL=SUBROUTINE, as the driver's own users write it


def split64(x: int) -> tuple[int, int]: return x >> 32 & 0xFFFFFFFF, x & 0xFFFFFFFF


def sem_release(va: int, value: int, wfi: bool = True, timestamp: bool = True) -> list[int]:
  """Host semaphore release of a 32-bit value at `va` (16 bytes: value, 0, 64-bit GPU timestamp in ns), after the engine idles."""
  op = Host.SEM_RELEASE | (Host.SEM_RELEASE_WFI if wfi else 0) | (Host.SEM_TIMESTAMP if timestamp else 0)
  return method(0, Host.SEM_ADDR_LO, va & 0xFFFFFFFF, va >> 32, value & 0xFFFFFFFF, 0, op)


def sem_acquire(va: int, value: int) -> list[int]:
  """Host semaphore acquire: the channel waits until the 32-bit value at `va` reaches `value` (circular compare)."""
  return method(0, Host.SEM_ADDR_LO, va & 0xFFFFFFFF, va >> 32, value & 0xFFFFFFFF, 0, Host.SEM_ACQ_CIRC_GEQ)


def compute_setup(cls: int, shared_window: int, local_window: int) -> list[int]:
  return [*method(SUBCH_COMPUTE, Compute.SET_OBJECT, cls),
          *method(SUBCH_COMPUTE, Compute.SET_SHADER_LOCAL_MEMORY_WINDOW_A, *split64(local_window)),
          *method(SUBCH_COMPUTE, Compute.SET_SHADER_SHARED_MEMORY_WINDOW_A, *split64(shared_window))]


def local_memory(va: int, bytes_per_tpc: int) -> list[int]:
  """Where the compute engine keeps every thread's local memory (stacks), and how much each TPC gets."""
  return [*method(SUBCH_COMPUTE, Compute.SET_SHADER_LOCAL_MEMORY_A, *split64(va)),
          *method(SUBCH_COMPUTE, Compute.SET_SHADER_LOCAL_MEMORY_NON_THROTTLED_A, *split64(bytes_per_tpc), 0xFF)]


def launch(qmd_va: int, invalidate: int = Compute.INVALIDATE_ALL) -> list[int]:
  """Invalidate the SMs' caches named in `invalidate` (global data: what earlier work wrote; instructions and
  constants: after new code or constant data appeared where the GPU may have cached old ones), then start the grid
  the QMD at `qmd_va` describes."""
  if qmd_va % 256 or qmd_va >= 1 << 40: raise ValueError(f"QMD address {qmd_va:#x} must be 256-byte aligned and below 2^40")
  return [*(method(SUBCH_COMPUTE, Compute.INVALIDATE_SHADER_CACHES_NO_WFI, invalidate) if invalidate else []),
          *method(SUBCH_COMPUTE, Compute.SEND_PCAS_A, qmd_va >> 8),
          *method(SUBCH_COMPUTE, Compute.SEND_SIGNALING_PCAS2_B, Compute.PCAS_PREFETCH_SCHEDULE)]


def copy_setup(cls: int) -> list[int]: return method(SUBCH_COPY, Compute.SET_OBJECT, cls)


def copy(dst: int, src: int, nbytes: int) -> list[int]:
  """Copy engine: `nbytes` from GPU address `src` to `dst` (linear), in pieces the engine takes."""
  out: list[int] = []
  for off in range(0, nbytes, Copy.MAX_LINE):
    n = min(Copy.MAX_LINE, nbytes - off)
    out += [*method(SUBCH_COPY, Copy.OFFSET_IN_UPPER, *split64(src + off), *split64(dst + off)),
            *method(SUBCH_COPY, Copy.LINE_LENGTH_IN, n), *method(SUBCH_COPY, Copy.LAUNCH_DMA, Copy.DMA_COPY)]
  return out


def copy_release(va: int, value: int) -> list[int]:
  """Copy engine: when its copies are done and flushed, write `value` (32 bits) and a timestamp at `va`."""
  return [*method(SUBCH_COPY, Copy.SET_SEMAPHORE_A, *split64(va), value & 0xFFFFFFFF), *method(SUBCH_COPY, Copy.LAUNCH_DMA, Copy.DMA_RELEASE)]


def words(cmds: list[int]) -> bytes: return struct.pack(f"<{len(cmds)}I", *cmds)


# ---------------------------------------------------------------- QMD


class Qmd:
  """A QMD being filled in: fields by name (hw.QMD's layouts), values checked to fit."""

  def __init__(self, layout: QmdLayout):
    self.layout, self.buf = layout, bytearray(layout.size)

  def set(self, name: str, value: int, i: int = 0) -> Qmd:
    hi, lo = self.layout.bits(name, i)
    width = hi - lo + 1
    if not 0 <= value < 1 << width: raise ValueError(f"QMD v{self.layout.version} field {name}={value:#x} does not fit in {width} bits")
    if lo % 8 == 0 and width % 8 == 0:  # whole bytes (grid and block sizes, addresses): no big-integer round trip
      self.buf[lo // 8:lo // 8 + width // 8] = value.to_bytes(width // 8, "little")
      return self
    n = int.from_bytes(self.buf, "little")
    n = n & ~(((1 << width) - 1) << lo) | value << lo
    self.buf[:] = n.to_bytes(len(self.buf), "little")
    return self

  def get(self, name: str, i: int = 0) -> int:
    hi, lo = self.layout.bits(name, i)
    return int.from_bytes(self.buf, "little") >> lo & ((1 << (hi - lo + 1)) - 1)

  def _shifted(self, key: str, value: int, what: str) -> int:
    s = self.layout.shifts.get(key, 0)
    if value & ((1 << s) - 1): raise ValueError(f"QMD v{self.layout.version}: {what} {value:#x} must be a multiple of {1 << s}")
    return value >> s

  def set_program(self, va: int) -> Qmd:
    v = self._shifted("program", va, "program address")
    return self.set("program_lo", v & 0xFFFFFFFF).set("program_hi", v >> 32)

  def set_shared(self, nbytes: int) -> Qmd: return self.set("shared_size", self._shifted("shared_size", nbytes, "shared memory size"))
  def set_local_high(self, nbytes: int) -> Qmd: return self.set("local_high", self._shifted("local", nbytes, "local memory size"))

  def set_cbuf(self, i: int, va: int, size: int) -> Qmd:
    a = self._shifted("cbuf_addr", va, "constant buffer address")
    self.set("cbuf_addr_lo", a & 0xFFFFFFFF, i).set("cbuf_addr_hi", a >> 32, i)
    return self.set("cbuf_size", self._shifted("cbuf_size", size, "constant buffer size"), i).set("cbuf_valid", 1, i).set("cbuf_invalidate", 1, i)

  def set_dims(self, grid: tuple[int, int, int], block: tuple[int, int, int]) -> Qmd:
    for n, v in zip(("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z"), (*grid, *block)): self.set(n, v)
    return self

  def cbuf_patch(self, i: int) -> tuple[int, int, int]:
    """(byte offset, shift, high word): what a launch writes to move constant buffer i to another address:
    pack "<II" at the offset: (va >> shift) & 0xffffffff, high word | (va >> shift) >> 32. The address must be
    the only thing in those two words that changes, which every layout here satisfies (tests check it)."""
    hi, lo = self.layout.bits("cbuf_addr_lo", i)
    assert lo % 32 == 0 and hi == lo + 31
    off = lo // 8
    word = struct.unpack_from("<I", self.buf, off + 4)[0]
    ahi, alo = self.layout.bits("cbuf_addr_hi", i)
    assert alo == lo + 32 and ahi < lo + 64
    return off, self.layout.shifts.get("cbuf_addr", 0), word & ~((1 << (ahi - alo + 1)) - 1)
