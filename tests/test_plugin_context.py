"""The plugin context: a Registry(env=...) governs every setting plugrt and its plugins read, and
docs/environment.md lists every variable the code reads."""
from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from plugrt.context import PluginContext
from plugrt.errors import EnvError
from plugrt.registry import Registry, takes_context

ROOT = Path(__file__).resolve().parents[1]
ENV_DOC = ROOT / "docs" / "environment.md"
#: the section of docs/environment.md whose variables other software reads from the process environment
PROCESS_SECTION = "## Read by drivers and libraries"


def documented() -> tuple[set[str], set[str]]:
  """(every variable docs/environment.md names in a table's first column, those of the drivers' section)."""
  names, process, in_process = set(), set(), False
  for line in ENV_DOC.read_text().splitlines():
    if line.startswith("## "): in_process = line.startswith(PROCESS_SECTION)
    if not line.startswith("| `"): continue
    found = set(re.findall(r"`([A-Z][A-Z0-9_]+)(?:[=`\\])", line.split(" | ")[0]))
    names |= found
    if in_process: process |= found
  return names, process


# ---------------------------------------------------------------- the context's readers

def test_readers_validate_and_name_the_variable():
  ctx = PluginContext({"N": " 12 ", "BAD": "twelve", "BIG": "99", "F": "0.5", "S": "YES", "OFF": "0", "C": "Host", "P": "/a:/b::"})
  assert ctx.get("N") == "12" and ctx.get("UNSET", "d") == "d"
  assert ctx.integer("N", 3, lo=0, hi=20) == 12 and ctx.integer("UNSET", 3) == 3
  assert ctx.number("F", 1.0, lo=0) == 0.5 and ctx.flag("S") is True and ctx.flag("OFF") is False and ctx.flag("UNSET", True)
  assert ctx.choice("C", ("mapped", "host"), "mapped") == "host" and ctx.paths("P") == ["/a", "/b"]
  with pytest.raises(EnvError, match=r"BAD='twelve' is not a whole number.*unset BAD for the default \(3\)"): ctx.integer("BAD", 3, lo=1)
  with pytest.raises(EnvError, match=r"BIG='99' is out of range.*from 1 to 64"): ctx.integer("BIG", 4, lo=1, hi=64)
  with pytest.raises(EnvError, match=r"BAD='twelve' is not a number"): ctx.number("BAD", 1.0)
  with pytest.raises(EnvError, match=r"N=' 12 ' is not a switch"): ctx.flag("N")
  with pytest.raises(EnvError, match=r"C='Host' is not one of mapped, pinned"): ctx.choice("C", ("mapped", "pinned"), "mapped")
  for bad in ("nan", "inf", "-1"):
    with pytest.raises(EnvError): PluginContext({"T": bad}).number("T", 1.0, lo=0)


def test_probes_with_and_without_the_context_parameter():
  class Engine:
    def probe(self, ctx): return ctx
    def old(self): return None
    def __call__(self, ctx): return ctx
  e = Engine()
  assert takes_context(lambda ctx: ctx) and not takes_context(lambda: 0) and takes_context(e.probe) and not takes_context(e.old)
  assert takes_context(e) and not takes_context(len)  # a callable object; a builtin is called with nothing, as before


def test_the_context_knows_the_selection_and_the_interfaces():
  import plugrt.reference
  reg = Registry(plugins=[plugrt.reference], env={"DEV": "PYTHON:PY:someday"})
  assert reg.context.target("python") is not None and reg.context.target("PYTHON").arch == "someday"
  assert reg.context.target("CUDA") is None and reg.context.interfaces("PYTHON") == ()
  reg.open("PYTHON")
  assert reg.open("PYTHON").info.context is reg.context  # hooks see the same context as probes


# ---------------------------------------------------------------- docs/environment.md is complete

READERS = {"get", "flag", "integer", "number", "choice", "paths", "getenv"}


def variables_read_in_code() -> dict[str, str]:
  """Every environment variable the shipped code reads by a literal name: name -> where (file:line)."""
  found: dict[str, str] = {}
  files = [p for p in (*(ROOT / "core" / "plugrt").rglob("*.py"), *(ROOT / "plugins").rglob("*.py")) if not {"tests", "build"} & set(p.parts)]
  for path in files:
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
      name = None
      if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
        fn = node.func
        attr = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else ""
        owner = ast.unparse(fn.value) if isinstance(fn, ast.Attribute) else ""
        if attr in READERS and ("env" in owner.lower() or "ctx" in owner or "context" in owner or attr == "getenv"):
          name = node.args[0].value
      elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
        if "env" in ast.unparse(node.value).lower(): name = node.slice.value
      elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
          and node.targets[0].id.endswith(("_ENV", "_TIMEOUT")) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
        name = node.value.value  # ADAPTER_ENV = "PLUGRT_WEBGPU_ADAPTER", PROBE_TIMEOUT = "PLUGRT_PROBE_TIMEOUT"
      if name and re.fullmatch(r"[A-Z][A-Z0-9_]{2,}", name): found.setdefault(name, f"{path.relative_to(ROOT)}:{node.lineno}")
  return found


#: read by the code but not plugrt's settings: the loader's search path, the user's home and cache base, and the names
#: of PATH and HOME themselves (which a user never sets for plugrt's sake)
NOT_SETTINGS = {"PATH", "HOME", "LD_LIBRARY_PATH", "XDG_CACHE_HOME", "XDG_DATA_DIRS", "PROCESSOR_ARCHITECTURE"}


def test_environment_md_lists_every_variable_the_code_reads():
  names, _ = documented()
  read = variables_read_in_code()
  assert len(read) > 20, read  # the scan finds the readers at all
  missing = {n: where for n, where in read.items() if n not in names and n not in NOT_SETTINGS}
  assert not missing, f"read by the code but not in docs/environment.md: {missing}"


# ---------------------------------------------------------------- Registry(env=...) sees nothing of the process's

CHILD = r"""
import json, os, sys
poisoned = set(json.loads(sys.argv[1]))
reads = set()

class Spy(type(os.environ)):  # os.environ itself (get and `in` go through __getitem__), noting reads of the poisoned names
  def __getitem__(self, k):
    if k in poisoned: reads.add(k)
    return super().__getitem__(k)

e = os.environ
os.environ = Spy(e._data, e.encodekey, e.decodekey, e.encodevalue, e.decodevalue)
from plugrt.registry import Registry
from plugrt.device import Buffer
from plugrt.compiler.samples import tiny_kernel
import numpy as np

reg = Registry(env=json.loads(sys.argv[2])).load()
for br in reg.backends.values():
  p = reg.probe(br.name)
  if p.ok: p.count, dict(p.info)  # the CL probe asks the platforms when these are read
  for c in (br.spec.compilers if br.spec else ()): reg.compiler_probe(br.name, c.name)
  for spec, _ in reg.interfaces.get(br.name, ()): reg.interface_probe(spec)
ran = []
for name in ("CPU", "CL", "WEBGPU", "PYTHON"):
  if not reg.probe(name).ok: continue
  dev = reg.open(name)
  for comp in (dev.backend.spec.compilers if name == "CPU" else ()):
    if reg.compiler_probe(name, comp.name).ok: dev.compiler_for(comp.name)
  k = tiny_kernel()
  prg = dev.program(k)
  out = Buffer(dev, 4, "float32")
  prg(out, *[Buffer(dev, 4, "float32").copyin(np.ones(4, np.float32)) for _ in range(prg.nbufs - 1)])
  dev.synchronize()
  ran.append(name)
print(json.dumps({"reads": sorted(reads), "ran": ran}))
"""


def test_a_registry_with_its_own_environment_reads_nothing_of_the_process(tmp_path):
  names, process = documented()
  poisoned = sorted(names - process)
  assert {"PLUGRT_CACHE_DIR", "CL_PLATFORM", "PLUGRT_CPU_THREADS", "DEV", "PLUGRT_NV_TIMEOUT"} <= set(poisoned)
  env = {k: v for k, v in os.environ.items() if k not in names}
  env.update({n: "poison" for n in poisoned})  # every value wrong: a read would also fail loudly, not only be noted
  registry_env = {"PATH": os.environ.get("PATH", ""), "PLUGRT_CACHE_DIR": str(tmp_path / "cache")}
  r = subprocess.run([sys.executable, "-c", CHILD, json.dumps(poisoned), json.dumps(registry_env)], env=env,
                     capture_output=True, text=True, timeout=300, cwd=tmp_path)
  assert r.returncode == 0, r.stderr[-3000:]
  got = json.loads(r.stdout.strip().splitlines()[-1])
  assert got["reads"] == [], f"read from the process environment despite Registry(env=...): {got['reads']}"
  assert "CPU" in got["ran"], got
  assert (tmp_path / "cache").is_dir()  # the registry's PLUGRT_CACHE_DIR, not the process's "poison"
  assert not (tmp_path / "poison").exists()


#: the one place a plugin touches the process environment: WebGPU's driver workaround gives the process an
#: XDG_RUNTIME_DIR for Mesa, which reads it with getenv (docs/environment.md, last section)
PROCESS_ENV_ALLOWED = {("plugins/ops_webgpu/plugrt_webgpu/drivers.py", "runtime_dir")}


def test_no_plugin_reads_the_process_environment_or_a_private_core_module():
  found = []
  for path in (ROOT / "plugins").rglob("*.py"):
    if {"tests", "build"} & set(path.parts): continue  # (build/: setuptools' copies, where a checkout was pip-installed)
    rel = str(path.relative_to(ROOT))
    tree = ast.parse(path.read_text(), rel)
    for fn in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))] + [tree]:
      where = getattr(fn, "name", "<module>")
      body = fn.body if fn is tree else [fn]
      for node in (n for b in body for n in ast.walk(b)):
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv") and ast.unparse(node.value) == "os" \
            and (rel, where) not in PROCESS_ENV_ALLOWED and fn is not tree:
          found.append(f"{rel}:{node.lineno} ({where}) os.{node.attr}")
        if isinstance(node, (ast.Import, ast.ImportFrom)):
          names = [node.module or ""] + [a.name for a in node.names] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
          mod = node.module or "" if isinstance(node, ast.ImportFrom) else ""
          for n in names:
            full = n if isinstance(node, ast.Import) or n == mod else f"{mod}.{n}"
            if full.startswith("plugrt._") or (mod == "plugrt" and n.startswith("_")): found.append(f"{rel}:{node.lineno} imports {full}")
  assert not found, "plugins must read settings from their plugin context and use public core modules:\n" + "\n".join(sorted(set(found)))
