"""Kernel IR -> Metal Shading Language (MSL), on the core's C-like renderer base.

The kernel is

    kernel void NAME(device T* buf [[buffer(0)]], const device U* in [[buffer(1)]], ...,
                     constant int& n [[buffer(k)]], ...,
                     uint3 plugrt_gid [[threadgroup_position_in_grid]], uint3 plugrt_lid [[thread_position_in_threadgroup]],
                     uint3 plugrt_ngroups [[threadgroups_per_grid]], uint3 plugrt_lsize [[threads_per_threadgroup]])

Buffers come first at indices 0.. (bound with setBuffer:offset:atIndex:, so a view is the buffer and a byte
offset), then each scalar at the next index in the constant address space (bound with setBytes:length:atIndex:).
SHARED arrays are `threadgroup` arrays declared at kernel scope (MSL allows them nowhere else); BARRIER is
`threadgroup_barrier(mem_flags::mem_device | mem_flags::mem_threadgroup)`, which orders both the group's shared
memory and device memory, as the IR's barrier does.

dtypes:
- bool is stored as `uchar` (buffers and scalar arguments), held as `bool`.
- float16 is stored as `half` and bfloat16 as `bfloat`, both held as float and rounded back after every operation
  (`float(half(x))`): MSL's conversions round to nearest even, so every op gets the IR's per-op rounding (float's 24
  bits make the double rounding harmless for + - * / and sqrt), whatever the GPU does with native half arithmetic.
  `bfloat` exists from MSL 3.1 (macOS 14); for an older target a kernel using bfloat16 is a RenderError naming it.
- float64: Metal has no double. A kernel using it is a RenderError naming float64 and the device.
- int64/uint64 are MSL's `long`/`ulong` (64-bit on every Metal GPU plugrt targets).
- integers wrap: signed + - * and negation are done on the unsigned type (signed overflow is undefined in MSL, a
  C++ dialect); a zero divisor and MIN / -1 are guarded, so no division is undefined behaviour either.

Vector access (VLOAD/VSTORE) is a load or store through a `device` pointer to MSL's vector type of the storage type
(float4, half4, bfloat4, uint2, ...; bool's storage as uchar4): the IR guarantees the alignment. 64-bit integers
have no vector type here, so their vector accesses are rendered an element at a time.

Math: transcendentals use the `metal::precise::` functions (sin, exp2, log2, sqrt, divide), never `metal::fast::`:
fast math is off in every compile (MTLCompileOptions / `-fno-fast-math`), and precise:: keeps the results within the
few ulp the conformance suite allows even where a library is compiled with fast math on. Trunc is exact either way.
"""
from __future__ import annotations

import math
import struct
from collections.abc import Sequence

from plugrt.compiler.ir import Kernel, Ops, UOp
from plugrt.compiler.renderer.cstyle import CStyleRenderer
from plugrt.dtype import DType, dtypes

#: the first Metal Shading Language version with `bfloat` (macOS 14, iOS 17)
BFLOAT_MSL = (3, 1)
#: the default target: MSL 3.0 (macOS 13) runs on every Apple-silicon Mac plugrt supports; a device reports its own
DEFAULT_MSL = (3, 0)

_TYPES = {dtypes.bool: "bool", dtypes.int8: "char", dtypes.int16: "short", dtypes.int32: "int", dtypes.int64: "long",
          dtypes.uint8: "uchar", dtypes.uint16: "ushort", dtypes.uint32: "uint", dtypes.uint64: "ulong", dtypes.float32: "float",
          dtypes.float16: "float", dtypes.bfloat16: "float"}
_STORAGE = {dtypes.bool: "uchar", dtypes.float16: "half", dtypes.bfloat16: "bfloat"}
_HALVES = {dtypes.float16: "half", dtypes.bfloat16: "bfloat"}
_UNSIGNED = {dtypes.int32: "uint", dtypes.int64: "ulong"}
#: storage types with an MSL vector type (vectors of 64-bit integers are left out: not every MSL version has them)
_VECTORS = frozenset({"uchar", "char", "short", "ushort", "int", "uint", "half", "bfloat", "float"})
_MATH = {Ops.EXP2: "metal::precise::exp2", Ops.LOG2: "metal::precise::log2", Ops.SIN: "metal::precise::sin",
         Ops.SQRT: "metal::precise::sqrt", Ops.TRUNC: "metal::trunc"}
#: the launch geometry, as the kernel's attribute parameters: IR kind -> (parameter, attribute)
SPECIALS = {"group_id": ("plugrt_gid", "threadgroup_position_in_grid"), "local_id": ("plugrt_lid", "thread_position_in_threadgroup"),
            "num_groups": ("plugrt_ngroups", "threadgroups_per_grid"), "local_size": ("plugrt_lsize", "threads_per_threadgroup")}

# MSL keywords, address spaces, type names and this file's own names: parameters so named are renamed
_RESERVED = frozenset({
  "kernel", "vertex", "fragment", "device", "constant", "threadgroup", "threadgroup_imageblock", "thread", "ray_data", "object_data",
  "metal", "using", "namespace", "template", "typename", "class", "struct", "union", "enum", "typedef", "static", "const", "constexpr",
  "volatile", "inline", "auto", "register", "extern", "mutable", "explicit", "operator", "this", "new", "delete", "sizeof", "alignas",
  "alignof", "decltype", "static_assert", "static_cast", "reinterpret_cast", "const_cast", "dynamic_cast", "nullptr", "true", "false",
  "if", "else", "for", "while", "do", "return", "switch", "case", "default", "break", "continue", "goto", "try", "catch", "throw",
  "bool", "char", "uchar", "short", "ushort", "int", "uint", "long", "ulong", "half", "bfloat", "float", "double", "void", "signed",
  "unsigned", "size_t", "ptrdiff_t", "uint3", "int3", *(f"{t}{n}" for t in _VECTORS for n in (2, 4)), "as_type", "threadgroup_barrier",
  "mem_flags", "precise", "fast",
  "NAN", "INFINITY", *(p for p, _ in SPECIALS.values())})


def msl_version_str(version: tuple[int, int]) -> str: return f"{version[0]}.{version[1]}"


class MetalRenderer(CStyleRenderer):
  language = "Metal Shading Language"
  bool_type = "bool"
  reserved = _RESERVED

  def __init__(self, device_name: str = "METAL", msl_version: tuple[int, int] = DEFAULT_MSL):
    self.device_name, self.msl_version = device_name, tuple(msl_version)
    self.bfloat = self.msl_version >= BFLOAT_MSL
    # held as float, stored natively: the base class's "emulated" path (type float, round after every op)
    self.emulated = {dt: ("", "", "") for dt in (_HALVES if self.bfloat else {dtypes.float16: "half"})}
    self.unsupported = frozenset({dtypes.float64} | (set() if self.bfloat else {dtypes.bfloat16}))

  # ------------------------------------------------------------ types and values
  def type_name(self, dt: DType) -> str:
    if dt is dtypes.float64: return "double"  # never rendered: check() refuses float64 first
    return _TYPES[dt]

  def storage_type(self, dt: DType) -> str: return _STORAGE.get(dt) or self.type_name(dt)

  def from_storage(self, dt: DType, expr: str) -> str:
    if dt is dtypes.bool: return f"({expr}!=0)"
    return f"float({expr})" if dt in _HALVES else expr

  def to_storage(self, dt: DType, expr: str) -> str:
    if dt is dtypes.bool: return f"uchar({expr})"
    return f"{_HALVES[dt]}({expr})" if dt in _HALVES else expr

  def round_to(self, dt: DType, expr: str) -> str: return f"float({_HALVES[dt]}({expr}))" if dt in _HALVES else expr

  def float_literal(self, x: float, dt: DType) -> str:
    if math.isfinite(x): return repr(float(x)) + "f"
    return f"as_type<float>({struct.unpack('<I', struct.pack('<f', x))[0]:#x}u)"  # inf and NaN by their bits

  def literal(self, x: object, dt: DType) -> str:
    if dt is dtypes.bool: return "true" if x else "false"
    if dt is dtypes.int64: return "(-9223372036854775807L-1)" if x == dt.min else f"{x}L"
    if dt is dtypes.uint64: return f"{x}UL"
    if dt in (dtypes.int8, dtypes.int16, dtypes.uint8, dtypes.uint16): return f"{self.type_name(dt)}({x})"
    return super().literal(x, dt)

  def cast_expr(self, x: str, src: DType, dt: DType) -> str:
    if dt is dtypes.bool: return f"({x}!=0)"
    return f"{self.type_name(dt)}({x})"  # function-style: MSL's own conversions (float -> int truncates)

  def reinterpret(self, name: str, x: str, src_type: str, dst_type: str) -> list[str]:
    return [f"{dst_type} {name} = as_type<{dst_type}>({x});"]

  # ------------------------------------------------------------ ops
  def math_fn(self, op: Ops, dt: DType, x: str) -> str:
    if op is Ops.RECIP: return f"metal::precise::divide(1.0f, {x})"
    return f"{_MATH[op]}({x})"

  def alu(self, u: UOp, s: Sequence[str]) -> str:
    op, dt = u.op, u.dtype
    if op is Ops.DIV and dt.kind == "f": return self.round_to(dt, f"metal::precise::divide({s[0]}, {s[1]})")
    if op in (Ops.IDIV, Ops.MOD):  # a zero divisor and MIN / -1 are undefined in MSL; the IR wraps and never traps
      t, a, b = self.type_name(dt), s[0], s[1]
      if op is Ops.IDIV:
        neg = f"{b}==-1 ? {t}(0-{_UNSIGNED.get(dt, t)}({a})) : " if dt.kind == "i" else ""
        return f"({b}==0 ? {a} : {neg}{t}({a}/{b}))"
      return f"({b}==0" + (f" || {b}==-1" if dt.kind == "i" else "") + f" ? {t}(0) : {t}({a}%{b}))"
    if dt in _UNSIGNED and op in (Ops.ADD, Ops.SUB, Ops.MUL, Ops.NEG):  # wrap instead of signed overflow
      ut = _UNSIGNED[dt]
      if op is Ops.NEG: return f"{self.type_name(dt)}(0-{ut}({s[0]}))"
      return f"{self.type_name(dt)}({ut}({s[0]}){ {Ops.ADD: '+', Ops.SUB: '-', Ops.MUL: '*'}[op]}{ut}({s[1]}))"
    return super().alu(u, s)

  def special(self, kind: str, axis: int) -> str: return f"int({SPECIALS[kind][0]}.{'xyz'[axis]})"
  def barrier(self) -> str: return "threadgroup_barrier(mem_flags::mem_device | mem_flags::mem_threadgroup);"
  def shared_decl(self, name: str, dt: DType, count: int) -> str: return f"threadgroup {self.storage_type(dt)} {name}[{count}];"

  # ------------------------------------------------------------ vector access
  def vector_element(self, dt: DType) -> str: return self.storage_type(dt)  # bool's storage is uchar already
  def vector_type(self, dt: DType, width: int) -> str | None:
    return f"{el}{width}" if (el := self.vector_element(dt)) in _VECTORS else None
  def vector_load(self, vt: str, buf: str, idx: str) -> str: return f"*((const device {vt}*)({buf} + {idx}))"
  def vector_store(self, vt: str, buf: str, idx: str, value: str) -> str: return f"*((device {vt}*)({buf} + {idx})) = {value};"
  def vector_init(self, vt: str, lanes: Sequence[str]) -> str: return f"{vt}({', '.join(lanes)})"

  # ------------------------------------------------------------ the kernel
  def buffer_param(self, name: str, dt: DType, written: bool) -> str:
    return f"{'' if written else 'const '}device {self.storage_type(dt)}* {name}"

  def kernel(self, name: str, params: list[str], body: list[str], kernel: Kernel) -> str:
    names = self.param_names(kernel)
    nbufs = len(kernel.buffers)
    args = [f"{p} [[buffer({i})]]" for i, p in enumerate(params[:nbufs])]
    prologue = []
    for j, s in enumerate(kernel.scalars):
      n, dt = names[s], s.dtype
      if dt is dtypes.bool or dt in _HALVES:  # arrives in its storage type, held as bool / float
        args.append(f"constant {self.storage_type(dt)}& {n}_arg [[buffer({nbufs + j})]]")
        prologue.append(f"  {self.type_name(dt)} {n} = {self.from_storage(dt, n + '_arg')};")
      else: args.append(f"constant {self.type_name(dt)}& {n} [[buffer({nbufs + j})]]")
    args += [f"uint3 {p} [[{attr}]]" for p, attr in SPECIALS.values()]
    # threadgroup arrays must be declared at kernel scope, not inside a block
    shared = [line.strip() for line in body if line.lstrip().startswith("threadgroup ")]
    body = [line for line in body if not line.lstrip().startswith("threadgroup ")]
    lines = [f"// generated by plugrt: Metal kernel (MSL {msl_version_str(self.msl_version)})", "#include <metal_stdlib>",
             "using namespace metal;", f"kernel void {name}({', '.join(args)}) {{"]
    return "\n".join(lines + [f"  {d}" for d in shared] + prologue + body + ["}", ""])
