"""The IP firmware files the PSP loads (SMU, SDMA, GC's PFP/ME/MEC, RLC, IMU): their headers, split into what the PSP
takes one `GFX_CMD_ID_LOAD_IP_FW` at a time.

Every file starts with amdgpu's 32-byte common header (`psp_firmware.common_header`); the header that follows depends on
the file kind and the header version, and says where each ucode lies. What the kernel sends for each one (its
`AMDGPU_UCODE_ID`, which also fixes the load order, and the `GFX_FW_TYPE` the PSP is told), as amdgpu_ucode.c's
amdgpu_ucode_init_single_fw reads it under PSP loading:

- SMU (smc header v1.x/v2.x): `SMC`, the common header's ucode_size_bytes at ucode_array_offset_bytes;
- SDMA: v1 `SDMA0` (the common header's ucode); v2 `SDMA_UCODE_TH0` (ctx_ucode_size_bytes at the ucode array) and
  `SDMA_UCODE_TH1` (ctl_ucode_size_bytes at ctl_ucode_offset); v3 `SDMA_RS64` (ucode_size_bytes at the ucode array);
- GC PFP/ME/MEC: gfx v2 (RS64) `CP_RS64_<X>` (ucode_size_bytes at the ucode array) and one `..._P<n>_STACK` per pipe
  (data_size_bytes at data_offset_bytes, the same bytes for every pipe: GC 11 has 2 PFP, 2 ME, 4 MEC pipes, GC 12
  1, 1, 2); gfx v1 `CP_PFP`/`CP_ME`/`CP_MEC1` (MEC without its jump table; the jump table is skipped under autoload);
- RLC (rlc v2.x): v2.1+ the three save/restore lists, v2.2+ IRAM and DRAM, v2.3 RLC_P and RLC_V, v2.4 the tap delays
  (the kernel reads the v2.3 part only when the minor version is exactly 3), then `RLC_G` (the common header's ucode);
- IMU (imu v1.0): `IMU_I` (iram size at the ucode array) and `IMU_D` (dram size right after it).

Offsets in the v2 headers count from the start of the file, except the ucode array's. A part whose size is 0 is
skipped, as fw_load_skip_check skips it. A part outside the file, or a header too short for its version, is a
`UcodeError`. Sources: docs/research/amd-pci.md ("IP firmware"). Pure Python, no device access.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

from plugrt_amd_pci.psp_firmware import CommonHeader, PSPFirmwareError, common_header, decompress

#: AMDGPU_UCODE_ID name -> (enum value: the kernel's load order, GFX_FW_TYPE) (amdgpu_ucode.h, psp_gfx_if.h, amdgpu_psp.c)
UCODES: dict[str, tuple[int, int]] = {
  "SDMA0": (1, 9), "SDMA_UCODE_TH0": (9, 71), "SDMA_UCODE_TH1": (10, 72), "SDMA_RS64": (11, 71),
  "CP_PFP": (13, 2), "CP_ME": (14, 1), "CP_RS64_PFP": (15, 87), "CP_RS64_ME": (16, 88), "CP_RS64_MEC": (17, 89),
  "CP_RS64_PFP_P0_STACK": (18, 90), "CP_RS64_PFP_P1_STACK": (19, 91), "CP_RS64_ME_P0_STACK": (20, 92),
  "CP_RS64_ME_P1_STACK": (21, 93), "CP_RS64_MEC_P0_STACK": (22, 94), "CP_RS64_MEC_P1_STACK": (23, 95),
  "CP_RS64_MEC_P2_STACK": (24, 96), "CP_RS64_MEC_P3_STACK": (25, 97), "CP_MEC1": (26, 4), "CP_MEC1_JT": (27, 5),
  "IMU_I": (34, 68), "IMU_D": (35, 69), "GLOBAL_TAP_DELAYS": (36, 27), "SE0_TAP_DELAYS": (37, 28),
  "SE1_TAP_DELAYS": (38, 29), "SE2_TAP_DELAYS": (39, 65), "SE3_TAP_DELAYS": (40, 66),
  "RLC_RESTORE_LIST_CNTL": (41, 22), "RLC_RESTORE_LIST_GPM_MEM": (42, 20), "RLC_RESTORE_LIST_SRM_MEM": (43, 21),
  "RLC_IRAM": (44, 26), "RLC_DRAM": (45, 48), "RLC_P": (46, 25), "RLC_V": (47, 7), "RLC_G": (48, 8), "SMC": (50, 18),
}
FW_TYPE_NAMES = {t: n for n, (_, t) in UCODES.items()} | {71: "SDMA_UCODE_TH0/SDMA_RS64"}
#: RS64 stacks per pipe: GC major -> (PFP, ME, MEC) pipe counts (gfx_v11_0.c / gfx_v12_0.c init_microcode)
STACKS = {11: (2, 2, 4), 12: (1, 1, 2)}
KINDS = ("smc", "sdma", "pfp", "me", "mec", "rlc", "imu")
# rlc v2.x fields after the common header and rlc v2.0's 17 dwords (byte offsets; amdgpu_ucode.h)
RLC_V21 = (("RLC_RESTORE_LIST_CNTL", 112, 116), ("RLC_RESTORE_LIST_GPM_MEM", 128, 132), ("RLC_RESTORE_LIST_SRM_MEM", 144, 148))
RLC_V22 = (("RLC_IRAM", 152, 156), ("RLC_DRAM", 160, 164))
RLC_V23 = (("RLC_P", 176, 180), ("RLC_V", 192, 196))
RLC_V24 = (("GLOBAL_TAP_DELAYS", 200, 204), ("SE0_TAP_DELAYS", 208, 212), ("SE1_TAP_DELAYS", 216, 220),
           ("SE2_TAP_DELAYS", 224, 228), ("SE3_TAP_DELAYS", 232, 236))
RLC_HEADER_END = {0: 100, 1: 152, 2: 168, 3: 200, 4: 240}


class UcodeError(PSPFirmwareError):
  """An IP firmware file plugrt cannot split into ucodes: corrupt, truncated, or a header version it does not read."""


@dataclass(frozen=True)
class Ucode:
  """One image the PSP loads: its AMDGPU_UCODE_ID name and value, GFX_FW_TYPE, bytes, and where they came from."""
  name: str
  ucode_id: int
  fw_type: int
  data: bytes
  file: str
  offset: int                  # in the (decompressed) file

  @property
  def size(self) -> int: return len(self.data)


@dataclass(frozen=True)
class IPFirmware:
  """One IP firmware file, split: `ucodes` in the file's order, `skipped` parts the kernel would skip too."""
  kind: str
  path: str
  header: CommonHeader
  ucodes: tuple[Ucode, ...]
  skipped: tuple[str, ...] = ()
  start_addr: int | None = None  # RS64 ucode start address (gfx v2), for the CP set-up that follows

  def describe(self) -> str:
    v = self.header.header_version
    parts = ", ".join(f"{u.name} {u.size}" for u in self.ucodes)
    return f"{self.path.rsplit('/', 1)[-1]} (v{v[0]}.{v[1]}: {parts}{'; skipped ' + ', '.join(self.skipped) if self.skipped else ''})"


def parse(blob: bytes, kind: str, path: str = "", gc_major: int = 11) -> IPFirmware:
  """Split one IP firmware file of `kind` (smc, sdma, pfp, me, mec, rlc, imu) into the ucodes the PSP loads."""
  if kind not in KINDS: raise ValueError(f"unknown IP firmware kind {kind!r} (one of {', '.join(KINDS)})")
  blob = bytes(blob)
  name = path.rsplit("/", 1)[-1] or kind
  h = common_header(blob, path, UcodeError, prefix="IP firmware")
  major, minor = h.header_version
  array = h.ucode_array_offset_bytes
  out: list[Ucode] = []
  skipped: list[str] = []

  def fail(what: str, hint: str = "the file is truncated or corrupt; reinstall linux-firmware") -> UcodeError:
    return UcodeError(f"IP firmware: {path or name}: {what}", hint)

  def u32(at: int) -> int:
    if at + 4 > array:      # the versioned header lies before the ucode array
      raise fail(f"its v{major}.{minor} {kind} header needs byte {at + 4}, past the ucode array at byte {array}")
    return struct.unpack_from("<I", blob, at)[0]

  def add(ucode: str, offset: int, size: int) -> None:
    if size == 0:
      skipped.append(ucode)
      return
    if offset < 0 or offset + size > len(blob):
      raise fail(f"{ucode} at byte 0x{offset:x} (+{size}) lies outside the {len(blob)}-byte file")
    uid, fw_type = UCODES[ucode]
    out.append(Ucode(ucode, uid, fw_type, blob[offset:offset + size], name, offset))

  def unsupported() -> UcodeError:
    return fail(f"{kind} header version {major}.{minor} is not one plugrt reads", "a newer firmware layout: update plugrt")

  start = None
  if kind == "smc":
    if major not in (1, 2): raise unsupported()
    add("SMC", array, h.ucode_size_bytes)
  elif kind == "sdma":
    if major == 1: add("SDMA0", array, h.ucode_size_bytes)
    elif major == 2:
      add("SDMA_UCODE_TH0", array, u32(36))
      add("SDMA_UCODE_TH1", u32(48), u32(52))
    elif major == 3: add("SDMA_RS64", array, u32(40))
    else: raise unsupported()
  elif kind in ("pfp", "me", "mec"):
    if major == 2:
      if (pipes := STACKS.get(gc_major)) is None: raise fail(f"RS64 stacks are not known for GC {gc_major}", "update plugrt")
      cp = kind.upper()
      add(f"CP_RS64_{cp}", array, u32(36))
      for pipe in range(pipes[("pfp", "me", "mec").index(kind)]): add(f"CP_RS64_{cp}_P{pipe}_STACK", u32(48), u32(44))
      start = u32(52) | u32(56) << 32
    elif major == 1:
      jt_size = u32(40) * 4
      if kind == "mec": add("CP_MEC1", array, h.ucode_size_bytes - jt_size)       # the jump table: skipped under autoload
      else: add(f"CP_{kind.upper()}", array, h.ucode_size_bytes)
    else: raise unsupported()
  elif kind == "rlc":
    if major != 2 or minor not in RLC_HEADER_END: raise unsupported()
    u32(RLC_HEADER_END[minor] - 4)          # the whole versioned header is there
    lists = (RLC_V21 if minor >= 1 else ()) + (RLC_V22 if minor >= 2 else ()) + (RLC_V23 if minor == 3 else ()) + \
            (RLC_V24 if minor == 4 else ())
    for ucode, size_at, off_at in lists: add(ucode, u32(off_at), u32(size_at))
    add("RLC_G", array, h.ucode_size_bytes)
  else:   # imu
    if major != 1: raise unsupported()
    iram, dram = u32(32), u32(40)
    add("IMU_I", array, iram)
    add("IMU_D", array + iram, dram)
  return IPFirmware(kind, path or name, h, tuple(out), tuple(skipped), start)


def load(path: str, kind: str, gc_major: int = 11) -> IPFirmware:
  """Read (decompressing .zst/.xz) and split one IP firmware file."""
  try:
    with open(path, "rb") as f: blob = f.read()
  except OSError as e: raise UcodeError(f"IP firmware: cannot read {path} ({e.strerror})", "check the file's permissions") from None
  return parse(decompress(blob, path), kind, path, gc_major)


def load_order(files: list[IPFirmware]) -> list[Ucode]:
  """Every ucode of `files` in the kernel's order (psp_load_non_psp_fw walks AMDGPU_UCODE_ID upwards); the SMC, which
  the PSP loads apart (first, or before SETUP_TMR), and MEC1's jump table (skipped under autoload) left out."""
  seen: dict[int, Ucode] = {}
  for f in files:
    for u in f.ucodes:
      if u.ucode_id in seen: raise UcodeError(f"IP firmware: {u.name} comes from both {seen[u.ucode_id].file} and {u.file}")
      seen[u.ucode_id] = u
  return [seen[i] for i in sorted(seen) if seen[i].name not in ("SMC", "CP_MEC1_JT")]
