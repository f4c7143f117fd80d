"""GSP-RM's resource manager over RPC: the objects and controls the NVK interface makes with ioctls on /dev/nvidiactl,
sent as GSP_RM_ALLOC, GSP_RM_CONTROL and FREE messages (docs/research/nv-pci.md, sections 6 and 7).

The parameter structs are the kernel driver's own (plugrt_nv_nvk.rm, the 570 layouts, which the 570.144 firmware
speaks); the message headers are rpc_gsp_rm_alloc_v03_00 {hClient, hParent, hObject, hClass, status, paramsSize,
flags, reserved[4]} and rpc_gsp_rm_control_v03_00 {hClient, hObject, cmd, status, paramsSize, flags}
(g_rpc-structures.h at 570.144), followed by the parameters; GSP-RM answers with the same message, status and
parameters filled in. A control whose parameters hold a pointer into the caller's memory (NV2080_CTRL_CMD_GR_GET_INFO)
cannot cross to the GSP: the PCI interface asks the internal static variants instead (KGR_GET_INFO).

Also here: the two messages the CPU queues before GSP-RM starts (GSP_SET_SYSTEM_INFO, SET_REGISTRY), the page directory
handed to GSP-RM for a VA space whose tables the client owns (SET_PAGE_DIRECTORY), and the parameter structs of the
controls the bring-up of plugrt_nv_pci.gpu makes (docs/research/nv-pci.md, section 7, gives each one's source).
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
u8, u16, u32, u64 = rm.u8, rm.u16, rm.u32, rm.u64

# ---------------------------------------------------------------- before the boot
SYSTEM_INFO_SIZE = 928                      # sizeof(GspSystemInfo) (gsp_static_config.h)
PCI_CONFIG_MIRROR_BASE, PCI_CONFIG_MIRROR_SIZE = 0x88000, 0x1000   # GA10x/AD10x (GB20x: 0x92000)
MAX_USER_VA = 0x7FFFFFFFF000
REGISTRY = {"RMForcePcieConfigSave": 1, "RMSecBusResetEnable": 1}  # the registry keys tinygrad's driver sets
REGISTRY_DWORD = 1                          # REGISTRY_TABLE_ENTRY_TYPE_DWORD
REGISTRY_ENTRY = struct.Struct("<IB3xII")   # PACKED_REGISTRY_ENTRY: nameOffset type data length


def system_info(bars: tuple[int, int, int], bdf: int, ids: int, subsystem: int, revision: int) -> bytes:
  """GspSystemInfo: the bus addresses of BAR0, BAR1 and BAR3, the function's bus/device/function, its PCI ids from
  config space, the PCI config mirror, the largest user VA, bIsPassthru; the rest (ACPI data, chipset) zero."""
  b = bytearray(SYSTEM_INFO_SIZE)
  struct.pack_into("<QQQ", b, 0, *bars)                       # gpuPhysAddr, gpuPhysFbAddr, gpuPhysInstAddr
  struct.pack_into("<Q", b, 32, bdf)                          # nvDomainBusDeviceFunc
  struct.pack_into("<Q", b, 72, MAX_USER_VA)                  # maxUserVa
  struct.pack_into("<5I", b, 80, PCI_CONFIG_MIRROR_BASE, PCI_CONFIG_MIRROR_SIZE, ids, subsystem, revision)
  b[840] = 1                                                  # bIsPassthru
  return bytes(b)


def system_info_of(fn: Any) -> bytes:
  """GSP_SET_SYSTEM_INFO's payload for PCI function `fn` (sysfs.PCIFunction): its BARs' bus addresses (BAR0, BAR1 and
  BAR3 from `resource`), its ids (config 0x00: vendor and device), revision (0x08) and subsystem ids (0x2C)."""
  res = fn.resources()
  bars = tuple(res[i].start if i < len(res) else 0 for i in (0, 1, 3))
  (ids,), revision = struct.unpack("<I", fn.config_bytes(0, 4)), fn.config_bytes(8, 1)[0]
  (subsystem,) = struct.unpack("<I", fn.config_bytes(0x2C, 4))
  return system_info(bars, bdf_of(fn.address), ids, subsystem, revision)  # type: ignore[arg-type]


def bdf_of(address: str) -> int:
  """A PCI address "0000:01:00.0" as nvDomainBusDeviceFunc: bus << 8 | device << 3 | function."""
  bus, dev_fn = address.split(":")[1:]
  dev, fn = dev_fn.split(".")
  return int(bus, 16) << 8 | int(dev, 16) << 3 | int(fn, 16)


def registry_table(entries: dict[str, int] = REGISTRY) -> bytes:
  """PACKED_REGISTRY_TABLE {size, numEntries}, the DWORD entries, then their names (NUL-terminated)."""
  head = 8 + REGISTRY_ENTRY.size * len(entries)
  names, rows = b"", b""
  for k, v in entries.items():
    rows += REGISTRY_ENTRY.pack(head + len(names), REGISTRY_DWORD, v, 4)
    names += k.encode() + b"\0"
  return struct.pack("<II", head + len(names), len(entries)) + rows + names


# ---------------------------------------------------------------- RM after the boot
SET_PAGE_DIRECTORY = struct.Struct("<III4xQ6I")  # rpc_set_page_directory_v1E_05 {hClient hDevice pasid, params {physAddress numEntries
                                                 # flags hVASpace chId subDeviceId pasid}}
PAGE_DIRECTORY_ALL_CHANNELS, NO_PASID = 0x8, 0xFFFFFFFF
CTRL_DEVICE_INFO_TABLE = 0x20801112         # NV2080_CTRL_CMD_FIFO_GET_DEVICE_INFO_TABLE (ctrl2080fifo.h)
CTRL_CTX_BUFFERS_INFO = 0x20800A32          # NV2080_CTRL_CMD_INTERNAL_STATIC_KGR_GET_CONTEXT_BUFFERS_INFO (ctrl2080internal.h)
CTRL_PROMOTE_CTX = 0x2080012B               # NV2080_CTRL_CMD_GPU_PROMOTE_CTX (ctrl2080gpu.h)
CTRL_RESERVED_PDES = 0x90F10106             # NV90F1_CTRL_CMD_VASPACE_COPY_SERVER_RESERVED_PDES (ctrl90f1.h)
ENGINE_INFO_RM_ENGINE_TYPE, ENGINE_INFO_RUNLIST = 2, 3   # engineData indices (kernel_fifo.h ENGINE_INFO_TYPE)
ENGINE_GR0 = 1                              # NV2080_ENGINE_TYPE_GRAPHICS / RM_ENGINE_TYPE_GR0
DEVICE_ENTRY = rm.struct("DEVICE_ENTRY", 100, ("engineData", u32 * 16), ("pbdmaIds", u32 * 2), ("pbdmaFaultIds", u32 * 2), ("numPbdmas", u32),
                         ("engineName", ctypes.c_char * 16))
DEVICE_INFO_TABLE = rm.struct("DEVICE_INFO_TABLE", 3212, ("baseIndex", u32), ("numEntries", u32), ("bMore", u8), ("entries", DEVICE_ENTRY * 32))
CTX_BUFFER_INFO = rm.struct("CTX_BUFFER_INFO", 8, ("size", u32), ("alignment", u32))
CTX_BUFFERS_INFO = rm.struct("CTX_BUFFERS_INFO", 1664, ("engine", CTX_BUFFER_INFO * 26 * 8))  # 26 context buffers x 8 GR engines
PROMOTE_ENTRY = rm.struct("PROMOTE_ENTRY", 32, ("gpuPhysAddr", u64), ("gpuVirtAddr", u64), ("size", u64), ("physAttr", u32), ("bufferId", u16),
                          ("bInitialize", u8), ("bNonmapped", u8))
PROMOTE_CTX = rm.struct("PROMOTE_CTX", 560, ("engineType", u32), ("hClient", u32), ("ChID", u32), ("hChanClient", u32), ("hObject", u32),
                        ("hVirtMemory", u32), ("virtAddress", u64), ("size", u64), ("entryCount", u32), ("promoteEntry", PROMOTE_ENTRY * 16))
PDE_LEVEL = rm.struct("PDE_LEVEL", 24, ("physAddress", u64), ("size", u64), ("aperture", u32), ("pageShift", u8))
RESERVED_PDES = rm.struct("RESERVED_PDES", 184, ("hSubDevice", u32), ("subDeviceId", u32), ("pageSize", u64), ("virtAddrLo", u64),
                          ("virtAddrHi", u64), ("numLevelsToCopy", u32), ("levels", PDE_LEVEL * 6))


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

  def set_page_directory(self, device: int, vaspace: int, root: int, entries: int) -> None:
    """Hand GSP-RM the page directory (the root table's VRAM address, `entries` entries) of a VA space whose tables
    this client owns (FERMI_VASPACE_A with IS_EXTERNALLY_OWNED), for every channel on it."""
    self.q.call(Function.SET_PAGE_DIRECTORY, SET_PAGE_DIRECTORY.pack(self.client, device, NO_PASID, root, entries, PAGE_DIRECTORY_ALL_CHANNELS,
                                                                     vaspace, 0, 1, NO_PASID), "handing GSP-RM the page directory")

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
