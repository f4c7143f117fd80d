"""Load either compiler's binary as a CPUProgram: a relocatable object (both compilers) is linked in-process
(plugrt_cpu.objects), a shared object (built by hand, or cached by an older plugrt) is dlopen'ed from memory; its groups
are run by the grid runner of the compiler that made it (plugrt_cpu.grid)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from plugrt_cpu.grid import grid_runner
from plugrt_cpu.objects import ET_DYN, check_elf, load_relocatable
from plugrt_cpu.program import CPUProgram

if TYPE_CHECKING:
  from plugrt.compiler.ir import Signature


def load_program(device: Any, name: str, lib: bytes, signature: Signature) -> Any:
  kind = check_elf(lib, name)
  if kind == ET_DYN:
    from plugrt_cpu.clang import load_shared  # (only for shared objects, which nothing makes any more)
    addr, owner = load_shared(lib, name)
  else: addr, owner = load_relocatable(lib, name)
  compiler = _compiler_of(lib)
  return CPUProgram(device, name, lib, signature, addr, owner, grid_runner(device, compiler), compiler)


def _compiler_of(lib: bytes) -> str:
  """Which compiler made an object (its runner is tried first): LLVM's objects say nothing of clang in .comment."""
  return "CLANG" if b"clang version" in lib or b"GCC: (" in lib else "LLVM"
