"""Structural checks of ELF files before a loader trusts them.

dlopen, LLVM's JIT, GPU drivers and plugrt's own cubin reader take the ELF header, program
headers and section table at their word: a truncated or foreign file makes them read past
its end (SIGSEGV, SIGBUS, an abort, or garbage code on a GPU) instead of failing. check_elf
makes sure every table and everything they point to lies inside the file first.
"""
from __future__ import annotations

import struct

from plugrt.errors import PluginError

ET_REL, ET_EXEC, ET_DYN = 1, 2, 3
SHT_NULL, SHT_NOBITS = 0, 8
PT_LOAD, PT_DYNAMIC = 1, 2


def check_elf(blob: bytes, what: str, types: tuple[int, ...], machine: int | None = None) -> int:
  """The ELF type of `blob` (a 64-bit little-endian ELF of one of `types`, for `machine` when given) once its
  headers, segments and sections all lie inside it; PluginError naming `what` otherwise."""
  def bad(why: str) -> PluginError: return PluginError(f"{what}: not a loadable ELF object: {why}")
  n = len(blob)
  if n < 64 or blob[:4] != b"\x7fELF": raise bad("no ELF header")
  if blob[4:7] != b"\x02\x01\x01": raise bad("not a 64-bit little-endian ELF")
  kind, mach = struct.unpack_from("<HH", blob, 16)
  if kind not in types: raise bad(f"ELF type {kind}, not {' or '.join(map(str, types))}")
  if machine is not None and mach != machine: raise bad(f"built for machine {mach}, not {machine}")
  phoff, shoff = struct.unpack_from("<QQ", blob, 32)
  phentsize, phnum, shentsize, shnum, shstrndx = struct.unpack_from("<HHHHH", blob, 54)
  if phnum:
    if phentsize != 56 or phoff + phnum * 56 > n: raise bad(f"its program headers end past its {n} bytes")
    seen = set()
    for i in range(phnum):
      p_type, _, p_offset, _, _, p_filesz, p_memsz, _ = struct.unpack_from("<IIQQQQQQ", blob, phoff + i * 56)
      if p_offset + p_filesz > n or (p_type == PT_LOAD and p_filesz > p_memsz): raise bad(f"segment {i} ends past its {n} bytes")
      seen.add(p_type)
    if kind == ET_DYN and not {PT_LOAD, PT_DYNAMIC} <= seen: raise bad("a shared object without loadable or dynamic segments")
  elif kind != ET_REL: raise bad("no program headers")
  if not shnum:
    if kind == ET_REL: raise bad("a relocatable object without sections")
    return kind
  if shentsize != 64 or shoff + shnum * 64 > n or shstrndx >= shnum: raise bad(f"its section table ends past its {n} bytes")
  for i in range(shnum):
    _, sh_type, _, _, sh_offset, sh_size, sh_link, _, _, _ = struct.unpack_from("<IIQQQQIIQQ", blob, shoff + i * 64)
    if sh_type not in (SHT_NULL, SHT_NOBITS) and sh_offset + sh_size > n: raise bad(f"section {i} ends past its {n} bytes")
    if sh_link >= shnum: raise bad(f"section {i} links to section {sh_link} of {shnum}")
  return kind
