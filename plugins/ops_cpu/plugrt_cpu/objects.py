"""Either CPU compiler's objects linked into the process: the ELF check (plugrt.elf) and the link, by plugrt's own
linker where it knows the object (plugrt_cpu.relocate: x86-64, absolute relocations), else LLVM's JIT. Below the grid
runner and the programs, which both load objects.
"""
from __future__ import annotations

import platform
from typing import Any

from plugrt.elf import check_elf as _check
from plugrt_cpu.relocate import link

ET_REL, ET_DYN = 1, 3
_MACHINES = {"x86_64": 62, "amd64": 62, "aarch64": 183, "arm64": 183, "riscv64": 243, "ppc64le": 21}
MACHINE = _MACHINES.get(platform.machine().lower())  # this machine's ELF number (None: checked as any)


def check_elf(lib: bytes, name: str) -> int:
  """The ELF type of a CPU binary once plugrt.elf.check_elf found it whole and for this machine; PluginError otherwise."""
  return _check(lib, f"CPU program {name}", (ET_REL, ET_DYN), MACHINE)


def load_relocatable(lib: bytes, name: str) -> tuple[int, Any]:
  """Link a relocatable object into the process (checked by check_elf first): plugrt's own linker where it knows the
  object (x86-64, absolute relocations: no LLVM needed), else LLVM's JIT. Returns (address of `name`, owner)."""
  if (linked := link(lib, name)) is not None: return linked
  from plugrt_cpu.llvm import load_object  # (llvmlite loads only when an object needs its JIT)
  return load_object(lib, name)
