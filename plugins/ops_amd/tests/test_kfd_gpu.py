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
