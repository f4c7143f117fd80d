"""The pytest plugin plugrt installs (entry point `pytest11`): fixtures and options for backend
authors, and the `compiler` parametrisation of ConformanceSuite subclasses.

Fixtures:
- `plugrt_registry`: a function building an isolated registry from an explicit list
  of plugin modules and an environment, made the process-wide one in a `with`:

      def test_mine(plugrt_registry):
          with plugrt_registry([my_backend], env={"MYDEV": "1"}) as reg:
              assert reg.default == "MYDEV"

Options:
- `--plugrt-fuzz=N` (and `--plugrt-fuzz-seed=S`, default 0): each ConformanceSuite also runs N seeds
  of plugrt's differential fuzzer (random IR kernels per compiler, random @kernel functions and
  Tensor expressions) on its device, against the reference interpreter, the DSL's semantics and numpy.

A suite's device that is not available fails every test with the registry's reason, detail and hint
(an import error, a wrong API version, a probe that raises, no device): a broken backend never passes
as "skipped". Only a suite that sets `hardware_optional = True` skips, and only when the registry says
the hardware or its toolchain is absent here (a GPU backend on a machine without one).
"""
from __future__ import annotations

from typing import Any

import pytest

#: reasons that say "this machine has no such device (or its driver or toolchain)", not "the backend is broken"
_ABSENT = ("no device", "missing toolchain")


@pytest.fixture
def plugrt_registry() -> Any:
  from plugrt.registry import isolated
  return isolated


def pytest_addoption(parser: pytest.Parser) -> None:
  group = parser.getgroup("plugrt")
  group.addoption("--plugrt-fuzz", type=int, default=0, metavar="N",
                  help="also run N seeds of plugrt's differential fuzzer against each ConformanceSuite's device (default 0: off)")
  group.addoption("--plugrt-fuzz-seed", type=int, default=0, metavar="S", help="the first fuzz seed (default 0)")


def pytest_configure(config: pytest.Config) -> None:
  config.addinivalue_line("markers", "plugrt_unavailable(message): the suite's device cannot be used; the test fails with message")
  config.addinivalue_line("markers", "plugrt_fuzz_off: a fuzz test of a run without --plugrt-fuzz (deselected)")


def _explain(device: str, what: str, probe: Any) -> str:
  reason = f" [{probe.reason.value}]" if probe.reason is not None else ""
  return f"{device}{what} is not available: {probe.detail}{reason}" + (f" (fix: {probe.hint})" if probe.hint else "")


def _fail(message: str) -> Any:
  return pytest.param(None, marks=pytest.mark.plugrt_unavailable(message), id="unavailable")


def _compilers(device: str, wanted: tuple[str, ...] | None, hardware_optional: bool) -> list[Any]:
  """The compiler params for a suite: each usable compiler; a device or compiler that cannot be used fails (one
  param whose tests fail with the registry's reason), or skips where `hardware_optional` and the hardware is absent."""
  from plugrt.errors import PlugrtError
  from plugrt.registry import current
  reg = current()
  try:
    probe = reg.probe(device)
    spec = reg.backend(device).spec
  except PlugrtError as e:
    return [_fail(f"{device}: {e}")]
  if not probe.ok or spec is None:
    message = _explain(device, "", probe)
    if hardware_optional and probe.reason is not None and probe.reason.value in _ABSENT:
      return [pytest.param(None, marks=pytest.mark.skip(reason=message), id="unavailable")]
    return [_fail(message)]
  names = [c.name for c in spec.compilers]
  if wanted is not None and (unknown := [w for w in wanted if w not in names]):
    return [_fail(f"{device} declares no compiler {', '.join(unknown)} (it declares {', '.join(names) or 'none'})")]
  probes = {n: reg.compiler_probe(device, n) for n in names if wanted is None or n in wanted}
  usable = [n for n, p in probes.items() if p.ok]
  params = []
  for name, p in probes.items():
    if p.ok: params.append(pytest.param(name, id=name))
    # a compiler the suite asked for, or the device's only hope, must work; another one may lack its toolchain here
    elif (wanted is None and usable) or (hardware_optional and p.reason is not None and p.reason.value in _ABSENT):
      params.append(pytest.param(name, id=name, marks=pytest.mark.skip(reason=_explain(device, f" compiler {name}", p))))
    else:
      params.append(pytest.param(name, id=name, marks=pytest.mark.plugrt_unavailable(_explain(device, f" compiler {name}", p))))
  return params


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
  cls = metafunc.cls
  if cls is None or "compiler" not in metafunc.fixturenames: return
  from plugrt_testing.conformance import ConformanceSuite
  if not (issubclass(cls, ConformanceSuite) and cls.device): return
  metafunc.parametrize("compiler", _compilers(cls.device, cls.compilers, cls.hardware_optional))
  if "fuzz_seed" in metafunc.fixturenames:
    n, first = metafunc.config.getoption("plugrt_fuzz"), metafunc.config.getoption("plugrt_fuzz_seed")
    seeds = [pytest.param(s, id=f"seed{s}") for s in range(first, first + n)]
    metafunc.parametrize("fuzz_seed", seeds or [pytest.param(None, marks=pytest.mark.plugrt_fuzz_off, id="off")])


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
  """The fuzz tests run only with --plugrt-fuzz=N: otherwise they are deselected (not reported as skipped)."""
  off = [it for it in items if it.get_closest_marker("plugrt_fuzz_off") is not None]
  if off:
    config.hook.pytest_deselected(items=off)
    items[:] = [it for it in items if it.get_closest_marker("plugrt_fuzz_off") is None]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
  if (mark := item.get_closest_marker("plugrt_unavailable")) is not None:
    pytest.fail(mark.args[0], pytrace=False)
