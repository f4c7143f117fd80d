"""The WEBGPU device's objects: allocator, WGSL compiler and program, over any Engine.

Launch path (what `prg(*bufs, ...)` does):
- same buffers, scalars and sizes as the previous call: one call of a prepared
  launcher (encode a compute pass, submit). No Python object is built, nothing is
  looked up, nothing is written to the GPU;
- something changed: check the arguments, work out the bindings (views of one
  allocation share a binding), write the uniform buffer only if its bytes differ,
  take the pipeline (built once per workgroup size and aliasing pattern) and the
  bind group (cached per set of buffers, LRU) from their caches, and make a new
  launcher.

Threads: every use of the engine (launches, copies, allocations, compiles) holds the
engine's lock. A launch's check, prepare and submit happen under it together: the
program's uniform buffer and launcher are one per program, and the uniform write that
a prepare queues must be followed by its own launch's submit, not another thread's.
"""
from __future__ import annotations

import struct
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from plugrt.dtype import DType, dtypes, float_bits, float_packer, float_value
from plugrt.errors import DeviceUnavailable, Reason
from plugrt.hookspecs import DeviceInfo
from plugrt.launchargs import PreparedCall
from plugrt.runtime import Allocator, Compiler, DeviceState, LaunchLimits, LockedProgram
from plugrt_webgpu.engine import FEATURE_F16, Engine, Pipeline
from plugrt_webgpu.install import engine_hint
from plugrt_webgpu.wgsl import Header, WGSLRenderer, parse_header, specialize

#: bind groups kept per program (each pins its buffers): enough for ping-pong and small graphs
BIND_GROUP_CACHE = 64
RENDERER_VERSION = "wgsl-1"


def engine_of(device: DeviceInfo) -> Engine:
  eng = device.iface_object
  if not isinstance(eng, Engine):
    raise DeviceUnavailable(f"{device.canonical}: no WebGPU engine was opened (interface {device.interface or 'none'})", Reason.NO_DEVICE,
                            engine_hint())
  return eng


class WebGPUState(DeviceState):
  def __init__(self, engine: Engine): self.engine = engine

  def synchronize(self) -> None:
    with self.engine.lock: self.engine.synchronize()

  def close(self) -> None:
    with self.engine.lock: self.engine.close()


# ---------------------------------------------------------------- memory

class Mem:
  """A handle: `nbytes` at byte `offset` of the engine buffer `buf` (whose size is `size`)."""
  __slots__ = ("buf", "nbytes", "offset", "size")

  def __init__(self, buf: Any, offset: int, nbytes: int, size: int):
    self.buf, self.offset, self.nbytes, self.size = buf, offset, nbytes, size

  def __repr__(self) -> str: return f"<Mem {self.nbytes} B at +{self.offset} of {self.size} B>"


def _round4(n: int) -> int: return (n + 3) & ~3


class WebGPUAllocator(Allocator[Mem]):
  """Engine storage buffers, sizes rounded up to 4 bytes (WebGPU copies move whole words).
  Copies at unaligned offsets or of odd sizes read the covering words and write them back.
  WebGPU cannot wrap host memory: from_blob refuses (supports_wrap stays False)."""

  def __init__(self, device: DeviceInfo):
    super().__init__(device)
    self.engine = engine_of(device)
    self._lock = self.engine.lock
    # Every engine buffer stays reachable from here until _free. Engines' buffer objects may have finalizers (wgpu-py's
    # release the native buffer): without this, a Buffer dropped in a reference cycle takes its engine buffer into the
    # same garbage, the collector finalizes both, and the allocator's cache would keep a released handle.
    self._live: dict[int, Any] = {}

  def _alloc(self, nbytes: int, options: Any) -> Mem:
    size = _round4(nbytes)
    if size > self.engine.limits.max_buffer_size:
      raise MemoryError(f"{size} bytes is more than the adapter's largest buffer ({self.engine.limits.max_buffer_size} bytes)")
    with self._lock:
      buf = self.engine.alloc(size)
      self._live[id(buf)] = buf
    return Mem(buf, 0, nbytes, size)

  def _free(self, handle: Mem, nbytes: int, options: Any) -> None:
    with self._lock:
      self._live.pop(id(handle.buf), None)
      self.engine.free(handle.buf)
  def _offset(self, handle: Mem, offset: int, nbytes: int) -> Mem: return Mem(handle.buf, offset, nbytes, handle.size)

  def _copyin(self, dest: Mem, src: memoryview) -> None:
    off, n = dest.offset, src.nbytes
    if not (off | n) & 3:
      with self._lock: self.engine.write(dest.buf, off, src)
      return
    lo, hi = off & ~3, _round4(off + n)
    with self._lock:  # read-modify-write of the partial words at the edges
      tmp = bytearray(hi - lo)
      self.engine.read(dest.buf, lo, memoryview(tmp))
      tmp[off - lo:off - lo + n] = src
      self.engine.write(dest.buf, lo, memoryview(tmp))

  def _copyout(self, dest: memoryview, src: Mem) -> None:
    off, n = src.offset, dest.nbytes
    if not (off | n) & 3:
      with self._lock: self.engine.read(src.buf, off, dest)
      return
    lo, hi = off & ~3, _round4(off + n)
    tmp = bytearray(hi - lo)
    with self._lock: self.engine.read(src.buf, lo, memoryview(tmp))
    dest[:] = tmp[off - lo:off - lo + n]

  def _copy(self, dest: Mem, src: Mem, nbytes: int) -> None:
    if not (dest.offset | src.offset | nbytes) & 3:
      with self._lock: self.engine.copy(src.buf, src.offset, dest.buf, dest.offset, nbytes)
      return
    host = bytearray(nbytes)
    self._copyout(memoryview(host), src)
    self._copyin(dest, memoryview(host))


# ---------------------------------------------------------------- compiler

class WGSLCompiler(Compiler):
  """IR -> WGSL text. The "binary" is the WGSL text itself: WebGPU has no portable
  binary, engines compile when a pipeline is created. compile_uncached() has the
  engine parse and validate the module (so a bad kernel fails here with the engine's
  log) and keeps that module for the program that loads it next; the disk cache
  then remembers which sources this engine, adapter and feature set accepted."""
  name = "WGSL"
  cache_namespace = "webgpu-wgsl"

  def __init__(self, device: DeviceInfo):
    super().__init__(device)
    self.engine = engine_of(device)
    lim = self.engine.limits
    self.renderer = WGSLRenderer(device.canonical, f16=FEATURE_F16 in self.engine.features, max_storage_buffers=lim.max_storage_buffers,
                                 max_workgroup_storage=lim.max_workgroup_storage, adapter=f"{self.engine.name} on {self.engine.adapter.name}")

  def render(self, kernel: Any) -> str: return self.renderer.render(kernel)

  def compile_uncached(self, src: str) -> bytes:
    with self.engine.lock:
      module = self.engine.create_module(src)  # raises CompileError with the engine's messages
      _fresh_modules(self.engine)[src] = module
    return src.encode()

  def toolchain(self) -> tuple[str, ...]:
    e = self.engine
    return (RENDERER_VERSION, e.name, e.version, e.adapter.name, e.adapter.backend, e.adapter.driver, ",".join(sorted(e.features)))


_FRESH: weakref.WeakKeyDictionary[Engine, OrderedDict[str, Any]] = weakref.WeakKeyDictionary()


def _fresh_modules(engine: Engine) -> OrderedDict[str, Any]:
  """Modules made by compile_uncached, waiting for the program that loads them next (a few: a compile
  that is never loaded keeps nothing alive for long). The caller holds engine.lock."""
  d = _FRESH.setdefault(engine, OrderedDict())
  while len(d) > 16: engine.release(d.popitem(last=False)[1])
  return d


# ---------------------------------------------------------------- program

def _word_packer(dt: DType) -> Any:
  """A scalar -> its uniform word (the renderer's _scalar reads it back)."""
  if dt is dtypes.bool: return lambda v: 1 if v else 0
  if dt.kind in "iu": return lambda v: v & 0xFFFFFFFF
  if dt is dtypes.bfloat16: return lambda v: float_bits(v, dt) << 16  # bfloat16's bits are float32's high half
  if dt is dtypes.float32: return float_packer(dt)
  # float16: rounded once to half (IEEE, as the interpreter's cast), then carried exactly as float32
  return lambda v: float_bits(float_value(v, dt), dtypes.float32)


class _Launch(PreparedCall):
  __slots__ = ("timed",)


class WebGPUProgram(LockedProgram):
  """A WGSL kernel on one engine: see the module docstring for the launch path."""
  scalar_packer = staticmethod(_word_packer)

  def __init__(self, device: Any, name: str, lib: bytes, signature: Any):
    super().__init__(device, name, lib, signature)
    self.engine: Engine = engine_of(device.info)
    self.src = lib.decode()
    self.header: Header = parse_header(self.src)
    if len(self.header.buffers) != self.nbufs or self.header.nscalars != self.nvals:
      raise ValueError(f"program {name}: its WGSL header does not match its signature")
    self.launch_lock = self.engine.lock  # see the module docstring
    self._modules: dict[tuple[int, ...], Any] = {}
    ident = tuple(range(self.nbufs))
    with self.launch_lock:
      fresh = _fresh_modules(self.engine).pop(self.src, None)
      self._modules[ident] = fresh if fresh is not None else self.engine.create_module(self.src)
      self._uniform = self.engine.create_uniform(self.header.uniform_bytes)
    self._pipelines: dict[tuple[tuple[int, ...], tuple[int, int, int]], Pipeline] = {}
    self._groups: OrderedDict[tuple, Any] = OrderedDict()
    self._uniform_bytes = b""
    self._scale = [1 if dt.itemsize < 4 else 4 for dt in signature.buffers]  # view offsets: packed dtypes in bytes, others in words
    lim = self.engine.limits
    self.launch_limits = LaunchLimits(str(device), (lim.max_workgroups_per_dimension,) * 3, lim.max_workgroup_size, lim.max_invocations_per_workgroup)
    self.pipelines_built = 0   # for tests and `plugrt bench`: pipelines made so far
    self.bind_groups_built = 0

  # ---- everything below runs only when the arguments changed, with the engine's lock held
  def _encode(self, bufs: tuple, scalars: tuple, gs: tuple[int, int, int], ls: tuple[int, int, int]) -> _Launch:
    alias, bindings, starts = self._bindings(bufs)
    words = [(b.handle.offset - starts[alias[k]]) // self._scale[k] for k, b in enumerate(bufs)] + list(scalars)
    data = struct.pack(f"<{len(words)}I", *words).ljust(self.header.uniform_bytes, b"\0")
    if data != self._uniform_bytes:  # queue.writeBuffer is ordered after earlier submits: in-flight launches keep their values
      self.engine.write(self._uniform, 0, memoryview(data))
      self._uniform_bytes = data
    pipe = self._pipeline(alias, ls)
    key = (alias, ls, tuple(bindings))
    if (bg := self._groups.get(key)) is None:
      bg = self._groups[key] = self.engine.create_bind_group(pipe, self._uniform, bindings)
      self.bind_groups_built += 1
      if len(self._groups) > BIND_GROUP_CACHE: self.engine.release(self._groups.popitem(last=False)[1])
    else: self._groups.move_to_end(key)
    p = _Launch(submit=self.engine.launcher(pipe, bg, gs))
    p.timed = self.engine.timed_launcher(pipe, bg, gs)
    return p

  def _timed(self, prepared: PreparedCall) -> float:
    assert isinstance(prepared, _Launch)
    return prepared.timed()

  def _bindings(self, bufs: Sequence[Any]) -> tuple[tuple[int, ...], list[tuple[Any, int, int]], list[int]]:
    """(binding of each argument, (buffer, offset, size) of each binding, start of each binding).
    Views of one allocation share one binding covering all of them: WebGPU rejects a writable
    binding that overlaps another binding of the same buffer."""
    roots: dict[int, int] = {}
    spans: list[list[Any]] = []
    alias = []
    for b in bufs:
      h = b.handle
      r = roots.setdefault(id(h.buf), len(spans))
      if r == len(spans): spans.append([h.buf, h.offset, h.offset + h.nbytes, h.size])
      else: spans[r][1], spans[r][2] = min(spans[r][1], h.offset), max(spans[r][2], h.offset + h.nbytes)
      alias.append(r)
    align, most = self.engine.limits.min_storage_offset_alignment, self.engine.limits.max_storage_binding_size
    bindings, starts = [], []
    for buf, lo, hi, size in spans:
      start = lo - lo % align
      end = min(max(_round4(hi), start + 4), size)
      if end - start > most:
        raise ValueError(f"program {self.name}: a buffer binding of {end - start} bytes is over {self.device}'s largest storage binding "
                         f"({most} bytes)")
      bindings.append((buf, start, end - start))
      starts.append(start)
    return tuple(alias), bindings, starts

  def _pipeline(self, alias: tuple[int, ...], ls: tuple[int, int, int]) -> Pipeline:
    if (p := self._pipelines.get((alias, ls))) is None:
      if (module := self._modules.get(alias)) is None:
        module = self._modules[alias] = self.engine.create_module(specialize(self.src, alias))
      consts = {"pr_lx": float(ls[0]), "pr_ly": float(ls[1]), "pr_lz": float(ls[2])}
      p = self._pipelines[(alias, ls)] = self.engine.create_pipeline(module, self.header.entry, max(alias, default=-1) + 1, consts, ls)
      self.pipelines_built += 1
    return p

  def __del__(self) -> None:
    """Give the engine's objects back (engines whose handles are garbage-collected ignore this)."""
    try:
      with self.launch_lock:
        for obj in [*self._groups.values(), *self._pipelines.values(), *self._modules.values()]: self.engine.release(obj)
        self._groups.clear(); self._pipelines.clear(); self._modules.clear()
        self.engine.free(self._uniform)
    except Exception: pass  # interpreter shutdown


def load_program(device: Any, name: str, lib: bytes, signature: Any) -> WebGPUProgram:
  return WebGPUProgram(device, name, lib, signature)
