"""A pytest plugin that makes AMD, on the fake GPU through the PCI interface, a device of the process's registry for a
whole test session, so the tests that run "on every available device" (tests/test_dsl.py, tests/test_tensor.py) run
on AMD through the driverless path: plugrt-amd-pci's sysfs take/release and the whole bring-up (PSP, firmware, SMU,
GART, VMID 8, the MEC queue) on the fakes, then plugrt-amd's device on the PCIGPU (VRAM allocations mapped in VMID 8, CPU copies
through the VRAM BAR, code objects from AMD_LLVM in VRAM, AQL dispatches on the MEC queue):

    PYTHONPATH=$PYTHONPATH:plugins/ops_amd/tests python -m pytest -p amd_pci_session tests/test_dsl.py tests/test_tensor.py -k AMD

`--amd-pci-gen 12` (or PLUGRT_FAKE_AMD_GEN=12) makes the fake GPU an RDNA4 board (GC 12.0.0, MP0 14.0.2, MMHUB 4.1.0,
NBIF 6.3.1: GMC 12 hubs and page tables); the default, 11, is RDNA3 (GC 11.0.0).

The registry is the usual one with plugrt-amd's, plugrt-amd-kfd's and plugrt-amd-pci's own entry points disabled and
the fake-backed AMD (amd_pci_fixtures.fake_pci_plugins) in their place, AMD_IFACE=PCI."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

_undo: list[Callable[[], None]] = []
_fake: list[Any] = []


def pytest_addoption(parser: Any) -> None:
  from amd_pci_fixtures import GENS
  parser.addoption("--amd-pci-gen", type=int, choices=GENS, default=None,
                   help="GC generation of the fake AMD GPU: 11 (RDNA3, default) or 12 (RDNA4); or PLUGRT_FAKE_AMD_GEN")


def pytest_configure(config: Any) -> None:
  from amd_pci_fixtures import FakePCIGPU, env_for, fake_gen, fake_pci_plugins

  from plugrt_testing.fakegpu import use_fake_for_session
  fake = FakePCIGPU(gen=fake_gen(config, "--amd-pci-gen"))
  _fake.append(fake)
  env = {k: v for k, v in env_for(fake).items() if k not in ("AMD", "AMD_LLVM")}
  _undo.append(use_fake_for_session(fake, fake_pci_plugins(fake)[:2], env, ("plugrt-amd", "plugrt-amd-kfd", "plugrt-amd-pci")))


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
  """The run fails when the tests never reached the fake MEC (AMD was not the PCI device) or the fakes saw a rule broken."""
  if not _fake or not session.testscollected or session.config.option.collectonly: return
  fake = _fake[0]
  wrong = [*fake.mec.violations, *fake.mec.faults, *fake.mp0.violations]
  if not fake.mec.dispatches or wrong or 5 not in fake.mapped:
    where = f"{len(fake.mec.dispatches)} dispatches on the fake MEC; " + ("; ".join(wrong) or "no violations")
    session.config.get_terminal_writer().line(f"amd_pci_session: the PCI path did not run cleanly: {where}", red=True)
    session.exitstatus = 1
  else:
    session.config.get_terminal_writer().line(f"amd_pci_session: {len(fake.mec.dispatches)} dispatches ran through the PCI queue on the fake "
                                              f"GC {'.'.join(map(str, fake.board.board['gc']))} GPU")


def pytest_unconfigure(config: Any) -> None:
  if _undo: _undo.pop()()
