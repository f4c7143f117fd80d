"""Fakes below the driverless AMD interfaces: a GPU's register file and VRAM, a sysfs tree for plugrt-amd-pci, and an
ASM24xx bridge (its XDATA space and TLP engine, with PCI-to-PCI bridges and the GPU behind it) for plugrt-amd-usb.

The GPU model answers what plugrt_amd_pci.bringup touches: RCC_CONFIG_MEMSIZE, MM_INDEX/MM_INDEX_HI/MM_DATA into VRAM, the
NBIO index/data pair into a SMN space, and (FakeMP0) the PSP's C2PMSG mailbox: bootloader, sOS, KM ring and GFX commands.
The IP discovery binary in its VRAM is built with plugrt_amd_pci.discovery.build
from the documented layout; the IP blocks and register bases below are synthetic (an RDNA3-like GPU), not a real board's.
"""
from __future__ import annotations

import os
import struct
from collections.abc import Callable
from typing import Any

from plugrt_amd_pci import discovery
from plugrt_amd_pci.discovery import GCInfo, IPBlock
from plugrt_amd_pci.regs import MM_DATA, MM_INDEX, MM_INDEX_HI, RCC_CONFIG_MEMSIZE

HW = discovery.HW_ID_BY_NAME
VRAM_MIB = 16
REG_BAR_SIZE = 512 << 10
NBIO_BASES = (0x0, 0x14, 0xD20, 0x10400)
GC_BASES = (0x1260, 0xA000, 0x1C000, 0x2402C00)
MP0_BASES = (0x16000, 0xDC0000)
HDP_HOLE = 0x80000 - 0x1000        # the HDP flush remap hole (MMIO_REG_HOLE_OFFSET) and its remap register NBIO seg 2 + 0x12D
MP1_BASES = (0x16000, 0xDC0000)      # MP0 and MP1 share the MP segment: C2PMSG at 0x40+n (MP0) and 0x240+n (MP1 13.x)
MMHUB_BASES = (0x1A000, 0x2408800)


def gfx1100_blocks(gc: tuple[int, int, int] = (11, 0, 0), nbio: tuple[int, int, int] = (4, 3, 0), mp0: tuple[int, int, int] = (13, 0, 0),
                   mmhub: tuple[int, int, int] = (3, 0, 0), mp1: tuple[int, int, int] = (13, 0, 0),
                   sdma: tuple[int, int, int] = (6, 0, 0)) -> list[IPBlock]:
  """A synthetic RDNA3-like block list (versions as an RX 7900 reports them; bases made up)."""
  rows = [("GC", gc, GC_BASES), ("MP0", mp0, MP0_BASES),
          ("MP1", mp1, MP1_BASES), ("SDMA0", sdma, (0x1260, 0xA000)), ("SDMA1", sdma, (0x1260, 0xA000)),
          ("NBIF", nbio, NBIO_BASES), ("MMHUB", mmhub, MMHUB_BASES), ("HDP", (6, 0, 0), (0xF20, 0x240A400)),
          ("OSSSYS", (6, 0, 0), (0x10A0, 0x240A000)), ("UMC", (8, 10, 0), (0x14000,)), ("VCN", (4, 0, 0), (0x7800, 0x7E00))]
  return [IPBlock(HW[n], 0, *v, 0, b) for n, v, b in rows]


GC_INFO = GCInfo((1, 0), num_se=6, wave_size=32, max_waves_per_simd=16, lds_size=64, num_sa_per_se=2, num_cu_per_sh=0, num_wgp_per_sa=4)


def table(**kw) -> bytes:
  return discovery.build(gfx1100_blocks(**kw), GC_INFO, harvest=((HW["VCN"], 1),))


class FakeVRAM:
  """VRAM of `mib` MiB, stored sparsely in 64 KiB chunks (untouched memory reads 0). Also usable as a VRAM BAR window."""
  CHUNK = 1 << 16

  def __init__(self, mib: int = VRAM_MIB, dense: bool = False):
    self.size = mib << 20
    if dense: self.CHUNK = self.size       # one buffer: numpy views of it for the fake MEC's dispatches
    self.chunks: dict[int, bytearray] = {}
    self.dirty = False      # the HDP holds CPU writes not yet flushed (set by host writes, cleared by an HDP flush)
    self.seq = 0            # host writes so far; stamp: 4 KiB page -> seq of its last host write (the fake TLB checks)
    self.stamp: dict[int, int] = {}

  def _chunk(self, i: int) -> bytearray:
    if (c := self.chunks.get(i)) is None: c = self.chunks[i] = bytearray(self.CHUNK)
    return c

  def write(self, offset: int, data: bytes) -> None:
    """A host write (through the BAR or MM_DATA): it sits in the HDP until flushed."""
    self.device_write(offset, data)
    self.dirty = True
    self.seq += 1
    for page in range(offset >> 12, (offset + max(len(data), 1) - 1 >> 12) + 1): self.stamp[page] = self.seq

  def device_write(self, offset: int, data: bytes) -> None:
    """A write by the GPU's own agents (the fake PSP's responses and fences): no HDP involved."""
    assert 0 <= offset and offset + len(data) <= self.size, f"VRAM write at 0x{offset:x} (+{len(data)}) outside {self.size} bytes"
    pos = 0
    while pos < len(data):
      i, o = divmod(offset + pos, self.CHUNK)
      n = min(self.CHUNK - o, len(data) - pos)
      self._chunk(i)[o:o + n] = data[pos:pos + n]
      pos += n

  def read(self, offset: int, n: int) -> bytes:
    assert 0 <= offset and offset + n <= self.size, f"VRAM read at 0x{offset:x} (+{n}) outside {self.size} bytes"
    out = bytearray()
    while len(out) < n:
      i, o = divmod(offset + len(out), self.CHUNK)
      k = min(self.CHUNK - o, n - len(out))
      c = self.chunks.get(i)
      out += c[o:o + k] if c is not None else bytes(k)
    return bytes(out)

  put = device_write        # what was in VRAM before plugrt came
  def read32(self, offset: int) -> int: return struct.unpack("<I", self.read(offset, 4))[0]
  def write32(self, offset: int, value: int) -> None: self.write(offset, struct.pack("<I", value & 0xFFFFFFFF))


class FakeRegisters:
  """The register BAR of a fake GPU: an MMIO (read32/write32 by byte offset)."""

  def __init__(self, vram: FakeVRAM, size: int = REG_BAR_SIZE, pair: tuple[int, int] = (NBIO_BASES[1], NBIO_BASES[1] + 1),
               memsize: int | None = None):
    self.vram, self.size = vram, size
    self.regs: dict[int, int] = {RCC_CONFIG_MEMSIZE: vram.size >> 20 if memsize is None else memsize}
    self.smn: dict[int, int] = {}
    self.pair = pair
    self.log: list[tuple[str, int, int]] = []
    self.on_write: dict[int, Callable[[int], None]] = {}   # register -> model hook, called after the value is stored
    self.on_read: dict[int, Callable[[], None]] = {}       # register -> model hook, called before the value is read
    self.on_smn_write: dict[int, Callable[[int], None]] = {}   # the same for SMN byte addresses (through the pair)
    self.on_smn_read: dict[int, Callable[[], None]] = {}
    self.hdp_flushes = 0
    self.on_write[HDP_HOLE >> 2] = self._hdp_flush

  def _hdp_flush(self, value: int) -> None:
    # the register BAR's last page is HDP_MEM_FLUSH_CNTL once the NBIO's remap register points there
    if self.regs.get(NBIO_BASES[2] + 0x12D) == HDP_HOLE:
      self.vram.dirty = False
      self.hdp_flushes += 1

  def _vram_pos(self) -> int: return ((self.regs.get(MM_INDEX_HI, 0) << 31) | (self.regs.get(MM_INDEX, 0) & 0x7FFFFFFF))

  def read32(self, offset: int) -> int:
    reg = offset // 4
    if reg == MM_DATA and self.regs.get(MM_INDEX, 0) & (1 << 31): v = self.vram.read32(self._vram_pos())
    elif reg == self.pair[1]:
      if (smn_hook := self.on_smn_read.get(addr := self.regs.get(self.pair[0], 0))) is not None: smn_hook()
      v = self.smn.get(addr, 0)
    else:
      if (hook := self.on_read.get(reg)) is not None: hook()
      v = self.regs.get(reg, 0)
    self.log.append(("r", reg, v))
    return v

  def write32(self, offset: int, value: int) -> None:
    reg = offset // 4
    self.log.append(("w", reg, value))
    if reg == MM_DATA and self.regs.get(MM_INDEX, 0) & (1 << 31): self.vram.write32(self._vram_pos(), value)
    elif reg == self.pair[1]:
      self.smn[addr := self.regs.get(self.pair[0], 0)] = value
      if (smn_hook := self.on_smn_write.get(addr)) is not None: smn_hook(value)
    else:
      self.regs[reg] = value
      if (hook := self.on_write.get(reg)) is not None: hook(value)


class FakeInvalidation:
  """A hub's invalidation engine 17 (the GART's, gmc_v11_0_flush_gpu_tlb): a request sets the requested VMIDs'
  acknowledge bits; with a semaphore (the MMHUB's), it reads 1 (acquired) and a request must come while it is held and
  be released after. `hang` ("sem", "ack") stops one; `requests` lists what was asked."""
  def __init__(self, regs: FakeRegisters, sem: int | None, req: int, ack: int):
    self.r, self.sem, self.req, self.ack = regs, sem, req, ack
    self.held, self.requests, self.violations = False, [], []
    self.flushed: dict[int, int] = {}     # VMID -> the VRAM write count at its last invalidation (fake_amdq's TLB check)
    self.hang: set[str] = set()
    if sem is not None:
      regs.on_read[sem] = self._sem_read
      regs.on_write[sem] = self._sem_write
    regs.on_write[req] = self._req

  def _sem_read(self) -> None:
    if "sem" not in self.hang:
      self.r.regs[self.sem], self.held = 1, True

  def _sem_write(self, v: int) -> None:
    if v == 0: self.held = False

  def _req(self, v: int) -> None:
    if self.sem is not None and not self.held: self.violations.append(f"invalidation request 0x{v:x} without the semaphore")
    self.requests.append(v)
    self.r.regs[self.ack] = 0 if "ack" in self.hang else v & 0xFFFF
    for vmid in range(16):
      if v >> vmid & 1 and "ack" not in self.hang: self.flushed[vmid] = self.r.vram.seq


#: engine 17's SEM/REQ/ACK on MMHUB 3.0.0 (segment 0 + 0x751/0x763/0x775 + 17) and GC 11's GFXHUB (0x1699/0x16ab/0x16bd + 17)
MM_ENG17 = tuple(MMHUB_BASES[0] + off + 17 for off in (0x751, 0x763, 0x775))
GC_ENG17 = tuple(GC_BASES[0] + off + 17 for off in (0x1699, 0x16AB, 0x16BD))
#: the same on GMC 12: MMHUB 4.1.0 (0x575/0x587/0x599 + 17) and GC 12's GFXHUB (0x1635/0x1647/0x1659 + 17)
MM_ENG17_12 = tuple(MMHUB_BASES[0] + off + 17 for off in (0x575, 0x587, 0x599))
GC_ENG17_12 = tuple(GC_BASES[0] + off + 17 for off in (0x1635, 0x1647, 0x1659))


def fake_gpu(blob: bytes | None = None, mib: int = VRAM_MIB, dense: bool = False, gmc: int = 11, **kw) -> tuple[FakeRegisters, FakeVRAM]:
  """A fake GPU whose hubs answer TLB flushes where GMC `gmc` (11: RDNA3, 12: RDNA4) has its engine-17 registers."""
  vram = FakeVRAM(mib, dense)
  vram.put(vram.size - discovery.DISCOVERY_TMR_OFFSET, table() if blob is None else blob)
  regs = FakeRegisters(vram, **kw)
  regs.gmc = gmc
  mm, gc = (MM_ENG17, GC_ENG17) if gmc == 11 else (MM_ENG17_12, GC_ENG17_12)
  regs.invalidation = FakeInvalidation(regs, *mm)
  regs.gc_invalidation = FakeInvalidation(regs, None, *gc[1:])    # the GFXHUB's flush uses no semaphore
  return regs, vram


# ---- sysfs -----------------------------------------------------------------------------------------------------------

def make_sysfs(root: str, address: str = "0000:03:00.0", driver: str = "amdgpu", blob: bytes | None = None, bar0_mib: int = VRAM_MIB,
               enabled: bool = False, vram_mib: int = VRAM_MIB) -> tuple[str, str]:
  """A fake /sys/bus/pci tree with one AMD GPU: (devices dir, drivers dir). BAR files are regular files: resource5 is
  the register BAR (RCC_CONFIG_MEMSIZE set), resource0 the VRAM BAR (`bar0_mib`, the discovery table at the top of VRAM
  when it reaches that far)."""
  devices, drivers = os.path.join(root, "devices"), os.path.join(root, "drivers")
  d = os.path.join(devices, address)
  os.makedirs(d)
  os.makedirs(os.path.join(drivers, "amdgpu"))
  for n in ("bind", "unbind"): open(os.path.join(drivers, "amdgpu", n), "w").close()
  for n, v in (("vendor", "0x1002"), ("device", "0x744c"), ("class", "0x030000"), ("enable", "1" if enabled else "0")):
    with open(os.path.join(d, n), "w") as f: f.write(v + "\n")
  cfg = bytearray(256)
  struct.pack_into("<HH", cfg, 0, 0x1002, 0x744C)
  struct.pack_into("<I", cfg, 8, 0x030000C8)
  with open(os.path.join(d, "config"), "wb") as f: f.write(cfg)
  bar0, bar5 = 0xF000000000, 0xFCE00000
  lines = [(bar0, bar0 + (bar0_mib << 20) - 1, 0x14220C), (0, 0, 0), (0xF800000000, 0xF8001FFFFF, 0x14220C), (0, 0, 0),
           (0xE000, 0xE0FF, 0x40101), (bar5, bar5 + REG_BAR_SIZE - 1, 0x40200)] + [(0, 0, 0)] * 7
  with open(os.path.join(d, "resource"), "w") as f: f.write("".join(f"0x{a:016x} 0x{b:016x} 0x{c:016x}\n" for a, b, c in lines))
  regs = bytearray(REG_BAR_SIZE)
  struct.pack_into("<I", regs, RCC_CONFIG_MEMSIZE * 4, vram_mib)
  with open(os.path.join(d, "resource5"), "wb") as f: f.write(regs)
  with open(os.path.join(d, "resource0"), "wb") as f:
    f.truncate(bar0_mib << 20)
    pos = (vram_mib << 20) - discovery.DISCOVERY_TMR_OFFSET
    if pos < bar0_mib << 20:
      f.seek(pos)
      f.write(table() if blob is None else blob)
  with open(os.path.join(d, "resource2"), "wb") as f: f.truncate(2 << 20)
  if driver: os.symlink(os.path.join("..", "..", "drivers", driver), os.path.join(d, "driver"))
  return devices, drivers


class KernelWrites:
  """The kernel's part for writes into a fake sysfs tree: unbind removes the device's driver link, bind restores it."""

  def __init__(self, devices: str, drivers: str, refuse_unbind: bool = False):
    self.devices, self.drivers, self.refuse_unbind = devices, drivers, refuse_unbind
    self.log: list[tuple[str, str]] = []

  def __call__(self, path: str, text: str) -> None:
    self.log.append((os.path.relpath(path, os.path.dirname(self.devices)), text))
    if path.endswith("/driver/unbind"):
      if not self.refuse_unbind: os.unlink(os.path.join(self.devices, text, "driver"))
    elif path.endswith("/bind"):
      drv = os.path.basename(os.path.dirname(path))
      os.symlink(os.path.join("..", "..", "drivers", drv), os.path.join(self.devices, text, "driver"))
    else:
      with open(path, "w") as f: f.write(text)


SRAM_XDATA, SRAM_BUS = 0xF000, 0x200000     # the fake's own copy of where the bridge's SRAM is seen (docs/research/amd-pci.md)


# ---- the USB bridge ----------------------------------------------------------------------------------------------------

class FakeFunction:
  """Config space of one function: `bars` maps BAR index -> (size, 64-bit, prefetchable) for type-0 headers."""

  def __init__(self, vendor: int, device: int, cls: int, bridge: bool, bars: dict[int, tuple[int, bool, bool]] | None = None):
    self.cfg = bytearray(4096)
    struct.pack_into("<HH", self.cfg, 0, vendor, device)
    struct.pack_into("<I", self.cfg, 8, cls << 8)
    self.cfg[0x0E] = 1 if bridge else 0
    self.bridge, self.bars = bridge, bars or {}
    for i, (_, wide, pref) in self.bars.items(): struct.pack_into("<I", self.cfg, 0x10 + 4 * i, (4 if wide else 0) | (8 if pref else 0))

  def read(self, off: int) -> int: return struct.unpack_from("<I", self.cfg, off)[0]

  def write(self, off: int, value: int, be: int) -> None:
    old = self.read(off)
    mask = sum(0xFF << (8 * i) for i in range(4) if be >> i & 1)
    new = (old & ~mask) | (value & mask)
    if not self.bridge and 0x10 <= off < 0x28:                 # BAR semantics: size bits read back as zero
      i = (off - 0x10) // 4
      if i in self.bars:
        size, wide, pref = self.bars[i]
        new = (new & ~(size - 1) & 0xFFFFFFF0) | (4 if wide else 0) | (8 if pref else 0)
      elif i - 1 in self.bars and self.bars[i - 1][1]:         # the upper half of a 64-bit BAR
        new &= ~((self.bars[i - 1][0] - 1) >> 32) & 0xFFFFFFFF
      else: new = 0
    struct.pack_into("<I", self.cfg, off, new)

  def bar(self, i: int) -> int:
    lo = self.read(0x10 + 4 * i) & 0xFFFFFFF0
    return lo | (self.read(0x14 + 4 * i) << 32 if self.bars[i][1] else 0)

  @property
  def secondary(self) -> int: return self.cfg[0x19]
  @property
  def memory(self) -> bool: return bool(self.cfg[4] & 2)


class FakeASM24:
  """An ASM24xx bridge as a Transport: vendor CDBs on an XDATA space whose TLP engine reaches a chain of PCI-to-PCI bridges
  (buses 0-3) and a GPU (bus 4) with a register BAR (BAR5, FakeRegisters) and a small VRAM BAR (BAR0, FakeVRAM)."""

  def __init__(self, regs: FakeRegisters, vram: FakeVRAM, bar0_size: int = 8 << 20, gpu_bus: int = 4):
    from plugrt_amd_usb import asm24
    self.a = asm24
    self.xdata = bytearray(0x20000)
    self.regs, self.vram, self.gpu_bus = regs, vram, gpu_bus
    ids = [(0x174C, 0x2464), (0x174C, 0x2464), (0x1002, 0x1478), (0x1002, 0x1479)]
    self.funcs = {bus: FakeFunction(*ids[bus % 4], 0x060400, True) for bus in range(gpu_bus)}
    self.funcs[gpu_bus] = FakeFunction(0x1002, 0x744C, 0x030000, False,
                                       {0: (bar0_size, True, True), 2: (2 << 20, True, True), 5: (REG_BAR_SIZE, False, False)})
    self.commands = 0
    self.fail_next = 0          # TLP engine error reports to inject before the next completion
    self.tlps: list[tuple[int, int]] = []
    self.sram = bytearray(0x80000)      # the bridge's SRAM: XDATA 0xF000.. for its controller, bus 0x200000.. for the GPU
    self.sram_pos, self.sram_last, self.sram_commands = 0, 0, 0
    self.sram_unacked: list[int] = []
    self.sram_violations: list[str] = []
    self.doorbells: Any = None          # BAR2's target (a FakeMEC's FakeDoorbells), when a test gives one
    self.SRAM_BUS = SRAM_BUS

  def execute(self, cdb: bytes, read: int = 0, data: bytes = b"") -> bytes:
    self.commands += 1
    if cdb[0] == 0x8A: return self._write16(cdb, read, data)
    assert not data, f"data-out phase on {cdb.hex()}"
    op, val, hi, lo, _ = struct.unpack(">BBBHB", cdb)
    addr = ((hi << 16) | lo)
    assert addr & 0xFF0000 in (0x500000, 0x510000), f"XDATA select missing in {cdb.hex()}"
    addr &= 0x1FFFF
    if op == self.a.CDB_XDATA_READ:
      assert read == val
      if addr >= SRAM_XDATA: return bytes(self.sram[addr - SRAM_XDATA:addr - SRAM_XDATA + val])
      return bytes(self.xdata[addr:addr + val])
    assert op == self.a.CDB_XDATA_WRITE and read == 0, cdb.hex()
    if addr == self.a.TLP_STATUS:
      if val == self.a.TLP_START: self._run()
      elif val == self.a.TLP_ERROR: self.xdata[addr] = 0
      return b""
    self.xdata[addr] = val
    self._sram_ack(addr, val)
    return b""

  # the SRAM window (plugrt_amd_usb.sram): the fake's model of the burst protocol, inferred from how the public reference
  # drives it (not documented): a WRITE(16) lands at the burst's write position, which advances; the position returns to 0
  # when a burst ends (the four 0xCE40.. zero writes, or the acks of a burst of one command of at most 16 KiB)
  def _write16(self, cdb: bytes, read: int, data: bytes) -> bytes:
    _, flags, lba, sectors, group, control = struct.unpack(">BBQIBB", cdb)
    if read or len(data) != sectors * 512 or (flags, lba, group, control) != (0, 0, 0, 0):
      self.sram_violations.append(f"WRITE(16) {cdb.hex()} with {len(data)} bytes out, {read} in")
    if self.sram_unacked: self.sram_violations.append("WRITE(16) before the previous one was acknowledged (0x171, 0xCE6E)")
    if self.sram_pos + len(data) > len(self.sram): raise AssertionError(f"SRAM burst past {len(self.sram)} bytes")
    self.sram[self.sram_pos:self.sram_pos + len(data)] = data
    self.sram_pos += len(data)
    self.sram_unacked, self.sram_last = [0x171, 0x172, 0x173, 0xCE6E, 0xCE6F], len(data)
    self.sram_commands += 1
    return b""

  def _sram_ack(self, addr: int, val: int) -> None:
    if self.sram_unacked and addr == self.sram_unacked[0]:
      if val != (0xFF if addr < 0x200 else 0): self.sram_violations.append(f"SRAM ack 0x{addr:x} <- 0x{val:02x}")
      self.sram_unacked.pop(0)
      if not self.sram_unacked and self.sram_last <= 0x4000 and self.sram_pos == self.sram_last: self.sram_pos = 0
    elif 0xCE40 <= addr <= 0xCE43:
      if all(self.xdata[0xCE40 + i] == 0 for i in range(4)) and addr == 0xCE43: self.sram_pos = 0

  def dma_read(self, bus: int, n: int) -> bytes:
    """What the GPU reads at PCIe bus address `bus` (only the SRAM window answers)."""
    assert SRAM_BUS <= bus and bus + n <= SRAM_BUS + len(self.sram), f"GPU DMA read at bus 0x{bus:x} (+{n}) outside the SRAM window"
    return bytes(self.sram[bus - SRAM_BUS:bus - SRAM_BUS + n])

  def _route(self, bus: int) -> bool:
    """Bus 0 is the bridge's own; bus n > 0 is reachable when the bridge on bus n-1 forwards to it."""
    return bus == 0 or (bus - 1 in self.funcs and self.funcs[bus - 1].bridge and self.funcs[bus - 1].secondary == bus and self._route(bus - 1))

  def _run(self) -> None:
    x = self.xdata
    fmt, be = x[self.a.TLP_FMT_TYPE], x[self.a.TLP_BYTE_ENABLE]
    address = struct.unpack_from(">I", x, self.a.TLP_ADDR_LO)[0] | struct.unpack_from(">I", x, self.a.TLP_ADDR_HI)[0] << 32
    data = struct.unpack_from(">I", x, self.a.TLP_DATA)[0]
    self.tlps.append((fmt, address))
    if self.fail_next:
      self.fail_next -= 1
      x[self.a.TLP_STATUS] = self.a.TLP_ERROR
      return
    status, out, with_data, count = 0, 0, fmt in (self.a.CFGRD0, self.a.CFGRD1, self.a.MRD32), 4
    if fmt in (self.a.CFGRD0, self.a.CFGRD1, self.a.CFGWR0, self.a.CFGWR1):
      bus, dev, fn, off = address >> 24, (address >> 19) & 31, (address >> 16) & 7, address & 0xFFC
      if (fmt & 1) != (bus > 0) or dev or fn or bus not in self.funcs or not self._route(bus): status = 1
      elif fmt & 0x40: self.funcs[bus].write(off, data, be)
      else: out = self.funcs[bus].read(off)
    elif fmt in (self.a.MRD32, self.a.MWR32):
      gpu = self.funcs[self.gpu_bus]
      count = bin(be).count("1")
      target = None
      if gpu.memory and self._route(self.gpu_bus):
        for i, dev_ in ((5, self.regs), (0, self.vram), (2, self.doorbells)):
          if dev_ is not None and gpu.bar(i) <= address < gpu.bar(i) + gpu.bars[i][0]:
            target = (dev_, address - gpu.bar(i) + (self._vram_window() if i == 0 else 0))
      if target is None: status = 1
      elif fmt == self.a.MWR32: target[0].write32(target[1], data)
      else: out = target[0].read32(target[1])
    else: status = 1
    if status: with_data = False
    struct.pack_into(">I", x, self.a.TLP_DATA, out)
    struct.pack_into(">H", x, self.a.TLP_COMPLETION, status << 13 | count)
    x[self.a.TLP_CPL_FLAGS] = int(with_data)
    x[self.a.TLP_STATUS] = self.a.TLP_DONE

  def _vram_window(self) -> int: return 0     # BAR0 shows VRAM from offset 0


class FakeGART:
  """The MMHUB's context 0 (the GART: a flat table) as the fake PSP's reads outside the FB see it: MC address -> PTE
  in the VRAM table the context's registers name -> a system page, served by `system(bus, n)` (the fake bridge's SRAM
  window). Checks the context (enabled, depth 0, range), the PTE (valid, system, readable) and that the table page
  was TLB-flushed (engine 17, VMID 0) after its last write; problems go to `violations` (the read returns zeros)."""
  CNTL, BASE, START, END = 0x740, 0x7AB, 0x7CB, 0x7EB     # MMHUB 3.0.0 context-0 registers (segment 0), the fake's own copy
  REGS_12 = (0x564, 0x5CF, 0x5EF, 0x60F)                  # MMHUB 4.1.0's (GMC 12), as fake_amdq.HUB_REGS_12

  def __init__(self, regs: FakeRegisters, system: Callable[[int, int], bytes], phys_base: int = 0):
    self.r, self.system, self.phys = regs, system, phys_base
    self.violations: list[str] = []
    self.pages: set[int] = set()          # system pages read through the GART
    if getattr(regs, "gmc", 11) == 12: self.CNTL, self.BASE, self.START, self.END = self.REGS_12

  def _reg64(self, off: int) -> int:
    lo = MMHUB_BASES[0] + off
    return self.r.regs.get(lo, 0) | self.r.regs.get(lo + 1, 0) << 32

  def _page(self, mc: int) -> int | None:
    cntl = self.r.regs.get(MMHUB_BASES[0] + self.CNTL, 0)
    start, end, base = self._reg64(self.START), self._reg64(self.END), self._reg64(self.BASE)
    page = mc >> 12
    if not cntl & 1 or cntl >> 1 & 3: return self.violations.append(f"GART read at MC 0x{mc:x}: context 0 CNTL 0x{cntl:x}")
    if not start <= page <= end or not base & 1: return self.violations.append(f"GART read at MC 0x{mc:x}: outside 0x{start:x}-0x{end:x}")
    at = (base & ~0xFFF) - self.phys + (page - start) * 8
    pte = self.r.vram.read32(at) | self.r.vram.read32(at + 4) << 32
    if pte & 0x23 != 0x23: return self.violations.append(f"GART read at MC 0x{mc:x}: PTE 0x{pte:x} not valid+system+readable")
    if self.r.vram.stamp.get(at >> 12, 0) > self.r.invalidation.flushed.get(0, -1):
      return self.violations.append(f"GART read at MC 0x{mc:x}: its PTE changed after the last TLB flush of VMID 0")
    return pte & 0x0000FFFFFFFFF000

  def read(self, mc: int, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
      a = mc + len(out)
      k = min(0x1000 - (a & 0xFFF), n - len(out))
      pa = self._page(a)
      if pa is None: return bytes(n)
      self.pages.add(pa)
      out += self.system(pa + (a & 0xFFF), k)
    return bytes(out)


def fake_amdgpu_init_writes(fake: FakeASM24) -> list[tuple[int, bytes]]:
  """The controller set-up writes the bridge saw (CONTROLLER_INIT's addresses, in order), as (address, bytes)."""
  from plugrt_amd_usb.asm24 import CONTROLLER_INIT
  return [(a, bytes(fake.xdata[a:a + len(d)])) for a, d in CONTROLLER_INIT]


# ---- the PSP (MP0) -----------------------------------------------------------------------------------------------------

MC_BASE = 0x8000 << 24            # what MMMC_VM_FB_LOCATION_BASE reports on RDNA3 boards (VRAM at MC 0x80_0000_0000)
FB_LOCATION_BASE = {(3, 0, 0): 0x8EC, (3, 0, 2): 0x86C, (4, 1, 0): 0x554}     # MMHUB version -> register offset in segment 0
# the fake's own copy of the kernel's enums (amdgpu_psp.h, psp_gfx_if.h, amdgpu_ucode.h), kept apart from plugrt_amd_pci.psp
BL_COMMANDS = {0x80000: "kdb", 0x10000000: "spl", 0x10000: "sys_drv", 0xB0000: "soc_drv", 0xD0000: "intf_drv", 0xC0000: "dbg_drv",
               0xE0000: "ras_drv", 0xF0000: "ipkeymgr_drv", 0x20000: "sos"}
KERNEL_ORDER = ("kdb", "spl", "sys_drv", "soc_drv", "intf_drv", "dbg_drv", "ras_drv", "ipkeymgr_drv", "sos")
FW_TYPES = {"sos": 1, "sys_drv": 2, "kdb": 3, "toc": 4, "spl": 5, "soc_drv": 7, "intf_drv": 8, "dbg_drv": 9, "ras_drv": 10,
            "ipkeymgr_drv": 11}


def sos_file(parts: tuple[str, ...] = ("sos", "sys_drv", "kdb", "toc", "spl", "soc_drv", "intf_drv", "dbg_drv", "ras_drv"),
             sizes: dict[str, int] | None = None, **kw) -> bytes:
  """A psp_13_0_0_sos.bin-shaped file (v2 header) whose binaries are distinct byte patterns."""
  from plugrt_amd_pci import psp_firmware
  sizes = sizes or {}
  out = []
  for i, name in enumerate(parts):
    n = sizes.get(name, 0x300 + 0x40 * i)
    out.append((FW_TYPES[name], 0x100 + i, bytes((i * 37 + j) & 0xFF for j in range(n))))
  return psp_firmware.build(out, **kw)


class FakeMP0:
  """The PSP as the kernel's psp_v13_0.c / amdgpu_psp.c expect it to answer, on a FakeRegisters + FakeVRAM.

  Bootloader: C2PMSG_35 bit 31 is ready; a command written there is checked (the bootloader was ready, the buffer at
  C2PMSG_36 << 20 (an MC address: VRAM, or through `gart`) holds the file's binary for that command, the kernel's order) and answered by
  clearing bit 31 for `busy_reads` reads. The sOS command makes C2PMSG_81 non-zero and C2PMSG_64 ready. Ring: type 2
  << 16 in C2PMSG_64 with C2PMSG_69/70/71 creates it; 0x30000 destroys it. A write of C2PMSG_67 runs each new 64-byte
  frame: the command buffer is decoded (LOAD_TOC checks the TOC bytes and answers `tmr_size`; SETUP_TMR checks
  alignment and size), the response status is written (`status` overrides per command id) and then the fence.
  `bl_error` makes the bootloader report an error code for a component. `hang` stops one stage from answering:
  "bootloader", "sos", "ring" or "fence". Problems are listed in `violations`. `handlers` takes more GFX commands
  (fake_amdfw.FakeIPFirmware adds LOAD_IP_FW and AUTOLOAD_RLC)."""

  def __init__(self, regs: FakeRegisters, vram: FakeVRAM, sos: bytes, mp0: tuple[int, int, int] = (13, 0, 0), mc_base: int = MC_BASE,
               mmhub: tuple[int, int, int] = (3, 0, 0), tmr_size: int = 0x500000, busy_reads: int = 2, sos_alive: int = 0):
    from plugrt_amd_pci import psp_firmware
    self.r, self.vram, self.mc_base, self.version = regs, vram, mc_base, mp0
    self.fw = psp_firmware.parse(sos)
    self.tmr_size, self.busy_reads, self.busy = tmr_size, busy_reads, 0
    self.loaded: list[str] = []
    self.commands: list[tuple[int, bytes]] = []
    self.violations: list[str] = []
    self.status: dict[int, int] = {}
    self.hang: set[str] = set()
    self.bl_error: dict[str, int] = {}    # component -> error code the bootloader reports in C2PMSG_35 bits 7:0
    self.ring: tuple[int, int] | None = None
    self.rptr = 0
    self.tmr: tuple[int, int, int] | None = None
    self.destroyed = 0
    self.tmr_asked = 0                # the TMR size LOAD_TOC answered (0: no TOC loaded)
    self.handlers: dict[int, Callable[[bytes], int]] = {}   # more GFX commands: cmd id -> handler(payload) -> status
    self.check_hdp = True             # a frame must follow an HDP flush of what the CPU wrote (psp_ring_cmd_submit)
    self.gart: Callable[[int, int], bytes] | None = None   # reads outside the FB (the GART: FakeGART.read), when set
    self.buffers: list[int] = []      # MC addresses of the bootloader's and LOAD_TOC's buffers, in order
    regs.regs[MMHUB_BASES[0] + FB_LOCATION_BASE[mmhub]] = mc_base >> 24
    self.reg(35, 0 if busy_reads else 1 << 31)    # the bootloader comes up ready after `busy_reads` reads, as after power-on
    self.busy = busy_reads
    self.reg(81, sos_alive)
    self.reg(64, (1 << 31) if sos_alive else 0)
    regs.on_write[self.at(35)] = self._bootloader
    regs.on_read[self.at(35)] = self._tick
    regs.on_write[self.at(64)] = self._ring_ctrl
    regs.on_write[self.at(67)] = self._wptr

  def at(self, n: int) -> int: return MP0_BASES[0] + 0x40 + n

  def read_mc(self, mc: int, n: int) -> bytes:
    """What the PSP reads at MC address `mc`: VRAM inside the FB, else through `gart`."""
    if self.mc_base <= mc < self.mc_base + self.vram.size: return self.vram.read(mc - self.mc_base, n)
    if self.gart is None: raise AssertionError(f"PSP read at MC 0x{mc:x}: outside the FB and no GART modelled")
    return self.gart(mc, n)
  def reg(self, n: int, value: int | None = None) -> int:
    if value is not None: self.r.regs[self.at(n)] = value
    return self.r.regs.get(self.at(n), 0)

  def _tick(self) -> None:
    if self.busy:
      self.busy -= 1
      if not self.busy: self.reg(35, 1 << 31)

  def expected_order(self) -> list[str]:
    return [n for n in KERNEL_ORDER if self.fw.get(n) is not None and (n != "ipkeymgr_drv" or self.version[0] >= 14)]

  def _bootloader(self, cmd: int) -> None:
    name = BL_COMMANDS.get(cmd)
    if self.was_busy or name is None:
      self.violations.append(f"bootloader command 0x{cmd:x} written while busy" if self.was_busy else f"unknown bootloader command 0x{cmd:x}")
      return
    addr = self.reg(36) << 20
    src = "kdb" if name == "spl" else name        # both PSP 13 and 14 send the KDB image with the SPL command
    want = self.fw.get(src).data
    if self.read_mc(addr, len(want)) != want: self.violations.append(f"{name}: buffer does not hold the file's {src}")
    self.buffers.append(addr)
    if self.reg(81): self.violations.append(f"{name} loaded while the sOS runs")
    self.loaded.append(name)
    if name == "sos":
      if self.loaded != self.expected_order(): self.violations.append(f"load order {self.loaded}, the kernel's is {self.expected_order()}")
      if "sos" not in self.hang:
        self.reg(81, self.fw.header.ucode_version)
        self.reg(64, 1 << 31)
      return
    if "bootloader" in self.hang:
      self.reg(35, 0)
      return
    if name in self.bl_error:          # done, with an error code in bits 7:0 (PSP 13.0.6 and newer, per psp_v13_0.c)
      self.reg(35, (1 << 31) | self.bl_error[name])
      return
    self.reg(35, 0)
    self.busy = self.busy_reads
    if not self.busy: self.reg(35, 1 << 31)

  @property
  def was_busy(self) -> bool:       # the value before the driver's write landed: bit 31 clear while a load runs
    return self.busy > 0

  def _ring_ctrl(self, value: int) -> None:
    if value == 0x30000:
      self.ring, self.destroyed = None, self.destroyed + 1
      self.reg(64, 1 << 31)
      return
    if value != 2 << 16:
      self.violations.append(f"unknown ring control 0x{value:x}")
      return
    if not self.reg(81): self.violations.append("ring created before the sOS runs")
    if self.ring is not None: self.violations.append("ring created twice without destroying it")
    self.ring = ((self.reg(70) << 32 | self.reg(69)) - self.mc_base, self.reg(71))
    self.rptr = self.reg(67)
    self.reg(64, 0 if "ring" in self.hang else 1 << 31)

  def _wptr(self, wptr: int) -> None:
    if self.ring is None:
      self.violations.append("write pointer moved with no ring")
      return
    ring, size = self.ring
    if self.check_hdp and self.r.vram.dirty: self.violations.append("write pointer moved while CPU writes sit in the HDP (no flush)")
    while self.rptr != wptr:
      frame = self.vram.read(ring + self.rptr * 4, 64)
      lo, hi, _, flo, fhi, fence = struct.unpack_from("<6I", frame)
      self.rptr = (self.rptr + 16) % (size // 4)
      cmd_at, fence_at = (hi << 32 | lo) - self.mc_base, (fhi << 32 | flo) - self.mc_base
      buf = bytearray(self.vram.read(cmd_at, 1024))
      size_, version, cmd_id = struct.unpack_from("<III", buf)
      if (size_, version) != (1024, 1): self.violations.append(f"command buffer size/version {size_}/{version}")
      payload = bytes(buf[28:64])
      self.commands.append((cmd_id, payload))
      status, tmr = self.status.get(cmd_id, 0), 0
      if cmd_id == 0x20:                        # LOAD_TOC
        lo, hi, n = struct.unpack_from("<III", payload)
        toc = self.fw.get("toc").data
        if n != len(toc) or self.read_mc(hi << 32 | lo, n) != toc: self.violations.append("LOAD_TOC: buffer is not the TOC")
        self.buffers.append(hi << 32 | lo)
        tmr = self.tmr_asked = self.tmr_size
      elif cmd_id == 0x5:                       # SETUP_TMR
        lo, hi, n, flags, plo, phi = struct.unpack_from("<6I", payload)
        at = (hi << 32 | lo) - self.mc_base
        if at % (1 << 20) or n < self.tmr_asked or not flags & 2: self.violations.append(f"SETUP_TMR: at 0x{at:x} size 0x{n:x} flags {flags}")
        self.tmr = (at, n, phi << 32 | plo)
      elif (handler := self.handlers.get(cmd_id)) is not None:     # LOAD_IP_FW, AUTOLOAD_RLC: fake_amdfw.FakeIPFirmware
        answered = handler(payload)
        status = self.status.get(cmd_id, answered)
      elif cmd_id not in self.status: status = 0x100
      struct.pack_into("<I", buf, 864, status)
      struct.pack_into("<I", buf, 880, tmr)
      self.vram.device_write(cmd_at, bytes(buf))
      if "fence" not in self.hang: self.vram.device_write(fence_at, struct.pack("<I", fence))
