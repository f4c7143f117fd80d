"""Differential fuzzing: random kernels and Tensor expressions on every available device, checked against references.

Three generators, each a pure function of an integer seed (it seeds a numpy Generator):

- `ir_case(seed)`: a random IR kernel (KernelBuilder) with its inputs and launch size, as a `kernels.Case`. It is
  run by every (device, compiler) pair and compared with the reference interpreter (plugrt.interpreter).
- `dsl_case(seed)`: the Python source of a random @kernel function, with inputs, and the outputs an independent
  Python evaluator of the DSL's documented semantics computes (int32 wrap after every op, Python's floor `//`
  and `%`, float32 rounding per op). The source is written to a file, imported, and launched on every device.
- `tensor_case(seed)`: a random Tensor expression (broadcasting, elementwise ops, casts, where, reductions,
  matmul, views), evaluated by plugrt on every device and by numpy in the dtypes plugrt's promotion picks.

Every case stays inside defined behaviour: nonzero divisors (`b | 1`), shift amounts masked to bits-1,
float->int casts only of values clamped into range and not NaN, MAX/MIN never see NaN, no races. Approximate
float ops (EXP2/LOG2/SIN, and DIV/SQRT/RECIP on devices not in EXACT_DEVICES) never feed comparisons, WHERE
conditions, float->int casts or other discontinuous ops: the generators track which values are exact. The
MAX/MIN of two zeros may be either zero on different devices, so such values never reach a division, a
reciprocal or a bitcast. Integers and bools compare exactly, floats to a tolerance that follows the ops.

`run_ir(seed)`, `run_dsl(seed)` and `run_tensor(seed)` run one case everywhere and return one `Outcome` per
target; a failed outcome's `repro` holds what is needed to reproduce it (seed, listing or source).

KNOWN_BUGS lists the bugs this fuzzer found that are not fixed yet (none now: docs/fuzzing.md has those it found and
how each was fixed). The generators leave out what triggers the avoidable ones unless told to (`avoid=frozenset()`),
so that a frequent known bug does not hide others. The tests
(tests/test_fuzz.py) run fixed seeds; scripts/fuzz.py is the long run; docs/fuzzing.md has the details.
"""
from __future__ import annotations

import importlib.util
import math
import os
import tempfile
import traceback
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from plugrt.dtype import DType, bf16_to_f32, cast_value, dtypes, f32_to_bf16
from plugrt.errors import RenderError
from plugrt.ir import KernelBuilder, Ops, Val
from plugrt.testing import kernels as K

ALL = K.ALL
FLOATS, INTS = K.FLOATS, K.INTS
#: devices whose DIV, SQRT and RECIP are correctly rounded (IEEE); elsewhere they are approximate (K.ULPS)
EXACT_DEVICES = frozenset({"CPU", "PYTHON"})
#: devices whose compilers do fast math: WGSL lets them assume finite math (on lavapipe and NVIDIA `x - x` folds to 0
#: for an infinite x), and they reassociate float additions ((x + x) - 0.1 becomes x + (x - 0.1)). IR kernels' float
#: results that the reference makes infinite or NaN are not compared there (NaN tests still are), and DSL cases give
#: each float + and - an error bound of the rounding a reassociation may move (`dsl_case(..., reassociates=True)`).
FAST_MATH_DEVICES = frozenset({"WEBGPU"})
#: set while a DSL case's reference runs for a FAST_MATH device (see _arith)
_REASSOCIATES = False
#: bugs this fuzzer found that are not fixed yet: id -> (what goes wrong, a substring of the failure it causes).
#: docs/fuzzing.md lists the ones found and fixed. A bug whose trigger the generators can leave out goes into
#: AVOIDABLE too, with a branch in the generator that checks `"<id>" in self.avoid`, so that a frequent known bug
#: does not hide others; pass avoid=frozenset() to hit them again. Both are empty while every found bug is fixed.
KNOWN_BUGS: dict[str, tuple[str, str]] = {}
AVOIDABLE: frozenset[str] = frozenset()


def classify(o: Outcome) -> str | None:
  """The known bug (KNOWN_BUGS) a failed outcome looks like, from its message; None: not one of them."""
  return next((bug for bug, (_, sign) in KNOWN_BUGS.items() if sign in o.detail), None)


_MANT = {dtypes.float16: 10, dtypes.bfloat16: 7, dtypes.float32: 23, dtypes.float64: 52}
_EMAX = {dtypes.float16: 15, dtypes.bfloat16: 127, dtypes.float32: 127, dtypes.float64: 1023}


def _fmax(dt: DType) -> float:
  return {dtypes.float16: 65504.0, dtypes.bfloat16: float(bf16_to_f32(np.uint16(0x7F7F))), dtypes.float32: float(np.finfo(np.float32).max),
          dtypes.float64: float(np.finfo(np.float64).max)}[dt]


# ---------------------------------------------------------------- targets and outcomes

@dataclass(frozen=True)
class Target:
  device: str
  compiler: str | None = None  # None: the device's default (DSL and Tensor cases)

  def __str__(self) -> str: return f"{self.device}:{self.compiler}" if self.compiler else self.device
  @property
  def exact_div(self) -> bool: return self.device in EXACT_DEVICES
  @property
  def fast_math(self) -> bool: return self.device in FAST_MATH_DEVICES


def devices() -> list[str]:
  from plugrt.device import Device
  return Device.available()


def ir_targets() -> list[Target]:
  """Every (device, compiler) pair whose toolchain is present."""
  from plugrt.device import Device
  reg = Device.registry
  out = []
  for name in Device.available():
    spec = reg.backend(name).spec
    for c in spec.compilers if spec else ():
      if reg.compiler_probe(name, c.name).ok: out.append(Target(name, c.name))
  return out


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


def _cached(key: tuple, make: Callable[[], Any]) -> Any:
  """A few recent cases (and their reference results), so running one seed target by target builds it once."""
  if key in _CASES: _CASES.move_to_end(key)
  else:
    _CASES[key] = make()
    while len(_CASES) > 16: _CASES.popitem(last=False)
  return _CASES[key]


def _error(e: BaseException) -> str:
  tb = traceback.extract_tb(e.__traceback__)
  where = f" (at {os.path.basename(tb[-1].filename)}:{tb[-1].lineno})" if tb else ""
  return f"{type(e).__name__}: {str(e)[:2000]}{where}"


# ---------------------------------------------------------------- values

def _int_edges(dt: DType) -> list[int]:
  """Integers where implementations tend to differ: limits, powers of two and their neighbours, and values just
  past a float rounding midpoint (a conversion that rounds twice gets those wrong)."""
  lo, hi, bits = int(dt.min), int(dt.max), dt.bits
  cand = [0, 1, 2, 3, 7, hi, hi - 1, lo, lo + 1, -1, -2, -3, -7]
  for k in range(1, bits): cand += [1 << k, (1 << k) - 1, (1 << k) + 1, -(1 << k)]
  for k in (25, 31, 53, 54, 60, 62):
    for m in (8, 11, 24): cand += [(1 << k) + (1 << (k - m)) + 1, -((1 << k) + (1 << (k - m)) + 1), (1 << k) + (1 << (k - m)) - 1]
  return sorted({c for c in cand if lo <= c <= hi})


#: the smallest normal value of each float dtype: below it (and above 0) values are subnormal
_SMALLEST_NORMAL = {dtypes.float16: 2.0 ** -14, dtypes.bfloat16: 2.0 ** -126, dtypes.float32: 2.0 ** -126, dtypes.float64: 2.0 ** -1022}


def _float_edges(dt: DType, nan: bool, inf: bool) -> list[float]:
  mant, fmax = _MANT[dt], _fmax(dt)
  tiny = _SMALLEST_NORMAL[dt]
  cand = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1.5, 2.5, -2.5, 3.0, 0.1, -1 / 3, 1e-3, 100.0, 127.5, 255.5, -128.5, 1000.25, fmax, -fmax, tiny,
          -tiny, tiny * 2.0 ** -mant, tiny / 2, 2.0 ** (mant + 1), 2.0 ** (mant + 1) + 2, 65504.0, 2147483520.0, -2147483648.0, 3e9, 1e19]
  cand += [math.inf, -math.inf] * inf + [math.nan] * nan
  out = []
  for c in cand:
    if math.isfinite(c) and abs(c) > fmax: continue
    v = cast_value(c, dt) if math.isfinite(c) else c
    if math.isnan(v) and not nan: continue
    if math.isinf(v) and not inf: continue
    out.append(v)
  return out


def _to_storage(x: np.ndarray, dt: DType) -> np.ndarray:
  if dt is dtypes.bfloat16: return f32_to_bf16(np.asarray(x, np.float64).astype(np.float32))
  with np.errstate(all="ignore"): return np.asarray(x).astype(dt.numpy)


def fuzz_values(dt: DType, n: int, rng: np.random.Generator, special: float = 0.3, nan: bool = False, inf: bool = False) -> np.ndarray:
  """n values of dt (storage form): kernels.values' random ones, a fraction replaced by edge values."""
  x = K.values(dt, n, rng)
  if dt is dtypes.bool: return x
  pick = rng.random(n) < special
  if not pick.any(): return x
  if dt.kind in "iu":
    x[pick] = np.array(rng.choice(np.array(_int_edges(dt), dtype=object), int(pick.sum())), dtype=object).astype(dt.numpy)
  else:
    x[pick] = _to_storage(rng.choice(np.array(_float_edges(dt, nan, inf)), int(pick.sum())), dt)
  return x


def _scalar_value(dt: DType, rng: np.random.Generator) -> Any:
  if dt is dtypes.bool: return bool(rng.random() < 0.5)
  if dt.kind in "iu": return int(rng.choice(np.array(_int_edges(dt), dtype=object))) if rng.random() < 0.5 else int(K.values(dt, 8, rng)[7])
  edges = _float_edges(dt, nan=rng.random() < 0.15, inf=rng.random() < 0.2)
  return float(rng.choice(edges)) if rng.random() < 0.5 else float(K.as_float(K.values(dt, 1, rng), dt)[0])


def _float_below(limit: int, dt: DType) -> float:
  """The largest value of float dtype dt that is <= limit (an int > 0, compared exactly: float(2**63 - 1) is 2**63)."""
  if limit >= _fmax(dt): return _fmax(dt)
  if dt is dtypes.bfloat16:
    raw = int(f32_to_bf16(np.float32(limit)))
    while float(bf16_to_f32(np.uint16(raw))) > limit: raw -= 1
    return float(bf16_to_f32(np.uint16(raw)))
  v = np.array(float(limit)).astype(dt.numpy)
  while float(v) > limit: v = np.nextafter(v, dt.numpy.type(0))
  return float(v)


# ---------------------------------------------------------------- random IR kernels

@dataclass(eq=False)
class _V:
  """A value under construction and what is known about it."""
  v: Val
  ulps: float = 0.0    # floats: error bound (ulps of dt, plus atol) against the interpreter; 0 and 0: exact
  atol: float = 0.0
  nan: bool = False    # may be NaN
  inf: bool = False    # may be +-inf
  zs: bool = False     # a zero's sign is unspecified (it went through a float MAX/MIN)
  uni: bool = False    # the same in every thread of a group

  @property
  def dt(self) -> DType: return self.v.dtype
  @property
  def exact(self) -> bool: return self.ulps == 0 and self.atol == 0


_INT_BIN = (Ops.ADD, Ops.SUB, Ops.MUL, Ops.IDIV, Ops.MOD, Ops.MAX, Ops.MIN, Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR)
_FLOAT_BIN = (Ops.ADD, Ops.SUB, Ops.MUL, Ops.DIV, Ops.MAX, Ops.MIN)
_CMP = (Ops.CMPLT, Ops.CMPLE, Ops.CMPEQ, Ops.CMPNE)
_BITCASTS = {dt: [d for d in ALL if d.itemsize == dt.itemsize and d is not dt and d is not dtypes.bool] for dt in ALL}
_BITCASTS[dtypes.bool] = [dtypes.int8, dtypes.uint8]  # bool's bits are 0 or 1; int8 -> bool would make other bytes (see docs/fuzzing.md)


class _IRGen:
  MAX_THREADS = 48

  def __init__(self, seed: int, exact_div: bool, avoid: frozenset[str]):
    self.rng = np.random.default_rng([0x1F, seed])
    self.seed, self.exact_div, self.avoid = seed, exact_div, avoid
    self.b = KernelBuilder(f"fuzz_ir_{seed}")
    self.scopes: list[list[_V]] = [[]]
    self.uniform_blocks: list[bool] = []

  # ---- helpers
  def r(self) -> float: return float(self.rng.random())
  def choice(self, seq: Sequence[Any]) -> Any: return seq[int(self.rng.integers(len(seq)))]
  def add(self, v: _V) -> _V:
    self.scopes[-1].append(v)
    return v
  def pool(self) -> list[_V]: return [v for s in self.scopes for v in s]
  @property
  def uniform_here(self) -> bool: return all(self.uniform_blocks)

  def pick(self, pred: Callable[[_V], bool] = lambda v: True) -> _V | None:
    vals = [v for v in self.pool() if pred(v)]
    if not vals: return None
    w = np.arange(1, len(vals) + 1, dtype=np.float64) ** 1.5  # prefer recent values: deeper graphs
    return vals[int(self.rng.choice(len(vals), p=w / w.sum()))]

  def const(self, dt: DType) -> _V:
    if dt is dtypes.bool: x: Any = self.r() < 0.5
    elif dt.kind in "iu": x = int(self.choice(_int_edges(dt))) if self.r() < 0.6 else int(K.values(dt, 8, self.rng)[7])
    else: x = float(self.choice(_float_edges(dt, nan=self.r() < 0.1, inf=self.r() < 0.1)))
    xf = float(x) if dt.kind == "f" else 0.0
    return _V(self.b.const(x, dt), nan=math.isnan(xf), inf=math.isinf(xf), uni=True)

  def of_dtype(self, dt: DType, exact: bool = True) -> _V:
    """A value of dt: one from the pool, a constant, or a cast of another value."""
    got = self.pick(lambda v: v.dt is dt and (v.exact or not exact))
    if got is not None and self.r() < 0.8: return got
    if self.r() < 0.4: return self.const(dt)
    src = self.pick(lambda v: v.exact)
    return self.cast(src, dt) if src is not None else self.const(dt)

  def sanitize(self, x: _V) -> _V:
    """x without NaN (NaN -> 0): for MAX/MIN, float->int casts and bitcasts of floats."""
    if not x.nan: return x
    assert x.exact
    return _V(x.v.ne(x.v).where(self.b.const(0.0, x.dt), x.v), nan=False, inf=x.inf, zs=x.zs, uni=x.uni)

  def clamp(self, x: _V, lo: float, hi: float) -> _V:
    x = self.sanitize(x)
    v = x.v.max(self.b.const(lo, x.dt)).min(self.b.const(hi, x.dt))
    return _V(v, nan=False, inf=False, zs=True, uni=x.uni)

  # ---- ops
  def cast(self, x: _V, dt: DType) -> _V:
    src = x.dt
    if src.kind == "f" and dt.kind in "iu":  # out of range and NaN are undefined: clamp into range first
      lo = 0.0 if dt.kind == "u" else max(float(dt.min), -_fmax(src))
      x = self.clamp(x, lo, _float_below(int(dt.max), src))
    if src.kind == "f" and dt.kind == "f":
      mant_s, mant_d = _MANT[src], _MANT[dt]
      ulps = 0.0 if x.exact else x.ulps * 2.0 ** (mant_d - mant_s) + 1
      narrow = _fmax(dt) < _fmax(src)
      return _V(x.v.cast(dt), ulps, x.atol, x.nan, x.inf or narrow, x.zs, x.uni)
    if dt.kind == "f":
      return _V(x.v.cast(dt), inf=dt is dtypes.float16 and x.dt.kind in "iu" and x.dt.bits > 8, uni=x.uni)
    return _V(x.v.cast(dt), uni=x.uni)

  def bitcast(self, x: _V, dt: DType) -> _V | None:
    if x.dt.kind == "f":
      if not x.exact or x.zs: return None  # NaN payloads and the sign of MAX/MIN zeros differ between devices
      x = self.sanitize(x)
    return _V(x.v.bitcast(dt), nan=dt.kind == "f", inf=dt.kind == "f", uni=x.uni)

  def unary(self, x: _V) -> _V | None:
    dt, b = x.dt, self.b
    if dt is dtypes.bool or dt.kind in "iu":
      if dt.kind == "u" or dt is dtypes.bool or self.r() < 0.5: return _V(~x.v, uni=x.uni)
      return _V(-x.v, uni=x.uni)
    if not x.exact:  # approximate: only well-conditioned consumers
      if self.r() < 0.5: return _V(-x.v, x.ulps, x.atol, x.nan, x.inf, x.zs, x.uni)
      c = float(self.choice([0.5, 2.0, -3.0, 1.5, -0.25]))
      return _V(x.v * b.const(c, dt), x.ulps + 1, x.atol * abs(c), x.nan, True, x.zs, x.uni)
    op = self.choice([Ops.NEG, Ops.TRUNC, Ops.SQRT, Ops.RECIP, Ops.EXP2, Ops.LOG2, Ops.SIN])
    if op is Ops.NEG: return _V(-x.v, nan=x.nan, inf=x.inf, zs=x.zs, uni=x.uni)
    if op is Ops.TRUNC: return _V(x.v.trunc(), nan=x.nan, inf=x.inf, zs=x.zs, uni=x.uni)
    approx = not self.exact_div
    if op is Ops.SQRT: return _V(x.v.sqrt(), K.ULPS[op] * approx, 0.0, True, x.inf, x.zs, x.uni)
    if op is Ops.RECIP:
      if x.zs: return None
      return _V(x.v.recip(), K.ULPS[op] * approx, 0.0, x.nan, True, False, x.uni)
    if op is Ops.EXP2:  # keep the result normal and finite: an approximate overflow or underflow is not comparable
      e = _EMAX[dt] - 2
      x = self.clamp(x, -float(e), float(e))
      return _V(x.v.exp2(), K.ULPS[op], K._atol(op, dt), False, False, False, x.uni)
    if op is Ops.LOG2: return _V(x.v.log2(), K.ULPS[op], K._atol(op, dt), True, True, x.zs, x.uni)
    return _V(x.v.sin(), K.ULPS[op], K._atol(op, dt), x.nan or x.inf, False, x.zs, x.uni)

  def binary(self, dt: DType) -> _V | None:
    b = self.b
    if dt is dtypes.bool:
      x, y = self.of_dtype(dt), self.of_dtype(dt)
      op = self.choice([Ops.AND, Ops.OR, Ops.XOR, Ops.CMPNE, Ops.CMPEQ, Ops.CMPLT])
      return _V(b.alu(op, x.v, y.v), uni=x.uni and y.uni)
    if dt.kind in "iu":
      op = self.choice(_INT_BIN)
      x, y = self.of_dtype(dt), self.of_dtype(dt)
      yv = y.v
      if op in (Ops.IDIV, Ops.MOD):  # a zero divisor is unspecified: make it odd (MIN / -1 wraps, and is tested)
        yv = yv | b.const(1, dt) if self.r() < 0.8 else b.const(int(self.choice([v for v in _int_edges(dt) if v])), dt)
      elif op in (Ops.SHL, Ops.SHR):  # shifts by >= the width are undefined: mask the amount
        yv = yv & b.const(dt.bits - 1, dt) if self.r() < 0.7 else b.const(int(self.rng.integers(dt.bits)), dt)
      return _V(b.alu(op, x.v, yv), uni=x.uni and y.uni)
    op = self.choice(_FLOAT_BIN)
    x, y = self.of_dtype(dt), self.of_dtype(dt)
    if op in (Ops.MAX, Ops.MIN):
      x, y = self.sanitize(x), self.sanitize(y)
      return _V(b.alu(op, x.v, y.v), nan=False, inf=x.inf or y.inf, zs=True, uni=x.uni and y.uni)
    if op is Ops.DIV and y.zs: return None
    ulps = K.ULPS[Ops.DIV] if op is Ops.DIV and not self.exact_div else 0.0
    nan = x.nan or y.nan or op is Ops.DIV or (x.inf and y.inf) or (op is Ops.MUL and (x.inf or y.inf))
    return _V(b.alu(op, x.v, y.v), ulps, 0.0, nan, True, x.zs or y.zs, x.uni and y.uni)

  def compare(self) -> _V:
    x = self.pick(lambda v: v.exact) or self.const(self.choice(self.palette))
    y = self.of_dtype(x.dt)
    return _V(self.b.alu(self.choice(_CMP), x.v, y.v), uni=x.uni and y.uni)

  def where(self) -> _V:
    c = self.pick(lambda v: v.dt is dtypes.bool) or self.compare()
    x = self.pick() or self.const(self.choice(self.palette))
    y = self.of_dtype(x.dt, exact=False)
    return _V(c.v.where(x.v, y.v), max(x.ulps, y.ulps), max(x.atol, y.atol), x.nan or y.nan, x.inf or y.inf, x.zs or y.zs,
              c.uni and x.uni and y.uni)

  def gather(self) -> _V:
    """A load at a data-dependent (but in-bounds) index."""
    src = self.pick(lambda v: v.dt.kind in "iub") or self.add(_V(self.tid, uni=False))
    i = src.v.cast(dtypes.int32) if src.dt is not dtypes.int32 else src.v
    idx = (i & self.b.const(0x7FFFFFFF, dtypes.int32)) % self.b.const(self.T, dtypes.int32)
    ptr, _, nan, inf = self.choice(self.inputs)
    return _V(ptr[idx], nan=nan, inf=inf, uni=src.uni)

  def new_value(self) -> None:
    r = self.r()
    if r < 0.12: v = self.unary(self.pick() or self.const(self.choice(self.palette)))
    elif r < 0.55: v = self.binary(self.choice(self.palette))
    elif r < 0.65: v = self.compare()
    elif r < 0.73: v = self.where()
    elif r < 0.85:
      x = self.pick() or self.const(self.choice(self.palette))
      dt = self.choice(self.palette)
      if x.dt.kind == "f" and dt.kind != "f" and not x.exact: dt = self.choice([d for d in self.palette if d.kind == "f"] or [x.dt])
      if x.dt.kind == "f" and dt.kind != "f" and not x.exact: return
      v = self.cast(x, dt) if self.r() < 0.95 or x.dt is not dt else _V(x.v.cast(dt), x.ulps, x.atol, x.nan, x.inf, x.zs, x.uni)
    elif r < 0.92:
      x = self.pick(lambda v: any(d in self.palette for d in _BITCASTS[v.dt]))
      v = self.bitcast(x, self.choice([d for d in _BITCASTS[x.dt] if d in self.palette])) if x is not None else None
    else: v = self.gather()
    if v is not None: self.add(v)

  # ---- statements
  def store(self, x: _V) -> None:
    if x.dt not in self.outs: x = self.cast(x, dtypes.int32)  # a loop index of another integer dtype
    dt = x.dt
    j = len(self.slots[dt])
    self.slots[dt].append((x.ulps, x.atol))
    self.outs[dt][self.tid + self.b.const(j * self.T, dtypes.int32)] = x.v

  def block(self, budget: int, depth: int) -> None:
    start = len(self.scopes[-1])
    while budget > 0:
      r = self.r()
      if r < 0.62: self.new_value(); budget -= 1
      elif r < 0.74:
        x = self.pick()
        if x is not None: self.store(x)
        budget -= 1
      elif r < 0.82 and depth < 2: self.if_block(depth); budget -= 4
      elif r < 0.91 and depth < 2: self.loop(depth); budget -= 4
      elif r < 0.96 and self.shared and self.uniform_here: self.phase(); budget -= 2
      else: self.var_if(); budget -= 2
    mine = self.scopes[-1][start:]
    for x in (mine[-2:] if mine else []): self.store(x)

  def push(self, uniform: bool) -> None: self.scopes.append([]); self.uniform_blocks.append(uniform)
  def pop(self) -> None: self.scopes.pop(); self.uniform_blocks.pop()

  def exact_of(self, dt: DType) -> _V:
    return self.of_dtype(dt, exact=True) if dt.kind == "f" else self.of_dtype(dt)

  def combine(self, acc: Any, dt: DType) -> None:
    """acc = acc (op) something: a register variable updated in a loop or a branch."""
    cur = _V(acc.value, nan=dt.kind == "f", inf=dt.kind == "f", zs=dt.kind == "f")
    y = self.exact_of(dt)
    if dt is dtypes.bool: acc.value = self.b.alu(self.choice([Ops.AND, Ops.OR, Ops.XOR]), cur.v, y.v); return
    if dt.kind in "iu":
      op = self.choice([Ops.ADD, Ops.SUB, Ops.MUL, Ops.XOR, Ops.OR, Ops.MAX, Ops.MIN, Ops.SHL])
      yv = y.v & self.b.const(dt.bits - 1, dt) if op is Ops.SHL else y.v
      acc.value = self.b.alu(op, cur.v, yv)
      return
    op = self.choice([Ops.ADD, Ops.SUB, Ops.MUL, Ops.MAX, Ops.MIN])
    if op in (Ops.MAX, Ops.MIN): cur, y = self.sanitize(cur), self.sanitize(y)
    acc.value = self.b.alu(op, cur.v, y.v)

  def var_meta(self, acc: Any, dt: DType) -> _V:
    f = dt.kind == "f"
    return _V(acc.value, nan=f, inf=f, zs=f)

  def loop(self, depth: int) -> None:
    b = self.b
    rdt = self.choice([dtypes.int32] * 3 + [d for d in INTS if d is not dtypes.int32])
    start = int(self.rng.integers(-2, 3)) if rdt.kind == "i" else int(self.rng.integers(0, 3))
    src = self.pick(lambda v: v.dt.kind in "iub") if self.r() < 0.6 else None
    if src is None: end, uni = b.const(start + int(self.rng.integers(0, 5)), rdt), True
    else:
      n = src.v.cast(rdt) if src.dt is not rdt else src.v
      end, uni = (n & b.const(3, rdt)) + b.const(start, rdt), src.uni
    accs = []
    for _ in range(int(self.rng.integers(1, 3))):
      init = self.exact_of(self.choice(self.palette))
      accs.append((b.var(init.v, name=f"acc{len(self.b.uops)}"), init.dt))
    with b.range(b.const(start, rdt), end) as i:
      self.push(uni)
      self.add(_V(i, uni=uni))
      for acc, dt in accs:
        if self.r() < 0.5: self.add(self.var_meta(acc, dt))
      self.block(int(self.rng.integers(2, 6)), depth + 1)
      for acc, dt in accs: self.combine(acc, dt)
      self.pop()
    for acc, dt in accs: self.add(self.var_meta(acc, dt))

  def if_block(self, depth: int) -> None:
    c = self.pick(lambda v: v.dt is dtypes.bool) or self.compare()
    acc, dt = None, None
    if self.r() < 0.5:
      dt = self.choice(self.palette)
      acc = self.b.var(self.exact_of(dt).v, name=f"v{len(self.b.uops)}")
    with self.b.if_(c.v):
      self.push(c.uni)
      self.block(int(self.rng.integers(1, 5)), depth + 1)
      if acc is not None: self.combine(acc, dt)
      self.pop()
    if self.r() < 0.5:
      with self.b.else_():
        self.push(c.uni)
        self.block(int(self.rng.integers(1, 4)), depth + 1)
        if acc is not None: self.combine(acc, dt)
        self.pop()
    if acc is not None: self.add(self.var_meta(acc, dt))

  def var_if(self) -> None:
    """A variable set in both branches of an if/else (a phi)."""
    c = self.pick(lambda v: v.dt is dtypes.bool) or self.compare()
    x = self.pick() or self.const(self.choice(self.palette))
    y = self.of_dtype(x.dt, exact=False)
    acc = self.b.var(self.const(x.dt).v, name=f"v{len(self.b.uops)}")
    with self.b.if_(c.v): acc.value = x.v
    with self.b.else_(): acc.value = y.v
    self.add(_V(acc.value, max(x.ulps, y.ulps), max(x.atol, y.atol), True, True, True))

  def phase(self) -> None:
    """Write this thread's slot of a shared array, barrier, read a neighbour's, barrier (no races)."""
    b = self.b
    sh, dt = self.choice(self.shared)
    x = self.of_dtype(dt, exact=False)
    sh[self.lid] = x.v
    b.barrier()
    off = int(self.rng.integers(0, self.nlocal))
    w = sh[(self.lid + b.const(off, dtypes.int32)) % b.const(self.nlocal, dtypes.int32)]
    b.barrier()
    self.add(_V(w, x.ulps, x.atol, x.nan, x.inf, x.zs, False))

  # ---- the whole kernel
  def gen(self) -> K.Case:
    rng, b = self.rng, self.b
    gs, ls = [1, 1, 1], [1, 1, 1]
    for a in range(self.choice([1, 1, 2, 3])): gs[a], ls[a] = int(rng.integers(1, 4)), int(rng.integers(1, 5))
    while math.prod(gs) * math.prod(ls) > self.MAX_THREADS: ls[int(np.argmax(ls))] -= 1
    self.T, self.nlocal = math.prod(gs) * math.prod(ls), math.prod(ls)
    others = [d for d in ALL if d not in (dtypes.bool, dtypes.int32)]
    n_other = int(rng.choice([1, 1, 2, 2, 3]))  # few dtypes: few buffers (WebGPU allows 10 storage buffers)
    self.palette = [dtypes.bool, dtypes.int32, *(others[i] for i in rng.choice(len(others), n_other, replace=False))]
    self.outs = {dt: b.buffer(f"out_{dt.name}", dt) for dt in self.palette}
    self.slots: dict[DType, list[tuple[float, float]]] = {dt: [] for dt in self.palette}
    self.inputs, data = [], []
    for dt in self.palette:
      for k in range(1 + (self.r() < 0.15)):
        nan, inf = dt.kind == "f" and self.r() < 0.4, dt.kind == "f" and self.r() < 0.5
        self.inputs.append((b.buffer(f"in{k}_{dt.name}", dt), dt, nan, inf))
        data.append(fuzz_values(dt, self.T, rng, nan=nan, inf=inf))
    scalars = []
    for k in range(int(rng.integers(0, 3))):
      dt = self.choice(self.palette)
      val = _scalar_value(dt, rng)
      fv = float(val) if dt.kind == "f" else 0.0
      scalars.append(val)
      self.add(_V(b.scalar(f"s{k}", dt), nan=math.isnan(fv), inf=math.isinf(fv), uni=True))
    self.shared = []
    if self.nlocal > 1 and self.r() < 0.6:
      for k in range(int(rng.integers(1, 3))):
        dt = self.choice(self.palette)
        self.shared.append((b.shared(f"sh{k}", dt, self.nlocal), dt))
    g = [b.group_id(a) for a in range(3)]
    gx, gy, gz = (b.global_id(a) for a in range(3))
    wx, wy = b.num_groups(0) * b.local_size(0), b.num_groups(1) * b.local_size(1)
    self.tid = (gz * wy + gy) * wx + gx
    self.lid = (b.local_id(2) * b.local_size(1) + b.local_id(1)) * b.local_size(0) + b.local_id(0)
    gflat = (g[2] * b.num_groups(1) + g[1]) * b.num_groups(0) + g[0]
    self.add(_V(self.tid)); self.add(_V(self.lid)); self.add(_V(gflat, uni=True)); self.add(_V(g[int(rng.integers(3))], uni=True))
    for ptr, _, nan, inf in self.inputs:
      self.add(_V(ptr[self.tid], nan=nan, inf=inf))
      if self.r() < 0.4: self.add(_V(ptr[gflat % b.const(self.T, dtypes.int32)], nan=nan, inf=inf, uni=True))
      if self.r() < 0.3:
        self.add(_V(ptr[(self.tid + b.const(int(rng.integers(1, 7)), dtypes.int32)) % b.const(self.T, dtypes.int32)], nan=nan, inf=inf))
    self.block(int(rng.integers(10, 28)), 0)
    kernel = b.finish()
    outs = [fuzz_values(dt, max(1, len(self.slots[dt])) * self.T, rng) for dt in self.palette]
    ulps = {i: [(j * self.T, (j + 1) * self.T, math.ceil(u), a) for j, (u, a) in enumerate(self.slots[dt])]
            for i, dt in enumerate(self.palette) if dt.kind == "f"}
    return K.Case(kernel.name, kernel, outs + data, tuple(scalars), tuple(gs), tuple(ls), ulps)  # type: ignore[arg-type]


def ir_case(seed: int, exact_div: bool = True, avoid: frozenset[str] = AVOIDABLE) -> K.Case:
  """A random IR kernel with inputs and launch size. exact_div=False treats DIV/SQRT/RECIP as approximate
  (for devices outside EXACT_DEVICES), which changes what the generator may build on them. `avoid`: known bugs
  (KNOWN_BUGS) not to trigger."""
  return _IRGen(seed, exact_div, frozenset(avoid)).gen()


def _repro_line(kind: str, seed: int, call: str, avoid: frozenset[str]) -> str:
  flag = "" if avoid == AVOIDABLE else " --include-known" if not avoid else f" (avoid={sorted(avoid)})"
  return f"reproduce: python scripts/fuzz.py --kinds {kind} --seed {seed} --count 1{flag}   (or plugrt.testing.fuzz.{call})"


def ir_repro(seed: int, case: K.Case, exact_div: bool, avoid: frozenset[str] = AVOIDABLE) -> str:
  extra = "" if avoid == AVOIDABLE else f", avoid={sorted(avoid)!r}"
  return (_repro_line("ir", seed, f"ir_case({seed}, exact_div={exact_div}{extra})", avoid) + "\n"
          f"launch: groups {case.global_size} x threads {case.local_size}, scalars {case.vals!r}\n{case.kernel.dump()}")


def _nonfinite(a: np.ndarray, dt: DType) -> np.ndarray:
  """Which elements of a float buffer (bfloat16 as its bits) are infinite or NaN."""
  if dt.kind != "f": return np.zeros(len(a), bool)
  return ~np.isfinite(K.as_float(a, dt))


def _subnormal(x: np.ndarray, dt: DType) -> np.ndarray:
  with np.errstate(invalid="ignore"): return (x != 0) & (np.abs(x) < _SMALLEST_NORMAL[dt])


def flush_subnormals(case: K.Case) -> tuple[list[np.ndarray], tuple]:
  """The case's input buffers and scalars with every subnormal float replaced by a zero of its sign: what a device
  that flushes subnormals to zero (WGSL allows it; llvmpipe does it) computes with. An input with none is returned
  as it is (the same array), so a caller can tell that nothing changed."""
  sig = case.kernel.signature
  inputs = []
  for a, dt in zip(case.inputs, sig.buffers):
    if dt.kind == "f" and (m := _subnormal(K.as_float(a, dt), dt)).any():
      a = a.copy()
      a[m] = _to_storage(np.copysign(0.0, K.as_float(a[m], dt)), dt)
    inputs.append(a)
  vals = tuple(math.copysign(0.0, v) if dt.kind == "f" and _subnormal(np.float64(v), dt) else v for v, dt in zip(case.vals, sig.scalars))
  return inputs, vals


def _flush_tolerant(got: np.ndarray, want: np.ndarray, want_ftz: np.ndarray, dt: DType) -> np.ndarray:
  """Per element, the reference a flush-to-zero device may have followed: `want_ftz` (its inputs' subnormals flushed)
  where the device's value is nearer to it, and 0 where the result is a subnormal that the device flushed."""
  if dt.kind != "f": return np.where((got == want_ftz) & (got != want), want_ftz, want)
  g, w, f = K.as_float(got, dt), K.as_float(want, dt), K.as_float(want_ftz, dt)
  with np.errstate(invalid="ignore"):
    # nearer to it; or it is not finite, where a fast-math device may give any value (log2 of a flushed subnormal)
    use_ftz = (np.abs(g - f) < np.abs(g - w)) | ((g == f) & (g != w)) | (~np.isfinite(f) & np.isfinite(w))
  ref = np.where(use_ftz, want_ftz, want)
  flushed_out = (g == 0) & _subnormal(K.as_float(ref, dt), dt)
  return np.where(flushed_out, got, ref)


def _run_ir_case(dev: Any, case: K.Case, compiler: str | None, want: list[np.ndarray], fast_math: bool = False,
                 want_ftz: list[np.ndarray] | None = None) -> None:
  """K.run_case, with the interpreter's results computed once for all targets. On a fast_math device the elements
  the interpreter made infinite or NaN are not compared, and subnormals may be flushed to zero: each element may
  follow `want_ftz` (the interpreter on the inputs with their subnormals flushed) or be a flushed subnormal result."""
  from plugrt.device import Buffer
  prg = dev.program(case.kernel, compiler)
  sig = case.kernel.signature
  bufs = [Buffer(dev, len(a), dt).copyin(np.ascontiguousarray(a)) for a, dt in zip(case.inputs, sig.buffers)]
  prg(*bufs, global_size=case.global_size, local_size=case.local_size, vals=case.vals, wait=True)
  for i, (buf, w, dt, written) in enumerate(zip(bufs, want, sig.buffers, sig.written)):
    if not written: continue
    got = buf.numpy()
    if fast_math and want_ftz is not None: w = _flush_tolerant(got, w, want_ftz[i], dt)
    if fast_math and (m := _nonfinite(w, dt)).any(): got = np.where(m, w, got)
    for start, stop, nulps, atol in case.ulps.get(i, [(0, len(w), 0, 0.0)]):
      K.compare(f"{case.name}: buffer {case.kernel.buffers[i].arg[1]}[{start}:{stop}]", got[start:stop], w[start:stop], dt, nulps, atol)


def run_ir(seed: int, targets: Sequence[Target] | None = None, avoid: frozenset[str] = AVOIDABLE) -> list[Outcome]:
  """One random IR kernel on every target, against the interpreter."""
  from plugrt import interpreter
  from plugrt.device import Device
  targets = list(targets) if targets is not None else ir_targets()
  return _run_ir(seed, targets, avoid, interpreter, Device)


def _run_ir(seed: int, targets: list[Target], avoid: frozenset[str], interpreter: Any, Device: Any) -> list[Outcome]:
  out: list[Outcome] = []
  for t in targets:
    ed = t.exact_div
    def make(ed: bool = ed) -> tuple[K.Case, list[np.ndarray]]:
      case = ir_case(seed, ed, avoid)
      want = [a.copy() for a in case.inputs]
      interpreter.run(case.kernel, want, case.vals, case.global_size, case.local_size)
      return case, want
    case, want = _cached(("ir", seed, ed, avoid), make)
    want_ftz = None
    if t.fast_math:
      def make_ftz(case: K.Case = case, want: list[np.ndarray] = want) -> list[np.ndarray]:
        inputs, vals = flush_subnormals(case)
        if vals == case.vals and all(a is b for a, b in zip(inputs, case.inputs)): return want  # nothing to flush
        out = [a.copy() for a in inputs]
        interpreter.run(case.kernel, out, vals, case.global_size, case.local_size)
        return out
      want_ftz = _cached(("ir-ftz", seed, ed, avoid), make_ftz)
    try:
      _run_ir_case(Device[t.device], case, t.compiler, want, t.fast_math, want_ftz)
      out.append(Outcome("ir", seed, str(t), "ok"))
    except RenderError as e: out.append(Outcome("ir", seed, str(t), "skip", e.message))
    except Exception as e:
      detail = str(e) if isinstance(e, AssertionError) else _error(e)
      out.append(Outcome("ir", seed, str(t), "fail", detail, ir_repro(seed, case, ed, avoid)))
  return out


# ---------------------------------------------------------------- random DSL kernels

class _R:
  """A reference value: v (int, bool or np.float32), err (an absolute error bound the device may have beyond
  the reference: approximate functions), dc (don't care: the device may legitimately take another branch)."""
  __slots__ = ("dc", "err", "v")

  def __init__(self, v: Any, err: float = 0.0, dc: bool = False): self.v, self.err, self.dc = v, err, dc


def _wrap32(x: int) -> int: return ((int(x) + (1 << 31)) & 0xFFFFFFFF) - (1 << 31)
def _f32(x: Any) -> np.float32: return np.float32(x)
def _ulp32(x: Any) -> float: return float(np.spacing(np.float32(abs(float(x)))))


def _as_kind(r: _R, kind: str) -> _R:
  """The DSL's conversions: bool -> 0/1, int -> float32 (rounded), float -> int (truncated), any -> bool (!= 0)."""
  v = r.v
  if kind == "b":
    if isinstance(v, (bool, np.bool_)): return r
    return _R(bool(v != 0), 0.0, r.dc or (r.err > 0 and abs(float(v)) <= r.err))
  if kind == "i":
    if isinstance(v, np.float32):
      lo, hi = math.trunc(float(v) - r.err), math.trunc(float(v) + r.err)
      return _R(_wrap32(math.trunc(float(v))), 0.0, r.dc or lo != hi)
    return _R(int(v), 0.0, r.dc)
  return _R(_f32(float(v)) if not isinstance(v, np.float32) else v, r.err, r.dc)


def _kind_of(v: Any) -> str: return "b" if isinstance(v, (bool, np.bool_)) else "f" if isinstance(v, np.float32) else "i"
def _promote(a: str, b: str) -> str: return "f" if "f" in (a, b) else "i" if "i" in (a, b) else "b"


def _arith(op: str, a: _R, b: _R) -> _R:
  """a op b with the DSL's types: both operands promoted to the wider kind (bools to int32 for arithmetic)."""
  k = _promote(_kind_of(a.v), _kind_of(b.v))
  if k == "b" and op not in ("&", "|", "^"): k = "i"
  a, b = _as_kind(a, k), _as_kind(b, k)
  dc = a.dc or b.dc
  if k == "b": return _R(bool({"&": a.v and b.v, "|": a.v or b.v, "^": a.v != b.v}[op]), 0.0, dc)
  if k == "i":
    x, y = a.v, b.v
    r = {"+": lambda: x + y, "-": lambda: x - y, "*": lambda: x * y, "//": lambda: x // y, "%": lambda: x % y, "&": lambda: x & y,
         "|": lambda: x | y, "^": lambda: x ^ y, "<<": lambda: x << y, ">>": lambda: x >> y}[op]()
    return _R(_wrap32(r), 0.0, dc)
  x, y = a.v, b.v
  ea, eb = a.err, b.err
  if op in ("+", "-"):
    v = x + y if op == "+" else x - y
    if _REASSOCIATES:  # the device may add in another order: up to an ulp of the operands, here and in a neighbour
      return _R(v, ea + eb + 2 * _ulp32(max(abs(float(x)), abs(float(y)), abs(float(v)))), dc)
    return _R(v, ea + eb + (_ulp32(v) if ea + eb else 0.0), dc)
  if op == "*":
    v = x * y
    e = ea * abs(float(y)) + eb * abs(float(x)) + ea * eb
    return _R(v, e + (_ulp32(v) if e else 0.0), dc)
  if op == "/":
    v = x / y
    e = (ea + abs(float(v)) * eb) / max(abs(float(y)) - eb, 1e-30)
    return _R(v, e + (_ulp32(v) if e else 0.0), dc)
  # Python's floor division and remainder (numpy's float32 floor_divide and remainder implement them)
  q, r = np.floor_divide(x, y), np.remainder(x, y)
  if ea or eb:
    qs = {math.floor((float(x) + sa * ea) / (float(y) + sb * eb)) for sa in (-1, 1) for sb in (-1, 1)}
    dc = dc or len(qs) > 1
  return _R(q, 0.0, dc) if op == "//" else _R(r, ea + abs(float(q)) * eb, dc)


def _cmp(op: str, a: _R, b: _R) -> _R:
  k = _promote(_kind_of(a.v), _kind_of(b.v))
  a, b = _as_kind(a, k), _as_kind(b, k)
  x, y = (float(a.v), float(b.v)) if k == "f" else (int(a.v), int(b.v))
  r = {"<": x < y, "<=": x <= y, ">": x > y, ">=": x >= y, "==": x == y, "!=": x != y}[op]
  return _R(bool(r), 0.0, a.dc or b.dc or (a.err + b.err > 0 and abs(x - y) <= a.err + b.err))


@dataclass
class _E:
  """An expression of a generated DSL kernel: its source, and its value under the DSL's semantics."""
  kind: str                          # "i" int32, "f" float32, "b" bool
  src: str
  ev: Callable[[dict[str, _R]], _R]
  approx: bool = False               # may differ from the reference by an error bound (approximate math)
  bound: float = float(1 << 31)      # floats: |value| <= bound (the generator keeps floats finite)
  const: bool = False


def _lit_i(c: int) -> _E: return _E("i", f"({c})", lambda env: _R(c), const=True)


_FLOAT_LITERALS = (0.0, 0.5, 1.0, -1.0, 2.5, 0.1, 3.0, -0.25, 100.0, 1e-3, 1.5, -7.0)
_INT_LITERALS = (0, 1, 2, 3, 5, 7, -1, -2, -3, 16, 31, 100, -100, 1000, 65535, 2147483647, -2147483648)


class _DSLGen:
  def __init__(self, seed: int, exact_div: bool, avoid: frozenset[str]):
    self.rng = np.random.default_rng([0xD5, seed])
    self.seed, self.exact_div, self.avoid = seed, exact_div, avoid
    self.name = f"fuzz_dsl_{seed}"
    self.lines: list[str] = []
    self.scopes: list[list[tuple[str, str, bool, float]]] = [[]]  # (name, kind, approx, bound)
    self.nvar = 0
    self.slots = {"i": 0, "f": 0, "b": 0}

  def r(self) -> float: return float(self.rng.random())
  def choice(self, seq: Sequence[Any]) -> Any: return seq[int(self.rng.integers(len(seq)))]
  def var_list(self) -> list[tuple[str, str, bool, float]]: return [v for s in self.scopes for v in s]

  # ---- expressions
  def lit(self, kind: str) -> _E:
    if kind == "f":
      c = float(self.choice(_FLOAT_LITERALS))
      return _E("f", f"({c!r})", lambda env, v=_f32(c): _R(v), bound=abs(c), const=True)
    if kind == "b":
      return self.gen("b", 0)
    return _lit_i(int(self.choice(_INT_LITERALS)))

  def leaf(self, kind: str, exact: bool) -> _E:
    vars_ = [v for v in self.var_list() if v[1] == kind and not (exact and v[2])]
    r = self.r()
    if vars_ and r < 0.45:
      name, _, approx, bound = self.choice(vars_)
      return _E(kind, name, lambda env, n=name: env[n], approx, bound)
    if kind == "i":
      return self.choice([_E("i", "a[i]", lambda env: env["a[i]"]), _E("i", "b[i]", lambda env: env["b[i]"]), _E("i", "i", lambda env: env["i"]),
                          _E("i", "n", lambda env: env["n"]), _E("i", "a[b[i] % n]", lambda env: env["a[b[i]%n]"])])
    if kind == "f":
      return self.choice([_E("f", "x[i]", lambda env: env["x[i]"], bound=100.0), _E("f", "y[i]", lambda env: env["y[i]"], bound=100.0),
                          _E("f", "s", lambda env: env["s"], bound=100.0), _E("f", "x[a[i] % n]", lambda env: env["x[a[i]%n]"], bound=100.0)])
    return _E("b", "c[i]", lambda env: env["c[i]"])

  def gen(self, kind: str, depth: int, exact: bool = False) -> _E:
    """An expression of `kind`; exact=True: no approximate math in it (for comparisons, int(), floor, ...)."""
    if depth <= 0 or self.r() < 0.2: return self.leaf(kind, exact)
    return {"i": self.gen_int, "f": self.gen_float, "b": self.gen_bool}[kind](depth - 1, exact)

  def operand(self, kind: str, depth: int, exact: bool, other_const: bool = False) -> _E:
    if not other_const and self.r() < 0.25: return self.lit(kind)
    return self.gen(kind, depth, exact)

  def gen_int(self, d: int, exact: bool) -> _E:
    r = self.r()
    a = self.gen("i", d, exact)
    if r < 0.3:
      op = self.choice(["+", "-", "*", "&", "|", "^"])
      b = self.operand("i" if self.r() < 0.9 else "b", d, exact, a.const)
      return _E("i", f"({a.src} {op} {b.src})", lambda env: _arith(op, a.ev(env), b.ev(env)))
    if r < 0.42:  # floor division and modulo: a divisor that is never zero
      op = self.choice(["//", "%"])
      if self.r() < 0.5 and not a.const: b = _lit_i(int(self.choice([3, -3, 7, -1, 2, -2, 16])))
      else:
        inner = self.gen("i", d, exact)
        b = _E("i", f"({inner.src} | 1)", lambda env: _arith("|", inner.ev(env), _R(1)))
      return _E("i", f"({a.src} {op} {b.src})", lambda env: _arith(op, a.ev(env), b.ev(env)))
    if r < 0.5:  # shifts by 0..31 (more is undefined)
      op = self.choice(["<<", ">>"])
      if self.r() < 0.5: amt = _lit_i(int(self.rng.integers(0, 32)))
      else:
        inner = self.gen("i", d, exact)
        amt = _E("i", f"({inner.src} & 31)", lambda env: _arith("&", inner.ev(env), _R(31)))
      return _E("i", f"({a.src} {op} {amt.src})", lambda env: _arith(op, a.ev(env), amt.ev(env)))
    if r < 0.58:
      op = self.choice(["-", "~"])
      return _E("i", f"({op}{a.src})", lambda env: _R(_wrap32(-a.ev(env).v if op == "-" else ~a.ev(env).v), 0.0, a.ev(env).dc))
    if r < 0.64: return _E("i", f"abs({a.src})", lambda env: (lambda x: _R(_wrap32(abs(x.v)), 0.0, x.dc))(a.ev(env)))
    if r < 0.72:
      fn = self.choice(["min", "max"])
      rest = [self.operand("i", d, exact) for _ in range(int(self.rng.integers(1, 3)))]
      return _E("i", f"{fn}({a.src}, {', '.join(e.src for e in rest)})", lambda env: self._minmax(fn, [a.ev(env), *(e.ev(env) for e in rest)]))
    if r < 0.76:
      k = int(self.rng.integers(0, 4))
      return _E("i", f"({a.src} ** {k})", lambda env: (lambda x: _R(_wrap32(x.v ** k), 0.0, x.dc))(a.ev(env)))
    if r < 0.84:
      c, b = self.gen("b", d, True), self.gen("i", d, exact)
      return _E("i", f"({a.src} if {c.src} else {b.src})", lambda env: self._ifexp(c.ev(env), a.ev(env), b.ev(env), "i"))
    if r < 0.92:  # int() of a float that fits
      f = self.gen("f", d, True)
      if f.bound >= 2e9: return a
      return _E("i", f"int({f.src})", lambda env: _as_kind(f.ev(env), "i"))
    c = self.gen("b", d, True)
    return _E("i", f"({c.src} + {a.src})", lambda env: _arith("+", c.ev(env), a.ev(env)))

  @staticmethod
  def _minmax(fn: str, vals: list[_R]) -> _R:
    out = vals[0]
    for v in vals[1:]:
      k = _promote(_kind_of(out.v), _kind_of(v.v))
      x, y = _as_kind(out, k), _as_kind(v, k)
      pick = (x.v >= y.v if fn == "max" else x.v <= y.v) if k == "f" else (x.v > y.v if fn == "max" else x.v < y.v)
      out = _R(x.v if pick else y.v, max(x.err, y.err), x.dc or y.dc)
    return out

  @staticmethod
  def _ifexp(c: _R, a: _R, b: _R, kind: str) -> _R:
    a, b = _as_kind(a, kind), _as_kind(b, kind)
    out = a if c.v else b
    same = a.v == b.v and a.err == b.err == 0
    return _R(out.v, max(a.err, b.err), out.dc or (c.dc and not same))

  def gen_float(self, d: int, exact: bool) -> _E:
    r = self.r()
    a = self.gen("f", d, exact)
    approx_div = not self.exact_div
    if r < 0.3:
      op = self.choice(["+", "-", "*"])
      b = self.operand(self.choice("fffi"), d, exact, a.const)
      bb = b.bound if b.kind == "f" else float(1 << 31)
      bound = a.bound * bb if op == "*" else a.bound + bb
      if bound > 1e30: op, bound = "+", a.bound + bb
      if bound > 1e30: return a
      pair = (a, b) if self.r() < 0.5 else (b, a)
      return _E("f", f"({pair[0].src} {op} {pair[1].src})", lambda env: _arith(op, pair[0].ev(env), pair[1].ev(env)), a.approx or b.approx,
                bound * 1.01)
    if r < 0.38 and not (exact and approx_div):  # true division by a value at least 0.5 from zero
      b = self.gen(self.choice("fi"), d, exact)
      src = f"({a.src} / (abs({b.src}) + 0.5))"
      return _E("f", src, lambda env: _arith("/", a.ev(env), _arith("+", self._abs(b.ev(env)), _R(_f32(0.5)))), a.approx or b.approx or approx_div,
                a.bound * 2.02)
    if r < 0.43 and self.exact_div and not a.approx:  # Python's floor division and remainder on floats
      op = self.choice(["//", "%"])
      b = self.gen("f", d, True)
      if b.approx: return a
      src = f"({a.src} {op} (abs({b.src}) + 0.5))"
      return _E("f", src, lambda env: _arith(op, a.ev(env), _arith("+", self._abs(b.ev(env)), _R(_f32(0.5)))), False,
                (a.bound * 2.02 + 1) if op == "//" else b.bound + 1)
    if r < 0.5:
      op = self.choice(["-", "abs"])
      if op == "-": return _E("f", f"(-{a.src})", lambda env: (lambda x: _R(-x.v, x.err, x.dc))(a.ev(env)), a.approx, a.bound)
      return _E("f", f"abs({a.src})", lambda env: self._abs(a.ev(env)), a.approx, a.bound)
    if r < 0.57:
      fn = self.choice(["min", "max"])
      rest = [self.operand(self.choice("ffi"), d, exact) for _ in range(int(self.rng.integers(1, 3)))]
      bound = max([a.bound] + [e.bound if e.kind == "f" else float(1 << 31) for e in rest])
      return _E("f", f"{fn}({a.src}, {', '.join(e.src for e in rest)})", lambda env: self._minmax(fn, [a.ev(env), *(e.ev(env) for e in rest)]),
                a.approx or any(e.approx for e in rest), bound)
    if r < 0.63 and not a.approx:
      fn = self.choice(["floor", "ceil", "trunc"])
      return _E("f", f"math.{fn}({a.src})", lambda env: self._round_fn(fn, a.ev(env)), False, a.bound + 1)
    if r < 0.67:
      k = int(self.rng.integers(0, 4))
      if a.bound ** max(k, 1) > 1e30: return a
      def power(env: dict[str, _R], k: int = k) -> _R:
        x, out = a.ev(env), _R(_f32(1.0))
        for _ in range(k): out = _arith("*", out, x)
        return out
      return _E("f", f"({a.src} ** {k})", power, a.approx, max(a.bound ** k, 1.0))
    if r < 0.82 and not exact:
      return self.math_call(a)
    if r < 0.88:
      i = self.gen("i", d, exact)
      return _E("f", f"float({i.src})", lambda env: _as_kind(i.ev(env), "f"), i.approx, float(1 << 31))
    c, b = self.gen("b", d, True), self.gen("f", d, exact)
    return _E("f", f"({a.src} if {c.src} else {b.src})", lambda env: self._ifexp(c.ev(env), a.ev(env), b.ev(env), "f"), a.approx or b.approx,
              max(a.bound, b.bound))

  @staticmethod
  def _abs(x: _R) -> _R:
    if _kind_of(x.v) != "f": x = _as_kind(x, "i")
    return _R(abs(x.v) if _kind_of(x.v) == "f" else _wrap32(abs(x.v)), x.err, x.dc)

  @staticmethod
  def _round_fn(fn: str, x: _R) -> _R:
    f = {"floor": math.floor, "ceil": math.ceil, "trunc": math.trunc}[fn]
    dc = x.dc or (x.err > 0 and f(float(x.v) - x.err) != f(float(x.v) + x.err))
    return _R(_f32(float(f(float(x.v)))), 0.0, dc)

  def math_call(self, a: _E) -> _E:
    """An approximate math function, its argument kept in a range where the result is finite and well-conditioned."""
    fn = self.choice(["sqrt", "exp", "log", "sin", "cos", "exp2", "log2", "pow05"])
    clamp = f"min(max({a.src}, -20.0), 20.0)"
    if fn in ("sqrt", "pow05"):
      src = f"math.sqrt(abs({a.src}))" if fn == "sqrt" else f"(abs({a.src}) ** 0.5)"
      arg, bound = (lambda env: self._abs(a.ev(env))), math.sqrt(a.bound) + 1
    elif fn in ("log", "log2"):
      src, bound = f"math.{fn}(abs({a.src}) + 1.0)", 90.0
      arg = lambda env: _arith("+", self._abs(a.ev(env)), _R(_f32(1.0)))
    elif fn in ("exp", "exp2"):
      src, bound = f"math.{fn}({clamp})", 5e8
      arg = lambda env: self._minmax("min", [self._minmax("max", [a.ev(env), _R(_f32(-20.0))]), _R(_f32(20.0))])
    else:
      src, bound = f"math.{fn}({clamp})", 1.0
      arg = lambda env: self._minmax("min", [self._minmax("max", [a.ev(env), _R(_f32(-20.0))]), _R(_f32(20.0))])
    exact_sqrt = fn in ("sqrt", "pow05") and self.exact_div

    def ev(env: dict[str, _R]) -> _R:
      x = arg(env)
      xv = float(x.v)
      if exact_sqrt:
        y = float(np.sqrt(x.v))
        e = math.sqrt(xv + x.err) - math.sqrt(max(xv - x.err, 0.0)) if x.err else 0.0
        return _R(_f32(y), e + (_ulp32(y) if e else 0.0), x.dc)
      y = {"sqrt": math.sqrt, "pow05": math.sqrt, "exp": math.exp, "log": math.log, "sin": math.sin, "cos": math.cos, "exp2": math.exp2,
           "log2": math.log2}[fn](xv)
      # error: the op's own (a few ulps), the argument's error through the derivative, and the DSL's rewrites
      # (exp(x) = exp2(x * log2(e)), log(x) = log2(x) * ln 2, cos(x) = sin(x + pi/2): each rounds its argument once)
      if fn in ("sqrt", "pow05"): deriv = (math.sqrt(xv + x.err) - math.sqrt(max(xv - x.err, 0.0))) / x.err if x.err else 0.0
      elif fn in ("log", "log2"): deriv = 1 / (max(xv - x.err, 1e-30) * (math.log(2) if fn == "log2" else 1.0))
      else: deriv = {"exp": abs(y) * 1.01, "exp2": abs(y) * 1.01 * math.log(2), "sin": 1.0, "cos": 1.0}[fn]
      rewrite = {"exp": abs(y) * abs(xv) * 2 ** -22, "log": abs(y) * 2 ** -22, "cos": _ulp32(abs(xv) + 2) + 1e-7}.get(fn, 0.0)
      e = x.err * deriv + rewrite + 8 * _ulp32(y) + 2e-7 * (fn in ("sin", "cos", "log", "log2"))
      return _R(_f32(y), e, x.dc)
    return _E("f", src, ev, True, bound)

  def gen_bool(self, d: int, exact: bool) -> _E:
    r = self.r()
    if r < 0.45:  # comparisons, chained like Python's
      ops = [self.choice(["<", "<=", ">", ">=", "==", "!="]) for _ in range(int(self.rng.integers(1, 3)))]
      terms = [self.gen(self.choice("iifb"), d, True) for _ in range(len(ops) + 1)]
      src = " ".join([terms[0].src] + [f"{o} {t.src}" for o, t in zip(ops, terms[1:])])

      def chain(env: dict[str, _R]) -> _R:
        vals = [t.ev(env) for t in terms]  # every term is evaluated (the DSL does not short-circuit)
        out = _R(True)
        for o, x, y in zip(ops, vals, vals[1:]):
          c = _cmp(o, x, y)
          out = _R(out.v and c.v, 0.0, out.dc or c.dc)
        return out
      return _E("b", f"({src})", chain)
    if r < 0.65:
      op = self.choice(["and", "or"])
      a, b = self.gen("b", d, True), self.gen(self.choice("bbi"), d, True)
      def logic(env: dict[str, _R]) -> _R:
        x, y = _as_kind(a.ev(env), "b"), _as_kind(b.ev(env), "b")
        return _R(bool(x.v and y.v) if op == "and" else bool(x.v or y.v), 0.0, x.dc or y.dc)
      return _E("b", f"({a.src} {op} {b.src})", logic)
    if r < 0.75:
      a = self.gen("b", d, True)
      return _E("b", f"(not {a.src})", lambda env: (lambda x: _R(not x.v, 0.0, x.dc))(_as_kind(a.ev(env), "b")))
    if r < 0.85:
      a = self.gen(self.choice("if"), d, True)
      return _E("b", f"bool({a.src})", lambda env: _as_kind(a.ev(env), "b"))
    op = self.choice(["&", "|", "^"])
    a, b = self.gen("b", d, True), self.gen("b", d, True)
    return _E("b", f"({a.src} {op} {b.src})", lambda env: _arith(op, a.ev(env), b.ev(env)))

  # ---- statements (each returns the reference's version: a function of the environment and the thread's outputs)
  def emit(self, depth: int, text: str) -> None: self.lines.append("  " * (depth + 1) + text)

  def new_var(self) -> str:
    self.nvar += 1
    return f"v{self.nvar}"

  def store(self, depth: int, e: _E) -> Callable[..., None]:
    kind = e.kind if e.kind != "b" or self.r() < 0.7 else "i"
    buf = {"i": "oi", "f": "of", "b": "ob"}[kind]
    j = self.slots[kind]
    self.slots[kind] += 1
    self.emit(depth, f"{buf}[{j} * n + i] = {e.src}")
    def st(env: dict[str, _R], out: dict[str, Any]) -> None: out[kind][j] = _as_kind(e.ev(env), kind)
    return st

  def store_var(self, depth: int) -> Callable[..., None]:
    """Store the newest variable: values are checked where they are made, before comparisons hide small errors."""
    name, kind, approx, bound = self.scopes[-1][-1]
    return self.store(depth, _E(kind, name, lambda env: env[name], approx, bound))

  def block(self, depth: int, budget: int) -> list[Callable[..., None]]:
    stmts: list[Callable[..., None]] = []
    self.scopes.append([])
    while budget > 0:
      r = self.r()
      if r < 0.4:
        kind = self.choice("iifb")
        e = self.gen(kind, int(self.rng.integers(1, 4)))
        name = self.new_var()
        self.emit(depth, f"{name} = {e.src}")
        stmts.append(lambda env, out, n=name, e=e, k=kind: env.__setitem__(n, _as_kind(e.ev(env), k)))
        self.scopes[-1].append((name, kind, e.approx, e.bound))
        if self.r() < 0.5: stmts.append(self.store_var(depth))
        budget -= 1
      elif r < 0.62:
        stmts.append(self.store(depth, self.gen(self.choice("iifb"), int(self.rng.integers(1, 4)))))
        budget -= 1
      elif r < 0.8 and depth < 3:
        stmts.append(self.if_stmt(depth))
        if self.r() < 0.6: stmts.append(self.store_var(depth))
        budget -= 3
      elif r < 0.95 and depth < 3:
        stmts.append(self.for_stmt(depth))
        if self.r() < 0.6: stmts.append(self.store_var(depth))
        budget -= 3
      else: budget -= 1
    if not stmts: stmts.append(self.store(depth, self.gen(self.choice("iifb"), 2)))
    self.scopes.pop()
    return stmts

  def if_stmt(self, depth: int) -> Callable[..., None]:
    """if/elif/else; a variable assigned in every branch (maybe with narrower kinds: the widest wins) is used after."""
    kind = self.choice("iifb")
    name = self.new_var()
    nbranch = int(self.rng.integers(1, 4))
    conds, bodies, values = [], [], []
    widest = int(self.rng.integers(nbranch))
    for k in range(nbranch):
      if k == 0 or k < nbranch - 1 or nbranch == 1:
        c = self.gen("b", 2, True) if self.r() < 0.8 else self.gen(self.choice("if"), 2, True)
        self.emit(depth, f"{'if' if k == 0 else 'elif'} {c.src}:")
        conds.append(c)
      else: self.emit(depth, "else:")
      bodies.append(self.block(depth + 1, int(self.rng.integers(1, 4))))
      narrow = kind != "b" and k != widest  # the other branches may assign a narrower kind: the variable takes the widest
      alt = self.choice({"i": "bi", "f": "bif", "b": "b"}[kind])
      vk = alt if narrow else kind
      v = self.gen(vk, 2)
      self.emit(depth + 1, f"{name} = {v.src}")
      values.append(v)
    has_else = len(conds) < nbranch
    if not has_else:
      self.emit(depth, "else:")
      v = self.gen(kind, 2)
      self.emit(depth + 1, f"{name} = {v.src}")
      values.append(v); bodies.append([])
    self.scopes[-1].append((name, kind, any(v.approx for v in values), max(v.bound for v in values) if kind == "f" else float(1 << 31)))

    def st(env: dict[str, _R], out: dict[str, Any]) -> None:
      for k, c in enumerate(conds + [None]):
        if c is not None:
          cv = _as_kind(c.ev(env), "b")
          if cv.dc: out["tainted"] = True
          if not cv.v: continue
        for s in bodies[k]: s(env, out)
        env[name] = _as_kind(values[k].ev(env), kind)
        return
    return st

  def for_stmt(self, depth: int) -> Callable[..., None]:
    """for over a small range (constant or data-dependent bounds, any step), updating an accumulator."""
    step = int(self.choice([1, 1, 1, 2, 3, -1, -2]))
    def bound_expr() -> _E:
      if self.r() < 0.4:
        c = int(self.rng.integers(-3, 9))
        return _lit_i(c)
      inner = self.gen("i", 2, True)
      mask = self.choice(["& 7", "% 5", "& 3"])
      return _E("i", f"({inner.src} {mask})", lambda env: _arith(mask[0], inner.ev(env), _R(int(mask[2:]))))
    start, stop = bound_expr(), bound_expr()
    if step < 0: start, stop = stop, start
    kind = self.choice("iiffb")
    acc = self.new_var()
    init = self.gen(self.choice({"i": "bi", "f": "if", "b": "b"}[kind]), 2, kind != "f")
    self.emit(depth, f"{acc} = {init.src}")
    loopvar = f"k{self.nvar}"
    rng_src = f"range({start.src}, {stop.src}, {step})" if step != 1 or self.r() < 0.5 else f"range({start.src}, {stop.src})"
    self.emit(depth, f"for {loopvar} in {rng_src}:")
    self.scopes.append([(loopvar, "i", False, 16.0)])
    body = self.block(depth + 1, int(self.rng.integers(1, 4)))
    upd = self.gen(kind, 2)
    if kind == "i":
      op = self.choice(["+=", "-=", "^=", "*=", "|="])
      self.emit(depth + 1, f"{acc} {op} {upd.src}")
      update = lambda env: _arith(op[0], env[acc], upd.ev(env))
    elif kind == "f":
      if upd.bound > 1e27: upd = self.lit("f")
      op = self.choice(["+=", "-=", "max", "min"])
      if op in ("max", "min"):
        self.emit(depth + 1, f"{acc} = {op}({acc}, {upd.src})")
        update = lambda env: self._minmax(op, [env[acc], upd.ev(env)])
      else:
        self.emit(depth + 1, f"{acc} {op} {upd.src}")
        update = lambda env: _arith(op[0], env[acc], upd.ev(env))
    else:
      op = self.choice(["or", "and", "^"])
      self.emit(depth + 1, f"{acc} = {acc} {op} {upd.src}")
      update = lambda env: (_arith("^", env[acc], _as_kind(upd.ev(env), "b")) if op == "^" else
                            self._logic(op, env[acc], upd.ev(env)))
    self.scopes.pop()
    bound = (init.bound if init.kind == "f" else float(1 << 31)) + 20 * upd.bound if kind == "f" else float(1 << 31)
    self.scopes[-1].append((acc, kind, init.approx or upd.approx, bound))

    def st(env: dict[str, _R], out: dict[str, Any]) -> None:
      env[acc] = _as_kind(init.ev(env), kind)
      a, b = start.ev(env), stop.ev(env)
      if a.dc or b.dc: out["tainted"] = True
      for kv in range(a.v, b.v, step):
        env[loopvar] = _R(kv)
        for s in body: s(env, out)
        env[acc] = _as_kind(update(env), kind)
    return st

  @staticmethod
  def _logic(op: str, a: _R, b: _R) -> _R:
    x, y = _as_kind(a, "b"), _as_kind(b, "b")
    return _R(bool(x.v and y.v) if op == "and" else bool(x.v or y.v), 0.0, x.dc or y.dc)

  # ---- the whole kernel
  def build(self) -> DSLCase:
    rng = self.rng
    groups, threads = int(rng.integers(1, 5)), int(rng.integers(1, 9))
    T = groups * threads
    body = self.block(0, int(rng.integers(6, 16)))
    for name, kind, _, _ in self.scopes[0][-3:]:  # the last values: stored at the top level too
      body.append(self.store(0, _E(kind, name, lambda env, n=name: env[n])))
    src = ["import math", "", "from plugrt import dtypes, kernel", "from plugrt.dsl import global_id", "", "",
           f"# generated by plugrt.testing.fuzz.dsl_case({self.seed}, exact_div={self.exact_div})", "@kernel",
           f"def {self.name}(oi: dtypes.int32[:], of: dtypes.float32[:], ob: dtypes.bool[:], a: dtypes.int32[:], b: dtypes.int32[:], "
           "x: dtypes.float32[:], y: dtypes.float32[:], c: dtypes.bool[:], n: dtypes.int32, s: dtypes.float32):",
           "  i = global_id(0)", *self.lines, ""]
    a, b = fuzz_values(dtypes.int32, T, rng), fuzz_values(dtypes.int32, T, rng)
    edges = np.array([0.0, -0.0, 0.5, -0.5, 1.0, -1.0, 2.5, -2.5, 1e-3, 100.0, 99.5, 0.1, 3.0, -7.0], np.float32)
    def floats() -> np.ndarray:
      x = rng.uniform(-100, 100, T).astype(np.float32)
      pick = rng.random(T) < 0.3
      x[pick] = rng.choice(edges, int(pick.sum()))
      return x
    x, y, c = floats(), floats(), rng.random(T) < 0.5
    sval = float(rng.choice(edges))
    init = {"i": fuzz_values(dtypes.int32, max(1, self.slots["i"]) * T, rng), "f": floats().repeat(max(1, self.slots["f"])),
            "b": rng.random(max(1, self.slots["b"]) * T) < 0.5}
    want = {k: v.copy() for k, v in init.items()}
    err = {k: np.zeros(len(v)) for k, v in init.items()}
    dc = {k: np.zeros(len(v), bool) for k, v in init.items()}
    with np.errstate(all="ignore"):
      for t in range(T):
        env = {"i": _R(t), "n": _R(T), "a[i]": _R(int(a[t])), "b[i]": _R(int(b[t])), "x[i]": _R(x[t]), "y[i]": _R(y[t]), "s": _R(_f32(sval)),
               "c[i]": _R(bool(c[t])), "a[b[i]%n]": _R(int(a[int(b[t]) % T])), "x[a[i]%n]": _R(x[int(a[t]) % T])}
        out: dict[str, Any] = {"i": {}, "f": {}, "b": {}, "tainted": False}
        for st in body: st(env, out)
        for kind in "ifb":
          for j, rv in out[kind].items():
            want[kind][j * T + t] = rv.v
            err[kind][j * T + t] = rv.err
            dc[kind][j * T + t] = rv.dc
          if out["tainted"]: dc[kind][np.arange(len(dc[kind])) % T == t] = True  # another branch may have run: this thread is unchecked
    return DSLCase(self.seed, self.exact_div, self.name, "\n".join(src), groups, threads,
                   {"a": a, "b": b, "x": x, "y": y, "c": c}, (T, sval), self.avoid, init, want, err, dc)


@dataclass
class DSLCase:
  seed: int
  exact_div: bool
  name: str
  source: str                         # a module defining one @kernel function, `name`
  groups: int
  threads: int
  inputs: dict[str, np.ndarray]       # a, b (int32), x, y (float32), c (bool)
  scalars: tuple[int, float]          # n (the thread count), s
  avoid: frozenset[str]
  init: dict[str, np.ndarray]         # the outputs' initial contents: "i" -> oi, "f" -> of, "b" -> ob
  want: dict[str, np.ndarray]         # what the DSL's semantics give
  err: dict[str, np.ndarray] = field(default_factory=dict)  # floats: error bounds (approximate math)
  dc: dict[str, np.ndarray] = field(default_factory=dict)   # elements not checked (a branch an error bound could flip)
  reassociates: bool = False          # the reference allows float + and - to be reassociated (FAST_MATH_DEVICES)

  def repro(self) -> str:
    extra = ("" if self.avoid == AVOIDABLE else f", avoid={sorted(self.avoid)!r}") + (", reassociates=True" if self.reassociates else "")
    return (_repro_line("dsl", self.seed, f"dsl_case({self.seed}, exact_div={self.exact_div}{extra})", self.avoid) + "\n"
            f"launch: [{self.groups}, {self.threads}], n={self.scalars[0]}, s={self.scalars[1]!r}\n{self.source}")


def dsl_case(seed: int, exact_div: bool = True, avoid: frozenset[str] = AVOIDABLE, reassociates: bool = False) -> DSLCase:
  """A random @kernel function's source, its inputs, and the outputs the DSL's semantics give. reassociates=True (for
  FAST_MATH_DEVICES): the same kernel, float + and - given the error bound of a reassociation."""
  global _REASSOCIATES
  _REASSOCIATES = reassociates
  try: case = _DSLGen(seed, exact_div, frozenset(avoid)).build()
  finally: _REASSOCIATES = False
  case.reassociates = reassociates
  return case


_TMP: Any = None
_MODULES: dict[str, Any] = {}


def load_dsl(case: DSLCase) -> Any:
  """Write the case's source to a file, import it, and return its KernelFunction (the DSL reads source files)."""
  global _TMP
  import hashlib
  key = hashlib.sha256(case.source.encode()).hexdigest()[:12]
  if key in _MODULES: return _MODULES[key]
  if _TMP is None: _TMP = tempfile.TemporaryDirectory(prefix="plugrt_fuzz_")
  path = os.path.join(_TMP.name, f"{case.name}_{key}.py")
  with open(path, "w") as f: f.write(case.source)
  spec = importlib.util.spec_from_file_location(f"_plugrt_fuzz_{case.name}_{key}", path)
  assert spec is not None and spec.loader is not None
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  _MODULES[key] = getattr(mod, case.name)
  return _MODULES[key]


def _compare_err(what: str, got: np.ndarray, want: np.ndarray, err: np.ndarray, dc: np.ndarray, dt: DType) -> None:
  """Exact where err is 0 (NaN equal to NaN), else within err (+1 ulp); `dc` elements are not checked."""
  if dt.kind != "f": bad = (got != want) & ~dc
  else:
    g, w = K.as_float(got, dt), K.as_float(want, dt)
    with np.errstate(all="ignore"):
      ok = (g == w) | (np.isnan(g) & np.isnan(w)) | (np.isfinite(g) & np.isfinite(w) & (err > 0) & (np.abs(g - w) <= err + K.ulp(dt, w)))
    bad = ~ok & ~dc
  idx = np.nonzero(bad)[0]
  if len(idx):
    shown = ", ".join(f"[{i}] got {got[i]!r} want {want[i]!r}" + (f" (+-{err[i]:.3g})" if err[i] else "") for i in idx[:5])
    raise AssertionError(f"{what} ({dt.name}): {len(idx)} of {len(got)} differ: {shown}")


def run_dsl(seed: int, devs: Sequence[str] | None = None, avoid: frozenset[str] = AVOIDABLE) -> list[Outcome]:
  """One random @kernel function on every device, against the DSL's semantics."""
  devs = list(devs) if devs is not None else devices()
  return _run_dsl(seed, devs, avoid)


def _run_dsl(seed: int, devs: list[str], avoid: frozenset[str]) -> list[Outcome]:
  from plugrt.device import Buffer
  out: list[Outcome] = []
  for dev in devs:
    ed, fm = dev in EXACT_DEVICES, dev in FAST_MATH_DEVICES
    def make(ed: bool = ed, fm: bool = fm) -> tuple[DSLCase, Any]:
      case = dsl_case(seed, ed, avoid, fm)
      try: kf: Any = load_dsl(case)
      except Exception as e:  # the generated source is valid DSL: a translation error is a failure on every device
        kf = e
      return case, kf
    case, kf = _cached(("dsl", seed, ed, avoid, fm), make)
    if isinstance(kf, Exception):
      out.append(Outcome("dsl", seed, dev, "fail", f"the DSL rejected the kernel: {_error(kf)}", case.repro()))
      continue
    try:
      T = case.groups * case.threads
      bufs = {k: Buffer.from_numpy(np.ascontiguousarray(v), dev) for k, v in case.inputs.items()}
      outs = {k: Buffer.from_numpy(v.copy(), dev) for k, v in case.init.items()}
      kf[case.groups, case.threads, dev](outs["i"], outs["f"], outs["b"], bufs["a"], bufs["b"], bufs["x"], bufs["y"], bufs["c"], T,
                                         case.scalars[1], wait=True)
      for kind, name, dt in (("i", "oi", dtypes.int32), ("f", "of", dtypes.float32), ("b", "ob", dtypes.bool)):
        _compare_err(f"{case.name}: {name}", outs[kind].numpy(), case.want[kind], case.err[kind], case.dc[kind], dt)
      out.append(Outcome("dsl", seed, dev, "ok"))
    except RenderError as e: out.append(Outcome("dsl", seed, dev, "skip", e.message))
    except Exception as e:
      out.append(Outcome("dsl", seed, dev, "fail", str(e) if isinstance(e, AssertionError) else _error(e), case.repro()))
  return out


# ---------------------------------------------------------------- random Tensor expressions

_TENSOR_DTYPES = (dtypes.float32, dtypes.float32, dtypes.float16, dtypes.float64, dtypes.bfloat16, dtypes.int32, dtypes.int32, dtypes.int8,
                  dtypes.uint8, dtypes.int16, dtypes.int64, dtypes.uint32, dtypes.bool, dtypes.bool)


def _rnd(x: Any, dt: DType) -> np.ndarray:
  """x as values of dt, the way plugrt holds them (bfloat16: float32 values, rounded through float32 like the interpreter)."""
  with np.errstate(all="ignore"):
    if dt is dtypes.bfloat16: return bf16_to_f32(f32_to_bf16(np.asarray(x).astype(np.float32)))
    return np.asarray(x).astype(dt.numpy)


@dataclass
class _TN:
  """A Tensor expression: its source, how to build it from the leaves on a device, and numpy's value for it:
  v (values of dt), err (per-element error bound: float results computed in another order or approximately),
  dc (elements an error bound could flip: not checked)."""
  src: str
  build: Callable[[dict[str, Any]], Any]
  dt: DType
  v: np.ndarray
  err: np.ndarray
  dc: np.ndarray

  @property
  def shape(self) -> tuple[int, ...]: return tuple(self.v.shape)
  @property
  def ndim(self) -> int: return self.v.ndim
  @property
  def exact(self) -> bool: return not self.err.any() and not self.dc.any()


class _TensorGen:
  def __init__(self, seed: int, exact_div: bool, avoid: frozenset[str]):
    self.rng = np.random.default_rng([0x7E, seed])
    self.seed, self.exact_div, self.avoid = seed, exact_div, avoid
    self.leaves: dict[str, tuple[np.ndarray, DType]] = {}

  def r(self) -> float: return float(self.rng.random())
  def choice(self, seq: Sequence[Any]) -> Any: return seq[int(self.rng.integers(len(seq)))]

  # ---- leaves and shapes
  def leaf(self, shape: tuple[int, ...], dt: DType | None = None) -> _TN:
    dt = dt or self.choice(_TENSOR_DTYPES)
    n = math.prod(shape)
    if dt.kind == "f":
      x = self.rng.uniform(-8, 8, n)
      pick = self.rng.random(n) < 0.25
      x[pick] = self.rng.choice(np.array([0.0, -0.0, 0.5, -0.5, 1.0, -1.0, 2.5, -2.5, 3.0, 1e-3, 7.75]), int(pick.sum()))
      data = _rnd(x, dt).reshape(shape)
    else: data = fuzz_values(dt, n, self.rng).reshape(shape)
    name = f"t{len(self.leaves)}"
    self.leaves[name] = (data, dt)
    return _TN(name, lambda env: env[name], dt, data.copy(), np.zeros(shape), np.zeros(shape, bool))

  def sub_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts to `shape`: some dims 1, maybe fewer leading dims."""
    out = tuple(1 if self.r() < 0.25 else d for d in shape)
    drop = int(self.rng.integers(0, len(out) + 1)) if self.r() < 0.3 else 0
    return out[drop:]

  def rand_shape(self) -> tuple[int, ...]:
    return tuple(int(self.rng.integers(1, 5)) for _ in range(int(self.choice([0, 1, 1, 2, 2, 2, 3, 3]))))

  # ---- the numpy model of plugrt's operations
  def ulp(self, dt: DType, x: np.ndarray) -> np.ndarray: return K.ulp(dt, x.astype(np.float64)) if dt.kind == "f" else np.zeros(x.shape)

  def node(self, src: str, build: Callable[[dict[str, Any]], Any], dt: DType, v: Any, err: Any = None, dc: Any = None) -> _TN:
    v = np.asarray(v)
    err = np.zeros(v.shape) if err is None else np.broadcast_to(np.asarray(err, np.float64), v.shape).copy()
    dc = np.zeros(v.shape, bool) if dc is None else np.broadcast_to(np.asarray(dc), v.shape).copy()
    if dt.kind == "f": dc |= ~np.isfinite(v.astype(np.float64)) & (err != 0)  # (a NaN error bound too)
    else: err = np.zeros(v.shape)
    return _TN(src, build, dt, v, err, dc)

  def cast(self, a: _TN, dt: DType, src: str | None = None) -> _TN:
    if a.dt is dt: return a
    v, err, dc = _rnd(a.v, dt), a.err, a.dc
    with np.errstate(all="ignore"):
      if dt.kind == "f" and a.dt.kind == "f": err = err + np.where(err > 0, self.ulp(dt, v), 0)
      elif dt.kind in "iu" and a.dt.kind == "f":
        t = a.v.astype(np.float64)
        dc = dc | (np.trunc(t - a.err) != np.trunc(t + a.err))
        v = np.trunc(t).astype(dt.numpy)
      elif dt is dtypes.bool: dc = dc | ((a.err > 0) & (np.abs(a.v.astype(np.float64)) <= a.err))
    return self.node(src or f"{a.src}.cast(dtypes.{dt.name})", lambda env: a.build(env).cast(dt), dt, v, err, dc)

  def arith(self, op: str, a: _TN, b: _TN, dt: DType) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """a op b, both already dt: (value, error, don't-care)."""
    x, y = a.v, b.v
    with np.errstate(all="ignore"):
      if op in ("add", "sub", "mul", "div"):
        v = _rnd({"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.true_divide}[op](x, y), dt)
        if dt.kind != "f": return v, np.zeros(v.shape), a.dc | b.dc
        ea, eb, xf, yf, vf = a.err, b.err, x.astype(np.float64), y.astype(np.float64), v.astype(np.float64)
        if op in ("add", "sub"): e = ea + eb
        elif op == "mul": e = ea * np.abs(yf) + eb * np.abs(xf) + ea * eb
        else: e = (ea + np.abs(vf) * eb) / np.maximum(np.abs(yf) - eb, 1e-300)
        own = K.ULPS[Ops.DIV] * self.ulp(dt, v) if op == "div" and not self.exact_div else 0.0
        return v, e + np.where(e > 0, self.ulp(dt, v), 0) + own, a.dc | b.dc
      if op in ("floordiv", "mod"):  # Python's (numpy's) floor division and remainder
        v = _rnd(np.floor_divide(x, y) if op == "floordiv" else np.remainder(x, y), dt)
        return v, np.zeros(v.shape), a.dc | b.dc
      if op in ("max", "min"):  # with a NaN operand the result is unspecified: not checked
        v = (np.maximum if op == "max" else np.minimum)(x, y)
        nan = np.isnan(x.astype(np.float64)) | np.isnan(y.astype(np.float64)) if dt.kind == "f" else False
        return v, np.maximum(a.err, b.err), a.dc | b.dc | nan
      v = {"and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor}[op](x, y)
      return v, np.zeros(v.shape), a.dc | b.dc

  def operands(self, a: _TN, other: Any) -> tuple[_TN, _TN, DType]:
    """Tensor._operands: one dtype for both, a Python number taking the tensor's kind."""
    from plugrt.arith import promote
    if isinstance(other, _TN): dt = promote(a.dt, other.dt); b = other
    else:
      dt = a.dt
      if isinstance(other, float) and dt.kind != "f": dt = dtypes.float32
      elif isinstance(other, int) and not isinstance(other, bool) and dt is dtypes.bool: dt = dtypes.int32
      c = _rnd(np.array(cast_value(other, dt)), dt)
      b = _TN(repr(other), lambda env: other, dt, c, np.zeros(()), np.zeros((), bool))
    return self.cast(a, dt, a.src), (self.cast(b, dt, b.src) if isinstance(other, _TN) else b), dt

  def binary(self, a: _TN, b: Any, op: str, sym: str, reverse: bool = False) -> _TN:
    """a (sym) b for a Tensor a and a Tensor or a number b (reverse: b (sym) a)."""
    x, y, dt = self.operands(a, b)
    if reverse: x, y = y, x
    cmp = {"<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal, "==": np.equal, "!=": np.not_equal}.get(sym)
    if cmp is not None:
      with np.errstate(all="ignore"):
        xv, yv = x.v.astype(np.float64), y.v.astype(np.float64)
        v = cmp(x.v, y.v) if dt.kind != "f" else cmp(xv, yv)
        dc = x.dc | y.dc | ((x.err + y.err > 0) & (np.abs(xv - yv) <= x.err + y.err))
      rdt = dtypes.bool
    else:
      v, err, dc = self.arith(op, x, y, dt)
      rdt = dt
    build_a, build_b = a.build, (b.build if isinstance(b, _TN) else (lambda env: b))
    fn = _TENSOR_BINOPS[sym]
    build = (lambda env: fn(build_b(env), build_a(env))) if reverse else (lambda env: fn(build_a(env), build_b(env)))
    bsrc = b.src if isinstance(b, _TN) else repr(b)
    src = f"({bsrc} {sym} {a.src})" if reverse else f"({a.src} {sym} {bsrc})" if not sym.isalpha() else f"{a.src}.{sym}({bsrc})"
    return self.node(src, build, rdt, v, None if cmp is not None else err, dc)

  # ---- expressions
  def expr(self, shape: tuple[int, ...], depth: int) -> _TN:
    """An expression of exactly `shape`."""
    if depth <= 0 or self.r() < 0.15: return self.leaf(shape)
    r = self.r()
    if r < 0.35: out = self.elementwise(shape, depth)
    elif r < 0.5: out = self.unary(self.expr(shape, depth - 1))
    elif r < 0.58: out = self.where(shape, depth)
    elif r < 0.7: out = self.reduce(shape, depth)
    elif r < 0.76 and len(shape) >= 1: out = self.matmul(shape, depth)
    else: out = self.view(shape, depth)
    if out.shape != shape:  # broadcast operands gave a smaller shape: expand it
      pad = (1,) * (len(shape) - out.ndim) + out.shape
      out = self.rebuild(out, f"{out.src}.expand{shape}", lambda t: t.expand(*shape), lambda v: np.broadcast_to(v.reshape(pad), shape))
    return out

  def elementwise(self, shape: tuple[int, ...], depth: int) -> _TN:
    sym = self.choice(["+", "-", "*", "/", "//", "%", "maximum", "minimum", "&", "|", "^", "<", "<=", ">", ">=", "==", "!="])
    a = self.expr(self.sub_shape(shape) if self.r() < 0.5 else shape, depth - 1)
    b: Any = self.scalar(a.dt) if self.r() < 0.3 else self.expr(shape if a.shape != shape else self.sub_shape(shape), depth - 1)
    reverse = not isinstance(b, _TN) and sym in ("+", "-", "*", "/", "<", ">", "==") and self.r() < 0.4
    kinds = {a.dt.kind} | ({b.dt.kind} if isinstance(b, _TN) else {"f" if isinstance(b, float) else "i"})
    bool_arith = (kinds == {"b"} or (a.dt is dtypes.bool and not isinstance(b, _TN) and isinstance(b, bool)))
    if sym in ("&", "|", "^") and "f" in kinds: sym = "*"
    if sym in ("+", "-", "*", "maximum", "minimum", "//", "%") and bool_arith:
      if sym in ("-", "//", "%"): sym = self.choice(["&", "|", "^"])
      else: return self.bool_arith(a, b, sym)
    if sym == "/":  # true division: an integer or bool tensor becomes float32 first (Tensor._float)
      af = self.cast(a, dtypes.float32, a.src) if a.dt.kind != "f" else a
      out = self.binary(af, b, "div", "/", reverse)
      return _TN(out.src, (lambda env: _TENSOR_BINOPS["/"](b, a.build(env))) if reverse and not isinstance(b, _TN) else
                 (lambda env: a.build(env) / (b.build(env) if isinstance(b, _TN) else b)), out.dt, out.v, out.err, out.dc)
    if sym in ("//", "%"):
      x, y, dt = self.operands(a, b)
      if dt.kind == "f" and (not x.exact or not y.exact): sym = "*"
      elif dt.kind != "f":  # a divisor that is never zero: b | 1 (or an odd constant)
        if isinstance(b, _TN): b = self.binary(b if b.dt.kind != "b" else self.cast(b, dtypes.int32), 1, "or", "|")
        else: b = 3 if dt.kind == "u" else int(self.choice([3, -3, 7, -1, 2]))
        return self.binary(a, b, "floordiv" if sym == "//" else "mod", sym)
      else:
        bb = self.binary(self.unary_named(b if isinstance(b, _TN) else self.leaf(shape, dt), "abs"), 0.5, "add", "+")
        return self.binary(a, bb, "floordiv" if sym == "//" else "mod", sym)
    if sym in ("maximum", "minimum"): return self.binary(a, b, sym[:3], sym)
    ops = {"+": "add", "-": "sub", "*": "mul", "&": "and", "|": "or", "^": "xor"}
    return self.binary(a, b, ops.get(sym, "cmp"), sym, reverse)

  def bool_arith(self, a: _TN, b: Any, sym: str) -> _TN:
    """numpy's bool arithmetic: + and maximum are or, * and minimum are and (the known tensor-bool-arith bug)."""
    bv = b.v if isinstance(b, _TN) else np.array(bool(b))
    v = (a.v | bv) if sym in ("+", "maximum") else (a.v & bv)
    fn = _TENSOR_BINOPS[sym]
    bb = b.build if isinstance(b, _TN) else (lambda env: b)
    bsrc = b.src if isinstance(b, _TN) else repr(b)
    return self.node(f"({a.src} {sym} {bsrc})" if not sym.isalpha() else f"{a.src}.{sym}({bsrc})",
                     lambda env: fn(a.build(env), bb(env)), dtypes.bool, v)

  def scalar(self, dt: DType) -> Any:
    r = self.r()
    if r < 0.45: return float(self.choice([0.5, 2.0, -1.5, 3.0, 0.1, -0.25]))
    if r < 0.9 or dt is dtypes.bool:
      vals = [1, 2, 3, 7, 100] if dt.kind == "u" or dt is dtypes.bool else [1, 2, 3, -2, 7, -5, 100]
      return int(self.choice(vals))
    return bool(self.r() < 0.5)

  def unary_named(self, a: _TN, name: str) -> _TN:
    if name == "abs":
      v = np.abs(a.v) if a.dt.kind in "fi" else a.v
      return self.node(f"{a.src}.abs()", lambda env: a.build(env).abs(), a.dt, v, a.err, a.dc)
    raise ValueError(name)

  def safe_cast(self, a: _TN, to: DType, src: str | None = None) -> _TN:
    """a.cast(to), or to another dtype where that cast would be undefined (a float out of the integer's range, or NaN)."""
    dt = a.dt
    if dt.kind == "f" and to.kind in "iu":
      with np.errstate(all="ignore"): t = np.abs(a.v.astype(np.float64)) + a.err
      if not (np.isfinite(t).all() and (t < min(float(to.max), 2.0 ** 62)).all() and (to.kind != "u" or (a.v.astype(np.float64) - a.err > -1).all())):
        to = dtypes.float32 if dt is not dtypes.float64 else dtypes.float64
    return self.cast(a, to, src)

  def unary(self, a: _TN) -> _TN:
    name = self.choice(["neg", "abs", "exp", "log", "sqrt", "sin", "cos", "exp2", "log2", "recip", "floor", "ceil", "relu", "cast", "invert",
                        "pow", "pow05"])
    dt = a.dt
    if name == "abs": return self.unary_named(a, "abs")
    if name == "neg":
      v = ~a.v if dt is dtypes.bool else _rnd(-a.v, dt)
      return self.node(f"(-{a.src})", lambda env: -a.build(env), dt, v, a.err, a.dc)
    if name == "invert":
      if dt.kind == "f": return self.safe_cast(a, self.choice([dtypes.int32, dtypes.bool, dtypes.int8, dtypes.float16]))
      return self.node(f"(~{a.src})", lambda env: ~a.build(env), dt, ~a.v)
    if name == "cast": return self.safe_cast(a, self.choice(_TENSOR_DTYPES))
    if name == "relu":
      return self.binary(a, 0, "max", "maximum")
    if name in ("floor", "ceil"):
      if dt.kind != "f": return self.node(f"{a.src}.{name}()", lambda env: getattr(a.build(env), name)(), dt, a.v)
      f = np.floor if name == "floor" else np.ceil
      x = a.v.astype(np.float64)
      dc = a.dc | (f(x - a.err) != f(x + a.err))
      return self.node(f"{a.src}.{name}()", lambda env: getattr(a.build(env), name)(), dt, _rnd(f(a.v), dt), None, dc)
    if name == "pow":
      if dt is dtypes.bool: return a
      k = int(self.rng.integers(0, 4))
      out = self.node("1", lambda env: 1, dt, _rnd(np.ones(a.shape), dt))
      for _ in range(k):
        v, err, dc = self.arith("mul", out, a, dt)
        out = self.node("", lambda env: 0, dt, v, err, dc)
      if dt.kind == "f" and not np.isfinite(out.v.astype(np.float64)).all(): return a
      return self.node(f"({a.src} ** {k})", lambda env: a.build(env) ** k, dt, out.v, out.err, out.dc)
    # math functions: on floats (integers become float32 first), their arguments kept where results are finite
    x = self.cast(a, dtypes.float32, a.src) if dt.kind != "f" else a
    fdt = x.dt
    xv, xe = x.v.astype(np.float64), x.err
    mant = _MANT[fdt]
    atol = {dtypes.float16: 4e-3, dtypes.bfloat16: 3e-2, dtypes.float32: 4e-7, dtypes.float64: 1e-15}[fdt]
    if name in ("log", "log2", "sqrt", "recip", "pow05"):  # |x| + 1: away from the poles and the negative domain
      x = self.binary(self.unary_named(x, "abs"), 1, "add", "+")
      xv, xe = x.v.astype(np.float64), x.err
    elif name in ("exp", "exp2"):
      x = self.binary(self.binary(x, -8, "max", "maximum"), 8, "min", "minimum")
      xv, xe = x.v.astype(np.float64), x.err
    with np.errstate(all="ignore"):
      y = {"exp": np.exp, "log": np.log, "sqrt": np.sqrt, "sin": np.sin, "cos": np.cos, "exp2": np.exp2, "log2": np.log2,
           "recip": lambda t: 1 / t, "pow05": np.sqrt}[name](xv)
      ay = np.abs(y)
      deriv = {"exp": ay, "exp2": ay * math.log(2), "log": 1 / (xv - xe), "log2": 1 / ((xv - xe) * math.log(2)), "sin": 1.0, "cos": 1.0,
               "sqrt": 0.5 / np.sqrt(np.maximum(xv - xe, 1e-300)), "pow05": 0.5 / np.sqrt(np.maximum(xv - xe, 1e-300)),
               "recip": 1 / (xv - xe) ** 2}[name]
      exact_op = name in ("sqrt", "recip") and self.exact_div
      own = 0.0 if exact_op else 8 * K.ulp(fdt, y) + atol * (name in ("sin", "cos", "log", "log2", "exp", "exp2", "pow05"))
      rewrite = {"exp": ay * np.abs(xv) * 2.0 ** -mant * 2, "log": ay * 2.0 ** -mant * 2, "cos": K.ulp(fdt, np.abs(xv) + 2) * 2,
                 "pow05": ay * np.abs(np.log2(np.maximum(xv, 1e-300))) * 2.0 ** -mant * 2}.get(name, 0.0)
      err = xe * deriv + own + rewrite
    v = _rnd(y, fdt)
    meth = {"recip": "reciprocal", "pow05": "__pow__"}.get(name, name)
    build = (lambda env: x.build(env) ** 0.5) if name == "pow05" else (lambda env: getattr(x.build(env), meth)())
    src = f"({x.src} ** 0.5)" if name == "pow05" else f"{x.src}.{meth}()"
    return self.node(src, build, fdt, v, err, x.dc)

  def where(self, shape: tuple[int, ...], depth: int) -> _TN:
    c = self.expr(self.sub_shape(shape), depth - 1)
    if c.dt is not dtypes.bool:
      c = self.binary(c, 0, "cmp", "!=") if c.dt.kind != "f" or c.exact else self.binary(c, 0.0, "cmp", ">")
    a: Any = self.expr(self.sub_shape(shape), depth - 1) if self.r() < 0.7 else self.scalar(dtypes.float32)
    b: Any = self.expr(shape, depth - 1) if self.r() < 0.8 else self.scalar(dtypes.int32)
    from plugrt.arith import promote
    tensors = [x.dt for x in (a, b) if isinstance(x, _TN)]
    if not tensors: dt = promote(dtypes.from_py(a), dtypes.from_py(b))
    else:
      dt = tensors[0] if len(tensors) == 1 else promote(*tensors)
      if any(isinstance(x, float) for x in (a, b)) and dt.kind != "f": dt = dtypes.float32
    def val(x: Any) -> _TN:
      if isinstance(x, _TN): return self.cast(x, dt, x.src)
      return _TN(repr(x), lambda env: x, dt, _rnd(np.array(cast_value(x, dt)), dt), np.zeros(()), np.zeros((), bool))
    av, bv = val(a), val(b)
    cond = np.broadcast_to(c.v, np.broadcast_shapes(c.shape, av.shape, bv.shape))
    v = np.where(cond, av.v, bv.v)
    err = np.where(cond, av.err, bv.err) if dt.kind == "f" else None
    dc = np.where(cond, av.dc, bv.dc) | (c.dc & (av.v != bv.v))
    ab, bb = (a.build if isinstance(a, _TN) else (lambda env: a)), (b.build if isinstance(b, _TN) else (lambda env: b))
    src = f"{c.src}.where({a.src if isinstance(a, _TN) else repr(a)}, {b.src if isinstance(b, _TN) else repr(b)})"
    return self.node(src, lambda env: c.build(env).where(ab(env), bb(env)), dt, v, err, dc)

  def reduce(self, shape: tuple[int, ...], depth: int) -> _TN:
    op = self.choice(["sum", "sum", "max", "min", "mean"])
    keep = self.r() < 0.5
    naxes = int(self.rng.integers(1, 3))
    if keep:  # the result keeps the reduced dims as 1: grow some of them (or all of them, for axis=None)
      ones = [i for i, d in enumerate(shape) if d == 1]
      if not ones: return self.view(shape, depth)
      axes = sorted(self.rng.choice(ones, min(naxes, len(ones)), replace=False).tolist())
      in_shape = tuple(int(self.rng.integers(1, 5)) if i in axes else d for i, d in enumerate(shape))
    else:
      in_shape, axes = list(shape), []
      for _ in range(naxes):
        pos = int(self.rng.integers(0, len(in_shape) + 1))
        in_shape.insert(pos, int(self.rng.integers(1, 5)))
        axes = [a + (a >= pos) for a in axes] + [pos]
      in_shape, axes = tuple(in_shape), sorted(axes)
    a = self.expr(in_shape, depth - 1)
    ax = tuple(axes)
    all_axes = len(ax) == len(in_shape) and self.r() < 0.5
    arg = "" if all_axes and not keep else f"axis={ax if len(ax) > 1 else ax[0]}" + (", keepdim=True" if keep else "")
    if all_axes and keep: arg = "axis=None, keepdim=True"
    axis_arg: Any = None if all_axes else (ax if len(ax) > 1 else ax[0])
    build = lambda env: getattr(a.build(env), op)(axis_arg, keep)
    src = f"{a.src}.{op}({arg})"
    n = math.prod(in_shape[i] for i in ax)
    with np.errstate(all="ignore"):
      if op in ("max", "min"):
        f = np.max if op == "max" else np.min
        v = f(a.v, axis=ax, keepdims=keep)
        nan = np.isnan(a.v.astype(np.float64)) if a.dt.kind == "f" else np.zeros(a.shape, bool)  # max/min with NaN: unspecified
        return self.node(src, build, a.dt, v, np.max(a.err, axis=ax, keepdims=keep), np.any(a.dc | nan, axis=ax, keepdims=keep))
      x = a if op == "sum" else (self.cast(a, dtypes.float32, a.src) if a.dt.kind != "f" else a)
      dt = x.dt if x.dt.kind == "f" or x.dt.bits >= 32 else (dtypes.int32 if x.dt.kind != "u" else dtypes.uint32)
      xv = _rnd(x.v, dt)
      dc = np.any(x.dc, axis=ax, keepdims=keep)
      if dt.kind != "f": return self.node(src, build, dt, np.sum(xv, axis=ax, keepdims=keep, dtype=dt.numpy), None, dc)
      s64 = np.sum(xv.astype(np.float64), axis=ax, keepdims=keep)
      # summed in another order: n roundings of at most the partial sums' magnitude (bounded by sum |x|)
      eps = 2.0 ** -_MANT[dt]
      err = np.sum(x.err, axis=ax, keepdims=keep) + n * eps * np.sum(np.abs(xv.astype(np.float64)), axis=ax, keepdims=keep)
      v = _rnd(s64, dt)
      if op == "mean":
        v, err = _rnd(v.astype(np.float64) / n, dt), err / n + K.ulp(dt, s64 / n) * 2
      if dt in (dtypes.float16, dtypes.bfloat16): err = err + 2 * K.ulp(dt, v)
      return self.node(src, build, dt, v, err, dc)

  def matmul(self, shape: tuple[int, ...], depth: int) -> _TN:
    k = int(self.rng.integers(1, 5))
    if len(shape) == 1:  # (n) = (n, k) @ (k) or (k) @ (k, n)
      if self.r() < 0.5: sa, sb = (shape[0], k), (k,)
      else: sa, sb = (k,), (k, shape[0])
    else: sa, sb = shape[:-1] + (k,), (self.sub_shape(shape[:-2]) if self.r() < 0.5 else ()) + (k, shape[-1])
    a, b = self.expr(sa, depth - 1), self.expr(sb, depth - 1)
    from plugrt.arith import promote
    dt = promote(a.dt, b.dt)
    if dt is dtypes.bool: a, b, dt = self.cast(a, dtypes.int32), self.cast(b, dtypes.int32), dtypes.int32
    x, y = self.cast(a, dt, a.src), self.cast(b, dt, b.src)
    xa = x.v[None, :] if x.v.ndim == 1 else x.v
    yb = y.v[:, None] if y.v.ndim == 1 else y.v
    with np.errstate(all="ignore"):
      prod = _rnd(xa[..., :, :, None] * yb[..., None, :, :], dt)  # (..., n, k, m), rounded like the kernel's products
      pa = x.err[None, :] if x.v.ndim == 1 else x.err
      pb = y.err[:, None] if y.v.ndim == 1 else y.err
      xa64, yb64 = np.abs(xa.astype(np.float64)), np.abs(yb.astype(np.float64))
      perr = (pa[..., :, :, None] * yb64[..., None, :, :] + pb[..., None, :, :] * xa64[..., :, :, None]
              + pa[..., :, :, None] * pb[..., None, :, :]) if dt.kind == "f" else 0
      sdt = dt if dt.kind == "f" or dt.bits >= 32 else (dtypes.int32 if dt.kind != "u" else dtypes.uint32)
      pv = _rnd(prod, sdt)
      if sdt.kind != "f": v, err = np.sum(pv, axis=-2, dtype=sdt.numpy), None
      else:
        v = _rnd(np.sum(pv.astype(np.float64), axis=-2), sdt)
        p64 = pv.astype(np.float64)
        err = np.sum(perr + np.where(perr > 0, K.ulp(dt, p64), 0), axis=-2) + k * 2.0 ** -_MANT[sdt] * np.sum(np.abs(p64), axis=-2)
        if sdt in (dtypes.float16, dtypes.bfloat16): err = err + 2 * K.ulp(sdt, v)
    dc = np.any(np.broadcast_to((x.dc[None, :] if x.v.ndim == 1 else x.dc)[..., :, :, None], prod.shape), axis=-2) | \
      np.any(np.broadcast_to((y.dc[:, None] if y.v.ndim == 1 else y.dc)[..., None, :, :], prod.shape), axis=-2)
    if a.v.ndim == 1: v, dc = v[..., 0, :], dc[..., 0, :]; err = err[..., 0, :] if err is not None else None
    if b.v.ndim == 1: v, dc = v[..., 0], dc[..., 0]; err = err[..., 0] if err is not None else None
    return self.node(f"({a.src} @ {b.src})", lambda env: a.build(env) @ b.build(env), sdt, v, err, dc)

  def view(self, shape: tuple[int, ...], depth: int) -> _TN:
    """A view that yields `shape`: permute, T, reshape, slicing (any step), expand, an int index, None."""
    kind = self.choice(["permute", "T", "reshape", "slice", "slice", "expand", "index", "none"])
    nd = len(shape)
    if kind in ("permute", "T") and nd >= 2:
      perm = list(range(nd)) if kind == "T" else [int(p) for p in self.rng.permutation(nd)]
      if kind == "T": perm = perm[::-1]
      inv = [perm.index(i) for i in range(nd)]
      a = self.expr(tuple(shape[inv[j]] for j in range(nd)), depth - 1)
      if kind == "T": return self.rebuild(a, f"{a.src}.T", lambda t: t.T, lambda v: v.T)
      return self.rebuild(a, f"{a.src}.permute{tuple(perm)}", lambda t: t.permute(*perm), lambda v: np.transpose(v, perm))
    if kind == "reshape":
      n, dims = math.prod(shape), []
      rest = n
      for f in (2, 3, 2, 5):
        if rest % f == 0 and self.r() < 0.5: dims.append(f); rest //= f
      dims.append(rest)
      src_shape = tuple(int(d) for d in self.rng.permutation(dims)) if n else (0,)
      a = self.expr(src_shape, depth - 1)
      spec = tuple(-1 if (i == 0 and self.r() < 0.3) else d for i, d in enumerate(shape))
      return self.rebuild(a, f"{a.src}.reshape{spec if len(spec) != 1 else '(' + str(spec[0]) + ')'}", lambda t: t.reshape(spec),
                          lambda v: v.reshape(shape))
    if kind == "slice" and nd >= 1:
      sl, src_shape = [], []
      for d in shape:
        step = int(self.choice([1, 1, 2, 3, -1, -2]))
        extra = int(self.rng.integers(0, 3))
        size = (d - 1) * abs(step) + 1 + extra
        off = int(self.rng.integers(0, extra + 1))
        if step > 0: start, stop = off, off + (d - 1) * step + 1
        else: start, stop = size - 1 - off, size - 1 - off + (d - 1) * step - 1
        sl.append(slice(start, stop if stop >= 0 else None, step))
        src_shape.append(size)
      a = self.expr(tuple(src_shape), depth - 1)
      idx = tuple(sl)
      txt = ", ".join(f"{s.start}:{'' if s.stop is None else s.stop}:{s.step}" for s in sl)
      return self.rebuild(a, f"{a.src}[{txt}]", lambda t: t[idx], lambda v: v[idx])
    if kind == "expand" and any(d > 1 for d in shape):
      small = tuple(1 if d > 1 and self.r() < 0.6 else d for d in shape)
      a = self.expr(small, depth - 1)
      return self.rebuild(a, f"{a.src}.expand{shape}", lambda t: t.expand(*shape), lambda v: np.broadcast_to(v, shape))
    if kind == "index":
      pos, size = int(self.rng.integers(0, nd + 1)), int(self.rng.integers(1, 5))
      i = int(self.rng.integers(-size, size))
      a = self.expr(shape[:pos] + (size,) + shape[pos:], depth - 1)
      idx2 = (slice(None),) * pos + (i,)
      return self.rebuild(a, f"{a.src}[{', '.join([':'] * pos + [str(i)])}]", lambda t: t[idx2], lambda v: v[idx2])
    ones = [i for i, d in enumerate(shape) if d == 1]
    if kind == "none" and ones:
      pos = self.choice(ones)
      a = self.expr(shape[:pos] + shape[pos + 1:], depth - 1)
      idx3 = (slice(None),) * pos + (None,)
      return self.rebuild(a, f"{a.src}[{', '.join([':'] * pos + ['None'])}]", lambda t: t[idx3], lambda v: v[idx3])
    return self.elementwise(shape, depth)

  def rebuild(self, a: _TN, src: str, tfn: Callable[[Any], Any], nfn: Callable[[np.ndarray], np.ndarray]) -> _TN:
    return _TN(src, lambda env: tfn(a.build(env)), a.dt, np.array(nfn(a.v)), np.array(nfn(a.err)), np.array(nfn(a.dc)))  # (keeps 0-d)

  def build(self) -> TensorCase:
    shape = self.rand_shape()
    root = self.expr(shape, int(self.rng.integers(2, 5)))
    if self.r() < 0.15 and root.shape:  # write the result into a strided view of another tensor, in place
      base_shape = tuple(d * 2 for d in root.shape)
      base = self.leaf(base_shape, self.choice([dtypes.float32, dtypes.int32, dtypes.float64, root.dt]))
      if root.dt.kind == "f" and base.dt.kind in "iu": base = self.leaf(base_shape, dtypes.float32)
      idx = tuple(slice(int(self.rng.integers(0, 2)), None, 2) for _ in root.shape)
      val = self.safe_cast(root, base.dt, root.src)
      if val.dt is not base.dt: base = self.leaf(base_shape, val.dt)
      v, err, dc = base.v.copy(), base.err.copy(), base.dc.copy()
      v[idx], err[idx], dc[idx] = val.v, val.err, val.dc
      txt = ", ".join(f"{s.start}::2" for s in idx)
      def run(env: dict[str, Any], base: _TN = base, idx: Any = idx, root: _TN = root) -> Any:
        t = base.build(env)
        t[idx].assign(root.build(env))
        return t
      root = _TN(f"{base.src}[{txt}].assign({root.src}); result: {base.src}", run, base.dt, v, err, dc)
    return TensorCase(self.seed, self.exact_div, self.avoid, root.src, root.build, root.dt, root.v, root.err, root.dc, self.leaves)


_TENSOR_BINOPS: dict[str, Callable[[Any, Any], Any]] = {
  "+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b, "/": lambda a, b: a / b, "//": lambda a, b: a // b,
  "%": lambda a, b: a % b, "&": lambda a, b: a & b, "|": lambda a, b: a | b, "^": lambda a, b: a ^ b, "<": lambda a, b: a < b,
  "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b, "==": lambda a, b: a == b, "!=": lambda a, b: a != b,
  "maximum": lambda a, b: a.maximum(b), "minimum": lambda a, b: a.minimum(b)}


@dataclass
class TensorCase:
  seed: int
  exact_div: bool
  avoid: frozenset[str]
  src: str                                   # the expression (leaves are t0, t1, ...)
  build: Callable[[dict[str, Any]], Any]     # leaves (name -> Tensor) -> the result Tensor
  dtype: DType
  want: np.ndarray                           # numpy's value in `dtype` (bfloat16 as float32)
  err: np.ndarray
  dc: np.ndarray
  leaves: dict[str, tuple[np.ndarray, DType]]

  def repro(self) -> str:
    extra = "" if self.avoid == AVOIDABLE else f", avoid={sorted(self.avoid)!r}"
    leaves = "\n".join(f"{n} = Tensor(np.array({v.tolist()!r}), dtypes.{dt.name})" for n, (v, dt) in self.leaves.items())
    return (_repro_line("tensor", self.seed, f"tensor_case({self.seed}, exact_div={self.exact_div}{extra})", self.avoid) + "\n"
            f"{leaves}\nresult ({self.dtype.name}, shape {tuple(self.want.shape)}) = {self.src}")


def tensor_case(seed: int, exact_div: bool = True, avoid: frozenset[str] = AVOIDABLE) -> TensorCase:
  """A random Tensor expression over random leaves, with numpy's value for it in plugrt's dtypes."""
  return _TensorGen(seed, exact_div, frozenset(avoid)).build()


def run_tensor(seed: int, devs: Sequence[str] | None = None, avoid: frozenset[str] = AVOIDABLE) -> list[Outcome]:
  """One random Tensor expression on every device, against numpy."""
  devs = list(devs) if devs is not None else devices()
  return _run_tensor(seed, devs, avoid)


def _run_tensor(seed: int, devs: list[str], avoid: frozenset[str]) -> list[Outcome]:
  from plugrt.tensor import Tensor
  out: list[Outcome] = []
  for dev in devs:
    ed = dev in EXACT_DEVICES
    case = _cached(("tensor", seed, ed, avoid), lambda ed=ed: tensor_case(seed, ed, avoid))
    try:
      env = {n: Tensor(v, dt, dev) for n, (v, dt) in case.leaves.items()}
      t = case.build(env)
      if t.dtype is not case.dtype or t.shape != tuple(case.want.shape):
        raise AssertionError(f"result is {t.dtype.name} {t.shape}, want {case.dtype.name} {tuple(case.want.shape)}")
      got = t.numpy()
      want = case.want
      if case.dtype is dtypes.bfloat16: got, want = f32_to_bf16(got), f32_to_bf16(want)
      _compare_err(f"tensor {case.src[:200]}", np.ascontiguousarray(got).reshape(-1), np.ascontiguousarray(want).reshape(-1),
                   case.err.reshape(-1), case.dc.reshape(-1), case.dtype)
      out.append(Outcome("tensor", seed, dev, "ok"))
    except RenderError as e: out.append(Outcome("tensor", seed, dev, "skip", e.message))
    except Exception as e:
      out.append(Outcome("tensor", seed, dev, "fail", str(e) if isinstance(e, AssertionError) else _error(e), case.repro()))
  return out


def repro(kind: str, seed: int, target: str, avoid: frozenset[str] = AVOIDABLE) -> str:
  """What reproduces a case of `kind` on `target` ("CPU:CLANG", "WEBGPU", ...): for failures found outside run_*."""
  ed = target.split(":")[0] in EXACT_DEVICES
  if kind == "ir": return ir_repro(seed, ir_case(seed, ed, avoid), ed, avoid)
  if kind == "dsl": return dsl_case(seed, ed, avoid, target.split(":")[0] in FAST_MATH_DEVICES).repro()
  return tensor_case(seed, ed, avoid).repro()
