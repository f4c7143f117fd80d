"""What limits CUDA copies and elementwise kernels, on the GPU machine (a study, not a comparison):
host memcpy bandwidth per thread count, staged H2D/D2H per chunk size and thread count, and elementwise kernel shapes.

    python bench/cuda_copy.py
"""
from __future__ import annotations

import ctypes
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from plugrt import Buffer, Device, KernelBuilder, dtypes


def best(fn, reps: int = 5) -> float:
  fn()
  return statistics.median(fn() for _ in range(reps))


def main() -> None:
  size = 256 << 20
  src, dst = np.ones(size, np.uint8), np.empty(size, np.uint8)
  for threads in (1, 4, 8, 16):
    pool = ThreadPoolExecutor(threads)
    def memcpy(threads: int = threads, pool: ThreadPoolExecutor = pool) -> float:
      step = size // threads
      t = time.perf_counter()
      for f in [pool.submit(ctypes.memmove, dst.ctypes.data + o, src.ctypes.data + o, step) for o in range(0, size, step)]: f.result()
      return size / (time.perf_counter() - t) / 1e9
    print(f"  host memcpy, {threads:2d} threads: {best(memcpy):7.2f} GB/s")
  dev = Device["CUDA"]
  st = dev.allocator.staging
  buf = Buffer(dev, size, dtypes.uint8)
  for chunk in (8 << 20, 16 << 20, 64 << 20):
    for threads in (4, 8, 16):
      for ring in (2, 3, 4):
        st.CHUNK, st.RING, st.threads, st.bufs, st.events = chunk, ring, threads, [], []
        def h2d() -> float:
          t = time.perf_counter(); buf.copyin(src); return size / (time.perf_counter() - t) / 1e9
        def d2h() -> float:
          t = time.perf_counter(); buf.copyout(dst); return size / (time.perf_counter() - t) / 1e9
        print(f"  staged chunk {chunk >> 20:3d} MiB, {threads:2d} threads, ring {ring}: H2D {best(h2d):6.2f} GB/s, D2H {best(d2h):6.2f} GB/s")
  n = 1 << 28
  x, y, out = (Buffer(dev, n, dtypes.float32) for _ in range(3))
  for per_thread in (1, 2, 4):
    for blocks in (n // 256 // per_thread, 132 * 16, 132 * 32):
      b = KernelBuilder("axpy_shape")
      o, xb, yb = b.buffer("out", dtypes.float32), b.buffer("x", dtypes.float32), b.buffer("y", dtypes.float32)
      total = b.num_groups(0) * b.local_size(0)
      with b.range(per_thread) as k:
        with b.range((n // per_thread + total - 1) // total) as s:  # grid-stride over the rest
          i = (s * total + b.global_id(0)) + k * (n // per_thread)
          with b.if_(i < n):
            o[i] = 2.0 * xb[i] + yb[i]
      prg = dev.program(b.finish())
      gbs = best(lambda prg=prg, blocks=blocks: 12 * n / prg(out, x, y, global_size=(blocks, 1, 1), local_size=(256, 1, 1), wait=True) / 1e9, 7)
      print(f"  elementwise {per_thread} per thread (strided), {blocks:8d} blocks of 256: {gbs:8.1f} GB/s")


if __name__ == "__main__":
  main()
