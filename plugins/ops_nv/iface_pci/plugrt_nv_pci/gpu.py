"""The GPU of the PCI interface once GSP-RM runs: what plugrt-nv's device needs (plugrt_nv/iface.py), made over RPC
where the NVK interface makes it with ioctls (docs/research/nv-pci.md, section 7, gives every step's source).

- Memory. The client owns the VRAM below the GSP's reserved region (GspFwWprMeta.gspFwRsvdStart; the bottom HEAP_BASE
  bytes held the boot's falcon images) and the GPU page tables (GPU-MMU v2 or v3 by generation, plugrt_nv_pci.mmu, in that VRAM). An
  allocation gets an address in the process's shared GPU/CPU window (plugrt_nv_nvk.nvk.PROCESS_VA, as NVK's do) and:
  "device": contiguous VRAM, GPU only; "mapped": contiguous VRAM that the CPU also maps at the same address through
  BAR1 (physical mode: BAR1 offset = VRAM address); "host": locked host pages at that address, mapped for the GPU by
  their bus addresses (the DMA allocator: /proc/self/pagemap) as coherent system memory. VRAM is zeroed through BAR1
  where BAR1 reaches it.
- GSP-RM's golden context: on an internal client (the handle tinygrad's driver uses), a device, subdevice and VA space,
  the engines' runlists (FIFO device info table), the PDEs above a reserved 512 MiB range copied to GSP-RM's
  server-side VA space, a channel whose GR context buffers (sizes from KGR_GET_CONTEXT_BUFFERS_INFO) the client
  allocates and promotes, then a compute and a copy object on it.
- The device's objects on the client plugrt_nv_pci.rpc opens (client, device, subdevice, class list, GR sizes): a VA
  space owned by the client (its page directory handed over with SET_PAGE_DIRECTORY), a channel group on GR with a
  context share, and two GPFIFO channels whose instance block, RAMFC, method buffer and USERD are VRAM the client
  supplies; the compute object with its main, PM and patch context buffers promoted; the copy object; the group
  scheduled; each channel's work-submit token with its runlist in bits 16 and up (GSP-RM fills in the channel id only).
- Submission: the rings and USERD in one "mapped" area; the doorbell is NV_VIRTUAL_FUNCTION_DOORBELL in BAR0.
- Faults: GSP-RM's RC_TRIGGERED and MMU_FAULT_QUEUED events in the status queue, read by `fault`.

**Never run on hardware: tested against the fake GPU of plugins/ops_nv/tests/fake_nvpci.py only.**
"""
from __future__ import annotations

import struct
import threading
from dataclasses import dataclass
from typing import Any

from plugrt.hwqueue import round_up
from plugrt_nv import hw
from plugrt_nv.iface import Channel, GPUInterface, Mem, NVError
from plugrt_nv_nvk import rm
from plugrt_nv_nvk.nvk import PROCESS_VA, VASpace
from plugrt_nv_pci import boot, mmu, msgq, rpc
from plugrt_nv_pci.dma import DMAAllocator
from plugrt_nv_pci.errors import GSPError

PAGE = 0x1000
HEAP_BASE = 8 << 20              # VRAM below this held the boot's falcon images (FWSEC at 1 MiB, booter_load at 4 MiB)
INTERNAL_CLIENT = 0xC1E00004     # the golden context's client (tinygrad's driver uses this handle)
RESERVED_VA = 512 << 20          # the range whose PDEs GSP-RM's server-side VA space shares (NV90F1 COPY_SERVER_RESERVED_PDES)
DOORBELL = 0xBB0090              # NV_VIRTUAL_FUNCTION_DOORBELL: BAR0 0xB80000 + 0x30090 (dev_vm.h)
ADDR_FB = 2                      # NV_MEMORY_DESC_PARAMS addressSpace: video memory (ADDR_FBMEM)
USERD_SIZE, RAMFC_SIZE, METHOD_BUFFER = 0x200, 0x200, 0x5000
GOLDEN_USERD = 0x20               # the golden channel's USERD bytes, after its ring
VASPACE_FLAGS = 1 << 3 | 1 << 6  # NV_VASPACE_ALLOCATION_FLAGS_IS_EXTERNALLY_OWNED | ENABLE_PAGE_FAULTING
# the golden channel's parameters, as tinygrad's driver passes them (cl906f.h: internalFlags and flags are RM-internal)
GOLDEN_ENTRIES, GOLDEN_CID, GOLDEN_INTERNAL_FLAGS, GOLDEN_FLAGS = 32, 3, 0x1A, 0x200320
# GR context buffers: NV2080_CTRL_GPU_PROMOTE_CTX_BUFFER_ID_* (ctrl2080gpu.h) -> the context-property index whose size
# KGR_GET_CONTEXT_BUFFERS_INFO gives (NV0080_CTRL_FIFO_GET_ENGINE_CONTEXT_PROPERTIES_ENGINE_ID_*, ctrl0080fifo.h), what to
# give GSP-RM (physical, virtual address), and extra bytes; MAIN 0 (GRAPHICS 0, +256 KiB), PM 1 and PATCH 2 (GRAPHICS_PATCH
# 16), BUNDLE_CB 3 .. RTV_CB_GLOBAL 6 (17-20, virtual only), FECS_EVENT 9 (23), PRIV_ACCESS_MAP 10 (24, physical only),
# UNRESTRICTED_PRIV_ACCESS_MAP 11 (24)
GR_BUFFERS = {0: (0, True, True, 0x40000), 1: (16, True, True, 0), 2: (16, True, True, 0), 3: (17, False, True, 0), 4: (18, False, True, 0),
              5: (19, False, True, 0), 6: (20, False, True, 0), 9: (23, True, True, 0), 10: (24, True, False, 0), 11: (24, True, True, 0)}
GOLDEN_BUFFERS = (0, 2, 3, 4, 5, 6, 9, 10, 11)   # promoted on the golden channel (PM is per channel)
CHANNEL_BUFFERS = (0, 1, 2)                      # promoted for each compute object: physical first, then virtual
ATTRIBUTE_CB_ALIGN = 2 << 20                     # buffer 5's alignment
PHYS_ATTR_VIDMEM = 0x4
XID = {13: "graphics engine exception", 31: "MMU fault", 43: "channel stopped", 45: "preemptive channel removal"}


@dataclass
class Block:
  """Contiguous VRAM at `phys`, mapped for the GPU at `va` (0: not mapped)."""
  phys: int
  size: int
  va: int = 0


class PCIInterface(GPUInterface):
  """The GPU behind `booted` (GSP-RM up, BAR1 physical): `fn` the PCI function (released on close), `regs` BAR0,
  `bar1` the VRAM window (write, map_at, unmap_at), `dma` host memory with bus addresses."""
  name = "PCI"

  def __init__(self, fn: Any, regs: Any, bar1: Any, dma: DMAAllocator, booted: boot.Booted, label: str):
    self.fn, self.regs, self.bar1, self.dma, self.q, self.label = fn, regs, bar1, dma, booted.queues, label
    self.bus_id = getattr(fn, "address", "")
    self.lock = threading.RLock()  # one RPC at a time; the page tables, heap and VA window
    self.closed = False
    self.faults: list[str] = []
    self.q.on_event = self._event
    self.heap = VASpace(HEAP_BASE, booted.meta.gspFwRsvdStart)
    self.va = PROCESS_VA
    self.pt = mmu.PageTables(self.heap, bar1.write, lambda: regs.write32(mmu.INVALIDATE, mmu.INVALIDATE_ALL),
                             mmu.FORMATS[booted.chip.generation.mmu])
    self.mems: list[Mem] = []
    self.blocks: list[Block] = []     # VRAM of RM objects (context buffers, instance blocks): kept until close
    self.channel_objs: dict[int, str] = {}  # channel handle -> name, for fault reports
    self.rec = booted.rec
    self._golden_context()
    self.rm = rpc.RM(self.q)
    objs = rpc.open_objects(self.rm)
    self.root, self.device, self.subdevice = objs.root, objs.device, objs.subdevice
    self.classes, self.gr, self.sm_version = objs.classes, objs.gr, objs.sm_version
    self.vaspace = self.rm.alloc(self.device, rm.VASPACE, rpc.L570.VASPACE_PARAMS(vaBase=PAGE, vaSize=0x1FFFFFB000000, flags=VASPACE_FLAGS),
                                 "the VA space (its page tables the client's)")
    self.rm.set_page_directory(self.device, self.vaspace, self.pt.root, self.pt.entries)
    self.doorbell = regs.address(DOORBELL)
    self.compute_channel = 0
    c = objs.classes
    self.rec.done(f"RM objects over RPC ({c.family.name}: compute {c.compute:#06x}, copy {c.copy:#06x}, channel {c.gpfifo:#06x}; "
                  f"{hw.arch_of(self.sm_version)}, {self.gr['sms']} SMs)")
    self.description = (f"{c.family.name} {booted.chip.name} at {self.bus_id} through PCI (driverless, GSP-RM {boot.GSP_VERSION}), "
                        f"{self.arch}, {self.gr['sms']} SMs, {booted.meta.gspFwRsvdStart >> 20} MiB of VRAM for plugrt, "
                        f"compute {c.compute:#06x}, copy {c.copy:#06x}, channel {c.gpfifo:#06x}; never run on hardware")

  # ------------------------------------------------------------ VRAM the client owns
  def _block(self, size: int, align: int = PAGE, mapped: bool = True) -> Block:
    """Contiguous VRAM (zeroed), mapped for the GPU at an address of the window when `mapped`; kept until close."""
    size = round_up(size, PAGE)
    b = Block(self._vram(size, align), size)
    if mapped:
      b.va = self.va.alloc(size, max(align, PAGE))
      self.pt.map(b.va, [b.phys + i * PAGE for i in range(size // PAGE)], mmu.APERTURE_VIDEO)
    self.blocks.append(b)
    return b

  def _vram(self, size: int, align: int = PAGE) -> int:
    try: phys = self.heap.alloc(size, align)
    except MemoryError:
      raise MemoryError(f"{self.label}: VRAM is full ({size} bytes asked; plugrt's part is {HEAP_BASE >> 20} MiB to "
                        f"{self.heap.holes[-1][1] >> 20 if self.heap.holes else '?'} MiB)") from None
    self._zero(phys, size)
    return phys

  def _zero(self, phys: int, size: int) -> None:
    """Zero VRAM through BAR1 (the part BAR1 reaches: a GPU whose BAR1 is smaller than its VRAM keeps the rest as is)."""
    end = min(phys + size, getattr(self.bar1, "size", phys + size))
    chunk = bytes(min(4 << 20, max(end - phys, 0)))
    for at in range(phys, end, len(chunk) or 1): self.bar1.write(at, chunk[:end - at])

  # ------------------------------------------------------------ GSP-RM's golden context
  def _golden_context(self) -> None:
    r = rpc.RM(self.q, INTERNAL_CLIENT)
    root = r.alloc(0, rpc.ROOT_CLASS, rpc.ROOT_PARAMS(hClient=r.client), "the internal RM client", handle=r.client)
    device = r.alloc(root, rm.DEVICE, rm.DEVICE_PARAMS(hClientShare=root), "the internal device")
    subdevice = r.alloc(device, rm.SUBDEVICE, rm.SUBDEVICE_PARAMS(), "the internal subdevice")
    vaspace = r.alloc(device, rm.VASPACE, rpc.L570.VASPACE_PARAMS(), "the internal VA space")
    table = r.control(subdevice, rpc.CTRL_DEVICE_INFO_TABLE, rpc.DEVICE_INFO_TABLE(), "reading the engines' runlists")
    self.runlists = {e.engineData[rpc.ENGINE_INFO_RM_ENGINE_TYPE]: e.engineData[rpc.ENGINE_INFO_RUNLIST]
                     for e in table.entries[:min(table.numEntries, len(table.entries))]}
    if rpc.ENGINE_GR0 not in self.runlists: raise NVError(f"{self.label}: GSP-RM's device info table lists no GR engine")
    reserved = self.va.alloc(RESERVED_VA, RESERVED_VA)
    levels = self.pt.fmt.levels
    depth = next(i for i, (shift, _, _) in enumerate(levels) if 1 << shift == RESERVED_VA) + 1  # down to the table of 512 MiB entries
    p = rpc.RESERVED_PDES(pageSize=RESERVED_VA, virtAddrLo=reserved, virtAddrHi=reserved + RESERVED_VA - 1, numLevelsToCopy=depth)
    for i, table_addr in enumerate(self.pt.table_path(reserved, depth)):
      p.levels[i] = rpc.PDE_LEVEL(physAddress=table_addr, size=self.pt.entries * 8 if i == 0 else PAGE, aperture=1, pageShift=levels[i][0])
    r.control(vaspace, rpc.CTRL_RESERVED_PDES, p, "sharing the reserved range's PDEs with GSP-RM")
    ring = self._block(PAGE)
    params = self._channel_params(ring, ring.va, GOLDEN_ENTRIES, GOLDEN_ENTRIES * 8, GOLDEN_USERD)
    params.engineType, params.cid, params.hVASpace = rpc.ENGINE_GR0, GOLDEN_CID, vaspace
    params.internalFlags, params.flags = GOLDEN_INTERNAL_FLAGS, GOLDEN_FLAGS
    channel = r.alloc(device, self.classes_offered(r, device).gpfifo, params, "the golden-context channel")
    info = r.control(subdevice, rpc.CTRL_CTX_BUFFERS_INFO, rpc.CTX_BUFFERS_INFO(), "reading GR's context buffer sizes").engine[0]
    self.gr_sizes = {}
    for buf, (prop, _, _, extra) in GR_BUFFERS.items():
      align = ATTRIBUTE_CB_ALIGN if buf == 5 else max(info[prop].alignment, 1)
      self.gr_sizes[buf] = (round_up(info[prop].size + extra, align), align)
    self._promote(r, subdevice, channel, GOLDEN_BUFFERS, None)
    golden = self.classes_offered(r, device)
    r.alloc(channel, golden.compute, None, "the golden context's compute object")
    r.alloc(channel, golden.copy, None, "the golden context's copy object")
    self.rec.done("GSP-RM's golden context (internal client, GR context promoted, compute and copy objects)")

  def classes_offered(self, r: rpc.RM, device: int) -> hw.Classes:
    if getattr(self, "_golden_classes", None) is None:
      cl = r.control(device, rm.CTRL_CLASSLIST_V2, rpc.L570.CLASSLIST_V2(), "listing the GPU's classes")
      picked = hw.pick_classes(set(cl.classList[:cl.numClasses]))
      if picked is None:
        raise NVError(f"{self.label}: GSP-RM offers none of the compute classes plugrt-nv knows", "add the family to plugrt_nv/hw.py")
      self._golden_classes = picked
    return self._golden_classes

  def _promote(self, r: rpc.RM, subdevice: int, channel: int, ids: tuple[int, ...], how: str | None,
               blocks: dict[int, Block] | None = None) -> dict[int, Block]:
    """NV2080_CTRL_CMD_GPU_PROMOTE_CTX of GR context buffers `ids` for `channel`, each in VRAM of its own (or `blocks`'s);
    `how` None gives each as GR_BUFFERS says, "physical" or "virtual" only that address."""
    p = rpc.PROMOTE_CTX(engineType=rpc.ENGINE_GR0, hChanClient=r.client, hObject=channel, entryCount=len(ids))
    out = {}
    for i, buf in enumerate(ids):
      size, align = self.gr_sizes[buf]
      _, phys, virt, _ = GR_BUFFERS[buf]
      phys, virt = (phys, virt) if how is None else (how == "physical", how == "virtual")
      b = out[buf] = (blocks or {}).get(buf) or self._block(size, align)
      p.promoteEntry[i] = rpc.PROMOTE_ENTRY(gpuPhysAddr=b.phys if phys else 0, gpuVirtAddr=b.va if virt else 0, size=size if phys else 0,
                                            physAttr=PHYS_ATTR_VIDMEM if phys else 0, bufferId=buf, bInitialize=phys,
                                            bNonmapped=phys and not virt)
    r.control(subdevice, rpc.CTRL_PROMOTE_CTX, p, f"promoting GR context buffers {list(ids)}")
    return out

  def _channel_params(self, area: Block, ring_va: int, entries: int, userd_offset: int, userd_size: int) -> Any:
    """CHANNEL_PARAMS with the VRAM the client supplies: instance block and RAMFC (one page), method buffer, USERD at
    `userd_offset` in `area` (its VRAM address also where the handles would go, as tinygrad's driver passes it)."""
    inst, methods = self._block(PAGE, mapped=False), self._block(METHOD_BUFFER, mapped=False)
    p = rpc.L570.CHANNEL_PARAMS(gpFifoOffset=ring_va, gpFifoEntries=entries, hObjectBuffer=area.phys)
    p.hUserdMemory[0], p.userdOffset[0] = area.phys, userd_offset
    p.instanceMem = rm.MEMORY_DESC(base=inst.phys, size=PAGE, addressSpace=ADDR_FB)
    p.ramfcMem = rm.MEMORY_DESC(base=inst.phys, size=RAMFC_SIZE, addressSpace=ADDR_FB)
    p.mthdbufMem = rm.MEMORY_DESC(base=methods.phys, size=METHOD_BUFFER, addressSpace=ADDR_FB)
    p.userdMem = rm.MEMORY_DESC(base=area.phys + userd_offset, size=userd_size, addressSpace=ADDR_FB)
    return p

  # ------------------------------------------------------------ memory
  def alloc(self, size: int, kind: str = "device") -> Mem:
    if kind not in ("device", "mapped", "host"): raise ValueError(f"memory kind {kind!r}")
    size = round_up(max(size, 1), PAGE)
    with self.lock:
      if self.closed: raise NVError(f"{self.label} is closed")
      va, bad = self.va.alloc(size, PAGE), []
      try:
        while True:  # the CPU's mapping first: where something else of this process lives, take the next range
          try:
            if kind == "host": private: dict[str, Any] = {"host": self.dma.alloc(size, at=va)}
            else:
              private = {"phys": self._vram(size)}
              if kind == "mapped":
                try: self.bar1.map_at(va, private["phys"], size)
                except BaseException:
                  self.heap.release(private["phys"], size)
                  raise
            break
          except FileExistsError:
            bad.append(va)
            va = self.va.alloc(size, PAGE)
      except BaseException:
        self.va.release(va, size)
        raise
      finally:
        for b in bad: self.va.release(b, size)  # (the window's record only: the CPU range stays whatever lives there)
      if kind == "host": self.pt.map(va, private["host"].pages, mmu.APERTURE_SYSTEM, volatile=True)
      else: self.pt.map(va, [private["phys"] + i * PAGE for i in range(size // PAGE)], mmu.APERTURE_VIDEO)
      mem = Mem(va, size, kind, private)
      self.mems.append(mem)
      return mem

  def free(self, mem: Mem) -> None:
    with self.lock:
      if mem not in self.mems: return
      self.mems.remove(mem)
      if not self.closed: self.pt.unmap(mem.va, mem.size // PAGE)
      self._release(mem)

  def _release(self, mem: Mem) -> None:
    if mem.kind == "host": self.dma.free(mem.private["host"])
    else:
      if mem.kind == "mapped": self.bar1.unmap_at(mem.va, mem.size)
      self.heap.release(mem.private["phys"], mem.size)
    self.va.release(mem.va, mem.size)

  # ------------------------------------------------------------ channels
  def channels(self, entries: int) -> tuple[Channel, Channel]:
    with self.lock:
      if self.compute_channel: raise NVError("this GPU's channels are already open")
      r, c = self.rm, self.classes
      group = r.alloc(self.device, rm.CHANNEL_GROUP, rm.CHANNEL_GROUP_PARAMS(engineType=rpc.ENGINE_GR0), "a channel group")
      area = self.alloc(0x200000, "mapped")  # both rings and their USERD, written by the CPU, read by the GPU
      ctxshare = r.alloc(group, rm.CONTEXT_SHARE, rm.CTXSHARE_PARAMS(hVASpace=self.vaspace, flags=1), "a context share")
      block = Block(area.private["phys"], area.size, area.va)
      compute = self._channel("compute", group, ctxshare, block, 0, entries, c.compute)
      copy = self._channel("copy", group, ctxshare, block, 0x100000, entries, c.copy)
      r.control(group, rm.CTRL_SCHEDULE, rpc.L570.SCHEDULE(bEnable=1), "scheduling the channel group")
      self.rec.done("channel group scheduled (compute and copy channels)")
      return compute, copy

  def _channel(self, name: str, group: int, ctxshare: int, area: Block, off: int, entries: int, engine_class: int) -> Channel:
    userd = off + entries * 8
    p = self._channel_params(area, area.va + off, entries, userd, USERD_SIZE)
    p.hContextShare = ctxshare
    r = self.rm
    ch = r.alloc(group, self.classes.gpfifo, p, f"the {name} channel")
    self.channel_objs[ch] = name
    r.alloc(ch, engine_class, None, f"the {name} engine object")
    if engine_class == self.classes.compute:
      self.compute_channel = ch
      bufs = self._promote(r, self.subdevice, ch, CHANNEL_BUFFERS, "physical")
      self._promote(r, self.subdevice, ch, CHANNEL_BUFFERS, "virtual", bufs)
    token = r.control(ch, rm.CTRL_WORK_SUBMIT_TOKEN, rm.WORK_SUBMIT_TOKEN(workSubmitToken=0xFFFFFFFF), f"reading the {name} channel's token")
    return Channel(name, area.va + off, entries, area.va + userd, token.workSubmitToken | self.runlists[rpc.ENGINE_GR0] << 16)

  # ------------------------------------------------------------ faults
  def _event(self, m: msgq.Message) -> None:
    if m.function == msgq.Function.RC_TRIGGERED and len(m.payload) >= 20:
      engine, chid, _, _, xid = struct.unpack_from("<5I", m.payload)
      self.faults.append(f"channel {chid} (engine {engine}): Xid {xid}: {XID.get(xid, hw.XID.get(xid, 'channel error'))}")
    elif m.function == msgq.Function.MMU_FAULT_QUEUED: self.faults.append("GSP-RM queued an MMU fault")
    elif m.function == msgq.Function.OS_ERROR_LOG:
      self.faults.append(m.payload[16:16 + 0x100].split(b"\0")[0].decode(errors="replace"))

  def fault(self, deep: bool = False) -> str:
    """GSP-RM's error events so far (the status queue read without waiting)."""
    if self.lock.acquire(blocking=False):
      try:
        if not self.closed and not self.q.broken:
          for m in self.q.messages("reading GSP-RM's events"): self._event(m)
      except GSPError as e: self.faults.append(f"GSP-RM's status queue: {e.message}")
      finally: self.lock.release()
    return "; ".join(self.faults)

  # ------------------------------------------------------------ close
  def close(self) -> None:
    """Stop GSP-RM, drop the CPU's mappings, reset the function and bind its driver back."""
    with self.lock:
      if self.closed: return
      self.closed = True
      why = boot.unload(self.q)
      for mem in self.mems: self._release(mem)
      self.mems.clear()
      done = self.fn.release()
      self.dma.close()
      self.released = [*([why] if why else []), *done]

