"""PYTHON: the reference backend, in pure Python. Slow, dependable, and the template
for a new backend (docs/authoring.md walks through it).

This is the entry module: it declares the backend and implements the hooks, and
imports only the standard library and plugrt. The allocator, the compiler (IR ->
Python source) and the program live in plugrt.reference.backend, imported when a
device opens.
"""
from __future__ import annotations

from typing import Any

from plugrt.context import PluginContext
from plugrt.hookspecs import BackendSpec, CompilerSpec, DeviceInfo, Probe, hookimpl


def probe(ctx: PluginContext) -> Probe:  # ctx: the registry's environment and selection (this backend reads no setting)
  return Probe.found(1, "pure Python, one thread")


@hookimpl
def plugrt_backends() -> list[BackendSpec]:
  return [BackendSpec(name="PYTHON", api_version="1.2", probe=probe, priority=-100,
                      compilers=(CompilerSpec("PY", "IR -> Python source"),),
                      description="reference backend in pure Python (slow; for testing and as a template)")]


@hookimpl
def plugrt_allocator(device: DeviceInfo) -> Any:
  from plugrt.reference.backend import PythonAllocator
  return PythonAllocator(device)


@hookimpl
def plugrt_compiler(device: DeviceInfo, compiler: str) -> Any:
  from plugrt.reference.backend import PythonCompiler
  return PythonCompiler(device)


@hookimpl
def plugrt_program(device: DeviceInfo) -> Any:
  from plugrt.reference.backend import PythonProgram
  return PythonProgram
