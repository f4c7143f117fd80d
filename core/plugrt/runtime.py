"""Base classes of what the hooks build: DeviceState, Allocator, Compiler, Program.

A backend subclasses these and fills in the underscored methods. The core adds what
every backend needs once: the allocator's caching layer and out-of-memory retry, the
compiler's disk cache, and the program's argument checking.
"""
from __future__ import annotations

import time
from _thread import allocate_lock  # threading's locks, without importing threading (discovery would pay for it)
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from itertools import repeat
from operator import attrgetter
from typing import Any, Generic, Protocol, TypeVar

from plugrt.context import BufferBase, DeviceInfo, DeviceState
from plugrt.dtype import DType, ImageDType, image_dtype
from plugrt.errors import EnvError, LaunchError, OutOfMemoryError, UnsupportedError
from plugrt.launchargs import NO_CALL, PreparedCall, Signature, WrappedBuffers, call_key, slot_packer

H = TypeVar("H")  # a backend's memory handle


class KernelLike(Protocol):
  """What this layer reads of a kernel (a plugrt.compiler.ir.Kernel): a device's program() checks and caches by these,
  and hands the kernel to its Compiler's render, which reads the rest."""
  name: str
  @property
  def signature(self) -> Signature: ...
  @property
  def images(self) -> tuple[Any, ...]: ...
  @property
  def shared_bytes(self) -> int: ...


def size_str(n: int) -> str:
  for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
    if n < 1024 or unit == "EiB": return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
    n /= 1024  # type: ignore[assignment]
  return f"{n} B"


def _cache_limit(env: Mapping[str, str]) -> int:
  v = env.get("PLUGRT_ALLOC_CACHE_MB", "")
  if not v: return 1 << 30
  try: mb = int(v)
  except ValueError:
    raise EnvError(f"PLUGRT_ALLOC_CACHE_MB={v!r} is not a whole number of MiB", "e.g. PLUGRT_ALLOC_CACHE_MB=256; 0 disables the cache") from None
  if mb < 0: raise EnvError(f"PLUGRT_ALLOC_CACHE_MB={v!r} is negative", "use 0 to disable the allocation cache")
  return mb << 20


_HANDLE = attrgetter("handle")  # a buffer's handle (at C speed, over a call's buffers)
_EXTERNAL = attrgetter("_external")  # whether a buffer wraps memory plugrt does not own (from_blob, DLPack)
_DEVICE_DTYPE = attrgetter("device", "dtype")
_BUFFER_BASE = repeat(BufferBase)  # (isinstance's second argument for map)


#: the largest allocation any device is asked for: 256 TiB, the user address space of a 48-bit machine. A size past it
#: (or past a backend's own max_alloc_bytes) is OutOfMemoryError before any allocator sees it, so no size type wraps.
MAX_ALLOC_BYTES = 1 << 48


def check_nbytes(nbytes: Any, what: str = "size") -> int:
  """`nbytes` as a byte count: an int (TypeError otherwise) that is not negative (ValueError)."""
  if not isinstance(nbytes, int) or isinstance(nbytes, bool): raise TypeError(f"{what} must be an int, not {type(nbytes).__name__}")
  if nbytes < 0: raise ValueError(f"{what} must not be negative, got {nbytes}")
  return nbytes


class Allocator(Generic[H]):
  """Device memory, with the core's cache of freed blocks (LRU, bounded by
  PLUGRT_ALLOC_CACHE_MB, default 1024). On out-of-memory the cache is emptied and the
  allocation retried once before OutOfMemoryError is raised. A size over max_alloc_bytes
  (default MAX_ALLOC_BYTES; a backend lowers it to what its size type or device holds) is
  OutOfMemoryError at once: no backend ever sees a size it would wrap.

  Backends implement _alloc/_free/_copyin/_copyout (_alloc raises MemoryError when the
  device is out of memory). The core also calls these, each declared below with what it
  does when a backend leaves it out:
    _offset (views; supports_offset)
    _transfer (between two devices of the backend; supports_transfer)
    _wrap (external memory, from_blob; supports_wrap)
    _copy (device to device on one device; NotImplemented: the core copies through the host)
    _host_alloc (Device.host_array's memory; None: plain host memory)
    dlpack_device and _pointer (DLPack export; None: not exportable)
    _wrap_image (external image memory, from_blob of an image dtype; supports_images and supports_wrap)

  Images (dtypes.imagef/imageh): a device with `supports_images` gets `options` = the ImageDType in _alloc, _free,
  and its _copyin/_copyout/_transfer handle such handles (the bytes are the (h, w, 4) texels, rows packed); its
  compiler renders TEXEL_LOAD/TEXEL_STORE. Elsewhere an image allocation or kernel is UnsupportedError.
  """
  supports_offset = True     # _offset makes views
  supports_transfer = False  # _transfer copies between two devices of this backend
  supports_wrap = False      # _wrap wraps external memory (from_blob)
  max_alloc_bytes = MAX_ALLOC_BYTES  # the largest size _alloc and _wrap are ever given
  supports_images = False    # image dtypes: _alloc gets options=the ImageDType (see the class docstring)
  max_image: tuple[int, int] | None = None  # the largest image (height, width) the device holds, where known

  def __init__(self, device: DeviceInfo):
    self.device = device
    self.cache_limit = _cache_limit(device.context.env)
    self._lru: OrderedDict[int, tuple[tuple[int, Any], H]] = OrderedDict()  # seq -> ((nbytes, options), handle), oldest first
    self._by_key: dict[tuple[int, Any], list[int]] = {}  # (nbytes, options) -> seqs of its cached blocks, oldest first
    self._seq = 0
    self._cached_bytes = 0
    self._lock = allocate_lock()  # guards the cache; never held while calling the backend
    self._pending: deque[tuple[H, int, Any]] = deque()  # frees not yet taken into the cache (see free)

  # ---- the core's API
  def alloc(self, nbytes: int, options: Any = None) -> H:
    if type(nbytes) is not int or nbytes < 0: check_nbytes(nbytes)
    if options is not None and isinstance(options, ImageDType): self.check_image(options)
    if nbytes > self.max_alloc_bytes:
      raise OutOfMemoryError(f"{self.device.canonical}: cannot allocate {size_str(nbytes)} ({nbytes} bytes): no allocation on this device "
                             f"can be larger than {size_str(self.max_alloc_bytes)}", "allocate less, or split the data")
    key = (nbytes, options)
    if self._pending: self._drain()
    self._lock.acquire()
    try:
      if (seqs := self._by_key.get(key)):
        _, h = self._lru.pop(seqs.pop())  # the most recently freed block of this size
        self._cached_bytes -= nbytes
        return h
    finally: self._release()
    try: return self._alloc(max(nbytes, 1), options)
    except MemoryError: pass
    freed = self.free_cache()
    try: return self._alloc(max(nbytes, 1), options)
    except MemoryError as e:
      raise OutOfMemoryError(f"{self.device.canonical}: out of memory allocating {size_str(nbytes)} "
                             f"(freed {size_str(freed)} of cached buffers and retried): {e}",
                             "free buffers you no longer need, or allocate less") from None

  def free(self, handle: H, nbytes: int, options: Any = None) -> None:
    # Buffers are freed from finalizers, which the garbage collector may run in the middle of this allocator's own
    # code on this thread, lock held: so a free is queued, and whoever holds the lock next takes the queue.
    self._pending.append((handle, nbytes, options))
    self._drain()

  def _drain(self) -> None:
    while self._pending:
      if not self._lock.acquire(blocking=False): return  # the holder drains once it lets go (see _release)
      give_back = []
      try:
        limit = self.cache_limit
        while self._pending:
          handle, nbytes, options = self._pending.popleft()
          if not limit or nbytes > limit:
            give_back.append((handle, (nbytes, options)))
            continue
          key, seq = (nbytes, options), self._seq + 1
          self._lru[seq] = (key, handle)
          if (seqs := self._by_key.get(key)) is None: self._by_key[key] = [seq]
          else: seqs.append(seq)
          self._seq, self._cached_bytes = seq, self._cached_bytes + nbytes
          while self._cached_bytes > limit:  # give back the least recently freed blocks
            seq, (k, h) = self._lru.popitem(last=False)
            self._by_key[k].remove(seq)
            self._cached_bytes -= k[0]
            give_back.append((h, k))
      finally: self._lock.release()
      for h, (sz, opts) in give_back: self._free(h, max(sz, 1), opts)

  def _release(self) -> None:
    self._lock.release()
    if self._pending: self._drain()

  def free_cache(self) -> int:
    """Give every cached block back to the device; returns the bytes freed."""
    self._drain()
    self._lock.acquire()
    try:
      blocks = list(self._lru.values())
      self._lru.clear(); self._by_key.clear()
      self._cached_bytes = 0
    finally: self._release()
    for (sz, opts), h in blocks: self._free(h, max(sz, 1), opts)
    return sum(sz for (sz, _), _ in blocks)

  def check_image(self, dtype: Any) -> None:
    """UnsupportedError where this device has no images, ImageError for an image larger than the device's largest."""
    if not self.supports_images:
      raise UnsupportedError(f"{self.device.canonical} has no image support: cannot hold {dtype!r}",
                             f"use an image device (CL, or PYTHON for the reference), or a plain buffer of {dtype.base.name} ({dtype.size} elements)")
    image_dtype(dtype.base, dtype.shape, self.max_image)  # raises ImageError past max_image

  def offset(self, handle: H, offset: int, nbytes: int) -> H:
    if not self.supports_offset: raise UnsupportedError(f"{self.device.canonical} cannot make buffer views", "copy the data instead")
    return self._offset(handle, offset, nbytes)

  def wrap(self, ptr: int, nbytes: int, image: Any = None) -> H:
    """A handle of the external memory at `ptr`; with `image` (an ImageDType), of the external image there."""
    check_nbytes(nbytes)
    if image is not None: self.check_image(image)
    if nbytes > self.max_alloc_bytes:  # no real memory is this large: a size that would wrap in the backend's size type
      raise ValueError(f"{self.device.canonical}: cannot wrap {nbytes} bytes: no memory on this device is larger than "
                       f"{size_str(self.max_alloc_bytes)}")
    if not self.supports_wrap:
      raise UnsupportedError(f"{self.device.canonical} cannot wrap external memory (from_blob); plugrt never copies silently",
                             "copy the data in with Buffer.copyin, or use a device whose allocator wraps memory")
    return self._wrap(ptr, nbytes) if image is None else self._wrap_image(ptr, nbytes, image)

  def dlpack_device(self) -> tuple[int, int] | None:
    """(DLPack device type, device id) of this memory, e.g. (1, 0) for host memory, (2, n) for CUDA; None: not exportable."""
    return None

  # ---- what a backend implements: these four always
  def _alloc(self, nbytes: int, options: Any) -> H:
    """A new block of at least `nbytes` (never 0: the core asks for 1 byte then); MemoryError when the device is full."""
    raise NotImplementedError
  def _free(self, handle: H, nbytes: int, options: Any) -> None:
    """Give a block back (`nbytes` and `options` as it was allocated with)."""
  def _copyin(self, dest: H, src: memoryview) -> None:
    """Host -> device: `src` (contiguous bytes, src.nbytes of them) into `dest`, after the work queued before it."""
    raise NotImplementedError
  def _copyout(self, dest: memoryview, src: H) -> None:
    """Device -> host: dest.nbytes bytes of `src` into `dest`, once the work queued before it is done."""
    raise NotImplementedError

  # ---- optional: what the core does without them is in each docstring
  def _offset(self, handle: H, offset: int, nbytes: int) -> H:
    """A view of `nbytes` at byte `offset` inside `handle` (Buffer.view); with supports_offset False, views are refused
    (UnsupportedError)."""
    raise NotImplementedError

  def _copy(self, dest: H, src: H, nbytes: int) -> Any:
    """Device to device on this one device: `nbytes` from `src` into `dest`, ordered with the work queued before it
    (Buffer.copy_to; two views of one buffer may overlap). Return NotImplemented (what this default does) to have the core copy
    through host memory (_copyout then _copyin); anything else means copied."""
    return NotImplemented

  def _transfer(self, dest: H, src: H, nbytes: int, src_dev: Any, dest_dev: Any) -> None:
    """With supports_transfer: `nbytes` from `src` on `src_dev` into `dest` on `dest_dev`, two opened devices of this
    backend (possibly the same one). Without it, the core uses _copy on one device and the host between two."""
    raise NotImplementedError

  def peer_path(self, dest_dev: Any) -> str:
    """How a copy from this device to `dest_dev` (another opened device of this backend) travels: "peer" when device
    to device with no host memory in between, else a sentence beginning "staged" that says how and why. The core warns
    (StagedCopyWarning) the first time a pair copies staged. Backends with a peer path override this."""
    if not self.supports_transfer: return "staged through host memory by plugrt (the backend has no device-to-device transfer)"
    return "the backend's transfer (it does not report whether through host memory)"

  def _wrap(self, ptr: int, nbytes: int) -> H:
    """With supports_wrap: a handle that is the external memory at `ptr` itself, both ways (Buffer.from_blob; see
    docs/authoring.md). Without it, from_blob raises UnsupportedError: plugrt never copies silently."""
    raise NotImplementedError

  def _wrap_image(self, ptr: int, nbytes: int, image: Any) -> H:
    """With supports_images and supports_wrap: the external image of dtype `image` at `ptr` (what `ptr` means is the
    backend's: host memory for a host device, a GPU address for QCOM). Without it, from_blob of an image is refused."""
    raise UnsupportedError(f"{self.device.canonical} cannot wrap an external image ({image!r})", "copy the data in with Buffer.copyin")

  def _host_alloc(self, nbytes: int) -> tuple[int, Any] | None:
    """Host memory this device copies from and to fastest (page-locked on a GPU), for Device.host_array: (address, a
    function of no arguments that frees it). None (this default): plain host memory is as good, and numpy's is used."""
    return None

  def _pointer(self, handle: H) -> int:
    """The address a DLPack consumer uses for this handle; called only when dlpack_device() is not None."""
    raise NotImplementedError


#: the most bytes of binaries one compiler keeps in memory (CPU kernels are about 5 KB: some 13000 of them)
MEMORY_CACHE_BYTES = 64 << 20


class Compiler:
  """Kernel IR -> source (render) -> binary (compile, through the disk cache).

  A compiler also keeps the binaries it compiled or read from the disk cache in this process, by source
  (at most MEMORY_CACHE_BYTES): the disk entry's sha256 is checked when it is first read, and a repeated
  compile() of the same source is a dictionary lookup. Subclasses set `name` and `cache_namespace`, and implement render(),
  compile_uncached() and toolchain(): the strings that decide the binary besides
  the source (toolchain version, target, arch). They go into the cache key.
  """
  name = "?"
  cache_namespace = ""
  #: the most bytes of shared arrays a group of this compiler's kernels may have (None: the compiler's own errors say);
  #: RuntimeDevice.program refuses a kernel past it (RenderError) before rendering: past it some drivers abort the process
  max_shared_bytes: int | None = None

  def __init__(self, device: DeviceInfo):
    self.device = device
    self._key_prefix: Any = None  # sha256 over the namespace and toolchain(), made at the first key
    from plugrt.cache import DiskCache, cache_enabled
    self._cache_enabled = cache_enabled  # kept: an import statement in compile_cached would cost every call
    self._env = device.context.env  # PLUGRT_CACHE, PLUGRT_CACHE_DIR, PLUGRT_CACHE_MAX_MB come from the device's context
    self._disk = DiskCache(self.cache_namespace, env=self._env) if self.cache_namespace else None
    # binaries this process compiled or read (and checked) from the disk cache, by source: a repeated compile() of one
    # source is a dict lookup, and the entry's hash is checked once per process, when it is first read
    self._memory: dict[str, bytes] = {}
    self._memory_bytes = 0
    import _thread
    self._memory_lock = _thread.allocate_lock()

  def render(self, kernel: KernelLike) -> str: raise NotImplementedError
  def compile_uncached(self, src: str) -> bytes: raise NotImplementedError
  def toolchain(self) -> tuple[str, ...]: raise NotImplementedError

  def cache_key(self, src: str) -> str:
    """plugrt.cache.cache_key(namespace, *toolchain(), src), with the hash of everything before `src` kept."""
    return self.cache_digest(src).hex()

  def cache_digest(self, src: str) -> bytes:
    """cache_key(src) as its 32 bytes (what the disk cache's index holds)."""
    if (h := self._key_prefix) is None:
      from plugrt.cache import key_hasher
      h = self._key_prefix = key_hasher(self.cache_namespace, *self.toolchain())
    h, b = h.copy(), src.encode()
    h.update(len(b).to_bytes(8, "little") + b)  # one update of both: the same bytes, one call fewer on every first hit
    return h.digest()

  def compile(self, src: str) -> bytes:
    """The binary of `src`, from the disk cache when it holds one."""
    return self.compile_cached(src)[0]

  def compile_cached(self, src: str) -> tuple[bytes, bool]:
    """(binary of `src`, whether it came from the disk cache). A binary from the cache that then fails
    to load is no reason to fail: the caller hands it to recompile()."""
    if self._disk is None or not self._cache_enabled(self._env): return self.compile_uncached(src), False
    if (lib := self._memory.get(src)) is not None: return lib, True
    digest = self.cache_digest(src)
    if (lib := self._disk.get_digest(digest)) is not None:
      self._remember(src, lib)
      return lib, True
    lib = self.compile_uncached(src)
    self._disk.put(digest.hex(), lib)
    self._remember(src, lib)
    return lib, False

  def _remember(self, src: str, lib: bytes) -> None:
    """Keep `src`'s binary in memory; past MEMORY_CACHE_BYTES the oldest binaries kept are dropped (the disk keeps them)."""
    memory = self._memory
    with self._memory_lock:  # hits read the dict without it: one dict operation is atomic
      if (old := memory.pop(src, None)) is not None: self._memory_bytes -= len(old)
      if len(lib) > MEMORY_CACHE_BYTES: return
      memory[src] = lib
      self._memory_bytes += len(lib)
      while self._memory_bytes > MEMORY_CACHE_BYTES and len(memory) > 1:
        gone = memory.pop(next(iter(memory)))
        self._memory_bytes -= len(gone)

  def drop_memory(self) -> None:
    """Forget the binaries kept in memory (the disk cache keeps them): the next compile() of each source reads and
    checks its entry again, as a new process's first would."""
    with self._memory_lock:
      self._memory.clear()
      self._memory_bytes = 0

  def forget(self, src: str) -> None:
    """Remove `src`'s binary from the disk cache (and from this process's memory of it)."""
    from plugrt.cache import cache_enabled
    with self._memory_lock:
      if (gone := self._memory.pop(src, None)) is not None: self._memory_bytes -= len(gone)
    if self._disk is not None and cache_enabled(self._env): self._disk.evict(self.cache_key(src))

  def recompile(self, src: str, error: BaseException) -> bytes:
    """`src`'s binary from the disk cache failed to load with `error`: evict the entry, compile again
    (and cache the new binary). A binary that fails to load when freshly compiled is a real error."""
    import warnings

    from plugrt.cache import cache_enabled
    self.forget(src)
    warnings.warn(f"plugrt: {self.name}: a cached binary failed to load ({type(error).__name__}: {error}); "
                  f"removed it from the compile cache and compiled again", stacklevel=3)
    lib = self.compile_uncached(src)
    if self._disk is not None and cache_enabled(self._env):
      self._disk.put(self.cache_key(src), lib)
      self._remember(src, lib)
    return lib


LaunchSize = Sequence[int]


def launch_dims(size: Any, what: str) -> tuple[int, int, int]:
  """Normalise a global/local size to 3 positive ints, or raise TypeError/ValueError."""
  if isinstance(size, int) and not isinstance(size, bool): size = (size,)
  if not isinstance(size, (tuple, list)) or not 1 <= len(size) <= 3 or \
     not all(isinstance(x, int) and not isinstance(x, bool) for x in size):
    raise TypeError(f"{what} must be 1 to 3 ints, got {size!r}")
  if min(size) < 1: raise ValueError(f"{what} must be positive, got {tuple(size)}")
  return tuple(size) + (1,) * (3 - len(size))  # type: ignore[return-value]


#: the IR's thread and group ids are int32: along each axis every id, and the axis's thread count, fit in it
INT32_MAX = (1 << 31) - 1
#: the most threads one launch may have on any device (every plugrt launch so far has been far below it)
MAX_LAUNCH_THREADS = (1 << 40) - 1


class LaunchLimits:
  """What one launch may ask of a device: groups per axis, threads per group per axis and in all, and threads in all.

  Every device keeps the IR's own bound on top: ids are int32, so along each axis
  num_groups * local_size (the global ids' range) is at most INT32_MAX. A backend sets
  a Program's `launch_limits` to its device's limits (CUDA's gridDim, WebGPU's
  maxComputeWorkgroupsPerDimension, OpenCL's work-group sizes); Program.check_args
  applies them, so a launch past them is a LaunchError before anything reaches native code.
  """
  __slots__ = ("device", "max_groups", "max_groups_total", "max_local", "max_local_total", "max_threads")

  def __init__(self, device: str, max_groups: Sequence[int] = (INT32_MAX,) * 3, max_local: Sequence[int] = (INT32_MAX,) * 3,
               max_local_total: int = INT32_MAX, max_threads: int = MAX_LAUNCH_THREADS, max_groups_total: int = MAX_LAUNCH_THREADS):
    self.device, self.max_groups_total = device, int(max_groups_total)
    self.max_groups = tuple(min(int(m), INT32_MAX) for m in max_groups)
    self.max_local = tuple(min(int(m), INT32_MAX) for m in max_local)
    self.max_local_total, self.max_threads = min(int(max_local_total), INT32_MAX), int(max_threads)

  def __repr__(self) -> str:
    return (f"LaunchLimits({self.device}: groups <= {self.max_groups} and {self.max_groups_total} in all, "
            f"local <= {self.max_local} and {self.max_local_total} in all, "
            f"threads <= {INT32_MAX} per axis and {self.max_threads} in all)")

  def check(self, program: str, gs: tuple[int, int, int], ls: tuple[int, int, int]) -> None:
    """Raise LaunchError naming the first limit that global_size `gs` x local_size `ls` passes."""
    (g0, g1, g2), (l0, l1, l2), (mg0, mg1, mg2), (ml0, ml1, ml2) = gs, ls, self.max_groups, self.max_local
    if g0 <= mg0 and g1 <= mg1 and g2 <= mg2 and l0 <= ml0 and l1 <= ml1 and l2 <= ml2 and g0 * l0 <= INT32_MAX and \
       g1 * l1 <= INT32_MAX and g2 * l2 <= INT32_MAX and (nl := l0 * l1 * l2) <= self.max_local_total and \
       (ng := g0 * g1 * g2) <= self.max_groups_total and ng * nl <= self.max_threads: return
    self._fail(program, gs, ls)

  def _fail(self, program: str, gs: tuple[int, int, int], ls: tuple[int, int, int]) -> None:
    where = f"program {program}: launch of global_size {gs} x local_size {ls}"
    for axis, (g, l, mg, ml) in enumerate(zip(gs, ls, self.max_groups, self.max_local)):
      if g > mg:
        raise LaunchError(f"{where} has {g} groups along axis {axis}; {self.device} runs at most {mg} groups per axis",
                          "use more threads per group, or spread the groups over more axes")
      if l > ml: raise LaunchError(f"{where} has {l} threads per group along axis {axis}; {self.device} allows at most {ml}",
                                   "use fewer threads per group and more groups")
      if g * l > INT32_MAX:
        raise LaunchError(f"{where} has {g * l} threads along axis {axis}; thread ids are int32, so {self.device} runs at most {INT32_MAX} "
                          "threads per axis",
                          "spread the work over more axes (global_size=(x, y, z)), or loop inside the kernel")
    if (n := ls[0] * ls[1] * ls[2]) > self.max_local_total:
      raise LaunchError(f"{where} has {n} threads per group; {self.device} allows at most {self.max_local_total}",
                        "use fewer threads per group and more groups")
    if (n := gs[0] * gs[1] * gs[2]) > self.max_groups_total:
      raise LaunchError(f"{where} has {n} groups; {self.device} runs at most {self.max_groups_total} in one launch",
                        "use more threads per group, or split the work into several launches")
    if (n := n * ls[0] * ls[1] * ls[2]) > self.max_threads:
      raise LaunchError(f"{where} has {n} threads; {self.device} runs at most {self.max_threads} in one launch",
                        "split the work into several launches")


class Program:
  """A compiled kernel on one device.

  ``prg(*bufs, global_size=(x,y,z), local_size=(x,y,z), vals=(...), wait=False)``
  runs it on `global_size` groups of `local_size` threads; with wait=True it waits
  and returns the run time in seconds. Arguments are checked before anything
  reaches native code: wrong counts or types raise TypeError, sizes past the device's
  `launch_limits` raise LaunchError (a ValueError).

  The launch protocol is the core's; a backend defines no __call__. A call that repeats the one prepared last (the same
  Buffers, the scalars compared exactly, the same sizes: plugrt.launchargs) submits what was prepared. A call with the
  last one's scalars and sizes and other buffers keeps what was checked and packed, and the backend puts the buffers in
  (_rebind). Any other call is checked (check_args), its scalars packed (scalar_packer) and encoded by the backend
  (_encode). The new prepared call replaces the last by one assignment, so threads may share a program.

  A backend implements
    _encode(bufs, scalars, global_size, local_size) -> PreparedCall: a new one, its `submit` set (the native argument
      block and how it is enqueued); the sizes are checked 3-tuples, the scalars packed;
  and where it has something better than the defaults:
    _rebind(last, bufs) -> PreparedCall: last's scalars and sizes with other buffers (default: _encode again);
    _timed(prepared) -> float: submit and wait, the launch's seconds (default: the host's clock around submit and the
      device's synchronize);
    scalar_packer: DType -> (value -> packed scalar), a class attribute (default launchargs.slot_packer).
  A backend whose encode or submit changes state that other launches share (arguments set on a driver's kernel
  object, a device's command slots) derives from LockedProgram instead.
  """
  scalar_packer: Callable[[DType], Callable[[Any], Any]] = staticmethod(slot_packer)
  #: set by a backend whose prepared calls each hold everything their submit sends (no state a later _encode changes, as
  #: CL's kernel arguments are): the program then also keeps the call before the last, by its buffers' handles and
  #: without the buffers, and submits it again for a call with the same scalars and sizes over that memory (a new result
  #: buffer per call, as Tensor's realize makes, alternates between two cached blocks while the last call holds one)
  self_contained = False
  _before: tuple[tuple, PreparedCall] | None = None  # (the buffers' handles, the call before the last without its buffers)

  def __init__(self, device: Any, name: str, lib: bytes, signature: Signature):
    self.device, self.name, self.lib, self.signature = device, name, lib, signature
    self.nbufs, self.nvals = len(signature.buffers), len(signature.scalars)
    #: what a launch may ask of the device; a backend with tighter limits replaces it (check_args applies it)
    self.launch_limits = LaunchLimits(str(device))
    self._packers = [self.scalar_packer(dt) for dt in signature.scalars]
    self._prepared: PreparedCall = NO_CALL
    self._buffer_slots = tuple([(device, dt) for dt in signature.buffers])  # what repeats_but_buffers asks of each buffer

  def __call__(self, *bufs: BufferBase, global_size: LaunchSize = (1, 1, 1), local_size: LaunchSize = (1, 1, 1),
               vals: Sequence[Any] = (), wait: bool = False) -> float | None:
    p = self._prepared  # read once: everything below uses this one prepared call
    if bufs != p.bufs or vals != p.vals or (global_size, local_size) != p.dims:  # see plugrt.launchargs
      held = p.bufs  # noqa: F841 (the last call's buffers: one that goes with them is freed once this launch is submitted, not before)
      p = self._prepared = self._prepare(p, bufs, vals, global_size, local_size)
    if wait: return self._timed(p)
    p.submit()
    return None

  def _prepare(self, last: PreparedCall, bufs: tuple, vals: Sequence[Any], global_size: Any, local_size: Any) -> PreparedCall:
    """A new prepared call for these arguments (`last`: the current one, which lends what it checked and packed when
    only the buffers changed)."""
    if self.repeats_but_buffers(last, bufs, vals, global_size, local_size):
      # (a call rebound from the last shares its vals and dims: then they are the call's, which repeats the last's)
      if (b := self._before) is not None and b[0] == tuple(map(_HANDLE, bufs)) and \
         ((b[1].vals is last.vals and b[1].dims is last.dims) or not (vals != b[1].vals or (global_size, local_size) != b[1].dims)):
        p = b[1]  # the call before the last, over the same memory: submitted as it was encoded
      else:
        p = self._rebind(last, bufs)
        p.vals, p.dims, p.scalars, p.sizes = last.vals, last.dims, last.scalars, last.sizes
    else:
      gs, ls = self.check_args(bufs, vals, global_size, local_size)
      scalars = tuple([pack(v) for pack, v in zip(self._packers, vals)])
      p = self._encode(bufs, scalars, gs, ls)
      p.vals, p.dims = call_key(vals, global_size, local_size)
      p.scalars, p.sizes = scalars, (gs, ls)
    p.bufs = WrappedBuffers(bufs) if any(map(_EXTERNAL, bufs)) else bufs  # (never keeps a caller's memory alive: see WrappedBuffers)
    if self.self_contained and last.bufs:
      if (held := last.bufs if type(last.bufs) is tuple else last.bufs.live()) is not None: self._before = (tuple(map(_HANDLE, held)), last)
      last.bufs = ()  # no longer the last call: its buffers go (it is kept by their handles)
    return p

  # ---- what a backend implements (see the class docstring)
  def _encode(self, bufs: tuple, scalars: tuple, global_size: tuple[int, int, int], local_size: tuple[int, int, int]) -> PreparedCall:
    raise NotImplementedError(f"{type(self).__name__} does not encode launches (a backend's Program implements _encode)")

  def _rebind(self, last: PreparedCall, bufs: tuple) -> PreparedCall:
    return self._encode(bufs, last.scalars, *last.sizes)

  def _timed(self, prepared: PreparedCall) -> float:
    st = time.perf_counter()
    prepared.submit()
    self.device.synchronize()
    return time.perf_counter() - st

  def _graph_step(self, launch: Launch) -> PreparedCall:
    """What a Graph submits to replay `launch`: a prepared call of its own (prepared calls never change once built); for
    a program written before the core owned the launch (its own __call__, no _encode), a call of the program."""
    if type(self)._encode is Program._encode:
      return PreparedCall(submit=partial(self, *launch.bufs, global_size=launch.global_size, local_size=launch.local_size, vals=launch.vals))
    return self._prepare(NO_CALL, launch.bufs, launch.vals, launch.global_size, launch.local_size)

  def repeats_but_buffers(self, last: Any, bufs: Sequence[Any], vals: Sequence[Any], global_size: Any, local_size: Any) -> bool:
    """Whether a call repeats the scalars and sizes of `last` (the PreparedCall a launch was made for) with other
    buffers, each a Buffer of this device and of its slot's dtype: a backend then keeps what it checked and packed for
    last and puts in the buffers alone (a kernel run on each new frame or tensor, each in memory of its own). Any other
    call answers False, and the backend prepares it in full, check_args raising what is wrong."""
    if not (vals == last.vals and (global_size, local_size) == last.dims and len(bufs) == self.nbufs): return False
    # each a BufferBase, then (its device, its dtype) against the slots' (this runs on every new buffer: map, at C speed; a
    # device and a DType compare by identity)
    return all(map(isinstance, bufs, _BUFFER_BASE)) and tuple(map(_DEVICE_DTYPE, bufs)) == self._buffer_slots

  def check_args(self, bufs: Sequence[Any], vals: Sequence[Any], global_size: Any, local_size: Any) \
      -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """The full argument check, with messages; backends call it when their fast check fails."""
    sig, name = self.signature, f"program {self.name}"
    if len(bufs) != self.nbufs:
      raise TypeError(f"{name} takes {self.nbufs} buffer(s) ({', '.join(d.name for d in sig.buffers) or 'none'}), got {len(bufs)}")
    for i, (b, dt) in enumerate(zip(bufs, sig.buffers)):
      if not isinstance(b, BufferBase): raise TypeError(f"program {self.name}: argument {i} must be a plugrt Buffer, not {type(b).__name__}")
      if b.device is not self.device:
        raise TypeError(f"{name} runs on {self.device}: argument {i} is a buffer on {b.device}; copy it with buf.to({str(self.device)!r})")
      if b.dtype is not dt:
        raise TypeError(f"{name}: argument {i} must be a buffer of {dt.name}, got {b.dtype.name}; use buf.view(dtype=...) to reinterpret")
    if not isinstance(vals, (tuple, list)): raise TypeError(f"program {self.name}: vals must be a tuple, not {type(vals).__name__}")
    if len(vals) != self.nvals:
      raise TypeError(f"{name} takes {self.nvals} scalar(s) in vals ({', '.join(d.name for d in sig.scalars) or 'none'}), got {len(vals)}")
    for i, (v, dt) in enumerate(zip(vals, sig.scalars)):
      ok = isinstance(v, (int, float)) if dt.kind == "f" else isinstance(v, bool) if dt.kind == "b" else \
        isinstance(v, int) and not isinstance(v, bool)
      if not ok: raise TypeError(f"program {self.name}: vals[{i}] must be a {dt.name}, got {v!r} ({type(v).__name__})")
      if dt.kind in "iu" and not dt.min <= v <= dt.max: raise ValueError(f"program {self.name}: vals[{i}]={v} does not fit {dt.name}")
    gs, ls = launch_dims(global_size, "global_size"), launch_dims(local_size, "local_size")
    self.launch_limits.check(self.name, gs, ls)
    return gs, ls


class LockedProgram(Program):
  """A Program whose encode or submit changes state that other launches share: the comparison with the last prepared
  call, the prepare, the submit and (with wait) the wait run under `launch_lock`, a lock of the program's own unless
  the backend sets a shared one (its device's) in its __init__. A Graph replays such a program launch by launch.
  A call that repeats the prepared one first tries the prepared call's `unlocked` submit where it has one (see
  PreparedCall), taking the lock only when that declines."""

  def __init__(self, device: Any, name: str, lib: bytes, signature: Signature):
    super().__init__(device, name, lib, signature)
    self.launch_lock: Any = allocate_lock()

  def __call__(self, *bufs: BufferBase, global_size: LaunchSize = (1, 1, 1), local_size: LaunchSize = (1, 1, 1),
               vals: Sequence[Any] = (), wait: bool = False) -> float | None:
    p = self._prepared
    if (unlocked := p.unlocked) is not None and not (wait or bufs != p.bufs or vals != p.vals or (global_size, local_size) != p.dims) \
       and unlocked(): return None
    with self.launch_lock:
      p = self._prepared
      if bufs != p.bufs or vals != p.vals or (global_size, local_size) != p.dims:  # see plugrt.launchargs
        held = p.bufs  # noqa: F841 (as in Program.__call__)
        p = self._prepared = self._prepare(p, bufs, vals, global_size, local_size)
      if wait: return self._timed(p)
      p.submit()
      return None

  def _graph_step(self, launch: Launch) -> PreparedCall:
    return PreparedCall(submit=partial(self, *launch.bufs, global_size=launch.global_size, local_size=launch.local_size, vals=launch.vals))


__all__ = ["Allocator", "Compiler", "DeviceState", "Graph", "Launch", "LaunchLimits", "LockedProgram", "Program", "check_nbytes",
           "launch_dims", "size_str"]


class Launch:
  """One launch of a program, with its arguments: a step of a Graph."""
  __slots__ = ("bufs", "global_size", "local_size", "program", "vals")

  def __init__(self, program: Program, bufs: Sequence[BufferBase], global_size: LaunchSize = (1, 1, 1), local_size: LaunchSize = (1, 1, 1),
               vals: Sequence[Any] = ()):
    self.program, self.bufs, self.vals = program, tuple(bufs), tuple(vals)
    self.global_size, self.local_size = program.check_args(self.bufs, self.vals, global_size, local_size)


class Graph:
  """A fixed batch of launches replayed as one: `graph(wait=False) -> seconds | None`.

  The arguments are checked, and each launch prepared, once, when the graph is made. A replay submits the launches in
  order (`_replay`); with wait=True, `_timed` replays and waits, returning seconds. A backend with a cheaper way to
  replay a batch (CUDA graphs, Metal's indirect command buffers) builds its own Graph through the plugrt_graph hook,
  overriding _replay and, where it has the device's own clock, _timed.
  """

  def __init__(self, device: Any, launches: Sequence[Launch]):
    self.device, self.launches = device, list(launches)
    for ln in self.launches:
      if ln.program.device is not device: raise TypeError(f"a graph of {device} got a program of {ln.program.device}")
    self._steps: list[PreparedCall] | None = None

  def __call__(self, wait: bool = False) -> float | None:
    if wait: return self._timed()
    self._replay()
    return None

  def _replay(self) -> None:
    if (steps := self._steps) is None: steps = self._steps = [ln.program._graph_step(ln) for ln in self.launches]
    for step in steps: step.submit()

  def _timed(self) -> float:
    st = time.perf_counter()
    self._replay()
    self.device.synchronize()
    return time.perf_counter() - st


def buffer_address(mv: memoryview) -> int:
  """The address of a contiguous host buffer (for drivers that copy from or to it)."""
  import ctypes
  if not mv.nbytes: return 0
  if not mv.readonly: return ctypes.addressof(ctypes.c_char.from_buffer(mv))
  import numpy as np  # ctypes cannot take the address of read-only memory (bytes); numpy can
  return int(np.frombuffer(mv, np.uint8).ctypes.data)
