"""Python's and numpy's arithmetic on IR values, shared by the @kernel DSL and Tensor: the promotion of two dtypes,
floor division and remainder (the IR's IDIV/MOD truncate, like C), C's exact fmod, and math functions the IR has no op
for (exp, log, cos, tan, floor, ceil, abs), built from those it has. Neither front end owns these rules: both must
give the same answers, so they live below both.
"""
from __future__ import annotations

import math
import struct

from plugrt.compiler.ir import Ops, Val
from plugrt.dtype import DType, dtypes

#: narrowest to widest: promote() picks the later of two (float16 with bfloat16 meets at float32), roughly numpy's lattice
PROMOTION_ORDER = [dtypes.bool, dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32, dtypes.int64,
                   dtypes.uint64, dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64]


def promote(a: DType, b: DType) -> DType:
  """The dtype two operands meet in: the wider of the two (PROMOTION_ORDER), float16 with bfloat16 at float32."""
  if a is b: return a
  if {a, b} == {dtypes.float16, dtypes.bfloat16}: return dtypes.float32
  return a if PROMOTION_ORDER.index(a) > PROMOTION_ORDER.index(b) else b


def ir_floordiv(a: Val, b: Val) -> tuple[Val, Val]:
  """Python's a // b and a % b on IR values: round toward minus infinity, remainder with the divisor's sign.
  Floats follow Python's float divmod (and numpy's floor_divide/remainder): the remainder is exact, the quotient
  (a - remainder) / b rounded to an integer; a zero divisor gives a / b and NaN, as numpy (Python raises)."""
  if a.dtype.kind == "f":
    if a.dtype not in _FLOAT_BITS:  # float16, bfloat16: in float32 (exact for the remainder), then rounded, as numpy does
      q, r = ir_floordiv(a.cast(dtypes.float32), b.cast(dtypes.float32))
      return q.cast(a.dtype), r.cast(a.dtype)
    sign = 1 << (a.dtype.bits - 1)
    def zero_as(x: Val) -> Val: return (_bits(x) & sign).bitcast(x.dtype)  # copysign(0, x)
    mod, ab = ir_fmod(a, b), a / b
    div = (a - mod) / b  # an integer but for rounding
    zero = mod.eq(0.0)  # (eq, not ne: a NaN stays out of the zero branch even where a compiler folds x != x)
    fix = ~zero & (b < 0).ne(mod < 0)  # fmod has a's sign: move it to b's
    mod, div = zero.where(zero_as(b), fix.where(mod + b, mod)), fix.where(div - 1.0, div)
    q = ir_math(div, "floor")
    q = div.eq(0.0).where(zero_as(ab), (div - q > 0.5).where(q + 1.0, q))  # the nearest integer to div
    return b.eq(0.0).where(ab, q), mod
  q, r = a // b, a % b  # the IR truncates, like C
  if a.dtype.kind == "u": return q, r
  fix = r.ne(0) & ((r < 0).ne(b < 0))
  return fix.where(q - 1, q), fix.where(r + b, r)


# the float types with IEEE arithmetic of their own: (the unsigned integer of their size, significand bits with the implicit 1)
_FLOAT_BITS = {dtypes.float32: (dtypes.uint32, 24), dtypes.float64: (dtypes.uint64, 53)}


def _bits(x: Val) -> Val:
  """A float32/float64 value's bits as the unsigned integer of its size; a constant's are folded here (the C renderers
  inline constants, and a BITCAST of one would take the address of a literal)."""
  U = _FLOAT_BITS[x.dtype][0]
  if x.u.op is not Ops.CONST: return x.bitcast(U)
  return x.b.const(struct.unpack(f"<{U.fmt}", struct.pack(f"<{x.dtype.fmt}", x.u.arg))[0], U)


def ir_fmod(a: Val, b: Val) -> Val:
  """C's fmod(a, b) of float32/float64 values, exactly (as IEEE's is; a - trunc(a / b) * b rounds twice). Binary long
  division of the significands, one quotient bit per step, as many steps as the exponents differ: every step
  subtracts numbers within a factor of two of each other, so it is exact. NaN for b = 0, an infinite a or a NaN."""
  bld, F = a.b, a.dtype
  U, p = _FLOAT_BITS[F]
  sign, inf, one = 1 << (U.bits - 1), ((1 << (U.bits - p)) - 1) << (p - 1), ((1 << (U.bits - p - 1)) - 1) << (p - 1)

  def split(bits: Val) -> tuple[Val, Val, Val, Val]:
    """|x|'s bits -> its significand in [1, 2), exponent, whether it is subnormal, its bits (a subnormal's scaled by 2^p)."""
    sub = bits < (1 << (p - 1))
    bits = sub.where(bits.bitcast(F) * float(2 ** p), bits.bitcast(F)).bitcast(U)
    return ((bits & ((1 << (p - 1)) - 1)) | one).bitcast(F), (bits >> (p - 1)).cast(dtypes.int32) - sub.where(p, 0), sub, bits

  xa, ya = _bits(a) & (sign - 1), _bits(b) & (sign - 1)  # |a|, |b| as bits: ordered as the values are (NaN aside)
  (mx, ex, _, _), (my, ey, ysub, yb) = split(xa), split(ya)
  r = bld.var((mx >= my).where(mx - my, mx), name="fmod")
  with bld.range(0, (ex - ey).max(0)):
    t = r.value * 2.0
    r.value = (t >= my).where(t - my, t)
  m = r.value * (yb & inf).bitcast(F)  # scaled back by b's exponent: exact, the result is representable
  m = (xa < ya).where(xa.bitcast(F), ysub.where(m * float(2.0 ** -p), m))  # |a| < |b|: a itself (also for an infinite b)
  m = (m.bitcast(U) | (_bits(a) & sign)).bitcast(F)  # a's sign
  return ((xa >= inf) | (ya > inf) | ya.eq(0)).where(float("nan"), m)  # integer tests: NaN-proof where compilers fold x != x


def ir_math(x: Val, name: str) -> Val:
  """A math function of an IR value: sqrt exp2 log2 sin recip trunc exp log cos tan floor ceil abs.
  Integers are converted to the default float first (abs keeps them)."""
  b = x.b
  if name == "abs":
    if x.dtype.kind == "u" or x.dtype is dtypes.bool: return x
    return (x < 0).where(-x, x)
  if x.dtype.kind != "f": x = x.cast(dtypes.default_float)
  if name in ("sqrt", "exp2", "log2", "sin", "recip", "trunc"): return getattr(x, name)()
  if name == "exp": return (x * b.const(1 / math.log(2), x.dtype)).exp2()
  if name == "log": return x.log2() * b.const(math.log(2), x.dtype)
  if name == "cos": return (x + b.const(math.pi / 2, x.dtype)).sin()
  if name == "tan": return ir_math(x, "sin") / ir_math(x, "cos")
  t = x.trunc()
  if name == "floor": return (t > x).where(t - 1, t)
  if name == "ceil": return (t < x).where(t + 1, t)
  raise ValueError(f"no math function {name!r}")
