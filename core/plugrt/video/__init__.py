"""Video decoding into device tensors: HEVC Annex B byte streams to (H, W, 3) RGB tensors.

    from plugrt import dtypes
    from plugrt.video import decode_annexb_iter, decode_annexb_to_tensors_auto, software_decode
    for timestamp, t in decode_annexb_iter(stream, dtype=dtypes.float16, normalize=True, color_space="bt2020"):
      ...                                   # t: (H, W, 3) on the decoding device
    frames = decode_annexb_to_tensors_auto(stream, dtype=dtypes.uint8, normalize=False,
                                           fallback=lambda err: software_decode(stream, dtype=dtypes.uint8, normalize=False))

The seam (docs/video.md): decoders are declared by plugins through the `plugrt_video_decoders` hook
(plugrt.hookspecs.VideoDecoderSpec: a name, the device kind its surfaces live on, a cheap probe, a factory), plus
the core's own software decoder (PyAV). A decoder yields `Frame`s whose `Surface` is a 4:2:0 semi-planar picture in
a device buffer; one plugrt kernel (plugrt.video.convert) turns each into a tensor on that device. Hooks run when a
stream opens, never per frame.

`timestamp` is the frame's position in display order (0, 1, 2, ...): an Annex B elementary stream has no clock.
"""
from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

from plugrt.errors import Reason, UnknownDeviceError, VideoDecoderUnavailable, VideoStreamError
from plugrt.hookspecs import Probe, VideoDecoderSpec
from plugrt.video.convert import MATRICES, Frame, Surface, VideoArgumentError, check_output, convert, resolve_color_space

__all__ = [
  "MATRICES",
  "Frame",
  "FrameIterator",
  "Surface",
  "VideoArgumentError",
  "VideoDecoderUnavailable",
  "VideoStreamError",
  "convert",
  "decode_annexb_iter",
  "decode_annexb_to_tensors_auto",
  "decoder_rows",
  "decoders",
  "software_decode",
]


class DecoderRecord(NamedTuple):
  spec: VideoDecoderSpec
  plugin: Any      # the registry's PluginRecord, or None for the core's own decoder
  package: str

  @property
  def hardware(self) -> bool: return bool(self.spec.device)


def _software_spec() -> VideoDecoderSpec:
  from plugrt.video import software
  return VideoDecoderSpec(software.NAME, "", software.probe, software.open_decoder, ("hevc",), -100,
                          "FFmpeg's HEVC decoder through PyAV, planes uploaded to the target device")


_DECLARED: weakref.WeakKeyDictionary[Any, list[DecoderRecord]] = weakref.WeakKeyDictionary()


def decoders(registry: Any = None) -> list[DecoderRecord]:
  """Every decoder the registry's plugins declare, then the core's software decoder, in automatic-choice order
  (hardware first by priority, then name). Declarations are read once per registry."""
  from plugrt.registry import current
  reg = (registry or current()).load()
  if (found := _DECLARED.get(reg)) is None:
    found = [DecoderRecord(s, rec, rec.package) for s, rec in reg.declared("plugrt_video_decoders", VideoDecoderSpec)]
    found.append(DecoderRecord(_software_spec(), None, "plugrt"))
    found.sort(key=lambda d: (not d.hardware, -d.spec.priority, d.spec.name))
    _DECLARED[reg] = found
  return found


def _probe(reg: Any, d: DecoderRecord) -> Probe:
  return reg._probe(("video", d.spec.name), d.spec.probe, d.plugin)


def decoder_rows(registry: Any = None) -> list[dict[str, Any]]:
  """One row per decoder for `plugrt devices`: name, device, package, available, reason, detail, hint; then one row
  (decoder "?") per plugin whose plugrt_video_decoders raised, overran its limit or returned garbage."""
  from plugrt.registry import current
  reg = (registry or current()).load()
  rows = [{"decoder": d.spec.name, **reg.declared_status("video", d.spec, d.plugin), "codecs": list(d.spec.codecs)} for d in decoders(reg)]
  return rows + [{"decoder": "?", "device": "-", "package": rec.package, "available": False, "reason": p.reason.value if p.reason else None,
                  "detail": p.detail, "hint": p.hint, "description": "", "codecs": []}
                 for rec, p in reg.declaration_failures("plugrt_video_decoders")]


def _start(reg: Any, d: DecoderRecord, dev: Any, stream: bytes, info: Any, options: dict[str, Any]) -> Any:
  """spec.open of decoder `d`: a plugin's runs as its device opens do (PLUGRT_OPEN_TIMEOUT; a hang is Reason.TIMED_OUT,
  and the automatic choice moves on); the core's own (PyAV) runs here."""
  if d.plugin is None: return d.spec.open(dev, stream, info, options)
  return reg.run_plugin(d.plugin, f"opening video decoder {d.spec.name}", d.spec.open, dev, stream, info, options)


def _open(stream: bytes, device: Any, decoder: str | None, options: dict[str, Any]) -> tuple[Any, Any]:
  """(decoder object, its device) for this stream: the named decoder, or the first hardware decoder that opens."""
  from plugrt.device import _device
  from plugrt.errors import PlugrtError
  from plugrt.registry import current
  from plugrt.video import hevc
  info = hevc.scan(stream)
  reg = current().load()
  found = decoders(reg)
  failed = {f"plugin {rec.entry}": p for rec, p in reg.declaration_failures("plugrt_video_decoders")}  # declarations that are missing
  if decoder is not None:
    chosen = [d for d in found if d.spec.name == decoder.upper()]
    if not chosen:
      from plugrt.errors import did_you_mean
      names = [d.spec.name for d in found]
      also = "".join(f"; {who} declared none: {p.detail}" for who, p in failed.items())
      raise UnknownDeviceError(f"no video decoder is named {decoder}{did_you_mean(decoder, names)}", f"video decoders: {', '.join(names)}{also}")
  else: chosen = [d for d in found if d.hardware]
  want = None if device is None else (device.name if hasattr(device, "name") else str(device).split(":")[0].split("+")[-1].upper())
  reasons: dict[str, str] = {}
  first: tuple[Reason, str] | None = None
  for d in chosen:
    spec = d.spec
    why: tuple[Reason, str, str] | None = None
    if "hevc" not in spec.codecs: why = (Reason.NO_DEVICE, "it does not decode HEVC", "")
    elif want is not None and spec.device and spec.device != want:
      why = (Reason.NO_DEVICE, f"its surfaces are on {spec.device}, not {want}", f"pass device={spec.device!r}, or decode in software")
    elif not (p := _probe(reg, d)).ok: why = (p.reason or Reason.NO_DEVICE, p.detail, p.hint)
    else:
      try:
        dev = _device(device if device is not None else (spec.device or None))
        return _start(reg, d, dev, bytes(stream), info, options), dev
      except VideoDecoderUnavailable as e: why = (e.reason, e.message, e.hint)
      except VideoStreamError: raise
      except PlugrtError as e: why = (getattr(e, "reason", Reason.OPEN_FAILED), e.message, e.hint)
    reasons[spec.name] = why[1] + (f" (fix: {why[2]})" if why[2] else "")
    if first is None: first = (why[0], why[2])
  if decoder is None:
    for who, p in failed.items():
      reasons[who] = p.detail + (f" (fix: {p.hint})" if p.hint else "")
      if first is None: first = (p.reason or Reason.HOOK_ERROR, p.hint)
  if not chosen and not failed: reasons["-"] = "no hardware video decoder is installed"
  detail = "; ".join(f"{k}: {v}" for k, v in reasons.items())
  raise VideoDecoderUnavailable(f"no video decoder can decode this stream here ({detail})", first[0] if first else Reason.NOT_INSTALLED,
                                'install plugrt-cuda on an NVIDIA GPU machine, or decode in software: fallback=lambda err: '
                                'plugrt.video.software_decode(stream, ...) (pip install "plugrt[video]")', reasons)


class FrameIterator:
  """The lazy (timestamp, Tensor) iterator decode_annexb_iter returns. It closes its decoder when exhausted, on
  close(), when it leaves a `with` block, when an exception leaves the loop that consumes it, or when collected."""

  def __init__(self, gen: Iterator[tuple[int, Any]]): self._gen = gen
  def __iter__(self) -> FrameIterator: return self
  def __next__(self) -> tuple[int, Any]: return next(self._gen)
  def close(self) -> None: self._gen.close()  # type: ignore[attr-defined]
  def __enter__(self) -> FrameIterator: return self
  def __exit__(self, *exc: Any) -> None: self.close()
  def __del__(self) -> None:
    try: self.close()
    except Exception: pass


def _frames(stream: bytes, dtype: Any, normalize: bool, color_space: Any, fallback: Callable[[Exception], Any] | None, device: Any,
            decoder: str | None, full_range: bool | None, options: dict[str, Any]) -> Iterator[tuple[int, Any]]:
  try: dec, _ = _open(stream, device, decoder, options)
  except VideoDecoderUnavailable as err:
    if fallback is None: raise
    yield from fallback(err)
    return
  try:
    for frame in dec.frames():
      t = convert(frame.surface, dtype, normalize, color_space, full_range)
      if frame.release is not None: frame.release()
      yield frame.timestamp, t
  finally: dec.close()


def decode_annexb_iter(stream: bytes | bytearray | memoryview, *, dtype: Any, normalize: bool, color_space: str | Sequence[float] | None = None,
                       fallback: Callable[[Exception], Any] | None = None, device: Any = None, decoder: str | None = None,
                       full_range: bool | None = None, queue_depth: int = 4) -> FrameIterator:
  """Decode an HEVC Annex B stream lazily: yields (timestamp, Tensor of (H, W, 3)) in display order, on the decoding
  device, as frames come out of the decoder, and closes the decoder when exhausted, closed, or left by an exception.

  dtype: float32, float16 or uint8; normalize: True scales to [0, 1] (floats only), False keeps 0..255 (required for
  uint8). color_space: "bt601", "bt709", "bt2020", a tuple (rv, gu, gv, bu) (plugrt.video.convert), or None for the
  stream's VUI. full_range: None takes the stream's video_full_range_flag. decoder: a decoder's name (NVDEC, PYAV);
  None picks the first hardware decoder that can open. device: where the tensors go (default: the decoder's device).
  When no decoder can, `fallback(err)` is called with the VideoDecoderUnavailable and what it returns is iterated;
  without one, err is raised. Argument errors raise here; decoder and stream errors when iteration starts.
  """
  check_output(dtype, normalize)
  resolve_color_space(color_space)
  if not isinstance(stream, (bytes, bytearray, memoryview)): raise TypeError(f"stream must be bytes, not {type(stream).__name__}")
  if not isinstance(queue_depth, int) or not 1 <= queue_depth <= 32: raise ValueError(f"queue_depth must be 1..32, not {queue_depth!r}")
  return FrameIterator(_frames(bytes(stream), dtype, normalize, color_space, fallback, device, decoder, full_range, {"queue_depth": queue_depth}))


def decode_annexb_to_tensors_auto(stream: bytes | bytearray | memoryview, *, dtype: Any, normalize: bool,
                                  color_space: str | Sequence[float] | None = None, fallback: Callable[[Exception], Any] | None = None,
                                  device: Any = None, decoder: str | None = None, full_range: bool | None = None, queue_depth: int = 4) -> Any:
  """Every frame as a list of (timestamp, Tensor), decoded eagerly. When no decoder can decode the stream here,
  returns `fallback(err)` unchanged (err: the typed VideoDecoderUnavailable); without a fallback, raises err."""
  it = decode_annexb_iter(stream, dtype=dtype, normalize=normalize, color_space=color_space, device=device, decoder=decoder,
                          full_range=full_range, queue_depth=queue_depth)
  try:
    try: first = next(it)
    except StopIteration: return []
    except VideoDecoderUnavailable as err:
      if fallback is None: raise
      return fallback(err)
    return [first, *it]
  finally: it.close()


def software_decode(stream: bytes | bytearray | memoryview, *, dtype: Any, normalize: bool, color_space: str | Sequence[float] | None = None,
                    device: Any = None, full_range: bool | None = None) -> list[tuple[int, Any]]:
  """The whole stream through the software decoder (PyAV) to (timestamp, Tensor) pairs on `device` (default: the
  default device): usable alone, or as decode_annexb_to_tensors_auto's fallback."""
  return decode_annexb_to_tensors_auto(stream, dtype=dtype, normalize=normalize, color_space=color_space, device=device,
                                       decoder="PYAV", full_range=full_range)
