"""A pytest plugin that makes AMD, on one fake KFD, a device of the process's registry for a whole test session, so
the tests that run "on every available device" (tests/test_dsl.py, tests/test_tensor.py) run on AMD too, through
plugrt-amd's real command path (code objects from AMD_LLVM in VRAM, AQL dispatches, SDMA copies):

    PYTHONPATH=$PYTHONPATH:plugins/ops_amd/tests python -m pytest -p amd_session tests/test_dsl.py tests/test_tensor.py -k AMD

The registry is the usual one (every installed plugin, the process's environment) with plugrt-amd's and
plugrt-amd-kfd's own entry points disabled and the fake-backed AMD (amd_fixtures.fake_plugins) in their place."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

_undo: list[Callable[[], None]] = []


def pytest_configure(config: Any) -> None:
  from amd_fixtures import ENV, fake_plugins
  from fake_kfd import FakeKFD

  from plugrt_testing.fakegpu import use_fake_for_session
  fake = FakeKFD()
  env = {k: v for k, v in ENV.items() if k not in ("AMD", "AMD_LLVM")}
  _undo.append(use_fake_for_session(fake, fake_plugins(fake)[:2], env, ("plugrt-amd", "plugrt-amd-kfd")))


def pytest_unconfigure(config: Any) -> None:
  if _undo: _undo.pop()()
