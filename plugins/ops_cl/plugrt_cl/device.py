"""Opening an OpenCL device (platform choice, context, queue) and its memory.

One context and one in-order queue per device, the queue created with profiling on so
that `wait=True` launches are timed by the device's own events. A buffer handle is a
`CLMem`: the cl.Buffer of the allocation plus a byte offset, so that views at any
offset work on every platform (sub-buffers must start at CL_DEVICE_MEM_BASE_ADDR_ALIGN,
512 bytes on NVIDIA); kernels take each buffer as (base pointer, byte offset). An image (dtypes.imagef/imageh) is a CLMem whose `buf` is
a cl.Image (CL_RGBA, CL_FLOAT or CL_HALF_FLOAT, width w and height h) and whose `image` is its ImageDType; it is
copied in and out as h rows of w*4 packed scalars (row pitch 0: packed), which is the core's image layout.
"""
from __future__ import annotations

import ctypes
import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pyopencl as cl

from plugrt.errors import DeviceUnavailable, Reason
from plugrt.hookspecs import DeviceInfo
from plugrt.runtime import MAX_LAUNCH_THREADS, Allocator, DeviceState, LaunchLimits, size_str
from plugrt_cl import icd
from plugrt_cl.icd import NO_PLATFORM_HINT

_OOM = {cl.status_code.MEM_OBJECT_ALLOCATION_FAILURE, cl.status_code.OUT_OF_RESOURCES, cl.status_code.OUT_OF_HOST_MEMORY,
        cl.status_code.INVALID_BUFFER_SIZE}


def describe(platforms: list[Any]) -> str:
  out = []
  for i, p in enumerate(platforms):
    try: n = len(p.get_devices())
    except cl.Error: n = 0
    out.append(f"{i}: {p.name} ({p.version.strip()}, {n} device{'s' if n != 1 else ''})")
  return "; ".join(out)


def choose_platform(platforms: list[Any], arch: str, env: Mapping[str, str]) -> Any:
  """The platform DEV=CL::<arch> or CL_PLATFORM (of `env`, the device's context) names, else the first that has a device."""
  selector, source = icd.requested_platform(arch, env)
  if selector:
    for i, p in enumerate(platforms):
      if icd.matches(selector, i, p.name, p.vendor, p.version): return p
    raise DeviceUnavailable(f"{source}: no OpenCL platform matches {selector!r}; platforms here: {describe(platforms)}", Reason.NO_DEVICE,
                            "name a platform by its index or a part of its name, vendor or version, e.g. CL_PLATFORM=pocl")
  for p in platforms:
    try:
      if p.get_devices(): return p
    except cl.Error: continue
  raise DeviceUnavailable(f"no OpenCL platform has a device: {describe(platforms)}", Reason.NO_DEVICE, NO_PLATFORM_HINT)


@dataclass
class CLState(DeviceState):
  """What a CL device's allocator, compiler and programs share."""
  platform: Any
  device: Any
  context: Any
  queue: Any
  label: str                      # "CL:1 (pthread-skylake on Portable Computing Language)"
  fp64: bool
  host_memory: bool               # the device computes on host memory: from_blob can wrap
  max_group: int                  # CL_DEVICE_MAX_WORK_GROUP_SIZE
  max_items: tuple[int, ...]      # CL_DEVICE_MAX_WORK_ITEM_SIZES
  max_alloc: int                  # CL_DEVICE_MAX_MEM_ALLOC_SIZE
  max_local: int                  # CL_DEVICE_LOCAL_MEM_SIZE: a group's shared arrays
  fresh: dict[bytes, Any] = field(default_factory=dict)  # binary -> its program as just built (so loading it builds nothing again)
  wrapped: weakref.WeakSet = field(default_factory=weakref.WeakSet)  # live CLMems of from_blob memory (CLAllocator._wrap)
  #: held while wrapped memory is mapped, and while `wrapped` changes: two threads' maps of one USE_HOST_PTR buffer share
  #: its host pointer, so the second unmap fails (INVALID_VALUE) and pyopencl's unmap error ends the process
  wrap_lock: Any = field(default_factory=threading.Lock)
  max_image: tuple[int, int] | None = None  # (CL_DEVICE_IMAGE2D_MAX_HEIGHT, _WIDTH); None: the device has no images

  @property
  def launch_limits(self) -> LaunchLimits:
    """Groups of at most CL_DEVICE_MAX_WORK_GROUP_SIZE threads, CL_DEVICE_MAX_WORK_ITEM_SIZES per axis. OpenCL's sizes and ids
    are size_t, but the renderer reads them as the IR's int32 ids: the core's bound of 2**31-1 threads per axis holds too.
    PoCL's CPU scheduler aborts the process (an assertion in get_wg_index_range) on a grid of 2**33 groups, and runs
    one of 2**32: its grids stay below 2**32 groups."""
    pocl = "portable computing language" in str(self.platform.name).lower()
    return LaunchLimits(self.label, max_local=(tuple(self.max_items) + (1, 1, 1))[:3], max_local_total=self.max_group,
                        max_groups_total=(1 << 32) - 1 if pocl else MAX_LAUNCH_THREADS)

  def synchronize(self) -> None:
    self.queue.finish()
    # CL_MEM_USE_HOST_PTR memory is only defined on the host while it is mapped (a driver may cache it on the device):
    # a map brings the owner's memory up to date with every write queued before, and the unmap gives it back
    with self.wrap_lock:
      for mem in list(self.wrapped):
        if mem.image is not None:
          host = cl.enqueue_map_image(self.queue, mem.buf, cl.map_flags.READ, (0, 0), (mem.image.width, mem.image.height),
                                      (mem.image.height, mem.image.width, 4), mem.image.numpy, is_blocking=True)[0]  # (array, event, pitches)
        else: host, _ = cl.enqueue_map_buffer(self.queue, mem.buf, cl.map_flags.READ, 0, (mem.buf.size,), "uint8", is_blocking=True)
        host.base.release(self.queue)
      if self.wrapped: self.queue.finish()

  def close(self) -> None:
    self.queue.finish()
    self.fresh.clear()


def open_device(info: DeviceInfo) -> CLState:
  try: platforms = cl.get_platforms()
  except cl.Error as e:
    raise DeviceUnavailable(f"{info.canonical}: the OpenCL ICD loader found no platform ({e})", Reason.NO_DEVICE, NO_PLATFORM_HINT) from None
  plat = choose_platform(platforms, info.arch, info.context.env)
  devs = plat.get_devices()
  if info.index >= len(devs):
    raise DeviceUnavailable(f"{info.canonical} does not exist: platform {plat.name} has {len(devs)} device{'s' if len(devs) != 1 else ''}",
                            Reason.NO_DEVICE, f"use an index below {len(devs)}, or pick another platform with CL_PLATFORM")
  dev = devs[info.index]
  try:
    ctx = cl.Context([dev])
    queue = cl.CommandQueue(ctx, dev, cl.command_queue_properties.PROFILING_ENABLE)
  except cl.Error as e:
    raise DeviceUnavailable(f"{info.canonical}: cannot open {dev.name.strip()}: {e}", Reason.OPEN_FAILED,
                            "check the OpenCL driver with `clinfo`") from None
  exts = dev.extensions.split()
  fp64 = "cl_khr_fp64" in exts or bool(_get(dev, "double_fp_config", 0))
  unified = bool(_get(dev, "host_unified_memory", False)) and dev.type & cl.device_type.CPU != 0
  images = (_get(dev, "image2d_max_height", 0), _get(dev, "image2d_max_width", 0)) if _get(dev, "image_support", False) else None
  return CLState(plat, dev, ctx, queue, f"{info.canonical} ({dev.name.strip()} on {plat.name.strip()})", fp64, unified,
                 dev.max_work_group_size, tuple(dev.max_work_item_sizes), dev.max_mem_alloc_size, dev.local_mem_size, max_image=images)


def _get(dev: Any, attr: str, default: Any) -> Any:
  try: return getattr(dev, attr)
  except (cl.Error, AttributeError): return default  # an attribute a platform does not report (deprecated, optional)


def state_of(info: DeviceInfo) -> CLState:
  if not isinstance(info.state, CLState): raise DeviceUnavailable(f"{info.canonical} was not opened by plugrt-cl", Reason.HOOK_ERROR)
  return info.state


# ---------------------------------------------------------------- memory

class CLMem:
  """A buffer handle: the allocation and a byte offset into it (an image: the cl.Image, offset 0, and its ImageDType)."""
  __slots__ = ("__weakref__", "buf", "host", "image", "offset")

  def __init__(self, buf: Any, offset: int = 0, host: Any = None, image: Any = None):
    self.buf, self.offset, self.host = buf, offset, host  # host: the wrapped memory's owner view (from_blob), kept alive
    self.image = image  # the ImageDType of an image, else None

  def __repr__(self) -> str: return f"<CLMem {self.buf.int_ptr:#x}+{self.offset}>"


class CLAllocator(Allocator[CLMem]):
  supports_transfer = True

  def __init__(self, device: DeviceInfo):
    super().__init__(device)
    self.state = state_of(device)
    # from_blob wraps for real only where kernels run on host memory (CL_MEM_USE_HOST_PTR on a CPU device);
    # a GPU driver would copy it behind plugrt's back, so there it refuses
    self.supports_wrap = self.state.host_memory
    self.supports_images, self.max_image = self.state.max_image is not None, self.state.max_image

  def _image_format(self, image: Any) -> Any:
    ct = cl.channel_type.FLOAT if image.base.itemsize == 4 else cl.channel_type.HALF_FLOAT
    return cl.ImageFormat(cl.channel_order.RGBA, ct)

  def _alloc_image(self, image: Any, flags: int, host: Any = None) -> CLMem:
    try: img = cl.create_image(self.state.context, flags, self._image_format(image), (image.width, image.height), hostbuf=host)
    except cl.Error as e:
      if e.code in _OOM: raise MemoryError(str(e)) from None
      raise
    return CLMem(img, 0, host, image)

  def _alloc(self, nbytes: int, options: Any) -> CLMem:
    if options is not None: return self._alloc_image(options, cl.mem_flags.READ_WRITE)  # an ImageDType (Allocator.alloc checked it)
    if nbytes > self.state.max_alloc:
      raise MemoryError(f"{size_str(nbytes)} is over the device's largest allocation ({size_str(self.state.max_alloc)})")
    try: return CLMem(cl.Buffer(self.state.context, cl.mem_flags.READ_WRITE, nbytes))
    except cl.Error as e:
      if e.code in _OOM: raise MemoryError(str(e)) from None
      raise

  def _free(self, handle: CLMem, nbytes: int, options: Any) -> None:
    try: handle.buf.release()
    except cl.Error: pass  # already released (interpreter shutdown)

  def _offset(self, handle: CLMem, offset: int, nbytes: int) -> CLMem: return CLMem(handle.buf, handle.offset + offset, handle.host)

  def _copyin(self, dest: CLMem, src: memoryview) -> None:
    if dest.image is not None:
      cl.enqueue_copy(self.state.queue, dest.buf, src, origin=(0, 0), region=(dest.image.width, dest.image.height), is_blocking=True)
    else: cl.enqueue_copy(self.state.queue, dest.buf, src, dst_offset=dest.offset, is_blocking=True)

  def _copyout(self, dest: memoryview, src: CLMem) -> None:
    if src.image is not None:
      cl.enqueue_copy(self.state.queue, dest, src.buf, origin=(0, 0), region=(src.image.width, src.image.height), is_blocking=True)
    else: cl.enqueue_copy(self.state.queue, dest, src.buf, src_offset=src.offset, is_blocking=True)

  def _transfer(self, dest: CLMem, src: CLMem, nbytes: int, src_dev: Any, dest_dev: Any) -> None:
    s, d = src_dev.allocator.state, dest_dev.allocator.state
    if src.image is not None or dest.image is not None:
      if src.image is dest.image and s.context is d.context and src.buf.int_ptr != dest.buf.int_ptr:  # image to image on the device
        cl.enqueue_copy(s.queue, dest.buf, src.buf, src_origin=(0, 0), dest_origin=(0, 0), region=(src.image.width, src.image.height))
        return
      host = bytearray(nbytes)  # an image to or from a plain buffer: through the host, which has the one layout both share
      src_dev.allocator._copyout(memoryview(host), src)
      dest_dev.allocator._copyin(dest, memoryview(host))
      return
    overlap = src.buf.int_ptr == dest.buf.int_ptr and src.offset < dest.offset + nbytes and dest.offset < src.offset + nbytes
    if s.context is d.context and not overlap:
      # same context: the device copies; in order on its queue, so later launches and reads see it
      cl.enqueue_copy(s.queue, dest.buf, src.buf, byte_count=nbytes, src_offset=src.offset, dst_offset=dest.offset)
      return
    # another device has its own context (OpenCL cannot copy between contexts), or the ranges overlap: through the host
    host = bytearray(nbytes)
    src_dev.allocator._copyout(memoryview(host), src)
    dest_dev.allocator._copyin(dest, memoryview(host))

  def _wrap_image(self, ptr: int, nbytes: int, image: Any) -> CLMem:
    """Host memory holding the image's packed texels, as a CL_MEM_USE_HOST_PTR image (a CPU device computes on it)."""
    host = (ctypes.c_char * nbytes).from_address(ptr)
    try: mem = self._alloc_image(image, cl.mem_flags.READ_WRITE | cl.mem_flags.USE_HOST_PTR, host)
    except (cl.Error, MemoryError) as e:
      raise MemoryError(f"{self.state.label} cannot wrap {image!r} at {ptr:#x}: {e}") from None
    return self._track(mem)

  def _wrap(self, ptr: int, nbytes: int) -> CLMem:
    host = (ctypes.c_char * nbytes).from_address(ptr)
    try: buf = cl.Buffer(self.state.context, cl.mem_flags.READ_WRITE | cl.mem_flags.USE_HOST_PTR, hostbuf=host)
    except cl.Error as e:
      raise MemoryError(f"{self.state.label} cannot wrap {size_str(nbytes)} at {ptr:#x}: {e}") from None
    return self._track(CLMem(buf, 0, host))

  def _track(self, mem: CLMem) -> CLMem:
    """A new CLMem of wrapped memory: synchronize() maps it while it lives, so that its owner sees what kernels wrote.
    When it goes (its Buffer and every view are dropped) its CL memory is released: a kernel's arguments keep the cl
    object last set (CLProgram compares them by identity), which would keep CL memory over the owner's memory, which the
    owner may then free (OpenCL lets USE_HOST_PTR memory be freed only once its memory object is destroyed)."""
    with self.state.wrap_lock: self.state.wrapped.add(mem)
    weakref.finalize(mem, _release, mem.buf).atexit = False  # (at exit the driver may be gone: nothing to release)
    return mem


def _release(buf: Any) -> None:
  try: buf.release()
  except cl.Error: pass  # already released (interpreter shutdown)
