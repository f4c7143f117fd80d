"""The PTX renderer's math library: exp2, log2 and sin as `.func` routines, accurate to a few ulp over the whole range,
where PTX's own instructions are approximate (lg2.approx, sin.approx) or missing (float64). The renderer emits each
routine a module calls once, before its entries.

  EXP2 f32: the renderer uses `ex2.approx.f32` (the ISA states 2 ulp over the full range, subnormals kept).
  LOG2 f32: x = 2^e * m, m in [sqrt(1/2), sqrt(2)), log2(m) = 2/ln2 * atanh(s) with s = (m-1)/(m+1), an odd
            series in s; lg2.approx.f32 has only an absolute error bound near 1. f64 the same in double
            precision (no PTX instruction exists).
  SIN f32:  Cody-Waite reduction by pi/2 split into three float32 parts with fma (exact first step), Taylor
            polynomials for sin/cos on [-pi/4, pi/4], quadrant select. Above 2^17 it calls the float64 routine.
            f64: the same with three float64 parts up to 2^20; beyond, a Payne-Hanek reduction with 64-bit
            integer products against a table of 2/pi bits, so every finite input is reduced correctly.
  EXP2 f64: x = n + f, |f| <= 1/2, a degree-13 polynomial for 2^f, then two exact-or-once-rounded scalings by
            2^(n/2) so subnormal results round once.

The constants (pi/2 in parts, 2/pi's bits, ln 2) come exact from plugrt.compiler.renderer.floatmath, which the WGSL renderer
uses too.
"""
from __future__ import annotations

import functools
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from plugrt.compiler.renderer import floatmath
from plugrt.compiler.renderer.floatmath import round_f32, sin_cos_taylor

#: every routine's name starts with this (kernel names may not, so they never collide)
HELPER_PREFIX = "__plugrt_"


def f32_hex(x: float) -> str:
  """A float32 as a PTX immediate (0fXXXXXXXX: its exact bits)."""
  return f"0f{struct.unpack('<I', struct.pack('<f', x))[0]:08X}"


def f64_hex(x: float) -> str:
  """A float64 as a PTX immediate (0dXXXXXXXXXXXXXXXX: its exact bits)."""
  return f"0d{struct.unpack('<Q', struct.pack('<d', x))[0]:016X}"


# ---------------------------------------------------------------- exact constants

@dataclass(frozen=True)
class Constants:
  two_over_pi: Fraction
  pio2_f64: tuple[float, ...]   # pi/2 = sum of three doubles (each the rounded remainder of the last)
  pio2_f32: tuple[float, ...]
  inv_ln2x2: Fraction           # 2 / ln 2
  exp2_coef: tuple[float, ...]  # ln2^k / k!, k = 0..13
  table: tuple[int, ...]        # 2/pi bits as u64 words, after TABLE_PAD zero bits


TABLE_PAD = 64     # zero bits in front of 2/pi's first fractional bit (the window may start before it)
TABLE_WORDS = 22   # covers the window of the largest finite double (and of infinity) with room to spare


@functools.cache
def constants() -> Constants:
  pi, ln2 = floatmath.pi(), floatmath.ln2()
  return Constants(2 / pi, floatmath.split(pi / 2, 3, float), floatmath.split(pi / 2, 3, round_f32), 2 / ln2,
                   tuple(float(ln2 ** k / math.factorial(k)) for k in range(14)), floatmath.two_over_pi_words(TABLE_WORDS, 64, TABLE_PAD))


_SIN_F64_FAST = 2.0 ** 20   # Cody-Waite with three doubles and fma is accurate far beyond this; above it, Payne-Hanek
_SIN_F32_FAST = 2.0 ** 17   # above this float32 SIN calls the float64 routine


def _poly(dst: str, x: str, coefs: Sequence[str], ty: str) -> list[str]:
  """Horner's scheme: dst = coefs[0] + x*(coefs[1] + x*(...)) with fma (coefficients are immediates)."""
  lines = [f"mov.{ty} {dst}, {coefs[-1]}"]
  lines += [f"fma.rn.{ty} {dst}, {dst}, {x}, {c}" for c in reversed(coefs[:-1])]
  return lines


def _func(name: str, ty: str, regs: dict[str, list[str]], body: list[str]) -> str:
  """A helper `.func` taking and returning one float of type ty; body lines are instructions, labels or { }."""
  decls = [f"\t.reg {t} {', '.join(rs)};" for t, rs in regs.items() if rs]
  lines = [ln if ln.endswith(":") else f"\t{ln}" if ln in ("{", "}") else f"\t{ln};" for ln in body]
  return "\n".join([f".func (.param .{ty} ret) {HELPER_PREFIX}{name}(.param .{ty} arg)", "{", *decls, *lines, "}"])


def _helper_sin_f64() -> str:
  c = constants()
  p1, p2, p3 = (f64_hex(v) for v in c.pio2_f64)
  sin_c = [f64_hex(sin_cos_taylor(k, float)) for k in range(3, 18, 2)]   # r^3 .. r^17 (as a polynomial in r^2)
  cos_c = [f64_hex(sin_cos_taylor(k, float)) for k in range(2, 17, 2)]   # r^2 .. r^16
  g0 = TABLE_PAD - 1077  # table bit of the window start = biased exponent + this (see the comment below)
  body = [
    "ld.param.f64 %x, [arg]",
    "abs.f64 %ax, %x",
    f"setp.lt.f64 %tiny, %ax, {f64_hex(2.0 ** -27)}",  # sin(x) == x in double below 2^-26 (keeps -0 and subnormals)
    f"setp.ge.f64 %big, %ax, {f64_hex(_SIN_F64_FAST)}",  # NaN: false, the fast path makes NaN
    "@%big bra $L_big",
    # Cody-Waite: k = rint(|x| * 2/pi); r = |x| - k*(p1+p2+p3). The first fma is exact (|r| < 1 and both
    # terms are multiples of 2^-53), the others round once; pi/2 - (p1+p2+p3) is ~2^-160
    f"mul.rn.f64 %k, %ax, {f64_hex(float(c.two_over_pi))}",
    "cvt.rni.f64.f64 %k, %k",
    "neg.f64 %nk, %k",
    f"fma.rn.f64 %r, %nk, {p1}, %ax",
    f"fma.rn.f64 %r, %nk, {p2}, %r",
    f"fma.rn.f64 %r, %nk, {p3}, %r",
    "cvt.rzi.u32.f64 %q, %k",
    "bra.uni $L_poly",
    # Payne-Hanek: |x| = m * 2^E (m a 53-bit integer, E = e - 1075). |x| * 2/pi mod 4 only needs the bits b_i
    # of 2/pi (2/pi = sum b_i 2^-i) with i >= E - 1; a 192-bit window of them from i0 = E - 1 gives
    # (m * window) mod 2^192 = |x| * 2/pi mod 4 scaled by 2^190, the neglected tail is below 2^-137.
    # The table holds b_1.. after TABLE_PAD zero bits, so b_i is table bit i + TABLE_PAD - 1.
    "$L_big:",
    "mov.b64 %bits, %ax",
    "shr.u64 %t0, %bits, 52",
    "cvt.u32.u64 %e, %t0",
    "and.b64 %m, %bits, 0x000FFFFFFFFFFFFF",
    "or.b64 %m, %m, 0x0010000000000000",
    f"add.s32 %g, %e, {g0}",
    "shr.u32 %j, %g, 6",
    "and.b32 %sh, %g, 63",
    "sub.s32 %ns, 64, %sh",  # a shift by 64 gives 0 in PTX (shift amounts clamp), so sh == 0 needs no branch
    "mul.wide.u32 %off, %j, 8",
    f"mov.u64 %a, {HELPER_PREFIX}two_over_pi",
    "add.s64 %a, %a, %off",
    "ld.const.u64 %t0, [%a]",
    "ld.const.u64 %t1, [%a+8]",
    "ld.const.u64 %t2, [%a+16]",
    "ld.const.u64 %t3, [%a+24]",
    "shl.b64 %u, %t0, %sh", "shr.b64 %v, %t1, %ns", "or.b64 %w0, %u, %v",
    "shl.b64 %u, %t1, %sh", "shr.b64 %v, %t2, %ns", "or.b64 %w1, %u, %v",
    "shl.b64 %u, %t2, %sh", "shr.b64 %v, %t3, %ns", "or.b64 %w2, %u, %v",
    # bits 64..191 of m * (w0:w1:w2); bits 190/191 are the quadrant, the 126 below the fraction
    "mul.hi.u64 %u, %m, %w2",
    "mul.lo.u64 %v, %m, %w1",
    "mul.hi.u64 %hi, %m, %w1",
    "mul.lo.u64 %lo, %m, %w0",
    "add.cc.u64 %wd1, %u, %v",
    "addc.u64 %wd2, %hi, %lo",
    # round to the nearest quadrant: + 1/2, q = the top two bits, the rest minus 1/2 is the signed fraction
    "add.u64 %wd2, %wd2, 0x2000000000000000",
    "shr.u64 %t0, %wd2, 62",
    "cvt.u32.u64 %q, %t0",
    "and.b64 %hi, %wd2, 0x3FFFFFFFFFFFFFFF",
    "sub.s64 %hi, %hi, 0x2000000000000000",
    "setp.lt.s64 %fneg, %hi, 0",
    # |hi:lo| as a 128-bit two's complement negation
    "not.b64 %u, %hi",
    "not.b64 %v, %wd1",
    "add.cc.u64 %v, %v, 1",
    "addc.u64 %u, %u, 0",
    "selp.b64 %hi, %u, %hi, %fneg",
    "selp.b64 %lo, %v, %wd1, %fneg",
    "cvt.rn.f64.u64 %dh, %hi",
    "cvt.rn.f64.u64 %dl, %lo",
    f"mul.rn.f64 %dh, %dh, {f64_hex(2.0 ** -62)}",
    f"fma.rn.f64 %d, %dl, {f64_hex(2.0 ** -126)}, %dh",  # the fraction of a quadrant, in [0, 1/2]
    "neg.f64 %nd, %d",
    "selp.f64 %d, %nd, %d, %fneg",
    f"mul.rn.f64 %r, %d, {p2}",
    f"fma.rn.f64 %r, %d, {p1}, %r",  # r = d * pi/2 (pi/2 as p1 + p2)
    "$L_poly:",
    "mul.rn.f64 %r2, %r, %r",
    *_poly("%s", "%r2", sin_c, "f64"),
    "mul.rn.f64 %r3, %r2, %r",
    "fma.rn.f64 %s, %s, %r3, %r",                 # sin r = r + r^3 * P(r^2)
    *_poly("%c", "%r2", cos_c, "f64"),
    f"fma.rn.f64 %c, %c, %r2, {f64_hex(1.0)}",   # cos r = 1 + r^2 * Q(r^2)
    "and.b32 %qb, %q, 1",
    "setp.ne.u32 %odd, %qb, 0",
    "selp.f64 %res, %c, %s, %odd",
    "and.b32 %qb, %q, 2",
    "setp.ne.u32 %flip, %qb, 0",
    "setp.lt.f64 %neg, %x, 0d0000000000000000",
    "xor.pred %flip, %flip, %neg",                # sin(-x) = -sin(x)
    "neg.f64 %nres, %res",
    "selp.f64 %res, %nres, %res, %flip",
    "selp.f64 %res, %x, %res, %tiny",
    "setp.eq.f64 %inf, %ax, 0d7FF0000000000000",
    "sub.rn.f64 %nres, %x, %x",                   # NaN for +-inf
    "selp.f64 %res, %nres, %res, %inf",
    "st.param.f64 [ret], %res",
    "ret",
  ]
  regs = {".pred": ["%tiny", "%big", "%fneg", "%odd", "%flip", "%neg", "%inf"],
          ".b32": ["%q", "%qb", "%e", "%g", "%j", "%sh", "%ns"],
          ".b64": ["%bits", "%m", "%off", "%a", "%t0", "%t1", "%t2", "%t3", "%u", "%v", "%w0", "%w1", "%w2", "%hi", "%lo", "%wd1", "%wd2"],
          ".f64": ["%x", "%ax", "%k", "%nk", "%r", "%r2", "%r3", "%s", "%c", "%res", "%nres", "%dh", "%dl", "%d", "%nd"]}
  return _func("sin_f64", "f64", regs, body)


def _helper_sin_f32() -> str:
  c = constants()
  p1, p2, p3 = (f32_hex(v) for v in c.pio2_f32)
  sin_c = [f32_hex(sin_cos_taylor(k, round_f32)) for k in range(3, 10, 2)]   # r^3 .. r^9
  cos_c = [f32_hex(sin_cos_taylor(k, round_f32)) for k in range(2, 11, 2)]   # r^2 .. r^10
  body = [
    "ld.param.f32 %x, [arg]",
    "abs.f32 %ax, %x",
    f"setp.ge.f32 %big, %ax, {f32_hex(_SIN_F32_FAST)}",  # NaN: false, the fast path makes NaN
    "@%big bra $L_big",
    f"setp.lt.f32 %tiny, %ax, {f32_hex(floatmath.SIN_F32_EXACT_BELOW)}",  # sin(x) == x in float32 below 2^-12
    # Cody-Waite with fma: k = rint(|x| * 2/pi), r = |x| - k*(p1+p2+p3); the first fma is exact (|r| < 1, both
    # terms multiples of 2^-24 for |x| >= 1/2), pi/2 - (p1+p2+p3) is ~2^-75
    f"mul.rn.f32 %k, %ax, {f32_hex(round_f32(c.two_over_pi))}",
    "cvt.rni.f32.f32 %k, %k",
    "neg.f32 %nk, %k",
    f"fma.rn.f32 %r, %nk, {p1}, %ax",
    f"fma.rn.f32 %r, %nk, {p2}, %r",
    f"fma.rn.f32 %r, %nk, {p3}, %r",
    "cvt.rzi.u32.f32 %q, %k",
    "mul.rn.f32 %r2, %r, %r",
    *_poly("%s", "%r2", sin_c, "f32"),
    "mul.rn.f32 %r3, %r2, %r",
    "fma.rn.f32 %s, %s, %r3, %r",
    *_poly("%c", "%r2", cos_c, "f32"),
    f"fma.rn.f32 %c, %c, %r2, {f32_hex(1.0)}",
    "and.b32 %qb, %q, 1",
    "setp.ne.u32 %odd, %qb, 0",
    "selp.f32 %res, %c, %s, %odd",
    "and.b32 %qb, %q, 2",
    "setp.ne.u32 %flip, %qb, 0",
    "setp.lt.f32 %neg, %x, 0f00000000",
    "xor.pred %flip, %flip, %neg",
    "neg.f32 %nres, %res",
    "selp.f32 %res, %nres, %res, %flip",
    "selp.f32 %res, %x, %res, %tiny",
    "st.param.f32 [ret], %res",
    "ret",
    "$L_big:",  # large |x| (and +-inf): the float64 routine, rounded once more
    "cvt.f64.f32 %xd, %x",
    "{",
    ".param .f64 a0",
    ".param .f64 r0",
    "st.param.f64 [a0], %xd",
    f"call (r0), {HELPER_PREFIX}sin_f64, (a0)",
    "ld.param.f64 %xd, [r0]",
    "}",
    "cvt.rn.f32.f64 %res, %xd",
    "st.param.f32 [ret], %res",
    "ret",
  ]
  regs = {".pred": ["%big", "%tiny", "%odd", "%flip", "%neg"], ".b32": ["%q", "%qb"],
          ".f32": ["%x", "%ax", "%k", "%nk", "%r", "%r2", "%r3", "%s", "%c", "%res", "%nres"], ".f64": ["%xd"]}
  return _func("sin_f32", "f32", regs, body)


def _log2_body(ty: str) -> tuple[list[str], dict[str, list[str]]]:
  """log2 for f32 or f64: x = 2^e * m with m in [sqrt(1/2), sqrt(2)), log2 m = 2/ln2 * atanh(s), s = (m-1)/(m+1).
  s is refined once against the exact m+1 (a two-term sum) so that it is good to about half an ulp."""
  c = constants()
  f64 = ty == "f64"
  hx, bt, w = (f64_hex, "b64", 64) if f64 else (f32_hex, "b32", 32)
  rnd = float if f64 else round_f32
  mant, bias, scale = (52, 1023, 54) if f64 else (23, 127, 24)
  nterms = 11 if f64 else 5  # s^2k/(2k+1) for k = 1..nterms: |s| <= 0.1716, the next term is below half an ulp
  coefs = [hx(rnd(c.inv_ln2x2 / (2 * k + 1))) for k in range(1, nterms + 1)]
  chi = rnd(c.inv_ln2x2)
  clo = rnd(c.inv_ln2x2 - Fraction(chi))
  one, half = hx(1.0), hx(0.5)
  body = [
    f"ld.param.{ty} %x, [arg]",
    f"setp.lt.{ty} %sub, %x, {hx(2.0 ** (1 - bias))}",   # subnormal (or <= 0, fixed at the end): scale up exactly
    f"mul.rn.{ty} %xs, %x, {hx(2.0 ** scale)}",
    f"selp.{ty} %xs, %xs, %x, %sub",
    f"selp.s32 %eadj, {-scale - bias}, {-bias}, %sub",
    f"mov.{bt} %bits, %xs",
    f"shr.u{w} %eb, %bits, {mant}",
    *(["cvt.u32.u64 %e, %eb"] if f64 else ["mov.b32 %e, %eb"]),
    f"and.b{w} %mb, %bits, 0x{(1 << mant) - 1:X}",
    f"or.b{w} %mb, %mb, 0x{bias << mant:X}",
    f"mov.{bt} %m, %mb",                                  # m in [1, 2)
    f"setp.gt.{ty} %hi, %m, {hx(rnd(Fraction(math.isqrt(2 << 200), 1 << 100)))}",  # > sqrt(2): halve m, e + 1
    f"mul.rn.{ty} %mh, %m, {half}",
    f"selp.{ty} %m, %mh, %m, %hi",
    "selp.s32 %inc, 1, 0, %hi",
    "add.s32 %e, %e, %inc",
    "add.s32 %e, %e, %eadj",
    f"cvt.rn.{ty}.s32 %ef, %e",
    f"sub.rn.{ty} %f, %m, {one}",                         # exact (Sterbenz)
    f"add.rn.{ty} %dh, %m, {one}",
    f"sub.rn.{ty} %dl, %dh, {one}",                       # exact
    f"sub.rn.{ty} %dl, %m, %dl",                          # exact: m + 1 == dh + dl
    f"div.rn.{ty} %s, %f, %dh",
    f"neg.{ty} %ns, %s",
    f"fma.rn.{ty} %rr, %ns, %dh, %f",                     # f - s*dh, exact
    f"fma.rn.{ty} %rr, %ns, %dl, %rr",                    # - s*dl
    f"div.rn.{ty} %ds, %rr, %dh",
    f"mul.rn.{ty} %s2, %s, %s",
    *_poly("%p", "%s2", coefs, ty),
    f"mul.rn.{ty} %p, %p, %s2",                           # 2/ln2 * (s^2/3 + s^4/5 + ...)
    f"add.rn.{ty} %p, %p, {hx(clo)}",                     # + the low part of 2/ln2
    f"mul.rn.{ty} %p, %p, %s",
    f"fma.rn.{ty} %p, %ds, {hx(chi)}, %p",                # + 2/ln2 * (the correction of s)
    f"fma.rn.{ty} %y, %s, {hx(chi)}, %p",                 # log2 m = chi*s + (clo*s + 2/ln2*(s^3/3 + ...) + chi*ds)
    f"add.rn.{ty} %res, %ef, %y",
    # special inputs: +inf -> +inf, +-0 -> -inf, < 0 -> NaN, NaN -> NaN
    f"setp.eq.{ty} %p0, %x, {hx(math.inf)}",
    f"selp.{ty} %res, %x, %res, %p0",
    f"setp.eq.{ty} %p0, %x, {hx(0.0)}",
    f"selp.{ty} %res, {hx(-math.inf)}, %res, %p0",
    f"setp.lt.{ty} %p0, %x, {hx(0.0)}",
    f"selp.{ty} %res, {hx(math.nan)}, %res, %p0",
    f"setp.nan.{ty} %p0, %x, %x",
    f"selp.{ty} %res, %x, %res, %p0",
    f"st.param.{ty} [ret], %res",
    "ret",
  ]
  regs = {".pred": ["%sub", "%hi", "%p0"], ".b32": ["%e", "%eadj", "%inc"] + ([] if f64 else ["%eb", "%bits", "%mb"]),
          ".b64": ["%bits", "%mb", "%eb"] if f64 else [],
          f".{ty}": ["%x", "%xs", "%m", "%mh", "%ef", "%f", "%dh", "%dl", "%s", "%ns", "%rr", "%ds", "%s2", "%p", "%y", "%res"]}
  return body, regs


def _helper_log2(ty: str) -> str:
  body, regs = _log2_body(ty)
  return _func(f"log2_{ty}", ty, regs, body)


def _helper_exp2_f64() -> str:
  coefs = [f64_hex(v) for v in constants().exp2_coef]
  body = [
    "ld.param.f64 %x, [arg]",
    # clamp to +-1100 (beyond, the result is 0 or inf anyway); NaN compares false and stays NaN
    f"setp.gt.f64 %p0, %x, {f64_hex(1100.0)}",
    f"selp.f64 %x, {f64_hex(1100.0)}, %x, %p0",
    f"setp.lt.f64 %p0, %x, {f64_hex(-1100.0)}",
    f"selp.f64 %x, {f64_hex(-1100.0)}, %x, %p0",
    "cvt.rni.f64.f64 %n, %x",
    "sub.rn.f64 %f, %x, %n",                     # exact, |f| <= 1/2
    *_poly("%y", "%f", coefs, "f64"),           # 2^f = sum (f ln2)^k / k!, the k = 14 term is below 2^-57
    "cvt.rni.s32.f64 %ni, %n",                   # NaN -> 0 (the result is NaN through y)
    "shr.s32 %n1, %ni, 1",
    "sub.s32 %n2, %ni, %n1",
    # 2^n1 and 2^n2 are normal (|n1|, |n2| <= 550): y * 2^n1 is exact, * 2^n2 rounds once (subnormals too)
    "add.s32 %n1, %n1, 1023",
    "cvt.u64.u32 %b, %n1",
    "shl.b64 %b, %b, 52",
    "mov.b64 %s1, %b",
    "add.s32 %n2, %n2, 1023",
    "cvt.u64.u32 %b, %n2",
    "shl.b64 %b, %b, 52",
    "mov.b64 %s2, %b",
    "mul.rn.f64 %y, %y, %s1",
    "mul.rn.f64 %y, %y, %s2",
    "st.param.f64 [ret], %y",
    "ret",
  ]
  regs = {".pred": ["%p0"], ".b32": ["%ni", "%n1", "%n2"], ".b64": ["%b"], ".f64": ["%x", "%n", "%f", "%y", "%s1", "%s2"]}
  return _func("exp2_f64", "f64", regs, body)


def two_over_pi_table() -> str:
  words = ", ".join(f"0x{w:016X}" for w in constants().table)
  return f".const .align 8 .u64 {HELPER_PREFIX}two_over_pi[{TABLE_WORDS}] = {{{words}}};"


# helper name -> (builder, helpers it calls); emitted in this order, so callees come first
HELPERS = {"sin_f64": (_helper_sin_f64, ()), "sin_f32": (_helper_sin_f32, ("sin_f64",)), "log2_f32": (lambda: _helper_log2("f32"), ()),
           "log2_f64": (lambda: _helper_log2("f64"), ()), "exp2_f64": (_helper_exp2_f64, ())}


def helper_ptx(name: str) -> str:
  """The PTX text of one math helper (`.func`), e.g. 'sin_f64' (for tests and inspection)."""
  return HELPERS[name][0]()
