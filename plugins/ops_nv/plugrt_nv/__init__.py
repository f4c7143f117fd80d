"""plugrt-nv: NVIDIA GPUs driven from user space, without CUDA's user-space driver.

The device `NV` reaches the GPU through an interface plugin: NVK (package plugrt-nv-nvk: the kernel driver's
device files /dev/nvidiactl, /dev/nvidia<N>, /dev/nvidia-uvm) or PCI (plugrt-nv-pci, driverless; never chosen
automatically). It allocates memory and channels once, then writes launch descriptors (QMDs) and copy commands
into its own ring in GPU-visible memory and rings the doorbell: a launch makes no system call. Kernels are CUDA
C through NVRTC (default) or PTX assembled by ptxas or nvJitLink (NV_PTX=1), built for the GPU's own architecture
by plugrt-nvidia-toolchain, which plugrt-cuda uses too.

This entry module imports only the standard library and plugrt. The probe reads file names and
/proc/driver/nvidia/version; it opens no device and makes no ioctl.
"""
from __future__ import annotations

import os
from typing import Any

from plugrt.context import PluginContext
from plugrt.errors import Reason
from plugrt.hookspecs import BackendSpec, CompilerSpec, DeviceInfo, DeviceListing, Probe, VideoDecoderSpec, hookimpl
from plugrt.probing import device_nodes, has_module, install_hint

__version__ = "0.1.0"
#: first-party interfaces: (name, module, distribution)
INTERFACES = (("NVK", "plugrt_nv_nvk", "plugrt-nv-nvk"), ("PCI", "plugrt_nv_pci", "plugrt-nv-pci"))
#: how NV copies between two GPUs, said by `plugrt devices` (NVAllocator.peer_path says it for an opened pair; docs/multi-gpu.md)
PEER_PATH = ("through a peer mapping where the driver allows it (asked when both GPUs are open: P2P caps, then UVM peer access), "
             "else staged through host memory, with the reason")
DRIVER_HINT = "install the NVIDIA driver (open or proprietary kernel modules) and load nvidia and nvidia-uvm, or run on a machine with an NVIDIA GPU"


def gpu_nodes() -> list[str]:
  """The kernel driver's per-GPU nodes, /dev/nvidia0, /dev/nvidia1, ..."""
  return device_nodes("/dev/nvidia")


def driver_version(path: str = "/proc/driver/nvidia/version") -> str | None:
  """The loaded kernel driver's version ("580.159.04"), from its proc file; None when it cannot be read."""
  try:
    with open(path, encoding="utf-8", errors="replace") as f: first = f.readline()
  except OSError: return None
  return next((w for w in first.split() if w.count(".") >= 1 and w.replace(".", "").isdigit()), None)


def probe_nv(ctx: PluginContext) -> Probe:
  if not os.path.exists("/dev/nvidiactl"):
    return Probe.missing(Reason.NO_DEVICE, "no NVIDIA kernel driver: /dev/nvidiactl does not exist", DRIVER_HINT)
  nodes = gpu_nodes()
  if not nodes: return Probe.missing(Reason.NO_DEVICE, "the NVIDIA driver is loaded but lists no GPU (/dev/nvidia0 does not exist)", DRIVER_HINT)
  if (machine := os.uname().machine).lower() not in ("x86_64", "amd64"):  # (os.uname: `platform` costs an import)
    return Probe.missing(Reason.NO_DEVICE, f"plugrt-nv runs on x86-64 only for now (this is {machine})",
                         "use the CUDA device (plugrt-cuda)")
  if not any(has_module(m) for _, m, _ in INTERFACES):
    return Probe.missing(Reason.NOT_INSTALLED, "no NV interface is installed", f"{install_hint('plugrt-nv-nvk')} (the kernel-driver interface)")
  ver = driver_version()
  from plugrt_nvidia_toolchain import gpus as G  # the kernel driver's proc files: no device opened, no ioctl
  here = G.by_minor(G.present(G.driver_gpus(), nodes))
  listing = [DeviceListing(i, g.model, g.bus_id, {"uuid": g.uuid} if g.uuid else {}) for i, g in enumerate(here)]
  info = {"driver": ver or ""}
  if len(nodes) > 1: info["copies between GPUs"] = PEER_PATH
  return Probe.found(len(nodes), f"{len(nodes)} GPU{'s' if len(nodes) != 1 else ''}, driver {ver or 'version unknown'}", **info).with_devices(listing)


def probe_nvrtc(ctx: PluginContext) -> Probe:
  """NVRTC on disk (paths only), looked for with the context's CUDA_HOME and PLUGRT_NVRTC."""
  from plugrt_nvidia_toolchain import nvrtc
  if not nvrtc.available(ctx.env):
    return Probe.missing(Reason.MISSING_TOOLCHAIN, "NVRTC (libnvrtc.so) is not installed", nvrtc.HINT)
  return Probe.found(1, "nvrtc")


def probe_ptxas(ctx: PluginContext) -> Probe:
  """ptxas, else nvJitLink (paths only), looked for with the context's CUDA_HOME, PLUGRT_PTXAS and PLUGRT_NVJITLINK."""
  from plugrt_nvidia_toolchain import jitlink, ptxas
  env = ctx.env
  if (p := ptxas.path(env)) is not None: return Probe.found(1, p)
  if (p := jitlink.path(env)) is not None: return Probe.found(1, f"nvJitLink {p}")
  return Probe.missing(Reason.MISSING_TOOLCHAIN, "neither ptxas nor nvJitLink is installed", f"{ptxas.HINT}; or {jitlink.HINT}")


@hookimpl
def plugrt_backends() -> list[BackendSpec]:
  # below CUDA (50): where both run, the CUDA driver stays the default and NV=1 picks this one
  return [BackendSpec(name="NV", api_version="1.3", probe=probe_nv, priority=45,
                      compilers=(CompilerSpec("CUDA", "CUDA C through NVRTC to a cubin", probe_nvrtc),
                                 CompilerSpec("PTX", "PTX rendered by plugrt, assembled to a cubin by ptxas or nvJitLink", probe_ptxas)),
                      description="NVIDIA GPUs from user space through the kernel driver (no libcuda)")]


def probe_nv_video(ctx: PluginContext) -> Probe:
  """NV's probe, saying where the engine path has run (docs/video.md)."""
  p = probe_nv(ctx)
  if not p.ok: return p
  return Probe.found(p.count, "decoded on H200s (driver 580), every frame equal to software's, 8 and 10 bits; not run on "
                              "other GPUs, its speed not measured; see docs/video.md")


def _open_video(device: Any, stream: bytes, info: Any, options: Any) -> Any:
  from plugrt_nv.nvvideo import open_decoder
  return open_decoder(device, stream, info, options)


@hookimpl
def plugrt_video_decoders() -> list[VideoDecoderSpec]:
  # below plugrt-cuda's NVDEC (50): where both run, libnvcuvid stays the automatic choice; device="NV" picks this one.
  # The probe is NV's (files only); whether the GPU offers a video decoder class is known when a stream opens.
  return [VideoDecoderSpec(name="NV_NVDEC", device="NV", probe=probe_nv_video, open=_open_video, codecs=("hevc",), priority=40,
                           description="the GPU's video decode engine driven from user space (no libnvcuvid, no libcuda)")]


@hookimpl
def plugrt_open_device(device: DeviceInfo) -> Any:
  from plugrt_nv.device import NVState
  return NVState(device)


@hookimpl
def plugrt_allocator(device: DeviceInfo) -> Any:
  from plugrt_nv.device import NVAllocator
  return NVAllocator(device)


@hookimpl
def plugrt_compiler(device: DeviceInfo, compiler: str) -> Any:
  from plugrt_nv.compiler import make
  return make(device, compiler)


@hookimpl
def plugrt_program(device: DeviceInfo) -> Any:
  from plugrt_nv.device import NVProgram
  return NVProgram


@hookimpl
def plugrt_graph(device: DeviceInfo) -> Any:
  from plugrt.hwqueue import HCQGraph  # a batch of launches replayed under the device's lock
  return HCQGraph
