"""The GSP boot of a GB20x (Blackwell) GPU from user space, through the FSP's chain of trust (docs/research/nv-pci.md,
"Blackwell GB20x"), following open-gpu-kernel-modules 570.144's kgspPrepareForBootstrap_GH100, kgspBootstrap_GH100,
kgspCalculateFbLayout_GH100, kgspSetupGspFmcArgs_GH100 (kernel_gsp_gh100.c; 570.144's g_kernel_gsp_nvoc.c gives GB20x
these) and kfspPrepareBootCommands_GH100 / kfspSendBootCommands_GH100 (kern_fsp_gh100.c):

1. the FSP's own boot finished (fsp.wait_boot_complete); WPR2 down (the register GA10x uses: unconfirmed on GB20x).
2. firmware: gsp-, bootloader- and fmc-570.144.bin (no VBIOS FWSEC, no booter: the FSP sets up FRTS and WPR2).
3. arguments in host memory as for GA10x (boot.build_args), except the WPR metadata, which asks for sizes only (the
   GSP FMC's ACR lays the WPR region out and writes the offsets back); the FMC image in one contiguous range; the
   FMC's boot parameters (GSP_FMC_BOOT_PARAMS: the WPR metadata's and LibOS arguments' bus addresses).
4. GSP_SET_SYSTEM_INFO and SET_REGISTRY queued for GSP-RM's init, as for GA10x.
5. the COT message (fsp.cot_payload) to the FSP, and its command response (an error code is a GSPError).
6. the GSP's PRIV target mask released by the FSP (its HWCFG2 no longer reads 0xBADF41xx), then the RISC-V boot ROM's
   lockdown released (HWCFG2 bit 13) or the FMC's error code in mailbox 0; NV_PFALCON_FALCON_OS = the bootloader's
   appVersion; the RISC-V core active.
7. GSP-RM's status queue, its CPU-sequencer requests and GSP_INIT_DONE, as for GA10x (boot.await_init); the WPR
   layout read back; BAR1 in physical mode (NV_PBUS_BAR1_BLOCK as GA10x: unconfirmed on GB20x).
"""
from __future__ import annotations

import ctypes
from collections.abc import Callable

from plugrt_nv_pci import boot, fsp
from plugrt_nv_pci.boot import MB, Booted, GspFwWprMeta, Record
from plugrt_nv_pci.chips import Chip
from plugrt_nv_pci.dma import PAGE, DMAAllocator
from plugrt_nv_pci.errors import GSPError
from plugrt_nv_pci.falcon import (
  GSP_BASE,
  GSP_ENGINE,
  HWCFG2,
  HWCFG2_RISCV_BR_PRIV_LOCKDOWN,
  MAILBOX0,
  MAILBOX1,
  MMIO,
  OS,
  RISCV_CPUCTL,
  RISCV_CPUCTL_ACTIVE_STAT,
  RISCV_OFFSET,
  SEC2_BASE,
  SEC2_ENGINE,
  Falcon,
  wait_for,
)

VGA_WORKSPACE = 128 << 10        # kgspCalculateFbLayout_GH100: the VGA workspace the FMC reserves above FRTS
NON_WPR_HEAP = 0x220000          # kgspGetNonWprHeapSize for GB202..GB207 (g_kernel_gsp_nvoc.h)
FRTS_SIZE = MB                   # NV_PGC6_AON_FRTS_INPUT_WPR_SIZE_SECURE_SCRATCH_GROUP_03_0_WPR_SIZE_1MB_IN_4K << 12
# FRTS's offset from the end of VRAM: the driver adds the FB end reserve (0x220000 on GB100+, memmgrGetFBEndReserveSizeEstimate_GB100),
# the PMU's reserve and the WPR end margin, each aligned to 2 MiB, of which plugrt reproduces no chip-specific part: the value is
# the one tinygrad's driver passes (unconfirmed)
FRTS_FROM_END = 0x1C00000
TARGET_LOCKED, TARGET_LOCKED_MASK = 0xBADF4100, 0xFFFFFF00   # a PRIV read of the GSP while the FSP holds its target mask
DMA_COHERENT_SYSTEM = 1          # GSP_DMA_TARGET_COHERENT_SYSTEM (gspifpub.h)
u8, u32, u64 = ctypes.c_uint8, ctypes.c_uint32, ctypes.c_uint64


class AcrBootGspRmParams(ctypes.LittleEndianStructure):
  _fields_ = [("target", u32), ("gspRmDescSize", u32), ("gspRmDescOffset", u64), ("wprCarveoutOffset", u64), ("wprCarveoutSize", u32),
              ("bIsGspRmBoot", u8)]


class GspRmParams(ctypes.LittleEndianStructure):
  _fields_ = [("target", u32), ("bootArgsOffset", u64)]


class GspSpdmParams(ctypes.LittleEndianStructure):
  _fields_ = [("target", u32), ("payloadBufferOffset", u64), ("payloadBufferSize", u32)]


class GspFmcBootParams(ctypes.LittleEndianStructure):
  """GSP_FMC_BOOT_PARAMS (gspifpub.h): the FMC's init regkeys, where GSP-RM's WPR metadata is, where LibOS's arguments are."""
  _fields_ = [("regkeys", u32), ("bootGspRmParams", AcrBootGspRmParams), ("gspRmParams", GspRmParams), ("gspSpdmParams", GspSpdmParams)]


assert ctypes.sizeof(GspFmcBootParams) == 80


def wpr_request(vram: int, bootloader_size: int, image_size: int) -> GspFwWprMeta:
  """The WPR metadata the FMC lays out from: sizes only (kgspCalculateFbLayout_GH100). The heap asked for is GA10x's
  minimum (a minimum request, the driver's comment says; GB20x's own arithmetic is unconfirmed)."""
  return GspFwWprMeta(magic=boot.WPR_META_MAGIC, revision=boot.WPR_META_REVISION, vgaWorkspaceSize=VGA_WORKSPACE, sizeOfBootloader=bootloader_size,
                      sizeOfRadix3Elf=image_size, nonWprHeapSize=NON_WPR_HEAP, gspFwHeapSize=boot.HEAP_MIN, frtsSize=FRTS_SIZE)


def preboot(regs: MMIO, rec: Record, timeout: float) -> None:
  fsp.wait_boot_complete(regs, timeout)
  rec.done("FSP boot complete")
  if (hi := regs.read32(boot.WPR2_ADDR_HI)):
    raise GSPError(f"{rec.label}: a GSP already runs on this GPU (WPR2 is up: {hi:#x}); plugrt boots the GSP only from a reset GPU",
                   "reset the function first (echo 1 | sudo tee /sys/bus/pci/devices/<address>/reset) and retry", step="checking that no GSP runs")
  rec.done("WPR2 down")


def fmc_released(regs: MMIO, params_bus: int) -> Callable[[int], bool]:
  """_kgspLockdownReleasedOrFmcError: lockdown released, or an FMC error in mailbox 0 (not the boot parameters' address,
  which the mailboxes may still hold before the FMC read them)."""
  def done(hwcfg2: int) -> bool:
    mb0 = regs.read32(GSP_BASE + MAILBOX0)
    if mb0 and (mb0, regs.read32(GSP_BASE + MAILBOX1)) != (params_bus & 0xFFFFFFFF, params_bus >> 32): return True
    return not hwcfg2 & HWCFG2_RISCV_BR_PRIV_LOCKDOWN
  return done


def bring_up(regs: MMIO, vram_write: Callable[[int, bytes], None], dma: DMAAllocator, firmware_root: str, rec: Record, chip: Chip,
             timeout: float, system_info: bytes, started: Callable[[], None] = lambda: None) -> Booted:
  """Steps 1-7 on an identified GB20x; `started()` once the FSP was asked to boot (a reset then returns the GPU)."""
  preboot(regs, rec, timeout)
  fw = boot.load_firmware(firmware_root, chip, rec)
  assert fw.fmc is not None
  args = boot.build_args(dma, fw, 0, rec, layout=wpr_request)
  image = dma.alloc(len(fw.fmc.image), contiguous=True)
  image.write(0, fw.fmc.image)
  params = GspFmcBootParams()
  params.bootGspRmParams = AcrBootGspRmParams(target=DMA_COHERENT_SYSTEM, gspRmDescSize=ctypes.sizeof(GspFwWprMeta),
                                              gspRmDescOffset=args.wpr_meta.bus(0), bIsGspRmBoot=1)
  params.gspRmParams = GspRmParams(target=DMA_COHERENT_SYSTEM, bootArgsOffset=args.libos.bus(0))
  params_buf = dma.alloc(PAGE, contiguous=True)
  params_buf.write(0, bytes(params))
  rec.done("GSP FMC and its boot parameters in host memory")
  starting = boot.open_queues(regs, args, rec, timeout, boot.init_messages(system_info))
  f = fw.fmc
  cot = fsp.cot_payload(image.bus(0), params_buf.bus(0), FRTS_FROM_END, FRTS_SIZE, f.hash384, f.public_key, f.signature)
  started()
  fsp.FSP(regs, timeout).command(fsp.NVDM_COT, bytes(cot), "sending the chain-of-trust message to the FSP")
  rec.done("the FSP accepted the chain-of-trust message")
  gsp = Falcon(regs, GSP_BASE, GSP_ENGINE, "GSP", timeout)
  step = "waiting for the FSP to boot the GSP FMC"
  wait_for(regs, GSP_BASE + HWCFG2, lambda v: v != 0 and v & TARGET_LOCKED_MASK != TARGET_LOCKED, step, "the GSP's target mask release", timeout)
  wait_for(regs, GSP_BASE + HWCFG2, fmc_released(regs, params_buf.bus(0)), step, "the GSP's lockdown release", timeout)
  if (mb0 := gsp.r(MAILBOX0)) and (mb0, gsp.r(MAILBOX1)) != (params_buf.bus(0) & 0xFFFFFFFF, params_buf.bus(0) >> 32):
    raise GSPError(f"the GSP FMC failed to boot GSP-RM: mailbox 0 = {mb0:#x}", "the GSP-RM image, bootloader or WPR metadata does not match "
                   "this GPU's FMC; reset the GPU", step=step, reason=f"FMC error {mb0:#x}")
  gsp.w(OS, fw.bootloader_desc.appVersion)
  if not gsp.r(RISCV_OFFSET + RISCV_CPUCTL) & RISCV_CPUCTL_ACTIVE_STAT:
    raise GSPError("the GSP's RISC-V core is not active after the FMC", step="starting GSP-RM")
  rec.done("GSP FMC booted GSP-RM")
  sec2 = Falcon(regs, SEC2_BASE, SEC2_ENGINE, "SEC2", timeout)
  q = boot.await_init(starting, boot.Sequencer(regs, gsp, sec2, args.libos.bus(0), timeout), rec)
  meta = GspFwWprMeta.from_buffer_copy(ctypes.string_at(args.wpr_meta.cpu, ctypes.sizeof(GspFwWprMeta)))
  if not 0 < meta.gspFwRsvdStart < meta.fbSize:
    raise GSPError(f"GSP-RM is up but the WPR metadata holds no layout (reserved region from {meta.gspFwRsvdStart:#x}, VRAM {meta.fbSize:#x})",
                   step="reading the WPR layout")
  rec.done(f"WPR laid out by the FMC ({meta.gspFwRsvdStart >> 20} MiB of VRAM below GSP-RM's region)")
  regs.write32(boot.BAR1_BLOCK, 0)
  rec.done("BAR1 in physical mode")
  return Booted(q, meta, chip, rec)
