"""One namespace of the compile cache as one append-only pack file and one mmapped hash index (issue 17).

Files in <root>/<namespace>/ (each owned by this user and writable by nobody else, checked once per process):
  pack    16-byte magic, 8-byte pack id, then records, each at an 8-byte boundary:
          b"PRC1", payload length (u32 LE), sha256(key + payload), key (32 raw bytes), payload
  index   16-byte magic, the id of the pack it describes, slot count (u32, a power of two), used slots (u32), then an
          open-addressing table (linear probing) of 48-byte slots: key (32 bytes), record offset (u64; 0: an empty
          slot), payload length (u32; 0: removed), last use (u32, minutes since the epoch; for eviction)
  lock    flock'ed by every writer (appends, slot writes, rebuilds), never by a reader's hit

A reader maps both files once (at its first lookup) and then finds a key with a few slices of the index map: no
system call on a hit. Every record is checked when this process first reads it (its key, and the sha256 of key
and payload over the length the slot gives), so a slot pointing at the wrong place, a torn or unflushed append
after a crash, or a flipped byte is a miss, never a wrong binary; the caller keeps what passed in memory (Compiler._memory), so no record is
hashed twice in a process. A failed check is taken again under the lock (a writer may have been half-way through
that slot); if it still fails, the slot is removed and the kernel compiled again.

Writers append the record first and publish it after: the slot's offset and length are written before its key,
so a reader that sees the key sees a finished record (or, for a slot being reused, fails the check and waits for
the lock). The index is replaced by a new file (renamed into place) when it is half full, when it is unreadable,
truncated or describes another pack (rebuilt from the pack, whose records carry their own keys and hashes), and
when eviction compacts the pack (a new pack and index, the pack renamed first: a reader that sees the new pack with
the old index finds the ids differ and looks again under the lock). The writer then marks the old index retired
(its first byte), and every reader checks that byte at each lookup, so no process serves hits from a pack that was
compacted or cleared away. Nothing is fsync'ed: a crash can lose recent entries or leave garbage at the end of the
pack, both of which the checks above turn into misses.

This module is the reading half; the writing half (appends, rebuilds, compaction, the lock) is
plugrt.cachepack_write, which builds on this one: plugrt.cache hands each Pack a function that imports it, called at a
process's first write or repair.
"""
from __future__ import annotations

import errno
import hashlib
import mmap
import os
import struct
from collections.abc import Callable
from hashlib import sha256 as _sha256
from time import time as _time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
  from contextlib import AbstractContextManager

PACK_MAGIC = b"plugrt-pack-v1\n\0"
INDEX_MAGIC = b"plugrt-index-v1\n"
PACK_HEAD = 24  # magic, pack id
INDEX_HEAD = 32  # magic, pack id, slot count, used slots
REC_MAGIC = b"PRC1"
REC_HEAD = 72  # magic, length, key, sha256
SLOT = 48
MIN_SLOTS = 1024
_LIVE, _RETIRED = INDEX_MAGIC[0], b"R"  # the first byte of an index that a writer replaced
_NO_OFFSET = bytes(8)  # a slot whose offset is 0 is empty (records start after the pack's header)
_SLOT_TAIL = struct.Struct("<QII")  # offset, length, last use
_U64 = struct.Struct("<Q")  # a key's first 8 bytes: its home slot
_O = os.O_NOFOLLOW | os.O_CLOEXEC | getattr(os, "O_NONBLOCK", 0)

Untrusted = Callable[[os.stat_result, bool], "str | None"]  # why a file cannot be trusted, or None
Discard = Callable[[str, "str | None"], None]  # remove a file, warning why


def _align(n: int) -> int: return (n + 7) & ~7
def _minute() -> int: return int(_time()) // 60


class _View:
  """The index and pack as one process mapped them: replaced whole (never changed under a reader) when a file is
  rebuilt; descriptors close when the last reader lets go of it."""
  __slots__ = ("ix", "ixfd", "mask", "ino", "pack", "pkfd", "__weakref__")

  def __init__(self, ixfd: int, pkfd: int):
    self.ixfd, self.pkfd = ixfd, pkfd
    self.ix: Any = None  # read-only shared map of the index: sees writers' slot writes at once
    self.mask = 0
    self.ino: tuple[int, int] | None = None  # (device, inode) of the mapped index: a rebuild replaces the file
    self.pack: tuple[Any, int] = (None, 0)  # (map of the pack, its length when mapped): remapped when a record lies beyond

  def __del__(self) -> None:
    for fd in (self.ixfd, self.pkfd):
      try: os.close(fd)
      except OSError: pass


_NO_VIEW = _View(-1, -1)


class Pack:
  """The pack and index of one namespace directory. Threads of a process share it: each reader works on the view
  it read once; writers (threads or processes) are serialised by the flock (each takes its own open file)."""

  def __init__(self, directory: str, untrusted: Untrusted, discard: Discard, max_entry: int, writer: Callable[[], Any]):
    """writer: returns the writing half (plugrt.cachepack_write), which this module, below it, does not import; the
    cache hands it over so that a process that only reads never loads it."""
    self.dir = directory
    self.pack_path, self.index_path, self.lock_path = (os.path.join(directory, n) for n in ("pack", "index", "lock"))
    self._untrusted, self._discard, self._max_entry, self._writer = untrusted, discard, max_entry, writer
    self._view: _View | None = None

  # ------------------------------------------------------------------ reading

  def get(self, raw: bytes) -> bytes | None:
    """The payload of key `raw` (32 bytes), checked; None for a miss. (One frame: a process's first hit of each
    kernel comes here, and tinygrad's is one sqlite SELECT; every step below counts.)"""
    if (v := self._view) is None and (v := self._map()) is None: return None
    ix = v.ix
    if ix[0] != _LIVE:  # retired: a writer replaced this index (rebuilt, compacted, cleared); map what is there now
      if (v := self._map()) is None: return None
      ix = v.ix
    slot = _U64.unpack_from(raw)[0]
    at = INDEX_HEAD + (slot & v.mask) * SLOT
    if ix[at:at + 32] != raw:  # not in its home slot (the common case is): probe on, open addressing
      if (found := _find(v, raw, slot)) is None:  # not in this index: was it replaced (rebuilt, compacted, cleared) since?
        if not self._replaced(v) or (v := self._map()) is None or (found := _find(v, raw, slot)) is None: return None
      at = found[0]
    off, n, used = _SLOT_TAIL.unpack_from(v.ix, at + 32)
    if not n: return None  # removed
    end = off + REC_HEAD + n
    pk, pklen = v.pack
    if end > pklen:
      if not _map_pack(v, end): return self._recheck(raw, slot)
      pk = v.pack[0]
    rec = pk[off:end]  # one copy; the sha256 covers key and payload, which lie side by side (length and magic add nothing)
    if rec[40:72] != raw or _sha256(rec[40:]).digest() != rec[8:40]: return self._recheck(raw, slot)
    if (now := int(_time()) // 60) - used > 1:
      try: os.pwrite(v.ixfd, now.to_bytes(4, "little"), at + 44)  # last use, for eviction; a racing writer only loses a touch
      except OSError: pass
    return rec[REC_HEAD:]

  def _record(self, v: _View, raw: bytes, off: int, n: int) -> bytes | None:
    """The payload of the record at `off` if it is whole, key `raw`'s, n bytes, and matches its sha256."""
    end = off + REC_HEAD + n
    pk, pklen = v.pack
    if end > pklen:
      if not _map_pack(v, end): return None
      pk = v.pack[0]
    rec = pk[off:end]
    if rec[40:72] != raw or hashlib.sha256(memoryview(rec)[40:]).digest() != rec[8:40]: return None
    return rec[REC_HEAD:]

  def _recheck(self, raw: bytes, slot: int) -> bytes | None:
    """A record failed its check: look again under the lock (a writer may have been writing that slot); if it still
    fails, remove the slot (the caller compiles again and appends a good record)."""
    with self.locked() as ok:
      if not ok or (v := self._map(under_lock=True)) is None or (found := _find(v, raw, slot)) is None or not found[2]: return None
      at, off, n, _ = found
      if (payload := self._record(v, raw, off, n)) is not None: return payload
      self._writer()._write_slot(v, at, off, 0, 0)  # removed (the offset stays: an offset of 0 would end other keys' probes here)
      pk = v.pack[0]
      other = off + REC_HEAD <= v.pack[1] and pk[off:off + 4] == REC_MAGIC and pk[off + 40:off + 72] != raw
    self._discard("", f"the index slot of key {raw.hex()[:16]}... in {self.dir} "
                      + ("points at the record of another key" if other else "points at a corrupt or truncated record"))
    return None

  # ------------------------------------------------------------------ mapping

  def _open(self, path: str) -> int | None:
    """A descriptor of our regular file at `path` (O_NOFOLLOW); an untrusted file is discarded; None if absent."""
    try: fd = os.open(path, os.O_RDWR | _O)
    except FileNotFoundError: return None
    except OSError as e:
      try:
        if e.errno not in (errno.EACCES, errno.EPERM, errno.EROFS): raise
        fd = os.open(path, os.O_RDONLY | _O)  # ours but read-only (a read-only mount, a chmod): read, never touched
      except OSError as e2:
        if e2.errno == errno.ELOOP: self._discard(path, "is a symbolic link")
        return None
    try: why = self._untrusted(os.fstat(fd), False)
    except OSError as e: why = str(e)
    if why is not None:
      os.close(fd)
      self._discard(path, why)
      return None
    return fd

  def _map_plain(self) -> _View | None:
    """Map the index and pack as they are now, if they are consistent (else None and nothing mapped)."""
    self._view = None
    if (ixfd := self._open(self.index_path)) is None: return None
    if (pkfd := self._open(self.pack_path)) is None:
      os.close(ixfd)
      return None
    v = _View(ixfd, pkfd)
    try:
      st = os.fstat(ixfd)
      head, pack_head = os.pread(ixfd, INDEX_HEAD, 0), os.pread(pkfd, PACK_HEAD, 0)
      nslots = int.from_bytes(head[24:28], "little") if len(head) == INDEX_HEAD else 0
      if not (head[:16] == INDEX_MAGIC and pack_head[:16] == PACK_MAGIC and head[16:24] == pack_head[16:24] and nslots >= 1
              and nslots & (nslots - 1) == 0 and st.st_size == INDEX_HEAD + nslots * SLOT): return None
      v.ix = mmap.mmap(ixfd, 0, access=mmap.ACCESS_READ)
      v.ino, v.mask = (st.st_dev, st.st_ino), nslots - 1
      if not _map_pack(v, 0): return None
    except (OSError, ValueError): return None
    self._view = v
    return v

  def _map(self, under_lock: bool = False) -> _View | None:
    """Map the index and pack. An index that is unreadable, truncated or describes another pack is rebuilt from the
    pack under the lock (first looked at again there: a writer may have been between its two renames)."""
    if (v := self._map_plain()) is not None: return v
    if not os.path.lexists(self.index_path) and not os.path.lexists(self.pack_path): return None  # nothing written yet
    if under_lock:
      self._writer()._rebuild(self)
      return self._map_plain()
    with self.locked() as ok:
      if not ok: return None
      if (v := self._map_plain()) is not None: return v
      self._writer()._rebuild(self)
      return self._map_plain()

  def _replaced(self, v: _View) -> bool:
    """Whether the index at the path is another file than the one mapped (rebuilt, compacted, cleared, or new)."""
    try: st = os.stat(self.index_path, follow_symlinks=False)
    except OSError: return v.ino is not None
    return (st.st_dev, st.st_ino) != v.ino

  # ------------------------------------------------------------------ writing (plugrt.cachepack_write: imported at the first write)

  def locked(self) -> AbstractContextManager[bool]: return self._writer().locked(self)  # as ok: whether the flock was taken
  def put(self, raw: bytes, payload: bytes) -> int: return self._writer().put(self, raw, payload)
  def remove(self, raw: bytes) -> None: self._writer().remove(self, raw)
  def retire(self, replace: Callable[[], object] = lambda: None) -> None: self._writer().retire(self, replace)
  def live(self) -> dict[bytes, tuple[int, int, int]]: return self._writer().live(self)
  def compact(self, drop: set[bytes]) -> None: self._writer().compact(self, drop)
  def files_bytes(self) -> int: return self._writer().files_bytes(self)


def _find(v: _View, raw: bytes, slot: int) -> tuple[int, int, int, int] | None:
  """(slot position, offset, length, last use) of key `raw` in the view's index, or None."""
  ix, mask = v.ix, v.mask
  i = slot & mask
  for _ in range(mask + 1):  # a corrupted table full of keys still ends
    at = INDEX_HEAD + i * SLOT
    if ix[at:at + 32] == raw: return (at, *_SLOT_TAIL.unpack_from(ix, at + 32))
    if ix[at + 32:at + 40] == _NO_OFFSET: return None
    i = (i + 1) & mask
  return None


def _map_pack(v: _View, need: int) -> bool:
  """Map the view's pack at its current length; False if it is shorter than `need` (truncated) or than its header."""
  try:
    size = os.fstat(v.pkfd).st_size
    if size < max(need, PACK_HEAD): return False
    v.pack = (mmap.mmap(v.pkfd, size, access=mmap.ACCESS_READ), size)  # the old map closes when no reader holds it
    return True
  except (OSError, ValueError): return False
