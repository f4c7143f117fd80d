"""CUDAProgram's launch preparation without a GPU: a program whose driver calls are fakes, launched with CPU buffers
(a handle is an address either way). What cuLaunchKernel would get (the parameter values behind kernelParams) is
read back from the fake, so the argument packing and the last-call record are checked below the hardware."""
import ctypes
import math
import struct
from types import SimpleNamespace

import pytest

from plugrt import Buffer, Device, dtypes
from plugrt.compiler.ir import Signature
from plugrt.runtime import LaunchLimits
from plugrt_cuda import device as cuda_device

SIG = Signature((dtypes.float32,), (dtypes.float32, dtypes.int32, dtypes.bool, dtypes.float16))
FMT = "<QfiBH"  # what the kernel's parameters hold: the buffer's address, then each scalar (float16 as its bits)


@pytest.fixture
def program(monkeypatch):
  """(program, launches): a CUDAProgram on fakes, and the parameter values each launch passed, unpacked."""
  if "CPU" not in Device.available(): pytest.skip("the buffers come from the CPU device")
  cpu = Device["CPU"]
  launches: list[tuple] = []

  def launch(fn, gx, gy, gz, bx, by, bz, shared, stream, params, extra) -> int:
    sizes = [struct.calcsize("<" + f) for f in FMT[1:]]
    vals = tuple(struct.unpack("<" + f, ctypes.string_at(params[i], n))[0] for i, (f, n) in enumerate(zip(FMT[1:], sizes)))
    launches.append(((gx.value, gy.value, gz.value), (bx.value, by.value, bz.value), vals[1:], vals[0]))  # scalars, then the address
    return 0

  ctx = ctypes.c_void_p(0x5151)
  state = SimpleNamespace(ctx=ctx, stream=ctypes.c_void_p(0), launch_limits=LaunchLimits("fake CUDA"), make_current=lambda: None,
                          lib=SimpleNamespace(cuModuleUnload=lambda m: 0))
  monkeypatch.setattr(cuda_device._tls, "ctx", ctx.value, raising=False)
  prg = object.__new__(cuda_device.CUDAProgram)  # its __init__ loads a module into a CUDA context
  prg.device, prg.name, prg.lib, prg.signature = cpu, "fake", b"", SIG
  prg.nbufs, prg.nvals, prg.launch_limits, prg.state = 1, 4, state.launch_limits, state
  prg.module, prg.fn = ctypes.c_void_p(0), ctypes.c_void_p(0xF00)
  prg._packers = [cuda_device.ctypes_packer(dt) for dt in SIG.scalars]
  prg._buffer_slots = tuple([(cpu, dt) for dt in SIG.buffers])  # (Program.__init__'s: what each buffer argument must be)
  prg._launch, prg._launch_addr, prg._tramp, prg._prepared = launch, 0, None, cuda_device.NO_CALL
  return prg, launches


def test_parameters_hold_each_dtype_packed_once(program):
  prg, launches = program
  out = Buffer(Device["CPU"], 4, dtypes.float32)
  prg(out, global_size=(2, 1, 1), local_size=(32, 1, 1), vals=(0.1, -7, True, 65520.0))
  prepared = prg._prepared
  assert launches[-1] == ((2, 1, 1), (32, 1, 1), (struct.unpack("<f", struct.pack("<f", 0.1))[0], -7, 1, 0x7C00), out.handle)  # f16: inf
  prg(out, global_size=(2, 1, 1), local_size=(32, 1, 1), vals=(0.1, -7, True, 65520.0))  # a new, equal tuple
  assert prg._prepared is prepared and len(launches) == 2


def test_a_repeated_call_tells_types_and_signs_apart(program):
  prg, launches = program
  out, other = Buffer(Device["CPU"], 4, dtypes.float32), Buffer(Device["CPU"], 4, dtypes.float32)
  prg(out, vals=(0.0, 1, False, 1.0))
  prg(out, vals=(-0.0, 1, False, 1.0))
  assert math.copysign(1.0, launches[-1][2][0]) == -1.0  # not the 0.0 prepared before
  with pytest.raises(TypeError, match="must be a int32"): prg(out, vals=(-0.0, True, False, 1.0))
  with pytest.raises(TypeError, match="must be a bool"): prg(out, vals=(-0.0, 1, 0, 1.0))
  prg(other, vals=(-0.0, 1, False, 1.0))  # new buffer: a new launch, same scalars
  assert prg._prepared.bufs == (other,) and launches[-1][3] == other.handle and launches[-1][2] == launches[-2][2]
  prg(other, global_size=(3, 1, 1), vals=(-0.0, 1, False, 1.0))
  assert launches[-1][0] == (3, 1, 1)
