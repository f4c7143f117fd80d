"""NV's compilers, both producing a cubin for the GPU's own architecture (NV loads cubins itself, with no
driver JIT): CUDA C through NVRTC (default), and PTX assembled by ptxas or nvJitLink (NV_PTX=1). Renderers, NVRTC and
the assemblers are plugrt_nvidia_toolchain's, which plugrt-cuda uses too, so a kernel is the same text and rounds the
same way on CUDA and NV.
"""
from __future__ import annotations

from typing import Any

from plugrt.compiler.ir import Kernel
from plugrt.errors import CompileError
from plugrt.hookspecs import DeviceInfo
from plugrt.runtime import Compiler
from plugrt_nvidia_toolchain import nvrtc
from plugrt_nvidia_toolchain.arch import device_arch


class NVRTCCompiler(Compiler):
  name = "CUDA"
  cache_namespace = "nv-nvrtc"

  def __init__(self, device: DeviceInfo):
    super().__init__(device)
    from plugrt_nvidia_toolchain.cuda_c import CUDARenderer
    self.env, self.renderer, self.arch = device.context.env, CUDARenderer(), device_arch(device)

  def render(self, kernel: Kernel) -> str: return self.renderer.render(kernel)
  def toolchain(self) -> tuple[str, ...]: return (f"nvrtc {nvrtc.version(self.env)}", self.arch, " ".join(nvrtc.OPTIONS))
  def compile_uncached(self, src: str) -> bytes: return nvrtc.compile_cubin(src, self.arch, self.env)


class PTXCompiler(Compiler):
  """PTX from the toolchain's PTX renderer, assembled to a cubin by ptxas (a subprocess) or by nvJitLink (in process):
  ptxas when it is installed, else nvJitLink; PLUGRT_NV_ASSEMBLER=ptxas|nvjitlink picks one."""
  name = "PTX"
  cache_namespace = "nv-ptxas"

  def __init__(self, device: DeviceInfo):
    super().__init__(device)
    from plugrt_nvidia_toolchain import jitlink, ptxas
    from plugrt_nvidia_toolchain.arch import ptx_version
    from plugrt_nvidia_toolchain.ptx import PTXRenderer
    self.env, self.arch = device.context.env, device_arch(device)
    self.renderer = PTXRenderer(self.arch, ptx_version(self.arch))
    want = device.context.get("PLUGRT_NV_ASSEMBLER").lower()
    if want not in ("", "ptxas", "nvjitlink"):
      raise CompileError(f"PLUGRT_NV_ASSEMBLER={want!r}: use ptxas or nvjitlink")
    self.ptxas = ptxas.path(self.env) if want != "nvjitlink" else None
    self.jitlink = jitlink if self.ptxas is None and want != "ptxas" and jitlink.path(self.env) else None
    if self.ptxas is None and self.jitlink is None:
      raise CompileError(f"{'ptxas' if want == 'ptxas' else 'nvJitLink' if want else 'neither ptxas nor nvJitLink'} is installed, "
                         "so NV cannot assemble PTX", hint=f"{ptxas.HINT}; or {jitlink.HINT}")
    if self.jitlink is not None: self.cache_namespace = "nv-nvjitlink"
    self._version = ""

  def render(self, kernel: Kernel) -> str: return self.renderer.render(kernel)

  def toolchain(self) -> tuple[str, ...]:
    if not self._version:
      from plugrt_nvidia_toolchain import ptxas
      self._version = f"nvjitlink {self.jitlink.version(self.env)}" if self.jitlink is not None else f"ptxas {ptxas.version(self.ptxas)}"  # type: ignore[arg-type]
    return (self._version, self.arch)

  def compile_uncached(self, src: str) -> bytes:
    if ".entry" not in src: raise CompileError("not a PTX module: it declares no .entry")
    if self.jitlink is not None: return self.jitlink.assemble(src, self.arch, self.env)
    from plugrt_nvidia_toolchain import ptxas
    return ptxas.assemble(self.ptxas, src, self.arch)  # type: ignore[arg-type]


def make(device: DeviceInfo, name: str) -> Any:
  return PTXCompiler(device) if name == "PTX" else NVRTCCompiler(device)
