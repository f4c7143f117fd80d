"""ptxas, the CUDA toolkit's PTX assembler: finding it (paths only) and running it (a subprocess) to turn PTX into a
cubin for one architecture."""
from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Mapping

from plugrt.errors import CompileError
from plugrt_nvidia_toolchain import toolkit

HINT = "install the CUDA toolkit (ptxas), or pip install nvidia-cuda-nvcc"


def path(env: Mapping[str, str]) -> str | None:
  """ptxas from PLUGRT_PTXAS (when executable), else from the toolkit's usual places (`toolkit.program`)."""
  if (p := env.get("PLUGRT_PTXAS")) and os.access(p, os.X_OK): return p
  return toolkit.program("ptxas", env)


def version(ptxas: str) -> str:
  """The last line of `ptxas --version` ("Cuda compilation tools, release 13.0, V13.0.48"), or "unknown"."""
  out = subprocess.run([ptxas, "--version"], capture_output=True, text=True, timeout=60).stdout.strip().splitlines()
  return out[-1] if out else "unknown"


def assemble(ptxas: str, ptx: str, arch: str) -> bytes:
  """A cubin for `arch` ("sm_90") from PTX text, by the program `ptxas`; a rejected module raises CompileError with its output."""
  with tempfile.TemporaryDirectory(prefix="plugrt-ptxas-") as d:
    src, out = os.path.join(d, "k.ptx"), os.path.join(d, "k.cubin")
    with open(src, "w") as f: f.write(ptx)
    p = subprocess.run([ptxas, f"-arch={arch}", "-o", out, src], capture_output=True, text=True, timeout=300)
    if p.returncode != 0: raise CompileError(f"ptxas failed to assemble the kernel for {arch}", p.stderr + p.stdout)
    with open(out, "rb") as f: return f.read()
