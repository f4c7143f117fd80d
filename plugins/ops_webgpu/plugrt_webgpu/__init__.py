"""plugrt-webgpu: the WEBGPU device. Kernels are rendered to WGSL and run through a
WebGPU engine: wgpu-native (interface WGPU, package plugrt-webgpu-wgpu) or Google's
Dawn (interface DAWN, package plugrt-webgpu-dawn), each an interface plugin that
can be installed on its own. `WEBGPU_IFACE=DAWN` or `DEV=DAWN+WEBGPU` picks one.

This entry module imports only the standard library and plugrt; the renderer,
allocator, compiler and program load when a device opens.
"""
from __future__ import annotations

from typing import Any

from plugrt.context import PluginContext
from plugrt.errors import Reason
from plugrt.hookspecs import BackendSpec, CompilerSpec, DeviceInfo, Probe, hookimpl
from plugrt.probing import has_module
from plugrt_webgpu.install import ENGINES, engine_hint

__version__ = "0.1.0"



def _third_party_engines(ctx: PluginContext) -> list[str]:
  """Interfaces other plugins declare for WEBGPU (a third party's engine), as the registry found them."""
  known = {name for name, _, _, _ in ENGINES}
  return [name for name in ctx.interfaces("WEBGPU") if name not in known]


def probe_webgpu(ctx: PluginContext) -> Probe:
  """Is some engine installed? (Whether it finds an adapter is known only once it opens: that
  loads the native library and the Vulkan/OpenGL drivers, which a probe must not do.)"""
  found = [name for name, pkg, lib, _ in ENGINES if has_module(pkg) and has_module(lib)]
  third = _third_party_engines(ctx)
  if found and not third:
    from plugrt_webgpu.drivers import DRIVER_HINT, drivers
    ok, seen = drivers(opengl="WGPU" in found, env=ctx.env)
    if not ok: return Probe.missing(Reason.NO_DEVICE, f"engines installed ({', '.join(found)}), but this machine has {seen}", DRIVER_HINT)
    return Probe.found(1, f"engines installed: {', '.join(found)}; drivers: {seen}", engines=",".join(found), drivers=seen)
  if found or third: return Probe.found(1, f"engines installed: {', '.join(found + third)}", engines=",".join(found + third))
  return Probe.missing(Reason.NO_DEVICE,
                       "no WebGPU engine is installed (neither plugrt-webgpu-wgpu with wgpu nor plugrt-webgpu-dawn with dawn-python)",
                       engine_hint())


@hookimpl
def plugrt_backends() -> list[BackendSpec]:
  return [BackendSpec(
    name="WEBGPU", api_version="1.2", probe=probe_webgpu, priority=4,
    compilers=(CompilerSpec("WGSL", "WGSL text; the engine compiles it when a pipeline is created"),),
    description="WebGPU compute through a pluggable engine (WGPU: wgpu-native, DAWN: Dawn)")]


@hookimpl
def plugrt_open_device(device: DeviceInfo) -> Any:
  from plugrt_webgpu.device import WebGPUState, engine_of
  return WebGPUState(engine_of(device))


@hookimpl
def plugrt_allocator(device: DeviceInfo) -> Any:
  from plugrt_webgpu.device import WebGPUAllocator
  return WebGPUAllocator(device)


@hookimpl
def plugrt_compiler(device: DeviceInfo, compiler: str) -> Any:
  from plugrt_webgpu.device import WGSLCompiler
  return WGSLCompiler(device)


@hookimpl
def plugrt_program(device: DeviceInfo) -> Any:
  from plugrt_webgpu.device import load_program
  return load_program
