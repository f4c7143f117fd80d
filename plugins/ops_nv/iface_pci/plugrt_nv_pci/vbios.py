"""FWSEC from the GPU's VBIOS, prepared for the FRTS command (docs/research/nv-pci.md, section 4, step 8).

The VBIOS is read through the PROM window of BAR0 (NV_PROM_DATA(i) = 0x300000 + i), 32 bits at a time as the
driver reads it. Its PCI expansion-ROM images (0xAA55, a "PCIR" data structure at the offset stored at 0x18: image
length in 512-byte blocks at +0x10, code type at +0x14, last-image flag at +0x15) are walked to find the base image
(code type 0x00) and the extended image (0xE0); offsets in the falcon tables count from the extended image minus the
base image's length. The base image's BIT header (id 0xB8FF, "BIT\\0") lists tokens; BIT_TOKEN_FALCON_DATA (0x70,
version 2) points at the falcon ucode table, whose FWSEC_PROD entry (application id 0x85) points at a
FALCON_UCODE_DESC_V3 followed by its RSA-3K signatures and the ucode image. Sources: OGKM 570.144
kernel_gsp_fwsec.c (BIT and falcon table structs, s_vbiosFillFlcnUcodeFromDescV3), arch/turing/kernel_gsp_vbios_tu102.c
(ROM images), src/nvidia/inc/kernel/platform/pci_exp_table.h, arch/turing/kernel_gsp_frts_tu102.c (the DMEM mapper,
the FRTS command, the signature choice by fuse version).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Protocol

from plugrt_nv_pci.errors import GSPError

PROM, PROM_SIZE = 0x300000, 0x100000
ROM_SIGNATURE, PCIR = 0xAA55, 0x52494350
CODE_BASE, CODE_EXTENDED = 0x00, 0xE0
BIT_ID, BIT_SIGNATURE = 0xB8FF, 0x00544942
TOKEN_FALCON_DATA, APP_FWSEC_PROD = 0x70, 0x85
DESC_V3 = struct.Struct("<IIIIIIIIIHBBHH")  # vDesc StoredSize PKCDataOffset InterfaceOffset IMEMPhysBase IMEMLoadSize IMEMVirtBase DMEMPhysBase
                                            # DMEMLoadSize EngineIdMask UcodeId SignatureCount SignatureVersions Reserved (44 bytes)
SIG_SIZE = 384                              # BCRT30_RSA3K_SIG_SIZE
DMEMMAPPER, CMD_FRTS = 0x4, 0x15            # FALCON_APPLICATION_INTERFACE_ENTRY_ID_DMEMMAPPER, ..._DMEM_MAPPER_V3_CMD_FRTS
MAPPER_CMD_IN_OFFSET, MAPPER_CMD_IN_SIZE, MAPPER_INIT_CMD = 8, 12, 44  # field offsets in FALCON_APPLICATION_INTERFACE_DMEM_MAPPER_V3
FRTS_SIZE_4K, MEDIA_FB, READ_VBIOS_FLAGS = 0x100, 2, 2
FUSE_GSP_UCODE1_VERSION = 0x8241C0          # NV_FUSE_OPT_FPF_GSP_UCODE1_VERSION (ampere/ga100/dev_fuse.h), one register per ucode id
VBIOS_SCRATCH_0E = 0x1400 + 0x0E * 4        # NV_PBUS_VBIOS_SCRATCH(0x0E): FWSEC's FRTS error code in 31:16


class Reader(Protocol):
  def read32(self, offset: int) -> int: ...


class ROM:
  """The VBIOS through the PROM window, read in 32-bit words and cached by 4 KiB page."""

  def __init__(self, regs: Reader):
    self.regs, self.pages = regs, {}

  def read(self, off: int, n: int) -> bytes:
    if off < 0 or off + n > PROM_SIZE: raise GSPError(f"the VBIOS tables point outside the 1 MiB ROM window ({off:#x}+{n})", step="reading the VBIOS")
    out = b""
    while len(out) < n:
      page, at = divmod(off + len(out), 0x1000)
      if page not in self.pages:
        self.pages[page] = struct.pack("<1024I", *(self.regs.read32(PROM + page * 0x1000 + 4 * i) for i in range(1024)))
      out += self.pages[page][at:at + n - len(out)]
    return out

  def u8(self, off: int) -> int: return self.read(off, 1)[0]
  def u16(self, off: int) -> int: return struct.unpack("<H", self.read(off, 2))[0]
  def u32(self, off: int) -> int: return struct.unpack("<I", self.read(off, 4))[0]


@dataclass
class FWSEC:
  image: bytearray     # code (IMEMLoadSize bytes) then data (DMEMLoadSize), StoredSize rounded up to 256
  imem_pa: int
  imem_va: int
  imem_size: int
  dmem_pa: int
  dmem_size: int
  pkc_offset: int
  engine_mask: int
  ucode_id: int
  signatures: list[bytes]
  signature_versions: int
  interface_offset: int


def bad(what: str) -> GSPError: return GSPError(f"the VBIOS's FWSEC tables are not readable: {what}", "this GPU's VBIOS is not one plugrt knows",
                                                step="reading FWSEC from the VBIOS")


def find_fwsec(regs: Reader) -> FWSEC:
  rom = ROM(regs)
  off, base_size, ext = 0, 0, None
  for _ in range(16):
    if rom.u16(off) != ROM_SIGNATURE: raise bad(f"no expansion-ROM signature at {off:#x}")
    pcir = off + rom.u16(off + 0x18)
    if rom.u32(pcir) != PCIR: raise bad(f"no PCIR structure at {pcir:#x}")
    length, code, last = rom.u16(pcir + 0x10) * 512, rom.u8(pcir + 0x14), rom.u8(pcir + 0x15) & 0x80
    if code == CODE_BASE: base_size = length
    elif code == CODE_EXTENDED:
      ext = off - base_size
      break
    if last or not length: break
    off += length
  if ext is None: raise bad("no extended image (code type 0xE0)")
  head = rom.read(0, base_size or 0x10000)
  at = head.find(struct.pack("<HI", BIT_ID, BIT_SIGNATURE))
  if at < 0: raise bad("no BIT header")
  _, _, _, hsize, tsize, count, _ = struct.unpack_from("<HIHBBBB", head, at)
  table = None
  for i in range(count):
    token, version, _, ptr = struct.unpack("<BBHI", rom.read(at + hsize + i * tsize, 8))
    if token == TOKEN_FALCON_DATA and version == 2: table = ext + rom.u32(ptr & 0xFFFF)
  if table is None: raise bad("no falcon data token (0x70, version 2) in the BIT")
  _, thsize, esize, ecount, _, _ = struct.unpack("<6B", rom.read(table, 6))
  for j in range(ecount):
    app, _, desc_ptr = struct.unpack("<BBI", rom.read(table + thsize + j * esize, 6))
    if app != APP_FWSEC_PROD: continue
    desc = ext + desc_ptr
    vdesc = rom.u32(desc)
    if vdesc >> 8 & 0xFF != 3: raise bad(f"FWSEC's descriptor is version {vdesc >> 8 & 0xFF}, plugrt reads version 3")
    size = vdesc >> 16
    (_, stored, pkc, iface, ipa, isize, iva, dpa, dsize, engines, ucode, nsig, sigvers, _) = DESC_V3.unpack(rom.read(desc, DESC_V3.size))
    sigs = rom.read(desc + DESC_V3.size, size - DESC_V3.size)
    if len(sigs) < nsig * SIG_SIZE: raise bad(f"FWSEC's descriptor holds {len(sigs)} bytes for {nsig} signatures")
    image = bytearray(rom.read(desc + size, -(-stored // 256) * 256))
    if isize + dsize > len(image) or pkc + SIG_SIZE > dsize: raise bad("FWSEC's code and data do not fit its stored image")
    return FWSEC(image, ipa, iva, isize, dpa, dsize, pkc, engines, ucode, [sigs[i * SIG_SIZE:(i + 1) * SIG_SIZE] for i in range(nsig)],
                 sigvers, iface)
  raise bad("no FWSEC_PROD entry (application 0x85) in the falcon ucode table")


def frts_command(frts_offset: int) -> bytes:
  """FWSECLIC_FRTS_CMD: FWSECLIC_READ_VBIOS_DESC {version 1, size 24, gfwImageOffset 0, gfwImageSize 0, flags 2} and
  FWSECLIC_FRTS_REGION_DESC {version 1, size 20, offset in 4 KiB, size 0x100 (1 MiB), media FB}."""
  return struct.pack("<IIQII", 1, 24, 0, 0, READ_VBIOS_FLAGS) + struct.pack("<5I", 1, 20, frts_offset >> 12, FRTS_SIZE_4K, MEDIA_FB)


def signature_for(fw: FWSEC, fuse: int) -> bytes:
  """The signature for the ucode version the fuses hold (kgspReadUcodeFuseVersion_GA100: highest set bit + 1, or 0):
  the signatures are stored for the versions set in SignatureVersions, lowest first."""
  version = fuse.bit_length()
  want = 1 << version
  if not fw.signature_versions & want:
    raise GSPError(f"the VBIOS's FWSEC has no signature for ucode version {version} (it has {fw.signature_versions:#x})", step="preparing FWSEC")
  index = bin(fw.signature_versions & (want - 1)).count("1")
  if index >= len(fw.signatures): raise bad(f"signature {index} of {len(fw.signatures)}")
  return fw.signatures[index]


def patch_frts(fw: FWSEC, frts_offset: int, signature: bytes) -> bytes:
  """The image with the DMEM mapper's init command set to FRTS, the command in its input buffer, and the signature in
  place (s_vbiosPatchInterfaceData, kgspPrepareForFwsecFrts)."""
  img = bytearray(fw.image)
  data = fw.imem_size
  _, _, _, count = struct.unpack_from("<4B", img, data + fw.interface_offset)
  if count < 2: raise bad(f"FWSEC's application interface lists {count} entries")
  mapper = None
  for i in range(count):
    ident, dmem = struct.unpack_from("<II", img, data + fw.interface_offset + 4 + 8 * i)
    if ident == DMEMMAPPER: mapper = data + dmem
  if mapper is None: raise bad("FWSEC's application interface has no DMEM mapper")
  cmd = frts_command(frts_offset)
  cmd_off, cmd_size = struct.unpack_from("<II", img, mapper + MAPPER_CMD_IN_OFFSET)
  if cmd_size < len(cmd) or cmd_off + len(cmd) > fw.dmem_size: raise bad(f"FWSEC's command buffer ({cmd_size} bytes at {cmd_off:#x}) is too small")
  struct.pack_into("<I", img, mapper + MAPPER_INIT_CMD, CMD_FRTS)
  img[data + cmd_off:data + cmd_off + len(cmd)] = cmd
  img[data + fw.pkc_offset:data + fw.pkc_offset + SIG_SIZE] = signature
  return bytes(img)
