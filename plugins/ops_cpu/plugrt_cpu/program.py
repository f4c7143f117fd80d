"""CPU programs: load compiled code and call it.

Calling convention (both compilers): ``void NAME(const u64 *args, u64 g0, u64 g1)``
runs groups g0..g1-1; args = buffer addresses, one 8-byte slot per scalar, then
num_groups[3] and local_size[3]. The argument block is a ctypes array built once
per program; a launch rewrites only what changed since the last launch and makes
one foreign call. Grids with enough work are split across cores: ctypes releases
the GIL during the call, so the slices run in parallel.
"""
from __future__ import annotations

import ctypes
import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from plugrt.device import Buffer
from plugrt.dtype import DType, dtypes, float_packer
from plugrt.errors import EnvError
from plugrt.ir import Signature
from plugrt.runtime import LaunchLimits, Program

KernelFn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64)
_ZERO = ctypes.c_uint64(0)
PARALLEL_MIN_THREADS = 1 << 15  # below this many threads a launch runs on the calling thread
#: threads per group: a group's threads run as loops, and each value a kernel keeps across a barrier lives in a stack
#: array of one element per thread (SPILL); at 2**22 threads one float overflowed a thread's 8 MiB stack (SIGSEGV)
MAX_GROUP_THREADS = 4096


#: PLUGRT_CPU_THREADS may ask for up to this many workers per core: more only adds switching (100000 workers made a
#: launch take seconds), so a larger value is refused rather than silently lowered
THREADS_PER_CORE_MAX = 4


def thread_count() -> int:
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
  v = os.environ.get("PLUGRT_CPU_THREADS", "")
  if not v: return cores
  if not v.isdigit() or int(v) < 1:
    raise EnvError(f"PLUGRT_CPU_THREADS={v!r} is not a positive whole number", "e.g. PLUGRT_CPU_THREADS=4; 1 runs every kernel on the calling thread")
  if int(v) > (most := THREADS_PER_CORE_MAX * cores):
    raise EnvError(f"PLUGRT_CPU_THREADS={v} is more than {THREADS_PER_CORE_MAX} workers for each of the {cores} cores this process may use "
                   f"(at most {most})", f"unset it to use every core, or set PLUGRT_CPU_THREADS={cores}")
  return int(v)


class _Pool:
  """Worker threads for splitting big grids; created on first use."""
  def __init__(self) -> None:
    self.lock, self.executor, self.n = threading.Lock(), None, 0

  def get(self) -> tuple[Any, int]:
    if self.executor is None and self.n == 0:
      with self.lock:
        if self.n == 0:
          from concurrent.futures import ThreadPoolExecutor
          self.n = thread_count()
          if self.n > 1: self.executor = ThreadPoolExecutor(self.n - 1, thread_name_prefix="plugrt-cpu")
    return self.executor, self.n


POOL = _Pool()


def _packer(dt: DType) -> Callable[[Any], int]:
  """A scalar -> its 8-byte argument slot."""
  if dt is dtypes.bool: return lambda v: 1 if v else 0
  if dt.kind in "iu": return lambda v: v & 0xFFFFFFFFFFFFFFFF
  return float_packer(dt)  # IEEE rounding, out of range: inf (the rule on every device)


class CPUProgram(Program):
  def __init__(self, device: Any, name: str, lib: bytes, signature: Signature, fn_addr: int, keepalive: Any):
    super().__init__(device, name, lib, signature)
    self._keepalive = keepalive  # the loaded library or JIT engine that owns the code
    self._fn = KernelFn(fn_addr)
    n = self.nbufs + self.nvals
    self._args = (ctypes.c_uint64 * (n + 6))()
    self._argp = ctypes.c_void_p(ctypes.addressof(self._args))
    self._pack = [_packer(dt) for dt in signature.scalars]
    self._last_bufs: tuple = ()
    self._last_vals: Sequence[Any] | None = None
    self._last_dims: tuple = (None, None)
    self._ngroups = ctypes.c_uint64(1)
    self._nthreads = 1
    self.launch_limits = LaunchLimits(str(device), max_local_total=MAX_GROUP_THREADS)

  def __call__(self, *bufs: Buffer, global_size: Any = (1, 1, 1), local_size: Any = (1, 1, 1), vals: Sequence[Any] = (),
               wait: bool = False) -> float | None:
    if bufs != self._last_bufs or vals != self._last_vals or (global_size, local_size) != self._last_dims:
      self._prepare(bufs, vals, global_size, local_size)
    if self._nthreads >= PARALLEL_MIN_THREADS:
      return self._parallel(wait)
    if wait:
      st = time.perf_counter()
      self._fn(self._argp, _ZERO, self._ngroups)
      return time.perf_counter() - st
    self._fn(self._argp, _ZERO, self._ngroups)
    return None

  def _prepare(self, bufs: Sequence[Buffer], vals: Sequence[Any], global_size: Any, local_size: Any) -> None:
    a, nb = self._args, self.nbufs
    if vals == self._last_vals and (global_size, local_size) == self._last_dims and len(bufs) == nb and \
       all(type(b) is Buffer and b.device is self.device and b.dtype is dt for b, dt in zip(bufs, self.signature.buffers)):
      for i, b in enumerate(bufs): a[i] = b.handle  # only the buffers changed (a new output, say): they are checked above
      self._last_bufs = tuple(bufs)
      return
    gs, ls = self.check_args(bufs, vals, global_size, local_size)
    for i, b in enumerate(bufs): a[i] = b.handle
    for j, (v, pack) in enumerate(zip(vals, self._pack)): a[nb + j] = pack(v)
    base = nb + self.nvals
    a[base:base + 6] = [*gs, *ls]
    self._ngroups = ctypes.c_uint64(math.prod(gs))
    self._nthreads = math.prod(gs) * math.prod(ls)
    self._last_bufs, self._last_vals, self._last_dims = tuple(bufs), tuple(vals), (global_size, local_size)

  def _parallel(self, wait: bool) -> float | None:
    st = time.perf_counter()
    executor, n = POOL.get()
    total = self._ngroups.value
    if executor is None or total < 2:
      self._fn(self._argp, _ZERO, self._ngroups)
    else:
      parts = min(n, total)
      cuts = [total * i // parts for i in range(parts + 1)]
      futures = [executor.submit(self._fn, self._argp, ctypes.c_uint64(cuts[i]), ctypes.c_uint64(cuts[i + 1])) for i in range(1, parts)]
      self._fn(self._argp, ctypes.c_uint64(cuts[0]), ctypes.c_uint64(cuts[1]))
      for f in futures: f.result()
    return time.perf_counter() - st if wait else None
