"""CUDA's compilers: CUDA C through NVRTC to a cubin for the device's own architecture (default), and PTX
rendered directly (CUDA_PTX=1), which the driver's JIT compiles when the module loads."""
from __future__ import annotations

from typing import Any

from plugrt.errors import CompileError
from plugrt.hookspecs import DeviceInfo
from plugrt.ir import Kernel
from plugrt.runtime import Compiler
from plugrt_cuda import driver as D
from plugrt_cuda import nvrtc
from plugrt_cuda.renderer import CUDARenderer

NVRTC_OPTIONS = nvrtc.OPTIONS  # (kept under this name for existing users)


def device_arch(device: DeviceInfo) -> str:
  """The architecture to build for: what the user asked (DEV=CUDA::sm_90), else the opened GPU's, else sm_90."""
  if device.arch: return device.arch
  state = device.state
  return getattr(state, "arch", None) or "sm_90"


def driver_version() -> str:
  lib = D.libcuda()
  if lib is None: return "no-driver"
  import ctypes
  v = ctypes.c_int()
  lib.cuDriverGetVersion(ctypes.byref(v))
  return str(v.value)


class NVRTCCompiler(Compiler):
  name = "CUDA"
  cache_namespace = "cuda-nvrtc"

  def __init__(self, device: DeviceInfo):
    super().__init__(device)
    self.renderer, self.arch = CUDARenderer(), device_arch(device)
    if D.libnvrtc() is None:
      raise CompileError("NVRTC (libnvrtc.so) is not installed", hint="install the CUDA toolkit or pip install nvidia-cuda-nvrtc")

  def render(self, kernel: Kernel) -> str: return self.renderer.render(kernel)
  def toolchain(self) -> tuple[str, ...]: return (f"nvrtc {D.nvrtc_version()}", self.arch, " ".join(NVRTC_OPTIONS))

  def compile_uncached(self, src: str) -> bytes: return nvrtc.compile_cubin(src, self.arch)


class PTXCompiler(Compiler):
  name = "PTX"
  cache_namespace = "cuda-ptx"

  def __init__(self, device: DeviceInfo):
    super().__init__(device)
    from plugrt_cuda.ptx import PTXRenderer, min_ptx_version
    self.arch = device_arch(device)
    # the lowest PTX version the target accepts (sm_100 needs 8.6, sm_120 8.7), and at least 8.0
    self.renderer = PTXRenderer(self.arch, max("8.0", min_ptx_version(self.arch), key=lambda v: tuple(map(int, v.split(".")))))

  def render(self, kernel: Kernel) -> str: return self.renderer.render(kernel)
  def toolchain(self) -> tuple[str, ...]: return ("ptx", self.arch, f"driver {driver_version()}")

  def compile_uncached(self, src: str) -> bytes:
    if ".entry" not in src: raise CompileError("not a PTX module: it declares no .entry")
    return src.encode()  # the driver's JIT compiles it when the module loads (and keeps its own cache)


def make(device: DeviceInfo, name: str) -> Any:
  return PTXCompiler(device) if name == "PTX" else NVRTCCompiler(device)
