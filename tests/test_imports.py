"""The core's modules import alone, and the core's module-level imports form no cycle.

An import cycle works or breaks depending on which module of it is imported first, so a module that imports fine
after `import plugrt.frontend.tensor` may fail on its own: each module is imported alone, in a fresh interpreter. The cycle
test reads the import graph from the source (ast), so it names the files and the imports that close a cycle.
"""
from __future__ import annotations

import ast
import itertools
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parent.parent / "core"
PACKAGE = CORE / "plugrt"


def _module_name(path: Path, root: Path = CORE) -> str:
  parts = path.relative_to(root).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


KIT = CORE.parent / "testkit"


def core_modules() -> dict[str, Path]:
  """Every module of the core distribution (plugrt and its subpackages) and of the authoring kit (plugrt_testing, its
  own distribution), by dotted name."""
  found = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if "__pycache__" not in p.parts}
  return found | {_module_name(p, KIT): p for p in sorted((KIT / "plugrt_testing").rglob("*.py")) if "__pycache__" not in p.parts}


# ---------------------------------------------------------------- each module alone

#: importing plugrt.__main__ runs the CLI (`python -m plugrt`); tests/test_cli.py runs it
_NOT_IMPORTABLE_ALONE = {"plugrt.__main__"}


def _import_alone(module: str) -> tuple[str, int, str]:
  env = {**os.environ, "PYTHONWARNINGS": "error::ImportWarning"}
  r = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=120, env=env)
  return module, r.returncode, r.stderr[-2000:]


def test_core_module_list_is_complete():
  """The walk finds the modules (a moved core directory would make the tests below pass on nothing)."""
  mods = core_modules()
  assert {"plugrt", "plugrt.frontend.tensor", "plugrt.frontend.dsl", "plugrt.compiler.renderer.cstyle", "plugrt.reference",
          "plugrt_testing.conformance"} <= set(mods)


def test_each_core_module_imports_alone_in_a_fresh_interpreter():
  modules = sorted(set(core_modules()) - _NOT_IMPORTABLE_ALONE)
  with ThreadPoolExecutor(max_workers=max(2, min(8, os.cpu_count() or 2))) as pool:
    results = list(pool.map(_import_alone, modules))
  failed = [f"{m} (exit {rc}):\n{err}" for m, rc, err in results if rc != 0]
  assert not failed, "modules that fail to import alone:\n" + "\n".join(failed)


# ---------------------------------------------------------------- the import graph

def _is_type_checking(test: ast.expr) -> bool:
  return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _module_level_imports(tree: ast.Module, deferred: bool = False) -> list[ast.Import | ast.ImportFrom]:
  """Imports that run when the module is imported: at the top level, in class bodies and in if/try/with blocks there,
  but not under `if TYPE_CHECKING:` (never at run time), nor, unless `deferred`, in functions (they run when called)."""
  found: list[ast.Import | ast.ImportFrom] = []

  def visit(stmts: list[ast.stmt]) -> None:
    for s in stmts:
      if isinstance(s, (ast.Import, ast.ImportFrom)): found.append(s)
      elif deferred and isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)): visit(s.body)
      elif isinstance(s, ast.If):
        if not _is_type_checking(s.test): visit(s.body)
        visit(s.orelse)
      elif isinstance(s, ast.Try) or (sys.version_info >= (3, 11) and isinstance(s, ast.TryStar)):
        visit(s.body)
        for h in s.handlers: visit(h.body)
        visit(s.orelse)
        visit(s.finalbody)
      elif isinstance(s, (ast.With, ast.For, ast.While)):
        visit(s.body)
        visit(getattr(s, "orelse", []))
      elif isinstance(s, ast.ClassDef): visit(s.body)
  visit(tree.body)
  return found


def import_graph(modules: dict[str, Path], deferred: bool = False) -> dict[str, dict[str, int]]:
  """module -> {module of `modules` it imports at module level (with `deferred`, in functions too): the line of the
  (first) import}."""
  graph: dict[str, dict[str, int]] = {}
  for name, path in modules.items():
    is_package = path.name == "__init__.py"
    edges: dict[str, int] = {}
    for node in _module_level_imports(ast.parse(path.read_text(), str(path)), deferred):
      targets: list[str] = []
      if isinstance(node, ast.Import): targets = [a.name for a in node.names]
      else:
        if node.level:  # relative: from the module's package, up level - 1 more
          base = name.split(".") if is_package else name.split(".")[:-1]
          base = base[:len(base) - (node.level - 1)]
          source = ".".join(base + ([node.module] if node.module else []))
        else: source = node.module or ""
        # `from p import x` imports the submodule p.x when there is one, else takes x from p
        targets = [f"{source}.{a.name}" if f"{source}.{a.name}" in modules else source for a in node.names]
      for t in targets:
        while t and t not in modules and "." in t: t = t.rsplit(".", 1)[0]  # import a.b.c of a core module a.b
        if t in modules and t != name: edges.setdefault(t, node.lineno)
    graph[name] = edges
  return graph


def find_cycle(graph: dict[str, dict[str, int]]) -> list[str] | None:
  """One cycle of the graph as [m0, m1, ..., m0], or None."""
  state: dict[str, int] = {}  # 1: on the current path, 2: done
  path: list[str] = []

  def visit(m: str) -> list[str] | None:
    state[m] = 1
    path.append(m)
    for n in sorted(graph.get(m, {})):
      if state.get(n) == 1: return path[path.index(n):] + [n]
      if n not in state and (c := visit(n)): return c
    path.pop()
    state[m] = 2
    return None

  for m in sorted(graph):
    if m not in state and (c := visit(m)): return c
  return None


def test_the_import_graph_reader_sees_what_it_must(tmp_path: Path):
  """The reader itself: module-level imports count (also in try and class bodies), function-level and
  TYPE_CHECKING ones do not, `from p import sub` names the submodule; the cycle finder finds a cycle."""
  pkg = tmp_path / "plugrt"
  (pkg / "sub").mkdir(parents=True)
  files = {"__init__.py": "", "a.py": "from plugrt import b\n", "b.py": "try:\n  import plugrt.c as c\nexcept ImportError: pass\n",
           "c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n  from plugrt import a\ndef f():\n  from plugrt import a\n",
           "d.py": "class K:\n  from .sub import e\n", "sub/__init__.py": "", "sub/e.py": "from .. import d\n"}
  for rel, text in files.items(): (pkg / rel).write_text(text)
  mods = {_module_name(p, tmp_path): p for p in pkg.rglob("*.py")}
  g = import_graph(mods)
  assert g["plugrt.a"] == {"plugrt.b": 1} and g["plugrt.b"] == {"plugrt.c": 2} and g["plugrt.c"] == {}
  assert g["plugrt.d"] == {"plugrt.sub.e": 2} and g["plugrt.sub.e"] == {"plugrt.d": 1}
  assert find_cycle(g) == ["plugrt.d", "plugrt.sub.e", "plugrt.d"]
  del g["plugrt.sub.e"]["plugrt.d"]
  assert find_cycle(g) is None


def test_the_core_has_no_import_cycle():
  graph = import_graph(core_modules())
  cycle = find_cycle(graph)
  if cycle is not None:
    steps = [f"  {a} -> {b}  ({core_modules()[a].relative_to(CORE.parent)}:{graph[a][b]})" for a, b in itertools.pairwise(cycle)]
    pytest.fail("import cycle among the core's modules (module-level imports):\n" + "\n".join(steps))


def first_party_modules() -> dict[str, Path]:
  """Every module of every first-party distribution (the core, each backend and interface package, the NVIDIA
  toolchain, examples/ops_interp), by dotted name; tests and build copies left out."""
  root = CORE.parent
  found: dict[str, Path] = {}
  for init in sorted([*root.glob("core/plugrt/__init__.py"), *root.glob("testkit/plugrt_testing/__init__.py"),
                      *root.glob("plugins/**/plugrt_*/__init__.py"),
                      *root.glob("examples/*/plugrt_*/__init__.py")]):
    pkg = init.parent
    if "build" in pkg.relative_to(root).parts or "tests" in pkg.relative_to(root).parts: continue
    found.update({_module_name(p, pkg.parent): p for p in sorted(pkg.rglob("*.py")) if "__pycache__" not in p.parts})
  return found


def test_the_first_party_list_is_complete():
  mods = first_party_modules()
  assert {"plugrt.runtime", "plugrt_cpu.program", "plugrt_nv.device", "plugrt_amd.runtime", "plugrt_amd_kfd.kfdev", "plugrt_qcom.device",
          "plugrt_webgpu.device", "plugrt_nvidia_toolchain", "plugrt_interp.device"} <= set(mods)


def test_no_import_cycle_anywhere_even_through_deferred_imports():
  """No circle in the core or the plugins, counting the imports inside functions too: a function-local import may
  defer an import's cost, never hide a circle (where a lower module needs a higher one's object, it is handed it)."""
  mods = first_party_modules()
  graph = import_graph(mods, deferred=True)
  cycle = find_cycle(graph)
  if cycle is not None:
    steps = [f"  {a} -> {b}  ({mods[a].relative_to(CORE.parent)}:{graph[a][b]})" for a, b in itertools.pairwise(cycle)]
    pytest.fail("import cycle (deferred imports included):\n" + "\n".join(steps))


# ---------------------------------------------------------------- the core's layers (docs/architecture.md)

#: the core's layers, bottom first: a module imports (at module level or in a function) only modules of its own layer
#: or of layers below it. What a backend author needs is the first; the authoring kit, its own distribution, is last.
LAYERS = [
  ("backend-facing", lambda m: m.count(".") == 1 and m not in ("plugrt.cli", "plugrt.__main__") and (PACKAGE / f"{m[7:]}.py").is_file()),
  ("compiler", lambda m: m.startswith("plugrt.compiler")),
  ("reference backend", lambda m: m.startswith("plugrt.reference")),
  ("frontends", lambda m: m.startswith("plugrt.frontend")),
  ("video and distributed", lambda m: m.startswith(("plugrt.video", "plugrt.distributed"))),
  ("the package face and the CLI", lambda m: m in ("plugrt", "plugrt.cli", "plugrt.__main__")),
  ("the authoring kit", lambda m: m.startswith("plugrt_testing")),
]


def layer_of(module: str) -> int:
  found = [i for i, (_, member) in enumerate(LAYERS) if member(module)]
  assert len(found) == 1, f"{module} is in {len(found)} layers"
  return found[0]


def test_every_core_module_is_in_one_layer_and_the_first_stays_small():
  mods = core_modules()
  for m in mods: layer_of(m)
  first = [p for m, p in mods.items() if layer_of(m) == 0]
  assert {"plugrt.registry", "plugrt.hookspecs", "plugrt.runtime", "plugrt.hwqueue", "plugrt.cache", "plugrt.errors"} <= \
    {m for m in mods if layer_of(m) == 0}
  lines = sum(len(p.read_text().splitlines()) for p in first)
  assert lines <= 6000, f"the backend-facing layer is {lines} lines (at most ~6k: what a backend author reads)"


def test_the_core_layers_import_only_downward():
  """Deferred imports included: a lower layer never reaches up (the CLI's doctor runs sample kernels from the compiler
  layer, and nothing of the core imports the authoring kit)."""
  mods = core_modules()
  graph = import_graph(mods, deferred=True)
  up = [f"  {a} ({LAYERS[layer_of(a)][0]}) -> {b} ({LAYERS[layer_of(b)][0]})  {mods[a].relative_to(CORE.parent)}:{line}"
        for a, edges in graph.items() for b, line in edges.items() if layer_of(b) > layer_of(a)]
  assert not up, "imports that run up the core's layers:\n" + "\n".join(up)


def test_nothing_first_party_imports_a_moved_modules_old_name():
  """The old names of moved modules (plugrt.MOVED_MODULES) stay importable for third-party backends; first-party code,
  tests and benchmarks use the new ones."""
  from plugrt import MOVED_MODULES
  root, found = CORE.parent, []
  for path in [*root.glob("core/**/*.py"), *root.glob("testkit/**/*.py"), *root.glob("plugins/**/*.py"), *root.glob("tests/*.py"),
               *root.glob("bench/*.py"), *root.glob("examples/**/*.py"), *root.glob("scripts/*.py")]:
    if "build" in path.relative_to(root).parts or path.resolve() == Path(__file__).resolve(): continue
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
      names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
        [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names] if isinstance(node, ast.ImportFrom) and not node.level else []
      old = [n for n in names if n in MOVED_MODULES or n.startswith(tuple(k + "." for k in MOVED_MODULES))]
      found += [f"{path.relative_to(root)}:{node.lineno}: {n}" for n in old]
  assert not found, "old module names in first-party code:\n" + "\n".join(found)


def test_a_moved_modules_old_name_is_the_module_itself():
  r = subprocess.run([sys.executable, "-W", "always::DeprecationWarning", "-c",
                      "import plugrt.ir, plugrt.compiler.ir as new; from plugrt.renderer.cstyle import CStyleRenderer;"
                      "from plugrt.compiler.renderer import cstyle; from plugrt import tensor;"
                      "assert plugrt.ir is new and new.__spec__.name == 'plugrt.compiler.ir' and CStyleRenderer is cstyle.CStyleRenderer;"
                      "assert tensor.__name__ == 'plugrt.frontend.tensor'"], capture_output=True, text=True, timeout=120)
  assert r.returncode == 0, r.stderr
  assert "plugrt.ir is plugrt.compiler.ir now" in r.stderr
