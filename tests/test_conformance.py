"""The conformance suite on every backend this repository ships that runs here."""
from plugrt_testing.conformance import ConformanceSuite


class TestPython(ConformanceSuite):
  device = "PYTHON"


class TestCPU(ConformanceSuite):
  device = "CPU"


def test_a_mismatch_names_what_the_range_holds_and_its_inputs():
  """compare_buffer reports by labelled range: the op (or cast, bitcast) and dtype, the element, got/want as values
  (bfloat16's bits as the float they encode), and the inputs that element came from."""
  import numpy as np
  import pytest

  from plugrt.compiler import samples as K
  from plugrt.dtype import bf16_to_f32, dtypes
  case = K.cast_case(dtypes.bfloat16)
  j = K.ALL.index(dtypes.int8)
  want = np.arange(len(case.inputs[j])).astype(np.int8)
  got = want.copy()
  got[7] += 1
  a = float(bf16_to_f32(case.inputs[len(K.ALL) + 1][7:8])[0])  # int destinations cast from buffer s
  with pytest.raises(AssertionError) as info: K.compare_buffer(case, j, got, want)
  assert str(info.value) == f"CAST bfloat16 -> int8 (cast_bfloat16, to_int8[0:48]): 1 of 48 differ, first at [7]: got 8, want 7 (inputs s={a!r})"
  case = K.chain_case(dtypes.bfloat16)
  want = case.inputs[0].copy()
  got = want.copy()
  got[64 + 3] = K.f32_to_bf16(np.float32(1.5))
  with pytest.raises(AssertionError, match=r"^\(a\*b\)\*c on bfloat16 \(chains_bfloat16, out\[64:128\]\): 1 of 64 differ, first at \[3\]: "
                                           r"got 1.5, want 0.0 \(inputs a=.*, b=.*, c=.*\)$"):
    K.compare_buffer(case, 0, got, want)
