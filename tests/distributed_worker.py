"""One rank of tests/test_distributed.py, launched by mpiexec: `python distributed_worker.py SCENARIO [TIMEOUT]`.

Prints "OK <rank> <what>" lines the test counts, or "ERR <rank> <ErrorType> <seconds>" for the error scenarios.
Every expected value is computed here with numpy from what every rank put in (each rank's data is a function of
its rank), so no rank needs another's answer.
"""
from __future__ import annotations

import os
import sys
import time

import numpy as np

import plugrt.distributed as dist
from plugrt import Buffer, Tensor, dtypes
from plugrt_testing import collectives as ref
from plugrt_testing.collectives import reduce, say

DTYPES = [d for d in dtypes.all()]
N = 37  # odd on purpose: no size is a multiple of anything convenient


def data(dt, rank: int, n: int = N) -> np.ndarray: return ref.data(dt, rank, n)


def every_collective(c: dist.Communicator) -> None:
  r, size, dev = c.rank, c.size, c.device
  for dt in DTYPES:
    rows = [data(dt, k) for k in range(size)]
    for op in ("sum", "prod", "min", "max"):
      b = Buffer.from_numpy(rows[r], dev) if dt is not dtypes.bfloat16 else Buffer(dev, N, dt).copyin(rows[r])
      c.all_reduce(b, op)
      ref.same(b.numpy(), reduce(dt, op, rows), f"all_reduce {dt.name} {op}")
      send = [data(dt, k, N * size) for k in range(size)]
      s, out = Buffer(dev, N * size, dt).copyin(send[r]), Buffer(dev, N, dt)
      c.reduce_scatter(s, out, op)
      ref.same(out.numpy(), reduce(dt, op, send)[r * N:(r + 1) * N], f"reduce_scatter {dt.name} {op}")
    src, got = Buffer(dev, N, dt).copyin(rows[r]), Buffer(dev, N * size, dt)
    c.all_gather(src, got)
    ref.same(got.numpy(), np.concatenate(rows), f"all_gather {dt.name}")
    for root in range(size):
      b = Buffer(dev, N, dt).copyin(rows[r])
      c.broadcast(b, root)
      ref.same(b.numpy(), rows[root], f"broadcast {dt.name} from {root}")
    with dist.group():  # a ring: everyone sends right and receives from the left at once (alone, each would wait)
      c.send(Buffer(dev, N, dt).copyin(rows[r]), (r + 1) % size)
      got = c.recv(Buffer(dev, N, dt), (r - 1) % size)
    ref.same(got.numpy(), rows[(r - 1) % size], f"send/recv {dt.name}")
  say(f"OK {r} dtypes")
  # out= (not in place), a group of two collectives, Tensors, barrier
  a, out = Buffer.from_numpy(data(dtypes.int32, r), dev), Buffer(dev, N, dtypes.int32)
  c.all_reduce(a, "max", out=out)
  ref.same(a.numpy(), data(dtypes.int32, r), "all_reduce's input with out=")
  ref.same(out.numpy(), reduce(dtypes.int32, "max", [data(dtypes.int32, k) for k in range(size)]), "all_reduce out=")
  x, y = Buffer.from_numpy(data(dtypes.float32, r), dev), Buffer.from_numpy(data(dtypes.int64, r), dev)
  with dist.group():
    c.all_reduce(x, "sum")
    c.all_reduce(y, "min")
  ref.same(x.numpy(), reduce(dtypes.float32, "sum", [data(dtypes.float32, k) for k in range(size)]), "grouped all_reduce 1")
  ref.same(y.numpy(), reduce(dtypes.int64, "min", [data(dtypes.int64, k) for k in range(size)]), "grouped all_reduce 2")
  t = Tensor(data(dtypes.float32, r).reshape(1, N), device=dev)
  c.all_reduce(t)
  ref.same(t.numpy().reshape(-1), reduce(dtypes.float32, "sum", [data(dtypes.float32, k) for k in range(size)]), "Tensor all_reduce")
  c.barrier()
  say(f"OK {r} extras")


def errors(c: dist.Communicator) -> None:
  """Mismatches: every rank raises CollectiveMismatch, and the communicator still works afterwards."""
  r = c.rank
  for bad in (lambda: Buffer(c.device, 8 + (r == 1), dtypes.float32),
              lambda: Buffer(c.device, 8, dtypes.float32 if r != 1 else dtypes.int32)):
    t = time.monotonic()
    try: c.all_reduce(bad())
    except dist.CollectiveMismatch as e: say(f"ERR {r} CollectiveMismatch {time.monotonic() - t:.2f} {e.message}")
  try:  # two different collectives
    if r == 0: c.broadcast(Buffer(c.device, 8, dtypes.float32), 0)
    else: c.all_reduce(Buffer(c.device, 8, dtypes.float32))
  except dist.CollectiveMismatch as e: say(f"ERR {r} CollectiveMismatch 0 {e.message}")
  try:  # a send whose recv has another size
    if r == 0: c.send(Buffer(c.device, 8, dtypes.float32), 1)
    elif r == 1: c.recv(Buffer(c.device, 9, dtypes.float32), 0)
    else: raise dist.CollectiveMismatch("not in this pair")
  except dist.CollectiveMismatch as e: say(f"ERR {r} CollectiveMismatch 0 {e.message}")
  b = Buffer.from_numpy(np.ones(8, np.float32), c.device)
  c.all_reduce(b)
  ref.same(b.numpy(), np.full(8, c.size, np.float32), "all_reduce after mismatches")
  say(f"OK {r} errors")


def dead(c: dist.Communicator) -> None:
  """The last rank dies after one collective: the others get CollectiveTimeout within the timeout."""
  b = Buffer.from_numpy(np.ones(1024, np.float32), c.device)
  c.all_reduce(b)
  if c.rank == c.size - 1: os._exit(3)
  t = time.monotonic()
  try: c.all_reduce(b)
  except dist.CollectiveTimeout as e: say(f"ERR {c.rank} CollectiveTimeout {time.monotonic() - t:.2f} {e.message}")
  try: c.barrier()
  except dist.CollectiveError as e: say(f"ERR {c.rank} {type(e).__name__} 0 {e.message}")  # refused: it is broken
  # a plain exit: plugrt skips MPI_Finalize, which would wait for the dead rank


def sub_communicator() -> None:
  """from_mpi over a communicator of ranks 0 and 1 only (rank 2 stays out): its ranks and size are the sub-group's."""
  from mpi4py import MPI
  world = MPI.COMM_WORLD
  sub = world.Split(0 if world.rank < 2 else MPI.UNDEFINED, world.rank)
  if sub == MPI.COMM_NULL: return say(f"OK {world.rank} outside")
  c = dist.from_mpi(sub, "CPU", timeout=10)
  b = Buffer.from_numpy(np.full(5, world.rank + 1, np.int32), "CPU")
  c.all_reduce(b)
  ref.same(b.numpy(), np.full(5, 3, np.int32), "from_mpi all_reduce")
  say(f"OK {world.rank} from_mpi {c.rank}/{c.size}")
  c.close()


def absent(timeout: float, missing: int, done: str) -> None:
  """Rank `missing` never starts MPI: it waits until the others are done (file `done` exists), then leaves. The others'
  from_env ends in CollectiveTimeout naming it within the timeout, where MPI_Init alone would wait forever."""
  rank = int(os.environ["PMI_RANK"])
  if rank == missing:
    for _ in range(1200):
      if os.path.exists(done): break
      time.sleep(0.05)
    return
  t = time.monotonic()
  try: dist.from_env("CPU", timeout=timeout)
  except dist.CollectiveTimeout as e: say(f"ERR {rank} CollectiveTimeout {time.monotonic() - t:.2f} {e.message} (fix: {e.hint})")
  else: say(f"OK {rank} absent: from_env returned")
  open(done, "w").close()


def main() -> None:
  scenario, timeout = sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 30.0
  if scenario == "from_mpi": return sub_communicator()
  if scenario == "absent": return absent(timeout, int(sys.argv[3]), sys.argv[4])
  c = dist.from_env("CPU", timeout=timeout)
  if scenario == "all": every_collective(c)
  elif scenario == "staged":  # the engine as it runs for a device whose memory is not host memory: copies through the host
    c.engine.host = False  # type: ignore[attr-defined]
    every_collective(c)
  elif scenario == "errors": errors(c)
  elif scenario == "dead": return dead(c)
  c.close()


if __name__ == "__main__":
  main()
