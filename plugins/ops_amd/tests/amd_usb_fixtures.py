"""Opening AMD through the USB interface on the fake bridge: the fake board of amd_pci_fixtures (registers, VRAM, PSP,
IP firmware, SMU, RLC, CP, MEC) behind a fake ASM24xx bridge (fake_amdgpu.FakeASM24: XDATA, the TLP engine, the SRAM
window), whose BAR2 TLPs reach the fake MEC's doorbells and whose SRAM the fake PSP reads through a fake GART.
plugrt-amd-usb's `open_usb` runs the whole bring-up over the bridge's commands and hands plugrt-amd's device the GPU
(plugrt_amd_usb.gpu.USBGPU, a DriverlessGPU: host copies through the SRAM window and a copy kernel, TLPs for small parts)."""
from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import fake_amdgpu
from amd_fixtures import recording_compiler
from amd_pci_fixtures import ENV, FakeBoard, fake_driverless_plugins

import plugrt_amd_usb
from plugrt.context import PluginContext
from plugrt.registry import isolated

USB_ENV = {**ENV, "AMD_IFACE": "USB"}
VRAM_MIB = 64


class FakeUSBGPU:
  """One fake GPU (gen 11: RDNA3, 12: RDNA4) behind the fake bridge; VRAM and BAR0 both `vram_mib` unless `bar0_mib`."""

  def __init__(self, vram_mib: int = VRAM_MIB, gen: int = 11, bar0_mib: int | None = None):
    self.dir = tempfile.mkdtemp(prefix="plugrt-fake-usb-")
    self.firmware = self.dir
    board = self.board = FakeBoard(self.firmware, vram_mib, gen)
    self.gen, self.regs, self.vram, self.mp0, self.mec = gen, board.regs, board.vram, board.mp0, board.mec
    self.bridge = fake_amdgpu.FakeASM24(self.regs, self.vram, bar0_size=(bar0_mib or vram_mib) << 20)
    self.bridge.doorbells = self.mec.doorbells
    self.mec.vm.system = self.bridge          # VMID 8's system pages reach the bridge's SRAM (bus 0x200000)
    self.gart = fake_amdgpu.FakeGART(self.regs, self.bridge.dma_read)
    self.mp0.gart = self.gart.read
    self.opened = 0
    self.gpu: Any = None

  def register(self, lib: bytes, kernel: Any) -> None: self.mec.register(lib, kernel)

  def open(self, device: Any) -> Any:
    self.opened += 1
    gpu = plugrt_amd_usb.open_usb(device, self.bridge, psp_timeout=2.0)
    gpu.path.compiler = lambda info: recording_compiler(info, self)     # the fake MEC learns plugrt_copy32's IR
    self.gpu = gpu
    return gpu

  def shutdown(self) -> None: shutil.rmtree(self.dir, ignore_errors=True)


def fake_usb_plugins(fake: FakeUSBGPU) -> list[Any]:
  return fake_driverless_plugins(fake, "USB", "fake USB bridge", "the fake GPU behind a fake ASM24xx bridge")


def env_for(fake: FakeUSBGPU, env: dict[str, str] | None = None) -> dict[str, str]:
  return {**USB_ENV, "PLUGRT_AMD_FIRMWARE": fake.firmware, **(env or {})}


def context(fake: FakeUSBGPU) -> PluginContext: return PluginContext(env_for(fake))


@contextmanager
def fake_usb_amd(env: dict[str, str] | None = None, **kw: Any) -> Iterator[tuple[FakeUSBGPU, Any]]:
  """(the fake bridge and GPU, the AMD device opened on it through USB), in a registry of exactly AMD, its USB
  interface and PYTHON."""
  fake = FakeUSBGPU(**kw)
  try:
    with isolated(fake_usb_plugins(fake), env=env_for(fake, env)) as reg: yield fake, reg.open("AMD")
  finally: fake.shutdown()
