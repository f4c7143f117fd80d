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
from plugrt.compiler.samples import tiny_kernel
from plugrt.errors import PlugrtError

# The "first result" script: the same one-liner as tinygrad's.
FIRST_RESULT = "from plugrt import Tensor\nprint(Tensor([1, 2, 3]).add(1).numpy().tolist())\n"

# import + discovery: every installed plugin imported, declared and probed (ANCHORS.md's "import + discover every
# installed plugin"); IMPORT_DEFAULT also opens the default device, as tinygrad's Device.DEFAULT does
IMPORT_DISCOVERY = "import plugrt; plugrt.Device.available()"
IMPORT_DEFAULT = "import plugrt; plugrt.Device.DEFAULT; plugrt.Device.available()"


def eager_op(n: int) -> Callable[[], float]:
  """Seconds per `(t + 1).realize()` on a 16-float tensor (the kernel compiled before timing), over n ops."""
  from plugrt import Tensor
  t = Tensor([float(i) for i in range(16)], device="CPU")
  if (t + 1).realize().tolist()[:2] != [1.0, 2.0]: raise RuntimeError("plugrt eager op gave a wrong result")
  return lambda: per_call(lambda: (t + 1).realize(), n)


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
    if compiler == "LLVM" and hasattr(comp, "api"):  # PLUGRT_CPU_LIBLLVM: the system's libLLVM
      return f"{comp.api.path} through ctypes (PLUGRT_CPU_LIBLLVM), in-process"
    if compiler == "LLVM":
      import llvmlite.binding
      return f"llvmlite {llvmlite.__version__} (LLVM {'.'.join(map(str, llvmlite.binding.llvm_version_info))}), in-process"
    return f"{getattr(comp, 'cc', 'clang')} -c (a relocatable object, linked in-process by LLVM's JIT)"

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

  def cache_hit(self, compiler: str, n: int, first_in_process: bool = False) -> Callable[[], float]:
    """Seconds per compile() of a source already in the disk cache, over n calls (first_in_process: each call as a
    process's first, with the compiler's memory of binaries emptied before it: the disk read and hash check)."""
    comp = self.dev.compiler_for(compiler)
    src = comp.render(tiny_kernel(f"cached_{self._stamp}"))
    comp.compile(src)  # the miss that fills the cache
    if first_in_process:
      def first() -> None:
        comp.drop_memory()
        comp.compile(src)
      return lambda: per_call(first, n)
    return lambda: per_call(lambda: comp.compile(src), n)
