"""The core owns the launch (issue 28): no first-party backend writes its own launch or replay, and backends written
for the earlier plugin APIs, whose programs define __call__ themselves, still load and run.

The scan reads every first-party module's classes (the core, each plugin, examples/ops_interp): a class deriving from a
Program or a Graph (by base name, transitively within the first-party code) defines no __call__, except the core's
own launch and replay (plugrt.runtime.Program, LockedProgram, Graph).
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from plugrt import Buffer, dtypes
from plugrt.runtime import Graph, LockedProgram, Program

ROOT = Path(__file__).resolve().parent.parent
SOURCES = [ROOT / "core" / "plugrt", *sorted((ROOT / "plugins").glob("ops_*")), ROOT / "examples" / "ops_interp"]
CORE_LAUNCH = {("plugrt/runtime.py", "Program"), ("plugrt/runtime.py", "LockedProgram"), ("plugrt/runtime.py", "Graph")}


def classes() -> list[tuple[str, str, list[str], bool]]:
  """(file, class, base names, whether it defines __call__) of every first-party class outside tests and build copies."""
  out = []
  for root in SOURCES:
    for path in sorted(root.rglob("*.py")):
      rel = path.relative_to(root.parent if root.name == "plugrt" else root).as_posix()
      if "/tests/" in f"/{rel}" or "/build/" in f"/{rel}": continue
      for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ClassDef):
          bases = [b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else "" for b in node.bases]
          calls = any(isinstance(n, ast.FunctionDef) and n.name == "__call__" for n in node.body)
          out.append((rel, node.name, bases, calls))
  return out


def launch_classes() -> dict[str, set[str]]:
  """Program and Graph classes by kind: every class whose bases lead to the core's Program or Graph by name."""
  found = classes()
  kinds = {"Program": {"Program"}, "Graph": {"Graph"}}
  for _ in range(10):  # to a fixed point: subclasses of subclasses
    for _, name, bases, _ in found:
      for names in kinds.values():
        if any(b in names for b in bases): names.add(name)
  return kinds


def test_the_scan_finds_every_backends_program_and_graph() -> None:
  kinds = launch_classes()
  for name in ("CPUProgram", "CUDAProgram", "CLProgram", "WebGPUProgram", "MetalProgram", "NVProgram", "AMDProgram",
               "QCOMProgram", "PythonProgram", "InterpProgram", "HCQProgram"):
    assert name in kinds["Program"], name
  for name in ("CUDAGraph", "MetalGraph", "HCQGraph"): assert name in kinds["Graph"], name


def test_no_first_party_program_or_graph_defines_its_own_call() -> None:
  kinds = launch_classes()
  own = [(f, name) for f, name, _, calls in classes()
         if calls and (name in kinds["Program"] or name in kinds["Graph"]) and (f, name) not in CORE_LAUNCH]
  assert not own, f"these define __call__ (a backend supplies _encode/_timed, a graph _replay/_timed): {own}"


class OldStyleProgram(Program):
  """A program as plugin API 1.0-1.3 backends wrote them: its own __call__, the core's check_args, no _encode."""
  calls = 0

  def __call__(self, *bufs, global_size=(1, 1, 1), local_size=(1, 1, 1), vals=(), wait=False):  # type: ignore[no-untyped-def]
    gs, ls = self.check_args(bufs, vals, global_size, local_size)
    type(self).calls += 1
    out = np.frombuffer(bufs[0].handle, np.float32)  # the PYTHON allocator's handle: a memoryview of host memory
    out[: gs[0] * ls[0]] = vals[0]
    return 0.0 if wait else None


OLD_STYLE = """
from plugrt.reference.backend import PythonAllocator, PythonCompiler


@hookimpl
def plugrt_allocator(device: DeviceInfo) -> Any: return PythonAllocator(device)


@hookimpl
def plugrt_compiler(device: DeviceInfo, compiler: str) -> Any: return PythonCompiler(device)


@hookimpl
def plugrt_program(device: DeviceInfo) -> Any: return OldStyleProgram
"""


@pytest.mark.parametrize("api", ["1.0", "1.3"])
def test_an_old_style_program_with_its_own_call_still_runs(plugrt_registry, api: str) -> None:
  """A third-party backend whose Program defines __call__ (every backend before the core owned the launch) loads,
  launches through its own __call__, and its graphs replay through it."""
  import types

  from conftest import backend_source

  from plugrt.compiler.ir import KernelBuilder
  from plugrt.runtime import Launch
  mod = types.ModuleType(f"oldstyle_{api.replace('.', '_')}")
  mod.OldStyleProgram = OldStyleProgram  # type: ignore[attr-defined]
  exec(compile(backend_source("OLDSTYLE", api_version=api, device_hooks=OLD_STYLE), mod.__name__, "exec"), mod.__dict__)
  with plugrt_registry([mod]) as reg:
    dev = reg.open("OLDSTYLE")
    b = KernelBuilder("fill")
    o, v = b.buffer("o", dtypes.float32), b.scalar("v", dtypes.float32)
    o[b.global_id(0)] = v
    prg = dev.program(b.finish())
    assert isinstance(prg, OldStyleProgram) and not isinstance(prg, LockedProgram)
    out = Buffer(dev, 8, dtypes.float32)
    before = OldStyleProgram.calls
    prg(out, global_size=(2, 1, 1), local_size=(4, 1, 1), vals=(3.0,))
    assert out.numpy().tolist() == [3.0] * 8 and OldStyleProgram.calls == before + 1
    graph = dev.graph([Launch(prg, [out], (1, 1, 1), (4, 1, 1), (5.0,))])
    assert type(graph) is Graph
    graph()
    assert out.numpy().tolist() == [5.0] * 4 + [3.0] * 4 and OldStyleProgram.calls == before + 2


class _CountingLock:
  """A lock that counts how often it was taken."""
  def __init__(self) -> None: self.taken = 0
  def __enter__(self) -> None: self.taken += 1
  def __exit__(self, *exc: Any) -> None: pass


def test_a_locked_programs_repeat_submits_without_the_lock_where_its_call_can() -> None:
  """LockedProgram tries a repeated call's `unlocked` submit (PreparedCall.unlocked) before taking the lock, and takes
  the lock and `submit` when it declines (0); a new call, or one with wait=True, never tries it."""
  from plugrt.launchargs import PreparedCall, Signature
  log: list[str] = []
  answer = [1]

  class Unlockable(LockedProgram):
    def _encode(self, bufs: tuple, scalars: tuple, gs: Any, ls: Any) -> PreparedCall:
      p = PreparedCall(submit=lambda: log.append("submit"))
      p.unlocked = lambda: (log.append("unlocked"), answer[0])[1]
      return p

    def _timed(self, prepared: PreparedCall) -> float:
      log.append("timed")
      return 0.0

  prg = Unlockable("DEV", "k", b"", Signature((), (dtypes.int32,)))
  lock = prg.launch_lock = _CountingLock()
  prg(vals=(1,))
  assert log == ["submit"] and lock.taken == 1  # a new call: prepared and submitted under the lock
  prg(vals=(1,))
  assert log == ["submit", "unlocked"] and lock.taken == 1  # the repeat: no lock
  answer[0] = 0
  prg(vals=(1,))
  assert log == ["submit", "unlocked", "unlocked", "submit"] and lock.taken == 2  # declined: the lock and submit
  prg(vals=(2,))
  assert log[-1] == "submit" and log.count("unlocked") == 2 and lock.taken == 3
  answer[0] = 1
  prg(vals=(2,), wait=True)
  assert log[-1] == "timed" and log.count("unlocked") == 2 and lock.taken == 4
