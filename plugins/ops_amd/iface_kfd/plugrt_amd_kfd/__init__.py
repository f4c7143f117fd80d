"""plugrt-amd-kfd: the KFD interface of the AMD device, through the amdgpu kernel driver (/dev/kfd and the render node).

An interface plugin: InterfaceSpec(device="AMD", name="KFD"), the automatic choice (`AMD_IFACE=KFD` or
`DEV=KFD+AMD` name it). The probe looks at file names and KFD's topology in sysfs and opens nothing. Opening
returns a `gpu.KFDGPU`, plugrt-amd's `GPUInterface` over a `kfdev.KFDDevice` (memory, AQL and SDMA queues,
doorbells, events) on the real kernel, which plugrt-amd's device code drives. It has never run on AMD hardware: it
is tested against a fake KFD passed in as the KFDOps seam. Entry module: standard library and plugrt only.
"""
from __future__ import annotations

import os
from typing import Any

from plugrt.errors import Reason
from plugrt.hookspecs import DeviceInfo, InterfaceSpec, Probe, hookimpl

__version__ = "0.1.0"
NAME = "KFD"
KFD = "/dev/kfd"
UNTESTED = "never run on AMD hardware (tested against a fake KFD only)"


def probe() -> Probe:
  from plugrt_amd import DRIVER_HINT, kfd_gpus
  if not os.path.exists(KFD): return Probe.missing(Reason.NO_DEVICE, f"{KFD} does not exist: the amdgpu kernel driver is not loaded", DRIVER_HINT)
  if not os.access(KFD, os.R_OK | os.W_OK):
    return Probe.missing(Reason.NO_DEVICE, f"{KFD} is not readable and writable by this user", "add the user to the group that owns it (render)")
  if not (gpus := kfd_gpus()): return Probe.missing(Reason.NO_DEVICE, f"{KFD} exists but KFD's topology lists no GPU", DRIVER_HINT)
  return Probe.found(len(gpus), f"{KFD}, {len(gpus)} GPU node{'s' if len(gpus) != 1 else ''}; {UNTESTED}")


@hookimpl
def plugrt_interfaces() -> list[InterfaceSpec]:
  return [InterfaceSpec(device="AMD", name=NAME, probe=probe, auto=True, priority=10,
                        description=f"the amdgpu kernel driver (/dev/kfd and /dev/dri/renderD*); {UNTESTED}")]


def open_kfd(device: DeviceInfo, ops: Any = None) -> Any:
  """The KFDGPU of `device` (its index is the KFD GPU node), through `ops` (kfdev.KFDOps; tests pass a fake KFD).
  DeviceUnavailable with the reason when there is no /dev/kfd, no such GPU, or the driver is too old."""
  from plugrt.hwqueue import queue_timeout
  from plugrt_amd_kfd.gpu import KFDGPU
  from plugrt_amd_kfd.kfdev import KFDDevice
  return KFDGPU(KFDDevice(ops, device.index, timeout=queue_timeout(device.context, "PLUGRT_AMD_TIMEOUT"), label=f"AMD:{device.index}"))


@hookimpl
def plugrt_open_interface(device: DeviceInfo, interface: str) -> Any:
  from plugrt.errors import DeviceUnavailable
  if not os.path.exists(KFD):
    raise DeviceUnavailable(f"{device.canonical} through KFD: {KFD} does not exist", Reason.NO_DEVICE, "load the amdgpu kernel driver")
  return open_kfd(device)
