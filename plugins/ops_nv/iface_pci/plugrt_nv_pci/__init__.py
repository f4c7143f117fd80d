"""plugrt-nv-pci: the PCI interface of the NV device, which would drive the GPU with no kernel driver at all.

Doing that means unbinding the GPU from the nvidia driver, taking its PCI BARs through vfio or sysfs, and booting
its GSP firmware from user space: it takes the GPU away from every other program on the machine. So this
interface is never chosen automatically (`NV_IFACE=PCI` or `DEV=PCI+NV` must name it), and this release does
not implement it: its probe says so, and opening it refuses. It never unbinds anything and never touches PCI
configuration. Entry module: standard library and plugrt only.
"""
from __future__ import annotations

from typing import Any

from plugrt.errors import Reason, UnsupportedError
from plugrt.hookspecs import DeviceInfo, InterfaceSpec, Probe, hookimpl

__version__ = "0.1.0"
NAME = "PCI"
WHY = ("the driverless PCI interface is not implemented in this release: it would unbind the GPU from the nvidia driver "
       "and boot the GPU's firmware from user space, which no plugrt code does yet")
HINT = "use the NVK interface (NV_IFACE=NVK, the default), which works alongside the NVIDIA kernel driver"


def probe() -> Probe: return Probe.missing(Reason.NO_DEVICE, WHY, HINT)


@hookimpl
def plugrt_interfaces() -> list[InterfaceSpec]:
  return [InterfaceSpec(device="NV", name=NAME, probe=probe, auto=False, priority=0,
                        description="driverless: would unbind the GPU from its kernel driver (not implemented; never automatic)")]


@hookimpl
def plugrt_open_interface(device: DeviceInfo, interface: str) -> Any:
  raise UnsupportedError(f"NV:{device.index} through PCI: {WHY}", HINT)
