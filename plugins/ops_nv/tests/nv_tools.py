"""Helpers for the NV tests: the CUDA toolkit's nvcc (PATH, CUDA_HOME, /usr/local/cuda, or the pip wheels CI installs)
to make real cubins without a GPU, and whether an NV GPU is here."""
from __future__ import annotations

import os
import subprocess

from plugrt_nvidia_toolchain import nvrtc, toolkit


def nvcc() -> str | None: return toolkit.program("nvcc", os.environ)


def cubin(src: str, tmp_path, arch: str = "sm_90") -> bytes:
  """CUDA C -> cubin with nvcc, using the options NV's NVRTC compiler uses."""
  cu, out = tmp_path / "k.cu", tmp_path / "k.cubin"
  cu.write_text(src)
  opts = [o for o in nvrtc.OPTIONS if o != "-default-device"]  # (an NVRTC-only option)
  p = subprocess.run([nvcc(), "-cubin", f"-arch={arch}", *opts, "-o", str(out), str(cu)], capture_output=True, text=True, timeout=300)
  assert p.returncode == 0, p.stderr[-2000:]
  return out.read_bytes()


def has_nv() -> bool:
  from plugrt import Device
  return Device.registry.probe("NV").ok
