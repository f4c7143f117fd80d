"""plugrt-cl: the OpenCL backend, device CL (older name GPU), on pyopencl.

Any OpenCL platform: PoCL on the CPU (what CI runs), a GPU vendor's driver. CL=1,
GPU=1 or DEV=CL make it the default (its priority, 5, is below the CPU backend's, so
a machine whose only OpenCL is PoCL still defaults to plugrt's own CPU); CL:1 is the
platform's second device; CL_PLATFORM=<index or part of a name> or DEV=CL::<platform>
picks the platform where several are installed. See docs/backends/cl.md.

This entry module imports only the standard library and plugrt: the probe reads ICD
manifests (plugrt_cl.icd), and pyopencl loads when a device opens.
"""
from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any

from plugrt.context import PluginContext
from plugrt.errors import Reason
from plugrt.hookspecs import Alias, BackendSpec, CompilerSpec, DeviceInfo, Probe, hookimpl
from plugrt_cl import icd
from plugrt_cl.icd import NO_PLATFORM_HINT

__version__ = "0.1.0"


def enumerate_platforms(ctx: PluginContext) -> tuple[int, dict[str, str]]:
  """(devices on the platform plugrt would use, facts for `plugrt devices`), asking the ICD loader through pyopencl.
  Loads every driver; called only when a count or the listing is wanted, never by the probe itself."""
  try:
    import pyopencl as cl
    platforms = cl.get_platforms()
  except Exception as e:  # an ICD that fails to load, or none at all: say what the loader said
    return 0, {"error": f"{type(e).__name__}: {e}".strip()}
  info: dict[str, str] = {}
  chosen, count = None, 0
  try:
    target = ctx.target("CL")
    selector, _ = icd.requested_platform(target.arch if target else "", ctx.env)
  except Exception: selector = ""  # a malformed DEV or CL_PLATFORM is reported where a device is chosen
  for i, p in enumerate(platforms):
    try: devs = p.get_devices()
    except Exception: devs = []
    info[f"platform {i}"] = f"{p.name} ({p.version.strip()}): " + (", ".join(d.name.strip() for d in devs) or "no devices")
    pick = icd.matches(selector, i, p.name, p.vendor, p.version) if selector else bool(devs)
    if chosen is None and pick: chosen, count = i, len(devs)
  info["uses"] = f"platform {chosen}" if chosen is not None else f"no platform matches {selector!r}" if selector else "none"
  return count, info


class _Listing(Mapping[str, str]):
  """Probe.info that asks the platforms only when read (`plugrt devices`), not when a probe merely checks `ok`."""
  def __init__(self, probe: ICDProbe): self._probe = probe
  def _data(self) -> dict[str, str]: return self._probe.facts()[1]
  def __getitem__(self, key: str) -> str: return self._data()[key]
  def __iter__(self) -> Iterator[str]: return iter(self._data())
  def __len__(self) -> int: return len(self._data())
  def __repr__(self) -> str: return repr(self._data())


class ICDProbe(Probe):
  """A found probe whose device count and listing are worked out on first use.

  `ok` comes from the manifests alone, so automatic device choice stays cheap (Device.DEFAULT
  reads only `ok`); `count` is read when a device is opened by index (the open loads the
  drivers anyway) and by `plugrt devices`, and asks the loader then, once."""

  def __new__(cls, detail: str, found: Mapping[str, str], ctx: PluginContext) -> ICDProbe:
    self = super().__new__(cls, True, 0, None, detail)
    self._manifests, self._facts, self._ctx = dict(found), None, ctx
    return self

  def facts(self) -> tuple[int, dict[str, str]]:
    if self._facts is None:
      count, info = enumerate_platforms(self._ctx)
      self._facts = (count, {**self._manifests, **info})
    return self._facts

  # properties over Probe's fields, so that they are worked out when first read
  count = property(lambda self: self.facts()[0])  # type: ignore[assignment]
  info = property(lambda self: _Listing(self))  # type: ignore[assignment]
  def __repr__(self) -> str: return f"ICDProbe(ok=True, detail={self.detail!r}; count and info are looked up when first read)"


def probe_cl(ctx: PluginContext) -> Probe:
  if not icd.pyopencl_installed():
    return Probe.missing(Reason.MISSING_TOOLCHAIN, "pyopencl is not installed", "pip install pyopencl")
  found = icd.manifests(ctx.env)
  if not found:
    where = "OCL_ICD_VENDORS=" + named if (named := ctx.get("OCL_ICD_VENDORS")) else icd.vendors_dir(ctx.env)
    return Probe.missing(Reason.NO_DEVICE, f"no OpenCL platform is installed ({where} has no .icd manifest)", NO_PLATFORM_HINT)
  names = ", ".join(os.path.basename(m.library) + ("" if m.found else " (library not located)") for m in found)
  return ICDProbe(f"OpenCL ICD{'s' if len(found) > 1 else ''}: {names}", {f"icd {m.path}": m.library for m in found}, ctx)


@hookimpl
def plugrt_backends() -> list[BackendSpec]:
  return [BackendSpec(
    name="CL", api_version="1.2", probe=probe_cl, priority=5,
    compilers=(CompilerSpec("CL", "OpenCL C, built by the platform's own compiler"),),
    aliases=(Alias("GPU", "CL"),),
    description="OpenCL through pyopencl (PoCL on the CPU, or a GPU driver)")]


@hookimpl
def plugrt_open_device(device: DeviceInfo) -> Any:
  from plugrt_cl.device import open_device
  return open_device(device)


@hookimpl
def plugrt_allocator(device: DeviceInfo) -> Any:
  from plugrt_cl.device import CLAllocator
  return CLAllocator(device)


@hookimpl
def plugrt_compiler(device: DeviceInfo, compiler: str) -> Any:
  from plugrt_cl.compiler import CLCompiler
  return CLCompiler(device)


@hookimpl
def plugrt_program(device: DeviceInfo) -> Any:
  from plugrt_cl.program import load_program
  return load_program
