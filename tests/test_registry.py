"""The registry: discovery through real entry points, typed reasons for every unavailable
backend, fault injection, the PLUGRT_* controls, automatic choice, interfaces, device
strings, and the launch path staying free of hooks."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import uuid
from typing import Any

import pytest
from conftest import FakePlugins, backend_source, run_tiny

from plugrt.errors import DeviceUnavailable, EnvError, PlugrtError, Reason, UnknownDeviceError
from plugrt.hookspecs import PLUGIN_API_VERSION
from plugrt.probing import install_hint
from plugrt.registry import Registry, current, isolated

GOOD = ["CPU", "PYTHON"]
OTHERS = {"CL", "WEBGPU", "INTERP"}  # first-party or example backends that may also be installed here


def ours(names: list[str]) -> list[str]:
  """The devices these tests care about, in order: other installed backends (OpenCL on PoCL, say) are left out."""
  return [n for n in names if n not in OTHERS]


def load(**kw: Any) -> Registry:
  """A registry, discovery done (Registry itself discovers on first use)."""
  return Registry(**kw).load()


#: run in a fresh interpreter with the fake distributions on its path: plugrt still imports,
#: the good backends are still there, and the broken one is explained
CHECK = """
import json, sys
import plugrt
from plugrt import Device
available = Device.available()
reg = Device.registry
br = reg.backends.get(sys.argv[1])
print(json.dumps({"available": available, "default": Device.DEFAULT,
                  "reason": br.reason.value if br is not None and br.reason else None}))
"""


def assert_good_still_work(fake: FakePlugins, reg: Registry, broken: str) -> dict[str, Any]:
  """CPU and PYTHON still open and run a kernel, CPU is the default, and a fresh process imports plugrt and finds them;
  returns what the fresh process saw (its `reason` is that of `broken`)."""
  for good in GOOD:
    assert reg.backends[good].reason is None, (good, reg.backends[good].detail)
    assert run_tiny(reg, good) == 42.0
  assert reg.default == "CPU"
  r = fake.run_python(CHECK, broken)
  assert r.returncode == 0, r.stderr
  out = json.loads(r.stdout.strip().splitlines()[-1])
  assert out["default"] == "CPU" and set(GOOD) <= set(out["available"]), out
  return out


def assert_contained(fake: FakePlugins, reg: Registry, broken: str, reason: Reason) -> None:
  """`broken` is unavailable with `reason` and a hint; CPU and PYTHON still work, here and in a fresh process."""
  br = reg.backends[broken]
  assert br.reason is reason, (br.reason, br.detail)
  assert br.hint and br.detail
  assert reg.probe(broken).ok is False and reg.probe(broken).reason is reason
  with pytest.raises(DeviceUnavailable) as ei:
    reg.open(broken)
  assert ei.value.reason is reason
  assert ei.value.available is not None and set(GOOD) <= set(ei.value.available)
  out = assert_good_still_work(fake, reg, broken)
  assert broken not in out["available"] and out["reason"] == reason.value


# ---------------------------------------------------------------- fault injection

def test_entry_point_naming_a_missing_module(fake_plugins):
  ghost = f"ghost_{uuid.uuid4().hex[:10]}"
  fake_plugins.dist("plugrt-ghost", {"plugrt": {"ghost": ghost}})
  reg = load(env={})
  br = reg.backends["GHOST"]
  assert br.detail.startswith(f"module {ghost} is not installed: ModuleNotFoundError")
  assert br.hint == "reinstall plugrt-ghost, or disable it with PLUGRT_DISABLE=ghost"
  assert br.package == "plugrt-ghost" and br.version == "1.0"
  assert_contained(fake_plugins, reg, "GHOST", Reason.IMPORT_ERROR)


def test_missing_dependency_is_not_reported_as_a_missing_plugin(fake_plugins):
  # the plugin module exists; what it imports does not (and its name is a prefix of the plugin's)
  dep = f"heavydep_{uuid.uuid4().hex[:10]}"
  mod = fake_plugins.module(f"import {dep}\n", name=f"{dep}_plugin")
  fake_plugins.dist("plugrt-heavy", {"plugrt": {"heavy": mod}})
  reg = load(env={})
  assert reg.backends["HEAVY"].reason is Reason.IMPORT_ERROR
  assert reg.backends["HEAVY"].detail.startswith(f"module {mod} failed to import: ModuleNotFoundError: No module named '{dep}'")


def test_module_raising_on_import(fake_plugins):
  mod = fake_plugins.plugin("raise RuntimeError('driver library is broken')\n", entry="boom", dist="plugrt-boom")
  reg = load(env={})
  br = reg.backends["BOOM"]
  assert br.detail.startswith(f"module {mod} failed to import: RuntimeError: driver library is broken at {mod}.py:1")
  assert br.hint == "reinstall plugrt-boom, or disable it with PLUGRT_DISABLE=boom"
  assert mod not in sys.modules
  assert_contained(fake_plugins, reg, "BOOM", Reason.IMPORT_ERROR)


def test_module_calling_sys_exit_on_import(fake_plugins):
  fake_plugins.plugin("import sys\nsys.exit(3)\n", entry="quitter")
  reg = load(env={})
  assert "SystemExit: 3" in reg.backends["QUITTER"].detail
  assert_contained(fake_plugins, reg, "QUITTER", Reason.IMPORT_ERROR)


def test_declaration_hook_raising(fake_plugins):
  src = backend_source("RAISER").replace("  return [BackendSpec(", "  raise ValueError('cannot count devices')\n  return [BackendSpec(")
  fake_plugins.plugin(src, entry="raiser", dist="plugrt-raiser")
  reg = load(env={})
  assert reg.backends["RAISER"].detail.startswith("declaration hook raised ValueError: cannot count devices")
  assert reg.backends["RAISER"].hint == "report this to plugrt-raiser's authors, or disable it with PLUGRT_DISABLE=raiser"
  assert_contained(fake_plugins, reg, "RAISER", Reason.HOOK_ERROR)


def test_declaration_hook_calling_sys_exit(fake_plugins):
  src = backend_source("EXITER").replace("  return [BackendSpec(", "  sys.exit('no')\n  return [BackendSpec(")
  fake_plugins.plugin(src, entry="exiter")
  reg = load(env={})
  assert reg.backends["EXITER"].detail.startswith("declaration hook raised SystemExit: no")
  assert_contained(fake_plugins, reg, "EXITER", Reason.HOOK_ERROR)


def test_probe_and_open_calling_sys_exit(fake_plugins):
  fake_plugins.backend("EXITPROBE", priority=100, extra="\n\n_probe = probe\ndef probe() -> Probe:\n  sys.exit(4)\n")
  extra = "\n\n@hookimpl\ndef plugrt_open_device(device: DeviceInfo) -> Any:\n  sys.exit(5)\n"
  fake_plugins.backend("EXITOPEN", priority=90, extra=extra)
  reg = load(env={})
  assert reg.probe("EXITPROBE").reason is Reason.HOOK_ERROR and "probe raised SystemExit: 4" in reg.probe("EXITPROBE").detail
  assert reg.default == "CPU"
  assert "EXITOPEN failed to open: SystemExit: 5" in str(reg.backends["EXITOPEN"].open_error)
  assert ours(assert_good_still_work(fake_plugins, reg, "EXITOPEN")["available"]) == ["EXITOPEN", "CPU", "PYTHON"]


def test_declaration_hook_returning_the_wrong_type(fake_plugins):
  src = backend_source("WRONGTYPE").replace("  return [BackendSpec(", "  return [{'name': 'WRONGTYPE'}]\n  return [BackendSpec(")
  fake_plugins.plugin(src, entry="wrongtype")
  reg = load(env={})
  assert "plugrt_backends returned dict, not BackendSpec" in reg.backends["WRONGTYPE"].detail
  assert_contained(fake_plugins, reg, "WRONGTYPE", Reason.HOOK_ERROR)


def test_allocator_raising_only_when_the_device_opens(fake_plugins):
  hooks = backend_source("ALLOCFAIL", priority=100).replace(
    "  from plugrt.reference.backend import PythonAllocator\n", "  raise MemoryError('no BAR space')\n")
  mod = fake_plugins.plugin(hooks, entry="allocfail", dist="plugrt-allocfail")
  reg = load(env={})
  assert reg.backends["ALLOCFAIL"].reason is None and reg.probe("ALLOCFAIL").ok  # discovery is fine
  assert reg.available()[0] == "ALLOCFAIL"
  assert reg.default == "CPU"  # tried first, failed quietly
  err = reg.backends["ALLOCFAIL"].open_error
  assert isinstance(err, DeviceUnavailable) and err.reason is Reason.HOOK_ERROR
  assert "ALLOCFAIL: plugrt_allocator raised MemoryError: no BAR space" in str(err)
  assert "report this to plugrt-allocfail's authors" in str(err)
  with pytest.raises(DeviceUnavailable, match="plugrt_allocator raised MemoryError") as ei:
    reg.open("ALLOCFAIL")
  assert ei.value.reason is Reason.HOOK_ERROR and ours(ei.value.available) == ["CPU", "PYTHON"]  # a named device lists the others
  assert ("allocator", None) in fake_plugins.calls(mod)
  out = assert_good_still_work(fake_plugins, reg, "ALLOCFAIL")
  assert out["available"][0] == "ALLOCFAIL" and out["reason"] is None
  named = load(env={"ALLOCFAIL": "1"})
  with pytest.raises(DeviceUnavailable, match="plugrt_allocator raised") as ei:
    _ = named.default
  assert ei.value.reason is Reason.HOOK_ERROR and ours(ei.value.available) == ["CPU", "PYTHON"] and "; available: CPU, " in str(ei.value)


def test_probe_raising(fake_plugins):
  src = backend_source("PROBEFAIL", priority=100).replace("def probe() -> Probe:\n", "def probe() -> Probe:\n  1 / 0\n")
  fake_plugins.plugin(src, entry="probefail")
  reg = load(env={})
  assert reg.backends["PROBEFAIL"].reason is None  # discovery is fine: only the probe fails
  p = reg.probe("PROBEFAIL")
  assert not p.ok and p.reason is Reason.HOOK_ERROR and p.detail.startswith("probe raised ZeroDivisionError: division by zero")
  assert p.hint
  assert "PROBEFAIL" not in reg.available() and reg.default == "CPU"
  with pytest.raises(DeviceUnavailable, match="PROBEFAIL cannot be used: probe raised ZeroDivisionError") as ei:
    reg.open("PROBEFAIL")
  assert ei.value.reason is Reason.HOOK_ERROR and ours(ei.value.available) == ["CPU", "PYTHON"]
  out = assert_good_still_work(fake_plugins, reg, "PROBEFAIL")
  assert ours(out["available"]) == ["CPU", "PYTHON"] and out["reason"] is None


@pytest.mark.parametrize(("version", "problem"), [("2.0", "the major versions differ"), ("0.9", "the major versions differ"),
                                                  ("1.9", "it needs a newer plugrt"), ("nonsense", "'nonsense' is not MAJOR.MINOR"),
                                                  ("1", "'1' is not MAJOR.MINOR"), ((2, 0), "the major versions differ"),
                                                  ((1, 9), "it needs a newer plugrt"), ((1, "1"), "(1, '1') is not MAJOR.MINOR"),
                                                  (1.1, "1.1 is not MAJOR.MINOR")])
def test_incompatible_api_version(fake_plugins, version, problem):
  # entry point "apientry" declares backend APIDEV: the reason is found under the backend's own name
  mod = fake_plugins.backend("APIDEV", entry="apientry", dist="plugrt-apidev", version="3.1", api_version=version)
  reg = load(env={})
  br = reg.backends["APIDEV"]
  assert br.detail.startswith(f"APIDEV is written for plugin API {version!r}, plugrt implements {PLUGIN_API_VERSION[0]}.{PLUGIN_API_VERSION[1]}: "
                              f"{problem}")
  if "MAJOR.MINOR" in problem:  # the message shows the forms plugrt accepts
    written = f"{PLUGIN_API_VERSION[0]}.{PLUGIN_API_VERSION[1]}"
    assert br.detail.endswith(f': write api_version="{written}" or api_version=plugrt.PLUGIN_API_VERSION'), br.detail
  assert br.hint == "install versions of plugrt and plugrt-apidev made for each other"
  assert br.package == "plugrt-apidev" and br.version == "3.1"
  assert fake_plugins.calls(mod) == []  # no factory ran
  assert_contained(fake_plugins, reg, "APIDEV", Reason.INCOMPATIBLE_API)


@pytest.mark.parametrize("version", ["1.0", "1.0.7", "1.1", (1, 0), PLUGIN_API_VERSION], ids=str)
def test_compatible_api_version(fake_plugins, version):
  """The string the guide shows, and the tuple plugrt.PLUGIN_API_VERSION is."""
  fake_plugins.backend("APIOK", api_version=version)
  reg = load(env={})
  assert reg.backends["APIOK"].reason is None and run_tiny(reg, "APIOK") == 42.0


def test_two_distributions_claiming_one_name(fake_plugins):
  fake_plugins.backend("TWIN", entry="twin", dist="plugrt-twin-a", version="1.0")
  fake_plugins.backend("TWIN", entry="twin", dist="plugrt-twin-b", version="2.5")
  reg = load(env={})
  br = reg.backends["TWIN"]
  assert "plugrt-twin-a 1.0" in br.detail and "plugrt-twin-b 2.5" in br.detail and br.detail.startswith("TWIN is declared by ")
  assert br.hint == "uninstall one of them, or disable one with PLUGRT_DISABLE=<entry point>"
  assert [p.dist for p in br.claimants] == ["plugrt-twin-a", "plugrt-twin-b"]
  assert_contained(fake_plugins, reg, "TWIN", Reason.NAME_CONFLICT)
  with pytest.raises(DeviceUnavailable, match="TWIN is declared by") as ei:
    _ = load(env={"TWIN": "1"}).default
  assert ei.value.reason is Reason.NAME_CONFLICT
  # disabling one distribution, as the hint says, resolves it
  fixed = load(env={"PLUGRT_DISABLE": "plugrt-twin-a"})
  assert fixed.backends["TWIN"].reason is None and fixed.backends["TWIN"].package == "plugrt-twin-b"
  assert run_tiny(fixed, "TWIN") == 42.0


def test_hookimpl_with_a_wrong_argument_name(fake_plugins):
  src = backend_source("BADARGS").replace("def plugrt_allocator(device: DeviceInfo)", "def plugrt_allocator(dev: DeviceInfo)")
  src = src.replace("PythonAllocator(device)", "PythonAllocator(dev)")
  fake_plugins.plugin(src, entry="badargs")
  reg = load(env={})
  detail = reg.backends["BADARGS"].detail
  assert detail.startswith("hook validation failed") and "plugrt_allocator" in detail and "dev" in detail
  assert_contained(fake_plugins, reg, "BADARGS", Reason.HOOK_ERROR)


def test_unknown_plugrt_hook(fake_plugins):
  extra = """
  @hookimpl
  def plugrt_memory_pools(device: DeviceInfo) -> Any:
    return []
  """
  fake_plugins.backend("NEWHOOK", extra=extra)
  reg = load(env={})
  detail = reg.backends["NEWHOOK"].detail
  assert detail.startswith("implements a hook plugrt does not define") and "plugrt_memory_pools" in detail
  assert_contained(fake_plugins, reg, "NEWHOOK", Reason.HOOK_ERROR)


def test_a_half_registered_plugin_leaves_nothing_behind(fake_plugins):
  # pluggy registers hookimpls in name order and stops at the first invalid one; the unknown
  # plugrt_aaa hook registered before it must not make every later plugin fail check_pending
  src = backend_source("HALF").replace("def plugrt_program(device: DeviceInfo)", "def plugrt_program(dev: DeviceInfo)")
  src += "\n\n@hookimpl\ndef plugrt_aaa_unknown() -> None:\n  pass\n"
  fake_plugins.plugin(src, entry="half", dist="plugrt-aaa-half")
  fake_plugins.backend("LATER", dist="plugrt-zzz-later")
  reg = load(env={})
  assert reg.backends["HALF"].reason is Reason.HOOK_ERROR and reg.backends["HALF"].detail.startswith("hook validation failed")
  assert reg.backends["LATER"].reason is None, reg.backends["LATER"].detail
  assert run_tiny(reg, "LATER") == 42.0
  assert_contained(fake_plugins, reg, "HALF", Reason.HOOK_ERROR)


def test_backend_without_the_required_hooks(fake_plugins):
  fake_plugins.backend("NOHOOKS", entry="nohooks-entry", device_hooks="")
  reg = load(env={})
  assert reg.backends["NOHOOKS"].detail == "declares NOHOOKS but does not implement plugrt_allocator, plugrt_compiler, plugrt_program"
  assert_contained(fake_plugins, reg, "NOHOOKS", Reason.HOOK_ERROR)


def test_every_unavailable_backend_has_a_typed_reason_and_a_hint(fake_plugins):
  fake_plugins.dist("plugrt-ghost2", {"plugrt": {"ghost2": f"ghost_{uuid.uuid4().hex[:10]}"}})
  fake_plugins.plugin("raise ImportError('x')\n", entry="imp")
  fake_plugins.backend("OLDAPI", api_version="0.1")
  fake_plugins.backend("DUPE", dist="plugrt-dupe-1")
  fake_plugins.backend("DUPE", dist="plugrt-dupe-2")
  fake_plugins.backend("GONE", count=0)
  fake_plugins.backend("NOCC", missing=("PY",), priority=100)
  fake_plugins.backend("OFF")
  reg = load(env={"PLUGRT_DISABLE": "off"})
  from plugrt.registry import FIRST_PARTY
  # a first-party backend not installed here (every one may be: test_first_party_backends_not_installed covers it alone)
  absent = [n for n in FIRST_PARTY if reg.backends[n].spec is None and reg.backends[n].plugin is None]
  expected = {"GHOST2": Reason.IMPORT_ERROR, "IMP": Reason.IMPORT_ERROR, "OLDAPI": Reason.INCOMPATIBLE_API, "DUPE": Reason.NAME_CONFLICT,
              "GONE": Reason.NO_DEVICE, "OFF": Reason.DISABLED, **{n: Reason.NOT_INSTALLED for n in absent[:1]}}
  for name, reason in expected.items():
    p = reg.probe(name)
    assert not p.ok and p.reason is reason and p.hint, (name, p)
  assert reg.probe("GONE").hint == "plug a GONE in"
  assert reg.probe("NOCC").ok  # the device is there; its toolchain is not
  with pytest.raises(DeviceUnavailable, match="NOCC has no usable compiler: PY unavailable") as ei:
    reg.open("NOCC")
  assert ei.value.reason is Reason.MISSING_TOOLCHAIN and ei.value.hint == "install the fake toolchain"
  for name, br in reg.backends.items():
    if br.reason is not None: assert br.hint and br.detail, name
  assert ours(reg.available()) == ["NOCC", "CPU", "PYTHON"] and reg.default == "CPU"
  assert reg.backends["NOCC"].open_error is not None and reg.backends["NOCC"].open_error.reason is Reason.MISSING_TOOLCHAIN


# ---------------------------------------------------------------- not installed

@pytest.mark.parametrize("name", ["CUDA", "NV", "AMD", "QCOM", "METAL", "CL", "WEBGPU"])
def test_first_party_backends_not_installed(name):
  with isolated(["plugrt.reference", "plugrt_cpu"]) as reg:
    br = reg.load().backends[name]
    assert br.reason is Reason.NOT_INSTALLED and br.spec is None
    extra = {"WEBGPU": ["plugrt-webgpu-wgpu"], "AMD": ["plugrt-amd-kfd"], "NV": ["plugrt-nv-nvk"]}  # an engine, an interface
    dists = [f"plugrt-{name.lower()}"] + extra.get(name, [])
    assert br.detail == f"plugrt-{name.lower()} is not installed" and br.hint == install_hint(*dists)
    assert br.hint.startswith("pip install ")
    assert name not in reg.available()
    with pytest.raises(DeviceUnavailable) as ei:
      reg.open(f"{name.lower()}:1")
    assert ei.value.reason is Reason.NOT_INSTALLED and ours(ei.value.available) == ["CPU", "PYTHON"]
    assert f"fix: {br.hint}" in str(ei.value) and "available: CPU, PYTHON" in str(ei.value)


def test_gpu_alias_is_known_before_plugrt_cl_is_installed():
  with isolated(["plugrt.reference", "plugrt_cpu"], env={"GPU": "1"}) as reg:
    assert reg.selection.default is not None and reg.selection.default.device == "CL"
    with pytest.raises(DeviceUnavailable) as ei:
      _ = reg.default
  assert ei.value.reason is Reason.NOT_INSTALLED and ours(ei.value.available) == ["CPU", "PYTHON"]
  assert "CL cannot be used: plugrt-cl is not installed" in str(ei.value) and install_hint("plugrt-cl") in str(ei.value)


# ---------------------------------------------------------------- PLUGRT_* controls

def test_disable_by_entry_name(fake_plugins):
  mod = fake_plugins.backend("OFFDEV")
  reg = load(env={"PLUGRT_DISABLE": "offdev,cpu"})
  for name in ("OFFDEV", "CPU"):
    br = reg.backends[name]
    assert br.reason is Reason.DISABLED and br.detail == "matches PLUGRT_DISABLE=offdev,cpu"
    assert br.hint == "unset PLUGRT_DISABLE, or change it"
  assert mod not in sys.modules  # a disabled plugin is never imported
  assert ours(reg.available()) == ["PYTHON"] and reg.default == reg.available()[0] != "CPU"
  with pytest.raises(DeviceUnavailable) as ei:
    _ = load(env={"PLUGRT_DISABLE": "CPU", "CPU": "1"}).default  # globs are case-insensitive
  assert ei.value.reason is Reason.DISABLED and ours(ei.value.available) == ["OFFDEV", "PYTHON"]


def test_disable_by_distribution_glob(fake_plugins):
  fake_plugins.backend("CFAKE", dist="plugrt-cfake")
  fake_plugins.backend("KEEP", dist="plugrt-keep")
  reg = load(env={"PLUGRT_DISABLE": "plugrt-c*"})
  assert reg.backends["CPU"].reason is Reason.DISABLED and reg.backends["CFAKE"].reason is Reason.DISABLED
  assert reg.backends["PYTHON"].reason is None and reg.backends["KEEP"].reason is None  # dist "plugrt" does not match
  assert ours(reg.available()) == ["KEEP", "PYTHON"]


def test_disable_by_backend_name(fake_plugins):
  mod = fake_plugins.backend("BYNAME", entry="some-entry", dist="plugrt-other-name")
  reg = load(env={"PLUGRT_DISABLE": "byname"})
  br = reg.backends["BYNAME"]
  assert br.reason is Reason.DISABLED and br.detail == "matches PLUGRT_DISABLE=byname" and br.hint
  assert "BYNAME" not in reg.available() and fake_plugins.calls(mod) == []
  assert reg.backends["CPU"].reason is None and reg.default == "CPU"


def test_allow_list(fake_plugins):
  mod = fake_plugins.backend("NOTLISTED")
  reg = load(env={"PLUGRT_PLUGINS": "cpu"})
  assert reg.backends["PYTHON"].reason is Reason.DISABLED and reg.backends["PYTHON"].detail == "not in PLUGRT_PLUGINS=cpu"
  assert reg.backends["PYTHON"].hint == "unset PLUGRT_PLUGINS, or change it"
  assert reg.backends["NOTLISTED"].reason is Reason.DISABLED and mod not in sys.modules
  assert ours(reg.available()) == ["CPU"]


@pytest.mark.parametrize("allow", ["plugrt-cpu,plugrt", "PLUGRT*", "plugrt_cpu,plugrt.reference", "cpu,python"])
def test_allow_list_by_distribution_module_or_entry(allow):
  reg = load(env={"PLUGRT_PLUGINS": allow})
  assert reg.backends["CPU"].reason is None and reg.backends["PYTHON"].reason is None, reg.backends["CPU"].detail
  assert ours(reg.available()) == ["CPU", "PYTHON"]


def test_autoload_off(fake_plugins):
  entry_mod = fake_plugins.backend("VIAENTRY")
  extra_mod = fake_plugins.module(backend_source("VIAEXTRA"))  # no metadata at all
  reg = load(env={"PLUGRT_AUTOLOAD": "0", "PLUGRT_EXTRA_PLUGINS": extra_mod})
  assert entry_mod not in sys.modules and "VIAENTRY" not in reg.backends
  assert reg.backends["CPU"].reason is Reason.NOT_INSTALLED and "PYTHON" not in reg.backends
  assert ours(reg.available()) == ["VIAEXTRA"] and run_tiny(reg, "VIAEXTRA") == 42.0
  rec = reg.backends["VIAEXTRA"].plugin
  assert rec is not None and rec.source == "PLUGRT_EXTRA_PLUGINS" and rec.package == extra_mod
  explicit = load(plugins=["plugrt.reference"], env={"PLUGRT_AUTOLOAD": "0"}, autoload=None)
  assert ours(explicit.available()) == ["PYTHON"]
  on = load(plugins=["plugrt.reference"], env={}, autoload=True)  # an explicit list plus autoload
  assert ours(on.available()) == ["CPU", "VIAENTRY", "PYTHON"] and on.backends["PYTHON"].reason is None  # the same module once: no conflict


def test_extra_plugins(fake_plugins):
  good = fake_plugins.module(backend_source("EXTRAGOOD", priority=50))
  ghost = f"ghost_{uuid.uuid4().hex[:10]}"
  reg = load(env={"PLUGRT_EXTRA_PLUGINS": f" {good} , {ghost},plugrt.reference"})
  assert reg.default == "EXTRAGOOD" and run_tiny(reg, "EXTRAGOOD") == 42.0
  assert reg.backends[ghost.upper()].reason is Reason.IMPORT_ERROR
  assert reg.backends[ghost.upper()].hint == f"reinstall {ghost}, or disable it with PLUGRT_DISABLE={ghost}"
  assert reg.backends["PYTHON"].reason is None  # found by entry point and named again: loaded once
  for good_name in GOOD: assert run_tiny(reg, good_name) == 42.0
  off = load(env={"PLUGRT_EXTRA_PLUGINS": good, "PLUGRT_DISABLE": good})
  assert off.backends[good.upper()].reason is Reason.DISABLED and "EXTRAGOOD" not in off.backends


@pytest.mark.parametrize("value", ["yes", "true", "2", "off"])
def test_bad_autoload_value(value):
  reg = Registry(env={"PLUGRT_AUTOLOAD": value})
  with pytest.raises(EnvError, match=f"PLUGRT_AUTOLOAD={value!r} is not 0 or 1") as ei:
    reg.load()
  assert ei.value.hint == "set PLUGRT_AUTOLOAD=0 or PLUGRT_AUTOLOAD=1, or unset it"


def test_registry_fixture_and_isolated(fake_plugins, plugrt_registry):
  import plugrt
  from plugrt import Device
  mod = fake_plugins.backend("FIX", priority=-500)  # installed, but an isolated registry ignores entry points
  outer = current()
  with plugrt_registry(["plugrt.reference"], env={"PYTHON": "1"}) as reg:
    assert current() is reg and Device.registry is reg
    assert Device.DEFAULT == "PYTHON" and ours(reg.available()) == ["PYTHON"]
    assert "FIX" not in reg.load().backends and reg.backends["CPU"].reason is Reason.NOT_INSTALLED
  assert current() is outer
  module = __import__(mod)
  with isolated([module], env={"FIX": "1"}) as reg:
    assert plugrt.Device.DEFAULT == "FIX" and run_tiny(reg, "FIX") == 42.0
    assert reg.backends["FIX"].plugin.source == "explicit"
  assert current() is outer


# ---------------------------------------------------------------- automatic choice

def test_automatic_choice_is_priority_then_name(fake_plugins):
  for name, prio in [("ZED", 50), ("MID", 0), ("ACE", 50), ("LOW", -200), ("NONE", 99)]:
    fake_plugins.backend(name, priority=prio, count=0 if name == "NONE" else 1)
  reg = load(env={})
  assert ours(reg.available()) == ["ACE", "ZED", "CPU", "MID", "PYTHON", "LOW"]
  assert reg.default == "ACE" and load(env={}).default == "ACE"
  assert load(env={"PLUGRT_DISABLE": "ace"}).default == "ZED"
  with pytest.raises(DeviceUnavailable, match="no NONE here") as ei:
    _ = load(env={"NONE": "1"}).default
  assert ei.value.reason is Reason.NO_DEVICE and ei.value.hint == "plug a NONE in"
  assert ours(ei.value.available) == ["ACE", "ZED", "CPU", "MID", "PYTHON", "LOW"]


def test_a_device_that_fails_to_open_is_skipped_quietly(fake_plugins, capfd, recwarn):
  extra = """
  @hookimpl
  def plugrt_open_device(device: DeviceInfo) -> Any:
    raise OSError('/dev/fake0: permission denied')
  """
  fake_plugins.backend("FLAKY", priority=100, entry="flaky", extra=extra)
  fake_plugins.backend("NEXT", priority=60)
  reg = load(env={})
  assert ours(reg.available())[:2] == ["FLAKY", "NEXT"]
  assert reg.default == "NEXT"
  err = reg.backends["FLAKY"].open_error
  assert isinstance(err, DeviceUnavailable) and err.reason is Reason.OPEN_FAILED
  assert "FLAKY failed to open: OSError: /dev/fake0: permission denied" in str(err) and "PLUGRT_DISABLE=flaky" in err.hint
  assert capfd.readouterr() == ("", "") and len(recwarn) == 0  # quiet
  named = load(env={"FLAKY": "1"})
  with pytest.raises(DeviceUnavailable, match="FLAKY failed to open: OSError") as ei:
    _ = named.default
  assert ei.value.reason is Reason.OPEN_FAILED and ours(ei.value.available) == ["NEXT", "CPU", "PYTHON"]
  assert isinstance(ei.value.__cause__, OSError)


def test_no_device_at_all():
  with isolated([]) as reg:
    with pytest.raises(DeviceUnavailable, match="no device is available") as ei:
      _ = reg.default
  assert ei.value.reason is Reason.NO_DEVICE


def test_compiler_choice_and_missing_toolchain(fake_plugins):
  fake_plugins.backend("MULTI", compilers=("FAST", "SLOW", "ODD"), missing=("FAST", "ODD"))
  reg = load(env={})
  assert reg.choose_compiler("MULTI") == ("SLOW", "FAST unavailable (the fake toolchain is not on PATH)")
  assert reg.open("MULTI").info.compiler == "SLOW"
  assert load(env={"MULTI_SLOW": "1"}).open("MULTI").info.compiler == "SLOW"
  with pytest.raises(DeviceUnavailable, match="MULTI_ODD=1: compiler ODD of MULTI cannot be used") as ei:
    load(env={"MULTI_ODD": "1"}).open("MULTI")
  assert ei.value.reason is Reason.MISSING_TOOLCHAIN and ei.value.hint == "install the fake toolchain"


# ---------------------------------------------------------------- interfaces

IFACE_EXTRA = """
OK = {{"KFD": {kfd}, "PCI": {pci}, "NVK": True, "DRM": True}}


def iface_probe(name: str) -> Any:
  return lambda: Probe.found(1, name) if OK[name] else Probe.missing(Reason.NO_DEVICE, f"no {{name}} driver", "load it")
"""

USB_PLUGIN = """
from typing import Any

from plugrt.errors import Reason
from plugrt.hookspecs import DeviceInfo, InterfaceSpec, Probe, hookimpl

OPENED = []


@hookimpl
def plugrt_interfaces() -> list[InterfaceSpec]:
  return [InterfaceSpec("{device}", "USB", lambda: Probe.found(1) if {usb} else Probe.missing(Reason.NO_DEVICE, "no USB device"))]


@hookimpl
def plugrt_open_interface(device: DeviceInfo, interface: str) -> Any:
  handle = ("usb-handle", device.name, device.index, interface)
  OPENED.append(handle)
  return handle
"""


def make_iface_backend(fake: FakePlugins, kfd: bool = True, pci: bool = True, usb: bool = True, priority: int = 100) -> tuple[str, str]:
  name = "IDEV"
  mod = fake.backend(name, priority=priority, extra=IFACE_EXTRA.format(kfd=kfd, pci=pci),
                     interfaces='(InterfaceSpec("IDEV", "KFD", iface_probe("KFD")), InterfaceSpec("IDEV", "PCI", iface_probe("PCI"), auto=False))')
  usb_mod = fake.plugin(textwrap.dedent(USB_PLUGIN.format(device=name, usb=usb)), entry="idev-usb", dist="plugrt-idev-usb")
  return mod, usb_mod


@pytest.mark.parametrize(("kfd", "chosen"), [(True, "KFD"), (False, "USB")])
def test_interfaces_automatic_choice_never_picks_pci(fake_plugins, kfd, chosen):
  # KFD gone: the next automatic interface is the third party's USB, never PCI (whose probe succeeds)
  make_iface_backend(fake_plugins, kfd=kfd)
  reg = load(env={})
  assert [i.name for i, _ in reg.interfaces["IDEV"]] == ["KFD", "PCI", "USB"]
  assert reg.default == "IDEV" and reg.open("IDEV").info.interface == chosen
  assert (reg.open("IDEV").info.iface_object is None) == (chosen == "KFD")  # its own interface: the device's hooks open it


@pytest.mark.parametrize("env", [{"IDEV_IFACE": "PCI"}, {"IDEV_IFACE": "pci"}, {"DEV": "PCI+IDEV"}, {"DEV": "pci:0+idev"}])
def test_interface_named_by_the_environment(fake_plugins, env):
  make_iface_backend(fake_plugins)
  reg = load(env=env)
  assert reg.default == "IDEV" and reg.open("IDEV").info.interface == "PCI"
  assert run_tiny(reg, "IDEV") == 42.0


def test_third_party_interface_object_reaches_the_device_hooks(fake_plugins):
  mod, usb_mod = make_iface_backend(fake_plugins)
  reg = load(env={"IDEV_IFACE": "USB"})
  dev = reg.open("IDEV")
  handle = ("usb-handle", "IDEV", 0, "USB")
  assert dev.info.interface == "USB" and dev.info.iface_object == handle
  assert sys.modules[usb_mod].OPENED == [handle]
  assert ("allocator", handle) in fake_plugins.calls(mod)


def test_unknown_interface_gets_did_you_mean(fake_plugins):
  make_iface_backend(fake_plugins)
  with pytest.raises(UnknownDeviceError, match=r"IDEV_IFACE=PCX: IDEV has no interface PCX \(did you mean PCI\?\)") as ei:
    _ = load(env={"IDEV_IFACE": "PCX"}).default
  assert ei.value.hint == "IDEV interfaces: KFD, PCI, USB"
  with pytest.raises(UnknownDeviceError, match=r"has no interface USV \(did you mean USB\?\)"):
    _ = load(env={"DEV": "USV+IDEV"}).default


def test_only_pci_available(fake_plugins):
  make_iface_backend(fake_plugins, kfd=False, usb=False)
  reg = load(env={})
  assert reg.available()[0] == "IDEV" and reg.default == "CPU"  # skipped quietly
  err = reg.backends["IDEV"].open_error
  assert err is not None and err.reason is Reason.NO_DEVICE
  with pytest.raises(DeviceUnavailable) as ei:
    reg.open("IDEV")
  msg = str(ei.value)
  assert "IDEV has no usable interface" in msg and "KFD: no KFD driver" in msg and "USB: no USB device" in msg
  assert "PCI is never chosen automatically (set IDEV_IFACE=PCI)" in msg
  assert load(env={"IDEV_IFACE": "PCI"}).open("IDEV").info.interface == "PCI"
  with pytest.raises(DeviceUnavailable, match="IDEV_IFACE=KFD: interface KFD of IDEV cannot be used: no KFD driver") as ei:
    load(env={"IDEV_IFACE": "KFD"}).open("IDEV")
  assert ei.value.reason is Reason.NO_DEVICE and ei.value.hint == "load it"


def test_own_interfaces_keep_their_declared_order(fake_plugins):
  fake_plugins.backend("ODEV", extra=IFACE_EXTRA.format(kfd=True, pci=True),
                       interfaces='(InterfaceSpec("ODEV", "NVK", iface_probe("NVK")), InterfaceSpec("ODEV", "DRM", iface_probe("DRM")))')
  reg = load(env={})
  assert [i.name for i, _ in reg.interfaces["ODEV"]] == ["NVK", "DRM"]
  assert reg.open("ODEV").info.interface == "NVK"


# ---------------------------------------------------------------- device strings and public names

def test_device_strings():
  from plugrt import Device, dtypes
  assert dtypes.float32.itemsize == 4
  with isolated(["plugrt.reference", "plugrt_cpu"]):
    assert isinstance(Device.DEFAULT, str) and Device.DEFAULT == "CPU"
    cpu = Device["cpu"]
    assert cpu is Device["CPU"] is Device["CPU:0"] is Device[" Cpu "] and cpu.canonical == "CPU"
    with pytest.raises(DeviceUnavailable, match="CPU:1 does not exist: CPU has 1 device") as ei:
      Device["CPU:1"]
    assert ei.value.reason is Reason.NO_DEVICE and ours(ei.value.available) == ["CPU:0", "PYTHON"]  # the index that exists, first
    with pytest.raises(UnknownDeviceError, match="'CPU:LLVM' is not a device name") as ui:
      Device["CPU:LLVM"]
    assert "DEV=CPU:LLVM" in ui.value.hint
    with pytest.raises(TypeError, match="not int"):
      Device[3]  # type: ignore[index]
    with pytest.raises(UnknownDeviceError, match=r"no backend is named PYTHONN \(did you mean PYTHON\?\)"):
      Device["PYTHONN"]
    with pytest.raises(DeviceUnavailable) as ei:
      Device["CUDA:1"]
    assert ei.value.reason is Reason.NOT_INSTALLED


# ---------------------------------------------------------------- the launch path and import cost

def test_no_hook_on_the_launch_path(monkeypatch):
  import numpy as np

  from plugrt.compiler.samples import tiny_kernel
  from plugrt.device import Buffer
  calls: list[str] = []
  orig = Registry.call_hook

  def counting(self, rec, hook, **kw):
    calls.append(hook)
    return orig(self, rec, hook, **kw)

  with isolated(["plugrt_cpu", "plugrt.reference"]) as reg:
    for name in GOOD:
      dev = reg.open(name)
      prg = dev.program(tiny_kernel())
      out, x = Buffer(dev, 1), Buffer(dev, 1).copyin(np.array([1.0], np.float32))
      monkeypatch.setattr(Registry, "call_hook", counting)
      for _ in range(1000): prg(out, x)
      dev.synchronize()
      assert calls == [], name
      assert float(out.numpy()[0]) == 2.0
      monkeypatch.setattr(Registry, "call_hook", orig)
    monkeypatch.setattr(Registry, "call_hook", counting)
    reg.open("PYTHON:0")  # cached: no hook either
    assert calls == []
  with isolated(["plugrt.reference"]) as reg:
    reg.open("PYTHON")  # the counter does count hook calls
  assert "plugrt_allocator" in calls


def test_import_is_cheap(fake_plugins):
  fake_plugins.backend("CHEAP", priority=20)
  r = fake_plugins.run_python("""
    import sys
    import plugrt
    first = sorted(m for m in ("pluggy", "numpy", "llvmlite", "plugrt.registry") if m in sys.modules)
    names = plugrt.Device.available()
    second = sorted(m for m in ("numpy", "llvmlite") if m in sys.modules)
    print(first, second, [n for n in names if n not in ("CL", "WEBGPU", "INTERP")])
  """)
  assert r.returncode == 0, r.stderr
  assert r.stdout.split() == ["[]", "[]", "['CHEAP',", "'CPU',", "'PYTHON']"]


def test_discovery_leaves_out_the_slow_stdlib(fake_plugins):
  """Discovery's own budget: no dataclasses (exec per method), shutil (zlib, bz2, lzma), importlib.metadata, ctypes, nor
  pluggy and its inspect (plugrt checks the hooks itself: test_hook_checks_agree_with_pluggy),
  in a process that has not imported them before. (threading is imported on purpose before the plugin worker starts:
  see test_a_plugin_importing_threading_on_the_worker_lets_the_process_exit.)"""
  fake_plugins.backend("CHEAP", priority=20)
  r = fake_plugins.run_python("""
    import sys
    slow = ("dataclasses", "shutil", "importlib.metadata", "ctypes", "pluggy", "inspect")
    before = [m for m in slow if m in sys.modules]
    import plugrt
    plugrt.Device.available()
    print([m for m in slow if m in sys.modules and m not in before])
  """)
  assert r.returncode == 0, r.stderr
  assert r.stdout.strip() == "[]"


def test_a_plugin_importing_threading_on_the_worker_lets_the_process_exit(fake_plugins):
  """Plugin code runs on a worker thread. Were threading first imported there (a plugin's import of wgpu), threading would
  take the worker for the main thread, and the interpreter's exit would wait forever on a non-daemon thread the plugin
  started (wgpu's poller hung `plugrt devices --json` in a fresh venv)."""
  import subprocess
  fake_plugins.backend("THREADY", priority=20, extra='''
import threading as _threading
_stop = _threading.Event()
_threading.Thread(target=_stop.wait, name="poller").start()  # a non-daemon thread, stopped at exit as wgpu stops its own
import atexit as _atexit
_atexit.register(_stop.set)
''')
  try: r = fake_plugins.run_python("""
    import sys
    sys.modules.pop("threading", None)  # as in a process that has not imported it yet (here a .pth may have)
    import plugrt
    plugrt.Device.available()
    print("done")
  """)
  except subprocess.TimeoutExpired: raise AssertionError("the process did not exit: threading took the plugin worker for the main thread") from None
  assert r.returncode == 0 and r.stdout.strip() == "done", r.stderr


def test_pluggy_registers_only_the_hook_functions():
  """What pluggy scans is the plugin's hooks, not every import and helper of its module; a plugin given
  as an object has its hooks as methods."""
  from plugrt.hookspecs import BackendSpec, Probe, hookimpl
  from plugrt.reference import backend as ref_backend

  class ObjectPlugin:
    helper = "not a hook"

    @hookimpl
    def plugrt_backends(self) -> list[BackendSpec]: return [BackendSpec("OBJ", "1.0", lambda: Probe.found(1, "object"))]
    @hookimpl
    def plugrt_allocator(self, device): return ref_backend.PythonAllocator(device)
    @hookimpl
    def plugrt_compiler(self, device, compiler): return ref_backend.PythonCompiler(device)
    @hookimpl
    def plugrt_program(self, device): return ref_backend.PythonProgram

  with isolated([ObjectPlugin(), "plugrt.reference"]) as reg:
    assert reg.available() == ["OBJ", "PYTHON"]
    for rec in reg.plugins:
      registered = {n for n in vars(rec.hooks) if not n.startswith("__")}
      assert registered and all(n.startswith("plugrt_") for n in registered), (rec.module_name, registered)


def _hook_variants() -> dict[str, Any]:
  """Plugins, each a class whose instance holds some hook functions, that pluggy accepts or refuses for one reason."""
  import functools

  import pluggy

  from plugrt.hookspecs import hookimpl
  pluggy_impl = pluggy.HookimplMarker("plugrt")

  def program(device): return None

  class Fine:
    @hookimpl
    def plugrt_allocator(self, device): return None
    @hookimpl(specname="plugrt_compiler")
    def make_compiler(self, device, compiler): return None
    @hookimpl
    def plugrt_program(self, device, unused=None): return None  # a defaulted argument is not asked for
    @staticmethod
    @hookimpl
    def plugrt_graph(device): return None

  class FewerArgs:
    @hookimpl
    def plugrt_compiler(self, compiler): return None
    @pluggy_impl  # pluggy's own marker is the same contract
    def plugrt_allocator(self): return None

  class WrongArg:
    @hookimpl
    def plugrt_allocator(self, dev): return None

  class Unknown:
    @hookimpl
    def plugrt_alocator(self, device): return None

  class OptionalUnknown:
    @hookimpl(optionalhook=True)
    def plugrt_future_hook(self, device, something): return None

  class NotARoutine:  # pluggy registers functions and methods only: a marked partial is not a hook
    plugrt_program = hookimpl(functools.partial(program))

  class Wrapper:
    @hookimpl(wrapper=True)
    def plugrt_allocator(self, device):
      return (yield)

  return {c.__name__: c() for c in (Fine, FewerArgs, WrongArg, Unknown, OptionalUnknown, NotARoutine, Wrapper)}


def test_hook_checks_agree_with_pluggy():
  """plugrt checks hook signatures itself, so that discovery never imports pluggy; on every kind of hook function the
  verdict is pluggy's (register: arguments a spec does not pass; check_pending: hooks without a spec), except that
  plugrt also refuses wrappers, which it never calls as pluggy would."""
  import pluggy

  from plugrt import hookspecs
  from plugrt.registry import _check_hooks, _hook_functions
  for name, plugin in _hook_variants().items():
    pm = pluggy.PluginManager("plugrt")
    pm.add_hookspecs(hookspecs)
    try:
      pm.register(_hook_functions(plugin))
      pm.check_pending()
      pluggy_ok = True
    except pluggy.PluginValidationError:
      pluggy_ok = False
    impls, bad, unknown = _check_hooks(_hook_functions(plugin))
    if name == "Wrapper":
      assert pluggy_ok and bad and "wrapper" in bad[0], bad
      continue
    assert (not bad and not unknown) == pluggy_ok, (name, bad, unknown)
    if pluggy_ok:  # the same hooks, each given the arguments pluggy would pass
      theirs = {h: tuple(i.argnames) for h in hookspecs.__dict__ if h.startswith("plugrt_") and hasattr(pm.hook, h)
                for i in getattr(pm.hook, h).get_hookimpls()}
      assert {h: a for h, (_, a) in impls.items()} == theirs, name
  assert "did you mean plugrt_allocator" in _check_hooks(_hook_functions(_hook_variants()["Unknown"]))[2][0]


def test_the_plugin_manager_is_pluggys_view_of_the_loaded_plugins():
  with isolated(["plugrt.reference"]) as reg:
    assert "pluggy" in sys.modules or True  # (the test process has imported it for other tests)
    pm = reg.plugin_manager
    assert pm is reg.plugin_manager and pm.project_name == "plugrt"
    names = [b.name for specs in pm.hook.plugrt_backends() for b in specs]
    assert names == ["PYTHON"]


def test_entry_modules_import_only_stdlib_and_plugrt():
  from plugrt._entrypoints import entry_points
  mods = sorted({ep.module for ep in entry_points("plugrt")})
  assert {"plugrt.reference", "plugrt_cpu"} <= set(mods)
  code = textwrap.dedent("""
    import importlib, json, sys
    import plugrt.registry
    bad = {}
    for mod in sys.argv[1:]:
      before = set(sys.modules)
      importlib.import_module(mod)
      new = {m.split(".")[0] for m in set(sys.modules) - before}
      bad[mod] = sorted(m for m in new if m not in sys.stdlib_module_names and m not in ("plugrt", mod.split(".")[0]))
    print(json.dumps(bad))
  """)
  r = subprocess.run([sys.executable, "-c", code, *mods], capture_output=True, text=True, timeout=60)
  assert r.returncode == 0, r.stderr
  assert json.loads(r.stdout) == {m: [] for m in mods}


def test_plugrt_error_types():
  assert issubclass(DeviceUnavailable, (PlugrtError, RuntimeError)) and issubclass(UnknownDeviceError, ValueError)
  e = DeviceUnavailable("X cannot be used", Reason.NO_DEVICE, "plug it in", [])
  assert str(e) == "X cannot be used [no device]; no other device is available (fix: plug it in)"
