"""HEVC test streams made with PyAV's libx265, and a numpy reference of plugrt.video's colour conversion (for tests
and bench/video.py). Needs `av` (pip install "plugrt[video]") and numpy."""
from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

#: x265 options per colour tag: (colour primaries, transfer, matrix) as x265 names them
TAGS = {"bt601": "colorprim=smpte170m:transfer=smpte170m:colormatrix=smpte170m",
        "bt709": "colorprim=bt709:transfer=bt709:colormatrix=bt709",
        "bt2020": "colorprim=bt2020:transfer=bt2020-10:colormatrix=bt2020nc"}


def make_hevc(width: int, height: int, frames: int = 6, bit_depth: int = 8, tag: str | None = None, full_range: bool = False,
              seed: int = 0, params: str = "", pattern: str = "noise") -> bytes:
  """An Annex B HEVC stream of `frames` pictures (Main for 8 bits, Main10 for 10) with B-frames, so decode order differs
  from display order. pattern "noise": random pixels; "gradient": smooth moving ramps (compresses like real video)."""
  import av
  import numpy as np
  if width < 64 or width % 2 or height % 2:  # seen here: libx265 (PyAV 18's) corrupts the heap for pictures narrower than 64
    raise ValueError(f"make_hevc makes widths from 64 and even sizes (4:2:0), not {width}x{height}")
  pix = "yuv420p" if bit_depth == 8 else "yuv420p10le"
  opts = ["log-level=error", "bframes=2", "keyint=30"]
  if tag: opts.append(TAGS[tag])
  if full_range: opts.append("range=full")
  if params: opts.append(params)
  buf = io.BytesIO()
  with av.open(buf, "w", format="hevc") as out:
    s = out.add_stream("libx265", rate=25)
    s.width, s.height, s.pix_fmt = width, height, pix
    s.options = {"x265-params": ":".join(opts)}
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width]
    for i in range(frames):
      if pattern == "noise": rgb = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
      else: rgb = np.stack([(xx * 3 + i * 4) % 256, (yy * 2 + i * 2) % 256, ((xx + yy) + i * 8) % 256], -1).astype(np.uint8)
      for p in s.encode(av.VideoFrame.from_ndarray(rgb, format="rgb24").reformat(format=pix)): out.mux(p)
    for p in s.encode(): out.mux(p)
  return buf.getvalue()


def pyav_planes(stream: bytes) -> list[tuple[Any, Any, Any, int, bool, int]]:
  """PyAV's own decode of a stream: per picture in display order (Y, Cb, Cr as numpy, bit depth, full range, VUI matrix)."""
  import av
  import numpy as np
  ctx = av.CodecContext.create("hevc", "r")
  packets = ctx.parse(stream) + ctx.parse(None)  # None flushes the parser's last packet
  frames = [f for p in packets for f in ctx.decode(p)] + list(ctx.decode(None))
  out = []
  for f in frames:
    bits = 8 if f.format.name in ("yuv420p", "yuvj420p") else 10
    et = np.uint8 if bits == 8 else np.uint16
    planes = []
    for i, p in enumerate(f.planes):
      h, w = (f.height, f.width) if i == 0 else ((f.height + 1) // 2, (f.width + 1) // 2)
      planes.append(np.frombuffer(p, et).reshape(-1, p.line_size // np.dtype(et).itemsize)[:h, :w].copy())
    out.append((*planes, bits, f.color_range == 2, int(f.colorspace)))
  return out


def reference_rgb(y: Any, cb: Any, cr: Any, bit_depth: int, full_range: bool, color_space: str | Sequence[float], normalize: bool,
                  uint8: bool = False) -> Any:
  """numpy (float64) of what plugrt.video.convert computes, written from the standard formulas, not from its code."""
  import numpy as np
  kr_kb = {"bt601": (0.299, 0.114), "bt709": (0.2126, 0.0722), "bt2020": (0.2627, 0.0593)}
  h, w = y.shape
  up = lambda c: np.repeat(np.repeat(c.astype(np.float64), 2, 0), 2, 1)[:h, :w]
  Y, U, V, n = y.astype(np.float64), up(cb), up(cr), bit_depth
  if full_range: Y, U, V = Y / (2 ** n - 1), (U - 2 ** (n - 1)) / (2 ** n - 1), (V - 2 ** (n - 1)) / (2 ** n - 1)
  else:
    k = 2 ** (n - 8)
    Y, U, V = (Y - 16 * k) / (219 * k), (U - 2 ** (n - 1)) / (224 * k), (V - 2 ** (n - 1)) / (224 * k)
  if isinstance(color_space, str):
    kr, kb = kr_kb[color_space]
    kg = 1 - kr - kb
    rv, gu, gv, bu = 2 * (1 - kr), -2 * kb * (1 - kb) / kg, -2 * kr * (1 - kr) / kg, 2 * (1 - kb)
  else: rv, gu, gv, bu = color_space
  rgb = np.clip(np.stack([Y + rv * V, Y + gu * U + gv * V, Y + bu * U], -1), 0, 1) * (1.0 if normalize else 255.0)
  return np.floor(rgb + 0.5).astype(np.uint8) if uint8 else rgb


def nvdec_streams() -> dict[str, bytes]:
  """The streams the hardware-decoder tests compare with PyAV (plugrt-cuda's NVDEC, plugrt-nv's video engine): 8-bit,
  cropped full-range, 10-bit, a resolution change, and one below NVDEC's smallest HEVC picture (144x144 on Hopper)."""
  return {"8bit-bt709": make_hevc(256, 144, frames=12, tag="bt709", pattern="gradient"),
          "8bit-cropped-bt601-full": make_hevc(202, 146, frames=8, tag="bt601", full_range=True),
          "10bit-bt2020": make_hevc(320, 180, frames=10, bit_depth=10, tag="bt2020", pattern="gradient"),
          "resolution-change": make_hevc(192, 144, frames=5, tag="bt709") + make_hevc(320, 176, frames=6, tag="bt709", seed=3),
          "too-small": make_hevc(128, 72, frames=2, tag="bt709")}
