"""NV's compilers, both producing a cubin for the GPU's own architecture (NV loads cubins itself, with no
driver JIT): CUDA C through NVRTC (default), and PTX assembled by ptxas or nvJitLink (NV_PTX=1). The renderers and NVRTC
are plugrt-cuda's public ones, so a kernel is the same text and rounds the same way on CUDA and NV.
"""
from __future__ import annotations

import os
import subprocess
import tempfile
from typing import Any

from plugrt.errors import CompileError
from plugrt.hookspecs import DeviceInfo
from plugrt.ir import Kernel
from plugrt.runtime import Compiler
from plugrt_nv import PTXAS_HINT, ptxas_path


def device_arch(device: DeviceInfo) -> str:
  """The target: what the user asked for (DEV=NV::sm_90), else the opened GPU's, else sm_90."""
  return device.arch or getattr(device.state, "arch", None) or "sm_90"


class NVRTCCompiler(Compiler):
  name = "CUDA"
  cache_namespace = "nv-nvrtc"

  def __init__(self, device: DeviceInfo):
    super().__init__(device)
    from plugrt_cuda import nvrtc
    from plugrt_cuda.renderer import CUDARenderer
    self.nvrtc, self.renderer, self.arch = nvrtc, CUDARenderer(), device_arch(device)

  def render(self, kernel: Kernel) -> str: return self.renderer.render(kernel)
  def toolchain(self) -> tuple[str, ...]: return (f"nvrtc {self.nvrtc.version()}", self.arch, " ".join(self.nvrtc.OPTIONS))
  def compile_uncached(self, src: str) -> bytes: return self.nvrtc.compile_cubin(src, self.arch)


class PTXCompiler(Compiler):
  """PTX from plugrt-cuda's PTX renderer, assembled to a cubin by ptxas (a subprocess) or by nvJitLink (in process):
  ptxas when it is installed, else nvJitLink; PLUGRT_NV_ASSEMBLER=ptxas|nvjitlink picks one."""
  name = "PTX"
  cache_namespace = "nv-ptxas"

  def __init__(self, device: DeviceInfo):
    super().__init__(device)
    from plugrt_cuda.ptx import PTXRenderer, min_ptx_version
    from plugrt_nv import jitlink
    self.arch = device_arch(device)
    self.renderer = PTXRenderer(self.arch, max("8.0", min_ptx_version(self.arch), key=lambda v: tuple(map(int, v.split(".")))))
    want = os.environ.get("PLUGRT_NV_ASSEMBLER", "").lower()
    if want not in ("", "ptxas", "nvjitlink"):
      raise CompileError(f"PLUGRT_NV_ASSEMBLER={want!r}: use ptxas or nvjitlink")
    self.ptxas = ptxas_path() if want != "nvjitlink" else None
    self.jitlink = jitlink if self.ptxas is None and want != "ptxas" and jitlink.path() else None
    if self.ptxas is None and self.jitlink is None:
      raise CompileError(f"{'ptxas' if want == 'ptxas' else 'nvJitLink' if want else 'neither ptxas nor nvJitLink'} is installed, "
                         "so NV cannot assemble PTX", hint=f"{PTXAS_HINT}; or {jitlink.HINT}")
    if self.jitlink is not None: self.cache_namespace = "nv-nvjitlink"
    self._version = ""

  def render(self, kernel: Kernel) -> str: return self.renderer.render(kernel)

  def toolchain(self) -> tuple[str, ...]:
    if not self._version:
      if self.jitlink is not None: self._version = f"nvjitlink {self.jitlink.version()}"
      else:
        out = subprocess.run([self.ptxas, "--version"], capture_output=True, text=True, timeout=60).stdout.strip().splitlines()  # type: ignore[list-item]
        self._version = f"ptxas {out[-1] if out else 'unknown'}"
    return (self._version, self.arch)

  def compile_uncached(self, src: str) -> bytes:
    if ".entry" not in src: raise CompileError("not a PTX module: it declares no .entry")
    if self.jitlink is not None: return self.jitlink.assemble(src, self.arch)
    with tempfile.TemporaryDirectory(prefix="plugrt-nv-") as d:
      ptx, out = os.path.join(d, "k.ptx"), os.path.join(d, "k.cubin")
      with open(ptx, "w") as f: f.write(src)
      p = subprocess.run([self.ptxas, f"-arch={self.arch}", "-o", out, ptx], capture_output=True, text=True, timeout=300)  # type: ignore[list-item]
      if p.returncode != 0: raise CompileError(f"ptxas failed to assemble the kernel for {self.arch}", p.stderr + p.stdout)
      with open(out, "rb") as f: return f.read()


def make(device: DeviceInfo, name: str) -> Any:
  return PTXCompiler(device) if name == "PTX" else NVRTCCompiler(device)
