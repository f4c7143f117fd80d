"""plugrt-amd-usb: the USB interface of the AMD device: a GPU behind an ASMedia ASM24xx USB3-to-PCIe bridge
(ASM2464PD-class enclosures), reached through the bridge's vendor commands.

Using one means claiming the USB device from its kernel driver (uas or usb-storage) and reaching the GPU's PCI
space through the bridge: never chosen automatically (`AMD_IFACE=USB` or `DEV=USB+AMD`), refused unless
PLUGRT_AMD_ALLOW_UNBIND=1 acknowledges it, and in this release refused then too: none of it is written. The probe
reads sysfs only (/sys/bus/usb/devices/*/idVendor, idProduct) and opens no USB device. Entry module: standard
library and plugrt only.
"""
from __future__ import annotations

import os
from typing import Any

from plugrt.context import PluginContext
from plugrt.errors import Reason
from plugrt.hookspecs import DeviceInfo, InterfaceSpec, Probe, hookimpl

__version__ = "0.1.0"
NAME = "USB"
ACK = "PLUGRT_AMD_ALLOW_UNBIND"
USB_DEVICES = "/sys/bus/usb/devices"
#: (vendor, product) -> what it is (docs/research/amd.md): ASMedia's ASM2464PD with its own firmware, and the IDs the
#: same chip shows with the custom firmware tinygrad's and comma's GPU enclosures flash
BRIDGES = {(0x174C, 0x2464): "ASMedia ASM2464PD", (0x174C, 0x2463): "ASMedia ASM2464PD",
           (0xADD1, 0x0001): "ASM2464PD with tinygrad/comma firmware", (0x3801, 0x0001): "ASM2464PD with tinygrad/comma firmware"}
WOULD = "opening would detach the bridge from its kernel driver (uas or usb-storage) and drive the GPU through its vendor commands"
NOT_YET = "the USB bridge interface is not implemented yet: no bridge command set, PCI config access or GPU bring-up is written"
HINT = "put the GPU in a PCIe slot and use the KFD interface (AMD_IFACE=KFD)"


def bridges(root: str = USB_DEVICES) -> list[tuple[str, int, int, str]]:
  """ASM24xx bridges on USB: (sysfs name, vendor, product, what), from sysfs (read only)."""
  try: names = sorted(os.listdir(root))
  except OSError: return []
  out = []
  for n in names:
    try:
      with open(os.path.join(root, n, "idVendor"), encoding="ascii") as f: vendor = int(f.read().strip(), 16)
      with open(os.path.join(root, n, "idProduct"), encoding="ascii") as f: product = int(f.read().strip(), 16)
    except (OSError, ValueError): continue
    if (vendor, product) in BRIDGES: out.append((n, vendor, product, BRIDGES[vendor, product]))
  return out


def probe(ctx: PluginContext) -> Probe:
  if not (found := bridges()):
    ids = ", ".join(f"{v:04x}:{p:04x}" for v, p in BRIDGES)
    return Probe.missing(Reason.NO_DEVICE, f"no ASM24xx USB-to-PCIe bridge on USB (looked for {ids} in {USB_DEVICES})",
                         "plug in an ASM2464PD enclosure holding the GPU, or use the KFD interface")
  listed = ", ".join(f"{n} ({v:04x}:{p:04x}, {what})" for n, v, p, what in found)
  return Probe.found(len(found), f"found {listed}; {WOULD} (needs {ACK}=1); {NOT_YET}", bridges=" ".join(n for n, *_ in found))


@hookimpl
def plugrt_interfaces() -> list[InterfaceSpec]:
  return [InterfaceSpec(device="AMD", name=NAME, probe=probe, auto=False, priority=0,
                        description=f"an ASM24xx USB3-to-PCIe bridge (not implemented; never automatic; needs {ACK}=1)")]


@hookimpl
def plugrt_open_interface(device: DeviceInfo, interface: str) -> Any:
  from plugrt_amd.device import AcknowledgementRequired, AMDNotImplemented
  if not device.context.flag(ACK):
    raise AcknowledgementRequired(f"{device.canonical} through USB: {WOULD}, and {ACK}=1 is not set",
                                  f"set {ACK}=1 to accept that; or {HINT}")
  raise AMDNotImplemented(f"{device.canonical} through USB: {NOT_YET}", HINT)
