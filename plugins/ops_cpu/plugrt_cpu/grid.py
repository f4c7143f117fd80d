"""The grid runner: the one loop over a launch's groups, compiled once per machine, shared by every CPU kernel.

A CPU kernel runs one group per call (`void NAME(const u64 *args, u32 gid0, u32 gid1, u32 gid2)`, see
plugrt_cpu.crender and plugrt_cpu.llvm), so no kernel carries a loop over the grid and no compile pays for one
(docs/performance.md). The runner is

    void plugrt_grid(const u64 *block, u64 g0, u64 g1)

block = [kernel address, ng0, ng1, kind, the kernel's args...]; it runs groups g0 .. g1-1 of the flattened grid
(x fastest), so one foreign call still runs a whole grid, or a worker's slice of it (plugrt_cpu.program). kind
ONE_GROUP: the kernel runs one group per call, and is called once per group; kind SPAN: the kernel is a span variant
(plugrt_cpu.span: `void NAME(const u64 *args, u32 gx0, u32 gx1, u32 gid1, u32 gid2)` runs groups gx0 .. gx1-1 of
one row) and is called once per row piece of the slice. One runner for both, so a launch calls the same foreign
function whichever kernel it runs. It is compiled by the device's compilers like any kernel, through the compile
cache (a new machine or toolchain compiles it once), and loaded once per compiler and process.
"""
from __future__ import annotations

import threading
from typing import Any

from plugrt.errors import PluginError, PlugrtError
from plugrt_cpu.objects import check_elf, load_relocatable

RUNNER = "plugrt_grid"
ONE_GROUP, SPAN = 0, 1  # block[3]: how the kernel at block[0] is called
HEAD = 4  # block slots before the kernel's args

C_SOURCE = r"""/* plugrt's CPU grid runner */
typedef void (*plugrt_kernel)(const unsigned long long *, unsigned int, unsigned int, unsigned int);
typedef void (*plugrt_span_kernel)(const unsigned long long *, unsigned int, unsigned int, unsigned int, unsigned int);
void plugrt_grid(const unsigned long long *block, unsigned long long g0, unsigned long long g1) {
  if (g0 >= g1) return;
  const unsigned long long ng0 = block[1], ng1 = block[2], *args = block + 4;
  unsigned long long x = g0 % ng0, y = (g0 / ng0) % ng1, z = g0 / ng0 / ng1, n = g1 - g0;
  if (block[3]) {  /* a span variant: one call per row piece */
    plugrt_span_kernel fn = (plugrt_span_kernel)block[0];
    _Pragma("clang loop unroll(disable) vectorize(disable)") while (n) {
      unsigned long long span = ng0 - x < n ? ng0 - x : n;  /* the rest of this row, or of the slice */
      fn(args, (unsigned int)x, (unsigned int)(x + span), (unsigned int)y, (unsigned int)z);
      n -= span; x = 0;
      if (++y == ng1) { y = 0; z++; }
    }
    return;
  }
  plugrt_kernel fn = (plugrt_kernel)block[0];
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
  %p3 = getelementptr inbounds i64, ptr %block, i64 3
  %kind = load i64, ptr %p3, align 8
  %args = getelementptr inbounds i64, ptr %block, i64 4
  %empty = icmp uge i64 %g0, %g1
  br i1 %empty, label %exit, label %start
start:
  %x0 = urem i64 %g0, %ng0
  %yz = udiv i64 %g0, %ng0
  %y0 = urem i64 %yz, %ng1
  %z0 = udiv i64 %yz, %ng1
  %n0 = sub i64 %g1, %g0
  %is.span = icmp ne i64 %kind, 0
  br i1 %is.span, label %rows, label %loop
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
rows:
  %n = phi i64 [ %n0, %start ], [ %n.next, %rows ]
  %rx = phi i64 [ %x0, %start ], [ 0, %rows ]
  %ry = phi i64 [ %y0, %start ], [ %ry.next, %rows ]
  %rz = phi i64 [ %z0, %start ], [ %rz.next, %rows ]
  %room = sub i64 %ng0, %rx
  %short = icmp ult i64 %n, %room
  %span = select i1 %short, i64 %n, i64 %room
  %rx.end = add i64 %rx, %span
  %rx32 = trunc i64 %rx to i32
  %rxe32 = trunc i64 %rx.end to i32
  %ry32 = trunc i64 %ry to i32
  %rz32 = trunc i64 %rz to i32
  call void %fn(ptr %args, i32 %rx32, i32 %rxe32, i32 %ry32, i32 %rz32)
  %n.next = sub i64 %n, %span
  %ry.1 = add i64 %ry, 1
  %ry.wrap = icmp eq i64 %ry.1, %ng1
  %ry.next = select i1 %ry.wrap, i64 0, i64 %ry.1
  %rz.1 = add i64 %rz, 1
  %rz.next = select i1 %ry.wrap, i64 %rz.1, i64 %rz
  %rows.done = icmp eq i64 %n.next, 0
  br i1 %rows.done, label %exit, label %rows
exit:
  ret void
}
"""

_lock = threading.Lock()


def _load_runner(comp: Any) -> tuple[int, Any]:
  """(address, owner) of compiler `comp`'s runner, compiled (or read from the cache) and loaded once per compiler."""
  if (r := getattr(comp, "_grid_runner", None)) is not None: return r
  with _lock:
    if (r := getattr(comp, "_grid_runner", None)) is not None: return r
    def load(lib: bytes, name: str) -> tuple[int, Any]:  # both compilers make relocatable objects
      check_elf(lib, name)
      return load_relocatable(lib, name)
    src = LLVM_SOURCE if comp.name == "LLVM" else C_SOURCE
    lib, cached = comp.compile_cached(src)
    try: r = load(lib, RUNNER)
    except Exception as e:
      if not cached: raise
      r = load(comp.recompile(src, e), RUNNER)  # the cache held a runner that does not load
    comp._grid_runner = r
    return r


def grid_runner(device: Any, compiler: str) -> tuple[int, Any]:
  """(address, owner) of a grid runner for a kernel made by `compiler` ("CLANG" or "LLVM") on `device`: that
  compiler's runner, else the other's (any runner calls any kernel: they share the C calling convention)."""
  errors = []
  for name in (compiler, "LLVM" if compiler == "CLANG" else "CLANG"):
    try: return _load_runner(device.compiler_for(name))
    except (PlugrtError, ImportError) as e: errors.append(f"{name}: {e}")
  raise PluginError(f"{device}: no CPU compiler could build the grid runner that runs a kernel's groups ({'; '.join(errors)})",
                    "install clang (or llvmlite for the LLVM compiler)")
