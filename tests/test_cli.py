"""The plugrt command."""
import io
import json
import subprocess
import sys

import pytest

from plugrt.errors import PlugrtError


def plugrt(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
  import os
  return subprocess.run([sys.executable, "-m", "plugrt", *args], capture_output=True, text=True, env={**os.environ, **(env or {})})


def test_devices_explains_every_backend():
  r = plugrt("devices")
  assert r.returncode == 0, r.stderr
  lines = r.stdout.splitlines()
  assert lines[0].split() == ["DEVICE", "PACKAGE", "VERSION", "STATUS", "DEFAULT", "COMPILERS", "INTERFACES"]
  rows = {line.split()[0]: line for line in lines[1:] if line and line.split()[0].isupper()}
  for name in ("CPU", "PYTHON", "CUDA", "NV", "AMD", "QCOM", "METAL", "CL", "WEBGPU"): assert name in rows
  assert "ready" in rows["CPU"] and "*" in rows["CPU"] and "CLANG*" in rows["CPU"]
  assert "no device" in rows["METAL"] and "METAL: Metal needs macOS" in r.stdout  # plugrt-metal is installed; this is Linux
  assert "default device: CPU" in r.stdout


def test_devices_json_and_env_selection():
  r = plugrt("devices", "--json", env={"PYTHON": "1"})
  data = json.loads(r.stdout)
  assert data["default"] == "PYTHON" and data["environment_error"] is None
  rows = {b["device"]: b for b in data["backends"]}
  assert rows["PYTHON"]["default"] and not rows["CPU"]["default"]
  assert rows["METAL"]["reason"] == "no device" and rows["METAL"]["detail"].startswith("Metal needs macOS") and rows["METAL"]["hint"]
  assert rows["CUDA"]["reason"] in ("not installed", "no device") and rows["CUDA"]["hint"]  # installed in CI, without a GPU


def test_devices_reports_a_bad_environment_but_still_lists():
  r = plugrt("devices", env={"CPU": "1", "PYTHON": "1"})
  assert r.returncode == 2
  assert r.stderr.startswith("plugrt: environment: CPU=1 and PYTHON=1 ask for different default devices")  # an error: stderr
  assert "default device: none" in r.stdout and "ask for different" not in r.stdout
  j = plugrt("devices", "--json", env={"CPU": "1", "PYTHON": "1"})
  assert j.returncode == 2 and "ask for different default devices" in json.loads(j.stdout)["environment_error"]
  assert "ask for different default devices" in j.stderr


@pytest.mark.parametrize("cmd", [("devices",), ("devices", "--json"), ("doctor", "--device", "PYTHON"), ("bench", "--json", "--device", "PYTHON"),
                                 ("doctor",)])
@pytest.mark.parametrize("env", [{"CPU": "1", "PYTHON": "1"}, {"DEV": "PYTHON:1"}, {"DEV": "CUDDA"}])
def test_errors_go_to_stderr_and_json_stays_pure(cmd, env):
  """An environment error (two defaults, an index that does not exist, an unknown device) goes to stderr in every
  command, exit 2; stdout holds the result alone (strict JSON with --json)."""
  if cmd == ("doctor",) and env != {"DEV": "PYTHON:1"}: pytest.skip("the same path as doctor --device PYTHON")
  if cmd[0] == "bench" and env == {"DEV": "PYTHON:1"}: pytest.skip("bench measures the devices named, whatever the default")
  r = plugrt(*cmd, env=env)
  assert r.returncode == 2, r.stdout + r.stderr
  assert r.stderr.startswith("plugrt: "), r.stderr
  error = r.stderr.splitlines()[0].removeprefix("plugrt: ").removeprefix("environment: ").split(" (fix: ")[0]
  if cmd == ("devices", "--json"): assert json.loads(r.stdout, parse_constant=_refuse)["environment_error"].startswith(error)
  elif "--json" in cmd: assert r.stdout == ""  # no result to write: nothing on stdout, not a half document
  else: assert error not in r.stdout, r.stdout


def test_an_index_that_does_not_exist_lists_the_indices_that_do():
  r = plugrt("devices", "--json", env={"DEV": "PYTHON:1"})
  err = json.loads(r.stdout)["environment_error"]
  assert "PYTHON:1 does not exist: PYTHON has 1 device here" in err and "available: PYTHON:0" in err, err


@pytest.mark.parametrize("cmd", [("devices",), ("doctor",), ("bench", "--quick", "--device", "PYTHON"), ("bench", "--json")])
def test_an_environment_error_is_reported_once_and_fails(cmd):
  r = plugrt(*cmd, env={"CPU": "1", "PYTHON": "1"})
  assert r.returncode == 2, r.stdout + r.stderr
  assert (r.stdout + r.stderr).count("ask for different default devices") == 1, r.stdout + r.stderr
  assert "FAILED" not in r.stdout


def test_missing_compiler_is_explained():
  r = plugrt("devices", "--json", env={"CC": "/nonexistent/cc"})
  cpu = {b["device"]: b for b in json.loads(r.stdout)["backends"]}["CPU"]
  clang = next(c for c in cpu["compilers"] if c["name"] == "CLANG")
  assert clang["ok"] is False and "CC=/nonexistent/cc" in clang["detail"] and cpu["available"]
  assert next(c for c in cpu["compilers"] if c["name"] == "LLVM")["default"]  # LLVM takes over


def test_doctor_runs_kernels_on_every_device():
  r = plugrt("doctor", "--device", "PYTHON", "--device", "CPU")
  assert r.returncode == 0, r.stdout + r.stderr
  lines = r.stdout.splitlines()
  assert lines[0].startswith("devices ready: ") and "CPU (default)" in lines[0] and "PYTHON" in lines[0]  # the verdict first
  assert lines[1].startswith("kernels passed: ") and "PYTHON:PY" in lines[1] and "CPU:CLANG" in lines[1]
  assert ": ok in" not in r.stdout and "plugrt doctor --verbose" in lines[-1]  # the figures are behind --verbose
  v = plugrt("doctor", "--verbose", "--device", "PYTHON", "--device", "CPU")
  assert v.returncode == 0 and v.stdout.splitlines()[:2] == lines[:2]
  assert "DEVICE  PACKAGE" in v.stdout and v.stdout.count(": ok in") >= 2 and "video decoders" in v.stdout


def test_doctor_is_short_with_one_line_per_unavailable_backend():
  r = plugrt("doctor", "--device", "PYTHON")
  assert r.returncode == 0, r.stdout + r.stderr
  rows = {b["device"]: b for b in json.loads(plugrt("devices", "--json").stdout)["backends"]}
  missing = [d for d, b in rows.items() if not b["available"]]
  body = r.stdout.split("\nunavailable:\n")[1].split("\n\n")[0].splitlines() if missing else []
  assert [line.split()[0] for line in body] == missing
  for line in body:
    row = rows[line.split()[0]]
    assert row["detail"] in line and (not row["hint"] or f"fix: {row['hint']}" in line)
  assert len(r.stdout.splitlines()) <= 6 + len(missing), r.stdout  # the verdict, the unavailable, the pointer to --verbose


def test_doctor_and_devices_list_a_mistyped_device_variable():
  r = plugrt("doctor", "--device", "PYTHON", env={"CUDAA": "1"})
  assert r.returncode == 0 and "warning: CUDAA=1 is not a device; did you mean CUDA=1?" in r.stdout.split("\n\n")[0], r.stdout
  assert "EnvWarning" not in r.stderr  # listed, not warned of a second time
  d = plugrt("devices", "--json", env={"CLL": "1"})
  assert json.loads(d.stdout)["environment_warnings"] == ["CLL=1 is not a device; did you mean CL=1?"]


def test_named_unavailable_device_fails_loudly():
  r = plugrt("doctor", env={"DEV": "CUDDA"})
  assert r.returncode == 2
  assert r.stderr.count("did you mean CUDA") == 1 and "did you mean" not in r.stdout


def _device_error(name: str) -> str:
  """What Device[name] raises here, as `plugrt` prints it."""
  from plugrt.registry import Registry
  with pytest.raises(PlugrtError) as e: Registry().open(name)
  return f"plugrt: {e.value}"


@pytest.mark.parametrize("cmd", ["bench", "doctor"])
@pytest.mark.parametrize("name", ["CPX", "CUDA", "CPU:7"])
def test_a_named_device_that_cannot_be_used_fails_as_Device_does(cmd, name):
  want = _device_error(name)  # CPX: unknown, with "did you mean CPU"; CUDA: no GPU or not installed; CPU:7: no such index
  r = plugrt(cmd, "--device", name, *(("--quick",) if cmd == "bench" else ()))
  assert r.returncode == 2, r.stdout + r.stderr
  assert want in r.stderr.splitlines(), (want, r.stderr)
  assert "no device available" not in r.stdout and "saxpy" not in r.stdout


def test_no_command_prints_the_usage():
  r = plugrt()
  assert r.returncode == 2 and r.stdout == ""
  assert r.stderr.startswith("usage: plugrt") and all(c in r.stderr for c in ("devices", "doctor", "bench"))
  assert "run and check kernels" in r.stderr  # each command with what it does, not only "required: cmd"


def _refuse(constant: str) -> None: raise ValueError(f"not JSON: {constant}")


def test_bench_quick():
  r = plugrt("bench", "--quick", "--json", "--device", "PYTHON")
  assert r.returncode == 0, r.stderr
  assert r.stderr == ""  # no progress when stderr is not a terminal
  res = json.loads(r.stdout, parse_constant=_refuse)["PYTHON:PY"]  # strict JSON: no NaN or Infinity
  assert res["launch_us"] > 0 and res["compile_ms"] > 0 and res["copyin_gbs"] > 0
  assert res["cache_hit_ms"] is None  # PYTHON has no disk cache: nothing measured, null


def test_bench_of_an_older_name_keeps_its_compiler():
  from plugrt.registry import Registry
  reg = Registry()
  if not reg.probe("CPU").ok or not reg.compiler_probe("CPU", "LLVM").ok: pytest.skip("no CPU with LLVM here")
  r = plugrt("bench", "--quick", "--json", "--device", "LLVM")
  assert r.returncode == 0, r.stderr
  assert list(json.loads(r.stdout, parse_constant=_refuse)) == ["LLVM:LLVM"]


class _Terminal(io.StringIO):
  def isatty(self) -> bool: return True


def test_progress_goes_to_a_terminal_stderr_only(monkeypatch, capsys):
  from plugrt import cli
  monkeypatch.setattr(cli, "bench_target", lambda name, compiler, quick: {"launch_us": 1.0, "compile_ms": float("nan"), "cache_hit_ms": 1.0,
                                                                           "copyin_gbs": float("inf"), "copyout_gbs": 1.0})
  err = _Terminal()
  monkeypatch.setattr(sys, "stderr", err)
  assert cli.main(["bench", "--json", "--device", "PYTHON", "--device", "CPU"]) == 0
  out = json.loads(capsys.readouterr().out, parse_constant=_refuse)
  assert out["PYTHON:PY"]["compile_ms"] is None and out["PYTHON:PY"]["copyin_gbs"] is None
  lines = err.getvalue().splitlines()
  assert lines[0] == f"bench: PYTHON:PY (1/{len(out)})" and len(lines) == len(out)
  assert cli.main(["bench", "--device", "PYTHON"]) == 0
  assert capsys.readouterr().out.splitlines()[1].split() == ["PYTHON:PY", "1.00", "-", "1.000", "-", "1.00"]


def test_a_failing_bench_keeps_stdout_json_and_exits_1(monkeypatch, capsys):
  from plugrt import cli
  from plugrt.errors import CompileError

  def bench(name, compiler, quick):
    if name == "CPU": raise CompileError("the compiler crashed")
    return {"launch_us": 1.0, "compile_ms": 1.0, "cache_hit_ms": 1.0, "copyin_gbs": 1.0, "copyout_gbs": 1.0}
  monkeypatch.setattr(cli, "bench_target", bench)
  assert cli.main(["bench", "--json", "--device", "PYTHON", "--device", "CPU"]) == 1
  out, err = capsys.readouterr()
  assert list(json.loads(out, parse_constant=_refuse)) == ["PYTHON:PY"]
  assert "plugrt: bench of CPU:CLANG failed: the compiler crashed" in err


def test_a_mistyped_command_gets_a_did_you_mean(capsys):
  from plugrt.cli import main
  with pytest.raises(SystemExit) as info: main(["devicez"])
  assert info.value.code == 2 and "unknown command 'devicez' (did you mean devices?)" in capsys.readouterr().err
