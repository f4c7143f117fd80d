"""Fakes for the IP-firmware stage of the driverless AMD bring-up: synthetic IP firmware files, the PSP's LOAD_IP_FW and
AUTOLOAD_RLC (on a fake_amdgpu.FakeMP0), the RLC's boot after it (FakeRLC), and the SMU's mailbox (FakeMP1).

The files are packed here from the documented header layouts (amdgpu_ucode.h; docs/research/amd-pci.md), with their
own code, not plugrt_amd_pci.ucode's, so that a wrong offset in one is caught by the other. Every part is a distinct byte
pattern: the fake knows what each GFX_FW_TYPE must carry and checks the bytes the PSP is pointed at.
"""
from __future__ import annotations

import struct

from fake_amdgpu import GC_BASES, FakeMP0, FakeRegisters

COMMON = struct.Struct("<IIHHHHIIII")
#: GFX_FW_TYPE of each ucode (psp_gfx_if.h), the fake's own copy
TYPES = {"SMC": 18, "SDMA_UCODE_TH0": 71, "SDMA_UCODE_TH1": 72, "SDMA_RS64": 71, "CP_RS64_PFP": 87, "CP_RS64_ME": 88, "CP_RS64_MEC": 89,
         "CP_RS64_PFP_P0_STACK": 90, "CP_RS64_PFP_P1_STACK": 91, "CP_RS64_ME_P0_STACK": 92, "CP_RS64_ME_P1_STACK": 93,
         "CP_RS64_MEC_P0_STACK": 94, "CP_RS64_MEC_P1_STACK": 95, "CP_RS64_MEC_P2_STACK": 96, "CP_RS64_MEC_P3_STACK": 97,
         "IMU_I": 68, "IMU_D": 69, "RLC_RESTORE_LIST_CNTL": 22, "RLC_RESTORE_LIST_GPM_MEM": 20, "RLC_RESTORE_LIST_SRM_MEM": 21,
         "RLC_IRAM": 26, "RLC_DRAM": 48, "RLC_P": 25, "RLC_V": 7, "RLC_G": 8, "GLOBAL_TAP_DELAYS": 27, "SE0_TAP_DELAYS": 28,
         "SE1_TAP_DELAYS": 29, "SE2_TAP_DELAYS": 65, "SE3_TAP_DELAYS": 66}
GC_TYPES = {t for n, t in TYPES.items() if n.startswith(("CP_", "RLC", "IMU", "GLOBAL", "SE"))}


#: the RS64 files' ucode_start_addr_lo/hi (distinct, and MEC's with a high part, to see the kernel's arithmetic)
START = {"pfp": (0x2000, 0), "me": (0x3000, 0), "mec": (0x4000, 5)}


def pattern(name: str, n: int) -> bytes:
  tag = sum(name.encode()) & 0xFF
  return bytes((tag + j * 13 + (j >> 8)) & 0xFF for j in range(n))


class _File:
  """A firmware file being packed: a 0x100-byte header area, the ucode array, then more parts (each 256-aligned)."""
  def __init__(self, version: tuple[int, int], array: bytes, ip: tuple[int, int] = (0, 0)):
    self.buf, self.version, self.ip, self.fields = bytearray(0x100), version, ip, {}
    self.array_size = len(array)
    self.array = self.add(array)

  def add(self, data: bytes) -> int:
    at = len(self.buf)
    self.buf += data + bytes(-len(data) % 0x100)
    return at

  def done(self, header_size: int) -> bytes:
    COMMON.pack_into(self.buf, 0, len(self.buf), header_size, *self.version, *self.ip, 0x1234, self.array_size, self.array, 0)
    for at, v in self.fields.items(): struct.pack_into("<I", self.buf, at, v)
    return bytes(self.buf)


def ip_files(gc: tuple[int, int, int] = (11, 0, 0), mp1: tuple[int, int, int] = (13, 0, 0), sdma: tuple[int, int, int] = (6, 0, 0),
             rlc_minor: int = 3, sizes: dict[str, int] | None = None) -> tuple[dict[str, bytes], dict[str, bytes]]:
  """(file name -> contents, ucode name -> the bytes the PSP must be given) for one GPU's SMU, SDMA and GC firmware."""
  sizes = sizes or {}
  want: dict[str, bytes] = {}
  def part(name: str, n: int = 0x500) -> bytes:
    want[name] = pattern(name, sizes.get(name, n + 0x40 * (len(want) % 7)))
    return want[name]
  def v(t: tuple[int, ...]) -> str: return "_".join(map(str, t))
  files: dict[str, bytes] = {}
  f = _File((2, 0), part("SMC", 0x2000))                                    # smc v2.0: start addr, soft pptable (none)
  f.fields[32] = 0x1000
  files[f"smu_{v(mp1)}.bin"] = f.done(44)
  if sdma[0] >= 7:                                                          # sdma v3.0
    f = _File((3, 0), part("SDMA_RS64", 0x1800))
    f.fields |= {36: 0, 40: len(want["SDMA_RS64"])}
    files[f"sdma_{v(sdma)}.bin"] = f.done(44)
  else:                                                                     # sdma v2.0: ctx at the array, ctl apart
    f = _File((2, 0), part("SDMA_UCODE_TH0", 0x1800))
    ctl = f.add(part("SDMA_UCODE_TH1", 0x900))
    f.fields |= {36: len(want["SDMA_UCODE_TH0"]), 48: ctl, 52: len(want["SDMA_UCODE_TH1"])}
    files[f"sdma_{v(sdma)}.bin"] = f.done(64)
  pipes = {"pfp": 2, "me": 2, "mec": 4} if gc[0] == 11 else {"pfp": 1, "me": 1, "mec": 2}
  for cp, n in pipes.items():                                               # gfx v2.0 (RS64): ucode + one stack image
    lo, hi = START[cp]
    f = _File((2, 0), part(f"CP_RS64_{cp.upper()}", 0x3000))
    stack = pattern(f"{cp} stack", 0x700 + 0x100 * n)
    at = f.add(stack)
    for p in range(n): want[f"CP_RS64_{cp.upper()}_P{p}_STACK"] = stack
    f.fields |= {36: len(want[f"CP_RS64_{cp.upper()}"]), 40: 0, 44: len(stack), 48: at, 52: lo, 56: hi}
    files[f"gc_{v(gc)}_{cp}.bin"] = f.done(60)
  f = _File((1, 0), part("IMU_I", 0x1200) + part("IMU_D", 0x600))          # imu v1.0: iram then dram in the array
  f.fields |= {32: len(want["IMU_I"]), 36: 0, 40: len(want["IMU_D"]), 44: len(want["IMU_I"])}
  files[f"gc_{v(gc)}_imu.bin"] = f.done(48)
  f = _File((2, rlc_minor), part("RLC_G", 0x2800))                          # rlc v2.x: lists at absolute offsets
  lists = []
  if rlc_minor >= 1: lists += [("RLC_RESTORE_LIST_CNTL", 112), ("RLC_RESTORE_LIST_GPM_MEM", 128), ("RLC_RESTORE_LIST_SRM_MEM", 144)]
  if rlc_minor >= 2: lists += [("RLC_IRAM", 152), ("RLC_DRAM", 160)]
  if rlc_minor == 3: lists += [("RLC_P", 176), ("RLC_V", 192)]
  if rlc_minor == 4: lists += [("GLOBAL_TAP_DELAYS", 200), ("SE0_TAP_DELAYS", 208), ("SE1_TAP_DELAYS", 216), ("SE2_TAP_DELAYS", 224),
                               ("SE3_TAP_DELAYS", 232)]
  for name, size_at in lists:
    at = f.add(part(name, 0x300))
    f.fields |= {size_at: len(want[name]), size_at + 4: at}
  files[f"gc_{v(gc)}_rlc.bin"] = f.done({0: 100, 1: 152, 2: 168, 3: 200, 4: 240}[rlc_minor])
  return files, want


class FakeIPFirmware:
  """LOAD_IP_FW and AUTOLOAD_RLC on a FakeMP0: each load's MC address (4 KiB aligned), size and bytes are checked against
  `want` (by GFX_FW_TYPE); the SMU's load is checked against the kernel's place (before SETUP_TMR on MP0 13.0.0/13.0.7,
  else the first load); AUTOLOAD_RLC must follow RLC_G and every GC ucode. A good SMU load boots `mp1`. `refuse` maps a
  GFX_FW_TYPE to the status to answer."""
  CENTRALIZED = {(13, 0, 0), (13, 0, 2), (13, 0, 7)}

  def __init__(self, mp0: FakeMP0, want: dict[str, bytes], mp1: FakeMP1 | None = None, rlc: FakeRLC | None = None):
    self.mp0, self.mp1, self.rlc = mp0, mp1, rlc
    self.want = {TYPES[n]: (n, b) for n, b in want.items()}
    self.loaded: list[str] = []
    self.autoloaded = False
    self.refuse: dict[int, int] = {}
    mp0.handlers[0x6] = self.load_ip_fw
    mp0.handlers[0x21] = self.autoload

  def load_ip_fw(self, payload: bytes) -> int:
    lo, hi, size, fw_type = struct.unpack_from("<4I", payload)
    mc = hi << 32 | lo
    at = mc - self.mp0.mc_base
    name, data = self.want.get(fw_type, (f"type {fw_type}", None))
    bad = self.mp0.violations.append
    if data is None: bad(f"LOAD_IP_FW of unexpected GFX_FW_TYPE {fw_type}")
    elif at % 0x1000: bad(f"LOAD_IP_FW {name}: MC address not 4 KiB aligned (VRAM 0x{at:x})")
    elif size != len(data) or self.mp0.read_mc(mc, size) != data: bad(f"LOAD_IP_FW {name}: {size} bytes at MC 0x{mc:x} are not the file's")
    if self.autoloaded: bad(f"LOAD_IP_FW {name} after AUTOLOAD_RLC")
    cmds = [c for c, _ in self.mp0.commands[:-1]]
    if name == "SMC":
      if self.loaded: bad(f"SMC loaded after {self.loaded}")
      if self.mp0.version in self.CENTRALIZED and 0x5 in cmds: bad("SMC loaded after SETUP_TMR on a PMFW-centralized PSP")
      if self.mp0.version not in self.CENTRALIZED and self.mp0.version[0] == 13 and 0x5 not in cmds: bad("SMC loaded before SETUP_TMR")
    if fw_type in self.refuse: return self.refuse[fw_type]
    self.loaded.append(name)
    if name == "SMC" and data is not None and self.mp1 is not None: self.mp1.boot()
    return 0

  def autoload(self, payload: bytes) -> int:
    missing = [n for t, (n, _) in self.want.items() if t in GC_TYPES and n not in self.loaded]
    if missing or not self.loaded or self.loaded[-1] != "RLC_G":
      self.mp0.violations.append(f"AUTOLOAD_RLC with {missing} not loaded, last load {self.loaded[-1:]}")
    self.autoloaded = True
    if self.rlc is not None: self.rlc.start()
    return 0


class FakeRLC:
  """The RLC booting the CPs after AUTOLOAD_RLC: CP_STAT (GC seg 0 + 0xf40) reads busy and RLC_RLCS_BOOTLOAD_STATUS
  (GC seg 1 + 0x4e82 on GC 11, 0x4e7c on GC 12) lacks bit 31 until `boot_reads` reads of the status after the autoload;
  `hang` keeps it booting."""
  def __init__(self, regs: FakeRegisters, gc: tuple[int, int, int] = (11, 0, 0), bases: tuple[int, ...] = GC_BASES, boot_reads: int = 3):
    self.r, self.boot_reads, self.left, self.hang, self.done = regs, boot_reads, -1, False, False
    self.cp, self.status = bases[0] + 0xF40, bases[1] + (0x4E82 if gc[0] == 11 else 0x4E7C)
    regs.regs[self.cp], regs.regs[self.status] = 0x80000000, 0x18        # busy, IRAM loaded/done, not complete
    regs.on_read[self.status] = self._tick

  def start(self) -> None: self.left = self.boot_reads

  def _tick(self) -> None:
    if self.left < 0 or self.hang: return
    self.left -= 1
    if self.left <= 0:
      self.r.regs[self.cp], self.r.regs[self.status] = 0, self.r.regs[self.status] | 1 << 31
      self.done, self.left = True, -1


class FakeMP1:
  """The SMU's mailbox as smu_cmn.c expects it: MP1_FIRMWARE_FLAGS (SMN) bit 0 comes up `boot_reads` reads after the
  PSP loaded the SMU; a message (C2PMSG_66) is answered in C2PMSG_90 after `answer_reads` reads, its result in C2PMSG_82
  (GetSmuVersion, GetDriverIfVersion). `hang` ("ready", "answer") stops one from happening; `resp` overrides the
  response per message. Checks (in `violations`): the response register cleared before each message, no message while
  the previous one is unanswered, none before the SMU runs."""
  FLAGS = 0x03B10024

  def __init__(self, regs: FakeRegisters, version: tuple[int, int, int] = (13, 0, 0), bases: tuple[int, ...] = (0x16000, 0xDC0000),
               smu_version: int = 0x004E4A00, if_version: int = 0x3D, boot_reads: int = 3, answer_reads: int = 2):
    self.r, self.version = regs, version
    box = ((0x282, 0), (0x292, 0), (0x29A, 0)) if version[0] == 13 else ((0x82, 1), (0x92, 1), (0x9A, 1))
    self.msg_reg, self.arg_reg, self.resp_reg = (bases[seg] + off for off, seg in box)
    self.smu_version, self.if_version, self.boot_reads, self.answer_reads = smu_version, if_version, boot_reads, answer_reads
    self.booted, self.countdown, self.pending = False, -1, None
    self.messages: list[tuple[int, int]] = []
    self.violations: list[str] = []
    self.hang: set[str] = set()
    self.resp: dict[int, int] = {}
    self.set(self.resp_reg, 0)
    self.hook(self.msg_reg, self._message)
    self.hook(self.resp_reg, self._resp_write)
    if self.resp_reg * 4 < regs.size: regs.on_read[self.resp_reg] = self._tick
    else: regs.on_smn_read[self.resp_reg * 4] = self._tick
    regs.on_smn_read[self.FLAGS] = self._flags

  def set(self, reg: int, v: int) -> None:
    if reg * 4 < self.r.size: self.r.regs[reg] = v
    else: self.r.smn[reg * 4] = v

  def get(self, reg: int) -> int: return self.r.regs.get(reg, 0) if reg * 4 < self.r.size else self.r.smn.get(reg * 4, 0)

  def hook(self, reg: int, fn) -> None:
    if reg * 4 < self.r.size: self.r.on_write[reg] = fn
    else: self.r.on_smn_write[reg * 4] = fn

  def boot(self) -> None: self.booted, self.flag_reads = True, self.boot_reads

  def _flags(self) -> None:
    if self.booted and "ready" not in self.hang:
      self.flag_reads -= 1
      if self.flag_reads <= 0: self.r.smn[self.FLAGS] = 1

  def _resp_write(self, v: int) -> None:
    if self.pending is not None: self.violations.append(f"response register written while message {self.pending} is unanswered")

  def _message(self, msg: int) -> None:
    if self.get(self.resp_reg) != 0: self.violations.append(f"message {msg} written without clearing the response register")
    if not self.r.smn.get(self.FLAGS, 0) & 1: self.violations.append(f"message {msg} before the SMU is ready")
    self.messages.append((msg, self.get(self.arg_reg)))
    self.pending, self.countdown = msg, self.answer_reads

  def _tick(self) -> None:
    if self.pending is None or "answer" in self.hang: return
    self.countdown -= 1
    if self.countdown > 0: return
    msg, self.pending = self.pending, None
    if msg == 2: self.set(self.arg_reg, self.smu_version)
    elif msg == 3: self.set(self.arg_reg, self.if_version)
    self.set(self.resp_reg, self.resp.get(msg, 1 if msg in (1, 2, 3) else 0xFE))


class FakeCP:
  """GC 11's RS64 CP set-up registers: each program-counter start write is recorded with the GRBM_GFX_CNTL selection it
  was made under (`starts[(me, pipe)] = {register: value}`), and the pipe-reset bits of CP_ME_CNTL / CP_MEC_RS64_CNTL
  must be set then cleared (`pulses` counts both edges per register)."""
  def __init__(self, regs: FakeRegisters, bases: tuple[int, ...] = GC_BASES):
    self.r, self.starts, self.pulses = regs, {}, {}
    self.grbm = bases[1] + 0x900
    regs_at = {"PFP_START": bases[0] + 0x1E44, "PFP_START_HI": bases[0] + 0x1E59, "ME_START": bases[0] + 0x1E45,
               "ME_START_HI": bases[0] + 0x1E79, "MEC_START": bases[1] + 0x2900, "MEC_START_HI": bases[1] + 0x2938}
    for name, at in regs_at.items(): regs.on_write[at] = lambda v, name=name: self._start(name, v)
    for name, at in (("CP_ME_CNTL", bases[1] + 0x803), ("CP_MEC_RS64_CNTL", bases[1] + 0x2904)):
      regs.on_write[at] = lambda v, name=name: self.pulses.setdefault(name, []).append(v)

  def _start(self, name: str, value: int) -> None:
    sel = self.r.regs.get(self.grbm, 0)
    self.starts.setdefault((sel >> 2 & 3, sel & 3), {})[name] = value
