"""The printed table and the JSON file."""
from __future__ import annotations

import json
from typing import Any

from _common import Row, Side, columns

NOISY = 0.25  # interquartile range / median above which a figure gets a "~"


def fmt(v: float | None, unit: str) -> str:
  if v is None: return "-"
  digits = 0 if abs(v) >= 100 else 1 if abs(v) >= 10 else 2 if abs(v) >= 1 else 3
  return f"{v:.{digits}f} {unit}"


def _side(s: Side, unit: str) -> str:
  return fmt(s.value, unit) + (" ~" if (sp := s.spread) is not None and sp > NOISY else "")


def table(rows: list[Row], title: str) -> str:
  head = ("row", "plugrt", "tinygrad", "ratio tg/plugrt", "plugrt target", "meets", "ANCHORS tinygrad")
  lines = [head]
  for r in rows:
    ratio = f"{r.ratio:.2f}x" if r.ratio is not None else "-"
    meets = {True: "yes", False: "NO", None: "-"}[r.meets]
    target = f"<= {fmt(r.target, r.unit)}" if r.target is not None else "-"
    lines.append((r.label, _side(r.plugrt, r.unit), _side(r.tinygrad, r.unit), ratio, target, meets, r.anchor))
  return "\n".join([title, "", *columns(lines, unpadded_from=6)])


def notes(rows: list[Row]) -> list[str]:
  """Per row: how it was measured, and why a figure is missing."""
  out = []
  for r in rows:
    out.append(f"{r.label}: {r.method}")
    for side in ("plugrt", "tinygrad"):
      s: Side = getattr(r, side)
      if s.note: out.append(f"  {side}: {s.note}")
    if r.error: out.append(f"  ERROR: {r.error}")
  return out


def to_json(rows: list[Row], meta: dict[str, Any], extra: list[str]) -> str:
  return json.dumps({"meta": meta, "rows": [r.to_json() for r in rows], "notes": extra}, indent=2)
