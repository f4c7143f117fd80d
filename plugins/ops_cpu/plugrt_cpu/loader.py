"""Load either compiler's binary as a CPUProgram: a shared object (CLANG) is dlopen'ed
from memory, a relocatable object (LLVM) is linked in-process by LLVM's JIT."""
from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any

from plugrt.errors import PluginError

if TYPE_CHECKING:
  from plugrt.ir import Signature

ET_REL, ET_DYN = 1, 3
SHT_NULL, SHT_NOBITS = 0, 8
PT_LOAD, PT_DYNAMIC = 1, 2
_MACHINES = {"x86_64": 62, "amd64": 62, "aarch64": 183, "arm64": 183, "riscv64": 243, "ppc64le": 21}


def check_elf(lib: bytes, name: str) -> int:
  """The ELF type of `lib` once its headers, program headers and sections are all inside the file and it
  is for this machine; PluginError otherwise. dlopen and LLVM's JIT trust these tables: a truncated or
  foreign file handed to them crashes the process (SIGSEGV, SIGBUS or an abort) instead of raising."""
  def bad(why: str) -> PluginError: return PluginError(f"CPU program {name}: not a loadable ELF object: {why}")
  n = len(lib)
  if n < 64 or lib[:4] != b"\x7fELF": raise bad("no ELF header")
  if lib[4:7] != b"\x02\x01\x01": raise bad("not a 64-bit little-endian ELF")
  kind, machine = struct.unpack_from("<HH", lib, 16)
  if kind not in (ET_REL, ET_DYN): raise bad(f"ELF type {kind} is neither a shared nor a relocatable object")
  import platform
  if (want := _MACHINES.get(platform.machine().lower())) is not None and machine != want: raise bad(f"built for machine {machine}, not {want}")
  phoff, shoff = struct.unpack_from("<QQ", lib, 32)
  phentsize, phnum, shentsize, shnum, shstrndx = struct.unpack_from("<HHHHH", lib, 54)
  if phnum:
    if phentsize != 56 or phoff + phnum * 56 > n: raise bad(f"its program headers end past its {n} bytes")
    types = set()
    for i in range(phnum):
      p_type, _, p_offset, _, _, p_filesz, p_memsz, _ = struct.unpack_from("<IIQQQQQQ", lib, phoff + i * 56)
      if p_offset + p_filesz > n or (p_filesz > p_memsz and p_type == PT_LOAD): raise bad(f"segment {i} ends past its {n} bytes")
      types.add(p_type)
    if kind == ET_DYN and not {PT_LOAD, PT_DYNAMIC} <= types: raise bad("a shared object without loadable or dynamic segments")
  elif kind == ET_DYN: raise bad("a shared object without program headers")
  if not shnum:
    if kind == ET_REL: raise bad("a relocatable object without sections")
    return kind
  if shentsize != 64 or shoff + shnum * 64 > n or shstrndx >= shnum: raise bad(f"its section table ends past its {n} bytes")
  for i in range(shnum):
    _, sh_type, _, _, sh_offset, sh_size, sh_link, _, _, _ = struct.unpack_from("<IIQQQQIIQQ", lib, shoff + i * 64)
    if sh_type not in (SHT_NULL, SHT_NOBITS) and sh_offset + sh_size > n: raise bad(f"section {i} ends past its {n} bytes")
    if sh_link >= shnum: raise bad(f"section {i} links to section {sh_link} of {shnum}")
  return kind


def load_program(device: Any, name: str, lib: bytes, signature: Signature) -> Any:
  from plugrt_cpu.program import CPUProgram
  kind = check_elf(lib, name)
  if kind == ET_DYN:
    from plugrt_cpu.clang import load_shared
    addr, owner = load_shared(lib, name)
  else:
    from plugrt_cpu.llvm import load_object
    addr, owner = load_object(lib, name)
  return CPUProgram(device, name, lib, signature, addr, owner)
