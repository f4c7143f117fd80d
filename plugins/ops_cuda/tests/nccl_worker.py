"""One rank of test_distributed_gpu.py's two-process tests: `python nccl_worker.py SCENARIO TIMEOUT` with torchrun's
variables set (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT). Prints "OK ..." or "ERR <rank> <type> <seconds>"."""
from __future__ import annotations

import os
import sys
import time

import numpy as np

import plugrt.distributed as dist
from plugrt import Buffer, dtypes
from plugrt_testing import collectives as ref
from plugrt_testing.collectives import reduce, say

#: what NCCL reduces (16-bit integers it does not); every dtype moves (gather, broadcast, send/recv go as bytes)
REDUCED = [d for d in dtypes.all() if d.name not in ("int16", "uint16")]
N = 1000003  # odd and large enough to take NCCL's multi-channel paths


def data(dt, rank: int, n: int = N) -> np.ndarray: return ref.data(dt, rank, n)


def every(c: dist.Communicator) -> None:
  r, size, dev = c.rank, c.size, c.device
  for dt in dtypes.all():
    rows = [data(dt, k) for k in range(size)]
    if dt in REDUCED:
      for op in ("sum", "prod", "min", "max"):
        b = Buffer(dev, N, dt).copyin(rows[r])
        c.all_reduce(b, op)
        ref.same(b.numpy(), reduce(dt, op, rows), f"all_reduce {dt.name} {op}")
      send = [data(dt, k, N * size) for k in range(size)]
      out = Buffer(dev, N, dt)
      c.reduce_scatter(Buffer(dev, N * size, dt).copyin(send[r]), out, "sum")
      ref.same(out.numpy(), reduce(dt, "sum", send)[r * N:(r + 1) * N], f"reduce_scatter {dt.name}")
    got = Buffer(dev, N * size, dt)
    c.all_gather(Buffer(dev, N, dt).copyin(rows[r]), got)
    ref.same(got.numpy(), np.concatenate(rows), f"all_gather {dt.name}")
    b = Buffer(dev, N, dt).copyin(rows[r])
    c.broadcast(b, size - 1)
    ref.same(b.numpy(), rows[size - 1], f"broadcast {dt.name}")
    with dist.group():
      c.send(Buffer(dev, N, dt).copyin(rows[r]), (r + 1) % size)
      back = c.recv(Buffer(dev, N, dt), (r - 1) % size)
    ref.same(back.numpy(), rows[(r - 1) % size], f"send/recv {dt.name}")
  c.barrier()
  say(f"OK {r} all")


def main() -> None:
  scenario, timeout = sys.argv[1], float(sys.argv[2])
  rank = int(os.environ["RANK"])
  c = dist.from_env(f"CUDA:{rank}", timeout=timeout, check=scenario != "dead-unchecked")
  if scenario == "all": every(c)
  elif scenario == "mismatch":
    t = time.monotonic()
    try: c.all_reduce(Buffer(c.device, 1024 + rank, dtypes.float32))
    except dist.CollectiveMismatch as e: say(f"ERR {rank} CollectiveMismatch {time.monotonic() - t:.2f} {e.message}")
    b = Buffer(c.device, 16, dtypes.float32).copyin(np.ones(16, np.float32))
    c.all_reduce(b)
    ref.same(b.numpy(), np.full(16, c.size, np.float32), "after the mismatch")
    say(f"OK {rank} mismatch")
  elif scenario.startswith("dead"):
    b = Buffer(c.device, 1 << 20, dtypes.float32)
    c.all_reduce(b)
    if rank == c.size - 1: os._exit(3)
    t = time.monotonic()
    try: c.all_reduce(b)
    except dist.CollectiveError as e: say(f"ERR {rank} {type(e).__name__} {time.monotonic() - t:.2f} {e.message}")
    os._exit(0)  # the dead peer's communicator is aborted; nothing more to tear down
  c.close()


if __name__ == "__main__":
  main()
