"""NVRTC as a public service of plugrt-cuda: CUDA C -> cubin for one architecture.

Other backends that drive NVIDIA GPUs without the CUDA driver (plugrt-nv) compile through here, with the same
options plugrt's CUDA device uses, so a kernel rounds the same way on both. Loading NVRTC happens on the first
call, never at import.
"""
from __future__ import annotations

from plugrt.errors import CompileError

#: no contraction into FMA (the IR rounds every op), IEEE division and square root, no flush to zero
OPTIONS = ("--fmad=false", "--prec-div=true", "--prec-sqrt=true", "--ftz=false", "-default-device")
HINT = "install the CUDA toolkit, or pip install nvidia-cuda-nvrtc"


def available() -> bool:
  """Whether an NVRTC library is on disk (looks at paths only; loads nothing)."""
  import os

  from plugrt_cuda.driver import nvrtc_candidates
  return any(os.path.exists(p) for p in nvrtc_candidates())


def version() -> str:
  """NVRTC's version, "13.0"; raises CompileError when NVRTC is missing."""
  from plugrt_cuda import driver as D
  if D.libnvrtc() is None: raise CompileError("NVRTC (libnvrtc.so) is not installed", hint=HINT)
  return D.nvrtc_version()


def kernel_name(src: str) -> str:
  """The first __global__ function's name in src (names the program in NVRTC's log)."""
  return src.split("__global__ void ", 1)[-1].split("(", 1)[0].strip() if "__global__" in src else "kernel"


def compile_cubin(src: str, arch: str, options: tuple[str, ...] = OPTIONS) -> bytes:
  """A cubin (ELF) of CUDA C `src` for `arch` ("sm_90"); a rejected source raises CompileError with NVRTC's log."""
  from plugrt_cuda import driver as D
  if D.libnvrtc() is None: raise CompileError("NVRTC (libnvrtc.so) is not installed", hint=HINT)
  name = kernel_name(src)
  binary, log = D.nvrtc_compile(src, name, [f"--gpu-architecture={arch}", *options], cubin=True)
  if binary is None: raise CompileError(f"NVRTC failed to compile {name} for {arch}", log, "a renderer bug if the kernel came from plugrt's IR")
  return binary
