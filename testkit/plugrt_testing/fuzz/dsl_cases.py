"""Random @kernel functions: their Python source, inputs, and the outputs dsl_reference computes; written to a file,
imported and launched on every device.
"""
from __future__ import annotations

import importlib.util
import math
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from plugrt.dtype import dtypes
from plugrt.errors import RenderError
from plugrt_testing.fuzz.compare import compare_within_error
from plugrt_testing.fuzz.dsl_reference import RefValue, as_kind, binary_op, compare_op, f32, kind_of, promote_kind, reassociating, ulp32, wrap32
from plugrt_testing.fuzz.outcomes import AVOIDABLE, Outcome, cached_case, error_text, repro_line
from plugrt_testing.fuzz.targets import EXACT_DEVICES, FAST_MATH_DEVICES, devices
from plugrt_testing.fuzz.values import (
  fuzz_values,
)


@dataclass
class DSLExpr:
  """An expression of a generated DSL kernel: its source, and its value under the DSL's semantics."""
  kind: str                          # "i" int32, "f" float32, "b" bool
  src: str
  ev: Callable[[dict[str, RefValue]], RefValue]
  approx: bool = False               # may differ from the reference by an error bound (approximate math)
  bound: float = float(1 << 31)      # floats: |value| <= bound (the generator keeps floats finite)
  const: bool = False


def int_literal(c: int) -> DSLExpr: return DSLExpr("i", f"({c})", lambda env: RefValue(c), const=True)


_FLOAT_LITERALS = (0.0, 0.5, 1.0, -1.0, 2.5, 0.1, 3.0, -0.25, 100.0, 1e-3, 1.5, -7.0)
_INT_LITERALS = (0, 1, 2, 3, 5, 7, -1, -2, -3, 16, 31, 100, -100, 1000, 65535, 2147483647, -2147483648)


class DSLKernelGenerator:
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
  def lit(self, kind: str) -> DSLExpr:
    if kind == "f":
      c = float(self.choice(_FLOAT_LITERALS))
      return DSLExpr("f", f"({c!r})", lambda env, v=f32(c): RefValue(v), bound=abs(c), const=True)
    if kind == "b":
      return self.gen("b", 0)
    return int_literal(int(self.choice(_INT_LITERALS)))

  def leaf(self, kind: str, exact: bool) -> DSLExpr:
    vars_ = [v for v in self.var_list() if v[1] == kind and not (exact and v[2])]
    r = self.r()
    if vars_ and r < 0.45:
      name, _, approx, bound = self.choice(vars_)
      return DSLExpr(kind, name, lambda env, n=name: env[n], approx, bound)
    if kind == "i":
      return self.choice([DSLExpr("i", "a[i]", lambda env: env["a[i]"]), DSLExpr("i", "b[i]", lambda env: env["b[i]"]),
                          DSLExpr("i", "i", lambda env: env["i"]), DSLExpr("i", "n", lambda env: env["n"]),
                          DSLExpr("i", "a[b[i] % n]", lambda env: env["a[b[i]%n]"])])
    if kind == "f":
      return self.choice([DSLExpr("f", "x[i]", lambda env: env["x[i]"], bound=100.0), DSLExpr("f", "y[i]", lambda env: env["y[i]"], bound=100.0),
                          DSLExpr("f", "s", lambda env: env["s"], bound=100.0),
                          DSLExpr("f", "x[a[i] % n]", lambda env: env["x[a[i]%n]"], bound=100.0)])
    return DSLExpr("b", "c[i]", lambda env: env["c[i]"])

  def gen(self, kind: str, depth: int, exact: bool = False) -> DSLExpr:
    """An expression of `kind`; exact=True: no approximate math in it (for comparisons, int(), floor, ...)."""
    if depth <= 0 or self.r() < 0.2: return self.leaf(kind, exact)
    return {"i": self.gen_int, "f": self.gen_float, "b": self.gen_bool}[kind](depth - 1, exact)

  def operand(self, kind: str, depth: int, exact: bool, other_const: bool = False) -> DSLExpr:
    if not other_const and self.r() < 0.25: return self.lit(kind)
    return self.gen(kind, depth, exact)

  def gen_int(self, d: int, exact: bool) -> DSLExpr:
    r = self.r()
    a = self.gen("i", d, exact)
    if r < 0.3:
      op = self.choice(["+", "-", "*", "&", "|", "^"])
      b = self.operand("i" if self.r() < 0.9 else "b", d, exact, a.const)
      return DSLExpr("i", f"({a.src} {op} {b.src})", lambda env: binary_op(op, a.ev(env), b.ev(env)))
    if r < 0.42:  # floor division and modulo: a divisor that is never zero
      op = self.choice(["//", "%"])
      if self.r() < 0.5 and not a.const: b = int_literal(int(self.choice([3, -3, 7, -1, 2, -2, 16])))
      else:
        inner = self.gen("i", d, exact)
        b = DSLExpr("i", f"({inner.src} | 1)", lambda env: binary_op("|", inner.ev(env), RefValue(1)))
      return DSLExpr("i", f"({a.src} {op} {b.src})", lambda env: binary_op(op, a.ev(env), b.ev(env)))
    if r < 0.5:  # shifts by 0..31 (more is undefined)
      op = self.choice(["<<", ">>"])
      if self.r() < 0.5: amt = int_literal(int(self.rng.integers(0, 32)))
      else:
        inner = self.gen("i", d, exact)
        amt = DSLExpr("i", f"({inner.src} & 31)", lambda env: binary_op("&", inner.ev(env), RefValue(31)))
      return DSLExpr("i", f"({a.src} {op} {amt.src})", lambda env: binary_op(op, a.ev(env), amt.ev(env)))
    if r < 0.58:
      op = self.choice(["-", "~"])
      return DSLExpr("i", f"({op}{a.src})", lambda env: RefValue(wrap32(-a.ev(env).v if op == "-" else ~a.ev(env).v), 0.0, a.ev(env).dc))
    if r < 0.64: return DSLExpr("i", f"abs({a.src})", lambda env: (lambda x: RefValue(wrap32(abs(x.v)), 0.0, x.dc))(a.ev(env)))
    if r < 0.72:
      fn = self.choice(["min", "max"])
      rest = [self.operand("i", d, exact) for _ in range(int(self.rng.integers(1, 3)))]
      return DSLExpr("i", f"{fn}({a.src}, {', '.join(e.src for e in rest)})", lambda env: self._minmax(fn, [a.ev(env), *(e.ev(env) for e in rest)]))
    if r < 0.76:
      k = int(self.rng.integers(0, 4))
      return DSLExpr("i", f"({a.src} ** {k})", lambda env: (lambda x: RefValue(wrap32(x.v ** k), 0.0, x.dc))(a.ev(env)))
    if r < 0.84:
      c, b = self.gen("b", d, True), self.gen("i", d, exact)
      return DSLExpr("i", f"({a.src} if {c.src} else {b.src})", lambda env: self._ifexp(c.ev(env), a.ev(env), b.ev(env), "i"))
    if r < 0.92:  # int() of a float that fits
      f = self.gen("f", d, True)
      if f.bound >= 2e9: return a
      return DSLExpr("i", f"int({f.src})", lambda env: as_kind(f.ev(env), "i"))
    c = self.gen("b", d, True)
    return DSLExpr("i", f"({c.src} + {a.src})", lambda env: binary_op("+", c.ev(env), a.ev(env)))

  @staticmethod
  def _minmax(fn: str, vals: list[RefValue]) -> RefValue:
    out = vals[0]
    for v in vals[1:]:
      k = promote_kind(kind_of(out.v), kind_of(v.v))
      x, y = as_kind(out, k), as_kind(v, k)
      pick = (x.v >= y.v if fn == "max" else x.v <= y.v) if k == "f" else (x.v > y.v if fn == "max" else x.v < y.v)
      out = RefValue(x.v if pick else y.v, max(x.err, y.err), x.dc or y.dc)
    return out

  @staticmethod
  def _ifexp(c: RefValue, a: RefValue, b: RefValue, kind: str) -> RefValue:
    a, b = as_kind(a, kind), as_kind(b, kind)
    out = a if c.v else b
    same = a.v == b.v and a.err == b.err == 0
    return RefValue(out.v, max(a.err, b.err), out.dc or (c.dc and not same))

  def gen_float(self, d: int, exact: bool) -> DSLExpr:
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
      return DSLExpr("f", f"({pair[0].src} {op} {pair[1].src})", lambda env: binary_op(op, pair[0].ev(env), pair[1].ev(env)), a.approx or b.approx,
                bound * 1.01)
    if r < 0.38 and not (exact and approx_div):  # true division by a value at least 0.5 from zero
      b = self.gen(self.choice("fi"), d, exact)
      src = f"({a.src} / (abs({b.src}) + 0.5))"
      return DSLExpr("f", src, lambda env: binary_op("/", a.ev(env), binary_op("+", self._abs(b.ev(env)), RefValue(f32(0.5)))),
                     a.approx or b.approx or approx_div, a.bound * 2.02)
    if r < 0.43 and self.exact_div and not a.approx:  # Python's floor division and remainder on floats
      op = self.choice(["//", "%"])
      b = self.gen("f", d, True)
      if b.approx: return a
      src = f"({a.src} {op} (abs({b.src}) + 0.5))"
      return DSLExpr("f", src, lambda env: binary_op(op, a.ev(env), binary_op("+", self._abs(b.ev(env)), RefValue(f32(0.5)))), False,
                (a.bound * 2.02 + 1) if op == "//" else b.bound + 1)
    if r < 0.5:
      op = self.choice(["-", "abs"])
      if op == "-": return DSLExpr("f", f"(-{a.src})", lambda env: (lambda x: RefValue(-x.v, x.err, x.dc))(a.ev(env)), a.approx, a.bound)
      return DSLExpr("f", f"abs({a.src})", lambda env: self._abs(a.ev(env)), a.approx, a.bound)
    if r < 0.57:
      fn = self.choice(["min", "max"])
      rest = [self.operand(self.choice("ffi"), d, exact) for _ in range(int(self.rng.integers(1, 3)))]
      bound = max([a.bound] + [e.bound if e.kind == "f" else float(1 << 31) for e in rest])
      return DSLExpr("f", f"{fn}({a.src}, {', '.join(e.src for e in rest)})", lambda env: self._minmax(fn, [a.ev(env), *(e.ev(env) for e in rest)]),
                a.approx or any(e.approx for e in rest), bound)
    if r < 0.63 and not a.approx:
      fn = self.choice(["floor", "ceil", "trunc"])
      return DSLExpr("f", f"math.{fn}({a.src})", lambda env: self._round_fn(fn, a.ev(env)), False, a.bound + 1)
    if r < 0.67:
      k = int(self.rng.integers(0, 4))
      if a.bound ** max(k, 1) > 1e30: return a
      def power(env: dict[str, RefValue], k: int = k) -> RefValue:
        x, out = a.ev(env), RefValue(f32(1.0))
        for _ in range(k): out = binary_op("*", out, x)
        return out
      return DSLExpr("f", f"({a.src} ** {k})", power, a.approx, max(a.bound ** k, 1.0))
    if r < 0.82 and not exact:
      return self.math_call(a)
    if r < 0.88:
      i = self.gen("i", d, exact)
      return DSLExpr("f", f"float({i.src})", lambda env: as_kind(i.ev(env), "f"), i.approx, float(1 << 31))
    c, b = self.gen("b", d, True), self.gen("f", d, exact)
    return DSLExpr("f", f"({a.src} if {c.src} else {b.src})", lambda env: self._ifexp(c.ev(env), a.ev(env), b.ev(env), "f"), a.approx or b.approx,
              max(a.bound, b.bound))

  @staticmethod
  def _abs(x: RefValue) -> RefValue:
    if kind_of(x.v) != "f": x = as_kind(x, "i")
    return RefValue(abs(x.v) if kind_of(x.v) == "f" else wrap32(abs(x.v)), x.err, x.dc)

  @staticmethod
  def _round_fn(fn: str, x: RefValue) -> RefValue:
    f = {"floor": math.floor, "ceil": math.ceil, "trunc": math.trunc}[fn]
    dc = x.dc or (x.err > 0 and f(float(x.v) - x.err) != f(float(x.v) + x.err))
    return RefValue(f32(float(f(float(x.v)))), 0.0, dc)

  def math_call(self, a: DSLExpr) -> DSLExpr:
    """An approximate math function, its argument kept in a range where the result is finite and well-conditioned."""
    fn = self.choice(["sqrt", "exp", "log", "sin", "cos", "exp2", "log2", "pow05"])
    clamp = f"min(max({a.src}, -20.0), 20.0)"
    if fn in ("sqrt", "pow05"):
      src = f"math.sqrt(abs({a.src}))" if fn == "sqrt" else f"(abs({a.src}) ** 0.5)"
      arg, bound = (lambda env: self._abs(a.ev(env))), math.sqrt(a.bound) + 1
    elif fn in ("log", "log2"):
      src, bound = f"math.{fn}(abs({a.src}) + 1.0)", 90.0
      arg = lambda env: binary_op("+", self._abs(a.ev(env)), RefValue(f32(1.0)))
    elif fn in ("exp", "exp2"):
      src, bound = f"math.{fn}({clamp})", 5e8
      arg = lambda env: self._minmax("min", [self._minmax("max", [a.ev(env), RefValue(f32(-20.0))]), RefValue(f32(20.0))])
    else:
      src, bound = f"math.{fn}({clamp})", 1.0
      arg = lambda env: self._minmax("min", [self._minmax("max", [a.ev(env), RefValue(f32(-20.0))]), RefValue(f32(20.0))])
    exact_sqrt = fn in ("sqrt", "pow05") and self.exact_div

    def ev(env: dict[str, RefValue]) -> RefValue:
      x = arg(env)
      xv = float(x.v)
      if exact_sqrt:
        y = float(np.sqrt(x.v))
        e = math.sqrt(xv + x.err) - math.sqrt(max(xv - x.err, 0.0)) if x.err else 0.0
        return RefValue(f32(y), e + (ulp32(y) if e else 0.0), x.dc)
      y = {"sqrt": math.sqrt, "pow05": math.sqrt, "exp": math.exp, "log": math.log, "sin": math.sin, "cos": math.cos, "exp2": math.exp2,
           "log2": math.log2}[fn](xv)
      # error: the op's own (a few ulps), the argument's error through the derivative, and the DSL's rewrites
      # (exp(x) = exp2(x * log2(e)), log(x) = log2(x) * ln 2, cos(x) = sin(x + pi/2): each rounds its argument once)
      if fn in ("sqrt", "pow05"): deriv = (math.sqrt(xv + x.err) - math.sqrt(max(xv - x.err, 0.0))) / x.err if x.err else 0.0
      elif fn in ("log", "log2"): deriv = 1 / (max(xv - x.err, 1e-30) * (math.log(2) if fn == "log2" else 1.0))
      else: deriv = {"exp": abs(y) * 1.01, "exp2": abs(y) * 1.01 * math.log(2), "sin": 1.0, "cos": 1.0}[fn]
      rewrite = {"exp": abs(y) * abs(xv) * 2 ** -22, "log": abs(y) * 2 ** -22, "cos": ulp32(abs(xv) + 2) + 1e-7}.get(fn, 0.0)
      e = x.err * deriv + rewrite + 8 * ulp32(y) + 2e-7 * (fn in ("sin", "cos", "log", "log2"))
      return RefValue(f32(y), e, x.dc)
    return DSLExpr("f", src, ev, True, bound)

  def gen_bool(self, d: int, exact: bool) -> DSLExpr:
    r = self.r()
    if r < 0.45:  # comparisons, chained like Python's
      ops = [self.choice(["<", "<=", ">", ">=", "==", "!="]) for _ in range(int(self.rng.integers(1, 3)))]
      terms = [self.gen(self.choice("iifb"), d, True) for _ in range(len(ops) + 1)]
      src = " ".join([terms[0].src] + [f"{o} {t.src}" for o, t in zip(ops, terms[1:])])

      def chain(env: dict[str, RefValue]) -> RefValue:
        vals = [t.ev(env) for t in terms]  # every term is evaluated (the DSL does not short-circuit)
        out = RefValue(True)
        for o, x, y in zip(ops, vals, vals[1:]):
          c = compare_op(o, x, y)
          out = RefValue(out.v and c.v, 0.0, out.dc or c.dc)
        return out
      return DSLExpr("b", f"({src})", chain)
    if r < 0.65:
      op = self.choice(["and", "or"])
      a, b = self.gen("b", d, True), self.gen(self.choice("bbi"), d, True)
      def logic(env: dict[str, RefValue]) -> RefValue:
        x, y = as_kind(a.ev(env), "b"), as_kind(b.ev(env), "b")
        return RefValue(bool(x.v and y.v) if op == "and" else bool(x.v or y.v), 0.0, x.dc or y.dc)
      return DSLExpr("b", f"({a.src} {op} {b.src})", logic)
    if r < 0.75:
      a = self.gen("b", d, True)
      return DSLExpr("b", f"(not {a.src})", lambda env: (lambda x: RefValue(not x.v, 0.0, x.dc))(as_kind(a.ev(env), "b")))
    if r < 0.85:
      a = self.gen(self.choice("if"), d, True)
      return DSLExpr("b", f"bool({a.src})", lambda env: as_kind(a.ev(env), "b"))
    op = self.choice(["&", "|", "^"])
    a, b = self.gen("b", d, True), self.gen("b", d, True)
    return DSLExpr("b", f"({a.src} {op} {b.src})", lambda env: binary_op(op, a.ev(env), b.ev(env)))

  # ---- statements (each returns the reference's version: a function of the environment and the thread's outputs)
  def emit(self, depth: int, text: str) -> None: self.lines.append("  " * (depth + 1) + text)

  def new_var(self) -> str:
    self.nvar += 1
    return f"v{self.nvar}"

  def store(self, depth: int, e: DSLExpr) -> Callable[..., None]:
    kind = e.kind if e.kind != "b" or self.r() < 0.7 else "i"
    buf = {"i": "oi", "f": "of", "b": "ob"}[kind]
    j = self.slots[kind]
    self.slots[kind] += 1
    self.emit(depth, f"{buf}[{j} * n + i] = {e.src}")
    def st(env: dict[str, RefValue], out: dict[str, Any]) -> None: out[kind][j] = as_kind(e.ev(env), kind)
    return st

  def store_var(self, depth: int) -> Callable[..., None]:
    """Store the newest variable: values are checked where they are made, before comparisons hide small errors."""
    name, kind, approx, bound = self.scopes[-1][-1]
    return self.store(depth, DSLExpr(kind, name, lambda env: env[name], approx, bound))

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
        stmts.append(lambda env, out, n=name, e=e, k=kind: env.__setitem__(n, as_kind(e.ev(env), k)))
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

    def st(env: dict[str, RefValue], out: dict[str, Any]) -> None:
      for k, c in enumerate(conds + [None]):
        if c is not None:
          cv = as_kind(c.ev(env), "b")
          if cv.dc: out["tainted"] = True
          if not cv.v: continue
        for s in bodies[k]: s(env, out)
        env[name] = as_kind(values[k].ev(env), kind)
        return
    return st

  def for_stmt(self, depth: int) -> Callable[..., None]:
    """for over a small range (constant or data-dependent bounds, any step), updating an accumulator."""
    step = int(self.choice([1, 1, 1, 2, 3, -1, -2]))
    def bound_expr() -> DSLExpr:
      if self.r() < 0.4:
        c = int(self.rng.integers(-3, 9))
        return int_literal(c)
      inner = self.gen("i", 2, True)
      mask = self.choice(["& 7", "% 5", "& 3"])
      return DSLExpr("i", f"({inner.src} {mask})", lambda env: binary_op(mask[0], inner.ev(env), RefValue(int(mask[2:]))))
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
      update = lambda env: binary_op(op[0], env[acc], upd.ev(env))
    elif kind == "f":
      if upd.bound > 1e27: upd = self.lit("f")
      op = self.choice(["+=", "-=", "max", "min"])
      if op in ("max", "min"):
        self.emit(depth + 1, f"{acc} = {op}({acc}, {upd.src})")
        update = lambda env: self._minmax(op, [env[acc], upd.ev(env)])
      else:
        self.emit(depth + 1, f"{acc} {op} {upd.src}")
        update = lambda env: binary_op(op[0], env[acc], upd.ev(env))
    else:
      op = self.choice(["or", "and", "^"])
      self.emit(depth + 1, f"{acc} = {acc} {op} {upd.src}")
      update = lambda env: (binary_op("^", env[acc], as_kind(upd.ev(env), "b")) if op == "^" else
                            self._logic(op, env[acc], upd.ev(env)))
    self.scopes.pop()
    bound = (init.bound if init.kind == "f" else float(1 << 31)) + 20 * upd.bound if kind == "f" else float(1 << 31)
    self.scopes[-1].append((acc, kind, init.approx or upd.approx, bound))

    def st(env: dict[str, RefValue], out: dict[str, Any]) -> None:
      env[acc] = as_kind(init.ev(env), kind)
      a, b = start.ev(env), stop.ev(env)
      if a.dc or b.dc: out["tainted"] = True
      for kv in range(a.v, b.v, step):
        env[loopvar] = RefValue(kv)
        for s in body: s(env, out)
        env[acc] = as_kind(update(env), kind)
    return st

  @staticmethod
  def _logic(op: str, a: RefValue, b: RefValue) -> RefValue:
    x, y = as_kind(a, "b"), as_kind(b, "b")
    return RefValue(bool(x.v and y.v) if op == "and" else bool(x.v or y.v), 0.0, x.dc or y.dc)

  # ---- the whole kernel
  def build(self) -> DSLCase:
    rng = self.rng
    groups, threads = int(rng.integers(1, 5)), int(rng.integers(1, 9))
    T = groups * threads
    body = self.block(0, int(rng.integers(6, 16)))
    for name, kind, _, _ in self.scopes[0][-3:]:  # the last values: stored at the top level too
      body.append(self.store(0, DSLExpr(kind, name, lambda env, n=name: env[n])))
    src = ["import math", "", "from plugrt import dtypes, kernel", "from plugrt.frontend.dsl import global_id", "", "",
           f"# generated by plugrt_testing.fuzz.dsl_case({self.seed}, exact_div={self.exact_div})", "@kernel",
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
        env = {"i": RefValue(t), "n": RefValue(T), "a[i]": RefValue(int(a[t])), "b[i]": RefValue(int(b[t])), "x[i]": RefValue(x[t]),
               "y[i]": RefValue(y[t]), "s": RefValue(f32(sval)), "c[i]": RefValue(bool(c[t])),
               "a[b[i]%n]": RefValue(int(a[int(b[t]) % T])), "x[a[i]%n]": RefValue(x[int(a[t]) % T])}
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
    return (repro_line("dsl", self.seed, f"dsl_case({self.seed}, exact_div={self.exact_div}{extra})", self.avoid) + "\n"
            f"launch: [{self.groups}, {self.threads}], n={self.scalars[0]}, s={self.scalars[1]!r}\n{self.source}")


def dsl_case(seed: int, exact_div: bool = True, avoid: frozenset[str] = AVOIDABLE, reassociates: bool = False) -> DSLCase:
  """A random @kernel function's source, its inputs, and the outputs the DSL's semantics give. reassociates=True (for
  FAST_MATH_DEVICES): the same kernel, float + and - given the error bound of a reassociation."""
  with reassociating(reassociates): case = DSLKernelGenerator(seed, exact_div, frozenset(avoid)).build()
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
    case, kf = cached_case(("dsl", seed, ed, avoid, fm), make)
    if isinstance(kf, Exception):
      out.append(Outcome("dsl", seed, dev, "fail", f"the DSL rejected the kernel: {error_text(kf)}", case.repro()))
      continue
    try:
      T = case.groups * case.threads
      bufs = {k: Buffer.from_numpy(np.ascontiguousarray(v), dev) for k, v in case.inputs.items()}
      outs = {k: Buffer.from_numpy(v.copy(), dev) for k, v in case.init.items()}
      kf[case.groups, case.threads, dev](outs["i"], outs["f"], outs["b"], bufs["a"], bufs["b"], bufs["x"], bufs["y"], bufs["c"], T,
                                         case.scalars[1], wait=True)
      for kind, name, dt in (("i", "oi", dtypes.int32), ("f", "of", dtypes.float32), ("b", "ob", dtypes.bool)):
        compare_within_error(f"{case.name}: {name}", outs[kind].numpy(), case.want[kind], case.err[kind], case.dc[kind], dt)
      out.append(Outcome("dsl", seed, dev, "ok"))
    except RenderError as e: out.append(Outcome("dsl", seed, dev, "skip", e.message))
    except Exception as e:
      out.append(Outcome("dsl", seed, dev, "fail", str(e) if isinstance(e, AssertionError) else error_text(e), case.repro()))
  return out
