"""CPU programs: load compiled code and call it.

Calling convention (both compilers): ``void NAME(const u64 *args, u32 gid0, u32 gid1, u32 gid2)``
runs one group; args = buffer addresses, one 8-byte slot per scalar, then num_groups[3]
and local_size[3]. A launch is one foreign call of the grid runner (plugrt_cpu.grid) on
the block [kernel address, ng0, ng1, kind, args...], which calls the kernel for each group. A launch with the same arguments as the previous
one makes one foreign call on the argument block prepared for them; other arguments
get a new prepared launch (its own block), so threads sharing a program never see
each other's arguments. Grids with enough work are split across cores: ctypes releases
the GIL during the call, so the slices run in parallel. A launch with many small groups runs the program's span
variant (plugrt_cpu.span) instead, made when such a launch is first prepared: the same runner calls it once per row.
"""
from __future__ import annotations

import ctypes
import math
import os
import threading
from collections.abc import Mapping
from functools import partial
from typing import Any

from plugrt.compiler.ir import Signature
from plugrt.errors import EnvError
from plugrt.launchargs import PreparedCall
from plugrt.runtime import LaunchLimits, Program
from plugrt_cpu.grid import HEAD, ONE_GROUP, SPAN
from plugrt_cpu.objects import check_elf, load_relocatable
from plugrt_cpu.span import SPAN_MAX_THREADS, SPAN_MIN_GROUPS, SPAN_MIN_ROW

KernelFn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64)
_ZERO = ctypes.c_uint64(0)
PARALLEL_MIN_THREADS = 1 << 15  # below this many threads a launch runs on the calling thread
#: threads per group: a group's threads run as loops, and each value a kernel keeps across a barrier lives in a stack
#: array of one element per thread (SPILL); at 2**22 threads one float overflowed a thread's 8 MiB stack (SIGSEGV)
MAX_GROUP_THREADS = 4096


#: PLUGRT_CPU_THREADS may ask for up to this many workers per core: more only adds switching (100000 workers made a
#: launch take seconds), so a larger value is refused rather than silently lowered
THREADS_PER_CORE_MAX = 4


def thread_count(env: Mapping[str, str]) -> int:
  """PLUGRT_CPU_THREADS of `env` (the device's context), checked; unset: every core this process may use."""
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
  v = env.get("PLUGRT_CPU_THREADS", "")
  if not v: return cores
  if not v.isdigit() or int(v) < 1:
    raise EnvError(f"PLUGRT_CPU_THREADS={v!r} is not a positive whole number", "e.g. PLUGRT_CPU_THREADS=4; 1 runs every kernel on the calling thread")
  if int(v) > (most := THREADS_PER_CORE_MAX * cores):
    raise EnvError(f"PLUGRT_CPU_THREADS={v} is more than {THREADS_PER_CORE_MAX} workers for each of the {cores} cores this process may use "
                   f"(at most {most})", f"unset it to use every core, or set PLUGRT_CPU_THREADS={cores}")
  return int(v)


class _Pool:
  """Worker threads for splitting big grids, shared by the process's CPU devices; created on first use, as many as
  the first CPU device opened asked for (its context's PLUGRT_CPU_THREADS: see configure)."""
  def __init__(self) -> None:
    self.lock, self.executor, self.n, self.wanted = threading.Lock(), None, 0, 0

  def configure(self, n: int) -> None:
    """Size the pool, if no launch has started it yet (a pool cannot shrink under running launches)."""
    with self.lock:
      if self.n == 0 and not self.wanted: self.wanted = n

  def get(self) -> tuple[Any, int]:
    if self.executor is None and self.n == 0:
      with self.lock:
        if self.n == 0:
          from concurrent.futures import ThreadPoolExecutor
          self.n = self.wanted or thread_count({})
          if self.n > 1: self.executor = ThreadPoolExecutor(self.n - 1, thread_name_prefix="plugrt-cpu")
    return self.executor, self.n


POOL = _Pool()


class _Launch(PreparedCall):
  """One prepared launch: its own argument block, never changed once built (see the module docstring), and what
  submits it: one foreign call of the grid runner, or the worker pool's split of a big grid."""
  __slots__ = ("args", "argp", "head", "ngroups", "parallel", "tail")

  def __init__(self, argtype: Any, head: list[int], bufs: tuple, tail: list[int], ngroups: Any, parallel: bool):
    # (on the launch path: the call's record is the core's to set, PreparedCall.__init__ is not run)
    self.head, self.tail = head, tail  # [kernel, ng0, ng1, kind]; the scalar slots, then num_groups[3], local_size[3]
    self.args = a = argtype()  # [kernel, ng0, ng1, kind], then the kernel's args
    a[0:HEAD] = head
    for i, b in enumerate(bufs): a[HEAD + i] = b.handle
    a[HEAD + len(bufs):] = tail
    self.argp = ctypes.c_void_p(ctypes.addressof(a))
    self.ngroups = ngroups  # a c_uint64, never written: launches made for the same sizes share it
    self.parallel = parallel  # split across the worker pool


class CPUProgram(Program):
  self_contained = True  # a launch is its own argument block (Program.self_contained)

  def __init__(self, device: Any, name: str, lib: bytes, signature: Signature, fn_addr: int, keepalive: Any,
               runner: tuple[int, Any], compiler: str = ""):
    """fn_addr: the kernel (one group per call); runner: (address, owner) of the grid runner that calls it;
    compiler: the compiler that made `lib` ("CLANG" or "LLVM"), which makes the span variant ("": none is made)."""
    super().__init__(device, name, lib, signature)
    self.compiler = compiler
    self._span: tuple[int, Any] | None = None  # (span variant's address, its owner), once made
    #: why this program has no span variant (None: not needed yet, or made); set once making it failed
    self.span_error: str | None = None if compiler else "the compiler that made it is not known"
    if compiler and not device.info.context.flag("PLUGRT_CPU_SPAN", True): self.span_error = "off (PLUGRT_CPU_SPAN=0)"
    self._span_lock = threading.Lock()
    self._keepalive = (keepalive, runner[1])  # the loaded library or JIT engine that owns the code, and the runner's
    self._kernel_addr = fn_addr
    self._fn = KernelFn(runner[0])
    self._argtype = ctypes.c_uint64 * (HEAD + self.nbufs + self.nvals + 6)
    self.launch_limits = LaunchLimits(str(device), max_local_total=MAX_GROUP_THREADS)

  def _encode(self, bufs: tuple, scalars: tuple, gs: tuple[int, int, int], ls: tuple[int, int, int]) -> _Launch:
    ngroups = math.prod(gs)
    head = [self._kernel_addr, gs[0], gs[1], ONE_GROUP]
    if ngroups >= SPAN_MIN_GROUPS and gs[0] >= SPAN_MIN_ROW and math.prod(ls) <= SPAN_MAX_THREADS and (span := self.span_variant()):
      head = [span[0], gs[0], gs[1], SPAN]
    return self._launch_of(head, bufs, [*scalars, *gs, *ls], ctypes.c_uint64(ngroups), ngroups * math.prod(ls) >= PARALLEL_MIN_THREADS)

  def _rebind(self, last: PreparedCall, bufs: tuple) -> _Launch:
    assert isinstance(last, _Launch)
    return self._launch_of(last.head, bufs, last.tail, last.ngroups, last.parallel)

  def _launch_of(self, head: list[int], bufs: tuple, tail: list[int], ngroups: Any, parallel: bool) -> _Launch:
    launch = _Launch(self._argtype, head, bufs, tail, ngroups, parallel)
    # (submit holds the block's address, not the launch: a cycle would keep its buffers until the collector runs)
    launch.submit = partial(self._parallel, launch.argp, ngroups) if parallel else partial(self._fn, launch.argp, _ZERO, ngroups)
    return launch

  def span_variant(self) -> tuple[int, Any] | None:
    """(address, owner) of this program's span variant (plugrt_cpu.span), made on the first call;
    None where it cannot be made (span_error says why): launches then run the one-group kernel, as always."""
    if self._span is not None or self.span_error is not None: return self._span
    with self._span_lock:
      if self._span is None and self.span_error is None:
        try: self._span = self._make_span()
        except Exception as e: self.span_error = f"{type(e).__name__}: {e}"
    return self._span

  def _make_span(self) -> tuple[int, Any]:
    from plugrt_cpu.span import span_name, span_source
    comp = self.device.compiler_for(self.compiler)
    if (src := comp.rendered.get(self.name)) is None: raise LookupError(f"{self.compiler} did not render {self.name} in this process")
    if comp.compile_cached(src)[0] != self.lib:
      raise LookupError(f"the source {self.compiler} last rendered as {self.name} does not compile to this program's binary")
    if (ssrc := span_source(self.compiler, src, self.name)) is None: raise LookupError(f"{self.name}'s source is not a CPU kernel's")
    name = span_name(self.compiler, self.name)

    def load(lib: bytes) -> tuple[int, Any]:
      check_elf(lib, name)
      return load_relocatable(lib, name)
    lib, cached = comp.compile_cached(ssrc)
    try: return load(lib)
    except Exception as e:
      if not cached: raise
      return load(comp.recompile(ssrc, e))  # the cache held a binary that does not load

  def _parallel(self, argp: Any, ngroups: Any) -> None:
    executor, n = POOL.get()
    total, fn = ngroups.value, self._fn
    if executor is None or total < 2:
      fn(argp, _ZERO, ngroups)
    else:
      parts = min(n, total)
      cuts = [total * i // parts for i in range(parts + 1)]
      futures = [executor.submit(fn, argp, ctypes.c_uint64(cuts[i]), ctypes.c_uint64(cuts[i + 1])) for i in range(1, parts)]
      fn(argp, ctypes.c_uint64(cuts[0]), ctypes.c_uint64(cuts[1]))
      for f in futures: f.result()
