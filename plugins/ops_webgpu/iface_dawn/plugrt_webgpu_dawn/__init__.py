"""plugrt-webgpu-dawn: the DAWN interface of the WEBGPU device, Google's Dawn (the WebGPU
engine in Chrome) driven through dawn-python (the seeds' pydawn).

An interface plugin: it declares InterfaceSpec(device="WEBGPU", name="DAWN") and opens an
engine (plugrt_webgpu.engine.Engine) for the WEBGPU device; `WEBGPU_IFACE=DAWN` or
`DEV=DAWN+WEBGPU` picks it. This entry module imports only the standard library and
plugrt: dawn-python's module loads its native library on import, so it loads only
when the device opens.
"""
from __future__ import annotations

import glob
import importlib.util
import os
import sys
from typing import Any

from plugrt.context import PluginContext
from plugrt.errors import Reason
from plugrt.hookspecs import DeviceInfo, InterfaceSpec, Probe, hookimpl
from plugrt.probing import install_hint

__version__ = "0.1.0"
NAME = "DAWN"


def _machine() -> str:  # not platform.machine(): importing platform costs milliseconds of discovery
  if sys.platform == "win32":
    import platform  # Windows has no os.uname
    return platform.machine().lower()
  return os.uname().machine.lower()


def _library_names() -> tuple[str, ...]:
  """The file names dawn-python looks for on this machine, by platform and processor."""
  arch = {"amd64": "x86_64", "x86_64": "x86_64", "arm64": "aarch64", "aarch64": "aarch64"}.get(_machine(), _machine())
  if sys.platform == "win32": return ("libwebgpu_dawn.dll",)
  if sys.platform == "darwin": return (f"libwebgpu_dawn_{'arm64' if arch == 'aarch64' else arch}.dylib",)
  return (f"libwebgpu_dawn_{arch}.so",)


def library() -> str | None:
  """The Dawn library dawn-python ships for this machine, or None (files only: nothing loads)."""
  try: spec = importlib.util.find_spec("pydawn")
  except (ImportError, ValueError): return None
  if spec is None or not spec.submodule_search_locations: return None
  d = os.path.join(next(iter(spec.submodule_search_locations)), "lib")
  for name in _library_names():
    if os.path.isfile(p := os.path.join(d, name)): return p
  return None


def probe(ctx: PluginContext) -> Probe:
  try: spec = importlib.util.find_spec("pydawn")
  except (ImportError, ValueError): spec = None
  if spec is None: return Probe.missing(Reason.NOT_INSTALLED, "dawn-python is not installed", "pip install dawn-python")
  lib = library()
  if lib is None:
    have = ", ".join(os.path.basename(p) for p in glob.glob(os.path.join(next(iter(spec.submodule_search_locations or ["."])), "lib", "*")))
    return Probe.missing(Reason.NOT_INSTALLED, f"dawn-python has no Dawn library for {sys.platform} {_machine()} "
                         f"(it ships: {have or 'nothing'})", f"use the WGPU engine ({install_hint('plugrt-webgpu-wgpu')}) on this machine")
  from plugrt_webgpu.drivers import DRIVER_HINT, drivers  # stdlib only
  ok, seen = drivers(opengl=False, env=ctx.env)  # this Dawn build opens Vulkan (or Metal/D3D12), not OpenGL
  if not ok: return Probe.missing(Reason.NO_DEVICE, f"dawn-python is installed, but this machine has {seen}", DRIVER_HINT)
  return Probe.found(1, f"dawn-python ({os.path.basename(lib)}) over {seen}; list adapters with `python -m plugrt_webgpu`", library=lib, drivers=seen)


@hookimpl
def plugrt_interfaces() -> list[InterfaceSpec]:
  from plugrt_webgpu.drivers import engine_interface  # stdlib and plugrt only
  return [engine_interface(device="WEBGPU", name=NAME, probe=probe, auto=True, priority=5, description="Google's Dawn through dawn-python")]


@hookimpl
def plugrt_open_interface(device: DeviceInfo, interface: str) -> Any:
  from plugrt_webgpu.drivers import ADAPTER_ENV
  from plugrt_webgpu_dawn.engine import DawnEngine
  return DawnEngine(device.context.get(ADAPTER_ENV))


def adapters() -> list[Any]:
  """The adapters Dawn offers, one per backend it can open (loads Dawn: for `python -m plugrt_webgpu`, never for probing)."""
  from plugrt_webgpu_dawn.engine import list_adapters
  return [info for info, _ in list_adapters()]
