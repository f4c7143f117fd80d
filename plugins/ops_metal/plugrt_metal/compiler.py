"""The METAL compiler: MSL -> a library, at run time (newLibraryWithSource) or offline (Xcode's metal and metallib).

What compile() returns, and the core's disk cache keeps, is a frame (magic line, kind byte, sha256, payload):
- kind L: a .metallib made by Xcode's `metal` and `metallib` tools, where `xcrun` finds them (and
  PLUGRT_METAL_OFFLINE is not 0); the loader hands it to newLibraryWithData:error:, so a cache hit compiles nothing.
- kind S: the MSL source itself, checked by compiling it with newLibraryWithSource:options:error: (the library is
  kept for the loader, so a new kernel is compiled once); a cache hit compiles the source again at load (Metal keeps
  its own shader cache for that).
Either way fast math is off (MTLMathModeSafe, or fastMathEnabled NO before macOS 15; `-fno-fast-math` offline) and
the language version is the device's (plugrt_metal.macos.msl_version_for_macos). The cache key holds the macOS version, the
MSL version, the GPU's name and the offline tools' version.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import subprocess
import tempfile
from typing import Any

from plugrt.compiler.ir import Kernel
from plugrt.errors import CompileError, PluginError
from plugrt.hookspecs import DeviceInfo
from plugrt.runtime import Compiler
from plugrt_metal.device import MetalState, state_of
from plugrt_metal.renderer import MetalRenderer, msl_version_str

FRAME = b"plugrt-metal-library 1\n"
SOURCE, METALLIB = b"S", b"L"
MTL_MATH_MODE_SAFE = 0  # MTLMathMode (MTLLibrary.h): Safe 0, Relaxed 1, Fast 2
FRESH_KEEP = 16
BUG_HINT = "this is a renderer bug if the kernel came from plugrt's IR; please report it"


def language_version(version: tuple[int, int]) -> int:
  """MTLLanguageVersion's value for MSL major.minor: (major << 16) | minor (MTLLibrary.h: MTLLanguageVersion3_1 = (3 << 16) + 1)."""
  return (version[0] << 16) | version[1]


def frame(kind: bytes, payload: bytes) -> bytes: return FRAME + kind + hashlib.sha256(payload).digest() + payload


def unframe(lib: bytes, name: str) -> tuple[bytes, bytes]:
  """(kind, payload) of what frame() made; PluginError for anything else."""
  n = len(FRAME)
  kind, digest, payload = lib[n:n + 1], lib[n + 1:n + 33], lib[n + 33:]
  if lib[:n] != FRAME or kind not in (SOURCE, METALLIB) or hashlib.sha256(payload).digest() != digest:
    raise PluginError(f"METAL program {name}: the binary is not one plugrt's METAL compiler made (no intact plugrt-metal-library frame)",
                      "compile the kernel with this device's compiler (device.program or compiler.compile)")
  return kind, payload


def compile_options(state: MetalState) -> int:
  """A new MTLCompileOptions (owned) with fast math off and the device's language version."""
  c, S = state.calls, state.calls.S
  opts = c.new("MTLCompileOptions")
  if c.responds(opts, "setMathMode:"): c.void_ulong(opts, S.setMathMode_, MTL_MATH_MODE_SAFE)
  else: c.void_bool(opts, S.setFastMathEnabled_, False)
  c.void_ulong(opts, S.setLanguageVersion_, language_version(state.msl_version))
  return opts


def library_from_source(state: MetalState, src: str, name: str = "") -> int:
  """newLibraryWithSource:options:error:; CompileError with the compiler's log (the NSError) when it fails."""
  c, S = state.calls, state.calls.S
  opts, text, err = compile_options(state), c.nsstring(src), ctypes.c_void_p()
  try: lib = c.id_id_id_err(state.device, S.newLibraryWithSource_options_error_, text, opts, ctypes.byref(err))
  finally:
    c.release(text)
    c.release(opts)
  if not lib:
    raise CompileError(f"{state.label}: the Metal compiler rejected {f'kernel {name}' if name else 'a kernel'} "
                       f"(MSL {msl_version_str(state.msl_version)})", c.error_text(err.value), BUG_HINT)
  c.release(err.value)  # warnings may come back with a library; they are dropped
  return lib


def library_from_metallib(state: MetalState, data: bytes, name: str) -> int:
  c, S = state.calls, state.calls.S
  dd, err = state.rt.dispatch_data(data), ctypes.c_void_p()
  try: lib = c.id_id_err(state.device, S.newLibraryWithData_error_, dd, ctypes.byref(err))
  finally: c.release(dd)
  if not lib: raise PluginError(f"{state.label}: Metal cannot load the .metallib of kernel {name}: {c.error_text(err.value)}",
                                "clear the compile cache (plugrt cache clear); the metallib may be for another OS")
  return lib


def offline_tools(state: MetalState) -> tuple[str, str, str] | None:
  """(xcrun, the metal tool's path, its version line) when Xcode's metal and metallib tools are here and not turned off."""
  ctx = state.info.context
  if not ctx.flag("PLUGRT_METAL_OFFLINE", True) or not (xcrun := ctx.which("xcrun")): return None
  try:
    metal = subprocess.run([xcrun, "-sdk", "macosx", "--find", "metal"], capture_output=True, text=True, timeout=30)
    lib = subprocess.run([xcrun, "-sdk", "macosx", "--find", "metallib"], capture_output=True, text=True, timeout=30)
    if metal.returncode or lib.returncode: return None  # Command Line Tools without Xcode have no metal compiler
    ver = subprocess.run([xcrun, "-sdk", "macosx", "metal", "--version"], capture_output=True, text=True, timeout=30)
  except (OSError, subprocess.SubprocessError): return None
  return xcrun, metal.stdout.strip(), (ver.stdout.strip().splitlines() or ["?"])[0]


def compile_metallib(xcrun: str, src: str, version: tuple[int, int]) -> bytes:
  with tempfile.TemporaryDirectory(prefix="plugrt-metal-") as d:
    msl, air, out = (os.path.join(d, f) for f in ("kernel.metal", "kernel.air", "kernel.metallib"))
    with open(msl, "w", encoding="utf-8") as f: f.write(src)
    steps = ([xcrun, "-sdk", "macosx", "metal", "-x", "metal", f"-std=metal{msl_version_str(version)}", "-fno-fast-math", "-c", msl, "-o", air],
             [xcrun, "-sdk", "macosx", "metallib", air, "-o", out])
    for cmd in steps:
      r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
      if r.returncode: raise CompileError(f"Xcode's {cmd[3]} tool rejected a kernel (MSL {msl_version_str(version)})", r.stderr or r.stdout, BUG_HINT)
    with open(out, "rb") as f: return f.read()


class MetalCompiler(Compiler):
  name = "METAL"
  cache_namespace = "metal"

  def __init__(self, device: DeviceInfo):
    super().__init__(device)
    self.state = state_of(device)
    self.renderer = MetalRenderer(self.state.label, self.state.msl_version)
    self.offline = offline_tools(self.state)

  def render(self, kernel: Kernel) -> str: return self.renderer.render(kernel)

  def toolchain(self) -> tuple[str, ...]:
    tools = f"offline: {self.offline[2]}" if self.offline else "newLibraryWithSource"
    return (f"macOS {platform.mac_ver()[0] or '?'}", f"MSL {msl_version_str(self.state.msl_version)}", self.state.name, tools)

  def compile_uncached(self, src: str) -> bytes:
    if self.offline: return frame(METALLIB, compile_metallib(self.offline[0], src, self.state.msl_version))
    lib = library_from_source(self.state, src)
    binary = frame(SOURCE, src.encode())
    fresh = self.state.fresh
    if (old := fresh.pop(binary, None)): self.state.calls.release(old)
    fresh[binary] = lib
    while len(fresh) > FRESH_KEEP: self.state.calls.release(fresh.pop(next(iter(fresh))))
    return binary


def load_library(state: MetalState, lib: bytes, name: str) -> Any:
  """The MTLLibrary of a compiled binary: the one compile_uncached just built, else built now."""
  if (fresh := state.fresh.pop(lib, None)): return fresh
  kind, payload = unframe(lib, name)
  return library_from_metallib(state, payload, name) if kind == METALLIB else library_from_source(state, payload.decode(), name)
