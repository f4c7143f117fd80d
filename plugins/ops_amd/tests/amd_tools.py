"""LLVM's own tools for checking AMD code objects, and clang's HIP mode for checking HIP C (skips when absent)."""
from __future__ import annotations

import functools
import os
import re
import subprocess

import pytest

from plugrt.context import PluginContext
from plugrt_amd.toolchain import llvm_tool

#: llvm-readelf and llvm-objdump before 19 do not know gfx942/gfx12 (objdump 14 cannot disassemble gfx1201, readelf 14
#: calls v5 metadata invalid): CI installs llvm-19 (scripts/setup.sh)
MIN_TOOLS = 19


@functools.cache
def tool(name: str) -> str | None:
  return llvm_tool(PluginContext(dict(os.environ)), name, min_version=MIN_TOOLS)


def need(name: str) -> str:
  p = tool(name)
  if p is None: pytest.skip(f"{name} {MIN_TOOLS} or newer is not installed (apt-get install llvm-{MIN_TOOLS}; CI installs it)")
  return p


def run(args: list[str], blob: bytes, tmp_path, name: str = "k.co") -> str:
  path = tmp_path / name
  path.write_bytes(blob)
  r = subprocess.run([*args, str(path)], capture_output=True, text=True, timeout=120)
  assert r.returncode == 0, r.stderr
  return r.stdout


def readelf_kernels(text: str) -> dict[str, dict]:
  """The per-kernel scalars and .args of `llvm-readelf --notes` YAML output, by kernel name (a small reader for its layout)."""
  kernels: dict[str, dict] = {}
  cur: dict | None = None
  arg: dict | None = None
  in_args = False
  for line in text.splitlines():
    if re.match(r"^  - \.", line) or re.match(r"^  - \.args:", line):  # a new kernel
      cur, in_args, arg = {"args": []}, False, None
    m = re.match(r"^(\s*)(- )?\.([a-z_0-9]+):\s*(.*)$", line)
    if cur is None or not m: continue
    indent, dash, key, value = len(m.group(1)), m.group(2), m.group(3), m.group(4).strip()
    value = value.removeprefix("!str ").strip()
    if key == "args": in_args = True; continue
    if in_args and indent >= 6:
      if dash: cur["args"].append(arg := {})
      if arg is not None: arg[key] = value
      continue
    in_args = False
    cur[key] = value
    if key == "name": kernels[value] = cur
  return kernels


@functools.cache
def hip_clang() -> str | None:
  """A clang that checks HIP device code without ROCm (-nogpuinc -nogpulib), or None."""
  ctx = PluginContext(dict(os.environ))
  for c in ["clang", *(f"clang-{v}" for v in range(22, 13, -1)), *(f"/usr/lib/llvm-{v}/bin/clang" for v in range(22, 13, -1))]:
    p = ctx.which(c)
    if p is None: continue
    r = subprocess.run([p, "-x", "hip", "--cuda-gpu-arch=gfx90a", "-nogpulib", "-nogpuinc", "--cuda-device-only", "-fsyntax-only", "-"],
                       input='extern "C" __attribute__((global)) void k(int* x) { x[0] = 1; }', capture_output=True, text=True, timeout=60)
    if r.returncode == 0: return p
  return None
