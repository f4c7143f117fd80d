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
from plugrt.errors import Reason
from plugrt.hookspecs import BackendSpec, CompilerSpec, DeviceInfo, Probe, hookimpl
from plugrt_metal.macos import METAL_FRAMEWORK, mac_release, msl_version_for_macos

__version__ = "0.1.0"

#: what the probe looks at; tests replace these two (the probe reads them when it runs)
PLATFORM, FRAMEWORK = sys.platform, METAL_FRAMEWORK


def probe_metal(ctx: PluginContext) -> Probe:
  if PLATFORM != "darwin":
    return Probe.missing(Reason.NO_DEVICE, f"Metal needs macOS (this is {PLATFORM})",
                         "run on a Mac (every Apple-silicon Mac has a Metal GPU); here use CPU, CL or WEBGPU")
  if not os.path.isdir(FRAMEWORK):
    return Probe.missing(Reason.NO_DEVICE, f"this macOS has no Metal framework ({FRAMEWORK} is missing)", "Metal needs macOS 11 or newer")
  release = mac_release()
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
