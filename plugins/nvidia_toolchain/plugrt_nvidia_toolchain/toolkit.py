"""The CUDA toolkit's programs (nvcc, ptxas) on disk. Looks at files only; standard library only."""
from __future__ import annotations

import glob
import os
import shutil
import sys
from collections.abc import Mapping


def program(name: str, env: Mapping[str, str]) -> str | None:
  """`name` from env's PATH, CUDA_HOME/CUDA_PATH, /usr/local/cuda, or the pip wheels (nvidia-cuda-nvcc: nvidia/cu*/bin)."""
  if found := shutil.which(name, path=env.get("PATH", os.defpath)): return found
  dirs = [os.path.join(home, "bin") for v in ("CUDA_HOME", "CUDA_PATH") if (home := env.get(v))] + ["/usr/local/cuda/bin"]
  dirs += sorted({d for p in sys.path for d in glob.glob(os.path.join(p or ".", "nvidia", "cu*", "bin"))}, reverse=True)
  return next((os.path.join(d, name) for d in dirs if os.access(os.path.join(d, name), os.X_OK)), None)
