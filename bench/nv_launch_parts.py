"""Where an NV launch's host time goes, on the GPU machine: the whole `prg(a, b)` against its parts, each timed over
the same 400-launch batches as bench/nv.py's enqueue row (the median of 15).

  python bench/nv_launch_parts.py [--device NV]

Rows: `prg(a, b)` (the core's launch: lock, comparison with the prepared call, submit); `prepared.submit()` alone
(the backend's fast path: slot, payload, GPFIFO entry, fence, GP_PUT, doorbell); the same under the launch lock as the
core takes it; NV's machine code called directly (plugrt_nv.fastlaunch: the stores and a ctypes call); an empty call;
and how many of the timed launches took the slot path (a launch the fast path could not take: it should be none) and
how many prepared anew (the comparison missed: it should be none).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--device", default="NV")
  args = ap.parse_args()
  from plugrt import Buffer, Device, dtypes
  from plugrt.compiler.samples import tiny_kernel
  dev = Device[args.device]
  a, b = Buffer(dev, 1, dtypes.float32), Buffer.from_numpy(np.ones(1, np.float32), dev)
  prg = dev.program(tiny_kernel())
  counts = {"slot": 0, "prepare": 0}
  cls = type(prg)
  slot, prepare = getattr(cls, "_slot_launch", None), cls._prepare
  def counted_slot(self, *a, **k):  # type: ignore[no-untyped-def]
    counts["slot"] += 1
    return slot(self, *a, **k)
  def counted_prepare(self, *a, **k):  # type: ignore[no-untyped-def]
    counts["prepare"] += 1
    return prepare(self, *a, **k)
  if slot is not None: cls._slot_launch = counted_slot
  cls._prepare = counted_prepare

  def batch(fn, n: int = 400) -> float:
    dev.synchronize()
    t = time.perf_counter()
    for _ in range(n): fn()
    t = time.perf_counter() - t
    dev.synchronize()
    return t / n
  call = lambda: prg(a, b)
  t = time.perf_counter()
  while time.perf_counter() - t < 1.0: batch(call)  # the GPU's clocks up, every command slot touched
  counts.update(slot=0, prepare=0)
  rows = {"prg(a, b)": [batch(call) for _ in range(15)]}
  seen = dict(counts)
  if (p := getattr(prg, "_prepared", None)) is None:  # a tree whose programs launch by themselves (before the core owned it)
    print(f"prg(a, b)                        {statistics.median(rows['prg(a, b)']) * 1e6:7.2f} us   (this tree has no prepared call)")
    return 0
  lock = getattr(prg, "launch_lock", None)
  submit = p.submit
  rows["prepared.submit()"] = [batch(submit) for _ in range(15)]
  if lock is not None:
    def locked() -> None:
      with lock: submit()
    rows["with launch_lock: submit()"] = [batch(locked) for _ in range(15)]
  if (made := getattr(submit, "call", None)) is not None:  # NV's machine code (plugrt_nv.fastlaunch): its call alone
    import ctypes

    from plugrt_nv import fastlaunch
    native, at = fastlaunch.functions()[0], ctypes.addressof(made)  # type: ignore[index]
    rows["the machine code's call alone"] = [batch(lambda: native(at)) for _ in range(15)]
    if lock is not None:
      def native_then_lock() -> None:
        native(at)
        with lock: pass
      rows["the machine code, then the lock taken"] = [batch(native_then_lock) for _ in range(15)]

  if lock is not None:
    def lock_alone() -> None:
      with lock: pass
    rows["the lock taken alone"] = [batch(lock_alone) for _ in range(15)]
  rows["an empty Python call"] = [batch(lambda: None) for _ in range(15)]
  for name, got in rows.items(): print(f"{name:32} {statistics.median(got) * 1e6:7.2f} us   (min {min(got) * 1e6:.2f})")
  print(f"of the {15 * 400} timed prg(a, b): {seen['slot']} took the slot path, {seen['prepare']} were prepared anew")
  return 0


if __name__ == "__main__":
  sys.exit(main())
