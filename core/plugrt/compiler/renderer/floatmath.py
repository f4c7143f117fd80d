"""Exact constants for the float math routines renderers emit where the target's own exp2/log2/sin are not accurate
enough (PTX, WGSL): pi, ln 2 and 2/pi to any number of bits, correct rounding to float32, and the bounds the sine
routines share. Everything is computed in integers or Fractions, so every renderer gets the same bits on every
machine, whatever its float formatting or libm. `fractions` is imported only by the functions that return Fractions:
the WGSL renderer, imported on a device's first compile, needs none of them.
"""
from __future__ import annotations

import functools
import math
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
  from fractions import Fraction

#: below this |x|, sin(x) rounded to float32 is x itself (sin x = x - x^3/6, and x^2/6 < 2^-25 there): sine routines
#: return x unchanged, which also keeps -0 and subnormals
SIN_F32_EXACT_BELOW = 2.0 ** -12
#: the bits the Fractions below are computed with: far more than any float's 53, so rounding them is exact
PRECISION = 1600


@functools.cache
def pi_fixed(bits: int) -> int:
  """floor(pi * 2**bits), give or take one unit: Machin's formula (pi = 16 atan(1/5) - 4 atan(1/239)) in integers,
  with 32 guard bits."""
  g = bits + 32
  def atan_inv(n: int) -> int:  # atan(1/n) * 2**g
    power, total, k, sign = (1 << g) // n, 0, 0, 1
    while power:
      total += sign * (power // (2 * k + 1))
      power //= n * n; k += 1; sign = -sign
    return total
  return (16 * atan_inv(5) - 4 * atan_inv(239)) >> 32


@functools.cache
def ln2_fixed(bits: int) -> int:
  """floor(ln 2 * 2**bits), give or take one unit: ln 2 = 2 atanh(1/3), in integers with 32 guard bits."""
  g = bits + 32
  power, total, k = (1 << g) // 3, 0, 0
  while power:
    total += power // (2 * k + 1)
    power //= 9; k += 1
  return (2 * total) >> 32


def pi(bits: int = PRECISION) -> Fraction:
  """pi as a Fraction, exact to `bits` bits."""
  from fractions import Fraction
  return Fraction(pi_fixed(bits), 1 << bits)


def ln2(bits: int = PRECISION) -> Fraction:
  """ln 2 as a Fraction, exact to `bits` bits."""
  from fractions import Fraction
  return Fraction(ln2_fixed(bits), 1 << bits)


def two_over_pi_words(words: int, word_bits: int, pad: int, bits: int = PRECISION) -> tuple[int, ...]:
  """The bits of 2/pi as a table for Payne-Hanek reduction: `pad` zero bits, then 2/pi's fractional bits b_1, b_2, ...
  (2/pi = sum b_i 2^-i), cut into `words` unsigned words of `word_bits` bits, most significant first."""
  total = words * word_bits
  table = (1 << (total - pad + 1 + bits)) // pi_fixed(bits)  # floor(2/pi * 2**(total - pad))
  mask = (1 << word_bits) - 1
  return tuple((table >> (total - word_bits * (j + 1))) & mask for j in range(words))


def round_f32(x: Fraction | int) -> float:
  """x correctly rounded (to nearest even) to a normal float32."""
  return round_f32_ratio(x.numerator, x.denominator)


def round_f32_ratio(num: int, den: int) -> float:
  """num / den (den > 0) correctly rounded (to nearest even) to a normal float32, in integers."""
  if num == 0: return 0.0
  a = abs(num)
  e = a.bit_length() - den.bit_length()
  if (a << max(0, -e)) < (den << max(0, e)): e -= 1  # now 2^e <= a/den < 2^(e+1)
  shift = e - 23  # a/den / 2^shift is in [2^23, 2^24)
  n, rem = divmod(a << max(0, -shift), den << max(0, shift))
  d = den << max(0, shift)
  if 2 * rem > d or (2 * rem == d and n & 1): n += 1
  v = math.ldexp(n, shift)
  return -v if num < 0 else v


def f32_bits(x: float) -> int:
  """The IEEE bits of float32 x (x must be a float32 value)."""
  return struct.unpack("<I", struct.pack("<f", x))[0]


def split(x: Fraction, parts: int, rnd: Callable[[Fraction], float]) -> tuple[float, ...]:
  """x as a sum of `parts` floats, each the rounding (by rnd: float, round_f32) of what the ones before left over."""
  from fractions import Fraction
  out: list[float] = []
  for _ in range(parts): out.append(rnd(x - sum(map(Fraction, out))))
  return tuple(out)


def sin_cos_taylor(k: int, rnd: Callable[[Fraction], float]) -> float:
  """The Taylor coefficient of x^k in sin (odd k) or cos (even k): (-1)^(k//2) / k!, rounded by rnd."""
  from fractions import Fraction
  return rnd(Fraction((-1) ** (k // 2), math.factorial(k)))
