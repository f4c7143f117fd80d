"""The core's collective engine: MPI through mpi4py, over host memory.

Host buffers (a device whose memory DLPack calls kDLCPU) are handed to MPI in place; other devices' buffers are
staged through host copies. Every operation is MPI's non-blocking form (Iallreduce, Ibcast, Isend, ...), polled until
the communicator's timeout: a rank that died or went elsewhere is CollectiveTimeout, not a hang. float16 and bfloat16
reductions (MPI has no such types) gather the ranks' data and reduce it in float32 with numpy.
"""
from __future__ import annotations

import ctypes
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from plugrt.distributed.engine import MPI_HINT, Call, Engine, EngineRequest
from plugrt.errors import CollectiveError, CollectiveTimeout, CollectiveUnavailable, Reason
from plugrt.hookspecs import CollectiveEngineSpec, Probe

TAG_DATA, TAG_META = 0x504C, 0x504D  # "PL", "PM": data and metadata of send/recv never match each other


def _mpi() -> Any:
  try:
    from mpi4py import MPI
  except ImportError as e:
    raise CollectiveUnavailable(f"MPI cannot be used: {e}", Reason.MISSING_TOOLCHAIN, MPI_HINT) from None
  return MPI


_exit_hooked = False


def _skip_finalize() -> None:
  """After a timeout, MPI_Finalize (mpi4py runs it at exit) would wait forever for the rank that is gone: at exit, the
  process ends without it, with status 1, after flushing its output. Registered once, at the first timeout."""
  global _exit_hooked
  if _exit_hooked: return
  _exit_hooked = True
  import atexit

  def leave() -> None:  # atexit runs handlers last-registered first: this one before mpi4py's finalisation
    sys.stderr.write("plugrt.distributed: exiting without MPI_Finalize (a collective timed out: it would wait for the lost rank)\n")
    for f in (sys.stdout, sys.stderr):
      try: f.flush()
      except Exception: pass
    os._exit(1)
  atexit.register(leave)


class MPIEngine(Engine):
  name = "MPI"

  def __init__(self, request: EngineRequest):
    if request.mpi_comm is None and "mpi4py.MPI" not in sys.modules:  # importing it runs MPI_Init, unbounded: meet the ranks first
      from plugrt.distributed.rendezvous import before_mpi_init
      before_mpi_init(request.ranks[0], request.world_size, os.environ, request.timeout)
    MPI = self.MPI = _mpi()
    import numpy as np
    self.np = np
    if len(request.devices) != 1:
      raise CollectiveUnavailable("MPI runs one device per process", Reason.NO_DEVICE, "launch one process per device with mpiexec")
    comm = request.mpi_comm if request.mpi_comm is not None else MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    if (rank, size) != (request.ranks[0], request.world_size):
      raise CollectiveUnavailable(f"MPI's world is rank {rank} of {size}, the launcher says rank {request.ranks[0]} of {request.world_size}",
                                  Reason.NO_DEVICE, "launch with mpiexec -n N (MPI cannot join processes torchrun started), "
                                  "or use a device whose engine rendezvouses by itself (NCCL for CUDA)")
    self.timeout, self.rank, self.size, self.device = request.timeout, rank, size, request.devices[0]
    self.host = self.device.allocator.dlpack_device() == (1, 0)
    self._stuck: list[Any] = []  # requests (and their memory) a timeout left behind: kept alive, MPI may still write them
    self.comm = comm  # until the duplicate exists (for _wait's messages)
    new, req = comm.Idup()
    self._wait([req], "making the communicator (MPI_Comm_idup)")
    self.comm = new
    self.types = {"int8": MPI.INT8_T, "int16": MPI.INT16_T, "int32": MPI.INT32_T, "int64": MPI.INT64_T, "uint8": MPI.UINT8_T,
                  "uint16": MPI.UINT16_T, "uint32": MPI.UINT32_T, "uint64": MPI.UINT64_T, "float32": MPI.FLOAT, "float64": MPI.DOUBLE}
    self.ops = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX}

  # ---- waiting, bounded
  def _wait(self, reqs: list[Any], what: str, keep: Any = None) -> None:
    MPI, deadline, spins = self.MPI, time.monotonic() + self.timeout, 0
    try:
      while not MPI.Request.Testall(reqs):
        spins += 1
        if spins > 200:  # spin briefly (small collectives finish in microseconds), then poll gently: 2 cores may be shared
          if time.monotonic() > deadline:
            self._stuck.append((reqs, keep))
            _skip_finalize()
            raise CollectiveTimeout(f"{what} did not finish within {self.timeout:g} s: a rank died, hangs, or called another "
                                    "collective (with check=False a size mismatch can also hang)",
                                    "the communicator is unusable; end the job (mpi4py's comm.Abort() stops every rank), and "
                                    "raise the timeout (timeout=, PLUGRT_DIST_TIMEOUT) if the work is just slow", rank=self.rank)
          time.sleep(min(1e-3, 1e-5 * (spins - 200)))
    except MPI.Exception as e:
      raise CollectiveError(f"{what} failed in MPI: {e.Get_error_string()}", "a rank died or the MPI job is broken: end the job",
                            rank=self.rank) from None

  # ---- host views of buffers
  def _array(self, buf: Any, fill: bool) -> Any:
    """A numpy array over `buf`'s memory (host devices), or a host copy (`fill`: with its contents)."""
    np = self.np
    if self.host:
      if not buf.nbytes: return np.empty(0, buf.dtype.numpy)
      ptr = buf.device.allocator._pointer(buf.handle)
      return np.frombuffer((ctypes.c_uint8 * buf.nbytes).from_address(ptr), buf.dtype.numpy)
    return buf.numpy() if fill else np.empty(buf.size, buf.dtype.numpy)

  def _spec(self, arr: Any, dtype: Any) -> list[Any]:
    # [buffer, type]: mpi4py counts the elements (and divides a gather's receive buffer by the world size)
    if (t := self.types.get(dtype.name)) is not None: return [arr, t]
    return [arr.view(self.np.uint8), self.MPI.BYTE]  # bool, float16, bfloat16 move as bytes

  # ---- the engine's contract
  def run(self, calls: Sequence[Call]) -> None:
    reqs: list[Any] = []
    after: list[Callable[[], None]] = []
    keep: list[Any] = []
    for c in calls: self._issue(c, reqs, after, keep)
    self._wait(reqs, ", ".join(c.kind for c in calls), keep)
    for fn in after: fn()

  def _issue(self, c: Call, reqs: list[Any], after: list[Callable[[], None]], keep: list[Any]) -> None:
    MPI, np, comm = self.MPI, self.np, self.comm
    src = self._array(c.send, True) if c.send is not None and c.send is not c.recv else None
    dst = self._array(c.recv, c.kind in ("all_reduce", "broadcast")) if c.recv is not None else None
    if src is not None and dst is not None and self.host and np.shares_memory(src, dst): src = src.copy()  # MPI forbids aliasing
    keep += [src, dst]
    if not self.host and dst is not None: after.append(lambda: c.recv.copyin(dst))
    k = c.kind
    if k in ("all_reduce", "reduce_scatter") and c.dtype.name not in self.types:
      return self._gathered_reduce(c, src if src is not None else dst, dst, reqs, after, keep)
    if k == "all_reduce":
      reqs.append(comm.Iallreduce(MPI.IN_PLACE if src is None else self._spec(src, c.dtype), self._spec(dst, c.dtype), self.ops[c.op]))
    elif k == "reduce_scatter": reqs.append(comm.Ireduce_scatter_block(self._spec(src, c.dtype), self._spec(dst, c.dtype), self.ops[c.op]))
    elif k == "all_gather": reqs.append(comm.Iallgather(self._spec(src, c.dtype), self._spec(dst, c.dtype)))
    elif k == "broadcast": reqs.append(comm.Ibcast(self._spec(dst, c.dtype), root=c.peer))
    elif k == "send": reqs.append(comm.Isend(self._spec(src, c.dtype), dest=c.peer, tag=TAG_DATA))
    elif k == "recv": reqs.append(comm.Irecv(self._spec(dst, c.dtype), source=c.peer, tag=TAG_DATA))
    elif k == "barrier": reqs.append(comm.Ibarrier())
    else: raise ValueError(f"unknown collective {k!r}")

  def _gathered_reduce(self, c: Call, src: Any, dst: Any, reqs: list[Any], after: list[Callable[[], None]], keep: list[Any]) -> None:
    """float16/bfloat16: gather every rank's data, reduce in float32 here (each rank the same way: same result)."""
    np = self.np
    mine = src.copy() if src is dst else src
    every = np.empty(self.size * mine.size, mine.dtype)
    keep += [mine, every]
    reqs.append(self.comm.Iallgather([mine.view(np.uint8), self.MPI.BYTE], [every.view(np.uint8), self.MPI.BYTE]))

    def reduce() -> None:
      from plugrt.dtype import bf16_to_f32, f32_to_bf16
      bf = c.dtype.name == "bfloat16"
      rows = (bf16_to_f32(every) if bf else every.astype(np.float32)).reshape(self.size, -1)
      out = {"sum": np.sum, "prod": np.prod, "min": np.min, "max": np.max}[c.op](rows, axis=0)
      if c.kind == "reduce_scatter": out = out[self.rank * dst.size:(self.rank + 1) * dst.size]
      dst[...] = f32_to_bf16(out) if bf else out.astype(dst.dtype)
    after.insert(0, reduce)  # before the staged copy back into a device buffer

  def allgather_meta(self, meta: bytes) -> list[bytes]:
    out = bytearray(len(meta) * self.size)
    self._wait([self.comm.Iallgather([meta, self.MPI.BYTE], [out, self.MPI.BYTE])], "the metadata check (MPI_Iallgather)", (meta, out))
    return [bytes(out[i * len(meta):(i + 1) * len(meta)]) for i in range(self.size)]

  def swap_meta(self, items: Sequence[tuple[Any, ...]]) -> list[bytes]:
    reqs, outs = [], []
    for peer, meta, *n in items:
      outs.append(out := bytearray(n[0] if n else len(meta)))
      reqs += [self.comm.Isend([meta, self.MPI.BYTE], dest=peer, tag=TAG_META), self.comm.Irecv([out, self.MPI.BYTE], source=peer, tag=TAG_META)]
    self._wait(reqs, f"the send/recv metadata check with rank{'s' if len(items) > 1 else ''} {', '.join(str(i[0]) for i in items)}",
               (items, outs))
    return [bytes(o) for o in outs]

  def abort(self) -> None:
    pass  # MPI cannot drop one communicator without the others; its requests stay alive in _stuck (comm.Abort ends the job)

  def close(self) -> None:
    if self._stuck or self.comm is None: return
    comm, self.comm = self.comm, None
    comm.Free()


def _mpi_probe(ctx: Any = None) -> Probe:
  import importlib.util
  if importlib.util.find_spec("mpi4py") is None:
    return Probe.missing(Reason.MISSING_TOOLCHAIN, "mpi4py is not installed", MPI_HINT)
  return Probe.found(1, "mpi4py")


def _mpi_open(request: EngineRequest) -> Engine: return MPIEngine(request)


#: the core's own engine: MPI over host memory, for any device (device memory is staged through the host)
MPI_SPEC = CollectiveEngineSpec("MPI", "", _mpi_probe, _mpi_open, local=False, priority=-100,
                                description="MPI through mpi4py, over host memory (any device; device buffers are staged)")
