"""plugrt-metal: the METAL backend, Apple GPUs through the Metal framework (Objective-C runtime by ctypes, no pyobjc).

METAL=1 or DEV=METAL makes it the default. Its priority (3) is below every backend that has run on hardware: nothing
of this package has run on a Mac yet (docs/backends/metal.md says what was verified and how), so plugrt never picks
it by itself until it has.

This entry module imports only the standard library and plugrt. The probe is side-effect free: on anything but
macOS it answers "Metal needs macOS" at once; on macOS it checks that Metal.framework is there, without loading it.
libobjc and Metal load when a device opens (plugrt_metal.objc).
"""
from __future__ import annotations

import os
import sys
from typing import Any

from plugrt.context import PluginContext
from plugrt.errors import EnvError, Reason
from plugrt.hookspecs import BackendSpec, CompilerSpec, DeviceInfo, Probe, hookimpl

__version__ = "0.1.0"

METAL_FRAMEWORK = "/System/Library/Frameworks/Metal.framework"
#: what the probe looks at; tests replace these two (the probe reads them when it runs)
PLATFORM, FRAMEWORK = sys.platform, METAL_FRAMEWORK

#: the Metal Shading Language version each macOS release brings (Apple's MSL specification, "Metal Shading Language
#: versions"); plugrt targets the newest one the OS has (MSL 3.1, macOS 14, is the first with bfloat)
MSL_BY_MACOS = {11: (2, 3), 12: (2, 4), 13: (3, 0), 14: (3, 1), 15: (3, 2)}
MSL_VERSIONS = frozenset(MSL_BY_MACOS.values())


def _mac_release() -> str:
  import platform  # here, not at the top: its import costs ~2 ms of every process's discovery, and only a Mac asks
  return platform.mac_ver()[0]


def macos_major(release: str | None = None) -> int:
  """The macOS major version (14 for "14.5"), 0 when unknown."""
  release = _mac_release() if release is None else release
  try: return int(release.split(".")[0])
  except ValueError: return 0


def msl_version_for_macos(ctx: PluginContext, release: str | None = None) -> tuple[int, int]:
  """PLUGRT_METAL_MSL=major.minor if set, else the newest MSL version of this macOS release (MSL_BY_MACOS; a release
  newer than the table gets the table's newest)."""
  if (v := ctx.get("PLUGRT_METAL_MSL")):
    try: want = tuple(int(x) for x in v.split("."))
    except ValueError: want = ()
    if want not in MSL_VERSIONS:
      raise EnvError(f"PLUGRT_METAL_MSL={v!r} is not a Metal Shading Language version plugrt knows",
                     f"one of {', '.join(f'{a}.{b}' for a, b in sorted(MSL_VERSIONS))}, or unset it for the OS's own")
    return want  # type: ignore[return-value]
  major = macos_major(release)
  if major in MSL_BY_MACOS: return MSL_BY_MACOS[major]
  return max(MSL_VERSIONS) if major > max(MSL_BY_MACOS) else min(MSL_VERSIONS)


def probe_metal(ctx: PluginContext) -> Probe:
  if PLATFORM != "darwin":
    return Probe.missing(Reason.NO_DEVICE, f"Metal needs macOS (this is {PLATFORM})",
                         "run on a Mac (every Apple-silicon Mac has a Metal GPU); here use CPU, CL or WEBGPU")
  if not os.path.isdir(FRAMEWORK):
    return Probe.missing(Reason.NO_DEVICE, f"this macOS has no Metal framework ({FRAMEWORK} is missing)", "Metal needs macOS 11 or newer")
  release = _mac_release()
  msl = "{}.{}".format(*msl_version_for_macos(ctx, release)) if release else "?"
  return Probe.found(1, f"Metal.framework on macOS {release or '?'}", macos=release or "?", msl=msl,
                     note="plugrt-metal has never run on Apple hardware: see docs/backends/metal.md")


@hookimpl
def plugrt_backends() -> list[BackendSpec]:
  return [BackendSpec(
    name="METAL", api_version="1.2", probe=probe_metal, priority=3,
    compilers=(CompilerSpec("METAL", "Metal Shading Language, through newLibraryWithSource or Xcode's metal tool"),),
    description="Apple GPUs through the Metal framework (libobjc by ctypes)")]


@hookimpl
def plugrt_open_device(device: DeviceInfo) -> Any:
  from plugrt_metal.device import open_device
  return open_device(device)


@hookimpl
def plugrt_allocator(device: DeviceInfo) -> Any:
  from plugrt_metal.device import MetalAllocator
  return MetalAllocator(device)


@hookimpl
def plugrt_compiler(device: DeviceInfo, compiler: str) -> Any:
  from plugrt_metal.compiler import MetalCompiler
  return MetalCompiler(device)


@hookimpl
def plugrt_program(device: DeviceInfo) -> Any:
  from plugrt_metal.program import load_program
  return load_program


@hookimpl
def plugrt_graph(device: DeviceInfo) -> Any:
  from plugrt_metal.graph import make_graph
  return make_graph
