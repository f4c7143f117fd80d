"""Fakes for the compute stage of the driverless AMD bring-up: the memory hubs' VM contexts (FakeVM: decodes the page
tables plugrt wrote in VRAM and translates addresses), the MEC's hardware queue descriptors and a doorbell BAR
(FakeMEC: the HQD registers per GRBM selection, checked against the MQD in VRAM and the kernel's values when the
queue is activated; then, on a doorbell, the AQL packets of the ring, read through the queue's VMID).

The page-table and MQD formats are written out here from the kernel's headers (amdgpu_vm.h, v11_structs.h,
gc_11_0_0 offsets; GMC 12: gmc_v12_0.c, mmhub_4_1_0 and gc_12_0_0 offsets), apart from plugrt_amd_pci.vm /
plugrt_amd_pci.mec, so that a wrong bit in one is caught by the other.
Dispatches run with the fake KFD's machinery: plugrt_amd.aql decodes the packets and kernel descriptors and
plugrt_testing.fakegpu.DispatchRunner runs the kernel's IR (registered with `load`, as fake_kfd.FakeKFD.load) on
numpy views of the fake VRAM (hence a dense FakeVRAM).
"""
from __future__ import annotations

import struct
import time
from typing import Any

import numpy as np
from fake_amdgpu import GC_BASES, MMHUB_BASES, FakeRegisters, FakeVRAM
from fake_kfd import natural_kernarg_layout, vector_accesses

from plugrt.compiler.ir import Kernel
from plugrt_amd import aql
from plugrt_testing.fakegpu import DispatchRunner

#: the hubs' context registers (segment 0): CONTEXT0_CNTL, PAGE_TABLE_BASE_ADDR_LO32, START_ADDR_LO32, END_ADDR_LO32
HUB_REGS = {"MMHUB": (MMHUB_BASES[0], 0x740, 0x7AB, 0x7CB, 0x7EB), "GFXHUB": (GC_BASES[0], 0x1688, 0x16F3, 0x1713, 0x1733)}
#: GMC 12: mmhub_4_1_0_offset.h and gc_12_0_0_offset.h
HUB_REGS_12 = {"MMHUB": (MMHUB_BASES[0], 0x564, 0x5CF, 0x5EF, 0x60F), "GFXHUB": (GC_BASES[0], 0x1624, 0x168F, 0x16AF, 0x16CF)}
#: per GMC generation: CONTEXTn_CNTL's PAGE_TABLE_BLOCK_SIZE shift (mmhub_3_0_0 / mmhub_4_1_0 sh_mask) and the PTE's
#: MTYPE (shift, mask) (amdgpu_vm.h: AMDGPU_PTE_MTYPE_NV10 bits 48-50, AMDGPU_PTE_MTYPE_GFX12 bits 54-55)
GMC_FORMAT = {11: (3, 48, 0x7), 12: (4, 54, 0x3)}


class Fault(Exception):
  """A translation the fake hub refuses (what a real one reports as a VM protection fault)."""


class FakeVM:
  """Address translation of one hub, from its registers and the tables in VRAM (never from plugrt's objects).
  `phys_base` is VRAM's physical base (what GCMC_VM_FB_OFFSET reports; the fake's is 0 unless set)."""

  def __init__(self, regs: FakeRegisters, vram: FakeVRAM, phys_base: int = 0):
    self.r, self.vram, self.phys = regs, vram, phys_base
    self.walks, self.last_pte, self.last_mtype = 0, 0, 0
    self.gmc = getattr(regs, "gmc", 11)
    self.hubs = HUB_REGS if self.gmc == 11 else HUB_REGS_12
    self.system: Any = None          # what system pages reach (a FakeASM24: its SRAM window); None: a system page faults
    self.last_system = False

  def reg(self, hub: str, which: int, vmid: int) -> int:
    base, cntl, *addr = self.hubs[hub]
    if which == 0: return self.r.regs.get(base + cntl + vmid, 0)
    lo = base + addr[which - 1] + 2 * vmid
    return self.r.regs.get(lo, 0) | self.r.regs.get(lo + 1, 0) << 32

  def read64(self, pa: int) -> int:
    off = pa - self.phys
    if not 0 <= off < self.vram.size: raise Fault(f"table at physical 0x{pa:x} is outside VRAM")
    return struct.unpack("<Q", self.vram.read(off, 8))[0]

  def translate(self, va: int, vmid: int, hub: str = "GFXHUB", access: str = "r", system: bool = False) -> int:
    """The VRAM offset `va` reaches in `vmid` (a 4-level walk, GMC 11's format), or a Fault saying why not. With
    `system`, a system page is allowed when `self.system` serves its bus address: then that bus address is returned
    and `last_system` is set."""
    cntl = self.reg(hub, 0, vmid)
    if not cntl & 1: raise Fault(f"{hub} context {vmid} is not enabled")
    bs_shift, mtype_shift, mtype_mask = GMC_FORMAT[self.gmc]
    if (cntl >> 1 & 3, cntl >> bs_shift & 0xF) != (3, 0):
      raise Fault(f"{hub} context {vmid}: depth {cntl >> 1 & 3}, block size {cntl >> bs_shift & 0xF}")
    page = va >> 12
    if not self.reg(hub, 2, vmid) <= page <= self.reg(hub, 3, vmid): raise Fault(f"VA 0x{va:x} outside context {vmid}'s range")
    base = self.reg(hub, 1, vmid)
    if not base & 1: raise Fault(f"{hub} context {vmid} has no valid page-table base")
    inv = self.r.invalidation if hub == "MMHUB" else self.r.gc_invalidation
    table, walked = base & 0x0000FFFFFFFFF000, []
    for shift in (39, 30, 21):
      walked.append(table)
      e = self.read64(table + (va >> shift & 511) * 8)
      if not e & 1: raise Fault(f"VA 0x{va:x}: PDE at level shift {shift} not valid")
      if e & 1 << 54: raise Fault(f"VA 0x{va:x}: a PDE used as a PTE (not written by plugrt)")
      table = e & 0x0000FFFFFFFFFFC0
    walked.append(table)
    e = self.read64(table + (va >> 12 & 511) * 8)
    if not e & 1: raise Fault(f"VA 0x{va:x}: PTE not valid")
    if e & 2 and not (system and self.system is not None): raise Fault(f"VA 0x{va:x}: a system page (no DMA in the fake)")
    if e >> 48 & 0xFFFF & ~(mtype_mask << (mtype_shift - 48)):
      raise Fault(f"VA 0x{va:x}: PTE 0x{e:x} sets bits 48-63 outside GMC {self.gmc}'s MTYPE field")
    need = {"r": 1 << 5, "w": 1 << 6, "x": 1 << 4}[access]
    if not e & need: raise Fault(f"VA 0x{va:x}: PTE 0x{e:x} lacks the {access} permission")
    frag, pa = e >> 7 & 0x1F, e & 0x0000FFFFFFFFF000
    if (page ^ pa >> 12) & ((1 << frag) - 1): raise Fault(f"VA 0x{va:x}: fragment {frag} but VA and PA are not equally aligned")
    for t in walked:
      if self.vram.stamp.get((t - self.phys) >> 12, 0) > inv.flushed.get(vmid, -1):
        raise Fault(f"{hub} context {vmid}: a page table at 0x{t:x} changed after the last TLB flush of VMID {vmid}")
    self.walks, self.last_pte, self.last_mtype = self.walks + 1, e, e >> mtype_shift & mtype_mask
    self.last_system = bool(e & 2)
    if e & 2:
      if self.last_mtype != 3 or e & 4: raise Fault(f"VA 0x{va:x}: the bridge's SRAM mapped cached or snooped (PTE 0x{e:x}), not UC")
      return pa + (va & 0xFFF)
    return pa - self.phys + (va & 0xFFF)

  def read(self, va: int, n: int, vmid: int) -> bytes:
    return b"".join(self.vram.read(self.translate(a, vmid), min(n - (a - va), 0x1000 - (a & 0xFFF)))
                    for a in _pages(va, n))

  def write(self, va: int, data: bytes, vmid: int) -> None:
    for a in _pages(va, len(data)):
      k = min(len(data) - (a - va), 0x1000 - (a & 0xFFF))
      self.vram.device_write(self.translate(a, vmid, access="w"), data[a - va:a - va + k])


def _pages(va: int, n: int) -> list[int]:
  out, a = [], va
  while a < va + n:
    out.append(a)
    a = (a & ~0xFFF) + 0x1000
  return out


class VRAMMemory:
  """What DispatchRunner needs of a memory: numpy views of a VMID's buffers, over the dense fake VRAM, each as far as
  the mapping stays physically contiguous."""

  def __init__(self, vm: FakeVM, vmid: int):
    self.vm, self.vmid = vm, vmid

  def array(self, addr: int, dtype: Any) -> np.ndarray:
    start = self.vm.translate(addr, self.vmid, access="w", system=True)
    system = self.vm.last_system
    end, a = start - (addr & 0xFFF) + 0x1000, (addr & ~0xFFF) + 0x1000
    while True:
      try: nxt = self.vm.translate(a, self.vmid, access="w", system=True)
      except Fault: break
      if nxt != end or self.vm.last_system != system: break
      end, a = end + 0x1000, a + 0x1000
    if system:                         # the bridge's SRAM (bus SRAM_BUS..), read and written by the GPU's own DMA
      sram, bus = self.vm.system.sram, self.vm.system.SRAM_BUS
      if not (bus <= start and end <= bus + len(sram)): raise Fault(f"VA 0x{addr:x}: system page at bus 0x{start:x} outside the SRAM")
      return np.frombuffer(sram, dtype=dtype.numpy, count=(end - start) // dtype.itemsize, offset=start - bus)
    return np.frombuffer(self.vm.vram.chunks[0], dtype=dtype.numpy, count=(end - start) // dtype.itemsize, offset=start)


HQD_FIRST, HQD_LAST, MQD_HQD = 0x1FA9, 0x1FE0, 128      # v11_structs.h: cp_mqd_base_addr_lo is dword 128
R = {n: 0x1FA9 + i for i, n in enumerate(("MQD_BASE", "MQD_BASE_HI", "ACTIVE", "VMID", "PERSISTENT", "PIPE_PRIO", "QUEUE_PRIO",
                                          "QUANTUM", "PQ_BASE", "PQ_BASE_HI", "PQ_RPTR", "RPTR_REPORT", "RPTR_REPORT_HI",
                                          "WPTR_POLL", "WPTR_POLL_HI", "DOORBELL"))}
R |= {"PQ_CONTROL": 0x1FBA, "EOP_BASE": 0x1FCE, "EOP_BASE_HI": 0x1FCF, "EOP_CONTROL": 0x1FD0, "EOP_RPTR": 0x1FD1, "AQL_CONTROL": 0x1FDE,
      "MQD_CONTROL": 0x1FCB, "IB_CONTROL": 0x1FBE}


class FakeMEC:
  """MEC 1 of a GC 11 or 12 fake (the same HQD registers): HQD registers kept per (ME, pipe, queue) from GRBM_GFX_CNTL, SH_MEM_* per VMID, and the
  queues that CP_HQD_ACTIVE started (`queues`); `doorbells` is the BAR2 window. Problems: `violations`."""

  def __init__(self, regs: FakeRegisters, vram: FakeVRAM, mc_base: int, phys_base: int = 0):
    self.r, self.vram, self.mc_base = regs, vram, mc_base
    self.vm = FakeVM(regs, vram, phys_base)
    self.grbm = GC_BASES[1] + 0x900
    self.hqd: dict[tuple[int, int, int], dict[int, int]] = {}
    self.sh_mem: dict[int, tuple[int, int]] = {}
    self.queues: dict[int, dict[str, int]] = {}      # doorbell dword offset -> queue
    self.violations: list[str] = []
    self.runner = DispatchRunner(VRAMMemory(self.vm, 8))   # type: ignore[arg-type]
    self.kernargs: dict[int, tuple[list[int], int]] = {}
    self.dispatches: list[aql.KernelDispatchPacket] = []
    self.faults: list[str] = []            # what stopped a queue (a VM fault, a rejected dispatch)
    self.registered: dict[bytes, list[Any]] = {}    # kernel descriptor bytes -> (code object, kernel info, IR)
    self.infos: dict[int, Any] = {}                 # kernel_object -> its code object's kernel info
    self.doorbells = FakeDoorbells(self)
    self.profiled: list[tuple[int, int]] = []       # (start_ts, end_ts) written into completion signals
    self.scratch_checked = 0                        # dispatches whose scratch set-up was checked
    for reg in range(HQD_FIRST, HQD_LAST + 1): regs.on_write[GC_BASES[0] + reg] = lambda v, reg=reg: self._hqd(reg, v)
    for name, off in (("config", 0x9E4), ("bases", 0x9E3)): regs.on_write[GC_BASES[1] + off] = lambda v, name=name: self._sh_mem(name, v)

  def load(self, kernel_object: int, kernel: Kernel, offsets: list[int] | None = None, size: int | None = None) -> None:
    """Run dispatches of the descriptor at VA `kernel_object` (VMID 8) as `kernel`, its arguments at `offsets` of a
    `size`-byte kernarg segment (default: natural_kernarg_layout)."""
    self.runner.load(kernel_object, kernel)
    offs, n = natural_kernarg_layout(kernel.signature)
    self.kernargs[kernel_object] = (offs if offsets is None else offsets, n if size is None else size)

  def register(self, code_object: bytes, kernel: Kernel) -> None:
    """As fake_kfd.FakeKFD.register: `kernel` is the program of `code_object` wherever its image gets loaded."""
    from plugrt_amd import codeobject
    co = codeobject.parse(code_object)
    info = co.kernels[kernel.name]
    self.registered.setdefault(info.descriptor.raw, []).append((co, info, kernel))

  def _resolve(self, ko: int, vmid: int) -> None:
    """The registered program whose image, relocated to where it lies, is the memory around kernel_object `ko`."""
    kd = self.vm.read(ko, 64, vmid)
    for co, info, kernel in sorted(self.registered.get(kd, ()), key=lambda e: vector_accesses(e[2])):
      base = ko - info.kd_offset
      try: here = self.vm.read(base, co.image_size, vmid)
      except Fault: continue  # memory around ko is not that large: another program
      if here == bytes(co.image(base)):
        explicit = info.explicit_args
        offs = [a.offset for a in explicit if a.kind == "global_buffer"] + [a.offset for a in explicit if a.kind != "global_buffer"]
        self.load(ko, kernel, offs, info.kernarg_size)
        self.infos[ko] = info
        return

  def _sel(self) -> tuple[int, int, int, int]:
    v = self.r.regs.get(self.grbm, 0)
    return v >> 2 & 3, v & 3, v >> 8 & 7, v >> 4 & 0xF

  def _sh_mem(self, name: str, value: int) -> None:
    vmid = self._sel()[3]
    cfg, bases = self.sh_mem.get(vmid, (None, None))
    self.sh_mem[vmid] = (value, bases) if name == "config" else (cfg, value)

  def _hqd(self, reg: int, value: int) -> None:
    me, pipe, queue, _ = self._sel()
    self.hqd.setdefault((me, pipe, queue), {})[reg] = value
    if reg == R["ACTIVE"] and value & 1: self._activate((me, pipe, queue))

  def _activate(self, sel: tuple[int, int, int]) -> None:
    h, bad = self.hqd[sel], self.violations.append
    me, pipe, _ = sel
    mec = self.r.regs.get(GC_BASES[1] + 0x2904, 0)
    if me != 1 or mec & 1 << 30 or not mec & 1 << (26 + pipe): bad(f"queue {sel} activated on a halted or inactive MEC pipe (0x{mec:x})")
    mqd_at = (h.get(R["MQD_BASE"], 0) | h.get(R["MQD_BASE_HI"], 0) << 32) - self.mc_base
    if not 0 <= mqd_at < self.vram.size - 2048: return bad(f"MQD at MC 0x{mqd_at + self.mc_base:x} is not in VRAM's system aperture")
    m = struct.unpack("<512I", self.vram.read(mqd_at, 2048))
    if m[0] != 0xC0310800: bad(f"MQD header 0x{m[0]:x}")
    missing = [f"0x{r:x}" for r in range(HQD_FIRST, HQD_LAST + 1) if r not in h]
    if missing: bad(f"HQD registers never written: {missing}")
    for r in range(HQD_FIRST, HQD_LAST + 1):
      if r in (R["ACTIVE"], R["DOORBELL"], R["EOP_RPTR"]): continue
      if h.get(r) != m[MQD_HQD + r - HQD_FIRST]: bad(f"HQD register 0x{r:x} = {h.get(r)} differs from the MQD's {m[MQD_HQD + r - HQD_FIRST]}")
    ctl, bell = h.get(R["PQ_CONTROL"], 0), h.get(R["DOORBELL"], 0)
    if h.get(R["AQL_CONTROL"]) != 1 or not ctl & 1 << 27 or ctl >> 18 & 3 != 2 or ctl >> 8 & 0x3F != 5:
      bad(f"not an AQL queue as the KFD makes one: PQ_CONTROL 0x{ctl:x}, AQL_CONTROL {h.get(R['AQL_CONTROL'])}")
    if not bell & 1 << 30: bad("doorbell not enabled (CP_HQD_PQ_DOORBELL_CONTROL.DOORBELL_EN)")
    lo, hi = self.r.regs.get(GC_BASES[0] + 0x1DFC, 0), self.r.regs.get(GC_BASES[0] + 0x1DFD, -1)
    offset = bell >> 2 & 0x3FFFFFF
    if not lo <= offset * 4 <= hi: bad(f"doorbell dword {offset} outside the MEC's range 0x{lo:x}-0x{hi:x}")
    if not h.get(R["EOP_RPTR"], 0) & 1 << 31: bad("EOP fetcher not started (CP_HQD_EOP_RPTR.INIT_FETCHER)")
    vmid = h.get(R["VMID"], 0)
    if self.sh_mem.get(vmid) != (0xC00C, 0x10002): bad(f"VMID {vmid}'s SH_MEM_CONFIG/BASES are {self.sh_mem.get(vmid)}")
    if not self.r.regs.get(GC_BASES[0] + self.vm.hubs["GFXHUB"][1] + vmid, 0) & 1: bad(f"GFXHUB context {vmid} not enabled")
    self.queues[offset] = {"vmid": vmid, "ring": (h[R["PQ_BASE"]] | h[R["PQ_BASE_HI"]] << 32) << 8, "size": 4 * (2 << (ctl & 0x3F)),
                           "rptr_va": h[R["RPTR_REPORT"]] | h[R["RPTR_REPORT_HI"]] << 32,
                           "wptr_va": h[R["WPTR_POLL"]] | h[R["WPTR_POLL_HI"]] << 32, "rptr": 0}

  def ring(self, offset: int, value: int) -> None:
    """A doorbell write at dword `offset`: run the packets of the queue behind it up to index `value`."""
    q = self.queues.get(offset)
    if q is None: return self.violations.append(f"doorbell dword {offset} rung with no active queue behind it")
    if self.vram.dirty: self.violations.append("doorbell rung while CPU writes sit in the HDP (no flush)")
    if q.get("fault"): return
    try: self._run(q, value)
    except (Fault, KeyError) as e:        # a VM fault or a dispatch the CP rejects: the queue stops (no IH ring to report it)
      q["fault"] = str(e)
      self.faults.append(str(e))

  def _run(self, q: dict[str, int], value: int) -> None:
    vmid, entries = q["vmid"], q["size"] // 64
    wptr = struct.unpack("<Q", self.vm.read(q["wptr_va"], 8, vmid))[0]
    while q["rptr"] <= value and q["rptr"] < wptr:
      raw = self.vm.read(q["ring"] + (q["rptr"] % entries) * 64, 64, vmid)
      if aql.packet_type(raw) == aql.PACKET_TYPE_INVALID: break
      p = aql.decode_packet(raw)
      start = gpu_ticks()
      if isinstance(p, aql.KernelDispatchPacket): self._dispatch(p, q)
      q["rptr"] += 1
      self.vm.write(q["rptr_va"], struct.pack("<Q", q["rptr"]), vmid)
      if p.completion_signal:
        d = self.amd_queue(q)
        if d is not None and d.queue_properties & aql.AMD_QUEUE_PROPERTIES_ENABLE_PROFILING:   # before the value, as fake_kfd
          end = max(gpu_ticks(), start + 1)
          self.vm.write(p.completion_signal + aql.AmdSignal.start_ts.offset, struct.pack("<QQ", start, end), vmid)
          self.profiled.append((start, end))
        value_at = p.completion_signal + 8
        (v,) = struct.unpack("<q", self.vm.read(value_at, 8, vmid))
        self.vm.write(value_at, struct.pack("<q", v - 1), vmid)

  def amd_queue(self, q: dict[str, int]) -> aql.AmdQueue | None:
    """The queue's amd_queue_t, found as the packet processor finds it: its read pointer report address is the
    struct's read_dispatch_id, and read_dispatch_id_field_base_byte_offset says how far in that is."""
    off = aql.AmdQueue.read_dispatch_id.offset
    d = aql.AmdQueue.from_buffer_copy(self.vm.read(q["rptr_va"] - off, aql.AMD_QUEUE_SIZE, q["vmid"]))
    return d if d.read_dispatch_id_field_base_byte_offset == off else None

  def _check_scratch(self, name: str, p: aql.KernelDispatchPacket, q: dict[str, int]) -> None:
    """As fake_kfd's: the amd_queue_t must describe scratch mapped writable in the queue's VMID, large enough for
    p.private_segment_size bytes a work-item for the waves COMPUTE_TMPRING_SIZE lets hold it, and the apertures
    SH_MEM_BASES gives the VMID."""
    d, need, vmid = self.amd_queue(q), p.private_segment_size, q["vmid"]
    if d is None: raise Fault(f"{name}: needs scratch, and the read pointer is not an amd_queue_t's read_dispatch_id")
    major = 12 if self.r.gmc == 12 else 11
    loc, size = d.scratch_backing_memory_location, d.scratch_backing_memory_byte_size
    if not loc or not size: raise Fault(f"{name}: needs {need} bytes of scratch a work-item; the queue's amd_queue_t gives none")
    for a in range(loc, loc + size, 0x1000): self.vm.translate(a, vmid, access="w")     # every page mapped, writable, VRAM
    waves, wave_bytes = aql.tmpring_fields(d.compute_tmpring_size, major)
    if d.scratch_wave64_lane_byte_size < need or wave_bytes < need * aql.SCRATCH_LANES or not waves or waves * wave_bytes > size:
      raise Fault(f"{name}: needs {need} bytes of scratch a work-item; amd_queue_t gives {d.scratch_wave64_lane_byte_size} a lane, "
                  f"{waves} waves of {wave_bytes} bytes in {size}")
    srd = list(d.scratch_resource_descriptor)
    if srd[0] != loc & 0xFFFFFFFF or srd[1] & 0xFFFF != loc >> 32 & 0xFFFF or srd[2] < size & 0xFFFFFFFF:
      raise Fault(f"{name}: the scratch resource descriptor {[hex(w) for w in srd]} does not describe the scratch at {loc:#x}")
    bases = (self.sh_mem.get(vmid) or (None, 0))[1] or 0
    if d.private_segment_aperture_base_hi != (bases & 0xFFFF) << 16:
      raise Fault(f"{name}: amd_queue_t's private aperture 0x{d.private_segment_aperture_base_hi:x} is not SH_MEM_BASES' 0x{bases:x}")
    self.scratch_checked += 1

  def _dispatch(self, p: aql.KernelDispatchPacket, q: dict[str, int]) -> None:
    self.dispatches.append(p)
    vmid = q["vmid"]
    ko = p.kernel_object
    if ko % 64: raise Fault(f"kernel_object 0x{ko:x} is not 64-byte aligned")
    self.vm.translate(ko, vmid, access="x")
    kd = aql.KernelDescriptor.from_buffer_copy(self.vm.read(ko, 64, vmid))
    if ko not in self.runner.programs: self._resolve(ko, vmid)
    if ko not in self.runner.programs: raise Fault(f"no program is loaded at kernel_object 0x{ko:x}")
    kernel = self.runner.programs[ko]
    offsets, size = self.kernargs[ko]
    if kd.kernarg_size != size: raise Fault(f"{kernel.name}: descriptor kernarg_size {kd.kernarg_size}, the code reads {size}")
    if size and not kd.kernel_code_properties & aql.KCP_ENABLE_SGPR_KERNARG_SEGMENT_PTR:
      raise Fault(f"{kernel.name}: arguments but no kernarg segment pointer in the descriptor")
    if p.private_segment_size < kd.private_segment_fixed_size:
      raise Fault(f"{kernel.name}: private_segment_size {p.private_segment_size} < the descriptor's {kd.private_segment_fixed_size}")
    if kd.private_segment_fixed_size or kd.compute_pgm_rsrc2 & aql.RSRC2_ENABLE_PRIVATE_SEGMENT: self._check_scratch(kernel.name, p, q)
    args = self.vm.read(p.kernarg_address, size, vmid)
    sig = kernel.signature
    nb = len(sig.buffers)
    bufs = [struct.unpack_from("<Q", args, o)[0] for o in offsets[:nb]]
    scalars = self.runner.decode_scalars(sig, lambda i, n: args[offsets[nb + i]:offsets[nb + i] + n])
    block = (p.workgroup_size_x, p.workgroup_size_y, p.workgroup_size_z)
    items = (p.grid_size_x, p.grid_size_y, p.grid_size_z)
    if any(g % b for g, b in zip(items, block)): raise Fault(f"{kernel.name}: grid {items} is not a multiple of workgroup {block}")
    grid = tuple(g // b for g, b in zip(items, block))
    if (info := self.infos.get(ko)) is not None:       # a code object's hidden arguments must describe this dispatch
      for axis in range(3):
        bc, gsz = info.hidden(f"block_count_{'xyz'[axis]}"), info.hidden(f"group_size_{'xyz'[axis]}")
        if bc is not None and struct.unpack_from("<I", args, bc.offset)[0] != grid[axis]:
          raise Fault(f"{kernel.name}: hidden_block_count_{'xyz'[axis]} is not the dispatch's {grid[axis]} groups")
        if gsz is not None and struct.unpack_from("<H", args, gsz.offset)[0] != block[axis]:
          raise Fault(f"{kernel.name}: hidden_group_size_{'xyz'[axis]} is not the dispatch's workgroup {block[axis]}")
    for buf in bufs: self.vm.translate(buf, vmid, access="w", system=True)    # each buffer argument must be mapped
    self.runner.run(kernel, bufs, scalars, grid, block)


def gpu_ticks() -> int:
  """The GPU timestamp counter: the host's monotonic clock at 100 MHz (what plugrt_amd_pci.mec.TIMESTAMP_HZ assumes)."""
  return time.perf_counter_ns() // 10


class FakeDoorbells:
  """BAR2: 64-bit doorbell stores go to the MEC (a 32-bit store of the low half counts too, as on a CP that takes
  the low dword as the write index)."""
  def __init__(self, mec: FakeMEC, size: int = 2 << 20):
    self.mec, self.size, self.writes = mec, size, []

  def read32(self, offset: int) -> int: return 0
  def write32(self, offset: int, value: int) -> None:
    self.writes.append((offset, value))
    if offset % 8 == 0: self.mec.ring(offset // 4, value)
  def write64(self, offset: int, value: int) -> None:
    self.writes.append((offset, value))
    self.mec.ring(offset // 4, value)
