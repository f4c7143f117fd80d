"""The grid runner: the one loop over a launch's groups, compiled once per machine, shared by every CPU kernel.

A CPU kernel runs one group per call (`void NAME(const u64 *args, u32 gid0, u32 gid1, u32 gid2)`, see
plugrt_cpu.crender and plugrt_cpu.llvm), so no kernel carries a loop over the grid: that loop cost clang about
2 ms and LLVM about 2 ms of a small kernel's compile. The runner is

    void plugrt_grid(const u64 *block, u64 g0, u64 g1)

block = [kernel address, ng0, ng1, the kernel's args...]; it calls the kernel for groups g0 .. g1-1 of the
flattened grid (x fastest), so one foreign call still runs a whole grid, or a worker's slice of it
(plugrt_cpu.program). It is compiled by the device's compilers like any kernel, through the compile cache (a
new machine or toolchain compiles it once), and loaded once per compiler and process.

The span runner `plugrt_grid_span(block, g0, g1)` is its twin for a kernel's span variant (plugrt_cpu.span:
`void NAME(const u64 *args, u32 gx0, u32 gx1, u32 gid1, u32 gid2)` runs groups gx0 .. gx1-1 of one row): one call
per row piece of the slice instead of one per group. It is compiled and loaded the same way, when a program first
launches with many small groups.
"""
from __future__ import annotations

import threading
from typing import Any

from plugrt.errors import PluginError, PlugrtError

RUNNER = "plugrt_grid"

C_SOURCE = r"""/* plugrt's CPU grid runner */
typedef void (*plugrt_kernel)(const unsigned long long *, unsigned int, unsigned int, unsigned int);
void plugrt_grid(const unsigned long long *block, unsigned long long g0, unsigned long long g1) {
  if (g0 >= g1) return;
  plugrt_kernel fn = (plugrt_kernel)block[0];
  const unsigned long long ng0 = block[1], ng1 = block[2], *args = block + 3;
  unsigned long long x = g0 % ng0, y = (g0 / ng0) % ng1, z = g0 / ng0 / ng1, n = g1 - g0;
  _Pragma("clang loop unroll(disable) vectorize(disable)") while (n--) {
    fn(args, (unsigned int)x, (unsigned int)y, (unsigned int)z);
    if (++x == ng0) { x = 0; if (++y == ng1) { y = 0; z++; } }
  }
}
"""

LLVM_SOURCE = r"""; plugrt's CPU grid runner
define void @plugrt_grid(ptr noalias readonly %block, i64 %g0, i64 %g1) nounwind {
entry:
  %fn = load ptr, ptr %block, align 8
  %p1 = getelementptr inbounds i64, ptr %block, i64 1
  %ng0 = load i64, ptr %p1, align 8
  %p2 = getelementptr inbounds i64, ptr %block, i64 2
  %ng1 = load i64, ptr %p2, align 8
  %args = getelementptr inbounds i64, ptr %block, i64 3
  %empty = icmp uge i64 %g0, %g1
  br i1 %empty, label %exit, label %start
start:
  %x0 = urem i64 %g0, %ng0
  %yz = udiv i64 %g0, %ng0
  %y0 = urem i64 %yz, %ng1
  %z0 = udiv i64 %yz, %ng1
  br label %loop
loop:
  %g = phi i64 [ %g0, %start ], [ %g.next, %loop ]
  %x = phi i64 [ %x0, %start ], [ %x.next, %loop ]
  %y = phi i64 [ %y0, %start ], [ %y.next, %loop ]
  %z = phi i64 [ %z0, %start ], [ %z.next, %loop ]
  %x32 = trunc i64 %x to i32
  %y32 = trunc i64 %y to i32
  %z32 = trunc i64 %z to i32
  call void %fn(ptr %args, i32 %x32, i32 %y32, i32 %z32)
  %x.1 = add i64 %x, 1
  %x.wrap = icmp eq i64 %x.1, %ng0
  %x.next = select i1 %x.wrap, i64 0, i64 %x.1
  %y.1 = add i64 %y, 1
  %y.inc = select i1 %x.wrap, i64 %y.1, i64 %y
  %y.wrap = icmp eq i64 %y.inc, %ng1
  %y.next = select i1 %y.wrap, i64 0, i64 %y.inc
  %z.1 = add i64 %z, 1
  %z.next = select i1 %y.wrap, i64 %z.1, i64 %z
  %g.next = add i64 %g, 1
  %done = icmp eq i64 %g.next, %g1
  br i1 %done, label %exit, label %loop
exit:
  ret void
}
"""

SPAN_RUNNER = "plugrt_grid_span"

SPAN_C_SOURCE = r"""/* plugrt's CPU grid runner for span variants */
typedef void (*plugrt_span_kernel)(const unsigned long long *, unsigned int, unsigned int, unsigned int, unsigned int);
void plugrt_grid_span(const unsigned long long *block, unsigned long long g0, unsigned long long g1) {
  if (g0 >= g1) return;
  plugrt_span_kernel fn = (plugrt_span_kernel)block[0];
  const unsigned long long ng0 = block[1], ng1 = block[2], *args = block + 3;
  unsigned long long x = g0 % ng0, y = (g0 / ng0) % ng1, z = g0 / ng0 / ng1, n = g1 - g0;
  _Pragma("clang loop unroll(disable) vectorize(disable)") while (n) {
    unsigned long long span = ng0 - x < n ? ng0 - x : n;  /* the rest of this row, or of the slice */
    fn(args, (unsigned int)x, (unsigned int)(x + span), (unsigned int)y, (unsigned int)z);
    n -= span; x = 0;
    if (++y == ng1) { y = 0; z++; }
  }
}
"""

SPAN_LLVM_SOURCE = r"""; plugrt's CPU grid runner for span variants
define void @plugrt_grid_span(ptr noalias readonly %block, i64 %g0, i64 %g1) nounwind {
entry:
  %fn = load ptr, ptr %block, align 8
  %p1 = getelementptr inbounds i64, ptr %block, i64 1
  %ng0 = load i64, ptr %p1, align 8
  %p2 = getelementptr inbounds i64, ptr %block, i64 2
  %ng1 = load i64, ptr %p2, align 8
  %args = getelementptr inbounds i64, ptr %block, i64 3
  %empty = icmp uge i64 %g0, %g1
  br i1 %empty, label %exit, label %start
start:
  %x0 = urem i64 %g0, %ng0
  %yz = udiv i64 %g0, %ng0
  %y0 = urem i64 %yz, %ng1
  %z0 = udiv i64 %yz, %ng1
  %n0 = sub i64 %g1, %g0
  br label %loop
loop:
  %n = phi i64 [ %n0, %start ], [ %n.next, %loop ]
  %x = phi i64 [ %x0, %start ], [ 0, %loop ]
  %y = phi i64 [ %y0, %start ], [ %y.next, %loop ]
  %z = phi i64 [ %z0, %start ], [ %z.next, %loop ]
  %room = sub i64 %ng0, %x
  %short = icmp ult i64 %n, %room
  %span = select i1 %short, i64 %n, i64 %room
  %x.end = add i64 %x, %span
  %x32 = trunc i64 %x to i32
  %xe32 = trunc i64 %x.end to i32
  %y32 = trunc i64 %y to i32
  %z32 = trunc i64 %z to i32
  call void %fn(ptr %args, i32 %x32, i32 %xe32, i32 %y32, i32 %z32)
  %n.next = sub i64 %n, %span
  %y.1 = add i64 %y, 1
  %y.wrap = icmp eq i64 %y.1, %ng1
  %y.next = select i1 %y.wrap, i64 0, i64 %y.1
  %z.1 = add i64 %z, 1
  %z.next = select i1 %y.wrap, i64 %z.1, i64 %z
  %done = icmp eq i64 %n.next, 0
  br i1 %done, label %exit, label %loop
exit:
  ret void
}
"""

_lock = threading.Lock()
# runner name -> (its C source, its LLVM IR source, the compiler attribute that holds it once loaded)
_RUNNERS = {RUNNER: (C_SOURCE, LLVM_SOURCE, "_grid_runner"), SPAN_RUNNER: (SPAN_C_SOURCE, SPAN_LLVM_SOURCE, "_grid_span_runner")}


def _load_runner(comp: Any, runner: str = RUNNER) -> tuple[int, Any]:
  """(address, owner) of compiler `comp`'s runner `runner`, compiled (or read from the cache) and loaded once per compiler."""
  c_src, llvm_src, attr = _RUNNERS[runner]
  if (r := getattr(comp, attr, None)) is not None: return r
  with _lock:
    if (r := getattr(comp, attr, None)) is not None: return r
    from plugrt_cpu.loader import check_elf, load_relocatable

    def load(lib: bytes, name: str) -> tuple[int, Any]:  # both compilers make relocatable objects
      check_elf(lib, name)
      return load_relocatable(lib, name)
    src = llvm_src if comp.name == "LLVM" else c_src
    lib, cached = comp.compile_cached(src)
    try: r = load(lib, runner)
    except Exception as e:
      if not cached: raise
      r = load(comp.recompile(src, e), runner)  # the cache held a runner that does not load
    setattr(comp, attr, r)
    return r


def grid_runner(device: Any, compiler: str, runner: str = RUNNER) -> tuple[int, Any]:
  """(address, owner) of a grid runner (RUNNER, or SPAN_RUNNER for span variants) for a kernel made by `compiler`
  ("CLANG" or "LLVM") on `device`: that compiler's runner, else the other's (any runner calls any kernel of its
  kind: they share the C calling convention)."""
  errors = []
  for name in (compiler, "LLVM" if compiler == "CLANG" else "CLANG"):
    try: return _load_runner(device.compiler_for(name), runner)
    except (PlugrtError, ImportError) as e: errors.append(f"{name}: {e}")
  raise PluginError(f"{device}: no CPU compiler could build the grid runner that runs a kernel's groups ({'; '.join(errors)})",
                    "install clang (or llvmlite for the LLVM compiler)")
