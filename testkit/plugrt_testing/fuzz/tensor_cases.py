"""Random Tensor expressions (broadcasting, elementwise ops, casts, where, reductions, matmul, views) over random
leaves, evaluated by plugrt on every device and by numpy in the dtypes plugrt's promotion picks.

Where a leaf's memory starts is drawn too: a fresh buffer (aligned: the kernels read it with vector loads) or a view
1 to 3 elements into a larger one (unaligned: element by element), and some reductions take a source of 1024 to
20000 elements (reduced in stages), so that vector access and its scalar tails are compared with numpy on every
device. Those draws come from a second random stream (`layout`), so the expressions of earlier seeds stay the same.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from plugrt.compiler import samples as K
from plugrt.compiler.ir import Ops
from plugrt.dtype import DType, bf16_to_f32, cast_value, dtypes, f32_to_bf16
from plugrt.errors import RenderError
from plugrt_testing.fuzz.compare import compare_within_error
from plugrt_testing.fuzz.outcomes import AVOIDABLE, Outcome, cached_case, error_text, repro_line
from plugrt_testing.fuzz.targets import EXACT_DEVICES, devices
from plugrt_testing.fuzz.values import (
  MANTISSA_BITS,
  fuzz_values,
)

_TENSOR_DTYPES = (dtypes.float32, dtypes.float32, dtypes.float16, dtypes.float64, dtypes.bfloat16, dtypes.int32, dtypes.int32, dtypes.int8,
                  dtypes.uint8, dtypes.int16, dtypes.int64, dtypes.uint32, dtypes.bool, dtypes.bool)


def _rnd(x: Any, dt: DType) -> np.ndarray:
  """x as values of dt, the way plugrt holds them (bfloat16: float32 values, rounded through float32 like the interpreter)."""
  with np.errstate(all="ignore"):
    if dt is dtypes.bfloat16: return bf16_to_f32(f32_to_bf16(np.asarray(x).astype(np.float32)))
    return np.asarray(x).astype(dt.numpy)


@dataclass
class TensorExpr:
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


class TensorExprGenerator:
  def __init__(self, seed: int, exact_div: bool, avoid: frozenset[str]):
    self.rng = np.random.default_rng([0x7E, seed])
    self.seed, self.exact_div, self.avoid = seed, exact_div, avoid
    self.leaves: dict[str, tuple[np.ndarray, DType]] = {}
    self.layout = np.random.default_rng([0x7F, seed])  # leaf offsets and large reductions (see the module docstring)
    self.offsets: dict[str, int] = {}

  def r(self) -> float: return float(self.rng.random())
  def choice(self, seq: Sequence[Any]) -> Any: return seq[int(self.rng.integers(len(seq)))]

  # ---- leaves and shapes
  def leaf(self, shape: tuple[int, ...], dt: DType | None = None) -> TensorExpr:
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
    if shape and self.layout.random() < 0.4: self.offsets[name] = int(self.layout.integers(1, 4))
    return TensorExpr(name, lambda env: env[name], dt, data.copy(), np.zeros(shape), np.zeros(shape, bool))

  def sub_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts to `shape`: some dims 1, maybe fewer leading dims."""
    out = tuple(1 if self.r() < 0.25 else d for d in shape)
    drop = int(self.rng.integers(0, len(out) + 1)) if self.r() < 0.3 else 0
    return out[drop:]

  def rand_shape(self) -> tuple[int, ...]:
    return tuple(int(self.rng.integers(1, 5)) for _ in range(int(self.choice([0, 1, 1, 2, 2, 2, 3, 3]))))

  # ---- the numpy model of plugrt's operations
  def ulp(self, dt: DType, x: np.ndarray) -> np.ndarray: return K.ulp(dt, x.astype(np.float64)) if dt.kind == "f" else np.zeros(x.shape)

  def node(self, src: str, build: Callable[[dict[str, Any]], Any], dt: DType, v: Any, err: Any = None, dc: Any = None) -> TensorExpr:
    v = np.asarray(v)
    err = np.zeros(v.shape) if err is None else np.broadcast_to(np.asarray(err, np.float64), v.shape).copy()
    dc = np.zeros(v.shape, bool) if dc is None else np.broadcast_to(np.asarray(dc), v.shape).copy()
    if dt.kind == "f": dc |= ~np.isfinite(v.astype(np.float64)) & (err != 0)  # (a NaN error bound too)
    else: err = np.zeros(v.shape)
    return TensorExpr(src, build, dt, v, err, dc)

  def cast(self, a: TensorExpr, dt: DType, src: str | None = None) -> TensorExpr:
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

  def arith(self, op: str, a: TensorExpr, b: TensorExpr, dt: DType) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
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

  def operands(self, a: TensorExpr, other: Any) -> tuple[TensorExpr, TensorExpr, DType]:
    """Tensor._operands: one dtype for both, a Python number taking the tensor's kind."""
    from plugrt.compiler.arith import promote
    if isinstance(other, TensorExpr): dt = promote(a.dt, other.dt); b = other
    else:
      dt = a.dt
      if isinstance(other, float) and dt.kind != "f": dt = dtypes.float32
      elif isinstance(other, int) and not isinstance(other, bool) and dt is dtypes.bool: dt = dtypes.int32
      c = _rnd(np.array(cast_value(other, dt)), dt)
      b = TensorExpr(repr(other), lambda env: other, dt, c, np.zeros(()), np.zeros((), bool))
    return self.cast(a, dt, a.src), (self.cast(b, dt, b.src) if isinstance(other, TensorExpr) else b), dt

  def binary(self, a: TensorExpr, b: Any, op: str, sym: str, reverse: bool = False) -> TensorExpr:
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
    build_a, build_b = a.build, (b.build if isinstance(b, TensorExpr) else (lambda env: b))
    fn = _TENSOR_BINOPS[sym]
    build = (lambda env: fn(build_b(env), build_a(env))) if reverse else (lambda env: fn(build_a(env), build_b(env)))
    bsrc = b.src if isinstance(b, TensorExpr) else repr(b)
    src = f"({bsrc} {sym} {a.src})" if reverse else f"({a.src} {sym} {bsrc})" if not sym.isalpha() else f"{a.src}.{sym}({bsrc})"
    return self.node(src, build, rdt, v, None if cmp is not None else err, dc)

  # ---- expressions
  def expr(self, shape: tuple[int, ...], depth: int) -> TensorExpr:
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

  def elementwise(self, shape: tuple[int, ...], depth: int) -> TensorExpr:
    sym = self.choice(["+", "-", "*", "/", "//", "%", "maximum", "minimum", "&", "|", "^", "<", "<=", ">", ">=", "==", "!="])
    a = self.expr(self.sub_shape(shape) if self.r() < 0.5 else shape, depth - 1)
    b: Any = self.scalar(a.dt) if self.r() < 0.3 else self.expr(shape if a.shape != shape else self.sub_shape(shape), depth - 1)
    reverse = not isinstance(b, TensorExpr) and sym in ("+", "-", "*", "/", "<", ">", "==") and self.r() < 0.4
    kinds = {a.dt.kind} | ({b.dt.kind} if isinstance(b, TensorExpr) else {"f" if isinstance(b, float) else "i"})
    bool_arith = (kinds == {"b"} or (a.dt is dtypes.bool and not isinstance(b, TensorExpr) and isinstance(b, bool)))
    if sym in ("&", "|", "^") and "f" in kinds: sym = "*"
    if sym in ("+", "-", "*", "maximum", "minimum", "//", "%") and bool_arith:
      if sym in ("-", "//", "%"): sym = self.choice(["&", "|", "^"])
      else: return self.bool_arith(a, b, sym)
    if sym == "/":  # true division: an integer or bool tensor becomes float32 first (Tensor._float)
      af = self.cast(a, dtypes.float32, a.src) if a.dt.kind != "f" else a
      out = self.binary(af, b, "div", "/", reverse)
      return TensorExpr(out.src, (lambda env: _TENSOR_BINOPS["/"](b, a.build(env))) if reverse and not isinstance(b, TensorExpr) else
                 (lambda env: a.build(env) / (b.build(env) if isinstance(b, TensorExpr) else b)), out.dt, out.v, out.err, out.dc)
    if sym in ("//", "%"):
      x, y, dt = self.operands(a, b)
      if dt.kind == "f" and (not x.exact or not y.exact): sym = "*"
      elif dt.kind != "f":  # a divisor that is never zero: b | 1 (or an odd constant)
        if isinstance(b, TensorExpr): b = self.binary(b if b.dt.kind != "b" else self.cast(b, dtypes.int32), 1, "or", "|")
        else: b = 3 if dt.kind == "u" else int(self.choice([3, -3, 7, -1, 2]))
        return self.binary(a, b, "floordiv" if sym == "//" else "mod", sym)
      else:
        bb = self.binary(self.unary_named(b if isinstance(b, TensorExpr) else self.leaf(shape, dt), "abs"), 0.5, "add", "+")
        return self.binary(a, bb, "floordiv" if sym == "//" else "mod", sym)
    if sym in ("maximum", "minimum"): return self.binary(a, b, sym[:3], sym)
    ops = {"+": "add", "-": "sub", "*": "mul", "&": "and", "|": "or", "^": "xor"}
    return self.binary(a, b, ops.get(sym, "cmp"), sym, reverse)

  def bool_arith(self, a: TensorExpr, b: Any, sym: str) -> TensorExpr:
    """numpy's bool arithmetic: + and maximum are or, * and minimum are and (the known tensor-bool-arith bug)."""
    bv = b.v if isinstance(b, TensorExpr) else np.array(bool(b))
    v = (a.v | bv) if sym in ("+", "maximum") else (a.v & bv)
    fn = _TENSOR_BINOPS[sym]
    bb = b.build if isinstance(b, TensorExpr) else (lambda env: b)
    bsrc = b.src if isinstance(b, TensorExpr) else repr(b)
    return self.node(f"({a.src} {sym} {bsrc})" if not sym.isalpha() else f"{a.src}.{sym}({bsrc})",
                     lambda env: fn(a.build(env), bb(env)), dtypes.bool, v)

  def scalar(self, dt: DType) -> Any:
    r = self.r()
    if r < 0.45: return float(self.choice([0.5, 2.0, -1.5, 3.0, 0.1, -0.25]))
    if r < 0.9 or dt is dtypes.bool:
      vals = [1, 2, 3, 7, 100] if dt.kind == "u" or dt is dtypes.bool else [1, 2, 3, -2, 7, -5, 100]
      return int(self.choice(vals))
    return bool(self.r() < 0.5)

  def unary_named(self, a: TensorExpr, name: str) -> TensorExpr:
    if name == "abs":
      v = np.abs(a.v) if a.dt.kind in "fi" else a.v
      return self.node(f"{a.src}.abs()", lambda env: a.build(env).abs(), a.dt, v, a.err, a.dc)
    raise ValueError(name)

  def safe_cast(self, a: TensorExpr, to: DType, src: str | None = None) -> TensorExpr:
    """a.cast(to), or to another dtype where that cast would be undefined (a float out of the integer's range, or NaN)."""
    dt = a.dt
    if dt.kind == "f" and to.kind in "iu":
      with np.errstate(all="ignore"): t = np.abs(a.v.astype(np.float64)) + a.err
      if not (np.isfinite(t).all() and (t < min(float(to.max), 2.0 ** 62)).all() and (to.kind != "u" or (a.v.astype(np.float64) - a.err > -1).all())):
        to = dtypes.float32 if dt is not dtypes.float64 else dtypes.float64
    return self.cast(a, to, src)

  def unary(self, a: TensorExpr) -> TensorExpr:
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
    mant = MANTISSA_BITS[fdt]
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

  def where(self, shape: tuple[int, ...], depth: int) -> TensorExpr:
    c = self.expr(self.sub_shape(shape), depth - 1)
    if c.dt is not dtypes.bool:
      c = self.binary(c, 0, "cmp", "!=") if c.dt.kind != "f" or c.exact else self.binary(c, 0.0, "cmp", ">")
    a: Any = self.expr(self.sub_shape(shape), depth - 1) if self.r() < 0.7 else self.scalar(dtypes.float32)
    b: Any = self.expr(shape, depth - 1) if self.r() < 0.8 else self.scalar(dtypes.int32)
    from plugrt.compiler.arith import promote
    tensors = [x.dt for x in (a, b) if isinstance(x, TensorExpr)]
    if not tensors: dt = promote(dtypes.from_py(a), dtypes.from_py(b))
    else:
      dt = tensors[0] if len(tensors) == 1 else promote(*tensors)
      if any(isinstance(x, float) for x in (a, b)) and dt.kind != "f": dt = dtypes.float32
    def val(x: Any) -> TensorExpr:
      if isinstance(x, TensorExpr): return self.cast(x, dt, x.src)
      return TensorExpr(repr(x), lambda env: x, dt, _rnd(np.array(cast_value(x, dt)), dt), np.zeros(()), np.zeros((), bool))
    av, bv = val(a), val(b)
    cond = np.broadcast_to(c.v, np.broadcast_shapes(c.shape, av.shape, bv.shape))
    v = np.where(cond, av.v, bv.v)
    err = np.where(cond, av.err, bv.err) if dt.kind == "f" else None
    dc = np.where(cond, av.dc, bv.dc) | (c.dc & (av.v != bv.v))
    ab, bb = (a.build if isinstance(a, TensorExpr) else (lambda env: a)), (b.build if isinstance(b, TensorExpr) else (lambda env: b))
    src = f"{c.src}.where({a.src if isinstance(a, TensorExpr) else repr(a)}, {b.src if isinstance(b, TensorExpr) else repr(b)})"
    return self.node(src, lambda env: c.build(env).where(ab(env), bb(env)), dt, v, err, dc)

  def reduce(self, shape: tuple[int, ...], depth: int) -> TensorExpr:
    op = self.choice(["sum", "sum", "max", "min", "mean"])
    keep = self.r() < 0.5
    naxes = int(self.rng.integers(1, 3))
    if self.layout.random() < 0.3:  # over all of a large source, reduced in stages (expr broadcasts the 0-d result to shape)
      size = self.layout.integers(1024, 2600) if self.layout.random() < 0.7 else self.layout.integers(16385, 20000)  # 1 or 2 stages
      keep, in_shape, axes = False, (int(size),), [0]
    elif keep:  # the result keeps the reduced dims as 1: grow some of them (or all of them, for axis=None)
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
    all_axes = len(ax) == len(in_shape) and (self.r() < 0.5 or in_shape[-1] >= 1024)
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
      eps = 2.0 ** -MANTISSA_BITS[dt]
      err = np.sum(x.err, axis=ax, keepdims=keep) + n * eps * np.sum(np.abs(xv.astype(np.float64)), axis=ax, keepdims=keep)
      v = _rnd(s64, dt)
      if op == "mean":
        v, err = _rnd(v.astype(np.float64) / n, dt), err / n + K.ulp(dt, s64 / n) * 2
      if dt in (dtypes.float16, dtypes.bfloat16): err = err + 2 * K.ulp(dt, v)
      return self.node(src, build, dt, v, err, dc)

  def matmul(self, shape: tuple[int, ...], depth: int) -> TensorExpr:
    k = int(self.rng.integers(1, 5))
    if len(shape) == 1:  # (n) = (n, k) @ (k) or (k) @ (k, n)
      if self.r() < 0.5: sa, sb = (shape[0], k), (k,)
      else: sa, sb = (k,), (k, shape[0])
    else: sa, sb = shape[:-1] + (k,), (self.sub_shape(shape[:-2]) if self.r() < 0.5 else ()) + (k, shape[-1])
    a, b = self.expr(sa, depth - 1), self.expr(sb, depth - 1)
    from plugrt.compiler.arith import promote
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
        err = np.sum(perr + np.where(perr > 0, K.ulp(dt, p64), 0), axis=-2) + k * 2.0 ** -MANTISSA_BITS[sdt] * np.sum(np.abs(p64), axis=-2)
        if sdt in (dtypes.float16, dtypes.bfloat16): err = err + 2 * K.ulp(sdt, v)
    dc = np.any(np.broadcast_to((x.dc[None, :] if x.v.ndim == 1 else x.dc)[..., :, :, None], prod.shape), axis=-2) | \
      np.any(np.broadcast_to((y.dc[:, None] if y.v.ndim == 1 else y.dc)[..., None, :, :], prod.shape), axis=-2)
    if a.v.ndim == 1: v, dc = v[..., 0, :], dc[..., 0, :]; err = err[..., 0, :] if err is not None else None
    if b.v.ndim == 1: v, dc = v[..., 0], dc[..., 0]; err = err[..., 0] if err is not None else None
    return self.node(f"({a.src} @ {b.src})", lambda env: a.build(env) @ b.build(env), sdt, v, err, dc)

  def view(self, shape: tuple[int, ...], depth: int) -> TensorExpr:
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

  def rebuild(self, a: TensorExpr, src: str, tfn: Callable[[Any], Any], nfn: Callable[[np.ndarray], np.ndarray]) -> TensorExpr:
    return TensorExpr(src, lambda env: tfn(a.build(env)), a.dt, np.array(nfn(a.v)), np.array(nfn(a.err)), np.array(nfn(a.dc)))  # (keeps 0-d)

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
      def run(env: dict[str, Any], base: TensorExpr = base, idx: Any = idx, root: TensorExpr = root) -> Any:
        t = base.build(env)
        t[idx].assign(root.build(env))
        return t
      root = TensorExpr(f"{base.src}[{txt}].assign({root.src}); result: {base.src}", run, base.dt, v, err, dc)
    return TensorCase(self.seed, self.exact_div, self.avoid, root.src, root.build, root.dt, root.v, root.err, root.dc, self.leaves,
                      self.offsets)


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
  offsets: dict[str, int] = field(default_factory=dict)  # leaf -> elements before it in its buffer (unaligned views)

  def leaf(self, name: str, dev: str) -> Any:
    """Leaf `name` as a Tensor on dev: a fresh one, or a view offsets[name] elements into a larger one."""
    from plugrt.frontend.tensor import Tensor
    v, dt = self.leaves[name]
    if not (k := self.offsets.get(name, 0)): return Tensor(v, dt, dev)
    flat = v.reshape(-1)
    return Tensor(np.concatenate([np.repeat(flat[:1], k), flat]), dt, dev)[k:].reshape(v.shape)

  def repro(self) -> str:
    extra = "" if self.avoid == AVOIDABLE else f", avoid={sorted(self.avoid)!r}"
    def made(n: str, v: np.ndarray, dt: DType) -> str:
      if not (k := self.offsets.get(n, 0)): return f"Tensor(np.array({v.tolist()!r}), dtypes.{dt.name})"
      padded = np.concatenate([np.repeat(v.reshape(-1)[:1], k), v.reshape(-1)])
      return f"Tensor(np.array({padded.tolist()!r}), dtypes.{dt.name})[{k}:].reshape{tuple(v.shape)}"
    leaves = "\n".join(f"{n} = {made(n, v, dt)}" for n, (v, dt) in self.leaves.items())
    return (repro_line("tensor", self.seed, f"tensor_case({self.seed}, exact_div={self.exact_div}{extra})", self.avoid) + "\n"
            f"{leaves}\nresult ({self.dtype.name}, shape {tuple(self.want.shape)}) = {self.src}")


def tensor_case(seed: int, exact_div: bool = True, avoid: frozenset[str] = AVOIDABLE) -> TensorCase:
  """A random Tensor expression over random leaves, with numpy's value for it in plugrt's dtypes."""
  return TensorExprGenerator(seed, exact_div, frozenset(avoid)).build()


def run_tensor(seed: int, devs: Sequence[str] | None = None, avoid: frozenset[str] = AVOIDABLE) -> list[Outcome]:
  """One random Tensor expression on every device, against numpy."""
  devs = list(devs) if devs is not None else devices()
  return _run_tensor(seed, devs, avoid)


def _run_tensor(seed: int, devs: list[str], avoid: frozenset[str]) -> list[Outcome]:
  out: list[Outcome] = []
  for dev in devs:
    ed = dev in EXACT_DEVICES
    case = cached_case(("tensor", seed, ed, avoid), lambda ed=ed: tensor_case(seed, ed, avoid))
    try:
      env = {n: case.leaf(n, dev) for n in case.leaves}
      t = case.build(env)
      if t.dtype is not case.dtype or t.shape != tuple(case.want.shape):
        raise AssertionError(f"result is {t.dtype.name} {t.shape}, want {case.dtype.name} {tuple(case.want.shape)}")
      got = t.numpy()
      want = case.want
      if case.dtype is dtypes.bfloat16: got, want = f32_to_bf16(got), f32_to_bf16(want)
      compare_within_error(f"tensor {case.src[:200]}", np.ascontiguousarray(got).reshape(-1), np.ascontiguousarray(want).reshape(-1),
                   case.err.reshape(-1), case.dc.reshape(-1), case.dtype)
      out.append(Outcome("tensor", seed, dev, "ok"))
    except RenderError as e: out.append(Outcome("tensor", seed, dev, "skip", e.message))
    except Exception as e:
      out.append(Outcome("tensor", seed, dev, "fail", str(e) if isinstance(e, AssertionError) else error_text(e), case.repro()))
  return out
