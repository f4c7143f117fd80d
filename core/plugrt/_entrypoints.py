"""A lean reader of installed entry points.

importlib.metadata costs ~13 ms to import plus ~13 ms per entry_points() call on a
machine with a hundred distributions, which alone would break plugrt's budget for
import + discovery. The format is simple and specified by the PyPA (the
entry_points.txt file of each *.dist-info / *.egg-info directory on sys.path), so
this module reads it directly: one directory listing per path entry and one small
file per distribution. Results are cached for the process. The test suite checks
that it agrees with importlib.metadata.

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


def _normalize(name: str) -> str: return re.sub(r"[-_.]+", "-", name).lower()


def _meta_field(path: str, fields: Sequence[str]) -> dict[str, str]:
  out: dict[str, str] = {}
  try:
    with open(path, encoding="utf-8", errors="replace") as f:
      for line in f:
        if not line.strip(): break  # headers end at the first blank line
        key, _, val = line.partition(":")
        if key in fields and key not in out: out[key] = val.strip()
  except OSError: pass
  return out


def _parse(text: str, group: str) -> list[tuple[str, str]]:
  out, inside = [], False
  for raw in text.splitlines():
    line = raw.strip()
    if not line or line[0] in "#;": continue
    if line.startswith("[") and line.endswith("]"):
      inside = line[1:-1].strip() == group
      continue
    if inside and "=" in line:
      name, _, value = line.partition("=")
      out.append((name.strip(), value.split("[")[0].strip()))
  return out


def entry_points(group: str, path: Sequence[str] | None = None) -> list[EntryPoint]:
  """Entry points of `group`, first distribution of a name on the path winning (as importlib.metadata does)."""
  paths = tuple(sys.path if path is None else path)
  if (key := (group, paths)) in _cache: return _cache[key]
  found: list[EntryPoint] = []
  seen: set[str] = set()
  needle = f"[{group}]"
  for entry in paths:
    base = entry or "."
    if not os.path.isdir(base):
      if os.path.isfile(base): found += _zipped(base, group, seen)
      continue
    try: names = sorted(os.listdir(base))
    except OSError: continue
    for d in names:
      if not (d.endswith(".dist-info") or d.endswith(".egg-info")): continue
      meta_dir = os.path.join(base, d)
      try:
        with open(os.path.join(meta_dir, "entry_points.txt"), encoding="utf-8") as f: text = f.read()
      except OSError: text = ""
      stem = d.rsplit(".", 1)[0]
      norm = _normalize(stem.split("-")[0])  # wheel metadata directories carry the normalised name
      if norm in seen: continue
      seen.add(norm)
      if needle not in text: continue
      meta = _meta_field(os.path.join(meta_dir, "METADATA" if d.endswith(".dist-info") else "PKG-INFO"), ("Name", "Version"))
      name = meta.get("Name") or stem.split("-")[0]
      version = meta.get("Version") or (stem.split("-")[1] if "-" in stem else "")
      found += [EntryPoint(n, v, name, version) for n, v in _parse(text, group)]
  _cache[key] = found
  return found


def _zipped(path: str, group: str, seen: set[str]) -> list[EntryPoint]:
  """Zipped path entries are rare: leave them to importlib.metadata."""
  import zipfile
  if not zipfile.is_zipfile(path): return []
  from importlib.metadata import distributions
  out = []
  for dist in distributions(path=[path]):
    name = dist.metadata["Name"] or ""
    if _normalize(name) in seen: continue
    seen.add(_normalize(name))
    out += [EntryPoint(ep.name, ep.value, name, dist.version) for ep in dist.entry_points if ep.group == group]
  return out


def clear_cache() -> None: _cache.clear()


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
