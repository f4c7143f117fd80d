"""NV on the GPU machine, side by side with the CUDA backend (libcuda) and cupy in one process.

    python bench/nv.py [--quick] [--json PATH]

Rows (medians over repetitions; each side runs the same kernel text: plugrt renders it, cupy gets it as CUDA C):
- launch, enqueue: the tiny kernel (out[0] = x[0] + 1), N launches timed without the final synchronize (N below
  NV's command slots, so no launch waits for the GPU): what a launch costs the calling thread.
- launch, N then sync: 2000 launches then one synchronize, per launch (the GPU's own pace shows here).
- dependent chain: 1000 launches of `o[0] = x[0] + 1`, alternating two int32 buffers so each reads what the last
  wrote, then synchronize; per chain, and the result is checked (1000).
- H2D / D2H: 256 MiB from / to a numpy array (pageable; plugrt stages both NV and CUDA through pinned buffers).
- D2D: 1 GiB buffer to buffer (NV: a copy kernel, as for every device copy from 1 MiB); GB/s counts the bytes copied once.
Ratio: other / NV for times, NV / other for bandwidths, so above 1 is NV ahead. Each side first launches for a second
(GPU clocks up; NV's command slots all touched), then measures; figures are medians of 15 repetitions (3 with --quick);
the launch rows also print the best repetition, and the JSON keeps every one.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

TARGETS = {"enqueue": ("<= 1.5 us", 1.5e-6)}
MiB = 1 << 20


SAMPLES: dict[str, list[float]] = {}  # every repetition, for the JSON: "side/row" -> samples


def med(fn: Callable[[], float], reps: int, key: str = "") -> float:
  fn()  # warm-up
  got = [fn() for _ in range(reps)]
  if key: SAMPLES[key] = got
  return statistics.median(got)


def int_inc_kernel() -> Any:
  from plugrt import dtypes
  from plugrt.compiler import samples as K
  b = K.KernelBuilder("inc")
  o, x = b.buffer("o", dtypes.int32), b.buffer("x", dtypes.int32)
  o[0] = x[0] + 1
  return b.finish()


def plugrt_side(name: str, quick: bool) -> dict[str, float]:
  from plugrt import Buffer, Device, dtypes
  from plugrt.compiler.samples import tiny_kernel
  dev = Device[name]
  reps = 3 if quick else 15
  out: dict[str, float] = {}
  a, b = Buffer(dev, 1, dtypes.float32), Buffer.from_numpy(np.ones(1, np.float32), dev)
  prg = dev.program(tiny_kernel())

  def enqueue(n: int = 400) -> float:
    dev.synchronize()
    t = time.perf_counter()
    for _ in range(n): prg(a, b)
    t = time.perf_counter() - t
    dev.synchronize()
    return t / n
  t = time.perf_counter()
  while time.perf_counter() - t < 1.0: enqueue()  # a second of work first: the GPU's clocks rise, NV's command slots are all touched
  out["enqueue"] = med(enqueue, reps, f"{name}/enqueue")

  def n_then_sync(n: int = 2000) -> float:
    dev.synchronize()
    t = time.perf_counter()
    for _ in range(n): prg(a, b)
    dev.synchronize()
    return (time.perf_counter() - t) / n
  out["n_sync"] = med(n_then_sync, reps, f"{name}/n_sync")

  inc = dev.program(int_inc_kernel())
  x, y = Buffer(dev, 1, dtypes.int32), Buffer(dev, 1, dtypes.int32)

  def chain() -> float:
    x.copyin(np.zeros(1, np.int32))
    dev.synchronize()
    t = time.perf_counter()
    for _ in range(500):
      inc(y, x)
      inc(x, y)
    dev.synchronize()
    t = time.perf_counter() - t
    got = int(x.numpy()[0])
    if got != 1000: raise AssertionError(f"{name}: the dependent chain ended at {got}, not 1000")
    return t
  out["chain"] = med(chain, reps, f"{name}/chain")

  n = (64 if quick else 256) * MiB
  host = np.random.default_rng(0).integers(0, 255, n, dtype=np.uint8)
  back = np.empty_like(host)
  buf = Buffer(dev, n, dtypes.uint8)

  def h2d() -> float:
    dev.synchronize()
    t = time.perf_counter()
    buf.copyin(host)
    dev.synchronize()
    return n / (time.perf_counter() - t)

  def d2h() -> float:
    t = time.perf_counter()
    buf.copyout(back)
    return n / (time.perf_counter() - t)
  out["h2d"], out["d2h"] = med(h2d, reps), med(d2h, reps)
  if not np.array_equal(back, host): raise AssertionError(f"{name}: H2D then D2H changed the data")
  m = (256 if quick else 1024) * MiB
  s, d = Buffer(dev, m, dtypes.uint8), Buffer(dev, m, dtypes.uint8)

  def d2d() -> float:
    dev.synchronize()
    t = time.perf_counter()
    s.copy_to(d)
    dev.synchronize()
    return m / (time.perf_counter() - t)
  out["d2d"] = med(d2d, reps)
  return out


def cupy_side(quick: bool) -> dict[str, float]:
  import cupy as cp
  reps = 3 if quick else 15
  out: dict[str, float] = {}
  k = cp.RawKernel(r'extern "C" __global__ void tiny(float* out, const float* x) { out[0] = x[0] + 1.0f; }', "tiny")
  inc = cp.RawKernel(r'extern "C" __global__ void inc(int* o, const int* x) { o[0] = x[0] + 1; }', "inc")
  a, b = cp.zeros(1, cp.float32), cp.ones(1, cp.float32)
  sync = cp.cuda.runtime.deviceSynchronize
  t = time.perf_counter()
  while time.perf_counter() - t < 1.0:  # as on the plugrt sides: a second of launches first
    for _ in range(400): k((1,), (1,), (a, b))
    sync()

  def enqueue(n: int = 400) -> float:
    sync()
    t = time.perf_counter()
    for _ in range(n): k((1,), (1,), (a, b))
    t = time.perf_counter() - t
    sync()
    return t / n
  out["enqueue"] = med(enqueue, reps, "cupy/enqueue")

  def n_then_sync(n: int = 2000) -> float:
    sync()
    t = time.perf_counter()
    for _ in range(n): k((1,), (1,), (a, b))
    sync()
    return (time.perf_counter() - t) / n
  out["n_sync"] = med(n_then_sync, reps, "cupy/n_sync")
  x, y = cp.zeros(1, cp.int32), cp.zeros(1, cp.int32)

  def chain() -> float:
    x.fill(0)
    sync()
    t = time.perf_counter()
    for _ in range(500):
      inc((1,), (1,), (y, x))
      inc((1,), (1,), (x, y))
    sync()
    t = time.perf_counter() - t
    if int(x.get()[0]) != 1000: raise AssertionError("cupy: the dependent chain is wrong")
    return t
  out["chain"] = med(chain, reps)
  n = (64 if quick else 256) * MiB
  host = np.random.default_rng(0).integers(0, 255, n, dtype=np.uint8)
  back = np.empty_like(host)
  buf = cp.empty(n, cp.uint8)

  def h2d() -> float:
    sync()
    t = time.perf_counter()
    buf.set(host)
    sync()
    return n / (time.perf_counter() - t)

  def d2h() -> float:
    t = time.perf_counter()
    buf.get(out=back)
    return n / (time.perf_counter() - t)
  out["h2d"], out["d2h"] = med(h2d, reps), med(d2h, reps)
  m = (256 if quick else 1024) * MiB
  s, d = cp.zeros(m, cp.uint8), cp.empty(m, cp.uint8)

  def d2d() -> float:
    sync()
    t = time.perf_counter()
    cp.copyto(d, s)
    sync()
    return m / (time.perf_counter() - t)
  out["d2d"] = med(d2d, reps)
  return out


ROWS = (("enqueue", "launch, enqueue (400 launches, no sync), per launch", "us"),
        ("n_sync", "launch, 2000 then one sync, per launch", "us"),
        ("chain", "1000 dependent launches + sync", "ms"),
        ("h2d", "H2D 256 MiB from numpy (pageable)", "GB/s"),
        ("d2h", "D2H 256 MiB to numpy (pageable)", "GB/s"),
        ("d2d", "D2D 1 GiB buffer to buffer", "GB/s"))


def fmt(v: float | None, unit: str) -> str:
  if v is None: return "-"
  return {"us": f"{v * 1e6:.2f} us", "ms": f"{v * 1e3:.2f} ms", "GB/s": f"{v / 1e9:.1f} GB/s"}[unit]


def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument("--quick", action="store_true")
  ap.add_argument("--json")
  args = ap.parse_args()
  sides: dict[str, dict[str, float]] = {}
  errors: dict[str, str] = {}
  for label, fn in (("NV", lambda: plugrt_side("NV", args.quick)), ("CUDA", lambda: plugrt_side("CUDA", args.quick)),
                    ("cupy", lambda: cupy_side(args.quick))):
    try: sides[label] = fn()
    except Exception as e:  # one side failing leaves the others' figures
      errors[label] = f"{type(e).__name__}: {e}"
      print(f"{label}: {errors[label]}", file=sys.stderr)
  print(f"{'row':<52} {'NV':>12} {'CUDA':>12} {'cupy':>12} {'CUDA/NV':>8} {'cupy/NV':>8}  target")
  rows = []
  for key, label, unit in ROWS:
    vals = {s: sides.get(s, {}).get(key) for s in ("NV", "CUDA", "cupy")}
    ratios = {}
    for s in ("CUDA", "cupy"):
      v, o = vals["NV"], vals[s]
      ratios[s] = None if not v or not o else (o / v if unit in ("us", "ms") else v / o)
    tgt = TARGETS.get(key)
    meets = None if tgt is None or vals["NV"] is None else vals["NV"] <= tgt[1]
    r = lambda x: "-" if x is None else f"{x:.2f}x"
    print(f"{label:<52} {fmt(vals['NV'], unit):>12} {fmt(vals['CUDA'], unit):>12} {fmt(vals['cupy'], unit):>12} {r(ratios['CUDA']):>8} "
          f"{r(ratios['cupy']):>8}  {tgt[0] + (' met' if meets else ' not met') if tgt else ''}")
    rows.append({"key": key, "label": label, "unit": unit, **{s: vals[s] for s in vals}, "ratio_cuda": ratios["CUDA"], "ratio_cupy": ratios["cupy"],
                 "target": tgt[0] if tgt else None, "meets": meets})
  for key in ("enqueue", "n_sync"):
    best = {side: min(SAMPLES[f"{side}/{key}"]) * 1e6 for side in ("NV", "CUDA", "cupy") if f"{side}/{key}" in SAMPLES}
    print(f"  best of the repetitions, {key}: " + ", ".join(f"{side} {v:.2f} us" for side, v in best.items()))
  if args.json:
    with open(args.json, "w") as f: json.dump({"rows": rows, "errors": errors, "samples": SAMPLES}, f, indent=1)
  if errors: sys.exit(1)


if __name__ == "__main__":
  main()
