"""The CPU's LLVM compiler (and, on the same kernels, CLANG) against the reference interpreter."""
from __future__ import annotations

import math
import struct

import numpy as np
import pytest

import plugrt.compiler.interpreter as interp
from plugrt import Buffer, Device, KernelBuilder, dtypes
from plugrt.compiler.ir import BINARY, COMPARE, UNARY, Kernel, Ops
from plugrt.dtype import DType, bf16_to_f32, f32_to_bf16
from plugrt.errors import CompileError, IRError, PluginError

pytest.importorskip("llvmlite")

COMPILERS = ("CLANG", "LLVM")
ALL = dtypes.all()
FLOATS = (dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64)
# relative tolerance of the transcendental ops (numpy's and libm's exp2/log2/sin differ by an ulp or so)
RTOL = {dtypes.float16: 2e-3, dtypes.bfloat16: 1.6e-2, dtypes.float32: 4e-7, dtypes.float64: 1e-14}
N = 48


@pytest.fixture(scope="module")
def dev():
  return Device["CPU"]


def to_buf(arr: np.ndarray, dt: DType, dev) -> Buffer:
  return Buffer(dev, arr.size, dt).copyin(np.ascontiguousarray(arr, dtype=dt.numpy))


def as_float(arr: np.ndarray, dt: DType) -> np.ndarray:
  """Values of a storage array as float64 (bfloat16 arrays hold raw bits)."""
  return (bf16_to_f32(arr) if dt is dtypes.bfloat16 else arr).astype(np.float64)


def storage(values, dt: DType) -> np.ndarray:
  """Python/numpy values -> a storage array of dt (bfloat16: rounded raw bits)."""
  if dt is dtypes.bfloat16: return f32_to_bf16(np.asarray(values, dtype=np.float32))
  with np.errstate(all="ignore"): return np.asarray(values).astype(dt.numpy)


def launch(dev, compiler: str, kernel: Kernel, arrays: list[np.ndarray], dts: list[DType], vals=(), gs=(1, 1, 1), ls=(1, 1, 1)):
  """Run kernel on the device and in the interpreter; returns (device results, interpreter results)."""
  ref = [a.copy() for a in arrays]
  interp.run(kernel, ref, list(vals), gs, ls)
  bufs = [to_buf(a, dt, dev) for a, dt in zip(arrays, dts)]
  prg = dev.program(kernel, compiler=compiler)
  prg(*bufs, global_size=gs, local_size=ls, vals=tuple(vals))
  return [b.numpy() for b in bufs], ref


def assert_same(got: np.ndarray, want: np.ndarray, dt: DType, rtol: float = 0.0, mask: np.ndarray | None = None, what: str = "") -> None:
  """Exact for ints and bools; floats by value (NaN == NaN, -0 == 0) within rtol."""
  if mask is not None: got, want = got[mask], want[mask]
  if dt.kind != "f":
    np.testing.assert_array_equal(got, want, err_msg=what)
    return
  g, w = as_float(got, dt), as_float(want, dt)
  same = (g == w) | (np.isnan(g) & np.isnan(w))
  if rtol: same |= np.isclose(g, w, rtol=rtol, atol=0)
  assert same.all(), f"{what}: {np.flatnonzero(~same)[:8]} got {g[~same][:8]} want {w[~same][:8]}"


# ---------------------------------------------------------------- inputs

def int_inputs(dt: DType, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  lo, hi = int(dt.min), int(dt.max)
  a = rng.integers(lo, hi, N, endpoint=True, dtype=dt.numpy)
  a[:4] = [lo, hi, 0, 1]
  b = rng.integers(lo, hi, N, endpoint=True, dtype=dt.numpy)
  b[:8] = [3, 1, 7, hi, 5, lo, 2, 3] if dt.kind == "u" else [-1, hi, -7, 3, lo, -1, 2, -3]
  b[b == 0] = 1  # division by zero is undefined
  if dt.kind == "i": b[(a == lo) & (b == -1)] = 2  # MIN / -1 traps in C (LLVM has its own test)
  c = rng.integers(0, dt.bits - 1, N, endpoint=True, dtype=dt.numpy)  # shift amounts within the width
  return a, b, c


def float_inputs(dt: DType, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  special = [0.0, -0.0, 1.0, -1.5, 2.5, 0.1, math.inf, -math.inf, math.nan, 1e-3, 3.0, -7.25]
  if dt is dtypes.float16: special += [6e-8, 6.1e-5, 65504.0, 300.0, -4e-6]  # subnormals, the largest half
  if dt is dtypes.bfloat16: special += [1e-38, 3e38, 1e20]
  a = np.concatenate([special, rng.uniform(-60, 60, N - len(special))])
  b = np.concatenate([special[::-1], rng.uniform(-8, 8, N - len(special))])
  return storage(a, dt), storage(b, dt), storage(b, dt)


def inputs(dt: DType, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  rng = np.random.default_rng(seed + ALL.index(dt))
  if dt is dtypes.bool: return rng.random(N) < 0.5, rng.random(N) < 0.5, rng.random(N) < 0.5
  return int_inputs(dt, rng) if dt.kind in "iu" else float_inputs(dt, rng)


# ---------------------------------------------------------------- every ALU op for every dtype it takes

def alu_kernel(dt: DType) -> tuple[Kernel, list[Ops], list[Ops]]:
  """One kernel applying every unary/binary op that takes dt (and WHERE) to inputs a, b (c: shift amounts)."""
  b = KernelBuilder(f"alu_{dt.name}")
  out, outb = b.buffer("out", dt), b.buffer("outb", dtypes.bool)
  A, B, C = b.buffer("a", dt), b.buffer("b", dt), b.buffer("c", dt)
  i = b.group_id(0)
  x, y, z = A[i], B[i], C[i]
  vals, cmps, ops, cmp_ops = [], [], [], []
  for op in sorted(UNARY | BINARY, key=lambda o: o.value):
    args = (x,) if op in UNARY else (x, z) if op in (Ops.SHL, Ops.SHR) else (x, y)
    try: r = b.alu(op, *args)
    except IRError: continue  # the op does not take dt
    (cmps if op in COMPARE else vals).append(r)
    (cmp_ops if op in COMPARE else ops).append(op)
  vals.append((x < y).where(x, y))
  ops.append(Ops.WHERE)
  for k, r in enumerate(vals): out[i + k * N] = r
  for k, r in enumerate(cmps): outb[i + k * N] = r
  return b.finish(), ops, cmp_ops


@pytest.mark.parametrize("compiler", COMPILERS)
@pytest.mark.parametrize("dt", ALL, ids=lambda d: d.name)
def test_alu(dev, compiler: str, dt: DType):
  k, ops, cmp_ops = alu_kernel(dt)
  a, b, c = inputs(dt)
  arrays = [storage(np.zeros(N * len(ops)), dt), np.zeros(N * max(len(cmp_ops), 1), dtype=bool), a, b, c]
  got, ref = launch(dev, compiler, k, arrays, [dt, dtypes.bool, dt, dt, dt], gs=(N, 1, 1))
  fa, fb = (as_float(a, dt), as_float(b, dt)) if dt.kind == "f" else (None, None)
  for n, op in enumerate(ops):
    sl = slice(n * N, (n + 1) * N)
    mask = None
    if op in (Ops.MAX, Ops.MIN) and dt.kind == "f": mask = ~(np.isnan(fa) | np.isnan(fb))  # unspecified with a NaN
    rtol = RTOL[dt] if op in (Ops.EXP2, Ops.LOG2, Ops.SIN) else 0.0
    assert_same(got[0][sl], ref[0][sl], dt, rtol, mask, f"{compiler} {op.name} {dt.name}")
  for n, op in enumerate(cmp_ops):
    sl = slice(n * N, (n + 1) * N)
    assert_same(got[1][sl], ref[1][sl], dtypes.bool, what=f"{compiler} {op.name} {dt.name}")


# ---------------------------------------------------------------- conversions

CAST_FLOATS = [-100.7, -99.5, -3.5, -2.5, -1.0, -0.75, -0.0, 0.0, 0.3, 0.5, 1.0, 1.5, 2.5, 3.7, 7.5, 42.0, 99.9, 100.0, 126.5]
FLOAT_EXTRA = [math.inf, -math.inf, math.nan, 1e-7, -6e-8, 65519.0, 65520.0, 70000.5, 1e30, -3e38, 1e-40, 2.0 ** -24 * 1.5]


def cast_inputs(src: DType) -> np.ndarray:
  rng = np.random.default_rng(7 + ALL.index(src))
  if src is dtypes.bool: return np.arange(N) % 3 == 0
  if src.kind in "iu":
    lo, hi = int(src.min), int(src.max)
    edge = [lo, hi, 0, 1, lo + 1, hi - 1, 100, 127, 128, 255, 256, 65504, 65519, 65520, 16777217, (1 << 24) + (1 << 16) + 1]
    vals = [v for v in edge if lo <= v <= hi] + ([-1, -100, -128, -129] if src.kind == "i" else [])
    vals = [v for v in vals if lo <= v <= hi]
    return np.concatenate([np.array(vals, dtype=src.numpy), rng.integers(lo, hi, N - len(vals), endpoint=True, dtype=src.numpy)])
  vals = CAST_FLOATS + FLOAT_EXTRA
  return storage(np.concatenate([vals, rng.uniform(-100, 100, N - len(vals))]), src)


def cast_ok(x: np.ndarray, src: DType, dst: DType) -> np.ndarray:
  """Lanes where the cast is defined: float -> int needs the truncated value in range."""
  if src.kind != "f" or dst.kind not in "iu": return np.ones(len(x), dtype=bool)
  with np.errstate(invalid="ignore"):
    t = np.trunc(as_float(x, src))
    return np.isfinite(t) & (t >= float(dst.min)) & (t <= float(dst.max))


@pytest.mark.parametrize("compiler", COMPILERS)
@pytest.mark.parametrize("src", ALL, ids=lambda d: d.name)
def test_cast(dev, compiler: str, src: DType):
  b = KernelBuilder(f"cast_{src.name}")
  outs = [b.buffer(f"o_{d.name}", d) for d in ALL]
  X = b.buffer("x", src)
  i = b.group_id(0)
  v = X[i]
  for o, d in zip(outs, ALL): o[i] = v.cast(d)
  x = cast_inputs(src)
  got, ref = launch(dev, compiler, b.finish(), [storage(np.zeros(N), d) for d in ALL] + [x], [*ALL, src], gs=(N, 1, 1))
  for n, d in enumerate(ALL): assert_same(got[n], ref[n], d, mask=cast_ok(x, src, d), what=f"{compiler} {src.name}->{d.name}")


@pytest.mark.parametrize("compiler", COMPILERS)
def test_cast_f64_to_f16_one_rounding(dev, compiler: str):
  """double -> half is one correctly rounded conversion (numpy's), not double -> float -> half."""
  b = KernelBuilder("f64_to_f16")
  out, X = b.buffer("out", dtypes.float16), b.buffer("x", dtypes.float64)
  i = b.group_id(0)
  out[i] = X[i].cast(dtypes.float16)
  # just above a tie: rounding to float first lands on the tie, which then rounds to even (down)
  x = np.array([1 + 2**-11 + 2**-40, -(1 + 2**-11 + 2**-40), 2**-25 * (1 + 2**-30), 1024 + 0.5 + 2**-30, 65519.99, 2**-14 * (1 + 2**-11 + 2**-35)])
  got, ref = launch(dev, compiler, b.finish(), [np.zeros(len(x), np.float16), x], [dtypes.float16, dtypes.float64], gs=(len(x), 1, 1))
  np.testing.assert_array_equal(got[0].view(np.uint16), ref[0].view(np.uint16))


SIZES = {1: (dtypes.bool, dtypes.int8, dtypes.uint8), 2: (dtypes.int16, dtypes.uint16, dtypes.float16, dtypes.bfloat16),
         4: (dtypes.int32, dtypes.uint32, dtypes.float32), 8: (dtypes.int64, dtypes.uint64, dtypes.float64)}


@pytest.mark.parametrize("compiler", COMPILERS)
@pytest.mark.parametrize("size", sorted(SIZES))
def test_bitcast(dev, compiler: str, size: int):
  group = SIZES[size]
  b = KernelBuilder(f"bitcast{size}")
  outs = {(s, d): b.buffer(f"o_{s.name}_{d.name}", d) for s in group for d in group}
  ins = {s: b.buffer(f"x_{s.name}", s) for s in group}
  i = b.group_id(0)
  for s in group:
    v = ins[s][i]
    for d in group: outs[(s, d)][i] = v.bitcast(d)
  rng = np.random.default_rng(size)
  raw = rng.integers(0, 2 if size == 1 else 1 << (8 * size), N, dtype=np.uint64 if size == 8 else np.int64)
  if size == 2:  # emulated halves are quieted on the way through float: no signalling NaN bit patterns
    snan = ((raw & 0x7C00) == 0x7C00) & ((raw & 0x3FF) != 0) & ((raw & 0x200) == 0)
    raw[snan] &= ~np.int64(0x7C00)
    snan = ((raw & 0x7F80) == 0x7F80) & ((raw & 0x7F) != 0) & ((raw & 0x40) == 0)  # bfloat16
    raw[snan] &= ~np.int64(0x7F80)
  bits = raw.astype({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[size])
  xs = [bits.view(s.numpy) if s is not dtypes.bool else bits.astype(bool) for s in group]
  arrays = [storage(np.zeros(N), d) for (_, d) in outs] + xs
  got, ref = launch(dev, compiler, b.finish(), arrays, [d for (_, d) in outs] + list(group), gs=(N, 1, 1))
  for n, (s, d) in enumerate(outs):
    np.testing.assert_array_equal(got[n].view(np.uint8), ref[n].view(np.uint8), err_msg=f"{compiler} {s.name}->{d.name}")


# ---------------------------------------------------------------- scalars of every dtype

SCALARS = {dtypes.bool: True, dtypes.int8: -5, dtypes.int16: -30000, dtypes.int32: -(2**31), dtypes.int64: -(2**63) + 3, dtypes.uint8: 250,
           dtypes.uint16: 65535, dtypes.uint32: 2**32 - 2, dtypes.uint64: 2**64 - 1, dtypes.float16: -1.5, dtypes.bfloat16: 2.5,
           dtypes.float32: 3.25, dtypes.float64: -1e300}


@pytest.mark.parametrize("compiler", COMPILERS)
def test_scalars(dev, compiler: str):
  b = KernelBuilder("scalars")
  outs = [b.buffer(f"o_{d.name}", d) for d in ALL]
  sc = [b.scalar(f"s_{d.name}", d) for d in ALL]
  i = b.group_id(0)
  for o, s, d in zip(outs, sc, ALL):
    o[i * 2] = s
    if d is dtypes.bool: o[i * 2 + 1] = s ^ (i < 1)
    else: o[i * 2 + 1] = s + (i + 1).cast(d)
  got, ref = launch(dev, compiler, b.finish(), [storage(np.zeros(4), d) for d in ALL], list(ALL), vals=list(SCALARS.values()), gs=(2, 1, 1))
  for n, d in enumerate(ALL): assert_same(got[n], ref[n], d, what=f"{compiler} scalar {d.name}")


# ---------------------------------------------------------------- control flow

@pytest.mark.parametrize("compiler", COMPILERS)
def test_control_flow(dev, compiler: str):
  b = KernelBuilder("flow")
  out, x, n = b.buffer("out", dtypes.int32), b.buffer("x", dtypes.int32), b.scalar("n", dtypes.int32)
  outf = b.buffer("outf", dtypes.float16)
  i = b.global_id(0)
  acc, h = b.var(0, dtypes.int32), b.var(0.0, dtypes.float16, name="h")
  with b.range(n) as j:                                # a loop with a runtime bound
    with b.if_(((x[i] + j) & 1).eq(0)):
      acc.value = acc.value + j
      with b.range(j, 3) as k:                         # empty when j >= 3
        acc.value = acc.value * 3 + k
    with b.else_():
      with b.if_(j < 2):
        acc.value = acc.value - x[i]
      with b.else_():
        acc.value = acc.value ^ 5
    h.value = h.value + 0.1                            # float16 accumulation: rounded every step
  with b.range(b.const(250, dtypes.uint8), b.const(255, dtypes.uint8)) as u:  # unsigned index near the top of its range
    acc.value = acc.value + u.cast(dtypes.int32)
  with b.range(b.const(2**40, dtypes.int64), b.const(2**40 + 3, dtypes.int64)) as w:
    acc.value = acc.value + (w >> 40).cast(dtypes.int32)
  with b.range(5, 2):                                  # no iterations
    acc.value = acc.value + 1000
  out[i] = acc.value
  outf[i] = h.value
  xs = np.arange(16, dtype=np.int32) * 7 - 20
  got, ref = launch(dev, compiler, b.finish(), [np.zeros(16, np.int32), xs, np.zeros(16, np.float16)],
                    [dtypes.int32, dtypes.int32, dtypes.float16], vals=[6], gs=(4, 1, 1), ls=(4, 1, 1))
  np.testing.assert_array_equal(got[0], ref[0])
  assert_same(got[2], ref[2], dtypes.float16)


@pytest.mark.parametrize("compiler", COMPILERS)
def test_grid_3d(dev, compiler: str):
  b = KernelBuilder("grid3d")
  out, dims = b.buffer("out", dtypes.int32), b.buffer("dims", dtypes.int32)
  gx, gy, gz = (b.global_id(a) for a in range(3))
  width, height = b.num_groups(0) * b.local_size(0), b.num_groups(1) * b.local_size(1)
  flat = (gz * height + gy) * width + gx
  out[flat] = b.local_id(0) + b.local_id(1) * 10 + b.local_id(2) * 100 + b.group_id(0) * 1000 + b.group_id(1) * 10000 + b.group_id(2) * 100000
  for a in range(3):
    dims[flat * 6 + a] = b.num_groups(a)
    dims[flat * 6 + 3 + a] = b.local_size(a)
  gs, ls = (3, 2, 2), (2, 3, 2)
  total = math.prod(gs) * math.prod(ls)
  got, ref = launch(dev, compiler, b.finish(), [np.full(total, -1, np.int32), np.zeros(total * 6, np.int32)], [dtypes.int32] * 2, gs=gs, ls=ls)
  np.testing.assert_array_equal(got[0], ref[0])
  np.testing.assert_array_equal(got[1], ref[1])
  assert (got[0] >= 0).all()


# ---------------------------------------------------------------- shared memory and barriers

@pytest.mark.parametrize("compiler", COMPILERS)
@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.float16, dtypes.bfloat16, dtypes.bool, dtypes.int64], ids=lambda d: d.name)
def test_shared_reverse(dev, compiler: str, dt: DType):
  b = KernelBuilder("reverse")
  out, x = b.buffer("out", dt), b.buffer("x", dt)
  sh = b.shared("tile", dt, 8)
  lid, gid = b.local_id(0), b.global_id(0)
  sh[lid] = x[gid]
  b.barrier()
  out[gid] = sh[b.local_size(0) - 1 - lid]
  xs = storage(np.arange(32) % 5 == 1 if dt is dtypes.bool else np.arange(32) * 0.75 - 3, dt)
  got, ref = launch(dev, compiler, b.finish(), [storage(np.zeros(32), dt), xs], [dt, dt], gs=(4, 1, 1), ls=(8, 1, 1))
  assert_same(got[0], ref[0], dt)


@pytest.mark.parametrize("compiler", COMPILERS)
def test_shared_tree_reduction(dev, compiler: str):
  """A sum per group over a 2-D group: a loop with a barrier in it, and values kept across barriers (spills)."""
  b = KernelBuilder("reduce")
  out, x, scale = b.buffer("out", dtypes.float32), b.buffer("x", dtypes.float32), b.buffer("scale", dtypes.float32)
  sh = b.shared("partial", dtypes.float32, 16)
  lid = b.local_id(1) * b.local_size(0) + b.local_id(0)
  group = b.group_id(0)
  nthreads = b.local_size(0) * b.local_size(1)
  mine = x[group * nthreads + lid] * scale[lid]        # loaded before the barriers, used after: spilled
  sh[lid] = mine
  b.barrier()
  stride = b.var(nthreads >> 1, name="stride")
  with b.range(4):                                     # log2(16) steps, a barrier in each
    s = stride.value
    with b.if_(lid < s):
      sh[lid] = sh[lid] + sh[lid + s]
    b.barrier()
    stride.value = s >> 1
  with b.if_(lid.eq(0)):
    out[group * 2] = sh[0]
  out[group * 2 + 1] = mine + 1.0                     # every thread wrote its own value before: last writer wins
  with b.if_(lid.eq(nthreads - 1)):
    out[group * 2 + 1] = mine
  xs = np.random.default_rng(1).uniform(-1, 1, 16 * 3).astype(np.float32)
  sc = np.arange(16, dtype=np.float32) * 0.5
  got, ref = launch(dev, compiler, b.finish(), [np.zeros(6, np.float32), xs, sc], [dtypes.float32] * 3, gs=(3, 1, 1), ls=(4, 4, 1))
  np.testing.assert_allclose(got[0], ref[0], rtol=1e-6)


# ---------------------------------------------------------------- the LLVM compiler itself

def add1(name: str = "add1", value: float = 1.0) -> Kernel:
  b = KernelBuilder(name)
  out, x = b.buffer("out", dtypes.float32), b.buffer("x", dtypes.float32)
  i = b.global_id(0)
  out[i] = x[i] + value
  return b.finish()


def test_render_is_llvm_ir(dev):
  from plugrt_cpu.llvm import CPULLVMRenderer
  src = dev.compiler_for("LLVM").render(add1())
  assert src == CPULLVMRenderer().render(add1())
  assert "define void @add1(ptr noalias readonly %args, i32 %gid0, i32 %gid1, i32 %gid2)" in src
  assert "fast" not in src and "contract" not in src  # no fast-math: every op rounds as IEEE says


def test_toolchain_names_the_target(dev):
  import llvmlite
  comp = dev.compiler_for("LLVM")
  tc = comp.toolchain()
  text = " ".join(tc)
  if hasattr(comp, "api"):  # PLUGRT_CPU_LIBLLVM: the system's libLLVM compiles (tests/test_libllvm.py)
    assert comp.api.path in text and comp.triple in tc and comp.cpu in tc and "O2" in text
    return
  assert llvmlite.__version__ in text and "LLVM " in text and "O2" in text
  from plugrt_cpu.llvm import host_target
  assert all(part in tc for part in host_target())  # triple, CPU name, CPU features


def test_disk_cache(dev, tmp_path, monkeypatch):
  from plugrt_cpu.llvm import LLVMCompiler
  monkeypatch.setenv("PLUGRT_CACHE_DIR", str(tmp_path))
  monkeypatch.setenv("PLUGRT_CACHE", "1")
  comp = LLVMCompiler(dev.info)  # a fresh compiler: its disk cache opens under tmp_path
  src = comp.render(add1("cached"))
  lib = comp.compile(src)
  assert lib[:4] == b"\x7fELF" and int.from_bytes(lib[16:18], "little") == 1  # ET_REL
  assert list((tmp_path / "cpu-llvm").rglob("*")), "nothing was written to the cache"
  def fail(src: str) -> bytes: raise AssertionError("compiled again instead of hitting the cache")
  monkeypatch.setattr(comp, "compile_uncached", fail)
  assert comp.compile(src) == lib


def test_compile_error(dev):
  comp = dev.compiler_for("LLVM")
  with pytest.raises(CompileError, match="LLVM rejected") as e:
    comp.compile_uncached("define void @f() {\n  %x = add i32 %y, 1\n  ret void\n}\n")
  assert "%y" in str(e.value) and e.value.hint


def test_same_name_kernels_stay_apart(dev):
  a, b = add1("same", 1.0), add1("same", 100.0)
  xs = np.arange(8, dtype=np.float32)
  results = []
  for k in (a, b):
    out = Buffer(dev, 8, dtypes.float32)
    dev.program(k, compiler="LLVM")(out, Buffer.from_numpy(xs, dev), global_size=(2, 1, 1), local_size=(4, 1, 1))
    results.append(out.numpy())
  np.testing.assert_array_equal(results[0], xs + 1)
  np.testing.assert_array_equal(results[1], xs + 100)


def test_load_object_checks_symbols(dev):
  from plugrt_cpu.llvm import load_object
  comp = dev.compiler_for("LLVM")
  lib = comp.compile_uncached("declare void @plugrt_no_such_function()\ndefine void @k() {\n  call void @plugrt_no_such_function()\n  ret void\n}\n")
  with pytest.raises(PluginError, match="plugrt_no_such_function"): load_object(lib, "k")  # MCJIT itself would abort the process
  with pytest.raises(PluginError, match="defines no function"): load_object(comp.compile(comp.render(add1())), "nope")


def test_signed_division_overflow_wraps(dev):
  """MIN / -1 wraps to MIN (and MIN % -1 is 0) instead of trapping like x86's idiv."""
  for dt in (dtypes.int8, dtypes.int32, dtypes.int64):
    b = KernelBuilder(f"divmin_{dt.name}")
    q, r, A, B = b.buffer("q", dt), b.buffer("r", dt), b.buffer("a", dt), b.buffer("b", dt)
    i = b.group_id(0)
    q[i], r[i] = A[i] // B[i], A[i] % B[i]
    q[i + 4], r[i + 4] = A[i] // -1, A[i] % -1
    a = np.array([dt.min, dt.min, -7, 7], dtype=dt.numpy)
    d = np.array([-1, 3, -1, -2], dtype=dt.numpy)
    got, ref = launch(dev, "LLVM", b.finish(), [np.zeros(8, dt.numpy), np.zeros(8, dt.numpy), a, d], [dt] * 4, gs=(4, 1, 1))
    np.testing.assert_array_equal(got[0], ref[0])
    np.testing.assert_array_equal(got[1], ref[1])


def test_large_launch_runs_in_parallel_slices(dev):
  from plugrt_cpu.program import PARALLEL_MIN_THREADS
  n = PARALLEL_MIN_THREADS * 2
  xs = np.arange(n, dtype=np.float32)
  out = Buffer(dev, n, dtypes.float32)
  dev.program(add1("big"), compiler="LLVM")(out, Buffer.from_numpy(xs, dev), global_size=(n // 64, 1, 1), local_size=(64, 1, 1))
  np.testing.assert_array_equal(out.numpy(), xs + 1)


def test_float_literals_are_exact():
  from plugrt_cpu.llvm import CPULLVMRenderer
  r = CPULLVMRenderer()
  assert r.literal(0.1, dtypes.float32) == f"0x{struct.unpack('<Q', struct.pack('<d', float(np.float32(0.1))))[0]:016X}"
  assert r.literal(math.inf, dtypes.float64) == "0x7FF0000000000000"
  assert r.literal(255, dtypes.uint8) == "-1" and r.literal(True, dtypes.bool) == "true"


def test_native_16bit_floats_render_valid_ir(dev):
  """The base renderer's native float16/bfloat16 path (for targets with half math, e.g. GPUs) is IR LLVM accepts."""
  from plugrt_cpu.llvm import CPULLVMRenderer

  class NativeHalf(CPULLVMRenderer):
    emulated = frozenset()

  comp = dev.compiler_for("LLVM")
  for dt in (dtypes.float16, dtypes.bfloat16):
    b = KernelBuilder(f"native_{dt.name}")
    outs = [b.buffer(f"o_{d.name}", d) for d in ALL]
    X = b.buffer("x", dt)
    i = b.group_id(0)
    for o, d in zip(outs, ALL): o[i] = X[i].cast(d) if d is not dt else X[i].bitcast(d)
    for kernel in (b.finish(), alu_kernel(dt)[0]):
      src = NativeHalf().render(kernel)
      assert f" {'half' if dt is dtypes.float16 else 'bfloat'} " in src and "__plugrt_" not in src
      assert comp.compile_uncached(src)[:4] == b"\x7fELF"  # parsed, verified, optimised and emitted


@pytest.mark.parametrize("compiler", COMPILERS)
@pytest.mark.parametrize("dt", [dtypes.int8, dtypes.int32, dtypes.int64, dtypes.uint32, dtypes.uint64], ids=lambda d: d.name)
def test_integer_division_never_traps(dev, compiler: str, dt):
  """x86 traps (SIGFPE) on a zero divisor and on MIN / -1; the CPU backend must not: MIN // -1 wraps, x // 0 is unspecified."""
  b = KernelBuilder("div_traps")
  q, r, A, B = b.buffer("q", dt), b.buffer("r", dt), b.buffer("a", dt), b.buffer("b", dt)
  i = b.group_id(0)
  q[i] = A[i] // B[i]
  r[i] = A[i] % B[i]
  a = np.array([dt.min, 7, dt.max, 5], dt.numpy)
  d = np.array([-1 if dt.kind == "i" else 1, 0, 0, 2], dt.numpy)
  got, ref = launch(dev, compiler, b.finish(), [np.zeros(4, dt.numpy), np.zeros(4, dt.numpy), a, d], [dt, dt, dt, dt], gs=(4, 1, 1))
  assert got[0][0] == ref[0][0] and got[1][0] == 0  # MIN // -1 wraps to MIN
  assert got[0][3] == 2 and got[1][3] == 1


def test_only_straight_line_modules_get_the_fast_code_generator(dev):
  """A module with no branch is code-generated at level 0 (the same instructions for one block, a third of the time);
  anything with a loop or a branch, or past the size limit, at O2. The rule is part of the cache key."""
  from plugrt.compiler.samples import tiny_kernel
  from plugrt_cpu.llvm import STRAIGHT_LINE_MAX_LINES, STRAIGHT_LINE_RULE, straight_line
  comp = dev.compiler_for("LLVM")
  assert straight_line(comp.render(tiny_kernel("sl_tiny")))
  b = KernelBuilder("sl_loop")
  c, x = b.buffer("c", dtypes.float32), b.buffer("x", dtypes.float32)
  c[b.global_id(0)] = x[b.global_id(0)] + 1.0  # a thread loop
  assert not straight_line(comp.render(b.finish()))
  assert not straight_line("define void @k() {\nentry:\n  switch i32 0, label %a []\na:\n  ret void\n}\n")
  assert not straight_line("; x\n" * (STRAIGHT_LINE_MAX_LINES + 1))
  assert STRAIGHT_LINE_RULE in comp.toolchain()
