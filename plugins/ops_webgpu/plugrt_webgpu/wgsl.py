"""Kernel IR -> WGSL.

WGSL is not C: values are typed `let`s, there are no 8/16/64-bit integers, f16 needs
an extension, storage buffers hold only 32-bit scalars, workgroup sizes are
pipeline constants and barriers must sit in uniform control flow. So this renderer
stands on its own rather than on the core's C-like base.

How each IR dtype is held:

| IR dtype                 | a value is         | in a buffer                                   |
| ------------------------ | ------------------ | --------------------------------------------- |
| bool, int8, uint8        | bool / i32 / u32   | packed 4 per u32 word                         |
| int16, uint16, bfloat16  | i32 / u32 / f32    | packed 2 per u32 word                         |
| float16                  | f16 (shader-f16)   | packed 2 per u32 word                         |
| int32, uint32, float32   | i32 / u32 / f32    | one u32 word (bitcast)                        |
| int64, uint64, float64   | RenderError: WGSL has no 64-bit types                              |

Every storage buffer is declared `array<u32>` (or `array<atomic<u32>>` when a packed
dtype is written: stores clear and set their own bits with atomicAnd/atomicOr, so
threads writing neighbouring bytes of one word never lose each other's stores).
Small integers wrap after every op (sign- or zero-extension), bfloat16 rounds to
nearest even after every op, so results match the IR's per-op rounding.

Floats: WGSL lets compilers assume finite math. On lavapipe (both engines) a float `!=`
is false when a side is NaN and `x != x` folds to false, so CMPNE on floats and casts of
floats to bool test NaN through the bits (`pr_nan`). SIN is a routine of its own
(`pr_sin`, see `_sin_wgsl`): WGSL's sin is accurate only near [-pi, pi]. Drivers also
fold `x - x` and `x * 0` to 0 and reassociate additions ((a + b) - a becomes b; lavapipe
and NVIDIA), so no helper relies on compensated arithmetic.

Buffers are reached through accessor functions (`ldK`/`stK`) that add the view's
offset, read from the uniform buffer. They sit between two marker comments, so a
program can re-emit that section when two arguments are views of one allocation:
WebGPU forbids binding one buffer twice when either binding is writable (Dawn
enforces it), so aliased arguments share one binding (see `specialize`).

Vector access (VLOAD/VSTORE) is rendered an element at a time through the same accessors: a storage buffer is an
array<u32> here (packed dtypes share its words), which WGSL can only read and write a word at a time; the results are
the same, and the compiler may merge neighbouring words.

The first line is a header the program reads back (entry point, buffer kinds,
scalar count): the compiled "binary" of a WGSL kernel is this text.
"""
from __future__ import annotations

import copy
import math
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from plugrt.compiler.ir import Kernel, Ops, UOp
from plugrt.compiler.renderer import floatmath
from plugrt.dtype import DType, PtrDType, dtypes
from plugrt.errors import RenderError

HEADER = "// plugrt-wgsl 1"
BEGIN, END = "// plugrt-buffers-begin", "// plugrt-buffers-end"
WIDE = frozenset({dtypes.int64, dtypes.uint64, dtypes.float64})
_AXES = "xyz"
_INFIX = {Ops.ADD: "+", Ops.SUB: "-", Ops.MUL: "*", Ops.DIV: "/", Ops.IDIV: "/", Ops.MOD: "%", Ops.AND: "&", Ops.OR: "|",
          Ops.XOR: "^", Ops.CMPLT: "<", Ops.CMPLE: "<=", Ops.CMPEQ: "==", Ops.CMPNE: "!="}
_MATH = {Ops.EXP2: "exp2", Ops.LOG2: "log2", Ops.SQRT: "sqrt", Ops.TRUNC: "trunc"}


def _f32(x: float) -> str:
  """An exact float32 as a WGSL literal (the shortest double repr rounds back to the same float32)."""
  assert struct.unpack("<f", struct.pack("<f", x))[0] == x, x
  return f"{x!r}f"


def _sin_wgsl() -> str:
  """pr_sin: float32 sine over the whole range. WGSL's sin promises 2^-11 absolute inside [-pi, pi] and nothing
  outside (lavapipe: sin(2.1e9) = -1.0, not 0.044), so the argument is reduced here modulo pi/2, to r and quadrant q:
  - |x| <= pi/4: no reduction, the sin polynomial alone (the cheap path); below 2^-12 sin x rounds to x itself
    (which keeps -0 and subnormals);
  - |x| < 4096, Cody-Waite: k = rint(|x| * 2/pi) < 2^12 and pi/2 in 12-bit parts p1..p4 and a rounded p5, so every
    k * p_i (i <= 4) is exact and r2 = |x| - k p1 - k p2 is too. The rest is subtracted in three ways, and the one
    whose rounding is harmless for the size of r is taken: all at once (|r| >= 2^-12), p3 first then p4 + p5
    (|r| >= 2^-24: r - k p3 is exact below 2^-11), or part by part (each exact while r is that small; the float32
    worst case below 4096 is |r| = 2^-27.8, at 252.8982). No fma (WGSL's may be unfused) and no two-sum (folded);
  - larger |x|, Payne-Hanek in integers: |x| = m 2^E, |x| * 2/pi mod 4 is m times 96 bits of 2/pi from bit E - 1,
    mod 2^96, in 16-bit limbs (WGSL has no 64-bit integers). The fraction keeps 94 bits (the float32 worst case
    is 2^-29.86 of a quadrant, at 16367173 * 2^72); its top 48 times pi/2, in integers too, give r = rh + rl.
  Then minimax polynomials on [-0.7856, 0.7856] (Remez fits of the relative error, 6.5e-9 for sin and 2.6e-10 for
  cos, coefficients rounded to float32; cos with 1 - a^2/2 exact), the quadrant and the sign through the bits; inf
  and NaN give NaN from the bits (x - x folds to 0). Against float64 sin, every positive float32 on lavapipe: at
  most 0.76 ulp up to pi/4, 1.59 ulp below 4096, 1.03 ulp above (NVIDIA, sampled: the same figures). What it costs
  against WGSL's own sin: docs/performance.md."""
  pio2 = floatmath.pi_fixed(400) >> 1  # pi/2 * 2^400
  parts = [math.ldexp(pio2 >> (389 - 12 * i) & 0xfff, -11 - 12 * i) for i in range(4)]  # bits 2^0..2^-11, 2^-12..2^-23, ...
  rest = floatmath.round_f32_ratio(pio2 & ((1 << 353) - 1), 1 << 400)  # pi/2 below 2^-47, rounded once
  c1, c2, c3, c4, c5 = (_f32(c) for c in (*parts, rest))
  pad, words = 16, 7  # the table: 16 zero bits, then the bits of 2/pi; b_(E-1) of the largest float32 is at bit 118
  table = ", ".join(f"{w:#010x}u" for w in floatmath.two_over_pi_words(words, 32, pad, 400))
  p = round(math.ldexp(pio2, 31 - 400))  # pi/2 * 2^31
  s1, s2, s3 = -0.16666655242443085, 0.00833209976553917, -0.00019503790827002376
  sin_poly = f"({_f32(s1)} + z * ({_f32(s2)} + z * {_f32(s3)}))"
  k1, k2, k3 = 0.041666653007268906, -0.0013887652894482017, 2.4463664885843173e-05
  return "\n".join([
    f"const pr_2opi = array<u32, {words}>({table});",
    "fn pr_sin(x: f32) -> f32 {",
    "  let u = bitcast<u32>(x);",
    "  let au = u & 0x7fffffffu;",
    f"  if (au <= {floatmath.f32_bits(floatmath.round_f32_ratio(floatmath.pi_fixed(400), 1 << 402)):#010x}u) {{",  # |x| <= pi/4
    "    let z = x * x;",
    f"    return select(x + x * z * {sin_poly}, x, au < {floatmath.f32_bits(floatmath.SIN_F32_EXACT_BELOW):#010x}u);",
    "  }",
    "  if (au >= 0x7f800000u) { return bitcast<f32>(u | 0x7fc00000u); }",
    "  let ax = bitcast<f32>(au);",
    "  var rh: f32;",
    "  var rl = 0.0f;",
    "  var q: u32;",
    "  if (au >= 0x45800000u) {",
    "    let m = (au & 0x7fffffu) | 0x800000u;",
    f"    let g = (au >> 23u) - {150 - pad + 2}u;",  # table bit of b_(E-1), E = exponent - 150
    "    let j = g >> 5u; let sh = g & 31u; let rs = 31u - sh;",
    "    let t0 = pr_2opi[j]; let t1 = pr_2opi[j + 1u]; let t2 = pr_2opi[j + 2u]; let t3 = pr_2opi[j + 3u];",
    # 96 bits from b_(E-1): earlier bits add multiples of 4, later ones less than 2^-70; `>> 32u` would shift by 0
    "    let w0 = (t0 << sh) | ((t1 >> 1u) >> rs); let w1 = (t1 << sh) | ((t2 >> 1u) >> rs); let w2 = (t2 << sh) | ((t3 >> 1u) >> rs);",
    "    let ml = m & 0xffffu; let mh = m >> 16u;",  # m * w mod 2^96, column by column in 16-bit limbs
    "    let a0 = ml * (w2 & 0xffffu); let a1 = ml * (w2 >> 16u); let a2 = ml * (w1 & 0xffffu);",
    "    let a3 = ml * (w1 >> 16u); let a4 = ml * (w0 & 0xffffu); let a5 = ml * (w0 >> 16u);",
    "    let b0 = mh * (w2 & 0xffffu); let b1 = mh * (w2 >> 16u); let b2 = mh * (w1 & 0xffffu);",
    "    let b3 = mh * (w1 >> 16u); let b4 = mh * (w0 & 0xffffu);",
    "    var c = (a0 >> 16u) + (a1 & 0xffffu) + (b0 & 0xffffu);",
    "    let r1 = c & 0xffffu;",
    "    c = (c >> 16u) + (a1 >> 16u) + (a2 & 0xffffu) + (b0 >> 16u) + (b1 & 0xffffu);",
    "    let r2 = c & 0xffffu;",
    "    c = (c >> 16u) + (a2 >> 16u) + (a3 & 0xffffu) + (b1 >> 16u) + (b2 & 0xffffu);",
    "    let r3 = c & 0xffffu;",
    "    c = (c >> 16u) + (a3 >> 16u) + (a4 & 0xffffu) + (b2 >> 16u) + (b3 & 0xffffu);",
    "    let r4 = c & 0xffffu;",
    "    c = (c >> 16u) + (a4 >> 16u) + (a5 & 0xffffu) + (b3 >> 16u) + (b4 & 0xffffu) + 0x2000u;",  # + half a quadrant
    "    q = (c >> 14u) & 3u;",
    "    let neg = (c & 0x2000u) == 0u;",
    "    let fl = select(0u, 0xffffffffu, neg);",  # |fraction|: a negative one complemented (off by 2^-93 quadrant)
    "    var hi = (((c & 0x1fffu) << 16u) | r4) ^ (fl & 0x1fffffffu);",
    "    var mid = ((r3 << 16u) | r2) ^ fl;",
    "    var lo = ((r1 << 16u) | (a0 & 0xffffu)) ^ fl;",
    "    var sc = -62;",
    "    if (hi == 0u) { hi = mid; mid = lo; lo = 0u; sc = -94; }",  # normalise: the fraction is at least 2^-30
    "    let n = countLeadingZeros(hi); let ns = 31u - n;",
    "    let xh = (hi << n) | ((mid >> 1u) >> ns);",
    "    let x0 = ((mid << n) | ((lo >> 1u) >> ns)) >> 16u; let x1 = xh & 0xffffu; let x2 = xh >> 16u;",
    # its top 48 bits times pi/2 * 2^31, 16-bit limbs again: r = rh + rl, both exact
    f"    let d = x0 * {p & 0xffff}u; let e = x0 * {p >> 16}u; let f = x1 * {p & 0xffff}u;",
    f"    let g1 = x1 * {p >> 16}u; let h = x2 * {p & 0xffff}u; let i = x2 * {p >> 16}u;",
    "    c = (d >> 16u) + (e & 0xffffu) + (f & 0xffffu);",
    "    c = (c >> 16u) + (e >> 16u) + (f >> 16u) + (g1 & 0xffffu) + (h & 0xffffu);",
    "    let p2 = c & 0xffffu;",
    "    c = (c >> 16u) + (g1 >> 16u) + (h >> 16u) + (i & 0xffffu);",
    "    let p4 = (c >> 16u) + (i >> 16u);",
    "    let sn = sc - i32(n);",
    "    rh = ldexp(f32((p4 << 8u) | ((c & 0xffffu) >> 8u)), sn + 41);",
    "    rl = ldexp(f32(((c & 0xffu) << 16u) | p2), sn + 17);",
    "    if (neg) { rh = -rh; rl = -rl; }",
    "  } else {",
    "    let k = round(ax * 0.63661975f);",
    f"    let r2 = (ax - k * {c1}) - k * {c2}; let p3 = k * {c3}; let t45 = k * {c4} + k * {c5};",
    f"    let r3 = r2 - p3; let ra = r2 - (p3 + t45); let rb = r3 - t45; let rc = (r3 - k * {c4}) - k * {c5};",
    "    rh = select(select(rc, rb, abs(rb) >= 5.9604645e-8f), ra, abs(ra) >= 0.000244140625f);",
    "    q = u32(k);",
    "  }",
    "  let z = rh * rh;",
    f"  let s = rh + (rl + rh * z * {sin_poly});",
    # cos r = 1 - a^2/2 - b (a + b/2) + ... with a = rh cut to a multiple of 2^-11: 1 - a^2/2 is then exact
    "  let a = floor(rh * 2048.0f) * 0.00048828125f; let b = rh - a;",
    f"  let co = (1.0f - 0.5f * a * a) + (((z * z * ({_f32(k1)} + z * ({_f32(k2)} + z * {_f32(k3)}))) - b * (a + 0.5f * b)) - rh * rl);",
    "  return bitcast<f32>(bitcast<u32>(select(s, co, (q & 1u) != 0u)) ^ ((u ^ (q << 30u)) & 0x80000000u));",
    "}"])


#: helper functions, emitted only when a kernel uses them
_HELPERS = {
  "pr_sx8": "fn pr_sx8(x: i32) -> i32 { return (x << 24u) >> 24u; }",
  "pr_sx16": "fn pr_sx16(x: i32) -> i32 { return (x << 16u) >> 16u; }",
  # round to bfloat16, nearest even; a NaN stays a quiet NaN (as plugrt.dtype.f32_to_bf16)
  "pr_bf16": "fn pr_bf16(x: f32) -> f32 {\n  let u = bitcast<u32>(x);\n"
             "  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x7fffffu) != 0u) { return bitcast<f32>((u | 0x400000u) & 0xffff0000u); }\n"
             "  return bitcast<f32>((u + 0x7fffu + ((u >> 16u) & 1u)) & 0xffff0000u);\n}",
  # f16 <-> its 16 bits, through f32 (exact both ways for every f16 value)
  "pr_f16bits": "fn pr_f16bits(x: f16) -> u32 { return pack2x16float(vec2<f32>(f32(x), 0.0)) & 0xffffu; }",
  "pr_f16from": "fn pr_f16from(b: u32) -> f16 { return f16(unpack2x16float(b & 0xffffu).x); }",
  # NaN from the bits: a float != is false with a NaN on lavapipe, and x != x may fold to false (finite math)
  "pr_nan": "fn pr_nan(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u; }",
  "pr_sin": _sin_wgsl(),
}


@dataclass(frozen=True)
class BufferParam:
  """What the buffer section needs to know of one buffer argument."""
  itemsize: int   # 1, 2 or 4 bytes
  written: bool

  @property
  def packed(self) -> bool: return self.itemsize < 4
  @property
  def atomic(self) -> bool: return self.packed and self.written
  @property
  def token(self) -> str: return f"{self.itemsize}{'w' if self.written else 'r'}"


@dataclass(frozen=True)
class Header:
  entry: str
  buffers: tuple[BufferParam, ...]
  nscalars: int

  @property
  def uniform_words(self) -> int: return len(self.buffers) + self.nscalars
  @property
  def uniform_bytes(self) -> int: return max(16, -(-self.uniform_words // 4) * 16)


_HEADER_RE = re.compile(r"^// plugrt-wgsl 1 entry=(?P<entry>\w+) bufs=(?P<bufs>[0-9rw,]*) scalars=(?P<scalars>\d+)$")


def parse_header(src: str) -> Header:
  """The header of a WGSL kernel this renderer made; ValueError for any other text."""
  m = _HEADER_RE.match(src.split("\n", 1)[0])
  if m is None: raise ValueError("not a plugrt WGSL kernel: its first line is not a '// plugrt-wgsl 1' header")
  bufs = tuple(BufferParam(int(t[:-1]), t[-1] == "w") for t in m["bufs"].split(",") if t)
  return Header(m["entry"], bufs, int(m["scalars"]))


def word(k: int) -> str:
  """Uniform word k: the uniform buffer is an array of vec4<u32>."""
  return f"pa.w[{k >> 2}].{'xyzw'[k & 3]}"


def buffer_section(params: Sequence[BufferParam], alias: Sequence[int] | None = None) -> str:
  """Bindings and accessors for the buffer arguments. alias[k] is the binding (0-based, in
  order of first use) argument k reads and writes through; None means one each."""
  alias = list(range(len(params))) if alias is None else list(alias)
  nroots = max(alias, default=-1) + 1
  atomic_root = [any(p.atomic for p, r in zip(params, alias) if r == root) for root in range(nroots)]
  lines = [BEGIN]
  for root in range(nroots):
    elem = "atomic<u32>" if atomic_root[root] else "u32"
    lines.append(f"@group(0) @binding({root + 1}) var<storage, read_write> pb{root}: array<{elem}>;")
  for k, (p, root) in enumerate(zip(params, alias)):
    at = atomic_root[root]
    def load(idx: str, root: int = root, at: bool = at) -> str: return f"atomicLoad(&pb{root}[{idx}])" if at else f"pb{root}[{idx}]"
    off = word(k)  # 4-byte dtypes: the view's offset in words; packed ones: in bytes
    if not p.packed:
      lines.append(f"fn ld{k}(i: u32) -> u32 {{ return {load(f'i + {off}')}; }}")
      if p.written:
        st = f"atomicStore(&pb{root}[i + {off}], v)" if at else f"pb{root}[i + {off}] = v"
        lines.append(f"fn st{k}(i: u32, v: u32) {{ {st}; }}")
      continue
    mask = "0xffu" if p.itemsize == 1 else "0xffffu"
    lines.append(f"fn ld{k}(i: u32) -> u32 {{ let b = i * {p.itemsize}u + {off}; return ({load('b >> 2u')} >> ((b & 3u) * 8u)) & {mask}; }}")
    if p.written:
      lines.append(f"fn st{k}(i: u32, v: u32) {{ let b = i * {p.itemsize}u + {off}; let s = (b & 3u) * 8u; "
                   f"atomicAnd(&pb{root}[b >> 2u], ~({mask} << s)); atomicOr(&pb{root}[b >> 2u], (v & {mask}) << s); }}")
  lines.append(END)
  return "\n".join(lines)


def specialize(src: str, alias: Sequence[int]) -> str:
  """The kernel with its buffer section re-emitted for `alias` (see buffer_section)."""
  head = parse_header(src)
  start, end = src.index(BEGIN), src.index(END) + len(END)
  return src[:start] + buffer_section(head.buffers, alias) + src[end:]


def held(dt: DType) -> str:
  """The WGSL type that holds a value of dt."""
  if dt is dtypes.bool: return "bool"
  if dt.kind == "i": return "i32"
  if dt.kind == "u": return "u32"
  return "f16" if dt is dtypes.float16 else "f32"


def _finite_const(u: UOp) -> bool: return u.op is Ops.CONST and not math.isnan(float(u.arg))
def _zero(dt: DType) -> str: return {"bool": "false", "i32": "0i", "u32": "0u", "f32": "0.0f", "f16": "0.0h"}[held(dt)]
def _one(dt: DType) -> str: return {"bool": "true", "i32": "1i", "u32": "1u", "f32": "1.0f", "f16": "1.0h"}[held(dt)]


class WGSLRenderer:
  """Renders kernels for one WebGPU device: `f16` says whether the device has shader-f16."""
  language = "WGSL"

  def __init__(self, device_name: str = "WEBGPU", *, f16: bool = False, max_storage_buffers: int = 8,
               max_workgroup_storage: int = 16384, adapter: str = ""):
    self.device_name, self.f16, self.adapter = device_name, f16, adapter
    self.max_storage_buffers, self.max_workgroup_storage = max_storage_buffers, max_workgroup_storage
    self._helpers: set[str] = set()  # helpers and private constants the kernel being rendered uses
    self._private: list[str] = []

  # ------------------------------------------------------------ checks
  def _fail(self, kernel: Kernel, what: str, hint: str) -> RenderError:
    on = f" ({self.adapter})" if self.adapter else ""
    return RenderError(f"{self.device_name}{on} cannot run kernel {kernel.name}: {what}", hint)

  def check(self, kernel: Kernel) -> None:
    for u in kernel.uops:
      dt = u.dtype.base if isinstance(u.dtype, PtrDType) else u.dtype
      for d in [dt, *(s.dtype for s in u.src if u.op in (Ops.CAST, Ops.BITCAST))]:
        if d in WIDE:
          raise self._fail(kernel, f"WGSL has no 64-bit types, and the kernel uses {d.name} (in {u.op.name})",
                           "use a 32-bit dtype on WEBGPU, or run this kernel on another device")
        if d is dtypes.float16 and not self.f16:
          raise self._fail(kernel, f"float16 needs the adapter feature shader-f16, which this adapter lacks (used by {u.op.name})",
                           "use float32 or bfloat16, or an adapter with shader-f16")
      if u.op is Ops.SPILL: raise self._fail(kernel, "per-thread spill arrays exist only in lowered (serial) kernels", "render the kernel unlowered")
    nbufs = len(kernel.buffers)
    if nbufs > self.max_storage_buffers:
      raise self._fail(kernel, f"it takes {nbufs} buffers and the device allows {self.max_storage_buffers} storage buffers per shader",
                       "split the kernel, or use an adapter with a higher maxStorageBuffersPerShaderStage")
    shared = sum(u.arg[1] * (2 if u.dtype.base is dtypes.float16 else 4) for u in kernel.uops if u.op is Ops.SHARED)
    if shared > self.max_workgroup_storage:
      raise self._fail(kernel, f"its shared arrays take {shared} bytes and the device allows {self.max_workgroup_storage}",
                       "use smaller shared arrays")

  # ------------------------------------------------------------ rendering
  def render(self, kernel: Kernel) -> str:
    """The WGSL source of `kernel`. A render keeps per-kernel state (helpers, private arrays, buffer indices) on a copy
    of this renderer, so threads sharing it (one compiler per device) render at once without mixing kernels."""
    return copy.copy(self)._render(kernel)

  def _render(self, kernel: Kernel) -> str:
    self.check(kernel)
    self._helpers, self._private = set(), []
    sig = kernel.signature
    params = [BufferParam(d.itemsize, w) for d, w in zip(sig.buffers, sig.written)]
    self._buf_index = {b: k for k, b in enumerate(kernel.buffers)}
    names: dict[UOp, str] = {}
    pre_body: list[str] = []
    nb = len(params)
    for j, s in enumerate(kernel.scalars):
      n = names[s] = f"s{j}_{s.arg[1]}"
      pre_body.append(f"  let {n}: {held(s.dtype)} = {self._scalar(s.dtype, word(nb + j))};")
    shared_decls = []
    for i, u in enumerate(kernel.uops):
      if u.op is Ops.SHARED:
        n = names[u] = f"sh{i}_{u.arg[0]}"
        shared_decls.append(f"var<workgroup> {n}: array<{self._shared_type(u.dtype.base)}, {u.arg[1]}>;")
    body = self._body(kernel, names)
    entry = f"k_{kernel.name}"
    head = Header(entry, tuple(params), len(kernel.scalars))
    uses_f16 = any((u.dtype.base if isinstance(u.dtype, PtrDType) else u.dtype) is dtypes.float16 for u in kernel.uops)
    out = [f"{HEADER} entry={entry} bufs={','.join(p.token for p in params)} scalars={len(kernel.scalars)}"]
    if uses_f16: out.append("enable f16;")
    out += [f"struct PlugrtArgs {{ w: array<vec4<u32>, {head.uniform_bytes // 16}> }}",
            "@group(0) @binding(0) var<uniform> pa: PlugrtArgs;", buffer_section(params)]
    out += ["override pr_lx: u32 = 1u;", "override pr_ly: u32 = 1u;", "override pr_lz: u32 = 1u;"]
    out += shared_decls + self._private + [_HELPERS[h] for h in _HELPERS if h in self._helpers]
    out += ["@compute @workgroup_size(pr_lx, pr_ly, pr_lz)",
            f"fn {entry}(@builtin(workgroup_id) pr_wg: vec3<u32>, @builtin(local_invocation_id) pr_li: vec3<u32>, "
            "@builtin(num_workgroups) pr_ng: vec3<u32>) {"]
    return "\n".join(out + pre_body + body + ["}", ""])

  def _use(self, helper: str, arg: str) -> str:
    self._helpers.add(helper)
    return f"{helper}({arg})"

  def _shared_type(self, dt: DType) -> str: return "u32" if dt is dtypes.bool else held(dt)

  def _scalar(self, dt: DType, w: str) -> str:
    """A scalar argument from its uniform word (float16 and bfloat16 arrive as exact float32 bits)."""
    if dt is dtypes.float16: return f"f16(bitcast<f32>({w}))"
    if dt is dtypes.bfloat16: return f"bitcast<f32>({w})"
    return self._from_bits(dt, w)

  def _from_bits(self, dt: DType, e: str) -> str:
    """A value of dt from its storage bits (zero-extended in a u32)."""
    if dt is dtypes.bool: return f"({e} != 0u)"
    if dt is dtypes.int8: return self._use("pr_sx8", f"bitcast<i32>({e})")
    if dt is dtypes.int16: return self._use("pr_sx16", f"bitcast<i32>({e})")
    if dt.kind == "i": return f"bitcast<i32>({e})"
    if dt.kind == "u": return e
    if dt is dtypes.float16: return self._use("pr_f16from", e)
    if dt is dtypes.bfloat16: return f"bitcast<f32>({e} << 16u)"
    return f"bitcast<f32>({e})"

  def _to_bits(self, dt: DType, v: str) -> str:
    """The storage bits of a value of dt (the store masks them to the element's width)."""
    if dt is dtypes.bool: return f"select(0u, 1u, {v})"
    if dt.kind == "i": return f"bitcast<u32>({v})"
    if dt.kind == "u": return v
    if dt is dtypes.float16: return self._use("pr_f16bits", v)
    if dt is dtypes.bfloat16: return f"(bitcast<u32>({v}) >> 16u)"
    return f"bitcast<u32>({v})"

  def _wrap(self, dt: DType, e: str) -> str:
    """Bring a result computed in the holding type back to dt (wrap small ints, round bfloat16)."""
    if dt is dtypes.int8: return self._use("pr_sx8", e)
    if dt is dtypes.int16: return self._use("pr_sx16", e)
    if dt is dtypes.uint8: return f"({e} & 0xffu)"
    if dt is dtypes.uint16: return f"({e} & 0xffffu)"
    if dt is dtypes.bfloat16: return self._use("pr_bf16", e)
    return e

  def literal(self, x: bool | int | float, dt: DType, name: str) -> str:
    if dt is dtypes.bool: return "true" if x else "false"
    if dt.kind == "i": return "(-2147483647i - 1i)" if x == -(1 << 31) else f"{int(x)}i"
    if dt.kind == "u": return f"{int(x)}u"
    x = float(x)
    if math.isfinite(x): return f"{x!r}{'h' if dt is dtypes.float16 else 'f'}"
    # WGSL has no literal for inf or NaN, and a constant expression may not produce one: read the bits at run time
    if dt is dtypes.float16:
      bits = 0x7E00 if math.isnan(x) else (0xFC00 if x < 0 else 0x7C00)
      self._private.append(f"var<private> pk_{name}: u32 = {bits:#x}u;")
      return self._use("pr_f16from", f"pk_{name}")
    bits = struct.unpack("<I", struct.pack("<f", x))[0] if not math.isnan(x) else 0x7FC00000
    self._private.append(f"var<private> pk_{name}: u32 = {bits:#x}u;")
    return f"bitcast<f32>(pk_{name})"

  def _body(self, kernel: Kernel, names: dict[UOp, str]) -> list[str]:
    r = dict(names)
    lines: list[str] = []
    lanes: dict[UOp, list[str]] = {}  # a VLOAD's elements, as values
    depth = 1
    for i, u in enumerate(kernel.uops):
      op, dt = u.op, u.dtype
      s = [r.get(x, "") for x in u.src]
      v = f"v{i}"
      pad = "  " * depth
      if op in (Ops.BUFFER, Ops.SCALAR, Ops.SHARED): continue
      if op is Ops.CONST:  # a `let`, not an inline literal: WGSL folds all-literal expressions at compile time and rejects overflow
        lines.append(f"{pad}let {v}: {held(dt)} = {self.literal(u.arg, dt, v)};")
      elif op is Ops.SPECIAL:
        kind, axis = u.arg
        src = {"group_id": f"pr_wg.{_AXES[axis]}", "local_id": f"pr_li.{_AXES[axis]}", "num_groups": f"pr_ng.{_AXES[axis]}",
               "local_size": f"pr_l{_AXES[axis]}"}[kind]
        lines.append(f"{pad}let {v}: i32 = i32({src});")
      elif op is Ops.LOAD:
        ptr = u.src[0]
        if ptr.op is Ops.BUFFER: e = self._from_bits(dt, f"ld{self._buf_index[ptr]}(u32({s[1]}))")
        else: e = f"({s[0]}[{s[1]}] != 0u)" if dt is dtypes.bool else f"{s[0]}[{s[1]}]"
        lines.append(f"{pad}let {v}: {held(dt)} = {e};")
      elif op is Ops.VLOAD:  # element by element (see the module docstring)
        k = self._buf_index[u.src[0]]
        lines += [f"{pad}let {v}_{j}: {held(dt)} = {self._from_bits(dt, f'ld{k}(u32({s[1]}) + {j}u)')};" for j in range(u.arg)]
        lanes[u] = [f"{v}_{j}" for j in range(u.arg)]
      elif op is Ops.LANE: lines.append(f"{pad}let {v}: {held(dt)} = {lanes[u.src[0]][u.arg]};")
      elif op is Ops.VSTORE:
        k, vdt = self._buf_index[u.src[0]], u.src[2].dtype
        lines += [f"{pad}st{k}(u32({s[1]}) + {j}u, {self._to_bits(vdt, x)});" for j, x in enumerate(s[2:])]
      elif op is Ops.STORE:
        ptr, vdt = u.src[0], u.src[2].dtype
        if ptr.op is Ops.BUFFER: lines.append(f"{pad}st{self._buf_index[ptr]}(u32({s[1]}), {self._to_bits(vdt, s[2])});")
        else: lines.append(f"{pad}{s[0]}[{s[1]}] = {'select(0u, 1u, ' + s[2] + ')' if vdt is dtypes.bool else s[2]};")
      elif op is Ops.VAR: lines.append(f"{pad}var {v}: {held(dt)} = {s[0]};")
      elif op is Ops.READ: lines.append(f"{pad}let {v}: {held(dt)} = {s[0]};")
      elif op is Ops.WRITE: lines.append(f"{pad}{s[0]} = {s[1]};")
      elif op is Ops.RANGE:
        lines.append(f"{pad}for (var {v}: {held(dt)} = {s[0]}; {v} < {s[1]}; {v} = {v} + {_one(dt)}) {{")
        depth += 1
      elif op is Ops.IF:
        lines.append(f"{pad}if ({s[0]}) {{")
        depth += 1
      elif op is Ops.ELSE: lines.append(f"{'  ' * (depth - 1)}}} else {{")
      elif op in (Ops.ENDRANGE, Ops.ENDIF):
        depth -= 1
        lines.append("  " * depth + "}")
      elif op is Ops.BARRIER:  # the IR's barrier orders global memory within the group too, as CUDA's does
        lines.append(f"{pad}storageBarrier();")
        lines.append(f"{pad}workgroupBarrier();")
      elif op is Ops.SPILL: raise RenderError("unreachable: SPILL is refused by check()")
      else: lines.append(f"{pad}let {v}: {held(dt)} = {self.alu(u, s)};")
      if op not in (Ops.STORE, Ops.VSTORE, Ops.WRITE, Ops.ENDRANGE, Ops.ENDIF, Ops.ELSE, Ops.IF, Ops.BARRIER): r[u] = v
    return lines

  # ------------------------------------------------------------ ALU
  def alu(self, u: UOp, s: Sequence[str]) -> str:
    op, dt = u.op, u.dtype
    sdt = u.src[0].dtype
    if op is Ops.CAST: return self.cast(s[0], sdt, dt)
    if op is Ops.BITCAST: return self.bitcast(s[0], sdt, dt)
    if op is Ops.WHERE: return f"select({s[2]}, {s[1]}, {s[0]})"
    if op is Ops.NEG:
      if sdt.kind == "u": return self._wrap(dt, f"(0u - {s[0]})")
      return self._wrap(dt, f"(-{s[0]})")
    if op is Ops.NOT:
      if dt is dtypes.bool: return f"(!{s[0]})"
      return self._wrap(dt, f"(~{s[0]})")
    if op is Ops.RECIP: return self._wrap(dt, f"({_one(dt)} / {s[0]})")
    if op in _MATH: return self._wrap(dt, f"{_MATH[op]}({s[0]})")
    if op is Ops.SIN:  # own routine (see _sin_wgsl); float16 through float32, rounded once
      return f"f16({self._use('pr_sin', f'f32({s[0]})')})" if dt is dtypes.float16 else self._wrap(dt, self._use("pr_sin", s[0]))
    if op in (Ops.MAX, Ops.MIN): return f"{'max' if op is Ops.MAX else 'min'}({s[0]}, {s[1]})"
    if op in (Ops.SHL, Ops.SHR):  # WGSL shifts by a u32; the IR leaves shifts >= the width undefined: mask like the interpreter
      amount = f"(bitcast<u32>({s[1]}) & {sdt.bits - 1}u)" if sdt.kind == "i" else f"({s[1]} & {sdt.bits - 1}u)"
      if op is Ops.SHR: return self._wrap(dt, f"({s[0]} >> {amount})")
      # a left shift wraps in the IR. naga evaluates shifts of constants when it makes the pipeline and rejects one
      # that overflows ("<< operation overflowed"), so the bits that would be shifted out are cleared first, in u32
      bits = f"bitcast<u32>({s[0]})" if held(sdt) == "i32" else s[0]
      shifted = f"(({bits} & (0xffffffffu >> {amount})) << {amount})"
      return self._wrap(dt, f"bitcast<i32>{shifted}" if held(sdt) == "i32" else shifted)
    if op is Ops.MOD and sdt.kind == "i":  # from WGSL's truncating `/`: naga's GLSL output leaves `%` of negative values undefined
      return self._wrap(dt, f"({s[0]} - ({s[0]} / {s[1]}) * {s[1]})")
    if op is Ops.CMPNE and sdt.kind == "f":  # unordered: true when either side is NaN, which a bit test must see
      if u.src[0] is u.src[1]: return self._nan(u.src[0], s[0])
      return f"(({s[0]} != {s[1]}){''.join(f' | {self._nan(x, e)}' for x, e in zip(u.src, s) if not _finite_const(x))})"
    if sdt is dtypes.bool:
      if op is Ops.XOR: return f"({s[0]} != {s[1]})"
      if op in (Ops.CMPLT, Ops.CMPLE):
        return f"(select(0u, 1u, {s[0]}) {_INFIX[op]} select(0u, 1u, {s[1]}))"
    e = f"({s[0]} {_INFIX[op]} {s[1]})"
    return e if op in (Ops.CMPLT, Ops.CMPLE, Ops.CMPEQ, Ops.CMPNE) else self._wrap(dt, e)

  def cast(self, x: str, src: DType, dt: DType) -> str:
    if src is dt: return x
    if dt is dtypes.bool:  # != 0, so NaN is true: a float's bits other than the sign (a compare would miss NaN)
      if src.kind == "f": return f"((bitcast<u32>({x if held(src) == 'f32' else f'f32({x})'}) & 0x7fffffffu) != 0u)"
      return f"({x} != {_zero(src)})"
    if src is dtypes.bool: return f"select({_zero(dt)}, {_one(dt)}, {x})"
    sh = held(src)
    if dt.kind == "i":
      base = x if sh == "i32" else f"bitcast<i32>({x})" if sh == "u32" else f"i32({x})"
      return self._wrap(dt, base)
    if dt.kind == "u":
      base = x if sh == "u32" else f"bitcast<u32>({x})" if sh == "i32" else f"u32({x})"
      return self._wrap(dt, base)
    if dt is dtypes.bfloat16: return self._use("pr_bf16", x if sh == "f32" else f"f32({x})")  # through float32, as the IR says
    if dt is dtypes.float16: return f"f16({x})"  # one rounding, from the source itself
    return x if sh == "f32" else f"f32({x})"

  def _nan(self, u: UOp, x: str) -> str:
    """Whether the float value x (of u) is NaN, from its bits (float16 through float32, which keeps NaN)."""
    return self._use("pr_nan", x if held(u.dtype) == "f32" else f"f32({x})")

  def bitcast(self, x: str, src: DType, dt: DType) -> str:
    if src is dt: return x
    if src.itemsize == 4: return x if held(src) == held(dt) else f"bitcast<{held(dt)}>({x})"
    bits = self._to_bits(src, x)  # zero-extended: a signed source's sign bits masked off
    if src.kind == "i": bits = f"({bits} & {'0xffu' if src.itemsize == 1 else '0xffffu'})"
    return self._from_bits(dt, bits)
