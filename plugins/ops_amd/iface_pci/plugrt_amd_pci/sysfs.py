"""One PCI function through sysfs: config space, enable, BAR mapping, and the kernel driver's unbind and rebind.

Every path is under `root` (default /sys/bus/pci/devices) and `drivers` (default /sys/bus/pci/drivers), so tests
run against a fake tree in a temporary folder whose `resourceN` files are regular files. Writes go through
`self.write(path, text)`, the seam where a fake tree plays the kernel's part (removing the `driver` link on unbind).

Rules (docs/backends/amd.md): `take()` unbinds a bound driver only when told `allow_unbind=True` (the user set
PLUGRT_AMD_ALLOW_UNBIND=1); otherwise it raises `AcknowledgementRequired` with the exact command the user would run.
What `take()` changed (the driver it unbound, whether it enabled the function) is recorded, and `release()` undoes it:
unmaps the BARs, disables what it enabled, and binds the driver back.

The sysfs access itself is the core's (plugrt.pcisysfs, shared with NV's PCI interface); this module adds AMD's rules:
the acknowledgement take() asks for, config reads as ints, and RegisterError for a BAR access out of range.
sysfs resource files, not VFIO: VFIO's DMA mapping and interrupts belong to the GART/VM and interrupt steps plugrt does
not implement. `vfio_available()` is reported, not used.
"""
from __future__ import annotations

import os

from plugrt import pcisysfs
from plugrt.pcisysfs import PCI_DEVICES, PCI_DRIVERS, Resource, vfio_available
from plugrt_amd.device import AcknowledgementRequired
from plugrt_amd_pci.regs import RegisterError

__all__ = ["PCI_DEVICES", "PCI_DRIVERS", "MappedBAR", "PCIFunction", "Resource", "vfio_available"]


class MappedBAR(pcisysfs.MappedBAR):
  """One BAR mmapped from its sysfs resource file: an MMIO (read32/write32) for plugrt_amd_pci.regs."""

  def out_of_range(self, message: str) -> Exception: return RegisterError(message)


class PCIFunction(pcisysfs.PCIFunction):
  """The PCI function `address` (0000:03:00.0) under `root`."""
  bar_type = MappedBAR

  def config(self, offset: int, size: int = 4) -> int:
    """Read `size` bytes of config space at `offset`, little-endian."""
    return int.from_bytes(self.config_bytes(offset, size), "little")

  def take(self, allow_unbind: bool = False, ack: str = "PLUGRT_AMD_ALLOW_UNBIND") -> None:  # type: ignore[override]
    """Make the function ours: unbind its driver (only with `allow_unbind`; else AcknowledgementRequired with the command), enable it."""
    if (drv := self.driver()) and not allow_unbind:
      raise AcknowledgementRequired(f"{self.address} is bound to the {drv} driver: plugrt does not unbind it without {ack}=1",
                                    f"unbind it yourself: {self.unbind_command()}  (and bind it back later: echo {self.address} | "
                                    f"sudo tee {os.path.join(self.drivers, drv, 'bind')}); or set {ack}=1 and plugrt unbinds it "
                                    "and binds it back when the device closes")
    super().take()
