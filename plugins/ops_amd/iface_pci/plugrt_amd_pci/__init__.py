"""plugrt-amd-pci: the PCI interface of the AMD device: an AMD GPU with no kernel driver, through sysfs.

What is implemented (docs/backends/amd.md): the function is taken through sysfs (the amdgpu driver unbound only with
PLUGRT_AMD_ALLOW_UNBIND=1, and bound back when the interface closes; the function enabled), the register BAR (BAR5)
and the VRAM BAR (BAR0) mapped from their `resourceN` files, VRAM size read, the IP discovery table read from the top
of VRAM (or through MM_INDEX/MM_DATA when VRAM is not CPU-visible) and validated, the NBIO index/data pair set up, the
firmware the IP versions call for looked up in /lib/firmware/amdgpu, and, for MP0 13.0.0/13.0.7/13.0.10/14.0.2/14.0.3
with its sOS file present, the PSP booted (bootloader components and sOS, KM ring, LOAD_TOC and SETUP_TMR; see
plugrt_amd.psp); with every IP firmware file present, the SMU, SDMA, GC CP/IMU/RLC ucodes loaded through the PSP
(LOAD_IP_FW in the kernel's order, then AUTOLOAD_RLC; plugrt_amd.psp_load) and the SMU's first messages
(plugrt_amd.smu), the RLC autoload's completion and the RS64 CP set-up (plugrt_amd.gfx), the HDP flush
(plugrt_amd.hdp) and the MMHUB 3.0.0 / GC 11 GFXHUB GART and system aperture (plugrt_amd.gmc). What is not: VM
contexts and page tables, interrupts, MES, MEC queues; so opening always
ends in `AMDNotImplemented` saying what was done and where it stopped (or in a typed PSP/SMU error), after
releasing the function. Never chosen automatically (`AMD_IFACE=PCI` or `DEV=PCI+AMD`). The probe
reads sysfs only. Entry module: standard library and plugrt only.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from plugrt.context import PluginContext
from plugrt.errors import Reason
from plugrt.hookspecs import DeviceInfo, InterfaceSpec, Probe, hookimpl

__version__ = "0.1.0"
NAME = "PCI"
ACK = "PLUGRT_AMD_ALLOW_UNBIND"
FIRMWARE = "PLUGRT_AMD_FIRMWARE"
WOULD = ("opening unbinds the GPU from amdgpu (binding it back on close), maps its BARs through sysfs, reads its IP discovery "
         "table, checks its firmware files, boots its PSP (MP0 13.0.x/14.0.x with the sOS file present), loads the SMU, SDMA "
         "and GC firmware through it, sends the SMU its first messages, waits for the RLC autoload, sets up the CP and programs "
         "both memory hubs' GART, and on RDNA3 writes page tables for VMID 8 and loads an AQL queue into the MEC")
NOT_YET = ("a plugrt device on that queue (memory API, host copies, the launch path) and interrupts are not implemented, "
           "so AMD cannot run kernels through PCI yet")
HINT = "use the KFD interface (AMD_IFACE=KFD) with the amdgpu driver loaded"


def probe(ctx: PluginContext) -> Probe:
  from plugrt_amd import pci_gpus
  if not (gpus := pci_gpus()):
    return Probe.missing(Reason.NO_DEVICE, "no AMD GPU on PCI: sysfs shows no vendor 0x1002 function of class display (0x03) "
                         f"or processing accelerator (0x12) (this interface implements bring-up up to the PSP's firmware loads and the "
                         f"SMU's first messages; {NOT_YET})",
                         "run on a machine with an AMD GPU")
  found = ", ".join(f"{a} (device 0x{d:04x}, driver {drv or 'none'})" for a, d, _, drv in gpus)
  return Probe.found(len(gpus), f"found {found}; {WOULD} (needs {ACK}=1); {NOT_YET}", gpus=" ".join(a for a, *_ in gpus))


@hookimpl
def plugrt_interfaces() -> list[InterfaceSpec]:
  return [InterfaceSpec(device="AMD", name=NAME, probe=probe, auto=False, priority=0,
                        description=f"driverless through sysfs: IP discovery, PSP boot, firmware loads, no kernels (never automatic; needs {ACK}=1)")]


def open_pci(device: DeviceInfo, root: str = "", drivers: str = "", write: Any = None, psp_timeout: float = 2.0,
             bars: Callable[[Any, int], Any] | None = None) -> Any:
  """Take the device's GPU function and run the implemented bring-up. When it reaches the MEC's AQL queue, the GPU
  stays taken and the returned `plugrt_amd_pci.gpu.PCIGPU` gives it back on `close()`; otherwise the function is
  released and the error says where bring-up stopped.

  `root`/`drivers`/`write` are the sysfs seam (tests pass a fake tree); `bars(function, index)` maps a BAR (default
  `PCIFunction.map_bar`; the fake GPU's session passes its fake register, VRAM and doorbell windows); `psp_timeout`
  bounds each PSP wait. AcknowledgementRequired without ACK=1; DeviceUnavailable when the function cannot be taken
  or mapped; DiscoveryError/RegisterError for what the GPU answers; PSPError/PSPFirmwareError (UcodeError,
  IPFirmwareRefused) from the PSP stage; SMUError from the SMU's first messages; AMDNotImplemented where bring-up
  stops before a queue."""
  from plugrt.errors import DeviceUnavailable
  from plugrt_amd import pci_gpus
  from plugrt_amd.device import AcknowledgementRequired
  from plugrt_amd_pci.sysfs import PCI_DEVICES, PCI_DRIVERS, PCIFunction
  root, drivers = root or PCI_DEVICES, drivers or PCI_DRIVERS
  gpus = pci_gpus(root)
  if device.index >= len(gpus):
    raise DeviceUnavailable(f"{device.canonical} through PCI: {len(gpus)} AMD GPU function(s) on PCI", Reason.NO_DEVICE,
                            "DEV=PCI+AMD:<index> with an index below that" if gpus else "run on a machine with an AMD GPU")
  address, _, _, driver = gpus[device.index]
  if not device.context.flag(ACK):
    bound = f"; {address} is bound to {driver}: without {ACK}=1 plugrt never unbinds it" if driver else ""
    cmd = f" (to unbind it yourself: echo {address} | sudo tee {root}/{address}/driver/unbind)" if driver else ""
    raise AcknowledgementRequired(f"{device.canonical} through PCI: {WOULD}, and {ACK}=1 is not set{bound}",
                                  f"set {ACK}=1 only on a machine where nothing else uses the GPU{cmd}; or {HINT}")
  fn = PCIFunction(address, root, drivers, write)
  mapbar = bars or PCIFunction.map_bar
  kept = False
  try:
    fn.take(allow_unbind=True, ack=ACK)
    from plugrt_amd import bringup
    from plugrt_amd.firmware import FIRMWARE_DIR
    from plugrt_amd.regs import DOORBELL_BAR, REGISTER_BAR, VRAM_BAR, GPURegisters
    regs_bar = mapbar(fn, REGISTER_BAR)
    try: vram = mapbar(fn, VRAM_BAR)
    except DeviceUnavailable: vram = None
    try: bell = mapbar(fn, DOORBELL_BAR)
    except DeviceUnavailable: bell = None
    took = f"unbound {fn.unbound_driver}, " if fn.unbound_driver else ""
    step = f"{address}: {took}BAR{REGISTER_BAR} mapped ({regs_bar.size >> 10} KiB)" + \
           (f", BAR{VRAM_BAR} ({vram.size >> 20} MiB)" if vram else f", BAR{VRAM_BAR} not mapped (VRAM through MM_INDEX/MM_DATA)")
    label = f"{device.name}:{device.index} through PCI"
    regs = GPURegisters(regs_bar, vram, bell)
    b = bringup.bring_up(regs, label, device.context.get(FIRMWARE, FIRMWARE_DIR), psp_timeout)
    b.steps.insert(0, step)
    if b.compute is not None and b.compute.queue is not None and b.smu_started:
      from plugrt_amd_pci.gpu import PCIGPU
      gpu = PCIGPU(label, address, regs, b, vram.size if vram else 0, fn.release)
      kept = True
      return gpu
  finally:
    done = [] if kept else fn.release()
  if done: b.steps.append("released (" + ", ".join(done) + ")")
  b.stop()


@hookimpl
def plugrt_open_interface(device: DeviceInfo, interface: str) -> Any:
  return open_pci(device)
