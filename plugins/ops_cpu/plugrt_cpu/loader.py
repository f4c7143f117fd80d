"""Load either compiler's binary as a CPUProgram: a shared object (CLANG) is dlopen'ed
from memory, a relocatable object (LLVM) is linked in-process by LLVM's JIT."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from plugrt.errors import PluginError

if TYPE_CHECKING:
  from plugrt.ir import Signature

ET_REL, ET_DYN = 1, 3


def load_program(device: Any, name: str, lib: bytes, signature: Signature) -> Any:
  from plugrt_cpu.program import CPUProgram
  if lib[:4] != b"\x7fELF": raise PluginError(f"CPU program {name}: the binary is not an ELF file")
  kind = int.from_bytes(lib[16:18], "little")
  if kind == ET_DYN:
    from plugrt_cpu.clang import load_shared
    addr, owner = load_shared(lib, name)
  elif kind == ET_REL:
    from plugrt_cpu.llvm import load_object
    addr, owner = load_object(lib, name)
  else: raise PluginError(f"CPU program {name}: ELF type {kind} is neither a shared nor a relocatable object")
  return CPUProgram(device, name, lib, signature, addr, owner)
