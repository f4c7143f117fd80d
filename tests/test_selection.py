"""Selection, exactly per DESIGN.md's environment table: unit tests on plugrt.selection,
then end to end through a Registry with the real CPU and PYTHON backends."""
from __future__ import annotations

import pytest
from conftest import run_tiny

from plugrt.errors import ConflictError, DeviceUnavailable, EnvError, Reason, UnknownDeviceError
from plugrt.registry import Registry, isolated
from plugrt.selection import BackendFacts, Selection, Target, parse_dev, parse_target, select

FACTS = [
  BackendFacts("CPU", ("CLANG", "LLVM"), (), {"CLANG": "CPU:CLANG", "LLVM": "CPU:LLVM"}),
  BackendFacts("PYTHON", ("PY",)),
  BackendFacts("CUDA", ("NVRTC", "PTX")),
  BackendFacts("NV", ("NVRTC", "PTX"), ("NVK", "PCI")),
  BackendFacts("AMD", ("LLVM", "HIP"), ("KFD", "PCI", "USB")),
  BackendFacts("QCOM", ("CL",)),
  BackendFacts("METAL", ("METAL",)),
  BackendFacts("CL", ("CL",), (), {"GPU": "CL"}, installed=False),  # known by name only: aliases still work
  BackendFacts("WEBGPU", ("WGSL",)),
]


def sel(**env: str) -> Selection: return select(env, FACTS)


def target(s: Selection) -> tuple[str, str, str, str] | None:
  d = s.default
  return None if d is None else (d.device_string, d.compiler, d.interface, d.source)


# ---------------------------------------------------------------- the table, row by row

@pytest.mark.parametrize("name", ["CPU", "CUDA", "NV", "AMD", "QCOM", "METAL", "CL", "WEBGPU", "PYTHON"])
def test_device_equals_1(name):
  assert target(sel(**{name: "1"})) == (name, "", "", f"{name}=1")
  assert sel(**{name: "0"}).default is None and sel(**{name: ""}).default is None
  assert target(sel(**{name: " 1 "})) == (name, "", "", f"{name}=1")


@pytest.mark.parametrize(("alias", "device", "compiler"), [("CLANG", "CPU", "CLANG"), ("LLVM", "CPU", "LLVM"), ("GPU", "CL", "")])
def test_older_names(alias, device, compiler):
  s = sel(**{alias: "1"})
  assert target(s) == (device, compiler, "", f"{alias}=1")
  assert (s.compiler[device].compiler if compiler else s.compiler) == (compiler or {})
  assert sel(**{alias: "0"}).default is None


@pytest.mark.parametrize(("var", "device", "compiler"), [("CPU_LLVM", "CPU", "LLVM"), ("CPU_CLANG", "CPU", "CLANG"), ("CUDA_PTX", "CUDA", "PTX"),
                                                         ("NV_PTX", "NV", "PTX"), ("AMD_LLVM", "AMD", "LLVM"), ("AMD_HIP", "AMD", "HIP")])
def test_device_compiler_equals_1(var, device, compiler):
  s = sel(**{var: "1"})
  assert s.default is None  # picks a compiler, not the default device
  assert s.compiler == {device: Target(device, compiler=compiler, source=f"{var}=1")}
  assert sel(**{var: "0"}).compiler == {}
  both = sel(**{var: "1", device: "1"})  # the default carries its device's settings
  assert target(both) == (device, compiler, "", f"{device}=1")


@pytest.mark.parametrize(("var", "value", "device", "iface"), [("AMD_IFACE", "KFD", "AMD", "KFD"), ("AMD_IFACE", "pci", "AMD", "PCI"),
                                                               ("AMD_IFACE", "USB", "AMD", "USB"), ("NV_IFACE", "NVK", "NV", "NVK"),
                                                               ("NV_IFACE", " PCI ", "NV", "PCI")])
def test_device_iface(var, value, device, iface):
  s = sel(**{var: value})
  assert s.default is None and s.interface[device].interface == iface and s.interface[device].source == f"{var}={value.strip()}"
  assert target(sel(**{var: value, device: "1"})) == (device, "", iface, f"{device}=1")


@pytest.mark.parametrize(("dev", "default", "compiler", "iface", "arch"), [
  ("CPU", "CPU", "", "", ""),
  ("cpu:llvm", "CPU", "LLVM", "", ""),
  ("CUDA:PTX", "CUDA", "PTX", "", ""),
  ("CUDA:1", "CUDA:1", "", "", ""),
  ("cuda:1:ptx", "CUDA:1", "PTX", "", ""),
  ("PCI+AMD", "AMD", "", "PCI", ""),
  ("USB:0,1+AMD:LLVM:gfx1100", "AMD", "LLVM", "USB", "gfx1100"),
  ("NVK+NV:PTX:sm_90", "NV", "PTX", "NVK", "sm_90"),
  ("CPU;CUDA:PTX", "CPU", "", "", ""),
  (" CPU ; ", "CPU", "", "", ""),
])
def test_dev(dev, default, compiler, iface, arch):
  s = sel(DEV=dev)
  assert s.default is not None and s.default.source == f"DEV={dev.strip()}"
  assert (s.default.device_string, s.default.compiler, s.default.interface, s.default.arch) == (default, compiler, iface, arch)
  name = default.split(":")[0]
  assert (s.arch[name].arch if arch else s.arch) == (arch or {})


def test_dev_later_targets_set_other_devices():
  s = sel(DEV="CPU;CUDA:PTX;PCI+AMD:HIP")
  assert target(s) == ("CPU", "", "", "DEV=CPU;CUDA:PTX;PCI+AMD:HIP")
  assert s.compiler["CUDA"].compiler == "PTX" and s.compiler["AMD"].compiler == "HIP" and s.interface["AMD"].interface == "PCI"


@pytest.mark.parametrize("env", [{"DEV": ""}, {"DEV": " ; "}, {}, {"CPU": "0", "LLVM": "0", "GPU": ""}])
def test_nothing_asked(env):
  s = sel(**env)
  assert s == Selection()


# ---------------------------------------------------------------- agreeing and conflicting requests

@pytest.mark.parametrize(("env", "want"), [({"CPU": "1", "DEV": "CPU"}, ("CPU", "", "")), ({"CLANG": "1", "CPU_CLANG": "1"}, ("CPU", "CLANG", "")),
                                           ({"CPU": "1", "LLVM": "1"}, ("CPU", "LLVM", "")),
                                           ({"DEV": "CPU:LLVM", "CPU_LLVM": "1", "LLVM": "1", "CPU": "1"}, ("CPU", "LLVM", "")),
                                           ({"DEV": "PCI+AMD", "AMD_IFACE": "pci", "AMD": "1"}, ("AMD", "", "PCI"))])
def test_agreeing_requests(env, want):
  d = sel(**env).default
  assert d is not None and (d.device_string, d.compiler, d.interface) == want


@pytest.mark.parametrize(("env", "first", "second"), [
  ({"CPU": "1", "PYTHON": "1"}, "CPU=1", "PYTHON=1"),
  ({"CPU": "1", "CUDA": "1"}, "CPU=1", "CUDA=1"),
  ({"CPU_LLVM": "1", "CLANG": "1"}, "CLANG=1", "CPU_LLVM=1"),
  ({"CPU_LLVM": "1", "CPU_CLANG": "1"}, "CPU_CLANG=1", "CPU_LLVM=1"),
  ({"DEV": "CPU", "PYTHON": "1"}, "PYTHON=1", "DEV=CPU"),
  ({"DEV": "CUDA:1", "CUDA": "1"}, "CUDA=1", "DEV=CUDA:1"),
  ({"DEV": "KFD+AMD", "AMD_IFACE": "PCI"}, "AMD_IFACE=PCI", "DEV=KFD+AMD"),
  ({"DEV": "CPU:CLANG", "LLVM": "1"}, "LLVM=1", "DEV=CPU:CLANG"),
  ({"GPU": "1", "CLANG": "1"}, "CLANG=1", "GPU=1"),
])
def test_conflicts_name_both(env, first, second):
  with pytest.raises(ConflictError) as ei:
    sel(**env)
  msg = str(ei.value)
  assert first in msg and second in msg, msg
  assert ei.value.hint == "set only one of them"


# ---------------------------------------------------------------- typos, unrelated variables, bad values

@pytest.mark.parametrize(("env", "message"), [
  ({"DEV": "CPUU"}, "DEV=CPUU: no backend is named CPUU (did you mean CPU?)"),
  ({"DEV": "CUDAA:PTX"}, "DEV=CUDAA:PTX: no backend is named CUDAA (did you mean CUDA?)"),
  ({"DEV": "CPU:LVM"}, "DEV=CPU:LVM: CPU has no compiler LVM (did you mean LLVM?)"),
  ({"CPU_LVM": "1"}, "CPU_LVM=1: CPU has no compiler LVM (did you mean LLVM?)"),
  ({"CUDA_PTXX": "1"}, "CUDA_PTXX=1: CUDA has no compiler PTXX (did you mean PTX?)"),
  ({"AMD_IFACE": "PCX"}, "AMD_IFACE=PCX: AMD has no interface PCX (did you mean PCI?)"),
  ({"DEV": "KDF+AMD"}, "DEV=KDF+AMD: AMD has no interface KDF (did you mean KFD?)"),
  ({"CPU_IFACE": "PCI"}, "CPU_IFACE=PCI: CPU has no interface PCI"),
])
def test_unknown_names(env, message):
  with pytest.raises(UnknownDeviceError) as ei:
    sel(**env)
  assert ei.value.message == message
  assert ei.value.hint


def test_unknown_device_hint_lists_known_devices():
  with pytest.raises(UnknownDeviceError) as ei:
    sel(DEV="ZZZ")
  assert "did you mean" not in ei.value.message
  assert ei.value.hint == "known devices: AMD, CL, CPU, CUDA, METAL, NV, PYTHON, QCOM, WEBGPU"


@pytest.mark.parametrize("env", [{"CUDA_VISIBLE_DEVICES": "1"}, {"CPU_COUNT": "1"}, {"CPU_COUNT": "4"}, {"NV_DRIVER": "1"},
                                 {"AMD_SERIALIZE_KERNEL": "1"}, {"CPU_LLVM_PATH": "/usr/lib"}, {"DEVICE": "CUDA"}, {"TPU": "1"}])
def test_unrelated_variables_are_ignored(env):
  assert sel(**env) == Selection()


# ---------------------------------------------------------------- variables that read like mistyped requests

@pytest.mark.parametrize(("env", "note"), [
  ({"CUDAA": "1"}, "CUDAA=1 is not a device; did you mean CUDA=1?"),
  ({"CLL": "1"}, "CLL=1 is not a device; did you mean CL=1?"),
  ({"CDUA": "1"}, "CDUA=1 is not a device; did you mean CUDA=1?"),
  ({"WEBGPUU": "1"}, "WEBGPUU=1 is not a device; did you mean WEBGPU=1?"),
  ({"GPUU": "1"}, "GPUU=1 is not a device; did you mean GPU=1?"),  # an older name
  ({"CLANGG": "1"}, "CLANGG=1 is not a device; did you mean CLANG=1?"),
  ({"CPUU_LLVM": "1"}, "CPUU_LLVM=1 names no device; did you mean CPU_LLVM=1?"),
  ({"CUDDA_PTX": "1"}, "CUDDA_PTX=1 names no device; did you mean CUDA_PTX=1?"),
  ({"AMDD_IFACE": "PCI"}, "AMDD_IFACE=PCI names no device; did you mean AMD_IFACE=PCI?"),
])
def test_a_mistyped_device_variable_is_named_with_its_likely_intent(env, note):
  s = sel(**env)
  assert s.notes == (note,) and s.default is None and s == Selection()  # noted, and no request


#: variables a real machine has (a CI runner, a CUDA box, a build shell): none of them reads as a mistyped request
REALISTIC = {
  "PATH": "/usr/local/bin:/usr/bin", "HOME": "/root", "CUDA_HOME": "/usr/local/cuda", "CUDA_VISIBLE_DEVICES": "1",
  "CUDA_LAUNCH_BLOCKING": "1", "CUDA_MODULE_LOADING": "LAZY", "CC": "clang", "CXX": "clang++", "LLVM_CONFIG": "/usr/bin/llvm-config-19",
  "GPU_DEVICE_ORDINAL": "1", "GPU_MAX_HW_QUEUES": "1", "CL_CONFIG_USE_VECTORIZER": "1", "CL_LOG_ERRORS": "stdout", "CI": "1",
  "GITHUB_ACTIONS": "true", "V": "1", "DEBUG": "1", "VERBOSE": "1", "NO_COLOR": "1", "FORCE_COLOR": "1", "PYTHONUNBUFFERED": "1",
  "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1", "SHLVL": "1", "NVIDIA_VISIBLE_DEVICES": "all", "NVCC": "1",
  "HIP_VISIBLE_DEVICES": "1", "ROCR_VISIBLE_DEVICES": "1", "AMD_LOG_LEVEL": "1", "AMD_SERIALIZE_KERNEL": "1", "HSA_ENABLE_SDMA": "1",
  "METAL_DEVICE_WRAPPER_TYPE": "1", "MTL_DEBUG_LAYER": "1", "POCL_DEVICES": "pthread", "OCL_ICD_VENDORS": "/etc/OpenCL/vendors",
  "CPU": "0", "NV": "0", "NVK": "1", "WGPU": "1", "PCI": "1", "LANG": "C.UTF-8", "TERM": "xterm", "DEVICE": "CUDA", "CPU_COUNT": "1",
  "cuda": "1", "JOBS": "1", "MAKEFLAGS": "-j2", "TPU": "1", "XLA_FLAGS": "--xla_gpu_autotune_level=1", "CUDNN": "1", "CU": "1",
}


def test_a_realistic_environment_reads_as_no_mistake():
  assert sel(**REALISTIC).notes == () and sel(**REALISTIC) == Selection()
  assert select(REALISTIC, FACTS).notes == ()


def test_a_device_of_an_installed_plugin_is_no_mistake():
  facts = [*FACTS, BackendFacts("CUDAA", ("X",))]  # a third party's device, one letter from CUDA
  assert select({"CUDAA": "1"}, facts).notes == () and select({"CUDAA": "1"}, facts).default.device == "CUDAA"


def test_the_registry_warns_of_a_mistyped_variable_once():
  from plugrt.errors import EnvWarning
  with pytest.warns(EnvWarning, match=r"plugrt: CUDAA=1 is not a device; did you mean CUDA=1\?") as record:
    reg = real({"CUDAA": "1"})
    assert reg.default == "CPU" and reg.selection.notes == ("CUDAA=1 is not a device; did you mean CUDA=1?",)
    reg.selection  # noqa: B018  (made once: no second warning)
  assert len([w for w in record if issubclass(w.category, EnvWarning)]) == 1


def test_a_mistyped_variable_warns_once_on_stderr_and_the_program_runs():
  import os
  import subprocess
  import sys
  code = "from plugrt import Device, Tensor\nprint((Tensor([1, 2]) + 1).tolist(), Device.DEFAULT, Tensor([3]).tolist())"
  env = {k: v for k, v in os.environ.items() if k not in ("DEV", "CPU", "CL", "PYTHON", "WEBGPU", "PLUGRT_DISABLE")}
  r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**env, "CUDAA": "1", "CLL": "1"}, timeout=120)
  assert r.returncode == 0 and r.stdout.startswith("[2, 3] "), r.stderr
  assert r.stderr.count("CUDAA=1 is not a device; did you mean CUDA=1?") == 1 and r.stderr.count("CLL=1 is not a device; did you mean CL=1?") == 1
  quiet = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**REALISTIC, **env}, timeout=120)
  assert quiet.returncode == 0 and "EnvWarning" not in quiet.stderr, quiet.stderr


@pytest.mark.parametrize(("var", "value"), [("CPU", "yes"), ("CPU", "2"), ("CPU", "true"), ("CPU_LLVM", "on"), ("LLVM", "2"), ("GPU", "-1")])
def test_flags_are_0_or_1(var, value):
  with pytest.raises(EnvError) as ei:
    sel(**{var: value})
  assert ei.value.message == f"{var}={value!r} is not 0 or 1" and ei.value.hint == f"set {var}=1 to choose it, or unset it"


# ---------------------------------------------------------------- DEV grammar

@pytest.mark.parametrize(("text", "fields", "canonical"), [
  ("PCI+AMD", ("AMD", 0, "", "", "PCI", ""), "PCI+AMD"),
  ("USB:0,1+AMD:LLVM:gfx1100", ("AMD", 0, "LLVM", "gfx1100", "USB", "0,1"), "USB:0,1+AMD:LLVM:gfx1100"),
  ("CUDA:1", ("CUDA", 1, "", "", "", ""), "CUDA:1"),
  ("cuda:1:ptx", ("CUDA", 1, "PTX", "", "", ""), "CUDA:1:PTX"),
  ("CUDA:0:PTX:sm_90", ("CUDA", 0, "PTX", "sm_90", "", ""), "CUDA:PTX:sm_90"),
  ("amd:hip:gfx942", ("AMD", 0, "HIP", "gfx942", "", ""), "AMD:HIP:gfx942"),
  ("CPU", ("CPU", 0, "", "", "", ""), "CPU"),
])
def test_dev_grammar_round_trips(text, fields, canonical):
  t = parse_target(text)
  assert (t.device, t.index, t.compiler, t.arch, t.interface, t.iface_indices) == fields
  assert str(t) == canonical
  assert parse_target(str(t)) == t  # canonical text parses back to the same target


def test_dev_several_targets():
  ts = parse_dev("CPU;CUDA:PTX")
  assert [str(t) for t in ts] == ["CPU", "CUDA:PTX"] and all(t.source == "DEV=CPU;CUDA:PTX" for t in ts)
  assert parse_dev(";;") == []


@pytest.mark.parametrize(("text", "message"), [
  ("A+B+C", "too many '+' in target 'A+B+C'"),
  ("CPU:A:B:C", "too many ':' in target 'CPU:A:B:C'"),
  ("CUDA:1:A:B:C", "too many ':' in target 'CUDA:1:A:B:C'"),
  ("+CPU", "empty interface before '+' in target '+CPU'"),
  (":LLVM", "no device in target ':LLVM'"),
  ("PCI+", "no device in target 'PCI+'"),
  ("C-PU", "'C-PU' is not a device name"),
  ("1CPU", "'1CPU' is not a device name"),
])
def test_dev_grammar_errors(text, message):
  with pytest.raises(EnvError) as ei:
    parse_target(text, "DEV=x")
  assert ei.value.message == f"{message} in DEV=x"
  assert ei.value.hint
  with pytest.raises(EnvError):
    sel(DEV=text)


# ---------------------------------------------------------------- end to end with the real CPU and PYTHON backends

REAL = ["plugrt.reference", "plugrt_cpu"]


def real(env: dict[str, str]) -> Registry: return Registry(plugins=REAL, env=env)


@pytest.mark.parametrize(("env", "default", "compiler"), [
  ({}, "CPU", "CLANG"), ({"CPU": "1"}, "CPU", "CLANG"), ({"PYTHON": "1"}, "PYTHON", "PY"), ({"DEV": "python"}, "PYTHON", "PY"),
  ({"DEV": "PYTHON:PY"}, "PYTHON", "PY"), ({"CLANG": "1"}, "CPU", "CLANG"), ({"CPU_CLANG": "1", "CPU": "1"}, "CPU", "CLANG"),
  ({"DEV": "CPU:CLANG;PYTHON:PY"}, "CPU", "CLANG"), ({"CUDA_VISIBLE_DEVICES": "1", "CPU_COUNT": "1"}, "CPU", "CLANG"),
  ({"PYTHON": "1", "DEV": "PYTHON:0"}, "PYTHON", "PY"),
])
def test_end_to_end_default(env, default, compiler):
  with isolated(REAL, env=env) as reg:
    assert reg.default == default
    dev = reg.open(default)
    assert dev.info.compiler == compiler
    assert run_tiny(reg, default) == 42.0


def test_end_to_end_compiler_selection():
  for env in ({"CPU_LLVM": "1"}, {"LLVM": "1"}, {"DEV": "CPU:LLVM"}):
    reg = real(env)
    assert reg.selection.compiler["CPU"].compiler == "LLVM"
    assert reg.choose_compiler("CPU") == ("LLVM", "")
    assert reg.choose_compiler("PYTHON") == ("PY", "")


@pytest.mark.parametrize(("env", "error", "parts"), [
  ({"CPU": "1", "PYTHON": "1"}, ConflictError, ["CPU=1", "PYTHON=1"]),
  ({"CPU_LLVM": "1", "CLANG": "1"}, ConflictError, ["CPU_LLVM=1", "CLANG=1"]),
  ({"DEV": "CPU", "PYTHON": "1"}, ConflictError, ["DEV=CPU", "PYTHON=1"]),
  ({"DEV": "CPUU"}, UnknownDeviceError, ["no backend is named CPUU (did you mean CPU?)"]),
  ({"CPU_LVM": "1"}, UnknownDeviceError, ["CPU has no compiler LVM (did you mean LLVM?)"]),
  ({"PYTHON_PYY": "1"}, UnknownDeviceError, ["PYTHON has no compiler PYY (did you mean PY?)"]),
  ({"CPU_IFACE": "PCI"}, UnknownDeviceError, ["CPU_IFACE=PCI: CPU has no interface PCI"]),
  ({"CPU": "yes"}, EnvError, ["CPU='yes' is not 0 or 1"]),
  ({"DEV": "A+B+C"}, EnvError, ["too many '+'"]),
])
def test_end_to_end_errors(env, error, parts):
  reg = real(env)
  with pytest.raises(error) as ei:
    _ = reg.default
  for p in parts: assert p in str(ei.value)


@pytest.mark.parametrize(("env", "reason", "message"), [
  ({"CUDA": "1"}, Reason.NOT_INSTALLED, "CUDA cannot be used: plugrt-cuda is not installed"),
  ({"DEV": "CUDA:1"}, Reason.NOT_INSTALLED, "CUDA:1 cannot be used: plugrt-cuda is not installed"),
  ({"DEV": "PCI+AMD"}, Reason.NOT_INSTALLED, "AMD cannot be used: plugrt-amd is not installed"),
  ({"GPU": "1"}, Reason.NOT_INSTALLED, "CL cannot be used: plugrt-cl is not installed"),
  ({"DEV": "CPU:1"}, Reason.NO_DEVICE, "CPU:1 does not exist: CPU has 1 device"),
])
def test_a_named_device_fails_loudly_with_reason_and_available(env, reason, message):
  reg = real(env)
  with pytest.raises(DeviceUnavailable) as ei:
    _ = reg.default
  assert ei.value.reason is reason and message in str(ei.value)
  assert set(ei.value.available or ()) <= {"CPU", "PYTHON", "CPU:0"} and "PYTHON" in (ei.value.available or ())
  assert "available: " in str(ei.value)
  if env.get("DEV") == "CPU:1": assert ei.value.available[0] == "CPU:0"  # the index that exists is listed (issue 29, item 9)


def test_automatic_choice_is_deterministic():
  defaults = {real({}).default for _ in range(5)}
  assert defaults == {"CPU"}
  assert [n for n in real({}).available() if n in ("CPU", "PYTHON")] == ["CPU", "PYTHON"]
  assert real({"PLUGRT_DISABLE": "cpu"}).default == "PYTHON"


# ---------------------------------------------------------------- older names as device strings: Device["CLANG"], ["LLVM"], ["GPU"]

def _has_llvm(reg: Registry) -> bool: return reg.compiler_probe("CPU", "LLVM").ok and reg.compiler_probe("CPU", "CLANG").ok


def test_older_names_open_what_they_stand_for():
  with isolated(REAL, env={}) as reg:
    if not _has_llvm(reg): pytest.skip("needs both CPU compilers")
    cpu = reg.open("CPU")
    assert reg.open("CLANG") is cpu and reg.open("clang") is cpu  # CPU already compiles with clang: the same device
    llvm = reg.open("LLVM")
    assert llvm is not cpu and llvm.name == "CPU" and llvm.info.compiler == "LLVM" and llvm.compiler.name == "LLVM"
    assert llvm.canonical == "LLVM" and reg.open(llvm.canonical) is llvm and reg.open("llvm") is llvm  # Device[t.device] gives it back
    assert run_tiny(reg, "LLVM") == 42.0
    assert reg.alias_target("LLVM") == parse_target("CPU:LLVM", "LLVM") and reg.alias_target("CPU") is None
    assert reg.alias_target("CPX") is None


def test_an_older_name_is_its_device_when_the_environment_already_chose_that_compiler():
  with isolated(REAL, env={"CPU_LLVM": "1"}) as reg:
    if not _has_llvm(reg): pytest.skip("needs both CPU compilers")
    assert reg.open("LLVM") is reg.open("CPU") and reg.open("LLVM").canonical == "CPU"
    clang = reg.open("CLANG")
    assert clang.info.compiler == "CLANG" and clang.canonical == "CLANG"


def test_older_names_fail_as_their_device_does():
  reg = real({})
  with pytest.raises(DeviceUnavailable, match="CL cannot be used: plugrt-cl is not installed") as ei: reg.open("GPU")  # CL is not in REAL
  assert ei.value.reason is Reason.NOT_INSTALLED
  with pytest.raises(DeviceUnavailable, match="CPU:3 does not exist"): reg.open("LLVM:3")
  reg = real({"CC": "/nonexistent/cc"})  # the registry's CC: clang missing, CPU compiles with LLVM, and CLANG cannot be had
  if not reg.compiler_probe("CPU", "LLVM").ok: pytest.skip("needs llvmlite")
  with pytest.raises(DeviceUnavailable, match=r"CLANG \(CPU with CLANG\) cannot be used: CC=/nonexistent/cc") as ei: reg.open("CLANG")
  assert ei.value.reason is Reason.MISSING_TOOLCHAIN and "PYTHON" in ei.value.available
