"""A stand-in for Qualcomm's OpenCL library as a ctypes binding (the seeds' `cl` module), over the fake KGSL.

The seeds' QCOM interop snippets create a buffer or an image with `cl.clCreateBuffer` / `cl.clCreateImage2D` and read
the GPU address out of the driver's object the cl_mem handle points to, at byte 0xA0 (docs/research/qcom.md). This
stand-in answers those calls as the driver lays its objects out: a cl_mem is a ctypes pointer (so
`ctypes.addressof(cl_mem)` is where the handle is stored) to an object whose 64-bit word at 0xA0 is the address of GPU
memory allocated through the QCOM device's KGSL (the fake's: the CPU sees it at the same address). An image's rows are
padded as QCOM lays images out (plugrt_qcom.cmd.image_pitch). Constants are Khronos' CL/cl.h values.
"""
from __future__ import annotations

import ctypes
from typing import Any

from plugrt_qcom import cmd, libcl

from plugrt.dtype import dtypes, image_dtype

CL_SUCCESS = libcl.CL_SUCCESS
CL_MEM_READ_WRITE = 1 << 0
CL_RGBA, CL_HALF_FLOAT, CL_FLOAT = libcl.CL_RGBA, libcl.CL_HALF_FLOAT, libcl.CL_FLOAT
CL_INVALID_VALUE, CL_INVALID_IMAGE_FORMAT_DESCRIPTOR = -30, -39
GPU_ADDRESS_WORD = 0xA0 // 8


class cl_image_format(ctypes.Structure):
  _fields_ = [("image_channel_order", ctypes.c_uint32), ("image_channel_data_type", ctypes.c_uint32)]


class Context:
  """What the stand-in's cl_context is: the QCOM device whose KGSL allocates the memory."""
  def __init__(self, device: Any):
    self.kgsl = device.info.state.kgsl
    self.objects: dict[int, tuple[Any, Any]] = {}  # cl_mem value -> (the driver's object, its GPU memory): kept alive

  def _mem(self, size: int, errcode_ret: Any) -> ctypes.c_void_p:
    gpu = self.kgsl.alloc(size)
    obj = (ctypes.c_uint64 * 64)()  # the driver's object behind a cl_mem
    obj[GPU_ADDRESS_WORD] = gpu.va
    self.objects[ctypes.addressof(obj)] = (obj, gpu)
    if errcode_ret is not None: errcode_ret.value = CL_SUCCESS
    return ctypes.c_void_p(ctypes.addressof(obj))


def clCreateContext(device: Any) -> Context:
  """The stand-in's context over an opened QCOM device (OpenCL's takes properties, devices and a callback)."""
  return Context(device)


def clCreateBuffer(context: Context, flags: int, size: int, host_ptr: Any, errcode_ret: Any) -> ctypes.c_void_p:
  if host_ptr is not None or size <= 0:
    if errcode_ret is not None: errcode_ret.value = CL_INVALID_VALUE
    return ctypes.c_void_p()
  return context._mem(size, errcode_ret)


def clCreateImage2D(context: Context, flags: int, fmt: cl_image_format, width: int, height: int, row_pitch: int, host_ptr: Any,
                    errcode_ret: Any) -> ctypes.c_void_p:
  base = {CL_FLOAT: dtypes.float32, CL_HALF_FLOAT: dtypes.float16}.get(fmt.image_channel_data_type)
  if fmt.image_channel_order != CL_RGBA or base is None or host_ptr is not None or row_pitch not in (0, None):
    if errcode_ret is not None: errcode_ret.value = CL_INVALID_IMAGE_FORMAT_DESCRIPTOR
    return ctypes.c_void_p()
  return context._mem(cmd.image_pitch(image_dtype(base, (height, width))) * height, errcode_ret)


def gpu_address(mem: ctypes.c_void_p) -> int:
  """The GPU address behind a cl_mem (for tests to fill and read the memory)."""
  return ctypes.c_uint64.from_address(mem.value + 0xA0).value
