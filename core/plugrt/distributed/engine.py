"""The seam between plugrt.distributed and the libraries that move the bytes (NCCL, MPI, RCCL later): what an engine is.

An engine is declared by a plugin through the `plugrt_collective_engines` hook (plugrt.hookspecs.CollectiveEngineSpec)
or is the core's own MPI engine (plugrt.distributed.mpi); plugrt.distributed.choice lists them and picks one. Its
factory runs once per communicator and returns an `Engine`; every collective then calls `Engine.run` directly: no
hook, no registry lookup, no pluggy call per collective.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

#: what a Call does; the index is the code the metadata check exchanges
KINDS = ("barrier", "all_reduce", "all_gather", "reduce_scatter", "broadcast", "send", "recv")
#: reductions; the index is the code the metadata check exchanges
OPS = ("sum", "prod", "min", "max")


class Call(NamedTuple):
  """One operation of a group, already checked by the Communicator.

  `rank` is the communicator rank issuing it (in a process that drives several devices, it picks the device);
  `send` and `recv` are plugrt Buffers (the same Buffer for in-place work, None where the kind has none); `count` is
  the elements of `send` (of `recv` for recv); `op` one of OPS for reductions ("" otherwise); `peer` the root of a
  broadcast or the other rank of a send/recv (-1 otherwise). A bool reduction arrives as max (sum) or min (prod) of
  uint8 views: engines never see bools to reduce.
  """
  kind: str
  rank: int
  send: Any
  recv: Any
  count: int
  dtype: Any
  op: str = ""
  peer: int = -1


class EngineRequest(NamedTuple):
  """What an engine's factory gets: `devices` (opened plugrt RuntimeDevices) are this process's, `ranks` their ranks
  in a world of `world_size`; `share(make)` returns rank 0's bytes on every rank (rank 0 calls `make()` to produce them;
  None where the launcher gives no channel); `timeout` bounds every wait, in seconds; `mpi_comm` is the mpi4py
  communicator from_mpi was given (None otherwise)."""
  devices: tuple[Any, ...]
  ranks: tuple[int, ...]
  world_size: int
  share: Callable[[Callable[[], bytes]], bytes] | None
  timeout: float
  mpi_comm: Any = None


class Engine:
  """One process's end of a communicator (all its local devices). Subclasses implement the methods below; each wait
  in them is bounded by the request's timeout and ends in CollectiveTimeout, after which the engine is unusable."""
  name = "?"

  def run(self, calls: Sequence[Call]) -> None:
    """Run `calls` as one group (all issued, then all waited for), and return when every one is complete:
    results are in their buffers, the send buffers may be reused."""
    raise NotImplementedError

  def allgather_meta(self, meta: bytes) -> list[bytes]:
    """Every rank's `meta` (the same length everywhere), in rank order. Only for engines with one device a process."""
    raise NotImplementedError

  def swap_meta(self, items: Sequence[tuple[Any, ...]]) -> list[bytes]:
    """For each (peer, meta[, nbytes]): send `meta` to `peer` and receive what `peer` sends back (`nbytes` of it; default
    len(meta)), all at once (peers do the same), in order. One device a process only."""
    raise NotImplementedError

  def abort(self) -> None:
    """Tear the communicator down without waiting for the other ranks (after a timeout, or on close)."""

  def close(self) -> None:
    """Free what the engine holds, once the ranks are done (every rank closes)."""


#: how to get the core's MPI engine working
MPI_HINT = "pip install mpi4py mpich (or 'plugrt[distributed]'), then launch with mpiexec -n N python ..."
