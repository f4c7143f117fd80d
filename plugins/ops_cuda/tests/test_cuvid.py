"""NVDEC through libnvcuvid (plugrt_cuda.cuvid). Without a GPU: the ctypes layouts against the SDK headers' C layout,
the declaration and its probe, and the fallback. With one (marker `gpu`, scripts/gpu-check.sh): every frame of
PyAV-made streams (8-bit, 10-bit, a resolution change, a cropped size) equals PyAV's software decode through the
same kernel within 1 level in uint8 (floats: 2**-9 in float16, 1e-6 in float32, both normalized), four streams at
once, each map_on / status_poll_us option, typed errors for cut streams, and 1000 open/close cycles with early closes
and exceptions that leak nothing.
"""
from __future__ import annotations

import ctypes
import gc
import threading
import time

import numpy as np
import pytest

from plugrt import Device, dtypes
from plugrt.errors import Reason, VideoDecoderUnavailable, VideoStreamError
from plugrt.video import decode_annexb_iter, decode_annexb_to_tensors_auto, hevc, software_decode
from plugrt_cuda import cuvid


def has_gpu() -> bool: return Device.registry.probe("CUDA").ok


gpu = pytest.mark.gpu
needs_gpu = pytest.mark.skipif(not has_gpu(), reason="no NVIDIA GPU here (run scripts/gpu-check.sh on the GPU machine)")

#: offsets a C compiler gives the SDK 13.0 headers (clang, x86-64; docs/research/nvdec.md)
C_OFFSETS = [(cuvid.CUVIDDECODECAPS, "bIsSupported", 24), (cuvid.CUVIDDECODECAPS, "nMaxWidth", 28), (cuvid.CUVIDDECODECAPS, "nMinWidth", 40),
             (cuvid.CUVIDDECODECREATEINFO, "display_area", 80), (cuvid.CUVIDDECODECREATEINFO, "OutputFormat", 88),
             (cuvid.CUVIDDECODECREATEINFO, "vidLock", 120), (cuvid.CUVIDDECODECREATEINFO, "target_rect", 128),
             (cuvid.CUVIDDECODECREATEINFO, "enableHistogram", 136), (cuvid.CUVIDEOFORMAT, "coded_width", 16),
             (cuvid.CUVIDEOFORMAT, "display_area", 24), (cuvid.CUVIDEOFORMAT, "chroma_format", 40),
             (cuvid.CUVIDEOFORMAT, "video_signal_description", 56), (cuvid.CUVIDEOFORMAT, "seqhdr_data_length", 60),
             (cuvid.CUVIDPARSERDISPINFO, "timestamp", 16), (cuvid.CUVIDSOURCEDATAPACKET, "payload", 16),
             (cuvid.CUVIDSOURCEDATAPACKET, "timestamp", 24), (cuvid.CUVIDPARSERPARAMS, "pUserData", 40),
             (cuvid.CUVIDPARSERPARAMS, "pfnSequenceCallback", 48), (cuvid.CUVIDPARSERPARAMS, "pfnGetSEIMsg", 80),
             (cuvid.CUVIDPARSERPARAMS, "pExtVideoInfo", 128), (cuvid.CUVIDPROCPARAMS, "raw_input_dptr", 24),
             (cuvid.CUVIDPROCPARAMS, "output_stream", 56), (cuvid.CUVIDPROCPARAMS, "histogram_dptr", 248),
             (cuvid.CUVIDRECONFIGUREDECODERINFO, "display_area", 68), (cuvid.CUVIDRECONFIGUREDECODERINFO, "target_rect", 76),
             (cuvid.CUVIDGETDECODESTATUS, "pReserved", 128)]


def test_struct_layouts_match_the_sdk_headers() -> None:
  for struct, size in cuvid.C_SIZES.items(): assert ctypes.sizeof(struct) == size, struct.__name__
  for struct, name, offset in C_OFFSETS: assert getattr(struct, name).offset == offset, f"{struct.__name__}.{name}"
  fmt = cuvid.CUVIDEOFORMAT()
  ctypes.memmove(ctypes.addressof(fmt) + 56, bytes([0b0001_1101, 9, 16, 9]), 4)  # video_format 5, full range 1 (bit 3)
  vs = fmt.video_signal_description
  assert (vs.video_format, vs.video_full_range_flag, vs.color_primaries, vs.matrix_coefficients) == (5, 1, 9, 9)


def test_the_contract_is_importable_from_plugrt_cuda() -> None:
  import plugrt.video
  assert cuvid.decode_annexb_iter is plugrt.video.decode_annexb_iter
  assert cuvid.decode_annexb_to_tensors_auto is plugrt.video.decode_annexb_to_tensors_auto


def test_nvdec_is_declared_and_listed() -> None:
  from plugrt.video import decoder_rows
  row = next(r for r in decoder_rows() if r["decoder"] == "NVDEC")
  assert row["device"] == "CUDA" and row["package"] == "plugrt-cuda"
  if not has_gpu(): assert not row["available"] and row["reason"] == "no device" and row["hint"]


@pytest.mark.skipif(has_gpu(), reason="there is a GPU here")
def test_without_a_gpu_the_auto_variant_falls_back() -> None:
  pytest.importorskip("av")
  from plugrt_testing.video import make_hevc
  stream = make_hevc(64, 48, frames=3)
  seen = []
  got = decode_annexb_to_tensors_auto(stream, dtype=dtypes.uint8, normalize=False, fallback=lambda e: seen.append(e) or "software")
  assert got == "software" and isinstance(seen[0], VideoDecoderUnavailable) and seen[0].reason is Reason.NO_DEVICE
  assert "NVDEC" in seen[0].reasons


# ---------------------------------------------------------------- on the GPU

def _streams() -> dict[str, bytes]:
  from plugrt_testing.video import nvdec_streams
  return nvdec_streams()


@pytest.fixture(scope="module")
def streams() -> dict[str, bytes]:
  pytest.importorskip("av")
  return _streams()


def _compare(stream: bytes, dtype, normalize: bool, tol: float) -> int:
  hw = decode_annexb_to_tensors_auto(stream, dtype=dtype, normalize=normalize, decoder="NVDEC", device="CUDA")
  sw = software_decode(stream, dtype=dtype, normalize=normalize, device="CUDA")
  assert len(hw) == len(sw) == hevc.scan(stream).pictures
  for (ts_h, th), (ts_s, ts) in zip(hw, sw):
    assert ts_h == ts_s and th.shape == ts.shape and str(th.device).startswith("CUDA")
    err = np.abs(th.numpy().astype(np.float64) - ts.numpy().astype(np.float64)).max()
    assert err <= tol, f"frame {ts_h}: NVDEC and software differ by {err}"
  return len(hw)


@gpu
@needs_gpu
@pytest.mark.parametrize("name", ["8bit-bt709", "8bit-cropped-bt601-full", "10bit-bt2020", "resolution-change"])
def test_every_frame_matches_software(streams: dict[str, bytes], name: str) -> None:
  assert _compare(streams[name], dtypes.uint8, False, 1) > 0
  _compare(streams[name], dtypes.float16, True, 2 ** -9)
  _compare(streams[name], dtypes.float32, True, 1e-6)


@gpu
@needs_gpu
def test_a_picture_below_nvdec_minimum_is_a_typed_refusal(streams: dict[str, bytes]) -> None:
  with pytest.raises(VideoDecoderUnavailable, match="144x144"):
    decode_annexb_to_tensors_auto(streams["too-small"], dtype=dtypes.uint8, normalize=False, decoder="NVDEC", device="CUDA")
  seen: list[BaseException] = []
  got = decode_annexb_to_tensors_auto(streams["too-small"], dtype=dtypes.uint8, normalize=False, decoder="NVDEC", device="CUDA",
                                      fallback=lambda e: seen.append(e) or "software")
  assert got == "software" and isinstance(seen[0], VideoDecoderUnavailable)
  _nothing_open()


@gpu
@needs_gpu
@pytest.mark.parametrize("map_on, poll_us", [("thread", 0), ("consumer", 0), ("thread", 100), ("parser", 100)])
def test_maps_off_the_parser_thread_match_software(streams: dict[str, bytes], monkeypatch: pytest.MonkeyPatch, map_on: str,
                                                   poll_us: int) -> None:
  """The map_on and status_poll_us options (docs/video.md), through decode_annexb_iter's path (the module defaults):
  every frame as software's, a resolution change, two streams at once, nothing left behind."""
  monkeypatch.setattr(cuvid, "MAP_ON", map_on)
  monkeypatch.setattr(cuvid, "STATUS_POLL_US", poll_us)
  errors: list[BaseException] = []

  def run(s: bytes) -> None:
    try: _compare(s, dtypes.uint8, False, 1)
    except BaseException as e: errors.append(e)
  threads = [threading.Thread(target=run, args=(streams[n],)) for n in ("8bit-bt709", "resolution-change")]
  for t in threads: t.start()
  for t in threads: t.join(120)
  assert not errors, errors
  _nothing_open()


@gpu
@needs_gpu
def test_four_streams_at_once(streams: dict[str, bytes]) -> None:
  errors: list[BaseException] = []

  def run(s: bytes) -> None:
    try: _compare(s, dtypes.uint8, False, 1)
    except BaseException as e: errors.append(e)
  threads = [threading.Thread(target=run, args=(streams[n],)) for n in ("8bit-bt709", "10bit-bt2020", "resolution-change", "8bit-bt709")]
  for t in threads: t.start()
  for t in threads: t.join(120)
  assert not errors, errors


@gpu
@needs_gpu
def test_cut_stream_is_a_typed_error(streams: dict[str, bytes]) -> None:
  s = streams["8bit-bt709"]
  cut = [u for u in hevc.split_nal_units(s) if u.is_vcl][5].offset + 6
  with pytest.raises(VideoStreamError):
    decode_annexb_to_tensors_auto(s[:cut], dtype=dtypes.uint8, normalize=False, decoder="NVDEC", device="CUDA")
  _nothing_open()


def _nothing_open() -> None:
  """No decoder, parser or mapped surface of an open stream is left (closed streams' decoders may be kept for reuse)."""
  objects = cuvid.live_objects()
  assert (objects["decoders"], objects["parsers"], objects["mapped"]) == (0, 0, 0) and objects["kept"] <= cuvid.DECODER_CACHE, objects


@gpu
@needs_gpu
def test_kept_decoders_decode_the_next_streams_right(streams: dict[str, bytes]) -> None:
  """Decoders kept for reuse (cuvid.DECODER_CACHE) serve the next streams that fit, reconfigured to their size, the
  resolution change included: every frame as software's."""
  from plugrt.video.convert import convert
  cuvid.clear_decoder_cache()
  order = ["resolution-change", "8bit-bt709", "8bit-cropped-bt601-full", "8bit-bt709", "resolution-change", "10bit-bt2020", "10bit-bt2020"]
  reused = []
  for name in order:
    s = streams[name]
    dec = cuvid.NVDECDecoder(Device["CUDA"], s, hevc.scan(s), {"queue_depth": 4})
    got = []
    try:
      for f in dec.frames():
        got.append(convert(f.surface, dtypes.uint8, False, None).numpy())
        f.release()
    finally: dec.close()
    reused.append(dec.reused)
    sw = software_decode(s, dtype=dtypes.uint8, normalize=False, device="CUDA")
    assert len(got) == len(sw) == hevc.scan(s).pictures, name
    for k, (hw, (_ts, ref)) in enumerate(zip(got, sw)):
      err = np.abs(hw.astype(np.int32) - ref.numpy().astype(np.int32)).max()
      assert err <= 1, f"{name} frame {k} (decoder {'kept' if dec.reused else 'made'}): NVDEC and software differ by {err}"
  assert reused[0] is False and reused[3] is True and reused[4] is True and reused[5] is False and reused[6] is True, reused
  _nothing_open()
  assert cuvid.clear_decoder_cache() >= 2 and cuvid.live_objects()["kept"] == 0  # an 8-bit and a 10-bit one at least


def _free_gpu_memory() -> int:
  dev = Device["CUDA"]
  dev.synchronize()
  dev.allocator.free_cache()
  free, total = ctypes.c_size_t(), ctypes.c_size_t()
  dev.info.state.lib.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
  return free.value


@gpu
@needs_gpu
@pytest.mark.parametrize("keep, cycles", [(cuvid.DECODER_CACHE, 1000), (0, 200)])
def test_a_thousand_open_close_cycles_leak_nothing(streams: dict[str, bytes], monkeypatch: pytest.MonkeyPatch, keep: int, cycles: int) -> None:
  """Early closes, exceptions inside the loop and full runs: nothing of an open stream is left after each, and the
  decoder count and GPU memory are back once the kept decoders are freed. With decoders kept (the default) a
  thousand cycles; without (DECODER_CACHE=0: a create and a destroy each, 0.28 s on an H200), two hundred."""
  monkeypatch.setattr(cuvid, "DECODER_CACHE", keep)
  s = streams["8bit-bt709"]
  list(decode_annexb_iter(s, dtype=dtypes.float16, normalize=True, decoder="NVDEC"))  # warm: kernels compiled, context made
  gc.collect()
  before, objects = _free_gpu_memory(), cuvid.live_objects()  # (frees the kept decoders too)
  assert objects == {"decoders": 0, "kept": 0, "parsers": 0, "mapped": 0}
  t0 = time.monotonic()
  for i in range(cycles):
    if i % 100 == 0: print(f"cycle {i}: {time.monotonic() - t0:.1f} s", flush=True)  # where the time goes (run with -s)
    if i % 3 == 0:
      it = decode_annexb_iter(s, dtype=dtypes.float16, normalize=True, decoder="NVDEC")
      next(it)
      it.close()                      # early close after one frame
    elif i % 3 == 1:                  # an exception inside the loop (the iterator is the loop's own, as users write it)
      with pytest.raises(ZeroDivisionError):
        for _ts, _t in decode_annexb_iter(s, dtype=dtypes.float16, normalize=True, decoder="NVDEC"): _ = 1 / 0
    else:
      for _ in decode_annexb_iter(s, dtype=dtypes.float16, normalize=True, decoder="NVDEC"): pass  # to the end
    now = cuvid.live_objects()
    assert (now["decoders"], now["parsers"], now["mapped"], now["kept"]) == (0, 0, 0, min(keep, 1)), f"cycle {i}: {now}"
  print(f"cycle {cycles}: {time.monotonic() - t0:.1f} s", flush=True)
  gc.collect()
  after = _free_gpu_memory()
  assert cuvid.live_objects() == objects
  assert before - after < 64 << 20, f"{(before - after) >> 20} MiB of GPU memory not given back after {cycles} cycles"
