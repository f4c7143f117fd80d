"""The KGSL interface: an Adreno GPU driven from user space through /dev/kgsl-3d0.

- `KGSLOps`: everything that touches the kernel (open, ioctl, mmap, munmap). Every request goes through
  `KGSLOps.ioctl(fd, request, struct)` with kgsl.py's structs, so the fake KGSL (tests/fake_kgsl.py) replaces this
  one class and answers the same structs the driver would.
- `KGSLDevice`: the device: its chip id (the Adreno generation), one draw context, GPU objects (GPUOBJ_ALLOC with
  USE_CPU_MAP, mapped by mmap of the KGSL fd at id << 12: the GPU address is the CPU address), submission of
  indirect buffers (GPU_COMMAND: one kgsl_command_object per submission, which returns the context timestamp), and
  the driver's bounded wait for a timestamp (DEVICE_WAITTIMESTAMP_CTXTID) and account of a reset (GPU_RESET_STAT).
- `KGSLTimeline`: plugrt.hwqueue.Timeline on a counter in a GPU object that each submission's CP_EVENT_WRITE stores.
  A wait spins on it, then blocks in the driver WAIT_SLICE_MS at a time, reads the context's reset status between, and
  turns what it finds into a typed error: `KGSLFault` (the driver reset the GPU: a fault, a hang it detected, a
  corrupt packet), `KGSLTimeout` (nothing finished and nothing was reported).
"""
from __future__ import annotations

import ctypes
import errno
import mmap
import os
import time
from dataclasses import dataclass
from typing import Any, NoReturn

from plugrt.errors import DeviceUnavailable, Reason
from plugrt.hwqueue import QueueError, Timeline, libc, round_up
from plugrt_qcom import kgsl

PAGE = 0x1000
DRIVER_HINT = "run on a device with a Qualcomm Adreno GPU and its KGSL driver (Android, or Linux on Snapdragon with msm_kgsl)"
CONTEXT_FLAGS = (kgsl.KGSL_CONTEXT_PREAMBLE | kgsl.KGSL_CONTEXT_NO_GMEM_ALLOC | kgsl.KGSL_CONTEXT_NO_FAULT_TOLERANCE
                 | kgsl.field(kgsl.KGSL_CONTEXT_TYPE_CL, kgsl.KGSL_CONTEXT_TYPE_SHIFT, kgsl.KGSL_CONTEXT_TYPE_MASK)
                 | kgsl.field(kgsl.KGSL_CONTEXT_PREEMPT_STYLE_FINEGRAIN, kgsl.KGSL_CONTEXT_PREEMPT_STYLE_SHIFT, kgsl.KGSL_CONTEXT_PREEMPT_STYLE_MASK))


# ---------------------------------------------------------------- errors

class KGSLError(QueueError):
  """Work on an Adreno GPU through KGSL failed (every KGSL error is one of these)."""


class KGSLFault(KGSLError):
  """The driver reset the GPU for this context: a memory fault, a hang it detected, a packet the CP refused."""


class KGSLTimeout(KGSLError):
  """Nothing finished within the timeout and the driver reported no fault (a kernel that never ends)."""


# ---------------------------------------------------------------- the kernel seam



class KGSLOps:
  """The kernel as the KGSL interface sees it. Methods raise OSError with the errno on failure."""

  def exists(self, path: str) -> bool: return os.path.exists(path)
  def open(self, path: str) -> int: return os.open(path, os.O_RDWR | os.O_CLOEXEC)
  def close(self, fd: int) -> None: os.close(fd)

  def ioctl(self, fd: int, request: int, arg: ctypes.Structure) -> None:
    """The one way every KGSL request is made: `arg` is the kgsl.py struct, changed in place by the driver."""
    while libc().ioctl(fd, request, ctypes.byref(arg)) < 0:
      e = ctypes.get_errno()
      if e not in (errno.EINTR, errno.EAGAIN):
        raise OSError(e, f"KGSL {kgsl.REQUESTS.get(request, (hex(request),))[0]}: {os.strerror(e)}")

  def mmap(self, length: int, fd: int, offset: int) -> int:
    r = libc().mmap(None, length, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, offset)
    if r in (None, ctypes.c_void_p(-1).value): raise OSError(ctypes.get_errno(), f"mmap of {length:#x} bytes of KGSL object at {offset:#x} failed")
    return r

  def munmap(self, addr: int, length: int) -> None:
    if libc().munmap(addr, length) != 0: raise OSError(ctypes.get_errno(), f"munmap of {length:#x} bytes at {addr:#x} failed")


# ---------------------------------------------------------------- the device

@dataclass
class GpuMem:
  """A GPU object: at `va` for the CPU and the GPU alike (KGSL_MEMFLAGS_USE_CPU_MAP)."""
  va: int
  size: int
  id: int
  mmapsize: int

  def view(self) -> memoryview: return memoryview((ctypes.c_char * self.size).from_address(self.va)).cast("B")


# Which command stream a chip id takes, as Mesa's device table (src/freedreno/common/freedreno_devices.py) files the
# parts: 6xx ids (core 6) and the 702 and 710 (core 7, major 0 and 1: "CHIP.A6XX, NOT a mistake") are A6XX; 725 and
# 730 (0x0703xxxx) and the parts that report core 0x43 (735 0x43030B00, 740 0x43050A01, 750 0x43051401, X1-85
# 0x43050C01, ...) are A7XX. Anything else (a8xx reports core 0x44 and up) has no stream here.
A7XX_NAMES = {0x43030B00: "Adreno 735", 0x43050A01: "Adreno 740", 0x43050B00: "Adreno 740v3", 0x43050C01: "Adreno X1-85",
              0x43051401: "Adreno 750"}


def adreno_generation(chip_id: int) -> int:
  """6 or 7: which Adreno compute stream (A6XX or A7XX) a KGSL chip id takes, else 0 (unknown)."""
  core, major, _ = kgsl.chip_generation(chip_id)
  if core == 6: return 6
  if core == 7: return 7 if major >= 3 else 6
  return 7 if core == 0x43 else 0


class KGSLDevice:
  """One Adreno GPU through KGSL, with one draw context. ops: the kernel (KGSLOps; a FakeKGSL in tests)."""

  def __init__(self, ops: KGSLOps | None = None):
    self.ops = ops = ops or KGSLOps()
    if not ops.exists(kgsl.DEVICE): raise DeviceUnavailable(f"{kgsl.DEVICE} does not exist", Reason.NO_DEVICE, DRIVER_HINT)
    try: self.fd = ops.open(kgsl.DEVICE)
    except OSError as e:
      raise DeviceUnavailable(f"cannot open {kgsl.DEVICE}: {e.strerror}", Reason.OPEN_FAILED,
                              "check the device file's permissions (on Android, the app's SELinux domain must allow it)") from e
    self.memory: dict[int, GpuMem] = {}
    self.user: dict[int, int] = {}  # host memory mapped for the GPU: its GPU address -> the mapping's (page-aligned) address
    self.closed, self.ctx = False, 0
    info = kgsl.DevInfo()
    self.getproperty(kgsl.KGSL_PROP_DEVICE_INFO, info)
    self.chip_id, self.generation = info.chip_id, adreno_generation(info.chip_id)
    if not self.generation:
      ops.close(self.fd)
      raise DeviceUnavailable(f"the KGSL GPU has chip id {info.chip_id:#010x}: plugrt-qcom knows the Adreno 6xx and 7xx command streams only",
                              Reason.NO_DEVICE, "use the CL device (plugrt-cl) with Qualcomm's OpenCL driver on this GPU")
    self.ctx = self.ioctl(kgsl.IOCTL_KGSL_DRAWCTXT_CREATE, kgsl.DrawctxtCreate(flags=CONTEXT_FLAGS)).drawctxt_id
    # one command object and one submission, reused for every submission (nothing allocated per launch)
    self._obj = kgsl.CommandObject(flags=kgsl.KGSL_CMDLIST_IB)
    self._cmd = kgsl.GpuCommand(cmdlist=ctypes.addressof(self._obj), cmdsize=ctypes.sizeof(kgsl.CommandObject), numcmds=1, context_id=self.ctx)
    self._wait = kgsl.DeviceWaitTimestampCtxtId(context_id=self.ctx)

  @property
  def name(self) -> str:
    core, major, minor = kgsl.chip_generation(self.chip_id)
    if core in (6, 7): return f"Adreno {core}{major}{minor}"
    return A7XX_NAMES.get(self.chip_id, f"Adreno {self.generation}xx (chip id {self.chip_id:#010x})")

  def ioctl(self, request: int, arg: Any) -> Any:
    self.ops.ioctl(self.fd, request, arg)
    return arg

  def getproperty(self, prop: int, out: ctypes.Structure | ctypes.c_uint32) -> None:
    self.ioctl(kgsl.IOCTL_KGSL_DEVICE_GETPROPERTY, kgsl.DeviceGetProperty(type=prop, value=ctypes.addressof(out), sizebytes=ctypes.sizeof(out)))

  # ------------------------------------------------------------ memory
  def alloc(self, size: int, *, uncached: bool = False, kind: int = kgsl.KGSL_MEMTYPE_CL) -> GpuMem:
    """A GPU object of at least `size` bytes, mapped for the CPU at its GPU address; MemoryError when the GPU's memory is full."""
    size = round_up(max(size, 1), PAGE)
    flags = (kgsl.KGSL_MEMFLAGS_USE_CPU_MAP | kgsl.field(12, kgsl.KGSL_MEMALIGN_SHIFT, kgsl.KGSL_MEMALIGN_MASK)
             | kgsl.field(kind, kgsl.KGSL_MEMTYPE_SHIFT, kgsl.KGSL_MEMTYPE_MASK)
             | kgsl.field(kgsl.KGSL_CACHEMODE_UNCACHED if uncached else kgsl.KGSL_CACHEMODE_WRITECOMBINE, kgsl.KGSL_CACHEMODE_SHIFT,
                          kgsl.KGSL_CACHEMODE_MASK))
    try: a = self.ioctl(kgsl.IOCTL_KGSL_GPUOBJ_ALLOC, kgsl.GpuobjAlloc(size=size, flags=flags, mmapsize=size))
    except OSError as e:
      if e.errno == errno.ENOMEM: raise MemoryError(f"KGSL: no room for {size} bytes of GPU memory") from e
      raise
    try: va = self.ops.mmap(a.mmapsize, self.fd, a.id << 12)
    except OSError:
      self.ioctl(kgsl.IOCTL_KGSL_GPUOBJ_FREE, kgsl.GpuobjFree(id=a.id))
      raise
    info = self.ioctl(kgsl.IOCTL_KGSL_GPUOBJ_INFO, kgsl.GpuobjInfo(id=a.id))
    mem = GpuMem(va, size, a.id, a.mmapsize)
    if info.gpuaddr != va:  # USE_CPU_MAP: the driver places the GPU mapping at the CPU's; plugrt relies on that
      self.free(mem)
      raise KGSLError(f"KGSL mapped object {a.id} at GPU address {info.gpuaddr:#x} but CPU address {va:#x}",
                      "this driver does not honour KGSL_MEMFLAGS_USE_CPU_MAP; plugrt-qcom needs one address for both")
    self.memory[va] = mem
    return mem

  def free(self, mem: GpuMem) -> None:
    self.memory.pop(mem.va, None)
    self.ops.munmap(mem.va, mem.mmapsize)
    self.ioctl(kgsl.IOCTL_KGSL_GPUOBJ_FREE, kgsl.GpuobjFree(id=mem.id))

  def map_host(self, ptr: int, size: int) -> int | None:
    """The GPU address of host memory [ptr, ptr+size) mapped for the GPU (MAP_USER_MEM, whole pages), or None when the
    driver says it is not host memory the process owns (EFAULT: an address of GPU memory, such as a cl_mem's)."""
    start, end = ptr & ~(PAGE - 1), round_up(ptr + size, PAGE)
    try: m = self.ioctl(kgsl.IOCTL_KGSL_MAP_USER_MEM, kgsl.MapUserMem(fd=-1, len=end - start, hostptr=start, memtype=kgsl.KGSL_USER_MEM_TYPE_ADDR))
    except OSError as e:
      if e.errno == errno.EFAULT: return None
      raise
    self.user[m.gpuaddr + (ptr - start)] = m.gpuaddr
    return m.gpuaddr + (ptr - start)

  def unmap_host(self, gpuaddr: int) -> None:
    if (base := self.user.pop(gpuaddr, None)) is not None: self.ioctl(kgsl.IOCTL_KGSL_SHAREDMEM_FREE, kgsl.SharedmemFree(gpuaddr=base))

  # ------------------------------------------------------------ submission and waits
  def submit(self, ib: int, nbytes: int) -> int:
    """Run the indirect buffer of `nbytes` at GPU address `ib` after everything submitted before; the context timestamp."""
    self._obj.gpuaddr, self._obj.size = ib, nbytes
    self.ops.ioctl(self.fd, kgsl.IOCTL_KGSL_GPU_COMMAND, self._cmd)
    return self._cmd.timestamp

  def wait_timestamp(self, timestamp: int, timeout_ms: int) -> bool:
    """Block until the context's `timestamp` retires (True) or `timeout_ms` pass (False); OSError for anything else
    the driver says (EDEADLK, EIO: the context was invalidated by a fault)."""
    self._wait.timestamp, self._wait.timeout = timestamp & 0xFFFFFFFF, timeout_ms
    try: self.ops.ioctl(self.fd, kgsl.IOCTL_KGSL_DEVICE_WAITTIMESTAMP_CTXTID, self._wait)
    except OSError as e:
      if e.errno in (errno.ETIMEDOUT, errno.EBUSY): return False
      raise
    return True

  def retired(self) -> int:
    """The context's last retired timestamp."""
    return self.ioctl(kgsl.IOCTL_KGSL_CMDSTREAM_READTIMESTAMP_CTXTID,
                      kgsl.CmdstreamReadTimestampCtxtId(context_id=self.ctx, type=kgsl.KGSL_TIMESTAMP_RETIRED)).timestamp

  def reset_status(self) -> int:
    """The context's kgsl_ctx_reset_stat (0: no reset)."""
    v = ctypes.c_uint32(self.ctx)
    self.getproperty(kgsl.KGSL_PROP_GPU_RESET_STAT, v)
    return v.value

  def fault(self) -> str:
    """What the driver says happened to the context ("" while nothing did)."""
    try: stat = self.reset_status()
    except OSError as e: return f"the driver refuses GPU_RESET_STAT ({e.strerror})"
    return {kgsl.KGSL_CTX_STAT_NO_ERROR: "",
            kgsl.KGSL_CTX_STAT_GUILTY_CONTEXT_RESET_EXT: "the driver reset the GPU after a fault in this context",
            kgsl.KGSL_CTX_STAT_INNOCENT_CONTEXT_RESET_EXT: "the driver reset the GPU after another context's fault",
            }.get(stat, f"the driver reset the GPU (reset status {stat})")

  def close(self) -> None:
    if self.closed: return
    self.closed = True
    for m in list(self.memory.values()): self.free(m)
    for a in list(self.user): self.unmap_host(a)
    if self.ctx: self.ioctl(kgsl.IOCTL_KGSL_DRAWCTXT_DESTROY, kgsl.DrawctxtDestroy(drawctxt_id=self.ctx))
    self.ops.close(self.fd)


class KGSLTimeline(Timeline):
  """The submission counter: a 32-bit word in a GPU object that each submission's CP_EVENT_WRITE stores. Each
  timeline value is one GPU_COMMAND, so value v is context timestamp v + `ts_base`, which the driver's wait takes."""
  error: type[QueueError] = KGSLError
  WAIT_SLICE_MS = 20

  def init_timeline(self, device: KGSLDevice, counter: int, *, timeout: float, label: str, setting: str) -> None:
    Timeline.__init__(self, counter, timeout=timeout, label=label, setting=setting, bits=32)
    self.kgsl, self.ts_base = device, None  # ts_base: context timestamp minus timeline value, from the first submission
    self.faulted = ""
    self.closed = False  # once the device is closed its counter's memory is gone: nothing may read it

  def submitted(self, value: int, timestamp: int) -> None:
    if self.ts_base is None: self.ts_base = timestamp - value
    elif timestamp - value != self.ts_base: self.ts_base = -1  # the driver numbers differently: poll memory only

  def wait(self, value: int, timeout: float | None = None) -> None:
    if self.done >= value: return
    if self.closed: raise KGSLError(f"{self.label} is closed", "open the device again")
    for _ in range(self.SPINS):
      if self.completed() >= value: return
    limit = self.timeout if timeout is None else timeout
    deadline = time.monotonic() + limit
    while self.completed() < value:
      if self.fault(): self.fail(f"the GPU reported an error while running submission {value}", value)
      left = deadline - time.monotonic()
      if left <= 0: self.fail(f"the GPU did not finish submission {value} within {limit:g} s (timeline at {self.completed()})", value, True)
      ms = max(1, min(self.WAIT_SLICE_MS, int(left * 1000)))
      if self.ts_base is None or self.ts_base < 0: time.sleep(ms / 1000 / 20)
      else:
        try: self.kgsl.wait_timestamp(value + self.ts_base, ms)
        except OSError as e: self.faulted = f"the driver's wait failed: {e.strerror or e}"  # the next turn reports it

  def fault(self) -> str: return "; ".join(s for s in (self.kgsl.fault(), self.faulted) if s)

  def fail(self, what: str, value: int | None = None, timed_out: bool = False) -> NoReturn:
    self.error = KGSLTimeout if timed_out and not self.fault() else KGSLFault
    super().fail(what, value, timed_out)
