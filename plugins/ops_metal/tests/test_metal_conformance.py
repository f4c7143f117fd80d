"""The conformance suite on METAL. It runs only on a Mac with a Metal GPU; elsewhere METAL is "no device" and every
device test skips (hardware_optional). Nothing of it has run yet: see docs/backends/metal.md."""
from plugrt.dtype import dtypes
from plugrt_testing.conformance import ConformanceSuite


class TestMetalConformance(ConformanceSuite):
  device = "METAL"
  unsupported_dtypes = (dtypes.float64,)  # Metal has no double; casts and bitcasts still run for the other dtypes
  hardware_optional = True
