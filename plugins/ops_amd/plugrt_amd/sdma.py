"""SDMA packets (the system DMA engine's command stream) as 32-bit words, and back.

Layouts from the Linux kernel's SDMA packet headers (drivers/gpu/drm/amd/amdgpu/vega10_sdma_pkt_open.h, the same
fields in navi10_sdma_pkt_open.h, sdma_v6_0 and sdma_v7_0's headers; docs/research/amd-kfd.md): every packet starts
with a header dword whose bits 0..7 are the opcode and 8..15 the sub-opcode.

- COPY_LINEAR (op 1, sub-op 0), 7 dwords: header, count (bytes - 1, 22 bits: at most 4 MiB a packet),
  parameter (tiling swizzles, 0 for linear), source address lo/hi, destination address lo/hi.
- FENCE (op 5), 4 dwords: header (gfx10+: MTYPE in bits 16..18, 3 = uncached, so the CPU sees the write),
  address lo/hi, the 32-bit value written once everything before it completed.
- TRAP (op 6), 2 dwords: header, the interrupt context (bits 0..27) the interrupt carries: KFD turns an SDMA
  trap into the signal event whose id it carries.
- NOP (op 0), 1 dword.
"""
from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import NamedTuple

OP_NOP, OP_COPY, OP_WRITE, OP_INDIRECT, OP_FENCE, OP_TRAP, OP_POLL_REGMEM = 0, 1, 2, 4, 5, 6, 8
SUBOP_COPY_LINEAR = 0
COPY_LINEAR_MAX = 1 << 22   # bytes one COPY_LINEAR moves (its count field: 22 bits of bytes - 1)
FENCE_MTYPE_SHIFT, FENCE_MTYPE_UC = 16, 3
OP_NAMES = {OP_NOP: "NOP", OP_COPY: "COPY", OP_WRITE: "WRITE", OP_INDIRECT: "INDIRECT", OP_FENCE: "FENCE", OP_TRAP: "TRAP",
            OP_POLL_REGMEM: "POLL_REGMEM"}


def _lo_hi(a: int) -> tuple[int, int]: return a & 0xFFFFFFFF, a >> 32 & 0xFFFFFFFF


def copy_linear(dst: int, src: int, n: int) -> list[int]:
  """Dwords copying n bytes from GPU address src to dst, in as many COPY_LINEAR packets as the 22-bit count needs."""
  if n <= 0: raise ValueError(f"an SDMA copy moves at least one byte, not {n}")
  words: list[int] = []
  for off in range(0, n, COPY_LINEAR_MAX):
    k = min(COPY_LINEAR_MAX, n - off)
    words += [OP_COPY | SUBOP_COPY_LINEAR << 8, k - 1, 0, *_lo_hi(src + off), *_lo_hi(dst + off)]
  return words


def fence(address: int, value: int, uncached: bool = True) -> list[int]:
  """Dwords writing the 32-bit value at address (4-byte aligned) after everything before it. uncached sets
  MTYPE UC (gfx10+ engines; gfx9's SDMA ignores the field)."""
  if address % 4: raise ValueError(f"an SDMA fence writes a 4-byte aligned address, not {address:#x}")
  return [OP_FENCE | (FENCE_MTYPE_UC << FENCE_MTYPE_SHIFT if uncached else 0), *_lo_hi(address), value & 0xFFFFFFFF]


def trap(int_context: int) -> list[int]:
  """Dwords raising an interrupt with int_context (28 bits): KFD signals the event whose id it is."""
  return [OP_TRAP, int_context & 0x0FFFFFFF]


def nop(count: int = 1) -> list[int]: return [OP_NOP] * count


def to_bytes(words: list[int]) -> bytes: return struct.pack(f"<{len(words)}I", *words)


class Packet(NamedTuple):
  op: str
  fields: dict[str, int]
  size: int  # dwords


class SDMAError(ValueError):
  """Dwords the SDMA engine does not execute."""


def decode_one(words: tuple[int, ...] | list[int], i: int = 0) -> Packet:
  """The packet starting at words[i]."""
  w = words[i]
  op, sub = w & 0xFF, w >> 8 & 0xFF
  need = {OP_NOP: 1, OP_COPY: 7, OP_FENCE: 4, OP_TRAP: 2}.get(op)
  if need is None: raise SDMAError(f"SDMA header {w:#010x}: opcode {op} ({OP_NAMES.get(op, 'unknown')}) is not one plugrt writes")
  if i + need > len(words): raise SDMAError(f"SDMA {OP_NAMES[op]} packet needs {need} dwords, {len(words) - i} are left")
  p = words[i:i + need]
  if op == OP_NOP: return Packet("NOP", {}, 1)
  if op == OP_COPY:
    if sub != SUBOP_COPY_LINEAR: raise SDMAError(f"SDMA header {w:#010x}: copy sub-opcode {sub} is not COPY_LINEAR")
    if p[1] >> 22: raise SDMAError(f"SDMA COPY_LINEAR count {p[1]:#x} is wider than 22 bits")
    return Packet("COPY_LINEAR", {"count": (p[1] & 0x3FFFFF) + 1, "parameter": p[2], "src": p[3] | p[4] << 32, "dst": p[5] | p[6] << 32}, 7)
  if op == OP_FENCE: return Packet("FENCE", {"mtype": w >> FENCE_MTYPE_SHIFT & 7, "address": p[1] | p[2] << 32, "value": p[3]}, 4)
  return Packet("TRAP", {"int_context": p[1] & 0x0FFFFFFF}, 2)


def decode(words: tuple[int, ...] | list[int]) -> Iterator[Packet]:
  i = 0
  while i < len(words):
    pk = decode_one(words, i)
    yield pk
    i += pk.size
