"""Two or more GPUs through NV (marker `gpu`; skipped with fewer): each index opens its own GPU (its own RM client,
channels and doorbell), kernels run on each, copies between them equal their source in both directions (staged through
host memory, and reported so: plugrt-nv maps no peer memory yet), and Tensor.to moves between them. Run by
`scripts/gpu-check.sh --only=multi`."""
from __future__ import annotations

import numpy as np
import pytest

import plugrt_nv
from plugrt import Buffer, Device, Tensor, dtypes
from plugrt.testing.kernels import saxpy_kernel


def nv_count() -> int:
  p = Device.registry.probe("NV")
  return p.count if p.ok else 0


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(nv_count() < 2, reason="needs two NVIDIA GPUs and the NV backend (run scripts/gpu-check.sh)")]
SIZES = [1, 4096 + 3, 1 << 20, (64 << 20) + 1]


@pytest.fixture(scope="module")
def gpus():
  return Device["NV:0"], Device["NV:1"]


def test_each_index_opens_its_own_gpu(gpus):
  g0, g1 = gpus
  i0, i1 = g0.info.state.iface, g1.info.state.iface
  assert g0 is not g1 and i0 is not i1 and i0.minor != i1.minor and i0.bus_id != i1.bus_id
  assert i0.doorbell != i1.doorbell
  listed = {d.index: d.bus_id for d in Device.registry.probe("NV").devices}
  if listed: assert (listed[0], listed[1]) == (i0.bus_id, i1.bus_id), "the probe's listing and NV's numbering differ"
  print(f"NV:0 {i0.description}\nNV:1 {i1.description}")


def test_kernels_run_on_both(gpus):
  rng = np.random.default_rng(0)
  n = 100_003
  x, y = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
  for i, dev in enumerate(gpus):
    out, bx, by = Buffer(dev, n), Buffer(dev, n).copyin(x), Buffer(dev, n).copyin(y)
    dev.program(saxpy_kernel())(out, bx, by, global_size=(-(-n // 256), 1, 1), local_size=(256, 1, 1), vals=(2.0 + i, n), wait=True)
    np.testing.assert_allclose(out.numpy(), (2.0 + i) * x + y, rtol=1e-6)


def test_copies_between_gpus_say_they_are_staged(gpus):
  g0, g1 = gpus
  assert g0.allocator.peer_path(g1).startswith("staged through host memory")
  assert Device.registry.probe("NV").info["copies between GPUs"] == plugrt_nv.STAGED_PEER


@pytest.mark.parametrize("nbytes", SIZES)
@pytest.mark.parametrize("direction", ["0->1", "1->0"])
def test_copy_between_gpus_equals_the_source(gpus, nbytes, direction):
  src_dev, dst_dev = gpus if direction == "0->1" else gpus[::-1]
  x = np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8)
  b = Buffer(src_dev, nbytes, dtypes.uint8).copyin(x).to(dst_dev)
  assert b.device is dst_dev and np.array_equal(b.numpy(), x)


def test_tensor_to_between_gpus(gpus):
  x = np.random.default_rng(3).standard_normal((64, 33)).astype(np.float32)
  t1 = (Tensor(x, device="NV:0") * 2).to("NV:1")
  assert t1.device == "NV:1"
  np.testing.assert_allclose((t1 + 1).numpy(), 2 * x + 1, rtol=1e-6)
  np.testing.assert_allclose(t1.to("NV:0").numpy(), 2 * x, rtol=1e-6)
