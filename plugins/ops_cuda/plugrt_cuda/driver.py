"""The CUDA driver API (libcuda) and NVRTC through ctypes: only the calls plugrt uses.

Every call's result is checked (`check`), and a failure becomes CUDAError with the
driver's name and description of the error. Out of memory is a MemoryError, so the
core's allocator frees its cache and retries.
"""
from __future__ import annotations

import ctypes
import glob
import os
from typing import Any

from plugrt.errors import PlugrtError

CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY = 0, 2
CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 1, 16
CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM = (2, 3, 4)  # x, y, z
CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM = (5, 6, 7)   # x, y, z
CU_DEVICE_ATTRIBUTE_CC_MAJOR, CU_DEVICE_ATTRIBUTE_CC_MINOR = 75, 76
CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 2, 9
CU_MEMORYTYPE_DEVICE, CU_MEMORYTYPE_UNIFIED = 2, 4
CU_STREAM_NON_BLOCKING, CU_STREAM_CAPTURE_MODE_RELAXED = 1, 2
CU_MEMHOSTALLOC_PORTABLE = 1


class CUDAError(PlugrtError, RuntimeError):
  """A CUDA driver or NVRTC call failed."""
  def __init__(self, call: str, code: int, name: str, text: str):
    self.call, self.code = call, code
    super().__init__(f"{call} failed: {name} ({code}): {text}",
                     "a kernel that faulted leaves the context unusable: restart the process" if code in (700, 715, 719) else "")


_cuda: Any = None


def libcuda() -> Any:
  """The driver library, loaded once; None when it is not installed."""
  global _cuda
  if _cuda is None:  # set once complete: another thread never sees a half-made library (two may both load it: harmless)
    try: lib = ctypes.CDLL("libcuda.so.1")
    except OSError: lib = False
    else: lib.cuGetErrorName.argtypes = lib.cuGetErrorString.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    _cuda = lib
  return _cuda or None


def _error(code: int) -> tuple[str, str]:
  lib = libcuda()
  name, text = ctypes.c_char_p(), ctypes.c_char_p()
  if lib is not None:
    lib.cuGetErrorName(code, ctypes.byref(name))
    lib.cuGetErrorString(code, ctypes.byref(text))
  return (name.value or b"CUDA_ERROR_UNKNOWN").decode(), (text.value or b"unknown error").decode()


def check(code: int, call: str) -> None:
  if code == CUDA_SUCCESS: return
  name, text = _error(code)
  if code == CUDA_ERROR_OUT_OF_MEMORY: raise MemoryError(f"{call}: {text}")
  raise CUDAError(call, code, name, text)


def call(fn: str, *args: Any) -> None:
  """Call a driver function by name and check its result (for calls that are not on a hot path)."""
  check(getattr(libcuda(), fn)(*args), fn)


def device_count_from_nodes() -> int:
  """GPUs the kernel driver exposes (/dev/nvidiaN), minus what CUDA_VISIBLE_DEVICES hides. Touches no driver state."""
  nodes = [p for p in glob.glob("/dev/nvidia[0-9]*") if p[len("/dev/nvidia"):].isdigit()]
  visible = os.environ.get("CUDA_VISIBLE_DEVICES")
  if visible is None: return len(nodes)
  ids = [v for v in visible.split(",") if v.strip()]
  return min(len(nodes), len(ids)) if all(v.strip().lstrip("-").isdigit() and int(v) >= 0 for v in ids) else len(ids)


# ---------------------------------------------------------------- NVRTC

_nvrtc: Any = None


def nvrtc_candidates() -> list[str]:
  import sys
  out = [os.environ["PLUGRT_NVRTC"]] if os.environ.get("PLUGRT_NVRTC") else []
  for base in ("/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib", "/usr/lib/x86_64-linux-gnu"):
    out += sorted(glob.glob(os.path.join(base, "libnvrtc.so*")), reverse=True)
  for p in sys.path:  # the nvidia-cuda-nvrtc wheel
    out += sorted(glob.glob(os.path.join(p, "nvidia", "*", "lib", "libnvrtc.so*")), reverse=True)
  return [p for p in out if "builtins" not in os.path.basename(p)]


def libnvrtc() -> Any:
  global _nvrtc
  if _nvrtc is None:  # set once complete: a thread that came second saw the loading one's False, "not installed"
    found: Any = False
    for path in nvrtc_candidates():
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
    _nvrtc = found
  return _nvrtc or None


def nvrtc_version() -> str:
  lib = libnvrtc()
  major, minor = ctypes.c_int(), ctypes.c_int()
  lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
  return f"{major.value}.{minor.value}"


def nvrtc_compile(src: str, name: str, options: list[str], cubin: bool) -> tuple[bytes | None, str]:
  """(binary or None, log): a cubin (or PTX) of src, compiled by NVRTC with options."""
  lib = libnvrtc()
  prog = ctypes.c_void_p()
  if (r := lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), f"{name}.cu".encode(), 0, None, None)) != 0:
    raise CUDAError("nvrtcCreateProgram", r, "NVRTC_ERROR", lib.nvrtcGetErrorString(r).decode())
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
