"""Kernels for tests/test_dsl.py (the DSL reads kernels' source, so they live in a file)."""
import math

from plugrt import dtypes, kernel
from plugrt.frontend.dsl import barrier, global_id, group_id, local_id, local_size, num_groups, shared, where

SCALE = 3  # a module constant: folded into the kernel


@kernel
def saxpy(out: dtypes.float32[:], x: dtypes.float32[:], y: dtypes.float32[:], a: dtypes.float32, n: dtypes.int32):
  i = global_id(0)
  if i < n:
    out[i] = a * x[i] + y[i]


@kernel
def python_semantics(out: dtypes.int32[:], fout: dtypes.float32[:], a: dtypes.int32[:], b: dtypes.int32[:]):
  """// and % floor like Python, / is true division, ** with small ints, chained comparisons, and/or/not."""
  i = global_id(0)
  out[i * 6] = a[i] // b[i]
  out[i * 6 + 1] = a[i] % b[i]
  out[i * 6 + 2] = 1 if 0 < a[i] < 5 else 0
  out[i * 6 + 3] = a[i] ** 2 - (a[i] << 1) + (-a[i] >> 1)
  out[i * 6 + 4] = int(not (a[i] > 0 and b[i] > 0) or a[i] == b[i])
  out[i * 6 + 5] = max(a[i], b[i], 3) + min(a[i], -2) + abs(a[i]) * SCALE
  fout[i] = a[i] / b[i]


@kernel
def loops_and_types(out, x, n):
  """Unannotated: typed from the call. acc starts as an int and becomes a float (the widest assignment wins)."""
  i = global_id(0)
  if i < n:
    acc = 0
    for k in range(0, i, 2):
      acc += x[k] * 0.5
    for _k in range(i, 0, -3):
      acc -= 1
    if acc > 1:
      out[i] = acc
    elif acc > -1:
      out[i] = -math.sqrt(abs(x[i])) + math.floor(x[i] / 3)
    else:
      y = math.exp(x[i] / 10)
      out[i] = where(y > 1.5, y, math.log(y + 1)) + math.cos(0.0)


@kernel
def group_reverse(out: dtypes.int32[:], x: dtypes.int32[:]):
  tile = shared(dtypes.int32, 16)
  lid = local_id(0)
  tile[lid] = x[global_id(0)]
  barrier()
  out[group_id(0) * local_size(0) + lid] = tile[local_size(0) - 1 - lid] + num_groups(0) * 1000


@kernel
def casts(out: dtypes.float16[:], i8: dtypes.int8[:], x: dtypes.float32[:]):
  i = global_id(0)
  h = dtypes.float16(x[i])
  small = i8[i] + 100  # int8 arithmetic wraps
  out[i] = h * 2 + dtypes.float16(small) + float(int(x[i]))


@kernel
def floor_div_mod(q, r, qc, rc, a, b):
  """Unannotated: float32 or float64, from the call. With constant operands too (inlined by the C renderers)."""
  i = global_id(0)
  q[i] = a[i] // b[i]
  r[i] = a[i] % b[i]
  qc[i] = a[i] // 0.1
  rc[i] = -1.0 % b[i]
