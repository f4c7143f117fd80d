"""All-reduce bus bandwidth on several GPUs of one process: plugrt.distributed (NCCL through ctypes) against NCCL
driven by torch (torch.cuda.nccl) or, without torch, cupy (cupy.cuda.nccl), on the same GPUs and the same sizes.

    from _allreduce import allreduce_rows
    rows = allreduce_rows(["CUDA:0", "CUDA:1"])      # bench/multi_gpu.py calls it

Each side runs `iters` float32 sum all-reduces of `nbytes` per GPU after two warm-up ones; every iteration is issued
on all GPUs and waited for on all of them (plugrt's collectives return when done, so the others are timed the same
way), and the figure is the median. Bus bandwidth (nccl-tests' busbw) = 2*(n-1)/n * bytes / seconds: what each link
carries in a ring, comparable across GPU counts. The comparison packages are imported only when their side runs.
Run on two H200s (docs/hardware.md).
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any


def _row(side: str, n: int, nbytes: int, iters: int, samples: list[float], note: str = "") -> dict[str, Any]:
  t = statistics.median(samples) if samples else None
  return {"side": side, "gpus": n, "nbytes": nbytes, "iters": iters, "seconds": t,
          "algbw_GBps": nbytes / t / 1e9 if t else None, "busbw_GBps": 2 * (n - 1) / n * nbytes / t / 1e9 if t else None,
          "samples": samples, "note": note}


LIBRARY = [""]  # the NCCL version the side that just ran used (each side sets it)


def _timed(step: Callable[[], None], iters: int) -> list[float]:
  for _ in range(2): step()  # warm-up: NCCL connects its channels on the first collective
  out = []
  for _ in range(iters):
    t = time.perf_counter()
    step()
    out.append(time.perf_counter() - t)
  return out


def _plugrt(devices: Sequence[str], nbytes: int, iters: int) -> list[float]:
  import numpy as np

  import plugrt.distributed as dist
  from plugrt import Buffer, dtypes
  comms = dist.Communicator.local(list(devices))
  LIBRARY[0] = f"NCCL {comms[0].engine.nccl.version()}"
  n = nbytes // 4
  bufs = [Buffer(c.device, n, dtypes.float32).copyin(np.ones(n, np.float32)) for c in comms]

  def step() -> None:
    with dist.group():
      for c, b in zip(comms, bufs): c.all_reduce(b)
  try: return _timed(step, iters)
  finally:
    for c in comms: c.close()


def _ordinals(devices: Sequence[str]) -> list[int]:
  return [int(d.split(":")[1]) if ":" in d else 0 for d in devices]


def _torch(devices: Sequence[str], nbytes: int, iters: int) -> list[float]:
  import torch
  import torch.cuda.nccl as tnccl
  ids = _ordinals(devices)
  ts = [torch.ones(nbytes // 4, dtype=torch.float32, device=f"cuda:{i}") for i in ids]
  LIBRARY[0] = f"NCCL {tnccl.version()} (torch {torch.__version__})"

  def step() -> None:
    tnccl.all_reduce(ts)  # one process, several GPUs: NCCL's group of one all-reduce per GPU, as plugrt's
    for i in ids: torch.cuda.synchronize(i)
  return _timed(step, iters)


def _cupy(devices: Sequence[str], nbytes: int, iters: int) -> list[float]:
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
  return _timed(step, iters)


def allreduce_rows(devices: Sequence[str], nbytes: int = 256 << 20, iters: int = 20) -> list[dict[str, Any]]:
  """One row per side (plugrt, then torch's NCCL or else cupy's): median seconds per all-reduce, algorithm and bus
  bandwidth in GB/s, the samples, and a note saying why a side has no figure."""
  n = len(devices)
  rows = []
  for side, fn in (("plugrt (NCCL via ctypes)", _plugrt), ("torch.cuda.nccl", _torch), ("cupy.cuda.nccl", _cupy)):
    if side == "cupy.cuda.nccl" and rows[-1]["seconds"] is not None: break  # torch's figure is the comparison; cupy only without it
    LIBRARY[0] = ""
    try: rows.append({**_row(side, n, nbytes, iters, fn(devices, nbytes, iters)), "library": LIBRARY[0]})
    except ImportError as e: rows.append(_row(side, n, nbytes, iters, [], f"not installed: {e}"))
    except Exception as e: rows.append(_row(side, n, nbytes, iters, [], f"{type(e).__name__}: {e}"))
  return rows


if __name__ == "__main__":
  import sys
  devs = sys.argv[1:] or ["CUDA:0", "CUDA:1"]
  for r in allreduce_rows(devs):
    print(f"{r['side']:28s} {r['gpus']} GPUs  " + (f"{r['seconds'] * 1e3:8.2f} ms  busbw {r['busbw_GBps']:7.1f} GB/s" if r["seconds"] else r["note"]))
