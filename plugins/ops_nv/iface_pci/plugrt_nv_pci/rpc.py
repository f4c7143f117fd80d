"""GSP-RM's resource manager over RPC: the objects and controls the NVK interface makes with ioctls on /dev/nvidiactl,
sent as GSP_RM_ALLOC, GSP_RM_CONTROL and FREE messages (docs/research/nv-pci.md, sections 6 and 7).

The parameter structs are the kernel driver's own (plugrt_nv_nvk.rm, the 570 layouts, which the 570.144 firmware
speaks); the message headers are rpc_gsp_rm_alloc_v03_00 {hClient, hParent, hObject, hClass, status, paramsSize,
flags, reserved[4]} and rpc_gsp_rm_control_v03_00 {hClient, hObject, cmd, status, paramsSize, flags}
(g_rpc-structures.h at 570.144), followed by the parameters; GSP-RM answers with the same message, status and
parameters filled in. A control whose parameters hold a pointer into the caller's memory (NV2080_CTRL_CMD_GR_GET_INFO)
cannot cross to the GSP: the PCI interface asks the internal static variants instead (KGR_GET_INFO).
"""
from __future__ import annotations

import ctypes
import itertools
import struct
from dataclasses import dataclass
from typing import Any

from plugrt_nv import hw
from plugrt_nv.iface import NVError
from plugrt_nv_nvk import rm
from plugrt_nv_pci.errors import MalformedRPC, RPCError
from plugrt_nv_pci.msgq import Function, GSPQueues

ALLOC_HEADER = struct.Struct("<7I4x")       # hClient hParent hObject hClass status paramsSize flags reserved[4]
CONTROL_HEADER = struct.Struct("<6I")       # hClient hObject cmd status paramsSize flags
FREE = struct.Struct("<4I")                 # NVOS00_PARAMETERS_v03_00: hRoot hObjectParent hObjectOld status
ROOT_CLASS = 0x0                            # NV01_ROOT (cl0000.h)
ROOT_HANDLE = 0xC1000000                    # the client's handle, which the client picks (TG uses the same value)
ROOT_PARAMS = rm.struct("ROOT_PARAMS", 120, ("hClient", rm.u32), ("processID", rm.u32), ("processName", ctypes.c_char * 100),
                        ("pOsPidInfo", rm.u64))  # NV0000_ALLOC_PARAMETERS
CTRL_KGR_INFO = 0x20800A2A                  # NV2080_CTRL_CMD_INTERNAL_STATIC_KGR_GET_INFO (ctrl2080internal.h)
GR_INFO_SIZE, GR_ENGINES = 0x3A, 8          # NV0080_CTRL_GR_INFO_MAX_SIZE, NV2080_CTRL_INTERNAL_GR_MAX_ENGINES
KGR_INFO = rm.struct("KGR_INFO", GR_ENGINES * GR_INFO_SIZE * 8, ("engineInfo", rm.GR_INFO_ITEM * GR_INFO_SIZE * GR_ENGINES))
L570 = rm.layout(570)


class RM:
  """One RM client on GSP-RM; handles are picked here, one counter per client."""

  def __init__(self, queues: GSPQueues, client: int = ROOT_HANDLE):
    self.q, self.client = queues, client
    self.handles = itertools.count(client + 1)

  def alloc(self, parent: int, cls: int, params: ctypes.Structure | None = None, what: str = "", handle: int | None = None) -> int:
    """Allocate an object of `cls` under `parent`; returns its handle (and `params` as GSP-RM filled them in)."""
    h = next(self.handles) if handle is None else handle
    body = bytes(params) if params is not None else b""
    step = f"allocating {what or f'class {cls:#x}'} over RPC"
    reply = self.q.call(Function.GSP_RM_ALLOC, ALLOC_HEADER.pack(self.client, parent, h, cls, 0, len(body), 0) + body, step)
    status = self._status(reply, ALLOC_HEADER, 4, Function.GSP_RM_ALLOC, step)
    if status in rm.NO_MEMORY: raise MemoryError(f"GSP-RM is out of memory {step}: {rm.status_name(status)}")
    if status: raise RPCError(f"{step} failed: {rm.status_name(status)}", function=Function.GSP_RM_ALLOC, status=status, step=step)
    if params is not None: ctypes.memmove(ctypes.addressof(params), reply[ALLOC_HEADER.size:ALLOC_HEADER.size + len(body)], len(body))
    return h

  def control(self, obj: int, cmd: int, params: ctypes.Structure, what: str) -> Any:
    body = bytes(params)
    step = f"{what} (control {cmd:#x}) over RPC"
    reply = self.q.call(Function.GSP_RM_CONTROL, CONTROL_HEADER.pack(self.client, obj, cmd, 0, len(body), 0) + body, step)
    status = self._status(reply, CONTROL_HEADER, 3, Function.GSP_RM_CONTROL, step)
    if status: raise RPCError(f"{step} failed: {rm.status_name(status)}", function=Function.GSP_RM_CONTROL, status=status, step=step)
    ctypes.memmove(ctypes.addressof(params), reply[CONTROL_HEADER.size:CONTROL_HEADER.size + len(body)], len(body))
    return params

  def free(self, parent: int, obj: int) -> None:
    reply = self.q.call(Function.FREE, FREE.pack(self.client, parent, obj, 0), "freeing an object over RPC")
    if len(reply) >= FREE.size and (status := FREE.unpack_from(reply)[3]):
      raise RPCError(f"freeing object {obj:#x} failed: {rm.status_name(status)}", function=Function.FREE, status=status)

  @staticmethod
  def _status(reply: bytes, header: struct.Struct, index: int, function: int, step: str) -> int:
    if len(reply) < header.size:
      raise MalformedRPC(f"GSP-RM answered {step} with {len(reply)} bytes, fewer than its header", step=step)
    return header.unpack_from(reply)[index]


@dataclass
class Objects:
  """What the PCI interface allocates first, as the NVK interface does: client, device, subdevice, and what they say."""
  root: int
  device: int
  subdevice: int
  classes: hw.Classes
  gr: dict[str, int]
  sm_version: int


def open_objects(r: RM) -> Objects:
  """The client (NV01_ROOT), the device (deviceId 0), the subdevice; the class list and GR's sizes."""
  root = r.alloc(0, ROOT_CLASS, ROOT_PARAMS(hClient=r.client), "the RM client", handle=r.client)
  device = r.alloc(root, rm.DEVICE, rm.DEVICE_PARAMS(deviceId=0, hClientShare=root), "the GPU device")
  subdevice = r.alloc(device, rm.SUBDEVICE, rm.SUBDEVICE_PARAMS(), "the GPU subdevice")
  cl = r.control(device, rm.CTRL_CLASSLIST_V2, L570.CLASSLIST_V2(), "listing the GPU's classes")
  offered = set(cl.classList[:cl.numClasses])
  picked = hw.pick_classes(offered)
  if picked is None:
    raise NVError(f"GSP-RM offers none of the compute classes plugrt-nv knows ({', '.join(f.name for f in hw.FAMILIES)})",
                  "add the family to plugrt_nv/hw.py FAMILIES")
  info = r.control(subdevice, CTRL_KGR_INFO, KGR_INFO(), "reading GR's static info")
  items = info.engineInfo[0]
  gr = {k: items[i].data for k, i in rm.GR_INFO.items()}
  gr["sms"] = gr["cores"] // 128 if gr["cores"] else gr["gpcs"] * gr["tpc_per_gpc"] * gr["sm_per_tpc"]
  return Objects(root, device, subdevice, picked, gr, gr["sm_version"])
