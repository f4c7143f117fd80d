"""A pytest plugin that makes QCOM, on one fake KGSL, a device of the process's registry for a whole test session, so
the tests that run "on every available device" (tests/test_dsl.py, tests/test_tensor.py) run on QCOM too:

    PYTHONPATH=$PYTHONPATH:plugins/ops_qcom/tests python -m pytest -p qcom_session tests/test_dsl.py tests/test_tensor.py -k QCOM

`--qcom-chip a740` fakes an Adreno 740 (the A7XX command stream) instead of the default Adreno 630 (A6XX).

The registry is the usual one (every installed plugin, the process's environment) with plugrt-qcom's own entry point
disabled and the fake-backed QCOM (qcom_fixtures.fake_plugins) in its place."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

_undo: list[Callable[[], None]] = []


def pytest_addoption(parser: Any) -> None:
  parser.addoption("--qcom-chip", default="a630", choices=("a630", "a740"), help="the Adreno the fake KGSL reports (a740: the A7XX stream)")


def pytest_configure(config: Any) -> None:
  from fake_kgsl import CHIPS, FakeKGSL
  from qcom_fixtures import ENV, fake_plugins

  from plugrt_testing.fakegpu import use_fake_for_session
  fake = FakeKGSL(chip_id=CHIPS[config.getoption("--qcom-chip")])
  env = {k: v for k, v in ENV.items() if k != "QCOM"}
  _undo.append(use_fake_for_session(fake, fake_plugins(fake)[:1], env, ("plugrt-qcom",)))


def pytest_unconfigure(config: Any) -> None:
  if _undo: _undo.pop()()
