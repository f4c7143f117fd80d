"""Rows that need a fresh process: import + discovery, and the first result.

Each round runs every command once, the order rotating round by round, so that a
burst of load from elsewhere hits all of them. Untimed warm-up rounds (two; one for
short runs) first fill the bytecode cache and both libraries' compile caches.
"""
from __future__ import annotations

import statistics
from collections.abc import Callable

import _plugrt as ps
from _common import Row, Side, alternate, python_argv, run_timed

BARE = "pass"


def _rounds(cmds: dict[str, tuple[str, str | None]], env: dict[str, str], rounds: int) -> dict[str, list[float]]:
  """{name: wall seconds per round} for {name: (python code, expected stdout or None)}."""
  fns: dict[str, Callable[[], float] | None] = {
    k: (lambda code=code, want=want: run_timed(python_argv(code), env, want)) for k, (code, want) in cmds.items()}
  alternate(fns, (1 if rounds < 10 else 2) * len(fns))  # warm-up: bytecode, compile caches, page cache
  return alternate(fns, rounds)


def import_rows(env: dict[str, str], rounds: int, tinygrad: str) -> list[Row]:
  """plugrt's import + discovery vs `import tinygrad`, and the same plus opening the default device vs tinygrad's
  Device.DEFAULT, each as wall time beyond a bare `python -c pass` of the same round; `import pluggy` alone is
  measured too (plugrt's hooks need it; the note gives it). `tinygrad` is "" or why it is missing."""
  cmds: dict[str, tuple[str, str | None]] = {"bare": (BARE, ""), "plugrt": (ps.IMPORT_DISCOVERY, ""),
                                             "plugrt_default": (ps.IMPORT_DEFAULT, ""), "pluggy": ("import pluggy", "")}
  if not tinygrad:
    from _tinygrad import IMPORT, IMPORT_DEFAULT
    cmds.update(tg_import=(IMPORT, ""), tg_default=(IMPORT_DEFAULT, ""))
  t = _rounds(cmds, env, rounds)
  bare = t["bare"]

  def beyond(k: str) -> Side:
    if k not in t: return Side.missing(tinygrad)
    return Side.of([(x - b) * 1e3 for x, b in zip(t[k], bare)])

  pluggy = statistics.median(x - b for x, b in zip(t["pluggy"], bare)) * 1e3
  note = (f"bare python -c pass: {statistics.median(bare) * 1e3:.1f} ms (subtracted round by round); "
          f"`import pluggy` alone: {pluggy:.1f} ms of plugrt's figure")
  how = f"fresh `python -c`, wall time minus a bare `python -c pass` of the same round, median of {rounds} rounds"
  return [
    Row("import_discovery", "import + discovery", "ms", beyond("plugrt"), beyond("tg_import"), 30.0, "125-180 ms",
        f"plugrt: {ps.IMPORT_DISCOVERY!r}; tinygrad: {'import tinygrad'!r}; {how}; {note}"),
    Row("import_default", "import + default device", "ms", beyond("plugrt_default"), beyond("tg_default"), None, "-",
        f"plugrt: {ps.IMPORT_DEFAULT!r} (opens the device); tinygrad: {'from tinygrad import Device; Device.DEFAULT'!r}; {how}"),
  ]


def first_result_row(env: dict[str, str], rounds: int, tinygrad: str) -> Row:
  """The whole fresh process, wall time, both compile caches warm."""
  want = "[2, 3, 4]"
  cmds: dict[str, tuple[str, str | None]] = {"bare": (BARE, ""), "numpy": ("import numpy", ""), "plugrt": (ps.FIRST_RESULT, want)}
  if not tinygrad:
    from _tinygrad import FIRST_RESULT
    cmds["tinygrad"] = (FIRST_RESULT, want)
  t = _rounds(cmds, env, rounds)
  tg = Side.of([x * 1e3 for x in t["tinygrad"]]) if "tinygrad" in t else Side.missing(tinygrad)
  bare = statistics.median(t["bare"]) * 1e3
  numpy = statistics.median(x - b for x, b in zip(t["numpy"], t["bare"])) * 1e3
  return Row("first_result", "first result, fresh process", "ms", Side.of([x * 1e3 for x in t["plugrt"]]), tg, 150.0, "520 ms",
             f"whole-process wall time, warm caches, median of {rounds} rounds; not subtracted: bare python {bare:.1f} ms, "
             f"and `import numpy` (both sides' .numpy() needs it) {numpy:.1f} ms beyond bare python; "
             "both: Tensor([1,2,3]).add(1).numpy() on the default device (CPU here)")
