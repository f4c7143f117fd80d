"""Host-side cost of NV's launch path against the fake GPU, on any machine with ptxas: the fast path (a resident
launch: its slot's payload word, or 12 words into a slot the launch did not fill before, a GPFIFO entry, fence,
GP_PUT, doorbell) timed in batches of 400 while the fake holds its channels (so the fake's decoding does not run
meanwhile); with --bytecodes, the Python bytecodes one fast-path launch executes instead (a count: the same every run,
whatever else the machine does).

  python plugins/ops_nv/tests/fake_launch_bench.py [--bytecodes]
"""
from __future__ import annotations

import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fake_gpu import FakeGPU
from test_nv_fake import fake_plugins

from plugrt import Buffer, dtypes
from plugrt.compiler import samples as K
from plugrt.registry import isolated


def main() -> None:
  gpu = FakeGPU()
  try:
    with isolated(fake_plugins(gpu), env={"NV": "1", "NV_PTX": "1", "PLUGRT_CACHE": "0"}) as reg:
      dev = reg.open("NV")
      prg = dev.program(K.saxpy_kernel())
      out, xb, yb = (Buffer(dev, 1024, dtypes.float32) for _ in range(3))
      args, kw = (out, xb, yb), {"global_size": (4, 1, 1), "local_size": (256, 1, 1), "vals": (3.0, 1024)}
      prg(*args, **kw)
      prg(*args, **kw)
      dev.synchronize()
      (count_bytecodes if "--bytecodes" in sys.argv else time_launches)(gpu, dev, prg, args, kw)
  finally: gpu.close()


def count_bytecodes(gpu: FakeGPU, dev: Any, prg: Any, args: tuple, kw: dict) -> None:
  """The Python bytecodes of one fast-path launch, once every command slot was written (each then takes only its payload)."""
  for _ in range(600): prg(*args, **kw)
  dev.synchronize()
  count = [0]

  def trace(frame: Any, event: str, arg: Any) -> Any:
    frame.f_trace_opcodes = True
    if event == "opcode": count[0] += 1
    return trace
  gpu.hang = True
  sys.settrace(trace)
  for _ in range(100): prg(*args, **kw)
  sys.settrace(None)
  gpu.hang = False
  dev.synchronize()
  print(f"fast-path launch: {count[0] / 100:.0f} Python bytecodes")


def time_launches(gpu: FakeGPU, dev: Any, prg: Any, args: tuple, kw: dict) -> None:
  """The fast path's host time in batches of 400 (the fake holding its channels), then the wait=True round trip."""
  fast = []
  for _ in range(40):
    gpu.hang = True
    t = time.perf_counter()
    for _ in range(400): prg(*args, **kw)
    fast.append((time.perf_counter() - t) / 400)
    gpu.hang = False
    dev.synchronize()
  print(f"fast-path launch, host side: min {min(fast) * 1e6:.2f} us, median {statistics.median(fast) * 1e6:.2f} us")


if __name__ == "__main__":
  main()
