"""The kernel IR: one small, typed, linear program per kernel.

A `Kernel` is a tuple of `UOp`s in execution order. Values are UOps too: an op's
sources are earlier UOps. Control flow is structured: RANGE ... ENDRANGE is a
counted loop whose UOp is the loop index, IF [ELSE] ... ENDIF a conditional. A value
may be used only inside the block that defines it (C scoping).

One kernel instance runs per thread. Threads form groups of `local_size` threads
(x, y, z); there are `num_groups` groups per axis. Groups share SHARED arrays and
synchronise at BARRIER, which every thread of a group must reach (uniform control
flow, as on every GPU).

Semantics (the reference interpreter in plugrt.compiler.interpreter is the normative model):
- integers wrap (two's complement); IDIV truncates toward zero and MOD takes the
  sign of the dividend, as in C (MIN // -1 wraps to MIN); SHR of a signed value is
  arithmetic; a zero divisor gives an unspecified value (never a trap); shifts by >= the
  bit width are undefined.
- floats are IEEE with each op's result rounded to its dtype; EXP2, LOG2, SIN, SQRT
  and RECIP are accurate to a few ulp; MAX/MIN with a NaN operand are unspecified.
- CAST float->int truncates toward zero (undefined when out of range); any->bool is
  `!= 0`; bool->number is 0 or 1; casts to float16 round once. BITCAST reinterprets bits
  of the same size.
- images (a BUFFER whose dtype's base is an ImageDType: h x w RGBA texels) are reached only by TEXEL_LOAD and
  TEXEL_STORE at int32 coordinates (x, y), x the column in [0, w) and y the row in [0, h). A TEXEL_LOAD outside the
  image reads the nearest edge texel (clamp to edge, as OpenCL's CLK_ADDRESS_CLAMP_TO_EDGE sampler); a TEXEL_STORE
  outside it is undefined (the interpreter raises). A texel stored by a kernel is seen by a TEXEL_LOAD of the same
  image only in a later launch (OpenCL 1.2 images are read-only or write-only inside a kernel).
- vector access: VLOAD reads `width` (2 or 4) contiguous elements of a buffer parameter at once, index..index+width-1,
  and VSTORE writes them; width * itemsize is at most 16 bytes (4 float32, 2 float64). Each gives the same result as
  `width` scalar loads or stores of those elements. The address of element `index` must be a multiple of
  width * itemsize (plugrt's allocations are aligned to at least 16 bytes, so an index that is a multiple of width is,
  in a buffer plugrt allocated or a view of one at such an offset): otherwise the access is undefined (a GPU may fault;
  the interpreter and the PYTHON backend raise). A VLOAD is followed directly by its LANE ops, lane 0 to width-1, which
  are its elements as values; nothing else uses a VLOAD. Renderers emit one wide access where their language has one
  (CUDA's float4, PTX's ld.global.v4, OpenCL's and Metal's vector types, LLVM's <4 x float>), else `width` scalar ones.
- there are no atomics: two threads writing one location race. Threads of a group that
  cannot tell themselves apart (a kernel that never reads local_id) may run only once
  per group on devices that run threads serially; a race-free kernel cannot tell.
"""
from __future__ import annotations

import contextlib
import enum
import functools
import keyword
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Union

from plugrt.dtype import DType, ImageDType, PtrDType, cast_value, dtypes
from plugrt.errors import IRError
from plugrt.launchargs import Signature  # what a program takes: the launch layer's, and the IR's kernels have one


class Ops(enum.Enum):
  # parameters and launch geometry
  BUFFER = enum.auto()    # arg=(index, name); dtype PtrDType("global")
  SCALAR = enum.auto()    # arg=(index, name); dtype a scalar DType
  SPECIAL = enum.auto()   # arg=(kind, axis), kind in SPECIAL_KINDS; dtype int32
  CONST = enum.auto()     # arg=value (Python bool/int/float)
  # memory
  SHARED = enum.auto()    # arg=(name, count); dtype PtrDType("shared"): one array per group
  SPILL = enum.auto()     # lowered IR only: src=(count,); dtype PtrDType("private"): per-group scratch
  LOAD = enum.auto()      # src=(ptr, index)
  STORE = enum.auto()     # src=(ptr, index, value)
  VAR = enum.auto()       # src=(init,), arg=name: a mutable register variable
  READ = enum.auto()      # src=(var,)
  WRITE = enum.auto()     # src=(var, value)
  # ALU, unary
  NEG = enum.auto(); NOT = enum.auto(); EXP2 = enum.auto(); LOG2 = enum.auto()
  SIN = enum.auto(); SQRT = enum.auto(); RECIP = enum.auto(); TRUNC = enum.auto()
  # ALU, binary
  ADD = enum.auto(); SUB = enum.auto(); MUL = enum.auto(); DIV = enum.auto(); IDIV = enum.auto()
  MOD = enum.auto(); MAX = enum.auto(); MIN = enum.auto()
  AND = enum.auto(); OR = enum.auto(); XOR = enum.auto(); SHL = enum.auto(); SHR = enum.auto()
  CMPLT = enum.auto(); CMPLE = enum.auto(); CMPEQ = enum.auto(); CMPNE = enum.auto()
  # ALU, ternary
  WHERE = enum.auto()     # src=(cond, a, b)
  CAST = enum.auto()
  BITCAST = enum.auto()
  # control flow
  RANGE = enum.auto()     # src=(start, end): loop index from start to end-1; arg: None, or a hint (lowering's thread loops)
  ENDRANGE = enum.auto()  # src=(range,)
  IF = enum.auto()        # src=(cond,)
  ELSE = enum.auto()      # src=(if,)
  ENDIF = enum.auto()     # src=(if,)
  BARRIER = enum.auto()
  # images (after the others, so that the members above keep their values)
  TEXEL_LOAD = enum.auto()   # src=(image, x, y), arg=channel 0..3 (r, g, b, a); dtype the image's base (float32/float16)
  TEXEL_STORE = enum.auto()  # src=(image, x, y, r, g, b, a): one whole texel
  # vector access (see the module docstring)
  VLOAD = enum.auto()    # src=(buffer, index), arg=width; dtype the buffer's: elements index..index+width-1, read at once
  LANE = enum.auto()     # src=(vload,), arg=lane: element index+lane of a VLOAD, which it directly follows
  VSTORE = enum.auto()   # src=(buffer, index, v0, ..., v(width-1)): elements index..index+width-1, written at once


SPECIAL_KINDS = ("group_id", "local_id", "num_groups", "local_size")
UNARY = frozenset({Ops.NEG, Ops.NOT, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.RECIP, Ops.TRUNC})
FLOAT_UNARY = frozenset({Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.RECIP, Ops.TRUNC})
BINARY = frozenset({Ops.ADD, Ops.SUB, Ops.MUL, Ops.DIV, Ops.IDIV, Ops.MOD, Ops.MAX, Ops.MIN, Ops.AND, Ops.OR, Ops.XOR,
                    Ops.SHL, Ops.SHR, Ops.CMPLT, Ops.CMPLE, Ops.CMPEQ, Ops.CMPNE})
COMPARE = frozenset({Ops.CMPLT, Ops.CMPLE, Ops.CMPEQ, Ops.CMPNE})
ALU = UNARY | BINARY | {Ops.WHERE}
BLOCK_OPEN = frozenset({Ops.RANGE, Ops.IF})
BLOCK_CLOSE = frozenset({Ops.ENDRANGE, Ops.ENDIF})
#: the widths of VLOAD and VSTORE, and the most bytes one vector access moves
VECTOR_WIDTHS, VECTOR_BYTES = (2, 4), 16
STATEMENTS = frozenset({Ops.STORE, Ops.TEXEL_STORE, Ops.VSTORE, Ops.WRITE, Ops.ENDRANGE, Ops.IF, Ops.ELSE, Ops.ENDIF, Ops.BARRIER})

# which dtype kinds each ALU op accepts ("b" bool, "i"/"u" ints, "f" floats)
_KINDS = {Ops.NEG: "iuf", Ops.NOT: "biu", Ops.ADD: "iuf", Ops.SUB: "iuf", Ops.MUL: "iuf", Ops.DIV: "f", Ops.IDIV: "iu",
          Ops.MOD: "iu", Ops.MAX: "iuf", Ops.MIN: "iuf", Ops.AND: "biu", Ops.OR: "biu", Ops.XOR: "biu", Ops.SHL: "iu",
          Ops.SHR: "iu", **{op: "f" for op in FLOAT_UNARY}, **{op: "biuf" for op in COMPARE}}


class UOp:
  """One IR operation. Compared by identity: two equal-looking LOADs are two loads."""
  __slots__ = ("arg", "dtype", "op", "src")

  def __init__(self, op: Ops, dtype: DType | PtrDType | None, src: tuple[UOp, ...] = (), arg: Any = None):
    self.op, self.dtype, self.src, self.arg = op, dtype, src, arg

  def __repr__(self) -> str: return f"UOp({self.op.name}, {self.dtype!r}, arg={self.arg!r}, nsrc={len(self.src)})"




@dataclass(frozen=True, eq=False)
class Kernel:
  name: str
  uops: tuple[UOp, ...]

  @property
  def buffers(self) -> tuple[UOp, ...]: return tuple(sorted((u for u in self.uops if u.op is Ops.BUFFER), key=lambda u: u.arg[0]))
  @property
  def scalars(self) -> tuple[UOp, ...]: return tuple(sorted((u for u in self.uops if u.op is Ops.SCALAR), key=lambda u: u.arg[0]))
  @property
  def signature(self) -> Signature:
    stored = {u.src[0] for u in self.uops if u.op is Ops.STORE or u.op is Ops.TEXEL_STORE or u.op is Ops.VSTORE}
    bufs = self.buffers
    return Signature(tuple(b.dtype.base for b in bufs), tuple(s.dtype for s in self.scalars), tuple(b in stored for b in bufs))
  @property
  def has_barrier(self) -> bool: return any(u.op is Ops.BARRIER for u in self.uops)
  @property
  def shared_bytes(self) -> int:
    """The bytes of its shared arrays, one set per group."""
    return sum(u.arg[1] * u.dtype.base.itemsize for u in self.uops if u.op is Ops.SHARED)  # type: ignore[union-attr]
  @property
  def images(self) -> tuple[UOp, ...]:
    """The buffer parameters that are images (their dtype's base is an ImageDType)."""
    return tuple(b for b in self.buffers if isinstance(b.dtype.base, ImageDType))

  def dump(self) -> str:
    """A readable, canonical listing; equal listings mean equal kernels (used in cache keys)."""
    ids = {u: i for i, u in enumerate(self.uops)}
    lines, depth = [f"kernel {self.name}"], 1
    for i, u in enumerate(self.uops):
      if u.op in BLOCK_CLOSE or u.op is Ops.ELSE: depth -= 1
      src = ", ".join(f"%{ids[s]}" for s in u.src)
      arg = "" if u.arg is None else f" {_fmt_arg(u.arg)}"
      lines.append(f"{'  ' * depth}%{i} = {u.op.name}{'' if u.dtype is None else ':' + _fmt_dtype(u.dtype)}{arg}"
                   f"{' (' + src + ')' if src else ''}")
      if u.op in BLOCK_OPEN or u.op is Ops.ELSE: depth += 1
    return "\n".join(lines)

  def __repr__(self) -> str: return f"<Kernel {self.name}: {len(self.uops)} uops>"


def parse(text: str) -> Kernel:
  """The inverse of Kernel.dump(): a kernel from its listing (verified). A backend can ship IR as its "binary"."""
  import ast
  lines = [ln.strip() for ln in text.strip().splitlines()]
  if not lines or not lines[0].startswith("kernel "): raise IRError("an IR listing starts with 'kernel NAME'")
  uops: list[UOp] = []
  for n, line in enumerate(lines[1:], 1):
    m = _line_re().match(line)
    if m is None or int(m["id"]) != len(uops): raise IRError(f"IR listing line {n} is malformed: {line!r}")
    dt: DType | PtrDType | None = None
    if m["dtype"]:
      base, _, space = m["dtype"].partition("*")
      dt = PtrDType(dtypes.from_name(base), space) if space else dtypes.from_name(base)
    arg = None
    if m["arg"]:
      arg = float("nan") if m["arg"] == "nan" else float(m["arg"]) if m["arg"] in ("inf", "-inf") else ast.literal_eval(m["arg"])
    src = tuple(uops[int(i.strip()[1:])] for i in m["src"].split(",")) if m["src"] else ()
    uops.append(UOp(Ops[m["op"]], dt, src, arg))
  return verify(Kernel(lines[0][len("kernel "):], tuple(uops)))


@functools.cache
def _line_re() -> re.Pattern[str]:
  return re.compile(r"^%(?P<id>\d+) = (?P<op>[A-Z0-9_]+)(?::(?P<dtype>[a-z0-9_]+(?:\*[a-z]+)?))?"
                    r"(?: (?!\(%)(?P<arg>.+?))?(?: \((?P<src>%\d+(?:, %\d+)*)\))?$")


def _fmt_dtype(dt: DType | PtrDType) -> str:
  return f"{dt.base.name}*{dt.addrspace}" if isinstance(dt, PtrDType) else dt.name


def _fmt_arg(arg: Any) -> str:
  if isinstance(arg, float): return "nan" if math.isnan(arg) else repr(arg)  # repr(inf) is 'inf': fine
  return repr(arg)


# ---------------------------------------------------------------- verification

def verify(kernel: Kernel) -> Kernel:
  """Check types, scoping and block structure; raise IRError naming the first bad op."""
  _check_kernel_name(kernel.name)
  scope_of: dict[UOp, int] = {}
  active, blocks, next_scope = [0], [], 1  # active scope ids; open RANGE/IF uops
  seen_params: dict[Ops, set[int]] = {Ops.BUFFER: set(), Ops.SCALAR: set()}
  lanes: tuple[UOp, int] | None = None  # the VLOAD whose LANE ops come next, and the next lane
  for pos, u in enumerate(kernel.uops):
    def bad(msg: str, u: UOp = u, pos: int = pos) -> IRError: return IRError(f"kernel {kernel.name}, op %{pos} {u.op.name}: {msg}")
    if u in scope_of: raise bad("appears twice in the op list")
    if lanes is not None:
      if u.op is not Ops.LANE or not u.src or u.src[0] is not lanes[0] or u.arg != lanes[1]:
        raise bad(f"a VLOAD of width {lanes[0].arg} must be followed directly by its LANE ops 0..{lanes[0].arg - 1}, in order")
      lanes = (lanes[0], lanes[1] + 1) if lanes[1] + 1 < lanes[0].arg else None
    elif u.op is Ops.LANE: raise bad("must directly follow its VLOAD (or the LANE before it)")
    if u.op is not Ops.LANE and any(s.op is Ops.VLOAD for s in u.src): raise bad("uses a VLOAD as a value: take its elements with LANE")
    for s in u.src:
      if s not in scope_of: raise bad("uses a value that is not defined before it")
      if scope_of[s] not in active: raise bad("uses a value outside the block that defines it")
    _check_types(u, bad)
    if u.op in (Ops.BUFFER, Ops.SCALAR, Ops.SHARED) and len(active) != 1: raise bad("must be at the top level of the kernel")
    if u.op in (Ops.BUFFER, Ops.SCALAR):
      if u.arg[0] in seen_params[u.op]: raise bad(f"parameter index {u.arg[0]} used twice")
      seen_params[u.op].add(u.arg[0])
    scope_of[u] = active[-1]
    if u.op is Ops.VLOAD: lanes = (u, 0)
    if u.op in BLOCK_OPEN:
      blocks.append(u); active.append(next_scope); next_scope += 1
    elif u.op is Ops.ELSE:
      if not blocks or blocks[-1] is not u.src[0] or u.src[0].op is not Ops.IF: raise bad("does not close the innermost IF")
      active[-1] = next_scope; next_scope += 1
    elif u.op in BLOCK_CLOSE:
      if not blocks or blocks[-1] is not u.src[0]: raise bad("does not close the innermost open block")
      blocks.pop(); active.pop()
  if blocks: raise IRError(f"kernel {kernel.name}: {blocks[-1].op.name} is never closed")
  if lanes is not None: raise IRError(f"kernel {kernel.name}: its last VLOAD is not followed by all of its LANE ops")
  for op, idx in seen_params.items():
    if idx != set(range(len(idx))): raise IRError(f"kernel {kernel.name}: {op.name} indices {sorted(idx)} are not 0..{len(idx)-1}")
  return kernel


_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: the longest kernel or parameter name: names become identifiers in every backend's source and part of file names in
#: some drivers' caches (PoCL asserts, aborting the process, on a path past its limit)
MAX_NAME_LENGTH = 128


def _check_kernel_name(name: Any) -> str:
  if not isinstance(name, str) or not _IDENT.match(name) or keyword.iskeyword(name):
    raise IRError(f"kernel name {name!r} is not an identifier", "use ASCII letters, digits and _, not starting with a digit")
  if len(name) > MAX_NAME_LENGTH:
    raise IRError(f"kernel name {name[:32]}... is {len(name)} characters long; at most {MAX_NAME_LENGTH} are allowed", "use a shorter name")
  return name


def _check_types(u: UOp, bad: Any) -> None:
  op, dt, src = u.op, u.dtype, u.src
  sd = [s.dtype for s in src]
  if op is Ops.VSTORE:
    if len(src) - 2 not in VECTOR_WIDTHS:
      raise bad(f"takes a buffer, an index and {' or '.join(map(str, VECTOR_WIDTHS))} values, got {len(src)} sources")
    _check_vector(u, len(src) - 2, sd, bad)
    return
  nsrc = {Ops.LOAD: 2, Ops.STORE: 3, Ops.VAR: 1, Ops.READ: 1, Ops.WRITE: 2, Ops.WHERE: 3, Ops.CAST: 1, Ops.BITCAST: 1,
          Ops.RANGE: 2, Ops.ENDRANGE: 1, Ops.IF: 1, Ops.ELSE: 1, Ops.ENDIF: 1, Ops.SPILL: 1, Ops.TEXEL_LOAD: 3, Ops.TEXEL_STORE: 7,
          Ops.VLOAD: 2, Ops.LANE: 1}.get(op)
  if nsrc is None: nsrc = 1 if op in UNARY else 2 if op in BINARY else 0
  if len(src) != nsrc: raise bad(f"takes {nsrc} sources, got {len(src)}")
  if op is Ops.VLOAD:
    _check_vector(u, u.arg, sd, bad)
    return
  if op is Ops.LANE:
    if src[0].op is not Ops.VLOAD: raise bad("takes a VLOAD")
    if not isinstance(u.arg, int) or isinstance(u.arg, bool) or not 0 <= u.arg < src[0].arg:
      raise bad(f"lane {u.arg!r} of a VLOAD of width {src[0].arg}")
    if dt is not sd[0]: raise bad(f"an element of a VLOAD of {sd[0]!r} is typed {dt!r}")
    return
  if op in (Ops.BUFFER, Ops.SHARED, Ops.SPILL):
    want = {Ops.BUFFER: "global", Ops.SHARED: "shared", Ops.SPILL: "private"}[op]
    if not isinstance(dt, PtrDType) or dt.addrspace != want: raise bad(f"dtype must be a {want} pointer, not {dt!r}")
    if op is not Ops.BUFFER and isinstance(dt.base, ImageDType): raise bad("images can only be kernel parameters (BUFFER)")
    if op is Ops.SHARED and (not isinstance(u.arg[1], int) or u.arg[1] <= 0): raise bad("needs a positive element count")
    if op is Ops.SPILL and not _is_int(sd[0]): raise bad("count must be an integer")
    return
  if op is Ops.SCALAR or op is Ops.CONST:
    if not isinstance(dt, DType) or isinstance(dt, ImageDType): raise bad(f"dtype must be a scalar dtype, not {dt!r}")
    if op is Ops.CONST: _check_const(u.arg, dt, bad)
    return
  if op is Ops.SPECIAL:
    if u.arg[0] not in SPECIAL_KINDS or u.arg[1] not in (0, 1, 2) or dt is not dtypes.int32:
      raise bad(f"must be one of {SPECIAL_KINDS} on axis 0..2 with dtype int32")
    return
  if op in (Ops.LOAD, Ops.STORE):
    if not isinstance(sd[0], PtrDType): raise bad("first source must be a buffer")
    if isinstance(sd[0].base, ImageDType):
      raise bad(f"{src[0].arg[1] if src[0].op is Ops.BUFFER else 'the buffer'!r} is an image ({sd[0].base!r}): read and write its texels "
                "with TEXEL_LOAD/TEXEL_STORE (img.read_texel(x, y), img.write_texel(x, y, rgba)), not plain loads and stores")
    if not _is_int(sd[1]): raise bad(f"index must be an integer, not {sd[1]!r}")
    if op is Ops.LOAD and dt is not sd[0].base: raise bad(f"loads {sd[0].base!r} but is typed {dt!r}")
    if op is Ops.STORE and sd[2] is not sd[0].base: raise bad(f"stores {sd[2]!r} into a buffer of {sd[0].base!r}")
    return
  if op is Ops.VAR:
    if dt is not sd[0]: raise bad(f"initial value is {sd[0]!r}, variable is {dt!r}")
    return
  if op in (Ops.READ, Ops.WRITE):
    if src[0].op is not Ops.VAR: raise bad("first source must be a VAR")
    if op is Ops.READ and dt is not sd[0]: raise bad("reads a variable of another dtype")
    if op is Ops.WRITE and sd[1] is not sd[0]: raise bad(f"writes {sd[1]!r} into a variable of {sd[0]!r}")
    return
  if op in UNARY or op in BINARY:
    if any(s is not sd[0] for s in sd): raise bad(f"operand dtypes differ: {', '.join(map(repr, sd))}")
    if not isinstance(sd[0], DType) or sd[0].kind not in _KINDS[op]: raise bad(f"does not take {sd[0]!r}")
    want = dtypes.bool if op in COMPARE else sd[0]
    if dt is not want: raise bad(f"result must be {want!r}, not {dt!r}")
    return
  if op is Ops.WHERE:
    if sd[0] is not dtypes.bool: raise bad("condition must be bool")
    if not (sd[1] is sd[2] is dt): raise bad(f"branches {sd[1]!r}/{sd[2]!r} and result {dt!r} must match")
    return
  if op in (Ops.TEXEL_LOAD, Ops.TEXEL_STORE):
    _check_texel(u, sd, bad)
    return
  if op in (Ops.CAST, Ops.BITCAST):
    if not isinstance(dt, DType) or not isinstance(sd[0], DType) or isinstance(dt, ImageDType): raise bad("casts only scalar values")
    if op is Ops.BITCAST and dt.itemsize != sd[0].itemsize: raise bad(f"{sd[0]!r} and {dt!r} differ in size")
    return
  if op is Ops.RANGE:
    if not (_is_int(sd[0]) and sd[0] is sd[1] is dt): raise bad("start, end and index must share one integer dtype")
    return
  if op is Ops.IF:
    if sd[0] is not dtypes.bool: raise bad("condition must be bool")
    return
  if op is Ops.ENDRANGE and src[0].op is not Ops.RANGE: raise bad("must close a RANGE")
  if op is Ops.ENDIF and src[0].op is not Ops.IF: raise bad("must close an IF")


def _check_texel(u: UOp, sd: list[Any], bad: Any) -> None:
  if not isinstance(sd[0], PtrDType) or sd[0].addrspace != "global" or not isinstance(img := sd[0].base, ImageDType):
    what = f"a buffer of {sd[0].base!r}" if isinstance(sd[0], PtrDType) else repr(sd[0])
    raise bad(f"first source must be an image parameter (a BUFFER of dtypes.imagef/imageh), not {what}; declare the parameter "
              "with an image dtype, or use LOAD/STORE on plain buffers")
  if sd[1] is not dtypes.int32 or sd[2] is not dtypes.int32: raise bad(f"coordinates (x, y) must be int32, not {sd[1]!r}, {sd[2]!r}")
  if u.op is Ops.TEXEL_LOAD:
    if u.arg not in (0, 1, 2, 3) or isinstance(u.arg, bool): raise bad(f"channel (arg) must be 0, 1, 2 or 3 (r, g, b, a), not {u.arg!r}")
    if u.dtype is not img.base: raise bad(f"reads a texel of {img.base!r} but is typed {u.dtype!r}")
  elif any(d is not img.base for d in sd[3:]):
    raise bad(f"stores {', '.join(map(repr, sd[3:]))} into an image of {img.base!r} texels: all four channels must be {img.base!r}")


def _check_vector(u: UOp, width: Any, sd: list[Any], bad: Any) -> None:
  """VLOAD (width its arg) and VSTORE (width its value count): a buffer parameter, an integer index, a width of 2 or 4
  that moves at most VECTOR_BYTES, values of the buffer's dtype."""
  if not isinstance(sd[0], PtrDType) or sd[0].addrspace != "global":
    raise bad(f"vector loads and stores take a buffer parameter, not {sd[0]!r} (shared arrays are read and written an element at a time)")
  base = sd[0].base
  if isinstance(base, ImageDType): raise bad(f"{base!r} is an image: read and write its texels with TEXEL_LOAD/TEXEL_STORE")
  if not _is_int(sd[1]): raise bad(f"index must be an integer, not {sd[1]!r}")
  if width not in VECTOR_WIDTHS or isinstance(width, bool): raise bad(f"width must be one of {VECTOR_WIDTHS}, not {width!r}")
  if width * base.itemsize > VECTOR_BYTES:
    raise bad(f"{width} elements of {base.name} are {width * base.itemsize} bytes; one vector access moves at most {VECTOR_BYTES} "
              f"(use width {VECTOR_BYTES // base.itemsize})")
  if u.op is Ops.VLOAD and u.dtype is not base: raise bad(f"loads {base!r} but is typed {u.dtype!r}")
  if u.op is Ops.VSTORE and any(d is not base for d in sd[2:]):
    raise bad(f"stores {', '.join(map(repr, sd[2:]))} into a buffer of {base!r}")


def _is_int(dt: Any) -> bool: return isinstance(dt, DType) and dt.kind in "iu"


def _check_const(value: Any, dt: DType, bad: Any) -> None:
  if dt.kind == "b":
    if not isinstance(value, bool): raise bad(f"bool constant must be True/False, not {value!r}")
  elif dt.kind in "iu":
    if not isinstance(value, int) or isinstance(value, bool) or not dt.min <= value <= dt.max:
      raise bad(f"{value!r} is not a {dt.name}")
  elif not isinstance(value, float): raise bad(f"{dt.name} constant must be a Python float, not {value!r}")


# ---------------------------------------------------------------- builder

Scalar = Union[bool, int, float]


class Val:
  """A value under construction: Python operators append IR to the builder."""
  __slots__ = ("b", "u")

  def __init__(self, b: KernelBuilder, u: UOp): self.b, self.u = b, u
  @property
  def dtype(self) -> DType: return self.u.dtype  # type: ignore[return-value]
  def __repr__(self) -> str: return f"<Val {self.u.op.name}:{self.dtype.name}>"
  def __bool__(self) -> bool:
    raise TypeError("an IR value has no truth value while the kernel is built: Python's `if`, `and`, `or`, `not`, `in` and chained "
                    "comparisons (a < b < c) need one; use b.if_(cond), cond.where(a, b), `&`, `|`, `~`, and (a < b) & (b < c)")
  # == and != build comparisons, as < and <= do (a Python bool standing for one would compile a constant); so a Val
  # keeps identity hashing for the dicts that key on it, and never takes part in Python's own equality
  __hash__ = object.__hash__
  def __index__(self) -> int: raise TypeError(f"an IR value ({self.dtype.name}) is not a Python number while the kernel is built; "
                                              "loop with b.range(n), convert with .cast(dtype)")
  __int__ = __float__ = __index__  # type: ignore[assignment]
  def __iter__(self) -> Any: raise TypeError("an IR value is a single value, not a sequence")

  def _bin(self, op: Ops, other: Any, reverse: bool = False) -> Val:
    o = self.b.as_val(other, self.dtype)
    a, c = (o, self) if reverse else (self, o)
    return self.b.alu(op, a, c)

  def __add__(self, o: Any) -> Val: return self._bin(Ops.ADD, o)
  def __radd__(self, o: Any) -> Val: return self._bin(Ops.ADD, o, True)
  def __sub__(self, o: Any) -> Val: return self._bin(Ops.SUB, o)
  def __rsub__(self, o: Any) -> Val: return self._bin(Ops.SUB, o, True)
  def __mul__(self, o: Any) -> Val: return self._bin(Ops.MUL, o)
  def __rmul__(self, o: Any) -> Val: return self._bin(Ops.MUL, o, True)
  def __truediv__(self, o: Any) -> Val: return self._bin(Ops.DIV, o)
  def __rtruediv__(self, o: Any) -> Val: return self._bin(Ops.DIV, o, True)
  def __floordiv__(self, o: Any) -> Val: return self._bin(Ops.IDIV, o)
  def __rfloordiv__(self, o: Any) -> Val: return self._bin(Ops.IDIV, o, True)
  def __mod__(self, o: Any) -> Val: return self._bin(Ops.MOD, o)
  def __rmod__(self, o: Any) -> Val: return self._bin(Ops.MOD, o, True)
  def __and__(self, o: Any) -> Val: return self._bin(Ops.AND, o)
  def __rand__(self, o: Any) -> Val: return self._bin(Ops.AND, o, True)
  def __or__(self, o: Any) -> Val: return self._bin(Ops.OR, o)
  def __ror__(self, o: Any) -> Val: return self._bin(Ops.OR, o, True)
  def __xor__(self, o: Any) -> Val: return self._bin(Ops.XOR, o)
  def __rxor__(self, o: Any) -> Val: return self._bin(Ops.XOR, o, True)
  def __lshift__(self, o: Any) -> Val: return self._bin(Ops.SHL, o)
  def __rshift__(self, o: Any) -> Val: return self._bin(Ops.SHR, o)
  def __lt__(self, o: Any) -> Val: return self._bin(Ops.CMPLT, o)
  def __le__(self, o: Any) -> Val: return self._bin(Ops.CMPLE, o)
  def __gt__(self, o: Any) -> Val: return self._bin(Ops.CMPLT, o, True)
  def __ge__(self, o: Any) -> Val: return self._bin(Ops.CMPLE, o, True)
  def eq(self, o: Any) -> Val: return self._bin(Ops.CMPEQ, o)
  def ne(self, o: Any) -> Val: return self._bin(Ops.CMPNE, o)
  def __eq__(self, o: Any) -> Val: return self._bin(Ops.CMPEQ, o)  # type: ignore[override]
  def __ne__(self, o: Any) -> Val: return self._bin(Ops.CMPNE, o)  # type: ignore[override]
  def __neg__(self) -> Val: return self.b.alu(Ops.NEG, self)
  def __invert__(self) -> Val: return self.b.alu(Ops.NOT, self)
  def max(self, o: Any) -> Val: return self._bin(Ops.MAX, o)
  def min(self, o: Any) -> Val: return self._bin(Ops.MIN, o)
  def exp2(self) -> Val: return self.b.alu(Ops.EXP2, self)
  def log2(self) -> Val: return self.b.alu(Ops.LOG2, self)
  def sin(self) -> Val: return self.b.alu(Ops.SIN, self)
  def sqrt(self) -> Val: return self.b.alu(Ops.SQRT, self)
  def recip(self) -> Val: return self.b.alu(Ops.RECIP, self)
  def trunc(self) -> Val: return self.b.alu(Ops.TRUNC, self)
  def cast(self, dt: DType) -> Val: return self.b.emit(Ops.CAST, dt, (self,))
  def bitcast(self, dt: DType) -> Val: return self.b.emit(Ops.BITCAST, dt, (self,))

  def where(self, a: Any, b: Any) -> Val:
    """self ? a : b (self must be bool)."""
    dt = a.dtype if isinstance(a, Val) else b.dtype if isinstance(b, Val) else dtypes.from_py(a)
    return self.b.emit(Ops.WHERE, dt, (self, self.b.as_val(a, dt), self.b.as_val(b, dt)))


class _Named:
  """What a kernel names but is not a value (a buffer, a variable): equal only to itself, and never compared with a value,
  which Python would answer False where the kernel meant an IR comparison."""
  __slots__ = ()
  __hash__ = object.__hash__
  what = ""

  def __eq__(self, o: object) -> bool:
    if o is self: return True
    raise TypeError(f"{self.what} is not a value: compare {'its elements (p[i] == x)' if isinstance(self, Ptr) else 'its .value'} instead")
  def __ne__(self, o: object) -> bool: return not self.__eq__(o)


class Ptr(_Named):
  """A buffer or shared array: `p[i]` loads, `p[i] = v` stores."""
  __slots__ = ("b", "u")
  what = "a buffer or shared array"
  def __iter__(self) -> Any: raise TypeError("a buffer cannot be iterated while the kernel is built: loop with b.range(n) and index it")
  def __contains__(self, x: Any) -> bool:
    raise TypeError("`x in buffer` cannot be decided while the kernel is built: loop with b.range(n) and compare")

  def __init__(self, b: KernelBuilder, u: UOp): self.b, self.u = b, u
  @property
  def dtype(self) -> DType: return self.u.dtype.base  # type: ignore[union-attr]
  def __repr__(self) -> str: return f"<Ptr {self.u.op.name} {self.dtype.name}>"
  def __getitem__(self, idx: Any) -> Val: return self.b.emit(Ops.LOAD, self.dtype, (self, self.b.as_val(idx, dtypes.int32)))
  def __setitem__(self, idx: Any, value: Any) -> None:
    if isinstance(self.dtype, ImageDType):  # (before the value becomes a constant of the image's type)
      raise IRError(f"kernel {self.b.name}: STORE: {self.u.arg[1]!r} is an image ({self.dtype!r}): write its texels with "
                    "write_texel(x, y, rgba) (TEXEL_STORE), not plain stores")
    self.b.emit(Ops.STORE, None, (self, self.b.as_val(idx, dtypes.int32), self.b.as_val(value, self.dtype)))

  def vload(self, idx: Any, width: int = 4) -> tuple[Val, ...]:
    """Elements idx..idx+width-1 of a buffer parameter, read at once (VLOAD): width 2 or 4, at most 16 bytes. The
    address of element idx must be a multiple of width * itemsize (see the module docstring)."""
    b = self.b
    if not isinstance(width, int) or isinstance(width, bool): raise IRError(f"kernel {b.name}: a vector's width is an int (2 or 4), not {width!r}")
    v = b.emit(Ops.VLOAD, self.dtype, (self, b.as_val(idx, dtypes.int32)), width)
    return tuple(b.emit(Ops.LANE, self.dtype, (v,), lane) for lane in range(width))

  def vstore(self, idx: Any, values: Sequence[Any]) -> None:
    """Write `values` (2 or 4 of them, converted to the buffer's dtype) to elements idx.. at once (VSTORE); the address of
    element idx must be a multiple of len(values) * itemsize."""
    b = self.b
    if isinstance(self.dtype, ImageDType):
      raise IRError(f"kernel {b.name}: VSTORE: {self.u.arg[1]!r} is an image ({self.dtype!r}): write its texels with write_texel(x, y, rgba)")
    vals = [v.cast(self.dtype) if isinstance(v, Val) and v.dtype is not self.dtype else b.as_val(v, self.dtype) for v in values]
    b.emit(Ops.VSTORE, None, (self, b.as_val(idx, dtypes.int32), *vals))

  def read_texel(self, x: Any, y: Any) -> tuple[Val, Val, Val, Val]:
    """An image's texel at column x, row y (int32; outside the image: the nearest edge texel), as its (r, g, b, a)."""
    b, base = self.b, self.dtype.base if isinstance(self.dtype, ImageDType) else self.dtype
    xv, yv = b.as_val(x, dtypes.int32), b.as_val(y, dtypes.int32)
    return tuple(b.emit(Ops.TEXEL_LOAD, base, (self, xv, yv), c) for c in range(4))  # type: ignore[return-value]

  def write_texel(self, x: Any, y: Any, rgba: Sequence[Any]) -> None:
    """Store the texel at column x, row y (inside the image) as the four values rgba (converted to the image's texel type)."""
    b, base = self.b, self.dtype.base if isinstance(self.dtype, ImageDType) else self.dtype
    if len(rgba) != 4: raise IRError(f"kernel {b.name}: a texel has 4 channels (r, g, b, a), got {len(rgba)} values")
    vals = [v.cast(base) if isinstance(v, Val) and v.dtype is not base else b.as_val(v, base) for v in rgba]
    b.emit(Ops.TEXEL_STORE, None, (self, b.as_val(x, dtypes.int32), b.as_val(y, dtypes.int32), *vals))


class Var(_Named):
  """A mutable register variable: read with `.value`, write by assigning it."""
  __slots__ = ("b", "u")
  what = "a variable"

  def __init__(self, b: KernelBuilder, u: UOp): self.b, self.u = b, u
  @property
  def value(self) -> Val: return self.b.emit(Ops.READ, self.u.dtype, (self,))
  @value.setter
  def value(self, v: Any) -> None: self.b.emit(Ops.WRITE, None, (self, self.b.as_val(v, self.u.dtype)))  # type: ignore[arg-type]


class KernelBuilder:
  """Builds a Kernel op by op. Example:

      b = KernelBuilder("add1")
      out, x, n = b.buffer("out", dtypes.float32), b.buffer("x", dtypes.float32), b.scalar("n", dtypes.int32)
      i = b.global_id(0)
      with b.if_(i < n):
        out[i] = x[i] + 1.0
      kernel = b.finish()
  """

  def __init__(self, name: str):
    self.name, self.uops = _check_kernel_name(name), []
    self._nbuf = self._nscalar = 0
    self._open: list[UOp] = []
    self._specials: dict[tuple[str, int], Val] = {}

  def emit(self, op: Ops, dtype: DType | PtrDType | None, src: Sequence[Val | Ptr | Var | UOp] = (), arg: Any = None) -> Any:
    for s in src:
      if not isinstance(s, (UOp, Val, Ptr, Var)):
        raise IRError(f"kernel {self.name}: {op.name}: an operand must be an IR value, not {s!r} ({type(s).__name__})")
    u = UOp(op, dtype, tuple(s if isinstance(s, UOp) else s.u for s in src), arg)
    def bad(msg: str) -> IRError: return IRError(f"kernel {self.name}: {op.name}: {msg}")
    _check_types(u, bad)
    self.uops.append(u)
    if op in (Ops.BUFFER, Ops.SHARED, Ops.SPILL): return Ptr(self, u)
    if op is Ops.VAR: return Var(self, u)
    return Val(self, u)

  def as_val(self, x: Any, dtype: DType) -> Val:
    """x as a value: an IR value is taken as is, a Python scalar becomes a constant of `dtype`."""
    if isinstance(x, Val): return x
    if hasattr(x, "item") and not isinstance(x, (Ptr, Var)): x = x.item()  # numpy scalars
    if isinstance(x, (bool, int, float)):
      if dtype.kind in "iu" and (isinstance(x, float) or not dtype.min <= x <= dtype.max):
        raise IRError(f"kernel {self.name}: constant {x!r} is not a {dtype.name}")
      return self.const(x, dtype)
    raise IRError(f"kernel {self.name}: cannot use {x!r} ({type(x).__name__}) as a {dtype.name} value")

  # parameters
  # dtypes: a DType, or what dtypes.as_dtype takes (a name, a numpy or torch dtype)
  def buffer(self, name: str, dtype: DType | str | Any) -> Ptr:
    ptr = PtrDType(dtypes.as_dtype(dtype), "global")
    self._nbuf += 1
    return self.emit(Ops.BUFFER, ptr, (), (self._nbuf - 1, _check_name(name)))

  def scalar(self, name: str, dtype: DType | str | Any) -> Val:
    dt = dtypes.as_dtype(dtype)
    self._nscalar += 1
    return self.emit(Ops.SCALAR, dt, (), (self._nscalar - 1, _check_name(name)))

  def shared(self, name: str, dtype: DType | str | Any, count: int) -> Ptr:
    return self.emit(Ops.SHARED, PtrDType(dtypes.as_dtype(dtype), "shared"), (), (_check_name(name), int(count)))

  def const(self, value: Scalar, dtype: DType | str | Any | None = None) -> Val:
    dt = dtypes.from_py(value) if dtype is None else dtypes.as_dtype(dtype)
    v = bool(value) if dt.kind == "b" else int(value) if dt.kind in "iu" else float(value)
    if dt.kind == "f" and dt is not dtypes.float64 and math.isfinite(v): v = cast_value(v, dt)
    return self.emit(Ops.CONST, dt, (), v)

  # launch geometry
  def special(self, kind: str, axis: int) -> Val:
    # one op per (kind, axis) at the top level; inside a block a fresh one, so scoping stays trivially right
    if not self._open and (kind, axis) in self._specials: return self._specials[(kind, axis)]
    v = self.emit(Ops.SPECIAL, dtypes.int32, (), (kind, axis))
    if not self._open: self._specials[(kind, axis)] = v
    return v
  def group_id(self, axis: int = 0) -> Val: return self.special("group_id", axis)
  def local_id(self, axis: int = 0) -> Val: return self.special("local_id", axis)
  def num_groups(self, axis: int = 0) -> Val: return self.special("num_groups", axis)
  def local_size(self, axis: int = 0) -> Val: return self.special("local_size", axis)
  def global_id(self, axis: int = 0) -> Val: return self.group_id(axis) * self.local_size(axis) + self.local_id(axis)

  # ALU
  def alu(self, op: Ops, *srcs: Val) -> Val:
    dt = dtypes.bool if op in COMPARE else srcs[0].dtype
    return self.emit(op, dt, srcs)

  def var(self, init: Any, dtype: DType | None = None, name: str = "acc") -> Var:
    v = self.as_val(init, dtype or (init.dtype if isinstance(init, Val) else dtypes.from_py(init)))
    return self.emit(Ops.VAR, v.dtype, (v,), _check_name(name))

  def barrier(self) -> None: self.emit(Ops.BARRIER, None)

  # control flow
  @contextlib.contextmanager
  def range(self, start: Any, end: Any | None = None, dtype: DType = dtypes.int32) -> Iterator[Val]:
    """`with b.range(n) as i:` or `with b.range(start, end) as i:`: a loop over [start, end)."""
    if end is None: start, end = 0, start
    dt = start.dtype if isinstance(start, Val) else end.dtype if isinstance(end, Val) else dtype
    r = self.emit(Ops.RANGE, dt, (self.as_val(start, dt), self.as_val(end, dt)))
    self._open.append(r.u)
    yield r
    self._close(r.u, Ops.ENDRANGE)

  @contextlib.contextmanager
  def if_(self, cond: Val) -> Iterator[None]:
    if not isinstance(cond, Val):
      raise IRError(f"kernel {self.name}: if_() takes an IR bool value (e.g. i < n), not {cond!r} ({type(cond).__name__}); "
                    "a condition known while building is Python's own `if`")
    u = self.emit(Ops.IF, None, (cond,)).u
    self._open.append(u)
    yield
    self._close(u, Ops.ENDIF)

  @contextlib.contextmanager
  def else_(self) -> Iterator[None]:
    """Right after a `with b.if_(...)` block: its else branch."""
    last = self.uops[-1] if self.uops else None
    if last is None or last.op is not Ops.ENDIF: raise IRError(f"kernel {self.name}: else_() must directly follow an if_() block")
    self.uops.pop()
    if_u = last.src[0]
    self.emit(Ops.ELSE, None, (if_u,))
    self._open.append(if_u)
    yield
    self._close(if_u, Ops.ENDIF)

  def _close(self, opener: UOp, op: Ops) -> None:
    if not self._open or self._open[-1] is not opener: raise IRError(f"kernel {self.name}: blocks closed out of order")
    self._open.pop()
    self.emit(op, None, (opener,))

  def finish(self) -> Kernel:
    if self._open: raise IRError(f"kernel {self.name}: {self._open[-1].op.name} block still open")
    return verify(Kernel(self.name, tuple(self.uops)))


def _check_name(name: str) -> str:
  if not isinstance(name, str) or not _IDENT.match(name) or keyword.iskeyword(name):
    raise IRError(f"{name!r} is not a valid identifier", "use ASCII letters, digits and _, not starting with a digit")
  if len(name) > MAX_NAME_LENGTH: raise IRError(f"name {name[:32]}... is {len(name)} characters long; at most {MAX_NAME_LENGTH} are allowed")
  return name
