"""The boot of whichever generation NV_PMC_BOOT_42 names: the chip identified (boot.identify), then its generation's
flow by table (chips.Generation.boot): "booter" (GA10x, AD10x: FWSEC-FRTS and booter_load, plugrt_nv_pci.boot) or
"fsp" (GB20x: the FSP's chain of trust and the GSP FMC, plugrt_nv_pci.boot_fsp)."""
from __future__ import annotations

from collections.abc import Callable

from plugrt_nv_pci import boot, boot_fsp
from plugrt_nv_pci.dma import DMAAllocator
from plugrt_nv_pci.falcon import MMIO

FLOWS = {"booter": boot.bring_up, "fsp": boot_fsp.bring_up}


def bring_up(regs: MMIO, vram_write: Callable[[int, bytes], None], dma: DMAAllocator, firmware_root: str, label: str, timeout: float,
             system_info: bytes, started: Callable[[], None] = lambda: None) -> boot.Booted:
  """GSP-RM up on the GPU behind `regs`: its queues, the VRAM layout, the chip and what the boot did. `started()` is
  called once the GPU's state was changed, after which only a reset of the function returns it to its driver."""
  rec = boot.Record(label)
  chip = boot.identify(regs, rec)
  return FLOWS[chip.generation.boot](regs, vram_write, dma, firmware_root, rec, chip, timeout, system_info, started)
