"""nvJitLink (CUDA 12+), in process: PTX -> cubin for one architecture, without ptxas (a subprocess). Looking for the
library reads paths only; loading it happens on the first `version` or `assemble`, and the loaded library is kept for
the process (the environment of that first call picks the file).
"""
from __future__ import annotations

import ctypes
import glob
import os
import sys
from collections.abc import Mapping
from typing import Any

from plugrt.errors import CompileError

HINT = "pip install nvidia-nvjitlink (or install the CUDA toolkit)"
INPUT_PTX = 2  # nvJitLinkInputType: NONE 0, CUBIN 1, PTX 2, LTOIR 3, FATBIN 4, OBJECT 5, LIBRARY 6, INDEX 7, ANY 10
_lib: Any = None


def candidates(env: Mapping[str, str]) -> list[str]:
  """Where libnvJitLink may be: PLUGRT_NVJITLINK, the pip wheels on sys.path, CUDA_HOME, /usr/local/cuda (newest first)."""
  out = [named] if (named := env.get("PLUGRT_NVJITLINK")) else []
  roots = [p or "." for p in sys.path]
  for pattern in ("nvidia/cu*/lib/libnvJitLink.so*", "nvidia/nvjitlink/lib/libnvJitLink.so*"):
    out += sorted({f for r in roots for f in glob.glob(os.path.join(r, pattern))}, reverse=True)
  for home in (env.get("CUDA_HOME"), env.get("CUDA_PATH"), "/usr/local/cuda"):
    if home: out += sorted(glob.glob(os.path.join(home, "lib64", "libnvJitLink.so*")), reverse=True)
  return out


def path(env: Mapping[str, str]) -> str | None:
  """The first candidate that exists (paths only), or None."""
  return next((p for p in candidates(env) if os.path.exists(p)), None)


def _load(env: Mapping[str, str]) -> Any:
  global _lib
  if _lib is None:
    p = path(env)
    if p is None: raise CompileError("nvJitLink (libnvJitLink.so) is not installed", hint=HINT)
    lib = ctypes.CDLL(p)
    sz, vp, u32 = ctypes.c_size_t, ctypes.c_void_p, ctypes.c_uint32
    for name, args in (("nvJitLinkCreate", [ctypes.POINTER(vp), u32, ctypes.POINTER(ctypes.c_char_p)]), ("nvJitLinkDestroy", [ctypes.POINTER(vp)]),
                       ("nvJitLinkAddData", [vp, ctypes.c_int, ctypes.c_char_p, sz, ctypes.c_char_p]), ("nvJitLinkComplete", [vp]),
                       ("nvJitLinkGetLinkedCubinSize", [vp, ctypes.POINTER(sz)]), ("nvJitLinkGetLinkedCubin", [vp, ctypes.c_char_p]),
                       ("nvJitLinkGetErrorLogSize", [vp, ctypes.POINTER(sz)]), ("nvJitLinkGetErrorLog", [vp, ctypes.c_char_p]),
                       ("nvJitLinkVersion", [ctypes.POINTER(ctypes.c_uint), ctypes.POINTER(ctypes.c_uint)])):
      fn = getattr(lib, name)
      fn.argtypes, fn.restype = args, ctypes.c_int
    _lib = lib
  return _lib


def version(env: Mapping[str, str]) -> str:
  """nvJitLink's version, "13.0"; raises CompileError when it is missing."""
  lib = _load(env)
  major, minor = ctypes.c_uint(), ctypes.c_uint()
  if lib.nvJitLinkVersion(ctypes.byref(major), ctypes.byref(minor)): return "unknown"
  return f"{major.value}.{minor.value}"


def assemble(ptx: str, arch: str, env: Mapping[str, str]) -> bytes:
  """A cubin for `arch` ("sm_90") from PTX text; a rejected module raises CompileError with nvJitLink's log."""
  lib = _load(env)
  handle = ctypes.c_void_p()
  opts = (ctypes.c_char_p * 1)(f"-arch={arch}".encode())
  if (r := lib.nvJitLinkCreate(ctypes.byref(handle), 1, opts)) != 0:
    raise CompileError(f"nvJitLink refused the target {arch} (error {r})", hint="a newer nvJitLink may know it")
  try:
    data = ptx.encode()
    r = lib.nvJitLinkAddData(handle, INPUT_PTX, data, len(data), b"kernel.ptx")
    if r == 0: r = lib.nvJitLinkComplete(handle)
    if r != 0:
      n = ctypes.c_size_t()
      lib.nvJitLinkGetErrorLogSize(handle, ctypes.byref(n))
      log = ctypes.create_string_buffer(n.value + 1)
      if n.value: lib.nvJitLinkGetErrorLog(handle, log)
      raise CompileError(f"nvJitLink failed to assemble the kernel for {arch} (error {r})", log.value.decode(errors="replace"))
    n = ctypes.c_size_t()
    lib.nvJitLinkGetLinkedCubinSize(handle, ctypes.byref(n))
    out = ctypes.create_string_buffer(n.value)
    if lib.nvJitLinkGetLinkedCubin(handle, out): raise CompileError("nvJitLink could not return the cubin")
    return out.raw
  finally: lib.nvJitLinkDestroy(ctypes.byref(handle))
