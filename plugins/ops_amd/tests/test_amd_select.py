"""AMD's selection, probes and refusals: no GPU, no sysfs writes, no device opened for real."""
from __future__ import annotations

import os

import pytest

import plugrt_amd
import plugrt_amd_kfd
import plugrt_amd_pci
import plugrt_amd_usb
from plugrt.context import DeviceInfo, PluginContext
from plugrt.errors import ConflictError, DeviceUnavailable, EnvError, Reason, UnknownDeviceError
from plugrt.registry import Registry
from plugrt_amd.device import AcknowledgementRequired, AMDNotImplemented

PLUGINS = [plugrt_amd, plugrt_amd_kfd, plugrt_amd_pci, plugrt_amd_usb]


def registry(**env: str) -> Registry:
  return Registry(plugins=PLUGINS, env={"PATH": os.environ.get("PATH", ""), **env}).load()


def test_declarations() -> None:
  reg = registry()
  spec = reg.backend("AMD").spec
  assert [c.name for c in spec.compilers] == ["LLVM", "HIP"]
  assert [(i.name, i.auto) for i, _ in reg.interfaces["AMD"]] == [("KFD", True), ("PCI", False), ("USB", False)]


@pytest.mark.parametrize("env, default, compiler, iface, arch", [
  ({"AMD": "1"}, "AMD", "", "", ""),
  ({"AMD_LLVM": "1"}, None, "LLVM", "", ""),
  ({"AMD_HIP": "1", "AMD": "1"}, "AMD", "HIP", "", ""),
  ({"AMD_IFACE": "usb"}, None, "", "USB", ""),
  ({"DEV": "KFD+AMD:LLVM:gfx1100"}, "AMD", "LLVM", "KFD", "gfx1100"),
  ({"DEV": "AMD:1"}, "AMD:1", "", "", ""),
  ({"DEV": "PCI+AMD:1:HIP:gfx942", "AMD_IFACE": "PCI", "AMD_HIP": "1"}, "AMD:1", "HIP", "PCI", "gfx942"),
])
def test_selection(env: dict, default: str | None, compiler: str, iface: str, arch: str) -> None:
  sel = registry(**env).selection
  assert (sel.default.device_string if sel.default else None) == default
  assert (sel.compiler["AMD"].compiler if "AMD" in sel.compiler else "") == compiler
  assert (sel.interface["AMD"].interface if "AMD" in sel.interface else "") == iface
  assert (sel.arch["AMD"].arch if "AMD" in sel.arch else "") == arch


@pytest.mark.parametrize("env, both", [
  ({"AMD_LLVM": "1", "AMD_HIP": "1"}, ("AMD_HIP=1", "AMD_LLVM=1")),
  ({"AMD_IFACE": "PCI", "DEV": "KFD+AMD"}, ("AMD_IFACE=PCI", "DEV=KFD+AMD")),
  ({"AMD_HIP": "1", "DEV": "AMD:LLVM"}, ("AMD_HIP=1", "DEV=AMD:LLVM")),
  ({"AMD": "1", "CPU": "1"}, ("AMD=1", "CPU=1")),
])
def test_conflicts_name_both(env: dict, both: tuple[str, str]) -> None:
  import plugrt.reference
  with pytest.raises(ConflictError) as e: Registry(plugins=[*PLUGINS, plugrt.reference], env=env).load().selection  # noqa: B018
  assert all(b in str(e.value) for b in both)


def test_unknown_names() -> None:
  with pytest.raises(UnknownDeviceError, match="no interface FOO"): registry(AMD_IFACE="FOO").selection  # noqa: B018
  with pytest.raises(UnknownDeviceError, match="did you mean LLVM"): registry(DEV="AMD:LVM").selection  # noqa: B018


def test_no_device_here_explains_and_never_crashes(monkeypatch) -> None:
  monkeypatch.setattr(plugrt_amd, "kfd_gpus", lambda *a: [])
  monkeypatch.setattr(plugrt_amd, "pci_gpus", lambda *a: [])
  monkeypatch.setattr(plugrt_amd_usb, "bridges", lambda *a: [])
  monkeypatch.setattr(plugrt_amd_kfd.os.path, "exists", lambda p: False)
  reg = registry(AMD="1")
  p = reg.probe("AMD")
  assert not p.ok and p.reason is Reason.NO_DEVICE and "0x1002" in p.detail and "amdgpu" in p.hint
  with pytest.raises(DeviceUnavailable, match="no AMD GPU") as e: reg.default  # noqa: B018
  assert e.value.reason is Reason.NO_DEVICE
  for spec, _ in reg.interfaces["AMD"]:
    ip = reg.interface_probe(spec)
    assert not ip.ok and ip.hint, spec.name
  assert "/dev/kfd does not exist" in reg.interface_probe(reg.interfaces["AMD"][0][0]).detail
  # the compilers still work: LLVM is usable here, HIP says what is missing
  assert reg.compiler_probe("AMD", "LLVM").ok
  hip = reg.compiler_probe("AMD", "HIP")
  assert hip.ok or (hip.reason is Reason.MISSING_TOOLCHAIN and "ROCm" in hip.hint)


def _fake_gpu(monkeypatch, kfd: bool) -> None:
  monkeypatch.setattr(plugrt_amd, "kfd_gpus", lambda *a: [(1, 110000)] if kfd else [])
  monkeypatch.setattr(plugrt_amd, "pci_gpus", lambda *a: [("0000:03:00.0", 0x744C, 0x030000, "amdgpu" if kfd else "")])
  real = os.path.exists
  monkeypatch.setattr(plugrt_amd_kfd.os.path, "exists", lambda p: kfd if p == plugrt_amd_kfd.KFD else real(p))
  monkeypatch.setattr(plugrt_amd_kfd.os, "access", lambda p, m: True)


def test_kfd_opens_through_the_real_kernel_seam(monkeypatch) -> None:
  """With /dev/kfd (faked here) but no KFD topology, opening goes to the real kernel seam and says what is missing."""
  _fake_gpu(monkeypatch, kfd=True)
  reg = registry(DEV="KFD+AMD:LLVM:gfx1100")
  assert reg.probe("AMD").ok and "gfx1100" in reg.probe("AMD").detail and "never run on AMD hardware" in reg.probe("AMD").detail
  with pytest.raises(DeviceUnavailable, match="KFD"): reg.open("AMD")
  # tried automatically, it fails quietly and the next device is chosen
  import plugrt.reference
  auto = Registry(plugins=[*PLUGINS, plugrt.reference], env={"PATH": os.environ.get("PATH", "")}).load()
  assert auto.default == "PYTHON" and isinstance(auto.backend("AMD").open_error, DeviceUnavailable)


@pytest.mark.parametrize("iface, module", [("PCI", plugrt_amd_pci), ("USB", plugrt_amd_usb)])
def test_pci_and_usb_are_never_automatic_and_refuse(monkeypatch, iface: str, module) -> None:
  _fake_gpu(monkeypatch, kfd=False)
  monkeypatch.setattr(plugrt_amd_usb, "bridges", lambda *a: [("2-1", 0x174C, 0x2464, "ASMedia ASM2464PD")])
  reg = registry()
  with pytest.raises(DeviceUnavailable, match=f"{iface} is never chosen automatically"): reg.open("AMD")
  p = reg.interface_probe(next(i for i, _ in reg.interfaces["AMD"] if i.name == iface))
  assert p.ok and "not implemented" in p.detail and "PLUGRT_AMD_ALLOW_UNBIND=1" in p.detail
  assert "0000:03:00.0" in p.detail or "174c:2464" in p.detail
  with pytest.raises(AcknowledgementRequired, match="PLUGRT_AMD_ALLOW_UNBIND=1 is not set"): registry(**{"AMD_IFACE": iface}).open("AMD")
  # acknowledged, opening goes to the hardware (sysfs, libusb), which is not here: a typed reason, never a crash
  # (the bring-up itself is tested against fakes in iface_pci/tests and iface_usb/tests)
  with pytest.raises(DeviceUnavailable):
    registry(**{"DEV": f"{iface}+AMD", "PLUGRT_AMD_ALLOW_UNBIND": "1"}).open("AMD")
  # the interface's own open: the acknowledgement first, then what is missing
  info = DeviceInfo("AMD", 0, "LLVM", iface, context=PluginContext({}))
  with pytest.raises(AcknowledgementRequired, match="PLUGRT_AMD_ALLOW_UNBIND=1 is not set"): module.plugrt_open_interface(info, iface)
  info = DeviceInfo("AMD", 0, "LLVM", iface, context=PluginContext({"PLUGRT_AMD_ALLOW_UNBIND": "1"}))
  with pytest.raises(DeviceUnavailable): module.plugrt_open_interface(info, iface)
  maybe = DeviceInfo("AMD", 0, "LLVM", iface, context=PluginContext({"PLUGRT_AMD_ALLOW_UNBIND": "maybe"}))
  with pytest.raises(EnvError): module.plugrt_open_interface(maybe, iface)


def test_sysfs_readers(tmp_path) -> None:
  topo = tmp_path / "topology"
  for node, version in (("0", "0"), ("1", "110000"), ("2", "90010")):
    (topo / node).mkdir(parents=True)
    (topo / node / "properties").write_text(f"cpu_cores_count 0\ngfx_target_version {version}\n")
  assert plugrt_amd.kfd_gpus(str(topo)) == [(1, 110000), (2, 90010)]
  from plugrt_amd.hw import arch_from_target_version
  assert [arch_from_target_version(v) for _, v in plugrt_amd.kfd_gpus(str(topo))] == ["gfx1100", "gfx90a"]
  pci = tmp_path / "pci"
  for addr, vendor, cls in (("0000:03:00.0", "0x1002", "0x030000"), ("0000:03:00.1", "0x1002", "0x040300"),
                            ("0000:04:00.0", "0x10de", "0x030200"), ("0000:05:00.0", "0x1002", "0x120000")):
    (pci / addr).mkdir(parents=True)
    (pci / addr / "vendor").write_text(vendor + "\n"); (pci / addr / "class").write_text(cls + "\n"); (pci / addr / "device").write_text("0x74a1\n")
  assert [(a, c) for a, _, c, _ in plugrt_amd.pci_gpus(str(pci))] == [("0000:03:00.0", 0x030000), ("0000:05:00.0", 0x120000)]
  usb = tmp_path / "usb"
  for name, v, p in (("1-1", "174c", "2464"), ("1-2", "174c", "55aa"), ("2-1", "add1", "0001")):
    (usb / name).mkdir(parents=True)
    (usb / name / "idVendor").write_text(v + "\n"); (usb / name / "idProduct").write_text(p + "\n")
  assert [(n, v, p) for n, v, p, _ in plugrt_amd_usb.bridges(str(usb))] == [("1-1", 0x174C, 0x2464), ("2-1", 0xADD1, 0x0001)]
  assert plugrt_amd.kfd_gpus(str(tmp_path / "none")) == [] and plugrt_amd.pci_gpus(str(tmp_path / "none")) == []


def test_compiler_through_the_registry_reads_dev_arch(monkeypatch) -> None:
  """The hook builds the compiler from DeviceInfo alone: DEV's ARCH reaches it."""
  info = DeviceInfo("AMD", 0, "LLVM", None, "gfx942", context=PluginContext({"PATH": os.environ.get("PATH", ""), "PLUGRT_CACHE": "0"}))
  c = plugrt_amd.plugrt_compiler(info, "LLVM")
  assert c.arch == "gfx942" and c.name == "LLVM"
  from plugrt_amd.runtime import AMDProgram
  assert plugrt_amd.plugrt_program(info) is AMDProgram
  # an interface that gives the device no GPUInterface is refused with a typed reason
  with pytest.raises(AMDNotImplemented, match="gave the device no such object"): plugrt_amd.plugrt_open_device(info)


def test_the_device_code_asks_no_interface_what_it_is() -> None:
  """One device, allocator and program for every interface: plugrt-amd's hooks and device code reach the interface
  through plugrt_amd.iface.GPUInterface only, never by probing the object for attributes (hasattr, getattr of the
  interface object or the device state)."""
  import ast
  import pathlib
  found = []
  for path in sorted(pathlib.Path(plugrt_amd.__file__).parent.glob("*.py")):
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
      if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("hasattr", "getattr") and node.args:
        what = ast.unparse(node.args[0])
        if node.func.id == "hasattr" or "iface" in what or "state" in what: found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
  assert not found, found
  info = DeviceInfo("AMD", 0, "LLVM", "PCI", context=PluginContext({}))
  from plugrt_amd.runtime import AMDProgram
  assert plugrt_amd.plugrt_program(info) is AMDProgram


def test_self_check_runs_without_a_gpu(capsys, monkeypatch, tmp_path) -> None:
  from plugrt_amd.__main__ import main
  monkeypatch.setenv("PLUGRT_CACHE_DIR", str(tmp_path))
  assert main(["gfx1201"]) == 0
  out = capsys.readouterr().out
  assert "gfx1201: code object v5" in out and "wave32" in out and "interface KFD" in out and "never run on an AMD GPU" in out
  assert main(["gfx9999"]) == 1 and "no architecture 'gfx9999'" in capsys.readouterr().out
