"""The PSP's firmware files (amdgpu/psp_<ver>_sos.bin, psp_<ver>_ta.bin): their headers and the binaries inside.

A PSP firmware file starts with amdgpu's common firmware header (32 bytes: total size, header size, header version,
IP version, ucode version, ucode size, the offset of the ucode array, a crc32). After it, by header version:

- v1.x (older sOS files): one legacy descriptor {version, offset, size} per part at fixed places (sOS @32; v1.1/v1.3
  add TOC @44 and KDB @56; v1.3 SPL @68, RL @80); the system driver is the first `sos.offset` bytes of the array;
- v2.0 / v2.1 (PSP 13 and 14): a count and a table of {fw_type, fw_version, offset, size} descriptors (v2.1 has one
  more u32, the aux index, before the table); the same layout in ta.bin ("ta_firmware_header_v2_0") with TA types.

Every offset is relative to the ucode array (`ucode_array_offset_bytes` from the file's start), as the kernel's
parse_sos_bin_descriptor reads it. `parse(blob)` validates what the kernel validates (the header's size_bytes equals
the file's size, as amdgpu_ucode_validate checks) and more (each binary lies inside the file; known types appear once);
corruption is a `PSPFirmwareError`. The header's crc32 is compared with zlib's crc32 of the ucode array and recorded
(`crc_matches`), not enforced: the kernel never checks it and no real file was available to confirm what it covers.
`load(path)` reads a file, decompressing .zst (needs the `zstandard` module) and .xz (standard library).
Sources: docs/research/amd-pci.md ("PSP firmware files"). Pure Python, no device access.
"""
from __future__ import annotations

import lzma
import struct
import zlib
from dataclasses import dataclass, field

from plugrt.errors import PlugrtError, Reason

COMMON_HEADER = struct.Struct("<IIHHHHIIII")   # size_bytes .. crc32 (32 bytes)
DESC = struct.Struct("<IIII")                  # psp_fw_bin_desc: fw_type, fw_version, offset_bytes, size_bytes
LEGACY_DESC = struct.Struct("<III")            # psp_fw_legacy_bin_desc: fw_version, offset_bytes, size_bytes

#: enum psp_fw_type (amdgpu_ucode.h): descriptor types in sos.bin
SOS_TYPES = {1: "sos", 2: "sys_drv", 3: "kdb", 4: "toc", 5: "spl", 6: "rl", 7: "soc_drv", 8: "intf_drv", 9: "dbg_drv",
             10: "ras_drv", 11: "ipkeymgr_drv"}
#: enum ta_fw_type (amdgpu_ucode.h): descriptor types in ta.bin
TA_TYPES = {1: "asd", 2: "xgmi", 3: "ras", 4: "hdcp", 5: "dtm", 6: "rap", 7: "securedisplay"}
#: psp_firmware_header_v1_x: (name, byte offset of its legacy descriptor, first minor version that has it)
V1_PARTS = (("sos", 32, 0), ("toc", 44, 1), ("kdb", 56, 1), ("spl", 68, 3), ("rl", 80, 3))


class PSPFirmwareError(PlugrtError, ValueError):
  """A PSP firmware file that is missing, compressed without the means to decompress it, or corrupt."""


class FirmwareToolMissing(PSPFirmwareError):
  """A compressed firmware file whose decompressor is not installed (reason: missing toolchain)."""
  reason = Reason.MISSING_TOOLCHAIN


@dataclass(frozen=True)
class CommonHeader:
  size_bytes: int
  header_size_bytes: int
  header_version: tuple[int, int]
  ip_version: tuple[int, int]
  ucode_version: int
  ucode_size_bytes: int
  ucode_array_offset_bytes: int
  crc32: int


@dataclass(frozen=True)
class PSPBinary:
  name: str               # "sos", "kdb", "sys_drv", ... (or "type<N>" for a type plugrt does not name)
  fw_type: int            # the descriptor's type (0 for v1 files)
  version: int
  offset: int             # from the start of the file
  data: bytes

  @property
  def size(self) -> int: return len(self.data)


@dataclass(frozen=True)
class PSPFirmware:
  header: CommonHeader
  binaries: dict[str, PSPBinary] = field(default_factory=dict)
  crc_matches: bool | None = None      # None: the header's crc32 is 0
  path: str = ""

  def get(self, name: str) -> PSPBinary | None: return self.binaries.get(name)

  def describe(self) -> str:
    v = self.header.header_version
    return f"header v{v[0]}.{v[1]}, " + ", ".join(f"{b.name} 0x{b.version:x} ({b.size} bytes)" for b in self.binaries.values())


def _fail(what: str, hint: str = "the file is truncated or not a PSP firmware file; reinstall linux-firmware") -> PSPFirmwareError:
  return PSPFirmwareError(f"PSP firmware: {what}", hint)


def common_header(blob: bytes, path: str = "", fail: type[PSPFirmwareError] | None = None, prefix: str = "PSP firmware") -> CommonHeader:
  """The common firmware header of any amdgpu firmware file, validated (size_bytes as amdgpu_ucode_validate checks it)."""
  where = f"{prefix}: {path}: " if path else f"{prefix}: "
  def bad(what: str) -> PSPFirmwareError:
    return (fail or PSPFirmwareError)(f"{where}{what}", "the file is truncated or not an amdgpu firmware file; reinstall linux-firmware")
  if len(blob) < COMMON_HEADER.size: raise bad(f"{len(blob)} bytes, shorter than the {COMMON_HEADER.size}-byte common header")
  f = COMMON_HEADER.unpack_from(blob)
  h = CommonHeader(f[0], f[1], (f[2], f[3]), (f[4], f[5]), f[6], f[7], f[8], f[9])
  if h.size_bytes != len(blob):
    raise bad(f"header size_bytes is {h.size_bytes}, the file has {len(blob)} bytes (the kernel's amdgpu_ucode_validate refuses it)")
  if not COMMON_HEADER.size <= h.header_size_bytes <= len(blob):
    raise bad(f"header_size_bytes {h.header_size_bytes} is outside 32..{len(blob)}")
  if not 0 < h.ucode_array_offset_bytes <= len(blob):
    raise bad(f"ucode_array_offset_bytes 0x{h.ucode_array_offset_bytes:x} is outside the {len(blob)}-byte file")
  return h


def parse(blob: bytes | bytearray | memoryview, kind: str = "sos", path: str = "") -> PSPFirmware:
  """Validate and decode a PSP firmware file (`kind` "sos" or "ta" names the descriptor types)."""
  blob = bytes(blob)
  where = f"{path}: " if path else ""
  h = common_header(blob, path)
  array = h.ucode_array_offset_bytes
  types = SOS_TYPES if kind == "sos" else TA_TYPES
  found: dict[str, PSPBinary] = {}

  def add(name: str, fw_type: int, version: int, offset: int, size: int) -> None:
    start = array + offset
    if offset < 0 or size < 0 or start + size > len(blob):
      raise _fail(f"{where}{name} at ucode offset 0x{offset:x} (+{size}) lies outside the {len(blob)}-byte file")
    if name in found: raise _fail(f"{where}{name} is listed twice in the descriptor table")
    found[name] = PSPBinary(name, fw_type, version, start, blob[start:start + size])

  major, minor = h.header_version
  if major == 1:
    if kind != "sos": raise _fail(f"{where}a v1 header in a {kind} file (plugrt reads v2 TA files only)", "use a current linux-firmware")
    for name, at, since in V1_PARTS:
      if minor < since or at + LEGACY_DESC.size > h.header_size_bytes: continue
      version, offset, size = LEGACY_DESC.unpack_from(blob, at)
      if size: add(name, 0, version, offset, size)
    if "sos" in found:   # v1: the system driver is the start of the array, up to the sOS
      sos_version, sos_offset, _ = LEGACY_DESC.unpack_from(blob, 32)
      add("sys_drv", 0, sos_version, 0, sos_offset)
  elif major == 2:
    table = COMMON_HEADER.size + (8 if minor >= 1 else 4)
    if table > len(blob): raise _fail(f"{where}v2 header truncated before its descriptor table")
    count = struct.unpack_from("<I", blob, COMMON_HEADER.size)[0]
    if table + count * DESC.size > array:
      raise _fail(f"{where}{count} descriptors at 0x{table:x} run past the ucode array at 0x{array:x}")
    for i in range(count):
      fw_type, version, offset, size = DESC.unpack_from(blob, table + i * DESC.size)
      add(types.get(fw_type, f"type{fw_type}"), fw_type, version, offset, size)
  else:
    raise _fail(f"{where}header version {major}.{minor} is not one plugrt reads (1.x, 2.0, 2.1)", "a newer firmware layout: update plugrt")
  crc = None
  if h.crc32:
    end = min(len(blob), array + h.ucode_size_bytes)
    crc = zlib.crc32(blob[array:end]) == h.crc32
  return PSPFirmware(h, found, crc, path)


def decompress(blob: bytes, path: str) -> bytes:
  """The contents of a firmware file as the kernel's loader sees them: .zst and .xz decompressed."""
  if path.endswith(".xz"):
    try: return lzma.decompress(blob)
    except lzma.LZMAError as e: raise _fail(f"{path}: not a valid .xz file ({e})") from None
  if path.endswith(".zst"):
    try:
      import zstandard
    except ImportError:
      raise FirmwareToolMissing(f"PSP firmware: {path} is zstd-compressed and the zstandard module is not installed [missing toolchain]",
                             "pip install zstandard (or the plugrt-amd-pci[firmware] extra), or decompress it with zstd -d into a folder "
                                "and point PLUGRT_AMD_FIRMWARE at it") from None
    try: return zstandard.ZstdDecompressor().decompressobj().decompress(blob)
    except zstandard.ZstdError as e: raise _fail(f"{path}: not a valid .zst file ({e})") from None
  return blob


def load(path: str, kind: str = "sos") -> PSPFirmware:
  """Read, decompress and parse one PSP firmware file."""
  try:
    with open(path, "rb") as f: blob = f.read()
  except OSError as e: raise _fail(f"cannot read {path} ({e.strerror})", "check the file's permissions") from None
  return parse(decompress(blob, path), kind, path)


def build(parts: list[tuple[int, int, bytes]], header_minor: int = 0, ip_version: tuple[int, int] = (13, 0), ucode_version: int = 0x3A0001,
          crc: bool = True) -> bytes:
  """A valid v2.x PSP firmware file holding `parts` ((fw_type, fw_version, data), in order); tests and the fake use it."""
  table = COMMON_HEADER.size + (8 if header_minor >= 1 else 4)
  array = (table + len(parts) * DESC.size + 255) & ~255
  descs, payload = bytearray(), bytearray()
  for fw_type, version, data in parts:
    descs += DESC.pack(fw_type, version, len(payload), len(data))
    payload += data + bytes(-len(data) % 256)
  out = bytearray(array) + payload
  crc32 = zlib.crc32(payload) if crc else 0
  COMMON_HEADER.pack_into(out, 0, len(out), table + len(descs), 2, header_minor, *ip_version, ucode_version, len(payload), array, crc32)
  struct.pack_into("<I", out, COMMON_HEADER.size, len(parts))
  out[table:table + len(descs)] = descs
  return bytes(out)
