"""IR float semantics that WGSL compilers do not keep by themselves, on each engine (and wgpu-native's OpenGL
adapter where there is one), against the interpreter: NaN in CMPNE and in casts to bool (compilers assume finite
math), SIN over the whole float32 range (WGSL's sin is accurate only near [-pi, pi]), and BITCAST between bool and
the 8-bit integers, and left shifts of constants that overflow. These are the fuzzer's webgpu-nan-compare,
webgpu-sin-range, wgsl-bool-bitcast and wgsl-shl-const-overflow."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from webgpu_engines import device, engine_params

from plugrt.compiler import interpreter
from plugrt.compiler import samples as K
from plugrt.compiler.ir import Kernel, KernelBuilder, Ops
from plugrt.device import Buffer
from plugrt.dtype import DType, dtypes, f32_to_bf16
from plugrt.registry import use

NAN = float("nan")


@pytest.fixture(params=[*engine_params(), pytest.param(("WGPU", "opengl"), id="wgpu-opengl")])
def dev(request: pytest.FixtureRequest) -> Iterator[Any]:
  engine, adapter = request.param if isinstance(request.param, tuple) else (request.param, "")
  d = device(engine, adapter)
  with use(d.registry): yield d


def needs(dev: Any, dt: DType) -> None:
  if dt is dtypes.float16 and "shader-f16" not in dev.info.iface_object.features: pytest.skip("this adapter has no shader-f16")


def run(dev: Any, kernel: Kernel, inputs: list[np.ndarray], n: int, local: int = 1) -> tuple[list[np.ndarray], list[np.ndarray]]:
  """The written buffers as the device and as the interpreter leave them (n threads, in groups of `local`)."""
  bufs = [Buffer(dev, len(a), dt).copyin(np.ascontiguousarray(a)) for a, dt in zip(inputs, kernel.signature.buffers)]
  dev.program(kernel)(*bufs, global_size=(n // local, 1, 1), local_size=(local, 1, 1), wait=True)
  want = [a.copy() for a in inputs]
  interpreter.run(kernel, want, (), (n // local, 1, 1), (local, 1, 1))
  return [b.numpy() for b in bufs], want


def storage(xs: Any, dt: DType) -> np.ndarray:
  x = np.asarray(xs, np.float32)
  return f32_to_bf16(x) if dt is dtypes.bfloat16 else x.astype(dt.numpy)


@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.float16, dtypes.bfloat16], ids=lambda d: d.name)
def test_nan_compares_and_casts_to_bool(dev: Any, dt: DType) -> None:
  """CMPNE is unordered (true when either side is NaN), the others ordered; a cast to bool is `!= 0`, so NaN is true,
  and so is a subnormal (NVIDIA's Vulkan driver flushes subnormals in compares, not in the bit test). Against a
  register and a constant, and a value against itself (x != x, the NaN test)."""
  needs(dev, dt)
  b = KernelBuilder(f"nan_cmp_{dt.name}")
  out, sub, x, y, z = b.buffer("out", dtypes.bool), b.buffer("sub", dtypes.bool), b.buffer("x", dt), b.buffer("y", dt), b.buffer("z", dt)
  i = b.global_id(0)
  a, c = x[i], y[i]
  res = [a.ne(c), a.ne(a), a.ne(b.const(0.0, dt)), a.ne(b.const(NAN, dt)), a.eq(c), a.eq(a), a < c, a <= c, a <= a,
         a.cast(dtypes.bool), (a * c).cast(dtypes.bool), ~a.ne(a)]
  for k, r in enumerate(res): out[i * len(res) + k] = r
  sub[i] = z[i].cast(dtypes.bool)
  tiny = {dtypes.float32: 1e-40, dtypes.float16: 6e-8, dtypes.bfloat16: 1e-39}[dt]
  xs = [NAN, 1.0, NAN, 0.0, -0.0, np.inf, -NAN, 2.0, -np.inf, 0.0, NAN, 1.0]
  ys = [1.0, NAN, NAN, 0.0, 0.0, NAN, NAN, 1.0, -np.inf, -0.0, -NAN, np.inf]
  zs = [tiny, -tiny, 0.0, -0.0, NAN, np.inf, 1.0, -tiny * 3, 0.0, tiny, -NAN, 0.0]
  n = len(xs)
  got, want = run(dev, b.finish(), [np.zeros(n * len(res), np.bool_), np.zeros(n, np.bool_), storage(xs, dt), storage(ys, dt), storage(zs, dt)], n)
  K.compare(f"NaN compares ({dt.name})", got[0], want[0], dtypes.bool)
  K.compare(f"casts to bool ({dt.name})", got[1], want[1], dtypes.bool)


@pytest.mark.parametrize("dt", [dtypes.int8, dtypes.uint8], ids=lambda d: d.name)
def test_bool_bitcasts_to_and_from_8_bit_integers(dev: Any, dt: DType) -> None:
  """bool -> int8/uint8 is the bool's byte (0 or 1), used in arithmetic before it is stored; the other way for
  bytes 0 and 1 (other bytes are a spec gap: the interpreter keeps the raw byte in a bool)."""
  b = KernelBuilder(f"bool_bitcast_{dt.name}")
  ints, bools, x, v = b.buffer("ints", dt), b.buffer("bools", dtypes.bool), b.buffer("x", dtypes.bool), b.buffer("v", dt)
  i = b.global_id(0)
  p, q = x[i], v[i]
  ints[i * 3] = p.bitcast(dt)
  ints[i * 3 + 1] = p.bitcast(dt) + b.const(100, dt) * p.bitcast(dt)
  ints[i * 3 + 2] = (~p).bitcast(dt) - b.const(1, dt)
  bools[i * 3] = q.bitcast(dtypes.bool)
  bools[i * 3 + 1] = ~q.bitcast(dtypes.bool)
  bools[i * 3 + 2] = q.bitcast(dtypes.bool).bitcast(dt).bitcast(dtypes.bool) & p
  n = 8
  xs, vs = np.array([0, 1, 1, 0, 1, 0, 0, 1], np.bool_), np.array([0, 1, 0, 1, 1, 0, 1, 0], dt.numpy)
  got, want = run(dev, b.finish(), [np.zeros(3 * n, dt.numpy), np.zeros(3 * n, np.bool_), xs, vs], n)
  K.compare("bool -> int", got[0], want[0], dt)
  K.compare("int -> bool", got[1], want[1], dtypes.bool)


def sin_sweep() -> np.ndarray:
  """float32 arguments over the whole range: edges, the worst cases of the reduction modulo pi/2, the float32
  nearest to k*pi/2 and their neighbours, every binade, and each path's boundaries; a multiple of 64 values."""
  rng = np.random.default_rng(11)
  edges = [0.0, 1e-45, 1e-40, 1.1754942e-38, 2.4414062e-4, 2.44140625e-4, 0.5, 0.78539813, 0.78539819, 1.0, 3.0, 12.0, 100.0,
           252.89820861816406, 4095.9998, 4096.0, 1e6, 3e7, 2.1e9, 16367173 * 2.0 ** 72, 10741887 * 2.0 ** 11, 1e38, 3.4028235e38]
  near = (np.arange(1, 4000) * (np.pi / 2)).astype(np.float32)
  parts = [np.array(edges, np.float32), near, np.nextafter(near, np.float32(0)), np.nextafter(near, np.float32(np.inf)),
           rng.integers(0x39000000, 0x7f800000, 1 << 15, dtype=np.uint32).view(np.float32),   # every binade from 2^-13 up
           (rng.random(1 << 14) * 4096).astype(np.float32), (rng.random(1 << 12) * 12).astype(np.float32)]
  xs = np.concatenate(parts)
  xs = np.concatenate([xs, -xs, np.array([np.inf, -np.inf, NAN, -0.0, -1e-45], np.float32)])
  return np.concatenate([xs, np.zeros(-len(xs) % 64, np.float32)])


def test_sin_over_the_whole_float32_range(dev: Any) -> None:
  """Within 2 ulp of sin (float64 libm, rounded to float32 only in the comparison) everywhere, and within the IR's
  4 ulp of the interpreter with no absolute slack; subnormals and +-0 come back unchanged, +-inf and NaN give NaN."""
  b = KernelBuilder("sin_sweep")
  out, x = b.buffer("out", dtypes.float32), b.buffer("x", dtypes.float32)
  i = b.global_id(0)
  out[i] = x[i].sin()
  xs = sin_sweep()
  got, want = run(dev, b.finish(), [np.zeros(len(xs), np.float32), xs], len(xs), 64)
  K.compare("sin vs the interpreter", got[0], want[0], dtypes.float32, K.ULPS[Ops.SIN])
  fin = np.isfinite(xs)
  ref = np.sin(xs[fin].astype(np.float64))
  err = np.abs(got[0][fin] - ref) / K.ulp(dtypes.float32, ref)
  assert err.max() <= 2.0, f"sin({xs[fin][err.argmax()]!r}) = {got[0][fin][err.argmax()]!r}, want {ref[err.argmax()]!r}: {err.max():.2f} ulp"
  assert np.isnan(got[0][~fin]).all()
  small = fin & (np.abs(xs) < 2.0 ** -12)  # sin x rounds to x there: bit-exact, sign of zero included
  assert got[0][small].tobytes() == xs[small].tobytes()


@pytest.mark.parametrize("dt", [dtypes.float16, dtypes.bfloat16], ids=lambda d: d.name)
def test_half_sin_every_value(dev: Any, dt: DType) -> None:
  """float16 and bfloat16 SIN go through the float32 routine and round once: every one of the 65536 values."""
  needs(dev, dt)
  b = KernelBuilder(f"sin_all_{dt.name}")
  out, x = b.buffer("out", dt), b.buffer("x", dt)
  i = b.global_id(0)
  out[i] = x[i].sin()
  xs = np.arange(1 << 16, dtype=np.uint16)
  xs = xs.view(np.float16) if dt is dtypes.float16 else xs
  got, want = run(dev, b.finish(), [np.zeros_like(xs), xs], len(xs), 64)
  K.compare(f"sin ({dt.name})", got[0], want[0], dt, 1)


def test_sin_and_nan_tests_before_a_barrier(dev: Any) -> None:
  """pr_sin returns early under conditions on its argument: calls of it (and of pr_nan) leave the caller's control
  flow uniform, so a barrier may follow (WGSL's uniformity analysis checks it when the module is created)."""
  b = KernelBuilder("sin_barrier")
  out, x = b.buffer("out", dtypes.float32), b.buffer("x", dtypes.float32)
  sh = b.shared("sh", dtypes.float32, 64)
  lid, gid = b.local_id(0), b.global_id(0)
  sh[lid] = x[gid].sin() + x[gid].ne(x[gid]).cast(dtypes.float32)
  b.barrier()
  out[gid] = sh[(lid + 1) % 64]
  xs = np.linspace(-1e7, 1e7, 128).astype(np.float32)
  xs[5] = NAN
  got, want = run(dev, b.finish(), [np.zeros(128, np.float32), xs], 128, 64)
  K.compare("sin before a barrier", got[0], want[0], dtypes.float32, K.ULPS[Ops.SIN])


@pytest.mark.parametrize("dt", [dtypes.int32, dtypes.uint32, dtypes.int16, dtypes.uint8], ids=lambda d: d.name)
def test_left_shifts_of_constants_that_overflow(dev: Any, dt: DType) -> None:
  """A left shift wraps in the IR. naga evaluates shifts of constants when it makes the pipeline and rejected an
  overflowing one ("<< operation overflowed": the fuzzer's wgsl-shl-const-overflow, ir 5361); the renderer clears
  the bits that leave first. Constant operands, loaded ones, and shift amounts past the width (masked)."""
  b = KernelBuilder(f"shl_{dt.name}")
  out, x = b.buffer("out", dt), b.buffer("x", dt)
  big = b.const(int(dt.max) if dt.kind == "u" else int(dt.min) + 5, dt)
  for k, amount in enumerate((1, 23, dt.bits - 1, dt.bits + 3)):
    out[2 * k] = big << b.const(amount, dt)
    out[2 * k + 1] = x[k] << b.const(amount, dt)
  xs = np.array([dt.max, dt.min, -1 if dt.kind == "i" else dt.max - 1, 3], dtype=object).astype(dt.numpy)
  got, want = run(dev, b.finish(), [np.zeros(8, dt.numpy), xs], 1)
  K.compare(f"<< on {dt.name}", got[0], want[0], dt)
