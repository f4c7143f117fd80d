"""plugrt.distributed: the API over the core's MPI engine with 2 and 3 real processes (mpiexec), every collective and
dtype against numpy, mismatches and a dead rank as typed errors within a bound; the seam (an engine a plugin declares
through plugrt_collective_engines) and the single-process group logic with an in-process loopback engine; the
launcher variables and the TCP rendezvous that hands NCCL's unique id around."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import plugrt.distributed as dist
from plugrt import Buffer, Device, Tensor, dtypes
from plugrt.distributed.choice import choose
from plugrt.distributed.comm import make_communicators
from plugrt.distributed.engine import Call, Engine
from plugrt.errors import CollectiveError, CollectiveMismatch, CollectiveUnavailable, EnvError, RankError, Reason, UnsupportedError
from plugrt.hookspecs import CollectiveEngineSpec, Probe, hookimpl
from plugrt.registry import isolated

WORKER = Path(__file__).with_name("distributed_worker.py")


def _mpiexec() -> str | None:
  import importlib.util
  if importlib.util.find_spec("mpi4py") is None: return None
  here = Path(sys.executable).with_name("mpiexec")  # the mpich wheel's, next to the venv's python
  return str(here) if here.exists() else shutil.which("mpiexec")


MPIEXEC = _mpiexec()
needs_mpi = pytest.mark.skipif(MPIEXEC is None, reason="needs mpi4py and mpiexec: pip install mpi4py mpich")


def mpirun(n: int, *args: str, limit: float = 60, extra: Sequence[str] = ()) -> tuple[int, list[str], float]:
  """Run the worker on n ranks; (exit status, its stdout lines, seconds)."""
  env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "RANK", "WORLD_SIZE", "LOCAL_RANK"))}
  t = time.monotonic()
  p = subprocess.run([MPIEXEC, *extra, "-n", str(n), sys.executable, str(WORKER), *args], capture_output=True, text=True,
                     timeout=limit, env=env, cwd=WORKER.parent)
  return p.returncode, p.stdout.splitlines() + [f"STDERR {line}" for line in p.stderr.splitlines()], time.monotonic() - t


@needs_mpi
@pytest.mark.parametrize("n", [2, 3])
def test_every_collective_and_dtype_against_numpy(n: int) -> None:
  rc, out, _ = mpirun(n, "all")
  assert rc == 0, "\n".join(out[-30:])
  assert sorted(x for x in out if x.startswith("OK")) == sorted(f"OK {r} {w}" for r in range(n) for w in ("dtypes", "extras"))


@needs_mpi
def test_device_memory_is_staged_through_the_host() -> None:
  rc, out, _ = mpirun(2, "staged")
  assert rc == 0, "\n".join(out[-30:])
  assert sum(x.startswith("OK") for x in out) == 4


@needs_mpi
def test_mismatches_are_typed_errors_on_every_rank() -> None:
  rc, out, _ = mpirun(2, "errors", "10")
  assert rc == 0, "\n".join(out[-30:])
  errs = [x.split(" ", 4) for x in out if x.startswith("ERR")]
  assert len(errs) == 8 and {e[2] for e in errs} == {"CollectiveMismatch"}  # 4 mismatches, both ranks each time
  assert all(float(e[3]) < 5 for e in errs)  # a check, not a timeout
  text = "\n".join(e[4] for e in errs)
  assert "all_reduce of 8 float32 (sum)" in text and "all_reduce of 9 float32 (sum)" in text and "8 int32" in text
  assert "broadcast of 8 float32 from root 0" in text and "met rank 1's recv of 9 float32 from rank 0" in text
  assert sorted(x for x in out if x.startswith("OK")) == ["OK 0 errors", "OK 1 errors"]  # still usable afterwards


@needs_mpi
def test_from_mpi_over_a_sub_communicator() -> None:
  rc, out, _ = mpirun(3, "from_mpi")
  assert rc == 0, "\n".join(out[-30:])
  assert sorted(x for x in out if x.startswith("OK")) == ["OK 0 from_mpi 0/2", "OK 1 from_mpi 1/2", "OK 2 outside"]


def _hydra() -> bool:
  """Whether mpiexec is MPICH's (hydra): -disable-auto-cleanup is its option."""
  return MPIEXEC is not None and "HYDRA" in subprocess.run([MPIEXEC, "--version"], capture_output=True, text=True).stdout.upper()


@needs_mpi
@pytest.mark.skipif(not _hydra(), reason="needs MPICH's mpiexec (hydra) to keep the survivors alive: pip install mpich")
def test_a_dead_rank_is_a_timeout_within_the_bound() -> None:
  # hydra's default is to kill the job when one rank dies; without it, the survivors must find out by themselves
  _, out, took = mpirun(3, "dead", "2", extra=["-disable-auto-cleanup"], limit=40)
  errs = [x.split(" ", 4) for x in out if x.startswith("ERR")]
  timeouts = [e for e in errs if e[2] == "CollectiveTimeout"]
  assert sorted(e[1] for e in timeouts) == ["0", "1"], "\n".join(out[-20:])
  assert all(1.9 < float(e[3]) < 6 for e in timeouts)
  assert sorted(e[1] for e in errs if e[2] == "CollectiveError") == ["0", "1"]  # then the broken communicator refuses work
  assert "unusable" in " ".join(e[4] for e in errs if e[2] == "CollectiveError")
  assert sum("exiting without MPI_Finalize" in x for x in out) == 2  # a plain exit does not wait for the lost rank
  assert took < 30


# ---------------------------------------------------------------- in one process: a loopback engine

class Loopback(Engine):
  """Every rank in this process: run() does each group's collectives with numpy (what a local NCCL does on GPUs)."""
  name = "LOOP"

  def __init__(self) -> None: self.groups: list[list[Call]] = []

  def run(self, calls: Sequence[Call]) -> None:
    self.groups.append(list(calls))
    by_kind: dict[str, list[Call]] = {}
    for c in calls: by_kind.setdefault(c.kind, []).append(c)
    for kind, cs in by_kind.items():
      cs.sort(key=lambda c: c.rank)
      if kind == "all_reduce":
        fn = {"sum": np.sum, "prod": np.prod, "min": np.min, "max": np.max}[cs[0].op]
        out = fn(np.stack([c.send.numpy() for c in cs]), axis=0).astype(cs[0].dtype.numpy)
        for c in cs: c.recv.copyin(out)
      elif kind == "all_gather":
        out = np.concatenate([c.send.numpy() for c in cs])
        for c in cs: c.recv.copyin(out)
      elif kind == "send":
        for c in cs: next(r for r in calls if r.kind == "recv" and r.rank == c.peer and r.peer == c.rank).recv.copyin(c.send.numpy())


@pytest.fixture
def pair() -> tuple[list[dist.Communicator], Loopback]:
  eng = Loopback()
  return make_communicators(eng, [Device["CPU"], Device["PYTHON"]], [0, 1], 2, local=True, check=True), eng


def test_local_communicators_run_together_in_a_group(pair: Any) -> None:
  (a, b), eng = pair
  x, y = Buffer.from_numpy(np.array([1, 2, 3], np.float32), a.device), Buffer.from_numpy(np.array([10, 20, 30], np.float32), b.device)
  with pytest.raises(CollectiveError, match="group"): a.all_reduce(x)  # alone, one thread would wait for the other forever
  with dist.group():
    a.all_reduce(x)
    b.all_reduce(y)
    assert eng.groups == []  # nothing runs until the group ends
  assert x.numpy().tolist() == y.numpy().tolist() == [11, 22, 33] and len(eng.groups) == 1
  with dist.group():  # bool: sum is or, prod is and (numpy's), as max/min of the bytes
    bx, by = Buffer.from_numpy(np.array([1, 0, 0], bool), a.device), Buffer.from_numpy(np.array([1, 1, 0], bool), b.device)
    a.all_reduce(bx, "prod")
    b.all_reduce(by, dist.ReduceOp.PROD)
  assert bx.numpy().tolist() == [True, False, False] and eng.groups[-1][0].op == "min" and eng.groups[-1][0].dtype is dtypes.uint8
  with dist.group():  # Tensors, written in place
    ta, tb = Tensor([[1, 2], [3, 4]], dtypes.int32, device=a.device), Tensor([[5, 6], [7, 8]], dtypes.int32, device=b.device)
    a.all_reduce(ta, "max")
    b.all_reduce(tb, "max")
  assert ta.numpy().tolist() == [[5, 6], [7, 8]]
  with dist.group():
    a.send(Buffer.from_numpy(np.arange(4, dtype=np.int64), a.device), 1)
    got = b.recv(Buffer(b.device, 4, dtypes.int64), 0)
  assert got.numpy().tolist() == [0, 1, 2, 3]


def test_local_mismatches_are_found_before_the_engine_runs(pair: Any) -> None:
  (a, b), eng = pair
  with pytest.raises(CollectiveMismatch, match=r"rank 0: all_reduce of 3 float32 \(sum\); rank 1: all_reduce of 4 float32"):
    with dist.group():
      a.all_reduce(Buffer(a.device, 3))
      b.all_reduce(Buffer(b.device, 4))
  with pytest.raises(CollectiveMismatch, match=r"ranks \[1\] made none"):
    with dist.group(): a.all_reduce(Buffer(a.device, 3))
  with pytest.raises(CollectiveMismatch, match="no recv"):
    with dist.group(): a.send(Buffer(a.device, 3), 1)
  assert eng.groups == []
  with dist.group():  # still usable
    a.all_gather(Buffer(a.device, 2), Buffer(a.device, 4))
    b.all_gather(Buffer(b.device, 2), Buffer(b.device, 4))
  assert len(eng.groups) == 1


def test_arguments_are_checked_before_anything_runs(pair: Any) -> None:
  (a, b), eng = pair
  buf = Buffer(a.device, 4)
  with pytest.raises(RankError): a.broadcast(buf, root=2)
  with pytest.raises(RankError, match="itself"): a.send(buf, 0)
  with pytest.raises(TypeError, match="int rank"): a.recv(buf, peer="1")
  with pytest.raises(TypeError, match="on PYTHON"): a.all_reduce(Buffer(b.device, 4))
  with pytest.raises(ValueError, match="op must be one of"): a.all_reduce(buf, "avg")
  with pytest.raises(ValueError, match="2 x 4 float32"): a.all_gather(buf, Buffer(a.device, 4))
  with pytest.raises(ValueError, match="reduce_scatter"): a.reduce_scatter(buf, Buffer(a.device, 4))
  with pytest.raises(ValueError, match="out must match"): a.all_reduce(buf, out=Buffer(a.device, 4, dtypes.int32))
  with pytest.raises(TypeError, match="Buffer or Tensor"): a.all_reduce(np.zeros(4, np.float32))
  t = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3), device=a.device).permute(1, 0)
  with pytest.raises(TypeError, match="strided view"): a.all_reduce(t)
  with pytest.raises(TypeError, match="made together"):
    other, _ = make_communicators(Loopback(), [Device["CPU"]], [0], 1, local=True, check=True), None
    with dist.group():
      a.barrier()
      other[0].barrier()
  assert eng.groups == []


# ---------------------------------------------------------------- the seam: an engine a plugin declares

class EnginePlugin:
  def __init__(self) -> None: self.opened: list[Any] = []

  def open(self, request: dist.EngineRequest) -> Engine:
    self.opened.append(request)
    return Loopback()

  @hookimpl
  def plugrt_collective_engines(self) -> list[CollectiveEngineSpec]:
    return [CollectiveEngineSpec("LOOP", "CPU", lambda ctx: Probe.found(1, "here"), self.open, local=True, priority=5),
            CollectiveEngineSpec("GONE", "CPU", lambda ctx: Probe.missing(Reason.MISSING_TOOLCHAIN, "libgone is missing", "pip install gone"),
                                 self.open, local=True, priority=9)]


def test_a_plugins_engine_is_found_through_the_hook() -> None:
  import plugrt_cpu
  plugin = EnginePlugin()
  with isolated([plugrt_cpu, plugin]):
    assert [s.name for s, _ in dist.engines()] == ["GONE", "LOOP", "MPI"]  # device engines first, by priority; MPI last
    (c,) = dist.Communicator.local(["CPU"], timeout=5)
    assert c.engine.name == "LOOP" and c.size == 1 and c.rank == 0
    req = plugin.opened[0]
    assert req.ranks == (0,) and req.world_size == 1 and req.timeout == 5 and req.share is None
    c.all_reduce(Buffer(c.device, 4))  # a clique of one needs no group
    with pytest.raises(CollectiveUnavailable, match="libgone is missing") as e: dist.Communicator.local(["CPU"], engine="gone")
    assert e.value.reason is Reason.MISSING_TOOLCHAIN and "pip install gone" in str(e.value)
    c.close()
    with pytest.raises(CollectiveError, match="closed"): c.barrier()


def test_no_engine_explains_each_reason(monkeypatch: pytest.MonkeyPatch) -> None:
  import plugrt_cpu
  with isolated([plugrt_cpu]):
    with pytest.raises(CollectiveUnavailable, match="MPI: it runs one device per process") as e: dist.Communicator.local(["CPU"])
    assert e.value.reasons.keys() == {"MPI"}
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mpi4py" else real(name, *a))
    with pytest.raises(CollectiveUnavailable) as e: choose("CPU", False, None)
    assert e.value.reason is Reason.MISSING_TOOLCHAIN and "pip install mpi4py" in str(e.value)


def test_launcher_variables() -> None:
  with pytest.raises(EnvError, match="torchrun"): dist._world({})
  assert dist._world({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "0"}) == (1, 4, 0)
  assert dist._world({"PMI_RANK": "2", "PMI_SIZE": "3"}) == (2, 3, 2)
  assert dist._world({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "0"}) == (0, 2, 0)
  with pytest.raises(RankError, match="RANK=4"): dist._world({"RANK": "4", "WORLD_SIZE": "4"})
  with pytest.raises(RankError, match="at least 1"): dist._world({"RANK": "0", "WORLD_SIZE": "0"})
  with pytest.raises(EnvError, match="whole number"): dist._world({"RANK": "x", "WORLD_SIZE": "2"})
  with pytest.raises(EnvError, match="PLUGRT_DIST_TIMEOUT"): dist._settings(None, None, {"PLUGRT_DIST_TIMEOUT": "soon"})
  with pytest.raises(EnvError, match="PLUGRT_DIST_CHECK"): dist._settings(None, None, {"PLUGRT_DIST_CHECK": "yes"})
  assert dist._settings(None, None, {"PLUGRT_DIST_TIMEOUT": "7", "PLUGRT_DIST_CHECK": "0"}) == (7.0, False)
  with pytest.raises(ValueError, match="positive"): dist._settings(0, None, {})


def test_import_plugrt_does_not_load_it() -> None:
  code = "import sys, plugrt; plugrt.Device; print(any(m.startswith(('plugrt.distributed', 'mpi4py')) for m in sys.modules))"
  assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"
  code = "import sys, plugrt.distributed; print('mpi4py' in sys.modules, 'numpy' in sys.modules)"
  assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False False"



# ---------------------------------------------------------------- the rendezvous that hands NCCL's unique id around

def _free_port() -> int:
  import socket
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


SHARE = """
import os, sys, time
from plugrt.distributed.rendezvous import share_from_env
rank = int(os.environ["RANK"])
if rank == 0: time.sleep(float(os.environ.get("DELAY", "0")))  # the others must wait for rank 0 to listen
for i in range(2):  # two communicators: two rounds on the same port
  got = share_from_env(lambda: f"id-{i}-from-0".encode(), rank, int(os.environ["WORLD_SIZE"]), os.environ, float(sys.argv[1]))
  print(got.decode(), flush=True)
"""


def _share(n: int, how: str, timeout: float = 20, only: Sequence[int] | None = None, delay: float = 0.5) -> list[subprocess.CompletedProcess[str]]:
  port = _free_port()
  procs = []
  for r in (range(n) if only is None else only):
    env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), PLUGRT_DIST_RENDEZVOUS=how,
               DELAY=str(delay))
    procs.append(subprocess.Popen([sys.executable, "-c", SHARE, str(timeout)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
  return [subprocess.CompletedProcess(p.args, p.wait(60), *p.communicate()) for p in procs]


@pytest.mark.parametrize("how", ["tcp", pytest.param("torch", marks=pytest.mark.skipif(
  __import__("importlib").util.find_spec("torch") is None, reason="torch is not installed"))])
def test_rendezvous_hands_rank_0s_bytes_to_every_rank(how: str) -> None:
  for p in _share(3, how):
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["id-0-from-0", "id-1-from-0"]


def test_rendezvous_without_rank_0_is_a_timeout() -> None:
  (p,) = _share(2, "tcp", timeout=1.5, only=[1])
  assert p.returncode != 0 and "CollectiveTimeout" in p.stderr and "did not answer within 1.5 s" in p.stderr
  with pytest.raises(EnvError, match="MASTER_ADDR"):
    from plugrt.distributed.rendezvous import share_from_env
    share_from_env(lambda: b"", 0, 2, {"MASTER_ADDR": "x"}, 1)


def test_from_id_and_unique_id_checks() -> None:
  with pytest.raises(RankError, match="rank 2"): dist.from_id(b"x" * 128, 2, 2, "CPU")
  with pytest.raises(RankError, match="positive"): dist.from_id(b"x" * 128, 0, 0, "CPU")
  import plugrt_cpu
  plugin = EnginePlugin()
  with isolated([plugrt_cpu, plugin]):
    with pytest.raises(UnsupportedError, match="needs no shared id"): dist.unique_id("CPU", engine="LOOP")
    (c,) = [dist.from_id(b"\x01" * 8, 0, 1, "CPU", engine="LOOP")]
    assert plugin.opened[-1].share(lambda: b"never") == b"\x01" * 8 and c.size == 1


@needs_mpi
def test_mpi_cannot_join_processes_another_launcher_started() -> None:
  code = "import plugrt.distributed as d\ntry: d.from_env('CPU', timeout=5)\nexcept d.CollectiveUnavailable as e: print(e)"
  env = dict(os.environ, RANK="0", WORLD_SIZE="2", LOCAL_RANK="0")  # torchrun's variables, no mpiexec
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60).stdout
  assert "MPI's world is rank 0 of 1, the launcher says rank 0 of 2" in out and "launch with mpiexec" in out
