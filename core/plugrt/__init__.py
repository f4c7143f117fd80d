"""plugrt: a pluggable device runtime.

    from plugrt import Device, Buffer, dtypes
    Device.DEFAULT            # the default device's name, e.g. "CPU"
    Device["CPU"]             # an opened device: allocator, compilers, programs

Names are loaded on first use, so `import plugrt` costs almost nothing and never
touches a plugin.
"""
from __future__ import annotations

import importlib
import importlib.machinery
import sys
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_LAZY = {
  "Device": "plugrt.device", "Buffer": "plugrt.device", "RuntimeDevice": "plugrt.device",
  "dtypes": "plugrt.dtype", "DType": "plugrt.dtype",
  "Kernel": "plugrt.compiler.ir", "KernelBuilder": "plugrt.compiler.ir", "Ops": "plugrt.compiler.ir", "UOp": "plugrt.compiler.ir",
  "Registry": "plugrt.registry",
  "kernel": "plugrt.frontend.dsl", "Tensor": "plugrt.frontend.tensor",
  "PLUGIN_API_VERSION": "plugrt.hookspecs", "hookimpl": "plugrt.hookspecs",
}

__all__ = sorted(_LAZY) + ["__version__"]

if TYPE_CHECKING:  # for type checkers and IDEs; at run time __getattr__ loads them
  from plugrt.compiler.ir import Kernel, KernelBuilder, Ops, UOp  # noqa: F401
  from plugrt.device import Buffer, Device, RuntimeDevice  # noqa: F401
  from plugrt.dtype import DType, dtypes  # noqa: F401
  from plugrt.frontend.dsl import kernel  # noqa: F401
  from plugrt.frontend.tensor import Tensor  # noqa: F401
  from plugrt.hookspecs import PLUGIN_API_VERSION, hookimpl  # noqa: F401
  from plugrt.registry import Registry  # noqa: F401


def __getattr__(name: str) -> Any:
  if name in _LAZY:
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value
  raise AttributeError(f"module 'plugrt' has no attribute {name!r}")


def __dir__() -> list[str]: return __all__


#: modules that moved into the core's layers (docs/architecture.md) or into the test kit's own distribution, by their
#: old names: backends written for plugin API 1.0-1.3 import these, so they stay importable, as the same module objects
MOVED_MODULES = {
  "plugrt.ir": "plugrt.compiler.ir", "plugrt.arith": "plugrt.compiler.arith", "plugrt.lowering": "plugrt.compiler.lowering",
  "plugrt.interpreter": "plugrt.compiler.interpreter", "plugrt.renderer": "plugrt.compiler.renderer",
  "plugrt.dsl": "plugrt.frontend.dsl", "plugrt.tensor": "plugrt.frontend.tensor", "plugrt.dlpack": "plugrt.frontend.dlpack",
  "plugrt.testing.kernels": "plugrt.compiler.samples", "plugrt.testing": "plugrt_testing",
}


def _new_name(name: str) -> str | None:
  for old, new in MOVED_MODULES.items():
    if name == old or name.startswith(old + "."): return new + name[len(old):]
  return None


class _MovedModuleFinder:
  """Answers an import of a moved module's old name with the module itself (a meta path finder and its loader), with a
  DeprecationWarning naming the new one. Nothing first-party imports an old name (tests/test_imports.py checks)."""

  def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
    return importlib.machinery.ModuleSpec(name, self) if name.startswith("plugrt.") and _new_name(name) else None

  def create_module(self, spec: Any) -> Any:
    import warnings
    new = _new_name(spec.name)
    warnings.warn(f"{spec.name} is {new} now; import it by that name", DeprecationWarning, stacklevel=2)
    try: module = importlib.import_module(new)  # type: ignore[arg-type]
    except ModuleNotFoundError as e:
      if e.name != new or not new.startswith("plugrt_testing"): raise  # type: ignore[union-attr]
      raise ModuleNotFoundError(f"{spec.name} is the test kit, its own distribution now: pip install plugrt-testing "
                                f"(in this repository: bash scripts/setup.sh --test), then import {new}", name=spec.name) from None
    spec.loader_state = module.__spec__  # the import system sets the alias's spec on the module; exec_module puts it back
    return module

  def exec_module(self, module: Any) -> None:
    module.__spec__ = module.__spec__.loader_state


if not any(isinstance(f, _MovedModuleFinder) for f in sys.meta_path): sys.meta_path.insert(0, _MovedModuleFinder())
