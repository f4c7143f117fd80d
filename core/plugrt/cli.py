"""The `plugrt` command (also `python -m plugrt`).

  plugrt devices [--json]     every backend plugrt knows of: package, version, status,
                              default, compilers, interfaces, and why it is unavailable
  plugrt doctor [--verbose]   a kernel run and checked on every available device and
                              compiler; first the verdict (devices ready, kernels passed),
                              then each unavailable backend with its fix; --verbose adds
                              the whole `devices` listing and each kernel's figures
  plugrt bench [--quick]      launch overhead, compile time, cache-hit time and copy
                              bandwidth for each available device and compiler

`--device NAME` (doctor, bench) opens NAME as `Device[NAME]` does: an unknown or unavailable
device fails with that same error. An environment error (CPU=1 with CL=1, DEV=CUDDA) concerns
every device: it is reported once, on stderr, and every command exits 2. A device that fails its
kernels (doctor) or its measurements (bench) exits 1. Errors go to stderr in every command; so does
progress (a line per device and compiler), and only when stderr is a terminal: stdout stays the
result alone (`devices --json`, `bench --json > out.json` stay strict JSON), and logs of scripts stay
clean. A variable that reads like a mistyped device request (CUDAA=1) is listed by `devices` and
`doctor` (plugrt.selection.mistyped); elsewhere plugrt warns of it once (EnvWarning).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import time
import warnings
from typing import Any, Iterator, Sequence

from plugrt.errors import EnvWarning, PlugrtError, Reason


def _registry() -> Any:
  from plugrt.registry import current
  return current().load()


def device_rows() -> tuple[list[dict[str, Any]], str | None, str | None]:
  """(one row per backend, the default device or None, an environment error or None)."""
  reg = _registry()
  default, env_error = None, None
  try: default = reg.default
  except PlugrtError as e: env_error = str(e)
  rows = []
  for br in sorted(reg.backends.values(), key=lambda b: (-b.priority, b.name)):
    probe = reg.probe(br.name)
    compilers, interfaces, chosen = [], [], None
    if br.spec is not None and probe.ok:
      try: chosen = reg.choose_compiler(br.name)[0]
      except PlugrtError: chosen = None
      for c in br.spec.compilers:
        cp = reg.compiler_probe(br.name, c.name)
        compilers.append({"name": c.name, "ok": cp.ok, "default": c.name == chosen, "detail": cp.detail, "hint": cp.hint})
    elif br.spec is not None and probe.reason is Reason.NO_DEVICE:  # installed, no hardware: its compilers may still build (AMD's do)
      for c in br.spec.compilers:
        cp = reg.compiler_probe(br.name, c.name)
        compilers.append({"name": c.name, "ok": cp.ok, "default": False, "detail": cp.detail, "hint": cp.hint})
    elif br.spec is not None:
      compilers = [{"name": c.name, "ok": None, "default": False, "detail": "", "hint": ""} for c in br.spec.compilers]
    for spec, _ in reg.interfaces.get(br.name, []):
      ip = reg.interface_probe(spec)
      interfaces.append({"name": spec.name, "ok": ip.ok, "auto": spec.auto, "priority": spec.priority, "detail": ip.detail, "hint": ip.hint,
                         "info": dict(ip.info)})
    reason = probe.reason.value if probe.reason else None
    detail, hint = probe.detail, probe.hint
    if probe.ok and br.open_error is not None:
      reason, detail, hint = getattr(br.open_error, "reason", Reason.OPEN_FAILED).value, br.open_error.message, br.open_error.hint
    rows.append({"device": br.name, "package": br.package, "version": br.version, "available": probe.ok and br.open_error is None,
                 "count": probe.count, "default": br.name == (default or "").split(":")[0], "priority": br.priority,
                 "compilers": compilers, "interfaces": interfaces, "reason": reason, "detail": detail, "hint": hint,
                 "info": dict(probe.info), "description": br.spec.description if br.spec else "",
                 "devices": [{"index": d.index, "name": d.name, "bus_id": d.bus_id, "info": dict(d.info)} for d in probe.devices],
                 "warnings": list(br.plugin.warnings) if br.plugin is not None else []})
  return rows, default, env_error


def _collective_rows() -> list[dict[str, Any]]:
  """plugrt.distributed's collective engines (NCCL, MPI, ...) with their status, like the video decoders'."""
  try:
    from plugrt.distributed.choice import engine_rows
    return engine_rows(_registry())
  except Exception as e:  # a broken engine declaration must not take the device table down
    return [{"engine": "?", "device": "-", "package": "-", "available": False, "reason": "hook error", "detail": str(e), "hint": ""}]


def _video_rows() -> list[dict[str, Any]]:
  """plugrt.video's decoders (NVDEC, PyAV, ...) with their status, like the devices'."""
  try:
    from plugrt.video import decoder_rows
    return decoder_rows(_registry())
  except Exception as e:  # a listing never fails because of one part of it
    return [{"decoder": "?", "device": "-", "package": "-", "available": False, "reason": "hook error", "detail": str(e), "hint": ""}]


def environment_notes() -> list[str]:
  """The variables that read like mistyped device requests (CUDAA=1), each with the likely intent; none while the
  environment has an error (that is reported instead)."""
  try: return list(_registry().selection.notes)
  except PlugrtError: return []


def plugin_warnings() -> list[dict[str, str]]:
  """Each plugin's mistakes that did not stop it loading (an entry point's ignored attribute, ...), then each installed
  distribution discovery skipped because its metadata cannot be read (plugin, package and module empty)."""
  reg = _registry()
  return [{"plugin": p.entry, "package": p.package, "module": p.module_name, "warning": w} for p in reg.plugins for w in p.warnings] + \
         [{"plugin": "", "package": "", "module": "", "warning": why} for why in reg.skipped]


def _fmt_compilers(cs: list[dict[str, Any]]) -> str:
  return ",".join(c["name"] + ("*" if c["default"] else "") + ("" if c["ok"] in (True, None) else "(missing)") for c in cs) or "-"


def _fmt_ifaces(fs: list[dict[str, Any]]) -> str:
  return ",".join(f["name"] + ("" if f["ok"] else "(no)") + ("" if f["auto"] else "[manual]") for f in fs) or "-"


def _fmt_listing(device: str, d: dict[str, Any]) -> str:
  """One device of a backend's listing: "CUDA:1  <model>  0000:19:00.0  (uuid GPU-...)"."""
  extra = ", ".join(f"{k} {v}" for k, v in d["info"].items())
  return f"{device}:{d['index']}  {d['name']}  {d['bus_id'] or '-'}" + (f"  ({extra})" if extra else "")


def _progress(message: str) -> None:
  """A progress line on stderr, when a person watches it (a terminal); never on stdout."""
  if sys.stderr.isatty(): print(message, file=sys.stderr, flush=True)


@contextlib.contextmanager
def _stdout_only_for_us() -> Iterator[Any]:
  """While plugins run, whatever prints to stdout goes to stderr: Python's print, and where stdout is the process's
  file descriptor 1 also C code (a driver's printf). Yields the stream the caller's own output goes to."""
  real = sys.stdout
  try: whole_fd = real.fileno() == 1
  except (AttributeError, OSError, ValueError): whole_fd = False  # a captured or replaced stdout: Python level only
  real.flush()
  saved = os.dup(1) if whole_fd else -1
  if whole_fd: os.dup2(2, 1)
  sys.stdout = sys.stderr
  try: yield real
  finally:
    sys.stdout = real
    if whole_fd:
      sys.stderr.flush()
      os.dup2(saved, 1)
      os.close(saved)


def _print_extras(title: str, rows: list[dict[str, Any]], name: str) -> None:
  """The decoders' or engines' section of `plugrt devices`: one line each, with its status, and the fix when unusable."""
  if not rows: return
  print(f"\n{title}:")
  for r in rows:
    status = "ready" if r["available"] else r["reason"] or "unavailable"
    print(f"  {r[name]:<8} {r['device']:<6} {r['package']:<14} {status}" + (f": {r['detail']}" if r["detail"] else "") +
          (f"\n      fix: {r['hint']}" if r["hint"] and not r["available"] else ""))


def _environment_error(env_error: str) -> None:
  print(f"plugrt: environment: {env_error}", file=sys.stderr)


def cmd_devices(args: argparse.Namespace) -> int:
  """The table; exits 2 when the environment leaves no usable default device (the table still lists everything, and the
  error goes to stderr)."""
  if args.json:  # strict JSON on stdout, whatever a plugin prints while it is imported or probed
    with _stdout_only_for_us() as out:
      rows, default, env_error = device_rows()
      videos, engines = _video_rows(), _collective_rows()
    if env_error: _environment_error(env_error)
    print(json.dumps({"default": default, "environment_error": env_error, "environment_warnings": environment_notes(), "backends": rows,
                      "plugin_warnings": plugin_warnings(), "video_decoders": videos, "collective_engines": engines}, indent=2), file=out)
    return 2 if env_error else 0
  rows, default, env_error = device_rows()
  if env_error: _environment_error(env_error)
  _print_devices(rows, default)
  return 2 if env_error else 0


def _print_devices(rows: list[dict[str, Any]], default: str | None) -> None:
  """`plugrt devices`' listing on stdout: the table, what is here, why the rest is not, decoders, engines, warnings."""
  table = [("DEVICE", "PACKAGE", "VERSION", "STATUS", "DEFAULT", "COMPILERS", "INTERFACES")]
  for r in rows:
    status = (f"ready ({r['count']})" if r["count"] != 1 else "ready") if r["available"] else r["reason"] or "unavailable"
    table.append((r["device"], r["package"], r["version"] or "-", status, "*" if r["default"] else "",
                  _fmt_compilers(r["compilers"]), _fmt_ifaces(r["interfaces"])))
  widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
  for row in table: print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
  print()
  print(f"default device: {default or 'none'}   (* marks the default device and each device's default compiler)")
  if notes := environment_notes():
    print("\nenvironment (these variables do nothing):")
    for n in notes: print(f"  warning: {n}")
  facts = [(r["device"], r["detail"], r["info"]) for r in rows if r["available"] and (r["detail"] or r["info"])]
  facts += [(f"{r['device']} interface {f['name']}", f["detail"], f["info"]) for r in rows for f in r["interfaces"] if f["ok"]]
  if facts:
    print("\nwhat is here:")
    for what, detail, info in facts:
      print(f"  {what}: {detail}" + "".join(f"\n      {k}: {v}" for k, v in info.items()))
      for d in next((r["devices"] for r in rows if r["device"] == what and r["available"]), []): print("      " + _fmt_listing(what, d))
  unavailable = [(r["device"], r["detail"], r["hint"]) for r in rows if not r["available"]]
  unavailable += [(f"{r['device']} compiler {c['name']}", c["detail"], c["hint"]) for r in rows for c in r["compilers"] if c["ok"] is False]
  unavailable += [(f"{r['device']} interface {f['name']}", f["detail"], f["hint"]) for r in rows for f in r["interfaces"] if not f["ok"]]
  if unavailable:
    print("\nwhy some are unavailable:")
    for what, detail, hint in unavailable: print(f"  {what}: {detail}" + (f"\n      fix: {hint}" if hint else ""))
  _print_extras("video decoders (plugrt.video)", _video_rows(), "decoder")
  _print_extras("collective engines (plugrt.distributed)", _collective_rows(), "engine")
  warnings = plugin_warnings()
  if (loaded := [w for w in warnings if w["module"]]):
    print("\nplugin warnings (the plugins load; their authors should fix these):")
    for w in loaded: print(f"  warning: {w['package']} ({w['module']}): {w['warning']}")
  if (skipped := [w for w in warnings if not w["module"]]):
    print("\ninstalled distributions skipped (their metadata cannot be read; any plugrt plugin in them is not loaded):")
    for w in skipped: print(f"  warning: {w['warning']}")


def _targets(only: Sequence[str] | None = None) -> list[tuple[str, str]]:
  """(device, compiler) for every available device and usable compiler, or for the devices named in `only`.

  A named device opens through Device[...]'s own path, so an unknown or unavailable one raises the same typed
  error, with its "did you mean" and reason. An older name with a compiler (LLVM) keeps to that compiler.
  An environment error raises first, once: it would otherwise fail every device in turn."""
  reg = _registry()
  reg.selection  # noqa: B018  (raises EnvError, ConflictError or UnknownDeviceError)
  if not only: devices = [(name, name, "") for name in reg.available()]
  else:
    from plugrt.device import Device
    devices = []
    for text in only:
      dev = Device[text]
      alias = reg.alias_target(text)
      devices.append((dev.canonical, dev.name, alias.compiler if alias is not None else ""))
  out: list[tuple[str, str]] = []
  for device, backend, compiler in devices:
    spec = reg.backend(backend).spec
    for c in spec.compilers if spec else ():
      if (not compiler or c.name == compiler) and reg.compiler_probe(backend, c.name).ok and (device, c.name) not in out:
        out.append((device, c.name))
  return out


class _KernelResult:
  """One device and compiler's kernels in `plugrt doctor`: passed or not, and the line --verbose prints."""
  __slots__ = ("target", "ok", "line")

  def __init__(self, target: str, ok: bool, line: str): self.target, self.ok, self.line = target, ok, line


def _run_doctor_kernels(targets: list[tuple[str, str]]) -> list[_KernelResult]:
  """saxpy (checked against numpy) and a group reduction with barriers (checked against the interpreter) on each target."""
  import numpy as np

  from plugrt.compiler.samples import reduce_case, run_case, saxpy_kernel
  from plugrt.device import Buffer, Device
  out_results = []
  n = 1 << 20
  x, y = np.arange(n, dtype=np.float32) / 7, np.ones(n, dtype=np.float32)
  for i, (name, compiler) in enumerate(targets):
    _progress(f"doctor: {name}:{compiler} ({i + 1}/{len(targets)})")
    n_run = 4096 if name == "PYTHON" else n  # pure Python: keep it short
    try:
      dev = Device[name]
      t0 = time.perf_counter()
      prg = dev.program(saxpy_kernel(), compiler)
      t_build = time.perf_counter() - t0
      out, xb, yb = Buffer(dev, n_run, "float32"), Buffer.from_numpy(x[:n_run], dev), Buffer.from_numpy(y[:n_run], dev)
      t_run = prg(out, xb, yb, global_size=((n_run + 255) // 256, 1, 1), local_size=(256, 1, 1), vals=(2.0, n_run), wait=True)
      ok = bool(np.array_equal(out.numpy(), 2 * x[:n_run] + y[:n_run]))
      run_case(dev, reduce_case(), compiler)  # shared memory and barriers, checked against the interpreter
      gbs = 3 * 4 * n_run / t_run / 1e9 if t_run else 0.0
      line = (f"saxpy of {n_run} floats: {'ok' if ok else 'WRONG RESULT'} in {t_run * 1e3:.3f} ms ({gbs:.1f} GB/s), "
              f"built in {t_build * 1e3:.1f} ms; group reduction with barriers: ok")
    except Exception as e:  # report every device, then fail
      ok, line = False, f"FAILED: {type(e).__name__}: {e}"
    out_results.append(_KernelResult(f"{name}:{compiler}", ok, line))
  return out_results


def cmd_doctor(args: argparse.Namespace) -> int:
  """The verdict first (devices ready, kernels passed, variables that do nothing), then one line per unavailable
  backend with its fix; --verbose then prints the whole `plugrt devices` listing and each kernel's figures."""
  # a named device that cannot be used raises its typed error (exit 2) before anything is printed
  named = _targets(args.device) if args.device else None
  rows, default, env_error = device_rows()
  if env_error: _environment_error(env_error)
  try: _registry().selection  # noqa: B018
  except PlugrtError:
    print("plugrt: doctor: no kernels run: the environment error above stops every device from opening", file=sys.stderr)
    results = None
  else: results = _run_doctor_kernels(named if named is not None else _targets())
  ready = [r["device"] + (" (default)" if r["default"] else "") + (f" x{r['count']}" if r["count"] > 1 else "") for r in rows if r["available"]]
  print(f"devices ready: {', '.join(ready) if ready else 'none (see below)'}")
  if results is None: print("kernels: none run (environment error)")
  elif not results: print("kernels: none run: no device is available")
  else:
    passed, failed = [k.target for k in results if k.ok], [k for k in results if not k.ok]
    print(f"kernels passed: {', '.join(passed) if passed else 'none'}" + (f" ({len(passed)} of {len(results)})" if failed else ""))
    for k in failed: print(f"kernels FAILED on {k.target}: {k.line.removeprefix('FAILED: ')}")
  for note in environment_notes(): print(f"warning: {note}")
  missing = [r for r in rows if not r["available"]]
  if missing:
    print("\nunavailable:")
    width = max(len(r["device"]) for r in missing)
    for r in missing:
      print(f"  {r['device']:<{width}}  {r['reason'] or 'unavailable'}: {r['detail']}" + (f"; fix: {r['hint']}" if r["hint"] else ""))
  if args.verbose:
    print()
    _print_devices(rows, default)
    if results:
      print("\nkernels:")
      for k in results: print(f"  {k.target}".ljust(18) + k.line)
  else: print("\n(plugrt doctor --verbose: compilers, interfaces, video decoders, collective engines and each kernel's figures)")
  if results is None: return 2
  return 1 if any(not k.ok for k in results) else (2 if env_error else 0)


def _median_us(fn: Any, n: int) -> float:
  samples = []
  for _ in range(5):
    t = time.perf_counter()
    for _ in range(n): fn()
    samples.append((time.perf_counter() - t) / n * 1e6)
  return statistics.median(samples)


def bench_target(name: str, compiler: str, quick: bool = False) -> dict[str, float]:
  """Launch overhead, compile time, cache-hit time and copy bandwidth of one device and compiler."""
  import os
  import tempfile

  import numpy as np

  from plugrt.compiler.samples import tiny_kernel
  from plugrt.device import Buffer, Device
  dev = Device[name]
  comp = dev.compiler_for(compiler)
  res: dict[str, float] = {}
  prg = dev.program(tiny_kernel(), compiler)
  a, b = Buffer(dev, 1, "float32"), Buffer(dev, 1, "float32")
  prg(a, b)
  n = 200 if name == "PYTHON" else (2000 if quick else 20000)
  res["launch_us"] = _median_us(lambda: prg(a, b), n)
  dev.synchronize()
  stamp = f"{os.getpid()}_{time.time_ns()}"
  times = []
  for i in range(3 if quick else 10):
    src = comp.render(tiny_kernel(f"fresh_{stamp}_{i}"))
    t = time.perf_counter()
    comp.compile_uncached(src)
    times.append(time.perf_counter() - t)
  res["compile_ms"] = statistics.median(times) * 1e3
  with tempfile.TemporaryDirectory() as d:
    from plugrt.cache import DiskCache
    disk, comp._disk = comp._disk, DiskCache(comp.cache_namespace, root=d, env=getattr(comp, "_env", None)) if comp.cache_namespace else None
    try:
      src = comp.render(tiny_kernel(f"cached_{stamp}"))
      comp.compile(src)
      res["cache_hit_ms"] = _median_us(lambda: comp.compile(src), 20 if quick else 200) / 1e3 if comp._disk else float("nan")
    finally: comp._disk = disk
  size = (1 << 20) if name == "PYTHON" or quick else (64 << 20)
  host = np.ones(size, dtype=np.uint8)
  buf = Buffer(dev, size, "uint8")
  res["copyin_gbs"] = size / (_median_us(lambda: buf.copyin(host), 3) / 1e6) / 1e9
  res["copyout_gbs"] = size / (_median_us(lambda: buf.copyout(host), 3) / 1e6) / 1e9
  return res


def _finite(x: float) -> float | None:
  """x, or None for NaN and infinities: JSON has no such numbers (json.dumps would write NaN, which parsers refuse)."""
  return x if math.isfinite(x) else None


def cmd_bench(args: argparse.Namespace) -> int:
  rows, failed = [], 0
  targets = _targets(args.device)
  for i, (name, compiler) in enumerate(targets):
    _progress(f"bench: {name}:{compiler} ({i + 1}/{len(targets)})")
    try: r = bench_target(name, compiler, args.quick)
    except PlugrtError as e:  # on stderr: stdout holds the results alone
      print(f"plugrt: bench of {name}:{compiler} failed: {e}", file=sys.stderr)
      failed += 1
      continue
    rows.append((f"{name}:{compiler}", {k: _finite(v) for k, v in r.items()}))
  if not targets: print("plugrt: no device available to bench (run `plugrt devices` to see why)", file=sys.stderr)
  if args.json:
    print(json.dumps(dict(rows), indent=2, allow_nan=False))
    return 1 if failed or not targets else 0
  cols = (("launch us", "launch_us", 11, 2), ("compile ms", "compile_ms", 12, 2), ("cache hit ms", "cache_hit_ms", 14, 3),
          ("copyin GB/s", "copyin_gbs", 13, 2), ("copyout GB/s", "copyout_gbs", 14, 2))
  print(f"{'target':<14}" + "".join(f"{title:>{w}}" for title, _, w, _ in cols))
  for label, r in rows:
    print(f"{label:<14}" + "".join(f"{'-' if r[k] is None else format(r[k], f'.{d}f'):>{w}}" for _, k, w, d in cols))
  return 1 if failed or not targets else 0


def cmd_cache(args: argparse.Namespace) -> int:
  """`plugrt cache info` (where, how much, per compiler) and `plugrt cache clear [NAMESPACE]`."""
  from plugrt import cache
  from plugrt.runtime import size_str
  if args.action == "clear":
    if args.namespace is not None and not cache._valid_namespace(args.namespace):
      print(f"plugrt: {args.namespace!r} is not a cache namespace (see `plugrt cache info`)", file=sys.stderr)
      return 2
    n, nbytes = cache.clear(args.namespace)
    print(f"removed {n} entries ({size_str(nbytes)}) from {cache.cache_dir()}" + (f" ({args.namespace})" if args.namespace else ""))
    return 0
  st = cache.info()
  if args.json:
    print(json.dumps(st, indent=2))
    return 0
  state = "off (PLUGRT_CACHE=0)" if not st["enabled"] else "in use" if st["usable"] else "not usable (see the warning above)"
  print(f"dir:      {st['dir']}  [{state}]")
  print(f"entries:  {st['entries']}")
  print(f"size:     {size_str(st['bytes'])} of {size_str(st['max_bytes'])} (PLUGRT_CACHE_MAX_MB; least recently used entries go first)")
  for ns, d in sorted(st["namespaces"].items()): print(f"  {ns:<16}{d['entries']:>8} entries {size_str(d['bytes']):>12}")
  return 0


def _add_cache_command(sub: Any) -> None:
  c = sub.add_parser("cache", help="the compile cache: `info` (where, entries, size, cap) or `clear [NAMESPACE]`")
  c.add_argument("action", choices=("info", "clear"), nargs="?", default="info")
  c.add_argument("namespace", nargs="?", help="clear only this compiler's entries (a name `plugrt cache info` lists, e.g. cpu-clang)")
  c.add_argument("--json", action="store_true", help="machine-readable output (info)")
  c.set_defaults(fn=cmd_cache)


def main(argv: Sequence[str] | None = None) -> int:
  p = argparse.ArgumentParser(prog="plugrt", description="plugrt: a pluggable device runtime")
  sub = p.add_subparsers(dest="cmd", metavar="COMMAND")
  d = sub.add_parser("devices", help="list every backend plugrt knows of, and why any is unavailable")
  d.add_argument("--json", action="store_true", help="machine-readable output")
  d.set_defaults(fn=cmd_devices)
  doc = sub.add_parser("doctor", help="list the devices, then run and check kernels on each")
  doc.add_argument("--device", action="append", help="only this device (repeatable)")
  doc.add_argument("--verbose", "-v", action="store_true", help="also the whole `devices` listing and each kernel's figures")
  doc.set_defaults(fn=cmd_doctor)
  b = sub.add_parser("bench", help="launch, compile, cache-hit and copy figures per device and compiler")
  b.add_argument("--device", action="append", help="only this device (repeatable)")
  b.add_argument("--quick", action="store_true", help="fewer repetitions")
  b.add_argument("--json", action="store_true", help="machine-readable output")
  b.set_defaults(fn=cmd_bench)
  _add_cache_command(sub)
  words = list(sys.argv[1:] if argv is None else argv)
  if words and not words[0].startswith("-") and words[0] not in sub.choices:  # argparse (before 3.12) names no close match
    from plugrt.errors import did_you_mean
    p.error(f"unknown command {words[0]!r}{did_you_mean(words[0], sub.choices)}; commands: {', '.join(sub.choices)}")
  args = p.parse_args(argv)
  if args.cmd is None:  # as argparse answers a missing argument: the usage, on stderr, exit 2 (here with the commands listed)
    p.print_help(sys.stderr)
    return 2
  try:
    with warnings.catch_warnings():
      warnings.simplefilter("ignore", EnvWarning)  # `devices` and `doctor` list these themselves
      return args.fn(args)
  except PlugrtError as e:
    print(f"plugrt: {e}", file=sys.stderr)
    return 2


if __name__ == "__main__":
  sys.exit(main())
