"""The writing half of plugrt.cachepack: appends, slot writes, index rebuilds and compaction, all under the
namespace's flock; imported at a process's first write (or repair), so a process that only reads the cache
never loads it. The layout and the rules are in plugrt.cachepack's docstring."""
from __future__ import annotations

import errno
import hashlib
import os
from collections.abc import Callable, Iterator

from plugrt.cachepack import (
  _NO_OFFSET,
  _O,
  _RETIRED,
  _SLOT_TAIL,
  INDEX_HEAD,
  INDEX_MAGIC,
  MIN_SLOTS,
  PACK_HEAD,
  PACK_MAGIC,
  REC_HEAD,
  REC_MAGIC,
  SLOT,
  Pack,
  _align,
  _find,
  _map_pack,
  _minute,
  _View,
)


def locked(p: Pack) -> _Lock: return _Lock(p)


def _current(p: Pack) -> _View | None:
  """Under the lock: the mapped view if it is still the one at the path, else a fresh one (created if none)."""
  if (v := p._view) is not None and not p._replaced(v): return v
  if (v := p._map(under_lock=True)) is not None: return v
  _create(p)
  return p._map_plain()


def files_bytes(p: Pack) -> int:
  """The bytes of the namespace's pack, index and lock files as they are now (what counts against the cache's cap)."""
  total = 0
  for path in (p.pack_path, p.index_path, p.lock_path):
    try: total += os.stat(path, follow_symlinks=False).st_size
    except OSError: pass
  return total


def put(p: Pack, raw: bytes, payload: bytes) -> int:
  """Append key `raw`'s record and publish it; returns the bytes the namespace's files (pack, index: new, appended to or
  rebuilt larger) grew by (0: already there or not written)."""
  slot = int.from_bytes(raw[:8], "little")
  with locked(p) as ok:
    if not ok: return 0
    before = files_bytes(p)
    if (v := _current(p)) is None: return 0
    found = _find(v, raw, slot)
    if found is not None and found[2] and p._record(v, raw, found[1], found[2]) == payload: return 0
    size = os.fstat(v.pkfd).st_size
    off, rec = _align(size), record_bytes(raw, payload)
    os.pwrite(v.pkfd, rec, off)  # the record first; the slot that points at it after
    used = int.from_bytes(v.ix[28:32], "little")
    if found is not None: _write_slot(v, found[0], off, len(payload), _minute())
    elif (used + 1) * 2 > v.mask + 1:  # half full: a table twice the size, with this record in it
      slots = _slots(v)
      slots[raw] = (off, len(payload), _minute())
      _write_index(p, v.pack[0][16:24], slots, (v.mask + 1) * 2)
      p._map_plain()
    else:
      _write_slot(v, _free_slot(v, slot), off, len(payload), _minute(), raw)
      os.pwrite(v.ixfd, (used + 1).to_bytes(4, "little"), 28)
    return max(files_bytes(p) - before, 0)


def remove(p: Pack, raw: bytes) -> None:
  """Remove key `raw`'s slot (its binary failed to load); the record stays dead in the pack until a compaction."""
  slot = int.from_bytes(raw[:8], "little")
  with locked(p) as ok:
    if ok and (v := p._view if p._view is not None and not p._replaced(p._view) else p._map(under_lock=True)) \
       and (found := _find(v, raw, slot)) is not None and found[2]:
      _write_slot(v, found[0], found[1], 0, 0)


def _create(p: Pack) -> None:
  """A new empty pack and index (replacing whatever is there)."""
  pack_id = os.urandom(8)
  _replace(p, p.pack_path, PACK_MAGIC + pack_id)
  _write_index(p, pack_id, {}, MIN_SLOTS)


def _replace(p: Pack, path: str, data: bytes | bytearray) -> None:
  tmp = f"{path}.tmp-{os.getpid()}-{os.urandom(4).hex()}"
  fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O, 0o600)
  try:
    with os.fdopen(fd, "wb") as f: f.write(data)
    os.replace(tmp, path)
  except BaseException:
    try: os.unlink(tmp)
    except OSError: pass
    raise


def index_bytes(nkeys: int, nslots: int = MIN_SLOTS) -> int:
  """The size of an index written for `nkeys` keys (a table at most half full, of at least `nslots` slots)."""
  while nkeys * 2 > nslots: nslots *= 2
  return INDEX_HEAD + nslots * SLOT


def _write_index(p: Pack, pack_id: bytes, slots: dict[bytes, tuple[int, int, int]], nslots: int) -> None:
  while len(slots) * 2 > nslots: nslots *= 2
  table = bytearray(INDEX_HEAD + nslots * SLOT)
  table[:16], table[16:24] = INDEX_MAGIC, pack_id
  table[24:28], table[28:32] = nslots.to_bytes(4, "little"), len(slots).to_bytes(4, "little")
  mask = nslots - 1
  for raw, (off, n, used) in slots.items():
    i = int.from_bytes(raw[:8], "little") & mask
    while table[INDEX_HEAD + i * SLOT + 32:INDEX_HEAD + i * SLOT + 40] != _NO_OFFSET: i = (i + 1) & mask
    at = INDEX_HEAD + i * SLOT
    table[at:at + 32] = raw
    _SLOT_TAIL.pack_into(table, at + 32, off, n, used)
  retire(p, lambda: _replace(p, p.index_path, table))


def retire(p: Pack, replace: Callable[[], object] = lambda: None) -> None:
  """Run `replace` (which puts a new index at the path, or removes it), then mark the index that was there retired
  (its first byte): every process that still maps it sees that at its next lookup and maps the files anew, so no
  hit is served from a pack that was compacted or cleared away. Under the lock."""
  try: old = os.open(p.index_path, os.O_RDWR | _O)
  except OSError: old = -1
  try:
    replace()
    if old >= 0: os.pwrite(old, _RETIRED, 0)
  finally:
    if old >= 0: os.close(old)


def _rebuild(p: Pack) -> None:
  """The index again from the pack (under the lock): every good record, the last one of a key winning. A pack that
  is missing or unreadable starts empty."""
  p._view = None
  if (pkfd := p._open(p.pack_path)) is None:
    _create(p)
    return
  v = _View(-1, pkfd)  # closes pkfd when dropped
  try: good = os.pread(pkfd, 16, 0) == PACK_MAGIC and _map_pack(v, 0)
  except OSError: good = False
  if not good:
    _create(p)
    return
  now = _minute()
  slots = {raw: (off, n, now) for off, raw, n in records(p, v)}
  _write_index(p, v.pack[0][16:24], slots, MIN_SLOTS)


def records(p: Pack, v: _View) -> Iterator[tuple[int, bytes, int]]:
  """(offset, key, length) of every whole, correct record of a mapped pack, in order (a bad stretch is skipped)."""
  pk, size = v.pack
  pos = PACK_HEAD
  while pos + REC_HEAD <= size:
    if pk[pos:pos + 4] != REC_MAGIC:
      pos += 8
      continue
    n = int.from_bytes(pk[pos + 4:pos + 8], "little")
    raw = pk[pos + 40:pos + 72]
    if n > p._max_entry or pos + REC_HEAD + n > size or p._record(v, raw, pos, n) is None:
      pos += 8
      continue
    yield pos, raw, n
    pos = _align(pos + REC_HEAD + n)


def live(p: Pack) -> dict[bytes, tuple[int, int, int]]:
  """key -> (offset, length, last use in minutes) of the index's live slots, as mapped now ({} when none)."""
  if (v := p._view) is None or p._replaced(v): v = p._map()
  return _slots(v) if v is not None else {}


def compact(p: Pack, drop: set[bytes]) -> None:
  """Rewrite the pack without the records of `drop`, bad records and dead ones (under the lock; a new pack id)."""
  with locked(p) as ok:
    if not ok or (v := p._map(under_lock=True)) is None: return
    pack_id = os.urandom(8)
    out = bytearray(PACK_MAGIC + pack_id)
    slots: dict[bytes, tuple[int, int, int]] = {}
    for raw, (off, n, used) in _slots(v).items():
      if raw in drop or (payload := p._record(v, raw, off, n)) is None: continue
      out += bytes(_align(len(out)) - len(out))
      slots[raw] = (len(out), n, used)
      out += record_bytes(raw, payload)
    _replace(p, p.pack_path, out)  # pack first: a reader seeing it with the old index finds the ids differ
    _write_index(p, pack_id, slots, MIN_SLOTS)
    p._map_plain()


def record_bytes(raw: bytes, payload: bytes) -> bytes:
  """One pack record (without the padding to the next 8-byte boundary)."""
  return REC_MAGIC + len(payload).to_bytes(4, "little") + hashlib.sha256(raw + payload).digest() + raw + payload


def _free_slot(v: _View, slot: int) -> int:
  ix, mask, i = v.ix, v.mask, slot & v.mask
  while ix[INDEX_HEAD + i * SLOT + 32:INDEX_HEAD + i * SLOT + 40] != _NO_OFFSET: i = (i + 1) & mask
  return INDEX_HEAD + i * SLOT


def _write_slot(v: _View, at: int, off: int, n: int, used: int, raw: bytes | None = None) -> None:
  os.pwrite(v.ixfd, _SLOT_TAIL.pack(off, n, used), at + 32)  # the place before the key: see the module's docstring
  if raw is not None: os.pwrite(v.ixfd, raw, at)


def _slots(v: _View) -> dict[bytes, tuple[int, int, int]]:
  out: dict[bytes, tuple[int, int, int]] = {}
  ix = v.ix
  for at in range(INDEX_HEAD, len(ix), SLOT):
    off, n, used = _SLOT_TAIL.unpack_from(ix, at + 32)
    if off and n: out[ix[at:at + 32]] = (off, n, used)
  return out


class _Lock:
  """flock on the namespace's lock file; yields False when it cannot be taken or trusted."""

  def __init__(self, pack: Pack): self.pack, self.fd = pack, -1

  def __enter__(self) -> bool:
    import fcntl
    for _ in range(3):
      try: fd = os.open(self.pack.lock_path, os.O_RDWR | os.O_CREAT | _O, 0o600)
      except FileNotFoundError: raise  # the namespace directory is gone (plugrt cache clear): the caller makes it again
      except OSError as e:
        if e.errno != errno.ELOOP: return False
        self.pack._discard(self.pack.lock_path, "is a symbolic link")
        continue
      try:
        if (why := self.pack._untrusted(os.fstat(fd), False)) is not None:
          os.close(fd)
          self.pack._discard(self.pack.lock_path, why)
          continue
        fcntl.flock(fd, fcntl.LOCK_EX)
        st, now = os.fstat(fd), os.stat(self.pack.lock_path, follow_symlinks=False)
        if (st.st_dev, st.st_ino) == (now.st_dev, now.st_ino):
          self.fd = fd
          return True
      except OSError: pass
      os.close(fd)  # removed or replaced (plugrt cache clear) while we waited: take the new one
    return False

  def __exit__(self, *exc: object) -> None:
    if self.fd >= 0: os.close(self.fd)  # releases the flock
    self.fd = -1
