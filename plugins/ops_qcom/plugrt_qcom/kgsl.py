"""The KGSL ABI as data: ioctl request numbers, flags and argument structs of Qualcomm's Adreno kernel driver, from
the Linux kernel's include/uapi/linux/msm_kgsl.h (see docs/research/qcom.md for the trees and commits read).

Only what plugrt-qcom uses is here. Every struct is the header's, field by field in its order, with C's natural
alignment (ctypes.Structure does the same): tests/test_qcom_kgsl.py checks each size and offset against values
worked out from the header by hand. `unsigned long` and `size_t` fields are 64-bit: KGSL on arm64 (and the
compat layer of a 64-bit kernel) is what this targets.
"""
from __future__ import annotations

import ctypes

KGSL_IOC_TYPE = 0x09
DEVICE = "/dev/kgsl-3d0"

# ---------------------------------------------------------------- flags (msm_kgsl.h)
KGSL_CONTEXT_NO_GMEM_ALLOC = 0x00000002
KGSL_CONTEXT_PREAMBLE = 0x00000010
KGSL_CONTEXT_NO_FAULT_TOLERANCE = 0x00000200
KGSL_CONTEXT_PWR_CONSTRAINT = 0x00000800
KGSL_CONTEXT_PRIORITY_SHIFT, KGSL_CONTEXT_PRIORITY_MASK = 12, 0x0000F000
KGSL_CONTEXT_PREEMPT_STYLE_SHIFT, KGSL_CONTEXT_PREEMPT_STYLE_MASK = 25, 0x0E000000
KGSL_CONTEXT_PREEMPT_STYLE_FINEGRAIN = 0x2
KGSL_CONTEXT_TYPE_SHIFT, KGSL_CONTEXT_TYPE_MASK = 20, 0x01F00000
KGSL_CONTEXT_TYPE_CL = 2

KGSL_CMDLIST_IB = 0x00000001          # a kgsl_command_object that is an indirect buffer of CP packets

KGSL_MEMFLAGS_USE_CPU_MAP = 1 << 28   # the GPU address is the CPU address of the mmap (one address for both)
KGSL_MEMALIGN_SHIFT, KGSL_MEMALIGN_MASK = 16, 0x00FF0000
KGSL_CACHEMODE_SHIFT, KGSL_CACHEMODE_MASK = 26, 0x0C000000
KGSL_CACHEMODE_WRITECOMBINE, KGSL_CACHEMODE_UNCACHED, KGSL_CACHEMODE_WRITETHROUGH, KGSL_CACHEMODE_WRITEBACK = 0, 1, 2, 3
KGSL_MEMTYPE_SHIFT, KGSL_MEMTYPE_MASK = 8, 0x0000FF00
KGSL_MEMTYPE_CL = 10
KGSL_MEMTYPE_COMMAND = 16
KGSL_USER_MEM_TYPE_ADDR = 0x00000002

KGSL_PROP_DEVICE_INFO = 0x1
KGSL_PROP_GPU_RESET_STAT = 0x9         # value: the context id in, its kgsl_ctx_reset_stat out
KGSL_CTX_STAT_NO_ERROR = 0
KGSL_CTX_STAT_GUILTY_CONTEXT_RESET_EXT = 1
KGSL_CTX_STAT_INNOCENT_CONTEXT_RESET_EXT = 2
KGSL_CTX_STAT_UNKNOWN_CONTEXT_RESET_EXT = 3

KGSL_TIMESTAMP_RETIRED = 0x2           # end-of-pipeline timestamp (kgsl_timestamp_type)
KGSL_TIMESTAMP_EVENT_FENCE = 2         # kgsl_timestamp_event.type: a sync-fence fd when the timestamp retires
KGSL_GPUOBJ_FREE_ON_EVENT = 1


def field(value: int, shift: int, mask: int) -> int:
  """`value` placed in a flags field (value << shift, masked)."""
  return value << shift & mask


# ---------------------------------------------------------------- argument structs
class DevInfo(ctypes.Structure):
  """struct kgsl_devinfo (KGSL_PROP_DEVICE_INFO): chip_id is core:8 major:8 minor:8 patch:8."""
  _fields_ = [("device_id", ctypes.c_uint32), ("chip_id", ctypes.c_uint32), ("mmu_enabled", ctypes.c_uint32),
              ("gmem_gpubaseaddr", ctypes.c_ulong), ("gpu_id", ctypes.c_uint32), ("gmem_sizebytes", ctypes.c_size_t)]


class DeviceGetProperty(ctypes.Structure):
  """struct kgsl_device_getproperty: `value` points at `sizebytes` bytes the driver fills (in and out)."""
  _fields_ = [("type", ctypes.c_uint32), ("value", ctypes.c_void_p), ("sizebytes", ctypes.c_size_t)]


class DeviceWaitTimestampCtxtId(ctypes.Structure):
  """struct kgsl_device_waittimestamp_ctxtid: block until `timestamp` of `context_id` retires, at most `timeout` ms."""
  _fields_ = [("context_id", ctypes.c_uint32), ("timestamp", ctypes.c_uint32), ("timeout", ctypes.c_uint32)]


class CmdstreamReadTimestampCtxtId(ctypes.Structure):
  """struct kgsl_cmdstream_readtimestamp_ctxtid: the context's timestamp of `type` (RETIRED: the last one done)."""
  _fields_ = [("context_id", ctypes.c_uint32), ("type", ctypes.c_uint32), ("timestamp", ctypes.c_uint32)]


class DrawctxtCreate(ctypes.Structure):
  """struct kgsl_drawctxt_create: `flags` in (KGSL_CONTEXT_*), `drawctxt_id` out."""
  _fields_ = [("flags", ctypes.c_uint32), ("drawctxt_id", ctypes.c_uint32)]


class DrawctxtDestroy(ctypes.Structure):
  _fields_ = [("drawctxt_id", ctypes.c_uint32)]


class TimestampEvent(ctypes.Structure):
  """struct kgsl_timestamp_event: ask for an event (a fence fd, type FENCE) when `timestamp` of `context_id` retires."""
  _fields_ = [("type", ctypes.c_int), ("timestamp", ctypes.c_uint32), ("context_id", ctypes.c_uint32),
              ("priv", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class TimestampEventFence(ctypes.Structure):
  """struct kgsl_timestamp_event_fence: the fence's fd, written by the driver."""
  _fields_ = [("fence_fd", ctypes.c_int)]


class GpuobjAlloc(ctypes.Structure):
  """struct kgsl_gpuobj_alloc: `size` and `flags` in; `mmapsize` and `id` out (mmap the KGSL fd at offset id << 12)."""
  _fields_ = [("size", ctypes.c_uint64), ("flags", ctypes.c_uint64), ("va_len", ctypes.c_uint64), ("mmapsize", ctypes.c_uint64),
              ("id", ctypes.c_uint32), ("metadata_len", ctypes.c_uint32), ("metadata", ctypes.c_uint64)]


class GpuobjFree(ctypes.Structure):
  """struct kgsl_gpuobj_free: free object `id` now (flags 0), or when an event fires (FREE_ON_EVENT, priv/type/len)."""
  _fields_ = [("flags", ctypes.c_uint64), ("priv", ctypes.c_uint64), ("id", ctypes.c_uint32), ("type", ctypes.c_uint32),
              ("len", ctypes.c_uint32)]


class GpuobjInfo(ctypes.Structure):
  """struct kgsl_gpuobj_info: object `id` in; its GPU address, flags, size, va_len and CPU address out."""
  _fields_ = [("gpuaddr", ctypes.c_uint64), ("flags", ctypes.c_uint64), ("size", ctypes.c_uint64), ("va_len", ctypes.c_uint64),
              ("va_addr", ctypes.c_uint64), ("id", ctypes.c_uint32)]


class MapUserMem(ctypes.Structure):
  """struct kgsl_map_user_mem: map `len` bytes of host memory at `hostptr` (memtype KGSL_USER_MEM_TYPE_ADDR) for the GPU;
  the driver writes `gpuaddr`."""
  _fields_ = [("fd", ctypes.c_int), ("gpuaddr", ctypes.c_ulong), ("len", ctypes.c_size_t), ("offset", ctypes.c_size_t),
              ("hostptr", ctypes.c_ulong), ("memtype", ctypes.c_uint32), ("flags", ctypes.c_uint32)]


class SharedmemFree(ctypes.Structure):
  """struct kgsl_sharedmem_free: unmap what MAP_USER_MEM mapped at `gpuaddr`."""
  _fields_ = [("gpuaddr", ctypes.c_ulong)]


class CommandObject(ctypes.Structure):
  """struct kgsl_command_object: one indirect buffer (flags KGSL_CMDLIST_IB) of `size` bytes at `gpuaddr`."""
  _fields_ = [("offset", ctypes.c_uint64), ("gpuaddr", ctypes.c_uint64), ("size", ctypes.c_uint64), ("flags", ctypes.c_uint32),
              ("id", ctypes.c_uint32)]


class GpuCommand(ctypes.Structure):
  """struct kgsl_gpu_command: `numcmds` command objects of `cmdsize` bytes at `cmdlist` for `context_id`; the driver
  writes the submission's context `timestamp`."""
  _fields_ = [("flags", ctypes.c_uint64), ("cmdlist", ctypes.c_uint64), ("cmdsize", ctypes.c_uint32), ("numcmds", ctypes.c_uint32),
              ("objlist", ctypes.c_uint64), ("objsize", ctypes.c_uint32), ("numobjs", ctypes.c_uint32),
              ("synclist", ctypes.c_uint64), ("syncsize", ctypes.c_uint32), ("numsyncs", ctypes.c_uint32),
              ("context_id", ctypes.c_uint32), ("timestamp", ctypes.c_uint32)]


# ---------------------------------------------------------------- request numbers (Linux's _IOC encoding)
_IOC_WRITE, _IOC_READ = 1, 2


def _ioc(direction: int, nr: int, struct: type[ctypes.Structure]) -> int:
  return direction << 30 | ctypes.sizeof(struct) << 16 | KGSL_IOC_TYPE << 8 | nr


def _iow(nr: int, struct: type[ctypes.Structure]) -> int: return _ioc(_IOC_WRITE, nr, struct)
def _iowr(nr: int, struct: type[ctypes.Structure]) -> int: return _ioc(_IOC_READ | _IOC_WRITE, nr, struct)


IOCTL_KGSL_DEVICE_GETPROPERTY = _iowr(0x02, DeviceGetProperty)
IOCTL_KGSL_DEVICE_WAITTIMESTAMP_CTXTID = _iow(0x07, DeviceWaitTimestampCtxtId)
IOCTL_KGSL_DRAWCTXT_CREATE = _iowr(0x13, DrawctxtCreate)
IOCTL_KGSL_DRAWCTXT_DESTROY = _iow(0x14, DrawctxtDestroy)
IOCTL_KGSL_MAP_USER_MEM = _iowr(0x15, MapUserMem)
IOCTL_KGSL_CMDSTREAM_READTIMESTAMP_CTXTID = _iowr(0x16, CmdstreamReadTimestampCtxtId)
IOCTL_KGSL_SHAREDMEM_FREE = _iow(0x21, SharedmemFree)
IOCTL_KGSL_TIMESTAMP_EVENT = _iowr(0x33, TimestampEvent)
IOCTL_KGSL_GPUOBJ_ALLOC = _iowr(0x45, GpuobjAlloc)
IOCTL_KGSL_GPUOBJ_FREE = _iow(0x46, GpuobjFree)
IOCTL_KGSL_GPUOBJ_INFO = _iowr(0x47, GpuobjInfo)
IOCTL_KGSL_GPU_COMMAND = _iowr(0x4A, GpuCommand)

#: request number -> (name, argument struct): what an error message and the fake name a request by
REQUESTS: dict[int, tuple[str, type[ctypes.Structure]]] = {
  IOCTL_KGSL_DEVICE_GETPROPERTY: ("DEVICE_GETPROPERTY", DeviceGetProperty),
  IOCTL_KGSL_DEVICE_WAITTIMESTAMP_CTXTID: ("DEVICE_WAITTIMESTAMP_CTXTID", DeviceWaitTimestampCtxtId),
  IOCTL_KGSL_DRAWCTXT_CREATE: ("DRAWCTXT_CREATE", DrawctxtCreate),
  IOCTL_KGSL_DRAWCTXT_DESTROY: ("DRAWCTXT_DESTROY", DrawctxtDestroy),
  IOCTL_KGSL_MAP_USER_MEM: ("MAP_USER_MEM", MapUserMem),
  IOCTL_KGSL_CMDSTREAM_READTIMESTAMP_CTXTID: ("CMDSTREAM_READTIMESTAMP_CTXTID", CmdstreamReadTimestampCtxtId),
  IOCTL_KGSL_SHAREDMEM_FREE: ("SHAREDMEM_FREE", SharedmemFree),
  IOCTL_KGSL_TIMESTAMP_EVENT: ("TIMESTAMP_EVENT", TimestampEvent),
  IOCTL_KGSL_GPUOBJ_ALLOC: ("GPUOBJ_ALLOC", GpuobjAlloc),
  IOCTL_KGSL_GPUOBJ_FREE: ("GPUOBJ_FREE", GpuobjFree),
  IOCTL_KGSL_GPUOBJ_INFO: ("GPUOBJ_INFO", GpuobjInfo),
  IOCTL_KGSL_GPU_COMMAND: ("GPU_COMMAND", GpuCommand),
}


def chip_generation(chip_id: int) -> tuple[int, int, int]:
  """(core, major, minor) of a kgsl_devinfo chip_id: Adreno 630 is (6, 3, 0). A 7xx part past the 730 may report core 0x43
  ('C') and later ones 0x45 ('E'): see docs/research/qcom.md."""
  return chip_id >> 24 & 0xFF, chip_id >> 16 & 0xFF, chip_id >> 8 & 0xFF
