"""Two or more GPUs through NV (marker `gpu`; skipped with fewer): each index opens its own GPU (its own device objects,
channels and doorbell, on the process's one RM client and UVM file), kernels run on each, copies between them go
through a peer mapping where the driver allows it (always on an NVLink pair) and equal their source in both
directions, ordered against kernels queued on the source before and after, and Tensor.to moves between them.
Run by `scripts/gpu-check.sh --only=multi`. NEVER RAN: the GPU machine has had one GPU."""
from __future__ import annotations

import numpy as np
import pytest

import plugrt_nv
from plugrt import Buffer, Device, Tensor, dtypes
from plugrt.compiler.samples import saxpy_kernel
from plugrt_nv.peer import STAGED


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


def nvlinked() -> bool:
  """Whether `nvidia-smi topo -m` joins GPU0 and GPU1 with NVLink (bench/multi_gpu.py reads the same matrix)."""
  import subprocess
  try: text = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=30).stdout
  except (OSError, subprocess.SubprocessError): return False
  row = next((line.split() for line in text.splitlines() if line.startswith("GPU0")), [])
  return len(row) > 2 and row[2].startswith("NV")


def test_copies_between_gpus_report_their_path(gpus):
  g0, g1 = gpus
  i0, i1 = g0.info.state.iface, g1.info.state.iface
  assert i0.client is i1.client and i0.root == i1.root and i0.uvm == i1.uvm  # one RM client and UVM file for both
  paths = g0.allocator.peer_path(g1), g1.allocator.peer_path(g0)
  print(f"NV path 0->1: {paths[0]}\nNV path 1->0: {paths[1]}")
  for p in paths: assert p == "peer" or p.startswith(STAGED + " ("), p
  if nvlinked(): assert paths == ("peer", "peer"), "an NVLink pair must copy through a peer mapping"
  assert Device.registry.probe("NV").info["copies between GPUs"] == plugrt_nv.PEER_PATH


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


def test_peer_copy_is_ordered_with_kernels_on_the_source(gpus):
  """A kernel queued on the source before the copy is seen by it; one queued after it does not change what it copies."""
  g0, g1 = gpus
  n = 16 << 20  # 64 MiB of float32: the copy takes long enough that a kernel not waiting for it would overtake it
  rng = np.random.default_rng(7)
  x, y = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
  out, bx, by = Buffer(g0, n), Buffer(g0, n).copyin(x), Buffer(g0, n).copyin(y)
  saxpy = g0.program(saxpy_kernel())
  grid = dict(global_size=(-(-n // 256), 1, 1), local_size=(256, 1, 1))
  saxpy(out, bx, by, **grid, vals=(2.0, n))  # queued, not waited for
  moved = out.to(g1)                          # must see the kernel's result
  saxpy(out, bx, by, **grid, vals=(-5.0, n))  # must not overwrite `out` before the copy has read it
  np.testing.assert_allclose(moved.numpy(), 2.0 * x + y, rtol=1e-6)
  np.testing.assert_allclose(out.numpy(), -5.0 * x + y, rtol=1e-6)
