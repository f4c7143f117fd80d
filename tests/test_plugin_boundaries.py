"""The boundaries between the NVIDIA packages: plugrt-cuda and plugrt-nv share plugrt-nvidia-toolchain and never reach
into each other; the toolchain reaches into neither; importing the toolchain (or a backend's entry module) loads
nothing heavy."""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from plugrt.probing import DISTRIBUTIONS

ROOT = Path(__file__).resolve().parent.parent
NV = ROOT / "plugins" / "ops_nv"
CUDA = ROOT / "plugins" / "ops_cuda" / "plugrt_cuda"
TOOLCHAIN = ROOT / "plugins" / "nvidia_toolchain" / "plugrt_nvidia_toolchain"
HEAVY = ("numpy", "cupy", "llvmlite", "pyopencl", "wgpu", "torch")


def imported_packages(folder: Path) -> dict[str, set[str]]:
  """Top-level package -> the files (relative to the repository) that import it, for every .py under folder, at any
  depth of the file (imports inside functions count: a lazy import still reaches into the package)."""
  found: dict[str, set[str]] = {}
  for path in folder.rglob("*.py"):
    if "build" in path.relative_to(ROOT).parts: continue  # (setuptools' copies, made and removed by the install tests)
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
      names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
              [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
      for n in names: found.setdefault(n.split(".")[0], set()).add(str(path.relative_to(ROOT)))
  return found


def test_no_distribution_folder_nests_in_another_but_an_interface_in_its_device():
  """Each distribution's folder is its own: the NVIDIA toolchain, which plugrt-cuda and plugrt-nv share, is a folder
  of plugins/, not one inside a backend's; only an interface package (iface_*) sits inside its device's folder."""
  folders = {dist: Path(folder) for dist, folder in DISTRIBUTIONS.items()}
  nested = [(d, o) for d, f in folders.items() for o, g in folders.items() if d != o and g in f.parents and not f.name.startswith("iface_")]
  assert nested == [], nested
  assert folders["plugrt-nvidia-toolchain"].parent == Path("plugins") and TOOLCHAIN.parent == ROOT / folders["plugrt-nvidia-toolchain"]


def test_the_scan_sees_lazy_imports():
  assert "plugrt_nvidia_toolchain" in imported_packages(NV / "plugrt_nv")  # imported inside hooks and compilers only
  assert "plugrt_nvidia_toolchain" in imported_packages(CUDA)


def test_plugrt_nv_imports_nothing_of_plugrt_cuda():
  """NV shares the toolchain with CUDA, not CUDA's package: its sources, interfaces and tests name no plugrt_cuda."""
  assert imported_packages(NV).get("plugrt_cuda", set()) == set()


def test_the_toolchain_imports_no_backend():
  used = imported_packages(TOOLCHAIN)
  assert not {p for p in used if p.startswith("plugrt_") and p != "plugrt_nvidia_toolchain"}, used
  assert not set(HEAVY) & set(used), used


def _fresh(code: str) -> dict:
  env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
  r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
  assert r.returncode == 0, r.stderr
  return json.loads(r.stdout)


def test_importing_the_toolchain_loads_nothing():
  """`import plugrt_nvidia_toolchain` is its docstring and version: no submodule, not even plugrt or ctypes."""
  new = _fresh("import sys, json; before = set(sys.modules); import plugrt_nvidia_toolchain; "
               "print(json.dumps(sorted(set(sys.modules) - before)))")
  assert new == ["plugrt_nvidia_toolchain"]


@pytest.mark.parametrize("module", ["arch", "cuda_c", "ptx", "ptx_math", "nvrtc", "toolkit", "ptxas", "jitlink"])
def test_toolchain_modules_load_no_heavy_package_and_no_library(module):
  """Each module imports only the standard library and plugrt, and loads no shared library (NVRTC and nvJitLink load
  on first use)."""
  got = _fresh(f"import sys, json, ctypes; import plugrt_nvidia_toolchain.{module} as m; "
               "print(json.dumps({'modules': sorted(sys.modules), 'nvrtc': getattr(sys.modules.get('plugrt_nvidia_toolchain.nvrtc'), '_lib', None), "
               "'jitlink': getattr(sys.modules.get('plugrt_nvidia_toolchain.jitlink'), '_lib', None)}))")
  assert not [m for m in got["modules"] if m.split(".")[0] in HEAVY or m.startswith(("plugrt_cuda", "plugrt_nv."))], got["modules"]
  assert got["nvrtc"] is None and got["jitlink"] is None


@pytest.mark.parametrize("entry", ["plugrt_cuda", "plugrt_nv"])
def test_entry_modules_leave_the_toolchain_for_later(entry):
  """The backends' entry modules import the toolchain only inside probes and hooks."""
  got = _fresh(f"import sys, json; import {entry}; print(json.dumps(sorted(sys.modules)))")
  assert not [m for m in got if m.startswith("plugrt_nvidia_toolchain") or m.split(".")[0] in HEAVY]
