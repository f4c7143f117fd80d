"""HEVC decode, side by side in one run on one 1080p clip that this script makes with libx265:

  PyNvVideoCodec  NVIDIA's Python decoder (its Demuxer + Decoder, frames in device memory, NV12)
  PyAV            FFmpeg's software decoder on every core (decode only; and decode + RGB arrays)
  plugrt          NVDEC through plugrt_cuda.cuvid: to NV12 surfaces (mapped, released unconverted), to float16 RGB
                  tensors on the GPU (the conversion kernel), and 4 streams at once (one decoder each); as users get it
                  (closed streams' decoders kept for the next: cuvid.DECODER_CACHE, filled by each row's warm-up run),
                  and with DECODER_CACHE=0 (a decoder made and destroyed in every run, as PyNvVideoCodec's rows do);
                  and NV's own video engine (plugrt-nv, no libnvcuvid) to float16 RGB, one stream

Targets (issue 12): plugrt NV12 >= 1.0x PyNvVideoCodec's fps; float16 RGB >= 0.9x PyNvVideoCodec's NV12 fps;
4 streams >= 3x one stream's aggregate rate.

Usage: python bench/video.py [--frames 600] [--quick] [--preset fast] [--json out.json] [--sweep] [--spread] [--rows TEXT]
(--sweep: the decoder's options instead, 1 and --streams streams; docs/video.md says what each row is)
The comparison packages (av, pynvvideocodec) are installed if missing: first from wheels in .video-whl/ (the GPU
machine has no network: carry them there), then from the package index.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WHEELS = ROOT / ".video-whl"


def ensure(module: str, package: str) -> str:
  """Import `module`, installing `package` first if needed; returns "" or why it cannot be had."""
  try:
    importlib.import_module(module)
    return ""
  except ImportError: pass
  tries = []
  if WHEELS.is_dir(): tries.append([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--find-links", str(WHEELS), package])
  tries.append([sys.executable, "-m", "pip", "install", "-q", package])
  for cmd in tries:
    print(f"  {module} is not installed: {' '.join(cmd)}", file=sys.stderr)
    if subprocess.run(cmd, capture_output=True, text=True).returncode == 0:
      importlib.invalidate_caches()
      try:
        importlib.import_module(module)
        return ""
      except ImportError as e: return f"{package} installed but does not import: {e}"
  return f"pip install {package} failed (no network? put its wheel in {WHEELS})"


def make_clip(frames: int, preset: str) -> bytes:
  import io

  import av
  import numpy as np

  from plugrt_testing.video import TAGS
  buf = io.BytesIO()
  w, h = 1920, 1080
  with av.open(buf, "w", format="hevc") as out:
    s = out.add_stream("libx265", rate=30)
    s.width, s.height, s.pix_fmt = w, h, "yuv420p"
    s.options = {"preset": preset, "x265-params": f"log-level=error:keyint=60:bframes=3:{TAGS['bt709']}"}
    yy, xx = np.mgrid[0:h, 0:w].astype(np.int32)
    rng = np.random.default_rng(0)
    texture = rng.integers(0, 48, (h, w), dtype=np.int32)
    for i in range(frames):  # moving ramps with a fixed texture: motion for inter prediction, detail for the residual
      moving = np.roll(texture, (i, 2 * i), axis=(0, 1))
      rgb = np.stack([(xx + 3 * i) % 256, (yy + 2 * i) % 256, ((xx + yy) // 2 + 5 * i) % 256], -1) + moving[..., None]
      frame = av.VideoFrame.from_ndarray(np.clip(rgb, 0, 255).astype(np.uint8), format="rgb24")
      for p in s.encode(frame): out.mux(p)
    for p in s.encode(): out.mux(p)
  return buf.getvalue()


def timed(fn: Any, reps: int) -> tuple[float, int]:
  """(best seconds over reps, frames) of fn() -> frames."""
  best, n = float("inf"), 0
  for _ in range(reps):
    t0 = time.perf_counter()
    n = fn()
    best = min(best, time.perf_counter() - t0)
  return best, n


def pynvvideocodec_nv12(path: str) -> int:
  import PyNvVideoCodec as nvc
  demuxer = nvc.CreateDemuxer(filename=path)
  decoder = nvc.CreateDecoder(gpuid=0, codec=nvc.cudaVideoCodec.HEVC, cudacontext=0, cudastream=0, usedevicememory=True)
  n = 0
  for packet in demuxer: n += len(decoder.Decode(packet))
  return n


def pyav_software(clip: bytes, rgb: bool) -> int:
  import av
  ctx = av.CodecContext.create("hevc", "r")
  ctx.thread_type, ctx.thread_count = "AUTO", 0  # 0: FFmpeg picks a thread per core
  n = 0
  for p in ctx.parse(clip) + ctx.parse(None):
    for f in ctx.decode(p):
      if rgb: f.to_ndarray(format="rgb24")
      n += 1
  for f in ctx.decode(None):
    if rgb: f.to_ndarray(format="rgb24")
    n += 1
  return n


MAP_WAITS = [0]  # decode callbacks that waited for their picture index to be mapped (map_on thread/consumer), summed


def plugrt_nv12(clip: bytes, **options: Any) -> int:
  from plugrt import Device
  from plugrt.video import hevc
  from plugrt_cuda.cuvid import NVDECDecoder
  dev = Device["CUDA"]
  dec = NVDECDecoder(dev, clip, hevc.scan(clip), {"queue_depth": 4, **options})
  n = 0
  try:
    for frame in dec.frames():
      frame.release()  # the surface as NVDEC mapped it: nothing reads it
      n += 1
  finally: dec.close()
  MAP_WAITS[0] += dec.map_waits
  return n


def plugrt_decode_only(clip: bytes) -> int:
  """The parser and decoder alone: the display callback counts the picture and maps nothing (the ceiling for NV12)."""
  from plugrt import Device
  from plugrt.video import hevc
  from plugrt_cuda.cuvid import NVDECDecoder

  class Counting(NVDECDecoder):
    shown_here = 0

    def _on_display(self, _user: Any, disp_p: Any) -> int:
      if disp_p: self.shown_here += 1
      return 1
  dec = Counting(Device["CUDA"], clip, hevc.scan(clip), {"queue_depth": 4})
  try:
    dec.worker.join()
    Device["CUDA"].synchronize()
  finally: dec.close()
  return dec.shown_here


def pynvvideocodec_many(path: str, streams: int) -> int:
  counts = [0] * streams

  def run(k: int) -> None: counts[k] = pynvvideocodec_nv12(path)
  threads = [threading.Thread(target=run, args=(k,)) for k in range(streams)]
  for t in threads: t.start()
  for t in threads: t.join()
  return sum(counts)


def decoder_busy(fn: Any) -> tuple[Any, str]:
  """fn()'s frames, and nvidia-smi's NVDEC utilization (%) sampled every 100 ms while it ran."""
  smi = subprocess.Popen(["nvidia-smi", "--query-gpu=utilization.decoder", "--format=csv,noheader,nounits", "-lms", "100"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
  try: n = fn()
  finally:
    smi.terminate()
    out = smi.communicate()[0]
  busy = [int(x) for x in out.split() if x.strip().isdigit()]
  return n, f"NVDEC busy {max(busy)}% peak, {sorted(busy)[len(busy) // 2]}% median" if busy else "no NVDEC utilization reading"


def sweep(clip: bytes, path: str, streams: int) -> None:
  """Where NVDEC time goes: the decoder alone, the parser's display delay and decode surfaces, where the map runs
  (map_on: the parser's thread, a mapper thread, the consumer's thread; with more decode surfaces; with maps on each
  decoder's own stream; waiting for the picture by polling its status rather than in the map), on 1 and `streams`
  concurrent streams, plugrt and PyNvVideoCodec side by side. Each row: one
  warm run, then the best of two timed runs while nvidia-smi samples the engines (about 2 minutes on the H100)."""
  from plugrt_cuda import cuvid

  def defaults(fn: Any, **kw: Any) -> Any:  # fn with the decoders' module defaults (MAP_ON, OWN_STREAM) switched for the row
    def run() -> Any:
      saved = {k: getattr(cuvid, k) for k in kw}
      for k, v in kw.items(): setattr(cuvid, k, v)
      try: return fn()
      finally:
        for k, v in saved.items(): setattr(cuvid, k, v)
    return run
  rows: list[tuple[str, Any]] = [("plugrt decode only (no map)", lambda: plugrt_decode_only(clip)),
                                 ("plugrt NV12 display_delay=0 extra_surfaces=12", lambda: plugrt_nv12(clip, display_delay=0, extra_surfaces=12))]
  for k in sorted({1, streams}):
    nv12 = [("", {}), (" map_on=thread", {"map_on": "thread"}), (" map_on=consumer", {"map_on": "consumer"}),
            (" map_on=thread extra_surfaces=12", {"map_on": "thread", "extra_surfaces": 12}),
            (" map_on=thread own_stream", {"map_on": "thread", "own_stream": True}),
            (" map_on=thread status_poll_us=100", {"map_on": "thread", "status_poll_us": 100}),
            (" status_poll_us=100", {"status_poll_us": 100})]
    rows.append((f"PyNvVideoCodec NV12, {k} streams", lambda k=k: pynvvideocodec_many(path, k)))
    rows += [(f"plugrt NV12, {k} streams{label}", lambda k=k, o=o: concurrent(lambda c: plugrt_nv12(c, **o), clip, k)) for label, o in nv12]
    rows += [(f"plugrt float16 RGB, {k} streams{label}", defaults(lambda k=k: concurrent(plugrt_rgb, clip, k), MAP_ON=m))
             for label, m in (("", "parser"), (" map_on=thread", "thread"), (" map_on=consumer", "consumer"))]
  t0 = time.perf_counter()
  for name, fn in rows:
    try:
      fn()
      MAP_WAITS[0] = 0
      (secs, n), busy = decoder_busy(lambda fn=fn: timed(fn, 2))
      waits = f"; the parser waited for a map {MAP_WAITS[0] // 2} times a run" if "map_on=" in name and "NV12" in name else ""
      print(f"  {name:<58} {n / secs:8.0f} fps  ({n} frames in {secs:.2f} s; {busy}{waits})", flush=True)
    except Exception as e: print(f"  {name:<58} failed: {type(e).__name__}: {e}", flush=True)
  print(f"  (sweep: {len(rows)} rows in {time.perf_counter() - t0:.0f} s)")


def spread(clip: bytes, path: str, streams: int, runs: int = 4) -> None:
  """Where the time of `streams` concurrent streams goes, stream by stream: when each thread started, had its
  decoder, showed its first and last frame and was closed (ms from the run's start); plugrt NV12 with decoders kept
  (each run after a run of as many streams), plugrt with none kept, and PyNvVideoCodec, taking turns, `runs` runs
  each. A stream that starts late or finishes alone says the wall time is not the engines'."""
  from plugrt import Device
  from plugrt.video import hevc
  from plugrt_cuda.cuvid import NVDECDecoder
  t = time.perf_counter()
  hevc.scan(clip)
  print(f"  hevc.scan of the clip: {(time.perf_counter() - t) * 1e3:.1f} ms (each plugrt stream scans once, holding the GIL)")

  def plugrt_one(mark: list[float]) -> tuple[int, float | None]:
    """(frames, when the decoder was made or a kept one taken); marks the first and the last frame"""
    dec = NVDECDecoder(Device["CUDA"], clip, hevc.scan(clip), {"queue_depth": 4})
    n = 0
    try:
      for frame in dec.frames():
        if not n: mark.append(time.perf_counter())
        frame.release()
        n += 1
      mark.append(time.perf_counter())
    finally: dec.close()
    return n, dec.created_at

  def pynv_one(mark: list[float]) -> tuple[int, float | None]:
    import PyNvVideoCodec as nvc
    demuxer = nvc.CreateDemuxer(filename=path)
    decoder = nvc.CreateDecoder(gpuid=0, codec=nvc.cudaVideoCodec.HEVC, cudacontext=0, cudastream=0, usedevicememory=True)
    n = 0
    for packet in demuxer:
      got = len(decoder.Decode(packet))
      if got and not n: mark.append(time.perf_counter())
      n += got
    mark.append(time.perf_counter())
    return n, None  # (its decoder is made inside PyNvVideoCodec)

  from plugrt_cuda import cuvid
  keep = cuvid.DECODER_CACHE

  def plugrt_uncached(mark: list[float]) -> tuple[int, float | None]:
    cuvid.DECODER_CACHE = 0
    return plugrt_one(mark)
  sides = (("plugrt NV12", plugrt_one), ("plugrt NV12 DECODER_CACHE=0", plugrt_uncached), ("PyNvVideoCodec", pynv_one))
  for side, one in sides * runs:
    cuvid.DECODER_CACHE = keep
    if one is plugrt_one: concurrent(plugrt_nv12, clip, streams)  # the run before left this many decoders to keep
    marks: list[list[float]] = [[] for _ in range(streams)]
    counts, made = [0] * streams, [None] * streams

    def run(k: int, one: Any = one, marks: list[list[float]] = marks, counts: list[int] = counts, made: list[Any] = made) -> None:
      marks[k].append(time.perf_counter())
      counts[k], made[k] = one(marks[k])
      marks[k].append(time.perf_counter())
    threads = [threading.Thread(target=run, args=(k,)) for k in range(streams)]
    t0 = time.perf_counter()
    for th in threads: th.start()
    for th in threads: th.join()
    wall = time.perf_counter() - t0
    ms = lambda t, t0=t0: f"{(t - t0) * 1e3:4.0f}" if t is not None else "   -"
    cells = "  ".join(f"{ms(m[0])}/{ms(c)}/{ms(m[1])}/{ms(m[2])}/{ms(m[3])}" for m, c in zip(marks, made) if len(m) == 4)
    print(f"  {side:<27} {sum(counts) / wall:6.0f} fps, {wall * 1e3:5.0f} ms; per stream started/decoder ready/first frame/last frame/"
          f"closed ms: {cells}", flush=True)
  cuvid.DECODER_CACHE = keep


UNCACHED = "plugrt DECODER_CACHE=0"


def uncached(fn: Any) -> Any:
  """fn with no decoder kept between runs: each run makes its decoders and destroys them at close."""
  def run() -> Any:
    from plugrt_cuda import cuvid
    keep = cuvid.DECODER_CACHE
    cuvid.DECODER_CACHE = 0
    cuvid.clear_decoder_cache()
    try: return fn()
    finally: cuvid.DECODER_CACHE = keep
  return run


def plugrt_rgb(clip: bytes, decoder: str = "NVDEC", device: str = "CUDA") -> int:
  from plugrt import Device, dtypes
  from plugrt.video import decode_annexb_iter
  n = 0
  for _ts, _t in decode_annexb_iter(clip, dtype=dtypes.float16, normalize=True, decoder=decoder, device=device): n += 1
  Device[device].synchronize()
  return n


def concurrent(fn: Any, clip: bytes, streams: int) -> int:
  counts, errors = [0] * streams, []

  def run(k: int) -> None:
    try: counts[k] = fn(clip)
    except Exception as e: errors.append(e)
  threads = [threading.Thread(target=run, args=(k,)) for k in range(streams)]
  for t in threads: t.start()
  for t in threads: t.join()
  if errors: raise errors[0]
  return sum(counts)


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--frames", type=int, default=600)
  ap.add_argument("--quick", action="store_true", help="120 frames, one repetition")
  ap.add_argument("--preset", default="fast", help="x265 preset for the clip")
  ap.add_argument("--streams", type=int, default=4)
  ap.add_argument("--json", help="write the results here")
  ap.add_argument("--sweep", action="store_true", help="measure the decoder's settings instead of the comparison rows")
  ap.add_argument("--spread", action="store_true", help="each concurrent stream's start, first frame and end, plugrt and PyNvVideoCodec")
  ap.add_argument("--no-install", action="store_true", help="never run pip: compare with what is installed")
  ap.add_argument("--rows", default="", help="only the comparison rows whose name holds this text")
  args = ap.parse_args()
  frames, reps = (120, 1) if args.quick else (args.frames, 3)
  if (why := ensure("av", "av") if not args.no_install else ""): print(f"cannot make the clip: {why}"); return 1
  t0 = time.perf_counter()
  made = Path(tempfile.gettempdir()) / f"plugrt-bench-clip-{frames}-{args.preset}.hevc"  # the sweep and the rows share one clip
  clip = made.read_bytes() if made.exists() else make_clip(frames, args.preset)
  made.write_bytes(clip)
  print(f"clip: 1920x1080 HEVC Main, {frames} frames, {len(clip) / 1e6:.1f} MB, x265 preset {args.preset}, made in {time.perf_counter() - t0:.0f} s")
  with tempfile.NamedTemporaryFile(suffix=".hevc", delete=False) as f:
    f.write(clip)
    path = f.name
  if args.spread:
    for k in sorted({1, args.streams}):
      print(f"-- {k} stream{'s' if k > 1 else ''} at once")
      spread(clip, path, k)
    os.unlink(path)
    return 0
  if args.sweep:
    sweep(clip, path, args.streams)
    os.unlink(path)
    return 0
  results: dict[str, Any] = {"frames": frames, "bytes": len(clip), "cpus": os.cpu_count(), "rows": {}}
  rows = [("PyAV software, all cores (decode)", lambda: pyav_software(clip, False), ""),
          ("PyAV software, all cores (decode + RGB arrays)", lambda: pyav_software(clip, True), "")]
  from plugrt import Device
  gpu = Device.registry.probe("CUDA")
  # PyNvVideoCodec is only worth installing where it can run: a machine with an NVIDIA GPU
  if not gpu.ok: nvc_missing = f"no NVIDIA GPU here ({gpu.detail})"
  elif args.no_install: nvc_missing = "" if importlib.util.find_spec("PyNvVideoCodec") else "not installed (--no-install)"
  else: nvc_missing = ensure("PyNvVideoCodec", "pynvvideocodec")
  if gpu.ok and not nvc_missing:  # before anything holds the GPU's primary context (next line): for the record
    pynvvideocodec_nv12(path)
    secs, n = timed(lambda: pynvvideocodec_nv12(path), reps)
    print(f"  {'PyNvVideoCodec NV12, no CUDA context held in the process':<66} {n / secs:8.0f} fps  (not compared: see below)")
    results["rows"]["PyNvVideoCodec NV12, no CUDA context held"] = {"fps": n / secs, "frames": n, "seconds": secs}
  # The rows below run with the GPU's primary context held, as any program that uses the GPU for anything else holds
  # it. Without it PyNvVideoCodec (cudacontext=0) seems to set the context up and tear it down around each decoder
  # (the row above against its row below).
  if gpu.ok: Device["CUDA"].synchronize()
  rows.insert(0, ("PyNvVideoCodec NV12 (device memory)", lambda: pynvvideocodec_nv12(path), nvc_missing))
  k = args.streams
  for pre, wrap in (("plugrt", lambda fn: fn), (UNCACHED, uncached)):
    rows += [(f"{pre} NVDEC to NV12 surfaces", wrap(lambda: plugrt_nv12(clip)), ""),
             (f"{pre} NVDEC to float16 RGB tensors", wrap(lambda: plugrt_rgb(clip)), ""),
             (f"{pre} NVDEC to NV12 surfaces, {k} streams", wrap(lambda: concurrent(plugrt_nv12, clip, k)), ""),
             (f"{pre} NVDEC to float16 RGB, {k} streams", wrap(lambda: concurrent(plugrt_rgb, clip, k)), "")]
  nv = Device.registry.probe("NV")  # NV's own video engine: plugrt's HEVC parser fills the engine's picture setup
  rows.append(("plugrt NV's own engine (NV_NVDEC) to float16 RGB", lambda: plugrt_rgb(clip, "NV_NVDEC", "NV"),
               "" if nv.ok else f"no NV device ({nv.detail})"))
  for name, fn, missing in rows:
    if args.rows and args.rows not in name: continue
    if missing:
      results["rows"][name] = {"error": missing}
      print(f"  {name:<66} -  ({missing})")
      continue
    try:
      fn()  # warm: contexts, kernels
      secs, n = timed(fn, reps)
    except Exception as e:  # one side failing still reports the others
      results["rows"][name] = {"error": f"{type(e).__name__}: {e}"}
      print(f"  {name:<66} failed: {type(e).__name__}: {e}")
      continue
    results["rows"][name] = {"fps": n / secs, "frames": n, "seconds": secs}
    print(f"  {name:<66} {n / secs:8.0f} fps  ({n} frames in {secs:.2f} s)")
  os.unlink(path)
  r = {k: v.get("fps") for k, v in results["rows"].items()}
  ref = r.get(rows[0][0])
  targets = {}
  for label, pre in (("", "plugrt"), (" (DECODER_CACHE=0)", UNCACHED)):
    nv12, rgb, many_nv12, many = (r.get(f"{pre} NVDEC to {what}") for what in
                                  ("NV12 surfaces", "float16 RGB tensors", f"NV12 surfaces, {k} streams", f"float16 RGB, {k} streams"))
    if ref and nv12: targets[f"NV12 vs PyNvVideoCodec (>= 1.0){label}"] = nv12 / ref
    if ref and rgb: targets[f"float16 RGB vs PyNvVideoCodec NV12 (>= 0.9){label}"] = rgb / ref
    if nv12 and many_nv12: targets[f"{k} streams vs one, NV12 (>= 3.0){label}"] = many_nv12 / nv12
    if rgb and many: targets[f"{k} streams vs one, float16 RGB (>= 3.0){label}"] = many / rgb
  for k, v in targets.items(): print(f"  {k}: {v:.2f}x")
  results["targets"] = targets
  if args.json: Path(args.json).write_text(json.dumps(results, indent=2))
  return 0


if __name__ == "__main__":
  sys.exit(main())
