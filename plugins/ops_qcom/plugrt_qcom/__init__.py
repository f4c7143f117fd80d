"""plugrt-qcom: Qualcomm Adreno GPUs (6xx, 7xx) driven from user space through the KGSL kernel driver.

The device `QCOM` opens /dev/kgsl-3d0, allocates GPU objects the CPU sees at their GPU address, and submits its own
Adreno command streams (PM4 packets: compute state, constants, buffer and image descriptors, the dispatch, a timeline
store) as indirect buffers through one draw context. Kernels are OpenCL C (the core's OpenCL renderer, as plugrt-cl
renders it) compiled by the device's own Qualcomm OpenCL driver, found at run time; the shader is taken out of the
driver's program binary. `plugrt_qcom.interop` turns an app's `cl_mem` into what `Tensor.from_blob` takes.

Nothing of it has run on an Adreno yet: everything is tested below the kernel boundary against a fake KGSL (see
docs/backends/qcom.md). Its priority (2) is below every backend that has run on hardware: QCOM=1 or DEV=QCOM picks it.

This entry module imports only the standard library and plugrt. The probe looks at file names only: it opens no
device and loads no library.
"""
from __future__ import annotations

import os
from typing import Any

from plugrt.context import PluginContext
from plugrt.errors import Reason
from plugrt.hookspecs import BackendSpec, CompilerSpec, DeviceInfo, Probe, hookimpl

__version__ = "0.1.0"
DEVICE_FILE = "/dev/kgsl-3d0"
DRIVER_HINT = "run on a device with a Qualcomm Adreno GPU and its KGSL driver (Android, or Linux on Snapdragon with msm_kgsl)"


def probe_qcom(ctx: PluginContext) -> Probe:
  if not os.path.exists(DEVICE_FILE):
    return Probe.missing(Reason.NO_DEVICE, f"no Adreno GPU through KGSL: {DEVICE_FILE} does not exist", DRIVER_HINT)
  return Probe.found(1, f"KGSL at {DEVICE_FILE}", note="plugrt-qcom has never run on an Adreno: see docs/backends/qcom.md")


def probe_opencl(ctx: PluginContext) -> Probe:
  """Qualcomm's OpenCL driver on disk (paths only: PLUGRT_QCOM_OPENCL, LD_LIBRARY_PATH, /vendor/lib64, ...)."""
  from plugrt_qcom import libcl
  path = libcl.find(ctx.env)
  if path is None: return Probe.missing(Reason.MISSING_TOOLCHAIN, "Qualcomm's OpenCL driver (libOpenCL.so) is not installed", libcl.HINT)
  return Probe.found(1, path)


@hookimpl
def plugrt_backends() -> list[BackendSpec]:
  return [BackendSpec(name="QCOM", api_version="1.2", probe=probe_qcom, priority=2,
                      compilers=(CompilerSpec("CL", "OpenCL C compiled by Qualcomm's OpenCL driver; the shader taken from its program binary",
                                              probe_opencl),),
                      description="Qualcomm Adreno GPUs from user space through KGSL (never run on an Adreno yet)")]


@hookimpl
def plugrt_open_device(device: DeviceInfo) -> Any:
  from plugrt_qcom.device import QCOMState
  return QCOMState(device)


@hookimpl
def plugrt_allocator(device: DeviceInfo) -> Any:
  from plugrt_qcom.device import QCOMAllocator
  return QCOMAllocator(device)


@hookimpl
def plugrt_compiler(device: DeviceInfo, compiler: str) -> Any:
  from plugrt_qcom.compiler import QCOMCompiler
  return QCOMCompiler(device)


@hookimpl
def plugrt_program(device: DeviceInfo) -> Any:
  from plugrt_qcom.device import QCOMProgram
  return QCOMProgram


@hookimpl
def plugrt_graph(device: DeviceInfo) -> Any:
  from plugrt.hwqueue import HCQGraph  # a batch of launches replayed under the device's lock
  return HCQGraph
