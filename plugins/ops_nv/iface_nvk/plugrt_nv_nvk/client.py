"""The process's one RM client and one UVM file, shared by every NV GPU it opens.

A GPU's memory can be mapped into another GPU's VA space only when both GPUs' objects live in one RM client (UVM
dups the memory's handle through that client) and both VA spaces are registered in one UVM address space (one
/dev/nvidia-uvm file: its external ranges are the process's, for every GPU registered there). So the first NV GPU
opened makes the client (/dev/nvidiactl, the root object, UVM_INITIALIZE and UVM_MM_INITIALIZE on two UVM files),
every later one takes a reference, and the last one to close closes the files, which makes the driver free the
client and everything left in it. Peer access between two GPUs is asked once per pair, here, under the lock.
"""
from __future__ import annotations

import ctypes
import os
import threading
from typing import Any

from plugrt_nv.iface import NVError
from plugrt_nv_nvk import rm


class Client:
  """The RM root client and the UVM files; `refs` counts the GPUs open on it."""

  def __init__(self) -> None:
    self.fds: list[int] = []
    self.lock = threading.RLock()  # the handle counter, the peer table, the reference count
    self.refs = 0
    self._handle = 0x2000          # handles the caller picks (host memory objects): unique within the client
    self.peers: dict[frozenset[bytes], str] = {}  # a pair of GPU UUIDs -> "" (peer access enabled) or why not
    self.enabled: set[frozenset[bytes]] = set()   # the pairs this client enabled itself (UVM_ENABLE_PEER_ACCESS): disabled at close
    self.gpus: list[Any] = []      # the GPUs (NVKInterfaces) open on this client
    try:
      self.ctl = self._open("/dev/nvidiactl")
      self.uvm, self.uvm2 = self._open("/dev/nvidia-uvm"), self._open("/dev/nvidia-uvm")
      p = rm.NVOS21(hRoot=0, hObjectParent=0, hClass=rm.ROOT_CLIENT)
      rm.ioctl(self.ctl, rm.ESC_RM_ALLOC, p, "allocating an RM client")
      if p.status: raise NVError(f"allocating an RM client failed: {rm.status_name(p.status)}")
      self.root = p.hObjectNew
      ver = self.control(self.root, rm.CTRL_BUILD_VERSION_V2, rm.BUILD_VERSION_V2(), "reading the driver version")
      self.driver = ver.driverVersion.decode()
      self.L = rm.layout(int(self.driver.split(".")[0]))
      rm.uvm_ioctl(self.uvm, rm.UVM_INITIALIZE, rm.UVM_INITIALIZE_PARAMS(), "UVM_INITIALIZE")
      try: rm.uvm_ioctl(self.uvm2, rm.UVM_MM_INITIALIZE, rm.UVM_MM_INITIALIZE_PARAMS(uvmFd=self.uvm), "UVM_MM_INITIALIZE")
      except NVError: pass  # not needed on every platform; CUDA sees it fail too
    except BaseException:
      self.close()
      raise

  def _open(self, path: str) -> int:
    try: fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError as e: raise NVError(f"cannot open {path}: {e.strerror}", "run where the NVIDIA driver is loaded and you may use the GPU") from None
    self.fds.append(fd)
    return fd

  def control(self, obj: int, cmd: int, params: Any, what: str) -> Any:
    p = rm.NVOS54(hClient=self.root, hObject=obj, cmd=cmd, params=rm.ref(params), paramsSize=ctypes.sizeof(params))
    rm.ioctl(self.ctl, rm.ESC_RM_CONTROL, p, what)
    if p.status: raise NVError(f"{what} failed: {rm.status_name(p.status)} (control {cmd:#x})")
    return params

  def new_handle(self) -> int:
    with self.lock:
      self._handle += 1
      return self._handle

  def peer_access(self, a: Any, b: Any) -> str:
    """Enable peer access between GPUs a and b (NVKInterfaces on this client), once per pair: "" when enabled, else why
    not. RM says whether the pair can (NV0000_CTRL_CMD_SYSTEM_GET_P2P_CAPS_V2: peer reads over NVLink or PCIe). An
    NVLink pair UVM enabled itself when the second GPU's VA space was registered (uvm_va_space.c, register_gpu_peers),
    and it refuses to enable it again (NV_ERR_INVALID_DEVICE: docs/multi-gpu.md); a PCIe pair is enabled here
    (UVM_ENABLE_PEER_ACCESS). Then UVM maps one GPU's memory into the other's VA space."""
    key = frozenset((a.uuid, b.uuid))
    with self.lock:
      if key in self.peers: return self.peers[key]
      why = ""
      try:
        caps = rm.P2P_CAPS_V2(gpuCount=2)
        caps.gpuIds[0], caps.gpuIds[1] = a.gpu_id, b.gpu_id
        self.control(self.root, rm.CTRL_P2P_CAPS_V2, caps, "asking the driver whether the two GPUs can reach each other's memory")
        if not caps.p2pCaps & rm.P2P_READS:
          status = caps.p2pCapsStatus[rm.P2P_INDEX_READ]
          why = f"the driver reports no peer reads between them: {rm.P2P_STATUS.get(status, f'status {status}')}"
        elif not caps.p2pCaps & rm.P2P_NVLINK:
          p = rm.UVM_PEER_ACCESS_PARAMS()
          p.gpuUuidA[:], p.gpuUuidB[:] = list(a.uuid), list(b.uuid)
          rm.uvm_ioctl(self.uvm, rm.UVM_ENABLE_PEER_ACCESS, p, "UVM_ENABLE_PEER_ACCESS")
          self.enabled.add(key)
      except NVError as e: why = e.message
      self.peers[key] = why
      return why

  def forget(self, gpu: Any) -> None:
    """`gpu` is closing: disable peer access with each GPU it has it with, forget its pairs, and drop it from what the
    other GPUs' memory records as mapped into (its VA space goes, and with it those mappings)."""
    uuid = gpu.uuid
    with self.lock:
      if gpu in self.gpus: self.gpus.remove(gpu)
      for g in self.gpus:
        for m in g.mems: m.private.get("peers", set()).discard(uuid)
      for key in [k for k in self.peers if uuid in k]:
        self.peers.pop(key)
        if key in self.enabled and len(key) == 2:  # an NVLink pair goes with the GPU's unregistering
          self.enabled.discard(key)
          a, b = sorted(key)
          p = rm.UVM_PEER_ACCESS_PARAMS()
          p.gpuUuidA[:], p.gpuUuidB[:] = list(a), list(b)
          try: rm.uvm_ioctl(self.uvm, rm.UVM_DISABLE_PEER_ACCESS, p, "UVM_DISABLE_PEER_ACCESS")
          except NVError: pass  # unregistering the GPU disables it too

  def close(self) -> None:
    """Close the files: the driver frees the client and every object still in it, UVM its address space."""
    for fd in self.fds:
      try: os.close(fd)
      except OSError: pass
    self.fds.clear()


_lock = threading.Lock()
_client: Client | None = None


def acquire() -> Client:
  """The process's client (made by the first GPU to open), with one more reference."""
  global _client
  with _lock:
    if _client is None: _client = Client()
    _client.refs += 1
    return _client


def release(c: Client) -> None:
  """One GPU fewer on `c`; the last one closes it (a GPU opened later makes a new client)."""
  global _client
  with _lock:
    c.refs -= 1
    if c.refs > 0: return
    if _client is c: _client = None
  c.close()


def current() -> Client | None:
  """The shared client while any NV GPU is open (for tests and diagnostics)."""
  return _client
