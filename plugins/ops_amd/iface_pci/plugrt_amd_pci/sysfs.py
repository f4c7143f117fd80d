"""One PCI function through sysfs: config space, enable, BAR mapping, and the kernel driver's unbind and rebind.

Every path is under `root` (default /sys/bus/pci/devices) and `drivers` (default /sys/bus/pci/drivers), so tests
run against a fake tree in a temporary folder whose `resourceN` files are regular files. Writes go through
`self.write(path, text)`, the seam where a fake tree plays the kernel's part (removing the `driver` link on unbind).

Rules (docs/backends/amd.md): `take()` unbinds a bound driver only when told `allow_unbind=True` (the user set
PLUGRT_AMD_ALLOW_UNBIND=1); otherwise it raises `AcknowledgementRequired` with the exact command the user would run.
What `take()` changed (the driver it unbound, whether it enabled the function) is recorded, and `release()` undoes it:
unmaps the BARs, disables what it enabled, and binds the driver back.

sysfs resource files, not VFIO: mapping a BAR needs only `resourceN` (root: the files are mode 0600); VFIO would add DMA
mapping through the IOMMU and interrupts, which belong to the GART/VM and interrupt steps plugrt does not implement,
and would need the function bound to vfio-pci. `vfio_available()` is reported, not used.
"""
from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass

from plugrt.errors import DeviceUnavailable, Reason

PCI_DEVICES = "/sys/bus/pci/devices"
PCI_DRIVERS = "/sys/bus/pci/drivers"
IORESOURCE_IO = 0x100        # flags of a `resource` line (include/linux/ioport.h)
IORESOURCE_MEM = 0x200
# config space (PCI Local Bus specification, type 0 header)
CFG_VENDOR, CFG_DEVICE, CFG_COMMAND, CFG_REVISION, CFG_CLASS = 0x00, 0x02, 0x04, 0x08, 0x09
COMMAND_MEMORY = 1 << 1
COMMAND_MASTER = 1 << 2


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


def vfio_available(dev: str = "/dev/vfio") -> bool: return os.path.isdir(dev)


def _default_write(path: str, text: str) -> None:
  with open(path, "w", encoding="ascii") as f: f.write(text)


class MappedBAR:
  """One BAR mmapped from its sysfs resource file: an MMIO (read32/write32) for plugrt_amd_pci.regs."""

  def __init__(self, path: str, index: int, size: int):
    self.path, self.index = path, index
    fd = os.open(path, os.O_RDWR | os.O_SYNC)
    try:
      length = min(size, os.fstat(fd).st_size) if os.fstat(fd).st_size else size
      self.map = mmap.mmap(fd, length, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally: os.close(fd)
    self.size = length
    self.view: memoryview | None = memoryview(self.map)

  def _at(self, offset: int, what: str) -> memoryview:
    if self.view is None: raise DeviceUnavailable(f"BAR{self.index} is unmapped", Reason.NO_DEVICE)
    if offset & 3 or not 0 <= offset <= self.size - 4:
      from plugrt_amd_pci.regs import RegisterError
      raise RegisterError(f"{what} at 0x{offset:x} outside BAR{self.index} ({self.size} bytes)")
    return self.view

  def read32(self, offset: int) -> int: return struct.unpack_from("<I", self._at(offset, "read"), offset)[0]
  def write32(self, offset: int, value: int) -> None: struct.pack_into("<I", self._at(offset, "write"), offset, value & 0xFFFFFFFF)
  def read(self, offset: int, n: int) -> bytes:
    return bytes(self._span(offset, n, "read")[offset:offset + n])

  def write(self, offset: int, data: bytes) -> None:
    """Byte-exact CPU stores (a buffer's bytes through the VRAM BAR: driverless.BARPath's copies)."""
    self._span(offset, len(data), "write")[offset:offset + len(data)] = data

  def _span(self, offset: int, n: int, what: str) -> memoryview:
    if self.view is None: raise DeviceUnavailable(f"BAR{self.index} is unmapped", Reason.NO_DEVICE)
    if offset < 0 or n < 0 or offset + n > self.size:
      from plugrt_amd_pci.regs import RegisterError
      raise RegisterError(f"{what} of {n} bytes at 0x{offset:x} outside BAR{self.index} ({self.size} bytes)")
    return self.view

  def write64(self, offset: int, value: int) -> None:
    """One 8-byte store (a 64-bit doorbell in BAR2: plugrt_amd_pci.doorbell)."""
    if offset & 7: self._at(-1, "64-bit write")
    struct.pack_into("<Q", self._at(offset, "write"), offset, value & 0xFFFFFFFFFFFFFFFF)

  def close(self) -> None:
    if self.view is not None:
      self.view.release(); self.view = None
      self.map.close()


class PCIFunction:
  """The PCI function `address` (0000:03:00.0) under `root`."""

  def __init__(self, address: str, root: str = PCI_DEVICES, drivers: str = PCI_DRIVERS, write: Callable[[str, str], None] | None = None):
    self.address, self.root, self.drivers = address, root, drivers
    self.dir = os.path.join(root, address)
    self.write = write or _default_write
    self.unbound_driver = ""        # the driver take() unbound; release() binds it back
    self.enabled_by_us = False
    self.bars: dict[int, MappedBAR] = {}
    if not os.path.isdir(self.dir):
      raise DeviceUnavailable(f"no PCI function {address} ({self.dir} does not exist)", Reason.NO_DEVICE, "list them with lspci -D")

  def path(self, name: str) -> str: return os.path.join(self.dir, name)

  def driver(self) -> str:
    link = self.path("driver")
    return os.path.basename(os.path.realpath(link)) if os.path.lexists(link) else ""

  def config(self, offset: int, size: int = 4) -> int:
    """Read `size` bytes of config space at `offset` (sysfs `config`; unprivileged users see only the first 64 bytes)."""
    try:
      with open(self.path("config"), "rb") as f:
        f.seek(offset)
        data = f.read(size)
    except OSError as e:
      raise DeviceUnavailable(f"{self.address}: cannot read config space: {e}", Reason.NO_DEVICE) from None
    if len(data) != size:
      raise DeviceUnavailable(f"{self.address}: config space read at 0x{offset:x} returned {len(data)} of {size} bytes",
                              Reason.NO_DEVICE, "run as root to read past the first 64 bytes")
    return int.from_bytes(data, "little")

  def resources(self) -> list[Resource]:
    """The `resource` file: one (start, end, flags) line per BAR (then ROM and bridge windows)."""
    try:
      with open(self.path("resource"), encoding="ascii") as f: lines = f.read().split("\n")
    except OSError as e:
      raise DeviceUnavailable(f"{self.address}: cannot read its resource list: {e}", Reason.NO_DEVICE) from None
    return [Resource(*(int(x, 16) for x in ln.split()[:3])) for ln in lines if ln.strip()]

  def unbind_command(self) -> str:
    return f"echo {self.address} | sudo tee {self.path('driver/unbind')}"

  def take(self, allow_unbind: bool, ack: str = "PLUGRT_AMD_ALLOW_UNBIND") -> None:
    """Make the function ours: unbind its driver (only with `allow_unbind`; else AcknowledgementRequired with the command), enable it."""
    if (drv := self.driver()):
      if not allow_unbind:
        from plugrt_amd.device import AcknowledgementRequired
        raise AcknowledgementRequired(f"{self.address} is bound to the {drv} driver: plugrt does not unbind it without {ack}=1",
                                      f"unbind it yourself: {self.unbind_command()}  (and bind it back later: echo {self.address} | "
                                      f"sudo tee {os.path.join(self.drivers, drv, 'bind')}); or set {ack}=1 and plugrt unbinds it "
                                      "and binds it back when the device closes")
      self._write(self.path("driver/unbind"), self.address, f"unbind {drv}")
      if self.driver():
        raise DeviceUnavailable(f"{self.address}: still bound to {drv} after writing driver/unbind", Reason.NO_DEVICE,
                                "another program holds it (close it), or unbind by hand: " + self.unbind_command())
      self.unbound_driver = drv
    try:
      with open(self.path("enable"), encoding="ascii") as f: enabled = int(f.read().strip() or "0")
    except (OSError, ValueError): enabled = 0
    if not enabled:
      self._write(self.path("enable"), "1", "enable")
      self.enabled_by_us = True

  def _write(self, path: str, text: str, what: str) -> None:
    try: self.write(path, text)
    except PermissionError:
      raise DeviceUnavailable(f"{self.address}: no permission to {what} ({path})", Reason.NO_DEVICE,
                              "driverless access needs root") from None
    except OSError as e:
      raise DeviceUnavailable(f"{self.address}: {what} failed: {e}", Reason.NO_DEVICE) from None

  def map_bar(self, index: int) -> MappedBAR:
    """mmap BAR `index` through `resource<index>`: a memory BAR of non-zero size."""
    res = self.resources()
    if index >= len(res) or not res[index].size or not res[index].is_memory:
      raise DeviceUnavailable(f"{self.address}: BAR{index} is not a memory BAR here (resource line: "
                              f"{res[index] if index < len(res) else 'none'})", Reason.NO_DEVICE)
    if index in self.bars: return self.bars[index]
    try: bar = MappedBAR(self.path(f"resource{index}"), index, res[index].size)
    except PermissionError:
      raise DeviceUnavailable(f"{self.address}: no permission to map BAR{index}", Reason.NO_DEVICE,
                              "mapping PCI resource files needs root (they are mode 0600; kernel lockdown forbids it)") from None
    except (OSError, ValueError) as e:
      raise DeviceUnavailable(f"{self.address}: cannot map BAR{index}: {e}", Reason.NO_DEVICE) from None
    self.bars[index] = bar
    return bar

  def release(self) -> list[str]:
    """Undo take() and map_bar(): unmap, disable what we enabled, bind the driver back. Returns what it did."""
    done = []
    for bar in self.bars.values(): bar.close()
    self.bars.clear()
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
