"""Comparing a device's results with a reference: within a per-element error bound, and tolerant of a device that
flushes subnormals to zero (its inputs' and its results').
"""
from __future__ import annotations

import math

import numpy as np

from plugrt.compiler import samples as K
from plugrt.dtype import DType
from plugrt_testing.fuzz.values import (
  SMALLEST_NORMAL,
  to_storage,
)


def nonfinite(a: np.ndarray, dt: DType) -> np.ndarray:
  """Which elements of a float buffer (bfloat16 as its bits) are infinite or NaN."""
  if dt.kind != "f": return np.zeros(len(a), bool)
  return ~np.isfinite(K.as_float(a, dt))


def subnormal(x: np.ndarray, dt: DType) -> np.ndarray:
  with np.errstate(invalid="ignore"): return (x != 0) & (np.abs(x) < SMALLEST_NORMAL[dt])


def flush_subnormals(case: K.Case) -> tuple[list[np.ndarray], tuple]:
  """The case's input buffers and scalars with every subnormal float replaced by a zero of its sign: what a device
  that flushes subnormals to zero (WGSL allows it; llvmpipe does it) computes with. An input with none is returned
  as it is (the same array), so a caller can tell that nothing changed."""
  sig = case.kernel.signature
  inputs = []
  for a, dt in zip(case.inputs, sig.buffers):
    if dt.kind == "f" and (m := subnormal(K.as_float(a, dt), dt)).any():
      a = a.copy()
      a[m] = to_storage(np.copysign(0.0, K.as_float(a[m], dt)), dt)
    inputs.append(a)
  vals = tuple(math.copysign(0.0, v) if dt.kind == "f" and subnormal(np.float64(v), dt) else v for v, dt in zip(case.vals, sig.scalars))
  return inputs, vals


def flush_tolerant(got: np.ndarray, want: np.ndarray, want_ftz: np.ndarray, dt: DType) -> np.ndarray:
  """Per element, the reference a flush-to-zero device may have followed: `want_ftz` (its inputs' subnormals flushed)
  where the device's value is nearer to it, and 0 where the result is a subnormal that the device flushed."""
  if dt.kind != "f": return np.where((got == want_ftz) & (got != want), want_ftz, want)
  g, w, f = K.as_float(got, dt), K.as_float(want, dt), K.as_float(want_ftz, dt)
  with np.errstate(invalid="ignore"):
    # nearer to it; or it is not finite, where a fast-math device may give any value (log2 of a flushed subnormal)
    use_ftz = (np.abs(g - f) < np.abs(g - w)) | ((g == f) & (g != w)) | (~np.isfinite(f) & np.isfinite(w))
  ref = np.where(use_ftz, want_ftz, want)
  flushed_out = (g == 0) & subnormal(K.as_float(ref, dt), dt)
  return np.where(flushed_out, got, ref)


def compare_within_error(what: str, got: np.ndarray, want: np.ndarray, err: np.ndarray, dc: np.ndarray, dt: DType) -> None:
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
