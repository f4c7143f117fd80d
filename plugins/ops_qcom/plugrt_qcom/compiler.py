"""QCOM's compiler: the kernel as OpenCL C (the core's OpenCL renderer, the same text plugrt-cl builds, images
included), compiled by the device's own Qualcomm OpenCL driver into a program binary; plugrt_qcom.binary takes the
shader and its layout out of that binary when the program loads. Without Qualcomm's driver every compile raises
libcl.MissingToolchain (a CompileError) naming what to install.
"""
from __future__ import annotations

from plugrt.compiler.ir import Kernel
from plugrt.compiler.renderer.opencl import OpenCLRenderer
from plugrt.hookspecs import DeviceInfo
from plugrt.runtime import Compiler
from plugrt_qcom import libcl


class QCOMCompiler(Compiler):
  name = "CL"
  cache_namespace = "qcom-cl"

  def __init__(self, device: DeviceInfo):
    super().__init__(device)
    self.env = device.context.env
    self.renderer = OpenCLRenderer("QCOM", fp64=False)  # Adreno's OpenCL has no cl_khr_fp64
    self._driver: libcl.QualcommCompiler | None = None

  def driver(self) -> libcl.QualcommCompiler:
    if self._driver is None: self._driver = libcl.QualcommCompiler(self.env)
    return self._driver

  def render(self, kernel: Kernel) -> str: return self.renderer.render(kernel)
  def toolchain(self) -> tuple[str, ...]: return (self.driver().version, self.driver().cl.path)
  def compile_uncached(self, src: str) -> bytes: return self.driver().compile(src)
