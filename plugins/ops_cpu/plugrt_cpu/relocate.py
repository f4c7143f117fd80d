"""A minimal in-process linker for the CPU compilers' relocatable objects on x86-64.

Both compilers build without PIC in the large code model, so every address in an object is an absolute 64-bit
relocation (R_X86_64_64: symbol + addend) and nothing needs a GOT, a PLT or a reach limit. This module maps the
object's allocated sections into fresh anonymous memory, resolves undefined symbols in the process (libm's
functions), applies those relocations and makes the memory read+execute: a load with no LLVM in the process
(llvmlite's JIT, the fallback, is slow to import). Anything it does not know (another
machine, another relocation type, a writable section, an unresolved symbol) returns None, and the caller links
the object with LLVM's JIT instead, which knows every case.

ELF layouts (section header, symbol, RELA entry) and R_X86_64_64's number are the System V ABI's (the ELF gABI and
the AMD64 psABI, "Relocation Types").
"""
from __future__ import annotations

import ctypes
import mmap
import struct
from typing import Any

SHT_SYMTAB, SHT_RELA, SHT_NOBITS = 2, 4, 8
SHF_WRITE, SHF_ALLOC, SHF_EXECINSTR = 0x1, 0x2, 0x4
R_X86_64_NONE, R_X86_64_64 = 0, 1
EM_X86_64 = 62
_SKIPPED = (b".eh_frame",)  # unwind tables: C kernels never unwind, and they carry PC-relative relocations

_libc: Any = None


def _c() -> Any:
  global _libc
  if _libc is None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype, libc.mmap.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                                                             ctypes.c_int, ctypes.c_long]
    libc.mprotect.restype, libc.mprotect.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.munmap.restype, libc.munmap.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t]
    _libc = libc
  return _libc


class Mapped:
  """The memory holding one linked object; unmapped with it."""
  __slots__ = ("addr", "size")

  def __init__(self, addr: int, size: int): self.addr, self.size = addr, size

  def __del__(self) -> None:
    try: _c().munmap(self.addr, self.size)
    except Exception: pass  # interpreter shutdown


def _process_symbol(name: str) -> int:
  try: return ctypes.cast(getattr(_c(), name), ctypes.c_void_p).value or 0
  except AttributeError: return 0


def link(obj: bytes, name: str) -> tuple[int, Mapped] | None:
  """(address of function `name`, owner of the memory) for an x86-64 relocatable object that check_elf accepted,
  or None when this linker does not handle the object (the caller uses LLVM's JIT)."""
  if len(obj) < 64 or struct.unpack_from("<H", obj, 18)[0] != EM_X86_64: return None
  shoff, = struct.unpack_from("<Q", obj, 0x28)
  shnum, shstrndx = struct.unpack_from("<HH", obj, 0x3C)
  secs = [struct.unpack_from("<IIQQQQIIQQ", obj, shoff + i * 64) for i in range(shnum)]
  shstr = secs[shstrndx][4]

  def sec_name(i: int) -> bytes:
    start = shstr + secs[i][0]
    return obj[start:obj.index(b"\0", start)]

  # lay out the allocated sections one after another, each at its alignment
  place: dict[int, int] = {}
  size = 0
  for i, (_, _, flags, _, _, sh_size, _, _, align, _) in enumerate(secs):
    if not flags & SHF_ALLOC or sec_name(i).startswith(_SKIPPED) or (flags & SHF_WRITE and not sh_size): continue  # gcc's empty .data
    if flags & SHF_WRITE: return None  # kernels keep no writable data; the memory becomes read+execute
    align = max(int(align), 1)
    if align & (align - 1) or align > mmap.PAGESIZE: return None
    size = -(-size // align) * align
    place[i] = size
    size += sh_size
  symtabs = [s for s in secs if s[1] == SHT_SYMTAB]
  if not place or len(symtabs) != 1: return None
  _, _, _, _, sym_off, sym_size, str_link, _, _, sym_ent = symtabs[0]
  if sym_ent != 24: return None
  strtab = secs[str_link][4]
  nsyms = sym_size // 24

  def symbol(k: int) -> tuple[bytes, int, int]:  # (name, section index, value)
    st_name, _, _, st_shndx, st_value, _ = struct.unpack_from("<IBBHQQ", obj, sym_off + k * 24)
    start = strtab + st_name
    return obj[start:obj.index(b"\0", start)], st_shndx, st_value

  # every relocation must be one this linker knows, into a placed section, of a resolvable symbol: check all first
  fixups: list[tuple[int, int, int, int]] = []  # (offset in the memory, symbol, addend, target section)
  for _, sh_type, _, _, off, rsize, link_sec, info, _, ent in secs:
    if sh_type != SHT_RELA: continue
    if info not in place:
      if info < shnum and (secs[info][2] & SHF_ALLOC) and not sec_name(info).startswith(_SKIPPED): return None
      continue  # relocations of a section that is not loaded (.eh_frame, debug info)
    if ent != 24 or secs[link_sec][1] != SHT_SYMTAB: return None
    target_size = secs[info][5]
    for pos in range(off, off + rsize - rsize % 24, 24):
      r_offset, r_info, r_addend = struct.unpack_from("<QQq", obj, pos)
      rtype, sym = r_info & 0xFFFFFFFF, r_info >> 32
      if rtype == R_X86_64_NONE: continue
      if rtype != R_X86_64_64 or sym >= nsyms or r_offset + 8 > target_size: return None
      fixups.append((place[info] + r_offset, sym, r_addend, info))
  absolute: dict[int, int] = {}  # undefined symbols: their addresses in the process
  local: dict[int, int] = {}  # defined symbols: their offsets in our memory
  for _, sym, _, _ in fixups:
    if sym in absolute or sym in local: continue
    sname, shndx, value = symbol(sym)
    if shndx == 0:  # undefined: a function of the process (libm)
      if not (addr := _process_symbol(sname.decode(errors="replace"))): return None
      absolute[sym] = addr
    elif shndx in place: local[sym] = place[shndx] + value
    else: return None  # an absolute or common symbol, or one in a section not loaded
  entry = None
  for k in range(1, nsyms):
    nm, shndx, value = symbol(k)
    if nm == name.encode() and shndx in place and secs[shndx][2] & SHF_EXECINSTR: entry = place[shndx] + value
  if entry is None: return None

  libc = _c()
  total = -(-max(size, 1) // mmap.PAGESIZE) * mmap.PAGESIZE
  base = libc.mmap(None, total, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
  if base in (None, ctypes.c_void_p(-1).value): return None
  mem = Mapped(base, total)
  for i, at in place.items():
    if secs[i][1] != SHT_NOBITS: ctypes.memmove(base + at, obj[secs[i][4]:secs[i][4] + secs[i][5]], secs[i][5])  # else: zeros
  for at, sym, addend, _ in fixups:
    target = absolute[sym] if sym in absolute else base + local[sym]
    ctypes.c_uint64.from_address(base + at).value = (target + addend) & 0xFFFFFFFFFFFFFFFF
  if libc.mprotect(base, total, mmap.PROT_READ | mmap.PROT_EXEC) != 0: return None  # W^X policy: JIT it instead
  return base + entry, mem
