"""QCOM's device layer against the fake KGSL (fake_kgsl.py): the real plugrt-qcom code opens the device through KGSL's
ioctls, maps GPU objects, writes arguments, descriptors and PM4 command streams into its command slots and submits them;
the fake's command processor decodes all of it, checks it against the program the stand-in compiler built, runs each
dispatch with the reference interpreter, and stores the timeline. Faults and hangs become the typed errors users see."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest
from fake_kgsl import ADRENO_740, image_rows
from plugrt_qcom import adreno as A
from plugrt_qcom import cmd
from plugrt_qcom.kgsldev import KGSLError, KGSLFault, KGSLTimeout
from qcom_fixtures import fake_qcom

from plugrt import Buffer, dtypes
from plugrt.errors import DeviceUnavailable, LaunchError
from plugrt.testing import kernels as K


@pytest.fixture
def fake():
  with fake_qcom() as (kg, dev): yield kg, dev


def test_open_makes_a_context_and_maps_objects(fake):
  kg, dev = fake
  assert kg.requests[:2] == ["DEVICE_GETPROPERTY", "DRAWCTXT_CREATE"]
  assert {"GPUOBJ_ALLOC", "GPUOBJ_INFO"} <= set(kg.requests)
  assert dev.info.state.kgsl.name == "Adreno 630" and dev.info.state.kgsl.generation == 6
  assert all(o.va for o in kg.objects.values())  # every object is mapped, at its GPU address


def test_copies(fake):
  _, dev = fake
  x = np.arange(10000, dtype=np.int32)
  b = Buffer.from_numpy(x, dev)
  assert np.array_equal(b.numpy(), x) and np.array_equal(b.view(16, offset=64).numpy(), x[16:32])


def test_dispatch_through_the_command_stream(fake):
  kg, dev = fake
  n = 1000
  x = np.arange(n, dtype=np.float32)
  out, xb, yb = Buffer(dev, n, dtypes.float32), Buffer.from_numpy(x, dev), Buffer.from_numpy(2 * x, dev)
  prg = dev.program(K.saxpy_kernel())
  t = prg(out, xb, yb, global_size=(4, 1, 1), local_size=(256, 1, 1), vals=(3.0, n), wait=True)
  assert np.array_equal(out.numpy(), 5 * x) and isinstance(t, float)
  d = kg.dispatches[-1]
  assert d["groups"] == (4, 1, 1) and d["local"] == (256, 1, 1) and d["op"] == "CP_RUN_OPENCL"
  assert d["buffers"] == [out.handle, xb.handle, yb.handle] and d["scalars"] == [3.0, n] and d["shader"] == prg.mem.va
  st = dev.info.state
  assert st.completed() == st.value and kg.contexts[st.kgsl.ctx].retired == st.value + st.ts_base


def test_views_and_exec_cs():
  with fake_qcom(env={"PLUGRT_QCOM_DISPATCH": "exec_cs"}) as (kg, dev):
    x = np.arange(64, dtype=np.float32)
    xb = Buffer.from_numpy(x, dev)
    out = Buffer(dev, 64, dtypes.float32)
    dev.program(K.saxpy_kernel())(out.view(16, offset=16 * 4), xb.view(16), xb.view(16, offset=32 * 4), global_size=(1, 1, 1),
                                  local_size=(16, 1, 1), vals=(2.0, 16), wait=True)
    assert np.array_equal(out.numpy()[16:32], 2 * x[:16] + x[32:48]) and kg.dispatches[-1]["op"] == "CP_EXEC_CS"


@pytest.mark.parametrize("base", [dtypes.float32, dtypes.float16], ids=["imagef", "imageh"])
def test_images_through_descriptors(fake, base):
  kg, dev = fake
  case = K.image_case(base)
  K.run_case(dev, case, "CL")
  sig = case.kernel.signature
  images = [w for dt, w in zip(sig.buffers, sig.written) if dt.name.startswith("image")]
  d = kg.dispatches[-1]
  assert (d["ntex"], d["nuav"]) == (images.count(False), images.count(True)) == (1, 2)  # read: a texture; written: a UAV


def test_image_rows_are_padded_to_the_pitch(fake):
  _, dev = fake
  img = dtypes.imagef((3, 5))  # 5 texels of 16 bytes: 80-byte rows, 128-byte pitch
  x = np.arange(3 * 5 * 4, dtype=np.float32)
  b = Buffer(dev, x.size, img).copyin(x)
  assert b.handle.pitch == 128 and np.array_equal(image_rows(b.handle.address, img).ravel(), x)
  assert np.array_equal(b.numpy(), x)


def test_a_corrupt_packet_faults_the_context(fake, monkeypatch):
  kg, dev = fake
  real = cmd.launch
  monkeypatch.setattr(cmd, "launch", lambda *a, **k: [w ^ (1 << 15) if i == 0 else w for i, w in enumerate(real(*a, **k))])
  b = Buffer(dev, 16, dtypes.float32)
  with pytest.raises(KGSLFault, match="reset the GPU") as e:
    dev.program(K.saxpy_kernel())(b, b, b, global_size=(1, 1, 1), local_size=(16, 1, 1), vals=(1.0, 16), wait=True)
  assert "parity" in kg.error and not e.value.timed_out
  with pytest.raises(KGSLError, match="cannot run more work"):  # the device stays failed: the context is gone
    dev.program(K.saxpy_kernel())(b, b, b, global_size=(1, 1, 1), local_size=(16, 1, 1), vals=(1.0, 16))


def test_a_descriptor_that_disagrees_faults(fake, monkeypatch):
  kg, dev = fake
  real = cmd.tex_descriptor
  def wrong(img, address, store=False):
    w = real(img, address, store)
    w[1] = A.pack((A.A6XX_TEX_CONST_1_WIDTH, img.width + 1), (A.A6XX_TEX_CONST_1_HEIGHT, img.height))
    return w
  monkeypatch.setattr(cmd, "tex_descriptor", wrong)
  with pytest.raises(KGSLFault): K.run_case(dev, K.image_case(dtypes.float32), "CL")
  assert "descriptor says" in kg.error


def test_a_kernel_that_never_ends_times_out():
  with fake_qcom(env={"PLUGRT_QCOM_TIMEOUT": "0.3"}) as (kg, dev):
    b = Buffer(dev, 16, dtypes.float32)
    prg = dev.program(K.saxpy_kernel())
    kg.hang = True
    with pytest.raises(KGSLTimeout, match="did not finish") as e:
      prg(b, b, b, global_size=(1, 1, 1), local_size=(16, 1, 1), vals=(1.0, 16), wait=True)
    assert e.value.timed_out and "PLUGRT_QCOM_TIMEOUT" in e.value.hint
    kg.hang = False


def test_launch_limits(fake):
  _, dev = fake
  b = Buffer(dev, 16, dtypes.float32)
  with pytest.raises(LaunchError): dev.program(K.saxpy_kernel())(b, b, b, global_size=(1, 1, 1), local_size=(2048, 1, 1), vals=(1.0, 1))


def test_a_7xx_chip_and_an_unknown_chip_are_refused():
  with pytest.raises(DeviceUnavailable, match=r"Adreno 7xx .* 6xx command stream only"):  # not a launch at 6xx offsets
    with fake_qcom(chip_id=ADRENO_740): pass
  with pytest.raises(DeviceUnavailable, match="chip id 0x05000000"):
    with fake_qcom(chip_id=0x05000000): pass


def test_no_device_file_is_no_device():
  with pytest.raises(DeviceUnavailable, match="kgsl-3d0 does not exist"):
    with fake_qcom(present=False): pass


def test_from_blob_of_host_memory_and_images(fake):
  kg, dev = fake
  from plugrt.errors import UnsupportedError
  from plugrt.tensor import Tensor
  raw = np.zeros(2 * 4 * 4 + 16, np.float32)
  host = raw[(-raw.ctypes.data % 64) // 4:][:2 * 4 * 4]  # a 64-byte aligned 2x4 imagef: 64-byte rows, which a descriptor describes in place
  host[:] = np.arange(host.size)
  t = Tensor.from_blob(host.ctypes.data, (2, 4, 4), dtype=dtypes.imagef((2, 4)), device=dev, keepalive=host)
  assert "MAP_USER_MEM" in kg.requests and t.numpy().ravel().tolist() == host.tolist()
  host[3] = 42
  assert t.numpy().ravel()[3] == 42  # wrapped, not copied
  odd = np.zeros(3 * 5 * 4 + 16, np.float32)
  odd = odd[(-odd.ctypes.data % 64) // 4:][:3 * 5 * 4]
  with pytest.raises(UnsupportedError, match="80-byte rows"):
    Tensor.from_blob(odd.ctypes.data, (3, 5, 4), dtype=dtypes.imagef((3, 5)), device=dev, keepalive=odd)
  del t
  import gc
  gc.collect()
  assert not dev.info.state.kgsl.user and kg.requests.count("SHAREDMEM_FREE") == 2  # the refused one at once, the other once its buffer went


def test_memory_only_the_gpu_sees_is_copied_by_the_gpu(fake):
  kg, dev = fake
  from plugrt.tensor import Tensor
  st = dev.info.state
  other = st.kgsl.alloc(0x2000)  # stands in for a cl_mem's memory: KGSL's MAP_USER_MEM refuses it (EFAULT), so it is GPU memory
  t = Tensor.from_blob(other.va, (64,), dtype=dtypes.float32, device=dev)
  assert type(t.node.buffer.handle).__name__ == "GpuAddress"
  t.assign(Tensor(np.arange(64, dtype=np.float32), device=dev))
  assert np.array_equal(np.frombuffer(ctypes.string_at(other.va, 256), np.float32), np.arange(64))
  assert np.array_equal(t.numpy(), np.arange(64)) and any(d["kernel"] == "plugrt_qcom_copy" for d in kg.dispatches)
  img = dtypes.imagef((3, 5))  # its rows padded to 128 bytes, as Qualcomm's driver lays out a cl_mem image
  x = np.arange(3 * 5 * 4, dtype=np.float32)
  ti = Tensor.from_blob(other.va + 0x1000, (3, 5, 4), dtype=img, device=dev)
  ti.node.buffer.copyin(x)
  assert np.array_equal(image_rows(other.va + 0x1000, img).ravel(), x) and np.array_equal(ti.numpy().ravel(), x)
