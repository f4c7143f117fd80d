"""Lowering for serial backends: make each group one thread of execution.

A CPU runs a group's threads one after another, so `serialize_groups` rewrites a
kernel so that it loops over the group's threads itself: the result has no LOCAL_ID
and no BARRIER. Without barriers the whole body sits inside one thread loop. With
barriers the body is cut at each barrier into segments, each in its own thread loop
(work-item loops, as PoCL does); loops and conditionals that contain a barrier stay
outside the thread loops and are evaluated once per group (their bounds and
conditions must be uniform, as a GPU requires). A value computed in one segment and
used in another is recomputed if it depends only on uniform values, and otherwise
kept per thread in a SPILL array. A VLOAD and its LANE ops stay together (a LANE's value is spilled, never the VLOAD).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from plugrt.compiler.ir import ALU, Kernel, Ops, UOp, verify
from plugrt.dtype import PtrDType, dtypes

#: the arg of the RANGE ops this pass creates: ("threads", axis). Renderers may treat the
#: outer ones (axes 2 and 1, usually of length 1) as plain counting loops not worth optimising.
THREAD_LOOP = ("threads",)
_HOISTED = frozenset({Ops.BUFFER, Ops.SCALAR, Ops.SHARED, Ops.CONST})
_PURE = ALU | {Ops.CAST, Ops.BITCAST}


@dataclass
class _Block:
  """A RANGE or IF with its nested items (then/else for IF)."""
  head: UOp
  body: list[Item] = field(default_factory=list)
  orelse: list[Item] | None = None
  close: UOp | None = None
  else_op: UOp | None = None
  barrier: bool = False


Item = Union[UOp, _Block]


def _parse(uops: tuple[UOp, ...]) -> list[Item]:
  root: list[Item] = []
  stack: list[tuple[_Block, list[Item]]] = []
  cur = root
  for u in uops:
    if u.op in (Ops.RANGE, Ops.IF):
      blk = _Block(u)
      cur.append(blk)
      stack.append((blk, cur))
      cur = blk.body
    elif u.op is Ops.ELSE:
      blk = stack[-1][0]
      blk.orelse, blk.else_op = [], u
      cur = blk.orelse
    elif u.op in (Ops.ENDRANGE, Ops.ENDIF):
      blk, cur = stack.pop()
      blk.close = u
    else: cur.append(u)
  return root


def _mark_barriers(items: list[Item]) -> bool:
  found = False
  for it in items:
    if isinstance(it, _Block):
      it.barrier = _mark_barriers(it.body) | _mark_barriers(it.orelse or [])
      found |= it.barrier
    elif it.op is Ops.BARRIER: found = True
  return found


def serialize_groups(kernel: Kernel) -> Kernel:
  """The same kernel with each group's threads run by explicit loops (see module doc)."""
  tree = _parse(kernel.uops)
  _mark_barriers(tree)
  spill: set[UOp] = set()
  while True:  # the first pass finds which values cross segments; the second emits their spills
    em = _Emitter(kernel, spill)
    em.run(tree)
    if em.needs_spill <= spill: break
    spill |= em.needs_spill
  return verify(Kernel(kernel.name, tuple(em.out)))


class _Emitter:
  TOP = 0

  def __init__(self, kernel: Kernel, spill: set[UOp]):
    self.k, self.spill = kernel, spill
    self.out: list[UOp] = []
    self.new: dict[UOp, UOp] = {}      # original op -> its emitted op
    self.site: dict[UOp, int] = {}     # original op -> site (0: top, odd: uniform header, even: segment)
    self.uniform_sites: set[int] = {self.TOP}
    self.needs_spill: set[UOp] = set()
    self.spill_arr: dict[UOp, UOp] = {}
    # recomputed values of the current site, one dict per open block (innermost last): a clone emitted inside an
    # IF or RANGE is out of scope once it closes, one emitted before it is reused inside
    self.clones: list[dict[UOp, UOp]] = [{}]
    self.nsite = 0
    self.cur_site, self.lids, self.flat = self.TOP, (None, None, None), None
    self.pos = {u: i for i, u in enumerate(kernel.uops)}

  def emit(self, op: Ops, dtype, src=(), arg=None) -> UOp:
    u = UOp(op, dtype, tuple(src), arg)
    self.out.append(u)
    return u

  def const(self, v: int) -> UOp: return self.emit(Ops.CONST, dtypes.int32, (), v)

  def new_site(self, uniform: bool) -> int:
    self.nsite += 1
    if uniform: self.uniform_sites.add(self.nsite)
    return self.nsite

  # ---- top: parameters, constants, launch geometry and per-group arrays, then the body
  def run(self, tree: list[Item]) -> None:
    for u in self.k.uops:
      if u.op in _HOISTED or (u.op is Ops.SPECIAL and u.arg[0] != "local_id"):
        self.new[u], self.site[u] = self.emit(u.op, u.dtype, (), u.arg), self.TOP
    self.lsize = [self.new_special("local_size", a) for a in range(3)]
    nthreads = self.emit(Ops.MUL, dtypes.int32, (self.emit(Ops.MUL, dtypes.int32, (self.lsize[0], self.lsize[1])), self.lsize[2]))
    for v in sorted(self.spill, key=self.k.uops.index):
      dt = v.dtype
      self.spill_arr[v] = self.emit(Ops.SPILL, PtrDType(dt, "private"), (nthreads,))
    self.items(tree, uniform_context=True)

  def new_special(self, kind: str, axis: int) -> UOp:
    for u, n in self.new.items():
      if u.op is Ops.SPECIAL and u.arg == (kind, axis): return n
    return self.emit(Ops.SPECIAL, dtypes.int32, (), (kind, axis))

  # ---- a block's items: in a uniform context, runs of items without barriers become segments
  def items(self, items: list[Item], uniform_context: bool) -> None:
    if not uniform_context:
      for it in items: self.item(it)
      return
    run: list[Item] = []
    for it in items:
      if isinstance(it, _Block) and it.barrier:
        self.segment(run); run = []
        self.uniform_block(it)
      elif not isinstance(it, _Block) and it.op is Ops.BARRIER:
        self.segment(run); run = []
      else: run.append(it)
    self.segment(run)

  def segment(self, run: list[Item]) -> None:
    body = [it for it in run if isinstance(it, _Block) or it not in self.new]
    if not body: return
    outer, outer_clones = self.cur_site, self.clones
    self.cur_site, self.clones = self.new_site(uniform=False), [{}]
    ranges = []
    zero = self.const(0)
    for axis in (2, 1, 0):
      ranges.append(self.emit(Ops.RANGE, dtypes.int32, (zero, self.lsize[axis]), THREAD_LOOP + (axis,)))
    lz, ly, lx = ranges
    self.lids = (lx, ly, lz)
    self.flat = self.emit(Ops.ADD, dtypes.int32, (self.emit(Ops.MUL, dtypes.int32, (
      self.emit(Ops.ADD, dtypes.int32, (self.emit(Ops.MUL, dtypes.int32, (lz, self.lsize[1])), ly)), self.lsize[0])), lx))
    for it in body: self.item(it)
    for r in reversed(ranges): self.emit(Ops.ENDRANGE, None, (r,))
    self.cur_site, self.clones, self.lids, self.flat = outer, outer_clones, (None, None, None), None

  def uniform_block(self, blk: _Block) -> None:
    outer, outer_clones = self.cur_site, self.clones
    self.cur_site, self.clones = self.new_site(uniform=True), [{}]
    head = self.emit(blk.head.op, blk.head.dtype, [self.use(s) for s in blk.head.src], blk.head.arg)
    self.new[blk.head], self.site[blk.head] = head, self.cur_site
    self.items(blk.body, uniform_context=True)
    if blk.orelse is not None:
      self.emit(Ops.ELSE, None, (head,))
      self.items(blk.orelse, uniform_context=True)
    self.emit(Ops.ENDRANGE if blk.head.op is Ops.RANGE else Ops.ENDIF, None, (head,))
    self.cur_site, self.clones = outer, outer_clones

  # ---- one item inside a segment
  def item(self, it: Item) -> None:
    if isinstance(it, _Block):
      head = self.plain(it.head)
      self.clones.append({})
      for sub in it.body: self.item(sub)
      if it.orelse is not None:
        self.emit(Ops.ELSE, None, (head,))
        self.clones[-1] = {}  # the then branch's clones are not defined in the else branch
        for sub in it.orelse: self.item(sub)
      self.clones.pop()
      self.emit(Ops.ENDRANGE if it.head.op is Ops.RANGE else Ops.ENDIF, None, (head,))
    elif it not in self.new: self.plain(it)

  def plain(self, u: UOp) -> UOp:
    if u.op is Ops.SPECIAL:  # local_id: this segment's thread loop index
      n = self.lids[u.arg[1]]
    elif u.op is Ops.VAR and u in self.spill:
      self.emit(Ops.STORE, None, (self.spill_arr[u], self.flat, self.use(u.src[0])))
      n = self.spill_arr[u]
    elif u.op is Ops.READ and u.src[0] in self.spill:
      n = self.emit(Ops.LOAD, u.dtype, (self.spill_arr[u.src[0]], self.flat))
    elif u.op is Ops.WRITE and u.src[0] in self.spill:
      n = self.emit(Ops.STORE, None, (self.spill_arr[u.src[0]], self.flat, self.use(u.src[1])))
    else: n = self.emit(u.op, u.dtype, [self.use(s) for s in u.src], u.arg)
    self.new[u], self.site[u] = n, self.cur_site
    if u.op is Ops.VLOAD:  # its LANE ops follow it directly (the verifier holds kernels to it): emit them now, spills after
      lanes = self.k.uops[self.pos[u] + 1:self.pos[u] + 1 + u.arg]
      for lane in lanes: self.new[lane], self.site[lane] = self.emit(Ops.LANE, lane.dtype, (n,), lane.arg), self.cur_site
      for lane in lanes:
        if lane in self.spill: self.emit(Ops.STORE, None, (self.spill_arr[lane], self.flat, self.new[lane]))
    if u in self.spill and u.op is not Ops.VAR: self.emit(Ops.STORE, None, (self.spill_arr[u], self.flat, n))
    return n

  # ---- translating a use of an original value at the current site
  def use(self, v: UOp) -> UOp:
    site = self.site.get(v)
    if site is not None and (site == self.cur_site or site in self.uniform_sites): return self.new[v]
    if v.op is Ops.VAR:
      self.needs_spill.add(v)
      return self.spill_arr.get(v) or self.new[v]
    if self.recomputable(v): return self.clone(v)
    self.needs_spill.add(v)
    if v not in self.spill_arr: return self.new[v]  # first pass: a placeholder, the kernel is emitted again
    return self.emit(Ops.LOAD, v.dtype, (self.spill_arr[v], self.flat if self.flat is not None else self.const(0)))

  def recomputable(self, v: UOp) -> bool:
    """Depends only on group-uniform values and the thread's own id, so any segment can recompute it."""
    site = self.site.get(v)
    if site is not None and site in self.uniform_sites: return True
    if v.op is Ops.SPECIAL: return True  # local_id: every segment has its own thread loop index
    return v.op in _PURE and all(self.recomputable(s) for s in v.src)

  def clone(self, v: UOp) -> UOp:
    site = self.site.get(v)
    if site is not None and site in self.uniform_sites: return self.new[v]
    if v.op is Ops.SPECIAL:  # local_id; in a uniform header (undefined behaviour) thread 0's view
      return self.lids[v.arg[1]] if self.flat is not None else self.const(0)
    for scope in reversed(self.clones):
      if v in scope: return scope[v]
    n = self.clones[-1][v] = self.emit(v.op, v.dtype, [self.clone(s) for s in v.src], v.arg)
    return n
