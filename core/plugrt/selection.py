"""Reading the environment: which device is the default, and with which compiler,
interface and arch each device opens.

| variable                         | meaning                                         |
| -------------------------------- | ----------------------------------------------- |
| `CPU=1`, `CUDA=1`, ...           | that device is the default                      |
| `CLANG=1`, `LLVM=1`, `GPU=1`     | older names (aliases declared by the backends)  |
| `<DEV>_<COMPILER>=1`             | the device's compiler (CPU_LLVM=1, CUDA_PTX=1)  |
| `<DEV>_IFACE=<NAME>`             | the device's interface (AMD_IFACE=PCI)          |
| `DEV=...`                        | all of it in one variable, see parse_target     |

Two requests that disagree are a ConflictError naming both; a name no backend
declares is an UnknownDeviceError with a "did you mean".
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from plugrt.errors import ConflictError, EnvError, UnknownDeviceError, did_you_mean

# Records here are NamedTuples and a plain class, not dataclasses: `import plugrt` loads this module, and a
# dataclass compiles its methods with exec at import (~1 ms a class; a NamedTuple ~0.2 ms).

class Target(NamedTuple):
  """One request: ``[IFACE[:INDICES]+]DEVICE[:COMPILER[:ARCH]]`` (tinygrad 0.14's grammar).

  plugrt also reads ``DEVICE:N[:COMPILER[:ARCH]]`` with N a number as a device index
  (``DEV=CUDA:1``), which tinygrad's grammar leaves meaningless.
  """
  device: str = ""
  index: int = 0
  compiler: str = ""
  arch: str = ""
  interface: str = ""
  iface_indices: str = ""
  source: str = ""  # the variable that said it, for messages: "DEV=CPU:LLVM"
  # (`index` hides tuple.index, which nothing here uses)

  @property
  def device_string(self) -> str: return self.device if self.index == 0 else f"{self.device}:{self.index}"

  def __str__(self) -> str:
    head = ":".join(p for p in (self.interface, self.iface_indices) if p)
    tail = ":".join(p for p in (self.device_string, self.compiler, self.arch) if p)
    return f"{head}+{tail}" if head else tail


def parse_target(text: str, source: str = "") -> Target:
  where = f" in {source}" if source else ""
  parts = text.strip().split("+")
  if len(parts) > 2: raise EnvError(f"too many '+' in target {text!r}{where}", "use [IFACE+]DEVICE[:COMPILER[:ARCH]]")
  iface = indices = ""
  if len(parts) == 2:
    iface, _, indices = parts[0].partition(":")
    iface = iface.strip().upper()
    if not iface: raise EnvError(f"empty interface before '+' in target {text!r}{where}", "write e.g. PCI+AMD")
  fields = parts[-1].strip().split(":")
  index = 0
  if len(fields) >= 2 and fields[1].isdigit():
    index = int(fields[1])
    del fields[1]
  if len(fields) > 3: raise EnvError(f"too many ':' in target {text!r}{where}", "use DEVICE[:COMPILER[:ARCH]]")
  device = fields[0].strip().upper()
  if not device: raise EnvError(f"no device in target {text!r}{where}", "name a device, e.g. DEV=CPU or DEV=CUDA:PTX")
  if not re.fullmatch(r"[A-Z][A-Z0-9_]*", device): raise EnvError(f"{device!r} is not a device name{where}", "device names are letters, digits and _")
  compiler = fields[1].strip().upper() if len(fields) > 1 else ""
  arch = fields[2].strip() if len(fields) > 2 else ""
  return Target(device, index, compiler, arch, iface, indices, source)


def parse_dev(value: str) -> list[Target]:
  """DEV: targets separated by ';'. The first names the default device."""
  return [parse_target(part, f"DEV={value}") for part in value.split(";") if part.strip()]


class BackendFacts(NamedTuple):
  """What selection needs to know of one backend (installed or only known by name)."""
  name: str
  compilers: tuple[str, ...] = ()
  interfaces: tuple[str, ...] = ()
  aliases: Mapping[str, str] = {}  # env name -> target text (read only)
  installed: bool = True


class Selection:
  """What the environment asks for: the default device, and compilers, interfaces and archs by device name."""
  __slots__ = ("default", "compiler", "interface", "arch")

  def __init__(self) -> None:
    self.default: Target | None = None      # None: choose automatically
    self.compiler: dict[str, Target] = {}   # device name -> the request naming its compiler
    self.interface: dict[str, Target] = {}
    self.arch: dict[str, Target] = {}

  def _fields(self) -> tuple: return (self.default, self.compiler, self.interface, self.arch)

  def targets(self) -> tuple[Target, ...]:
    """Every request once, the default device's first (what plugrt.context.PluginContext.targets shows plugins)."""
    out: list[Target] = [self.default] if self.default is not None else []
    for t in (*self.compiler.values(), *self.interface.values(), *self.arch.values()):
      if t not in out: out.append(t)
    return tuple(out)
  def __eq__(self, other: object) -> bool: return isinstance(other, Selection) and self._fields() == other._fields()
  __hash__ = None  # type: ignore[assignment]  # mutable

  def __repr__(self) -> str:
    return f"Selection(default={self.default!r}, compiler={self.compiler!r}, interface={self.interface!r}, arch={self.arch!r})"


def _flag(env: Mapping[str, str], name: str) -> bool:
  v = env.get(name)
  if v is None or v.strip() in ("", "0"): return False
  if v.strip() == "1": return True
  raise EnvError(f"{name}={v!r} is not 0 or 1", f"set {name}=1 to choose it, or unset it")


def select(env: Mapping[str, str], backends: Sequence[BackendFacts]) -> Selection:
  """Turn the environment into a Selection (raises EnvError, UnknownDeviceError, ConflictError)."""
  by_name = {b.name: b for b in backends}
  known = sorted(by_name)
  defaults: list[Target] = []
  settings: list[Target] = []

  def check(t: Target) -> Target:
    b = by_name.get(t.device)
    if b is None:
      raise UnknownDeviceError(f"{t.source}: no backend is named {t.device}{did_you_mean(t.device, known)}",
                               f"known devices: {', '.join(known)}")
    if t.compiler and b.installed and b.compilers and t.compiler not in b.compilers:
      raise UnknownDeviceError(f"{t.source}: {t.device} has no compiler {t.compiler}{did_you_mean(t.compiler, b.compilers)}",
                               f"{t.device} compilers: {', '.join(b.compilers)}")
    if t.interface and b.installed and t.interface not in b.interfaces:
      names = ", ".join(b.interfaces) or "none"
      raise UnknownDeviceError(f"{t.source}: {t.device} has no interface {t.interface}{did_you_mean(t.interface, b.interfaces)}",
                               f"{t.device} interfaces: {names}")
    return t

  for b in sorted(backends, key=lambda b: b.name):  # sorted: messages name variables in a stable order
    if _flag(env, b.name): defaults.append(Target(b.name, source=f"{b.name}=1"))
    for alias, text in b.aliases.items():
      if _flag(env, alias):
        t = check(parse_target(text, f"{alias}=1"))
        defaults.append(t); settings.append(t)
    for c in b.compilers:
      if _flag(env, f"{b.name}_{c}"): settings.append(Target(b.name, compiler=c, source=f"{b.name}_{c}=1"))
    if (iface := env.get(f"{b.name}_IFACE", "").strip()):
      settings.append(check(Target(b.name, interface=iface.upper(), source=f"{b.name}_IFACE={iface}")))
    # a misspelt compiler variable (CPU_LVM=1) gets a "did you mean"; unrelated ones (CUDA_VISIBLE_DEVICES) are left alone
    for key, v in env.items():
      if key.startswith(b.name + "_") and v.strip() == "1" and b.compilers:
        suffix = key[len(b.name) + 1:]
        if suffix not in b.compilers and suffix != "IFACE" and (hint := did_you_mean(suffix, b.compilers)):
          raise UnknownDeviceError(f"{key}=1: {b.name} has no compiler {suffix}{hint}", f"{b.name} compilers: {', '.join(b.compilers)}")
  if (dev := env.get("DEV", "").strip()):
    targets = [check(t) for t in parse_dev(dev)]
    if targets: defaults.append(targets[0])
    settings += targets

  sel = Selection()
  for t in defaults:
    if sel.default is not None and sel.default.device_string != t.device_string:
      raise ConflictError(f"{sel.default.source} and {t.source} ask for different default devices "
                          f"({sel.default.device_string} and {t.device_string})", "set only one of them")
    if sel.default is None: sel.default = t
  for t in settings:
    for attr, table in (("compiler", sel.compiler), ("interface", sel.interface), ("arch", sel.arch)):
      if not getattr(t, attr): continue
      prev = table.get(t.device)
      if prev is not None and getattr(prev, attr) != getattr(t, attr):
        raise ConflictError(f"{prev.source} and {t.source} ask for different {attr}s of {t.device} "
                            f"({getattr(prev, attr)} and {getattr(t, attr)})", "set only one of them")
      table.setdefault(t.device, t)
  if sel.default is not None:  # the default carries its own settings
    sel.default = sel.default._replace(compiler=sel.compiler.get(sel.default.device, sel.default).compiler,
                          interface=sel.interface.get(sel.default.device, sel.default).interface)
  return sel
