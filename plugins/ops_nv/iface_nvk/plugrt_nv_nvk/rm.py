"""The NVIDIA kernel driver's user interface: ioctl numbers, parameter structs and the calls made with them.

Layouts are x86-64 and chosen by the driver's major version (`layout(major)`); the few structs that changed
between branches are listed there. Sizes are checked when the structs are built: the driver checks them
exactly. Sources: NVIDIA's open-gpu-kernel-modules headers, as collected in docs/research/nv-driver.md.
"""
from __future__ import annotations

import ctypes
import errno
import fcntl
import functools
import os
from types import SimpleNamespace
from typing import Any

from plugrt_nv.iface import NVError
from plugrt_nv_nvk.branches import BRANCHES

u8, u16, u32, s32, u64 = ctypes.c_uint8, ctypes.c_uint16, ctypes.c_uint32, ctypes.c_int32, ctypes.c_uint64
UUID = ctypes.c_uint8 * 16

# escapes (ioctl numbers, in the 'F' space)
ESC_RM_ALLOC_MEMORY, ESC_RM_FREE, ESC_RM_CONTROL, ESC_RM_ALLOC = 0x27, 0x29, 0x2A, 0x2B
ESC_RM_MAP_MEMORY, ESC_RM_MAP_MEMORY_DMA = 0x4E, 0x57
ESC_CARD_INFO, ESC_REGISTER_FD = 200, 201

# classes the bring-up allocates (the engine classes come from plugrt_nv.hw)
ROOT_CLIENT, DEVICE, SUBDEVICE, MEMORY_SYSTEM, MEMORY_USER, MEMORY_VIRTUAL = 0x41, 0x80, 0x2080, 0x3E, 0x40, 0x70
OS_DESCRIPTOR, VASPACE, CHANNEL_GROUP, CONTEXT_SHARE, DEBUGGER = 0x71, 0x90F1, 0xA06C, 0x9067, 0x83DE

# controls
CTRL_BUILD_VERSION_V2, CTRL_GPU_ID_INFO_V2 = 0x13E, 0x205
CTRL_CLASSLIST_V2 = 0x800292
CTRL_GID_INFO, CTRL_GR_INFO = 0x2080014A, 0x20801201
CTRL_GPU_GET_ENGINES_V2 = 0x20800170  # NV2080_CTRL_CMD_GPU_GET_ENGINES_V2 (ctrl2080gpu.h): the engines this GPU has
CTRL_SCHEDULE, CTRL_WORK_SUBMIT_TOKEN = 0xA06C0101, 0xC36F0108
CTRL_CHANNEL_SCHEDULE, CTRL_CHANNEL_BIND = 0xA06F0103, 0xA06F0104  # a channel outside any channel group: NVA06F_CTRL_CMD_GPFIFO_SCHEDULE, _BIND
CTRL_SM_ERRORS, CTRL_MMU_FAULT = 0x83DE030C, 0x83DE0328
GR_INFO = {"sm_version": 0x0C, "warps_per_sm": 0x0D, "gpcs": 0x14, "tpc_per_gpc": 0x17, "cores": 0x1D, "sm_per_tpc": 0x20}

# UVM ioctls (bare numbers)
UVM_INITIALIZE, UVM_REGISTER_GPU_VASPACE, UVM_REGISTER_CHANNEL, UVM_MAP_EXTERNAL_ALLOCATION = 0x30000001, 25, 27, 33
UVM_FREE, UVM_REGISTER_GPU, UVM_CREATE_EXTERNAL_RANGE, UVM_MM_INITIALIZE = 34, 37, 73, 75
UVM_UNREGISTER_GPU_VASPACE, UVM_ENABLE_PEER_ACCESS, UVM_DISABLE_PEER_ACCESS, UVM_UNREGISTER_GPU = 26, 29, 30, 38

# peer capabilities between GPUs (NV0000_CTRL_CMD_SYSTEM_GET_P2P_CAPS_V2 on the root client; ctrl0000system.h, the same in 570-595)
CTRL_P2P_CAPS_V2 = 0x12B
P2P_WRITES, P2P_READS, P2P_NVLINK, P2P_PCI = 1 << 0, 1 << 1, 1 << 3, 1 << 6   # p2pCaps bits
P2P_INDEX_READ, P2P_INDEX_WRITE = 0, 1                                          # p2pCapsStatus entries
P2P_STATUS = {1: "the chipset does not support peer access", 2: "the GPU does not support peer access",
              3: "the PCIe topology does not support peer access (root ports on different I/O hubs)",
              4: "peer access is disabled by a driver registry key", 5: "peer access is not supported"}

STATUS = {0x1B: "NV_ERR_INSUFFICIENT_PERMISSIONS", 0x1F: "NV_ERR_INVALID_ARGUMENT", 0x22: "NV_ERR_INVALID_CLASS", 0x29: "NV_ERR_INVALID_FLAGS",
          0x2E: "NV_ERR_INVALID_LIMIT", 0x33: "NV_ERR_INVALID_OBJECT_HANDLE", 0x36: "NV_ERR_INVALID_OBJECT_PARENT", 0x37: "NV_ERR_INVALID_OFFSET",
          0x3A: "NV_ERR_INVALID_PARAM_STRUCT", 0x40: "NV_ERR_INVALID_STATE", 0x51: "NV_ERR_NO_MEMORY", 0x56: "NV_ERR_NOT_SUPPORTED",
          0x57: "NV_ERR_OBJECT_NOT_FOUND", 0x59: "NV_ERR_OPERATING_SYSTEM", 0x60: "NV_ERR_RC_ERROR", 0x63: "NV_ERR_STATE_IN_USE",
          0x65: "NV_ERR_TIMEOUT", 0x68: "NV_ERR_UVM_ADDRESS_IN_USE", 0x1A: "NV_ERR_INSUFFICIENT_RESOURCES", 0x17: "NV_ERR_IN_USE",
          0x16: "NV_ERR_ILLEGAL_ACTION"}
NO_MEMORY = (0x51, 0x1A)


def status_name(code: int) -> str: return f"{STATUS.get(code, 'NV status')} ({code:#x})"


def struct(name: str, size: int, *fields: tuple[str, Any]) -> type[ctypes.Structure]:
  """A C struct with natural x86-64 alignment; `size` is what the driver expects (checked here, once)."""
  cls = type(name, (ctypes.Structure,), {"_fields_": list(fields)})
  assert ctypes.sizeof(cls) == size, f"{name} is {ctypes.sizeof(cls)} bytes, the driver expects {size}"
  return cls


# ---------------------------------------------------------------- structs that are the same in 570, 580 and 610

NVOS21 = struct("NVOS21", 32, ("hRoot", u32), ("hObjectParent", u32), ("hObjectNew", u32), ("hClass", u32), ("pAllocParms", u64),
                ("paramsSize", u32), ("status", u32))
NVOS54 = struct("NVOS54", 32, ("hClient", u32), ("hObject", u32), ("cmd", u32), ("flags", u32), ("params", u64), ("paramsSize", u32), ("status", u32))
NVOS00 = struct("NVOS00", 16, ("hRoot", u32), ("hObjectParent", u32), ("hObjectOld", u32), ("status", u32))
NVOS33 = struct("NVOS33", 48, ("hClient", u32), ("hDevice", u32), ("hMemory", u32), ("pad", u32), ("offset", u64), ("length", u64),
                ("pLinearAddress", u64), ("status", u32), ("flags", u32))
NVOS33_FD = struct("NVOS33_FD", 56, ("params", NVOS33), ("fd", s32))
NVOS02 = struct("NVOS02", 48, ("hRoot", u32), ("hObjectParent", u32), ("hObjectNew", u32), ("hClass", u32), ("flags", u32), ("pad", u32),
                ("pMemory", u64), ("limit", u64), ("status", u32))
NVOS02_FD = struct("NVOS02_FD", 56, ("params", NVOS02), ("fd", s32))
PCI_INFO = struct("PCI_INFO", 12, ("domain", u32), ("bus", u8), ("slot", u8), ("function", u8), ("pad", u8), ("vendor_id", u16), ("device_id", u16))
CARD_INFO = struct("CARD_INFO", 72, ("valid", u8), ("pci", PCI_INFO), ("gpu_id", u32), ("interrupt_line", u16), ("reg_address", u64),
                   ("reg_size", u64), ("fb_address", u64), ("fb_size", u64), ("minor_number", u32), ("dev_name", u8 * 10))
REGISTER_FD = struct("REGISTER_FD", 4, ("ctl_fd", s32))
BUILD_VERSION_V2 = struct("BUILD_VERSION_V2", 1032, ("driverVersion", ctypes.c_char * 256), ("version", ctypes.c_char * 256),
                          ("branch", ctypes.c_char * 256), ("title", ctypes.c_char * 256), ("changelist", u32), ("officialChangelist", u32))
GPU_ID_INFO_V2 = struct("GPU_ID_INFO_V2", 32, ("gpuId", u32), ("gpuFlags", u32), ("deviceInstance", u32), ("subDeviceInstance", u32),
                        ("sliStatus", u32), ("boardId", u32), ("gpuInstance", u32), ("numaId", s32))
DEVICE_PARAMS = struct("DEVICE_PARAMS", 56, ("deviceId", u32), ("hClientShare", u32), ("hTargetClient", u32), ("hTargetDevice", u32),
                       ("flags", u32), ("vaSpaceSize", u64), ("vaStartInternal", u64), ("vaLimitInternal", u64), ("vaMode", u32))
SUBDEVICE_PARAMS = struct("SUBDEVICE_PARAMS", 4, ("subDeviceId", u32))
VIRTUAL_PARAMS = struct("VIRTUAL_PARAMS", 24, ("offset", u64), ("limit", u64), ("hVASpace", u32))
MEMORY_PARAMS = struct("MEMORY_PARAMS", 128, ("owner", u32), ("type", u32), ("flags", u32), ("width", u32), ("height", u32), ("pitch", s32),
                       ("attr", u32), ("attr2", u32), ("format", u32), ("comprCovg", u32), ("zcullCovg", u32), ("rangeLo", u64), ("rangeHi", u64),
                       ("size", u64), ("alignment", u64), ("offset", u64), ("limit", u64), ("address", u64), ("ctagOffset", u32),
                       ("hVASpace", u32), ("internalflags", u32), ("tag", u32), ("numaNode", s32))
CHANNEL_GROUP_PARAMS = struct("CHANNEL_GROUP_PARAMS", 20, ("hObjectError", u32), ("hObjectEccError", u32), ("hVASpace", u32), ("engineType", u32),
                              ("bIsCallingContextVgpuPlugin", u8))
CTXSHARE_PARAMS = struct("CTXSHARE_PARAMS", 12, ("hVASpace", u32), ("flags", u32), ("subctxId", u32))
DEBUGGER_PARAMS = struct("DEBUGGER_PARAMS", 12, ("hDebuggerClient", u32), ("hAppClient", u32), ("hClass3dObject", u32))
GPU_ENGINES_V2 = struct("GPU_ENGINES_V2", 340, ("engineCount", u32), ("engineList", u32 * 0x54))  # NV2080_GPU_MAX_ENGINES_LIST_SIZE
GID_INFO = struct("GID_INFO", 268, ("index", u32), ("flags", u32), ("length", u32), ("data", u8 * 256))
GR_INFO_ITEM = struct("GR_INFO_ITEM", 8, ("index", u32), ("data", u32))
GR_INFO_PARAMS = struct("GR_INFO_PARAMS", 32, ("grInfoListSize", u32), ("grInfoList", u64), ("routeFlags", u32), ("route", u64))
WORK_SUBMIT_TOKEN = struct("WORK_SUBMIT_TOKEN", 4, ("workSubmitToken", u32))
CHANNEL_BIND = struct("CHANNEL_BIND", 4, ("engineType", u32))  # NVA06F_CTRL_BIND_PARAMS
SM_ERROR = struct("SM_ERROR", 48, ("hwwGlobalEsr", u32), ("hwwWarpEsr", u32), ("hwwWarpEsrPc", u32), ("hwwGlobalEsrReportMask", u32),
                  ("hwwWarpEsrReportMask", u32), ("hwwEsrAddr", u64), ("hwwWarpEsrPc64", u64), ("hwwCgaEsr", u32), ("hwwCgaEsrReportMask", u32))
SM_ERRORS = struct("SM_ERRORS", 4824, ("hTargetChannel", u32), ("numSMsToRead", u32), ("sm", SM_ERROR * 100), ("mmuFaultInfo", u32),
                   ("mmuFaultValid", u8), ("mmuFaultInfo2", u32), ("startingSM", u32))
P2P_CAPS_V2 = struct("P2P_CAPS_V2", 8348, ("gpuIds", u32 * 32), ("gpuCount", u32), ("p2pCaps", u32), ("p2pOptimalReadCEs", u32),
                     ("p2pOptimalWriteCEs", u32), ("p2pCapsStatus", u8 * 9), ("busPeerIds", u32 * 1024), ("busEgmPeerIds", u32 * 1024))
MMU_FAULT = struct("MMU_FAULT", 16, ("faultAddress", u64), ("faultType", u32), ("accessType", u32))
MMU_FAULTS = struct("MMU_FAULTS", 72, ("faults", MMU_FAULT * 4), ("count", u32))
# UVM
UVM_INITIALIZE_PARAMS = struct("UVM_INITIALIZE_PARAMS", 16, ("flags", u64), ("rmStatus", u32))
UVM_MM_INITIALIZE_PARAMS = struct("UVM_MM_INITIALIZE_PARAMS", 8, ("uvmFd", s32), ("rmStatus", u32))
UVM_REGISTER_GPU_PARAMS = struct("UVM_REGISTER_GPU_PARAMS", 40, ("gpu_uuid", UUID), ("numaEnabled", u8), ("numaNodeId", s32), ("rmCtrlFd", s32),
                                 ("hClient", u32), ("hSmcPartRef", u32), ("rmStatus", u32))
UVM_REGISTER_GPU_VASPACE_PARAMS = struct("UVM_REGISTER_GPU_VASPACE_PARAMS", 32, ("gpuUuid", UUID), ("rmCtrlFd", s32), ("hClient", u32),
                                         ("hVaSpace", u32), ("rmStatus", u32))
UVM_REGISTER_CHANNEL_PARAMS = struct("UVM_REGISTER_CHANNEL_PARAMS", 56, ("gpuUuid", UUID), ("rmCtrlFd", s32), ("hClient", u32), ("hChannel", u32),
                                     ("base", u64), ("length", u64), ("rmStatus", u32))
UVM_UNREGISTER_GPU_PARAMS = struct("UVM_UNREGISTER_GPU_PARAMS", 20, ("gpu_uuid", UUID), ("rmStatus", u32))
UVM_UNREGISTER_GPU_VASPACE_PARAMS = struct("UVM_UNREGISTER_GPU_VASPACE_PARAMS", 20, ("gpuUuid", UUID), ("rmStatus", u32))
UVM_PEER_ACCESS_PARAMS = struct("UVM_PEER_ACCESS_PARAMS", 36, ("gpuUuidA", UUID), ("gpuUuidB", UUID), ("rmStatus", u32))  # enable and disable
UVM_CREATE_EXTERNAL_RANGE_PARAMS = struct("UVM_CREATE_EXTERNAL_RANGE_PARAMS", 24, ("base", u64), ("length", u64), ("rmStatus", u32))
UVM_GPU_MAPPING = struct("UVM_GPU_MAPPING", 36, ("gpuUuid", UUID), ("gpuMappingType", u32), ("gpuCachingType", u32), ("gpuFormatType", u32),
                         ("gpuElementBits", u32), ("gpuCompressionType", u32))
UVM_MAP_EXTERNAL_ALLOCATION_PARAMS = struct("UVM_MAP_EXTERNAL_ALLOCATION_PARAMS", 9264, ("base", u64), ("length", u64), ("offset", u64),
                                            ("perGpuAttributes", UVM_GPU_MAPPING * 256), ("gpuAttributesCount", u64), ("rmCtrlFd", s32),
                                            ("hClient", u32), ("hMemory", u32), ("rmStatus", u32))


# ---------------------------------------------------------------- structs that differ between driver branches

MEMDESC = [(f, t) for f, t in (("base", u64), ("size", u64), ("addressSpace", u32), ("cacheAttrib", u32))]
MEMORY_DESC = struct("MEMORY_DESC", 24, *MEMDESC)


def branch_of(major: int) -> int | None: return next((b for b, r in BRANCHES.items() if major in r), None)


@functools.lru_cache(None)
def layout(major: int) -> SimpleNamespace:
  """The structs whose layout depends on the driver branch, for driver `major` (570, 580 or 610 tables)."""
  b = branch_of(major)
  if b is None: raise NVError(f"NVIDIA driver {major} is not supported: plugrt-nv has struct layouts for the {', '.join(map(str, BRANCHES))} "
                              "branches",
                              "install a 580 driver (the one plugrt-nv runs on), or add the branch's layouts to plugrt_nv_nvk/rm.py")
  newer = b >= 580
  nvos46 = [("hClient", u32), ("hDevice", u32), ("hDma", u32), ("hMemory", u32), ("offset", u64), ("length", u64), ("flags", u32)]
  nvos46 += [("flags2", u32), ("kindOverride", u32), ("dmaOffset", u64), ("status", u32)] if newer else [("dmaOffset", u64), ("status", u32)]
  vaspace = [("index", u32), ("flags", u32), ("vaSize", u64), ("vaStartInternal", u64), ("vaLimitInternal", u64), ("bigPageSize", u32),
             ("vaBase", u64)]
  chan = [("hObjectError", u32), ("hObjectBuffer", u32), ("gpFifoOffset", u64), ("gpFifoEntries", u32), ("flags", u32), ("hContextShare", u32),
          ("hVASpace", u32)] + ([("hHandleVASpace", u32)] if b >= 610 else []) + [
          ("hUserdMemory", u32 * 8), ("userdOffset", u64 * 8), ("engineType", u32), ("cid", u32), ("subDeviceId", u32), ("hObjectEccError", u32),
          ("instanceMem", MEMORY_DESC), ("userdMem", MEMORY_DESC), ("ramfcMem", MEMORY_DESC), ("mthdbufMem", MEMORY_DESC), ("hPhysChannelGroup", u32),
          ("internalFlags", u32), ("errorNotifierMem", MEMORY_DESC), ("eccErrorNotifierMem", MEMORY_DESC), ("ProcessID", u32), ("SubProcessID", u32),
          ("encryptIv", u32 * 3), ("decryptIv", u32 * 3), ("hmacNonce", u32 * 8), ("tpcConfigID", u32)]
  return SimpleNamespace(
    branch=b,
    NVOS46=struct("NVOS46", 64 if newer else 56, *nvos46),
    VASPACE_PARAMS=struct("VASPACE_PARAMS", 56 if newer else 48, *vaspace, *([("pasid", u32)] if newer else [])),
    CHANNEL_PARAMS=struct("CHANNEL_PARAMS", 376 if b >= 610 else 368, *chan),
    CLASSLIST_V2=struct("CLASSLIST_V2", 804 if newer else 404, ("numClasses", u32), ("classList", u32 * (200 if newer else 100))),
    SCHEDULE=struct("SCHEDULE", 3 if newer else 2, ("bEnable", u8), ("bSkipSubmit", u8), *([("bSkipEnable", u8)] if newer else [])),
    UVM_FREE_PARAMS=struct("UVM_FREE_PARAMS", 16 if b >= 610 else 24, ("base", u64), *([] if b >= 610 else [("length", u64)]), ("rmStatus", u32)),
  )


# ---------------------------------------------------------------- calls


def iowr(nr: int, size: int) -> int: return 3 << 30 | size << 16 | ord("F") << 8 | nr


def ioctl(fd: int, nr: int, params: ctypes.Structure, what: str) -> None:
  """One driver escape; the kernel checks the size, RM then reports through a status field the caller checks."""
  try: fcntl.ioctl(fd, iowr(nr, ctypes.sizeof(params)), params)
  except OSError as e:
    raise NVError(f"{what}: the NVIDIA driver refused the call ({errno.errorcode.get(e.errno, e.errno)}: {os.strerror(e.errno or 0)})",
                  "check that the driver version matches a layout table in plugrt_nv_nvk/rm.py") from None


def uvm_ioctl(fd: int, cmd: int, params: ctypes.Structure, what: str) -> None:
  try: fcntl.ioctl(fd, cmd, params)
  except OSError as e:
    raise NVError(f"{what}: /dev/nvidia-uvm refused the call ({errno.errorcode.get(e.errno, e.errno)})", "is the nvidia-uvm module loaded?") from None
  if params.rmStatus: raise NVError(f"{what}: {status_name(params.rmStatus)}")  # type: ignore[attr-defined]


def ref(params: ctypes.Structure | None) -> int: return 0 if params is None else ctypes.addressof(params)
