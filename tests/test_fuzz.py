"""Differential fuzzing with fixed seeds (plugrt_testing.fuzz): random IR kernels on every (device, compiler) pair
against the interpreter, random @kernel functions on every device against the DSL's semantics, random Tensor
expressions on every device against numpy. A failure prints the seed and the kernel listing, the source or the
expression; `python scripts/fuzz.py --kinds KIND --seed SEED --count 1` runs it again. The long run is
scripts/fuzz.py, its last result is in docs/fuzzing.md."""
import subprocess
import sys
import textwrap

import pytest

from plugrt_testing import fuzz as F

IR_SEEDS, DSL_SEEDS, TENSOR_SEEDS = range(40), range(25), range(40)
IR_TARGETS = {str(t): t for t in F.ir_targets()}
DEVICES = F.devices()

#: fixed-seed cases that fail on a known bug (fuzz.KNOWN_BUGS) the generators cannot avoid: (kind, seed, target) -> bug.
#: The xfails are strict: once the bug is fixed the case passes, the test fails, and its entry should go. Empty: every
#: bug found so far is fixed.
KNOWN: dict[tuple[str, int, str], str] = {}

#: the cases that found a bug fixed since (docs/fuzzing.md): they run as plain tests, on every target that exists here
FOUND = {
  "c-negative-literal": ("ir", 2, "CPU:CLANG"),
  "lowering-clone-scope": ("ir", 9, "CPU:CLANG"),
  "dsl-infer-narrow": ("dsl", 83, "PYTHON"),
  "float-floordiv": ("dsl", 23, "PYTHON"),
  "wgsl-bool-bitcast": ("ir", 55, "WEBGPU:WGSL"),
  "tensor-bool-arith": ("tensor", 11, "CPU"),
  "webgpu-sin-range": ("tensor", 54, "WEBGPU"),
  "python-trunc-negative-zero": ("ir", 5353, "PYTHON:PY"),
  "wgsl-shl-const-overflow": ("ir", 5361, "WEBGPU:WGSL"),
  "webgpu-flushes-subnormals": ("ir", 5152, "WEBGPU:WGSL"),  # the driver, as WGSL allows: the oracle takes it now
}


def params(kind: str, seeds: range, targets: list[str]) -> list:
  out = []
  for t in targets:
    for s in seeds:
      bug = KNOWN.get((kind, s, t))
      marks = [pytest.mark.xfail(strict=True, reason=f"known bug {bug}: {F.KNOWN_BUGS[bug][0]}")] if bug else []
      out.append(pytest.param(s, t, id=f"{t}-{s}", marks=marks))
  return out


def check(outcomes: list) -> None:
  failed = [o for o in outcomes if o.status == "fail"]
  if failed: pytest.fail("\n\n".join(o.describe() for o in failed), pytrace=False)
  if all(o.status == "skip" for o in outcomes): pytest.skip("; ".join(o.detail for o in outcomes)[:300])


@pytest.mark.parametrize("seed,target", params("ir", IR_SEEDS, list(IR_TARGETS)))
def test_ir(seed: int, target: str) -> None: check(F.run_ir(seed, [IR_TARGETS[target]]))


@pytest.mark.parametrize("seed,target", params("dsl", DSL_SEEDS, DEVICES))
def test_dsl(seed: int, target: str) -> None: check(F.run_dsl(seed, [target]))


@pytest.mark.parametrize("seed,target", params("tensor", TENSOR_SEEDS, DEVICES))
def test_tensor(seed: int, target: str) -> None: check(F.run_tensor(seed, [target]))


@pytest.mark.parametrize("bug", sorted(FOUND))
def test_the_case_that_found_a_fixed_bug(bug: str) -> None:
  kind, seed, target = FOUND[bug]
  if target not in (IR_TARGETS if kind == "ir" else DEVICES): pytest.skip(f"{target} is not available here")
  run = {"ir": F.run_ir, "dsl": F.run_dsl, "tensor": F.run_tensor}[kind]
  check(run(seed, [IR_TARGETS[target] if kind == "ir" else target]))


def test_webgpu_buffers_freed_by_the_cycle_collector() -> None:
  """webgpu-cycle-handle (fixed), in a process of its own as it could abort one: a Buffer in a garbage cycle was
  cached by the allocator after wgpu-py had released its handle, and the next allocation got the dead handle."""
  if "WEBGPU" not in DEVICES: pytest.skip("WEBGPU is not available here")
  code = textwrap.dedent("""
    import gc
    import numpy as np
    from plugrt import Buffer, dtypes
    class Holder: pass
    for k in range(3):
      h = Holder()
      h.buf, h.me = Buffer("WEBGPU", 8, dtypes.int32), h
      del h
      gc.collect()  # finalizes the Buffer and, before the fix, the wgpu buffer (released) in the same collection
      b = Buffer("WEBGPU", 8, dtypes.int32).copyin(np.full(8, k, np.int32))
      assert b.numpy().tolist() == [k] * 8
  """)
  r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
  assert r.returncode == 0, r.stderr[-1500:]


def test_python_backend_casts_int64_to_float32_with_one_rounding() -> None:
  """python-int64-float (fixed): rare in random cases (it needs an integer just past a float32 rounding midpoint)."""
  import numpy as np

  from plugrt import Buffer, Device, dtypes
  from plugrt.compiler import interpreter
  from plugrt.compiler.ir import KernelBuilder
  b = KernelBuilder("i64_to_f32")
  out, x = b.buffer("out", dtypes.float32), b.buffer("x", dtypes.int64)
  out[b.global_id(0)] = x[b.global_id(0)].cast(dtypes.float32)
  k = b.finish()
  xs = np.array([2**62 + 2**38 + 1, 2**60 + 2**36 + 1], np.int64)  # one past the midpoint: float64 rounds onto it, then ties go even
  want = [np.zeros(2, np.float32), xs]
  interpreter.run(k, want, (), (2, 1, 1))
  assert want[0].tolist() == xs.astype(np.float32).tolist()  # numpy rounds once too
  got = Buffer("PYTHON", 2, dtypes.float32)
  Device["PYTHON"].program(k)(got, Buffer.from_numpy(xs, "PYTHON"), global_size=(2, 1, 1), wait=True)
  assert got.numpy().tolist() == want[0].tolist()


def test_generators_are_pure() -> None:
  """A seed is a reproducer: the same seed gives the same case."""
  assert F.ir_case(7).kernel.dump() == F.ir_case(7).kernel.dump()
  assert F.dsl_case(7).source == F.dsl_case(7).source
  a, b = F.tensor_case(7), F.tensor_case(7)
  assert a.src == b.src and (a.want.tobytes() == b.want.tobytes())


def test_flush_to_zero_is_allowed_on_fast_math_devices_only_as_a_flush() -> None:
  """WGSL lets a device flush subnormals to zero (llvmpipe does: log2 of 2**-149 came back as -127, the
  log2 of a flushed 0 being any value there). The oracle accepts, element by element, the result for the
  inputs with their subnormals flushed, or a subnormal result flushed to 0; nothing else."""
  import numpy as np

  from plugrt.compiler import samples as K
  from plugrt.compiler.ir import KernelBuilder
  from plugrt.dtype import dtypes

  b = KernelBuilder("ftz")
  out, x = b.buffer("out", dtypes.float32), b.buffer("x", dtypes.float32)
  s = b.scalar("s", dtypes.float32)
  i = b.global_id(0)
  out[i] = x[i] * s
  sub, normal = np.float32(2.0 ** -140), np.float32(1.5)
  case = K.Case("ftz", b.finish(), [np.zeros(3, np.float32), np.array([sub, -sub, normal], np.float32)], vals=(float(sub),))
  inputs, vals = F.flush_subnormals(case)
  assert inputs[1].tolist() == [0.0, -0.0, 1.5] and np.signbit(inputs[1][1]) and vals == (0.0,)
  assert inputs[0] is case.inputs[0] and case.inputs[1][0] == sub  # the case itself is left alone

  want = np.array([2.0 ** -139, -3.0, np.float32(2.0 ** -130)], np.float32)
  want_ftz = np.array([0.0, -3.0, 0.0], np.float32)
  ok = np.array([0.0, -3.0, 0.0], np.float32)  # followed want_ftz, or flushed the subnormal result
  assert F.flush_tolerant(ok, want, want_ftz, dtypes.float32).tolist() == ok.tolist()
  assert F.flush_tolerant(want, want, want_ftz, dtypes.float32).tolist() == want.tolist()  # no flushing is fine too
  wrong = np.array([1.0, -2.0, 5.0], np.float32)
  ref = F.flush_tolerant(wrong, want, want_ftz, dtypes.float32)
  with pytest.raises(AssertionError, match="3 of 3 differ"): K.compare("ftz", wrong, ref, dtypes.float32)
  ints = F.flush_tolerant(np.array([0, 7], np.int32), np.array([1, 7], np.int32), np.array([0, 7], np.int32), dtypes.int32)
  assert ints.tolist() == [0, 7]


def test_python_trunc_keeps_negative_zero() -> None:
  """python-trunc-negative-zero (fixed): TRUNC of -0.5 is -0.0, whose bits a BITCAST shows."""
  import numpy as np

  from plugrt import Device
  from plugrt.compiler.ir import KernelBuilder
  from plugrt.device import Buffer
  from plugrt.dtype import dtypes
  b = KernelBuilder("trunc_sign")
  out, x = b.buffer("out", dtypes.int32), b.buffer("x", dtypes.float32)
  i = b.global_id(0)
  out[i] = x[i].trunc().bitcast(dtypes.int32)
  xs = np.array([-0.5, -0.0, 0.5, -1.5], np.float32)
  got = Buffer("PYTHON", 4, dtypes.int32)
  Device["PYTHON"].program(b.finish())(got, Buffer.from_numpy(xs, "PYTHON"), global_size=(4, 1, 1), wait=True)
  assert got.numpy().tolist() == np.trunc(xs).view(np.int32).tolist() == [-(1 << 31), -(1 << 31), 0, np.float32(-1.0).view(np.int32)]
