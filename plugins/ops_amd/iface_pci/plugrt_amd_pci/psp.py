"""The PSP (MP0, AMD's security processor) of a SOC15 GPU without a kernel driver: its bootloader, its sOS and its ring.

The PSP is the first block amdgpu brings up: every other firmware (SMU, SDMA, GC's command processors and RLC) is
loaded *through* it. Three stages, each as the kernel's psp_v13_0.c / psp_v14_0.c and amdgpu_psp.c do them:

1. bootloader: when C2PMSG_81 (the sOS "sign of life") reads 0, for each pre-sOS component the firmware file has
   (kdb, spl, sys_drv, soc_drv, intf_drv, dbg_drv, ras_drv, and ipkeymgr_drv on PSP 14, in the kernel's order): wait
   for C2PMSG_35 bit 31 (the bootloader is ready), copy the component into a 1 MiB-aligned private VRAM buffer (or,
   through `Staging`, wherever the interface can put it: the USB bridge's SRAM mapped in the GART), write
   its GPU (MC) address >> 20 to C2PMSG_36 and the load command to C2PMSG_35, wait for ready again (an error code in
   bits 7:0 is a `PSPCommandError`); then the sOS the same way, and wait for C2PMSG_81 to turn non-zero;
2. the KM ring: C2PMSG_64 bit 31 (sOS ready), ring address to C2PMSG_69/70, size to C2PMSG_71, ring type << 16 to
   C2PMSG_64; done when C2PMSG_64 reads bit 31 set with a zero status in bits 0-15;
3. GFX commands: a 1 KiB `psp_gfx_cmd_resp` in VRAM, a 64-byte `psp_gfx_rb_frame` pointing at it and at a fence,
   the write pointer (dwords) to C2PMSG_67; the PSP writes the frame's fence value when done and the status into the
   buffer's response. Implemented here: GFX_CMD_ID_LOAD_TOC (the TOC sizes the TMR) and GFX_CMD_ID_SETUP_TMR
   (`tmr_init`, `tmr_load`); the IP firmwares' LOAD_IP_FW and AUTOLOAD_RLC are in plugrt_amd_pci.psp_load.

Register offsets (dwords inside MP0's segment 0): C2PMSG_n is 0x40 + n in mp_13_0_0_offset.h and (as MPASP_SMN_*)
in mp_14_0_2_offset.h. Addresses the PSP reads are MC addresses: VRAM offset + the FB base the MMHUB reports
(MMMC_VM_FB_LOCATION_BASE << 24). Every wait is bounded (`timeout` seconds) and ends in a typed `PSPTimeout` naming
the register and what it read; a command the PSP refuses is a `PSPCommandError` with its decoded status.
Sources: docs/research/amd-pci.md ("PSP"). Never run on an AMD GPU: tested against the fake MP0 in
plugins/ops_amd/tests/fake_amdgpu.py, which is built from the same sources.
"""
from __future__ import annotations

import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from plugrt.errors import PlugrtError
from plugrt_amd_pci.discovery import DiscoveryTable, IPBlock
from plugrt_amd_pci.psp_firmware import PSPFirmware, PSPFirmwareError
from plugrt_amd_pci.regs import GPURegisters, poll
from plugrt_amd_pci.regtables.gc import FB_OFFSET
from plugrt_amd_pci.regtables.gmc import FB_LOCATION_BASE

C2PMSG_BASE = 0x40                       # C2PMSG_n = 0x40 + n (segment 0 of MP0)
BL_CMD, BL_ADDR = 35, 36                 # bootloader command/status, buffer address >> 20
RING_CTRL, RING_WPTR, RING_LO, RING_HI, RING_SIZE_REG = 64, 67, 69, 70, 71
SOS_ALIVE = 81
READY = 1 << 31
#: enum psp_bootloader_cmd (amdgpu_psp.h)
BL_LOAD_SYSDRV, BL_LOAD_SOSDRV, BL_LOAD_KEY_DATABASE = 0x10000, 0x20000, 0x80000
BL_LOAD_SOCDRV, BL_LOAD_DBGDRV, BL_LOAD_INTFDRV, BL_LOAD_RASDRV = 0xB0000, 0xC0000, 0xD0000, 0xE0000
BL_LOAD_IPKEYMGRDRV, BL_LOAD_TOS_SPL_TABLE = 0xF0000, 0x10000000
#: the pre-sOS components in psp_hw_start's order: (firmware part, bootloader command); ipkeymgr_drv only on PSP 14
#: (psp_v13_0 has no loader for it)
PRE_SOS = (("kdb", BL_LOAD_KEY_DATABASE), ("spl", BL_LOAD_TOS_SPL_TABLE), ("sys_drv", BL_LOAD_SYSDRV), ("soc_drv", BL_LOAD_SOCDRV),
           ("intf_drv", BL_LOAD_INTFDRV), ("dbg_drv", BL_LOAD_DBGDRV), ("ras_drv", BL_LOAD_RASDRV), ("ipkeymgr_drv", BL_LOAD_IPKEYMGRDRV))
BL_ERROR_MASK = 0xFF                     # C2PMSG_35 bits 7:0: the bootloader's error code for the last command
BL_NAMES = {cmd: name for name, cmd in PRE_SOS} | {BL_LOAD_SOSDRV: "sos"}
#: enum psp_ring_type / psp_gfx_crtl_cmd_id (psp_gfx_if.h)
RING_TYPE_KM = 2
CTRL_DESTROY_RINGS = 0x30000
#: enum psp_gfx_cmd_id (psp_gfx_if.h)
GFX_CMD_ID_SETUP_TMR, GFX_CMD_ID_LOAD_IP_FW, GFX_CMD_ID_LOAD_TOC = 0x5, 0x6, 0x20
CMD_NAMES = {0x1: "LOAD_TA", 0x2: "UNLOAD_TA", 0x3: "INVOKE_CMD", 0x4: "LOAD_ASD", 0x5: "SETUP_TMR", 0x6: "LOAD_IP_FW", 0x7: "DESTROY_TMR",
             0x8: "SAVE_RESTORE", 0x9: "SETUP_VMR", 0xA: "DESTROY_VMR", 0xB: "PROG_REG", 0xF: "GET_FW_ATTESTATION", 0x20: "LOAD_TOC",
             0x21: "AUTOLOAD_RLC", 0x22: "BOOT_CFG"}
#: response statuses psp_gfx_if.h names
STATUS_NAMES = {0x0: "TEE_SUCCESS", 0x100: "PSP_ERR_UNKNOWN_COMMAND", 0xFFFF000A: "TEE_ERROR_NOT_SUPPORTED"}
CMD_BUF_VERSION = 1                      # PSP_GFX_CMD_BUF_VERSION
CMD_BUF_SIZE = 1024                      # sizeof(struct psp_gfx_cmd_resp)
CMD_PAYLOAD = 28                         # psp_gfx_cmd_resp.cmd
RESP_STATUS, RESP_TMR_SIZE = 864, 880    # psp_gfx_cmd_resp.resp.status, .resp.tmr_size
FRAME = struct.Struct("<IIIIIIIIBBH7I")  # psp_gfx_rb_frame (64 bytes)
TMR_VIRT_PHY_ADDR = 1 << 1               # psp_gfx_cmd_setup_tmr.bitfield.virt_phy_addr
# sizes and alignments (amdgpu_psp.h / amdgpu_psp.c)
PSP_1_MEG = 1 << 20                      # the private firmware buffer: 1 MiB, 1 MiB aligned
RING_BYTES = 0x1000                      # the KM ring (psp_ring_init)
PAGE = 0x1000                            # PSP_CMD_BUFFER_SIZE, PSP_FENCE_BUFFER_SIZE
TMR_ALIGNMENT = 1 << 20                  # PSP_TMR_ALIGNMENT
TMR_DEFAULT_SIZE = 0x400000              # PSP_TMR_SIZE when there is no TOC
#: where plugrt puts its PSP buffers in VRAM: above the pre-OS (VGA/VBIOS) framebuffer the kernel keeps reserved at
#: the bottom (AMDGPU_VBIOS_VGA_ALLOCATION, 9 MiB); see docs/backends/amd.md
DEFAULT_BASE = 16 << 20
#: MP0 versions whose boot plugrt implements: the discrete RDNA3/RDNA4 PSPs that use C2PMSG_35 for the bootloader
SUPPORTED = {(13, 0, 0), (13, 0, 7), (13, 0, 10), (14, 0, 2), (14, 0, 3)}
#: PSPs that set up their TMR themselves at boot (amdgpu's boot_time_tmr): no SETUP_TMR from the driver
BOOT_TIME_TMR = {(14, 0, 2), (14, 0, 3)}


class PSPError(PlugrtError, RuntimeError):
  """The PSP did not do what its protocol says (timed out, refused a command, or a request plugrt cannot make)."""


class PSPTimeout(PSPError):
  """A bounded wait on a PSP register or fence ran out; the message names the register and its last value."""


class PSPCommandError(PSPError):
  """The PSP answered a GFX command with a non-zero status (`status`, `cmd_id`)."""
  def __init__(self, message: str, cmd_id: int, status: int, hint: str = ""):
    self.cmd_id, self.status = cmd_id, status
    super().__init__(message, hint)


class PSPUnsupported(PSPError):
  """A GPU whose PSP boot plugrt does not implement (another MP0 or MMHUB version)."""


def status_name(status: int) -> str:
  return STATUS_NAMES.get(status, f"0x{status:08x}")


def vram_location(regs: GPURegisters, table: DiscoveryTable) -> tuple[int, int]:
  """(MC address of VRAM offset 0, physical base of VRAM) from the MMHUB's FB location and GC's FB offset registers."""
  mmhub, gc = table.find("MMHUB"), table.find("GC")
  if mmhub is None or (where := FB_LOCATION_BASE.get(mmhub.version)) is None:
    got = mmhub.version_str if mmhub else "none"
    raise PSPUnsupported(f"no MMMC_VM_FB_LOCATION_BASE register is known for MMHUB {got}",
                         f"plugrt knows MMHUB {', '.join('.'.join(map(str, v)) for v in FB_LOCATION_BASE)}")
  mc_base = (regs.rreg(mmhub.bases[where[1]] + where[0]) & 0xFFFFFF) << 24
  phys = 0
  if gc is not None and (off := FB_OFFSET.get(gc.version[:2])) is not None: phys = (regs.rreg(gc.bases[off[1]] + off[0]) & 0xFFFFFF) << 24
  return mc_base, phys


class Staging(Protocol):
  """Where the buffers the PSP is handed (bootloader components, the TOC, IP ucodes) go when not into VRAM: the USB
  interface's bridge SRAM, mapped through the GART (plugrt_amd_usb.staging). One buffer at a time: `put` overwrites
  the previous one and returns the MC address (1 MiB aligned) the PSP reads it at."""
  where: str                  # for the steps' text, e.g. "the USB bridge's 512 KiB SRAM at MC 0x..."
  limit: int                  # the most bytes one buffer may have

  def put(self, data: bytes) -> int: ...


@dataclass(frozen=True)
class Response:
  cmd_id: int
  status: int
  tmr_size: int
  raw: bytes


class PSP:
  """One GPU's PSP: `boot(firmware)`, `ring_create()`, `submit(...)`, `load_toc`, `setup_tmr`, `ring_destroy()`."""

  def __init__(self, regs: GPURegisters, mp0: IPBlock, vram_size: int, mc_base: int, phys_base: int = 0, base: int = DEFAULT_BASE,
               timeout: float = 2.0, sleep: Callable[[float], None] = time.sleep, flush: Callable[[], None] | None = None,
               staging: Staging | None = None):
    if mp0.version not in SUPPORTED:
      raise PSPUnsupported(f"PSP boot for MP0 {mp0.version_str} is not implemented",
                           f"plugrt boots MP0 {', '.join('.'.join(map(str, v)) for v in sorted(SUPPORTED))}; use AMD_IFACE=KFD")
    self.regs, self.mp0, self.mc_base, self.phys_base = regs, mp0, mc_base, phys_base
    self.timeout, self.sleep = timeout, sleep
    self.flush = flush or (lambda: None)  # the HDP flush (plugrt_amd_pci.hdp), before the PSP reads what the CPU wrote
    self.fw_pri = (base + PSP_1_MEG - 1) & ~(PSP_1_MEG - 1)
    self.ring = self.fw_pri + PSP_1_MEG
    self.cmd, self.fence = self.ring + RING_BYTES, self.ring + RING_BYTES + PAGE
    self.tmr = (self.fence + PAGE + TMR_ALIGNMENT - 1) & ~(TMR_ALIGNMENT - 1)
    # the discovery table (and firmware-reserved memory) sit at the top of VRAM: keep plugrt's buffers below 1 MiB from it
    self.limit = vram_size - PSP_1_MEG
    if self.tmr > self.limit: raise PSPError(f"VRAM of {vram_size >> 20} MiB has no room for the PSP buffers at 0x{base:x}")
    self.fence_value = 0
    self.ring_up = False
    self.staging = staging
    self.tmr_end = self.tmr              # end of the TMR plugrt set up (the IP firmware buffer goes above it)

  def reg(self, n: int) -> int: return self.mp0.bases[0] + C2PMSG_BASE + n
  def rmsg(self, n: int) -> int: return self.regs.rreg(self.reg(n))
  def wmsg(self, n: int, value: int) -> None: self.regs.wreg(self.reg(n), value)
  def mc(self, offset: int) -> int: return self.mc_base + offset

  def _wait(self, what: str, read: Callable[[], int], done: Callable[[int], bool], hint: str) -> int:
    ok, v = poll(read, done, self.timeout, self.sleep)
    if not ok: raise PSPTimeout(f"PSP: {what}: still 0x{v:08x} after {self.timeout:g} s", hint)
    return v

  def wait_msg(self, n: int, mask: int, value: int, what: str, hint: str = "the PSP is hung or was left mid-boot: reset the GPU") -> int:
    return self._wait(f"{what} (C2PMSG_{n} & 0x{mask:08x} == 0x{value:08x})", lambda: self.rmsg(n), lambda v: v & mask == value, hint)

  def sos_alive(self) -> bool: return self.rmsg(SOS_ALIVE) != 0

  def put(self, name: str, data: bytes) -> int:
    """Hand the PSP a buffer: into the 1 MiB VRAM buffer (cleared first, as the kernel does), or through `staging`;
    returns its MC address."""
    if self.staging is None:
      self.regs.write_vram(self.fw_pri, bytes(data) + bytes(PSP_1_MEG - len(data)))
      return self.mc(self.fw_pri)
    if len(data) > self.staging.limit:
      raise PSPFirmwareError(f"PSP firmware: {name} is {len(data)} bytes, more than {self.staging.where} holds ({self.staging.limit} bytes)",
                             "load it through the PCI interface")
    return self.staging.put(bytes(data))

  def where(self) -> str:
    return self.staging.where if self.staging is not None else f"a 1 MiB VRAM buffer at MC 0x{self.mc(self.fw_pri):x}"

  # ---- 1. the bootloader ----------------------------------------------------------------------------------------------
  def load_component(self, name: str, data: bytes, command: int) -> None:
    if len(data) > PSP_1_MEG: raise PSPFirmwareError(f"PSP firmware: {name} is {len(data)} bytes, more than the 1 MiB buffer the bootloader reads")
    self.wait_msg(BL_CMD, READY, READY, f"bootloader not ready before loading {name}")
    if (addr := self.put(name, data)) % PSP_1_MEG:        # C2PMSG_36 carries address >> 20
      raise PSPError(f"PSP: {name}'s buffer at MC 0x{addr:x} is not 1 MiB aligned, as the bootloader needs", "a staging buffer bug")
    self.wmsg(BL_ADDR, addr >> 20)
    self.wmsg(BL_CMD, command)
    if command == BL_LOAD_SOSDRV: return
    done = self.wait_msg(BL_CMD, READY, READY, f"bootloader did not finish loading {name}")
    if done & BL_ERROR_MASK:
      raise PSPCommandError(f"PSP: the bootloader reported error 0x{done & BL_ERROR_MASK:02x} loading {name} (C2PMSG_35 = 0x{done:08x})",
                            command, done & BL_ERROR_MASK, "the component does not match this GPU (wrong linux-firmware) or the PSP "
                            "is in a state that refuses it: reset the GPU")

  def boot(self, fw: PSPFirmware) -> list[str]:
    """Load the pre-sOS components and the sOS unless an sOS is already running; the steps taken, as text."""
    if (alive := self.rmsg(SOS_ALIVE)) != 0:
      return [f"PSP sOS already running (C2PMSG_81 = 0x{alive:x}): bootloader loads skipped, as the kernel skips them"]
    if (sos := fw.get("sos")) is None: raise PSPFirmwareError("PSP firmware: the file has no sOS binary", "reinstall linux-firmware")
    loaded = []
    for name, command in PRE_SOS:
      if (part := fw.get(name)) is None or (name == "ipkeymgr_drv" and self.mp0.major < 14): continue
      # psp_v13_0's and psp_v14_0's SPL loaders send the KDB image (psp->kdb) with the SPL command; the SPL descriptor
      # only decides whether that load happens (psp_hw_start checks psp->spl)
      kdb = fw.get("kdb")
      data = kdb.data if name == "spl" and kdb is not None else part.data
      self.load_component(name, data, command)
      loaded.append(name)
    self.load_component("sos", sos.data, BL_LOAD_SOSDRV)
    self.sleep(0.02)      # the kernel's mdelay(20) after the sOS command
    alive = self._wait("sOS did not start (C2PMSG_81 stays 0)", lambda: self.rmsg(SOS_ALIVE), lambda v: v != 0,
                       "the bootloader refused the sOS (a firmware file for another board, or a failed signature check): "
                       "use the linux-firmware files for this GPU and reset it before retrying")
    return [f"PSP bootloader loaded {', '.join(loaded + ['sos'])} through {self.where()}; "
            f"sOS alive (C2PMSG_81 = 0x{alive:x})"]

  # ---- 2. the KM ring -------------------------------------------------------------------------------------------------
  def ring_create(self) -> str:
    destroyed = ""
    if self.rmsg(RING_SIZE_REG) != 0:     # a ring left by the previous owner: destroy it as psp_ring_stop does
      self.ring_destroy()
      destroyed = "previous ring destroyed, "
    self.wait_msg(RING_CTRL, READY, READY, "sOS not ready for ring creation")
    self.regs.write_vram(self.ring, bytes(RING_BYTES))
    self.regs.write_vram(self.fence, bytes(PAGE))
    addr = self.mc(self.ring)
    self.wmsg(RING_LO, addr & 0xFFFFFFFF)
    self.wmsg(RING_HI, addr >> 32)
    self.wmsg(RING_SIZE_REG, RING_BYTES)
    self.wmsg(RING_CTRL, RING_TYPE_KM << 16)
    self.sleep(0.02)      # the kernel's mdelay(20)
    v = self._wait("KM ring creation not acknowledged (C2PMSG_64 bit 31)", lambda: self.rmsg(RING_CTRL), lambda v: bool(v & READY),
                   "the sOS is not serving its ring: reset the GPU")
    if v & 0xFFFF: raise PSPCommandError(f"PSP: KM ring creation failed with status 0x{v & 0xFFFF:04x}", 0, v & 0xFFFF, "reset the GPU")
    self.ring_up, self.fence_value = True, 0
    return f"PSP KM ring created ({destroyed}{RING_BYTES} bytes at MC 0x{addr:x})"

  def ring_destroy(self) -> None:
    self.wmsg(RING_CTRL, CTRL_DESTROY_RINGS)
    self.sleep(0.02)
    self.wait_msg(RING_CTRL, READY, READY, "ring destruction not acknowledged")
    self.ring_up = False

  # ---- 3. GFX commands ------------------------------------------------------------------------------------------------
  def submit(self, cmd_id: int, payload: bytes = b"") -> Response:
    if not self.ring_up: raise PSPError(f"PSP: GFX_CMD_ID_{CMD_NAMES.get(cmd_id, hex(cmd_id))} submitted before the KM ring exists")
    buf = bytearray(CMD_BUF_SIZE)
    struct.pack_into("<III", buf, 0, CMD_BUF_SIZE, CMD_BUF_VERSION, cmd_id)
    buf[CMD_PAYLOAD:CMD_PAYLOAD + len(payload)] = payload
    self.regs.write_vram(self.cmd, bytes(buf))
    self.fence_value += 1
    ring_dw, frame_dw = RING_BYTES // 4, FRAME.size // 4
    wptr = self.rmsg(RING_WPTR)
    slot = (wptr % ring_dw) // frame_dw
    cmd_mc, fence_mc = self.mc(self.cmd), self.mc(self.fence)
    frame = FRAME.pack(cmd_mc & 0xFFFFFFFF, cmd_mc >> 32, 0, fence_mc & 0xFFFFFFFF, fence_mc >> 32, self.fence_value, 0, 0, 0, 0, 0, *[0] * 7)
    self.regs.write_vram(self.ring + slot * FRAME.size, frame)
    self.flush()          # psp_ring_cmd_submit flushes the HDP before moving the write pointer
    self.wmsg(RING_WPTR, (wptr + frame_dw) % ring_dw)
    name = f"GFX_CMD_ID_{CMD_NAMES.get(cmd_id, hex(cmd_id))}"
    self._wait(f"{name}: fence not written (want {self.fence_value})", lambda: int.from_bytes(self.regs.read_vram(self.fence, 4), "little"),
               lambda v: v == self.fence_value, "the sOS stopped serving its ring: reset the GPU")
    raw = self.regs.read_vram(self.cmd, CMD_BUF_SIZE)
    status, tmr_size = struct.unpack_from("<I", raw, RESP_STATUS)[0], struct.unpack_from("<I", raw, RESP_TMR_SIZE)[0]
    if status:
      raise PSPCommandError(f"PSP: {name} failed with status {status_name(status)}", cmd_id, status,
                            "the sOS refused the command: a firmware file that does not match this sOS, or a GPU left mid-boot (reset it)")
    return Response(cmd_id, status, tmr_size, raw)

  def load_toc(self, toc: bytes) -> int:
    """GFX_CMD_ID_LOAD_TOC: the TOC through the private buffer; returns the TMR size the PSP asks for."""
    if len(toc) > PSP_1_MEG: raise PSPFirmwareError(f"PSP firmware: TOC of {len(toc)} bytes does not fit the 1 MiB buffer")
    addr = self.put("the TOC", toc)
    return self.submit(GFX_CMD_ID_LOAD_TOC, struct.pack("<III", addr & 0xFFFFFFFF, addr >> 32, len(toc))).tmr_size

  def setup_tmr(self, size: int) -> int:
    """GFX_CMD_ID_SETUP_TMR for a `size`-byte TMR (rounded up to 1 MiB) in VRAM; returns its VRAM offset."""
    size = (size + TMR_ALIGNMENT - 1) & ~(TMR_ALIGNMENT - 1)
    if self.tmr + size > self.limit:
      raise PSPError(f"PSP: a TMR of {size >> 20} MiB at VRAM 0x{self.tmr:x} does not fit below 0x{self.limit:x}", "a GPU with more VRAM")
    addr, phys = self.mc(self.tmr), self.phys_base + self.tmr
    self.submit(GFX_CMD_ID_SETUP_TMR, struct.pack("<IIIIII", addr & 0xFFFFFFFF, addr >> 32, size, TMR_VIRT_PHY_ADDR, phys & 0xFFFFFFFF, phys >> 32))
    return self.tmr

  def tmr_init(self, fw: PSPFirmware) -> tuple[int, list[str]]:
    """psp_tmr_init: LOAD_TOC when the sOS file has a TOC (its answer sizes the TMR), else the default size; the TMR's
    VRAM is reserved from here on (`tmr_end`), unless the PSP set its own up at boot."""
    size, steps = TMR_DEFAULT_SIZE, []
    if (toc := fw.get("toc")) is not None:
      size = self.load_toc(toc.data)
      steps.append(f"GFX_CMD_ID_LOAD_TOC ok: the PSP asks for a {size:#x}-byte TMR")
    if self.mp0.version not in BOOT_TIME_TMR: self.tmr_end = self.tmr + ((size + TMR_ALIGNMENT - 1) & ~(TMR_ALIGNMENT - 1))
    return size, steps

  def tmr_load(self, size: int) -> list[str]:
    """psp_tmr_load: SETUP_TMR, except on PSPs that set their TMR up at boot (boot_time_tmr with autoload)."""
    if self.mp0.version in BOOT_TIME_TMR: return [f"TMR set up by the PSP at boot (MP0 {self.mp0.version_str}): no SETUP_TMR"]
    at = self.setup_tmr(size)
    return [f"GFX_CMD_ID_SETUP_TMR ok: TMR at VRAM 0x{at:x} (MC 0x{self.mc(at):x})"]
