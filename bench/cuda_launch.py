"""Where a CUDA launch's time goes, on the GPU machine: the C floor, raw ctypes calls, plugrt, cupy.

    python bench/cuda_launch.py [N]

Every row launches the same tiny kernel (out[0] = x[0] + 1, plugrt's cubin) N times, synchronizes once, and
reports microseconds per launch (the best of three rounds).
"""
from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from plugrt import Buffer, Device, dtypes
from plugrt.compiler.samples import tiny_kernel


def per_launch(fn, n: int, sync) -> float:
  best = 1e9
  for _ in range(3):
    t = time.perf_counter()
    for _ in range(n): fn()
    sync()
    best = min(best, (time.perf_counter() - t) / n)
  return best * 1e6


def main() -> None:
  n = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
  dev = Device["CUDA"]
  st = dev.info.state
  prg = dev.program(tiny_kernel())
  a, b = Buffer(dev, 1, dtypes.float32), Buffer.from_numpy(np.ones(1, np.float32), dev)
  rows = {}
  with tempfile.TemporaryDirectory() as d:
    cubin = os.path.join(d, "tiny.cubin")
    with open(cubin, "wb") as f: f.write(prg.lib)
    exe = os.path.join(d, "floor")
    here = os.path.dirname(os.path.abspath(__file__))
    p = subprocess.run(["nvcc", "-O2", "-o", exe, os.path.join(here, "cuda_launch_floor.c"), "-lcuda"], capture_output=True, text=True)
    if p.returncode == 0:
      for kind, label in ((0, "C floor, legacy default stream"), (1, "C floor, non-blocking stream")):
        out = subprocess.run([exe, cubin, "tiny", str(n), str(kind)], capture_output=True, text=True)
        rows[label] = min(float(x) for x in out.stdout.split()) if out.returncode == 0 else float("nan")
    else: print("nvcc failed:", p.stderr[-500:])
  sync = dev.synchronize
  prg(a, b)  # prepares the launch whose parameter array the raw rows below reuse
  u = ctypes.c_uint
  params = prg._prepared.args[9]  # the parameter array of the launch prg(a, b) prepared
  for loader, name in ((ctypes.CDLL, "CDLL (releases the GIL)"), (ctypes.PyDLL, "PyDLL (keeps the GIL)")):
    lib = loader("libcuda.so.1")
    for stream_kind in (0, 1):
      stream = ctypes.c_void_p(0)
      if stream_kind: lib.cuStreamCreate(ctypes.byref(stream), 1)
      args = (prg.fn, u(1), u(1), u(1), u(1), u(1), u(1), u(0), stream, params, None)
      launch = lib.cuLaunchKernel
      rows[f"ctypes {name}, {'non-blocking' if stream_kind else 'legacy default'} stream"] = per_launch(lambda a=args, f=launch: f(*a), n, sync)
  prg(a, b)
  rows["plugrt prg(a, b)"] = per_launch(lambda: prg(a, b), n, sync)
  try:
    import cupy as cp
    k = cp.RawKernel(r'extern "C" __global__ void tiny(float* out, const float* x) { out[0] = x[0] + 1.0f; }', "tiny")
    ca, cb = cp.zeros(1, cp.float32), cp.ones(1, cp.float32)
    rows["cupy RawKernel"] = per_launch(lambda: k((1,), (1,), (ca, cb)), n, cp.cuda.runtime.deviceSynchronize)
  except Exception as e: print("cupy:", type(e).__name__, e)
  for label, us in rows.items(): print(f"  {label:<58} {us:8.3f} us")
  _ = st


if __name__ == "__main__":
  main()
