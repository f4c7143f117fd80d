"""The software decoder: PyAV (FFmpeg's HEVC decoder, `pip install "plugrt[video]"`), on every machine.

It feeds the stream to FFmpeg one access unit at a time (split by plugrt.video.hevc, so an error names the access
unit's byte offset), takes each decoded picture's planes on the host, lays them out as the semi-planar surface the
conversion kernel reads (plugrt.video.convert.surface_from_planes) on the target device, and reports the VUI's
range and matrix that FFmpeg read with the picture. Decoding runs in this thread, in display order.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from plugrt.errors import Reason, VideoDecoderUnavailable, VideoStreamError
from plugrt.hookspecs import Probe
from plugrt.probing import has_module
from plugrt.video.convert import surface_from_planes
from plugrt.video.hevc import StreamInfo, access_units, split_nal_units

NAME = "PYAV"
HINT = 'pip install "plugrt[video]" (PyAV, with FFmpeg\'s HEVC decoder)'
_FORMATS = {"yuv420p": 8, "yuvj420p": 8, "yuv420p10le": 10, "yuv420p12le": 12}


def probe(ctx: Any = None) -> Probe:
  if not has_module("av"): return Probe.missing(Reason.NOT_INSTALLED, "PyAV (the av package) is not installed", HINT)
  return Probe.found(1, "FFmpeg's HEVC decoder through PyAV, on the CPU")


class SoftwareDecoder:
  """One stream through FFmpeg's HEVC decoder (threads: all cores, as FFmpeg chooses)."""

  def __init__(self, device: Any, stream: bytes, info: StreamInfo, options: dict[str, Any]):
    try:
      import av
    except ImportError as e: raise VideoDecoderUnavailable(f"PyAV cannot be imported: {e}", Reason.NOT_INSTALLED, HINT) from None
    self.av, self.device, self.stream, self.info = av, device, stream, info
    self.ctx: Any = av.CodecContext.create("hevc", "r")
    self.ctx.thread_type = options.get("thread_type", "AUTO")
    self.closed = False

  def frames(self) -> Iterator[Any]:
    from plugrt.video import Frame
    av, shown, offset = self.av, 0, 0
    try:
      for au in access_units(split_nal_units(self.stream)):
        offset = au[0].offset
        packet = av.Packet(b"".join(b"\x00\x00\x01" + u.data for u in au))
        for f in self._decode(packet, offset):
          yield Frame(shown, self._surface(f, offset), None)
          shown += 1
      for f in self._decode(None, offset):
        yield Frame(shown, self._surface(f, offset), None)
        shown += 1
    finally: self.close()
    if shown < self.info.pictures:
      raise VideoStreamError(f"{self.info.pictures - shown} of the stream's {self.info.pictures} pictures could not be decoded "
                             "(a truncated or corrupt stream)", offset, "check the stream is complete")

  def _decode(self, packet: Any, offset: int) -> list[Any]:
    try: return list(self.ctx.decode(packet))
    except self.av.error.FFmpegError as e:
      raise VideoStreamError(f"FFmpeg's HEVC decoder rejected the access unit: {e}", offset) from None

  def _surface(self, f: Any, offset: int) -> Any:
    import numpy as np
    bits = _FORMATS.get(f.format.name)
    if bits is None:
      raise VideoStreamError(f"pictures in {f.format.name} are not 4:2:0 at 8 to 12 bits, which plugrt converts", offset)
    et = np.uint8 if bits == 8 else np.uint16
    planes = []
    for i, p in enumerate(f.planes):
      h, w = (f.height, f.width) if i == 0 else ((f.height + 1) // 2, (f.width + 1) // 2)
      a = np.frombuffer(p, et).reshape(-1, p.line_size // np.dtype(et).itemsize)
      planes.append(a[:h, :w])
    full = f.color_range == 2 or f.format.name.startswith("yuvj")  # AVCOL_RANGE_JPEG
    return surface_from_planes(self.device, *planes, bits, full, int(f.colorspace))

  def close(self) -> None:
    if not self.closed:
      self.closed = True
      self.ctx = None


def open_decoder(device: Any, stream: bytes, info: StreamInfo, options: dict[str, Any]) -> SoftwareDecoder:
  return SoftwareDecoder(device, stream, info, options)
