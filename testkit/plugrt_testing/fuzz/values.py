"""Input values for fuzz cases: random values of each dtype with edge values (limits, powers of two, rounding midpoints,
subnormals, infinities, NaN) mixed in, and the float facts (significand bits, largest values) the generators need.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from plugrt.compiler import samples as K
from plugrt.dtype import DType, bf16_to_f32, cast_value, dtypes, f32_to_bf16

MANTISSA_BITS = {dtypes.float16: 10, dtypes.bfloat16: 7, dtypes.float32: 23, dtypes.float64: 52}
MAX_EXPONENT = {dtypes.float16: 15, dtypes.bfloat16: 127, dtypes.float32: 127, dtypes.float64: 1023}


def float_max(dt: DType) -> float:
  return {dtypes.float16: 65504.0, dtypes.bfloat16: float(bf16_to_f32(np.uint16(0x7F7F))), dtypes.float32: float(np.finfo(np.float32).max),
          dtypes.float64: float(np.finfo(np.float64).max)}[dt]


def int_edges(dt: DType) -> list[int]:
  """Integers where implementations tend to differ: limits, powers of two and their neighbours, and values just
  past a float rounding midpoint (a conversion that rounds twice gets those wrong)."""
  lo, hi, bits = int(dt.min), int(dt.max), dt.bits
  cand = [0, 1, 2, 3, 7, hi, hi - 1, lo, lo + 1, -1, -2, -3, -7]
  for k in range(1, bits): cand += [1 << k, (1 << k) - 1, (1 << k) + 1, -(1 << k)]
  for k in (25, 31, 53, 54, 60, 62):
    for m in (8, 11, 24): cand += [(1 << k) + (1 << (k - m)) + 1, -((1 << k) + (1 << (k - m)) + 1), (1 << k) + (1 << (k - m)) - 1]
  return sorted({c for c in cand if lo <= c <= hi})


#: the smallest normal value of each float dtype: below it (and above 0) values are subnormal
SMALLEST_NORMAL = {dtypes.float16: 2.0 ** -14, dtypes.bfloat16: 2.0 ** -126, dtypes.float32: 2.0 ** -126, dtypes.float64: 2.0 ** -1022}


def float_edges(dt: DType, nan: bool, inf: bool) -> list[float]:
  mant, fmax = MANTISSA_BITS[dt], float_max(dt)
  tiny = SMALLEST_NORMAL[dt]
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


def to_storage(x: np.ndarray, dt: DType) -> np.ndarray:
  if dt is dtypes.bfloat16: return f32_to_bf16(np.asarray(x, np.float64).astype(np.float32))
  with np.errstate(all="ignore"): return np.asarray(x).astype(dt.numpy)


def fuzz_values(dt: DType, n: int, rng: np.random.Generator, special: float = 0.3, nan: bool = False, inf: bool = False) -> np.ndarray:
  """n values of dt (storage form): kernels.values' random ones, a fraction replaced by edge values."""
  x = K.values(dt, n, rng)
  if dt is dtypes.bool: return x
  pick = rng.random(n) < special
  if not pick.any(): return x
  if dt.kind in "iu":
    x[pick] = np.array(rng.choice(np.array(int_edges(dt), dtype=object), int(pick.sum())), dtype=object).astype(dt.numpy)
  else:
    x[pick] = to_storage(rng.choice(np.array(float_edges(dt, nan, inf)), int(pick.sum())), dt)
  return x


def scalar_value(dt: DType, rng: np.random.Generator) -> Any:
  if dt is dtypes.bool: return bool(rng.random() < 0.5)
  if dt.kind in "iu": return int(rng.choice(np.array(int_edges(dt), dtype=object))) if rng.random() < 0.5 else int(K.values(dt, 8, rng)[7])
  edges = float_edges(dt, nan=rng.random() < 0.15, inf=rng.random() < 0.2)
  return float(rng.choice(edges)) if rng.random() < 0.5 else float(K.as_float(K.values(dt, 1, rng), dt)[0])


def float_below(limit: int, dt: DType) -> float:
  """The largest value of float dtype dt that is <= limit (an int > 0, compared exactly: float(2**63 - 1) is 2**63)."""
  if limit >= float_max(dt): return float_max(dt)
  if dt is dtypes.bfloat16:
    raw = int(f32_to_bf16(np.float32(limit)))
    while float(bf16_to_f32(np.uint16(raw))) > limit: raw -= 1
    return float(bf16_to_f32(np.uint16(raw)))
  v = np.array(float(limit)).astype(dt.numpy)
  while float(v) > limit: v = np.nextafter(v, dt.numpy.type(0))
  return float(v)
