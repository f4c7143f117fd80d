"""The CUDA toolkit's programs for the tests that need no GPU: nvcc and ptxas from PATH, CUDA_HOME,
/usr/local/cuda, or the pip wheels (nvidia-cuda-nvcc with nvidia-cuda-runtime, nvidia-cuda-crt and
nvidia-nvvm, which is how CI gets them: see requirements-test.txt)."""
from __future__ import annotations

from plugrt_cuda.toolkit import program as toolkit_program

__all__ = ["toolkit_program"]
