"""Collectives over plugrt Buffers and Tensors, on existing engines (NCCL for CUDA, MPI for host memory).

    import plugrt.distributed as dist
    comm = dist.from_env()                      # torchrun's or mpiexec's variables: one device per process
    comm.all_reduce(buf)                        # in place, sum; op="prod", "min", "max"
    comms = dist.Communicator.local(["CUDA:0", "CUDA:1"])   # one process driving several GPUs
    with dist.group():
      for c, b in zip(comms, bufs): c.all_reduce(b)

docs/distributed.md has the launcher recipes (torchrun, mpirun + mpi4py, Ray), the metadata check and its cost, and
the error behaviour. `import plugrt` does not import this package; this package imports no engine until a
communicator is made.
"""
from __future__ import annotations

import enum
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from plugrt.distributed.choice import choose, engines, start
from plugrt.distributed.comm import Communicator, group, make_communicators
from plugrt.distributed.engine import Call, Engine, EngineRequest
from plugrt.errors import CollectiveError, CollectiveMismatch, CollectiveTimeout, CollectiveUnavailable, EnvError, RankError

__all__ = ["Call", "CollectiveError", "CollectiveMismatch", "CollectiveTimeout", "CollectiveUnavailable", "Communicator", "Engine",
           "EngineRequest", "RankError", "ReduceOp", "engines", "from_env", "from_id", "from_mpi", "group", "unique_id"]

#: seconds a collective (or the communicator's setup) may take before CollectiveTimeout
DEFAULT_TIMEOUT = 300.0


class ReduceOp(str, enum.Enum):
  SUM = "sum"
  PROD = "prod"
  MIN = "min"
  MAX = "max"


def _settings(timeout: float | None, check: bool | None, env: Mapping[str, str]) -> tuple[float, bool]:
  if timeout is None:
    v = env.get("PLUGRT_DIST_TIMEOUT", "")
    try: timeout = float(v) if v else DEFAULT_TIMEOUT
    except ValueError: raise EnvError(f"PLUGRT_DIST_TIMEOUT={v!r} is not a number of seconds", "e.g. PLUGRT_DIST_TIMEOUT=60") from None
  if not timeout > 0: raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
  if check is None:
    v = env.get("PLUGRT_DIST_CHECK", "1")
    if v not in ("0", "1"): raise EnvError(f"PLUGRT_DIST_CHECK={v!r} must be 0 or 1", "PLUGRT_DIST_CHECK=0 turns the metadata check off")
    check = v == "1"
  return float(timeout), bool(check)


def _open(devices: list[Any], ranks: tuple[int, ...], size: int, share: Callable[[Callable[[], bytes]], bytes] | None,
          engine: str | None, timeout: float | None, check: bool | None, local: bool, mpi_comm: Any = None) -> list[Communicator]:
  from plugrt.device import _device
  from plugrt.registry import current
  reg = current().load()
  timeout, check = _settings(timeout, check, reg.env)
  if not devices: raise ValueError("a communicator needs at least one device")
  opened = [_device(d) for d in devices]
  if len({id(d) for d in opened}) != len(opened):
    raise ValueError(f"devices repeat: {[d.canonical for d in opened]}; give each rank its own device")
  kinds = {d.name for d in opened}
  if len(kinds) != 1: raise TypeError(f"a communicator's devices must be of one kind, got {sorted(kinds)}")
  spec = choose(kinds.pop(), local, engine, reg)
  eng = start(spec, EngineRequest(tuple(opened), ranks, size, share, timeout, mpi_comm), reg)
  return make_communicators(eng, opened, ranks, size, local, check)


def _local(devices: Sequence[Any], engine: str | None = None, timeout: float | None = None, check: bool | None = None) -> list[Communicator]:
  """One communicator per device in `devices`, all driven by this process (NCCL's ncclCommInitAll): rank i is
  devices[i]. Their collectives run together: one call per communicator inside `with group():`."""
  return _open(list(devices), tuple(range(len(devices))), len(devices), None, engine, timeout, check, local=True)


Communicator.local = staticmethod(_local)  # type: ignore[assignment]


def _int_env(env: Mapping[str, str], names: Sequence[str]) -> tuple[str, int] | None:
  for n in names:
    if (v := env.get(n)) is not None:
      try: return n, int(v)
      except ValueError: raise EnvError(f"{n}={v!r} is not a whole number", "the launcher sets it; do not set it by hand") from None
  return None


def _world(env: Mapping[str, str]) -> tuple[int, int, int]:
  """(rank, world size, local rank) from torchrun's, MPICH's or Open MPI's variables."""
  rank = _int_env(env, ("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK"))
  size = _int_env(env, ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE"))
  if rank is None or size is None:
    raise EnvError("no launcher told this process its rank: RANK and WORLD_SIZE (torchrun), PMI_RANK and PMI_SIZE (mpiexec of MPICH) "
                   "or OMPI_COMM_WORLD_RANK and _SIZE (Open MPI) are not set",
                   "launch with torchrun --nproc-per-node N or mpiexec -n N; or use from_mpi(comm), or Communicator.local")
  local = _int_env(env, ("LOCAL_RANK", "MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK"))
  if size[1] < 1: raise RankError(f"{size[0]}={size[1]}: the world size must be at least 1")
  if not 0 <= rank[1] < size[1]: raise RankError(f"{rank[0]}={rank[1]} is not a rank of a world of {size[0]}={size[1]}")
  return rank[1], size[1], local[1] if local is not None else rank[1]


def _default_device(device: Any, local_rank: int) -> Any:
  """`device`, or the default device's kind at index `local_rank` where the kind has several devices."""
  if device is not None: return device
  from plugrt.registry import current
  reg = current().load()
  # the default's kind without opening it (Device.DEFAULT would open GPU 0 in every rank's process)
  if (chosen := reg.selection.default) is not None:
    name = chosen.device_string
    if ":" in name.split("+")[-1]: return name  # DEV named a device: that one
  else:
    found = reg.available()
    if not found: return None  # _open's Device lookup explains why nothing is available
    name = found[0]
  kind = name.split("+")[-1].split(":")[0]
  return f"{kind}:{local_rank}" if reg.probe(kind).count > 1 else kind


def from_env(device: Any = None, *, engine: str | None = None, timeout: float | None = None, check: bool | None = None,
             env: Mapping[str, str] | None = None) -> Communicator:
  """This process's communicator, from its launcher's variables (torchrun: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
  MASTER_PORT; mpiexec: PMI_RANK/OMPI_COMM_WORLD_RANK and friends). `device` defaults to the default device's kind
  at LOCAL_RANK. Engines that need a shared id (NCCL) get it from rank 0 through a TCP rendezvous at MASTER_ADDR:MASTER_PORT
  (torch.distributed's TCPStore when torch is importable, else the standard library's sockets); MPI needs none."""
  env = os.environ if env is None else env
  rank, size, local_rank = _world(env)
  timeout, check = _settings(timeout, check, env)

  def share(make: Callable[[], bytes]) -> bytes:
    from plugrt.distributed.rendezvous import share_from_env
    return share_from_env(make, rank, size, env, timeout)
  return _open([_default_device(device, local_rank)], (rank,), size, share, engine, timeout, check, local=False)[0]


def from_mpi(comm: Any = None, device: Any = None, *, engine: str | None = None, timeout: float | None = None,
             check: bool | None = None) -> Communicator:
  """This process's communicator over an mpi4py communicator (default COMM_WORLD): its rank and size; an engine that
  needs a shared id (NCCL) gets rank 0's by comm.bcast. `device` defaults to the default device's kind at this rank
  within its node."""
  from mpi4py import MPI
  comm = MPI.COMM_WORLD if comm is None else comm
  rank, size = comm.Get_rank(), comm.Get_size()
  local_rank = 0
  if device is None:  # this rank's index among the ranks of its node picks its GPU
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    local_rank = node.Get_rank()
    node.Free()

  def share(make: Callable[[], bytes]) -> bytes:
    return comm.bcast(make() if rank == 0 else None, root=0)
  return _open([_default_device(device, local_rank)], (rank,), size, share, engine, timeout, check, local=False, mpi_comm=comm)[0]


def unique_id(kind: str = "CUDA", engine: str | None = None) -> bytes:
  """A new id for the ranks of one communicator to share (NCCL's ncclUniqueId), made by the engine that serves `kind`;
  pass it to every rank's from_id (through Ray, a file, a queue: any channel the job has)."""
  from plugrt.registry import current
  registry = current().load()
  spec = choose(kind.upper(), False, engine, registry)
  if spec.unique_id is None:
    from plugrt.errors import UnsupportedError
    raise UnsupportedError(f"the {spec.name} engine needs no shared id", "use from_env or from_mpi")
  rec = next((r for s, r in engines(registry) if s is spec), None)
  # the plugin reads its settings (PLUGRT_NCCL_LIBRARY) from the context, as a probe does; it runs as an open does (PLUGRT_OPEN_TIMEOUT)
  if rec is None: return spec.unique_id(registry.context)
  return registry.run_plugin(rec, f"making a unique id for collective engine {spec.name}", spec.unique_id, registry.context)


def from_id(uid: bytes, rank: int, size: int, device: Any = None, *, engine: str | None = None, timeout: float | None = None,
            check: bool | None = None) -> Communicator:
  """Rank `rank` of `size`, from an id unique_id() made and the job handed to every rank (the Ray recipe in
  docs/distributed.md). `device` defaults to the default device."""
  if not isinstance(size, int) or size < 1: raise RankError(f"the world size must be a positive int, got {size!r}")
  if not isinstance(rank, int) or not 0 <= rank < size: raise RankError(f"rank {rank!r} is not a rank of a world of {size}")
  return _open([_default_device(device, 0)], (rank,), size, lambda make: bytes(uid), engine, timeout, check, local=False)[0]


_ = (CollectiveError, CollectiveMismatch, CollectiveTimeout, CollectiveUnavailable, Call, Engine, engines)  # re-exported
