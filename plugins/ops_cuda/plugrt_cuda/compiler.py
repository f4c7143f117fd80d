"""CUDA's compilers: CUDA C through NVRTC to a cubin for the device's own architecture (default), and PTX
rendered directly (CUDA_PTX=1), which the driver's JIT compiles when the module loads. Renderers and NVRTC are
plugrt_nvidia_toolchain's, shared with plugrt-nv."""
from __future__ import annotations

from typing import Any

from plugrt.compiler.ir import Kernel
from plugrt.errors import CompileError
from plugrt.hookspecs import DeviceInfo
from plugrt.runtime import Compiler
from plugrt_cuda import driver as D
from plugrt_nvidia_toolchain import nvrtc
from plugrt_nvidia_toolchain.arch import device_arch
from plugrt_nvidia_toolchain.cuda_c import CUDARenderer


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
    self.env = device.context.env
    self.renderer, self.arch = CUDARenderer(), device_arch(device)
    if nvrtc.library(self.env) is None: raise CompileError("NVRTC (libnvrtc.so) is not installed", hint=nvrtc.HINT)

  def render(self, kernel: Kernel) -> str: return self.renderer.render(kernel)
  def toolchain(self) -> tuple[str, ...]: return (f"nvrtc {nvrtc.version(self.env)}", self.arch, " ".join(nvrtc.OPTIONS))

  def compile_uncached(self, src: str) -> bytes: return nvrtc.compile_cubin(src, self.arch, self.env)


class PTXCompiler(Compiler):
  name = "PTX"
  cache_namespace = "cuda-ptx"

  def __init__(self, device: DeviceInfo):
    super().__init__(device)
    from plugrt_nvidia_toolchain.arch import ptx_version
    from plugrt_nvidia_toolchain.ptx import PTXRenderer
    self.arch = device_arch(device)
    self.renderer = PTXRenderer(self.arch, ptx_version(self.arch))

  def render(self, kernel: Kernel) -> str: return self.renderer.render(kernel)
  def toolchain(self) -> tuple[str, ...]: return ("ptx", self.arch, f"driver {driver_version()}")

  def compile_uncached(self, src: str) -> bytes:
    if ".entry" not in src: raise CompileError("not a PTX module: it declares no .entry")
    return src.encode()  # the driver's JIT compiles it when the module loads (and keeps its own cache)


def make(device: DeviceInfo, name: str) -> Any:
  return PTXCompiler(device) if name == "PTX" else NVRTCCompiler(device)
