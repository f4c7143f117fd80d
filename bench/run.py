"""plugrt side by side with tinygrad 0.14.0 on the CPU, in one run, printed as ratios.

    python bench/run.py                  # every row (a few minutes on 2 cores)
    python bench/run.py --quick          # fewer repetitions (under a minute)
    python bench/run.py --rows launch,compile_llvm --json out.json

Rows (a name or a group: import, first, launch, compile, cache, clang, llvm):
  import_discovery, import_default   fresh process: import + find the devices
  first_result                       fresh process: Tensor([1,2,3]).add(1).numpy() on both sides
  launch_clang, launch_llvm          direct Program call of a tiny kernel
  compile_clang, compile_llvm        compile a never-seen tiny kernel, no cache
  cache_clang, cache_llvm            compile a source that is in the cache (plugrt: in memory after the first read)
  cachedisk_clang, cachedisk_llvm    the same, the first hit in a process (plugrt: disk read + sha256 check)

tinygrad==0.14.0 is pip-installed first if it is missing or another version.
Both libraries' caches live in a temporary directory for the run. Exit status: 0,
also when plugrt misses a target; 1 when a row failed; 2 for bad arguments.
See bench/README.md for the method and the caveats.
"""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import NotAvailable, Row, Side, alternate, child_env, ctypes_floor_us, load_note, pick_rows

KEYS = ("import_discovery", "import_default", "first_result", "launch_clang", "launch_llvm", "compile_clang", "compile_llvm",
        "cache_clang", "cache_llvm", "cachedisk_clang", "cachedisk_llvm", "eager_op")
GROUPS = {"import": KEYS[0:2], "first": KEYS[2:3], "launch": KEYS[3:5], "compile": KEYS[5:7], "cache": KEYS[7:11], "eager": KEYS[11:12],
          "clang": tuple(k for k in KEYS if k.endswith("clang")), "llvm": tuple(k for k in KEYS if k.endswith("llvm"))}
CACHE_SWITCHES = ("PLUGRT_CACHE", "CACHELEVEL", "CCACHE")  # a user's "cache off" would make the cache rows meaningless


@dataclass(frozen=True)
class Config:
  reps: int                # repetitions of the in-process launch and cache-hit rows
  launch_n: int            # calls per launch repetition
  cache_n: int             # calls per cache-hit repetition
  compile_reps: dict[str, int]
  import_rounds: int
  first_rounds: int


FULL = Config(15, 20000, 200, {"CLANG": 15, "LLVM": 31}, 31, 11)  # import: 31 rounds, each a difference of two noisy processes
QUICK = Config(5, 2000, 20, {"CLANG": 5, "LLVM": 9}, 5, 4)

# (row, what it measures, unit, plugrt target, tinygrad in ANCHORS.md per compiler)
INPROC = {
  "launch": ("launch, direct Program call", "us", 1.0, {"CLANG": "2.77 us", "LLVM": "2.03 us"}),
  "compile": ("compile a new kernel", "ms", None, {"CLANG": "35.8 ms", "LLVM": "3.05 ms"}),
  "cache": ("disk-cache hit", "ms", 0.3, {"CLANG": "-", "LLVM": "-"}),
  "cachedisk": ("disk-cache hit, first in a process", "ms", 0.3, {"CLANG": "-", "LLVM": "-"}),
}
COMPILE_TARGET = {"CLANG": 25.0, "LLVM": 2.0}


def inproc_row(key: str, cfg: Config, sides: dict[str, Any]) -> Row:
  """One in-process row: both sides' callables built, warmed once, then alternated repetition by repetition."""
  kind, compiler = key.split("_")[0], key.split("_")[1].upper()
  what, unit, target, anchors = INPROC[kind]
  if kind == "compile": target = COMPILE_TARGET[compiler]
  scale = 1e6 if unit == "us" else 1e3
  reps, n = {"launch": (cfg.reps, cfg.launch_n), "compile": (cfg.compile_reps[compiler], 1), "cache": (cfg.reps, cfg.cache_n),
                "cachedisk": (cfg.reps, cfg.cache_n)}[kind]
  method = {"launch": f"median of {reps} repetitions of {n} calls of the tiny kernel (out[0] = x[0] + 1) on 1-float buffers",
            "compile": f"median of {reps} compiles, each of the tiny kernel's source (as each renders it) under a new "
                       "function name, source to loadable bytes, no cache",
            "cache": f"median of {reps} repetitions of {n} compile() calls of a source already in the disk cache "
                     "(plugrt: from the compiler's memory, the entry read and its sha256 checked once; tinygrad: sqlite SELECT + "
                     "pickle.loads every call)",
            "cachedisk": f"median of {reps} repetitions of {n} compile() calls of a source in the disk cache, each as a "
                         "process's first (plugrt: the compiler's memory emptied before each call: one file read + sha256 "
                         "check; tinygrad: the same calls as the row above)"}[kind]
  row = Row(key, f"{what} ({compiler})", unit, Side(), Side(), target, anchors[compiler], method)
  fns: dict[str, Callable[[], float] | None] = {}
  for name, obj in sides.items():
    try:
      if isinstance(obj, str): raise NotAvailable(obj)
      if why := obj.why_not(compiler): raise NotAvailable(why)
      if kind == "launch": fn = obj.launcher(compiler, n)
      elif kind == "compile": fn = obj.fresh_compile(compiler)
      else: fn = obj.cache_hit(compiler, n, first_in_process=kind == "cachedisk")
      fn()  # warm-up
      fns[name] = fn
      if kind == "compile": row.method += f"; {name}: {obj.toolchain(compiler)}"
    except NotAvailable as e: setattr(row, name, Side.missing(str(e)))
    except Exception as e:
      setattr(row, name, Side.missing(f"error: {type(e).__name__}: {e}"))
      row.error = f"{name}: {traceback.format_exc(limit=4)}"
      fns.pop(name, None)
  try:
    for name, samples in alternate(fns, reps).items(): setattr(row, name, Side.of([x * scale for x in samples]))
  except Exception as e:
    row.error = f"while timing: {type(e).__name__}: {e}"
  return row


def eager_row(cfg: Config, tg_missing: str) -> Row:
  """(t + 1).realize() on a 16-float CPU tensor whose kernel is compiled: plugrt's Tensor against tinygrad's."""
  import _plugrt
  n = cfg.launch_n // 10
  row = Row("eager_op", "eager op on a compiled kernel (t + 1).realize()", "us", Side(), Side(), 30.0, "1.1-1.6 ms",
            f"median of {cfg.reps} repetitions of {n} ops on a 16-float CPU tensor, the kernel compiled before timing")
  fns: dict[str, Callable[[], float] | None] = {}
  for name, make in (("plugrt", _plugrt.eager_op), ("tinygrad", None if tg_missing else __import__("_tinygrad").eager_op)):
    if make is None:
      setattr(row, name, Side.missing(tg_missing))
      continue
    try:
      fns[name] = make(n)
      fns[name]()  # warm-up
    except Exception as e:
      setattr(row, name, Side.missing(f"error: {type(e).__name__}: {e}"))
      row.error = f"{name}: {traceback.format_exc(limit=4)}"
      fns.pop(name, None)
  for name, samples in alternate(fns, cfg.reps).items(): setattr(row, name, Side.of([x * 1e6 for x in samples]))
  return row


def versions() -> dict[str, Any]:
  from importlib.metadata import PackageNotFoundError, version
  out: dict[str, Any] = {"python": sys.version.split()[0], "machine": platform.machine(), "cores": len(os.sched_getaffinity(0))}
  for dist in ("plugrt", "plugrt-cpu", "tinygrad", "llvmlite"):
    try: out[dist] = version(dist)
    except PackageNotFoundError: out[dist] = None
  try: out["clang"] = subprocess.run(["clang", "--version"], capture_output=True, text=True).stdout.splitlines()[0]
  except (OSError, IndexError): out["clang"] = None
  return out


def main(argv: Sequence[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description="plugrt vs tinygrad 0.14.0 on the CPU, printed as ratios")
  ap.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run, under a minute)")
  ap.add_argument("--rows", help=f"comma-separated rows or groups ({', '.join(GROUPS)}); default: all")
  ap.add_argument("--json", metavar="PATH", help="also write the figures, samples and notes as JSON")
  args = ap.parse_args(argv)
  try: keys = pick_rows(args.rows, KEYS, GROUPS)
  except ValueError as e: ap.error(str(e))
  cfg = QUICK if args.quick else FULL
  base_env = {k: v for k, v in os.environ.items() if k not in CACHE_SWITCHES}
  workdir = tempfile.mkdtemp(prefix="plugrt-bench-")
  env = child_env(base_env, workdir)
  for k in CACHE_SWITCHES: os.environ.pop(k, None)
  os.environ.update(PLUGRT_CACHE_DIR=env["PLUGRT_CACHE_DIR"], CACHEDB=env["CACHEDB"])  # before either library is imported
  try:
    from _tinygrad import ensure_installed
    tg_missing = ensure_installed()
    if tg_missing: print(f"run.py: {tg_missing}; the tinygrad column stays empty", file=sys.stderr)
    meta = {**versions(), "quick": args.quick, "rows": keys, "load_before": load_note()}
    print(f"plugrt {meta['plugrt']} vs tinygrad {meta['tinygrad']}, CPU, Python {meta['python']}, {meta['clang']}; {meta['load_before']}",
          flush=True)
    rows: list[Row] = []
    if fresh := [k for k in keys if k in GROUPS["import"] + GROUPS["first"]]:
      from _fresh import first_result_row, import_rows
      for group, run in ((GROUPS["import"], lambda: import_rows(env, cfg.import_rounds, tg_missing)),
                         (GROUPS["first"], lambda: [first_result_row(env, cfg.first_rounds, tg_missing)])):
        if not set(group) & set(fresh): continue
        try: rows += [r for r in run() if r.key in keys]
        except Exception as e:
          rows += [Row(k, k, "ms", Side.missing("error"), Side.missing("error"), None, "-", "", f"{type(e).__name__}: {e}")
                   for k in group if k in keys]
    extra: list[str] = []
    if inproc := [k for k in keys if k.split("_")[0] in INPROC]:
      from _plugrt import PlugrtCPU
      sides: dict[str, Any] = {"plugrt": PlugrtCPU()}
      if tg_missing: sides["tinygrad"] = tg_missing
      else:
        from _tinygrad import TinygradCPU
        sides["tinygrad"] = TinygradCPU()
      rows += [inproc_row(k, cfg, sides) for k in inproc]
      if any(k.startswith("launch") for k in inproc):
        extra.append(f"ctypes call floor on this machine (libc labs(1) through ctypes): {ctypes_floor_us(cfg.launch_n, cfg.reps):.3f} us")
    if "eager_op" in keys: rows.append(eager_row(cfg, tg_missing))
    rows.sort(key=lambda r: KEYS.index(r.key))
    meta["load_after"] = load_note(warn=False)
    extra.append(f"before the run: {meta['load_before']}; after it: {meta['load_after']} (the benchmark itself keeps about one core busy)")
    if "PYTHONDONTWRITEBYTECODE" in base_env:
      extra.append("PYTHONDONTWRITEBYTECODE is set here; the fresh processes use a private PYTHONPYCACHEPREFIX instead, "
                   "so both sides import from bytecode as after a normal install")
    from _report import notes, table, to_json
    title = (f"plugrt vs tinygrad {meta['tinygrad']} on CPU ({'quick' if args.quick else 'full'} run): medians; "
             "ratio = tinygrad / plugrt (above 1: plugrt is faster); ~ = noisy (IQR over 25% of the median)")
    print(table(rows, title))
    print("\nnotes:")
    for line in notes(rows) + extra: print(f"  {line}")
    if args.json:
      with open(args.json, "w") as f: f.write(to_json(rows, meta, extra) + "\n")
      print(f"\nwrote {args.json}")
    failed = [r.key for r in rows if r.error] + (["tinygrad install"] if tg_missing else [])
    if failed: print(f"\nrun.py: errors in: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0
  finally:
    shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
  sys.exit(main())
