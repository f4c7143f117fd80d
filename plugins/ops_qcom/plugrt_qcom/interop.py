"""OpenCL interop on Qualcomm's driver: an app's `cl_mem` (buffer or image) as the GPU address and dtype that
`Tensor.from_blob` takes on QCOM, without a copy:

    info = cl_mem_info(mem)                               # a pyopencl MemoryObject, or the cl_mem handle as an int
    t = Tensor.from_blob(info.address, info.shape, dtype=info.dtype, device="QCOM")
    t = tensor_from_cl_mem(mem)                           # the same in one call (a buffer needs dtype= and shape=)

This is specific to Qualcomm's OpenCL driver: there the raw GPU address of a cl_mem is the 64-bit word at offset 0xA0
of the object the cl_mem handle points to (a fact of the driver's private object layout, which the seeds' system
relies on; see docs/research/qcom.md). The helper asks the cl_mem's own context for its platform and refuses, before
reading anything, any platform whose name or vendor is not Qualcomm's. An image must be CL_RGBA with CL_FLOAT or
CL_HALF_FLOAT channels, and its row pitch must be the one QCOM assumes (rows padded to 64 bytes). The app keeps the
cl_mem alive while the tensor uses it, and finishes its own queue before QCOM reads the memory.
"""
from __future__ import annotations

import ctypes
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from plugrt.dtype import DType, ImageDType, dtypes, image_dtype
from plugrt.errors import UnsupportedError
from plugrt_qcom import cmd, libcl

GPU_ADDRESS_OFFSET = 0xA0


@dataclass(frozen=True)
class CLMemInfo:
  """What Tensor.from_blob needs for a cl_mem: its GPU address, dtype (an image's ImageDType; None for a buffer, whose
  elements the caller names), shape (an image's (h, w, 4); a buffer's size in bytes as (n,)) and size in bytes."""
  address: int
  dtype: DType | None
  shape: tuple[int, ...]
  nbytes: int


class _Queries:
  """The few OpenCL queries the helper makes, on a loaded library (tests pass their own object with these methods)."""

  def __init__(self, cl: libcl.OpenCL): self.cl = cl

  def platform(self, mem: int) -> tuple[str, str]:
    cl = self.cl
    ctx = cl.info_int(cl.lib.clGetMemObjectInfo, mem, libcl.CL_MEM_CONTEXT)
    n = ctypes.c_size_t()
    cl.check(cl.lib.clGetContextInfo(ctx, libcl.CL_CONTEXT_DEVICES, 0, None, ctypes.byref(n)), "clGetContextInfo")
    devs = (ctypes.c_void_p * max(1, n.value // ctypes.sizeof(ctypes.c_void_p)))()
    cl.check(cl.lib.clGetContextInfo(ctx, libcl.CL_CONTEXT_DEVICES, n.value, devs, None), "clGetContextInfo")
    return cl.platform_names(cl.info_int(cl.lib.clGetDeviceInfo, devs[0], libcl.CL_DEVICE_PLATFORM))

  def mem_type(self, mem: int) -> int: return self.cl.info_int(self.cl.lib.clGetMemObjectInfo, mem, libcl.CL_MEM_TYPE, ctypes.c_uint32)
  def mem_size(self, mem: int) -> int: return self.cl.info_int(self.cl.lib.clGetMemObjectInfo, mem, libcl.CL_MEM_SIZE, ctypes.c_size_t)

  def image(self, mem: int) -> tuple[int, int, int, int, int]:
    """(channel order, channel type, width, height, row pitch)."""
    cl, fmt = self.cl, (ctypes.c_uint32 * 2)()
    cl.check(cl.lib.clGetImageInfo(mem, libcl.CL_IMAGE_FORMAT, ctypes.sizeof(fmt), fmt, None), "clGetImageInfo")
    get = lambda p: cl.info_int(cl.lib.clGetImageInfo, mem, p, ctypes.c_size_t)
    return fmt[0], fmt[1], get(libcl.CL_IMAGE_WIDTH), get(libcl.CL_IMAGE_HEIGHT), get(libcl.CL_IMAGE_ROW_PITCH)


def _handle(mem: Any) -> int:
  h = getattr(mem, "int_ptr", mem)  # pyopencl's MemoryObject, or the handle itself
  if not isinstance(h, int) or h <= 0: raise TypeError(f"not a cl_mem: {mem!r} (pass a pyopencl MemoryObject or the cl_mem handle as an int)")
  return h


def cl_mem_info(mem: Any, *, env: Mapping[str, str] | None = None, queries: Any = None) -> CLMemInfo:
  """The GPU address, dtype and shape of `mem` on Qualcomm's OpenCL driver; UnsupportedError on any other platform.
  env: where to look for the driver (PLUGRT_QCOM_OPENCL, LD_LIBRARY_PATH; default: the process's, through plugrt's
  plugin context); queries: an object answering the OpenCL queries instead of the driver (for tests)."""
  h = _handle(mem)
  if queries is None:
    from plugrt.context import PluginContext
    path = libcl.find(PluginContext.from_process().env if env is None else env)
    if path is None: raise UnsupportedError("no OpenCL library found to ask about the cl_mem", libcl.HINT)
    queries = _Queries(libcl.OpenCL(path))
  name, vendor = queries.platform(h)
  if not libcl.is_qualcomm(name, vendor):
    raise UnsupportedError(f"the cl_mem belongs to OpenCL platform {name!r} (vendor {vendor!r}): reading a cl_mem's GPU address is "
                           "specific to Qualcomm's OpenCL driver", "copy the data out with clEnqueueReadBuffer and back in with Buffer.copyin")
  kind = queries.mem_type(h)
  address = ctypes.c_uint64.from_address(h + GPU_ADDRESS_OFFSET).value
  if kind == libcl.CL_MEM_OBJECT_BUFFER:
    n = queries.mem_size(h)
    return CLMemInfo(address, None, (n,), n)
  if kind != libcl.CL_MEM_OBJECT_IMAGE2D: raise UnsupportedError(f"cl_mem of type {kind:#x}: QCOM takes buffers and 2D images")
  order, ctype, w, h_, pitch = queries.image(h)
  base = {libcl.CL_FLOAT: dtypes.float32, libcl.CL_HALF_FLOAT: dtypes.float16}.get(ctype)
  if order != libcl.CL_RGBA or base is None:
    raise UnsupportedError(f"a cl_mem image of channel order {order:#x} and type {ctype:#x}: QCOM images are CL_RGBA of CL_FLOAT or CL_HALF_FLOAT")
  img: ImageDType = image_dtype(base, (h_, w))
  if pitch != cmd.image_pitch(img):
    raise UnsupportedError(f"the cl_mem image's rows are {pitch} bytes apart; QCOM's {img!r} are {cmd.image_pitch(img)}",
                           "create the image with a row pitch padded to 64 bytes, or copy it into a QCOM image")
  return CLMemInfo(address, img, (h_, w, 4), pitch * h_)


def tensor_from_cl_mem(mem: Any, dtype: DType | None = None, shape: tuple[int, ...] | None = None, device: str = "QCOM",
                       keepalive: Any = None, **kw: Any) -> Any:
  """Tensor.from_blob of `mem` on `device`: an image as its ImageDType; a buffer as `dtype` elements (shape: default all)."""
  from plugrt.frontend.tensor import Tensor
  info = cl_mem_info(mem, **kw)
  if info.dtype is not None: return Tensor.from_blob(info.address, info.shape, dtype=info.dtype, device=device, keepalive=keepalive or mem)
  if dtype is None: raise TypeError("a cl_mem buffer has no dtype: pass dtype= (and shape=)")
  return Tensor.from_blob(info.address, shape or (info.nbytes // dtype.itemsize,), dtype=dtype, device=device, keepalive=keepalive or mem)
