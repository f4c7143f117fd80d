"""plugrt.distributed on NVIDIA GPUs through NCCL (marker `gpu`; needs >= 2 CUDA GPUs and libnccl; run on two
H200s: docs/hardware.md). Every collective in one process over all GPUs, and with 2 processes
that share NCCL's unique id through the TCP rendezvous, against numpy; a mismatched size is CollectiveMismatch within
the bound; a killed rank is a CollectiveError within the bound."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import plugrt.distributed as dist
from plugrt import Buffer, Device, dtypes
from plugrt_testing import collectives as ref

WORKER = Path(__file__).with_name("nccl_worker.py")


def gpus() -> int:
  p = Device.registry.probe("CUDA")
  return p.count if p.ok else 0


def nccl_missing() -> str | None:
  if gpus() < 2: return "needs at least 2 NVIDIA GPUs"
  from plugrt.distributed.choice import choose
  try: choose("CUDA", True, "NCCL")
  except Exception as e: return f"NCCL is not usable here: {e}"
  return None


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(nccl_missing() is not None, reason=str(nccl_missing()))]


def test_every_collective_in_one_process_over_all_gpus() -> None:
  import nccl_worker as W
  n = gpus()
  comms = dist.Communicator.local([f"CUDA:{i}" for i in range(n)], timeout=60)
  assert [c.engine.name for c in comms] == ["NCCL"] * n and [c.rank for c in comms] == list(range(n))
  for dt in dtypes.all():
    rows = [W.data(dt, k, 4099) for k in range(n)]
    if dt in W.REDUCED:
      for op in ("sum", "prod", "min", "max"):
        bufs = [Buffer(c.device, 4099, dt).copyin(rows[c.rank]) for c in comms]
        with dist.group():
          for c, b in zip(comms, bufs): c.all_reduce(b, op)
        for b in bufs: ref.same(b.numpy(), W.reduce(dt, op, rows), f"all_reduce {dt.name} {op}")
      send = [W.data(dt, k, 4099 * n) for k in range(n)]
      outs = [Buffer(c.device, 4099, dt) for c in comms]
      with dist.group():
        for c, o in zip(comms, outs): c.reduce_scatter(Buffer(c.device, 4099 * n, dt).copyin(send[c.rank]), o, "max")
      for c, o in zip(comms, outs): ref.same(o.numpy(), W.reduce(dt, "max", send)[c.rank * 4099:(c.rank + 1) * 4099], "reduce_scatter")
    gathered = [Buffer(c.device, 4099 * n, dt) for c in comms]
    with dist.group():
      for c, g in zip(comms, gathered): c.all_gather(Buffer(c.device, 4099, dt).copyin(rows[c.rank]), g)
    for g in gathered: ref.same(g.numpy(), np.concatenate(rows), f"all_gather {dt.name}")
    bufs = [Buffer(c.device, 4099, dt).copyin(rows[c.rank]) for c in comms]
    with dist.group():
      for c, b in zip(comms, bufs): c.broadcast(b, n - 1)
    for b in bufs: ref.same(b.numpy(), rows[n - 1], f"broadcast {dt.name}")
    got = [Buffer(c.device, 4099, dt) for c in comms]
    with dist.group():  # a ring
      for c, g in zip(comms, got):
        c.send(Buffer(c.device, 4099, dt).copyin(rows[c.rank]), (c.rank + 1) % n)
        c.recv(g, (c.rank - 1) % n)
    for c, g in zip(comms, got): ref.same(g.numpy(), rows[(c.rank - 1) % n], f"send/recv {dt.name}")
  with pytest.raises(dist.CollectiveMismatch):  # a size mismatch inside one process: found before NCCL sees it
    with dist.group():
      for c in comms: c.all_reduce(Buffer(c.device, 8 + c.rank))
  for c in comms: c.close()


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def torchrun_like(scenario: str, timeout: float, limit: float = 300) -> tuple[list[str], float]:
  """Two processes with torchrun's variables, one GPU each; (stdout lines of both, seconds)."""
  port, procs, t = _free_port(), [], time.monotonic()
  for r in range(2):
    env = dict(os.environ, RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    procs.append(subprocess.Popen([sys.executable, str(WORKER), scenario, str(timeout)], env=env, cwd=WORKER.parent,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
  out = []
  for p in procs:
    o, e = p.communicate(timeout=limit)
    out += o.splitlines() + [f"STDERR {x}" for x in e.splitlines()]
  return out, time.monotonic() - t


def test_two_processes_from_a_unique_id() -> None:
  out, _ = torchrun_like("all", 120)
  assert sorted(x for x in out if x.startswith("OK")) == ["OK 0 all", "OK 1 all"], "\n".join(out[-30:])


def test_a_mismatched_size_is_a_typed_error_within_the_bound() -> None:
  out, _ = torchrun_like("mismatch", 20)
  errs = [x.split(" ", 4) for x in out if x.startswith("ERR")]
  assert sorted(e[1] for e in errs) == ["0", "1"] and all(e[2] == "CollectiveMismatch" and float(e[3]) < 20 for e in errs), "\n".join(out)
  assert sorted(x for x in out if x.startswith("OK")) == ["OK 0 mismatch", "OK 1 mismatch"]


@pytest.mark.parametrize("scenario", ["dead", "dead-unchecked"])  # found by the metadata check's allgather, or by the all-reduce itself
def test_a_killed_rank_is_detected_within_the_bound(scenario: str) -> None:
  out, took = torchrun_like(scenario, 10, limit=120)
  errs = [x.split(" ", 4) for x in out if x.startswith("ERR")]
  assert [e[1] for e in errs] == ["0"], "\n".join(out[-30:])
  assert errs[0][2] in ("CollectiveTimeout", "NCCLError") and float(errs[0][3]) < 15  # NCCL may see the socket close first
  assert took < 90
