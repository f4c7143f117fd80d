"""IR values under Python's operators, and what the builder takes (issue 32, items 1, 6 and 12).

`==` and `!=` on IR values build comparisons, as `<` and `<=` do: a Python bool standing for an IR comparison compiled a
constant (`x[i] * (i != n)` was `x[i] * 1`). Everything else Python would decide by itself while the kernel is built
(truth, `and`/`or`/`not`, chained comparisons, `in`, int()) is a TypeError that says what to write instead. Kernel and
parameter names are checked when the builder gets them (a 10,000-character name aborted PoCL), and dtypes are plugrt
dtypes, their names, numpy or torch dtypes, or a TypeError naming those forms.
"""
from __future__ import annotations

import numpy as np
import pytest

from plugrt import Buffer, Device, KernelBuilder, dtypes, kernel
from plugrt.compiler.ir import MAX_NAME_LENGTH, Ops
from plugrt.errors import IRError
from plugrt.frontend.dsl import global_id
from plugrt_testing.fuzz import ir_targets

TARGETS = [str(t) for t in ir_targets()]
N = 37


def run(target: str, k, *arrays: np.ndarray, vals: tuple = (), n: int = N) -> list[np.ndarray]:
  name, _, compiler = target.partition(":")
  dev = Device[name]
  prg = dev.program(k, compiler or None)
  bufs = [Buffer.from_numpy(a, dev) for a in arrays]
  prg(*bufs, global_size=((n + 7) // 8, 1, 1), local_size=(8, 1, 1), vals=vals, wait=True)
  return [b.numpy() for b in bufs]


@pytest.mark.parametrize("target", TARGETS)
def test_eq_and_ne_compile_comparisons(target: str) -> None:
  b = KernelBuilder("eq_ne")
  o1, o2, o3, x = (b.buffer(s, dtypes.float32) for s in ("o1", "o2", "o3", "x"))
  n, k = b.scalar("n", dtypes.int32), b.scalar("k", dtypes.int32)
  i = b.global_id(0)
  with b.if_(i < n):
    o1[i] = x[i] * (i != k).cast(dtypes.float32)
    o2[i] = (i == k).where(x[i], 0.0)
    o3[i] = 0.0
    with b.if_(i == k):  # used to be a raw AttributeError (a Python bool has no .u)
      o3[i] = 1.0
  kern = b.finish()
  assert {u.op for u in kern.uops} >= {Ops.CMPEQ, Ops.CMPNE}
  xs = np.arange(1, N + 1, dtype=np.float32)
  zeros = [np.zeros(N, np.float32) for _ in range(3)]
  o1, o2, o3, _ = run(target, kern, *zeros, xs, vals=(N, 5))
  want1 = xs.copy(); want1[5] = 0
  np.testing.assert_array_equal(o1, want1)
  np.testing.assert_array_equal(o2, np.where(np.arange(N) == 5, xs, 0))
  np.testing.assert_array_equal(o3, (np.arange(N) == 5).astype(np.float32))


def test_eq_with_a_constant_on_either_side() -> None:
  b = KernelBuilder("k")
  i = b.global_id(0)
  for v in (i == 3, 3 == i, i != 3, 3 != i, i.eq(3), i.ne(3)):
    assert type(v).__name__ == "Val" and v.dtype is dtypes.bool and v.u.op in (Ops.CMPEQ, Ops.CMPNE)


def test_dsl_eq_and_ne() -> None:
  @kernel
  def masked(o: dtypes.float32[:], x: dtypes.float32[:], n: dtypes.int32, k: dtypes.int32):
    i = global_id(0)
    if i < n:
      o[i] = x[i] * (i != k) + (i == k) * 100.0

  xs = np.arange(N, dtype=np.float32)
  o, xb = Buffer.from_numpy(np.zeros(N, np.float32), "PYTHON"), Buffer.from_numpy(xs, "PYTHON")
  masked[(N + 7) // 8, 8](o, xb, N, 4)
  want = xs.copy(); want[4] = 100
  np.testing.assert_array_equal(o.numpy(), want)


def test_python_decisions_on_ir_values_are_refused() -> None:
  b = KernelBuilder("k")
  x = b.buffer("x", dtypes.float32)
  i, n = b.global_id(0), b.scalar("n", dtypes.int32)
  acc = b.var(0.0)
  with pytest.raises(TypeError, match="truth value"): bool(i < n)
  with pytest.raises(TypeError, match="chained"): 0 <= i < n  # noqa: B015
  with pytest.raises(TypeError, match="truth value"): _ = (i < n) and (i > 0)
  with pytest.raises(TypeError, match="truth value"): _ = not (i < n)
  with pytest.raises(TypeError, match="truth value"):
    if i == n: pass
  with pytest.raises(TypeError): i in [n]  # noqa: B015
  with pytest.raises(TypeError, match="x in buffer"): 3 in x  # noqa: B015
  with pytest.raises(TypeError, match="iterated"): list(x)
  with pytest.raises(TypeError, match="not a sequence"): list(i)
  with pytest.raises(TypeError, match="not a Python number"): range(i)
  with pytest.raises(TypeError, match="not a Python number"): int(i)
  with pytest.raises(TypeError, match="not a value"): x == 3  # noqa: B015
  with pytest.raises(TypeError, match="value"): acc == 0.0  # noqa: B015
  with pytest.raises(TypeError, match="value"): acc != 0.0  # noqa: B015
  assert x == x and acc == acc and not (x != x)  # a buffer and a variable are themselves
  assert {i: 1}[i] == 1 and len({i, n, x, acc}) == 4  # identity hashing: the builder's dicts key on values


def test_if_takes_an_ir_bool_only() -> None:
  b = KernelBuilder("k")
  i = b.global_id(0)
  for cond in (True, False, 1, None):
    with pytest.raises(IRError, match="if_"), b.if_(cond): pass
  with pytest.raises(IRError, match="bool"), b.if_(i): pass
  with pytest.raises(IRError, match="operand"): b.emit(Ops.NEG, dtypes.int32, (3,))


def test_kernel_names_are_checked_at_the_builder() -> None:
  for bad in ("k" * 10_000, "k" * (MAX_NAME_LENGTH + 1), "9lives", "größe", "with space", "", "class", None, 3):
    with pytest.raises(IRError, match="kernel name"): KernelBuilder(bad)  # type: ignore[arg-type]
  b = KernelBuilder("k")
  for bad in ("p" * 10_000, "a-b", ""):
    with pytest.raises(IRError): b.buffer(bad, dtypes.float32)
    with pytest.raises(IRError): b.scalar(bad, dtypes.int32)


@pytest.mark.parametrize("target", TARGETS)
def test_the_longest_kernel_name_runs_everywhere(target: str) -> None:
  b = KernelBuilder("k" * MAX_NAME_LENGTH)
  o = b.buffer("p" * MAX_NAME_LENGTH, dtypes.float32)
  i = b.global_id(0)
  with b.if_(i < N):
    o[i] = i.cast(dtypes.float32)
  (out,) = run(target, b.finish(), np.zeros(N, np.float32))
  np.testing.assert_array_equal(out, np.arange(N, dtype=np.float32))


@pytest.mark.parametrize("spelling", ["float32", np.float32, np.dtype("float32"), dtypes.float32])
def test_dtype_spellings_are_accepted(spelling) -> None:
  b = KernelBuilder("k")
  assert b.buffer("x", spelling).dtype is dtypes.float32
  assert b.scalar("a", spelling).dtype is dtypes.float32
  assert b.shared("s", spelling, 4).dtype is dtypes.float32
  assert b.const(1.0, spelling).dtype is dtypes.float32
  assert Buffer("PYTHON", 4, spelling).dtype is dtypes.float32


@pytest.mark.parametrize("bad", [None, 3, object(), "floaty", np.complex64])
def test_bad_dtypes_are_typed_errors(bad) -> None:
  b = KernelBuilder("k")
  makers = [lambda: b.buffer("x", bad), lambda: b.scalar("a", bad), lambda: b.shared("s", bad, 4), lambda: Buffer("PYTHON", 4, bad)]
  if bad is not None: makers.append(lambda: b.const(1, bad))  # (const's None: the constant's own type)
  for make in makers:
    with pytest.raises((TypeError, ValueError)) as e: make()
    assert "dtype" in str(e.value) and not isinstance(e.value, AttributeError)
