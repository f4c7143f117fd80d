"""Tensor: creation, elementwise ops with broadcasting and promotion, fusion, reductions, matmul, views; on every device."""
import types

import numpy as np
import pytest
from conftest import float16_or_skip

from plugrt import Device, Tensor, dtypes
from plugrt.frontend import tensor as T


def devices() -> list[str]:
  return Device.available()


@pytest.fixture(params=devices())
def dev(request) -> str: return request.param


def close(got, want, dtype=np.float32):
  want = np.asarray(want)
  if np.issubdtype(want.dtype, np.floating):
    np.testing.assert_allclose(got, want.astype(dtype) if dtype else want, rtol=2e-6 if dtype != np.float16 else 2e-3, atol=1e-6)
  else:
    np.testing.assert_array_equal(got, want)


def test_creation(dev):
  assert Tensor([1, 2, 3], device=dev).dtype is dtypes.int32
  assert Tensor([1.5, 2], device=dev).dtype is dtypes.float32 and Tensor([True, False], device=dev).dtype is dtypes.bool
  assert Tensor(np.zeros((2, 3), np.int16), device=dev).shape == (2, 3)
  assert Tensor([[1, 2], [3, 4]], device=dev).tolist() == [[1, 2], [3, 4]]
  assert Tensor(b"\x01\x00\x02\x00", dtypes.int16, dev).tolist() == [1, 2]
  assert Tensor.zeros((2, 2), device=dev).tolist() == [[0, 0], [0, 0]] and Tensor.ones(3, dtypes.int8, dev).tolist() == [1, 1, 1]
  assert Tensor.full((2,), 7.5, device=dev).tolist() == [7.5, 7.5]
  assert Tensor.arange(5, device=dev).tolist() == [0, 1, 2, 3, 4] and Tensor.arange(1, 2, 0.5, device=dev).tolist() == [1.0, 1.5]
  Tensor.manual_seed(3)
  r = Tensor.rand(4, 5, device=dev).numpy()
  assert r.shape == (4, 5) and ((r >= 0) & (r < 1)).all()
  Tensor.manual_seed(3)
  assert (Tensor.rand(4, 5, device=dev).numpy() == r).all()
  assert Tensor(3.0, device=dev).item() == 3.0 and Tensor(3.0, device=dev).shape == ()
  with pytest.raises(ValueError): Tensor(b"\x01\x02\x03", dtypes.int16, dev)


def test_elementwise_matches_numpy(dev):
  a = np.array([[1.5, -2.0, 3.25], [0.5, 4.0, -1.0]], np.float32)
  b = np.array([2.0, -3.0, 0.5], np.float32)
  ta, tb = Tensor(a, device=dev), Tensor(b, device=dev)
  close((ta + tb).numpy(), a + b)
  close((ta * tb - 1).numpy(), a * b - 1)
  close((ta / tb).numpy(), a / b)
  close((2 - ta).numpy(), 2 - a)
  close((ta // tb).numpy(), a // b)
  close((ta % tb).numpy(), np.mod(a, b))
  close((-ta).abs().numpy(), np.abs(a))
  close(ta.abs().sqrt().numpy(), np.sqrt(np.abs(a)))
  close(ta.exp().numpy(), np.exp(a))
  close(ta.abs().log().numpy(), np.log(np.abs(a)))
  close(ta.sin().numpy(), np.sin(a)); close(ta.cos().numpy(), np.cos(a))
  close(ta.maximum(tb).numpy(), np.maximum(a, b)); close(ta.minimum(1).numpy(), np.minimum(a, 1))
  close((ta ** 2).numpy(), a ** 2); close(ta.relu().numpy(), np.maximum(a, 0))
  close((ta > tb).numpy(), a > b); close((ta == 3.25).numpy(), a == 3.25); close((ta <= 0.5).numpy(), a <= 0.5)
  close((ta > 0).where(ta, tb).numpy(), np.where(a > 0, a, b))
  close((ta > 0).where(1.0, 0).numpy(), np.where(a > 0, 1.0, 0.0))
  close(ta.floor().numpy(), np.floor(a)); close(ta.ceil().numpy(), np.ceil(a))


def test_integer_semantics(dev):
  a = np.array([7, -7, 7, -7, 2**31 - 1], np.int32)
  b = np.array([2, 2, -2, -2, 1], np.int32)
  ta, tb = Tensor(a, device=dev), Tensor(b, device=dev)
  close((ta // tb).numpy(), a // b); close((ta % tb).numpy(), a % b)   # floor, like numpy
  close((ta + 1).numpy(), a + np.int32(1))                              # wraps at int32
  assert (ta / tb).dtype is dtypes.float32
  close((ta & 6).numpy(), a & 6); close((ta ^ tb).numpy(), a ^ b)
  u = Tensor(np.array([250, 3], np.uint8), device=dev)
  assert (u + 10).tolist() == [4, 13] and (u + 10).dtype is dtypes.uint8


def _same_bits(got: np.ndarray, want: np.ndarray) -> bool:
  """Equal values, zeros with equal signs, NaN where NaN."""
  return bool((((got == want) & (np.signbit(got) == np.signbit(want))) | (np.isnan(got) & np.isnan(want))).all())


@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.float64, dtypes.float16])
def test_float_floordiv_and_mod_match_numpy(dev, dt):
  """float-floordiv: numpy's floor_divide and remainder exactly (an exact remainder, the quotient rounded from it),
  with both signs, huge quotients, signed zeros, infinities, NaN and zero divisors (a / b and NaN, as numpy)."""
  if dt is dtypes.float64 and dev in ("WEBGPU", "QCOM"): pytest.skip(f"{dev} has no float64")
  rng = np.random.default_rng(5)
  special = [0.0, -0.0, 0.1, -0.1, 1.0, -1.0, 2.5, -7.0, 1e4, -3e-3, np.inf, -np.inf, np.nan]
  x, y = (np.array(v) for v in zip(*[(p, q) for p in special for q in special]))
  a = np.concatenate([x, [1.0, -91.8053, 60000.0], rng.standard_normal(200) * 10.0 ** rng.uniform(-2, 4, 200)]).astype(dt.numpy)
  b = np.concatenate([y, [0.1, 1.2513379, 1e-3], rng.standard_normal(200) * 10.0 ** rng.uniform(-2, 2, 200)]).astype(dt.numpy)
  ta, tb = Tensor(a, device=dev), Tensor(b, device=dev)
  with float16_or_skip(): q, r = (ta // tb).numpy(), (ta % tb).numpy()
  with np.errstate(all="ignore"):
    want_q, want_r, want_c = np.floor_divide(a, b), np.remainder(a, b), np.remainder(a, dt.numpy.type(0.1))
  assert q.dtype == r.dtype == dt.numpy
  assert _same_bits(q, want_q), [(p, s, g, w) for p, s, g, w in zip(a, b, q, want_q) if not _same_bits(g, w)][:5]
  assert _same_bits(r, want_r), [(p, s, g, w) for p, s, g, w in zip(a, b, r, want_r) if not _same_bits(g, w)][:5]
  assert _same_bits((ta % 0.1).numpy(), want_c)  # a Python number as the divisor


def test_bool_arithmetic_is_logic(dev):
  """tensor-bool-arith: as numpy, + and maximum of bools are or, * and minimum and, max() any and min() all, all bool;
  // and % give int8; - is refused with a TypeError naming the fix."""
  a, b = np.array([True, False, True, False]), np.array([True, True, False, False])
  ta, tb = Tensor(a, device=dev), Tensor(b, device=dev)
  for got, want in ((ta + tb, a + b), (ta * tb, a * b), (ta.maximum(tb), np.maximum(a, b)), (ta.minimum(tb), np.minimum(a, b)),
                    (ta + True, a + True), (ta * True, a * True), ((ta + tb) * ~tb, (a + b) * ~b)):
    assert want.dtype == np.bool_ and got.dtype is dtypes.bool and got.tolist() == want.tolist(), (got, want)
  m = np.array([[True, False, False], [False, False, False]])
  tm = Tensor(m, device=dev)
  assert tm.max().item() is True and tm.min().item() is False and tm.max().dtype is tm.min().dtype is dtypes.bool
  assert tm.max(axis=1).tolist() == m.max(axis=1).tolist() and (~tm).min(axis=0).tolist() == (~m).min(axis=0).tolist()
  ones = Tensor([True] * 4, device=dev)
  assert (ta // ones).dtype is (ta % ones).dtype is dtypes.int8 and (ta // ones).tolist() == [1, 0, 1, 0] and (ta % ones).tolist() == [0] * 4
  assert (ta ** 2).tolist() == [1, 0, 1, 0] and (ta + 1).tolist() == [2, 1, 2, 1] and ta.relu().tolist() == [1, 0, 1, 0]  # with ints: numbers
  with pytest.raises(TypeError, match=r"\^"): ta - tb
  with pytest.raises(TypeError, match="subtract"): True - ta


def test_promotion(dev):
  i, f = Tensor([1, 2], device=dev), Tensor([0.5, 1.5], device=dev)
  assert (i + f).dtype is dtypes.float32 and (i + 1.5).dtype is dtypes.float32 and (i + 1).dtype is dtypes.int32
  h = Tensor(np.array([1, 2], np.float16), device=dev)
  assert (h + 1.5).dtype is dtypes.float16 and (h + f).dtype is dtypes.float32
  assert (Tensor([True, False], device=dev) + 1).tolist() == [2, 1]
  assert i.cast(dtypes.float16).dtype is dtypes.float16 and Tensor([1.7, -1.7], device=dev).cast(dtypes.int32).tolist() == [1, -1]


def test_chains_fuse_into_one_kernel(dev):
  a, b = Tensor(np.arange(6, dtype=np.float32), device=dev), Tensor(np.ones(6, np.float32), device=dev)
  before = T.stats["kernels_run"]
  out = ((a + b) * 2 + a.exp() / (b + 1)).sqrt()
  assert T.stats["kernels_run"] == before  # lazy until realised
  got = out.numpy()
  assert T.stats["kernels_run"] == before + 1  # the whole chain in one kernel
  an = np.arange(6, dtype=np.float32)
  close(got, np.sqrt((an + 1) * 2 + np.exp(an) / 2))


def test_same_structure_reuses_the_kernel(dev):
  t = Tensor(np.arange(4, dtype=np.float32), device=dev)
  (t + 1).realize()
  n = len(T._KERNELS)
  assert (t + 2).tolist() == [2, 3, 4, 5] and (t[1:] + 7).tolist() == [8, 9, 10]
  assert len(T._KERNELS) <= n + 1  # t + 2 shares t + 1's kernel; the slice has other strides


def test_reductions_over_different_extents_get_their_own_kernels(dev):
  """The fuzzer's tensor-reduce-kernel-key (tensor 5089, then 5582 in the same process): a reduction's kernel was
  cached under its output shape and its source's strides, so a sum over 4 elements reused the one over 3."""
  for n in (3, 4, 5, 3):
    x = np.arange(1, n + 1, dtype=np.float32)
    assert Tensor(x, device=dev).sum(axis=0, keepdim=True).numpy().tolist() == [x.sum()]
    assert Tensor(x, device=dev).max().numpy().tolist() == float(n)


def test_reductions_of_constants_over_different_extents_get_their_own_kernels(dev):
  """A reduction of a constant (Tensor.full) loops over the constant's extent, so that extent is part of its kernel:
  the sum of four ones reused the kernel of the sum of three, and gave 3."""
  for n in (3, 4, 7, 3):
    assert Tensor.full(n, 1.0, dtypes.float32, dev).sum().item() == n
    assert Tensor.full((2, n), 2, dtypes.int32, dev).sum(axis=1).tolist() == [2 * n, 2 * n]

def test_reductions(dev):
  a = np.arange(24, dtype=np.float32).reshape(2, 3, 4) - 7
  t = Tensor(a, device=dev)
  close(t.sum().numpy(), a.sum()); close(t.sum(axis=1).numpy(), a.sum(axis=1)); close(t.sum(axis=(0, 2)).numpy(), a.sum(axis=(0, 2)))
  close(t.max(axis=-1).numpy(), a.max(axis=-1)); close(t.min(axis=0).numpy(), a.min(axis=0))
  close(t.mean(axis=2, keepdim=True).numpy(), a.mean(axis=2, keepdims=True))
  close((t - t.max(axis=2, keepdim=True)).exp().sum(axis=2).numpy(), np.exp(a - a.max(axis=2, keepdims=True)).sum(axis=2))  # softmax-like
  i = Tensor(np.array([[1, 2], [3, 4]], np.int8), device=dev)
  assert i.sum().item() == 10 and i.sum().dtype is dtypes.int32 and i.max().item() == 4
  assert Tensor([True, True, False], device=dev).sum().item() == 2
  with pytest.raises(ValueError): t.sum(axis=3)


def test_matmul(dev):
  rng = np.random.default_rng(0)
  a, b = rng.standard_normal((5, 7)).astype(np.float32), rng.standard_normal((7, 3)).astype(np.float32)
  ta, tb = Tensor(a, device=dev), Tensor(b, device=dev)
  np.testing.assert_allclose((ta @ tb).numpy(), a @ b, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose((ta @ tb[:, 0]).numpy(), a @ b[:, 0], rtol=1e-5, atol=1e-5)
  batch = rng.standard_normal((2, 5, 7)).astype(np.float32)
  np.testing.assert_allclose((Tensor(batch, device=dev) @ tb).numpy(), batch @ b, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose((ta.T.T @ tb.T.T).numpy(), a @ b, rtol=1e-5, atol=1e-5)
  with pytest.raises(ValueError): ta @ ta


def test_views(dev):
  a = np.arange(24, dtype=np.int32).reshape(4, 6)
  t = Tensor(a, device=dev)
  close(t.reshape(6, 4).numpy(), a.reshape(6, 4)); close(t.reshape(-1, 3).numpy(), a.reshape(-1, 3))
  close(t.T.numpy(), a.T); close(t.permute(1, 0).reshape(2, 12).numpy(), a.T.reshape(2, 12))
  close(t[1].numpy(), a[1]); close(t[:, 2].numpy(), a[:, 2]); close(t[1:3, ::2].numpy(), a[1:3, ::2])
  close(t[::-1, -2:].numpy(), a[::-1, -2:]); close(t[None, 2, :, None].numpy(), a[None, 2, :, None]); close(t[..., 1].numpy(), a[..., 1])
  close(t[2, 3].numpy(), a[2, 3])
  close(Tensor([1, 2, 3], device=dev).reshape(3, 1).expand(3, 4).numpy(), np.broadcast_to([[1], [2], [3]], (3, 4)))
  close((t.T + t.T[:, :1]).numpy(), a.T + a.T[:, :1])
  close(((t + 1).T * 2).numpy(), (a + 1).T * 2)  # a view of a lazy chain is pushed to its inputs
  v = t[1:3]
  assert v.node.op == "buf" and v.node.buffer is t.node.buffer  # zero copy
  with pytest.raises(ValueError): t.reshape(5, 5)
  with pytest.raises(IndexError): t[4]
  with pytest.raises(ValueError): t.permute(0, 0)


def test_to_assign_and_devices(dev):
  t = Tensor([1.0, 2.0, 3.0], device=dev)
  for other in devices():
    assert (t.to(other) * 2).tolist() == [2.0, 4.0, 6.0] and t.to(other).device == Device.canonicalize(other)
  t.assign(t * 10)
  assert t.tolist() == [10.0, 20.0, 30.0]
  t[1:].assign(0)
  assert t.tolist() == [10.0, 0.0, 0.0]
  u = Tensor(np.arange(5, dtype=np.float32), device=dev)
  u.assign(u[::-1])  # reads what it overwrites: computed apart first
  assert u.tolist() == [4, 3, 2, 1, 0]
  with pytest.raises(ValueError): Tensor([1, 2], device=dev).expand(3, 2).assign(1)
  if len(devices()) > 1:
    other = next(d for d in devices() if d != dev)
    with pytest.raises(ValueError, match="move one"): t + Tensor([1.0, 2.0, 3.0], device=other)


def test_half_types(dev):
  bf = Tensor([1.0, 2.5, 1000.0], dtypes.bfloat16, dev)
  assert bf.dtype is dtypes.bfloat16 and (bf * 2).numpy().tolist() == [2.0, 5.0, 2000.0]
  h = Tensor(np.array([1.5, 2.25, -3.0], np.float16), device=dev)
  with float16_or_skip(): got = (h * 2 + 1).numpy()
  close(got, np.array([4.0, 5.5, -5.0], np.float16), dtype=np.float16)


# ---------------------------------------------------------------- what a user reaches for first: numpy, repr, indexing

def test_numpy_array_protocol(dev):
  a = np.arange(12, dtype=np.float32).reshape(3, 4)
  t = Tensor(a, device=dev)
  for got in (np.asarray(t), np.array(t), np.asarray(t.T + 1, dtype=np.float64)):
    assert got.dtype != object and got.shape in ((3, 4), (4, 3))  # one copy, not an object array of 0-d tensors (20k elements: 0.49 s)
  np.testing.assert_array_equal(np.asarray(t), a)
  got = np.asarray(t.T + 1, dtype=np.float64)
  assert got.dtype == np.float64 and np.array_equal(got, a.T + 1)
  assert np.array(t, copy=True) is not np.array(t, copy=True)
  with pytest.raises(ValueError, match="without a copy"): np.asarray(t, copy=False)  # numpy 2: copy=False refuses a copy
  bf = np.asarray(Tensor([1.0, 2.5], dtypes.bfloat16, dev))
  assert bf.dtype == np.float32 and bf.tolist() == [1.0, 2.5]  # as .numpy(): numpy has no bfloat16


def test_repr_shows_the_values(dev):
  t = Tensor([[1.5, 2.0], [3.0, 4.0]], device=dev)
  assert repr(t) == f"Tensor([[1.5, 2. ],\n        [3. , 4. ]], shape=(2, 2), dtype=float32, device={Device.canonicalize(dev)})"
  assert str(t) == repr(t)
  lazy = t * 2
  assert repr(lazy).startswith("Tensor([[3., 4.],") and repr(lazy).endswith(", lazy)")
  assert lazy.node.op == "ew"  # printing computed a scratch copy: the tensor stays lazy, its chain still fuses
  assert repr(Tensor([1.0, 2.5], dtypes.bfloat16, dev) * 2).startswith("Tensor([2., 5.], shape=(2,), dtype=bfloat16")
  for shape in ((100, 200), (7, 5, 9, 2), (2000,)):
    a = np.arange(np.prod(shape), dtype=np.int32).reshape(shape)
    want = np.array2string(a, separator=", ", prefix="Tensor(")  # numpy's own summary ("..." past 1000 elements)
    assert repr(Tensor(a, device=dev)) == f"Tensor({want}, shape={shape}, dtype=int32, device={Device.canonicalize(dev)})"
  assert repr(Tensor(np.zeros((0, 3), np.float32), device=dev)).startswith("Tensor([], shape=(0, 3)")


def test_repr_of_a_huge_tensor_computes_only_what_it_prints(monkeypatch):
  sizes = []

  class Recorded(T.Buffer):
    __slots__ = ()
    def __init__(self, device, size, dtype=dtypes.float32):
      sizes.append(size)
      super().__init__(device, size, dtype)
  monkeypatch.setattr(T, "Buffer", Recorded)
  huge = Tensor.zeros((1 << 14, 1 << 14), device="CPU") + 1  # 1 GiB if computed whole
  assert repr(huge).startswith("Tensor([[1., 1., 1., ..., 1., 1., 1.],") and repr(huge).endswith("dtype=float32, device=CPU, lazy)")
  assert sizes and max(sizes) == 9 and huge.node.op == "ew"  # four 3x3 corners


def test_repr_never_raises(monkeypatch):
  t = Tensor([1.0, 2.0], device="CPU")
  def broken(self, *args): raise RuntimeError("the device is gone")
  monkeypatch.setattr(Tensor, "_host_values", broken)
  assert repr(t) == "<Tensor shape=(2,), dtype=float32, device=CPU, values unavailable: RuntimeError: the device is gone>"


def test_indexing_takes_numpy_integers_and_names_what_it_takes(dev):
  a = np.arange(24, dtype=np.int32).reshape(4, 6)
  t = Tensor(a, device=dev)
  assert t[np.int64(2), np.int32(-1)].item() == a[2, -1] and t[np.array(1)].tolist() == a[1].tolist()
  assert t[np.int64(1):np.int64(3)].tolist() == a[1:3].tolist()
  for idx, what in (([0, 2], "array of indices"), (np.array([1, 3]), "array of indices"), ((slice(None), [1, 2]), "array of indices"),
                    (np.array([True, False, True, False]), "boolean mask"), ([True, False, True, False], "boolean mask"),
                    (t > 3, "boolean mask"), (Tensor([1, 2], device=dev), "array of indices")):
    with pytest.raises(TypeError, match=f"{what}.*integers, slices, None and \\.\\.\\.") as ei: t[idx]
    assert "t.numpy()[" in str(ei.value)
  for bad in (1.0, True, "a"):
    with pytest.raises(TypeError, match="integers, slices, None and"): t[bad]
  with pytest.raises(IndexError): t[np.int64(4)]


def test_from_buffer_views_a_buffer_without_copying(dev):
  from plugrt import Buffer
  buf = Buffer(dev, 12, dtypes.int32).copyin(np.arange(12, dtype=np.int32))
  assert Tensor.from_buffer(buf).tolist() == list(range(12))
  assert Tensor.from_buffer(buf, (3, 4)).tolist() == np.arange(12).reshape(3, 4).tolist()
  t = Tensor.from_buffer(buf, (4, 3), strides=(1, 4))  # a transposed view
  assert t.tolist() == np.arange(12).reshape(3, 4).T.tolist()
  assert Tensor.from_buffer(buf, (3,), strides=(-4,), offset=8).tolist() == [8, 4, 0]
  assert Tensor.from_buffer(buf, (2, 2), strides=(0, 1), offset=5).tolist() == [[5, 6], [5, 6]]  # a broadcast row
  Tensor.from_buffer(buf, (2,), offset=3).assign(-1)  # writes go to the buffer
  assert buf.numpy().tolist()[2:6] == [2, -1, -1, 5]
  with pytest.raises(ValueError, match="outside the buffer"): Tensor.from_buffer(buf, (3, 4), offset=1)
  with pytest.raises(ValueError, match="outside the buffer"): Tensor.from_buffer(buf, (3,), strides=(-1,))
  with pytest.raises(ValueError, match="2 strides"): Tensor.from_buffer(buf, (12,), strides=(1, 1))
  assert Tensor.from_buffer(buf, (0, 3)).shape == (0, 3)


# ---------------------------------------------------------------- vector access (issue 30)

def _layouts(x: np.ndarray, dev: str) -> dict[str, Tensor]:
  """The same values as a fresh tensor (aligned: vector loads), a view one element into a larger buffer (contiguous,
  unaligned: scalar loads) and every other element of a larger one (strided)."""
  pad = np.concatenate([x[:1], x])
  pairs = np.stack([x, x[::-1]], 1)
  return {"aligned": Tensor(x, device=dev), "offset": Tensor(pad, device=dev)[1:], "strided": Tensor(pairs, device=dev)[:, 0]}


def _bits(a: np.ndarray) -> bytes: return np.ascontiguousarray(a).tobytes()


@pytest.mark.parametrize("n", [1, 6, 9, 1031])
@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.float16, dtypes.int8, dtypes.float64], ids=lambda d: d.name)
def test_vector_and_scalar_paths_give_the_same_bits(dev, dt, n):
  """Elementwise kernels take chunks of 4 elements with vector loads and stores where a view is contiguous and aligned,
  else element by element, and the last n % 4 elements one at a time: every layout and length gives numpy's bits, and a
  sum over all elements gives the same bits whichever way its elements were read."""
  if dt is dtypes.float64 and dev in ("WEBGPU", "QCOM"): pytest.skip(f"{dev} has no float64")
  rng = np.random.default_rng(n)
  if dt.kind == "f": x, y = (rng.standard_normal(n) * 100).astype(dt.numpy), (rng.standard_normal(n)).astype(dt.numpy)
  else: x, y = rng.integers(-128, 128, n).astype(dt.numpy), rng.integers(-128, 128, n).astype(dt.numpy)
  with float16_or_skip():
    ys = _layouts(y, dev)
    outs = {name: (a * 3 + ys[name]).numpy() for name, a in _layouts(x, dev).items()}
    sums = {name: a.sum().numpy() for name, a in _layouts(x, dev).items()}
  with np.errstate(all="ignore"): want = (x * dt.numpy.type(3) + y).astype(dt.numpy)
  for name, got in outs.items(): assert _bits(got) == _bits(want), (name, got[:8], want[:8])
  assert len({_bits(s) for s in sums.values()}) == 1, sums
  if dt.kind == "f": np.testing.assert_allclose(sums["aligned"], x.astype(np.float64).sum(), rtol=1e-5 if dt.itemsize > 2 else 1e-2,
                                                atol=1e-3 * np.abs(x.astype(np.float64)).sum())
  else: assert sums["aligned"] == x.astype(np.int64).sum()


def test_vector_loads_are_used_only_where_the_memory_is_aligned(dev):
  from plugrt import Buffer
  from plugrt.compiler.ir import Ops
  T._KERNELS.clear(); T._PLANS.clear()
  x = np.arange(40, dtype=np.float32)
  (Tensor(x, device=dev) + 1).realize()
  aligned = list(T._KERNELS.values())
  assert [sum(u.op is Ops.VLOAD for u in k.uops) for k in aligned] == [T._UNROLL]  # one per chunk of the step
  assert sum(u.op is Ops.VSTORE for u in aligned[0].uops) == T._UNROLL
  T._KERNELS.clear(); T._PLANS.clear()
  (Tensor(x, device=dev)[1:] + 1).realize()
  assert [sum(u.op is Ops.VLOAD for u in k.uops) for k in T._KERNELS.values()] == [0]  # an offset view: scalar loads
  buf = Buffer(dev, 16, dtypes.float32)
  assert T.vector_aligned(buf) and T.vector_aligned(buf.view(8, offset=16)) and T.vector_aligned(buf, 4)
  assert not T.vector_aligned(buf.view(8, offset=4)) and not T.vector_aligned(buf, 1) and not T.vector_aligned(buf, 6)
  assert T.vector_aligned(Buffer(dev, 8, dtypes.float16), 4) and not T.vector_aligned(Buffer(dev, 8, dtypes.float16), 2)


def test_wrapped_memory_takes_the_vector_path_only_when_aligned(dev):
  """from_blob memory is checked at its address where the device tells it (a host device), else taken as unaligned."""
  from plugrt import Buffer
  from plugrt.errors import UnsupportedError
  store = np.zeros(64, np.float32)
  store[:] = np.arange(64)
  at = store.ctypes.data
  first = (-at % 16) // 4  # the first element of `store` at a 16-byte boundary
  try:
    good = Buffer.from_blob(at + 4 * first, 32, dtypes.float32, dev, keepalive=store)
    bad = Buffer.from_blob(at + 4 * first + 4, 32, dtypes.float32, dev, keepalive=store)
  except UnsupportedError: pytest.skip(f"{dev} cannot wrap host memory")
  alloc = good.device.allocator
  exports = alloc.dlpack_device() is not None
  assert T.vector_aligned(good) == exports and not T.vector_aligned(bad)
  for b, start in ((good, first), (bad, first + 1)):
    assert (Tensor.from_buffer(b) * 2).numpy().tolist() == (np.arange(start, start + 32) * 2).tolist()
    assert Tensor.from_buffer(b).sum().item() == sum(range(start, start + 32))


def test_assign_into_views_writes_only_the_view(dev):
  """Vector stores into an aligned view, scalar ones into an unaligned or strided one; nothing outside the view."""
  base = Tensor(np.full(40, -1.0, np.float32), device=dev).realize()
  src = np.arange(9, dtype=np.float32) + 0.5
  base[4:13].assign(Tensor(src, device=dev) * 2)
  base[17:26].assign(Tensor(src, device=dev) + 1)
  base[28:37:1].assign(Tensor(src, device=dev))
  want = np.full(40, -1.0, np.float32)
  want[4:13], want[17:26], want[28:37] = src * 2, src + 1, src
  assert base.numpy().tolist() == want.tolist()


@pytest.mark.parametrize("unroll,group,max_groups,n", [(1, 256, 65535, 4096), (1, 8, 3, 8 * 4 * 7 + 3), (1, 8, 4, 8 * 4 * 12 + 2),
                                                     (2, 8, 3, 8 * 8 * 5 + 2), (4, 4, 2, 1001)])
def test_elementwise_kernels_cover_their_output_in_one_pass(dev, monkeypatch, unroll, group, max_groups, n):
  """An elementwise kernel covers its output in one pass of its grid, with no loop (what the IR's own vector-access
  kernel does at a device copy's bandwidth): `per` chunks of 4 a thread, a second grid axis past the most groups an
  axis, a guard only where the grid passes the chunks, more chunks a thread past the most groups squared, the n % 4
  tail one element at a time. Every such shape gives numpy's bits, and the grid stays within the groups an axis."""
  from plugrt.compiler.ir import Ops
  for name, v in (("_UNROLL", unroll), ("_GROUP", group), ("_MAX_GROUPS", max_groups)): monkeypatch.setattr(T, name, v)
  T._KERNELS.clear(); T._PLANS.clear()
  x, y = np.arange(n, dtype=np.float32) * 0.5 - 7, np.arange(n, dtype=np.float32)[::-1] * 0.25
  got = (Tensor(x, device=dev) * 3 + Tensor(y, device=dev)).numpy()
  assert _bits(got) == _bits(x * np.float32(3) + y)
  (k,) = T._KERNELS.values()
  gx, gy, local, per = T._ew_grid(n)
  assert gx <= max_groups and gy <= max_groups and local <= group and gx * gy * local * per >= n // 4 > gx * (gy - 1) * local * per  # no empty row
  assert not any(u.op is Ops.RANGE for u in k.uops)
  assert sum(u.op is Ops.VLOAD for u in k.uops) == 2 * per and sum(u.op is Ops.VSTORE for u in k.uops) == per


@pytest.mark.parametrize("op", ["sum", "max", "min"])
def test_large_reductions_take_two_launches(dev, monkeypatch, op):
  """A reduction over all of a large source takes two launches however large it is: a partial result per group (its
  threads' folds combined in shared memory), at most _REDUCE_GROUPS of them, then one group over those. Groups of 4
  threads here, so that a small source has as many groups as a large one has with 256."""
  monkeypatch.setattr(T, "_GROUP", 4)
  T._KERNELS.clear(); T._PLANS.clear()
  rng = np.random.default_rng(5)
  for n, most in ((20001, 1024), (20001, 16), (255, 1024)):
    monkeypatch.setattr(T, "_REDUCE_GROUPS", most)
    x, ints = (rng.standard_normal(n) * 10).astype(np.float32), rng.integers(-1000, 1000, n).astype(np.int32)
    before = T.stats["kernels_run"]
    got = getattr(Tensor(x, device=dev), op)().numpy()
    assert T.stats["kernels_run"] - before == (2 if n > 4 * 4 * T._REDUCE_CHUNKS else 1)
    if op == "sum": np.testing.assert_allclose(got, x.astype(np.float64).sum(), rtol=1e-5, atol=1e-5 * np.abs(x).sum())
    else: assert got == getattr(x, op)()
    assert getattr(Tensor(ints, device=dev), op)().item() == getattr(ints.astype(np.int64), op)()


@pytest.mark.parametrize("op", ["sum", "max", "min", "mean"])
def test_large_reductions_run_in_stages(dev, op):
  """A reduction over all of a large source runs as partial results then their reduction (bench: a Tensor sum at read
  bandwidth); every op, an int and a bool source, an odd length, a chain fused into the first stage."""
  n = 70001 if dev != "PYTHON" else 17001  # past 16384: partial results, then one group
  x = (np.random.default_rng(1).standard_normal(n) * 10).astype(np.float32)
  t = Tensor(x, device=dev)
  before = T.stats["kernels_run"]
  got = getattr(t * 2 - 1, op)().numpy()
  assert T.stats["kernels_run"] - before >= 2
  want = getattr(x.astype(np.float64) * 2 - 1, op)()
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4 * np.abs(x).sum() if op == "sum" else 1e-5)
  ints = (np.arange(n) % 200 - 100).astype(np.int16)
  if op != "mean": assert getattr(Tensor(ints, device=dev), op)().item() == getattr(ints.astype(np.int64), op)()
  if op in ("max", "min"):
    flags = np.zeros(n, bool)
    flags[n - 2] = True
    assert Tensor(flags, device=dev).max().item() is True and Tensor(~flags, device=dev).min().item() is False


def test_dropped_results_free_their_buffers_without_the_garbage_collector():
  """A reduction's result and a view pushed through elementwise ops are plain references: once dropped, their buffers go
  back at once, not when the collector next runs (a nested function calling itself made a reference cycle that held
  the nodes, so a loop of sums kept a result buffer per sum; on a GPU, memory the allocator could not reuse)."""
  import gc
  x = Tensor(np.arange(8192, dtype=np.float32), device="CPU")
  y = Tensor(np.ones(8192, np.float32), device="CPU")
  ops = [lambda: x.sum().realize(), lambda: (x * 2 + y).reshape(64, 128).permute(1, 0).contiguous(), lambda: (x * y).mean().realize(),
         lambda: x.reshape(2, 4096)[1].realize(), lambda: (x + 1).reshape(8, 1024).sum(axis=1).realize()]
  for op in ops: op()
  gc.collect()
  gc.disable()
  gc.set_debug(gc.DEBUG_SAVEALL)  # (what the collector finds stays in gc.garbage, for the message)
  try:
    for op in ops:
      for _ in range(10): op()
    gc.collect()
    # plugrt's objects among what the collector found (other libraries' objects that other tests dropped, a WebGPU
    # engine's adapter and device, may come due meanwhile: they are not the tensors')
    ours = [o for o in gc.garbage if type(o).__module__.startswith("plugrt") or
            (isinstance(o, types.FunctionType) and (o.__module__ or "").startswith("plugrt"))]
    kinds = sorted({f"{type(o).__module__}.{type(o).__qualname__}" for o in ours})
    assert not ours, f"dropped tensors were left in reference cycles: {len(ours)} of plugrt's objects, of {kinds[:12]}"
  finally:
    gc.set_debug(0)
    gc.garbage.clear()
    gc.enable()


def test_a_realize_plan_is_shared_only_by_graphs_that_launch_alike(dev, monkeypatch):
  """A realize of a graph whose structure was realized before skips the kernel key's walk and the launch's
  computations (T._PLANS); a graph that differs in anything its kernel or launch depends on gets its own kernel: the
  alignment of a view's first element, whether a buffer needs wide indices, the staging of a reduction, a leaf read
  twice or two leaves; and an assign into a view the graph also reads computes apart, as it did the first time."""
  from plugrt import Buffer
  monkeypatch.setattr(T, "_WIDE", 64)  # (a buffer of 64 elements or more takes int64 indices: 2**31 is too many for a test)
  T._KERNELS.clear(); T._PLANS.clear()
  host = np.arange(80, dtype=np.float32)
  big, small = Buffer(dev, 80, dtypes.float32).copyin(host), Buffer(dev, 40, dtypes.float32).copyin(host[:40])

  def kernels_for(fn):
    before = len(T._KERNELS)
    got = fn()
    return len(T._KERNELS) - before, got
  assert kernels_for(lambda: (Tensor.from_buffer(small, (8,), offset=4) + 1).tolist()) == (1, (host[4:12] + 1).tolist())
  assert kernels_for(lambda: (Tensor.from_buffer(small, (8,), offset=8) + 2).tolist()) == (0, (host[8:16] + 2).tolist())  # the plan
  assert kernels_for(lambda: (Tensor.from_buffer(small, (8,), offset=5) + 1).tolist()) == (1, (host[5:13] + 1).tolist())  # unaligned
  if dev != "WEBGPU":  # (WGSL has no 64-bit types)
    narrow = T._KERNELS.copy()
    assert kernels_for(lambda: (Tensor.from_buffer(big, (8,), offset=4) + 1).tolist()) == (1, (host[4:12] + 1).tolist())  # wide indices
    (k,) = [k for key, k in T._KERNELS.items() if key not in narrow]
    assert dtypes.int64 in k.signature.scalars
  x, y = Tensor.from_buffer(small, (8,)), Tensor.from_buffer(small, (8,), offset=8)
  assert kernels_for(lambda: (x * y).tolist()) == (1, (host[:8] * host[8:16]).tolist())
  assert kernels_for(lambda: (x * x).tolist()) == (1, (host[:8] * host[:8]).tolist())  # one leaf, not two
  assert kernels_for(lambda: (y * y).tolist()) == (0, (host[8:16] * host[8:16]).tolist())
  # a reduction in stages ends with a reduction over its partial results, of the same structure as one over that many elements
  monkeypatch.setattr(T, "_PARTIAL_MIN", 8)
  monkeypatch.setattr(T, "_REDUCE_CHUNKS", 1)
  monkeypatch.setattr(T, "_GROUP", 4)
  data = np.arange(1, 34, dtype=np.float32)
  groups = T._partial_groups(33)
  assert groups == 3 and Tensor(data[:groups], device=dev).sum(axis=0, keepdim=True).item() == data[:groups].sum()
  assert kernels_for(lambda: Tensor(data, device=dev).sum(axis=0, keepdim=True).item()) == (2, data.sum())
  # assign into a view the graph reads through another view: computed apart, on a plan's hit as on its miss
  # (over many groups: elements read after the groups before them wrote there, were the two not apart)
  monkeypatch.undo()
  line = np.random.default_rng(2).standard_normal(4099).astype(np.float32)
  want = line.copy()
  want[1:] = line[:-1] + 1
  for _ in range(2):
    base, other = Tensor(line, device=dev).realize(), Tensor(line, device=dev).realize()
    base[1:].assign(other[:-1] + 1)
    assert base.tolist() == want.tolist()
    base = Tensor(line, device=dev).realize()
    base[1:].assign(base[:-1] + 1)
    assert base.tolist() == want.tolist()
