"""A fake KFD for tests without an AMD GPU: the kernel below plugrt-amd-kfd's one seam (KFDOps), on
plugrt_testing.fakegpu.

It answers the real kfd.py structs: GET_VERSION, ACQUIRE_VM, GET_PROCESS_APERTURES_NEW, RUNTIME_ENABLE, memory
(ALLOC/MAP/UNMAP/FREE at the address the caller reserved, backed by FakeMemory: the CPU and the "GPU" share it),
queues (CREATE/DESTROY; the ring, pointers, EOP and CWSR buffers checked as KFD checks them), events (CREATE,
SET, RESET, DESTROY, WAIT_EVENTS with memory and hardware exception data). It serves /dev/kfd's doorbell pages
and the render node's mmaps, and reads a topology it makes up (`GFX1100`, `GFX942`).

Each queue is a thread (FakeDevice.serve) that reads what the backend wrote between the read pointer the fake
keeps and the write pointer, once the doorbell says so: AQL packets (decoded with plugrt_amd.aql: a dispatch is
checked against the kernel descriptor at kernel_object and run through the reference interpreter with the
arguments read from the kernarg segment; then its completion signal is decremented and its event mailbox
written) and SDMA packets (COPY_LINEAR by memmove, FENCE, TRAP). What the fake does with a bad dispatch:
- a memory access outside GPU-mapped memory: a memory exception event (the address, not-present), as KFD reports
  a GPU page fault; the queue stops;
- a dispatch that disagrees with its kernel descriptor (kernarg size, LDS, wave size, workgroup) or names no
  loaded program: a hardware exception event (per-engine reset after a hang), the closest thing KFD reports;
- a packet the packet processor does not execute: the queue stops at it with no event (a real CP reports an
  invalid AQL packet only through the queue's amd_queue_t error signal, which plugrt does not set up).
`error` says in words what happened (tests read it)."""
from __future__ import annotations

import ctypes
import errno
import mmap
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from plugrt.compiler.ir import Kernel, Signature
from plugrt_amd import aql, sdma
from plugrt_amd_kfd import kfd
from plugrt_amd_kfd.kfdev import PAGE, PROT_NONE, TOPOLOGY, KFDOps
from plugrt_testing.fakegpu import FakeDevice, FakeMemory

KFD_FD, DRM_FD = 1000, 1001
FOREIGN_DRM_FD = 1002     # the render node another runtime of the process (ROCr under HIP) opened and acquired the VM with
TIMESTAMP_KHZ = 100_000   # the GPU timestamp counter: 100 MHz, as amdgpu reports for gfx9..gfx12 dGPUs
GPU_ID = 0x1234

# topology properties as KFD prints them (the fields plugrt reads; values of a Radeon RX 7900 XTX and an MI300X XCD set)
GFX1100 = {"simd_count": 192, "simd_per_cu": 2, "array_count": 12, "simd_arrays_per_engine": 2, "max_waves_per_simd": 16,
           "lds_size_in_kb": 64, "wave_front_size": 32, "gfx_target_version": 110000, "drm_render_minor": 128, "num_sdma_engines": 2,
           "num_xcc": 1, "local_mem_size": 1 << 34, "max_slots_scratch_cu": 32}
GFX942 = {"simd_count": 1216, "simd_per_cu": 4, "array_count": 32, "simd_arrays_per_engine": 1, "max_waves_per_simd": 8,
          "lds_size_in_kb": 64, "wave_front_size": 64, "gfx_target_version": 90402, "drm_render_minor": 128, "num_sdma_engines": 2,
          "num_xcc": 8, "local_mem_size": 1 << 36, "max_slots_scratch_cu": 32}


def expected_cwsr(props: dict[str, int]) -> tuple[int, int, int]:
  """(ctx_save_restore_size, ctl_stack_size, debug_memory_size) as KFD's kfd_queue.c computes them: what CREATE_QUEUE
  of a compute queue must pass (written out here apart from plugrt's own cwsr_sizes, which the tests compare)."""
  v = props["gfx_target_version"]
  cu = props["simd_count"] // props["simd_per_cu"] // props.get("num_xcc", 1)
  wave = cu * 32 if v >= 100100 else min(cu * 40, props["array_count"] // props["simd_arrays_per_engine"] * 512)
  vgpr = 0x80000 if v in (90402, 90010, 90008, 90500) else 0x60000 if v in (110000, 110001, 120000, 120001) else 0x40000
  wg = -(-cu * (vgpr + 0x4000 + 0x10000 + 0x1000) // PAGE) * PAGE
  ctl = -(-(40 + wave * (12 if v >= 100100 else 8) + 8) // PAGE) * PAGE
  return ctl + wg, ctl, -(-wave * 32 // 64) * 64


def vector_accesses(kernel: Kernel) -> int:
  """How many vector loads and stores a kernel has. Two IR kernels can build one code object: a VLOAD of 4 floats and
  the 4 scalar loads a Tensor kernel makes of an unaligned view both become one global_load_dwordx4 (gfx9+ loads it at
  any alignment), and a fake, which tells programs apart by their image, must then run the IR that asks least of the
  memory, the one with the fewest vector accesses: it gives the other's result wherever that is defined, and is also
  defined at an unaligned address."""
  from plugrt.compiler.ir import Ops
  return sum(u.op is Ops.VLOAD or u.op is Ops.VSTORE for u in kernel.uops)


@dataclass
class BO:
  va: int
  size: int
  kind: str
  handle: int
  mmap_offset: int
  gpu_mapped: bool = False


@dataclass
class Queue:
  qid: int
  kind: str  # "aql" or "sdma"
  ring: int
  ring_size: int
  rptr_addr: int
  wptr_addr: int
  doorbell: int  # CPU address of its doorbell slot
  rptr: int = 0
  stopped: bool = False
  stalled: str = ""


@dataclass
class Event:
  event_id: int
  type: int
  auto_reset: bool
  slot: int = 0
  fired: bool = False


def natural_kernarg_layout(sig: Signature) -> tuple[list[int], int]:
  """Argument offsets (buffers as 8-byte pointers, then scalars, each at its natural alignment) and the size,
  16-byte rounded: what a code object's .args metadata lists for plugrt's kernels when they use no hidden args."""
  offs, at = [], 0
  for n in [8] * len(sig.buffers) + [dt.itemsize for dt in sig.scalars]:
    at = -(-at // n) * n
    offs.append(at)
    at += n
  return offs, -(-at // 16) * 16


class FakeKFD(FakeDevice, KFDOps):
  name = "FAKE-KFD"

  def __init__(self, props: dict[str, int] | None = None, version: tuple[int, int] = (1, 18), vram: int = 1 << 30):
    self._want: int | None = None
    self._map_lock = threading.Lock()
    super().__init__(FakeMemory(place=lambda size: self._want))
    self.props = dict(GFX1100 if props is None else props)
    self.version, self.vram_left = version, vram
    self.aperture = (0x1000000, (1 << 47) - 1)  # SVM: the whole user address space below 128 TiB
    self.bos: dict[int, BO] = {}                # va -> allocation
    self.handles: dict[int, BO] = {}
    self.reserved: dict[int, int] = {}          # PROT_NONE reservations: va -> size
    self.host: dict[int, int] = {}              # anonymous host memory handed out by mmap: va -> size
    self.doorbell_pages: dict[int, int] = {}    # mmap offset -> address
    self.queues: dict[int, Queue] = {}
    self.events: dict[int, Event] = {}
    self.event_page = 0
    self.mem_fault_data: kfd.MemoryExceptionData | None = None
    self.hw_fault_data: kfd.HwExceptionData | None = None
    self.kernargs: dict[int, tuple[list[int], int]] = {}  # kernel_object -> (argument offsets, kernarg size)
    self.registered: dict[bytes, list] = {}     # kernel descriptor bytes -> [(CodeObject, KernelInfo, Kernel)] (register)
    self.seen: set[tuple[bytes, int]] = set()  # (code object, id of its IR kernel) registered
    self.infos: dict = {}                       # kernel_object -> the KernelInfo of a registered program (hidden-argument checks)
    self.dispatches: list[aql.KernelDispatchPacket] = []
    self.copies: list[tuple[int, int, int]] = []
    self.log: list[str] = []  # the ioctls in order
    self.vm_acquired = self.runtime_enabled = False
    self.vm_file: int | None = None
    self.xnack = False                          # HSA_XNACK=1: the GPU retries page faults, so any host memory is reachable
    self.timestamp_khz = TIMESTAMP_KHZ
    self.profiled: list[tuple[int, int]] = []   # (start_ts, end_ts) written into completion signals
    self.lock = threading.Lock()
    self._ids = iter(range(1, 1 << 30))
    self._libc = ctypes.CDLL(None, use_errno=True)
    self._libc.mmap.restype = ctypes.c_void_p
    self._libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    self._libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]

  # ------------------------------------------------------------ programs
  def load(self, kernel_object: int, kernel: Kernel, arg_offsets: list[int] | None = None, kernarg_size: int | None = None) -> None:
    """Run dispatches of the kernel descriptor at `kernel_object` as `kernel` (its IR), its arguments at
    `arg_offsets` of the kernarg segment (buffers, then scalars), which the code object says is `kernarg_size`
    bytes (default: natural_kernarg_layout)."""
    offs, size = natural_kernarg_layout(kernel.signature)
    self.runner.load(kernel_object, kernel)
    self.kernargs[kernel_object] = (arg_offsets if arg_offsets is not None else offs, kernarg_size if kernarg_size is not None else size)

  def register(self, code_object: bytes, kernel: Kernel) -> None:
    """Make `kernel` (its IR) the program of `code_object` wherever it gets loaded: the compiler side of the tests
    calls this for every code object it builds, and the first dispatch whose kernel descriptor lies in memory holding
    that code object's image (relocated to where it lies) loads it, with the kernarg layout of its metadata."""
    from plugrt_amd import codeobject
    if (code_object, id(kernel)) in self.seen: return
    self.seen.add((code_object, id(kernel)))
    co = codeobject.parse(code_object)
    info = co.kernels[kernel.name]
    self.registered.setdefault(info.descriptor.raw, []).append((co, info, kernel))

  def _resolve(self, ko: int) -> None:
    """Load the registered program whose image lies around kernel_object `ko` (nothing when none does)."""
    kd = ctypes.string_at(ko, aql.KERNEL_DESCRIPTOR_SIZE)
    for co, info, kernel in sorted(self.registered.get(kd, ()), key=lambda e: vector_accesses(e[2])):  # (the first match is loaded)
      base = ko - info.kd_offset
      if self.gpu_bo(base, co.image_size) is not None and ctypes.string_at(base, co.image_size) == co.image(base):
        explicit = info.explicit_args
        offsets = [a.offset for a in explicit if a.kind == "global_buffer"] + [a.offset for a in explicit if a.kind != "global_buffer"]
        self.load(ko, kernel, offsets, info.kernarg_size)
        self.infos[ko] = info
        return

  # ------------------------------------------------------------ the seam: files
  def _files(self) -> dict[str, str]:
    props = "\n".join(f"{k} {v}" for k, v in self.props.items())
    return {f"{TOPOLOGY}/0/gpu_id": "0\n", f"{TOPOLOGY}/0/properties": "cpu_cores_count 16\nsimd_count 0\n",
            f"{TOPOLOGY}/1/gpu_id": f"{GPU_ID}\n", f"{TOPOLOGY}/1/properties": props + "\n"}

  def exists(self, path: str) -> bool:
    return path in ("/dev/kfd", f"/dev/dri/renderD{self.props['drm_render_minor']}") or path in self._files()

  def listdir(self, path: str) -> list[str]:
    if path == TOPOLOGY: return ["0", "1"]
    if path == "/proc/self/fd": return [str(fd) for fd in (0, 1, 2, KFD_FD, DRM_FD) + ((FOREIGN_DRM_FD,) if self.vm_file == FOREIGN_DRM_FD else ())]
    raise FileNotFoundError(path)

  def read_text(self, path: str) -> str:
    try: return self._files()[path]
    except KeyError: raise FileNotFoundError(path) from None

  def readlink(self, path: str) -> str:
    fd = int(path.rsplit("/", 1)[1])
    if fd in (DRM_FD, FOREIGN_DRM_FD): return f"/dev/dri/renderD{self.props['drm_render_minor']}"
    return {KFD_FD: "/dev/kfd"}.get(fd, "/dev/pts/0")

  def open(self, path: str, flags: int = 0) -> int:
    if path == "/dev/kfd": return KFD_FD
    if path == f"/dev/dri/renderD{self.props['drm_render_minor']}": return DRM_FD
    raise FileNotFoundError(errno.ENOENT, "no such device", path)

  def close(self, fd: int) -> None:  # type: ignore[override]  # KFDOps.close(fd) and FakeDevice.close() share a name
    if fd in (KFD_FD, DRM_FD, FOREIGN_DRM_FD): return
    raise OSError(errno.EBADF, f"fd {fd}")

  def shutdown(self) -> None: FakeDevice.close(self)

  # ------------------------------------------------------------ the seam: mmap
  def mmap(self, addr: int, length: int, prot: int, flags: int, fd: int = -1, offset: int = 0) -> int:
    if fd == -1 and prot == PROT_NONE:  # an address reservation: real, so nothing else lands there
      va = self._libc.mmap(addr or None, length, PROT_NONE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x4000, -1, 0)
      self.reserved[va] = length
      return va
    if fd == -1:  # host memory (a userptr's)
      m = self._map(0, length, "host")
      self.host[m] = length
      return m
    if fd in (DRM_FD, FOREIGN_DRM_FD):  # the CPU view of an allocation: at its address, at the offset ALLOC returned
      if fd != self.vm_file:
        raise OSError(errno.EACCES, f"render node mmap through fd {fd}: allocations belong to the file the VM was acquired with")
      bo = self.bos.get(addr)
      if bo is None or bo.mmap_offset != offset or length > bo.size or not flags & 0x10:
        raise OSError(errno.EINVAL, f"render node mmap at {addr:#x} offset {offset:#x}: no allocation there with that offset")
      return addr
    if fd == KFD_FD and offset >> kfd.KFD_MMAP_TYPE_SHIFT == 3:  # doorbells
      if offset & (kfd.DOORBELL_PAGE - 1) or length != kfd.DOORBELL_PAGE: raise OSError(errno.EINVAL, f"doorbell mmap {offset:#x}+{length:#x}")
      if offset not in self.doorbell_pages: self.doorbell_pages[offset] = self._map(0, length, "doorbell")
      return self.doorbell_pages[offset]
    raise OSError(errno.EINVAL, f"the fake KFD does not map fd {fd} offset {offset:#x}")

  def _map(self, va: int, size: int, kind: str, replace: bool = False) -> int:
    """Fake memory at va (0: where the kernel puts it; `replace`: over the caller's reservation there, in one call).
    Under a lock: the address reaches FakeMemory's placement through self._want, and two threads allocating at once
    would otherwise map at each other's address."""
    with self._map_lock:
      self._want = va or None
      return self.memory.map(size, kind, replace=replace).va

  def munmap(self, addr: int, length: int) -> None:
    if addr in self.reserved:
      self._libc.munmap(addr, self.reserved.pop(addr))
    elif addr in self.host:
      if any(b.kind == "userptr" and b.va == addr for b in self.bos.values()): raise OSError(errno.EBUSY, "host memory still registered")
      del self.host[addr]
      self.memory.unmap(addr)
    elif addr in self.doorbell_pages.values():
      off = next(k for k, v in self.doorbell_pages.items() if v == addr)
      del self.doorbell_pages[off]
      self.memory.unmap(addr)
    # else: the CPU view of an allocation FREE already released (the mapping went with it)

  # ------------------------------------------------------------ the seam: ioctl
  def ioctl(self, fd: int, request: int, arg: ctypes.Structure) -> None:
    if fd == DRM_FD and request == kfd.DRM_IOCTL_AMDGPU_INFO and isinstance(arg, kfd.DrmAmdgpuInfo):
      return self._amdgpu_info(arg)
    if fd != KFD_FD: raise OSError(errno.ENOTTY, f"ioctl {request:#x} on fd {fd}")
    name, st = kfd.REQUESTS.get(request, ("", None))
    if st is None or not isinstance(arg, st): raise OSError(errno.EINVAL, f"ioctl {request:#x} with {type(arg).__name__}")
    self.log.append(name)
    if name not in ("GET_VERSION", "ACQUIRE_VM", "GET_PROCESS_APERTURES_NEW") and not self.vm_acquired:
      raise OSError(errno.EINVAL, f"{name} before ACQUIRE_VM")
    getattr(self, "_" + name.lower())(arg)

  def _get_version(self, a: kfd.GetVersionArgs) -> None: a.major_version, a.minor_version = self.version

  def _amdgpu_info(self, a: kfd.DrmAmdgpuInfo) -> None:
    if a.query != kfd.AMDGPU_INFO_DEV_INFO: raise OSError(errno.EINVAL, f"AMDGPU_INFO query {a.query:#x}")
    head = kfd.DrmAmdgpuInfoDeviceHead(gpu_counter_freq=self.timestamp_khz)
    ctypes.memmove(a.return_pointer, ctypes.addressof(head), min(a.return_size, ctypes.sizeof(head)))

  def gpu_ticks(self) -> int:
    """The GPU timestamp counter (what the packet processor writes into start_ts/end_ts): the host's monotonic clock
    at the counter's frequency."""
    return time.perf_counter_ns() * self.timestamp_khz // 1_000_000

  def _svm(self, a: kfd.SvmArgs1) -> None:
    """GET_ATTR of one ACCESS attribute, as KFD answers it: a range overlapping memory ALLOC_MEMORY_OF_GPU mapped to a
    GPU of this process is EADDRINUSE (it is not SVM memory); a range the process has not mapped at all is EFAULT;
    other host memory is an unregistered SVM range, reachable by the GPU only with XNACK (retry faults) on."""
    if a.op != kfd.KFD_IOCTL_SVM_OP_GET_ATTR or a.nattr != 1: raise OSError(errno.EINVAL, "the fake answers GET_ATTR of one attribute")
    if a.start_addr % PAGE or a.size % PAGE or not a.size: raise OSError(errno.EINVAL, "SVM: range not page-aligned")
    at = a.attrs[0]
    if at.type not in (kfd.KFD_IOCTL_SVM_ATTR_ACCESS, kfd.KFD_IOCTL_SVM_ATTR_ACCESS_IN_PLACE, kfd.KFD_IOCTL_SVM_ATTR_NO_ACCESS) or at.value != GPU_ID:
      raise OSError(errno.EINVAL, "SVM: the fake answers ACCESS for this GPU")
    end = a.start_addr + a.size
    if any(b.gpu_mapped and b.va < end and a.start_addr < b.va + b.size for b in tuple(self.bos.values())):
      raise OSError(errno.EADDRINUSE, "SVM: the range is memory of ALLOC_MEMORY_OF_GPU")
    try: m = self.memory.find(a.start_addr)
    except KeyError: m = None
    if (m is None or m.va + m.size < end) and not self.host_mapped(a.start_addr, a.size): raise OSError(errno.EFAULT, "SVM: no VMA")
    at.type = kfd.KFD_IOCTL_SVM_ATTR_ACCESS if self.xnack else kfd.KFD_IOCTL_SVM_ATTR_NO_ACCESS

  def host_mapped(self, addr: int, size: int) -> bool:
    """Whether the process has [addr, addr+size) mapped (its VMAs, from /proc/self/maps)."""
    with open("/proc/self/maps") as f:
      for line in f:
        lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
        if lo <= addr and addr + size <= hi: return True
    return False

  def foreign_alloc(self, size: int) -> int:
    """Memory another runtime of this process allocated through KFD (what hipMalloc does through ROCr): a VRAM
    allocation mapped to this GPU, CPU-visible here so tests can fill it, that plugrt's KFDDevice did not make."""
    size = -(-size // PAGE) * PAGE
    va = self.mmap(0, size, PROT_NONE, 0)
    a = kfd.AllocMemoryOfGpuArgs(va_addr=va, size=size, gpu_id=GPU_ID, flags=kfd.KFD_IOC_ALLOC_MEM_FLAGS_VRAM)
    self._alloc_memory_of_gpu(a)
    self._bo(a.handle).gpu_mapped = True
    return va

  def _acquire_vm(self, a: kfd.AcquireVmArgs) -> None:
    if a.drm_fd not in (DRM_FD, FOREIGN_DRM_FD) or a.gpu_id != GPU_ID: raise OSError(errno.EINVAL, "ACQUIRE_VM: not this GPU's render node")
    if self.vm_file is not None and self.vm_file != a.drm_fd:  # KFD: one render-node file per GPU and process
      raise OSError(errno.EBUSY, "ACQUIRE_VM: the GPU's VM was acquired with another render node file")
    self.vm_file = a.drm_fd
    self.vm_acquired = True

  def foreign_runtime(self) -> None:
    """Another runtime of this process (ROCr) opened the render node and acquired the GPU's VM first, as importing
    torch's ROCm build and touching a GPU does."""
    self.vm_file = FOREIGN_DRM_FD
    self.vm_acquired = True

  def _runtime_enable(self, a: kfd.RuntimeEnableArgs) -> None:
    if self.version < (1, 14): raise OSError(errno.ENOTTY, "RUNTIME_ENABLE needs ABI 1.14")
    if self.queues: raise OSError(errno.EEXIST, "RUNTIME_ENABLE after queues exist")
    self.runtime_enabled = True

  def _get_process_apertures_new(self, a: kfd.GetProcessAperturesNewArgs) -> None:
    if a.num_of_nodes < 1: raise OSError(errno.EINVAL, "no room for the apertures")
    ap = kfd.ProcessDeviceApertures.from_address(a.kfd_process_device_apertures_ptr)
    ap.gpuvm_base, ap.gpuvm_limit, ap.gpu_id = *self.aperture, GPU_ID
    ap.lds_base, ap.lds_limit, ap.scratch_base, ap.scratch_limit = 0x1 << 48, (0x1 << 48) + 0xFFFFFFFF, 0x2 << 48, (0x2 << 48) + 0xFFFFFFFF
    a.num_of_nodes = 1

  def _alloc_memory_of_gpu(self, a: kfd.AllocMemoryOfGpuArgs) -> None:
    kinds = [k for k, f in (("vram", kfd.KFD_IOC_ALLOC_MEM_FLAGS_VRAM), ("gtt", kfd.KFD_IOC_ALLOC_MEM_FLAGS_GTT),
                            ("userptr", kfd.KFD_IOC_ALLOC_MEM_FLAGS_USERPTR)) if a.flags & f]
    if a.gpu_id != GPU_ID or len(kinds) != 1 or a.size % PAGE or a.va_addr % PAGE or not a.size:
      raise OSError(errno.EINVAL, f"ALLOC: gpu_id {a.gpu_id:#x}, flags {a.flags:#x}, va {a.va_addr:#x}, size {a.size:#x}")
    if not self.aperture[0] <= a.va_addr and a.va_addr + a.size <= self.aperture[1]: raise OSError(errno.EINVAL, "ALLOC outside the GPUVM aperture")
    kind = kinds[0]
    if kind == "userptr":
      if a.mmap_offset != a.va_addr or self.memory.find(a.va_addr).va + self.memory.find(a.va_addr).size < a.va_addr + a.size:
        raise OSError(errno.EFAULT, f"ALLOC userptr at {a.va_addr:#x}: not host memory of {a.size:#x} bytes")
    else:
      if kind == "vram":
        if a.size > self.vram_left: raise OSError(errno.ENOMEM, "out of VRAM")
        self.vram_left -= a.size
      if self.reserved.get(a.va_addr) != a.size:
        raise OSError(errno.EINVAL, f"ALLOC at {a.va_addr:#x}: the caller reserved no {a.size:#x} bytes there")
      self.reserved.pop(a.va_addr)  # the fake's memory takes the reserved range's place, atomically (no hole to race into)
      self._map(a.va_addr, a.size, kind, replace=True)
    handle = next(self._ids)
    bo = BO(a.va_addr, a.size, kind, handle, a.va_addr if kind == "userptr" else 1 << 40 | handle << 16)
    self.bos[bo.va], self.handles[handle] = bo, bo
    a.handle, a.mmap_offset = handle, bo.mmap_offset

  def _gpu_ids(self, ptr: int, n: int) -> None:
    if n != 1 or (ctypes.c_uint32 * 1).from_address(ptr)[0] != GPU_ID: raise OSError(errno.EINVAL, "MAP/UNMAP: not this GPU")

  def _map_memory_to_gpu(self, a: kfd.MapMemoryToGpuArgs) -> None:
    self._gpu_ids(a.device_ids_array_ptr, a.n_devices)
    self._bo(a.handle).gpu_mapped = True
    a.n_success = a.n_devices

  def _unmap_memory_from_gpu(self, a: kfd.UnmapMemoryFromGpuArgs) -> None:
    self._gpu_ids(a.device_ids_array_ptr, a.n_devices)
    self._bo(a.handle).gpu_mapped = False
    a.n_success = a.n_devices

  def _free_memory_of_gpu(self, a: kfd.FreeMemoryOfGpuArgs) -> None:
    bo = self._bo(a.handle)
    if bo.gpu_mapped: raise OSError(errno.EBUSY, f"FREE of memory at {bo.va:#x} still mapped to the GPU")
    del self.handles[a.handle], self.bos[bo.va]
    for ko in [k for k in self.kernargs if bo.va <= k < bo.va + bo.size]:  # a program's memory: a later one may load at its address
      self.kernargs.pop(ko)
      self.infos.pop(ko, None)
      self.runner.programs.pop(ko, None)
    if bo.kind == "vram": self.vram_left += bo.size
    if bo.kind != "userptr": self.memory.unmap(bo.va)

  def _bo(self, handle: int) -> BO:
    if handle not in self.handles: raise OSError(errno.EINVAL, f"no allocation with handle {handle}")
    return self.handles[handle]

  def gpu_bo(self, addr: int, n: int = 1) -> BO | None:
    """The GPU-mapped allocation holding [addr, addr+n), None where the GPU would fault."""
    for bo in tuple(self.bos.values()):  # a snapshot: the queue threads ask while the backend's thread allocates and frees
      if bo.va <= addr and addr + n <= bo.va + bo.size: return bo if bo.gpu_mapped else None
    return None

  # ------------------------------------------------------------ queues
  def _create_queue(self, a: kfd.CreateQueueArgs) -> None:
    if a.gpu_id != GPU_ID: raise OSError(errno.EINVAL, "CREATE_QUEUE: not this GPU")
    ring = self.gpu_bo(a.ring_base_address, a.ring_size)
    if a.ring_size & (a.ring_size - 1) or a.ring_size < kfd.KFD_MIN_QUEUE_RING_SIZE or ring is None or ring.size != a.ring_size:
      raise OSError(errno.EINVAL, f"CREATE_QUEUE: the ring at {a.ring_base_address:#x} is not a mapped power-of-two allocation "
                                  f"of {a.ring_size:#x} bytes")
    for p in (a.read_pointer_address, a.write_pointer_address):
      if p % 8 or self.gpu_bo(p, 8) is None: raise OSError(errno.EINVAL, f"CREATE_QUEUE: pointer {p:#x} not in mapped memory")
    if a.queue_type == kfd.KFD_IOC_QUEUE_TYPE_COMPUTE_AQL:
      cwsr, ctl, dbg = expected_cwsr(self.props)
      xcc = self.props.get("num_xcc", 1)
      if (a.ctx_save_restore_size, a.ctl_stack_size, a.eop_buffer_size) != (cwsr, ctl, 4096):
        raise OSError(errno.EINVAL, f"CREATE_QUEUE: ctx_save_restore_size {a.ctx_save_restore_size:#x} ctl_stack_size {a.ctl_stack_size:#x} "
                                    f"eop {a.eop_buffer_size:#x}; KFD wants {cwsr:#x} {ctl:#x} 0x1000")
      if self.gpu_bo(a.ctx_save_restore_address, (cwsr + dbg) * xcc) is None or self.gpu_bo(a.eop_buffer_address, 4096) is None:
        raise OSError(errno.EINVAL, "CREATE_QUEUE: the CWSR or EOP buffer is not mapped memory of its size")
      kind = "aql"
    elif a.queue_type == kfd.KFD_IOC_QUEUE_TYPE_SDMA: kind = "sdma"
    else: raise OSError(errno.EINVAL, f"CREATE_QUEUE: the fake runs AQL and SDMA queues, not type {a.queue_type}")
    qid = next(self._ids)
    a.queue_id = qid
    a.doorbell_offset = kfd.KFD_MMAP_TYPE_DOORBELL | GPU_ID << kfd.KFD_MMAP_GPU_ID_SHIFT | qid * 8
    page = kfd.KFD_MMAP_TYPE_DOORBELL | GPU_ID << kfd.KFD_MMAP_GPU_ID_SHIFT
    if page not in self.doorbell_pages: self.doorbell_pages[page] = self._map(0, kfd.DOORBELL_PAGE, "doorbell")
    q = Queue(qid, kind, a.ring_base_address, a.ring_size, a.read_pointer_address, a.write_pointer_address, self.doorbell_pages[page] + qid * 8)
    ctypes.c_uint64.from_address(q.doorbell).value = (1 << 64) - 1  # not rung yet
    ctypes.c_uint64.from_address(q.rptr_addr).value = 0
    self.queues[qid] = q
    self.serve(f"{kind}{qid}", self._aql_step(q) if kind == "aql" else self._sdma_step(q))

  def _destroy_queue(self, a: kfd.DestroyQueueArgs) -> None:
    if a.queue_id not in self.queues: raise OSError(errno.EINVAL, f"no queue {a.queue_id}")
    self.queues.pop(a.queue_id).stopped = True

  # ------------------------------------------------------------ events
  def _create_event(self, a: kfd.CreateEventArgs) -> None:
    ev = Event(next(self._ids), a.event_type, bool(a.auto_reset))
    if a.event_type == kfd.KFD_IOC_EVENT_SIGNAL:
      if not self.event_page:
        bo = self.handles.get(a.event_page_offset)
        if bo is None or bo.kind != "gtt": raise OSError(errno.EINVAL, "the first signal event needs the event page's handle (a GTT allocation)")
        self.event_page = bo.va
      ev.slot = sum(1 for e in self.events.values() if e.type == kfd.KFD_IOC_EVENT_SIGNAL)
      a.event_slot_index, a.event_trigger_data = ev.slot, ev.event_id
    self.events[ev.event_id] = ev
    a.event_id = ev.event_id

  def _destroy_event(self, a: kfd.DestroyEventArgs) -> None:
    if self.events.pop(a.event_id, None) is None: raise OSError(errno.EINVAL, f"no event {a.event_id}")

  def _set_event(self, a: kfd.SetEventArgs) -> None: self._event(a.event_id).fired = True
  def _reset_event(self, a: kfd.ResetEventArgs) -> None: self._event(a.event_id).fired = False

  def _event(self, event_id: int) -> Event:
    if event_id not in self.events: raise OSError(errno.EINVAL, f"no event {event_id}")
    return self.events[event_id]

  def fire(self, event_id: int) -> None:
    """The interrupt of a signal event (an AQL completion signal's mailbox, an SDMA TRAP)."""
    with self.lock:
      if (ev := self.events.get(event_id)) is not None: ev.fired = True

  def _wait_events(self, a: kfd.WaitEventsArgs) -> None:
    data = (kfd.EventData * a.num_events).from_address(a.events_ptr)
    evs = [self._event(d.event_id) for d in data]
    deadline = time.monotonic() + a.timeout / 1000
    while True:
      with self.lock:
        hit = []
        for d, ev in zip(data, evs):
          if ev.type == kfd.KFD_IOC_EVENT_MEMORY and self.mem_fault_data is not None:
            d.memory_exception_data = self.mem_fault_data
            hit.append(ev)
          elif ev.type == kfd.KFD_IOC_EVENT_HW_EXCEPTION and self.hw_fault_data is not None:
            d.hw_exception_data = self.hw_fault_data
            hit.append(ev)
          elif ev.type == kfd.KFD_IOC_EVENT_SIGNAL and ev.fired:
            hit.append(ev)
            if ev.auto_reset: ev.fired = False
      if (len(hit) == len(evs)) if a.wait_for_all else hit:
        a.wait_result = kfd.KFD_IOC_WAIT_RESULT_COMPLETE
        return
      if time.monotonic() >= deadline:
        a.wait_result = kfd.KFD_IOC_WAIT_RESULT_TIMEOUT
        return
      time.sleep(0.0005)

  # ------------------------------------------------------------ faults
  def memory_fault(self, va: int, what: str, read_only: bool = False) -> Exception:
    with self.lock:
      f = kfd.MemoryExceptionData(gpu_id=GPU_ID, va=va)
      f.failure.NotPresent, f.failure.ReadOnly = int(not read_only), int(read_only)
      self.mem_fault_data = f
    return RuntimeError(f"GPU memory fault at {va:#x}: {what}")

  def hw_fault(self, what: str) -> Exception:
    with self.lock: self.hw_fault_data = kfd.HwExceptionData(kfd.KFD_HW_EXCEPTION_PER_ENGINE_RESET, kfd.KFD_HW_EXCEPTION_GPU_HANG, 0, GPU_ID)
    return RuntimeError(f"dispatch rejected: {what}")

  # ------------------------------------------------------------ the "GPU": AQL
  def _published(self, q: Queue, unit: int = 1) -> int:
    """How far the backend published: its write pointer, once the doorbell was rung for it."""
    bell = ctypes.c_uint64.from_address(q.doorbell).value
    if bell == (1 << 64) - 1: return q.rptr
    return min(ctypes.c_uint64.from_address(q.wptr_addr).value, bell + unit)

  def _aql_step(self, q: Queue) -> Callable[[], bool]:
    entries = q.ring_size // aql.PACKET_SIZE

    def step() -> bool:
      if q.stopped or q.stalled or q.rptr >= self._published(q): return False
      slot = q.ring + (q.rptr % entries) * aql.PACKET_SIZE
      raw = ctypes.string_at(slot, aql.PACKET_SIZE)
      if aql.packet_type(raw) == aql.PACKET_TYPE_INVALID: return False  # published but its header not yet written
      try: p = aql.decode_packet(raw)
      except aql.PacketError as e:  # the packet processor sits on a packet it cannot execute
        q.stalled = self.error = f"aql{q.qid}: packet {q.rptr}: {e}"
        return False
      start = self.gpu_ticks()
      if isinstance(p, aql.KernelDispatchPacket): self._dispatch(p, q)
      else:
        for dep in p.dep_signal:
          while dep and aql.AmdSignal.from_address(dep).value != 0 and not self.stop: time.sleep(0.0001)
      q.rptr += 1
      ctypes.c_uint64.from_address(q.rptr_addr).value = q.rptr
      if p.completion_signal: self._signal(p.completion_signal, q, start, max(self.gpu_ticks(), start + 1))
      return True
    return step

  def amd_queue(self, q: Queue) -> aql.AmdQueue | None:
    """The queue's amd_queue_t, found as the packet processor finds it: the read pointer is its read_dispatch_id, and
    read_dispatch_id_field_base_byte_offset says how far in that is (None when it does not say so)."""
    off = aql.AmdQueue.read_dispatch_id.offset
    base = q.rptr_addr - off
    if self.gpu_bo(base, aql.AMD_QUEUE_SIZE) is None: return None
    d = aql.AmdQueue.from_address(base)
    return d if d.read_dispatch_id_field_base_byte_offset == off else None

  def _signal(self, address: int, q: Queue | None = None, start: int = 0, end: int = 0) -> None:
    if self.gpu_bo(address, 64) is None: raise self.memory_fault(address, "completion signal in unmapped memory")
    s = aql.AmdSignal.from_address(address)
    if q is not None and (d := self.amd_queue(q)) is not None and d.queue_properties & aql.AMD_QUEUE_PROPERTIES_ENABLE_PROFILING:
      s.start_ts, s.end_ts = start, end  # before the value: a waiter that sees the decrement sees the timestamps
      self.profiled.append((start, end))
    with self.lock: s.value -= 1
    if s.event_mailbox_ptr:
      ctypes.c_uint64.from_address(s.event_mailbox_ptr).value = s.event_id
      self.fire(s.event_id)

  def _dispatch(self, p: aql.KernelDispatchPacket, q: Queue | None = None) -> None:
    """Check a dispatch against its kernel descriptor, as the packet processor and the SPI would, and run it."""
    self.dispatches.append(p)
    ko = p.kernel_object
    if ko % aql.KERNEL_DESCRIPTOR_ALIGN: raise self.hw_fault(f"kernel_object {ko:#x} is not 64-byte aligned")
    if self.gpu_bo(ko, aql.KERNEL_DESCRIPTOR_SIZE) is None: raise self.memory_fault(ko, "kernel descriptor not in GPU-mapped memory")
    kd = aql.KernelDescriptor.from_buffer_copy(ctypes.string_at(ko, aql.KERNEL_DESCRIPTOR_SIZE))
    if ko not in self.runner.programs: self._resolve(ko)
    if ko not in self.runner.programs: raise self.hw_fault(f"no program is loaded at kernel_object {ko:#x}")
    kernel = self.runner.programs[ko]
    offsets, kernarg_size = self.kernargs[ko]
    name = kernel.name
    if kd.kernarg_size != kernarg_size:
      raise self.hw_fault(f"{name}: the kernel descriptor's kernarg_size is {kd.kernarg_size}, its code reads {kernarg_size} bytes of arguments")
    if kernarg_size and not kd.kernel_code_properties & aql.KCP_ENABLE_SGPR_KERNARG_SEGMENT_PTR:
      raise self.hw_fault(f"{name}: the kernel takes arguments but its descriptor does not enable the kernarg segment pointer")
    if kernarg_size and (p.kernarg_address % 16 or self.gpu_bo(p.kernarg_address, kernarg_size) is None):
      raise self.memory_fault(p.kernarg_address, f"{name}: kernarg segment of {kernarg_size} bytes not in GPU-mapped memory (or not 16-byte aligned)")
    if p.group_segment_size < kd.group_segment_fixed_size or p.group_segment_size > self.props["lds_size_in_kb"] << 10:
      raise self.hw_fault(f"{name}: group_segment_size {p.group_segment_size}, the descriptor needs {kd.group_segment_fixed_size}, "
                          f"the GPU has {self.props['lds_size_in_kb']} KiB")
    if p.private_segment_size < kd.private_segment_fixed_size:
      raise self.hw_fault(f"{name}: private_segment_size {p.private_segment_size} < the descriptor's {kd.private_segment_fixed_size}")
    if kd.private_segment_fixed_size or kd.compute_pgm_rsrc2 & aql.RSRC2_ENABLE_PRIVATE_SEGMENT: self._check_scratch(name, p, q)
    if kd.granulated_lds_size: raise self.hw_fault(f"{name}: compute_pgm_rsrc2.GRANULATED_LDS_SIZE is set (the CP fills it)")
    if kd.wave32 and self.props["gfx_target_version"] < 100000: raise self.hw_fault(f"{name}: wave32 on a wave64-only GPU")
    block = (p.workgroup_size_x, p.workgroup_size_y, p.workgroup_size_z)
    grid_items = (p.grid_size_x, p.grid_size_y, p.grid_size_z)
    if block[0] * block[1] * block[2] > aql.MAX_WORKGROUP_SIZE or 0 in block or 0 in grid_items:
      raise self.hw_fault(f"{name}: workgroup {block}, grid {grid_items}")
    if any(g % b for g, b in zip(grid_items, block)):  # AQL allows a partial last workgroup; the reference interpreter runs whole ones
      raise self.hw_fault(f"{name}: grid {grid_items} is not a multiple of workgroup {block} (partial workgroups: not in the fake)")
    grid = tuple(g // b for g, b in zip(grid_items, block))
    sig = kernel.signature
    nb = len(sig.buffers)
    at = [p.kernarg_address + o for o in offsets]
    bufs = [ctypes.c_uint64.from_address(x).value for x in at[:nb]]
    for b, dt in zip(bufs, sig.buffers):
      if self.gpu_bo(b, dt.itemsize) is None: raise self.memory_fault(b, f"{name}: buffer argument not in GPU-mapped memory")
    scalars = self.runner.decode_scalars(sig, lambda i, n: ctypes.string_at(at[nb + i], n))
    if (info := self.infos.get(ko)) is not None:  # a code object's hidden arguments: what its code reads for the group size and count
      for axis in range(3):
        bc, gsz = info.hidden(f"block_count_{'xyz'[axis]}"), info.hidden(f"group_size_{'xyz'[axis]}")
        if bc is not None and ctypes.c_uint32.from_address(p.kernarg_address + bc.offset).value != grid[axis]:
          raise self.hw_fault(f"{name}: hidden_block_count_{'xyz'[axis]} is not the dispatch's {grid[axis]} groups")
        if gsz is not None and ctypes.c_uint16.from_address(p.kernarg_address + gsz.offset).value != block[axis]:
          raise self.hw_fault(f"{name}: hidden_group_size_{'xyz'[axis]} is not the dispatch's workgroup {block[axis]}")
    try: self.runner.run(kernel, bufs, scalars, grid, block)
    except IndexError as e: raise self.memory_fault(bufs[0] if bufs else 0, f"{name}: {e}") from e

  def _check_scratch(self, name: str, p: aql.KernelDispatchPacket, q: Queue | None) -> None:
    """A kernel with a private segment: the queue's amd_queue_t must describe scratch in GPU-mapped memory large
    enough for p.private_segment_size bytes a work-item, for as many waves as it says may hold scratch at once."""
    d = self.amd_queue(q) if q is not None else None
    if d is None: raise self.hw_fault(f"{name}: needs scratch, and the queue's read pointer is not an amd_queue_t's read_dispatch_id")
    need = p.private_segment_size
    loc, per_xcc = d.scratch_backing_memory_location, d.scratch_backing_memory_byte_size
    major = self.props["gfx_target_version"] // 10000
    waves, wave_bytes = aql.tmpring_fields(d.compute_tmpring_size, major)
    srd = list(d.scratch_resource_descriptor)
    xccs = self.props.get("num_xcc", 1)
    if not loc or self.gpu_bo(loc, per_xcc * xccs) is None:
      raise self.hw_fault(f"{name}: needs {need} bytes of scratch a work-item; the queue's amd_queue_t gives no scratch in GPU-mapped memory")
    if d.scratch_wave64_lane_byte_size < need or wave_bytes < need * aql.SCRATCH_LANES or not waves or waves * wave_bytes > per_xcc:
      raise self.hw_fault(f"{name}: needs {need} bytes of scratch a work-item; amd_queue_t gives {d.scratch_wave64_lane_byte_size} a lane, "
                          f"{waves} waves of {wave_bytes} bytes in {per_xcc}")
    if srd[0] != loc & 0xFFFFFFFF or srd[1] & 0xFFFF != loc >> 32 & 0xFFFF or srd[2] < per_xcc & 0xFFFFFFFF:
      raise self.hw_fault(f"{name}: the scratch resource descriptor {[hex(w) for w in srd]} does not describe the scratch at {loc:#x}")

  # ------------------------------------------------------------ the "GPU": SDMA
  def _sdma_step(self, q: Queue) -> Callable[[], bool]:
    def step() -> bool:
      if q.stopped or q.stalled: return False
      end = self._published(q, 0)
      if q.rptr >= end: return False
      while q.rptr < end:  # a piece that does not cross the ring's end (the backend pads with NOPs so no packet does)
        at = q.rptr % q.ring_size
        n = min(end - q.rptr, q.ring_size - at)
        words = struct.unpack_from(f"<{n // 4}I", ctypes.string_at(q.ring + at, n))
        try: packets = list(sdma.decode(words))
        except sdma.SDMAError as e:
          q.stalled = self.error = f"sdma{q.qid}: at byte {q.rptr:#x}: {e}"
          return False
        for pk in packets: self._sdma(pk)
        q.rptr += n
        ctypes.c_uint64.from_address(q.rptr_addr).value = q.rptr
      return True
    return step

  def _sdma(self, pk: sdma.Packet) -> None:
    f = pk.fields
    if pk.op == "COPY_LINEAR":
      for a in (f["src"], f["dst"]):
        if self.gpu_bo(a, f["count"]) is None: raise self.memory_fault(a, f"SDMA copy of {f['count']} bytes outside GPU-mapped memory")
      ctypes.memmove(f["dst"], f["src"], f["count"])
      self.copies.append((f["dst"], f["src"], f["count"]))
    elif pk.op == "FENCE":
      if self.gpu_bo(f["address"], 4) is None: raise self.memory_fault(f["address"], "SDMA fence outside GPU-mapped memory")
      ctypes.c_uint32.from_address(f["address"]).value = f["value"]
    elif pk.op == "TRAP": self.fire(f["int_context"])

