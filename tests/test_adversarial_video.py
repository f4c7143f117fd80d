"""Video streams built to break the front end (issue 32, items 3 and 9).

The software decoder keeps NVDEC's promise: a truncated or damaged picture is a VideoStreamError at its access unit's
offset, never a frame other than the intact stream's (FFmpeg decodes a cut slice on from the zeros past its end and
said nothing: frames up to 255 levels off), and an intact stream decodes every frame as PyAV does. The HEVC scan
refuses a stream at one of its limits (MAX_AU_UNITS, MAX_PARAMETER_SET_BYTES, MAX_SPS_VERSIONS), naming the limit and
the offset, or reads it in memory linear in its size with a small constant (it kept every unit of an access unit that
never ended: 30 MB of access unit delimiters took 15 s and 1.3 GB before the error). The decodes that could hang run
in a fresh interpreter with a timeout.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from plugrt import dtypes
from plugrt.errors import VideoStreamError
from plugrt.video import decode_annexb_iter, hevc

AUD = b"\x00\x00\x01\x46\x01\x50"              # access unit delimiter, pic_type 2
EOB = b"\x00\x00\x01\x4a\x01"                  # end of bitstream: each one closes an access unit
SEI = b"\x00\x00\x01\x4e\x01\x05\x01\x41\x80"  # a prefix SEI (never parsed)
TRUNCATED_VPS = b"\x00\x00\x01\x40\x01\x0c"     # a VPS cut inside its first fields
IDR_STUB = b"\x00\x00\x01\x26\x01\xf0"          # an IDR slice segment: first in picture, PPS 0 (all a scan reads of it)
MIB = 1 << 20


def scan_peak(stream: bytes) -> tuple[Any, int]:
  """(scan's result or the VideoStreamError it raised, the peak of memory it allocated, in bytes)."""
  tracemalloc.start()
  try:
    try: out: Any = hevc.scan(stream)
    except VideoStreamError as e: out = e
    return out, tracemalloc.get_traced_memory()[1]
  finally: tracemalloc.stop()


@pytest.fixture(scope="module")
def av() -> Any: return pytest.importorskip("av")


@pytest.fixture(scope="module")
def units(av: Any) -> dict[str, bytes]:
  """Parameter sets of two real streams of different sizes, each with its start code."""
  from plugrt_testing.video import make_hevc
  out = {}
  for tag, (w, h) in {"a": (64, 48), "b": (96, 64)}.items():
    for u in hevc.split_nal_units(make_hevc(w, h, frames=1)):
      if u.type in (hevc.VPS, hevc.SPS, hevc.PPS): out[f"{u.name}_{tag}"] = b"\x00\x00\x01" + u.data
  return out


# ---------------------------------------------------------------- item 9: the scan's memory is bounded by the stream's structure

@pytest.mark.parametrize("unit", [AUD, EOB, SEI], ids=["AUD", "EOB", "SEI"])
def test_floods_of_units_without_a_picture_are_refused_at_the_limit(unit: bytes) -> None:
  """1 MiB of one unit that never ends an access unit (or, EOB, ends one each time): the old scan kept them all (31 MiB
  of AUDs) and only then found no picture; now the unit past MAX_AU_UNITS is the error, with its offset."""
  err, peak = scan_peak(unit * (MIB // len(unit)))
  assert peak < MIB // 4, f"the scan held {peak} bytes"
  assert isinstance(err, VideoStreamError) and "MAX_AU_UNITS" in str(err), err
  assert err.offset == hevc.MAX_AU_UNITS * len(unit) + 3


def test_a_flood_of_valid_parameter_sets_is_refused_at_the_limit(units: dict[str, bytes]) -> None:
  vps = units["VPS_a"]
  err, peak = scan_peak(vps * (MIB // len(vps)))
  assert peak < MIB // 4, f"the scan held {peak} bytes"
  assert isinstance(err, VideoStreamError) and "MAX_AU_UNITS" in str(err) and err.offset == hevc.MAX_AU_UNITS * len(vps) + 3


def test_truncated_parameter_sets_fail_at_the_first() -> None:
  """1 MiB of truncated VPS units: the first one is the error, read before the rest (the old scan split them all first)."""
  err, peak = scan_peak(TRUNCATED_VPS * (MIB // len(TRUNCATED_VPS)))
  assert peak < MIB // 4, f"the scan held {peak} bytes"
  assert isinstance(err, VideoStreamError) and "VPS at byte 3: truncated" in str(err) and err.offset == 5


def test_an_access_unit_holds_up_to_the_limit() -> None:
  """The limit's edge on units made by hand: MAX_AU_UNITS units make one access unit, one more is the error."""
  def au(n: int) -> list[hevc.NalUnit]:
    return [hevc.NalUnit(0, b"\x26\x01\xf0", 19, 0, 0)] + [hevc.NalUnit(3 * i, b"\x02\x01\x40", 1, 0, 0) for i in range(1, n)]
  assert [len(a) for a in hevc.access_units(au(hevc.MAX_AU_UNITS))] == [hevc.MAX_AU_UNITS]
  with pytest.raises(VideoStreamError, match="an access unit of more than") as e: list(hevc.access_units(au(hevc.MAX_AU_UNITS + 1)))
  assert e.value.offset == 3 * hevc.MAX_AU_UNITS


def test_a_parameter_set_past_its_limit_is_refused(units: dict[str, bytes]) -> None:
  big = units["VPS_a"] + b"\x55" * hevc.MAX_PARAMETER_SET_BYTES
  with pytest.raises(VideoStreamError, match="MAX_PARAMETER_SET_BYTES") as e: hevc.scan(big + units["SPS_a"])
  assert e.value.offset == 3


def test_different_sps_are_bounded(units: dict[str, bytes]) -> None:
  """SPS units that differ only after what is parsed: the one past MAX_SPS_VERSIONS is the error."""
  sps = units["SPS_a"]
  versions = [sps + bytes([0x80 | (i >> 7), 0x80 | (i & 0x7F)]) for i in range(hevc.MAX_SPS_VERSIONS + 1)]
  with pytest.raises(VideoStreamError, match="MAX_SPS_VERSIONS") as e: hevc.scan(b"".join(versions))
  assert e.value.offset == sum(len(v) for v in versions[:-1]) + 3


def test_a_format_change_at_every_picture_costs_memory_linear_in_the_stream(units: dict[str, bytes]) -> None:
  """Two picture sizes taking turns, their parameter sets sent again before each picture: the old scan kept a parsed
  SPS (2 KB) per picture of ~90 bytes; now an SPS seen before is the same object, so the scan keeps less than the
  stream's size."""
  cycle = b"".join(units[f"VPS_{t}"] + units[f"SPS_{t}"] + units[f"PPS_{t}"] + IDR_STUB for t in "ab")
  stream = cycle * 1000
  info, peak = scan_peak(stream)
  assert not isinstance(info, VideoStreamError), info
  assert info.pictures == len(info.sequences) == 2000 and len(info.access_units) == 2000
  assert [s.display_size for s in info.sequences[:2]] == [(64, 48), (96, 64)]
  assert peak < len(stream), f"the scan held {peak} bytes for a stream of {len(stream)}"


def _reference_scan(stream: bytes) -> dict[str, Any]:
  """What scan() reports, computed the plain way: every unit split, grouped and parsed, the last of each id kept."""
  units = list(hevc.split_nal_units(stream))
  sets: dict[str, dict[int, Any]] = {"vps": {}, "sps": {}, "pps": {}}
  sequences, pictures, active = [], 0, None
  for u in units:
    if u.layer_id: continue
    parse = {hevc.VPS: ("vps", hevc.parse_vps), hevc.SPS: ("sps", hevc.parse_sps), hevc.PPS: ("pps", hevc.parse_pps)}.get(u.type)
    if parse:
      found = parse[1](u)
      sets[parse[0]][found.id] = found
    elif u.is_vcl and u.first_slice_in_picture:
      pictures += 1
      s = sets["sps"][sets["pps"][hevc.parse_slice_header(u, sets["pps"], sets["sps"]).pps_id].sps_id]
      fmt = (s.width, s.height, s.bit_depth_luma, s.chroma_format_idc)
      if active != fmt: sequences.append(s)
      active = fmt
  return {**sets, "sequences": sequences, "pictures": pictures, "units": len(units),
          "access_units": [au[0].offset for au in hevc.access_units(units)]}


def test_real_streams_scan_as_before(av: Any) -> None:
  from plugrt_testing.video import make_hevc
  streams = [make_hevc(64, 48, frames=6, tag="bt709"), make_hevc(128, 72, frames=5, bit_depth=10, tag="bt2020"),
             make_hevc(202, 146, frames=4, tag="bt601", full_range=True), make_hevc(128, 64, frames=33, pattern="gradient"),
             make_hevc(192, 256, frames=3, pattern="gradient", params="slices=2"),
             make_hevc(64, 48, frames=3, tag="bt709") + make_hevc(96, 64, frames=4, tag="bt709", seed=1)]
  for stream in streams:
    info = hevc.scan(stream)
    got = {"vps": info.vps, "sps": info.sps, "pps": info.pps, "sequences": info.sequences, "pictures": info.pictures, "units": info.units,
           "access_units": list(info.access_units)}
    assert got == _reference_scan(stream)


# ---------------------------------------------------------------- item 3: the software decoder reports damaged pictures

# libx265's output depends on its thread counts, which follow the machine's cores: these make the same bytes everywhere
ONE_THREAD = "frame-threads=1:pools=1"


@pytest.fixture(scope="module")
def streams(av: Any) -> dict[str, bytes]:
  from plugrt_testing.video import make_hevc
  return {"noise": make_hevc(64, 48, frames=6, tag="bt709", params=ONE_THREAD),
          "skip-heavy": make_hevc(128, 64, frames=40, pattern="gradient", params=ONE_THREAD),  # small B slices; an open GOP: a CRA, its RASL
          "two-slices": make_hevc(192, 256, frames=5, pattern="gradient", params="slices=2:" + ONE_THREAD),
          "10-bit": make_hevc(128, 72, frames=8, bit_depth=10, pattern="gradient", params=ONE_THREAD)}


def decode_until_error(stream: bytes) -> tuple[list[np.ndarray], VideoStreamError | None]:
  """The uint8 frames the software decoder yields, and the VideoStreamError that ended them (or None)."""
  frames: list[np.ndarray] = []
  try:
    with decode_annexb_iter(stream, dtype=dtypes.uint8, normalize=False, decoder="PYAV", device="CPU") as it:
      for _, t in it: frames.append(t.numpy())
  except VideoStreamError as e: return frames, e
  return frames, None


def display_order(av: Any, stream: bytes) -> list[int]:
  """The access unit of each picture PyAV shows, in display order."""
  ctx, out = av.CodecContext.create("hevc", "r"), []
  for k, au in enumerate(hevc.access_units(hevc.split_nal_units(stream))):
    data = b"".join(b"\x00\x00\x01" + u.data for u in au)
    p = av.Packet(len(data))
    memoryview(p)[:] = data
    p.pts = k
    out += [f.pts for f in ctx.decode(p)]
  return out + [f.pts for f in ctx.decode(None)]


class Intact:
  """A stream's intact frames by access unit, to hold a cut stream's frames against."""

  def __init__(self, av: Any, stream: bytes):
    self.stream, self.aus = stream, list(hevc.access_units(hevc.split_nal_units(stream)))
    self.order = display_order(av, stream)
    frames, err = decode_until_error(stream)
    assert err is None and len(frames) == len(self.order)
    self.by_au = dict(zip(self.order, frames))

  def check_cut(self, cut: int) -> None:
    """The stream cut at byte `cut` (after the first slice of access unit a began): a VideoStreamError at a's offset, after frames that are the
    intact stream's, in its display order, up to a's picture at most; or, when a's picture does not need the bytes
    that are gone, every frame of the pictures before the cut, exactly."""
    a = max(k for k, au in enumerate(self.aus) if next(u for u in au if u.is_vcl).offset < cut)
    shown = [k for k in self.order if k <= a]
    frames, err = decode_until_error(self.stream[:cut])
    for k, f in zip(shown, frames): assert np.array_equal(f, self.by_au[k]), f"cut at {cut}: the picture of access unit {k} is wrong"
    if err is None:
      assert len(frames) == len(shown), f"cut at {cut}: {len(frames)} frames, no error"
      return
    assert err.offset == self.aus[a][0].offset, (cut, err)
    assert len(frames) <= shown.index(a), f"cut at {cut}: frames shown after the damaged picture"


def vcl(stream: bytes) -> list[hevc.NalUnit]: return [u for u in hevc.split_nal_units(stream) if u.is_vcl]


@pytest.mark.parametrize("name, which", [("noise", 0), ("noise", 2), ("noise", -1), ("10-bit", 3), ("two-slices", -1)])
def test_a_cut_inside_a_slice_is_an_error_at_its_picture(av: Any, streams: dict[str, bytes], name: str, which: int) -> None:
  """Cut inside the slice data of the first, a middle and the last picture: each a VideoStreamError at the picture's
  access unit (the old decoder returned the concealed frames, up to 255 levels off, without an error)."""
  intact, u = Intact(av, streams[name]), vcl(streams[name])[which]
  for frac in (0.3, 0.6, 0.9):
    cut = u.offset + int(len(u.data) * frac)
    intact.check_cut(cut)
    assert decode_until_error(intact.stream[:cut])[1] is not None, f"cut at {cut} inside {u.name} gave no error"


def test_every_cut_in_small_inter_slices_is_an_error_or_exact(av: Any, streams: dict[str, bytes]) -> None:
  """Every byte of the small skip-coded B and P slices of a middle picture, and of the last one: the picture either
  decodes as the intact stream's or is an error. (Their damage shows only with the real reference pictures, so a check
  that decodes the last picture without them misses it.)"""
  intact, units = Intact(av, streams["skip-heavy"]), vcl(streams["skip-heavy"])
  errors = 0
  for u in (units[4], units[7], units[-1]):
    for cut in range(u.offset + 3, u.offset + len(u.data)):
      intact.check_cut(cut)
      errors += decode_until_error(intact.stream[:cut])[1] is not None
  assert errors > 0


def test_a_cut_between_two_slices_of_a_picture_is_an_error(av: Any, streams: dict[str, bytes]) -> None:
  """Every unit is whole, the picture's second slice is gone: an error at the picture, not its lower half from
  whatever the frame's memory held."""
  intact = Intact(av, streams["two-slices"])
  for au in intact.aus[1:]:
    first = next(u for u in au if u.is_vcl)
    cut = first.offset + len(first.data)
    intact.check_cut(cut)
    assert decode_until_error(intact.stream[:cut])[1] is not None, f"picture at {au[0].offset} without its second slice gave no error"


def test_a_cut_after_a_parameter_set(av: Any, streams: dict[str, bytes]) -> None:
  """Cut just after the first PPS: no picture, an error; cut just after the parameter sets before the CRA picture in
  the middle: every picture before them is whole, and decodes exactly."""
  s = streams["skip-heavy"]
  units = list(hevc.split_nal_units(s))
  pps = [u for u in units if u.type == hevc.PPS]
  assert len(pps) >= 2
  with pytest.raises(VideoStreamError, match="holds no picture"): hevc.scan(s[:pps[0].offset + len(pps[0].data)])
  intact = Intact(av, s)
  cut = pps[1].offset + len(pps[1].data)
  intact.check_cut(cut)
  assert decode_until_error(s[:cut])[1] is None


def test_units_ffmpeg_cannot_parse_are_errors(av: Any, streams: dict[str, bytes]) -> None:
  """A slice of a middle picture whose slice_segment_address points past the picture: FFmpeg skipped it and showed the
  picture's lower half from stale memory, with no error; with err_detect=explode it is a VideoStreamError."""
  s = streams["two-slices"]
  info, aus = hevc.scan(s), list(hevc.access_units(hevc.split_nal_units(s)))
  victim = [u for u in aus[3] if u.is_vcl][1]
  assert not info.pps[0].dependent_slice_segments and not victim.first_slice_in_picture and victim.type < 16
  bad = bytearray(s)
  bad[victim.offset + 2] |= 0b00111100  # first_slice 0, PPS id '1', then the 4 address bits: 15, past the 12 CTBs
  bad_unit = next(u for u in hevc.split_nal_units(bytes(bad)) if u.offset == victim.offset)
  assert hevc.parse_slice_header(bad_unit, info.pps, info.sps).segment_address == 15
  _, err = decode_until_error(bytes(bad))
  assert err is not None and err.offset >= aus[3][0].offset and err.offset in [au[0].offset for au in aus], err


def test_intact_streams_decode_every_frame_as_pyav(av: Any, streams: dict[str, bytes], monkeypatch: pytest.MonkeyPatch) -> None:
  """No false alarm: each stream, and each of its prefixes that ends between access units, decodes every picture to the
  planes PyAV's own decode gives, with no error."""
  from plugrt.video import software
  from plugrt_testing.video import pyav_planes
  seen: list[tuple[np.ndarray, ...]] = []
  real: Callable[..., Any] = software.surface_from_planes

  def keep(dev: Any, y: np.ndarray, cb: np.ndarray, cr: np.ndarray, *rest: Any) -> Any:
    seen.append((y.copy(), cb.copy(), cr.copy()))
    return real(dev, y, cb, cr, *rest)
  monkeypatch.setattr(software, "surface_from_planes", keep)
  for name, s in streams.items():
    aus = list(hevc.access_units(hevc.split_nal_units(s)))
    for n in range(1, len(aus) + 1):
      prefix = s[:aus[n][0].offset - 3] if n < len(aus) else s
      seen.clear()
      frames, err = decode_until_error(prefix)
      want = pyav_planes(prefix)
      assert err is None and len(seen) == len(frames) == len(want), (name, n, err)
      for got, w in zip(seen, want): assert all(np.array_equal(g, x) for g, x in zip(got, w[:3])), (name, n)


def test_damaged_streams_on_threads_never_hang(av: Any) -> None:
  """FFmpeg's frame threads used to release packets over Python bytes through a callback that takes the GIL, while
  the thread freeing the decoder held it: a run of damaged streams deadlocked (about one in 200 here). 180 cut
  streams in a fresh interpreter, each a VideoStreamError, well inside the time limit."""
  code = textwrap.dedent("""
    from plugrt import dtypes
    from plugrt.errors import VideoStreamError
    from plugrt.video import hevc, software_decode
    from plugrt_testing.video import make_hevc
    clip = make_hevc(256, 144, frames=12, tag="bt709", pattern="gradient", params="frame-threads=1:pools=1")
    units = list(hevc.split_nal_units(clip))
    n = errors = 0
    for rep in range(3):
      for u in units:
        for frac in (0.02, 0.2, 0.5, 0.8):
          n += 1
          try: software_decode(clip[:u.offset + max(1, int(len(u.data) * frac))], dtype=dtypes.uint8, normalize=False, device="CPU")
          except VideoStreamError: errors += 1
    print(n, errors)
  """)
  try: p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=dict(os.environ))
  except subprocess.TimeoutExpired: pytest.fail("decoding damaged streams hung (a deadlock between FFmpeg's threads and the GIL)")
  assert p.returncode == 0, p.stderr[-3000:]
  n, errors = map(int, p.stdout.split())
  assert n >= 150 and errors == n, p.stdout
