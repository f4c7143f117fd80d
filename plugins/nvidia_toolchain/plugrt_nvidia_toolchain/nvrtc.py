"""NVRTC through ctypes: CUDA C -> cubin for one architecture, with the options that keep the IR's rounding.

plugrt-cuda and plugrt-nv both compile through here, so a kernel rounds the same way on both devices. Finding the
library reads paths only (`available`, for probes); loading it happens on the first `library()` call, never at
import, and the loaded library is kept for the process (the environment of that first call picks the file).
"""
from __future__ import annotations

import ctypes
import glob
import os
import sys
from collections.abc import Mapping
from typing import Any

from plugrt.errors import CompileError

#: no contraction into FMA (the IR rounds every op), IEEE division and square root, no flush to zero
OPTIONS = ("--fmad=false", "--prec-div=true", "--prec-sqrt=true", "--ftz=false", "-default-device")
HINT = "install the CUDA toolkit, or pip install nvidia-cuda-nvrtc"
_SYSTEM_DIRS = ("/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib", "/usr/lib/x86_64-linux-gnu")

_lib: Any = None


def candidates(env: Mapping[str, str]) -> list[str]:
  """Where libnvrtc may be, in the order tried: PLUGRT_NVRTC, the CUDA toolkit and the system's folders, then the
  nvidia-cuda-nvrtc wheel on sys.path (newest version first in each folder)."""
  out = [named] if (named := env.get("PLUGRT_NVRTC")) else []
  for base in _SYSTEM_DIRS:
    out += sorted(glob.glob(os.path.join(base, "libnvrtc.so*")), reverse=True)
  for p in sys.path:
    out += sorted(glob.glob(os.path.join(p, "nvidia", "*", "lib", "libnvrtc.so*")), reverse=True)
  return [p for p in out if "builtins" not in os.path.basename(p)]  # libnvrtc-builtins is NVRTC's helper, not NVRTC


def available(env: Mapping[str, str]) -> bool:
  """Whether an NVRTC library is on disk (looks at paths only; loads nothing)."""
  return any(os.path.exists(p) for p in candidates(env))


def library(env: Mapping[str, str]) -> Any:
  """The NVRTC library, loaded once per process (the first candidate that loads); None when none is installed."""
  global _lib
  if _lib is None:  # set once complete: a thread that came second must not see a loading one's "not installed"
    found: Any = False
    for path in candidates(env):
      try: lib = ctypes.CDLL(path)
      except OSError: continue
      lib.nvrtcGetErrorString.restype = ctypes.c_char_p
      lib.nvrtcCreateProgram.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int,
                                         ctypes.c_void_p, ctypes.c_void_p]
      lib.nvrtcCompileProgram.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
      for f in ("nvrtcGetProgramLogSize", "nvrtcGetCUBINSize", "nvrtcGetPTXSize"):
        getattr(lib, f).argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]
      for f in ("nvrtcGetProgramLog", "nvrtcGetCUBIN", "nvrtcGetPTX"): getattr(lib, f).argtypes = [ctypes.c_void_p, ctypes.c_char_p]
      lib.nvrtcDestroyProgram.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
      lib.path = path
      found = lib
      break
    _lib = found
  return _lib or None


def _require(env: Mapping[str, str]) -> Any:
  lib = library(env)
  if lib is None: raise CompileError("NVRTC (libnvrtc.so) is not installed", hint=HINT)
  return lib


def version(env: Mapping[str, str]) -> str:
  """NVRTC's version, "13.0"; raises CompileError when NVRTC is missing."""
  lib = _require(env)
  major, minor = ctypes.c_int(), ctypes.c_int()
  lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
  return f"{major.value}.{minor.value}"


def kernel_name(src: str) -> str:
  """The first __global__ function's name in src (names the program in NVRTC's log)."""
  return src.split("__global__ void ", 1)[-1].split("(", 1)[0].strip() if "__global__" in src else "kernel"


def compile_program(lib: Any, src: str, name: str, options: list[str], cubin: bool) -> tuple[bytes | None, str]:
  """(binary or None, log): a cubin (or PTX) of src, compiled by the loaded NVRTC `lib` with options."""
  prog = ctypes.c_void_p()
  if (r := lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), f"{name}.cu".encode(), 0, None, None)) != 0:
    raise CompileError(f"nvrtcCreateProgram failed: NVRTC error {r}: {lib.nvrtcGetErrorString(r).decode()}")
  try:
    opts = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
    status = lib.nvrtcCompileProgram(prog, len(options), opts)
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    if status != 0: return None, log.value.decode(errors="replace")
    get_size, get = (lib.nvrtcGetCUBINSize, lib.nvrtcGetCUBIN) if cubin else (lib.nvrtcGetPTXSize, lib.nvrtcGetPTX)
    get_size(prog, ctypes.byref(size))
    out = ctypes.create_string_buffer(size.value)
    get(prog, out)
    return out.raw, log.value.decode(errors="replace")
  finally: lib.nvrtcDestroyProgram(ctypes.byref(prog))


def compile_cubin(src: str, arch: str, env: Mapping[str, str], options: tuple[str, ...] = OPTIONS) -> bytes:
  """A cubin (ELF) of CUDA C `src` for `arch` ("sm_90"); a rejected source raises CompileError with NVRTC's log."""
  lib = _require(env)
  name = kernel_name(src)
  binary, log = compile_program(lib, src, name, [f"--gpu-architecture={arch}", *options], cubin=True)
  if binary is None: raise CompileError(f"NVRTC failed to compile {name} for {arch}", log, "a renderer bug if the kernel came from plugrt's IR")
  return binary
