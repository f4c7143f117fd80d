"""An NVIDIA GPU's PCI function through sysfs: finding candidates (read only), taking the function from its kernel
driver and giving it back, and its BARs mapped from their `resourceN` files.

Every path is under `root` (default /sys/bus/pci/devices) and `drivers` (default /sys/bus/pci/drivers), so tests run
against a fake tree in a temporary folder; writes go through `write(path, text)`, where a fake tree plays the kernel's
part (removing the `driver` link on unbind). `take()` unbinds only when the caller passes the user's acknowledgement,
records what it changed (the driver it unbound, whether it enabled the function, whether it turned bus mastering on)
and `release()` undoes exactly that. Bus mastering (PCI_COMMAND bit 2, in the `config` file at offset 4) is what lets
the GPU read host memory by DMA: enabling the function through sysfs does not set it.

BARs (PCI BAR layout of NVIDIA GPUs since Fermi, as open-gpu-kernel-modules' nv.c maps them): BAR0 registers (16 MiB),
BAR1 a window onto VRAM (physical mode once the GSP boot set NV_PBUS_BAR1_BLOCK to 0), BAR3 (index 3 in sysfs's
numbering of 64-bit BARs) the instance-memory window.
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
from plugrt_nv_pci.chips import DISPLAY_CLASS, NVIDIA_VENDOR

PCI_DEVICES = "/sys/bus/pci/devices"
PCI_DRIVERS = "/sys/bus/pci/drivers"
IORESOURCE_MEM = 0x200      # a `resource` line's flag for a memory BAR (include/linux/ioport.h)
REGISTER_BAR, VRAM_BAR = 0, 1
PCI_COMMAND, PCI_COMMAND_MASTER = 0x04, 1 << 2   # config space: the command register and its bus-master enable bit (pci_regs.h)
MAP_SHARED, MAP_FIXED_NOREPLACE = 0x01, 0x100000


@dataclass(frozen=True)
class Candidate:
  """An NVIDIA display function sysfs lists: its address, device id, class and bound driver ("" when none)."""
  address: str
  device: int
  cls: int
  driver: str


def _read(path: str) -> str:
  try:
    with open(path, encoding="ascii", errors="replace") as f: return f.read().strip()
  except OSError: return ""


def _driver_of(d: str) -> str:
  link = os.path.join(d, "driver")
  return os.path.basename(os.path.realpath(link)) if os.path.lexists(link) else ""


def nvidia_gpus(root: str = PCI_DEVICES) -> list[Candidate]:
  """NVIDIA (0x10de) functions of the display class (0x03xxxx) in sysfs, by address; reads `vendor`, `class`,
  `device` and the `driver` link only."""
  try: names = sorted(os.listdir(root))
  except OSError: return []
  out = []
  for addr in names:
    d = os.path.join(root, addr)
    try: vendor, cls, dev = (int(_read(os.path.join(d, f)) or "0", 16) for f in ("vendor", "class", "device"))
    except ValueError: continue
    if vendor == NVIDIA_VENDOR and cls >> 16 == DISPLAY_CLASS: out.append(Candidate(addr, dev, cls, _driver_of(d)))
  return out


def _default_write(path: str, text: str) -> None:
  with open(path, "w", encoding="ascii") as f: f.write(text)


class MappedBAR:
  """One BAR mmapped from its sysfs resource file (registers: read32/write32; VRAM: `address` for CPU stores)."""

  def __init__(self, path: str, index: int, size: int):
    self.path, self.index = path, index
    fd = os.open(path, os.O_RDWR | os.O_SYNC)
    try:
      length = min(size, os.fstat(fd).st_size) if os.fstat(fd).st_size else size
      self.map = mmap.mmap(fd, length, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally: os.close(fd)
    self.size = length
    self.view: memoryview | None = memoryview(self.map)

  def _at(self, offset: int, n: int) -> memoryview:
    if self.view is None: raise DeviceUnavailable(f"BAR{self.index} is unmapped", Reason.NO_DEVICE)
    if offset < 0 or offset + n > self.size:
      raise DeviceUnavailable(f"access of {n} bytes at {offset:#x} outside BAR{self.index} ({self.size} bytes)", Reason.NO_DEVICE)
    return self.view

  def address(self, offset: int) -> int:
    """The CPU address of `offset` in the mapping (for plain stores: the doorbell)."""
    view = self._at(offset, 4)
    return ctypes.addressof(ctypes.c_char.from_buffer(view.obj)) + offset  # type: ignore[arg-type]

  def map_at(self, va: int, offset: int, size: int) -> None:
    """Map [offset, offset + size) of the BAR at CPU address `va` too (VRAM the CPU writes at its GPU address)."""
    if offset < 0 or offset + size > self.size:
      raise MemoryError(f"BAR{self.index} is {self.size >> 20} MiB: it does not reach {offset + size:#x} "
                        "(resize it, or use memory below that)")
    fd = os.open(self.path, os.O_RDWR | os.O_SYNC)
    try: addr = libc().mmap(va, size, mmap.PROT_READ | mmap.PROT_WRITE, MAP_SHARED | MAP_FIXED_NOREPLACE, fd, offset)
    finally: os.close(fd)
    if addr in (None, ctypes.c_void_p(-1).value) or addr != va:
      err = ctypes.get_errno()
      if addr not in (None, ctypes.c_void_p(-1).value): libc().munmap(addr, size)
      if err == errno.EEXIST: raise FileExistsError(f"{va:#x} is already mapped in this process")
      raise DeviceUnavailable(f"cannot map BAR{self.index} at {va:#x}: {os.strerror(err)}", Reason.NO_DEVICE)

  def unmap_at(self, va: int, size: int) -> None: libc().munmap(va, size)

  def read32(self, offset: int) -> int: return struct.unpack_from("<I", self._at(offset, 4), offset)[0]
  def write32(self, offset: int, value: int) -> None: struct.pack_into("<I", self._at(offset, 4), offset, value & 0xFFFFFFFF)
  def read(self, offset: int, n: int) -> bytes: return bytes(self._at(offset, n)[offset:offset + n])
  def write(self, offset: int, data: bytes) -> None: self._at(offset, len(data))[offset:offset + len(data)] = data

  def close(self) -> None:
    if self.view is not None:
      self.view.release()
      self.view = None
      self.map.close()


class PCIFunction:
  """The PCI function `address` (0000:01:00.0) under `root`."""

  def __init__(self, address: str, root: str = PCI_DEVICES, drivers: str = PCI_DRIVERS, write: Callable[[str, str], None] | None = None):
    self.address, self.root, self.drivers = address, root, drivers
    self.dir = os.path.join(root, address)
    self.write = write or _default_write
    self.unbound_driver = ""
    self.enabled_by_us = False
    self.reset_on_release = False   # set once the GPU's state was changed (a GSP boot began): release() resets the function
    self.master_by_us = False
    self.bars: dict[int, MappedBAR] = {}
    if not os.path.isdir(self.dir):
      raise DeviceUnavailable(f"no PCI function {address} ({self.dir} does not exist)", Reason.NO_DEVICE, "list them with lspci -D -d 10de:")

  def path(self, name: str) -> str: return os.path.join(self.dir, name)
  def driver(self) -> str: return _driver_of(self.dir)
  def unbind_command(self) -> str: return f"echo {self.address} | sudo tee {self.path('driver/unbind')}"

  def resources(self) -> list[tuple[int, int, int]]:
    """The `resource` file: (start, end, flags) per BAR (end 0: unused)."""
    try:
      with open(self.path("resource"), encoding="ascii") as f: lines = [ln for ln in f.read().split("\n") if ln.strip()]
    except OSError as e: raise DeviceUnavailable(f"{self.address}: cannot read its resource list: {e}", Reason.NO_DEVICE) from None
    return [tuple(int(x, 16) for x in ln.split()[:3]) for ln in lines]  # type: ignore[misc]

  def take(self) -> None:
    """Unbind the bound driver and enable the function. Only called after the user acknowledged (the caller checks)."""
    if (drv := self.driver()):
      self._write(self.path("driver/unbind"), self.address, f"unbind {drv}")
      if self.driver():
        raise DeviceUnavailable(f"{self.address}: still bound to {drv} after writing driver/unbind", Reason.NO_DEVICE,
                                "another program holds the GPU (close it), or unbind it by hand: " + self.unbind_command())
      self.unbound_driver = drv
    if _read(self.path("enable")) in ("", "0"):
      self._write(self.path("enable"), "1", "enable")
      self.enabled_by_us = True

  def config(self, offset: int, n: int) -> bytes:
    """`n` bytes of the function's config space from `offset` (the `config` file; its first 64 bytes need no root)."""
    try:
      with open(self.path("config"), "rb") as f:
        f.seek(offset)
        data = f.read(n)
    except OSError as e: raise DeviceUnavailable(f"{self.address}: cannot read its config space: {e}", Reason.NO_DEVICE) from None
    if len(data) != n: raise DeviceUnavailable(f"{self.address}: its config space ends before {offset + n:#x}", Reason.NO_DEVICE)
    return data

  def bus_master(self) -> None:
    """Turn on bus mastering (the GPU's DMA into host memory) in the function's config space, if it is off."""
    try:
      fd = os.open(self.path("config"), os.O_RDWR)
      try:
        (cmd,) = struct.unpack("<H", os.pread(fd, 2, PCI_COMMAND))
        if not cmd & PCI_COMMAND_MASTER:
          os.pwrite(fd, struct.pack("<H", cmd | PCI_COMMAND_MASTER), PCI_COMMAND)
          self.master_by_us = True
      finally: os.close(fd)
    except PermissionError: raise DeviceUnavailable(f"{self.address}: no permission to write its config space", Reason.NO_DEVICE,
                                                    "driverless access needs root") from None
    except (OSError, struct.error) as e: raise DeviceUnavailable(f"{self.address}: cannot turn on bus mastering: {e}", Reason.NO_DEVICE) from None

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
    except PermissionError: raise DeviceUnavailable(f"{self.address}: no permission to {what} ({path})", Reason.NO_DEVICE,
                                                    "driverless access needs root") from None
    except OSError as e: raise DeviceUnavailable(f"{self.address}: {what} failed: {e}", Reason.NO_DEVICE) from None

  def map_bar(self, index: int) -> MappedBAR:
    res = self.resources()
    if index >= len(res) or not res[index][1] or not res[index][2] & IORESOURCE_MEM:
      raise DeviceUnavailable(f"{self.address}: BAR{index} is not a memory BAR here", Reason.NO_DEVICE)
    if index not in self.bars:
      try: self.bars[index] = MappedBAR(self.path(f"resource{index}"), index, res[index][1] - res[index][0] + 1)
      except PermissionError: raise DeviceUnavailable(f"{self.address}: no permission to map BAR{index}", Reason.NO_DEVICE,
                                                      "mapping PCI resource files needs root (and no kernel lockdown)") from None
      except (OSError, ValueError) as e: raise DeviceUnavailable(f"{self.address}: cannot map BAR{index}: {e}", Reason.NO_DEVICE) from None
    return self.bars[index]

  def release(self) -> list[str]:
    """Undo take() and map_bar(): unmap, disable what was enabled, bind the driver back; returns what it did."""
    done = []
    for bar in self.bars.values(): bar.close()
    self.bars.clear()
    if self.master_by_us:
      done.append(self._bus_master_off())
      self.master_by_us = False
    if self.reset_on_release:  # a function-level reset: WPR2 and the GSP go, as the driver expects to find the GPU
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
