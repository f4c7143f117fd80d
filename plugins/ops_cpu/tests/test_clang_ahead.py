"""CLANG starts its next compiler process ahead (plugrt_cpu.clang._Standby): it is used once, never shared with a
forked child, replaced when it died, stopped at exit, and off with PLUGRT_CPU_CLANG_AHEAD=0."""
from __future__ import annotations

import os
import select
import subprocess
import sys
import threading
import time

import pytest

from plugrt.compiler.samples import tiny_kernel
from plugrt.registry import Registry


def clang(tmp_path, **env: str):
  reg = Registry(env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PLUGRT_CACHE": "0", **env}).load()
  return reg.open("CPU").compiler_for("CLANG")


def compile_one(comp, name: str) -> bytes:
  obj = comp.compile_uncached(comp.render(tiny_kernel(name)))
  assert obj[:4] == b"\x7fELF" and name.encode() in obj
  return obj


def test_the_next_process_waits_and_is_used_once(tmp_path) -> None:
  comp = clang(tmp_path)
  compile_one(comp, "ahead_a")
  sb = comp._standby
  assert sb is not None and sb.proc.poll() is None  # started, waiting for its source
  compile_one(comp, "ahead_b")
  assert sb.proc.returncode == 0 and comp._standby is not sb  # it compiled ahead_b; a new one waits


def test_off_when_asked(tmp_path) -> None:
  comp = clang(tmp_path, PLUGRT_CPU_CLANG_AHEAD="0")
  compile_one(comp, "ahead_off")
  assert comp._standby is None


def test_a_process_that_died_while_waiting_is_replaced(tmp_path) -> None:
  comp = clang(tmp_path)
  compile_one(comp, "ahead_c")
  comp._standby.proc.kill()
  comp._standby.proc.wait()
  compile_one(comp, "ahead_d")


def test_errors_still_name_the_source(tmp_path) -> None:
  from plugrt.errors import CompileError
  comp = clang(tmp_path)
  with pytest.raises(CompileError, match="failed to compile a CPU kernel"): comp.compile_uncached("void f(void) { nope; }")
  compile_one(comp, "ahead_after_error")


def test_threads_each_get_their_own_process(tmp_path) -> None:
  comp = clang(tmp_path)
  errors: list[BaseException] = []
  def work(i: int) -> None:
    try:
      for j in range(3): compile_one(comp, f"ahead_t{i}_{j}")
    except BaseException as e: errors.append(e)
  threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
  for t in threads: t.start()
  for t in threads: t.join()
  assert not errors


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
@pytest.mark.parametrize("child_compiles", [False, True])
def test_a_forked_child_neither_uses_nor_blocks_the_parents_process(tmp_path, child_compiles: bool) -> None:
  comp = clang(tmp_path)
  compile_one(comp, "ahead_parent")
  parents = comp._standby
  assert parents is not None
  r, w = os.pipe()
  release_r, release_w = os.pipe()
  pid = os.fork()
  if pid == 0:  # the child stays alive while the parent compiles (a worker process, holding what it inherited)
    try:
      os.close(r)
      os.close(release_w)
      if child_compiles: compile_one(comp, "ahead_child")  # with processes of its own
      os.write(w, b"ok")
      select.select([release_r], [], [], 3)  # until the parent has compiled, or 3 s: longer than its compile may take
    finally: os._exit(0)
  os.close(w)
  os.close(release_r)
  try:
    assert os.read(r, 2) == b"ok"
    assert parents.proc.poll() is None  # the child did not stop (or use) the parent's waiting process
    t = time.perf_counter()
    compile_one(comp, "ahead_parent_2")  # would wait for the child's exit if the child kept the parent's pipe open
    assert time.perf_counter() - t < 2.5
    assert parents.proc.returncode == 0  # and it compiled the parent's source
  finally:
    os.close(release_w)  # the child exits now
    os.waitpid(pid, 0)
    os.close(r)


def test_the_waiting_process_is_stopped_at_exit(tmp_path) -> None:
  script = ("import os\nfrom plugrt import Device\nfrom plugrt.compiler.samples import tiny_kernel\n"
            "c = Device['CPU'].compiler_for('CLANG')\nc.compile_uncached(c.render(tiny_kernel('ahead_exit')))\n"
            "print(c._standby.proc.pid)\n")
  p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                     env={**os.environ, "PLUGRT_CACHE": "0"})
  assert p.returncode == 0, p.stderr
  pid = int(p.stdout.split()[-1])
  with pytest.raises(ProcessLookupError): os.kill(pid, 0)
