"""What a fuzz run reports: one Outcome per case and target, the known bugs a failure may be, reproducer lines, and the
small cache that lets one seed run target by target while its case is built once.
"""
from __future__ import annotations

import os
import traceback
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: bugs this fuzzer found that are not fixed yet: id -> (what goes wrong, a substring of the failure it causes).
#: docs/fuzzing.md lists the ones found and fixed. A bug whose trigger the generators can leave out goes into
#: AVOIDABLE too, with a branch in the generator that checks `"<id>" in self.avoid`, so that a frequent known bug
#: does not hide others; pass avoid=frozenset() to hit them again. Both are empty while every found bug is fixed.
KNOWN_BUGS: dict[str, tuple[str, str]] = {}
AVOIDABLE: frozenset[str] = frozenset()


def classify(o: Outcome) -> str | None:
  """The known bug (KNOWN_BUGS) a failed outcome looks like, from its message; None: not one of them."""
  return next((bug for bug, (_, sign) in KNOWN_BUGS.items() if sign in o.detail), None)

@dataclass
class Outcome:
  kind: str            # ir | dsl | tensor
  seed: int
  target: str          # "CPU:CLANG", "PYTHON", ...
  status: str          # ok | fail | skip
  detail: str = ""     # the mismatch, the error, or why it was skipped
  repro: str = ""      # failures: what reproduces it (seed, kernel listing, source or expression)

  def describe(self) -> str:
    return f"{self.kind} seed {self.seed} on {self.target}: {self.status.upper()}: {self.detail}\n{self.repro}"


_CASES: OrderedDict[tuple, Any] = OrderedDict()


def cached_case(key: tuple, make: Callable[[], Any]) -> Any:
  """A few recent cases (and their reference results), so running one seed target by target builds it once."""
  if key in _CASES: _CASES.move_to_end(key)
  else:
    _CASES[key] = make()
    while len(_CASES) > 16: _CASES.popitem(last=False)
  return _CASES[key]


def error_text(e: BaseException) -> str:
  tb = traceback.extract_tb(e.__traceback__)
  where = f" (at {os.path.basename(tb[-1].filename)}:{tb[-1].lineno})" if tb else ""
  return f"{type(e).__name__}: {str(e)[:2000]}{where}"


def repro_line(kind: str, seed: int, call: str, avoid: frozenset[str]) -> str:
  flag = "" if avoid == AVOIDABLE else " --include-known" if not avoid else f" (avoid={sorted(avoid)})"
  return f"reproduce: python scripts/fuzz.py --kinds {kind} --seed {seed} --count 1{flag}   (or plugrt_testing.fuzz.{call})"
