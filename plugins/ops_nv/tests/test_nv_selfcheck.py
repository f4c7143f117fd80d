"""`python -m plugrt_nv`, NV's self-check, reaches its interface the way the device does: through the registry (the
interface plugin's plugrt_open_interface hook), never by importing an interface package, so it checks whichever
interface NV would open (NV_IFACE, else the automatic choice) and runs where only a third party's interface is installed."""
from __future__ import annotations

import ast
import types
from pathlib import Path

from fake_gpu import FakeGPU

import plugrt_nv
from plugrt.hookspecs import InterfaceSpec, Probe, hookimpl
from plugrt_nv import __main__ as selfcheck
from plugrt_nv.iface import Mem

INTERFACE_PACKAGES = {m for _, m, _ in plugrt_nv.INTERFACES}


def test_the_self_check_imports_no_interface_package():
  """Every import of plugrt_nv/__main__.py, inside functions too, names no interface package (plugrt_nv_nvk, plugrt_nv_pci)."""
  tree = ast.parse(Path(selfcheck.__file__).read_text())
  names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
  names += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module and not n.level]
  assert {"plugrt", "numpy"} <= {n.split(".")[0] for n in names}  # the scan sees the module's imports, those inside main() too
  assert not [n for n in names if n.split(".")[0] in INTERFACE_PACKAGES or n.split(".")[0].startswith("plugrt_nv_")], names


class _CountingGPU(FakeGPU):
  """A fake GPU that notes the kinds of memory allocated and freed through it, and whether it was closed."""

  def __init__(self) -> None:
    self.allocated: list[str] = []
    self.freed: list[str] = []
    super().__init__()

  def alloc(self, size: int, kind: str = "device") -> Mem:
    self.allocated.append(kind)
    return super().alloc(size, kind)

  def free(self, mem: Mem) -> None:
    self.freed.append(mem.kind)
    super().free(mem)


def test_the_interface_step_opens_what_the_registry_chooses(plugrt_registry):
  """With only a third party's interface installed (no plugrt_nv_nvk in the registry), the interface step opens it
  through its hook, for the index asked, and allocates, checks and frees memory of each kind, then closes it."""
  gpu, asked = _CountingGPU(), []
  nv = types.ModuleType("fake_plugrt_nv")
  spec = plugrt_nv.plugrt_backends()[0]._replace(probe=lambda: Probe.found(2, "fake"))
  nv.plugrt_backends = hookimpl(lambda: [spec])  # type: ignore[attr-defined]
  iface = types.ModuleType("fake_nv_iface")
  iface.plugrt_interfaces = hookimpl(lambda: [InterfaceSpec("NV", "FAKE", lambda: Probe.found(1, "fake"))])  # type: ignore[attr-defined]
  iface.plugrt_open_interface = hookimpl(lambda device, interface: asked.append((device.index, interface)) or gpu)  # type: ignore[attr-defined]
  try:
    with plugrt_registry([nv, iface]):
      out = selfcheck.interface_alone(1)
  finally: gpu.close()
  assert asked == [(1, "FAKE")] and out.startswith("FAKE: ") and str(gpu.gr) in out
  assert gpu.allocated[-3:] == gpu.freed == ["device", "mapped", "host"] and gpu.stop
