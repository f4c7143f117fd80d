"""Opening AMD: through the KFD interface (plugrt-amd-kfd returns its KFDDevice) the device state, allocator and
programs are plugrt_amd.runtime's; through PCI or USB (guarded by an acknowledgement), once the driverless bring-up
(plugrt_amd.bringup) reached the MEC queue, plugrt_amd.pcirt's (the interface returns its held GPU, USB's with its own
host copy path); PCI and USB raise AMDNotImplemented where bring-up stops, and an interface that returns anything else
is refused here with a typed reason. Nothing has run on AMD hardware (docs/backends/amd.md). The compilers need no
device.
"""
from __future__ import annotations

from typing import Any, NoReturn

from plugrt.errors import UnsupportedError
from plugrt.hookspecs import DeviceInfo

NOT_YET = ("AMD dispatches through the KFD interface (plugrt-amd-kfd), or on a GPU the PCI or USB interface brought up to its MEC "
           "queue: this interface gave the device neither a KFD queue layer "
           "(memory, AQL queues, doorbells, signals) nor a brought-up GPU")
HINT = "compile for AMD without a device (plugrt_amd.compiler_for), or use another device"


class AMDNotImplemented(UnsupportedError):
  """A part of the AMD backend that is not written yet; the message says which."""


class AcknowledgementRequired(UnsupportedError):
  """An interface that takes the GPU (or its bridge) from its kernel driver was asked for without PLUGRT_AMD_ALLOW_UNBIND=1."""


def refuse(device: DeviceInfo) -> NoReturn:
  raise AMDNotImplemented(f"{device.canonical}: {NOT_YET}", HINT)


def open_device(device: DeviceInfo) -> Any:
  iface = device.iface_object
  if hasattr(iface, "compute_queue"):
    from plugrt_amd.runtime import AMDState
    return AMDState(device)
  if getattr(iface, "bringup", None) is not None:     # the PCI or USB interface's GPU, brought up to its MEC queue
    from plugrt_amd.pcirt import PCIState
    try: return PCIState(device)
    except BaseException:
      iface.close()                                    # the GPU goes back to its driver
      raise
  refuse(device)


def make_compiler(device: DeviceInfo, name: str) -> Any:
  if name == "HIP":
    from plugrt_amd.hip import HIPCompiler
    return HIPCompiler(device)
  from plugrt_amd.llvm import AMDLLVMCompiler
  return AMDLLVMCompiler(device)


def compiler_for(arch: str = "", compiler: str = "LLVM", env: dict[str, str] | None = None) -> Any:
  """An AMD compiler for `arch` (default gfx1100) with no device: what the tests and offline builds use."""
  from plugrt.context import PluginContext
  ctx = PluginContext.from_process() if env is None else PluginContext(env)
  return make_compiler(DeviceInfo("AMD", 0, compiler, None, arch, context=ctx), compiler)
