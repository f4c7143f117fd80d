"""A lean reader of installed entry points.

importlib.metadata's import, and each entry_points() call on a machine with many
distributions, would alone break plugrt's budget for import + discovery
(docs/performance.md). The format is simple and specified by the PyPA (the
entry_points.txt file of each *.dist-info / *.egg-info directory on sys.path), so
this module reads it directly: one directory listing per path entry and one small
file per distribution. Results are cached for the process. The test suite checks
that it agrees with importlib.metadata.

A distribution whose metadata cannot be read (an entry_points.txt that is not UTF-8 or
not INI where it names the group, an unreadable METADATA or metadata directory) is
skipped with a warning (`skipped`), never an exception: one broken install, plugrt's or
anyone's, must not stop discovery of the others.

Zipped path entries are not read (importlib.metadata is used for those).
"""
from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence
from typing import NamedTuple


class EntryPoint(NamedTuple):
  name: str
  value: str      # "module" or "module:attr"
  dist: str       # distribution name as its metadata spells it
  version: str

  @property
  def module(self) -> str: return self.value.partition(":")[0].strip()


_cache: dict[tuple[str, tuple[str, ...]], list[EntryPoint]] = {}
_skipped: dict[tuple[str, tuple[str, ...]], list[str]] = {}

#: an entry point's value, as the PyPA's entry point specification (and importlib.metadata) reads it
_VALUE = re.compile(r"[\w.]+\s*(:\s*[\w.]+\s*)?(\[.*\]\s*)?$")


class _Unreadable(Exception):
  """A distribution's metadata plugrt cannot read (str: why)."""


def _normalize(name: str) -> str: return re.sub(r"[-_.]+", "-", name).lower()


def _read(path: str, optional: bool = False) -> str | None:
  """A metadata file's text (UTF-8, as the core metadata specification says); None for a missing `optional` file;
  _Unreadable saying why not."""
  try:
    with open(path, "rb") as f: data = f.read()
  except FileNotFoundError:
    if optional: return None
    raise _Unreadable(f"it has no {os.path.basename(path)}") from None
  except OSError as e: raise _Unreadable(f"its {os.path.basename(path)} cannot be read ({type(e).__name__}: {e.strerror or e})") from None
  try: return data.decode("utf-8")
  except UnicodeDecodeError as e:
    raise _Unreadable(f"its {os.path.basename(path)} is not UTF-8 (byte {data[e.start]:#04x} at offset {e.start})") from None


def _meta_field(path: str, fields: Sequence[str]) -> dict[str, str]:
  out: dict[str, str] = {}
  for line in (_read(path) or "").splitlines():
    if not line.strip(): break  # headers end at the first blank line
    key, _, val = line.partition(":")
    if key in fields and key not in out: out[key] = val.strip()
  return out


def _parse(text: str, group: str) -> list[tuple[str, str]]:
  """The (name, value) pairs of `group`; _Unreadable for a line that is not INI (every section's entries need a name and
  `=`, as importlib.metadata reads them) or an entry of `group` whose value is not `module[:attr]`."""
  out, inside, section = [], False, None
  for k, raw in enumerate(text.splitlines(), 1):
    line = raw.strip()
    if not line or line[0] in "#;": continue
    if line.startswith("["):
      if not line.endswith("]"): raise _Unreadable(f"its entry_points.txt is not INI: line {k} ({line[:60]!r}) opens a section it does not close")
      section = line[1:-1].strip()
      inside = section == group
      continue
    name, eq, value = line.partition("=")
    if section is not None and (not eq or not name.strip()):
      raise _Unreadable(f"its entry_points.txt is not INI: line {k} ({line[:60]!r}) in [{section}] is not `name = value`")
    if inside:
      if not _VALUE.match(value.strip()):
        raise _Unreadable(f"its entry_points.txt gives [{group}] entry {name.strip()!r} the value {value.strip()[:60]!r}, "
                          "not `module` or `module:attr`")
      out.append((name.strip(), value.split("[")[0].strip()))
  return out


def entry_points(group: str, path: Sequence[str] | None = None) -> list[EntryPoint]:
  """Entry points of `group`, first distribution of a name on the path winning (as importlib.metadata does). A
  distribution whose metadata cannot be read is left out, with a warning (see `skipped`)."""
  paths = tuple(sys.path if path is None else path)
  if (key := (group, paths)) in _cache: return _cache[key]
  found: list[EntryPoint] = []
  skipped: list[str] = []
  seen: set[str] = set()
  needle = f"[{group}]"
  for entry in paths:
    base = entry or "."
    if not os.path.isdir(base):
      if os.path.isfile(base): found += _zipped(base, group, seen, skipped)
      continue
    try: names = sorted(os.listdir(base))
    except OSError: continue
    for d in names:
      if not (d.endswith(".dist-info") or d.endswith(".egg-info")): continue
      meta_dir = os.path.join(base, d)
      stem = d.rsplit(".", 1)[0]
      norm = _normalize(stem.split("-")[0])  # wheel metadata directories carry the normalised name
      if norm in seen: continue
      seen.add(norm)  # a distribution skipped below still shadows later ones of its name, as importlib.metadata's would
      try:
        text = _read(os.path.join(meta_dir, "entry_points.txt"), optional=True)  # most distributions have none
        if text is None or needle not in text: continue
        pairs = _parse(text, group)
        meta = _meta_field(os.path.join(meta_dir, "METADATA" if d.endswith(".dist-info") else "PKG-INFO"), ("Name", "Version"))
      except _Unreadable as e:
        skipped.append(f"distribution {d} in {os.path.abspath(base)} is skipped: {e} (fix: reinstall it, or remove {os.path.abspath(meta_dir)})")
        continue
      name = meta.get("Name") or stem.split("-")[0]
      version = meta.get("Version") or (stem.split("-")[1] if "-" in stem else "")
      found += [EntryPoint(n, v, name, version) for n, v in pairs]
  if skipped:
    import warnings
    for why in skipped: warnings.warn(f"plugrt: {why}", stacklevel=2)
  _cache[key], _skipped[key] = found, skipped
  return found


def skipped(group: str, path: Sequence[str] | None = None) -> list[str]:
  """Why each distribution was left out of `entry_points(group, path)` (read first when it has not been)."""
  entry_points(group, path)
  return _skipped[(group, tuple(sys.path if path is None else path))]


def _zipped(path: str, group: str, seen: set[str], skipped: list[str]) -> list[EntryPoint]:
  """Zipped path entries are rare: leave them to importlib.metadata (whose errors skip the distribution, as above)."""
  import zipfile
  if not zipfile.is_zipfile(path): return []
  from importlib.metadata import distributions
  out = []
  for dist in distributions(path=[path]):
    try:
      name = dist.metadata["Name"] or ""
      if _normalize(name) in seen: continue
      seen.add(_normalize(name))
      out += [EntryPoint(ep.name, ep.value, name, dist.version) for ep in dist.entry_points if ep.group == group]
    except (ValueError, OSError) as e:  # UnicodeDecodeError is a ValueError
      skipped.append(f"a distribution in {path} is skipped: its metadata cannot be read ({type(e).__name__}: {e}) (fix: rebuild {path})")
  return out


def clear_cache() -> None:
  _cache.clear()
  _skipped.clear()


# ---------------------------------------------------------------- what plugrt checks of a plugin's entry point and module
# (mistakes that still load: `plugrt devices` shows them as warnings, the device stays usable)

def value_warning(ep: EntryPoint) -> str:
  """An entry point `module:attr`: plugrt registers the module and ignores attr."""
  if ":" not in ep.value: return ""
  return (f"entry point {ep.name} = {ep.value!r} names an attribute, which plugrt ignores (it registers the module "
          f"{ep.module}'s hooks): write {ep.name} = {ep.module!r}")


def name_warning(entry: str, declared: Sequence[str]) -> str:
  """An entry point named other than the device it declares: PLUGRT_DISABLE=<device> then imports the module first."""
  if not declared or entry.lower() in (d.lower() for d in declared): return ""
  return (f"entry point {entry!r} declares device {', '.join(declared)}: name the entry point {declared[0].lower()!r}, "
          f"so that PLUGRT_DISABLE={declared[0].lower()} works before the module is imported")


def foreign_modules(new: Sequence[str], module_name: str) -> list[str]:
  """The top-level packages among `new` (modules that importing `module_name` loaded) that are neither the standard
  library, plugrt (and its pluggy), plugrt's plugin packages (plugrt_*), nor the module's own package."""
  own = module_name.partition(".")[0]
  tops = {n.partition(".")[0] for n in new}
  return sorted(t for t in tops if t not in sys.stdlib_module_names and t not in (own, "plugrt", "pluggy")
                and not t.startswith("plugrt_") and t != "__main__")


def import_warning(module_name: str, foreign: Sequence[str]) -> str:
  if not foreign: return ""
  return (f"entry module {module_name} imports {', '.join(foreign)} when plugrt discovers it: an entry module imports only "
          f"the standard library and plugrt (import the rest inside the hooks that build objects), so that listing devices stays cheap")
