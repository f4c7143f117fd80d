"""NVDEC through NVIDIA's libnvcuvid (the Video Codec SDK's C API, installed with the driver), by ctypes, in
plugrt-cuda's context: HEVC Annex B streams decode into NV12/P016 surfaces that plugrt's conversion kernel reads
where NVDEC mapped them.

    from plugrt_cuda.cuvid import decode_annexb_iter, decode_annexb_to_tensors_auto   # the same as plugrt.video's

How a stream runs: a worker thread (one per stream) feeds the stream to the parser (cuvidParseVideoData) one access
unit at a time, each tagged with its byte offset as the packet timestamp. The parser calls back on that thread:
the sequence callback creates the decoder (cuvidCreateDecoder, after cuvidGetDecoderCaps checked the stream at open)
or reconfigures it at a resolution change (cuvidReconfigureDecoder), the decode callback submits a picture
(cuvidDecodePicture), and the display callback, in display order, maps the picture (cuvidMapVideoFrame64), checks
its decode status (cuvidGetDecodeStatus; an error names the byte offset of the picture's access unit) and puts it in
a bounded queue, so decoding runs ahead of the consumer by `queue_depth` surfaces and blocks when it is that far
ahead. The consumer (plugrt.video's front end) wraps each mapped surface as a plugrt Buffer (no copy), launches the
conversion kernel on the context's stream, and releases the frame: an event is recorded after the kernel and the
surface is unmapped once that event has completed. close() stops the worker, unmaps every surface and destroys
the parser and the decoder, whatever state the stream was in.

Where the map runs (the option map_on; the default "parser" is the above): a map waits until NVDEC has finished the
picture, and on the parser's thread nothing new is submitted meanwhile. With "thread" the display callback only notes
the picture (index, fields, timestamp, at most queue_depth of them) and a mapper thread of the decoder maps them in
display order into the consumer's queue; with "consumer" the consumer's frames() maps them, no thread added. The
parser, which may decode into a picture index again once its display callback returned, then goes on submitting;
the decode callback waits only when it is handed an index whose shown picture is not mapped yet (NVIDIA's samples
keep the same rule with a frame queue: cudaDecodeGL's waitUntilFrameAvailable), so no picture is overwritten before
its map. cuvidGetDecoderCaps answers are cached per context, codec, chroma format and depth (decoder_caps()).

Struct layouts and constants: NVIDIA's cuviddec.h and nvcuvid.h (Video Codec SDK 13.0), see docs/research/nvdec.md.
"""
from __future__ import annotations

import collections
import ctypes
import queue
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any, NamedTuple

from plugrt.errors import Reason, VideoDecoderUnavailable, VideoStreamError
from plugrt.video import FrameIterator, decode_annexb_iter, decode_annexb_to_tensors_auto  # noqa: F401  (the contract's names, here too)
from plugrt_cuda.device import on_out_of_memory

c_uint, c_int, c_ulong, c_ubyte, c_ushort, c_short, c_ulonglong, c_longlong, c_void_p = (
  ctypes.c_uint, ctypes.c_int, ctypes.c_ulong, ctypes.c_ubyte, ctypes.c_ushort, ctypes.c_short, ctypes.c_ulonglong, ctypes.c_longlong,
  ctypes.c_void_p)

# cuviddec.h / nvcuvid.h enums
cudaVideoCodec_HEVC = 8
cudaVideoChromaFormat_420 = 1
cudaVideoSurfaceFormat_NV12, cudaVideoSurfaceFormat_P016 = 0, 1
cudaVideoDeinterlaceMode_Weave = 0
cudaVideoCreate_PreferCUVID = 0x04
cuvidDecodeStatus_InProgress, cuvidDecodeStatus_Error, cuvidDecodeStatus_Error_Concealed = 1, 8, 9
CUVID_PKT_ENDOFSTREAM, CUVID_PKT_TIMESTAMP, CUVID_PKT_ENDOFPICTURE = 0x01, 0x02, 0x08
CUDA_ERROR_NOT_READY = 600


class Rect16(ctypes.Structure): _fields_ = [("left", c_short), ("top", c_short), ("right", c_short), ("bottom", c_short)]
class Rect32(ctypes.Structure): _fields_ = [("left", c_int), ("top", c_int), ("right", c_int), ("bottom", c_int)]


class CUVIDDECODECAPS(ctypes.Structure):
  _fields_ = [("eCodecType", c_int), ("eChromaFormat", c_int), ("nBitDepthMinus8", c_uint), ("reserved1", c_uint * 3),
              ("bIsSupported", c_ubyte), ("nNumNVDECs", c_ubyte), ("nOutputFormatMask", c_ushort), ("nMaxWidth", c_uint),
              ("nMaxHeight", c_uint), ("nMaxMBCount", c_uint), ("nMinWidth", c_ushort), ("nMinHeight", c_ushort),
              ("bIsHistogramSupported", c_ubyte), ("nCounterBitDepth", c_ubyte), ("nMaxHistogramBins", c_ushort), ("reserved3", c_uint * 10)]


class CUVIDDECODECREATEINFO(ctypes.Structure):
  _fields_ = [("ulWidth", c_ulong), ("ulHeight", c_ulong), ("ulNumDecodeSurfaces", c_ulong), ("CodecType", c_int), ("ChromaFormat", c_int),
              ("ulCreationFlags", c_ulong), ("bitDepthMinus8", c_ulong), ("ulIntraDecodeOnly", c_ulong), ("ulMaxWidth", c_ulong),
              ("ulMaxHeight", c_ulong), ("Reserved1", c_ulong), ("display_area", Rect16), ("OutputFormat", c_int), ("DeinterlaceMode", c_int),
              ("ulTargetWidth", c_ulong), ("ulTargetHeight", c_ulong), ("ulNumOutputSurfaces", c_ulong), ("vidLock", c_void_p),
              ("target_rect", Rect16), ("enableHistogram", c_ulong), ("Reserved2", c_ulong * 4)]


class VideoSignal(ctypes.Structure):
  _fields_ = [("video_format", c_ubyte, 3), ("video_full_range_flag", c_ubyte, 1), ("reserved_zero_bits", c_ubyte, 4),
              ("color_primaries", c_ubyte), ("transfer_characteristics", c_ubyte), ("matrix_coefficients", c_ubyte)]


class CUVIDEOFORMAT(ctypes.Structure):
  _fields_ = [("codec", c_int), ("frame_rate", c_uint * 2), ("progressive_sequence", c_ubyte), ("bit_depth_luma_minus8", c_ubyte),
              ("bit_depth_chroma_minus8", c_ubyte), ("min_num_decode_surfaces", c_ubyte), ("coded_width", c_uint), ("coded_height", c_uint),
              ("display_area", Rect32), ("chroma_format", c_int), ("bitrate", c_uint), ("display_aspect_ratio", c_int * 2),
              ("video_signal_description", VideoSignal), ("seqhdr_data_length", c_uint)]


class CUVIDPARSERDISPINFO(ctypes.Structure):
  _fields_ = [("picture_index", c_int), ("progressive_frame", c_int), ("top_field_first", c_int), ("repeat_first_field", c_int),
              ("timestamp", c_longlong)]


class CUVIDSOURCEDATAPACKET(ctypes.Structure):
  _fields_ = [("flags", c_ulong), ("payload_size", c_ulong), ("payload", c_void_p), ("timestamp", c_longlong)]


SequenceCallback = ctypes.CFUNCTYPE(c_int, c_void_p, ctypes.POINTER(CUVIDEOFORMAT))
DecodeCallback = ctypes.CFUNCTYPE(c_int, c_void_p, c_void_p)  # CUVIDPICPARAMS*: filled by the parser, passed on untouched
DisplayCallback = ctypes.CFUNCTYPE(c_int, c_void_p, c_void_p)  # CUVIDPARSERDISPINFO* (NULL at the end), an int to Python


class CUVIDPARSERPARAMS(ctypes.Structure):
  _fields_ = [("CodecType", c_int), ("ulMaxNumDecodeSurfaces", c_uint), ("ulClockRate", c_uint), ("ulErrorThreshold", c_uint),
              ("ulMaxDisplayDelay", c_uint), ("bAnnexb", c_uint, 1), ("bMemoryOptimize", c_uint, 1), ("uReserved", c_uint, 30),
              ("uReserved1", c_uint * 4), ("pUserData", c_void_p), ("pfnSequenceCallback", SequenceCallback),
              ("pfnDecodePicture", DecodeCallback), ("pfnDisplayPicture", DisplayCallback), ("pfnGetOperatingPoint", c_void_p),
              ("pfnGetSEIMsg", c_void_p), ("pvReserved2", c_void_p * 5), ("pExtVideoInfo", c_void_p)]


class CUVIDPROCPARAMS(ctypes.Structure):
  _fields_ = [("progressive_frame", c_int), ("second_field", c_int), ("top_field_first", c_int), ("unpaired_field", c_int),
              ("reserved_flags", c_uint), ("reserved_zero", c_uint), ("raw_input_dptr", c_ulonglong), ("raw_input_pitch", c_uint),
              ("raw_input_format", c_uint), ("raw_output_dptr", c_ulonglong), ("raw_output_pitch", c_uint), ("Reserved1", c_uint),
              ("output_stream", c_void_p), ("Reserved", c_uint * 46), ("histogram_dptr", c_void_p), ("Reserved2", c_void_p * 1)]


class CUVIDRECONFIGUREDECODERINFO(ctypes.Structure):
  _fields_ = [("ulWidth", c_uint), ("ulHeight", c_uint), ("ulTargetWidth", c_uint), ("ulTargetHeight", c_uint), ("ulNumDecodeSurfaces", c_uint),
              ("reserved1", c_uint * 12), ("display_area", Rect16), ("target_rect", Rect16), ("reserved2", c_uint * 11)]


class CUVIDGETDECODESTATUS(ctypes.Structure):
  _fields_ = [("decodeStatus", c_int), ("reserved", c_uint * 31), ("pReserved", c_void_p * 8)]


#: sizes a C compiler gives the SDK 13.0 headers on x86-64 Linux (docs/research/nvdec.md); tests compare the ctypes layouts
C_SIZES = {CUVIDDECODECAPS: 88, CUVIDDECODECREATEINFO: 176, CUVIDEOFORMAT: 64, CUVIDPARSERDISPINFO: 24, CUVIDSOURCEDATAPACKET: 32,
           CUVIDPARSERPARAMS: 136, CUVIDPROCPARAMS: 264, CUVIDRECONFIGUREDECODERINFO: 128, CUVIDGETDECODESTATUS: 192}

_lib: Any = None
_counts = {"decoders": 0, "kept": 0, "parsers": 0, "mapped": 0}  # live objects, for leak tests (live_objects())
_counts_lock = threading.Lock()


def libnvcuvid() -> Any:
  """libnvcuvid.so.1 with its signatures, loaded once; None when the driver does not ship it."""
  global _lib
  if _lib is None:
    try: lib = ctypes.CDLL("libnvcuvid.so.1")
    except OSError: lib = False
    else:
      P = ctypes.POINTER
      sigs = {"cuvidGetDecoderCaps": [P(CUVIDDECODECAPS)], "cuvidCreateDecoder": [P(c_void_p), P(CUVIDDECODECREATEINFO)],
              "cuvidReconfigureDecoder": [c_void_p, P(CUVIDRECONFIGUREDECODERINFO)], "cuvidDestroyDecoder": [c_void_p],
              "cuvidDecodePicture": [c_void_p, c_void_p], "cuvidGetDecodeStatus": [c_void_p, c_int, P(CUVIDGETDECODESTATUS)],
              "cuvidMapVideoFrame64": [c_void_p, c_int, P(c_ulonglong), P(c_uint), P(CUVIDPROCPARAMS)],
              "cuvidUnmapVideoFrame64": [c_void_p, c_ulonglong], "cuvidCreateVideoParser": [P(c_void_p), P(CUVIDPARSERPARAMS)],
              "cuvidParseVideoData": [c_void_p, P(CUVIDSOURCEDATAPACKET)], "cuvidDestroyVideoParser": [c_void_p]}
      for name, args in sigs.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, c_int
    _lib = lib
  return _lib or None


def live_objects() -> dict[str, int]:
  """Decoders of open streams, decoders kept idle for reuse ("kept", at most DECODER_CACHE per GPU), parsers and
  mapped surfaces that exist now (every close() brings all but "kept" back to where they were)."""
  with _counts_lock: return dict(_counts)


def _count(what: str, d: int) -> None:
  with _counts_lock: _counts[what] += d


def _check(code: int, call: str) -> None:
  if code != 0:
    from plugrt_cuda import driver as D
    D.check(code, call)


def _ctx_key(state: Any) -> Any:
  """The CUDA context `state` is for, as a key of the per-context caches (None for a stand-in without one)."""
  return getattr(getattr(state, "ctx", None), "value", None)


#: cuvidGetDecoderCaps answers per libnvcuvid, then per (CUDA context, codec, chroma format, bit depth): a GPU's
#: capabilities do not change while the process runs, so opening a decoder for a known format asks the driver nothing
_caps_cache: weakref.WeakKeyDictionary[Any, dict[tuple[Any, int, int, int], CUVIDDECODECAPS]] = weakref.WeakKeyDictionary()
_caps_lock = threading.Lock()


def decoder_caps(bit_depth: int, state: Any = None, lib: Any = None, codec: int = cudaVideoCodec_HEVC,
                 chroma: int = cudaVideoChromaFormat_420) -> CUVIDDECODECAPS:
  """What NVDEC on `state`'s GPU (default: the context current on this thread) can do with `codec` (HEVC) in `chroma`
  (4:2:0) at `bit_depth` bits. Asked once per context, codec, chroma format and depth for the process, then cached
  (the result is shared: read it, do not change it); a failed call is not cached. `lib` stands in for libnvcuvid."""
  lib = lib or libnvcuvid()
  key = (_ctx_key(state), codec, chroma, bit_depth)
  with _caps_lock:
    known = _caps_cache.setdefault(lib, {})
    if (caps := known.get(key)) is not None: return caps
  caps = CUVIDDECODECAPS(eCodecType=codec, eChromaFormat=chroma, nBitDepthMinus8=bit_depth - 8)
  _check(lib.cuvidGetDecoderCaps(ctypes.byref(caps)), "cuvidGetDecoderCaps")
  with _caps_lock: return _caps_cache.setdefault(lib, {}).setdefault(key, caps)


#: idle decoders kept per GPU (CUDA context) once their stream closed, for the next stream to take instead of making
#: one: cuvidCreateDecoder and cuvidDestroyDecoder are slow, and the driver creates one at a time however many threads
#: ask (docs/video.md). A stream takes a kept decoder of its bit depth and output
#: surfaces whose size limits and decode surfaces are enough, and reconfigures it in its sequence callback
#: (cuvidReconfigureDecoder: NVIDIA's API for reusing a decoder across clips) unless it already has the stream's
#: size. The oldest is destroyed when more would be kept; clear_decoder_cache() destroys them all, as does an
#: out-of-memory error from cuvidCreateDecoder or the GPU's allocator (before its retry). 0 turns keeping off.
DECODER_CACHE = 4


class _Kept(NamedTuple):
  handle: int
  state: Any
  depth: int
  out_surfaces: int
  capacity: tuple[int, int, int]  # (ulMaxWidth, ulMaxHeight, decode surfaces) it was made with
  config: tuple[Any, ...]  # the size it was last configured for (coded, target, display area, decode surfaces)


#: kept decoders per libnvcuvid (tests give fakes), then per CUDA context, oldest first
_kept: weakref.WeakKeyDictionary[Any, dict[Any, list[_Kept]]] = weakref.WeakKeyDictionary()
_kept_lock = threading.Lock()


def _take_kept(lib: Any, state: Any, depth: int, out_surfaces: int, width: int, height: int, surfaces: int) -> _Kept | None:
  """A kept decoder that can decode `depth`-bit pictures up to width x height with `surfaces` decode surfaces into
  `out_surfaces` output surfaces, taken out of the cache (the most recently kept that fits); None if none fits."""
  with _kept_lock:
    kept = _kept.get(lib, {}).get(_ctx_key(state), [])
    for k in range(len(kept) - 1, -1, -1):
      e = kept[k]
      if e.depth == depth and e.out_surfaces == out_surfaces and width <= e.capacity[0] and height <= e.capacity[1] and surfaces <= e.capacity[2]:
        del kept[k]
        _count("kept", -1)
        _count("decoders", 1)
        return e
  return None


def _keep(lib: Any, entry: _Kept) -> None:
  """Keep a closed stream's decoder for reuse; the oldest beyond DECODER_CACHE are destroyed (here, on the closer's thread)."""
  with _kept_lock:
    kept = _kept.setdefault(lib, {}).setdefault(_ctx_key(entry.state), [])
    kept.append(entry)
    _count("decoders", -1)
    _count("kept", 1)
    over = kept[:max(len(kept) - DECODER_CACHE, 0)]
    del kept[:len(over)]
  _destroy_kept(lib, over)


def _destroy_kept(lib: Any, entries: list[_Kept]) -> None:
  for e in entries:
    e.state.make_current()
    lib.cuvidDestroyDecoder(c_void_p(e.handle))
    _count("kept", -1)


def clear_decoder_cache(state: Any = None, lib: Any = None) -> int:
  """Destroy the decoders kept for reuse (DECODER_CACHE): those of `state`'s GPU, or of every GPU; returns how many.
  Their GPU memory is free once this returns. `lib` stands in for libnvcuvid (tests)."""
  with _kept_lock:
    gone: list[tuple[Any, list[_Kept]]] = []
    for owner, by_ctx in list(_kept.items()):
      if lib is not None and owner is not lib: continue
      for ctx in list(by_ctx):
        if state is None or ctx == _ctx_key(state): gone.append((owner, by_ctx.pop(ctx)))
  for owner, entries in gone: _destroy_kept(owner, entries)
  return sum(len(entries) for _, entries in gone)


on_out_of_memory(clear_decoder_cache)  # the GPU's allocator, out of memory, destroys the kept decoders before its retry


PUT_POLL_S = 0.05  # how often a put waiting for a slot looks whether the decoder is stopping (close wakes it at once)


class _Handoff:
  """A bounded queue from one thread to another built on two C-level SimpleQueues (items, and free slots as tokens):
  a put and a get cost no Python-level Condition, which queue.Queue's do (most of the display callback's CPU time
  against the fake: bench/cuvid_cpu.py)."""

  def __init__(self, size: int):
    self.items: queue.SimpleQueue[Any] = queue.SimpleQueue()
    self.slots: queue.SimpleQueue[None] = queue.SimpleQueue()
    for _ in range(size): self.slots.put(None)

  def put(self, item: Any, stopping: Any) -> bool:
    """Put `item` once a slot is free; False (not put) if `stopping()` is or turns true while waiting."""
    if stopping(): return False
    while True:
      try:
        self.slots.get(timeout=PUT_POLL_S)
        break
      except queue.Empty:
        if stopping(): return False
    self.items.put(item)
    return True

  def wake(self) -> None:
    """Let a put waiting for a slot go on now (close: it then sees the stop instead of polling for it; what it puts
    is drained by the closer)."""
    self.slots.put(None)

  def get(self, timeout: float) -> Any:
    """The oldest item (its slot free again), or raises queue.Empty after `timeout` seconds."""
    item = self.items.get(timeout=timeout)
    self.slots.put(None)
    return item

  def empty(self) -> bool: return self.items.empty()


_END = object()
#: the default of the decoder option own_stream (see NVDECDecoder.__init__); bench/video.py --sweep measures both
OWN_STREAM = False
#: the default of the decoder option map_on: "parser" maps in the parser's display callback, "thread" on a mapper
#: thread of the decoder's own, "consumer" in frames() on the consumer's thread; bench/video.py --sweep measures the three
MAP_ON = "parser"
MAP_ON_CHOICES = ("parser", "thread", "consumer")
#: the default of the decoder option status_poll_us (0: the map waits for its picture in the driver)
STATUS_POLL_US = 0
_PIC_INDEX = 8  # CUVIDPICPARAMS.CurrPicIdx: its third int (cuviddec.h)
_DispInfo = CUVIDPARSERDISPINFO.from_address  # the display callback's argument, read in place (cheaper than a POINTER's .contents)


class NVDECDecoder:
  """One stream on NVDEC (see the module docstring)."""

  def __init__(self, device: Any, stream: bytes, info: Any, options: dict[str, Any], state: Any = None, lib: Any = None):
    """`options`: ``queue_depth`` (surfaces decoded ahead of the consumer, 4; what plugrt.video passes), and the tuning
    knobs bench/video.py --sweep sets directly: ``display_delay`` (the parser's ulMaxDisplayDelay, 2), ``extra_surfaces``
    (decode surfaces beyond the stream's minimum, 4), ``own_stream`` (maps on the decoder's own stream, OWN_STREAM),
    ``map_on`` (where cuvidMapVideoFrame runs: "parser", "thread" or "consumer", MAP_ON; the module docstring),
    ``status_poll_us`` (0: off, STATUS_POLL_US; else, before each map, poll cuvidGetDecodeStatus every that many
    microseconds, sleeping between, until the picture is no longer in progress, so the map does not wait inside the
    driver: whether a waiting map holds up the other streams' calls is what bench/video.py --sweep measures).
    `state` and `lib` stand in for the device's CUDAState and libnvcuvid in tests (plugins/ops_cuda/tests/test_cuvid_fake.py)."""
    lib = lib or libnvcuvid()
    if lib is None:
      raise VideoDecoderUnavailable("libnvcuvid.so.1 (NVDEC) is not installed with this driver", Reason.NOT_INSTALLED,
                                    "install the NVIDIA driver's video decode library (libnvidia-decode)")
    self.map_on = options.get("map_on", MAP_ON)
    if self.map_on not in MAP_ON_CHOICES:
      from plugrt.video.convert import VideoArgumentError
      raise VideoArgumentError(f"the NVDEC option map_on must be one of {', '.join(map(repr, MAP_ON_CHOICES))}, not {self.map_on!r}",
                               'leave it out for the default ("parser")')
    from plugrt.device import Buffer
    from plugrt.dtype import dtypes
    from plugrt_cuda import driver as D
    self.lib, self.D, self.Buffer, self.dtypes = lib, D, Buffer, dtypes
    self.device, self.state, self.info = device, state or device.info.state, info
    self.state.make_current()
    for seq in info.sequences:  # every format the stream switches to, before anything is created
      caps = decoder_caps(seq.bit_depth_luma, self.state, lib)
      what = f"HEVC {seq.profile} 4:2:0 {seq.bit_depth_luma}-bit {seq.width}x{seq.height}"
      if seq.chroma_format_idc != 1 or seq.bit_depth_luma != seq.bit_depth_chroma:
        raise VideoDecoderUnavailable(f"NVDEC path decodes 4:2:0 with equal luma and chroma depth, not {what} (chroma_format_idc "
                                      f"{seq.chroma_format_idc})", Reason.NO_DEVICE, "decode it in software")
      if not caps.bIsSupported or seq.width > caps.nMaxWidth or seq.height > caps.nMaxHeight or \
          seq.width < caps.nMinWidth or seq.height < caps.nMinHeight or (seq.width * seq.height) // 256 > caps.nMaxMBCount:
        raise VideoDecoderUnavailable(f"NVDEC on {self.state.name} cannot decode {what} (supported: {bool(caps.bIsSupported)}, "
                                      f"{caps.nMinWidth}x{caps.nMinHeight} to {caps.nMaxWidth}x{caps.nMaxHeight})", Reason.NO_DEVICE,
                                      "decode it in software (fallback)")
    self.max_w = max(-(-s.width // 16) * 16 for s in info.sequences)
    self.max_h = max(-(-s.height // 16) * 16 for s in info.sequences)
    self.depth = int(options.get("queue_depth", 4))
    # tuning knobs (bench/video.py --sweep measures them): the parser's display delay and the decode surfaces beyond
    # the stream's minimum
    self.display_delay = int(options.get("display_delay", 2))
    self.extra_surfaces = int(options.get("extra_surfaces", 4))
    self.status_poll_s = float(options.get("status_poll_us", STATUS_POLL_US)) / 1e6
    self.out_surfaces = self.depth + 4  # queued + held by the consumer + released, waiting for their kernels
    # the parser reads the stream where it is: a bytes object's buffer (kept alive here, never written), no copy
    self.stream = stream if isinstance(stream, bytes) else bytes(stream)
    self.base = ctypes.cast(ctypes.c_char_p(self.stream), c_void_p).value or 0
    self.queue = _Handoff(self.depth)
    self.pending: collections.deque[tuple[ctypes.c_void_p, int]] = collections.deque()  # (event, mapped pointer) released
    self.spare_events: list[ctypes.c_void_p] = []
    self.handed: dict[int, bool] = {}  # surfaces given to the consumer and not released yet: close() releases them
    self.lock = threading.Lock()  # decoder calls from the worker (map, decode) and the consumer (unmap)
    self.unmap_lock = threading.Lock()  # _unmap_done from the mapping thread and the parser's (a reconfiguration)
    self.decoder, self.parser = c_void_p(), c_void_p()
    self.fmt: CUVIDEOFORMAT | None = None
    self.surface: tuple[int, int, int, int, int, int, int, bool, int] | None = None
    self.stopping, self.closed, self.error, self.mapped, self.shown = False, False, None, 0, 0
    # map_on "thread"/"consumer": the display callback only records (index, fields, timestamp, surface) in `waiting`
    # (at most queue_depth), and `unmapped` counts each picture index shown and not mapped yet: the decode callback
    # waits before decoding into such an index (NVIDIA's rule for a parser whose display callback returns before the
    # map: the parser reuses an index once its display callback returned). `map_waits` counts those waits. All of it
    # C-level queues and a plain lock: the picture crosses threads without a Python Condition.
    self.waiting = _Handoff(self.depth)
    self.unmapped: dict[int, int] = {}
    self.unmapped_lock = threading.Lock()
    self.map_waits = 0
    self.created_at: float | None = None
    # the decoder's limits as made (max width, max height, decode surfaces), its size now, and whether it was a kept one
    self.capacity: tuple[int, int, int] | None = None
    self.config: tuple[Any, ...] | None = None
    self.reused = False
    # own_stream: maps post-process on this decoder's own non-blocking stream, and the context's stream waits for each
    # map's event before the conversion kernel, so several decoders sharing a context do not serialize on one stream
    self.map_stream = c_void_p()
    self.map_events: collections.deque[ctypes.c_void_p] = collections.deque()  # recorded after a map, free again once waited on
    if options.get("own_stream", OWN_STREAM):
      self.D.check(self.state.lib.cuStreamCreate(ctypes.byref(self.map_stream), self.D.CU_STREAM_NON_BLOCKING), "cuStreamCreate")
    self._map_args = (CUVIDPROCPARAMS(output_stream=self.map_stream.value), c_ulonglong(), c_uint(), CUVIDGETDECODESTATUS())
    self._map_refs = tuple(ctypes.byref(a) for a in self._map_args)
    self._decode_fn, self._map_fn, self._status_fn = lib.cuvidDecodePicture, lib.cuvidMapVideoFrame64, lib.cuvidGetDecodeStatus
    parser_maps = self.map_on == "parser"
    self._callbacks = (SequenceCallback(self._on_sequence), DecodeCallback(self._on_decode if parser_maps else self._on_decode_after_map),
                       DisplayCallback(self._on_display if parser_maps else self._on_display_queued))
    params = CUVIDPARSERPARAMS(CodecType=cudaVideoCodec_HEVC, ulMaxNumDecodeSurfaces=1, ulClockRate=0, ulErrorThreshold=0,
                               ulMaxDisplayDelay=self.display_delay, pfnSequenceCallback=self._callbacks[0], pfnDecodePicture=self._callbacks[1],
                               pfnDisplayPicture=self._callbacks[2])
    _check(lib.cuvidCreateVideoParser(ctypes.byref(self.parser), ctypes.byref(params)), "cuvidCreateVideoParser")
    _count("parsers", 1)
    self.mapper = threading.Thread(target=self._mapper, name="plugrt-nvdec-map", daemon=True) if self.map_on == "thread" else None
    if self.mapper is not None: self.mapper.start()
    self.worker = threading.Thread(target=self._feed, name="plugrt-nvdec", daemon=True)
    self.worker.start()

  # ------------------------------------------------------------ the worker thread and the parser's callbacks
  def _feed(self) -> None:
    try:
      self.state.make_current()
      pkt = CUVIDSOURCEDATAPACKET()
      offsets = self.info.access_units  # where each access unit starts, as the stream's scan (hevc.scan) found them
      parse, parser, pkt_ref, base, n = self.lib.cuvidParseVideoData, self.parser, ctypes.byref(pkt), self.base, len(self.stream)
      for k, offset in enumerate(offsets):
        if self.stopping or self.error is not None: break
        start = offset - 3  # with the start code
        end = offsets[k + 1] - 3 if k + 1 < len(offsets) else n
        # one access unit a packet: ENDOFPICTURE lets the parser hand the picture on without waiting for the next one
        pkt.flags, pkt.payload_size = CUVID_PKT_TIMESTAMP | CUVID_PKT_ENDOFPICTURE, end - start
        pkt.payload, pkt.timestamp = base + start, offset
        r = parse(parser, pkt_ref)
        if r != 0 and self.error is None and not self.stopping:
          self.error = VideoStreamError(f"the NVDEC parser rejected the access unit (CUresult {r})", offset)
      if not self.stopping and self.error is None:
        pkt.flags, pkt.payload_size, pkt.payload, pkt.timestamp = CUVID_PKT_ENDOFSTREAM, 0, None, 0
        parse(parser, pkt_ref)
    except BaseException as e:
      if self.error is None: self.error = e
    last = self.error if self.error is not None else _END
    if self.map_on == "parser": self._put(last)
    else:  # after every picture shown: the mapper (or the consumer) passes it on in order
      self.waiting.items.put(last)  # past the bound: the end always goes in

  def _put(self, item: Any) -> bool:
    return self.queue.put(item, self._is_stopping)

  def _is_stopping(self) -> bool: return self.stopping
  def _is_stopping_or_failed(self) -> bool: return self.stopping or self.error is not None

  def _on_sequence(self, _user: Any, fmt_p: Any) -> int:
    try:
      fmt = fmt_p.contents
      depth = fmt.bit_depth_luma_minus8 + 8
      surfaces = max(int(fmt.min_num_decode_surfaces), 1) + self.extra_surfaces
      da = fmt.display_area
      w, h = da.right - da.left, da.bottom - da.top
      tw, th = w + (w & 1), h + (h & 1)
      config = (fmt.coded_width, fmt.coded_height, tw, th, (da.left, da.top, da.right, da.bottom), surfaces)
      if self.fmt is None or not self.decoder.value:
        max_w, max_h = max(self.max_w, fmt.coded_width), max(self.max_h, fmt.coded_height)
        if DECODER_CACHE and (kept := _take_kept(self.lib, self.state, depth, self.out_surfaces, max_w, max_h, surfaces)) is not None:
          self.decoder, self.capacity, self.reused = c_void_p(kept.handle), kept.capacity, True
          if kept.config != config: self._reconfigure(config)
        else: self._create(config, depth, max_w, max_h)
        if self.created_at is None: self.created_at = time.perf_counter()  # when NVDEC took it (bench/video.py --spread)
        self.depth_bits = depth
      else:
        if depth != self.depth_bits:
          raise VideoStreamError(f"the bit depth changes from {self.depth_bits} to {depth} mid-stream, which NVDEC cannot reconfigure",
                                 0, "split the stream at the change")
        # the decoder's surfaces are reallocated: every picture shown must be mapped, and every mapped one back, first
        while (self.mapped or self.unmapped) and not self.stopping:
          self._unmap_done(wait=True)
          time.sleep(0.001)
        self._reconfigure(config)
      self.fmt, self.config = fmt, config
      vs = fmt.video_signal_description
      self.surface = (w, h, tw, th, depth, 16 - depth if depth > 8 else 0, 2 if depth > 8 else 1, bool(vs.video_full_range_flag),
                      int(vs.matrix_coefficients))
      return surfaces
    except BaseException as e:
      if self.error is None: self.error = e
      return 0

  def _create(self, config: tuple[Any, ...], depth: int, max_w: int, max_h: int) -> None:
    cw, ch, tw, th, area, surfaces = config
    ci = CUVIDDECODECREATEINFO(ulWidth=cw, ulHeight=ch, ulNumDecodeSurfaces=surfaces, CodecType=cudaVideoCodec_HEVC,
                               ChromaFormat=cudaVideoChromaFormat_420, ulCreationFlags=cudaVideoCreate_PreferCUVID, bitDepthMinus8=depth - 8,
                               ulMaxWidth=max_w, ulMaxHeight=max_h, OutputFormat=cudaVideoSurfaceFormat_P016 if depth > 8
                               else cudaVideoSurfaceFormat_NV12, DeinterlaceMode=cudaVideoDeinterlaceMode_Weave, ulTargetWidth=tw,
                               ulTargetHeight=th, ulNumOutputSurfaces=self.out_surfaces)
    ci.display_area = Rect16(*area)
    with self.lock:
      r = self.lib.cuvidCreateDecoder(ctypes.byref(self.decoder), ctypes.byref(ci))
      if r == self.D.CUDA_ERROR_OUT_OF_MEMORY and clear_decoder_cache(self.state, self.lib):  # the kept decoders' memory, then once more
        r = self.lib.cuvidCreateDecoder(ctypes.byref(self.decoder), ctypes.byref(ci))
      _check(r, "cuvidCreateDecoder")
    _count("decoders", 1)
    self.capacity = (max_w, max_h, surfaces)

  def _reconfigure(self, config: tuple[Any, ...]) -> None:
    cw, ch, tw, th, area, surfaces = config
    rc = CUVIDRECONFIGUREDECODERINFO(ulWidth=cw, ulHeight=ch, ulTargetWidth=tw, ulTargetHeight=th, ulNumDecodeSurfaces=surfaces)
    rc.display_area = Rect16(*area)
    with self.lock:
      _check(self.lib.cuvidReconfigureDecoder(self.decoder, ctypes.byref(rc)), "cuvidReconfigureDecoder")

  def _on_decode(self, _user: Any, pic: Any) -> int:
    if self.stopping: return 0
    with self.lock: r = self._decode_fn(self.decoder, pic)
    if r != 0:
      if self.error is None: self.error = VideoStreamError(f"cuvidDecodePicture failed (CUresult {r})", 0)
      return 0
    return 1

  def _on_decode_after_map(self, user: Any, pic: Any) -> int:
    """map_on thread/consumer: the parser reuses a picture index as soon as its display callback returned, so a
    picture may not be decoded into an index whose earlier picture still waits to be mapped (the map reads it)."""
    if self.stopping: return 0
    try:
      idx = c_int.from_address(pic + _PIC_INDEX).value
      if idx in self.unmapped:  # polled: with the parser cycling through its surfaces, a wait is the exception
        self.map_waits += 1
        while idx in self.unmapped:
          if self.stopping or self.error is not None: return 0
          time.sleep(0.0001)
    except BaseException as e:
      if self.error is None: self.error = e
      return 0
    return self._on_decode(user, pic)

  def _on_display(self, _user: Any, disp_p: Any) -> int:
    if not disp_p: return 1  # the end of the stream (CUVID_PKT_NOTIFY_EOS)
    if self.stopping: return 0
    try:
      d = _DispInfo(disp_p)
      idx, progressive, tff, ts = d.picture_index, d.progressive_frame, d.top_field_first, d.timestamp
      if self.pending: self._unmap_done(wait=self.mapped >= self.out_surfaces - 1)
      item = self._map(idx, progressive, tff, ts, self.surface, True)
      if not self._put(item):
        self._drop(item)
        return 0
      return 1
    except BaseException as e:
      if self.error is None: self.error = e
      return 0

  def _on_display_queued(self, _user: Any, disp_p: Any) -> int:
    """map_on thread/consumer: note the picture for the mapper and return, so the parser goes on submitting."""
    if not disp_p: return 1
    if self.stopping: return 0
    try:
      d = _DispInfo(disp_p)
      idx, progressive, tff, ts = d.picture_index, d.progressive_frame, d.top_field_first, d.timestamp
      with self.unmapped_lock: self.unmapped[idx] = self.unmapped.get(idx, 0) + 1
      # waits while the mapper is queue_depth pictures behind
      if not self.waiting.put((idx, progressive, tff, ts, self.surface), self._is_stopping_or_failed):
        self._mapped_one(idx)
        return 0
      return 1
    except BaseException as e:
      if self.error is None: self.error = e
      return 0

  # ------------------------------------------------------------ mapping
  def _map(self, idx: int, progressive: int, tff: int, ts: int, surface: Any, parser: bool) -> tuple[int, int, Any, Any]:
    """Map picture `idx` (waits for NVDEC to finish it) and check its decode status: (pointer, pitch, surface, event).
    One thread maps (the parser's, the mapper or the consumer), so one set of out-structs serves every map. On the
    parser's thread the map holds self.lock as it always did; elsewhere it does not, so the parser's cuvidDecodePicture
    runs while a map waits (NVIDIA's programming guide: decode and map on different threads)."""
    proc, ptr, pitch, status = self._map_args
    proc.progressive_frame, proc.top_field_first = progressive, tff
    refs = self._map_refs
    if self.status_poll_s:  # wait for the picture out here, polling, so the map itself does not wait in the driver
      give_up = time.perf_counter() + 0.25  # a driver that never reports the picture done before its map: map anyway
      while self._status_fn(self.decoder, idx, refs[3]) == 0 and status.decodeStatus == cuvidDecodeStatus_InProgress and \
          not self.stopping and time.perf_counter() < give_up:
        time.sleep(self.status_poll_s)
    if parser:
      with self.lock:
        r = self._map_fn(self.decoder, idx, refs[1], refs[2], refs[0])
        if r: _check(r, "cuvidMapVideoFrame64")
        self.mapped += 1
        _count("mapped", 1)
        r = self._status_fn(self.decoder, idx, refs[3])
    else:
      r = self._map_fn(self.decoder, idx, refs[1], refs[2], refs[0])
      if r: _check(r, "cuvidMapVideoFrame64")
      with self.lock: self.mapped += 1
      _count("mapped", 1)
      r = self._status_fn(self.decoder, idx, refs[3])
    if r == 0 and status.decodeStatus in (cuvidDecodeStatus_Error, cuvidDecodeStatus_Error_Concealed):
      self._unmap(ptr.value)
      raise VideoStreamError("NVDEC found an error decoding the picture of the access unit" +
                             (" (concealed)" if status.decodeStatus == cuvidDecodeStatus_Error_Concealed else ""), int(ts))
    ev = None
    if self.map_stream.value:
      ev = self.map_events.popleft() if self.map_events else self._new_event()
      self.D.check(self.state.lib.cuEventRecord(ev, self.map_stream), "cuEventRecord")
    return ptr.value, pitch.value, surface, ev

  def _map_waiting(self, item: tuple[int, int, int, int, Any]) -> tuple[int, int, Any, Any]:
    """map_on thread/consumer: map a picture the display callback noted; its index is free for the parser after."""
    try:
      if self.pending: self._unmap_done(wait=self.mapped >= self.out_surfaces - 1)
      return self._map(*item, False)
    finally: self._mapped_one(item[0])

  def _mapped_one(self, idx: int) -> None:
    """Picture index `idx` is mapped (or given up): the parser may decode into it again."""
    with self.unmapped_lock:
      if (n := self.unmapped.get(idx, 1) - 1): self.unmapped[idx] = n
      else: self.unmapped.pop(idx, None)  # (close() may have cleared it)

  def _take_waiting(self, timeout: float) -> Any:
    """The oldest picture noted by the display callback (or the end), waiting `timeout` at most; None if none came."""
    try: return self.waiting.get(timeout)
    except queue.Empty: return None

  def _mapper(self) -> None:
    """map_on "thread": maps what the display callback noted, in display order, into the consumer's queue."""
    try:
      self.state.make_current()
      while not self.stopping:
        item = self._take_waiting(0.05)
        if item is None: continue
        if item is _END or isinstance(item, BaseException):
          self._put(item)
          return
        out = self._map_waiting(item)
        if not self._put(out):
          self._drop(out)
          return
    except BaseException as e:
      if self.error is None: self.error = e
      self._put(e)

  # ------------------------------------------------------------ surfaces
  def _drop(self, item: tuple[int, int, Any, Any]) -> None:
    """A mapped picture nobody will see (closing): unmapped at once, its map event kept for reuse."""
    if item[3] is not None: self.map_events.append(item[3])
    self._unmap(item[0])

  def _unmap(self, ptr: int) -> None:
    with self.lock:
      r = self.lib.cuvidUnmapVideoFrame64(self.decoder, c_ulonglong(ptr))
      self.mapped -= 1
    _count("mapped", -1)
    if r: _check(r, "cuvidUnmapVideoFrame64")

  def _unmap_done(self, wait: bool = False) -> None:
    """Unmap released surfaces whose conversion finished; with `wait`, wait for the oldest one at least."""
    cuda = self.state.lib
    with self.unmap_lock:
      while self.pending:
        ev, ptr = self.pending[0]
        if cuda.cuEventQuery(ev) == CUDA_ERROR_NOT_READY:
          if not wait: return
          cuda.cuEventSynchronize(ev)
        wait = False
        self.pending.popleft()
        self.spare_events.append(ev)
        self._unmap(ptr)

  def _new_event(self) -> ctypes.c_void_p:
    ev = c_void_p()
    self.D.check(self.state.lib.cuEventCreate(ctypes.byref(ev), 2), "cuEventCreate")  # CU_EVENT_DISABLE_TIMING
    return ev

  def _release(self, ptr: int) -> None:
    if self.handed.pop(ptr, None) is None: return  # released already (twice, or by close())
    ev = self.spare_events.pop() if self.spare_events else self._new_event()
    self.D.check(self.state.lib.cuEventRecord(ev, self.state.stream), "cuEventRecord")
    self.pending.append((ev, ptr))

  def _next_mapped(self) -> Any:
    """The next mapped picture, _END or an error, as the consumer's loop gets it (map_on "consumer": mapped here)."""
    if self.map_on != "consumer":
      feeder = self.mapper or self.worker
      while True:
        try: return self.queue.get(timeout=0.1)
        except queue.Empty:
          if not feeder.is_alive() and self.queue.empty(): raise RuntimeError("the NVDEC worker ended without a result") from None
    while True:
      item = self._take_waiting(0.1)
      if item is None:
        if not self.worker.is_alive() and self.waiting.empty(): raise RuntimeError("the NVDEC worker ended without a result")
        continue
      if item is _END or isinstance(item, BaseException): return item
      try: return self._map_waiting(item)
      except BaseException as e:
        if self.error is None: self.error = e  # the parser stops too
        return e

  def frames(self) -> Iterator[Any]:
    from plugrt.video import Frame
    from plugrt.video.convert import Surface
    dev, Buffer = self.device, self.Buffer
    if self.map_on == "consumer": self.state.make_current()  # this thread calls cuvidMapVideoFrame
    while True:
      item = self._next_mapped()
      if item is _END: break
      if isinstance(item, BaseException): raise item
      ptr, pitch, (w, h, _tw, th, depth, shift, esize, full, matrix), mapped_ev = item
      if mapped_ev is not None:  # the map's post-processing ran on the decoder's stream: the context's stream waits for it
        self.D.check(self.state.lib.cuStreamWaitEvent(self.state.stream, mapped_ev, 0), "cuStreamWaitEvent")
        self.map_events.append(mapped_ev)
      n = (pitch * th + pitch * ((th + 1) // 2)) // esize
      # the mapped surface is device memory of this context by cuvidMapVideoFrame's contract: wrapped as it is, no copy
      buf = Buffer._make(dev, n, self.dtypes.uint16 if esize == 2 else self.dtypes.uint8, ptr, None, 0, True)
      s = Surface(buf, w, h, pitch // esize, pitch * th // esize, depth, shift, 0, 0, full, matrix)
      t = self.shown
      self.shown += 1
      self.handed[ptr] = True
      yield Frame(t, s, lambda p=ptr: self._release(p))
    if self.shown < self.info.pictures:
      raise VideoStreamError(f"{self.info.pictures - self.shown} of the stream's {self.info.pictures} pictures did not come out of "
                             "NVDEC (a truncated or corrupt stream)", len(self.stream))

  def close(self) -> None:
    if self.closed: return
    self.closed = self.stopping = True
    self.queue.wake()  # a display callback or mapper waiting for the consumer returns now, not at its next poll (PUT_POLL_S)
    self.waiting.wake()
    self.state.make_current()
    try:
      self.worker.join(30)
      if self.mapper is not None: self.mapper.join(30)
      while True:
        try: item = self.queue.get(0)
        except queue.Empty: break
        if isinstance(item, tuple): self.handed[item[0]] = True
      while self._take_waiting(0) is not None: pass  # shown, never mapped: nothing to give back
      self.unmapped.clear()
      for ptr in list(self.handed): self._release(ptr)  # a frame the consumer held when it stopped, or got from the queue here
      self._unmap_done(wait=True)
      while self.pending: self._unmap_done(wait=True)
    finally:
      if self.parser.value:
        self.lib.cuvidDestroyVideoParser(self.parser)
        self.parser = c_void_p()
        _count("parsers", -1)
      if self.decoder.value:
        if self._reusable():
          _keep(self.lib, _Kept(self.decoder.value, self.state, self.depth_bits, self.out_surfaces, self.capacity, self.config))  # type: ignore[arg-type]
        else:
          self.lib.cuvidDestroyDecoder(self.decoder)
          _count("decoders", -1)
        self.decoder = c_void_p()
      for ev in (*self.spare_events, *self.map_events): self.state.lib.cuEventDestroy_v2(ev)
      self.spare_events.clear()
      self.map_events.clear()
      if self.map_stream.value:
        self.state.lib.cuStreamSynchronize(self.map_stream)
        self.state.lib.cuStreamDestroy_v2(self.map_stream)
        self.map_stream = c_void_p()

  def _reusable(self) -> bool:
    """Whether the decoder may serve another stream: it decoded without an error, its size is known, and nothing of
    this stream still calls into it or holds a surface of it."""
    return bool(DECODER_CACHE) and self.error is None and self.capacity is not None and self.config is not None and \
      self.config[5] <= self.capacity[2] and not self.worker.is_alive() and (self.mapper is None or not self.mapper.is_alive()) and \
      self.mapped == 0

  def __del__(self) -> None:
    try: self.close()
    except Exception: pass


def open_decoder(device: Any, stream: bytes, info: Any, options: dict[str, Any]) -> NVDECDecoder:
  return NVDECDecoder(device, stream, info, options)
