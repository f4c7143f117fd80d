"""Where fuzz cases run: the devices and (device, compiler) pairs present, and which of them round exactly or do fast math.
"""
from __future__ import annotations

from dataclasses import dataclass

#: devices whose DIV, SQRT and RECIP are correctly rounded (IEEE); elsewhere they are approximate (K.ULPS)
EXACT_DEVICES = frozenset({"CPU", "PYTHON"})
#: devices whose compilers do fast math: WGSL lets them assume finite math (on lavapipe and NVIDIA `x - x` folds to 0
#: for an infinite x), and they reassociate float additions ((x + x) - 0.1 becomes x + (x - 0.1)). IR kernels' float
#: results that the reference makes infinite or NaN are not compared there (NaN tests still are), and DSL cases give
#: each float + and - an error bound of the rounding a reassociation may move (`dsl_case(..., reassociates=True)`).
FAST_MATH_DEVICES = frozenset({"WEBGPU"})


@dataclass(frozen=True)
class Target:
  device: str
  compiler: str | None = None  # None: the device's default (DSL and Tensor cases)

  def __str__(self) -> str: return f"{self.device}:{self.compiler}" if self.compiler else self.device
  @property
  def exact_div(self) -> bool: return self.device in EXACT_DEVICES
  @property
  def fast_math(self) -> bool: return self.device in FAST_MATH_DEVICES


def devices() -> list[str]:
  from plugrt.device import Device
  return Device.available()


def ir_targets() -> list[Target]:
  """Every (device, compiler) pair whose toolchain is present."""
  from plugrt.device import Device
  reg = Device.registry
  out = []
  for name in Device.available():
    spec = reg.backend(name).spec
    for c in spec.compilers if spec else ():
      if reg.compiler_probe(name, c.name).ok: out.append(Target(name, c.name))
  return out
