"""The @kernel DSL: a typed Python function becomes plugrt IR, and runs on any device.

    from plugrt import kernel, dtypes
    from plugrt.frontend.dsl import global_id

    @kernel
    def saxpy(out: dtypes.float32[:], x: dtypes.float32[:], y: dtypes.float32[:], a: dtypes.float32, n: dtypes.int32):
      i = global_id(0)
      if i < n:
        out[i] = a * x[i] + y[i]

    saxpy[4, 256](out, x, y, 2.0, 1000)           # 4 groups of 256 threads, on the buffers' device
    saxpy[4, 256, "PYTHON"](out, x, y, 2.0, 1000)  # or on a named device

Parameters are buffers (`dtype[:]`) or scalars (`dtype`, or int/float/bool); unannotated
ones take their type from the first call's arguments (a kernel is compiled once per
device and signature). Inside, the function may use arithmetic, comparisons, `if`/
`elif`/`else`, `for` over `range`, `a if c else b`, the thread ids below, `shared`
arrays and `barrier()`, math functions (`math.sqrt`, `exp`, `log`, `sin`, `cos`, ...,
`abs`, `min`, `max`) and casts (`dtypes.float16(x)`, `int(x)`, `float(x)`).

Images (parameters annotated `dtypes.imagef((h, w))[:]`, or passed an image Buffer or Tensor) are read and written
a texel at a time, at integer coordinates x (the column) and y (the row):

    @kernel
    def brighten(dst: dtypes.imagef((480, 640))[:], src: dtypes.imagef((480, 640))[:]):
      x, y = global_id(0), global_id(1)
      r, g, b, a = read_texel(src, x, y)      # outside the image: the nearest edge texel
      write_texel(dst, x, y, (r * 2, g * 2, b * 2, a))

`read_texel(...)[c]` is one channel. Plain indexing of an image (`src[i]`) is an error, and a kernel may not both
read and write one image on OpenCL (read one, write another).

Vector access reads or writes 2 or 4 contiguous elements of a buffer parameter at once (16 bytes at most: one
float4-wide load or store on a GPU), at an index whose element address is a multiple of the vector's size (in a
buffer plugrt allocated: an index that is a multiple of the width; see plugrt.compiler.ir):

    @kernel
    def scale4(out: dtypes.float32[:], x: dtypes.float32[:], n: dtypes.int32):
      i = global_id(0) * 4
      if i + 3 < n:
        a, b, c, d = vload(x, i, 4)          # x[i], x[i+1], x[i+2], x[i+3]
        vstore(out, i, (a * 2, b * 2, c * 2, d * 2))

Arithmetic follows Python: `/` is true division, `//` and `%` floor toward minus
infinity (the IR's IDIV/MOD truncate, like C; float `%` is exact and `//` is rounded
from it, as Python's divmod), `and`/`or`/`not` act on truth values (both sides are
evaluated). Integers wrap at their dtype's width. Division by zero cannot raise in a
kernel: a float one gives numpy's inf or NaN (`%`: NaN), an integer one an unspecified
value. A variable takes the widest type assigned to it anywhere in the function,
decided before code is generated, so every read sees that type, even one before the
wider assignment or after a narrower one (`acc = 0` then `acc += x[i]` with float x
makes acc a float; `v = x[i]` in one branch and `v = i` in the other makes v a float
in both). An annotation declares the type instead (`acc: dtypes.int32 = 0`): values
assigned to it are converted. Anything else (while, break, calls to other Python
functions, ...) is a KernelSyntaxError pointing at the offending line.
"""
from __future__ import annotations

import ast
import builtins
import inspect
import math
import operator
import textwrap
from collections.abc import Callable, Sequence
from typing import Any

from plugrt.compiler.arith import PROMOTION_ORDER, ir_floordiv, ir_math, promote
from plugrt.compiler.ir import Kernel, KernelBuilder, Ops, Ptr, Val, Var
from plugrt.dtype import BufType, DType, ImageDType, dtypes
from plugrt.errors import IRError


class KernelSyntaxError(SyntaxError):
  """Python the DSL cannot turn into a kernel; filename/lineno/text point at the user's source."""


# ---------------------------------------------------------------- what kernels call (placeholders outside a kernel)

def _only_in_kernels(name: str) -> Callable[..., Any]:
  def fn(*args: Any, **kwargs: Any) -> Any: raise RuntimeError(f"plugrt.frontend.dsl.{name}() is only meaningful inside a @kernel function")
  fn.__name__ = name
  return fn


global_id, local_id, group_id = _only_in_kernels("global_id"), _only_in_kernels("local_id"), _only_in_kernels("group_id")
local_size, num_groups, shared, barrier = _only_in_kernels("local_size"), _only_in_kernels("num_groups"), _only_in_kernels("shared"), \
  _only_in_kernels("barrier")
where, exp2, log2, sqrt, sin, cos, exp, log = (_only_in_kernels(n) for n in ("where", "exp2", "log2", "sqrt", "sin", "cos", "exp", "log"))
read_texel, write_texel = _only_in_kernels("read_texel"), _only_in_kernels("write_texel")
vload, vstore = _only_in_kernels("vload"), _only_in_kernels("vstore")

_SPECIALS = {global_id: "global_id", local_id: "local_id", group_id: "group_id", local_size: "local_size", num_groups: "num_groups"}
_MATH = {sqrt: "sqrt", math.sqrt: "sqrt", exp2: "exp2", math.exp2: "exp2", log2: "log2", math.log2: "log2", sin: "sin", math.sin: "sin",
         cos: "cos", math.cos: "cos", exp: "exp", math.exp: "exp", log: "log", math.log: "log", math.tan: "tan", math.floor: "floor",
         math.ceil: "ceil", math.trunc: "trunc", math.fabs: "abs", builtins.abs: "abs"}


def _py_dtype(x: Any) -> DType:
  return dtypes.bool if isinstance(x, bool) else dtypes.default_int if isinstance(x, int) else dtypes.default_float


# ---------------------------------------------------------------- translation

Value = Any  # a Val, a Ptr, or a Python bool/int/float (folded until it meets a Val)


class _Translator:
  def __init__(self, kf: KernelFunction, params: Sequence[DType | BufType], vartypes: dict[str, DType], infer: bool):
    self.kf, self.params, self.vartypes, self.infer = kf, params, vartypes, infer
    self.b = KernelBuilder(kf.__name__)
    self.env: dict[str, Any] = {}
    self.node: ast.AST = kf.tree
    self.declared: dict[str, DType] = {}  # annotated variables: their type is the annotation's, whatever is assigned
    for n in ast.walk(kf.tree):
      if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
        dt = self.dtype_of(n.annotation, scalar_only=True)
        if self.declared.setdefault(n.target.id, dt) is not dt:
          raise self.error(f"{n.target.id} is declared as both {self.declared[n.target.id].name} and {dt.name}", n)

  # ---- errors point at the user's line
  def error(self, msg: str, node: ast.AST | None = None) -> KernelSyntaxError:
    node = node or self.node
    lineno = self.kf.first_line + getattr(node, "lineno", 1) - 1
    text = self.kf.lines[getattr(node, "lineno", 1) - 1] if self.kf.lines else None
    return KernelSyntaxError(f"@kernel {self.kf.__name__}: {msg}", (self.kf.filename, lineno, getattr(node, "col_offset", 0) + 1, text))

  def run(self) -> Kernel:
    b = self.b
    for (name, _), t in zip(self.kf.param_names, self.params):
      self.env[name] = b.buffer(name, t.dtype) if isinstance(t, BufType) else b.scalar(name, t)
    if not self.infer:  # every assigned name is a register variable, defined up front: Python's scoping, not C's
      for name, dt in self.vartypes.items(): self.env[name] = b.var(False if dt is dtypes.bool else 0, dt, _var_name(name))
    self.block(self.kf.tree.body)
    return self.b.finish() if not self.infer else None  # type: ignore[return-value]

  def block(self, stmts: list[ast.stmt]) -> None:
    for s in stmts:
      self.node = s
      try: self.stmt(s)
      except KernelSyntaxError: raise
      except (IRError, TypeError, ValueError) as e: raise self.error(str(e), s) from None

  # ---- statements
  def stmt(self, s: ast.stmt) -> None:
    if isinstance(s, ast.Expr):
      if isinstance(s.value, ast.Constant) and isinstance(s.value.value, str): return  # a docstring
      self.expr(s.value)
    elif isinstance(s, ast.Assign):
      value = self.expr(s.value) if not isinstance(s.value, ast.Tuple) else None  # `a, b = x, y` evaluates in assign
      for t in s.targets: self.assign(t, value, s)
    elif isinstance(s, ast.AnnAssign):
      if s.value is None: raise self.error("declare a variable with a value: `x: dtypes.float32 = 0`", s)
      self.assign(s.target, self.expr(s.value), s)
    elif isinstance(s, ast.AugAssign):
      target = s.target
      load = ast.copy_location(ast.Name(target.id, ast.Load()) if isinstance(target, ast.Name) else
                               ast.Subscript(target.value, target.slice, ast.Load()), target)  # type: ignore[attr-defined]
      self.assign(target, self.binop(s.op, self.expr(load), self.expr(s.value), s), s)
    elif isinstance(s, ast.If): self.if_stmt(s)
    elif isinstance(s, ast.For): self.for_stmt(s)
    elif isinstance(s, ast.Pass): pass
    elif isinstance(s, ast.Return):
      if s.value is not None: raise self.error("a kernel returns nothing: write results into a buffer", s)
      if s is not self.kf.tree.body[-1]: raise self.error("return is only allowed as the last statement; use if/else instead", s)
    else:
      what = {ast.While: "while loops", ast.Break: "break", ast.Continue: "continue", ast.With: "with", ast.Try: "try",
              ast.FunctionDef: "nested functions", ast.Assert: "assert", ast.Raise: "raise", ast.Delete: "del"}.get(type(s), type(s).__name__)
      raise self.error(f"{what}: not supported in kernels (use for over range, and if/else)", s)

  def assign(self, target: ast.expr, value: Value, s: ast.stmt) -> None:
    if isinstance(target, ast.Tuple) and isinstance(value, tuple):  # a texel: r, g, b, a = read_texel(img, x, y)
      if len(value) != len(target.elts): raise self.error(f"unpack the {len(value)} values into as many names", s)
      for t, v in zip(target.elts, value): self.assign(t, v, s)
      return
    if isinstance(value, tuple):  # a name for a texel (t = read_texel(...); t[0]): bound once, like a buffer alias
      if not isinstance(target, ast.Name) or target.id in self.vartypes or isinstance(self.env.get(target.id), (Val, Var)):
        raise self.error("a texel or a vector is several values: unpack it (`r, g, b, a = read_texel(img, x, y)`, "
                         "`a, b, c, d = vload(x, i)`), or name it with a name that holds nothing else", s)
      self.env[target.id] = value
      return
    if value is None and not isinstance(target, ast.Tuple): raise self.error("assign a value (tuples only unpack: `a, b = x, y`)", s)
    if isinstance(target, ast.Tuple):
      if not isinstance(s, ast.Assign) or not isinstance(s.value, ast.Tuple) or len(s.value.elts) != len(target.elts):
        raise self.error("unpack only a tuple of the same length: `a, b = x, y`", s)
      values = [self.expr(e) for e in s.value.elts]
      for t, v in zip(target.elts, values): self.assign(t, v, s)
      return
    if isinstance(target, ast.Subscript):
      buf = self.expr(target.value)
      if not isinstance(buf, Ptr): raise self.error("only buffers and shared arrays can be indexed", target)
      buf[self.index(target.slice)] = self.convert(value, buf.dtype)
      return
    if not isinstance(target, ast.Name): raise self.error("assign to a name or a buffer element", target)
    name = target.id
    if isinstance(value, Ptr):  # an alias of a buffer, or a shared array
      if name in self.vartypes: raise self.error(f"{name} holds numbers elsewhere; it cannot also name a buffer", target)
      self.env[name] = value
      return
    if isinstance(self.env.get(name), Ptr) or name in {n for n, _ in self.kf.param_names}:
      raise self.error(f"cannot assign to {name}: it is a parameter or a buffer (copy it into a new variable)", target)
    if self.infer:  # the variable's type so far (declared, or the widest yet): later reads must see it, not this value's type
      dt, prev = value.dtype if isinstance(value, Val) else _py_dtype(value), self.vartypes.get(name)
      self.vartypes[name] = self.declared.get(name) or (dt if prev is None else promote(prev, dt))
      self.env[name] = self.convert(value, self.vartypes[name])
    else:
      self.env[name].value = self.convert(value, self.vartypes[name])

  def if_stmt(self, s: ast.If) -> None:
    cond = self.truth(self.expr(s.test))
    if not isinstance(cond, Val):  # a Python constant: only the taken branch exists
      self.block(s.body if cond else s.orelse)
      return
    with self.b.if_(cond): self.block(s.body)
    if s.orelse:
      with self.b.else_(): self.block(s.orelse)

  def for_stmt(self, s: ast.For) -> None:
    if s.orelse: raise self.error("for ... else is not supported", s)
    it = s.iter
    if not (isinstance(it, ast.Call) and self.resolve(it.func) is builtins.range and 1 <= len(it.args) <= 3 and not it.keywords):
      raise self.error("kernels loop with `for i in range(...)` only", s.iter)
    if not isinstance(s.target, ast.Name): raise self.error("the loop variable must be a name", s.target)
    args = [self.expr(a) for a in it.args]
    start, stop = (0, args[0]) if len(args) == 1 else (args[0], args[1])
    step = args[2] if len(args) == 3 else 1
    if isinstance(step, Val) or not isinstance(step, int) or step == 0: raise self.error("range's step must be a nonzero integer constant", it)
    dt = dtypes.int32
    for x in (start, stop):
      if isinstance(x, Val):
        if x.dtype.kind not in "iu": raise self.error(f"range takes integers, not {x.dtype.name}", it)
        dt = promote(dt, x.dtype)
      elif not isinstance(x, int) or isinstance(x, bool): raise self.error("range takes integers", it)
    # iterations: ceil((stop - start) / step), Python constants folding where they can
    span = self.binop(ast.Sub(), stop, start, it) if step > 0 else self.binop(ast.Sub(), start, stop, it)
    count = span if abs(step) == 1 else self.binop(ast.FloorDiv(), self.binop(ast.Add(), span, abs(step) - 1, it), abs(step), it)
    with self.b.range(self.b.const(0, dt), self.convert(count, dt)) as k:
      value = k if not isinstance(start, Val) and start == 0 and step == 1 else self.binop(ast.Add(), self.binop(ast.Mult(), k, step, it), start, it)
      self.assign(s.target, value, s)
      self.block(s.body)

  # ---- expressions
  def resolve(self, node: ast.expr) -> Any:
    """The Python object a name or attribute chain names (outside the kernel's own variables)."""
    if isinstance(node, ast.Name):
      if node.id in self.kf.closure: return self.kf.closure[node.id]
      if node.id in self.kf.globals: return self.kf.globals[node.id]
      if hasattr(builtins, node.id): return getattr(builtins, node.id)
      raise self.error(f"name {node.id!r} is not defined", node)
    if isinstance(node, ast.Attribute): return getattr(self.resolve(node.value), node.attr)
    raise self.error("expected a name", node)

  def expr(self, e: ast.expr) -> Value:
    if isinstance(e, ast.Constant):
      if isinstance(e.value, (bool, int, float)): return e.value
      raise self.error(f"{type(e.value).__name__} constants are not supported in kernels", e)
    if isinstance(e, ast.Name):
      if e.id in self.env: v = self.env[e.id]
      elif self.infer and e.id in self.vartypes: v = self.b.const(0, self.vartypes[e.id])  # an earlier round's variable
      else:
        if e.id in self.vartypes or any(isinstance(n, ast.Name) and n.id == e.id for n in ast.walk(self.kf.tree)
                                        if isinstance(getattr(n, "ctx", None), ast.Store)):
          raise self.error(f"variable {e.id!r} is used before it is assigned", e)
        v = self.resolve(e)
        if isinstance(v, (bool, int, float)): return v
        raise self.error(f"{e.id!r} is a {type(v).__name__}; kernels use numbers, buffers and plugrt.frontend.dsl functions", e)
      return v.value if isinstance(v, Var) else v
    if isinstance(e, ast.Attribute):
      v = self.resolve(e)
      if isinstance(v, (bool, int, float)): return v
      raise self.error(f"{ast.unparse(e)} is not a number", e)
    if isinstance(e, ast.BinOp): return self.binop(e.op, self.expr(e.left), self.expr(e.right), e)
    if isinstance(e, ast.UnaryOp): return self.unary(e)
    if isinstance(e, ast.BoolOp):
      vals = [self.truth(self.expr(v)) for v in e.values]
      out = vals[0]
      for v in vals[1:]: out = self.logic(e.op, out, v)
      return out
    if isinstance(e, ast.Compare): return self.compare(e)
    if isinstance(e, ast.IfExp):
      c = self.truth(self.expr(e.test))
      if not isinstance(c, Val): return self.expr(e.body if c else e.orelse)
      a, b = self.coerce(self.expr(e.body), self.expr(e.orelse))
      return c.where(a, b)
    if isinstance(e, ast.Subscript):
      buf = self.expr(e.value)
      if isinstance(buf, tuple):  # one channel of a texel
        c = self.expr(e.slice)
        if not isinstance(c, int) or isinstance(c, bool) or not 0 <= c < len(buf):
          raise self.error(f"a texel's channel or a vector's element is a constant from 0 to {len(buf) - 1}", e)
        return buf[c]
      if not isinstance(buf, Ptr): raise self.error("only buffers and shared arrays can be indexed", e)
      return buf[self.index(e.slice)]
    if isinstance(e, ast.Call): return self.call(e)
    raise self.error(f"{type(e).__name__} expressions are not supported in kernels", e)

  def index(self, node: ast.expr) -> Val:
    if isinstance(node, ast.Tuple): raise self.error("buffers are 1-D: compute the flat index (i * width + j)", node)
    i = self.expr(node)
    if isinstance(i, bool) or isinstance(i, float) or (isinstance(i, Val) and i.dtype.kind not in "iu"):
      raise self.error("an index must be an integer", node)
    return i if isinstance(i, Val) else self.b.const(i, dtypes.int32 if -2**31 <= i < 2**31 else dtypes.int64)

  def dtype_of(self, node: ast.expr, scalar_only: bool = False) -> DType:
    t = _param_type(self.resolve(node) if not isinstance(node, ast.Constant) else node.value)
    if t is None or (scalar_only and isinstance(t, BufType)): raise self.error(f"{ast.unparse(node)} is not a dtype", node)
    return t  # type: ignore[return-value]

  def convert(self, x: Value, dt: DType) -> Val:
    """x as a value of dt (a Python constant becomes one; a value of another dtype is cast)."""
    if isinstance(x, Val): return x if x.dtype is dt else x.cast(dt)
    if isinstance(x, Ptr): raise TypeError("a buffer is not a number")
    if dt.kind in "iu" and isinstance(x, float): return self.b.const(x, dtypes.float64).cast(dt)
    if dt.kind in "iu" and not dt.min <= x <= dt.max: raise ValueError(f"{x} does not fit {dt.name}")
    return self.b.const(x, dt)

  def coerce(self, a: Value, b: Value) -> tuple[Value, Value]:
    """Two operands in one dtype. Python constants take the other side's kind (an int constant
    with a float16 value is float16; a float constant with an int value makes both float32)."""
    if not isinstance(a, Val) and not isinstance(b, Val): return a, b
    if isinstance(a, Val) and isinstance(b, Val):
      dt = promote(a.dtype, b.dtype)
      return self.convert(a, dt), self.convert(b, dt)
    val, py = (a, b) if isinstance(a, Val) else (b, a)
    dt = val.dtype
    if isinstance(py, float) and dt.kind != "f": dt = dtypes.default_float
    elif isinstance(py, int) and not isinstance(py, bool) and dt is dtypes.bool: dt = dtypes.default_int
    va, vb = self.convert(val, dt), self.convert(py, dt)
    return (va, vb) if isinstance(a, Val) else (vb, va)

  def truth(self, x: Value) -> Value:
    if isinstance(x, Val): return x if x.dtype is dtypes.bool else x.ne(self.convert(0, x.dtype))
    return bool(x)

  def logic(self, op: ast.boolop, a: Value, b: Value) -> Value:
    if not isinstance(a, Val) and not isinstance(b, Val): return (a and b) if isinstance(op, ast.And) else (a or b)
    a, b = self.convert(a, dtypes.bool), self.convert(b, dtypes.bool)
    return a & b if isinstance(op, ast.And) else a | b

  def compare(self, e: ast.Compare) -> Value:
    left, out = self.expr(e.left), True
    for op, right_node in zip(e.ops, e.comparators):
      right = self.expr(right_node)
      a, b = self.coerce(left, right)
      if isinstance(op, ast.Lt): r = a < b
      elif isinstance(op, ast.LtE): r = a <= b
      elif isinstance(op, ast.Gt): r = a > b
      elif isinstance(op, ast.GtE): r = a >= b
      elif isinstance(op, ast.Eq): r = a.eq(b) if isinstance(a, Val) else a == b
      elif isinstance(op, ast.NotEq): r = a.ne(b) if isinstance(a, Val) else a != b
      else: raise self.error(f"{type(op).__name__} comparisons are not supported", e)
      out = r if out is True else self.logic(ast.And(), out, r)
      left = right
    return out

  def unary(self, e: ast.UnaryOp) -> Value:
    x = self.expr(e.operand)
    if isinstance(e.op, ast.Not): return (not self.truth(x)) if not isinstance(x, Val) else ~self.truth(x)
    if not isinstance(x, Val): return {ast.USub: lambda v: -v, ast.UAdd: lambda v: +v, ast.Invert: lambda v: ~v}[type(e.op)](x)
    if isinstance(e.op, ast.USub): return -x if x.dtype is not dtypes.bool else -self.convert(x, dtypes.int32)
    if isinstance(e.op, ast.UAdd): return x
    if x.dtype.kind == "f": raise self.error("~ needs an integer", e)
    return ~x

  def binop(self, op: ast.operator, a: Value, b: Value, node: ast.AST) -> Value:
    if not isinstance(a, Val) and not isinstance(b, Val):  # fold Python constants
      if type(op) not in _FOLD: raise self.error(f"the {type(op).__name__} operator is not supported", node)
      try: return _FOLD[type(op)](a, b)
      except ZeroDivisionError: raise self.error("division by zero in constants", node) from None
    if isinstance(op, ast.Pow): return self.power(a, b, node)
    if isinstance(op, ast.Div):  # true division: integers become floats first
      a, b = self.coerce(a, b)
      if a.dtype.kind != "f": a, b = self.convert(a, dtypes.default_float), self.convert(b, dtypes.default_float)
      return a / b
    a, b = self.coerce(a, b)
    if a.dtype is dtypes.bool and not isinstance(op, (ast.BitAnd, ast.BitOr, ast.BitXor)):
      a, b = self.convert(a, dtypes.int32), self.convert(b, dtypes.int32)  # True + True == 2, as in Python
    if isinstance(op, ast.FloorDiv): return ir_floordiv(a, b)[0]
    if isinstance(op, ast.Mod): return ir_floordiv(a, b)[1]
    ops = {ast.Add: Ops.ADD, ast.Sub: Ops.SUB, ast.Mult: Ops.MUL, ast.BitAnd: Ops.AND, ast.BitOr: Ops.OR, ast.BitXor: Ops.XOR,
           ast.LShift: Ops.SHL, ast.RShift: Ops.SHR}
    if type(op) not in ops: raise self.error(f"the {type(op).__name__} operator is not supported", node)
    return self.b.alu(ops[type(op)], a, b)

  def power(self, a: Value, b: Value, node: ast.AST) -> Value:
    if isinstance(b, int) and not isinstance(b, bool) and 0 <= b <= 16:
      out = self.convert(1, a.dtype)
      for _ in range(b): out = out * a
      return out
    base = self.convert(a, a.dtype if a.dtype.kind == "f" else dtypes.default_float) if isinstance(a, Val) else a
    if not isinstance(b, Val) and b == 0.5: return self.math("sqrt", base)
    if not isinstance(b, Val) and b == -1: return self.math("recip", base)
    base, e = self.coerce(base, b)
    if base.dtype.kind != "f": base, e = self.convert(base, dtypes.default_float), self.convert(e, dtypes.default_float)
    return (e * base.log2()).exp2()  # for positive bases, as the CPU's pow does for them

  def math(self, name: str, x: Value) -> Val:
    return ir_math(x if isinstance(x, Val) else self.b.const(float(x), dtypes.default_float), name)

  def call(self, e: ast.Call) -> Value:
    fn = self.resolve(e.func)
    if e.keywords: raise self.error("keyword arguments are not supported in kernels", e)
    args = e.args
    if fn in _SPECIALS:
      axis = self.expr(args[0]) if args else 0
      if not isinstance(axis, int) or axis not in (0, 1, 2): raise self.error(f"{_SPECIALS[fn]}'s axis must be 0, 1 or 2", e)
      return getattr(self.b, _SPECIALS[fn])(axis)
    if fn is barrier:
      self.b.barrier()
      return None
    if fn is shared:
      if len(args) != 2: raise self.error("shared(dtype, count)", e)
      count = self.expr(args[1])
      if not isinstance(count, int) or count <= 0: raise self.error("a shared array's size must be a positive integer constant", e)
      if self.b._open: raise self.error("declare shared arrays at the top level of the kernel, not in a block", e)
      return self.b.shared(f"sh{len(self.b.uops)}", self.dtype_of(args[0], scalar_only=True), count)
    if fn is read_texel or fn is write_texel: return self.texel(fn, e)
    if fn is vload or fn is vstore: return self.vector(fn, e)
    vals = [self.expr(a) for a in args]
    if fn in _MATH:
      if len(vals) != 1: raise self.error(f"{_MATH[fn]} takes one argument", e)
      name, x = _MATH[fn], vals[0]
      if isinstance(x, Val): return self.math(name, x)
      return builtins.abs(x) if name == "abs" else float(getattr(math, name)(x))  # constants fold in Python
    if fn is where:
      if len(vals) != 3: raise self.error("where(cond, a, b)", e)
      c = self.truth(vals[0])
      if not isinstance(c, Val): return vals[1] if c else vals[2]
      a, b = self.coerce(vals[1], vals[2])
      return c.where(a, b)
    if fn in (builtins.min, builtins.max):
      if len(vals) < 2: raise self.error(f"{fn.__name__} takes two or more values", e)
      out = vals[0]
      for v in vals[1:]:
        if not isinstance(out, Val) and not isinstance(v, Val): out = fn(out, v)
        else:
          a, b = self.coerce(out, v)
          out = a.max(b) if fn is builtins.max else a.min(b)
      return out
    cast = {builtins.int: dtypes.int32, builtins.float: dtypes.float32, builtins.bool: dtypes.bool}.get(fn) if not isinstance(fn, DType) else fn
    if cast is not None:
      if len(vals) != 1: raise self.error("a cast takes one value", e)
      x = vals[0]
      if cast is dtypes.bool: return self.truth(x)
      return self.convert(x, cast) if isinstance(x, Val) else self.convert(x if cast.kind == "f" else int(x), cast)
    raise self.error(f"cannot call {getattr(fn, '__name__', fn)!r} in a kernel (only plugrt.frontend.dsl functions, math functions and casts)", e)


  def texel(self, fn: Any, e: ast.Call) -> Value:
    """read_texel(img, x, y) -> (r, g, b, a); write_texel(img, x, y, (r, g, b, a)) or write_texel(img, x, y, r, g, b, a)."""
    name, args = "read_texel" if fn is read_texel else "write_texel", e.args
    if len(args) != (3 if fn is read_texel else 4) and not (fn is write_texel and len(args) == 7):
      raise self.error("read_texel(image, x, y)" if fn is read_texel else "write_texel(image, x, y, (r, g, b, a))", e)
    img = self.expr(args[0])
    if not isinstance(img, Ptr) or not isinstance(img.dtype, ImageDType):
      raise self.error(f"{name}'s first argument must be an image parameter (annotated dtypes.imagef((h, w))[:] or imageh)", e)
    x, y = (self.convert(self.expr(a), dtypes.int32) for a in args[1:3])
    if fn is read_texel: return img.read_texel(x, y)
    if len(args) == 7: rgba = [self.expr(a) for a in args[3:]]
    elif isinstance(args[3], ast.Tuple): rgba = [self.expr(a) for a in args[3].elts]
    else:
      got = self.expr(args[3])
      rgba = list(got) if isinstance(got, tuple) else []
    if len(rgba) != 4: raise self.error("write_texel takes the texel as 4 values (r, g, b, a)", e)
    img.write_texel(x, y, [self.convert(v, img.dtype.base) for v in rgba])
    return None


  def vector(self, fn: Any, e: ast.Call) -> Value:
    """vload(buf, i, width=4) -> (x[i], ..., x[i+width-1]); vstore(buf, i, (v0, ..., v(width-1)))."""
    args = e.args
    if fn is vload and len(args) not in (2, 3): raise self.error("vload(buffer, index) or vload(buffer, index, width): width 2 or 4", e)
    if fn is vstore and len(args) != 3: raise self.error("vstore(buffer, index, (v0, v1, ...)): 2 or 4 values", e)
    buf = self.expr(args[0])
    if not isinstance(buf, Ptr): raise self.error(f"{'vload' if fn is vload else 'vstore'}'s first argument must be a buffer parameter", e)
    idx = self.index(args[1])
    if fn is vload:
      width = self.expr(args[2]) if len(args) == 3 else 4
      if not isinstance(width, int) or isinstance(width, bool): raise self.error("vload's width must be an integer constant (2 or 4)", e)
      return buf.vload(idx, width)
    got = self.expr(args[2]) if not isinstance(args[2], ast.Tuple) else tuple(self.expr(a) for a in args[2].elts)
    if not isinstance(got, tuple): raise self.error("vstore takes its values as a tuple: vstore(buf, i, (a, b, c, d))", e)
    buf.vstore(idx, [self.convert(v, buf.dtype) for v in got])
    return None


_FOLD = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv,
         ast.Mod: operator.mod, ast.Pow: operator.pow, ast.LShift: operator.lshift, ast.RShift: operator.rshift, ast.BitAnd: operator.and_,
         ast.BitOr: operator.or_, ast.BitXor: operator.xor}


def _py_value(x: Any, dt: DType) -> Any:
  """A scalar argument as the Python type its dtype's kind takes (an int passed for a float32 is fine)."""
  return float(x) if dt.kind == "f" else bool(x) if dt.kind == "b" else int(x)


def _var_name(name: str) -> str:
  return name if name.isidentifier() else "v"


def _param_type(t: Any) -> DType | BufType | None:
  if isinstance(t, (DType, BufType)): return t
  return {int: dtypes.int32, float: dtypes.float32, bool: dtypes.bool}.get(t)  # type: ignore[call-overload]


# ---------------------------------------------------------------- the decorated function

class KernelFunction:
  """What @kernel returns: `k[groups, threads](*args)` or `k[groups, threads, device](*args)`."""

  def __init__(self, fn: Callable[..., Any]):
    self.fn = fn
    self.__name__, self.__doc__, self.__wrapped__ = fn.__name__, fn.__doc__, fn
    try: lines, self.first_line = inspect.getsourcelines(fn)
    except (OSError, TypeError) as e:
      raise KernelSyntaxError(f"@kernel {fn.__name__}: its source is not available ({e}); define kernels in a file") from None
    self.filename = inspect.getsourcefile(fn) or "<unknown>"
    src = textwrap.dedent("".join(lines))
    tree = ast.parse(src)
    node = tree.body[0]
    if not isinstance(node, ast.FunctionDef): raise KernelSyntaxError(f"@kernel {fn.__name__}: only plain functions can be kernels")
    self.first_line += node.lineno - 1 if not node.decorator_list else 0
    self.lines = src.splitlines()
    self.tree = node
    offset = node.lineno - 1 if not node.decorator_list else 0
    self.lines = self.lines[offset:]
    for n in ast.walk(node):
      if hasattr(n, "lineno"): n.lineno -= offset  # type: ignore[attr-defined]
    sig = inspect.signature(fn)
    if any(p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) or p.default is not p.empty for p in sig.parameters.values()):
      raise KernelSyntaxError(f"@kernel {fn.__name__}: parameters must be plain positional ones (no defaults, *args or **kwargs)")
    ann = inspect.get_annotations(fn, eval_str=True)
    self.param_names = [(n, _param_type(ann[n]) if n in ann else None) for n in sig.parameters]
    for n, t in self.param_names:
      if n in ann and t is None: raise KernelSyntaxError(f"@kernel {fn.__name__}: parameter {n}'s annotation {ann[n]!r} is not a dtype or dtype[:]")
    self.globals = fn.__globals__
    self.closure = {n: c.cell_contents for n, c in zip(fn.__code__.co_freevars, fn.__closure__ or ())}
    self._ir: dict[tuple, Kernel] = {}
    self._programs: dict[tuple, Any] = {}
    if all(t is not None for _, t in self.param_names): self.ir()  # fully annotated: report errors at definition

  def __repr__(self) -> str: return f"<plugrt kernel {self.__name__}>"

  def __call__(self, *args: Any) -> Any:
    raise TypeError(f"launch a kernel with {self.__name__}[groups, threads](...) (optionally [groups, threads, device])")

  def ir(self, *types: DType | BufType) -> Kernel:
    """The kernel's IR for these parameter types (the annotated ones need not be given)."""
    params = [t if t is not None else (types[i] if i < len(types) else None) for i, (_, t) in enumerate(self.param_names)]
    if any(p is None for p in params):
      missing = [n for (n, _), p in zip(self.param_names, params) if p is None]
      raise TypeError(f"@kernel {self.__name__}: the types of {', '.join(missing)} are not known until it is called")
    key = tuple(params)
    if (k := self._ir.get(key)) is None:
      vartypes: dict[str, DType] = {}
      for _ in range(len(PROMOTION_ORDER) + 2):  # types only widen, so this settles
        before = dict(vartypes)
        _Translator(self, params, vartypes, infer=True).run()  # type: ignore[arg-type]
        if vartypes == before: break
      k = self._ir[key] = _Translator(self, params, vartypes, infer=False).run()  # type: ignore[arg-type]
    return k

  def __getitem__(self, launch: Any) -> BoundKernel:
    if not isinstance(launch, tuple) or len(launch) not in (2, 3):
      raise TypeError(f"{self.__name__}[groups, threads] or [groups, threads, device], got {launch!r}")
    return BoundKernel(self, *launch)


class BoundKernel:
  """A kernel bound to its launch geometry (groups, threads) and optional device, as `k[groups, threads]` gives it:
  call it with the arguments. (plugrt.runtime.Launch is another thing: one recorded launch of a compiled program.)"""
  __slots__ = ("kf", "groups", "threads", "device")

  def __init__(self, kf: KernelFunction, groups: Any, threads: Any, device: Any = None):
    self.kf, self.groups, self.threads, self.device = kf, groups, threads, device

  def __call__(self, *args: Any, wait: bool = False) -> float | None:
    from plugrt.device import Buffer, RuntimeDevice, _device
    kf = self.kf
    if len(args) != len(kf.param_names):
      raise TypeError(f"kernel {kf.__name__} takes {len(kf.param_names)} arguments ({', '.join(n for n, _ in kf.param_names)}), got {len(args)}")
    args = tuple(a if isinstance(a, (Buffer, bool, int, float)) else _as_buffer(a) for a in args)
    dev = self.device
    if dev is None: dev = next((a.device for a in args if isinstance(a, Buffer)), None)
    dev = dev if isinstance(dev, RuntimeDevice) else _device(dev)
    types = []
    for (name, t), a in zip(kf.param_names, args):
      if isinstance(a, Buffer): found: Any = BufType(a.dtype)
      elif isinstance(a, (bool, int, float)): found = _py_dtype(a)
      else: raise TypeError(f"kernel {kf.__name__}: argument {name} must be a Buffer, a Tensor or a number, not {type(a).__name__}")
      if t is not None and isinstance(t, BufType) != isinstance(found, BufType):
        raise TypeError(f"kernel {kf.__name__}: argument {name} must be {'a buffer' if isinstance(t, BufType) else 'a number'}")
      types.append(t or found)
    key = (dev, tuple(types))
    if (prg := kf._programs.get(key)) is None:
      prg = kf._programs[key] = dev.program(kf.ir(*types))
    bufs = [a for a in args if isinstance(a, Buffer)]
    vals = tuple(_py_value(a, t) for a, t in zip(args, types) if not isinstance(t, BufType))
    return prg(*bufs, global_size=self.groups, local_size=self.threads, vals=vals, wait=wait)


def _as_buffer(arg: Any) -> Any:
  """A Tensor argument as its data's contiguous Buffer. Duck-typed (anything with contiguous_buffer()), so that the
  DSL does not import the Tensor module, which sits above it; anything else is returned for the type check to refuse."""
  contiguous_buffer = getattr(arg, "contiguous_buffer", None)
  return contiguous_buffer() if contiguous_buffer is not None else arg


def kernel(fn: Callable[..., Any]) -> KernelFunction:
  """Make a Python function a kernel (see the module docstring)."""
  return KernelFunction(fn)
