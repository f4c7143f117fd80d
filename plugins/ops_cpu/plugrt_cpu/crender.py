"""Kernel IR -> C for the CPU (clang), on the core's C-like renderer base.

The kernel is first lowered (plugrt.compiler.lowering.serialize_groups) so that one call runs
one group. The generated function has the CPU calling convention shared with the LLVM
renderer (see plugrt_cpu.program):

    void NAME(const unsigned long long *args, unsigned int gid0, unsigned int gid1, unsigned int gid2)

args holds the buffer addresses, then one 8-byte slot per scalar, then the number of
groups and the group size per axis; the function runs group (gid0, gid1, gid2). It has
no loop over the grid (that loop, costly to compile into every kernel, is
plugrt_cpu.grid's runner, compiled once). float16 and bfloat16 values are held as float and rounded after every
operation, with exact conversions of our own (no compiler runtime needed). Vector loads and stores (VLOAD/VSTORE) go
through GNU C's vector_size types (clang and gcc both take them) aligned only to an element: one unaligned vector move
(movups), so that a vector access the caller failed to align still reads and writes the right elements on the CPU.
"""
from __future__ import annotations

from plugrt.compiler.ir import Kernel, Ops
from plugrt.compiler.lowering import THREAD_LOOP, serialize_groups
from plugrt.compiler.renderer.cstyle import CStyleRenderer, vector_uses
from plugrt.dtype import DType, dtypes
from plugrt.errors import RenderError

HALF_HELPERS = r"""
static inline float __plugrt_h2f(unsigned short h) {
  unsigned int s = (unsigned int)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, u;
  if (e == 0x1fu) u = s | 0x7f800000u | (m << 13);
  else if (e) u = s | ((e + 112u) << 23) | (m << 13);
  else if (m) { e = 113u; while (!(m & 0x400u)) { m <<= 1; e--; } u = s | (e << 23) | ((m & 0x3ffu) << 13); }
  else u = s;
  float f; __builtin_memcpy(&f, &u, 4); return f;
}
static inline unsigned short __plugrt_f2h(float f) {
  unsigned int u; __builtin_memcpy(&u, &f, 4);
  unsigned int s = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (unsigned short)(s | 0x7e00u | ((a >> 13) & 0x3ffu));  /* NaN stays a quiet NaN */
  if (a >= 0x477ff000u) return (unsigned short)(s | 0x7c00u);                         /* rounds past 65504: inf */
  if (a >= 0x38800000u) { unsigned int r = a - 0x38000000u; r += 0xfffu + ((r >> 13) & 1u); return (unsigned short)(s | (r >> 13)); }
  if (a < 0x33000000u) return (unsigned short)s;                                     /* below half the smallest subnormal */
  unsigned int e = a >> 23, m = (a & 0x7fffffu) | 0x800000u, sh = 126u - e;
  unsigned int q = m >> sh, rem = m & ((1u << sh) - 1u), half = 1u << (sh - 1u);
  q += (rem > half) || (rem == half && (q & 1u));
  return (unsigned short)(s | q);
}
static inline float __plugrt_rh(float x) { return __plugrt_h2f(__plugrt_f2h(x)); }
static inline unsigned short __plugrt_d2h(double d) {  /* one rounding from double (through float would round twice) */
  unsigned long long u; __builtin_memcpy(&u, &d, 8);
  unsigned int s = (unsigned int)(u >> 48) & 0x8000u; unsigned long long a = u & 0x7fffffffffffffffULL;
  if (a > 0x7ff0000000000000ULL) return (unsigned short)(s | 0x7e00u | ((a >> 42) & 0x3ffu));
  if (a >= 0x40effe0000000000ULL) return (unsigned short)(s | 0x7c00u);
  if (a >= 0x3f10000000000000ULL) {
    unsigned long long r = a - 0x3f00000000000000ULL; r += 0x1ffffffffffULL + ((r >> 42) & 1u); return (unsigned short)(s | (r >> 42));
  }
  if (a < 0x3e60000000000000ULL) return (unsigned short)s;
  unsigned long long e = a >> 52, m = (a & 0xfffffffffffffULL) | 0x10000000000000ULL; unsigned int sh = (unsigned int)(1051u - e);
  unsigned long long q = m >> sh, rem = m & ((1ULL << sh) - 1u), half = 1ULL << (sh - 1u);
  q += (rem > half) || (rem == half && (q & 1u));
  return (unsigned short)(s | q);
}
"""

BF16_HELPERS = r"""
static inline float __plugrt_bf2f(unsigned short b) { unsigned int u = (unsigned int)b << 16; float f; __builtin_memcpy(&f, &u, 4); return f; }
static inline unsigned short __plugrt_f2bf(float f) {
  unsigned int u; __builtin_memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
  return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static inline float __plugrt_rbf(float x) { return __plugrt_bf2f(__plugrt_f2bf(x)); }
"""

# a loop clang should neither unroll nor vectorise: the outer thread loops
PLAIN_LOOP = '_Pragma("clang loop unroll(disable) vectorize(disable)") '
_EMULATED = {dtypes.float16: ("__plugrt_h2f", "__plugrt_f2h", "__plugrt_rh"), dtypes.bfloat16: ("__plugrt_bf2f", "__plugrt_f2bf", "__plugrt_rbf")}


class CPUCRenderer(CStyleRenderer):
  language = "C"
  emulated = _EMULATED
  c_math = "__builtin_"  # clang's builtin spellings of C's math library (__builtin_sinf, __builtin_fmaxf, ...)
  device_name = "CPU"
  reserved = frozenset({"args", "gid0_", "gid1_", "gid2_"})

  def float_literal(self, x: float, dt: DType) -> str:
    f = "" if dt is dtypes.float64 else "f"
    if x != x: return f"__builtin_nan{f}(\"\")"
    if x in (float("inf"), float("-inf")): return ("-" if x < 0 else "") + f"__builtin_inf{f}()"
    return repr(float(x)) + f

  def cast_expr(self, x: str, src: DType, dt: DType) -> str:
    if dt is dtypes.float16 and src in (dtypes.float64, dtypes.int64, dtypes.uint64): return f"__plugrt_h2f(__plugrt_d2h((double)({x})))"
    return super().cast_expr(x, src, dt)

  def alu(self, u, s) -> str:
    if u.op in (Ops.IDIV, Ops.MOD):  # x86 traps on a zero divisor and on MIN / -1: the IR wraps instead, and never traps
      dt, t, a, b = u.dtype, self.type_name(u.dtype), s[0], s[1]
      if u.op is Ops.IDIV: return f"({b}==0 ? {a} : " + (f"{b}==-1 ? ({t})(0-{a}) : " if dt.kind == "i" else "") + f"({t})({a}/{b}))"
      return f"({b}==0" + (f" || {b}==-1" if dt.kind == "i" else "") + f" ? ({t})0 : ({t})({a}%{b}))"
    return super().alu(u, s)

  # GNU C's vector_size (clang's and gcc's: CC may name either), aligned only to an element, lanes by subscript
  def vector_type(self, dt: DType, width: int) -> str: return self.clang_vector_type(dt, width)
  def vector_typedefs(self, kernel: Kernel) -> list[str]:
    return [f"typedef {self.vector_element(dt)} {self.clang_vector_type(dt, w)} __attribute__((vector_size({w * dt.itemsize}), "
            f"aligned({dt.itemsize})));" for dt, w in vector_uses(kernel)]
  def vector_lane(self, v: str, lane: int) -> str: return f"{v}[{lane}]"

  def loop_prefix(self, rng) -> str:
    # the outer thread loops (y, z) rarely run more than once: optimising them only costs compile time
    return PLAIN_LOOP if rng.arg in (THREAD_LOOP + (1,), THREAD_LOOP + (2,)) else ""

  def special(self, kind: str, axis: int) -> str:
    if kind == "local_id": raise RenderError("CPU renderer got a kernel with local_id: lower it with serialize_groups first")
    return {"group_id": "gid", "num_groups": "ng", "local_size": "ls"}[kind] + str(axis)

  def barrier(self) -> str: raise RenderError("CPU renderer got a kernel with a barrier: lower it with serialize_groups first")
  def spill_decl(self, name: str, dt: DType, count: str) -> str: return f"{self.storage_type(dt)} {name}[{count}];"

  def render(self, kernel: Kernel) -> str:
    if any(u.op is Ops.SPECIAL and u.arg[0] == "local_id" for u in kernel.uops) or kernel.has_barrier:
      kernel = serialize_groups(kernel)
    return super().render(kernel)

  def kernel(self, name: str, params: list[str], body: list[str], kernel: Kernel) -> str:
    used = {u.dtype for u in kernel.uops if u.dtype is not None} | {u.dtype.base for u in kernel.uops if hasattr(u.dtype, "base")}
    lines = ["/* generated by plugrt: CPU kernel */"]
    if dtypes.float16 in used: lines.append(HALF_HELPERS)
    if dtypes.bfloat16 in used: lines.append(BF16_HELPERS)
    lines.append(f"void {name}(const unsigned long long *args, unsigned int gid0_, unsigned int gid1_, unsigned int gid2_) {{")
    nb, ns = len(kernel.buffers), len(kernel.scalars)
    names = self.param_names(kernel)
    for i, p in enumerate(params[:nb]):
      lines.append(f"  {p} = ({p.rsplit(' ', 1)[0]})args[{i}];")
    for j, s in enumerate(kernel.scalars):
      n, dt, slot = names[s], s.dtype, f"args[{nb + j}]"
      if dt is dtypes.bool: lines.append(f"  _Bool {n} = {slot} != 0;")
      elif dt in self.emulated: lines.append(f"  float {n} = {self.from_storage(dt, f'(unsigned short){slot}')};")
      elif dt.kind == "f": lines.append(f"  {self.type_name(dt)} {n}; __builtin_memcpy(&{n}, &{slot}, sizeof({n}));")
      else: lines.append(f"  {self.type_name(dt)} {n} = ({self.type_name(dt)}){slot};")
    dims = nb + ns
    lines.append(f"  const int ng0 = (int)args[{dims}], ng1 = (int)args[{dims + 1}], ng2 = (int)args[{dims + 2}];")
    lines.append(f"  const int ls0 = (int)args[{dims + 3}], ls1 = (int)args[{dims + 4}], ls2 = (int)args[{dims + 5}];")
    lines.append("  const int gid0 = (int)gid0_, gid1 = (int)gid1_, gid2 = (int)gid2_;")
    lines.append("  (void)ng0; (void)ng1; (void)ng2; (void)ls0; (void)ls1; (void)ls2; (void)gid0; (void)gid1; (void)gid2;")
    lines += body
    lines += ["}", ""]
    return "\n".join(lines)
