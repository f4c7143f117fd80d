"""Tensor: n-dimensional arrays on any plugrt device, lazily evaluated.

    from plugrt import Tensor
    t = Tensor([1, 2, 3], device="CPU")
    ((t + 1) * t.exp()).numpy()

Elementwise operations build a graph; `realize()` (or `.numpy()`, `.tolist()`, `.to()`)
turns each chain of elementwise operations into ONE kernel, which is compiled once per
structure (operations, dtypes, shapes and strides) and device: constants and view
offsets are kernel arguments, so `t + 1` and `t + 2` share a kernel. Reductions (sum,
max, mean) are kernels of their own, with the elementwise chain that feeds them fused
in. Views (reshape, permute, expand, slicing) are zero-copy strides over a buffer; a
view of an unrealised chain is pushed down to the chain's inputs.

Operations follow numpy: broadcasting, type promotion (Python scalars take the tensor's
kind), `/` is true division, `//` and `%` floor (numpy's floor_divide and remainder, for
floats exactly: a zero divisor gives inf or NaN). Integers wrap at their dtype's width.
Bools: `+` and maximum are or, `*` and minimum and, max() any, min() all; `//` and `%`
give int8; `-` is a TypeError (use `^`).

Image tensors (dtype dtypes.imagef((h, w)) or imageh, on a device with images: CL, QCOM, PYTHON) are float tensors
whose storage is the device's image memory, as in the seeds: any shape of h*w*4 elements (the caller's: (h*w*4,) as
the seeds pass it, or (h, w, 4)), element (y*w + x)*4 + c being texel (x, y)'s channel c. Elementwise ops, reductions,
views and `.numpy()` read the texels as float32 (imagef) or float16 (imageh), and write their results to plain
buffers; `assign` into one is refused (a @kernel writes texels with write_texel). `t.cast(dtypes.float32)` is the
texels as a plain tensor, and `.to()` a device without images gives that plain tensor too. A device without images
refuses image buffers, and so image tensors, with UnsupportedError.
"""
from __future__ import annotations

import functools
import math
import operator
from collections.abc import Sequence
from typing import Any, NamedTuple

from plugrt.compiler.arith import ir_floordiv, ir_math, promote
from plugrt.compiler.ir import VECTOR_BYTES, Kernel, KernelBuilder, Val
from plugrt.device import Buffer, RuntimeDevice, _device
from plugrt.dtype import DType, ImageDType, cast_value, dtypes

Shape = tuple[int, ...]


# ---------------------------------------------------------------- views

@functools.lru_cache(maxsize=1024)
def _row_major(shape: Shape) -> tuple[int, ...]:
  """The strides of a contiguous view of `shape` (0 for dimensions of 1); every realisation asks, a shape repeats."""
  strides, acc = [], 1
  for d in reversed(shape):
    strides.append(acc if d != 1 else 0)
    acc *= d
  return tuple(reversed(strides))


class View(NamedTuple):
  """Elements of a buffer: element (i0, i1, ...) is at offset + sum(i_d * strides_d)."""
  shape: Shape
  strides: tuple[int, ...]
  offset: int = 0

  @staticmethod
  def contiguous(shape: Shape, offset: int = 0) -> View: return View(shape, _row_major(shape), offset)

  @property
  def is_contiguous(self) -> bool: return self.strides == _row_major(self.shape)

  def reshape(self, shape: Shape) -> View | None:
    """The same elements as `shape`, or None when strides cannot express it (then the data must be copied)."""
    if self.is_contiguous or _numel(shape) == 0: return View.contiguous(shape, self.offset)
    old = [(d, s) for d, s in zip(self.shape, self.strides) if d != 1]
    new = [d for d in shape if d != 1]
    strides: list[int] = []
    oi = ni = 0
    while oi < len(old) and ni < len(new):  # match groups of old and new dims with equal products
      po, pn, oj, nj = old[oi][0], new[ni], oi + 1, ni + 1
      while po != pn:
        if pn < po: pn, nj = pn * new[nj], nj + 1
        else: po, oj = po * old[oj][0], oj + 1
      if any(old[k][1] != old[k + 1][0] * old[k + 1][1] for k in range(oi, oj - 1)): return None  # the old group is not one run
      s, group = old[oj - 1][1], []
      for k in range(nj - 1, ni - 1, -1):
        group.append(s)
        s *= new[k]
      strides += reversed(group)
      oi, ni = oj, nj
    it = iter(strides)
    return View(shape, tuple(0 if d == 1 else next(it) for d in shape), self.offset)

  def permute(self, order: Sequence[int]) -> View:
    return View(tuple(self.shape[o] for o in order), tuple(self.strides[o] for o in order), self.offset)

  def expand(self, shape: Shape) -> View:
    return View(shape, tuple(s if od == d else 0 for od, d, s in zip(self.shape, shape, self.strides)), self.offset)

  def slice(self, parts: Sequence[tuple[int, int, int]]) -> View:
    """parts: (start, count, step) per dim."""
    off = self.offset + sum(st * s for (st, _, _), s in zip(parts, self.strides))
    return View(tuple(c for _, c, _ in parts), tuple(s * step if c != 1 else 0 for (_, c, step), s in zip(parts, self.strides)), off)


# ---------------------------------------------------------------- the lazy graph

class Node:
  """One value of the graph. op: "buf" (a realised buffer and a view of it), "const" (a scalar, broadcast),
  "ew" (an elementwise op of same-shaped sources), "reduce" (arg: (op, axes), keeps reduced axes as 1). leaf: a "buf"
  node's facts as a kernel input, once asked (_leaf_of: a buffer's address and a view never change)."""
  __slots__ = ("op", "dtype", "shape", "srcs", "arg", "buffer", "view", "device", "leaf")

  def __init__(self, op: str, dtype: DType, shape: Shape, device: RuntimeDevice, srcs: tuple[Node, ...] = (), arg: Any = None,
               buffer: Buffer | None = None, view: View | None = None):
    self.op, self.dtype, self.shape, self.device, self.srcs, self.arg, self.buffer, self.view, self.leaf = \
      op, dtype, shape, device, srcs, arg, buffer, view, None


def _numel(shape: Shape) -> int: return math.prod(shape)


_prod = math.prod  # _numel without a Python call, where a realize asks


def _image_shape(dt: ImageDType, shape: Shape) -> Shape:
  """The shape the caller gave an image tensor, checked: any shape of h*w*4 elements ((h*w*4,) as the seeds pass it)."""
  if _numel(shape) != dt.size:
    from plugrt.errors import ImageError
    raise ImageError(f"a tensor of {dt!r} has h*w*4 = {dt.size} elements, the data has shape {shape} ({_numel(shape)} elements)",
                     f"give {dt.size} values, e.g. shape {(dt.size,)} or {(dt.height, dt.width, 4)}")
  return shape


def _value_dtype(dt: DType) -> DType:
  """The dtype a tensor's values compute in: an image's texel type (float32, float16), any other dtype itself."""
  return dt.base if isinstance(dt, ImageDType) else dt


def _texels(n: Node) -> Node:
  """A node as the values operations take: an image's texels read as its texel type (a cast node over the image)."""
  return _cast_node(n, n.dtype.base) if isinstance(n.dtype, ImageDType) else n


def _as_shape(shape: Any) -> Shape:
  """A shape given by the caller (an int or a sequence of ints) as a tuple, checked: TypeError/ValueError otherwise."""
  dims = (shape,) if isinstance(shape, int) else shape
  if not isinstance(dims, (tuple, list)): raise TypeError(f"a shape is an int or a sequence of ints, not {type(shape).__name__}")
  for d in dims:
    if not isinstance(d, int) or isinstance(d, bool): raise TypeError(f"shape {shape!r}: dimensions must be ints, not {type(d).__name__}")
    if d < 0: raise ValueError(f"shape {shape!r}: dimensions must not be negative")
  return tuple(dims)


def _buf_node(buf: Buffer, shape: Shape, view: View | None = None) -> Node:
  return Node("buf", buf.dtype, shape, buf.device, buffer=buf, view=view or View.contiguous(shape))


def _movement(node: Node, fn: Any, shape: Shape) -> Node:
  """Apply a view change (fn: View -> View | None) to node, pushing it through elementwise ops to their inputs."""
  return _moved(node, fn, shape, {})


def _moved(n: Node, fn: Any, shape: Shape, memo: dict[int, Node]) -> Node:
  # (a module function, not a closure calling itself: that would be a reference cycle holding the nodes, and so their
  # buffers, until the garbage collector runs)
  if id(n) in memo: return memo[id(n)]
  if n.op == "const": out = Node("const", n.dtype, shape, n.device, arg=n.arg)
  elif n.op == "ew": out = Node("ew", n.dtype, shape, n.device, tuple([_moved(s, fn, shape, memo) for s in n.srcs]), n.arg)
  else:
    if n.op == "reduce": _realize(n, in_place=True)  # a reduction is a kernel of its own: its result is a buffer
    v = fn(n.view)
    if v is None:  # strides cannot express it: copy to a contiguous buffer first
      n = _realize(n, force_copy=True)
      v = fn(n.view)
    out = Node("buf", n.dtype, shape, n.device, buffer=n.buffer, view=v)
  memo[id(n)] = out
  return out


# ---------------------------------------------------------------- kernels for the graph

_EW_RESULT = {"cmplt": dtypes.bool, "cmple": dtypes.bool, "cmpeq": dtypes.bool, "cmpne": dtypes.bool, "not": dtypes.bool}
_BOOL_LOGIC = {"add": "or", "max": "or", "mul": "and", "min": "and"}
_BINARY = {"add": operator.add, "sub": operator.sub, "mul": operator.mul, "and": operator.and_, "or": operator.or_, "xor": operator.xor}


def _apply(op: str, srcs: list[Val], node: Node) -> Val:
  a = srcs[0]
  if a.dtype is dtypes.bool and op in _BOOL_LOGIC: op = _BOOL_LOGIC[op]  # numpy's bool arithmetic is logic (ADD/MUL/MAX/MIN take no bool)
  if op in _BINARY: return _BINARY[op](a, srcs[1])
  if op == "div": return a / srcs[1]
  if op in ("floordiv", "mod"): return ir_floordiv(a, srcs[1])[op == "mod"]
  if op == "max": return a.max(srcs[1])
  if op == "min": return a.min(srcs[1])
  if op == "cmplt": return a < srcs[1]
  if op == "cmple": return a <= srcs[1]
  if op == "cmpeq": return a.eq(srcs[1])
  if op == "cmpne": return a.ne(srcs[1])
  if op == "where": return a.where(srcs[1], srcs[2])
  if op == "neg": return -a
  if op == "not": return ~a
  if op == "cast": return a if a.dtype is node.dtype else a.cast(node.dtype)
  if op == "pow": return (srcs[1] * a.log2()).exp2()
  return ir_math(a, op)  # exp log exp2 log2 sqrt sin cos abs floor ceil trunc recip


class _Ctx:
  """One realisation: its inputs (buffer views and constants, in kernel-parameter order) and its cache key."""
  __slots__ = ("aligned", "index", "leaves")

  def __init__(self) -> None:
    self.leaves: list[Node] = []
    self.index: dict[Any, int] = {}
    self.aligned: list[bool] = []  # per leaf: a contiguous view whose first element is aligned for vector loads

  def leaf(self, n: Node) -> int:
    if n.op == "buf":
      v = n.view
      k: Any = (id(n.buffer), v.shape, v.strides, v.offset)
    else: k = id(n)
    if (i := self.index.get(k)) is None:
      i = self.index[k] = len(self.leaves)
      self.leaves.append(n)
      self.aligned.append(n.op == "buf" and n.view.is_contiguous and vector_aligned(n.buffer, n.view.offset))
    return i

  def key(self, n: Node, memo: dict[int, Any]) -> Any:
    if (seen := memo.get(id(n))) is not None: return ("ref", seen)
    # a leaf's shape is part of its kernel: a reduction loops over its source's extent, which the reduce node's own
    # (output) shape does not give; without it a sum of 3 and one of 4 elements, both to shape (1,), would share a kernel
    # (a constant's too: Tensor.full(4, 1.0).sum())
    op = n.op
    if op == "buf":
      i = self.leaf(n)
      out: Any = ("buf", i, n.dtype.name, n.view.shape, n.view.strides, self.aligned[i])
    elif op == "const": out = ("const", self.leaf(n), n.dtype.name, n.shape)
    else: out = (op, n.dtype.name, n.arg, n.shape, tuple([self.key(s, memo) for s in n.srcs]))
    memo[id(n)] = len(memo)
    return out


def vector_aligned(buf: Buffer, offset: int = 0) -> bool:
  """Whether element `offset` of `buf` may be the first of a vector load or store of _VEC elements (or of 2, where 4
  would pass 16 bytes): its address a multiple of the vector's size (see plugrt.compiler.ir). plugrt's allocations are aligned to
  at least 16 bytes; wrapped memory (from_blob, DLPack) is checked at its address where the device tells it, and is
  taken as unaligned where it does not. Images have no plain loads."""
  dt = buf.dtype
  if isinstance(dt, ImageDType): return False
  root = buf.base or buf
  at = buf.offset + offset * dt.itemsize
  if root._external:
    alloc = root.device.allocator
    try: at += alloc._pointer(root.handle) if alloc.dlpack_device() is not None else 1  # 1: an address it cannot tell
    except Exception: return False  # an allocator that exports no addresses: take the scalar path
  return at % min(VECTOR_BYTES, _VEC * dt.itemsize) == 0


_KERNELS: dict[tuple, Kernel] = {}
#: what a realize of a graph of one structure launches: plan key (_plan_key's key of the graph, the device, the staging,
#: the target view's facts, the kernel knobs) -> (Program, global size, local size, the result's view); a first stage of a
#: staged reduction (_reduce_partials) -> its Program
_PLANS: dict[tuple, Any] = {}
#: a buffer of this many elements or more takes 64-bit index arithmetic (_FusedKernel's `wide`)
_WIDE = 2**31 - 1


def _leaf_of(n: Node) -> tuple[tuple, tuple]:
  """A "buf" node's facts as a kernel input, kept on the node: its identity among a graph's leaves (_Ctx.leaf's: the
  same buffer through the same view is one input) and its part of a realize plan's key: dtype, view shape and strides,
  whether vector access is aligned (contiguous and the first element's address), whether the buffer needs wide indices."""
  v, buf = n.view, n.buffer
  aligned = v.is_contiguous and vector_aligned(buf, v.offset)
  info = n.leaf = ((id(buf), v.shape, v.strides, v.offset), ("buf", n.dtype.name, v.shape, v.strides, aligned, buf.size >= _WIDE))
  return info


def _plan_key(n: Node, memo: dict[int, int], index: dict[Any, int], bufs: list[Buffer], vals: list[Any]) -> Any:
  """n's part of a realize plan's key: everything its kernel and launch depend on (_Ctx.key's structure, leaf numbers
  and facts, and per buffer whether it needs wide indices); an op node met again is its number in the walk. Collects
  the leaves as _Ctx numbers them, the kernel's parameter order: into `bufs` each buffer input, into `vals` per leaf its
  view offset or a constant's value (`index`: a buffer leaf's identity or a constant node's id -> its number). A
  reduction among the sources runs here, first, as a kernel of its own (a buffer after)."""
  op = n.op
  if op == "buf":
    ident, part = n.leaf or _leaf_of(n)
    if (i := index.get(ident)) is None:
      i = index[ident] = len(vals)
      bufs.append(n.buffer)
      vals.append(n.view.offset)
    return (i, part)
  if op == "const":
    if (i := index.get(id(n))) is None:
      i = index[id(n)] = len(vals)
      vals.append(n.arg)
    return ("const", i, n.dtype.name, n.shape)
  if (seen := memo.get(id(n))) is not None: return seen
  if op == "reduce":
    _realize(n, in_place=True)
    return _plan_key(n, memo, index, bufs, vals)
  srcs = n.srcs
  if len(srcs) == 2: ks: tuple = (_plan_key(srcs[0], memo, index, bufs, vals), _plan_key(srcs[1], memo, index, bufs, vals))
  else: ks = tuple([_plan_key(s, memo, index, bufs, vals) for s in srcs])
  memo[id(n)] = len(memo)
  return (op, n.dtype.name, n.arg, n.shape, ks)


def _kernel(root: Node, ctx: _Ctx, key: tuple, wide: bool, out_strides: tuple[int, ...] | None, out_aligned: bool,
            grid: tuple[int, ...] = (), groups: int = 0) -> Kernel:
  """The fused kernel for a graph of this structure (built once; ctx.leaves are its inputs in parameter order). grid: an
  elementwise kernel's launch (_ew_grid); groups: a staged reduction's kernel (see _realize), `groups` groups."""
  if (k := _KERNELS.get(key)) is not None: return k
  f = _FusedKernel(root, ctx, wide, out_strides, out_aligned)
  if groups: k = _group_kernel(f, groups)
  else: k = _reduce_kernel(f) if root.op == "reduce" else _elementwise_kernel(f, grid)
  _KERNELS[key] = k
  return k


class _FusedKernel:
  """What the elementwise and the reduction kernels share: the parameters (out, then per leaf a buffer and its view
  offset or a constant, then out_off when writing into a view), the index dtype, and the lowering of the graph's
  elementwise part at an index. Parameters are declared here in that order: it is the kernel's signature."""

  def __init__(self, root: Node, ctx: _Ctx, wide: bool, out_strides: tuple[int, ...] | None, out_aligned: bool):
    self.root, self.ctx, self.out_strides, self.out_aligned = root, ctx, out_strides, out_aligned
    assert not isinstance(root.dtype, ImageDType), "results are plain buffers: images are only read (TEXEL_LOAD)"
    it = self.it = dtypes.int64 if wide else dtypes.int32  # index arithmetic
    b = self.b = KernelBuilder("reduce" if root.op == "reduce" else "fused")
    self.out = b.buffer("out", root.dtype)
    params: list[Any] = []
    for i, l in enumerate(ctx.leaves):
      params.append(b.buffer(f"in{i}", l.dtype) if l.op == "buf" else None)
    for i, l in enumerate(ctx.leaves):
      if l.op == "buf": params[i] = (params[i], b.scalar(f"off{i}", it))
      else: params[i] = b.scalar(f"c{i}", l.dtype)
    self.params = params
    self.out_off = b.scalar("out_off", it) if out_strides is not None else None
    self.n_out = _numel(root.shape)

  def index(self, v: Val) -> Val:
    """An int32 id or count as the index dtype."""
    return v.cast(self.it) if self.it is dtypes.int64 else v

  def unflatten(self, flat: Val, shape: Shape) -> list[Any]:
    idx, rest = [], flat
    outer = next((i for i, d in enumerate(shape) if d != 1), len(shape))
    for i in range(len(shape) - 1, -1, -1):
      d = shape[i]
      if d == 1: idx.append(0)
      elif i == outer: idx.append(rest)  # flat < numel, so the outermost index needs no modulo
      else:
        idx.append(rest % d)
        rest = rest // d
    return list(reversed(idx))

  def lower(self, n: Node, idx: Sequence[Any], memo: dict[int, Val]) -> Val:
    if id(n) in memo: return memo[id(n)]
    if n.op == "buf":
      ptr, off = self.params[self.ctx.index[(id(n.buffer), n.view.shape, n.view.strides, n.view.offset)]]
      addr: Val = off
      for i, s in zip(idx, n.view.strides):
        if s and not (isinstance(i, int) and i == 0): addr = addr + i * s
      v = self.texel(ptr, n.dtype, addr) if isinstance(n.dtype, ImageDType) else ptr[addr]
    elif n.op == "const": v = self.params[self.ctx.index[id(n)]]
    elif n.op == "reduce": raise AssertionError("reduce sources are realised first")
    else: v = _apply(n.arg, [self.lower(s, idx, memo) for s in n.srcs], n)
    memo[id(n)] = v
    return v

  def chunk(self, n: Node, shape: Shape, base: Val) -> list[Val]:
    """n's values at the _VEC flat elements base.. of `shape` (base a multiple of _VEC, all inside): the leaves whose
    view is contiguous read them at offset + base, with vector loads where the view is aligned (one of _VEC elements, or
    two of 2 where _VEC would pass 16 bytes), else one at a time; other leaves at each element's strided address."""
    vectors: dict[int, tuple[Val, ...]] = {}
    oidx: list[list[Any] | None] = [None] * _VEC
    memos: list[dict[int, Val]] = [{} for _ in range(_VEC)]

    def at(m: Node, j: int) -> Val:
      if id(m) in memos[j]: return memos[j][id(m)]
      if m.op == "buf" and m.view.shape == shape and m.view.is_contiguous and not isinstance(m.dtype, ImageDType):
        i = self.ctx.index[(id(m.buffer), m.view.shape, m.view.strides, m.view.offset)]
        ptr, off = self.params[i]
        if not self.ctx.aligned[i]: v = ptr[off + base + j if j else off + base]
        else:
          if i not in vectors:
            w = _VEC if _VEC * m.dtype.itemsize <= VECTOR_BYTES else 2
            vectors[i] = sum((ptr.vload(off + base + k if k else off + base, w) for k in range(0, _VEC, w)), ())
          v = vectors[i][j]
      elif m.op in ("buf", "const"):
        if m.op == "buf" and oidx[j] is None: oidx[j] = self.unflatten(base + j if j else base, shape)
        v = self.lower(m, oidx[j] or [], {})
      else: v = _apply(m.arg, [at(x, j) for x in m.srcs], m)
      memos[j][id(m)] = v
      return v
    return [at(n, j) for j in range(_VEC)]

  def store_chunk(self, base: Val, values: Sequence[Val]) -> None:
    """Write a chunk's values (elements base.., all inside): vector stores into a fresh buffer or an aligned contiguous
    view, else one at a time at each element's destination."""
    if self.out_aligned:
      dest = base if self.out_off is None else self.out_off + base
      w = _VEC if _VEC * self.root.dtype.itemsize <= VECTOR_BYTES else 2
      for k in range(0, _VEC, w): self.out.vstore(dest + k if k else dest, values[k:k + w])
      return
    for j, v in enumerate(values):
      g = base + j if j else base
      self.out[self.destination(g, self.unflatten(g, self.root.shape))] = v

  def texel(self, img: Any, dt: ImageDType, addr: Val) -> Val:
    """Element `addr` of an image, (y*w + x)*4 + c: channel c of texel (x, y), through TEXEL_LOAD (images have no plain loads)."""
    e = addr.cast(dtypes.int32) if addr.dtype is not dtypes.int32 else addr  # an image has fewer than 2**31 elements
    t, c = e // 4, e % 4
    r, g, b, a = img.read_texel(t % dt.width, t // dt.width)
    return c.eq(0).where(r, c.eq(1).where(g, c.eq(2).where(b, a)))

  def destination(self, g: Val, oidx: list[Any]) -> Val:
    if self.out_off is None: return g
    dest = self.out_off  # writing into a view (assign): its own strides and offset
    for i, s in zip(oidx, self.out_strides):  # type: ignore[arg-type]
      if s and not (isinstance(i, int) and i == 0): dest = dest + i * s
    return dest


def _ew_grid(n: int) -> tuple[int, int, int, int]:
  """The launch of an elementwise kernel over n elements, (gx, gy, local, per): gx * gy groups of `local` threads, each
  thread taking `per` chunks of _VEC elements, so that one pass of the grid covers every chunk (no loop in the kernel).
  Past _MAX_GROUPS groups the grid takes a second axis, of a few rows more than it must where that makes the rows even
  (no group outside the chunks, so no guard); past _MAX_GROUPS squared, more chunks a thread."""
  return _grid_for(n, _UNROLL, _GROUP, _MAX_GROUPS)


@functools.lru_cache(maxsize=1024)
def _grid_for(n: int, unroll: int, group: int, max_groups: int) -> tuple[int, int, int, int]:
  chunks = n // _VEC
  per = max(unroll, -(-chunks // (group * max_groups * max_groups)))
  local = max(1, min(group, -(-chunks // per)))
  groups = max(1, -(-chunks // (local * per)))
  gy = -(-groups // max_groups)
  gy = next((y for y in range(gy, min(gy + 64, max_groups + 1)) if groups % y == 0), gy)
  return -(-groups // gy), gy, local, per


def _elementwise_kernel(f: _FusedKernel, grid: tuple[int, ...]) -> Kernel:
  """One pass, no loop (grid: _ew_grid): thread l of group g (flattened, x fastest) takes the `per` chunks of _VEC
  contiguous output elements g * local * per + l + local * k, k < per (vector loads and stores where the views allow).
  With several, all their loads come first, at a chunk index clamped into range (so every load is valid), then the
  guarded stores, so a thread has that many independent loads in flight (a store between them would order them: the
  output may alias an input); with one, a guard around it. Where the grid covers the chunks exactly there is no
  guard. The last n % _VEC elements (the tail) are thread 0's, one at a time."""
  b, n_out = f.b, f.n_out
  gx, gy, local, per = grid
  chunks, tail = divmod(n_out, _VEC)
  g = f.index(b.group_id(0))
  if gy > 1: g = g + f.index(b.group_id(1)) * gx
  first = g * (local * per) + f.index(b.local_id(0)) if local * per > 1 else g
  if chunks:
    exact = gx * gy * local * per == chunks
    cs = [first + local * k if k else first for k in range(per)]
    if per == 1 and not exact:
      with b.if_(first < chunks):
        base = first * _VEC
        f.store_chunk(base, f.chunk(f.root, f.root.shape, base))
    else:
      results = [(c, f.chunk(f.root, f.root.shape, (c if exact else c.min(chunks - 1)) * _VEC)) for c in cs]
      for c, values in results:
        if exact: f.store_chunk(c * _VEC, values)
        else:
          with b.if_(c < chunks): f.store_chunk(c * _VEC, values)
  if tail:
    with b.if_(first.eq(0)):
      for i in range(chunks * _VEC, n_out):
        gv = b.const(i, f.it)
        oidx = f.unflatten(gv, f.root.shape)
        f.out[f.destination(gv, oidx)] = f.lower(f.root, oidx, {})
  return b.finish()


def _fold(f: _FusedKernel, threads: int, tid: Val) -> Val:
  """What thread `tid` of `threads` contributes to a reduction over all of f.root's source: it folds chunks tid,
  tid + threads, ... (_VEC contiguous elements each, vector loads where the views allow; _REDUCE_UNROLL chunks per step,
  loads first) into one accumulator per element of a chunk, thread 0 folds the n % _VEC last elements in, then the four
  together: (a0 + a1) + (a2 + a3). The operations and their order are the same whether the loads are vector or
  scalar ones, so both give the same bits."""
  b, root = f.b, f.root
  rop, _ = root.arg
  src, dt = root.srcs[0], root.dtype
  chunks, tail = divmod(_numel(src.shape), _VEC)
  accs = [b.var(_reduce_init(rop, dt), dt, f"acc{j}") for j in range(_VEC)]

  def fold(acc: Any, v: Val) -> None: acc.value = _reduce_op(rop, dt, acc.value, v if v.dtype is dt else v.cast(dt))
  unroll = max(1, min(_REDUCE_UNROLL, chunks // threads))
  span = threads * unroll
  exact = chunks % span == 0  # every step's chunks are all inside: no clamp, no guard

  def step(at: Val | None) -> None:
    loads = []
    for u in range(unroll):
      c = tid if at is None else at + tid
      c = c + threads * u if u else c
      loads.append((c, f.chunk(src, src.shape, (c if exact else c.min(chunks - 1)) * _VEC)))
    for c, values in loads:
      if exact:
        for acc, v in zip(accs, values): fold(acc, v)
        continue
      with b.if_(c < chunks):
        for acc, v in zip(accs, values): fold(acc, v)
  if chunks > span:
    with b.range(-(-chunks // span), dtype=f.it) as k: step(k * span)
  elif chunks: step(None)  # one step: no loop
  if tail:
    with b.if_(tid.eq(0)):
      for j, g in enumerate(range(chunks * _VEC, chunks * _VEC + tail)):
        fold(accs[j], f.lower(src, f.unflatten(b.const(g, f.it), src.shape), {}))
  return _reduce_op(rop, dt, _reduce_op(rop, dt, accs[0].value, accs[1].value), _reduce_op(rop, dt, accs[2].value, accs[3].value))


def _group_kernel(f: _FusedKernel, groups: int) -> Kernel:
  """A stage of a reduction over all of a source: `groups` groups of _GROUP threads, each thread folding its share
  (_fold), then each group combines its _GROUP results in shared memory, halving (r[l] op= r[l + s] for l < s) down to
  r[0], which its thread 0 writes: with one group, the result; with more, out[group] (a first stage's partial results)."""
  b, root = f.b, f.root
  rop, dt = root.arg[0], root.dtype
  part = b.shared("part", dt, _GROUP)
  lid = b.local_id(0)
  tid = b.global_id(0) if groups > 1 else lid
  part[lid] = _fold(f, groups * _GROUP, f.index(tid))
  b.barrier()
  s = _GROUP // 2
  while s:
    with b.if_(lid < s): part[lid] = _reduce_op(rop, dt, part[lid], part[lid + s])
    b.barrier()
    s //= 2
  with b.if_(lid.eq(0)):
    if groups > 1: f.out[b.group_id(0)] = part[0]
    else:
      zero = b.const(0, f.it)
      f.out[f.destination(zero, f.unflatten(zero, root.shape))] = part[0]
  return b.finish()


def _reduce_init(rop: str, dt: DType) -> Any:
  if rop == "sum": return 0.0 if dt.kind == "f" else 0 if dt is not dtypes.bool else False
  if dt is dtypes.bool: return rop == "min"
  if dt.kind == "f": return float("-inf") if rop == "max" else float("inf")
  return dt.min if rop == "max" else dt.max


def _reduce_op(rop: str, dt: DType, a: Val, v: Val) -> Val:
  if dt is dtypes.bool: return a | v if rop in ("max", "sum") else a & v  # any / all, as numpy
  return a + v if rop == "sum" else a.max(v) if rop == "max" else a.min(v)


def _reduce_kernel(f: _FusedKernel) -> Kernel:
  """One output element per thread and step; a loop nest over the reduced axes of the source accumulates it."""
  b, n_out, root = f.b, f.n_out, f.root
  # a grid-stride loop: at most _MAX_GROUPS groups (see _realize), each thread taking every total-th output element
  total = f.index(b.num_groups(0)) * f.index(b.local_size(0))
  with b.range((n_out + total - 1) // total, dtype=f.it) as step:
    gid = step * total + f.index(b.global_id(0))
    with b.if_(gid < n_out):
      oidx = f.unflatten(gid, root.shape)
      rop, axes = root.arg
      src = root.srcs[0]
      dt = root.dtype
      acc = b.var(_reduce_init(rop, dt), dt)
      idx = list(oidx)

      def nest(k: int) -> None:
        if k == len(axes):
          v = f.lower(src, idx, {})
          v = v if v.dtype is root.dtype else v.cast(root.dtype)
          acc.value = _reduce_op(rop, dt, acc.value, v)
          return
        with b.range(src.shape[axes[k]], dtype=f.it) as r:
          idx[axes[k]] = r
          nest(k + 1)
      nest(0)
      f.out[f.destination(gid, oidx)] = acc.value
  return b.finish()


def _realize(node: Node, force_copy: bool = False, into: Node | None = None, in_place: bool = False) -> Node:
  """A "buf" node with node's value: node itself when it already is one (and, with force_copy, a contiguous
  whole buffer), else a new contiguous buffer computed by one fused kernel; or, with `into` (a "buf" node of
  the same shape and dtype), node's value written into into's memory. in_place (for an "ew" or "reduce" node): node
  itself becomes the new buffer's "buf" node (other graphs may hold it)."""
  op = node.op
  if into is None and op == "buf" and (not force_copy or (node.view.is_contiguous and node.view.offset == 0 and
                                                          node.buffer.size == _numel(node.shape))):
    return node
  # a copy (of an image: its texels, into a plain buffer)
  root = node if op == "ew" or op == "reduce" else Node("ew", _value_dtype(node.dtype), node.shape, node.device, (node,), "cast")
  staged = op == "reduce" and _prod(root.shape) == 1 and _prod(root.srcs[0].shape) >= _PARTIAL_MIN  # (_partial_groups)
  if staged:
    while (groups := _partial_groups(_prod(root.srcs[0].shape))): root = _reduce_partials(root, groups)
  # the walk runs the reductions that feed the graph first, as kernels of their own (a reduction root's are in its source)
  memo: dict[int, int] = {}
  index: dict[Any, int] = {}
  bufs: list[Any] = []
  vals: list[Any] = []
  if root.op == "reduce": key = ("reduce", root.dtype.name, root.arg, root.shape, _plan_key(root.srcs[0], memo, index, bufs, vals))
  else: key = _plan_key(root, memo, index, bufs, vals)
  if into is None: target = None
  else:
    iv, ib = into.view, id(into.buffer)
    if any(type(k) is tuple and k[0] == ib and k[1:] != iv for k in index):
      return _realize(_realize(node, force_copy=True), into=into)  # reading the target through another view: compute apart first
    target = (into.leaf or _leaf_of(into))[1]
    vals.append(iv.offset)
  # the memory first: a size no allocator can satisfy is OutOfMemoryError before a kernel is built for it
  out = into.buffer if into is not None else Buffer(node.device, _prod(root.shape), root.dtype)
  plan_key = (key, root.device, staged, target, _GROUP, _MAX_GROUPS, _UNROLL, _VEC, _REDUCE_UNROLL, VECTOR_BYTES)
  if (plan := _PLANS.get(plan_key)) is None: plan = _PLANS[plan_key] = _plan(root, staged, into)
  prg, gs, ls, view = plan
  prg(out, *bufs, global_size=gs, local_size=ls, vals=tuple(vals))
  stats["kernels_run"] += 1
  if into is not None: return into
  if not in_place: return Node("buf", root.dtype, root.shape, root.device, buffer=out, view=view)
  node.op, node.srcs, node.arg, node.buffer, node.view, node.leaf = "buf", (), None, out, view, None
  return node


def _plan(root: Node, staged: bool, into: Node | None) -> tuple[Any, tuple[int, int, int], tuple[int, int, int], View]:
  """What a realize of root's structure launches (see _PLANS; _realize's walk ran the reductions among its sources): its
  program, global and local size, and the result's view."""
  ctx = _Ctx()
  n = _numel(root.shape)
  key = (root.shape, root.dtype.name, ctx.key(root, {}))  # (collects the leaves too)
  wide = max([n] + [l.buffer.size for l in ctx.leaves if l.op == "buf"] + ([into.buffer.size] if into else [])) >= _WIDE
  out_strides = into.view.strides if into is not None else None
  out_aligned = into is None or (into.view.is_contiguous and vector_aligned(into.buffer, into.view.offset))
  if staged: gs, ls, grid = (1, 1, 1), (_GROUP, 1, 1), ()  # a staged reduction's last kernel: one group
  elif root.op == "reduce": gs, ls, grid = (min(_MAX_GROUPS, -(-n // _GROUP)), 1, 1), (min(_GROUP, max(n, 1)), 1, 1), ()  # an output element a thread
  else:
    grid = _ew_grid(n)
    gs, ls = (grid[0], grid[1], 1), (grid[2], 1, 1)
  shape = grid or ((_GROUP, _REDUCE_UNROLL) if staged else ())  # what the kernel is built for besides the graph
  prg = root.device.program(_kernel(root, ctx, key + (wide, out_strides, out_aligned, staged, shape), wide, out_strides, out_aligned, grid,
                                    1 if staged else 0))
  return prg, gs, ls, View.contiguous(root.shape)


def _partial_groups(n: int) -> int:
  """How many groups (each making one partial result) the next stage of a reduction over all of n elements has, or 0
  when the last stage (_group_kernel, one group) takes the n directly: past _GROUP * _REDUCE_CHUNKS chunks of _VEC,
  at least _REDUCE_CHUNKS chunks per thread, at most _REDUCE_GROUPS groups (so the last stage folds at most that many)."""
  if n <= _VEC * _GROUP * _REDUCE_CHUNKS: return 0
  return min(_REDUCE_GROUPS, -(-n // (_VEC * _GROUP * _REDUCE_CHUNKS)))


def _reduce_partials(root: Node, groups: int) -> Node:
  """Run a first stage of a reduction: `groups` partial results in a new buffer; returns the reduction of those (the
  same op over a source of shape (1, ..., groups)), which _realize finishes (in one group, or more stages while many)."""
  src = root.srcs[0]
  memo: dict[int, int] = {}
  index: dict[Any, int] = {}
  bufs: list[Any] = []
  vals: list[Any] = []
  key = ("partials", groups, root.dtype.name, root.arg, root.shape, _plan_key(src, memo, index, bufs, vals))
  out = Buffer(root.device, groups, root.dtype)
  plan_key = (key, root.device, _GROUP, _MAX_GROUPS, _UNROLL, _VEC, _REDUCE_UNROLL, VECTOR_BYTES)
  if (prg := _PLANS.get(plan_key)) is None:
    ctx = _Ctx()
    key = ("partials", groups, _GROUP, _REDUCE_UNROLL, root.dtype.name, ctx.key(root, {}))
    wide = max([_numel(src.shape)] + [l.buffer.size for l in ctx.leaves if l.op == "buf"]) >= _WIDE
    prg = _PLANS[plan_key] = root.device.program(_kernel(root, ctx, key + (wide,), wide, None, False, groups=groups))
  prg(out, *bufs, global_size=(groups, 1, 1), local_size=(_GROUP, 1, 1), vals=tuple(vals))
  stats["kernels_run"] += 1
  shape = (1,) * (len(src.shape) - 1) + (groups,)
  return Node("reduce", root.dtype, root.shape, root.device, (_buf_node(out, shape),), (root.arg[0], (len(shape) - 1,)))


#: threads per group of the fused kernels, and groups at most along an axis: 65535, the least per-axis limit of the
#: backends (WebGPU's maxComputeWorkgroupsPerDimension); an elementwise kernel past it takes a second axis (_ew_grid),
#: a reduction to many outputs loops (_reduce_kernel)
_GROUP, _MAX_GROUPS = 256, 65535
#: chunks of _VEC contiguous elements per thread of an elementwise kernel, `_GROUP` apart (_ew_grid): one, with as many
#: groups as that takes, is what the IR's own vector-access kernel does at a device copy's bandwidth
#: (bench/gpu_cuda.py's tensor_u* rows; docs/performance.md)
_UNROLL = 1
#: elements of a chunk: one vector load or store of each contiguous aligned view (4 float32 = 16 bytes; 8-byte dtypes
#: take two of 2), see plugrt.compiler.ir's vector access
_VEC = 4
#: a reduction over all of a source of at least _PARTIAL_MIN elements runs in stages (_group_kernel): one partial result
#: per group (_REDUCE_GROUPS groups at most, each thread at least _REDUCE_CHUNKS chunks) while the elements are many, then
#: one group; below it, one thread's loop (_reduce_kernel). _REDUCE_UNROLL: chunks each thread loads per step of its loop
#: (bench/gpu_cuda.py's tensor_sum_* rows)
_PARTIAL_MIN, _REDUCE_GROUPS, _REDUCE_CHUNKS, _REDUCE_UNROLL = 4 * 256, 4096, 16, 4
#: a repr prints every element up to _PRINT_THRESHOLD of them, past it _PRINT_EDGE at each end of each long axis (numpy's defaults)
_PRINT_THRESHOLD, _PRINT_EDGE = 1000, 3
#: counters for tests and tuning: kernels_run counts fused/reduce kernels launched by tensors
stats = {"kernels_run": 0}


# ---------------------------------------------------------------- the Tensor

def _shape_of(data: Any) -> Shape:
  if isinstance(data, (list, tuple)): return (len(data),) + (_shape_of(data[0]) if data else ())
  return ()


def _broadcast(a: Shape, b: Shape) -> Shape:
  if a == b: return a
  n = max(len(a), len(b))
  a, b = (1,) * (n - len(a)) + a, (1,) * (n - len(b)) + b
  out = []
  for x, y in zip(a, b):
    if x != y and 1 not in (x, y): raise ValueError(f"shapes {a} and {b} do not broadcast")
    out.append(max(x, y) if 0 not in (x, y) else 0)
  return tuple(out)


class Tensor:
  """An n-dimensional array on a plugrt device (see the module docstring)."""
  __slots__ = ("node", "__weakref__")

  def __init__(self, data: Any, dtype: DType | str | None = None, device: str | RuntimeDevice | None = None):
    import numpy as np
    if isinstance(data, Node):
      self.node = data
      return
    dev = _device(device)
    if isinstance(data, (bytes, bytearray, memoryview)):
      dt = dtypes.as_dtype(dtype or dtypes.uint8)
      raw = bytes(data)
      if len(raw) % dt.itemsize: raise ValueError(f"{len(raw)} bytes do not divide into {dt.name} elements")
      shape = (len(raw) // dt.itemsize,)
      if isinstance(dt, ImageDType): shape = _image_shape(dt, shape)
      buf = Buffer(dev, _numel(shape), dt).copyin(raw)
      self.node = _buf_node(buf, shape)
      return
    if isinstance(data, (bool, int, float)) and not isinstance(data, np.generic):
      dt = dtypes.as_dtype(dtype) if dtype is not None else dtypes.from_py(data)
      self.node = Node("const", dt, (), dev, arg=_py(data, dt))
      return
    if isinstance(data, (list, tuple)):
      shape = _shape_of(data)
      flat = np.array(data).reshape(-1) if shape else np.array(data)
      default = dtypes.bool if flat.dtype == np.bool_ else dtypes.default_float if flat.dtype.kind == "f" else dtypes.default_int
      dt = dtypes.as_dtype(dtype) if dtype is not None else default
      arr = np.asarray(data).reshape(shape)
    else:
      arr = np.asarray(data)
      dt = dtypes.as_dtype(dtype) if dtype is not None else dtypes.from_numpy(arr.dtype)
    from plugrt.dtype import f32_to_bf16
    host = f32_to_bf16(arr.astype(np.float32)) if dt is dtypes.bfloat16 and arr.dtype.name != "bfloat16" else np.ascontiguousarray(arr, dt.numpy)
    shape = _image_shape(dt, tuple(arr.shape)) if isinstance(dt, ImageDType) else tuple(arr.shape)
    buf = Buffer(dev, host.size, dt).copyin(host.reshape(-1))
    self.node = _buf_node(buf, shape)

  # ---- basic facts
  @property
  def shape(self) -> Shape: return self.node.shape
  @property
  def dtype(self) -> DType: return self.node.dtype
  @property
  def device(self) -> str: return self.node.device.canonical
  @property
  def ndim(self) -> int: return len(self.node.shape)
  def numel(self) -> int: return _numel(self.node.shape)
  def __len__(self) -> int:
    if not self.shape: raise TypeError("a 0-d tensor has no len()")
    return self.shape[0]
  def __repr__(self) -> str:
    """numpy-style: the values (past 1000 elements, 3 at each end of each long axis and ...), then shape, dtype and
    device. Only the printed elements are computed and copied, into scratch buffers: a lazy tensor stays lazy."""
    facts = f"shape={self.shape}, dtype={self.dtype.name}, device={self.device}"
    try:
      import numpy as np
      whole = self.numel() <= _PRINT_THRESHOLD
      src = self.cast(self.dtype.base) if isinstance(self.dtype, ImageDType) else self  # an image's texels, as a plain tensor
      values = np.array2string(src._host_values((), whole), separator=", ", prefix="Tensor(", edgeitems=_PRINT_EDGE,
                               threshold=_PRINT_THRESHOLD if whole else 0)
    except Exception as e:  # a repr must not raise: debuggers and tracebacks call it
      return f"<Tensor {facts}, values unavailable: {type(e).__name__}: {e}>"
    return f"Tensor({values}, {facts}{'' if self.node.op == 'buf' else ', lazy'})"

  def _host_values(self, lead: tuple[slice, ...] = (), whole: bool = True) -> Any:
    """The values (bfloat16 as float32) of self[lead], without realising this tensor's own node. Unless `whole`,
    an axis longer than 2 * _PRINT_EDGE keeps its ends with one filler element between them, which array2string
    (threshold 0) prints as "...": a huge tensor is printed without computing or copying it all."""
    import numpy as np

    from plugrt.dtype import bf16_to_f32
    k = len(lead)
    if k == self.ndim or whole:
      view = self[lead] if lead else self
      arr = _realize(view.node, force_copy=True).buffer.numpy().reshape(view.shape)
      return bf16_to_f32(arr) if self.dtype is dtypes.bfloat16 else arr
    size = self.shape[k]
    if size <= 2 * _PRINT_EDGE: return self._host_values(lead + (slice(None),), False)
    low = self._host_values(lead + (slice(0, _PRINT_EDGE),), False)
    high = self._host_values(lead + (slice(size - _PRINT_EDGE, size),), False)
    return np.concatenate([low, np.zeros_like(low.take([0], axis=k)), high], axis=k)

  def __array__(self, dtype: Any = None, copy: bool | None = None) -> Any:
    """The numpy array protocol (np.asarray(t), np.array(t)), with numpy 2's `copy`: the data lives in device
    memory, so the array is always a copy, and copy=False raises ValueError, as numpy asks. bfloat16 comes back
    as float32 (numpy has no bfloat16)."""
    if copy is False:
      raise ValueError("a Tensor's values cannot become a numpy array without a copy (np.asarray(t, copy=False)); "
                       "leave copy unset, or share host memory with np.from_dlpack(t)")
    arr = self.numpy()
    return arr if dtype is None else arr.astype(dtype, copy=False)

  # ---- creation
  @staticmethod
  def full(shape: int | Sequence[int], value: Any, dtype: DType | str | None = None, device: str | None = None) -> Tensor:
    shape = _as_shape(shape)
    dt = dtypes.as_dtype(dtype) if dtype is not None else dtypes.from_py(value)
    return _wrap(Node("const", dt, shape, _device(device), arg=_py(value, dt)))

  @staticmethod
  def zeros(shape: int | Sequence[int], dtype: DType | str = dtypes.float32, device: str | None = None) -> Tensor:
    return Tensor.full(shape, 0, dtype, device)

  @staticmethod
  def ones(shape: int | Sequence[int], dtype: DType | str = dtypes.float32, device: str | None = None) -> Tensor:
    return Tensor.full(shape, 1, dtype, device)

  @staticmethod
  def arange(start: int | float, stop: int | float | None = None, step: int | float = 1, dtype: DType | str | None = None,
             device: str | None = None) -> Tensor:
    import numpy as np
    if stop is None: start, stop = 0, start
    arr = np.arange(start, stop, step)
    dt = dtypes.as_dtype(dtype) if dtype is not None else dtypes.default_float if arr.dtype.kind == "f" else dtypes.default_int
    return Tensor(arr, dt, device)

  _rng: Any = None

  @staticmethod
  def manual_seed(seed: int) -> None:
    import numpy as np
    Tensor._rng = np.random.default_rng(seed)

  @staticmethod
  def rand(*shape: int, dtype: DType | str = dtypes.float32, device: str | None = None) -> Tensor:
    """Uniform in [0, 1), drawn on the host (Tensor.manual_seed makes it repeatable)."""
    import numpy as np
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)): shape = tuple(shape[0])
    if Tensor._rng is None: Tensor._rng = np.random.default_rng()
    return Tensor(Tensor._rng.random(shape).astype(np.float32), dtype, device)

  @staticmethod
  def from_blob(ptr: int, shape: int | Sequence[int], dtype: DType | str = dtypes.float32, device: str | None = None,
                keepalive: Any = None) -> Tensor:
    """Wrap memory plugrt does not own, without copying (see Buffer.from_blob for the lifetime rule)."""
    shape, dt = _as_shape(shape), dtypes.as_dtype(dtype)
    if isinstance(dt, ImageDType): shape = _image_shape(dt, shape)  # any shape of h*w*4 elements: (h*w*4,) or (h, w, 4)
    buf = Buffer.from_blob(ptr, _numel(shape), dt, device, keepalive)
    return _wrap(_buf_node(buf, shape))

  @staticmethod
  def from_buffer(buffer: Buffer, shape: int | Sequence[int] | None = None, strides: Sequence[int] | None = None,
                  offset: int = 0) -> Tensor:
    """A tensor viewing `buffer`'s elements, without copying: element (i0, i1, ...) is buffer element
    offset + sum(i_d * strides_d). shape defaults to (buffer.size,), strides to row-major (contiguous) ones; strides
    and offset count elements, not bytes, and may be negative or 0 (a broadcast), as long as every element viewed
    lies inside the buffer (ValueError otherwise). Writes through the tensor (assign) change the buffer."""
    shape = _as_shape(buffer.size if shape is None else shape)
    if strides is None: view = View.contiguous(shape, offset)
    else:
      strides = tuple(int(s) for s in strides)
      if len(strides) != len(shape): raise ValueError(f"{len(strides)} strides for a {len(shape)}-D shape {shape}")
      view = View(shape, tuple(0 if d == 1 else s for d, s in zip(shape, strides)), offset)
    if _numel(shape):
      lo = offset + sum(min(0, (d - 1) * s) for d, s in zip(shape, view.strides))
      hi = offset + sum(max(0, (d - 1) * s) for d, s in zip(shape, view.strides))
      if lo < 0 or hi >= buffer.size:
        raise ValueError(f"shape {shape}, strides {view.strides}, offset {offset} reach elements {lo}..{hi}, outside the buffer's {buffer.size}")
    return _wrap(_buf_node(buffer, shape, view))

  @staticmethod
  def from_dlpack(obj: Any, device: str | None = None) -> Tensor:
    """Zero-copy import of any object that implements __dlpack__ (numpy, torch, cupy, ...)."""
    from plugrt.frontend.dlpack import from_dlpack
    return Tensor.from_buffer(*from_dlpack(obj, device))

  def __dlpack__(self, stream: Any = None, **kwargs: Any) -> Any:
    from plugrt.frontend.dlpack import to_dlpack
    t = self.contiguous() if kwargs.get("copy") is True else self.realize()
    node = t.node
    return to_dlpack(node.buffer, node.shape, node.view.strides, node.view.offset, t, stream, **kwargs)

  def __dlpack_device__(self) -> tuple[int, int]:
    from plugrt.frontend.dlpack import dlpack_device
    return dlpack_device(self.node.device)

  # ---- realising and reading
  def realize(self) -> Tensor:
    """Compute the value now (fusing the elementwise chain into one kernel)."""
    if self.node.op != "buf": _realize(self.node, in_place=True)
    return self

  def assign(self, value: Any) -> Tensor:
    """Write value (a tensor or number, broadcast to this shape) into this tensor's own memory, in place:
    a from_blob tensor then shows the result to its owner (zero copy). Not into an image tensor (UnsupportedError)."""
    if isinstance(self.dtype, ImageDType):
      from plugrt.errors import UnsupportedError
      raise UnsupportedError(f"cannot assign into an image tensor ({self.dtype!r}): Tensor operations only read texels",
                             "write the texels with a @kernel (write_texel), or assign into a plain tensor, e.g. t.cast(dtypes.float32)")
    self.realize()
    src = value if isinstance(value, Tensor) else Tensor.full(self.shape, value, self.dtype, self.node.device)
    if src.node.device is not self.node.device: raise ValueError(f"assign from {src.device} into {self.device}: move it with .to()")
    node = _expand_node(_cast_node(src.node, self.dtype), self.shape)
    if any(s == 0 and d > 1 for s, d in zip(self.node.view.strides, self.shape)):
      raise ValueError("cannot assign into an expanded (broadcast) view: its elements share memory")
    _realize(node if node.op != "buf" else Node("ew", node.dtype, node.shape, node.device, (node,), "cast"), into=self.node)
    self.node.buffer._written()  # from_blob memory: its owner sees the result when assign returns
    return self

  def contiguous(self) -> Tensor:
    n = self.realize().node
    if n.view.is_contiguous and n.view.offset == 0 and n.buffer.size == self.numel(): return self
    return _wrap(_realize(n, force_copy=True))

  def contiguous_buffer(self) -> Buffer:
    """The tensor's data as one contiguous Buffer (a copy only when it is a strided view)."""
    return self.contiguous().node.buffer

  def numpy(self) -> Any:
    """A numpy copy (bfloat16 comes back as float32)."""
    from plugrt.dtype import bf16_to_f32
    arr = self.contiguous_buffer().numpy().reshape(self.shape)
    return bf16_to_f32(arr) if self.dtype is dtypes.bfloat16 else arr

  def tolist(self) -> Any: return self.numpy().tolist()

  def item(self) -> Any:
    if self.numel() != 1: raise ValueError(f"item() needs one element, the tensor has {self.numel()}")
    return self.numpy().reshape(-1)[0].item()

  def to(self, device: str | RuntimeDevice) -> Tensor:
    """A copy on `device` (this tensor when it is there already). An image tensor on a device without images becomes
    a plain tensor of its texels (dtype float32 or float16, the same shape)."""
    dev = _device(device)
    if dev is self.node.device: return self
    if isinstance(self.dtype, ImageDType) and not dev.allocator.supports_images:
      buf = self.contiguous_buffer()
      return _wrap(_buf_node(buf.copy_to(Buffer(dev, buf.size, self.dtype.base)), self.shape))
    return _wrap(_buf_node(self.contiguous_buffer().to(dev), self.shape))

  def cast(self, dtype: DType | str) -> Tensor:
    """The values as `dtype`, lazily: an image tensor cast to its texel type is its texels as a plain tensor. A tensor of
    h*w*4 values cast to an image dtype is an image of them (a copy into image memory, now), in the same shape."""
    dt = dtypes.as_dtype(dtype)
    if dt is not self.dtype and isinstance(dt, ImageDType):
      shape = _image_shape(dt, self.shape)
      buf = self.cast(dt.base).contiguous_buffer()
      return _wrap(_buf_node(buf.copy_to(Buffer(buf.device, buf.size, dt)), shape))
    return self if dt is self.dtype else _wrap(Node("ew", dt, self.shape, self.node.device, (self.node,), "cast"))

  # ---- elementwise
  def _const(self, x: Any, dt: DType) -> Node: return Node("const", dt, (), self.node.device, arg=_py(x, dt))

  def _operands(self, other: Any, reverse: bool = False) -> tuple[Node, Node]:
    """Both operands as nodes of one dtype and one (broadcast) shape (an image's: its texels)."""
    a = self.node
    if isinstance(a.dtype, ImageDType): a = _texels(a)
    if isinstance(other, Tensor):
      b = other.node
      if isinstance(b.dtype, ImageDType): b = _texels(b)
      if b.device is not a.device: raise ValueError(f"tensors on {a.device} and {b.device}: move one with .to()")
      if a.dtype is b.dtype and a.shape == b.shape: return (b, a) if reverse else (a, b)  # the common case: nothing to cast or broadcast
      dt = promote(a.dtype, b.dtype)
    elif isinstance(other, (bool, int, float)):
      dt = a.dtype
      if isinstance(other, float) and dt.kind != "f": dt = dtypes.default_float
      elif isinstance(other, int) and not isinstance(other, bool) and dt is dtypes.bool: dt = dtypes.default_int
      if dt is a.dtype:  # the common case, a scalar in the tensor's own dtype: the constant takes a's shape directly
        b = Node("const", dt, a.shape, a.device, arg=_py(other, dt))
        return (b, a) if reverse else (a, b)
      b = self._const(other, dt)
    else: return NotImplemented  # type: ignore[return-value]
    a, b = _cast_node(a, dt), _cast_node(b, dt)
    shape = _broadcast(a.shape, b.shape)
    a, b = _expand_node(a, shape), _expand_node(b, shape)
    return (b, a) if reverse else (a, b)

  def _ew(self, op: str, other: Any = None, reverse: bool = False, result: DType | None = None) -> Tensor:
    if other is None:
      a = _texels(self.node)
      return _wrap(Node("ew", result or a.dtype, a.shape, a.device, (a,), op))
    ops = self._operands(other, reverse)
    if ops is NotImplemented: return NotImplemented
    a, b = ops
    if a.dtype is dtypes.bool:  # numpy: + * maximum minimum are logic (see _apply), - is refused, // % work in int8
      if op == "sub": raise TypeError("bool tensors do not subtract (as in numpy): use ^ (logical xor), or cast to an integer dtype first")
      if op in ("floordiv", "mod"): a, b = _cast_node(a, dtypes.int8), _cast_node(b, dtypes.int8)
    return _wrap(Node("ew", result or _EW_RESULT.get(op, a.dtype), a.shape, a.device, (a, b), op))

  def __add__(self, o: Any) -> Tensor: return self._ew("add", o)
  def __radd__(self, o: Any) -> Tensor: return self._ew("add", o, True)
  def __sub__(self, o: Any) -> Tensor: return self._ew("sub", o)
  def __rsub__(self, o: Any) -> Tensor: return self._ew("sub", o, True)
  def __mul__(self, o: Any) -> Tensor: return self._ew("mul", o)
  def __rmul__(self, o: Any) -> Tensor: return self._ew("mul", o, True)
  def __truediv__(self, o: Any) -> Tensor: return self._float()._ew("div", o)
  def __rtruediv__(self, o: Any) -> Tensor: return self._float()._ew("div", o, True)
  def __floordiv__(self, o: Any) -> Tensor: return self._ew("floordiv", o)
  def __rfloordiv__(self, o: Any) -> Tensor: return self._ew("floordiv", o, True)
  def __mod__(self, o: Any) -> Tensor: return self._ew("mod", o)
  def __rmod__(self, o: Any) -> Tensor: return self._ew("mod", o, True)
  def __and__(self, o: Any) -> Tensor: return self._ew("and", o)
  def __or__(self, o: Any) -> Tensor: return self._ew("or", o)
  def __xor__(self, o: Any) -> Tensor: return self._ew("xor", o)
  def __lt__(self, o: Any) -> Tensor: return self._ew("cmplt", o)
  def __le__(self, o: Any) -> Tensor: return self._ew("cmple", o)
  def __gt__(self, o: Any) -> Tensor: return self._ew("cmplt", o, True)
  def __ge__(self, o: Any) -> Tensor: return self._ew("cmple", o, True)
  def __eq__(self, o: Any) -> Tensor: return self._ew("cmpeq", o)  # type: ignore[override]
  def __ne__(self, o: Any) -> Tensor: return self._ew("cmpne", o)  # type: ignore[override]
  __hash__ = object.__hash__
  def __neg__(self) -> Tensor: return self._ew("neg") if self.dtype is not dtypes.bool else self._ew("not")
  def __invert__(self) -> Tensor: return self._ew("not")
  def __pow__(self, o: Any) -> Tensor:
    if self.dtype is dtypes.bool: return self.cast(dtypes.default_int) ** o  # a number, as bool * 1 is (numpy: int8)
    if isinstance(o, int) and not isinstance(o, bool) and 0 <= o <= 8:
      out = Tensor.full(self.shape, 1, _value_dtype(self.dtype), self.device)
      for _ in range(o): out = out * self
      return out
    return self._float()._ew("pow", o)
  def __matmul__(self, o: Tensor) -> Tensor: return self.matmul(o)

  def add(self, o: Any) -> Tensor: return self + o
  def sub(self, o: Any) -> Tensor: return self - o
  def mul(self, o: Any) -> Tensor: return self * o
  def div(self, o: Any) -> Tensor: return self / o

  def _float(self) -> Tensor: return self if self.dtype.kind == "f" else self.cast(dtypes.default_float)
  def maximum(self, o: Any) -> Tensor: return self._ew("max", o)
  def minimum(self, o: Any) -> Tensor: return self._ew("min", o)
  def abs(self) -> Tensor: return self._ew("abs")
  def exp(self) -> Tensor: return self._float()._ew("exp")
  def exp2(self) -> Tensor: return self._float()._ew("exp2")
  def log(self) -> Tensor: return self._float()._ew("log")
  def log2(self) -> Tensor: return self._float()._ew("log2")
  def sqrt(self) -> Tensor: return self._float()._ew("sqrt")
  def sin(self) -> Tensor: return self._float()._ew("sin")
  def cos(self) -> Tensor: return self._float()._ew("cos")
  def floor(self) -> Tensor: return self if self.dtype.kind != "f" else self._ew("floor")
  def ceil(self) -> Tensor: return self if self.dtype.kind != "f" else self._ew("ceil")
  def reciprocal(self) -> Tensor: return self._float()._ew("recip")
  def relu(self) -> Tensor: return self.maximum(0)

  def where(self, a: Any, b: Any) -> Tensor:
    """self ? a : b, elementwise (self is the condition; a and b are tensors or numbers)."""
    cond = self if self.dtype is dtypes.bool else self != 0
    tensors = [_value_dtype(x.dtype) for x in (a, b) if isinstance(x, Tensor)]
    if not tensors: dt = promote(dtypes.from_py(a), dtypes.from_py(b))
    else:  # numbers take the tensors' dtype, except a float meeting integers
      dt = tensors[0] if len(tensors) == 1 else promote(*tensors)
      if any(isinstance(x, float) for x in (a, b)) and dt.kind != "f": dt = dtypes.default_float
    nodes = [_cast_node(x.node if isinstance(x, Tensor) else cond._const(x, dt), dt) for x in (a, b)]
    shape = _broadcast(_broadcast(cond.shape, nodes[0].shape), nodes[1].shape)
    c, an, bn = (_expand_node(x, shape) for x in (cond.node, *nodes))
    return _wrap(Node("ew", dt, shape, c.device, (c, an, bn), "where"))

  # ---- reductions
  def _reduce(self, op: str, axis: int | Sequence[int] | None, keepdim: bool, dtype: DType) -> Tensor:
    shape = self.node.shape
    nd = len(shape)
    if axis is None: axes, kept, dropped = tuple(range(nd)), (1,) * nd, ()  # every axis: nothing to check
    else:
      axes = tuple(sorted({a + nd if a < 0 else a for a in ((axis,) if isinstance(axis, int) else tuple(axis))}))
      if any(not 0 <= a < nd for a in axes): raise ValueError(f"axis {axis} is out of range for {nd} dimensions")
      kept = tuple(1 if i in axes else d for i, d in enumerate(shape))
      dropped = tuple(d for i, d in enumerate(shape) if i not in axes)  # (a checked shape of the same elements: no reshape() parsing)
    src = _cast_node(self.node, dtype)
    out = Node("reduce", dtype, kept, src.device, (src,), (op, axes))
    if keepdim or dropped == kept: return _wrap(out)
    # dropping axes is a view change, which a reduction is realised for (as _moved does): its result, a new contiguous
    # buffer, viewed in the dropped shape
    return _wrap(_buf_node(_realize(out).buffer, dropped))

  def sum(self, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
    vt = _value_dtype(self.dtype)
    dt = vt if vt.kind == "f" or vt.bits >= 32 else (dtypes.int32 if vt.kind != "u" else dtypes.uint32)
    return self._reduce("sum", axis, keepdim, dt)

  def max(self, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
    return self._reduce("max", axis, keepdim, _value_dtype(self.dtype))

  def min(self, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
    return self._reduce("min", axis, keepdim, _value_dtype(self.dtype))

  def mean(self, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
    x = self._float()
    s = x.sum(axis, keepdim)
    return s / (self.numel() // max(s.numel(), 1) if self.numel() else 1)

  def matmul(self, o: Tensor) -> Tensor:
    """Matrix product with numpy's rules for 1-D operands and broadcast batch dimensions."""
    a, b = self, o
    if a.ndim == 0 or b.ndim == 0: raise ValueError("matmul needs at least 1-D operands")
    va, vb = a.ndim == 1, b.ndim == 1
    if va: a = a.reshape(1, a.shape[0])
    if vb: b = b.reshape(b.shape[0], 1)
    if a.shape[-1] != b.shape[-2]: raise ValueError(f"matmul: {self.shape} @ {o.shape}: inner dimensions differ")
    out = (a.reshape(*a.shape, 1) * b.reshape(*b.shape[:-2], 1, *b.shape[-2:])).sum(axis=-2)
    if va: out = out.reshape(*out.shape[:-2], out.shape[-1])
    if vb: out = out.reshape(*out.shape[:-1])
    return out

  # ---- views
  def reshape(self, *shape: Any) -> Tensor:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)): shape = tuple(shape[0])
    shape = tuple(int(s) for s in shape)
    if shape.count(-1) > 1: raise ValueError("only one dimension can be -1")
    if -1 in shape:
      known = _numel(tuple(s for s in shape if s != -1))
      if known == 0 or self.numel() % known: raise ValueError(f"cannot reshape {self.shape} to {shape}")
      shape = tuple(self.numel() // known if s == -1 else s for s in shape)
    if _numel(shape) != self.numel(): raise ValueError(f"cannot reshape {self.shape} ({self.numel()} elements) to {shape}")
    if shape == self.shape: return self
    return _wrap(_movement(self.node, lambda v: v.reshape(shape), shape))

  def permute(self, *order: Any) -> Tensor:
    if len(order) == 1 and isinstance(order[0], (tuple, list)): order = tuple(order[0])
    order = tuple(o + self.ndim if o < 0 else o for o in order)
    if sorted(order) != list(range(self.ndim)): raise ValueError(f"{order} is not a permutation of {self.ndim} dimensions")
    shape = tuple(self.shape[o] for o in order)
    return _wrap(_movement(self.node, lambda v: v.permute(order), shape))

  def transpose(self, a: int = -2, b: int = -1) -> Tensor:
    order = list(range(self.ndim))
    order[a], order[b] = order[b], order[a]
    return self.permute(order)

  @property
  def T(self) -> Tensor: return self.permute(tuple(reversed(range(self.ndim))))

  def expand(self, *shape: Any) -> Tensor:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)): shape = tuple(shape[0])
    return _wrap(_expand_node(self.node, tuple(shape)))

  def __getitem__(self, idx: Any) -> Tensor:
    """Integers (Python's or numpy's), slices (any step), None and ... ; zero-copy views. Lists, arrays and
    tensors as indices (numpy's gather and boolean masks) are a TypeError that says what to use instead."""
    idx = tuple(_index(i) for i in (idx if isinstance(idx, tuple) else (idx,)))
    if any(i is Ellipsis for i in idx):
      k = idx.index(Ellipsis)
      fill = self.ndim - (len(idx) - 1 - sum(i is None for i in idx))
      idx = idx[:k] + (slice(None),) * fill + idx[k + 1:]
    real = [i for i in idx if i is not None]
    if len(real) > self.ndim: raise IndexError(f"{len(real)} indices for a {self.ndim}-D tensor")
    real += [slice(None)] * (self.ndim - len(real))
    parts, keep = [], []
    for d, (i, size) in enumerate(zip(real, self.shape)):
      if isinstance(i, int) and not isinstance(i, bool):
        if not -size <= i < size: raise IndexError(f"index {i} is out of range for dimension {d} of size {size}")
        parts.append((i % size, 1, 1))
      elif isinstance(i, slice):
        start, stop, step = i.indices(size)
        parts.append((start, len(range(start, stop, step)), step))
        keep.append(d)
      else: raise TypeError(f"cannot index a Tensor with {type(i).__name__} {i!r}: {_SUPPORTED_INDICES}")
    sliced_shape = tuple(c for _, c, _ in parts)
    t = _wrap(_movement(self.node, lambda v: v.slice(parts), sliced_shape)) if sliced_shape != self.shape or \
      any(p[0] or p[2] != 1 for p in parts) else self
    shape: list[int] = []
    it = iter(range(self.ndim))
    for i in idx:
      if i is None: shape.append(1)
      else:
        d = next(it)
        if d in keep: shape.append(sliced_shape[d])
    for d in it:
      if d in keep: shape.append(sliced_shape[d])
    return t.reshape(tuple(shape)) if tuple(shape) != t.shape else t


_SUPPORTED_INDICES = "a Tensor takes integers, slices, None and ... as indices (zero-copy views)"


def _index(i: Any) -> Any:
  """One index as __getitem__ takes it: numpy integers become ints; gathers and masks raise a TypeError naming the way."""
  if i is None or i is Ellipsis or isinstance(i, slice) or (isinstance(i, int) and not isinstance(i, bool)): return i
  if isinstance(i, (list, tuple, Tensor)) or getattr(i, "ndim", 0) > 0:  # a list, an array or a tensor of indices
    if getattr(getattr(i, "dtype", None), "kind", "") == "b" or (isinstance(i, (list, tuple)) and i and all(isinstance(x, bool) for x in i)):
      raise TypeError(f"indexing with a boolean mask ({type(i).__name__}) is not supported: {_SUPPORTED_INDICES}; "
                      "select on the host with t.numpy()[mask], or keep the shape with mask.where(t, 0)")
    raise TypeError(f"indexing with an array of indices ({type(i).__name__}, a gather) is not supported: {_SUPPORTED_INDICES}; "
                    "gather on the host with t.numpy()[index], or take a slice")
  if not isinstance(i, bool) and hasattr(i, "__index__"):  # np.int64(1), a 0-d integer array
    import operator
    try: return operator.index(i)
    except TypeError: pass
  raise TypeError(f"cannot index a Tensor with {type(i).__name__} {i!r}: {_SUPPORTED_INDICES}")


def _wrap(node: Node) -> Tensor:
  """A Tensor around a node (no device lookup: ops call this on every result)."""
  t = Tensor.__new__(Tensor)
  t.node = node
  return t


_py = cast_value  # a Python scalar as a kernel's cast of it to dt would give it


def _cast_node(n: Node, dt: DType) -> Node:
  if n.dtype is dt: return n
  if n.op == "const": return Node("const", dt, n.shape, n.device, arg=_py(n.arg, dt))
  return Node("ew", dt, n.shape, n.device, (n,), "cast")


def _expand_node(n: Node, shape: Shape) -> Node:
  if n.shape == shape: return n
  padded = (1,) * (len(shape) - len(n.shape)) + n.shape
  for x, y in zip(padded, shape):
    if x != y and x != 1: raise ValueError(f"cannot expand {n.shape} to {shape}")
  if n.op == "const": return Node("const", n.dtype, shape, n.device, arg=n.arg)
  if padded != n.shape: n = _movement(n, lambda v: v.reshape(padded), padded)
  return _movement(n, lambda v: v.expand(shape), shape)
