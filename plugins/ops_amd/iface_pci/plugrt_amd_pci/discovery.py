"""AMD's IP discovery table: which IP blocks a GPU has, their versions and their register bases.

The amdgpu driver reads this binary from the top of VRAM (`DISCOVERY_TMR_OFFSET` below the VRAM size that
RCC_CONFIG_MEMSIZE reports) or, with `amdgpu.discovery=2`, from the firmware file amdgpu/ip_discovery.bin; every
register offset it uses afterwards is an IP block's base (from this table) plus the register's offset inside the
block. `parse(blob)` validates it the way the driver does (signatures, the binary checksum, each table's checksum)
and returns a typed `DiscoveryTable`; any corruption is a `DiscoveryError` naming what is wrong. `build(...)` makes
a valid binary from the same documented layout (tests and the fake GPUs use it).

Layouts and constants: the Linux kernel's drivers/gpu/drm/amd/include/discovery.h and soc15_hw_ip.h, and
amdgpu_discovery.c for the checksums (docs/research/amd-pci.md). Pure Python, no device access.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

from plugrt.errors import PlugrtError

BINARY_SIGNATURE = 0x28211407
DISCOVERY_TABLE_SIGNATURE = 0x53445049   # "IPDS"
GC_TABLE_ID = 0x4347                     # "GC"
HARVEST_TABLE_SIGNATURE = 0x56524148     # "HARV"
# table_list indices of the binary header
IP_DISCOVERY, GC, HARVEST_INFO, VCN_INFO, MALL_INFO, NPS_INFO = range(6)
TOTAL_TABLES = 6
TABLE_NAMES = ("IP_DISCOVERY", "GC", "HARVEST_INFO", "VCN_INFO", "MALL_INFO", "NPS_INFO")
BINARY_HEADER_SIZE = 12 + 8 * TOTAL_TABLES     # signature, version major/minor, checksum, size, table_list[6]
IP_HEADER_SIZE = 80                            # ip_discovery_header
MAX_DIES = 16
DIE_HEADER_SIZE = 4
IP_ENTRY_SIZE = 8                              # before its base addresses
GPU_INFO_HEADER_SIZE = 12
HARVEST_TABLE_SIZE = 8 + 32 * 4                # header + 32 (hw_id u16, instance u8, reserved u8)
HWIP_MAX_INSTANCE = 44
HW_ID_MAX = 300
# where the driver finds the binary: DISCOVERY_TMR_OFFSET below the top of VRAM, DISCOVERY_TMR_SIZE bytes read
DISCOVERY_TMR_OFFSET = 64 << 10
DISCOVERY_TMR_SIZE = 10 << 10
FIRMWARE_IP_DISCOVERY = "ip_discovery.bin"     # amdgpu/ip_discovery.bin, read with amdgpu.discovery=2

#: hardware ids (soc15_hw_ip.h) of the blocks plugrt names; others print as HWID<n>
HW_IDS: dict[int, str] = {
  1: "MP1", 2: "MP2", 3: "THM", 4: "SMUIO", 5: "FUSE", 6: "CLKA", 10: "PWR", 11: "GC", 12: "VCN", 13: "AUDIO_AZ", 14: "ACP",
  15: "DCI", 16: "DCO", 17: "XDMA", 18: "DCEAZ", 19: "SDPMUX", 20: "NTB", 21: "VPE", 24: "IOHC", 28: "L2IMU", 32: "VCE",
  34: "MMHUB", 35: "ATHUB", 36: "DBGU_NBIO", 37: "DFX", 38: "DBGU0", 39: "DBGU1", 40: "OSSSYS", 41: "HDP", 42: "SDMA0",
  43: "SDMA1", 44: "ISP", 45: "DBGU_IO", 46: "DF", 47: "CLKB", 48: "FCH", 49: "DFX_DAP", 68: "SDMA2", 69: "SDMA3",
  70: "PCIE", 71: "PCS", 72: "DDCL", 73: "SST", 74: "LSDMA", 100: "IOAGR", 108: "NBIF", 109: "IOAPIC", 110: "SYSTEMHUB",
  111: "NTBCCP", 150: "UMC", 151: "SATA", 152: "USB", 200: "CCXSEC", 201: "XGMI", 202: "XGBE", 255: "MP0",
  271: "DMU", 272: "DIO", 274: "DAZ",
}
HW_ID_BY_NAME = {v: k for k, v in HW_IDS.items()}
#: what the blocks plugrt reports are
ROLES = {"GC": "graphics/compute", "MP0": "PSP (security processor)", "MP1": "SMU (power management)", "SDMA0": "SDMA",
         "NBIF": "NBIO (PCIe bus interface)", "MMHUB": "memory hub", "HDP": "host data path", "OSSSYS": "interrupt handler",
         "UMC": "memory controller", "VCN": "video codec", "DMU": "display", "DF": "data fabric"}


class DiscoveryError(PlugrtError, ValueError):
  """The IP discovery binary is missing, corrupt or not understood; the message says which check failed and where."""


@dataclass(frozen=True)
class IPBlock:
  """One IP block instance the discovery table lists: which hardware (hw_id, see HW_IDS), its version and register bases."""
  hw_id: int
  instance: int
  major: int
  minor: int
  revision: int
  variant: int              # byte 7: v1/v2 tables: harvest (low 4 bits); v3+: sub_revision (low) and variant (high)
  bases: tuple[int, ...]    # register bases (dword offsets), one per segment (the header's *_BASE_IDX selects)
  die: int = 0
  harvested: bool = False

  @property
  def name(self) -> str: return HW_IDS.get(self.hw_id, f"HWID{self.hw_id}")
  @property
  def version(self) -> tuple[int, int, int]: return (self.major, self.minor, self.revision)
  @property
  def version_str(self) -> str: return f"{self.major}.{self.minor}.{self.revision}"


@dataclass(frozen=True)
class GCInfo:
  """The GC table's common fields (gc_info v1 for RDNA, v2 for GFX9/CDNA: offsets 12-72 are shared)."""
  version: tuple[int, int]
  num_se: int
  wave_size: int
  max_waves_per_simd: int
  lds_size: int
  num_sa_per_se: int        # v1 only (0 in v2)
  num_cu_per_sh: int        # v2 only; v1 counts WGPs: num_wgp0_per_sa + num_wgp1_per_sa
  num_wgp_per_sa: int


@dataclass(frozen=True)
class DiscoveryTable:
  """A validated, parsed IP discovery binary: every IP block of every die, the GC table, the harvest list."""
  version: tuple[int, int]              # binary header version
  ip_version: int                       # ip_discovery_header version
  blocks: tuple[IPBlock, ...]
  gc: GCInfo | None
  harvest: tuple[tuple[int, int], ...]  # (hw_id, instance) the harvest table lists
  tables: tuple[str, ...] = field(default=())   # the tables present (non-zero offset)

  def find(self, name: str, instance: int = 0, die: int = 0) -> IPBlock | None:
    """The block named `name` (HW_IDS' names: "GC", "NBIF", ...), that instance on that die, or None."""
    return next((b for b in self.blocks if b.name == name and b.instance == instance and b.die == die), None)

  def version_of(self, name: str) -> tuple[int, int, int] | None:
    b = self.find(name)
    return b.version if b else None

  def summary(self, names: tuple[str, ...] = ("GC", "MP0", "MP1", "SDMA0", "NBIF", "MMHUB")) -> str:
    """"GC 11.0.0, MP0 13.0.0, ..." for the named blocks present (instance 0, die 0)."""
    return ", ".join(f"{n} {b.version_str}" for n in names if (b := self.find(n)) is not None)


def checksum(data: bytes | memoryview) -> int:
  """amdgpu's discovery checksum: the byte sum modulo 2^16."""
  return sum(data) & 0xFFFF


def _u16(b: bytes, off: int) -> int: return struct.unpack_from("<H", b, off)[0]
def _u32(b: bytes, off: int) -> int: return struct.unpack_from("<I", b, off)[0]


def _need(blob: bytes, off: int, size: int, what: str) -> None:
  if off < 0 or off + size > len(blob):
    raise DiscoveryError(f"IP discovery: {what} at 0x{off:x} (+{size}) lies outside the {len(blob)}-byte binary",
                         "the binary is truncated or its offsets are corrupt")


def _check(blob: bytes, off: int, size: int, expected: int, what: str) -> None:
  _need(blob, off, size, what)
  if (got := checksum(blob[off:off + size])) != expected:
    raise DiscoveryError(f"IP discovery: {what} checksum is 0x{got:04x}, the header says 0x{expected:04x}",
                         "the table in VRAM is corrupt (or not written yet: the GPU's firmware writes it at power-on)")


def parse(blob: bytes | bytearray | memoryview) -> DiscoveryTable:
  """Validate and decode an IP discovery binary (as read from VRAM or amdgpu/ip_discovery.bin)."""
  blob = bytes(blob)
  _need(blob, 0, BINARY_HEADER_SIZE, "binary header")
  if (sig := _u32(blob, 0)) != BINARY_SIGNATURE:
    raise DiscoveryError(f"IP discovery: binary signature is 0x{sig:08x}, expected 0x{BINARY_SIGNATURE:08x}",
                         "no discovery binary at this place (wrong VRAM offset, or the GPU's firmware has not run)")
  vmaj, vmin, bsum, bsize = struct.unpack_from("<HHHH", blob, 4)
  if bsize < BINARY_HEADER_SIZE: raise DiscoveryError(f"IP discovery: binary_size {bsize} is smaller than the header", "corrupt header")
  # the binary checksum covers everything after the checksum field up to binary_size
  _check(blob, 10, bsize - 10, bsum, "binary")
  tables = [struct.unpack_from("<HHHH", blob, 12 + 8 * i)[:3] for i in range(TOTAL_TABLES)]
  present = tuple(TABLE_NAMES[i] for i, (off, _, _) in enumerate(tables) if off)
  off, tsum, _ = tables[IP_DISCOVERY]
  if not off: raise DiscoveryError("IP discovery: the binary has no IP_DISCOVERY table", "corrupt header")
  _need(blob, off, IP_HEADER_SIZE, "ip_discovery_header")
  if (sig := _u32(blob, off)) != DISCOVERY_TABLE_SIGNATURE:
    raise DiscoveryError(f"IP discovery: table signature is 0x{sig:08x}, expected 0x{DISCOVERY_TABLE_SIGNATURE:08x} ('IPDS')", "corrupt table")
  iver, isize, _id, num_dies = struct.unpack_from("<HHIH", blob, off + 4)
  _check(blob, off, isize, tsum, "IP_DISCOVERY table")
  if num_dies > MAX_DIES: raise DiscoveryError(f"IP discovery: {num_dies} dies (at most {MAX_DIES})", "corrupt table")
  wide = iver >= 4 and bool(blob[off + 78] & 1)   # base_addr_64_bit (version 4 tables)
  blocks = []
  for d in range(num_dies):
    die_id, die_off = struct.unpack_from("<HH", blob, off + 14 + 4 * d)
    _need(blob, die_off, DIE_HEADER_SIZE, f"die {d} header")
    hdr_id, num_ips = struct.unpack_from("<HH", blob, die_off)
    if hdr_id != die_id: raise DiscoveryError(f"IP discovery: die {d} header says die {hdr_id}, the die list says {die_id}", "corrupt table")
    p = die_off + DIE_HEADER_SIZE
    for _ in range(num_ips):
      _need(blob, p, IP_ENTRY_SIZE, f"IP entry of die {die_id}")
      hw_id, inst, nbase, major, minor, rev, var = struct.unpack_from("<HBBBBBB", blob, p)
      step = 8 if wide else 4
      _need(blob, p + IP_ENTRY_SIZE, nbase * step, f"base addresses of IP hw_id {hw_id}")
      raw = struct.unpack_from(f"<{nbase}{'Q' if wide else 'I'}", blob, p + IP_ENTRY_SIZE)
      p += IP_ENTRY_SIZE + nbase * step
      if inst >= HWIP_MAX_INSTANCE or hw_id >= HW_ID_MAX: continue   # the driver skips these entries too
      # the driver keeps the low 32 bits of 64-bit bases
      harvested = (var >> 4 if iver >= 3 else var & 0xF) == 1
      blocks.append(IPBlock(hw_id, inst, major, minor, rev, var, tuple(b & 0xFFFFFFFF for b in raw), die_id, harvested))
  gc = None
  goff, gsum, _ = tables[GC]
  if goff:
    _need(blob, goff, GPU_INFO_HEADER_SIZE, "GC table header")
    tid, gmaj, gmin, gsize = struct.unpack_from("<IHHI", blob, goff)
    if tid != GC_TABLE_ID: raise DiscoveryError(f"IP discovery: GC table id is 0x{tid:x}, expected 0x{GC_TABLE_ID:x}", "corrupt table")
    _check(blob, goff, gsize, gsum, "GC table")
    _need(blob, goff, 80, "GC table fields")
    f = struct.unpack_from("<17I", blob, goff + 12)   # offsets 12..76
    if gmaj == 2: gc = GCInfo((gmaj, gmin), f[0], f[11], f[12], f[14], 0, f[1], 0)
    else: gc = GCInfo((gmaj, gmin), f[0], f[11], f[12], f[14], f[16], 0, f[1] + f[2])
  harvest: list[tuple[int, int]] = []
  hoff, hsum, _ = tables[HARVEST_INFO]
  if hoff:
    _need(blob, hoff, HARVEST_TABLE_SIZE, "harvest table")
    if (sig := _u32(blob, hoff)) != HARVEST_TABLE_SIGNATURE:
      raise DiscoveryError(f"IP discovery: harvest table signature is 0x{sig:08x}, expected 0x{HARVEST_TABLE_SIGNATURE:08x}", "corrupt table")
    _check(blob, hoff, HARVEST_TABLE_SIZE, hsum, "harvest table")
    for i in range(32):
      hw_id, inst = struct.unpack_from("<HB", blob, hoff + 8 + 4 * i)
      if hw_id == 0: break
      harvest.append((hw_id, inst))
  return DiscoveryTable((vmaj, vmin), iver, tuple(blocks), gc, tuple(harvest), present)


def build(blocks: list[IPBlock] | tuple[IPBlock, ...], gc: GCInfo | None = None, harvest: tuple[tuple[int, int], ...] = (),
          ip_version: int = 3, wide: bool = False, pad_to: int = DISCOVERY_TMR_SIZE) -> bytes:
  """A valid discovery binary holding `blocks` (one die per distinct IPBlock.die), with correct checksums."""
  dies = sorted({b.die for b in blocks}) or [0]
  out = bytearray(BINARY_HEADER_SIZE)
  table_list = [(0, 0, 0)] * TOTAL_TABLES
  ip_off = len(out)
  out += bytes(IP_HEADER_SIZE)
  die_offs = []
  for d in dies:
    die_offs.append(len(out))
    mine = [b for b in blocks if b.die == d]
    out += struct.pack("<HH", d, len(mine))
    for b in mine:
      out += struct.pack("<HBBBBBB", b.hw_id, b.instance, len(b.bases), b.major, b.minor, b.revision, b.variant)
      out += struct.pack(f"<{len(b.bases)}{'Q' if wide else 'I'}", *b.bases)
  ip_size = len(out) - ip_off
  struct.pack_into("<IHHIH", out, ip_off, DISCOVERY_TABLE_SIGNATURE, ip_version, ip_size, 0, len(dies))
  for i, (d, o) in enumerate(zip(dies, die_offs)): struct.pack_into("<HH", out, ip_off + 14 + 4 * i, d, o)
  if wide: out[ip_off + 78] |= 1
  table_list[IP_DISCOVERY] = (ip_off, checksum(out[ip_off:ip_off + ip_size]), ip_size)
  if gc is not None:
    g_off = len(out)
    f = [0] * 18
    f[0], f[11], f[12], f[14] = gc.num_se, gc.wave_size, gc.max_waves_per_simd, gc.lds_size
    if gc.version[0] == 2: f[1] = gc.num_cu_per_sh
    else: f[1], f[16] = gc.num_wgp_per_sa, gc.num_sa_per_se
    body = struct.pack("<18I", *f)
    out += struct.pack("<IHHI", GC_TABLE_ID, gc.version[0], gc.version[1], GPU_INFO_HEADER_SIZE + len(body)) + body
    table_list[GC] = (g_off, checksum(out[g_off:]), len(out) - g_off)
  if harvest:
    h_off = len(out)
    out += struct.pack("<II", HARVEST_TABLE_SIGNATURE, 0)
    for i in range(32): out += struct.pack("<HBB", *(harvest[i] if i < len(harvest) else (0, 0)), 0)
    table_list[HARVEST_INFO] = (h_off, checksum(out[h_off:]), HARVEST_TABLE_SIZE)
  for i, (o, s, n) in enumerate(table_list): struct.pack_into("<HHHH", out, 12 + 8 * i, o, s, n, 0)
  struct.pack_into("<IHHHH", out, 0, BINARY_SIGNATURE, 2, 0, 0, len(out))
  struct.pack_into("<H", out, 8, checksum(out[10:]))
  return bytes(out) + bytes(max(0, pad_to - len(out)))
