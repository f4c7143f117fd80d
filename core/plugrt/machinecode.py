"""Tiny pieces of x86-64 machine code (public: backends use it), for the places where a Python function cannot be used:
a call made so often that ctypes' per-argument cost shows (CUDA's launch trampoline), and a C callback
that may run while another exception is pending (DLPack's capsule destructor: CPython rejects a Python
callback that returns in that state). Elsewhere `code()` returns None and callers take a slower, safe path.
"""
from __future__ import annotations

import ctypes
import mmap
import platform
import struct
from typing import Any

_pages: list[Any] = []


def x86_64() -> bool: return platform.machine().lower() in ("x86_64", "amd64")


def code(machine_code: bytes) -> int | None:
  """The address of `machine_code` copied into an executable page, or None (not x86-64, or no executable pages here)."""
  if not x86_64(): return None
  try: page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
  except (OSError, ValueError, PermissionError): return None  # SELinux or PaX forbid writable+executable pages
  page.write(machine_code)
  _pages.append(page)  # kept for the life of the process
  return ctypes.addressof(ctypes.c_char.from_buffer(page))


def imm64(x: int) -> bytes: return struct.pack("<Q", x)
