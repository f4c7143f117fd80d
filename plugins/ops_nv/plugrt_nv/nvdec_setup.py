"""HEVC pictures for the video engine, in pure Python: for each picture of a stream, in decode order, the engine's
picture setup (nvdec_hevc_pic_s and the tile sizes), its slice data, the surfaces (picture indices) it writes and
reads, and when each decoded picture leaves for display.

The engine parses slice data and most of each slice header itself; what it is told is what a driver derives once per
picture (H.265 8.3.1 picture order count, 8.3.2 reference picture set and marking, 8.3.4's initial reference lists,
C.5.2 output order), which is what this module does with plugrt.video.hevc's parser. Everything is checked first:
a stream the engine path does not handle raises VideoDecoderUnavailable (the caller falls back), a malformed one
VideoStreamError with its offset.
"""
from __future__ import annotations

import ctypes
from collections.abc import Iterator
from dataclasses import dataclass, field

from plugrt.errors import Reason, VideoDecoderUnavailable, VideoStreamError
from plugrt.video import hevc
from plugrt_nv import nvdec

MIN_SIZE, MAX_SIZE = 144, 8192  # NVDEC's HEVC picture limits on Hopper, as cuvidGetDecoderCaps reports them (docs/research/nv-video.md)
SLNR = {0, 2, 4, 6, 8, 10, 12, 14}  # sub-layer non-reference picture types (TRAIL_N, TSA_N, ..., RSV_VCL_N14)


@dataclass
class Picture:
  """A decoded picture in the decoded picture buffer."""
  index: int          # the engine's picture index: which surface holds it
  poc: int
  offset: int         # the stream offset of its first slice (for errors)
  reference: bool = True
  waiting: bool = True   # decoded, not yet output


@dataclass
class Decode:
  """One picture to run on the engine."""
  picture: Picture
  setup: bytes        # nvdec_hevc_pic_s padded to PIC_SETUP_SIZE, then the tile sizes
  bitstream: bytes    # the picture's slice NAL units, each after a 00 00 01 start code
  references: list[int]  # picture indices the engine may read
  layout: nvdec.Layout
  sps: hevc.SPSInfo


@dataclass
class Output:
  """A picture leaving for display (in display order)."""
  picture: Picture
  layout: nvdec.Layout
  sps: hevc.SPSInfo


def check_sps(s: hevc.SPSInfo, offset: int) -> None:
  """VideoDecoderUnavailable when the engine path does not take this sequence."""
  why = None
  if s.chroma_format_idc != 1 or s.separate_colour_plane: why = f"chroma format {s.chroma_format_idc} (only 4:2:0 is handled)"
  elif s.bit_depth_luma not in (8, 10) or s.bit_depth_chroma != s.bit_depth_luma:
    why = f"{s.bit_depth_luma}/{s.bit_depth_chroma}-bit samples (8 and 10 bits are handled)"
  elif not (MIN_SIZE <= s.width <= MAX_SIZE and MIN_SIZE <= s.height <= MAX_SIZE):
    why = f"a {s.width}x{s.height} picture (NVDEC takes {MIN_SIZE}x{MIN_SIZE} to {MAX_SIZE}x{MAX_SIZE})"
  elif s.scaling_list_enabled: why = "scaling lists (their table layout for the engine is not known here)"
  elif s.long_term_refs_present: why = "long-term reference pictures (not handled by the NV engine path yet)"
  if why: raise VideoDecoderUnavailable(f"the NV video engine path does not decode {why} (SPS at byte {offset})", Reason.NO_DEVICE,
                                        "decode in software (fallback=...), or on the CUDA device's NVDEC")


def _tile_sizes(s: hevc.SPSInfo, p: hevc.PPSInfo) -> bytes:
  """(width, height) in CTBs of every tile, as u16 pairs, columns outer (what the engine reads at HEVC_SET_TILE_SIZES_OFFSET)."""
  ctb = 1 << s.log2_max_cb
  w, h = -(-s.width // ctb), -(-s.height // ctb)
  cols_n, rows_n = p.num_tiles

  def split(total: int, n: int, explicit: list[int] | None) -> list[int]:
    if explicit is not None: return [*explicit, total - sum(explicit)]
    return [(i + 1) * total // n - i * total // n for i in range(n)]
  cols, rows = split(w, cols_n, p.tile_columns), split(h, rows_n, p.tile_rows)
  if min(cols + rows) <= 0: raise VideoStreamError(f"PPS {p.id}: tile columns {cols} or rows {rows} do not fit the picture", 0)
  return b"".join(c.to_bytes(2, "little") + r.to_bytes(2, "little") for c in cols for r in rows)


def picture_setup(s: hevc.SPSInfo, p: hevc.PPSInfo, h: hevc.SliceHeader, lay: nvdec.Layout, cur: Picture, nal_type: int, stream_len: int,
                  before: list[Picture], after: list[Picture], refs: list[Picture]) -> ctypes.Structure:
  """nvdec_hevc_pic_s for one picture. `before`/`after`: PocStCurrBefore/After (closest first), `refs`: every
  picture of the reference picture set present in the DPB."""
  d = nvdec.HEVC_PIC()
  d.stream_len, d.gptimer_timeout_value, d.sw_start_code_e, d.pattern_id = stream_len, nvdec.GPTIMER_TIMEOUT, 1, 2
  d.tileformat, d.gob_height = nvdec.TILE_FORMAT_BLOCK_LINEAR, 0
  # nvdec_drv.h: "0: Rec.709 8 bit, 1: Rec.709 10 bit" -- 10-bit samples written as such into the 16-bit surfaces
  d.disp_output_mode = nvdec.DISP_OUTPUT_10BIT if s.bit_depth_luma > 8 else nvdec.DISP_OUTPUT_8BIT
  # framestride counts samples, not bytes: a 10-bit picture's rows (2 bytes a sample) with the byte pitch came out
  # wrong everywhere, with the pitch in samples equal to software's (docs/hardware.md)
  d.framestride[0] = d.framestride[1] = lay.pitch // (2 if s.bit_depth_luma > 8 else 1)
  d.colMvBuffersize = lay.colmv >> 8
  d.HevcSaoBufferOffset, d.HevcBsdCtrlOffset = lay.sao_offset >> 8, lay.bsd_offset >> 8
  d.v1.hevc_main10_444_ext.HevcFltAboveOffset = lay.flt_above_offset >> 8
  d.v1.hevc_main10_444_ext.HevcSaoAboveOffset = lay.sao_above_offset >> 8
  d.v3.HevcSliceEdgeOffset = lay.sao_above_offset >> 8
  # sequence
  d.pic_width_in_luma_samples, d.pic_height_in_luma_samples = s.width, s.height
  d.chroma_format_idc, d.bit_depth_luma, d.bit_depth_chroma = s.chroma_format_idc, s.bit_depth_luma, s.bit_depth_chroma
  d.log2_min_luma_coding_block_size, d.log2_max_luma_coding_block_size = s.log2_min_cb, s.log2_max_cb
  d.log2_min_transform_block_size, d.log2_max_transform_block_size = s.log2_min_tb, s.log2_max_tb
  d.max_transform_hierarchy_depth_inter = s.max_transform_hierarchy_depth_inter
  d.max_transform_hierarchy_depth_intra = s.max_transform_hierarchy_depth_intra
  d.scalingListEnable, d.amp_enable_flag, d.sample_adaptive_offset_enabled_flag = s.scaling_list_enabled, s.amp, s.sao
  if s.pcm is not None:
    d.pcm_enabled_flag = 1
    (d.pcm_sample_bit_depth_luma, d.pcm_sample_bit_depth_chroma, d.log2_min_pcm_luma_coding_block_size, d.log2_max_pcm_luma_coding_block_size,
     d.pcm_loop_filter_disabled_flag) = s.pcm
  d.sps_temporal_mvp_enabled_flag, d.strong_intra_smoothing_enabled_flag = s.temporal_mvp, s.strong_intra_smoothing
  d.separate_colour_plane_flag, d.log2_max_pic_order_cnt_lsb_minus4 = s.separate_colour_plane, s.log2_max_poc_lsb - 4
  d.num_short_term_ref_pic_sets, d.num_long_term_ref_pics_sps = len(s.st_rps), len(s.lt_ref_pics_sps)
  d.long_term_ref_pics_present_flag = s.long_term_refs_present
  # picture
  d.dependent_slice_segments_enabled_flag, d.output_flag_present_flag = p.dependent_slice_segments, p.output_flag_present
  d.num_extra_slice_header_bits, d.sign_data_hiding_enabled_flag = p.num_extra_slice_header_bits, p.sign_data_hiding
  d.cabac_init_present_flag = p.cabac_init_present
  d.num_ref_idx_l0_default_active, d.num_ref_idx_l1_default_active = p.num_ref_idx_default
  # init_qp is 26 + init_qp_minus26 + QpBdOffsetY (nvdec_drv.h: "0..127, support higher bitdepth"): unsigned 7 bits,
  # where init_qp_minus26 goes down to -(26 + QpBdOffsetY). Sending 26 for a 10-bit stream started every slice's
  # CABAC contexts 12 QP too low: the engine ran off the picture's end (error 0x5 at CTB row 3 of 3, docs/research/nv-video.md)
  d.init_qp = p.init_qp + 6 * (s.bit_depth_luma - 8)
  d.constrained_intra_pred_flag, d.transform_skip_enabled_flag = p.constrained_intra_pred, p.transform_skip
  d.cu_qp_delta_enabled_flag, d.diff_cu_qp_delta_depth = p.cu_qp_delta, p.diff_cu_qp_delta_depth
  d.pps_cb_qp_offset, d.pps_cr_qp_offset, d.pps_beta_offset, d.pps_tc_offset = p.cb_qp_offset, p.cr_qp_offset, p.beta_offset, p.tc_offset
  d.pps_slice_chroma_qp_offsets_present_flag = p.slice_chroma_qp_offsets_present
  d.weighted_pred_flag, d.weighted_bipred_flag, d.transquant_bypass_enabled_flag = p.weighted_pred, p.weighted_bipred, p.transquant_bypass
  d.tiles_enabled_flag, d.entropy_coding_sync_enabled_flag = p.tiles, p.entropy_coding_sync
  if p.tiles: d.num_tile_columns, d.num_tile_rows = p.num_tiles
  d.loop_filter_across_tiles_enabled_flag, d.loop_filter_across_slices_enabled_flag = p.loop_filter_across_tiles, p.loop_filter_across_slices
  d.deblocking_filter_control_present_flag, d.deblocking_filter_override_enabled_flag = p.deblocking_control_present, p.deblocking_override_enabled
  d.pps_deblocking_filter_disabled_flag, d.lists_modification_present_flag = p.deblocking_disabled, p.lists_modification_present
  d.log2_parallel_merge_level, d.slice_segment_header_extension_present_flag = p.log2_parallel_merge_level, p.slice_header_extension_present
  # references (8.3.2, 8.3.4): POC distances by picture index, the initial lists cycled to 16 entries
  d.num_ref_frames = len(refs)
  for r in refs: d.RefDiffPicOrderCnts[r.index] = max(-32768, min(32767, cur.poc - r.poc))
  for lst, order in ((d.initreflistidxl0, before + after), (d.initreflistidxl1, after + before if h.slice_type == hevc.SLICE_B else [])):
    for i in range(16 if order else 0): lst[i] = order[i % len(order)].index
  d.IDR_picture_flag = nal_type in (hevc.IDR_W_RADL, hevc.IDR_N_LP)
  d.RAP_picture_flag = hevc.BLA_W_LP <= nal_type <= 23
  d.curr_pic_idx = cur.index
  d.sw_hdr_skip_length = h.skip_end - h.skip_start
  if h.st_rps is not None and h.st_rps_in_header:
    d.num_bits_short_term_ref_pics_in_slice, d.num_delta_pocs_of_rps_idx = h.st_rps.bits, h.st_rps.ref_deltas
  return d


@dataclass
class Planner:
  """The decode-order walk over a stream: yields Decode and Output steps (see module docstring)."""
  stream: bytes
  info: hevc.StreamInfo
  dpb: list[Picture] = field(default_factory=list)
  prev_tid0_poc: int = 0

  def _bump(self, until: int | None = None) -> Iterator[Picture]:
    """Output the waiting picture of smallest POC while more than `until` wait (None: all), dropping pictures
    neither referenced nor waiting."""
    while True:
      waiting = [q for q in self.dpb if q.waiting]
      if not waiting or (until is not None and len(waiting) <= until): break
      q = min(waiting, key=lambda x: x.poc)
      q.waiting = False
      yield q
    self.dpb = [q for q in self.dpb if q.reference or q.waiting]

  def steps(self) -> Iterator[Decode | Output]:
    vps: dict = {}
    sps: dict[int, hevc.SPSInfo] = {}
    pps: dict[int, hevc.PPSInfo] = {}
    first_irap_seen, skip_rasl, active, lay = False, False, None, None
    for au in hevc.access_units(hevc.split_nal_units(self.stream)):
      slices = []
      for u in au:
        if u.layer_id != 0: continue
        if u.type == hevc.VPS: vps[0] = hevc.parse_vps(u)
        elif u.type == hevc.SPS:
          s = hevc.parse_sps(u)
          check_sps(s, u.offset)
          sps[s.id] = s
        elif u.type == hevc.PPS:
          p = hevc.parse_pps(u)
          pps[p.id] = p
        elif u.type == hevc.EOS: first_irap_seen = False  # the next IRAP starts afresh (NoRaslOutputFlag = 1)
        elif u.is_vcl:
          if u.type > 21: raise VideoStreamError(f"NAL unit type {u.type} is reserved (corrupt stream)", u.offset)
          slices.append((u, hevc.parse_slice_header(u, pps, sps)))
      if not slices: continue
      u0, h = slices[0]
      if not h.first_slice: raise VideoStreamError("an access unit does not start with the first slice of a picture", u0.offset)
      p = pps[h.pps_id]
      s = sps[p.sps_id]
      irap = hevc.BLA_W_LP <= u0.type <= 23
      new_seq = active is None or (s.width, s.height, s.bit_depth_luma) != (active.width, active.height, active.bit_depth_luma)
      if new_seq and not irap: raise VideoStreamError("a new picture format starts at a picture that is not an IRAP picture", u0.offset)
      no_rasl_output = irap and (u0.type != hevc.CRA or not first_irap_seen or new_seq)
      if irap:
        skip_rasl, first_irap_seen = no_rasl_output and u0.type == hevc.CRA, True
      elif u0.type in (hevc.RASL_N, hevc.RASL_R) and skip_rasl: continue  # leading pictures whose references were never decoded
      elif u0.type not in (hevc.RADL_N, hevc.RADL_R): skip_rasl = False
      # 8.3.1: picture order count
      max_lsb = 1 << s.log2_max_poc_lsb
      if no_rasl_output: msb = 0
      else:
        prev_lsb, prev_msb = self.prev_tid0_poc & (max_lsb - 1), self.prev_tid0_poc - (self.prev_tid0_poc & (max_lsb - 1))
        if h.poc_lsb < prev_lsb and prev_lsb - h.poc_lsb >= max_lsb // 2: msb = prev_msb + max_lsb
        elif h.poc_lsb > prev_lsb and h.poc_lsb - prev_lsb > max_lsb // 2: msb = prev_msb - max_lsb
        else: msb = prev_msb
      poc = msb + h.poc_lsb
      if u0.temporal_id == 0 and u0.type not in SLNR and u0.type not in (hevc.RADL_N, hevc.RADL_R, hevc.RASL_N, hevc.RASL_R):
        self.prev_tid0_poc = poc
      # a new coded video sequence: everything before it is output, nothing of it is referenced
      if no_rasl_output:
        for q in self.dpb: q.reference = False
        for q in self._bump(): yield Output(q, lay, active)  # type: ignore[arg-type]
      if new_seq: active, lay = s, nvdec.layout(s.width, s.height, s.bit_depth_luma)
      # 8.3.2: the reference picture set, and marking
      rps = h.st_rps or hevc.StRps()
      by_poc = {q.poc: q for q in self.dpb if q.reference}
      before = [by_poc[poc + d] for d, used in rps.negative if used and poc + d in by_poc]
      after = [by_poc[poc + d] for d, used in rps.positive if used and poc + d in by_poc]
      keep = {poc + d for d, _ in (*rps.negative, *rps.positive)}
      for q in self.dpb: q.reference = q.reference and q.poc in keep
      refs = [q for q in self.dpb if q.reference]
      for q in self._bump(s.max_num_reorder): yield Output(q, lay, s)  # type: ignore[arg-type]
      while len(self.dpb) >= max(s.max_dec_pic_buffering, 1) and any(q.waiting for q in self.dpb):
        for q in self._bump(sum(q.waiting for q in self.dpb) - 1): yield Output(q, lay, s)  # type: ignore[arg-type]
      used = {q.index for q in self.dpb}
      index = next((i for i in range(nvdec.PICTURES) if i not in used), None)
      if index is None: raise VideoStreamError(f"more than {nvdec.PICTURES - 1} pictures are held for reference or display", u0.offset)
      cur = Picture(index, poc, u0.offset, True, h.pic_output)
      bitstream = b"".join(b"\x00\x00\x01" + u.data for u, _ in slices)
      desc = picture_setup(s, p, h, lay, cur, u0.type, len(bitstream), before, after, refs)  # type: ignore[arg-type]
      setup = bytes(desc).ljust(nvdec.PIC_SETUP_SIZE, b"\0") + _tile_sizes(s, p)
      yield Decode(cur, setup, bitstream, [q.index for q in refs], lay, s)  # type: ignore[arg-type]
      self.dpb.append(cur)
      for q in self._bump(s.max_num_reorder): yield Output(q, lay, s)  # type: ignore[arg-type]
    for q in self._bump(): yield Output(q, lay, active)  # type: ignore[arg-type]
