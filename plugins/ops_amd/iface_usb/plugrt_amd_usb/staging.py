"""The PSP's buffers over USB: the bridge's SRAM window mapped into the GPU's GART (plugrt_amd_pci.psp.Staging).

Writing a 1 MiB firmware buffer into VRAM through the bridge is 262,144 dword TLPs; the bridge's SRAM takes 512 KiB in
a burst of eight bulk commands (plugrt_amd_usb.sram) and the GPU reads it at bus address 0x200000, as it reads system
memory. So, as the public reference does for its PSP message buffer over USB (tinygrad's AM_PSP: msg1 in the bridge's
SRAM, mapped as uncached system memory at a 1 MiB-aligned GPU address), plugrt maps the SRAM's 128 pages at the start
of the GART (context 0 of the MMHUB, which the PSP's accesses use) and hands every bootloader component, the TOC and
each IP ucode to the PSP there, one at a time: each `put` rewrites the whole window (the rest zero-filled, as the kernel
clears its buffer) and returns the GART address. The KM ring, command buffer, fence and TMR stay in VRAM (a few KiB
written by TLPs; the TMR is the PSP's own). A component over 512 KiB cannot be handed over this way (PSPFirmwareError).

PTE: valid, system, readable, writeable, not snooped (the bridge is no CPU cache), MTYPE UC, as the reference maps it.
Never run on a bridge or a GPU: tested against the fake bridge, MMHUB and MP0 (plugins/ops_amd/tests/fake_amdgpu.py).
"""
from __future__ import annotations

import struct
from collections.abc import Callable

from plugrt_amd_pci import gmc, vm
from plugrt_amd_pci.discovery import IPBlock
from plugrt_amd_pci.regs import GPURegisters
from plugrt_amd_usb.asm24 import ASM24Bridge
from plugrt_amd_usb.sram import SRAM_BUS, SRAM_SIZE, sram_write

PAGE = 0x1000
FLAGS = vm.PTE_SYSTEM | vm.PTE_READABLE | vm.PTE_WRITEABLE


class SRAMStaging:
  """The bridge's SRAM as the PSP's buffer, at `mc` once `attach` mapped it (the GART's first 512 KiB)."""
  limit = SRAM_SIZE

  def __init__(self, bridge: ASM24Bridge):
    self.bridge, self.mc, self.puts = bridge, 0, 0

  @property
  def where(self) -> str:
    at = f" at GART MC 0x{self.mc:x}" if self.mc else ""
    return f"the USB bridge's {SRAM_SIZE >> 10} KiB SRAM (bus 0x{SRAM_BUS:x}){at}"

  def attach(self, regs: GPURegisters, lay: gmc.Layout, mmhub: IPBlock | None, flush: Callable[[], None] | None, timeout: float) -> str:
    """Point the GART's first SRAM_SIZE // PAGE entries at the SRAM's pages, then flush the GART's TLB (VMID 0)."""
    if mmhub is None or (hub := gmc.MMHUBS.get(mmhub.version)) is None:
      raise gmc.GMCUnsupported("the bridge's SRAM needs a GART mapping on an MMHUB plugrt programs")
    ptes = b"".join(struct.pack("<Q", vm.pte(SRAM_BUS + i, FLAGS, mtype=vm.MTYPE_UC)) for i in range(0, SRAM_SIZE, PAGE))
    regs.write_vram(gmc.TABLE_AT, ptes)       # entry 0 of the flat table is the GART's first page
    gmc.flush_tlb(regs, mmhub.bases[0], hub, 0, timeout, flush=flush)
    self.mc = lay.gart_start
    return (f"the USB bridge's SRAM mapped for the PSP: {SRAM_SIZE // PAGE} GART entries (system, uncached) at MC 0x{self.mc:x} -> bus "
            f"0x{SRAM_BUS:x}; GART TLB flushed")

  def put(self, data: bytes) -> int:
    if not self.mc: raise RuntimeError("SRAMStaging.put before attach")
    sram_write(self.bridge, bytes(data) + bytes(SRAM_SIZE - len(data)))
    self.puts += 1
    return self.mc
