"""plugrt.video.convert: the one colour-conversion kernel, on CPU, CL and WebGPU, against a numpy reference for every
output dtype, normalize and colour space (named and custom), 8-bit NV12 and 10-bit samples in 16-bit words (both
P016's high-bit layout and the software decoder's low-bit one), limited and full range, odd sizes, pitch and crop."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from plugrt import Buffer, Device, dtypes
from plugrt.errors import DeviceUnavailable
from plugrt.video.convert import Surface, VideoArgumentError, check_output, convert, default_matrix, surface_from_planes
from plugrt_testing.video import reference_rgb

DEVICES = ("CPU", "CL", "WEBGPU")
CUSTOM = (1.4, -0.35, -0.7, 1.8)
SPACES = ("bt601", "bt709", "bt2020", CUSTOM)
OUTPUTS = [(dtypes.float32, True), (dtypes.float32, False), (dtypes.float16, True), (dtypes.float16, False), (dtypes.uint8, False)]


def _device(name: str):
  try: return Device[name]
  except DeviceUnavailable as e: pytest.skip(f"{name} is not available here: {e}")


def _planes(h: int, w: int, bits: int, seed: int) -> tuple:
  rng = np.random.default_rng(seed)
  et = np.uint8 if bits == 8 else np.uint16
  ch, cw = (h + 1) // 2, (w + 1) // 2
  return tuple(rng.integers(0, 1 << bits, s).astype(et) for s in ((h, w), (ch, cw), (ch, cw)))


def _tolerance(dt, normalize: bool) -> float:
  if dt is dtypes.uint8: return 1  # a level: float32 math may round a .5 the other way
  scale = 1.0 if normalize else 255.0
  return scale * (2 ** -9 if dt is dtypes.float16 else 2e-6)  # float16: half an ulp at 1.0 is 2**-11, a few ops of rounding


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bits", [8, 10])
def test_every_dtype_normalize_and_colour_space(device: str, bits: int) -> None:
  dev = _device(device)
  h, w = 9, 14
  y, cb, cr = _planes(h, w, bits, bits)
  for full in (False, True):
    s = surface_from_planes(dev, y, cb, cr, bits, full_range=full)
    for (dt, normalize), space in itertools.product(OUTPUTS, SPACES):
      if dt is dtypes.float16 and device == "WEBGPU" and "shader-f16" not in getattr(dev.info.iface_object, "features", ()):
        continue  # this adapter has no float16 (the WebGPU suite skips it the same way)
      t = convert(s, dt, normalize, space)
      assert t.shape == (h, w, 3) and t.dtype is dt
      got = t.numpy().astype(np.float64)
      want = reference_rgb(y, cb, cr, bits, full, space, normalize, uint8=dt is dtypes.uint8)
      err = np.abs(got - want).max()
      assert err <= _tolerance(dt, normalize), f"{device} {bits}-bit full={full} {dt.name} normalize={normalize} {space}: max error {err}"


@pytest.mark.parametrize("device", DEVICES)
def test_p016_high_bits_pitch_and_crop(device: str) -> None:
  """NVDEC's layout: one buffer, a pitch wider than the picture, chroma after the surface's (padded) height, 10-bit
  samples in the top bits of 16-bit words; a crop (x0, y0) inside it."""
  dev = _device(device)
  h, w, pitch, surf_h, x0, y0 = 6, 10, 16, 8, 2, 2
  y, cb, cr = _planes(surf_h, pitch, 10, 3)
  host = np.zeros(pitch * surf_h + pitch * surf_h // 2, np.uint16)
  host[:pitch * surf_h] = (y << 6).reshape(-1)
  uv = host[pitch * surf_h:].reshape(surf_h // 2, pitch)
  uv[:, 0::2], uv[:, 1::2] = cb[:, :pitch // 2] << 6, cr[:, :pitch // 2] << 6
  buf = Buffer(dev, host.size, dtypes.uint16).copyin(host)
  s = Surface(buf, w, h, pitch, pitch * surf_h, 10, 6, x0, y0, False, 9)
  got = convert(s, dtypes.float32, True, None).numpy()  # None: the VUI's matrix 9 is BT.2020
  ref = reference_rgb(y, cb, cr, 10, False, "bt2020", True)[y0:y0 + h, x0:x0 + w]
  assert np.abs(got - ref).max() < 2e-6


def test_uint8_needs_normalize_false() -> None:
  with pytest.raises(VideoArgumentError, match="normalize=False"): check_output(dtypes.uint8, True)
  with pytest.raises(TypeError, match="float32, float16 or uint8"): check_output(dtypes.int32, False)
  with pytest.raises(TypeError): check_output(dtypes.float32, 1)


def test_colour_space_arguments() -> None:
  from plugrt.video.convert import coefficients, resolve_color_space
  assert resolve_color_space("BT709") == coefficients(0.2126, 0.0722)
  assert resolve_color_space(CUSTOM) == CUSTOM
  assert resolve_color_space(None, 9) == coefficients(0.2627, 0.0593)
  assert default_matrix(2, 1080) == "bt709" and default_matrix(2, 480) == "bt601" and default_matrix(5, 1080) == "bt601"
  with pytest.raises(VideoArgumentError, match="unknown color_space"): resolve_color_space("bt2100")
  with pytest.raises(VideoArgumentError, match="4 finite numbers"): resolve_color_space((1.0, 2.0))
  with pytest.raises(TypeError): resolve_color_space(3)


def test_a_surface_that_does_not_fit_is_refused() -> None:
  dev = Device["CPU"]
  buf = Buffer(dev, 100, dtypes.uint8)
  with pytest.raises(ValueError, match="does not fit"): convert(Surface(buf, 10, 10, 10, 100), dtypes.float32, True, "bt709")
  with pytest.raises(TypeError, match="uint8 or uint16"): convert(Surface(Buffer(dev, 200, dtypes.float32), 4, 4, 4, 16), dtypes.float32)


def test_one_program_per_output_dtype() -> None:
  """Sizes and coefficients are arguments: another stream reuses the compiled program."""
  from plugrt.video.convert import kernel
  dev = Device["CPU"]
  a = surface_from_planes(dev, *_planes(4, 6, 8, 1), 8)
  b = surface_from_planes(dev, *_planes(8, 10, 8, 2), 8, full_range=True)
  convert(a, dtypes.float32, True, "bt601")
  n = len(dev._programs)
  convert(b, dtypes.float32, False, "bt2020")
  assert len(dev._programs) == n and kernel(dtypes.uint8, dtypes.float32) is kernel(dtypes.uint8, dtypes.float32)
