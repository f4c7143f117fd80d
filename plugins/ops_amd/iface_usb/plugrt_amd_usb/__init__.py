"""plugrt-amd-usb: the USB interface of the AMD device: a GPU behind an ASMedia ASM24xx USB3-to-PCIe bridge
(ASM2464PD-class enclosures), reached through the bridge's vendor SCSI commands.

What is implemented (docs/backends/amd.md): the bridge's command set (XDATA reads/writes, its PCIe TLP engine:
configuration and 32-bit memory requests, its SRAM window written by bulk SCSI WRITE(16)s) over a libusb Bulk-Only
transport found at run time; the walk from bus 0 through the PCI-to-PCI bridges to the GPU, its BARs sized and
placed; then the same bring-up as the PCI interface (VRAM size, IP discovery, NBIO pair, firmware check, HDP, the
MMHUB's GART, the PSP boot and its IP firmware loads, SMU, RLC, CP, GFXHUB, compute queue) over memory TLPs, with
every buffer the PSP reads handed over through the bridge's SRAM mapped in the GART (plugrt_amd_usb.staging). When
the bring-up reaches the MEC queue, `open_usb` keeps the bridge and returns `plugrt_amd_usb.gpu.USBGPU` (a
plugrt_amd_pci.driverless.DriverlessGPU), on which plugrt-amd's device runs (VRAM buffers in VMID 8, AQL dispatches
rung by doorbell TLPs) with host copies that fit a bridge (`SRAMPath`: bulk writes into the SRAM then a copy kernel,
reads through the SRAM's first 4 KiB, TLPs for small parts); short of it, the open ends in `AMDNotImplemented` saying
where it stopped. **Kernels have run
through USB only against the fake bridge and GPU, never on a bridge or hardware.** Never chosen automatically
(`AMD_IFACE=USB` or `DEV=USB+AMD`); refused unless PLUGRT_AMD_ALLOW_UNBIND=1 (the bridge is detached from
usb-storage/uas, and re-attached on close). The probe reads sysfs only (/sys/bus/usb/devices/*/idVendor, idProduct)
and opens no USB device. Entry module: standard library and plugrt only.
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
LIBUSB = "PLUGRT_LIBUSB"
FIRMWARE = "PLUGRT_AMD_FIRMWARE"
WOULD = ("opening detaches the bridge from its kernel driver (uas or usb-storage; re-attached on close), finds the GPU behind it "
         "through PCIe configuration requests, reads its IP discovery table, checks its firmware files and, with them, boots its PSP "
         "and loads the IP firmwares through the bridge's SRAM (writing GPU registers and VRAM)")
NOT_YET = ("kernels have run through USB only against the fake bridge and GPU, never on a bridge or hardware; host memory "
           "(from_blob), SDMA and interrupts are not implemented; scratch and GPU timestamps are checked against the fake only")
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
    return Probe.missing(Reason.NO_DEVICE, f"no ASM24xx USB-to-PCIe bridge on USB (looked for {ids} in {USB_DEVICES}; this interface "
                         f"implements the bridge's commands, its SRAM window and the bring-up; {NOT_YET})",
                         "plug in an ASM2464PD enclosure holding the GPU, or use the KFD interface")
  listed = ", ".join(f"{n} ({v:04x}:{p:04x}, {what})" for n, v, p, what in found)
  return Probe.found(len(found), f"found {listed}; {WOULD} (needs {ACK}=1); {NOT_YET}", bridges=" ".join(n for n, *_ in found))


@hookimpl
def plugrt_interfaces() -> list[InterfaceSpec]:
  return [InterfaceSpec(device="AMD", name=NAME, probe=probe, auto=False, priority=0,
                        description=f"an ASM24xx USB3-to-PCIe bridge: bring-up through the PSP, an AQL queue, copies through the bridge's SRAM; "
                                    f"kernels run against the fake bridge only, never on hardware (never automatic; needs {ACK}=1)")]


def open_usb(device: DeviceInfo, transport: Any = None, root: str = USB_DEVICES, psp_timeout: float = 2.0) -> Any:
  """Find the device's bridge, reach the GPU behind it and run the bring-up. When it reaches the MEC queue, return the
  kept GPU (`plugrt_amd_usb.gpu.USBGPU`; its `close()` closes the transport plugrt opened); otherwise raise where it
  stopped (the transport closed).

  `transport` is the SCSI seam (plugrt_amd_usb.asm24.Transport; tests pass a fake bridge, which stays the caller's);
  by default libusb."""
  from plugrt.errors import DeviceUnavailable
  from plugrt_amd.device import AcknowledgementRequired
  if not device.context.acknowledged(ACK):
    raise AcknowledgementRequired(f"{device.canonical} through USB: {WOULD}, and {ACK}=1 is not set", f"set {ACK}=1 to accept that; or {HINT}")
  own = transport is None
  if own:
    found = bridges(root)
    if device.index >= len(found):
      raise DeviceUnavailable(f"{device.canonical} through USB: {len(found)} ASM24xx bridge(s) on USB", Reason.NO_DEVICE,
                              "plug in an ASM2464PD enclosure holding the GPU, or use the KFD interface")
    _, vendor, product, _ = found[device.index]
    from plugrt_amd_usb.libusb import LibUSBTransport, load
    transport = LibUSBTransport(vendor, product, allow_detach=True, lib=load(device.context.get(LIBUSB)))
  kept = False
  try:
    from plugrt_amd_pci import bringup
    from plugrt_amd_pci.firmware import FIRMWARE_DIR
    from plugrt_amd_pci.regs import DOORBELL_BAR, REGISTER_BAR, VRAM_BAR, GPURegisters
    from plugrt_amd_usb.asm24 import ASM24Bridge, BridgeMMIO, find_gpu
    from plugrt_amd_usb.staging import SRAMStaging
    bridge = ASM24Bridge(transport)
    bridge.init()
    gpu = find_gpu(bridge)
    if REGISTER_BAR not in gpu.bars:
      raise DeviceUnavailable(f"{device.canonical} through USB: the GPU at bus {gpu.bus} has no BAR{REGISTER_BAR}", Reason.NO_DEVICE)
    mmio = BridgeMMIO(bridge, *gpu.bars[REGISTER_BAR])
    vram = BridgeMMIO(bridge, *gpu.bars[VRAM_BAR]) if VRAM_BAR in gpu.bars else None
    bell = BridgeMMIO(bridge, *gpu.bars[DOORBELL_BAR]) if DOORBELL_BAR in gpu.bars else None   # doorbells: posted TLPs too
    label = f"{device.name}:{device.index} through USB"
    regs = GPURegisters(mmio, vram, bell)
    b = bringup.bring_up(regs, label, device.context.get(FIRMWARE, FIRMWARE_DIR), psp_timeout=psp_timeout, staging=SRAMStaging(bridge))
    bars = ", ".join(f"BAR{i} at 0x{a:x} ({s >> 10} KiB)" for i, (a, s) in sorted(gpu.bars.items()))
    b.steps.insert(0, f"GPU 0x{gpu.vendor:04x}:0x{gpu.device:04x} at bus {gpu.bus} behind {len(gpu.bridges)} bridge port(s); {bars}")
    if b.queue_ready:
      from plugrt_amd_usb.gpu import USBGPU
      kept = True
      return USBGPU(label, bridge, regs, b, vram.size if vram else 0, transport.close if own else None)
  finally:
    if own and not kept: transport.close()
  b.stop()


@hookimpl
def plugrt_open_interface(device: DeviceInfo, interface: str) -> Any:
  return open_usb(device)
