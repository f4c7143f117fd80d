"""The NVK interface: an NVIDIA GPU opened through the kernel driver's device files, with no CUDA library.

Bring-up (once per GPU): the process's RM client on /dev/nvidiactl and its UVM file (client.py: one for every NV
GPU, so one GPU's memory can be mapped into another's VA space), the GPU's device and subdevice (its /dev/nvidiaN
must be open in the process first), a VA space whose page tables the UVM driver owns (/dev/nvidia-uvm), the
usermode page that holds the doorbell, and a channel group with a compute and a copy channel. Memory is placed in that
VA space at an address plugrt picks, and where the CPU needs it, mapped at the same address in the process
(vidmem through the GPU's BAR, host memory as ordinary pages the GPU reads over PCIe).
"""
from __future__ import annotations

import ctypes
import errno
import mmap
import os
import struct
from typing import Any

from plugrt.hwqueue import libc, round_up
from plugrt_nv import hw
from plugrt_nv.iface import Channel, GPUInterface, Mem, NVError
from plugrt_nv_nvk import client, rm

PAGE, HUGE = 0x1000, 0x200000
VA_BASE, VA_LIMIT = 0x10_0000_0000, 0xFE_0000_0000  # every buffer below 2^40: push buffers and QMDs must be
CHANNEL_VA = 64 << 20  # what UVM reserves for a channel's context buffers
MAP_SHARED, MAP_ANONYMOUS, MAP_FIXED_NOREPLACE = 0x01, 0x20, 0x100000
WRITE_COMBINED = 2 << 23  # NVOS33 caching type
# memory recipes (NV_MEMORY_ALLOCATION_PARAMS): attr, attr2, flags
FLAGS_VIDMEM = 0x1 | 0x100 | 0x4000 | 0x8000 | 0x10000  # ignore bank placement, force alignment, handle provided, map not required, persistent
ATTR_CONTIGUOUS, ATTR_NONCONTIGUOUS, ATTR_HUGE, ATTR_PCI = 2 << 27, 3 << 27, 3 << 23, 1 << 25
ATTR2_CACHED, ATTR2_UNCACHED, ATTR2_NO_ZBC, ATTR2_HUGE_2MB = 1 << 2, 2 << 2, 1, 1 << 20
OS_DESCRIPTOR_FLAGS = 1 << 4 | 1 << 12 | 1 << 30  # noncontiguous, cached, no CPU mapping by RM (the pages are ours)
NVOS46_FLAGS = 1 << 8 | 1 << 4 | 1 << 15          # 4 KiB page kind, snoop the CPU's caches, at the offset given


class VASpace:
  """First-fit allocator of GPU (and shared CPU) addresses in [base, limit)."""

  def __init__(self, base: int, limit: int):
    self.holes: list[tuple[int, int]] = [(base, limit)]  # sorted, disjoint [start, end)

  def alloc(self, size: int, align: int) -> int:
    for i, (s, e) in enumerate(self.holes):
      a = round_up(s, align)
      if a + size <= e:
        self.holes[i:i + 1] = [h for h in ((s, a), (a + size, e)) if h[0] < h[1]]
        return a
    raise MemoryError(f"no free GPU address range of {size} bytes left")

  def release(self, va: int, size: int) -> None:
    holes = sorted([*self.holes, (va, va + size)])
    merged = [holes[0]]
    for s, e in holes[1:]:
      if s <= merged[-1][1]: merged[-1] = (merged[-1][0], max(e, merged[-1][1]))
      else: merged.append((s, e))
    self.holes = merged


#: one address space for the whole process: CPU-visible buffers of every GPU share the process's addresses
PROCESS_VA = VASpace(VA_BASE, VA_LIMIT)


class _OpenOnTheClient(Exception):
  """The GPU is open on this RM client already (NVKInterface.__init__ then opens it on a client of its own)."""


class NVKInterface(GPUInterface):
  name = "NVK"

  def __init__(self, index: int = 0):
    self.fds: list[int] = []
    self.mems: list[Mem] = []
    self.channel_vas: list[int] = []  # addresses UVM keeps for the channels' context buffers
    self.va = PROCESS_VA
    self.device = self.uuid_registered = self.vaspace_registered = 0
    self.gpu_id = -1
    self.uuid = b""
    self.client: client.Client | None = None
    try:
      try:
        self._use(client.acquire(), shared=True)  # one RM client and one UVM file for every NV GPU of the process
        self._open_gpu(index)
      except _OpenOnTheClient:
        # this GPU is open on the process's client already (a second registry of the process): UVM registers a GPU
        # once a file, so this one gets a client and UVM file of its own, without peer access (as before they were shared)
        client.release(self.client)  # type: ignore[arg-type]  (nothing of this GPU was made on it)
        self.client = None
        self._use(client.Client(), shared=False)
        self._open_gpu(index)
    except BaseException:
      self.close()
      raise

  def _use(self, c: client.Client, shared: bool) -> None:
    self.client = c
    if not shared: c.refs += 1  # a client of this GPU's own: released (and closed) by close(), as a shared one is
    self.ctl, self.uvm, self.root, self.driver, self.L = c.ctl, c.uvm, c.root, c.driver, c.L

  def _open_gpu(self, index: int) -> None:
    cards = (rm.CARD_INFO * 64)()
    rm.ioctl(self.ctl, rm.ESC_CARD_INFO, cards, "listing GPUs")
    # NV:i is the GPU of the i-th smallest minor among those whose node this process has (a container may have some), as the probe lists
    valid = sorted((c for c in cards if c.valid and os.path.exists(f"/dev/nvidia{c.minor_number}")), key=lambda c: c.minor_number)
    if index >= len(valid): raise NVError(f"NV:{index} does not exist: the driver lists {len(valid)} GPU(s)", f"use an index below {len(valid)}")
    card = valid[index]
    c = self.client
    with c.lock:  # claimed before anything is made: a second open of this GPU on this client goes to a client of its own
      if any(g.gpu_id == card.gpu_id for g in c.gpus): raise _OpenOnTheClient
      self.gpu_id = card.gpu_id
      c.gpus.append(self)
    self.minor, self.pci_device = card.minor_number, card.pci.device_id
    self.bus_id = f"{card.pci.domain:04x}:{card.pci.bus:02x}:{card.pci.slot:02x}.{card.pci.function:x}"  # as /proc/driver/nvidia names it
    self.gpu = self._gpu_fd()  # before the device object: RM checks that the process has the GPU's node open
    ids = self.control(self.root, rm.CTRL_GPU_ID_INFO_V2, rm.GPU_ID_INFO_V2(gpuId=card.gpu_id), "reading the GPU's id")
    self.device = self.rm_alloc(self.root, rm.DEVICE, rm.DEVICE_PARAMS(deviceId=ids.deviceInstance, hClientShare=self.root), what="the GPU device")
    self.subdevice = self.rm_alloc(self.device, rm.SUBDEVICE, rm.SUBDEVICE_PARAMS(), what="the GPU subdevice")
    self.virtmem = self.rm_alloc(self.device, rm.MEMORY_VIRTUAL, rm.VIRTUAL_PARAMS(limit=0x1FFFFFFFFFFFF), what="a virtual-memory object")
    cl = self.control(self.device, rm.CTRL_CLASSLIST_V2, self.L.CLASSLIST_V2(), "listing the GPU's classes")
    offered = set(cl.classList[:cl.numClasses])
    picked = hw.pick_classes(offered)
    if picked is None:
      raise NVError(f"this GPU (PCI device {self.pci_device:#06x}) offers none of the compute classes plugrt-nv knows "
                    f"({', '.join(f.name for f in hw.FAMILIES)})", "add the family to plugrt_nv/hw.py FAMILIES")
    self.classes = picked
    usermode = self.rm_alloc(self.subdevice, picked.usermode, None, what="the usermode (doorbell) object")
    self.usermode = self._map_to_cpu(usermode, 0x10000, None, 0, system=False)[0]
    self.doorbell = self.usermode + hw.USERMODE_DOORBELL
    self.vaspace = self.rm_alloc(self.device, rm.VASPACE, self.L.VASPACE_PARAMS(vaBase=0x1000, vaSize=0x1FFFFFB000000, flags=0x48),
                                 what="a VA space (page faulting, owned by UVM)")
    gid = self.control(self.subdevice, rm.CTRL_GID_INFO, rm.GID_INFO(flags=2, length=16), "reading the GPU's UUID")
    self.uuid = bytes(gid.data[:16])
    self.uvm_call(rm.UVM_REGISTER_GPU, rm.UVM_REGISTER_GPU_PARAMS(gpu_uuid=rm.UUID(*self.uuid), rmCtrlFd=-1), "UVM_REGISTER_GPU")
    self.uuid_registered = 1
    self.uvm_call(rm.UVM_REGISTER_GPU_VASPACE, rm.UVM_REGISTER_GPU_VASPACE_PARAMS(gpuUuid=rm.UUID(*self.uuid), rmCtrlFd=self.ctl, hClient=self.root,
                  hVaSpace=self.vaspace), "UVM_REGISTER_GPU_VASPACE")
    self.vaspace_registered = 1
    items = (rm.GR_INFO_ITEM * len(rm.GR_INFO))(*[rm.GR_INFO_ITEM(index=i) for i in rm.GR_INFO.values()])
    self.control(self.subdevice, rm.CTRL_GR_INFO, rm.GR_INFO_PARAMS(grInfoListSize=len(items), grInfoList=ctypes.addressof(items)), "reading GR info")
    self.gr = {k: it.data for k, it in zip(rm.GR_INFO, items)}
    self.gr["sms"] = self.gr["cores"] // 128 if self.gr["cores"] else self.gr["gpcs"] * self.gr["tpc_per_gpc"] * self.gr["sm_per_tpc"]
    self.sm_version = self.gr["sm_version"]
    self.notifiers: list[tuple[str, int]] = []
    self.debugger = self.compute_channel = self.video = 0
    self.video_engine = -1  # which NVDEC the video channel is on, once open
    self.description = (f"{picked.family.name} (PCI device {self.pci_device:#06x} at {self.bus_id}, {self.arch}, {self.gr['sms']} SMs), "
                        f"driver {self.driver}, "
                        f"compute {picked.compute:#06x}, copy {picked.copy:#06x}, channel {picked.gpfifo:#06x}, "
                        f"video decoder {f'{picked.video:#06x}' if picked.video else 'none'}")

  # ------------------------------------------------------------ RM and UVM calls
  def _open(self, path: str) -> int:
    try: fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError as e: raise NVError(f"cannot open {path}: {e.strerror}", "run where the NVIDIA driver is loaded and you may use the GPU") from None
    self.fds.append(fd)
    return fd

  def _gpu_fd(self) -> int:
    fd = self._open(f"/dev/nvidia{self.minor}")
    rm.ioctl(fd, rm.ESC_REGISTER_FD, rm.REGISTER_FD(ctl_fd=self.ctl), f"registering /dev/nvidia{self.minor}")
    return fd

  def rm_alloc(self, parent: int, cls: int, params: ctypes.Structure | None, root: int | None = None, what: str = "") -> int:
    p = rm.NVOS21(hRoot=self.root if root is None else root, hObjectParent=parent, hClass=cls, pAllocParms=rm.ref(params))
    rm.ioctl(self.ctl, rm.ESC_RM_ALLOC, p, f"allocating {what or hex(cls)}")
    if p.status in rm.NO_MEMORY: raise MemoryError(f"the GPU is out of memory allocating {what or hex(cls)}: {rm.status_name(p.status)}")
    if p.status: raise NVError(f"allocating {what or 'class'} (class {cls:#x}) failed: {rm.status_name(p.status)}")
    return p.hObjectNew

  def control(self, obj: int, cmd: int, params: Any, what: str) -> Any:
    p = rm.NVOS54(hClient=self.root, hObject=obj, cmd=cmd, params=rm.ref(params), paramsSize=ctypes.sizeof(params))
    rm.ioctl(self.ctl, rm.ESC_RM_CONTROL, p, what)
    if p.status: raise NVError(f"{what} failed: {rm.status_name(p.status)} (control {cmd:#x})")
    return params

  def rm_free(self, parent: int, obj: int) -> None:
    p = rm.NVOS00(hRoot=self.root, hObjectParent=parent, hObjectOld=obj)
    rm.ioctl(self.ctl, rm.ESC_RM_FREE, p, "freeing an object")

  def uvm_call(self, cmd: int, params: Any, what: str, fd: int | None = None) -> Any:
    rm.uvm_ioctl(self.uvm if fd is None else fd, cmd, params, what)
    return params

  def _mmap(self, va: int | None, size: int, fd: int) -> int:
    flags = MAP_SHARED | (MAP_ANONYMOUS if fd < 0 else 0) | (MAP_FIXED_NOREPLACE if va is not None else 0)
    addr = libc().mmap(va or 0, size, mmap.PROT_READ | mmap.PROT_WRITE, flags, fd, 0)
    if addr in (None, ctypes.c_void_p(-1).value) or (va is not None and addr != va):
      err = ctypes.get_errno()
      if addr not in (None, ctypes.c_void_p(-1).value): libc().munmap(addr, size)
      if err == errno.EEXIST: raise FileExistsError(f"{va:#x} is already mapped in this process")
      raise NVError(f"cannot map {size} bytes at {va or 0:#x} into the process: {os.strerror(err)}")
    return addr

  def _map_to_cpu(self, handle: int, size: int, va: int | None, flags: int, system: bool) -> tuple[int, int]:
    """CPU mapping of an RM memory object: a fresh fd gets the mapping context (one per fd), then mmap it."""
    fd = self._open("/dev/nvidiactl") if system else self._gpu_fd()
    p = rm.NVOS33_FD(params=rm.NVOS33(hClient=self.root, hDevice=self.device, hMemory=handle, length=size, flags=flags), fd=fd)
    rm.ioctl(self.ctl, rm.ESC_RM_MAP_MEMORY, p, "mapping GPU memory for the CPU")
    if p.params.status: raise NVError(f"mapping GPU memory for the CPU failed: {rm.status_name(p.params.status)}")
    return self._mmap(va, size, fd), fd

  # ------------------------------------------------------------ memory
  def alloc(self, size: int, kind: str = "device") -> Mem:
    page = HUGE if kind == "device" and size >= 8 << 20 else PAGE
    size = round_up(max(size, 1), page)
    va = self.va.alloc(size, page)
    mem = Mem(va, size, kind, {"handle": 0, "fd": -1, "cpu": False, "range": False})
    try:
      if kind == "host":
        while True:
          try: self._mmap(va, size, -1)
          except FileExistsError:  # something else of this process lives there: leave that range alone, take the next
            mem.va = va = self.va.alloc(size, page)
            continue
          break
        mem.private["cpu"] = True
        p = rm.NVOS02_FD(params=rm.NVOS02(hRoot=self.root, hObjectParent=self.device, hObjectNew=self.client.new_handle(), hClass=rm.OS_DESCRIPTOR,
                                          flags=OS_DESCRIPTOR_FLAGS, pMemory=va, limit=size - 1), fd=-1)
        rm.ioctl(self.gpu, rm.ESC_RM_ALLOC_MEMORY, p, "registering host memory with the GPU")
        if p.params.status: raise NVError(f"registering {size} bytes of host memory with the GPU failed: {rm.status_name(p.params.status)}")
        mem.private["handle"] = p.params.hObjectNew
      else:
        attr = (ATTR_CONTIGUOUS if kind == "mapped" else ATTR_NONCONTIGUOUS) | (ATTR_HUGE if page == HUGE else 0)
        attr2 = ATTR2_CACHED | ATTR2_NO_ZBC | (ATTR2_HUGE_2MB if page == HUGE else 0)
        params = rm.MEMORY_PARAMS(owner=self.root, type=0, flags=FLAGS_VIDMEM, attr=attr, attr2=attr2, format=6, size=size, alignment=page,
                                  limit=size - 1)
        mem.private["handle"] = self.rm_alloc(self.device, rm.MEMORY_USER, params, what=f"{size} bytes of GPU memory")
        if kind == "mapped":
          _, mem.private["fd"] = self._map_to_cpu(mem.private["handle"], size, va, WRITE_COMBINED, system=False)
          mem.private["cpu"] = True
      mem.private["range"] = True
      self._gpu_map(va, size, mem.private["handle"])
    except BaseException:
      self._release(mem)
      raise
    self.mems.append(mem)
    return mem

  def _gpu_map(self, va: int, size: int, handle: int) -> None:
    """Put an RM memory object at `va` in the GPU's VA space (UVM owns the page tables)."""
    self.uvm_call(rm.UVM_CREATE_EXTERNAL_RANGE, rm.UVM_CREATE_EXTERNAL_RANGE_PARAMS(base=va, length=size), "UVM_CREATE_EXTERNAL_RANGE")
    p = self.L.NVOS46(hClient=self.root, hDevice=self.device, hDma=self.virtmem, hMemory=handle, length=size, flags=NVOS46_FLAGS, dmaOffset=va)
    rm.ioctl(self.ctl, rm.ESC_RM_MAP_MEMORY_DMA, p, "mapping memory for the GPU")
    if p.status or p.dmaOffset != va:
      raise NVError(f"mapping memory at GPU address {va:#x} failed: {rm.status_name(p.status)} (got {p.dmaOffset:#x})")
    attrs = rm.UVM_MAP_EXTERNAL_ALLOCATION_PARAMS(base=va, length=size, gpuAttributesCount=1, rmCtrlFd=self.ctl, hClient=self.root,
                                                             hMemory=handle)
    attrs.perGpuAttributes[0].gpuUuid[:] = list(self.uuid)
    attrs.perGpuAttributes[0].gpuMappingType = 1  # read, write, atomics
    self.uvm_call(rm.UVM_MAP_EXTERNAL_ALLOCATION, attrs, "UVM_MAP_EXTERNAL_ALLOCATION")

  def _release(self, mem: Mem) -> None:
    pv = mem.private
    if pv["range"]:
      try: self.uvm_call(rm.UVM_FREE, self.L.UVM_FREE_PARAMS(base=mem.va, **({} if self.L.branch >= 610 else {"length": mem.size})), "UVM_FREE")
      except NVError: pass
    if pv["handle"]:
      try: self.rm_free(self.device, pv["handle"])
      except NVError: pass
    if pv["cpu"]: libc().munmap(mem.va, mem.size)
    if pv["fd"] >= 0:
      os.close(pv["fd"])
      self.fds.remove(pv["fd"])
    self.va.release(mem.va, mem.size)

  def free(self, mem: Mem) -> None:
    self.mems.remove(mem)
    self._release(mem)

  # ------------------------------------------------------------ channels
  def channels(self, entries: int) -> tuple[Channel, Channel]:
    if self.compute_channel: raise NVError("this GPU's channels are already open")
    tsg = self.rm_alloc(self.device, rm.CHANNEL_GROUP, rm.CHANNEL_GROUP_PARAMS(engineType=1), what="a channel group")
    area = self.alloc(0x200000, "mapped")  # both rings and their control areas, written by the CPU, read by the GPU
    ctxshare = self.rm_alloc(tsg, rm.CONTEXT_SHARE, rm.CTXSHARE_PARAMS(hVASpace=self.vaspace, flags=1), what="a context share")
    compute = self._channel("compute", tsg, ctxshare, area, 0, entries, self.classes.compute)
    copy = self._channel("copy", tsg, ctxshare, area, 0x100000, entries, self.classes.copy)
    self.control(tsg, rm.CTRL_SCHEDULE, self.L.SCHEDULE(bEnable=1), "scheduling the channel group")
    return compute, copy

  def _channel(self, name: str, tsg: int, ctxshare: int, area: Mem, off: int, entries: int, engine_class: int) -> Channel:
    notifier = self.rm_alloc(self.device, rm.MEMORY_SYSTEM, rm.MEMORY_PARAMS(
      owner=self.root, type=13, flags=0xC101, attr=ATTR_NONCONTIGUOUS | ATTR_PCI, attr2=ATTR2_UNCACHED | ATTR2_NO_ZBC, format=6, size=PAGE,
      alignment=PAGE, limit=PAGE - 1), what=f"the {name} channel's error notifier")
    try:
      addr = self._map_to_cpu(notifier, PAGE, None, 0, system=True)[0]
      ctypes.memset(addr, 0, PAGE)  # fresh pages may hold anything; the driver writes a record here when the channel faults
      self.notifiers.append((name, addr))
    except NVError: pass  # the driver still records errors; we only lose reading them back
    p = self.L.CHANNEL_PARAMS(hObjectError=notifier, hObjectBuffer=area.private["handle"], gpFifoOffset=area.va + off, gpFifoEntries=entries,
                              hContextShare=ctxshare)
    p.hUserdMemory[0], p.userdOffset[0] = area.private["handle"], off + entries * 8
    ch = self.rm_alloc(tsg, self.classes.gpfifo, p, what=f"the {name} channel")
    engine = self.rm_alloc(ch, engine_class, None, what=f"the {name} engine object")
    if engine_class == self.classes.compute:
      self.compute_channel = ch
      try: self.debugger = self.rm_alloc(self.device, rm.DEBUGGER, rm.DEBUGGER_PARAMS(hAppClient=self.root, hClass3dObject=engine), what="debugger")
      except NVError: self.debugger = 0  # only for fault reports
    token = self.control(ch, rm.CTRL_WORK_SUBMIT_TOKEN, rm.WORK_SUBMIT_TOKEN(workSubmitToken=0xFFFFFFFF), f"reading the {name} channel's token")
    base = self.va.alloc(CHANNEL_VA, HUGE)
    self.channel_vas.append(base)
    self.uvm_call(rm.UVM_REGISTER_CHANNEL, rm.UVM_REGISTER_CHANNEL_PARAMS(gpuUuid=rm.UUID(*self.uuid), rmCtrlFd=self.ctl, hClient=self.root,
                  hChannel=ch, base=base, length=CHANNEL_VA), "UVM_REGISTER_CHANNEL")
    return Channel(name, area.va + off, entries, area.va + off + entries * 8, token.workSubmitToken)

  def video_channel(self, entries: int) -> Channel:
    """A channel on the GPU's first video decode engine (NVDEC k, the lowest the GPU reports: not always 0) with the
    video decoder object: a channel group of its own on NVDEC k in the device's default VA space (where every buffer
    is mapped at the same address as in UVM's, through the virtual-memory object), the ring given as a virtual address
    (hObjectBuffer: the virtual-memory object), no UVM registration, the object's allocation parameters naming k.
    On Hopper the decoder object was refused while plugrt named NVDEC0, which a GPU may lack (GH100 has room for eight
    decoders, and parts have fewer): hence NVDEC k (docs/video.md, "NV's own video engine")."""
    from plugrt_nv import nvdec
    if not self.classes.video:
      raise NVError(f"this {self.classes.family.name} GPU offers no video decoder class plugrt-nv knows "
                    f"({', '.join(f'{c:#06x}' for c in self.classes.family.video) or 'none for this family'})",
                    "decode on the CUDA device (libnvcuvid) or in software")
    if self.video: raise NVError("this GPU's video channel is already open")
    area = self.alloc(round_up(entries * 8 + PAGE, PAGE), "mapped")
    notifier = self.rm_alloc(self.device, rm.MEMORY_SYSTEM, rm.MEMORY_PARAMS(
      owner=self.root, type=13, flags=0xC101, attr=ATTR_NONCONTIGUOUS | ATTR_PCI, attr2=ATTR2_UNCACHED | ATTR2_NO_ZBC, format=6, size=PAGE,
      alignment=PAGE, limit=PAGE - 1), what="the video channel's error notifier")
    try:
      addr = self._map_to_cpu(notifier, PAGE, None, 0, system=True)[0]
      ctypes.memset(addr, 0, PAGE)
      self.notifiers.append(("video", addr))
    except NVError: pass
    # the engine: RM takes the decoder object's engine from its allocation parameters (engineInstance), and the
    # channel's runlist from its engine type; both must name a decoder the GPU has. Naming NVDEC0 where the GPU lacked it gave
    # NV_ERR_INVALID_CLASS (the object, with parameters), NV_ERR_OBJECT_NOT_FOUND (a bind) and NV_ERR_INVALID_STATE
    # (no parameters: RM picked another NVDEC than the channel's): all three what a missing NVDEC0 gives
    listed = self.control(self.subdevice, rm.CTRL_GPU_GET_ENGINES_V2, rm.GPU_ENGINES_V2(), "listing the GPU's engines")
    k = nvdec.first_decoder(listed.engineList[:min(listed.engineCount, len(listed.engineList))])
    if k is None:
      raise NVError("this GPU reports no video decode engine (NVDEC) in its engine list", "decode on the CUDA device (libnvcuvid) or in software")
    engine = nvdec.ENGINE_NVDEC0 + k
    # in a channel group of its own on NVDEC k, as every channel is on Volta and later
    tsg = self.rm_alloc(self.device, rm.CHANNEL_GROUP, rm.CHANNEL_GROUP_PARAMS(engineType=engine), what=f"the video channel group (NVDEC{k})")
    p = self.L.CHANNEL_PARAMS(hObjectError=notifier, hObjectBuffer=self.virtmem, gpFifoOffset=area.va, gpFifoEntries=entries, engineType=engine)
    p.hUserdMemory[0], p.userdOffset[0] = area.private["handle"], entries * 8
    ch = self.rm_alloc(tsg, self.classes.gpfifo, p, what=f"the video channel (NVDEC{k})")
    self.rm_alloc(ch, self.classes.video, nvdec.BSPAllocParams(size=ctypes.sizeof(nvdec.BSPAllocParams), engineInstance=k),
                  what=f"the video decoder object (class {self.classes.video:#06x}, NVDEC{k})")
    self.video_engine = k
    self.control(tsg, rm.CTRL_SCHEDULE, self.L.SCHEDULE(bEnable=1), "scheduling the video channel group")
    token = self.control(ch, rm.CTRL_WORK_SUBMIT_TOKEN, rm.WORK_SUBMIT_TOKEN(workSubmitToken=0xFFFFFFFF), "reading the video channel's token")
    self.video = ch
    return Channel("video", area.va, entries, area.va + entries * 8, token.workSubmitToken)

  # ------------------------------------------------------------ faults
  def fault(self, deep: bool = False) -> str:
    out = []
    for name, addr in self.notifiers:
      _, xid, engine, status = struct.unpack("<QIHH", ctypes.string_at(addr, 16))
      if status: out.append(f"{name} channel: Xid {xid}: {hw.XID.get(xid, 'channel error')} (engine {engine}, status {status:#x})")
    if deep and self.debugger:
      try:
        e = self.control(self.debugger, rm.CTRL_SM_ERRORS, rm.SM_ERRORS(hTargetChannel=self.compute_channel, numSMsToRead=100), "reading SM errors")
        if e.mmuFaultValid:
          m = self.control(self.debugger, rm.CTRL_MMU_FAULT, rm.MMU_FAULTS(), "reading MMU faults")
          out += [f"MMU fault at {f.faultAddress:#x} (type {f.faultType}, access {'read write atomic prefetch'.split()[f.accessType % 4]})"
                  for f in m.faults[:m.count]]
        out += [f"SM {i}: error {s.hwwGlobalEsr:#x}, warp error {s.hwwWarpEsr:#x} at pc {s.hwwWarpEsrPc64:#x}" for i, s in enumerate(e.sm)
                if s.hwwGlobalEsr or s.hwwWarpEsr][:4]
      except NVError as err: out.append(f"(SM error state unreadable: {err.message})")
    return "; ".join(out)

  # ------------------------------------------------------------ peers
  def peer_access(self, other: GPUInterface) -> str:
    if not isinstance(other, NVKInterface) or other.client is None or other.client is not self.client:
      return f"NV:{getattr(other, 'minor', '?')} is not open through the same kernel-driver client"
    return self.client.peer_access(self, other)

  def map_peer(self, mem: Mem, other: GPUInterface) -> None:
    """Map `mem` (this GPU's) at its address into `other`'s VA space too: UVM_MAP_EXTERNAL_ALLOCATION of its handle
    with the other GPU's UUID alone, in the external range this GPU made (the UVM file is shared, so the range is
    the process's). The owner's own mapping is left alone: listing its UUID again would make UVM unmap and remap it
    while its queue may be using it. Video memory needs peer access enabled first (peer_access); host memory
    does not. Freeing `mem` (UVM_FREE of the range) removes every GPU's mapping of it."""
    assert isinstance(other, NVKInterface)
    peers = mem.private.setdefault("peers", set())
    if other.uuid in peers: return
    p = rm.UVM_MAP_EXTERNAL_ALLOCATION_PARAMS(base=mem.va, length=mem.size, gpuAttributesCount=1, rmCtrlFd=self.ctl, hClient=self.root,
                                              hMemory=mem.private["handle"])
    p.perGpuAttributes[0].gpuUuid[:] = list(other.uuid)
    p.perGpuAttributes[0].gpuMappingType = 1  # read, write, atomics
    self.uvm_call(rm.UVM_MAP_EXTERNAL_ALLOCATION, p, f"mapping {mem.size} bytes of NV:{self.minor}'s memory into NV:{other.minor}")
    peers.add(other.uuid)

  def close(self) -> None:
    """Give back everything this GPU holds, leaving the shared client to the other GPUs: its memory's ranges (UVM_FREE
    also removes other GPUs' mappings of it), its peer pairs, its UVM registrations, its RM device object (RM frees
    everything under it: subdevice, VA space, channels, memory), its CPU mappings and files. The last GPU only
    unmaps and closes the files, the client's too: the driver then frees everything, as it did before the client
    was shared (the one teardown that has run on hardware)."""
    c = self.client
    if c is None: return
    self.client = None
    if c.refs > 1: self._give_back(c)
    for m in self.mems:
      if m.private["cpu"]: libc().munmap(m.va, m.size)
      self.va.release(m.va, m.size)
    for base in self.channel_vas: self.va.release(base, CHANNEL_VA)
    self.mems.clear()
    self.channel_vas.clear()
    for fd in self.fds:
      try: os.close(fd)
      except OSError: pass
    self.fds.clear()
    with c.lock:
      if self in c.gpus: c.gpus.remove(self)
    client.release(c)

  def _give_back(self, c: client.Client) -> None:
    """This GPU's part of the shared client, freed explicitly while other GPUs keep using the client."""
    for m in self.mems:
      if m.private["range"]:
        try: self.uvm_call(rm.UVM_FREE, self.L.UVM_FREE_PARAMS(base=m.va, **({} if self.L.branch >= 610 else {"length": m.size})), "UVM_FREE")
        except NVError: pass
    if self.uuid: c.forget(self)
    for done, cmd, params in ((self.vaspace_registered, rm.UVM_UNREGISTER_GPU_VASPACE, rm.UVM_UNREGISTER_GPU_VASPACE_PARAMS),
                              (self.uuid_registered, rm.UVM_UNREGISTER_GPU, rm.UVM_UNREGISTER_GPU_PARAMS)):
      if done:
        try: self.uvm_call(cmd, params(rm.UUID(*self.uuid)), "unregistering the GPU from UVM")
        except NVError: pass
    if self.device:
      try: self.rm_free(self.root, self.device)
      except NVError: pass
