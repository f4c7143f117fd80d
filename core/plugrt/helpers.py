"""Small helpers for code that works with raw memory, under the seeds' names (tinygrad.helpers).

    from plugrt.helpers import to_mv
    desc = to_mv(ctypes.addressof(handle), 8).cast("Q")[0]     # the pointer a ctypes handle holds
    gpu_address = to_mv(desc, 0x100).cast("Q")[20]              # the 64-bit word at byte 0xA0 of what it points to

This module is a leaf: it imports only the standard library.
"""
from __future__ import annotations

import ctypes


def to_mv(ptr: int, size: int) -> memoryview:
  """A writable memoryview (format "B") of the `size` bytes at address `ptr`, without a copy.

  The memory must be mapped and stay valid while the view is used: reading an address nothing is mapped at ends the
  process, as it would in C; no check can tell that beforehand. What can be checked is: `ptr` an int from 1 to
  2**64 - 1 (TypeError otherwise, as Buffer.from_blob's pointer), `size` an int (TypeError) that is not negative and
  does not reach past the end of the address space (ValueError)."""
  if not isinstance(ptr, int) or isinstance(ptr, bool) or not 0 < ptr < 1 << 64:
    raise TypeError(f"ptr must be an address, an int from 1 to 2**64 - 1, got {ptr!r}")
  if not isinstance(size, int) or isinstance(size, bool): raise TypeError(f"size must be an int (a byte count), not {type(size).__name__}")
  if size < 0: raise ValueError(f"size must not be negative, got {size}")
  if ptr + size > 1 << 64: raise ValueError(f"{size} bytes from {ptr:#x} reach past the end of the 64-bit address space")
  if ptr + size > 1 << (8 * ctypes.sizeof(ctypes.c_void_p)):
    raise ValueError(f"{size} bytes from {ptr:#x} reach past this process's {8 * ctypes.sizeof(ctypes.c_void_p)}-bit address space")
  return memoryview((ctypes.c_uint8 * size).from_address(ptr)).cast("B")
