"""The conformance suite on every backend this repository ships that runs here."""
from plugrt.testing.conformance import ConformanceSuite


class TestPython(ConformanceSuite):
  device = "PYTHON"


class TestCPU(ConformanceSuite):
  device = "CPU"
