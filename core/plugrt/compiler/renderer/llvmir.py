"""The LLVM IR renderer base: kernel IR -> LLVM IR text (opaque pointers), for LLVM-based backends.

Each IR value becomes one SSA value (`%v12`); constants are written inline. Control
flow maps onto basic blocks: RANGE is a loop with a phi index (`r12.head`,
`r12.body`, `r12.latch`, `r12.exit`), IF a conditional branch (`i12.then`,
`i12.else`, `i12.end`). A VAR is an alloca in the entry block (mem2reg/SROA turn it
back into SSA). No fast-math flags are ever set, so every float op is rounded as IEEE
says, and nothing is contracted into an FMA.

A backend subclass says what is device specific: the function and how it gets its
parameters (`function`), thread and group ids (`special`), barriers, shared memory
(`shared`) and address spaces. A target without native 16-bit float arithmetic lists
float16/bfloat16 in `emulated`: their values are then held as `float`, stored as
`i16`, and rounded after every operation by exact integer-only helper functions
emitted into the module (no compiler runtime is needed).

Vector access: a VLOAD is one `load <W x T>` (its LANE ops `extractelement`s), a VSTORE one `store <W x T>` of the
values put together with `insertelement`, aligned to the vector's size (`vector_align`: the IR guarantees it) or, on a
target that sets it False, to one element, so that an unaligned access still reads and writes the right elements.
"""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field

from plugrt.compiler.ir import COMPARE, FLOAT_UNARY, Kernel, Ops, UOp
from plugrt.dtype import DType, PtrDType, cast_value, dtypes
from plugrt.errors import RenderError

_INT = {1: "i8", 2: "i16", 4: "i32", 8: "i64"}
_FLOAT = {dtypes.float16: "half", dtypes.bfloat16: "bfloat", dtypes.float32: "float", dtypes.float64: "double"}
_ICMP = {Ops.CMPLT: ("slt", "ult"), Ops.CMPLE: ("sle", "ule"), Ops.CMPEQ: ("eq", "eq"), Ops.CMPNE: ("ne", "ne")}
# CMPNE is unordered: NaN != x is true, as in numpy and C
_FCMP = {Ops.CMPLT: "olt", Ops.CMPLE: "ole", Ops.CMPEQ: "oeq", Ops.CMPNE: "une"}
_MATH = {Ops.EXP2: "exp2", Ops.LOG2: "log2", Ops.SIN: "sin", Ops.SQRT: "sqrt", Ops.TRUNC: "trunc"}
_ROUNDED = frozenset({Ops.ADD, Ops.SUB, Ops.MUL, Ops.DIV}) | FLOAT_UNARY  # ops whose float result needs rounding to dt


@dataclass
class IRFunction:
  """One function under construction: its instructions, entry-block allocas, and the module-level
  declarations and helpers it needs. render() makes a new one per kernel, so a renderer is stateless."""
  lines: list[str] = field(default_factory=list)
  allocas: list[str] = field(default_factory=list)
  decls: dict[str, str] = field(default_factory=dict)   # intrinsic name -> declaration
  globals: list[str] = field(default_factory=list)      # module-level definitions (shared arrays on GPUs)
  helpers: set[str] = field(default_factory=set)        # names of helper functions to emit
  metadata: list[str] = field(default_factory=list)     # module-level metadata nodes
  block: str = "entry"                                  # the label of the block being written
  ntmp: int = 0

  def plain_loop(self) -> str:
    """`, !llvm.loop !N` for a latch branch: a loop the optimiser should neither unroll nor vectorise."""
    n = 1000 + len(self.metadata)
    if not self.metadata: self.metadata += ['!990 = !{!"llvm.loop.unroll.disable"}', '!991 = !{!"llvm.loop.vectorize.enable", i1 false}']
    self.metadata.append(f"!{n} = distinct !{{!{n}, !990, !991}}")
    return f", !llvm.loop !{n}"

  def tmp(self, hint: str = "t") -> str:
    self.ntmp += 1
    return f"%{hint}{self.ntmp}"

  def op(self, rhs: str, name: str | None = None) -> str:
    """Emit `name = rhs` (a fresh name when none is given); returns the name."""
    name = name or self.tmp()
    self.lines.append(f"  {name} = {rhs}")
    return name

  def emit(self, line: str) -> None: self.lines.append(f"  {line}")

  def label(self, name: str) -> None:
    self.lines.append(f"{name}:")
    self.block = name

  def branch(self, target: str) -> None:
    """End the current block with a jump and start block `target`."""
    self.emit(f"br label %{target}")
    self.label(target)

  def declare(self, name: str, decl: str) -> str:
    self.decls.setdefault(name, decl)
    return f"@{name}"


class LLVMRenderer:
  """Subclass, fill in `function` and `special` (and barrier/shared for GPUs); render() does the rest."""
  language = "LLVM IR"
  device_name = "?"
  #: dtypes this target cannot run at all
  unsupported: frozenset[DType] = frozenset()
  #: 16-bit float dtypes held as float and rounded after every op (targets without native half math)
  emulated: frozenset[DType] = frozenset()
  #: LLVM address space of each memory kind of the IR; allocas (VAR, private arrays) use "private"
  addrspace: dict[str, int] = {"global": 0, "shared": 0, "private": 0}
  #: attributes of every function the module defines (helpers included)
  fn_attrs = "nounwind"
  #: vector loads and stores claim the alignment the IR guarantees (width * itemsize); False: one element's only
  vector_align = True

  # ------------------------------------------------------------ types and literals
  def value_type(self, dt: DType) -> str:
    """The LLVM type of a value of `dt` held in a register."""
    if dt is dtypes.bool: return "i1"
    if dt in self.emulated: return "float"
    return _FLOAT[dt] if dt.kind == "f" else _INT[dt.itemsize]

  def storage_type(self, dt: DType) -> str:
    """The LLVM type of one element of `dt` in memory (bool is a byte, emulated floats their raw bits)."""
    if dt is dtypes.bool: return "i8"
    return "i16" if dt in self.emulated else self.value_type(dt)

  def ptr_type(self, space: str) -> str:
    n = self.addrspace[space]
    return f"ptr addrspace({n})" if n else "ptr"

  def literal(self, x: bool | int | float, dt: DType) -> str:
    """A constant of `dt`, written as an operand of value_type(dt)."""
    if dt is dtypes.bool: return "true" if x else "false"
    if dt.kind in "iu":
      v = int(x) & ((1 << dt.bits) - 1)
      return str(v - (1 << dt.bits) if v >> (dt.bits - 1) else v)  # two's complement: LLVM reads ints as signed
    x = float(x)
    if dt is dtypes.float64 or not math.isfinite(x): v = x
    else: v = cast_value(x, dt)  # the exact value of dt nearest x (builders round constants already)
    ty = self.value_type(dt)
    if ty == "half": return f"0xH{struct.unpack('<H', struct.pack('<e', v))[0]:04X}"
    if ty == "bfloat": return f"0xR{struct.unpack('<I', struct.pack('<f', v))[0] >> 16:04X}"
    if math.isnan(v): return "0x7FF8000000000000"  # a quiet NaN, exact in every float type
    return f"0x{struct.unpack('<Q', struct.pack('<d', v))[0]:016X}"  # float constants are written as the exact double

  # ------------------------------------------------------------ device specific (override)
  def plain_loop(self, rng: UOp) -> bool:
    """Whether a RANGE is a plain counting loop, not worth unrolling or vectorising (a backend's choice)."""
    return False

  def prepare(self, kernel: Kernel) -> Kernel:
    """Rewrite the kernel before rendering (serial targets lower groups here)."""
    return kernel

  def function(self, f: IRFunction, kernel: Kernel) -> str:
    """The `define` of the kernel: signature, parameter set-up, then self.emit_body(f, kernel, params)."""
    raise NotImplementedError(f"{type(self).__name__}: the kernel function")

  def special(self, f: IRFunction, kind: str, axis: int) -> str:
    """An i32 value for group_id/local_id/num_groups/local_size on axis 0..2 (may emit instructions into f)."""
    raise NotImplementedError(f"{type(self).__name__}: thread and group ids")

  def barrier(self, f: IRFunction) -> None: raise NotImplementedError(f"{type(self).__name__}: barriers")

  def shared(self, f: IRFunction, name: str, dt: DType, count: int) -> str:
    """A pointer to a group's array of `count` elements; default: an entry-block alloca (serial targets)."""
    return self.alloca(f, f"%{name}", f"[{count} x {self.storage_type(dt)}]", align=max(16, dt.itemsize))

  def spill(self, f: IRFunction, dt: DType, count: str, count_dt: DType) -> str:
    """A per-group scratch array of a runtime element count (lowered kernels only): a dynamic alloca here,
    so a serial target must restore the stack once per group (llvm.stackrestore)."""
    n = self.to_i64(f, count, count_dt)
    return f.op(f"alloca {self.storage_type(dt)}, i64 {n}{self._alloca_space()}, align {max(16, dt.itemsize)}")

  def math(self, f: IRFunction, op: Ops, ty: str, x: str) -> str:
    """EXP2/LOG2/SIN/SQRT/TRUNC of x of LLVM float type `ty`: the llvm.* intrinsic."""
    sfx = {"half": "f16", "bfloat": "bf16", "float": "f32", "double": "f64"}[ty]
    fn = f.declare(f"llvm.{_MATH[op]}.{sfx}", f"declare {ty} @llvm.{_MATH[op]}.{sfx}({ty})")
    return f.op(f"call {ty} {fn}({ty} {x})")

  # ------------------------------------------------------------ emulated 16-bit floats
  def from_storage(self, f: IRFunction, dt: DType, raw: str) -> str:
    """A loaded element (storage_type) -> a value (value_type)."""
    if dt is dtypes.bool: return f.op(f"icmp ne i8 {raw}, 0")
    if dt in self.emulated: return self._helper_call(f, "h2f" if dt is dtypes.float16 else "bf2f", "float", "i16", raw)
    return raw

  def to_storage(self, f: IRFunction, dt: DType, val: str) -> str:
    """A value -> what a store writes."""
    if dt is dtypes.bool: return f.op(f"zext i1 {val} to i8")
    if dt in self.emulated: return self._helper_call(f, "f2h" if dt is dtypes.float16 else "f2bf", "i16", "float", val)
    return val

  def round_to(self, f: IRFunction, dt: DType, val: str) -> str:
    """Round a float computed for an emulated dtype to that dtype (identity for native dtypes)."""
    if dt not in self.emulated: return val
    return self._helper_call(f, "rh" if dt is dtypes.float16 else "rbf", "float", "float", val)

  def _helper_call(self, f: IRFunction, name: str, ret: str, arg: str, x: str) -> str:
    f.helpers.add(name)
    return f.op(f"call {ret} @__plugrt_{name}({arg} {x})")

  # ------------------------------------------------------------ rendering
  def check(self, kernel: Kernel) -> None:
    for u in kernel.uops:
      dt = u.dtype.base if isinstance(u.dtype, PtrDType) else u.dtype
      if dt in self.unsupported:
        raise RenderError(f"{self.device_name} cannot run kernel {kernel.name}: its LLVM renderer has no {dt.name} (used by {u.op.name})",
                          f"use a dtype {self.device_name} supports, or another device")

  def render(self, kernel: Kernel) -> str:
    kernel = self.prepare(kernel)
    self.check(kernel)
    f = IRFunction()
    text = self.function(f, kernel)
    parts = [f"; generated by plugrt: {self.device_name} kernel {kernel.name}", *f.globals, text]
    helpers = _helper_closure(f.helpers)
    parts += [_HELPERS[h].replace("#ATTRS", self.fn_attrs) for h in helpers]
    decls = dict(f.decls)
    for h in helpers: decls.update(_HELPER_DECLS.get(h, {}))
    parts += [decls[k] for k in sorted(decls)] + f.metadata
    return "\n".join(parts) + "\n"

  def alloca(self, f: IRFunction, name: str, ty: str, align: int | None = None) -> str:
    f.allocas.append(f"  {name} = alloca {ty}{self._alloca_space()}{'' if align is None else f', align {align}'}")
    return name

  def _alloca_space(self) -> str:
    n = self.addrspace["private"]
    return f", addrspace({n})" if n else ""

  def define(self, f: IRFunction, header: str) -> str:
    """The function text: `header {`, the entry allocas, then f's lines (which start in the entry block)."""
    return "\n".join([f"{header} {{", "entry:", *f.allocas, *f.lines, "}"])

  def to_i64(self, f: IRFunction, x: str, dt: DType) -> str:
    if dt.bits == 64: return x
    return f.op(f"{'zext' if dt.kind == 'u' else 'sext'} {self.value_type(dt)} {x} to i64")

  def emit_body(self, f: IRFunction, kernel: Kernel, params: dict[UOp, str]) -> None:
    """Append the kernel's ops to f. `params` maps each BUFFER and SCALAR op to its value."""
    r: dict[UOp, str] = dict(params)
    has_else = {u.src[0] for u in kernel.uops if u.op is Ops.ELSE}
    pos = {u: i for i, u in enumerate(kernel.uops)}
    for i, u in enumerate(kernel.uops):
      op, dt = u.op, u.dtype
      s = [r.get(x, "") for x in u.src]
      v = f"%v{i}"
      if op in (Ops.BUFFER, Ops.SCALAR): continue
      if op is Ops.CONST: r[u] = self.literal(u.arg, dt)
      elif op is Ops.SPECIAL: r[u] = self.special(f, *u.arg)
      elif op is Ops.SHARED: r[u] = self.shared(f, f"sh{i}.{u.arg[0]}", dt.base, u.arg[1])
      elif op is Ops.SPILL: r[u] = self.spill(f, dt.base, s[0], u.src[0].dtype)
      elif op is Ops.LOAD:
        st, p = self.storage_type(dt), self._gep(f, u.src[0], s[0], u.src[1], s[1])
        raw = f.op(f"load {st}, {self.ptr_type(u.src[0].dtype.addrspace)} {p}, align {dt.itemsize}", v if st == self.value_type(dt) else None)
        r[u] = self.from_storage(f, dt, raw)
      elif op is Ops.STORE:
        vdt = u.src[2].dtype
        raw = self.to_storage(f, vdt, s[2])
        p = self._gep(f, u.src[0], s[0], u.src[1], s[1])
        f.emit(f"store {self.storage_type(vdt)} {raw}, {self.ptr_type(u.src[0].dtype.addrspace)} {p}, align {vdt.itemsize}")
      elif op is Ops.VLOAD:
        vty, align = self._vector(dt, u.arg)
        p = self._gep(f, u.src[0], s[0], u.src[1], s[1])
        r[u] = f.op(f"load {vty}, {self.ptr_type(u.src[0].dtype.addrspace)} {p}, align {align}", v)
      elif op is Ops.LANE:
        vty, _ = self._vector(dt, u.src[0].arg)
        raw = f.op(f"extractelement {vty} {s[0]}, i32 {u.arg}", v if self.storage_type(dt) == self.value_type(dt) else None)
        r[u] = self.from_storage(f, dt, raw)
      elif op is Ops.VSTORE:
        vdt, width = u.src[2].dtype, len(u.src) - 2
        vty, align = self._vector(vdt, width)
        acc = "poison"
        for j, x in enumerate(s[2:]): acc = f.op(f"insertelement {vty} {acc}, {self.storage_type(vdt)} {self.to_storage(f, vdt, x)}, i32 {j}")
        p = self._gep(f, u.src[0], s[0], u.src[1], s[1])
        f.emit(f"store {vty} {acc}, {self.ptr_type(u.src[0].dtype.addrspace)} {p}, align {align}")
      elif op is Ops.VAR:
        r[u] = self.alloca(f, v, self.value_type(dt))
        f.emit(f"store {self.value_type(dt)} {s[0]}, {self.ptr_type('private')} {v}")
      elif op is Ops.READ: r[u] = f.op(f"load {self.value_type(dt)}, {self.ptr_type('private')} {s[0]}", v)
      elif op is Ops.WRITE: f.emit(f"store {self.value_type(u.src[1].dtype)} {s[1]}, {self.ptr_type('private')} {s[0]}")
      elif op is Ops.RANGE:
        ty, pre = self.value_type(dt), f.block
        f.branch(f"r{i}.head")
        f.op(f"phi {ty} [ {s[0]}, %{pre} ], [ {v}.next, %r{i}.latch ]", v)
        cond = f.op(f"icmp {'ult' if dt.kind == 'u' else 'slt'} {ty} {v}, {s[1]}")
        f.emit(f"br i1 {cond}, label %r{i}.body, label %r{i}.exit")
        f.label(f"r{i}.body")
        r[u] = v
      elif op is Ops.ENDRANGE:
        j, rng = pos[u.src[0]], u.src[0]
        f.branch(f"r{j}.latch")
        # idx < end <= max, so idx+1 cannot overflow: the flag helps the loop optimizers
        f.op(f"add {'nuw' if rng.dtype.kind == 'u' else 'nsw'} {self.value_type(rng.dtype)} %v{j}, 1", f"%v{j}.next")
        f.emit(f"br label %r{j}.head{f.plain_loop() if self.plain_loop(rng) else ''}")
        f.label(f"r{j}.exit")
      elif op is Ops.IF:
        f.emit(f"br i1 {s[0]}, label %i{i}.then, label %i{i}.{'else' if u in has_else else 'end'}")
        f.label(f"i{i}.then")
      elif op is Ops.ELSE:
        j = pos[u.src[0]]
        f.emit(f"br label %i{j}.end")
        f.label(f"i{j}.else")
      elif op is Ops.ENDIF: f.branch(f"i{pos[u.src[0]]}.end")
      elif op is Ops.BARRIER: self.barrier(f)
      elif op is Ops.CAST: r[u] = self.cast(f, s[0], u.src[0].dtype, dt, v)
      elif op is Ops.BITCAST: r[u] = self.bitcast(f, s[0], u.src[0].dtype, dt, v)
      else: r[u] = self.alu(f, u, s, v)

  def _vector(self, dt: DType, width: int) -> tuple[str, int]:
    """The LLVM type of `width` elements of dt in memory, and the alignment a vector access of them claims."""
    return f"<{width} x {self.storage_type(dt)}>", width * dt.itemsize if self.vector_align else dt.itemsize

  def _gep(self, f: IRFunction, ptr: UOp, p: str, idx: UOp, x: str) -> str:
    st, pty = self.storage_type(ptr.dtype.base), self.ptr_type(ptr.dtype.addrspace)
    dt = idx.dtype
    if idx.op is Ops.CONST: ity, x = "i64", str(idx.arg)
    elif dt.kind == "u" and dt.bits < 64: ity, x = "i64", f.op(f"zext {self.value_type(dt)} {x} to i64")
    else: ity = self.value_type(dt)  # GEP sign-extends a narrower index itself
    return f.op(f"getelementptr inbounds {st}, {pty} {p}, {ity} {x}")

  # ------------------------------------------------------------ ALU
  def alu(self, f: IRFunction, u: UOp, s: list[str], v: str) -> str:
    op, dt = u.op, u.dtype
    sdt = u.src[0].dtype
    ty = self.value_type(sdt)
    isf = sdt.kind == "f"
    if op is Ops.WHERE: return f.op(f"select i1 {s[0]}, {self.value_type(dt)} {s[1]}, {self.value_type(dt)} {s[2]}", v)
    if op in COMPARE:
      pred = _FCMP[op] if isf else _ICMP[op][sdt.kind != "i"]  # bool compares as unsigned: False < True
      return f.op(f"{'fcmp' if isf else 'icmp'} {pred} {ty} {s[0]}, {s[1]}", v)
    if op is Ops.NEG: return f.op(f"fneg {ty} {s[0]}" if isf else f"sub {ty} 0, {s[0]}", v)  # fneg is exact: no rounding
    if op is Ops.NOT: return f.op(f"xor {ty} {s[0]}, {'true' if dt is dtypes.bool else '-1'}", v)
    if op in (Ops.MAX, Ops.MIN):
      name = ("maxnum" if op is Ops.MAX else "minnum") if isf else ("s" if sdt.kind == "i" else "u") + ("max" if op is Ops.MAX else "min")
      sfx = {"half": "f16", "bfloat": "bf16", "float": "f32", "double": "f64"}.get(ty, ty)
      fn = f.declare(f"llvm.{name}.{sfx}", f"declare {ty} @llvm.{name}.{sfx}({ty}, {ty})")
      return f.op(f"call {ty} {fn}({ty} {s[0]}, {ty} {s[1]})", v)  # a max/min of rounded values is rounded
    if op in (Ops.IDIV, Ops.MOD): return self.divmod(f, u, s, ty, v)
    if op in (Ops.SHL, Ops.SHR):
      # the IR leaves shifts by >= width undefined, LLVM makes them poison: mask as the interpreter does
      amt = str(u.src[1].arg & (sdt.bits - 1)) if u.src[1].op is Ops.CONST else f.op(f"and {ty} {s[1]}, {sdt.bits - 1}")
      inst = "shl" if op is Ops.SHL else "ashr" if sdt.kind == "i" else "lshr"
      return f.op(f"{inst} {ty} {s[0]}, {amt}", v)
    if op in FLOAT_UNARY:
      x = f.op(f"fdiv {ty} {self.literal(1.0, sdt)}, {s[0]}") if op is Ops.RECIP else self.math(f, op, ty, s[0])
      return self._rounded(f, dt, x, v)
    inst = {Ops.ADD: "add", Ops.SUB: "sub", Ops.MUL: "mul", Ops.DIV: "div", Ops.AND: "and", Ops.OR: "or", Ops.XOR: "xor"}[op]
    if isf: return self._rounded(f, dt, f.op(f"f{inst} {ty} {s[0]}, {s[1]}", None if dt in self.emulated else v), v)
    return f.op(f"{inst} {ty} {s[0]}, {s[1]}", v)  # no nsw/nuw: integers wrap

  def _rounded(self, f: IRFunction, dt: DType, x: str, v: str) -> str:
    return x if dt not in self.emulated else self.round_to(f, dt, x)

  def divmod(self, f: IRFunction, u: UOp, s: list[str], ty: str, v: str) -> str:
    """IDIV truncates, MOD has the dividend's sign (sdiv/srem). MIN / -1 overflows, which LLVM leaves
    undefined (x86 traps): the IR wraps, so a divisor of -1 becomes a negation (quotient) or 0 (remainder).
    A zero divisor (unspecified in the IR) gives the interpreter's values, x and 0, instead of a trap."""
    dt, isdiv = u.dtype, u.op is Ops.IDIV
    b = u.src[1]
    if b.op is Ops.CONST and b.arg == 0: return s[0] if isdiv else "0"  # unspecified; never a trap
    if dt.kind == "u":
      d = s[1] if b.op is Ops.CONST else f.op(f"select i1 {f.op(f'icmp eq {ty} {s[1]}, 0')}, {ty} 1, {ty} {s[1]}")
      return f.op(f"{'udiv' if isdiv else 'urem'} {ty} {s[0]}, {d}", v)
    if b.op is Ops.CONST:
      if b.arg == -1: return f.op(f"sub {ty} 0, {s[0]}", v) if isdiv else "0"
      return f.op(f"{'sdiv' if isdiv else 'srem'} {ty} {s[0]}, {s[1]}", v)
    m1 = f.op(f"icmp eq {ty} {s[1]}, -1")
    # x86 traps on a zero divisor too: divide by 1 instead (quotient x, remainder 0, as the interpreter gives)
    d = f.op(f"select i1 {f.op(f'or i1 {m1}, ' + f.op(f'icmp eq {ty} {s[1]}, 0'))}, {ty} 1, {ty} {s[1]}")
    if not isdiv: return f.op(f"srem {ty} {s[0]}, {d}", v)  # x % 1 == 0 == x % -1
    q = f.op(f"sdiv {ty} {s[0]}, {d}")
    neg = f.op(f"sub {ty} 0, {s[0]}")
    return f.op(f"select i1 {m1}, {ty} {neg}, {ty} {q}", v)

  # ------------------------------------------------------------ conversions
  def cast(self, f: IRFunction, x: str, src: DType, dt: DType, v: str) -> str:
    if src is dt: return x
    sty, ty = self.value_type(src), self.value_type(dt)
    if dt is dtypes.bool:
      return f.op(f"fcmp une {sty} {x}, 0.0" if src.kind == "f" else f"icmp ne {sty} {x}, 0", v)
    if dt.kind in "iu":
      if src is dtypes.bool: return f.op(f"zext i1 {x} to {ty}", v)
      if src.kind == "f": return f.op(f"{'fptoui' if dt.kind == 'u' else 'fptosi'} {sty} {x} to {ty}", v)  # out of range: undefined
      if src.bits == dt.bits: return x  # int32 <-> uint32: the same bits
      if src.bits > dt.bits: return f.op(f"trunc {sty} {x} to {ty}", v)
      return f.op(f"{'sext' if src.kind == 'i' else 'zext'} {sty} {x} to {ty}", v)
    # to a float
    if src is dtypes.bool or src.kind in "iu":
      conv = "uitofp" if src is dtypes.bool or src.kind == "u" else "sitofp"
      if dt is dtypes.bfloat16 and dt not in self.emulated:  # through float32 (two roundings), as the interpreter
        return f.op(f"fptrunc float {f.op(f'{conv} {sty} {x} to float')} to bfloat", v)
      return self._rounded(f, dt, f.op(f"{conv} {sty} {x} to {ty}", None if dt in self.emulated else v), v)
    if dt in self.emulated:
      if dt is dtypes.float16 and src is dtypes.float64:  # one rounding, double -> half (float first would round twice)
        return self.from_storage(f, dt, self._helper_call(f, "d2h", "i16", "double", x))
      if src is dtypes.float64: x = f.op(f"fptrunc double {x} to float")  # bfloat16 from double goes through float, as the interpreter does
      return self.round_to(f, dt, x)
    if sty == ty: return x  # from an emulated dtype (a float value) to float32
    if dt is dtypes.bfloat16 and src is dtypes.float64: x, sty = f.op(f"fptrunc double {x} to float"), "float"  # as the interpreter
    if {dt, src} == {dtypes.float16, dtypes.bfloat16}:
      x, sty = f.op(f"fpext {sty} {x} to float"), "float"  # bf16 <-> half: exact to float, then one rounding
    widen = _fbits(sty) < _fbits(ty)
    return f.op(f"{'fpext' if widen else 'fptrunc'} {sty} {x} to {ty}", v)

  def bitcast(self, f: IRFunction, x: str, src: DType, dt: DType, v: str) -> str:
    sty, ty = self.value_type(src), self.value_type(dt)
    if src in self.emulated or dt in self.emulated:  # through the raw 16 bits
      raw = self.to_storage(f, src, x) if src in self.emulated else x
      return self.from_storage(f, dt, raw) if dt in self.emulated else raw
    if sty == ty: return x
    if src is dtypes.bool: return f.op(f"zext i1 {x} to {ty}", v)
    if dt is dtypes.bool: return f.op(f"icmp ne {sty} {x}, 0", v)
    return f.op(f"bitcast {sty} {x} to {ty}", v)


def _fbits(ty: str) -> int: return {"half": 16, "bfloat": 16, "float": 32, "double": 64}[ty]


# ---------------------------------------------------------------- exact 16-bit float conversions
# Integer-only and branch-free (so loops over half data still vectorize), round-to-nearest-even,
# NaN stays a quiet NaN: the same results bit for bit as the C renderer's helpers.

def _h(x: int) -> str: return str(x)  # LLVM reads decimal integer literals


_HELPERS = {
  "h2f": f"""define internal float @__plugrt_h2f(i16 %h) #ATTRS {{
  %x = zext i16 %h to i32
  %s0 = and i32 %x, 32768
  %s = shl i32 %s0, 16
  %e0 = lshr i32 %x, 10
  %e = and i32 %e0, 31
  %m = and i32 %x, 1023
  %m13 = shl i32 %m, 13
  %sm = or i32 %s, %m13
  %inf = or i32 %sm, {_h(0x7f800000)}
  %eb = add i32 %e, 112
  %ef = shl i32 %eb, 23
  %norm = or i32 %sm, %ef
  %lz = call i32 @llvm.ctlz.i32(i32 %m, i1 false)
  %sh = sub i32 %lz, 21
  %mn0 = shl i32 %m, %sh
  %mn = and i32 %mn0, 1023
  %mn13 = shl i32 %mn, 13
  %es = sub i32 113, %sh
  %esf = shl i32 %es, 23
  %sub0 = or i32 %s, %esf
  %sub = or i32 %sub0, %mn13
  %mz = icmp eq i32 %m, 0
  %small = select i1 %mz, i32 %s, i32 %sub
  %ez = icmp eq i32 %e, 0
  %fin = select i1 %ez, i32 %small, i32 %norm
  %emax = icmp eq i32 %e, 31
  %u = select i1 %emax, i32 %inf, i32 %fin
  %f = bitcast i32 %u to float
  ret float %f
}}""",
  "f2h": f"""define internal i16 @__plugrt_f2h(float %f) #ATTRS {{
  %u = bitcast float %f to i32
  %s0 = lshr i32 %u, 16
  %s = and i32 %s0, 32768
  %a = and i32 %u, {_h(0x7fffffff)}
  %nm0 = lshr i32 %a, 13
  %nm = and i32 %nm0, 1023
  %nan0 = or i32 %s, {_h(0x7e00)}
  %nan = or i32 %nan0, %nm
  %inf = or i32 %s, {_h(0x7c00)}
  %r0 = sub i32 %a, {_h(0x38000000)}
  %rl0 = lshr i32 %r0, 13
  %rl = and i32 %rl0, 1
  %r1 = add i32 %r0, 4095
  %r2 = add i32 %r1, %rl
  %r3 = lshr i32 %r2, 13
  %norm = or i32 %s, %r3
  %e = lshr i32 %a, 23
  %sh0 = sub i32 126, %e
  %insub = icmp ult i32 %a, {_h(0x38800000)}
  %sh1 = select i1 %insub, i32 %sh0, i32 14
  %sh = call i32 @llvm.umin.i32(i32 %sh1, i32 31)
  %mm = and i32 %a, {_h(0x7fffff)}
  %m = or i32 %mm, {_h(0x800000)}
  %q = lshr i32 %m, %sh
  %one = shl i32 1, %sh
  %mask = sub i32 %one, 1
  %rem = and i32 %m, %mask
  %sh2 = sub i32 %sh, 1
  %half = shl i32 1, %sh2
  %gt = icmp ugt i32 %rem, %half
  %eq = icmp eq i32 %rem, %half
  %q1 = and i32 %q, 1
  %odd = icmp ne i32 %q1, 0
  %tie = and i1 %eq, %odd
  %up = or i1 %gt, %tie
  %upi = zext i1 %up to i32
  %qr = add i32 %q, %upi
  %sub = or i32 %s, %qr
  %fin = select i1 %insub, i32 %sub, i32 %norm
  %big = icmp uge i32 %a, {_h(0x477ff000)}
  %ovf = select i1 %big, i32 %inf, i32 %fin
  %isnan = icmp ugt i32 %a, {_h(0x7f800000)}
  %res = select i1 %isnan, i32 %nan, i32 %ovf
  %h = trunc i32 %res to i16
  ret i16 %h
}}""",
  # double -> half in one rounding (values below 2^-14 become subnormals, from 65520 up infinity)
  "d2h": f"""define internal i16 @__plugrt_d2h(double %d) #ATTRS {{
  %u = bitcast double %d to i64
  %s0 = lshr i64 %u, 48
  %s1 = and i64 %s0, 32768
  %s = trunc i64 %s1 to i32
  %a = and i64 %u, {_h(0x7fffffffffffffff)}
  %nm0 = lshr i64 %a, 42
  %nm1 = and i64 %nm0, 1023
  %nm = trunc i64 %nm1 to i32
  %nan0 = or i32 %s, {_h(0x7e00)}
  %nan = or i32 %nan0, %nm
  %inf = or i32 %s, {_h(0x7c00)}
  %r0 = sub i64 %a, {_h(0x3f00000000000000)}
  %rl0 = lshr i64 %r0, 42
  %rl = and i64 %rl0, 1
  %r1 = add i64 %r0, {_h((1 << 41) - 1)}
  %r2 = add i64 %r1, %rl
  %r3 = lshr i64 %r2, 42
  %r4 = trunc i64 %r3 to i32
  %norm = or i32 %s, %r4
  %e = lshr i64 %a, 52
  %sh0 = sub i64 1051, %e
  %insub = icmp ult i64 %a, {_h(0x3f10000000000000)}
  %sh1 = select i1 %insub, i64 %sh0, i64 43
  %sh = call i64 @llvm.umin.i64(i64 %sh1, i64 63)
  %mm = and i64 %a, {_h((1 << 52) - 1)}
  %m = or i64 %mm, {_h(1 << 52)}
  %q = lshr i64 %m, %sh
  %one = shl i64 1, %sh
  %mask = sub i64 %one, 1
  %rem = and i64 %m, %mask
  %sh2 = sub i64 %sh, 1
  %half = shl i64 1, %sh2
  %gt = icmp ugt i64 %rem, %half
  %eq = icmp eq i64 %rem, %half
  %q1 = and i64 %q, 1
  %odd = icmp ne i64 %q1, 0
  %tie = and i1 %eq, %odd
  %up = or i1 %gt, %tie
  %upi = zext i1 %up to i64
  %qr0 = add i64 %q, %upi
  %qr = trunc i64 %qr0 to i32
  %sub = or i32 %s, %qr
  %fin = select i1 %insub, i32 %sub, i32 %norm
  %big = icmp uge i64 %a, {_h(0x40effe0000000000)}
  %ovf = select i1 %big, i32 %inf, i32 %fin
  %isnan = icmp ugt i64 %a, {_h(0x7ff0000000000000)}
  %res = select i1 %isnan, i32 %nan, i32 %ovf
  %h = trunc i32 %res to i16
  ret i16 %h
}}""",
  "rh": """define internal float @__plugrt_rh(float %x) #ATTRS {
  %h = call i16 @__plugrt_f2h(float %x)
  %f = call float @__plugrt_h2f(i16 %h)
  ret float %f
}""",
  "bf2f": """define internal float @__plugrt_bf2f(i16 %b) #ATTRS {
  %x = zext i16 %b to i32
  %u = shl i32 %x, 16
  %f = bitcast i32 %u to float
  ret float %f
}""",
  "f2bf": f"""define internal i16 @__plugrt_f2bf(float %f) #ATTRS {{
  %u = bitcast float %f to i32
  %hi = lshr i32 %u, 16
  %lsb = and i32 %hi, 1
  %r0 = add i32 %u, 32767
  %r1 = add i32 %r0, %lsb
  %r = lshr i32 %r1, 16
  %qnan = or i32 %hi, 64
  %a = and i32 %u, {_h(0x7fffffff)}
  %isnan = icmp ugt i32 %a, {_h(0x7f800000)}
  %res = select i1 %isnan, i32 %qnan, i32 %r
  %b = trunc i32 %res to i16
  ret i16 %b
}}""",
  "rbf": """define internal float @__plugrt_rbf(float %x) #ATTRS {
  %b = call i16 @__plugrt_f2bf(float %x)
  %f = call float @__plugrt_bf2f(i16 %b)
  ret float %f
}""",
}
_DEPS = {"rh": ("f2h", "h2f"), "rbf": ("f2bf", "bf2f"), "d2h": ()}
_HELPER_DECLS = {"h2f": {"llvm.ctlz.i32": "declare i32 @llvm.ctlz.i32(i32, i1)"},
                 "f2h": {"llvm.umin.i32": "declare i32 @llvm.umin.i32(i32, i32)"},
                 "d2h": {"llvm.umin.i64": "declare i64 @llvm.umin.i64(i64, i64)"}}


def _helper_closure(names: set[str]) -> list[str]:
  out = set(names)
  for n in names: out.update(_DEPS.get(n, ()))
  return [h for h in _HELPERS if h in out]  # a fixed order: the same kernel always renders the same text


__all__ = ["IRFunction", "LLVMRenderer"]
