#!/usr/bin/env python3
"""The long differential-fuzzing run (plugrt_testing.fuzz): random IR kernels, @kernel DSL functions and Tensor
expressions on every available device (every compiler, for IR), checked against the reference interpreter, the
DSL's semantics and numpy, until the time is up.

  python scripts/fuzz.py --seconds 600                          # every kind, seeds 0, 1, 2, ...
  python scripts/fuzz.py --kinds ir --seed 23 --count 1         # one case again (what a reproducer says)
  python scripts/fuzz.py --seconds 600 --record docs/fuzzing.md # ... and rewrite that file's "last run" section

Cases run in a worker process, one target at a time, so a device that crashes (or hangs) the process is
recorded as a failure of that target and the run goes on in a fresh worker. Each failure's reproducer
(seed, command, kernel listing / source / expression) is written to --out. Known bugs (fuzz.KNOWN_BUGS)
are not triggered unless --include-known.
"""
from __future__ import annotations

import argparse
import collections
import datetime
import multiprocessing as mp
import os
import platform
import re
import sys
import tempfile
import time
import traceback
from typing import Any

START, END = "<!-- fuzz:last-run:start -->", "<!-- fuzz:last-run:end -->"


# ---------------------------------------------------------------- the worker process

def _worker(conn: Any, log_path: str) -> None:
  """Runs cases target by target: ("case", kind, seed, avoid, target) -> ("start", target) ... ("done", outcomes)."""
  fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
  os.dup2(fd, 2)  # compilers' and drivers' chatter (and a crash's last words) go to the log, not the console
  from plugrt_testing import fuzz
  conn.send(("targets", {"ir": [str(t) for t in fuzz.ir_targets()], "dsl": fuzz.devices(), "tensor": fuzz.devices()}))
  while True:
    msg = conn.recv()
    if msg is None: return
    _, kind, seed, avoid, target = msg
    conn.send(("start", target))
    try:
      if kind == "ir": outs = fuzz.run_ir(seed, [t for t in fuzz.ir_targets() if str(t) == target], avoid)
      elif kind == "dsl": outs = fuzz.run_dsl(seed, [target], avoid)
      else: outs = fuzz.run_tensor(seed, [target], avoid)
    except Exception as e:  # the generator itself failed: a fuzzer bug, reported as such
      outs = [fuzz.Outcome(kind, seed, target, "fail", f"fuzzer error: {type(e).__name__}: {e}\n{traceback.format_exc()[-1500:]}")]
    conn.send(("done", outs))


class Worker:
  def __init__(self, log_path: str):
    self.log_path = log_path
    ctx = mp.get_context("spawn")  # never fork a process that holds GPU drivers' threads
    self.conn, child = ctx.Pipe()
    self.proc = ctx.Process(target=_worker, args=(child, log_path), daemon=True)
    self.proc.start()
    child.close()
    _, self.targets = self.recv(600)

  def recv(self, timeout: float) -> Any:
    if not self.conn.poll(timeout): raise TimeoutError(f"no answer in {timeout:.0f} s")
    return self.conn.recv()

  def run(self, kind: str, seed: int, avoid: frozenset[str], target: str, timeout: float) -> list[Any]:
    self.conn.send(("case", kind, seed, avoid, target))
    self.recv(timeout)  # "start"
    _, outs = self.recv(timeout)
    return outs

  def stop(self) -> None:
    try: self.conn.send(None)
    except OSError: pass
    self.proc.join(5)
    if self.proc.is_alive(): self.proc.kill()

  def log_tail(self, n: int = 1500) -> str:
    try:
      with open(self.log_path, errors="replace") as f: text = f.read()
    except OSError: return ""
    lines = [ln for ln in text.splitlines() if not re.match(r"^\s*(\d+:\s+0x|at /)", ln)]  # drop native backtrace frames
    return "\n".join(lines)[-n:]


# ---------------------------------------------------------------- the run

def signature(o: Any) -> str:
  from plugrt_testing import fuzz
  if (bug := fuzz.classify(o)) is not None: return f"known bug {bug}"
  d = re.sub(r"0x[0-9a-f]+|\d+(\.\d+)?(e[-+]?\d+)?", "N", o.detail.splitlines()[0] if o.detail else "")
  return re.sub(r"fuzz_(ir|dsl)_N", "fuzz_KIND", d)[:160]


def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--seconds", type=float, default=60.0, help="stop starting cases after this long (default 60)")
  ap.add_argument("--seed", type=int, default=0, help="the first seed (default 0)")
  ap.add_argument("--count", type=int, default=None, help="run exactly this many seeds per kind (ignores --seconds)")
  ap.add_argument("--kinds", default="ir,dsl,tensor", help="comma-separated: ir, dsl, tensor (default all)")
  ap.add_argument("--include-known", action="store_true", help="also build what triggers the known bugs (fuzz.KNOWN_BUGS)")
  ap.add_argument("--out", default=None, help="directory for reproducers and the worker log (default: a new temporary one)")
  ap.add_argument("--timeout", type=float, default=120.0, help="seconds one case may take on one target (default 120)")
  ap.add_argument("--record", default=None, metavar="FILE.md", help=f"rewrite FILE's section between {START} and {END}")
  args = ap.parse_args(argv)
  kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
  if bad := [k for k in kinds if k not in ("ir", "dsl", "tensor")]: ap.error(f"unknown kinds {bad}")
  sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "core"))
  from plugrt_testing import fuzz
  avoid = frozenset() if args.include_known else fuzz.AVOIDABLE
  out_dir = args.out or tempfile.mkdtemp(prefix="plugrt-fuzz-")
  os.makedirs(out_dir, exist_ok=True)
  log_path = os.path.join(out_dir, "worker.log")
  os.environ.setdefault("PLUGRT_CACHE_DIR", os.path.join(out_dir, "cache"))  # random kernels would only fill the real cache

  t0 = time.monotonic()
  worker = Worker(log_path)
  targets = worker.targets
  print(f"plugrt fuzz: kinds {','.join(kinds)}, seeds from {args.seed}, " +
        (f"{args.count} per kind" if args.count is not None else f"{args.seconds:.0f} s") + f"; reproducers in {out_dir}")
  for k in kinds: print(f"  {k}: {', '.join(targets[k]) or '(no target)'}")
  counts: dict[tuple[str, str], collections.Counter] = collections.defaultdict(collections.Counter)
  failures: list[Any] = []
  seed, done_seeds = args.seed, 0
  while True:
    if args.count is not None and done_seeds >= args.count: break
    if args.count is None and time.monotonic() - t0 >= args.seconds: break
    for kind in kinds:
      for target in targets[kind]:
        try: outs = worker.run(kind, seed, avoid, target, args.timeout)
        except (TimeoutError, EOFError, OSError) as e:  # the worker crashed or hung: that target failed this case
          worker.proc.join(1)
          why = f"timed out after {args.timeout:.0f} s" if isinstance(e, TimeoutError) else f"worker died (exit code {worker.proc.exitcode})"
          outs = [fuzz.Outcome(kind, seed, target, "fail", f"{why}; worker log tail:\n{worker.log_tail()}", fuzz.repro(kind, seed, target, avoid))]
          worker.stop()
          worker = Worker(log_path)
        for o in outs:
          counts[(kind, target)][o.status] += 1
          if o.status == "fail":
            failures.append(o)
            path = os.path.join(out_dir, f"{kind}-seed{seed}-{target.replace(':', '_')}.txt")
            with open(path, "w") as f: f.write(o.describe() + "\n")
            print(f"FAIL {kind} seed {seed} on {target}: {o.detail.splitlines()[0][:200] if o.detail else ''}  -> {path}", flush=True)
    seed, done_seeds = seed + 1, done_seeds + 1
  worker.stop()
  elapsed = time.monotonic() - t0

  print(f"\n{done_seeds} seeds per kind ({args.seed}..{seed - 1}) in {elapsed:.0f} s")
  rows = [(k, t, c) for (k, t), c in sorted(counts.items())]
  print(f"{'kind':7} {'target':14} {'ran':>5} {'failed':>6} {'skipped':>7}")
  for k, t, c in rows: print(f"{k:7} {t:14} {c['ok'] + c['fail']:5} {c['fail']:6} {c['skip']:7}")
  groups: dict[str, list[Any]] = collections.defaultdict(list)
  for o in failures: groups[signature(o)].append(o)
  if groups:
    print("\nfailures:")
    for sig, os_ in sorted(groups.items(), key=lambda kv: -len(kv[1])):
      print(f"  {len(os_):4} x {sig}  [{', '.join(sorted({o.target for o in os_}))}] e.g. {os_[0].kind} seed {os_[0].seed}")
  else: print("\nno failures")
  if args.record: record(args.record, argv if argv is not None else sys.argv[1:], kinds, targets, rows, groups, done_seeds, args.seed, elapsed)
  return 1 if failures else 0


def record(path: str, argv: list[str], kinds: list[str], targets: dict[str, list[str]], rows: list[Any], groups: dict[str, list[Any]],
           nseeds: int, first: int, elapsed: float) -> None:
  """Rewrite the file's section between the START and END markers with this run's results."""
  from plugrt.device import Device
  reg = Device.registry
  devs = []
  for name in Device.available():
    try: detail = reg.probe(name).detail
    except Exception: detail = ""
    devs.append(f"{name}" + (f" ({detail})" if detail else ""))
  cmd = " ".join(["python scripts/fuzz.py", *[a if " " not in a else repr(a) for a in argv]])
  lines = [START, "", f"Date: {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}. "
           f"Machine: {platform.machine()}, {os.cpu_count()} cores, {platform.platform()}, Python {platform.python_version()}.",
           f"Devices: {'; '.join(devs)}.", "", f"Command: `{cmd}` ({elapsed:.0f} s; seeds {first}..{first + nseeds - 1} of each kind).", "",
           "| kind | target | cases run | failed | skipped (cannot express) |", "| --- | --- | --- | --- | --- |"]
  for k, t, c in rows: lines.append(f"| {k} | {t} | {c['ok'] + c['fail']} | {c['fail']} | {c['skip']} |")
  lines.append("")
  if not groups: lines.append("Failures: none.")
  else:
    lines.append("Failures (grouped; a known bug is described in the table above):")
    lines.append("")
    for sig, os_ in sorted(groups.items(), key=lambda kv: -len(kv[1])):
      tg = ", ".join(sorted({o.target for o in os_}))
      cases = list(dict.fromkeys(f"{o.kind} {o.seed}" for o in os_))  # one case fails on several targets: name it once
      seeds = ", ".join(cases[:4]) + (", ..." if len(cases) > 4 else "")
      lines.append(f"- {len(os_)} x `{sig}` on {tg} (e.g. {seeds}); reproduce: "
                   f"`python scripts/fuzz.py --kinds {os_[0].kind} --seed {os_[0].seed} --count 1"
                   f"{' --include-known' if '--include-known' in argv else ''}`")
  lines += ["", END]
  with open(path) as f: text = f.read()
  if START in text and END in text:
    text = text[:text.index(START)] + "\n".join(lines) + text[text.index(END) + len(END):]
  else: text = text.rstrip("\n") + "\n\n## Last run\n\n" + "\n".join(lines) + "\n"
  with open(path, "w") as f: f.write(text)
  print(f"recorded in {path}")


if __name__ == "__main__":
  sys.exit(main())
