"""The seam between plugrt.distributed and the libraries that move the bytes (NCCL, MPI, RCCL later).

An engine is declared by a plugin through the `plugrt_collective_engines` hook (plugrt.hookspecs.CollectiveEngineSpec)
or is the core's own MPI engine. Its factory runs once per communicator and returns an `Engine`; every collective then
calls `Engine.run` directly: no hook, no registry lookup, no pluggy call per collective.
"""
from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from plugrt.errors import CollectiveTimeout, CollectiveUnavailable, Reason
from plugrt.hookspecs import CollectiveEngineSpec, Probe

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


def _mpi_probe(ctx: Any = None) -> Probe:
  import importlib.util
  if importlib.util.find_spec("mpi4py") is None:
    return Probe.missing(Reason.MISSING_TOOLCHAIN, "mpi4py is not installed", MPI_HINT)
  return Probe.found(1, "mpi4py")


def _mpi_open(request: EngineRequest) -> Engine:
  from plugrt.distributed.mpi import MPIEngine
  return MPIEngine(request)


MPI_HINT = "pip install mpi4py mpich (or 'plugrt[distributed]'), then launch with mpiexec -n N python ..."
#: the core's own engine: MPI over host memory, for any device (device memory is staged through the host)
MPI_SPEC = CollectiveEngineSpec("MPI", "", _mpi_probe, _mpi_open, local=False, priority=-100,
                                description="MPI through mpi4py, over host memory (any device; device buffers are staged)")

_DECLARED: weakref.WeakKeyDictionary[Any, list[tuple[CollectiveEngineSpec, Any]]] = weakref.WeakKeyDictionary()


def engines(registry: Any = None) -> list[tuple[CollectiveEngineSpec, Any]]:
  """(spec, plugin record or None) of every engine the registry's plugins declare, then the core's MPI engine, in
  automatic-choice order (device-specific first, then priority, then name). Read once per registry."""
  from plugrt.registry import current
  reg = (registry or current()).load()
  if (found := _DECLARED.get(reg)) is None:
    found = list(reg.declared("plugrt_collective_engines", CollectiveEngineSpec))
    found.append((MPI_SPEC, None))
    found.sort(key=lambda e: (not e[0].device, -e[0].priority, e[0].name))
    _DECLARED[reg] = found
  return found


def engine_rows(registry: Any = None) -> list[dict[str, Any]]:
  """One row per collective engine for `plugrt devices`: name, device, package, available, reason, detail, hint; then
  one row (engine "?") per plugin whose plugrt_collective_engines raised, overran its limit or returned garbage."""
  from plugrt.registry import current
  reg = (registry or current()).load()
  rows = [{"engine": spec.name, **reg.declared_status("collective", spec, rec), "local": spec.local} for spec, rec in engines(reg)]
  return rows + [{"engine": "?", "device": "-", "package": rec.package, "available": False, "reason": p.reason.value if p.reason else None,
                  "detail": p.detail, "hint": p.hint, "description": "", "local": False}
                 for rec, p in reg.declaration_failures("plugrt_collective_engines")]


def start(spec: CollectiveEngineSpec, request: EngineRequest, registry: Any = None) -> Any:
  """spec.open(request). A plugin's factory runs as its device opens do (on the worker, its output moved to stderr, the
  registry refused to it), bounded by the request's timeout and a grace (a tenth of it and 1 s, so an engine that keeps
  its own deadline reports its own CollectiveTimeout first): past that, CollectiveTimeout, and the plugin is stalled for
  the process. The core's MPI engine bounds its own waits and runs here (MPI_Init belongs on the main thread)."""
  from plugrt.registry import PluginTimeout, current
  reg = (registry or current()).load()
  rec = next((r for s, r in engines(reg) if s is spec), None)
  if rec is None: return spec.open(request)
  limit = request.timeout * 1.1 + 1
  hint = (f"{spec.name}'s factory ignored the timeout: report this to {rec.package}'s authors; pick another engine (engine=), "
          f"or PLUGRT_DISABLE={rec.entry}")
  try: return reg.run_plugin(rec, f"opening collective engine {spec.name}", spec.open, request, limit=limit, variable="PLUGRT_DIST_TIMEOUT",
                             hint=hint)
  except PluginTimeout as e:
    raise CollectiveTimeout(e.probe.detail + f" (the communicator's timeout is {request.timeout:g} s)", e.probe.hint,
                            rank=request.ranks[0] if len(request.ranks) == 1 else None) from None


def choose(kind: str, local: bool, engine: str | None, registry: Any = None) -> CollectiveEngineSpec:
  """The engine for devices of `kind`: the one named `engine`, else the first usable one that serves the kind
  (an engine for "" serves every kind). CollectiveUnavailable lists why each was passed over."""
  from plugrt.registry import current
  reg = (registry or current()).load()
  found = engines(reg)
  if engine is not None:
    chosen = [e for e in found if e[0].name == engine.upper()]
    if not chosen:
      from plugrt.errors import UnknownDeviceError, did_you_mean
      names = [e[0].name for e in found]
      also = "".join(f"; plugin {rec.entry} declared none: {p.detail}" for rec, p in reg.declaration_failures("plugrt_collective_engines"))
      raise UnknownDeviceError(f"no collective engine is named {engine}{did_you_mean(engine, names)}", f"engines: {', '.join(names)}{also}")
  else: chosen = found
  reasons: dict[str, str] = {}
  first: tuple[Reason, str] | None = None
  for spec, rec in chosen:
    why: tuple[Reason, str, str] | None = None
    if spec.device and spec.device != kind: why = (Reason.NO_DEVICE, f"it moves {spec.device} memory, not {kind}", "")
    elif local and not spec.local:
      why = (Reason.NO_DEVICE, "it runs one device per process", "launch one process per device (mpiexec, torchrun)")
    elif not (p := reg._probe(("collective", spec.name), spec.probe, rec)).ok: why = (p.reason or Reason.NOT_INSTALLED, p.detail, p.hint)
    else: return spec
    reasons[spec.name] = why[1] + (f" (fix: {why[2]})" if why[2] else "")
    if first is None or (first[0] is Reason.NO_DEVICE and why[0] is not Reason.NO_DEVICE): first = (why[0], why[2])
  if engine is None:
    for rec, p in reg.declaration_failures("plugrt_collective_engines"):  # plugins whose engines are missing: say why
      reasons[f"plugin {rec.entry}"] = p.detail + (f" (fix: {p.hint})" if p.hint else "")
  detail = "; ".join(f"{n}: {r}" for n, r in reasons.items())
  assert first is not None
  raise CollectiveUnavailable(f"no collective engine can serve {kind} {'in one process' if local else 'across processes'} ({detail})",
                              first[0], first[1], reasons)
