"""Differential fuzzing: random kernels and Tensor expressions on every available device, checked against references.

Three generators, each a pure function of an integer seed (it seeds a numpy Generator):

- `ir_case(seed)`: a random IR kernel (KernelBuilder) with its inputs and launch size, as a `kernels.Case`. It is
  run by every (device, compiler) pair and compared with the reference interpreter (plugrt.compiler.interpreter).
- `dsl_case(seed)`: the Python source of a random @kernel function, with inputs, and the outputs an independent
  Python evaluator of the DSL's documented semantics computes (int32 wrap after every op, Python's floor `//`
  and `%`, float32 rounding per op). The source is written to a file, imported, and launched on every device.
- `tensor_case(seed)`: a random Tensor expression (broadcasting, elementwise ops, casts, where, reductions,
  matmul, views), evaluated by plugrt on every device and by numpy in the dtypes plugrt's promotion picks.

Every case stays inside defined behaviour: nonzero divisors (`b | 1`), shift amounts masked to bits-1,
float->int casts only of values clamped into range and not NaN, MAX/MIN never see NaN, no races. Approximate
float ops (EXP2/LOG2/SIN, and DIV/SQRT/RECIP on devices not in EXACT_DEVICES) never feed comparisons, WHERE
conditions, float->int casts or other discontinuous ops: the generators track which values are exact. The
MAX/MIN of two zeros may be either zero on different devices, so such values never reach a division, a
reciprocal or a bitcast. Integers and bools compare exactly, floats to a tolerance that follows the ops.

`run_ir(seed)`, `run_dsl(seed)` and `run_tensor(seed)` run one case everywhere and return one `Outcome` per
target; a failed outcome's `repro` holds what is needed to reproduce it (seed, listing or source).

The package, by kind: `values` (inputs with edge values), `ir_cases`, `dsl_cases` (with `dsl_reference`, the
independent evaluator of the DSL's semantics) and `tensor_cases` (one generator and runner each), `compare` (results
against references, within error bounds), `targets` (where cases run) and `outcomes` (what a run reports). Everything
a caller uses is importable from `plugrt_testing.fuzz` itself.

KNOWN_BUGS lists the bugs this fuzzer found that are not fixed yet (none now: docs/fuzzing.md has those it found and
how each was fixed). The generators leave out what triggers the avoidable ones unless told to (`avoid=frozenset()`),
so that a frequent known bug does not hide others. The tests
(tests/test_fuzz.py) run fixed seeds; scripts/fuzz.py is the long run; docs/fuzzing.md has the details.
"""
from __future__ import annotations

from plugrt.compiler import samples as K
from plugrt_testing.fuzz.compare import compare_within_error, flush_subnormals, flush_tolerant
from plugrt_testing.fuzz.dsl_cases import DSLCase, dsl_case, load_dsl, run_dsl
from plugrt_testing.fuzz.ir_cases import ir_case, ir_repro, run_ir
from plugrt_testing.fuzz.outcomes import AVOIDABLE, KNOWN_BUGS, Outcome, classify
from plugrt_testing.fuzz.targets import EXACT_DEVICES, FAST_MATH_DEVICES, Target, devices, ir_targets
from plugrt_testing.fuzz.tensor_cases import TensorCase, run_tensor, tensor_case
from plugrt_testing.fuzz.values import fuzz_values

ALL = K.ALL
FLOATS, INTS = K.FLOATS, K.INTS

__all__ = ["ALL", "AVOIDABLE", "EXACT_DEVICES", "FAST_MATH_DEVICES", "FLOATS", "INTS", "KNOWN_BUGS", "DSLCase", "Outcome", "Target",
           "TensorCase", "classify", "compare_within_error", "devices", "dsl_case", "flush_subnormals", "flush_tolerant", "fuzz_values",
           "ir_case", "ir_repro", "ir_targets", "load_dsl", "repro", "run_dsl", "run_ir", "run_tensor", "tensor_case"]


def repro(kind: str, seed: int, target: str, avoid: frozenset[str] = AVOIDABLE) -> str:
  """What reproduces a case of `kind` on `target` ("CPU:CLANG", "WEBGPU", ...): for failures found outside run_*."""
  ed = target.split(":")[0] in EXACT_DEVICES
  if kind == "ir": return ir_repro(seed, ir_case(seed, ed, avoid), ed, avoid)
  if kind == "dsl": return dsl_case(seed, ed, avoid, target.split(":")[0] in FAST_MATH_DEVICES).repro()
  return tensor_case(seed, ed, avoid).repro()
