"""The @kernel DSL: what Python it accepts, its semantics (checked against plain Python), errors that point at
the user's line, launching, and one compile per device and signature. Runs on every available device."""
import math
import textwrap

import dsl_kernels as K
import numpy as np
import pytest
from conftest import float16_or_skip

from plugrt import Buffer, Device, Tensor, dtypes, kernel
from plugrt.frontend.dsl import KernelSyntaxError, global_id


@pytest.fixture(params=Device.available())
def dev(request) -> str: return request.param


def test_saxpy_and_launch_forms(dev):
  x, y = Buffer.from_numpy(np.arange(10, dtype=np.float32), dev), Buffer.from_numpy(np.ones(10, np.float32), dev)
  out = Buffer(dev, 10, dtypes.float32)
  K.saxpy[3, 4](out, x, y, 2.0, 10)  # on the buffers' device
  assert out.numpy().tolist() == [2 * i + 1.0 for i in range(10)]
  K.saxpy[(1, 1, 1), (16, 1, 1), dev](out, x, y, 1, 10)  # explicit device; an int passes for a float32 scalar
  assert out.numpy().tolist() == [i + 1.0 for i in range(10)]
  assert isinstance(K.saxpy[1, 16](out, x, y, 2.0, 10, wait=True), float)
  tx, ty, tout = Tensor(np.arange(10, dtype=np.float32), device=dev), Tensor(np.ones(10, np.float32), device=dev), \
    Tensor(np.zeros(10, np.float32), device=dev)
  K.saxpy[1, 16](tout.contiguous_buffer(), tx, ty, 3.0, 10)  # tensors are accepted too
  assert tout.tolist() == [3 * i + 1.0 for i in range(10)]


def test_python_semantics(dev):
  a = np.array([7, -7, 7, -7, 3, 0, 9], np.int32)
  b = np.array([2, 2, -2, -2, 3, 5, -4], np.int32)
  out, fout = Buffer(dev, 6 * len(a), dtypes.int32), Buffer(dev, len(a), dtypes.float32)
  K.python_semantics[len(a), 1](out, fout, Buffer.from_numpy(a, dev), Buffer.from_numpy(b, dev))
  want = []
  for p, q in zip(a.tolist(), b.tolist()):
    want += [p // q, p % q, 1 if 0 < p < 5 else 0, p ** 2 - (p << 1) + (-p >> 1), int(not (p > 0 and q > 0) or p == q),
             max(p, q, 3) + min(p, -2) + abs(p) * K.SCALE]
  assert out.numpy().tolist() == want
  np.testing.assert_allclose(fout.numpy(), (a / b).astype(np.float32))


def test_loops_types_and_math(dev):
  n = 12
  x = np.linspace(-5, 7, n).astype(np.float32)
  out = Buffer(dev, n, dtypes.float32)
  K.loops_and_types[3, 4](out, Buffer.from_numpy(x, dev), n)
  want = []
  for i in range(n):
    acc = sum(float(x[k]) * 0.5 for k in range(0, i, 2)) - len(range(i, 0, -3))
    if acc > 1: want.append(acc)
    elif acc > -1: want.append(-math.sqrt(abs(x[i])) + math.floor(x[i] / 3))
    else:
      yv = math.exp(x[i] / 10)
      want.append((yv if yv > 1.5 else math.log(yv + 1)) + 1.0)
  np.testing.assert_allclose(out.numpy(), np.array(want, np.float32), rtol=1e-5, atol=1e-5)
  ir = K.loops_and_types.ir(dtypes.float32[:], dtypes.float32[:], dtypes.int32)
  assert any(u.dtype is dtypes.float32 for u in ir.uops if u.op.name == "VAR")  # acc widened to float


def test_a_variable_has_its_widest_type(dev):
  """dsl-infer-narrow: every use of a variable sees the widest type assigned to it anywhere, not the type of the
  assignment that came last in the source (w = v + 1 was an int32; u ** 2 of a bool failed to build)."""
  @kernel
  def widest(out: dtypes.float32[:], x: dtypes.int32[:], a: dtypes.float32[:], c: dtypes.bool[:]):
    i = global_id(0)
    if x[i] < 0:
      v = a[i]
    else:
      v = x[i]
    w = v + 1
    out[i * 2] = w
    u = a[i]
    u = c[i]
    out[i * 2 + 1] = u ** 2 + 0.25

  x, a, c = np.array([-1, 2, -5], np.int32), np.array([2.5, -7.25, 0.5], np.float32), np.array([True, False, True])
  out = Buffer(dev, 6, dtypes.float32)
  widest[1, 3](out, Buffer.from_numpy(x, dev), Buffer.from_numpy(a, dev), Buffer.from_numpy(c, dev))
  assert out.numpy().tolist() == [3.5, 1.25, 3.0, 0.25, 1.5, 1.25]
  assert {u.dtype for u in widest.ir().uops if u.op.name == "VAR"} == {dtypes.int32, dtypes.float32}  # i; u, v, w


def test_an_annotation_declares_the_type(dev):
  """An annotated variable keeps its declared type; wider values assigned to it are converted (truncated)."""
  @kernel
  def declared(out: dtypes.int32[:], a: dtypes.float32[:]):
    i = global_id(0)
    d: dtypes.int32 = 0
    d += a[i]
    d = d * 2 + a[i]
    out[i] = d

  out = Buffer(dev, 2, dtypes.int32)
  declared[1, 2](out, Buffer.from_numpy(np.array([2.75, -1.5], np.float32), dev))
  assert out.numpy().tolist() == [6, -3]  # int(2.75) = 2, int(2 * 2 + 2.75); int(-1.5) = -1, int(-2 - 1.5)


def _same_bits(got: np.ndarray, want: np.ndarray) -> bool:
  """Equal values, zeros with equal signs, NaN where NaN."""
  return bool((((got == want) & (np.signbit(got) == np.signbit(want))) | (np.isnan(got) & np.isnan(want))).all())


#: float // and % operands: Python's answers need an exact remainder (1.0 % 0.1 is 0.09999999999999995, 1.0 // 0.1 is 9.0),
#: both signs, huge quotients, signed zeros, infinities, and zero divisors (numpy: a / b and NaN; Python raises)
FLOORDIV_CASES = [(1.0, 0.1), (-1.0, 0.1), (1.0, -0.1), (-1.0, -0.1), (-91.8053, 1.2513379), (7.5, 2.0), (-7.5, 2.0), (7.5, -2.0),
                  (6.0, 3.0), (-6.0, 3.0), (0.0, -2.0), (-0.0, 2.0), (3e30, 0.7), (-1e-30, 3.0), (5.0, 1e-30), (2.0, float("inf")),
                  (-2.0, float("inf")), (float("inf"), 2.0), (1.0, 0.0), (-1.0, 0.0), (0.0, 0.0), (0.3, 0.1), (1e16, 3.3)]


@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.float64])
def test_float_floordiv_and_mod_are_pythons(dev, dt):
  """float-floordiv: exactly Python's (and numpy's) results, not floor(a / b) with a rounded quotient."""
  if dt is dtypes.float64 and dev in ("WEBGPU", "QCOM"): pytest.skip(f"{dev} has no float64")
  a, b = (np.array(v, dt.numpy) for v in zip(*FLOORDIV_CASES))
  q, r, qc, rc = (Buffer(dev, len(a), dt) for _ in range(4))
  K.floor_div_mod[1, len(a)](q, r, qc, rc, Buffer.from_numpy(a, dev), Buffer.from_numpy(b, dev))
  with np.errstate(all="ignore"):
    want_q, want_r, want_qc, want_rc = np.floor_divide(a, b), np.remainder(a, b), a // dt.numpy.type(0.1), dt.numpy.type(-1.0) % b
  assert _same_bits(q.numpy(), want_q), list(zip(a, b, q.numpy(), want_q))
  assert _same_bits(r.numpy(), want_r), list(zip(a, b, r.numpy(), want_r))
  assert _same_bits(qc.numpy(), want_qc) and _same_bits(rc.numpy(), want_rc)
  if dt is dtypes.float64:
    assert q.numpy()[:2].tolist() == [1.0 // 0.1, -1.0 // 0.1] and r.numpy()[:2].tolist() == [1.0 % 0.1, -1.0 % 0.1]


def test_shared_memory_and_barrier(dev):
  x = np.arange(32, dtype=np.int32)
  out = Buffer(dev, 32, dtypes.int32)
  K.group_reverse[2, 16](out, Buffer.from_numpy(x, dev))
  assert out.numpy().tolist() == [g * 16 + 15 - l + 2000 for g in range(2) for l in range(16)]


def test_casts(dev):
  i8 = np.array([27, 100, -100, 1], np.int8)
  x = np.array([1.7, -2.5, 3.25, 1000.0], np.float32)
  out = Buffer(dev, 4, dtypes.float16)
  with float16_or_skip(): K.casts[4, 1](out, Buffer.from_numpy(i8, dev), Buffer.from_numpy(x, dev))
  small = (i8.astype(np.int32) + 100 + 128) % 256 - 128
  want = (x.astype(np.float16) * np.float16(2)) + small.astype(np.float16) + np.trunc(x).astype(np.float16)
  np.testing.assert_allclose(out.numpy().astype(np.float32), want.astype(np.float32), rtol=2e-3)


def test_one_compile_per_device_and_signature(dev):
  out, x = Buffer(dev, 4, dtypes.float32), Buffer(dev, 4, dtypes.float32)
  K.loops_and_types[1, 4](out, x, 4)
  n = len(K.loops_and_types._programs)
  K.loops_and_types[1, 4](out, x, 3)
  assert len(K.loops_and_types._programs) == n
  K.loops_and_types[1, 4](Buffer(dev, 4, dtypes.float64), Buffer(dev, 4, dtypes.float64), 4) if dev not in ("WEBGPU", "QCOM") else None
  assert len(K.loops_and_types._ir) >= 1


def test_argument_errors():
  out = Buffer("CPU", 4, dtypes.float32)
  with pytest.raises(TypeError, match="takes 5 arguments"): K.saxpy[1, 4](out, out, 1.0, 4)
  with pytest.raises(TypeError, match="must be a buffer"): K.saxpy[1, 4](out, 1.0, out, 1.0, 4)
  with pytest.raises(TypeError, match=r"\[groups, threads\]"): K.saxpy(out, out, out, 1.0, 4)
  with pytest.raises(TypeError): K.saxpy[1](out, out, out, 1.0, 4)


BAD = {
  "while": ("i = global_id(0)\n  while i < 4:\n    out[i] = 1.0", 3, "while loops: not supported"),
  "break": ("for i in range(3):\n    break", 3, "break: not supported"),
  "call": ("out[0] = print(1)", 2, "cannot call 'print'"),
  "2d index": ("out[0, 1] = 1.0", 2, "buffers are 1-D"),
  "float index": ("out[1.5] = 1.0", 2, "an index must be an integer"),
  "string": ("out[0] = 'a'", 2, "str constants are not supported"),
  "unbound": ("out[0] = y\n  y = 1.0", 2, "used before it is assigned"),
  "return value": ("return 1", 2, "returns nothing"),
  "assign param": ("out = 1.0", 2, "cannot assign to out"),
  "redeclared": ("x: dtypes.int32 = 0\n  x: dtypes.float32 = 1.0", 3, "x is declared as both int32 and float32"),
  "range step": ("for i in range(0, 4, global_id(0)):\n    pass", 2, "step must be a nonzero integer constant"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_errors_point_at_the_line(name, tmp_path, monkeypatch):
  body, line, message = BAD[name]
  src = textwrap.dedent("""\
    from plugrt import dtypes, kernel
    from plugrt.frontend.dsl import global_id, shared


    @kernel
    def bad(out: dtypes.float32[:]):
      {body}
    """).replace("{body}", body)
  path = tmp_path / f"bad_{abs(hash(name))}.py"
  path.write_text(src)
  monkeypatch.syspath_prepend(str(tmp_path))
  with pytest.raises(KernelSyntaxError) as e:
    __import__(path.stem)
  assert e.value.filename == str(path) and e.value.lineno == 5 + line, (e.value.lineno, str(e.value))
  assert message in str(e.value) and e.value.text is not None


def test_shared_inside_a_block_is_refused(tmp_path, monkeypatch):
  path = tmp_path / "bad_shared.py"
  path.write_text("from plugrt import dtypes, kernel\nfrom plugrt.frontend.dsl import global_id, shared\n\n@kernel\ndef k(out: dtypes.float32[:]):\n"
                  "  if global_id(0) < 2:\n    s = shared(dtypes.float32, 4)\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  with pytest.raises(KernelSyntaxError, match="top level") as e: __import__("bad_shared")
  assert e.value.lineno == 7


def test_source_must_be_available():
  with pytest.raises(KernelSyntaxError, match="source is not available"):
    exec("from plugrt import kernel\n@kernel\ndef k(out):\n  pass\n", {})  # no file behind it


def test_unannotated_kernel_needs_types():
  with pytest.raises(TypeError, match="not known until it is called"): K.loops_and_types.ir()
  with pytest.raises(RuntimeError, match="only meaningful inside"):
    from plugrt.frontend.dsl import global_id
    global_id(0)
  assert kernel(K.saxpy.fn).ir().name == "saxpy"
