"""One colour-conversion kernel for every decoder and device: a 4:2:0 semi-planar surface (NV12, or P016's 16-bit
words) to an (H, W, 3) RGB tensor in float32, float16 or uint8.

The surface is one buffer of uint8 (8-bit) or uint16 (more bits) elements: the luma plane, `pitch` elements a row,
and from element `chroma_offset` the interleaved Cb/Cr plane at half the height, with the same pitch, which is how
NVDEC maps a decoded picture (and how the software decoder lays its planes out). A sample is `element >> shift`
(P016 keeps a 10-bit sample in its top bits: shift 6; the software decoder's low-bit samples: shift 0).

The arithmetic, for a sample depth of n bits (H.273 / BT.601, BT.709, BT.2020 section 2.5):
  limited range: Y' = (Y - 16*2^(n-8)) / (219*2^(n-8)),   Cb' = (Cb - 2^(n-1)) / (224*2^(n-8))
  full range:    Y' = Y / (2^n - 1),                      Cb' = (Cb - 2^(n-1)) / (2^n - 1)
  R = Y' + rv*Cr',  G = Y' + gu*Cb' + gv*Cr',  B = Y' + bu*Cb', each clamped to [0, 1]
then scaled by 1 (normalize=True) or 255, and for uint8 rounded to nearest. With the luma and colour-difference
weights Kr, Kb of a matrix (Kg = 1 - Kr - Kb): rv = 2(1-Kr), bu = 2(1-Kb), gu = -2Kb(1-Kb)/Kg, gv = -2Kr(1-Kr)/Kg.
A custom `color_space` is that tuple (rv, gu, gv, bu), applied to Y' in [0, 1] and Cb', Cr' in [-0.5, 0.5].

Everything that changes per stream (size, pitch, offsets, coefficients) is a scalar argument, so a device compiles
the kernel once per (sample type, output dtype) and a frame costs one output allocation and one launch.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from plugrt.compiler.ir import Kernel, KernelBuilder
from plugrt.dtype import DType, dtypes
from plugrt.errors import PlugrtError

#: (Kr, Kb) of each named matrix (ITU-T H.273 Table 4)
MATRICES: dict[str, tuple[float, float]] = {"bt601": (0.299, 0.114), "bt709": (0.2126, 0.0722), "bt2020": (0.2627, 0.0593)}
#: the VUI's matrix_coefficients codes (H.273 Table 4) this module maps to a named matrix
VUI_MATRIX = {1: "bt709", 5: "bt601", 6: "bt601", 9: "bt2020", 10: "bt2020"}
OUTPUT_DTYPES = (dtypes.float32, dtypes.float16, dtypes.uint8)
LOCAL = (16, 16, 1)


class VideoArgumentError(PlugrtError, ValueError):
  """A conversion argument that cannot work (uint8 with normalize=True, an unknown colour space)."""


class Surface(NamedTuple):
  """A decoded 4:2:0 picture in a device buffer, laid out as the module docstring says."""
  buffer: Any                 # plugrt.Buffer of uint8 or uint16 elements
  width: int                  # the picture to convert, after cropping
  height: int
  pitch: int                  # elements per row, both planes
  chroma_offset: int          # element index of the interleaved Cb/Cr plane
  bit_depth: int = 8
  shift: int = 0              # sample = element >> shift
  x0: int = 0                 # top-left of the picture in the luma plane (a crop)
  y0: int = 0
  full_range: bool = False    # the VUI's video_full_range_flag
  matrix: int = 2             # the VUI's matrix_coefficients (2: unspecified)


class Frame(NamedTuple):
  """One decoded picture, as a decoder hands it to the front end (plugrt.video). `release()` (or None) gives the
  surface back to the decoder once the conversion kernel that reads it is queued; the decoder decides when the memory
  may be reused."""
  timestamp: int
  surface: Surface
  release: Callable[[], None] | None


def coefficients(kr: float, kb: float) -> tuple[float, float, float, float]:
  """(rv, gu, gv, bu) of the matrix with luma weights Kr, Kb."""
  kg = 1.0 - kr - kb
  return 2 * (1 - kr), -2 * kb * (1 - kb) / kg, -2 * kr * (1 - kr) / kg, 2 * (1 - kb)


def default_matrix(vui_matrix: int, height: int) -> str:
  """The named matrix for a VUI matrix_coefficients code; unspecified or unknown: BT.709 from 720 lines up, else BT.601
  (what players assume for untagged video)."""
  return VUI_MATRIX.get(vui_matrix) or ("bt709" if height >= 720 else "bt601")


def resolve_color_space(color_space: str | Sequence[float] | None, vui_matrix: int = 2, height: int = 0) -> tuple[float, float, float, float]:
  """(rv, gu, gv, bu) for a `color_space` argument: a name, a 4-tuple, or None (the stream's VUI)."""
  if color_space is None: color_space = default_matrix(vui_matrix, height)
  if isinstance(color_space, str):
    if color_space.lower() not in MATRICES:
      raise VideoArgumentError(f"unknown color_space {color_space!r}: use one of {', '.join(MATRICES)}, None (the stream's VUI) "
                       "or a tuple (rv, gu, gv, bu) (docs/video.md)")
    return coefficients(*MATRICES[color_space.lower()])
  try: values = tuple(float(c) for c in color_space)
  except (TypeError, ValueError): raise TypeError(f"color_space must be a name, None or 4 numbers (rv, gu, gv, bu), not {color_space!r}") from None
  if len(values) != 4 or not all(math.isfinite(c) for c in values):
    raise VideoArgumentError(f"a custom color_space is 4 finite numbers (rv, gu, gv, bu), got {color_space!r}")
  return values  # type: ignore[return-value]


def check_output(dtype: Any, normalize: bool) -> DType:
  """The output dtype, checked against `normalize` (uint8 holds 0..255 only)."""
  dt = dtypes.as_dtype(dtype)
  if dt not in OUTPUT_DTYPES: raise TypeError(f"video frames convert to float32, float16 or uint8, not {dt.name}")
  if not isinstance(normalize, bool): raise TypeError(f"normalize must be True or False, not {normalize!r}")
  if dt is dtypes.uint8 and normalize:
    raise VideoArgumentError("dtype=uint8 needs normalize=False: normalized values in [0, 1] do not fit uint8 levels",
                             "pass normalize=False for uint8, or dtype=float16/float32 with normalize=True")
  return dt


def range_constants(bit_depth: int, full_range: bool) -> tuple[float, float, float, float]:
  """(y_offset, y_scale, c_mid, c_scale) for samples of `bit_depth` bits."""
  k = 1 << (bit_depth - 8)
  if full_range:
    top = float((1 << bit_depth) - 1)
    return 0.0, 1.0 / top, float(1 << (bit_depth - 1)), 1.0 / top
  return 16.0 * k, 1.0 / (219.0 * k), float(1 << (bit_depth - 1)), 1.0 / (224.0 * k)


_KERNELS: dict[tuple[DType, DType], Kernel] = {}


def kernel(sample: DType, out: DType) -> Kernel:
  """The conversion kernel for `sample` (uint8 or uint16) elements and `out` pixels, built once."""
  if (k := _KERNELS.get((sample, out))) is not None: return k
  b = KernelBuilder(f"yuv420sp_{sample.name}_to_rgb_{out.name}")
  dst, src = b.buffer("rgb", out), b.buffer("surface", sample)
  i32, f32 = dtypes.int32, dtypes.float32
  width, height, pitch, chroma, shift, x0, y0 = (b.scalar(n, i32) for n in ("width", "height", "pitch", "chroma", "shift", "x0", "y0"))
  y_off, y_scale, c_mid, c_scale, rv, gu, gv, bu, scale, bias = (b.scalar(n, f32) for n in
    ("y_off", "y_scale", "c_mid", "c_scale", "rv", "gu", "gv", "bu", "scale", "bias"))
  x, y = b.global_id(0), b.global_id(1)
  with b.if_((x < width) & (y < height)):
    sx, sy = x + x0, y + y0
    luma = (src[sy * pitch + sx].cast(i32) >> shift).cast(f32)
    ci = chroma + (sy >> 1) * pitch + ((sx >> 1) << 1)
    cb = ((src[ci].cast(i32) >> shift).cast(f32) - c_mid) * c_scale
    cr = ((src[ci + 1].cast(i32) >> shift).cast(f32) - c_mid) * c_scale
    yn = (luma - y_off) * y_scale
    o = (y * width + x) * 3
    for k, v in enumerate((yn + rv * cr, yn + gu * cb + gv * cr, yn + bu * cb)):
      dst[o + k] = (v.max(0.0).min(1.0) * scale + bias).cast(out)
  k = _KERNELS[(sample, out)] = b.finish()
  return k


def launch_args(s: Surface, out: DType, normalize: bool, color_space: str | Sequence[float] | None,
                full_range: bool | None = None) -> tuple[tuple[int, ...], tuple[int, int, int]]:
  """(scalar values, global size) for converting surface `s`."""
  rv, gu, gv, bu = resolve_color_space(color_space, s.matrix, s.height)
  fr = s.full_range if full_range is None else full_range
  y_off, y_scale, c_mid, c_scale = range_constants(s.bit_depth, fr)
  scale = 1.0 if normalize else 255.0
  bias = 0.5 if out is dtypes.uint8 else 0.0
  vals = (s.width, s.height, s.pitch, s.chroma_offset, s.shift, s.x0, s.y0, y_off, y_scale, c_mid, c_scale, rv, gu, gv, bu, scale, bias)
  return vals, (-(-s.width // LOCAL[0]), -(-s.height // LOCAL[1]), 1)  # type: ignore[return-value]


def convert(s: Surface, dtype: Any = dtypes.float32, normalize: bool = True, color_space: str | Sequence[float] | None = None,
            full_range: bool | None = None, out: Any = None) -> Any:
  """Convert surface `s` on its buffer's device to an (height, width, 3) Tensor there. `out`: a Buffer of
  height*width*3 elements of `dtype` to write into instead of a new one."""
  from plugrt.device import Buffer
  from plugrt.frontend.tensor import Tensor
  dt = check_output(dtype, normalize)
  sample = s.buffer.dtype
  if sample not in (dtypes.uint8, dtypes.uint16): raise TypeError(f"a surface holds uint8 or uint16 elements, not {sample.name}")
  last = s.chroma_offset + ((s.y0 + s.height - 1) >> 1) * s.pitch + (((s.x0 + s.width - 1) >> 1) << 1) + 1
  if s.width <= 0 or s.height <= 0 or (s.y0 + s.height - 1) * s.pitch + s.x0 + s.width > s.chroma_offset or last >= s.buffer.size:
    raise ValueError(f"a {s.width}x{s.height} picture at ({s.x0}, {s.y0}) with pitch {s.pitch} and chroma at {s.chroma_offset} "
                     f"does not fit a surface of {s.buffer.size} elements")
  dev = s.buffer.device
  prg = dev.program(kernel(sample, dt))
  n = s.width * s.height * 3
  if out is None: out = Buffer(dev, n, dt)
  elif out.size != n or out.dtype is not dt: raise ValueError(f"out must hold {n} {dt.name}, it holds {out.size} {out.dtype.name}")
  vals, grid = launch_args(s, dt, normalize, color_space, full_range)
  prg(out, s.buffer, global_size=grid, local_size=LOCAL, vals=vals)
  return Tensor.from_buffer(out, (s.height, s.width, 3))


def surface_from_planes(device: Any, y: Any, u: Any, v: Any, bit_depth: int, full_range: bool = False, matrix: int = 2,
                        width: int | None = None, height: int | None = None) -> Surface:
  """A Surface on `device` from three host planes (numpy: Y of (H, W), Cb and Cr of (ceil(H/2), ceil(W/2))), interleaving
  Cb and Cr into the semi-planar layout. 8-bit planes as uint8, deeper ones as uint16 holding the sample in the low bits."""
  import numpy as np

  from plugrt.device import Buffer
  h, w = y.shape
  deep = bit_depth > 8
  et = np.uint16 if deep else np.uint8
  pitch = w + (w & 1)  # an even pitch: each Cb/Cr pair of a row fits
  ch = (h + 1) // 2
  host = np.zeros(pitch * h + pitch * ch + (0 if deep else (-(pitch * (h + ch))) % 4), et)  # whole 32-bit words for 8-bit planes
  host[: pitch * h].reshape(h, pitch)[:, :w] = y
  uv = host[pitch * h: pitch * (h + ch)].reshape(ch, pitch)
  uv[:, 0:2 * u.shape[1]:2], uv[:, 1:2 * v.shape[1]:2] = u, v
  buf = Buffer(device, host.size, dtypes.uint16 if deep else dtypes.uint8)
  buf.copyin(host)
  return Surface(buf, width or w, height or h, pitch, pitch * h, bit_depth, 0, 0, 0, full_range, matrix)
