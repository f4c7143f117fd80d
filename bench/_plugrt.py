"""plugrt's side: the CPU device's programs, compilers and disk cache, through its public API.

Import this module only after the caller has pointed PLUGRT_CACHE_DIR at the
benchmark's own directory (run.py does): the disk cache reads it once.
"""
from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable

from _common import per_call

from plugrt import Buffer, Device, dtypes
from plugrt.errors import PlugrtError
from plugrt.testing.kernels import tiny_kernel

# The "first result" script: plugrt has no Tensor yet, so this is the same work through the
# Buffer/kernel API: build the add-one kernel, open the default device, program it (a disk-cache
# hit once warmed), copy [1, 2, 3] in, run, read it back as numpy. Replace with the Tensor
# one-liner when plugrt's Tensor lands.
FIRST_RESULT = """\
import array
from plugrt import Buffer, Device, KernelBuilder, dtypes
b = KernelBuilder("add_one")
out, x = b.buffer("out", dtypes.int32), b.buffer("x", dtypes.int32)
i = b.global_id(0)
out[i] = x[i] + 1
dev = Device[Device.DEFAULT]
prg = dev.program(b.finish())
src = Buffer(dev, 3, dtypes.int32).copyin(array.array("i", [1, 2, 3]))
dst = Buffer(dev, 3, dtypes.int32)
prg(dst, src, global_size=(3, 1, 1), wait=True)
print(dst.numpy().tolist())
"""

IMPORT_DISCOVERY = "import plugrt; plugrt.Device.DEFAULT; plugrt.Device.available()"


class PlugrtCPU:
  """The tiny kernel (out[0] = x[0] + 1) on plugrt's CPU device, per compiler."""

  def __init__(self) -> None:
    self.dev = Device["CPU"]
    self._names = itertools.count()
    self._stamp = f"{os.getpid()}_{time.time_ns()}"

  def why_not(self, compiler: str) -> str:
    """"" if the device's compiler `compiler` can be used, else why not."""
    try: self.dev.compiler_for(compiler)
    except (PlugrtError, ImportError) as e: return f"plugrt's {compiler} compiler is not available: {e}"
    return ""

  def toolchain(self, compiler: str) -> str:
    """What compiles, for the notes (reads plugrt_cpu's compiler attributes where they are)."""
    comp = self.dev.compiler_for(compiler)
    if compiler == "LLVM":
      import llvmlite.binding
      return f"llvmlite {llvmlite.__version__} (LLVM {'.'.join(map(str, llvmlite.binding.llvm_version_info))}), in-process"
    return f"{getattr(comp, 'cc', 'clang')} -c, then {getattr(comp, 'ld', 'ld')} -shared"

  def launcher(self, compiler: str, n: int) -> Callable[[], float]:
    """Seconds per direct Program call, over n calls."""
    prg = self.dev.program(tiny_kernel(), compiler)
    a, b = Buffer(self.dev, 1, dtypes.float32), Buffer(self.dev, 1, dtypes.float32)
    b.copyin(memoryview(bytearray(b"\x00\x00\x80\x3f")))  # 1.0
    prg(a, b, wait=True)
    if a.tobytes() != b"\x00\x00\x00\x40": raise RuntimeError(f"plugrt {compiler}: tiny kernel gave {a.numpy()}, want [2.]")
    return lambda: per_call(lambda: prg(a, b), n)

  def fresh_compile(self, compiler: str) -> Callable[[], float]:
    """Seconds to compile one never-seen source (the tiny kernel under a new name), no cache."""
    comp = self.dev.compiler_for(compiler)
    def once() -> float:
      src = comp.render(tiny_kernel(f"tiny_{self._stamp}_{next(self._names)}"))
      t = time.perf_counter()
      comp.compile_uncached(src)
      return time.perf_counter() - t
    return once

  def cache_hit(self, compiler: str, n: int) -> Callable[[], float]:
    """Seconds per compile() of a source already in the disk cache, over n calls."""
    comp = self.dev.compiler_for(compiler)
    src = comp.render(tiny_kernel(f"cached_{self._stamp}"))
    comp.compile(src)  # the miss that fills the cache
    return lambda: per_call(lambda: comp.compile(src), n)
