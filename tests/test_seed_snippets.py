"""The seeds' user-facing snippets (the tinygrad runtime documentation plugrt re-implements) run with nothing changed
but the import root, `tinygrad` -> `plugrt`, so a rename can never break them again.

The snippets are held below as the seeds write them, with `plugrt` as the root; each test runs one with `exec` in a
namespace holding what the seeds' page leaves to the reader (torch, the `cl` binding and its context, the app's own
`consume_frame` and `software_decode`), and then checks what it made. The seeds' `tinygrad.runtime.cuvid` module is
plugrt's `plugrt.video` (re-exported by `plugrt_cuda.cuvid`): plugrt has no `plugrt.runtime` package to hold it.

- torch interop: `from_blob` of a torch tensor's memory on CPU here, and on CUDA on the GPU run (marked gpu);
- QCOM interop, buffer and image: on the fake KGSL, with plugins/ops_qcom/tests/qcom_cl_standin.py as the `cl` module
  (Qualcomm's driver object layout: the GPU address at byte 0xA0);
- NVDEC: through its fallback here (no NVIDIA GPU), through NVDEC on the GPU run (marked gpu).
"""
from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from plugrt import Device

REPO = Path(__file__).resolve().parents[1]

# ---------------------------------------------------------------- the snippets, as the seeds write them

#: the seeds' `CUDA`/`METAL` PyTorch interoperability snippet
TORCH = '''\
from plugrt.dtype import _from_torch_dtype
tensor1 = torch.tensor([1.0, 2.0, 3.0], device=torch.device("cuda"))
tiny_tensor1 = Tensor.from_blob(tensor1.data_ptr(), tensor1.shape, dtype=_from_torch_dtype(tensor1.dtype), device='CUDA')

# Before tinygrad calculations, mps needs to be synchronized to make sure data is valid.
if data.device.type == "mps": torch.mps.synchronize()
else: torch.cuda.synchronize()

x = (tiny_tensor1 + 1).realize()
'''

#: the imports the seeds' page assumes above its QCOM snippets
QCOM_IMPORTS = '''\
import ctypes
from plugrt import Tensor, dtypes
from plugrt.helpers import to_mv
'''

#: the seeds' QCOM OpenCL buffer interop snippet
QCOM_BUFFER = '''\
# create raw opencl buffer.
cl_buf = cl.clCreateBuffer(cl_context, cl.CL_MEM_READ_WRITE, 0x100, None, status := ctypes.c_int32())

# extract pointers
cl_buf_desc_ptr = to_mv(ctypes.addressof(cl_buf), 8).cast('Q')[0]
rawbuf_ptr = to_mv(cl_buf_desc_ptr, 0x100).cast('Q')[20] # offset 0xA0 is a raw gpu pointer.

# create tiny tensor
tiny = Tensor.from_blob(rawbuf_ptr, (8, 8), dtype=dtypes.int, device='QCOM')
'''

#: the seeds' QCOM OpenCL image interop snippet
QCOM_IMAGE = '''\
# create cl image.
cl_img = cl.clCreateImage2D(cl_context, cl.CL_MEM_READ_WRITE, cl.cl_image_format(cl.CL_RGBA, cl.CL_FLOAT), w, h, 0, None, status := ctypes.c_int32())

# extract pointers
cl_buf_desc_ptr = to_mv(ctypes.addressof(cl_img), 8).cast('Q')[0]
rawbuf_ptr = to_mv(cl_buf_desc_ptr, 0x100).cast('Q')[20] # offset 0xA0 is a raw gpu pointer.

# create tiny tensor
tiny = Tensor.from_blob(rawbuf_ptr, (h*w*4,), dtype=dtypes.imagef((h,w)), device='QCOM')
'''

#: the seeds' NVDEC example (tabs as theirs), in its two statements: the lazy iterator (no fallback: NVDEC or an error),
#: and the eager call with a fallback
NVDEC_ITER = '''\
from plugrt.video import decode_annexb_iter, decode_annexb_to_tensors_auto
from plugrt.dtype import dtypes

with open("sample.hevc", "rb") as fh:
\tstream = fh.read()

for timestamp, tensor in decode_annexb_iter(stream, dtype=dtypes.float16, normalize=True, color_space="bt2020"):
\tframe_cpu = tensor.to("CPU").numpy()
\tconsume_frame(timestamp, frame_cpu)
'''
NVDEC_AUTO = '''\
frames = decode_annexb_to_tensors_auto(stream, dtype=dtypes.uint8, normalize=False,
\t\t\t\t\t\t\t\t\t\t\t fallback=lambda err: software_decode(stream))
'''


def test_the_snippets_use_the_import_root_only():
  """What the seeds import, plugrt provides under the same names (tinygrad.runtime.cuvid is plugrt.video)."""
  from plugrt.dtype import _from_torch_dtype, _to_torch_dtype, dtypes
  from plugrt.helpers import to_mv
  assert _from_torch_dtype == dtypes.from_torch and _to_torch_dtype == dtypes.to_torch and callable(to_mv)
  for snippet in (TORCH, QCOM_IMPORTS, QCOM_BUFFER, QCOM_IMAGE, NVDEC_ITER, NVDEC_AUTO):
    compile(snippet, "snippet", "exec")
    assert "tinygrad." not in snippet.replace("tinygrad calculations", "")


def test_to_mv_is_a_writable_view_of_raw_memory_and_refuses_bad_arguments():
  from plugrt.helpers import to_mv
  words = (ctypes.c_uint64 * 4)(7, 8, 9, 10)
  mv = to_mv(ctypes.addressof(words), 32)
  assert mv.format == "B" and not mv.readonly and mv.nbytes == 32 and mv.cast("Q").tolist() == [7, 8, 9, 10]
  mv.cast("Q")[2] = 99  # the same memory, not a copy
  assert words[2] == 99
  handle = ctypes.c_void_p(ctypes.addressof(words))
  assert to_mv(ctypes.addressof(handle), 8).cast("Q")[0] == ctypes.addressof(words)  # what a handle points at
  assert to_mv(ctypes.addressof(words), 0).nbytes == 0
  for ptr in (0, -1, 1 << 64, 1.5, True, None, "0x1000"):
    with pytest.raises(TypeError, match="ptr must be an address"): to_mv(ptr, 8)  # type: ignore[arg-type]
  with pytest.raises(TypeError, match="size must be an int"): to_mv(ctypes.addressof(words), 8.0)  # type: ignore[arg-type]
  with pytest.raises(ValueError, match="must not be negative"): to_mv(ctypes.addressof(words), -1)
  with pytest.raises(ValueError, match="past the end"): to_mv((1 << 64) - 8, 16)


# ---------------------------------------------------------------- torch

class _SeedNames(dict):
  """The snippet's namespace. The seeds' torch snippet synchronises `data`, its name for the torch tensor it made as
  `tensor1` (and never defines): that name reads the snippet's own tensor."""
  def __missing__(self, key: str) -> Any:
    if key == "data": return self["tensor1"]
    raise KeyError(key)


def _run_torch_snippet(torch_device: str, device: str) -> dict:
  torch = pytest.importorskip("torch")
  from plugrt import Tensor
  code = TORCH.replace('torch.device("cuda")', f'torch.device("{torch_device}")').replace("device='CUDA'", f"device='{device}'")
  if torch_device == "cpu":  # CPU memory needs no synchronising, and torch.cuda.synchronize() needs CUDA: those two lines go
    code = code.replace('if data.device.type == "mps": torch.mps.synchronize()\nelse: torch.cuda.synchronize()\n', "")
  names = _SeedNames()
  exec(compile(code, f"torch snippet on {device}", "exec"), {"torch": torch, "Tensor": Tensor}, names)
  assert names["x"].numpy().tolist() == [2.0, 3.0, 4.0]
  assert names["tiny_tensor1"].dtype is names["_from_torch_dtype"](torch.float32)
  names["tensor1"][1] = 20.0  # the tensor wraps torch's memory: no copy
  if torch_device == "cuda": torch.cuda.synchronize()
  assert names["tiny_tensor1"].numpy().tolist() == [1.0, 20.0, 3.0]
  return names


def test_torch_snippet_on_cpu():
  if "CPU" not in Device.available(): pytest.skip("no CPU device here")
  _run_torch_snippet("cpu", "CPU")


@pytest.mark.gpu
def test_torch_snippet_on_cuda():
  torch = pytest.importorskip("torch")
  if not torch.cuda.is_available(): pytest.skip("this torch has no CUDA device")
  if "CUDA" not in Device.available(): pytest.skip("no CUDA device for plugrt here")
  _run_torch_snippet("cuda", "CUDA")


# ---------------------------------------------------------------- QCOM, on the fake KGSL

@pytest.fixture
def qcom(monkeypatch: pytest.MonkeyPatch) -> Any:
  """(the stand-in `cl` module, a context on QCOM, the device), QCOM opened on the fake KGSL as the process's device."""
  pytest.importorskip("plugrt_qcom")
  monkeypatch.syspath_prepend(str(REPO / "plugins" / "ops_qcom" / "tests"))
  import qcom_cl_standin as cl
  from qcom_fixtures import fake_qcom
  with fake_qcom() as (_, dev): yield cl, cl.clCreateContext(dev), dev


def _run_qcom(snippet: str, cl: Any, context: Any, **names: Any) -> dict:
  ns: dict = {"cl": cl, "cl_context": context, **names}
  exec(compile(QCOM_IMPORTS + snippet, "QCOM snippet", "exec"), ns)
  assert ns["status"].value == cl.CL_SUCCESS and ns["rawbuf_ptr"] == cl.gpu_address(ns.get("cl_buf", ns.get("cl_img")))
  return ns


def test_qcom_buffer_snippet(qcom):
  cl, context, _ = qcom
  ns = _run_qcom(QCOM_BUFFER, cl, context)
  addr, tiny = ns["rawbuf_ptr"], ns["tiny"]
  data = np.arange(64, dtype=np.int32).reshape(8, 8) * 3 - 50
  ctypes.memmove(addr, data.ctypes.data, data.nbytes)  # what an OpenCL kernel of the app wrote
  assert tiny.shape == (8, 8) and np.array_equal(tiny.numpy(), data)
  tiny.assign(tiny * 2 + 1)  # and what plugrt writes, the app's cl_mem holds
  assert np.array_equal(np.frombuffer(ctypes.string_at(addr, data.nbytes), np.int32).reshape(8, 8), data * 2 + 1)


def test_qcom_image_snippet(qcom):
  cl, context, _ = qcom
  from plugrt_qcom import cmd

  from plugrt.dtype import dtypes
  h, w = 3, 5  # rows of 80 bytes, padded as QCOM lays an image out
  ns = _run_qcom(QCOM_IMAGE, cl, context, h=h, w=w)
  addr, tiny = ns["rawbuf_ptr"], ns["tiny"]
  data = (np.arange(h * w * 4, dtype=np.float32) - 17) / 4
  pitch = cmd.image_pitch(dtypes.imagef((h, w)))
  for y, row in enumerate(data.reshape(h, w * 4)): ctypes.memmove(addr + y * pitch, row.ctypes.data, row.nbytes)
  assert tiny.shape == (h * w * 4,) and tiny.dtype is dtypes.imagef((h, w))
  assert np.array_equal(tiny.numpy(), data)
  assert np.array_equal((tiny + 1).numpy(), data + 1) and tiny.sum().item() == data.sum()  # its texels, read as float32
  assert np.array_equal(tiny.reshape(h, w, 4)[:, 1:, 2].numpy(), data.reshape(h, w, 4)[:, 1:, 2])


# ---------------------------------------------------------------- NVDEC

#: the sample's picture: the smallest NVDEC decodes (144x144 and up on the H200), so the GPU run decodes the same stream
W, H = 192, 144


def _nvdec_ready() -> bool:
  from plugrt.video import decoder_rows
  return any(r["decoder"] == "NVDEC" and r["available"] for r in decoder_rows())


def _nvdec_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[dict, list, list]:
  """The snippet's namespace, in a folder holding sample.hevc: the app's consume_frame and software_decode (each
  recording its calls), as the seeds' page leaves them to the reader."""
  pytest.importorskip("av")
  from plugrt import video
  from plugrt.dtype import dtypes
  from plugrt_testing.video import make_hevc
  (tmp_path / "sample.hevc").write_bytes(make_hevc(W, H, frames=4, tag="bt2020"))
  monkeypatch.chdir(tmp_path)
  consumed: list = []
  fallbacks: list = []

  def software_decode(stream: bytes) -> list:
    frames = video.software_decode(stream, dtype=dtypes.uint8, normalize=False)
    fallbacks.append(frames)
    return frames
  return {"consume_frame": lambda ts, frame: consumed.append((ts, frame)), "software_decode": software_decode}, consumed, fallbacks


def test_nvdec_snippet_through_its_fallback(tmp_path, monkeypatch):
  """Without NVDEC the lazy iterator (no fallback) raises the typed error naming the fallback, and the eager call
  returns what its fallback returns, unchanged."""
  from plugrt.errors import VideoDecoderUnavailable
  if _nvdec_ready(): pytest.skip("NVDEC is here: test_nvdec_snippet_on_nvdec runs the snippet through it")
  ns, consumed, fallbacks = _nvdec_names(tmp_path, monkeypatch)
  with pytest.raises(VideoDecoderUnavailable, match="no video decoder can decode this stream here") as info:
    exec(compile(NVDEC_ITER, "NVDEC snippet", "exec"), ns)
  assert "fallback" in info.value.hint and consumed == []
  exec(compile(NVDEC_AUTO, "NVDEC snippet", "exec"), ns)
  assert len(fallbacks) == 1 and ns["frames"] is fallbacks[0]
  assert [ts for ts, _ in ns["frames"]] == [0, 1, 2, 3]
  assert all(t.shape == (H, W, 3) and t.dtype.name == "uint8" for _, t in ns["frames"])


@pytest.mark.gpu
def test_nvdec_snippet_on_nvdec(tmp_path, monkeypatch):
  if not _nvdec_ready(): pytest.skip("no NVDEC here (plugrt-cuda on an NVIDIA GPU machine)")
  ns, consumed, fallbacks = _nvdec_names(tmp_path, monkeypatch)
  exec(compile(NVDEC_ITER + NVDEC_AUTO, "NVDEC snippet", "exec"), ns)
  assert [ts for ts, _ in consumed] == [0, 1, 2, 3] and all(f.shape == (H, W, 3) and f.dtype == np.float16 for _, f in consumed)
  assert fallbacks == [] and [ts for ts, _ in ns["frames"]] == [0, 1, 2, 3]
  assert all(t.shape == (H, W, 3) and t.device.startswith("CUDA") for _, t in ns["frames"])
  assert os.path.exists("sample.hevc")
