"""Which collective engine a communicator uses: the engines the registry's plugins declare and the core's MPI engine,
in the order an automatic choice tries them, why each is passed over, and how a plugin's factory is started (bounded,
as the registry runs every plugin call)."""
from __future__ import annotations

import weakref
from typing import Any

from plugrt.distributed.engine import EngineRequest
from plugrt.distributed.mpi import MPI_SPEC
from plugrt.errors import CollectiveTimeout, CollectiveUnavailable, Reason
from plugrt.hookspecs import CollectiveEngineSpec

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
