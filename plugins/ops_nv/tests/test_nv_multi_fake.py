"""Two NV GPUs below the hardware: each index opens its own GPU (two fake GPUs), a copy between them is staged
through host memory and says so (peer_path, StagedCopyWarning, the probe's line), and the probe lists the GPUs from
the kernel driver's proc files in the driver's order (device minor)."""
from __future__ import annotations

import os
import types

import numpy as np
import pytest
from fake_gpu import FakeGPU

import plugrt_nv
from plugrt import Buffer, dtypes
from plugrt.context import PluginContext
from plugrt.errors import DeviceUnavailable, StagedCopyWarning
from plugrt.hookspecs import InterfaceSpec, Probe, hookimpl
from plugrt_nvidia_toolchain import gpus as G


def two_gpu_plugins(gpus: list[FakeGPU]) -> list[types.ModuleType]:
  """plugrt-nv with a probe finding len(gpus) GPUs, and an interface plugin opening gpus[index]."""
  nv = types.ModuleType("fake_plugrt_nv2")
  spec = plugrt_nv.plugrt_backends()[0]._replace(probe=lambda: Probe.found(len(gpus), f"{len(gpus)} fake GPUs"))
  nv.plugrt_backends = hookimpl(lambda: [spec])  # type: ignore[attr-defined]
  for hook in ("plugrt_open_device", "plugrt_allocator", "plugrt_compiler", "plugrt_program"): setattr(nv, hook, getattr(plugrt_nv, hook))
  iface = types.ModuleType("fake_nv_iface2")
  iface.plugrt_interfaces = hookimpl(lambda: [InterfaceSpec("NV", "FAKE", lambda: Probe.found(1, "fake"))])  # type: ignore[attr-defined]
  iface.plugrt_open_interface = hookimpl(lambda device, interface: gpus[device.index])  # type: ignore[attr-defined]
  return [nv, iface]


@pytest.fixture
def two(plugrt_registry):
  gpus = [FakeGPU(), FakeGPU()]
  with plugrt_registry(two_gpu_plugins(gpus), env={"NV": "1", "PLUGRT_CACHE": "0", "PLUGRT_NV_TIMEOUT": "5"}) as reg:
    devs = [reg.open("NV:0"), reg.open("NV:1")]
    for d in devs: d.allocator.kcopy = False  # no kernel copies: the fake runs the copy engine only
    yield gpus, devs, reg
  for g in gpus: g.close()


def test_each_index_opens_its_own_gpu(two):
  gpus, (d0, d1), reg = two
  assert d0 is not d1 and d0.info.state.iface is gpus[0] and d1.info.state.iface is gpus[1]
  with pytest.raises(DeviceUnavailable, match=r"NV:2 does not exist: NV has 2 devices here \(indices 0-1"): reg.open("NV:2")


@pytest.mark.parametrize("n", [1, 4096, (3 << 20) + 5])
def test_copy_between_gpus_is_staged_and_reported(two, n):
  _, (d0, d1), _ = two
  x = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8)
  a = Buffer(d0, n, dtypes.uint8).copyin(x)
  assert d0.allocator.peer_path(d1).startswith("staged through host memory (no peer mappings yet")
  with pytest.warns(StagedCopyWarning, match="copies from NV to NV:1 are staged through host memory"):
    b = a.to(d1)
  assert np.array_equal(b.numpy(), x)
  with pytest.warns(StagedCopyWarning, match="from NV:1 to NV"): c = b.to(d0)
  assert np.array_equal(c.numpy(), x)


def test_probe_lists_gpus_in_the_drivers_order(tmp_path, monkeypatch):
  for bus, minor, uuid in (("0000:18:00.0", 1, "GPU-a"), ("0000:2a:00.0", 0, "GPU-b")):  # minors against PCI order
    (tmp_path / bus).mkdir()
    (tmp_path / bus / "information").write_text(f"Model: \t\t NVIDIA H100\nGPU UUID: \t {uuid}\nBus Location: \t {bus}\nDevice Minor: \t {minor}\n")
  monkeypatch.setattr(G, "PROC_GPUS", str(tmp_path))
  monkeypatch.setattr(plugrt_nv, "gpu_nodes", lambda: ["/dev/nvidia0", "/dev/nvidia1"])
  exists = os.path.exists
  monkeypatch.setattr(plugrt_nv.os.path, "exists", lambda p: p == "/dev/nvidiactl" or exists(p))
  monkeypatch.setattr(plugrt_nv, "has_module", lambda m: True)
  monkeypatch.setattr(plugrt_nv.os, "uname", lambda: types.SimpleNamespace(machine="x86_64"))
  p = plugrt_nv.probe_nv(PluginContext({}))
  assert p.ok and p.count == 2
  assert [(d.index, d.bus_id, d.info["uuid"]) for d in p.devices] == [(0, "0000:2a:00.0", "GPU-b"), (1, "0000:18:00.0", "GPU-a")]
  assert p.info["copies between GPUs"] == plugrt_nv.STAGED_PEER
