"""Shared by the WEBGPU tests: one registry per engine, made once per test session.

Each registry holds exactly the reference backend, the WEBGPU device and the engine
packages that are installed, with WEBGPU_IFACE naming the engine, so a test runs the
same device code on wgpu-native and on Dawn in one process without touching the
process-wide registry (tests enter it with `plugrt.registry.use`).
"""
from __future__ import annotations

import importlib.util
import os
from typing import Any

import pytest

from plugrt.errors import DeviceUnavailable, Reason
from plugrt.registry import Registry

ENGINES = ("WGPU", "DAWN")
PACKAGES = {"WGPU": "plugrt_webgpu_wgpu", "DAWN": "plugrt_webgpu_dawn"}
_registries: dict[tuple[str, str], Registry] = {}
_devices: dict[tuple[str, str], Any] = {}
_unopenable: dict[tuple[str, str], str] = {}  # why a device could not be had, so later tests skip without retrying


def installed(module: str) -> bool:
  try: return importlib.util.find_spec(module) is not None
  except (ImportError, ValueError): return False


def registry(engine: str, adapter: str = "") -> Registry:
  """The registry whose WEBGPU device runs on `engine` (skips the test when that engine cannot be had)."""
  if not installed("plugrt_webgpu"): pytest.skip("plugrt-webgpu is not installed")
  if not installed(PACKAGES[engine]): pytest.skip(f"the {engine} engine's package ({PACKAGES[engine].replace('_', '-')}) is not installed")
  if (engine, adapter) not in _registries:
    plugins = ["plugrt.reference", "plugrt_webgpu", *(PACKAGES[e] for e in ENGINES if installed(PACKAGES[e]))]
    _registries[(engine, adapter)] = Registry(plugins=plugins, env={"WEBGPU_IFACE": engine}, autoload=False)
  reg = _registries[(engine, adapter)]
  spec = next((i for i, _ in reg.load().interfaces.get("WEBGPU", []) if i.name == engine), None)
  if spec is None: pytest.skip(f"the {engine} engine did not load: {reg.backends['WEBGPU'].detail}")
  if not (p := reg.interface_probe(spec)).ok: pytest.skip(f"the {engine} engine cannot be used here: {p.detail}")
  return reg


def device(engine: str, adapter: str = "") -> Any:
  """The opened WEBGPU device on `engine` (and the adapter PLUGRT_WEBGPU_ADAPTER=`adapter` names, default: the
  engine's choice, or the environment's), or a skip saying why there is none (no such adapter, say)."""
  reg = registry(engine, adapter)
  if (engine, adapter) in _unopenable: pytest.skip(_unopenable[(engine, adapter)])
  if (engine, adapter) not in _devices:
    from plugrt_webgpu.drivers import ADAPTER_ENV
    saved = os.environ.get(ADAPTER_ENV)
    if adapter: os.environ[ADAPTER_ENV] = adapter  # engines read it when they open
    try: _devices[(engine, adapter)] = reg.open("WEBGPU")
    except DeviceUnavailable as e:
      if e.reason in (Reason.NO_DEVICE, Reason.NOT_INSTALLED):
        _unopenable[(engine, adapter)] = f"WEBGPU on {engine}: {e.message}"
        pytest.skip(_unopenable[(engine, adapter)])
      raise
    finally:
      if adapter:
        if saved is None: os.environ.pop(ADAPTER_ENV, None)
        else: os.environ[ADAPTER_ENV] = saved
  return _devices[(engine, adapter)]


def engine_params() -> list[Any]:
  return [pytest.param(e, id=e.lower()) for e in ENGINES]
