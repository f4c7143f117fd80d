"""METAL's probe and listing on Linux, and the probe on a (faked) macOS: side-effect free, standard library only."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import plugrt_metal

from plugrt.context import PluginContext
from plugrt.errors import Reason

ENV = {**os.environ, "PLUGRT_EXTRA_PLUGINS": "plugrt_metal"}


def test_probe_on_linux_says_metal_needs_macos():
  p = plugrt_metal.probe_metal(PluginContext({}))
  assert not p.ok and p.reason is Reason.NO_DEVICE and p.detail == f"Metal needs macOS (this is {sys.platform})" and p.hint


def test_probe_imports_nothing_but_the_standard_library():
  code = ("import sys, json\nimport plugrt.registry\nbefore = set(sys.modules)\nimport plugrt_metal\n"
          "from plugrt.context import PluginContext\np = plugrt_metal.probe_metal(PluginContext({}))\n"
          "from plugrt._entrypoints import foreign_modules\n"
          "print(json.dumps([p.detail, foreign_modules(sorted(set(sys.modules) - before), 'plugrt_metal'), "
          "sorted(m for m in set(sys.modules) - before if m.startswith('plugrt_metal') or m == 'ctypes')]))\n")
  r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
  assert r.returncode == 0, r.stderr
  detail, foreign, ours = json.loads(r.stdout.strip().splitlines()[-1])
  # no objc, no ctypes: the entry module and its leaf of what the probe knows of macOS
  assert detail.startswith("Metal needs macOS") and foreign == [] and ours == ["plugrt_metal", "plugrt_metal.macos"]


def test_probe_on_macos_looks_for_the_framework_without_loading_it(monkeypatch, tmp_path):
  monkeypatch.setattr(plugrt_metal, "PLATFORM", "darwin")
  monkeypatch.setattr(plugrt_metal, "FRAMEWORK", str(tmp_path / "Metal.framework"))
  p = plugrt_metal.probe_metal(PluginContext({}))
  assert not p.ok and p.reason is Reason.NO_DEVICE and "no Metal framework" in p.detail
  (tmp_path / "Metal.framework").mkdir()
  p = plugrt_metal.probe_metal(PluginContext({}))
  assert p.ok and p.count == 1 and "never run on Apple hardware" in p.info["note"]


def test_msl_version_follows_the_os_and_the_variable():
  ctx = PluginContext({})
  assert plugrt_metal.msl_version_for_macos(ctx, "14.5") == (3, 1) and plugrt_metal.msl_version_for_macos(ctx, "13.0") == (3, 0)
  assert plugrt_metal.msl_version_for_macos(ctx, "26.0") == (3, 2) and plugrt_metal.msl_version_for_macos(ctx, "") == (2, 3)
  assert plugrt_metal.msl_version_for_macos(PluginContext({"PLUGRT_METAL_MSL": "3.0"}), "15.1") == (3, 0)


def test_plugrt_devices_lists_metal_as_needing_macos():
  r = subprocess.run([sys.executable, "-m", "plugrt", "devices"], capture_output=True, text=True, env=ENV, timeout=120)
  assert r.returncode == 0, r.stderr
  row = next(line for line in r.stdout.splitlines() if line.startswith("METAL "))
  assert "no device" in row and "METAL" in row
  assert "METAL: Metal needs macOS" in r.stdout and "fix: run on a Mac" in r.stdout
  r = subprocess.run([sys.executable, "-m", "plugrt", "devices", "--json"], capture_output=True, text=True, env=ENV, timeout=120)
  (m,) = [b for b in json.loads(r.stdout)["backends"] if b["device"] == "METAL"]
  assert m["reason"] == "no device" and not m["available"] and not m["default"] and m["priority"] == 3


def test_metal_1_names_the_device_and_fails_loudly():
  code = "from plugrt.device import Device\ntry: Device['METAL']\nexcept Exception as e: print(type(e).__name__, e)"
  r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**ENV, "METAL": "1"}, timeout=120)
  assert "DeviceUnavailable" in r.stdout and "Metal needs macOS" in r.stdout and "[no device]" in r.stdout, r.stdout + r.stderr
