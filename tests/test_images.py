"""Image dtypes (dtypes.imagef/imageh): the dtype, the IR's texel ops and their validation, the interpreter's
semantics, the DSL, Tensor, and devices with and without images (PYTHON and CL have them; CPU refuses).
The conformance suite's image cases (test_images, test_image_copies) run on every backend's own suite."""
from __future__ import annotations

import pickle

import numpy as np
import pytest

from plugrt import Tensor, kernel
from plugrt.compiler import interpreter
from plugrt.compiler import samples as K
from plugrt.compiler.ir import Kernel, KernelBuilder, Ops, UOp, parse, verify
from plugrt.device import Buffer, Device
from plugrt.dtype import ImageDType, PtrDType, dtypes
from plugrt.errors import ImageError, IRError, PlugrtError, RenderError, UnsupportedError
from plugrt.frontend.dsl import global_id, read_texel, write_texel

IMAGE_DEVICES = [d for d in ("PYTHON", "CL", "QCOM") if d in Device.available()]


# ---------------------------------------------------------------- the dtype

def test_image_dtype_identity_equality_and_repr():
  a = dtypes.imagef((4, 8))
  assert a is dtypes.imagef((4, 8)) is dtypes.imagef([4, 8]) and a == dtypes.imagef((4, 8)) and hash(a) == hash(dtypes.imagef((4, 8)))
  assert a != dtypes.imagef((8, 4)) and a != dtypes.imageh((4, 8)) and a is not dtypes.float32
  assert repr(a) == "dtypes.imagef((4, 8))" and repr(dtypes.imageh((2, 3))) == "dtypes.imageh((2, 3))"
  assert a.base is dtypes.float32 and dtypes.imageh((1, 1)).base is dtypes.float16
  assert (a.height, a.width, a.shape, a.size) == (4, 8, (4, 8), 4 * 8 * 4)
  assert a.itemsize == 4 and a.numpy == np.float32 and dtypes.imageh((1, 1)).itemsize == 2
  assert pickle.loads(pickle.dumps(a)) is a
  assert dtypes.from_name(a.name) is a and dtypes.as_dtype("imageh_2x3") is dtypes.imageh((2, 3))
  assert {a: 1}[dtypes.imagef((4, 8))] == 1 and a[:] == dtypes.imagef((4, 8))[:]
  with pytest.raises(AttributeError): a.shape = (1, 1)  # type: ignore[misc]


@pytest.mark.parametrize("shape", [(0, 4), (4, -1), (2.0, 3), (True, 3), (3,), "4x4", (1, 2, 3)])
def test_image_dtype_rejects_bad_shapes(shape):
  with pytest.raises(ImageError, match="image") as info: dtypes.imagef(shape)
  assert isinstance(info.value, (PlugrtError, ValueError))


def test_image_dtype_device_limit():
  from plugrt.dtype import image_dtype
  assert image_dtype(dtypes.float32, (16, 32), max_size=(16, 32)) is dtypes.imagef((16, 32))
  with pytest.raises(ImageError, match="largest image"): image_dtype(dtypes.float32, (17, 32), max_size=(16, 32))
  with pytest.raises(ImageError, match="float32 or float16"): image_dtype(dtypes.int32, (2, 2))


# ---------------------------------------------------------------- IR: builder, validation, listing

def _copy_kernel(h: int = 3, w: int = 5, dx: int = -1, dy: int = 0, base=dtypes.float32):
  b = KernelBuilder("shift")
  img = ImageDType(base, (h, w))
  dst, src = b.buffer("dst", img), b.buffer("src", img)
  x, y = b.group_id(0), b.group_id(1)
  r, g, bl, a = src.read_texel(x + dx, y + dy)
  dst.write_texel(x, y, (r + 1.0, g, bl, a))
  return b.finish()


def test_texel_ops_build_and_round_trip_through_the_listing():
  k = _copy_kernel()
  assert [u.arg for u in k.uops if u.op is Ops.TEXEL_LOAD] == [0, 1, 2, 3]
  assert k.signature.written == (True, False) and k.signature.buffers == (dtypes.imagef((3, 5)),) * 2
  assert [b.arg[1] for b in k.images] == ["dst", "src"]
  assert parse(k.dump()).dump() == k.dump()


def test_validator_rejects_image_misuse():
  b = KernelBuilder("bad")
  img, plain = b.buffer("img", dtypes.imagef((2, 2))), b.buffer("plain", dtypes.float32)
  with pytest.raises(IRError, match=r"is an image .*TEXEL_LOAD"): img[0]
  with pytest.raises(IRError, match="is an image"): img[0] = 1.0
  with pytest.raises(IRError, match="must be an image parameter"): plain.read_texel(0, 0)
  with pytest.raises(IRError, match="must be an image parameter"): plain.write_texel(0, 0, (1.0, 2.0, 3.0, 4.0))
  with pytest.raises(IRError, match="4 channels"): img.write_texel(0, 0, (1.0, 2.0))
  with pytest.raises(IRError, match="int32"): img.read_texel(b.const(0, dtypes.int64), 0)
  with pytest.raises(IRError, match="only be kernel parameters"): b.shared("s", dtypes.imagef((2, 2)), 4)
  with pytest.raises(IRError, match="scalar dtype"): b.scalar("n", dtypes.imagef((2, 2)))
  x = b.const(0, dtypes.int32)
  with pytest.raises(IRError, match="channel"): b.emit(Ops.TEXEL_LOAD, dtypes.float32, (img, x, x), 4)
  with pytest.raises(IRError, match="typed"): b.emit(Ops.TEXEL_LOAD, dtypes.float16, (img, x, x), 0)
  h = b.const(1.0, dtypes.float16)
  with pytest.raises(IRError, match="all four channels"): b.emit(Ops.TEXEL_STORE, None, (img, x, x, h, h, h, h))


def test_verify_rejects_a_listing_that_loads_from_an_image():
  text = "kernel k\n  %0 = BUFFER:imagef_2x2*global (0, 'img')\n  %1 = CONST:int32 0\n  %2 = LOAD:float32 (%0, %1)"
  with pytest.raises(IRError, match="is an image"): parse(text)
  img = UOp(Ops.BUFFER, PtrDType(dtypes.imagef((2, 2))), (), (0, "i"))
  zero = UOp(Ops.CONST, dtypes.int32, (), 0)
  with pytest.raises(IRError, match="channel"): verify(Kernel("k", (img, zero, UOp(Ops.TEXEL_LOAD, dtypes.float32, (img, zero, zero), None))))


# ---------------------------------------------------------------- the interpreter's semantics

def test_interpreter_texels_clamp_to_edge_on_a_non_square_image():
  h, w = 3, 5
  data = np.arange(h * w * 4, dtype=np.float32)
  for dx, dy in [(-1, 0), (2, 0), (0, -2), (0, 1), (-7, 9)]:
    out = np.zeros_like(data)
    interpreter.run(_copy_kernel(h, w, dx, dy), [out, data], (), (w, h, 1))
    img = data.reshape(h, w, 4)
    ys, xs = np.clip(np.arange(h) + dy, 0, h - 1), np.clip(np.arange(w) + dx, 0, w - 1)
    want = img[ys][:, xs].copy()
    want[..., 0] += 1
    assert np.array_equal(out.reshape(h, w, 4), want), (dx, dy)


def test_interpreter_store_outside_the_image_raises_and_sizes_are_checked():
  h, w = 3, 5
  data = np.zeros(h * w * 4, np.float32)
  with pytest.raises(interpreter.InterpreterError, match=r"texel \(x=5, y=0\)"):
    interpreter.run(_copy_kernel(h, w), [data.copy(), data], (), (w + 1, h, 1))
  with pytest.raises(TypeError, match="h\\*w\\*4"): interpreter.run(_copy_kernel(h, w), [data[:-4].copy(), data], (), (w, h, 1))


# ---------------------------------------------------------------- devices

@pytest.mark.parametrize("device", IMAGE_DEVICES)
@pytest.mark.parametrize("base", [dtypes.float32, dtypes.float16], ids=["imagef", "imageh"])
def test_texels_on_image_devices_match_numpy(device, base):
  """Independent of the interpreter: dst(x, y) = src(x - 1, y) with r + 1, on a non-square image (a swap of x and y,
  or of rows and columns, fails)."""
  h, w = 3, 5
  data = np.arange(h * w * 4).astype(base.numpy)
  img = ImageDType(base, (h, w))
  src, dst = Buffer(device, h * w * 4, img).copyin(data), Buffer(device, h * w * 4, img)
  Device[device].program(_copy_kernel(h, w, base=base))(dst, src, global_size=(w, h, 1))
  d = data.reshape(h, w, 4)
  want = np.concatenate([d[:, :1], d[:, :-1]], axis=1).copy()
  want[..., 0] += 1
  assert np.array_equal(dst.numpy().reshape(h, w, 4), want)


def test_devices_without_images_refuse_them():
  with pytest.raises(UnsupportedError, match="CPU has no image support"): Buffer("CPU", 16, dtypes.imagef((2, 2)))
  with pytest.raises(UnsupportedError, match="kernel shift takes image"): Device["CPU"].program(_copy_kernel())
  with pytest.raises(RenderError, match="no images"): Device["CPU"].compiler.render(_copy_kernel())
  host = np.zeros(16, np.float32)
  with pytest.raises(UnsupportedError, match="image"): Buffer.from_blob(host.ctypes.data, 16, dtypes.imagef((2, 2)), "CPU")


@pytest.mark.parametrize("device", IMAGE_DEVICES)
def test_image_buffers_check_size_and_have_no_views(device):
  with pytest.raises(ImageError, match="h\\*w\\*4 = 16"): Buffer(device, 15, dtypes.imagef((2, 2)))
  buf = Buffer(device, 16, dtypes.imagef((2, 2)))
  with pytest.raises(UnsupportedError, match="no views"): buf.view(4)
  with pytest.raises(UnsupportedError, match="no views"): Buffer(device, 16, dtypes.float32).view(dtype=dtypes.imagef((2, 2)))


@pytest.mark.skipif("CL" not in Device.available(), reason="no OpenCL platform here")
def test_cl_refuses_reading_and_writing_one_image():
  b = KernelBuilder("inplace")
  img = b.buffer("img", dtypes.imagef((2, 2)))
  x, y = b.group_id(0), b.group_id(1)
  r, g, bl, a = img.read_texel(x, y)
  img.write_texel(x, y, (a, bl, g, r))
  k = b.finish()
  with pytest.raises(RenderError, match="both reads and writes image 'img'"): Device["CL"].program(k)
  data = np.arange(16, dtype=np.float32)
  buf = Buffer("PYTHON", 16, dtypes.imagef((2, 2))).copyin(data)  # the reference defines it: each thread its own texel
  Device["PYTHON"].program(k)(buf, global_size=(2, 2, 1))
  assert np.array_equal(buf.numpy().reshape(4, 4), data.reshape(4, 4)[:, ::-1])


@pytest.mark.skipif("CL" not in Device.available(), reason="no OpenCL platform here")
def test_cl_image_too_large_for_the_device():
  alloc = Device["CL"].allocator
  mh, mw = alloc.max_image
  with pytest.raises(ImageError, match="largest image"): Buffer("CL", (mh + 1) * 1 * 4, dtypes.imagef((mh + 1, 1)))
  assert mw > 0


# ---------------------------------------------------------------- the DSL

@kernel
def _brighten(dst: dtypes.imagef((3, 5))[:], src: dtypes.imagef((3, 5))[:], gain: dtypes.float32):
  x, y = global_id(0), global_id(1)
  r, g, _, a = read_texel(src, x, y)
  t = read_texel(src, x + 1, y)
  write_texel(dst, x, y, (r * gain, g * gain, t[2], a))


@pytest.mark.parametrize("device", IMAGE_DEVICES)
def test_dsl_image_kernel(device):
  h, w = 3, 5
  data = np.arange(h * w * 4, dtype=np.float32)
  src = Tensor(data, dtype=dtypes.imagef((h, w)), device=device)
  dst = Tensor(np.zeros(h * w * 4, np.float32), dtype=dtypes.imagef((h, w)), device=device)
  _brighten[(1, h), (w, 1)](dst, src, 2.0)
  d = data.reshape(h, w, 4)
  want = d * [2, 2, 1, 1]
  want[..., 2] = np.concatenate([d[:, 1:], d[:, -1:]], axis=1)[..., 2]
  assert np.array_equal(dst.numpy().reshape(h, w, 4), want)


def test_dsl_rejects_image_misuse():
  from plugrt.frontend.dsl import KernelSyntaxError
  with pytest.raises(KernelSyntaxError, match="is an image"):
    @kernel
    def plain_read(out: dtypes.float32[:], src: dtypes.imagef((2, 2))[:]):
      out[0] = src[0]
  with pytest.raises(KernelSyntaxError, match="must be an image parameter"):
    @kernel
    def not_image(out: dtypes.float32[:]):
      out[0] = read_texel(out, 0, 0)[0]
  with pytest.raises(KernelSyntaxError, match="4 values"):
    @kernel
    def short_texel(dst: dtypes.imagef((2, 2))[:]):
      write_texel(dst, 0, 0, (1.0, 2.0))


# ---------------------------------------------------------------- Tensor

@pytest.mark.parametrize("device", IMAGE_DEVICES)
def test_image_tensors(device):
  """An image tensor is a float tensor whose storage is an image (as in the seeds): it keeps the caller's shape, and
  elementwise ops and reductions read its texels as float32 (imagef) or float16 (imageh) into plain tensors."""
  h, w = 3, 5
  data = np.arange(h * w * 4, dtype=np.float32)
  t = Tensor(data, dtype=dtypes.imagef((h, w)), device=device)
  assert t.shape == (h * w * 4,) and t.dtype is dtypes.imagef((h, w)) and np.array_equal(t.numpy(), data)
  t3 = Tensor(data.reshape(h, w, 4), dtype=dtypes.imagef((h, w)), device=device)
  assert t3.shape == (h, w, 4) and np.array_equal(t3.numpy(), data.reshape(h, w, 4))
  cpu = t3.to("CPU")  # no images there: a plain tensor of the texels
  assert cpu.dtype is dtypes.float32 and cpu.shape == (h, w, 4) and np.array_equal(cpu.numpy(), data.reshape(h, w, 4))
  one = t + 1
  assert one.dtype is dtypes.float32 and one.shape == t.shape and np.array_equal(one.numpy(), data + 1)
  assert one.realize().node.buffer.dtype is dtypes.float32  # the result is a plain buffer
  assert t.sum().item() == data.sum() and t3.sum(axis=(0, 1)).tolist() == data.reshape(-1, 4).sum(axis=0).tolist()
  assert np.array_equal((t3[:, 1:] * t3[:, :-1]).numpy(), data.reshape(h, w, 4)[:, 1:] * data.reshape(h, w, 4)[:, :-1])
  plain = t3.cast(dtypes.float32)
  assert plain.dtype is dtypes.float32 and np.array_equal((plain * 2).numpy(), data.reshape(h, w, 4) * 2)
  back = plain.cast(dtypes.imageh((h, w)))
  assert back.dtype is dtypes.imageh((h, w)) and back.shape == (h, w, 4) and np.array_equal(back.numpy(), data.reshape(h, w, 4).astype(np.float16))
  half = back * 2
  assert half.dtype is dtypes.float16 and np.array_equal(half.numpy(), data.reshape(h, w, 4).astype(np.float16) * 2)
  with pytest.raises(UnsupportedError, match="assign into an image tensor"): t.assign(0)
  with pytest.raises(ImageError, match="h\\*w\\*4"): Tensor(data[:-1], dtype=dtypes.imagef((h, w)), device=device)
  assert "Tensor([[[" in repr(t3) and "imagef_3x5" in repr(t3)
  other = "PYTHON" if device == "CL" else "CL"
  if other in IMAGE_DEVICES:
    moved = t.to(other)
    assert moved.dtype is t.dtype and moved.shape == t.shape and np.array_equal(moved.numpy(), t.numpy())


def test_image_tensors_refuse_where_the_device_has_no_images():
  data = np.zeros(16, np.float32)
  with pytest.raises(UnsupportedError, match="CPU has no image support"): Tensor(data, dtype=dtypes.imagef((2, 2)), device="CPU")
  with pytest.raises(UnsupportedError, match="CPU has no image support"): Tensor(data, device="CPU").cast(dtypes.imagef((2, 2)))


@pytest.mark.parametrize("device", IMAGE_DEVICES)
def test_image_tensor_from_blob(device):
  """The seeds' form: Tensor.from_blob(ptr, (h*w*4,), dtype=dtypes.imagef((h, w)), device=...) wraps the memory."""
  h, w = 3, 5
  host = np.arange(h * w * 4, dtype=np.float32)
  if not Device[device].allocator.supports_wrap: pytest.skip(f"{device} does not wrap host memory here")
  if device == "QCOM": pytest.skip("QCOM wraps host images only with 64-byte rows (this one's are 80): tested in plugins/ops_qcom")
  t = Tensor.from_blob(host.ctypes.data, (h * w * 4,), dtype=dtypes.imagef((h, w)), device=device, keepalive=host)
  assert t.shape == (h * w * 4,) and np.array_equal(t.numpy(), host)
  host[5] = 99
  assert t.numpy()[5] == 99 and (t + 1).numpy()[5] == 100  # wrapped, not copied
  dst = Tensor(np.zeros(h * w * 4, np.float32), dtype=dtypes.imagef((h, w)), device=device)
  _brighten[(1, h), (w, 1)](dst, t, 1.0)
  assert dst.numpy().reshape(h, w, 4)[0, 1, 1] == 99  # element 5: texel (x=1, y=0), channel g
  out = np.zeros_like(host)  # a kernel writing into a wrapped image: its owner sees it once the device is synchronised
  wrapped_out = Tensor.from_blob(out.ctypes.data, (h, w, 4), dtype=dtypes.imagef((h, w)), device=device, keepalive=out)
  _brighten[(1, h), (w, 1)](wrapped_out, t, 2.0)
  Device[device].synchronize()
  assert out[5] == 198 and out[4] == 8
  del t, wrapped_out
  import gc
  gc.collect()
  assert not getattr(Device[device].info.state, "wrapped", ())  # CL forgets freed wrapped images (it maps the live ones)
  with pytest.raises(ImageError): Tensor.from_blob(host.ctypes.data, (h * w * 4 - 4,), dtype=dtypes.imagef((h, w)), device=device)


def test_conformance_image_cases_are_apart_from_all_cases():
  names = {c.name for c in K.all_cases()}
  assert not any(c.name in names for c in K.image_cases())
  assert all(any(u.op is Ops.TEXEL_STORE for u in c.kernel.uops) for c in K.image_cases())
