"""QCOM's device layer against the fake KGSL (fake_kgsl.py): the real plugrt-qcom code opens the device through KGSL's
ioctls, maps GPU objects, writes arguments, descriptors and PM4 command streams into its command slots and submits them;
the fake's command processor decodes all of it, checks it against the program the stand-in compiler built, runs each
dispatch with the reference interpreter, and stores the timeline. Faults and hangs become the typed errors users see."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest
from fake_kgsl import ADRENO_702, ADRENO_730, ADRENO_740, FakeKGSL, image_rows
from plugrt_qcom import adreno as A
from plugrt_qcom import cmd
from plugrt_qcom.kgsldev import KGSLError, KGSLFault, KGSLTimeout
from qcom_fixtures import fake_qcom

from plugrt import Buffer, dtypes
from plugrt.compiler import samples as K
from plugrt.errors import DeviceUnavailable, LaunchError


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


def test_chip_ids_pick_the_stream_and_an_unknown_chip_is_refused():
  from plugrt_qcom.kgsldev import adreno_generation
  assert [adreno_generation(c) for c in (0x06030001, ADRENO_702, 0x07010000, ADRENO_730, 0x07030002, ADRENO_740, 0x43051401)] == \
         [6, 6, 6, 7, 7, 7, 7]  # Mesa's device table: the 702 and 710 are A6XX parts
  assert [adreno_generation(c) for c in (0x05000000, 0x44050000, 0)] == [0, 0, 0]
  for chip, name, gen in ((ADRENO_740, "Adreno 740", cmd.A7XX), (ADRENO_730, "Adreno 730", cmd.A7XX), (ADRENO_702, "Adreno 702", cmd.A6XX)):
    with fake_qcom(chip_id=chip) as (_, dev):
      assert dev.info.state.kgsl.name == name and dev.info.state.gen is gen
  with pytest.raises(DeviceUnavailable, match="chip id 0x05000000"):
    with fake_qcom(chip_id=0x05000000): pass


def test_7xx_dispatch_through_the_a7xx_stream():
  with fake_qcom(chip_id=ADRENO_740) as (kg, dev):
    n = 300
    x = np.arange(n, dtype=np.float32)
    out, xb, yb = Buffer(dev, n, dtypes.float32), Buffer.from_numpy(x, dev), Buffer.from_numpy(2 * x, dev)
    prg = dev.program(K.saxpy_kernel())
    prg(out, xb, yb, global_size=(5, 1, 1), local_size=(64, 1, 1), vals=(3.0, n), wait=True)
    assert np.array_equal(out.numpy(), 5 * x) and kg.dispatches[-1]["gen"] == 7 and kg.dispatches[-1]["local"] == (64, 1, 1)
    st = dev.info.state
    assert st.completed() == st.value  # the timeline was stored by CP_EVENT_WRITE7
  words = cmd.launch(cmd.Shader(0x10000, 300), 0x20000, (8, 4, 2), (2, 3, 1), nuav=1, gen=cmd.A7XX) + cmd.A7XX.timestamp(0x3000, 7)
  regs = {p.code for p in cmd.decode(words) if p.type == 4}
  assert {A.REG_A7XX_SP_CS_NDRANGE_0, A.REG_A7XX_SP_CS_CONST_CONFIG, A.REG_A7XX_SP_UPDATE_CNTL, A.REG_A7XX_SP_CS_UAV_BASE,
          A.REG_A7XX_SP_CS_WGE_CNTL, A.REG_A7XX_SP_CS_NDRANGE_7, A.REG_A6XX_SP_CS_WIE_CNTL_0, A.REG_A6XX_SP_CS_WIE_CNTL_1} <= regs
  assert not regs & cmd.A7XX.foreign and not any(p.code == A.CP_LOAD_STATE6_FRAG and p.values[0] >> 14 & 3 == A.ST6_SHADER
                                                 for p in cmd.decode(words) if p.type == 7)
  ev = cmd.decode(words)[-1]  # CACHE_CLEAN 49 | WRITE_ENABLED bit 27 (USER_32B and RAM are 0), address, payload
  assert ev.code == A.CP_EVENT_WRITE7 and ev.values == (49 | 1 << 27, 0x3000, 0, 7)
  st = cmd.ComputeState(cmd.A7XX)
  for p in cmd.decode(words): st.apply(p)
  assert st.local_size() == (8, 4, 2) and st.groups() == (2, 3, 1) and st.global_size() == (16, 12, 2)
  assert st.regs[A.REG_A7XX_SP_CS_NDRANGE_7] == 7 << 2 | 3 << 12 | 1 << 22


@pytest.mark.parametrize("chip,other", [(0x06030001, cmd.A7XX), (ADRENO_740, cmd.A6XX)])
def test_a_stream_of_the_other_generation_faults(chip, other):
  """plugrt writing the 6xx stream on a 7xx (or the reverse) is what the fake must catch: it faults the context."""
  with fake_qcom(chip_id=chip) as (kg, dev):
    st = dev.info.state
    st.gen = other  # as if the chip id had been read wrong
    b = Buffer(dev, 64, dtypes.float32)
    with pytest.raises(KGSLFault):
      dev.program(K.saxpy_kernel())(b, b, b, global_size=(1, 1, 1), local_size=(64, 1, 1), vals=(1.0, 64), wait=True)
    assert "another generation" in str(kg.error) or "CP_EVENT_WRITE7" in str(kg.error)


def test_7xx_event_write_forms():
  kg = FakeKGSL(chip_id=ADRENO_740)
  try:
    with pytest.raises(ValueError, match="CP_EVENT_WRITE7"):  # A6XX's CACHE_FLUSH_TS form is not what a 7xx stores a value with
      kg._run(tuple(cmd.A6XX.timestamp(0x3000, 1)))
  finally: kg.shutdown()


def test_no_device_file_is_no_device():
  with pytest.raises(DeviceUnavailable, match="kgsl-3d0 does not exist"):
    with fake_qcom(present=False): pass


def test_from_blob_of_host_memory_and_images(fake):
  kg, dev = fake
  from plugrt.errors import UnsupportedError
  from plugrt.frontend.tensor import Tensor
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
  from plugrt.frontend.tensor import Tensor
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
