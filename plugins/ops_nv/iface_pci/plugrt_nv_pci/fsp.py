"""The FSP (Blackwell's and Hopper's boot security processor) as the CPU talks to it: NVDM messages carried in MCTP
packets through the RM channel of the FSP's EMEM, and the chain-of-trust (COT) message that makes it boot the GSP FMC.

Sources (docs/research/nv-pci.md, "Blackwell GB20x"; open-gpu-kernel-modules 570.144): the EMEM and queue registers
from published/hopper/gh100/dev_fsp_pri.h (GB20x's published dev_fsp_pri.h lists only the scratch groups; 570.144's
g_kern_fsp_nvoc.c gives GB202 the GH100 packet functions, so the GH100 offsets are the ones the driver uses on it);
the transport from kern_fsp_gh100.c (kfspSendPacket/kfspReadPacket: EMEMC at offset 0 with auto-increment, the data
through EMEMD, then QUEUE_TAIL = size - 4 and QUEUE_HEAD = 0; a reply is ready when MSGQ_HEAD != MSGQ_TAIL, its size
MSGQ_TAIL - MSGQ_HEAD + 4, consumed by MSGQ_TAIL = MSGQ_HEAD) and kern_fsp.c (kfspSendMessage: the first packet carries
the MCTP transport header and the NVDM header, one packet of at most 1 KiB here); the headers from fsp_mctp_format.h
and fsp_nvdm_format.h; the reply from nvdm_payload_cmd_response.h; the error codes from kern_fsp_retval.h; the
COT payload from kern_fsp_cot_payload.h with GB20x's version 2, 96-byte signature and 97-byte public key
(g_kern_fsp_nvoc.c); the boot-complete mark from published/blackwell/gb202/dev_therm.h and dev_therm_addendum.h
(kfspWaitForSecureBoot_GB202). Every wait is bounded and ends in a GSPError naming the step.
"""
from __future__ import annotations

import ctypes
import struct
import time
from collections.abc import Callable

from plugrt_nv_pci.errors import GSPError
from plugrt_nv_pci.falcon import MMIO, wait_for

CHANNEL = 0                                     # FSP_EMEM_CHANNEL_RM
EMEMC, EMEMD = 0x8F2AC0 + 8 * CHANNEL, 0x8F2AC4 + 8 * CHANNEL
QUEUE_HEAD, QUEUE_TAIL = 0x8F2C00 + 8 * CHANNEL, 0x8F2C04 + 8 * CHANNEL
MSGQ_HEAD, MSGQ_TAIL = 0x8F2C80 + 8 * CHANNEL, 0x8F2C84 + 8 * CHANNEL
EMEMC_AINCW, EMEMC_AINCR = 1 << 24, 1 << 25
EMEM_SIZE = 1024                                # FSP_EMEM_CHANNEL_RM_SIZE: the largest packet either way
SCRATCH_GROUP_2 = 0x8F0320                      # NV_PFSP_FALCON_COMMON_SCRATCH_GROUP_2(0..3): the FSP's boot diagnostics
I2CS_SCRATCH, BOOT_COMPLETE = 0xAD00BC, 0xFF    # NV_THERM_I2CS_SCRATCH_FSP_BOOT_COMPLETE, _STATUS_SUCCESS
# MCTP transport header: SEID 23:16, SEQ 29:28, EOM 30, SOM 31; message header: type 6:0 (0x7e vendor PCI), vendor 23:8, NVDM type 31:24
SOM, EOM = 1 << 31, 1 << 30
MSG_TYPE_VENDOR_PCI, VENDOR_NV = 0x7E, 0x10DE
NVDM_COT, NVDM_RESPONSE = 0x14, 0x15
FSP_ERRORS = {0x9E: "FSP_ERR_IFS_ERR_INVALID_STATE", 0x9F: "FSP_ERR_IFR_FILE_NOT_FOUND", 0xA0: "FSP_ERR_IFS_ERR_NOT_SUPPORTED",
              0xA1: "FSP_ERR_IFS_ERR_INVALID_DATA"}
COT_VERSION, COT_SIGNATURE, COT_PUBLIC_KEY, COT_HASH = 2, 96, 97, 48
u16, u32, u64 = ctypes.c_uint16, ctypes.c_uint32, ctypes.c_uint64


class CotPayload(ctypes.LittleEndianStructure):
  """NVDM_PAYLOAD_COT (packed). frtsVidmemOffset counts from the end of VRAM."""
  _pack_ = 1
  _fields_ = [("version", u16), ("size", u16), ("gspFmcSysmemOffset", u64), ("frtsSysmemOffset", u64), ("frtsSysmemSize", u32),
              ("frtsVidmemOffset", u64), ("frtsVidmemSize", u32), ("hash384", u32 * 12), ("publicKey", u32 * 96), ("signature", u32 * 96),
              ("gspBootArgsSysmemOffset", u64)]


assert ctypes.sizeof(CotPayload) == 860


def mctp_header(som: bool, eom: bool, seid: int = 0, seq: int = 0) -> int:
  return (SOM if som else 0) | (EOM if eom else 0) | (seid & 0xFF) << 16 | (seq & 3) << 28


def nvdm_header(nvdm_type: int) -> int: return MSG_TYPE_VENDOR_PCI | VENDOR_NV << 8 | nvdm_type << 24


def packet(nvdm_type: int, payload: bytes) -> bytes:
  """One MCTP packet carrying a whole NVDM message (start and end of message); ValueError when it exceeds the channel."""
  data = struct.pack("<II", mctp_header(True, True), nvdm_header(nvdm_type)) + payload
  if len(data) > EMEM_SIZE: raise ValueError(f"an NVDM message of {len(payload)} bytes does not fit one {EMEM_SIZE}-byte EMEM packet")
  return data + bytes(-len(data) % 4)


def cot_payload(fmc_bus: int, boot_params_bus: int, frts_from_end: int, frts_size: int, hash384: bytes, public_key: bytes,
                signature: bytes) -> CotPayload:
  """The COT message for a GSP-RM boot: the FMC image and its boot parameters in host memory, FRTS in VRAM (no sysmem
  FRTS: the driver leaves it off on a PF running GSP-RM), and the FMC's hash, public key and signature."""
  for name, b, n in (("hash", hash384, COT_HASH), ("public key", public_key, COT_PUBLIC_KEY), ("signature", signature, COT_SIGNATURE)):
    if len(b) != n: raise ValueError(f"the GSP FMC's {name} is {len(b)} bytes; the FSP of GB20x takes {n}")
  p = CotPayload(version=COT_VERSION, size=ctypes.sizeof(CotPayload), gspFmcSysmemOffset=fmc_bus, frtsVidmemOffset=frts_from_end,
                 frtsVidmemSize=frts_size, gspBootArgsSysmemOffset=boot_params_bus)
  for field, b in (("hash384", hash384), ("publicKey", public_key), ("signature", signature)):
    ctypes.memmove(ctypes.addressof(p) + getattr(CotPayload, field).offset, b, len(b))
  return p


def wait_boot_complete(regs: MMIO, timeout: float) -> None:
  """The FSP finished its own boot (devinit included) out of reset."""
  try: wait_for(regs, I2CS_SCRATCH, lambda v: v == BOOT_COMPLETE, "waiting for the FSP's boot", "the FSP boot-complete mark", timeout)
  except GSPError as e:
    diag = ", ".join(f"{regs.read32(SCRATCH_GROUP_2 + 4 * i):#x}" for i in range(4))
    e.reason += f"; FSP scratch group 2: {diag}"
    raise


class FSP:
  """The RM channel of the FSP's EMEM through BAR0 `regs`; `timeout` bounds each wait (seconds)."""

  def __init__(self, regs: MMIO, timeout: float):
    self.regs, self.timeout = regs, timeout

  def _wait(self, ready: Callable[[], bool], step: str, what: str) -> None:
    deadline = time.monotonic() + self.timeout
    while not ready():
      if time.monotonic() > deadline:
        r = self.regs.read32
        raise GSPError(f"{step}: {what} did not happen within {self.timeout:g} s", "the FSP did not answer; reset the GPU and retry",
                       step=step, timed_out=True, reason=f"queue head/tail {r(QUEUE_HEAD):#x}/{r(QUEUE_TAIL):#x}, message queue "
                       f"head/tail {r(MSGQ_HEAD):#x}/{r(MSGQ_TAIL):#x}")
      time.sleep(0.0002)

  def send(self, data: bytes, step: str) -> None:
    """Write one packet into EMEM and hand it to the FSP (once its command queue is empty)."""
    r = self.regs
    self._wait(lambda: r.read32(QUEUE_HEAD) == r.read32(QUEUE_TAIL), step, "the FSP's command queue to be empty")
    if r.read32(MSGQ_HEAD) != r.read32(MSGQ_TAIL):
      raise GSPError(f"{step}: the FSP has an unread message before plugrt sent anything", "reset the GPU and retry", step=step)
    r.write32(EMEMC, EMEMC_AINCW)
    for (w,) in struct.iter_unpack("<I", data): r.write32(EMEMD, w)
    end = r.read32(EMEMC)
    if (end & 0xFC) >> 2 | (end >> 8 & 0xFF) * 64 != len(data) // 4:
      raise GSPError(f"{step}: the FSP's EMEM took {(end & 0xFC) >> 2 | (end >> 8 & 0xFF) * 64} of {len(data) // 4} words", step=step)
    r.write32(QUEUE_TAIL, len(data) - 4)
    r.write32(QUEUE_HEAD, 0)

  def receive(self, step: str) -> bytes:
    """Wait for the FSP's reply and read it out of EMEM (the message queue is then empty again)."""
    r = self.regs
    self._wait(lambda: r.read32(MSGQ_HEAD) != r.read32(MSGQ_TAIL), step, "the FSP's reply")
    head, tail = r.read32(MSGQ_HEAD), r.read32(MSGQ_TAIL)
    size = tail - head + 4
    if not 8 <= size <= EMEM_SIZE or size % 4:
      raise GSPError(f"{step}: the FSP's reply is {size} bytes (message queue head {head:#x}, tail {tail:#x})", step=step, reason="malformed reply")
    r.write32(EMEMC, EMEMC_AINCR)
    data = b"".join(struct.pack("<I", r.read32(EMEMD)) for _ in range(size // 4))
    r.write32(MSGQ_TAIL, head)
    return data

  def command(self, nvdm_type: int, payload: bytes, step: str) -> None:
    """Send an NVDM message and check the FSP's command response: GSPError with its error code otherwise."""
    self.send(packet(nvdm_type, payload), step)
    reply = self.receive(step)
    mctp, msg = struct.unpack_from("<II", reply)
    if not mctp & SOM or not mctp & EOM or msg & 0x7F != MSG_TYPE_VENDOR_PCI or msg >> 8 & 0xFFFF != VENDOR_NV:
      raise GSPError(f"{step}: the FSP's reply has MCTP header {mctp:#010x} and message header {msg:#010x}, not one vendor-PCI NVIDIA "
                     "packet", step=step, reason="malformed reply")
    if msg >> 24 != NVDM_RESPONSE or len(reply) < 8 + 12:
      raise GSPError(f"{step}: the FSP answered with NVDM type {msg >> 24:#x} ({len(reply)} bytes), not a command response", step=step,
                     reason="unexpected reply")
    _task, cmd_type, code = struct.unpack_from("<III", reply, 8)
    if cmd_type != nvdm_type:
      raise GSPError(f"{step}: the FSP's response is for NVDM type {cmd_type:#x}, not {nvdm_type:#x}", step=step, reason="unexpected reply")
    if code:
      name = FSP_ERRORS.get(code, "an FSP error code plugrt does not know")
      raise GSPError(f"{step}: the FSP refused it with error {code:#x} ({name})", "the firmware files do not match this GPU's FSP, or the "
                     "GPU needs a reset", step=step, reason=f"FSP error {code:#x}")
