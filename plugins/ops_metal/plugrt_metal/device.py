"""Opening a Metal device (MTLDevice, one command queue) and its memory (MTLBuffers in shared storage).

Everything here reaches Metal through plugrt_metal.objc's Runtime: `Calls` holds the typed objc_msgSend functions and
the selectors, made once per device. Completion: Metal runs one queue's command buffers in the order they were
committed, so waiting for the last one waits for all; the wait is bounded (PLUGRT_METAL_TIMEOUT seconds, polling the
command buffer's status) and a command buffer that ends in error raises MetalCommandError with the framework's
NSError. Memory is MTLResourceStorageModeShared: the CPU reads and writes it at `contents`, after the queue is idle.
"""
from __future__ import annotations

import ctypes
import time
import weakref
from types import SimpleNamespace
from typing import Any

from plugrt.errors import DeviceUnavailable, PluginError, Reason, UnsupportedError
from plugrt.frontend.dlpack import KDL_METAL
from plugrt.hookspecs import DeviceInfo
from plugrt.runtime import Allocator, DeviceState, LaunchLimits, size_str
from plugrt_metal.macos import msl_version_for_macos
from plugrt_metal.objc import BOOL, ID, SEL, MTLSize, NSInteger, NSRange, NSUInteger, runtime

# MTLResourceOptions (MTLResource.h): storage mode in bits 4..7; shared = 0, the CPU cache mode default = 0
MTL_RESOURCE_STORAGE_MODE_SHARED = 0 << 4
# MTLCommandBufferStatus (MTLCommandBuffer.h)
STATUS_NOT_ENQUEUED, STATUS_ENQUEUED, STATUS_COMMITTED, STATUS_SCHEDULED, STATUS_COMPLETED, STATUS_ERROR = range(6)
STATUS_NAMES = ("not enqueued", "enqueued", "committed", "scheduled", "completed", "error")

SELECTORS = (
  "alloc", "init", "retain", "release", "respondsToSelector:", "initWithUTF8String:", "UTF8String", "localizedDescription", "code",
  "name", "newCommandQueue", "maxThreadsPerThreadgroup", "maxBufferLength", "hasUnifiedMemory", "registryID",
  "newBufferWithLength:options:", "newBufferWithBytesNoCopy:length:options:deallocator:", "contents", "length", "device",
  "setFastMathEnabled:", "setMathMode:", "setLanguageVersion:", "newLibraryWithSource:options:error:", "newLibraryWithData:error:",
  "newFunctionWithName:", "newComputePipelineStateWithFunction:error:", "maxTotalThreadsPerThreadgroup", "threadExecutionWidth",
  "commandBuffer", "computeCommandEncoder", "setComputePipelineState:", "setBuffer:offset:atIndex:", "setBytes:length:atIndex:",
  "dispatchThreadgroups:threadsPerThreadgroup:", "endEncoding", "commit", "waitUntilCompleted", "status", "error",
  "GPUStartTime", "GPUEndTime",
  # pipelines usable from indirect command buffers, and the buffers themselves (plugrt_metal.graph)
  "setComputeFunction:", "setSupportIndirectCommandBuffers:", "newComputePipelineStateWithDescriptor:options:reflection:error:",
  "setCommandTypes:", "setInheritBuffers:", "setInheritPipelineState:", "setMaxKernelBufferBindCount:",
  "newIndirectCommandBufferWithDescriptor:maxCommandCount:options:", "indirectComputeCommandAtIndex:", "setKernelBuffer:offset:atIndex:",
  "concurrentDispatchThreadgroups:threadsPerThreadgroup:", "setBarrier", "useResources:count:usage:", "executeCommandsInBuffer:withRange:")


def sel_attr(name: str) -> str:
  """The attribute of Calls.S holding a selector: 'setBuffer:offset:atIndex:' -> 'setBuffer_offset_atIndex_'."""
  return name.replace(":", "_")


class MetalError(PluginError):
  """Metal reported a failure (an NSError, or a nil object where one was due)."""


class MetalTimeoutError(MetalError, TimeoutError):
  """A command buffer did not complete within PLUGRT_METAL_TIMEOUT."""


class MetalCommandError(MetalError):
  """A command buffer ended in MTLCommandBufferStatusError; the message holds its NSError."""


class Calls:
  """The typed objc_msgSend functions Metal needs, one per prototype, and every selector (as S.<name with _ for :>).
  Made once per device; a launch uses these attributes and nothing else of the runtime."""

  def __init__(self, rt: Any):
    self.rt = rt
    send, err = rt.send, ctypes.POINTER(ctypes.c_void_p)
    self.id, self.void, self.ulong, self.long = send(ID), send(None), send(NSUInteger), send(NSInteger)
    self.double, self.bool, self.cstr, self.size = send(ctypes.c_double), send(BOOL), send(ctypes.c_char_p), send(MTLSize)
    self.id_id, self.void_id, self.void_bool, self.void_ulong = send(ID, ID), send(None, ID), send(None, BOOL), send(None, NSUInteger)
    self.bool_sel, self.id_cstr = send(BOOL, SEL), send(ID, ctypes.c_char_p)
    self.id_ulong_ulong = send(ID, NSUInteger, NSUInteger)                                 # newBufferWithLength:options:
    self.id_ptr_ulong_ulong_id = send(ID, ctypes.c_void_p, NSUInteger, NSUInteger, ID)     # newBufferWithBytesNoCopy:...
    self.id_id_id_err = send(ID, ID, ID, err)                                               # newLibraryWithSource:options:error:
    self.id_id_err = send(ID, ID, err)                     # newLibraryWithData:error:, newComputePipelineStateWithFunction:error:
    self.set_buffer = send(None, ID, NSUInteger, NSUInteger)                                # setBuffer:offset:atIndex:
    self.set_bytes = send(None, ctypes.c_char_p, NSUInteger, NSUInteger)                   # setBytes:length:atIndex:
    self.dispatch = send(None, MTLSize, MTLSize)                                            # dispatchThreadgroups:threadsPerThreadgroup:
    self.id_id_ulong_ptr_err = send(ID, ID, NSUInteger, ctypes.c_void_p, err)               # newComputePipelineStateWithDescriptor:...
    self.id_id_ulong_ulong = send(ID, ID, NSUInteger, NSUInteger)                           # newIndirectCommandBufferWithDescriptor:...
    self.id_ulong = send(ID, NSUInteger)                                                    # indirectComputeCommandAtIndex:
    self.use_resources = send(None, ctypes.c_void_p, NSUInteger, NSUInteger)                # useResources:count:usage:
    self.execute = send(None, ID, NSRange)                                                  # executeCommandsInBuffer:withRange:
    self.S = SimpleNamespace(**{sel_attr(n): rt.sel(n) for n in SELECTORS})

  # ---- helpers for what runs once (open, compile, load); never on the launch path
  def new(self, cls_name: str) -> int:
    cls = self.rt.cls(cls_name)
    if not cls: raise MetalError(f"the Objective-C runtime has no class {cls_name}")
    obj = self.id(self.id(cls, self.S.alloc), self.S.init)
    if not obj: raise MetalError(f"[[{cls_name} alloc] init] returned nil")
    return obj

  def nsstring(self, text: str) -> int:
    """A new NSString (owned: release it) holding `text`."""
    s = self.id_cstr(self.id(self.rt.cls("NSString"), self.S.alloc), self.S.initWithUTF8String_, text.encode())
    if not s: raise MetalError("cannot make an NSString (the text is not valid UTF-8?)")
    return s

  def string(self, nsstring: int | None) -> str:
    if not nsstring: return ""
    raw = self.cstr(nsstring, self.S.UTF8String)
    return raw.decode(errors="replace") if raw else ""

  def error_text(self, nserror: int | None) -> str:
    """An NSError's localizedDescription and code."""
    if not nserror: return "no NSError given"
    return f"{self.string(self.id(nserror, self.S.localizedDescription))} (code {self.long(nserror, self.S.code)})"

  def release(self, obj: int | None) -> None:
    if obj: self.void(obj, self.S.release)

  def responds(self, obj: int, name: str) -> bool: return bool(self.bool_sel(obj, self.S.respondsToSelector_, self.rt.sel(name)))


class MetalState(DeviceState):
  """What a Metal device's allocator, compiler and programs share."""

  def __init__(self, info: DeviceInfo, rt: Any, calls: Calls, device: int, queue: int, msl_version: tuple[int, int]):
    self.info, self.rt, self.calls, self.device, self.queue = info, rt, calls, device, queue
    c, S = calls, calls.S
    self.name = c.string(c.id(device, S.name)) or "Metal device"
    self.label = f"{info.canonical} ({self.name})"
    self.msl_version = msl_version
    self.unified = bool(c.bool(device, S.hasUnifiedMemory)) if c.responds(device, "hasUnifiedMemory") else False
    self.max_buffer = int(c.ulong(device, S.maxBufferLength))
    mt = c.size(device, S.maxThreadsPerThreadgroup)
    self.max_threads = (int(mt.width), int(mt.height), int(mt.depth))
    self.timeout = info.context.number("PLUGRT_METAL_TIMEOUT", 60.0, lo=0, unit="seconds")
    self.page_size = info.context.integer("PLUGRT_METAL_PAGE_SIZE", _page_size(), lo=1)
    self.last: int | None = None       # the last committed command buffer (retained), or None when all are known done
    self.pipelines: dict[tuple[bytes, str], Any] = {}  # (binary, kernel name) -> (library, function, pipeline): built once
    self.fresh: dict[bytes, int] = {}  # binary -> the library compile_uncached just built (so the loader builds nothing again)

  def launch_limits(self, max_total: int) -> LaunchLimits:
    """Groups of at most `max_total` threads (the pipeline's maxTotalThreadsPerThreadgroup), the device's
    maxThreadsPerThreadgroup per axis."""
    return LaunchLimits(self.label, max_local=self.max_threads, max_local_total=max_total)

  def committed(self, cb: int) -> None:
    """`cb` was just committed (and retained): it becomes the one synchronize waits for."""
    prev, self.last = self.last, cb
    if prev: self.calls.void(prev, self.calls.S.release)

  def wait(self, cb: int) -> None:
    """Wait for command buffer `cb`, at most self.timeout seconds (0: no limit); raise on its error status."""
    c, S = self.calls, self.calls.S
    status = c.ulong(cb, S.status)
    if status < STATUS_COMPLETED:
      if not self.timeout: c.void(cb, S.waitUntilCompleted)
      else:
        deadline, pause = time.monotonic() + self.timeout, 0.0
        while (status := c.ulong(cb, S.status)) < STATUS_COMPLETED:
          if time.monotonic() > deadline:
            raise MetalTimeoutError(f"{self.label}: a command buffer did not complete within {self.timeout:g} s "
                                    f"(status: {STATUS_NAMES[status] if status < len(STATUS_NAMES) else status})",
                                    "a kernel may loop forever; raise PLUGRT_METAL_TIMEOUT (seconds, 0: no limit) if it is only slow")
          time.sleep(pause)
          pause = min(pause * 2 or 20e-6, 1e-3)
    status = c.ulong(cb, S.status)
    if status == STATUS_ERROR:
      if cb == self.last: self.committed(0)  # reported once; later work starts afresh
      raise MetalCommandError(f"{self.label}: a command buffer failed: {c.error_text(c.id(cb, S.error))}",
                              "a kernel read or wrote outside its buffers, or the GPU was reset; the device's later work may fail too")

  def gpu_seconds(self, cb: int) -> float:
    c, S = self.calls, self.calls.S
    return max(0.0, c.double(cb, S.GPUEndTime) - c.double(cb, S.GPUStartTime))

  def synchronize(self) -> None:
    if (cb := self.last):
      self.wait(cb)
      if cb == self.last: self.committed(0)

  def close(self) -> None:
    try: self.synchronize()
    finally:
      self.fresh.clear()


def _page_size() -> int:
  import mmap
  return mmap.PAGESIZE


def open_device(info: DeviceInfo) -> MetalState:
  if info.index != 0:
    raise DeviceUnavailable(f"{info.canonical} does not exist: plugrt opens Metal's system default device only (METAL:0)", Reason.NO_DEVICE,
                            "use METAL")
  rt = runtime()
  calls = Calls(rt)
  dev = rt.create_system_default_device()
  if not dev:
    raise DeviceUnavailable(f"{info.canonical}: MTLCreateSystemDefaultDevice returned no device", Reason.NO_DEVICE,
                            "Metal needs a Mac with a Metal GPU (every Apple-silicon Mac has one); in a VM, pass the GPU through")
  queue = calls.id(dev, calls.S.newCommandQueue)
  if not queue: raise DeviceUnavailable(f"{info.canonical}: newCommandQueue returned nil", Reason.OPEN_FAILED, "retry; check Console.app")
  return MetalState(info, rt, calls, dev, queue, msl_version_for_macos(info.context))


def state_of(info: DeviceInfo) -> MetalState:
  if not isinstance(info.state, MetalState): raise DeviceUnavailable(f"{info.canonical} was not opened by plugrt-metal", Reason.HOOK_ERROR)
  return info.state


# ---------------------------------------------------------------- memory

class MetalMem:
  """A buffer handle: the MTLBuffer, a byte offset into it, and its contents pointer (shared storage)."""
  __slots__ = ("__weakref__", "buf", "host", "offset")

  def __init__(self, buf: int, offset: int, host: int):
    self.buf, self.offset, self.host = buf, offset, host

  def __repr__(self) -> str: return f"<MetalMem {self.buf:#x}+{self.offset}>"


class MetalAllocator(Allocator[MetalMem]):
  supports_wrap = True  # MPS buffers (an MTLBuffer's address) and page-aligned host memory on unified memory; see _wrap

  def __init__(self, device: DeviceInfo):
    super().__init__(device)
    self.state = state_of(device)
    self.max_alloc_bytes = min(self.max_alloc_bytes, self.state.max_buffer)

  def _alloc(self, nbytes: int, options: Any) -> MetalMem:
    c, S = self.state.calls, self.state.calls.S
    buf = c.id_ulong_ulong(self.state.device, S.newBufferWithLength_options_, nbytes, MTL_RESOURCE_STORAGE_MODE_SHARED)
    if not buf: raise MemoryError(f"newBufferWithLength:{nbytes} returned nil")
    return MetalMem(buf, 0, c.id(buf, S.contents))

  def _free(self, handle: MetalMem, nbytes: int, options: Any) -> None:
    self.state.calls.release(handle.buf)  # command buffers retain what they use: work still queued keeps it alive

  def _offset(self, handle: MetalMem, offset: int, nbytes: int) -> MetalMem:
    return MetalMem(handle.buf, handle.offset + offset, handle.host)

  def _copyin(self, dest: MetalMem, src: memoryview) -> None:
    self.state.synchronize()  # kernels queued before may still read or write it
    if src.nbytes: ctypes.memmove(dest.host + dest.offset, (ctypes.c_char * src.nbytes).from_buffer_copy(src) if src.readonly else
                                  (ctypes.c_char * src.nbytes).from_buffer(src), src.nbytes)

  def _copyout(self, dest: memoryview, src: MetalMem) -> None:
    self.state.synchronize()
    if dest.nbytes: ctypes.memmove((ctypes.c_char * dest.nbytes).from_buffer(dest), src.host + src.offset, dest.nbytes)

  def dlpack_device(self) -> tuple[int, int]: return (KDL_METAL, self.device.index)

  def _pointer(self, handle: MetalMem) -> int:
    """DLPack's data for Metal is the MTLBuffer itself (as PyTorch's MPS storage is); a view inside one has no such address."""
    if handle.offset:
      raise UnsupportedError("a view at a byte offset inside a Metal buffer cannot be exported through DLPack (its data is an MTLBuffer)",
                             "export the whole buffer, or copy the view into a buffer of its own")
    return handle.buf

  def _wrap(self, ptr: int, nbytes: int) -> MetalMem:
    """`ptr` is an MTLBuffer (what torch hands out for an MPS tensor) or, on unified memory, page-aligned host memory.

    Anything else is refused with UnsupportedError: plugrt never copies silently."""
    st = self.state
    c, S = st.calls, st.calls.S
    if st.rt.is_object_conforming(ptr, "MTLBuffer", ("contents", "length", "didModifyRange:")):
      length = int(c.ulong(ptr, S.length))
      if nbytes > length:
        raise ValueError(f"{st.label}: the MTLBuffer at {ptr:#x} holds {length} bytes; cannot wrap {nbytes}")
      owner = c.id(ptr, S.device)
      if owner != st.device:
        raise UnsupportedError(f"{st.label}: the MTLBuffer at {ptr:#x} belongs to another Metal device", "wrap it on the device that made it")
      return MetalMem(ptr, 0, c.id(ptr, S.contents))  # not retained: from_blob's keepalive (the torch tensor) owns it
    if not st.unified:
      raise UnsupportedError(f"{st.label} has no unified memory: it cannot compute on host memory at {ptr:#x}, and plugrt never copies "
                             "silently", "copy the data in with Buffer.copyin, or pass an MTLBuffer (an MPS tensor's data_ptr())")
    if ptr % st.page_size or nbytes % st.page_size or not nbytes:
      raise UnsupportedError(f"{st.label}: host memory at {ptr:#x} of {size_str(nbytes)} ({nbytes} bytes) is not page-aligned "
                             f"({st.page_size}-byte pages): Metal wraps host memory (newBufferWithBytesNoCopy) only in whole pages, "
                             "and plugrt never copies silently",
                             "allocate with mmap or Device.host_array in whole pages, copy the data in with Buffer.copyin, "
                             "or pass an MTLBuffer (an MPS tensor's data_ptr())")
    buf = c.id_ptr_ulong_ulong_id(st.device, S.newBufferWithBytesNoCopy_length_options_deallocator_, ptr, nbytes,
                                  MTL_RESOURCE_STORAGE_MODE_SHARED, None)
    if not buf: raise UnsupportedError(f"{st.label}: newBufferWithBytesNoCopy refused host memory at {ptr:#x} ({nbytes} bytes)",
                                       "copy the data in with Buffer.copyin")
    mem = MetalMem(buf, 0, ptr)
    weakref.finalize(mem, c.void, buf, S.release)  # the MTLBuffer object is ours; the memory stays the caller's
    return mem
