"""The NV video engine's data, on any machine: nvdec_hevc_pic_s against nvdec_drv.h's layout, the buffer layout and
block-linear addressing, and the picture setup plugrt derives from libx265 streams (slice headers, picture order,
reference picture sets, output order), checked against the encoder's settings and PyAV's decode."""
from __future__ import annotations

import ctypes

import pytest

from plugrt.errors import VideoDecoderUnavailable
from plugrt.video import hevc
from plugrt_nv import hw, nvdec
from plugrt_nv.nvdec_setup import Decode, Output, Planner

av = pytest.importorskip("av")
from plugrt_testing.video import make_hevc  # noqa: E402

# (field, byte, first bit, width) as nvdec_drv.h lays nvdec_hevc_pic_s out (x86-64 C bitfields: allocated from the
# least significant bit of each 32-bit unit), for a sample of fields from every part of the struct
HEADER = [("stream_len", 48, 0, 32), ("key_increment", 56, 0, 6), ("enable_substream_decoding", 56, 16, 1),
          ("gptimer_timeout_value", 60, 0, 32),
          ("tileformat", 64, 0, 2), ("gob_height", 64, 2, 3), ("sw_start_code_e", 65, 0, 8), ("colMvBuffersize", 76, 0, 32),
          ("HevcBsdCtrlOffset", 84, 0, 32), ("pic_width_in_luma_samples", 88, 0, 16), ("pic_height_in_luma_samples", 90, 0, 16),
          ("chroma_format_idc", 92, 0, 4), ("bit_depth_luma", 92, 4, 4), ("log2_max_transform_block_size", 92, 24, 4),
          ("max_transform_hierarchy_depth_inter", 96, 0, 3), ("amp_enable_flag", 96, 7, 1), ("pcm_sample_bit_depth_luma", 96, 10, 4),
          ("strong_intra_smoothing_enabled_flag", 96, 28, 1), ("num_extra_slice_header_bits", 100, 2, 3),
          ("num_ref_idx_l1_default_active", 100, 11, 4),
          ("init_qp", 100, 15, 7), ("diff_cu_qp_delta_depth", 100, 25, 2), ("tiles_enabled_flag", 108, 4, 1), ("num_tile_rows", 108, 11, 5),
          ("log2_parallel_merge_level", 108, 22, 3), ("slice_segment_header_extension_present_flag", 108, 25, 1), ("num_ref_frames", 112, 0, 8),
          ("longtermflag", 114, 0, 16), ("curr_pic_idx", 182, 0, 8), ("sw_hdr_skip_length", 184, 0, 16),
          ("log2_max_pic_order_cnt_lsb_minus4", 212, 1, 4),
          ("num_short_term_ref_pic_sets", 212, 5, 7), ("num_delta_pocs_of_rps_idx", 212, 19, 8), ("long_term_ref_pics_present_flag", 212, 27, 1),
          ("num_bits_short_term_ref_pics_in_slice", 216, 0, 32)]


def test_picture_setup_struct_matches_nvdec_drv_h():
  assert ctypes.sizeof(nvdec.HEVC_PIC) == 276 and ctypes.sizeof(nvdec.STATUS) == 56
  offsets = {"framestride": 68, "pps_cb_qp_offset": 104, "pps_tc_offset": 107, "initreflistidxl0": 116, "initreflistidxl1": 132,
             "RefDiffPicOrderCnts": 148, "IDR_picture_flag": 180, "ecdma_cfg": 188, "v1": 220, "v2": 252, "v3": 256, "ssm": 264}
  assert {n: getattr(nvdec.HEVC_PIC, n).offset for n in offsets} == offsets
  assert nvdec.HEVC_MAIN10_444_EXT.HevcFltAboveOffset.offset == 20 and nvdec.HEVC_PIC_V3.HevcSliceEdgeOffset.offset == 4
  for name, byte, bit, width in HEADER:  # all ones in one field sets exactly its bits
    d = nvdec.HEVC_PIC()
    setattr(d, name, (1 << width) - 1)
    assert int.from_bytes(bytes(d), "little") == ((1 << width) - 1) << (byte * 8 + bit), name


def test_methods_and_classes():
  M = nvdec.Method
  assert (M.SET_APPLICATION_ID, M.EXECUTE, M.SEMAPHORE_D, M.SET_CONTROL_PARAMS, M.SET_DRV_PIC_SETUP_OFFSET) == (0x200, 0x300, 0x304, 0x400, 0x404)
  assert (M.SET_PICTURE_LUMA_OFFSET0 + 16 * 4, M.SET_PICTURE_CHROMA_OFFSET0) == (0x470, 0x474)  # 17 of each, back to back
  assert (M.HEVC_SET_TILE_SIZES_OFFSET, M.HEVC_SET_FILTER_BUFFER_OFFSET, M.SET_INTRA_TOP_BUF_OFFSET) == (0x584, 0x588, 0x4C8)
  hopper = {0xCBC0, 0xC8B5, 0xC86F, 0xC661}
  assert hw.pick_classes(hopper | {0xB8B0}).video == 0xB8B0 and hw.pick_classes(hopper).video == 0  # type: ignore[union-attr]
  assert nvdec.control_params() & 0xF == 7 and nvdec.control_params() >> 18 & 3 == 1


def test_layout_and_block_linear_addressing():
  lay = nvdec.layout(1920, 1080, 8)
  assert (lay.pitch, lay.luma_rows, lay.chroma_rows, lay.chroma_offset) == (1920, 1088, 576, 1920 * 1088)
  assert lay.colmv == 1920 * 1088 // 16 and lay.coloc_size >= lay.colmv * nvdec.PICTURES and lay.filter_size > lay.intra_top_offset
  assert nvdec.layout(1920, 1080, 10).pitch == 3840  # 16 bits a sample
  # every byte of a 128 x 32 plane lands on its own address inside the plane: a permutation
  addrs = [nvdec.block_linear_offset(x, y, 128) for y in range(32) for x in range(128)]
  assert sorted(addrs) == list(range(128 * 32))
  assert [nvdec.block_linear_offset(x, 0, 128) for x in (0, 15, 16, 32, 64)] == [0, 15, 64, 256, 1024]
  assert [nvdec.block_linear_offset(0, y, 128) for y in (1, 4, 8, 16)] == [16, 128, 512, 2048]


# ---------------------------------------------------------------- slice headers and the picture walk

X265 = "sao=0:rect=1:amp=1:ctu=32:min-cu-size=8:tu-intra-depth=2:tu-inter-depth=3:strong-intra-smoothing=0:signhide=0:temporal-mvp=0:" \
       "cbqpoffs=2:crqpoffs=-3:deblock=1,-2:wpp=1:constrained-intra=1:tskip=1"


def test_parameter_sets_carry_the_encoders_settings():
  info = hevc.scan(make_hevc(256, 160, frames=4, params=X265))
  s, p = info.sps[0], info.pps[0]
  # x265 writes its transform depths as the option minus one, and deblock=tc,beta as the *_div2 values
  assert (s.log2_min_cb, s.log2_max_cb, s.max_transform_hierarchy_depth_intra, s.max_transform_hierarchy_depth_inter) == (3, 5, 1, 2)
  assert (s.amp, s.sao, s.temporal_mvp, s.strong_intra_smoothing, s.max_num_reorder) == (True, False, False, False, 2)
  assert (p.sign_data_hiding, p.cb_qp_offset, p.cr_qp_offset, p.tc_offset, p.beta_offset) == (False, 2, -3, 2, -4)
  assert (p.entropy_coding_sync, p.constrained_intra_pred, p.transform_skip, p.deblocking_control_present) == (True, True, True, True)
  d = hevc.scan(make_hevc(256, 160, frames=4))
  # x265's defaults: SAO, TMVP, CTUs of 64, WPP
  assert (d.sps[0].sao, d.sps[0].temporal_mvp, d.sps[0].log2_max_cb, d.pps[0].entropy_coding_sync) == (True, True, 6, True)


def _walk(stream: bytes) -> tuple[list[Decode], list[Output], list]:
  steps = list(Planner(stream, hevc.scan(stream)).steps())
  return [s for s in steps if isinstance(s, Decode)], [s for s in steps if isinstance(s, Output)], steps


def _pyav_types(stream: bytes) -> list[int]:
  ctx = av.CodecContext.create("hevc", "r")
  frames = [f for p in ctx.parse(stream) + ctx.parse(None) for f in ctx.decode(p)] + list(ctx.decode(None))
  return [int(f.pict_type) for f in frames]  # display order; 1 I, 2 P, 3 B


@pytest.mark.parametrize("bits,frames,params", [(8, 20, ""), (10, 12, "bframes=4:b-pyramid=1"), (8, 40, "keyint=12:open-gop=1"),
                                                (8, 16, "ref=4:bframes=3:rc-lookahead=5")])
def test_output_order_slice_types_and_references(bits, frames, params):
  stream = make_hevc(192, 160, frames=frames, bit_depth=bits, params=params)
  decodes, outputs, steps = _walk(stream)
  assert len(outputs) == len(decodes) == frames
  pocs = [o.picture.poc for o in outputs]
  # display order is POC order within each coded video sequence, and every decoded picture leaves exactly once
  assert sorted(map(id, (o.picture for o in outputs))) == sorted(map(id, (d.picture for d in decodes)))
  slice_type = {}
  for u in hevc.split_nal_units(stream):
    if u.is_vcl and u.first_slice_in_picture:
      info = hevc.scan(stream)
      slice_type[u.offset] = hevc.parse_slice_header(u, info.pps, info.sps).slice_type
  shown = [{hevc.SLICE_I: 1, hevc.SLICE_P: 2, hevc.SLICE_B: 3}[slice_type[o.picture.offset]] for o in outputs]
  assert shown == _pyav_types(stream)
  info = hevc.scan(stream)
  holder: dict[int, object] = {}  # picture index -> the picture its surface holds
  shown_ids: set[int] = set()
  decoded_pocs: set[int] = set()
  for s in steps:
    if isinstance(s, Decode):
      d = nvdec.HEVC_PIC.from_buffer_copy(s.setup[:ctypes.sizeof(nvdec.HEVC_PIC)])
      h = next(hevc.parse_slice_header(u, info.pps, info.sps) for u in hevc.split_nal_units(stream) if u.offset == s.picture.offset)
      rps = h.st_rps or hevc.StRps()
      if not d.IDR_picture_flag:  # the references are the pictures the slice header's RPS names (all decoded here), by their surfaces
        want = {s.picture.poc + dp for dp, _ in (*rps.negative, *rps.positive)} & decoded_pocs
        assert {holder[i].poc for i in s.references} == want  # type: ignore[attr-defined]
      old = holder.get(s.picture.index)
      assert old is None or id(old) in shown_ids or not old.waiting  # a surface is reused only after its picture left
      assert d.curr_pic_idx == s.picture.index and d.num_ref_frames == len(s.references) and d.stream_len == len(s.bitstream)
      for i in s.references: assert d.RefDiffPicOrderCnts[i] == s.picture.poc - holder[i].poc  # type: ignore[attr-defined]
      before = [i for i in s.references if holder[i].poc < s.picture.poc]  # type: ignore[attr-defined]
      if before and h.slice_type != hevc.SLICE_I: assert d.initreflistidxl0[0] == max(before, key=lambda i: holder[i].poc)  # type: ignore[attr-defined]
      holder[s.picture.index] = s.picture
      decoded_pocs.add(s.picture.poc)
    else: shown_ids.add(id(s.picture))
  assert pocs == sorted(pocs) or params.startswith("keyint")  # one sequence: increasing; with IDRs every 12, per sequence


def test_picture_setup_fields_for_a_known_stream():
  stream = make_hevc(256, 160, frames=6, params=X265)
  decodes, _, _ = _walk(stream)
  lay = nvdec.layout(256, 160, 8)
  first = nvdec.HEVC_PIC.from_buffer_copy(decodes[0].setup[:276])
  assert (first.pic_width_in_luma_samples, first.pic_height_in_luma_samples, first.bit_depth_luma, first.chroma_format_idc) == (256, 160, 8, 1)
  assert (first.IDR_picture_flag, first.RAP_picture_flag, first.num_ref_frames, first.sw_hdr_skip_length) == (1, 1, 0, 0)
  assert (first.tileformat, first.sw_start_code_e, list(first.framestride), first.colMvBuffersize) == (1, 1, [256, 256], lay.colmv >> 8)
  assert (first.log2_max_luma_coding_block_size, first.pps_cb_qp_offset, first.pps_beta_offset) == (5, 2, -4)
  assert first.entropy_coding_sync_enabled_flag == 1
  assert (first.init_qp, first.constrained_intra_pred_flag, first.transform_skip_enabled_flag) == (26, 1, 1)
  assert decodes[0].setup[nvdec.PIC_SETUP_SIZE:] == (8).to_bytes(2, "little") + (5).to_bytes(2, "little")  # one tile of 8x5 CTBs of 32
  assert decodes[0].bitstream[:3] == b"\0\0\x01" and decodes[0].bitstream[3] >> 1 in (hevc.IDR_W_RADL, hevc.IDR_N_LP)  # with its start code
  later = nvdec.HEVC_PIC.from_buffer_copy(decodes[1].setup[:276])
  h = next(hevc.parse_slice_header(u, *(lambda i: (i.pps, i.sps))(hevc.scan(stream))) for u in hevc.split_nal_units(stream)
           if u.is_vcl and u.offset == decodes[1].picture.offset)
  assert h.st_rps_in_header and later.num_bits_short_term_ref_pics_in_slice == h.st_rps.bits > 0
  assert later.sw_hdr_skip_length == 8 + 1 + h.st_rps.bits  # POC lsb (8 bits), short_term_ref_pic_set_sps_flag, the set


@pytest.mark.parametrize("bits", [8, 10])
def test_bit_depth_fields(bits):
  """Above 8 bits, init_qp carries QpBdOffsetY and the engine is asked for 10-bit output (nvdec_drv.h: init_qp
  "0..127, support higher bitdepth", disp_output_mode "1: Rec.709 10 bit"). Without them the H200 stopped a
  Main10 stream's first picture with error 0x5 (docs/research/nv-video.md, "10 bits on the H200")."""
  stream = make_hevc(192, 144, frames=3, bit_depth=bits)
  decodes, _, _ = _walk(stream)
  pps_qp = {p.init_qp for p in hevc.scan(stream).pps.values()}
  for d in decodes:
    pic = nvdec.HEVC_PIC.from_buffer_copy(d.setup[:276])
    assert (pic.bit_depth_luma, pic.bit_depth_chroma, pic.disp_output_mode) == (bits, bits, int(bits > 8))
    assert pic.init_qp in {q + 6 * (bits - 8) for q in pps_qp}
    assert list(pic.framestride) == [nvdec.layout(192, 144, bits).pitch // (2 if bits > 8 else 1)] * 2  # in samples


def test_streams_the_engine_path_refuses():
  with pytest.raises(VideoDecoderUnavailable, match="96x96"):
    list(Planner(s := make_hevc(96, 96, frames=2), hevc.scan(s)).steps())
  with pytest.raises(VideoDecoderUnavailable, match="scaling lists"):
    list(Planner(s := make_hevc(192, 160, frames=2, params="scaling-list=default"), hevc.scan(s)).steps())
