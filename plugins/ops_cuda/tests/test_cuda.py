"""The CUDA backend. Without a GPU: the CUDA C renderer's output compiles with nvcc, and plugrt explains why CUDA
is unavailable. With one (marker `gpu`, run on the lent H100/H200 by scripts/gpu-check.sh): the conformance
suite on both compilers, launches, events, graphs, peer-free copies, and zero-copy interop with torch and cupy."""
import subprocess

import numpy as np
import pytest
from cuda_tools import toolkit_program

from plugrt import Buffer, Device, Tensor, dtypes
from plugrt.compiler import samples as K
from plugrt.errors import DeviceUnavailable, Reason, UnsupportedError
from plugrt_nvidia_toolchain.cuda_c import PRELUDE, CUDARenderer
from plugrt_testing.conformance import ConformanceSuite


def has_gpu() -> bool:
  return Device.registry.probe("CUDA").ok


gpu = pytest.mark.gpu
needs_gpu = pytest.mark.skipif(not has_gpu(), reason="no NVIDIA GPU here (run scripts/gpu-check.sh on the GPU machine)")


# ---------------------------------------------------------------- without a GPU

@pytest.mark.skipif(toolkit_program("nvcc") is None, reason="nvcc is not installed (pip install nvidia-cuda-nvcc, see requirements-test.txt)")
@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
def test_rendered_cuda_c_compiles_with_nvcc(tmp_path, arch):
  """Every conformance kernel, as CUDA C, in one translation unit (one nvcc run)."""
  r = CUDARenderer()
  bodies = []
  for i, case in enumerate(K.all_cases()):
    src = r.render(case.kernel)
    assert src.count(PRELUDE) == 1 and 'extern "C" __global__ void ' + case.kernel.name + "(" in src
    bodies.append(src.split(PRELUDE, 1)[1].replace(f"void {case.kernel.name}(", f"void k{i}_{case.kernel.name}(", 1))
  path = tmp_path / "all.cu"
  path.write_text(PRELUDE + "\n".join(bodies))
  cmd = [toolkit_program("nvcc"), f"-arch={arch}", "-c", str(path), "-o", str(tmp_path / "all.o"), "-diag-suppress", "177"]
  p = subprocess.run(cmd, capture_output=True, text=True)
  assert p.returncode == 0, p.stderr[-3000:]


def test_renderer_details():
  r = CUDARenderer()
  src = r.render(K.scalar_case(dtypes.float16).kernel)
  assert "unsigned short s_raw" in src and "float s = __plugrt_h2f(s_raw);" in src  # 16-bit floats arrive as raw bits
  b = K.KernelBuilder("lits")
  o, o64 = b.buffer("o", dtypes.float32), b.buffer("o64", dtypes.float64)
  o[0], o[1], o64[0] = b.const(float("inf"), dtypes.float32), b.const(float("nan"), dtypes.float32), b.const(float("-inf"), dtypes.float64)
  src = r.render(b.finish())
  assert "__int_as_float(2139095040)" in src and "__longlong_as_double(-4503599627370496LL)" in src
  assert "((int)blockIdx.x)" in r.render(K.grid3d_case().kernel) and "__syncthreads();" in r.render(K.reverse_case().kernel)


def test_unavailable_without_a_gpu():
  if has_gpu(): pytest.skip("there is a GPU here")
  p = Device.registry.probe("CUDA")
  assert p.reason is Reason.NO_DEVICE and ("/dev/nvidia0" in p.detail or "libcuda" in p.detail) and p.hint
  with pytest.raises(DeviceUnavailable, match=r"\[no device\]"): Device["CUDA"]


# ---------------------------------------------------------------- on a GPU

@gpu
class TestCUDA(ConformanceSuite):
  device = "CUDA"
  hardware_optional = True  # skips (saying why) where there is no NVIDIA GPU; a broken plugin still fails


@gpu
@needs_gpu
def test_launch_argument_caching_and_events():
  dev = Device["CUDA"]
  prg = dev.program(K.saxpy_kernel())
  n = 1 << 20
  x, y, out = Buffer.from_numpy(np.arange(n, dtype=np.float32), dev), Buffer.from_numpy(np.ones(n, np.float32), dev), Buffer(dev, n, dtypes.float32)
  t = prg(out, x, y, global_size=(n // 256, 1, 1), local_size=(256, 1, 1), vals=(2.0, n), wait=True)
  assert isinstance(t, float) and 0 < t < 1
  assert prg(out, x, y, global_size=(n // 256, 1, 1), local_size=(256, 1, 1), vals=(2.0, n)) is None  # no argument rewrite
  assert np.array_equal(out.numpy(), 2 * np.arange(n, dtype=np.float32) + 1)
  with pytest.raises(ValueError, match="threads per group"): prg(out, x, y, local_size=(2048, 1, 1), vals=(2.0, n))


@gpu
@needs_gpu
def test_graph_replays_a_batch():
  from plugrt.runtime import Launch
  dev = Device["CUDA"]
  b = K.KernelBuilder("inc")
  buf = b.buffer("buf", dtypes.int32)
  i = b.global_id(0)
  buf[i] = buf[i] + 1
  prg = dev.program(b.finish())
  data = Buffer.from_numpy(np.zeros(256, np.int32), dev)
  graph = dev.graph([Launch(prg, [data], (1, 1, 1), (256, 1, 1)) for _ in range(100)])
  assert type(graph).__name__ == "CUDAGraph"
  assert isinstance(graph(wait=True), float)
  graph()
  assert data.numpy().tolist() == [200] * 256


@gpu
@needs_gpu
def test_torch_zero_copy_the_seed_example():
  torch = pytest.importorskip("torch")
  t = torch.ones(1000, device="cuda", dtype=torch.float32)
  x = Tensor.from_blob(t.data_ptr(), t.shape, dtype=dtypes.float32, device="CUDA", keepalive=t)
  y = (x + 1).realize()
  assert y.tolist()[:3] == [2.0, 2.0, 2.0] and t[0].item() == 1.0
  x.assign(x + 1)  # written through plugrt, seen through torch
  torch.cuda.synchronize()
  assert torch.all(t == 2).item()
  t.mul_(3)  # written through torch, seen through plugrt
  torch.cuda.synchronize()
  assert x.tolist()[:2] == [6.0, 6.0]
  via_dlpack = torch.from_dlpack(Tensor.from_dlpack(t) * 2)
  assert via_dlpack.is_cuda and via_dlpack[0].item() == 12.0
  with pytest.raises(UnsupportedError, match="not CUDA device memory"):
    host = np.zeros(4, np.float32)
    Tensor.from_blob(host.ctypes.data, (4,), dtype=dtypes.float32, device="CUDA")


@gpu
@needs_gpu
def test_cupy_zero_copy():
  cp = pytest.importorskip("cupy")
  a = cp.arange(8, dtype=cp.float32)
  t = Tensor.from_dlpack(a)
  assert t.device == "CUDA" and t.tolist() == list(range(8))
  a[0] = 42
  assert t.tolist()[0] == 42
  back = cp.from_dlpack(t * 2)
  assert back.tolist()[0] == 84.0
  wrapped = Tensor.from_blob(a.data.ptr, (8,), dtype=dtypes.float32, device="CUDA", keepalive=a)
  wrapped.assign(0)
  assert float(a.sum()) == 0.0


@gpu
@needs_gpu
def test_pinned_host_arrays_and_staged_copies():
  dev = Device["CUDA"]
  n = 24 << 20  # above the staging threshold, several chunks
  pinned = dev.host_array(n, dtypes.uint8)
  assert dev.allocator._pinned(pinned.ctypes.data) and not dev.allocator._pinned(np.empty(16).ctypes.data)
  pinned[:] = np.random.default_rng(1).integers(0, 255, n, dtype=np.uint8)
  buf = Buffer(dev, n, dtypes.uint8).copyin(pinned)  # straight DMA
  pageable = np.empty(n, np.uint8)
  buf.copyout(pageable)  # through the staging ring
  assert np.array_equal(pageable, pinned)
  pageable[::7] += 1
  buf.copyin(pageable)  # staged
  back = dev.host_array(n, dtypes.uint8)
  buf.copyout(back)
  assert np.array_equal(back, pageable)
