"""The CLANG compiler: C source -> relocatable object, linked into the process by LLVM's JIT.

clang compiles to an object in a memfd (no driver link step, which alone would nearly double a
small compile, and no `ld -shared` either: a second process). The object is built
like the LLVM compiler's (no PIC, the large code model: every address absolute), so the
same in-process loader links it (plugrt_cpu.llvm.load_object); no temporary file is ever
written by plugrt. `CC` names another compiler (it must accept clang's flags: clang or gcc).
A shared object (one built before, or by hand) still loads, dlopen'ed from memory.
"""
from __future__ import annotations

import atexit
import ctypes
import hashlib
import os
import platform
import re
import subprocess
import threading
import weakref
from typing import Any

from plugrt.compiler.ir import Kernel
from plugrt.errors import CompileError
from plugrt.hookspecs import DeviceInfo
from plugrt.runtime import Compiler
from plugrt_cpu.crender import CPUCRenderer
from plugrt_cpu.span import RenderedSources
from plugrt_cpu.toolchain import MAX_SHARED_BYTES, probe_clang, which_cc

# -fno-pic -mcmodel=large: absolute addresses only, so the JIT may place the code, its constants and libm anywhere
# an attribute the compiler ignores is an error: the source would not be what the renderer meant (a vector type that
# became a scalar, a kernel that then runs wrongly)
CFLAGS = ("-O2", "-fno-pic", "-mcmodel=large", "-fwrapv", "-ffp-contract=off", "-fno-math-errno", "-fno-asynchronous-unwind-tables",
          "-nostdinc", "-ffreestanding", "-march=native", "-Werror=attributes")


# how clang and gcc report an error in the kernel's source (read from stdin): `<stdin>:12:5: error: ...`
_SOURCE_DIAGNOSTIC = re.compile(r"^<stdin>:\d+:(\d+:)? (fatal )?error:", re.M)


def cpu_identity() -> str:
  """What -march=native depends on: the CPU model and feature flags."""
  ident = platform.machine()
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith(("model name", "flags", "Features", "CPU part")): ident += line
        elif not line.strip(): break
  except OSError: pass
  return hashlib.sha256(ident.encode()).hexdigest()[:16]


def _tool_identity(path: str) -> str:
  real = os.path.realpath(path)
  st = os.stat(real)
  return f"{real}:{st.st_size}:{int(st.st_mtime)}"


class _Standby:
  """A C compiler process started ahead: loaded, and blocked reading its source from stdin; its object goes into
  its own memfd (opened by path through /proc, so the descriptor itself is not inherited)."""
  __slots__ = ("fd", "pid", "proc")

  def __init__(self, cc: str):
    self.pid = os.getpid()
    self.fd = os.memfd_create("plugrt-obj", os.MFD_CLOEXEC)
    try:
      self.proc = subprocess.Popen([cc, *CFLAGS, "-x", "c", "-", "-c", "-o", f"/proc/{self.pid}/fd/{self.fd}"],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except BaseException:
      os.close(self.fd)
      raise

  def discard(self) -> None:
    """Stop it (it has not been given a source) and release its memfd."""
    try:
      self.proc.kill()
      self.proc.wait()
    except OSError: pass
    self.release()

  def release(self) -> None:
    try: os.close(self.fd)
    except OSError: pass
    for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
      try:
        if f is not None: f.close()
      except OSError: pass


_compilers: weakref.WeakSet[ClangCompiler] = weakref.WeakSet()  # those that may hold a standby process


def _after_fork_in_child() -> None:
  """A forked child must not keep its parent's standby pipes open (the parent's clang would never see the end of its
  source), nor use a process that is not its own: drop them without touching the processes."""
  for comp in list(_compilers):
    sb, comp._standby = comp._standby, None
    comp._standby_lock = threading.Lock()
    if sb is not None: sb.release()


def _stop_all() -> None:
  for comp in list(_compilers):
    sb, comp._standby = comp._standby, None
    if sb is not None and sb.pid == os.getpid(): sb.discard()


if hasattr(os, "register_at_fork"): os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_stop_all)


class ClangCompiler(Compiler):
  """C -> relocatable object by one clang process per kernel. clang's start-up (loading and relocating libLLVM and
  libclang-cpp: most of a small kernel's compile) is paid ahead: after each compile the next clang is started
  and waits for its source on stdin (PLUGRT_CPU_CLANG_AHEAD=0 turns that off)."""
  name = "CLANG"
  cache_namespace = "cpu-clang"
  max_shared_bytes = MAX_SHARED_BYTES

  def __init__(self, device: DeviceInfo):
    super().__init__(device)
    self.renderer = CPUCRenderer()
    self.rendered = RenderedSources()  # for the span variants (plugrt_cpu.span)
    ctx = device.context
    cc, self.cc_named = which_cc(ctx)
    if cc is None:  # the probe's words, with CC when it names the compiler
      missing = probe_clang(ctx)
      raise CompileError(missing.detail, hint=missing.hint)
    self.cc = cc
    self.ahead = ctx.flag("PLUGRT_CPU_CLANG_AHEAD", True)
    self._standby: _Standby | None = None
    self._standby_lock = threading.Lock()
    _compilers.add(self)

  def __del__(self) -> None:
    try:
      if (sb := self._standby) is not None and sb.pid == os.getpid(): sb.discard()
    except Exception: pass  # interpreter shutdown

  def render(self, kernel: Kernel) -> str:
    src = self.renderer.render(kernel)
    self.rendered.remember(kernel.name, src)
    return src

  def toolchain(self) -> tuple[str, ...]:
    return (_tool_identity(self.cc), " ".join(CFLAGS), "ET_REL", cpu_identity())

  def _process(self) -> _Standby:
    """A compiler process for one source: the one started ahead if it is still waiting, else a new one; and, when
    compiling ahead, the next one is started now, so that it loads while this one compiles."""
    with self._standby_lock:
      sb, self._standby = self._standby, None
    if sb is not None and sb.pid != os.getpid():  # the parent's (a fork without the at-fork hook): never touch it
      sb.release()
      sb = None
    if sb is not None and sb.proc.poll() is not None:  # exited before it got a source (killed?): not trusted
      sb.discard()
      sb = None
    if sb is None: sb = _Standby(self.cc)
    if self.ahead:
      nxt = _Standby(self.cc)
      with self._standby_lock:
        if self._standby is None: self._standby, nxt = nxt, None
      if nxt is not None: nxt.discard()  # another thread put one there meanwhile
    return sb

  def compile_uncached(self, src: str) -> bytes:
    # the object goes into a memfd, not stdout: GNU as (behind gcc) cannot write an object to a pipe
    sb = self._process()
    try:
      _, err = sb.proc.communicate(src.encode())
      log = err.decode(errors="replace")
      if sb.proc.returncode != 0 and _SOURCE_DIAGNOSTIC.search(log):
        raise CompileError(f"{os.path.basename(self.cc)} failed to compile a CPU kernel", log,
                           "this is a renderer bug if the kernel came from plugrt's IR; please report it")
      size = os.fstat(sb.fd).st_size
      if sb.proc.returncode != 0 or not size:  # no word about the source: the compiler itself is the problem
        what = f"exited with status {sb.proc.returncode} without a diagnostic about the kernel's source" if sb.proc.returncode else \
          "exited 0 but wrote no object"
        raise CompileError(f"toolchain problem: the C compiler {self.cc_named} ({self.cc}) {what}", log,
                           "CC must name a working clang (or gcc); unset CC to use clang from PATH")
      return os.pread(sb.fd, size, 0)
    finally:
      sb.release()


class SharedLib:
  """A shared object dlopen'ed from a memfd. glibc caches libraries by path, so the memfd
  (and with it the /proc/self/fd/N path) stays open while the library is loaded, and
  the library is dlclose'd before the descriptor is released: a path is never reused
  while a library is mapped under it."""

  def __init__(self, lib: bytes, name: str):
    self.fd = os.memfd_create(f"plugrt-{name}", 0)
    try:
      os.write(self.fd, lib)
      self.dll = ctypes.CDLL(f"/proc/self/fd/{self.fd}")
    except BaseException:
      os.close(self.fd)
      raise
    self.addr: int = ctypes.cast(getattr(self.dll, name), ctypes.c_void_p).value  # type: ignore[assignment]

  def __del__(self) -> None:
    try:
      import _ctypes
      _ctypes.dlclose(self.dll._handle)
      os.close(self.fd)
    except Exception: pass  # interpreter shutdown


def load_shared(lib: bytes, name: str) -> tuple[int, Any]:
  """dlopen a shared object held in memory; returns (address of `name`, the owner to keep alive)."""
  so = SharedLib(lib, name)
  return so.addr, so
