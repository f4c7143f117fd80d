"""float64 EXP2, LOG2 and SIN for the AMDGPU target, as LLVM IR helper functions.

LLVM's AMDGPU backend lowers llvm.exp2/log2/sin of half and float to the GPU's own instructions, but has no
instruction and no library call for them on double (llc stops with "no libcall available for fexp2"), so plugrt
brings its own, built only from what the backend does lower: fma, rint, floor, ldexp, frexp and IEEE division.
Constants are computed exactly by plugrt.compiler.renderer.floatmath and written as the bits of the nearest double.

- exp2: x = n + r (n = rint x, |r| <= 1/2, exact); 2^r = e^(r ln 2) by its Taylor series to degree 13
  (the first term left out is below 2^-57); ldexp(., n). NaN stays NaN, past +-1075 it is inf or 0.
- log2: x = m 2^e (frexp, m in [sqrt(1/2), sqrt(2))); with f = m - 1 (exact) and s = f / (2 + f),
  ln m = 2 atanh s = f - s (f - R), R = 2 s^2/3 + 2 s^4/5 + ... to s^20; the result e + ln(m) / ln 2 with 1/ln 2 in
  two parts. 0 is -inf, negatives NaN, inf inf.
- sin: below 2^-26 sin x is x (keeps -0); else x = k pi/2 + r with pi/2 in three doubles (Cody-Waite through fma),
  then sin r or cos r (Taylor to r^19, r^18) by the quadrant k mod 4. Accurate to a few ulp while |x| < 2^30;
  larger arguments lose accuracy (no Payne-Hanek reduction yet). Infinities and NaN give NaN.
"""
from __future__ import annotations

import math
import struct

#: every helper: its name, then its text and the intrinsics it declares (built on first use)
_cache: dict[str, tuple[str, dict[str, str]]] = {}
ATTRS = "alwaysinline nounwind"


def _d(x: float) -> str: return f"0x{struct.unpack('<Q', struct.pack('<d', x))[0]:016X}"


def _horner(var: str, coeffs: list[float], out: str, lines: list[str], tag: str) -> None:
  """`out` = coeffs[0] + var * (coeffs[1] + var * (...)), through fma, highest degree first."""
  acc = _d(coeffs[-1])
  for j, c in enumerate(reversed(coeffs[:-1])):
    name = out if j == len(coeffs) - 2 else f"%{tag}{j}"
    lines.append(f"  {name} = call double @llvm.fma.f64(double {acc}, double {var}, double {_d(c)})")
    acc = name


def _exp2() -> str:
  from fractions import Fraction

  from plugrt.compiler.renderer.floatmath import PRECISION, ln2
  ln2_d = float(ln2(PRECISION))
  taylor = [float(Fraction(1, math.factorial(k))) for k in range(14)]  # e^t = sum t^k / k!
  lines = ["define internal double @__plugrt_amd_exp2_f64(double %x) #HELPER {",
           "  %lo = call double @llvm.maxnum.f64(double %x, double -2000.0)",
           "  %xc = call double @llvm.minnum.f64(double %lo, double 2000.0)",
           "  %n = call double @llvm.rint.f64(double %xc)",
           "  %r = fsub double %xc, %n",
           f"  %t = fmul double %r, {_d(ln2_d)}"]
  _horner("%t", taylor, "%p", lines, "e")
  lines += ["  %ni = fptosi double %n to i32",
            "  %y = call double @llvm.ldexp.f64.i32(double %p, i32 %ni)",
            "  %nan = fcmp uno double %x, 0.0",
            "  %res = select i1 %nan, double %x, double %y",
            "  ret double %res", "}"]
  return "\n".join(lines)


def _log2() -> str:
  from fractions import Fraction

  from plugrt.compiler.renderer.floatmath import PRECISION, ln2, split
  inv_hi, inv_lo = split(1 / ln2(PRECISION), 2, float)
  series = [float(Fraction(2, 2 * k + 1)) for k in range(1, 11)]  # R / z = 2/3 + 2z/5 + ... (z = s^2)
  lines = ["define internal double @__plugrt_amd_log2_f64(double %x) #HELPER {",
           "  %fr = call { double, i32 } @llvm.frexp.f64.i32(double %x)",
           "  %m0 = extractvalue { double, i32 } %fr, 0",
           "  %e0 = extractvalue { double, i32 } %fr, 1",
           f"  %small = fcmp olt double %m0, {_d(math.sqrt(0.5))}",
           "  %m1 = fmul double %m0, 2.0",
           "  %m = select i1 %small, double %m1, double %m0",
           "  %e1 = sub i32 %e0, 1",
           "  %e = select i1 %small, i32 %e1, i32 %e0",
           "  %f = fsub double %m, 1.0",
           "  %den = fadd double %f, 2.0",
           "  %s = fdiv double %f, %den",
           "  %z = fmul double %s, %s"]
  _horner("%z", series, "%q", lines, "l")
  lines += ["  %R = fmul double %z, %q",
            "  %fR = fsub double %f, %R",
            "  %sfR = fmul double %s, %fR",
            "  %L = fsub double %f, %sfR",                                     # ln m
            f"  %hi = fmul double %L, {_d(inv_hi)}",
            "  %nhi = fneg double %hi",
            f"  %err = call double @llvm.fma.f64(double %L, double {_d(inv_hi)}, double %nhi)",
            f"  %lo = call double @llvm.fma.f64(double %L, double {_d(inv_lo)}, double %err)",
            "  %ed = sitofp i32 %e to double",
            "  %eh = fadd double %ed, %hi",
            "  %y = fadd double %eh, %lo",
            "  %zero = fcmp oeq double %x, 0.0",
            "  %y1 = select i1 %zero, double 0xFFF0000000000000, double %y",
            "  %neg = fcmp ult double %x, 0.0",                                  # negative, or NaN
            "  %y2 = select i1 %neg, double 0x7FF8000000000000, double %y1",
            "  %inf = fcmp oeq double %x, 0x7FF0000000000000",
            "  %res = select i1 %inf, double %x, double %y2",
            "  ret double %res", "}"]
  return "\n".join(lines)


def _sin() -> str:
  from plugrt.compiler.renderer.floatmath import PRECISION, pi, sin_cos_taylor, split
  p1, p2, p3 = split(pi(PRECISION) / 2, 3, float)
  two_over_pi = float(2 / pi(PRECISION))
  sin_c = [sin_cos_taylor(k, float) for k in range(3, 20, 2)]  # sin r = r + r * z * (c3 + c5 z + ...)
  cos_c = [sin_cos_taylor(k, float) for k in range(2, 19, 2)]  # cos r = 1 + z * (c2 + c4 z + ...)
  lines = ["define internal double @__plugrt_amd_sin_f64(double %x) #HELPER {",
           f"  %k0 = fmul double %x, {_d(two_over_pi)}",
           "  %k = call double @llvm.rint.f64(double %k0)",
           "  %nk = fneg double %k",
           f"  %r1 = call double @llvm.fma.f64(double %nk, double {_d(p1)}, double %x)",
           f"  %r2 = call double @llvm.fma.f64(double %nk, double {_d(p2)}, double %r1)",
           f"  %r = call double @llvm.fma.f64(double %nk, double {_d(p3)}, double %r2)",
           "  %z = fmul double %r, %r"]
  _horner("%z", sin_c, "%sp", lines, "s")
  _horner("%z", cos_c, "%cp", lines, "c")
  lines += ["  %rz = fmul double %r, %z",
            "  %sn = call double @llvm.fma.f64(double %rz, double %sp, double %r)",
            "  %cs = call double @llvm.fma.f64(double %z, double %cp, double 1.0)",
            # the quadrant k mod 4, from a finite k (|k| < 2^53 is exact; past it every double is a multiple of 4)
            "  %fin = fcmp one double %k, 0x7FF0000000000000",
            "  %kf = select i1 %fin, double %k, double 0.0",
            "  %k4 = fmul double %kf, 0.25",
            "  %fl = call double @llvm.floor.f64(double %k4)",
            "  %m4 = call double @llvm.fma.f64(double %fl, double -4.0, double %kf)",
            "  %q = fptosi double %m4 to i32",
            "  %odd0 = and i32 %q, 1",
            "  %odd = icmp ne i32 %odd0, 0",
            "  %neg0 = and i32 %q, 2",
            "  %neg = icmp ne i32 %neg0, 0",
            "  %v = select i1 %odd, double %cs, double %sn",
            "  %nv = fneg double %v",
            "  %y = select i1 %neg, double %nv, double %v",
            "  %ax = call double @llvm.fabs.f64(double %x)",
            f"  %tiny = fcmp olt double %ax, {_d(2.0 ** -26)}",
            "  %y1 = select i1 %tiny, double %x, double %y",
            "  %bad = fcmp ueq double %ax, 0x7FF0000000000000",                  # inf or NaN
            "  %res = select i1 %bad, double 0x7FF8000000000000, double %y1",
            "  ret double %res", "}"]
  return "\n".join(lines)


_DECLS = {
  "llvm.fma.f64": "declare double @llvm.fma.f64(double, double, double)",
  "llvm.rint.f64": "declare double @llvm.rint.f64(double)",
  "llvm.floor.f64": "declare double @llvm.floor.f64(double)",
  "llvm.fabs.f64": "declare double @llvm.fabs.f64(double)",
  "llvm.maxnum.f64": "declare double @llvm.maxnum.f64(double, double)",
  "llvm.minnum.f64": "declare double @llvm.minnum.f64(double, double)",
  "llvm.ldexp.f64.i32": "declare double @llvm.ldexp.f64.i32(double, i32)",
  "llvm.frexp.f64.i32": "declare { double, i32 } @llvm.frexp.f64.i32(double)",
}
_BUILDERS = {"exp2": _exp2, "log2": _log2, "sin": _sin}
#: the IR ops these helpers implement, by name
NAMES = tuple(_BUILDERS)


def helper(name: str, attrs: str = ATTRS) -> tuple[str, str, dict[str, str]]:
  """(symbol, definition, intrinsic declarations it needs) of the float64 `name` (exp2, log2, sin) helper."""
  if name not in _cache:
    text = _BUILDERS[name]()
    _cache[name] = (text, {k: v for k, v in _DECLS.items() if f"@{k}(" in text})
  text, decls = _cache[name]
  return f"__plugrt_amd_{name}_f64", text.replace("#HELPER", attrs), decls
