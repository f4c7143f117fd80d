"""The PCI interface's object, `DeviceInfo.iface_object` of an AMD device opened with AMD_IFACE=PCI once the
driverless bring-up reached an AQL queue: the GPU function stays taken (amdgpu unbound, BARs mapped) for the device's
life, and `close()` gives it back exactly as a failed open does (BARs unmapped, the function disabled if plugrt
enabled it, the driver bound back).

What plugrt_amd's device uses of it (plugrt_amd.pcirt, by attribute only): `bringup` (the record, whose `compute` is
VMID 8's address space, VRAM heap and MEC queue, and whose `hdp_flush` posts CPU writes), `regs` (registers and
the VRAM BAR), `vram_bar_size` (the bytes of VRAM the CPU reaches through BAR0), `label` and `close()`.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any


class PCIGPU:
  """One AMD GPU held through sysfs after bring-up; `close()` is idempotent and returns what it undid."""

  def __init__(self, label: str, address: str, regs: Any, bringup: Any, vram_bar_size: int, release: Callable[[], list[str]]):
    self.label, self.address, self.regs, self.bringup = label, address, regs, bringup
    self.vram_bar_size = vram_bar_size
    self._release: Callable[[], list[str]] | None = release
    self.released: list[str] = []

  @property
  def closed(self) -> bool: return self._release is None

  def close(self) -> list[str]:
    if self._release is not None:
      release, self._release = self._release, None
      self.released = release()
    return self.released
