"""A PCI function through Linux sysfs, for the driverless interfaces (AMD's and NV's PCI): its config space, its
`resource` list, its BARs mapped from `resourceN`, taking it from its kernel driver and giving it back.

Every path is under `root` (default /sys/bus/pci/devices) and `drivers` (default /sys/bus/pci/drivers), so tests run
against a fake tree in a temporary folder whose `resourceN` files are regular files; writes go through
`write(path, text)`, where a fake tree plays the kernel's part (removing the `driver` link on unbind). What take() and
bus_master() changed (the driver unbound, the function enabled, bus mastering turned on) is recorded, and release()
undoes exactly that, resetting the function first where the caller changed the device's state (`reset_on_release`).

sysfs resource files, not VFIO: mapping a BAR needs only `resourceN` (root: the files are mode 0600); VFIO would add DMA
mapping through the IOMMU and interrupts, and would need the function bound to vfio-pci.
"""
from __future__ import annotations

import ctypes
import errno
import mmap
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass

from plugrt.errors import DeviceUnavailable, Reason
from plugrt.hwqueue import libc

PCI_DEVICES = "/sys/bus/pci/devices"
PCI_DRIVERS = "/sys/bus/pci/drivers"
IORESOURCE_IO, IORESOURCE_MEM = 0x100, 0x200     # flags of a `resource` line (include/linux/ioport.h)
PCI_COMMAND, PCI_COMMAND_MASTER = 0x04, 1 << 2   # config space: the command register and its bus-master enable bit (pci_regs.h)
_MAP_SHARED, _MAP_FIXED_NOREPLACE = 0x01, 0x100000


def read_text(path: str) -> str:
  """A sysfs attribute's text, stripped; "" when it cannot be read."""
  try:
    with open(path, encoding="ascii", errors="replace") as f: return f.read().strip()
  except OSError: return ""


def write_text(path: str, text: str) -> None:
  with open(path, "w", encoding="ascii") as f: f.write(text)


def driver_of(function_dir: str) -> str:
  """The kernel driver bound to the function in `function_dir` ("" when none)."""
  link = os.path.join(function_dir, "driver")
  return os.path.basename(os.path.realpath(link)) if os.path.lexists(link) else ""


def vfio_available(dev: str = "/dev/vfio") -> bool: return os.path.isdir(dev)


@dataclass(frozen=True)
class Resource:
  """One line of a function's sysfs `resource` file: a BAR's bus address range (inclusive; end 0: unused) and flags."""
  start: int
  end: int
  flags: int

  @property
  def size(self) -> int: return self.end - self.start + 1 if self.end else 0
  @property
  def is_memory(self) -> bool: return bool(self.flags & IORESOURCE_MEM)


class MappedBAR:
  """One BAR mmapped from its sysfs resource file: 32- and 64-bit register access, byte-exact copies, the CPU address
  of an offset (for plain stores: a doorbell), and parts of it mapped again at a chosen CPU address."""

  def __init__(self, path: str, index: int, size: int):
    self.path, self.index = path, index
    fd = os.open(path, os.O_RDWR | os.O_SYNC)
    try:
      length = min(size, os.fstat(fd).st_size) if os.fstat(fd).st_size else size
      self.map = mmap.mmap(fd, length, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally: os.close(fd)
    self.size = length
    self.view: memoryview | None = memoryview(self.map)

  def out_of_range(self, message: str) -> Exception:
    """The error for an access outside the BAR (an interface raises its own register error)."""
    return DeviceUnavailable(message, Reason.NO_DEVICE)

  def _span(self, offset: int, n: int, what: str, align: int = 1) -> memoryview:
    if self.view is None: raise DeviceUnavailable(f"BAR{self.index} is unmapped", Reason.NO_DEVICE)
    if offset < 0 or n < 0 or offset + n > self.size:
      raise self.out_of_range(f"{what} of {n} bytes at {offset:#x} outside BAR{self.index} ({self.size} bytes)")
    if offset % align: raise self.out_of_range(f"{what} of {n} bytes at {offset:#x} in BAR{self.index}: not {align}-byte aligned")
    return self.view

  def read32(self, offset: int) -> int: return struct.unpack_from("<I", self._span(offset, 4, "read", 4), offset)[0]
  def write32(self, offset: int, value: int) -> None: struct.pack_into("<I", self._span(offset, 4, "write", 4), offset, value & 0xFFFFFFFF)
  def write64(self, offset: int, value: int) -> None:
    """One 8-byte store (a 64-bit doorbell)."""
    struct.pack_into("<Q", self._span(offset, 8, "write", 8), offset, value & 0xFFFFFFFFFFFFFFFF)
  def read(self, offset: int, n: int) -> bytes: return bytes(self._span(offset, n, "read")[offset:offset + n])
  def write(self, offset: int, data: bytes) -> None:
    """Byte-exact CPU stores (a buffer's bytes through a VRAM BAR)."""
    self._span(offset, len(data), "write")[offset:offset + len(data)] = data

  def address(self, offset: int) -> int:
    """The CPU address of `offset` in the mapping (for plain stores: the doorbell)."""
    view = self._span(offset, 4, "address")
    return ctypes.addressof(ctypes.c_char.from_buffer(view.obj)) + offset  # type: ignore[arg-type]

  def map_at(self, va: int, offset: int, size: int) -> None:
    """Map [offset, offset + size) of the BAR at CPU address `va` too (VRAM the CPU writes at its GPU address)."""
    if offset < 0 or offset + size > self.size:
      raise MemoryError(f"BAR{self.index} is {self.size >> 20} MiB: it does not reach {offset + size:#x} "
                        "(resize it, or use memory below that)")
    fd = os.open(self.path, os.O_RDWR | os.O_SYNC)
    try: addr = libc().mmap(va, size, mmap.PROT_READ | mmap.PROT_WRITE, _MAP_SHARED | _MAP_FIXED_NOREPLACE, fd, offset)
    finally: os.close(fd)
    if addr in (None, ctypes.c_void_p(-1).value) or addr != va:
      err = ctypes.get_errno()
      if addr not in (None, ctypes.c_void_p(-1).value): libc().munmap(addr, size)
      if err == errno.EEXIST: raise FileExistsError(f"{va:#x} is already mapped in this process")
      raise DeviceUnavailable(f"cannot map BAR{self.index} at {va:#x}: {os.strerror(err)}", Reason.NO_DEVICE)

  def unmap_at(self, va: int, size: int) -> None: libc().munmap(va, size)

  def close(self) -> None:
    if self.view is not None:
      self.view.release()
      self.view = None
      self.map.close()


class PCIFunction:
  """The PCI function `address` (0000:03:00.0) under `root`. An interface derives from it where it adds its rules (the
  acknowledgement it asks for before take(), its BARs' error type)."""
  bar_type: type[MappedBAR] = MappedBAR
  missing_hint = "list them with lspci -D"

  def __init__(self, address: str, root: str = PCI_DEVICES, drivers: str = PCI_DRIVERS, write: Callable[[str, str], None] | None = None):
    self.address, self.root, self.drivers = address, root, drivers
    self.dir = os.path.join(root, address)
    self.write = write or write_text
    self.unbound_driver = ""        # the driver take() unbound; release() binds it back
    self.enabled_by_us = False
    self.master_by_us = False
    self.reset_on_release = False   # set by the caller once it changed the device's state: release() resets the function
    self.bars: dict[int, MappedBAR] = {}
    if not os.path.isdir(self.dir):
      raise DeviceUnavailable(f"no PCI function {address} ({self.dir} does not exist)", Reason.NO_DEVICE, self.missing_hint)

  def path(self, name: str) -> str: return os.path.join(self.dir, name)
  def driver(self) -> str: return driver_of(self.dir)
  def unbind_command(self) -> str: return f"echo {self.address} | sudo tee {self.path('driver/unbind')}"

  def config_bytes(self, offset: int, n: int) -> bytes:
    """`n` bytes of config space from `offset` (sysfs `config`; unprivileged users see only the first 64 bytes)."""
    try:
      with open(self.path("config"), "rb") as f:
        f.seek(offset)
        data = f.read(n)
    except OSError as e:
      raise DeviceUnavailable(f"{self.address}: cannot read config space: {e}", Reason.NO_DEVICE) from None
    if len(data) != n:
      raise DeviceUnavailable(f"{self.address}: config space read at 0x{offset:x} returned {len(data)} of {n} bytes",
                              Reason.NO_DEVICE, "run as root to read past the first 64 bytes")
    return data

  def resources(self) -> list[Resource]:
    """The `resource` file: one (start, end, flags) line per BAR (then ROM and bridge windows)."""
    try:
      with open(self.path("resource"), encoding="ascii") as f: lines = f.read().split("\n")
    except OSError as e:
      raise DeviceUnavailable(f"{self.address}: cannot read its resource list: {e}", Reason.NO_DEVICE) from None
    return [Resource(*(int(x, 16) for x in ln.split()[:3])) for ln in lines if ln.strip()]

  def take(self) -> None:
    """Make the function ours: unbind its driver and enable it. The caller has the user's acknowledgement."""
    if (drv := self.driver()):
      self._write(self.path("driver/unbind"), self.address, f"unbind {drv}")
      if self.driver():
        raise DeviceUnavailable(f"{self.address}: still bound to {drv} after writing driver/unbind", Reason.NO_DEVICE,
                                "another program holds it (close it), or unbind it by hand: " + self.unbind_command())
      self.unbound_driver = drv
    if read_text(self.path("enable")) in ("", "0"):
      self._write(self.path("enable"), "1", "enable")
      self.enabled_by_us = True

  def bus_master(self) -> None:
    """Turn on bus mastering (the device's DMA into host memory) in config space, if it is off."""
    try:
      fd = os.open(self.path("config"), os.O_RDWR)
      try:
        (cmd,) = struct.unpack("<H", os.pread(fd, 2, PCI_COMMAND))
        if not cmd & PCI_COMMAND_MASTER:
          os.pwrite(fd, struct.pack("<H", cmd | PCI_COMMAND_MASTER), PCI_COMMAND)
          self.master_by_us = True
      finally: os.close(fd)
    except PermissionError:
      raise DeviceUnavailable(f"{self.address}: no permission to write its config space", Reason.NO_DEVICE, "driverless access needs root") from None
    except (OSError, struct.error) as e:
      raise DeviceUnavailable(f"{self.address}: cannot turn on bus mastering: {e}", Reason.NO_DEVICE) from None

  def _bus_master_off(self) -> str:
    try:
      fd = os.open(self.path("config"), os.O_RDWR)
      try:
        (cmd,) = struct.unpack("<H", os.pread(fd, 2, PCI_COMMAND))
        os.pwrite(fd, struct.pack("<H", cmd & ~PCI_COMMAND_MASTER), PCI_COMMAND)
      finally: os.close(fd)
      return "bus mastering off"
    except (OSError, struct.error) as e: return f"bus mastering left on ({e})"

  def _write(self, path: str, text: str, what: str) -> None:
    try: self.write(path, text)
    except PermissionError:
      raise DeviceUnavailable(f"{self.address}: no permission to {what} ({path})", Reason.NO_DEVICE, "driverless access needs root") from None
    except OSError as e:
      raise DeviceUnavailable(f"{self.address}: {what} failed: {e}", Reason.NO_DEVICE) from None

  def map_bar(self, index: int) -> MappedBAR:
    """mmap BAR `index` through `resource<index>`: a memory BAR of non-zero size (mapped once)."""
    res = self.resources()
    if index >= len(res) or not res[index].size or not res[index].is_memory:
      raise DeviceUnavailable(f"{self.address}: BAR{index} is not a memory BAR here (resource line: "
                              f"{res[index] if index < len(res) else 'none'})", Reason.NO_DEVICE)
    if index not in self.bars:
      try: self.bars[index] = self.bar_type(self.path(f"resource{index}"), index, res[index].size)
      except PermissionError:
        raise DeviceUnavailable(f"{self.address}: no permission to map BAR{index}", Reason.NO_DEVICE,
                                "mapping PCI resource files needs root (they are mode 0600; kernel lockdown forbids it)") from None
      except (OSError, ValueError) as e:
        raise DeviceUnavailable(f"{self.address}: cannot map BAR{index}: {e}", Reason.NO_DEVICE) from None
    return self.bars[index]

  def release(self) -> list[str]:
    """Undo take(), bus_master() and map_bar(): unmap, bus mastering off, reset (where asked), disable what was
    enabled, bind the driver back. Returns what it did, each step tried whatever the ones before did."""
    done = []
    for bar in self.bars.values(): bar.close()
    self.bars.clear()
    if self.master_by_us:
      done.append(self._bus_master_off())
      self.master_by_us = False
    if self.reset_on_release:  # a function-level reset: the device as its driver expects to find it
      try: self.write(self.path("reset"), "1"); done.append("reset")
      except OSError as e: done.append(f"reset failed ({e}): echo 1 | sudo tee {self.path('reset')}")
      self.reset_on_release = False
    if self.enabled_by_us:
      try: self.write(self.path("enable"), "0"); done.append("disabled")
      except OSError as e: done.append(f"disable failed: {e}")
      self.enabled_by_us = False
    if self.unbound_driver:
      bind = os.path.join(self.drivers, self.unbound_driver, "bind")
      try: self.write(bind, self.address); done.append(f"bound back to {self.unbound_driver}")
      except OSError as e: done.append(f"rebinding {self.unbound_driver} failed ({e}): echo {self.address} | sudo tee {bind}")
      self.unbound_driver = ""
    return done
