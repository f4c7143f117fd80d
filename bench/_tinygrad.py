"""tinygrad's side: installs tinygrad 0.14.0 if needed, then measures the same things as _plugrt.

How tinygrad 0.14 is driven here (read from its source, site-packages/tinygrad):
- renderer/compiler selection: `Device["CPU"].renderer` reads the DEV target, so
  `with Context(DEV="CPU:CLANG")` / `"CPU:LLVM"` picks ClangRenderer (clang subprocess,
  runtime/support/compiler_cpu.py) or CPULLVMRenderer (libLLVM through ctypes,
  runtime/support/compiler_llvm.py). CPU_LLVM=1 and CPU_CC=... are deprecated (asserted).
- the tiny kernel: UOps out[0] = x[0] + 1, then codegen.do_to_program (render + compile
  through the disk cache), PROGRAM.to_elf(), and Device["CPU"].runtime(elf), which is a
  CPUProgram called directly with the buffers' HCQBuffers: the "direct Program call" of ANCHORS.md.
- compile: renderer.compiler.compile(src) is the uncached compile; compile_cached(src)
  goes through the sqlite disk cache (helpers.diskcache_get: a SELECT then pickle.loads),
  whose file is $CACHEDB, read once at import (run.py points it at the benchmark's directory).

Import this module only after tinygrad is installed (ensure_installed) and CACHEDB is set.
"""
from __future__ import annotations

import importlib.metadata
import itertools
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from _common import per_call

VERSION = "0.14.0"
FIRST_RESULT = "from tinygrad import Tensor\nprint(Tensor([1, 2, 3]).add(1).numpy().tolist())\n"
IMPORT = "import tinygrad"
IMPORT_DEFAULT = "from tinygrad import Device; Device.DEFAULT"


def installed_version() -> str | None:
  try: return importlib.metadata.version("tinygrad")
  except importlib.metadata.PackageNotFoundError: return None


def ensure_installed(log: Callable[[str], None] = print) -> str:
  """Install tinygrad==0.14.0 with pip unless that version is there; returns "" or why it could not."""
  have = installed_version()
  if have == VERSION: return ""
  cmd = [sys.executable, "-m", "pip", "install", f"tinygrad=={VERSION}"]
  log(f"tinygrad {have or 'is not installed'}{' is installed' if have else ''}; the comparison needs {VERSION}: running {' '.join(cmd)}")
  p = subprocess.run(cmd, capture_output=True, text=True)
  for line in (p.stdout + p.stderr).strip().splitlines()[-6:]: log(f"  pip: {line}")
  importlib.invalidate_caches()
  if p.returncode != 0: return f"pip install tinygrad=={VERSION} failed (exit {p.returncode})"
  if (have := installed_version()) != VERSION: return f"after pip install, tinygrad is {have}, not {VERSION}"
  return ""


def eager_op(n: int) -> Callable[[], float]:
  """Seconds per `(t + 1).realize()` on a 16-float CPU tensor (its kernel compiled before timing), over n ops."""
  from tinygrad import Context, Tensor
  with Context(DEV="CPU"):
    t = Tensor([float(i) for i in range(16)], device="CPU").realize()
    if (t + 1).realize().tolist()[:2] != [1.0, 2.0]: raise RuntimeError("tinygrad eager op gave a wrong result")
  return lambda: per_call(lambda: (t + 1).realize(), n)


class TinygradCPU:
  """The tiny kernel on tinygrad's CPU device, per renderer (CLANG or LLVM)."""

  def __init__(self) -> None:
    from tinygrad import Context, Device
    self.Context, self.dev = Context, Device["CPU"]
    self._names = itertools.count()
    self._stamp = f"{os.getpid()}_{time.time_ns()}"
    self._programs: dict[str, tuple[Any, str]] = {}

  def renderer(self, name: str) -> tuple[Any, str]:
    """(the renderer, "") or (None, why it is not available)."""
    try:
      with self.Context(DEV=f"CPU:{name}"): ren = self.dev.renderer
      _ = ren.compiler  # the LLVM compiler loads libLLVM here
      return ren, ""
    except Exception as e: return None, f"tinygrad CPU:{name} not available: {type(e).__name__}: {e}"

  def why_not(self, name: str) -> str:
    """"" if the renderer `name` and its compiler can be used, else why not."""
    return self.renderer(name)[1]

  def toolchain(self, name: str) -> str:
    if name == "LLVM":
      with open("/proc/self/maps") as f: libs = {line.split()[-1] for line in f if "libLLVM" in line}
      return f"{', '.join(sorted(libs)) or 'libLLVM'} through ctypes, in-process"
    return f"{os.environ.get('CC', 'clang')} -c (an ELF object, linked by tinygrad's own loader)"

  def _program(self, name: str) -> tuple[Any, str]:
    """(the PROGRAM UOp, its source) of the tiny kernel, rendered and compiled through tinygrad's pipeline."""
    if name not in self._programs:
      from tinygrad import UOp, dtypes
      from tinygrad.codegen import do_to_program
      from tinygrad.uop.ops import KernelInfo
      out, x = UOp.param(0, dtypes.float32, (1,)), UOp.param(1, dtypes.float32, (1,))
      ast = out[0].store(x[0] + 1.0).sink(arg=KernelInfo("bench_tiny"), tag=1)  # tag=1: no optimisation passes
      prg = do_to_program(ast, self.renderer(name)[0])
      self._programs[name] = (prg, prg.src[2].arg)
    return self._programs[name]

  def launcher(self, name: str, n: int) -> Callable[[], float]:
    """Seconds per direct Program call, over n calls."""
    from tinygrad import dtypes
    from tinygrad.device import Buffer
    prg, _ = self._program(name)
    rt = self.dev.runtime(prg.to_elf())
    a = Buffer("CPU", 1, dtypes.float32).allocate()
    b = Buffer("CPU", 1, dtypes.float32, initial_value=b"\x00\x00\x80\x3f")  # 1.0
    ab, bb = a._buf, b._buf
    rt(ab, bb, wait=True)
    if bytes(a.as_memoryview()) != b"\x00\x00\x00\x40": raise RuntimeError(f"tinygrad {name}: tiny kernel gave {a.numpy()}, want [2.]")
    self._keep = (a, b)
    return lambda: per_call(lambda: rt(ab, bb), n)

  def fresh_compile(self, name: str) -> Callable[[], float]:
    """Seconds to compile one never-seen source (the tiny kernel under a new name), no cache."""
    comp = self.renderer(name)[0].compiler
    _, src = self._program(name)
    def once() -> float:
      fresh = src.replace("bench_tiny", f"tiny_{self._stamp}_{next(self._names)}")
      t = time.perf_counter()
      comp.compile(fresh)
      return time.perf_counter() - t
    return once

  def cache_hit(self, name: str, n: int, first_in_process: bool = False) -> Callable[[], float]:
    """Seconds per compile_cached() of a source already in the disk cache, over n calls."""
    comp = self.renderer(name)[0].compiler
    if comp.cachekey is None: raise RuntimeError("tinygrad's compiler cache is off (CCACHE=0)")
    src = self._program(name)[1].replace("bench_tiny", f"cached_{self._stamp}")
    comp.compile_cached(src)  # the miss that fills the cache
    return lambda: per_call(lambda: comp.compile_cached(src), n)
