"""GPU page tables the PCI interface owns (with the kernel driver, UVM owns them): GPU-MMU version 2, as GA10x and
AD10x read it, written into VRAM through BAR1, and the VRAM they and every allocation come from.

Format (open-gpu-kernel-modules 570.144 kernel-open/nvidia-uvm/hwref/turing/tu102/dev_mmu.h, NV_MMU_VER2_*): a 49-bit
VA in five levels, PDE3 (VA 48:47), PDE2 (46:38), PDE1 (37:29), PDE0 (28:21, 16-byte "dual" entries: big-page table
in the low half, small-page table in the high half) and the 4 KiB PTEs (20:12). A PDE: bit 0 IS_PTE = 0, aperture
2:1 (1 video memory), NO_ATS bit 5, the table's address >> 12 from bit 8. A PTE: VALID bit 0, aperture 2:1 (0 video
memory, 2 coherent system memory), VOL bit 3, the page's address >> 12 from bit 8, KIND 63:56 (6 generic memory).
After changing tables: NV_VIRTUAL_FUNCTION_PRIV_MMU_INVALIDATE (BAR0 0xB80000 + 0x30B0, dev_vm.h) with ALL_VA,
ALL_PDB, SYS_MEMBAR and the trigger bit 31. GPU-MMU version 3 (GB20x) is not built.
"""
from __future__ import annotations

import struct
from collections.abc import Callable

from plugrt_nv_nvk.nvk import VASpace

PAGE = 0x1000
LEVELS = ((47, 2, 8), (38, 9, 8), (29, 9, 8), (21, 8, 16), (12, 9, 8))  # (VA shift, index bits, entry bytes) from PDE3 to the PTEs
VA_BITS = 49
APERTURE_VIDEO, APERTURE_SYSTEM = 0, 2     # PTE apertures; a PDE's video-memory aperture is 1
PDE_VIDEO, PDE_NO_ATS = 1 << 1, 1 << 5
PTE_VALID, PTE_VOL, KIND_GENERIC = 1, 1 << 3, 6 << 56
INVALIDATE = 0xBB30B0                      # NV_VIRTUAL_FUNCTION_PRIV_MMU_INVALIDATE
INVALIDATE_ALL = 1 << 0 | 1 << 1 | 1 << 6 | 1 << 31


def pte(address: int, aperture: int, volatile: bool = False) -> int:
  return PTE_VALID | aperture << 1 | (PTE_VOL if volatile else 0) | (address >> 12) << 8 | KIND_GENERIC


def pde(table: int) -> int: return PDE_VIDEO | PDE_NO_ATS | (table >> 12) << 8


class PageTables:
  """The tables of one VA space, allocated from `heap` (VRAM addresses) and written with `write(addr, bytes)`.
  `root` is the PDE3 table's VRAM address (what SET_PAGE_DIRECTORY hands GSP-RM); `entries` its entry count."""

  def __init__(self, heap: VASpace, write: Callable[[int, bytes], None], invalidate: Callable[[], None]):
    self.heap, self.write, self.invalidate = heap, write, invalidate
    self.tables: dict[tuple[int, int], int] = {}   # (level, VA of the range it covers) -> its VRAM address
    self.root = self._table(0, 0)
    self.entries = 1 << LEVELS[0][1]

  def _table(self, level: int, base: int) -> int:
    if (level, base) not in self.tables:
      addr = self.heap.alloc(PAGE, PAGE)
      self.write(addr, bytes(PAGE))
      self.tables[(level, base)] = addr
    return self.tables[(level, base)]

  def table_path(self, va: int, depth: int) -> list[int]:
    """The VRAM addresses of the tables of levels 0 .. depth-1 on the way to `va` (made where missing, each new
    table's PDE written once in its parent); depth len(LEVELS) ends with `va`'s PTE table."""
    table, path = self.root, [self.root]
    for level, (shift, bits, size) in enumerate(LEVELS[:depth - 1]):
      key = (level + 1, va >> shift << shift)
      if key not in self.tables:
        child = self._table(*key)
        # the dual PDE's small-page table lives in its high 8 bytes; its big-page half stays invalid
        entry = struct.pack("<QQ", 0, pde(child)) if size == 16 else struct.pack("<Q", pde(child))
        self.write(table + (va >> shift & ((1 << bits) - 1)) * size, entry)
      table = self.tables[key]
      path.append(table)
    return path

  def _write_ptes(self, va: int, entries: list[int]) -> None:
    """PTEs for the pages from `va`, one write per PTE table they fall in."""
    shift, bits, _ = LEVELS[-1]
    done = 0
    while done < len(entries):
      at = va + done * PAGE
      n = min(len(entries) - done, (1 << bits) - (at >> shift & ((1 << bits) - 1)))
      table = self.table_path(at, len(LEVELS))[-1]
      self.write(table + (at >> shift & ((1 << bits) - 1)) * 8, struct.pack(f"<{n}Q", *entries[done:done + n]))
      done += n

  def map(self, va: int, pages: list[int], aperture: int, volatile: bool = False) -> None:
    """Map the 4 KiB pages at `va` to `pages` (VRAM or bus addresses, by `aperture`), then invalidate the TLBs."""
    if va % PAGE or va + len(pages) * PAGE > 1 << VA_BITS: raise ValueError(f"GPU address {va:#x} (+{len(pages)} pages) outside the 49-bit VA")
    self._write_ptes(va, [pte(p, aperture, volatile) for p in pages])
    self.invalidate()

  def unmap(self, va: int, npages: int) -> None:
    self._write_ptes(va, [0] * npages)
    self.invalidate()
