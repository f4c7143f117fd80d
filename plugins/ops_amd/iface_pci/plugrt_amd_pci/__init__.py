"""plugrt-amd-pci: the PCI interface of the AMD device: an AMD GPU with no kernel driver, through sysfs.

What is implemented (docs/backends/amd.md): the function is taken through sysfs (the amdgpu driver unbound only with
PLUGRT_AMD_ALLOW_UNBIND=1, and bound back when the interface closes; the function enabled), the register BAR (BAR5),
the VRAM BAR (BAR0) and the doorbell BAR (BAR2) mapped from their `resourceN` files, then the driverless bring-up
(plugrt_amd_pci.bringup: IP discovery, firmware files, PSP boot and IP firmware loads for MP0 13.0.x/14.0.x, the SMU's
first messages, RLC autoload, RS64 CP, HDP flush, both hubs' GART, and on GC 11.0.0/11.0.2 with MMHUB 3.0.0 and
NBIO 4.3, or GC 12.0.0/12.0.1 with MMHUB 4.1.0 and NBIF 6.3.1, VMID 8's page tables and an AQL queue on the MEC).
When bring-up reaches that queue, `open_pci` returns the held GPU (`plugrt_amd_pci.gpu.PCIGPU`, a DriverlessGPU) and
plugrt-amd's device runs on it (VRAM allocations, CPU copies through the VRAM BAR, AQL dispatches); anywhere short of it, the
function is released and the open ends in `AMDNotImplemented` (or a typed PSP/SMU error) saying what was done and
where it stopped. **Kernels have run through this interface only against the fake GPUs (plugins/ops_amd/tests), never
on hardware**; what needs DMA (host memory,
from_blob, SDMA) is refused. Never chosen automatically (`AMD_IFACE=PCI` or `DEV=PCI+AMD`). The probe reads sysfs
only. Entry module: standard library and plugrt only.
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
         "both memory hubs' GART, and on RDNA3 (GC 11.0.0/11.0.2) or RDNA4 (GC 12.0.0/12.0.1) writes page tables for VMID 8, "
         "loads an AQL queue into the MEC and keeps the GPU for the device: VRAM buffers, CPU copies through the VRAM BAR, kernels on that queue")
NOT_YET = ("kernels have run through PCI only against the fake GPU, never on hardware; no DMA: host memory (from_blob), SDMA "
           "copies and VRAM beyond a small VRAM BAR (host access) are refused; interrupts are not implemented; scratch and GPU "
           "timestamps are checked against the fake only")
HINT = "use the KFD interface (AMD_IFACE=KFD) with the amdgpu driver loaded"


def probe(ctx: PluginContext) -> Probe:
  from plugrt_amd import pci_gpus
  if not (gpus := pci_gpus()):
    return Probe.missing(Reason.NO_DEVICE, "no AMD GPU on PCI: sysfs shows no vendor 0x1002 function of class display (0x03) "
                         f"or processing accelerator (0x12) (this interface brings an RDNA3 or RDNA4 GPU up to an AQL queue and runs kernels on it; "
                         f"{NOT_YET})",
                         "run on a machine with an AMD GPU")
  found = ", ".join(f"{a} (device 0x{d:04x}, driver {drv or 'none'})" for a, d, _, drv in gpus)
  return Probe.found(len(gpus), f"found {found}; {WOULD} (needs {ACK}=1); {NOT_YET}", gpus=" ".join(a for a, *_ in gpus))


@hookimpl
def plugrt_interfaces() -> list[InterfaceSpec]:
  return [InterfaceSpec(device="AMD", name=NAME, probe=probe, auto=False, priority=0,
                        description=f"driverless through sysfs: PSP boot, firmware loads, an AQL queue on RDNA3/RDNA4; kernels run "
                                    f"against the fake GPU only, never on hardware; no DMA (never automatic; needs {ACK}=1)")]


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
  if not device.context.acknowledged(ACK):
    bound = f"; {address} is bound to {driver}: without {ACK}=1 plugrt never unbinds it" if driver else ""
    cmd = f" (to unbind it yourself: echo {address} | sudo tee {root}/{address}/driver/unbind)" if driver else ""
    raise AcknowledgementRequired(f"{device.canonical} through PCI: {WOULD}, and {ACK}=1 is not set{bound}",
                                  f"set {ACK}=1 only on a machine where nothing else uses the GPU{cmd}; or {HINT}")
  fn = PCIFunction(address, root, drivers, write)
  mapbar = bars or PCIFunction.map_bar
  kept = False
  try:
    fn.take(allow_unbind=True, ack=ACK)
    from plugrt_amd_pci import bringup
    from plugrt_amd_pci.firmware import FIRMWARE_DIR
    from plugrt_amd_pci.regs import DOORBELL_BAR, REGISTER_BAR, VRAM_BAR, GPURegisters
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
    if b.queue_ready:
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
