"""Helpers for backends' probes, which must stay cheap: they run at discovery, in every process.

`which` is shutil.which without importing shutil, which brings zlib, bz2 and lzma along (~3 ms of
`import plugrt`, and a probe needs none of them).
"""
from __future__ import annotations

import os


def which(program: str) -> str | None:
  """The path of `program` as the shell would run it (a path is checked as given, a name searched on PATH), or None."""
  def runnable(path: str) -> bool: return os.path.isfile(path) and os.access(path, os.X_OK)
  if os.path.dirname(program): return program if runnable(program) else None
  for d in os.environ.get("PATH", os.defpath).split(os.pathsep):
    if d and runnable(candidate := os.path.join(d, program)): return candidate
  return None
