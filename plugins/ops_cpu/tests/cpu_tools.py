"""Helpers for the CPU grid and span tests: a kernel that records which groups ran and the ids each one saw."""
from __future__ import annotations

import numpy as np

from plugrt import KernelBuilder, dtypes
from plugrt.compiler.ir import Kernel


def count_kernel(name: str) -> Kernel:
  """hits[flat group id] += 1, and ids[flat] = the group id seen on each axis (x + 1000 y + 1000000 z)."""
  b = KernelBuilder(name)
  hits, ids = b.buffer("hits", dtypes.int32), b.buffer("ids", dtypes.int32)
  g = b.group_id(0) + b.num_groups(0) * (b.group_id(1) + b.num_groups(1) * b.group_id(2))
  hits[g] = hits[g] + 1
  ids[g] = b.group_id(0) + b.group_id(1) * 1000 + b.group_id(2) * 1000000
  return b.finish()


def want_ids(gs: tuple[int, int, int]) -> np.ndarray:
  """The ids count_kernel writes for a grid of gs groups, in flat group order."""
  z, y, x = np.meshgrid(*(np.arange(n) for n in gs[::-1]), indexing="ij")
  return (x + 1000 * y + 1000000 * z).astype(np.int32).ravel()
