"""Several GPUs on the GPU machine: copies between two GPUs, plugrt against cupy and against the link, then all-reduce.

    python bench/multi_gpu.py [--quick] [--size MIB] [--no-install] [--json PATH]

Rows (medians of GB/s, bytes copied / wall time of `iters` back-to-back copies ended by one synchronize):
- CUDA 0->1 and 1->0: plugrt's Buffer.copy_to between CUDA:0 and CUDA:1 (peer access and cuMemcpyPeerAsync, or
  staged by the driver: the path is printed) against cupy's cupy.cuda.runtime.memcpyPeerAsync with peer access on.
- NV 0->1 and 1->0 where NV opens two GPUs: plugrt-nv's copy, through a peer mapping (the source buffer mapped into
  the destination GPU, one copy-engine command there) where the driver allows it, else staged through host memory;
  the path column says which (and why staged), so a row that is not "peer" on an NVLink pair is a finding.
- the link: what `nvidia-smi topo -m` says joins GPU0 and GPU1, as GB/s per direction. Assumed, not measured:
  NV<n> is n bonded NVLinks at 25 GB/s each per direction (NVLink 4 on H100/H200: 18 links, 450 GB/s; NVLink 3 on
  A100 is 25 GB/s a link too); PIX/PXB/PHB/NODE/SYS is PCIe gen5 x16, 64 GB/s per direction in theory (~53 after
  its encoding and packet overheads; a gen4 host halves it). Ratios are plugrt / cupy and plugrt / link.
- all-reduce: bench/_allreduce.py's allreduce_rows(devices, nbytes, iters), when that module is there.
cupy is installed if missing (package cupy-cuda13x: the machine has CUDA 13), unless --no-install; a side that
cannot run shows '-' and why. Exit status 0 when measured (also when a ratio is low), 1 with fewer than two GPUs.
"""
from __future__ import annotations

import argparse
import importlib
import json
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

NVLINK_GBS, PCIE5_GBS = 25.0, 64.0  # per link per direction (NVLink 4), PCIe gen5 x16 per direction (theoretical)
CUPY = "cupy-cuda13x"


def ensure(module: str, package: str, install: bool) -> str:
  """Import `module`, installing `package` first if allowed; "" or why it cannot be had."""
  try:
    importlib.import_module(module)
    return ""
  except ImportError: pass
  if not install: return f"{module} is not installed (--no-install)"
  cmd = [sys.executable, "-m", "pip", "install", "-q", package]
  print(f"  {module} is not installed: {' '.join(cmd)}", file=sys.stderr)
  if subprocess.run(cmd, capture_output=True, text=True).returncode != 0: return f"pip install {package} failed (no network?)"
  importlib.invalidate_caches()
  try: importlib.import_module(module)
  except ImportError as e: return f"{package} installed but does not import: {e}"
  return ""


def link(a: int = 0, b: int = 1) -> tuple[str, float | None, str]:
  """(what `nvidia-smi topo -m` says joins GPU a and GPU b, its GB/s per direction or None, how that was assumed)."""
  try: text = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=30).stdout
  except (OSError, subprocess.SubprocessError) as e: return "?", None, f"nvidia-smi topo -m failed: {e}"
  return parse_topo(text, a, b)


def parse_topo(text: str, a: int, b: int) -> tuple[str, float | None, str]:
  """The link between GPU a and GPU b in `nvidia-smi topo -m`'s matrix (rows and columns named GPU0, GPU1, ...)."""
  rows = [re.sub(r"\x1b\[[0-9;]*m", "", line).split() for line in text.splitlines()]  # it colours the header on a terminal
  header = next((r for r in rows if r[:2] == ["GPU0", "GPU1"]), None)  # the column names (the first GPU row has "X" there)
  row = next((r for r in rows if r and r[0] == f"GPU{a}" and r is not header), None)
  if header is None or row is None or f"GPU{b}" not in header: return "?", None, "no GPU matrix in nvidia-smi topo -m"
  cell = row[1 + header.index(f"GPU{b}")]
  if (m := re.fullmatch(r"NV(\d+)", cell)):
    n = int(m.group(1))
    return cell, n * NVLINK_GBS, f"{n} NVLinks x {NVLINK_GBS:g} GB/s per direction (NVLink 4)"
  if cell in ("PIX", "PXB", "PHB", "NODE", "SYS"): return cell, PCIE5_GBS, f"PCIe gen5 x16, {PCIE5_GBS:g} GB/s per direction in theory"
  return cell, None, f"unknown link {cell!r}"


def rate(copy: Callable[[], None], sync: Callable[[], None], nbytes: int, iters: int, reps: int) -> float:
  """Median GB/s of `iters` queued copies then one synchronize, after one untimed round."""
  def once() -> float:
    t = time.perf_counter()
    for _ in range(iters): copy()
    sync()
    return nbytes * iters / (time.perf_counter() - t) / 1e9
  once()
  return statistics.median(once() for _ in range(reps))


def plugrt_rows(backend: str, nbytes: int, iters: int, reps: int) -> dict[str, Any]:
  import numpy as np

  from plugrt import Buffer, Device, dtypes
  d0, d1 = Device[f"{backend}:0"], Device[f"{backend}:1"]
  out: dict[str, Any] = {}
  x = np.random.default_rng(0).integers(0, 256, nbytes, dtype=np.uint8)
  for (i, s), (j, d) in (((0, d0), (1, d1)), ((1, d1), (0, d0))):
    a, b = Buffer(s, nbytes, dtypes.uint8).copyin(x), Buffer(d, nbytes, dtypes.uint8)
    def sync(s: Any = s, d: Any = d) -> None:
      d.synchronize()
      s.synchronize()
    out[f"{i}->{j}"] = {"gbs": rate(lambda a=a, b=b: a.copy_to(b), sync, nbytes, iters, reps),
                                            "path": s.allocator.peer_path(d)}
    assert np.array_equal(b.numpy(), x), f"{backend}: the copy differs from its source"
  return out


def cupy_rows(nbytes: int, iters: int, reps: int) -> dict[str, Any]:
  import cupy as cp
  bufs, streams = {}, {}
  for i in (0, 1):
    with cp.cuda.Device(i):
      bufs[i] = cp.zeros(nbytes, cp.uint8)
      streams[i] = cp.cuda.Stream(non_blocking=True)
      try: cp.cuda.runtime.deviceEnablePeerAccess(1 - i)
      except cp.cuda.runtime.CUDARuntimeError: pass  # already enabled, or impossible: memcpyPeer stages then
  out = {}
  for s, d in ((0, 1), (1, 0)):
    can = cp.cuda.runtime.deviceCanAccessPeer(d, s)
    def copy(s: int = s, d: int = d) -> None:
      with cp.cuda.Device(d):  # the stream is the destination's: issue it with that device current
        cp.cuda.runtime.memcpyPeerAsync(bufs[d].data.ptr, d, bufs[s].data.ptr, s, nbytes, streams[d].ptr)
    out[f"{s}->{d}"] = {"gbs": rate(copy, streams[d].synchronize, nbytes, iters, reps), "path": "peer" if can else "staged by the driver"}
  return out


def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--quick", action="store_true", help="fewer repetitions")
  ap.add_argument("--size", type=int, default=256, help="MiB a copy (default 256)")
  ap.add_argument("--no-install", action="store_true", help="never run pip: compare with what is installed")
  ap.add_argument("--json", help="also write the figures here")
  args = ap.parse_args(argv)
  from plugrt import Device
  nbytes, iters, reps = args.size << 20, 4 if args.quick else 10, 3 if args.quick else 7
  count = {b: (p.count if (p := Device.registry.probe(b)).ok else 0) for b in ("CUDA", "NV")}
  if max(count.values()) < 2:
    print(f"needs two GPUs: CUDA has {count['CUDA']}, NV has {count['NV']}")
    return 1
  cell, link_gbs, assumed = link()
  report: dict[str, Any] = {"size_bytes": nbytes, "iters": iters, "link": {"topo": cell, "gbs": link_gbs, "assumed": assumed}, "rows": {}}
  print(f"GPU0 <-> GPU1: {cell} ({assumed}); {args.size} MiB a copy, {iters} copies a sample, median of {reps}")
  sides: dict[str, dict[str, Any] | str] = {}
  sides["plugrt CUDA"] = plugrt_rows("CUDA", nbytes, iters, reps) if count["CUDA"] >= 2 else "fewer than two CUDA GPUs"
  why = ensure("cupy", CUPY, not args.no_install)
  try: sides["cupy"] = cupy_rows(nbytes, iters, reps) if not why else why
  except Exception as e: sides["cupy"] = f"{type(e).__name__}: {e}"
  try: sides["plugrt NV"] = plugrt_rows("NV", nbytes, iters, reps) if count["NV"] >= 2 else "fewer than two NV GPUs"
  except Exception as e: sides["plugrt NV"] = f"{type(e).__name__}: {e}"
  print(f"\n{'side':<12} {'GPU':<14} {'GB/s':>8} {'/cupy':>7} {'/link':>7}  path")
  for side, rows in sides.items():
    if isinstance(rows, str):
      print(f"{side:<12} {'-':<14} {'-':>8} {'-':>7} {'-':>7}  {rows}")
      continue
    for direction, r in rows.items():
      ref = sides.get("cupy")
      cupy = ref.get(direction, {}).get("gbs") if isinstance(ref, dict) and side != "cupy" else None
      r["vs_cupy"] = r["gbs"] / cupy if cupy else None
      r["vs_link"] = r["gbs"] / link_gbs if link_gbs else None
      fmt = lambda v: f"{v:7.2f}" if v is not None else f"{'-':>7}"
      print(f"{side:<12} {direction:<14} {r['gbs']:8.1f} {fmt(r['vs_cupy'])} {fmt(r['vs_link'])}  {r['path']}")
  report["rows"] = sides
  print()
  try: allreduce_rows = importlib.import_module("_allreduce").allreduce_rows  # bench/_allreduce.py, beside plugrt.distributed
  except ModuleNotFoundError as e:
    if e.name != "_allreduce": raise
    print("all-reduce: bench/_allreduce.py not present")
  else:
    devices = [f"CUDA:{i}" for i in range(count["CUDA"])]
    try: report["allreduce"] = rows = allreduce_rows(devices, nbytes, 10 if args.quick else 40)
    except Exception as e: print(f"all-reduce: failed: {type(e).__name__}: {e}")
    else:
      print(f"all-reduce, float32 sum of {args.size} MiB a GPU over {len(devices)} GPUs (median of {rows[0]['iters']}, each waited for):")
      for row in rows:
        figure = f"{row['seconds'] * 1e3:7.3f} ms  busbw {row['busbw_GBps']:6.1f} GB/s" if row["seconds"] else row["note"]
        print(f"  {row['side']:<28} {figure}  {row.get('library', '')}")
      if len(rows) > 1 and rows[0]["seconds"] and rows[1]["seconds"]:
        report["allreduce_ratio"] = ratio = rows[1]["seconds"] / rows[0]["seconds"]
        print(f"  plugrt / {rows[1]['side']}: {ratio:.3f}x (target >= 0.95)")
  if args.json:
    with open(args.json, "w") as f: json.dump(report, f, indent=2, default=str)
  return 0


if __name__ == "__main__":
  sys.exit(main())
