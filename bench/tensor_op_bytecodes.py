"""Python bytecodes and calls one Tensor op executes on the CPU device: `x*2+y` built, `(x*2+y).realize()` and
`x.sum().realize()` over 1024 float32 (one launch), and the sum over 4096 (two launches: partial results, then their
sum, as a large one runs on a GPU). A count, not a time: the
same every run whatever else the machine does, so two trees compare exactly (run it in each). It counts Python's own
work (not C calls' insides, nor the kernel).

    PLUGRT_CPU_THREADS=1 python bench/tensor_op_bytecodes.py
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from plugrt.frontend import tensor as T
from plugrt.frontend.tensor import Tensor


def count(fn: Callable[[], Any], reps: int = 10) -> tuple[float, float]:
  counts = {"opcode": 0, "call": 0}

  def trace(frame: Any, event: str, arg: Any) -> Any:
    frame.f_trace_opcodes = True
    if event in counts: counts[event] += 1
    return trace
  sys.settrace(trace)
  try:
    for _ in range(reps): fn()
  finally: sys.settrace(None)
  return counts["opcode"] / reps, counts["call"] / reps


def main() -> None:
  T._PARTIAL_MIN, T._REDUCE_CHUNKS = 4, 1  # past 1024 elements a sum takes two launches, as a 2^28-element one does on a GPU
  n = 1024
  x, y = (Tensor(np.random.default_rng(k).random(n, dtype=np.float32), device="CPU") for k in range(2))
  x4 = Tensor(np.random.default_rng(2).random(4 * n, dtype=np.float32), device="CPU")
  ops = {"build x*2+y": lambda: x * 2 + y, "(x*2+y).realize()": lambda: (x * 2 + y).realize(), "x.sum().realize()": lambda: x.sum().realize(),
         "x4.sum() 2 launches": lambda: x4.sum().realize()}
  for name, op in ops.items():
    for _ in range(20): op()  # kernels built, caches warm
    x.node.device.synchronize()
    codes, calls = count(op)
    print(f"{name:20s} {codes:6.0f} bytecodes, {calls:4.0f} Python calls")


if __name__ == "__main__":
  main()
