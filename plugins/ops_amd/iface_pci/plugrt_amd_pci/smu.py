"""The SMU (MP1, the power-management firmware) after the PSP loaded it: its ready flag and its message mailbox.

As the kernel's swsmu does it for SMU 13 and 14 (amdgpu_smu.c smu_start_smc_engine, smu_v13_0.c / smu_v14_0.c,
smu_cmn.c):

1. ready: MP1_FIRMWARE_FLAGS (SMN 0x03b00000 | 0x3010024, read through the NBIO index/data pair) bit 0
   INTERRUPTS_ENABLED set (smu_v13_0_check_fw_status; the kernel reads it once, plugrt polls it, bounded, since the
   SMU may still be starting when its LOAD_IP_FW returns);
2. a message: C2PMSG_90 (response) <- 0, C2PMSG_82 (argument) <- param, C2PMSG_66 <- message index, then poll
   C2PMSG_90 until non-zero: 1 OK, 0xFF failed, 0xFE unknown command, 0xFD bad prerequisites, 0xFC busy; the result is
   C2PMSG_82. Before every message but the first the response register must already be non-zero (the previous one
   done); the first ignores it, as the kernel's SMU_FW_INIT state does. MP1 13.0.x has the mailbox at 0x282/0x292/0x29a
   of segment 0 (smu_v13_0_0_ppt.c), MP1 14.0.2/14.0.3 at 0x82/0x92/0x9a of segment 1 (mp_14_0_2_offset.h);
3. TestMessage (1), GetSmuVersion (2; program, major, minor, debug bytes) and GetDriverIfVersion (3), the last compared
   with the interface version the kernel's driver was built for (the kernel only logs a difference; plugrt records it).

Every wait is bounded and ends in `SMUTimeout`; a response other than OK is an `SMUMessageError` with its name.
Never run on an AMD GPU: tested against the fake MP1 in plugins/ops_amd/tests/fake_amdgpu.py.
"""
from __future__ import annotations

import time
from collections.abc import Callable

from plugrt.errors import PlugrtError
from plugrt_amd_pci.discovery import IPBlock
from plugrt_amd_pci.regs import GPURegisters, poll
from plugrt_amd_pci.regtables.mp import MAILBOX_13, MAILBOX_14

MP1_FIRMWARE_FLAGS = 0x03B00000 | 0x3010024   # MP1_Public | smnMP1_FIRMWARE_FLAGS (smu_v13_0.h, smu_v14_0.h)
INTERRUPTS_ENABLED = 1 << 0                    # MP1_FIRMWARE_FLAGS__INTERRUPTS_ENABLED_MASK (mp_13_0_0_sh_mask.h)
#: MP1 version -> ((offset, segment) of C2PMSG_66 message, C2PMSG_82 argument, C2PMSG_90 response) (regtables.mp)
MAILBOX = {(13, 0, 0): MAILBOX_13, (13, 0, 7): MAILBOX_13, (13, 0, 10): MAILBOX_13, (14, 0, 2): MAILBOX_14, (14, 0, 3): MAILBOX_14}
#: PPSMC_MSG_* (smu_v13_0_0_ppsmc.h, smu_v14_0_2_ppsmc.h: the same three)
MSG_TEST, MSG_GET_SMU_VERSION, MSG_GET_DRIVER_IF_VERSION = 0x1, 0x2, 0x3
MSG_NAMES = {MSG_TEST: "TestMessage", MSG_GET_SMU_VERSION: "GetSmuVersion", MSG_GET_DRIVER_IF_VERSION: "GetDriverIfVersion"}
RESP_OK = 0x1
RESP_NAMES = {0x1: "OK", 0xFF: "Failed", 0xFE: "UnknownCmd", 0xFD: "CmdRejectedPrereq", 0xFC: "CmdRejectedBusy"}
#: the driver interface version the kernel expects per MP1 version (SMU13_0_0_DRIVER_IF_VERSION 0x3D for 13.0.0 and
#: 13.0.10, SMU13_0_7_DRIVER_IF_VERSION 0x35, SMU14_DRIVER_IF_VERSION_SMU_V14_0_2 0x26): these change with kernel releases
DRIVER_IF = {(13, 0, 0): 0x3D, (13, 0, 10): 0x3D, (13, 0, 7): 0x35, (14, 0, 2): 0x26, (14, 0, 3): 0x26}
RESET_HINT = "the SMU firmware did not start or hung: reset the GPU (a cold boot) and check smu_*.bin matches this board"


class SMUError(PlugrtError, RuntimeError):
  """The SMU did not answer as its mailbox protocol says."""


class SMUTimeout(SMUError):
  """A bounded wait on the SMU (ready flag or a response) ran out."""


class SMUMessageError(SMUError):
  """The SMU answered a message with a response other than OK (`msg`, `response`)."""
  def __init__(self, message: str, msg: int, response: int, hint: str = ""):
    self.msg, self.response = msg, response
    super().__init__(message, hint)


class SMUUnsupported(SMUError):
  """An MP1 version whose mailbox plugrt does not know."""


def version_str(v: int) -> str:
  """GetSmuVersion's answer as the kernel prints it: program, then major.minor.debug."""
  return f"0x{v:08x} (program {v >> 24}, {(v >> 16) & 0xFF}.{(v >> 8) & 0xFF}.{v & 0xFF})"


class SMU:
  """One GPU's SMU mailbox: `wait_ready()`, `send(msg, param)`, `start()` (the first messages)."""

  def __init__(self, regs: GPURegisters, mp1: IPBlock, timeout: float = 2.0, sleep: Callable[[float], None] = time.sleep):
    if (box := MAILBOX.get(mp1.version)) is None:
      raise SMUUnsupported(f"the SMU mailbox of MP1 {mp1.version_str} is not known to plugrt",
                           f"plugrt knows MP1 {', '.join('.'.join(map(str, v)) for v in MAILBOX)}")
    if max(seg for _, seg in box) >= len(mp1.bases):
      raise SMUUnsupported(f"MP1 {mp1.version_str} lists {len(mp1.bases)} register bases; its mailbox needs segment {max(s for _, s in box)}")
    self.regs, self.mp1, self.timeout, self.sleep = regs, mp1, timeout, sleep
    self.msg_reg, self.arg_reg, self.resp_reg = (mp1.bases[seg] + off for off, seg in box)
    self.sent = 0

  def _wait(self, what: str, read: Callable[[], int], done: Callable[[int], bool]) -> int:
    ok, v = poll(read, done, self.timeout, self.sleep)
    if not ok: raise SMUTimeout(f"SMU: {what}: still 0x{v:08x} after {self.timeout:g} s", RESET_HINT)
    return v

  def wait_ready(self) -> str:
    v = self._wait(f"not ready (MP1_FIRMWARE_FLAGS at SMN 0x{MP1_FIRMWARE_FLAGS:x}, bit 0 INTERRUPTS_ENABLED)",
                   lambda: self.regs.smn_read(MP1_FIRMWARE_FLAGS), lambda v: bool(v & INTERRUPTS_ENABLED))
    return f"SMU ready (MP1_FIRMWARE_FLAGS = 0x{v:x})"

  def send(self, msg: int, param: int = 0) -> int:
    """Send one message and return the argument register's value after an OK response."""
    name = MSG_NAMES.get(msg, f"message 0x{msg:x}")
    if self.sent:     # the previous message must be answered before the next (the first ignores the register)
      self._wait(f"busy before {name} (C2PMSG_90 stays 0)", lambda: self.regs.rreg(self.resp_reg), bool)
    self.regs.wreg(self.resp_reg, 0)
    self.regs.wreg(self.arg_reg, param)
    self.regs.wreg(self.msg_reg, msg)
    self.sent += 1
    resp = self._wait(f"no response to {name} (C2PMSG_90)", lambda: self.regs.rreg(self.resp_reg), bool)
    if resp != RESP_OK:
      raise SMUMessageError(f"SMU: {name} (param 0x{param:x}) answered {RESP_NAMES.get(resp, f'0x{resp:x}')} (C2PMSG_90 = 0x{resp:x})",
                            msg, resp, RESET_HINT if resp not in RESP_NAMES else "the SMU firmware refused the message: "
                            "check that smu_*.bin and this MP1 version match")
    return self.regs.rreg(self.arg_reg)

  def start(self) -> list[str]:
    """What smu_start_smc_engine does after a PSP load, plus TestMessage: ready flag, versions, interface check."""
    steps = [self.wait_ready()]
    self.send(MSG_TEST, 0)
    steps.append("TestMessage ok")
    fw = self.send(MSG_GET_SMU_VERSION)
    iface = self.send(MSG_GET_DRIVER_IF_VERSION)
    want = DRIVER_IF.get(self.mp1.version)
    if want is None: check = f"no kernel value recorded for MP1 {self.mp1.version_str}"
    elif iface == want: check = "the kernel's value"
    else: check = f"the kernel expects 0x{want:x} (it only logs a difference; so does plugrt)"
    steps.append(f"SMU firmware {version_str(fw)}, driver interface 0x{iface:x} ({check})")
    self.fw_version, self.if_version, self.if_matches = fw, iface, want == iface
    return steps
