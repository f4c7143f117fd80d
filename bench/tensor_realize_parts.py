"""Where a Tensor realize's host time goes on a device: x*2+y and x.sum() over 2^24 float32, each realize's wall time
with the device idle before it (median of 200), then cProfile's top functions by own time over 300 realizes.

    python bench/tensor_realize_parts.py [DEVICE]
"""
from __future__ import annotations

import cProfile
import pstats
import statistics
import sys
import time

from plugrt import Device, Tensor, dtypes


def main() -> None:
  dev = Device[sys.argv[1] if len(sys.argv) > 1 else Device.DEFAULT]
  name = dev.info.canonical
  n = 1 << 24
  x, y = Tensor.full(n, 1.5, dtypes.float32, name).realize(), Tensor.full(n, 0.5, dtypes.float32, name).realize()
  ops = {"x*2+y": lambda: (x * 2.0 + y).realize(), "x.sum()": lambda: x.sum().realize()}
  for label, op in ops.items():
    for _ in range(20): op()
    dev.synchronize()
    took = []
    for _ in range(200):
      t = time.perf_counter()
      op()
      took.append(time.perf_counter() - t)
      dev.synchronize()
    print(f"{name} {label}: host {statistics.median(took) * 1e6:.1f} us a realize (median of 200, the device idle before each)")
  for label, op in ops.items():
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(300):
      op()
      dev.synchronize()
    prof.disable()
    print(f"-- {label}: cProfile, own time per realize (us), top 18")
    st = pstats.Stats(prof)
    rows = sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:18]  # type: ignore[attr-defined]
    for (file, line, fn), (_, nc, tt, ct, _) in rows:
      print(f"  {tt / 300 * 1e6:7.2f} {ct / 300 * 1e6:8.2f}  {nc / 300:5.1f}x  {file.split('/')[-1]}:{line}({fn})")


if __name__ == "__main__":
  main()
