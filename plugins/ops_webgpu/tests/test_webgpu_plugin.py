"""The WEBGPU packages as plugins: what they import, what their probes say, how an engine is
chosen, and that a third party's engine plugs in through the Engine protocol alone.
None of these tests needs an adapter."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("plugrt_webgpu")

from webgpu_engines import installed

import plugrt_webgpu
from plugrt.context import PluginContext
from plugrt.errors import DeviceUnavailable, Reason, UnknownDeviceError
from plugrt.hookspecs import InterfaceSpec
from plugrt.probing import install_hint
from plugrt.registry import Registry

ENGINE_MODULES = [m for m in ("plugrt_webgpu_wgpu", "plugrt_webgpu_dawn") if installed(m)]


def reg_with(env: dict[str, str], *extra: str) -> Registry:
  return Registry(plugins=["plugrt.reference", "plugrt_webgpu", *ENGINE_MODULES, *extra], env=env, autoload=False).load()


def hide(monkeypatch: pytest.MonkeyPatch, *modules: str) -> None:
  """Make importlib.util.find_spec say `modules` are not installed."""
  real = importlib.util.find_spec
  def fake(name: str, *a: Any, **kw: Any) -> Any: return None if name in modules else real(name, *a, **kw)
  monkeypatch.setattr(importlib.util, "find_spec", fake)


def test_entry_modules_import_only_stdlib_and_plugrt() -> None:
  code = textwrap.dedent("""
    import sys
    before = set(sys.modules)
    import plugrt_webgpu, plugrt_webgpu.engine
    for m in ("plugrt_webgpu_wgpu", "plugrt_webgpu_dawn"):
      try: __import__(m)
      except ImportError: pass
    from plugrt.context import PluginContext
    for p in (plugrt_webgpu.probe_webgpu, *(getattr(sys.modules.get(m), "probe", None) for m in ("plugrt_webgpu_wgpu", "plugrt_webgpu_dawn"))):
      if p: p(PluginContext.from_process())
    new = {m.split(".")[0] for m in set(sys.modules) - before}
    print(sorted(new))
  """)
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
  assert out.returncode == 0, out.stderr
  loaded = set(eval(out.stdout.strip().splitlines()[-1]))
  heavy = {"wgpu", "pydawn", "numpy", "cffi", "ctypes", "_cffi_backend"}
  assert not loaded & heavy, loaded & heavy  # probes look at files: no native library is loaded


def test_interfaces_and_their_selection() -> None:
  if len(ENGINE_MODULES) < 2: pytest.skip("both engine packages are needed")
  reg = reg_with({})
  assert {i.name for i, _ in reg.interfaces["WEBGPU"]} == {"WGPU", "DAWN"}
  assert all(i.auto and i.device == "WEBGPU" for i, _ in reg.interfaces["WEBGPU"])
  assert [c.name for c in reg.backend("WEBGPU").spec.compilers] == ["WGSL"] and reg.backend("WEBGPU").priority == 4
  for env in ({"WEBGPU_IFACE": "DAWN"}, {"WEBGPU_IFACE": "dawn"}, {"DEV": "DAWN+WEBGPU"}, {"WEBGPU": "1", "DEV": "DAWN+WEBGPU:WGSL"}):
    sel = reg_with(env).selection
    assert sel.interface["WEBGPU"].interface == "DAWN", env
  assert reg_with({"WEBGPU": "1"}).selection.default.device == "WEBGPU"
  with pytest.raises(UnknownDeviceError, match=r"WEBGPU has no interface DAWM \(did you mean DAWN\?\)"):
    _ = reg_with({"WEBGPU_IFACE": "DAWM"}).selection


def test_wgpu_is_the_default_engine() -> None:
  if len(ENGINE_MODULES) < 2: pytest.skip("both engine packages are needed")
  if "priority" not in InterfaceSpec.__annotations__:
    pytest.skip("this core orders a device's interfaces by discovery (DAWN's distribution sorts first); "
                "WGPU becomes the default once InterfaceSpec has `priority`")
  for order in (["plugrt_webgpu_dawn", "plugrt_webgpu_wgpu"], ["plugrt_webgpu_wgpu", "plugrt_webgpu_dawn"]):
    reg = Registry(plugins=["plugrt_webgpu", *order], env={}, autoload=False).load()
    assert reg.interfaces["WEBGPU"][0][0].name == "WGPU", order


def test_dawn_missing_is_explained_down_to_the_boundary(monkeypatch: pytest.MonkeyPatch) -> None:
  if "plugrt_webgpu_dawn" not in ENGINE_MODULES: pytest.skip("plugrt-webgpu-dawn is not installed")
  import plugrt_webgpu_dawn
  monkeypatch.delitem(sys.modules, "pydawn", raising=False)  # find_spec answers from sys.modules first
  hide(monkeypatch, "pydawn")
  p = plugrt_webgpu_dawn.probe(PluginContext({}))
  assert not p.ok and p.reason is Reason.NOT_INSTALLED
  assert p.detail == "dawn-python is not installed" and p.hint == "pip install dawn-python"
  reg = reg_with({"WEBGPU_IFACE": "DAWN"})
  with pytest.raises(DeviceUnavailable) as ei: reg.open("WEBGPU")
  assert "WEBGPU_IFACE=DAWN: interface DAWN of WEBGPU cannot be used: dawn-python is not installed" in str(ei.value)
  assert ei.value.hint == "pip install dawn-python"


def test_dawn_without_a_library_for_this_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
  if "plugrt_webgpu_dawn" not in ENGINE_MODULES: pytest.skip("plugrt-webgpu-dawn is not installed")
  import plugrt_webgpu_dawn
  (tmp_path / "pydawn" / "lib").mkdir(parents=True)
  (tmp_path / "pydawn" / "__init__.py").write_text("")
  (tmp_path / "pydawn" / "lib" / "libwebgpu_dawn.dll").write_text("")
  monkeypatch.delitem(sys.modules, "pydawn", raising=False)
  monkeypatch.syspath_prepend(str(tmp_path))
  importlib.invalidate_caches()
  p = plugrt_webgpu_dawn.probe(PluginContext({}))
  assert not p.ok and "has no Dawn library for" in p.detail and "libwebgpu_dawn.dll" in p.detail and "WGPU" in p.hint


def test_wgpu_missing(monkeypatch: pytest.MonkeyPatch) -> None:
  if "plugrt_webgpu_wgpu" not in ENGINE_MODULES: pytest.skip("plugrt-webgpu-wgpu is not installed")
  import plugrt_webgpu_wgpu
  monkeypatch.delitem(sys.modules, "wgpu", raising=False)
  hide(monkeypatch, "wgpu")
  p = plugrt_webgpu_wgpu.probe(PluginContext({}))
  assert not p.ok and p.detail == "wgpu-py is not installed" and p.hint == "pip install wgpu"


def test_no_engine_at_all(monkeypatch: pytest.MonkeyPatch) -> None:
  hide(monkeypatch, "plugrt_webgpu_wgpu", "plugrt_webgpu_dawn")
  p = plugrt_webgpu.probe_webgpu(PluginContext({}))  # and no other plugin declares an engine
  assert not p.ok and p.reason is Reason.NO_DEVICE and "no WebGPU engine is installed" in p.detail and install_hint("plugrt-webgpu-wgpu") in p.hint


def test_device_without_an_engine_object(monkeypatch: pytest.MonkeyPatch) -> None:
  # the probe sees an engine, but no plugin opens one
  monkeypatch.setattr(plugrt_webgpu, "_third_party_engines", lambda ctx: ["ELSEWHERE"])
  reg = Registry(plugins=["plugrt.reference", "plugrt_webgpu"], env={"WEBGPU": "1"}, autoload=False)
  with pytest.raises(DeviceUnavailable, match="no WebGPU engine was opened") as ei: reg.open("WEBGPU")
  assert install_hint("plugrt-webgpu-wgpu") in ei.value.hint


#: a third party's engine: host memory standing in for a GPU, enough for copies (its kernels do not compile)
STUB_ENGINE = '''
from plugrt.errors import CompileError, Reason
from plugrt.hookspecs import InterfaceSpec, Probe, hookimpl


def probe():
  return Probe.found(1, "stub engine")


@hookimpl
def plugrt_interfaces():
  return [InterfaceSpec("WEBGPU", "STUB", probe, auto=False)]


@hookimpl
def plugrt_open_interface(device, interface):
  from plugrt_webgpu.engine import AdapterInfo, Engine

  class StubEngine(Engine):
    name = "STUB"
    version = "1"
    adapter = AdapterInfo("host memory", kind="CPU", backend="none")
    def alloc(self, nbytes): return bytearray(nbytes)
    def free(self, buf): pass
    def write(self, buf, offset, data): buf[offset:offset + data.nbytes] = data
    def read(self, buf, offset, dest): dest[:] = buf[offset:offset + dest.nbytes]
    def copy(self, src, so, dst, do, n): dst[do:do + n] = src[so:so + n]
    def create_module(self, wgsl): raise CompileError("the stub engine compiles nothing")
    def create_pipeline(self, *a): raise NotImplementedError
    def create_uniform(self, nbytes): return bytearray(nbytes)
    def create_bind_group(self, *a): raise NotImplementedError
    def launcher(self, *a): raise NotImplementedError
    def timed_launcher(self, *a): raise NotImplementedError
    def synchronize(self): pass
  return StubEngine()
'''


def test_a_third_party_engine_plugs_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
  import numpy as np

  from plugrt.compiler.samples import tiny_kernel
  from plugrt.device import Buffer
  from plugrt.errors import CompileError
  (tmp_path / "stub_webgpu_engine.py").write_text(STUB_ENGINE)
  monkeypatch.syspath_prepend(str(tmp_path))
  reg = reg_with({"WEBGPU_IFACE": "STUB"}, "stub_webgpu_engine")
  dev = reg.open("WEBGPU")
  assert dev.info.interface == "STUB" and type(dev.info.iface_object).__name__ == "StubEngine"
  buf = Buffer(dev, 5, "int16").copyin(np.arange(5, dtype=np.int16))
  assert buf.view(3, offset=2).numpy().tolist() == [1, 2, 3]  # the device's unaligned-copy logic over the stub's words
  with pytest.raises(CompileError, match="compiles nothing"): dev.program(tiny_kernel())
  assert "STUB" in [i.name for i, _ in reg.interfaces["WEBGPU"]]
  unnamed = reg_with({}, "stub_webgpu_engine")  # auto=False: never chosen unless named
  try: assert unnamed.choose_interface("WEBGPU")[0].name != "STUB"
  except DeviceUnavailable as e: assert "STUB is never chosen automatically (set WEBGPU_IFACE=STUB)" in str(e)
  monkeypatch.delitem(sys.modules, "stub_webgpu_engine", raising=False)


def test_a_third_party_engine_makes_the_device_available(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
  (tmp_path / "stub_webgpu_engine.py").write_text(STUB_ENGINE)
  monkeypatch.syspath_prepend(str(tmp_path))
  hide(monkeypatch, "plugrt_webgpu_wgpu", "plugrt_webgpu_dawn")
  reg = Registry(plugins=["plugrt_webgpu", "stub_webgpu_engine"], env={}, autoload=False)  # what its entry point would load
  p = reg.probe("WEBGPU")
  assert p.ok and "engines installed: STUB" in p.detail, p
  monkeypatch.delitem(sys.modules, "stub_webgpu_engine", raising=False)


def test_adapter_listing_command() -> None:
  if not ENGINE_MODULES: pytest.skip("no engine package is installed")
  out = subprocess.run([sys.executable, "-m", "plugrt_webgpu", "--json"], capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr
  rows = json.loads(out.stdout)
  for r in rows:
    assert r["engine"] in ("WGPU", "DAWN") or r["package"]
    for a in r["adapters"]: assert a["name"] and a["kind"] and a["backend"]


def test_probes_look_for_drivers_without_loading_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
  from plugrt_webgpu import drivers as engine
  if sys.platform != "linux": pytest.skip("the driver files checked are Linux's")
  icd = tmp_path / "lvp_icd.x86_64.json"
  icd.write_text("{}")
  libs = {"libvulkan.so.1": "/x/libvulkan.so.1", "libEGL.so.1": "/x/libEGL.so.1"}
  monkeypatch.setattr(engine, "_find_lib", lambda env, *names: next((libs[n] for n in names if n in libs), None))
  env = {"VK_DRIVER_FILES": str(icd)}
  assert engine.drivers(opengl=False, env=env) == (True, "Vulkan (lvp_icd.x86_64)")
  assert engine.drivers(opengl=True, env=env) == (True, "Vulkan (lvp_icd.x86_64) and OpenGL through EGL")
  env = {"VK_DRIVER_FILES": str(tmp_path / "missing.json")}
  assert engine.drivers(opengl=True, env=env) == (True, "OpenGL through EGL")  # wgpu-native falls back to OpenGL
  assert engine.drivers(opengl=False, env=env) == (False, "no Vulkan driver manifest (icd.d/*.json)")
  del libs["libvulkan.so.1"], libs["libEGL.so.1"]
  assert engine.drivers(opengl=True, env=env) == (False, "no Vulkan loader (libvulkan.so.1) and no EGL library")
  p = plugrt_webgpu.probe_webgpu(PluginContext(env))
  if ENGINE_MODULES: assert not p.ok and p.reason is Reason.NO_DEVICE and "mesa-vulkan-drivers" in p.hint
  if "plugrt_webgpu_dawn" in ENGINE_MODULES:
    import plugrt_webgpu_dawn
    p = plugrt_webgpu_dawn.probe(PluginContext(env))
    assert not p.ok and p.reason is Reason.NO_DEVICE and "no Vulkan loader" in p.detail and "mesa-vulkan-drivers" in p.hint
