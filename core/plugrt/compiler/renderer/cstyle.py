"""The C-like renderer base: kernel IR -> C, CUDA C, OpenCL C, Metal, ...

Every value becomes a named local (`v12`); constants are written inline. A language
subclass says how it spells what differs: type names, literals, the kernel
signature, thread/group ids, shared memory, barriers, math functions, bit casts,
and how a dtype the language cannot compute with (half on a plain C compiler) is
stored and rounded.

Images (TEXEL_LOAD/TEXEL_STORE on a BUFFER of an ImageDType) are rendered through three hooks, image_param,
texel_load and texel_store, by a language that sets `supports_images` (OpenCL's image2d_t); elsewhere a kernel
with an image is a RenderError. A language without read-write images (`image_read_write` False, as OpenCL 1.2)
refuses a kernel that both reads and writes one image.

Vector access (VLOAD/VSTORE) is rendered through `vector_type`: a language that names a type of `width` elements of a
storage type (CUDA's float4, OpenCL's and Metal's vector types, clang's ext_vector_type) reads and writes them at once
through a pointer to that type (`vector_load`, `vector_store`: the IR guarantees the alignment); where it returns None
the renderer reads and writes the elements one at a time, which gives the same result.
"""
from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from typing import Any

from plugrt.compiler.ir import BINARY, COMPARE, Kernel, Ops, UOp
from plugrt.dtype import DType, ImageDType, PtrDType, dtypes
from plugrt.errors import RenderError

_INFIX = {Ops.ADD: "+", Ops.SUB: "-", Ops.MUL: "*", Ops.DIV: "/", Ops.IDIV: "/", Ops.MOD: "%", Ops.AND: "&", Ops.OR: "|",
          Ops.XOR: "^", Ops.SHL: "<<", Ops.SHR: ">>", Ops.CMPLT: "<", Ops.CMPLE: "<=", Ops.CMPEQ: "==", Ops.CMPNE: "!="}

_UNSIGNED = {dtypes.int8: dtypes.uint8, dtypes.int16: dtypes.uint16, dtypes.int32: dtypes.uint32, dtypes.int64: dtypes.uint64}


#: the IR's one-argument math ops by their C names (C's math library adds `f` for float)
MATH_NAMES = {Ops.EXP2: "exp2", Ops.LOG2: "log2", Ops.SIN: "sin", Ops.SQRT: "sqrt", Ops.TRUNC: "trunc"}


def vector_uses(kernel: Kernel) -> list[tuple[DType, int]]:
  """The (dtype, width) of every vector access of a kernel, each once, in the order of first use."""
  return list(dict.fromkeys((u.dtype, u.arg) if u.op is Ops.VLOAD else (u.src[2].dtype, len(u.src) - 2)
                            for u in kernel.uops if u.op is Ops.VLOAD or u.op is Ops.VSTORE))


class CStyleRenderer:
  """Subclass and override the spelling methods; render() does the rest."""
  language = "C"
  indent = "  "
  bool_type = "_Bool"
  #: names the generated code uses for itself; parameters with these names are renamed
  reserved: frozenset[str] = frozenset()
  #: dtypes this language cannot express at all
  unsupported: frozenset[DType] = frozenset()
  #: dtypes the language cannot compute with, held as float and stored as 16 raw bits:
  #: dtype -> (helper: bits -> float, helper: float -> bits, helper: round a float to dtype). The
  #: language's prelude defines the helpers (exact, round-to-nearest-even conversions).
  emulated: dict[DType, tuple[str, str, str]] = {}
  #: None: math functions are overloaded on the argument's type (OpenCL C), and float MAX/MIN are compares; a string:
  #: C's math library (`sinf` for float, `sin` for double, `fmaxf`/`fmax`), each name with this prefix
  c_math: str | None = None
  device_name = "?"
  #: the language has images: image_param, texel_load and texel_store are implemented
  supports_images = False
  #: one kernel may both read and write the same image (OpenCL 2.0's read_write images)
  image_read_write = False

  # ------------------------------------------------------------ spelling (override)
  def type_name(self, dt: DType) -> str:
    """The type of a value of `dt` held in a local variable."""
    if dt in self.emulated: return "float"
    return {dtypes.bool: self.bool_type, dtypes.int8: "signed char", dtypes.int16: "short", dtypes.int32: "int",
            dtypes.int64: "long long", dtypes.uint8: "unsigned char", dtypes.uint16: "unsigned short",
            dtypes.uint32: "unsigned int", dtypes.uint64: "unsigned long long", dtypes.float16: "half",
            dtypes.bfloat16: "bfloat16", dtypes.float32: "float", dtypes.float64: "double"}[dt]

  def storage_type(self, dt: DType) -> str:
    """The element type of a buffer of `dt` (16 raw bits where values are emulated)."""
    return "unsigned short" if dt in self.emulated else self.type_name(dt)

  def from_storage(self, dt: DType, expr: str) -> str:  # what a load reads -> value
    return f"{self.emulated[dt][0]}({expr})" if dt in self.emulated else expr
  def to_storage(self, dt: DType, expr: str) -> str:  # value -> what a store writes
    return f"{self.emulated[dt][1]}({expr})" if dt in self.emulated else expr
  def round_to(self, dt: DType, expr: str) -> str:  # round a computed value to dt
    return f"{self.emulated[dt][2]}({expr})" if dt in self.emulated else expr

  # NaN and infinities from their bits, where the language has no NAN/INFINITY macros: formats of a float32's and a
  # float64's bits as a signed integer (e.g. CUDA's "__int_as_float({})"); None: the macros
  float_from_bits: tuple[str, str] | None = None

  def float_literal(self, x: float, dt: DType) -> str:
    if self.float_from_bits is not None and not math.isfinite(x):
      if dt is dtypes.float64: return self.float_from_bits[1].format(struct.unpack("<q", struct.pack("<d", x))[0])
      return self.float_from_bits[0].format(struct.unpack("<i", struct.pack("<f", x))[0])
    if math.isnan(x): return "NAN" if dt is not dtypes.float64 else "(double)NAN"
    if math.isinf(x): return ("-" if x < 0 else "") + ("INFINITY" if dt is not dtypes.float64 else "(double)INFINITY")
    s = repr(float(x))
    return s if dt is dtypes.float64 else s + "f"

  def literal(self, x: Any, dt: DType) -> str:
    if dt in self.emulated: return self.float_literal(x, dtypes.float32)  # the value is exact in float
    if dt is dtypes.bool: return "1" if x else "0"
    if dt.kind == "f" and dt.itemsize > 2: return self.float_literal(x, dt)
    if dt.kind == "f": return self.cast_expr(self.float_literal(x, dtypes.float32), dtypes.float32, dt)  # half types from a float literal
    if dt is dtypes.int64: return "(-9223372036854775807LL-1)" if x == dt.min else f"{x}LL"
    if dt is dtypes.uint64: return f"{x}ULL"
    if dt is dtypes.int32: return "(-2147483647-1)" if x == dt.min else str(x)
    if dt is dtypes.uint32: return f"{x}u"
    return f"(({self.type_name(dt)}){x})"

  def special(self, kind: str, axis: int) -> str: raise NotImplementedError(f"{self.language}: thread ids")
  def barrier(self) -> str: raise NotImplementedError(f"{self.language}: barriers")
  def shared_decl(self, name: str, dt: DType, count: int) -> str: return f"{self.storage_type(dt)} {name}[{count}];"
  def spill_decl(self, name: str, dt: DType, count: str) -> str:
    raise RenderError(f"{self.language} renderer: per-thread spill arrays exist only in lowered (serial) kernels")

  def math_fn(self, op: Ops, dt: DType, x: str) -> str:
    """EXP2/LOG2/SIN/SQRT/TRUNC/RECIP of x (already a value of dt, or of float for emulated dtypes)."""
    f = "" if dt is dtypes.float64 else "f"
    if op is Ops.RECIP: return f"(1.0{f}/{x})"
    if self.c_math is None: return f"{MATH_NAMES[op]}({x})"
    return f"{self.c_math}{MATH_NAMES[op]}{f}({x})"

  def max_min(self, op: Ops, dt: DType, a: str, b: str) -> str:
    if self.c_math is not None and dt.kind == "f":
      return f"{self.c_math}f{'max' if op is Ops.MAX else 'min'}{'' if dt is dtypes.float64 else 'f'}({a}, {b})"
    return f"({a}{'>' if op is Ops.MAX else '<'}{b}?{a}:{b})"

  def cast_expr(self, x: str, src: DType, dt: DType) -> str:
    if dt is dtypes.bool: return f"({x}!=0)"
    if dt in self.emulated: return f"((float)({x}))"  # round_to then rounds it to dt
    return f"(({self.type_name(dt)})({x}))"

  def reinterpret(self, name: str, x: str, src_type: str, dst_type: str) -> list[str]:
    """Statements defining `name` (of dst_type) as the bits of x (of src_type, the same size)."""
    return [f"{dst_type} {name};", f"__builtin_memcpy(&{name}, &{x}, sizeof({name}));"]

  def bitcast_stmt(self, name: str, x: str, src: DType, dt: DType) -> list[str]:
    """Statements defining `name` as x's bits read as dt (emulated dtypes go through their raw bits)."""
    if src not in self.emulated and dt not in self.emulated: return self.reinterpret(name, x, self.type_name(src), self.type_name(dt))
    out = [f"{self.storage_type(src)} {name}_in = {self.to_storage(src, x)};"]
    out += self.reinterpret(f"{name}_bits", f"{name}_in", self.storage_type(src), self.storage_type(dt))
    return out + [f"{self.type_name(dt)} {name} = {self.from_storage(dt, f'{name}_bits')};"]

  def buffer_param(self, name: str, dt: DType, written: bool) -> str:
    return f"{'' if written else 'const '}{self.storage_type(dt)}* {name}"

  def scalar_param(self, name: str, dt: DType) -> str: return f"{self.type_name(dt)} {name}"

  # images (with supports_images): x and y are int32 expressions, the values those of the image's base dtype
  def image_param(self, name: str, img: ImageDType, written: bool) -> str:
    """The parameter declaration of an image the kernel reads (written False) or writes."""
    raise RenderError(f"the {self.language} renderer has no images")
  def texel_load(self, image: str, x: str, y: str, channel: int, img: ImageDType) -> str:
    """An expression: channel 0..3 of the texel at column x, row y (outside the image: clamped to the edge)."""
    raise RenderError(f"the {self.language} renderer has no images")
  def texel_store(self, image: str, x: str, y: str, rgba: Sequence[str], img: ImageDType) -> str:
    """A statement storing the texel (r, g, b, a) at column x, row y."""
    raise RenderError(f"the {self.language} renderer has no images")

  # vector access: `width` elements of a storage type at once (None: one at a time, see the module docstring)
  def vector_type(self, dt: DType, width: int) -> str | None:
    """The type of `width` elements of dt's storage type read or written at once, or None."""
    return None
  def vector_typedefs(self, kernel: Kernel) -> list[str]:
    """Declarations the kernel's vector types need, at the top of its body (block-scope typedefs are valid in every C family)."""
    return []
  def vector_element(self, dt: DType) -> str:
    """The element type of a vector of dt's storage (bool's storage as the byte it is: few languages have vectors of bool)."""
    return "unsigned char" if dt is dtypes.bool else self.storage_type(dt)
  def clang_vector_type(self, dt: DType, width: int) -> str: return f"__plugrt_{self.vector_element(dt).replace(' ', '_')}{width}"
  def clang_vector_typedefs(self, kernel: Kernel, aligned: bool = True) -> list[str]:
    """clang's ext_vector_type for each vector type of `kernel` (aligned False: aligned only to an element, so that a
    pointer to one makes an unaligned load or store)."""
    return [f"typedef {self.vector_element(dt)} {self.clang_vector_type(dt, w)} __attribute__((ext_vector_type({w})"
            f"{'' if aligned else f', aligned({dt.itemsize})'}));" for dt, w in vector_uses(kernel)]
  def vector_load(self, vt: str, buf: str, idx: str) -> str: return f"*((const {vt}*)({buf} + {idx}))"
  def vector_store(self, vt: str, buf: str, idx: str, value: str) -> str: return f"*(({vt}*)({buf} + {idx})) = {value};"
  def vector_lane(self, v: str, lane: int) -> str: return f"{v}.{'xyzw'[lane]}"
  def vector_init(self, vt: str, lanes: Sequence[str]) -> str: return f"{{{', '.join(lanes)}}}"  # `vt name = <this>;`

  def kernel(self, name: str, params: list[str], body: list[str], kernel: Kernel) -> str:
    """The whole source: prelude, signature and body."""
    raise NotImplementedError

  def prelude(self, kernel: Kernel) -> list[str]: return []
  def loop_prefix(self, rng: UOp) -> str: return ""  # e.g. a pragma before a RANGE's loop

  # ------------------------------------------------------------ rendering
  def check(self, kernel: Kernel) -> None:
    if imgs := kernel.images: self.check_images(kernel, imgs)
    for u in kernel.uops:
      dt = u.dtype.base if isinstance(u.dtype, PtrDType) else u.dtype
      if dt in self.unsupported:
        raise RenderError(f"{self.device_name} cannot run kernel {kernel.name}: its {self.language} renderer has no {dt.name} "
                          f"(used by {u.op.name})", f"use a dtype {self.device_name} supports, or another device")

  def check_images(self, kernel: Kernel, imgs: Sequence[UOp]) -> None:
    if not self.supports_images:
      raise RenderError(f"{self.device_name} cannot run kernel {kernel.name}: its {self.language} renderer has no images "
                        f"(parameter {imgs[0].arg[1]!r} is {imgs[0].dtype.base!r})", "run image kernels on an image device (CL)")
    if self.image_read_write: return
    read = {u.src[0] for u in kernel.uops if u.op is Ops.TEXEL_LOAD}
    for u in kernel.uops:
      if u.op is Ops.TEXEL_STORE and u.src[0] in read:
        raise RenderError(f"{self.device_name} cannot run kernel {kernel.name}: it both reads and writes image {u.src[0].arg[1]!r}, and "
                          f"its {self.language} images are read-only or write-only in a kernel",
                          "read from one image and write another (or split the kernel in two launches)")

  def param_names(self, kernel: Kernel) -> dict[UOp, str]:
    names, taken = {}, set(self.reserved)
    for u in kernel.uops:
      if u.op in (Ops.BUFFER, Ops.SCALAR, Ops.SHARED):
        n = u.arg[1] if u.op is not Ops.SHARED else u.arg[0]
        while n in taken or (n.startswith("v") and n[1:].isdigit()): n += "_"
        taken.add(n)
        names[u] = n
    return names

  def render(self, kernel: Kernel) -> str:
    self.check(kernel)
    sig = kernel.signature
    names = self.param_names(kernel)
    params = [self.image_param(names[b], b.dtype.base, w) if isinstance(b.dtype.base, ImageDType) else self.buffer_param(names[b], b.dtype.base, w)
              for b, w in zip(kernel.buffers, sig.written)] + \
             [self.scalar_param(names[s], s.dtype) for s in kernel.scalars]
    return self.kernel(kernel.name, params, self.body(kernel, names), kernel)

  def body(self, kernel: Kernel, names: dict[UOp, str]) -> list[str]:
    r: dict[UOp, str] = dict(names)
    lines: list[str] = [self.indent + t for t in self.vector_typedefs(kernel)]
    lanes: dict[UOp, list[str]] = {}  # a VLOAD's elements, in their storage type
    depth = 1
    for i, u in enumerate(kernel.uops):
      op, dt = u.op, u.dtype
      s = [r.get(x, "") for x in u.src]
      v = f"v{i}"
      pad = self.indent * depth
      if op in (Ops.BUFFER, Ops.SCALAR): continue
      if op is Ops.CONST:  # inlined where used: a negative one in parentheses, or `a - -3` would print as `a--3`
        lit = self.literal(u.arg, dt)
        r[u] = f"({lit})" if lit.startswith("-") else lit
        continue
      if op is Ops.SPECIAL:
        r[u] = self.special(*u.arg)
        continue
      if op is Ops.SHARED: lines.append(pad + self.shared_decl(r[u], dt.base, u.arg[1]))
      elif op is Ops.SPILL:
        lines.append(pad + self.spill_decl(v, dt.base, s[0]))
        r[u] = v
      elif op is Ops.LOAD: lines.append(f"{pad}{self.type_name(dt)} {v} = {self.from_storage(dt, f'{s[0]}[{s[1]}]')};")
      elif op is Ops.STORE: lines.append(f"{pad}{s[0]}[{s[1]}] = {self.to_storage(u.src[2].dtype, s[2])};")
      elif op is Ops.VLOAD:
        if (vt := self.vector_type(dt, u.arg)) is not None:
          lines.append(f"{pad}{vt} {v} = {self.vector_load(vt, s[0], s[1])};")
          lanes[u] = [self.vector_lane(v, j) for j in range(u.arg)]
        else:
          lines += [f"{pad}{self.storage_type(dt)} {v}_{j} = {s[0]}[{s[1]} + {j}];" for j in range(u.arg)]
          lanes[u] = [f"{v}_{j}" for j in range(u.arg)]
      elif op is Ops.LANE: lines.append(f"{pad}{self.type_name(dt)} {v} = {self.from_storage(dt, lanes[u.src[0]][u.arg])};")
      elif op is Ops.VSTORE:
        vdt, width = u.src[2].dtype, len(u.src) - 2
        vals = [self.to_storage(vdt, x) for x in s[2:]]
        if (vt := self.vector_type(vdt, width)) is not None:
          lines.append(f"{pad}{vt} {v} = {self.vector_init(vt, vals)};")
          lines.append(pad + self.vector_store(vt, s[0], s[1], v))
        else: lines += [f"{pad}{s[0]}[{s[1]} + {j}] = {x};" for j, x in enumerate(vals)]
      elif op is Ops.TEXEL_LOAD:
        lines.append(f"{pad}{self.type_name(dt)} {v} = {self.texel_load(s[0], s[1], s[2], u.arg, u.src[0].dtype.base)};")
      elif op is Ops.TEXEL_STORE: lines.append(pad + self.texel_store(s[0], s[1], s[2], s[3:], u.src[0].dtype.base))
      elif op is Ops.VAR: lines.append(f"{pad}{self.type_name(dt)} {v} = {s[0]};")
      elif op is Ops.READ: lines.append(f"{pad}{self.type_name(dt)} {v} = {s[0]};")
      elif op is Ops.WRITE: lines.append(f"{pad}{s[0]} = {s[1]};")
      elif op is Ops.RANGE:
        lines.append(f"{pad}{self.loop_prefix(u)}for ({self.type_name(dt)} {v} = {s[0]}; {v} < {s[1]}; {v}++) {{")
        depth += 1
      elif op is Ops.IF:
        lines.append(f"{pad}if ({s[0]}) {{")
        depth += 1
      elif op is Ops.ELSE: lines.append(f"{self.indent * (depth - 1)}}} else {{")
      elif op in (Ops.ENDRANGE, Ops.ENDIF):
        depth -= 1
        lines.append(self.indent * depth + "}")
      elif op is Ops.BARRIER: lines.append(pad + self.barrier())
      elif op is Ops.BITCAST:
        x = s[0]
        if u.src[0].op is Ops.CONST:  # reinterpreting may take the value's address, and a literal has none
          lines.append(f"{pad}{self.type_name(u.src[0].dtype)} {v}_c = {x};")
          x = f"{v}_c"
        lines += [pad + ln for ln in self.bitcast_stmt(v, x, u.src[0].dtype, dt)]
      else: lines.append(f"{pad}{self.type_name(dt)} {v} = {self.alu(u, s)};")
      if op not in (Ops.SHARED, Ops.SPILL): r[u] = v
    return lines

  def alu(self, u: UOp, s: Sequence[str]) -> str:
    op, dt = u.op, u.dtype
    sdt = u.src[0].dtype
    if op is Ops.CAST: return self.round_to(dt, self.cast_expr(s[0], sdt, dt))
    if op is Ops.WHERE: return f"({s[0]}?{s[1]}:{s[2]})"
    if op is Ops.NEG: return self.round_to(dt, f"(-{s[0]})")
    if op is Ops.NOT: return f"(!{s[0]})" if dt is dtypes.bool else f"(({self.type_name(dt)})~{s[0]})"
    if op in (Ops.MAX, Ops.MIN): return self.max_min(op, dt, s[0], s[1])
    if op is Ops.SHL and dt.kind == "i":  # shift the bits unsigned: a signed overflow must wrap, not be undefined
      return f"(({self.type_name(dt)})(({self.type_name(_UNSIGNED[dt])}){s[0]}<<{s[1]}))"
    if op in BINARY:
      e = f"({s[0]}{_INFIX[op]}{s[1]})"
      if op in COMPARE: return e
      if dt.kind in "iu" and dt.itemsize < 4: e = f"(({self.type_name(dt)}){e})"  # C promotes small ints to int
      return self.round_to(dt, e)
    return self.round_to(dt, self.math_fn(op, dt, s[0]))
