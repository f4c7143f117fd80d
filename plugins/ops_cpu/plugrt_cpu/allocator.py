"""CPU memory: 64-byte aligned host allocations; a handle is the address (an int)."""
from __future__ import annotations

import ctypes
import errno

from plugrt.hookspecs import DeviceInfo
from plugrt.runtime import Allocator

_libc = ctypes.CDLL(None, use_errno=True)  # the C library is already in the process: no find_library (it runs ldconfig)
_libc.posix_memalign.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_size_t]
_libc.posix_memalign.restype = ctypes.c_int
_libc.free.argtypes, _libc.free.restype = [ctypes.c_void_p], None

ALIGN = 64


def _view(addr: int, nbytes: int) -> memoryview:
  return memoryview((ctypes.c_char * nbytes).from_address(addr)).cast("B")


class CPUAllocator(Allocator[int]):
  supports_wrap = True  # host memory is host memory: from_blob wraps any pointer

  def __init__(self, device: DeviceInfo):
    super().__init__(device)

  def _alloc(self, nbytes: int, options: object) -> int:
    ptr = ctypes.c_void_p()
    if (err := _libc.posix_memalign(ctypes.byref(ptr), ALIGN, nbytes)) != 0 or not ptr.value:
      if err in (errno.ENOMEM, 0): raise MemoryError(f"posix_memalign of {nbytes} bytes failed")
      raise OSError(err, f"posix_memalign of {nbytes} bytes failed")
    return ptr.value

  def _free(self, handle: int, nbytes: int, options: object) -> None: _libc.free(handle)
  def _offset(self, handle: int, offset: int, nbytes: int) -> int: return handle + offset
  def _wrap(self, ptr: int, nbytes: int) -> int: return ptr

  def _copyin(self, dest: int, src: memoryview) -> None:
    if src.nbytes: _view(dest, src.nbytes)[:] = src

  def _copyout(self, dest: memoryview, src: int) -> None:
    if dest.nbytes: dest[:] = _view(src, dest.nbytes)

  def _copy(self, dest: int, src: int, nbytes: int) -> None: ctypes.memmove(dest, src, nbytes)
  def dlpack_device(self) -> tuple[int, int]: return (1, 0)  # kDLCPU
  def _pointer(self, handle: int) -> int: return handle
