"""plugrt_cuda.cuvid's control flow without a GPU: a fake libnvcuvid (PyAV decodes underneath, surfaces are host
memory in NVDEC's NV12/P016 layout with a padded pitch) and a fake CUDA state drive the real NVDECDecoder on the CPU
device: the parser's callbacks from the worker thread, the bounded queue, mapping limits, release and unmap after
the kernel's event, reconfiguration at a resolution change, decode-status errors with their byte offset, and close()
at any point leaving nothing mapped, no parser and no decoder. What the fake cannot show (the driver's own
behaviour) is left to test_cuvid.py on the GPU."""
from __future__ import annotations

import ast
import ctypes
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from plugrt import Device, dtypes
from plugrt.context import DeviceInfo
from plugrt.errors import OutOfMemoryError, Reason, VideoDecoderUnavailable, VideoStreamError
from plugrt.video import hevc
from plugrt.video.convert import VideoArgumentError, convert
from plugrt_cuda import cuvid, driver
from plugrt_cuda import device as cuda_device

av = pytest.importorskip("av")
from plugrt_testing.video import make_hevc, pyav_planes, reference_rgb  # noqa: E402


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
  """libnvcuvid's calls in Python. Parsing decodes each packet with PyAV; a picture's surface is host memory.

  Like the real parser, each picture is decoded into a picture index that is free again once its display callback
  returned. `reuse` picks the next one: "lowest" (the lowest index not held, i.e. reused as early as a parser may:
  the adversarial case) or "cycle" (the next free one after the last, through as many surfaces as the sequence
  callback asked for: the parser "cycles through" its decode surfaces, nvcuvid.h says).
  `decode_s` models the engine: a picture is finished `decode_s` after the engine is free for it, and a map blocks
  until then. The fake counts pictures submitted while a map was blocked (`submitted_during_maps`), and decodes into
  an index whose shown picture was not mapped yet (`reused_unmapped`: the rule the decoder must keep)."""

  def __init__(self, max_width: int = 8192, bad_picture: int | None = None, decode_s: float = 0.0, reuse: str = "lowest"):
    self.max_width, self.bad_picture, self.decode_s, self.reuse = max_width, bad_picture, decode_s, reuse
    self.parsers = self.decoders = 0
    self.mapped: dict[int, np.ndarray] = {}
    self.max_mapped = 0
    self.created: list[cuvid.CUVIDDECODECREATEINFO] = []
    self.reconfigured: list[tuple[int, int]] = []
    self.live: set[int] = set()  # decoder handles made and not destroyed
    self.destroyed = self.out_of_memory = 0
    self.pictures: dict[int, tuple[Any, int, int]] = {}  # picture index -> (frame, timestamp, display number)
    self.lock = threading.Lock()
    self.caps_calls = self.submitted = self.submitted_during_maps = self.blocked_maps = self.reused_unmapped = self.status_calls = 0
    self.ready: dict[int, float] = {}
    self.engine_free = 0.0
    self.shown_unmapped: set[int] = set()

  def cuvidGetDecoderCaps(self, p: Any) -> int:
    self.caps_calls += 1
    caps = p._obj
    caps.bIsSupported, caps.nMaxWidth, caps.nMaxHeight, caps.nMaxMBCount, caps.nMinWidth, caps.nMinHeight = 1, self.max_width, 4096, 1 << 20, 48, 16
    return 0

  def cuvidCreateVideoParser(self, p: Any, params: Any) -> int:
    self.params = params._obj
    self.ctx, self.fmt, self.packets, self.displayed = av.CodecContext.create("hevc", "r"), None, 0, 0
    self.held: set[int] = set()
    self.shown_unmapped, self.ready = set(), {}  # a new parser and decoder: nothing of the last one's pictures
    self.pool, self.last = 20, -1  # decode surfaces (until the sequence callback says), the index given last
    self.index_of: dict[int, tuple[int, int]] = {}  # packet number -> (picture index, timestamp)
    self.pic = (ctypes.c_int * 64)()  # CUVIDPICPARAMS: CurrPicIdx at byte 8
    self.parsers += 1
    p._obj.value = 0xBEEF
    return 0

  def cuvidParseVideoData(self, parser: Any, pkt: Any) -> int:
    pk = pkt._obj
    data = ctypes.string_at(pk.payload, pk.payload_size) if pk.payload_size else None
    params = self.params
    packet = None
    if data:
      packet = av.Packet(data)
      packet.pts = self.packets
      free = [i for i in range(self.pool) if i not in self.held]
      idx = min(free) if self.reuse == "lowest" else min(free, key=lambda i: (i - self.last - 1) % self.pool)
      self.last = idx
      self.held.add(idx)
      self.index_of[self.packets] = (idx, pk.timestamp)
      self.packets += 1
      self.pic[2] = idx
      if params.pfnDecodePicture(None, ctypes.addressof(self.pic)) == 0: return 999
    for f in self.ctx.decode(packet):
      bits = 8 if f.format.name == "yuv420p" else 10
      key = (f.width, f.height, bits)
      if key != self.fmt:
        fmt = cuvid.CUVIDEOFORMAT(codec=cuvid.cudaVideoCodec_HEVC, bit_depth_luma_minus8=bits - 8, bit_depth_chroma_minus8=bits - 8,
                                  min_num_decode_surfaces=5, coded_width=-(-f.width // 16) * 16, coded_height=-(-f.height // 16) * 16,
                                  chroma_format=1)
        fmt.display_area = cuvid.Rect32(0, 0, f.width, f.height)
        fmt.video_signal_description.video_full_range_flag = int(f.color_range == 2)
        fmt.video_signal_description.matrix_coefficients = int(f.colorspace)
        if (surfaces := params.pfnSequenceCallback(None, ctypes.pointer(fmt))) == 0: return 999
        self.fmt, self.pool = key, max(surfaces, 1 + max(self.held, default=0))
      idx, ts = self.index_of.pop(f.pts)
      self.pictures[idx] = (f, ts, self.displayed)
      self.displayed += 1
      self.shown_unmapped.add(idx)
      disp = cuvid.CUVIDPARSERDISPINFO(picture_index=idx, progressive_frame=1, timestamp=ts)
      r = params.pfnDisplayPicture(None, ctypes.pointer(disp))
      self.held.discard(idx)  # the parser may decode into this index again
      if r == 0: return 999
    return 0

  def cuvidDestroyVideoParser(self, p: Any) -> int:
    self.parsers -= 1
    return 0

  def cuvidCreateDecoder(self, p: Any, ci: Any) -> int:
    if self.out_of_memory:  # the GPU is full until a decoder is destroyed
      self.out_of_memory -= 1
      return driver.CUDA_ERROR_OUT_OF_MEMORY
    self.created.append(ci._obj)
    self.decoders += 1
    p._obj.value = handle = 0xDEC0 + len(self.created)
    self.live.add(handle)
    return 0

  def cuvidReconfigureDecoder(self, dec: Any, rc: Any) -> int:
    assert not self.mapped, "reconfigured while surfaces are mapped"
    self.reconfigured.append((rc._obj.ulWidth, rc._obj.ulHeight))
    return 0

  def cuvidDestroyDecoder(self, dec: Any) -> int:
    assert not self.mapped, "decoder destroyed while surfaces are mapped"
    self.live.remove(dec.value)
    self.decoders -= 1
    self.destroyed += 1
    return 0

  def cuvidDecodePicture(self, dec: Any, pic: Any) -> int:
    idx = ctypes.c_int.from_address(pic + 8).value
    if idx in self.shown_unmapped: self.reused_unmapped += 1  # the picture still waiting to be mapped is overwritten
    now = time.perf_counter()
    self.engine_free = max(now, self.engine_free) + self.decode_s
    self.ready[idx] = self.engine_free
    self.submitted += 1
    return 0

  def cuvidGetDecodeStatus(self, dec: Any, idx: int, st: Any) -> int:
    if self.ready.get(idx, 0.0) > time.perf_counter(): st._obj.decodeStatus = cuvid.cuvidDecodeStatus_InProgress
    elif self.bad_picture is not None and self.pictures[idx][2] == self.bad_picture: st._obj.decodeStatus = cuvid.cuvidDecodeStatus_Error
    else: st._obj.decodeStatus = 2  # cuvidDecodeStatus_Success
    self.status_calls += 1
    return 0

  def cuvidMapVideoFrame64(self, dec: Any, idx: int, ptr: Any, pitch: Any, proc: Any) -> int:
    if (wait := self.ready.get(idx, 0.0) - time.perf_counter()) > 0:  # the engine has not finished the picture
      before = self.submitted
      time.sleep(wait)
      self.submitted_during_maps += self.submitted - before
      self.blocked_maps += 1
    self.shown_unmapped.discard(idx)
    f, _, _ = self.pictures[idx]
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


MODES = cuvid.MAP_ON_CHOICES  # where cuvidMapVideoFrame runs: the parser's thread (default), a mapper thread, the consumer's


def _run(stream: bytes, lib: FakeCuvid, state: FakeState | None = None, depth: int = 3, consume: Any = None, **options: Any) -> list[Any]:
  return _run_dec(stream, lib, state, depth, consume, **options)[0]


def _run_dec(stream: bytes, lib: FakeCuvid, state: FakeState | None = None, depth: int = 3, consume: Any = None,
             **options: Any) -> tuple[list[Any], Any]:
  dev = Device["CPU"]
  dec = cuvid.NVDECDecoder(dev, stream, hevc.scan(stream), {"queue_depth": depth, **options}, state=state or FakeState(), lib=lib)
  out = []
  try:
    for frame in dec.frames():
      out.append((frame.timestamp, convert(frame.surface, dtypes.uint8, False, None).numpy()))
      frame.release()
      if consume: consume(len(out), dec)
  finally: dec.close()
  return out, dec


def _check_against_pyav(stream: bytes, got: list[Any]) -> None:
  ref = pyav_planes(stream)
  assert [t for t, _ in got] == list(range(len(ref)))
  for (_t, img), (y, cb, cr, bits, full, matrix) in zip(got, ref):
    space = {1: "bt709", 5: "bt601", 6: "bt601", 9: "bt2020"}.get(matrix, "bt601" if y.shape[0] < 720 else "bt709")
    assert np.abs(img.astype(int) - reference_rgb(y, cb, cr, bits, full, space, False, uint8=True)).max() <= 1


def _nothing_left(lib: FakeCuvid, state: FakeState) -> None:
  """Nothing of the decoder is left once the decoders kept for reuse are destroyed too."""
  cuvid.clear_decoder_cache(lib=lib)
  assert (lib.parsers, lib.decoders, len(lib.mapped), state.lib.events) == (0, 0, 0, 0)
  assert lib.reused_unmapped == 0, "a picture index was decoded into while its shown picture still waited to be mapped"


@pytest.mark.parametrize("map_on", MODES)
@pytest.mark.parametrize("bits, tag", [(8, "bt709"), (10, "bt2020")])
def test_frames_through_the_real_decoder_logic(bits: int, tag: str, map_on: str) -> None:
  stream = make_hevc(96, 64, frames=9, bit_depth=bits, tag=tag)
  lib, state = FakeCuvid(), FakeState()
  got = _run(stream, lib, state, map_on=map_on)
  _check_against_pyav(stream, got)
  ci = lib.created[0]
  assert ci.OutputFormat == (cuvid.cudaVideoSurfaceFormat_P016 if bits > 8 else cuvid.cudaVideoSurfaceFormat_NV12)
  assert ci.bitDepthMinus8 == bits - 8 and ci.ulNumOutputSurfaces == 3 + 4 and lib.max_mapped <= ci.ulNumOutputSurfaces
  _nothing_left(lib, state)


@pytest.mark.parametrize("map_on", MODES)
def test_own_stream_orders_each_frame_after_its_map(map_on: str) -> None:
  """own_stream: every map is followed by one wait of the context's stream on that map's event, and close() gives
  the stream and every event back."""
  stream = make_hevc(96, 64, frames=9, tag="bt709")
  lib, state = FakeCuvid(), FakeState()
  got = _run(stream, lib, state, own_stream=True, map_on=map_on)
  _check_against_pyav(stream, got)
  assert state.lib.waits == 9 and state.lib.streams == 0 and state.lib.events == 0


@pytest.mark.parametrize("map_on", MODES)
def test_resolution_change_reconfigures(map_on: str) -> None:
  stream = make_hevc(96, 64, frames=4, tag="bt709") + make_hevc(128, 96, frames=5, tag="bt709", seed=2)
  lib = FakeCuvid(decode_s=0.002)  # maps lag behind the parser: the reconfiguration must wait for every one
  got = _run(stream, lib, map_on=map_on)
  _check_against_pyav(stream, got)
  assert len(lib.created) == 1 and lib.reconfigured == [(128, 96)]
  assert (lib.created[0].ulMaxWidth, lib.created[0].ulMaxHeight) == (128, 96)  # sized at open for the largest picture
  assert lib.reused_unmapped == 0


@pytest.mark.parametrize("map_on", MODES)
def test_a_slow_consumer_bounds_the_queue_and_slow_kernels_bound_the_mappings(map_on: str) -> None:
  stream = make_hevc(96, 64, frames=16)
  lib, state = FakeCuvid(), FakeState()
  state.lib.slow = True  # kernels never finish by themselves: every unmap waits for its event
  ahead: list[int] = []

  def slow(n: int, dec: Any) -> None:
    time.sleep(0.02)
    ahead.append(lib.submitted - n)  # pictures the parser submitted beyond those the consumer took
    assert dec.waiting.items.qsize() <= 2 + 1 and dec.queue.items.qsize() <= 2  # pictures (and the end)
  got = _run(stream, lib, state, depth=2, consume=slow, map_on=map_on)
  assert len(got) == 16 and lib.max_mapped <= 2 + 4 and not lib.mapped
  # decoded ahead at most: the queue, the pictures noted for the mapper, the one being mapped, and the pictures the
  # parser holds for reordering (a B-pyramid: 3 here)
  assert max(ahead) <= 2 + (2 + 1 if map_on != "parser" else 0) + 3, ahead
  _nothing_left(lib, state)


@pytest.mark.parametrize("map_on", ["thread", "consumer"])
def test_the_parser_keeps_submitting_while_a_map_waits(map_on: str) -> None:
  """Maps off the parser's thread: while a map waits for NVDEC to finish its picture, the parser submits the next
  pictures (on the parser's thread, nothing is submitted while it waits). Every frame is still right, and no picture
  index is decoded into while its picture waits to be mapped."""
  stream = make_hevc(96, 64, frames=16)
  counts = {}
  for mode, reuse in (("parser", "cycle"), (map_on, "cycle"), (map_on, "lowest")):
    lib, state = FakeCuvid(decode_s=0.005, reuse=reuse), FakeState()
    got, dec = _run_dec(stream, lib, state, depth=4, map_on=mode)
    _check_against_pyav(stream, got)
    _nothing_left(lib, state)
    counts[mode, reuse] = (lib.blocked_maps, lib.submitted_during_maps, dec.map_waits)
  parser, off, early = counts["parser", "cycle"], counts[map_on, "cycle"], counts[map_on, "lowest"]
  assert parser[0] > 0 and parser[1] == 0, counts  # maps blocked, and the parser with them
  assert off[0] > 0 and off[1] > 0, counts  # maps blocked, and the parser went on submitting
  assert early[2] > 0, counts  # an index reused at once: the parser waited for its map (and nothing was overwritten)


def test_the_fake_sees_an_index_decoded_into_before_its_map() -> None:
  """The check above can fail: a decoder that does not wait for a shown picture's map before reusing its index is
  caught by the fake (and its frames come out wrong)."""
  class Careless(cuvid.NVDECDecoder):
    def _on_decode_after_map(self, user: Any, pic: Any) -> int: return self._on_decode(user, pic)
  stream = make_hevc(96, 64, frames=16)
  lib, state = FakeCuvid(decode_s=0.005), FakeState()
  dec = Careless(Device["CPU"], stream, hevc.scan(stream), {"queue_depth": 4, "map_on": "thread"}, state=state, lib=lib)
  try: n = sum(1 for f in dec.frames() if f.release() is None)
  finally: dec.close()
  assert n == 16 and lib.reused_unmapped > 0


@pytest.mark.parametrize("map_on", MODES)
def test_early_close_and_exceptions_leave_nothing(map_on: str) -> None:
  stream = make_hevc(96, 64, frames=10)
  for stop_after in (0, 1, 5):
    lib, state = FakeCuvid(decode_s=0.001), FakeState()
    dec = cuvid.NVDECDecoder(Device["CPU"], stream, hevc.scan(stream), {"queue_depth": 2, "map_on": map_on}, state=state, lib=lib)
    it = dec.frames()
    for _ in range(stop_after): next(it).release()
    if stop_after == 5:
      with pytest.raises(ZeroDivisionError):
        for _f in it: _ = 1 / 0
    dec.close()
    _nothing_left(lib, state)
    assert not dec.worker.is_alive() and (dec.mapper is None or not dec.mapper.is_alive())
    assert cuvid.live_objects()["decoders"] == 0


@pytest.mark.parametrize("map_on", MODES)
def test_decode_status_error_names_the_access_unit(map_on: str) -> None:
  stream = make_hevc(96, 64, frames=6)
  lib, state = FakeCuvid(bad_picture=2), FakeState()
  with pytest.raises(VideoStreamError, match="NVDEC found an error") as e: _run(stream, lib, state, map_on=map_on)
  aus = [au[0].offset for au in hevc.access_units(hevc.split_nal_units(stream))]
  assert e.value.offset in aus
  _nothing_left(lib, state)


def test_capabilities_refuse_before_anything_is_created() -> None:
  stream = make_hevc(128, 64, frames=2)
  lib = FakeCuvid(max_width=96)
  with pytest.raises(VideoDecoderUnavailable, match="cannot decode HEVC Main 4:2:0 8-bit 128x64") as e:
    cuvid.NVDECDecoder(Device["CPU"], stream, hevc.scan(stream), {}, state=FakeState(), lib=lib)
  assert e.value.reason is Reason.NO_DEVICE and lib.parsers == 0


def test_capabilities_are_asked_once_per_context_and_format() -> None:
  """cuvidGetDecoderCaps runs once per (context, codec, chroma, bit depth) for the process: a second decoder of a
  known format asks nothing; another depth or another context asks once more."""
  s8, s10 = make_hevc(96, 64, frames=2), make_hevc(96, 64, frames=2, bit_depth=10)
  lib = FakeCuvid()
  a, b = FakeState(), FakeState()
  a.ctx, b.ctx = ctypes.c_void_p(0xC0), ctypes.c_void_p(0xC1)
  for stream, state, calls in ((s8, a, 1), (s8, a, 1), (s10, a, 2), (s10, a, 2), (s8, b, 3), (s8, a, 3)):
    assert len(_run(stream, lib, state)) == 2
    assert lib.caps_calls == calls
  assert cuvid.decoder_caps(8, a, lib).nMaxWidth == 8192 and lib.caps_calls == 3


def test_map_on_must_be_known() -> None:
  stream = make_hevc(96, 64, frames=2)
  lib = FakeCuvid()
  with pytest.raises(VideoArgumentError, match="map_on must be one of 'parser', 'thread', 'consumer', not 'gpu'"):
    cuvid.NVDECDecoder(Device["CPU"], stream, hevc.scan(stream), {"map_on": "gpu"}, state=FakeState(), lib=lib)
  assert lib.parsers == 0 and lib.caps_calls == 0


def test_open_close_cycles_leave_no_thread_or_object() -> None:
  """Many short lives in every mode (an early close, an exception in the loop, to the end): no worker or mapper
  thread outlives its decoder, live_objects() comes back (with the one decoder kept for reuse), and the
  capabilities are asked once and the decoder made once in all."""
  stream = make_hevc(96, 64, frames=4)
  info = hevc.scan(stream)
  lib, state = FakeCuvid(), FakeState()
  threads, objects = threading.active_count(), cuvid.live_objects()
  for i in range(45):
    dec = cuvid.NVDECDecoder(Device["CPU"], stream, info, {"queue_depth": 2, "map_on": MODES[i % 3]}, state=state, lib=lib)
    it = dec.frames()
    try:
      if i % 5 == 0: next(it).release()
      elif i % 5 == 1:
        with pytest.raises(ZeroDivisionError):
          for _f in it: _ = 1 / 0
      else:
        for f in it: f.release()
    finally: dec.close()
    assert cuvid.live_objects() == {**objects, "kept": objects["kept"] + 1}, i
  assert threading.active_count() == threads and lib.caps_calls == 1 and len(lib.created) == 1
  _nothing_left(lib, state)


def test_the_worker_feeds_the_scans_access_units_without_splitting_again(monkeypatch) -> None:
  """The stream is split once, by the scan, which records each access unit's offset; the feeding thread sends those
  (a second split per stream held the GIL at every stream's start). The parser reads the caller's bytes in place."""
  stream = make_hevc(96, 64, frames=6)
  info = hevc.scan(stream)
  monkeypatch.setattr(hevc, "split_nal_units", lambda *a: pytest.fail("the stream was split again"))
  lib = FakeCuvid()
  dec = cuvid.NVDECDecoder(Device["CPU"], stream, info, {"queue_depth": 3}, state=FakeState(), lib=lib)
  got = []
  try:
    for frame in dec.frames():
      got.append((frame.timestamp, convert(frame.surface, dtypes.uint8, False, None).numpy()))
      frame.release()
  finally: dec.close()
  monkeypatch.undo()
  assert len(got) == 6 and dec.stream is stream
  _check_against_pyav(stream, got)


def test_close_wakes_a_parser_waiting_for_the_consumer(monkeypatch) -> None:
  """The consumer stops after one frame while the parser waits for a free slot: close() wakes it instead of leaving
  it to its next poll (a poll of 10 s here: close must return long before)."""
  monkeypatch.setattr(cuvid, "PUT_POLL_S", 10.0)
  stream = make_hevc(96, 64, frames=16)
  lib, state = FakeCuvid(), FakeState()
  dec = cuvid.NVDECDecoder(Device["CPU"], stream, hevc.scan(stream), {"queue_depth": 1}, state=state, lib=lib)
  it = dec.frames()
  next(it).release()
  time.sleep(0.2)  # the parser fills the queue and waits in put
  t = time.monotonic()
  dec.close()
  assert time.monotonic() - t < 5 and not dec.worker.is_alive()
  _nothing_left(lib, state)


@pytest.mark.parametrize("map_on", MODES)
def test_status_polling_maps_only_finished_pictures(map_on: str) -> None:
  """status_poll_us: the decoder polls cuvidGetDecodeStatus until a picture is finished, so no map waits in the driver."""
  stream = make_hevc(96, 64, frames=12)
  lib, state = FakeCuvid(decode_s=0.004, reuse="cycle"), FakeState()
  got = _run(stream, lib, state, depth=4, map_on=map_on, status_poll_us=200)
  _check_against_pyav(stream, got)
  _nothing_left(lib, state)
  assert lib.blocked_maps == 0 and lib.status_calls > 2 * 12  # one after each map, and polls before


def _decode_all(stream: bytes, lib: FakeCuvid, state: FakeState, **options: Any) -> Any:
  got, dec = _run_dec(stream, lib, state, **options)
  _check_against_pyav(stream, got)
  return dec


@pytest.mark.parametrize("map_on", MODES)
def test_a_closed_streams_decoder_serves_the_next_stream(map_on: str) -> None:
  """A closed stream's decoder is kept (DECODER_CACHE) and taken by the next stream it fits: the same size as it is,
  a smaller one reconfigured; another depth or a larger size gets a decoder of its own. Every frame stays right."""
  s96, s64, s128, s96_10 = (make_hevc(w, 64, frames=5, bit_depth=b) for w, b in ((96, 8), (64, 8), (128, 8), (96, 10)))
  lib, state = FakeCuvid(), FakeState()
  objects = cuvid.live_objects()
  assert not _decode_all(s96, lib, state, map_on=map_on).reused and len(lib.created) == 1
  assert cuvid.live_objects() == {**objects, "kept": objects["kept"] + 1}
  assert _decode_all(s96, lib, state, map_on=map_on).reused and len(lib.created) == 1 and lib.reconfigured == []
  assert _decode_all(s64, lib, state, map_on=map_on).reused and len(lib.created) == 1 and lib.reconfigured == [(64, 64)]
  assert _decode_all(s96, lib, state, map_on=map_on).reused and lib.reconfigured == [(64, 64), (96, 64)]  # back to its first size
  assert not _decode_all(s96_10, lib, state, map_on=map_on).reused and lib.created[-1].bitDepthMinus8 == 2
  assert not _decode_all(s128, lib, state, map_on=map_on).reused and len(lib.created) == 3  # larger than the 8-bit one kept
  assert cuvid.live_objects() == {**objects, "kept": objects["kept"] + 3} and lib.destroyed == 0
  assert cuvid.clear_decoder_cache(lib=lib) == 3 and lib.decoders == 0 and cuvid.live_objects() == objects
  _nothing_left(lib, state)


def test_at_most_DECODER_CACHE_decoders_are_kept_the_oldest_go(monkeypatch) -> None:
  monkeypatch.setattr(cuvid, "DECODER_CACHE", 2)
  lib, state = FakeCuvid(), FakeState()
  for w in (64, 96, 128):  # each larger than those kept: a decoder each
    _decode_all(make_hevc(w, 64, frames=2), lib, state)
  assert len(lib.created) == 3 and lib.destroyed == 1 and lib.decoders == 2
  assert sorted(lib.live) == [0xDEC2, 0xDEC3]  # the 64-wide one, kept first, went first
  _nothing_left(lib, state)


def test_DECODER_CACHE_0_destroys_each_decoder_at_close(monkeypatch) -> None:
  monkeypatch.setattr(cuvid, "DECODER_CACHE", 0)
  lib, state = FakeCuvid(), FakeState()
  stream = make_hevc(96, 64, frames=2)
  for k in range(3):
    assert not _decode_all(stream, lib, state).reused
    assert lib.decoders == 0 and lib.destroyed == k + 1
  _nothing_left(lib, state)


def test_a_decoder_that_failed_is_not_kept() -> None:
  stream = make_hevc(96, 64, frames=6)
  lib, state = FakeCuvid(bad_picture=2), FakeState()
  with pytest.raises(VideoStreamError, match="NVDEC found an error"): _run(stream, lib, state)
  assert lib.decoders == 0 and lib.destroyed == 1 and cuvid.live_objects()["decoders"] == 0


def test_out_of_memory_at_creation_destroys_the_kept_decoders_and_retries_once() -> None:
  lib, state = FakeCuvid(), FakeState()
  _decode_all(make_hevc(96, 64, frames=2), lib, state)  # kept
  lib.out_of_memory = 1
  assert not _decode_all(make_hevc(96, 64, frames=2, bit_depth=10), lib, state).reused
  assert lib.destroyed == 1 and len(lib.created) == 2
  lib.out_of_memory = 2  # the kept 10-bit decoder is destroyed for the retry, and that is not enough
  with pytest.raises(Exception, match="cuvidCreateDecoder"): _run(make_hevc(128, 64, frames=2), lib, state)
  assert lib.destroyed == 2
  _nothing_left(lib, state)


class FakeMemory:
  """cuMemAlloc_v2 and cuMemFree_v2 of a GPU that is full while `full()` says so."""
  def __init__(self, full: Any) -> None: self.full, self.tries, self.next = full, 0, 0x7000_0000
  def cuMemAlloc_v2(self, p: Any, n: Any) -> int:
    self.tries += 1
    if self.full(): return driver.CUDA_ERROR_OUT_OF_MEMORY
    p._obj.value, self.next = self.next, self.next + n.value
    return 0
  def cuMemFree_v2(self, p: Any) -> int: return 0


def _allocator(state: FakeState, memory: FakeMemory) -> cuda_device.CUDAAllocator:
  state.lib.cuMemAlloc_v2, state.lib.cuMemFree_v2 = memory.cuMemAlloc_v2, memory.cuMemFree_v2  # type: ignore[attr-defined]
  return cuda_device.CUDAAllocator(DeviceInfo("CUDA", 0, "CUDA", state=state))  # type: ignore[arg-type]


def test_the_allocators_out_of_memory_destroys_the_kept_decoders_before_its_retry(monkeypatch) -> None:
  """The GPU is full while a decoder is kept: CUDA's allocator, out of memory, calls the release cuvid registered
  (clear_decoder_cache, for this GPU), then its retry succeeds. It finds the release where cuvid registered it, not by
  looking for the module: with plugrt_cuda.cuvid gone from sys.modules it runs all the same."""
  lib, state = FakeCuvid(), FakeState()
  _decode_all(make_hevc(96, 64, frames=2), lib, state)
  assert lib.decoders == 1 and lib.destroyed == 0  # kept for reuse
  memory = FakeMemory(lambda: lib.decoders > 0)
  al = _allocator(state, memory)
  monkeypatch.delitem(sys.modules, "plugrt_cuda.cuvid")
  assert al.alloc(1 << 20) == 0x7000_0000 and memory.tries == 2
  assert lib.decoders == 0 and lib.destroyed == 1
  _nothing_left(lib, state)


def test_every_release_registered_runs_once_on_out_of_memory(monkeypatch) -> None:
  """Any part of plugrt-cuda can register what it keeps on a GPU: each release runs once per failed allocation (a second
  registration changes nothing), with the allocator's GPU; when they free nothing, the error is OutOfMemoryError."""
  monkeypatch.setattr(cuda_device, "_releases_on_out_of_memory", list(cuda_device._releases_on_out_of_memory))
  state, called = FakeState(), []
  def release(s: Any) -> None: called.append(s)
  cuda_device.on_out_of_memory(release)
  cuda_device.on_out_of_memory(release)
  memory = FakeMemory(lambda: True)
  with pytest.raises(OutOfMemoryError, match="out of memory allocating"): _allocator(state, memory).alloc(1 << 20)
  assert called == [state] and memory.tries == 2


def test_no_plugrt_cuda_module_looks_in_sys_modules() -> None:
  """plugrt-cuda's modules learn of each other through imports and registrations, never by reading sys.modules."""
  found = []
  for path in sorted(Path(cuda_device.__file__).parent.glob("*.py")):
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
      if isinstance(node, ast.Attribute) and node.attr == "modules" and isinstance(node.value, ast.Name) and node.value.id == "sys":
        found.append(f"{path.name}:{node.lineno}")
  assert found == []
