"""Finding OpenCL platforms without loading them: the ICD manifests, and which platform the user asked for.

An OpenCL platform is installed as an ICD: a one-line text file (`*.icd`) naming the
driver library, in a vendors directory that the ICD loader reads. Reading those files
costs microseconds and changes nothing; loading the drivers (what `clGetPlatformIDs`
does) is slow (docs/backends/cl.md), maps LLVM into the process and, for a GPU driver, opens
the device nodes, none of which is ever undone. So the probe reads manifests, and the
platforms themselves are asked only when a device opens or `plugrt devices` lists them.

The loader reads OCL_ICD_VENDORS and OPENCL_VENDOR_PATH from the process environment; the functions here
read them from the environment they are given (the plugin context's), so that a probe predicts what a
loader started with that environment would find. This module imports only the standard library and plugrt.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import NamedTuple

from plugrt.context import PluginContext
from plugrt.probing import has_module

DEFAULT_VENDORS = "/etc/OpenCL/vendors"
NO_PLATFORM_HINT = ("install an OpenCL platform: apt-get install pocl-opencl-icd (PoCL, runs on the CPU) or "
                    "pip install pocl-binary-distribution; for a GPU, its vendor's OpenCL driver (NVIDIA: the driver's libnvidia-opencl ICD)")


class Manifest(NamedTuple):  # not a dataclass: discovery imports this module, and a dataclass execs its methods
  path: str      # the .icd file (or the library, when OCL_ICD_VENDORS names one)
  library: str   # what it names
  found: bool    # whether that library file was located (a bare soname may still load through ld.so.conf paths)


def _locate(lib: str, env: Mapping[str, str], beside: str = "") -> bool:
  if os.sep in lib: return os.path.isfile(lib)
  return any(os.path.isfile(os.path.join(d, lib)) for d in PluginContext(env).library_dirs(beside))


def _read(path: str, env: Mapping[str, str]) -> Manifest | None:
  try:
    with open(path) as f: lib = f.readline().strip()
  except OSError: return None
  return Manifest(path, lib, _locate(lib, env, os.path.dirname(path))) if lib else None


def _dir(path: str, env: Mapping[str, str]) -> list[Manifest]:
  try: names = sorted(n for n in os.listdir(path) if n.endswith(".icd"))
  except OSError: return []
  return [m for n in names if (m := _read(os.path.join(path, n), env)) is not None]


def vendors_dir(env: Mapping[str, str]) -> str:
  return env.get("OPENCL_VENDOR_PATH", "").strip() or DEFAULT_VENDORS


def manifests(env: Mapping[str, str]) -> list[Manifest]:
  """The ICDs an ocl-icd loader started with `env` would load, following its variables (see libOpenCL(7))."""
  named = env.get("OCL_ICD_VENDORS", "").strip()
  if named:
    if os.path.isdir(named): return _dir(named, env)
    if named.endswith(".icd"):
      first = os.path.join(vendors_dir(env), named) if os.sep not in named else named
      m = _read(first, env) or _read(named, env)
      return [m] if m else []
    return [Manifest(named, named, _locate(named, env))]  # the variable names a driver library itself
  found = _dir(vendors_dir(env), env)
  # a pip-installed PoCL (pocl-binary-distribution) puts its manifest beside pyopencl's bundled loader
  import importlib.util
  try: spec = importlib.util.find_spec("pyopencl")
  except (ImportError, ValueError): spec = None
  for loc in (spec.submodule_search_locations or []) if spec else []:
    found += _dir(os.path.join(loc, ".libs"), env)
  return found


def pyopencl_installed() -> bool: return has_module("pyopencl")


# ---------------------------------------------------------------- which platform

def requested_platform(arch: str, env: Mapping[str, str]) -> tuple[str, str]:
  """(selector, where it came from): DEV's ARCH field for CL (DEV=CL::pocl) or CL_PLATFORM; ("", "") if neither.

  Both set and different is an EnvError naming both."""
  from plugrt.errors import EnvError
  named = env.get("CL_PLATFORM", "").strip()
  if arch and named and arch.lower() != named.lower():
    raise EnvError(f"DEV asks for OpenCL platform {arch!r} and CL_PLATFORM={named!r} for another", "set only one of them")
  if arch: return arch, f"DEV=...CL::{arch}"
  if named: return named, f"CL_PLATFORM={named}"
  return "", ""


def matches(selector: str, index: int, name: str, vendor: str, version: str) -> bool:
  """A platform matches its index, or a case-insensitive part of its name, vendor or version."""
  if selector.isdigit(): return int(selector) == index
  s = selector.lower()
  return s in name.lower() or s in vendor.lower() or s in version.lower()
