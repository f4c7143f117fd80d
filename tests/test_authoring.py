"""The authoring kit: a third-party backend installed with pip passes the conformance
suite, and the suite fails a backend that computes wrong results."""
import json
import os
import subprocess
import sys
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


BROKEN = '''
from plugrt.hookspecs import BackendSpec, CompilerSpec, Probe, hookimpl
from plugrt.ir import Ops

@hookimpl
def plugrt_backends():
  return [BackendSpec(name="BROKEN", api_version="1.0", probe=lambda: Probe.found(1), compilers=(CompilerSpec("PY"),))]

@hookimpl
def plugrt_allocator(device):
  from plugrt.reference.backend import PythonAllocator
  return PythonAllocator(device)

@hookimpl
def plugrt_compiler(device, compiler):
  from plugrt.reference.backend import PythonCompiler, PythonRenderer
  class Wrong(PythonRenderer):  # float32 MUL is off by one part in a million
    def _alu(self, u, s):
      if u.op is Ops.MUL and u.dtype.name == "float32": return f"_r.round_float32({s[0]} * {s[1]} * 1.000001)"
      return super()._alu(u, s)
  c = PythonCompiler(device)
  c.renderer = Wrong()
  return c

@hookimpl
def plugrt_program(device):
  from plugrt.reference.backend import PythonProgram
  return PythonProgram
'''


def test_the_suite_fails_a_wrong_backend(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
  pytester.makepyfile(broken_backend=BROKEN)
  pytester.makepyfile(test_broken="from plugrt.testing.conformance import ConformanceSuite\n\n"
                                  "class TestBroken(ConformanceSuite):\n  device = 'BROKEN'\n")
  monkeypatch.setenv("PLUGRT_EXTRA_PLUGINS", "broken_backend")
  monkeypatch.setenv("PYTHONPATH", str(pytester.path) + os.pathsep + os.environ.get("PYTHONPATH", ""))
  result = pytester.runpytest_subprocess("-q", "-k", "test_ops or test_copy_roundtrip or test_control_flow")
  outcomes = result.parseoutcomes()
  failed = [line for line in result.outlines if line.startswith("FAILED")]
  # float32 MUL is wrong: exactly the float32 op kernel fails
  assert len(failed) == 1 and "test_ops[PY-float32]" in failed[0], result.outlines[-20:]
  assert outcomes["passed"] == 13 - 1 + 13 + 1
  assert "ops_float32: buffer out" in result.stdout.str()
