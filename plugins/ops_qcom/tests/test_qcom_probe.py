"""QCOM where there is no Adreno: the probe's reasons, `plugrt devices`, QCOM=1, the compiler's "missing toolchain",
and the cl_mem interop helper (refusing a non-Qualcomm platform; reading a Qualcomm cl_mem from the driver's layout)."""
from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import plugrt_qcom
import pytest
from plugrt_qcom import interop, libcl

from plugrt import dtypes
from plugrt.context import PluginContext
from plugrt.errors import CompileError, DeviceUnavailable, Reason, UnsupportedError

SYSTEM_OPENCL = "/usr/lib/x86_64-linux-gnu/libOpenCL.so.1"


def test_probe_without_kgsl():
  if os.path.exists("/dev/kgsl-3d0"): pytest.skip("this machine has KGSL")
  p = plugrt_qcom.probe_qcom(PluginContext({}))
  assert not p.ok and p.reason is Reason.NO_DEVICE and "kgsl-3d0" in p.detail and "Adreno" in p.hint
  spec = plugrt_qcom.plugrt_backends()[0]
  assert spec.priority < 3  # below every backend that has run on hardware: never the default by itself


def test_compiler_probe_looks_only_where_the_driver_lives(tmp_path):
  empty = PluginContext({"LD_LIBRARY_PATH": str(tmp_path)})
  if os.path.exists("/vendor/lib64") or os.path.exists("/usr/lib/libOpenCL.so"): pytest.skip("this machine has an OpenCL driver there")
  p = plugrt_qcom.probe_opencl(empty)
  assert not p.ok and p.reason is Reason.MISSING_TOOLCHAIN and "PLUGRT_QCOM_OPENCL" in p.hint  # the ICD loader in /usr/lib/<triplet> is not it
  (tmp_path / "libOpenCL_adreno.so").write_bytes(b"")
  assert plugrt_qcom.probe_opencl(empty).detail == str(tmp_path / "libOpenCL_adreno.so")
  assert not plugrt_qcom.probe_opencl(PluginContext({"PLUGRT_QCOM_OPENCL": str(tmp_path / "nope.so")})).ok


def test_compiler_missing_toolchain(tmp_path):
  with pytest.raises(libcl.MissingToolchain, match="not installed") as e: libcl.QualcommCompiler({"LD_LIBRARY_PATH": str(tmp_path)})
  assert isinstance(e.value, CompileError) and "PLUGRT_QCOM_OPENCL" in e.value.hint
  if not os.path.exists(SYSTEM_OPENCL): pytest.skip("no OpenCL ICD loader here")
  with pytest.raises(libcl.MissingToolchain, match="no Qualcomm OpenCL platform"): libcl.QualcommCompiler({"PLUGRT_QCOM_OPENCL": SYSTEM_OPENCL})


def _cli(*args: str, **env: str) -> str:
  full = {**os.environ, "PLUGRT_EXTRA_PLUGINS": "plugrt_qcom", **env}
  r = subprocess.run([sys.executable, "-m", "plugrt", *args], capture_output=True, text=True, timeout=120, env=full)
  return r.stdout + r.stderr


def test_plugrt_devices_explains_it():
  if os.path.exists("/dev/kgsl-3d0"): pytest.skip("this machine has KGSL")
  out = _cli("devices")
  assert "QCOM: no Adreno GPU through KGSL: /dev/kgsl-3d0 does not exist" in out and "Snapdragon" in out


def test_qcom_1_selects_it():
  if os.path.exists("/dev/kgsl-3d0"): pytest.skip("this machine has KGSL")
  code = "from plugrt import Device\ntry: Device.DEFAULT\nexcept Exception as e: print(type(e).__name__, e)\nelse: print('chose', Device.DEFAULT)"
  r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                     env={**os.environ, "PLUGRT_EXTRA_PLUGINS": "plugrt_qcom", "QCOM": "1"})
  assert r.stdout.startswith(DeviceUnavailable.__name__) and "QCOM cannot be used" in r.stdout
  r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                     env={**os.environ, "PLUGRT_EXTRA_PLUGINS": "plugrt_qcom"})
  assert r.stdout.startswith("chose") and "QCOM" not in r.stdout


# ---------------------------------------------------------------- interop
def test_interop_refuses_other_platforms():
  cl = pytest.importorskip("pyopencl")
  if not os.path.exists(SYSTEM_OPENCL): pytest.skip("no OpenCL ICD loader here")
  try: ctx = cl.create_some_context(interactive=False)
  except Exception as e: pytest.skip(f"no OpenCL device: {e}")
  buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 64)
  with pytest.raises(UnsupportedError, match="specific to Qualcomm's OpenCL driver"):
    interop.cl_mem_info(buf, env={"PLUGRT_QCOM_OPENCL": SYSTEM_OPENCL})
  with pytest.raises(TypeError, match="not a cl_mem"): interop.cl_mem_info("buf")


class FakeQueries:
  """Qualcomm's driver as the helper asks it: one platform, and the cl_mem's type, size and image format."""
  def __init__(self, kind: int, size: int = 0, image: tuple[int, int, int, int, int] = (0, 0, 0, 0, 0),
               platform: tuple[str, str] = ("QUALCOMM Snapdragon(TM)", "QUALCOMM")):
    self.kind, self.size, self.img, self.plat = kind, size, image, platform
  def platform(self, mem: int) -> tuple[str, str]: return self.plat
  def mem_type(self, mem: int) -> int: return self.kind
  def mem_size(self, mem: int) -> int: return self.size
  def image(self, mem: int) -> tuple[int, int, int, int, int]: return self.img


def test_interop_reads_the_gpu_address_of_a_qualcomm_cl_mem():
  obj = (ctypes.c_uint64 * 32)()  # the driver's object a cl_mem points to: the GPU address at 0xA0
  obj[0xA0 // 8] = 0x7F12_3456_7000
  mem = ctypes.addressof(obj)
  info = interop.cl_mem_info(mem, queries=FakeQueries(libcl.CL_MEM_OBJECT_BUFFER, size=4096))
  assert (info.address, info.dtype, info.shape, info.nbytes) == (0x7F12_3456_7000, None, (4096,), 4096)
  info = interop.cl_mem_info(mem, queries=FakeQueries(libcl.CL_MEM_OBJECT_IMAGE2D, image=(libcl.CL_RGBA, libcl.CL_HALF_FLOAT, 5, 3, 64)))
  assert info.dtype is dtypes.imageh((3, 5)) and info.shape == (3, 5, 4) and info.address == 0x7F12_3456_7000
  with pytest.raises(UnsupportedError, match="rows are 40 bytes apart"):
    interop.cl_mem_info(mem, queries=FakeQueries(libcl.CL_MEM_OBJECT_IMAGE2D, image=(libcl.CL_RGBA, libcl.CL_HALF_FLOAT, 5, 3, 40)))
  with pytest.raises(UnsupportedError, match="CL_RGBA"):
    interop.cl_mem_info(mem, queries=FakeQueries(libcl.CL_MEM_OBJECT_IMAGE2D, image=(0x10B0, libcl.CL_FLOAT, 4, 4, 64)))
  with pytest.raises(UnsupportedError, match="specific to Qualcomm"):
    interop.cl_mem_info(mem, queries=FakeQueries(libcl.CL_MEM_OBJECT_BUFFER, 64, platform=("Portable Computing Language", "The pocl project")))
