"""Plugins that misbehave on purpose: one whose import, probe or open hangs, one that uses the device registry while
it is being discovered, one that declares names the grammar cannot hold, one that prints. Each must cost only itself.

Cases that could hang run in a fresh interpreter with a short `timeout=`, so a regression fails the test instead of
hanging the suite.
"""
from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import DEVICE_HOOKS, HEADER, SELECTION_VARS, FakePlugins, backend_source

from plugrt.errors import DeviceUnavailable, EnvError, Reason
from plugrt.registry import Registry, use

ROOT = Path(__file__).resolve().parents[1]
HANG = "__import__('time').sleep(3600)"  # a plugin stuck on a driver or a lock: it never returns


def run(fake: FakePlugins, code: str, *args: str, env: dict[str, str] | None = None, timeout: float = 30) -> subprocess.CompletedProcess[str]:
  """fake.run_python, with a shorter guard: a hang fails the test (TimeoutExpired) in `timeout` seconds."""
  full = {k: v for k, v in os.environ.items() if k not in SELECTION_VARS and not k.startswith(("CPU_", "PYTHON_", "PLUGRT_PROBE", "PLUGRT_OPEN"))}
  full["PYTHONPATH"] = os.pathsep.join([str(fake.root), *filter(None, [os.environ.get("PYTHONPATH")])])
  full.update(env or {})
  return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True, env=full, timeout=timeout,
                        cwd=str(fake.root))


def devices_json(fake: FakePlugins, env: dict[str, str] | None = None) -> tuple[dict[str, Any], str]:
  r = run(fake, "import sys; from plugrt.cli import main; sys.exit(main(['devices', '--json']))", env=env)
  assert r.returncode == 0, r.stderr
  return json.loads(r.stdout), r.stderr  # strict JSON: nothing else may be on stdout


def hung_probe(name: str, priority: int) -> str:
  return backend_source(name, priority=priority).replace("def probe() -> Probe:\n", f"def probe() -> Probe:\n  {HANG}\n")


TIMED = """
  import time, plugrt
  t = time.perf_counter()
  default = plugrt.Device.DEFAULT
  print(default, round(time.perf_counter() - t, 3))
"""


# ---------------------------------------------------------------- time limits

def test_a_hung_lower_priority_probe_is_never_waited_for(fake_plugins):
  """CPU is ready: the automatic choice never runs the probe of a backend below it, let alone waits for it."""
  fake_plugins.plugin(hung_probe("SLOWPOKE", priority=1), entry="slowpoke")
  r = run(fake_plugins, TIMED, env={"PLUGRT_PROBE_TIMEOUT": "3"}, timeout=20)
  assert r.returncode == 0, r.stderr
  default, seconds = r.stdout.split()
  assert default == "CPU" and float(seconds) < 2.5  # well under the limit: the probe never ran


def test_a_hung_higher_priority_probe_times_out_and_the_next_device_is_chosen(fake_plugins):
  fake_plugins.plugin(hung_probe("STUCK", priority=100), entry="stuck")
  r = run(fake_plugins, TIMED, env={"PLUGRT_PROBE_TIMEOUT": "0.5"}, timeout=20)
  assert r.returncode == 0, r.stderr
  default, seconds = r.stdout.split()
  assert default == "CPU" and 0.5 <= float(seconds) < 5
  data, _ = devices_json(fake_plugins, env={"PLUGRT_PROBE_TIMEOUT": "0.5"})
  rows = {b["device"]: b for b in data["backends"]}
  assert data["default"] == "CPU" and rows["CPU"]["available"] and rows["PYTHON"]["available"]
  stuck = rows["STUCK"]
  assert not stuck["available"] and stuck["reason"] == "timed out"
  assert "did not finish within 0.5 s" in stuck["detail"]
  assert "PLUGRT_PROBE_TIMEOUT" in stuck["hint"] and "PLUGRT_DISABLE=stuck" in stuck["hint"]
  r = run(fake_plugins, "import sys; from plugrt.cli import main; sys.exit(main(['devices']))", env={"PLUGRT_PROBE_TIMEOUT": "0.5"}, timeout=20)
  assert r.returncode == 0 and re.search(r"^STUCK .* timed out", r.stdout, re.M), r.stdout


def test_a_hung_open_times_out_and_the_next_device_is_chosen(fake_plugins):
  extra = f"""
  @hookimpl
  def plugrt_open_device(device: DeviceInfo) -> Any:
    {HANG}
  """
  fake_plugins.backend("FROZEN", priority=100, entry="frozen", extra=textwrap.dedent(extra))
  r = run(fake_plugins, """
    import time, plugrt
    from plugrt.errors import DeviceUnavailable
    t = time.perf_counter()
    x = plugrt.Tensor([1.0])  # the default device, chosen automatically
    print(x.device, round(time.perf_counter() - t, 3))
    try: plugrt.Device["FROZEN"]
    except DeviceUnavailable as e: print(e.reason.name, "PLUGRT_OPEN_TIMEOUT" in e.hint, "PLUGRT_DISABLE=frozen" in e.hint, e.message)
  """, env={"PLUGRT_OPEN_TIMEOUT": "0.5"}, timeout=20)
  assert r.returncode == 0, r.stderr
  first, second = r.stdout.splitlines()
  device, seconds = first.split()
  assert device == "CPU" and 0.5 <= float(seconds) < 5
  assert second.startswith("TIMED_OUT True True FROZEN cannot be used: opening FROZEN (plugin frozen's open hook) did not finish within 0.5 s")


def test_a_hung_import_times_out(fake_plugins):
  fake_plugins.plugin(backend_source("NEVER", priority=100) + "\n" + HANG + "\n", entry="never")  # hangs after defining its hooks
  r = run(fake_plugins, TIMED, env={"PLUGRT_PROBE_TIMEOUT": "0.5"}, timeout=20)
  assert r.returncode == 0, r.stderr
  assert r.stdout.split()[0] == "CPU"
  data, _ = devices_json(fake_plugins, env={"PLUGRT_PROBE_TIMEOUT": "0.5"})
  rows = {b["device"]: b for b in data["backends"]}
  assert rows["NEVER"]["reason"] == "timed out" and "did not finish within 0.5 s" in rows["NEVER"]["detail"]
  assert "PLUGRT_PROBE_TIMEOUT" in rows["NEVER"]["hint"] and rows["CPU"]["available"]


def test_a_late_probe_result_changes_nothing(fake_plugins):
  """A probe that finishes after its limit is still timed out: the worker it ran on was abandoned, and the plugin's
  code is not run again in this process."""
  src = backend_source("LATE", priority=100).replace("def probe() -> Probe:\n", "def probe() -> Probe:\n  CALLS.append(('probe', None))\n"
                                                     "  import time\n  time.sleep(0.6)\n")
  mod = fake_plugins.plugin(src, entry="late")
  reg = Registry(env={"PLUGRT_PROBE_TIMEOUT": "0.2"})
  with use(reg):
    assert reg.default == "CPU"
    assert reg.probe("LATE").reason is Reason.TIMED_OUT
    time.sleep(0.8)  # the probe has returned Probe.found by now, into a job nobody reads
    assert reg.probe("LATE").reason is Reason.TIMED_OUT and reg.compiler_probe("LATE", "PY").reason is Reason.TIMED_OUT
    assert "LATE" not in reg.available() and fake_plugins.calls(mod) == [("probe", None)]
    with pytest.raises(DeviceUnavailable) as ei:
      reg.open("LATE")
    assert ei.value.reason is Reason.TIMED_OUT


def test_no_limit_runs_plugin_code_on_the_calling_thread(fake_plugins):
  src = backend_source("HERE", priority=100).replace("def probe() -> Probe:\n", "def probe() -> Probe:\n  import _thread\n"
                                                     "  CALLS.append(('probe', _thread.get_ident()))\n")
  mod = fake_plugins.plugin(src, entry="here")
  import _thread
  assert Registry(env={"PLUGRT_PROBE_TIMEOUT": "0"}).probe("HERE").ok
  assert Registry(env={}).probe("HERE").ok
  (_, inline), (_, worker) = fake_plugins.calls(mod)
  assert inline == _thread.get_ident() and worker != inline


@pytest.mark.parametrize("value", ["soon", "-1", "nan", "inf", "1s"])
@pytest.mark.parametrize("variable", ["PLUGRT_PROBE_TIMEOUT", "PLUGRT_OPEN_TIMEOUT"])
def test_a_bad_time_limit_is_an_env_error(variable, value):
  with pytest.raises(EnvError, match=f"{variable}='{re.escape(value)}' is not a number of seconds") as ei:
    Registry(env={variable: value}).load()
  assert variable in ei.value.hint and "0: no limit" in ei.value.hint


def test_every_variable_the_code_reads_is_documented():
  """Each PLUGRT_* name the core and the plugins spell out (as a whole string: env.get("PLUGRT_X"), a constant) is in
  docs/environment.md."""
  names: dict[str, str] = {}
  for path in [*(ROOT / "core" / "plugrt").rglob("*.py"), *(ROOT / "plugins").rglob("plugrt_*/**/*.py")]:
    if "build" in path.relative_to(ROOT).parts: continue  # (setuptools' copies, made and removed by the install tests)
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(r"PLUGRT_[A-Z0-9_]+", node.value):
        names.setdefault(node.value, str(path.relative_to(ROOT)))
  assert {"PLUGRT_PROBE_TIMEOUT", "PLUGRT_OPEN_TIMEOUT", "PLUGRT_DISABLE", "PLUGRT_CPU_THREADS"} <= set(names)
  doc = (ROOT / "docs" / "environment.md").read_text()
  assert {n: where for n, where in names.items() if f"`{n}" not in doc} == {}


# ---------------------------------------------------------------- broken installs (any distribution, plugrt's or not)

def _broken(fake: FakePlugins, case: str) -> str:
  """Install one distribution whose metadata plugrt cannot read, in the way `case` names; returns its directory's name."""
  plugin = {"plugrt": {"broken": "broken_mod"}}
  if case == "entry points not UTF-8":  # an unrelated package's console script with a Latin-1 name
    return fake.dist("latin", {}, raw_entry_points="[console_scripts]\ncaf\u00e9 = caf:main\n".encode("latin-1")).name
  if case == "entry points in UTF-16":
    return fake.dist("wide", {}, raw_entry_points="[plugrt]\nwide = wide_mod\n".encode("utf-16")).name
  if case == "entry points not INI":
    return fake.dist("noini", {}, raw_entry_points=b"[plugrt]\nbroken = broken_mod\n[console_scripts]\njust some words\n").name
  if case == "section never closed":
    return fake.dist("unclosed", {}, raw_entry_points=b"[plugrt]\nbroken = broken_mod\n[gui_scripts\nx = y\n").name
  if case == "value not a module":
    return fake.dist("badvalue", {}, raw_entry_points=b"[plugrt]\nbroken = not a module!\n").name
  if case == "METADATA not UTF-8":
    return fake.dist("badmeta", plugin, raw_metadata=b"Metadata-Version: 2.1\nName: badm\xe9ta\nVersion: 1.0\n\n").name
  if case == "METADATA missing":
    d = fake.dist("nometa", plugin)
    (d / "METADATA").unlink()
    return d.name
  if case == "METADATA a directory":
    d = fake.dist("dirmeta", plugin)
    (d / "METADATA").unlink()
    (d / "METADATA").mkdir()
    return d.name
  assert case == "directory unreadable"
  loop = fake.root / "loop-1.0.dist-info"
  loop.symlink_to(loop.name)  # a link to itself: opening anything in it fails (ELOOP), for root too
  return loop.name


BROKEN = ["entry points not UTF-8", "entry points in UTF-16", "entry points not INI", "section never closed", "value not a module",
          "METADATA not UTF-8", "METADATA missing", "METADATA a directory", "directory unreadable"]


@pytest.mark.parametrize("case", BROKEN)
def test_a_distribution_whose_metadata_cannot_be_read_is_skipped_with_a_warning(fake_plugins, case):
  """One broken install costs only itself: discovery goes on, finds the working plugins around it, and says what it
  skipped and why (a Python warning at discovery, and Registry.skipped for `plugrt devices`)."""
  from plugrt._entrypoints import clear_cache, entry_points
  fake_plugins.backend("BEFORE", priority=100)
  name = _broken(fake_plugins, case)
  fake_plugins.backend("AFTER", priority=90, dist="zz-after")  # sorted after the broken one in the same folder
  clear_cache()
  with pytest.warns(UserWarning, match=f"plugrt: distribution {re.escape(name)} in .* is skipped: ") as caught:
    eps = entry_points("plugrt")
  assert {"before", "after"} <= {e.name for e in eps} and not {"broken", "wide"} & {e.name for e in eps}
  why = str(caught[0].message)
  assert "reinstall it, or remove" in why and {
    "entry points not UTF-8": "entry_points.txt is not UTF-8 (byte 0xe9", "entry points in UTF-16": "entry_points.txt is not UTF-8 (byte 0xff",
    "entry points not INI": "line 4 ('just some words') in [console_scripts] is not `name = value`",
    "section never closed": "line 3 ('[gui_scripts') opens a section it does not close",
    "value not a module": "entry 'broken' the value 'not a module!', not `module` or `module:attr`",
    "METADATA not UTF-8": "METADATA is not UTF-8", "METADATA missing": "it has no METADATA",
    "METADATA a directory": "its METADATA cannot be read (IsADirectoryError", "directory unreadable": "entry_points.txt cannot be read (OSError",
  }[case] in why
  reg = Registry(env={})
  with use(reg):
    assert reg.default == "BEFORE" and {"BEFORE", "AFTER", "CPU", "PYTHON"} <= set(reg.available())
    assert len(reg.skipped) == 1 and name in reg.skipped[0]


def test_a_non_utf8_distribution_breaks_neither_import_nor_plugrt_devices(fake_plugins):
  """The audit's case, in fresh processes: an unrelated package's entry_points.txt in Latin-1."""
  fake_plugins.backend("NEIGHBOUR", priority=100)
  name = _broken(fake_plugins, "entry points not UTF-8")
  r = run(fake_plugins, "import plugrt; print(plugrt.Device.DEFAULT)")
  assert r.returncode == 0 and r.stdout.split() == ["NEIGHBOUR"], r.stderr
  assert f"distribution {name} in {fake_plugins.root} is skipped: its entry_points.txt is not UTF-8" in r.stderr
  data, _ = devices_json(fake_plugins)
  assert data["default"] == "NEIGHBOUR" and [w for w in data["plugin_warnings"] if name in w["warning"]]
  r = run(fake_plugins, "import sys; from plugrt.cli import main; sys.exit(main(['devices']))")
  assert r.returncode == 0 and re.search(r"^NEIGHBOUR .* ready", r.stdout, re.M), r.stderr
  assert re.search(rf"installed distributions skipped .*\n  warning: distribution {re.escape(name)} in .* is skipped: its entry_points.txt "
                   r"is not UTF-8", r.stdout), r.stdout


# ---------------------------------------------------------------- re-entrance

def test_a_plugin_that_reads_the_default_device_at_import_breaks_only_itself(fake_plugins):
  fake_plugins.plugin(backend_source("GREEDY", priority=100) + "\nfrom plugrt import Device\nDEFAULT = Device.DEFAULT\n", entry="greedy")
  fake_plugins.backend("FINE", priority=50)
  r = run(fake_plugins, """
    import plugrt
    reg = plugrt.Device.registry
    print(plugrt.Device.DEFAULT, [n for n in plugrt.Device.available() if n in ("FINE", "CPU", "PYTHON", "GREEDY")])
    print(reg.probe("GREEDY").reason.name, reg.probe("GREEDY").detail)
  """, timeout=30)
  assert r.returncode == 0, r.stderr
  first, second = r.stdout.splitlines()
  assert first == "FINE ['FINE', 'CPU', 'PYTHON']"
  assert second.startswith("IMPORT_ERROR module ") and "PluginError: plugin greedy" in second
  assert "used plugrt's device registry" in second and "while being discovered" in second


def test_a_probe_that_lists_devices_is_a_hook_error(fake_plugins):
  src = backend_source("NOSY", priority=100).replace("def probe() -> Probe:\n", "def probe() -> Probe:\n  from plugrt import Device\n"
                                                     "  Device.available()\n")
  fake_plugins.plugin(src, entry="nosy")
  reg = Registry(env={"PLUGRT_PROBE_TIMEOUT": "5"})
  with use(reg):
    t = time.perf_counter()
    assert reg.default == "CPU" and time.perf_counter() - t < 4  # refused at once, not after the time limit
    p = reg.probe("NOSY")
    assert p.reason is Reason.HOOK_ERROR and "plugin nosy" in p.detail and "while running its probe" in p.detail
    assert "PYTHON" in reg.available()


# ---------------------------------------------------------------- optional declaration hooks and the factories they declare

def declaring(decoders: str = "return []", engines: str = "return []", decoder_open: str = "return None", engine_open: str = "return None") -> str:
  """A plugin with no device of its own that declares video decoders and collective engines: the hooks' bodies (SPEC
  stands for the hook's own spec, DEC or ENG), and the bodies of decoder DEC's and engine ENG's factories."""
  return HEADER + textwrap.dedent(f"""
    from plugrt.hookspecs import CollectiveEngineSpec, VideoDecoderSpec


    def open_decoder(device, stream, info, options):
      {decoder_open}


    def open_engine(request):
      {engine_open}


    DEC = VideoDecoderSpec("FAKEDEC", "CPU", lambda ctx: Probe.found(1, "a fake decoder"), open_decoder, priority=10)
    ENG = CollectiveEngineSpec("FAKENG", "CPU", lambda ctx: Probe.found(1, "a fake engine"), open_engine, local=True, priority=10)


    @hookimpl
    def plugrt_video_decoders():
      {decoders.replace("SPEC", "DEC")}


    @hookimpl
    def plugrt_collective_engines():
      {engines.replace("SPEC", "ENG")}
    """)


#: what a declaration hook does wrong -> its body, and what the listing must say
MISDECLARED = {
  "raises": ("raise ValueError('no decoders today')", "hook error",
             r"plugrt_\w+ of plugin odd \(\w+\) raised ValueError: no decoders today at \w+\.py:\d+"),
  "returns a str": ("return 'FAKEDEC'", "hook error", r"returned str, not a list of \w+Spec"),
  "returns one spec": ("return SPEC", "hook error", r"returned (VideoDecoder|CollectiveEngine)Spec, not a list of \1Spec"),
  "returns other objects": ("return [SPEC, object()]", "hook error", r"returned a list holding object, not (VideoDecoder|CollectiveEngine)Spec"),
  "misnames one": ("return [SPEC._replace(name='FAKE DEC')]", "hook error",
                   r"\w+Spec 'FAKE DEC' whose name is 'FAKE DEC', not a name \(a name is an upper-case letter"),
  "bad priority": ("return [SPEC._replace(priority='high')]", "hook error", r"whose priority is 'high', not an int"),
  "no factory": ("return [SPEC._replace(open=None)]", "hook error", r"whose open is None, not a function"),
  "re-enters": ("from plugrt import Device\n      Device.available()\n      return []", "hook error",
                r"PluginError: plugin odd \(\w+\) used plugrt's device registry .* while declaring its (video decoders|collective engines)"),
}


@pytest.mark.parametrize("case", MISDECLARED)
def test_a_declaration_hook_that_misbehaves_is_listed_with_its_reason(fake_plugins, case, capsys):
  """A hook that raises, returns garbage or uses the registry contributes nothing, is listed in `plugrt devices` with
  its reason (never silently dropped), and costs nobody else: another plugin's decoder and engine, PyAV and MPI stay."""
  from plugrt.distributed.choice import choose, engine_rows, engines
  from plugrt.errors import CollectiveUnavailable
  from plugrt.video import decoder_rows, decoders
  body, reason, detail = MISDECLARED[case]
  fake_plugins.plugin(declaring(decoders=body, engines=body), entry="odd")
  fake_plugins.plugin(declaring(decoders="return [DEC._replace(name='GOODDEC')]", engines="return [ENG._replace(name='GOODENG')]"), entry="good")
  reg = Registry(env={"PLUGRT_PROBE_TIMEOUT": "5", "PLUGRT_PLUGINS": "odd,good"})
  t = time.perf_counter()
  with use(reg):
    assert [d.spec.name for d in decoders()] == ["GOODDEC", "PYAV"] and [s.name for s, _ in engines()] == ["GOODENG", "MPI"]
    for rows, name in ((decoder_rows(), "decoder"), (engine_rows(), "engine")):
      bad = [r for r in rows if r[name] == "?"]
      assert len(bad) == 1 and bad[0]["reason"] == reason and not bad[0]["available"], rows
      assert re.search(detail, bad[0]["detail"]), bad[0]["detail"]
      assert "PLUGRT_DISABLE=odd" in bad[0]["hint"]
    with pytest.raises(CollectiveUnavailable, match=r"plugin odd: plugrt_collective_engines of plugin odd") as e: choose("PYTHON", True, None)
    assert "plugin odd" in e.value.reasons
  assert time.perf_counter() - t < 4  # re-entry is refused at once, not after the time limit
  assert capsys.readouterr().out == ""


def test_a_declaration_hook_that_prints_keeps_stdout_clean(fake_plugins, capsys):
  fake_plugins.plugin(declaring(decoders="print('decoders here')\n      return [DEC]", engines="print('engines here')\n      return [ENG]"),
                      entry="chatty")
  from plugrt.distributed.choice import engines
  from plugrt.video import decoders
  with use(Registry(env={"PLUGRT_PLUGINS": "chatty"})):
    assert decoders()[0].spec.name == "FAKEDEC" and engines()[0][0].name == "FAKENG"
  out, err = capsys.readouterr()
  assert out == "" and "plugin chatty" in err and "decoders here" in err and "engines here" in err


HANGING_HOOKS = declaring(decoders=HANG, engines=HANG)


def test_a_hung_declaration_hook_times_out_everywhere_it_is_read(fake_plugins):
  """plugrt devices (and --json), video.decoders(), distributed.engines() and from_env each finish within the probe
  limit; the plugin is listed as timed out, and PyAV and MPI are still offered."""
  fake_plugins.plugin(HANGING_HOOKS, entry="stuck")
  env = {"PLUGRT_PROBE_TIMEOUT": "0.5", "PLUGRT_DISABLE": "cuda,nv"}  # the decoders and engines left are the core's
  data, _ = devices_json(fake_plugins, env=env)
  for rows, name, fallback in ((data["video_decoders"], "decoder", "PYAV"), (data["collective_engines"], "engine", "MPI")):
    stuck = next(r for r in rows if r[name] == "?")
    assert stuck["reason"] == "timed out" and "did not finish within 0.5 s while declaring its" in stuck["detail"], rows
    assert "PLUGRT_PROBE_TIMEOUT" in stuck["hint"] and "PLUGRT_DISABLE=stuck" in stuck["hint"]
    assert fallback in {r[name] for r in rows}
  r = run(fake_plugins, "import sys; from plugrt.cli import main; sys.exit(main(['devices']))", env=env, timeout=30)
  assert r.returncode == 0 and re.search(r"^  \? +- +plugrt-fake-\w+ +timed out: plugin stuck", r.stdout, re.M), r.stdout
  r = run(fake_plugins, """
    import time
    import plugrt.distributed as dist
    from plugrt.video import decoders
    t = time.perf_counter()
    print([d.spec.name for d in decoders()], [s.name for s, _ in dist.engines()], round(time.perf_counter() - t, 2))
    comm = dist.from_env("CPU", timeout=5, env={"RANK": "0", "WORLD_SIZE": "1"})
    print(comm.engine.name, round(time.perf_counter() - t, 2))
  """, env=env, timeout=30)
  assert r.returncode == 0, r.stderr
  first, second = r.stdout.splitlines()
  assert first.startswith("['PYAV'] ['MPI'] ") and 0.5 <= float(first.split()[-1]) < 4
  assert second.split()[0] == "MPI" and float(second.split()[1]) < 15


def test_a_hung_decoder_factory_falls_back(fake_plugins):
  """decode_annexb_to_tensors_auto reaches its fallback when a decoder's factory hangs: the open runs under
  PLUGRT_OPEN_TIMEOUT, and the fallback gets VideoDecoderUnavailable with reason TIMED_OUT naming the decoder."""
  pytest.importorskip("av")
  fake_plugins.plugin(declaring(decoders="return [DEC]", decoder_open=HANG), entry="frozendec")
  r = run(fake_plugins, """
    import time
    from plugrt import dtypes
    from plugrt_testing.video import make_hevc
    from plugrt.video import decode_annexb_to_tensors_auto
    stream = make_hevc(64, 48, frames=2)
    t = time.perf_counter()
    got = decode_annexb_to_tensors_auto(stream, dtype=dtypes.uint8, normalize=False, fallback=lambda err: ("FELL BACK", err))
    print(got[0], got[1].reason.name, round(time.perf_counter() - t, 2))
    print(got[1].reasons)
  """, env={"PLUGRT_OPEN_TIMEOUT": "0.5", "PLUGRT_DISABLE": "cuda,nv"}, timeout=60)  # FAKEDEC: the only hardware decoder
  assert r.returncode == 0, r.stderr
  first, second = r.stdout.splitlines()
  assert first.startswith("FELL BACK TIMED_OUT ") and 0.5 <= float(first.split()[-1]) < 5
  assert "did not finish within 0.5 s while opening video decoder FAKEDEC" in second and "PLUGRT_OPEN_TIMEOUT" in second


def test_a_decoder_factory_that_uses_the_registry_is_refused(fake_plugins):
  pytest.importorskip("av")
  fake_plugins.plugin(declaring(decoders="return [DEC]", decoder_open="from plugrt import Device\n      Device.available()"), entry="nosydec")
  from plugrt import dtypes
  from plugrt.video import decode_annexb_to_tensors_auto
  from plugrt_testing.video import make_hevc
  with use(Registry(env={})):
    err = decode_annexb_to_tensors_auto(make_hevc(64, 48, frames=2), dtype=dtypes.uint8, normalize=False, fallback=lambda e: e)
  assert "used plugrt's device registry" in err.reasons["FAKEDEC"] and "while opening video decoder FAKEDEC" in err.reasons["FAKEDEC"]


def test_a_hung_engine_factory_keeps_the_timeout(fake_plugins):
  """A collective engine whose factory hangs ends in CollectiveTimeout near the communicator's timeout (plus a grace
  that lets an engine keeping its own deadline report first), not never."""
  fake_plugins.plugin(declaring(engines="return [ENG]", engine_open=HANG), entry="frozeneng")
  r = run(fake_plugins, """
    import time
    import plugrt.distributed as dist
    t = time.perf_counter()
    try: dist.Communicator.local(["CPU"], engine="FAKENG", timeout=1)
    except dist.CollectiveTimeout as e: print("TIMEOUT", round(time.perf_counter() - t, 2), e)
  """, timeout=30)
  assert r.returncode == 0, r.stderr
  assert r.stdout.startswith("TIMEOUT ") and 1 <= float(r.stdout.split()[1]) < 5, r.stdout
  assert "plugin frozeneng" in r.stdout and "while opening collective engine FAKENG" in r.stdout and "timeout is 1 s" in r.stdout
  assert "PLUGRT_DISABLE=frozeneng" in r.stdout


# ---------------------------------------------------------------- names

@pytest.mark.parametrize(("field", "bad", "spec"), [
  ("device", "BAD:X", "BackendSpec(name='BAD:X', api_version='1.0', probe=probe, priority=100, compilers=(CompilerSpec('PY'),))"),
  ("device", "A;B", "BackendSpec(name='A;B', api_version='1.0', probe=probe, priority=100, compilers=(CompilerSpec('PY'),))"),
  ("device", "lower", "BackendSpec(name='lower', api_version='1.0', probe=probe, priority=100, compilers=(CompilerSpec('PY'),))"),
  ("device", "", "BackendSpec(name='', api_version='1.0', probe=probe, priority=100, compilers=(CompilerSpec('PY'),))"),
  ("device", "TWO WORDS", "BackendSpec(name='TWO WORDS', api_version='1.0', probe=probe, priority=100, compilers=(CompilerSpec('PY'),))"),
  ("device", "DEV", "BackendSpec(name='DEV', api_version='1.0', probe=probe, priority=100, compilers=(CompilerSpec('PY'),))"),
  ("compiler", "PY:1", "BackendSpec(name='NAMED', api_version='1.0', probe=probe, priority=100, compilers=(CompilerSpec('PY:1'),))"),
  ("compiler", "IFACE", "BackendSpec(name='NAMED', api_version='1.0', probe=probe, priority=100, compilers=(CompilerSpec('IFACE'),))"),
  ("interface", "PCI+X", "BackendSpec(name='NAMED', api_version='1.0', probe=probe, priority=100, compilers=(CompilerSpec('PY'),), "
                         "interfaces=(InterfaceSpec('NAMED', 'PCI+X', probe),))"),
  ("alias", "CL ANG", "BackendSpec(name='NAMED', api_version='1.0', probe=probe, priority=100, compilers=(CompilerSpec('PY'),), "
                      "aliases=(Alias('CL ANG', 'NAMED:PY'),))"),
  ("alias", "NAMED:PY:X:Y", "BackendSpec(name='NAMED', api_version='1.0', probe=probe, priority=100, compilers=(CompilerSpec('PY'),), "
                            "aliases=(Alias('OLDNAME', 'NAMED:PY:X:Y'),))"),
])
def test_a_name_the_grammar_cannot_hold_is_refused_at_declaration(fake_plugins, field, bad, spec):
  src = backend_source("NAMED", priority=100)
  src = re.sub(r"return \[BackendSpec\(.*?\)\]\n", f"return [{spec}]\n", src, flags=re.S)
  fake_plugins.plugin(src, entry="named")
  reg = Registry(env={})
  with use(reg):
    assert reg.default == "CPU"
    assert {"CPU", "PYTHON"} <= set(reg.available()) and not any(c in n for n in reg.backends for c in ":; +" if n)
    rows = [b for b in reg.backends.values() if b.plugin is not None and b.plugin.entry == "named"]
    assert [b.name for b in rows] == ["NAMED"]  # explained under the plugin's entry-point name, never under the bad name
    assert rows[0].reason is Reason.BAD_NAME and repr(bad) in rows[0].detail and "upper-case letter" in rows[0].detail
    assert "PLUGRT_DISABLE=named" in rows[0].hint


def test_bad_names_do_not_break_the_device_listing(fake_plugins):
  for name in ("BAD:X", "A;B"):
    fake_plugins.plugin(backend_source("PLACEHOLDER", priority=100).replace("'PLACEHOLDER'", repr(name)), entry=f"bad{len(name)}")
  data, _ = devices_json(fake_plugins)
  rows = {b["device"]: b for b in data["backends"]}
  assert data["default"] == "CPU" and data["environment_error"] is None
  assert rows["BAD5"]["reason"] == rows["BAD3"]["reason"] == "invalid name" and "'BAD:X'" in rows["BAD5"]["detail"]
  assert "'A;B'" in rows["BAD3"]["detail"]


# ---------------------------------------------------------------- output

PRINTING = backend_source("CHATTY", priority=100, extra="""
@hookimpl
def plugrt_open_device(device: DeviceInfo) -> Any:
  print("hello from the open")
  return None
""").replace("def probe() -> Probe:\n", "def probe() -> Probe:\n  print('hello from the probe')\n  import os\n"
             "  os.write(1, b'hello from C\\n')\n") + '\nprint("hello from the import")\n'


def test_a_printing_plugin_leaves_devices_json_parseable(fake_plugins):
  fake_plugins.plugin(PRINTING, entry="chatty")
  data, stderr = devices_json(fake_plugins)
  assert data["default"] == "CHATTY"
  for text in ("hello from the import", "hello from the probe", "hello from the open", "hello from C"): assert text in stderr
  assert "plugin chatty (" in stderr


def test_plugin_output_goes_to_stderr_in_a_program(fake_plugins, capsys):
  fake_plugins.plugin(PRINTING.replace("  os.write(1, b'hello from C\\n')\n", ""), entry="chatty")
  reg = Registry(env={})
  with use(reg): assert reg.default == "CHATTY"
  out, err = capsys.readouterr()
  assert out == ""
  assert "plugin chatty" in err and "hello from the import" in err and "hello from the probe" in err and "hello from the open" in err


def test_the_fake_hooks_are_still_the_shared_ones():
  """The sources above patch conftest's fake backend; if its shape changes, they must be updated, not silently pass."""
  assert "def probe() -> Probe:\n" in backend_source("X") and DEVICE_HOOKS in backend_source("X")
