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
declares is an UnknownDeviceError with a "did you mean". A variable that reads like a
request with a typo in the device's name (CUDAA=1, CLL=1, CPUU_LLVM=1, AMDD_IFACE=PCI)
is no request at all: `Selection.notes` names it and the likely intent, and the registry
warns of it once (`mistyped`).
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from plugrt.errors import ConflictError, EnvError, UnknownDeviceError, did_you_mean

# Records here are NamedTuples and a plain class, not dataclasses: `import plugrt` loads this module, and a
# dataclass compiles its methods with exec at import (a NamedTuple costs far less).

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
  __slots__ = ("default", "compiler", "interface", "arch", "notes")

  def __init__(self) -> None:
    self.default: Target | None = None      # None: choose automatically
    self.compiler: dict[str, Target] = {}   # device name -> the request naming its compiler
    self.interface: dict[str, Target] = {}
    self.arch: dict[str, Target] = {}
    self.notes: tuple[str, ...] = ()        # variables that look like mistyped requests (see mistyped)

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


def _distance(a: str, b: str) -> int:
  """Edits (insert, delete, substitute, swap two neighbours) from a to b: the optimal string alignment distance."""
  prev2: list[int] = []
  prev = list(range(len(b) + 1))
  for i in range(1, len(a) + 1):
    row = [i] + [0] * len(b)
    for j in range(1, len(b) + 1):
      row[j] = min(prev[j] + 1, row[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1]))
      if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]: row[j] = min(row[j], prev2[j - 2] + 1)
    prev2, prev = prev, row
  return prev[-1]


def _typo_of(word: str, name: str) -> bool:
  """Whether `word` reads as `name` mistyped. Short names take only a doubled letter or two neighbours swapped (CLL,
  LC for CL), so that CI, CC or V (CI=1, V=1 are common) are not taken for CL or NV; names of 4 to 6 letters one edit
  (CUDAA, CUDE), longer ones two."""
  if word == name or not word: return False
  if len(name) <= 3:
    doubled = len(word) == len(name) + 1 and any(word[:i] + word[i + 1:] == name and word[i] == word[i - 1] for i in range(1, len(word)))
    return doubled or (len(word) == len(name) and _distance(word, name) == 1 and sorted(word) == sorted(name))
  return _distance(word, name) <= (1 if len(name) <= 6 else 2)


def mistyped(env: Mapping[str, str], backends: Sequence[BackendFacts]) -> list[str]:
  """The variables that read as device requests with a typo in the device's name, each with the likely intent:
  `<NAME>=1` where NAME is close to a device or an older name (CUDAA=1), `<NAME>_<COMPILER>=1` where NAME is close to a
  device that has that compiler (CPUU_LLVM=1), `<NAME>_IFACE=...` where NAME is close to a device (AMDD_IFACE=PCI).
  A name some backend declares is never one; nor is any other variable (CUDA_VISIBLE_DEVICES, CC, CI=1)."""
  names = {b.name: b for b in backends}
  older = {alias for b in backends for alias in b.aliases}
  out: list[str] = []
  for key in sorted(env):
    value = env[key].strip()
    if key in names or key in older or not re.fullmatch(r"[A-Z][A-Z0-9_]*", key): continue
    if key.endswith("_IFACE") and value:
      prefix = key[:-len("_IFACE")]
      if prefix not in names and (near := [n for n in sorted(names) if _typo_of(prefix, n)]):
        out.append(f"{key}={value} names no device; did you mean {near[0]}_IFACE={value}?")
      continue
    if value != "1": continue
    if (near := [n for n in sorted({*names, *older}) if _typo_of(key, n)]):
      out.append(f"{key}=1 is not a device; did you mean {near[0]}=1?")
      continue
    for b in sorted(backends, key=lambda b: b.name):
      prefix, _, compiler = key.rpartition("_")
      if prefix and prefix not in names and compiler in b.compilers and _typo_of(prefix, b.name):
        out.append(f"{key}=1 names no device; did you mean {b.name}_{compiler}=1?")
        break
  return out


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
  sel.notes = tuple(mistyped(env, backends))
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
