"""Host memory the GPU reaches by DMA: the GSP's message queues, its arguments, and the firmware images the booter
and the GSP's bootloader copy from system memory. The GPU needs each page's bus address.

`PagemapDMA` is the sysfs path: locked anonymous pages whose physical addresses /proc/self/pagemap gives (root only),
usable as bus addresses only when no IOMMU translates the GPU's DMA (the function's IOMMU group, if any, has type
`identity`); otherwise it refuses: DMA through the IOMMU is plugrt_nv_pci.vfio's VFIODMA (IOVAs from VFIO's type-1
container), and vfio.dma_path chooses between the two before the function is taken.
A buffer the GPU reads as one range (the bootloader and signature the booter copies, LibOS's log regions) is asked
for `contiguous`: PagemapDMA then takes it from a 2 MiB huge page (hugetlbfs pages must be reserved:
/proc/sys/vm/nr_hugepages) and checks that its frames are consecutive. Memory the NV device uses as "host" memory is
asked `at` the address it will have for the GPU too (the CPU and the GPU see one address), and given back with `free`.
Tests pass their own allocator with the same `alloc` and `free` (the fake GPU resolves the bus addresses it hands out);
`map_anonymous` is the plain mapping both paths start from.
"""
from __future__ import annotations

import ctypes
import errno
import itertools
import mmap
import os
import struct
from dataclasses import dataclass, field
from typing import Protocol

from plugrt.errors import DeviceUnavailable, Reason
from plugrt.hwqueue import libc

PAGE = 0x1000
PFN_MASK, PRESENT = (1 << 55) - 1, 1 << 63      # a /proc/self/pagemap entry (Documentation/admin-guide/mm/pagemap.rst)
MAP_LOCKED, MAP_POPULATE, MAP_HUGETLB, MAP_FIXED_NOREPLACE = 0x2000, 0x8000, 0x40000, 0x100000
HUGE = 2 << 20


@dataclass
class DMABuffer:
  """`size` bytes at CPU address `cpu`, page i at bus address `pages[i]`."""
  cpu: int
  size: int
  pages: list[int] = field(repr=False)

  def write(self, offset: int, data: bytes) -> None:
    assert 0 <= offset and offset + len(data) <= self.size
    ctypes.memmove(self.cpu + offset, data, len(data))

  def bus(self, offset: int = 0) -> int: return self.pages[offset // PAGE] + offset % PAGE


class DMAAllocator(Protocol):
  def alloc(self, size: int, contiguous: bool = False, at: int | None = None) -> DMABuffer: ...
  def free(self, buf: DMABuffer) -> None: ...
  def close(self) -> None: ...


def iommu_translates(function_dir: str) -> str:
  """Why the function's DMA would be translated by an IOMMU ("" when bus addresses are physical addresses)."""
  group = os.path.join(function_dir, "iommu_group")
  if not os.path.exists(group): return ""
  try:
    with open(os.path.join(group, "type"), encoding="ascii") as f: kind = f.read().strip()
  except OSError: kind = "unknown"
  return "" if kind == "identity" else f"its IOMMU group ({os.path.basename(os.path.realpath(group))}) translates DMA (type {kind})"


def map_anonymous(size: int, at: int | None = None, flags: int = 0) -> int:
  """`size` bytes of private anonymous memory (zeroed), at CPU address `at` when given: FileExistsError when something
  of this process is mapped there, MemoryError when the kernel gives none."""
  lib = libc()
  flags |= mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | (MAP_FIXED_NOREPLACE if at else 0)
  addr = lib.mmap(at, size, mmap.PROT_READ | mmap.PROT_WRITE, flags, -1, 0)
  failed = addr in (None, ctypes.c_void_p(-1).value)
  if at is not None and not failed and addr != at:
    lib.munmap(addr, size)
    failed = True
  if failed:
    if at is not None and ctypes.get_errno() in (0, errno.EEXIST): raise FileExistsError(f"{at:#x} is already mapped in this process")
    raise MemoryError(f"cannot map {size} bytes of host memory for the GPU")
  return addr


class PagemapDMA:
  """Locked pages with their physical addresses from /proc/self/pagemap (needs CAP_SYS_ADMIN)."""

  def __init__(self, function_dir: str):
    if (why := iommu_translates(function_dir)):
      raise DeviceUnavailable(f"host memory for the GPU: {why}", Reason.NO_DEVICE,
                              "use VFIO (PLUGRT_NV_PCI_DMA=vfio, or bind the function to vfio-pci), or boot with iommu=pt")
    self.maps: list[tuple[int, int]] = []

  def alloc(self, size: int, contiguous: bool = False, at: int | None = None) -> DMABuffer:
    """`size` bytes of locked host memory with their bus addresses; at CPU address `at` when given (FileExistsError
    when something of this process is mapped there)."""
    size = -(-max(size, 1) // PAGE) * PAGE
    huge = contiguous and size > PAGE
    if huge and at is not None: raise ValueError("contiguous host memory comes from a huge page plugrt places itself")
    if huge and size > HUGE: raise MemoryError(f"{size} bytes of contiguous host memory: plugrt takes at most one 2 MiB huge page")
    length = HUGE if huge else size
    lib = libc()
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_LOCKED | MAP_POPULATE | (MAP_HUGETLB if huge else 0) | (MAP_FIXED_NOREPLACE if at else 0)
    addr = lib.mmap(at, length, mmap.PROT_READ | mmap.PROT_WRITE, flags, -1, 0)
    if at is not None and addr not in (None, ctypes.c_void_p(-1).value) and addr != at:
      lib.munmap(addr, length)
      addr = None
    if addr in (None, ctypes.c_void_p(-1).value):
      if at is not None and ctypes.get_errno() in (0, errno.EEXIST): raise FileExistsError(f"{at:#x} is already mapped in this process")
      if huge: raise DeviceUnavailable(f"{size} bytes of contiguous host memory for the GPU: no 2 MiB huge page is free", Reason.NO_DEVICE,
                                       "reserve some: echo 8 | sudo tee /proc/sys/vm/nr_hugepages")
      raise MemoryError(f"cannot map {size} bytes of locked host memory for the GPU")
    self.maps.append((addr, length))
    ctypes.memset(addr, 0, size)
    with open("/proc/self/pagemap", "rb") as f:
      f.seek(addr // PAGE * 8)
      entries = struct.unpack(f"<{size // PAGE}Q", f.read(size // PAGE * 8))
    if any(not e & PRESENT or not e & PFN_MASK for e in entries):
      raise DeviceUnavailable("host memory for the GPU: /proc/self/pagemap gives no physical addresses to this process", Reason.NO_DEVICE,
                              "driverless access needs root (CAP_SYS_ADMIN)")
    pages = [(e & PFN_MASK) * PAGE for e in entries]
    if contiguous and any(b - a != PAGE for a, b in itertools.pairwise(pages)):
      raise DeviceUnavailable("host memory for the GPU: a huge page's frames are not consecutive", Reason.NO_DEVICE)
    return DMABuffer(addr, size, pages)

  def free(self, buf: DMABuffer) -> None:
    for i, (addr, size) in enumerate(self.maps):
      if addr == buf.cpu:
        libc().munmap(addr, size)
        del self.maps[i]
        return

  def close(self) -> None:
    for addr, size in self.maps: libc().munmap(addr, size)
    self.maps.clear()
