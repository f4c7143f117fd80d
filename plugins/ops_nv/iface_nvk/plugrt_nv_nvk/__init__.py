"""plugrt-nv-nvk: the NVK interface of the NV device, through the NVIDIA kernel driver's device files.

An interface plugin: it declares InterfaceSpec(device="NV", name="NVK") and opens the GPU for plugrt-nv
(`NV_IFACE=NVK` or `DEV=NVK+NV` name it; it is the automatic choice). This entry module imports only the
standard library and plugrt; the probe looks at file names and /proc, and opens nothing.
"""
from __future__ import annotations

import os
from typing import Any

from plugrt.errors import Reason
from plugrt.hookspecs import DeviceInfo, InterfaceSpec, Probe, hookimpl
from plugrt_nv_nvk.branches import BRANCHES

__version__ = "0.1.0"
NAME = "NVK"


def probe() -> Probe:
  from plugrt_nv import DRIVER_HINT, driver_version
  for path in ("/dev/nvidiactl", "/dev/nvidia-uvm"):
    if not os.path.exists(path):
      what = "the UVM driver (nvidia-uvm) is not loaded" if "uvm" in path else "the NVIDIA kernel driver is not loaded"
      return Probe.missing(Reason.NO_DEVICE, f"{path} does not exist: {what}",
                           "modprobe nvidia nvidia-uvm" if "uvm" in path else DRIVER_HINT)
    if not os.access(path, os.R_OK | os.W_OK):
      return Probe.missing(Reason.NO_DEVICE, f"{path} is not readable and writable by this user",
                           "add the user to the group that owns it (often video)")
  ver = driver_version()
  if ver is not None:
    major = int(ver.split(".")[0])
    if not any(major in r for r in BRANCHES.values()):
      return Probe.missing(Reason.NO_DEVICE, f"NVIDIA driver {ver}: plugrt-nv-nvk has struct layouts for the "
                           f"{', '.join(map(str, BRANCHES))} branches only", "install a 580 driver, or add the branch to plugrt_nv_nvk/rm.py")
  note = "" if (ver or "").startswith("580.") else "; only driver 580 has run plugrt"
  return Probe.found(1, f"kernel driver {ver or '(version unknown)'}{note}", driver=ver or "")


@hookimpl
def plugrt_interfaces() -> list[InterfaceSpec]:
  return [InterfaceSpec(device="NV", name=NAME, probe=probe, auto=True, priority=10,
                        description="the NVIDIA kernel driver (/dev/nvidiactl, /dev/nvidia<N>, /dev/nvidia-uvm)")]


@hookimpl
def plugrt_open_interface(device: DeviceInfo, interface: str) -> Any:
  from plugrt_nv_nvk.nvk import NVKInterface
  return NVKInterface(device.index)
