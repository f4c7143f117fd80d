"""The CUDA toolkit's programs for the tests that need no GPU: nvcc and ptxas from PATH, CUDA_HOME,
/usr/local/cuda, or the pip wheels (nvidia-cuda-nvcc with nvidia-cuda-runtime, nvidia-cuda-crt and
nvidia-nvvm, which is how CI gets them: see requirements-test.txt)."""
from __future__ import annotations

import glob
import os
import shutil
import sys


def toolkit_program(name: str) -> str | None:
  if found := shutil.which(name): return found
  dirs = [os.path.join(os.environ[v], "bin") for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)] + ["/usr/local/cuda/bin"]
  dirs += sorted({d for p in sys.path for d in glob.glob(os.path.join(p or ".", "nvidia", "cu*", "bin"))}, reverse=True)
  return next((os.path.join(d, name) for d in dirs if os.access(os.path.join(d, name), os.X_OK)), None)
