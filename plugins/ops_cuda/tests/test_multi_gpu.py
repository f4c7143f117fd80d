"""Two or more CUDA GPUs (marker `gpu`; skipped with fewer): each index opens its own GPU, kernels run on each, copies
between them (peer where the driver allows it, else staged and reported) equal their source in both directions, are
ordered against both GPUs' queued work, Tensor.to moves between GPUs, and CUDA_VISIBLE_DEVICES renumbers (in a
subprocess: the driver reads it once per process). Run by `scripts/gpu-check.sh --only=multi`."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from plugrt import Buffer, Device, Tensor, dtypes
from plugrt.compiler.samples import saxpy_kernel


def cuda_count() -> int:
  p = Device.registry.probe("CUDA")
  return p.count if p.ok else 0


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(cuda_count() < 2, reason="needs two CUDA GPUs (run scripts/gpu-check.sh on a 2-GPU machine)")]
SIZES = [1, 4096 + 3, 1 << 20, (64 << 20) + 1]  # bytes


@pytest.fixture(scope="module")
def gpus():
  return Device["CUDA:0"], Device["CUDA:1"]


def saxpy(dev, x: np.ndarray, y: np.ndarray, a: float) -> np.ndarray:
  n = x.size
  out, bx, by = Buffer(dev, n), Buffer(dev, n).copyin(x), Buffer(dev, n).copyin(y)
  dev.program(saxpy_kernel())(out, bx, by, global_size=(-(-n // 256), 1, 1), local_size=(256, 1, 1), vals=(a, n), wait=True)
  return out.numpy()


def test_each_index_opens_its_own_gpu(gpus):
  g0, g1 = gpus
  s0, s1 = g0.info.state, g1.info.state
  assert g0 is not g1 and s0.ctx.value != s1.ctx.value and s0.bus_id != s1.bus_id
  listed = {d.index: d.bus_id for d in Device.registry.probe("CUDA").devices}
  if listed: assert (listed[0], listed[1]) == (s0.bus_id, s1.bus_id), "the probe's listing and the driver's numbering differ"
  print(f"CUDA:0 {s0.name} at {s0.bus_id}; CUDA:1 {s1.name} at {s1.bus_id}; path 0->1: {g0.allocator.peer_path(g1)}")


def test_kernels_run_on_both(gpus):
  rng = np.random.default_rng(0)
  x, y = rng.standard_normal(100_003).astype(np.float32), rng.standard_normal(100_003).astype(np.float32)
  for i, dev in enumerate(gpus):
    np.testing.assert_allclose(saxpy(dev, x, y, 2.0 + i), (2.0 + i) * x + y, rtol=1e-6)


@pytest.mark.parametrize("nbytes", SIZES)
@pytest.mark.parametrize("direction", ["0->1", "1->0"])
def test_copy_between_gpus_equals_the_source(gpus, nbytes, direction):
  src_dev, dst_dev = gpus if direction == "0->1" else gpus[::-1]
  x = np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8)
  a = Buffer(src_dev, nbytes, dtypes.uint8).copyin(x)
  b = a.to(dst_dev)
  assert b.device is dst_dev and np.array_equal(b.numpy(), x)
  c = Buffer(dst_dev, nbytes - 1, dtypes.uint8) if nbytes > 1 else None
  if c is not None:  # an offset view as the source
    a.view(nbytes - 1, offset=1).copy_to(c)
    assert np.array_equal(c.numpy(), x[1:])


def test_peer_path_is_reported(gpus):
  g0, g1 = gpus
  for a, b in ((g0, g1), (g1, g0)):
    how = a.allocator.peer_path(b)
    assert how == "peer" or how.startswith("staged through host memory by the CUDA driver"), how


def test_copy_is_ordered_after_the_sources_kernel_and_before_its_next(gpus):
  """No synchronisation in between: the copy waits for the kernel writing its source, and a kernel queued on the
  source after the copy does not change what arrives."""
  g0, g1 = gpus
  n = 1 << 22
  x, y = np.arange(n, dtype=np.float32), np.ones(n, np.float32)
  prg = g0.program(saxpy_kernel())
  out, bx, by = Buffer(g0, n), Buffer(g0, n).copyin(x), Buffer(g0, n).copyin(y)
  dest = Buffer(g1, n)
  for _ in range(3):
    prg(out, bx, by, global_size=(n // 256, 1, 1), local_size=(256, 1, 1), vals=(3.0, n))
    out.copy_to(dest)  # right after the launch
    prg(out, bx, by, global_size=(n // 256, 1, 1), local_size=(256, 1, 1), vals=(-1.0, n))  # overwrites the source next
    np.testing.assert_array_equal(dest.numpy(), 3.0 * x + y)
    np.testing.assert_array_equal(out.numpy(), -x + y)


def test_tensor_to_between_gpus(gpus):
  x = np.random.default_rng(3).standard_normal((64, 33)).astype(np.float32)
  t0 = Tensor(x, device="CUDA:0")
  t1 = (t0 * 2).to("CUDA:1")
  assert t1.device == "CUDA:1"
  np.testing.assert_allclose((t1 + 1).numpy(), 2 * x + 1, rtol=1e-6)
  np.testing.assert_allclose(t1.to("CUDA:0").numpy(), 2 * x, rtol=1e-6)


def test_cuda_visible_devices_renumbers(gpus):
  """CUDA_VISIBLE_DEVICES=1: CUDA:0 is the second GPU, and CUDA:1 does not exist (the error names the count)."""
  if "CUDA_VISIBLE_DEVICES" in os.environ: pytest.skip("CUDA_VISIBLE_DEVICES is set already: the physical GPU 1 may not be CUDA:1 here")
  code = ("from plugrt import Device\nfrom plugrt.errors import DeviceUnavailable\nprint(Device['CUDA'].info.state.bus_id)\n"
          "try: Device['CUDA:1']\nexcept DeviceUnavailable as e: print(e.message)\n")
  env = {**os.environ, "CUDA_VISIBLE_DEVICES": "1"}
  r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
  assert r.returncode == 0, r.stderr[-2000:]
  bus, error = r.stdout.splitlines()[:2]
  assert bus == gpus[1].info.state.bus_id
  assert error.startswith("CUDA:1 does not exist: CUDA has 1 device here"), error
