"""plugrt.distributed under attack: a rank that never starts MPI must not keep the others inside MPI_Init forever.

The jobs run under MPICH's mpiexec (the pip wheel's, next to the venv's python) in their own process group, killed
whole when a regression hangs, so that a hang fails the test instead of the suite.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("distributed_worker.py")


def _mpiexec() -> str | None:
  import importlib.util
  if importlib.util.find_spec("mpi4py") is None: return None
  here = Path(sys.executable).with_name("mpiexec")
  return str(here) if here.exists() else shutil.which("mpiexec")


MPIEXEC = _mpiexec()
needs_mpi = pytest.mark.skipif(MPIEXEC is None, reason="needs mpi4py and mpiexec: pip install mpi4py mpich")


@needs_mpi
@pytest.mark.parametrize("missing", [1, 0])
def test_a_rank_that_never_starts_mpi_is_a_timeout_naming_it(missing: int, tmp_path: Path) -> None:
  """from_env(timeout=2) with 2 ranks, one of which never starts MPI: MPI_Init alone waits forever (holding the GIL, so
  no thread of the process could stop it); plugrt meets the ranks first and raises CollectiveTimeout naming the missing
  rank and the fix. The job runs in its own process group, killed whole if this regresses into a hang."""
  env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_"))}
  t = time.monotonic()
  p = subprocess.Popen([MPIEXEC, "-n", "2", sys.executable, str(WORKER), "absent", "2", str(missing), str(tmp_path / "done")], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, env=env, cwd=WORKER.parent, start_new_session=True)
  try: out, err = p.communicate(timeout=40)
  except subprocess.TimeoutExpired:
    os.killpg(p.pid, signal.SIGKILL)
    out, err = p.communicate()
    pytest.fail(f"the job hung: {out[-2000:]}{err[-2000:]}")
  took = time.monotonic() - t
  (line,) = [x for x in out.splitlines() if x.startswith(("ERR", "OK"))]
  waiting = 1 - missing
  assert line.startswith(f"ERR {waiting} CollectiveTimeout "), out + err
  assert 1.9 < float(line.split()[3]) < 8 and took < 30
  if missing == 1: assert "rank 1 of 2 did not reach MPI_Init within 2 s" in line
  else: assert "rank 0 did not meet this rank before MPI_Init within 2 s" in line
  assert "(fix: start every rank" in line and "PLUGRT_DIST_TIMEOUT" in line
