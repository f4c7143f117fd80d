"""The KFD queue layer on a real AMD GPU (needs /dev/kfd; never run so far: no AMD hardware was available).
The same steps as test_kfd_queue.py's, against the driver: open, memory of each kind, an SDMA round trip, an AQL
barrier packet through the compute queue (no compiled kernel needed), and the queue teardown."""
from __future__ import annotations

import os

import numpy as np
import pytest

from plugrt_amd_kfd.kfdev import KFDDevice

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not os.path.exists("/dev/kfd"), reason="no /dev/kfd (no AMD GPU with the amdgpu driver)")]


def test_kfd_on_hardware():
  dev = KFDDevice(timeout=10)
  try:
    assert dev.node.arch.startswith("gfx") and dev.version >= (1, 6)
    data = np.random.default_rng(0).integers(0, 255, 3 << 20, np.uint8)
    src, back = dev.alloc(len(data), "gtt"), dev.alloc(len(data), "userptr")
    vram = dev.alloc(len(data), "vram", cpu=False)
    src.view()[:] = data.tobytes()
    s = dev.sdma_queue()
    s.copy(vram.va, src.va, len(data))
    s.wait(s.copy(back.va, vram.va, len(data)))
    assert bytes(back.view()) == data.tobytes()
    q = dev.compute_queue()
    q.wait(q.barrier())
    assert q.completed() == 1 and q.rptr.value == 1
  finally:
    dev.close()


def test_device_saxpy_on_hardware():
  """The AMD device through the installed plugins on a real GPU: AMD_LLVM's code object, AQL dispatch, SDMA copies."""
  from plugrt import Buffer, dtypes
  from plugrt.compiler import samples as K
  from plugrt.registry import Registry
  reg = Registry(env={**os.environ, "AMD": "1", "PLUGRT_AMD_TIMEOUT": "10"}).load()
  try:
    dev = reg.open("AMD")
    n = 1 << 16
    x = np.arange(n, dtype=np.float32)
    out, xb, yb = Buffer(dev, n, dtypes.float32), Buffer.from_numpy(x, dev), Buffer.from_numpy(2 * x, dev)
    dev.program(K.saxpy_kernel())(out, xb, yb, global_size=(n // 256, 1, 1), local_size=(256, 1, 1), vals=(3.0, n), wait=True)
    assert np.array_equal(out.numpy(), 5 * x)
  finally: reg.close()
