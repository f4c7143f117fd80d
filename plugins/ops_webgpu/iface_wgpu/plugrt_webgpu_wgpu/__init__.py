"""plugrt-webgpu-wgpu: the WGPU interface of the WEBGPU device, wgpu-native driven through wgpu-py.

An interface plugin: it declares InterfaceSpec(device="WEBGPU", name="WGPU") and opens an
engine (plugrt_webgpu.engine.Engine) for the WEBGPU device. It is the default engine:
`WEBGPU_IFACE=WGPU` or `DEV=WGPU+WEBGPU` names it. This entry module imports only the
standard library and plugrt; wgpu loads when the device opens.
"""
from __future__ import annotations

import glob
import importlib.util
import os
import re
from typing import Any

from plugrt.context import PluginContext
from plugrt.errors import Reason
from plugrt.hookspecs import DeviceInfo, InterfaceSpec, Probe, hookimpl

__version__ = "0.1.0"
NAME = "WGPU"


def _wgpu_dir() -> str | None:
  try: spec = importlib.util.find_spec("wgpu")
  except (ImportError, ValueError): return None
  if spec is None or not spec.submodule_search_locations: return None
  return next(iter(spec.submodule_search_locations))


def probe(ctx: PluginContext) -> Probe:
  """wgpu-py is importable and ships its wgpu-native library: files only, nothing loads."""
  d = _wgpu_dir()
  if d is None: return Probe.missing(Reason.NOT_INSTALLED, "wgpu-py is not installed", "pip install wgpu")
  libs = glob.glob(os.path.join(d, "resources", "*wgpu_native*"))
  if not libs:
    return Probe.missing(Reason.NOT_INSTALLED, f"wgpu-py at {d} has no wgpu-native library for this platform", "pip install --force-reinstall wgpu")
  version = ""
  try:
    with open(os.path.join(d, "_version.py"), encoding="utf-8") as f:
      m = re.search(r"""__version__\s*=\s*["']([^"']+)""", f.read())
    version = m.group(1) if m else ""
  except OSError: pass
  from plugrt_webgpu.drivers import DRIVER_HINT, drivers  # stdlib only
  ok, seen = drivers(opengl=True, env=ctx.env)
  if not ok: return Probe.missing(Reason.NO_DEVICE, f"wgpu-py {version or '?'} is installed, but this machine has {seen}", DRIVER_HINT)
  return Probe.found(1, f"wgpu-py {version or '?'} (wgpu-native) over {seen}; list adapters with `python -m plugrt_webgpu`",
                     version=version, library=libs[0], drivers=seen)


@hookimpl
def plugrt_interfaces() -> list[InterfaceSpec]:
  from plugrt_webgpu.drivers import engine_interface  # stdlib and plugrt only
  return [engine_interface(device="WEBGPU", name=NAME, probe=probe, auto=True, priority=10, description="wgpu-native through wgpu-py")]


@hookimpl
def plugrt_open_interface(device: DeviceInfo, interface: str) -> Any:
  from plugrt_webgpu.drivers import ADAPTER_ENV
  from plugrt_webgpu_wgpu.engine import WgpuEngine
  return WgpuEngine(device.context.get(ADAPTER_ENV))


def adapters() -> list[Any]:
  """Every adapter wgpu-native sees (loads wgpu and the drivers: for `python -m plugrt_webgpu`, never for probing)."""
  from plugrt_webgpu_wgpu.engine import list_adapters
  return [info for info, _ in list_adapters()]
