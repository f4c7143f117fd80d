"""The graphics core after the PSP's RLC autoload: waiting until the RLC has booted the command processors, then the
RS64 CP set-up (`config_rs64`).

gfx_v11_0_hw_init / gfx_v12_0_hw_init, under PSP loading, first wait for the autoload the PSP started
(`gfx_v1x_0_wait_for_rlc_autoload_complete`): CP_STAT reads 0 (no CP block busy) and RLC_RLCS_BOOTLOAD_STATUS has
BOOTLOAD_COMPLETE (bit 31) set. CP_STAT is dword 0xf40 of GC segment 0 on GC 11 and 12; RLC_RLCS_BOOTLOAD_STATUS is
0x4e82 of segment 1 on GC 11.0.0/11.0.2/11.0.3 (gc_11_0_0_offset.h; the APUs 11.0.1, 11.0.4 and 11.5.x read another
register) and 0x4e7c of segment 1 on GC 12 (gc_12_0_0_offset.h). The kernel's bound is adev->usec_timeout polls of
1 us; plugrt's is the bring-up timeout, ending in `GFXTimeout`. Never run on an AMD GPU: tested against the fake.
"""
from __future__ import annotations

import time
from collections.abc import Callable

from plugrt.errors import PlugrtError
from plugrt_amd_pci.discovery import IPBlock
from plugrt_amd_pci.regs import GPURegisters, poll
from plugrt_amd_pci.regtables.gc import BOOTLOAD_STATUS, CP_STAT, RS64_11

BOOTLOAD_COMPLETE = 1 << 31         # RLC_RLCS_BOOTLOAD_STATUS.BOOTLOAD_COMPLETE (gc_11_0_0/gc_12_0_0 sh_mask)


class GFXError(PlugrtError, RuntimeError):
  """The graphics core did not come up as the kernel expects."""


class GFXTimeout(GFXError):
  """The RLC autoload did not complete within the bound."""


def wait_autoload(regs: GPURegisters, gc: IPBlock, timeout: float = 2.0, sleep: Callable[[float], None] = time.sleep) -> str | None:
  """Wait for the RLC autoload to complete; None when plugrt does not know this GC's registers (the caller records it)."""
  if (where := BOOTLOAD_STATUS.get(gc.version)) is None or len(gc.bases) <= max(where[1], CP_STAT[1]): return None
  cp, status = gc.bases[CP_STAT[1]] + CP_STAT[0], gc.bases[where[1]] + where[0]
  ok, (busy, boot) = poll(lambda: (regs.rreg(cp), regs.rreg(status)), lambda v: v[0] == 0 and v[1] & BOOTLOAD_COMPLETE, timeout, sleep)
  if ok: return f"RLC autoload complete (CP_STAT 0, RLC_RLCS_BOOTLOAD_STATUS 0x{boot:08x})"
  raise GFXTimeout(f"GFX: the RLC autoload did not complete: CP_STAT 0x{busy:08x}, RLC_RLCS_BOOTLOAD_STATUS 0x{boot:08x} "
                   f"(want 0 and bit 31) after {timeout:g} s",
                   "the RLC did not boot the command processors from the loaded firmware: check that the GC firmware "
                   "files match this GPU and the sOS, and reset the GPU")


#: (engine, GRBM ME id, pipes, pipe-reset register, reset bits): CP_ME_CNTL PFP_PIPE0/1_RESET bits 18/19, ME_PIPE0/1_RESET
#: 20/21; CP_MEC_RS64_CNTL MEC_PIPE0-3_RESET 16-19 (gc_11_0_0 sh_mask, as tinygrad's autogen lists them)
#: GC 12 (gc_12_0_0_offset.h): the same offsets; gfx_v12_0_config_gfx_rs64 programs the same pipes (PFP 0-1, ME 0-1,
#: MEC 0-3) and pulses the same reset fields (their bits taken as GC 11's: gc_12_0_0_sh_mask.h's CP_ME_CNTL and
#: CP_MEC_RS64_CNTL were not read)
RS64_12 = dict(RS64_11)
RS64 = {11: RS64_11, 12: RS64_12}
RS64_ENGINES = (("PFP", 0, 2, "CP_ME_CNTL", 0x3 << 18), ("ME", 0, 2, "CP_ME_CNTL", 0x3 << 20), ("MEC", 1, 4, "CP_MEC_RS64_CNTL", 0xF << 16))


def grbm_select(me: int, pipe: int, queue: int = 0, vmid: int = 0) -> int:
  """GRBM_GFX_CNTL's value for soc21_grbm_select and soc24_grbm_select: PIPEID bits 0-1, MEID 2-3, VMID 4-7, QUEUEID 8-10."""
  return pipe | me << 2 | vmid << 4 | queue << 8


def config_rs64(regs: GPURegisters, gc: IPBlock, starts: dict[str, int]) -> str | None:
  """gfx_v11_0_config_gfx_rs64 / gfx_v12_0_config_gfx_rs64: every PFP/ME/MEC pipe's program counter start (from the RS64 headers' ucode start
  address: (hi << 30 | lo >> 2) and hi >> 2), each engine's pipes reset and released. `starts` maps "PFP", "ME", "MEC"
  to the 64-bit start address. None for a GC other than 11 or 12 (recorded by the caller)."""
  if (table := RS64.get(gc.version[0])) is None or len(gc.bases) < 2: return None
  reg = {name: gc.bases[seg] + off for name, (off, seg) in table.items()}
  for engine, me, pipes, cntl, reset in RS64_ENGINES:
    lo, hi = starts[engine] & 0xFFFFFFFF, starts[engine] >> 32
    for pipe in range(pipes):
      regs.wreg(reg["GRBM_GFX_CNTL"], grbm_select(me, pipe))
      regs.wreg(reg[f"{engine}_START"], (hi << 30 | lo >> 2) & 0xFFFFFFFF)
      regs.wreg(reg[f"{engine}_START_HI"], hi >> 2)
    regs.wreg(reg["GRBM_GFX_CNTL"], grbm_select(0, 0))
    v = regs.rreg(reg[cntl]) | reset
    regs.wreg(reg[cntl], v)
    regs.wreg(reg[cntl], v & ~reset)
  return "RS64 CP set up: " + ", ".join(f"{e} start 0x{starts[e]:x} on {p} pipes" for e, _, p, _, _ in RS64_ENGINES) + ", each engine's pipes reset"
