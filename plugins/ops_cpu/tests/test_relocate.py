"""plugrt_cpu.relocate: the in-process linker of x86-64 relocatable objects (absolute relocations only). It links
what both compilers make, and returns None (so that LLVM's JIT links instead) for anything else, never crashing on
a damaged table."""
from __future__ import annotations

import platform
import struct
import subprocess

import numpy as np
import pytest

from plugrt import Buffer, Device, KernelBuilder, dtypes
from plugrt_cpu.objects import check_elf, load_relocatable
from plugrt_cpu.relocate import link

pytestmark = pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="the linker is x86-64 only")


@pytest.fixture(scope="module")
def dev():
  return Device["CPU"]


def sin_kernel():
  """Calls into libm (an undefined symbol) where the compiler does not inline it, and reads float constants."""
  b = KernelBuilder("reloc_sin")
  out, x = b.buffer("out", dtypes.float64), b.buffer("x", dtypes.float64)
  i = b.global_id(0)
  out[i] = (x[i] * 0.5).sin() + 0.25
  return b.finish()


def run(dev, k, fn_addr, owner, compiler) -> np.ndarray:
  from plugrt_cpu.grid import grid_runner
  from plugrt_cpu.program import CPUProgram
  prg = CPUProgram(dev, k.name, b"", k.signature, fn_addr, owner, grid_runner(dev, compiler))
  x = np.linspace(-3, 3, 64)
  out, bx = Buffer(dev, 64, dtypes.float64), Buffer(dev, 64, dtypes.float64).copyin(x)
  prg(out, bx, global_size=(64,), wait=True)
  np.testing.assert_allclose(out.numpy(), np.sin(x * 0.5) + 0.25, rtol=1e-14)
  return out.numpy()


@pytest.mark.parametrize("compiler", ["CLANG", "LLVM"])
def test_both_compilers_objects_are_linked_without_llvm(dev, compiler: str) -> None:
  k = sin_kernel()
  comp = dev.compiler_for(compiler)
  obj = comp.compile(comp.render(k))
  check_elf(obj, k.name)
  linked = link(obj, k.name)
  assert linked is not None, f"{compiler}'s object needed LLVM's JIT"
  run(dev, k, *linked, compiler)


def test_gccs_objects_are_linked_too(dev, tmp_path) -> None:
  """gcc (CC=gcc) adds empty .data and .bss sections: nothing to place, no reason to fall back."""
  k = sin_kernel()
  src = dev.compiler_for("CLANG").render(k)
  from plugrt_cpu.clang import CFLAGS
  p = subprocess.run(["gcc", *CFLAGS, "-x", "c", "-", "-c", "-o", str(tmp_path / "k.o")], input=src.encode(), capture_output=True)
  if p.returncode != 0: pytest.skip(f"no working gcc here: {p.stderr[-200:]!r}")
  obj = (tmp_path / "k.o").read_bytes()
  check_elf(obj, k.name)
  linked = link(obj, k.name)
  assert linked is not None
  run(dev, k, *linked, "CLANG")


def test_an_object_with_pc_relative_relocations_goes_to_the_jit(dev) -> None:
  k = sin_kernel()
  src = dev.compiler_for("CLANG").render(k)
  obj = subprocess.run(["clang", "-O2", "-fPIC", "-fno-math-errno", "-ffreestanding", "-nostdinc", "-x", "c", "-", "-c", "-o", "-"],
                       input=src.encode(), capture_output=True, check=True).stdout
  assert link(obj, k.name) is None  # PLT32/PC32 relocations: not this linker's
  fn, owner = load_relocatable(obj, k.name)  # LLVM's JIT links it
  assert type(owner).__name__ == "JITProgram"
  run(dev, k, fn, owner, "CLANG")


def _rela_entries(obj: bytes) -> list[int]:
  shoff, = struct.unpack_from("<Q", obj, 0x28)
  shnum, = struct.unpack_from("<H", obj, 0x3C)
  out = []
  for i in range(shnum):
    _, sh_type, _, _, off, size, _, _, _, _ = struct.unpack_from("<IIQQQQIIQQ", obj, shoff + i * 64)
    if sh_type == 4: out += list(range(off, off + size, 24))
  return out


@pytest.mark.parametrize("damage", ["offset", "symbol", "type"])
def test_a_damaged_relocation_is_refused_not_applied(dev, damage: str) -> None:
  k = sin_kernel()
  comp = dev.compiler_for("CLANG")
  obj = bytearray(comp.compile(comp.render(k)))
  entries = _rela_entries(bytes(obj))
  assert entries
  pos = entries[0]
  _, r_info, _ = struct.unpack_from("<QQq", obj, pos)
  if damage == "offset": struct.pack_into("<Q", obj, pos, 1 << 40)  # far past its section: would write anywhere
  elif damage == "symbol": struct.pack_into("<Q", obj, pos + 8, (0xFFFFFF << 32) | (r_info & 0xFFFFFFFF))
  else: struct.pack_into("<Q", obj, pos + 8, (r_info & ~0xFFFFFFFF) | 2)  # R_X86_64_PC32
  assert link(bytes(obj), k.name) is None


def test_a_missing_function_name_is_refused(dev) -> None:
  k = sin_kernel()
  comp = dev.compiler_for("CLANG")
  assert link(comp.compile(comp.render(k)), "no_such_kernel") is None
