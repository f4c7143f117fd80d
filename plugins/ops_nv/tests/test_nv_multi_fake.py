"""Two NV GPUs below the hardware: each index opens its own GPU (two fake GPUs sharing one fake RM client and UVM file,
as plugrt_nv_nvk shares the real ones), a copy between them goes through a peer mapping where the fake driver allows
it (P2P caps, peer access, the source buffer mapped into the destination's VA space, one copy-engine command on the
destination, ordered with both GPUs' queues through their timelines), and is staged through host memory, saying why,
where it does not. The fake copy engine reaches only addresses mapped into its own GPU, so a missing mapping faults.
The probe lists the GPUs from the kernel driver's proc files in the driver's order (device minor)."""
from __future__ import annotations

import ctypes
import gc
import os
import threading
import time
import types
import warnings

import numpy as np
import pytest
from fake_gpu import FakeGPU, FakeRM

import plugrt_nv
from plugrt import Buffer, dtypes
from plugrt.compiler import samples as K
from plugrt.context import PluginContext
from plugrt.errors import DeviceUnavailable, StagedCopyWarning
from plugrt.hookspecs import InterfaceSpec, Probe, hookimpl
from plugrt_nv import cmd, hw
from plugrt_nv.iface import NVError
from plugrt_nv_nvk import client as nvk_client
from plugrt_nvidia_toolchain import gpus as G
from plugrt_nvidia_toolchain import ptxas

NO_P2P = "the PCIe topology does not support peer access"
SIZES = [1, 4096 + 3, (3 << 20) + 5]
needs_ptxas = pytest.mark.skipif(ptxas.path(os.environ) is None, reason="ptxas is not installed (pip install nvidia-cuda-nvcc)")


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


def open_two(plugrt_registry, p2p: bool | str):
  rm = FakeRM(p2p)
  gpus = [FakeGPU(client=rm), FakeGPU(client=rm)]
  env = {"NV": "1", "NV_PTX": "1", "PLUGRT_CACHE": "0", "PLUGRT_NV_TIMEOUT": "5"}
  return rm, gpus, plugrt_registry(two_gpu_plugins(gpus), env=env)


@pytest.fixture
def two(plugrt_registry):
  rm, gpus, registry = open_two(plugrt_registry, True)
  with registry as reg:
    devs = [reg.open("NV:0"), reg.open("NV:1")]
    for d in devs: d.allocator.kcopy = False  # no kernel copies: the fake runs the copy engine only
    yield rm, gpus, devs, reg
  for g in gpus: g.close()


@pytest.fixture
def no_p2p(plugrt_registry):
  rm, gpus, registry = open_two(plugrt_registry, NO_P2P)
  with registry as reg:
    devs = [reg.open("NV:0"), reg.open("NV:1")]
    for d in devs: d.allocator.kcopy = False
    yield rm, gpus, devs, reg
  for g in gpus: g.close()


def data(n: int, seed: int = 0) -> np.ndarray: return np.random.default_rng(seed + n).integers(0, 256, n, dtype=np.uint8)


def test_each_index_opens_its_own_gpu_on_one_client(two):
  rm, gpus, (d0, d1), reg = two
  assert d0 is not d1 and d0.info.state.iface is gpus[0] and d1.info.state.iface is gpus[1]
  assert rm.refs == 2 and not rm.closed
  with pytest.raises(DeviceUnavailable, match=r"NV:2 does not exist: NV has 2 devices here \(indices 0-1"): reg.open("NV:2")


def test_peer_path_is_peer_and_asked_once_a_pair(two):
  rm, _, (d0, d1), _ = two
  assert d0.allocator.peer_path(d1) == "peer" and d1.allocator.peer_path(d0) == "peer"
  assert [c[0] for c in rm.calls] == ["P2P_CAPS", "ENABLE_PEER", "MAP", "MAP"]  # the pair once; each timeline page into the other GPU
  s0, s1 = d0.info.state, d1.info.state
  assert {(c[1], c[3]) for c in rm.calls[2:]} == {(s0.signals.va, gpus_uuid(d1)), (s1.signals.va, gpus_uuid(d0))}


def gpus_uuid(dev) -> bytes: return dev.info.state.iface.uuid


@pytest.mark.parametrize("n", SIZES)
def test_peer_copy_both_ways_equals_the_source(two, n):
  _, gpus, (d0, d1), _ = two
  x = data(n)
  a = Buffer(d0, n, dtypes.uint8).copyin(x)
  with warnings.catch_warnings():
    warnings.simplefilter("error", StagedCopyWarning)  # a peer copy is not staged, so it does not warn
    b = a.to(d1)
    assert np.array_equal(b.numpy(), x)
    c = b.to(d0)
    assert np.array_equal(c.numpy(), x)
  # each copy was one LAUNCH_DMA on the destination's copy channel, reading the other GPU's buffer at its own address
  src_of = lambda g: [v for ch, m, v in g.log if ch == "copy" and m == (hw.SUBCH_COPY << 16 | hw.Copy.OFFSET_IN_UPPER + 4)]
  assert a.handle & 0xFFFFFFFF in src_of(gpus[1]) and b.handle & 0xFFFFFFFF in src_of(gpus[0])
  assert a.handle in gpus[1].peer_maps and b.handle in gpus[0].peer_maps


def test_a_buffer_is_mapped_once_and_unmapped_when_freed(two):
  rm, gpus, (d0, d1), _ = two
  x = data(10000)
  a = Buffer(d0, x.size, dtypes.uint8).copyin(x)
  b = Buffer(d1, x.size, dtypes.uint8)
  for _ in range(3): a.copy_to(b)
  a.view(100, offset=200).copy_to(b.view(100, offset=0))  # a view of a mapped buffer needs no new mapping
  maps = [c for c in rm.calls if c[0] == "MAP" and c[1] == a.handle]
  assert len(maps) == 1 and np.array_equal(b.numpy()[:100], x[200:300])
  link = d0.info.state.links[d1.info.state]
  assert a.handle in link.mapped and a.handle in d0.info.state.lent
  va = a.handle
  del a
  gc.collect()
  d0.allocator.free_cache()
  assert va not in gpus[1].peer_maps and va not in link.mapped and va not in d0.info.state.lent


@needs_ptxas
def test_copy_waits_for_a_kernel_queued_on_the_source(two):
  _, gpus, (d0, d1), _ = two
  n = 4096
  a = Buffer(d0, n, dtypes.uint8).copyin(np.zeros(n, np.uint8))
  out, xb, yb = Buffer(d0, 4, dtypes.float32), Buffer(d0, 4, dtypes.float32), Buffer(d0, 4, dtypes.float32)
  prg = d0.program(K.saxpy_kernel())
  pattern = (np.arange(n) % 251).astype(np.uint8)
  def slow_kernel(ln) -> None:  # a kernel that takes a while, then writes the buffer the copy reads
    time.sleep(0.3)
    ctypes.memmove(a.handle, pattern.ctypes.data, n)
  gpus[0].kernels[prg.mem.va + prg.kernel.entry] = slow_kernel
  prg(out, xb, yb, global_size=(1, 1, 1), local_size=(4, 1, 1), vals=(1.0, 4))  # queued, not waited for
  b = a.to(d1)  # on NV:1's copy channel, which first waits for NV:0's timeline
  assert np.array_equal(b.numpy(), pattern)
  s0 = d0.info.state
  assert any(ch == "copy" and addr == s0.sem for ch, addr, _ in gpus[1].acquires)


@needs_ptxas
def test_later_work_on_the_source_waits_for_the_copy(two):
  _, gpus, (d0, d1), _ = two
  n = 4096
  x = data(n, 1)
  a = Buffer(d0, n, dtypes.uint8).copyin(x)
  out, xb, yb = Buffer(d0, 4, dtypes.float32), Buffer(d0, 4, dtypes.float32), Buffer(d0, 4, dtypes.float32)
  prg = d0.program(K.saxpy_kernel())
  ran = threading.Event()
  def overwrite(ln) -> None:
    ctypes.memset(a.handle, 0xEE, n)
    ran.set()
  gpus[0].kernels[prg.mem.va + prg.kernel.entry] = overwrite
  gpus[1].hang = True  # NV:1's queues stall: the copy stays queued
  b = a.to(d1)
  prg(out, xb, yb, global_size=(1, 1, 1), local_size=(4, 1, 1), vals=(1.0, 4))  # would overwrite what the copy reads
  assert not ran.wait(0.3), "the kernel on NV:0 ran before NV:1's copy of its buffer"
  gpus[1].hang = False
  assert np.array_equal(b.numpy(), x)
  assert ran.wait(5) and np.array_equal(a.numpy(), np.full(n, 0xEE, np.uint8))
  assert any(ch == "compute" and addr == d1.info.state.sem for ch, addr, _ in gpus[0].acquires)


def test_without_p2p_copies_are_staged_and_say_why(no_p2p):
  rm, gpus, (d0, d1), _ = no_p2p
  n = 5000
  x = data(n)
  a = Buffer(d0, n, dtypes.uint8).copyin(x)
  path = d0.allocator.peer_path(d1)
  assert path == f"staged through host memory, device to host on one GPU then host to device on the other " \
                 f"(the driver reports no peer reads between them: {NO_P2P})"
  with pytest.warns(StagedCopyWarning, match=f"copies from NV to NV:1 are staged through host memory.*{NO_P2P}"):
    b = a.to(d1)
  assert np.array_equal(b.numpy(), x)
  with pytest.warns(StagedCopyWarning, match="from NV:1 to NV"): c = b.to(d0)
  assert np.array_equal(c.numpy(), x)
  assert [c[0] for c in rm.calls] == ["P2P_CAPS", "P2P_CAPS"] and not gpus[0].peer_maps and not gpus[1].peer_maps


def test_a_buffer_that_cannot_be_mapped_is_staged_and_reported(two, monkeypatch):
  _, gpus, (d0, d1), _ = two
  assert d0.allocator.peer_path(d1) == "peer"
  def refuse(mem, other): raise NVError("UVM_MAP_EXTERNAL_ALLOCATION: NV_ERR_NO_MEMORY (0x51)")
  monkeypatch.setattr(gpus[0], "map_peer", refuse)
  x = data(3000)
  a = Buffer(d0, x.size, dtypes.uint8).copyin(x)
  with pytest.warns(StagedCopyWarning, match="mapping a buffer of NV:0 into NV:1 failed: UVM_MAP_EXTERNAL_ALLOCATION"):
    b = a.to(d1)
  assert np.array_equal(b.numpy(), x) and d0.allocator.peer_path(d1).startswith("staged through host memory")


def test_the_fake_copy_engine_faults_on_an_unmapped_peer_address(two):
  _, _, (d0, d1), _ = two
  a = Buffer(d0, 4096, dtypes.uint8).copyin(data(4096))
  b = Buffer(d1, 4096, dtypes.uint8)
  s1 = d1.info.state
  s1.submit(s1.copy, cmd.copy(b.handle, a.handle, 4096))  # no mapping of NV:0's buffer in NV:1
  with pytest.raises(NVError, match="no memory at"): s1.synchronize()


def test_closing_one_gpu_keeps_the_other_and_the_last_releases_the_client(two):
  rm, gpus, (d0, d1), _ = two
  x = data(70000)
  b = Buffer(d0, x.size, dtypes.uint8).copyin(x).to(d1)
  assert d1.info.state.iface.peer_maps  # NV:0's timeline page and buffer are mapped into NV:1
  d0.close()
  assert rm.refs == 1 and not rm.closed and not gpus[1].peer_maps and not gpus[1].lent
  s1 = d1.info.state
  assert not s1.partners and not s1.links and not s1.after
  assert np.array_equal(b.numpy(), x)
  c = Buffer(d1, x.size, dtypes.uint8)
  b.copy_to(c)
  assert np.array_equal(c.numpy(), x) and np.array_equal(Buffer(d1, 3, dtypes.uint8).copyin(x[:3]).numpy(), x[:3])
  d0.close()  # again: nothing
  d1.close()
  assert rm.refs == 0 and rm.closed


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
  assert p.info["copies between GPUs"] == plugrt_nv.PEER_PATH


def test_nvk_client_is_shared_refcounted_and_closed_after_the_last(monkeypatch):
  """plugrt_nv_nvk's client: one for every GPU of the process, made once even when GPUs open on several threads,
  closed when the last GPU releases it; a GPU opened after that gets a new one."""
  made: list[object] = []
  class Dummy:
    def __init__(self) -> None:
      time.sleep(0.01)  # widen the window two threads could both make one in
      self.refs, self.closes = 0, 0
      made.append(self)
    def close(self) -> None: self.closes += 1
  monkeypatch.setattr(nvk_client, "Client", Dummy)
  monkeypatch.setattr(nvk_client, "_client", None)
  got: list[object] = []
  threads = [threading.Thread(target=lambda: got.append(nvk_client.acquire())) for _ in range(8)]
  for t in threads: t.start()
  for t in threads: t.join()
  c = made[0]
  assert len(made) == 1 and all(g is c for g in got) and c.refs == 8 and nvk_client.current() is c
  for _ in range(7): nvk_client.release(c)
  assert c.closes == 0 and nvk_client.current() is c
  nvk_client.release(c)
  assert c.closes == 1 and nvk_client.current() is None
  assert nvk_client.acquire() is not c and len(made) == 2
