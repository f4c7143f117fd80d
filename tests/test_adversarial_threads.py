"""Several threads launching at once, on every device and compiler: each thread gets its own results.

Device.program() hands one Program to every caller that asks for the same source, so Tensor users on different
threads share Programs without knowing it; a launch must never see another thread's buffers, scalars or sizes.
"""
import importlib.util
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from plugrt import Buffer, Device, Tensor, dtypes, kernel
from plugrt.errors import UnsupportedError
from plugrt.frontend.dsl import global_id
from plugrt.registry import Registry, use

NTHREADS = 8


def installed(module: str) -> bool: return importlib.util.find_spec(module) is not None


WEBGPU_ENGINES = [e for e, m in (("WGPU", "plugrt_webgpu_wgpu"), ("DAWN", "plugrt_webgpu_dawn")) if installed(m)]


def targets() -> list[tuple[str, dict[str, str]]]:
  """(device, the environment that picks its compiler or engine): the CPU with both compilers, WEBGPU on each engine."""
  out: list[tuple[str, dict[str, str]]] = []
  for d in Device.available():
    if d == "CPU": out += [("CPU", {"DEV": "CPU:CLANG"}), ("CPU", {"DEV": "CPU:LLVM"})]
    elif d == "WEBGPU": out += [("WEBGPU", {"WEBGPU_IFACE": e}) for e in WEBGPU_ENGINES]
    else: out.append((d, {}))
  return out


@pytest.fixture(params=targets(), ids=lambda t: "-".join([t[0], *t[1].values()]))
def target(request) -> Iterator[str]:
  """The device name, with a process-wide registry made under request.param's environment (so Tensors use it too)."""
  dev, env = request.param
  reg = Registry(env={**os.environ, **env})
  try:
    with use(reg):
      opened = reg.open(dev)
      assert env.get("DEV", ":").split(":")[1] in ("", opened.info.compiler) and env.get("WEBGPU_IFACE", "") in ("", opened.info.interface)
      host = np.arange(4096, dtype=np.float32)
      blob = wrapped(opened, host)  # every thread test runs with wrapped memory alive (synchronize() maps it on CL)
      yield dev
      del blob
  finally: reg.close()


def wrapped(dev: Any, host: np.ndarray) -> Buffer | None:
  """A from_blob Buffer of `host` on `dev`, or None where the device cannot wrap host memory."""
  try: return Buffer.from_blob(host.ctypes.data, host.size, dtypes.float32, dev, keepalive=host)
  except UnsupportedError: return None


def run_threads(work: Callable[[int], None]) -> None:
  """work(t) on NTHREADS threads started together, switching threads as often as Python can (so that a launch's
  Python steps interleave with other threads' too, not only its foreign calls); re-raises the first failure."""
  start, errors = threading.Barrier(NTHREADS), []
  def body(t: int) -> None:
    try:
      start.wait()
      work(t)
    except BaseException as e: errors.append(e)
  threads = [threading.Thread(target=body, args=(t,)) for t in range(NTHREADS)]
  interval = sys.getswitchinterval()
  sys.setswitchinterval(1e-6)
  try:
    for th in threads: th.start()
    for th in threads: th.join()
  finally: sys.setswitchinterval(interval)
  if errors: raise errors[0]


def iterations(dev: str, fast: int, slow: int) -> int: return slow if dev == "PYTHON" else fast


def test_tensor_expressions_from_threads(target):
  dev = target
  n, iters = 1000, iterations(dev, 25, 4)
  def work(t: int) -> None:
    for i in range(iters):
      d = np.arange(n, dtype=np.float32) + 1000 * t + i  # integers: exact on every device, whatever it contracts
      got = (Tensor(d, device=dev) * 2 + 1).numpy()
      np.testing.assert_array_equal(got, d * 2 + 1, err_msg=f"thread {t}, iteration {i}")
  run_threads(work)


@kernel
def affine(out: dtypes.float32[:], x: dtypes.float32[:], a: dtypes.float32, b: dtypes.float32, n: dtypes.int32):
  i = global_id(0)
  if i < n:
    out[i] = a * x[i] + b


@pytest.mark.parametrize("n", [1000, 1 << 16], ids=["small", "split"])  # split: enough threads for the CPU's parallel path
def test_one_program_launched_from_threads(target, n):
  dev = target
  if dev == "PYTHON" and n > 1000: pytest.skip("the interpreter takes seconds for a grid this size")
  rdev = Device[dev]
  prg = rdev.program(affine.ir())
  local = 64
  groups = -(-n // local)
  iters = iterations(dev, 40 if n <= 1000 else 10, 4)
  def work(t: int) -> None:
    x = np.arange(n, dtype=np.float32) + 100 * t
    xb, outs = Buffer.from_numpy(x, rdev), [Buffer(rdev, n, dtypes.float32) for _ in range(2)]
    for i in range(iters):
      out = outs[i % 2]  # same buffers every other launch (the launch's fast path), new scalars every fourth
      a, b = float(t + 1), float(t * 10 + i // 4)
      prg(out, xb, global_size=(groups, 1, 1), local_size=(local, 1, 1), vals=(a, b, n))
      np.testing.assert_array_equal(out.numpy(), x * a + b, err_msg=f"thread {t}, iteration {i}")
  run_threads(work)


@pytest.mark.parametrize("engine", WEBGPU_ENGINES or [pytest.param("none", marks=pytest.mark.skip("no WebGPU engine is installed"))])
def test_webgpu_uploads_keep_staging_bounded(engine):
  """An upload-only loop: each engine frees the staging memory of its queued writes (a submit must carry them) once
  they pass STAGING_BOUND, and on synchronize; before, the memory grew with every upload until the next launch."""
  from plugrt_webgpu.engine import STAGING_BOUND
  if "WEBGPU" not in Device.available(): pytest.skip("WEBGPU is not available here (see plugrt devices)")
  reg = Registry(env={**os.environ, "WEBGPU_IFACE": engine})
  try:
    dev = reg.open("WEBGPU")
    assert dev.info.interface == engine
    eng, n = dev.info.iface_object, 4 << 20
    buf, data = Buffer(dev, n // 4, dtypes.float32), np.arange(n // 4, dtype=np.float32)
    def rss() -> int: return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    def upload(nbytes: int, first: int) -> None:
      for i in range(first, first + nbytes // n):
        data[0] = i
        buf.copyin(data)
        assert eng.staged_bytes < STAGING_BOUND
    # an engine's staging may settle at a size of its own (Dawn over NVIDIA's driver keeps ~190 MiB of ring): what must
    # not happen is growth with every upload, so the second run of uploads, after the first, adds less than the bound
    upload(4 * STAGING_BOUND, 0)
    settled = rss()
    upload(8 * STAGING_BOUND, 4 * STAGING_BOUND // n)
    assert rss() - settled < STAGING_BOUND, f"{(rss() - settled) >> 20} MiB more after {8 * STAGING_BOUND >> 20} MiB more uploads"
    dev.synchronize()
    assert eng.staged_bytes == 0 and buf.numpy()[0] == 12 * STAGING_BOUND // n - 1
  finally: reg.close()


def test_rendering_from_threads(target):
  """Renderers are shared by every thread using a device's compiler: rendering different kernels at once gives each
  the source it gets alone (WGSL kept its per-kernel state on the renderer: the 16-core GPU machine mixed kernels)."""
  from plugrt.compiler.samples import chain_case, ops_case
  comp = Device[target].compiler
  kernels = [ops_case(dt).kernel for dt in (dtypes.float32, dtypes.int32, dtypes.uint8)] + [chain_case(dtypes.float32).kernel]
  alone = [comp.render(k) for k in kernels]
  got: list[list[str]] = [[] for _ in range(NTHREADS)]
  def work(t: int) -> None:
    for i in range(12): got[t].append(comp.render(kernels[(t + i) % len(kernels)]))
  run_threads(work)
  for t in range(NTHREADS):
    assert got[t] == [alone[(t + i) % len(kernels)] for i in range(12)], f"thread {t} rendered a mix of kernels"


@pytest.mark.parametrize("target,env", targets(), ids=lambda t: t if isinstance(t, str) else "-".join(t.values()) or "default")
def test_synchronize_from_threads_with_wrapped_memory_alive(target, env):
  """synchronize() from several threads at once while from_blob memory is alive, with launches and copies between: CL
  maps wrapped memory in synchronize, and two threads' unmaps of one buffer ended the process (SIGABRT). In a child
  process, so that such a regression fails this test instead of ending pytest."""
  code = f"""
import threading, numpy as np
from plugrt import Buffer, Device, Tensor, dtypes
d = Device[{target!r}]
host = np.arange(4096, dtype=np.float32)
try: blob = Buffer.from_blob(host.ctypes.data, host.size, dtypes.float32, d, keepalive=host)
except Exception as e: blob = None; print("no wrap:", type(e).__name__)
errors = []
def work(t):
  try:
    for i in range(40):
      d.synchronize()
      if i % 8 == 0:
        x = np.full(64, t + i, np.float32)
        assert ((Tensor(x, device={target!r}) + 1).numpy() == x + 1).all()
  except BaseException as e: errors.append(e)
ts = [threading.Thread(target=work, args=(t,)) for t in range(8)]
[t.start() for t in ts]; [t.join() for t in ts]
if errors: raise errors[0]
if blob is not None: assert (blob.numpy() == host).all()
print("ok")
"""
  r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env={**os.environ, **env})
  assert r.returncode == 0 and r.stdout.strip().endswith("ok"), f"exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
