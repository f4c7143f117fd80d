"""Load either compiler's binary as a CPUProgram: a relocatable object (both compilers) is linked
in-process (plugrt_cpu.relocate, else LLVM's JIT), a shared object (built by hand, or cached by an older plugrt) is dlopen'ed
from memory; its groups are
run by the grid runner of the compiler that made it (plugrt_cpu.grid)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
  from plugrt.ir import Signature

ET_REL, ET_DYN = 1, 3
_MACHINES = {"x86_64": 62, "amd64": 62, "aarch64": 183, "arm64": 183, "riscv64": 243, "ppc64le": 21}


_bound: Any = None  # (plugrt.elf.check_elf, this machine's ELF number, CPUProgram, grid_runner, link), at the first load


def _deps() -> Any:
  """What a load uses, imported once: an import statement inside a function costs about 1 us on every call, and a
  process that loads cached kernels pays each one per kernel (the load is about 40 us; a cache hit 5)."""
  global _bound
  if _bound is None:
    import platform

    from plugrt.elf import check_elf as check
    from plugrt_cpu.grid import grid_runner
    from plugrt_cpu.program import CPUProgram
    from plugrt_cpu.relocate import link
    _bound = (check, _MACHINES.get(platform.machine().lower()), CPUProgram, grid_runner, link)
  return _bound


def check_elf(lib: bytes, name: str) -> int:
  """The ELF type of a CPU binary once plugrt.elf.check_elf found it whole and for this machine; PluginError otherwise."""
  check, machine = _deps()[:2]
  return check(lib, f"CPU program {name}", (ET_REL, ET_DYN), machine)


def load_program(device: Any, name: str, lib: bytes, signature: Signature) -> Any:
  _, _, CPUProgram, grid_runner, _ = _deps()
  kind = check_elf(lib, name)
  if kind == ET_DYN:
    from plugrt_cpu.clang import load_shared
    addr, owner = load_shared(lib, name)
  else: addr, owner = load_relocatable(lib, name)
  compiler = _compiler_of(lib)
  return CPUProgram(device, name, lib, signature, addr, owner, grid_runner(device, compiler), compiler)


def _compiler_of(lib: bytes) -> str:
  """Which compiler made an object (its runner is tried first): LLVM's objects say nothing of clang in .comment."""
  return "CLANG" if b"clang version" in lib or b"GCC: (" in lib else "LLVM"


def load_relocatable(lib: bytes, name: str) -> tuple[int, Any]:
  """Link a relocatable object into the process (checked by check_elf first): plugrt's own linker where it knows the
  object (x86-64, absolute relocations: no LLVM needed), else LLVM's JIT. Returns (address of `name`, owner)."""
  if (linked := _deps()[4](lib, name)) is not None: return linked
  from plugrt_cpu.llvm import load_object
  return load_object(lib, name)
