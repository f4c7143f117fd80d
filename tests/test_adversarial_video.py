"""Video streams built to break the front end (issue 32, item 9).

The HEVC scan refuses a stream at one of its limits (MAX_AU_UNITS, MAX_PARAMETER_SET_BYTES, MAX_SPS_VERSIONS), naming the limit and
the offset, or reads it in memory linear in its size with a small constant (it kept every unit of an access unit that
never ended: 30 MB of access unit delimiters took 15 s and 1.3 GB before the error).
"""
from __future__ import annotations

import tracemalloc
from typing import Any

import pytest

from plugrt.errors import VideoStreamError
from plugrt.video import hevc

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
  from plugrt.testing.video import make_hevc
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
  from plugrt.testing.video import make_hevc
  streams = [make_hevc(64, 48, frames=6, tag="bt709"), make_hevc(128, 72, frames=5, bit_depth=10, tag="bt2020"),
             make_hevc(202, 146, frames=4, tag="bt601", full_range=True), make_hevc(128, 64, frames=33, pattern="gradient"),
             make_hevc(192, 256, frames=3, pattern="gradient", params="slices=2"),
             make_hevc(64, 48, frames=3, tag="bt709") + make_hevc(96, 64, frames=4, tag="bt709", seed=1)]
  for stream in streams:
    info = hevc.scan(stream)
    got = {"vps": info.vps, "sps": info.sps, "pps": info.pps, "sequences": info.sequences, "pictures": info.pictures, "units": info.units,
           "access_units": list(info.access_units)}
    assert got == _reference_scan(stream)
