"""The plugrt command."""
import json
import subprocess
import sys


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
  assert "not installed" in rows["METAL"] and "fix: none from plugrt yet: plugrt-metal is not written" in r.stdout
  assert "default device: CPU" in r.stdout


def test_devices_json_and_env_selection():
  r = plugrt("devices", "--json", env={"PYTHON": "1"})
  data = json.loads(r.stdout)
  assert data["default"] == "PYTHON" and data["environment_error"] is None
  rows = {b["device"]: b for b in data["backends"]}
  assert rows["PYTHON"]["default"] and not rows["CPU"]["default"]
  assert rows["METAL"]["reason"] == "not installed" and rows["METAL"]["hint"] == "none from plugrt yet: plugrt-metal is not written"
  assert rows["CUDA"]["reason"] in ("not installed", "no device") and rows["CUDA"]["hint"]  # installed in CI, without a GPU


def test_devices_reports_a_bad_environment_but_still_lists():
  r = plugrt("devices", env={"CPU": "1", "PYTHON": "1"})
  assert r.returncode == 0
  assert "environment: CPU=1 and PYTHON=1 ask for different default devices" in r.stdout
  assert "default device: none" in r.stdout


def test_missing_compiler_is_explained():
  r = plugrt("devices", "--json", env={"CC": "/nonexistent/cc"})
  cpu = {b["device"]: b for b in json.loads(r.stdout)["backends"]}["CPU"]
  clang = next(c for c in cpu["compilers"] if c["name"] == "CLANG")
  assert clang["ok"] is False and "CC=/nonexistent/cc" in clang["detail"] and cpu["available"]
  assert next(c for c in cpu["compilers"] if c["name"] == "LLVM")["default"]  # LLVM takes over


def test_doctor_runs_kernels_on_every_device():
  r = plugrt("doctor", "--device", "PYTHON", "--device", "CPU")
  assert r.returncode == 0, r.stdout + r.stderr
  assert "PYTHON:PY" in r.stdout and "CPU:CLANG" in r.stdout and r.stdout.count(": ok in") >= 2


def test_named_unavailable_device_fails_loudly():
  r = plugrt("doctor", env={"DEV": "CUDDA"})
  assert r.returncode == 0 or r.returncode == 1
  assert "did you mean CUDA" in r.stdout


def test_bench_quick():
  r = plugrt("bench", "--quick", "--json", "--device", "PYTHON")
  assert r.returncode == 0, r.stderr
  res = json.loads(r.stdout)["PYTHON:PY"]
  assert res["launch_us"] > 0 and res["compile_ms"] > 0 and res["copyin_gbs"] > 0
