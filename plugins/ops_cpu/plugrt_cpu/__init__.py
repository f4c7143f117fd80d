"""plugrt-cpu: the CPU backend. Kernels compile to C with clang (default) or to LLVM IR
with llvmlite (CPU_LLVM=1 or LLVM=1), and run the grid across the machine's cores.

This entry module imports only the standard library and plugrt; the compilers,
allocator and loader live in their own modules and load when a device opens.
"""
from __future__ import annotations

import os
from typing import Any

from plugrt.context import PluginContext
from plugrt.errors import Reason
from plugrt.hookspecs import Alias, BackendSpec, CompilerSpec, DeviceInfo, Probe, hookimpl
from plugrt.probing import has_module
from plugrt_cpu.toolchain import probe_clang

__version__ = "0.1.0"


def probe_llvm(ctx: PluginContext) -> Probe:
  if not has_module("llvmlite"):  # it also links the objects into the process, whichever LLVM compiled them
    return Probe.missing(Reason.MISSING_TOOLCHAIN, "llvmlite is not installed", "pip install llvmlite")
  if setting := ctx.get("PLUGRT_CPU_LIBLLVM"):  # opt-in: the system's release-built libLLVM compiles
    from plugrt_cpu.libllvm import find_libllvm
    path, why = find_libllvm(setting)
    if path is None: return Probe.missing(Reason.MISSING_TOOLCHAIN, why, "install libLLVM 15 or later, or unset PLUGRT_CPU_LIBLLVM to use llvmlite")
    return Probe.found(1, path)
  return Probe.found(1, "llvmlite")


def probe_cpu(ctx: PluginContext) -> Probe:
  if not probe_clang(ctx).ok and not probe_llvm(ctx).ok:
    return Probe.missing(Reason.MISSING_TOOLCHAIN, "neither clang nor llvmlite is installed",
                         "apt-get install clang, or pip install llvmlite")
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
  return Probe.found(1, f"{os.uname().machine}, {cores} cores", cores=str(cores))


@hookimpl
def plugrt_backends() -> list[BackendSpec]:
  return [BackendSpec(
    name="CPU", api_version="1.2", probe=probe_cpu, priority=10,
    compilers=(CompilerSpec("CLANG", "C through clang, linked in-process", probe_clang),
               CompilerSpec("LLVM", "LLVM IR through llvmlite, in-process", probe_llvm)),
    aliases=(Alias("CLANG", "CPU:CLANG"), Alias("LLVM", "CPU:LLVM")),
    description="the host CPU, every core")]


@hookimpl
def plugrt_allocator(device: DeviceInfo) -> Any:
  from plugrt_cpu.allocator import CPUAllocator
  return CPUAllocator(device)


@hookimpl
def plugrt_compiler(device: DeviceInfo, compiler: str) -> Any:
  if compiler == "LLVM":
    if setting := device.context.get("PLUGRT_CPU_LIBLLVM"):
      from plugrt_cpu.libllvm import make_compiler
      return make_compiler(device, setting)
    from plugrt_cpu.llvm import LLVMCompiler
    return LLVMCompiler(device)
  from plugrt_cpu.clang import ClangCompiler
  return ClangCompiler(device)


@hookimpl
def plugrt_program(device: DeviceInfo) -> Any:
  from plugrt_cpu.loader import load_program
  from plugrt_cpu.program import POOL, thread_count
  POOL.configure(thread_count(device.context.env))  # a bad PLUGRT_CPU_THREADS is an EnvError when the device opens
  return load_program
