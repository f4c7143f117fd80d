"""Helpers for the NV tests: the CUDA toolkit's nvcc (PATH, CUDA_HOME, /usr/local/cuda, or the pip wheels CI installs)
to make real cubins without a GPU, and whether an NV GPU is here."""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys


def nvcc() -> str | None:
  if found := shutil.which("nvcc"): return found
  dirs = [os.path.join(os.environ[v], "bin") for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)] + ["/usr/local/cuda/bin"]
  dirs += sorted({d for p in sys.path for d in glob.glob(os.path.join(p or ".", "nvidia", "cu*", "bin"))}, reverse=True)
  return next((os.path.join(d, "nvcc") for d in dirs if os.access(os.path.join(d, "nvcc"), os.X_OK)), None)


def cubin(src: str, tmp_path, arch: str = "sm_90") -> bytes:
  """CUDA C -> cubin with nvcc, using the options NV's NVRTC compiler uses."""
  cu, out = tmp_path / "k.cu", tmp_path / "k.cubin"
  cu.write_text(src)
  opts = ["--fmad=false", "--prec-div=true", "--prec-sqrt=true", "--ftz=false"]
  p = subprocess.run([nvcc(), "-cubin", f"-arch={arch}", *opts, "-o", str(out), str(cu)], capture_output=True, text=True, timeout=300)
  assert p.returncode == 0, p.stderr[-2000:]
  return out.read_bytes()


def has_nv() -> bool:
  from plugrt import Device
  return Device.registry.probe("NV").ok
