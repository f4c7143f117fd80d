"""An independent evaluator of the @kernel DSL's documented semantics, for generated DSL kernels: int32 wrap after
every op, Python's floor `//` and `%`, float32 rounding per op, bool/int/float conversions, and per value an error
bound (approximate math) and a don't-care flag (a branch that bound could flip).
"""
from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import numpy as np

#: set while a DSL case's reference runs for a FAST_MATH device (see binary_op and reassociating)
_REASSOCIATES = False


@contextlib.contextmanager
def reassociating(on: bool) -> Iterator[None]:
  """While it lasts, binary_op gives float + and - the error bound of a reassociation (FAST_MATH_DEVICES)."""
  global _REASSOCIATES
  _REASSOCIATES = on
  try: yield
  finally: _REASSOCIATES = False

class RefValue:
  """A reference value: v (int, bool or np.float32), err (an absolute error bound the device may have beyond
  the reference: approximate functions), dc (don't care: the device may legitimately take another branch)."""
  __slots__ = ("dc", "err", "v")

  def __init__(self, v: Any, err: float = 0.0, dc: bool = False): self.v, self.err, self.dc = v, err, dc


def wrap32(x: int) -> int: return ((int(x) + (1 << 31)) & 0xFFFFFFFF) - (1 << 31)
def f32(x: Any) -> np.float32: return np.float32(x)
def ulp32(x: Any) -> float: return float(np.spacing(np.float32(abs(float(x)))))


def as_kind(r: RefValue, kind: str) -> RefValue:
  """The DSL's conversions: bool -> 0/1, int -> float32 (rounded), float -> int (truncated), any -> bool (!= 0)."""
  v = r.v
  if kind == "b":
    if isinstance(v, (bool, np.bool_)): return r
    return RefValue(bool(v != 0), 0.0, r.dc or (r.err > 0 and abs(float(v)) <= r.err))
  if kind == "i":
    if isinstance(v, np.float32):
      lo, hi = math.trunc(float(v) - r.err), math.trunc(float(v) + r.err)
      return RefValue(wrap32(math.trunc(float(v))), 0.0, r.dc or lo != hi)
    return RefValue(int(v), 0.0, r.dc)
  return RefValue(f32(float(v)) if not isinstance(v, np.float32) else v, r.err, r.dc)


def kind_of(v: Any) -> str: return "b" if isinstance(v, (bool, np.bool_)) else "f" if isinstance(v, np.float32) else "i"
def promote_kind(a: str, b: str) -> str: return "f" if "f" in (a, b) else "i" if "i" in (a, b) else "b"


def binary_op(op: str, a: RefValue, b: RefValue) -> RefValue:
  """a op b with the DSL's types: both operands promoted to the wider kind (bools to int32 for arithmetic)."""
  k = promote_kind(kind_of(a.v), kind_of(b.v))
  if k == "b" and op not in ("&", "|", "^"): k = "i"
  a, b = as_kind(a, k), as_kind(b, k)
  dc = a.dc or b.dc
  if k == "b": return RefValue(bool({"&": a.v and b.v, "|": a.v or b.v, "^": a.v != b.v}[op]), 0.0, dc)
  if k == "i":
    x, y = a.v, b.v
    r = {"+": lambda: x + y, "-": lambda: x - y, "*": lambda: x * y, "//": lambda: x // y, "%": lambda: x % y, "&": lambda: x & y,
         "|": lambda: x | y, "^": lambda: x ^ y, "<<": lambda: x << y, ">>": lambda: x >> y}[op]()
    return RefValue(wrap32(r), 0.0, dc)
  x, y = a.v, b.v
  ea, eb = a.err, b.err
  if op in ("+", "-"):
    v = x + y if op == "+" else x - y
    if _REASSOCIATES:  # the device may add in another order: up to an ulp of the operands, here and in a neighbour
      return RefValue(v, ea + eb + 2 * ulp32(max(abs(float(x)), abs(float(y)), abs(float(v)))), dc)
    return RefValue(v, ea + eb + (ulp32(v) if ea + eb else 0.0), dc)
  if op == "*":
    v = x * y
    e = ea * abs(float(y)) + eb * abs(float(x)) + ea * eb
    return RefValue(v, e + (ulp32(v) if e else 0.0), dc)
  if op == "/":
    v = x / y
    e = (ea + abs(float(v)) * eb) / max(abs(float(y)) - eb, 1e-30)
    return RefValue(v, e + (ulp32(v) if e else 0.0), dc)
  # Python's floor division and remainder (numpy's float32 floor_divide and remainder implement them)
  q, r = np.floor_divide(x, y), np.remainder(x, y)
  if ea or eb:
    qs = {math.floor((float(x) + sa * ea) / (float(y) + sb * eb)) for sa in (-1, 1) for sb in (-1, 1)}
    dc = dc or len(qs) > 1
  return RefValue(q, 0.0, dc) if op == "//" else RefValue(r, ea + abs(float(q)) * eb, dc)


def compare_op(op: str, a: RefValue, b: RefValue) -> RefValue:
  k = promote_kind(kind_of(a.v), kind_of(b.v))
  a, b = as_kind(a, k), as_kind(b, k)
  x, y = (float(a.v), float(b.v)) if k == "f" else (int(a.v), int(b.v))
  r = {"<": x < y, "<=": x <= y, ">": x > y, ">=": x >= y, "==": x == y, "!=": x != y}[op]
  return RefValue(bool(r), 0.0, a.dc or b.dc or (a.err + b.err > 0 and abs(x - y) <= a.err + b.err))
