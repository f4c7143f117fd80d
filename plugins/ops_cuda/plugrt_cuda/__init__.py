"""plugrt-cuda: NVIDIA GPUs through the CUDA driver API. Kernels compile as CUDA C through NVRTC
(default) or as PTX rendered directly (CUDA_PTX=1).

This entry module imports only the standard library and plugrt. The probe counts the
kernel driver's device nodes and looks for the driver and NVRTC libraries on disk: it
loads nothing and creates no context.
"""
from __future__ import annotations

from typing import Any

from plugrt.context import PluginContext
from plugrt.errors import Reason
from plugrt.hookspecs import BackendSpec, CollectiveEngineSpec, CompilerSpec, DeviceInfo, DeviceListing, Probe, VideoDecoderSpec, hookimpl
from plugrt.probing import device_nodes

__version__ = "0.1.0"
#: where containers and WSL put the driver's libcuda besides the system's library folders
DRIVER_DIRS = ("/usr/local/nvidia/lib64", "/usr/local/nvidia/lib", "/usr/lib/wsl/lib")


def probe_cuda(ctx: PluginContext) -> Probe:
  """GPU nodes and libcuda on disk; the GPUs CUDA will number, with CUDA_VISIBLE_DEVICES applied as the driver applies it
  (the driver reads the process's variable; a registry's own environment predicts with its value), listed from the
  kernel driver's proc files (plugrt_nvidia_toolchain.gpus: no library is loaded, no GPU touched)."""
  nodes = device_nodes("/dev/nvidia")
  if not nodes:
    return Probe.missing(Reason.NO_DEVICE, "no NVIDIA GPU (/dev/nvidia0 does not exist)", "run on a machine with an NVIDIA GPU and its driver")
  if ctx.find_library("libcuda.so*", dirs=ctx.library_dirs(*DRIVER_DIRS)) is None:
    return Probe.missing(Reason.NO_DEVICE, "the NVIDIA driver library libcuda.so.1 is not installed", "install the NVIDIA driver")
  from plugrt_nvidia_toolchain import gpus as G
  found = G.present(G.driver_gpus(), nodes)
  visible = ctx.env.get("CUDA_VISIBLE_DEVICES")
  seen = G.cuda_order(found, visible, len(nodes))
  where = "" if visible is None else f" (CUDA_VISIBLE_DEVICES={visible!r})"
  if not seen: return Probe.missing(Reason.NO_DEVICE, f"CUDA_VISIBLE_DEVICES={visible!r} hides every GPU",
                                    f"unset CUDA_VISIBLE_DEVICES, or name GPUs by index 0-{len(found or nodes) - 1} or GPU-<uuid>")
  listing = [_listing(v) for v in seen] if found else []  # no proc files: nothing to say beyond the count
  info = {} if G.order_is_exact(found, ctx.env.get("CUDA_DEVICE_ORDER")) else \
    {"order": "mixed GPU models: CUDA numbers them fastest first; the listing is PCI order (set CUDA_DEVICE_ORDER=PCI_BUS_ID to make it exact)"}
  if len(seen) > 1: info["copies between GPUs"] = "peer to peer where cuDeviceCanAccessPeer allows (asked when both open), else staged by the driver"
  n = len(seen)
  return Probe.found(n, f"{n} GPU{'s' if n != 1 else ''}{where}", **info).with_devices(listing)


def _listing(v: Any) -> DeviceListing:
  """One GPU CUDA will see (a plugrt_nvidia_toolchain.gpus.VisibleGPU) as `plugrt devices` lists it."""
  if v.gpu is None:  # a MIG instance, or a UUID the proc files do not show: what the entry said
    return DeviceListing(v.index, "MIG instance" if v.entry.upper().startswith("MIG-") else "NVIDIA GPU", "", {"CUDA_VISIBLE_DEVICES entry": v.entry})
  info = {"uuid": v.gpu.uuid} if v.gpu.uuid else {}
  if v.entry: info["CUDA_VISIBLE_DEVICES entry"] = v.entry
  return DeviceListing(v.index, v.gpu.model, v.gpu.bus_id, info)


def probe_nvrtc(ctx: PluginContext) -> Probe:
  """NVRTC on disk (paths only: no library is loaded here), looked for with the context's CUDA_HOME, PLUGRT_NVRTC."""
  from plugrt_nvidia_toolchain import nvrtc
  if not nvrtc.available(ctx.env):
    return Probe.missing(Reason.MISSING_TOOLCHAIN, "NVRTC (libnvrtc.so) is not installed", nvrtc.HINT)
  return Probe.found(1, "nvrtc")


@hookimpl
def plugrt_backends() -> list[BackendSpec]:
  return [BackendSpec(name="CUDA", api_version="1.3", probe=probe_cuda, priority=50,
                      compilers=(CompilerSpec("CUDA", "CUDA C through NVRTC to a cubin", probe_nvrtc),
                                 CompilerSpec("PTX", "PTX rendered by plugrt, compiled by the driver's JIT")),
                      description="NVIDIA GPUs through the CUDA driver API")]


def probe_nvdec(ctx: PluginContext) -> Probe:
  """NVDEC: a GPU and the driver's libnvcuvid on disk (the decoder's capabilities are asked when a stream opens)."""
  if not (p := probe_cuda(ctx)).ok: return p
  if ctx.find_library("libnvcuvid.so*", dirs=ctx.library_dirs(*DRIVER_DIRS)) is None:
    return Probe.missing(Reason.NOT_INSTALLED, "the driver's video decode library libnvcuvid.so.1 is not installed",
                         "install the NVIDIA driver's decode library (libnvidia-decode-<version>), or decode in software")
  return Probe.found(p.count, "libnvcuvid (NVDEC) with the driver")


def _open_nvdec(device: Any, stream: bytes, info: Any, options: Any) -> Any:
  from plugrt_cuda.cuvid import open_decoder
  return open_decoder(device, stream, info, options)


@hookimpl
def plugrt_video_decoders() -> list[VideoDecoderSpec]:
  return [VideoDecoderSpec(name="NVDEC", device="CUDA", probe=probe_nvdec, open=_open_nvdec, codecs=("hevc",), priority=50,
                           description="NVIDIA's video decode engines through libnvcuvid, surfaces in CUDA memory")]


def probe_nccl(ctx: PluginContext) -> Probe:
  """NCCL for plugrt.distributed: a GPU, and libnccl.so.2 on disk (PLUGRT_NCCL_LIBRARY, the nvidia-nccl wheels, the
  system's); nothing is loaded."""
  if not (p := probe_cuda(ctx)).ok: return p
  import os

  from plugrt_cuda.nccl import HINT, library_paths
  paths = library_paths(ctx.env)
  if (found := next((x for x in paths if os.path.exists(x)), None)) is None and ctx.find_library("libnccl.so*") is None:
    return Probe.missing(Reason.MISSING_TOOLCHAIN, "NCCL (libnccl.so.2) is not installed", HINT)
  where = found or "the system's libnccl"
  return Probe.found(p.count, f"{where}; run on two H200s over NVLink, not yet across hosts (docs/distributed.md)")


def _open_nccl(request: Any) -> Any:
  from plugrt_cuda.nccl import open_engine
  return open_engine(request)


def _nccl_id(ctx: PluginContext) -> bytes:
  from plugrt_cuda.nccl import NCCL, load
  return NCCL(load(ctx.env)).unique_id()


@hookimpl
def plugrt_collective_engines() -> list[CollectiveEngineSpec]:
  return [CollectiveEngineSpec(name="NCCL", device="CUDA", probe=probe_nccl, open=_open_nccl, local=True, priority=50,
                               description="NVIDIA's NCCL through ctypes, on the device's plugrt stream",
                               unique_id=_nccl_id)]


@hookimpl
def plugrt_open_device(device: DeviceInfo) -> Any:
  from plugrt_cuda.device import CUDAState
  return CUDAState(device)


@hookimpl
def plugrt_allocator(device: DeviceInfo) -> Any:
  from plugrt_cuda.device import CUDAAllocator
  return CUDAAllocator(device)


@hookimpl
def plugrt_compiler(device: DeviceInfo, compiler: str) -> Any:
  from plugrt_cuda.compiler import make
  return make(device, compiler)


@hookimpl
def plugrt_program(device: DeviceInfo) -> Any:
  from plugrt_cuda.device import load_program
  return load_program


@hookimpl
def plugrt_graph(device: DeviceInfo) -> Any:
  from plugrt_cuda.device import CUDAGraph
  return CUDAGraph
