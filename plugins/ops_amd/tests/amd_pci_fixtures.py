"""Opening AMD through the PCI interface on the fake GPU: a fake sysfs tree (the function bound to amdgpu, unbound and
bound back by plugrt-amd-pci's real sysfs code), the firmware files in a folder, and the fake GPU behind the BARs:
registers (FakeRegisters with the fake PSP, IP firmware loader, SMU, RLC and CP), VRAM (a dense FakeVRAM) and the
doorbell BAR of the fake MEC, which runs each dispatch through the reference interpreter. plugrt-amd-pci's
`open_pci` runs the whole bring-up on it and hands plugrt-amd's device the GPU (a PCIGPU); the compiler is the real AMD_LLVM,
telling the fake MEC which IR each code object it builds was made from (amd_fixtures.recording_compiler)."""
from __future__ import annotations

import os
import shutil
import tempfile
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import fake_amdfw
import fake_amdgpu
import fake_amdq
from amd_fixtures import recording_compiler

import plugrt_amd
import plugrt_amd_pci
from plugrt.errors import DeviceUnavailable, Reason
from plugrt.hookspecs import InterfaceSpec, Probe, hookimpl
from plugrt.registry import isolated

ENV = {"AMD": "1", "AMD_LLVM": "1", "AMD_IFACE": "PCI", "PLUGRT_AMD_ALLOW_UNBIND": "1", "PLUGRT_AMD_TIMEOUT": "20"}
VRAM_MIB = 128


class BARWindow:
  """The first `size` bytes of the fake VRAM: a VRAM BAR smaller than VRAM (a GPU without resizable BAR)."""

  def __init__(self, vram: fake_amdgpu.FakeVRAM, size: int):
    self.vram, self.size = vram, size

  def _check(self, offset: int, n: int) -> None:
    if not 0 <= offset and offset + n <= self.size: raise AssertionError(f"BAR0 access at 0x{offset:x}+{n} past its {self.size} bytes")

  def read(self, offset: int, n: int) -> bytes: self._check(offset, n); return self.vram.read(offset, n)
  def write(self, offset: int, data: bytes) -> None: self._check(offset, len(data)); self.vram.write(offset, data)
  def read32(self, offset: int) -> int: self._check(offset, 4); return self.vram.read32(offset)
  def write32(self, offset: int, value: int) -> None: self._check(offset, 4); self.vram.write32(offset, value)


#: the fake boards by GC major version: 11 is RDNA3 (the RX 7900's IP versions), 12 RDNA4 (the RX 9070's); the
#: register bases are the fake's own (RDNA3's) either way
BOARDS: dict[int, dict[str, tuple[int, int, int]]] = {
  11: dict(gc=(11, 0, 0), mp0=(13, 0, 0), mp1=(13, 0, 0), sdma=(6, 0, 0), mmhub=(3, 0, 0), nbio=(4, 3, 0)),
  12: dict(gc=(12, 0, 0), mp0=(14, 0, 2), mp1=(14, 0, 2), sdma=(7, 0, 0), mmhub=(4, 1, 0), nbio=(6, 3, 1))}
#: the sOS file's parts on MP0 14 (RDNA4 adds the IP key manager driver)
SOS14 = ("sos", "sys_drv", "kdb", "toc", "spl", "soc_drv", "intf_drv", "dbg_drv", "ras_drv", "ipkeymgr_drv")
GENS = tuple(BOARDS)


def fake_gen(config: Any, option: str) -> int:
  """The fake board's generation for a session plugin: its `option` (--amd-pci-gen, --amd-usb-gen), else
  PLUGRT_FAKE_AMD_GEN, else 11."""
  gen = config.getoption(option, None) or int(os.environ.get("PLUGRT_FAKE_AMD_GEN") or 11)
  if gen not in GENS: raise ValueError(f"PLUGRT_FAKE_AMD_GEN={gen}: the fake AMD boards are GC {' and '.join(map(str, GENS))}")
  return gen


class FakeBoard:
  """A fake GPU of generation `gen` (BOARDS): registers, dense VRAM, PSP, IP firmware loader, SMU, RLC and CP, every
  firmware file written into `firmware`. What FakePCIGPU and the USB session's bridge put behind their BARs."""

  def __init__(self, firmware: str, vram_mib: int = VRAM_MIB, gen: int = 11):
    if gen not in BOARDS: raise ValueError(f"no fake board of GC generation {gen} (have {', '.join(map(str, GENS))})")
    b = self.board = BOARDS[gen]
    self.gen, self.firmware = gen, firmware
    sos = fake_amdgpu.sos_file(parts=SOS14) if gen == 12 else fake_amdgpu.sos_file()
    with open(os.path.join(firmware, f"psp_{'_'.join(map(str, b['mp0']))}_sos.bin"), "wb") as f: f.write(sos)
    blobs, want = fake_amdfw.ip_files(b["gc"], b["mp1"], b["sdma"], 4) if gen == 12 else fake_amdfw.ip_files()
    for name, blob in blobs.items():
      with open(os.path.join(firmware, name), "wb") as f: f.write(blob)
    table = fake_amdgpu.table(**b) if gen == 12 else None
    self.regs, self.vram = fake_amdgpu.fake_gpu(blob=table, mib=vram_mib, dense=True, gmc=gen)
    self.mp0 = fake_amdgpu.FakeMP0(self.regs, self.vram, sos, mp0=b["mp0"], mmhub=b["mmhub"])
    mp1 = fake_amdfw.FakeMP1(self.regs, b["mp1"], if_version=0x26 if gen == 12 else 0x3D)
    fake_amdfw.FakeIPFirmware(self.mp0, want, mp1, fake_amdfw.FakeRLC(self.regs, b["gc"]))
    fake_amdfw.FakeCP(self.regs)
    self.mec = fake_amdq.FakeMEC(self.regs, self.vram, fake_amdgpu.MC_BASE)


class FakePCIGPU:
  """One fake GPU on a fake PCI bus, every firmware file present: RDNA3 (GC 11.0.0, MP0 13.0.0, NBIO 4.3.0) by
  default, RDNA4 (GC 12.0.0, MP0 14.0.2, MMHUB 4.1.0, NBIF 6.3.1) with gen=12."""

  def __init__(self, vram_mib: int = VRAM_MIB, bar0_mib: int | None = None, gen: int = 11):
    self.dir = tempfile.mkdtemp(prefix="plugrt-fake-pci-")
    self.devices, self.drivers = fake_amdgpu.make_sysfs(os.path.join(self.dir, "sys"), vram_mib=vram_mib)
    self.kernel = fake_amdgpu.KernelWrites(self.devices, self.drivers)
    self.firmware = os.path.join(self.dir, "firmware")
    os.makedirs(self.firmware)
    board = self.board = FakeBoard(self.firmware, vram_mib, gen)
    self.gen, self.regs, self.vram, self.mp0, self.mec = gen, board.regs, board.vram, board.mp0, board.mec
    self.vram_bar = self.vram if bar0_mib is None else BARWindow(self.vram, bar0_mib << 20)
    self.mapped: list[int] = []

  def bars(self, fn: Any, index: int) -> Any:
    """plugrt-amd-pci's BAR seam: the fake's windows in place of the sysfs resource files."""
    self.mapped.append(index)
    bar = {5: self.regs, 0: self.vram_bar, 2: self.mec.doorbells}.get(index)
    if bar is None: raise DeviceUnavailable(f"the fake GPU has no BAR{index}", Reason.NO_DEVICE)
    return bar

  def register(self, lib: bytes, kernel: Any) -> None: self.mec.register(lib, kernel)

  def open(self, device: Any) -> Any:
    return plugrt_amd_pci.open_pci(device, self.devices, self.drivers, self.kernel, psp_timeout=2.0, bars=self.bars)

  def shutdown(self) -> None: shutil.rmtree(self.dir, ignore_errors=True)


def fake_driverless_plugins(fake: Any, iface: str, found: str, description: str) -> list[Any]:
  """plugrt-amd's real hooks behind a probe that finds `fake`, and an interface plugin for `iface` (PCI, USB) whose
  open is the fake's: what the PCI and USB sessions and tests load (the compiler records IR for the fake MEC)."""
  probe = lambda *a: Probe.found(1, found)
  mod = types.ModuleType(f"fake_plugrt_amd_{iface.lower()}_backend")
  spec = plugrt_amd.plugrt_backends()[0]._replace(probe=probe)
  mod.plugrt_backends = hookimpl(lambda: [spec])  # type: ignore[attr-defined]
  for hook in ("plugrt_open_device", "plugrt_allocator", "plugrt_program"): setattr(mod, hook, getattr(plugrt_amd, hook))
  mod.plugrt_compiler = hookimpl(lambda device, compiler: recording_compiler(device, fake))  # type: ignore[attr-defined]
  plugin = types.ModuleType(f"fake_plugrt_amd_{iface.lower()}")
  plugin.plugrt_interfaces = hookimpl(lambda: [InterfaceSpec("AMD", iface, probe, auto=False, description=description)])  # type: ignore[attr-defined]
  plugin.plugrt_open_interface = hookimpl(lambda device, interface: fake.open(device))  # type: ignore[attr-defined]
  return [mod, plugin, "plugrt.reference"]


def fake_pci_plugins(fake: FakePCIGPU) -> list[Any]:
  return fake_driverless_plugins(fake, "PCI", "fake PCI GPU", "the fake GPU on a fake sysfs tree")


def env_for(fake: FakePCIGPU, env: dict[str, str] | None = None) -> dict[str, str]:
  return {**ENV, "PLUGRT_AMD_FIRMWARE": fake.firmware, **(env or {})}


@contextmanager
def fake_pci_amd(env: dict[str, str] | None = None, **kw: Any) -> Iterator[tuple[FakePCIGPU, Any]]:
  """(the fake PCI GPU, the AMD device opened on it through PCI), in a registry of exactly AMD, its PCI interface and
  PYTHON."""
  fake = FakePCIGPU(**kw)
  try:
    with isolated(fake_pci_plugins(fake), env=env_for(fake, env)) as reg: yield fake, reg.open("AMD")
  finally: fake.shutdown()
