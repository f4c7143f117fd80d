"""The NV video engine path against the fake GPU (fake_gpu.py): the real decoder (plugrt_nv.nvvideo) opens the video
channel, writes picture setups and slices, and submits the engine's methods; the fake reads all of it back the way
the class headers document it, "decodes" each picture with PyAV (matched by its slice bytes) and writes it block
linear where the methods point; the detile and conversion kernels (real cubins) run through the reference
interpreter. Every frame must equal PyAV's own decode through the same conversion."""
from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from fake_gpu import HOPPER, FakeGPU, block_linear
from test_nv_fake import fake_plugins

import plugrt_nv
from plugrt import Buffer, Device, dtypes
from plugrt.errors import VideoDecoderUnavailable
from plugrt.hookspecs import Probe, hookimpl
from plugrt.video import decode_annexb_iter, decode_annexb_to_tensors_auto, hevc
from plugrt.video.convert import kernel as convert_kernel
from plugrt_nv import nvdec
from plugrt_nv.nvvideo import detile_kernel
from plugrt_nvidia_toolchain import ptxas

av = pytest.importorskip("av")
from plugrt_testing.video import make_hevc, pyav_planes, reference_rgb  # noqa: E402

needs_ptxas = pytest.mark.skipif(ptxas.path(os.environ) is None, reason="ptxas is not installed (pip install nvidia-cuda-nvcc)")


@pytest.mark.parametrize("sample,bits", [(dtypes.uint8, 8), (dtypes.uint16, 10)])
def test_detile_kernel_on_the_cpu(sample, bits):
  """The detile kernel against the GOB layout written out in numpy (fake_gpu.block_linear), with a picture whose
  width is not a multiple of 64 and whose height is not a multiple of 16."""
  w, h = 200, 90
  lay = nvdec.layout(w, h, bits)
  rng = np.random.default_rng(3)
  et = np.uint8 if bits == 8 else np.uint16
  top = 1 << 16 if bits > 8 else 256
  y, uv = rng.integers(0, top, (h, w)).astype(et), rng.integers(0, top, ((h + 1) // 2, w)).astype(et)
  blocks = np.zeros(lay.surface_size, np.uint8)
  for plane, base in ((y, 0), (uv, lay.chroma_offset)):
    rows, cols = np.mgrid[0:plane.shape[0], 0:plane.shape[1] * plane.itemsize]
    blocks[base + block_linear(cols.ravel(), rows.ravel(), lay.pitch)] = plane.view(np.uint8).ravel()
  dev = Device["CPU"]
  src = Buffer(dev, lay.surface_size // np.dtype(et).itemsize, sample).copyin(blocks.view(et))
  rows = h + (h + 1) // 2
  out = Buffer(dev, w * rows, sample)
  dev.program(detile_kernel(sample))(out, src, global_size=(-(-w // 16), -(-rows // 16), 1), local_size=(16, 16, 1),
                                     vals=(w, h, rows, lay.pitch, lay.chroma_offset, 0 if bits == 8 else 1))
  got = out.numpy().reshape(rows, w)
  assert np.array_equal(got[:h], y) and np.array_equal(got[h:], uv)


def _stream_pictures(stream: bytes) -> dict[bytes, tuple[np.ndarray, np.ndarray]]:
  """Each picture's slice bytes (as the engine gets them) -> its decoded planes, from PyAV (decode order through pts)."""
  aus = list(hevc.access_units(hevc.split_nal_units(stream)))
  ctx = av.CodecContext.create("hevc", "r")
  frames = []
  for k, au in enumerate(aus):
    pkt = av.Packet(b"".join(b"\0\0\1" + u.data for u in au))
    pkt.pts = k
    frames += ctx.decode(pkt)
  frames += ctx.decode(None)
  by_pts = {f.pts: f for f in frames}
  out = {}
  for k, au in enumerate(aus):
    f = by_pts[k]
    ten = "p10" in f.format.name  # (yuvj420p: full-range 8 bits)
    et = np.uint16 if ten else np.uint8
    planes = [np.frombuffer(p, et).reshape(-1, p.line_size // np.dtype(et).itemsize) for p in f.planes]
    y = planes[0][:f.height, :f.width]
    cb, cr = (p[:(f.height + 1) // 2, :(f.width + 1) // 2] for p in planes[1:])
    uv = np.stack([cb, cr], -1).reshape(cb.shape[0], -1)
    if ten: y, uv = y << 6, uv << 6  # P016: the 10 bits at the top
    out[b"".join(b"\0\0\1" + u.data for u in au if u.is_vcl)] = (np.ascontiguousarray(y), np.ascontiguousarray(uv))
  return out


@pytest.fixture
def fake_nv(plugrt_registry, monkeypatch):
  monkeypatch.setenv("PLUGRT_NV_TIMEOUT", "20")
  gpu = FakeGPU()
  plugins = fake_plugins(gpu)
  plugins[0].plugrt_video_decoders = hookimpl(lambda: [plugrt_nv.plugrt_video_decoders()[0]._replace(probe=lambda: Probe.found(1, "fake"))])
  with plugrt_registry(plugins, env={"NV": "1", "NV_PTX": "1", "PLUGRT_CACHE": "0", "PLUGRT_NV_TIMEOUT": "20"}) as reg:
    dev = reg.open("NV")
    yield gpu, dev
  gpu.close()


def _load_kernels(gpu: FakeGPU, dev, sample) -> None:
  for k in (detile_kernel(sample), convert_kernel(sample, dtypes.uint8)): gpu.load(dev.program(k), k)


@needs_ptxas
@pytest.mark.parametrize("case", ["cropped-full-range", "resolution-change"])
def test_cropping_and_a_resolution_change_through_the_fake_engine(fake_nv, case):
  gpu, dev = fake_nv
  stream = make_hevc(202, 146, frames=5, tag="bt601", full_range=True) if case.startswith("cropped") else \
    make_hevc(160, 144, frames=4, tag="bt709") + make_hevc(192, 160, frames=5, tag="bt709", seed=3)
  pictures = _stream_pictures(stream)
  gpu.video_decode = lambda pic, bits_: pictures[bits_]
  _load_kernels(gpu, dev, dtypes.uint8)
  got = [t.numpy() for _, t in decode_annexb_iter(stream, dtype=dtypes.uint8, normalize=False, device="NV")]
  want = [reference_rgb(y, cb, cr, b, fr, "bt601" if case.startswith("cropped") else "bt709", False, uint8=True)
          for y, cb, cr, b, fr, _ in pyav_planes(stream)]
  assert [g.shape for g in got] == [w.shape for w in want]
  for g, w in zip(got, want): assert np.abs(g.astype(int) - w.astype(int)).max() <= 1


@needs_ptxas
@pytest.mark.parametrize("bits", [8, 10])
def test_decode_through_the_fake_engine(fake_nv, bits):
  gpu, dev = fake_nv
  stream = make_hevc(160, 144, frames=7, bit_depth=bits, tag="bt709", params="bframes=3")
  pictures = _stream_pictures(stream)
  gpu.video_decode = lambda pic, bits_: pictures[bits_]
  _load_kernels(gpu, dev, dtypes.uint8 if bits == 8 else dtypes.uint16)
  got = [t.numpy() for _, t in decode_annexb_iter(stream, dtype=dtypes.uint8, normalize=False, device="NV")]
  want = [reference_rgb(y, cb, cr, b, fr, "bt709", False, uint8=True) for y, cb, cr, b, fr, _ in pyav_planes(stream)]
  assert len(got) == len(want) == 7
  for g, w in zip(got, want): assert np.abs(g.astype(int) - w.astype(int)).max() <= 1
  # what the engine was given: the class on its subchannel, one EXECUTE per picture with its own setup and slices
  seen = [(m & 0xFFFF, m >> 16, v) for ch, m, v in gpu.log if ch == "video"]
  assert (0, nvdec.SUBCH_VIDEO, 0xB8B0) in seen and sum(1 for m, _, _ in seen if m == nvdec.Method.EXECUTE) == 7
  assert {(m, v) for m, _, v in seen if m in (nvdec.Method.SET_APPLICATION_ID, nvdec.Method.SET_CONTROL_PARAMS)} == {
    (nvdec.Method.SET_APPLICATION_ID, 7), (nvdec.Method.SET_CONTROL_PARAMS, nvdec.control_params())}
  lay = nvdec.layout(160, 144, bits)
  # the engine takes init_qp with QpBdOffsetY added (26 + init_qp_minus26 + 6 * (bits - 8)) and is told to write
  # 10-bit samples for a Main10 stream: the two fields the H200's error 0x5 on 10 bits came from (nvdec_drv.h)
  init_qp = {p.init_qp for p in hevc.scan(stream).pps.values()}
  for pic, bitstream, st in gpu.pictures:
    assert (pic.pic_width_in_luma_samples, pic.bit_depth_luma, pic.framestride[0], pic.stream_len) == \
      (160, bits, lay.pitch // (2 if bits > 8 else 1), len(bitstream))  # the row stride in samples
    assert pic.init_qp in {q + 6 * (bits - 8) for q in init_qp} and pic.disp_output_mode == (bits > 8)
    setup = st[(nvdec.SUBCH_VIDEO, nvdec.Method.SET_DRV_PIC_SETUP_OFFSET)]
    assert st[(nvdec.SUBCH_VIDEO, nvdec.Method.HEVC_SET_TILE_SIZES_OFFSET)] == setup + (nvdec.PIC_SETUP_SIZE >> 8)
    assert st[(nvdec.SUBCH_VIDEO, nvdec.Method.SET_NVDEC_STATUS_OFFSET)] == setup + (nvdec.STATUS_OFFSET >> 8)
    for i in range(16):  # every picture the setup refers to has its surface set, luma then chroma
      if pic.RefDiffPicOrderCnts[i] or i == pic.curr_pic_idx:
        luma = st[(nvdec.SUBCH_VIDEO, nvdec.Method.SET_PICTURE_LUMA_OFFSET0 + 4 * i)]
        assert st[(nvdec.SUBCH_VIDEO, nvdec.Method.SET_PICTURE_CHROMA_OFFSET0 + 4 * i)] == luma + (lay.chroma_offset >> 8)


@needs_ptxas
def test_engine_errors_and_refusals(fake_nv):
  gpu, dev = fake_nv
  stream = make_hevc(160, 144, frames=3)
  pictures = _stream_pictures(stream)
  gpu.video_decode = lambda pic, bits_: pictures[bits_]
  _load_kernels(gpu, dev, dtypes.uint8)
  # a status the engine reports as an error is a VideoStreamError naming the picture's offset
  orig = gpu._video_execute

  def failing(st):
    orig(st)
    status = (st[(nvdec.SUBCH_VIDEO, nvdec.Method.SET_NVDEC_STATUS_OFFSET)] << 8)
    nvdec.STATUS.from_address(status).error_status = 5
  gpu._video_execute = failing
  from plugrt.errors import VideoStreamError
  with pytest.raises(VideoStreamError, match="error status 0x5") as e:
    list(decode_annexb_iter(stream, dtype=dtypes.uint8, normalize=False, device="NV"))
  assert e.value.offset in [u.offset for u in hevc.split_nal_units(stream) if u.is_vcl]
  gpu._video_execute = orig
  # a stream the engine path does not take falls back
  small = make_hevc(96, 96, frames=2)
  got = decode_annexb_to_tensors_auto(small, dtype=dtypes.uint8, normalize=False, device="NV", fallback=lambda err: ("fallback", err))
  assert got[0] == "fallback" and isinstance(got[1], VideoDecoderUnavailable) and "96x96" in str(got[1])


def test_no_video_class_is_a_typed_refusal():
  gpu = FakeGPU(HOPPER - {0xB8B0})
  assert gpu.classes.video == 0
  with pytest.raises(Exception, match="no video decoder class"): gpu.video_channel(64)
  gpu.close()


def test_the_decoder_probe_says_where_it_decoded(monkeypatch: pytest.MonkeyPatch) -> None:
  """Where NV opens, NV_NVDEC is listed as usable and says plainly on which GPUs it has decoded (H200s only)."""
  import plugrt_nv
  from plugrt.hookspecs import Probe
  monkeypatch.setattr(plugrt_nv, "probe_nv", lambda ctx: Probe.found(1, "1 GPU"))
  p = plugrt_nv.probe_nv_video(None)  # type: ignore[arg-type]
  assert p.ok and "decoded on H200s" in p.detail and "not run on other GPUs" in p.detail and "docs/video.md" in p.detail
  monkeypatch.setattr(plugrt_nv, "probe_nv", lambda ctx: Probe.missing(plugrt_nv.Reason.NO_DEVICE, "no driver"))
  assert plugrt_nv.probe_nv_video(None).detail == "no driver"  # type: ignore[arg-type]


@pytest.mark.parametrize("engines, chosen", [([0x13, 0x14, 0x1A], 0), ([0x01, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x1A], 1), ([0x01, 0x0E], None)])
def test_the_video_channel_names_a_decoder_the_gpu_has(engines, chosen):
  """NVK's video channel asks RM which engines the GPU has and puts the channel group, the channel and the decoder
  object on the lowest NVDEC there is: an H100 has seven of GH100's eight, and naming a missing NVDEC0 is what RM
  refused on it (docs/video.md). Checked on the RM calls plugrt makes, against a stand-in for the driver."""
  from plugrt_nv import nvdec
  from plugrt_nv.iface import Mem, NVError
  from plugrt_nv_nvk import nvk, rm

  calls: list[tuple[str, Any]] = []
  gpu = object.__new__(nvk.NVKInterface)
  gpu.classes = SimpleNamespace(video=0xB8B0, gpfifo=0xC86F, family=SimpleNamespace(name="Hopper", video=(0xB8B0,)))
  gpu.video, gpu.video_engine, gpu.notifiers, gpu.device, gpu.subdevice, gpu.root, gpu.virtmem = 0, -1, [], 2, 3, 1, 4
  gpu.L = rm.layout(580)
  gpu.alloc = lambda size, kind="device": Mem(0x7000_0000, size, 0, {"handle": 9})
  gpu._map_to_cpu = lambda *a, **k: (_ for _ in ()).throw(NVError("no CPU mapping in this test"))

  def control(obj, cmd, params, what):
    calls.append(("control", cmd))
    if cmd == rm.CTRL_GPU_GET_ENGINES_V2:
      params.engineCount = len(engines)
      for i, e in enumerate(engines): params.engineList[i] = e
    return params

  def rm_alloc(parent, cls, params, root=None, what=""):
    calls.append(("alloc", cls, getattr(params, "engineType", None), getattr(params, "engineInstance", None)))
    return 100 + len(calls)
  gpu.control, gpu.rm_alloc = control, rm_alloc
  if chosen is None:
    with pytest.raises(NVError, match="no video decode engine"): gpu.video_channel(64)
    return
  gpu.video_channel(64)
  allocs = [c for c in calls if c[0] == "alloc" and c[1] != rm.MEMORY_SYSTEM]
  assert [(c[1], c[2]) for c in allocs[:2]] == [(rm.CHANNEL_GROUP, nvdec.ENGINE_NVDEC0 + chosen), (0xC86F, nvdec.ENGINE_NVDEC0 + chosen)]
  assert allocs[2][1] == 0xB8B0 and allocs[2][3] == chosen and gpu.video_engine == chosen
