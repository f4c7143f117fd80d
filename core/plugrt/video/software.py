"""The software decoder: PyAV (FFmpeg's HEVC decoder, `pip install "plugrt[video]"`), on every machine.

It feeds the stream to FFmpeg one access unit at a time (split by plugrt.video.hevc, so an error names the access
unit's byte offset), takes each decoded picture's planes on the host, lays them out as the semi-planar surface the
conversion kernel reads (plugrt.video.convert.surface_from_planes) on the target device, and reports the VUI's
range and matrix that FFmpeg read with the picture. Decoding runs in this thread, in display order.

A damaged picture is a VideoStreamError at its access unit's offset, as NVDEC's decode status makes it there. FFmpeg
decodes whatever bits it is given and reports nothing: a slice cut short is decoded on from the zeros past its end,
and the part of a picture whose slices are missing keeps what the frame's memory held (a truncated stream gave frames
up to 255 levels off). So:
- FFmpeg runs with `err_detect=explode` (a unit it cannot parse is an error, not skipped), and a picture it marks
  corrupt (AV_FRAME_FLAG_CORRUPT or decode_error_flags: `frame.is_corrupt`) is an error;
- a cut damages only the stream's end, so the last access unit's picture is decoded again. A slice whose data is all
  there is never read past its end, so its picture does not change with the bytes after it; one whose decoding needs
  bytes past the end does. When the stream ends in a slice, a second decoder fed the same access units from the
  random access point before it (its IRAP picture; the one before that for a RASL picture) decodes it with
  LAST_UNIT_TAIL past the end, and two decoders that start at it (its references missing) with nothing and with
  ALONE_TAIL; any difference is an error. Those two decode into fresh, zeroed memory, where a CTB no slice reaches
  stays all zero (a decoded one starts from mid-grey there): that is an error too, as a cut between two slices of
  the picture leaves every unit whole.
  The error comes when the picture would, in display order; the pictures shown before it are the intact stream's.
  This costs decoding the stream's last group of pictures (from its last IRAP picture) a second time. It can miss:
  the decodes of a small skip-coded slice cut a few bytes short sometimes agree on the same wrong picture, as FFmpeg
  tells neither where a slice's decoding ended nor that it read past the data (docs/video.md has the rate measured).
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from plugrt.errors import Reason, VideoDecoderUnavailable, VideoStreamError
from plugrt.hookspecs import Probe
from plugrt.probing import has_module
from plugrt.video.convert import Frame, surface_from_planes
from plugrt.video.hevc import AUD, PPS, SPS, VPS, NalUnit, StreamInfo, access_units, parse_pps, parse_sps, parse_vps, slice_pps_id, split_nal_units

NAME = "PYAV"
HINT = 'pip install "plugrt[video]" (PyAV, with FFmpeg\'s HEVC decoder)'
_FORMATS = {"yuv420p": 8, "yuvj420p": 8, "yuv420p10le": 10, "yuv420p12le": 12}
_PARSE = {VPS: parse_vps, SPS: parse_sps, PPS: parse_pps}
_IRAP, _RASL = range(16, 24), (8, 9)
# what the checks of the last picture read past the stream's end, where the decoder reads zeros: all ones, and bytes
# from 1 to 255 in a scrambled order (no 00 00, which would start a NAL unit)
LAST_UNIT_TAIL, ALONE_TAIL = b"\xff" * 64, bytes((37 * i * i + 101 * i + 59) % 255 + 1 for i in range(64))
_UNCHECKED = object()
_CUT = "the stream ends inside the slice data of its last picture: decoding it needs bytes past the end"


def probe(ctx: Any = None) -> Probe:
  if not has_module("av"): return Probe.missing(Reason.NOT_INSTALLED, "PyAV (the av package) is not installed", HINT)
  return Probe.found(1, "FFmpeg's HEVC decoder through PyAV, on the CPU")


def _packet(av: Any, units: list[NalUnit], pts: int | None = None, tail: bytes = b"") -> Any:
  """Units as one packet in memory FFmpeg owns: a packet over Python bytes is released by FFmpeg's frame threads
  through a callback that takes the GIL, which deadlocked against a caller holding it (freeing the decoder)."""
  data = b"".join(b"\x00\x00\x01" + u.data for u in units) + tail
  p = av.Packet(len(data))
  memoryview(p)[:] = data
  p.pts = pts
  return p


def _release(ctx: Any) -> None:
  """Drop a decoder once its threads are idle (avcodec_flush_buffers runs without the GIL): freeing it waits for them
  while holding the GIL, which a thread logging through PyAV's callback needs."""
  try: ctx.flush_buffers()
  except Exception: pass


def _planes(f: Any, offset: int) -> tuple[list[Any], int]:
  """The picture's visible Y, Cb, Cr planes (views of the frame) and its bit depth."""
  import numpy as np
  bits = _FORMATS.get(f.format.name)
  if bits is None:
    raise VideoStreamError(f"pictures in {f.format.name} are not 4:2:0 at 8 to 12 bits, which plugrt converts", offset)
  et = np.uint8 if bits == 8 else np.uint16
  planes = []
  for i, p in enumerate(f.planes):
    h, w = (f.height, f.width) if i == 0 else ((f.height + 1) // 2, (f.width + 1) // 2)
    planes.append(np.frombuffer(p, et).reshape(-1, p.line_size // np.dtype(et).itemsize)[:h, :w])
  return planes, bits


class SoftwareDecoder:
  """One stream through FFmpeg's HEVC decoder (threads: all cores, as FFmpeg chooses)."""

  def __init__(self, device: Any, stream: bytes, info: StreamInfo, options: dict[str, Any]):
    try:
      import av
    except ImportError as e: raise VideoDecoderUnavailable(f"PyAV cannot be imported: {e}", Reason.NOT_INSTALLED, HINT) from None
    self.av, self.device, self.stream, self.info = av, device, stream, info
    self.thread_type = options.get("thread_type", "AUTO")
    self.ctx: Any = self._context()
    # the last access unit's checks: its picture as decoded again, and what the decodes of it alone found
    self.last, self.expected, self.damage = len(info.access_units) - 1, _UNCHECKED, ""
    self.closed = False

  def _context(self, alone: bool = False) -> Any:
    """A decoder as this stream's; `alone`: for one picture without its references (FFmpeg then marks it corrupt and
    shows it only with output_corrupt), on this thread."""
    ctx = self.av.CodecContext.create("hevc", "r")
    ctx.thread_type = "NONE" if alone else self.thread_type
    ctx.options = {"flags": "+output_corrupt"} if alone else {"err_detect": "explode"}
    return ctx

  def frames(self) -> Iterator[Any]:
    av, shown, offset = self.av, 0, 0
    params: dict[tuple[int, int], NalUnit] = {}  # the parameter sets in force, by (type, id)
    starts: list[tuple[int, list[NalUnit]]] = []  # the last two IRAP access units: (index, parameter sets in force there)
    try:
      for k, au in enumerate(access_units(split_nal_units(self.stream))):
        offset = au[0].offset
        kind = next((u.type for u in au if u.is_vcl), -1)
        if kind in _IRAP: starts = [*starts[-1:], (k, [params[key] for key in sorted(params)])]
        for u in au:
          if u.type in _PARSE and u.layer_id == 0: params[(u.type, _PARSE[u.type](u).id)] = u
        if k == self.last and au[-1].is_vcl:  # the stream ends in a slice, which a cut may have shortened
          start = (starts[-2] if len(starts) > 1 else None) if kind in _RASL else (starts[-1] if starts else None)
          if start is not None: self.expected = self._decode_again(*start)
        if k == self.last and kind >= 0: self.damage = self._check_alone([params[key] for key in sorted(params)], au)
        for f in self._decode(_packet(av, au, k), offset):
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
      raise VideoStreamError(f"FFmpeg's HEVC decoder rejected the stream at this access unit or one shortly before it: {e}", offset) from None

  def _decode_again(self, first: int, params: list[NalUnit]) -> list[Any] | None:
    """The last access unit's picture (its planes) from a second decoder fed the parameter sets in force at access unit
    `first` (an IRAP picture), the access units from there, and LAST_UNIT_TAIL after the stream's end; None when it
    yields no such picture. A picture no later one can refer to (a sub-layer non-reference picture with no picture of
    a higher sub-layer after it) is left out when its access unit holds nothing else."""
    ctx, got = self._context(), None
    aus = list(access_units(split_nal_units(memoryview(self.stream)[self.info.access_units[first] - 3:])))
    later = [-1] * len(aus)  # the highest TemporalId of the pictures after each access unit
    for j in range(len(aus) - 2, -1, -1): later[j] = max(later[j + 1], max((u.temporal_id for u in aus[j + 1] if u.is_vcl), default=-1))
    try:
      for j, au in enumerate(aus):
        k = first + j
        if 0 < j < len(aus) - 1 and all((u.is_vcl and u.type <= 14 and u.type % 2 == 0 and u.temporal_id >= later[j]) or u.type == AUD for u in au):
          continue
        # the parameter sets go in the first packet: a packet before the IRAP picture would make it not the stream's
        # first for FFmpeg, which then decodes its RASL pictures (their references are missing here) instead of dropping them
        units = params + au if j == 0 else au
        for f in ctx.decode(_packet(self.av, units, k, LAST_UNIT_TAIL if k == self.last else b"")):
          if f.pts == self.last: got = [p.copy() for p in _planes(f, 0)[0]]
      for f in ctx.decode(None):
        if f.pts == self.last: got = [p.copy() for p in _planes(f, 0)[0]]
    except (self.av.error.FFmpegError, VideoStreamError): return None
    finally: _release(ctx)
    return got

  def _alone(self, units: list[NalUnit], tail: bytes) -> tuple[list[Any] | None, int]:
    """The planes of the picture of access unit `units` (parameter sets first) decoded alone, into fresh zeroed memory,
    with `tail` after its last unit, and how many of its CTBs stay all zero (no slice reached them); (None, 0) when
    FFmpeg gives no picture."""
    first = next(u for u in units if u.is_vcl)
    sps = self.info.sps[self.info.pps[slice_pps_id(first)].sps_id]
    ctx = self._context(alone=True)
    try: frames = list(ctx.decode(_packet(self.av, units, None, tail))) + list(ctx.decode(None))
    except self.av.error.FFmpegError: return None, 0
    finally: _release(ctx)
    if len(frames) != 1: return None, 0
    planes = [p.copy() for p in _planes(frames[0], 0)[0]]
    y, cb, cr = planes
    ctb, (left, right, top, bottom) = 1 << sps.log2_max_cb, sps.conformance_window
    missing = 0
    for r0 in range(0, sps.height, ctb):  # each CTB in coded samples, cut to the visible window, in the frame's coordinates
      for c0 in range(0, sps.width, ctb):
        r, c = max(r0, top) - top, max(c0, left) - left
        r1, c1 = min(r0 + ctb, sps.height - bottom) - top, min(c0 + ctb, sps.width - right) - left
        if r < r1 and c < c1 and not (y[r:r1, c:c1].any() or cb[r // 2:(r1 + 1) // 2, c // 2:(c1 + 1) // 2].any() or
                                      cr[r // 2:(r1 + 1) // 2, c // 2:(c1 + 1) // 2].any()):
          missing += 1
    return planes, missing

  def _check_alone(self, params: list[NalUnit], au: list[NalUnit]) -> str:
    """Why the last access unit's picture is damaged, from decodes of it alone ("" when they find nothing): CTBs no
    slice reaches, or, when the stream ends in a slice, a picture that changes with the bytes past the end."""
    import numpy as np
    plain, missing = self._alone(params + au, b"")
    if missing: return f"the stream ends between the slices of its last picture: {missing} of its coding tree blocks are in no slice"
    if plain is None or not au[-1].is_vcl: return ""
    tailed, missing = self._alone(params + au, ALONE_TAIL)
    if missing or tailed is None or not all(np.array_equal(a, b) for a, b in zip(plain, tailed)): return _CUT
    return ""

  def _surface(self, f: Any, offset: int) -> Any:
    k = f.pts
    at = self.info.access_units[k] if isinstance(k, int) and 0 <= k < len(self.info.access_units) else offset
    if f.is_corrupt:
      raise VideoStreamError("FFmpeg's HEVC decoder marked the picture of this access unit damaged (a corrupt slice or a missing "
                             "reference picture)", at, "check the stream is complete")
    planes, bits = _planes(f, at)
    if k == self.last:
      import numpy as np
      damage = self.damage or ("" if self.expected is _UNCHECKED or (self.expected is not None and all(
        np.array_equal(a, b) for a, b in zip(planes, self.expected))) else _CUT)
      if damage: raise VideoStreamError(f"{damage} (a truncated stream)", at, "check the stream is complete")
    full = f.color_range == 2 or f.format.name.startswith("yuvj")  # AVCOL_RANGE_JPEG
    return surface_from_planes(self.device, *planes, bits, full, int(f.colorspace))

  def close(self) -> None:
    if not self.closed:
      self.closed = True
      _release(self.ctx)
      self.ctx = None


def open_decoder(device: Any, stream: bytes, info: StreamInfo, options: dict[str, Any]) -> SoftwareDecoder:
  return SoftwareDecoder(device, stream, info, options)
