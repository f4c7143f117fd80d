"""What a backend sees of the world: the plugin context, and the device being opened.

The registry builds one `PluginContext` from its environment mapping (``Registry(env=...)``, or a snapshot
of the process environment) and hands it to every probe (plugin API >= 1.2) and, through
``DeviceInfo.context``, to every hook. A backend reads its settings from it, never from ``os.environ``,
so two registries with two environments see two different machines' worth of settings.

Every reader validates: a value it cannot use is an `EnvError` that names the variable and the fix.
It also holds what every layer above names: `DeviceState` (what a device's objects share) and `BufferBase` (what a
program takes). This module is a leaf: it imports only the standard library and plugrt.errors / plugrt.probing.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Optional

from plugrt import probing
from plugrt.errors import EnvError, UnknownDeviceError, did_you_mean

if TYPE_CHECKING:
  from plugrt.selection import Target

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")


class DeviceState:
  """What a device's objects share (plugrt_open_device's result, `DeviceInfo.state`). Backends with queues override
  synchronize(): when it returns, every write queued before it is done, and memory the allocator wrapped (_wrap, for
  from_blob) shows it to the memory's owner."""
  def synchronize(self) -> None: pass
  def close(self) -> None: pass


class BufferBase:
  """What programs take as arguments: typed memory on one opened device (plugrt.opened.Buffer). Here, below the
  modules that make buffers, so that a program's argument check (plugrt.runtime) knows one without importing them."""
  __slots__ = ()


class PluginContext:
  """The registry's environment and the user's selection, with validated readers and machine helpers."""

  __slots__ = ("_interfaces", "_targets", "env")

  def __init__(self, env: Mapping[str, str], targets: Iterable[Target] | Callable[[], Iterable[Target]] = (),
               interfaces: Callable[[str], Sequence[str]] | None = None):
    self.env: Mapping[str, str] = env  # the registry's environment: read it, never os.environ
    self._targets = targets  # a callable: the registry's selection, parsed when first asked (a bad DEV raises there)
    self._interfaces = interfaces

  @classmethod
  def from_process(cls) -> PluginContext:
    """A context over the process environment itself (live: a later change is seen), as the default registry has."""
    return cls(os.environ)

  def __repr__(self) -> str: return f"PluginContext({len(self.env)} variables)"

  # ------------------------------------------------------------- validated readers
  def get(self, name: str, default: str = "") -> str:
    """The variable's value without surrounding blanks, or `default` when unset or blank."""
    return self.env.get(name, "").strip() or default

  def flag(self, name: str, default: bool = False) -> bool:
    """1/true/yes/on or 0/false/no/off (any case); unset is `default`."""
    v = self.env.get(name)
    if v is None or not v.strip(): return default
    low = v.strip().lower()
    if low in _TRUE: return True
    if low in _FALSE: return False
    raise EnvError(f"{name}={v!r} is not a switch", f"write {name}=1 or {name}=0")

  def acknowledged(self, name: str) -> bool:
    """An acknowledgement variable (one that lets plugrt do something it never does unasked, such as taking a GPU from
    its kernel driver): exactly `1` acknowledges; unset, blank or `0` does not; anything else (`yes`, `true`, `2`) is an
    EnvError, so that a value meant otherwise never counts as consent. The one rule of every such variable."""
    v = self.get(name)
    if v in ("", "0"): return False
    if v == "1": return True
    raise EnvError(f"{name}={self.env.get(name)!r} is not an acknowledgement: only 1 acknowledges, 0 (or unset) does not",
                   f"set {name}=1 to acknowledge, or {name}=0 (or unset it) to refuse")

  def integer(self, name: str, default: int, *, lo: int | None = None, hi: int | None = None, unit: str = "") -> int:
    """A whole number in [lo, hi]; unset or blank is `default`."""
    v = self.get(name)
    if not v: return default
    what = f" {unit}" if unit else ""
    try: x = int(v, 0) if v.lower().startswith(("0x", "0o", "0b")) else int(v)
    except ValueError: raise EnvError(f"{name}={v!r} is not a whole number{what}", _range_hint(name, lo, hi, default)) from None
    if (lo is not None and x < lo) or (hi is not None and x > hi):
      raise EnvError(f"{name}={v!r} is out of range{what}", _range_hint(name, lo, hi, default))
    return x

  def number(self, name: str, default: float, *, lo: float | None = None, hi: float | None = None, unit: str = "") -> float:
    """A finite number in [lo, hi]; unset or blank is `default`."""
    v = self.get(name)
    if not v: return default
    what = f" {unit}" if unit else ""
    try: x = float(v)
    except ValueError: raise EnvError(f"{name}={v!r} is not a number{what}", _range_hint(name, lo, hi, default)) from None
    if x != x or x in (float("inf"), float("-inf")) or (lo is not None and x < lo) or (hi is not None and x > hi):
      raise EnvError(f"{name}={v!r} is out of range{what}", _range_hint(name, lo, hi, default))
    return x

  def choice(self, name: str, choices: Iterable[str], default: str) -> str:
    """One of `choices` (compared without case; returned as spelled in `choices`); unset is `default`."""
    v = self.get(name)
    if not v: return default
    options = list(choices)
    for c in options:
      if c.lower() == v.lower(): return c
    raise EnvError(f"{name}={v!r} is not one of {', '.join(options)}{did_you_mean(v, options)}", f"write e.g. {name}={default}")

  def paths(self, name: str) -> list[str]:
    """A list of paths separated by os.pathsep, blanks dropped."""
    return [p for p in self.get(name).split(os.pathsep) if p]

  # ------------------------------------------------------------- the user's selection
  @property
  def targets(self) -> tuple[Target, ...]:
    """What the user asked for (DEV, <DEVICE>=1, <DEVICE>_<COMPILER>=1, aliases), parsed: the default device's first.
    A malformed request raises its EnvError here."""
    if callable(self._targets): self._targets = self._targets()
    if not isinstance(self._targets, tuple): self._targets = tuple(self._targets)
    return self._targets

  def target(self, device: str) -> Target | None:
    """The user's request for `device` (its compiler, arch, interface), or None when the user named none."""
    device = device.upper()
    return next((t for t in self.targets if t.device == device), None)

  def interfaces(self, device: str) -> tuple[str, ...]:
    """The interfaces the registry's plugins declare for `device` (its own package's and separate interface
    plugins', e.g. a third party's WebGPU engine), in declaration order; nothing is imported or opened."""
    return tuple(self._interfaces(device.upper())) if self._interfaces is not None else ()

  # ------------------------------------------------------------- the machine, as this environment sees it
  def which(self, program: str) -> str | None:
    """`program` as the shell would find it on this environment's PATH."""
    return probing.which(program, self.get("PATH", os.defpath))

  def library_dirs(self, *extra: str) -> list[str]:
    """Where the dynamic loader looks: LD_LIBRARY_PATH, then `extra`, then the system's library folders."""
    return probing.library_dirs(self.paths("LD_LIBRARY_PATH"), *extra)

  def find_library(self, *patterns: str, dirs: Iterable[str] | None = None) -> str | None:
    """The first file matching one of `patterns` (globs like "libcuda.so*") in `dirs` (default: library_dirs())."""
    return probing.find_library(*patterns, dirs=self.library_dirs() if dirs is None else dirs)


def _range_hint(name: str, lo: Any, hi: Any, default: Any) -> str:
  if lo is not None and hi is not None: span = f"from {lo} to {hi}"
  elif lo is not None: span = f"at least {lo}"
  elif hi is not None: span = f"at most {hi}"
  else: span = "a number"
  return f"use {span}, or unset {name} for the default ({default})"


def split_device(device: str) -> tuple[str, int]:
  """"cuda:1" -> ("CUDA", 1); "CPU" -> ("CPU", 0)."""
  if not isinstance(device, str): raise TypeError(f"a device is named by a string like 'CPU' or 'CUDA:1', not {type(device).__name__}")
  name, sep, idx = device.strip().partition(":")
  if not name or (sep and not idx.isdigit()):
    raise UnknownDeviceError(f"{device!r} is not a device name", "write NAME or NAME:INDEX, e.g. 'CUDA:1'; pick compilers with DEV=CPU:LLVM")
  return name.upper(), int(idx) if sep else 0


def canonicalize(device: str) -> str:
  name, index = split_device(device)
  return name if index == 0 else f"{name}:{index}"


class DeviceInfo:
  """The device being opened, as the hooks see it."""

  def __init__(self, name: str, index: int, compiler: str, interface: Optional[str] = None, arch: str = "",
               iface_object: Any = None, state: Optional[DeviceState] = None, context: Optional[PluginContext] = None):
    self.name = name                  # "CUDA"
    self.index = index                # 1 for "CUDA:1"
    self.compiler = compiler          # the compiler chosen for it
    self.interface = interface        # the interface chosen for it, if the backend has any
    self.arch = arch                  # a target architecture the user asked for (DEV=AMD:LLVM:gfx1100), else ""
    self.iface_object = iface_object  # what plugrt_open_interface returned
    self.state = state                # what plugrt_open_device returned
    self._context = context           # the registry's context; None: the process environment, read when first asked

  @property
  def context(self) -> PluginContext:
    """The registry's environment and selection: where a backend reads its settings."""
    if self._context is None: self._context = PluginContext.from_process()
    return self._context

  def __repr__(self) -> str:
    return f"DeviceInfo({self.canonical!r}, compiler={self.compiler!r}, interface={self.interface!r}, arch={self.arch!r})"

  @property
  def canonical(self) -> str: return self.name if self.index == 0 else f"{self.name}:{self.index}"
