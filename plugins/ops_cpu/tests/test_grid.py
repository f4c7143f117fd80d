"""The grid runner (plugrt_cpu.grid): every group of every grid shape runs exactly once, on one thread and split
over the worker pool, for kernels of both compilers, with either compiler's runner; any slice [g0, g1) of the flat
grid (starting or ending mid-row) runs exactly its groups; a long run of groups that spill gives each group's
SPILL arrays back; shared objects still load."""
from __future__ import annotations

import ctypes
import subprocess

import numpy as np
import pytest
from cpu_tools import count_kernel, want_ids

from plugrt import Buffer, Device, KernelBuilder, dtypes
from plugrt_cpu import program as cpu_program
from plugrt_cpu.grid import grid_runner
from plugrt_cpu.program import CPUProgram

pytest.importorskip("llvmlite")


@pytest.fixture(scope="module")
def dev():
  return Device["CPU"]


@pytest.mark.parametrize("compiler", ["CLANG", "LLVM"])
@pytest.mark.parametrize("gs", [(1, 1, 1), (7, 1, 1), (1, 5, 1), (1, 1, 3), (3, 5, 7), (1000, 3, 2)])
@pytest.mark.parametrize("parallel", [False, True])
def test_every_group_runs_once_with_its_ids(dev, compiler: str, gs: tuple[int, int, int], parallel: bool, monkeypatch) -> None:
  if parallel: monkeypatch.setattr(cpu_program, "PARALLEL_MIN_THREADS", 1)  # split even small grids over the workers
  prg = dev.program(count_kernel("grid_count"), compiler)
  n = gs[0] * gs[1] * gs[2]
  hits, ids = Buffer(dev, n, dtypes.int32).copyin(np.zeros(n, np.int32)), Buffer(dev, n, dtypes.int32)
  prg(hits, ids, global_size=gs, local_size=(1, 1, 1), wait=True)
  assert (hits.numpy() == 1).all(), f"groups ran {hits.numpy().tolist()} times"
  assert (ids.numpy() == want_ids(gs)).all()


@pytest.mark.parametrize("compiler", ["CLANG", "LLVM"])
def test_any_slice_runs_exactly_its_groups(dev, compiler: str) -> None:
  """A worker's slice may start and end mid-row (the runner starts it from a flat group index)."""
  prg = dev.program(count_kernel("grid_count"), compiler)
  gs = (5, 3, 2)
  n = gs[0] * gs[1] * gs[2]
  hits, ids = Buffer(dev, n, dtypes.int32), Buffer(dev, n, dtypes.int32)
  prg(hits, ids, global_size=gs, wait=True)  # prepares the launch whose block the slices below run on
  for g0, g1 in [(0, n), (0, 1), (2, 3), (2, 5), (4, 6), (3, 14), (5, 10), (7, 23), (14, 16), (29, 30), (9, 9), (12, 3)]:
    hits.copyin(np.zeros(n, np.int32))
    prg._fn(prg._prepared.argp, ctypes.c_uint64(g0), ctypes.c_uint64(g1))
    want = np.zeros(n, np.int32)
    want[g0:g1] = 1
    assert (hits.numpy() == want).all(), f"slice [{g0}, {g1}): groups ran {hits.numpy().tolist()} times"
    assert (ids.numpy()[g0:g1] == want_ids(gs)[g0:g1]).all()


@pytest.mark.parametrize("compiler", ["CLANG", "LLVM"])
def test_a_long_row_gives_back_each_groups_spill_arrays(dev, compiler: str) -> None:
  """Each group's SPILL array (a value kept across a barrier, one element per thread) must be freed after the
  group, even if one call runs many groups (a kernel with a loop over groups did), or 2**15 groups of 512 floats
  would take 64 MiB of stack."""
  b = KernelBuilder("spill_row")
  out, x = b.buffer("out", dtypes.float32), b.buffer("x", dtypes.float32)
  sh = b.shared("tile", dtypes.float32, 512)
  lid, gid = b.local_id(0), b.global_id(0)
  mine = x[gid] * 2.0                                 # loaded before the barrier, used after: spilled
  sh[lid] = mine
  b.barrier()
  out[gid] = sh[511 - lid] + mine
  ng, ls = 1 << 15, 512
  xs = np.random.default_rng(2).random(ng * ls, np.float32)
  bo, bx = Buffer(dev, ng * ls), Buffer(dev, ng * ls).copyin(xs)
  dev.program(b.finish(), compiler)(bo, bx, global_size=(ng, 1, 1), local_size=(ls, 1, 1), wait=True)
  want = (xs * 2).reshape(ng, ls)
  np.testing.assert_array_equal(bo.numpy().reshape(ng, ls), want[:, ::-1] + want)


@pytest.mark.parametrize("compiler,runner", [("CLANG", "LLVM"), ("LLVM", "CLANG")])
def test_either_runner_runs_either_compilers_kernel(dev, compiler: str, runner: str) -> None:
  """The runner and the kernel share only the C calling convention: any runner calls any kernel."""
  from plugrt_cpu.llvm import load_object
  k = count_kernel("grid_count")
  comp = dev.compiler_for(compiler)
  lib = comp.compile(comp.render(k))
  addr, owner = load_object(lib, k.name)
  prg = CPUProgram(dev, k.name, lib, k.signature, addr, owner, grid_runner(dev, runner))
  gs = (4, 3, 2)
  hits, ids = Buffer(dev, 24, dtypes.int32).copyin(np.zeros(24, np.int32)), Buffer(dev, 24, dtypes.int32)
  prg(hits, ids, global_size=gs, wait=True)
  assert (hits.numpy() == 1).all() and (ids.numpy() == want_ids(gs)).all()


def test_a_shared_object_still_loads(dev, tmp_path) -> None:
  """CLANG makes relocatable objects now; a shared object of the same source (built by hand) is dlopen'ed."""
  k = count_kernel("grid_count")
  src = dev.compiler_for("CLANG").render(k)
  so = tmp_path / "k.so"
  subprocess.run(["clang", "-O2", "-fPIC", "-shared", "-nostdlib", "-x", "c", "-", "-o", str(so)], input=src.encode(), check=True)
  prg = dev.load(k.name, so.read_bytes(), k.signature)
  hits, ids = Buffer(dev, 6, dtypes.int32).copyin(np.zeros(6, np.int32)), Buffer(dev, 6, dtypes.int32)
  prg(hits, ids, global_size=(3, 2, 1), wait=True)
  assert (hits.numpy() == 1).all() and (ids.numpy() == want_ids((3, 2, 1))).all()
