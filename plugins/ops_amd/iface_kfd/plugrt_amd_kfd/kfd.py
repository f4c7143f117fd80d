"""The KFD ioctl ABI as data: the request numbers and argument structs of the ioctls plugrt-amd-kfd uses.

Every layout here is the Linux kernel's include/uapi/linux/kfd_ioctl.h (ABI 1.18; docs/research/amd-kfd.md names
the commit and the version history that matters). The structs are ctypes structures whose natural C layout is the
kernel's (all fields are __u32/__u64 in an order that needs no packing); tests/test_kfd_queue.py checks every
size and field offset against a table derived by hand from the header. Fields documented "to KFD" are what the
caller fills, "from KFD" what the driver returns.
"""
from __future__ import annotations

import ctypes

u32, u64 = ctypes.c_uint32, ctypes.c_uint64

# ---------------------------------------------------------------- request numbers (<linux/ioctl.h> encoding)

_IOC_WRITE, _IOC_READ = 1, 2  # direction bits (30..31): the caller writes the struct, the kernel reads it back, or both


def ioc(direction: int, nr: int, size: int, base: int = ord("K")) -> int:
  """_IOC(dir, type, nr, size): dir << 30 | size << 16 | type << 8 | nr (the asm-generic layout x86-64 and arm64 use)."""
  return direction << 30 | size << 16 | base << 8 | nr


def IOR(nr: int, st: type[ctypes.Structure]) -> int: return ioc(_IOC_READ, nr, ctypes.sizeof(st))
def IOW(nr: int, st: type[ctypes.Structure]) -> int: return ioc(_IOC_WRITE, nr, ctypes.sizeof(st))
def IOWR(nr: int, st: type[ctypes.Structure]) -> int: return ioc(_IOC_READ | _IOC_WRITE, nr, ctypes.sizeof(st))


class _Struct(ctypes.Structure):
  def __repr__(self) -> str:
    return f"{type(self).__name__}(" + ", ".join(f"{n}={getattr(self, n)!r}" for n, *_ in self._fields_) + ")"


# ---------------------------------------------------------------- version, VM, apertures

KFD_IOCTL_MAJOR_VERSION, KFD_IOCTL_MINOR_VERSION = 1, 18


class GetVersionArgs(_Struct):
  _fields_ = [("major_version", u32), ("minor_version", u32)]


class AcquireVmArgs(_Struct):
  _fields_ = [("drm_fd", u32), ("gpu_id", u32)]


class ProcessDeviceApertures(_Struct):
  _fields_ = [("lds_base", u64), ("lds_limit", u64), ("scratch_base", u64), ("scratch_limit", u64),
              ("gpuvm_base", u64), ("gpuvm_limit", u64), ("gpu_id", u32), ("pad", u32)]


class GetProcessAperturesNewArgs(_Struct):
  _fields_ = [("kfd_process_device_apertures_ptr", u64), ("num_of_nodes", u32), ("pad", u32)]


# Runtime enable (ABI 1.14+): tells KFD a runtime owns the process's queues, so a debugger attaching later gets
# its exceptions. KFD does not require it for CREATE_QUEUE; when made, it must come before the first queue
# (EEXIST after). ROCR makes it; we make it too (mode 0: no debugging) where the driver has it.
KFD_RUNTIME_ENABLE_MODE_ENABLE_MASK, KFD_RUNTIME_ENABLE_MODE_TTMP_SAVE_MASK = 1, 2


class RuntimeEnableArgs(_Struct):
  _fields_ = [("r_debug", u64), ("mode_mask", u32), ("capabilities_mask", u32)]


# ---------------------------------------------------------------- memory

KFD_IOC_ALLOC_MEM_FLAGS_VRAM = 1 << 0
KFD_IOC_ALLOC_MEM_FLAGS_GTT = 1 << 1
KFD_IOC_ALLOC_MEM_FLAGS_USERPTR = 1 << 2
KFD_IOC_ALLOC_MEM_FLAGS_DOORBELL = 1 << 3
KFD_IOC_ALLOC_MEM_FLAGS_MMIO_REMAP = 1 << 4
KFD_IOC_ALLOC_MEM_FLAGS_WRITABLE = 1 << 31
KFD_IOC_ALLOC_MEM_FLAGS_EXECUTABLE = 1 << 30
KFD_IOC_ALLOC_MEM_FLAGS_PUBLIC = 1 << 29         # CPU-visible (host-visible VRAM needs the large BAR)
KFD_IOC_ALLOC_MEM_FLAGS_NO_SUBSTITUTE = 1 << 28
KFD_IOC_ALLOC_MEM_FLAGS_AQL_QUEUE_MEM = 1 << 27  # an AQL ring: KFD maps it twice so the CP can read past its end
KFD_IOC_ALLOC_MEM_FLAGS_COHERENT = 1 << 26
KFD_IOC_ALLOC_MEM_FLAGS_UNCACHED = 1 << 25
KFD_IOC_ALLOC_MEM_FLAGS_EXT_COHERENT = 1 << 24
KFD_IOC_ALLOC_MEM_FLAGS_CONTIGUOUS = 1 << 23


class AllocMemoryOfGpuArgs(_Struct):
  """va_addr: where the memory goes in the GPU's (and, with SVM, the CPU's) address space; mmap_offset: for a
  userptr the CPU address (to KFD), otherwise the offset to mmap the render node at (from KFD)."""
  _fields_ = [("va_addr", u64), ("size", u64), ("handle", u64), ("mmap_offset", u64), ("gpu_id", u32), ("flags", u32)]


class FreeMemoryOfGpuArgs(_Struct):
  _fields_ = [("handle", u64)]


class MapMemoryToGpuArgs(_Struct):
  """device_ids_array_ptr: a __u32 array of gpu_ids; n_success counts the devices mapped (0 on the first call)."""
  _fields_ = [("handle", u64), ("device_ids_array_ptr", u64), ("n_devices", u32), ("n_success", u32)]


class UnmapMemoryFromGpuArgs(MapMemoryToGpuArgs):
  pass


# ---------------------------------------------------------------- queues

KFD_IOC_QUEUE_TYPE_COMPUTE = 0
KFD_IOC_QUEUE_TYPE_SDMA = 1
KFD_IOC_QUEUE_TYPE_COMPUTE_AQL = 2
KFD_IOC_QUEUE_TYPE_SDMA_XGMI = 3
KFD_IOC_QUEUE_TYPE_SDMA_BY_ENG_ID = 4
KFD_MAX_QUEUE_PERCENTAGE = 100
KFD_MAX_QUEUE_PRIORITY = 15
KFD_MIN_QUEUE_RING_SIZE = 1024


class CreateQueueArgs(_Struct):
  """write/read_pointer_address are the CPU=GPU addresses of the queue's 64-bit write and read pointers (to KFD,
  whatever older headers' comments say); doorbell_offset is the /dev/kfd mmap offset of the queue's doorbell.
  sdma_engine_id and pad came with ABI 1.17: an older kernel copies only the first 88 bytes (the ioctl's size
  is encoded in its request number, and KFD copies min(user size, kernel size))."""
  _fields_ = [("ring_base_address", u64), ("write_pointer_address", u64), ("read_pointer_address", u64), ("doorbell_offset", u64),
              ("ring_size", u32), ("gpu_id", u32), ("queue_type", u32), ("queue_percentage", u32), ("queue_priority", u32), ("queue_id", u32),
              ("eop_buffer_address", u64), ("eop_buffer_size", u64), ("ctx_save_restore_address", u64),
              ("ctx_save_restore_size", u32), ("ctl_stack_size", u32), ("sdma_engine_id", u32), ("pad", u32)]


class DestroyQueueArgs(_Struct):
  _fields_ = [("queue_id", u32), ("pad", u32)]


# ---------------------------------------------------------------- events

KFD_IOC_EVENT_SIGNAL = 0
KFD_IOC_EVENT_NODECHANGE = 1
KFD_IOC_EVENT_DEVICESTATECHANGE = 2
KFD_IOC_EVENT_HW_EXCEPTION = 3
KFD_IOC_EVENT_SYSTEM_EVENT = 4
KFD_IOC_EVENT_DEBUG_EVENT = 5
KFD_IOC_EVENT_PROFILE_EVENT = 6
KFD_IOC_EVENT_QUEUE_EVENT = 7
KFD_IOC_EVENT_MEMORY = 8
KFD_IOC_WAIT_RESULT_COMPLETE, KFD_IOC_WAIT_RESULT_TIMEOUT, KFD_IOC_WAIT_RESULT_FAIL = 0, 1, 2
KFD_SIGNAL_EVENT_LIMIT = 4096
KFD_HW_EXCEPTION_WHOLE_GPU_RESET, KFD_HW_EXCEPTION_PER_ENGINE_RESET = 0, 1  # hw_exception_data.reset_type
KFD_HW_EXCEPTION_GPU_HANG, KFD_HW_EXCEPTION_ECC = 0, 1                      # hw_exception_data.reset_cause
KFD_MEM_ERR_NO_RAS, KFD_MEM_ERR_SRAM_ECC, KFD_MEM_ERR_POISON_CONSUMED, KFD_MEM_ERR_GPU_HANG = 0, 1, 2, 3  # memory_exception_data.ErrorType


class CreateEventArgs(_Struct):
  """event_page_offset: to KFD on the first signal event, the handle of the caller's event-page allocation (dGPUs);
  event_slot_index: the event's 8-byte slot in that page (the mailbox a signal's event_mailbox_ptr points at)."""
  _fields_ = [("event_page_offset", u64), ("event_trigger_data", u32), ("event_type", u32), ("auto_reset", u32),
              ("node_id", u32), ("event_id", u32), ("event_slot_index", u32)]


class DestroyEventArgs(_Struct):
  _fields_ = [("event_id", u32), ("pad", u32)]


class SetEventArgs(DestroyEventArgs):
  pass


class ResetEventArgs(DestroyEventArgs):
  pass


class MemoryExceptionFailure(_Struct):
  _fields_ = [("NotPresent", u32), ("ReadOnly", u32), ("NoExecute", u32), ("imprecise", u32)]


class MemoryExceptionData(_Struct):
  _fields_ = [("failure", MemoryExceptionFailure), ("va", u64), ("gpu_id", u32), ("ErrorType", u32)]


class HwExceptionData(_Struct):
  _fields_ = [("reset_type", u32), ("reset_cause", u32), ("memory_lost", u32), ("gpu_id", u32)]


class SignalEventData(_Struct):
  _fields_ = [("last_event_age", u64)]


class EventDataUnion(ctypes.Union):
  _fields_ = [("memory_exception_data", MemoryExceptionData), ("hw_exception_data", HwExceptionData), ("signal_event_data", SignalEventData)]


class EventData(_Struct):
  """One entry of WAIT_EVENTS' array: event_id to KFD, the exception data from KFD for memory/HW events."""
  _anonymous_ = ("u",)
  _fields_ = [("u", EventDataUnion), ("kfd_event_data_ext", u64), ("event_id", u32), ("pad", u32)]


class WaitEventsArgs(_Struct):
  """timeout in milliseconds (0: poll); wait_result one of KFD_IOC_WAIT_RESULT_*."""
  _fields_ = [("events_ptr", u64), ("num_events", u32), ("wait_for_all", u32), ("timeout", u32), ("wait_result", u32)]


# ---------------------------------------------------------------- the requests

AMDKFD_IOC_GET_VERSION = IOR(0x01, GetVersionArgs)
AMDKFD_IOC_CREATE_QUEUE = IOWR(0x02, CreateQueueArgs)
AMDKFD_IOC_DESTROY_QUEUE = IOWR(0x03, DestroyQueueArgs)
AMDKFD_IOC_CREATE_EVENT = IOWR(0x08, CreateEventArgs)
AMDKFD_IOC_DESTROY_EVENT = IOW(0x09, DestroyEventArgs)
AMDKFD_IOC_SET_EVENT = IOW(0x0A, SetEventArgs)
AMDKFD_IOC_RESET_EVENT = IOW(0x0B, ResetEventArgs)
AMDKFD_IOC_WAIT_EVENTS = IOWR(0x0C, WaitEventsArgs)
AMDKFD_IOC_GET_PROCESS_APERTURES_NEW = IOWR(0x14, GetProcessAperturesNewArgs)
AMDKFD_IOC_ACQUIRE_VM = IOW(0x15, AcquireVmArgs)
AMDKFD_IOC_ALLOC_MEMORY_OF_GPU = IOWR(0x16, AllocMemoryOfGpuArgs)
AMDKFD_IOC_FREE_MEMORY_OF_GPU = IOW(0x17, FreeMemoryOfGpuArgs)
AMDKFD_IOC_MAP_MEMORY_TO_GPU = IOWR(0x18, MapMemoryToGpuArgs)
AMDKFD_IOC_UNMAP_MEMORY_FROM_GPU = IOWR(0x19, UnmapMemoryFromGpuArgs)
AMDKFD_IOC_RUNTIME_ENABLE = IOWR(0x25, RuntimeEnableArgs)

# request number -> (name, argument struct): how the fake (and error messages) tell the ioctls apart
REQUESTS: dict[int, tuple[str, type[ctypes.Structure]]] = {
  AMDKFD_IOC_GET_VERSION: ("GET_VERSION", GetVersionArgs), AMDKFD_IOC_CREATE_QUEUE: ("CREATE_QUEUE", CreateQueueArgs),
  AMDKFD_IOC_DESTROY_QUEUE: ("DESTROY_QUEUE", DestroyQueueArgs), AMDKFD_IOC_CREATE_EVENT: ("CREATE_EVENT", CreateEventArgs),
  AMDKFD_IOC_DESTROY_EVENT: ("DESTROY_EVENT", DestroyEventArgs), AMDKFD_IOC_SET_EVENT: ("SET_EVENT", SetEventArgs),
  AMDKFD_IOC_RESET_EVENT: ("RESET_EVENT", ResetEventArgs), AMDKFD_IOC_WAIT_EVENTS: ("WAIT_EVENTS", WaitEventsArgs),
  AMDKFD_IOC_GET_PROCESS_APERTURES_NEW: ("GET_PROCESS_APERTURES_NEW", GetProcessAperturesNewArgs),
  AMDKFD_IOC_ACQUIRE_VM: ("ACQUIRE_VM", AcquireVmArgs), AMDKFD_IOC_ALLOC_MEMORY_OF_GPU: ("ALLOC_MEMORY_OF_GPU", AllocMemoryOfGpuArgs),
  AMDKFD_IOC_FREE_MEMORY_OF_GPU: ("FREE_MEMORY_OF_GPU", FreeMemoryOfGpuArgs), AMDKFD_IOC_MAP_MEMORY_TO_GPU: ("MAP_MEMORY_TO_GPU", MapMemoryToGpuArgs),
  AMDKFD_IOC_UNMAP_MEMORY_FROM_GPU: ("UNMAP_MEMORY_FROM_GPU", UnmapMemoryFromGpuArgs),
  AMDKFD_IOC_RUNTIME_ENABLE: ("RUNTIME_ENABLE", RuntimeEnableArgs),
}

# ---------------------------------------------------------------- mmap offsets (kfd_priv.h: not uapi, but the values user space sees)
# KFD encodes what an mmap of /dev/kfd maps in the offset's top two bits; CREATE_QUEUE's doorbell_offset already
# carries them (and the gpu_id), so user space only needs the page rounding. Kept for the fake and for messages.
KFD_MMAP_TYPE_SHIFT = 62
KFD_MMAP_TYPE_DOORBELL = 3 << KFD_MMAP_TYPE_SHIFT
KFD_MMAP_TYPE_EVENTS = 2 << KFD_MMAP_TYPE_SHIFT
KFD_MMAP_GPU_ID_SHIFT = 46
DOORBELL_PAGE = 0x2000  # gfx9+: a process's doorbells are two 4 KiB pages, 8 bytes a queue

# ---------------------------------------------------------------- the render node: DRM_IOCTL_AMDGPU_INFO (include/uapi/drm/amdgpu_drm.h)
# Only for the GPU timestamp counter's frequency (drm_amdgpu_info_device.gpu_counter_freq, in KHz): the clock of the
# start_ts/end_ts the packet processor writes into a completion signal when the queue profiles.
AMDGPU_INFO_DEV_INFO = 0x16
DRM_COMMAND_BASE, DRM_AMDGPU_INFO = 0x40, 0x05


class DrmAmdgpuInfo(_Struct):
  """drm_amdgpu_info: the kernel writes up to return_size bytes of the `query`'s answer at return_pointer."""
  _fields_ = [("return_pointer", u64), ("return_size", u32), ("query", u32), ("union", u32 * 4)]


class DrmAmdgpuInfoDeviceHead(_Struct):
  """The first 32 bytes of drm_amdgpu_info_device (the kernel copies min(return_size, its size))."""
  _fields_ = [("device_id", u32), ("chip_rev", u32), ("external_rev", u32), ("pci_rev", u32), ("family", u32),
              ("num_shader_engines", u32), ("num_shader_arrays_per_engine", u32), ("gpu_counter_freq", u32)]


DRM_IOCTL_AMDGPU_INFO = ioc(_IOC_WRITE, DRM_COMMAND_BASE + DRM_AMDGPU_INFO, ctypes.sizeof(DrmAmdgpuInfo), ord("d"))
REQUESTS[DRM_IOCTL_AMDGPU_INFO] = ("AMDGPU_INFO", DrmAmdgpuInfo)

# ---------------------------------------------------------------- SVM attributes (AMDKFD_IOC_SVM, ABI 1.5+): what KFD knows of an address range
# plugrt uses only GET_ATTR, to ask whether memory another runtime of this process allocated (HIP, through ROCr) is
# reachable by this GPU: Tensor.from_blob / DLPack import of ROCm memory (docs/backends/amd.md, "Wrapping ROCm memory").
KFD_IOCTL_SVM_OP_SET_ATTR, KFD_IOCTL_SVM_OP_GET_ATTR = 0, 1
KFD_IOCTL_SVM_ATTR_PREFERRED_LOC, KFD_IOCTL_SVM_ATTR_PREFETCH_LOC = 0, 1
KFD_IOCTL_SVM_ATTR_ACCESS, KFD_IOCTL_SVM_ATTR_ACCESS_IN_PLACE, KFD_IOCTL_SVM_ATTR_NO_ACCESS = 2, 3, 4
KFD_IOCTL_SVM_ATTR_SET_FLAGS, KFD_IOCTL_SVM_ATTR_CLR_FLAGS, KFD_IOCTL_SVM_ATTR_GRANULARITY = 5, 6, 7


class SvmAttribute(_Struct):
  _fields_ = [("type", u32), ("value", u32)]


class SvmArgs1(_Struct):
  """kfd_ioctl_svm_args with one attribute (the struct ends in a flexible array; the request number encodes the
  16-byte head only, and KFD reads nattr attributes after it)."""
  _fields_ = [("start_addr", u64), ("size", u64), ("op", u32), ("nattr", u32), ("attrs", SvmAttribute * 1)]


class _SvmArgsHead(_Struct):
  _fields_ = [("start_addr", u64), ("size", u64), ("op", u32), ("nattr", u32)]


AMDKFD_IOC_SVM = IOWR(0x20, _SvmArgsHead)
REQUESTS[AMDKFD_IOC_SVM] = ("SVM", SvmArgs1)
