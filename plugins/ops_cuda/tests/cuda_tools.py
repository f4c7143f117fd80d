"""The CUDA toolkit's programs for the tests that need no GPU: nvcc and ptxas from PATH, CUDA_HOME,
/usr/local/cuda, or the pip wheels (nvidia-cuda-nvcc with nvidia-cuda-runtime, nvidia-cuda-crt and
nvidia-nvvm, which is how CI gets them: see requirements-test.txt)."""
from __future__ import annotations

import os

from plugrt_nvidia_toolchain import toolkit


def toolkit_program(name: str) -> str | None:
  """`name` (nvcc, ptxas) where the toolkit's programs are, as this process's environment finds them."""
  return toolkit.program(name, os.environ)
