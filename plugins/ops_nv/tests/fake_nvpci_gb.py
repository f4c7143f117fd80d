"""A fake Blackwell GB202 below plugrt-nv-pci: its firmware files (fake_nvpci's, plus fmc-570.144.bin as an ELF32 file
with `hash`, `signature`, `publickey` and `image` sections) and its GPU behind BAR0 (FakeBAR0GB), whose FSP checks the
chain-of-trust boot step by step as the hardware would refuse it, then boots the same fake GSP-RM as fake_nvpci's GPUs.

The FSP (layouts from docs/research/nv-pci.md, "Blackwell GB20x"): its boot-complete mark is up from the start; it
takes one MCTP packet from the RM channel of its EMEM (written through EMEMC/EMEMD with auto-increment, handed over by
QUEUE_TAIL then QUEUE_HEAD) and checks: the packet's size against what was written, the MCTP header (one packet:
start and end of message, SEID 0, sequence 0), the message header (vendor-defined PCI, NVIDIA, NVDM type COT), the
payload's size and version, bus mastering on before it reads host memory, the FMC image and its hash, signature and
public key against the file's, FRTS's size and alignment, the FMC's boot parameters (the WPR metadata, with the GSP-RM
image behind its radix-3 table, the bootloader, GB20x's signature, the sizes the FMC lays out from; the LibOS
arguments). Then it answers with an NVDM command response (error code 0 or the FSP's error for what was wrong, each
listed in `violations`), lays the WPR region out and writes the offsets back into the metadata, releases the GSP's
target mask and lockdown (its HWCFG2 reads 0xBADF4100 until then) and starts the fake GSP-RM with the LibOS
arguments of the boot parameters. `fsp_silent` makes it never answer; `fsp_error` answer that error code instead;
`fmc_error` makes the FMC put that error in the GSP's mailbox 0 instead of booting GSP-RM. The CPU resetting,
starting or writing the mailboxes of the GSP or SEC2 is a violation (the FSP boots the FMC; there is no booter).
"""
from __future__ import annotations

import ctypes
import os
import random
import struct
from typing import Any

from fake_nvpci import BLACKWELL, FakeBAR0, FakeDMA, FakeFirmware, FakeGSP

from plugrt_nv_pci import boot, boot_fsp, falcon, fsp
from plugrt_nv_pci.chips import GSP_VERSION

__all__ = ["BLACKWELL", "FakeBAR0GB", "FakeFirmwareGB", "elf32"]
INVALID_DATA, INVALID_STATE = 0xA1, 0x9E   # FSP_ERR_IFS_ERR_INVALID_DATA, FSP_ERR_IFS_ERR_INVALID_STATE


def elf32(sections: dict[str, bytes]) -> bytes:
  """A minimal little-endian ELF32 file with these sections and the section-name table (the layout NVIDIA's
  extract-firmware-nouveau.py gives fmc-<version>.bin: header, section headers, then the data)."""
  names = b"\0.shstrtab\0" + b"".join(n.encode() + b"\0" for n in sections)
  heads, body, name_at = [bytes(40)], bytearray(), 11
  data_at = 52 + 40 * (len(sections) + 2)
  heads.append(struct.pack("<10I", 1, 3, 0, 0, data_at, len(names), 0, 0, 1, 0))
  body += names
  for n, data in sections.items():
    heads.append(struct.pack("<10I", name_at, 1, 0, 0, data_at + len(body), len(data), 0, 0, 1, 0))
    body += data
    name_at += len(n) + 1
  head = bytearray(52)
  head[:6] = b"\x7fELF\x01\x01"
  struct.pack_into("<I", head, 0x20, 52)                        # e_shoff: the section headers follow the ELF header
  struct.pack_into("<H", head, 0x28, 52)                        # e_ehsize
  struct.pack_into("<HHH", head, 0x2E, 40, len(heads), 1)       # e_shentsize, e_shnum, e_shstrndx
  return bytes(head) + b"".join(heads) + bytes(body)


class FakeFirmwareGB(FakeFirmware):
  """fake_nvpci's files for GB202 (the GSP-RM image with a .fwsignature_gb20x section), plus the FMC."""

  def __init__(self, root: str, chip: str = "gb202", image_pages: int = 600):
    super().__init__(root, chip, image_pages)
    rnd = random.Random(chip + "fmc")
    self.fmc = {"hash": rnd.randbytes(48), "signature": rnd.randbytes(96), "publickey": rnd.randbytes(97), "image": rnd.randbytes(0x5123)}
    self.files["fmc"] = elf32(self.fmc)
    with open(os.path.join(root, "nvidia", chip, "gsp", f"fmc-{GSP_VERSION}.bin"), "wb") as f: f.write(self.files["fmc"])


class FakeBAR0GB(FakeBAR0):
  """The register BAR of a GB202: fake_nvpci's GPU model with the FSP in front of the GSP."""

  def __init__(self, boot42: int, dma: FakeDMA, firmware: FakeFirmwareGB | None, **kw: Any):
    super().__init__(boot42, dma, firmware, **kw)
    self.regs[fsp.I2CS_SCRATCH] = fsp.BOOT_COMPLETE
    self.emem = bytearray(fsp.EMEM_SIZE)
    self.emem_at, self.written = 0, 0
    self.fmc_booted = False
    self.fsp_silent, self.fsp_error, self.fmc_error = False, 0, 0
    self.cot: Any = None          # the COT payload the FSP accepted
    self.responses: list[int] = []

  def read32(self, offset: int) -> int:
    if offset == falcon.GSP_BASE + falcon.HWCFG2:  # locked to the FSP until the FMC booted, then the RISC-V core unlocked
      return falcon.HWCFG2_RISCV if self.fmc_booted else boot_fsp.TARGET_LOCKED | 0x2
    if offset == fsp.EMEMD:
      v = struct.unpack_from("<I", self.emem, self.emem_at)[0] if self.emem_at + 4 <= len(self.emem) else 0
      if self.regs.get(fsp.EMEMC, 0) & fsp.EMEMC_AINCR: self.emem_at += 4
      return v
    if offset == fsp.EMEMC: return self.regs.get(fsp.EMEMC, 0) & ~0xFFFF | (self.emem_at // 4 % 64) << 2 | (self.emem_at // 256) << 8
    return super().read32(offset)

  def write32(self, offset: int, value: int) -> None:
    gsp, sec2 = falcon.GSP_BASE, falcon.SEC2_BASE
    if offset in (falcon.GSP_ENGINE, falcon.SEC2_ENGINE) or offset in (gsp + falcon.CPUCTL, sec2 + falcon.CPUCTL, gsp + falcon.MAILBOX0,
                                                                       gsp + falcon.MAILBOX1, sec2 + falcon.MAILBOX0):
      self.violations.append(f"the CPU wrote {value:#x} to {offset:#x}: on GB20x the FSP boots the GSP FMC, the CPU does not touch the falcons")
      return
    if offset == fsp.EMEMD:
      if self.emem_at + 4 <= len(self.emem): struct.pack_into("<I", self.emem, self.emem_at, value)
      else: self.violations.append("a write past the RM channel's 1 KiB of EMEM")
      if self.regs.get(fsp.EMEMC, 0) & fsp.EMEMC_AINCW: self.emem_at += 4
      self.written += 4
      return
    super().write32(offset, value)
    if offset == fsp.EMEMC: self.emem_at, self.written = (value >> 2 & 0x3F) * 4 + (value >> 8 & 0xFF) * 256, 0
    elif offset == fsp.QUEUE_HEAD: self._command()

  # ---- the FSP
  def _answer(self, code: int) -> None:
    if self.fsp_silent: return
    code = self.fsp_error or code
    reply = struct.pack("<II", fsp.mctp_header(True, True), fsp.nvdm_header(fsp.NVDM_RESPONSE)) + struct.pack("<III", 0, fsp.NVDM_COT, code)
    self.emem[:len(reply)] = reply
    self.regs[fsp.MSGQ_HEAD], self.regs[fsp.MSGQ_TAIL] = 0, len(reply) - 4
    self.responses.append(code)
    self.regs[fsp.QUEUE_TAIL] = self.regs[fsp.QUEUE_HEAD]  # the command queue is empty again

  def _refuse(self, why: str, code: int = INVALID_DATA) -> None:
    self.violations.append(why)
    self._answer(code)

  def _command(self) -> None:
    head, tail = self.regs.get(fsp.QUEUE_HEAD, 0), self.regs.get(fsp.QUEUE_TAIL, 0)
    size = tail - head + 4
    if head != 0 or size != self.written or size < 8: return self._refuse(f"an FSP command of {size} bytes (head {head:#x}) after {self.written} "
                                                                          "bytes written to EMEM")
    mctp, msg = struct.unpack_from("<II", self.emem)
    if mctp != fsp.SOM | fsp.EOM: return self._refuse(f"MCTP header {mctp:#010x}: not one packet (SOM and EOM, SEID 0, sequence 0)")
    if msg != fsp.nvdm_header(fsp.NVDM_COT): return self._refuse(f"message header {msg:#010x}: not a vendor-PCI NVIDIA COT message")
    payload = bytes(self.emem[8:size])
    n = ctypes.sizeof(fsp.CotPayload)
    if len(payload) - len(payload) % 4 != n - n % 4 or len(payload) < n: return self._refuse(f"a COT payload of {len(payload)} bytes, not {n}")
    p = fsp.CotPayload.from_buffer_copy(payload)
    if (p.version, p.size) != (2, n): return self._refuse(f"COT version {p.version} size {p.size}: GB20x's FSP takes version 2, {n} bytes")
    if not self.bus_master(): return self._refuse("the FSP read host memory with bus mastering off", INVALID_STATE)
    if (problems := self._check_cot(p)): return self._refuse("; ".join(problems))
    self.cot = p
    self._answer(0)
    self._boot_fmc(p)

  def _check_cot(self, p: Any) -> list[str]:
    fw, bad = self.fw, []
    assert isinstance(fw, FakeFirmwareGB)
    got = lambda field, n: ctypes.string_at(ctypes.addressof(p) + getattr(fsp.CotPayload, field).offset, n)
    for field, part in (("hash384", "hash"), ("signature", "signature"), ("publicKey", "publickey")):
      if got(field, len(fw.fmc[part])) != fw.fmc[part]: bad.append(f"the COT message's {part} is not the FMC file's")
    try:
      if self.dma.read(p.gspFmcSysmemOffset, len(fw.fmc["image"])) != fw.fmc["image"]: bad.append("the FMC image in host memory is not the file's")
    except KeyError: bad.append(f"the FMC image's address {p.gspFmcSysmemOffset:#x} is not host memory handed to the GPU")
    if p.frtsVidmemSize != 1 << 20 or p.frtsVidmemOffset % (2 << 20) or not 0 < p.frtsVidmemOffset < self.vram.size // 2:
      bad.append(f"FRTS of {p.frtsVidmemSize:#x} bytes at {p.frtsVidmemOffset:#x} from the end of VRAM")
    if p.frtsSysmemOffset or p.frtsSysmemSize: bad.append("a sysmem FRTS on a PF running GSP-RM")
    try: params = boot_fsp.GspFmcBootParams.from_buffer_copy(self.dma.read(p.gspBootArgsSysmemOffset, ctypes.sizeof(boot_fsp.GspFmcBootParams)))
    except KeyError: return [*bad, f"the FMC's boot parameters at {p.gspBootArgsSysmemOffset:#x} are not host memory handed to the GPU"]
    rm, args = params.bootGspRmParams, params.gspRmParams
    if (rm.target, rm.gspRmDescSize, rm.bIsGspRmBoot, args.target) != (1, 256, 1, 1):
      bad.append(f"FMC boot parameters: target {rm.target}, descriptor {rm.gspRmDescSize} bytes, GSP-RM boot {rm.bIsGspRmBoot}, "
                 f"args target {args.target}")
    try:
      self.meta_at, self.libos_at = rm.gspRmDescOffset, args.bootArgsOffset
      m = boot.GspFwWprMeta.from_buffer_copy(self.dma.read(rm.gspRmDescOffset, 256))
      self.dma.read(args.bootArgsOffset, 32)
      if (m.magic, m.revision) != (boot.WPR_META_MAGIC, boot.WPR_META_REVISION): bad.append(f"WPR metadata magic {m.magic:#x} revision {m.revision}")
      if self._radix3(m.sysmemAddrOfRadix3Elf, m.sizeOfRadix3Elf) != fw.gsp_image: bad.append("the radix-3 table does not resolve to the GSP image")
      if self.dma.read(m.sysmemAddrOfBootloader, m.sizeOfBootloader) != fw.bootloader: bad.append("the WPR metadata's bootloader is not the file's")
      if self.dma.read(m.sysmemAddrOfSignature, m.sizeOfSignature) != fw.signatures[".fwsignature_gb20x"]:
        bad.append("the WPR metadata's signature is not GB20x's")
      if m.gspFwRsvdStart or not (m.frtsSize == 1 << 20 and m.gspFwHeapSize and m.nonWprHeapSize and m.vgaWorkspaceSize):
        bad.append("the WPR metadata is not a request of sizes for the FMC to lay out")
    except (KeyError, struct.error) as e: bad.append(f"the FMC's boot parameters point outside host memory: {e}")
    return bad

  def _boot_fmc(self, p: Any) -> None:
    """The FMC's ACR: WPR2 up, the layout written back into the metadata, then GSP-RM started (or an FMC error)."""
    if self.fmc_error:
      self.regs[falcon.GSP_BASE + falcon.MAILBOX0] = self.fmc_error
      self.fmc_booted = True
      return
    m = boot.GspFwWprMeta.from_buffer_copy(self.dma.read(self.meta_at, 256))
    m.fbSize = self.vram.size
    m.frtsOffset = self.vram.size - p.frtsVidmemOffset
    m.gspFwWprEnd = m.frtsOffset + m.frtsSize
    m.bootBinOffset = (m.frtsOffset - m.sizeOfBootloader) & ~0xFFF
    m.gspFwOffset = (m.bootBinOffset - m.sizeOfRadix3Elf) & ~0xFFFF
    m.gspFwHeapOffset = (m.gspFwOffset - m.gspFwHeapSize) & ~0xFFFFF
    m.gspFwWprStart = m.gspFwHeapOffset - (1 << 20)
    m.nonWprHeapOffset = m.gspFwWprStart - m.nonWprHeapSize
    m.gspFwRsvdStart = m.nonWprHeapOffset & ~0xFFFFF
    ctypes.memmove(self.dma.resolve(self.meta_at), bytes(m), 256)
    self.meta = m
    self.regs[boot.WPR2_ADDR_HI] = m.gspFwWprEnd >> 12
    self.fmc_booted = True
    self.booter_ok = True
    self.regs[falcon.GSP_BASE + falcon.RISCV_OFFSET + falcon.RISCV_CPUCTL] = falcon.RISCV_CPUCTL_ACTIVE_STAT
    self.gsp = FakeGSP(self, libos=self.libos_at)
    self.gsp.start()

