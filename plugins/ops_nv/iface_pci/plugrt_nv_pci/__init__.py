"""plugrt-nv-pci: the PCI interface of the NV device, which drives an NVIDIA GPU with no kernel driver, through sysfs.

What is built (docs/backends/nv.md, "The PCI interface"; every constant's source in docs/research/nv-pci.md): a probe
that lists NVIDIA display functions in sysfs, names each one's generation from its device id (Ampere GA10x, Ada AD10x,
Blackwell GB20x; Hopper and others are listed and refused) and says what opening would do; on open, after
PLUGRT_NV_ALLOW_UNBIND=1, the function taken from its driver, BAR0 and BAR1 mapped from their resource files, and the
GSP boot by the generation's table entry (plugrt_nv_pci.bringup). GA10x/AD10x (plugrt_nv_pci.boot): the chip from
NV_PMC_BOOT_42, the VBIOS's boot awaited, WPR2 checked down, the VRAM sized, the 570.144 GSP firmware files read from
linux-firmware (MissingFirmware names a missing one and its Debian package), the GSP's arguments laid out in host
memory, FWSEC-FRTS from the VBIOS on the GSP's falcon, booter_load on SEC2 with GSP_SET_SYSTEM_INFO and SET_REGISTRY
queued for GSP-RM's init, its CPU-sequencer requests and GSP_INIT_DONE, BAR1 back in physical mode. GB20x
(plugrt_nv_pci.boot_fsp, fsp): the FSP's boot awaited, the GSP FMC file read, the same arguments with a WPR size
request, the chain-of-trust message to the FSP over its EMEM and its response, the FMC's release of the GSP, then
GSP-RM's init as above. Then (plugrt_nv_pci.gpu) GSP-RM's golden GR context on an internal client, and for the NV
device the RM client, device, subdevice, a VA space whose GPU page tables plugrt writes in VRAM (handed over with
SET_PAGE_DIRECTORY; GPU-MMU version 2, or 3 on GB20x), a channel group with a compute and a copy channel (their
instance blocks, RAMFC, method buffers and USERD in VRAM plugrt supplies), the compute object's context buffers promoted, the doorbell in BAR0, and
memory as VRAM (mapped for the CPU through BAR1) or host pages. Host memory the GPU reads by DMA takes one of two
paths (plugrt_nv_pci.vfio.dma_path; PLUGRT_NV_PCI_DMA=vfio|pagemap, else sysfs decides, and the probe says which):
physical addresses from /proc/self/pagemap where no IOMMU translates (dma.PagemapDMA), or VFIO (vfio.VFIODMA: the
function bound to vfio-pci, its buffers mapped with VFIO_IOMMU_MAP_DMA at IOVAs, the BARs through the device fd);
neither is NoDMAPath naming both. plugrt-nv's device, allocator, programs and queues run unchanged on it. Not built:
Hopper (refused), VFIO's interrupts, video channels, peer mappings. On every failure and on close GSP-RM is
unloaded, the function reset (once the boot changed the GPU), re-disabled and bound back to its driver.
**Never run on hardware: tested against the fake GPUs of plugins/ops_nv/tests/fake_nvpci.py (GA102, AD102) and
fake_nvpci_gb.py (GB202), and VFIO against the fake kernel of fake_vfio.py, only.**

Never chosen automatically (`NV_IFACE=PCI` or `DEV=PCI+NV`). The probe reads sysfs only. Entry module: standard
library and plugrt only.
"""
from __future__ import annotations

from typing import Any

from plugrt.context import PluginContext
from plugrt.errors import Reason
from plugrt.hookspecs import DeviceInfo, InterfaceSpec, Probe, hookimpl

__version__ = "0.1.0"
NAME = "PCI"
ACK = "PLUGRT_NV_ALLOW_UNBIND"
FIRMWARE = "PLUGRT_NV_FIRMWARE"
TIMEOUT = "PLUGRT_NV_BOOT_TIMEOUT"
DMA = "PLUGRT_NV_PCI_DMA"
WOULD = ("opening unbinds the GPU from its driver (binding it to vfio-pci when host memory goes through VFIO), turns on bus mastering, "
         "maps BAR0 and BAR1 (through sysfs, or VFIO), boots GSP-RM from the "
         "linux-firmware files (Ampere and Ada: FWSEC-FRTS from the VBIOS and booter_load on SEC2; Blackwell: the chain-of-trust message "
         "to the FSP, which boots the GSP FMC; then the GSP's message queues), makes the RM objects over RPC "
         "(GR's golden context, a VA space with plugrt's page tables, a compute and a copy channel) and runs NV's command stream on them; "
         "closing unloads GSP-RM, resets the function and binds the driver back")
NOT_YET = ("never run on hardware: tested end to end against fake GPUs only (Ampere GA10x, Ada AD10x and Blackwell GB20x, whose FSP "
           "boot has never met a real FSP; host memory through VFIO only against a fake kernel)")
HINT = "use the NVK interface (NV_IFACE=NVK, the default) with the NVIDIA kernel driver"


def _describe(c: Any, root: str = "", asked: str | None = None) -> str:
  """A candidate in words; with `root` (the sysfs devices folder) and `asked` (PLUGRT_NV_PCI_DMA's value), also the
  host-memory path opening a GPU it boots would take."""
  import os

  from plugrt_nv_pci.chips import generation_of_device
  g = generation_of_device(c.device)
  what = f"{g.name} {g.chips}" if g else "a generation plugrt-nv-pci does not know"
  shared = f"; bound to {c.driver}: opening takes it from every program that uses it" if c.driver and c.driver != "vfio-pci" else ""
  verdict = "" if g and g.supported else f": not opened ({g.why_not if g else 'not in the seeds PCI list (Ampere, Ada, Blackwell)'})"
  if g and g.supported and asked is not None:
    from plugrt_nv_pci.vfio import describe_path
    shared += "; " + describe_path(os.path.join(root, c.address), os.path.join(os.path.dirname(root), "drivers"), asked)
  return f"{c.address} (device 0x{c.device:04x}, {what}, driver {c.driver or 'none'}{shared}){verdict}"


def probe(ctx: PluginContext) -> Probe:
  from plugrt_nv_pci.sysfs import PCI_DEVICES
  return probe_tree(PCI_DEVICES, ctx)


def probe_tree(root: str, ctx: PluginContext | None = None) -> Probe:
  """The probe on the sysfs tree at `root` (its drivers beside it): reads file contents and links only."""
  from plugrt.errors import EnvError
  from plugrt_nv_pci.sysfs import nvidia_gpus
  try: asked = _dma_asked(ctx or PluginContext({}))
  except EnvError as e: return Probe.missing(Reason.DISABLED, e.message, e.hint)
  gpus = nvidia_gpus(root)
  if not gpus:
    return Probe.missing(Reason.NO_DEVICE, f"no NVIDIA GPU on PCI: sysfs shows no vendor 0x10de display function ({NOT_YET})",
                         "run on a machine with an NVIDIA GPU")
  listed = "; ".join(_describe(c, root, asked) for c in gpus)
  from plugrt_nv_pci.chips import generation_of_device
  usable = [c for c in gpus if (g := generation_of_device(c.device)) and g.supported]
  if not usable:
    return Probe.missing(Reason.NO_DEVICE, f"found {listed}; none is a GPU this interface boots ({NOT_YET})", HINT)
  return Probe.found(len(usable), f"found {listed}; {WOULD} (needs {ACK}=1); {NOT_YET}", gpus=" ".join(c.address for c in usable))


def _dma_asked(ctx: PluginContext) -> str:
  """PLUGRT_NV_PCI_DMA: "vfio", "pagemap", or "" (unset: chosen from sysfs); EnvError for anything else."""
  return ctx.choice(DMA, ("vfio", "pagemap"), "")


@hookimpl
def plugrt_interfaces() -> list[InterfaceSpec]:
  return [InterfaceSpec(device="NV", name=NAME, probe=probe, auto=False, priority=0,
                        description=f"driverless through sysfs: GSP-RM boot and channels on GA10x/AD10x/GB20x against fake GPUs only, never run "
                                    f"on hardware (never automatic; needs {ACK}=1)")]


def open_pci(device: DeviceInfo, root: str = "", drivers: str = "", write: Any = None, bars: Any = None, dma: Any = None,
             vfio: Any = None) -> Any:
  """Take the NV device's GPU function, boot GSP-RM and make the RM objects: a PCIInterface (plugrt_nv_pci.gpu), whose
  close() unloads GSP-RM, resets the function and gives it back. `root`/`drivers`/`write` are the sysfs seam (tests
  pass a fake tree), `bars(function, index)` maps a BAR (default: its resource file, or its VFIO region), `dma(function)`
  makes the pagemap path's host-memory allocator (default: dma.PagemapDMA), `vfio` is the VFIO path's kernel (default:
  vfio.Syscalls); vfio.dma_path picks the path (PLUGRT_NV_PCI_DMA, else sysfs). DeviceUnavailable for a GPU this
  interface does not open (or cannot map; NoDMAPath and VFIOError for host memory), AcknowledgementRequired without
  PLUGRT_NV_ALLOW_UNBIND=1, MissingFirmware/FirmwareError for the files, GSPError (RPCError, MalformedRPC) for what the
  GPU, its FSP or GSP-RM answers. On any failure the function is reset (once the boot changed the GPU), re-disabled and
  bound back before the error is raised."""
  import os

  from plugrt.errors import DeviceUnavailable
  from plugrt_nv_pci import boot, bringup, rpc
  from plugrt_nv_pci.chips import generation_of_device
  from plugrt_nv_pci.dma import PagemapDMA
  from plugrt_nv_pci.errors import AcknowledgementRequired
  from plugrt_nv_pci.firmware import FIRMWARE_ROOT
  from plugrt_nv_pci.gpu import PCIInterface
  from plugrt_nv_pci.sysfs import PCI_DEVICES, PCI_DRIVERS, REGISTER_BAR, VRAM_BAR, PCIFunction, nvidia_gpus
  from plugrt_nv_pci.vfio import VFIODMA, VFIOFunction, dma_path
  root, drivers = root or PCI_DEVICES, drivers or PCI_DRIVERS
  gpus = nvidia_gpus(root)
  if device.index >= len(gpus):
    raise DeviceUnavailable(f"{device.canonical} through PCI: {len(gpus)} NVIDIA GPU function(s) on PCI", Reason.NO_DEVICE,
                            "DEV=PCI+NV:<index> with an index below that" if gpus else "run on a machine with an NVIDIA GPU")
  c = gpus[device.index]
  gen = generation_of_device(c.device)
  if gen is None or not gen.supported:
    raise DeviceUnavailable(f"{device.canonical} through PCI: {_describe(c)}", Reason.NO_DEVICE, HINT)
  ctx = device.context
  if not ctx.acknowledged(ACK):
    bound = f"; {c.address} is bound to {c.driver}: without {ACK}=1 plugrt never unbinds it" if c.driver else ""
    raise AcknowledgementRequired(f"{device.canonical} through PCI: {WOULD}, and {ACK}=1 is not set{bound}",
                                  f"set {ACK}=1 only on a machine where nothing else uses the GPU; or {HINT}")
  timeout = ctx.number(TIMEOUT, 5.0, lo=0.001, unit="seconds")
  path, _ = dma_path(os.path.join(root, c.address), drivers, _dma_asked(ctx))
  fn = (VFIOFunction if path == "vfio" else PCIFunction)(c.address, root, drivers, write)
  label = f"{device.canonical} through PCI ({c.address})"
  allocator = booted = None
  try:
    fn.take()
    if isinstance(fn, VFIOFunction):  # the device fd first: vfio-pci's open resets the function, bus mastering included
      allocator = fn.vfio = VFIODMA(fn.dir, vfio)
      fn.bus_master()
      bars = bars or allocator.map_bar
    else:
      fn.bus_master()
      allocator = (dma or PagemapDMA)(fn.dir)
    regs = (bars or PCIFunction.map_bar)(fn, REGISTER_BAR)
    vram = (bars or PCIFunction.map_bar)(fn, VRAM_BAR)
    booted = bringup.bring_up(regs, vram.write, allocator, ctx.get(FIRMWARE) or FIRMWARE_ROOT, label, timeout, rpc.system_info_of(fn),
                           started=lambda: setattr(fn, "reset_on_release", True))
    return PCIInterface(fn, regs, vram, allocator, booted, label)
  except Exception as e:
    undone = [boot.unload(booted.queues) or "GSP-RM unloaded"] if booted is not None else []
    if allocator is not None and not isinstance(fn, VFIOFunction): allocator.close()  # (VFIOFunction.release closes VFIO in its place)
    done = undone + fn.release()
    if done and hasattr(e, "message"):
      e.args = (f"{e.args[0]} [released: {', '.join(done)}]", *e.args[1:])
    raise


@hookimpl
def plugrt_open_interface(device: DeviceInfo, interface: str) -> Any:
  return open_pci(device)
