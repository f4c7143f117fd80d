"""A fake of the kernel's VFIO below plugrt_nv_pci.vfio (its `Syscalls` seam: open, close, ioctl, map_region), for one
fake sysfs tree (fake_nvpci.make_sysfs) given an IOMMU group by `add_group`.

It reads every argument as the kernel does, from the raw bytes at the offsets include/uapi/linux/vfio.h gives (not
through plugrt's ctypes types), answers with the kernel's errnos, and lists what the kernel would refuse or what breaks
the rules in `violations`: the API version asked before anything, the type-1 extension checked before VFIO_SET_IOMMU,
the group's status read and the group viable (each of its devices bound to vfio-pci, pci-stub, pcieport or nothing)
before it is set to the container, the container set before VFIO_SET_IOMMU, the IOMMU set before VFIO_IOMMU_GET_INFO,
MAP_DMA and the device fd; MAP_DMA with argsz, read and write, page-aligned vaddr, IOVA and size, inside the IOVA
ranges, not overlapping a mapping (EEXIST), within the pinned-memory limit (ENOMEM); UNMAP_DMA of exactly a mapping.
Opening the device fd clears the function's bus-master bit (vfio-pci's reset when the device is opened), and unbinding
vfio-pci while a VFIO fd is open is a violation (the kernel would wait for the fds). The fake GPU reads host memory
through `resolve(iova)` and `read(iova, n)`, which translate IOVAs by the mappings, as the IOMMU does."""
from __future__ import annotations

import ctypes
import errno
import os
import struct
from typing import Any

from plugrt_nv_pci import vfio

PAGE = 0x1000
VIABLE_DRIVERS = ("", "vfio-pci", "pci-stub", "pcieport")


def add_group(devices: str, group: str, addresses: list[str], kind: str = "DMA") -> str:
  """An IOMMU group `group` of type `kind` (DMA: translated) holding `addresses` in the fake tree whose devices folder is
  `devices` (as /sys/kernel/iommu_groups/<group> with its devices links, and each function's iommu_group link); a
  vfio-pci driver folder beside the others. Returns the group's folder."""
  sys_root = os.path.dirname(devices)
  g = os.path.join(sys_root, "kernel", "iommu_groups", group)
  os.makedirs(os.path.join(g, "devices"))
  with open(os.path.join(g, "type"), "w") as f: f.write(kind + "\n")
  for a in addresses:
    d = os.path.join(devices, a)
    os.makedirs(d, exist_ok=True)
    os.symlink(d, os.path.join(g, "devices", a))
    os.symlink(g, os.path.join(d, "iommu_group"))
  add_driver(os.path.join(sys_root, "drivers"), "vfio-pci")
  return g


def add_driver(drivers: str, name: str) -> None:
  d = os.path.join(drivers, name)
  os.makedirs(d, exist_ok=True)
  for n in ("bind", "unbind"): open(os.path.join(d, n), "a").close()


def bind(devices: str, address: str, driver: str) -> None:
  """The function bound to `driver` (its folder made in the drivers folder beside `devices`)."""
  add_driver(os.path.join(os.path.dirname(devices), "drivers"), driver)
  link = os.path.join(devices, address, "driver")
  if os.path.lexists(link): os.unlink(link)
  os.symlink(os.path.join("..", "..", "drivers", driver), link)


def read_pages(resolve: Any, at: int, n: int) -> bytes:
  """`n` bytes from bus address `at` (an IOVA, or a fake bus address), page by page through `resolve` (bus -> CPU)."""
  out = b""
  while len(out) < n:
    k = min(n - len(out), PAGE - (at + len(out)) % PAGE)
    out += ctypes.string_at(resolve(at + len(out)), k)
  return out


class FakeVFIO:
  """The kernel's VFIO for the fake tree at `devices`. `ranges`: the IOMMU's valid IOVA ranges (inclusive); `pin_limit`:
  bytes it pins before MAP_DMA answers ENOMEM; `types`: the IOMMU types CHECK_EXTENSION offers; `bars`: index -> the
  object map_region returns for that BAR (the fake GPU's BAR0 and VRAM)."""
  REGION_SHIFT = 40   # vfio-pci's region offsets: index << 40

  def __init__(self, devices: str, ranges: tuple[tuple[int, int], ...] = ((0, 0xFEDFFFFF), (0xFEF00000, (1 << 39) - 1)),
               pin_limit: int = 1 << 34, types: tuple[int, ...] = (vfio.TYPE1_IOMMU, vfio.TYPE1V2_IOMMU), bars: dict[int, Any] | None = None,
               pgsizes: int = 0x40201000, caps: bool = True):
    self.devices, self.ranges, self.pin_limit, self.types, self.bars = devices, ranges, pin_limit, types, bars or {}
    self.pgsizes, self.caps = pgsizes, caps
    self.fds: dict[int, tuple[str, str]] = {}   # fd -> (kind, group or device address)
    self.next_fd = 1000
    self.calls: list[str] = []
    self.violations: list[str] = []
    self.api_asked = False
    self.checked: set[int] = set()
    self.status_read: set[str] = set()
    self.container_of: dict[str, int] = {}      # group -> container fd
    self.iommu: dict[int, int] = {}             # container fd -> IOMMU type
    self.maps: dict[int, tuple[int, int]] = {}  # IOVA -> (vaddr, size)
    self.regions: dict[int, tuple[int, int]] = {}  # index -> (size, offset) as reported
    self.mapped_regions: list[int] = []
    self.unmapped: list[tuple[int, int]] = []

  # ---- sysfs as the kernel sees it
  def group_devices(self, group: str) -> dict[str, str]:
    d = os.path.join(os.path.dirname(self.devices), "kernel", "iommu_groups", group, "devices")
    out = {}
    for a in sorted(os.listdir(d)):
      link = os.path.join(d, a, "driver")
      out[a] = os.path.basename(os.path.realpath(link)) if os.path.lexists(link) else ""
    return out

  def viable(self, group: str) -> bool: return all(drv in VIABLE_DRIVERS for drv in self.group_devices(group).values())

  def _fd(self, kind: str, what: str) -> int:
    self.next_fd += 1
    self.fds[self.next_fd] = (kind, what)
    return self.next_fd

  def _fail(self, err: int, why: str, violation: bool = True) -> OSError:
    if violation: self.violations.append(why)
    return OSError(err, f"{os.strerror(err)} ({why})")

  # ---- the Syscalls seam
  def open(self, path: str) -> int:
    name = os.path.basename(path)
    self.calls.append(f"open {name}")
    if name == "vfio": return self._fd("container", "")
    if not os.path.isdir(os.path.join(os.path.dirname(self.devices), "kernel", "iommu_groups", name)) or \
       "vfio-pci" not in self.group_devices(name).values():
      raise self._fail(errno.ENOENT, f"/dev/vfio/{name} does not exist (no device of group {name} is bound to vfio-pci)", violation=False)
    if any(k == "group" and w == name for k, w in self.fds.values()): raise self._fail(errno.EBUSY, f"group {name} is open already")
    return self._fd("group", name)

  def close(self, fd: int) -> None:
    kind, what = self.fds.pop(fd)
    self.calls.append(f"close {kind}")
    if kind == "group": self.container_of.pop(what, None)
    if kind == "container":
      self.iommu.pop(fd, None)
      self.maps.clear()   # the container's IOMMU domain goes, and its mappings with it

  def ioctl(self, fd: int, request: int, arg: Any = 0) -> int:
    kind, what = self.fds.get(fd, ("", ""))
    name = {vfio.GET_API_VERSION: "GET_API_VERSION", vfio.CHECK_EXTENSION: "CHECK_EXTENSION", vfio.SET_IOMMU: "SET_IOMMU",
            vfio.GROUP_GET_STATUS: "GROUP_GET_STATUS", vfio.GROUP_SET_CONTAINER: "GROUP_SET_CONTAINER",
            vfio.GROUP_GET_DEVICE_FD: "GROUP_GET_DEVICE_FD", vfio.DEVICE_GET_REGION_INFO: "DEVICE_GET_REGION_INFO",
            vfio.IOMMU_GET_INFO: "IOMMU_GET_INFO", vfio.IOMMU_MAP_DMA: "MAP_DMA", vfio.IOMMU_UNMAP_DMA: "UNMAP_DMA"}.get(request)
    if name is None: raise self._fail(errno.ENOTTY, f"ioctl {request:#x} is no VFIO ioctl")
    self.calls.append(name)
    buf = memoryview(arg).cast("B") if not isinstance(arg, int) else None
    if not self.api_asked and name != "GET_API_VERSION": self.violations.append(f"{name} before VFIO_GET_API_VERSION")
    return getattr(self, f"_{name.lower()}")(fd, kind, what, arg if buf is None else buf)

  def _get_api_version(self, fd: int, kind: str, what: str, arg: Any) -> int:
    if kind != "container": raise self._fail(errno.ENOTTY, "VFIO_GET_API_VERSION on a non-container fd")
    self.api_asked = True
    return 0

  def _check_extension(self, fd: int, kind: str, what: str, arg: Any) -> int:
    self.checked.add(arg)
    return int(arg in self.types)

  def _group_get_status(self, fd: int, kind: str, what: str, buf: memoryview) -> int:
    argsz, _ = struct.unpack_from("<II", buf)
    if kind != "group" or argsz < 8: raise self._fail(errno.EINVAL, f"VFIO_GROUP_GET_STATUS with argsz {argsz} on a {kind} fd")
    self.status_read.add(what)
    struct.pack_into("<I", buf, 4, (1 if self.viable(what) else 0) | (2 if what in self.container_of else 0))
    return 0

  def _group_set_container(self, fd: int, kind: str, what: str, buf: memoryview) -> int:
    (container,) = struct.unpack_from("<i", buf)
    if kind != "group": raise self._fail(errno.ENOTTY, "VFIO_GROUP_SET_CONTAINER on a non-group fd")
    if what not in self.status_read: self.violations.append(f"group {what} set to a container before its status was read")
    if not self.viable(what): raise self._fail(errno.EPERM, f"group {what} set to a container while not viable")
    if what in self.container_of: raise self._fail(errno.EINVAL, f"group {what} is set to a container already")
    if self.fds.get(container, ("",))[0] != "container": raise self._fail(errno.EBADF, f"VFIO_GROUP_SET_CONTAINER given fd {container}")
    self.container_of[what] = container
    return 0

  def _set_iommu(self, fd: int, kind: str, what: str, arg: int) -> int:
    if fd not in self.container_of.values(): raise self._fail(errno.EINVAL, "VFIO_SET_IOMMU on a container with no group")
    if arg not in self.checked: self.violations.append(f"VFIO_SET_IOMMU({arg}) without VFIO_CHECK_EXTENSION({arg}) first")
    if arg not in self.types: raise self._fail(errno.EINVAL, f"VFIO_SET_IOMMU({arg}): not an IOMMU type this kernel has")
    if fd in self.iommu: raise self._fail(errno.EBUSY, "VFIO_SET_IOMMU twice")
    self.iommu[fd] = arg
    return 0

  def _need_iommu(self, fd: int, name: str) -> None:
    if fd not in self.iommu: raise self._fail(errno.EINVAL, f"{name} before VFIO_SET_IOMMU")

  def _iommu_get_info(self, fd: int, kind: str, what: str, buf: memoryview) -> int:
    self._need_iommu(fd, "VFIO_IOMMU_GET_INFO")
    (argsz,) = struct.unpack_from("<I", buf)
    if argsz < 16: raise self._fail(errno.EINVAL, f"VFIO_IOMMU_GET_INFO with argsz {argsz}")
    cap = struct.pack("<HHIII", 1, 1, 0, len(self.ranges), 0) + b"".join(struct.pack("<QQ", s, e) for s, e in self.ranges) if self.caps else b""
    need = 24 + len(cap)
    struct.pack_into("<IIQ", buf, 0, need if argsz < need else argsz, 1 | (2 if cap else 0), self.pgsizes)
    if argsz >= 24: struct.pack_into("<I", buf, 16, 24 if cap and argsz >= need else 0)
    if cap and argsz >= need: buf[24:need] = cap
    return 0

  def _group_get_device_fd(self, fd: int, kind: str, what: str, buf: memoryview) -> int:
    address = bytes(buf).split(b"\0")[0].decode()
    if kind != "group" or what not in self.container_of: raise self._fail(errno.EINVAL, "VFIO_GROUP_GET_DEVICE_FD before the group has a container")
    self._need_iommu(self.container_of[what], "VFIO_GROUP_GET_DEVICE_FD")
    if self.group_devices(what).get(address) != "vfio-pci": raise self._fail(errno.ENODEV, f"{address} is not a vfio-pci device of group {what}")
    config = os.path.join(self.devices, address, "config")   # vfio-pci's reset on open: the command register cleared
    with open(config, "r+b") as f:
      f.seek(4)
      f.write(b"\0\0")
    return self._fd("device", address)

  def _device_get_region_info(self, fd: int, kind: str, what: str, buf: memoryview) -> int:
    argsz, _, index = struct.unpack_from("<III", buf)
    if kind != "device" or argsz < 32: raise self._fail(errno.EINVAL, f"VFIO_DEVICE_GET_REGION_INFO with argsz {argsz} on a {kind} fd")
    with open(os.path.join(self.devices, what, "resource")) as f: lines = f.read().split("\n")
    start, end, _ = (int(x, 16) for x in lines[index].split()[:3])
    size = end - start + 1 if end else 0
    self.regions[index] = (size, index << self.REGION_SHIFT)
    struct.pack_into("<IIIIQQ", buf, 0, argsz, 7 if size else 0, index, 0, size, index << self.REGION_SHIFT)
    return 0

  def _map_dma(self, fd: int, kind: str, what: str, buf: memoryview) -> int:
    self._need_iommu(fd, "VFIO_IOMMU_MAP_DMA")
    argsz, flags, vaddr, iova, size = struct.unpack_from("<IIQQQ", buf)
    if argsz < 32: raise self._fail(errno.EINVAL, f"MAP_DMA with argsz {argsz}")
    if flags != 3: self.violations.append(f"MAP_DMA with flags {flags:#x}: the GPU reads and writes host memory")
    if not flags & 3: raise self._fail(errno.EINVAL, "MAP_DMA with neither read nor write")
    where = f"MAP_DMA of {size:#x} bytes at IOVA {iova:#x} from {vaddr:#x}"
    if not size or (vaddr | iova | size) % PAGE: raise self._fail(errno.EINVAL, f"{where}: not page-aligned")
    if not any(s <= iova and iova + size - 1 <= e for s, e in self.ranges): raise self._fail(errno.EINVAL, f"{where}: outside the IOVA ranges")
    if any(i < iova + size and iova < i + n for i, (_, n) in self.maps.items()): raise self._fail(errno.EEXIST, f"{where}: overlaps a mapping")
    if sum(n for _, n in self.maps.values()) + size > self.pin_limit: raise self._fail(errno.ENOMEM, f"{where}: past the pin limit", False)
    self.maps[iova] = (vaddr, size)
    return 0

  def _unmap_dma(self, fd: int, kind: str, what: str, buf: memoryview) -> int:
    self._need_iommu(fd, "VFIO_IOMMU_UNMAP_DMA")
    argsz, flags, iova, size = struct.unpack_from("<IIQQ", buf)
    if argsz < 24 or flags: raise self._fail(errno.EINVAL, f"UNMAP_DMA with argsz {argsz}, flags {flags}")
    if self.maps.get(iova, (0, -1))[1] != size: raise self._fail(errno.EINVAL, f"UNMAP_DMA of {size:#x} bytes at IOVA {iova:#x}: no such mapping")
    del self.maps[iova]
    self.unmapped.append((iova, size))
    struct.pack_into("<Q", buf, 16, size)
    return 0

  def map_region(self, fd: int, index: int, size: int, offset: int) -> Any:
    if self.fds.get(fd, ("",))[0] != "device": raise self._fail(errno.EBADF, "mmap of a BAR on a non-device fd")
    if self.regions.get(index) != (size, offset): self.violations.append(f"BAR{index} mapped as {size:#x} bytes at {offset:#x}, not as reported")
    self.mapped_regions.append(index)
    return self.bars[index]

  # ---- the IOMMU, for the fake GPU
  def resolve(self, iova: int) -> int:
    for i, (vaddr, n) in self.maps.items():
      if i <= iova < i + n: return vaddr + iova - i
    raise KeyError(f"IOMMU fault: no mapping at IOVA {iova:#x}")

  def read(self, iova: int, n: int) -> bytes: return read_pages(self.resolve, iova, n)

  def open_fds(self) -> list[str]: return [f"{k} {w}".strip() for k, w in self.fds.values()]

  def kernel_write(self, path: str) -> None:
    """Called by the fake tree's writes: unbinding vfio-pci from a function whose device fd is open would wait forever."""
    if path.endswith("/driver/unbind") and os.path.basename(os.path.realpath(os.path.dirname(path))) == "vfio-pci" and \
       any(k == "device" for k, _ in self.fds.values()):
      self.violations.append("vfio-pci unbound while the VFIO device fd is open (the kernel waits for it to close)")
