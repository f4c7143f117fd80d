"""The conformance suite on NV through the driverless PCI interface, against the fake GPU: collected only under the
nv_pci_session pytest plugin (which makes that NV the process's), with PTX kernels from ptxas:

    PYTHONPATH=$PYTHONPATH:plugins/ops_nv/tests python -m pytest -p nv_pci_session plugins/ops_nv/tests/test_nv_pci_conformance.py
"""
import sys

import pytest

from plugrt_testing.conformance import ConformanceSuite

if "nv_pci_session" in sys.modules:  # (elsewhere NV is not the fake's: the suite is not collected at all)
  class TestNVThroughPCI(ConformanceSuite):
    device = "NV"
    compilers = ("PTX",)

    def test_entry_module_imports_only_stdlib(self) -> None:
      pytest.skip("the session's NV plugin module is made in memory around plugrt-nv's hooks; plugrt-nv's own entry module is checked "
                  "where NV runs through NVK")
