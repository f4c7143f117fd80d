"""GPU page tables the PCI interface owns (with the kernel driver, UVM owns them), written into VRAM through BAR1, and
the VRAM they and every allocation come from: GPU-MMU version 2 (GA10x, AD10x) and version 3 (GB20x), as data.

Version 2 (open-gpu-kernel-modules 570.144 kernel-open/nvidia-uvm/hwref/turing/tu102/dev_mmu.h, NV_MMU_VER2_*): a 49-bit
VA in five levels, PDE3 (VA 48:47), PDE2 (46:38), PDE1 (37:29), PDE0 (28:21, 16-byte "dual" entries: big-page table
in the low half, small-page table in the high half) and the 4 KiB PTEs (20:12). A PDE: bit 0 IS_PTE = 0, aperture
2:1 (1 video memory), NO_ATS bit 5, the table's address >> 12 from bit 8. A PTE: VALID bit 0, aperture 2:1 (0 video
memory, 2 coherent system memory), VOL bit 3, the page's address >> 12 from bit 8, KIND 63:56 (6 generic memory).

Version 3 (kernel-open/nvidia-uvm/hwref/hopper/gh100/dev_mmu.h, NV_MMU_VER3_*; uvm_hopper_mmu.c's index bits {1, 9, 9,
9, 8} and 9 for 4 KiB PTEs, 57-bit VA; uvm_blackwell_mmu.c takes Hopper's mode): six levels, PDE4 (VA 56:56), PDE3
(55:47), PDE2 (46:38), PDE1 (37:29), PDE0 (28:21, dual: the small-page half's aperture 66:65, PCF 69:67, address
115:76) and the PTEs (20:12). A PDE: IS_PTE bit 0 = 0, aperture 2:1 (1 video), PCF 5:3 (2 VALID_CACHED_ATS_NOT_ALLOWED),
the table's address in bits 51:12 as is. A PTE: VALID bit 0, aperture 2:1, PCF 7:3 (0 REGULAR_RW_ATOMIC_CACHED_ACE,
1 the UNCACHED one for volatile system memory), KIND 11:8 (6 generic memory), the page's address in bits 51:12 as is.

After changing tables: NV_VIRTUAL_FUNCTION_PRIV_MMU_INVALIDATE (BAR0 0xB80000 + 0x30B0; ga100 and gh100 dev_vm.h; GB20x's
published dev_vm.h does not list it, so there it is unconfirmed) with ALL_VA, ALL_PDB, SYS_MEMBAR and the trigger bit 31.
"""
from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

from plugrt_nv_nvk.nvk import VASpace

PAGE = 0x1000
APERTURE_VIDEO, APERTURE_SYSTEM = 0, 2     # PTE apertures; a PDE's video-memory aperture is 1
INVALIDATE = 0xBB30B0                      # NV_VIRTUAL_FUNCTION_PRIV_MMU_INVALIDATE
INVALIDATE_ALL = 1 << 0 | 1 << 1 | 1 << 6 | 1 << 31
ADDRESS_51_12 = ((1 << 52) - 1) & ~(PAGE - 1)


@dataclass(frozen=True)
class Format:
  """One GPU-MMU page-table format: its levels (VA shift, index bits, entry bytes) from the root to the PTEs."""
  version: int
  levels: tuple[tuple[int, int, int], ...]
  va_bits: int

  def pde(self, table: int) -> int:
    if self.version == 2: return 1 << 1 | 1 << 5 | (table >> 12) << 8            # aperture video, NO_ATS, address >> 12 at bit 8
    return 1 << 1 | 2 << 3 | table & ADDRESS_51_12                                 # aperture video, PCF VALID_CACHED_ATS_NOT_ALLOWED

  def pte(self, address: int, aperture: int, volatile: bool = False) -> int:
    if self.version == 2: return 1 | aperture << 1 | (1 << 3 if volatile else 0) | (address >> 12) << 8 | 6 << 56
    return 1 | aperture << 1 | (1 if volatile else 0) << 3 | 6 << 8 | address & ADDRESS_51_12

  @property
  def root_entries(self) -> int: return 1 << self.levels[0][1]


V2 = Format(2, ((47, 2, 8), (38, 9, 8), (29, 9, 8), (21, 8, 16), (12, 9, 8)), 49)
V3 = Format(3, ((56, 1, 8), (47, 9, 8), (38, 9, 8), (29, 9, 8), (21, 8, 16), (12, 9, 8)), 57)
FORMATS = {2: V2, 3: V3}   # chips.Generation.mmu -> its format


class PageTables:
  """The tables of one VA space in format `fmt`, allocated from `heap` (VRAM addresses) and written with
  `write(addr, bytes)`. `root` is the root table's VRAM address (what SET_PAGE_DIRECTORY hands GSP-RM); `entries`
  its entry count."""

  def __init__(self, heap: VASpace, write: Callable[[int, bytes], None], invalidate: Callable[[], None], fmt: Format = V2):
    self.heap, self.write, self.invalidate, self.fmt = heap, write, invalidate, fmt
    self.tables: dict[tuple[int, int], int] = {}   # (level, VA of the range it covers) -> its VRAM address
    self.root = self._table(0, 0)
    self.entries = fmt.root_entries

  def _table(self, level: int, base: int) -> int:
    if (level, base) not in self.tables:
      addr = self.heap.alloc(PAGE, PAGE)
      self.write(addr, bytes(PAGE))
      self.tables[(level, base)] = addr
    return self.tables[(level, base)]

  def table_path(self, va: int, depth: int) -> list[int]:
    """The VRAM addresses of the tables of levels 0 .. depth-1 on the way to `va` (made where missing, each new
    table's PDE written once in its parent); depth len(fmt.levels) ends with `va`'s PTE table."""
    table, path = self.root, [self.root]
    for level, (shift, bits, size) in enumerate(self.fmt.levels[:depth - 1]):
      key = (level + 1, va >> shift << shift)
      if key not in self.tables:
        child = self._table(*key)
        # the dual PDE's small-page table lives in its high 8 bytes; its big-page half stays invalid
        entry = struct.pack("<QQ", 0, self.fmt.pde(child)) if size == 16 else struct.pack("<Q", self.fmt.pde(child))
        self.write(table + (va >> shift & ((1 << bits) - 1)) * size, entry)
      table = self.tables[key]
      path.append(table)
    return path

  def _write_ptes(self, va: int, entries: list[int]) -> None:
    """PTEs for the pages from `va`, one write per PTE table they fall in."""
    shift, bits, _ = self.fmt.levels[-1]
    done = 0
    while done < len(entries):
      at = va + done * PAGE
      n = min(len(entries) - done, (1 << bits) - (at >> shift & ((1 << bits) - 1)))
      table = self.table_path(at, len(self.fmt.levels))[-1]
      self.write(table + (at >> shift & ((1 << bits) - 1)) * 8, struct.pack(f"<{n}Q", *entries[done:done + n]))
      done += n

  def map(self, va: int, pages: list[int], aperture: int, volatile: bool = False) -> None:
    """Map the 4 KiB pages at `va` to `pages` (VRAM or bus addresses, by `aperture`), then invalidate the TLBs."""
    if va % PAGE or va + len(pages) * PAGE > 1 << self.fmt.va_bits:
      raise ValueError(f"GPU address {va:#x} (+{len(pages)} pages) outside the {self.fmt.va_bits}-bit VA")
    self._write_ptes(va, [self.fmt.pte(p, aperture, volatile) for p in pages])
    self.invalidate()

  def unmap(self, va: int, npages: int) -> None:
    self._write_ptes(va, [0] * npages)
    self.invalidate()
