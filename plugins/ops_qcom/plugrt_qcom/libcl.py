"""Qualcomm's OpenCL driver by ctypes: found at run time (never imported at plugin load), used to compile OpenCL C to
a program binary, and to look inside an app's `cl_mem` objects for the interop helper (plugrt_qcom.interop).

Where the driver is looked for, first hit wins: PLUGRT_QCOM_OPENCL (a file), then libOpenCL_adreno.so, libOpenCL.so
and libOpenCL.so.1 in LD_LIBRARY_PATH's folders, /vendor/lib64, /system/vendor/lib64 and /usr/lib (Android keeps the
Adreno driver under /vendor; Linux distributions for Snapdragon put it in /usr/lib). A library that loads but whose
platform is not Qualcomm's (an ICD loader in front of PoCL, say) is refused: only Qualcomm's compiler writes the
binaries plugrt-qcom can take the shader from.

Constants are Khronos' CL/cl.h values.
"""
from __future__ import annotations

import ctypes
from collections.abc import Mapping
from typing import Any

from plugrt.errors import CompileError
from plugrt.probing import find_library

NAMES = ("libOpenCL_adreno.so", "libOpenCL.so", "libOpenCL.so.1")
VENDOR_DIRS = ("/vendor/lib64", "/system/vendor/lib64", "/usr/lib")
HINT = ("install Qualcomm's Adreno OpenCL driver (on Android it is /vendor/lib64/libOpenCL.so; on Linux for Snapdragon, the "
        "distribution's Adreno OpenCL package), or point PLUGRT_QCOM_OPENCL at it")

CL_SUCCESS = 0
CL_DEVICE_TYPE_GPU = 1 << 2
CL_PLATFORM_NAME, CL_PLATFORM_VENDOR = 0x0902, 0x0903
CL_DEVICE_PLATFORM = 0x1031
CL_CONTEXT_DEVICES = 0x1081
CL_MEM_TYPE, CL_MEM_SIZE, CL_MEM_CONTEXT = 0x1100, 0x1102, 0x1106
CL_MEM_OBJECT_BUFFER, CL_MEM_OBJECT_IMAGE2D = 0x10F0, 0x10F1
CL_IMAGE_FORMAT, CL_IMAGE_ROW_PITCH, CL_IMAGE_WIDTH, CL_IMAGE_HEIGHT = 0x1110, 0x1112, 0x1114, 0x1115
CL_RGBA, CL_HALF_FLOAT, CL_FLOAT = 0x10B5, 0x10DD, 0x10DE
CL_PROGRAM_BINARY_SIZES, CL_PROGRAM_BINARIES = 0x1165, 0x1166
CL_PROGRAM_BUILD_LOG = 0x1183


class MissingToolchain(CompileError):
  """Qualcomm's OpenCL driver, which compiles QCOM's kernels, is not installed (or the OpenCL found is not Qualcomm's)."""
  def __init__(self, message: str, hint: str = HINT): super().__init__(message, hint=hint)


def find(env: Mapping[str, str]) -> str | None:
  """The driver library's path as the module docstring says, from the paths only (nothing is loaded)."""
  if explicit := env.get("PLUGRT_QCOM_OPENCL", ""): return explicit if find_library(explicit) else None
  dirs = [d for d in env.get("LD_LIBRARY_PATH", "").split(":") if d] + list(VENDOR_DIRS)
  return find_library(*NAMES, dirs=dirs)


def is_qualcomm(name: str, vendor: str) -> bool: return "qualcomm" in f"{name} {vendor}".lower()


class OpenCL:
  """A loaded OpenCL library, by ctypes."""

  def __init__(self, path: str):
    try: self.lib = lib = ctypes.CDLL(path)
    except OSError as e: raise MissingToolchain(f"cannot load the OpenCL library {path}: {e}") from e
    P, U, S = ctypes.c_void_p, ctypes.c_uint32, ctypes.c_size_t
    for name, args in (("clGetPlatformIDs", [U, P, P]), ("clGetPlatformInfo", [P, U, S, P, P]), ("clGetDeviceIDs", [P, ctypes.c_uint64, U, P, P]),
                       ("clGetMemObjectInfo", [P, U, S, P, P]), ("clGetImageInfo", [P, U, S, P, P]), ("clGetContextInfo", [P, U, S, P, P]),
                       ("clGetDeviceInfo", [P, U, S, P, P]), ("clBuildProgram", [P, U, P, ctypes.c_char_p, P, P]),
                       ("clGetProgramInfo", [P, U, S, P, P]), ("clGetProgramBuildInfo", [P, P, U, S, P, P]), ("clReleaseProgram", [P]),
                       ("clReleaseContext", [P])):
      fn = getattr(lib, name)
      fn.argtypes, fn.restype = args, ctypes.c_int32
    lib.clCreateContext.argtypes, lib.clCreateContext.restype = [P, U, P, P, P, P], P
    lib.clCreateProgramWithSource.argtypes, lib.clCreateProgramWithSource.restype = [P, U, P, P, P], P
    self.path = path

  def check(self, err: int, what: str) -> None:
    if err != CL_SUCCESS: raise CompileError(f"OpenCL {what} failed with error {err}")

  def info_str(self, fn: Any, obj: int, param: int) -> str:
    n = ctypes.c_size_t()
    self.check(fn(obj, param, 0, None, ctypes.byref(n)), fn.__name__)
    buf = ctypes.create_string_buffer(n.value)
    self.check(fn(obj, param, n.value, buf, None), fn.__name__)
    return buf.value.decode(errors="replace")

  def info_int(self, fn: Any, obj: int, param: int, ctype: Any = ctypes.c_uint64) -> int:
    v = ctype()
    self.check(fn(obj, param, ctypes.sizeof(v), ctypes.byref(v), None), fn.__name__)
    return v.value

  def platforms(self) -> list[int]:
    n = ctypes.c_uint32()
    if self.lib.clGetPlatformIDs(0, None, ctypes.byref(n)) != CL_SUCCESS or n.value == 0: return []
    ids = (ctypes.c_void_p * n.value)()
    self.check(self.lib.clGetPlatformIDs(n.value, ids, None), "clGetPlatformIDs")
    return [p for p in ids if p]

  def platform_names(self, platform: int) -> tuple[str, str]:
    get = self.lib.clGetPlatformInfo
    return self.info_str(get, platform, CL_PLATFORM_NAME), self.info_str(get, platform, CL_PLATFORM_VENDOR)


class QualcommCompiler:
  """Qualcomm's OpenCL compiler on the first Qualcomm platform's GPU: OpenCL C in, the program binary out."""

  def __init__(self, env: Mapping[str, str]):
    path = find(env)
    if path is None: raise MissingToolchain("Qualcomm's OpenCL driver (libOpenCL.so) is not installed, so QCOM cannot compile kernels")
    self.cl = cl = OpenCL(path)
    for p in cl.platforms():
      name, vendor = cl.platform_names(p)
      if is_qualcomm(name, vendor): break
    else:
      raise MissingToolchain(f"{path} offers no Qualcomm OpenCL platform: QCOM needs Qualcomm's own compiler for its program binaries")
    self.version = name
    dev, n = ctypes.c_void_p(), ctypes.c_uint32()
    cl.check(cl.lib.clGetDeviceIDs(p, CL_DEVICE_TYPE_GPU, 1, ctypes.byref(dev), ctypes.byref(n)), "clGetDeviceIDs")
    err = ctypes.c_int32()
    self.device = dev
    self.context = cl.lib.clCreateContext(None, 1, ctypes.byref(dev), None, None, ctypes.byref(err))
    cl.check(err.value, "clCreateContext")

  def compile(self, src: str, options: str = "") -> bytes:
    cl, err = self.cl, ctypes.c_int32()
    text = ctypes.c_char_p(src.encode())
    prg = cl.lib.clCreateProgramWithSource(self.context, 1, ctypes.byref(text), None, ctypes.byref(err))
    cl.check(err.value, "clCreateProgramWithSource")
    try:
      if (status := cl.lib.clBuildProgram(prg, 1, ctypes.byref(self.device), options.encode(), None, None)) != CL_SUCCESS:
        n = ctypes.c_size_t()
        cl.lib.clGetProgramBuildInfo(prg, self.device, CL_PROGRAM_BUILD_LOG, 0, None, ctypes.byref(n))
        log = ctypes.create_string_buffer(n.value + 1)
        cl.lib.clGetProgramBuildInfo(prg, self.device, CL_PROGRAM_BUILD_LOG, n.value, log, None)
        raise CompileError(f"Qualcomm's OpenCL compiler refused the kernel (error {status})", log.value.decode(errors="replace"))
      size = ctypes.c_size_t()
      cl.check(cl.lib.clGetProgramInfo(prg, CL_PROGRAM_BINARY_SIZES, ctypes.sizeof(size), ctypes.byref(size), None), "clGetProgramInfo")
      out = ctypes.create_string_buffer(size.value)
      ptr = ctypes.c_void_p(ctypes.addressof(out))
      cl.check(cl.lib.clGetProgramInfo(prg, CL_PROGRAM_BINARIES, ctypes.sizeof(ptr), ctypes.byref(ptr), None), "clGetProgramInfo")
      return out.raw
    finally: cl.lib.clReleaseProgram(prg)


