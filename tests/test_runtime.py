"""Runtime objects: the disk cache, the caching allocator, compilers' cache keys, buffers."""
import os
import stat
import threading

import numpy as np
import pytest

from plugrt import Buffer, Device, dtypes
from plugrt.cache import DiskCache, cache_key
from plugrt.compiler.samples import tiny_kernel
from plugrt.errors import CompileError, EnvError, OutOfMemoryError
from plugrt.hookspecs import DeviceInfo
from plugrt.runtime import Allocator, Compiler, launch_dims

# ---------------------------------------------------------------- disk cache

def test_cache_dir_is_private_and_entries_roundtrip(tmp_path, monkeypatch):
  root = tmp_path / "c"
  monkeypatch.setenv("PLUGRT_CACHE_DIR", str(root))
  dc = DiskCache("unit")
  assert dc.get("ab" * 32) is None
  dc.put("ab" * 32, b"payload")
  assert dc.get("ab" * 32) == b"payload"
  assert stat.S_IMODE(os.stat(root).st_mode) == 0o700
  files = sorted(p.name for p in (root / "unit").rglob("*") if p.is_file())
  assert files == ["index", "lock", "pack"]  # one pack and its index per namespace (plugrt.cachepack)
  assert (root / "unit" / "pack").read_bytes().startswith(b"plugrt-pack-v1\n") and b"payload" in (root / "unit" / "pack").read_bytes()
  assert not [p for p in root.rglob(".tmp-*")]  # no temporary left behind


def test_cache_leaves_a_readable_dir_as_it_is(tmp_path, monkeypatch):
  """A root of ours that others may read but not write is used without changing its mode (issue 32, item 11)."""
  root = tmp_path / "loose"
  root.mkdir(mode=0o755)
  os.chmod(root, 0o755)
  monkeypatch.setenv("PLUGRT_CACHE_DIR", str(root))
  DiskCache("unit").put("cd" * 32, b"x")
  assert stat.S_IMODE(os.stat(root).st_mode) == 0o755 and DiskCache("unit").get("cd" * 32) == b"x"


def test_cache_refuses_a_dir_of_another_user(tmp_path, monkeypatch):
  monkeypatch.setenv("PLUGRT_CACHE_DIR", str(tmp_path))
  real_stat = os.stat
  class Foreign:  # what os.stat says of a directory another user owns
    def __init__(self, st): self.st_mode, self.st_uid = st.st_mode, os.getuid() + 1
  monkeypatch.setattr(os, "stat", lambda p, *a, **k: Foreign(real_stat(p)) if str(p) == str(tmp_path) else real_stat(p, *a, **k))
  dc = DiskCache("unit")
  with pytest.warns(UserWarning, match="belongs to another user"): dc.put("12" * 32, b"x")
  assert dc.get("12" * 32) is None and not any(tmp_path.iterdir())


def test_corrupt_entry_is_a_miss_and_is_removed(tmp_path, monkeypatch):
  monkeypatch.setenv("PLUGRT_CACHE_DIR", str(tmp_path))
  dc = DiskCache("unit")
  key = "ef" * 32
  dc.put(key, b"good bytes")
  path = tmp_path / "unit" / "pack"
  data = bytearray(path.read_bytes())
  data[-1] ^= 0xFF
  path.write_bytes(bytes(data))
  with pytest.warns(UserWarning, match="corrupt"): assert dc.get(key) is None
  assert DiskCache("unit").get(key) is None  # the slot was removed: a miss everywhere, silently


def test_key_separates_parts():
  assert cache_key("ab", "c") != cache_key("a", "bc")
  assert cache_key("x", "y") == cache_key("x", "y")


class CountingCompiler(Compiler):
  name, cache_namespace = "COUNT", "unit-count"
  def __init__(self, device, version="1"):
    super().__init__(device)
    self.version, self.calls = version, 0
  def toolchain(self): return (f"count-{self.version}", "target", "arch")
  def compile_uncached(self, src):
    self.calls += 1
    if "bad" in src: raise CompileError("bad source")
    return src.upper().encode()


def test_a_compilers_key_is_the_cache_key_of_its_namespace_toolchain_and_source():
  from plugrt.cache import cache_key
  a, newer = CountingCompiler(DeviceInfo("UNIT", 0, "COUNT")), CountingCompiler(DeviceInfo("UNIT", 0, "COUNT"), "2")
  for src in ("src", "src2", "", "é" * 300):  # the kept prefix hash is copied, never extended: keys do not leak into each other
    assert a.cache_key(src) == cache_key("unit-count", "count-1", "target", "arch", src)
    assert newer.cache_key(src) == cache_key("unit-count", "count-2", "target", "arch", src) != a.cache_key(src)
  assert a.cache_key("src") == cache_key("unit-count", "count-1", "target", "arch", "src")  # the same after other keys


def test_compiler_cache_keys_include_the_toolchain(tmp_path, monkeypatch):
  monkeypatch.setenv("PLUGRT_CACHE_DIR", str(tmp_path))
  info = DeviceInfo("UNIT", 0, "COUNT")
  a = CountingCompiler(info)
  assert a.compile("src") == b"SRC" and a.compile("src") == b"SRC" and a.calls == 1
  assert CountingCompiler(info).compile("src") == b"SRC"  # another instance: a disk hit
  newer = CountingCompiler(info, "2")
  newer.compile("src")
  assert newer.calls == 1  # a new toolchain version never reuses an old binary
  with pytest.raises(CompileError): a.compile("bad")
  with pytest.raises(CompileError): a.compile("bad")  # failures are not cached
  monkeypatch.setenv("PLUGRT_CACHE", "0")
  c = CountingCompiler(info)
  c.compile("other"); c.compile("other")
  assert c.calls == 2
  monkeypatch.setenv("PLUGRT_CACHE", "maybe")
  with pytest.raises(EnvError, match="PLUGRT_CACHE"): c.compile("x")


def test_cpu_compile_uses_the_cache(tmp_path, monkeypatch):
  monkeypatch.setenv("PLUGRT_CACHE_DIR", str(tmp_path))
  comp = Device["CPU"].compiler_for("CLANG")
  comp._disk = DiskCache(comp.cache_namespace)
  src = comp.render(tiny_kernel("cache_probe"))
  lib = comp.compile(src)
  assert lib[:4] == b"\x7fELF" and list(tmp_path.rglob("*"))
  assert comp.compile(src) == lib


def _reads(comp, monkeypatch):
  """Count the compiler's disk-cache reads."""
  reads = []
  real = comp._disk.get_digest
  monkeypatch.setattr(comp._disk, "get_digest", lambda key: reads.append(key) or real(key))
  return reads


def test_a_repeated_compile_is_served_from_memory_and_checked_once(tmp_path, monkeypatch):
  monkeypatch.setenv("PLUGRT_CACHE_DIR", str(tmp_path))
  info = DeviceInfo("UNIT", 0, "COUNT")
  CountingCompiler(info).compile("src")  # another process's compile: the entry is on disk
  a = CountingCompiler(info)
  reads = _reads(a, monkeypatch)
  assert a.compile_cached("src") == (b"SRC", True) and len(reads) == 1  # first read: from disk, its sha256 checked
  assert a.compile_cached("src") == (b"SRC", True) and len(reads) == 1  # then from memory: no read, no hash
  assert a.compile("new") == b"NEW" and a.compile("new") == b"NEW" and a.calls == 1 and len(reads) == 2  # compiled once, kept
  a.forget("src")  # forgetting drops the memory too: the next compile is a real one
  assert a.compile_cached("src") == (b"SRC", False) and a.calls == 2
  monkeypatch.setenv("PLUGRT_CACHE", "0")  # the cache switched off later: memory is not served either
  assert a.compile_cached("new") == (b"NEW", False) and a.calls == 3


def test_an_entry_corrupted_after_another_process_loaded_it_is_never_served(tmp_path, monkeypatch):
  """Process A read (and checked) the entry; then the file is damaged. A keeps serving the bytes it checked; every
  other process (a new compiler: nothing in its memory) checks the file at its first read, finds it bad, removes
  it and compiles again. The memory never holds bytes that were not checked or compiled."""
  monkeypatch.setenv("PLUGRT_CACHE_DIR", str(tmp_path))
  info = DeviceInfo("UNIT", 0, "COUNT")
  CountingCompiler(info).compile("src")
  a = CountingCompiler(info)
  assert a.compile("src") == b"SRC" and a.calls == 0
  entry = tmp_path / "unit-count" / "pack"
  data = bytearray(entry.read_bytes())
  data[-1] ^= 0xFF
  entry.write_bytes(bytes(data))
  assert a.compile("src") == b"SRC" and a.calls == 0  # A: from memory, the bytes checked when it read them
  b = CountingCompiler(info)
  with pytest.warns(UserWarning, match="corrupt"): assert b.compile("src") == b"SRC"
  assert b.calls == 1 and entry.read_bytes()[-3:] == b"SRC"  # removed, compiled again, written back whole


def test_memory_is_bounded_and_drops_the_oldest(tmp_path, monkeypatch):
  import plugrt.runtime as R
  monkeypatch.setenv("PLUGRT_CACHE_DIR", str(tmp_path))
  monkeypatch.setattr(R, "MEMORY_CACHE_BYTES", 10)
  a = CountingCompiler(DeviceInfo("UNIT", 0, "COUNT"))
  for src in ("aaaa", "bbbb", "cccc"): a.compile(src)
  assert list(a._memory) == ["bbbb", "cccc"] and a._memory_bytes == 8  # full: the oldest went
  a.compile("x" * 11)  # larger than the whole memory: compiled and on disk, not kept
  assert list(a._memory) == ["bbbb", "cccc"]
  reads = _reads(a, monkeypatch)
  assert a.compile("aaaa") == b"AAAA" and reads and a.calls == 4  # dropped from memory: read from disk again, not recompiled
  assert list(a._memory) == ["cccc", "aaaa"] and a._memory_bytes == 8
  a.drop_memory()
  assert not a._memory and a._memory_bytes == 0
  assert a.compile("cccc") == b"CCCC" and len(reads) == 2 and a.calls == 4  # read (and checked) again, not recompiled


def test_threads_compiling_the_same_sources_get_whole_binaries(tmp_path, monkeypatch):
  import plugrt.runtime as R
  monkeypatch.setenv("PLUGRT_CACHE_DIR", str(tmp_path))
  monkeypatch.setattr(R, "MEMORY_CACHE_BYTES", 4000)  # small: threads also drop and re-read entries
  a = CountingCompiler(DeviceInfo("UNIT", 0, "COUNT"))
  srcs = [f"kernel {i} " * 40 for i in range(30)]
  errors = []
  def work(seed):
    try:
      for i in range(300):
        src = srcs[(i * seed) % len(srcs)]
        assert a.compile(src) == src.upper().encode()
    except Exception as e: errors.append(e)
  threads = [threading.Thread(target=work, args=(s,)) for s in (1, 7, 11, 13)]
  for t in threads: t.start()
  for t in threads: t.join()
  assert not errors
  assert a._memory_bytes == sum(map(len, a._memory.values())) <= 4000


# ---------------------------------------------------------------- allocator

class FakeAllocator(Allocator[int]):
  def __init__(self, capacity: int):
    super().__init__(DeviceInfo("FAKE", 0, ""))
    self.capacity, self.used, self.next, self.freed = capacity, 0, 1, []
  def _alloc(self, nbytes, options):
    if self.used + nbytes > self.capacity: raise MemoryError("device full")
    self.used += nbytes
    self.next += 1
    return self.next
  def _free(self, handle, nbytes, options):
    self.used -= nbytes
    self.freed.append(handle)


def test_allocator_reuses_freed_blocks():
  a = FakeAllocator(1000)
  h = a.alloc(100)
  a.free(h, 100)
  assert a.alloc(100) == h and a.freed == []
  assert a.alloc(50) != h


def test_allocator_frees_its_cache_and_retries_once():
  a = FakeAllocator(1000)
  blocks = [a.alloc(300) for _ in range(3)]
  for h in blocks: a.free(h, 300)  # 900 bytes cached
  big = a.alloc(800)  # only fits once the cache is given back
  assert big and sorted(a.freed) == sorted(blocks)
  with pytest.raises(OutOfMemoryError, match=r"FAKE: out of memory allocating 500 B") as e: a.alloc(500)
  assert isinstance(e.value, MemoryError) and "free buffers" in str(e.value)


def test_allocator_cache_is_bounded(monkeypatch):
  monkeypatch.setenv("PLUGRT_ALLOC_CACHE_MB", "1")
  a = FakeAllocator(10 << 20)
  hs = [a.alloc(400 << 10) for _ in range(4)]
  for h in hs: a.free(h, 400 << 10)
  assert a._cached_bytes <= 1 << 20 and a.freed == hs[:2]  # least recently freed go first
  monkeypatch.setenv("PLUGRT_ALLOC_CACHE_MB", "lots")
  with pytest.raises(EnvError, match="PLUGRT_ALLOC_CACHE_MB"): FakeAllocator(1)


def test_allocator_rejects_bad_sizes():
  a = FakeAllocator(10)
  with pytest.raises(ValueError, match="negative"): a.alloc(-1)
  with pytest.raises(TypeError): a.alloc(1.5)  # type: ignore[arg-type]


def test_allocator_is_thread_safe():
  a = FakeAllocator(1 << 30)
  def churn():
    for _ in range(500): a.free(a.alloc(64), 64)
  ts = [threading.Thread(target=churn) for _ in range(4)]
  for t in ts: t.start()
  for t in ts: t.join()
  assert a.used == a._cached_bytes and len(a._lru) == len(set(h for _, h in a._lru.values()))  # no block cached twice


def test_allocator_declares_what_the_core_calls_and_its_defaults():
  """Every optional method the core calls is declared on Allocator, with the default the core expects."""
  a = FakeAllocator(10)
  assert a._copy(1, 2, 8) is NotImplemented and a._host_alloc(64) is None and a.dlpack_device() is None
  for name in ("_offset", "_transfer", "_wrap", "_pointer"): assert callable(getattr(Allocator, name))


def test_copy_to_on_one_device_uses_copy_or_the_host(monkeypatch):
  """Buffer.copy_to on one device: the allocator's _copy when it has one, else (NotImplemented) through host memory."""
  dev = Device["PYTHON"]
  calls: list[str] = []
  src = Buffer.from_numpy(np.arange(8, dtype=np.float32), dev)
  kind = type(dev.allocator)
  real_copy, real_out = kind._copy, kind._copyout
  monkeypatch.setattr(kind, "_copy", lambda self, d, s, n: calls.append("copy") or real_copy(self, d, s, n))
  monkeypatch.setattr(kind, "_copyout", lambda self, d, s: calls.append("copyout") or real_out(self, d, s))
  dest = src.copy_to(Buffer(dev, 8, dtypes.float32))
  assert calls == ["copy"] and dest.numpy().tolist() == list(range(8))
  monkeypatch.setattr(kind, "_copy", Allocator._copy)  # a backend without a device copy
  calls.clear()
  dest = src.copy_to(Buffer(dev, 8, dtypes.float32))
  assert calls == ["copyout"] and dest.numpy().tolist() == list(range(8))


# ---------------------------------------------------------------- buffers and launch sizes

def test_launch_dims():
  assert launch_dims(4, "g") == (4, 1, 1) and launch_dims((2, 3), "g") == (2, 3, 1)
  for bad in ((1, 2, 3, 4), (1.0,), "x", (True,)):
    with pytest.raises(TypeError): launch_dims(bad, "g")
  with pytest.raises(ValueError): launch_dims((0,), "g")


def test_buffer_accepts_memoryviews_and_checks_formats():
  buf = Buffer("CPU", 4, dtypes.int32)
  buf.copyin(memoryview(np.arange(4, dtype=np.int32)))
  import array
  buf.copyin(array.array("i", [5, 6, 7, 8]))
  assert buf.numpy().tolist() == [5, 6, 7, 8]
  with pytest.raises(TypeError, match="'f'"): buf.copyin(array.array("f", [1, 2, 3, 4]))
  with pytest.raises(ValueError, match="not contiguous"): buf.copyin(np.arange(8, dtype=np.int32)[::2])
  assert repr(buf).startswith("<Buffer CPU 4xint32")
  assert Buffer.from_numpy(np.array([[1, 2], [3, 4]], np.uint16)).dtype is dtypes.uint16


def test_buffers_return_memory_to_the_cache():
  dev = Device["CPU"]
  dev.allocator.free_cache()  # a block of this size left by an earlier test would be reused (and not counted twice)
  before = dev.allocator._cached_bytes
  b = Buffer(dev, 1000, dtypes.float64)
  handle = b.handle
  del b
  assert dev.allocator._cached_bytes == before + 8000
  assert Buffer(dev, 1000, dtypes.float64).handle == handle


def test_a_free_while_the_allocator_is_busy_is_queued():
  """The collector runs Buffer finalizers wherever it likes, also inside the allocator's own code on this thread with
  its lock held: such a free must neither wait for that lock (a deadlock) nor touch the cache half-updated."""
  a = Device["CPU"].allocator
  h = a.alloc(4096)
  done = threading.Event()

  def free_while_locked():
    a._lock.acquire()  # as if this thread were inside alloc() when a finalizer ran
    try: a.free(h, 4096)
    finally: a._release()
    done.set()
  t = threading.Thread(target=free_while_locked, daemon=True)
  t.start()
  t.join(10)
  assert done.is_set(), "free() waited for the allocator lock its own thread holds"
  assert not a._pending  # taken once the lock was let go
  if a.cache_limit: assert a.alloc(4096) == h  # and in the cache
