"""The video decode engine (NVDEC) as data: its class ids, methods, the HEVC picture-setup struct the engine reads
(nvdec_hevc_pic_s), the status it writes, the sizes of its work buffers, and the block-linear layout of the
pictures it writes. Pure Python: nothing here touches a GPU.

Sources (docs/research/nv-video.md has the details): NVIDIA open-gpu-doc classes/video/clc9b0.h (methods; the
same offsets in clc5b0.h, clc6b0.h and clc7b0.h, so Hopper's NVB8B0, whose header only defines the class id, is
taken to share them) and classes/video/nvdec_drv.h (nvdec_hevc_pic_s, nvdec_status_s); open-gpu-kernel-modules
clb8b0.h and nouveau's gh100 class table (0xB8B0 on GH100), cl2080_notification.h (engine types); tinygrad 0.14's
NVVideoQueue and its HEVC helper (buffer sizes and offsets, the block-linear picture layout, read for facts only).
"""
from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass

from plugrt.hwqueue import round_up

# ---------------------------------------------------------------- classes and engines

# the video decoder class of each family is in plugrt_nv.hw.FAMILIES (Hopper: 0xB8B0, NVB8B0_VIDEO_DECODER)
ENGINE_NVDEC0 = 0x13   # NV2080_ENGINE_TYPE_NVDEC0 (= NV2080_ENGINE_TYPE_BSP); NVDEC1..7 are 0x14..0x1A


def first_decoder(engines: Sequence[int]) -> int | None:
  """The lowest NVDEC instance among a GPU's engine types (NV2080_CTRL_CMD_GPU_GET_ENGINES_V2's list), or None.
  Not always 0: GH100 has room for NVDEC0-7 and a GPU may have fewer, and RM refuses a decoder object or a
  channel bind naming an engine the GPU lacks (docs/research/nv-video.md, "Which NVDEC")."""
  return min((e - ENGINE_NVDEC0 for e in engines if ENGINE_NVDEC0 <= e <= ENGINE_NVDEC0 + 7), default=None)
SUBCH_VIDEO = 4        # the subchannel NVDEC methods go to (any works on a single-engine channel; tinygrad uses 4)


class BSPAllocParams(ctypes.Structure):
  """NV_BSP_ALLOCATION_PARAMETERS (open-gpu-kernel-modules nvos.h): the decoder object's engine instance (0 = NVDEC0)."""
  _fields_ = [("size", ctypes.c_uint32), ("prohibitMultipleInstances", ctypes.c_uint32), ("engineInstance", ctypes.c_uint32)]


# ---------------------------------------------------------------- methods (byte offsets, NVC9B0_* = NVB8B0_*)

class Method:
  SET_OBJECT = 0x000
  SET_APPLICATION_ID = 0x200
  SEMAPHORE_A, SEMAPHORE_B, SEMAPHORE_C = 0x240, 0x244, 0x248
  EXECUTE, SEMAPHORE_D = 0x300, 0x304
  SET_CONTROL_PARAMS = 0x400
  SET_DRV_PIC_SETUP_OFFSET = 0x404
  SET_IN_BUF_BASE_OFFSET = 0x408
  SET_PICTURE_INDEX = 0x40C
  SET_SLICE_OFFSETS_BUF_OFFSET = 0x410
  SET_COLOC_DATA_OFFSET = 0x414
  SET_HISTORY_OFFSET = 0x418
  SET_NVDEC_STATUS_OFFSET = 0x424
  SET_PICTURE_LUMA_OFFSET0 = 0x430    # + 4 * i, i = 0..16
  SET_PICTURE_CHROMA_OFFSET0 = 0x474  # + 4 * i
  SET_INTRA_TOP_BUF_OFFSET = 0x4C8
  HEVC_SET_SCALING_LIST_OFFSET = 0x580
  HEVC_SET_TILE_SIZES_OFFSET = 0x584
  HEVC_SET_FILTER_BUFFER_OFFSET = 0x588
  HEVC_SET_SAO_BUFFER_OFFSET = 0x58C
  HEVC_SET_SLICE_INFO_BUFFER_OFFSET = 0x590


APPLICATION_HEVC = 7   # SET_APPLICATION_ID_ID_HEVC
CODEC_HEVC = 7         # SET_CONTROL_PARAMS_CODEC_TYPE_HEVC (bits 3:0)
PICTURES = 17          # SET_PICTURE_LUMA_OFFSET0..16: picture indices the engine addresses


def control_params(codec: int = CODEC_HEVC) -> int:
  """SET_CONTROL_PARAMS: codec (3:0), GPTIMER_ON (4), ERR_CONCEAL_ON (6), MBTIMER_ON (13), EVENT_TRACE_LOGGING_ON (16),
  TESTRUN_ENV = PROD_RUN (19:18 = 1): what tinygrad's NV video queue submits."""
  return codec | 1 << 4 | 1 << 6 | 1 << 13 | 1 << 16 | 1 << 18


#: SEMAPHORE_D: STRUCTURE_SIZE = FOUR (1:0 = 1: payload, then the timestamp at +8), OPERATION = RELEASE (17:16 = 0),
#: PAYLOAD_SIZE = 64BIT (24); the upper payload word is never set, so it stays 0 (the timeline reads 32 bits)
SEMAPHORE_D_RELEASE_FOUR = 1 | 1 << 24


# ---------------------------------------------------------------- structs (x86-64, the header's C layout)

u8, u16, u32, s8, s16 = ctypes.c_uint8, ctypes.c_uint16, ctypes.c_uint32, ctypes.c_int8, ctypes.c_int16


def _struct(name: str, size: int, fields: list[tuple]) -> type[ctypes.Structure]:
  cls = type(name, (ctypes.Structure,), {"_fields_": fields})
  assert ctypes.sizeof(cls) == size, f"{name} is {ctypes.sizeof(cls)} bytes, nvdec_drv.h makes it {size}"
  return cls


ECDMA_CONFIG = _struct("nvdec_ecdma_config_s", 24, [
  ("ecdma_enable", u32), ("ecdma_blk_x_src", u16), ("ecdma_blk_y_src", u16), ("ecdma_blk_x_dst", u16), ("ecdma_blk_y_dst", u16),
  ("ref_pic_idx", u16), ("boundary0_top", u16), ("boundary0_bottom", u16), ("boundary1_left", u16), ("boundary1_right", u16),
  ("blk_copy_flag", u8), ("ctb_size", u8)])

HEVC_MAIN10_444_EXT = _struct("nvdec_hevc_main10_444_ext_s", 28, [
  ("transformSkipRotationEnableFlag", u32, 1), ("transformSkipContextEnableFlag", u32, 1), ("intraBlockCopyEnableFlag", u32, 1),
  ("implicitRdpcmEnableFlag", u32, 1), ("explicitRdpcmEnableFlag", u32, 1), ("extendedPrecisionProcessingFlag", u32, 1),
  ("intraSmoothingDisabledFlag", u32, 1), ("highPrecisionOffsetsEnableFlag", u32, 1), ("fastRiceAdaptationEnableFlag", u32, 1),
  ("cabacBypassAlignmentEnableFlag", u32, 1), ("sps_444_extension_reserved", u32, 22),
  ("log2MaxTransformSkipSize", u32, 4), ("crossComponentPredictionEnableFlag", u32, 1), ("chromaQpAdjustmentEnableFlag", u32, 1),
  ("diffCuChromaQpAdjustmentDepth", u32, 2), ("chromaQpAdjustmentTableSize", u32, 3), ("log2SaoOffsetScaleLuma", u32, 3),
  ("log2SaoOffsetScaleChroma", u32, 3), ("pps_444_extension_reserved", u32, 15),
  ("cb_qp_adjustment", s8 * 6), ("cr_qp_adjustment", s8 * 6), ("HevcFltAboveOffset", u32), ("HevcSaoAboveOffset", u32)])

HEVC_PIC_V1 = _struct("nvdec_hevc_pic_v1_s", 32, [
  ("hevc_main10_444_ext", HEVC_MAIN10_444_EXT), ("sw_skip_start_length", u32, 14), ("external_ref_mem_dis", u32, 1),
  ("error_recovery_start_pos", u32, 2), ("error_external_mv_en", u32, 1), ("reserved0", u32, 14)])

HEVC_PIC_V2 = _struct("nvdec_hevc_pic_v2_s", 4, [
  ("mv_hevc_enable", u32, 1), ("nuh_layer_id", u32, 6), ("default_ref_layers_active_flag", u32, 1), ("NumDirectRefLayers", u32, 6),
  ("max_one_active_ref_layer_flag", u32, 1), ("NumActiveRefLayerPics", u32, 6), ("poc_lsb_not_present_flag", u32, 1), ("reserved0", u32, 10)])

HEVC_PIC_V3 = _struct("nvdec_hevc_pic_v3_s", 8, [
  ("slice_decoding_enable", u32, 1), ("slice_ec_enable", u32, 1), ("slice_ec_mv_type", u32, 2), ("err_detected_sw", u32, 1),
  ("slice_ec_slice_type", u32, 2), ("slice_strm_recfg_en", u32, 1), ("reserved", u32, 24), ("HevcSliceEdgeOffset", u32)])

PASS2_OTF_EXT = _struct("nvdec_pass2_otf_ext_s", 12, [
  ("ssm_entry_num", u32, 16), ("ssm_iv_num", u32, 16), ("real_stream_length", u32), ("non_slice_data", u32, 16), ("drm_mode", u32, 7),
  ("reserved", u32, 9)])

HEVC_PIC = _struct("nvdec_hevc_pic_s", 276, [
  ("wrapped_session_key", u32 * 4), ("wrapped_content_key", u32 * 4), ("initialization_vector", u32 * 4),
  ("stream_len", u32), ("enable_encryption", u32),
  ("key_increment", u32, 6), ("encryption_mode", u32, 4), ("key_slot_index", u32, 4), ("ssm_en", u32, 1), ("enable_histogram", u32, 1),
  ("enable_substream_decoding", u32, 1), ("reserved0", u32, 15),
  ("gptimer_timeout_value", u32),
  ("tileformat", u8, 2), ("gob_height", u8, 3), ("reserverd_surface_format", u8, 3), ("sw_start_code_e", u8), ("disp_output_mode", u8),
  ("reserved1", u8),
  ("framestride", u32 * 2), ("colMvBuffersize", u32), ("HevcSaoBufferOffset", u32), ("HevcBsdCtrlOffset", u32),
  ("pic_width_in_luma_samples", u16), ("pic_height_in_luma_samples", u16),
  ("chroma_format_idc", u32, 4), ("bit_depth_luma", u32, 4), ("bit_depth_chroma", u32, 4), ("log2_min_luma_coding_block_size", u32, 4),
  ("log2_max_luma_coding_block_size", u32, 4), ("log2_min_transform_block_size", u32, 4), ("log2_max_transform_block_size", u32, 4),
  ("reserved2", u32, 4),
  ("max_transform_hierarchy_depth_inter", u32, 3), ("max_transform_hierarchy_depth_intra", u32, 3), ("scalingListEnable", u32, 1),
  ("amp_enable_flag", u32, 1), ("sample_adaptive_offset_enabled_flag", u32, 1), ("pcm_enabled_flag", u32, 1),
  ("pcm_sample_bit_depth_luma", u32, 4), ("pcm_sample_bit_depth_chroma", u32, 4), ("log2_min_pcm_luma_coding_block_size", u32, 4),
  ("log2_max_pcm_luma_coding_block_size", u32, 4), ("pcm_loop_filter_disabled_flag", u32, 1), ("sps_temporal_mvp_enabled_flag", u32, 1),
  ("strong_intra_smoothing_enabled_flag", u32, 1), ("reserved3", u32, 3),
  ("dependent_slice_segments_enabled_flag", u32, 1), ("output_flag_present_flag", u32, 1), ("num_extra_slice_header_bits", u32, 3),
  ("sign_data_hiding_enabled_flag", u32, 1), ("cabac_init_present_flag", u32, 1), ("num_ref_idx_l0_default_active", u32, 4),
  ("num_ref_idx_l1_default_active", u32, 4), ("init_qp", u32, 7), ("constrained_intra_pred_flag", u32, 1),
  ("transform_skip_enabled_flag", u32, 1), ("cu_qp_delta_enabled_flag", u32, 1), ("diff_cu_qp_delta_depth", u32, 2), ("reserved4", u32, 5),
  ("pps_cb_qp_offset", s8), ("pps_cr_qp_offset", s8), ("pps_beta_offset", s8), ("pps_tc_offset", s8),
  ("pps_slice_chroma_qp_offsets_present_flag", u32, 1), ("weighted_pred_flag", u32, 1), ("weighted_bipred_flag", u32, 1),
  ("transquant_bypass_enabled_flag", u32, 1), ("tiles_enabled_flag", u32, 1), ("entropy_coding_sync_enabled_flag", u32, 1),
  ("num_tile_columns", u32, 5), ("num_tile_rows", u32, 5), ("loop_filter_across_tiles_enabled_flag", u32, 1),
  ("loop_filter_across_slices_enabled_flag", u32, 1), ("deblocking_filter_control_present_flag", u32, 1),
  ("deblocking_filter_override_enabled_flag", u32, 1), ("pps_deblocking_filter_disabled_flag", u32, 1),
  ("lists_modification_present_flag", u32, 1), ("log2_parallel_merge_level", u32, 3), ("slice_segment_header_extension_present_flag", u32, 1),
  ("reserved5", u32, 6),
  ("num_ref_frames", u8), ("reserved6", u8), ("longtermflag", u16), ("initreflistidxl0", u8 * 16), ("initreflistidxl1", u8 * 16),
  ("RefDiffPicOrderCnts", s16 * 16),
  ("IDR_picture_flag", u8), ("RAP_picture_flag", u8), ("curr_pic_idx", u8), ("pattern_id", u8), ("sw_hdr_skip_length", u16), ("reserved7", u16),
  ("ecdma_cfg", ECDMA_CONFIG),
  ("separate_colour_plane_flag", u32, 1), ("log2_max_pic_order_cnt_lsb_minus4", u32, 4), ("num_short_term_ref_pic_sets", u32, 7),
  ("num_long_term_ref_pics_sps", u32, 6), ("bBitParsingDisable", u32, 1), ("num_delta_pocs_of_rps_idx", u32, 8),
  ("long_term_ref_pics_present_flag", u32, 1), ("reserved_dxva", u32, 4),
  ("num_bits_short_term_ref_pics_in_slice", u32),
  ("v1", HEVC_PIC_V1), ("v2", HEVC_PIC_V2), ("v3", HEVC_PIC_V3), ("ssm", PASS2_OTF_EXT)])

STATUS_HEVC = _struct("nvdec_status_hevc_s", 36, [(n, u32) for n in (
  "frame_status_intra_cnt", "frame_status_inter_cnt", "frame_status_skip_cnt", "frame_status_fwd_mvx_cnt", "frame_status_fwd_mvy_cnt",
  "frame_status_bwd_mvx_cnt", "frame_status_bwd_mvy_cnt", "error_ctb_pos", "error_slice_pos")])

STATUS = _struct("nvdec_status_s", 56, [
  ("mbs_correctly_decoded", u32), ("mbs_in_error", u32), ("cycle_count", u32), ("error_status", u32), ("hevc", STATUS_HEVC),
  ("slice_header_error_code", u32)])


# ---------------------------------------------------------------- buffers

PIC_SETUP_SIZE = 0x200     # nvdec_hevc_pic_s, zero padded; the tile sizes follow it (HEVC_SET_TILE_SIZES_OFFSET)
TILE_SIZES_SIZE = 0x100    # (columns x rows) pairs of u16 (width, height in CTBs); 20x22 tiles at most would need 1760 bytes
SETUP_SIZE = 0x1000        # a picture's setup block: pic setup, tile sizes, status
STATUS_OFFSET = 0x800      # in the setup block: where the engine writes nvdec_status_s
GPTIMER_TIMEOUT = 81600000  # engine cycles before a picture is abandoned (what tinygrad's HEVC helper writes)
DISP_OUTPUT_8BIT, DISP_OUTPUT_10BIT = 0, 1  # disp_output_mode: "0: Rec.709 8 bit, 1: Rec.709 10 bit" (nvdec_drv.h)
TILE_FORMAT_BLOCK_LINEAR = 1  # tileformat 1 ("KBL"): GOBs of 64 bytes x 8 rows, GOB_HEIGHT 0 = two GOBs a block



@dataclass(frozen=True)
class Layout:
  """Where everything of one picture size lives: the picture surfaces (block linear) and the engine's work buffers.

  A surface is the luma plane of `pitch` bytes x `luma_rows` rows, then the chroma plane (Cb, Cr interleaved) of
  `pitch` bytes x `chroma_rows` rows at `chroma_offset`; pitches and rows are multiples of 64. Samples of more than
  8 bits take 16 bits each, the value in the top bits (P016)."""
  width: int
  height: int
  bit_depth: int
  pitch: int           # bytes a row, both planes (framestride)
  luma_rows: int
  chroma_rows: int
  colmv: int           # one picture's collocated motion vectors, bytes (colMvBuffersize * 256)
  filter_row: int      # the filter buffer's rows are scaled by this (the larger aligned side)

  @property
  def chroma_offset(self) -> int: return self.pitch * self.luma_rows
  @property
  def surface_size(self) -> int: return round_up(self.pitch * (self.luma_rows + self.chroma_rows), 0x10000)
  @property
  def coloc_size(self) -> int: return round_up(self.colmv * PICTURES, 2 << 20)

  # The filter buffer holds, one after another, per row of 64-aligned samples: deblocking (608), SAO (4864), BSD
  # control (152) and the filter/SAO lines above (2000); then the intra-prediction top line. The offsets in
  # nvdec_hevc_pic_s are in 256-byte units. tinygrad scales them with the picture's height; plugrt scales them with
  # the larger side, which only spaces them further apart.
  @property
  def sao_offset(self) -> int: return 608 * self.filter_row
  @property
  def bsd_offset(self) -> int: return self.sao_offset + 4864 * self.filter_row
  @property
  def flt_above_offset(self) -> int: return self.bsd_offset + 152 * self.filter_row
  @property
  def sao_above_offset(self) -> int: return self.flt_above_offset + 2000 * self.filter_row
  @property
  def intra_top_offset(self) -> int: return self.sao_above_offset
  @property
  def filter_size(self) -> int: return round_up(round_up(self.intra_top_offset, 0x10000) + (64 << 10), 2 << 20)


def layout(width: int, height: int, bit_depth: int) -> Layout:
  """The layout for coded pictures of width x height luma samples at `bit_depth` bits."""
  sample = 1 if bit_depth <= 8 else 2
  w64, h64 = round_up(width, 64), round_up(height, 64)
  return Layout(width, height, bit_depth, round_up(width * sample, 64), h64, round_up((height + 1) // 2, 64),
                round_up(w64 * h64 // 16, 256), max(w64, h64))


def block_linear_offset(x: int, y: int, pitch: int) -> int:
  """Byte offset of byte column `x`, row `y` in a block-linear plane of `pitch` bytes a row: GOBs of 64 bytes x 8 rows
  (512 bytes), two GOBs stacked per block, blocks left to right across the pitch; inside a GOB, bits of x and y
  interleave as x[3:0], y[1:0], x[4], y[2], x[5] (from the least significant bit up)."""
  gob = ((y >> 4) * (pitch >> 6) + (x >> 6)) * 2 + (y >> 3 & 1)
  return gob * 512 + (x & 0xF | (y & 3) << 4 | (x & 0x10) << 2 | (y & 4) << 5 | (x & 0x20) << 3)


# ---------------------------------------------------------------- commands

def _address(va: int, what: str) -> int:
  """An address as the engine's offset methods take it: 256-byte aligned, below 2^40, stored >> 8."""
  if va % 256 or not 0 < va < 1 << 40: raise ValueError(f"NVDEC {what} address {va:#x} must be 256-byte aligned and below 2^40")
  return va >> 8


def _m(offset: int, *data: int) -> list[int]:
  from plugrt_nv.cmd import method
  return method(SUBCH_VIDEO, offset, *data)


def set_object(cls: int) -> list[int]: return _m(Method.SET_OBJECT, cls)


def release(va: int, value: int) -> list[int]:
  """When the engine has finished everything before: write `value` (32 bits, the upper word 0) and a timestamp at `va`."""
  return [*_m(Method.SEMAPHORE_A, va >> 32 & 0xFF, va & 0xFFFFFFFC, value & 0xFFFFFFFF), *_m(Method.SEMAPHORE_D, SEMAPHORE_D_RELEASE_FOUR)]


def decode_hevc(setup: int, bitstream: int, surfaces: dict[int, int], lay: Layout, coloc: int, filter_buffer: int) -> list[int]:
  """The methods that decode one HEVC picture: the picture setup block at `setup` (nvdec_hevc_pic_s, the tile sizes
  at +PIC_SETUP_SIZE, the status written at +STATUS_OFFSET), its slices at `bitstream`, and the surface of every
  picture index it writes or reads (index -> address; the chroma plane at lay.chroma_offset)."""
  words = [*_m(Method.SET_APPLICATION_ID, APPLICATION_HEVC), *_m(Method.SET_CONTROL_PARAMS, control_params()),
           *_m(Method.SET_DRV_PIC_SETUP_OFFSET, _address(setup, "picture setup")),
           *_m(Method.SET_IN_BUF_BASE_OFFSET, _address(bitstream, "bitstream"))]
  for i, va in sorted(surfaces.items()):
    if not 0 <= i < PICTURES: raise ValueError(f"picture index {i} is out of range 0..{PICTURES - 1}")
    words += [*_m(Method.SET_PICTURE_LUMA_OFFSET0 + 4 * i, _address(va, "luma")),
              *_m(Method.SET_PICTURE_CHROMA_OFFSET0 + 4 * i, _address(va + lay.chroma_offset, "chroma"))]
  return [*words, *_m(Method.SET_COLOC_DATA_OFFSET, _address(coloc, "collocated motion vector")),
          *_m(Method.SET_NVDEC_STATUS_OFFSET, _address(setup + STATUS_OFFSET, "status")),
          *_m(Method.HEVC_SET_TILE_SIZES_OFFSET, _address(setup + PIC_SETUP_SIZE, "tile sizes")),
          *_m(Method.HEVC_SET_FILTER_BUFFER_OFFSET, _address(filter_buffer, "filter buffer")),
          *_m(Method.SET_INTRA_TOP_BUF_OFFSET, _address(filter_buffer + round_up(lay.intra_top_offset, 256), "intra top line")),
          *_m(Method.EXECUTE, 0)]
