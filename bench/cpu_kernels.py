"""How fast CPU kernels run (not compile): a bandwidth-bound elementwise add and the tiny kernel's launch.

    python bench/cpu_kernels.py [--quick] [--json out.json]

Rows, for CLANG and LLVM: `c[i] = a[i] + b[i]` on 2**24 float32 (192 MiB moved a launch) with 256-thread groups
(how plugrt's Tensor launches), the same with 1-thread groups (a grid of 2**24 groups: the worst case for the
per-group cost of the grid loop; such a launch runs the kernel's span variant, plugrt_cpu.span, made before timing:
PLUGRT_CPU_SPAN=0 measures the one-group kernel instead), each on the calling thread only (PLUGRT_CPU_THREADS=1, in a child process) and on
every core; and the tiny kernel's launch (1 float). Compare two trees by running this script under each, one after
the other (PYTHONPATH pointing at the tree): the figures are absolute, so the machine must be quiet for both.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

CHILD = r"""
import json, statistics, sys, time
import numpy as np
from plugrt import Buffer, Device, KernelBuilder, dtypes
from plugrt.compiler.samples import tiny_kernel
reps, n = int(sys.argv[1]), 1 << 24
dev = Device["CPU"]
b = KernelBuilder("ew_add")
c, x, y = b.buffer("c", dtypes.float32), b.buffer("a", dtypes.float32), b.buffer("b", dtypes.float32)
i = b.global_id(0)
c[i] = x[i] + y[i]
kernel = b.finish()
a_np, b_np = np.random.default_rng(0).random(n, np.float32), np.random.default_rng(1).random(n, np.float32)
out = {}
for comp in ("CLANG", "LLVM"):
  prg = dev.program(kernel, comp)
  bc, ba, bb = Buffer(dev, n), Buffer(dev, n).copyin(a_np), Buffer(dev, n).copyin(b_np)
  for local in (256, 1):
    prg(bc, ba, bb, global_size=(n // local,), local_size=(local,), wait=True)
    assert np.array_equal(bc.numpy(), a_np + b_np), f"{comp}: wrong sum"
    ts = [prg(bc, ba, bb, global_size=(n // local,), local_size=(local,), wait=True) for _ in range(reps)]
    out[f"ew_{comp.lower()}_local{local}_ms"] = statistics.median(ts) * 1e3
  t = tiny_kernel(f"tiny_{comp}")
  p = dev.program(t, comp)
  o, v = Buffer(dev, 1), Buffer(dev, 1).copyin(np.ones(1, np.float32))
  p(o, v, wait=True)
  per = []
  for _ in range(reps):
    st = time.perf_counter()
    for _ in range(20000): p(o, v)
    per.append((time.perf_counter() - st) / 20000)
  out[f"launch_{comp.lower()}_us"] = statistics.median(per) * 1e6
print(json.dumps(out))
"""


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--quick", action="store_true")
  ap.add_argument("--json")
  args = ap.parse_args()
  reps = 5 if args.quick else 15
  res = {}
  for threads in ("1", ""):
    env = dict(os.environ)
    env.pop("PLUGRT_CPU_THREADS", None)
    if threads: env["PLUGRT_CPU_THREADS"] = threads
    st = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", CHILD, str(reps)], env=env, capture_output=True, text=True)
    if p.returncode: print(p.stderr, file=sys.stderr); return 1
    label = "1 thread" if threads else f"all {len(os.sched_getaffinity(0))} cores"
    res[label] = json.loads(p.stdout.strip().splitlines()[-1])
    print(f"{label} ({time.perf_counter() - st:.1f} s):")
    for k, v in res[label].items(): print(f"  {k:28s} {v:9.3f}")
  if args.json:
    with open(args.json, "w") as f: json.dump(res, f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
