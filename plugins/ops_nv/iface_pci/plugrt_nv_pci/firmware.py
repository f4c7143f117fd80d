"""The GSP firmware files from linux-firmware, found and taken apart: where each lives, and the parts the boot uses.

Files (linux-firmware, nvidia/<chip>/gsp/, version GSP_VERSION; docs/research/nv-pci.md says where each layout comes from):
- gsp-<v>.bin: an ELF64 file; section `.fwimage` is GSP-RM (loaded through a radix-3 page table), `.fwsignature_<fam>x`
  the signature for the chip family (ga10x, ad10x, gb20x).
- bootloader-<v>.bin: an nvfw_bin_hdr (magic 0x10de) whose header is an RM_RISCV_UCODE_DESC (the monitor's code, data
  and manifest offsets) and whose data is the RISC-V bootloader image.
- booter_load-<v>.bin (GA10x, AD10x): an nvfw_bin_hdr whose header is an nvfw_hs_header_v2 (signatures, where to patch
  one in) followed by an nvfw_hs_load_header_v2 (the OS code/data offsets and the app's code), run on SEC2 in heavy-secure mode.
- fmc-<v>.bin (GB20x): an ELF32 file with sections `hash`, `signature`, `publickey`, `image` (NVIDIA's
  nouveau/extract-firmware-nouveau.py, fmc()): the GSP FMC image the FSP boots, its SHA-384 hash, signature and key.

A missing file is a MissingFirmware naming it; a file of the wrong shape a FirmwareError. Compressed copies (.xz,
as the kernel's loader accepts) are read too.
"""
from __future__ import annotations

import ctypes
import lzma
import os
import struct
from dataclasses import dataclass

from plugrt_nv_pci.chips import GSP_VERSION, Chip
from plugrt_nv_pci.errors import FirmwareError, MissingFirmware

FIRMWARE_ROOT = "/lib/firmware"
BIN_MAGIC = 0x10DE


def path_of(root: str, chip: Chip, name: str) -> str: return os.path.join(root, chip.firmware_dir, f"{name}-{GSP_VERSION}.bin")


def read_file(root: str, chip: Chip, name: str, what: str) -> bytes:
  """The bytes of nvidia/<chip>/gsp/<name>-<version>.bin under `root` (or its .xz copy); MissingFirmware otherwise."""
  path = path_of(root, chip, name)
  try:
    with open(path, "rb") as f: return f.read()
  except FileNotFoundError: pass
  except OSError as e: raise FirmwareError(f"{path}: cannot be read: {e}") from None
  try:
    with open(path + ".xz", "rb") as f: return lzma.decompress(f.read())
  except FileNotFoundError: raise MissingFirmware(path, what) from None
  except (OSError, lzma.LZMAError) as e: raise FirmwareError(f"{path}.xz: cannot be read: {e}") from None


def needed(chip: Chip) -> list[tuple[str, str]]:
  """(file name, what it is) of every file the chip's boot loads, in the order the boot reads them."""
  files = [("gsp", "the GSP-RM firmware"), ("bootloader", "the GSP's RISC-V bootloader")]
  booter = chip.generation.boot == "booter"
  files += [("booter_load", "the booter (SEC2 heavy-secure loader)")] if booter else [("fmc", "the GSP FMC (booted by the FSP)")]
  return files


def elf_sections(data: bytes, path: str) -> dict[str, bytes]:
  """Section name -> contents of a little-endian ELF file, 64-bit (gsp-<v>.bin) or 32-bit (fmc-<v>.bin, as NVIDIA's
  extract-firmware-nouveau.py writes it), by the System V gABI layout."""
  if data[:4] != b"\x7fELF" or data[4] not in (1, 2) or data[5] != 1: raise FirmwareError(f"{path} is not a little-endian ELF file")
  wide = data[4] == 2
  try:
    shoff, = struct.unpack_from("<Q" if wide else "<I", data, 0x28 if wide else 0x20)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A if wide else 0x2E)
    entry = "<IIQQQQ" if wide else "<IIIIII"   # name, type, flags, address, offset, size
    heads = [struct.unpack_from(entry, data, shoff + i * shentsize) for i in range(shnum)]
    _, _, _, _, stroff, strsize = heads[shstrndx]
    names = data[stroff:stroff + strsize]
    out = {}
    for name_off, typ, _, _, off, size in heads:
      name = names[name_off:names.index(b"\0", name_off)].decode()
      out[name] = b"" if typ == 8 else data[off:off + size]  # SHT_NOBITS holds nothing in the file
      if typ != 8 and off + size > len(data): raise FirmwareError(f"{path}: section {name} runs past the end of the file")
  except (struct.error, IndexError, ValueError, UnicodeDecodeError) as e:
    raise FirmwareError(f"{path}: its ELF section table cannot be read ({e})") from None
  return out


def section(sections: dict[str, bytes], name: str, path: str) -> bytes:
  if name not in sections: raise FirmwareError(f"{path} has no section {name} (it has {', '.join(s for s in sections if s)})")
  return sections[name]


u32 = ctypes.c_uint32


class BinHeader(ctypes.LittleEndianStructure):
  """nvfw_bin_hdr (nouveau's include/nvfw/fw.h): the wrapper of the booter and bootloader files."""
  _fields_ = [("bin_magic", u32), ("bin_ver", u32), ("bin_size", u32), ("header_offset", u32), ("data_offset", u32), ("data_size", u32)]


class HSHeaderV2(ctypes.LittleEndianStructure):
  """nvfw_hs_header_v2 (nouveau's include/nvfw/hs.h): where the signatures are and where one goes in the image."""
  _fields_ = [("sig_prod_offset", u32), ("sig_prod_size", u32), ("patch_loc", u32), ("patch_sig", u32), ("meta_data_offset", u32),
              ("meta_data_size", u32), ("num_sig", u32), ("header_offset", u32), ("header_size", u32)]


class HSLoadHeaderV2(ctypes.LittleEndianStructure):
  """nvfw_hs_load_header_v2 (include/nvfw/hs.h), followed by num_apps (offset, size) pairs."""
  _fields_ = [("os_code_offset", u32), ("os_code_size", u32), ("os_data_offset", u32), ("os_data_size", u32), ("num_apps", u32)]


class RiscvUcodeDesc(ctypes.LittleEndianStructure):
  """RM_RISCV_UCODE_DESC (open-gpu-kernel-modules src/nvidia/arch/nvalloc/common/inc/rmRiscvUcode.h, 570.144)."""
  _fields_ = [(n, u32) for n in ("version", "bootloaderOffset", "bootloaderSize", "bootloaderParamOffset", "bootloaderParamSize",
                                 "riscvElfOffset", "riscvElfSize", "appVersion", "manifestOffset", "manifestSize", "monitorDataOffset",
                                 "monitorDataSize", "monitorCodeOffset", "monitorCodeSize", "bIsMonitorEnabled", "swbromCodeOffset",
                                 "swbromCodeSize", "swbromDataOffset", "swbromDataSize", "fbReservedSize", "bSignedAsCode")]


def _struct(cls: type, data: bytes, off: int, path: str, what: str) -> ctypes.Structure:
  if off < 0 or off + ctypes.sizeof(cls) > len(data): raise FirmwareError(f"{path}: its {what} at {off:#x} runs past the end of the file")
  return cls.from_buffer_copy(data, off)


def bin_file(data: bytes, path: str) -> tuple[BinHeader, bytes]:
  """The nvfw_bin_hdr and the image it wraps."""
  h = _struct(BinHeader, data, 0, path, "header")
  if h.bin_magic != BIN_MAGIC:
    raise FirmwareError(f"{path} does not start with NVIDIA's firmware header (magic {h.bin_magic:#x}, want {BIN_MAGIC:#x})")
  if h.data_offset + h.data_size > len(data): raise FirmwareError(f"{path}: its image ({h.data_size} bytes at {h.data_offset:#x}) runs past the end")
  return h, data[h.data_offset:h.data_offset + h.data_size]


@dataclass
class Booter:
  """booter_load: the image with its production signature patched in, and where its parts are (for the falcon's DMA)."""
  image: bytes
  code_offset: int     # the app's code (IMEM, secure)
  code_size: int
  data_offset: int     # the OS data (DMEM)
  data_size: int


def booter(data: bytes, path: str) -> Booter:
  h, image = bin_file(data, path)
  hs = _struct(HSHeaderV2, data, h.header_offset, path, "HS header")
  load = _struct(HSLoadHeaderV2, data, hs.header_offset, path, "HS load header")
  if load.num_apps < 1: raise FirmwareError(f"{path}: its HS load header lists no application")
  app_off, app_size = struct.unpack_from("<II", data, hs.header_offset + ctypes.sizeof(HSLoadHeaderV2))
  try:
    patch_loc, = struct.unpack_from("<I", data, hs.patch_loc)
    patch_sig, = struct.unpack_from("<I", data, hs.patch_sig)
    num_sig, = struct.unpack_from("<I", data, hs.num_sig)
  except struct.error: raise FirmwareError(f"{path}: its signature patch locations run past the end of the file") from None
  if not num_sig: raise FirmwareError(f"{path}: it carries no signature")
  size = hs.sig_prod_size // num_sig
  start = hs.sig_prod_offset + patch_sig
  sig = data[start:start + size]
  if len(sig) != size or patch_loc + size > len(image): raise FirmwareError(f"{path}: its production signature does not fit where it is patched")
  patched = bytearray(image)
  patched[patch_loc:patch_loc + size] = sig
  return Booter(bytes(patched), app_off, app_size, load.os_data_offset, load.os_data_size)


def bootloader(data: bytes, path: str) -> tuple[RiscvUcodeDesc, bytes]:
  h, image = bin_file(data, path)
  return _struct(RiscvUcodeDesc, data, h.header_offset, path, "RISC-V ucode descriptor"), image  # type: ignore[return-value]


@dataclass
class Fmc:
  """The GSP FMC (GB20x): its image, and what the COT message carries to the FSP about it."""
  image: bytes
  hash384: bytes
  signature: bytes
  public_key: bytes


def fmc(data: bytes, path: str, sizes: dict[str, int]) -> Fmc:
  """fmc-<v>.bin taken apart; `sizes` (section -> bytes) are what the FSP takes, a section of another size a FirmwareError."""
  sections = elf_sections(data, path)
  parts = {name: section(sections, name, path) for name in ("image", "hash", "signature", "publickey")}
  for name, n in sizes.items():
    if len(parts[name]) != n: raise FirmwareError(f"{path}: its {name} is {len(parts[name])} bytes, the FSP takes {n}")
  if not parts["image"]: raise FirmwareError(f"{path}: its image section is empty")
  return Fmc(parts["image"], parts["hash"], parts["signature"], parts["publickey"])
