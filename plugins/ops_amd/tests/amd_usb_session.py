"""A pytest plugin that makes AMD, on the fake GPU behind the fake ASM24xx bridge through the USB interface, a device
of the process's registry for a whole test session, so the tests that run "on every available device"
(tests/test_dsl.py, tests/test_tensor.py) run on AMD through the USB path: plugrt-amd-usb's bridge commands and the
whole bring-up over them (PSP boot through the SRAM window, firmware, SMU, GART, VMID 8, the MEC queue rung by
doorbell TLPs), then plugrt-amd's device with the USB copy path (plugrt_amd_usb.gpu.SRAMPath: bulk writes into the
bridge's SRAM and a copy kernel, reads back through the SRAM's first 4 KiB, TLPs for small parts):

    PYTHONPATH=$PYTHONPATH:plugins/ops_amd/tests python -m pytest -p amd_usb_session tests/test_dsl.py tests/test_tensor.py -k AMD

`--amd-usb-gen 12` (or PLUGRT_FAKE_AMD_GEN=12) puts the fake RDNA4 board behind the bridge. The registry is the usual
one with plugrt-amd's own interface distributions disabled and the fake-backed AMD in their place, AMD_IFACE=USB."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

_undo: list[Callable[[], None]] = []
_fake: list[Any] = []


def pytest_addoption(parser: Any) -> None:
  from amd_pci_fixtures import GENS
  parser.addoption("--amd-usb-gen", type=int, choices=GENS, default=None,
                   help="GC generation of the fake AMD GPU behind the bridge: 11 (RDNA3, default) or 12 (RDNA4); or PLUGRT_FAKE_AMD_GEN")


def pytest_configure(config: Any) -> None:
  from amd_pci_fixtures import fake_gen
  from amd_usb_fixtures import FakeUSBGPU, env_for, fake_usb_plugins

  from plugrt_testing.fakegpu import use_fake_for_session
  fake = FakeUSBGPU(gen=fake_gen(config, "--amd-usb-gen"))
  _fake.append(fake)
  env = {k: v for k, v in env_for(fake).items() if k not in ("AMD", "AMD_LLVM")}
  _undo.append(use_fake_for_session(fake, fake_usb_plugins(fake)[:2], env,
                                    ("plugrt-amd", "plugrt-amd-kfd", "plugrt-amd-pci", "plugrt-amd-usb")))


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
  """The run fails when the tests never reached the fake MEC through the bridge, no copy used the SRAM window, or the
  fakes saw a rule broken."""
  if not _fake or not session.testscollected or session.config.option.collectonly: return
  fake = _fake[0]
  b = fake.bridge
  wrong = [*fake.mec.violations, *fake.mec.faults, *fake.mp0.violations, *fake.gart.violations, *b.sram_violations]
  write = session.config.get_terminal_writer().line
  copies = fake.gpu.path.dispatches if fake.gpu is not None else 0
  if not fake.mec.dispatches or wrong or not copies:
    where = f"{len(fake.mec.dispatches)} dispatches on the fake MEC, {copies} through the SRAM; " + ("; ".join(wrong) or "no violations")
    write(f"amd_usb_session: the USB path did not run cleanly: {where}", red=True)
    session.exitstatus = 1
  else:
    write(f"amd_usb_session: {len(fake.mec.dispatches)} dispatches through the USB bridge on the fake GC "
          f"{'.'.join(map(str, fake.board.board['gc']))} GPU ({copies} copies through the SRAM window); {b.commands} bridge commands")


def pytest_unconfigure(config: Any) -> None:
  if _undo: _undo.pop()()
