"""The CL compiler: OpenCL C -> the device's program binary, built once.

compile_uncached builds the source with the platform's compiler and returns the binary
the device reports (CL_PROGRAM_BINARIES) inside a frame (magic line, sha256) that the
loader checks before the driver sees a byte; the built program is handed to the loader
as it is (CLState.fresh), so a new kernel is built exactly once. The core's disk cache
keeps the binary under a key of platform name and version, device name and version,
driver version and build options; a hit is loaded with clCreateProgramWithBinary,
a small fraction of a build on PoCL.

PoCL parses OpenCL's 900 KB builtin header (opencl-c.h) for every build: most of the
time a tiny kernel takes. plugrt's kernels use a dozen builtins, so on PoCL the
compiler defines the header's include guard and the renderer declares those builtins
itself (renderer.BARE_PRELUDE), and a build is several times faster (docs/backends/cl.md). Should a PoCL release ever
reject that, the first failure switches this compiler back to the full header for good.
"""
from __future__ import annotations

import hashlib
import os
import sys
from typing import Any

import pyopencl as cl

from plugrt.compiler.ir import Kernel
from plugrt.errors import CompileError, PluginError
from plugrt.hookspecs import DeviceInfo
from plugrt.runtime import Compiler
from plugrt_cl.device import CLState, state_of
from plugrt_cl.renderer import OpenCLRenderer

BARE_OPTIONS = "-D_OPENCL_H_ -DPLUGRT_BARE_BUILTINS"  # _OPENCL_H_: the builtin header's include guard, so it is skipped
FRESH_KEEP = 16  # built programs kept for the loader; more are only made by callers that never load them (benchmarks)


def is_pocl(platform: Any) -> bool: return "portable computing language" in platform.name.lower() or "pocl" in platform.version.lower()


def build(state: CLState, src: str | None, binary: bytes | None, options: str, name: str = "") -> Any:
  """A built cl.Program from source or from a binary; CompileError with the build log on failure.

  The build runs with the process's stderr (fd 2) sent to a file: clang inside PoCL prints its diagnostic summary
  ("4 warnings generated.", "1 error generated.") there, with no text and nothing a user can act on (the kernels are
  plugrt's own; the diagnostics themselves are in the build log). On a failure, what it printed stands in for the
  build log when the driver gives none; otherwise it is dropped. A build happens once per new kernel (cache hits load
  binaries), so the redirect costs nothing that matters; another thread's stderr output during those milliseconds
  goes the same way."""
  prg = cl._cl._Program(state.context, src) if binary is None else cl._cl._Program(state.context, [state.device], [binary])
  import tempfile
  with tempfile.TemporaryFile() as printed:
    if sys.stderr is not None: sys.stderr.flush()
    try: saved = os.dup(2)
    except OSError: saved = -1  # no fd 2 at all: nothing to keep quiet
    if saved >= 0: os.dup2(printed.fileno(), 2)
    try:
      prg._build(options.encode(), [state.device])  # the raw build: pyopencl's Program.build adds its own caching and options
      return prg
    except cl.Error as e: failure = e
    finally:
      if saved >= 0:
        os.dup2(saved, 2)
        os.close(saved)
    printed.seek(0)
    text = printed.read().decode(errors="replace").strip()
  try: log = prg.get_build_info(state.device, cl.program_build_info.LOG)
  except cl.Error: log = ""
  what = f"kernel {name}" if name else "a kernel"
  raise CompileError(f"{state.label}: the OpenCL compiler rejected {what}: {failure.what if hasattr(failure, 'what') else failure}",
                     log or text or str(failure), "this is a renderer bug if the kernel came from plugrt's IR; please report it")


class CLCompiler(Compiler):
  name = "CL"
  cache_namespace = "cl"

  def __init__(self, device: DeviceInfo):
    super().__init__(device)
    self.state = state_of(device)
    self.renderer = OpenCLRenderer(self.state.label, self.state.fp64)
    self.max_shared_bytes = self.state.max_local  # past CL_DEVICE_LOCAL_MEM_SIZE PoCL aborts the process at the launch
    self.bare = is_pocl(self.state.platform)

  @property
  def options(self) -> str: return BARE_OPTIONS if self.bare else ""

  def render(self, kernel: Kernel) -> str: return self.renderer.render(kernel)

  def toolchain(self) -> tuple[str, ...]:
    p, d = self.state.platform, self.state.device
    return (p.name, p.version, d.name, d.version, d.driver_version, self.options)

  def compile_uncached(self, src: str) -> bytes:
    try: prg = build(self.state, src, None, self.options)
    except CompileError:
      if not self.bare: raise
      prg = build(self.state, src, None, "")  # the full header builds it: this PoCL does not take the fast path
      self.bare, self._key_prefix = False, None  # from now on, and under its own cache key
    lib = frame(prg.get_info(cl.program_info.BINARIES)[0])
    fresh = self.state.fresh
    fresh[lib] = (prg, self.options)
    while len(fresh) > FRESH_KEEP: fresh.pop(next(iter(fresh)))
    return lib


FRAME = b"plugrt-cl-binary 1\n"


def frame(binary: bytes) -> bytes:
  """What the CL compiler returns (and the disk cache keeps): the driver's binary behind a magic line and its sha256."""
  return FRAME + hashlib.sha256(binary).digest() + binary


def unframe(lib: bytes, name: str) -> bytes:
  """The driver's binary out of frame(); PluginError for anything else. PoCL trusts the sizes inside a
  binary and aborts the process on a truncated or foreign one, so only what this compiler made reaches it."""
  n = len(FRAME)
  if lib[:n] != FRAME or len(lib) <= n + 32 or hashlib.sha256(memoryview(lib)[n + 32:]).digest() != lib[n:n + 32]:
    raise PluginError(f"CL program {name}: the binary is not one plugrt's CL compiler made (no intact plugrt-cl-binary frame)",
                      "compile the kernel with this device's compiler (device.program or compiler.compile)")
  return lib[n + 32:]
