"""Timing helpers and the row record shared by both sides of the benchmark.

Every figure is a median over repetitions. In-process rows time N calls per
repetition and alternate plugrt and tinygrad repetition by repetition, so that load
from other processes hits both sides alike. Fresh-process rows time whole
subprocesses, the commands taking turns in each round.
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Side:
  """One side's figure: the median in the row's unit, the samples, or why there is none."""
  value: float | None = None
  samples: list[float] = field(default_factory=list)
  note: str = ""

  @classmethod
  def of(cls, samples: Sequence[float], note: str = "") -> Side:
    return cls(statistics.median(samples), list(samples), note)

  @classmethod
  def missing(cls, why: str) -> Side: return cls(None, [], why)

  @property
  def spread(self) -> float | None:
    """Interquartile range over the median: above ~0.25 the figure is noisy."""
    if len(self.samples) < 4 or not self.value: return None
    q = statistics.quantiles(self.samples, n=4)
    return (q[2] - q[0]) / self.value


@dataclass
class Row:
  key: str
  label: str
  unit: str                       # "ms" or "us"
  plugrt: Side
  tinygrad: Side
  target: float | None            # plugrt's target from ANCHORS.md, in `unit`; None: no target
  anchor: str                     # tinygrad's figure as ANCHORS.md gives it
  method: str = ""
  error: str = ""                 # set when the row failed (an error, not a missing toolchain)

  @property
  def ratio(self) -> float | None:
    p, t = self.plugrt.value, self.tinygrad.value
    return t / p if p and t is not None else None

  @property
  def meets(self) -> bool | None:
    return None if self.target is None or self.plugrt.value is None else self.plugrt.value <= self.target

  def to_json(self) -> dict[str, Any]:
    d = asdict(self)
    d.update(ratio=self.ratio, meets=self.meets)
    for side in ("plugrt", "tinygrad"):
      s: Side = getattr(self, side)
      d[side].update(spread=s.spread, min=min(s.samples) if s.samples else None)
    return d


def pick_rows(spec: str | None, keys: Sequence[str], groups: dict[str, Sequence[str]]) -> list[str]:
  """The rows a `--rows` value names (row keys or group names, comma-separated), in the bench's order; all when empty."""
  if not spec: return list(keys)
  want: set[str] = set()
  for name in (s.strip() for s in spec.split(",") if s.strip()):
    if name in groups: want.update(groups[name])
    elif name in keys: want.add(name)
    else: raise ValueError(f"unknown row {name!r}; rows: {', '.join(keys)}" + (f"; groups: {', '.join(groups)}" if groups else ""))
  return [k for k in keys if k in want]


def columns(lines: Sequence[Sequence[str]], left: Sequence[int] = (0,), unpadded_from: int | None = None) -> list[str]:
  """Rows of cells (the first is the head) as aligned text lines, a rule under the head: the columns in `left` are
  left-aligned, the others right-aligned, and columns from `unpadded_from` on are not padded at all."""
  widths = [max(len(str(line[i])) for line in lines) for i in range(len(lines[0]))]
  out = []
  for i, line in enumerate(lines):
    cells = (c if unpadded_from is not None and j >= unpadded_from else c.ljust(w) if j in left else c.rjust(w)
             for j, (c, w) in enumerate(zip(line, widths)))
    out.append("  ".join(cells).rstrip())
    if i == 0: out.append("  ".join("-" * w for w in widths))
  return out


def per_call(fn: Callable[[], Any], n: int) -> float:
  """Seconds per call of fn over n calls."""
  t = time.perf_counter()
  for _ in range(n): fn()
  return (time.perf_counter() - t) / n


def alternate(fns: dict[str, Callable[[], float] | None], reps: int) -> dict[str, list[float]]:
  """Call each fn once per round for `reps` rounds, the order rotating each round; collect what they return."""
  live = [k for k, f in fns.items() if f is not None]
  out: dict[str, list[float]] = {k: [] for k in live}
  for r in range(reps):
    for k in live[r % len(live):] + live[:r % len(live)] if live else []:
      out[k].append(fns[k]())  # type: ignore[misc]
  return out


def run_timed(argv: Sequence[str], env: dict[str, str], expect: str | None = None) -> float:
  """Wall seconds of one subprocess; raises RuntimeError if it fails or prints something other than `expect`."""
  t = time.perf_counter()
  p = subprocess.run(argv, env=env, capture_output=True, text=True)
  dt = time.perf_counter() - t
  if p.returncode != 0 or (expect is not None and p.stdout.strip() != expect):
    raise RuntimeError(f"{' '.join(argv[:2])} ... exited {p.returncode}, printed {p.stdout.strip()[-200:]!r}; stderr: {p.stderr.strip()[-600:]}")
  return dt


def python_argv(code: str) -> list[str]:
  """The real interpreter (not a pyenv shim) running `code`."""
  return [sys.executable, "-c", code]


def child_env(base: dict[str, str], workdir: str) -> dict[str, str]:
  """The environment of the fresh processes: both libraries' caches in `workdir`, and a private
  bytecode cache (PYTHONPYCACHEPREFIX) so that both sides import from .pyc files as after a normal
  install, even where PYTHONDONTWRITEBYTECODE is set (plugrt is installed editable, tinygrad from a wheel)."""
  env = dict(base)
  env.pop("PYTHONDONTWRITEBYTECODE", None)
  env.update(PYTHONPYCACHEPREFIX=os.path.join(workdir, "pycache"), PLUGRT_CACHE_DIR=os.path.join(workdir, "plugrt-cache"),
             CACHEDB=os.path.join(workdir, "tinygrad-cache.db"))
  return env


def load_note(warn: bool = True) -> str:
  try: one, five, _ = os.getloadavg()
  except OSError: return "load average unknown"
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
  busy = " (busy: other processes share the cores, figures will be noisy)" if warn and one > 0.5 * cores else ""
  return f"load average {one:.2f} / {five:.2f} (1 / 5 min) on {cores} cores{busy}"


class NotAvailable(Exception):
  """A side cannot be measured here (a toolchain or package is missing): reported, not an error."""


def ctypes_floor_us(n: int, reps: int) -> float:
  """Microseconds per ctypes call of libc's labs(1): the floor under any launch from Python through ctypes."""
  import ctypes
  labs = ctypes.CDLL(None).labs
  labs.argtypes, labs.restype = [ctypes.c_long], ctypes.c_long
  return statistics.median(per_call(lambda: labs(1), n) for _ in range(reps)) * 1e6
