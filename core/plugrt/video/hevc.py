"""HEVC Annex B byte streams in pure Python: NAL unit splitting, access units, the VPS/SPS/PPS fields a decoder
front end needs (picture size, conformance window, bit depth, chroma format, the VUI's colour description), and what
a hardware decoder that parses no slice data itself is told: the parameter sets' coding tools, reference picture
sets, and the start of each slice segment header.

Syntax and semantics follow ITU-T H.265 (sections 7.3.1 NAL unit header, 7.3.2.1-7.3.2.3 parameter sets, 7.3.3
profile_tier_level, 7.3.4 scaling_list_data, 7.3.6.1 slice segment header, 7.3.7 st_ref_pic_set, E.2.1 VUI);
docs/research/nvdec.md and docs/research/nv-video.md list them.
Every malformed or truncated input raises plugrt.errors.VideoStreamError with the byte offset in the stream where
the problem is; nothing here loops without consuming input, so garbage ends in an error, never a hang. What is kept
while a stream is read is bounded by its structure (MAX_AU_UNITS, MAX_PARAMETER_SET_BYTES, MAX_SPS_VERSIONS), so a
hostile stream costs time and memory linear in its size, with a small constant, or a VideoStreamError naming the limit.
"""
from __future__ import annotations

import re
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field

from plugrt.errors import VideoStreamError

# nal_unit_type values (H.265 Table 7-1)
VPS, SPS, PPS, AUD, EOS, EOB, FD, PREFIX_SEI, SUFFIX_SEI = 32, 33, 34, 35, 36, 37, 38, 39, 40
VCL_MAX = 31  # 0..31 are VCL (slice segment) types; 22..31 are reserved
NAMES = {VPS: "VPS", SPS: "SPS", PPS: "PPS", AUD: "AUD", EOS: "EOS", EOB: "EOB", FD: "FD", PREFIX_SEI: "SEI", SUFFIX_SEI: "SEI"}
_EMULATION = re.compile(b"\x00\x00\x03")
SLICE_HEADER_PREFIX = 16  # bytes enough for first_slice_segment_in_pic_flag, no_output_of_prior_pics_flag, slice_pic_parameter_set_id
MAX_UE_BITS = 32  # an Exp-Golomb code with more leading zeros than this is garbage in any HEVC syntax element
# What a stream may hold before it is refused (nothing legal comes near them): a level 6.2 picture has at most 600
# slice segments (H.265 Table A.8) and a stream at most 16 VPS, 16 SPS and 64 PPS ids; the largest parameter sets
# (scaling lists, 64 reference picture sets, HRD for 7 sub-layers) are a few KB.
MAX_AU_UNITS = 4096             # NAL units in one access unit, and in a row without a slice (before the first picture too)
MAX_PARAMETER_SET_BYTES = 1 << 16  # one VPS, SPS or PPS
MAX_SPS_VERSIONS = 1024         # different SPS contents in one stream


@dataclass(frozen=True)
class NalUnit:
  """One NAL unit: `offset` is where its header starts in the stream (after the start code), `data` its bytes
  (header + payload, emulation prevention still in, trailing zero bytes removed)."""
  offset: int
  data: bytes
  type: int
  layer_id: int
  temporal_id: int

  @property
  def is_vcl(self) -> bool: return self.type <= VCL_MAX
  @property
  def name(self) -> str: return NAMES.get(self.type, f"slice type {self.type}" if self.is_vcl else f"NAL type {self.type}")
  @property
  def first_slice_in_picture(self) -> bool:
    """first_slice_segment_in_pic_flag: the payload's first bit (for a VCL unit)."""
    return len(self.data) > 2 and bool(self.data[2] & 0x80)


def split_nal_units(stream: bytes | bytearray | memoryview) -> Iterator[NalUnit]:
  """The NAL units of an Annex B byte stream, in stream order. Start codes are 00 00 01 (or 00 00 00 01); bytes before
  the first start code other than zeros, an empty NAL unit, or a NAL unit header with the forbidden bit set or
  nuh_temporal_id_plus1 = 0 raise VideoStreamError naming the offset."""
  data = bytes(stream)
  n = len(data)
  start = data.find(b"\x00\x00\x01")
  if start < 0:
    raise VideoStreamError("no Annex B start code (00 00 01) in the stream" if n else "the stream is empty", 0,
                           "pass an HEVC elementary stream in Annex B format (ffmpeg -c copy -bsf hevc_mp4toannexb -f hevc)")
  if data[:start].strip(b"\x00"):
    raise VideoStreamError(f"{start} bytes before the first start code are not zero", 0, "the stream does not start at a NAL unit")
  pos = start + 3
  while pos <= n:
    nxt = data.find(b"\x00\x00\x01", pos)
    end = n if nxt < 0 else nxt
    unit = data[pos:end].rstrip(b"\x00")  # trailing_zero_8bits, and the zero of a 4-byte start code
    if not unit: raise VideoStreamError("an empty NAL unit (two start codes in a row)", pos)
    if len(unit) < 2: raise VideoStreamError("a NAL unit shorter than its 2-byte header", pos)
    h = (unit[0] << 8) | unit[1]
    if h & 0x8000: raise VideoStreamError("forbidden_zero_bit is set in a NAL unit header: not HEVC, or corrupt", pos)
    if (h & 7) == 0: raise VideoStreamError("nuh_temporal_id_plus1 is 0 in a NAL unit header: corrupt", pos)
    yield NalUnit(pos, unit, (h >> 9) & 0x3F, (h >> 3) & 0x3F, (h & 7) - 1)
    if nxt < 0: break
    pos = nxt + 3


def _marked(units: Iterator[NalUnit] | list[NalUnit]) -> Iterator[tuple[NalUnit, bool]]:
  """Each unit with whether it starts an access unit (H.265 7.4.2.4.4), holding nothing back: a new one starts at an
  AUD, EOB, or a VPS/SPS/PPS/prefix SEI following a VCL unit, at a VCL unit whose first_slice_segment_in_pic_flag is
  set after a VCL unit, and after an EOB. More than MAX_AU_UNITS units in one access unit, or in a row without a
  slice, raise VideoStreamError."""
  seen_vcl, ended, count, run = False, True, 0, 0  # ended: the last unit closed an access unit (an EOB, or none yet)
  for u in units:
    starts = ended or (seen_vcl and (u.type in (AUD, VPS, SPS, PPS, PREFIX_SEI) or 41 <= u.type <= 44 or 48 <= u.type <= 55 or
                                     (u.is_vcl and u.first_slice_in_picture)))
    if starts: seen_vcl, count = False, 0
    count, run = count + 1, 0 if u.is_vcl else run + 1
    if count > MAX_AU_UNITS or run > MAX_AU_UNITS:
      what = "an access unit" if count > MAX_AU_UNITS else "a run of NAL units without a slice"
      raise VideoStreamError(f"{what} of more than {MAX_AU_UNITS} NAL units (plugrt.video.hevc.MAX_AU_UNITS; a picture has at most 600 "
                             "slice segments): not a video stream, or a corrupt one", u.offset, "check the stream; split it at its pictures")
    seen_vcl, ended = seen_vcl or u.is_vcl, u.type == EOB
    yield u, starts


def access_units(units: Iterator[NalUnit] | list[NalUnit]) -> Iterator[list[NalUnit]]:
  """Group NAL units into access units (H.265 7.4.2.4.4; the boundaries and limits of `_marked`)."""
  au: list[NalUnit] = []
  for u, starts in _marked(units):
    if starts and au:
      yield au
      au = []
    au.append(u)
  if au: yield au


# ---------------------------------------------------------------- bits

class BitReader:
  """Reads an RBSP (emulation prevention bytes removed) and maps positions back to stream offsets for errors."""

  def __init__(self, unit: NalUnit, limit: int | None = None):
    """`limit`: read only the first `limit` payload bytes (a slice's header is all a front end needs, not its data)."""
    self.unit = unit
    raw = unit.data[2:] if limit is None else unit.data[2:2 + limit]  # after the header
    # every 00 00 03 loses its 03 (H.265 7.4.2): scanned by re in C, since slice payloads run to megabytes
    removed = [m.start() + 2 - k for k, m in enumerate(_EMULATION.finditer(raw))]  # RBSP positions before which a 03 was dropped
    self.rbsp = _EMULATION.sub(b"\x00\x00", raw) if removed else bytes(raw)
    self.removed = removed
    self.value, self.nbits, self.pos = int.from_bytes(self.rbsp, "big"), len(self.rbsp) * 8, 0

  def offset(self, bit: int | None = None) -> int:
    """The stream offset of the byte holding RBSP bit `bit` (default: the current position)."""
    byte = (self.pos if bit is None else bit) // 8
    return self.unit.offset + 2 + byte + sum(1 for r in self.removed if r <= byte)

  def fail(self, what: str) -> VideoStreamError:
    return VideoStreamError(f"{self.unit.name} at byte {self.unit.offset}: {what}", self.offset(min(self.pos, max(self.nbits - 1, 0))))

  def u(self, n: int, what: str = "a field") -> int:
    if n == 0: return 0
    if self.pos + n > self.nbits: raise self.fail(f"truncated while reading {what}")
    v = (self.value >> (self.nbits - self.pos - n)) & ((1 << n) - 1)
    self.pos += n
    return v

  def flag(self, what: str = "a flag") -> bool: return bool(self.u(1, what))

  def ue(self, what: str = "an Exp-Golomb value", hi: int = (1 << 32) - 2) -> int:
    zeros = 0
    while self.u(1, what) == 0:
      zeros += 1
      if zeros > MAX_UE_BITS: raise self.fail(f"{what}: an Exp-Golomb code longer than {MAX_UE_BITS} bits (corrupt)")
    v = (1 << zeros) - 1 + self.u(zeros, what)
    if v > hi: raise self.fail(f"{what} = {v} is larger than its maximum {hi} (corrupt)")
    return v

  def se(self, what: str = "a signed Exp-Golomb value") -> int:
    k = self.ue(what)
    return (k + 1) // 2 if k & 1 else -(k // 2)

  def skip(self, n: int, what: str) -> None:
    if self.pos + n > self.nbits: raise self.fail(f"truncated while reading {what}")
    self.pos += n


# ---------------------------------------------------------------- parameter sets

@dataclass
class ProfileTierLevel:
  profile_idc: int
  tier: int
  level_idc: int
  compatibility: int


@dataclass
class VUI:
  """The VUI fields a colour conversion needs (E.2.1); 2 means unspecified for the three colour codes."""
  video_signal_type_present: bool = False
  video_format: int = 5
  full_range: bool = False
  colour_description_present: bool = False
  colour_primaries: int = 2
  transfer_characteristics: int = 2
  matrix_coefficients: int = 2
  chroma_sample_loc_type: int = 0
  timing: tuple[int, int] | None = None  # (num_units_in_tick, time_scale)


@dataclass
class VPSInfo:
  id: int
  max_sub_layers: int
  ptl: ProfileTierLevel


@dataclass(frozen=True)
class StRps:
  """A short-term reference picture set (7.4.8): POC deltas of the pictures before (negative, closest first) and
  after (positive, closest first) the current one, each with used_by_curr_pic; `bits` is how many bits its syntax
  took, `ref_deltas` NumDeltaPocs of the set it was predicted from (0 when coded explicitly)."""
  negative: tuple[tuple[int, bool], ...] = ()
  positive: tuple[tuple[int, bool], ...] = ()
  bits: int = 0
  ref_deltas: int = 0

  @property
  def num_delta_pocs(self) -> int: return len(self.negative) + len(self.positive)


@dataclass
class SPSInfo:
  """A sequence parameter set (7.3.2.2): the picture format, then the fields a hardware decoder's picture setup takes."""
  id: int
  vps_id: int
  ptl: ProfileTierLevel
  chroma_format_idc: int
  width: int           # pic_width_in_luma_samples (the coded size)
  height: int
  conformance_window: tuple[int, int, int, int]  # left, right, top, bottom in luma samples
  bit_depth_luma: int
  bit_depth_chroma: int
  max_dec_pic_buffering: int
  vui: VUI = field(default_factory=VUI)
  # what a decoder that parses no slice data itself needs (nvdec_hevc_pic_s, DXVA's picture parameters)
  max_num_reorder: int = 0
  separate_colour_plane: bool = False
  log2_max_poc_lsb: int = 4
  log2_min_cb: int = 3                 # log2_min_luma_coding_block_size_minus3 + 3
  log2_max_cb: int = 3                 # + log2_diff_max_min_luma_coding_block_size
  log2_min_tb: int = 2
  log2_max_tb: int = 2
  max_transform_hierarchy_depth_inter: int = 0
  max_transform_hierarchy_depth_intra: int = 0
  scaling_list_enabled: bool = False
  scaling_list_data_present: bool = False
  amp: bool = False
  sao: bool = False
  pcm: tuple[int, int, int, int, bool] | None = None  # bit depths luma, chroma; log2 min, max PCM block size; loop filter disabled
  st_rps: list[StRps] = field(default_factory=list)
  long_term_refs_present: bool = False
  lt_ref_pics_sps: list[tuple[int, bool]] = field(default_factory=list)  # (lt_ref_pic_poc_lsb_sps, used_by_curr_pic_lt_sps_flag)
  temporal_mvp: bool = False
  strong_intra_smoothing: bool = False

  @property
  def display_size(self) -> tuple[int, int]:
    """(width, height) after the conformance window crop."""
    left, right, top, bottom = self.conformance_window
    return self.width - left - right, self.height - top - bottom

  @property
  def profile(self) -> str:
    return {1: "Main", 2: "Main10", 3: "Main Still Picture", 4: "RExt"}.get(self.ptl.profile_idc, f"profile {self.ptl.profile_idc}")


@dataclass
class PPSInfo:
  """A picture parameter set (7.3.2.3)."""
  id: int
  sps_id: int
  tiles: bool
  entropy_coding_sync: bool
  dependent_slice_segments: bool = False
  output_flag_present: bool = False
  num_extra_slice_header_bits: int = 0
  sign_data_hiding: bool = False
  cabac_init_present: bool = False
  num_ref_idx_default: tuple[int, int] = (1, 1)   # num_ref_idx_l0/l1_default_active_minus1 + 1
  init_qp: int = 26
  constrained_intra_pred: bool = False
  transform_skip: bool = False
  cu_qp_delta: bool = False
  diff_cu_qp_delta_depth: int = 0
  cb_qp_offset: int = 0
  cr_qp_offset: int = 0
  slice_chroma_qp_offsets_present: bool = False
  weighted_pred: bool = False
  weighted_bipred: bool = False
  transquant_bypass: bool = False
  tile_columns: list[int] | None = None  # widths in CTBs of each tile column (explicit spacing), None: uniform
  tile_rows: list[int] | None = None
  num_tiles: tuple[int, int] = (1, 1)    # columns, rows
  loop_filter_across_tiles: bool = True
  loop_filter_across_slices: bool = False
  deblocking_control_present: bool = False
  deblocking_override_enabled: bool = False
  deblocking_disabled: bool = False
  beta_offset: int = 0                   # pps_beta_offset_div2 * 2
  tc_offset: int = 0
  scaling_list_data_present: bool = False
  lists_modification_present: bool = False
  log2_parallel_merge_level: int = 2
  slice_header_extension_present: bool = False


def _profile_tier_level(r: BitReader, max_sub_layers_minus1: int) -> ProfileTierLevel:
  space, tier, idc = r.u(2, "general_profile_space"), r.u(1, "general_tier_flag"), r.u(5, "general_profile_idc")
  compat = r.u(32, "general_profile_compatibility_flags")
  r.skip(48, "general constraint flags")
  level = r.u(8, "general_level_idc")
  present = [(r.flag("sub_layer_profile_present_flag"), r.flag("sub_layer_level_present_flag")) for _ in range(max_sub_layers_minus1)]
  if max_sub_layers_minus1 > 0: r.skip(2 * (8 - max_sub_layers_minus1), "reserved_zero_2bits")
  for prof, lev in present:
    if prof: r.skip(88, "sub_layer profile")
    if lev: r.skip(8, "sub_layer_level_idc")
  if space != 0: raise r.fail(f"general_profile_space {space} is reserved")
  if idc == 0 and compat:  # a decoder infers the profile from the compatibility flags
    idc = next((i for i in range(1, 32) if compat & (1 << (31 - i))), 0)
  return ProfileTierLevel(idc, tier, level, compat)


def _parameter_set(unit: NalUnit) -> BitReader:
  if len(unit.data) > MAX_PARAMETER_SET_BYTES:
    raise VideoStreamError(f"a {unit.name} of {len(unit.data)} bytes: parameter sets are at most {MAX_PARAMETER_SET_BYTES} bytes here "
                           "(plugrt.video.hevc.MAX_PARAMETER_SET_BYTES; real ones are a few KB): corrupt", unit.offset)
  return BitReader(unit)


def parse_vps(unit: NalUnit) -> VPSInfo:
  r = _parameter_set(unit)
  vps_id = r.u(4, "vps_video_parameter_set_id")
  r.skip(2 + 6, "vps base layer flags and vps_max_layers_minus1")
  max_sub = r.u(3, "vps_max_sub_layers_minus1")
  if max_sub > 6: raise r.fail(f"vps_max_sub_layers_minus1 = {max_sub} is out of range 0..6")
  r.skip(1 + 16, "vps_temporal_id_nesting_flag and vps_reserved_0xffff_16bits")
  return VPSInfo(vps_id, max_sub + 1, _profile_tier_level(r, max_sub))


def _scaling_list_data(r: BitReader) -> None:
  for size_id in range(4):
    for _ in range(0, 6, 3 if size_id == 3 else 1):
      if not r.flag("scaling_list_pred_mode_flag"):
        r.ue("scaling_list_pred_matrix_id_delta", 5)
        continue
      if size_id > 1: r.se("scaling_list_dc_coef_minus8")
      for _ in range(min(64, 1 << (4 + (size_id << 1)))): r.se("scaling_list_delta_coef")


def _st_ref_pic_set(r: BitReader, idx: int, sets: list[StRps], in_slice: bool = False) -> StRps:
  """st_ref_pic_set(idx) (7.3.7), derived as in 7.4.8. `sets` are the SPS's sets; in a slice header idx equals
  len(sets) and the set may be predicted from any of them (delta_idx_minus1)."""
  start = r.pos
  if idx != 0 and r.flag("inter_ref_pic_set_prediction_flag"):
    ref = idx - 1
    if in_slice: ref = idx - (r.ue("delta_idx_minus1", idx - 1) + 1)
    sign, abs_minus1 = r.u(1, "delta_rps_sign"), r.ue("abs_delta_rps_minus1", 1 << 15)
    delta = (1 - 2 * sign) * (abs_minus1 + 1)
    s0, s1 = sets[ref].negative, sets[ref].positive
    used, keep = [], []
    for _ in range(len(s0) + len(s1) + 1):
      u = r.flag("used_by_curr_pic_flag")
      used.append(u)
      keep.append(u or r.flag("use_delta_flag"))
    n0 = len(s0)
    neg = [(d + delta, used[n0 + j]) for j, (d, _) in reversed(list(enumerate(s1))) if d + delta < 0 and keep[n0 + j]]
    if delta < 0 and keep[-1]: neg.append((delta, used[-1]))
    neg += [(d + delta, used[j]) for j, (d, _) in enumerate(s0) if d + delta < 0 and keep[j]]
    pos = [(d + delta, used[j]) for j, (d, _) in reversed(list(enumerate(s0))) if d + delta > 0 and keep[j]]
    if delta > 0 and keep[-1]: pos.append((delta, used[-1]))
    pos += [(d + delta, used[n0 + j]) for j, (d, _) in enumerate(s1) if d + delta > 0 and keep[n0 + j]]
    if len(neg) + len(pos) > 16: raise r.fail("a short-term reference picture set with more than 16 pictures")
    return StRps(tuple(neg), tuple(pos), r.pos - start, len(s0) + len(s1))
  n_neg, n_pos = r.ue("num_negative_pics", 16), r.ue("num_positive_pics", 16)
  if n_neg + n_pos > 16: raise r.fail("a short-term reference picture set with more than 16 pictures")
  neg, pos, poc = [], [], 0
  for _ in range(n_neg):
    poc -= r.ue("delta_poc_s0_minus1", 1 << 15) + 1
    neg.append((poc, r.flag("used_by_curr_pic_s0_flag")))
  poc = 0
  for _ in range(n_pos):
    poc += r.ue("delta_poc_s1_minus1", 1 << 15) + 1
    pos.append((poc, r.flag("used_by_curr_pic_s1_flag")))
  return StRps(tuple(neg), tuple(pos), r.pos - start)


def _vui(r: BitReader) -> VUI:
  v = VUI()
  if r.flag("aspect_ratio_info_present_flag") and r.u(8, "aspect_ratio_idc") == 255: r.skip(32, "sar_width and sar_height")
  if r.flag("overscan_info_present_flag"): r.skip(1, "overscan_appropriate_flag")
  if r.flag("video_signal_type_present_flag"):
    v.video_signal_type_present = True
    v.video_format, v.full_range = r.u(3, "video_format"), r.flag("video_full_range_flag")
    if r.flag("colour_description_present_flag"):
      v.colour_description_present = True
      v.colour_primaries = r.u(8, "colour_primaries")
      v.transfer_characteristics = r.u(8, "transfer_characteristics")
      v.matrix_coefficients = r.u(8, "matrix_coeffs")
  if r.flag("chroma_loc_info_present_flag"):
    v.chroma_sample_loc_type = r.ue("chroma_sample_loc_type_top_field", 5)
    r.ue("chroma_sample_loc_type_bottom_field", 5)
  r.skip(3, "neutral_chroma_indication, field_seq and frame_field_info_present flags")
  if r.flag("default_display_window_flag"):
    for name in ("left", "right", "top", "bottom"): r.ue(f"def_disp_win_{name}_offset")
  if r.flag("vui_timing_info_present_flag"):
    v.timing = (r.u(32, "vui_num_units_in_tick"), r.u(32, "vui_time_scale"))
  return v  # HRD parameters and bitstream restrictions follow: nothing a front end needs


def parse_sps(unit: NalUnit) -> SPSInfo:
  r = _parameter_set(unit)
  vps_id = r.u(4, "sps_video_parameter_set_id")
  max_sub = r.u(3, "sps_max_sub_layers_minus1")
  if max_sub > 6: raise r.fail(f"sps_max_sub_layers_minus1 = {max_sub} is out of range 0..6")
  r.skip(1, "sps_temporal_id_nesting_flag")
  ptl = _profile_tier_level(r, max_sub)
  sps_id = r.ue("sps_seq_parameter_set_id", 15)
  chroma = r.ue("chroma_format_idc", 3)
  separate = chroma == 3 and r.flag("separate_colour_plane_flag")
  width, height = r.ue("pic_width_in_luma_samples", 1 << 16), r.ue("pic_height_in_luma_samples", 1 << 16)
  if width == 0 or height == 0: raise r.fail(f"a picture size of {width}x{height}")
  window = (0, 0, 0, 0)
  if r.flag("conformance_window_flag"):
    sub_w, sub_h = (2 if chroma in (1, 2) else 1), (2 if chroma == 1 else 1)
    left, right, top, bottom = (r.ue(f"conf_win_{n}_offset", 1 << 16) for n in ("left", "right", "top", "bottom"))
    window = (left * sub_w, right * sub_w, top * sub_h, bottom * sub_h)
    if window[0] + window[1] >= width or window[2] + window[3] >= height:
      raise r.fail(f"the conformance window {window} leaves nothing of a {width}x{height} picture")
  depth_luma, depth_chroma = r.ue("bit_depth_luma_minus8", 8) + 8, r.ue("bit_depth_chroma_minus8", 8) + 8
  log2_poc = r.ue("log2_max_pic_order_cnt_lsb_minus4", 12) + 4
  all_layers = r.flag("sps_sub_layer_ordering_info_present_flag")
  dpb, reorder = 1, 0
  for _ in range(0 if all_layers else max_sub, max_sub + 1):  # the highest sub-layer's values are the largest
    dpb = max(dpb, r.ue("sps_max_dec_pic_buffering_minus1", 15) + 1)
    reorder = max(reorder, r.ue("sps_max_num_reorder_pics", 15))
    r.ue("sps_max_latency_increase_plus1")
  min_cb = r.ue("log2_min_luma_coding_block_size_minus3", 3) + 3
  max_cb = min_cb + r.ue("log2_diff_max_min_luma_coding_block_size", 3)
  min_tb = r.ue("log2_min_luma_transform_block_size_minus2", 3) + 2
  max_tb = min_tb + r.ue("log2_diff_max_min_luma_transform_block_size", 3)
  depth_inter, depth_intra = r.ue("max_transform_hierarchy_depth_inter", 32), r.ue("max_transform_hierarchy_depth_intra", 32)
  scaling = r.flag("scaling_list_enabled_flag")
  scaling_data = scaling and r.flag("sps_scaling_list_data_present_flag")
  if scaling_data: _scaling_list_data(r)
  amp, sao = r.flag("amp_enabled_flag"), r.flag("sample_adaptive_offset_enabled_flag")
  pcm = None
  if r.flag("pcm_enabled_flag"):
    pcm_luma, pcm_chroma = r.u(4, "pcm_sample_bit_depth_luma_minus1") + 1, r.u(4, "pcm_sample_bit_depth_chroma_minus1") + 1
    pcm_min = r.ue("log2_min_pcm_luma_coding_block_size_minus3", 32) + 3
    pcm_max = pcm_min + r.ue("log2_diff_max_min_pcm_luma_coding_block_size", 32)
    pcm = (pcm_luma, pcm_chroma, pcm_min, pcm_max, r.flag("pcm_loop_filter_disabled_flag"))
  sets: list[StRps] = []
  for i in range(r.ue("num_short_term_ref_pic_sets", 64)): sets.append(_st_ref_pic_set(r, i, sets))
  lt_present, lt_sps = r.flag("long_term_ref_pics_present_flag"), []
  if lt_present:
    for _ in range(r.ue("num_long_term_ref_pics_sps", 32)):
      lt_sps.append((r.u(log2_poc, "lt_ref_pic_poc_lsb_sps"), r.flag("used_by_curr_pic_lt_sps_flag")))
  tmvp, strong = r.flag("sps_temporal_mvp_enabled_flag"), r.flag("strong_intra_smoothing_enabled_flag")
  vui = _vui(r) if r.flag("vui_parameters_present_flag") else VUI()
  return SPSInfo(sps_id, vps_id, ptl, chroma, width, height, window, depth_luma, depth_chroma, dpb, vui, reorder, separate, log2_poc,
                 min_cb, max_cb, min_tb, max_tb, depth_inter, depth_intra, scaling, scaling_data, amp, sao, pcm, sets, lt_present, lt_sps,
                 tmvp, strong)


def parse_pps(unit: NalUnit) -> PPSInfo:
  r = _parameter_set(unit)
  p = PPSInfo(r.ue("pps_pic_parameter_set_id", 63), r.ue("pps_seq_parameter_set_id", 15), False, False)
  p.dependent_slice_segments, p.output_flag_present = r.flag("dependent_slice_segments_enabled_flag"), r.flag("output_flag_present_flag")
  p.num_extra_slice_header_bits = r.u(3, "num_extra_slice_header_bits")
  p.sign_data_hiding, p.cabac_init_present = r.flag("sign_data_hiding_enabled_flag"), r.flag("cabac_init_present_flag")
  p.num_ref_idx_default = (r.ue("num_ref_idx_l0_default_active_minus1", 14) + 1, r.ue("num_ref_idx_l1_default_active_minus1", 14) + 1)
  p.init_qp = 26 + r.se("init_qp_minus26")
  p.constrained_intra_pred, p.transform_skip = r.flag("constrained_intra_pred_flag"), r.flag("transform_skip_enabled_flag")
  p.cu_qp_delta = r.flag("cu_qp_delta_enabled_flag")
  if p.cu_qp_delta: p.diff_cu_qp_delta_depth = r.ue("diff_cu_qp_delta_depth", 6)
  p.cb_qp_offset, p.cr_qp_offset = r.se("pps_cb_qp_offset"), r.se("pps_cr_qp_offset")
  p.slice_chroma_qp_offsets_present = r.flag("pps_slice_chroma_qp_offsets_present_flag")
  p.weighted_pred, p.weighted_bipred = r.flag("weighted_pred_flag"), r.flag("weighted_bipred_flag")
  p.transquant_bypass = r.flag("transquant_bypass_enabled_flag")
  p.tiles, p.entropy_coding_sync = r.flag("tiles_enabled_flag"), r.flag("entropy_coding_sync_enabled_flag")
  if p.tiles:
    cols, rows = r.ue("num_tile_columns_minus1", 1 << 10), r.ue("num_tile_rows_minus1", 1 << 10)
    p.num_tiles = (cols + 1, rows + 1)
    if not r.flag("uniform_spacing_flag"):
      p.tile_columns = [r.ue("column_width_minus1") + 1 for _ in range(cols)]
      p.tile_rows = [r.ue("row_height_minus1") + 1 for _ in range(rows)]
    p.loop_filter_across_tiles = r.flag("loop_filter_across_tiles_enabled_flag")
  p.loop_filter_across_slices = r.flag("pps_loop_filter_across_slices_enabled_flag")
  p.deblocking_control_present = r.flag("deblocking_filter_control_present_flag")
  if p.deblocking_control_present:
    p.deblocking_override_enabled = r.flag("deblocking_filter_override_enabled_flag")
    p.deblocking_disabled = r.flag("pps_deblocking_filter_disabled_flag")
    if not p.deblocking_disabled: p.beta_offset, p.tc_offset = 2 * r.se("pps_beta_offset_div2"), 2 * r.se("pps_tc_offset_div2")
  p.scaling_list_data_present = r.flag("pps_scaling_list_data_present_flag")
  if p.scaling_list_data_present: _scaling_list_data(r)
  p.lists_modification_present = r.flag("lists_modification_present_flag")
  p.log2_parallel_merge_level = r.ue("log2_parallel_merge_level_minus2", 4) + 2
  p.slice_header_extension_present = r.flag("slice_segment_header_extension_present_flag")
  return p


# ---------------------------------------------------------------- slice segment headers

IDR_W_RADL, IDR_N_LP, BLA_W_LP, CRA = 19, 20, 16, 21
RADL_N, RADL_R, RASL_N, RASL_R = 6, 7, 8, 9
SLICE_B, SLICE_P, SLICE_I = 0, 1, 2


@dataclass
class SliceHeader:
  """The start of a slice segment header (7.3.6.1), up to slice_temporal_mvp_enabled_flag: what picture-level decoding
  (POC, reference picture set, a hardware decoder's picture setup) needs. `skip_start`, `skip_end` are RBSP bit
  positions around the syntax a hardware decoder is told to skip (from pic_output_flag to the long-term pictures)."""
  first_slice: bool
  pps_id: int
  dependent: bool = False
  segment_address: int = 0
  slice_type: int = SLICE_I
  pic_output: bool = True
  poc_lsb: int = 0
  st_rps: StRps | None = None          # the set in force: coded in the header or picked from the SPS
  st_rps_in_header: bool = False
  st_rps_idx: int = -1                 # short_term_ref_pic_set_idx when picked from the SPS
  long_term: list[tuple[int, bool, int | None]] = field(default_factory=list)  # (poc lsb, used by curr pic, delta poc msb cycle or None)
  temporal_mvp: bool = False
  skip_start: int = 0
  skip_end: int = 0


def _bits_for(n: int) -> int: return (n - 1).bit_length() if n > 1 else 0  # Ceil(Log2(n))


def parse_slice_header(unit: NalUnit, pps: dict[int, PPSInfo], sps: dict[int, SPSInfo]) -> SliceHeader:
  """The slice segment header of VCL NAL unit `unit`, with the parameter sets seen so far. Raises VideoStreamError
  (with the offset) when it is malformed or refers to a parameter set that has not appeared."""
  r = BitReader(unit)
  first = r.flag("first_slice_segment_in_pic_flag")
  if BLA_W_LP <= unit.type <= 23: r.skip(1, "no_output_of_prior_pics_flag")
  h = SliceHeader(first, r.ue("slice_pic_parameter_set_id", 63))
  if h.pps_id not in pps: raise VideoStreamError(f"a slice refers to PPS {h.pps_id}, which has not appeared", unit.offset)
  p = pps[h.pps_id]
  if p.sps_id not in sps: raise VideoStreamError(f"PPS {p.id} refers to SPS {p.sps_id}, which has not appeared", unit.offset)
  s = sps[p.sps_id]
  if not first:
    if p.dependent_slice_segments: h.dependent = r.flag("dependent_slice_segment_flag")
    ctb = 1 << s.log2_max_cb
    h.segment_address = r.u(_bits_for(-(-s.width // ctb) * -(-s.height // ctb)), "slice_segment_address")
  if h.dependent: return h
  r.skip(p.num_extra_slice_header_bits, "slice_reserved_flag")
  h.slice_type = r.ue("slice_type", 2)
  h.skip_start = r.pos
  if p.output_flag_present: h.pic_output = r.flag("pic_output_flag")
  if s.separate_colour_plane: r.skip(2, "colour_plane_id")
  if unit.type not in (IDR_W_RADL, IDR_N_LP):
    h.poc_lsb = r.u(s.log2_max_poc_lsb, "slice_pic_order_cnt_lsb")
    if not r.flag("short_term_ref_pic_set_sps_flag"):
      h.st_rps, h.st_rps_in_header = _st_ref_pic_set(r, len(s.st_rps), s.st_rps, in_slice=True), True
    else:
      if not s.st_rps: raise r.fail("short_term_ref_pic_set_sps_flag is set, but the SPS has no short-term reference picture sets")
      h.st_rps_idx = r.u(_bits_for(len(s.st_rps)), "short_term_ref_pic_set_idx")
      if h.st_rps_idx >= len(s.st_rps): raise r.fail(f"short_term_ref_pic_set_idx {h.st_rps_idx} is out of range")
      h.st_rps = s.st_rps[h.st_rps_idx]
    if s.long_term_refs_present:
      n_sps = r.ue("num_long_term_sps", len(s.lt_ref_pics_sps)) if s.lt_ref_pics_sps else 0
      n_pics = r.ue("num_long_term_pics", 32)
      for i in range(n_sps + n_pics):
        if i < n_sps:
          lsb, used = s.lt_ref_pics_sps[r.u(_bits_for(len(s.lt_ref_pics_sps)), "lt_idx_sps") % len(s.lt_ref_pics_sps)]
        else: lsb, used = r.u(s.log2_max_poc_lsb, "poc_lsb_lt"), r.flag("used_by_curr_pic_lt_flag")
        msb = r.ue("delta_poc_msb_cycle_lt") if r.flag("delta_poc_msb_present_flag") else None
        h.long_term.append((lsb, used, msb))
    h.skip_end = r.pos
    if s.temporal_mvp: h.temporal_mvp = r.flag("slice_temporal_mvp_enabled_flag")
  else: h.skip_end = r.pos
  return h


def slice_pps_id(unit: NalUnit) -> int:
  """slice_pic_parameter_set_id of a VCL unit, from its first bytes (what a scan needs of a slice)."""
  r = BitReader(unit, limit=SLICE_HEADER_PREFIX)
  r.skip(1, "first_slice_segment_in_pic_flag")
  if BLA_W_LP <= unit.type <= 23: r.skip(1, "no_output_of_prior_pics_flag")
  return r.ue("slice_pic_parameter_set_id", 63)


@dataclass
class StreamInfo:
  """What a scan of a whole stream found: its parameter sets (the last of each id wins) and its pictures."""
  vps: dict[int, VPSInfo] = field(default_factory=dict)
  sps: dict[int, SPSInfo] = field(default_factory=dict)
  pps: dict[int, PPSInfo] = field(default_factory=dict)
  sequences: list[SPSInfo] = field(default_factory=list)  # the SPS in force at each change of picture format, in order
  pictures: int = 0
  units: int = 0
  access_units: array[int] = field(default_factory=lambda: array("q"))  # where each access unit's first NAL unit header starts


def scan(stream: bytes | bytearray | memoryview) -> StreamInfo:
  """Split and check a whole stream: every parameter set parses, every slice refers to a PPS and SPS that came before.
  Raises VideoStreamError naming the offset of the first problem. Units are checked as they are split, and only
  the parameter sets in force are kept (with at most MAX_SPS_VERSIONS different SPS), so memory stays a small
  multiple of the stream's size and a malformed unit is reported without reading the rest."""
  info = StreamInfo()
  active: SPSInfo | None = None
  parsed_sps: dict[bytes, SPSInfo] = {}  # an SPS repeated at every random access point is parsed once, and sequences share it
  for u, starts in _marked(split_nal_units(stream)):
    # the decoders feed access units from these offsets (cuvid's worker), so the stream is split once
    if starts: info.access_units.append(u.offset)
    info.units += 1
    if u.layer_id != 0: continue  # layers other than the base are not decoded
    if u.type == VPS:
      v = parse_vps(u)
      info.vps[v.id] = v
    elif u.type == SPS:
      if (s := parsed_sps.get(u.data)) is None:
        if len(parsed_sps) >= MAX_SPS_VERSIONS:
          raise VideoStreamError(f"more than {MAX_SPS_VERSIONS} different SPS in one stream (plugrt.video.hevc.MAX_SPS_VERSIONS)", u.offset,
                                 "split the stream where its format changes")
        s = parsed_sps[u.data] = parse_sps(u)
      info.sps[s.id] = s
    elif u.type == PPS:
      p = parse_pps(u)
      if p.sps_id not in info.sps: raise VideoStreamError(f"PPS {p.id} refers to SPS {p.sps_id}, which has not appeared", u.offset)
      info.pps[p.id] = p
    elif u.is_vcl:
      if u.type > 21: raise VideoStreamError(f"NAL unit type {u.type} is reserved (corrupt stream)", u.offset)
      first, pps_id = u.first_slice_in_picture, slice_pps_id(u)
      if pps_id not in info.pps:
        raise VideoStreamError(f"a slice refers to PPS {pps_id}, which has not appeared (the stream does not start with its parameter sets)",
                               u.offset, "start the stream at a VPS/SPS/PPS and an IRAP picture")
      sps = info.sps[info.pps[pps_id].sps_id]
      if first:
        info.pictures += 1
        if active is None or (sps.width, sps.height, sps.bit_depth_luma, sps.chroma_format_idc) != \
            (active.width, active.height, active.bit_depth_luma, active.chroma_format_idc):
          info.sequences.append(sps)
        active = sps
  if not info.pictures: raise VideoStreamError("the stream holds no picture (no slice NAL unit)", memoryview(stream).nbytes)
  return info
