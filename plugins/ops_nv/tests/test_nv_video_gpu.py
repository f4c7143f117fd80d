"""NV's own video engine path on a real GPU (marker `gpu`; `bash scripts/gpu-check.sh --only=nvvideo` on the lent
H100 or H200; first passed on two H200s, 2026-11-28): the engine opens, and every frame of the hardware-decoder test
streams (plugrt_testing.video.nvdec_streams, the ones plugrt-cuda's NVDEC tests use) decoded by
`decode_annexb_iter(stream, device="NV")` equals PyAV's software decode through the same conversion kernel within
1 level in uint8 (float16 within 2**-9, float32 1e-6, normalized); a picture below the engine's minimum is a typed
refusal; opening and closing streams leaves no memory behind."""
from __future__ import annotations

import numpy as np
import pytest
from nv_tools import has_nv

from plugrt import Device, dtypes
from plugrt.errors import VideoDecoderUnavailable
from plugrt.video import decode_annexb_iter, decode_annexb_to_tensors_auto, hevc, software_decode

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not has_nv(), reason="no NVIDIA GPU and driver here (run scripts/gpu-check.sh --only=nvvideo on the GPU machine)")]


@pytest.fixture(scope="module")
def streams() -> dict[str, bytes]:
  pytest.importorskip("av")
  from plugrt_testing.video import nvdec_streams
  return nvdec_streams()


def test_the_engine_opens():
  """The video channel on the lowest NVDEC with the video decoder object runs its first commands (SET_OBJECT, a semaphore release)."""
  dev = Device["NV"]
  st = dev.info.state
  assert st.iface.classes.video, f"no video decoder class: {st.iface.description}"
  st.video_ring()
  assert st.completed() == st.value


def _compare(stream: bytes, dtype, normalize: bool, tol: float) -> int:
  hw = decode_annexb_to_tensors_auto(stream, dtype=dtype, normalize=normalize, decoder="NV_NVDEC", device="NV")
  sw = software_decode(stream, dtype=dtype, normalize=normalize, device="NV")
  assert len(hw) == len(sw) == hevc.scan(stream).pictures
  worst = []
  for (ts_h, th), (ts_s, ts) in zip(hw, sw):
    assert ts_h == ts_s and th.shape == ts.shape and str(th.device).startswith("NV")
    worst.append(np.abs(th.numpy().astype(np.float64) - ts.numpy().astype(np.float64)).max())
  assert max(worst) <= tol, f"per-frame largest differences between the engine and software: {worst}"
  return len(hw)


def test_first_picture_matches_software(streams):
  """The first (intra) picture alone: says whether the engine, the surface layout and the detile copy work before
  references and ordering come in."""
  stream = streams["8bit-bt709"]
  with decode_annexb_iter(stream, dtype=dtypes.uint8, normalize=False, decoder="NV_NVDEC", device="NV") as it:
    _, t = next(it)
  ref = software_decode(stream, dtype=dtypes.uint8, normalize=False, device="NV")[0][1]
  diff = np.abs(t.numpy().astype(int) - ref.numpy().astype(int))
  assert diff.max() <= 1, f"first picture: {int((diff > 1).sum())} of {diff.size} values differ by more than 1 (largest {diff.max()})"


@pytest.mark.parametrize("name", ["8bit-bt709", "8bit-cropped-bt601-full", "10bit-bt2020", "resolution-change"])
def test_every_frame_matches_software(streams, name):
  assert _compare(streams[name], dtypes.uint8, False, 1) > 0
  _compare(streams[name], dtypes.float16, True, 2 ** -9)
  _compare(streams[name], dtypes.float32, True, 1e-6)


def test_a_picture_below_the_minimum_is_a_typed_refusal(streams):
  with pytest.raises(VideoDecoderUnavailable, match="144x144"):
    decode_annexb_to_tensors_auto(streams["too-small"], dtype=dtypes.uint8, normalize=False, decoder="NV_NVDEC", device="NV")


def test_open_close_cycles_leave_no_memory(streams):
  dev = Device["NV"]
  iface = dev.info.state.iface
  stream = streams["8bit-bt709"]
  list(decode_annexb_iter(stream, dtype=dtypes.uint8, normalize=False, decoder="NV_NVDEC", device="NV"))
  import gc
  gc.collect()
  before = len(iface.mems)
  for i in range(50):
    with decode_annexb_iter(stream, dtype=dtypes.uint8, normalize=False, decoder="NV_NVDEC", device="NV") as it:
      for _ in range(i % 4): next(it)
  gc.collect()
  dev.info.state.synchronize()
  assert len(iface.mems) == before
