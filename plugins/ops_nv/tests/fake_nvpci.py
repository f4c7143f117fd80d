"""Fakes below plugrt-nv-pci: a sysfs tree with NVIDIA functions, linux-firmware's GSP files, host memory with bus
addresses (FakeDMA), and a GPU behind BAR0 (FakeBAR0) whose falcons, SEC2 booter and GSP check the boot step by step.

The files are built from the layouts docs/research/nv-pci.md records (ELF64 sections, nvfw_bin_hdr, nvfw_hs_header_v2,
RM_RISCV_UCODE_DESC); their contents are made up (no NVIDIA code). The GPU model answers what plugrt_nv_pci.boot
touches: NV_PMC_BOOT_42, the GFW-boot scratch registers, WPR2, the usable VRAM size, the GSP's and SEC2's falcon
registers (reset and scrubbing, core select, DMA into IMEM/DMEM from VRAM, the boot ROM's parameters, start, halt,
mailboxes). SEC2 "runs" booter_load: it checks that IMEM and DMEM hold the booter's code and data from the file, that
the boot ROM got the signature parameters, that the GSP was reset into RISC-V with the LibOS arguments in its
mailboxes, and that the WPR metadata its mailboxes point at is whole (magic, the radix-3 table resolving to the GSP
image, the signature, the bootloader, a layout inside VRAM); anything wrong sets mailbox 0 to BOOTER_FAILED and is
listed in `violations`. Then a FakeGSP thread reads its arguments through the bus addresses (the queues through their
page table), sets up its status queue, sends a CPU-sequencer request and GSP_INIT_DONE, and answers RPCs."""
from __future__ import annotations

import ctypes
import itertools
import os
import random
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

from fake_gpu import FakeEngine
from fake_vfio import read_pages

from plugrt_nv.iface import Channel
from plugrt_nv_nvk import rm
from plugrt_nv_pci import boot, falcon, firmware, mmu, msgq, rpc, vbios
from plugrt_nv_pci import gpu as gpu_pci
from plugrt_nv_pci.chips import GSP_VERSION
from plugrt_nv_pci.dma import PAGE, DMABuffer

BOOTER_FAILED = 0xBAD0
AMPERE, ADA, BLACKWELL, HOPPER = (0x2204, 0x17 << 24 | 2 << 20), (0x2684, 0x19 << 24 | 2 << 20), (0x2B85, 0x1B << 24 | 2 << 20), (0x2335, 0x18 << 24)
VRAM_MIB = 512


# ---- sysfs -----------------------------------------------------------------------------------------------------------

def make_sysfs(root: str, gpus: list[tuple[str, int, str]]) -> tuple[str, str]:
  """A fake /sys/bus/pci tree: (devices dir, drivers dir); gpus = [(address, device id, bound driver or "")]. Each
  function has vendor, device, class, enable, resource (BAR0 16 MiB, BAR1 256 MiB) and empty resource files."""
  devices, drivers = os.path.join(root, "devices"), os.path.join(root, "drivers")
  os.makedirs(devices)
  for drv in {"nvidia", "nouveau"}:
    os.makedirs(os.path.join(drivers, drv))
    for n in ("bind", "unbind"): open(os.path.join(drivers, drv, n), "w").close()
  for address, device, driver in gpus:
    d = os.path.join(devices, address)
    os.makedirs(d)
    for n, v in (("vendor", "0x10de"), ("device", f"0x{device:04x}"), ("class", "0x030000"), ("enable", "0")):
      with open(os.path.join(d, n), "w") as f: f.write(v + "\n")
    lines = [(0xF2000000, 0xF2FFFFFF, 0x40200), (0xE0000000, 0xEFFFFFFF, 0x14220C), (0, 0, 0), (0xF0000000, 0xF1FFFFFF, 0x14220C)] + [(0, 0, 0)] * 9
    with open(os.path.join(d, "resource"), "w") as f: f.write("".join(f"0x{a:016x} 0x{b:016x} 0x{c:016x}\n" for a, b, c in lines))
    for i in (0, 1, 3): open(os.path.join(d, f"resource{i}"), "wb").close()
    config = bytearray(256)  # vendor, device; command 0 (bus mastering off); revision 0xa1; subsystem vendor and id
    struct.pack_into("<HHH", config, 0, 0x10DE, device, 0)
    config[8] = 0xA1
    struct.pack_into("<HH", config, 0x2C, 0x1458, 0x4000 | device & 0xFF)
    with open(os.path.join(d, "config"), "wb") as f: f.write(bytes(config))
    if driver: os.symlink(os.path.join("..", "..", "drivers", driver), os.path.join(d, "driver"))
  # an AMD GPU beside them, which the NV probe must not list
  d = os.path.join(devices, "0000:09:00.0")
  os.makedirs(d)
  for n, v in (("vendor", "0x1002"), ("device", "0x744c"), ("class", "0x030000")):
    with open(os.path.join(d, n), "w") as f: f.write(v + "\n")
  return devices, drivers


class KernelWrites:
  """The kernel's part for writes into the fake tree: unbind removes the driver link, bind puts it back."""

  def __init__(self, devices: str, refuse_unbind: bool = False):
    self.devices, self.refuse_unbind = devices, refuse_unbind
    self.log: list[tuple[str, str]] = []
    self.watch: Callable[[str], None] | None = None   # sees each write first (the fake VFIO checks unbinds)

  def __call__(self, path: str, text: str) -> None:
    self.log.append((os.path.relpath(path, os.path.dirname(self.devices)), text))
    if self.watch is not None: self.watch(path)
    if path.endswith("/driver/unbind"):
      if not self.refuse_unbind: os.unlink(os.path.join(self.devices, text, "driver"))
    elif path.endswith("/bind"):
      os.symlink(os.path.join("..", "..", "drivers", os.path.basename(os.path.dirname(path))), os.path.join(self.devices, text, "driver"))
    else:
      with open(path, "w") as f: f.write(text)


# ---- firmware files --------------------------------------------------------------------------------------------------

def elf(sections: dict[str, bytes]) -> bytes:
  """A minimal little-endian ELF64 file with these sections (and the section-name table)."""
  names = b"\0" + b"".join(n.encode() + b"\0" for n in sections) + b".shstrtab\0"
  body, heads, pos, off = bytearray(), [bytes(64)], 64, 1
  for n, data in sections.items():
    heads.append(struct.pack("<IIQQQQIIQQ", off, 1, 0, 0, pos + len(body), len(data), 0, 0, 1, 0))
    body += data
    off += len(n) + 1
  heads.append(struct.pack("<IIQQQQIIQQ", off, 3, 0, 0, pos + len(body), len(names), 0, 0, 1, 0))
  body += names
  shoff = pos + len(body)
  head = bytearray(64)
  head[:6] = b"\x7fELF\x02\x01"
  struct.pack_into("<Q", head, 0x28, shoff)
  struct.pack_into("<HHH", head, 0x3A, 64, len(heads), len(heads) - 1)
  return bytes(head + body) + b"".join(heads)


def bin_file(header: bytes, image: bytes) -> bytes:
  """nvfw_bin_hdr, then its header at 0x18, then the image (aligned to 256)."""
  data_off = -(-(24 + len(header)) // 256) * 256
  out = bytearray(struct.pack("<6I", firmware.BIN_MAGIC, 1, data_off + len(image), 24, data_off, len(image)))
  out += header
  out += bytes(data_off - len(out)) + image
  return bytes(out)


class FakeFirmware:
  """linux-firmware's files for `chip` ("ga102", "ad102"; fake_nvpci_gb.FakeFirmwareGB adds GB202's FMC) under
  `root`/nvidia/<chip>/gsp/, with made-up contents."""

  def __init__(self, root: str, chip: str, image_pages: int = 600):
    rnd = random.Random(chip)
    self.root, self.chip = root, chip
    self.gsp_image = bytes(rnd.getrandbits(8) for _ in range(image_pages * PAGE - 123))
    self.signatures = {f".fwsignature_{c}": bytes(rnd.getrandbits(8) for _ in range(0x1000)) for c in ("ga10x", "ad10x", "gb20x")}
    self.bootloader = bytes(rnd.getrandbits(8) for _ in range(0x3000))
    self.desc = firmware.RiscvUcodeDesc(version=4, monitorCodeOffset=0x1000, monitorDataOffset=0x2000, manifestOffset=0x2800)
    # booter_load: the OS data at 0x200 of the image, the app's code at 0x1000; two signatures in the file, of which the
    # patch words pick the second, to be patched in at 0x40 of the image
    self.booter_code = bytes(rnd.getrandbits(8) for _ in range(0x800))
    self.booter_data = bytes(rnd.getrandbits(8) for _ in range(0x300))
    self.booter_sig = bytes(rnd.getrandbits(8) for _ in range(0x180))
    image = bytearray(0x1000 + len(self.booter_code))
    image[0x200:0x200 + len(self.booter_data)] = self.booter_data
    image[0x1000:] = self.booter_code
    hs_at, load_at, words_at, sigs_at = 24, 60, 88, 100
    hs = struct.pack("<9I", sigs_at, 2 * len(self.booter_sig), words_at, words_at + 4, 0, 0, words_at + 8, load_at, 28)
    load = struct.pack("<5I", 0, 0x200, 0x200, len(self.booter_data), 1) + struct.pack("<II", 0x1000, len(self.booter_code))
    words = struct.pack("<III", 0x40, len(self.booter_sig), 2)
    header = hs + load + words + bytes(len(self.booter_sig)) + self.booter_sig
    assert 24 + len(hs) == load_at and load_at + len(load) == words_at and hs_at == 24
    booter = bin_file(header, bytes(image))
    self.booter_image = bytearray(image)
    self.booter_image[0x40:0x40 + len(self.booter_sig)] = self.booter_sig
    self.files = {"gsp": elf({".fwimage": self.gsp_image, **self.signatures, ".fwversion": GSP_VERSION.encode()}),
                  "bootloader": bin_file(bytes(self.desc), self.bootloader), "booter_load": booter}
    d = os.path.join(root, "nvidia", chip, "gsp")
    os.makedirs(d, exist_ok=True)
    for name, data in self.files.items():
      with open(os.path.join(d, f"{name}-{GSP_VERSION}.bin"), "wb") as f: f.write(data)


# ---- host memory with bus addresses ----------------------------------------------------------------------------------

class FakeDMA:
  """Host memory whose pages get bus addresses in a scattered order unless asked `contiguous` (so nothing may assume
  them consecutive otherwise: the fake GPU reads a range where the hardware does); the fake
  GPU reads and writes host memory only through `resolve(bus)`."""
  BASE = 0x4_0000_0000

  def __init__(self, seed: int = 7):
    self.rnd = random.Random(seed)
    self.page_of: dict[int, int] = {}  # bus page -> CPU address
    self.buffers: list[Any] = []
    self.placed: dict[int, int] = {}   # buffers placed at an address: CPU address -> size
    self.next = 0

  def alloc(self, size: int, contiguous: bool = False, at: int | None = None) -> DMABuffer:
    size = -(-max(size, 1) // PAGE) * PAGE
    if at is None:
      buf = (ctypes.c_char * size)()
      self.buffers.append(buf)
      cpu = ctypes.addressof(buf)
    else:  # at the address the GPU will use too: anonymous pages placed there, as PagemapDMA places them
      from plugrt.hwqueue import libc
      cpu = libc().mmap(at, size, 3, 0x02 | 0x20 | 0x100000, -1, 0)  # MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE
      if cpu != at:
        if cpu not in (None, ctypes.c_void_p(-1).value): libc().munmap(cpu, size)
        raise FileExistsError(f"{at:#x} is already mapped in this process")
      self.placed[cpu] = size
    slots = list(range(self.next, self.next + size // PAGE + 8))
    if not contiguous: self.rnd.shuffle(slots)
    self.next += size // PAGE + 8
    pages = [self.BASE + s * PAGE for s in slots[:size // PAGE]]
    for i, p in enumerate(pages): self.page_of[p] = cpu + i * PAGE
    return DMABuffer(cpu, size, pages)

  def free(self, buf: DMABuffer) -> None:
    """The buffer's bus pages are gone (the fake GPU's access faults) and placed memory is unmapped."""
    for p in buf.pages: self.page_of.pop(p, None)
    if (size := self.placed.pop(buf.cpu, 0)):
      from plugrt.hwqueue import libc
      libc().munmap(buf.cpu, size)

  def resolve(self, bus: int) -> int:
    if bus & ~(PAGE - 1) not in self.page_of: raise KeyError(f"no host page at bus address {bus:#x}")
    return self.page_of[bus & ~(PAGE - 1)] + bus % PAGE

  def read(self, bus: int, n: int) -> bytes: return read_pages(self.resolve, bus, n)

  def close(self) -> None: pass


# ---- the VBIOS --------------------------------------------------------------------------------------------------------

class FakeVBIOS:
  """A VBIOS laid out as docs/research/nv-pci.md describes: a base image (with the BIT header and its falcon-data
  token), an EFI-like image, and the extended image holding the falcon ucode table and FWSEC (descriptor v3, two
  signatures for ucode versions 1 and 3, code, and data with an application interface whose DMEM mapper has a command
  buffer). `fuse` is the ucode-version fuse value that selects the second signature."""
  BASE, EFI, EXT = 0x2000, 0x1000, 0x3000          # image sizes; the extended image starts at BASE + EFI
  IMEM_PA, IMEM_VA, ISIZE, DPA, DSIZE = 0, 0x100, 0x400, 0, 0x400
  IFACE, MAPPER, CMD_IN, PKC = 0x20, 0x80, 0x200, 0x280
  UCODE_ID, ENGINES, SIG_VERSIONS, FUSE = 2, 0x4, 0b1010, 0b100

  def __init__(self, seed: int = 3):
    rnd = random.Random(seed)
    rom = bytearray(self.BASE + self.EFI + self.EXT)
    for at, size, code, last in ((0, self.BASE, 0x00, 0), (self.BASE, self.EFI, 0x03, 0), (self.BASE + self.EFI, self.EXT, 0xE0, 0x80)):
      struct.pack_into("<H", rom, at, 0xAA55)
      struct.pack_into("<H", rom, at + 0x18, 0x40)
      struct.pack_into("<I", rom, at + 0x40, vbios.PCIR)
      struct.pack_into("<HHBB", rom, at + 0x40 + 0x10, size // 512, 0, code, last)  # image length, code revision, code type, indicator
    ext = self.BASE + self.EFI - self.BASE           # what the falcon tables' pointers count from
    struct.pack_into("<HIHBBBB", rom, 0x1B0, 0xB8FF, vbios.BIT_SIGNATURE, 0x100, 12, 8, 2, 0)
    struct.pack_into("<BBHI", rom, 0x1B0 + 12, 0x42, 2, 8, 0x280)                      # another token first
    struct.pack_into("<BBHI", rom, 0x1B0 + 20, vbios.TOKEN_FALCON_DATA, 2, 4, 0x300)
    table = self.BASE + self.EFI + 0x100
    struct.pack_into("<I", rom, 0x300, table - ext)
    desc = table + 0x40
    struct.pack_into("<6B", rom, table, 1, 6, 6, 2, 3, 0)
    struct.pack_into("<BBI", rom, table + 6, 0x05, 0, 0)                                # another application first
    struct.pack_into("<BBI", rom, table + 12, vbios.APP_FWSEC_PROD, 0, desc - ext)
    self.signatures = [bytes(rnd.getrandbits(8) for _ in range(vbios.SIG_SIZE)) for _ in range(2)]
    size = vbios.DESC_V3.size + 2 * vbios.SIG_SIZE
    stored = self.ISIZE + self.DSIZE
    rom[desc:desc + vbios.DESC_V3.size] = vbios.DESC_V3.pack(3 << 8 | size << 16 | 1, stored, self.PKC, self.IFACE, self.IMEM_PA, self.ISIZE,
                                                             self.IMEM_VA, self.DPA, self.DSIZE, self.ENGINES, self.UCODE_ID, 2, self.SIG_VERSIONS, 0)
    rom[desc + vbios.DESC_V3.size:desc + size] = b"".join(self.signatures)
    self.code = bytes(rnd.getrandbits(8) for _ in range(self.ISIZE))
    data = bytearray(rnd.getrandbits(8) for _ in range(self.DSIZE))
    struct.pack_into("<4B", data, self.IFACE, 1, 4, 8, 2)
    struct.pack_into("<IIII", data, self.IFACE + 4, 3, 0x40, vbios.DMEMMAPPER, self.MAPPER)
    struct.pack_into("<II", data, self.MAPPER + 8, self.CMD_IN, 0x80)
    self.data = bytes(data)
    rom[desc + size:desc + size + stored] = self.code + self.data
    self.rom = bytes(rom)

  def patched_data(self, frts_offset: int) -> bytes:
    """What DMEM must hold when FWSEC starts: FRTS as the init command, the command, the second signature."""
    d = bytearray(self.data)
    struct.pack_into("<I", d, self.MAPPER + 44, 0x15)
    d[self.CMD_IN:self.CMD_IN + 44] = struct.pack("<IIQII", 1, 24, 0, 0, 2) + struct.pack("<5I", 1, 20, frts_offset >> 12, 0x100, 2)
    d[self.PKC:self.PKC + vbios.SIG_SIZE] = self.signatures[1]
    return bytes(d)


# ---- the GPU -----------------------------------------------------------------------------------------------------------

class FakeVRAM:
  """VRAM behind BAR1, which covers all of it (a GPU with a resized BAR): a memory file (sparse: pages exist once
  touched), read and written by offset, and mapped into the process at a fixed address by `map_at`, as a BAR's
  resource file maps, so the CPU's stores through such a mapping land in the VRAM the fake GPU reads (`cpu(offset)`:
  the fake's own view of the same bytes). `mode()` says whether BAR1 is in physical mode (None: no check); a
  CPU access through BAR1 in another mode is listed in `violations`."""

  def __init__(self, mib: int):
    from plugrt.hwqueue import libc
    self.size, self.libc = mib << 20, libc()
    self.fd = os.memfd_create("fake-vram")
    os.ftruncate(self.fd, self.size)
    self.base = self.libc.mmap(None, self.size, 3, 0x01, self.fd, 0)  # PROT_READ | PROT_WRITE, MAP_SHARED
    self.mode: Callable[[], bool] | None = None
    self.mapped: dict[int, tuple[int, int]] = {}  # CPU address -> (VRAM offset, size) of every map_at
    self.violations: list[str] = []

  def cpu(self, addr: int) -> int: return self.base + addr

  def _check(self, what: str, addr: int, n: int) -> None:
    assert 0 <= addr and addr + n <= self.size, f"VRAM {what} at {addr:#x}+{n} outside {self.size:#x}"
    if self.mode is not None and not self.mode(): self.violations.append(f"a BAR1 {what} at {addr:#x} while BAR1 is not in physical mode")

  def write(self, addr: int, data: bytes) -> None:
    self._check("write", addr, len(data))
    ctypes.memmove(self.base + addr, data, len(data))

  def read(self, addr: int, n: int) -> bytes:
    assert 0 <= addr and addr + n <= self.size, f"VRAM read at {addr:#x}+{n} outside {self.size:#x}"
    return ctypes.string_at(self.base + addr, n)

  def map_at(self, va: int, offset: int, size: int) -> None:
    self._check("mapping", offset, size)
    addr = self.libc.mmap(va, size, 3, 0x01 | 0x100000, self.fd, offset)  # MAP_SHARED | MAP_FIXED_NOREPLACE
    if addr != va:
      if addr not in (None, ctypes.c_void_p(-1).value): self.libc.munmap(addr, size)
      raise FileExistsError(f"{va:#x} is already mapped in this process")
    self.mapped[va] = (offset, size)

  def unmap_at(self, va: int, size: int) -> None:
    assert self.mapped.pop(va, (0, 0))[1] == size, f"unmap_at({va:#x}, {size}) of no such mapping"
    self.libc.munmap(va, size)

  def close(self) -> None:
    for va, (_, size) in self.mapped.items(): self.libc.munmap(va, size)
    self.mapped.clear()
    if self.base:
      self.libc.munmap(self.base, self.size)
      os.close(self.fd)
      self.base = 0


#: the page-table walks the fake's MMU makes, per GPU-MMU version: (VA shift, index bits, entry bytes) of each directory
#: level, and how an entry names the next table: version 2 (tu102 dev_mmu.h) keeps the address >> 12 from bit 8,
#: version 3 (gh100 dev_mmu.h) the address itself in bits 51:12, with its PTE KIND in 11:8 rather than 63:56
WALKS = {2: ((47, 2, 8), (38, 9, 8), (29, 9, 8), (21, 8, 16)), 3: ((56, 1, 8), (47, 9, 8), (38, 9, 8), (29, 9, 8), (21, 8, 16))}


def entry_address(e: int, version: int) -> int:
  return (e >> 8 & ((1 << 46) - 1)) << 12 if version == 2 else e & ((1 << 52) - 1) & ~0xFFF


def translate(vram: FakeVRAM, root: int, va: int, version: int = 2) -> tuple[int, int] | None:
  """What the GPU-MMU (version 2 or 3) makes of `va` with the page directory at `root`: (aperture, address) or None (a
  fault), read from the NV_MMU_VER2/VER3 field layouts independently of plugrt_nv_pci.mmu."""
  table = root
  for shift, bits, size in WALKS[version]:
    raw = vram.read(table + (va >> shift & ((1 << bits) - 1)) * size, size)
    e = struct.unpack("<Q", raw[8:16] if size == 16 else raw)[0]   # a dual PDE: the small-page half
    if e & 1 or e >> 1 & 3 != 1: return None                     # IS_PTE, or not a video-memory table
    table = entry_address(e, version)
  e = struct.unpack("<Q", vram.read(table + (va >> 12 & 511) * 8, 8))[0]
  kind = e >> 56 if version == 2 else e >> 8 & 0xF
  if not e & 1 or kind != 6: return None                          # invalid, or not generic memory
  return e >> 1 & 3, entry_address(e, version) | va & 0xFFF


class FakeFalconModel:
  """One falcon's memories and what its registers last got."""

  def __init__(self, base: int):
    self.base = base
    self.imem, self.dmem = bytearray(0x10000), bytearray(0x10000)
    self.riscv = False
    self.resets = 0


#: the fake function's BARs' bus addresses (BAR0, BAR1, BAR3), as make_sysfs's resource file lists them
BAR_ADDRESSES = (0xF2000000, 0xE0000000, 0xF0000000)
USERMODE = 0xBB0000  # the virtual-function window's page with the doorbell (dev_vm.h), which the CPU writes with plain stores


class FakeBAR0:
  """The register BAR: read32/write32 by byte offset. `boot42`, `gfw_done`, `wpr2`, `vram_mib` set what the GPU reports.
  `address(offset)` gives the CPU address of a register the CPU stores to directly (the doorbell page, which is
  memory here); a write to the MMU-invalidate register flushes every engine's TLB. `config` is the function's
  config-space file (its command register's bus-master bit is checked before the booter reads host memory)."""

  def __init__(self, boot42: int, dma: FakeDMA, firmware: FakeFirmware | None, vram_mib: int = VRAM_MIB, rom: FakeVBIOS | None = None,
               config: str | None = None, pci_address: str = "0000:01:00.0"):
    self.dma, self.fw, self.config, self.pci_address = dma, firmware, config, pci_address
    self.vram = FakeVRAM(vram_mib)
    self.usermode = (ctypes.c_char * 0x10000)()
    self.engines: dict[int, Any] = {}            # page directory -> the PCIEngine running that VA space's channels
    self.registered: list[tuple[bytes, Any]] = []  # cubins and their IR, for every engine (FakeEngine.register)
    self.tlb_flushes = 0
    self.meta: Any = None                        # the WPR metadata the booter read
    self.rom = rom or FakeVBIOS()
    self.regs: dict[int, int] = {0xA00: boot42, boot.SCRATCH_05_PRIV_LEVEL_MASK: 1, boot.SCRATCH_05_0: 0xFF, boot.SCRATCH_42: vram_mib,
                                 vbios.FUSE_GSP_UCODE1_VERSION + 4 * (FakeVBIOS.UCODE_ID - 1): FakeVBIOS.FUSE}
    self.fwsec_ran = False
    self.falcons = {falcon.GSP_BASE: FakeFalconModel(falcon.GSP_BASE), falcon.SEC2_BASE: FakeFalconModel(falcon.SEC2_BASE)}
    self.violations: list[str] = []
    self.log: list[tuple[str, int, int]] = []
    self.gsp: FakeGSP | None = None
    self.on_write: dict[int, Callable[[int], None]] = {}
    self.booter_ok = False

  def read32(self, offset: int) -> int:
    if vbios.PROM <= offset < vbios.PROM + vbios.PROM_SIZE:  # the ROM window (not logged: the boot reads it by the page)
      at = offset - vbios.PROM
      return struct.unpack_from("<I", self.rom.rom, at)[0] if at + 4 <= len(self.rom.rom) else 0
    v = self.regs.get(offset, 0)
    for base in self.falcons:
      if offset == base + falcon.HWCFG2: v = falcon.HWCFG2_RISCV      # scrubbing done at once, a RISC-V core present
      elif offset == base + falcon.RISCV_OFFSET + falcon.RISCV_BCR_CTRL: v = self.regs.get(offset, 0) | falcon.BCR_CTRL_VALID
      elif offset == base + falcon.DMATRFCMD: v = falcon.DMATRFCMD_IDLE
    self.log.append(("r", offset, v))
    return v

  def address(self, offset: int) -> int:
    assert USERMODE <= offset < USERMODE + len(self.usermode), f"the fake maps only the doorbell page for CPU stores, not {offset:#x}"
    return ctypes.addressof(self.usermode) + offset - USERMODE

  def bus_master(self) -> bool:
    if self.config is None: return True
    with open(self.config, "rb") as f: return bool(struct.unpack("<H", f.read(6)[4:6])[0] & 4)

  def register(self, lib: bytes, kernel: Any) -> None:
    self.registered.append((lib, kernel))

  def write32(self, offset: int, value: int) -> None:
    self.log.append(("w", offset, value))
    self.regs[offset] = value
    if offset == mmu.INVALIDATE:
      self.tlb_flushes += 1
      for e in list(self.engines.values()): e.tlb.clear()
    if (hook := self.on_write.get(offset)) is not None: hook(value)
    if offset in (falcon.GSP_ENGINE, falcon.SEC2_ENGINE) and value == 0:
      f = self.falcons[falcon.GSP_BASE if offset == falcon.GSP_ENGINE else falcon.SEC2_BASE]
      f.resets += 1
      f.riscv = False
      for r in (falcon.MAILBOX0, falcon.MAILBOX1, falcon.CPUCTL): self.regs.pop(f.base + r, None)
    for base, f in self.falcons.items():
      if offset == base + falcon.RISCV_OFFSET + falcon.RISCV_BCR_CTRL: f.riscv = bool(value & falcon.BCR_CTRL_CORE_SELECT_RISCV)
      elif offset == base + falcon.DMATRFCMD: self._dma(f, value)
      elif offset == base + falcon.CPUCTL and value & falcon.CPUCTL_STARTCPU: self._start(f)

  def _dma(self, f: FakeFalconModel, cmd: int) -> None:
    b = f.base
    src = (self.regs.get(b + falcon.DMATRFBASE, 0) | self.regs.get(b + falcon.DMATRFBASE1, 0) << 32) << 8
    src += self.regs.get(b + falcon.DMATRFFBOFFS, 0)
    dest = self.regs.get(b + falcon.DMATRFMOFFS, 0)
    if cmd >> 8 & 7 != 6: self.violations.append(f"falcon {b:#x}: a DMA of size code {cmd >> 8 & 7}, not 256 bytes")
    if not self.regs.get(b + falcon.FBIF_OFFSET + falcon.FBIF_TRANSCFG0, 0) & falcon.TRANSCFG_PHYSICAL:
      self.violations.append(f"falcon {b:#x}: DMA before FBIF context 0 was set to physical addresses")
    mem = f.imem if cmd & falcon.DMATRFCMD_IMEM else f.dmem
    mem[dest:dest + 256] = self.vram.read(src, 256)

  def _start(self, f: FakeFalconModel) -> None:
    b = f.base
    if b != falcon.SEC2_BASE:
      if f.riscv: self.violations.append("the GSP's RISC-V core was started directly (SEC2's booter starts GSP-RM)")
      else: self._fwsec(f)
      return
    self.regs[b + falcon.CPUCTL] = falcon.CPUCTL_HALTED
    problems = self._check_booter(f)
    self.violations += problems
    self.regs[b + falcon.MAILBOX0] = BOOTER_FAILED if problems else 0
    if not problems:
      self.booter_ok = True
      self.regs[falcon.GSP_BASE + falcon.RISCV_OFFSET + falcon.RISCV_CPUCTL] = falcon.RISCV_CPUCTL_ACTIVE_STAT
      self.gsp = FakeGSP(self)
      self.gsp.start()

  def _fwsec(self, f: FakeFalconModel) -> None:
    """FWSEC on the GSP's falcon: IMEM and DMEM as the VBIOS's FWSEC patched for FRTS, the boot ROM's parameters;
    then WPR2 up and no FRTS error, or FRTS error 0xBAD and WPR2 down."""
    rom, r, b, x, bad = self.rom, self.regs.get, f.base, falcon.RISCV_OFFSET, []
    if f.imem[rom.IMEM_PA:rom.IMEM_PA + rom.ISIZE] != rom.code: bad.append("the GSP falcon's IMEM does not hold FWSEC's code")
    frts = self.vram.size - (2 << 20)
    if f.dmem[rom.DPA:rom.DPA + rom.DSIZE] != rom.patched_data(frts): bad.append("the GSP falcon's DMEM is not FWSEC's data patched for FRTS")
    want = {x + falcon.BROM_PARAADDR0: rom.PKC, x + falcon.BROM_ENGIDMASK: rom.ENGINES, x + falcon.BROM_CURR_UCODE_ID: rom.UCODE_ID,
            x + falcon.MOD_SEL: 1, falcon.BOOTVEC: rom.IMEM_VA}
    bad += [f"GSP falcon register {b + k:#x} = {r(b + k, 0):#x}, FWSEC needs {v:#x}" for k, v in want.items() if r(b + k, 0) != v]
    self.regs[b + falcon.CPUCTL] = falcon.CPUCTL_HALTED
    self.violations += bad
    if bad: self.regs[vbios.VBIOS_SCRATCH_0E] = 0xBAD << 16
    else:
      self.fwsec_ran = True
      self.regs[boot.WPR2_ADDR_HI] = frts >> 12
      self.regs[vbios.VBIOS_SCRATCH_0E] = 0

  def _check_booter(self, f: FakeFalconModel) -> list[str]:
    fw, b, r, bad = self.fw, f.base, self.regs.get, []
    if fw is None: return ["no firmware to check the booter against"]
    if f.imem[:len(fw.booter_code)] != fw.booter_code: bad.append("SEC2's IMEM does not hold booter_load's code")
    if f.dmem[:len(fw.booter_data)] != fw.booter_data: bad.append("SEC2's DMEM does not hold booter_load's data")
    x = falcon.RISCV_OFFSET
    want = {x + falcon.BROM_PARAADDR0: 0x10, x + falcon.BROM_ENGIDMASK: 1, x + falcon.BROM_CURR_UCODE_ID: 3, x + falcon.MOD_SEL: 1,
            falcon.BOOTVEC: 0x1000}
    bad += [f"SEC2 register {b + k:#x} = {r(b + k, 0):#x}, the booter needs {v:#x}" for k, v in want.items() if r(b + k, 0) != v]
    if not self.regs.get(boot.WPR2_ADDR_HI): bad.append("booter_load ran with WPR2 down (FWSEC-FRTS has not run)")
    if not self.bus_master(): bad.append("booter_load ran with bus mastering off: the GPU cannot read host memory")
    gsp = self.falcons[falcon.GSP_BASE]
    if not gsp.resets or not gsp.riscv: bad.append("the GSP was not reset into RISC-V before the booter ran")
    libos = r(boot.GSP_MAILBOX0, 0) | r(boot.GSP_MAILBOX1, 0) << 32
    try: self.dma.read(libos, 32)
    except KeyError: bad.append(f"the GSP's mailboxes hold {libos:#x}, which is not host memory handed to the GPU")
    meta_at = r(b + falcon.MAILBOX0, 0) | r(b + falcon.MAILBOX1, 0) << 32
    try: m = boot.GspFwWprMeta.from_buffer_copy(self.dma.read(meta_at, 256))
    except KeyError: return [*bad, f"SEC2's mailboxes hold {meta_at:#x}, which is not host memory handed to the GPU"]
    self.meta = m
    if (m.magic, m.revision) != (boot.WPR_META_MAGIC, boot.WPR_META_REVISION): bad.append(f"WPR metadata magic {m.magic:#x} revision {m.revision}")
    try:
      if self._radix3(m.sysmemAddrOfRadix3Elf, m.sizeOfRadix3Elf) != fw.gsp_image: bad.append("the radix-3 table does not resolve to the GSP image")
      if self.dma.read(m.sysmemAddrOfBootloader, m.sizeOfBootloader) != fw.bootloader: bad.append("the WPR metadata's bootloader is not the file's")
      sig = fw.signatures[".fwsignature_" + {0x17: "ga10x", 0x19: "ad10x"}.get(self.regs[0xA00] >> 24, "?")]
      if self.dma.read(m.sysmemAddrOfSignature, m.sizeOfSignature) != sig: bad.append("the WPR metadata's signature is not this chip's")
    except (KeyError, struct.error) as e: bad.append(f"the WPR metadata points outside host memory: {e}")
    order = [m.gspFwRsvdStart, m.nonWprHeapOffset, m.gspFwWprStart, m.gspFwHeapOffset, m.gspFwOffset, m.bootBinOffset, m.frtsOffset,
             m.gspFwWprEnd, m.vgaWorkspaceOffset, m.fbSize]
    if order != sorted(order) or m.fbSize != self.vram.size or m.gspFwOffset + m.sizeOfRadix3Elf > m.bootBinOffset:
      bad.append(f"the WPR layout is not ordered inside VRAM: {[hex(v) for v in order]}")
    if (m.bootloaderCodeOffset, m.bootloaderDataOffset, m.bootloaderManifestOffset) != (0x1000, 0x2000, 0x2800):
      bad.append("the WPR metadata's bootloader offsets are not the descriptor's")
    return bad

  def _radix3(self, root: int, size: int) -> bytes:
    level = [root]
    for _ in range(3):
      nxt = []
      for p in level:
        nxt += [e for e in struct.unpack("<512Q", self.dma.read(p, PAGE)) if e]
      level = nxt
    return b"".join(self.dma.read(p, PAGE) for p in level)[:size]

  def close(self) -> None:
    if self.gsp is not None: self.gsp.stop = True
    for e in list(self.engines.values()): e.close()
    self.engines.clear()


#: what the fake GSP-RM offers per architecture: classes (device, subdevice, memory, VA space, channel objects, and the
#: generation's compute, copy, GPFIFO and usermode classes) and GR's sizes (an RTX 3090-like GA102, an RTX 4090-like AD102)
CLASSES = {0x17: [0x80, 0x2080, 0x70, 0x90F1, 0xA06C, 0x9067, 0xC56F, 0xC561, 0xC7C0, 0xC7B5, 0xC6B5],
           0x19: [0x80, 0x2080, 0x70, 0x90F1, 0xA06C, 0x9067, 0xC56F, 0xC561, 0xC9C0, 0xC7B5],
           0x1B: [0x80, 0x2080, 0x70, 0x90F1, 0xA06C, 0x9067, 0xCA6F, 0xC761, 0xCEC0, 0xCAB5]}
GR = {0x17: {0x0C: 0x806, 0x0D: 48, 0x14: 7, 0x17: 6, 0x1D: 10496, 0x20: 2}, 0x19: {0x0C: 0x809, 0x0D: 48, 0x14: 12, 0x17: 6, 0x1D: 16384, 0x20: 2},
      0x1B: {0x0C: 0xA04, 0x0D: 48, 0x14: 12, 0x17: 8, 0x1D: 21760, 0x20: 2}}   # an RTX 5090-like GB202 (170 SMs)
MMU_VERSION = {0x17: 2, 0x19: 2, 0x1B: 3}
GPFIFO, COMPUTE, COPY = (0xC56F, 0xCA6F), (0xC7C0, 0xC9C0, 0xC6C0, 0xCEC0), (0xC7B5, 0xC6B5, 0xCAB5)
PARAM_SIZES = {0x0: 120, 0x80: 56, 0x2080: 4, 0x90F1: 48, 0xA06C: 20, 0x9067: 12, **{c: 368 for c in GPFIFO}, **{c: 0 for c in COMPUTE + COPY}}
PARENTS = {0x80: (0x0,), 0x2080: (0x80,), 0x90F1: (0x80,), 0xA06C: (0x80,), 0x9067: (0xA06C,), **{c: (0x80, 0xA06C) for c in GPFIFO},
           **{c: GPFIFO for c in COMPUTE + COPY}}
#: the device info table: (RM engine type, runlist): GR0 on runlist 1, copy engines 0-2 on runlists 2-4
ENGINES = ((1, 1), (9, 2), (10, 3), (11, 4))
CTX_SIZES = {0: 0x20000, 16: 0x4000, 17: 0x8000, 18: 0x8000, 19: 0x10000, 20: 0x4000, 23: 0x1000, 24: 0x1000}  # context property -> bytes
INVALID_PARAM_STRUCT, NOT_SUPPORTED, OBJECT_NOT_FOUND, INVALID_OBJECT_PARENT, INVALID_STATE = 0x3A, 0x56, 0x57, 0x36, 0x40
INVALID_ARGUMENT, INVALID_CLASS = 0x1F, 0x22
MALFORMED, HANDLE_EXISTS = 0xFF100002, 0xFF100004  # NV_VGPU_MSG_RESULT_RPC_INVALID_MESSAGE_FORMAT, _RPC_HANDLE_EXISTS


class Obj:
  """An RM object: its class, parent, and what the fake keeps of its parameters."""

  def __init__(self, cls: int, parent: int, **kw: Any):
    self.cls, self.parent, self.kw = cls, parent, kw


class FakeRM:
  """GSP-RM's resource manager as far as plugrt uses it: clients, objects by (client, handle) with their parents and
  classes, the parameter sizes of the classes it knows, and the controls of the bring-up. It checks what GSP-RM
  would refuse: a channel's VRAM (instance block, RAMFC, method buffer, USERD) inside the client's VRAM, a channel on
  a VA space without a page directory, a compute object before GSP-RM's golden context exists, a channel group
  scheduled before its compute channel's context buffers were promoted, PDEs handed over that are not a walk of the
  tables; each as the NV_STATUS it would answer. A scheduled group's channels run on a PCIEngine of their VA space."""

  def __init__(self, gpu: FakeBAR0):
    self.gpu, self.arch = gpu, gpu.regs[0xA00] >> 24
    self.mmu = MMU_VERSION[self.arch]
    self.objects: dict[tuple[int, int], Obj] = {}
    self.clients: set[int] = set()
    self.client: int | None = None            # the first client (what the direct tests look at)
    self.calls: list[tuple[str, int, int]] = []   # ("alloc", class, handle) / ("control", cmd, object) / ("rpc", function, handle)
    self.chids = itertools.count(0)
    self.golden = False
    self.tokens: set[int] = set()

  def _vram_ok(self, base: int, size: int) -> bool:
    top = self.gpu.meta.gspFwRsvdStart if self.gpu.meta is not None else self.gpu.vram.size
    return 0 <= base and base + size <= top and size > 0

  def alloc(self, p: bytes) -> tuple[int, bytes]:
    if len(p) < rpc.ALLOC_HEADER.size: return MALFORMED, p
    client, parent, handle, cls, _, size, _ = rpc.ALLOC_HEADER.unpack_from(p)
    body = p[rpc.ALLOC_HEADER.size:]
    self.calls.append(("alloc", cls, handle))
    if cls == rpc.ROOT_CLASS:
      if client in self.clients: return HANDLE_EXISTS, p
      self.clients.add(client)
      self.client = self.client or client
      self.objects[(client, client)] = Obj(cls, 0)
      return 0, p
    if client not in self.clients: return OBJECT_NOT_FOUND, p
    if (client, handle) in self.objects: return HANDLE_EXISTS, p
    if cls not in CLASSES[self.arch]: return INVALID_CLASS, p
    if cls in PARAM_SIZES and (size != PARAM_SIZES[cls] or len(body) != size): return INVALID_PARAM_STRUCT, p
    up = self.objects.get((client, parent))
    if up is None or up.cls not in PARENTS.get(cls, (up.cls,)): return INVALID_OBJECT_PARENT, p
    kw: dict[str, Any] = {}
    if cls == 0x90F1: kw["flags"], kw["root"] = rpc.L570.VASPACE_PARAMS.from_buffer_copy(body).flags, None
    elif cls == 0x9067:
      vas = self.objects.get((client, rm.CTXSHARE_PARAMS.from_buffer_copy(body).hVASpace))
      if vas is None or vas.cls != 0x90F1: return INVALID_ARGUMENT, p
      kw["vaspace"] = vas
    elif cls in GPFIFO:
      status = self._channel(client, up, body, kw)
      if status: return status, p
      body = bytes(kw.pop("params"))
    elif cls in COMPUTE:
      if client == gpu_pci.INTERNAL_CLIENT:
        if 0 not in up.kw["promoted"]: return INVALID_STATE, p  # the golden context needs its main buffer first
        self.golden = True
      elif not self.golden: return INVALID_STATE, p            # GSP-RM has no golden context image to start from
      up.kw["compute"] = True
    self.objects[(client, handle)] = Obj(cls, parent, **kw)
    return 0, p[:rpc.ALLOC_HEADER.size] + body

  def _channel(self, client: int, group: Obj, body: bytes, kw: dict[str, Any]) -> int:
    c = rpc.L570.CHANNEL_PARAMS.from_buffer_copy(body)
    for name in ("instanceMem", "ramfcMem", "mthdbufMem", "userdMem"):
      d = getattr(c, name)
      if d.addressSpace != gpu_pci.ADDR_FB or not self._vram_ok(d.base, d.size): return INVALID_ARGUMENT
    if c.userdMem.base != c.hUserdMemory[0] + c.userdOffset[0]: return INVALID_ARGUMENT
    if group.cls == 0xA06C:
      share = self.objects.get((client, c.hContextShare))
      if share is None or share.cls != 0x9067: return INVALID_OBJECT_PARENT
      if share.kw["vaspace"].kw["root"] is None: return INVALID_STATE  # no page directory for its VA space
      kw["vaspace"] = share.kw["vaspace"]
    kw.update(chid=next(self.chids), ring=c.gpFifoOffset, entries=c.gpFifoEntries, userd=c.userdMem.base, promoted=set(), group=group)
    kw["params"] = c
    return 0

  def control(self, p: bytes) -> tuple[int, bytes]:
    if len(p) < rpc.CONTROL_HEADER.size: return MALFORMED, p
    client, obj, cmd, _, size, _ = rpc.CONTROL_HEADER.unpack_from(p)
    self.calls.append(("control", cmd, obj))
    body = bytearray(p[rpc.CONTROL_HEADER.size:])
    o = self.objects.get((client, obj))
    if client not in self.clients or o is None: return OBJECT_NOT_FOUND, p
    if len(body) != size: return INVALID_PARAM_STRUCT, p
    sizes = {0x800292: 404, rpc.CTRL_KGR_INFO: ctypes.sizeof(rpc.KGR_INFO), rpc.CTRL_DEVICE_INFO_TABLE: 3212, rpc.CTRL_CTX_BUFFERS_INFO: 1664,
             rpc.CTRL_RESERVED_PDES: 184, rpc.CTRL_PROMOTE_CTX: 560, rm.CTRL_SCHEDULE: 2, rm.CTRL_WORK_SUBMIT_TOKEN: 4}
    owner = {0x800292: 0x80, rpc.CTRL_KGR_INFO: 0x2080, rpc.CTRL_DEVICE_INFO_TABLE: 0x2080, rpc.CTRL_CTX_BUFFERS_INFO: 0x2080,
             rpc.CTRL_RESERVED_PDES: 0x90F1, rpc.CTRL_PROMOTE_CTX: 0x2080, rm.CTRL_SCHEDULE: 0xA06C, rm.CTRL_WORK_SUBMIT_TOKEN: GPFIFO}
    if cmd not in owner or o.cls not in (owner[cmd] if isinstance(owner[cmd], tuple) else (owner[cmd],)): return NOT_SUPPORTED, p
    if size != sizes[cmd]: return INVALID_PARAM_STRUCT, p
    status = 0
    if cmd == 0x800292:   # NV0080_CTRL_CMD_GPU_GET_CLASSLIST_V2
      cl = CLASSES[self.arch]
      struct.pack_into(f"<I{len(cl)}I", body, 0, len(cl), *cl)
    elif cmd == rpc.CTRL_KGR_INFO:
      for index, value in GR[self.arch].items(): struct.pack_into("<II", body, 8 * index, index, value)
    elif cmd == rpc.CTRL_DEVICE_INFO_TABLE:
      struct.pack_into("<II", body, 0, 0, len(ENGINES))
      for i, (engine, runlist) in enumerate(ENGINES): struct.pack_into("<II", body, 12 + 100 * i + 8, engine, runlist)
    elif cmd == rpc.CTRL_CTX_BUFFERS_INFO:
      for prop, n in CTX_SIZES.items(): struct.pack_into("<II", body, 8 * prop, n, 0x1000)
    elif cmd == rpc.CTRL_RESERVED_PDES: status = self._reserved_pdes(rpc.RESERVED_PDES.from_buffer_copy(body))
    elif cmd == rpc.CTRL_PROMOTE_CTX: status = self._promote(client, rpc.PROMOTE_CTX.from_buffer_copy(body))
    elif cmd == rm.CTRL_SCHEDULE: status = self._schedule(client, obj)
    elif cmd == rm.CTRL_WORK_SUBMIT_TOKEN: struct.pack_into("<I", body, 0, o.kw["chid"])
    return status, p[:rpc.CONTROL_HEADER.size] + bytes(body)

  def _reserved_pdes(self, p: Any) -> int:
    """The levels must be the tables a walk to virtAddrLo passes, down to the one whose entries are pageSize: each
    level's entry pointing at the next level."""
    walk = WALKS[self.mmu]
    depth = next((i + 1 for i, (shift, _, _) in enumerate(walk) if 1 << shift == p.pageSize), 0)
    if not depth or p.numLevelsToCopy != depth or p.virtAddrHi - p.virtAddrLo + 1 != p.pageSize: return INVALID_ARGUMENT
    for i in range(depth - 1):
      shift, bits, _ = walk[i]
      e = struct.unpack("<Q", self.gpu.vram.read(p.levels[i].physAddress + (p.virtAddrLo >> shift & ((1 << bits) - 1)) * 8, 8))[0]
      if e >> 1 & 3 != 1 or entry_address(e, self.mmu) != p.levels[i + 1].physAddress: return INVALID_ARGUMENT
    return 0

  def _promote(self, client: int, p: Any) -> int:
    ch = self.objects.get((p.hChanClient, p.hObject))
    if ch is None or ch.cls not in GPFIFO or p.hChanClient != client: return OBJECT_NOT_FOUND
    if not 0 < p.entryCount <= 16: return INVALID_ARGUMENT
    for e in p.promoteEntry[:p.entryCount]:
      if e.gpuPhysAddr and not self._vram_ok(e.gpuPhysAddr, e.size): return INVALID_ARGUMENT
      if e.gpuVirtAddr and "vaspace" in ch.kw and translate(self.gpu.vram, ch.kw["vaspace"].kw["root"], e.gpuVirtAddr, self.mmu) is None:
        return INVALID_ARGUMENT                            # a virtual address the channel's VA space does not map
      ch.kw["promoted"].update({e.bufferId} if e.gpuPhysAddr and e.gpuVirtAddr else {(e.bufferId, "p" if e.gpuPhysAddr else "v")})
    return 0

  def _schedule(self, client: int, group: int) -> int:
    chans = [o for (c, _), o in self.objects.items() if c == client and o.cls in GPFIFO and o.parent == group]
    for ch in chans:
      if ch.kw.get("compute") and not {(b, k) for b in (0, 1, 2) for k in "pv"} <= ch.kw["promoted"]: return INVALID_STATE
    if not chans: return INVALID_STATE
    root = chans[0].kw["vaspace"].kw["root"]
    engine = self.gpu.engines.get(root)
    if engine is None: engine = self.gpu.engines[root] = PCIEngine(self.gpu, root, set(CLASSES[self.arch]), self.mmu)
    for ch in chans:
      token = ch.kw["chid"] | dict(ENGINES)[1] << 16
      self.tokens.add(token)
      engine.run_channel(Channel("compute" if ch.kw.get("compute") else "copy", ch.kw["ring"], ch.kw["entries"],
                                 self.gpu.vram.cpu(ch.kw["userd"]), token), self.tokens)
    return 0

  def set_page_directory(self, p: bytes) -> tuple[int, bytes]:
    if len(p) != rpc.SET_PAGE_DIRECTORY.size: return MALFORMED, p
    client, device, _, root, entries, flags, vaspace, _, _, _ = rpc.SET_PAGE_DIRECTORY.unpack(p)
    if flags != rpc.PAGE_DIRECTORY_ALL_CHANNELS: return INVALID_ARGUMENT, p
    self.calls.append(("rpc", msgq.Function.SET_PAGE_DIRECTORY, vaspace))
    vas, dev = self.objects.get((client, vaspace)), self.objects.get((client, device))
    if vas is None or dev is None or vas.cls != 0x90F1 or dev.cls != 0x80: return OBJECT_NOT_FOUND, p
    if not vas.kw["flags"] & 1 << 3: return INVALID_STATE, p  # only a VA space its client owns takes the client's tables
    if entries != 1 << WALKS[self.mmu][0][1] or root % PAGE or not self._vram_ok(root, PAGE): return INVALID_ARGUMENT, p
    vas.kw["root"] = root
    return 0, p


class GPUView:
  """The fake GPU's memory seen through a VA space's page tables, for the reference interpreter: a buffer address is
  the host memory its pages resolve to, as far as they stay contiguous there."""

  def __init__(self) -> None:
    self.engine: PCIEngine | None = None

  def array(self, addr: int, dtype: Any) -> Any:
    import numpy as np
    assert self.engine is not None
    host = self.engine.host(addr)
    n = PAGE - addr % PAGE
    while n < 1 << 31:
      try: nxt = self.engine.host(addr + n)
      except KeyError: break
      if nxt != host + n: break
      n += PAGE
    count = n // dtype.itemsize
    return np.frombuffer((ctypes.c_char * (count * dtype.itemsize)).from_address(host), dtype=dtype.numpy, count=count)

  def close(self) -> None: pass


class PCIEngine(FakeEngine):
  """fake_gpu's NV engine behind the GPU-MMU: every address a command names is walked through the page tables at
  `root` (cached per page until the MMU-invalidate register is written, like a TLB) to VRAM (the fake's own view of
  the memory file behind BAR1) or to host memory (the DMA allocator's bus pages); an unmapped address faults the
  channel. The doorbell page is watched: any value but a token GSP-RM handed out is a violation."""

  def __init__(self, gpu: FakeBAR0, root: int, classes: set[int], mmu_version: int = 2):
    view = GPUView()
    super().__init__(view, classes)
    view.engine = self
    self.gpu, self.root, self.tlb, self.mmu = gpu, root, {}, mmu_version
    self.registered = gpu.registered
    self.doorbells: set[int] = set()

  def host(self, va: int) -> int:
    page = va & ~(PAGE - 1)
    where = self.tlb.get(page)
    if where is None:
      where = translate(self.gpu.vram, self.root, page, self.mmu)
      if where is None: raise KeyError(f"MMU fault: GPU address {va:#x} is not mapped")
      self.tlb[page] = where
    aperture, addr = where
    if aperture == mmu.APERTURE_VIDEO: return self.gpu.vram.cpu(addr) + va % PAGE
    if aperture == mmu.APERTURE_SYSTEM: return self.gpu.dma.resolve(addr + va % PAGE)
    raise KeyError(f"MMU fault: GPU address {va:#x} has aperture {aperture}")

  def at(self, addr: int, n: int) -> int:
    first = self.host(addr)
    for k in range(PAGE - addr % PAGE, n, PAGE):
      if self.host(addr + k) != first + k: raise KeyError(f"GPU range {addr:#x}+{n} is not contiguous in the fake's memory")
    return first

  def visible(self, addr: int, n: int) -> None: self.at(addr, n)

  def run_channel(self, ch: Channel, tokens: set[int]) -> None:
    bell = ctypes.c_uint32.from_address(ctypes.addressof(self.gpu.usermode) + gpu_pci.DOORBELL - USERMODE)
    step = self._channel(ch)

    def watched() -> bool:
      if (v := bell.value) and v not in tokens:
        self.gpu.violations.append(f"the doorbell got {v:#x}, which is no channel's token")
        bell.value = 0
      elif v: self.doorbells.add(v)
      return step()
    self.serve(ch.name, watched)


class FakeGSP(threading.Thread):
  """GSP-RM after the booter: its arguments read through the bus addresses, the messages queued for its init checked
  (GSP_SET_SYSTEM_INFO with this function's BARs and ids, then SET_REGISTRY; otherwise an error log and no
  GSP_INIT_DONE), its status queue written, a CPU-sequencer request and GSP_INIT_DONE sent (BAR1 left in virtual mode,
  as GSP-RM's init leaves it), then RPCs answered by `handlers` (function -> payload -> (result, reply) or None for no
  reply). A channel fault (an engine's error) is reported once as RC_TRIGGERED. `silent` stops it answering;
  `corrupt` garbles the next reply's checksum."""

  def __init__(self, gpu: FakeBAR0, libos: int | None = None):
    super().__init__(daemon=True, name="fake-gsp")
    self.gpu, self.dma, self.stop = gpu, gpu.dma, False
    self.silent = self.corrupt = False
    self.tx_seq = self.rx_seq = 0
    self.rm = FakeRM(gpu)
    self.handlers: dict[int, Callable[[bytes], tuple[int, bytes] | None]] = {msgq.Function.GSP_RM_ALLOC: self.rm.alloc,
                                                                             msgq.Function.GSP_RM_CONTROL: self.rm.control,
                                                                             msgq.Function.SET_PAGE_DIRECTORY: self.rm.set_page_directory}
    self.received: list[tuple[int, bytes]] = []
    self.errors: list[str] = []
    self.reported: set[str] = set()
    if libos is None: libos = gpu.regs[boot.GSP_MAILBOX0] | gpu.regs[boot.GSP_MAILBOX1] << 32  # where the booter flow hands it over
    regions = [boot.LibosMemoryRegionInitArgument.from_buffer_copy(self.dma.read(libos + 32 * i, 32)) for i in range(4)]
    rm_args = next(r for r in regions if r.id8 == boot.id8("RMARGS"))
    args = boot.GspArgumentsCached.from_buffer_copy(self.dma.read(rm_args.pa, ctypes.sizeof(boot.GspArgumentsCached)))
    mq = args.messageQueueInitArguments
    first = self.dma.read(mq.sharedMemPhysAddr, 8 * mq.pageTableEntryCount)
    self.pt = struct.unpack(f"<{mq.pageTableEntryCount}Q", first)
    self.cmd_off, self.stat_off = mq.cmdQueueOffset, mq.statQueueOffset
    self.count = (msgq.QUEUE_SIZE - msgq.ENTRY_OFF) // msgq.MSG_SIZE
    self.sequencer = struct.pack("<II8I", 64, 5, *([0] * 8)) + struct.pack("<5I", 0, 0x1E0000, 0x1234, 3, 10)  # REG_WRITE, DELAY_US 10

  def addr(self, off: int) -> int: return self.dma.resolve(self.pt[off // PAGE] + off % PAGE)  # through the page table
  def r32(self, off: int) -> int: return ctypes.c_uint32.from_address(self.addr(off)).value
  def w32(self, off: int, v: int) -> None: ctypes.c_uint32.from_address(self.addr(off)).value = v

  def send(self, function: int, payload: bytes, result: int = 0) -> None:
    msg = bytearray(msgq.pack_message(function, payload, self.tx_seq, result=result))
    if self.corrupt:
      msg[0x40] ^= 0xFF
      self.corrupt = False
    wp, n = self.r32(self.stat_off + 16), len(msg) // msgq.MSG_SIZE
    for i in range(n):
      base = self.stat_off + msgq.ENTRY_OFF + (wp + i) % self.count * msgq.MSG_SIZE
      for o in range(0, msgq.MSG_SIZE, PAGE): ctypes.memmove(self.addr(base + o), bytes(msg[i * PAGE + o:i * PAGE + o + PAGE]), PAGE)
    self.tx_seq += 1
    self.w32(self.stat_off + 16, (wp + n) % self.count)

  def error_log(self, text: str) -> None:
    """An OS_ERROR_LOG event (exceptType, preemptiveRemovalPreviousXid, runlistId, chid, errString) and the note in `errors`."""
    self.errors.append(text)
    self.send(msgq.Function.OS_ERROR_LOG, struct.pack("<4I", 0, 0, 0, 0) + text.encode()[:0xFF].ljust(0x100, b"\0"))

  def init_messages(self) -> str:
    """What the CPU queued before the boot: "" when it is GSP_SET_SYSTEM_INFO for this function, then SET_REGISTRY."""
    got = []
    while len(got) < 2 and self.r32(self.stat_off + msgq.RX_HDR_OFF) != self.r32(self.cmd_off + 16):
      self.step(answer=False)
      got.append(self.received[-1])
    want = [msgq.Function.GSP_SET_SYSTEM_INFO, msgq.Function.SET_REGISTRY]
    if [f for f, _ in got] != want:
      return f"GSP-RM's init found {[msgq.name_of(f) for f, _ in got]} queued, not GSP_SET_SYSTEM_INFO then SET_REGISTRY"
    info, registry = got[0][1], got[1][1]
    if len(info) != rpc.SYSTEM_INFO_SIZE: return f"GSP_SET_SYSTEM_INFO of {len(info)} bytes, not {rpc.SYSTEM_INFO_SIZE}"
    bars, bdf, ids = struct.unpack_from("<3Q", info), struct.unpack_from("<Q", info, 32)[0], struct.unpack_from("<I", info, 88)[0]
    if bars != BAR_ADDRESSES or bdf != rpc.bdf_of(self.gpu.pci_address) or ids & 0xFFFF != 0x10DE or not info[840]:
      return f"GSP_SET_SYSTEM_INFO names BARs {[hex(b) for b in bars]}, function {bdf:#x}, ids {ids:#x}, passthrough {info[840]}"
    size, count = struct.unpack_from("<II", registry)
    if size != len(registry) or count < 1: return f"SET_REGISTRY's table says {size} bytes and {count} entries in {len(registry)} bytes"
    return ""

  def run(self) -> None:
    try:
      hdr = struct.unpack("<8I", bytes(ctypes.string_at(self.addr(self.cmd_off), 32)))
      want = struct.unpack("<8I", msgq.tx_header())
      if hdr[:4] + hdr[5:] != want[:4] + want[5:]: self.errors.append(f"the CPU's command queue header is {hdr}")  # (its write pointer aside)
      ctypes.memmove(self.addr(self.stat_off), msgq.tx_header(), 32)
      if (wrong := self.init_messages()):
        self.error_log(wrong)
        return  # GSP-RM's init stops: no GSP_INIT_DONE
      self.send(msgq.Function.GSP_RUN_CPU_SEQUENCER, self.sequencer)
      deadline = time.monotonic() + 5
      while self.gpu.regs.get(0x1E0000) != 0x1234 and not self.stop:  # the CPU ran the sequencer's register write
        if time.monotonic() > deadline: self.errors.append("the CPU did not run the sequencer's register write"); return
        time.sleep(0.001)
      self.gpu.regs[boot.BAR1_BLOCK] = 1 << 31   # GSP-RM's init moves BAR1 to virtual mode; the CPU must set it back
      self.gpu.vram.mode = lambda: self.gpu.regs.get(boot.BAR1_BLOCK, 0) >> 31 == 0
      self.send(msgq.Function.GSP_INIT_DONE, b"")
      while not self.stop:
        if not self.step() and not self.faults(): time.sleep(0.0005)
    except Exception as e: self.errors.append(f"{type(e).__name__}: {e}")

  def faults(self) -> bool:
    """An engine whose channel faulted: RC_TRIGGERED (rpc_rc_triggered_v17_02: engine type, chid, gfid, level, Xid)."""
    for e in list(self.gpu.engines.values()):
      if e.error and e.error not in self.reported and not self.silent:
        self.reported.add(e.error)
        xid = 31 if "MMU fault" in e.error else 13
        self.send(msgq.Function.RC_TRIGGERED, struct.pack("<5I", 1, 0, 0, 0, xid) + bytes(28))
        self.error_log(e.error)
        return True
    return False

  def step(self, answer: bool = True) -> bool:
    rp = self.r32(self.stat_off + msgq.RX_HDR_OFF)  # the GSP's read pointer of the command queue lives in the status queue
    if self.silent or rp == self.r32(self.cmd_off + 16): return False
    base = self.cmd_off + msgq.ENTRY_OFF
    head = ctypes.string_at(self.addr(base + rp * msgq.MSG_SIZE), 0x50)
    _, _, _, seq, n = msgq.ELEMENT.unpack_from(head)
    _, sig, length, function, *_ = msgq.RPC.unpack_from(head, 0x30)
    data = b"".join(ctypes.string_at(self.addr(base + (rp + i) % self.count * msgq.MSG_SIZE), PAGE) for i in range(n))
    if msgq.checksum(data[:0x30 + length]) or seq != self.rx_seq or sig != msgq.SIGNATURE:
      self.errors.append(f"command {function}: checksum {msgq.checksum(data[:0x30 + length]):#x}, seq {seq} (want {self.rx_seq}), signature {sig:#x}")
    self.rx_seq += 1
    self.w32(self.stat_off + msgq.RX_HDR_OFF, (rp + n) % self.count)
    payload = data[0x50:0x30 + length]
    if function == msgq.Function.CONTINUATION_RECORD and self.received:
      self.received[-1] = (self.received[-1][0], self.received[-1][1] + payload)
      return True
    self.received.append((function, payload))
    if not answer: return True
    if function == msgq.Function.UNLOADING_GUEST_DRIVER:  # answers, then GSP-RM is gone with its channels
      self.stop = True
      for e in list(self.gpu.engines.values()): e.stop = True
    handler = self.handlers.get(function, lambda p: (0, p))
    if (answer_ := handler(payload)) is not None: self.send(function, answer_[1], answer_[0])
    return True


def init_messages(gpu: FakeBAR0) -> tuple[tuple[int, bytes], ...]:
  """What plugrt queues before the boot, for the fake function: GSP_SET_SYSTEM_INFO and SET_REGISTRY (tests that run
  the boot's steps directly pass this to boot.start_gsp)."""
  info = rpc.system_info(BAR_ADDRESSES, rpc.bdf_of(gpu.pci_address), 0x10DE | 0x2204 << 16, 0, 0xA1)
  return ((msgq.Function.GSP_SET_SYSTEM_INFO, info), (msgq.Function.SET_REGISTRY, rpc.registry_table()))
