"""Span variants: a kernel's body in a loop over a row of groups, compiled only for programs launched with many small groups.

A CPU kernel runs one group per call (plugrt_cpu.program), and it has no loop of its own over groups: any loop
costs LLVM its loop pipeline, about twice the compile time of a small kernel. But with tiny groups the call per
group, and the set-up LLVM can only hoist out of a loop around the body (callee-saved registers, the vectoriser's
run-time checks), is most of the work: c = a + b with 1-thread groups ran 45% slower than with a loop in every
kernel. So a program that gets launched with at least SPAN_MIN_GROUPS groups of at most SPAN_MAX_THREADS threads,
in rows of at least SPAN_MIN_ROW groups along x, compiles, once, its span variant

    void NAME_span(const u64 *args, u32 gx0, u32 gx1, u32 gid1, u32 gid2)  // groups gx0 .. gx1-1 of row (gid1, gid2)

and such launches call it once per row piece (the grid runner's SPAN kind, plugrt_cpu.grid). It is made from the kernel's own source
(span_source): the group function made local and always inlined into a counted loop, so each group runs exactly
the code of one call, SPILL arrays (dynamic allocas) included: LLVM's inliner gives their stack back after each
inlined call, C scopes them to it. Barriers need nothing either: a group's barrier phases are inside its call.
This is decided when a launch is prepared (a new grid shape), never on the hot path, and the variant goes
through the compile cache like any kernel; everything else compiles loop-free and fast.
"""
from __future__ import annotations

import threading

#: a launch with at least this many groups, each of at most SPAN_MAX_THREADS threads, uses the span variant
SPAN_MIN_GROUPS = 1 << 16
SPAN_MAX_THREADS = 16
#: ... and rows of at least this many groups along x (a span runs one row piece per call: with shorter rows it saves little)
SPAN_MIN_ROW = 16
#: rendered sources remembered per compiler (the most recent ones; a program whose source is gone runs loop-free)
SOURCES_KEPT = 4096


def span_name(compiler: str, name: str) -> str:
  """The span variant's symbol: NAME.span in LLVM IR, NAME__span in C (where a name cannot hold a dot)."""
  return f"{name}.span" if compiler == "LLVM" else f"{name}__span"


def span_source(compiler: str, src: str, name: str) -> str | None:
  """The span variant's source, made from kernel `name`'s source `src` for `compiler` ("LLVM": the CPU's LLVM IR;
  "CLANG": its C); None if `src` does not have the definition the CPU renderers write."""
  sname = span_name(compiler, name)
  if compiler == "LLVM":
    head = f"define void @{name}(ptr noalias readonly %args, i32 %gid0, i32 %gid1, i32 %gid2)"
    if src.count(head) != 1: return None
    return src.replace(head, head.replace("define void", "define internal void"), 1) + f"""
define void @{sname}(ptr noalias readonly %args, i32 %gx0, i32 %gx1, i32 %gid1, i32 %gid2) nounwind {{
entry:
  %any = icmp ult i32 %gx0, %gx1
  br i1 %any, label %group, label %exit
group:
  %x = phi i32 [ %gx0, %entry ], [ %x.next, %group ]
  call void @{name}(ptr %args, i32 %x, i32 %gid1, i32 %gid2) alwaysinline
  %x.next = add nuw i32 %x, 1
  %more = icmp ult i32 %x.next, %gx1
  br i1 %more, label %group, label %exit
exit:
  ret void
}}
"""
  head = f"\nvoid {name}(const unsigned long long *args, unsigned int gid0_, unsigned int gid1_, unsigned int gid2_) {{"
  if src.count(head) != 1: return None
  # flatten: every call in the loop is inlined (clang and gcc), so the group function leaves no trace of its own
  return src.replace(head, head.replace("\nvoid ", "\nstatic inline void ", 1), 1) + f"""
__attribute__((flatten)) void {sname}(const unsigned long long *args, unsigned int gx0, unsigned int gx1, unsigned int gid1,
                                      unsigned int gid2) {{
  for (unsigned int x = gx0; x < gx1; x++) {name}(args, x, gid1, gid2);
}}
"""


class RenderedSources:
  """The most recent source each compiler rendered per kernel name, so that a program can later make its span
  variant (the program itself holds only the binary). A program checks that the source compiles to its binary
  before it trusts it (two kernels may share a name)."""

  def __init__(self) -> None:
    self._by_name: dict[str, str] = {}
    self._lock = threading.Lock()

  def remember(self, name: str, src: str) -> None:
    with self._lock:
      self._by_name.pop(name, None)
      self._by_name[name] = src
      if len(self._by_name) > SOURCES_KEPT: self._by_name.pop(next(iter(self._by_name)))

  def get(self, name: str) -> str | None: return self._by_name.get(name)
