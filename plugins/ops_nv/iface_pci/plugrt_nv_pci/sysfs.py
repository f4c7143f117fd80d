"""An NVIDIA GPU's PCI function through sysfs: finding candidates (read only), taking the function from its kernel
driver and giving it back, and its BARs mapped from their `resourceN` files.

Every path is under `root` (default /sys/bus/pci/devices) and `drivers` (default /sys/bus/pci/drivers), so tests run
against a fake tree in a temporary folder; writes go through `write(path, text)`, where a fake tree plays the kernel's
part (removing the `driver` link on unbind). The sysfs access itself is the core's (plugrt.pcisysfs, shared with AMD's
PCI interface): `take()` runs once the caller has the user's acknowledgement, records what it changed (the driver it
unbound, whether it enabled the function, whether it turned bus mastering on) and `release()` undoes exactly that,
with a function-level reset first once the GSP boot began. Bus mastering (PCI_COMMAND bit 2, in the `config` file at offset 4) is what lets
the GPU read host memory by DMA: enabling the function through sysfs does not set it.

BARs (PCI BAR layout of NVIDIA GPUs since Fermi, as open-gpu-kernel-modules' nv.c maps them): BAR0 registers (16 MiB),
BAR1 a window onto VRAM (physical mode once the GSP boot set NV_PBUS_BAR1_BLOCK to 0), BAR3 (index 3 in sysfs's
numbering of 64-bit BARs) the instance-memory window.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from plugrt import pcisysfs
from plugrt.pcisysfs import PCI_DEVICES, PCI_DRIVERS, MappedBAR, driver_of, read_text
from plugrt_nv_pci.chips import DISPLAY_CLASS, NVIDIA_VENDOR

__all__ = ["PCI_DEVICES", "PCI_DRIVERS", "REGISTER_BAR", "VRAM_BAR", "Candidate", "MappedBAR", "PCIFunction", "nvidia_gpus"]

REGISTER_BAR, VRAM_BAR = 0, 1


@dataclass(frozen=True)
class Candidate:
  """An NVIDIA display function sysfs lists: its address, device id, class and bound driver ("" when none)."""
  address: str
  device: int
  cls: int
  driver: str


def nvidia_gpus(root: str = PCI_DEVICES) -> list[Candidate]:
  """NVIDIA (0x10de) functions of the display class (0x03xxxx) in sysfs, by address; reads `vendor`, `class`,
  `device` and the `driver` link only."""
  try: names = sorted(os.listdir(root))
  except OSError: return []
  out = []
  for addr in names:
    d = os.path.join(root, addr)
    try: vendor, cls, dev = (int(read_text(os.path.join(d, f)) or "0", 16) for f in ("vendor", "class", "device"))
    except ValueError: continue
    if vendor == NVIDIA_VENDOR and cls >> 16 == DISPLAY_CLASS: out.append(Candidate(addr, dev, cls, driver_of(d)))
  return out


class PCIFunction(pcisysfs.PCIFunction):
  """The PCI function `address` (0000:01:00.0) under `root`."""
  missing_hint = "list them with lspci -D -d 10de:"
