"""All-reduce bus bandwidth on several GPUs of one process: plugrt.distributed (NCCL through ctypes) against NCCL
driven by torch (torch.cuda.nccl) or, without torch, cupy (cupy.cuda.nccl), on the same GPUs and the same sizes.

    from _allreduce import allreduce_rows
    rows = allreduce_rows(["CUDA:0", "CUDA:1"])      # bench/multi_gpu.py calls it

Each side runs float32 sum all-reduces of `nbytes` per GPU; every iteration is issued on all GPUs and waited for on all
of them (plugrt's collectives return when done, so the others are timed the same way). The sides are set up once
(two warm-up all-reduces each: NCCL connects its channels on the first), then take turns in `ROUNDS` rounds of
iters/ROUNDS iterations, so neither gains from going second (clocks, the link's state); the figure is the median of
all of a side's iterations. Bus bandwidth (nccl-tests' busbw) = 2*(n-1)/n * bytes / seconds: what each link carries
in a ring, comparable across GPU counts. The comparison packages are imported only when their side runs. Run on two
H200s (docs/hardware.md).
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

ROUNDS = 4
Step = Callable[[], None]


def _row(side: str, n: int, nbytes: int, iters: int, samples: list[float], note: str = "", library: str = "") -> dict[str, Any]:
  t = statistics.median(samples) if samples else None
  return {"side": side, "gpus": n, "nbytes": nbytes, "iters": len(samples) or iters, "seconds": t,
          "algbw_GBps": nbytes / t / 1e9 if t else None, "busbw_GBps": 2 * (n - 1) / n * nbytes / t / 1e9 if t else None,
          "samples": samples, "note": note, "library": library}


def _ordinals(devices: Sequence[str]) -> list[int]:
  return [int(d.split(":")[1]) if ":" in d else 0 for d in devices]


def _plugrt(devices: Sequence[str], nbytes: int) -> tuple[Step, Callable[[], None], str]:
  import numpy as np

  import plugrt.distributed as dist
  from plugrt import Buffer, dtypes
  comms = dist.Communicator.local(list(devices))
  n = nbytes // 4
  bufs = [Buffer(c.device, n, dtypes.float32).copyin(np.ones(n, np.float32)) for c in comms]

  def step() -> None:
    with dist.group():
      for c, b in zip(comms, bufs): c.all_reduce(b)

  def close() -> None:
    for c in comms: c.close()
  return step, close, f"NCCL {comms[0].engine.nccl.version()}"


def _torch(devices: Sequence[str], nbytes: int) -> tuple[Step, Callable[[], None], str]:
  import torch
  import torch.cuda.nccl as tnccl
  ids = _ordinals(devices)
  ts = [torch.ones(nbytes // 4, dtype=torch.float32, device=f"cuda:{i}") for i in ids]

  def step() -> None:
    tnccl.all_reduce(ts)  # one process, several GPUs: NCCL's group of one all-reduce per GPU, as plugrt's
    for i in ids: torch.cuda.synchronize(i)
  return step, lambda: None, f"NCCL {tnccl.version()} (torch {torch.__version__})"


def _cupy(devices: Sequence[str], nbytes: int) -> tuple[Step, Callable[[], None], str]:
  import cupy
  from cupy.cuda import nccl as cnccl
  ids = _ordinals(devices)
  comms = cnccl.NcclCommunicator.initAll(ids)
  arrs = []
  for i in ids:
    with cupy.cuda.Device(i): arrs.append(cupy.ones(nbytes // 4, dtype=cupy.float32))

  def step() -> None:
    cnccl.groupStart()
    for c, a in zip(comms, arrs):
      c.allReduce(a.data.ptr, a.data.ptr, a.size, cnccl.NCCL_FLOAT32, cnccl.NCCL_SUM, cupy.cuda.Stream.null.ptr)
    cnccl.groupEnd()
    for i in ids: cupy.cuda.Device(i).synchronize()
  return step, lambda: None, f"NCCL {cnccl.get_version()} (cupy {cupy.__version__})"


def allreduce_rows(devices: Sequence[str], nbytes: int = 256 << 20, iters: int = 40) -> list[dict[str, Any]]:
  """One row per side (plugrt, then torch's NCCL or else cupy's): median seconds per all-reduce, algorithm and bus
  bandwidth in GB/s, the samples, the NCCL version it used, and a note saying why a side has no figure."""
  n = len(devices)
  ready: dict[str, tuple[Step, Callable[[], None], str]] = {}
  notes: dict[str, str] = {}
  for side, make in (("plugrt (NCCL via ctypes)", _plugrt), ("torch.cuda.nccl", _torch), ("cupy.cuda.nccl", _cupy)):
    if side == "cupy.cuda.nccl" and "torch.cuda.nccl" in ready: break  # torch's figure is the comparison; cupy only without it
    try:
      ready[side] = made = make(devices, nbytes)
      for _ in range(2): made[0]()  # warm-up
    except ImportError as e: notes[side] = f"not installed: {e}"
    except Exception as e: notes[side] = f"{type(e).__name__}: {e}"
  samples: dict[str, list[float]] = {side: [] for side in ready}
  for _ in range(ROUNDS):
    for side, (step, _close, _lib) in ready.items():
      for _ in range(max(1, iters // ROUNDS)):
        t = time.perf_counter()
        step()
        samples[side].append(time.perf_counter() - t)
  for _step, close, _lib in ready.values(): close()
  return [_row(side, n, nbytes, iters, samples[side], library=ready[side][2]) if side in ready else _row(side, n, nbytes, iters, [], notes[side])
          for side in [*ready, *notes]]


if __name__ == "__main__":
  import sys
  devs = sys.argv[1:] or ["CUDA:0", "CUDA:1"]
  for r in allreduce_rows(devs):
    figure = f"{r['seconds'] * 1e3:8.3f} ms  busbw {r['busbw_GBps']:7.1f} GB/s  {r['library']}" if r["seconds"] else r["note"]
    print(f"{r['side']:28s} {r['gpus']} GPUs  {figure}")
