"""The compile cache under attack (issue 19): planted binaries, entries swapped between keys, entries that do
not load, FIFOs and huge files at entry paths, unusable roots, and its growth.

Every test uses its own cache root. Runs that load a cached binary go through a subprocess (the worker
below): on a broken cache they die (SIGSEGV, an abort in PoCL) or hang (a FIFO), and a planted shared
object runs its constructor in whatever process loads it. The worker compiles and runs kernel `adv`
(out[0] = x[0] + 3, or * 3 for "mul"), on x = 5: 8 is the right answer for "add", 15 says the binary of
"mul" ran in its place.
"""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from plugrt import Device, dtypes
from plugrt.cache import DiskCache
from plugrt.compiler.ir import Kernel, KernelBuilder
from plugrt.errors import EnvError

TARGETS = ["CPU:CLANG", "CPU:LLVM", "CL:CL", "WEBGPU:WGSL"]
OTHER_UID = 65534  # nobody: "another user" (these tests run as root, which may chown)
ADD, MUL = 8.0, 15.0

WORKER = r"""
import json, sys, warnings
import numpy as np
from plugrt import Buffer, Device, dtypes
from plugrt.compiler.ir import KernelBuilder
device, compiler, op = sys.argv[1:4]
b = KernelBuilder("adv")
out, x = b.buffer("out", dtypes.float32), b.buffer("x", dtypes.float32)
out[0] = x[0] * 3.0 if op == "mul" else x[0] + 3.0
with warnings.catch_warnings(record=True) as caught:
  warnings.simplefilter("always")
  dev = Device[device]
  prg = dev.program(b.finish(), compiler)
  o, i = Buffer(dev, 1), Buffer(dev, 1).copyin(np.array([5.0], np.float32))
  prg(o, i, wait=True)
print(json.dumps({"out": float(o.numpy()[0]), "warnings": [str(w.message) for w in caught if "plugrt" in str(w.message)]}))
"""

# a constructor: runs the moment the shared object is dlopen'ed, before plugrt looks at anything in it
CONSTRUCTOR = """
long write(int fd, const void *buf, unsigned long n);
__attribute__((constructor)) static void planted(void) { write(1, "PLANTED\\n", 8); }
"""


def kernel(op: str) -> Kernel:
  b = KernelBuilder("adv")
  out, x = b.buffer("out", dtypes.float32), b.buffer("x", dtypes.float32)
  out[0] = x[0] * 3.0 if op == "mul" else x[0] + 3.0
  return b.finish()


class Target:
  """One compiler as the tests see it: its namespace, the key of a kernel, and binaries made outside the cache."""

  def __init__(self, name: str):
    self.name = name
    self.device, self.compiler = name.split(":")
    self.comp = Device[self.device].compiler_for(self.compiler)
    self.ns = self.comp.cache_namespace

  def src(self, op: str) -> str: return self.comp.render(kernel(op))
  def key(self, op: str = "add") -> str: return self.comp.cache_key(self.src(op))
  def binary(self, op: str) -> bytes: return self.comp.compile_uncached(self.src(op))

  def planted(self) -> bytes:
    """What an attacker puts under the key of "add": the binary of "mul" (with a constructor, where binaries have them)."""
    if self.compiler == "CLANG": return self.comp.compile_uncached(self.src("mul") + CONSTRUCTOR)
    return self.binary("mul")

  def run(self, root: Path, op: str = "add", timeout: float = 120, **env: str) -> dict[str, Any]:
    e = dict(os.environ, PLUGRT_CACHE_DIR=str(root), **env)
    e.pop("PLUGRT_CACHE", None)
    try: p = subprocess.run([sys.executable, "-c", WORKER, self.device, self.compiler, op], env=e, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired: pytest.fail(f"{self.name}: the run hung ({timeout} s) on the cache at {root}")
    assert p.returncode == 0, f"{self.name}: the run died (exit {p.returncode}) on the cache at {root}\n{p.stdout}\n{p.stderr[-4000:]}"
    res = json.loads(p.stdout.strip().splitlines()[-1])
    res["stdout"] = p.stdout
    return res


_targets: dict[str, Target] = {}


@pytest.fixture(params=TARGETS)
def target(request: pytest.FixtureRequest) -> Target:
  name = request.param
  if name not in _targets:
    device = name.split(":")[0]
    if device not in Device.available(): pytest.skip(f"{device} is not available here")
    try: _targets[name] = Target(name)
    except Exception as e: pytest.skip(f"{name} cannot compile here: {e}")
  return _targets[name]


def entry_file(ns: str, key: str, payload: bytes, staging: Path) -> bytes:
  """The bytes of (key, payload) in the one-file-per-key layout, which plugrt still reads (and moves into the pack):
  what an attacker who knows the format writes at <root>/<namespace>/<key[:2]>/<key>."""
  from plugrt.cache import _pack
  return _pack(key, payload)


def index_slot(index: Path, key: str) -> int:
  """Where key's slot starts in an index file (plugrt.cachepack's layout)."""
  from plugrt.cachepack import INDEX_HEAD, SLOT
  data, raw = index.read_bytes(), bytes.fromhex(key)
  return next(at for at in range(INDEX_HEAD, len(data), SLOT) if data[at:at + 32] == raw)


def make_dir(path: Path, mode: int = 0o700, owner: int | None = None) -> Path:
  path.mkdir(exist_ok=True)
  os.chmod(path, mode)
  if owner is not None: os.chown(path, owner, owner)
  return path


def write_file(path: Path, data: bytes, mode: int = 0o600, owner: int | None = None) -> Path:
  path.write_bytes(data)
  os.chmod(path, mode)
  if owner is not None: os.chown(path, owner, owner)
  return path


def assert_add(res: dict[str, Any]) -> None:
  assert "PLANTED" not in res["stdout"], "the planted shared object's constructor ran"
  assert res["out"] == ADD, f"got {res['out']}: the planted binary of 'mul' ran in place of 'add'"


# ---------------------------------------------------------------- D4: binaries planted by another user

def test_planted_while_the_root_was_open_is_never_loaded(target: Target, tmp_path: Path) -> None:
  """The root was 0777 while another user planted a namespace, shard and entry under the key of "add"."""
  root = make_dir(tmp_path / "cache", 0o777)
  data = entry_file(target.ns, target.key(), target.planted(), tmp_path / "staging")
  key = target.key()
  ns = make_dir(root / target.ns, 0o755, OTHER_UID)
  shard = make_dir(ns / key[:2], 0o755, OTHER_UID)
  write_file(shard / key, data, 0o644, OTHER_UID)
  res = target.run(root)
  assert_add(res)
  assert any("writable by group or others" in w for w in res["warnings"]), res["warnings"]
  assert stat.S_IMODE(root.stat().st_mode) == 0o777  # refused as it is: never tightened, then trusted


@pytest.mark.parametrize("attack", ["foreign_namespace", "foreign_shard", "foreign_entry", "open_namespace", "open_shard", "open_entry",
                                    "symlinked_namespace", "symlinked_entry"])
def test_untrusted_path_levels_are_discarded(target: Target, tmp_path: Path, attack: str) -> None:
  """A private root, but one level below it belongs to another user, is writable by others, or is a link out of the cache."""
  key = target.key()
  data = entry_file(target.ns, key, target.planted(), tmp_path / "staging")
  root = make_dir(tmp_path / "cache")
  outside = make_dir(tmp_path / "outside")
  if attack == "symlinked_namespace":
    make_dir(outside / key[:2])
    write_file(outside / key[:2] / key, data)
    (root / target.ns).symlink_to(outside)
  else:
    ns = make_dir(root / target.ns, *{"foreign_namespace": (0o755, OTHER_UID), "open_namespace": (0o777, None)}.get(attack, (0o700, None)))
    shard = make_dir(ns / key[:2], *{"foreign_shard": (0o755, OTHER_UID), "open_shard": (0o777, None)}.get(attack, (0o700, None)))
    if attack == "symlinked_entry":
      (shard / key).symlink_to(write_file(outside / "entry", data))
    else:
      write_file(shard / key, data, *{"foreign_entry": (0o644, OTHER_UID), "open_entry": (0o666, None)}.get(attack, (0o600, None)))
  res = target.run(root)
  assert_add(res)
  assert any("removed it" in w for w in res["warnings"]), res["warnings"]
  if attack.startswith("symlinked"):  # the link is removed, never what it points to
    assert (outside / key[:2] / key).exists() or (outside / "entry").exists()
  # what is left is plugrt's own: the planted file is gone, and the pack holds a trusted entry of "add"
  assert not os.path.lexists(root / target.ns / key[:2] / key)
  st = (root / target.ns / "pack").lstat()
  assert stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o022
  assert DiskCache(target.ns, root=str(root)).get(key) not in (None, target.planted())


# ---------------------------------------------------------------- D5: entries bound to their key; unloadable entries

def test_an_entry_copied_under_another_key_is_a_miss(target: Target, tmp_path: Path) -> None:
  root = tmp_path / "cache"
  assert target.run(root, "add")["out"] == ADD and target.run(root, "mul")["out"] == MUL  # both cached
  index = root / target.ns / "index"
  add, mul = (index_slot(index, k) for k in (target.key("add"), target.key("mul")))
  data = bytearray(index.read_bytes())
  data[add + 32:add + 44] = data[mul + 32:mul + 44]  # the slot of "add" now points at the record of "mul"
  index.write_bytes(bytes(data))
  res = target.run(root, "add")
  assert res["out"] == ADD, "the record of 'mul' was loaded for 'add'"
  assert any("another key" in w for w in res["warnings"]), res["warnings"]
  assert target.run(root, "add")["warnings"] == [] and target.run(root, "mul")["out"] == MUL  # compiled again, appended
  # a record of "mul" rewritten to carry the key of "add" (its sha256 covers the key): refused too
  pack = root / target.ns / "pack"
  blob, off = bytearray(pack.read_bytes()), int.from_bytes(index.read_bytes()[mul + 32:mul + 40], "little")
  blob[off + 40:off + 72] = bytes.fromhex(target.key("add"))
  pack.write_bytes(bytes(blob))
  data = bytearray(index.read_bytes())
  add = index_slot(index, target.key("add"))
  data[add + 32:add + 40] = off.to_bytes(8, "little")
  index.write_bytes(bytes(data))
  res = target.run(root, "add")
  assert res["out"] == ADD and any("corrupt" in w for w in res["warnings"]), res["warnings"]


@pytest.mark.parametrize("damage", ["half", "garbage"])
def test_a_cached_binary_that_does_not_load_is_evicted_and_recompiled(target: Target, tmp_path: Path, damage: str) -> None:
  """The entry is intact as an entry (right key, right sha256), but its payload does not load (half a binary, or
  bytes of no format): the run must neither die nor fail, and must leave a loadable entry behind."""
  root = tmp_path / "cache"
  key, good = target.key(), target.binary("add")
  bad = good[:len(good) // 2] if damage == "half" else bytes(range(256)) * 8
  DiskCache(target.ns, root=str(root)).put(key, bad)
  assert DiskCache(target.ns, root=str(root)).get(key) == bad
  res = target.run(root)
  assert res["out"] == ADD
  assert any("failed to load" in w for w in res["warnings"]), res["warnings"]
  assert DiskCache(target.ns, root=str(root)).get(key) not in (None, bad)  # replaced by a binary that loads
  res = target.run(root)
  assert res["out"] == ADD and not any("failed to load" in w for w in res["warnings"])


def test_a_binary_that_fails_to_load_fresh_is_a_real_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
  """Recompiling is for binaries that came from the cache: a fresh one that fails raises, once, without a retry."""
  dev = Device["CPU"]
  comp = dev.compiler_for("CLANG")
  monkeypatch.setenv("PLUGRT_CACHE_DIR", str(tmp_path))
  monkeypatch.setattr(comp, "_disk", DiskCache(comp.cache_namespace))
  calls = []
  def broken(src: str) -> bytes:
    calls.append(src)
    return b"\x7fELF but nothing after it"
  monkeypatch.setattr(comp, "compile_uncached", broken)
  from plugrt.errors import PluginError
  k = _unique_kernel()
  with pytest.raises(PluginError, match="not a loadable ELF"): dev.program(k, "CLANG")
  assert len(calls) == 1
  assert comp._disk.get(comp.cache_key(calls[0])) is None  # and it is not served from the cache next time


def _unique_kernel() -> Kernel:
  b = KernelBuilder(f"fresh_{os.getpid()}_{time.time_ns()}")
  out, x = b.buffer("out", dtypes.float32), b.buffer("x", dtypes.float32)
  out[0] = x[0] + 1.0
  return b.finish()


def test_cpu_loader_refuses_truncated_and_foreign_elfs() -> None:
  from plugrt.errors import PluginError
  from plugrt_cpu.objects import check_elf
  comp = Device["CPU"].compiler_for("CLANG")
  so = comp.compile_uncached(comp.render(kernel("add")))  # a relocatable object (ET_REL), linked in-process
  assert check_elf(so, "adv") == 1
  for cut in (10, 63, 64, 200, len(so) // 2, len(so) - 1):
    with pytest.raises(PluginError, match="not a loadable ELF"): check_elf(so[:cut], "adv")
  foreign = bytearray(so)
  foreign[18:20] = (183 if foreign[18] == 62 else 62).to_bytes(2, "little")  # another machine
  with pytest.raises(PluginError, match="machine"): check_elf(bytes(foreign), "adv")


def test_cl_loader_refuses_what_its_compiler_did_not_make() -> None:
  if "CL" not in Device.available(): pytest.skip("CL is not available here")
  from plugrt.errors import PluginError
  from plugrt_cl.compiler import frame, unframe
  lib = Device["CL"].compiler.compile_uncached(Device["CL"].compiler.render(kernel("add")))
  raw = unframe(lib, "adv")
  assert frame(raw) == lib
  for bad in (raw, lib[:len(lib) // 2], lib[:-1], lib + b"\0"):
    with pytest.raises(PluginError, match="not one plugrt's CL compiler made"): unframe(bad, "adv")


# ---------------------------------------------------------------- D7: what is at an entry's path; unusable roots

def test_a_fifo_at_an_entry_path_is_discarded(target: Target, tmp_path: Path) -> None:
  root = make_dir(tmp_path / "cache")
  key = target.key()
  shard = make_dir(make_dir(root / target.ns) / key[:2])
  os.mkfifo(shard / key, 0o600)
  res = target.run(root, timeout=60)
  assert res["out"] == ADD
  assert not os.path.lexists(shard / key) and DiskCache(target.ns, root=str(root)).get(key)  # gone; the pack has the entry


def test_a_huge_file_at_an_entry_path_is_not_read(tmp_path: Path) -> None:
  """A 3 GiB (sparse) file where an entry should be: refused from its size, in a process that could not even hold it."""
  key = "ab" * 32
  shard = make_dir(make_dir(make_dir(tmp_path / "cache") / "unit") / key[:2])
  with open(shard / key, "wb") as f: f.truncate(3 << 30)
  code = ("import resource, sys\nresource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
          "from plugrt.cache import DiskCache\nimport warnings\nwarnings.simplefilter('ignore')\n"
          f"print(DiskCache('unit', root={str(tmp_path / 'cache')!r}).get({key!r}))")
  p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
  assert p.returncode == 0 and p.stdout.strip() == "None", p.stderr[-2000:]
  assert not (shard / key).exists()


def test_a_root_where_nothing_can_be_made_runs_uncached_with_one_warning(target: Target) -> None:
  """/proc/self is ours and writable by nobody else, and no directory can be made in it: as on a read-only mount."""
  res = target.run(Path("/proc/self"))
  assert res["out"] == ADD
  assert [w for w in res["warnings"] if "compile cache disabled" in w] == [w for w in res["warnings"] if "plugrt" in w]
  assert len(res["warnings"]) == 1, res["warnings"]


def test_read_only_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
  root = make_dir(tmp_path / "ro", 0o755)
  def read_only(*a: Any, **k: Any) -> None: raise OSError(30, "Read-only file system")
  monkeypatch.setattr(os, "mkdir", read_only)
  dc = DiskCache("unit", root=str(root))
  with pytest.warns(UserWarning, match="compile cache disabled.*Read-only") as w:
    dc.put("cd" * 32, b"x")
    assert dc.get("cd" * 32) is None
    DiskCache("other", root=str(root)).get("cd" * 32)  # another compiler: no second warning
  assert len([x for x in w if "compile cache disabled" in str(x.message)]) == 1
  assert not list(root.iterdir())


def test_old_format_entries_are_a_silent_miss(tmp_path: Path) -> None:
  import hashlib
  import warnings
  key = "ef" * 32
  shard = make_dir(make_dir(make_dir(tmp_path / "c") / "unit") / key[:2])
  write_file(shard / key, b"plugrt-cache-v1\n" + hashlib.sha256(b"old").digest() + b"old")
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    assert DiskCache("unit", root=str(tmp_path / "c")).get(key) is None
  assert not (shard / key).exists()


def test_concurrent_writers_and_readers_see_whole_entries(tmp_path: Path) -> None:
  key, payload = "12" * 32, os.urandom(200_000)
  seen, errors = [], []
  def work() -> None:
    dc = DiskCache("unit", root=str(tmp_path))
    try:
      for _ in range(60):
        dc.put(key, payload)
        seen.append(dc.get(key))
    except Exception as e: errors.append(e)
  threads = [threading.Thread(target=work) for _ in range(4)]
  for t in threads: t.start()
  for t in threads: t.join()
  assert not errors and seen and all(s is None or s == payload for s in seen) and seen.count(payload) > len(seen) // 2
  assert not list(tmp_path.rglob(".tmp-*"))


# ---------------------------------------------------------------- growth: a size cap, least recently used out first

def age(index: Path, keys: list[str], minutes: int) -> None:
  """Make keys' entries last used `minutes` ago (the last-use field of their index slots)."""
  data = bytearray(index.read_bytes())
  for k in keys:
    at = index_slot(index, k)
    data[at + 44:at + 48] = (int(time.time()) // 60 - minutes).to_bytes(4, "little")
  with open(index, "r+b") as f: f.write(data)  # in place: processes that map it see it, as they see a hit's touch


def test_the_cache_is_bounded_and_evicts_least_recently_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
  import plugrt.cache as C
  monkeypatch.setenv("PLUGRT_CACHE_MAX_MB", "1")
  scans = []
  real = C.evict_to
  monkeypatch.setattr(C, "evict_to", lambda root, target: scans.append(target) or real(root, target))
  dc = DiskCache("unit", root=str(tmp_path))
  index = tmp_path / "unit" / "index"
  keys = [f"{i:064x}" for i in range(500)]
  blob = b"k" * (20 << 10)
  for k in keys[:10]: dc.put(k, blob)
  assert len(scans) == 1  # the first put counts what is there; the next ones only add to the running total
  age(index, keys[:10], 60)
  for k in keys[10:40]: dc.put(k, blob)
  assert len(scans) == 1 and all(dc.get(k) == blob for k in keys[:40])  # 40 x 20 KiB: under the cap, nothing evicted
  age(index, keys[:10], 60)
  age(index, keys[10:40], 30)  # last use is kept in minutes: these are newer than the first ten, older than what comes
  assert DiskCache("unit", root=str(tmp_path)).get(keys[0]) == blob  # a first hit makes it the most recently used of the old ones
  for k in keys[40:60]: dc.put(k, blob)  # past the cap: the least recently used go
  assert dc.get(keys[0]) == blob and dc.get(keys[1]) is None and dc.get(keys[59]) == blob
  for k in keys[60:]: dc.put(k, blob)  # 500 kernels of 20 KiB: 10 MiB through a 1 MiB cache
  pack = tmp_path / "unit" / "pack"
  assert pack.stat().st_size <= 1 << 20
  left = C.info(str(tmp_path))["entries"]
  assert 30 < left < 52 and dc.get(keys[-1]) == blob
  assert len(scans) <= 2 + 500 * len(blob) // ((1 << 20) // 8) < 100  # a scan per 1/8 of the cap written, not one per put
  assert int((tmp_path / ".size").read_text()) == du(tmp_path)  # every file counts: pack, index, lock and the total's own


def du(root: Path) -> int: return sum(f.stat().st_size for f in root.rglob("*") if f.is_file())


def test_every_file_of_the_cache_counts_against_the_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
  """The cap bounds what the cache takes on disk: the indexes (49 KiB each at least) and every other file count, and a
  namespace that keeps nothing goes whole, so many compilers' small entries never grow the cache past the cap."""
  import plugrt.cache as C
  monkeypatch.setenv("PLUGRT_CACHE_MAX_MB", "1")
  blob = b"k" * (8 << 10)
  for i in range(400):  # 3.2 MiB of entries in 40 namespaces, each with its own index, through a 1 MiB cache
    DiskCache(f"unit{i % 40}", root=str(tmp_path)).put(f"{i:064x}", blob)
    assert du(tmp_path) <= 1 << 20, f"{du(tmp_path)} bytes on disk after {i + 1} entries"
  assert int((tmp_path / ".size").read_text()) == du(tmp_path) == C.info(str(tmp_path))["bytes"] + (tmp_path / ".size").stat().st_size
  assert DiskCache("unit39", root=str(tmp_path)).get(f"{399:064x}") == blob  # the newest stays


def test_an_existing_root_keeps_its_mode(tmp_path: Path) -> None:
  """A PLUGRT_CACHE_DIR that exists is used as it is: its mode is never changed (it was chmod'ed to 0700 without a
  word: a shared folder, or any system directory for root); what plugrt keeps there is in directories it makes 0700."""
  for mode in (0o755, 0o750, 0o711, 0o700):
    root = make_dir(tmp_path / f"shared{mode:o}", mode)
    dc = DiskCache("unit", root=str(root))
    dc.put("ab" * 32, b"binary")
    assert DiskCache("unit", root=str(root)).get("ab" * 32) == b"binary"
    assert stat.S_IMODE(root.stat().st_mode) == mode
    assert stat.S_IMODE((root / "unit").stat().st_mode) == 0o700


@pytest.mark.parametrize("value", ["lots", "0", "-5", "1.5"])
def test_a_bad_cache_cap_is_a_typed_error(value: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
  from plugrt.hookspecs import DeviceInfo
  from plugrt.runtime import Compiler
  class Echo(Compiler):
    name, cache_namespace = "ECHO", "unit-echo"
    def toolchain(self) -> tuple[str, ...]: return ("echo",)
    def compile_uncached(self, src: str) -> bytes: return src.encode()
  monkeypatch.setenv("PLUGRT_CACHE_DIR", str(tmp_path))
  monkeypatch.setenv("PLUGRT_CACHE_MAX_MB", value)
  with pytest.raises(EnvError, match="PLUGRT_CACHE_MAX_MB"): Echo(DeviceInfo("UNIT", 0, "ECHO")).compile("src")


def test_cli_cache_info_and_clear(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
  from plugrt.cli import main
  monkeypatch.setenv("PLUGRT_CACHE_DIR", str(tmp_path))
  monkeypatch.setenv("PLUGRT_CACHE_MAX_MB", "64")
  caches = {ns: DiskCache(ns) for ns in ("unit-a", "unit-b")}
  for ns, n in (("unit-a", 3), ("unit-b", 2)):
    for i in range(n): caches[ns].put(f"{i:064x}", b"x" * 1000)
  assert main(["cache", "info", "--json"]) == 0
  st = json.loads(capsys.readouterr().out)
  assert st["dir"] == str(tmp_path) and st["entries"] == 5 and st["max_bytes"] == 64 << 20
  assert st["namespaces"]["unit-a"]["entries"] == 3 and st["namespaces"]["unit-b"]["entries"] == 2
  assert main(["cache"]) == 0 and "unit-a" in capsys.readouterr().out
  assert main(["cache", "clear", "unit-a"]) == 0 and "removed 3 entries" in capsys.readouterr().out
  assert main(["cache", "clear", "../etc"]) == 2
  assert main(["cache", "clear"]) == 0 and "removed 2 entries" in capsys.readouterr().out
  assert not [p for p in tmp_path.iterdir()]
  caches["unit-a"].put("0" * 64, b"again")  # a process that used the cache before the clear still writes to it
  assert DiskCache("unit-a").get("0" * 64) == b"again"


# ---------------------------------------------------------------- the pack and its index (issue 17)

def _payload(key: str, n: int = 300) -> bytes:
  import hashlib
  return (hashlib.sha256(key.encode()).digest() * (n // 32 + 1))[:n]


def _filled(root: Path, n: int = 40) -> list[str]:
  dc = DiskCache("unit", root=str(root))
  keys = [f"{i * 7919 + 1:064x}" for i in range(n)]
  for k in keys: dc.put(k, _payload(k, 100 + 37 * (int(k, 16) % 11)))
  assert all(dc.get(k) == _payload(k, 100 + 37 * (int(k, 16) % 11)) for k in keys)
  return keys


def _check_all(root: Path, keys: list[str]) -> int:
  """Every key is a miss or its own payload, never another; returns the hits."""
  dc, hits = DiskCache("unit", root=str(root)), 0
  for k in keys:
    got = dc.get(k)
    assert got is None or got == _payload(k, 100 + 37 * (int(k, 16) % 11)), f"key {k[:8]} served a wrong binary"
    hits += got is not None
  return hits


def test_flipped_bytes_in_pack_or_index_never_serve_a_wrong_binary(tmp_path: Path) -> None:
  import random
  import shutil
  import warnings

  from plugrt.cachepack import INDEX_HEAD, PACK_HEAD
  keys = _filled(tmp_path / "clean")
  ns = tmp_path / "clean" / "unit"
  rng = random.Random(17)
  sizes = {"pack": (ns / "pack").stat().st_size, "index": (ns / "index").stat().st_size}
  used_slots = [index_slot(ns / "index", k) for k in keys]
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    for trial in range(240):
      root = tmp_path / f"t{trial}"
      shutil.copytree(tmp_path / "clean", root)
      name = ("pack", "index")[trial % 2]
      where = rng.choice([  # the headers, the slots in use, anywhere
        rng.randrange(PACK_HEAD if name == "pack" else INDEX_HEAD),
        rng.choice(used_slots) + rng.randrange(44) if name == "index" else rng.randrange(sizes["pack"]),
        rng.randrange(sizes[name])])
      f = root / "unit" / name
      data = bytearray(f.read_bytes())
      data[where] ^= 1 << rng.randrange(8)
      f.write_bytes(bytes(data))
      hits = _check_all(root, keys)
      assert hits >= len(keys) - 2 or where < (PACK_HEAD if name == "pack" else INDEX_HEAD), (name, where, hits)
      dc = DiskCache("unit", root=str(root))  # and the cache mends: written again, everything hits
      for k in keys: dc.put(k, _payload(k, 100 + 37 * (int(k, 16) % 11)))
      assert _check_all(root, keys) == len(keys), (name, where)
      shutil.rmtree(root)


@pytest.mark.parametrize("name", ["pack", "index"])
def test_a_truncated_pack_or_index_is_a_miss_then_rebuilt(tmp_path: Path, name: str) -> None:
  import shutil
  import warnings
  keys = _filled(tmp_path / "clean")
  size = (tmp_path / "clean" / "unit" / name).stat().st_size
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    for cut in (0, 5, 24, 31, 33, size // 3, size // 2, size - 1):
      root = tmp_path / f"cut{cut}"
      shutil.copytree(tmp_path / "clean", root)
      with open(root / "unit" / name, "r+b") as f: f.truncate(cut)
      hits = _check_all(root, keys)
      if name == "index": assert hits == len(keys), cut  # the index is rebuilt from the pack's records
      dc = DiskCache("unit", root=str(root))
      for k in keys: dc.put(k, _payload(k, 100 + 37 * (int(k, 16) % 11)))
      assert _check_all(root, keys) == len(keys), cut


def test_a_lost_index_or_one_of_another_pack_is_rebuilt_from_the_pack(tmp_path: Path) -> None:
  keys = _filled(tmp_path / "a")
  _filled(tmp_path / "b", 5)
  index = tmp_path / "a" / "unit" / "index"
  index.write_bytes((tmp_path / "b" / "unit" / "index").read_bytes())  # another pack's index (its id differs)
  assert _check_all(tmp_path / "a", keys) == len(keys)
  index.unlink()
  assert _check_all(tmp_path / "a", keys) == len(keys)


def _writer(root: str, worker: int, keys: list[str], out: Any) -> None:
  import warnings
  warnings.simplefilter("ignore")
  dc, wrong = DiskCache("unit", root=root), 0
  for i, k in enumerate(keys):
    if i % 4 == worker % 4: dc.put(k, _payload(k, 100 + 37 * (int(k, 16) % 11)))
    for j in (i, i // 2, (i * 7) % len(keys)):  # reads of entries other processes are writing
      got = DiskCache("unit", root=root).get(keys[j]) if j % 5 == 0 else dc.get(keys[j])
      wrong += got is not None and got != _payload(keys[j], 100 + 37 * (int(keys[j], 16) % 11))
  out.put((worker, wrong))


def test_concurrent_writer_processes_never_tear_an_entry(tmp_path: Path) -> None:
  """Four processes write 700 entries (the index grows from 1024 slots while they do) and read each other's."""
  import multiprocessing
  keys = [f"{i * 104729 + 3:064x}" for i in range(700)]
  ctx = multiprocessing.get_context("fork")
  out = ctx.Queue()
  procs = [ctx.Process(target=_writer, args=(str(tmp_path), w, keys, out)) for w in range(4)]
  for p in procs: p.start()
  results = [out.get(timeout=300) for _ in procs]
  for p in procs: p.join(60)
  assert all(p.exitcode == 0 for p in procs) and all(wrong == 0 for _, wrong in results), results
  assert _check_all(tmp_path, keys) == len(keys)
  from plugrt.cachepack import INDEX_HEAD, SLOT
  assert ((tmp_path / "unit" / "index").stat().st_size - INDEX_HEAD) // SLOT >= 2048  # it grew, under the writers
  assert not list((tmp_path / "unit").glob("*.tmp-*"))


def test_entries_of_the_old_layout_hit_and_move_into_the_pack(tmp_path: Path) -> None:
  from plugrt.cache import _pack
  key = "5e" * 32
  shard = make_dir(make_dir(make_dir(tmp_path / "c") / "unit") / key[:2])
  write_file(shard / key, _pack(key, b"old binary"))
  assert DiskCache("unit", root=str(tmp_path / "c")).get(key) == b"old binary"
  assert not (shard / key).exists() and (tmp_path / "c" / "unit" / "pack").exists()
  assert DiskCache("unit", root=str(tmp_path / "c")).get(key) == b"old binary"  # from the pack now


@pytest.mark.parametrize("name", ["pack", "index", "lock"])
@pytest.mark.parametrize("attack", ["foreign", "open", "symlink", "fifo"])
def test_untrusted_pack_files_are_discarded(tmp_path: Path, name: str, attack: str) -> None:
  """A pack, index or lock that another user owns or could write, a link or a FIFO: never read, removed, rebuilt."""
  import warnings
  keys = _filled(tmp_path / "staging", 3)
  root = tmp_path / "c"
  make_dir(root)
  ns = make_dir(root / "unit")
  for n in ("pack", "index"): write_file(ns / n, (tmp_path / "staging" / "unit" / n).read_bytes())
  f = ns / name
  if attack == "symlink":
    target = write_file(tmp_path / "elsewhere", f.read_bytes() if f.exists() else b"")
    f.unlink(missing_ok=True)
    f.symlink_to(target)
  elif attack == "fifo":
    f.unlink(missing_ok=True)
    os.mkfifo(f, 0o600)
  else:
    mode, owner = {"foreign": (0o600, OTHER_UID), "open": (0o666, None)}[attack]
    write_file(f, f.read_bytes() if f.exists() else b"", mode, owner)
  with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    dc = DiskCache("unit", root=str(root))
    got = [dc.get(k) for k in keys]
    dc.put("77" * 32, b"new")
    assert DiskCache("unit", root=str(root)).get("77" * 32) == b"new"
  if name == "pack": assert got == [None] * 3  # nothing read from it
  else: assert got == [_payload(k, 100 + 37 * (int(k, 16) % 11)) for k in keys]  # the index is rebuilt from the trusted pack
  assert any("removed it" in str(x.message) for x in w), [str(x.message) for x in w]
  st = f.lstat()
  assert stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o022
  if attack == "symlink": assert (tmp_path / "elsewhere").exists()  # the link went, not what it pointed at


def test_a_process_mapping_a_compacted_or_cleared_pack_stops_serving_it(tmp_path: Path) -> None:
  import plugrt.cache as C
  keys = _filled(tmp_path, 6)
  reader = DiskCache("unit", root=str(tmp_path))
  assert reader.get(keys[0]) is not None  # maps the pack
  C.evict_to(str(tmp_path), 0)  # compacts everything away
  assert reader.get(keys[0]) is None and reader.get(keys[1]) is None
  DiskCache("unit", root=str(tmp_path)).put(keys[2], b"again")
  assert reader.get(keys[2]) == b"again"
  C.clear(root=str(tmp_path))
  assert reader.get(keys[2]) is None


def test_a_huge_sparse_pack_is_not_read(tmp_path: Path) -> None:
  keys = _filled(tmp_path / "c", 2)
  with open(tmp_path / "c" / "unit" / "pack", "r+b") as f: f.truncate(3 << 30)
  code = ("import resource\nresource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
          "from plugrt.cache import DiskCache\nimport warnings\nwarnings.simplefilter('ignore')\n"
          f"d = DiskCache('unit', root={str(tmp_path / 'c')!r})\nprint([d.get(k) is not None for k in {keys!r}])")
  p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
  assert p.returncode == 0 and p.stdout.strip() in ("[False, False]", "[True, True]"), p.stderr[-2000:]


def test_a_read_only_pack_is_read_and_left_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
  """Files that cannot be opened for writing (a read-only mount): hits still served, nothing removed, writes skipped."""
  import warnings
  keys = _filled(tmp_path, 3)
  real_open = os.open
  def no_write(path: Any, flags: int, *a: Any, **k: Any) -> int:
    if str(path).startswith(str(tmp_path)) and flags & (os.O_RDWR | os.O_WRONLY): raise OSError(30, "Read-only file system", str(path))
    return real_open(path, flags, *a, **k)
  monkeypatch.setattr(os, "open", no_write)
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    assert _check_all(tmp_path, keys) == len(keys)
    DiskCache("unit", root=str(tmp_path)).put("66" * 32, b"x")  # cannot be written: only slower
  monkeypatch.undo()
  assert (tmp_path / "unit" / "index").exists() and _check_all(tmp_path, keys) == len(keys)
