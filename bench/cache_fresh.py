"""The first disk-cache hit in a new process, plugrt against tinygrad 0.14, each side in its own fresh processes.

    python bench/cache_fresh.py [--rounds 15] [--compiler CLANG|LLVM]

Each round starts one plugrt process and one tinygrad process (alternating which goes first). Each imports its
library, opens the CPU device and its compiler (untimed), then times its first `compile_cached(src)` of a source
already in its disk cache (the tiny kernel, rendered once by the parent for each side): plugrt's cache opened, the
entry located, read and checked; tinygrad's sqlite connection opened, SELECT and `pickle.loads`. plugrt's process
then times loading that binary into a Program (the CPU loader; its first load also loads the grid runner) and a
second source's hit and load (what every later kernel of that process pays). Medians over the rounds; both caches
live in a temporary directory; both sides import from bytecode (a private PYTHONPYCACHEPREFIX).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import child_env, load_note

PLUGRT = r"""
import json, sys, time
T = time.perf_counter
compiler, src1, src2 = sys.argv[1], open(sys.argv[2]).read(), open(sys.argv[3]).read()
from plugrt import Device
from plugrt.compiler.samples import tiny_kernel
dev = Device["CPU"]
comp = dev.compiler_for(compiler)
k1, k2 = tiny_kernel("fresh_a"), tiny_kernel("fresh_b")
t0 = T(); lib, hit = comp.compile_cached(src1); t1 = T()
prg = dev.load(k1.name, lib, k1.signature); t2 = T()
lib2, hit2 = comp.compile_cached(src2); t3 = T()
prg2 = dev.load(k2.name, lib2, k2.signature); t4 = T()
print(json.dumps({"hit": (t1 - t0) * 1e6, "cached": hit and hit2, "load": (t2 - t1) * 1e6, "hit2": (t3 - t2) * 1e6, "load2": (t4 - t3) * 1e6}))
"""

TINYGRAD = r"""
import json, sys, time
T = time.perf_counter
compiler, src1 = sys.argv[1], open(sys.argv[2]).read()
from tinygrad import Context, Device
dev = Device["CPU"]
with Context(DEV=f"CPU:{compiler}"): comp = dev.renderer.compiler
t0 = T(); lib = comp.compile_cached(src1); t1 = T()
print(json.dumps({"hit": (t1 - t0) * 1e6, "cached": True}))
"""


def sources(compiler: str, workdir: str) -> dict[str, list[str]]:
  """Source files of the tiny kernel as each side renders it (plugrt: two names; tinygrad: one)."""
  from plugrt import Device
  from plugrt.compiler.samples import tiny_kernel
  comp = Device["CPU"].compiler_for(compiler)
  out: dict[str, list[str]] = {"plugrt": [], "tinygrad": []}
  for name in ("fresh_a", "fresh_b"):
    path = os.path.join(workdir, f"plugrt_{name}.src")
    with open(path, "w") as f: f.write(comp.render(tiny_kernel(name)))
    out["plugrt"].append(path)
  from _tinygrad import TinygradCPU
  _, src = TinygradCPU()._program(compiler)
  path = os.path.join(workdir, "tinygrad.src")
  with open(path, "w") as f: f.write(src.replace("bench_tiny", "fresh_a"))
  out["tinygrad"].append(path)
  return out


def run(code: str, args: list[str], env: dict[str, str]) -> dict:
  p = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=120)
  if p.returncode != 0: raise RuntimeError(f"child failed: {p.stderr[-2000:]}")
  return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--rounds", type=int, default=15)
  ap.add_argument("--compiler", default="CLANG", choices=("CLANG", "LLVM"))
  args = ap.parse_args()
  workdir = tempfile.mkdtemp(prefix="plugrt-cachefresh-")
  env = child_env({k: v for k, v in os.environ.items() if k not in ("PLUGRT_CACHE", "CACHELEVEL", "CCACHE")}, workdir)
  os.environ.update(PLUGRT_CACHE_DIR=env["PLUGRT_CACHE_DIR"], CACHEDB=env["CACHEDB"])
  srcs = sources(args.compiler, workdir)
  sides = {"plugrt": (PLUGRT, [args.compiler, *srcs["plugrt"]]), "tinygrad": (TINYGRAD, [args.compiler, *srcs["tinygrad"]])}
  for code, a in sides.values(): run(code, a, env)  # the misses that fill both caches (and the bytecode)
  samples: dict[str, dict[str, list[float]]] = {"plugrt": {}, "tinygrad": {}}
  print(f"{args.compiler}, {args.rounds} rounds; {load_note()}", flush=True)
  for r in range(args.rounds):
    for side in (("plugrt", "tinygrad") if r % 2 == 0 else ("tinygrad", "plugrt")):
      res = run(*sides[side], env)
      if not res.pop("cached"): raise RuntimeError(f"{side}: not a cache hit")
      for k, v in res.items(): samples[side].setdefault(k, []).append(v)
  med = {s: {k: statistics.median(v) for k, v in d.items()} for s, d in samples.items()}
  p, t = med["plugrt"], med["tinygrad"]
  print(f"first hit in a new process: plugrt {p['hit']:.1f} us, tinygrad {t['hit']:.1f} us: {t['hit'] / p['hit']:.2f}x (tinygrad / plugrt)")
  print(f"plugrt, same process: load of that binary {p['load']:.1f} us (with the grid runner's first load); "
        f"a second kernel's hit {p['hit2']:.1f} us, its load {p['load2']:.1f} us")
  print(f"after the run: {load_note(warn=False)}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
