"""Shared fixtures for the registry, selection and entry-point tests.

`fake_plugins` makes fake *installed* distributions in a temporary directory (a
`NAME-VERSION.dist-info/` with METADATA and an entry_points.txt holding a `[plugrt]`
section) next to their plugin modules, and puts that directory first on sys.path, so
that plugrt finds them through its real entry-point discovery. Every module gets a
unique name, so sys.modules never mixes two tests' plugins.
"""
from __future__ import annotations

import contextlib
import importlib
import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

HEADER = """\
from __future__ import annotations

import sys
from typing import Any

from plugrt.errors import Reason
from plugrt.hookspecs import Alias, BackendSpec, CompilerSpec, DeviceInfo, InterfaceSpec, Probe, hookimpl

CALLS: list[tuple[str, Any]] = []


def _no_toolchain() -> Probe:
  return Probe.missing(Reason.MISSING_TOOLCHAIN, "the fake toolchain is not on PATH", "install the fake toolchain")
"""

#: the device hooks of a working fake backend: the reference (PYTHON) backend's objects under another name
DEVICE_HOOKS = """
@hookimpl
def plugrt_allocator(device: DeviceInfo) -> Any:
  CALLS.append(("allocator", device.iface_object))
  from plugrt.reference.backend import PythonAllocator
  return PythonAllocator(device)


@hookimpl
def plugrt_compiler(device: DeviceInfo, compiler: str) -> Any:
  CALLS.append(("compiler", compiler))
  from plugrt.reference.backend import PythonCompiler
  return PythonCompiler(device)


@hookimpl
def plugrt_program(device: DeviceInfo) -> Any:
  from plugrt.reference.backend import PythonProgram
  return PythonProgram
"""


def backend_source(name: str, *, priority: int = 0, api_version: str = "1.0", compilers: Sequence[str] = ("PY",), count: int = 1,
                   missing: Sequence[str] = (), interfaces: str = "()", aliases: str = "()", device_hooks: str = DEVICE_HOOKS,
                   extra: str = "") -> str:
  """The source of a fake backend plugin declaring `name`. count=0: its probe finds no device. Compilers named in
  `missing` have no toolchain. `interfaces`/`aliases` are Python expressions; `extra` is more module code (more hooks)."""
  probe = (f"Probe.found({count}, 'fake {name}')" if count else
           f"Probe.missing(Reason.NO_DEVICE, 'no {name} here', 'plug a {name} in')")
  comps = ", ".join(f"CompilerSpec({c!r}, probe={'_no_toolchain' if c in missing else 'None'})" for c in compilers)
  return HEADER + textwrap.dedent(f"""

    def probe() -> Probe:
      return {probe}


    @hookimpl
    def plugrt_backends() -> list[BackendSpec]:
      return [BackendSpec(name={name!r}, api_version={api_version!r}, probe=probe, priority={priority},
                          compilers=({comps},), interfaces={interfaces}, aliases={aliases})]
    """) + device_hooks + textwrap.dedent(extra)


#: variables that would change what a fresh process chooses; run_python leaves them out
SELECTION_VARS = {"DEV", "CPU", "PYTHON", "CLANG", "LLVM", "GPU", "PLUGRT_DISABLE", "PLUGRT_PLUGINS", "PLUGRT_AUTOLOAD", "PLUGRT_EXTRA_PLUGINS"}


class FakePlugins:
  """Fake installed distributions and plugin modules in one directory on sys.path."""

  def __init__(self, root: Path):
    self.root = root
    self.modules: list[str] = []

  def module(self, source: str, name: str | None = None) -> str:
    """Write a module (by default with a unique name); returns the name."""
    name = name or f"fakeplug_{uuid.uuid4().hex[:10]}"
    (self.root / f"{name}.py").write_text(source)
    self.modules.append(name)
    importlib.invalidate_caches()
    return name

  def dist(self, name: str, entry_points: Mapping[str, Mapping[str, str]], version: str = "1.0", where: Path | None = None,
           kind: str = "dist-info", raw_entry_points: bytes | None = None, raw_metadata: bytes | None = None) -> Path:
    """Write `<name>-<version>.dist-info/` (METADATA, entry_points.txt) under `where` (default: the root). `raw_entry_points`
    and `raw_metadata` are written as the files' bytes instead (a broken install: not UTF-8, not INI)."""
    base = where or self.root
    meta = base / f"{name.replace('-', '_')}-{version}.{kind}"
    meta.mkdir(parents=True)
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\nfake\n".encode()
    (meta / ("METADATA" if kind == "dist-info" else "PKG-INFO")).write_bytes(metadata if raw_metadata is None else raw_metadata)
    text = "".join(f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) + "\n" for group, eps in entry_points.items())
    (meta / "entry_points.txt").write_bytes(text.encode() if raw_entry_points is None else raw_entry_points)
    from plugrt import _entrypoints
    _entrypoints.clear_cache()  # a test that writes more metadata after a read must see it
    importlib.invalidate_caches()
    return meta

  def plugin(self, source: str, entry: str = "fake", dist: str | None = None, version: str = "1.0") -> str:
    """A plugin module and a distribution registering it under group `plugrt` as `entry`; returns the module name."""
    mod = self.module(source)
    self.dist(dist or f"plugrt-fake-{mod.rsplit('_', 1)[-1]}", {"plugrt": {entry: mod}}, version)
    return mod

  def backend(self, name: str, entry: str | None = None, dist: str | None = None, version: str = "1.0", **kw: Any) -> str:
    """A working fake backend plugin (see backend_source); returns its module name."""
    return self.plugin(backend_source(name, **kw), entry or name.lower(), dist, version)

  def calls(self, module: str) -> list[tuple[str, Any]]: return sys.modules[module].CALLS

  def run_python(self, code: str, *args: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh interpreter that sees these fake distributions first on its path."""
    full = {k: v for k, v in os.environ.items() if k not in SELECTION_VARS and not k.startswith(("CPU_", "PYTHON_"))}
    full["PYTHONPATH"] = os.pathsep.join([str(self.root), *filter(None, [os.environ.get("PYTHONPATH")])])
    full.update(env or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True, env=full, timeout=60,
                          cwd=str(self.root))


@pytest.fixture
def fake_plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakePlugins]:
  root = tmp_path / "site"
  root.mkdir()
  monkeypatch.syspath_prepend(str(root))
  fake = FakePlugins(root)
  yield fake
  for name in fake.modules: sys.modules.pop(name, None)


def run_tiny(reg: Any, device: str) -> float:
  """Open `device` in registry `reg`, run the tiny kernel (out[0] = x[0] + 1) and return out[0]."""
  import numpy as np

  from plugrt.compiler.samples import tiny_kernel
  from plugrt.device import Buffer
  dev = reg.open(device)
  prg = dev.program(tiny_kernel())
  out, x = Buffer(dev, 1), Buffer(dev, 1).copyin(np.array([41.0], np.float32))
  prg(out, x, wait=True)
  return float(out.numpy()[0])


@contextlib.contextmanager
def float16_or_skip() -> Iterator[None]:
  """Skip, not fail, where the device cannot express float16 (a WebGPU adapter without shader-f16 says so
  with a RenderError); any other error still fails."""
  from plugrt.errors import RenderError
  try: yield
  except RenderError as e:
    if "float16" not in e.message: raise
    pytest.skip(e.message)

