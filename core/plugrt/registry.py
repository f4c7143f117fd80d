"""The registry: finds backends, explains the unavailable ones, opens devices.

Discovery runs once per Registry (the process-wide one is built on first use, never
at `import plugrt`): read the `plugrt` entry points, apply PLUGRT_AUTOLOAD,
PLUGRT_EXTRA_PLUGINS, PLUGRT_PLUGINS and PLUGRT_DISABLE, import each plugin module,
check every hookimpl against the specs (as pluggy would: see _check_hooks), and call
its declaration hooks. Every failure is caught and kept as a typed Reason on that
plugin's backends. Hooks are called per plugin (a plugin's own impl only), so one
broken plugin never sees, or breaks, another's calls.

Plugin code that may hang (imports, declaration hooks, probes, opens) runs on a worker
thread under a time limit (PLUGRT_PROBE_TIMEOUT, PLUGRT_OPEN_TIMEOUT); see _Runner.
"""
from __future__ import annotations

import contextlib
import fnmatch
import importlib
import os
import re
import sys
import warnings
from _thread import TIMEOUT_MAX, RLock, allocate_lock, get_ident, start_new_thread  # threading's, without importing threading
from collections.abc import Iterator, Sequence
from types import BuiltinFunctionType, BuiltinMethodType, FunctionType, MethodType, ModuleType
from typing import Any

from plugrt import hookspecs, opened
from plugrt._entrypoints import entry_points, foreign_modules, import_warning, name_warning, skipped, value_warning
from plugrt.context import DeviceInfo, PluginContext
from plugrt.errors import DeviceUnavailable, EnvError, EnvWarning, PluginError, PlugrtError, Reason, UnknownDeviceError, did_you_mean
from plugrt.hookspecs import PLUGIN_API_VERSION, BackendSpec, DeviceListing, InterfaceSpec, Probe
from plugrt.probing import install_hint
from plugrt.selection import BackendFacts, Selection, Target, parse_target, select

GROUP = "plugrt"

#: First-party backends: so that `plugrt devices` can say which package to install,
#: and older names (GPU=1) are understood before their package is.
FIRST_PARTY: dict[str, tuple[str, dict[str, str]]] = {
  "CPU": ("plugrt-cpu", {"CLANG": "CPU:CLANG", "LLVM": "CPU:LLVM"}),
  "CUDA": ("plugrt-cuda", {}),
  "NV": ("plugrt-nv plugrt-nv-nvk", {}),  # the device package and its kernel-driver interface
  "AMD": ("plugrt-amd plugrt-amd-kfd", {}),  # the device package and its kernel-driver interface
  "QCOM": ("plugrt-qcom", {}),
  "METAL": ("plugrt-metal", {}),
  "CL": ("plugrt-cl", {"GPU": "CL"}),
  "WEBGPU": ("plugrt-webgpu plugrt-webgpu-wgpu", {}),  # the device package and an engine
}

DEFAULT_HINTS = {
  Reason.IMPORT_ERROR: "reinstall {package}, or disable it with PLUGRT_DISABLE={entry}",
  Reason.HOOK_ERROR: "report this to {package}'s authors, or disable it with PLUGRT_DISABLE={entry}",
  Reason.INCOMPATIBLE_API: "install versions of plugrt and {package} made for each other",
  Reason.NAME_CONFLICT: "uninstall one of them, or disable one with PLUGRT_DISABLE=<entry point>",
  Reason.DISABLED: "unset {variable}, or change it",
  Reason.BAD_NAME: "report this to {package}'s authors, or disable it with PLUGRT_DISABLE={entry}",
  Reason.TIMED_OUT: "{package} ({entry}) may be waiting on a driver or a lock: raise {variable} (seconds; 0: no limit) "
                    "if it is only slow, or disable it with PLUGRT_DISABLE={entry}",
}

#: Time limits on plugin code, in seconds (0: none): imports, declaration hooks and probes; opens (a GPU context can take a while).
PROBE_TIMEOUT, OPEN_TIMEOUT = "PLUGRT_PROBE_TIMEOUT", "PLUGRT_OPEN_TIMEOUT"
DEFAULT_TIMEOUTS = {PROBE_TIMEOUT: 10.0, OPEN_TIMEOUT: 60.0}

#: Device, compiler, interface and alias names: environment variable names (CPU=1, CPU_LLVM=1, NV_IFACE=NVK) and parts of
#: DEV=[IFACE+]DEVICE[:COMPILER[:ARCH]], which upper-cases what it reads; ':' ';' '+' or a space would split them apart.
_NAME = re.compile(r"[A-Z][A-Z0-9_]*")
NAME_RULE = "a name is an upper-case letter, then upper-case letters, digits or _ (e.g. CPU, CUDA_PTX)"


class PluginRecord:
  """One plugin module, found through an entry point, PLUGRT_EXTRA_PLUGINS, or given explicitly."""
  # plain classes, not dataclasses, for this module's records: `import plugrt` loads it, and a dataclass
  # compiles its methods with exec at import

  def __init__(self, entry: str, module_name: str, dist: str = "", version: str = "", source: str = "entry point",
               module: ModuleType | None = None):
    self.entry, self.module_name, self.dist, self.version, self.source, self.module = entry, module_name, dist, version, source, module
    self.hooks: ModuleType | None = None  # the module's hook functions alone (see _hook_functions)
    self.impls: dict[str, tuple[Any, tuple[str, ...]]] = {}  # hook name -> (function, the argument names it takes)
    self.reason: Reason | None = None
    self.detail = self.hint = ""
    self.backends: list[BackendSpec] = []
    self.interfaces: list[InterfaceSpec] = []
    self.declared: list[str] = []  # backend names it declared, kept when it is refused after declaring
    self.stalled: Probe | None = None  # set when its code overran a time limit: none of it runs again in this process
    self.warnings: list[str] = []  # mistakes that do not stop it loading (`plugrt devices` shows them)

  def __repr__(self) -> str: return f"<PluginRecord {self.entry} ({self.module_name}){f' {self.reason.value}' if self.reason else ''}>"

  @property
  def package(self) -> str: return self.dist or self.module_name

  def fail(self, reason: Reason, detail: str, hint: str = "", **fmt: str) -> None:
    self.reason, self.detail = reason, detail
    self.hint = hint or DEFAULT_HINTS.get(reason, "").format(package=self.package, entry=self.entry, **fmt)


class BackendRecord:
  """One device kind: declared by a plugin, or known by name but not installed."""

  def __init__(self, name: str, plugin: PluginRecord | None = None, reason: Reason | None = None, detail: str = "",
               hint: str = "", claimants: list[PluginRecord] | None = None):
    self.name, self.plugin, self.reason, self.detail, self.hint = name, plugin, reason, detail, hint
    self.spec: BackendSpec | None = None
    self.claimants: list[PluginRecord] = claimants if claimants is not None else []
    self.open_error: PlugrtError | None = None  # set when an automatic choice tried it and failed

  def __repr__(self) -> str: return f"<BackendRecord {self.name}{f' {self.reason.value}' if self.reason else ''}>"

  @property
  def package(self) -> str:
    if self.plugin is not None: return self.plugin.package
    return FIRST_PARTY.get(self.name, ("?", {}))[0]

  @property
  def version(self) -> str: return self.plugin.version if self.plugin is not None else ""
  @property
  def priority(self) -> int: return self.spec.priority if self.spec is not None else 0


def _env_bool(env: dict[str, str], name: str, default: bool) -> bool:
  v = env.get(name, "").strip()
  if v == "": return default
  if v in ("0", "1"): return v == "1"
  raise EnvError(f"{name}={v!r} is not 0 or 1", f"set {name}=0 or {name}=1, or unset it")


def _env_seconds(env: dict[str, str], name: str) -> float:
  v, default = env.get(name, "").strip(), DEFAULT_TIMEOUTS[name]
  if v == "": return default
  try: seconds = float(v)
  except ValueError: seconds = -1.0
  if not 0 <= seconds < float("inf"):  # NaN fails this too
    raise EnvError(f"{name}={v!r} is not a number of seconds",
                   f"set {name} to a time limit in seconds (default {default:g}; 0: no limit), or unset it")
  return seconds


def _names(value: str) -> list[str]: return [p.strip() for p in value.split(",") if p.strip()]


def _short_error(e: BaseException) -> str:
  import traceback
  tb = traceback.extract_tb(e.__traceback__)
  where = f" at {os.path.basename(tb[-1].filename)}:{tb[-1].lineno}" if tb else ""
  return f"{type(e).__name__}: {e}{where}"


class Registry:
  """The backends and devices of one configuration (one environment, one plugin set)."""

  def __init__(self, plugins: Sequence[ModuleType | str] | None = None, env: dict[str, str] | None = None,
               autoload: bool | None = None):
    """plugins: modules (or module names) to load besides what autoload finds. Passing a
    list turns autoload off unless autoload=True is given. env: the environment to
    read (default: os.environ, read now)."""
    self.env = dict(os.environ if env is None else env)
    self._explicit = list(plugins or [])
    self._autoload = autoload if autoload is not None else (None if plugins is None else False)
    self._lock = RLock()
    self._loaded = False
    self.plugins: list[PluginRecord] = []
    self.backends: dict[str, BackendRecord] = {}
    self.interfaces: dict[str, list[tuple[InterfaceSpec, PluginRecord]]] = {}
    self.skipped: list[str] = []  # installed distributions left out because their metadata cannot be read, and why
    self._probes: dict[Any, Probe] = {}
    self._selection: Selection | None = None
    self._devices: dict[str, Any] = {}
    self._default: str | None = None
    self._probe_limit, self._open_limit = DEFAULT_TIMEOUTS[PROBE_TIMEOUT], DEFAULT_TIMEOUTS[OPEN_TIMEOUT]
    #: what probes and hooks see: the environment given, and nothing of the process's; without one, the process
    #: environment itself, so a setting read where it is used (PLUGRT_CACHE_DIR at a compile) sees a later change
    self.context = PluginContext(os.environ if env is None else self.env, lambda: self.selection.targets(),
                                 lambda device: [i.name for i, _ in self.interfaces.get(device, ())])
    self._plugin_manager: Any = None
    self._declared: dict[str, list[tuple[Any, PluginRecord]]] = {}  # optional declaration hook -> (spec, plugin), read once
    self._declaration_failures: dict[str, list[tuple[PluginRecord, Probe]]] = {}  # hook -> (plugin, why its declarations are missing)

  # ------------------------------------------------------------ discovery
  def load(self) -> Registry:
    _refuse_reentry()  # before the lock: the thread that holds it may be waiting on this plugin
    with self._lock:
      if not self._loaded:
        self._discover()
        self._loaded = True
    return self

  def _discover(self) -> None:
    env = self.env
    self._probe_limit, self._open_limit = _env_seconds(env, PROBE_TIMEOUT), _env_seconds(env, OPEN_TIMEOUT)
    autoload = self._autoload if self._autoload is not None else _env_bool(env, "PLUGRT_AUTOLOAD", True)
    records: list[PluginRecord] = []
    if autoload:
      for ep in entry_points(GROUP):
        records.append(rec := PluginRecord(ep.name, ep.module, ep.dist, ep.version))
        if (w := value_warning(ep)): rec.warnings.append(w)
      self.skipped = list(skipped(GROUP))
    records += [PluginRecord(m, m, source="PLUGRT_EXTRA_PLUGINS") for m in _names(env.get("PLUGRT_EXTRA_PLUGINS", ""))]
    for p in self._explicit:
      name = p if isinstance(p, str) else getattr(p, "__name__", type(p).__name__)  # a module, or an object with hook methods
      records.append(PluginRecord(name.rsplit(".", 1)[-1], name, source="explicit", module=None if isinstance(p, str) else p))
    seen: set[str] = set()
    for rec in records:
      if rec.module_name in seen: continue  # the same module found twice (entry point and PLUGRT_EXTRA_PLUGINS)
      seen.add(rec.module_name)
      self.plugins.append(rec)
      if not self._enabled(rec, (rec.entry, rec.dist, rec.module_name)): continue
      self._load_plugin(rec)
    self._collect_backends()

  def _enabled(self, rec: PluginRecord, names: Sequence[str]) -> bool:
    """Apply PLUGRT_PLUGINS (allow-list) and PLUGRT_DISABLE (globs) to a plugin's names."""
    names = [n.lower() for n in names if n]
    allow = [a.lower() for a in _names(self.env.get("PLUGRT_PLUGINS", ""))]
    if allow and not any(n == a or fnmatch.fnmatchcase(n, a) for n in names for a in allow):
      rec.fail(Reason.DISABLED, f"not in PLUGRT_PLUGINS={self.env['PLUGRT_PLUGINS']}", variable="PLUGRT_PLUGINS")
      return False
    for glob in _names(self.env.get("PLUGRT_DISABLE", "")):
      if any(fnmatch.fnmatchcase(n, glob.lower()) for n in names):
        rec.fail(Reason.DISABLED, f"matches PLUGRT_DISABLE={self.env['PLUGRT_DISABLE']}", variable="PLUGRT_DISABLE")
        return False
    return True

  def _load_plugin(self, rec: PluginRecord) -> None:
    given, stage = rec.module, ["importing"]

    def discover() -> tuple[ModuleType, ModuleType, Any, set[str]]:  # on the worker; one hand-over per plugin (each costs a thread switch)
      before = set(sys.modules) if given is None else set()
      module = given if given is not None else importlib.import_module(rec.module_name)
      imported = sys.modules.keys() - before if given is None else set()  # what the entry module pulled in (the import rule)
      stage[0] = "declaring its backends"
      hooks = _hook_functions(module)
      try: declared: Any = _declarations(hooks)
      except (Exception, SystemExit) as e: declared = e  # reported after the hooks' signatures are checked
      return module, hooks, declared, imported
    try:
      rec.module, rec.hooks, declared, imported = self._run(rec, "being discovered", discover, limit=self._probe_limit)
    except _Overran as e:
      rec.fail(Reason.TIMED_OUT, f"module {rec.module_name} {e} ({stage[0]})", variable=PROBE_TIMEOUT)
      return
    except (Exception, SystemExit) as e:  # a plugin must never take plugrt down with it
      missing = isinstance(e, ModuleNotFoundError) and e.name and (rec.module_name == e.name or rec.module_name.startswith(e.name + "."))
      kind = "is not installed" if missing else "failed to import"
      rec.fail(Reason.IMPORT_ERROR, f"module {rec.module_name} {kind}: {_short_error(e)}", e.hint if isinstance(e, PlugrtError) else "")
      return
    impls, bad_args, unknown = _check_hooks(rec.hooks)
    if bad_args:
      rec.fail(Reason.HOOK_ERROR, f"hook validation failed: {'; '.join(bad_args)}")
      return
    try:
      if isinstance(declared, BaseException): raise declared
      backends, interfaces = declared
      for b in backends:
        if not isinstance(b, BackendSpec): raise TypeError(f"plugrt_backends returned {type(b).__name__}, not BackendSpec")
      for i in interfaces:
        if not isinstance(i, InterfaceSpec): raise TypeError(f"plugrt_interfaces returned {type(i).__name__}, not InterfaceSpec")
    except (Exception, SystemExit) as e:
      rec.fail(Reason.HOOK_ERROR, f"declaration hook raised {_short_error(e)}", e.hint if isinstance(e, PlugrtError) else "")
      return
    # a bad name never becomes a device (it would split apart in DEV=...): the plugin is explained under its entry point's name
    rec.declared = [b.name for b in backends if _valid_name(b.name) and b.name != "DEV"]
    if (bad := _bad_names(backends, interfaces)):
      rec.fail(Reason.BAD_NAME, f"declares {'; '.join(bad)}: {NAME_RULE}")
      return
    if imported and (w := import_warning(rec.module_name, foreign_modules(imported, rec.module_name))): rec.warnings.append(w)
    if rec.source == "entry point" and (w := name_warning(rec.entry, rec.declared)): rec.warnings.append(w)
    for b in backends:
      if (problem := _api_problem(b.api_version)):
        rec.fail(Reason.INCOMPATIBLE_API, f"{b.name} is written for plugin API {b.api_version!r}, plugrt implements "
                 f"{PLUGIN_API_VERSION[0]}.{PLUGIN_API_VERSION[1]}: {problem}")
        return
    if unknown:  # a hookimpl without a spec: a typo, or a newer API
      rec.fail(Reason.HOOK_ERROR, f"implements a hook plugrt does not define: {'; '.join(unknown)}")
      return
    missing = [h for h in hookspecs.REQUIRED_DEVICE_HOOKS if backends and h not in impls]
    if missing:
      rec.fail(Reason.HOOK_ERROR, f"declares {', '.join(b.name for b in backends)} but does not implement {', '.join(missing)}")
      return
    rec.backends, rec.interfaces, rec.impls = list(backends), list(interfaces), impls

  def _collect_backends(self) -> None:
    for rec in self.plugins:
      for b in rec.backends:
        br = self.backends.setdefault(b.name, BackendRecord(b.name))
        br.claimants.append(rec)
        if br.spec is None: br.spec, br.plugin = b, rec
        if not self._enabled(rec, (rec.entry, rec.dist, rec.module_name, b.name)):  # PLUGRT_DISABLE=cuda also matches a backend by its name
          br.reason, br.detail, br.hint = rec.reason, rec.detail, rec.hint
          rec.reason = None
      for i in rec.interfaces: self.interfaces.setdefault(i.device, []).append((i, rec))
    for br in self.backends.values():
      for k, i in enumerate(br.spec.interfaces if br.spec else ()):  # its own first, in their declared order
        self.interfaces.setdefault(br.name, []).insert(k, (i, br.plugin))  # type: ignore[arg-type]
      self.interfaces[br.name] = sorted(self.interfaces.get(br.name, []), key=lambda ir: -ir[0].priority)  # stable
      if len(br.claimants) > 1:
        who = " and ".join(f"{p.package} {p.version} ({p.module_name})".replace("  ", " ") for p in br.claimants)
        br.reason, br.detail = Reason.NAME_CONFLICT, f"{br.name} is declared by {who}"
        br.hint = DEFAULT_HINTS[Reason.NAME_CONFLICT]
    # plugins that never declared anything still explain the device they were meant to be
    for rec in self.plugins:
      if rec.reason is None: continue
      for name in rec.declared or [rec.entry.upper()]:
        if name in self.backends and self.backends[name].reason is None and self.backends[name].spec is not None: continue
        self.backends[name] = BackendRecord(name, rec, rec.reason, rec.detail, rec.hint, [rec])
    for name, (package, _) in FIRST_PARTY.items():
      if name not in self.backends:
        self.backends[name] = BackendRecord(name, None, Reason.NOT_INSTALLED, f"{package.split()[0]} is not installed",
                                            install_hint(*package.split()))

  # ------------------------------------------------------------ calling one plugin's hooks
  def declared(self, hook: str, kind: type) -> list[tuple[Any, PluginRecord]]:
    """(spec, plugin) for each `kind` that a loaded plugin's optional declaration hook `hook` returns
    (plugrt_video_decoders, plugrt_collective_engines), in plugin order, read once per registry. Each plugin's hook runs
    as its probes do (on the worker under PLUGRT_PROBE_TIMEOUT, its output moved to stderr, the registry refused to it).
    One that raises, overruns or returns anything but a list of well-formed `kind`s contributes nothing and is listed
    in declaration_failures(hook) with its reason; the other plugins' declarations stand."""
    self.load()
    with self._lock:
      if (found := self._declared.get(hook)) is None:
        found, failed = [], []
        for rec in self.plugins:
          if rec.reason is not None or rec.hooks is None or hook not in rec.impls: continue
          if rec.stalled is not None:
            failed.append((rec, rec.stalled))
            continue
          try:
            specs = self.run_plugin(rec, f"declaring its {hook.removeprefix('plugrt_').replace('_', ' ')}", _declared_specs,
                                    self.call_hook, rec, hook, kind, limit=self._probe_limit, variable=PROBE_TIMEOUT)
          except PluginTimeout as e: failed.append((rec, e.probe))
          except (Exception, SystemExit) as e:
            why = str(e) if isinstance(e, _Malformed) else f"raised {_short_error(e)}"
            failed.append((rec, Probe.missing(Reason.HOOK_ERROR, f"{hook} of plugin {rec.entry} ({rec.module_name}) {why}",
                                              DEFAULT_HINTS[Reason.HOOK_ERROR].format(package=rec.package, entry=rec.entry))))
          else: found += [(s, rec) for s in specs]
        self._declared[hook], self._declaration_failures[hook] = found, failed
    return found

  def declaration_failures(self, hook: str) -> list[tuple[PluginRecord, Probe]]:
    """(plugin, why) for each plugin whose `hook` raised, overran its limit or returned garbage (see declared)."""
    if hook not in self._declaration_failures: raise KeyError(f"{hook} has not been read: call declared() first")
    return self._declaration_failures[hook]

  def run_plugin(self, rec: PluginRecord | None, doing: str, fn: Any, *args: Any, limit: float | None = None,
                 variable: str = OPEN_TIMEOUT, hint: str = "") -> Any:
    """fn(*args), plugin `rec`'s code, run as probes and opens run: on the worker within `limit` seconds (default
    PLUGRT_OPEN_TIMEOUT; 0: no limit, on this thread), what it prints moved to stderr, the registry refused to it. Its
    own exceptions pass through. Past the limit the plugin is stalled for the process (none of its code runs again: its
    worker may hold its locks) and PluginTimeout is raised, now and on every later call; `variable` and `hint` are the
    setting and the fix its message names (default: raise `variable`, or PLUGRT_DISABLE the plugin)."""
    if rec is not None and rec.stalled is not None: raise PluginTimeout(rec.stalled)
    try: return self._run(rec, doing, fn, *args, limit=self._open_limit if limit is None else limit)
    except _Overran as e:
      who = f"plugin {rec.entry} ({rec.module_name})" if rec is not None else "a plugin"
      raise PluginTimeout(self._stall(rec, f"{who} {e} while {doing}", variable, hint)) from None

  def call_hook(self, rec: PluginRecord, hook: str, **kwargs: Any) -> Any:
    """Call plugin `rec`'s implementation of `hook` directly (no pluggy dispatch), or return None when it has none.
    It gets the arguments it names, as pluggy passes them. Only for building objects: nothing calls a hook per launch."""
    if (impl := rec.impls.get(hook)) is None: return None
    function, argnames = impl
    return function(*[kwargs[a] for a in argnames])

  @property
  def plugin_manager(self) -> Any:
    """A pluggy PluginManager holding the specs and every plugin that loaded, for tools that want pluggy's view
    (``reg.plugin_manager.hook.plugrt_backends()``). Built on first use: discovery itself never imports pluggy."""
    self.load()
    with self._lock:
      if self._plugin_manager is None:
        import pluggy
        pm = pluggy.PluginManager(hookspecs.PROJECT)
        pm.add_hookspecs(hookspecs)
        for rec in self.plugins:
          if rec.impls: pm.register(rec.hooks, name=f"{rec.source}:{rec.module_name}")
        self._plugin_manager = pm
    return self._plugin_manager

  # ------------------------------------------------------------ selection and probing
  @property
  def selection(self) -> Selection:
    self.load()
    if self._selection is None:
      facts = []
      for br in self.backends.values():
        ifaces = tuple(i.name for i, _ in self.interfaces.get(br.name, ()))
        if br.spec is not None:
          facts.append(BackendFacts(br.name, tuple(c.name for c in br.spec.compilers), ifaces,
                                    {a.env: a.target for a in br.spec.aliases}, True))
        else: facts.append(BackendFacts(br.name, (), ifaces, FIRST_PARTY.get(br.name, ("", {}))[1], False))
      self._selection = select(self.env, facts)
      for note in self._selection.notes: warnings.warn(f"plugrt: {note}", EnvWarning, stacklevel=2)  # once: selection is made once
    return self._selection

  def declared_status(self, kind: str, spec: Any, rec: PluginRecord | None) -> dict[str, Any]:
    """What `plugrt devices` shows of a spec from a declaration hook (a video decoder, a collective engine), after its
    probe (run once per registry under `kind`): device, package, available, reason, detail, hint, description."""
    p = self._probe((kind, spec.name), spec.probe, rec)
    return {"device": spec.device or "any", "package": rec.package if rec is not None else "plugrt", "available": p.ok,
            "reason": p.reason.value if p.reason else None, "detail": p.detail, "hint": p.hint, "description": spec.description}

  def _probe(self, key: Any, fn: Any, rec: PluginRecord | None) -> Probe:
    if rec is not None and rec.stalled is not None: return rec.stalled
    if key not in self._probes:
      what = " ".join(key[:1] + key[2:]) if key[0] != "backend" else "its probe"  # "compiler LLVM", "iface NVK"
      try:
        args = (self.context,) if fn is not None and takes_context(fn) else ()
        p = self._run(rec, f"running {what}", fn, *args, limit=self._probe_limit) if fn is not None else Probe.found()
        if not isinstance(p, Probe): raise TypeError(f"probe returned {type(p).__name__}, not Probe")
        if (bad := next((d for d in p.devices if not isinstance(d, DeviceListing)), None)) is not None:
          raise TypeError(f"probe listed a device as {type(bad).__name__}, not plugrt.hookspecs.DeviceListing")
      except _Overran as e:
        return self._stall(rec, f"{what} of {key[1]} {e}", PROBE_TIMEOUT)
      except (Exception, SystemExit) as e:
        p = Probe.missing(Reason.HOOK_ERROR, f"probe raised {_short_error(e)}", "report this to the plugin's authors")
      self._probes[key] = p
    return self._probes[key]

  def _stall(self, rec: PluginRecord | None, detail: str, variable: str, hint: str = "") -> Probe:
    """After plugin code overran its limit, the plugin is unavailable for this process: its worker may still hold its locks."""
    if rec is None: return Probe.missing(Reason.TIMED_OUT, detail, hint)
    hint = hint or DEFAULT_HINTS[Reason.TIMED_OUT].format(package=rec.package, entry=rec.entry, variable=variable)
    rec.stalled = Probe.missing(Reason.TIMED_OUT, detail, hint)
    return rec.stalled

  def probe(self, name: str) -> Probe:
    """The backend's own probe, or a failed Probe carrying its discovery reason."""
    br = self.backend(name)
    if br.reason is not None or br.spec is None: return Probe.missing(br.reason or Reason.NOT_INSTALLED, br.detail, br.hint)
    return self._probe(("backend", name), br.spec.probe, br.plugin)

  def compiler_probe(self, name: str, compiler: str) -> Probe:
    br = self.backend(name)
    spec = next(c for c in br.spec.compilers if c.name == compiler)  # type: ignore[union-attr]
    return self._probe(("compiler", name, compiler), spec.probe, br.plugin)

  def interface_probe(self, spec: InterfaceSpec) -> Probe:
    rec = next((r for i, r in self.interfaces.get(spec.device, ()) if i is spec), None)
    return self._probe(("iface", spec.device, spec.name), spec.probe, rec)

  def _run(self, rec: PluginRecord | None, doing: str, fn: Any, *args: Any, limit: float) -> Any:
    who = f"plugin {rec.entry} ({rec.module_name})" if rec is not None else "a plugin"
    return _runner.call(f"{who} while {doing}", fn, args, limit)

  def _ordered(self) -> list[BackendRecord]:
    """Automatic-choice order: priority, then name."""
    return sorted(self.backends.values(), key=lambda b: (-b.priority, b.name))

  def backend(self, name: str) -> BackendRecord:
    self.load()
    if (br := self.backends.get(name.upper())) is None:
      raise UnknownDeviceError(f"no backend is named {name}{did_you_mean(name, self.backends)}",
                               f"known devices: {', '.join(sorted(self.backends))}")
    return br

  def available(self) -> list[str]:
    """Names of the backends whose probe finds a device, in automatic-choice order."""
    self.load()
    return [b.name for b in self._ordered() if self.probe(b.name).ok]

  # ------------------------------------------------------------ choosing compilers and interfaces
  def choose_compiler(self, name: str) -> tuple[str, str]:
    """(compiler, note): the requested compiler, else the first whose toolchain is present."""
    spec = self.backend(name).spec
    assert spec is not None
    if not spec.compilers: return "", ""
    req = self.selection.compiler.get(name)
    if req is not None:
      p = self.compiler_probe(name, req.compiler)
      if not p.ok:
        raise DeviceUnavailable(f"{req.source}: compiler {req.compiler} of {name} cannot be used: {p.detail}",
                                p.reason or Reason.MISSING_TOOLCHAIN, p.hint, self._others(name))
      return req.compiler, ""
    skipped = []
    for c in spec.compilers:
      p = self.compiler_probe(name, c.name)
      if p.ok: return c.name, "; ".join(skipped)
      skipped.append(f"{c.name} unavailable ({p.detail})")
    first = self.compiler_probe(name, spec.compilers[0].name)
    raise DeviceUnavailable(f"{name} has no usable compiler: {'; '.join(skipped)}", Reason.MISSING_TOOLCHAIN, first.hint, self._others(name))

  def choose_interface(self, name: str) -> tuple[InterfaceSpec, PluginRecord] | None:
    cands = self.interfaces.get(name, [])
    if not cands: return None
    req = self.selection.interface.get(name)
    if req is not None:
      spec, rec = next((i, r) for i, r in cands if i.name == req.interface)
      p = self.interface_probe(spec)
      if not p.ok: raise DeviceUnavailable(f"{req.source}: interface {spec.name} of {name} cannot be used: {p.detail}",
                                           p.reason or Reason.NO_DEVICE, p.hint, self._others(name))
      return spec, rec
    why = []
    for spec, rec in cands:
      if not spec.auto:
        why.append(f"{spec.name} is never chosen automatically (set {name}_IFACE={spec.name})")
        continue
      if (p := self.interface_probe(spec)).ok: return spec, rec
      why.append(f"{spec.name}: {p.detail}")
    raise DeviceUnavailable(f"{name} has no usable interface: {'; '.join(why)}", Reason.NO_DEVICE,
                            f"install a driver for {name}, or pick an interface with {name}_IFACE", self._others(name))

  # ------------------------------------------------------------ opening devices
  def alias_target(self, device: str) -> Target | None:
    """The target an older device name stands for (CLANG -> CPU:CLANG, GPU -> CL), as its backend declares
    it (or, for a backend not installed, as plugrt knows it); None for any other name."""
    from plugrt.context import split_device
    name = split_device(device)[0]
    if name in self.load().backends and self.backends[name].spec is not None: return None  # a backend's own name wins
    for br in self.backends.values():
      aliases = {a.env: a.target for a in br.spec.aliases} if br.spec is not None else FIRST_PARTY.get(br.name, ("", {}))[1]
      if name in aliases: return parse_target(aliases[name], name)
    return None

  def open(self, device: str) -> Any:
    """The opened device for "NAME" or "NAME:INDEX" (cached: opening happens once).

    An older name opens what it stands for: Device["GPU"] is Device["CL"]; Device["CLANG"] and Device["LLVM"]
    are Device["CPU"] when CPU's compiler already is that one, else CPU opened with it as a device of its
    own, canonically named as written ("LLVM"), so that Device[t.device] gives it back."""
    from plugrt.context import split_device
    name, index = split_device(device)
    key = name if index == 0 else f"{name}:{index}"
    if (dev := self._devices.get(key)) is not None: return dev
    self.load()  # refuses a plugin's own code before the lock (see _refuse_reentry)
    with self._lock:
      if (dev := self._devices.get(key)) is not None: return dev
      if (alias := self.alias_target(name)) is not None:
        target = alias.device if index == 0 else f"{alias.device}:{index}"
        dev = self.open(target)  # the device's own errors (not installed, no device), named by the backend
        if alias.compiler and alias.compiler != dev.info.compiler:
          p = self.compiler_probe(alias.device, alias.compiler)
          if not p.ok: raise DeviceUnavailable(f"{key} ({alias.device} with {alias.compiler}) cannot be used: {p.detail}",
                                               p.reason or Reason.MISSING_TOOLCHAIN, p.hint, self._others(alias.device))
          dev = self._open_backend(alias.device, index, key, alias.compiler)
        self._devices[key] = dev
        return dev
      dev = self._open_backend(name, index, key)
      self._devices[key] = dev
      return dev

  def _open_backend(self, name: str, index: int, key: str, compiler: str = "") -> Any:
    """Open device `index` of backend `name` (with `compiler`, else the chosen one) as the device called `key`."""
    with self._lock:
      br = self.backend(name)
      p = self.probe(name)
      if not p.ok: raise DeviceUnavailable(f"{key} cannot be used: {p.detail}", p.reason or Reason.NO_DEVICE, p.hint, self._others(name))
      if index >= max(p.count, 1):
        indices = "index 0" if p.count == 1 else f"indices 0-{p.count - 1}"
        listed = "".join(f"; {name}:{d.index} is {d.name}" + (f" at {d.bus_id}" if d.bus_id else "") for d in p.devices)
        raise DeviceUnavailable(f"{key} does not exist: {name} has {p.count} device{'s' if p.count != 1 else ''} here ({indices}: "
                                f"{p.detail}){listed}", Reason.NO_DEVICE, f"use an index below {p.count} (`plugrt devices` lists them)",
                                [f"{name}:{i}" for i in range(p.count)] + self._others(name))  # the indices that exist first
      chosen, _ = self.choose_compiler(name)  # also when `compiler` is given: it checks the environment's request
      compiler = compiler or chosen
      iface = self.choose_interface(name)
      arch = self.selection.arch.get(name)
      info = DeviceInfo(name, index, compiler, iface[0].name if iface else None, arch.arch if arch else "", context=self.context)
      rec = br.plugin
      assert rec is not None and br.spec is not None
      running = [rec]  # whose hook the worker is in, to blame the right plugin if it overruns

      def open_hooks() -> tuple[Any, Any]:  # on the worker: returns what it made, and changes nothing here
        iface_object = None
        if iface is not None and iface[1] is not rec:
          running[0] = iface[1]
          iface_object = self.call_hook(iface[1], "plugrt_open_interface", device=info, interface=iface[0].name)
          running[0] = rec
        info.iface_object = iface_object
        return iface_object, self.call_hook(rec, "plugrt_open_device", device=info)
      try:
        info.iface_object, info.state = self._run(rec, f"opening {key}", open_hooks, limit=self._open_limit)
        dev = opened.RuntimeDevice(self, br, info)
      except _Overran as e:
        stalled = self._stall(running[0], f"opening {key} (plugin {running[0].entry}'s open hook) {e}", OPEN_TIMEOUT)
        raise DeviceUnavailable(stalled.detail, Reason.TIMED_OUT, stalled.hint, self._others(name)) from None
      except PlugrtError: raise
      except (Exception, SystemExit) as e:
        raise DeviceUnavailable(f"{key} failed to open: {_short_error(e)}", Reason.OPEN_FAILED,
                                f"see the error above; PLUGRT_DISABLE={rec.entry} hides {name}", self._others(name)) from e
      dev.canonical = key
      return dev

  def _others(self, name: str) -> list[str]: return [n for n in self.available() if n != name]

  def build(self, info: DeviceInfo, br: BackendRecord, hook: str, **kwargs: Any) -> Any:
    """Call one of the device's factory hooks (used by RuntimeDevice, once per object)."""
    assert br.plugin is not None
    try: obj = self.call_hook(br.plugin, hook, device=info, **kwargs)
    except PlugrtError: raise
    except (Exception, SystemExit) as e:
      raise DeviceUnavailable(f"{info.canonical}: {hook} raised {_short_error(e)}", Reason.HOOK_ERROR,
                              f"report this to {br.package}'s authors", self._others(info.name)) from e
    if obj is None: raise DeviceUnavailable(f"{info.canonical}: {hook} returned nothing", Reason.HOOK_ERROR,
                                            f"report this to {br.package}'s authors", self._others(info.name))
    return obj

  @property
  def default(self) -> str:
    """The default device: the one the environment names (failing loudly), else the first that opens."""
    if self._default is not None: return self._default
    self.load()
    with self._lock:
      sel = self.selection
      if sel.default is not None:
        self.open(sel.default.device_string)
        self._default = sel.default.device_string
        return self._default
      for br in self._ordered():  # probing one at a time: a lower-priority backend's probe never delays a ready one
        if not self.probe(br.name).ok: continue
        try:
          self.open(br.name)
        except EnvError: raise  # a variable plugrt cannot use is the user's to fix, whichever device reads it: never "no device"
        except PlugrtError as e:
          br.open_error = e  # automatic choice is quiet: remember why, try the next
          continue
        self._default = br.name
        return br.name
      raise DeviceUnavailable("no device is available", Reason.NO_DEVICE, "run `plugrt devices` to see why each backend is unavailable")

  def close(self) -> None:
    for dev in {id(d): d for d in self._devices.values()}.values(): dev.close()  # an older name may share its device
    self._devices.clear()


def takes_context(probe: Any) -> bool:
  """Whether a probe takes the plugin context (plugin API 1.2: ``def probe(ctx)``) or nothing (1.0, 1.1: ``def probe()``),
  read from its code object: a positional parameter, default or not, receives the context."""
  fn = getattr(probe, "__func__", probe)
  code = getattr(fn, "__code__", None)
  if code is None: code = getattr(getattr(type(probe), "__call__", None), "__code__", None)  # noqa: B004  # a callable object
  if code is None: return False  # a builtin or a partial: called with nothing, as before 1.2
  bound = 1 if getattr(probe, "__self__", None) is not None or getattr(fn, "__code__", None) is None else 0
  return code.co_argcount - bound >= 1


_ROUTINES = (FunctionType, MethodType, BuiltinFunctionType, BuiltinMethodType)


def _hook_functions(module: ModuleType) -> ModuleType:
  """A stand-in module holding only `module`'s functions marked @hookimpl: what discovery checks and calls, and what
  Registry.plugin_manager registers with pluggy (which would otherwise getattr_static every import and helper of
  the plugin's module).
  """
  marker = f"{hookspecs.PROJECT}_impl"  # the attribute plugrt's hookimpl (and pluggy's HookimplMarker) sets
  hooks = ModuleType(getattr(module, "__name__", type(module).__name__), getattr(module, "__doc__", None))
  for name in dir(module):  # dir, not vars: a plugin given as an object has its hooks as methods
    try:
      value = getattr(module, name)
      marked = isinstance(value, _ROUTINES) and getattr(value, marker, None) is not None  # as pluggy: functions and methods
    except Exception: marked = False  # an attribute whose lookup raises is not a hook
    if marked: setattr(hooks, name, value)
  return hooks


_SPEC_ARGS: dict[str, tuple[str, ...]] = {}  # hook name -> the arguments its spec passes; filled on first use


def _argnames(fn: Any) -> tuple[str, ...] | None:
  """The arguments a hook function receives, as pluggy counts them: the positional ones without a default, less the
  instance of a method. From the code object (no `inspect`, which discovery does not import); None for a builtin."""
  func = getattr(fn, "__func__", fn)
  if (code := getattr(func, "__code__", None)) is None: return None
  args = code.co_varnames[:code.co_argcount]
  if (defaults := getattr(func, "__defaults__", None)): args = args[:-len(defaults)]
  if args and (getattr(fn, "__self__", None) is not None or ("." in getattr(func, "__qualname__", "") and args[0] == "self")):
    args = args[1:]
  return tuple(args)


def _check_hooks(hooks: ModuleType) -> tuple[dict[str, tuple[Any, tuple[str, ...]]], list[str], list[str]]:
  """A plugin's hook functions checked against the specs, as pluggy's register and check_pending check them:
  ({hook: (function, argnames)}, [arguments a spec does not pass, wrappers], [hooks plugrt does not define]).
  tests/test_registry.py holds this to pluggy's verdicts."""
  if not _SPEC_ARGS:
    for attr, fn in vars(hookspecs).items():
      if getattr(fn, f"{hookspecs.PROJECT}_spec", None) is not None: _SPEC_ARGS[attr] = _argnames(fn) or ()
  impls: dict[str, tuple[Any, tuple[str, ...]]] = {}
  bad: list[str] = []
  unknown: list[str] = []
  for attr, fn in sorted(vars(hooks).items()):
    if not isinstance(opts := getattr(fn, f"{hookspecs.PROJECT}_impl", None), dict): continue
    name = opts.get("specname") or attr
    args = _argnames(fn)
    if args is None: args = _signature_argnames(fn)
    if name not in _SPEC_ARGS:
      if not opts.get("optionalhook"): unknown.append(f"{name}{did_you_mean(name, _SPEC_ARGS)}")
      continue
    if opts.get("wrapper") or opts.get("hookwrapper"):
      bad.append(f"{name} is a hook wrapper: plugrt calls each plugin's own hook directly, so drop wrapper=/hookwrapper=")
    elif (extra := [a for a in args if a not in _SPEC_ARGS[name]]):
      bad.append(f"{name}({', '.join(args)}) takes {', '.join(map(repr, extra))}, which its spec does not pass: the spec is "
                 f"{name}({', '.join(_SPEC_ARGS[name])})")
    else: impls[name] = (fn, args)
  return impls, bad, unknown


def _signature_argnames(fn: Any) -> tuple[str, ...]:
  """A builtin marked as a hook (it has no code object): through inspect, as pluggy reads it."""
  import inspect
  try: params = list(inspect.signature(fn).parameters.values())
  except (TypeError, ValueError): return ()
  return tuple(p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty)


def _valid_name(name: Any) -> bool: return isinstance(name, str) and _NAME.fullmatch(name) is not None


def _bad_names(backends: Sequence[BackendSpec], interfaces: Sequence[InterfaceSpec]) -> list[str]:
  """The names in a plugin's declarations that the grammar cannot hold, each saying what it names."""
  bad = []

  def check(what: str, name: Any, reserved: str = "") -> None:
    if not _valid_name(name): bad.append(f"{what} {name!r}")
    elif name == reserved: bad.append(f"{what} {name!r} (reserved: {reserved} is not a {what.split()[0]} name)")
  for b in backends:
    check("device", b.name, "DEV")
    for c in b.compilers: check(f"compiler of {b.name!r}", c.name, "IFACE")  # CPU_IFACE is the interface variable
    for a in b.aliases:
      check("alias", a.env, "DEV")
      try: parse_target(a.target)
      except EnvError as e: bad.append(f"alias {a.env!r} target {a.target!r} ({e.message})")
  for i in (*(i for b in backends for i in b.interfaces), *interfaces):
    check("interface", i.name)
    check(f"interface {i.name!r} for device", i.device)
  return bad


def _declarations(hooks: ModuleType) -> tuple[list, list]:
  """(plugrt_backends(), plugrt_interfaces()) of a plugin's hook functions. They take no arguments, so they are called
  directly, on the worker, together with the import (their signatures are checked afterwards, _check_hooks)."""
  marker, found = f"{hookspecs.PROJECT}_impl", {}
  for attr, fn in vars(hooks).items():
    if (opts := getattr(fn, marker, None)) is not None: found[opts.get("specname") or attr] = fn
  return [*(found["plugrt_backends"]() or ())] if "plugrt_backends" in found else [], \
         [*(found["plugrt_interfaces"]() or ())] if "plugrt_interfaces" in found else []


class _Malformed(TypeError):
  """What an optional declaration hook returned is not a list of its specs (str: what is wrong)."""


#: what each field of a spec an optional declaration hook returns (VideoDecoderSpec, CollectiveEngineSpec) must be
_SPEC_FIELDS: dict[str, tuple[Any, str]] = {
  "name": (_valid_name, "a name (" + NAME_RULE + ")"),
  "device": (lambda v: v == "" or _valid_name(v), "\"\" or a device name"),
  "probe": (lambda v: v is None or callable(v), "a function or None"),
  "open": (callable, "a function"),
  "unique_id": (lambda v: v is None or callable(v), "a function or None"),
  "codecs": (lambda v: isinstance(v, (tuple, list)) and all(isinstance(c, str) for c in v), "a tuple of codec names"),
  "priority": (lambda v: type(v) is int, "an int"),
  "local": (lambda v: type(v) is bool, "a bool"),
  "description": (lambda v: isinstance(v, str), "a str"),
}


def _declared_specs(call_hook: Any, rec: PluginRecord, hook: str, kind: type) -> list[Any]:
  """On the worker: the plugin's `hook`, its result iterated (a generator runs here, under the limit) and checked:
  a list (tuple, iterable) of `kind`s whose fields are what _SPEC_FIELDS says, or _Malformed saying what is wrong."""
  got = call_hook(rec, hook)
  if got is None: return []
  if isinstance(got, (str, bytes, dict, kind)) or not hasattr(type(got), "__iter__"):
    raise _Malformed(f"returned {type(got).__name__}, not a list of {kind.__name__}")
  specs = list(got)
  for s in specs:
    if not isinstance(s, kind): raise _Malformed(f"returned a list holding {type(s).__name__}, not {kind.__name__}")
    for field in kind._fields:
      check, what = _SPEC_FIELDS.get(field, (None, ""))
      if check is not None and not check(value := getattr(s, field)):
        raise _Malformed(f"returned {kind.__name__} {s.name!r} whose {field} is {value!r}, not {what}")
  return specs


def _api_problem(version: Any) -> str:
  """What is wrong with a BackendSpec's api_version: "MAJOR.MINOR" (a string) or (major, minor), as PLUGIN_API_VERSION."""
  if isinstance(version, tuple) and len(version) == 2 and all(type(x) is int for x in version): major, minor = version
  else:
    try:
      if not isinstance(version, str): raise ValueError
      major, minor = (int(x) for x in version.split(".")[:2])
    except ValueError:
      return (f"{version!r} is not MAJOR.MINOR: write api_version=\"{PLUGIN_API_VERSION[0]}.{PLUGIN_API_VERSION[1]}\" "
              f"or api_version=plugrt.PLUGIN_API_VERSION")
  if major != PLUGIN_API_VERSION[0]: return "the major versions differ"
  if minor > PLUGIN_API_VERSION[1]: return "it needs a newer plugrt"
  return ""


# ------------------------------------------------------------ running plugin code under a time limit
class _Overran(Exception):
  """Plugin code did not finish within its time limit (str: "did not finish within N s")."""


class PluginTimeout(PluginError, TimeoutError):
  """Plugin code run by Registry.run_plugin overran its time limit (now or before): the plugin is stalled for the
  process. `probe` is its stalled Probe (reason TIMED_OUT, the detail naming the step, the hint)."""
  reason = Reason.TIMED_OUT

  def __init__(self, probe: Probe):
    self.probe = probe
    super().__init__(probe.detail, probe.hint)


#: thread id -> what plugin code that thread runs now ("plugin cpu (plugrt_cpu) while being imported"): re-entry is refused
_in_plugin: dict[int, str] = {}


def _refuse_reentry() -> None:
  if (running := _in_plugin.get(get_ident())) is not None:
    raise PluginError(f"{running.split(' while ')[0]} used plugrt's device registry (Device.DEFAULT, Device[...], available()) "
                      f"while {running.split(' while ', 1)[1]}",
                      "a plugin must not list or open devices at import, in a declaration hook or in a probe: do it in a "
                      "hook that runs later (plugrt_open_device, plugrt_compiler, ...)")


class _Job:
  __slots__ = ("fn", "args", "label", "done", "value", "error")

  def __init__(self, fn: Any, args: tuple, label: str):
    self.fn, self.args, self.label, self.value, self.error = fn, args, label, None, None
    self.done = allocate_lock()
    self.done.acquire()  # released when the job has run

  def run(self) -> None:
    me = get_ident()
    _in_plugin[me] = self.label
    try: self.value = self.fn(*self.args)
    except BaseException as e: self.error = e  # handed to the caller, who decides
    finally:
      _in_plugin.pop(me, None)
      self.done.release()


def _serve(inbox: Any, slot: list) -> None:
  """A worker thread: run each job handed over through `slot` (inbox released), forever. It is a _thread thread, which
  the interpreter does not wait for at exit (a daemon)."""
  while True:
    inbox.acquire()
    job, slot[0] = slot[0], None
    job.run()


class _StdoutCapture:
  """sys.stdout while plugin code runs: what the thread running it prints is kept (and moved to stderr), so that a
  plugin's print never lands in output a program means to be parsed (`plugrt devices --json`); other threads print as before."""

  def __init__(self, real: Any, ident: int):
    self._real, self._ident, self.parts = real, ident, []

  def write(self, text: str) -> int:
    if get_ident() != self._ident: return self._real.write(text)
    self.parts.append(text)
    return len(text)

  def flush(self) -> None:
    if get_ident() != self._ident: self._real.flush()

  def __getattr__(self, name: str) -> Any: return getattr(self._real, name)


class _Runner:
  """Runs plugin code (imports, declaration hooks, probes, opens) on one worker thread, process-wide, one call at a time,
  waiting at most a limit for each. Python cannot stop a thread: a call that overruns is abandoned together with its worker,
  which finishes (if ever) into a job nobody reads, and the next call starts a fresh worker. With limit 0 the call runs on
  the caller's thread, unlimited. One worker serves every call, so a call costs a lock hand-over, not a thread start."""

  def __init__(self) -> None:
    self._lock = allocate_lock()
    self._inbox: Any = None
    self._slot: list = [None]
    self._ident, self._pid = 0, 0

  def _worker(self) -> tuple[Any, list, int]:
    if self._inbox is None or self._pid != os.getpid():  # none yet, its worker overran, or this is a forked child (no worker)
      # threading takes the thread that first imports it for the main thread: were that the worker (a plugin importing
      # wgpu, say), the interpreter's exit would wait forever on the plugin's threads. So it is imported here, first.
      import threading  # noqa: F401
      inbox, slot = allocate_lock(), [None]
      inbox.acquire()
      self._ident = start_new_thread(_serve, (inbox, slot))
      self._inbox, self._slot, self._pid = inbox, slot, os.getpid()
    return self._inbox, self._slot, self._ident

  def call(self, label: str, fn: Any, args: tuple, limit: float) -> Any:
    _refuse_reentry()  # plugin code calling back in would wait on itself
    job = _Job(fn, args, label)
    with self._lock:
      inline = limit <= 0
      inbox, slot, ident = (None, None, get_ident()) if inline else self._worker()
      real = sys.stdout
      capture = _StdoutCapture(real, ident) if real is not None else None
      if capture is not None: sys.stdout = capture
      finished = False
      try:
        if inline: job.run()
        else:
          slot[0] = job  # type: ignore[index]
          inbox.release()
        finished = job.done.acquire(timeout=min(limit, TIMEOUT_MAX)) if not inline else True
      finally:
        if capture is not None and sys.stdout is capture: sys.stdout = real  # unless someone replaced it meanwhile
        if not finished: self._inbox = None  # its worker is still in the plugin: leave both behind
    if capture is not None and capture.parts:
      print(f"plugrt: {label} printed (moved to stderr):\n{''.join(capture.parts).rstrip()}", file=sys.stderr)
    if not finished: raise _Overran(f"did not finish within {limit:g} s")
    if job.error is not None: raise job.error
    return job.value


_runner = _Runner()


# ------------------------------------------------------------ the process-wide registry
_current: Registry | None = None
_current_lock = allocate_lock()


def current() -> Registry:
  global _current
  if _current is None:
    with _current_lock:
      if _current is None: _current = Registry()
  return _current


def _open_by_name(name: str | None) -> opened.RuntimeDevice:
  """A device of the process's registry by name (None: its default): how plugrt.opened opens `Buffer("CPU", ...)`."""
  reg = current()
  return reg.open(reg.default if name is None else name)


opened.open_by_name = _open_by_name  # plugrt.opened sits below the registry: it is handed the opener, not an import of it


@contextlib.contextmanager
def use(registry: Registry) -> Iterator[Registry]:
  """Make `registry` the process-wide one inside the block (for tests)."""
  global _current
  prev, _current = _current, registry
  try: yield registry
  finally: _current = prev


@contextlib.contextmanager
def isolated(plugins: Sequence[ModuleType | str] = (), env: dict[str, str] | None = None) -> Iterator[Registry]:
  """A registry of exactly `plugins` (autoload off) under environment `env` (default: empty),
  made the process-wide one inside the block: `with isolated([my_backend]) as reg: ...`"""
  reg = Registry(plugins=list(plugins), env=dict(env or {}), autoload=False)
  try:
    with use(reg): yield reg
  finally: reg.close()
