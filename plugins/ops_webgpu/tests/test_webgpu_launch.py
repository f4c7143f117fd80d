"""The WEBGPU launch path on each engine: nothing is rebuilt per launch, caches are reused,
views and aliasing, packed small dtypes, unaligned copies, timing, and IR semantics the
conformance suite does not reach (chained small-integer and bfloat16 arithmetic)."""
from __future__ import annotations

import collections
import dataclasses
import gc
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from webgpu_engines import device, engine_params

from plugrt.compiler import interpreter
from plugrt.compiler import samples as K
from plugrt.compiler.ir import KernelBuilder
from plugrt.device import Buffer
from plugrt.dtype import DType, dtypes
from plugrt.errors import CompileError
from plugrt.registry import use


def fresh(kernel: Any, tag: str) -> Any:
  """The same kernel under a new name: a program no earlier test has launched."""
  return dataclasses.replace(kernel, name=f"{kernel.name}_{tag}")


@pytest.fixture(params=engine_params())
def dev(request: pytest.FixtureRequest) -> Iterator[Any]:
  d = device(request.param)
  with use(d.registry): yield d


class Counting:
  """Wraps an engine, counting calls of the methods that build things."""
  WATCH = ("create_module", "create_pipeline", "create_bind_group", "create_uniform", "write", "launcher", "timed_launcher")

  def __init__(self, engine: Any, monkeypatch: pytest.MonkeyPatch):
    self.calls: collections.Counter[str] = collections.Counter()
    for name in self.WATCH:
      orig = getattr(engine, name)
      def wrapped(*a: Any, _orig: Any = orig, _name: str = name, **kw: Any) -> Any:
        self.calls[_name] += 1
        return _orig(*a, **kw)
      monkeypatch.setattr(engine, name, wrapped)


def test_no_rebuild_per_launch(dev: Any, monkeypatch: pytest.MonkeyPatch) -> None:
  eng = dev.info.iface_object
  counts = Counting(eng, monkeypatch)
  prg = dev.program(fresh(K.saxpy_kernel(), "norebuild"))
  n = 256
  out, x, y = Buffer(dev, n), Buffer.from_numpy(np.arange(n, dtype=np.float32), dev), Buffer.from_numpy(np.ones(n, np.float32), dev)
  built = dict(counts.calls)
  for _ in range(200): prg(out, x, y, global_size=(4, 1, 1), local_size=(64, 1, 1), vals=(2.0, n))
  dev.synchronize()
  after = dict(counts.calls)
  # the first launch builds one pipeline, one bind group and one launcher; the other 199 build nothing and write nothing
  assert after.get("create_pipeline", 0) - built.get("create_pipeline", 0) == 1
  assert after.get("create_bind_group", 0) - built.get("create_bind_group", 0) == 1
  assert after.get("launcher", 0) - built.get("launcher", 0) == 1
  assert after.get("create_module", 0) == built.get("create_module", 0)  # the module came with the compile
  assert after.get("write", 0) - built.get("write", 0) == 1  # the uniform, once
  assert prg.pipelines_built == 1 and prg.bind_groups_built == 1
  assert np.array_equal(out.numpy(), 2 * np.arange(n, dtype=np.float32) + 1)


def test_caches_per_buffer_set_scalars_and_workgroup_size(dev: Any, monkeypatch: pytest.MonkeyPatch) -> None:
  eng = dev.info.iface_object
  prg = dev.program(fresh(K.saxpy_kernel(), "caches"))
  n = 128
  bufs_a = [Buffer(dev, n), Buffer.from_numpy(np.arange(n, dtype=np.float32), dev), Buffer.from_numpy(np.ones(n, np.float32), dev)]
  bufs_b = [Buffer(dev, n), Buffer.from_numpy(np.ones(n, np.float32), dev), Buffer.from_numpy(np.ones(n, np.float32), dev)]
  prg(*bufs_a, global_size=(2, 1, 1), local_size=(64, 1, 1), vals=(1.0, n))
  counts = Counting(eng, monkeypatch)
  prg(*bufs_a, global_size=(2, 1, 1), local_size=(64, 1, 1), vals=(3.0, n))   # new scalar: the uniform is rewritten, nothing built
  assert counts.calls["write"] == 1 and counts.calls["create_bind_group"] == 0 and counts.calls["create_pipeline"] == 0
  prg(*bufs_b, global_size=(2, 1, 1), local_size=(64, 1, 1), vals=(3.0, n))   # new buffers: one bind group
  assert counts.calls["create_bind_group"] == 1 and counts.calls["create_pipeline"] == 0
  prg(*bufs_a, global_size=(2, 1, 1), local_size=(64, 1, 1), vals=(3.0, n))   # back to the first set: its bind group is reused
  assert counts.calls["create_bind_group"] == 1
  prg(*bufs_a, global_size=(4, 1, 1), local_size=(32, 1, 1), vals=(3.0, n))   # new workgroup size: one pipeline, same module
  assert counts.calls["create_pipeline"] == 1 and counts.calls["create_module"] == 0
  prg(*bufs_a, global_size=(2, 1, 1), local_size=(64, 1, 1), vals=(3.0, n))   # the first size again: cached
  assert counts.calls["create_pipeline"] == 1
  dev.synchronize()
  assert np.array_equal(bufs_a[0].numpy(), 3 * np.arange(n, dtype=np.float32) + 1)
  assert np.array_equal(bufs_b[0].numpy(), np.full(n, 4, np.float32))


def test_in_flight_launches_keep_their_scalars(dev: Any) -> None:
  """Launches queued without waiting, each with other scalars: the uniform is rewritten in queue order."""
  prg = dev.program(K.saxpy_kernel())
  n = 64
  x, y = Buffer.from_numpy(np.ones(n, np.float32), dev), Buffer.from_numpy(np.zeros(n, np.float32), dev)
  outs = [Buffer(dev, n) for _ in range(8)]
  for k, o in enumerate(outs): prg(o, x, y, global_size=(1, 1, 1), local_size=(64, 1, 1), vals=(float(k), n))
  for k, o in enumerate(outs): assert np.array_equal(o.numpy(), np.full(n, k, np.float32)), k


def test_aliased_views_share_one_binding(dev: Any, monkeypatch: pytest.MonkeyPatch) -> None:
  """out and x views of one allocation (in place, and at unaligned offsets): Dawn rejects two
  overlapping writable bindings, so they are bound once through a specialised module."""
  prg = dev.program(K.tiny_kernel("tiny_alias"))
  base = Buffer(dev, 64).copyin(np.arange(64, dtype=np.float32))
  counts = Counting(dev.info.iface_object, monkeypatch)
  prg(base, base, wait=True)                                   # out[0] = out[0] + 1, in place
  prg(base.view(4, offset=12), base.view(4, offset=200), wait=True)  # out = base[3], x = base[50]
  assert counts.calls["create_module"] == 1  # one specialisation: both calls alias (0, 0)
  got = base.numpy()
  assert got[0] == 1.0 and got[3] == 51.0 and got[50] == 50.0 and got[4] == 4.0


def test_packed_dtypes_concurrent_neighbour_stores(dev: Any) -> None:
  """Every thread writes its own byte/halfword: neighbours share 32-bit words, and none is lost."""
  for dt in (dtypes.uint8, dtypes.int8, dtypes.bool, dtypes.int16, dtypes.bfloat16):
    b = KernelBuilder(f"neigh_{dt.name}")
    out, x = b.buffer("out", dt), b.buffer("x", dt)
    i = b.global_id(0)
    out[i] = x[i]
    k = b.finish()
    n = 4099
    src = K.values(dt, n, np.random.default_rng(7))
    xb, ob = Buffer(dev, n, dt).copyin(src), Buffer(dev, n, dt)
    dev.program(k)(ob, xb, global_size=(n, 1, 1), local_size=(1, 1, 1), wait=True)
    assert ob.numpy().tobytes() == src.tobytes(), dt


def test_packed_view_at_odd_offset_leaves_neighbours_alone(dev: Any) -> None:
  b = KernelBuilder("inc_u8")
  out = b.buffer("out", dtypes.uint8)
  i = b.global_id(0)
  out[i] = out[i] + 1
  prg = dev.program(b.finish())
  base = Buffer(dev, 11, dtypes.uint8).copyin(np.arange(11, dtype=np.uint8) * 10)
  prg(base.view(5, offset=3), global_size=(5, 1, 1), wait=True)  # bytes 3..7
  assert base.numpy().tolist() == [0, 10, 20, 31, 41, 51, 61, 71, 80, 90, 100]


def test_unaligned_copies(dev: Any) -> None:
  base = Buffer(dev, 7, dtypes.uint8).copyin(np.arange(7, dtype=np.uint8))
  view = base.view(3, offset=1)
  assert view.numpy().tolist() == [1, 2, 3]
  view.copyin(np.array([9, 8, 7], np.uint8))
  assert base.numpy().tolist() == [0, 9, 8, 7, 4, 5, 6]
  other = Buffer(dev, 3, dtypes.uint8)
  view.copy_to(other)
  assert other.numpy().tolist() == [9, 8, 7]
  h = Buffer(dev, 5, dtypes.int16).copyin(np.arange(5, dtype=np.int16) - 2)
  assert h.view(3, offset=2).numpy().tolist() == [-1, 0, 1] and h.tobytes() == (np.arange(5, dtype=np.int16) - 2).tobytes()


def _check(dev: Any, kernel: Any, inputs: list[np.ndarray], gs: tuple[int, int, int], vals: tuple = ()) -> None:
  bufs = [Buffer(dev, len(a), dt).copyin(a) for a, dt in zip(inputs, kernel.signature.buffers)]
  dev.program(kernel)(*bufs, global_size=gs, vals=vals, wait=True)
  want = [a.copy() for a in inputs]
  interpreter.run(kernel, want, vals, gs, (1, 1, 1))
  for i, (buf, w, dt) in enumerate(zip(bufs, want, kernel.signature.buffers)):
    K.compare(f"{kernel.name} buffer {i}", buf.numpy(), w, dt)


@pytest.mark.parametrize("dt", [dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16], ids=lambda d: d.name)
def test_small_integers_wrap_after_every_op(dev: Any, dt: DType) -> None:
  """Results used again before they are stored (the conformance suite stores each op's result at once)."""
  b = KernelBuilder(f"chain_{dt.name}")
  out, cmp, x, y = b.buffer("out", dt), b.buffer("cmp", dtypes.bool), b.buffer("x", dt), b.buffer("y", dt)
  i = b.global_id(0)
  a, c = x[i], y[i]
  prod = a * c                                  # overflows the dtype
  out[i * 4] = prod // b.const(3, dt)           # divides the wrapped value
  out[i * 4 + 1] = (a + c) >> b.const(1, dt)    # shifts the wrapped sum
  out[i * 4 + 2] = (a << b.const(3, dt)) - c
  out[i * 4 + 3] = -(~a)
  cmp[i] = prod < a + c
  k = b.finish()
  n = 64
  rng = np.random.default_rng(3)
  _check(dev, k, [np.zeros(4 * n, dt.numpy), np.zeros(n, np.bool_), K.values(dt, n, rng), K.values(dt, n, rng)], (n, 1, 1))


def test_bfloat16_rounds_after_every_op(dev: Any) -> None:
  dt = dtypes.bfloat16
  b = KernelBuilder("chain_bf16")
  out, x, y = b.buffer("out", dt), b.buffer("x", dt), b.buffer("y", dt)
  i = b.global_id(0)
  a, c = x[i], y[i]
  out[i * 3] = (a * c + a) * c
  out[i * 3 + 1] = (a * a + c * c).sqrt()
  out[i * 3 + 2] = a.cast(dtypes.int32).cast(dt) + c.cast(dtypes.float32).cast(dt)
  k = b.finish()
  n = 64
  rng = np.random.default_rng(4)
  bufs = [np.zeros(3 * n, np.uint16), K.values(dt, n, rng), K.values(dt, n, rng)]
  kb = [Buffer(dev, len(a), d).copyin(a) for a, d in zip(bufs, k.signature.buffers)]
  dev.program(k)(*kb, global_size=(n, 1, 1), wait=True)
  want = [a.copy() for a in bufs]
  interpreter.run(k, want, (), (n, 1, 1), (1, 1, 1))
  got = kb[0].numpy()
  K.compare("bf16 mul-add", got[0::3], want[0][0::3], dt)
  K.compare("bf16 sqrt", got[1::3], want[0][1::3], dt, ulps=1)
  K.compare("bf16 casts", got[2::3], want[0][2::3], dt)


@pytest.mark.parametrize(("dt", "value"), [(dtypes.float16, 1e6), (dtypes.float16, 0.1), (dtypes.bfloat16, 3.4e38), (dtypes.float32, 1e39),
                                            (dtypes.int8, -128), (dtypes.uint16, 65535), (dtypes.bool, True), (dtypes.int32, -(1 << 31))])
def test_scalar_edge_values(dev: Any, dt: DType, value: Any) -> None:
  if dt is dtypes.float16 and "shader-f16" not in dev.info.iface_object.features: pytest.skip("no shader-f16")
  b = KernelBuilder(f"scalar_edge_{dt.name}")
  out, s = b.buffer("out", dt), b.scalar("s", dt)
  out[b.global_id(0)] = s
  _check(dev, b.finish(), [np.zeros(2, dt.numpy)], (2, 1, 1), (value,))


def test_wall_clock_timing(dev: Any, monkeypatch: pytest.MonkeyPatch) -> None:
  """Engines without timestamp queries time a launch by the wall clock, up to the queue being drained."""
  eng, calls = dev.info.iface_object, []
  real_sync = eng.synchronize
  monkeypatch.setattr(eng, "synchronize", lambda: (calls.append("sync"), real_sync())[1])
  t = eng.wall_timed(lambda: calls.append("launch"))()
  assert calls == ["launch", "sync"] and isinstance(t, float) and 0 < t < 10


def test_timing_and_limits(dev: Any) -> None:
  eng = dev.info.iface_object
  assert eng.timer in ("timestamp-query", "wall") and (eng.timer == "timestamp-query") == ("timestamp-query" in eng.features)
  prg = dev.program(K.saxpy_kernel())
  n = 1 << 14
  out, x, y = Buffer(dev, n), Buffer(dev, n), Buffer(dev, n)
  ts = [prg(out, x, y, global_size=(n // 64, 1, 1), local_size=(64, 1, 1), vals=(1.0, n), wait=True) for _ in range(3)]
  assert all(isinstance(t, float) and 0 < t < 10 for t in ts), ts
  lim = eng.limits
  with pytest.raises(ValueError, match="groups per axis"): prg(out, x, y, global_size=(lim.max_workgroups_per_dimension + 1, 1, 1), vals=(1.0, n))
  with pytest.raises(ValueError, match="threads per group"):
    prg(out, x, y, local_size=(lim.max_invocations_per_workgroup + 1, 1, 1), vals=(1.0, n))
  prg(out, x, y, global_size=(1, 1, 1), local_size=(64, 1, 1), vals=(1.0, n), wait=True)  # still usable


def test_compile_cache_and_errors(dev: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
  from plugrt.cache import DiskCache
  comp = dev.compiler
  monkeypatch.setenv("PLUGRT_CACHE_DIR", str(tmp_path))
  monkeypatch.setattr(comp, "_disk", DiskCache(comp.cache_namespace))
  counts = Counting(dev.info.iface_object, monkeypatch)
  src = comp.render(K.tiny_kernel(f"cache_probe_{dev.info.interface.lower()}"))
  assert comp.compile(src) == src.encode() and counts.calls["create_module"] == 1  # validated by the engine
  assert comp.compile(src) == src.encode() and counts.calls["create_module"] == 1  # a hit: not validated again
  key = comp.cache_key(src)
  assert dev.info.interface in comp.toolchain() and dev.info.iface_object.adapter.name in comp.toolchain()
  assert DiskCache(comp.cache_namespace).get(key) == src.encode() and (tmp_path / comp.cache_namespace / "pack").exists()
  with pytest.raises(CompileError) as ei:
    comp.compile_uncached(src.replace("fn k_", "fn k_ broken"))
  assert "rejected the WGSL" in str(ei.value) and ei.value.log


def test_from_blob_refuses(dev: Any) -> None:
  from plugrt.errors import UnsupportedError
  host = np.zeros(4, np.float32)
  with pytest.raises(UnsupportedError, match="never copies silently"): Buffer.from_blob(host.ctypes.data, 4, dtypes.float32, dev)


def test_out_of_memory_names_the_limit(dev: Any) -> None:
  limit = dev.info.iface_object.limits.max_buffer_size  # Dawn on NVIDIA reports more than 1 TiB
  with pytest.raises(MemoryError, match="largest buffer"): Buffer(dev, limit + 1, dtypes.uint8)


def test_buffers_dropped_in_reference_cycles(dev: Any) -> None:
  """A Buffer the cycle collector frees must not leave a released engine buffer in the allocator's cache (wgpu-py's
  buffers finalize themselves: the next allocation of that size would get a dead handle, or abort in wgpu-native)."""
  class Holder:
    pass
  for k in range(3):
    h = Holder()
    h.me, h.buf = h, Buffer(dev, 8, dtypes.int32).copyin(np.arange(8, dtype=np.int32))
    del h
    gc.collect()
    b = Buffer(dev, 8, dtypes.int32).copyin(np.arange(8, dtype=np.int32) * k)
    assert b.numpy().tolist() == [i * k for i in range(8)]


def test_a_finalizer_freeing_during_an_unaligned_copy(dev: Any, monkeypatch: pytest.MonkeyPatch) -> None:
  """An unaligned copy reads and rewrites edge words under a lock; a buffer freed meanwhile (by a finalizer the
  collector runs on this thread) must not wait for that lock."""
  eng, alloc = dev.info.iface_object, dev.allocator
  victim = alloc.alloc(64)
  real_read, freed = eng.read, []

  def read_and_collect(*a: Any) -> None:
    if not freed: freed.append(alloc.free(victim, 64))  # what Buffer.__del__ does
    real_read(*a)
  monkeypatch.setattr(eng, "read", read_and_collect)
  buf, done = Buffer(dev, 7, dtypes.int8), threading.Event()

  def copy() -> None:
    buf.copyin(np.arange(7, dtype=np.int8))  # 7 bytes: the last word is read, patched and written back
    done.set()
  t = threading.Thread(target=copy, daemon=True)
  t.start()
  t.join(30)
  assert done.is_set() and freed, "an unaligned copy deadlocked with a free"
  monkeypatch.undo()
  assert buf.numpy().tolist() == list(range(7))

