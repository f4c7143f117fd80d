"""Kernel IR -> OpenCL C, on the core's C-like renderer base: shared by plugrt-cl and plugrt-qcom (Qualcomm's OpenCL driver compiles it).

The generated kernel takes each buffer as a base pointer and a byte offset (views at
any offset, see plugrt_cl.device), then the scalars. Types are OpenCL's built-in
spellings only (`char`, `unsigned long`, ...), never the header's typedefs, so the
source also builds without OpenCL's 900 KB builtin header (see plugrt_cl.compiler).

dtypes:
- bool is stored as `unsigned char` (OpenCL forbids bool in kernel arguments and its size
  is the implementation's); scalar bool arguments arrive as `unsigned char`.
- float16 and bfloat16 are stored as `unsigned short` and computed in float, rounded back
  after every operation by exact conversions written here (round to nearest even, NaN kept
  quiet): this needs no cl_khr_fp16, runs the same on every device, and gives the results
  of native half arithmetic (float's 24 bits make the double rounding harmless for + - * /
  and sqrt). 64-bit sources convert to float16 in one rounding where the device has doubles.
- float64 needs cl_khr_fp64; without it, rendering a kernel that uses it raises
  RenderError naming the dtype and the device.
- images (dtypes.imagef/imageh) are `__read_only` or `__write_only image2d_t` parameters (OpenCL 1.2 has no
  read_write images, so a kernel that both reads and writes one image is refused), read with read_imagef through a
  sampler with unnormalised coordinates, clamp to edge and nearest filtering (the IR's TEXEL_LOAD), written with
  write_imagef. float16 images use read_imagef/write_imagef too: OpenCL converts CL_HALF_FLOAT texels to and from
  float exactly (a value rounded to half is stored as that half), and the renderer holds float16 values as float
  anyway, so no cl_khr_fp16 (read_imageh) is needed. An image takes two kernel arguments like a buffer, the second
  an unused offset, so that programs set every buffer argument the same way.
- vector access (VLOAD/VSTORE) is a load or store through a pointer to OpenCL's vector type of the storage type
  (`__global const float4*`; bool's storage as uchar4): the IR guarantees the alignment. Without the builtin header the
  vector types are declared here (clang's ext_vector_type, what the header does).
- integers wrap: signed + - * and negation are done on the unsigned type (OpenCL, unlike
  plugrt's CPU backend, cannot be told -fwrapv); a zero divisor and MIN / -1 are guarded,
  since PoCL runs on the CPU, whose division traps (SIGFPE would kill the interpreter).
"""
from __future__ import annotations

from collections.abc import Sequence

from plugrt.compiler.ir import Kernel, Ops, UOp
from plugrt.compiler.renderer.cstyle import CStyleRenderer, vector_uses
from plugrt.dtype import DType, ImageDType, dtypes

_EMULATED = {dtypes.float16: ("plugrt_h2f", "plugrt_f2h", "plugrt_rh"), dtypes.bfloat16: ("plugrt_bf2f", "plugrt_f2bf", "plugrt_rbf")}
# the name OpenCL's as_<type>() reinterpretations use for each storage type
_AS = {"char": "char", "signed char": "char", "unsigned char": "uchar", "short": "short", "unsigned short": "ushort", "int": "int",
       "unsigned int": "uint", "long": "long", "unsigned long": "ulong", "float": "float", "double": "double"}
_UNSIGNED = {dtypes.int32: "unsigned int", dtypes.int64: "unsigned long"}
# OpenCL's short type names as the spellings the bare prelude may use (no typedefs of the header)
_BARE_TYPE = {"uchar": "unsigned char", "ushort": "unsigned short", "uint": "unsigned int", "ulong": "unsigned long"}

#: What the kernel needs from OpenCL's builtin header, declared by hand. Used only when the compiler
#: skips that header (PoCL: parsing it is most of a build); identical to the header's declarations.
BARE_PRELUDE = """\
#ifdef PLUGRT_BARE_BUILTINS
#define PLUGRT_F __attribute__((overloadable, const))
unsigned long PLUGRT_F get_group_id(unsigned int);
unsigned long PLUGRT_F get_local_id(unsigned int);
unsigned long PLUGRT_F get_num_groups(unsigned int);
unsigned long PLUGRT_F get_local_size(unsigned int);
void __attribute__((overloadable, convergent)) barrier(unsigned int);
float PLUGRT_F exp2(float); float PLUGRT_F log2(float); float PLUGRT_F sin(float); float PLUGRT_F sqrt(float); float PLUGRT_F trunc(float);
#ifdef PLUGRT_FP64
double PLUGRT_F exp2(double); double PLUGRT_F log2(double); double PLUGRT_F sin(double); double PLUGRT_F sqrt(double);
double PLUGRT_F trunc(double);
#ifndef as_double
#define as_double(x) __builtin_astype((x), double)
#endif
#ifndef as_long
#define as_long(x) __builtin_astype((x), long)
#endif
#ifndef as_ulong
#define as_ulong(x) __builtin_astype((x), unsigned long)
#endif
#endif
#ifdef PLUGRT_IMAGES
float4 __attribute__((overloadable, pure)) read_imagef(__read_only image2d_t, sampler_t, int2);
void __attribute__((overloadable)) write_imagef(__write_only image2d_t, int2, float4);
#endif
#ifndef CLK_LOCAL_MEM_FENCE
#define CLK_LOCAL_MEM_FENCE 0x01
#endif
#ifndef CLK_GLOBAL_MEM_FENCE
#define CLK_GLOBAL_MEM_FENCE 0x02
#endif
#ifndef CLK_NORMALIZED_COORDS_FALSE
#define CLK_NORMALIZED_COORDS_FALSE 0
#endif
#ifndef CLK_ADDRESS_CLAMP_TO_EDGE
#define CLK_ADDRESS_CLAMP_TO_EDGE 2
#endif
#ifndef CLK_FILTER_NEAREST
#define CLK_FILTER_NEAREST 0x10
#endif
#ifndef INFINITY
#define INFINITY __builtin_inff()
#endif
#ifndef NAN
#define NAN __builtin_nanf("")
#endif
#ifndef as_char
#define as_char(x) __builtin_astype((x), char)
#endif
#ifndef as_uchar
#define as_uchar(x) __builtin_astype((x), unsigned char)
#endif
#ifndef as_short
#define as_short(x) __builtin_astype((x), short)
#endif
#ifndef as_ushort
#define as_ushort(x) __builtin_astype((x), unsigned short)
#endif
#ifndef as_int
#define as_int(x) __builtin_astype((x), int)
#endif
#ifndef as_uint
#define as_uint(x) __builtin_astype((x), unsigned int)
#endif
#ifndef as_float
#define as_float(x) __builtin_astype((x), float)
#endif
#endif
"""

# float16 <-> float. f2h: normal halves round the float's bits (add half an ulp of the
# result, plus one when the kept bit is odd: ties to even); subnormal halves are the sum
# |x| + 0.5f, whose ulp (2^-24) is the half subnormal step, so the FPU does the rounding.
HALF_HELPERS = """\
float plugrt_h2f(unsigned short h) {
  unsigned int s = (unsigned int)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1fu) return as_float(s | 0x7f800000u | (m << 13));
  if (e != 0u) return as_float(s | ((e + 112u) << 23) | (m << 13));
  float f = (float)m * 5.9604644775390625e-8f;  /* m * 2^-24, exact */
  return s ? -f : f;
}
unsigned short plugrt_f2h(float x) {
  unsigned int u = as_uint(x), s = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (unsigned short)(s | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= 0x477ff000u) return (unsigned short)(s | 0x7c00u);
  if (a >= 0x38800000u) { a -= 0x38000000u; a += 0xfffu + ((a >> 13) & 1u); return (unsigned short)(s | (a >> 13)); }
  return (unsigned short)(s | (as_uint(as_float(a) + 0.5f) - 0x3f000000u));
}
float plugrt_rh(float x) { return plugrt_h2f(plugrt_f2h(x)); }
"""

# double -> float16 in one rounding (through float would round twice); 2^28's ulp is 2^-24
HALF_FP64_HELPERS = """\
unsigned short plugrt_d2h(double x) {
  unsigned long u = as_ulong(x), a = u & 0x7fffffffffffffffUL;
  unsigned int s = (unsigned int)(u >> 48) & 0x8000u;
  if (a > 0x7ff0000000000000UL) return (unsigned short)(s | 0x7e00u | (unsigned int)((a >> 42) & 0x3ffu));
  if (a >= 0x40effe0000000000UL) return (unsigned short)(s | 0x7c00u);
  if (a >= 0x3f10000000000000UL) {
    a -= 0x3f00000000000000UL; a += 0x1ffffffffffUL + ((a >> 42) & 1UL); return (unsigned short)(s | (unsigned int)(a >> 42));
  }
  return (unsigned short)(s | (unsigned int)(as_ulong(as_double(a) + 268435456.0) - 0x41b0000000000000UL));
}
"""

BF16_HELPERS = """\
float plugrt_bf2f(unsigned short b) { return as_float((unsigned int)b << 16); }
unsigned short plugrt_f2bf(float x) {
  unsigned int u = as_uint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
  return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
float plugrt_rbf(float x) { return plugrt_bf2f(plugrt_f2bf(x)); }
"""

# OpenCL C keywords, builtin type names and this file's helpers: parameters so named are renamed
_RESERVED = frozenset({
  "kernel", "__kernel", "global", "local", "constant", "private", "read_only", "write_only", "read_write", "uniform", "pipe",
  "bool", "half", "uchar", "ushort", "uint", "ulong", "size_t", "ptrdiff_t", "intptr_t", "uintptr_t", "image2d_t", "image3d_t",
  "sampler_t", "event_t", "char", "short", "int", "long", "float", "double", "void", "signed", "unsigned", "const", "restrict",
  "volatile", "static", "extern", "inline", "if", "else", "for", "while", "do", "return", "switch", "case", "default", "break",
  "continue", "goto", "sizeof", "struct", "union", "enum", "typedef", "auto", "register", "true", "false", "NAN", "INFINITY",
  "barrier", "get_group_id", "get_local_id", "get_num_groups", "get_local_size", "exp2", "log2", "sin", "sqrt", "trunc",
  "plugrt_h2f", "plugrt_f2h", "plugrt_rh", "plugrt_d2h", "plugrt_bf2f", "plugrt_f2bf", "plugrt_rbf", "plugrt_smp", "read_imagef",
  "write_imagef", *(f"{t}{n}" for t in ("char", "uchar", "short", "ushort", "int", "uint", "long", "ulong", "float", "double", "half")
                     for n in (2, 4)), "__read_only", "__write_only", "__read_write", "__constant", "__global", "__local", "__private"})

#: the sampler of TEXEL_LOAD: integer coordinates, clamped to the edge, no filtering
SAMPLER = "__constant sampler_t plugrt_smp = CLK_NORMALIZED_COORDS_FALSE | CLK_ADDRESS_CLAMP_TO_EDGE | CLK_FILTER_NEAREST;"


class OpenCLRenderer(CStyleRenderer):
  language = "OpenCL C"
  bool_type = "bool"
  reserved = _RESERVED
  supports_images = True

  def __init__(self, device_name: str = "CL", fp64: bool = True):
    self.device_name, self.fp64 = device_name, fp64
    self.unsupported = frozenset() if fp64 else frozenset({dtypes.float64})

  # ------------------------------------------------------------ types and values
  def type_name(self, dt: DType) -> str:
    if dt in _EMULATED: return "float"
    return {dtypes.int8: "char", dtypes.int64: "long", dtypes.uint64: "unsigned long"}.get(dt) or super().type_name(dt)

  def storage_type(self, dt: DType) -> str:
    if dt is dtypes.bool: return "unsigned char"
    return "unsigned short" if dt in _EMULATED else self.type_name(dt)

  def from_storage(self, dt: DType, expr: str) -> str:
    if dt is dtypes.bool: return f"({expr}!=0)"
    return f"{_EMULATED[dt][0]}({expr})" if dt in _EMULATED else expr

  def to_storage(self, dt: DType, expr: str) -> str:
    if dt is dtypes.bool: return f"((unsigned char)({expr}))"
    return f"{_EMULATED[dt][1]}({expr})" if dt in _EMULATED else expr

  def round_to(self, dt: DType, expr: str) -> str: return f"{_EMULATED[dt][2]}({expr})" if dt in _EMULATED else expr

  def literal(self, x: object, dt: DType) -> str:
    if dt in _EMULATED: return self.float_literal(x, dtypes.float32)  # type: ignore[arg-type]  # the value is exact in float
    if dt is dtypes.int64: return "(-9223372036854775807L-1)" if x == dt.min else f"{x}L"
    if dt is dtypes.uint64: return f"{x}UL"
    return super().literal(x, dt)

  def cast_expr(self, x: str, src: DType, dt: DType) -> str:
    if dt is dtypes.float16 and self.fp64 and src in (dtypes.float64, dtypes.int64, dtypes.uint64):
      return f"plugrt_h2f(plugrt_d2h((double)({x})))"
    if dt in _EMULATED: return f"((float)({x}))"
    return super().cast_expr(x, src, dt)

  def bitcast_stmt(self, name: str, x: str, src: DType, dt: DType) -> list[str]:
    if src is dtypes.bool or dt is dtypes.bool:  # bool's bits are 0 or 1
      return [f"{self.type_name(dt)} {name} = {self.cast_expr(x, src, dt)};"]
    bits = self.to_storage(src, x) if src in _EMULATED else x
    raw = f"as_{_AS[self.storage_type(dt)]}({bits})"
    return [f"{self.type_name(dt)} {name} = {self.from_storage(dt, raw) if dt in _EMULATED else raw};"]

  # ------------------------------------------------------------ ops
  def alu(self, u: UOp, s: Sequence[str]) -> str:
    dt = u.dtype
    if u.op in (Ops.IDIV, Ops.MOD):  # guard what traps on a CPU: a zero divisor and MIN / -1 (the IR wraps, never traps)
      t, a, b = self.type_name(dt), s[0], s[1]
      if u.op is Ops.IDIV:
        neg = f"{b}==-1 ? ({t})(0-({_UNSIGNED.get(dt, t)})({a})) : " if dt.kind == "i" else ""
        return f"({b}==0 ? {a} : {neg}({t})({a}/{b}))"
      return f"({b}==0" + (f" || {b}==-1" if dt.kind == "i" else "") + f" ? ({t})0 : ({t})({a}%{b}))"
    if dt in _UNSIGNED and u.op in (Ops.ADD, Ops.SUB, Ops.MUL, Ops.NEG):  # wrap instead of signed overflow (undefined in OpenCL C)
      ut = _UNSIGNED[dt]
      if u.op is Ops.NEG: return f"(({self.type_name(dt)})(0-({ut})({s[0]})))"
      sym = {Ops.ADD: "+", Ops.SUB: "-", Ops.MUL: "*"}[u.op]
      return f"(({self.type_name(dt)})(({ut})({s[0]}){sym}({ut})({s[1]})))"
    return super().alu(u, s)

  def special(self, kind: str, axis: int) -> str: return f"((int)get_{kind}({axis}))"
  def barrier(self) -> str: return "barrier(CLK_LOCAL_MEM_FENCE|CLK_GLOBAL_MEM_FENCE);"
  def shared_decl(self, name: str, dt: DType, count: int) -> str: return f"__local {self.storage_type(dt)} {name}[{count}];"

  # ------------------------------------------------------------ vector access
  def vector_type(self, dt: DType, width: int) -> str: return f"{_AS[self.vector_element(dt)]}{width}"
  def vector_load(self, vt: str, buf: str, idx: str) -> str: return f"*((__global const {vt}*)({buf} + {idx}))"
  def vector_store(self, vt: str, buf: str, idx: str, value: str) -> str: return f"*((__global {vt}*)({buf} + {idx})) = {value};"
  def vector_lane(self, v: str, lane: int) -> str: return f"{v}.s{lane}"
  def vector_init(self, vt: str, lanes: Sequence[str]) -> str: return f"({vt})({', '.join(lanes)})"

  # ------------------------------------------------------------ images
  def image_param(self, name: str, img: ImageDType, written: bool) -> str:
    return f"{'__write_only' if written else '__read_only'} image2d_t {name}"
  def texel_load(self, image: str, x: str, y: str, channel: int, img: ImageDType) -> str:
    return f"read_imagef({image}, plugrt_smp, (int2)({x}, {y})).s{channel}"
  def texel_store(self, image: str, x: str, y: str, rgba: Sequence[str], img: ImageDType) -> str:
    return f"write_imagef({image}, (int2)({x}, {y}), (float4)({', '.join(rgba)}));"

  # ------------------------------------------------------------ the kernel
  def buffer_param(self, name: str, dt: DType, written: bool) -> str:
    return f"__global {'' if written else 'const '}{self.storage_type(dt)}* {name}"

  def kernel(self, name: str, params: list[str], body: list[str], kernel: Kernel) -> str:
    used = {u.dtype for u in kernel.uops if isinstance(u.dtype, DType)} | {u.dtype.base for u in kernel.uops if hasattr(u.dtype, "base")}
    names = self.param_names(kernel)
    taken = set(names.values())
    def fresh(base: str) -> str:
      while base in taken: base += "_"
      taken.add(base)
      return base
    args, prologue = [], []
    for p, b in zip(params[:len(kernel.buffers)], kernel.buffers):  # (base, byte offset) -> the typed pointer the body uses
      ptype, n = p.rsplit(" ", 1)
      if isinstance(b.dtype.base, ImageDType):  # the image itself, and an offset argument that is never read
        args += [p, f"unsigned long {fresh(f'{n}_off')}"]
        continue
      base_n, off_n = fresh(f"{n}_base"), fresh(f"{n}_off")
      args += [f"{ptype} {base_n}", f"unsigned long {off_n}"]
      cptr = "__global const char*" if "const " in ptype else "__global char*"
      prologue.append(f"  {ptype} {n} = ({ptype})(({cptr}){base_n} + {off_n});")
    for s in kernel.scalars:
      n, dt = names[s], s.dtype
      if dt is dtypes.bool or dt in _EMULATED:  # not allowed (bool) or not computable (half) as a kernel argument: its bits
        arg = fresh(f"{n}_bits")
        args.append(f"{self.storage_type(dt)} {arg}")
        prologue.append(f"  {self.type_name(dt)} {n} = {self.from_storage(dt, arg)};")
      else: args.append(self.scalar_param(n, dt))
    # __local arrays must be declared at kernel scope, not inside a block
    local = [line.strip() for line in body if line.lstrip().startswith("__local ")]
    body = [line for line in body if not line.lstrip().startswith("__local ")]
    lines = ["/* generated by plugrt: OpenCL kernel */", "#pragma OPENCL FP_CONTRACT OFF"]  # one rounding per op, as the IR says
    if self.fp64: lines += ["#ifdef cl_khr_fp64", "#pragma OPENCL EXTENSION cl_khr_fp64 : enable", "#define PLUGRT_FP64", "#endif"]
    if kernel.images: lines.append("#define PLUGRT_IMAGES")
    # the vector types the kernel uses (and the images' int2 and float4), which the builtin header would declare
    vtypes = {self.vector_type(dt, w): (_AS[self.vector_element(dt)], w) for dt, w in vector_uses(kernel)}
    if kernel.images: vtypes.update({"int2": ("int", 2), "float4": ("float", 4)})
    if vtypes:
      lines += ["#ifdef PLUGRT_BARE_BUILTINS", *(f"typedef {_BARE_TYPE.get(t, t)} {n} __attribute__((ext_vector_type({w})));"
                                                 for n, (t, w) in vtypes.items()), "#endif"]
    lines.append(BARE_PRELUDE)
    if kernel.images: lines.append(SAMPLER)
    if dtypes.float16 in used:
      lines.append(HALF_HELPERS)
      if self.fp64: lines.append(HALF_FP64_HELPERS)
    if dtypes.bfloat16 in used: lines.append(BF16_HELPERS)
    lines.append(f"__kernel void {name}({', '.join(args)}) {{")
    lines += [f"  {d}" for d in local] + prologue + body + ["}", ""]
    return "\n".join(lines)
