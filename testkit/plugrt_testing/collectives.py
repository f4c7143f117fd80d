"""Reference data and results for testing collectives (plugrt.distributed) with numpy: every rank's input is a
function of its rank, so each rank computes what every collective must give without another rank's answer. Used by
tests/distributed_worker.py (MPI ranks) and plugins/ops_cuda/tests/nccl_worker.py (NCCL ranks)."""
from __future__ import annotations

import os
from typing import Any

import numpy as np

from plugrt.dtype import DType, bf16_to_f32, dtypes, f32_to_bf16


def say(line: str) -> None:
  """One line on stdout in one write: a launcher merges the ranks' output, and a line must not be split."""
  os.write(1, (line + "\n").encode())


def data(dt: DType, rank: int, n: int) -> np.ndarray:
  """Rank `rank`'s input: small values, so every product over 3 ranks fits int8 and is exact in float16/bfloat16."""
  v = (np.arange(n) % 4 + rank).astype(np.float32)
  if dt is dtypes.bool: return (np.arange(n) + rank) % 3 == 0
  return f32_to_bf16(v) if dt is dtypes.bfloat16 else v.astype(dt.numpy)


def reduce(dt: DType, op: str, rows: list[np.ndarray]) -> Any:
  """What reducing `rows` (one per rank) with `op` gives: bool as numpy reduces it (sum: or, prod: and), bfloat16 in float32."""
  if dt is dtypes.bool: return (np.any if op in ("sum", "max") else np.all)(np.stack(rows), axis=0)
  if dt is dtypes.bfloat16: return f32_to_bf16(reduce(dtypes.float32, op, [bf16_to_f32(r) for r in rows]))
  return {"sum": np.sum, "prod": np.prod, "min": np.min, "max": np.max}[op](np.stack(rows), axis=0).astype(rows[0].dtype)


def same(got: np.ndarray, want: np.ndarray, what: str) -> None:
  if not np.array_equal(got, want): raise AssertionError(f"{what}: got {got[:8]}..., want {want[:8]}...")
