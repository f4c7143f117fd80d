"""The pytest plugin plugrt installs (entry point `pytest11`): fixtures for backend
authors, and the `compiler` parametrisation of ConformanceSuite subclasses.

Fixtures:
- `plugrt_registry`: a function building an isolated registry from an explicit list
  of plugin modules and an environment, made the process-wide one in a `with`:

      def test_mine(plugrt_registry):
          with plugrt_registry([my_backend], env={"MYDEV": "1"}) as reg:
              assert reg.default == "MYDEV"
"""
from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture
def plugrt_registry() -> Any:
  from plugrt.registry import isolated
  return isolated


def _compilers(device: str, wanted: tuple[str, ...] | None) -> list[Any]:
  """The compiler params for a suite: each usable compiler, or one skipping param that says why."""
  from plugrt.errors import PlugrtError
  from plugrt.registry import current
  reg = current()
  try:
    probe = reg.probe(device)
    spec = reg.backend(device).spec
  except PlugrtError as e:
    return [pytest.param(None, marks=pytest.mark.skip(reason=f"{device}: {e}"), id="unavailable")]
  if not probe.ok or spec is None:
    return [pytest.param(None, marks=pytest.mark.skip(reason=f"{device} is not available: {probe.detail}"), id="unavailable")]
  params = []
  for c in spec.compilers:
    if wanted is not None and c.name not in wanted: continue
    p = reg.compiler_probe(device, c.name)
    params.append(pytest.param(c.name, id=c.name) if p.ok else
                  pytest.param(c.name, id=c.name, marks=pytest.mark.skip(reason=f"{device} compiler {c.name}: {p.detail}")))
  return params


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
  cls = metafunc.cls
  if cls is None or "compiler" not in metafunc.fixturenames: return
  from plugrt.testing.conformance import ConformanceSuite
  if issubclass(cls, ConformanceSuite) and cls.device:
    metafunc.parametrize("compiler", _compilers(cls.device, cls.compilers))
