"""Host-side cost of NV's launch path against the fake GPU, on any machine with ptxas: the fast path (a resident
launch: 12 words into a command slot, a GPFIFO entry, fence, GP_PUT, doorbell) timed in batches of 400 while the
fake holds its channels (so the fake's decoding does not run meanwhile), and the wait=True round trip.

  python plugins/ops_nv/tests/fake_launch_bench.py
"""
from __future__ import annotations

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fake_gpu import FakeGPU
from test_nv_fake import fake_plugins

from plugrt import Buffer, dtypes
from plugrt.compiler import samples as K
from plugrt.registry import isolated


def main() -> None:
  gpu = FakeGPU()
  with isolated(fake_plugins(gpu), env={"NV": "1", "NV_PTX": "1", "PLUGRT_CACHE": "0"}) as reg:
    dev = reg.open("NV")
    prg = dev.program(K.saxpy_kernel())
    out, xb, yb = (Buffer(dev, 1024, dtypes.float32) for _ in range(3))
    args, kw = (out, xb, yb), {"global_size": (4, 1, 1), "local_size": (256, 1, 1), "vals": (3.0, 1024)}
    prg(*args, **kw)
    prg(*args, **kw)
    dev.synchronize()
    fast = []
    for _ in range(40):
      gpu.hang = True
      t = time.perf_counter()
      for _ in range(400): prg(*args, **kw)
      fast.append((time.perf_counter() - t) / 400)
      gpu.hang = False
      dev.synchronize()
    slow = []
    for _ in range(5):
      t = time.perf_counter()
      for _ in range(50): prg(*args, **kw, wait=True)
      slow.append((time.perf_counter() - t) / 50)
    print(f"fast-path launch, host side: min {min(fast) * 1e6:.2f} us, median {statistics.median(fast) * 1e6:.2f} us")
    print(f"wait=True launch round trip (fake GPU): min {min(slow) * 1e6:.1f} us")
  gpu.close()


if __name__ == "__main__":
  main()
