"""Prove the backend: plugrt's conformance suite, run against INTERP."""
from plugrt_testing.conformance import ConformanceSuite


class TestInterp(ConformanceSuite):
  device = "INTERP"
