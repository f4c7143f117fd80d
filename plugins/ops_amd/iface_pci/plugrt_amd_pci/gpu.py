"""The PCI interface's object, `DeviceInfo.iface_object` of an AMD device opened with AMD_IFACE=PCI once the
driverless bring-up reached an AQL queue: a `plugrt_amd_pci.driverless.DriverlessGPU` (plugrt-amd's GPUInterface on
plugrt's VMID 8 and MEC queue) whose host copies are CPU copies through the VRAM BAR (`BARPath`). The GPU function stays taken
(amdgpu unbound, BARs mapped) for the device's life, and `close()` gives it back exactly as a failed open does (BARs
unmapped, the function disabled if plugrt enabled it, the driver bound back).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from plugrt_amd_pci.driverless import BARPath, DriverlessGPU


class PCIGPU(DriverlessGPU):
  """One AMD GPU held through sysfs after bring-up; `close()` is idempotent, and `released` says what it undid."""
  name = "PCI"

  def __init__(self, label: str, address: str, regs: Any, bringup: Any, vram_bar_size: int, release: Callable[[], list[str]]):
    super().__init__(label, regs, bringup, BARPath(regs, vram_bar_size))
    self.address, self.vram_bar_size = address, vram_bar_size
    self._release: Callable[[], list[str]] | None = release
    self.released: list[str] = []

  @property
  def closed(self) -> bool: return self._release is None

  def close(self) -> None:
    if self._release is not None:
      release, self._release = self._release, None
      self.released = release()
