"""One rank of test_distributed_gpu.py's two-process tests: `python nccl_worker.py SCENARIO TIMEOUT` with torchrun's
variables set (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT). Prints "OK ..." or "ERR <rank> <type> <seconds>"."""
from __future__ import annotations

import os
import sys
import time

import numpy as np

import plugrt.distributed as dist
from plugrt import Buffer, dtypes
from plugrt.dtype import bf16_to_f32, f32_to_bf16

#: what NCCL reduces (16-bit integers it does not); every dtype moves (gather, broadcast, send/recv go as bytes)
REDUCED = [d for d in dtypes.all() if d.name not in ("int16", "uint16")]
N = 1000003  # odd and large enough to take NCCL's multi-channel paths


def say(line: str) -> None: os.write(1, (line + "\n").encode())


def data(dt, rank: int, n: int = N) -> np.ndarray:
  v = (np.arange(n) % 4 + rank).astype(np.float32)
  if dt is dtypes.bool: return (np.arange(n) + rank) % 3 == 0
  return f32_to_bf16(v) if dt is dtypes.bfloat16 else v.astype(dt.numpy)


def reduce(dt, op: str, rows: list[np.ndarray]) -> np.ndarray:
  if dt is dtypes.bool: return (np.any if op in ("sum", "max") else np.all)(np.stack(rows), axis=0)
  if dt is dtypes.bfloat16: return f32_to_bf16(reduce(dtypes.float32, op, [bf16_to_f32(r) for r in rows]))
  return {"sum": np.sum, "prod": np.prod, "min": np.min, "max": np.max}[op](np.stack(rows), axis=0).astype(rows[0].dtype)


def check(got: np.ndarray, want: np.ndarray, what: str) -> None:
  if not np.array_equal(got, want): raise AssertionError(f"{what}: got {got[:8]}, want {want[:8]}")


def every(c: dist.Communicator) -> None:
  r, size, dev = c.rank, c.size, c.device
  for dt in dtypes.all():
    rows = [data(dt, k) for k in range(size)]
    if dt in REDUCED:
      for op in ("sum", "prod", "min", "max"):
        b = Buffer(dev, N, dt).copyin(rows[r])
        c.all_reduce(b, op)
        check(b.numpy(), reduce(dt, op, rows), f"all_reduce {dt.name} {op}")
      send = [data(dt, k, N * size) for k in range(size)]
      out = Buffer(dev, N, dt)
      c.reduce_scatter(Buffer(dev, N * size, dt).copyin(send[r]), out, "sum")
      check(out.numpy(), reduce(dt, "sum", send)[r * N:(r + 1) * N], f"reduce_scatter {dt.name}")
    got = Buffer(dev, N * size, dt)
    c.all_gather(Buffer(dev, N, dt).copyin(rows[r]), got)
    check(got.numpy(), np.concatenate(rows), f"all_gather {dt.name}")
    b = Buffer(dev, N, dt).copyin(rows[r])
    c.broadcast(b, size - 1)
    check(b.numpy(), rows[size - 1], f"broadcast {dt.name}")
    with dist.group():
      c.send(Buffer(dev, N, dt).copyin(rows[r]), (r + 1) % size)
      back = c.recv(Buffer(dev, N, dt), (r - 1) % size)
    check(back.numpy(), rows[(r - 1) % size], f"send/recv {dt.name}")
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
    check(b.numpy(), np.full(16, c.size, np.float32), "after the mismatch")
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
