"""plugrt: a pluggable device runtime.

    from plugrt import Device, Buffer, dtypes
    Device.DEFAULT            # the default device's name, e.g. "CPU"
    Device["CPU"]             # an opened device: allocator, compilers, programs

Names are loaded on first use, so `import plugrt` costs almost nothing and never
touches a plugin.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_LAZY = {
  "Device": "plugrt.device", "Buffer": "plugrt.device", "RuntimeDevice": "plugrt.device",
  "dtypes": "plugrt.dtype", "DType": "plugrt.dtype",
  "Kernel": "plugrt.ir", "KernelBuilder": "plugrt.ir", "Ops": "plugrt.ir", "UOp": "plugrt.ir",
  "Registry": "plugrt.registry",
  "kernel": "plugrt.dsl", "Tensor": "plugrt.tensor",
  "PLUGIN_API_VERSION": "plugrt.hookspecs", "hookimpl": "plugrt.hookspecs",
}

__all__ = sorted(_LAZY) + ["__version__"]

if TYPE_CHECKING:  # for type checkers and IDEs; at run time __getattr__ loads them
  from plugrt.device import Buffer, Device, RuntimeDevice  # noqa: F401
  from plugrt.dsl import kernel  # noqa: F401
  from plugrt.dtype import DType, dtypes  # noqa: F401
  from plugrt.hookspecs import PLUGIN_API_VERSION, hookimpl  # noqa: F401
  from plugrt.ir import Kernel, KernelBuilder, Ops, UOp  # noqa: F401
  from plugrt.registry import Registry  # noqa: F401
  from plugrt.tensor import Tensor  # noqa: F401


def __getattr__(name: str) -> Any:
  if name in _LAZY:
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value
  raise AttributeError(f"module 'plugrt' has no attribute {name!r}")


def __dir__() -> list[str]: return __all__
