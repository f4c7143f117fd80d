"""The NVK interface's peer calls without a driver: the ioctls are recorded (and answered) in place of the kernel's, so
what the shared client and the interface send for P2P caps, peer access, a peer mapping and a GPU's teardown is
checked field by field. An NVLink pair of H200s ran them (docs/hardware.md); a PCIe pair has not."""
from __future__ import annotations

import pytest

from plugrt_nv.iface import Mem, NVError
from plugrt_nv_nvk import client as C
from plugrt_nv_nvk import nvk, rm


class Calls:
  """Stand-ins for rm.ioctl and rm.uvm_ioctl: each call is recorded as (name, params); `answer` may fill params in."""

  def __init__(self, monkeypatch, answer=lambda name, params: None):
    self.log: list[tuple[str, object]] = []
    names = {v: k for k, v in vars(rm).items() if k.startswith(("UVM_", "ESC_")) and isinstance(v, int)}
    def record(fd, nr, params, what):
      self.log.append((names.get(nr, hex(nr)), params))
      answer(names.get(nr), params)
    monkeypatch.setattr(rm, "ioctl", record)
    monkeypatch.setattr(rm, "uvm_ioctl", record)

  def names(self) -> list[str]: return [n for n, _ in self.log]


def fake_client() -> C.Client:
  c = object.__new__(C.Client)
  c.fds, c.refs, c._handle, c.peers, c.gpus, c.enabled = [], 1, 0x2000, {}, [], set()
  c.ctl, c.uvm, c.uvm2, c.root, c.driver, c.L = 3, 4, 5, 0xC1D00001, "580.95.05", rm.layout(580)
  import threading
  c.lock = threading.RLock()
  return c


def gpu(c: C.Client, n: int) -> nvk.NVKInterface:
  g = object.__new__(nvk.NVKInterface)
  g.client, g.ctl, g.uvm, g.root, g.L = c, c.ctl, c.uvm, c.root, c.L
  g.uuid, g.gpu_id, g.minor, g.device = bytes([n]) * 16, 0x100 * n, n, 0xCAF00000 + n
  g.mems, g.fds, g.channel_vas, g.va = [], [], [], nvk.VASpace(0x1000_0000, 0x2000_0000)
  g.uuid_registered = g.vaspace_registered = 1
  c.gpus.append(g)
  return g


def caps(reads: bool, status: int = 0, nvlink: bool = False):
  def answer(name, params):
    if isinstance(params, rm.NVOS54) and params.cmd == rm.CTRL_P2P_CAPS_V2:
      p = rm.P2P_CAPS_V2.from_address(params.params)
      assert (p.gpuCount, p.gpuIds[0], p.gpuIds[1]) == (2, 0x100, 0x200)  # the two GPUs' ids, as CARD_INFO gives them
      p.p2pCaps = (rm.P2P_READS | rm.P2P_WRITES | (rm.P2P_NVLINK if nvlink else rm.P2P_PCI)) if reads else 0
      p.p2pCapsStatus[rm.P2P_INDEX_READ] = status
  return answer


def test_peer_access_asks_rm_then_uvm_once_a_pcie_pair(monkeypatch):
  calls = Calls(monkeypatch, caps(True))
  c = fake_client()
  a, b = gpu(c, 1), gpu(c, 2)
  assert a.peer_access(b) == "" and b.peer_access(a) == ""
  assert calls.names() == ["ESC_RM_CONTROL", "UVM_ENABLE_PEER_ACCESS"]
  ctl, enable = calls.log[0][1], calls.log[1][1]
  assert (ctl.hClient, ctl.hObject, ctl.paramsSize) == (c.root, c.root, 8348)
  assert bytes(enable.gpuUuidA) == a.uuid and bytes(enable.gpuUuidB) == b.uuid


def test_an_nvlink_pair_is_enabled_by_uvm_already(monkeypatch):
  """UVM enables an NVLink pair when the second GPU registers, and answers a second enable with NV_ERR_INVALID_DEVICE
  (an H200 pair did): plugrt asks RM alone, and at close leaves the disabling to the GPU's unregistering."""
  calls = Calls(monkeypatch, caps(True, nvlink=True))
  monkeypatch.setattr(C, "release", lambda cl: None)
  c = fake_client()
  c.refs = 2
  a, b = gpu(c, 1), gpu(c, 2)
  assert a.peer_access(b) == "" and b.peer_access(a) == ""
  assert calls.names() == ["ESC_RM_CONTROL"]
  del calls.log[:]
  a.close()
  assert "UVM_DISABLE_PEER_ACCESS" not in calls.names() and not c.peers and not c.enabled


def test_no_peer_reads_gives_the_drivers_reason_and_no_uvm_call(monkeypatch):
  calls = Calls(monkeypatch, caps(False, status=3))
  c = fake_client()
  a, b = gpu(c, 1), gpu(c, 2)
  assert "PCIe topology does not support peer access" in a.peer_access(b)
  assert calls.names() == ["ESC_RM_CONTROL"]


def test_a_uvm_refusal_is_the_reason(monkeypatch):
  def answer(name, params):
    caps(True)(name, params)
    if name == "UVM_ENABLE_PEER_ACCESS": raise NVError("UVM_ENABLE_PEER_ACCESS: NV_ERR_NOT_SUPPORTED (0x56)")
  Calls(monkeypatch, answer)
  c = fake_client()
  assert gpu(c, 1).peer_access(gpu(c, 2)) == "UVM_ENABLE_PEER_ACCESS: NV_ERR_NOT_SUPPORTED (0x56)"


def test_map_peer_maps_for_the_other_gpu_alone_once(monkeypatch):
  calls = Calls(monkeypatch)
  c = fake_client()
  a, b = gpu(c, 1), gpu(c, 2)
  mem = Mem(0x1000_0000, 0x20_0000, "device", {"handle": 0x5C000007, "fd": -1, "cpu": False, "range": True})
  a.mems.append(mem)
  a.map_peer(mem, b)
  a.map_peer(mem, b)
  assert calls.names() == ["UVM_MAP_EXTERNAL_ALLOCATION"]
  p = calls.log[0][1]
  assert (p.base, p.length, p.hMemory, p.hClient, p.rmCtrlFd, p.gpuAttributesCount) == (mem.va, mem.size, 0x5C000007, c.root, c.ctl, 1)
  assert bytes(p.perGpuAttributes[0].gpuUuid) == b.uuid and p.perGpuAttributes[0].gpuMappingType == 1


def test_close_tears_down_one_gpu_and_leaves_the_client(monkeypatch):
  calls = Calls(monkeypatch, caps(True))
  released = []
  monkeypatch.setattr(C, "release", lambda cl: released.append(cl))
  c = fake_client()
  c.refs = 2
  a, b = gpu(c, 1), gpu(c, 2)
  assert a.peer_access(b) == ""
  theirs = Mem(0x1800_0000, 0x1000, "device", {"handle": 9, "fd": -1, "cpu": False, "range": True, "peers": {a.uuid}})
  b.mems.append(theirs)
  a.mems.append(Mem(0x1000_0000, 0x1000, "device", {"handle": 7, "fd": -1, "cpu": False, "range": True}))
  del calls.log[:]
  a.close()
  assert calls.names() == ["UVM_FREE", "UVM_DISABLE_PEER_ACCESS", "UVM_UNREGISTER_GPU_VASPACE", "UVM_UNREGISTER_GPU", "ESC_RM_FREE"]
  free = calls.log[-1][1]
  assert (free.hRoot, free.hObjectParent, free.hObjectOld) == (c.root, c.root, a.device)
  assert released == [c] and a.client is None and c.gpus == [b] and theirs.private["peers"] == set() and not c.peers
  a.close()  # again: nothing
  assert released == [c]


def test_the_last_gpu_only_closes_the_files(monkeypatch):
  """The last GPU on the client leaves the teardown to the driver (closing the files), as before the client was shared."""
  calls = Calls(monkeypatch)
  released = []
  monkeypatch.setattr(C, "release", lambda cl: released.append(cl))
  c = fake_client()
  a = gpu(c, 1)
  a.mems.append(Mem(0x1000_0000, 0x1000, "device", {"handle": 7, "fd": -1, "cpu": False, "range": True}))
  a.close()
  assert calls.log == [] and released == [c] and not a.mems and c.gpus == []


def test_p2p_caps_status_names():
  assert rm.P2P_STATUS[4] == "peer access is disabled by a driver registry key"
  with pytest.raises(KeyError): rm.P2P_STATUS[0]  # OK is not a reason


def test_a_gpu_open_on_the_shared_client_opens_again_on_a_client_of_its_own(monkeypatch):
  """A second registry of the process opens a GPU that is open on the shared client already: UVM registers a GPU once
  a file (a second UVM_REGISTER_GPU answered NV_ERR_INVALID_DEVICE on an H200), so the second open gives its reference
  on the shared client back before making anything and opens on a client and UVM file of its own. Here the GPU's node
  does not exist, so that second open stops at opening it: on the private client, which close() then releases."""
  shared, private = fake_client(), fake_client()
  shared.refs, private.refs = 1, 0
  gpu(shared, 1)  # NV:0 is open already, gpu_id 0x100
  released = []
  monkeypatch.setattr(C, "acquire", lambda: (setattr(shared, "refs", shared.refs + 1), shared)[1])
  monkeypatch.setattr(C, "release", lambda c: (setattr(c, "refs", c.refs - 1), released.append(c)))
  monkeypatch.setattr(C, "Client", lambda: private)

  def answer(name, params):
    if name == "ESC_CARD_INFO":
      params[0].valid, params[0].gpu_id, params[0].minor_number = 1, 0x100, 250
  calls = Calls(monkeypatch, answer)
  monkeypatch.setattr(nvk.os.path, "exists", lambda p: True)
  with pytest.raises(NVError, match="cannot open /dev/nvidia250"): nvk.NVKInterface(0)
  assert released == [shared, private] and shared.refs == 1 and private.refs == 0
  assert [g.gpu_id for g in shared.gpus] == [0x100] and private.gpus == []  # the claim on the private client, dropped at close
  assert calls.names() == ["ESC_CARD_INFO", "ESC_CARD_INFO"]  # nothing made on either client
