"""The three sides of bench/cl.py, each driving the same tiny kernel (out[0] = x[0] + 1 on 1-float buffers) on
the same OpenCL device: plugrt's CL backend, tinygrad 0.14's CL device, and pyopencl used directly.

Every measurement is a callable returning seconds (per call, where it makes N calls), so cl.py can alternate
the sides repetition by repetition. Kernel names carry a per-run stamp and a counter: a "new" kernel is new
to every cache (plugrt's, tinygrad's sqlite, PoCL's own kernel cache).

How tinygrad 0.14's CL is driven (read from its source, tinygrad/runtime/ops_cl.py): Device["CL"] (selected
by DEV=CL or GPU=1; CL=1 is refused as deprecated) opens platform 0's first GPU, else default, device through
the system's libOpenCL. Its renderer's compiler is a no-op (the "binary" of a PROGRAM is the source); a
CLProgram builds the source through CLCompiler.compile_cached (clBuildProgram + CL_PROGRAM_BINARIES, cached in
sqlite), then builds again from that binary, and sets every argument on every call.
"""
from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable
from typing import Any

from _common import NotAvailable, per_call

TINY_CL = "__kernel void {name}(__global float* out, __global const float* x) {{ out[0] = x[0] + 1.0f; }}"
ONE, TWO = b"\x00\x00\x80\x3f", b"\x00\x00\x00\x40"  # 1.0f, 2.0f


class _Names:
  def __init__(self) -> None:
    self._n, self._stamp = itertools.count(), f"{os.getpid()}_{time.time_ns()}"
  def __call__(self, what: str) -> str: return f"{what}_{self._stamp}_{next(self._n)}"


class PlugrtCL:
  """plugrt's CL device through its public API: Program calls, the compiler, the disk cache."""

  def __init__(self) -> None:
    from plugrt import Buffer, Device, dtypes
    from plugrt.errors import PlugrtError
    try: self.dev = Device["CL"]
    except PlugrtError as e: raise NotAvailable(f"plugrt's CL device cannot open: {e}") from None
    self.Buffer, self.dtypes, self.names = Buffer, dtypes, _Names()
    self.comp = self.dev.compiler_for("CL")
    st = self.dev.info.state
    self.device_label = f"{st.device.name.strip()} on {st.platform.name.strip()} ({st.platform.version.strip()})"

  def _kernel(self, name: str) -> Any:
    from plugrt.compiler.samples import tiny_kernel
    return tiny_kernel(name)

  def _bufs(self) -> tuple[Any, Any]:
    a, b = self.Buffer(self.dev, 1, self.dtypes.float32), self.Buffer(self.dev, 1, self.dtypes.float32)
    b.copyin(memoryview(bytearray(ONE)))
    return a, b

  def _check(self, a: Any, what: str) -> None:
    if a.tobytes() != TWO: raise RuntimeError(f"plugrt CL {what}: the tiny kernel gave {a.numpy()}, want [2.]")

  def launcher(self, n: int, sync: bool) -> Callable[[], float]:
    prg = self.dev.program(self._kernel("tiny"))
    a, b = self._bufs()
    prg(a, b, wait=True)
    self._check(a, "launch")
    sync_fn = self.dev.synchronize
    if sync: return lambda: per_call(lambda: (prg(a, b), sync_fn()), n)
    def pipelined() -> float:
      t = time.perf_counter()
      for _ in range(n): prg(a, b)
      sync_fn()
      return (time.perf_counter() - t) / n
    return pipelined

  def compile(self) -> Callable[[], float]:
    def once() -> float:
      src = self.comp.render(self._kernel(self.names("c")))
      t = time.perf_counter()
      self.comp.compile_uncached(src)
      dt = time.perf_counter() - t
      self.dev.info.state.fresh.clear()  # nothing will load these
      return dt
    return once

  def first_result(self) -> Callable[[], float]:
    a, b = self._bufs()
    def once() -> float:
      k = self._kernel(self.names("f"))
      t = time.perf_counter()
      prg = self.dev.load(k.name, self.comp.compile_uncached(self.comp.render(k)), k.signature)
      prg(a, b)
      self.dev.synchronize()
      dt = time.perf_counter() - t
      self._check(a, "first result")
      return dt
    return once

  def cache_hit(self, n: int) -> Callable[[], float]:
    k = self._kernel(self.names("h"))
    src = self.comp.render(k)
    self.comp.compile(src)  # the miss that fills the disk cache
    self.dev.info.state.fresh.clear()
    def once() -> float:  # source already compiled once: disk-cache read + clCreateProgramWithBinary + the kernel object
      return per_call(lambda: self.dev.load(k.name, self.comp.compile(src), k.signature), n)
    return once


class TinygradCL:
  """tinygrad 0.14's CL device: its CLProgram and CLCompiler, called directly."""

  def __init__(self) -> None:
    try:
      from tinygrad import Device
      self.dev = Device["CL"]
    except Exception as e: raise NotAvailable(f"tinygrad's CL device cannot open: {type(e).__name__}: {e}") from None
    from tinygrad.device import TinyELF
    self.TinyELF, self.names = TinyELF, _Names()
    prg = self._program()
    self.elf = prg.to_elf()
    self.src: str = self.elf.lib.decode()
    self.device_label = f"{self.dev.device_name} (driver {self.dev.driver_version})"

  def _program(self) -> Any:
    from tinygrad import UOp, dtypes
    from tinygrad.codegen import do_to_program
    from tinygrad.uop.ops import KernelInfo
    out, x = UOp.param(0, dtypes.float32, (1,)), UOp.param(1, dtypes.float32, (1,))
    ast = out[0].store(x[0] + 1.0).sink(arg=KernelInfo("bench_tiny"), tag=1)  # tag=1: no optimisation passes
    return do_to_program(ast, self.dev.renderer)

  def _elf(self, name: str) -> Any:
    e = self.elf
    return self.TinyELF(self.src.replace("bench_tiny", name).encode(), name, e.target, e.signature)

  def _bufs(self) -> tuple[Any, Any, Any]:
    from tinygrad import dtypes
    from tinygrad.device import Buffer
    a = Buffer("CL", 1, dtypes.float32).allocate()
    b = Buffer("CL", 1, dtypes.float32, initial_value=ONE)
    self._keep = (a, b)
    return a, a._buf, b._buf

  def launcher(self, n: int, sync: bool) -> Callable[[], float]:
    rt = self.dev.runtime(self.elf)
    a, ab, bb = self._bufs()
    rt(ab, bb, wait=True)
    if bytes(a.as_memoryview()) != TWO: raise RuntimeError(f"tinygrad CL: the tiny kernel gave {a.numpy()}, want [2.]")
    sync_fn = self.dev.synchronize
    if sync: return lambda: per_call(lambda: (rt(ab, bb), sync_fn()), n)
    def pipelined() -> float:
      t = time.perf_counter()
      for _ in range(n): rt(ab, bb)
      sync_fn()
      return (time.perf_counter() - t) / n
    return pipelined

  def compile(self) -> Callable[[], float]:
    comp = self.dev.cl_compiler
    def once() -> float:
      src = self.src.replace("bench_tiny", self.names("c"))
      t = time.perf_counter()
      comp.compile(src)
      return time.perf_counter() - t
    return once

  def first_result(self) -> Callable[[], float]:
    _, ab, bb = self._bufs()
    def once() -> float:
      elf = self._elf(self.names("f"))
      t = time.perf_counter()
      rt = self.dev.runtime(elf)  # compile_cached (a miss: build + binary), then a build from that binary
      rt(ab, bb)
      self.dev.synchronize()
      return time.perf_counter() - t
    return once

  def cache_hit(self, n: int) -> Callable[[], float]:
    elf = self._elf(self.names("h"))
    self.dev.runtime(elf)  # the miss that fills the sqlite cache
    return lambda: per_call(lambda: self.dev.runtime(elf), n)  # sqlite SELECT + clCreateProgramWithBinary + build


class PyopenclCL:
  """pyopencl on its own, as its documentation uses it: cl.Program(ctx, src).build(), kernel(queue, gs, ls, *args)."""

  def __init__(self, platform_hint: str = "") -> None:
    import pyopencl as cl
    self.cl, self.names = cl, _Names()
    plats = [p for p in cl.get_platforms() if p.get_devices()]
    if platform_hint: plats = [p for p in plats if platform_hint.lower() in (p.name + p.version).lower()] or plats
    if not plats: raise NotAvailable("pyopencl finds no OpenCL device")
    self.device = plats[0].get_devices()[0]
    self.ctx = cl.Context([self.device])
    self.queue = cl.CommandQueue(self.ctx, self.device, cl.command_queue_properties.PROFILING_ENABLE)
    self.device_label = f"{self.device.name.strip()} on {plats[0].name.strip()}"

  def _bufs(self) -> tuple[Any, Any]:
    cl = self.cl
    a = cl.Buffer(self.ctx, cl.mem_flags.READ_WRITE, 4)
    b = cl.Buffer(self.ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=bytearray(ONE))
    return a, b

  def _kernel(self, name: str) -> Any:
    return self.cl.Program(self.ctx, TINY_CL.format(name=name)).build().__getattr__(name)

  def launcher(self, n: int, sync: bool) -> Callable[[], float]:
    knl = self._kernel("tiny")
    a, b = self._bufs()
    q, gs = self.queue, (1,)
    knl(q, gs, None, a, b).wait()
    out = bytearray(4)
    self.cl.enqueue_copy(q, out, a)
    if bytes(out) != TWO: raise RuntimeError(f"pyopencl: the tiny kernel gave {out!r}")
    call = lambda: knl(q, gs, None, a, b)
    if sync: return lambda: per_call(lambda: (call(), q.finish()), n)
    def pipelined() -> float:
      t = time.perf_counter()
      for _ in range(n): call()
      q.finish()
      return (time.perf_counter() - t) / n
    return pipelined

  def compile(self) -> Callable[[], float]:
    cl = self.cl
    def once() -> float:  # source -> binary, as the other two do it: build, then CL_PROGRAM_BINARIES
      src = TINY_CL.format(name=self.names("c"))
      t = time.perf_counter()
      prg = cl._cl._Program(self.ctx, src)
      prg._build(b"", [self.device])
      prg.get_info(cl.program_info.BINARIES)
      return time.perf_counter() - t
    return once

  def first_result(self) -> Callable[[], float]:
    a, b = self._bufs()
    def once() -> float:
      name = self.names("f")
      t = time.perf_counter()
      self._kernel(name)(self.queue, (1,), None, a, b)
      self.queue.finish()
      return time.perf_counter() - t
    return once

  def cache_hit(self, n: int) -> Callable[[], float]:
    name = self.names("h")
    self._kernel(name)  # on PoCL pyopencl leaves caching to the driver: PoCL's kernel cache now has this source
    return lambda: per_call(lambda: self._kernel(name), n)


def c_floor(workdir: str, n: int) -> tuple[float, float] | str:
  """(enqueue only, enqueue + clFinish) in us per launch of the tiny kernel from C through the system's libOpenCL,
  or why it could not be measured. Prototypes are declared here: no OpenCL headers needed, only a C compiler."""
  import shutil
  import subprocess
  cc = shutil.which(os.environ.get("CC", "") or "clang") or shutil.which("cc")
  if cc is None: return "no C compiler"
  src, exe = os.path.join(workdir, "floor.c"), os.path.join(workdir, "floor")
  with open(src, "w") as f: f.write(C_FLOOR.replace("N_CALLS", str(n)))
  p = subprocess.run([cc, "-O2", src, "-o", exe, "-l:libOpenCL.so.1"], capture_output=True, text=True)
  if p.returncode != 0: return f"could not build the C floor: {p.stderr.strip()[-200:]}"
  p = subprocess.run([exe], capture_output=True, text=True, timeout=300)
  try: return tuple(float(x) for x in p.stdout.split()[:2])  # type: ignore[return-value]
  except ValueError: return f"the C floor failed: {p.stdout.strip()[-200:]} {p.stderr.strip()[-200:]}"


C_FLOOR = r"""
#include <stdio.h>
#include <stdint.h>
#include <time.h>
typedef void *P; typedef int32_t I; typedef uint32_t U; typedef uint64_t Q;
I clGetPlatformIDs(U, P *, U *); I clGetDeviceIDs(P, Q, U, P *, U *);
P clCreateContext(P, U, P *, P, P, I *); P clCreateCommandQueue(P, P, Q, I *);
P clCreateProgramWithSource(P, U, const char **, size_t *, I *); I clBuildProgram(P, U, P *, const char *, P, P);
P clCreateKernel(P, const char *, I *); P clCreateBuffer(P, Q, size_t, P, I *); I clSetKernelArg(P, U, size_t, const void *);
I clEnqueueNDRangeKernel(P, P, U, size_t *, size_t *, size_t *, U, P *, P *); I clFinish(P);
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main(void) {
  P plat, dev; I err; U np = 0;
  if (clGetPlatformIDs(1, &plat, &np) || !np || clGetDeviceIDs(plat, 0xFFFFFFFFu, 1, &dev, 0)) { printf("no-device\n"); return 1; }
  P ctx = clCreateContext(0, 1, &dev, 0, 0, &err), q = clCreateCommandQueue(ctx, dev, 0, &err);
  const char *s = "__kernel void tiny(__global float *o, __global const float *x) { o[0] = x[0] + 1.0f; }";
  P prg = clCreateProgramWithSource(ctx, 1, &s, 0, &err);
  if (clBuildProgram(prg, 1, &dev, "", 0, 0)) { printf("build-failed\n"); return 1; }
  P k = clCreateKernel(prg, "tiny", &err), a = clCreateBuffer(ctx, 1, 4, 0, &err), b = clCreateBuffer(ctx, 1, 4, 0, &err);
  clSetKernelArg(k, 0, sizeof(P), &a); clSetKernelArg(k, 1, sizeof(P), &b);
  size_t g[1] = {1};
  double best_e = 1e9, best_f = 1e9;
  for (int r = 0; r < 5; r++) {
    double t = now();
    for (int i = 0; i < N_CALLS; i++) clEnqueueNDRangeKernel(q, k, 1, 0, g, 0, 0, 0, 0);
    clFinish(q);
    double e = (now() - t) / N_CALLS * 1e6;
    t = now();
    for (int i = 0; i < N_CALLS; i++) { clEnqueueNDRangeKernel(q, k, 1, 0, g, 0, 0, 0, 0); clFinish(q); }
    double f = (now() - t) / N_CALLS * 1e6;
    if (e < best_e) best_e = e;
    if (f < best_f) best_f = f;
  }
  printf("%.3f %.3f\n", best_e, best_f);
  return 0;
}
"""
