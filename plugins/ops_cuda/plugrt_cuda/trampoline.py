"""A one-argument trampoline for cuLaunchKernel.

A ctypes call's cost grows with its arguments, and converting cuLaunchKernel's eleven is
what a launch from Python costs above the driver's floor (docs/performance.md). So the program
keeps its eleven arguments in a struct of 8-byte slots, and a launch calls this
trampoline with the struct's address: one argument, without releasing the GIL. The trampoline is x86-64 machine code
(System V ABI) written into an executable page; elsewhere, or where the system does
not allow executable pages, `make()` returns None and programs make the ordinary call.

Slot layout: 0 the function to call, then its arguments in order: f, gridDim x y z,
blockDim x y z, sharedMemBytes, stream, kernelParams, extra (unsigned ints zero-extended).
"""
from __future__ import annotations

import ctypes
from typing import Any

from plugrt import machinecode

SLOTS = 12

# push rbx; mov rbx, rdi; sub rsp, 48          (rsp stays 16-byte aligned at the call)
# five stack arguments: [rsp+0..32] = slots 7..11 (blockDim z, sharedMemBytes, stream, kernelParams, extra)
# six register arguments: rdi, rsi, rdx, rcx, r8, r9 = slots 1..6
# call [rbx]; add rsp, 48; pop rbx; ret        (the callee's int result stays in eax)
_CODE = bytes.fromhex(
  "53" "4889fb" "4883ec30"
  "488b4338" "48890424"
  "488b4340" "4889442408"
  "488b4348" "4889442410"
  "488b4350" "4889442418"
  "488b4358" "4889442420"
  "488b7b08" "488b7310" "488b5318" "488b4b20" "4c8b4328" "4c8b4b30"
  "ff13" "4883c430" "5b" "c3")

_fn: Any = None


def make() -> Any:
  """The trampoline as a ctypes function taking the struct's address, or None where it cannot run."""
  global _fn
  if _fn is None:
    addr = machinecode.code(_CODE)
    # PYFUNCTYPE keeps the GIL: a launch returns at once, and releasing and taking the GIL back would
    # make each launch markedly slower (docs/performance.md)
    _fn = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p)(addr) if addr else False
  return _fn or None
