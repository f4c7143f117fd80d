"""The authoring kit: a third-party backend installed with pip passes the conformance
suite, and the suite fails a backend that computes wrong results."""
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def example_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
  """examples/ops_interp installed (as a real distribution, with its entry point) into a private directory."""
  target = tmp_path_factory.mktemp("site")
  subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", str(target),
                  str(REPO / "examples" / "ops_interp")], check=True, capture_output=True)
  return target


def _env(site: Path) -> dict[str, str]:
  return {**os.environ, "PYTHONPATH": str(site) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def test_example_backend_is_discovered(example_site: Path):
  out = subprocess.run([sys.executable, "-m", "plugrt", "devices", "--json"], env=_env(example_site), capture_output=True, text=True, check=True)
  rows = {r["device"]: r for r in json.loads(out.stdout)["backends"]}
  assert rows["INTERP"]["available"] and rows["INTERP"]["package"] == "plugrt-interp" and rows["INTERP"]["version"] == "0.1.0"
  assert rows["INTERP"]["compilers"] == [{"name": "IR", "ok": True, "default": True, "detail": "", "hint": ""}]


def test_example_backend_passes_the_conformance_suite(example_site: Path):
  r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(REPO / "examples" / "ops_interp" / "tests")],
                     env=_env(example_site), capture_output=True, text=True, cwd=example_site)
  assert r.returncode == 0, r.stdout[-3000:]
  assert " passed" in r.stdout and "skipped" not in r.stdout.splitlines()[-1]


def broken_source(wrong: str = "", api_version: str = '"1.1"', probe: str = "lambda: Probe.found(1)", header: str = "") -> str:
  """A backend BROKEN built from the reference backend, its renderer's `_alu` replaced by `wrong` (a method body
  returning the op's Python expression, or None for the reference's)."""
  return f"""{header}
from plugrt.hookspecs import BackendSpec, CompilerSpec, Probe, hookimpl
from plugrt.compiler.ir import BINARY, COMPARE, Ops

@hookimpl
def plugrt_backends():
  return [BackendSpec(name="BROKEN", api_version={api_version}, probe={probe}, compilers=(CompilerSpec("PY"),))]

@hookimpl
def plugrt_allocator(device):
  from plugrt.reference.backend import PythonAllocator
  return PythonAllocator(device)

@hookimpl
def plugrt_compiler(device, compiler):
  from plugrt.reference.backend import PythonCompiler, PythonRenderer, _PY_INFIX
  class Wrong(PythonRenderer):
    def _alu(self, u, s):
{textwrap.indent(wrong or "pass", "      ")}
      return super()._alu(u, s)
  c = PythonCompiler(device)
  c.renderer = Wrong()
  return c

@hookimpl
def plugrt_program(device):
  from plugrt.reference.backend import PythonProgram
  return PythonProgram
"""


#: float32 MUL is off by one part in a million
WRONG_MUL = 'if u.op is Ops.MUL and u.dtype.name == "float32": return f"_r.round_float32({s[0]} * {s[1]} * 1.000001)"'
#: bfloat16 arithmetic stays a Python float (a double) until it is stored: the rounding after each op is forgotten
UNROUNDED_BF16 = ('if u.dtype.name == "bfloat16" and u.op in BINARY and u.op not in COMPARE and u.op in _PY_INFIX:\n'
                  '  return f"({s[0]} {_PY_INFIX[u.op]} {s[1]})"')


def run_suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, source: str, *args: str, suite: str = "") -> pytest.RunResult:
  """Install `source` as plugin module `broken` and run the conformance suite against BROKEN in a fresh process."""
  pytester.makepyfile(broken=source)
  pytester.makepyfile(test_broken="from plugrt_testing.conformance import ConformanceSuite\n\n"
                                  f"class TestBroken(ConformanceSuite):\n  device = 'BROKEN'\n{suite}")
  monkeypatch.setenv("PLUGRT_EXTRA_PLUGINS", "broken")
  monkeypatch.setenv("PYTHONPATH", str(pytester.path) + os.pathsep + os.environ.get("PYTHONPATH", ""))
  return pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider", *args)


def test_the_suite_fails_a_wrong_backend(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
  result = run_suite(pytester, monkeypatch, broken_source(WRONG_MUL), "-k", "test_ops or test_copy_roundtrip or test_control_flow")
  outcomes = result.parseoutcomes()
  failed = [line for line in result.outlines if line.startswith("FAILED")]
  # float32 MUL is wrong: exactly the float32 op kernel fails
  assert len(failed) == 1 and "test_ops[PY-float32]" in failed[0], result.outlines[-20:]
  assert outcomes["passed"] == 13 - 1 + 13 + 1
  # the failure names the IR op, the dtype and the inputs of the first mismatch
  assert re.search(r"MUL on float32 \(ops_float32, out\[\d+:\d+\]\): \d+ of 64 differ, first at \[\d+\]: got -?[\d.e+-]+, want -?[\d.e+-]+ "
                   r"\(inputs a=-?[\d.e+-]+, b=-?[\d.e+-]+\)", result.stdout.str()), result.stdout.str()[-3000:]


def test_an_integer_op_failure_names_the_op_and_inputs(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
  wrong = 'if u.op is Ops.IDIV and u.dtype.name == "int8": return f"_r.wrap_int8({s[0]} // {s[1]})"  # floor, not truncation'
  result = run_suite(pytester, monkeypatch, broken_source(wrong), "-k", "test_ops and int8 and not uint8")
  result.assert_outcomes(failed=1)
  m = re.search(r"IDIV on int8 \(ops_int8, out\[(\d+):(\d+)\]\): \d+ of 64 differ, first at \[(\d+)\]: got (-?\d+), want (-?\d+) "
                r"\(inputs a=(-?\d+), b=(-?\d+)\)", result.stdout.str())
  assert m, result.stdout.str()[-3000:]
  got, want, a, b = (int(x) for x in m.groups()[3:])
  assert got == a // b and want == int(a / b) and got != want  # the inputs shown are the ones that gave the wrong value


def test_the_chain_cases_catch_a_backend_that_does_not_round_each_op(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
  """bfloat16 kept as a double between ops and rounded only when stored: every single op is right (test_ops passes),
  chains of them are not."""
  result = run_suite(pytester, monkeypatch, broken_source(UNROUNDED_BF16), "-k", "bfloat16 and (test_ops or test_chains)")
  failed = [line for line in result.outlines if line.startswith("FAILED")]
  assert len(failed) == 1 and "test_chains[PY-bfloat16]" in failed[0], result.outlines[-20:]
  assert re.search(r"\(a\*b\)\+c on bfloat16 \(chains_bfloat16, out\[0:64\]\): \d+ of 64 differ", result.stdout.str()), result.stdout.str()[-3000:]
  result.assert_outcomes(passed=1, failed=1)


@pytest.mark.parametrize(("kind", "source", "message"), [
  ("import error", broken_source(header="import no_such_module_anywhere"),
   r"BROKEN is not available: module broken failed to import: ModuleNotFoundError: No module named 'no_such_module_anywhere'.* "
   r"\[import error\] \(fix: reinstall broken, or disable it with PLUGRT_DISABLE=broken\)"),
  ("api version", broken_source(api_version='"2.0"'),
   r"BROKEN is not available: BROKEN is written for plugin API '2.0', plugrt implements 1\.\d+: the major versions differ "
   r"\[incompatible plugin API\] \(fix: install versions of plugrt and broken made for each other\)"),
  ("probe raises", broken_source(probe="lambda: 1 // 0"),
   r"BROKEN is not available: probe raised ZeroDivisionError: integer division or modulo by zero.* \[hook error\] "
   r"\(fix: report this to the plugin's authors\)"),
  ("no device", broken_source(probe="lambda: Probe.missing(Reason.NO_DEVICE, 'no /dev/broken0', 'plug one in')",
                              header="from plugrt.errors import Reason"),
   r"BROKEN is not available: no /dev/broken0 \[no device\] \(fix: plug one in\)"),
], ids=["import-error", "api-version", "probe-raises", "no-device"])
def test_an_unavailable_device_fails_the_suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, kind: str, source: str, message: str):
  """A backend that is broken, or has no device here, is not 'skipped' with exit 0: every test fails with the reason."""
  result = run_suite(pytester, monkeypatch, source, "-k", "test_copy_checks or test_ops")
  assert result.ret != 0
  outcomes = result.parseoutcomes()
  assert "skipped" not in outcomes and "passed" not in outcomes and outcomes["errors"] == 1 + 13, result.outlines[-20:]
  assert re.search(message, result.stdout.str()), result.stdout.str()[-3000:]


def test_hardware_optional_skips_only_a_missing_device(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
  no_device = broken_source(probe="lambda: Probe.missing(Reason.NO_DEVICE, 'no /dev/broken0', 'plug one in')",
                            header="from plugrt.errors import Reason")
  result = run_suite(pytester, monkeypatch, no_device, "-k", "test_copy_checks", "-rs", suite="  hardware_optional = True\n")
  result.assert_outcomes(skipped=1)
  assert "BROKEN is not available: no /dev/broken0 [no device] (fix: plug one in)" in result.stdout.str()
  result = run_suite(pytester, monkeypatch, broken_source(probe="lambda: 1 // 0"), "-k", "test_copy_checks", suite="  hardware_optional = True\n")
  result.assert_outcomes(errors=1)  # a raising probe is a broken backend, hardware or not


def test_the_suite_checks_the_entry_module_imports(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
  result = run_suite(pytester, monkeypatch, broken_source(header="import numpy"), "-k", "test_entry_module_imports_only_stdlib")
  result.assert_outcomes(failed=1)
  assert "the entry module broken imports numpy: an entry module imports only the standard library and plugrt" in result.stdout.str()


def test_plugrt_fuzz_runs_the_fuzzer_on_the_suites_device(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
  """Off by default (deselected, not skipped); --plugrt-fuzz=N runs N seeds; a wrong backend fails with a reproducer."""
  result = run_suite(pytester, monkeypatch, broken_source(), "-k", "fuzz")
  assert result.parseoutcomes() == {"deselected": result.parseoutcomes()["deselected"]} and "skipped" not in result.stdout.str()
  result = run_suite(pytester, monkeypatch, broken_source(), "-k", "fuzz", "--plugrt-fuzz=3", "--plugrt-fuzz-seed=100")
  result.assert_outcomes(passed=3)
  result = run_suite(pytester, monkeypatch, broken_source(WRONG_MUL), "-k", "fuzz", "--plugrt-fuzz=6")
  assert result.parseoutcomes().get("failed", 0) >= 1, result.outlines[-20:]
  m = re.search(r"reproduce: python -m pytest '(test_broken.py::TestBroken::test_fuzz\[PY-seed(\d+)\])' --plugrt-fuzz=1 --plugrt-fuzz-seed=(\d+)",
                result.stdout.str())
  assert m and m[2] == m[3], result.stdout.str()[-3000:]
  again = run_suite(pytester, monkeypatch, broken_source(WRONG_MUL), m[1], "--plugrt-fuzz=1", f"--plugrt-fuzz-seed={m[2]}")
  again.assert_outcomes(failed=1)  # the command it prints runs that seed again
