"""plugrt-amd: AMD GPUs (device `AMD`), their compilers, and their hardware tables.

Compilers: LLVM (default, `AMD_LLVM=1`): plugrt IR -> LLVM IR for amdgcn-amd-amdhsa through llvmlite, linked by
ld.lld into an HSA code object v5; HIP (`AMD_HIP=1`): HIP C through ROCm's hiprtc. Both build for DEV's ARCH
(`DEV=AMD:LLVM:gfx942`), else the opened GPU's, else gfx1100, and both work without a GPU (tests build for
gfx90a, gfx942, gfx1100 and gfx1201 here). `plugrt_amd.codeobject` parses what they make into what a dispatcher needs.

The way to the GPU is an interface plugin: KFD (plugrt-amd-kfd, the amdgpu kernel driver's /dev/kfd), PCI
(plugrt-amd-pci, driverless) or USB (plugrt-amd-usb, through an ASM24xx USB3-to-PCIe bridge); PCI and USB are never
chosen automatically. Each opens the GPU as a `plugrt_amd.iface.GPUInterface`, and one device state, allocator and
program (plugrt_amd.runtime) run on it: through KFD, memory, SDMA copies and an AQL queue from user space, tested
against a fake KFD only; through PCI, on a GPU plugrt brought up itself (the bring-up is plugrt-amd-pci's, not this
package's), VRAM in its own VMID, CPU copies through the VRAM BAR and its own MEC queue, and through USB the same with
copies through the bridge's SRAM and a copy kernel, tested against fakes only: none of it has run on AMD hardware.
This entry module imports only the standard library and plugrt; the probe reads sysfs and /dev file names only.
"""
from __future__ import annotations

import os
from typing import Any

from plugrt.context import PluginContext
from plugrt.errors import Reason
from plugrt.hookspecs import BackendSpec, CompilerSpec, DeviceInfo, Probe, hookimpl
from plugrt.probing import has_module, install_hint

__version__ = "0.1.0"
#: first-party interfaces: (name, module, distribution)
INTERFACES = (("KFD", "plugrt_amd_kfd", "plugrt-amd-kfd"), ("PCI", "plugrt_amd_pci", "plugrt-amd-pci"),
              ("USB", "plugrt_amd_usb", "plugrt-amd-usb"))
DRIVER_HINT = "load the amdgpu kernel driver (modprobe amdgpu; /dev/kfd appears), or run on a machine with an AMD GPU"
KFD_TOPOLOGY = "/sys/devices/virtual/kfd/kfd/topology/nodes"
PCI_DEVICES = "/sys/bus/pci/devices"
AMD_PCI_VENDOR = 0x1002
#: PCI base classes of a GPU function: 0x03 display controller (Radeon), 0x12 processing accelerator (Instinct)
GPU_CLASSES = (0x03, 0x12)


def _read(path: str) -> str:
  try:
    with open(path, encoding="ascii", errors="replace") as f: return f.read()
  except OSError: return ""


def kfd_gpus(topology: str = KFD_TOPOLOGY) -> list[tuple[int, int]]:
  """The GPU nodes of KFD's topology: (node id, gfx_target_version), CPU nodes (version 0) left out."""
  try: names = os.listdir(topology)
  except OSError: return []
  out = []
  for n in sorted((n for n in names if n.isdigit()), key=int):
    props = dict(line.split(None, 1) for line in _read(os.path.join(topology, n, "properties")).splitlines() if " " in line)
    try: version = int(props.get("gfx_target_version", "0").strip())
    except ValueError: version = 0
    if version: out.append((int(n), version))
  return out


def pci_gpus(root: str = PCI_DEVICES) -> list[tuple[str, int, int, str]]:
  """AMD GPU functions on PCI: (address, device id, class, bound driver or ""), from sysfs (read only)."""
  try: names = sorted(os.listdir(root))
  except OSError: return []
  out = []
  for addr in names:
    d = os.path.join(root, addr)
    try: vendor, cls = int(_read(os.path.join(d, "vendor")).strip() or "0", 16), int(_read(os.path.join(d, "class")).strip() or "0", 16)
    except ValueError: continue
    if vendor != AMD_PCI_VENDOR or cls >> 16 not in GPU_CLASSES: continue
    try: dev = int(_read(os.path.join(d, "device")).strip() or "0", 16)
    except ValueError: dev = 0
    driver = os.path.basename(os.path.realpath(os.path.join(d, "driver"))) if os.path.exists(os.path.join(d, "driver")) else ""
    out.append((addr, dev, cls, driver))
  return out


def probe_amd(ctx: PluginContext) -> Probe:
  """AMD GPUs through KFD's topology, else on PCI; the interfaces say how (and whether) they can be reached."""
  if not any(has_module(m) for _, m, _ in INTERFACES):
    return Probe.missing(Reason.NOT_INSTALLED, "no AMD interface is installed", f"{install_hint('plugrt-amd-kfd')} (the kernel-driver interface)")
  if (gpus := kfd_gpus()):
    from plugrt_amd.hw import arch_from_target_version
    archs = ", ".join(sorted({arch_from_target_version(v) for _, v in gpus}))
    return Probe.found(len(gpus), f"{len(gpus)} GPU{'s' if len(gpus) != 1 else ''} in KFD's topology ({archs}); "
                       "never run on AMD hardware: the KFD path is tested against a fake KFD only", archs=archs)
  if (pci := pci_gpus()):
    return Probe.found(len(pci), f"{len(pci)} AMD GPU function{'s' if len(pci) != 1 else ''} on PCI ({', '.join(a for a, *_ in pci)}) "
                       "but no KFD node for them (the KFD interface needs amdgpu loaded; AMD_IFACE=PCI brings an RDNA3 GPU up without it, "
                       "run against the fake GPU only, never on hardware)", pci=" ".join(a for a, *_ in pci))
  return Probe.missing(Reason.NO_DEVICE, "no AMD GPU: /dev/kfd lists none and sysfs shows no AMD (0x1002) display or accelerator "
                       "function on PCI", DRIVER_HINT)


def probe_llvm(ctx: PluginContext) -> Probe:
  """llvmlite (with its AMDGPU target) and ld.lld, found by path."""
  from plugrt_amd.toolchain import LLD_HINT, llvm_tool
  if not has_module("llvmlite"): return Probe.missing(Reason.MISSING_TOOLCHAIN, "llvmlite is not installed", "pip install llvmlite")
  if (lld := llvm_tool(ctx, "ld.lld")) is None:
    return Probe.missing(Reason.MISSING_TOOLCHAIN, "ld.lld is not installed (AMD_LLVM links its code objects with it)", LLD_HINT)
  return Probe.found(1, f"llvmlite, {lld}")


def probe_hip(ctx: PluginContext) -> Probe:
  """ROCm's hiprtc, found by path."""
  from plugrt_amd.toolchain import HIP_HINT, comgr_path, hiprtc_path
  if (p := hiprtc_path(ctx)) is not None: return Probe.found(1, p)
  also = " (libamd_comgr.so is there, but plugrt compiles HIP through hiprtc)" if comgr_path(ctx) else ""
  return Probe.missing(Reason.MISSING_TOOLCHAIN, f"ROCm's hiprtc (libhiprtc.so) is not installed{also}", HIP_HINT)


@hookimpl
def plugrt_backends() -> list[BackendSpec]:
  # below NV (45) and CUDA (50); a machine with an AMD GPU has neither
  return [BackendSpec(name="AMD", api_version="1.2", probe=probe_amd, priority=40,
                      compilers=(CompilerSpec("LLVM", "LLVM IR through LLVM's AMDGPU target (llvmlite), ld.lld to a code object v5", probe_llvm),
                                 CompilerSpec("HIP", "HIP C through ROCm's hiprtc", probe_hip)),
                      description="AMD GPUs from user space through KFD (AQL dispatch, SDMA copies), or driverless through PCI (AQL dispatch, "
                                  "CPU copies through the VRAM BAR); neither has run on AMD hardware")]


@hookimpl
def plugrt_open_device(device: DeviceInfo) -> Any:
  from plugrt_amd.device import open_device
  return open_device(device)


@hookimpl
def plugrt_allocator(device: DeviceInfo) -> Any:
  from plugrt_amd.runtime import AMDAllocator
  return AMDAllocator(device)


@hookimpl
def plugrt_compiler(device: DeviceInfo, compiler: str) -> Any:
  from plugrt_amd.device import make_compiler
  return make_compiler(device, compiler)


@hookimpl
def plugrt_program(device: DeviceInfo) -> Any:
  from plugrt_amd.runtime import AMDProgram
  return AMDProgram


@hookimpl
def plugrt_graph(device: DeviceInfo) -> Any:
  from plugrt.hwqueue import HCQGraph  # a batch of launches replayed under the device's lock
  return HCQGraph


def compiler_for(arch: str = "", compiler: str = "LLVM", env: dict[str, str] | None = None) -> Any:
  """An AMD compiler (LLVM or HIP) for `arch` (default gfx1100) without a device; `env` is its environment (default: the process's)."""
  from plugrt_amd.device import compiler_for as make
  return make(arch, compiler, env)
