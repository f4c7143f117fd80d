"""Test kernels with their inputs, run on a device and checked against the interpreter.

A `Case` is a kernel, its buffers' initial contents, its scalars and its launch
size. `run_case` runs it on a device, runs the reference interpreter on the same
inputs, and compares every written buffer (integers exactly, floats to a number of
ulps that depends on the op), raising AssertionError with the first mismatches.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from plugrt.compiler.ir import _KINDS, BINARY, COMPARE, UNARY, Kernel, KernelBuilder, Ops
from plugrt.dtype import DType, ImageDType, bf16_to_f32, dtypes, f32_to_bf16

FLOATS = (dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64)
INTS = (dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64, dtypes.uint8, dtypes.uint16, dtypes.uint32, dtypes.uint64)
ALL = (dtypes.bool, *INTS, *FLOATS)
TRANSCENDENTAL = frozenset({Ops.EXP2, Ops.LOG2, Ops.SIN})
#: ulps allowed per op: correctly rounded ops are exact; OpenCL and WGSL allow 2.5 ulp for division and sqrt
ULPS = {Ops.DIV: 3, Ops.SQRT: 3, Ops.RECIP: 3, Ops.EXP2: 4, Ops.LOG2: 4, Ops.SIN: 4}


@dataclass
class Case:
  name: str
  kernel: Kernel
  inputs: list[np.ndarray]           # every buffer's initial contents (storage dtype; bfloat16 as raw uint16)
  vals: tuple = ()
  global_size: tuple[int, int, int] = (1, 1, 1)
  local_size: tuple[int, int, int] = (1, 1, 1)
  ulps: dict[int, list[tuple[int, int, int, float]]] = field(default_factory=dict)  # buffer -> [(start, stop, ulps, atol)]
  #: buffer -> [(start, stop, what, operands)]: what a range of an output holds ("IDIV on int8") and the input buffers
  #: (by index) its element start + j was computed from, element j of each; a mismatch there names them
  labels: dict[int, list[tuple[int, int, str, tuple[int, ...]]]] = field(default_factory=dict)


# ---------------------------------------------------------------- inputs

def values(dt: DType, n: int, rng: np.random.Generator, kind: str = "any") -> np.ndarray:
  """n values of dt in storage form. kind: any | nonzero | positive | small | shift."""
  if dt is dtypes.bool: return rng.random(n) < 0.5
  if dt.kind in "iu":
    if kind == "shift": return rng.integers(0, dt.bits, n).astype(dt.numpy)
    x = rng.integers(int(dt.min), int(dt.max), n, dtype=dt.numpy, endpoint=True)
    x[: min(n, 4)] = np.array([0, 1, dt.max, dt.min], dtype=object)[: min(n, 4)].astype(dt.numpy)
    if kind in ("nonzero", "positive"): x[x == 0] = 1
    if kind == "positive" and dt.kind == "i": x = np.where(x < 0, x // -2 + 1, x).astype(dt.numpy)
    return x
  scale = 10.0 ** rng.integers(-2, 3, n)
  x = rng.standard_normal(n) * scale
  if kind == "small": x = np.clip(x, -12, 12)
  if kind in ("nonzero", "positive"): x = np.where(np.abs(x) < 1e-3, 0.5, x)
  if kind == "positive": x = np.abs(x)
  if dt is dtypes.bfloat16: return f32_to_bf16(x.astype(np.float32))
  if dt is dtypes.float16: x = np.clip(x, -6e4, 6e4)
  return x.astype(dt.numpy)


def as_float(arr: np.ndarray, dt: DType) -> np.ndarray:
  return bf16_to_f32(arr).astype(np.float64) if dt is dtypes.bfloat16 else arr.astype(np.float64)


# ---------------------------------------------------------------- comparing

def ulp(dt: DType, x: np.ndarray) -> np.ndarray:
  mant = {dtypes.float16: 10, dtypes.bfloat16: 7, dtypes.float32: 23, dtypes.float64: 52}[dt]
  tiny = {dtypes.float16: 2.0 ** -24, dtypes.bfloat16: 2.0 ** -133, dtypes.float32: 2.0 ** -149, dtypes.float64: 2.0 ** -1074}[dt]
  with np.errstate(all="ignore"):
    e = np.floor(np.log2(np.maximum(np.abs(x), tiny)))
  return np.maximum(2.0 ** (e - mant), tiny)


def show(x: Any, dt: DType) -> str:
  """One stored element as the value it holds (bfloat16's raw bits as the float they encode)."""
  if dt is dtypes.bool: return str(bool(x))
  if dt.kind in "iu": return str(int(x))
  return repr(float(as_float(np.array([x]), dt)[0]))


def compare(what: str, got: np.ndarray, want: np.ndarray, dt: DType, ulps: int = 0, atol: float = 0.0,
            operands: dict[str, tuple[np.ndarray, DType]] | None = None) -> None:
  """Integers and bools exactly; floats within `ulps` ulp (+atol), NaN equal to NaN, inf equal to inf.
  `operands`: name -> (values, dtype) aligned with `got`, shown beside a mismatch."""
  if dt.kind != "f":
    bad = np.nonzero(got != want)[0]
  else:
    g, w = as_float(got, dt), as_float(want, dt)
    same = (g == w) | (np.isnan(g) & np.isnan(w))
    with np.errstate(all="ignore"):
      close = np.isfinite(w) & np.isfinite(g) & (np.abs(g - w) <= ulps * ulp(dt, w) + atol)
    bad = np.nonzero(~(same | close))[0]
  if len(bad):
    def one(i: int) -> str:
      ins = f" (inputs {', '.join(f'{k}={show(v[i], d)}' for k, (v, d) in operands.items())})" if operands else ""
      return f"got {show(got[i], dt)}, want {show(want[i], dt)}{ins}"
    tol = f" (allowed: {ulps} ulp{f' + {atol:g}' if atol else ''})" if ulps or atol else ""
    more = "".join(f"; [{i}] {one(i)}" for i in bad[1:4])
    raise AssertionError(f"{what}: {len(bad)} of {len(got)} differ{tol}, first at [{bad[0]}]: {one(bad[0])}{more}")


# ---------------------------------------------------------------- running

def run_case(device: Any, case: Case, compiler: str | None = None, view_offset: int = 0) -> None:
  """Run `case` on `device` and compare with the interpreter. view_offset: each buffer is a view that many bytes into
  a larger allocation filled with other bytes, which must be left as they were."""
  from plugrt.compiler import interpreter
  from plugrt.device import Buffer
  prg = device.program(case.kernel, compiler)
  sig = case.kernel.signature
  bases, bufs = [], []
  for a, dt in zip(case.inputs, sig.buffers):
    if not view_offset: bufs.append(Buffer(device, len(a), dt).copyin(np.ascontiguousarray(a)))
    else:
      pad = -(-view_offset // dt.itemsize) * dt.itemsize
      base = Buffer(device, len(a) + 2 * pad // dt.itemsize, dt)
      around = np.random.default_rng(len(bases)).integers(0, 256, base.nbytes, dtype=np.uint8)
      base.copyin((around if dt is not dtypes.bool else around & 1).tobytes())
      bases.append((base, base.numpy().tobytes(), len(a) * dt.itemsize))
      bufs.append(base.view(len(a), offset=view_offset).copyin(np.ascontiguousarray(a)))
  prg(*bufs, global_size=case.global_size, local_size=case.local_size, vals=case.vals, wait=True)
  want = [a.copy() for a in case.inputs]
  interpreter.run(case.kernel, want, case.vals, case.global_size, case.local_size)
  for i, (buf, w, written) in enumerate(zip(bufs, want, sig.written)):
    if written: compare_buffer(case, i, buf.numpy(), w)
  for base, before, nbytes in bases:
    after = base.numpy().tobytes()
    if after[:view_offset] != before[:view_offset] or after[view_offset + nbytes:] != before[view_offset + nbytes:]:
      raise AssertionError(f"{case.name}: the kernel wrote outside its buffers, views {view_offset} bytes into {base!r}")


def compare_buffer(case: Case, i: int, got: np.ndarray, want: np.ndarray) -> None:
  """Buffer i of `case`'s results against the reference's, range by range: each labelled range (one op's results)
  on its own, named by what it holds, with the inputs of its first mismatches."""
  sig = case.kernel.signature
  dt, name = sig.buffers[i], case.kernel.buffers[i].arg[1]
  if isinstance(dt, ImageDType): dt = dt.base  # an image compares as its h*w*4 texel values
  tol = case.ulps.get(i, [(0, len(want), 0, 0.0)])
  labels = case.labels.get(i) or [(0, len(want), "", ())]
  for start, stop, what, srcs in labels:
    for lo, hi, nulps, atol in tol:
      a, b = max(lo, start), min(hi, stop)
      if a >= b: continue
      where = f"{case.name}, {name}[{a}:{b}]"
      head = f"{what} ({where})" if what else f"{where} ({dt.name})"
      operands = {case.kernel.buffers[j].arg[1]: (case.inputs[j][a - start:b - start], sig.buffers[j]) for j in srcs}
      compare(head, got[a:b], want[a:b], dt, nulps, atol, operands)


# ---------------------------------------------------------------- the cases

def _elementwise(name: str, n: int) -> tuple[KernelBuilder, Any, Any]:
  b = KernelBuilder(name)
  return b, b.global_id(0), n


def ops_case(dt: DType, n: int = 64, seed: int = 0) -> Case:
  """Every unary and binary op that accepts dt, into one output buffer (op k at [k*n, (k+1)*n))."""
  rng = np.random.default_rng(seed)
  ops = [op for op in sorted(UNARY | BINARY, key=lambda o: o.value) if dt.kind in _KINDS[op] and op not in COMPARE]
  b = KernelBuilder(f"ops_{dt.name}")
  out, cmp = b.buffer("out", dt), b.buffer("cmp", dtypes.bool)
  xa, xb, xp, xs, xh = (b.buffer(nm, dt) for nm in ("a", "b", "p", "s", "h"))
  i = b.global_id(0)
  with b.if_(i < n):
    a, bb, p, s, h = xa[i], xb[i], xp[i], xs[i], xh[i]
    for k, op in enumerate(ops):
      if op in (Ops.SHL, Ops.SHR): r = b.alu(op, a, s)
      elif op in (Ops.LOG2, Ops.SQRT): r = b.alu(op, p)
      elif op in (Ops.EXP2, Ops.SIN): r = b.alu(op, h)
      elif op in UNARY: r = b.alu(op, a)
      else: r = b.alu(op, a, bb)
      out[i + k * n] = r
    for k, op in enumerate(sorted(COMPARE, key=lambda o: o.value)):
      cmp[i + k * n] = b.alu(op, a, bb)
    cmp[i + 4 * n] = b.alu(Ops.CMPEQ, a, a)
  k = b.finish()
  eb = values(dt, n, rng, "nonzero")
  if dt.kind == "i":  # INT_MIN / -1 overflows in hardware
    eb = np.where(eb == -1, 1, eb).astype(dt.numpy)
  inputs = [np.zeros(len(ops) * n, dt.numpy), np.zeros(5 * n, np.bool_), values(dt, n, rng), eb, values(dt, n, rng, "positive"),
            values(dt, n, rng, "shift") if dt.kind in "iu" else values(dt, n, rng), values(dt, n, rng, "small")]
  ulps = {0: [(k * n, (k + 1) * n, ULPS.get(op, 0), _atol(op, dt)) for k, op in enumerate(ops)]} if dt.kind == "f" else {}
  operands = {Ops.SHL: (2, 5), Ops.SHR: (2, 5), Ops.LOG2: (4,), Ops.SQRT: (4,), Ops.EXP2: (6,), Ops.SIN: (6,)}
  labels = {0: [(k * n, (k + 1) * n, f"{op.name} on {dt.name}", operands.get(op, (2,) if op in UNARY else (2, 3))) for k, op in enumerate(ops)],
            1: [*((k * n, (k + 1) * n, f"{op.name} on {dt.name}", (2, 3)) for k, op in enumerate(sorted(COMPARE, key=lambda o: o.value))),
                (4 * n, 5 * n, f"CMPEQ of a value with itself on {dt.name}", (2,))]}
  return Case(k.name, k, inputs, (), (math.ceil(n / 16), 1, 1), (16, 1, 1), ulps, labels)


#: chains of ops whose intermediate results must be brought back into the dtype after every op (rounded for floats,
#: wrapped for integers): (name, the chain over the operand values a, b, c, s, what a fast-math compiler may do to it).
#: Only the last op of a chain may be approximate (DIV), so the chain's result is allowed exactly that op's ulps.
#: "contracts": a compiler allowed to fuse a multiply and an add (one fma, rounded once) computes it differently;
#: "reassociates": one allowed to reassociate float additions may fold it ((a+b)-a becomes b).
_FLOAT_CHAINS = (("(a*b)+c", lambda a, b, c, s: a * b + c, "contracts"), ("(a*b)*c", lambda a, b, c, s: (a * b) * c, ""),
                 ("((a-b)*c)+b", lambda a, b, c, s: (a - b) * c + b, "contracts"), ("(a+b)+c", lambda a, b, c, s: (a + b) + c, ""),
                 ("(a*b)/c", lambda a, b, c, s: (a * b) / c, ""), ("(a+b)-a", lambda a, b, c, s: (a + b) - a, "reassociates"))
_INT_CHAINS = (("(a*b)//c", lambda a, b, c, s: (a * b) // c), ("(a+b)%c", lambda a, b, c, s: (a + b) % c),
               ("((a*b)+a)>>s", lambda a, b, c, s: ((a * b) + a) >> s), ("(a-b)*c", lambda a, b, c, s: (a - b) * c),
               ("(a*a)*b", lambda a, b, c, s: (a * a) * b))


def chain_case(dt: DType, n: int = 64, seed: int = 7, reassociates: bool = False, contracts: bool = False) -> Case:
  """Short chains of ops on dt ((a*b)+c, (a+b)-a, ...), each into its own range of `out`. The IR rounds (floats) or
  wraps (integers) every op's result to its dtype, so a float16/bfloat16 backend that computes in float32 and rounds
  only when it stores, an fma where the IR has a multiply and an add, or an int8 product kept in a 32-bit register
  before a division, gets a different result. Inputs are chosen so that those intermediates need rounding (or wrap).
  reassociates: leave out the chains that a compiler allowed to reassociate float additions may fold; contracts: the
  chains that one allowed to fuse a multiply and an add computes with a single rounding."""
  rng = np.random.default_rng(seed)
  skip = {"contracts"} if contracts else set()
  if reassociates: skip.add("reassociates")
  chains = _INT_CHAINS if dt.kind != "f" else tuple((name, fn) for name, fn, may in _FLOAT_CHAINS if may not in skip)
  b = KernelBuilder(f"chains_{dt.name}")
  out = b.buffer("out", dt)
  xa, xb, xc, xs = (b.buffer(nm, dt) for nm in ("a", "b", "c", "s"))
  i = b.global_id(0)
  with b.if_(i < n):
    a, bb, c, s = xa[i], xb[i], xc[i], xs[i]
    for k, (_, fn) in enumerate(chains): out[i + k * n] = fn(a, bb, c, s)
  k = b.finish()
  if dt.kind == "f":
    # operands of similar magnitude with all mantissa bits set, so products and sums are never exact in dt
    def f(lo: float, hi: float) -> np.ndarray:
      x = rng.uniform(lo, hi, n) * rng.choice([-1.0, 1.0], n)
      if dt is dtypes.bfloat16: return f32_to_bf16(x.astype(np.float32))
      return x.astype(dt.numpy)
    inputs = [np.zeros(len(chains) * n, dt.numpy), f(1.0, 3.0), f(1.0, 3.0), f(0.5, 2.0), np.zeros(n, dt.numpy)]
    ulps = {0: [(k * n, (k + 1) * n, ULPS.get(Ops.DIV, 0) if name.endswith("/c") else 0, 0.0) for k, (name, _) in enumerate(chains)]}
  else:
    c = values(dt, n, rng, "nonzero")
    if dt.kind == "i": c = np.where(c == -1, 3, c).astype(dt.numpy)  # MIN // -1 overflows in hardware
    inputs = [np.zeros(len(chains) * n, dt.numpy), values(dt, n, rng), values(dt, n, rng), c, values(dt, n, rng, "shift")]
    ulps = {}
  labels = {0: [(k * n, (k + 1) * n, f"{name} on {dt.name}", (1, 2, 3, 4) if ">>" in name else (1, 2, 3)) for k, (name, _) in enumerate(chains)]}
  return Case(k.name, k, inputs, (), (math.ceil(n / 16), 1, 1), (16, 1, 1), ulps, labels)


def _atol(op: Ops, dt: DType) -> float:
  if op not in TRANSCENDENTAL: return 0.0
  return {dtypes.float16: 4e-3, dtypes.bfloat16: 3e-2, dtypes.float32: 4e-7, dtypes.float64: 1e-15}[dt]


def cast_case(src: DType, n: int = 48, seed: int = 1, to: Sequence[DType] = ALL) -> Case:
  """src -> every dtype of `to` (default all). Float sources use values every destination can hold (out-of-range casts
  are undefined). A device without some dtype (Metal's float64) passes the others as `to`."""
  rng = np.random.default_rng(seed)
  dests = tuple(to)
  b = KernelBuilder(f"cast_{src.name}")
  outs = [b.buffer(f"to_{d.name}", d) for d in dests]
  xa = b.buffer("a", src)
  xs, xu = (b.buffer("s", src), b.buffer("u", src)) if src.kind == "f" else (xa, xa)
  i = b.global_id(0)
  with b.if_(i < n):
    for o, d in zip(outs, dests):
      x = (xu if d.kind == "u" else xs)[i] if d.kind in "iu" else xa[i]
      o[i] = x.cast(d)
  k = b.finish()
  inputs = [np.zeros(n, d.numpy) for d in dests] + [values(src, n, rng)]
  if src.kind == "f":
    s, u = rng.uniform(-127.9, 127.9, n), rng.uniform(0, 255.9, n)
    s[:4], u[:4] = [0.0, -0.5, 0.75, -127.25], [0.0, 0.5, 1.0, 254.75]
    conv = (lambda x: f32_to_bf16(x.astype(np.float32))) if src is dtypes.bfloat16 else (lambda x: x.astype(src.numpy))
    inputs += [conv(s), conv(u)]
  # float16/bfloat16 from 64-bit sources may round twice on the way; allow one ulp there
  ulps = {j: [(0, n, 1 if src.bits > 24 else 0, 0.0)] for j, d in enumerate(dests) if d.kind == "f"}
  a, s_, u = len(dests), len(dests) + 1, len(dests) + 2
  operand = (lambda d: (u if d.kind == "u" else s_) if d.kind in "iu" else a) if src.kind == "f" else (lambda d: a)
  labels = {j: [(0, n, f"CAST {src.name} -> {d.name}", (operand(d),))] for j, d in enumerate(dests)}
  return Case(k.name, k, inputs, (), (n, 1, 1), (1, 1, 1), ulps, labels)


BITCAST_GROUPS = ((dtypes.int16, dtypes.uint16, dtypes.float16, dtypes.bfloat16), (dtypes.int32, dtypes.uint32, dtypes.float32),
                  (dtypes.int64, dtypes.uint64, dtypes.float64), (dtypes.int8, dtypes.uint8))


def bitcast_case(group: Sequence[DType], n: int = 32, seed: int = 2) -> Case:
  """Each dtype of a same-size group to each other. Inputs are bits of finite floats, so no NaN payload is involved."""
  rng = np.random.default_rng(seed)
  b = KernelBuilder(f"bitcast_{group[0].itemsize * 8}")
  ins = [b.buffer(f"in_{d.name}", d) for d in group]
  outs = {(s, d): b.buffer(f"{s.name}_as_{d.name}", d) for s in group for d in group if s is not d}
  i = b.global_id(0)
  for (s, d), o in outs.items(): o[i] = ins[group.index(s)][i].bitcast(d)
  k = b.finish()
  fl = next((d for d in group if d.kind == "f"), None)
  raw = values(fl, n, rng).view(np.dtype(f"u{group[0].itemsize}")) if fl else rng.integers(0, 256, n * group[0].itemsize).astype(np.uint8)
  inputs = [raw.view(d.numpy).copy() for d in group] + [np.zeros(n, d.numpy) for (_, d) in outs]
  labels = {len(group) + j: [(0, n, f"BITCAST {s.name} -> {d.name}", (group.index(s),))] for j, (s, d) in enumerate(outs)}
  return Case(k.name, k, inputs, (), (n, 1, 1), labels=labels)


def scalar_case(dt: DType, seed: int = 3) -> Case:
  """A scalar argument of dt arrives intact."""
  rng = np.random.default_rng(seed)
  v = values(dt, 5, rng)[2]
  py = bool(v) if dt is dtypes.bool else int(v) if dt.kind in "iu" else float(as_float(np.array([v]), dt)[0])
  b = KernelBuilder(f"scalar_{dt.name}")
  out, s = b.buffer("out", dt), b.scalar("s", dt)
  out[b.global_id(0)] = s
  k = b.finish()
  return Case(k.name, k, [np.zeros(4, dt.numpy)], (py,), (4, 1, 1))


def literal_case(dt: DType) -> Case:
  """Negative literals beside operators (`x - -3`, `-(-3)`, `-2 * x`) and dt's extreme values: renderers inline
  constants, where `x - -3` must not print as `x--3`. dt: a signed integer or a float."""
  b = KernelBuilder(f"literals_{dt.name}")
  out, x = b.buffer("out", dt), b.buffer("x", dt)
  i = b.global_id(0)
  lits = [-3, -1] if dt.kind == "i" else [-2.5, -0.0]
  exprs = [e for c in lits for e in (b.alu(Ops.SUB, x[i], b.const(c, dt)), b.alu(Ops.NEG, b.const(c, dt)),
                                     b.alu(Ops.MUL, b.const(c, dt), x[i]), b.alu(Ops.SUB, b.const(c, dt), x[i]))]
  exprs += [b.alu(Ops.MAX, x[i], b.const(dt.min if dt.kind == "i" else -math.inf, dt)),
            b.alu(Ops.MIN, x[i], b.const(dt.max if dt.kind == "i" else math.inf, dt))]
  for k, e in enumerate(exprs): out[i + 4 * k] = e
  k = b.finish()
  xs = np.array([1, 2, -5, 7], np.float32)
  x_in = f32_to_bf16(xs) if dt is dtypes.bfloat16 else xs.astype(dt.numpy)
  return Case(k.name, k, [np.zeros(4 * len(exprs), dt.numpy), x_in], (), (4, 1, 1))


def bitcast_literal_case(src: DType, dt: DType) -> Case:
  """The bits of constants of src read as dt (same size): renderers that reinterpret through memory need a variable."""
  b = KernelBuilder(f"bitcast_literal_{src.name}_{dt.name}")
  out = b.buffer("out", dt)
  consts = [0.3, -2.5, 1e-3] if src.kind == "f" else [-7, 12345, 1]
  for k, c in enumerate(consts): out[k] = b.const(c, src).bitcast(dt)
  k = b.finish()
  return Case(k.name, k, [np.zeros(len(consts), dt.numpy)], (), (1, 1, 1))


BITCAST_LITERAL_PAIRS = ((dtypes.float32, dtypes.int32), (dtypes.int32, dtypes.float32), (dtypes.float16, dtypes.int16),
                         (dtypes.bfloat16, dtypes.uint16), (dtypes.float64, dtypes.int64))


def control_case(n: int = 40) -> Case:
  """Nested loops, if/else and a register variable."""
  b = KernelBuilder("control")
  out, x = b.buffer("out", dtypes.int32), b.buffer("x", dtypes.int32)
  i = b.global_id(0)
  with b.if_(i < n):
    acc = b.var(0, dtypes.int32)
    with b.range(i % 7) as j:
      with b.if_((j % 2).eq(0)):
        acc.value = acc.value + j * x[i]
      with b.else_():
        with b.range(j, 4) as kk:
          acc.value = acc.value - kk
    with b.if_(acc.value < 0):
      out[i] = -acc.value
    with b.else_():
      out[i] = acc.value + 1000
  k = b.finish()
  return Case(k.name, k, [np.zeros(n, np.int32), np.arange(n, dtype=np.int32) - 20], (), (math.ceil(n / 8), 1, 1), (8, 1, 1))


def reverse_case(group: int = 16, groups: int = 3) -> Case:
  """Shared memory and a barrier: each group reverses its slice."""
  b = KernelBuilder("reverse_groups")
  out, x = b.buffer("out", dtypes.float32), b.buffer("x", dtypes.float32)
  tile = b.shared("tile", dtypes.float32, group)
  lid, gid = b.local_id(0), b.group_id(0)
  tile[lid] = x[b.global_id(0)]
  b.barrier()
  out[gid * group + lid] = tile[group - 1 - lid] * 2.0
  k = b.finish()
  n = group * groups
  return Case(k.name, k, [np.zeros(n, np.float32), np.arange(n, dtype=np.float32)], (), (groups, 1, 1), (group, 1, 1))


def reduce_case(group: int = 32, groups: int = 4) -> Case:
  """A tree reduction per group: a loop whose body has barriers, and a value (`mine`) that lives across them."""
  b = KernelBuilder("reduce_groups")
  out, last, x = b.buffer("out", dtypes.int32), b.buffer("last", dtypes.int32), b.buffer("x", dtypes.int32)
  part = b.shared("part", dtypes.int32, group)
  lid = b.local_id(0)
  mine = x[b.global_id(0)] * 3
  part[lid] = mine
  b.barrier()
  stride = b.var(group // 2, dtypes.int32, "stride")
  with b.range(group.bit_length() - 1):
    s = stride.value
    with b.if_(lid < s):
      part[lid] = part[lid] + part[lid + s]
    b.barrier()
    stride.value = s // 2
  with b.if_(lid.eq(0)):
    out[b.group_id(0)] = part[0]
  last[b.global_id(0)] = mine + lid
  k = b.finish()
  rng = np.random.default_rng(4)
  n = group * groups
  return Case(k.name, k, [np.zeros(groups, np.int32), np.zeros(n, np.int32), rng.integers(-1000, 1000, n).astype(np.int32)], (),
              (groups, 1, 1), (group, 1, 1))


def grid3d_case(gs: tuple[int, int, int] = (3, 2, 2), ls: tuple[int, int, int] = (2, 3, 2)) -> Case:
  """Every thread of a 3-D launch writes its ids where only it writes."""
  b = KernelBuilder("grid3d")
  out = b.buffer("out", dtypes.int32)
  gx, gy, gz = (b.global_id(a) for a in range(3))
  wx, wy = b.num_groups(0) * b.local_size(0), b.num_groups(1) * b.local_size(1)
  flat = (gz * wy + gy) * wx + gx
  out[flat] = gx + gy * 100 + gz * 10000 + b.local_id(1) * 1000000
  k = b.finish()
  n = math.prod(gs) * math.prod(ls)
  return Case(k.name, k, [np.full(n, -1, np.int32)], (), gs, ls)


def vector_case(dt: DType, n: int = 38, seed: int = 12) -> Case:
  """Vector loads and stores (VLOAD, VSTORE) beside the same elements read and written one at a time: each thread takes
  four elements at 4*t (one load of 4, or two of 2 where 4 would pass 16 bytes), permutes them and writes them into
  `vec` with stores of 2 (of 4 where 2 is the only width), and with scalar stores into `one`, which must hold the same;
  vector stores of constants into `lit`; the last n % 4 elements one at a time. Only moves and exact integer and bool
  ops, so every device gives the interpreter's bits."""
  b = KernelBuilder(f"vector_{dt.name}")
  vec, one, lit, x = b.buffer("vec", dt), b.buffer("one", dt), b.buffer("lit", dt), b.buffer("x", dt)
  i = b.global_id(0) * 4
  wide, narrow = (4, 2) if 4 * dt.itemsize <= 16 else (2, 2)
  perm = (3, 0, 2, 1)
  if dt is dtypes.bool: consts: list[Any] = [True, False, False, True]
  elif dt.kind in "iu": consts = [1, 2, int(dt.max), int(dt.min)]
  else: consts = [1.5, -0.25, 0.0, -0.0]

  def change(v: Any, k: int) -> Any:  # exact and different per lane: NOT for bool, + k for ints, a move for floats
    return (~v if k % 2 else v) if dt is dtypes.bool else v + k if dt.kind in "iu" else v
  with b.if_(i + 3 < n):
    got = sum((x.vload(i + s, wide) for s in range(0, 4, wide)), ())
    moved = [change(got[j], k) for k, j in enumerate(perm)]
    for s in range(0, 4, narrow): vec.vstore(i + s, moved[s:s + narrow])
    for k, j in enumerate(perm): one[i + k] = change(x[i + j], k)
    for s in range(0, 4, wide): lit.vstore(i + s, consts[s:s + wide])
  with b.else_():
    with b.range(i, n) as j:
      vec[j], one[j], lit[j] = x[j], x[j], x[j]
  k = b.finish()
  threads = -(-n // 4)
  return Case(k.name, k, [*(np.zeros(n, dt.numpy) for _ in range(3)), values(dt, n, np.random.default_rng(seed))], (),
              (-(-threads // 4), 1, 1), (4, 1, 1))


def saxpy_kernel(dtype: DType = dtypes.float32) -> Kernel:
  """out[i] = a * x[i] + y[i] for i < n: the kernel the demo and benchmarks use."""
  b = KernelBuilder("saxpy")
  out, x, y = b.buffer("out", dtype), b.buffer("x", dtype), b.buffer("y", dtype)
  a, n = b.scalar("a", dtype), b.scalar("n", dtypes.int32)
  i = b.global_id(0)
  with b.if_(i < n):
    out[i] = a * x[i] + y[i]
  return b.finish()


def saxpy_vector_kernel(dtype: DType = dtypes.float32) -> Kernel:
  """saxpy_kernel with vector access: thread t takes elements 4t..4t+3, one vector load of x and of y and one vector
  store (two of 2 for 8-byte dtypes); the thread whose four straddle n does the last n % 4 one at a time. Launch
  ceil(n / 4) threads."""
  b = KernelBuilder("saxpy4")
  out, x, y = b.buffer("out", dtype), b.buffer("x", dtype), b.buffer("y", dtype)
  a, n = b.scalar("a", dtype), b.scalar("n", dtypes.int32)
  i = b.global_id(0) * 4
  w = 4 if 4 * dtype.itemsize <= 16 else 2
  with b.if_(i + 3 < n):
    for k in range(0, 4, w):
      at = i + k if k else i
      out.vstore(at, [a * xv + yv for xv, yv in zip(x.vload(at, w), y.vload(at, w))])
  with b.else_():
    with b.range(i, n) as j:
      out[j] = a * x[j] + y[j]
  return b.finish()


def tiny_kernel(name: str = "tiny") -> Kernel:
  """The smallest useful kernel, for launch overhead: out[0] = x[0] + 1."""
  b = KernelBuilder(name)
  out, x = b.buffer("out", dtypes.float32), b.buffer("x", dtypes.float32)
  out[0] = x[0] + 1.0
  return b.finish()


def image_case(base: DType = dtypes.float32, h: int = 5, w: int = 7) -> Case:
  """Images (TEXEL_LOAD, TEXEL_STORE) on a non-square h x w image, one thread per texel: reads at offsets that leave the
  image on every side (clamped to the edge), arithmetic on the channels, a plain buffer written beside the images, and
  an image `pos` recording each texel's own (x, y): a renderer that swaps x and y, or rows and columns, fails it."""
  img = ImageDType(base, (h, w))
  b = KernelBuilder(f"image_{img.name}")
  dst, pos, out, src = b.buffer("dst", img), b.buffer("pos", img), b.buffer("out", base), b.buffer("src", img)
  x, y = b.global_id(0), b.global_id(1)
  r, g, bl, a = src.read_texel(x - 1, y + 2)
  r2, g2, b2, a2 = src.read_texel(x + 3, y - 1)
  dst.write_texel(x, y, (r + g2, a, bl * 2.0, g - b2))
  pos.write_texel(x, y, (x.cast(base), y.cast(base), (y * w + x).cast(base), a2))
  out[y * w + x] = r2
  k = b.finish()
  rng = np.random.default_rng(11)
  n = h * w * 4
  return Case(k.name, k, [np.zeros(n, base.numpy), np.zeros(n, base.numpy), np.zeros(h * w, base.numpy), values(base, n, rng)], (),
              (1, h, 1), (w, 1, 1))


def image_cases() -> list[Case]:
  """The cases of devices with images (kept out of all_cases: most renderers have none)."""
  return [image_case(dtypes.float32), image_case(dtypes.float16)]


def all_cases() -> list[Case]:
  return [*(ops_case(dt) for dt in ALL), *(chain_case(dt) for dt in ALL if dt is not dtypes.bool),
          *(cast_case(dt) for dt in ALL), *(bitcast_case(g) for g in BITCAST_GROUPS),
          *(scalar_case(dt) for dt in ALL), *(literal_case(dt) for dt in ALL if dt.kind in "if"),
          *(bitcast_literal_case(a, b) for a, b in BITCAST_LITERAL_PAIRS), control_case(), reverse_case(),
          reduce_case(), grid3d_case(), *(vector_case(dt) for dt in ALL)]
