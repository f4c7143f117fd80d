"""A whole fake NVIDIA GPU on a fake PCI bus, opened through plugrt-nv-pci: the sysfs tree, the firmware files, host
memory and the GPU behind BAR0 of fake_nvpci.py (GA102, AD102) or fake_nvpci_gb.py (GB202), and the plugins that make
plugrt-nv's device run on it (what nv_pci_session.py and test_nv_pci.py load)."""
from __future__ import annotations

import os
from typing import Any

from fake_nvpci import ADA, AMPERE, BLACKWELL, FakeBAR0, FakeDMA, FakeFirmware, KernelWrites, make_sysfs
from fake_nvpci_gb import FakeBAR0GB, FakeFirmwareGB

# ---- a whole fake GPU on a fake PCI bus, opened through plugrt-nv-pci ------------------------------------------------

ADDRESS = "0000:01:00.0"
#: chip -> (PCI device id and NV_PMC_BOOT_42, its firmware files, its GPU behind BAR0)
BOARDS: dict[str, tuple[tuple[int, int], type, type]] = {"ga102": (AMPERE, FakeFirmware, FakeBAR0), "ad102": (ADA, FakeFirmware, FakeBAR0),
                                                         "gb202": (BLACKWELL, FakeFirmwareGB, FakeBAR0GB)}
CHIPS = {chip: ids for chip, (ids, _, _) in BOARDS.items()}


class FakePCINV:
  """One fake NVIDIA GPU (`chip`: "ga102" Ampere, "ad102" Ada, "gb202" Blackwell) on a fake sysfs tree, bound to nvidia, with its
  firmware files: `open(device)` runs plugrt-nv-pci's real open path on it. `dma` "pagemap": the BARs and the DMA
  allocator are the fake's (FakeDMA standing for PagemapDMA); "vfio": the GPU sits alone in a translating IOMMU group,
  PLUGRT_NV_PCI_DMA=vfio, and plugrt-nv-pci's own VFIO path (VFIODMA, VFIOFunction) runs on fake_vfio's kernel, which
  maps the BARs and translates the GPU's IOVAs. `env()` is what NV_IFACE=PCI needs. Files live in a temporary folder
  until shutdown()."""

  def __init__(self, chip: str = "ga102", root: str | None = None, dma: str = "pagemap"):
    import tempfile
    if chip not in CHIPS: raise ValueError(f"no fake NV chip {chip!r} (have {', '.join(CHIPS)})")
    self.chip, self.own = chip, root is None
    self.dir = root or tempfile.mkdtemp(prefix="plugrt-fake-nvpci-")
    (device, boot42), firmware, bar0 = BOARDS[chip]
    self.devices, self.drivers = make_sysfs(os.path.join(self.dir, "sys"), [(ADDRESS, device, "nvidia")])
    self.kernel = KernelWrites(self.devices)
    self.fw_root = os.path.join(self.dir, "fw")
    self.firmware = firmware(self.fw_root, chip)
    if dma not in ("pagemap", "vfio"): raise ValueError(f"no fake DMA path {dma!r} (have pagemap, vfio)")
    self.dma_path, self.vfio = dma, None
    self.dma: Any = FakeDMA()
    if dma == "vfio":
      from fake_vfio import FakeVFIO, add_group
      add_group(self.devices, "42", [ADDRESS])
      self.vfio = self.dma = FakeVFIO(self.devices)
      self.kernel.watch = self.vfio.kernel_write
    self.gpu = bar0(boot42, self.dma, self.firmware, config=os.path.join(self.devices, ADDRESS, "config"), pci_address=ADDRESS)
    if self.vfio is not None: self.vfio.bars.update({0: self.gpu, 1: self.gpu.vram})
    self.mapped: list[int] = []

  def bars(self, fn: Any, index: int) -> Any:
    self.mapped.append(index)
    return self.gpu.vram if index == 1 else self.gpu

  def open(self, device: Any) -> Any:
    import plugrt_nv_pci
    if self.vfio is not None: return plugrt_nv_pci.open_pci(device, self.devices, self.drivers, self.kernel, vfio=self.vfio)
    return plugrt_nv_pci.open_pci(device, self.devices, self.drivers, self.kernel, bars=self.bars, dma=lambda d: self.dma)

  def env(self) -> dict[str, str]:
    return {"NV": "1", "NV_IFACE": "PCI", "NV_PTX": "1", "PLUGRT_NV_ALLOW_UNBIND": "1", "PLUGRT_NV_FIRMWARE": self.fw_root,
            "PLUGRT_NV_BOOT_TIMEOUT": "5", "PLUGRT_NV_TIMEOUT": "20", **({"PLUGRT_NV_PCI_DMA": "vfio"} if self.vfio is not None else {})}

  def violations(self) -> list[str]:
    gsp = self.gpu.gsp
    return [*self.gpu.violations, *self.gpu.vram.violations, *(gsp.errors if gsp is not None else []), *(self.vfio.violations if self.vfio else [])]

  def shutdown(self) -> None:
    import shutil
    self.gpu.close()
    if self.own: shutil.rmtree(self.dir, ignore_errors=True)


def fake_pci_plugins(fake: FakePCINV) -> list[Any]:
  """plugrt-nv's real hooks behind a probe that finds the fake (its compiler telling the fake which IR each cubin it
  builds came from), and a PCI interface plugin whose open is plugrt-nv-pci's on the fake: what the session loads."""
  import types

  import plugrt_nv
  from plugrt.hookspecs import InterfaceSpec, Probe, hookimpl
  found = lambda *a: Probe.found(1, "fake PCI GPU")
  nv = types.ModuleType("fake_plugrt_nv_pci_backend")
  spec = plugrt_nv.plugrt_backends()[0]._replace(probe=found)
  nv.plugrt_backends = hookimpl(lambda: [spec])  # type: ignore[attr-defined]
  for hook in ("plugrt_open_device", "plugrt_allocator", "plugrt_program", "plugrt_graph"): setattr(nv, hook, getattr(plugrt_nv, hook))
  nv.plugrt_compiler = hookimpl(lambda device, compiler: recording_compiler(device, compiler, fake.gpu))  # type: ignore[attr-defined]
  iface = types.ModuleType("fake_plugrt_nv_pci")
  iface.plugrt_interfaces = hookimpl(lambda: [InterfaceSpec("NV", "PCI", found, auto=False,  # type: ignore[attr-defined]
                                                            description="plugrt-nv-pci on the fake GPU of a fake sysfs tree")])
  iface.plugrt_open_interface = hookimpl(lambda device, interface: fake.open(device))  # type: ignore[attr-defined]
  return [nv, iface, "plugrt.reference"]


def recording_compiler(device: Any, name: str, gpu: FakeBAR0) -> Any:
  """NV's compiler `name` for `device`, telling `gpu` which IR each cubin it returns was built from."""
  from plugrt_nv.compiler import NVRTCCompiler, PTXCompiler
  base = PTXCompiler if name == "PTX" else NVRTCCompiler

  class Recording(base):  # type: ignore[misc, valid-type]
    def __init__(self, device: Any):
      super().__init__(device)
      self.rendered: dict[str, Any] = {}

    def render(self, kernel: Any) -> str:
      src = super().render(kernel)
      self.rendered[src] = kernel
      return src

    def compile_cached(self, src: str) -> tuple[bytes, bool]:
      lib, cached = super().compile_cached(src)
      return self._registered(src, lib), cached

    def recompile(self, src: str, error: Exception) -> bytes: return self._registered(src, super().recompile(src, error))

    def _registered(self, src: str, lib: bytes) -> bytes:
      if (kernel := self.rendered.get(src)) is not None: gpu.register(lib, kernel)
      return lib
  return Recording(device)
