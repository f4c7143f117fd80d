"""The kernel IR: builder, verifier, listing, interpreter semantics, lowering."""
import dataclasses

import numpy as np
import pytest

from plugrt import Buffer, Device
from plugrt.compiler import interpreter
from plugrt.compiler import samples as K
from plugrt.compiler.interpreter import InterpreterError
from plugrt.compiler.ir import Kernel, KernelBuilder, Ops, UOp, verify
from plugrt.compiler.lowering import serialize_groups
from plugrt.dtype import PtrDType, bf16_to_f32, cast_value, dtypes, f32_to_bf16
from plugrt.errors import IRError


def add1() -> Kernel:
  b = KernelBuilder("add1")
  out, x, n = b.buffer("out", dtypes.float32), b.buffer("x", dtypes.float32), b.scalar("n", dtypes.int32)
  i = b.global_id(0)
  with b.if_(i < n):
    out[i] = x[i] + 1.0
  return b.finish()


def test_builder_and_listing():
  k = add1()
  sig = k.signature
  assert sig.buffers == (dtypes.float32, dtypes.float32) and sig.scalars == (dtypes.int32,) and sig.written == (True, False)
  text = k.dump()
  assert text.splitlines()[0] == "kernel add1"
  assert "IF" in text and "ENDIF" in text and "STORE" in text and "CONST:float32 1.0" in text
  assert add1().dump() == text  # the listing is canonical: it keys caches


def test_interpreter_runs_and_bounds_checks():
  k = add1()
  out, x = np.zeros(10, np.float32), np.arange(10, dtype=np.float32)
  interpreter.run(k, [out, x], (10,), (3, 1, 1), (4, 1, 1))
  assert out.tolist() == list(range(1, 11))
  with pytest.raises(InterpreterError, match="element 10 of 'x', which has 10 elements"):
    interpreter.run(k, [np.zeros(12, np.float32), x], (12,), (3, 1, 1), (4, 1, 1))
  with pytest.raises(TypeError, match="1-D numpy array of float32"):
    interpreter.run(k, [out, x.astype(np.float64)], (10,), (1, 1, 1), (1, 1, 1))


@pytest.mark.parametrize("build, message", [
  (lambda b: b.buffer("x", dtypes.float32)[b.const(1.5)], "index must be an integer"),
  (lambda b: b.alu(Ops.ADD, b.const(1), b.const(1.0)), "operand dtypes differ"),
  (lambda b: b.alu(Ops.IDIV, b.const(1.0), b.const(2.0)), "does not take"),
  (lambda b: b.alu(Ops.SIN, b.const(1)), "does not take"),
  (lambda b: b.buffer("x", dtypes.int8).__setitem__(0, 300), "300 is not a int8"),
  (lambda b: b.const(1) / 2, "does not take"),
  (lambda b: b.scalar("1bad", dtypes.int32), "not a valid identifier"),
  (lambda b: b.const(1).bitcast(dtypes.int64), "differ in size"),
])
def test_builder_rejects(build, message):
  with pytest.raises(IRError, match=message): build(KernelBuilder("k"))


def test_verifier_catches_scoping_and_structure():
  b = KernelBuilder("scoped")
  out = b.buffer("out", dtypes.int32)
  with b.range(4) as i:
    inner = i * 2
  out[0] = inner  # used outside the loop that defines it
  with pytest.raises(IRError, match="outside the block"): b.finish()
  b = KernelBuilder("open")
  with pytest.raises(IRError, match="still open"):
    with b.range(4):
      b.finish()
  c, t = UOp(Ops.CONST, dtypes.int32, (), 1), UOp(Ops.CONST, dtypes.bool, (), True)
  with pytest.raises(IRError, match="never closed"): verify(Kernel("k", (c, t, UOp(Ops.IF, None, (t,)))))
  with pytest.raises(IRError, match="not defined before"): verify(Kernel("k", (UOp(Ops.NEG, dtypes.int32, (c,)),)))
  with pytest.raises(IRError, match="not an identifier"): verify(Kernel("my-kernel", ()))
  with pytest.raises(TypeError, match="truth value"): bool(KernelBuilder("k").const(1) < 2)


def test_else_must_follow_if():
  b = KernelBuilder("k")
  with pytest.raises(IRError, match="directly follow"):
    with b.else_(): pass


def test_ptr_dtype_and_casts():
  assert PtrDType(dtypes.float32) == PtrDType(dtypes.float32) and PtrDType(dtypes.float32) != PtrDType(dtypes.float32, "shared")
  assert cast_value(300, dtypes.uint8) == 44 and cast_value(-1, dtypes.uint32) == 2**32 - 1 and cast_value(2**31, dtypes.int32) == -(2**31)
  x = np.array([1.0, 1.00390625, 1.01171875, 1.0080, np.inf], np.float32)  # 1+2^-8 and 1+3*2^-8 tie: round to even
  assert bf16_to_f32(f32_to_bf16(x)).tolist() == [1.0, 1.0, 1.015625, 1.0078125, np.inf]
  assert np.isnan(bf16_to_f32(f32_to_bf16(np.array([np.nan], np.float32))))[0]


def test_interpreter_integer_semantics():
  b = KernelBuilder("ints")
  out, a, c = b.buffer("out", dtypes.int32), b.buffer("a", dtypes.int32), b.buffer("c", dtypes.int32)
  i = b.global_id(0)
  out[i * 4] = a[i] // c[i]
  out[i * 4 + 1] = a[i] % c[i]
  out[i * 4 + 2] = a[i] >> 1
  out[i * 4 + 3] = a[i] * 65536
  k = b.finish()
  a_, c_ = np.array([7, -7, 7, -7, 2**30], np.int32), np.array([2, 2, -2, -2, 3], np.int32)
  o = np.zeros(20, np.int32)
  interpreter.run(k, [o, a_, c_], (), (5, 1, 1))
  got = o.reshape(5, 4)
  assert got[:4, 0].tolist() == [3, -3, -3, 3]        # truncates toward zero, like C
  assert got[:4, 1].tolist() == [1, -1, 1, -1]        # sign of the dividend
  assert got[:, 2].tolist() == [3, -4, 3, -4, 2**29]  # arithmetic shift
  assert got[4, 3] == 0 and got[0, 3] == 7 * 65536    # wraps


def test_lowering_removes_local_ids_and_barriers():
  for case in (K.reverse_case(), K.reduce_case(), K.grid3d_case(), K.control_case()):
    low = serialize_groups(case.kernel)
    assert not low.has_barrier
    assert not any(u.op is Ops.SPECIAL and u.arg[0] == "local_id" for u in low.uops)
    want = [a.copy() for a in case.inputs]
    interpreter.run(case.kernel, want, case.vals, case.global_size, case.local_size)
    got = [a.copy() for a in case.inputs]
    interpreter.run(low, got, case.vals, case.global_size, case.local_size, serial_groups=True)
    for g, w in zip(got, want): assert np.array_equal(g, w), case.name


def test_lowering_spills_only_what_crosses_a_barrier():
  low = serialize_groups(K.reduce_case().kernel)
  spills = [u for u in low.uops if u.op is Ops.SPILL]
  # crossing barriers: `mine` (a load), the `stride` variable, and `s` (read before the loop's barrier, used after it);
  # thread ids, group ids and constants are recomputed in each segment instead
  assert len(spills) == 3 and {u.dtype.base for u in spills} == {dtypes.int32}


# ---------------------------------------------------------------- regressions, on the serial devices too

#: the devices that run kernels lowered by serialize_groups, with each of their compilers
SERIAL_TARGETS = [("PYTHON", "PY"), ("CPU", "CLANG"), ("CPU", "LLVM")]


def _device(name: str, compiler: str):
  if name not in Device.available() or not Device.registry.compiler_probe(name, compiler).ok:
    pytest.skip(f"{name}:{compiler} is not available here")
  return Device[name]


def clone_scope_case(block: str, use_first: bool = False) -> K.Case:
  """A thread id computed before a barrier and used in the next segment inside an IF, IF/ELSE or RANGE, and after it
  (or before it, `use_first`): the lowering recomputes it there, and the copy made inside the block is out of scope
  after it (and in the else branch)."""
  b = KernelBuilder(f"clone_scope_{block}")
  out, flag, n = b.buffer("out", dtypes.int32), b.scalar("flag", dtypes.bool), b.scalar("n", dtypes.int32)
  i = b.global_id(0)
  out[i] = 0
  b.barrier()
  if use_first: out[i + 64] = 2
  if block == "range":
    with b.range(n) as j: out[i] = out[i] + j
  else:
    with b.if_(flag): out[i] = 1
    if block == "else":
      with b.else_(): out[i] = 3
  if not use_first: out[i + 64] = 2
  return K.Case(f"clone_scope_{block}", b.finish(), [np.full(128, 7, np.int32)], (True, 3), (2, 1, 1), (32, 1, 1))


@pytest.mark.parametrize("block", ["if", "else", "range"])
@pytest.mark.parametrize("device, compiler", SERIAL_TARGETS)
def test_lowering_recomputes_values_in_scope(device: str, compiler: str, block: str):
  dev = _device(device, compiler)
  for use_first in (False, True):
    K.run_case(dev, clone_scope_case(block, use_first), compiler)
  if block == "else":  # the else branch runs too
    K.run_case(dev, dataclasses.replace(clone_scope_case(block), vals=(False, 3)), compiler)


def test_lowering_reuses_a_recomputed_value_inside_later_blocks():
  low = serialize_groups(clone_scope_case("if", use_first=True).kernel).uops
  start = next(n for n, u in enumerate(low) if u.op is Ops.IF)
  assert [u.op for u in low[start:]][:3] == [Ops.IF, Ops.STORE, Ops.ENDIF]  # the thread id from before the IF, not a copy


#: (source, target, value, its correctly rounded result); bfloat16 from an integer rounds to float32 first, as the
#: interpreter (the IR's reference) and the CPU backend do
INT_TO_FLOAT = {
  (dtypes.int64, dtypes.float32): [(2**62 + 2**38 + 1, 2**62 + 2**39),  # through float64: onto the midpoint, then even: 2**62
                                   (2**60 + 2**36 + 1, 2**60 + 2**37), (-(2**62 + 2**38 + 1), -(2**62 + 2**39)),
                                   (2**62 + 2**38, 2**62), (2**62 + 3 * 2**38, 2**62 + 2**40), (2**63 - 1, 2**63), (2**24 + 1, 2**24)],
  (dtypes.uint64, dtypes.float32): [(2**63 + 2**39 + 1, 2**63 + 2**40), (2**64 - 1, 2**64), (2**63 + 2**39, 2**63)],
  (dtypes.int64, dtypes.bfloat16): [(2**62 + 2**54 + 2**38 + 1, 2**62 + 2**55),  # float32: 2**62 + 2**54 + 2**39, past the midpoint
                                    (2**40 + 2**32 + 1, 2**40)],  # float32: 2**40 + 2**32, the midpoint: even
  (dtypes.int64, dtypes.float16): [(65519, 65504), (65520, np.inf), (-2049, -2048), (-2051, -2052), (2**62 + 2**38 + 1, np.inf)],
}


@pytest.mark.parametrize("src, dst", list(INT_TO_FLOAT), ids=lambda d: d.name)
@pytest.mark.parametrize("device, compiler", SERIAL_TARGETS)
def test_integer_to_float_rounds_once(device: str, compiler: str, src, dst):
  xs, want = zip(*INT_TO_FLOAT[(src, dst)])
  b = KernelBuilder(f"{src.name}_to_{dst.name}")
  out, x = b.buffer("out", dst), b.buffer("x", src)
  i = b.global_id(0)
  out[i] = x[i].cast(dst)
  k = b.finish()
  xa = np.array(xs, src.numpy)
  ref = np.zeros(len(xs), dst.numpy)
  interpreter.run(k, [ref, xa], (), (len(xs), 1, 1))
  assert K.as_float(ref, dst).tolist() == list(want)
  dev = _device(device, compiler)
  got = Buffer(dev, len(xs), dst)
  dev.program(k, compiler)(got, Buffer.from_numpy(xa, dev), global_size=(len(xs), 1, 1), wait=True)
  assert K.as_float(got.numpy(), dst).tolist() == list(want)
