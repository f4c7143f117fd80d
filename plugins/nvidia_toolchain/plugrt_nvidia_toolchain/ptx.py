"""The PTX renderer: kernel IR -> a PTX module that the CUDA driver JIT-compiles (cuModuleLoadData).

`PTXRenderer(arch, ptx_version).render(kernel)` returns one module with one `.visible .entry
<kernel.name>`. The kernel is not lowered: every IR thread is one CUDA thread, a group is a block.

Parameters, in this order (what the host passes in cuLaunchKernel's kernelParams: one pointer per
parameter, to a value laid out as the C type named here):

  | IR                     | PTX parameter | host value                                   |
  | ---------------------- | ------------- | -------------------------------------------- |
  | BUFFER i (index order) | .param .u64   | the buffer's device address (CUdeviceptr)    |
  | SCALAR bool            | .param .u8    | uint8_t 0 or 1 (any nonzero byte reads True) |
  | SCALAR int8 / uint8    | .param .s8/.u8 | int8_t / uint8_t                            |
  | SCALAR int16 / uint16  | .param .s16/.u16 | int16_t / uint16_t                        |
  | SCALAR int32 / uint32  | .param .s32/.u32 | int32_t / uint32_t                        |
  | SCALAR int64 / uint64  | .param .s64/.u64 | int64_t / uint64_t                        |
  | SCALAR float16         | .param .b16   | the 2 raw bytes of the IEEE half             |
  | SCALAR bfloat16        | .param .b16   | the 2 raw bytes (the top half of a float32)  |
  | SCALAR float32/float64 | .param .f32/.f64 | float / double                            |

All buffers come first (named `buf<i>_<name>`), then all scalars (`arg<i>_<name>`).

Launch: global_size = blocks per axis, local_size = threads per block; SPECIAL group_id, local_id,
num_groups, local_size read %ctaid, %tid, %nctaid, %ntid. BARRIER is `bar.sync 0` (the IR promises
uniform control flow). SHARED is a function-scope `.shared` byte array.

Registers (virtual; ptxas allocates): bool lives in `.pred` registers (stored as a byte 0/1),
8/16/32-bit integers in `.b32` registers, held sign-extended (signed) or zero-extended (unsigned) so
that compares, division and right shifts work unchanged and every op that can leave the range
re-extends (`cvt.s32.s8` / `cvt.u32.u8`...): that is how 8/16-bit results wrap. 64-bit integers
are `.b64`, float16/bfloat16 `.b16` (raw bits), float32 `.f32`, float64 `.f64`. Every IR value is
a fresh register; a VAR is one register that WRITE overwrites (mov) and READ copies.

Floats: add/sub/mul/div/sqrt/rcp are the IEEE `.rn` forms, never `.ftz`, and `.rn` also forbids
ptxas to contract a mul and an add into an fma. float16 add/sub/mul use the native `.f16`
instructions (sm_53+); every other float16 op and every bfloat16 op is done in float32 and rounded
once with `cvt.rn.f16.f32` / `cvt.rn.bf16.f32` (sm_80+ for bfloat16). float32 has 24 bits >=
2*11+2, so add/sub/mul/div/sqrt computed that way are correctly rounded half results (no double
rounding harm). Transcendentals (the IR asks for a few ulp): EXP2 f32 is `ex2.approx.f32`
(2 ulp over the full range, subnormals kept); LOG2, SIN and float64 EXP2 call `.func` routines of
plugrt_nvidia_toolchain.ptx_math, emitted once per module; float16/bfloat16 use the float32 ones and
round the result.

Integers: IDIV/MOD are div/rem with a zero divisor replaced by 1 (quotient x, remainder 0, as the
interpreter gives) and, for 32/64-bit signed, x / -1 computed as a wrapping negation (MIN / -1 is
otherwise unspecified in PTX). Shift amounts are masked with bits-1 as the interpreter does.
Casts follow plugrt.compiler.interpreter: float->int truncates (`cvt.rzi`, which saturates and maps NaN to
0 where the IR says undefined), any->bool is != 0 (NaN is true), float64->float16 rounds once
(`cvt.rn.f16.f64`), float64->bfloat16 and int->bfloat16 go through float32 as the interpreter does.

Vector access: a VLOAD is one `ld.global.v2`/`.v4` into fresh registers, one per lane (8/16-bit integers and bool
loaded into 32-bit registers and re-extended, as scalar loads are), its LANE ops those registers; a VSTORE is one
`st.global.v2`/`.v4` of the values' registers. The IR guarantees the alignment those instructions need.

Unsupported things (lowered IR's SPILL, bfloat16 before sm_80, shared arrays over 48 KiB, a PTX
version the target cannot use) raise plugrt.errors.RenderError, never a ptxas error later.
"""
from __future__ import annotations

import math
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

from plugrt.compiler.ir import COMPARE, Kernel, Ops, UOp
from plugrt.dtype import DType, PtrDType, cast_value, dtypes
from plugrt.errors import RenderError
from plugrt_nvidia_toolchain.arch import min_ptx_version, parse_arch, version_tuple
from plugrt_nvidia_toolchain.ptx_math import HELPER_PREFIX, HELPERS, f32_hex, f64_hex, two_over_pi_table

_SHARED_LIMIT = 48 * 1024  # static shared memory per block on every target

# register classes: PTX declaration type, mov and selp suffix
_DECL = {"p": ".pred", "h": ".b16", "r": ".b32", "rd": ".b64", "f": ".f32", "fd": ".f64"}
_MOVT = {"p": "pred", "h": "b16", "r": "b32", "rd": "b64", "f": "f32", "fd": "f64"}


def _rc(dt: DType) -> str:
  """The register class holding values of dt."""
  if dt is dtypes.bool: return "p"
  if dt.kind in "iu": return "rd" if dt.bits == 64 else "r"
  return {2: "h", 4: "f", 8: "fd"}[dt.itemsize]


def _it(dt: DType) -> str:
  """The PTX integer type an int dtype computes in (8/16-bit ones in 32 bits)."""
  return f"{'u' if dt.kind == 'u' else 's'}{64 if dt.bits == 64 else 32}"


# ---------------------------------------------------------------- per-kernel state

@dataclass
class _Fn:
  """One .entry under construction: its instruction lines and register counts."""
  name: str
  lines: list[str] = field(default_factory=list)
  decls: list[str] = field(default_factory=list)   # .shared arrays, declared before the instructions
  nreg: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_DECL, 0))
  helpers: set[str] = field(default_factory=set)
  ncall: int = 0

  def reg(self, cls: str) -> str:
    self.nreg[cls] += 1
    return f"%{cls}{self.nreg[cls] - 1}"

  def ins(self, text: str) -> None: self.lines.append(f"\t{text};")

  def val(self, cls: str, inst: str, *ops: str) -> str:
    """Emit `inst d, ops...` into a fresh register d of class cls; returns d."""
    d = self.reg(cls)
    self.ins(f"{inst} {', '.join((d, *ops))}")
    return d

  def label(self, name: str) -> None: self.lines.append(f"{name}:")


class PTXRenderer:
  """Kernel IR -> PTX text for one target. Stateless: render() may be called from several threads."""
  language = "PTX"
  device_name = "CUDA"

  def __init__(self, arch: str = "sm_90", ptx_version: str = "8.0"):
    self.sm, self.suffix = parse_arch(arch)
    if not re.match(r"^\d+\.\d+$", ptx_version): raise RenderError(f"PTX version {ptx_version!r} is not of the form X.Y", "e.g. '8.0'")
    self.arch, self.ptx_version = arch, ptx_version
    need = min_ptx_version(arch)
    if version_tuple(ptx_version) < version_tuple(need):
      raise RenderError(f"PTX ISA {ptx_version} cannot target {arch} (it needs {need} or later)",
                        f"pass ptx_version='{need}' or later (plugrt_nvidia_toolchain.arch.min_ptx_version gives it)")

  # ------------------------------------------------------------ module
  def render(self, kernel: Kernel) -> str:
    return self.render_many([kernel])

  def render_many(self, kernels: Sequence[Kernel]) -> str:
    """One module with one .entry per kernel (names must differ); helpers are shared."""
    names = [k.name for k in kernels]
    if len(set(names)) != len(names): raise RenderError(f"kernel names repeat in one module: {names}")
    entries, helpers = [], set()
    for k in kernels:
      fn = _Fn(k.name)
      entries.append(self._entry(k, fn))
      helpers |= fn.helpers
    for h in list(helpers): helpers.update(HELPERS[h][1])
    parts = [f"// generated by plugrt PTXRenderer: {', '.join(names)}", f".version {self.ptx_version}", f".target {self.arch}",
             ".address_size 64", ""]
    if "sin_f64" in helpers: parts += [two_over_pi_table(), ""]
    parts += [f"{HELPERS[h][0]()}\n" for h in HELPERS if h in helpers]
    parts += entries
    return "\n".join(parts) + "\n"

  # ------------------------------------------------------------ checks
  def _check(self, kernel: Kernel) -> None:
    name = kernel.name
    if not re.match(r"^[A-Za-z][A-Za-z0-9_]*$|^_[A-Za-z0-9_]+$", name) or name.startswith(HELPER_PREFIX):
      raise RenderError(f"kernel name {name!r} is not usable as a PTX entry name", "use letters, digits and _ (not '_' alone or __plugrt_*)")
    shared = 0
    for u in kernel.uops:
      dt = u.dtype.base if isinstance(u.dtype, PtrDType) else u.dtype
      if u.op is Ops.SPILL:
        raise RenderError(f"kernel {name}: SPILL (lowered IR) has no PTX rendering",
                          "render the kernel before plugrt.compiler.lowering.serialize_groups")
      if dt is dtypes.bfloat16 and self.sm < 80:
        raise RenderError(f"kernel {name}: bfloat16 ({u.op.name}) needs sm_80 or later for cvt.rn.bf16.f32, the target is {self.arch}",
                          "use float16/float32, or a newer GPU")
      if u.op is Ops.SHARED: shared += _round_up(u.arg[1] * dt.itemsize, max(4, dt.itemsize))
    if shared > _SHARED_LIMIT:
      raise RenderError(f"kernel {name}: {shared} bytes of shared memory, more than the {_SHARED_LIMIT} a block may declare statically",
                        "use smaller SHARED arrays")

  # ------------------------------------------------------------ entry
  def _entry(self, kernel: Kernel, f: _Fn) -> str:
    self._check(kernel)
    params, head = [], []
    r: dict[UOp, str] = {}
    for b in kernel.buffers:
      pname = f"buf{b.arg[0]}_{b.arg[1]}"
      params.append(f".param .u64 {pname}")
      raw = f.val("rd", "ld.param.u64", f"[{pname}]")
      r[b] = f.val("rd", "cvta.to.global.u64", raw)
    for s in kernel.scalars:
      pname = f"arg{s.arg[0]}_{s.arg[1]}"
      params.append(f".param .{_param_type(s.dtype)} {pname}")
      r[s] = self._load_param(f, s.dtype, pname)
    head, f.lines = f.lines, []
    body = self._body(kernel, f, r)
    decls = [f"\t.reg {_DECL[c]} %{c}<{n}>;" for c, n in f.nreg.items() if n]
    sig = ",\n".join(f"\t{p}" for p in params)
    entry = f".visible .entry {kernel.name}(" + (f"\n{sig}\n" if params else "") + ")"
    return "\n".join([entry, "{", *decls, *f.decls, *head, *body, "\tret;", "}", ""])

  def _load_param(self, f: _Fn, dt: DType, pname: str) -> str:
    if dt is dtypes.bool:
      raw = f.val("r", "ld.param.u8", f"[{pname}]")
      return f.val("p", "setp.ne.b32", f.val("r", "cvt.u32.u8", raw), "0")
    if dt.kind in "iu" and dt.bits < 32:
      return self._wrap(f, dt, f.val("r", f"ld.param.{_param_type(dt)}", f"[{pname}]"))
    return f.val(_rc(dt), f"ld.param.{_param_type(dt)}", f"[{pname}]")

  def _body(self, kernel: Kernel, f: _Fn, r: dict[UOp, str]) -> list[str]:
    has_else = {u.src[0] for u in kernel.uops if u.op is Ops.ELSE}
    pos = {u: i for i, u in enumerate(kernel.uops)}
    lanes: dict[UOp, list[str]] = {}  # a VLOAD's registers
    for i, u in enumerate(kernel.uops):
      op, dt = u.op, u.dtype
      if op in (Ops.BUFFER, Ops.SCALAR): continue
      s = [r.get(x, "") for x in u.src]
      if op is Ops.CONST: r[u] = self._const(f, u.arg, dt)
      elif op is Ops.SPECIAL:
        kind, axis = u.arg
        sreg = {"group_id": "%ctaid", "local_id": "%tid", "num_groups": "%nctaid", "local_size": "%ntid"}[kind]
        r[u] = f.val("r", "mov.u32", f"{sreg}.{'xyz'[axis]}")
      elif op is Ops.SHARED:
        base = dt.base
        sym = f"sh{i}_{u.arg[0]}"
        f.decls.append(f"\t.shared .align {max(4, base.itemsize)} .b8 {sym}[{u.arg[1] * base.itemsize}];")
        r[u] = f.val("r", "mov.u32", sym)
      elif op is Ops.LOAD: r[u] = self._load(f, u, s)
      elif op is Ops.STORE: self._store(f, u, s)
      elif op is Ops.VLOAD: lanes[u] = self._vload(f, u, s)
      elif op is Ops.LANE: r[u] = self._lane(f, dt, lanes[u.src[0]][u.arg])
      elif op is Ops.VSTORE: self._vstore(f, u, s)
      elif op is Ops.VAR: r[u] = f.val(_rc(dt), f"mov.{_MOVT[_rc(dt)]}", s[0])
      elif op is Ops.READ: r[u] = f.val(_rc(dt), f"mov.{_MOVT[_rc(dt)]}", s[0])
      elif op is Ops.WRITE: f.ins(f"mov.{_MOVT[_rc(u.src[1].dtype)]} {s[0]}, {s[1]}")
      elif op is Ops.RANGE:
        # the index register counts from start; the loop exits at the head when idx >= end (so idx + 1 never overflows)
        idx = f.val(_rc(dt), f"mov.{_MOVT[_rc(dt)]}", s[0])
        f.label(f"$L_r{i}_head")
        done = f.val("p", f"setp.ge.{_it(dt)}", idx, s[1])
        f.ins(f"@{done} bra $L_r{i}_end")
        r[u] = idx
      elif op is Ops.ENDRANGE:
        j, rng = pos[u.src[0]], u.src[0]
        f.ins(f"add.{_it(rng.dtype)} {r[rng]}, {r[rng]}, 1")
        f.ins(f"bra $L_r{j}_head")
        f.label(f"$L_r{j}_end")
      elif op is Ops.IF: f.ins(f"@!{s[0]} bra $L_i{i}_{'else' if u in has_else else 'end'}")
      elif op is Ops.ELSE:
        j = pos[u.src[0]]
        f.ins(f"bra $L_i{j}_end")
        f.label(f"$L_i{j}_else")
      elif op is Ops.ENDIF: f.label(f"$L_i{pos[u.src[0]]}_end")
      elif op is Ops.BARRIER: f.ins("bar.sync 0")
      elif op is Ops.CAST: r[u] = self._cast(f, s[0], u.src[0].dtype, dt)
      elif op is Ops.BITCAST: r[u] = self._bitcast(f, s[0], u.src[0].dtype, dt)
      elif op is Ops.WHERE: r[u] = self._where(f, dt, s)
      elif op in _ALU_OPS: r[u] = self._alu(f, u, s)
      else: raise RenderError(f"kernel {kernel.name}: the PTX renderer has no rule for {op.name}")
    return f.lines

  # ------------------------------------------------------------ values
  def _const(self, f: _Fn, x: bool | int | float, dt: DType) -> str:
    cls = _rc(dt)
    if dt is dtypes.bool: return f.val("p", "mov.pred", "1" if x else "0")
    if dt.kind in "iu":
      # registers hold 8/16-bit values extended to 32 bits (sign- or zero-), written as the unsigned register bits
      v = cast_value(int(x), dt)
      width = 64 if dt.bits == 64 else 32
      return f.val(cls, f"mov.b{width}", f"0x{v & ((1 << width) - 1):X}")
    x = float(x)
    if dt is not dtypes.float64 and math.isfinite(x): x = cast_value(x, dt)  # the dtype's value nearest x
    if dt is dtypes.float64: return f.val(cls, "mov.f64", f64_hex(x))
    if dt is dtypes.float32: return f.val(cls, "mov.f32", f32_hex(x))
    if dt is dtypes.float16: bits = 0x7E00 if math.isnan(x) else struct.unpack("<H", struct.pack("<e", x))[0]
    else: bits = 0x7FC0 if math.isnan(x) else struct.unpack("<I", struct.pack("<f", x))[0] >> 16  # exact: x is a bfloat16 value
    return f.val(cls, "mov.b16", f"0x{bits:04X}")

  def _wrap(self, f: _Fn, dt: DType, x: str) -> str:
    """Re-extend a 32-bit register to dt's canonical form (8/16-bit ints wrap here); other dtypes unchanged."""
    if dt.kind not in "iu" or dt.bits >= 32: return x
    k = "s" if dt.kind == "i" else "u"
    return f.val("r", f"cvt.{k}32.{k}{dt.bits}", x)

  def _copy(self, f: _Fn, dt: DType, x: str) -> str:
    cls = _rc(dt)
    return f.val(cls, f"mov.{_MOVT[cls]}", x)

  def _to_f32(self, f: _Fn, dt: DType, x: str) -> str:
    """A float16/bfloat16 register as float32 (exact)."""
    if dt is dtypes.float16: return f.val("f", "cvt.f32.f16", x)
    wide = f.val("r", "shl.b32", f.val("r", "cvt.u32.u16", x), "16")  # bfloat16 is the top half of a float32
    return f.val("f", "mov.b32", wide)

  def _from_f32(self, f: _Fn, dt: DType, x: str) -> str:
    """float32 -> float16/bfloat16, rounded to nearest even."""
    return f.val("h", f"cvt.rn.{'f16' if dt is dtypes.float16 else 'bf16'}.f32", x)

  # ------------------------------------------------------------ memory
  def _address(self, f: _Fn, ptr: UOp, base: str, idx: UOp, x: str) -> str:
    """The [address] operand of element idx of ptr (a global or shared array)."""
    size = ptr.dtype.base.itemsize
    if idx.op is Ops.CONST and 0 <= idx.arg * size < 2 ** 31:
      off = idx.arg * size
      return f"[{base}+{off}]" if off else f"[{base}]"
    dt = idx.dtype
    if ptr.dtype.addrspace == "shared":  # shared addresses are 32-bit
      i32 = f.val("r", "cvt.u32.u64", x) if dt.bits == 64 else x
      return f"[{f.val('r', 'mad.lo.s32', i32, str(size), base)}]"
    if dt.bits == 64: return f"[{f.val('rd', 'mad.lo.s64', x, str(size), base)}]"
    # 8/16/32-bit indices are held extended to 32 bits: a widening multiply sign- or zero-extends them
    off = f.val("rd", f"mul.wide.{'u' if dt.kind == 'u' else 's'}32", x, str(size))
    return f"[{f.val('rd', 'add.s64', base, off)}]"

  def _load(self, f: _Fn, u: UOp, s: list[str]) -> str:
    dt, space = u.dtype, u.src[0].dtype.addrspace
    addr = self._address(f, u.src[0], s[0], u.src[1], s[1])
    if dt is dtypes.bool: return f.val("p", "setp.ne.b32", self._wrap(f, dtypes.uint8, f.val("r", f"ld.{space}.u8", addr)), "0")
    if dt.kind in "iu" and dt.bits < 32: return self._wrap(f, dt, f.val("r", f"ld.{space}.u{dt.bits}", addr))
    return f.val(_rc(dt), f"ld.{space}.{_storage_type(dt)}", addr)

  def _store(self, f: _Fn, u: UOp, s: list[str]) -> None:
    dt, space = u.src[2].dtype, u.src[0].dtype.addrspace
    addr = self._address(f, u.src[0], s[0], u.src[1], s[1])
    v = f.val("r", "selp.u32", "1", "0", s[2]) if dt is dtypes.bool else s[2]  # bool is stored as a byte 0/1
    f.ins(f"st.{space}.{_storage_type(dt)} {addr}, {v}")  # 8/16-bit stores take the low bits of the 32-bit register

  def _vload(self, f: _Fn, u: UOp, s: list[str]) -> list[str]:
    """ld.global.v2/v4 of u.arg elements into fresh registers (bool and 8/16-bit integers into 32-bit ones, raw)."""
    dt, width = u.dtype, u.arg
    addr = self._address(f, u.src[0], s[0], u.src[1], s[1])
    small = dt is dtypes.bool or (dt.kind in "iu" and dt.bits < 32)
    regs = [f.reg("r" if small else _rc(dt)) for _ in range(width)]
    ty = f"u{8 if dt is dtypes.bool else dt.bits}" if small else _storage_type(dt)
    f.ins(f"ld.global.v{width}.{ty} {{{', '.join(regs)}}}, {addr}")
    return regs

  def _lane(self, f: _Fn, dt: DType, reg: str) -> str:
    """A VLOAD's register as a value of dt, as _load leaves one."""
    if dt is dtypes.bool: return f.val("p", "setp.ne.b32", self._wrap(f, dtypes.uint8, reg), "0")
    return self._wrap(f, dt, reg)

  def _vstore(self, f: _Fn, u: UOp, s: list[str]) -> None:
    dt, width = u.src[2].dtype, len(u.src) - 2
    addr = self._address(f, u.src[0], s[0], u.src[1], s[1])
    vals = [f.val("r", "selp.u32", "1", "0", x) for x in s[2:]] if dt is dtypes.bool else s[2:]  # bool is stored as a byte 0/1
    f.ins(f"st.global.v{width}.{_storage_type(dt)} {addr}, {{{', '.join(vals)}}}")

  # ------------------------------------------------------------ ALU
  def _where(self, f: _Fn, dt: DType, s: list[str]) -> str:
    if dt is dtypes.bool:  # no selp.pred: (c & a) | (!c & b)
      nc = f.val("p", "not.pred", s[0])
      return f.val("p", "or.pred", f.val("p", "and.pred", s[0], s[1]), f.val("p", "and.pred", nc, s[2]))
    cls = _rc(dt)
    return f.val(cls, f"selp.{_MOVT[cls]}", s[1], s[2], s[0])

  def _alu(self, f: _Fn, u: UOp, s: list[str]) -> str:
    op, sdt = u.op, u.src[0].dtype
    if sdt is dtypes.bool: return self._alu_bool(f, op, s)
    if sdt.kind in "iu": return self._alu_int(f, u, s)
    if sdt.itemsize == 2: return self._alu_half(f, u, s)
    ty = "f32" if sdt is dtypes.float32 else "f64"
    cls = _rc(sdt)
    if op in COMPARE: return f.val("p", f"setp.{_FCMP[op]}.{ty}", s[0], s[1])
    if op in _FBIN: return f.val(cls, f"{_FBIN[op]}.{ty}", s[0], s[1])
    if op is Ops.NEG: return f.val(cls, f"neg.{ty}", s[0])
    if op is Ops.SQRT: return f.val(cls, f"sqrt.rn.{ty}", s[0])
    if op is Ops.RECIP: return f.val(cls, f"rcp.rn.{ty}", s[0])
    if op is Ops.TRUNC: return f.val(cls, f"cvt.rzi.{ty}.{ty}", s[0])
    if op is Ops.EXP2 and ty == "f32": return f.val(cls, "ex2.approx.f32", s[0])
    if op in (Ops.EXP2, Ops.LOG2, Ops.SIN): return self._call(f, f"{_MATH[op]}_{ty}", ty, s[0])
    raise RenderError(f"the PTX renderer has no rule for {op.name} on {sdt.name}")

  def _alu_half(self, f: _Fn, u: UOp, s: list[str]) -> str:
    """float16/bfloat16: add/sub/mul of float16 natively (sm_53+), the rest in float32 rounded once."""
    op, sdt = u.op, u.src[0].dtype
    if op is Ops.NEG: return f.val("h", "xor.b16", s[0], "0x8000")  # exact, NaN included
    if sdt is dtypes.float16 and self.sm >= 53 and op in (Ops.ADD, Ops.SUB, Ops.MUL): return f.val("h", f"{_FBIN[op]}.f16", s[0], s[1])
    xs = [self._to_f32(f, sdt, x) for x in s]
    if op in COMPARE: return f.val("p", f"setp.{_FCMP[op]}.f32", xs[0], xs[1])  # exact in float32
    if op in _FBIN: y = f.val("f", f"{_FBIN[op]}.f32", xs[0], xs[1])
    elif op is Ops.SQRT: y = f.val("f", "sqrt.rn.f32", xs[0])
    elif op is Ops.RECIP: y = f.val("f", "rcp.rn.f32", xs[0])
    elif op is Ops.TRUNC: y = f.val("f", "cvt.rzi.f32.f32", xs[0])
    elif op is Ops.EXP2: y = f.val("f", "ex2.approx.f32", xs[0])
    elif op in (Ops.LOG2, Ops.SIN): y = self._call(f, f"{_MATH[op]}_f32", "f32", xs[0])
    else: raise RenderError(f"the PTX renderer has no rule for {op.name} on {sdt.name}")
    return self._from_f32(f, sdt, y)

  def _call(self, f: _Fn, helper: str, ty: str, x: str) -> str:
    f.helpers.add(helper)
    n = f.ncall
    f.ncall += 1
    d = f.reg("f" if ty == "f32" else "fd")
    f.lines += ["\t{", f"\t.param .{ty} pa{n};", f"\t.param .{ty} pr{n};", f"\tst.param.{ty} [pa{n}], {x};",
                f"\tcall (pr{n}), {HELPER_PREFIX}{helper}, (pa{n});", f"\tld.param.{ty} {d}, [pr{n}];", "\t}"]
    return d

  def _alu_bool(self, f: _Fn, op: Ops, s: list[str]) -> str:
    if op is Ops.NOT: return f.val("p", "not.pred", s[0])
    if op in (Ops.AND, Ops.OR, Ops.XOR): return f.val("p", f"{op.name.lower()}.pred", s[0], s[1])
    if op is Ops.CMPNE: return f.val("p", "xor.pred", s[0], s[1])
    if op is Ops.CMPEQ: return f.val("p", "not.pred", f.val("p", "xor.pred", s[0], s[1]))
    na = f.val("p", "not.pred", s[0])  # False < True: a < b is !a & b, a <= b is !a | b
    if op is Ops.CMPLT: return f.val("p", "and.pred", na, s[1])
    if op is Ops.CMPLE: return f.val("p", "or.pred", na, s[1])
    raise RenderError(f"the PTX renderer has no rule for {op.name} on bool")

  def _alu_int(self, f: _Fn, u: UOp, s: list[str]) -> str:
    op, dt = u.op, u.src[0].dtype
    it, cls = _it(dt), _rc(dt)
    bt = f"b{64 if dt.bits == 64 else 32}"
    if op in COMPARE: return f.val("p", f"setp.{_ICMP[op]}.{it}", s[0], s[1])
    if op in (Ops.AND, Ops.OR, Ops.XOR): return f.val(cls, f"{op.name.lower()}.{bt}", s[0], s[1])  # keeps the extension
    if op is Ops.MAX: return f.val(cls, f"max.{it}", s[0], s[1])
    if op is Ops.MIN: return f.val(cls, f"min.{it}", s[0], s[1])
    if op is Ops.ADD: return self._wrap(f, dt, f.val(cls, f"add.{it}", s[0], s[1]))
    if op is Ops.SUB: return self._wrap(f, dt, f.val(cls, f"sub.{it}", s[0], s[1]))
    if op is Ops.MUL: return self._wrap(f, dt, f.val(cls, f"mul.lo.{it}", s[0], s[1]))
    if op is Ops.NEG: return self._wrap(f, dt, f.val(cls, f"neg.s{it[1:]}", s[0]))
    if op is Ops.NOT: return self._wrap(f, dt, f.val(cls, f"not.{bt}", s[0]))
    if op in (Ops.SHL, Ops.SHR):
      # the IR leaves shifts by >= width undefined: mask the amount as the interpreter does (PTX would clamp)
      b = u.src[1]
      if b.op is Ops.CONST: amt = str(b.arg & (dt.bits - 1))
      else:
        amt = f.val(cls, f"and.{bt}", s[1], str(dt.bits - 1))
        if dt.bits == 64: amt = f.val("r", "cvt.u32.u64", amt)  # PTX shift amounts are .u32
      if op is Ops.SHL: return self._wrap(f, dt, f.val(cls, f"shl.{bt}", s[0], amt))
      return f.val(cls, f"shr.{it}", s[0], amt)  # arithmetic for signed (the register holds the sign extension)
    if op in (Ops.IDIV, Ops.MOD): return self._divmod(f, u, s)
    raise RenderError(f"the PTX renderer has no rule for {op.name} on {dt.name}")

  def _divmod(self, f: _Fn, u: UOp, s: list[str]) -> str:
    """div/rem truncate like C. A zero divisor gives the interpreter's values (x, 0); for 32/64-bit signed
    dtypes x / -1 is a wrapping negation (MIN / -1 overflows, unspecified in PTX). 8/16-bit values are held
    in 32 bits, where MIN / -1 does not overflow: the wrap afterwards gives MIN as the IR says."""
    dt, isdiv, b = u.dtype, u.op is Ops.IDIV, u.src[1]
    it, cls = _it(dt), _rc(dt)
    bt = f"b{64 if dt.bits == 64 else 32}"
    guard_m1 = dt.kind == "i" and dt.bits >= 32
    if b.op is Ops.CONST:
      if b.arg == 0: return self._copy(f, dt, s[0]) if isdiv else self._const(f, 0, dt)
      if b.arg == -1 and guard_m1:
        return f.val(cls, f"neg.{it}", s[0]) if isdiv else self._const(f, 0, dt)
      return self._wrap(f, dt, f.val(cls, f"{'div' if isdiv else 'rem'}.{it}", s[0], s[1]))
    bad = f.val("p", f"setp.eq.{bt}", s[1], "0")
    if guard_m1:
      m1 = f.val("p", f"setp.eq.{bt}", s[1], f"0x{(1 << (64 if dt.bits == 64 else 32)) - 1:X}")
      bad = f.val("p", "or.pred", bad, m1)
    d = f.val(cls, f"selp.{bt}", "1", s[1], bad)
    if not isdiv: return f.val(cls, f"rem.{it}", s[0], d)  # x % 1 == 0 == x % -1
    q = f.val(cls, f"div.{it}", s[0], d)
    if guard_m1: q = f.val(cls, f"selp.{bt}", f.val(cls, f"neg.{it}", s[0]), q, m1)
    return self._wrap(f, dt, q)

  # ------------------------------------------------------------ conversions
  def _cast(self, f: _Fn, x: str, src: DType, dt: DType) -> str:
    if src is dt: return self._copy(f, dt, x)
    if dt is dtypes.bool:
      if src.kind in "iu": return f.val("p", f"setp.ne.b{64 if src.bits == 64 else 32}", x, "0")
      if src.itemsize == 2: return f.val("p", "setp.ne.b16", f.val("h", "and.b16", x, "0x7FFF"), "0")  # NaN is nonzero: true
      ty = "f32" if src is dtypes.float32 else "f64"
      return f.val("p", f"setp.neu.{ty}", x, f32_hex(0.0) if ty == "f32" else f64_hex(0.0))  # NaN != 0
    if src is dtypes.bool:
      if dt.kind in "iu": return f.val(_rc(dt), f"selp.u{64 if dt.bits == 64 else 32}", "1", "0", x)
      if dt is dtypes.float32: return f.val("f", "selp.f32", f32_hex(1.0), f32_hex(0.0), x)
      if dt is dtypes.float64: return f.val("fd", "selp.f64", f64_hex(1.0), f64_hex(0.0), x)
      return f.val("h", "selp.b16", "0x3C00" if dt is dtypes.float16 else "0x3F80", "0x0000", x)
    if dt.kind in "iu" and src.kind in "iu": return self._int_to_int(f, x, src, dt)
    if dt.kind in "iu":  # from a float: truncate (cvt.rzi saturates out-of-range values, NaN -> 0: the IR leaves both undefined)
      if src.itemsize == 2: x, src = self._to_f32(f, src, x), dtypes.float32
      ty = "f32" if src is dtypes.float32 else "f64"
      if dt.bits == 64: return f.val("rd", f"cvt.rzi.{_it(dt)}.{ty}", x)
      return self._wrap(f, dt, f.val("r", f"cvt.rzi.{_it(dt)}.{ty}", x))
    if src.kind in "iu":  # int -> float: one rounding (float16/bfloat16 through float32, as the interpreter does)
      if dt in (dtypes.float32, dtypes.float64): return f.val(_rc(dt), f"cvt.rn.{'f32' if dt is dtypes.float32 else 'f64'}.{_it(src)}", x)
      return self._from_f32(f, dt, f.val("f", f"cvt.rn.f32.{_it(src)}", x))
    # float -> float
    if src.itemsize == 2:
      if dt is dtypes.float64 and src is dtypes.float16: return f.val("fd", "cvt.f64.f16", x)
      y = self._to_f32(f, src, x)
      if dt is dtypes.float32: return y
      if dt is dtypes.float64: return f.val("fd", "cvt.f64.f32", y)
      return self._from_f32(f, dt, y)  # float16 <-> bfloat16: exact to float32, then one rounding
    if src is dtypes.float32:
      if dt is dtypes.float64: return f.val("fd", "cvt.f64.f32", x)
      return self._from_f32(f, dt, x)
    # from float64
    if dt is dtypes.float32: return f.val("f", "cvt.rn.f32.f64", x)
    if dt is dtypes.float16: return f.val("h", "cvt.rn.f16.f64", x)  # one rounding, as numpy
    return self._from_f32(f, dt, f.val("f", "cvt.rn.f32.f64", x))  # bfloat16 through float32, as the interpreter

  def _int_to_int(self, f: _Fn, x: str, src: DType, dt: DType) -> str:
    if src.bits == 64:
      if dt.bits == 64: return self._copy(f, dt, x)
      low = f.val("r", "cvt.u32.u64", x)
      return self._wrap(f, dt, low)
    if dt.bits == 64: return f.val("rd", f"cvt.{_it(src)[0]}64.{_it(src)}", x)  # sign- or zero-extend by the source
    if dt.bits == 32: return self._copy(f, dt, x)  # the register already holds the extension of the source
    return self._wrap(f, dt, x)

  def _bitcast(self, f: _Fn, x: str, src: DType, dt: DType) -> str:
    if src is dt: return self._copy(f, dt, x)
    if src is dtypes.bool or dt is dtypes.bool: return self._cast(f, x, src, dt)  # bool <-> 8-bit int: the byte 0/1
    cs, cd = _rc(src), _rc(dt)
    if cs == cd:  # same register class: int <-> int of one size (re-extend) or float16 <-> bfloat16 (same bits)
      return self._wrap(f, dt, x) if dt.kind in "iu" and dt.bits < 32 else self._copy(f, dt, x)
    if cd == "h": return f.val("h", "cvt.u16.u32", x)  # 16-bit int -> half: the low 16 bits
    if cs == "h": return self._wrap(f, dt, f.val("r", "cvt.u32.u16", x))
    return f.val(cd, f"mov.b{dt.bits}", x)  # 32/64-bit int <-> float


def _round_up(x: int, a: int) -> int: return (x + a - 1) // a * a


def _param_type(dt: DType) -> str:
  if dt is dtypes.bool: return "u8"
  if dt.kind in "iu": return f"{'u' if dt.kind == 'u' else 's'}{dt.bits}"
  return "b16" if dt.itemsize == 2 else f"f{dt.bits}"


def _storage_type(dt: DType) -> str:
  """The ld/st type of one element in memory."""
  if dt is dtypes.bool: return "u8"
  if dt.kind in "iu": return f"u{dt.bits}"
  return "b16" if dt.itemsize == 2 else f"f{dt.bits}"


_ICMP = {Ops.CMPLT: "lt", Ops.CMPLE: "le", Ops.CMPEQ: "eq", Ops.CMPNE: "ne"}
# CMPNE is unordered (NaN != x is true, as in numpy); the others are ordered (false with a NaN)
_FCMP = {Ops.CMPLT: "lt", Ops.CMPLE: "le", Ops.CMPEQ: "eq", Ops.CMPNE: "neu"}
# IEEE round-to-nearest forms; the explicit .rn also keeps ptxas from fusing a mul and an add into an fma
_FBIN = {Ops.ADD: "add.rn", Ops.SUB: "sub.rn", Ops.MUL: "mul.rn", Ops.DIV: "div.rn", Ops.MAX: "max", Ops.MIN: "min"}
_MATH = {Ops.EXP2: "exp2", Ops.LOG2: "log2", Ops.SIN: "sin"}
_ALU_OPS = frozenset({Ops.NEG, Ops.NOT, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.RECIP, Ops.TRUNC, Ops.ADD, Ops.SUB, Ops.MUL, Ops.DIV,
                      Ops.IDIV, Ops.MOD, Ops.MAX, Ops.MIN, Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR, *COMPARE})

__all__ = ["PTXRenderer"]
