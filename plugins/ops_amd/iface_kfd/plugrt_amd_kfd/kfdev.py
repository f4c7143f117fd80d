"""The KFD interface: an AMD GPU driven from user space through /dev/kfd and its render node.

- `KFDOps`: everything that touches the kernel (open, ioctl, mmap, munmap, sysfs reads). Every ioctl goes through
  `KFDOps.ioctl(fd, request, struct)` with the real kfd.py structs, so the fake KFD (tests/fake_kfd.py) subclasses
  this one class and answers the same structs the driver would.
- `read_topology`: the GPU nodes of /sys/devices/virtual/kfd/kfd/topology (gpu_id, gfx arch, CUs, wave size, LDS,
  render node) and `cwsr_sizes`, the context save/restore sizes KFD requires for a compute queue.
- `KFDDevice`: one GPU: ACQUIRE_VM on its render node, memory (VRAM, GTT, userptr; GPU address == CPU address,
  as KFD's SVM aperture makes them), events (memory and hardware exceptions, a signal event for completions),
  and queues: `AQLQueue` (compute, AQL packets) and `SDMAQueue` (copies).
- Waits are bounded (plugrt.hwqueue.Timeline): the queues poll their completion counter, read the driver's
  exception events every 20 ms, and turn a fault into a typed error: `KFDMemoryFault` (the faulting address,
  not-present / read-only), `KFDHardwareFault` (GPU reset or hang), `KFDPacketError` (the queue stopped at a packet
  it does not execute), `KFDTimeout` (nothing reported, nothing finished).

Why polling and not interrupts: a launch's completion is one 64-bit read of the signal (the common wait ends in
the first spins), and the exception events are read without blocking. Each completion signal still carries a KFD
signal event's mailbox and id, so the packet processor raises the interrupt and `KFDDevice.sleep` can block in
WAIT_EVENTS for a long wait; docs/backends/amd.md ("The KFD queue layer") has the details.
"""
from __future__ import annotations

import ctypes
import errno
import mmap
import os
import time
from dataclasses import dataclass, field
from typing import Any, NoReturn

from plugrt.errors import DeviceUnavailable, LaunchError, OutOfMemoryError, Reason, UnsupportedError
from plugrt.hwqueue import CommandSlots, QueueError, Timeline, libc, round_up
from plugrt_amd import aql, sdma
from plugrt_amd_kfd import kfd

PAGE = 0x1000
TOPOLOGY = "/sys/devices/virtual/kfd/kfd/topology/nodes"
KFD_PATH = "/dev/kfd"
MIN_MINOR = 6  # KFD ABI 1.6+ (kernel 5.x): SVM-aperture allocations at the caller's address; 1.14 adds RUNTIME_ENABLE


# ---------------------------------------------------------------- errors

class KFDError(QueueError):
  """Work on an AMD GPU's KFD queue failed (every KFD error is one of these)."""


class KFDMemoryFault(KFDError):
  """The GPU touched memory it has no (writable) mapping for. va: the faulting address; not_present / read_only
  from the driver's memory exception data."""
  va: int | None = None
  not_present = read_only = False


class KFDHardwareFault(KFDError):
  """The driver reset the GPU (or one engine) after a hang or an ECC error."""


class KFDPacketError(KFDError):
  """A queue stopped at a packet it does not execute (a corrupted or unfinished packet)."""


class KFDTimeout(KFDError):
  """Nothing finished within the timeout and the driver reported no fault (a kernel that never ends)."""


class KFDNotVisible(UnsupportedError):
  """Memory plugrt was asked to wrap (Tensor.from_blob, DLPack import) that KFD does not show as reachable by this
  GPU: plugrt refuses it rather than copy it."""


class KFDLaunchError(LaunchError):
  """A dispatch that disagrees with its kernel descriptor (kernarg size, LDS, workgroup size), refused before
  it reaches the GPU."""


# ---------------------------------------------------------------- the kernel seam



MAP_FAILED = ctypes.c_void_p(-1).value
MAP_NORESERVE = 0x4000
PROT_NONE = 0  # (the mmap module has it from Python 3.13)
MAP_FIXED = 0x10


class KFDOps:
  """The kernel as the KFD interface sees it. Methods raise OSError with the errno on failure."""

  def open(self, path: str, flags: int = os.O_RDWR | os.O_CLOEXEC) -> int: return os.open(path, flags)
  def close(self, fd: int) -> None: os.close(fd)

  def ioctl(self, fd: int, request: int, arg: ctypes.Structure) -> None:
    """The one way every KFD request is made: `arg` is the kfd.py struct, changed in place by the driver."""
    while libc().ioctl(fd, request, ctypes.byref(arg)) < 0:
      e = ctypes.get_errno()
      if e not in (errno.EINTR, errno.EAGAIN):
        raise OSError(e, f"KFD {kfd.REQUESTS.get(request, (hex(request),))[0]}: {os.strerror(e)}")

  def mmap(self, addr: int, length: int, prot: int, flags: int, fd: int = -1, offset: int = 0) -> int:
    r = libc().mmap(addr or None, length, prot, flags, fd, offset)
    if r in (None, MAP_FAILED): raise OSError(ctypes.get_errno(), f"mmap of {length:#x} bytes (fd {fd}, offset {offset:#x}) failed")
    return r

  def munmap(self, addr: int, length: int) -> None:
    if libc().munmap(addr, length) != 0: raise OSError(ctypes.get_errno(), f"munmap of {length:#x} bytes at {addr:#x} failed")

  def read_text(self, path: str) -> str:
    with open(path) as f: return f.read()

  def listdir(self, path: str) -> list[str]: return os.listdir(path)
  def exists(self, path: str) -> bool: return os.path.exists(path)
  def readlink(self, path: str) -> str: return os.readlink(path)


# ---------------------------------------------------------------- topology

def gfx_arch(version: int) -> str:
  """gfx_target_version (major*10000 + minor*100 + stepping) as the LLVM processor name: 90010 -> gfx90a,
  90402 -> gfx942, 110000 -> gfx1100, 120001 -> gfx1201 (minor and stepping are hex digits)."""
  return f"gfx{version // 10000}{version // 100 % 100:x}{version % 100:x}"


@dataclass(frozen=True)
class GPUNode:
  """One GPU node of the KFD topology: its directory index, gpu_id (what every ioctl names the GPU by) and the
  `properties` file's integers."""
  node: int
  gpu_id: int
  props: dict[str, int] = field(repr=False)

  @property
  def gfx_version(self) -> int: return self.props["gfx_target_version"]
  @property
  def arch(self) -> str: return gfx_arch(self.gfx_version)
  @property
  def xccs(self) -> int: return max(1, self.props.get("num_xcc", 1))
  @property
  def cu_count(self) -> int: return self.props["simd_count"] // self.props["simd_per_cu"]
  @property
  def wave_size(self) -> int: return self.props.get("wave_front_size", 64)
  @property
  def lds_bytes(self) -> int: return self.props.get("lds_size_in_kb", 64) << 10
  @property
  def render_minor(self) -> int: return self.props["drm_render_minor"]
  @property
  def max_waves_per_cu(self) -> int: return self.props["max_waves_per_simd"] * self.props["simd_per_cu"]
  @property
  def scratch_slots_per_cu(self) -> int: return self.props.get("max_slots_scratch_cu", 32)
  @property
  def shader_engines(self) -> int: return max(1, self.props.get("array_count", 1) // max(1, self.props.get("simd_arrays_per_engine", 1)))
  @property
  def major(self) -> int: return self.gfx_version // 10000
  @property
  def sdma_engines(self) -> int: return self.props.get("num_sdma_engines", 0) + self.props.get("num_sdma_xgmi_engines", 0)

  def describe(self) -> str:
    return (f"{self.arch} (gpu_id {self.gpu_id:#x}, {self.cu_count} CUs, wave{self.wave_size}, {self.lds_bytes >> 10} KiB LDS, "
            f"renderD{self.render_minor})")


def parse_properties(text: str) -> dict[str, int]:
  out: dict[str, int] = {}
  for line in text.splitlines():
    parts = line.split()
    if len(parts) == 2 and parts[1].lstrip("-").isdigit(): out[parts[0]] = int(parts[1])
  return out


def read_topology(ops: KFDOps, root: str = TOPOLOGY) -> list[GPUNode]:
  """The GPU nodes (gpu_id != 0: CPU nodes have 0), in node order."""
  gpus = []
  for name in sorted((n for n in ops.listdir(root) if n.isdigit()), key=int):
    try: gpu_id = int(ops.read_text(f"{root}/{name}/gpu_id").strip() or 0)
    except (OSError, ValueError): continue
    if gpu_id: gpus.append(GPUNode(int(name), gpu_id, parse_properties(ops.read_text(f"{root}/{name}/properties"))))
  return gpus


@dataclass(frozen=True)
class CWSRSizes:
  """What CREATE_QUEUE of a compute queue needs for context save/restore (preempting running waves): KFD
  (kfd_queue.c, kfd_queue_ctx_save_restore_size) computes the same numbers per node and, since Linux 6.12,
  rejects a queue whose sizes differ. The buffer holds (ctx_save_restore_size + debug_memory_size) per XCC."""
  ctx_save_restore_size: int
  ctl_stack_size: int
  debug_memory_size: int
  eop_buffer_size: int
  xccs: int

  @property
  def buffer_size(self) -> int: return round_up((self.ctx_save_restore_size + self.debug_memory_size) * self.xccs, PAGE)


def _vgpr_bytes_per_cu(gfxv: int) -> int:
  if gfxv in (90402, 90010, 90008, 90500): return 0x80000    # MI300, MI200, MI100, MI350: 512 VGPRs incl. AGPRs
  if gfxv in (110000, 110001, 120000, 120001): return 0x60000  # Navi31/32, Navi44/48: 1.5x register file
  return 0x40000


def cwsr_sizes(node: GPUNode) -> CWSRSizes:
  """KFD's context save/restore sizes for `node` (docs/research/amd-kfd.md): the work-group context per CU
  (VGPRs, 16 KiB SGPRs, LDS (64 KiB; MI350: its LDS size), 4 KiB hardware registers) times the CUs, plus a control
  stack of 8 (gfx9) or 12 (gfx10+) bytes a wave and a 40-byte header; a debugger area of 32 bytes a wave.
  A node whose `properties` already carry KFD's numbers (cwsr_size, ctl_stack_size, ...) uses those."""
  p, gfxv = node.props, node.gfx_version
  cus = p["simd_count"] // p["simd_per_cu"] // node.xccs
  waves = min(cus * 40, p["array_count"] // p["simd_arrays_per_engine"] * 512) if gfxv < 100100 else cus * 32
  lds = (p.get("lds_size_in_kb", 64) << 10) if gfxv == 90500 else 0x10000
  wg_data = round_up(cus * (_vgpr_bytes_per_cu(gfxv) + 0x4000 + lds + 0x1000), PAGE)
  ctl_stack = round_up(40 + waves * (12 if gfxv >= 100100 else 8) + 8, PAGE)
  if gfxv // 10000 == 10: ctl_stack = min(ctl_stack, 0x7000)  # gfx10's hardware limit (AQL stays within it)
  eop = 0x8000 if gfxv == 80002 else 4096
  sizes = CWSRSizes(round_up(ctl_stack + wg_data, PAGE), ctl_stack, round_up(waves * 32, 64), eop, node.xccs)
  if "cwsr_size" in p and "ctl_stack_size" in p:
    sizes = CWSRSizes(p["cwsr_size"], p["ctl_stack_size"], p.get("debug_memory_size", sizes.debug_memory_size),
                      p.get("eop_buffer_size", eop), node.xccs)
  return sizes


# ---------------------------------------------------------------- memory

@dataclass
class Memory:
  """An allocation mapped to the GPU at `va`, the same address the CPU uses (when `cpu` is set)."""
  va: int
  size: int
  kind: str     # "vram", "gtt" or "userptr"
  handle: int
  flags: int
  cpu: bool     # mapped for the CPU at va
  owned: bool = True  # the CPU mapping (a userptr's host memory) was made by alloc, so free unmaps it

  def view(self, offset: int = 0, n: int | None = None) -> memoryview:
    if not self.cpu: raise ValueError(f"{self.kind} memory at {self.va:#x} is not mapped for the CPU")
    n = self.size - offset if n is None else n
    return memoryview((ctypes.c_char * n).from_address(self.va + offset)).cast("B")


# ---------------------------------------------------------------- the device

class KFDDevice:
  """One AMD GPU through KFD. ops: the kernel (KFDOps; a FakeKFD in tests); index: which GPU node (0: the first).

  timeout (seconds), label ("AMD:0") and setting (the variable that sets the timeout) go to every queue's
  bounded wait. Raises DeviceUnavailable with the reason when there is no /dev/kfd, no GPU node, or the
  driver's ABI is too old."""

  def __init__(self, ops: KFDOps | None = None, index: int = 0, *, timeout: float = 30.0, label: str = "AMD:0",
               setting: str = "PLUGRT_AMD_TIMEOUT"):
    self.ops = ops = ops or KFDOps()
    self.timeout, self.label, self.setting = timeout, label, setting
    if not ops.exists(KFD_PATH):
      raise DeviceUnavailable(f"{KFD_PATH} does not exist", Reason.NO_DEVICE,
                              "load the amdgpu kernel driver (modprobe amdgpu) on a machine with an AMD GPU")
    try: gpus = read_topology(ops)
    except OSError as e: raise DeviceUnavailable(f"cannot read the KFD topology: {e}", Reason.NO_DEVICE, "") from e
    if index >= len(gpus):
      raise DeviceUnavailable(f"KFD lists {len(gpus)} GPU(s), there is no GPU {index}", Reason.NO_DEVICE, "AMD:<n> counts from 0")
    self.node = gpus[index]
    self.gpu_id = self.node.gpu_id
    try: self.kfd_fd = ops.open(KFD_PATH)
    except OSError as e:
      raise DeviceUnavailable(f"cannot open {KFD_PATH}: {e.strerror}", Reason.OPEN_FAILED, "add the user to the render group") from e
    self.drm_fd = ops.open(f"/dev/dri/renderD{self.node.render_minor}")
    self.memory: dict[int, Memory] = {}
    self.closed = False
    v = self.ioctl(kfd.AMDKFD_IOC_GET_VERSION, kfd.GetVersionArgs())
    self.version = (v.major_version, v.minor_version)
    if v.major_version != 1 or v.minor_version < MIN_MINOR:
      raise DeviceUnavailable(f"the KFD ABI is {v.major_version}.{v.minor_version}, plugrt needs 1.{MIN_MINOR} or newer", Reason.OPEN_FAILED,
                              "update the kernel (Linux 5.15+)")
    self.own_drm_fd = self.drm_fd
    self.shared_vm = False  # True: another runtime of this process (ROCr, under HIP/torch) acquired the GPU's VM first
    try: self.ioctl(kfd.AMDKFD_IOC_ACQUIRE_VM, kfd.AcquireVmArgs(drm_fd=self.drm_fd, gpu_id=self.gpu_id))
    except OSError as e:
      if e.errno != errno.EBUSY: raise
      self.drm_fd, self.shared_vm = self._acquired_render_file(), True
    self.aperture = self._aperture()
    if self.version >= (1, 14): self.ioctl(kfd.AMDKFD_IOC_RUNTIME_ENABLE, kfd.RuntimeEnableArgs(mode_mask=0))
    self.timestamp_hz = self._timestamp_frequency()
    self.doorbell_pages: dict[int, int] = {}  # doorbell page mmap offset -> its CPU address
    # events: the page whose 8-byte slots are the signal events' mailboxes (KFD wants it allocated by us on dGPUs),
    # one signal event for queue completions, and the memory / hardware exception events a fault raises
    self.event_page = self.alloc(0x8000, "gtt", uncached=True)
    self.signal_event = self.ioctl(kfd.AMDKFD_IOC_CREATE_EVENT, kfd.CreateEventArgs(event_page_offset=self.event_page.handle,
                                   event_type=kfd.KFD_IOC_EVENT_SIGNAL, auto_reset=1))
    self.signal_mailbox = self.event_page.va + self.signal_event.event_slot_index * 8
    self.memory_event = self.ioctl(kfd.AMDKFD_IOC_CREATE_EVENT, kfd.CreateEventArgs(event_type=kfd.KFD_IOC_EVENT_MEMORY))
    self.hw_event = self.ioctl(kfd.AMDKFD_IOC_CREATE_EVENT, kfd.CreateEventArgs(event_type=kfd.KFD_IOC_EVENT_HW_EXCEPTION))
    self.waits = (kfd.EventData * 3)()
    for e, ev in zip(self.waits, (self.signal_event, self.memory_event, self.hw_event)): e.event_id = ev.event_id
    self.fault_kind = ""   # "memory" or "hw" once the driver reported a fault
    self.fault_text = ""
    self.fault_data: kfd.MemoryExceptionData | kfd.HwExceptionData | None = None
    self.queues: list[AQLQueue | SDMAQueue] = []

  def ioctl(self, request: int, arg: Any) -> Any:
    self.ops.ioctl(self.kfd_fd, request, arg)
    return arg

  @property
  def arch(self) -> str: return self.node.arch

  def check_dispatch(self, descriptor: Any, kernarg_size: int, workgroup: tuple[int, int, int], group_segment_size: int = 0,
                     name: str = "kernel") -> None:
    """check_dispatch with this GPU's LDS size (the device code calls it once per program)."""
    check_dispatch(descriptor, kernarg_size, workgroup, group_segment_size, name, self.node.lds_bytes)

  def _acquired_render_file(self) -> int:
    """KFD gives a process one GPU VM per GPU, acquired with one render-node file: ACQUIRE_VM with another file is
    EBUSY. When a runtime of this process (ROCr) acquired it first, its open file of this GPU's render node is the one
    to use (for ACQUIRE_VM and the CPU mmaps of allocations), found among the process's fds; plugrt never closes it."""
    node = f"/dev/dri/renderD{self.node.render_minor}"
    for name in sorted(self.ops.listdir("/proc/self/fd"), key=lambda n: int(n) if n.isdigit() else -1):
      if not name.isdigit() or int(name) == self.own_drm_fd: continue
      try:
        if self.ops.readlink(f"/proc/self/fd/{name}") != node: continue
        self.ioctl(kfd.AMDKFD_IOC_ACQUIRE_VM, kfd.AcquireVmArgs(drm_fd=int(name), gpu_id=self.gpu_id))
      except OSError: continue
      return int(name)
    raise DeviceUnavailable(f"the GPU's VM was acquired with a render-node file of {node} plugrt cannot find", Reason.OPEN_FAILED,
                            "another GPU runtime of this process holds the GPU; open AMD in a process of its own")

  def check_visible(self, ptr: int, nbytes: int) -> str:
    """Whether this GPU can reach [ptr, ptr+nbytes) at that address, as KFD answers AMDKFD_IOC_SVM GET_ATTR(ACCESS) for
    this gpu_id over the pages holding it: "plugrt" (plugrt's own allocation), "kfd" (EADDRINUSE: memory another
    runtime of this process allocated through KFD and mapped into this process's GPU VM, e.g. hipMalloc's), "svm"
    (an SVM range this GPU may access, e.g. host memory with XNACK on). Anything else is KFDNotVisible: plugrt never
    copies in its place (docs/backends/amd.md, "Wrapping ROCm memory")."""
    for m in self.memory.values():
      if m.va <= ptr and ptr + nbytes <= m.va + m.size: return "plugrt"
    lo, hi = ptr & ~(PAGE - 1), round_up(ptr + max(nbytes, 1), PAGE)
    args = kfd.SvmArgs1(start_addr=lo, size=hi - lo, op=kfd.KFD_IOCTL_SVM_OP_GET_ATTR, nattr=1)
    args.attrs[0].type, args.attrs[0].value = kfd.KFD_IOCTL_SVM_ATTR_ACCESS, self.gpu_id
    what = f"{nbytes} bytes at {ptr:#x}"
    try: self.ioctl(kfd.AMDKFD_IOC_SVM, args)
    except OSError as e:
      if e.errno == errno.EADDRINUSE: return "kfd"
      if e.errno == errno.EFAULT:
        raise KFDNotVisible(f"{self.label}: {what} is not mapped in this process", "pass a pointer to live GPU memory") from None
      raise KFDNotVisible(f"{self.label}: KFD cannot say whether {what} is GPU memory ({e.strerror})",
                          "copy the data in with Buffer.copyin") from None
    if args.attrs[0].type in (kfd.KFD_IOCTL_SVM_ATTR_ACCESS, kfd.KFD_IOCTL_SVM_ATTR_ACCESS_IN_PLACE): return "svm"
    raise KFDNotVisible(f"{self.label}: {what} is host memory KFD has not mapped for this GPU (not a ROCm allocation, and XNACK is off)",
                        "pass memory a ROCm runtime of this process allocated (torch's ROCm tensors), or copy host data in with Buffer.copyin")

  def _timestamp_frequency(self) -> int:
    """The GPU timestamp counter's frequency in Hz (the render node's AMDGPU_INFO DEV_INFO gpu_counter_freq); 0 when
    the driver does not say, and launches then time themselves with the host's clock."""
    head = kfd.DrmAmdgpuInfoDeviceHead()
    q = kfd.DrmAmdgpuInfo(return_pointer=ctypes.addressof(head), return_size=ctypes.sizeof(head), query=kfd.AMDGPU_INFO_DEV_INFO)
    try: self.ops.ioctl(self.drm_fd, kfd.DRM_IOCTL_AMDGPU_INFO, q)
    except OSError: return 0
    return head.gpu_counter_freq * 1000

  def _aperture(self) -> kfd.ProcessDeviceApertures:
    n = 16
    aps = (kfd.ProcessDeviceApertures * n)()
    a = self.ioctl(kfd.AMDKFD_IOC_GET_PROCESS_APERTURES_NEW, kfd.GetProcessAperturesNewArgs(ctypes.addressof(aps), n))
    for ap in aps[:a.num_of_nodes]:
      if ap.gpu_id == self.gpu_id: return ap
    raise DeviceUnavailable(f"KFD reports no address aperture for gpu_id {self.gpu_id:#x}", Reason.NO_DEVICE, "")

  # ------------------------------------------------------------ memory
  def alloc(self, size: int, kind: str = "vram", *, cpu: bool = True, uncached: bool = False, executable: bool = False,
            host: int | None = None) -> Memory:
    """size bytes of `kind` memory mapped to the GPU, at an address the CPU shares (mapped for it when `cpu`).
    vram: device memory (CPU-visible needs the large BAR); gtt: system memory the GPU reaches through the GART;
    userptr: ordinary host memory (`host`: existing page-aligned memory to register, else new anonymous memory).
    uncached: coherent, uncached for the GPU (signals, queue pointers, rings the CPU polls)."""
    if kind not in ("vram", "gtt", "userptr"): raise ValueError(f"memory kind {kind!r}: vram, gtt or userptr")
    size = round_up(max(size, 1), PAGE)
    flags = kfd.KFD_IOC_ALLOC_MEM_FLAGS_WRITABLE | kfd.KFD_IOC_ALLOC_MEM_FLAGS_NO_SUBSTITUTE
    flags |= {"vram": kfd.KFD_IOC_ALLOC_MEM_FLAGS_VRAM, "gtt": kfd.KFD_IOC_ALLOC_MEM_FLAGS_GTT, "userptr": kfd.KFD_IOC_ALLOC_MEM_FLAGS_USERPTR}[kind]
    if executable: flags |= kfd.KFD_IOC_ALLOC_MEM_FLAGS_EXECUTABLE
    if uncached: flags |= kfd.KFD_IOC_ALLOC_MEM_FLAGS_COHERENT | kfd.KFD_IOC_ALLOC_MEM_FLAGS_UNCACHED
    if cpu or kind == "userptr": flags |= kfd.KFD_IOC_ALLOC_MEM_FLAGS_PUBLIC
    owned = host is None
    if kind == "userptr":
      if host is not None and host % PAGE: raise ValueError(f"host memory to register must be page-aligned, not at {host:#x}")
      va = host if host is not None else self.ops.mmap(0, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
    else:  # reserve the address range; the allocation then lands at it for the GPU and (mmapped) for the CPU
      va = self.ops.mmap(0, size, PROT_NONE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_NORESERVE)
    args = kfd.AllocMemoryOfGpuArgs(va_addr=va, size=size, gpu_id=self.gpu_id, flags=flags, mmap_offset=va if kind == "userptr" else 0)
    try: self.ioctl(kfd.AMDKFD_IOC_ALLOC_MEMORY_OF_GPU, args)
    except OSError as e:
      if owned: self.ops.munmap(va, size)
      if e.errno == errno.ENOMEM:
        raise OutOfMemoryError(f"{self.label}: KFD has no {size:#x} bytes of {kind} memory left", "free buffers first") from e
      if e.errno == errno.EINVAL and kind == "vram" and cpu:
        raise OutOfMemoryError(f"{self.label}: KFD refused CPU-visible VRAM ({e.strerror})",
                               "enable resizable BAR (Above 4G decoding) in the firmware setup") from e
      raise
    mem = Memory(va, size, kind, args.handle, flags, cpu=cpu or kind == "userptr", owned=owned)
    if kind != "userptr" and cpu:
      self.ops.mmap(va, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED | MAP_FIXED, self.drm_fd, args.mmap_offset)
    ids = (ctypes.c_uint32 * 1)(self.gpu_id)
    m = self.ioctl(kfd.AMDKFD_IOC_MAP_MEMORY_TO_GPU, kfd.MapMemoryToGpuArgs(mem.handle, ctypes.addressof(ids), 1, 0))
    if m.n_success != 1: raise OSError(errno.EIO, f"KFD mapped {mem.kind} memory at {va:#x} to {m.n_success} of 1 GPUs")
    self.memory[va] = mem
    return mem

  def free(self, mem: Memory) -> None:
    """Unmap `mem` from the GPU and the CPU and give it back (the caller made sure the GPU is done with it)."""
    if self.memory.pop(mem.va, None) is None: return
    ids = (ctypes.c_uint32 * 1)(self.gpu_id)
    self.ioctl(kfd.AMDKFD_IOC_UNMAP_MEMORY_FROM_GPU, kfd.UnmapMemoryFromGpuArgs(mem.handle, ctypes.addressof(ids), 1, 0))
    self.ioctl(kfd.AMDKFD_IOC_FREE_MEMORY_OF_GPU, kfd.FreeMemoryOfGpuArgs(mem.handle))
    if mem.owned: self.ops.munmap(mem.va, mem.size)  # the CPU mapping, or the reserved range of memory not mapped for the CPU

  # ------------------------------------------------------------ queues
  def doorbell(self, doorbell_offset: int) -> int:
    """CPU address of the doorbell at `doorbell_offset` (from CREATE_QUEUE): the process's doorbell pages of this
    GPU are mmapped from /dev/kfd once."""
    base = doorbell_offset & ~(kfd.DOORBELL_PAGE - 1)
    if base not in self.doorbell_pages:
      self.doorbell_pages[base] = self.ops.mmap(0, kfd.DOORBELL_PAGE, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, self.kfd_fd, base)
    return self.doorbell_pages[base] + (doorbell_offset - base)

  def _create_queue(self, queue_type: int, ring: Memory, pointers: Memory, eop: Memory | None = None, cwsr: Memory | None = None,
                    sizes: CWSRSizes | None = None, rptr: int = 0, wptr: int = 8) -> kfd.CreateQueueArgs:
    args = kfd.CreateQueueArgs(ring_base_address=ring.va, ring_size=ring.size, gpu_id=self.gpu_id, queue_type=queue_type,
                               queue_percentage=kfd.KFD_MAX_QUEUE_PERCENTAGE, queue_priority=7,
                               read_pointer_address=pointers.va + rptr, write_pointer_address=pointers.va + wptr)
    if eop is not None and cwsr is not None and sizes is not None:
      args.eop_buffer_address, args.eop_buffer_size = eop.va, sizes.eop_buffer_size
      args.ctx_save_restore_address, args.ctx_save_restore_size, args.ctl_stack_size = cwsr.va, sizes.ctx_save_restore_size, sizes.ctl_stack_size
    return self.ioctl(kfd.AMDKFD_IOC_CREATE_QUEUE, args)

  def compute_queue(self, entries: int = 1024) -> AQLQueue:
    """An AQL compute queue of `entries` 64-byte packets (a power of two), with its EOP buffer and CWSR area."""
    if entries & (entries - 1) or entries * 64 < kfd.KFD_MIN_QUEUE_RING_SIZE:
      raise ValueError(f"an AQL queue has a power-of-two number of packets (>= 16), not {entries}")
    sizes = cwsr_sizes(self.node)
    ring = self.alloc(entries * 64, "gtt", uncached=True)
    pointers = self.alloc(PAGE, "gtt", uncached=True)  # amd_queue_t at 0 (the write and read pointers inside it), completion signal at 256
    eop = self.alloc(sizes.eop_buffer_size, "vram", cpu=False)
    cwsr = self.alloc(sizes.buffer_size, "vram", cpu=False)
    desc = aql.AmdQueue.from_address(pointers.va)
    ctypes.memset(pointers.va, 0, aql.AMD_QUEUE_SIZE)
    desc.hsa_queue.features, desc.hsa_queue.base_address, desc.hsa_queue.size = aql.HSA_QUEUE_FEATURE_KERNEL_DISPATCH, ring.va, entries
    desc.read_dispatch_id_field_base_byte_offset = aql.AmdQueue.read_dispatch_id.offset
    desc.queue_properties = aql.AMD_QUEUE_PROPERTIES_IS_PTR64 | aql.AMD_QUEUE_PROPERTIES_ENABLE_PROFILING
    desc.max_cu_id, desc.max_wave_id = self.node.cu_count - 1, self.node.props.get("max_waves_per_simd", 8) * self.node.props["simd_per_cu"] - 1
    desc.group_segment_aperture_base_hi, desc.private_segment_aperture_base_hi = self.aperture.lds_base >> 32, self.aperture.scratch_base >> 32
    try: q = self._create_queue(kfd.KFD_IOC_QUEUE_TYPE_COMPUTE_AQL, ring, pointers, eop, cwsr, sizes,
                                aql.AmdQueue.read_dispatch_id.offset, aql.AmdQueue.write_dispatch_id.offset)
    except OSError:
      for m in (ring, pointers, eop, cwsr): self.free(m)
      raise
    queue = AQLQueue(self, q.queue_id, ring, pointers, self.doorbell(q.doorbell_offset), (eop, cwsr))
    self.queues.append(queue)
    return queue

  def sdma_queue(self, ring_size: int = 0x10000) -> SDMAQueue:
    """An SDMA (copy engine) queue with a ring of `ring_size` bytes (a power of two)."""
    if ring_size & (ring_size - 1) or ring_size < kfd.KFD_MIN_QUEUE_RING_SIZE:
      raise ValueError(f"an SDMA ring is a power of two of at least 1 KiB, not {ring_size}")
    ring = self.alloc(ring_size, "gtt", uncached=True)
    pointers = self.alloc(PAGE, "gtt", uncached=True)  # read pointer at 0, write pointer at 8, fence counter at 64
    try: q = self._create_queue(kfd.KFD_IOC_QUEUE_TYPE_SDMA, ring, pointers)
    except OSError:
      for m in (ring, pointers): self.free(m)
      raise
    queue = SDMAQueue(self, q.queue_id, ring, pointers, self.doorbell(q.doorbell_offset))
    self.queues.append(queue)
    return queue

  def kernarg_slots(self, slot_size: int, count: int) -> tuple[Memory, CommandSlots]:
    """`count` kernarg blocks of `slot_size` bytes (rounded to 64: the kernarg segment is 16-aligned, a cache line
    keeps blocks apart) in CPU-visible GTT memory, as plugrt.hwqueue.CommandSlots: take() hands out a block the
    GPU is done reading (given the compute queue's timeline)."""
    size = round_up(max(slot_size, 16), 64)
    mem = self.alloc(size * count, "gtt")
    return mem, CommandSlots(mem.va, size, count)

  def destroy_queue(self, queue: AQLQueue | SDMAQueue) -> None:
    if queue not in self.queues: return
    self.queues.remove(queue)
    self.ioctl(kfd.AMDKFD_IOC_DESTROY_QUEUE, kfd.DestroyQueueArgs(queue.queue_id))
    for m in (queue.ring, queue.pointers, *queue.extra): self.free(m)

  # ------------------------------------------------------------ events and faults
  def poll_faults(self, timeout_ms: int = 0) -> str:
    """Read the memory and hardware exception events (waiting up to timeout_ms; 0: not at all) and return what
    the driver reported, "" while nothing. Sticky: once reported, a fault stays."""
    if self.fault_kind or self.closed: return self.fault_text
    for e in self.waits: ctypes.memset(ctypes.addressof(e), 0, ctypes.sizeof(kfd.EventDataUnion))  # the union: KFD fills it for the event that fired
    w = self.ioctl(kfd.AMDKFD_IOC_WAIT_EVENTS, kfd.WaitEventsArgs(ctypes.addressof(self.waits) + ctypes.sizeof(kfd.EventData), 2, 0, timeout_ms))
    if w.wait_result != kfd.KFD_IOC_WAIT_RESULT_COMPLETE: return ""
    mem, hw = self.waits[1].memory_exception_data, self.waits[2].hw_exception_data
    if mem.gpu_id:
      f = mem.failure
      what = ", ".join(n for n, v in (("page not present", f.NotPresent), ("write to a read-only page", f.ReadOnly),
                                      ("execute of a no-execute page", f.NoExecute), ("imprecise address", f.imprecise)) if v) or "access fault"
      ras = {kfd.KFD_MEM_ERR_SRAM_ECC: "; SRAM ECC error", kfd.KFD_MEM_ERR_POISON_CONSUMED: "; poisoned data consumed",
             kfd.KFD_MEM_ERR_GPU_HANG: "; GPU hang"}.get(mem.ErrorType, "")
      self.fault_kind, self.fault_data = "memory", kfd.MemoryExceptionData.from_buffer_copy(mem)
      self.fault_text = f"GPU memory fault at {mem.va:#x} ({what}{ras})"
    elif hw.gpu_id:
      self.fault_kind, self.fault_data = "hw", kfd.HwExceptionData.from_buffer_copy(hw)
      scope = "the whole GPU" if hw.reset_type == kfd.KFD_HW_EXCEPTION_WHOLE_GPU_RESET else "one engine"
      cause = "an ECC error" if hw.reset_cause == kfd.KFD_HW_EXCEPTION_ECC else "a GPU hang"
      self.fault_text = f"the driver reset {scope} after {cause}" + ("; device memory was lost" if hw.memory_lost else "")
    return self.fault_text

  def sleep(self, timeout_ms: int) -> bool:
    """Block in WAIT_EVENTS until the completion signal event fires, a fault is reported or timeout_ms pass;
    True when an event fired."""
    for e in self.waits: ctypes.memset(ctypes.addressof(e), 0, ctypes.sizeof(kfd.EventDataUnion))
    w = self.ioctl(kfd.AMDKFD_IOC_WAIT_EVENTS, kfd.WaitEventsArgs(ctypes.addressof(self.waits), 3, 0, timeout_ms))
    return w.wait_result == kfd.KFD_IOC_WAIT_RESULT_COMPLETE

  def close(self) -> None:
    if self.closed: return
    for q in list(self.queues): self.destroy_queue(q)
    for ev in (self.signal_event, self.memory_event, self.hw_event): self.ioctl(kfd.AMDKFD_IOC_DESTROY_EVENT, kfd.DestroyEventArgs(ev.event_id))
    for m in list(self.memory.values()): self.free(m)
    for addr in self.doorbell_pages.values(): self.ops.munmap(addr, kfd.DOORBELL_PAGE)
    self.closed = True
    self.ops.close(self.own_drm_fd)  # a render-node file another runtime acquired the VM with stays that runtime's
    self.ops.close(self.kfd_fd)


# ---------------------------------------------------------------- queues

class _KFDTimeline(Timeline):
  """A queue's bounded wait with KFD's faults: fault() reads the exception events, fail() raises the typed error."""
  device: KFDDevice
  name = "queue"

  def fault(self) -> str: return self.device.poll_faults()

  def fault_report(self) -> str:
    return "; ".join(s for s in (self.device.poll_faults(), self.describe()) if s)

  def describe(self) -> str: return ""

  def stalled_packet(self) -> str: return ""

  def fail(self, what: str, value: int | None = None, timed_out: bool = False) -> NoReturn:
    self.device.poll_faults()
    kind = self.device.fault_kind
    bad = self.stalled_packet() if not kind else ""
    self.error = {"memory": KFDMemoryFault, "hw": KFDHardwareFault}.get(kind) or (KFDPacketError if bad else KFDTimeout)
    try: super().fail(what, value, timed_out)
    except KFDMemoryFault as e:
      d = self.device.fault_data
      if isinstance(d, kfd.MemoryExceptionData): e.va, e.not_present, e.read_only = d.va, bool(d.failure.NotPresent), bool(d.failure.ReadOnly)
      raise


class Prepared:
  """A 64-byte AQL packet kept ready for `AQLQueue.push_args`: body (bytes 4..63, at a fixed address), the 32-bit
  header+setup word stored last, and the kernarg address it was prepared with (bytes 40..47)."""
  __slots__ = ("_buf", "body", "header", "kernarg_address", "raw")

  def __init__(self, raw: bytes):
    self.raw = raw
    self._buf = ctypes.create_string_buffer(raw[4:], 60)
    self.body = ctypes.addressof(self._buf)
    self.header = int.from_bytes(raw[:4], "little")
    self.kernarg_address = int.from_bytes(raw[40:48], "little")


class AQLQueue(_KFDTimeline):
  """A compute queue of AQL packets. The timeline counter is the completion signal every submission's last packet
  carries: the packet processor decrements its value by one per completed packet, so -value counts the
  submissions done (`completed`). `dispatch` is the slow path that writes one packet; a backend's launch path
  inlines the same stores on these fields: ring (base address), mask (entries - 1), put, wptr and doorbell
  (ctypes 64-bit views), signal_address."""
  name = "compute"

  def __init__(self, device: KFDDevice, queue_id: int, ring: Memory, pointers: Memory, doorbell: int, extra: tuple[Memory, ...] = ()):
    self.device, self.queue_id, self.ring, self.pointers, self.extra = device, queue_id, ring, pointers, extra
    self.aql = aql
    self.entries = ring.size // aql.PACKET_SIZE
    self.mask = self.entries - 1
    for i in range(self.entries): aql.invalidate_slot(ring.va + i * aql.PACKET_SIZE)
    self.desc = aql.AmdQueue.from_address(pointers.va)
    self.rptr = ctypes.c_uint64.from_address(pointers.va + aql.AmdQueue.read_dispatch_id.offset)
    self.wptr = ctypes.c_uint64.from_address(pointers.va + aql.AmdQueue.write_dispatch_id.offset)
    self.doorbell = ctypes.c_uint64.from_address(doorbell)
    self.doorbell_address = doorbell
    self.signal_address = pointers.va + aql.AMD_QUEUE_SIZE
    self.scratch: Memory | None = None
    self.scratch_per_item = 0
    self.signal = aql.init_signal(self.signal_address, 0, device.signal_mailbox, device.signal_event.event_id)
    self._signal_value = ctypes.c_int64.from_address(self.signal_address + 8)
    self.put = 0
    self.words = (ctypes.c_uint32 * (self.entries * 16)).from_address(ring.va)  # the ring as dwords: slot i's header is words[i * 16]
    self.qwords = (ctypes.c_uint64 * (self.entries * 8)).from_address(ring.va)
    self.slot_body = [ring.va + i * aql.PACKET_SIZE + 4 for i in range(self.entries)]
    super().__init__(self.signal_address + 8, timeout=device.timeout, label=device.label, setting=device.setting, bits=64)

  def completed(self) -> int:
    done = -self._signal_value.value
    if done > self.done: self.done = done
    return self.done

  def submit(self, packet: bytes, signal: bool = True) -> int:
    """Write one packet and ring the doorbell. signal: make it the end of a submission (it carries the completion
    signal; the timeline value it completes is returned). Waits (bounded) while the ring is full. The slow path:
    launches use `push_args` with a `Prepared` packet."""
    if self.broken: raise self.error(f"{self.label}: {self.broken}", "restart the process")
    put = self.put
    if put - self.rptr.value >= self.entries: self._wait_for_room(put - self.entries + 1)
    if signal: packet = packet[:56] + self.signal_address.to_bytes(8, "little")
    self.aql.write_packet(self.ring.va + (put & self.mask) * self.aql.PACKET_SIZE, packet)
    self.put = put + 1
    self.wptr.value = put + 1
    self.doorbell.value = put  # HSA: the doorbell takes the id of the packet just written; the CP reads up to wptr
    if signal: self.value += 1
    return self.value

  def prepare(self, kernel_object: int, kernarg_address: int, grid: tuple[int, int, int], workgroup: tuple[int, int, int],
              group_segment_size: int = 0, private_segment_size: int = 0) -> Prepared:
    """A dispatch packet ending a submission (it carries this queue's completion signal), kept for `push_args`:
    a program prepares one per resident launch (its own kernarg block), once."""
    return Prepared(self.aql.dispatch_packet(kernel_object, kernarg_address, grid, workgroup, group_segment_size, private_segment_size,
                                             self.signal_address))

  def push(self, p: Prepared) -> int:
    """`push_args` with the kernarg block the packet was prepared with (a resident launch whose block never changes)."""
    return self.push_args(p, p.kernarg_address)

  def push_args(self, p: Prepared, kernarg_address: int) -> int:
    """The launch path: copy a prepared packet into the next slot (body, this launch's kernarg block (a
    `KFDDevice.kernarg_slots` block), then header and setup in one 32-bit store), move the write pointer, ring the
    doorbell; no allocation."""
    put = self.put
    if put - self.rptr.value >= self.entries: self._wait_for_room(put - self.entries + 1)
    i = put & self.mask
    ctypes.memmove(self.slot_body[i], p.body, 60)
    self.qwords[(i << 3) + 5] = kernarg_address  # kernarg_address: byte 40 of the packet
    self.words[i << 4] = p.header
    self.put = put = put + 1
    self.wptr.value = put
    self.doorbell.value = put - 1
    self.value += 1
    return self.value

  def dispatch(self, kernel_object: int, kernarg_address: int, grid: tuple[int, int, int], workgroup: tuple[int, int, int],
               group_segment_size: int = 0, private_segment_size: int = 0) -> int:
    """Dispatch the kernel whose descriptor is at `kernel_object` on `grid` work-items in `workgroup`-sized groups,
    its arguments at `kernarg_address`; returns the timeline value that says it finished."""
    return self.submit(self.aql.dispatch_packet(kernel_object, kernarg_address, grid, workgroup, group_segment_size, private_segment_size))

  def barrier(self, deps: tuple[int, ...] = ()) -> int:
    return self.submit(self.aql.barrier_and_packet(deps))

  def ensure_scratch(self, private_segment_size: int) -> None:
    """Make the queue's scratch (private segment) hold `private_segment_size` bytes per work-item for every wave the GPU
    can run with scratch at once (sized from topology: CUs, max_slots_scratch_cu), and describe it in amd_queue_t.
    Grows only; waits for the queue's work before it replaces a smaller scratch (a running kernel may use it)."""
    node, major = self.device.node, self.device.node.major
    per_item = self.aql.scratch_per_item(private_segment_size, major)
    if per_item <= self.scratch_per_item: return
    size = self.aql.scratch_bytes(per_item, node.cu_count, node.scratch_slots_per_cu)
    new = self.device.alloc(size, "vram", cpu=False)
    old, d = self.scratch, self.desc
    if old is not None: self.synchronize()
    per_xcc = size // node.xccs
    d.scratch_backing_memory_location, d.scratch_backing_memory_byte_size = new.va, per_xcc
    d.scratch_wave64_lane_byte_size = per_item
    d.scratch_resource_descriptor[:] = self.aql.scratch_srd(new.va, per_xcc, major)
    d.compute_tmpring_size = self.aql.tmpring_size(major, per_item, per_xcc, node.cu_count // node.xccs * node.scratch_slots_per_cu,
                                                   node.shader_engines // node.xccs)
    self.scratch, self.scratch_per_item = new, per_item
    self.extra = (*(m for m in self.extra if m is not old), new)
    if old is not None: self.device.free(old)

  def gpu_seconds(self) -> float | None:
    """The last completed packet's duration by the GPU's clock: the completion signal's end_ts - start_ts (written by
    the packet processor because amd_queue_t's ENABLE_PROFILING is set), in seconds by the timestamp frequency; None
    where either stayed 0 (the firmware wrote none) or the frequency is unknown."""
    s, hz = self.signal, self.device.timestamp_hz
    if not hz or not s.start_ts or s.end_ts < s.start_ts: return None
    return (s.end_ts - s.start_ts) / hz

  def clear_timestamps(self) -> None:
    self.signal.start_ts = self.signal.end_ts = 0

  def _wait_for_room(self, read: int) -> None:
    deadline = time.monotonic() + self.timeout
    while self.rptr.value < read:
      if self.fault(): self.fail("the GPU reported an error while the AQL ring was full")
      if time.monotonic() > deadline: self.fail(f"the AQL ring stayed full for {self.timeout:g} s", timed_out=True)
      time.sleep(0)

  def stalled_packet(self) -> str:
    """What is wrong with the packet at the read pointer, when the queue sits on one it cannot execute."""
    r = self.rptr.value
    if r >= self.put: return ""
    raw = ctypes.string_at(self.ring.va + (r & self.mask) * self.aql.PACKET_SIZE, self.aql.PACKET_SIZE)
    try: self.aql.decode_packet(raw)
    except self.aql.PacketError as e: return f"packet {r}: {e}"
    return ""

  def describe(self) -> str:
    r = self.rptr.value
    s = f"AQL queue {self.queue_id}: read {r} / written {self.put}, signal {self._signal_value.value}"
    if r < self.put:
      raw = ctypes.string_at(self.ring.va + (r & self.mask) * self.aql.PACKET_SIZE, self.aql.PACKET_SIZE)
      try:
        p = self.aql.decode_packet(raw)
        s += f"; packet {r} at the read pointer: {p!r}"
        if isinstance(p, self.aql.KernelDispatchPacket): s += self._descriptor(p.kernel_object)
      except self.aql.PacketError as e: s += f"; packet {r} at the read pointer: {e}"
    return s

  def _descriptor(self, kernel_object: int) -> str:
    for m in self.device.memory.values():
      if m.cpu and m.va <= kernel_object and kernel_object + 64 <= m.va + m.size:
        kd = self.aql.KernelDescriptor.from_buffer_copy(ctypes.string_at(kernel_object, 64))
        return (f"; its kernel descriptor: kernarg_size {kd.kernarg_size}, group_segment_fixed_size {kd.group_segment_fixed_size}, "
                f"private_segment_fixed_size {kd.private_segment_fixed_size}")
    return ""


def check_dispatch(descriptor: Any, kernarg_size: int, workgroup: tuple[int, int, int], group_segment_size: int = 0,
                   name: str = "kernel", max_lds: int = 65536) -> None:
  """Refuse (KFDLaunchError) a dispatch that disagrees with its kernel descriptor (a plugrt_amd.aql.KernelDescriptor
  or anything with its fields): arguments of another size than the descriptor's kernarg_size, less LDS than it
  declares or more than the GPU has, or a workgroup over 1024 work-items. For the once-per-program (or
  once-per-resident-launch) path, not per launch."""
  if kernarg_size != descriptor.kernarg_size:
    raise KFDLaunchError(f"{name}: its arguments take {kernarg_size} bytes, its kernel descriptor's kernarg_size is {descriptor.kernarg_size}",
                         "the kernarg layout must be the code object's (its .args metadata): recompile, or fix the argument writer")
  if not descriptor.group_segment_fixed_size <= group_segment_size + descriptor.group_segment_fixed_size <= max_lds:
    raise KFDLaunchError(f"{name}: {descriptor.group_segment_fixed_size + group_segment_size} bytes of LDS, the GPU has {max_lds}",
                         "use less shared memory")
  if workgroup[0] * workgroup[1] * workgroup[2] > 1024 or min(workgroup) < 1:
    raise KFDLaunchError(f"{name}: workgroup {workgroup} is not 1..1024 work-items", "use a smaller local size")


class SDMAQueue(_KFDTimeline):
  """A copy-engine queue: a ring of dwords whose read and write pointers count bytes. Every submission ends with a
  FENCE writing the next timeline value (32 bits) at `counter`."""
  name = "sdma"

  def __init__(self, device: KFDDevice, queue_id: int, ring: Memory, pointers: Memory, doorbell: int):
    self.device, self.queue_id, self.ring, self.pointers, self.extra = device, queue_id, ring, pointers, ()
    self.sdma = sdma
    self.rptr = ctypes.c_uint64.from_address(pointers.va)
    self.wptr = ctypes.c_uint64.from_address(pointers.va + 8)
    self.doorbell = ctypes.c_uint64.from_address(doorbell)
    self.counter = pointers.va + 64
    self.put = 0  # bytes ever written
    super().__init__(self.counter, timeout=device.timeout, label=device.label, setting=device.setting, bits=32)

  def submit(self, words: list[int]) -> int:
    """Write `words` (whole packets) then a fence with the next timeline value; ring the doorbell; return the value."""
    if self.broken: raise self.error(f"{self.label}: {self.broken}", "restart the process")
    data = self.sdma.to_bytes(words + self.sdma.fence(self.counter, self.value + 1))
    size = self.ring.size
    if (self.put % size) + len(data) > size: data = self.sdma.to_bytes(self.sdma.nop((size - self.put % size) // 4)) + data  # no packet wraps
    if len(data) > size // 2: raise ValueError(f"an SDMA submission of {len(data)} bytes does not fit half the {size}-byte ring")
    deadline = time.monotonic() + self.timeout
    while self.put + len(data) - self.rptr.value > size:
      if self.fault(): self.fail("the GPU reported an error while the SDMA ring was full")
      if time.monotonic() > deadline: self.fail(f"the SDMA ring stayed full for {self.timeout:g} s", timed_out=True)
      time.sleep(0)
    pos = 0
    while pos < len(data):  # the NOP padding ends exactly at the ring's end: at most two pieces
      at = (self.put + pos) % size
      n = min(len(data) - pos, size - at)
      ctypes.memmove(self.ring.va + at, data[pos:pos + n], n)
      pos += n
    self.put += len(data)
    self.value += 1
    self.wptr.value = self.put
    self.doorbell.value = self.put
    return self.value

  def copy(self, dst: int, src: int, n: int) -> int:
    """Copy n bytes from GPU address src to dst (both mapped to this GPU); returns the timeline value."""
    words = self.sdma.copy_linear(dst, src, n)
    per = 7 * (self.ring.size // 4 // 7 // 4)  # at most a quarter of the ring a submission
    value = 0
    for i in range(0, len(words), per): value = self.submit(words[i:i + per])
    return value

  def describe(self) -> str: return f"SDMA queue {self.queue_id}: read {self.rptr.value:#x} / written {self.put:#x} bytes, fence {self.completed()}"
