"""A pytest plugin that makes QCOM, on one fake KGSL, a device of the process's registry for a whole test session, so
the tests that run "on every available device" (tests/test_dsl.py, tests/test_tensor.py) run on QCOM too:

    PYTHONPATH=$PYTHONPATH:plugins/ops_qcom/tests python -m pytest -p qcom_session tests/test_dsl.py tests/test_tensor.py -k QCOM

The registry is the usual one (every installed plugin, the process's environment) with plugrt-qcom's own entry point
disabled and the fake-backed QCOM (qcom_fixtures.fake_plugins) in its place."""
from __future__ import annotations

import os
from typing import Any

_session: list[Any] = []


def pytest_configure(config: Any) -> None:
  from fake_kgsl import FakeKGSL
  from qcom_fixtures import ENV, fake_plugins

  from plugrt.registry import Registry, use
  fake = FakeKGSL()
  env = {**os.environ, **{k: v for k, v in ENV.items() if k != "QCOM"}}
  env["PLUGRT_DISABLE"] = ",".join(filter(None, [env.get("PLUGRT_DISABLE", ""), "plugrt-qcom"]))
  reg = Registry(plugins=fake_plugins(fake)[:1], env=env, autoload=True)
  ctx = use(reg)
  ctx.__enter__()
  _session.extend([fake, reg, ctx])


def pytest_unconfigure(config: Any) -> None:
  if _session:
    fake, reg, ctx = _session
    ctx.__exit__(None, None, None)
    reg.close()
    fake.shutdown()
