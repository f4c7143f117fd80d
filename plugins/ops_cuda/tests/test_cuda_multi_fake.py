"""Several CUDA GPUs below the hardware: the kernel driver's proc files as the listing, CUDA_VISIBLE_DEVICES applied
as the driver applies it, the index errors, and the peer path (peer access once per pair, the copy ordered on both
devices' streams) or the driver-staged path it reports, against a fake driver with two contexts."""
from __future__ import annotations

import ctypes
import types

import numpy as np
import pytest

import plugrt_cuda
from plugrt.context import PluginContext
from plugrt.errors import DeviceUnavailable
from plugrt.registry import Registry
from plugrt_cuda import device as cuda_device
from plugrt_cuda import driver as D
from plugrt_cuda import peer
from plugrt_nvidia_toolchain import gpus as G

A, B = "GPU-aaaaaaaa-1111-2222-3333-444444444444", "GPU-bbbbbbbb-5555-6666-7777-888888888888"


@pytest.fixture
def machine(tmp_path, monkeypatch):
  """Two H100s as the kernel driver lists them (the second at a higher bus, minor 1), /dev/nvidia0-1 and a libcuda."""
  for bus, model, uuid, minor in (("0000:18:00.0", "NVIDIA H100 80GB HBM3", A, 0), ("0000:2a:00.0", "NVIDIA H100 80GB HBM3", B, 1)):
    (tmp_path / bus).mkdir()
    (tmp_path / bus / "information").write_text(f"Model: \t\t {model}\nIRQ:   \t\t 42\nGPU UUID: \t {uuid}\nBus Type: \t PCIe\n"
                                                f"Bus Location: \t {bus}\nDevice Minor: \t {minor}\nGPU Excluded:\t No\n")
  monkeypatch.setattr(G, "PROC_GPUS", str(tmp_path))
  monkeypatch.setattr(plugrt_cuda, "device_nodes", lambda prefix: ["/dev/nvidia0", "/dev/nvidia1"])
  monkeypatch.setattr(PluginContext, "find_library", lambda self, *a, **k: "/usr/lib/libcuda.so.1")
  return tmp_path


def probe(**env: str):
  return plugrt_cuda.probe_cuda(PluginContext(env))


def test_driver_gpus_reads_the_proc_files(machine):
  gs = G.driver_gpus()
  assert [(g.bus_id, g.uuid, g.minor) for g in gs] == [("0000:18:00.0", A, 0), ("0000:2a:00.0", B, 1)]
  assert gs[0].model == "NVIDIA H100 80GB HBM3" and G.driver_gpus(str(machine / "nothing")) == []


@pytest.mark.parametrize("visible, buses", [
  (None, ["0000:18:00.0", "0000:2a:00.0"]),
  ("1", ["0000:2a:00.0"]),
  ("1,0", ["0000:2a:00.0", "0000:18:00.0"]),       # renumbered in the order given
  (" 1 , 0 ", ["0000:2a:00.0", "0000:18:00.0"]),
  ("0,5,1", ["0000:18:00.0"]),                     # the first entry naming nothing ends the list
  ("0,-1,1", ["0000:18:00.0"]),
  ("0,0", ["0000:18:00.0"]),
  ("GPU-bbbb", ["0000:2a:00.0"]),                  # a UUID prefix
  (B.upper(), ["0000:2a:00.0"]),                  # any case
  ("GPU-", []), ("", []), ("-1", []), ("GPU-cccc", []),
])
def test_cuda_visible_devices_as_the_driver_reads_it(machine, visible, buses):
  assert [v.gpu.bus_id for v in G.cuda_order(G.driver_gpus(), visible)] == buses


def test_a_container_sees_the_gpus_whose_nodes_it_has(machine, monkeypatch):
  monkeypatch.setattr(plugrt_cuda, "device_nodes", lambda prefix: ["/dev/nvidia1"])  # given the host's second GPU alone
  p = probe()
  assert p.count == 1 and [(d.index, d.bus_id) for d in p.devices] == [(0, "0000:2a:00.0")]
  assert not probe(CUDA_VISIBLE_DEVICES="1").ok  # CUDA numbers within what it sees: index 1 is past the end


def test_mig_and_unchecked_uuid_entries_pass_through():
  seen = G.cuda_order([], "MIG-1234,GPU-abcd", nodes=1)
  assert [(v.index, v.gpu, v.entry) for v in seen] == [(0, None, "MIG-1234"), (1, None, "GPU-abcd")]
  assert len(G.cuda_order([], "0,1", nodes=1)) == 1  # without proc files the node count still bounds the indices


def test_order_is_exact_only_for_one_model_or_pci_order():
  one = G.DriverGPU("H100", "0000:18:00.0", A, 0)
  other = one._replace(model="A100", bus_id="0000:2a:00.0")
  assert G.order_is_exact([one, one], None) and not G.order_is_exact([one, other], None)
  assert G.order_is_exact([one, other], "pci_bus_id")


def test_probe_lists_every_gpu(machine):
  p = probe()
  assert p.ok and p.count == 2 and p.detail == "2 GPUs"
  assert [(d.index, d.bus_id, d.info["uuid"]) for d in p.devices] == [(0, "0000:18:00.0", A), (1, "0000:2a:00.0", B)]
  assert "peer to peer" in p.info["copies between GPUs"] and "order" not in p.info


def test_probe_renumbers_with_cuda_visible_devices(machine):
  p = probe(CUDA_VISIBLE_DEVICES="1")
  assert p.count == 1 and p.detail == "1 GPU (CUDA_VISIBLE_DEVICES='1')"
  assert p.devices[0].index == 0 and p.devices[0].bus_id == "0000:2a:00.0" and p.devices[0].info["CUDA_VISIBLE_DEVICES entry"] == "1"
  mig = probe(CUDA_VISIBLE_DEVICES="MIG-0f1e2d3c,0")
  assert [(d.name, d.bus_id, dict(d.info)) for d in mig.devices] == [
    ("MIG instance", "", {"CUDA_VISIBLE_DEVICES entry": "MIG-0f1e2d3c"}),
    ("NVIDIA H100 80GB HBM3", "0000:18:00.0", {"uuid": A, "CUDA_VISIBLE_DEVICES entry": "0"})]
  hidden = probe(CUDA_VISIBLE_DEVICES="")
  assert not hidden.ok and "hides every GPU" in hidden.detail and "0-1" in hidden.hint


def test_an_index_past_the_visible_gpus_is_a_typed_error(machine):
  reg = Registry(env={"PLUGRT_PLUGINS": "cuda", "CUDA_VISIBLE_DEVICES": "1"}).load()
  with pytest.raises(DeviceUnavailable) as ei: reg.open("CUDA:1")
  assert ei.value.message.startswith("CUDA:1 does not exist: CUDA has 1 device here (index 0: 1 GPU (CUDA_VISIBLE_DEVICES='1'))")
  assert "CUDA:0 is NVIDIA H100 80GB HBM3 at 0000:2a:00.0" in ei.value.message
  with pytest.raises(DeviceUnavailable, match=r"CUDA:3 does not exist: CUDA has 2 devices here \(indices 0-1"):
    Registry(env={"PLUGRT_PLUGINS": "cuda"}).load().open("CUDA:3")
  with pytest.raises(DeviceUnavailable, match=r"CUDA:2 does not exist: CUDA has 2 devices here"):
    Registry(env={"PLUGRT_PLUGINS": "cuda,cpu", "DEV": "CUDA:2"}).load().default  # noqa: B018  (DEV names it: it fails loudly)


# ------------------------------------------------------------------ the peer path, on a fake driver of two GPUs

class FakeDriver:
  """Two GPUs (device 0, 1; contexts 100, 101); device addresses are host addresses. It records each call with the
  context current then, and checks what the driver checks: an event is recorded on a stream of its own context."""

  def __init__(self, can: bool = True, enable_result: int = 0):
    self.can, self.enable_result = can, enable_result
    self.current = 0
    self.log: list[tuple] = []
    self.event_ctx: dict[int, int] = {}

  def cuCtxSetCurrent(self, ctx):
    self.current = ctx.value
    return 0

  def cuEventCreate(self, ev, flags):
    ev._obj.value = 1000 + len(self.event_ctx)
    self.event_ctx[ev._obj.value] = self.current
    return 0

  def cuEventRecord(self, ev, stream):
    assert self.event_ctx[ev.value] == self.current, "an event recorded on another context's stream"
    self.log.append(("record", self.current, ev.value))
    return 0

  def cuStreamWaitEvent(self, stream, ev, flags):
    self.log.append(("wait", self.current, ev.value))
    return 0

  def cuMemcpyPeerAsync(self, dst, dst_ctx, src, src_ctx, n, stream):
    ctypes.memmove(dst.value, src.value, n.value)
    self.log.append(("copy", self.current, dst_ctx.value, src_ctx.value))
    return 0

  def cuDeviceCanAccessPeer(self, can, a, b):
    can._obj.value = int(self.can)
    return 0

  def cuCtxEnablePeerAccess(self, ctx, flags):
    self.log.append(("enable", self.current, ctx.value))
    return self.enable_result


class FakeState:
  """What a CUDAState is to the peer path: the library, device, primary context, legacy stream, index."""

  def __init__(self, lib: FakeDriver, index: int):
    self.lib, self.index = lib, index
    self.dev, self.ctx, self.stream = ctypes.c_int(index), ctypes.c_void_p(100 + index), ctypes.c_void_p(0)

  def make_current(self) -> None: self.lib.cuCtxSetCurrent(self.ctx)


def two_gpus(monkeypatch, **kw):
  drv = FakeDriver(**kw)
  monkeypatch.setattr(D, "libcuda", lambda: drv)
  monkeypatch.setattr(peer, "_links", {})
  states = [FakeState(drv, 0), FakeState(drv, 1)]
  devs = []
  for st in states:
    info = types.SimpleNamespace(state=st, context=PluginContext({}), canonical=f"CUDA:{st.index}")
    dev = types.SimpleNamespace(info=info)
    dev.allocator = cuda_device.CUDAAllocator(info)  # type: ignore[arg-type]
    devs.append(dev)
  return drv, devs


def test_peer_copy_enables_access_once_and_orders_on_both_streams(monkeypatch):
  drv, (g0, g1) = two_gpus(monkeypatch)
  src, dst = np.arange(1000, dtype=np.uint8), np.zeros(1000, np.uint8)
  assert g0.allocator.peer_path(g1) == "peer"
  assert [e for e in drv.log if e[0] == "enable"] == [("enable", 100, 101), ("enable", 101, 100)]  # both ways, once
  drv.log.clear()
  g0.allocator._transfer(dst.ctypes.data, src.ctypes.data, 1000, g0, g1)
  assert np.array_equal(dst, src)
  (_, c0, ev_src), (_, c1, w1), (_, c2, dctx, sctx), (_, c3, ev_copy), (_, c4, w0) = drv.log
  assert (c0, c1, c2, c3, c4) == (100, 101, 101, 101, 100)  # record on the source, wait + copy + record on the destination, wait on the source
  assert w1 == ev_src and w0 == ev_copy and (dctx, sctx) == (101, 100)
  drv.log.clear()
  g1.allocator._transfer(src.ctypes.data, dst.ctypes.data, 10, g1, g0)  # the other direction: its own link, no new enabling
  assert not [e for e in drv.log if e[0] == "enable"] and [e for e in drv.log if e[0] == "copy"] == [("copy", 100, 100, 101)]


def test_already_enabled_by_another_library_counts_as_peer(monkeypatch):
  _, (g0, g1) = two_gpus(monkeypatch, enable_result=peer.CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED)
  assert g1.allocator.peer_path(g0) == "peer"


def test_no_peer_access_is_staged_by_the_driver_and_reported(monkeypatch):
  drv, (g0, g1) = two_gpus(monkeypatch, can=False)
  how = g0.allocator.peer_path(g1)
  assert how.startswith("staged through host memory by the CUDA driver") and "CUDA:0 cannot reach CUDA:1" in how
  assert not [e for e in drv.log if e[0] == "enable"]
  src, dst = np.full(64, 7, np.uint8), np.zeros(64, np.uint8)
  g0.allocator._transfer(dst.ctypes.data, src.ctypes.data, 64, g0, g1)  # the same call: the driver stages it
  assert np.array_equal(dst, src)


def test_too_many_peers_is_staged(monkeypatch):
  _, (g0, g1) = two_gpus(monkeypatch, enable_result=peer.CUDA_ERROR_TOO_MANY_PEERS)
  assert "too many peers" in g0.allocator.peer_path(g1)


def test_an_index_the_driver_does_not_show_is_a_typed_error(monkeypatch):
  """The probe's count is a prediction; the driver's count at open is the last word (a MIG or UUID entry it could not check)."""
  class Driver:
    def cuInit(self, flags): return 0
    def cuDeviceGetCount(self, n):
      n._obj.value = 1
      return 0
  monkeypatch.setattr(D, "libcuda", lambda: Driver())
  info = types.SimpleNamespace(index=1, canonical="CUDA:1")
  with pytest.raises(DeviceUnavailable, match=r"CUDA:1 does not exist: the CUDA driver sees 1 GPU \[no device\]") as ei:
    cuda_device.CUDAState(info)  # type: ignore[arg-type]
  assert "CUDA_VISIBLE_DEVICES" in ei.value.hint


def test_one_gpu_opened_twice_copies_on_the_gpu(monkeypatch):
  """CUDA and CUDA:PTX share the GPU's primary context: a copy between them is a plain device copy, never a peer one."""
  drv, (g0, _) = two_gpus(monkeypatch)
  twin = types.SimpleNamespace(info=g0.info, allocator=g0.allocator)
  copies = []
  drv.cuMemcpyDtoD_v2 = lambda d, s, n: copies.append((d.value, s.value, n.value)) or 0
  assert g0.allocator.peer_path(twin) == "peer"
  g0.allocator._transfer(0x2000, 0x1000, 64, g0, twin)
  assert copies == [(0x2000, 0x1000, 64)] and not peer._links and not [e for e in drv.log if e[0] in ("enable", "copy")]
