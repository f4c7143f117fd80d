"""A headless machine (no XDG_RUNTIME_DIR, as in a container or a plain ssh session) and cold caches: plugrt's own
commands print only what a user can act on, so stderr stays empty on a machine where every device works."""
from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest


@pytest.mark.parametrize("engine", ["WGPU", "DAWN"])
def test_doctor_prints_nothing_on_stderr(tmp_path, engine):
  pytest.importorskip({"WGPU": "wgpu", "DAWN": "pydawn"}[engine])
  env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
  # cold caches: plugrt's, and PoCL's and Mesa's (under XDG_CACHE_HOME), so that every compiler really runs
  env.update(PLUGRT_CACHE_DIR=str(tmp_path / "cache"), XDG_CACHE_HOME=str(tmp_path / "xdg-cache"), TMPDIR=str(tmp_path), WEBGPU_IFACE=engine)
  r = subprocess.run([sys.executable, "-m", "plugrt", "doctor", "--verbose"], capture_output=True, text=True, env=env, timeout=600)
  assert r.returncode == 0, r.stdout + r.stderr
  if "WEBGPU:WGSL" not in r.stdout: pytest.skip("WEBGPU has no device here")
  assert "WEBGPU:WGSL     saxpy" in r.stdout and "CL:CL" in r.stdout
  assert r.stderr == ""  # Mesa's "error: XDG_RUNTIME_DIR is invalid or not set", clang's "N warnings generated."
  made = os.lstat(tmp_path / f"plugrt-runtime-{os.getuid()}")  # the private runtime directory the WebGPU engines gave the drivers
  assert stat.S_ISDIR(made.st_mode) and stat.S_IMODE(made.st_mode) == 0o700


def test_runtime_dir_keeps_what_the_user_set_and_refuses_a_shared_directory(tmp_path, monkeypatch):
  from plugrt_webgpu.drivers import runtime_dir
  monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/1234")
  runtime_dir()
  assert os.environ["XDG_RUNTIME_DIR"] == "/run/user/1234"
  monkeypatch.setenv("TMPDIR", str(tmp_path))
  monkeypatch.setattr("tempfile.tempdir", None)
  shared = tmp_path / f"plugrt-runtime-{os.getuid()}"
  shared.mkdir(mode=0o777)
  shared.chmod(0o777)  # readable by others: not a runtime directory
  monkeypatch.setenv("XDG_RUNTIME_DIR", "relative")
  runtime_dir()
  made = os.environ["XDG_RUNTIME_DIR"]
  assert made != str(shared) and os.path.dirname(made) == str(tmp_path) and stat.S_IMODE(os.lstat(made).st_mode) == 0o700
