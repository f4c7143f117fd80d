"""The compile cache on disk: bytes in, bytes out, no pickle.

Layout: one pack per namespace (a compiler), <root>/<namespace>/pack, with its mmapped hash index
<root>/<namespace>/index (plugrt.cachepack): key -> (offset, length) of a record that holds the key, the
payload and the sha256 of both. The key is the sha256 of everything that decides the binary (toolchain
version, target, arch, source). A record is checked (its key, its sha256) when a process first reads it, and
the compiler keeps what passed in memory (plugrt.runtime.Compiler), so a record copied under another key,
torn, corrupted or pointed at by a damaged index is a miss (and is removed), never a wrong binary. The layout
before the pack, <root>/<namespace>/<key[:2]>/<key> with a magic line, the key, the sha256 and the payload in
one file, is still read (and each such entry moved into the pack at its first hit); where there is no flock
(Windows) it is also what is written (a temporary file renamed into place).

What is trusted: the root, the namespace directory, and the pack, index and lock files (or the old layout's
shard directory and entry) must each be owned by the current user and writable by nobody else before anything
is read from them; directories are checked with lstat (a symlink is refused), files through fstat of a
descriptor opened with O_NOFOLLOW|O_NONBLOCK (only regular files; an old-layout entry at most MAX_ENTRY bytes).
A root writable by group or others, or owned by someone else, turns the cache off (one warning): what is in it
may have been planted, so it is never tightened and then trusted. An untrusted namespace, file or entry is
removed (one warning per cache) and compiled again. See docs/reliability.md.

Size: entries are evicted least recently used first (a first hit in a process refreshes the entry's last use,
at most once a minute) once their total passes PLUGRT_CACHE_MAX_MB (default 1024), by compacting the packs. The
running total lives in <root>/.size, updated under flock by each put; only when it passes the cap does a put
scan the cache.

PLUGRT_CACHE=0 turns the cache off; PLUGRT_CACHE_DIR moves it (default:
$XDG_CACHE_HOME/plugrt or ~/.cache/plugrt).
"""
from __future__ import annotations

import errno
import hashlib
import os
import re
import stat
import time
import warnings
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from plugrt.errors import EnvError

if TYPE_CHECKING:
  from plugrt.cachepack import Pack

_MAGIC = b"plugrt-cache-v2\n"
_HEAD = len(_MAGIC) + 65 + 32  # magic line, key + "\n", sha256(key line + payload)
MAX_ENTRY = 256 << 20  # no binary comes near this: anything larger at an entry's path is not an entry
DEFAULT_MAX_MB = 1024
_SIZE_FILE = ".size"  # the running total of the entries' bytes, kept by put
_TOUCH_AFTER = 60.0  # seconds: a hit on an old-layout entry refreshes its mtime (its age for eviction) at most this often
_STALE_TMP = 3600.0  # seconds: a temporary file this old was left by a writer that died
_SEP = os.sep
_UID = os.getuid() if hasattr(os, "getuid") else None
_O_NOFOLLOW, _O_CLOEXEC = getattr(os, "O_NOFOLLOW", 0), getattr(os, "O_CLOEXEC", 0)
_O_READ = os.O_RDONLY | _O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0) | _O_CLOEXEC  # a FIFO opens at once, and is then refused
_warned_roots: set[str] = set()
# os.environ's own dict on POSIX (bytes -> bytes; os.environ[...] = ... and del keep it current): a read without
# os.environ's key encoding and its KeyError for an unset name; None where it is not that (then os.environ is read)
_ENVIRON_BYTES: dict | None = getattr(os.environ, "_data", None) if os.name == "posix" and os.supports_bytes_environ else None
if _ENVIRON_BYTES is not None and not all(type(k) is bytes for k in list(_ENVIRON_BYTES)[:1]): _ENVIRON_BYTES = None
try:
  import fcntl as _fcntl  # noqa: F401  (the pack's writers take an flock)
  _HAVE_FLOCK = True
except ImportError: _HAVE_FLOCK = False


def key_hasher(*parts: str | bytes) -> Any:
  """A sha256 object that has taken `parts` as cache_key does: a compiler keeps one over its namespace and toolchain,
  and a key is a copy of it that takes the source last (the same key; the prefix is not hashed again per source)."""
  h = hashlib.sha256()
  for p in parts:
    b = p.encode() if isinstance(p, str) else p
    h.update(len(b).to_bytes(8, "little"))
    h.update(b)
  return h


def cache_key(*parts: str | bytes) -> str:
  """sha256 over the parts, each length-prefixed so ("ab","c") and ("a","bc") differ."""
  return key_hasher(*parts).hexdigest()


def cache_enabled(env: Mapping[str, str] | None = None) -> bool:
  """PLUGRT_CACHE of `env` (a device's context.env; default the process environment)."""
  if (env is None or env is os.environ) and _ENVIRON_BYTES is not None:  # every compile() asks, and os.environ.get of an unset
    v = _ENVIRON_BYTES.get(b"PLUGRT_CACHE", b"1").decode(errors="replace")  # name raises and catches a KeyError inside
  else: v = (os.environ if env is None else env).get("PLUGRT_CACHE", "1")
  if v not in ("0", "1", ""): raise EnvError(f"PLUGRT_CACHE={v!r} is not 0 or 1", "set PLUGRT_CACHE=0 to turn the cache off, 1 (or unset) to use it")
  return v != "0"


def cache_dir(env: Mapping[str, str] | None = None) -> str:
  env = os.environ if env is None else env
  if d := env.get("PLUGRT_CACHE_DIR"): return os.path.abspath(os.path.expanduser(d))
  base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "plugrt")


def cache_max_bytes(env: Mapping[str, str] | None = None) -> int:
  """PLUGRT_CACHE_MAX_MB in bytes: the size past which least recently used entries are evicted."""
  v = (os.environ if env is None else env).get("PLUGRT_CACHE_MAX_MB", "")
  if not v: return DEFAULT_MAX_MB << 20
  try: mb = int(v)
  except ValueError:
    raise EnvError(f"PLUGRT_CACHE_MAX_MB={v!r} is not a whole number of MiB",
                   f"e.g. PLUGRT_CACHE_MAX_MB=512 (default {DEFAULT_MAX_MB}); PLUGRT_CACHE=0 turns the cache off") from None
  if mb < 1: raise EnvError(f"PLUGRT_CACHE_MAX_MB={v!r} is below 1 MiB", "give a size of at least 1; PLUGRT_CACHE=0 turns the cache off")
  return mb << 20


def _valid_namespace(name: str) -> bool: return bool(name) and name.replace("-", "").replace("_", "").isalnum() and name.isascii()


def _untrusted(st: os.stat_result, directory: bool) -> str | None:
  """Why what `st` describes cannot be trusted (another user could have written it), or None."""
  if directory and not stat.S_ISDIR(st.st_mode):
    return "is a symbolic link" if stat.S_ISLNK(st.st_mode) else "is not a directory"
  if not directory and not stat.S_ISREG(st.st_mode): return "is not a regular file"
  if _UID is None: return None  # no POSIX owners and modes here (Windows): nothing more to check
  if st.st_uid != _UID: return f"belongs to uid {st.st_uid}, not to you (uid {_UID})"
  if st.st_mode & 0o022: return f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
  return None


def _remove(path: str) -> bool:
  """Remove what is at `path` (file, link, FIFO, directory tree) without following links; False if it stays."""
  try: st = os.lstat(path)
  except FileNotFoundError: return True
  except OSError: return False
  try:
    if not stat.S_ISDIR(st.st_mode):
      os.unlink(path)
      return True
    # out of the way first (one rename), then the tree: a directory of another user may not empty
    aside = os.path.join(os.path.dirname(path), f".discarded-{os.getpid()}-{os.urandom(4).hex()}")
    os.rename(path, aside)
  except OSError: return False
  import shutil
  shutil.rmtree(aside, ignore_errors=True)
  return True


def _disabled(root: str, why: str, fix: str = "set PLUGRT_CACHE_DIR to a private directory of yours") -> None:
  """Warn, once per root, that the cache under it is off."""
  if root not in _warned_roots:
    _warned_roots.add(root)
    warnings.warn(f"plugrt: compile cache disabled: {why}; {fix}", stacklevel=5)


def open_root(root: str) -> bool:
  """Create the cache root 0700, or check an existing one: ours and writable by nobody else. Anything else turns the
  cache off, with one warning per root: someone else could have planted entries that pass every check. The mode of a
  directory plugrt did not create is never changed (a shared folder, or /usr for root): what plugrt keeps in it lives
  in namespace directories it makes 0700."""
  def refuse(why: str, fix: str = "set PLUGRT_CACHE_DIR to a private directory of yours") -> bool:
    _disabled(root, why, fix)
    return False
  try:
    try: st = os.stat(root)
    except FileNotFoundError:
      os.makedirs(root, mode=0o700, exist_ok=True)
      st = os.stat(root)
  except OSError as e: return refuse(f"cannot create {root}: {e}")
  if not stat.S_ISDIR(st.st_mode): return refuse(f"{root} is not a directory")
  if _UID is None: return True  # no POSIX owners and modes here (Windows)
  if st.st_uid != _UID: return refuse(f"{root} belongs to another user (uid {st.st_uid})")
  if st.st_mode & 0o022:
    return refuse(f"{root} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o}), so anything in it may have been planted",
                  f"remove it (rm -r {root}) or point PLUGRT_CACHE_DIR at a private directory")
  return True  # readable by others is no risk to what is read back, and its namespace directories are made 0700


def _pack(key: str, payload: bytes) -> bytes:
  head = key.encode() + b"\n"
  return _MAGIC + head + hashlib.sha256(head + payload).digest() + payload


def _unpack(data: bytes, key: str) -> tuple[bytes | None, str | None]:
  """(payload, None) for a good entry of `key`; else (None, why it is bad), why None for an older format."""
  n = len(_MAGIC)
  if data[:n] != _MAGIC: return None, None
  if len(data) < _HEAD or data[n + 64:n + 65] != b"\n": return None, "is truncated"
  if data[n:n + 64] != key.encode(): return None, "holds the entry of another key (copied or planted)"
  h = hashlib.sha256()
  mv = memoryview(data)
  h.update(mv[n:n + 65]); h.update(mv[_HEAD:])
  if h.digest() != data[n + 65:_HEAD]: return None, "is corrupt (its sha256 does not match)"
  return data[_HEAD:], None


class DiskCache:
  """One namespace (a compiler) of the cache."""

  def __init__(self, namespace: str, root: str | None = None, env: Mapping[str, str] | None = None):
    """`root` (default: PLUGRT_CACHE_DIR of `env`), `env`: where the settings are read (a device's context.env)."""
    if not _valid_namespace(namespace): raise ValueError(f"bad cache namespace {namespace!r}")
    self.namespace, self.root, self.env = namespace, root, env
    self._dir: str | None = None
    self._root = ""
    self._checked: set[str] = set()  # directories found ours and closed to others (nobody else can change that)
    self._warned = False
    self._pack: Pack | bool | None = None  # the namespace's pack (None: not looked at yet; False: none)
    self._ready: Pack | None = None  # the pack, once its directory was found ours (nobody else can change that)

  def _base(self) -> str | None:
    """The namespace's directory, or None when the cache root cannot be trusted."""
    if self._dir is None:
      root = self.root or cache_dir(self.env)
      cache_max_bytes(self.env)  # a bad PLUGRT_CACHE_MAX_MB fails the first compile, not only the first miss
      self._root = root
      self._dir = os.path.join(root, self.namespace) if open_root(root) else ""
    return self._dir or None

  def path(self, key: str) -> str:
    base = self._base()
    return os.path.join(base, key[:2], key) if base else ""

  def _discard(self, path: str, why: str | None) -> None:
    if path: _remove(path)
    if why and not self._warned:
      self._warned = True
      warnings.warn(f"plugrt: compile cache: {path + ' ' if path else ''}{why}; removed it (further ones are removed silently)",
                    stacklevel=4)

  def _dir_ok(self, path: str, create: bool) -> bool:
    """Whether directory `path` is ours and closed to others; an untrusted one is discarded (and made again when create)."""
    if path in self._checked: return True
    for _ in range(3):
      try: st = os.lstat(path)
      except FileNotFoundError:
        if not create: return False
        try: os.mkdir(path, 0o700)
        except FileExistsError: pass
        except OSError as e:
          _disabled(self._root, f"cannot create {path}: {e.strerror or e}")
          return False
        continue
      except OSError: return False
      if (why := _untrusted(st, True)) is None:
        self._checked.add(path)
        return True
      self._discard(path, why)
      if not create: return False
    return False

  def _packed(self) -> Pack | None:
    """The namespace's pack and index (plugrt.cachepack), or None where the cache is off or has no flock (Windows)."""
    if self._pack is None:
      base = self._base()
      if base and _HAVE_FLOCK:
        from plugrt.cachepack import Pack
        self._pack = Pack(base, _untrusted, self._discard, MAX_ENTRY, _writer)
      else: self._pack = False
    return self._pack or None

  def get(self, key: str) -> bytes | None:
    if (pack := self._ready) is not None and len(key) == 64:  # the namespace's directory was found ours once
      try:
        if (payload := pack.get(bytes.fromhex(key))) is not None: return payload
      except (OSError, ValueError): pass  # ValueError: not hex
    return self._get_slow(key)

  def get_digest(self, digest: bytes) -> bytes | None:
    """get(digest.hex()), without the hex: Compiler.compile_cached's path."""
    if (pack := self._ready) is not None and len(digest) == 32:
      try:
        if (payload := pack.get(digest)) is not None: return payload
      except OSError: pass
    return self._get_slow(digest.hex())

  def _get_slow(self, key: str) -> bytes | None:
    """A miss in the pack (or the first lookup): the pack once its directory is checked, then the old layout."""
    if (pack := self._pack) is None: pack = self._packed()
    if pack and self._ready is None and self._dir_ok(pack.dir, False):
      self._ready = pack
      try:
        if len(key) == 64 and (payload := pack.get(bytes.fromhex(key))) is not None: return payload
      except (OSError, ValueError): pass
    if not _valid_key(key): return None
    if (payload := self._get_file(key)) is not None and pack:  # an entry of the layout before the pack: moved into it
      self.put(key, payload)
      grown = len(_pack(key, payload))
      if _remove(self.path(key)): self._account(-grown)
    return payload

  def _get_file(self, key: str) -> bytes | None:
    """An entry of the one-file-per-key layout (plugrt before the pack, or where there is no flock)."""
    if not (base := self._base()): return None
    shard = f"{base}{_SEP}{key[:2]}"  # os.path.join's result, without its cost
    if shard not in self._checked and not (self._dir_ok(base, False) and self._dir_ok(shard, False)): return None
    path = f"{shard}{_SEP}{key}"
    try: fd = os.open(path, _O_READ)
    except OSError as e:
      if e.errno == errno.ELOOP: self._discard(path, "is a symbolic link")
      return None
    try:
      st = os.fstat(fd)
      if (why := _untrusted(st, False)) is None and st.st_size > MAX_ENTRY: why = f"is {st.st_size} bytes, more than any entry"
      if why is not None:
        self._discard(path, why)
        return None
      data = os.read(fd, st.st_size + 1)
      payload, why = _unpack(data, key)
      if payload is None: self._discard(path, why)
      elif time.time() - st.st_mtime > _TOUCH_AFTER:
        try: os.utime(fd)  # recently used: evicted last
        except OSError: pass
      return payload
    except OSError: return None
    finally: os.close(fd)

  def evict(self, key: str) -> None:
    """Remove key's entry (its binary failed to load)."""
    if not _valid_key(key): return
    if (pack := self._packed()) and os.path.isdir(pack.dir):
      try: pack.remove(bytes.fromhex(key))
      except OSError: pass
    if path := self.path(key): _remove(path)

  def put(self, key: str, payload: bytes) -> None:
    if not (base := self._base()) or not _valid_key(key): return
    if len(payload) + 200 > min(MAX_ENTRY, cache_max_bytes(self.env)): return  # more than the cache may hold: not kept
    if pack := self._packed():
      if base not in self._checked and not self._dir_ok(base, True): return
      try: grown = pack.put(bytes.fromhex(key), payload)
      except FileNotFoundError:  # the namespace was removed since this process checked it (plugrt cache clear)
        self._checked.discard(base)
        if not self._dir_ok(base, True): return
        try: grown = pack.put(bytes.fromhex(key), payload)
        except OSError: return
      except OSError: return  # a cache that cannot be written is only slower, never an error
      if grown: self._account(grown)
      return
    self._put_file(key, payload)

  def _put_file(self, key: str, payload: bytes) -> None:
    """One file per key (where there is no flock for the pack)."""
    base = self._base() or ""
    entry = _pack(key, payload)
    shard = os.path.join(base, key[:2])
    import tempfile
    for _ in range(2):
      if shard not in self._checked and not (self._dir_ok(base, True) and self._dir_ok(shard, True)): return
      try:
        fd, tmp = tempfile.mkstemp(dir=shard, prefix=".tmp-")  # O_EXCL, 0600
        break
      except FileNotFoundError:  # removed since this process checked it (plugrt cache clear): check and make it again
        self._checked.difference_update((base, shard))
      except OSError: return
    else: return
    try:
      try:
        with os.fdopen(fd, "wb") as f: f.write(entry)
        os.replace(tmp, os.path.join(shard, key))
      except BaseException:
        os.unlink(tmp)
        raise
    except OSError: return
    self._account(len(entry))

  def _account(self, nbytes: int) -> None:
    """Add nbytes to the running total; past the cap, evict least recently used entries to 7/8 of it."""
    try:
      import fcntl
    except ImportError: return
    try: fd = os.open(os.path.join(self._root, _SIZE_FILE), os.O_RDWR | os.O_CREAT | _O_NOFOLLOW | _O_CLOEXEC, 0o600)
    except OSError: return
    try:
      if _untrusted(os.fstat(fd), False): return
      fcntl.flock(fd, fcntl.LOCK_EX)  # one writer of the total at a time; released by close
      try:
        held = int(os.pread(fd, 32, 0))
        total: int | None = held - len(str(held)) + nbytes  # the other files' bytes (the total counts its own file too)
      except ValueError: total = None  # new or unreadable: count once
      cap = cache_max_bytes(self.env)
      if total is None or total > cap: total = evict_to(self._root, cap * 7 // 8 if total is not None else cap)
      os.ftruncate(fd, 0)
      os.pwrite(fd, str(_with_own_digits(total)).encode(), 0)
    except OSError: pass
    finally: os.close(fd)


_KEY = re.compile("[0-9a-f]{64}")


def _valid_key(key: str) -> bool: return isinstance(key, str) and _KEY.fullmatch(key) is not None


class Entry(NamedTuple):
  """One entry file of the layout before the pack (<root>/<namespace>/<key[:2]>/<key>)."""
  namespace: str
  path: str
  size: int
  mtime: float


def scan(root: str, namespace: str | None = None) -> Iterator[Entry]:
  """Every old-layout entry file under root (of one namespace; the packs are _packs'), in trusted directories only;
  stale temporaries and directories set aside earlier are removed on the way."""
  now = time.time()
  try: names = sorted(os.listdir(root))
  except OSError: return
  for ns in names:
    p = os.path.join(root, ns)
    if ns.startswith(".discarded-"): _remove(p)
    if not _valid_namespace(ns) or (namespace is not None and ns != namespace): continue
    try:
      if _untrusted(os.lstat(p), True): continue
      shards = os.listdir(p)
    except OSError: continue
    for sh in shards:
      sp = os.path.join(p, sh)
      if ".tmp-" in sh:  # a pack or index being replaced by a writer that died
        try:
          if now - os.lstat(sp).st_mtime > _STALE_TMP: _remove(sp)
        except OSError: pass
        continue
      try:
        if len(sh) != 2 or _untrusted(os.lstat(sp), True): continue
        with os.scandir(sp) as it: files = list(it)
      except OSError: continue
      for f in files:
        try: st = f.stat(follow_symlinks=False)
        except OSError: continue
        if f.name.startswith(".tmp-"):
          if now - st.st_mtime > _STALE_TMP: _remove(f.path)
          continue
        if stat.S_ISREG(st.st_mode): yield Entry(ns, f.path, st.st_size, st.st_mtime)


def _packs(root: str, namespace: str | None = None) -> Iterator[tuple[str, Pack, dict[bytes, tuple[int, int, int]], int]]:
  """(namespace, pack, its live slots, the bytes of its files: pack, index and lock) for each trusted namespace
  directory that holds a pack."""
  if not _HAVE_FLOCK: return
  from plugrt.cachepack import Pack
  try: names = sorted(os.listdir(root))
  except OSError: return
  for ns in names:
    if not _valid_namespace(ns) or (namespace is not None and ns != namespace): continue
    d = os.path.join(root, ns)
    try:
      if _untrusted(os.lstat(d), True) or not os.path.lexists(os.path.join(d, "pack")): continue
      pack = Pack(d, _untrusted, lambda path, why: _remove(path) if path else None, MAX_ENTRY, _writer)
      live = pack.live()
      yield ns, pack, live, pack.files_bytes()
    except OSError: continue


def _writer() -> Any:
  """The pack's writing half (appends, rebuilds, compaction, the lock), imported at a process's first write or repair
  (for its import cost: a process that only reads never loads it)."""
  from plugrt import cachepack_write
  return cachepack_write


def evict_to(root: str, target: int) -> int:
  """Remove least recently used entries until at most `target` bytes remain; returns the bytes that remain (every file
  but the running total's). Entries in a pack are dropped by compacting it (which also drops its dead records), and a
  namespace none of whose entries stays goes whole."""
  from plugrt.cachepack import PACK_HEAD, REC_HEAD
  index_bytes = _writer().index_bytes
  aged: list[tuple[float, int, Any]] = [(e.mtime, e.size, e.path) for e in scan(root)]
  packs = list(_packs(root))
  for _, pack, live, _ in packs:
    aged += [(used * 60.0, (REC_HEAD + n + 7) & ~7, (pack, raw)) for raw, (_, n, used) in live.items()]
  # what remains once every pack is compacted: its records, its header and an index for what it holds now (at most)
  total = sum(a[1] for a in aged) + sum(PACK_HEAD + index_bytes(len(live)) for _, _, live, _ in packs)
  drop: dict[Any, set[bytes]] = {}
  for _, size, what in sorted(aged, key=lambda a: a[0]):
    if total <= target: break
    if isinstance(what, str):
      if _remove(what): total -= size
    else:
      gone = drop.setdefault(what[0], set())
      gone.add(what[1])
      total -= size
  for ns, pack, live, size in packs:
    if len(drop.get(pack, ())) == len(live) and live:  # nothing of it stays: the namespace goes, index and all
      _retire(root, ns, pack)
    elif pack in drop or size > PACK_HEAD + index_bytes(len(live)) + sum((REC_HEAD + n + 7) & ~7 for _, n, _ in live.values()):
      try: pack.compact(drop.get(pack, set()))
      except OSError: pass
  return sum(e.size for e in scan(root)) + sum(size for *_, size in _packs(root))


def _with_own_digits(n: int) -> int:
  """n bytes of other files plus the running total's file, which holds this number in decimal."""
  t = n + len(str(n))
  return n + len(str(t))


def _retire(root: str, namespace: str, pack: Pack) -> None:
  """Remove a namespace's pack and index: processes that map them stop serving from them, then its directory goes."""
  try:
    with pack.locked() as ok:
      if ok: pack.retire(lambda: os.unlink(pack.index_path))
  except OSError: pass
  _remove(os.path.join(root, namespace))


def info(root: str | None = None) -> dict:
  """What the cache holds: its directory, whether it is usable, the cap, entries and bytes in all and per namespace."""
  root = root or cache_dir()
  per: dict[str, dict[str, int]] = {}
  usable = os.path.isdir(root) and open_root(root)
  for e in scan(root) if usable else ():
    d = per.setdefault(e.namespace, {"entries": 0, "bytes": 0})
    d["entries"] += 1
    d["bytes"] += e.size
  for ns, _, live, size in _packs(root) if usable else ():
    d = per.setdefault(ns, {"entries": 0, "bytes": 0})
    d["entries"] += len(live)
    d["bytes"] += size
  return {"dir": root, "usable": usable, "enabled": cache_enabled(), "max_bytes": cache_max_bytes(),
          "entries": sum(d["entries"] for d in per.values()), "bytes": sum(d["bytes"] for d in per.values()), "namespaces": per}


def clear(namespace: str | None = None, root: str | None = None) -> tuple[int, int]:
  """Remove every entry (of one namespace); returns (entries, bytes) removed."""
  root = root or cache_dir()
  if namespace is not None and not _valid_namespace(namespace): raise ValueError(f"bad cache namespace {namespace!r}")
  if not os.path.isdir(root): return 0, 0
  entries = list(scan(root, namespace))
  removed = [e for e in entries if _remove(e.path)]
  packed = []
  for ns, pack, live, size in _packs(root, namespace):
    packed.append((len(live), size))
    _retire(root, ns, pack)
  names = [namespace] if namespace else [n for n in os.listdir(root) if _valid_namespace(n)]
  for ns in names: _remove(os.path.join(root, ns))  # the directories too (and anything untrusted in them)
  if namespace is None: _remove(os.path.join(root, _SIZE_FILE))
  else:  # the total is recounted by the next put
    try: os.unlink(os.path.join(root, _SIZE_FILE))
    except OSError: pass
  return len(removed) + sum(n for n, _ in packed), sum(e.size for e in removed) + sum(b for _, b in packed)
