"""A pytest plugin that makes NV, on the fake GPU through the PCI interface, a device of the process's registry for a
whole test session, so the tests that run "on every available device" (tests/test_dsl.py, tests/test_tensor.py,
tests/test_conformance.py) run on NV through the driverless path: plugrt-nv-pci's sysfs take/release, the GSP boot
(FWSEC-FRTS and booter_load, or the FSP's chain of trust on GB202; GSP-RM's init), the RM objects over RPC (golden
context, VA space with plugrt's page tables, channel group, channels) on fake_nvpci.py's GPU, then plugrt-nv's device
on the PCIInterface, its command stream run by fake_gpu.py's engine behind the fake's page tables, each launch through
the reference interpreter:

    PYTHONPATH=$PYTHONPATH:plugins/ops_nv/tests python -m pytest -p nv_pci_session tests/test_dsl.py tests/test_tensor.py -k NV

`--nv-pci-chip ad102` (or PLUGRT_FAKE_NV_CHIP=ad102) makes the fake GPU an Ada AD102, `gb202` a Blackwell GB202
(booted through its FSP, fake_nvpci_gb.py; GPU-MMU version 3, QMD version 5); the default, ga102, is an Ampere
GA102. `--nv-pci-dma vfio` puts the GPU in a translating IOMMU group and runs plugrt-nv-pci's VFIO path (binding to
vfio-pci, the type-1 container, MAP_DMA for every host buffer, the BARs through the device fd) on fake_vfio.py's kernel.
Kernels are PTX from plugrt's renderer assembled by ptxas (NV_PTX=1), so ptxas must be installed.

The registry is the usual one with plugrt-nv's, plugrt-nv-nvk's and plugrt-nv-pci's own entry points disabled and the
fake-backed NV (fake_nvpci_board.fake_pci_plugins) in their place, NV_IFACE=PCI."""
from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

_undo: list[Callable[[], None]] = []
_fake: list[Any] = []


def pytest_addoption(parser: Any) -> None:
  parser.addoption("--nv-pci-chip", choices=("ga102", "ad102", "gb202"), default=None,
                   help="the fake NV GPU behind the PCI interface: ga102 (Ampere, default), ad102 (Ada) or gb202 (Blackwell); or PLUGRT_FAKE_NV_CHIP")
  parser.addoption("--nv-pci-dma", choices=("pagemap", "vfio"), default="pagemap",
                   help="the fake NV GPU's host memory: a fake allocator standing for PagemapDMA (default), or plugrt-nv-pci's VFIO path")


def pytest_configure(config: Any) -> None:
  from fake_nvpci_board import CHIPS, FakePCINV, fake_pci_plugins

  from plugrt_testing.fakegpu import use_fake_for_session
  chip = config.getoption("--nv-pci-chip", None) or os.environ.get("PLUGRT_FAKE_NV_CHIP") or "ga102"
  if chip not in CHIPS: raise ValueError(f"PLUGRT_FAKE_NV_CHIP={chip}: the fake NV chips are {', '.join(CHIPS)}")
  fake = FakePCINV(chip, dma=config.getoption("--nv-pci-dma", None) or "pagemap")
  _fake.append(fake)
  _undo.append(use_fake_for_session(fake, fake_pci_plugins(fake)[:2], fake.env(), ("plugrt-nv", "plugrt-nv-nvk", "plugrt-nv-pci")))


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
  """The run fails when no launch reached the fake engine through the PCI channels, or the fakes saw a rule broken."""
  if not _fake or not session.testscollected or session.config.option.collectonly: return
  fake = _fake[0]
  launches = sum(len(e.launches) for e in fake.gpu.engines.values())
  ran = sum(len(e.runner.runs) for e in fake.gpu.engines.values())
  wrong = fake.violations()
  if not ran or wrong:
    where = f"{launches} launches ({ran} run) on the fake {fake.chip}; " + ("; ".join(wrong) or "no violations")
    session.config.get_terminal_writer().line(f"nv_pci_session: the PCI path did not run cleanly: {where}", red=True)
    session.exitstatus = 1
  else:
    via = f", host memory through VFIO ({len(fake.vfio.maps)} IOMMU mappings now, {len(fake.vfio.unmapped)} unmapped)" if fake.vfio else ""
    session.config.get_terminal_writer().line(f"nv_pci_session: {ran} launches ran through the PCI channels on the fake {fake.chip.upper()} "
                                              f"({fake.gpu.tlb_flushes} TLB invalidations{via})")


def pytest_unconfigure(config: Any) -> None:
  if _undo: _undo.pop()()
