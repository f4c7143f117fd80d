"""plugrt.video's front end: the contract's behaviour (lazy display-order iteration, closing on exhaustion, early
close and exceptions, the auto variant's fallback), the decoder seam (a plugin's decoder through the
plugrt_video_decoders hook), and the software decoder end to end against PyAV's own decode."""
from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from plugrt import Device, dtypes
from plugrt.errors import Reason, UnknownDeviceError, VideoDecoderUnavailable, VideoStreamError
from plugrt.hookspecs import Probe, VideoDecoderSpec, hookimpl
from plugrt.registry import isolated
from plugrt.video import Frame, decode_annexb_iter, decode_annexb_to_tensors_auto, decoder_rows, decoders, hevc, software_decode
from plugrt.video.convert import VideoArgumentError, surface_from_planes

av = pytest.importorskip("av")
from plugrt_testing.video import make_hevc, pyav_planes, reference_rgb  # noqa: E402


@pytest.fixture(scope="module")
def clip() -> bytes: return make_hevc(64, 48, frames=6, tag="bt709")


# ---------------------------------------------------------------- a fake hardware decoder, declared like NVDEC is

class FakeDecoderPlugin:
  """A plugin declaring decoder FAKEDEC on CPU; it decodes with PyAV and counts what it opens and closes."""

  def __init__(self, available: bool = True, refuse: bool = False):
    self.available, self.refuse, self.opened, self.closed, self.released = available, refuse, 0, 0, 0

  def probe(self, ctx: Any) -> Probe:
    return Probe.found(1, "fake") if self.available else Probe.missing(Reason.NO_DEVICE, "no fake video engine here", "get one")

  def open(self, device: Any, stream: bytes, info: Any, options: dict) -> Any:
    if self.refuse: raise VideoDecoderUnavailable("the fake engine cannot take Main10", Reason.NO_DEVICE, "use software")
    plugin = self
    plugin.opened += 1

    class Dec:
      def frames(self) -> Iterator[Frame]:
        for i, (y, cb, cr, bits, full, matrix) in enumerate(pyav_planes(stream)):
          def release() -> None: plugin.released += 1
          yield Frame(i, surface_from_planes(device, y, cb, cr, bits, full, matrix), release)

      def close(self) -> None: plugin.closed += 1
    return Dec()

  @hookimpl
  def plugrt_video_decoders(self) -> list[VideoDecoderSpec]:
    return [VideoDecoderSpec(name="FAKEDEC", device="CPU", probe=self.probe, open=self.open, priority=10, description="a test decoder")]


@pytest.fixture
def fake() -> Iterator[FakeDecoderPlugin]:
  import plugrt_cpu
  plugin = FakeDecoderPlugin()
  with isolated([plugrt_cpu, plugin]): yield plugin


def test_the_seam_lists_plugin_decoders_first(fake: FakeDecoderPlugin) -> None:
  names = [d.spec.name for d in decoders()]
  assert names[0] == "FAKEDEC" and names[-1] == "PYAV"
  rows = {r["decoder"]: r for r in decoder_rows()}
  assert rows["FAKEDEC"]["available"] and rows["FAKEDEC"]["device"] == "CPU" and rows["PYAV"]["device"] == "any"


def test_iteration_is_lazy_in_display_order_and_closes_when_exhausted(fake: FakeDecoderPlugin, clip: bytes) -> None:
  it = decode_annexb_iter(clip, dtype=dtypes.float32, normalize=True)
  assert fake.opened == 0  # nothing opens before iteration starts
  ts, t = next(it)
  assert fake.opened == 1 and ts == 0 and t.shape == (48, 64, 3) and str(t.device) == "CPU"
  rest = list(it)
  assert [r[0] for r in rest] == [1, 2, 3, 4, 5] and fake.closed == 1 and fake.released == 6


def test_early_close_and_exceptions_close_the_decoder(fake: FakeDecoderPlugin, clip: bytes) -> None:
  it = decode_annexb_iter(clip, dtype=dtypes.float16, normalize=True)
  next(it)
  it.close()
  assert fake.closed == 1
  with pytest.raises(KeyError):
    for _ts, _t in decode_annexb_iter(clip, dtype=dtypes.float16, normalize=True): raise KeyError("consumer failed")
  gc.collect()
  assert fake.closed == 2
  with decode_annexb_iter(clip, dtype=dtypes.uint8, normalize=False) as it2:
    next(it2)
  assert fake.closed == 3
  for _ in decode_annexb_iter(clip, dtype=dtypes.uint8, normalize=False): break
  gc.collect()
  assert fake.closed == 4 and fake.opened == 4


def test_plugin_decoder_matches_the_reference(fake: FakeDecoderPlugin, clip: bytes) -> None:
  frames = decode_annexb_to_tensors_auto(clip, dtype=dtypes.uint8, normalize=False, color_space="bt601")
  for (ts, t), (y, cb, cr, bits, full, _m) in zip(frames, pyav_planes(clip)):
    want = reference_rgb(y, cb, cr, bits, full, "bt601", False, uint8=True)
    assert np.abs(t.numpy().astype(int) - want).max() <= 1, ts


def test_auto_falls_back_with_the_typed_reason(clip: bytes) -> None:
  import plugrt_cpu
  plugin = FakeDecoderPlugin(available=False)
  with isolated([plugrt_cpu, plugin]):
    seen: list[Exception] = []
    sentinel = object()
    assert decode_annexb_to_tensors_auto(clip, dtype=dtypes.uint8, normalize=False, fallback=lambda e: seen.append(e) or sentinel) is sentinel
    err = seen[0]
    assert isinstance(err, VideoDecoderUnavailable) and err.reason is Reason.NO_DEVICE and "no fake video engine" in err.reasons["FAKEDEC"]
    with pytest.raises(VideoDecoderUnavailable, match="FAKEDEC: no fake video engine here"):
      decode_annexb_to_tensors_auto(clip, dtype=dtypes.uint8, normalize=False)
    # the iterator's fallback: what it returns is iterated
    assert list(decode_annexb_iter(clip, dtype=dtypes.uint8, normalize=False, fallback=lambda e: [(0, "x")])) == [(0, "x")]
  refusing = FakeDecoderPlugin(refuse=True)
  with isolated([plugrt_cpu, refusing]):
    with pytest.raises(VideoDecoderUnavailable, match="cannot take Main10"):
      decode_annexb_to_tensors_auto(clip, dtype=dtypes.uint8, normalize=False)
  with isolated([plugrt_cpu, FakeDecoderPlugin()]):  # a device the decoder's surfaces are not on
    with pytest.raises(VideoDecoderUnavailable, match="not PYTHON"):
      decode_annexb_to_tensors_auto(clip, dtype=dtypes.uint8, normalize=False, device="PYTHON")


def test_argument_errors_raise_at_the_call(clip: bytes) -> None:
  with pytest.raises(VideoArgumentError, match="normalize=False"): decode_annexb_iter(clip, dtype=dtypes.uint8, normalize=True)
  with pytest.raises(VideoArgumentError, match="unknown color_space"):
    decode_annexb_iter(clip, dtype=dtypes.float32, normalize=True, color_space="srgb")
  with pytest.raises(TypeError): decode_annexb_iter("not bytes", dtype=dtypes.float32, normalize=True)  # type: ignore[arg-type]
  with pytest.raises(UnknownDeviceError, match="did you mean PYAV"):
    decode_annexb_to_tensors_auto(clip, dtype=dtypes.float32, normalize=True, decoder="PYAVV")


# ---------------------------------------------------------------- the software decoder, end to end

STREAMS = [(64, 48, 8, "bt709", False), (66, 34, 8, "bt601", True), (128, 72, 10, "bt2020", False), (98, 66, 10, None, True)]


@pytest.mark.parametrize("w, h, bits, tag, full", STREAMS, ids=lambda v: str(v))
def test_software_fallback_end_to_end(w: int, h: int, bits: int, tag: str | None, full: bool) -> None:
  """The contract's fallback path: no hardware decoder here, the software decoder through the same kernel."""
  stream = make_hevc(w, h, frames=5, bit_depth=bits, tag=tag, full_range=full)
  sw = lambda err: software_decode(stream, dtype=dtypes.uint8, normalize=False, device="CPU")
  with isolated([__import__("plugrt_cpu")]):
    frames = decode_annexb_to_tensors_auto(stream, dtype=dtypes.uint8, normalize=False, fallback=sw)
  ref = pyav_planes(stream)
  assert [ts for ts, _ in frames] == list(range(5)) and len(ref) == 5
  space = tag or ("bt601" if h < 720 else "bt709")  # untagged: the default for the size
  for (ts, t), (y, cb, cr, rbits, rfull, _m) in zip(frames, ref):
    assert t.shape == (h, w, 3) and (rbits, rfull) == (bits, full)
    want = reference_rgb(y, cb, cr, bits, full, space, False, uint8=True)
    assert np.abs(t.numpy().astype(int) - want).max() <= 1, f"frame {ts}"
  # and PyAV's own RGB conversion (swscale) agrees to a few levels
  ctx = av.CodecContext.create("hevc", "r")
  first = next(f for p in ctx.parse(stream) for f in ctx.decode(p))
  if bits == 8 and tag == "bt709" and not full:
    assert np.abs(first.to_ndarray(format="rgb24").astype(int) - frames[0][1].numpy()).mean() < 1.5


@pytest.mark.parametrize("device", ["CPU", "CL", "WEBGPU"])
def test_software_decode_on_other_devices(device: str, clip: bytes) -> None:
  try: Device[device]
  except Exception as e: pytest.skip(f"{device}: {e}")
  frames = software_decode(clip, dtype=dtypes.float32, normalize=True, device=device)
  ref = pyav_planes(clip)
  assert len(frames) == 6 and str(frames[0][1].device).split(":")[0] == device
  y, cb, cr, bits, full, _ = ref[3]
  assert np.abs(frames[3][1].numpy() - reference_rgb(y, cb, cr, bits, full, "bt709", True)).max() < 1e-5


def test_resolution_change_mid_stream() -> None:
  stream = make_hevc(64, 48, frames=3, tag="bt709") + make_hevc(96, 64, frames=4, tag="bt709", seed=1)
  frames = software_decode(stream, dtype=dtypes.uint8, normalize=False, device="CPU")
  assert [t.shape for _, t in frames] == [(48, 64, 3)] * 3 + [(64, 96, 3)] * 4
  assert [ts for ts, _ in frames] == list(range(7))


def test_truncated_and_garbage_streams(clip: bytes) -> None:
  units = list(hevc.split_nal_units(clip))
  slices = [u for u in units if u.is_vcl]
  cut = slices[3].offset + 4  # inside the 4th picture's slice: the pictures after it are gone
  with pytest.raises(VideoStreamError, match="pictures could not be decoded") as e:
    software_decode(clip[:cut], dtype=dtypes.uint8, normalize=False, device="CPU")
  assert 0 < e.value.offset <= cut
  with pytest.raises(VideoStreamError, match="no Annex B start code"):
    software_decode(b"\x17" * 500, dtype=dtypes.uint8, normalize=False, device="CPU")
  with pytest.raises(VideoStreamError, match="at byte"):
    software_decode(clip[:60], dtype=dtypes.uint8, normalize=False, device="CPU")
  rng = np.random.default_rng(5)
  for _ in range(20):  # corrupted bytes: frames, or a typed error, never anything else
    bad = bytearray(clip)
    for i in rng.integers(100, len(bad), 8): bad[i] = int(rng.integers(0, 256))
    try: software_decode(bytes(bad), dtype=dtypes.uint8, normalize=False, device="CPU")
    except VideoStreamError: pass
