"""Opening AMD: every interface returns a `plugrt_amd.iface.GPUInterface` (plugrt-amd-kfd's KFDGPU; plugrt-amd-pci's
PCIGPU and plugrt-amd-usb's USBGPU once the driverless bring-up reached the MEC queue, guarded by an acknowledgement),
and the device state, allocator and programs on it are plugrt_amd.runtime's, the same for all. PCI and USB raise
AMDNotImplemented where bring-up stops, and an interface that returns anything else is refused here with a typed
reason. Nothing has run on AMD hardware (docs/backends/amd.md). The compilers need no device.
"""
from __future__ import annotations

from typing import Any, NoReturn

from plugrt.errors import UnsupportedError
from plugrt.hookspecs import DeviceInfo

NOT_YET = ("AMD dispatches through an interface that opens the GPU as a plugrt_amd.iface.GPUInterface (KFD, or the PCI or USB "
           "interface once bring-up reached its MEC queue): this interface gave the device no such object")
HINT = "compile for AMD without a device (plugrt_amd.compiler_for), or use another device"


class AMDNotImplemented(UnsupportedError):
  """A part of the AMD backend that is not written yet; the message says which."""


class AcknowledgementRequired(UnsupportedError):
  """An interface that takes the GPU (or its bridge) from its kernel driver was asked for without PLUGRT_AMD_ALLOW_UNBIND=1."""


def refuse(device: DeviceInfo) -> NoReturn:
  raise AMDNotImplemented(f"{device.canonical}: {NOT_YET}", HINT)


def open_device(device: DeviceInfo) -> Any:
  from plugrt_amd.iface import GPUInterface
  from plugrt_amd.runtime import AMDState
  iface = device.iface_object
  if not isinstance(iface, GPUInterface): refuse(device)
  try: return AMDState(device)
  except BaseException:
    iface.close()                                      # the GPU goes back to its driver
    raise


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
