"""Span variants (plugrt_cpu.span): made only for launches with many small groups, from the kernel's own source, for
both compilers; every group of every grid shape and of any slice [g0, g1) runs exactly once with its ids; SPILL
arrays over a long row, barriers and shared memory give the one-group kernel's results; a program that cannot
make one (PLUGRT_CPU_SPAN=0, loaded from a binary alone, its name last rendered for another kernel) runs loop-free."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest
from cpu_tools import count_kernel, want_ids

from plugrt import Buffer, Device, KernelBuilder, dtypes
from plugrt.compiler.ir import Kernel
from plugrt_cpu import program as cpu_program
from plugrt_cpu.grid import ONE_GROUP, SPAN
from plugrt_cpu.objects import check_elf
from plugrt_cpu.relocate import link
from plugrt_cpu.span import SPAN_MAX_THREADS, SPAN_MIN_GROUPS, SPAN_MIN_ROW, span_name, span_source

pytest.importorskip("llvmlite")
COMPILERS = ("CLANG", "LLVM")


@pytest.fixture(scope="module")
def dev():
  return Device["CPU"]


@pytest.fixture
def always_span(monkeypatch):
  """Every launch with groups of at most SPAN_MAX_THREADS threads takes the span variant, however few groups."""
  monkeypatch.setattr(cpu_program, "SPAN_MIN_GROUPS", 1)
  monkeypatch.setattr(cpu_program, "SPAN_MIN_ROW", 1)


def spill_kernel(name: str, tile: int) -> Kernel:
  """out[gid] = x[gid] * 2 + (the value of the mirrored thread of the group), through shared memory and a barrier:
  `mine` lives across the barrier, so it is a SPILL array of one element per thread."""
  b = KernelBuilder(name)
  out, x = b.buffer("out", dtypes.float32), b.buffer("x", dtypes.float32)
  sh = b.shared("tile", dtypes.float32, tile)
  lid, gid = b.local_id(0), b.global_id(0)
  mine = x[gid] * 2.0
  sh[lid] = mine
  b.barrier()
  out[gid] = sh[b.local_size(0) - 1 - lid] + mine
  return b.finish()


@pytest.mark.parametrize("compiler", COMPILERS)
def test_the_span_source_compiles_to_one_span_function(dev, compiler: str) -> None:
  comp = dev.compiler_for(compiler)
  k = count_kernel("span_src")
  src = span_source(compiler, comp.render(k), k.name)
  assert src is not None
  lib = comp.compile(src)
  check_elf(lib, k.name)
  assert link(lib, span_name(compiler, k.name)) is not None, "the span object must define the span function"
  if compiler == "LLVM": assert link(lib, k.name) is None, "the group function is internal and inlined: no symbol left"


def test_a_source_that_is_not_a_cpu_kernels_has_no_span() -> None:
  assert span_source("LLVM", "define void @k() {\n  ret void\n}\n", "k") is None
  assert span_source("CLANG", "void k(void) {}\n", "k") is None


@pytest.mark.parametrize("compiler", COMPILERS)
@pytest.mark.parametrize("gs", [(1, 1, 1), (7, 1, 1), (1, 5, 1), (1, 1, 3), (3, 5, 7), (1000, 3, 2)])
@pytest.mark.parametrize("parallel", [False, True])
def test_every_group_runs_once_with_its_ids(dev, compiler: str, gs: tuple[int, int, int], parallel: bool, always_span,
                                            monkeypatch) -> None:
  if parallel: monkeypatch.setattr(cpu_program, "PARALLEL_MIN_THREADS", 1)
  prg = dev.program(count_kernel("span_count"), compiler)
  n = gs[0] * gs[1] * gs[2]
  hits, ids = Buffer(dev, n, dtypes.int32).copyin(np.zeros(n, np.int32)), Buffer(dev, n, dtypes.int32)
  prg(hits, ids, global_size=gs, local_size=(1, 1, 1), wait=True)
  assert prg.span_variant() is not None and prg._prepared.head[0] == prg.span_variant()[0], prg.span_error
  assert (hits.numpy() == 1).all(), f"groups ran {hits.numpy().tolist()} times"
  assert (ids.numpy() == want_ids(gs)).all()


@pytest.mark.parametrize("compiler", COMPILERS)
def test_any_slice_runs_exactly_its_groups(dev, compiler: str, always_span) -> None:
  """A worker's slice may start and end mid-row, and span several rows and planes."""
  prg = dev.program(count_kernel("span_count"), compiler)
  gs = (5, 3, 2)
  n = gs[0] * gs[1] * gs[2]
  hits, ids = Buffer(dev, n, dtypes.int32), Buffer(dev, n, dtypes.int32)
  prg(hits, ids, global_size=gs, wait=True)
  launch = prg._prepared
  assert launch.head[3] == SPAN, "the launch should run the span variant"
  rng = np.random.default_rng(5)
  slices = [(0, n), (0, 1), (2, 3), (2, 5), (4, 6), (3, 14), (5, 10), (7, 23), (14, 16), (29, 30), (9, 9), (12, 3)]
  slices += [tuple(sorted(rng.integers(0, n + 1, 2))) for _ in range(20)]
  for g0, g1 in slices:
    hits.copyin(np.zeros(n, np.int32))
    prg._fn(launch.argp, ctypes.c_uint64(g0), ctypes.c_uint64(g1))
    want = np.zeros(n, np.int32)
    want[g0:g1] = 1
    assert (hits.numpy() == want).all(), f"slice [{g0}, {g1}): groups ran {hits.numpy().tolist()} times"
    assert (ids.numpy()[g0:g1] == want_ids(gs)[g0:g1]).all()


@pytest.mark.parametrize("compiler", COMPILERS)
@pytest.mark.parametrize("ls", [1, 3, 16])
def test_barriers_spills_and_shared_memory_in_a_long_row(dev, compiler: str, ls: int) -> None:
  """Many small groups with a barrier, shared memory and a SPILL array: the span variant (chosen by the real
  threshold) gives each group what a call of the one-group kernel gives."""
  ng = max(SPAN_MIN_GROUPS, 1 << 17)
  k = spill_kernel(f"span_spill_{compiler}_{ls}", 16)
  xs = np.random.default_rng(ls).random(ng * ls, np.float32)
  bo, bx = Buffer(dev, ng * ls), Buffer(dev, ng * ls).copyin(xs)
  prg = dev.program(k, compiler)
  prg(bo, bx, global_size=(ng, 1, 1), local_size=(ls, 1, 1), wait=True)
  assert prg._span is not None, prg.span_error
  want = (xs * 2).reshape(ng, ls)
  np.testing.assert_array_equal(bo.numpy().reshape(ng, ls), want[:, ::-1] + want)


@pytest.mark.parametrize("compiler", COMPILERS)
def test_a_long_row_gives_back_each_groups_spill_arrays(dev, compiler: str, always_span, monkeypatch) -> None:
  """A group's SPILL array (a dynamic alloca in LLVM, a VLA in C) is freed after each inlined group: 2**15 groups of
  512 floats in one row would take 64 MiB of stack (a thread has 8) if the span kept them."""
  monkeypatch.setattr(cpu_program, "SPAN_MAX_THREADS", 512)
  monkeypatch.setattr(cpu_program, "PARALLEL_MIN_THREADS", 1 << 40)  # one call, one row, on this thread
  ng, ls = 1 << 15, 512
  xs = np.random.default_rng(2).random(ng * ls, np.float32)
  bo, bx = Buffer(dev, ng * ls), Buffer(dev, ng * ls).copyin(xs)
  prg = dev.program(spill_kernel(f"span_spill_row_{compiler}", 512), compiler)
  prg(bo, bx, global_size=(ng, 1, 1), local_size=(ls, 1, 1), wait=True)
  assert prg._prepared.head[3] == SPAN, prg.span_error
  want = (xs * 2).reshape(ng, ls)
  np.testing.assert_array_equal(bo.numpy().reshape(ng, ls), want[:, ::-1] + want)


@pytest.mark.parametrize("compiler", COMPILERS)
def test_only_many_small_groups_make_the_span(dev, compiler: str) -> None:
  b = KernelBuilder(f"span_add_{compiler}")
  c, x = b.buffer("c", dtypes.float32), b.buffer("x", dtypes.float32)
  i = b.global_id(0)
  c[i] = x[i] + 1.0
  n = SPAN_MIN_GROUPS * 32
  xs = np.arange(n, dtype=np.float32)
  bc, bx = Buffer(dev, n), Buffer(dev, n).copyin(xs)
  prg = dev.program(b.finish(), compiler)
  prg(bc, bx, global_size=(n // 32,), local_size=(32,), wait=True)  # groups too big
  prg(bc, bx, global_size=(SPAN_MIN_GROUPS // 2,), local_size=(1,), wait=True)  # too few groups
  prg(bc, bx, global_size=(SPAN_MIN_ROW - 1, SPAN_MIN_GROUPS, 1), local_size=(1,), wait=True)  # rows too short
  assert prg._span is None and prg.span_error is None
  prg(bc, bx, global_size=(n // SPAN_MAX_THREADS,), local_size=(SPAN_MAX_THREADS,), wait=True)
  assert prg._span is not None, prg.span_error
  np.testing.assert_array_equal(bc.numpy(), xs + 1)


@pytest.mark.parametrize("compiler", COMPILERS)
def test_span_off_in_the_context_runs_loop_free(compiler: str, always_span) -> None:
  import os

  from plugrt.registry import Registry
  dev = Registry(env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PLUGRT_CACHE": "0", "PLUGRT_CPU_SPAN": "0"}).load().open("CPU")
  prg = dev.program(count_kernel(f"span_off_{compiler}"), compiler)
  gs = (9, 2, 1)
  hits, ids = Buffer(dev, 18, dtypes.int32).copyin(np.zeros(18, np.int32)), Buffer(dev, 18, dtypes.int32)
  prg(hits, ids, global_size=gs, wait=True)
  assert prg._span is None and prg.span_error == "off (PLUGRT_CPU_SPAN=0)" and prg._prepared.head[3] == ONE_GROUP
  assert (hits.numpy() == 1).all() and (ids.numpy() == want_ids(gs)).all()


@pytest.mark.parametrize("compiler", COMPILERS)
def test_no_span_without_the_kernels_own_source(dev, compiler: str, always_span) -> None:
  """Loaded from a binary alone, or its name last rendered for another kernel: the program runs loop-free, and
  right (a span variant of the wrong source would run the wrong kernel)."""
  comp = dev.compiler_for(compiler)
  k = count_kernel(f"span_alone_{compiler}")
  lib = comp.compile(comp.render(k))
  other = KernelBuilder(k.name)  # same name, another kernel: rendered after k
  o = other.buffer("hits", dtypes.int32)
  other.buffer("ids", dtypes.int32)
  o[other.group_id(0)] = 7
  comp.render(other.finish())
  prg = dev.load(k.name, lib, k.signature)
  gs = (6, 2, 1)
  hits, ids = Buffer(dev, 12, dtypes.int32).copyin(np.zeros(12, np.int32)), Buffer(dev, 12, dtypes.int32)
  prg(hits, ids, global_size=gs, wait=True)
  assert prg._span is None and "does not compile to this program" in (prg.span_error or "")
  assert (hits.numpy() == 1).all() and (ids.numpy() == want_ids(gs)).all()
