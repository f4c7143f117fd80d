"""plugrt_cuda.cuvid's control flow without a GPU: a fake libnvcuvid (PyAV decodes underneath, surfaces are host
memory in NVDEC's NV12/P016 layout with a padded pitch) and a fake CUDA state drive the real NVDECDecoder on the CPU
device: the parser's callbacks from the worker thread, the bounded queue, mapping limits, release and unmap after
the kernel's event, reconfiguration at a resolution change, decode-status errors with their byte offset, and close()
at any point leaving nothing mapped, no parser and no decoder. What the fake cannot show (the driver's own
behaviour) is left to test_cuvid.py on the GPU."""
from __future__ import annotations

import ctypes
import threading
import time
from typing import Any

import numpy as np
import pytest

from plugrt import Device, dtypes
from plugrt.errors import Reason, VideoDecoderUnavailable, VideoStreamError
from plugrt.video import hevc
from plugrt.video.convert import convert
from plugrt_cuda import cuvid

av = pytest.importorskip("av")
from plugrt.testing.video import make_hevc, pyav_planes, reference_rgb  # noqa: E402


class FakeCuda:
  """The few libcuda calls the decoder makes (events), all complete at once unless `slow`."""
  def __init__(self) -> None: self.events, self.slow = 0, False
  def cuEventCreate(self, p: Any, flags: int) -> int:
    self.events += 1
    p._obj.value = 0x1000 + self.events
    return 0
  def cuEventRecord(self, ev: Any, stream: Any) -> int: return 0
  def cuEventQuery(self, ev: Any) -> int: return cuvid.CUDA_ERROR_NOT_READY if self.slow else 0
  def cuEventSynchronize(self, ev: Any) -> int: return 0
  def cuEventDestroy_v2(self, ev: Any) -> int:
    self.events -= 1
    return 0
  # own_stream: a decoder's map stream, and the context stream's waits on its events (recorded in `waits`)
  def cuStreamCreate(self, p: Any, flags: int) -> int:
    assert flags == 1  # non-blocking: the legacy default stream must not serialize with it
    self.streams = getattr(self, "streams", 0) + 1
    p._obj.value = 0x5000
    return 0
  def cuStreamWaitEvent(self, stream: Any, ev: Any, flags: int) -> int:
    self.waits = getattr(self, "waits", 0) + 1
    return 0
  def cuStreamSynchronize(self, stream: Any) -> int: return 0
  def cuStreamDestroy_v2(self, stream: Any) -> int:
    self.streams -= 1
    return 0


class FakeState:
  name, stream = "fake GPU", ctypes.c_void_p(0)
  def __init__(self) -> None: self.lib = FakeCuda()
  def make_current(self) -> None: pass


class FakeCuvid:
  """libnvcuvid's calls in Python. Parsing decodes each packet with PyAV; a picture's surface is host memory."""

  def __init__(self, max_width: int = 8192, bad_picture: int | None = None):
    self.max_width, self.bad_picture = max_width, bad_picture
    self.parsers = self.decoders = 0
    self.mapped: dict[int, np.ndarray] = {}
    self.max_mapped = 0
    self.created: list[cuvid.CUVIDDECODECREATEINFO] = []
    self.reconfigured: list[tuple[int, int]] = []
    self.pictures: dict[int, tuple[Any, int]] = {}
    self.lock = threading.Lock()

  def cuvidGetDecoderCaps(self, p: Any) -> int:
    caps = p._obj
    caps.bIsSupported, caps.nMaxWidth, caps.nMaxHeight, caps.nMaxMBCount, caps.nMinWidth, caps.nMinHeight = 1, self.max_width, 4096, 1 << 20, 48, 16
    return 0

  def cuvidCreateVideoParser(self, p: Any, params: Any) -> int:
    self.params = params._obj
    self.ctx, self.fmt, self.index = av.CodecContext.create("hevc", "r"), None, 0
    self.parsers += 1
    p._obj.value = 0xBEEF
    return 0

  def cuvidParseVideoData(self, parser: Any, pkt: Any) -> int:
    pk = pkt._obj
    data = ctypes.string_at(pk.payload, pk.payload_size) if pk.payload_size else None
    frames = list(self.ctx.decode(av.Packet(data) if data else None))
    params = self.params
    if data: params.pfnDecodePicture(None, ctypes.c_void_p(1))
    for f in frames:
      bits = 8 if f.format.name == "yuv420p" else 10
      key = (f.width, f.height, bits)
      if key != self.fmt:
        fmt = cuvid.CUVIDEOFORMAT(codec=cuvid.cudaVideoCodec_HEVC, bit_depth_luma_minus8=bits - 8, bit_depth_chroma_minus8=bits - 8,
                                  min_num_decode_surfaces=5, coded_width=-(-f.width // 16) * 16, coded_height=-(-f.height // 16) * 16,
                                  chroma_format=1)
        fmt.display_area = cuvid.Rect32(0, 0, f.width, f.height)
        fmt.video_signal_description.video_full_range_flag = int(f.color_range == 2)
        fmt.video_signal_description.matrix_coefficients = int(f.colorspace)
        if params.pfnSequenceCallback(None, ctypes.pointer(fmt)) == 0: return 999
        self.fmt = key
      idx = self.index % 20
      self.pictures[idx] = (f, pk.timestamp)
      self.index += 1
      disp = cuvid.CUVIDPARSERDISPINFO(picture_index=idx, progressive_frame=1, timestamp=pk.timestamp)
      if params.pfnDisplayPicture(None, ctypes.pointer(disp)) == 0: return 999
    return 0

  def cuvidDestroyVideoParser(self, p: Any) -> int:
    self.parsers -= 1
    return 0

  def cuvidCreateDecoder(self, p: Any, ci: Any) -> int:
    self.created.append(ci._obj)
    self.decoders += 1
    p._obj.value = 0xDEC
    return 0

  def cuvidReconfigureDecoder(self, dec: Any, rc: Any) -> int:
    assert not self.mapped, "reconfigured while surfaces are mapped"
    self.reconfigured.append((rc._obj.ulWidth, rc._obj.ulHeight))
    return 0

  def cuvidDestroyDecoder(self, dec: Any) -> int:
    assert not self.mapped, "decoder destroyed while surfaces are mapped"
    self.decoders -= 1
    return 0

  def cuvidDecodePicture(self, dec: Any, pic: Any) -> int: return 0

  def cuvidGetDecodeStatus(self, dec: Any, idx: int, st: Any) -> int:
    st._obj.decodeStatus = cuvid.cuvidDecodeStatus_Error if self.bad_picture is not None and self.index - 1 == self.bad_picture else 2
    return 0

  def cuvidMapVideoFrame64(self, dec: Any, idx: int, ptr: Any, pitch: Any, proc: Any) -> int:
    f, _ = self.pictures[idx]
    limit = self.created[0].ulNumOutputSurfaces
    if len(self.mapped) >= limit: return 999  # CUDA_ERROR_... : more mapped than the decoder was created for
    bits = 8 if f.format.name == "yuv420p" else 10
    y, cb, cr = (np.frombuffer(p, np.uint8 if bits == 8 else np.uint16).reshape(-1, p.line_size // (1 if bits == 8 else 2))
                 for p in f.planes)
    y, cb, cr = y[:f.height, :f.width], cb[:f.height // 2, :f.width // 2], cr[:f.height // 2, :f.width // 2]
    h = f.height + (f.height & 1)
    row = -(-f.width // 64) * 64 + 64  # a padded pitch, in elements
    surf = np.zeros(row * h + row * h // 2, np.uint8 if bits == 8 else np.uint16)
    shift = 0 if bits == 8 else 6  # P016: the sample in the high bits
    surf[:row * h].reshape(h, row)[:f.height, :f.width] = y.astype(surf.dtype) << shift
    uv = surf[row * h:].reshape(h // 2, row)
    uv[:, 0:f.width:2], uv[:, 1:f.width:2] = cb.astype(surf.dtype) << shift, cr.astype(surf.dtype) << shift
    with self.lock:
      self.mapped[surf.ctypes.data] = surf
      self.max_mapped = max(self.max_mapped, len(self.mapped))
    ptr._obj.value, pitch._obj.value = surf.ctypes.data, row * surf.itemsize
    return 0

  def cuvidUnmapVideoFrame64(self, dec: Any, ptr: Any) -> int:
    with self.lock:
      if self.mapped.pop(ptr.value, None) is None: return 999
    return 0


def _run(stream: bytes, lib: FakeCuvid, state: FakeState | None = None, depth: int = 3, consume: Any = None, **options: Any) -> list[Any]:
  dev = Device["CPU"]
  dec = cuvid.NVDECDecoder(dev, stream, hevc.scan(stream), {"queue_depth": depth, **options}, state=state or FakeState(), lib=lib)
  out = []
  try:
    for frame in dec.frames():
      out.append((frame.timestamp, convert(frame.surface, dtypes.uint8, False, None).numpy()))
      frame.release()
      if consume: consume(len(out))
  finally: dec.close()
  return out


def _check_against_pyav(stream: bytes, got: list[Any]) -> None:
  ref = pyav_planes(stream)
  assert [t for t, _ in got] == list(range(len(ref)))
  for (_t, img), (y, cb, cr, bits, full, matrix) in zip(got, ref):
    space = {1: "bt709", 5: "bt601", 6: "bt601", 9: "bt2020"}.get(matrix, "bt601" if y.shape[0] < 720 else "bt709")
    assert np.abs(img.astype(int) - reference_rgb(y, cb, cr, bits, full, space, False, uint8=True)).max() <= 1


@pytest.mark.parametrize("bits, tag", [(8, "bt709"), (10, "bt2020")])
def test_frames_through_the_real_decoder_logic(bits: int, tag: str) -> None:
  stream = make_hevc(96, 64, frames=9, bit_depth=bits, tag=tag)
  lib, state = FakeCuvid(), FakeState()
  got = _run(stream, lib, state)
  _check_against_pyav(stream, got)
  ci = lib.created[0]
  assert ci.OutputFormat == (cuvid.cudaVideoSurfaceFormat_P016 if bits > 8 else cuvid.cudaVideoSurfaceFormat_NV12)
  assert ci.bitDepthMinus8 == bits - 8 and ci.ulNumOutputSurfaces == 3 + 4 and lib.max_mapped <= ci.ulNumOutputSurfaces
  assert (lib.parsers, lib.decoders, len(lib.mapped), state.lib.events) == (0, 0, 0, 0)


def test_own_stream_orders_each_frame_after_its_map() -> None:
  """own_stream: every map is followed by one wait of the context's stream on that map's event, and close() gives
  the stream and every event back."""
  stream = make_hevc(96, 64, frames=9, tag="bt709")
  lib, state = FakeCuvid(), FakeState()
  got = _run(stream, lib, state, own_stream=True)
  _check_against_pyav(stream, got)
  assert state.lib.waits == 9 and state.lib.streams == 0 and state.lib.events == 0


def test_resolution_change_reconfigures() -> None:
  stream = make_hevc(96, 64, frames=4, tag="bt709") + make_hevc(128, 96, frames=5, tag="bt709", seed=2)
  lib = FakeCuvid()
  got = _run(stream, lib)
  _check_against_pyav(stream, got)
  assert len(lib.created) == 1 and lib.reconfigured == [(128, 96)]
  assert (lib.created[0].ulMaxWidth, lib.created[0].ulMaxHeight) == (128, 96)  # sized at open for the largest picture


def test_a_slow_consumer_bounds_the_queue_and_slow_kernels_bound_the_mappings() -> None:
  stream = make_hevc(96, 64, frames=12)
  lib, state = FakeCuvid(), FakeState()
  state.lib.slow = True  # kernels never finish by themselves: every unmap waits for its event
  got = _run(stream, lib, state, depth=2, consume=lambda n: time.sleep(0.02))
  assert len(got) == 12 and lib.max_mapped <= 2 + 4 and not lib.mapped


def test_early_close_and_exceptions_leave_nothing() -> None:
  stream = make_hevc(96, 64, frames=10)
  for stop_after in (0, 1, 5):
    lib, state = FakeCuvid(), FakeState()
    dec = cuvid.NVDECDecoder(Device["CPU"], stream, hevc.scan(stream), {"queue_depth": 2}, state=state, lib=lib)
    it = dec.frames()
    for _ in range(stop_after): next(it).release()
    if stop_after == 5:
      with pytest.raises(ZeroDivisionError):
        for _f in it: _ = 1 / 0
    dec.close()
    assert (lib.parsers, lib.decoders, len(lib.mapped), state.lib.events) == (0, 0, 0, 0), stop_after
    assert not dec.worker.is_alive()


def test_decode_status_error_names_the_access_unit() -> None:
  stream = make_hevc(96, 64, frames=6)
  lib = FakeCuvid(bad_picture=2)
  with pytest.raises(VideoStreamError, match="NVDEC found an error") as e: _run(stream, lib)
  aus = [au[0].offset for au in hevc.access_units(hevc.split_nal_units(stream))]
  assert e.value.offset in aus and (lib.parsers, lib.decoders, len(lib.mapped)) == (0, 0, 0)


def test_capabilities_refuse_before_anything_is_created() -> None:
  stream = make_hevc(128, 64, frames=2)
  lib = FakeCuvid(max_width=96)
  with pytest.raises(VideoDecoderUnavailable, match="cannot decode HEVC Main 4:2:0 8-bit 128x64") as e:
    cuvid.NVDECDecoder(Device["CPU"], stream, hevc.scan(stream), {}, state=FakeState(), lib=lib)
  assert e.value.reason is Reason.NO_DEVICE and lib.parsers == 0
