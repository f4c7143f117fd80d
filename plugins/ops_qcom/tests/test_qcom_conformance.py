"""The conformance suite on QCOM, end to end through the real submission path against the fake KGSL, once on a faked
Adreno 630 (the A6XX stream) and once on a faked Adreno 740 (the A7XX stream): every kernel is rendered as the OpenCL
C Qualcomm's driver would compile, packed into a program binary by the stand-in compiler, loaded, launched through
plugrt-qcom's command stream and GPU_COMMAND, decoded and checked by the fake's command processor (with the chip's
register map) and run with the reference interpreter. What this cannot check (the driver's compiler, the hardware's
execution) is listed in docs/backends/qcom.md."""
from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
from fake_kgsl import CHIPS
from qcom_fixtures import fake_qcom

from plugrt.dtype import dtypes
from plugrt_testing.conformance import ConformanceSuite


class _OnInstances:
  """The device's name on a test instance, "" on the class: plugrt's pytest plugin parametrizes a suite class by the
  process's registry, which has no Adreno; this module parametrizes the compiler itself and opens QCOM on the fake."""
  def __get__(self, obj: Any, cls: Any) -> str: return "QCOM" if obj is not None else ""


class TestQCOMConformance(ConformanceSuite):
  device = _OnInstances()  # type: ignore[assignment]
  unsupported_dtypes = (dtypes.float64,)  # Adreno's OpenCL has no cl_khr_fp64

  @pytest.fixture(params=["CL"])
  def compiler(self, request: pytest.FixtureRequest) -> str: return request.param

  @pytest.fixture(params=sorted(CHIPS))
  def chip(self, request: pytest.FixtureRequest) -> int: return CHIPS[request.param]

  @pytest.fixture
  def dev(self, compiler: str, chip: int) -> Any:
    with fake_qcom(chip_id=chip) as (kg, dev):
      assert dev.info.state.gen is kg.gen  # the stream plugrt writes is the one the fake's command processor reads
      yield dev

  def test_fuzz(self) -> None:  # type: ignore[override]
    pytest.skip("the differential fuzzer opens devices by name in the process's registry, which has no Adreno")

  def test_entry_module_imports_only_stdlib(self) -> None:
    code = ("import importlib, json, sys\nimport plugrt.registry\nbefore = set(sys.modules)\nimportlib.import_module('plugrt_qcom')\n"
            "from plugrt._entrypoints import foreign_modules\nprint(json.dumps(foreign_modules(sorted(set(sys.modules) - before), 'plugrt_qcom')))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == []
