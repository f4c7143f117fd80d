"""plugrt-amd-kfd: the KFD interface of the AMD device, through the amdgpu kernel driver (/dev/kfd and the render node).

An interface plugin: InterfaceSpec(device="AMD", name="KFD"), the automatic choice (`AMD_IFACE=KFD` or
`DEV=KFD+AMD` name it). The probe looks at file names and KFD's topology in sysfs and opens nothing. Opening refuses
in this release with a typed reason: the queue layer (memory, AQL queues, doorbells, signals) is the next step.
Entry module: standard library and plugrt only.
"""
from __future__ import annotations

import os
from typing import Any

from plugrt.errors import Reason
from plugrt.hookspecs import DeviceInfo, InterfaceSpec, Probe, hookimpl

__version__ = "0.1.0"
NAME = "KFD"
KFD = "/dev/kfd"
NOT_YET = ("the KFD queue layer is not wired to the AMD device yet (it runs against a fake KFD only; the next step of issue 13): "
           "plugrt cannot dispatch to an AMD GPU")


def probe() -> Probe:
  from plugrt_amd import DRIVER_HINT, kfd_gpus
  if not os.path.exists(KFD): return Probe.missing(Reason.NO_DEVICE, f"{KFD} does not exist: the amdgpu kernel driver is not loaded", DRIVER_HINT)
  if not os.access(KFD, os.R_OK | os.W_OK):
    return Probe.missing(Reason.NO_DEVICE, f"{KFD} is not readable and writable by this user", "add the user to the group that owns it (render)")
  if not (gpus := kfd_gpus()): return Probe.missing(Reason.NO_DEVICE, f"{KFD} exists but KFD's topology lists no GPU", DRIVER_HINT)
  return Probe.found(len(gpus), f"{KFD}, {len(gpus)} GPU node{'s' if len(gpus) != 1 else ''}; opening: {NOT_YET}")


@hookimpl
def plugrt_interfaces() -> list[InterfaceSpec]:
  return [InterfaceSpec(device="AMD", name=NAME, probe=probe, auto=True, priority=10,
                        description="the amdgpu kernel driver (/dev/kfd and /dev/dri/renderD*); the queue layer is not written yet")]


@hookimpl
def plugrt_open_interface(device: DeviceInfo, interface: str) -> Any:
  from plugrt.errors import DeviceUnavailable
  from plugrt_amd.device import HINT, AMDNotImplemented
  if not os.path.exists(KFD):
    raise DeviceUnavailable(f"{device.canonical} through KFD: {KFD} does not exist", Reason.NO_DEVICE, "load the amdgpu kernel driver")
  raise AMDNotImplemented(f"{device.canonical} through KFD: {NOT_YET}", HINT)
