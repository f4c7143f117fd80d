"""The compile cache on disk: bytes in, bytes out, no pickle.

Layout: <dir>/<namespace>/<key[:2]>/<key>, where key is the sha256 of everything that
decides the binary (toolchain version, target, arch, source). A file holds a magic
line, the sha256 of its payload, then the payload; a read checks both, so a torn or
corrupted entry is a miss (and is removed), never a wrong binary. Writes go to a
temporary file in the same directory and are renamed into place, so readers see an
entry whole or not at all. The directory is created 0700 for the current user.

PLUGRT_CACHE=0 turns the cache off; PLUGRT_CACHE_DIR moves it (default:
$XDG_CACHE_HOME/plugrt or ~/.cache/plugrt).
"""
from __future__ import annotations

import hashlib
import os
import stat
import warnings

from plugrt.errors import EnvError

_MAGIC = b"plugrt-cache-v1\n"


def cache_key(*parts: str | bytes) -> str:
  """sha256 over the parts, each length-prefixed so ("ab","c") and ("a","bc") differ."""
  h = hashlib.sha256()
  for p in parts:
    b = p.encode() if isinstance(p, str) else p
    h.update(len(b).to_bytes(8, "little"))
    h.update(b)
  return h.hexdigest()


def cache_enabled() -> bool:
  v = os.environ.get("PLUGRT_CACHE", "1")
  if v not in ("0", "1", ""): raise EnvError(f"PLUGRT_CACHE={v!r} is not 0 or 1", "set PLUGRT_CACHE=0 to turn the cache off, 1 (or unset) to use it")
  return v != "0"


def cache_dir() -> str:
  if d := os.environ.get("PLUGRT_CACHE_DIR"): return os.path.abspath(os.path.expanduser(d))
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "plugrt")


class DiskCache:
  """One namespace (a compiler) of the cache."""

  def __init__(self, namespace: str, root: str | None = None):
    if not namespace.replace("-", "").replace("_", "").isalnum(): raise ValueError(f"bad cache namespace {namespace!r}")
    self.namespace, self.root = namespace, root
    self._dir: str | None = None

  def _base(self) -> str | None:
    """The namespace's directory, or None when the cache directory cannot be trusted."""
    if self._dir is None:
      root = self.root or cache_dir()
      self._dir = os.path.join(root, self.namespace) if _make_private_dir(root) else ""
    return self._dir or None

  def path(self, key: str) -> str:
    base = self._base()
    return os.path.join(base, key[:2], key) if base else ""

  def get(self, key: str) -> bytes | None:
    if not (path := self.path(key)): return None
    try:
      with open(path, "rb") as f: data = f.read()
    except OSError: return None
    n = len(_MAGIC)
    if data[:n] == _MAGIC and len(data) >= n + 32 and hashlib.sha256(data[n + 32:]).digest() == data[n:n + 32]: return data[n + 32:]
    try: os.unlink(path)  # corrupt or from another format: drop it, the caller recompiles
    except OSError: pass
    return None

  def put(self, key: str, payload: bytes) -> None:
    if not (path := self.path(key)): return
    import tempfile
    d = os.path.dirname(path)
    try:
      os.makedirs(d, mode=0o700, exist_ok=True)
      fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-")
      try:
        with os.fdopen(fd, "wb") as f: f.write(_MAGIC + hashlib.sha256(payload).digest() + payload)
        os.replace(tmp, os.path.join(d, key))
      except BaseException:
        os.unlink(tmp)
        raise
    except OSError: pass  # a cache that cannot be written is only slower, never an error


def _make_private_dir(path: str) -> bool:
  """Create the cache root 0700; tighten it if it is ours but open to others. A root owned by
  someone else is refused: they could plant binaries that pass the hash check."""
  try:
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.stat(path)
  except OSError as e:
    warnings.warn(f"plugrt: compile cache disabled: cannot create {path}: {e}", stacklevel=3)
    return False
  if hasattr(os, "getuid") and st.st_uid != os.getuid():
    warnings.warn(f"plugrt: compile cache disabled: {path} belongs to another user (set PLUGRT_CACHE_DIR to a directory of yours)",
                  stacklevel=3)
    return False
  if stat.S_IMODE(st.st_mode) & 0o077: os.chmod(path, 0o700)
  return True
