"""plugrt's CL backend side by side with tinygrad 0.14's CL and pyopencl itself, on one OpenCL device, one run.

    python bench/cl.py                  # every row (about 2 minutes on 2 cores with PoCL)
    python bench/cl.py --quick          # fewer repetitions (a smoke run, well under a minute)
    python bench/cl.py --rows launch --json out.json

Rows (a name or a group: launch, compile):
  launch           prg(a, b) pipelined: N launches then one finish, per launch
  launch_sync      prg(a, b) then a finish, every launch
  compile          source -> device binary of a never-seen kernel (the <= 40 ms target)
  first_result     source -> program -> first launch finished, of a never-seen kernel
  cache_hit        a program from a source compiled before (each library's own cache)

The same tiny kernel (out[0] = x[0] + 1) on 1-float buffers everywhere. tinygrad==0.14.0 is pip-installed
first if missing (the bench/README.md convention); pyopencl is plugrt-cl's own dependency. All three
libraries' caches, and PoCL's kernel cache, live in a temporary directory removed at the end. The device is
the first OpenCL device plugrt picks (CL_PLATFORM=... to choose); tinygrad always takes platform 0.
Exit status: 0, also when plugrt misses a target; 1 when a row failed; 2 for bad arguments.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import NotAvailable, Side, alternate, columns, load_note, pick_rows

SIDES = ("plugrt", "tinygrad", "pyopencl")
KEYS = ("launch", "launch_sync", "compile", "first_result", "cache_hit")
GROUPS = {"launch": KEYS[0:2], "compile": KEYS[2:5]}
# (label, unit, plugrt target from ANCHORS.md, tinygrad's figure there)
ROWS = {
  "launch": ("launch, enqueue (pipelined)", "us", 8.0, "-"),
  "launch_sync": ("launch + finish, each call", "us", 8.0, "14.4 us (enqueue+finish)"),
  "compile": ("compile a new kernel: source -> binary", "ms", 40.0, "151 ms (builds twice)"),
  "first_result": ("new kernel: source -> first launch done", "ms", None, "-"),
  "cache_hit": ("cache hit: source compiled before -> program", "ms", None, "-"),
}


@dataclass(frozen=True)
class Config:
  reps: int
  launch_n: int
  sync_n: int
  compile_reps: int
  cache_n: int


FULL = Config(reps=11, launch_n=5000, sync_n=2000, compile_reps=11, cache_n=20)
QUICK = Config(reps=4, launch_n=1000, sync_n=500, compile_reps=4, cache_n=5)


@dataclass
class Row3:
  key: str
  sides: dict[str, Side] = field(default_factory=dict)
  notes: list[str] = field(default_factory=list)
  error: str = ""

  @property
  def unit(self) -> str: return ROWS[self.key][1]
  def ratio(self, other: str) -> float | None:
    p, o = self.sides.get("plugrt"), self.sides.get(other)
    return o.value / p.value if p and o and p.value and o.value is not None else None


def measure(key: str, cfg: Config, sides: dict[str, Any]) -> Row3:
  row = Row3(key)
  scale = 1e6 if ROWS[key][1] == "us" else 1e3
  fns: dict[str, Callable[[], float] | None] = {}
  for name, obj in sides.items():
    try:
      if isinstance(obj, str): raise NotAvailable(obj)
      if key == "launch": fn = obj.launcher(cfg.launch_n, sync=False)
      elif key == "launch_sync": fn = obj.launcher(cfg.sync_n, sync=True)
      elif key == "compile": fn = obj.compile()
      elif key == "first_result": fn = obj.first_result()
      else: fn = obj.cache_hit(cfg.cache_n)
      fn()  # warm-up
      fns[name] = fn
    except NotAvailable as e: row.sides[name] = Side.missing(str(e))
    except Exception as e:
      row.sides[name] = Side.missing(f"error: {type(e).__name__}: {e}")
      row.error += f"{name}: {traceback.format_exc(limit=4)}"
  reps = cfg.compile_reps if key in ("compile", "first_result") else cfg.reps
  try:
    for name, samples in alternate(fns, reps).items(): row.sides[name] = Side.of([x * scale for x in samples])
  except Exception as e: row.error += f"while timing: {type(e).__name__}: {e}"
  return row


def fmt(v: float | None, unit: str) -> str:
  if v is None: return "-"
  return f"{v:.{0 if abs(v) >= 100 else 1 if abs(v) >= 10 else 2}f} {unit}"


def table(rows: list[Row3]) -> str:
  head = ("row", "plugrt", "tinygrad", "pyopencl", "tg/plugrt", "pyopencl/plugrt", "target", "meets", "ANCHORS tinygrad")
  lines = [head]
  for r in rows:
    label, unit, target, anchor = ROWS[r.key]
    cells = [fmt(r.sides[s].value, unit) + (" ~" if (sp := r.sides[s].spread) is not None and sp > 0.25 else "")
             if s in r.sides else "-" for s in SIDES]
    ratios = [f"{x:.2f}x" if (x := r.ratio(s)) is not None else "-" for s in ("tinygrad", "pyopencl")]
    p = r.sides.get("plugrt")
    meets = "-" if target is None or p is None or p.value is None else "yes" if p.value <= target else "NO"
    lines.append((label, *cells, *ratios, f"<= {fmt(target, unit)}" if target else "-", meets, anchor))
  return "\n".join(columns(lines, left=(0, 8)))


def main(argv: Sequence[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description="plugrt CL vs tinygrad 0.14 CL vs pyopencl, on one OpenCL device")
  ap.add_argument("--quick", action="store_true", help="fewer repetitions")
  ap.add_argument("--rows", help=f"comma-separated rows or groups ({', '.join(GROUPS)}); default: all")
  ap.add_argument("--json", metavar="PATH", help="also write every sample and note as JSON")
  ap.add_argument("--sides", default=",".join(SIDES), help=f"which of {', '.join(SIDES)} to measure (default: all)")
  args = ap.parse_args(argv)
  try: keys = pick_rows(args.rows, KEYS, GROUPS)
  except ValueError as e: ap.error(str(e))
  cfg = QUICK if args.quick else FULL
  workdir = tempfile.mkdtemp(prefix="plugrt-bench-cl-")
  for k in ("PLUGRT_CACHE", "CACHELEVEL", "CCACHE", "PYOPENCL_NO_CACHE"): os.environ.pop(k, None)
  # before any library loads: every cache in the run's own directory (PoCL's kernel cache too, so all start cold)
  os.environ.update(PLUGRT_CACHE_DIR=os.path.join(workdir, "plugrt"), CACHEDB=os.path.join(workdir, "tinygrad.db"),
                    POCL_CACHE_DIR=os.path.join(workdir, "pocl"), XDG_CACHE_HOME=os.path.join(workdir, "xdg"))
  try:
    from _tinygrad import ensure_installed
    tg_missing = ensure_installed()
    from _cl_sides import PlugrtCL, PyopenclCL, TinygradCL, c_floor
    sides: dict[str, Any] = {}
    wanted = [s.strip() for s in args.sides.split(",")]
    for name, make in (("plugrt", PlugrtCL), ("tinygrad", TinygradCL), ("pyopencl", PyopenclCL)):
      if name not in wanted: sides[name] = "not measured (--sides)"; continue
      if name == "tinygrad" and tg_missing: sides[name] = tg_missing; continue
      try: sides[name] = make()
      except NotAvailable as e: sides[name] = str(e)
    if isinstance(sides["plugrt"], str):
      print(f"cl.py: {sides['plugrt']}", file=sys.stderr)
      return 1
    from importlib.metadata import version

    import pyopencl
    meta = {"python": sys.version.split()[0], "plugrt-cl": version("plugrt-cl"), "pyopencl": pyopencl.VERSION_TEXT,
            "tinygrad": None if tg_missing else version("tinygrad"), "quick": args.quick, "load_before": load_note()}
    meta["devices"] = {n: getattr(s, "device_label", s) for n, s in sides.items()}
    print(f"plugrt-cl {meta['plugrt-cl']} vs tinygrad {meta['tinygrad']} vs pyopencl {meta['pyopencl']}, Python {meta['python']}; "
          f"{meta['load_before']}", flush=True)
    for n, d in meta["devices"].items(): print(f"  {n}: {d}")
    rows = [measure(k, cfg, sides) for k in keys]
    extra = []
    if "launch" in keys or "launch_sync" in keys:
      floor = c_floor(workdir, cfg.sync_n)
      meta["c_floor_us"] = floor
      extra.append(f"C floor (clEnqueueNDRangeKernel from C, best of 5): enqueue {floor[0]:.2f} us, enqueue + clFinish {floor[1]:.2f} us"
                   if isinstance(floor, tuple) else f"C floor: {floor}")
    meta["load_after"] = load_note(warn=False)
    print("\nmedians; ratio = other / plugrt (above 1: plugrt is faster); ~ = noisy (IQR over 25% of the median)\n")
    print(table(rows))
    print("\nnotes:")
    for r in rows:
      for s, side in r.sides.items():
        if side.note: print(f"  {ROWS[r.key][0]}: {s}: {side.note}")
      if r.error: print(f"  {ROWS[r.key][0]}: ERROR: {r.error}")
    for line in [*extra, f"before: {meta['load_before']}; after: {meta['load_after']}"]: print(f"  {line}")
    if args.json:
      out = {"meta": meta, "notes": extra, "rows": [{"key": r.key, "label": ROWS[r.key][0], "unit": r.unit, "target": ROWS[r.key][2],
             "sides": {s: {"median": v.value, "samples": v.samples, "note": v.note} for s, v in r.sides.items()},
             "ratios": {s: r.ratio(s) for s in ("tinygrad", "pyopencl")}, "error": r.error} for r in rows]}
      with open(args.json, "w") as f: json.dump(out, f, indent=2)
      print(f"\nwrote {args.json}")
    return 1 if any(r.error for r in rows) or tg_missing else 0
  finally:
    shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
  sys.exit(main())
