"""NV on a real GPU (marker `gpu`; scripts/gpu-check.sh --only=nv runs them on the lent H100/H200): the conformance
suite with both compilers, long dependent chains, copies around kernels, and faults and hangs turning into errors
(those two in a child process, since a faulted channel stays unusable)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from nv_tools import has_nv

from plugrt import Buffer, Device, dtypes
from plugrt.compiler import samples as K
from plugrt_testing.conformance import ConformanceSuite

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not has_nv(), reason="no NVIDIA GPU and driver here (run scripts/gpu-check.sh --only=nv on the GPU machine)")]


class TestNV(ConformanceSuite):
  device = "NV"
  hardware_optional = True  # skips (saying why) where there is no NVIDIA GPU; a broken plugin still fails


@pytest.fixture
def dev():
  return Device["NV"]


def test_dependent_launches_stay_in_order(dev):
  """20000 launches, each reading what the previous wrote: more than the command slots, so the ring wraps (a submission
  the GPU fetched before its words arrived lost 2 of 5000 in one of three runs on the H200)."""
  b = K.KernelBuilder("inc")
  o, x = b.buffer("o", dtypes.int32), b.buffer("x", dtypes.int32)
  o[0] = x[0] + 1
  prg = dev.program(b.finish())
  a, c = Buffer(dev, 1, dtypes.int32).copyin(np.zeros(1, np.int32)), Buffer(dev, 1, dtypes.int32)
  for _ in range(10000):
    prg(c, a)
    prg(a, c)
  assert a.numpy()[0] == 20000  # a kernel that read a stale value (a cache not invalidated, an overlap) loses a step


def test_copies_and_kernels_interleave(dev):
  n = 1 << 16
  prg = dev.program(K.saxpy_kernel())
  x = np.random.default_rng(3).standard_normal(n).astype(np.float32)
  xb, out = Buffer.from_numpy(x, dev), Buffer(dev, n, dtypes.float32)
  for i in range(20):
    xb.copyin(x + i)
    prg(out, xb, xb, global_size=(n // 128, 1, 1), local_size=(128, 1, 1), vals=(1.0, n))
    assert np.array_equal(out.numpy(), 2 * (x + i))


def test_large_copy(dev):
  x = np.random.default_rng(4).integers(0, 255, (200 << 20) + 3, dtype=np.uint8)
  b = Buffer(dev, x.size, dtypes.uint8).copyin(x)
  assert np.array_equal(b.numpy(), x)


CHILD = textwrap.dedent("""
  import sys
  from plugrt import Buffer, Device, dtypes
  from plugrt.compiler.ir import Signature
  from plugrt_nv.iface import NVError
  dev = Device["NV"]
  src = {src!r}
  lib = dev.compiler_for("CUDA").compile(src)
  prg = dev.load("k", lib, Signature((dtypes.int32,), ()))
  a = Buffer(dev, 1, dtypes.int32)
  try:
    prg(a, wait=True)
  except NVError as e:
    print("NVError:", e)
    sys.exit(0)
  print("no error")
""")


def run_child(src: str, timeout_env: str) -> str:
  env = dict(os.environ, PLUGRT_NV_TIMEOUT=timeout_env, PLUGRT_CACHE="0")
  p = subprocess.run([sys.executable, "-c", CHILD.format(src=src)], capture_output=True, text=True, timeout=120, env=env)
  return p.stdout + p.stderr


def test_fault_is_an_error_with_the_reason():
  out = run_child('extern "C" __global__ void k(int* a) { *(volatile int*)0x7000000000ull = 1; a[0] = 2; }', "20")
  print(out)  # the message, for the hardware notes (pytest -rP)
  assert "NVError:" in out and ("Xid" in out or "fault" in out), out


def test_hang_is_a_bounded_error():
  out = run_child('extern "C" __global__ void k(int* a) { while (((volatile int*)a)[0] != 12345) {} }', "3")
  print(out)
  assert "NVError:" in out and "did not finish" in out, out


@pytest.mark.parametrize("n,src_off,dst_off", [(3 << 20, 0, 0), ((3 << 20) + 5, 1, 3), ((1 << 20) + 16, 16, 32), (4096, 0, 0)])
def test_device_copies(dev, n, src_off, dst_off):
  """Device-to-device copies: large ones run as a kernel (16-byte pieces when aligned, bytes otherwise), small ones
  through the copy engine; bytes around the destination stay as they were."""
  rng = np.random.default_rng(n)
  x = rng.integers(0, 255, n + 64, dtype=np.uint8)
  y = rng.integers(0, 255, n + 64, dtype=np.uint8)
  a, b = Buffer.from_numpy(x, dev), Buffer.from_numpy(y, dev)
  a.view(n, offset=src_off).copy_to(b.view(n, offset=dst_off))
  want = y.copy()
  want[dst_off:dst_off + n] = x[src_off:src_off + n]
  assert np.array_equal(b.numpy(), want)
