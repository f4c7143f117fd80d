"""Finding OpenCL platforms without loading them: the ICD manifests, and which platform the user asked for.

An OpenCL platform is installed as an ICD: a one-line text file (`*.icd`) naming the
driver library, in a vendors directory that the ICD loader reads. Reading those files
costs microseconds and changes nothing; loading the drivers (what `clGetPlatformIDs`
does) costs 17 ms for PoCL, maps LLVM into the process and, for a GPU driver, opens
the device nodes, none of which is ever undone. So the probe reads manifests, and the
platforms themselves are asked only when a device opens or `plugrt devices` lists them.

This module imports only the standard library and plugrt.
"""
from __future__ import annotations

import importlib.util
import os
from typing import NamedTuple

DEFAULT_VENDORS = "/etc/OpenCL/vendors"
#: where a library named without a path in a manifest usually lives (the dynamic loader's own list can be longer)
LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/lib/aarch64-linux-gnu",
            "/usr/lib64", "/lib64", "/usr/lib", "/lib", "/usr/local/lib")


class Manifest(NamedTuple):  # not a dataclass: discovery imports this module, and a dataclass execs its methods (~1 ms)
  path: str      # the .icd file (or the library, when OCL_ICD_VENDORS names one)
  library: str   # what it names
  found: bool    # whether that library file was located (a bare soname may still load through ld.so.conf paths)


def _locate(lib: str, beside: str = "") -> bool:
  if os.sep in lib: return os.path.isfile(lib)
  dirs = [beside] + [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if d] + list(LIB_DIRS)
  return any(os.path.isfile(os.path.join(d, lib)) for d in dirs)


def _read(path: str) -> Manifest | None:
  try:
    with open(path) as f: lib = f.readline().strip()
  except OSError: return None
  return Manifest(path, lib, _locate(lib, os.path.dirname(path))) if lib else None


def _dir(path: str) -> list[Manifest]:
  try: names = sorted(n for n in os.listdir(path) if n.endswith(".icd"))
  except OSError: return []
  return [m for n in names if (m := _read(os.path.join(path, n))) is not None]


def vendors_dir() -> str:
  return os.environ.get("OPENCL_VENDOR_PATH", "").strip() or DEFAULT_VENDORS


def manifests() -> list[Manifest]:
  """The ICDs an ocl-icd loader would load, following its environment variables (see libOpenCL(7))."""
  env = os.environ.get("OCL_ICD_VENDORS", "").strip()
  if env:
    if os.path.isdir(env): return _dir(env)
    if env.endswith(".icd"):
      first = os.path.join(vendors_dir(), env) if os.sep not in env else env
      m = _read(first) or _read(env)
      return [m] if m else []
    return [Manifest(env, env, _locate(env))]  # the variable names a driver library itself
  found = _dir(vendors_dir())
  # a pip-installed PoCL (pocl-binary-distribution) puts its manifest beside pyopencl's bundled loader
  spec = importlib.util.find_spec("pyopencl")
  for loc in (spec.submodule_search_locations or []) if spec else []:
    found += _dir(os.path.join(loc, ".libs"))
  return found


def pyopencl_installed() -> bool: return importlib.util.find_spec("pyopencl") is not None


# ---------------------------------------------------------------- which platform

def requested_platform(arch: str = "") -> tuple[str, str]:
  """(selector, where it came from): DEV's ARCH field for CL (DEV=CL::pocl) or CL_PLATFORM; ("", "") if neither.

  Both set and different is an EnvError naming both."""
  from plugrt.errors import EnvError
  env = os.environ.get("CL_PLATFORM", "").strip()
  if arch and env and arch.lower() != env.lower():
    raise EnvError(f"DEV asks for OpenCL platform {arch!r} and CL_PLATFORM={env!r} for another", "set only one of them")
  if arch: return arch, f"DEV=...CL::{arch}"
  if env: return env, f"CL_PLATFORM={env}"
  return "", ""


def dev_arch() -> str:
  """The ARCH field of a CL target in os.environ's DEV (the probe has no DeviceInfo to read it from)."""
  dev = os.environ.get("DEV", "").strip()
  if not dev: return ""
  from plugrt.errors import PlugrtError
  from plugrt.selection import parse_dev
  try: targets = parse_dev(dev)
  except PlugrtError: return ""  # the registry reports a malformed DEV itself
  return next((t.arch for t in targets if t.device in ("CL", "GPU") and t.arch), "")


def matches(selector: str, index: int, name: str, vendor: str, version: str) -> bool:
  """A platform matches its index, or a case-insensitive part of its name, vendor or version."""
  if selector.isdigit(): return int(selector) == index
  s = selector.lower()
  return s in name.lower() or s in vendor.lower() or s in version.lower()
