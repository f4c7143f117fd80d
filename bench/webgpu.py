"""plugrt's WEBGPU device side by side with raw wgpu-py and tinygrad 0.14's WEBGPU, in one run.

    python bench/webgpu.py                 # every row (about a minute on 2 cores with lavapipe)
    python bench/webgpu.py --quick         # fewer repetitions (a smoke run)
    python bench/webgpu.py --rows dispatch,compile --json out.json

Columns: plugrt on wgpu-native (WGPU), plugrt on Dawn (DAWN), raw wgpu-py (its object API,
pipeline and bind group built once), tinygrad 0.14 WEBGPU (Dawn, through $WEBGPU_PATH).
Rows, all on the tiny kernel out[0] = x[0] + 1 (1-float buffers):
  dispatch        launches queued back to back, the queue drained at the end of each repetition
  dispatch_wait   each launch waits for its own completion
  compile         a never-seen source to the engine's shader module (no cache)
  first_result    a never-seen kernel to its result on the host (module, pipeline, bindings, dispatch, copy back)

Missing comparison packages (tinygrad==0.14.0, wgpu, dawn-python) are pip-installed first; a
side that still cannot run shows '-' with the reason in the notes (exit status stays 0). Every
figure is a median; the sides alternate repetition by repetition. plugrt's and tinygrad's caches
live in a temporary directory. See bench/README.md for the conventions.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import NotAvailable, alternate, columns, load_note, pick_rows

SIDES = ("plugrt WGPU", "plugrt DAWN", "raw wgpu-py", "tinygrad WEBGPU")
ROWS = ("dispatch", "dispatch_wait", "compile", "first_result")
# (label, unit, plugrt target in that unit, tinygrad as ANCHORS.md gives it)
META = {"dispatch": ("dispatch, tiny kernel (queued, drained per repetition)", "us", 100.0, "1907 us"),
        "dispatch_wait": ("dispatch + wait for it", "us", None, "-"),
        "compile": ("compile: new source -> shader module", "ms", None, "-"),
        "first_result": ("new kernel -> first result", "ms", None, "-")}


@dataclass(frozen=True)
class Config:
  reps: int
  n_fast: int      # launches per repetition for plugrt and raw wgpu-py
  n_slow: int      # ... for tinygrad, which builds a pipeline per launch
  compile_reps: int
  first_reps: int


FULL = Config(11, 2000, 100, 15, 9)
QUICK = Config(5, 300, 20, 5, 3)


@dataclass
class Row:
  key: str
  values: dict[str, float | None] = field(default_factory=dict)
  samples: dict[str, list[float]] = field(default_factory=dict)
  notes: dict[str, str] = field(default_factory=dict)
  error: str = ""


def ensure(dist: str, module: str, log: Callable[[str], None]) -> str:
  """pip install `dist` if `module` is missing; "" or why it could not be had."""
  if importlib.util.find_spec(module) is not None: return ""
  cmd = [sys.executable, "-m", "pip", "install", dist]
  log(f"{dist} is not installed: running {' '.join(cmd)}")
  p = subprocess.run(cmd, capture_output=True, text=True)
  for line in (p.stdout + p.stderr).strip().splitlines()[-4:]: log(f"  pip: {line}")
  importlib.invalidate_caches()
  if p.returncode != 0: return f"pip install {dist} failed (exit {p.returncode})"
  return "" if importlib.util.find_spec(module) is not None else f"{module} is still not importable after pip install {dist}"


def make_sides(log: Callable[[str], None]) -> tuple[dict[str, Any], dict[str, str]]:
  """Each side's object, or the reason it is missing."""
  import _webgpu_sides as S
  from _tinygrad import ensure_installed
  missing: dict[str, str] = {}
  for dist, mod in (("wgpu", "wgpu"), ("dawn-python", "pydawn")):
    if why := ensure(dist, mod, log): missing[mod] = why
  tg = ensure_installed(log)
  makers: dict[str, Callable[[], Any]] = {"plugrt WGPU": lambda: S.PlugrtSide("WGPU"), "plugrt DAWN": lambda: S.PlugrtSide("DAWN"),
                                         "raw wgpu-py": S.RawWgpu, "tinygrad WEBGPU": S.TinygradWebGPU}
  sides: dict[str, Any] = {}
  for name, make in makers.items():
    if name == "tinygrad WEBGPU" and (tg or "pydawn" in missing):
      sides[name] = tg or f"tinygrad's WEBGPU needs dawn-python: {missing['pydawn']}"
      continue
    try: sides[name] = make()
    except NotAvailable as e: sides[name] = str(e)
    except Exception as e: sides[name] = f"error: {type(e).__name__}: {e}"
  return sides, missing


def measure(key: str, cfg: Config, sides: dict[str, Any]) -> Row:
  row = Row(key)
  unit = META[key][1]
  scale = 1e6 if unit == "us" else 1e3
  fns: dict[str, Callable[[], float] | None] = {}
  for name, side in sides.items():
    if isinstance(side, str):
      row.notes[name] = side
      continue
    n = cfg.n_slow if name.startswith("tinygrad") else cfg.n_fast
    try:
      if key == "dispatch": fn = side.dispatch(n)
      elif key == "dispatch_wait": fn = side.dispatch_wait(max(n // 4, 5))
      else: fn = side.compile() if key == "compile" else side.first_result()
      fn()  # warm-up
      fns[name] = fn
    except Exception as e:
      row.notes[name] = f"error: {type(e).__name__}: {e}"
      row.error += f"{name}: {traceback.format_exc(limit=3)}"
  reps = {"compile": cfg.compile_reps, "first_result": cfg.first_reps}.get(key, cfg.reps)
  for name, samples in alternate(fns, reps).items():
    row.samples[name] = [x * scale for x in samples]
    row.values[name] = statistics.median(row.samples[name])
  return row


def fmt(v: float | None, unit: str) -> str:
  if v is None: return "-"
  return f"{v:.{0 if v >= 100 else 1 if v >= 10 else 2}f} {unit}"


def ratio(a: float | None, b: float | None) -> str: return f"{a / b:.2f}x" if a is not None and b else "-"


def table(rows: list[Row]) -> str:
  head = ("row", *SIDES, "tg/WGPU", "tg/DAWN", "raw/WGPU", "target", "meets")
  lines = [head]
  for r in rows:
    label, unit, target, _ = META[r.key]
    v = r.values
    meets = "-" if target is None else " ".join(f"{s.split()[1]}:{'yes' if v.get(s) is not None and v[s] <= target else 'NO'}"
                                                  for s in SIDES[:2] if v.get(s) is not None) or "-"
    lines.append((label, *(fmt(v.get(s), unit) for s in SIDES), ratio(v.get(SIDES[3]), v.get(SIDES[0])),
                  ratio(v.get(SIDES[3]), v.get(SIDES[1])), ratio(v.get(SIDES[2]), v.get(SIDES[0])),
                  f"<= {fmt(target, unit)}" if target else "-", meets))
  return "\n".join(columns(lines))


def main(argv: Sequence[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description="plugrt WEBGPU vs raw wgpu-py vs tinygrad 0.14 WEBGPU, printed as ratios")
  ap.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run)")
  ap.add_argument("--rows", help=f"comma-separated rows ({', '.join(ROWS)}); default: all")
  ap.add_argument("--json", metavar="PATH", help="also write the figures, samples and notes as JSON")
  args = ap.parse_args(argv)
  try: keys = pick_rows(args.rows, list(ROWS), {})
  except ValueError as e: ap.error(str(e))
  cfg = QUICK if args.quick else FULL
  workdir = tempfile.mkdtemp(prefix="plugrt-bench-webgpu-")
  os.environ.update(PLUGRT_CACHE_DIR=os.path.join(workdir, "plugrt-cache"), CACHEDB=os.path.join(workdir, "tinygrad-cache.db"))
  for k in ("PLUGRT_CACHE", "CACHELEVEL", "CCACHE"): os.environ.pop(k, None)
  try:
    log = lambda s: print(s, file=sys.stderr, flush=True)
    before = load_note()
    sides, _ = make_sides(log)
    print(f"plugrt WEBGPU vs raw wgpu-py vs tinygrad 0.14 WEBGPU ({'quick' if args.quick else 'full'} run); {before}", flush=True)
    rows = [measure(k, cfg, sides) for k in keys]
    after = load_note(warn=False)
    print("medians; tg/X = tinygrad time over plugrt's (above 1: plugrt is faster); raw/WGPU = raw wgpu-py over plugrt on the same engine\n")
    print(table(rows))
    print("\nsides:")
    for name, side in sides.items(): print(f"  {name}: {side if isinstance(side, str) else side.describe()}")
    floor = []
    for eng in ("plugrt WGPU", "plugrt DAWN"):
      s = sides.get(eng)
      if s is None or isinstance(s, str) or "dispatch" not in keys: continue
      def bare(launch: Any = s.prg._prepared.submit, sync: Any = s.dev.synchronize, n: int = cfg.n_fast) -> float:
        t = time.perf_counter()
        for _ in range(n): launch()
        sync()
        return (time.perf_counter() - t) / n
      got = alternate({"call": s.dispatch(cfg.n_fast), "bare": bare}, cfg.reps)
      call, floor_us = statistics.median(got["call"]) * 1e6, statistics.median(got["bare"]) * 1e6
      floor.append(f"{eng}: prg(a, b) {call:.1f} us against its engine launcher alone (the same native calls, no Program.__call__) "
                   f"{floor_us:.1f} us, alternated; over all its launches it built {s.prg.pipelines_built} pipeline(s) and "
                   f"{s.prg.bind_groups_built} bind group(s)")
    print("\nnotes:")
    for r in rows:
      for name, note in r.notes.items(): print(f"  {META[r.key][0]}: {name}: {note}")
      if r.error: print(f"  ERROR in {r.key}: {r.error}")
    for line in floor: print(f"  {line}")
    print(f"  before the run: {before}; after it: {after}")
    if args.json:
      with open(args.json, "w") as f:
        json.dump({"rows": [r.__dict__ for r in rows], "sides": {k: (v if isinstance(v, str) else v.describe()) for k, v in sides.items()},
                   "floor": floor, "load": [before, after], "quick": args.quick}, f, indent=2)
    return 1 if any(r.error for r in rows) else 0
  finally: shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
  sys.exit(main())
