"""Falcon and RISC-V engines of the GPU (the GSP's, SEC2's) driven through BAR0: reset, DMA of an image into the
engine's IMEM/DMEM, a heavy-secure run (the boot ROM checks the signature) and the mailboxes. Register offsets and
fields: open-gpu-kernel-modules 570.144 src/common/inc/swref/published/ampere/ga102/dev_falcon_v4.h, dev_riscv_pri.h,
dev_fbif_v4.h, dev_falcon_second_pri.h, dev_gsp.h, dev_sec_pri.h (docs/research/nv-pci.md, "Falcons"); the sequences
follow kernel_falcon_ga102.c / kernel_gsp_falcon_ga102.c (reset, core select, DMA) and kernel_gsp_booter_tu102.c (HS run).

Every wait is bounded (`Falcon.timeout` seconds) and a wait that runs out is a GSPError naming the step, the register
and the value it kept.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from plugrt_nv_pci.errors import GSPError

GSP_BASE, SEC2_BASE = 0x110000, 0x840000                     # NV_FALCON_GSP_BASE, NV_FALCON_SEC_BASE (falcon register windows)
GSP_ENGINE, SEC2_ENGINE = 0x1103C0, 0x8403C0                 # NV_PGSP_FALCON_ENGINE, NV_PSEC_FALCON_ENGINE: bit 0 reset
RISCV_OFFSET = 0x1000                                        # NV_FALCON2_*_BASE - NV_FALCON_*_BASE: the RISC-V and falcon2 registers
FBIF_OFFSET = 0x600                                          # the FBIF (DMA interface) registers of a falcon (dev_fbif_v4.h on GA102)
# falcon registers (offsets from the falcon's base)
MAILBOX0, MAILBOX1, OS, RM, HWCFG2 = 0x040, 0x044, 0x080, 0x084, 0x0F4
CPUCTL, BOOTVEC, DMACTL = 0x100, 0x104, 0x10C
DMATRFBASE, DMATRFMOFFS, DMATRFCMD, DMATRFFBOFFS, DMATRFBASE1 = 0x110, 0x114, 0x118, 0x11C, 0x128
CPUCTL_ALIAS = 0x130
HWCFG2_RISCV, HWCFG2_MEM_SCRUBBING, HWCFG2_RISCV_BR_PRIV_LOCKDOWN = 1 << 10, 1 << 12, 1 << 13
CPUCTL_STARTCPU, CPUCTL_HALTED, CPUCTL_ALIAS_EN = 1 << 1, 1 << 4, 1 << 6
DMATRFCMD_FULL, DMATRFCMD_IDLE = 1 << 0, 1 << 1
DMATRFCMD_SEC, DMATRFCMD_IMEM, DMATRFCMD_SIZE_256B = 1 << 2, 1 << 4, 6 << 8   # SEC 3:2 = 1, IMEM 4:4, SIZE 10:8 = 256 bytes
# falcon2 / RISC-V registers (offsets from the falcon's base + RISCV_OFFSET)
MOD_SEL, BROM_CURR_UCODE_ID, BROM_ENGIDMASK, BROM_PARAADDR0 = 0x180, 0x198, 0x19C, 0x210
MOD_SEL_RSA3K = 1
RISCV_CPUCTL, RISCV_BCR_CTRL = 0x388, 0x668
RISCV_CPUCTL_ACTIVE_STAT = 1 << 7
BCR_CTRL_VALID, BCR_CTRL_CORE_SELECT_RISCV, BCR_CTRL_BRFETCH = 1 << 0, 1 << 4, 1 << 8
# FBIF (offsets from base + FBIF_OFFSET): TRANSCFG(i) target 1:0 (0: local FB), mem_type 2:2 (1: physical); CTL allow_phys_no_ctx 7:7
FBIF_TRANSCFG0, FBIF_CTL = 0x000, 0x024
TRANSCFG_PHYSICAL, FBIF_CTL_ALLOW_PHYS_NO_CTX = 1 << 2, 1 << 7
DMA_CHUNK = 256


class MMIO(Protocol):
  def read32(self, offset: int) -> int: ...
  def write32(self, offset: int, value: int) -> None: ...


def wait_for(regs: MMIO, offset: int, done: Callable[[int], bool], step: str, what: str, timeout: float) -> int:
  """Poll `offset` until done(value); GSPError(timed_out) naming the register and the last value otherwise."""
  deadline = time.monotonic() + timeout
  while True:
    v = regs.read32(offset)
    if done(v): return v
    if time.monotonic() > deadline:
      raise GSPError(f"{step}: {what} did not happen within {timeout:g} s (register {offset:#x} stayed {v:#010x})",
                     "the GPU did not answer as its documentation says; reset it (echo 1 > /sys/bus/pci/devices/<address>/reset) and retry",
                     step=step, timed_out=True, reason=f"{offset:#x} = {v:#010x}")
    time.sleep(0.0002)


class Falcon:
  """One falcon (GSP or SEC2) at `base` in BAR0."""

  def __init__(self, regs: MMIO, base: int, engine: int, name: str, timeout: float = 2.0):
    self.regs, self.base, self.engine, self.name, self.timeout = regs, base, engine, name, timeout

  def r(self, off: int) -> int: return self.regs.read32(self.base + off)
  def w(self, off: int, v: int) -> None: self.regs.write32(self.base + off, v)
  def wait(self, off: int, done: Callable[[int], bool], step: str, what: str) -> int:
    return wait_for(self.regs, self.base + off, done, step, what, self.timeout)

  def reset(self, riscv: bool, step: str) -> None:
    """Reset the engine, wait for its memory scrubbing, and select the core: RISC-V (the GSP running GSP-RM) or the
    falcon (for heavy-secure ucode; on an engine with a RISC-V core the boot ROM then reports the selection valid)."""
    self.regs.write32(self.engine, 1)
    self.regs.write32(self.engine, 0)
    self.wait(HWCFG2, lambda v: not v & HWCFG2_MEM_SCRUBBING, step, f"{self.name}'s memory scrubbing after reset")
    if riscv: self.w(RISCV_OFFSET + RISCV_BCR_CTRL, BCR_CTRL_CORE_SELECT_RISCV | BCR_CTRL_BRFETCH)
    elif self.r(HWCFG2) & HWCFG2_RISCV:
      self.w(RISCV_OFFSET + RISCV_BCR_CTRL, 0)
      self.wait(RISCV_OFFSET + RISCV_BCR_CTRL, lambda v: bool(v & BCR_CTRL_VALID), step, f"{self.name}'s core selection")

  def dma(self, imem: bool, secure: bool, dest: int, fb_offset: int, source: int, size: int, step: str) -> None:
    """Copy `size` bytes from physical VRAM address `source + fb_offset` into IMEM/DMEM at `dest`, 256 bytes a command."""
    self.w(FBIF_OFFSET + FBIF_CTL, self.r(FBIF_OFFSET + FBIF_CTL) | FBIF_CTL_ALLOW_PHYS_NO_CTX)
    self.w(DMACTL, 0)
    self.w(FBIF_OFFSET + FBIF_TRANSCFG0, TRANSCFG_PHYSICAL)  # context 0: local FB, physical addresses
    cmd = DMATRFCMD_SIZE_256B | (DMATRFCMD_IMEM if imem else 0) | (DMATRFCMD_SEC if secure else 0)
    self.w(DMATRFBASE, source >> 8 & 0xFFFFFFFF)
    self.w(DMATRFBASE1, source >> 40 & 0x1FF)
    for done in range(0, size, DMA_CHUNK):
      self.wait(DMATRFCMD, lambda v: not v & DMATRFCMD_FULL, step, f"{self.name}'s DMA queue to have room")
      self.w(DMATRFMOFFS, dest + done)
      self.w(DMATRFFBOFFS, fb_offset + done)
      self.w(DMATRFCMD, cmd)
    self.wait(DMATRFCMD, lambda v: bool(v & DMATRFCMD_IDLE), step, f"{self.name}'s DMA to finish")

  def run_hs(self, image: int, code: tuple[int, int, int], data: tuple[int, int, int], boot_vector: int, pkc_offset: int,
             engine_mask: int, ucode_id: int, mailbox: int | None, step: str) -> tuple[int, int]:
    """Load a heavy-secure image at VRAM address `image` (code and data as (image offset, IMEM/DMEM address, size)),
    give the boot ROM its signature parameters, start it and wait until it halts; returns the mailboxes."""
    off, at, size = code
    self.dma(True, True, at, boot_vector, image + off - boot_vector, size, step)
    off, at, size = data
    self.dma(False, False, at, 0, image + off, size, step)
    self.w(RISCV_OFFSET + BROM_PARAADDR0, pkc_offset)
    self.w(RISCV_OFFSET + BROM_ENGIDMASK, engine_mask)
    self.w(RISCV_OFFSET + BROM_CURR_UCODE_ID, ucode_id)
    self.w(RISCV_OFFSET + MOD_SEL, MOD_SEL_RSA3K)
    self.w(BOOTVEC, boot_vector)
    if mailbox is not None:
      self.w(MAILBOX0, mailbox & 0xFFFFFFFF)
      self.w(MAILBOX1, mailbox >> 32)
    self.start()
    self.wait(CPUCTL, lambda v: bool(v & CPUCTL_HALTED), step, f"{self.name} to halt after running its ucode")
    return self.r(MAILBOX0), self.r(MAILBOX1)

  def start(self) -> None:
    if self.r(CPUCTL) & CPUCTL_ALIAS_EN: self.w(CPUCTL_ALIAS, CPUCTL_STARTCPU)
    else: self.w(CPUCTL, CPUCTL_STARTCPU)
