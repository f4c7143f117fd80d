"""plugrt_cuda.nccl below the hardware: where libnccl is looked for, the C types every call passes, and the whole
engine (groups, counts in elements or bytes, dtype and op codes, roots and peers, timeouts, async errors, abort) over
host memory through a stand-in library that does what NCCL does with the arguments it is given. No GPU is needed:
tests/test_distributed_gpu.py is the same engine on GPUs with the real library."""
from __future__ import annotations

import ctypes
import time
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import plugrt.distributed as dist
from plugrt import Buffer, Device, dtypes
from plugrt.distributed.comm import make_communicators
from plugrt.dtype import bf16_to_f32, f32_to_bf16
from plugrt.errors import CollectiveTimeout, CollectiveUnavailable, Reason, UnsupportedError
from plugrt_cuda import nccl
from plugrt_cuda.nccl import NCCL, NCCLEngine, NCCLError

NP = {0: np.int8, 1: np.uint8, 2: np.int32, 3: np.uint32, 4: np.int64, 5: np.uint64, 6: np.float16, 7: np.float32, 8: np.float64,
      9: np.uint16}


def host(ptr: int, nbytes: int, code: int) -> np.ndarray:
  return np.frombuffer((ctypes.c_uint8 * nbytes).from_address(ptr), np.uint8).view(NP[code]) if nbytes else np.empty(0, NP[code])


class FakeNCCL:
  """The calls of libnccl plugrt makes, over host memory. It checks each argument has the C type NCCL's header declares
  (what plugrt's NCCL class must pass), records them, and does the work at ncclGroupEnd, as NCCL defines it."""

  def __init__(self) -> None:
    self.log: list[tuple[str, tuple[Any, ...]]] = []
    self.queue: list[tuple[str, dict[str, Any]]] = []
    self.async_error, self.aborted, self.destroyed, self.hang = 0, [], [], 0.0

  @staticmethod
  def _v(x: Any, ctype: Any) -> Any:
    assert type(x) is ctype, f"{x!r} is not {ctype.__name__}"
    return x.value

  def ncclGetErrorString(self, r: ctypes.c_int) -> bytes: return f"fake error {r.value}".encode()
  def ncclGetLastError(self, comm: Any) -> bytes: return b"last words"

  def ncclGetVersion(self, p: Any) -> int:
    p._obj.value = 22703
    return 0

  def ncclGetUniqueId(self, p: Any) -> int:
    ctypes.memmove(p._obj.internal, bytes(range(128)), 128)  # NULs included: the id is bytes, not a string
    return 0

  def ncclCommInitRank(self, pcomm: Any, nranks: Any, uid: Any, rank: Any) -> int:
    assert isinstance(uid, nccl.UniqueId)  # by value, as the header says
    self.log.append(("init_rank", (self._v(nranks, ctypes.c_int), bytes(uid.internal), self._v(rank, ctypes.c_int))))
    pcomm._obj.value = 100 + rank.value
    return 0

  def ncclCommInitAll(self, comms: Any, n: Any, devs: Any) -> int:
    self.log.append(("init_all", (self._v(n, ctypes.c_int), list(devs))))
    for i in range(n.value): comms[i] = 1 + i
    return 0

  def ncclGroupStart(self) -> int: return 0

  def ncclGroupEnd(self) -> int:
    if self.hang: time.sleep(self.hang)
    q, self.queue = self.queue, []
    for kind in ("ncclAllReduce", "ncclAllGather", "ncclReduceScatter", "ncclBroadcast"):
      if (ops := [a for k, a in q if k == kind]): self._collective(kind, sorted(ops, key=lambda a: a["comm"]))
    for a in [a for k, a in q if k == "ncclSend"]:
      r = next(b for k, b in q if k == "ncclRecv" and b["comm"] == a["peer"] + 1 and b["peer"] == a["comm"] - 1)
      assert (r["count"], r["dtype"]) == (a["count"], a["dtype"])
      host(r["recv"], a["count"] * NP[a["dtype"]]().itemsize, 1)[:] = host(a["send"], a["count"] * NP[a["dtype"]]().itemsize, 1)
    return 0

  def _collective(self, kind: str, ops: list[dict[str, Any]]) -> None:
    code, n, size = ops[0]["dtype"], ops[0]["count"], len(ops)
    assert all((o["dtype"], o["count"]) == (code, n) for o in ops)
    item = np.dtype(NP[code]).itemsize
    if kind == "ncclBroadcast":
      data = host(ops[ops[0]["root"]]["send"], n * item, code).copy()
      for o in ops: host(o["recv"], n * item, code)[:] = data
      return
    if kind == "ncclAllGather":
      data = np.concatenate([host(o["send"], n * item, code) for o in ops])
      for o in ops: host(o["recv"], n * item * size, code)[:] = data
      return
    total = n * size if kind == "ncclReduceScatter" else n  # reduce-scatter's count is what each rank receives
    rows = np.stack([host(o["send"], total * item, code) for o in ops])
    fn = {0: np.sum, 1: np.prod, 2: np.max, 3: np.min}[ops[0]["op"]]
    out = f32_to_bf16(fn(bf16_to_f32(rows), axis=0)) if code == 9 else fn(rows, axis=0).astype(NP[code])
    for r, o in enumerate(ops): host(o["recv"], n * item, code)[:] = out[r * n:(r + 1) * n] if kind == "ncclReduceScatter" else out

  def _enqueue(self, name: str, **a: Any) -> int:
    self.log.append((name, tuple(a.values())))
    self.queue.append((name, a))
    return 0

  def ncclAllReduce(self, s: Any, r: Any, n: Any, dt: Any, op: Any, comm: Any, stream: Any) -> int:
    return self._enqueue("ncclAllReduce", send=self._v(s, ctypes.c_void_p), recv=self._v(r, ctypes.c_void_p), count=self._v(n, ctypes.c_size_t),
                         dtype=self._v(dt, ctypes.c_int), op=self._v(op, ctypes.c_int), comm=comm.value)

  def ncclReduceScatter(self, s: Any, r: Any, n: Any, dt: Any, op: Any, comm: Any, stream: Any) -> int:
    return self._enqueue("ncclReduceScatter", send=self._v(s, ctypes.c_void_p), recv=self._v(r, ctypes.c_void_p),
                         count=self._v(n, ctypes.c_size_t), dtype=self._v(dt, ctypes.c_int), op=self._v(op, ctypes.c_int), comm=comm.value)

  def ncclAllGather(self, s: Any, r: Any, n: Any, dt: Any, comm: Any, stream: Any) -> int:
    return self._enqueue("ncclAllGather", send=self._v(s, ctypes.c_void_p), recv=self._v(r, ctypes.c_void_p), count=self._v(n, ctypes.c_size_t),
                         dtype=self._v(dt, ctypes.c_int), comm=comm.value)

  def ncclBroadcast(self, s: Any, r: Any, n: Any, dt: Any, root: Any, comm: Any, stream: Any) -> int:
    return self._enqueue("ncclBroadcast", send=self._v(s, ctypes.c_void_p), recv=self._v(r, ctypes.c_void_p), count=self._v(n, ctypes.c_size_t),
                         dtype=self._v(dt, ctypes.c_int), root=self._v(root, ctypes.c_int), comm=comm.value)

  def ncclSend(self, b: Any, n: Any, dt: Any, peer: Any, comm: Any, stream: Any) -> int:
    return self._enqueue("ncclSend", send=self._v(b, ctypes.c_void_p), count=self._v(n, ctypes.c_size_t), dtype=self._v(dt, ctypes.c_int),
                         peer=self._v(peer, ctypes.c_int), comm=comm.value)

  def ncclRecv(self, b: Any, n: Any, dt: Any, peer: Any, comm: Any, stream: Any) -> int:
    return self._enqueue("ncclRecv", recv=self._v(b, ctypes.c_void_p), count=self._v(n, ctypes.c_size_t), dtype=self._v(dt, ctypes.c_int),
                         peer=self._v(peer, ctypes.c_int), comm=comm.value)

  def ncclCommGetAsyncError(self, comm: Any, p: Any) -> int:
    p._obj.value = self.async_error
    return 0

  def ncclCommAbort(self, comm: Any) -> int:
    self.aborted.append(comm.value)
    return 0

  def ncclCommFinalize(self, comm: Any) -> int: return 0

  def ncclCommDestroy(self, comm: Any) -> int:
    self.destroyed.append(comm.value)
    return 0


def states(n: int) -> list[Any]:
  return [types.SimpleNamespace(index=i, stream=ctypes.c_void_p(0), make_current=lambda: None) for i in range(n)]


def local_pair(fake: FakeNCCL, timeout: float = 5, done: Any = None) -> list[dist.Communicator]:
  """Two communicators of one NCCLEngine over two host devices (CPU and PYTHON: host memory stands in for GPUs)."""
  devs = (Device["CPU"], Device["PYTHON"])
  eng = NCCLEngine(dist.EngineRequest(devs, (0, 1), 2, None, timeout), NCCL(fake), done or (lambda s: True), states(2))
  return make_communicators(eng, devs, [0, 1], 2, local=True, check=True)


def test_library_search_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
  assert nccl.library_paths({"PLUGRT_NCCL_LIBRARY": "/opt/x/libnccl.so.2"}) == ["/opt/x/libnccl.so.2"]
  for sub in ("nccl", "cu13"):
    (tmp_path / "nvidia" / sub / "lib").mkdir(parents=True)
    (tmp_path / "nvidia" / sub / "lib" / "libnccl.so.2").write_bytes(b"")
  spec = types.SimpleNamespace(submodule_search_locations=[str(tmp_path / "nvidia")])
  import importlib.util
  monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: spec if name == "nvidia" else None)
  assert nccl.library_paths({}) == [str(tmp_path / "nvidia/nccl/lib/libnccl.so.2"), str(tmp_path / "nvidia/cu13/lib/libnccl.so.2"), "libnccl.so.2"]
  with pytest.raises(CollectiveUnavailable, match="cannot be loaded") as e: nccl.load({"PLUGRT_NCCL_LIBRARY": str(tmp_path / "none.so")})
  assert e.value.reason is Reason.MISSING_TOOLCHAIN and "pip install nvidia-nccl-cu13" in str(e.value)


def test_calls_pass_the_headers_c_types() -> None:
  fake = FakeNCCL()
  n = NCCL(fake)
  uid = n.unique_id()
  assert uid == bytes(range(128)) and n.version() == 22703
  n.init_rank(4, uid, 3)
  assert fake.log[-1] == ("init_rank", (4, bytes(range(128)), 3))
  with pytest.raises(ValueError, match="128 bytes"): n.init_rank(4, uid[:16], 3)
  assert [c.value for c in n.init_all([2, 5])] == [1, 2] and fake.log[-1] == ("init_all", (2, [2, 5]))
  with pytest.raises(NCCLError, match=r"ncclAllReduce failed: ncclRemoteError \(fake error 6; last words\)") as e: n.check(6, "ncclAllReduce", 1)
  assert "a rank died" in e.value.hint
  assert n.check(7, "ncclGroupEnd", ok=(0, 7)) == 7


@pytest.mark.parametrize("dt", [d for d in dtypes.all()])
def test_every_collective_through_the_engine(dt: Any) -> None:
  fake = FakeNCCL()
  a, b = local_pair(fake)
  def vals(r: int, n: int) -> np.ndarray:
    v = (np.arange(n) % 4 + r).astype(np.float32)
    return (v % 2 == 0) if dt is dtypes.bool else f32_to_bf16(v) if dt is dtypes.bfloat16 else v.astype(dt.numpy)
  def buf(c: dist.Communicator, x: np.ndarray) -> Buffer: return Buffer(c.device, x.size, dt).copyin(x)
  x = [vals(0, 5), vals(1, 5)]
  if dt.name in ("int16", "uint16"):
    with pytest.raises(UnsupportedError, match="NCCL cannot reduce"):
      with dist.group():
        a.all_reduce(buf(a, x[0]))
        b.all_reduce(buf(b, x[1]))
  else:
    for op in ("sum", "prod", "min", "max"):
      bufs = [buf(a, x[0]), buf(b, x[1])]
      with dist.group():
        a.all_reduce(bufs[0], op)
        b.all_reduce(bufs[1], op)
      f = {"sum": np.sum, "prod": np.prod, "min": np.min, "max": np.max}[op]
      want = (np.any if op in ("sum", "max") else np.all)(np.stack(x), axis=0) if dt is dtypes.bool else \
        f32_to_bf16(f(bf16_to_f32(np.stack(x)), axis=0)) if dt is dtypes.bfloat16 else f(np.stack(x), axis=0).astype(dt.numpy)
      assert np.array_equal(bufs[0].numpy(), want) and np.array_equal(bufs[1].numpy(), want), op
    _, args = next(e for e in fake.log if e[0] == "ncclAllReduce")
    assert args[2] == 5 and args[3] == (nccl.DTYPES["uint8"] if dt is dtypes.bool else nccl.DTYPES[dt.name])  # count in elements
    s = [buf(a, vals(0, 10)), buf(b, vals(1, 10))]
    r = [Buffer(a.device, 5, dt), Buffer(b.device, 5, dt)]
    with dist.group():
      a.reduce_scatter(s[0], r[0], "max")
      b.reduce_scatter(s[1], r[1], "max")
    hi = [bf16_to_f32(vals(r, 10)) if dt is dtypes.bfloat16 else vals(r, 10) for r in (0, 1)]
    full = f32_to_bf16(np.maximum(*hi)) if dt is dtypes.bfloat16 else np.maximum(*hi)
    assert np.array_equal(r[0].numpy(), full[:5]) and np.array_equal(r[1].numpy(), full[5:])
    assert next(e for e in fake.log if e[0] == "ncclReduceScatter")[1][2] == 5  # NCCL's count: what each rank receives
  g = [Buffer(a.device, 10, dt), Buffer(b.device, 10, dt)]
  with dist.group():
    a.all_gather(buf(a, x[0]), g[0])
    b.all_gather(buf(b, x[1]), g[1])
  assert np.array_equal(g[1].numpy(), np.concatenate(x))
  assert next(e for e in fake.log if e[0] == "ncclAllGather")[1][2:4] == (5 * dt.itemsize, nccl.UINT8)  # moves go as bytes
  c = [buf(a, x[0]), buf(b, x[1])]
  with dist.group():
    a.broadcast(c[0], 1)
    b.broadcast(c[1], 1)
  assert np.array_equal(c[0].numpy(), x[1]) and next(e for e in fake.log if e[0] == "ncclBroadcast")[1][4] == 1
  got = Buffer(b.device, 5, dt)
  with dist.group():
    a.send(buf(a, x[0]), 1)
    b.recv(got, 0)
  assert np.array_equal(got.numpy(), x[0])
  assert next(e for e in fake.log if e[0] == "ncclSend")[1][1:] == (5 * dt.itemsize, nccl.UINT8, 1, 1)


def test_a_stream_that_never_finishes_is_a_timeout_and_aborts() -> None:
  fake = FakeNCCL()
  a, b = local_pair(fake, timeout=0.5, done=lambda s: False)
  t = time.monotonic()
  with pytest.raises(CollectiveTimeout, match=r"within 0\.5 s"):
    with dist.group():
      a.barrier()
      b.barrier()
  assert time.monotonic() - t < 3 and sorted(fake.aborted) == [1, 2]
  with pytest.raises(dist.CollectiveError, match="unusable"): a.barrier()


def test_a_call_stuck_inside_nccl_is_a_timeout() -> None:
  fake = FakeNCCL()
  fake.hang = 2.0  # ncclGroupEnd waits for a peer that never comes (a blocking communicator's first send/recv does)
  a, b = local_pair(fake, timeout=0.5)
  t = time.monotonic()
  with pytest.raises(CollectiveTimeout):
    with dist.group():
      a.all_reduce(Buffer(a.device, 4))
      b.all_reduce(Buffer(b.device, 4))
  assert time.monotonic() - t < 1.5 and sorted(fake.aborted) == [1, 2]


def test_an_async_error_aborts() -> None:
  fake = FakeNCCL()
  a, b = local_pair(fake)
  fake.async_error = 6
  with pytest.raises(NCCLError, match=r"ncclRemoteError.*aborted"):
    with dist.group():
      a.barrier()
      b.barrier()
  assert sorted(fake.aborted) == [1, 2]


def test_one_rank_per_process_inits_from_the_shared_id() -> None:
  fake = FakeNCCL()
  shared: list[Any] = []
  def share(make: Any) -> bytes:  # as rank 3 sees it: the id comes from rank 0, make() is not called here
    shared.append(make)
    return b"\x07" * 128
  eng = NCCLEngine(dist.EngineRequest((Device["CPU"],), (3,), 4, share, 5), NCCL(fake), lambda s: True, states(1))
  assert fake.log == [("init_rank", (4, b"\x07" * 128, 3))] and shared[0] == eng.nccl.unique_id
  eng.close()
  assert fake.destroyed == [103]




def test_probe_names_the_missing_library(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
  import plugrt_cuda
  monkeypatch.setattr(plugrt_cuda, "probe_cuda", lambda ctx: plugrt_cuda.Probe.found(2, "2 GPUs"))
  monkeypatch.setattr(nccl, "library_paths", lambda env: [str(tmp_path / "nope.so"), "libnccl.so.2"])
  ctx = types.SimpleNamespace(env={}, find_library=lambda *a, **k: None)
  p = plugrt_cuda.probe_nccl(ctx)
  assert not p.ok and p.reason is Reason.MISSING_TOOLCHAIN and "pip install nvidia-nccl-cu13" in p.hint
  (tmp_path / "nope.so").write_bytes(b"")
  p = plugrt_cuda.probe_nccl(ctx)
  assert p.ok and p.count == 2 and p.detail.startswith(str(tmp_path / "nope.so")) and "not yet across hosts" in p.detail
  (spec,) = plugrt_cuda.plugrt_collective_engines()
  assert (spec.name, spec.device, spec.local, spec.probe) == ("NCCL", "CUDA", True, plugrt_cuda.probe_nccl)
