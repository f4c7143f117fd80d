"""Host memory and BARs through VFIO: the path for a GPU whose DMA an IOMMU translates (docs/research/nv-pci.md,
section 10, gives every number's source in include/uapi/linux/vfio.h and Documentation/driver-api/vfio.rst).

`dma_path` says, from sysfs alone (the probe uses it), which host-memory path opening takes: "vfio" when the function
is bound to vfio-pci or PLUGRT_NV_PCI_DMA=vfio asks for it, "pagemap" (plugrt_nv_pci.dma.PagemapDMA) where no IOMMU
translates the function's DMA, and NoDMAPath naming both and the fix otherwise.

`VFIODMA` opens the type-1 container (/dev/vfio/vfio: API version, the type-1 extension), the function's group
(/dev/vfio/<group>: viable, set to the container, then the IOMMU type set) and the device (VFIO_GROUP_GET_DEVICE_FD);
the IOMMU's valid IOVA ranges come from VFIO_IOMMU_GET_INFO. Each buffer is anonymous memory mapped for the GPU with
VFIO_IOMMU_MAP_DMA (read and write; the kernel pins the pages) at an IOVA from plugrt's own allocator over those
ranges, so a buffer's pages are consecutive IOVAs whether or not it was asked `contiguous` (no huge page needed). CPU
addresses are not used as IOVAs: user space's addresses lie above the 39-bit apertures many IOMMUs have. `map_bar`
maps a BAR through the device fd (VFIO_DEVICE_GET_REGION_INFO's offset): once vfio-pci claims a BAR's region the
kernel may refuse (and revoke) mappings of its sysfs resource file, so under VFIO the BARs come from VFIO too.

`VFIOFunction` is the PCI function under VFIO: take() binds it to vfio-pci through driver_override when it is bound
elsewhere (the driver unbound first, with the user's acknowledgement), release() turns bus mastering off, closes VFIO
(vfio-pci lets a function go only once its fds are closed), resets the function and gives it back to the driver it had
(a function found bound to vfio-pci stays bound to it).

Every call into the kernel goes through `Syscalls` (open, close, ioctl, map_region), which tests replace with a fake
VFIO. **Never run on hardware.**
"""
from __future__ import annotations

import ctypes
import errno
import fcntl
import mmap
import os
from typing import Any

from plugrt.hwqueue import libc
from plugrt.pcisysfs import MappedBAR, driver_of
from plugrt_nv_nvk.nvk import VASpace
from plugrt_nv_pci.dma import PAGE, DMABuffer, iommu_translates, map_anonymous
from plugrt_nv_pci.errors import GroupNotViable, NoDMAPath, VFIOError
from plugrt_nv_pci.sysfs import PCIFunction

DEV_VFIO = "/dev/vfio"
VFIO_DRIVER = "vfio-pci"
DMA_ENV = "PLUGRT_NV_PCI_DMA"
#: drivers that leave a device's DMA to the group's owner (driver_managed_dma): they keep a group viable
DMA_OWNER_DRIVERS = ("vfio-pci", "pci-stub", "pcieport")


def _io(n: int) -> int: return ord(";") << 8 | 100 + n   # _IO(VFIO_TYPE, VFIO_BASE + n): no size or direction bits


GET_API_VERSION, CHECK_EXTENSION, SET_IOMMU = _io(0), _io(1), _io(2)
GROUP_GET_STATUS, GROUP_SET_CONTAINER, GROUP_GET_DEVICE_FD = _io(3), _io(4), _io(6)
DEVICE_GET_REGION_INFO = _io(8)
IOMMU_GET_INFO, IOMMU_MAP_DMA, IOMMU_UNMAP_DMA = _io(12), _io(13), _io(14)
API_VERSION, TYPE1_IOMMU, TYPE1V2_IOMMU = 0, 1, 3
GROUP_FLAGS_VIABLE, GROUP_FLAGS_CONTAINER_SET = 1 << 0, 1 << 1
INFO_PGSIZES, INFO_CAPS, CAP_IOVA_RANGE = 1 << 0, 1 << 1, 1
DMA_MAP_READ, DMA_MAP_WRITE = 1 << 0, 1 << 1
REGION_READ, REGION_WRITE, REGION_MMAP = 1 << 0, 1 << 1, 1 << 2
LOW_IOVA = 1 << 20                       # IOVAs below this stay unused (address 0 is no buffer's)
FALLBACK_IOVAS = ((LOW_IOVA, 0xFEDFFFFF),)  # without the IOVA-range capability: below x86's MSI window (0xFEE00000)
u32, u64 = ctypes.c_uint32, ctypes.c_uint64


class GroupStatus(ctypes.Structure): _fields_ = [("argsz", u32), ("flags", u32)]
class IOMMUInfo(ctypes.Structure): _fields_ = [("argsz", u32), ("flags", u32), ("iova_pgsizes", u64), ("cap_offset", u32), ("pad", u32)]
class CapHeader(ctypes.Structure): _fields_ = [("id", ctypes.c_uint16), ("version", ctypes.c_uint16), ("next", u32)]
class IOVARangeCap(ctypes.Structure): _fields_ = [("header", CapHeader), ("nr_iovas", u32), ("reserved", u32)]
class IOVARange(ctypes.Structure): _fields_ = [("start", u64), ("end", u64)]
class DMAMap(ctypes.Structure): _fields_ = [("argsz", u32), ("flags", u32), ("vaddr", u64), ("iova", u64), ("size", u64)]
class DMAUnmap(ctypes.Structure): _fields_ = [("argsz", u32), ("flags", u32), ("iova", u64), ("size", u64)]
class RegionInfo(ctypes.Structure):
  _fields_ = [("argsz", u32), ("flags", u32), ("index", u32), ("cap_offset", u32), ("size", u64), ("offset", u64)]


# ---- which path, from sysfs alone --------------------------------------------------------------------------------------

def group_of(function_dir: str) -> str:
  """The function's IOMMU group number ("" when it has none: no IOMMU)."""
  link = os.path.join(function_dir, "iommu_group")
  return os.path.basename(os.path.realpath(link)) if os.path.lexists(link) else ""


def group_devices(function_dir: str) -> dict[str, str]:
  """Every device of the function's IOMMU group -> its driver ("" when none)."""
  d = os.path.join(function_dir, "iommu_group", "devices")
  try: names = sorted(os.listdir(d))
  except OSError: return {}
  return {a: driver_of(os.path.realpath(os.path.join(d, a))) for a in names}


def bind_steps(address: str, function_dir: str, drivers: str) -> str:
  """The commands that bind a function to vfio-pci by hand."""
  probe = os.path.join(os.path.dirname(drivers), "drivers_probe")
  return (f"echo vfio-pci | sudo tee {function_dir}/driver_override; echo {address} | sudo tee {function_dir}/driver/unbind; "
          f"echo {address} | sudo tee {probe}")


def dma_path(function_dir: str, drivers: str, asked: str = "") -> tuple[str, str]:
  """("vfio" or "pagemap", why) for the function in `function_dir`, `asked` being PLUGRT_NV_PCI_DMA's value ("",
  "vfio", "pagemap"); NoDMAPath when neither can work. Reads sysfs only."""
  address, driver = os.path.basename(function_dir), driver_of(function_dir)
  translates, group = iommu_translates(function_dir), group_of(function_dir)
  steps = bind_steps(address, function_dir, drivers)
  if asked == "pagemap":
    if translates:
      raise NoDMAPath(f"{address}: {DMA_ENV}=pagemap, but {translates}: physical addresses are not what its DMA uses",
                      f"unset {DMA_ENV} (or set it to vfio) to map host memory through VFIO; or boot with iommu=pt")
    return "pagemap", f"{DMA_ENV}=pagemap"
  if asked == "vfio" or driver == VFIO_DRIVER:
    why = f"{DMA_ENV}=vfio" if asked else "bound to vfio-pci"
    if not group:
      raise NoDMAPath(f"{address}: host memory through VFIO ({why}), but the function has no IOMMU group (no IOMMU is on)",
                      f"turn the IOMMU on (intel_iommu=on or amd_iommu=on), or set {DMA_ENV}=pagemap where no IOMMU translates DMA")
    if driver != VFIO_DRIVER and not os.path.isdir(os.path.join(drivers, VFIO_DRIVER)):
      raise NoDMAPath(f"{address}: host memory through VFIO ({why}), but the vfio-pci driver is not loaded", "sudo modprobe vfio-pci")
    bind = "" if driver == VFIO_DRIVER else f"; opening binds it to vfio-pci (driver_override) and back to {driver or 'no driver'} on close"
    return "vfio", f"{why}, IOMMU group {group}{bind}"
  if not translates: return "pagemap", "no IOMMU translates its DMA"
  raise NoDMAPath(f"{address}: host memory for the GPU: /proc/self/pagemap's physical addresses are refused ({translates}), and "
                  f"VFIO is not used: the function is bound to {driver or 'no driver'}, not vfio-pci",
                  f"bind it to vfio-pci ({steps}), or set {DMA_ENV}=vfio to have opening bind it; or boot with iommu=pt")


# ---- the kernel's side ----------------------------------------------------------------------------------------------

class RegionBAR(MappedBAR):
  """A BAR mmapped from the VFIO device fd at its region's offset (the fd is duplicated: the BAR outlives no VFIO)."""

  def __init__(self, fd: int, index: int, size: int, offset: int):
    self.path, self.index, self.region = f"VFIO region {index}", index, offset
    self.fd = os.dup(fd)
    try: self.map = mmap.mmap(self.fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=offset)
    except BaseException:
      os.close(self.fd)
      raise
    self.size = size
    self.view: memoryview | None = memoryview(self.map)

  def map_at(self, va: int, offset: int, size: int) -> None:
    if offset < 0 or offset + size > self.size:
      raise MemoryError(f"BAR{self.index} is {self.size >> 20} MiB: it does not reach {offset + size:#x} (resize it, or use memory below that)")
    addr = libc().mmap(va, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED | 0x100000, self.fd, self.region + offset)
    if addr in (None, ctypes.c_void_p(-1).value) or addr != va:
      err = ctypes.get_errno()
      if addr not in (None, ctypes.c_void_p(-1).value): libc().munmap(addr, size)
      if err == errno.EEXIST: raise FileExistsError(f"{va:#x} is already mapped in this process")
      raise VFIOError(f"cannot map BAR{self.index} at {va:#x} through VFIO: {os.strerror(err)}", step="mmap of the device fd", errno=err)

  def close(self) -> None:
    super().close()
    if self.fd >= 0: os.close(self.fd)
    self.fd = -1


class Syscalls:
  """The kernel's VFIO: open and close of /dev/vfio files, ioctl (an int argument, or a ctypes object the kernel
  reads and writes in place) and a BAR's region mapped from the device fd. Tests pass a fake with these calls."""

  def open(self, path: str) -> int: return os.open(path, os.O_RDWR | os.O_CLOEXEC)
  def close(self, fd: int) -> None: os.close(fd)
  def ioctl(self, fd: int, request: int, arg: Any = 0) -> int:
    return fcntl.ioctl(fd, request, arg) if isinstance(arg, int) else fcntl.ioctl(fd, request, arg, True)
  def map_region(self, fd: int, index: int, size: int, offset: int) -> MappedBAR: return RegionBAR(fd, index, size, offset)


# ---- host memory through the IOMMU ----------------------------------------------------------------------------------

class VFIODMA:
  """A DMAAllocator (plugrt_nv_pci.dma) whose bus addresses are IOVAs of the function's VFIO container, and the BARs
  through its device fd (`map_bar`). Opening it needs the function bound to vfio-pci."""

  def __init__(self, function_dir: str, sys: Any = None, dev: str = DEV_VFIO):
    self.sys, self.dir, self.address = sys or Syscalls(), function_dir, os.path.basename(function_dir)
    self.container = self.group = self.device = -1
    self.maps: dict[int, tuple[int, int]] = {}   # CPU address -> (IOVA, size)
    self.bars: dict[int, MappedBAR] = {}
    self.ranges: list[tuple[int, int]] = []
    self.spaces: list[VASpace] = []
    try: self._open(dev)
    except BaseException:
      self.close()
      raise

  def _ioctl(self, fd: int, request: int, arg: Any, step: str, hint: str = "") -> int:
    try: return self.sys.ioctl(fd, request, arg)
    except OSError as e:
      raise VFIOError(f"{self.address}: {step} failed: {os.strerror(e.errno or 0)}", hint, step=step, errno=e.errno or 0) from None

  def _open_file(self, path: str, what: str, hints: dict[int, str]) -> int:
    try: return self.sys.open(path)
    except OSError as e:
      raise VFIOError(f"{self.address}: cannot open {what} {path}: {os.strerror(e.errno or 0)}", hints.get(e.errno or 0, ""),
                      step=f"opening {path}", errno=e.errno or 0) from None

  def _open(self, dev: str) -> None:
    group = group_of(self.dir)
    if not group:
      raise VFIOError(f"{self.address} has no IOMMU group: VFIO needs the IOMMU", "turn it on (intel_iommu=on or amd_iommu=on)",
                      step="finding the IOMMU group")
    self.container = self._open_file(os.path.join(dev, "vfio"), "the VFIO container",
                                     {errno.ENOENT: "sudo modprobe vfio-pci", errno.EACCES: "driverless access needs root"})
    if (v := self._ioctl(self.container, GET_API_VERSION, 0, "VFIO_GET_API_VERSION")) != API_VERSION:
      raise VFIOError(f"{self.address}: the kernel's VFIO API is version {v}, plugrt speaks version {API_VERSION}", step="VFIO_GET_API_VERSION")
    self.iommu = next((t for t in (TYPE1V2_IOMMU, TYPE1_IOMMU) if self._ioctl(self.container, CHECK_EXTENSION, t, "VFIO_CHECK_EXTENSION") > 0), 0)
    if not self.iommu:
      raise VFIOError(f"{self.address}: the kernel's VFIO offers no type-1 IOMMU (VFIO_TYPE1_IOMMU or VFIO_TYPE1v2_IOMMU)",
                      "load vfio_iommu_type1 (sudo modprobe vfio_iommu_type1), on an x86 or ARM machine with its IOMMU on",
                      step="VFIO_CHECK_EXTENSION")
    devices, drivers = os.path.dirname(self.dir), os.path.join(os.path.dirname(os.path.dirname(self.dir)), "drivers")
    self.group = self._open_file(os.path.join(dev, group), f"IOMMU group {group}",
                                 {errno.ENOENT: f"bind the function to vfio-pci: {bind_steps(self.address, self.dir, drivers)}",
                                  errno.EBUSY: "another program (a VM?) holds the group: close it", errno.EACCES: "driverless access needs root"})
    status = GroupStatus(argsz=ctypes.sizeof(GroupStatus))
    self._ioctl(self.group, GROUP_GET_STATUS, status, "VFIO_GROUP_GET_STATUS")
    if not status.flags & GROUP_FLAGS_VIABLE:
      blockers = {a: d for a, d in group_devices(self.dir).items() if d and d not in DMA_OWNER_DRIVERS}
      fix = "; ".join(bind_steps(a, os.path.join(devices, a), drivers) for a in blockers) or "unbind every device of the group from its driver"
      raise GroupNotViable(group, blockers, f"bind each to vfio-pci (or unbind it): {fix}")
    self._ioctl(self.group, GROUP_SET_CONTAINER, ctypes.c_int(self.container), "VFIO_GROUP_SET_CONTAINER")
    self._ioctl(self.container, SET_IOMMU, self.iommu, "VFIO_SET_IOMMU")
    self.ranges = [(max(s, LOW_IOVA), e + 1) for s, e in self._iova_ranges() if e + 1 > max(s, LOW_IOVA)]   # [lo, hi)
    self.spaces = [VASpace(lo, hi) for lo, hi in self.ranges]
    if not self.spaces: raise VFIOError(f"{self.address}: the IOMMU offers no IOVA range above {LOW_IOVA:#x}", step="VFIO_IOMMU_GET_INFO")
    self.device = self._ioctl(self.group, GROUP_GET_DEVICE_FD, ctypes.create_string_buffer(self.address.encode()), "VFIO_GROUP_GET_DEVICE_FD",
                              f"{self.address} must be bound to vfio-pci")

  def _iova_ranges(self) -> list[tuple[int, int]]:
    """The IOMMU's valid IOVA ranges (inclusive), from VFIO_IOMMU_GET_INFO's capability chain; its smallest page size
    must be the CPU's page (plugrt maps 4 KiB pages)."""
    info = IOMMUInfo(argsz=ctypes.sizeof(IOMMUInfo))
    self._ioctl(self.container, IOMMU_GET_INFO, info, "VFIO_IOMMU_GET_INFO")
    if info.flags & INFO_PGSIZES and info.iova_pgsizes & -info.iova_pgsizes > PAGE:
      raise VFIOError(f"{self.address}: the IOMMU's smallest page is {info.iova_pgsizes & -info.iova_pgsizes:#x} bytes, not {PAGE:#x}",
                      step="VFIO_IOMMU_GET_INFO")
    if not info.flags & INFO_CAPS or info.argsz <= ctypes.sizeof(IOMMUInfo): return list(FALLBACK_IOVAS)
    buf = (ctypes.c_char * info.argsz)()          # again, with room for the capabilities the kernel said it has
    IOMMUInfo.from_buffer(buf).argsz = info.argsz
    self._ioctl(self.container, IOMMU_GET_INFO, buf, "VFIO_IOMMU_GET_INFO")
    at, seen = IOMMUInfo.from_buffer(buf).cap_offset, set()
    while at and at not in seen and at + ctypes.sizeof(IOVARangeCap) <= len(buf):
      seen.add(at)
      cap = IOVARangeCap.from_buffer(buf, at)
      if cap.header.id == CAP_IOVA_RANGE:
        n = min(cap.nr_iovas, (len(buf) - at - ctypes.sizeof(IOVARangeCap)) // ctypes.sizeof(IOVARange))
        ranges = (IOVARange * n).from_buffer(buf, at + ctypes.sizeof(IOVARangeCap))
        return sorted((r.start, r.end) for r in ranges if r.end >= r.start)
      at = cap.header.next
    return list(FALLBACK_IOVAS)

  def _iova(self, size: int) -> int:
    for space in self.spaces:
      try: return space.alloc(size, PAGE)
      except MemoryError: continue
    raise VFIOError(f"{self.address}: no IOVA range of {size} bytes is left in the IOMMU's aperture", step="allocating an IOVA")

  def _release_iova(self, iova: int, size: int) -> None:
    for (lo, hi), space in zip(self.ranges, self.spaces, strict=True):
      if lo <= iova < hi: space.release(iova, size)

  def alloc(self, size: int, contiguous: bool = False, at: int | None = None) -> DMABuffer:
    """`size` bytes of host memory mapped for the GPU at consecutive IOVAs (`contiguous` always holds); at CPU address
    `at` when given (FileExistsError when something of this process is mapped there)."""
    size = -(-max(size, 1) // PAGE) * PAGE
    cpu = map_anonymous(size, at)
    try:
      iova = self._iova(size)
      try: self._map(cpu, iova, size)
      except BaseException:
        self._release_iova(iova, size)
        raise
    except BaseException:
      libc().munmap(cpu, size)
      raise
    self.maps[cpu] = (iova, size)
    return DMABuffer(cpu, size, [iova + i * PAGE for i in range(size // PAGE)])

  def _map(self, cpu: int, iova: int, size: int) -> None:
    m = DMAMap(argsz=ctypes.sizeof(DMAMap), flags=DMA_MAP_READ | DMA_MAP_WRITE, vaddr=cpu, iova=iova, size=size)
    try: self.sys.ioctl(self.container, IOMMU_MAP_DMA, m)
    except OSError as e:
      what = {errno.ENOMEM: ("the kernel cannot pin that much memory for this process (RLIMIT_MEMLOCK is too low)",
                             "raise the locked-memory limit (ulimit -l unlimited, or LimitMEMLOCK=infinity for a service)"),
              errno.ENOSPC: ("the container holds as many DMA mappings as vfio_iommu_type1 allows", "raise vfio_iommu_type1's dma_entry_limit"),
              errno.EINVAL: ("the IOMMU refused the range (outside its aperture, or not page-aligned)", ""),
              errno.EEXIST: ("the IOVA range overlaps a mapping already there", "")}.get(e.errno or 0, (os.strerror(e.errno or 0), ""))
      raise VFIOError(f"{self.address}: VFIO_IOMMU_MAP_DMA of {size} bytes at IOVA {iova:#x} failed: {what[0]}", what[1],
                      step="VFIO_IOMMU_MAP_DMA", errno=e.errno or 0) from None

  def free(self, buf: DMABuffer) -> None:
    if buf.cpu not in self.maps: return
    iova, size = self.maps.pop(buf.cpu)
    self._unmap(iova, size)
    self._release_iova(iova, size)
    libc().munmap(buf.cpu, size)

  def _unmap(self, iova: int, size: int) -> None:
    u = DMAUnmap(argsz=ctypes.sizeof(DMAUnmap), iova=iova, size=size)
    self._ioctl(self.container, IOMMU_UNMAP_DMA, u, "VFIO_IOMMU_UNMAP_DMA")
    if u.size != size:
      raise VFIOError(f"{self.address}: VFIO_IOMMU_UNMAP_DMA at IOVA {iova:#x} unmapped {u.size} of {size} bytes", step="VFIO_IOMMU_UNMAP_DMA")

  def map_bar(self, fn: Any, index: int) -> MappedBAR:
    """BAR `index` mmapped through the device fd (the `bars(function, index)` seam of open_pci)."""
    if index not in self.bars:
      r = RegionInfo(argsz=ctypes.sizeof(RegionInfo), index=index)
      self._ioctl(self.device, DEVICE_GET_REGION_INFO, r, "VFIO_DEVICE_GET_REGION_INFO")
      if not r.size or not r.flags & REGION_MMAP:
        raise VFIOError(f"{self.address}: BAR{index} through VFIO: region of {r.size} bytes, flags {r.flags:#x} (not mappable)",
                        step="VFIO_DEVICE_GET_REGION_INFO")
      try: self.bars[index] = self.sys.map_region(self.device, index, r.size, r.offset)
      except OSError as e:
        raise VFIOError(f"{self.address}: cannot map BAR{index} through VFIO: {e}", step="mmap of the device fd", errno=e.errno or 0) from None
    return self.bars[index]

  def close(self) -> None:
    """Unmap every buffer from the IOMMU and the process, close the BARs, the device, the group and the container."""
    for cpu, (iova, size) in list(self.maps.items()):
      try: self._unmap(iova, size)
      except VFIOError: pass          # closing the container below drops what is left
      libc().munmap(cpu, size)
    self.maps.clear()
    for bar in self.bars.values(): bar.close()
    self.bars.clear()
    for name in ("device", "group", "container"):
      if (fd := getattr(self, name)) >= 0:
        try: self.sys.close(fd)
        except OSError: pass
        setattr(self, name, -1)


# ---- the function under vfio-pci -------------------------------------------------------------------------------------

class VFIOFunction(PCIFunction):
  """A PCI function opened through VFIO: bound to vfio-pci while open (see the module's docstring)."""

  def __init__(self, *args: Any, **kw: Any):
    super().__init__(*args, **kw)
    self.vfio: VFIODMA | None = None
    self.bound_by_us = self.override_by_us = False

  def take(self) -> None:
    """Bind the function to vfio-pci (unbinding its driver first); nothing when it is bound to vfio-pci already. The
    function is not enabled through sysfs: vfio-pci enables it when the device fd is opened."""
    drv = self.driver()
    if drv == VFIO_DRIVER: return
    if not os.path.isdir(os.path.join(self.drivers, VFIO_DRIVER)):
      raise NoDMAPath(f"{self.address}: the vfio-pci driver is not loaded", "sudo modprobe vfio-pci")
    self._write(self.path("driver_override"), VFIO_DRIVER, "set driver_override to vfio-pci")
    self.override_by_us = True
    if drv:
      self._write(self.path("driver/unbind"), self.address, f"unbind {drv}")
      if self.driver():
        raise VFIOError(f"{self.address}: still bound to {drv} after writing driver/unbind", "another program holds it (close it)", step="unbind")
      self.unbound_driver = drv
    self._write(os.path.join(self.drivers, VFIO_DRIVER, "bind"), self.address, "bind vfio-pci")
    if self.driver() != VFIO_DRIVER:
      raise VFIOError(f"{self.address}: not bound to vfio-pci after writing its bind file (bound to {self.driver() or 'nothing'})",
                      "see the kernel log (dmesg) for vfio-pci's reason", step="bind vfio-pci")
    self.bound_by_us = True

  def release(self) -> list[str]:
    """Bus mastering off, VFIO closed, then the reset; unbind vfio-pci, clear driver_override and bind the function's
    driver back where take() changed them."""
    done = []
    if self.master_by_us:
      done.append(self._bus_master_off())
      self.master_by_us = False
    if self.vfio is not None:
      self.vfio.close()
      self.vfio = None
      done.append("VFIO closed")
    driver, self.unbound_driver = self.unbound_driver, ""
    done += super().release()          # the reset (where asked); nothing else is left for it
    if self.bound_by_us:
      try: self.write(self.path("driver/unbind"), self.address); done.append("unbound from vfio-pci")
      except OSError as e: done.append(f"unbinding vfio-pci failed ({e}): echo {self.address} | sudo tee {self.path('driver/unbind')}")
      self.bound_by_us = False
    if self.override_by_us:
      try: self.write(self.path("driver_override"), "\n")
      except OSError as e: done.append(f"clearing driver_override failed ({e})")
      self.override_by_us = False
    if driver:
      self.unbound_driver = driver
      done += super().release()
    return done


def describe_path(function_dir: str, drivers: str, asked: str) -> str:
  """The probe's words for the host-memory path opening would take (never raises)."""
  try: path, why = dma_path(function_dir, drivers, asked)
  except NoDMAPath as e: return f"host memory: none usable ({e.message}; {e.hint})"
  return f"host memory through {'VFIO' if path == 'vfio' else '/proc/self/pagemap'} ({why})"

