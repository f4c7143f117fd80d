"""What opening AMD does in this release: nothing reaches a GPU yet. The interfaces refuse when they open (KFD:
the queue layer is not written; PCI and USB: not implemented, and guarded by an acknowledgement), and should a
third-party interface open, the device refuses here with the same typed reason. The compilers need no device.
"""
from __future__ import annotations

from typing import Any, NoReturn

from plugrt.errors import UnsupportedError
from plugrt.hookspecs import DeviceInfo

NOT_YET = ("AMD dispatches nothing in this release: the KFD queue layer (memory, AQL queues, doorbells, signals) "
           "is the next step of issue 13")
HINT = "compile for AMD without a device (plugrt_amd.compiler_for), or use another device"


class AMDNotImplemented(UnsupportedError):
  """A part of the AMD backend that is not written yet; the message says which."""


class AcknowledgementRequired(UnsupportedError):
  """An interface that takes the GPU (or its bridge) from its kernel driver was asked for without PLUGRT_AMD_ALLOW_UNBIND=1."""


def refuse(device: DeviceInfo) -> NoReturn:
  raise AMDNotImplemented(f"{device.canonical}: {NOT_YET}", HINT)


def open_device(device: DeviceInfo) -> Any: refuse(device)


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
