"""CUDA's Staging (plugrt.hwqueue.PinnedStaging on the driver's pinned memory, async copies and events) against a fake
driver, on any machine: the fake's asynchronous copies run only when an event recorded after them is waited for,
so a pinned buffer reused before its DMA finished would show as wrong data."""
from __future__ import annotations

import ctypes
import types

import numpy as np
import pytest

from plugrt_cuda import device as cuda_device
from plugrt_cuda import driver as D


class FakeDriver:
  """The few driver calls Staging makes; a device address is a host address here."""

  def __init__(self):
    self.pinned: list[ctypes.Array] = []
    self.pending: list[tuple[str, int, int, int]] = []  # ("copy", dst, src, n) and ("event", id, 0, 0), in stream order
    self.calls: list[str] = []

  def cuMemHostAlloc(self, p, size, flags):
    self.pinned.append(buf := (ctypes.c_char * size.value)())
    p._obj.value = ctypes.addressof(buf)
    return 0

  def cuEventCreate(self, ev, flags):
    ev._obj.value = 1000 + len(self.calls)
    self.calls.append("create")
    return 0

  def cuMemcpyHtoDAsync_v2(self, dst, src, n, stream):
    self.pending.append(("copy", dst.value, src.value, n.value))
    return 0

  def cuMemcpyDtoHAsync_v2(self, dst, src, n, stream):
    self.pending.append(("copy", dst.value, src.value, n.value))
    return 0

  def cuEventRecord(self, ev, stream):
    self.pending.append(("event", ev.value, 0, 0))
    return 0

  def cuEventSynchronize(self, ev):
    """Run the stream up to the last time `ev` was recorded."""
    marks = [i for i, p in enumerate(self.pending) if p[0] == "event" and p[1] == ev.value]
    if marks:
      for kind, dst, src, n in self.pending[:marks[-1] + 1]:
        if kind == "copy": ctypes.memmove(dst, src, n)
      del self.pending[:marks[-1] + 1]
    self.calls.append("sync")
    return 0


@pytest.fixture
def staging(monkeypatch):
  drv = FakeDriver()
  monkeypatch.setattr(D, "libcuda", lambda: drv)
  state = types.SimpleNamespace(lib=drv, stream=ctypes.c_void_p(0))
  s = cuda_device.Staging(state)  # type: ignore[arg-type]
  s.chunk = 1000
  return s, drv


@pytest.mark.parametrize("n", [1, 999, 1000, 2500, 4001])
def test_staging_round_trip(staging, n):
  s, drv = staging
  rng = np.random.default_rng(n)
  host = rng.integers(0, 256, n + 1, dtype=np.uint8)[1:]  # an odd address
  device = np.zeros(n + 64, np.uint8)
  s.copyin(device.ctypes.data + 7, host.ctypes.data, n)
  assert not drv.pending  # a copy-in returns once its DMAs ran (the caller may reuse its memory)
  assert bytes(device[7:7 + n]) == host.tobytes() and not device[:7].any() and not device[7 + n:].any()
  back = np.zeros(n, np.uint8)
  s.copyout(back.ctypes.data, device.ctypes.data + 7, n)
  assert np.array_equal(back, host)
  assert len(s.buffers) == len(s.events) == min(2, -(-n // 1000))
