"""plugrt._entrypoints: our own reader of installed entry points must agree with
importlib.metadata, cache its answer for the process, and let the first distribution
of a name on the path win."""
from __future__ import annotations

import importlib.metadata
import os
import re
import sys
import zipfile

import pytest

from plugrt._entrypoints import EntryPoint, clear_cache, entry_points
from plugrt.registry import Registry

GROUPS = ["console_scripts", "pytest11", "plugrt"]


def reference(group: str, path: list[str] | None = None) -> list[tuple[str, str, str, str]]:
  """importlib.metadata's answer, first distribution of a name winning, extras dropped from values."""
  seen: set[str] = set()
  out = []
  for dist in importlib.metadata.distributions(**({} if path is None else {"path": path})):
    norm = re.sub(r"[-_.]+", "-", dist.metadata["Name"] or "").lower()
    if norm in seen: continue
    seen.add(norm)
    out += [(ep.name, re.sub(r"\s*\[.*\]$", "", ep.value), dist.metadata["Name"], dist.version) for ep in dist.entry_points if ep.group == group]
  return sorted(out)


def ours(group: str, path: list[str] | None = None) -> list[tuple[str, str, str, str]]:
  return sorted((e.name, e.value, e.dist, e.version) for e in entry_points(group, path))


@pytest.fixture
def dists(fake_plugins):
  fake_plugins.dist("fake-alpha", {"console_scripts": {"fake-alpha": "fake_alpha.cli:main"}, "pytest11": {"fakealpha": "fake_alpha.plug"},
                                   "plugrt": {"alpha": "fake_alpha"}}, version="1.2")
  beta = fake_plugins.dist("Fake.Beta", {"plugrt": {}}, version="0.1.dev3")
  (beta / "entry_points.txt").write_text("# a comment\n\n[plugrt]\n  beta   =   fake_beta:attr [extra1]\n\ngamma=fake_beta.g\n"
                                         "[other]\nnot_ours = x\n")
  fake_plugins.dist("fake_egg", {"plugrt": {"egg": "fake_egg_mod"}}, version="3", kind="egg-info")
  bare = fake_plugins.root / "fake_bare-1.0.dist-info"
  bare.mkdir()
  (bare / "METADATA").write_text("Name: fake-bare\nVersion: 1.0\n\n")  # no entry_points.txt at all
  return fake_plugins


@pytest.mark.parametrize("group", GROUPS)
def test_agrees_with_importlib_metadata(dists, group):
  assert ours(group) == reference(group)
  assert ours(group)  # each group has something in it here


def test_fake_distributions_are_read(dists):
  eps = entry_points("plugrt")
  mine = [e for e in eps if e.dist.lower().startswith("fake")]
  assert sorted(mine) == sorted([EntryPoint("alpha", "fake_alpha", "fake-alpha", "1.2"),
                                 EntryPoint("beta", "fake_beta:attr", "Fake.Beta", "0.1.dev3"),
                                 EntryPoint("gamma", "fake_beta.g", "Fake.Beta", "0.1.dev3"),
                                 EntryPoint("egg", "fake_egg_mod", "fake_egg", "3")])
  assert eps[:len(mine)] == [e for e in eps if e in mine]  # the first directory on sys.path comes first
  assert {e.module for e in mine} == {"fake_alpha", "fake_beta", "fake_beta.g", "fake_egg_mod"}
  assert {"python", "cpu"} <= {e.name for e in eps}  # and the real ones after them
  assert entry_points("console_scripts")[0] == EntryPoint("fake-alpha", "fake_alpha.cli:main", "fake-alpha", "1.2")


def test_first_distribution_of_a_name_wins(fake_plugins, tmp_path, monkeypatch):
  later = tmp_path / "later"
  later.mkdir()
  fake_plugins.dist("fake-dup", {"plugrt": {"dup": "dup_first"}}, version="1.0")
  fake_plugins.dist("Fake_Dup", {"plugrt": {"dup": "dup_second", "dup2": "dup_extra"}}, version="2.0", where=later)
  fake_plugins.dist("fake-shadow", {"console_scripts": {"shadow": "shadow:main"}}, version="1.0")  # shadows the next, though it has no plugrt
  fake_plugins.dist("fake-shadow", {"plugrt": {"shadow": "shadow_mod"}}, version="2.0", where=later)
  assert sys.path[0] == str(fake_plugins.root)
  monkeypatch.setattr(sys, "path", [sys.path[0], str(later), *sys.path[1:]])
  got = [e for e in entry_points("plugrt") if "dup" in e.name or "shadow" in e.name]
  assert got == [EntryPoint("dup", "dup_first", "fake-dup", "1.0")]
  assert ours("plugrt") == reference("plugrt")
  assert [e for e in entry_points("plugrt", [str(later)]) if "dup" in e.name] == [EntryPoint("dup", "dup_second", "Fake_Dup", "2.0"),
                                                                                  EntryPoint("dup2", "dup_extra", "Fake_Dup", "2.0")]
  assert ours("plugrt", [str(later)]) == reference("plugrt", [str(later)])


def test_results_are_cached(dists, monkeypatch):
  first = entry_points("plugrt")
  reg = Registry(env={}).load()
  listed: list[str] = []

  def no_listing(path: str = ".") -> list[str]:
    listed.append(path)
    raise AssertionError(f"listed {path} again")

  monkeypatch.setattr(os, "listdir", no_listing)
  assert entry_points("plugrt") is first
  again = Registry(env={}).load()  # a second registry reads nothing from the disk either
  assert sorted(again.backends) == sorted(reg.backends) and listed == []
  clear_cache()  # and the cache is what spared the disk
  with pytest.raises(AssertionError, match="listed"):
    entry_points("plugrt")
  assert listed


def test_explicit_path_and_odd_entries(fake_plugins, tmp_path, monkeypatch):
  other = tmp_path / "other"
  other.mkdir()
  fake_plugins.dist("fake-only", {"plugrt": {"only": "only_mod"}}, where=other)
  assert entry_points("plugrt", [str(other)]) == [EntryPoint("only", "only_mod", "fake-only", "1.0")]
  assert entry_points("plugrt", [str(tmp_path / "missing"), str(other / "fake_only-1.0.dist-info" / "METADATA")]) == []
  monkeypatch.chdir(other)
  assert entry_points("plugrt", [""]) == [EntryPoint("only", "only_mod", "fake-only", "1.0")]  # "" is the current directory
  assert entry_points("no-such-group", [str(other)]) == []


def test_zipped_path_entry(tmp_path, monkeypatch):
  zpath = tmp_path / "plugins.zip"
  with zipfile.ZipFile(zpath, "w") as z:
    z.writestr("fake_zipped-0.3.dist-info/METADATA", "Name: fake-zipped\nVersion: 0.3\n\n")
    z.writestr("fake_zipped-0.3.dist-info/entry_points.txt", "[plugrt]\nzipped = zipped_mod\n")
  monkeypatch.syspath_prepend(str(zpath))
  clear_cache()
  assert entry_points("plugrt", [str(zpath)]) == [EntryPoint("zipped", "zipped_mod", "fake-zipped", "0.3")]
  assert ours("plugrt") == reference("plugrt")
  assert entry_points("plugrt")[0] == EntryPoint("zipped", "zipped_mod", "fake-zipped", "0.3")


def test_registry_reads_group_plugrt(dists):
  reg = Registry(env={}).load()
  assert {p.entry for p in reg.plugins} >= {"alpha", "beta", "gamma", "egg", "python", "cpu"}
  alpha = next(p for p in reg.plugins if p.entry == "alpha")
  assert (alpha.dist, alpha.version, alpha.module_name, alpha.source) == ("fake-alpha", "1.2", "fake_alpha", "entry point")
  assert "not_ours" not in {p.entry for p in reg.plugins}



# ---------------------------------------------------------------- entry-point mistakes are reported, not silently accepted

def _warnings(reg: Registry, module: str) -> list[str]:
  return next(p for p in reg.load().plugins if p.module_name == module).warnings


def test_an_entry_point_attribute_is_reported_as_ignored(fake_plugins):
  from conftest import backend_source
  mod = fake_plugins.module(backend_source("ATTRDEV"))
  fake_plugins.dist("plugrt-attrdev", {"plugrt": {"attrdev": f"{mod}:plugrt_backends"}})
  reg = Registry(env={"PLUGRT_PLUGINS": "attrdev"})
  (w,) = _warnings(reg, mod)
  assert f"attrdev = '{mod}:plugrt_backends' names an attribute, which plugrt ignores" in w and f"write attrdev = '{mod}'" in w
  assert reg.probe("ATTRDEV").ok  # a warning, not an unavailable device


def test_an_entry_point_named_other_than_its_device_is_reported(fake_plugins):
  mod = fake_plugins.backend("NAMEDEV", entry="something")
  good = fake_plugins.backend("GOODDEV")
  reg = Registry(env={"PLUGRT_PLUGINS": "something,gooddev"})
  (w,) = _warnings(reg, mod)
  assert "entry point 'something' declares device NAMEDEV: name the entry point 'namedev'" in w and "PLUGRT_DISABLE=namedev" in w
  assert reg.probe("NAMEDEV").ok and _warnings(reg, good) == []


def test_an_entry_module_importing_a_non_stdlib_package_is_reported(fake_plugins):
  from conftest import backend_source
  fake_plugins.module("VALUE = 1\n", name="fake_heavy_dependency")
  mod = fake_plugins.plugin(backend_source("HEAVYDEV", extra="import json\nimport fake_heavy_dependency\n"), entry="heavydev")
  sys.modules.pop("fake_heavy_dependency", None)
  reg = Registry(env={"PLUGRT_PLUGINS": "heavydev"})
  (w,) = _warnings(reg, mod)
  assert f"entry module {mod} imports fake_heavy_dependency when plugrt discovers it" in w and "json" not in w.split("discovers")[0]
  assert reg.probe("HEAVYDEV").ok


def test_plugrt_devices_prints_plugin_warnings(fake_plugins):
  mod = fake_plugins.backend("WARNDEV", entry="other")
  r = fake_plugins.run_python("from plugrt.cli import main; main(['devices'])", env={"PLUGRT_PLUGINS": "other"})
  assert r.returncode == 0, r.stderr
  assert f"warning: plugrt-fake-{mod.rsplit('_', 1)[-1]} ({mod}): entry point 'other' declares device WARNDEV" in r.stdout
  j = fake_plugins.run_python("from plugrt.cli import main; main(['devices', '--json'])", env={"PLUGRT_PLUGINS": "other"})
  import json
  data = json.loads(j.stdout)
  row = next(b for b in data["backends"] if b["device"] == "WARNDEV")
  assert row["available"] and "declares device WARNDEV" in row["warnings"][0] and data["plugin_warnings"][0]["module"] == mod


def test_shipped_plugins_have_no_warnings():
  reg = Registry()
  assert [(p.module_name, p.warnings) for p in reg.load().plugins if p.warnings] == []
