"""A GPU virtual address space for the driverless bring-up: GMC 11 page tables in VRAM, written by plugrt.

The format is the kernel's for GMC v11 (amdgpu_vm.h, amdgpu_vm_pt.c, gmc_v11_0.c): 48-bit virtual addresses, a
root directory (PDB2) and two more directory levels (PDB1, PDB0) of 512 8-byte entries each above 512-entry page
tables (PTB), 9 address bits per level over 4 KiB pages (`gmc.VM_NUM_LEVEL` = 3, block size 9). A directory entry
(PDE) holds the next table's physical address (64-byte aligned, bits 47:6: gmc_v11_0_get_vm_pde turns an MC address
into vram_base_offset + offset) | VALID. A page-table entry (PTE) holds the page's physical address (bits 47:12) and
the flags: VALID 0, SYSTEM 1, SNOOPED 2, TMZ 3, EXECUTABLE 4, READABLE 5, WRITEABLE 6, FRAGMENT 7-11 (log2 of the
run of contiguous, aligned pages this one belongs to, which lets the TLB cache it as one entry: amdgpu_vm_pte_fragment),
MTYPE 48-50 (soc21_enum.h: NC 0, WC 1, CC 2, UC 3; VRAM defaults to NC, gmc_v11_0_map_mtype). A context's page-table
base register gets the root's physical address | VALID (amdgpu_gmc_pd_addr).

`AddressSpace` allocates its tables from a VRAM pool plugrt chooses (`POOL_AT`), keeps the tables it changed and
writes each changed table once through the VRAM BAR (`commit`, then an HDP flush and the hubs' TLB flush by the
caller). Never run on an AMD GPU: tested by decoding the tables in the fake GPU and translating addresses there.
"""
from __future__ import annotations

import struct
from collections.abc import Callable

from plugrt.errors import PlugrtError
from plugrt_amd_pci.regs import GPURegisters

PAGE = 0x1000
ENTRIES = 512
LEVEL_SHIFTS = (39, 30, 21, 12)            # PDB2, PDB1, PDB0, PTB
VA_BITS = 48
PTE_VALID, PTE_SYSTEM, PTE_SNOOPED, PTE_TMZ = 1 << 0, 1 << 1, 1 << 2, 1 << 3
PTE_EXECUTABLE, PTE_READABLE, PTE_WRITEABLE = 1 << 4, 1 << 5, 1 << 6
FRAG_SHIFT, FRAG_MASK = 7, 0x1F << 7
MTYPE_SHIFT, MTYPE_MASK = 48, 0x7 << 48
#: GMC 12 (gmc_v12_0.c's PTE format, amdgpu_vm.h AMDGPU_PTE_MTYPE_GFX12): MTYPE is 2 bits at 54-55; the rest of a
#: 4 KiB PTE (address, fragment, permissions, VALID) and of a PDE is where GMC 11 has it. Bit 63 (AMDGPU_PTE_IS_PTE /
#: AMDGPU_PDE_PTE_GFX12) marks a directory entry used as a huge-page PTE: plugrt makes none. MTYPE values: NC 0, UC 3
#: (soc24_enum.h TCC_MTYPE / MTYPE), the same numbers as GMC 11's.
MTYPE_FORMAT = {11: (48, 0x7), 12: (54, 0x3)}    # GMC generation -> (shift, mask)
MTYPE_NC, MTYPE_WC, MTYPE_CC, MTYPE_UC = 0, 1, 2, 3
PTE_ADDR_MASK = 0x0000FFFFFFFFF000
PDE_ADDR_MASK = 0x0000FFFFFFFFFFC0
MAX_FRAGMENT = 9                            # 2 MiB (amdgpu_vm_adjust_size's fragment_size default 9 on GMC 11)
RWX = PTE_READABLE | PTE_WRITEABLE | PTE_EXECUTABLE
#: plugrt's page-table pool: 1 MiB at VRAM 14 MiB (256 tables), between the GMC scratch page (13 MiB) and the PSP's
#: buffers (16 MiB); a choice, not the kernel's (it allocates tables as VRAM BOs through TTM)
POOL_AT, POOL_SIZE = 14 << 20, 1 << 20


class VMError(PlugrtError, ValueError):
  """A mapping that cannot be made: misaligned, outside the 48-bit space, over an existing page, or no table left."""


def pte(pa: int, flags: int = RWX, fragment: int = 0, mtype: int = MTYPE_NC, gmc: int = 11) -> int:
  """A GMC 11 (or `gmc` 12) page-table entry for physical address `pa` (VRAM: vram_base_offset + offset)."""
  if pa & (PAGE - 1) or pa & ~PTE_ADDR_MASK: raise VMError(f"PTE address 0x{pa:x} is not a 4 KiB-aligned 48-bit address")
  shift, mask = MTYPE_FORMAT[gmc]
  if mtype & ~mask: raise VMError(f"MTYPE {mtype} does not fit GMC {gmc}'s {mask.bit_length()}-bit field")
  return pa | flags | PTE_VALID | (fragment & 0x1F) << FRAG_SHIFT | mtype << shift


def pde(pa: int) -> int:
  """A directory entry pointing at the table at physical address `pa`."""
  if pa & 0x3F or pa & ~PDE_ADDR_MASK: raise VMError(f"PDE address 0x{pa:x} is not a 64-byte-aligned 48-bit address")
  return pa | PTE_VALID


def fragment(va: int, pa: int, remaining: int) -> int:
  """amdgpu_vm_pte_fragment's choice for a run starting at `va`: the largest power-of-two run of pages (up to 2 MiB)
  at which both addresses are aligned and that fits in what is left to map."""
  f = 0
  while f < MAX_FRAGMENT and not (va | pa) & ((PAGE << (f + 1)) - 1) and remaining >= PAGE << (f + 1): f += 1
  return f


class AddressSpace:
  """One VMID's page tables. `map(va, offset, size)` maps VRAM at `offset` (physical `phys_base + offset`);
  `commit()` writes the changed tables; `pd_address` is what the context's page-table base register takes."""

  def __init__(self, regs: GPURegisters, phys_base: int, pool_at: int = POOL_AT, pool_size: int = POOL_SIZE, gmc: int = 11):
    if gmc not in MTYPE_FORMAT: raise VMError(f"VM: the page-table format of GMC {gmc} is not known (plugrt writes GMC 11 and 12's)")
    self.regs, self.phys_base, self.gmc = regs, phys_base, gmc
    self.pool_at, self.pool_end = pool_at, pool_at + pool_size
    self.next = pool_at
    self.tables: dict[int, bytearray] = {}   # VRAM offset -> the table's bytes
    self.dirty: dict[int, tuple[int, int]] = {}   # table -> the byte range changed since the last commit
    self.mapped: list[tuple[int, int, int, int]] = []   # (va, VRAM offset, size, flags)
    self.root = self._table()

  def _table(self) -> int:
    if self.next + PAGE > self.pool_end:
      raise VMError(f"VM: no page table left in the {(self.pool_end - self.pool_at) >> 10} KiB pool at VRAM 0x{self.pool_at:x}",
                    "map fewer, larger ranges")
    at, self.next = self.next, self.next + PAGE
    self.tables[at] = bytearray(PAGE)
    self.dirty[at] = (0, PAGE)                # a new table is written whole: the VRAM under it holds anything
    return at

  @property
  def pd_address(self) -> int: return (self.phys_base + self.root) | PTE_VALID

  def _entry(self, table: int, index: int) -> int: return struct.unpack_from("<Q", self.tables[table], index * 8)[0]

  def _set(self, table: int, index: int, value: int) -> None:
    struct.pack_into("<Q", self.tables[table], index * 8, value)
    lo, hi = self.dirty.get(table, (index * 8, index * 8 + 8))
    self.dirty[table] = (min(lo, index * 8), max(hi, index * 8 + 8))

  def _leaf(self, va: int) -> tuple[int, int]:
    """The page table and index for `va`, making the directories down to it."""
    table = self.root
    for shift in LEVEL_SHIFTS[:-1]:
      i = va >> shift & (ENTRIES - 1)
      e = self._entry(table, i)
      if not e & PTE_VALID:
        nxt = self._table()
        self._set(table, i, pde(self.phys_base + nxt))
        table = nxt
      else: table = (e & PDE_ADDR_MASK) - self.phys_base
    return table, va >> LEVEL_SHIFTS[-1] & (ENTRIES - 1)

  def map(self, va: int, offset: int, size: int, flags: int = RWX, mtype: int = MTYPE_NC) -> None:
    """Map `size` bytes of VRAM at `offset` at virtual address `va` (all 4 KiB multiples). With PTE_SYSTEM in `flags`,
    `offset` is a bus address instead (a system page: over USB, the bridge's SRAM window), not VRAM's."""
    if (va | offset | size) & (PAGE - 1) or size <= 0:
      raise VMError(f"VM: map of 0x{size:x} bytes at VA 0x{va:x} from VRAM 0x{offset:x} is not in whole 4 KiB pages")
    if va + size > 1 << VA_BITS: raise VMError(f"VM: VA 0x{va:x}+0x{size:x} is beyond the 48-bit address space")
    for a, _o, n, _ in self.mapped:
      if va < a + n and a < va + size: raise VMError(f"VM: VA 0x{va:x}+0x{size:x} overlaps the mapping at 0x{a:x}+0x{n:x}")
    pos = done = 0
    try:
      while pos < size:                # run by run: every page of a 2^f-page run carries fragment f (amdgpu_vm_ptes_update)
        base = offset if flags & PTE_SYSTEM else self.phys_base + offset
        f = fragment(va + pos, base + pos, size - pos)
        for page in range(pos, pos + (PAGE << f), PAGE):
          table, i = self._leaf(va + page)
          self._set(table, i, pte(base + page, flags, f, mtype, self.gmc))
          done = page + PAGE
        pos += PAGE << f
    except VMError:                    # no table left: clear the pages already mapped, so nothing half-mapped stays
      self._clear(va, done)
      raise
    self.mapped.append((va, offset, size, flags))

  def unmap(self, va: int) -> int:
    """Remove the mapping made at `va` (its PTEs cleared; the tables stay for the next mapping there); returns its
    size. The caller commits and flushes the TLBs before the range is used again."""
    k = next((k for k, m in enumerate(self.mapped) if m[0] == va), None)
    if k is None: raise VMError(f"VM: nothing is mapped at VA 0x{va:x}")
    n = self.mapped[k][2]
    self._clear(va, n)
    del self.mapped[k]
    return n

  def _clear(self, va: int, size: int) -> None:
    """Zero the PTEs of the `size` bytes of pages from `va`."""
    for page in range(0, size, PAGE):
      table, i = self._leaf(va + page)
      self._set(table, i, 0)

  def commit(self, flush: Callable[[], None] | None = None) -> int:
    """Write every changed table to VRAM (then the HDP flush, if given); returns how many tables were written. Of a
    table written before, only the span of its changed entries is written again: over USB each dword is bridge commands."""
    n = len(self.dirty)
    for at, (lo, hi) in sorted(self.dirty.items()): self.regs.write_vram(at + lo, bytes(self.tables[at][lo:hi]))
    self.dirty.clear()
    if flush is not None: flush()
    return n

  def describe(self) -> str:
    used = (self.next - self.pool_at) // PAGE
    return (f"page directory at VRAM 0x{self.root:x} (PDE base 0x{self.pd_address:x}), {used} tables of 4 KiB, "
            + ", ".join(f"VA 0x{a:x}+0x{n:x} -> VRAM 0x{o:x}" for a, o, n, _ in self.mapped))
