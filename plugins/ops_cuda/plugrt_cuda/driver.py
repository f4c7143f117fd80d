"""The CUDA driver API (libcuda) through ctypes: only the calls plugrt uses (NVRTC is plugrt_nvidia_toolchain.nvrtc).

Every call's result is checked (`check`), and a failure becomes CUDAError with the
driver's name and description of the error. Out of memory is a MemoryError, so the
core's allocator frees its cache and retries.
"""
from __future__ import annotations

import ctypes
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
  """A CUDA driver call failed."""
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
