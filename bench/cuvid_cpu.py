"""The Python cost per frame of plugrt_cuda.cuvid's parser-thread callbacks, on the CPU, against a fast fake libnvcuvid
(no GPU, no PyAV in the loop): the fake parser calls the real NVDECDecoder's decode and display callbacks through
ctypes exactly as libnvcuvid does (one decode and one display a picture, the display one picture behind), and its
decoder calls return at once. What it measures is the interpreter's work inside the callbacks (ctypes trampolines,
our Python, the fake's few lines) as the parser thread's CPU time (time.thread_time: waiting for the consumer
is not counted), NOT GPU time: on the GPU the map also waits for the picture (docs/video.md).

With --engine-us the fake also models the engine (a picture is finished that long after the engine is free for
it, and a map blocks until then), --consumer-us the consumer's Python per frame (the conversion launch; it holds the
GIL), --streams N decoders at once: a model of where the map runs, to compare the map_on choices on a CPU, never a
substitute for bench/video.py --sweep on the GPU.

Usage: python bench/cuvid_cpu.py [--frames 600] [--reps 5] [--map-on parser|thread|consumer] [--engine-us 0]
       [--consumer-us 0] [--streams 1]
"""
from __future__ import annotations

import argparse
import ctypes
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


class FastState:
  """The fake CUDA state: events complete at once."""
  name, stream = "fake GPU", ctypes.c_void_p(0)

  class lib:  # the CUDAState attribute's name
    @staticmethod
    def cuEventCreate(p: Any, flags: int) -> int:
      p._obj.value = 0x1000
      return 0
    @staticmethod
    def cuEventRecord(ev: Any, stream: Any) -> int: return 0
    @staticmethod
    def cuEventQuery(ev: Any) -> int: return 0
    @staticmethod
    def cuEventSynchronize(ev: Any) -> int: return 0
    @staticmethod
    def cuEventDestroy_v2(ev: Any) -> int: return 0
  def make_current(self) -> None: pass


class FastCuvid:
  """libnvcuvid's calls, each returning at once; the parser times the callbacks it makes."""

  def __init__(self, engine_s: float = 0.0) -> None:
    from plugrt_cuda import cuvid
    self.cuvid, self.engine_s, self.engine_free, self.ready = cuvid, engine_s, 0.0, [0.0] * 64
    self.decode_s = self.display_s = 0.0
    self.pictures = 0
    self.pic = (ctypes.c_int * 64)()  # CUVIDPICPARAMS: CurrPicIdx at byte 8 (the rest is the driver's business)
    self.disp = cuvid.CUVIDPARSERDISPINFO(progressive_frame=1)
    self.disp_p = ctypes.pointer(self.disp)

  def cuvidGetDecoderCaps(self, p: Any) -> int:
    c = p._obj
    c.bIsSupported, c.nMaxWidth, c.nMaxHeight, c.nMaxMBCount, c.nMinWidth, c.nMinHeight = 1, 8192, 8192, 1 << 20, 16, 16
    return 0

  def cuvidCreateVideoParser(self, p: Any, params: Any) -> int:
    cv = self.cuvid
    self.params = params._obj
    self.fmt = cv.CUVIDEOFORMAT(codec=cv.cudaVideoCodec_HEVC, min_num_decode_surfaces=5, coded_width=64, coded_height=64, chroma_format=1)
    self.fmt.display_area = cv.Rect32(0, 0, 64, 64)
    self.started, self.held, self.shown_next = False, [], None
    p._obj.value = 0xBEEF
    return 0

  def _display(self, idx: int, ts: int) -> int:
    self.disp.picture_index, self.disp.timestamp = idx, ts
    t = time.thread_time()
    r = self.params.pfnDisplayPicture(None, self.disp_p)
    self.display_s += time.thread_time() - t
    self.held.remove(idx)
    return r

  def cuvidParseVideoData(self, parser: Any, pkt: Any) -> int:
    pk = pkt._obj
    params = self.params
    if not pk.payload_size:  # the end of the stream: the picture still held is shown
      if self.shown_next is not None: self._display(*self.shown_next)
      self.shown_next = None
      return 0
    if not self.started:
      self.started = True
      if (surfaces := params.pfnSequenceCallback(None, ctypes.pointer(self.fmt))) == 0: return 999
      self.pool, self.last = surfaces, -1
    # the next free index after the last one, through the decode surfaces the sequence callback asked for (the
    # parser "cycles through" them, nvcuvid.h says)
    idx = next(i % self.pool for i in range(self.last + 1, self.last + 1 + self.pool) if i % self.pool not in self.held)
    self.held.append(idx)
    self.last = idx
    self.pic[2] = idx
    t = time.thread_time()
    r = params.pfnDecodePicture(None, ctypes.addressof(self.pic))
    self.decode_s += time.thread_time() - t
    if r == 0: return 999
    self.pictures += 1
    if self.shown_next is not None and self._display(*self.shown_next) == 0: return 999  # display one picture behind decode
    self.shown_next = (idx, pk.timestamp)
    return 0

  def cuvidDestroyVideoParser(self, p: Any) -> int: return 0
  def cuvidCreateDecoder(self, p: Any, ci: Any) -> int:
    p._obj.value = 0xDEC
    return 0
  def cuvidDestroyDecoder(self, dec: Any) -> int: return 0
  def cuvidDecodePicture(self, dec: Any, pic: Any) -> int:
    if self.engine_s:
      self.engine_free = max(time.perf_counter(), self.engine_free) + self.engine_s
      self.ready[ctypes.c_int.from_address(pic + 8).value] = self.engine_free
    return 0
  def cuvidGetDecodeStatus(self, dec: Any, idx: int, st: Any) -> int:
    st._obj.decodeStatus = 2
    return 0
  def cuvidMapVideoFrame64(self, dec: Any, idx: int, ptr: Any, pitch: Any, proc: Any) -> int:
    if self.engine_s and (wait := self.ready[idx] - time.perf_counter()) > 0: time.sleep(wait)
    ptr._obj.value, pitch._obj.value = 0x10000000 + idx * 0x100000, 128
    return 0
  def cuvidUnmapVideoFrame64(self, dec: Any, ptr: Any) -> int: return 0


def clip(frames: int) -> bytes:
  made = Path("/tmp") / f"plugrt-cuvid-cpu-{frames}.hevc"
  if made.exists(): return made.read_bytes()
  from plugrt_testing.video import make_hevc
  data = make_hevc(64, 64, frames=frames, pattern="gradient")
  made.write_bytes(data)
  return data


def run(stream: bytes, info: Any, engine_s: float = 0.0, consumer_s: float = 0.0, **options: Any) -> tuple[float, float, float, int]:
  """(decode callback s, display callback s, wall s, frames) for one pass over the stream."""
  from plugrt import Device
  from plugrt_cuda import cuvid
  lib = FastCuvid(engine_s)
  t0 = time.perf_counter()
  dec = cuvid.NVDECDecoder(Device["CPU"], stream, info, {"queue_depth": 4, **options}, state=FastState(), lib=lib)
  n = 0
  try:
    for frame in dec.frames():
      if consumer_s:  # the conversion launch's Python, holding the GIL
        end = time.perf_counter() + consumer_s
        while time.perf_counter() < end: pass
      frame.release()
      n += 1
  finally: dec.close()
  return lib.decode_s, lib.display_s, time.perf_counter() - t0, n


def run_streams(streams: int, stream: bytes, info: Any, **kw: Any) -> tuple[float, float, float, int]:
  """run() on `streams` threads at once: the callbacks' CPU summed, the wall time of all."""
  import threading
  results: list[Any] = []
  t0 = time.perf_counter()
  threads = [threading.Thread(target=lambda: results.append(run(stream, info, **kw))) for _ in range(streams)]
  for t in threads: t.start()
  for t in threads: t.join()
  return sum(r[0] for r in results), sum(r[1] for r in results), time.perf_counter() - t0, sum(r[3] for r in results)


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--frames", type=int, default=600)
  ap.add_argument("--reps", type=int, default=5)
  ap.add_argument("--map-on", default=None, help="the decoder option map_on (default: the decoder's default)")
  ap.add_argument("--engine-us", type=float, default=0.0, help="model the engine: microseconds a picture")
  ap.add_argument("--consumer-us", type=float, default=0.0, help="the consumer's Python per frame, in microseconds")
  ap.add_argument("--streams", type=int, default=1)
  args = ap.parse_args()
  from plugrt.video import hevc
  stream = clip(args.frames)
  info = hevc.scan(stream)
  kw = {"engine_s": args.engine_us / 1e6, "consumer_s": args.consumer_us / 1e6, **({"map_on": args.map_on} if args.map_on else {})}
  best = None
  for _ in range(args.reps):
    r = run_streams(args.streams, stream, info, **kw)
    key = r[2] if args.engine_us else r[0] + r[1]  # the model: the fastest wall; else the least callback CPU
    if best is None or key < (best[2] if args.engine_us else best[0] + best[1]): best = r
  assert best is not None
  d, s, wall, n = best
  what = ", ".join(x for x in (f"map_on={args.map_on}" if args.map_on else "", f"engine {args.engine_us:g} us/picture" if args.engine_us else "",
                               f"consumer {args.consumer_us:g} us/frame" if args.consumer_us else "",
                               f"{args.streams} streams" if args.streams > 1 else "") if x)
  print(f"fake libnvcuvid, CPU only, {n} frames, best of {args.reps}{', ' + what if what else ''}: "
        f"decode callback {d / n * 1e6:.1f} us/frame, display callback {s / n * 1e6:.1f} us/frame (CPU), "
        f"{n / wall:.0f} frames/s (wall)")
  return 0


if __name__ == "__main__":
  sys.exit(main())
