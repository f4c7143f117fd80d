"""plugrt.hwqueue (the hardware-queue layer) and plugrt_testing.fakegpu, without a GPU: counters in host memory stand
in for what a GPU writes, and a staging subclass whose "DMA" runs only when waited for shows any missing wait."""
from __future__ import annotations

import ctypes
import threading

import numpy as np
import pytest

from plugrt import dtypes
from plugrt.compiler import samples as K
from plugrt.compiler.ir import Signature
from plugrt.context import PluginContext
from plugrt.errors import EnvError, PlugrtError
from plugrt.hwqueue import CommandSlots, DoorbellRing, PinnedStaging, QueueError, ResidentLaunch, ResidentLaunches, Timeline, queue_timeout
from plugrt_testing.fakegpu import FakeDevice, FakeMemory, acquire, acquired, decode_scalar, release

# ---------------------------------------------------------------- Timeline


class DeviceError(QueueError):
  """A backend's own error type (as plugrt-nv's NVError)."""


class Device(Timeline):
  error = DeviceError

  def __init__(self, bits: int = 32, timeout: float = 0.2):
    self.memory = (ctypes.c_uint64 * 4)()
    Timeline.__init__(self, ctypes.addressof(self.memory), timeout=timeout, label="FAKE:0", setting="PLUGRT_FAKE_TIMEOUT", bits=bits)
    self.reported = ""

  def gpu_writes(self, value: int) -> None: release(self.counter_address, value, 64 if self._wrap > 0xFFFFFFFF else 32)
  def fault(self) -> str: return self.reported
  def fault_report(self) -> str: return f"deep report: {self.reported or 'nothing'}"


def test_completed_follows_the_counter_across_its_wrap():
  d = Device()
  d.value = (1 << 32) + 5  # submissions past the 32-bit counter's wrap
  d.gpu_writes(3)           # the GPU wrote (2**32 + 3) & 0xffffffff
  assert d.completed() == (1 << 32) + 3 == d.done
  d.gpu_writes(1)           # an older value read late never moves `done` back
  assert d.completed() == (1 << 32) + 3
  d64 = Device(bits=64)
  d64.value = 1 << 40
  d64.gpu_writes((1 << 40) - 2)
  assert d64.completed() == (1 << 40) - 2
  with pytest.raises(ValueError, match="32 or 64"): Timeline(0, timeout=1, label="x", setting="X", bits=16)


def test_wait_returns_when_the_gpu_gets_there():
  d = Device(timeout=5)
  d.value = 7
  t = threading.Timer(0.05, d.gpu_writes, (7,))
  t.start()
  d.wait(7)
  t.join()
  assert d.done == 7
  d.synchronize()


def test_wait_timeout_is_the_typed_error_with_reason_and_hint():
  d = Device(timeout=0.1)
  d.value = 2
  d.gpu_writes(1)
  with pytest.raises(DeviceError) as e: d.wait(2)
  err = e.value
  assert isinstance(err, QueueError) and isinstance(err, PlugrtError) and isinstance(err, RuntimeError)
  assert err.timed_out and err.value == 2 and err.reason == "deep report: nothing"
  assert "FAKE:0: the GPU did not finish submission 2 within 0.1 s (timeline at 1)" in err.message
  assert "PLUGRT_FAKE_TIMEOUT=<seconds>" in err.hint
  assert d.broken.startswith("the GPU did not finish submission 2")
  with pytest.raises(DeviceError, match=r"within 0\.05 s"): d.wait(2, timeout=0.05)  # a per-call limit


def test_wait_reports_a_fault_before_the_timeout():
  d = Device(timeout=30)
  d.value = 1
  d.reported = "Xid 31: page fault"
  with pytest.raises(DeviceError, match="reported an error while running submission 1; deep report: Xid 31") as e: d.wait(1)
  assert not e.value.timed_out and e.value.reason == "deep report: Xid 31: page fault"


def test_queue_timeout_reads_the_context():
  assert queue_timeout(PluginContext({}), "PLUGRT_X_TIMEOUT") == 30.0
  assert queue_timeout(PluginContext({"PLUGRT_X_TIMEOUT": "2.5"}), "PLUGRT_X_TIMEOUT", 10) == 2.5
  for bad in ("soon", "0", "-1", "inf"):
    with pytest.raises(EnvError, match=f"PLUGRT_X_TIMEOUT='{bad}'"): queue_timeout(PluginContext({"PLUGRT_X_TIMEOUT": bad}), "PLUGRT_X_TIMEOUT")


# ---------------------------------------------------------------- rings


def test_command_slots_wrap_and_wait_for_the_slot_they_reuse():
  mem = (ctypes.c_char * (64 * 3))()
  slots = CommandSlots(ctypes.addressof(mem), 64, 3)
  waited: list[int] = []
  d = Device()
  d.wait = waited.append  # type: ignore[method-assign]
  taken = []
  for value in range(1, 8):
    i = slots.take(d)
    taken.append(i)
    slots.last_use[i] = d.value = value
    slots.view[i * 64:i * 64 + 4] = value.to_bytes(4, "little")
  assert taken == [0, 1, 2, 0, 1, 2, 0]
  assert waited == [1, 2, 3, 4]  # each reuse waited for the submission last written there (nothing completed: done is 0)
  assert slots.address(2) == ctypes.addressof(mem) + 128 and bytes(mem[0:4]) == (7).to_bytes(4, "little")
  d.done = 6
  assert slots.take(d) == 1 and waited == [1, 2, 3, 4]  # slot 1 last held submission 5, already done: no wait


def test_doorbell_ring_wraps_put_and_rings_with_the_token():
  entries = (ctypes.c_uint64 * 4)()
  put, get, bell = ctypes.c_uint32(), ctypes.c_uint32(), ctypes.c_uint32()
  r = DoorbellRing("compute", entries, 4, put, get, bell, token=10)
  for e in range(1, 7): r.push(e)
  r.publish()
  assert r.put == 6 and put.value == 2 and bell.value == 10 and list(entries) == [5, 6, 3, 4]
  get.value = 1
  assert r.consumed() == 1 and r.in_flight() == 1 and r.describe() == "compute ring read 1 / written 2"
  # an AQL-style queue: the write index and the doorbell take the put counter itself
  wptr, rptr, bell64 = ctypes.c_uint64(), ctypes.c_uint64(), ctypes.c_uint64()
  aql = DoorbellRing("aql", (ctypes.c_uint64 * 4)(), 4, wptr, rptr, bell64, token=None, wrap_put=False)
  for e in range(6): aql.push(e)
  aql.publish()
  rptr.value = 3
  assert wptr.value == 6 and bell64.value == 6 and aql.in_flight() == 3 and aql.index(aql.put) == 2


# ---------------------------------------------------------------- resident launches


def test_resident_launch_fields():
  e = ResidentLaunch(0x10000)
  assert (e.key, e.descriptor, e.last_use, e.commands) == (None, 0x10000, 0, bytearray())
  with pytest.raises(AttributeError): e.other = 1  # type: ignore[attr-defined]
  assert "descriptor=0x10000" in repr(e)


def test_resident_launches_new_first_then_least_recently_used_free():
  res = ResidentLaunches(0x1000, 0x200, 3)
  made = []
  for k in "abc":
    e = res.claim(done=0)
    assert e is not None
    e.key, e.last_use = k, len(made) + 1
    made.append(e)
  assert [e.descriptor for e in made] == [0x1000, 0x1200, 0x1400] and res.find("b") is made[1] and res.find("z") is None
  assert res.claim(done=0) is None  # every entry still in use by the GPU
  e = res.claim(done=2)              # entries 1 and 2 are done: the least recently used one
  assert e is made[0] and e.key is None and res.find("a") is None


# ---------------------------------------------------------------- pinned staging


class LazyDMAStaging(PinnedStaging):
  """A device of host bytes whose DMAs run only when a token is waited for (in order), as a slow copy engine: a
  staging buffer reused before its DMA ran would corrupt the data."""

  def __init__(self, device: bytearray, **kw):
    super().__init__(threading.RLock(), **kw)
    self.device = device
    self.dev_addr = ctypes.addressof((ctypes.c_char * len(device)).from_buffer(device))
    self.queue: list[tuple[int, int, int, int]] = []  # (token, dst, src, n)
    self.done, self.pinned = 0, []

  def _new_buffer(self) -> int:
    self.pinned.append(buf := (ctypes.c_char * self.chunk)())
    return ctypes.addressof(buf)

  def _dma(self, dst: int, src: int, n: int) -> int:
    token = (self.queue[-1][0] if self.queue else self.done) + 1
    self.queue.append((token, dst, src, n))
    return token

  def _to_device(self, dest: int, k: int, n: int) -> int: return self._dma(self.dev_addr + dest, self.buffers[k], n)
  def _from_device(self, k: int, src: int, n: int) -> int: return self._dma(self.buffers[k], self.dev_addr + src, n)

  def _wait(self, token: int) -> None:
    while self.queue and self.queue[0][0] <= token:
      self.done, dst, src, n = self.queue.pop(0)
      ctypes.memmove(dst, src, n)

  def flush(self) -> None:
    if self.queue: self._wait(self.queue[-1][0])


@pytest.mark.parametrize("n", [0, 1, 999, 1000, 1001, 4567])
@pytest.mark.parametrize("threads", [1, 3])
def test_staging_chunks_odd_sizes_both_ways(n, threads):
  rng = np.random.default_rng(n)
  device = bytearray(8192)
  st = LazyDMAStaging(device, chunk=1000, parallel_min=300, align=64, threads=threads)
  src = rng.integers(0, 256, n + 3, dtype=np.uint8)
  view = memoryview(src)[3:]  # a view at an odd host address
  st.copyin(17, np.frombuffer(view, np.uint8).ctypes.data, n)
  st.flush()
  assert bytes(device[17:17 + n]) == bytes(view) and device[:17] == bytes(17) and not any(device[17 + n:])
  assert len(st.buffers) == min(2, -(-n // 1000))  # double-buffered, made when first needed
  back = np.zeros(n + 5, np.uint8)
  st.copyout(back.ctypes.data + 5, 17, n)
  assert bytes(back[5:]) == bytes(view) and not back[:5].any()


def test_staging_copies_alternate_buffers_across_calls():
  device = bytearray(4096)
  st = LazyDMAStaging(device, chunk=256)
  a, b = np.full(256, 1, np.uint8), np.full(256, 2, np.uint8)
  st.copyin(0, a.ctypes.data, 256)
  st.copyin(256, b.ctypes.data, 256)  # the other buffer: no wait for the first copy's DMA
  assert st.done == 0 and len(st.queue) == 2
  st.copyin(512, a.ctypes.data, 256)  # buffer 0 again: its DMA runs first
  assert st.done == 1
  st.flush()
  assert device[:768] == bytes(a) + bytes(b) + bytes(a)


def test_staging_parallel_memcpy_pieces():
  st = LazyDMAStaging(bytearray(16), chunk=16, parallel_min=1000, align=4096, threads=4)
  src = np.arange(100_003, dtype=np.uint8)
  dst = np.zeros_like(src)
  st.memcpy(dst.ctypes.data, src.ctypes.data, src.nbytes)
  assert np.array_equal(src, dst) and st.pool is not None


# ---------------------------------------------------------------- fake-GPU scaffolding


def test_fake_memory_resolves_addresses_to_arrays():
  mem = FakeMemory()
  m = mem.map(100)
  assert m.size == 4096 and mem.find(m.va + 4095) is m
  with pytest.raises(KeyError, match="no memory"): mem.find(m.va + 4096)
  arr = mem.array(m.va + 8, dtypes.float32)
  assert arr.dtype == np.float32 and arr.size == (4096 - 8) // 4
  mem.write(m.va + 8, np.float32(1.5).tobytes())
  assert arr[0] == 1.5 and mem.read(m.va + 8, 4) == np.float32(1.5).tobytes()
  mem.close()
  assert not mem.maps


def test_fake_signals():
  cell = (ctypes.c_uint64 * 2)()
  addr = ctypes.addressof(cell)
  release(addr, 0xFFFF_FFFF, timestamp_at=addr + 8)
  assert cell[0] == 0xFFFF_FFFF and cell[1] > 0 and acquired(addr, 0xFFFF_FFF0) and not acquired(addr, 0)  # 0 is after 2**32-1
  release(addr, 1 << 40, bits=64)
  assert acquired(addr, (1 << 40) - 1, bits=64) and not acquired(addr, (1 << 40) + 1, bits=64)
  threading.Timer(0.02, release, (addr, (1 << 40) + 1, 64)).start()
  acquire(addr, (1 << 40) + 1, bits=64)


def test_dispatch_runner_runs_the_interpreter_on_fake_memory():
  dev = FakeDevice()
  try:
    n = 300
    out, x, y = (dev.memory.map(n * 4) for _ in range(3))
    dev.memory.array(x.va, dtypes.float32)[:n] = np.arange(n)
    dev.memory.array(y.va, dtypes.float32)[:n] = 1
    raw = {0: np.float32(2.0).tobytes(), 1: np.int32(n).tobytes()}
    sig = Signature((dtypes.float32,) * 3, (dtypes.float32, dtypes.int32))
    scalars = dev.runner.decode_scalars(sig, lambda i, size: raw[i][:size])
    assert scalars == [2.0, n]
    dev.runner.load(0x1234, K.saxpy_kernel())
    dev.runner.run(dev.runner.programs[0x1234], [out.va, x.va, y.va], scalars, (2, 1, 1), (256, 1, 1))
    assert np.array_equal(dev.memory.array(out.va, dtypes.float32)[:n], 2 * np.arange(n, dtype=np.float32) + 1)
    assert dev.runner.runs == [("saxpy", (2, 1, 1), (256, 1, 1))]
    assert decode_scalar(dtypes.bfloat16, bytes.fromhex("c03f")) == 1.5 and decode_scalar(dtypes.bool, b"\x01") is True
  finally: dev.close()


def test_fake_device_queue_thread_faults_on_an_exception():
  dev = FakeDevice()
  steps: list[int] = []

  def step() -> bool:
    steps.append(1)
    if len(steps) == 3: raise ValueError("bad packet")
    return True
  t = dev.serve("q", step)
  t.join(5)
  assert dev.fault() == "q: ValueError: bad packet" and len(steps) == 3
  dev.close()
