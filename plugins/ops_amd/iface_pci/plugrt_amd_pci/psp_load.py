"""Loading the IP firmwares through a booted PSP: `GFX_CMD_ID_LOAD_IP_FW` per ucode, then `GFX_CMD_ID_AUTOLOAD_RLC`.

As the kernel does it under PSP loading (amdgpu_ucode.c, amdgpu_psp.c):

1. every ucode goes into one VRAM firmware buffer, in AMDGPU_UCODE_ID order, each at a page-aligned offset
   (amdgpu_ucode_init_bo); plugrt puts that buffer 1 MiB-aligned above the TMR (`PSP.tmr_end`);
2. the SMU firmware first: on PSPs whose PMFW manages the DF C-states (MP0 13.0.0, 13.0.2, 13.0.7:
   psp_check_pmfw_centralized_cstate_management) between LOAD_TOC and SETUP_TMR (psp_hw_start), elsewhere (autoload
   PSPs: 13.0.10, 14.0.2, 14.0.3) at the start of psp_load_non_psp_fw;
3. then the others by rising AMDGPU_UCODE_ID (SDMA, CP, IMU, RLC lists, RLC_G), each a LOAD_IP_FW {MC address lo/hi,
   size, GFX_FW_TYPE} (psp_prep_load_ip_fw_cmd_buf), and right after RLC_G an AUTOLOAD_RLC with no payload
   (psp_rlc_autoload_start): the RLC then starts the command processors from what the PSP put in the TMR.

A LOAD_IP_FW answered with a non-zero status is an `IPFirmwareRefused` naming the ucode, its file and the status. The
kernel on bare metal only logs such a status (psp_cmd_submit_buf: some PSP firmware leaves it non-zero) and goes on;
plugrt stops instead, because a firmware the PSP did not take makes every later step fail without saying why.
Never run on an AMD GPU: tested against the fake MP0 (plugins/ops_amd/tests/fake_amdgpu.py).
"""
from __future__ import annotations

import struct

from plugrt_amd_pci.psp import GFX_CMD_ID_LOAD_IP_FW, PAGE, PSP, PSP_1_MEG, PSPCommandError, PSPError, status_name
from plugrt_amd_pci.ucode import IPFirmware, Ucode, load_order

GFX_CMD_ID_AUTOLOAD_RLC = 0x21
#: psp_check_pmfw_centralized_cstate_management (amdgpu_psp.c): the SMU is loaded before SETUP_TMR on these PSPs
PMFW_CENTRALIZED = {(13, 0, 0), (13, 0, 2), (13, 0, 7)}


class IPFirmwareRefused(PSPCommandError):
  """The PSP answered LOAD_IP_FW (or AUTOLOAD_RLC) with a non-zero status; `ucode` and `file` say which firmware."""
  def __init__(self, message: str, cmd_id: int, status: int, ucode: str, file: str, hint: str = ""):
    self.ucode, self.file = ucode, file
    super().__init__(message, cmd_id, status, hint)


def _align(n: int, a: int) -> int: return (n + a - 1) & ~(a - 1)


class IPLoader:
  """The IP firmwares of one GPU on its booted PSP: `place()`, `load_smu()`, `load_rest()` (ending in RLC autoload)."""

  def __init__(self, psp: PSP, files: list[IPFirmware]):
    self.psp = psp
    every = [u for f in files for u in f.ucodes]
    self.smu: Ucode | None = next((u for u in every if u.name == "SMC"), None)
    self.order = load_order(files)
    self.at: dict[str, int] = {}
    self.loaded: list[str] = []
    self.end = 0                      # VRAM offset past the firmware buffer, once placed

  @property
  def smu_first_before_tmr(self) -> bool: return self.psp.mp0.version in PMFW_CENTRALIZED

  def place(self) -> str:
    """Write every ucode into the VRAM firmware buffer (AMDGPU_UCODE_ID order, page-aligned), as amdgpu_ucode_init_bo."""
    base = pos = _align(self.psp.tmr_end, PSP_1_MEG)
    ucodes = sorted(self.order + ([self.smu] if self.smu else []), key=lambda u: u.ucode_id)
    for u in ucodes:
      self.at[u.name] = pos
      pos += _align(u.size, PAGE)
    if self.psp.staging is not None:      # no VRAM buffer: each ucode goes through the staging buffer as it is loaded
      self.end = base
      return f"IP firmware: {len(ucodes)} ucodes, each handed to the PSP through {self.psp.where()} when it is loaded"
    if pos > self.psp.limit:
      raise PSPError(f"PSP: the IP firmware buffer ({(pos - base) >> 10} KiB at VRAM 0x{base:x}) does not fit below 0x{self.psp.limit:x}",
                     "a GPU with more VRAM")
    for u in ucodes: self.psp.regs.write_vram(self.at[u.name], u.data)
    self.end = pos
    return (f"IP firmware buffer: {len(ucodes)} ucodes, {(pos - base) >> 10} KiB at VRAM 0x{base:x} "
            f"(MC 0x{self.psp.mc(base):x}), page-aligned in AMDGPU_UCODE_ID order")

  def load(self, u: Ucode) -> None:
    """One GFX_CMD_ID_LOAD_IP_FW for `u`, from where `place()` put it."""
    addr = self.psp.mc(self.at[u.name]) if self.psp.staging is None else self.psp.put(u.name, u.data)
    try:
      self.psp.submit(GFX_CMD_ID_LOAD_IP_FW, struct.pack("<IIII", addr & 0xFFFFFFFF, addr >> 32, u.size, u.fw_type))
    except PSPCommandError as e:
      raise IPFirmwareRefused(f"PSP: GFX_CMD_ID_LOAD_IP_FW of {u.name} (GFX_FW_TYPE {u.fw_type}, {u.size} bytes from {u.file}) "
                              f"failed with status {status_name(e.status)}", e.cmd_id, e.status, u.name, u.file,
                              f"the sOS refused {u.file}: use the linux-firmware release that matches this sOS "
                              "(the same one as the psp_*_sos.bin), and reset the GPU before retrying") from None
    self.loaded.append(u.name)

  def load_smu(self) -> list[str]:
    if self.smu is None: return []
    self.load(self.smu)
    when = "before SETUP_TMR (PMFW-managed DF C-states)" if self.smu_first_before_tmr else "first of the IP firmwares"
    return [f"GFX_CMD_ID_LOAD_IP_FW ok: SMC ({self.smu.size} bytes from {self.smu.file}) {when}"]

  def load_rest(self) -> list[str]:
    """The other ucodes in the kernel's order, with AUTOLOAD_RLC right after RLC_G (psp_load_non_psp_fw)."""
    autoload = "no RLC_G loaded: no RLC autoload"
    for u in self.order:
      self.load(u)
      if u.name == "RLC_G": autoload = self.autoload()
    return [f"GFX_CMD_ID_LOAD_IP_FW ok: {', '.join(u.name for u in self.order)}", autoload]

  def autoload(self) -> str:
    try: self.psp.submit(GFX_CMD_ID_AUTOLOAD_RLC)
    except PSPCommandError as e:
      raise IPFirmwareRefused(f"PSP: GFX_CMD_ID_AUTOLOAD_RLC failed with status {status_name(e.status)}", e.cmd_id, e.status, "RLC_G", "",
                              "the RLC did not start from the loaded firmware: check that every GC firmware file (pfp, me, mec, "
                              "rlc, imu) comes from the same linux-firmware release, and reset the GPU") from None
    return "GFX_CMD_ID_AUTOLOAD_RLC ok: the RLC starts the command processors from the TMR"
