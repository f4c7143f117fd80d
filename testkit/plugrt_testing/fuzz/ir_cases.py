"""Random IR kernels (KernelBuilder) with inputs and launch sizes, run on every (device, compiler) pair and compared with
the reference interpreter.

Half of the kernels end with vector access: a VLOAD of 2 or 4 elements of an input at an aligned index, its lanes
changed (exactly) and written with a VSTORE, under a divergent IF or not, into an output of their own. Those are drawn
from a second random stream (`layout`), so the kernels of earlier seeds keep every op before them.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from plugrt.compiler import samples as K
from plugrt.compiler.ir import KernelBuilder, Ops, Val
from plugrt.dtype import DType, dtypes
from plugrt.errors import RenderError
from plugrt_testing.fuzz.compare import flush_subnormals, flush_tolerant, nonfinite
from plugrt_testing.fuzz.outcomes import AVOIDABLE, Outcome, cached_case, error_text, repro_line
from plugrt_testing.fuzz.targets import Target, ir_targets
from plugrt_testing.fuzz.values import (
  MANTISSA_BITS,
  MAX_EXPONENT,
  float_below,
  float_edges,
  float_max,
  fuzz_values,
  int_edges,
  scalar_value,
)


@dataclass(eq=False)
class IRValue:
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
_BITCASTS = {dt: [d for d in K.ALL if d.itemsize == dt.itemsize and d is not dt and d is not dtypes.bool] for dt in K.ALL}
_BITCASTS[dtypes.bool] = [dtypes.int8, dtypes.uint8]  # bool's bits are 0 or 1; int8 -> bool would make other bytes (see docs/fuzzing.md)


class IRKernelGenerator:
  MAX_THREADS = 48

  def __init__(self, seed: int, exact_div: bool, avoid: frozenset[str]):
    self.rng = np.random.default_rng([0x1F, seed])
    self.layout = np.random.default_rng([0x2F, seed])  # the vector access at the end (see the module docstring)
    self.seed, self.exact_div, self.avoid = seed, exact_div, avoid
    self.b = KernelBuilder(f"fuzz_ir_{seed}")
    self.scopes: list[list[IRValue]] = [[]]
    self.uniform_blocks: list[bool] = []

  # ---- helpers
  def r(self) -> float: return float(self.rng.random())
  def choice(self, seq: Sequence[Any]) -> Any: return seq[int(self.rng.integers(len(seq)))]
  def add(self, v: IRValue) -> IRValue:
    self.scopes[-1].append(v)
    return v
  def pool(self) -> list[IRValue]: return [v for s in self.scopes for v in s]
  @property
  def uniform_here(self) -> bool: return all(self.uniform_blocks)

  def pick(self, pred: Callable[[IRValue], bool] = lambda v: True) -> IRValue | None:
    vals = [v for v in self.pool() if pred(v)]
    if not vals: return None
    w = np.arange(1, len(vals) + 1, dtype=np.float64) ** 1.5  # prefer recent values: deeper graphs
    return vals[int(self.rng.choice(len(vals), p=w / w.sum()))]

  def const(self, dt: DType) -> IRValue:
    if dt is dtypes.bool: x: Any = self.r() < 0.5
    elif dt.kind in "iu": x = int(self.choice(int_edges(dt))) if self.r() < 0.6 else int(K.values(dt, 8, self.rng)[7])
    else: x = float(self.choice(float_edges(dt, nan=self.r() < 0.1, inf=self.r() < 0.1)))
    xf = float(x) if dt.kind == "f" else 0.0
    return IRValue(self.b.const(x, dt), nan=math.isnan(xf), inf=math.isinf(xf), uni=True)

  def of_dtype(self, dt: DType, exact: bool = True) -> IRValue:
    """A value of dt: one from the pool, a constant, or a cast of another value."""
    got = self.pick(lambda v: v.dt is dt and (v.exact or not exact))
    if got is not None and self.r() < 0.8: return got
    if self.r() < 0.4: return self.const(dt)
    src = self.pick(lambda v: v.exact)
    return self.cast(src, dt) if src is not None else self.const(dt)

  def sanitize(self, x: IRValue) -> IRValue:
    """x without NaN (NaN -> 0): for MAX/MIN, float->int casts and bitcasts of floats."""
    if not x.nan: return x
    assert x.exact
    return IRValue(x.v.ne(x.v).where(self.b.const(0.0, x.dt), x.v), nan=False, inf=x.inf, zs=x.zs, uni=x.uni)

  def clamp(self, x: IRValue, lo: float, hi: float) -> IRValue:
    x = self.sanitize(x)
    v = x.v.max(self.b.const(lo, x.dt)).min(self.b.const(hi, x.dt))
    return IRValue(v, nan=False, inf=False, zs=True, uni=x.uni)

  # ---- ops
  def cast(self, x: IRValue, dt: DType) -> IRValue:
    src = x.dt
    if src.kind == "f" and dt.kind in "iu":  # out of range and NaN are undefined: clamp into range first
      lo = 0.0 if dt.kind == "u" else max(float(dt.min), -float_max(src))
      x = self.clamp(x, lo, float_below(int(dt.max), src))
    if src.kind == "f" and dt.kind == "f":
      mant_s, mant_d = MANTISSA_BITS[src], MANTISSA_BITS[dt]
      ulps = 0.0 if x.exact else x.ulps * 2.0 ** (mant_d - mant_s) + 1
      narrow = float_max(dt) < float_max(src)
      return IRValue(x.v.cast(dt), ulps, x.atol, x.nan, x.inf or narrow, x.zs, x.uni)
    if dt.kind == "f":
      return IRValue(x.v.cast(dt), inf=dt is dtypes.float16 and x.dt.kind in "iu" and x.dt.bits > 8, uni=x.uni)
    return IRValue(x.v.cast(dt), uni=x.uni)

  def bitcast(self, x: IRValue, dt: DType) -> IRValue | None:
    if x.dt.kind == "f":
      if not x.exact or x.zs: return None  # NaN payloads and the sign of MAX/MIN zeros differ between devices
      x = self.sanitize(x)
    return IRValue(x.v.bitcast(dt), nan=dt.kind == "f", inf=dt.kind == "f", uni=x.uni)

  def unary(self, x: IRValue) -> IRValue | None:
    dt, b = x.dt, self.b
    if dt is dtypes.bool or dt.kind in "iu":
      if dt.kind == "u" or dt is dtypes.bool or self.r() < 0.5: return IRValue(~x.v, uni=x.uni)
      return IRValue(-x.v, uni=x.uni)
    if not x.exact:  # approximate: only well-conditioned consumers
      if self.r() < 0.5: return IRValue(-x.v, x.ulps, x.atol, x.nan, x.inf, x.zs, x.uni)
      c = float(self.choice([0.5, 2.0, -3.0, 1.5, -0.25]))
      return IRValue(x.v * b.const(c, dt), x.ulps + 1, x.atol * abs(c), x.nan, True, x.zs, x.uni)
    op = self.choice([Ops.NEG, Ops.TRUNC, Ops.SQRT, Ops.RECIP, Ops.EXP2, Ops.LOG2, Ops.SIN])
    if op is Ops.NEG: return IRValue(-x.v, nan=x.nan, inf=x.inf, zs=x.zs, uni=x.uni)
    if op is Ops.TRUNC: return IRValue(x.v.trunc(), nan=x.nan, inf=x.inf, zs=x.zs, uni=x.uni)
    approx = not self.exact_div
    if op is Ops.SQRT: return IRValue(x.v.sqrt(), K.ULPS[op] * approx, 0.0, True, x.inf, x.zs, x.uni)
    if op is Ops.RECIP:
      if x.zs: return None
      return IRValue(x.v.recip(), K.ULPS[op] * approx, 0.0, x.nan, True, False, x.uni)
    if op is Ops.EXP2:  # keep the result normal and finite: an approximate overflow or underflow is not comparable
      e = MAX_EXPONENT[dt] - 2
      x = self.clamp(x, -float(e), float(e))
      return IRValue(x.v.exp2(), K.ULPS[op], K._atol(op, dt), False, False, False, x.uni)
    if op is Ops.LOG2: return IRValue(x.v.log2(), K.ULPS[op], K._atol(op, dt), True, True, x.zs, x.uni)
    return IRValue(x.v.sin(), K.ULPS[op], K._atol(op, dt), x.nan or x.inf, False, x.zs, x.uni)

  def binary(self, dt: DType) -> IRValue | None:
    b = self.b
    if dt is dtypes.bool:
      x, y = self.of_dtype(dt), self.of_dtype(dt)
      op = self.choice([Ops.AND, Ops.OR, Ops.XOR, Ops.CMPNE, Ops.CMPEQ, Ops.CMPLT])
      return IRValue(b.alu(op, x.v, y.v), uni=x.uni and y.uni)
    if dt.kind in "iu":
      op = self.choice(_INT_BIN)
      x, y = self.of_dtype(dt), self.of_dtype(dt)
      yv = y.v
      if op in (Ops.IDIV, Ops.MOD):  # a zero divisor is unspecified: make it odd (MIN / -1 wraps, and is tested)
        yv = yv | b.const(1, dt) if self.r() < 0.8 else b.const(int(self.choice([v for v in int_edges(dt) if v])), dt)
      elif op in (Ops.SHL, Ops.SHR):  # shifts by >= the width are undefined: mask the amount
        yv = yv & b.const(dt.bits - 1, dt) if self.r() < 0.7 else b.const(int(self.rng.integers(dt.bits)), dt)
      return IRValue(b.alu(op, x.v, yv), uni=x.uni and y.uni)
    op = self.choice(_FLOAT_BIN)
    x, y = self.of_dtype(dt), self.of_dtype(dt)
    if op in (Ops.MAX, Ops.MIN):
      x, y = self.sanitize(x), self.sanitize(y)
      return IRValue(b.alu(op, x.v, y.v), nan=False, inf=x.inf or y.inf, zs=True, uni=x.uni and y.uni)
    if op is Ops.DIV and y.zs: return None
    ulps = K.ULPS[Ops.DIV] if op is Ops.DIV and not self.exact_div else 0.0
    nan = x.nan or y.nan or op is Ops.DIV or (x.inf and y.inf) or (op is Ops.MUL and (x.inf or y.inf))
    return IRValue(b.alu(op, x.v, y.v), ulps, 0.0, nan, True, x.zs or y.zs, x.uni and y.uni)

  def compare(self) -> IRValue:
    x = self.pick(lambda v: v.exact) or self.const(self.choice(self.palette))
    y = self.of_dtype(x.dt)
    return IRValue(self.b.alu(self.choice(_CMP), x.v, y.v), uni=x.uni and y.uni)

  def where(self) -> IRValue:
    c = self.pick(lambda v: v.dt is dtypes.bool) or self.compare()
    x = self.pick() or self.const(self.choice(self.palette))
    y = self.of_dtype(x.dt, exact=False)
    return IRValue(c.v.where(x.v, y.v), max(x.ulps, y.ulps), max(x.atol, y.atol), x.nan or y.nan, x.inf or y.inf, x.zs or y.zs,
              c.uni and x.uni and y.uni)

  def gather(self) -> IRValue:
    """A load at a data-dependent (but in-bounds) index."""
    src = self.pick(lambda v: v.dt.kind in "iub") or self.add(IRValue(self.tid, uni=False))
    i = src.v.cast(dtypes.int32) if src.dt is not dtypes.int32 else src.v
    idx = (i & self.b.const(0x7FFFFFFF, dtypes.int32)) % self.b.const(self.T, dtypes.int32)
    ptr, _, nan, inf = self.choice(self.inputs)
    return IRValue(ptr[idx], nan=nan, inf=inf, uni=src.uni)

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
      v = self.cast(x, dt) if self.r() < 0.95 or x.dt is not dt else IRValue(x.v.cast(dt), x.ulps, x.atol, x.nan, x.inf, x.zs, x.uni)
    elif r < 0.92:
      x = self.pick(lambda v: any(d in self.palette for d in _BITCASTS[v.dt]))
      v = self.bitcast(x, self.choice([d for d in _BITCASTS[x.dt] if d in self.palette])) if x is not None else None
    else: v = self.gather()
    if v is not None: self.add(v)

  # ---- statements
  def store(self, x: IRValue) -> None:
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

  def exact_of(self, dt: DType) -> IRValue:
    return self.of_dtype(dt, exact=True) if dt.kind == "f" else self.of_dtype(dt)

  def combine(self, acc: Any, dt: DType) -> None:
    """acc = acc (op) something: a register variable updated in a loop or a branch."""
    cur = IRValue(acc.value, nan=dt.kind == "f", inf=dt.kind == "f", zs=dt.kind == "f")
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

  def var_meta(self, acc: Any, dt: DType) -> IRValue:
    f = dt.kind == "f"
    return IRValue(acc.value, nan=f, inf=f, zs=f)

  def loop(self, depth: int) -> None:
    b = self.b
    rdt = self.choice([dtypes.int32] * 3 + [d for d in K.INTS if d is not dtypes.int32])
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
      self.add(IRValue(i, uni=uni))
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
    self.add(IRValue(acc.value, max(x.ulps, y.ulps), max(x.atol, y.atol), True, True, True))

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
    self.add(IRValue(w, x.ulps, x.atol, x.nan, x.inf, x.zs, False))

  # ---- the whole kernel
  def gen(self) -> K.Case:
    rng, b = self.rng, self.b
    gs, ls = [1, 1, 1], [1, 1, 1]
    for a in range(self.choice([1, 1, 2, 3])): gs[a], ls[a] = int(rng.integers(1, 4)), int(rng.integers(1, 5))
    while math.prod(gs) * math.prod(ls) > self.MAX_THREADS: ls[int(np.argmax(ls))] -= 1
    self.T, self.nlocal = math.prod(gs) * math.prod(ls), math.prod(ls)
    others = [d for d in K.ALL if d not in (dtypes.bool, dtypes.int32)]
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
      val = scalar_value(dt, rng)
      fv = float(val) if dt.kind == "f" else 0.0
      scalars.append(val)
      self.add(IRValue(b.scalar(f"s{k}", dt), nan=math.isnan(fv), inf=math.isinf(fv), uni=True))
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
    self.add(IRValue(self.tid)); self.add(IRValue(self.lid)); self.add(IRValue(gflat, uni=True)); self.add(IRValue(g[int(rng.integers(3))], uni=True))
    for ptr, _, nan, inf in self.inputs:
      self.add(IRValue(ptr[self.tid], nan=nan, inf=inf))
      if self.r() < 0.4: self.add(IRValue(ptr[gflat % b.const(self.T, dtypes.int32)], nan=nan, inf=inf, uni=True))
      if self.r() < 0.3:
        self.add(IRValue(ptr[(self.tid + b.const(int(rng.integers(1, 7)), dtypes.int32)) % b.const(self.T, dtypes.int32)], nan=nan, inf=inf))
    self.block(int(rng.integers(10, 28)), 0)
    vec = self.vectors()
    kernel = b.finish()
    outs = [fuzz_values(dt, max(1, len(self.slots[dt])) * self.T, rng) for dt in self.palette]
    ulps = {i: [(j * self.T, (j + 1) * self.T, math.ceil(u), a) for j, (u, a) in enumerate(self.slots[dt])]
            for i, dt in enumerate(self.palette) if dt.kind == "f"}
    return K.Case(kernel.name, kernel, outs + data + vec, tuple(scalars), tuple(gs), tuple(ls), ulps)  # type: ignore[arg-type]

  def vectors(self) -> list[np.ndarray]:
    """Maybe (from the layout stream): thread t reads the vector of w elements at index (t % (T // w)) * w of an input
    (w 4, or 2 where 4 would pass 16 bytes), reverses it, adds the lane's number to integer lanes (NOT to a bool's first)
    and writes it at t * w of a new output, sometimes only in even threads; returns that output's initial contents."""
    lay, b = self.layout, self.b
    if lay.random() >= 0.5: return []
    ptr, dt, _, _ = self.inputs[int(lay.integers(len(self.inputs)))]
    w = 4 if 4 * dt.itemsize <= 16 and self.T >= 4 else 2
    if self.T < w: return []
    lanes = list(reversed(ptr.vload((self.tid % b.const(self.T // w, dtypes.int32)) * b.const(w, dtypes.int32), w)))
    if dt.kind in "iu": lanes = [v + b.const(k, dt) if k else v for k, v in enumerate(lanes)]
    elif dt is dtypes.bool: lanes[0] = ~lanes[0]
    out = b.buffer(f"vec_{dt.name}", dt)
    at = self.tid * b.const(w, dtypes.int32)
    if lay.random() < 0.5:
      with b.if_((self.tid % b.const(2, dtypes.int32)).eq(0)): out.vstore(at, lanes)
    else: out.vstore(at, lanes)
    return [fuzz_values(dt, self.T * w, lay)]


def ir_case(seed: int, exact_div: bool = True, avoid: frozenset[str] = AVOIDABLE) -> K.Case:
  """A random IR kernel with inputs and launch size. exact_div=False treats DIV/SQRT/RECIP as approximate
  (for devices outside EXACT_DEVICES), which changes what the generator may build on them. `avoid`: known bugs
  (KNOWN_BUGS) not to trigger."""
  return IRKernelGenerator(seed, exact_div, frozenset(avoid)).gen()


def ir_repro(seed: int, case: K.Case, exact_div: bool, avoid: frozenset[str] = AVOIDABLE) -> str:
  extra = "" if avoid == AVOIDABLE else f", avoid={sorted(avoid)!r}"
  return (repro_line("ir", seed, f"ir_case({seed}, exact_div={exact_div}{extra})", avoid) + "\n"
          f"launch: groups {case.global_size} x threads {case.local_size}, scalars {case.vals!r}\n{case.kernel.dump()}")


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
    if fast_math and want_ftz is not None: w = flush_tolerant(got, w, want_ftz[i], dt)
    if fast_math and (m := nonfinite(w, dt)).any(): got = np.where(m, w, got)
    for start, stop, nulps, atol in case.ulps.get(i, [(0, len(w), 0, 0.0)]):
      K.compare(f"{case.name}: buffer {case.kernel.buffers[i].arg[1]}[{start}:{stop}]", got[start:stop], w[start:stop], dt, nulps, atol)


def run_ir(seed: int, targets: Sequence[Target] | None = None, avoid: frozenset[str] = AVOIDABLE) -> list[Outcome]:
  """One random IR kernel on every target, against the interpreter."""
  from plugrt.compiler import interpreter
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
    case, want = cached_case(("ir", seed, ed, avoid), make)
    want_ftz = None
    if t.fast_math:
      def make_ftz(case: K.Case = case, want: list[np.ndarray] = want) -> list[np.ndarray]:
        inputs, vals = flush_subnormals(case)
        if vals == case.vals and all(a is b for a, b in zip(inputs, case.inputs)): return want  # nothing to flush
        out = [a.copy() for a in inputs]
        interpreter.run(case.kernel, out, vals, case.global_size, case.local_size)
        return out
      want_ftz = cached_case(("ir-ftz", seed, ed, avoid), make_ftz)
    try:
      _run_ir_case(Device[t.device], case, t.compiler, want, t.fast_math, want_ftz)
      out.append(Outcome("ir", seed, str(t), "ok"))
    except RenderError as e: out.append(Outcome("ir", seed, str(t), "skip", e.message))
    except Exception as e:
      detail = str(e) if isinstance(e, AssertionError) else error_text(e)
      out.append(Outcome("ir", seed, str(t), "fail", detail, ir_repro(seed, case, ed, avoid)))
  return out
