"""Opening AMD on the fake KFD: plugrt-amd's own hooks with its probe forced true (there is no AMD GPU here), the KFD
interface opened through plugrt-amd-kfd's `open_kfd` with the fake as the KFDOps seam, and the real AMD_LLVM
compiler, wrapped so that every code object it builds is registered with the fake together with the kernel's IR
(`FakeKFD.register`): the fake then runs each dispatch of that code object through the reference interpreter."""
from __future__ import annotations

import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fake_kfd import FakeKFD

import plugrt_amd
import plugrt_amd_kfd
from plugrt import dtypes
from plugrt.compiler.ir import Kernel, KernelBuilder
from plugrt.hookspecs import InterfaceSpec, Probe, hookimpl
from plugrt.registry import isolated

ENV = {"AMD": "1", "AMD_LLVM": "1", "PLUGRT_AMD_TIMEOUT": "20"}


def axpy_kernel() -> Kernel:
  """out[i] = a[i] * s + b[i] on float32, i < n: the kernel the queue-level tests (KFD, PCI) dispatch by hand."""
  b = KernelBuilder("axpy")
  out, x, y = b.buffer("out", dtypes.float32), b.buffer("a", dtypes.float32), b.buffer("b", dtypes.float32)
  s, n = b.scalar("s", dtypes.float32), b.scalar("n", dtypes.int32)
  i = b.global_id(0)
  with b.if_(i < n): out[i] = x[i] * s + y[i]
  return b.finish()


def recording_compiler(device: Any, fake: FakeKFD) -> Any:
  """AMD_LLVM for `device`, telling `fake` which IR each code object it returns was built from."""
  from plugrt_amd.llvm import AMDLLVMCompiler

  class Recording(AMDLLVMCompiler):
    def __init__(self, device: Any):
      super().__init__(device)
      self.rendered: dict[str, Kernel] = {}

    def render(self, kernel: Kernel) -> str:
      src = super().render(kernel)
      self.rendered[src] = kernel
      return src

    def compile_cached(self, src: str) -> tuple[bytes, bool]:  # every binary a device loads comes from here or recompile
      lib, cached = super().compile_cached(src)
      return self._registered(src, lib), cached

    def recompile(self, src: str, error: Exception) -> bytes: return self._registered(src, super().recompile(src, error))

    def _registered(self, src: str, lib: bytes) -> bytes:
      if (kernel := self.rendered.get(src)) is not None: fake.register(lib, kernel)
      return lib
  return Recording(device)


def fake_plugins(fake: FakeKFD) -> list[Any]:
  found = lambda *a: Probe.found(1, "fake KFD")
  mod = types.ModuleType("fake_plugrt_amd")
  spec = plugrt_amd.plugrt_backends()[0]._replace(probe=found)
  mod.plugrt_backends = hookimpl(lambda: [spec])  # type: ignore[attr-defined]
  for hook in ("plugrt_open_device", "plugrt_allocator", "plugrt_program"): setattr(mod, hook, getattr(plugrt_amd, hook))
  mod.plugrt_compiler = hookimpl(lambda device, compiler: recording_compiler(device, fake))  # type: ignore[attr-defined]
  iface = types.ModuleType("fake_plugrt_amd_kfd")
  iface.plugrt_interfaces = hookimpl(lambda: [InterfaceSpec("AMD", "KFD", found, description="the fake KFD")])  # type: ignore[attr-defined]
  iface.plugrt_open_interface = hookimpl(lambda device, interface: plugrt_amd_kfd.open_kfd(device, ops=fake))  # type: ignore[attr-defined]
  return [mod, iface, "plugrt.reference"]


@contextmanager
def fake_amd(env: dict[str, str] | None = None, before_open: Any = None, **kw: Any) -> Iterator[tuple[FakeKFD, Any]]:
  """(the fake KFD, the AMD device opened on it), in a registry of exactly AMD, its KFD interface and PYTHON.
  before_open(fake): what happens in the process before plugrt opens the GPU (another runtime acquiring its VM)."""
  fake = FakeKFD(**kw)
  if before_open is not None: before_open(fake)
  try:
    with isolated(fake_plugins(fake), env={**ENV, **(env or {})}) as reg: yield fake, reg.open("AMD")
  finally: fake.shutdown()
