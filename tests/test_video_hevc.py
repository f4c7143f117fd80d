"""plugrt.video.hevc: Annex B splitting and VPS/SPS/PPS/VUI parsing on streams libx265 makes, and garbage or truncated
input that must end in a VideoStreamError naming an offset (never another exception, never a hang)."""
from __future__ import annotations

import random
import time

import pytest

from plugrt.errors import VideoStreamError
from plugrt.video import hevc

pytest.importorskip("av")
from plugrt_testing.video import make_hevc

CASES = [  # width, height, bit depth, tag, full range -> expected (matrix, primaries, transfer)
  (64, 48, 8, None, False, (2, 2, 2)),
  (66, 34, 8, "bt709", True, (1, 1, 1)),
  (128, 72, 10, "bt2020", False, (9, 9, 14)),
  (200, 106, 8, "bt601", False, (6, 6, 6)),
  (96, 64, 10, "bt709", True, (1, 1, 1)),
]


@pytest.fixture(scope="module")
def streams() -> dict:
  return {c[:5]: make_hevc(*c[:2], frames=5, bit_depth=c[2], tag=c[3], full_range=c[4]) for c in CASES}


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}x{c[1]}-{c[2]}bit-{c[3]}-{'full' if c[4] else 'limited'}")
def test_parameter_sets(streams: dict, case: tuple) -> None:
  w, h, bits, _tag, full, (matrix, prim, transfer) = case
  info = hevc.scan(streams[case[:5]])
  assert info.pictures == 5 and len(info.sequences) == 1
  s = info.sequences[0]
  assert s.display_size == (w, h)
  assert s.width % 8 == 0 and s.height % 8 == 0 and s.width >= w and s.height >= h  # x265 codes whole 8x8 blocks, then crops
  assert s.bit_depth_luma == s.bit_depth_chroma == bits and s.chroma_format_idc == 1
  assert s.profile == ("Main" if bits == 8 else "Main10")
  assert s.vui.full_range == full
  assert (s.vui.matrix_coefficients, s.vui.colour_primaries, s.vui.transfer_characteristics) == (matrix, prim, transfer)
  assert s.vui.timing == (1, 25)
  assert set(info.vps) == {0} and set(info.pps) == {0}


def test_nal_units_and_access_units(streams: dict) -> None:
  data = streams[CASES[0][:5]]
  units = list(hevc.split_nal_units(data))
  assert [u.type for u in units[:3]] == [hevc.VPS, hevc.SPS, hevc.PPS]
  for u in units: assert data[u.offset - 3:u.offset] == b"\x00\x00\x01" and data[u.offset:u.offset + len(u.data)] == u.data
  aus = list(hevc.access_units(units))
  assert len(aus) == 5 and all(sum(u.is_vcl and u.first_slice_in_picture for u in au) == 1 for au in aus)
  assert [u for au in aus for u in au] == units
  # the scan records where each access unit starts, for a decoder that feeds them one at a time (cuvid's worker)
  assert list(hevc.scan(data).access_units) == [au[0].offset for au in aus]


def test_resolution_change_is_two_sequences() -> None:
  data = make_hevc(64, 48, frames=3) + make_hevc(96, 64, frames=4, bit_depth=8)
  info = hevc.scan(data)
  assert info.pictures == 7 and [s.display_size for s in info.sequences] == [(64, 48), (96, 64)]


def test_emulation_prevention_offsets() -> None:
  """A 00 00 03 inside a payload is dropped from the RBSP, and offsets past it still point into the stream."""
  unit = hevc.NalUnit(10, bytes([0x42, 0x01, 0x00, 0x00, 0x03, 0x01, 0xFF]), hevc.SPS, 0, 0)
  r = hevc.BitReader(unit)
  assert r.rbsp == bytes([0, 0, 1, 0xFF])
  assert r.offset(3 * 8) == 10 + 2 + 4  # RBSP byte 3 is stream byte 16 (one 03 dropped before it)


def _rbsp_bytewise(raw: bytes) -> tuple[bytes, list[int]]:
  """H.265 7.4.2 read byte by byte: a 03 after two zero bytes of output is dropped (the reference for BitReader)."""
  out, removed, zeros = bytearray(), [], 0
  for b in raw:
    if zeros >= 2 and b == 3:
      removed.append(len(out))
      zeros = 0
      continue
    out.append(b)
    zeros = zeros + 1 if b == 0 else 0
  return bytes(out), removed


def test_emulation_prevention_matches_the_bytewise_rule() -> None:
  """Random payloads dense in 00 and 03 (runs like 00 00 03 03, 00 00 00 03, 00 00 03 00 00 03) unescape as the standard's rule does."""
  rng = random.Random(7)
  for _ in range(2000):
    raw = bytes(rng.choice((0, 0, 0, 3, 3, 1, 0xFF)) for _ in range(rng.randint(0, 40)))
    r = hevc.BitReader(hevc.NalUnit(0, b"\x42\x01" + raw, hevc.SPS, 0, 0))
    assert (r.rbsp, r.removed) == _rbsp_bytewise(raw), raw.hex()


def test_slice_scan_reads_only_the_header() -> None:
  """scan() reads a slice's first bytes only: a big slice costs no more than a small one (the payload is never unescaped)."""
  stream = make_hevc(64, 48, frames=2)
  units = list(hevc.split_nal_units(stream))
  vcl = next(u for u in units if u.is_vcl)
  r = hevc.BitReader(vcl, limit=hevc.SLICE_HEADER_PREFIX)
  assert len(r.rbsp) <= hevc.SLICE_HEADER_PREFIX < len(vcl.data) - 2


@pytest.mark.parametrize("data, where", [
  (b"", 0), (b"\x12\x34\x56", 0), (b"\x01\x02\x00\x00\x01\x40\x01", 0),  # empty, no start code, garbage before it
  (b"\x00\x00\x01\x00\x00\x01\x40\x01", 3),                             # an empty NAL unit
  (b"\x00\x00\x01\xc0\x01\x00", 3),                                     # forbidden_zero_bit
  (b"\x00\x00\x01\x40\x00\x00", 3),                                     # temporal id plus1 = 0
  (b"\x00\x00\x01\x42\x01\x01", 5),                                     # an SPS cut in its profile
])
def test_malformed_streams_name_the_offset(data: bytes, where: int) -> None:
  with pytest.raises(VideoStreamError) as e: hevc.scan(data)
  assert e.value.offset == where and f"at byte {where}" in str(e.value)


def test_slice_without_parameter_sets(streams: dict) -> None:
  data = streams[CASES[0][:5]]
  units = list(hevc.split_nal_units(data))
  first_slice = next(u for u in units if u.is_vcl)
  with pytest.raises(VideoStreamError, match="PPS 0, which has not appeared") as e: hevc.scan(data[first_slice.offset - 3:])
  assert e.value.offset == 3


def test_fuzz_truncations_and_garbage(streams: dict) -> None:
  """Random cuts, flipped bytes and random bytes: scan() returns or raises VideoStreamError, quickly."""
  rng = random.Random(12)
  base = [streams[c[:5]] for c in CASES]
  t0 = time.perf_counter()
  outcomes = {"ok": 0, "error": 0}
  for i in range(400):
    data = bytearray(rng.choice(base))
    kind = i % 4
    if kind == 0: data = data[:rng.randrange(0, len(data))]
    elif kind == 1:
      for _ in range(rng.randrange(1, 20)): data[rng.randrange(len(data))] = rng.randrange(256)
    elif kind == 2: data = bytearray(b"\x00\x00\x01" + bytes(rng.randrange(256) for _ in range(rng.randrange(0, 300))))
    else: data = data[:rng.randrange(0, 120)]  # cuts inside the parameter sets
    try: hevc.scan(bytes(data))
    except VideoStreamError as e:
      assert 0 <= e.offset <= len(data)
      outcomes["error"] += 1
    else: outcomes["ok"] += 1
  assert outcomes["error"] > 100 and outcomes["ok"] > 10, outcomes
  assert time.perf_counter() - t0 < 60


def test_inter_predicted_reference_picture_sets():
  """st_ref_pic_set with inter_ref_pic_set_prediction_flag (7.4.8), in an SPS and in a slice header (delta_idx_minus1),
  on hand-written bits: libx265 codes its sets explicitly, so its streams never take this path."""
  explicit = "011" "010" "1" "1" "010" "1" "1" "1"  # 2 negative, 1 positive: -1, -3, +1, all used
  from_sps = "1" "1" "1" "1111"                       # predicted from set 0 with deltaRps -1, every entry used
  in_slice = "1" "010" "0" "010" "1" "00" "1" "1"     # from set 0 (delta_idx_minus1 1), deltaRps +2, -3's entry dropped
  bits = explicit + from_sps + in_slice + "1"
  bits += "0" * (-len(bits) % 8)
  unit = hevc.NalUnit(0, bytes([0x42, 0x01]) + int(bits, 2).to_bytes(len(bits) // 8, "big"), hevc.SPS, 0, 0)
  r = hevc.BitReader(unit)
  sets: list = []
  sets.append(hevc._st_ref_pic_set(r, 0, sets))
  sets.append(hevc._st_ref_pic_set(r, 1, sets))
  assert (sets[0].negative, sets[0].positive, sets[0].bits) == (((-1, True), (-3, True)), ((1, True),), len(explicit))
  assert (sets[1].negative, sets[1].positive, sets[1].ref_deltas) == (((-1, True), (-2, True), (-4, True)), (), 3)
  s = hevc._st_ref_pic_set(r, 2, sets, in_slice=True)
  assert (s.negative, s.positive, s.bits, s.ref_deltas) == ((), ((1, True), (2, True), (3, True)), len(in_slice), 3)
