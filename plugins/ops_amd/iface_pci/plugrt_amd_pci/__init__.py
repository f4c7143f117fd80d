"""plugrt-amd-pci: the PCI interface of the AMD device, which would drive the GPU with no kernel driver.

Doing that means unbinding the GPU from amdgpu, mapping its BARs (vfio or sysfs resource files), and bringing up
its firmware (PSP, SMU, the MEC) from user space: the GPU is taken from every other program on the machine. So
this interface is never chosen automatically (`AMD_IFACE=PCI` or `DEV=PCI+AMD` must name it), opening it refuses
unless PLUGRT_AMD_ALLOW_UNBIND=1 says the user accepts that, and in this release it then refuses anyway: none of the
bring-up is written. It never unbinds anything and never writes PCI configuration. The probe reads sysfs only.
Entry module: standard library and plugrt only.
"""
from __future__ import annotations

from typing import Any

from plugrt.context import PluginContext
from plugrt.errors import Reason
from plugrt.hookspecs import DeviceInfo, InterfaceSpec, Probe, hookimpl

__version__ = "0.1.0"
NAME = "PCI"
ACK = "PLUGRT_AMD_ALLOW_UNBIND"
WOULD = ("opening would unbind the GPU from its kernel driver (amdgpu) and bring up its firmware from user space, "
         "taking it from every other program")
NOT_YET = ("the driverless PCI bring-up is not implemented yet: no BAR mapping, PSP/SMU firmware loading, "
           "GART/VM set-up or MEC queue programming is written")
HINT = "use the KFD interface (AMD_IFACE=KFD) with the amdgpu driver loaded"


def probe(ctx: PluginContext) -> Probe:
  from plugrt_amd import pci_gpus
  if not (gpus := pci_gpus()):
    return Probe.missing(Reason.NO_DEVICE, "no AMD GPU on PCI: sysfs shows no vendor 0x1002 function of class display (0x03) "
                         "or processing accelerator (0x12)", "run on a machine with an AMD GPU")
  found = ", ".join(f"{a} (device 0x{d:04x}, driver {drv or 'none'})" for a, d, _, drv in gpus)
  # found: the hardware is there (the probe says what opening would do); opening itself refuses (acknowledgement, then not implemented)
  return Probe.found(len(gpus), f"found {found}; {WOULD} (needs {ACK}=1); {NOT_YET}", gpus=" ".join(a for a, *_ in gpus))


@hookimpl
def plugrt_interfaces() -> list[InterfaceSpec]:
  return [InterfaceSpec(device="AMD", name=NAME, probe=probe, auto=False, priority=0,
                        description="driverless: would unbind the GPU from amdgpu (not implemented; never automatic; "
                                    f"needs {ACK}=1)")]


@hookimpl
def plugrt_open_interface(device: DeviceInfo, interface: str) -> Any:
  from plugrt_amd.device import AcknowledgementRequired, AMDNotImplemented
  if not device.context.flag(ACK):
    raise AcknowledgementRequired(f"{device.canonical} through PCI: {WOULD}, and {ACK}=1 is not set",
                                  f"set {ACK}=1 only on a machine where nothing else uses the GPU; or {HINT}")
  raise AMDNotImplemented(f"{device.canonical} through PCI: {NOT_YET}", HINT)
