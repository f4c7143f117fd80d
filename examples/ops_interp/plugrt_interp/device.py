"""INTERP's allocator, compiler and program."""
from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np

import plugrt
from plugrt.compiler import interpreter
from plugrt.compiler.ir import Kernel, Signature, parse
from plugrt.errors import CompileError, IRError
from plugrt.launchargs import PreparedCall, value_packer
from plugrt.runtime import Allocator, Compiler, Program


class InterpAllocator(Allocator[np.ndarray]):
  """Host memory held by numpy byte arrays; a view is a slice, so offsets are free."""
  supports_wrap = True  # host memory: wrapping a host pointer is real zero copy

  def _alloc(self, nbytes: int, options: Any) -> np.ndarray: return np.empty(nbytes, np.uint8)  # numpy raises MemoryError
  def _offset(self, handle: np.ndarray, offset: int, nbytes: int) -> np.ndarray: return handle[offset:offset + nbytes]
  def _wrap(self, ptr: int, nbytes: int) -> np.ndarray:
    import ctypes
    return np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(ptr))
  def _copyin(self, dest: np.ndarray, src: memoryview) -> None: dest[:] = np.frombuffer(src, np.uint8)
  def _copyout(self, dest: memoryview, src: np.ndarray) -> None: np.frombuffer(dest, np.uint8)[:] = src


class InterpCompiler(Compiler):
  """The "binary" is the kernel's IR listing: compiling checks that it parses."""
  name, cache_namespace = "IR", ""  # nothing to cache: parsing is cheap

  def render(self, kernel: Kernel) -> str: return kernel.dump()
  def toolchain(self) -> tuple[str, ...]: return (plugrt.__version__,)

  def compile_uncached(self, src: str) -> bytes:
    try: parse(src)
    except (IRError, KeyError, ValueError, SyntaxError) as e: raise CompileError(f"not a plugrt IR listing: {e}") from None
    return src.encode()


class InterpProgram(Program):
  """The kernel's IR, run by plugrt's reference interpreter. The core owns the launch (plugrt.runtime.Program):
  this program says only how a checked call becomes something to submit."""
  scalar_packer = staticmethod(value_packer)  # each scalar as the dtype holds it, for the interpreter

  def __init__(self, device: Any, name: str, lib: bytes, signature: Signature):
    super().__init__(device, name, lib, signature)
    self.kernel = parse(lib.decode())

  def _encode(self, bufs: tuple, scalars: tuple, gs: tuple[int, int, int], ls: tuple[int, int, int]) -> PreparedCall:
    """A checked call (the core checked counts, types and sizes, and packed the scalars with scalar_packer) as what
    submits it; the core keeps it for the calls that repeat this one."""
    arrays = [b.handle.view(dt.numpy) for b, dt in zip(bufs, self.signature.buffers)]
    return PreparedCall(submit=partial(interpreter.run, self.kernel, arrays, list(scalars), gs, ls))
