"""NCCL through ctypes: plugrt.distributed's engine for CUDA buffers (where it has run: docs/hardware.md).

libnccl.so.2 is found at run time: PLUGRT_NCCL_LIBRARY, then the `nvidia-nccl-cu13`/`-cu12` wheels (torch depends on
one: nvidia/<nccl|cu13|cu12>/lib), then the system's. Every call's arguments are converted to their C types here
(`NCCL`), so what reaches the library is checked below the hardware against a stand-in (tests/test_nccl_binding.py).

Collectives run on each device's plugrt stream (the legacy default stream: ordered with plugrt's kernels and copies).
NCCL's calls are made on one worker thread per engine, because a blocking communicator's setup and a first send/recv
wait inside NCCL for the peer; the caller waits for the worker, then polls the streams (cuStreamQuery) and
ncclCommGetAsyncError, all within the timeout. (One process's communicators over several GPUs issue on the caller's
thread once connected: no other process can hold them up.) Past it the communicators are aborted (ncclCommAbort, which also ends
kernels waiting for a dead peer) and CollectiveTimeout is raised.
"""
from __future__ import annotations

import ctypes
import glob
import importlib.util
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from plugrt.distributed.engine import Call, Engine, EngineRequest
from plugrt.errors import CollectiveError, CollectiveTimeout, CollectiveUnavailable, Reason, UnsupportedError

HINT = "pip install nvidia-nccl-cu13 (or -cu12, as torch brings), or set PLUGRT_NCCL_LIBRARY=/path/to/libnccl.so.2"
UNIQUE_ID_BYTES = 128
SUCCESS, IN_PROGRESS = 0, 7
SPIN_S = 0.005  # a wait for the GPUs polls without sleeping this long
ERROR_CHECK_S = 0.001  # how often a wait asks NCCL for a communicator's asynchronous error
RESULTS = {0: "ncclSuccess", 1: "ncclUnhandledCudaError", 2: "ncclSystemError", 3: "ncclInternalError", 4: "ncclInvalidArgument",
           5: "ncclInvalidUsage", 6: "ncclRemoteError", 7: "ncclInProgress"}
#: ncclDataType_t of plugrt dtypes NCCL reduces (16-bit integers it has not: they are refused for reductions)
DTYPES = {"int8": 0, "uint8": 1, "int32": 2, "uint32": 3, "int64": 4, "uint64": 5, "float16": 6, "float32": 7, "float64": 8, "bfloat16": 9}
UINT8 = 1
OPS = {"sum": 0, "prod": 1, "max": 2, "min": 3}  # ncclRedOp_t


class UniqueId(ctypes.Structure):
  _fields_ = [("internal", ctypes.c_ubyte * UNIQUE_ID_BYTES)]  # bytes, not c_char: an id holds NULs


def library_paths(env: Mapping[str, str]) -> list[str]:
  """Where libnccl.so.2 may be, in the order tried (files that exist, then the bare soname for the system's loader)."""
  if (p := env.get("PLUGRT_NCCL_LIBRARY")): return [p]
  found: list[str] = []
  spec = importlib.util.find_spec("nvidia")  # the wheels' namespace package; finding it runs none of its code
  for root in (spec.submodule_search_locations or []) if spec is not None else []:
    for sub in ("nccl", "cu13", "cu12"):
      found += sorted(glob.glob(os.path.join(root, sub, "lib", "libnccl.so*")), reverse=True)
  return found + ["libnccl.so.2"]


def load(env: Mapping[str, str]) -> Any:
  """The NCCL library (ctypes.CDLL), or CollectiveUnavailable naming every place tried."""
  tried = []
  for p in library_paths(env):
    try: return ctypes.CDLL(p)
    except OSError as e: tried.append(f"{p}: {e}")
  raise CollectiveUnavailable(f"NCCL (libnccl.so.2) cannot be loaded ({'; '.join(tried)})", Reason.MISSING_TOOLCHAIN, HINT)


class NCCLError(CollectiveError):
  """An NCCL call returned an error."""


class NCCL:
  """The NCCL calls plugrt makes, each argument converted to its C type (so a stand-in library sees what NCCL would)."""

  def __init__(self, lib: Any):
    self.lib = lib
    if isinstance(lib, ctypes.CDLL):  # the two calls that return strings (every other returns ncclResult_t, an int)
      lib.ncclGetErrorString.restype = ctypes.c_char_p
      if hasattr(lib, "ncclGetLastError"): lib.ncclGetLastError.restype = ctypes.c_char_p

  def check(self, r: int, call: str, comm: Any = None, ok: tuple[int, ...] = (SUCCESS,)) -> int:
    if r in ok: return r
    text = (self.lib.ncclGetErrorString(ctypes.c_int(r)) or b"").decode(errors="replace")
    if comm is not None and hasattr(self.lib, "ncclGetLastError"):
      text += "; " + (self.lib.ncclGetLastError(comm) or b"").decode(errors="replace")
    raise NCCLError(f"{call} failed: {RESULTS.get(r, r)} ({text})",
                    "ncclRemoteError or ncclSystemError: a rank died or its network broke; ncclInvalidUsage: the ranks made "
                    "different calls (keep check=True)" if r in (2, 5, 6) else "")

  def version(self) -> int:
    v = ctypes.c_int()
    self.check(self.lib.ncclGetVersion(ctypes.byref(v)), "ncclGetVersion")
    return v.value

  def unique_id(self) -> bytes:
    uid = UniqueId()
    self.check(self.lib.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
    return bytes(uid.internal)

  def init_rank(self, nranks: int, uid: bytes, rank: int) -> ctypes.c_void_p:
    if len(uid) != UNIQUE_ID_BYTES: raise ValueError(f"an NCCL unique id has {UNIQUE_ID_BYTES} bytes, got {len(uid)}")
    comm, u = ctypes.c_void_p(), UniqueId()
    ctypes.memmove(u.internal, uid, UNIQUE_ID_BYTES)
    self.check(self.lib.ncclCommInitRank(ctypes.byref(comm), ctypes.c_int(nranks), u, ctypes.c_int(rank)), "ncclCommInitRank")  # id by value
    return comm

  def init_all(self, ordinals: Sequence[int]) -> list[ctypes.c_void_p]:
    comms, devs = (ctypes.c_void_p * len(ordinals))(), (ctypes.c_int * len(ordinals))(*ordinals)
    self.check(self.lib.ncclCommInitAll(comms, ctypes.c_int(len(ordinals)), devs), "ncclCommInitAll")
    return [ctypes.c_void_p(c) for c in comms]

  def group_start(self) -> None: self.check(self.lib.ncclGroupStart(), "ncclGroupStart")
  def group_end(self) -> None: self.check(self.lib.ncclGroupEnd(), "ncclGroupEnd", ok=(SUCCESS, IN_PROGRESS))

  def all_reduce(self, send: int, recv: int, count: int, dtype: int, op: int, comm: Any, stream: Any) -> None:
    self.check(self.lib.ncclAllReduce(ctypes.c_void_p(send), ctypes.c_void_p(recv), ctypes.c_size_t(count), ctypes.c_int(dtype),
                                      ctypes.c_int(op), comm, stream), "ncclAllReduce", comm, (SUCCESS, IN_PROGRESS))

  def all_gather(self, send: int, recv: int, sendcount: int, dtype: int, comm: Any, stream: Any) -> None:
    self.check(self.lib.ncclAllGather(ctypes.c_void_p(send), ctypes.c_void_p(recv), ctypes.c_size_t(sendcount), ctypes.c_int(dtype),
                                      comm, stream), "ncclAllGather", comm, (SUCCESS, IN_PROGRESS))

  def reduce_scatter(self, send: int, recv: int, recvcount: int, dtype: int, op: int, comm: Any, stream: Any) -> None:
    self.check(self.lib.ncclReduceScatter(ctypes.c_void_p(send), ctypes.c_void_p(recv), ctypes.c_size_t(recvcount), ctypes.c_int(dtype),
                                          ctypes.c_int(op), comm, stream), "ncclReduceScatter", comm, (SUCCESS, IN_PROGRESS))

  def broadcast(self, send: int, recv: int, count: int, dtype: int, root: int, comm: Any, stream: Any) -> None:
    self.check(self.lib.ncclBroadcast(ctypes.c_void_p(send), ctypes.c_void_p(recv), ctypes.c_size_t(count), ctypes.c_int(dtype),
                                      ctypes.c_int(root), comm, stream), "ncclBroadcast", comm, (SUCCESS, IN_PROGRESS))

  def send(self, buf: int, count: int, dtype: int, peer: int, comm: Any, stream: Any) -> None:
    self.check(self.lib.ncclSend(ctypes.c_void_p(buf), ctypes.c_size_t(count), ctypes.c_int(dtype), ctypes.c_int(peer), comm, stream),
               "ncclSend", comm, (SUCCESS, IN_PROGRESS))

  def recv(self, buf: int, count: int, dtype: int, peer: int, comm: Any, stream: Any) -> None:
    self.check(self.lib.ncclRecv(ctypes.c_void_p(buf), ctypes.c_size_t(count), ctypes.c_int(dtype), ctypes.c_int(peer), comm, stream),
               "ncclRecv", comm, (SUCCESS, IN_PROGRESS))

  def async_error(self, comm: Any) -> int:
    r = ctypes.c_int()
    self.check(self.lib.ncclCommGetAsyncError(comm, ctypes.byref(r)), "ncclCommGetAsyncError")
    return r.value

  def abort(self, comm: Any) -> None: self.lib.ncclCommAbort(comm)  # its result is of no use: the communicator is gone either way

  def destroy(self, comm: Any) -> None:
    if hasattr(self.lib, "ncclCommFinalize"): self.check(self.lib.ncclCommFinalize(comm), "ncclCommFinalize", comm, (SUCCESS, IN_PROGRESS))
    self.check(self.lib.ncclCommDestroy(comm), "ncclCommDestroy")


class _Worker:
  """One thread that makes an engine's NCCL calls; the caller waits for each batch within a deadline."""

  def __init__(self) -> None:
    self.jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
    threading.Thread(target=self._loop, name="plugrt-nccl", daemon=True).start()

  def _loop(self) -> None:
    while True:
      fn, done, box = self.jobs.get()
      try: box.append((True, fn()))
      except BaseException as e: box.append((False, e))
      done.set()

  def call(self, fn: Callable[[], Any], deadline: float) -> tuple[bool, Any] | None:
    """(ok, result or exception) of fn() on the worker, or None when the deadline passed first (it still runs)."""
    done, box = threading.Event(), []
    self.jobs.put((fn, done, box))
    return box[0] if done.wait(max(deadline - time.monotonic(), 0)) else None


class NCCLEngine(Engine):
  """Communicators of NCCL over the request's CUDA devices: all of them (local: ncclCommInitAll) or one per process
  (ncclCommInitRank from rank 0's unique id). `lib` and `stream_done` stand in for NCCL and the driver in tests."""
  name = "NCCL"

  def __init__(self, request: EngineRequest, lib: NCCL | None = None, stream_done: Callable[[Any], bool] | None = None,
               states: Sequence[Any] | None = None):
    self.devices = list(request.devices)
    self.states = list(states) if states is not None else [d.info.state for d in self.devices]
    self.nccl = lib if lib is not None else NCCL(load(request.devices[0].info.context.env))
    self.stream_done = stream_done or _stream_done
    self.timeout, self.ranks, self.size = request.timeout, request.ranks, request.world_size
    self.worker, self.comms, self.broken = _Worker(), [], False
    # one process's communicators over several GPUs (ncclCommInitAll) have no remote rank to wait for: once the first
    # collective connected them, calls are issued on the caller's thread (the worker's hand-off per call would cost a
    # visible share of a collective: docs/performance.md); a rank of several processes always issues on the worker
    self.local, self.connected = len(self.states) > 1 or request.share is None, False
    self._meta: dict[tuple[str, int], Any] = {}
    deadline = time.monotonic() + self.timeout
    if self.local:
      self.comms = self._on_worker(lambda: self.nccl.init_all([s.index for s in self.states]), "ncclCommInitAll", deadline)
    else:
      uid = request.share(self.nccl.unique_id)  # rank 0 makes it; the launcher's channel hands it to every rank
      state = self.states[0]

      def init() -> ctypes.c_void_p:
        state.make_current()
        return self.nccl.init_rank(self.size, uid, self.ranks[0])
      self.comms = [self._on_worker(init, f"ncclCommInitRank (rank {self.ranks[0]} of {self.size})", deadline)]

  # ---- bounded waits
  def _on_worker(self, fn: Callable[[], Any], what: str, deadline: float) -> Any:
    got = self.worker.call(fn, deadline)
    if got is None: self._timeout(what)
    ok, value = got  # type: ignore[misc]
    if not ok:
      if isinstance(value, NCCLError): self._fail(value)
      raise value
    return value

  def _timeout(self, what: str) -> None:
    self.abort()
    raise CollectiveTimeout(f"{what} did not finish within {self.timeout:g} s: a rank died, hangs, or called another collective; "
                            "the communicator is aborted (ncclCommAbort)", "make a new communicator on every rank (or end the job); "
                            "raise the timeout (timeout=, PLUGRT_DIST_TIMEOUT) if the work is just slow", rank=self.ranks[0])

  def _fail(self, e: NCCLError) -> None:
    self.abort()
    raise NCCLError(e.message + "; the communicator is aborted", e.hint, rank=self.ranks[0]) from None

  def _wait(self, which: Sequence[int], what: str, deadline: float) -> None:
    """Poll the streams of the devices `which` (local indices) and their communicators' async errors until done."""
    pending, start = list(which), time.monotonic()
    checked = start
    while pending:
      pending = [i for i in pending if not self.stream_done(self.states[i])]
      now = time.monotonic()
      # NCCL's own error state: asked every millisecond while waiting, not every spin, and once at the end (an aborted
      # collective's kernels end too, so a finished stream alone does not mean the data arrived)
      if not pending or now - checked >= ERROR_CHECK_S or now > deadline:
        checked = now
        for i in pending or which:
          if (err := self.nccl.async_error(self.comms[i])) not in (SUCCESS, IN_PROGRESS):
            self._fail(NCCLError(f"{what}: NCCL reported {RESULTS.get(err, err)} on device {self.states[i].index}"))
      if not pending: return
      if now > deadline: self._timeout(what)
      # spin through the first SPIN_S (a large all-reduce over NVLink ends within it, and a fixed sleep would add a
      # sizeable share to it), then sleep a small share of the time waited so far: the added latency stays near 2%
      if now - start > SPIN_S: time.sleep(min(1e-3, 0.02 * (now - start)))

  # ---- the engine's contract
  def run(self, calls: Sequence[Call]) -> None:
    if self.broken: raise CollectiveError("the NCCL communicator was aborted", "make a new communicator", rank=self.ranks[0])
    deadline = time.monotonic() + self.timeout
    local = {r: i for i, r in enumerate(self.ranks)}
    which = sorted({local[c.rank] for c in calls})
    for c in calls:
      if c.kind in ("all_reduce", "reduce_scatter") and c.dtype.name not in DTYPES:
        raise UnsupportedError(f"NCCL cannot reduce {c.dtype.name}", "reduce a copy cast to int32 (or float32)")

    def issue() -> None:
      from plugrt_cuda import device
      try:
        self.nccl.group_start()
        try:
          for c in calls: self._issue(c, local[c.rank])
        finally: self.nccl.group_end()
      finally: device._tls.ctx = None  # NCCL switched this thread's current device: plugrt's cache of it is stale
    what = ", ".join(c.kind for c in calls)
    if self.local and self.connected:  # every rank is this process's and NCCL is connected: the calls only enqueue
      try: issue()
      except NCCLError as e: self._fail(e)
    else:
      self._on_worker(issue, what, deadline)
      self.connected = True
    self._wait(which, what, deadline)

  def _issue(self, c: Call, i: int) -> None:
    n, comm, stream = self.nccl, self.comms[i], self.states[i].stream
    ptr = lambda b: b.device.allocator._pointer(b.handle) if b is not None else 0  # CUDA's: the handle, its device address
    k = c.kind
    if k == "all_reduce": n.all_reduce(ptr(c.send), ptr(c.recv), c.count, DTYPES[c.dtype.name], OPS[c.op], comm, stream)
    elif k == "reduce_scatter": n.reduce_scatter(ptr(c.send), ptr(c.recv), c.count // self.size, DTYPES[c.dtype.name], OPS[c.op], comm, stream)
    # moves without arithmetic go as bytes: every dtype (bool, int16, images' bases) is then one NCCL type
    elif k == "all_gather": n.all_gather(ptr(c.send), ptr(c.recv), c.count * c.dtype.itemsize, UINT8, comm, stream)
    elif k == "broadcast": n.broadcast(ptr(c.send), ptr(c.recv), c.count * c.dtype.itemsize, UINT8, c.peer, comm, stream)
    elif k == "send": n.send(ptr(c.send), c.count * c.dtype.itemsize, UINT8, c.peer, comm, stream)
    elif k == "recv": n.recv(ptr(c.recv), c.count * c.dtype.itemsize, UINT8, c.peer, comm, stream)
    elif k == "barrier":  # NCCL has none: an all-reduce of one byte is one
      n.all_reduce(self._scratch(i), self._scratch(i), 1, UINT8, OPS["sum"], comm, stream)
    else: raise ValueError(f"unknown collective {k!r}")

  def _scratch(self, i: int) -> int:
    from plugrt.device import Buffer
    if (b := self._meta.get(("barrier", i))) is None: b = self._meta["barrier", i] = Buffer(self.devices[i], 1, "uint8")
    return b.device.allocator._pointer(b.handle)

  def _bytes(self, n: int) -> Any:
    from plugrt.device import Buffer
    return Buffer(self.devices[0], n, "uint8")

  def allgather_meta(self, meta: bytes) -> list[bytes]:
    from plugrt.dtype import dtypes
    send, recv = self._bytes(len(meta)).copyin(meta), self._bytes(len(meta) * self.size)
    self.run([Call("all_gather", self.ranks[0], send, recv, len(meta), dtypes.uint8)])
    out = recv.tobytes()
    return [out[i * len(meta):(i + 1) * len(meta)] for i in range(self.size)]

  def swap_meta(self, items: Sequence[tuple[Any, ...]]) -> list[bytes]:
    from plugrt.dtype import dtypes
    calls, outs = [], []
    for peer, meta, *nb in items:
      s, r = self._bytes(len(meta)).copyin(meta), self._bytes(nb[0] if nb else len(meta))
      calls += [Call("send", self.ranks[0], s, None, len(meta), dtypes.uint8, "", peer),
                Call("recv", self.ranks[0], None, r, r.size, dtypes.uint8, "", peer)]
      outs.append(r)
    self.run(calls)
    return [r.tobytes() for r in outs]

  def abort(self) -> None:
    if self.broken: return
    self.broken = True
    for c in self.comms: self.nccl.abort(c)

  def close(self) -> None:
    if self.broken: return
    self.broken = True
    for c in self.comms: self.nccl.destroy(c)


def _stream_done(state: Any) -> bool:
  """Whether everything queued on the device's plugrt stream is done (cuStreamQuery: 0 done, 600 not ready)."""
  from plugrt_cuda import driver as D
  state.make_current()
  r = state.lib.cuStreamQuery(state.stream)
  if r in (0, 600): return r == 0
  D.check(r, "cuStreamQuery")
  return False


def open_engine(request: EngineRequest) -> NCCLEngine:
  """plugrt_collective_engines' factory for CUDA."""
  return NCCLEngine(request)
