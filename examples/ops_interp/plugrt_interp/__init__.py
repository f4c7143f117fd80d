"""INTERP: an example plugrt backend that runs kernels with the numpy reference interpreter.

The entry module: it declares the backend and implements the hooks, importing only
the standard library and plugrt. numpy and the backend's objects load in the
factories, when the device is first opened.
"""
from __future__ import annotations

import importlib.util
from typing import Any

from plugrt.errors import Reason
from plugrt.hookspecs import BackendSpec, CompilerSpec, DeviceInfo, Probe, hookimpl


def probe() -> Probe:
  """Cheap and side-effect free: look, never open anything."""
  if importlib.util.find_spec("numpy") is None: return Probe.missing(Reason.MISSING_TOOLCHAIN, "numpy is not installed", "pip install numpy")
  return Probe.found(1, "numpy, vectorised over threads")


@hookimpl
def plugrt_backends() -> list[BackendSpec]:
  return [BackendSpec(name="INTERP", api_version="1.0", probe=probe, priority=-50,
                      compilers=(CompilerSpec("IR", "ships the IR listing itself; the interpreter runs it"),),
                      description="example backend: plugrt's reference interpreter as a device")]


@hookimpl
def plugrt_allocator(device: DeviceInfo) -> Any:
  from plugrt_interp.device import InterpAllocator
  return InterpAllocator(device)


@hookimpl
def plugrt_compiler(device: DeviceInfo, compiler: str) -> Any:
  from plugrt_interp.device import InterpCompiler
  return InterpCompiler(device)


@hookimpl
def plugrt_program(device: DeviceInfo) -> Any:
  from plugrt_interp.device import InterpProgram
  return InterpProgram
