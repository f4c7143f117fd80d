"""Launch overhead of two trees side by side (a refactor of the launch path must not slow it), on this machine's devices.

    git archive <old commit> | (mkdir -p .ab-old && tar x -C .ab-old)
    python bench/ab_launch.py .ab-old [--rounds 5] [--devices CPU:CLANG,CPU:LLVM,CL,WEBGPU]

Each round runs every device once per tree, each in a fresh process with that tree's sources first on PYTHONPATH (the
installed distributions' entry points are used for discovery, so both trees must declare the same plugins), the
order of the trees swapping every round. A process times three launch shapes of the tiny kernel `out[0] = x[0] + 1`
on 1-float buffers: the same call repeated (`same`), new buffers every call with the same scalars (`new bufs`: the
only-the-buffers-changed path) and a new scalar every call (`new vals`); each the median of 7 repetitions. Printed:
per device and shape, the median over rounds of each tree and the ratio old/new (above 1: the new tree is faster).
On a loaded machine timing is noise: `--instructions` counts each launch's instructions under valgrind instead.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, sys, time
import numpy as np
from plugrt import Buffer, Device, KernelBuilder, dtypes
target, n = sys.argv[1], int(sys.argv[2])
name, _, comp = target.partition(":")
b = KernelBuilder("tiny")
out, x = b.buffer("out", dtypes.float32), b.buffer("x", dtypes.float32)
a = b.scalar("a", dtypes.float32)
out[0] = x[0] + a
dev = Device[name]
prg = dev.program(b.finish(), comp or None)
bufs = [Buffer(dev, 1, dtypes.float32) for _ in range(8)]
vals = [(float(i),) for i in range(8)]
def same():
  o, i = bufs[0], bufs[1]
  v = (1.0,)
  for _ in range(n): prg(o, i, vals=v)
def new_bufs():
  for k in range(n): prg(bufs[k & 7], bufs[(k + 1) & 7], vals=(1.0,))
def new_vals():
  o, i = bufs[0], bufs[1]
  for k in range(n): prg(o, i, vals=vals[k & 7])
shapes = {"same": same, "new bufs": new_bufs, "new vals": new_vals}
if len(sys.argv) > 3:  # one shape, run once after a warm-up (counted by callgrind from outside)
  shapes[sys.argv[3]](); dev.synchronize()
  raise SystemExit(0)
res = {}
for label, fn in shapes.items():
  fn(); dev.synchronize()
  ts = []
  for _ in range(7):
    t = time.perf_counter(); fn(); dev.synchronize(); ts.append((time.perf_counter() - t) / n * 1e6)
  res[label] = sorted(ts)[3]
print(json.dumps(res))
"""
SHAPES = ("same", "new bufs", "new vals")


def pythonpath(tree: Path) -> str:
  dirs = [tree / "core", *sorted(tree.glob("plugins/ops_*")), *sorted(tree.glob("plugins/ops_*/iface_*")), tree / "plugins/nvidia_toolchain",
          tree / "plugins/ops_cuda/toolchain"]  # the last: where an older tree (the A/B's old side) keeps the NVIDIA toolchain
  return os.pathsep.join(str(d) for d in dirs if d.is_dir())


def run(tree: Path, target: str, n: int) -> dict[str, float] | None:
  env = {**os.environ, "PYTHONPATH": pythonpath(tree), "PLUGRT_CACHE_DIR": str(Path("/tmp") / f"ab-launch-cache-{tree.name}")}
  r = subprocess.run([sys.executable, "-c", CHILD, target, str(n)], capture_output=True, text=True, env=env, timeout=600)
  if r.returncode != 0:
    print(f"  {tree.name} {target}: failed: {r.stderr.strip().splitlines()[-1:] or r.returncode}", file=sys.stderr)
    return None
  return json.loads(r.stdout.strip().splitlines()[-1])


def instructions(tree: Path, target: str, shape: str, n: int) -> int | None:
  """Instructions of one child process running `shape` n times (valgrind's callgrind: the same count every run)."""
  # a fixed hash seed and no clang started ahead in the background: the same instructions every run
  env = {**os.environ, "PYTHONPATH": pythonpath(tree), "PLUGRT_CACHE_DIR": str(Path("/tmp") / f"ab-launch-cache-{tree.name}"),
         "PYTHONHASHSEED": "0", "PLUGRT_CPU_CLANG_AHEAD": "0"}
  r = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, "-c", CHILD, target, str(n), shape],
                     capture_output=True, text=True, env=env, timeout=1800)
  for line in r.stderr.splitlines():
    if "Collected :" in line: return int(line.split(":")[-1].strip())
  print(f"  {tree.name} {target} {shape}: callgrind failed ({r.returncode}): {r.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
  return None


def count(trees: dict[str, Path], targets: list[str], n: int) -> int:
  """Instructions per launch of each tree: (count at 3n launches - count at n) / 2n, which leaves out start-up."""
  print(f"{'device':10} {'shape':9} {'old instr':>10} {'new instr':>10} {'old/new':>8}")
  for target in targets:
    for tree in trees.values(): run(tree, target, 10)  # bytecode and compile caches filled: every counted run starts alike
    for shape in SHAPES:
      per = {}
      for side, tree in trees.items():
        lo, hi = instructions(tree, target, shape, n), instructions(tree, target, shape, 3 * n)
        if lo is not None and hi is not None: per[side] = (hi - lo) / (2 * n)
      if len(per) == 2:
        print(f"{target:10} {shape:9} {per['old']:10.0f} {per['new']:10.0f} {per['old'] / per['new']:8.3f}", flush=True)
  return 0


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("old", type=Path, help="the other tree (e.g. .ab-old from git archive)")
  ap.add_argument("--rounds", type=int, default=5)
  ap.add_argument("--devices", default="CPU:CLANG,CPU:LLVM,CL,WEBGPU")
  ap.add_argument("--calls", type=int, default=0, help="launches per repetition (default: 20000 on CPU, 2000 elsewhere)")
  ap.add_argument("--instructions", action="store_true",
                  help="count instructions per launch under valgrind's callgrind instead of timing (the same count every run, "
                       "whatever else the machine does; slow: about a minute a count)")
  args = ap.parse_args()
  trees = {"old": args.old.resolve(), "new": ROOT}
  if args.instructions: return count(trees, args.devices.split(","), args.calls or 10000)
  got: dict[tuple[str, str, str], list[float]] = {}
  for r in range(args.rounds):
    order = ["old", "new"] if r % 2 == 0 else ["new", "old"]
    for target in args.devices.split(","):
      n = args.calls or (20000 if target.startswith("CPU") else 2000)
      for side in order:
        if (res := run(trees[side], target, n)) is None: continue
        for shape, us in res.items(): got.setdefault((target, shape, side), []).append(us)
    print(f"round {r + 1} of {args.rounds} done", file=sys.stderr)
  print(f"{'device':10} {'shape':9} {'old us':>8} {'new us':>8} {'old/new':>8}")
  for target in args.devices.split(","):
    for shape in ("same", "new bufs", "new vals"):
      o, n_ = got.get((target, shape, "old")), got.get((target, shape, "new"))
      if not o or not n_: continue
      mo, mn = statistics.median(o), statistics.median(n_)
      print(f"{target:10} {shape:9} {mo:8.3f} {mn:8.3f} {mo / mn:8.3f}   (old {min(o):.3f}-{max(o):.3f}, new {min(n_):.3f}-{max(n_):.3f})")
  return 0


if __name__ == "__main__":
  sys.exit(main())
