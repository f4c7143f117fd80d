"""An AQL compute queue on the MEC of a GC 11 GPU, programmed directly: no MES, no KIQ.

Why direct HQD programming and not MES: the MES path needs two more firmwares through the PSP (gc_11_0_x_mes_2.bin
and _mes1.bin), the MES scheduler ring and its API frames (mes_v11_api_def.h: SET_HW_RESOURCES, then ADD_QUEUE with a
process context and gang context), a larger and firmware-version-dependent surface; the HQD path is a register block
whose layout the MQD mirrors dword for dword, loaded the way the KFD loads a user queue when it runs without HWS/MES
(amdgpu_amdkfd_gfx_v11.c hqd_load_v11) and the kernel loads its KIQ (gfx_v11_0_kiq_init_register), both public.

What plugrt does, in the kernel's order (gfx_v11_0_cp_resume):
1. gfx_v11_0_cp_compute_enable (RS64): CP_MEC_RS64_CNTL (GC segment 1 + 0x2904) with MEC_INVALIDATE_ICACHE (bit 4)
   and MEC_PIPE0-3_RESET (16-19) clear, MEC_PIPE0-3_ACTIVE (26-29) set, MEC_HALT (30) clear;
2. the MQD (struct v11_compute_mqd, 512 dwords) as kfd_mqd_manager_v11.c init_mqd + update_mqd make it for an AQL
   queue without CWSR: header 0xC0310800, compute_pipelinestat_enable 1, static thread management 0xffffffff for the
   eight SEs, CP_HQD_PERSISTENT_STATE PRELOAD_REQ | 0x55 << 8, CP_MQD_CONTROL PRIV_STATE (1 << 8), CP_HQD_QUANTUM
   EN | SCALE 1 << 4 | DURATION 1 << 8, CP_HQD_PQ_CONTROL RPTR_BLOCK_SIZE 5 << 8 | log2(ring dwords) - 1 |
   QUEUE_FULL_EN 1 << 14 | SLOT_BASED_WPTR 2 << 18 | NO_UPDATE_RPTR 1 << 27, ring base >> 8, the read pointer report
   address (the amd_queue_t's read_dispatch_id) and write pointer poll address (its write_dispatch_id),
   CP_HQD_PQ_DOORBELL_CONTROL DOORBELL_OFFSET (dwords) << 2 | DOORBELL_BIF_DROP 1 << 1, CP_HQD_IB_CONTROL
   MIN_IB_AVAIL_SIZE 3 << 20, CP_HQD_EOP_CONTROL min(0xa, log2(EOP dwords) - 1), EOP base >> 8, CP_HQD_VMID,
   CP_HQD_AQL_CONTROL CONTROL0 1; priority 0. The MQD lives in VRAM and is addressed through VMID 0's system
   aperture (its MC address), as the KFD's MQDs are kernel (GART) buffers; the ring, pointers and EOP buffer are in
   the queue's VMID (8, the first KFD VMID), mapped by plugrt_amd_pci.vm;
3. hqd_load_v11 under the queue's GRBM selection (ME 1, pipe 0, queue 0: soc21_grbm_select): every register from
   CP_MQD_BASE_ADDR (GC segment 0 + 0x1fa9) to CP_HQD_PQ_WPTR_HI (0x1fe0) from MQD dwords 128 on, then
   CP_HQD_PQ_DOORBELL_CONTROL with DOORBELL_EN (bit 30), CP_HQD_EOP_RPTR with INIT_FETCHER (bit 31), CP_HQD_ACTIVE 1;
   the MEC's doorbell range first (CP_MEC_DOORBELL_RANGE_LOWER/UPPER 0x1dfc/0x1dfd). No write-pointer poll
   (the kernel skips it when it has no user pointer).

A submission writes the packet into the ring through the VRAM BAR, the new write index into write_dispatch_id, flushes
the HDP, and writes the packet's index to the 64-bit doorbell (BAR2); completion is polled: the packet's completion
signal (an amd_signal_t in VRAM, no event mailbox, so no interrupt) drops by one. Field values: gc_11_0_0_sh_mask.h
(cross-checked with tinygrad's autogen tables), v11_structs.h. Never run on an AMD GPU: tested against the fake MEC.
"""
from __future__ import annotations

import struct
import time
from collections.abc import Callable
from dataclasses import dataclass

from plugrt.hwqueue import QueueError as _QueueError
from plugrt_amd import aql
from plugrt_amd_pci import doorbell
from plugrt_amd_pci.discovery import IPBlock
from plugrt_amd_pci.gfx import grbm_select
from plugrt_amd_pci.regs import MMIO, GPURegisters, poll
from plugrt_amd_pci.regtables.gc import CP_MEC_RS64_CNTL, GRBM_GFX_CNTL, HQD, MEC_REGS

HQD_FIRST, HQD_LAST = HQD["CP_MQD_BASE_ADDR"], HQD["CP_HQD_PQ_WPTR_HI"]   # the block hqd_load writes, in order
MQD_HQD = 128                                    # v11_compute_mqd.cp_mqd_base_addr_lo
MQD_DWORDS = 512
MEC_ENABLE_CLEAR = 1 << 4 | 0xF << 16 | 1 << 30   # MEC_INVALIDATE_ICACHE, MEC_PIPE0-3_RESET, MEC_HALT
MEC_ENABLE_SET = 0xF << 26                        # MEC_PIPE0-3_ACTIVE
DOORBELL_EN, INIT_FETCHER = 1 << 30, 1 << 31
MQD_HEADER = 0xC0310800
#: MQD dword of each register (the HQD block) and of the fields before it
MQD_FIELDS = {"header": 0, "compute_pipelinestat_enable": 11, **{f"compute_static_thread_mgmt_se{i}": d
              for i, d in enumerate((23, 24, 26, 27, 44, 45, 46, 47))}}


#: the queue's VRAM (plugrt's choice, below the PSP's buffers at 16 MiB): MQD, EOP buffer, amd_queue_t + signal, ring
QUEUE_AT, MQD_OFF, EOP_OFF, PTRS_OFF, RING_OFF = 15 << 20, 0x0, 0x1000, 0x2000, 0x10000
RING_BYTES, EOP_BYTES, QUEUE_BYTES = 0x10000, 0x1000, 0x20000
VMID, ME, PIPE, QUEUE = 8, 1, 0, 0
#: the GPU timestamp counter's rate the signal's start_ts/end_ts count in: 100 MHz, what amdgpu reports as
#: gpu_counter_freq for gfx9..gfx12 dGPUs (the VBIOS reference clock, soc21_get_xclk); assumed, not read from the VBIOS
TIMESTAMP_HZ = 100_000_000
VA_BASE = 1 << 40                               # plugrt maps VRAM offset o at VA VA_BASE + o in its VMID


#: GC 12: v12_compute_mqd has the same layout where plugrt writes it (v12_structs.h: only reserved/GDS dwords and
#: compute_static_thread_mgmt_se8 (dword 59, left 0 as the KFD's init_mqd leaves it) differ), the HQD registers are at
#: the same offsets (gc_12_0_0_offset.h), CP_MEC_RS64_CNTL too (its bits taken as GC 11's: gc_12_0_0_sh_mask.h not
#: read). The KFD has no hqd_load on GFX12 (gfx_v12_kfd2kgd: user queues go through MES only); the register sequence
#: is gfx_v12_0_kiq_init_register's, which loads the kernel's own KIQ directly and is the same as GC 11's.
#: Not copied from the KFD's v12 MQD: cp_hqd_hq_status0 bit 14 (the debugger's DISPATCH_PTR) and UNORD_DISPATCH in
#: CP_HQD_PQ_CONTROL, neither set by plugrt's GC 11 queue either.
HQD_LOAD = {11: "hqd_load_v11", 12: "gfx_v12_0_kiq_init_register"}


class QueueError(_QueueError):
  """The compute queue could not be set up or did not complete a packet (a plugrt.hwqueue.QueueError, as the KFD
  path's errors are)."""


def log2(n: int) -> int: return n.bit_length() - 1


def build_mqd(mqd_mc: int, ring_va: int, ring_bytes: int, rptr_va: int, wptr_va: int, eop_va: int, eop_bytes: int,
              doorbell_dw: int, vmid: int) -> bytes:
  """The v11_compute_mqd of an AQL queue (init_mqd + update_mqd, no CWSR, priority 0)."""
  m = [0] * MQD_DWORDS
  m[MQD_FIELDS["header"]], m[MQD_FIELDS["compute_pipelinestat_enable"]] = MQD_HEADER, 1
  for i in range(8): m[MQD_FIELDS[f"compute_static_thread_mgmt_se{i}"]] = 0xFFFFFFFF
  r = {"CP_HQD_PERSISTENT_STATE": 1 | 0x55 << 8, "CP_MQD_CONTROL": 1 << 8, "CP_MQD_BASE_ADDR": mqd_mc & 0xFFFFFFFF,
       "CP_MQD_BASE_ADDR_HI": mqd_mc >> 32, "CP_HQD_QUANTUM": 1 | 1 << 4 | 1 << 8,
       "CP_HQD_PQ_CONTROL": 5 << 8 | (log2(ring_bytes // 4) - 1) | 1 << 14 | 2 << 18 | 1 << 27,
       "CP_HQD_PQ_BASE": (ring_va >> 8) & 0xFFFFFFFF, "CP_HQD_PQ_BASE_HI": ring_va >> 40,
       "CP_HQD_PQ_RPTR_REPORT_ADDR": rptr_va & 0xFFFFFFFF, "CP_HQD_PQ_RPTR_REPORT_ADDR_HI": rptr_va >> 32,
       "CP_HQD_PQ_WPTR_POLL_ADDR": wptr_va & 0xFFFFFFFF, "CP_HQD_PQ_WPTR_POLL_ADDR_HI": wptr_va >> 32,
       "CP_HQD_PQ_DOORBELL_CONTROL": doorbell_dw << 2 | 1 << 1, "CP_HQD_IB_CONTROL": 3 << 20,
       "CP_HQD_EOP_CONTROL": min(0xA, log2(eop_bytes // 4) - 1), "CP_HQD_EOP_BASE_ADDR": (eop_va >> 8) & 0xFFFFFFFF,
       "CP_HQD_EOP_BASE_ADDR_HI": eop_va >> 40, "CP_HQD_VMID": vmid, "CP_HQD_AQL_CONTROL": 1}
  for name, value in r.items(): m[MQD_HQD + HQD[name] - HQD_FIRST] = value
  return struct.pack(f"<{MQD_DWORDS}I", *m)


def compute_enable(regs: GPURegisters, gc: IPBlock) -> None:
  """gfx_v11_0_cp_compute_enable(true) on the RS64 MEC."""
  reg = gc.bases[CP_MEC_RS64_CNTL[1]] + CP_MEC_RS64_CNTL[0]
  regs.wreg(reg, (regs.rreg(reg) & ~MEC_ENABLE_CLEAR) | MEC_ENABLE_SET)


def hqd_load(regs: GPURegisters, gc: IPBlock, mqd: bytes, me: int = ME, pipe: int = PIPE, queue: int = QUEUE) -> int:
  """hqd_load_v11 (without the write-pointer poll) under the queue's GRBM selection; returns the register writes."""
  base, grbm = gc.bases[0], gc.bases[GRBM_GFX_CNTL[1]] + GRBM_GFX_CNTL[0]
  words = struct.unpack(f"<{MQD_DWORDS}I", mqd)
  regs.wreg(base + MEC_REGS["CP_MEC_DOORBELL_RANGE_LOWER"], doorbell.RANGE_LOWER)
  regs.wreg(base + MEC_REGS["CP_MEC_DOORBELL_RANGE_UPPER"], doorbell.RANGE_UPPER)
  regs.wreg(grbm, grbm_select(me, pipe, queue))
  for reg in range(HQD_FIRST, HQD_LAST + 1): regs.wreg(base + reg, words[MQD_HQD + reg - HQD_FIRST])
  regs.wreg(base + MEC_REGS["CP_HQD_PQ_DOORBELL_CONTROL"], words[MQD_HQD + HQD["CP_HQD_PQ_DOORBELL_CONTROL"] - HQD_FIRST] | DOORBELL_EN)
  regs.wreg(base + MEC_REGS["CP_HQD_EOP_RPTR"], words[MQD_HQD + MEC_REGS["CP_HQD_EOP_RPTR"] - HQD_FIRST] | INIT_FETCHER)
  regs.wreg(base + MEC_REGS["CP_HQD_ACTIVE"], words[MQD_HQD + HQD["CP_HQD_ACTIVE"] - HQD_FIRST] | 1)
  regs.wreg(grbm, grbm_select(0, 0))
  return HQD_LAST - HQD_FIRST + 1 + 7


@dataclass
class Layout:
  """Where one queue's parts are: VRAM offsets and their VAs in the queue's VMID (VA_BASE + offset)."""
  at: int = QUEUE_AT

  def va(self, off: int) -> int: return VA_BASE + self.at + off
  @property
  def rptr_va(self) -> int: return self.va(PTRS_OFF + aql.AmdQueue.read_dispatch_id.offset)
  @property
  def wptr_va(self) -> int: return self.va(PTRS_OFF + aql.AmdQueue.write_dispatch_id.offset)
  @property
  def signal_off(self) -> int: return self.at + PTRS_OFF + aql.AMD_QUEUE_SIZE


class ComputeQueue:
  """plugrt's one AQL queue on the MEC (`setup` makes it); `submit(packet)` and `wait(value)` poll its signal."""

  def __init__(self, regs: GPURegisters, bell: MMIO | None, lay: Layout, mc_base: int, flush: Callable[[], None] | None):
    self.regs, self.bell, self.lay, self.mc_base = regs, bell, lay, mc_base
    self.flush = flush or (lambda: None)
    self.entries = RING_BYTES // aql.PACKET_SIZE
    self.put = 0
    self.submitted = 0
    self.signal_va = lay.va(PTRS_OFF + aql.AMD_QUEUE_SIZE)

  def write(self) -> bytes:
    """Lay the queue out in VRAM: an invalid ring, a zeroed amd_queue_t, the completion signal at 0, the MQD."""
    at = self.lay.at
    self.regs.write_vram(at + RING_OFF, (struct.pack("<H", aql.PACKET_TYPE_INVALID) + bytes(62)) * self.entries)
    self.regs.write_vram(at + EOP_OFF, bytes(EOP_BYTES))
    desc = aql.AmdQueue()
    desc.read_dispatch_id_field_base_byte_offset = aql.AmdQueue.read_dispatch_id.offset
    desc.hsa_queue.features, desc.hsa_queue.base_address = aql.HSA_QUEUE_FEATURE_KERNEL_DISPATCH, self.lay.va(RING_OFF)
    desc.hsa_queue.size = self.entries
    desc.queue_properties = aql.AMD_QUEUE_PROPERTIES_IS_PTR64 | aql.AMD_QUEUE_PROPERTIES_ENABLE_PROFILING   # timestamps
    # the apertures gc_init's SH_MEM_BASES gives VMID 8 (SHARED_BASE 1, PRIVATE_BASE 2: bits 48-63), as the KFD path
    # gives those KFD reports; scratch itself comes later, on demand (plugrt_amd_pci.scratch)
    desc.group_segment_aperture_base_hi, desc.private_segment_aperture_base_hi = 1 << 16, 2 << 16
    self.regs.write_vram(at + PTRS_OFF, bytes(desc))
    sig = aql.AmdSignal()
    sig.kind = aql.AMD_SIGNAL_KIND_USER
    self.regs.write_vram(self.lay.signal_off, bytes(sig))
    mqd = build_mqd(self.mc_base + at + MQD_OFF, self.lay.va(RING_OFF), RING_BYTES, self.lay.rptr_va, self.lay.wptr_va,
                    self.lay.va(EOP_OFF), EOP_BYTES, doorbell.MEC_RING0 * 2, VMID)
    self.regs.write_vram(at + MQD_OFF, mqd)
    self.flush()
    return mqd

  def completed(self) -> int:
    """How many signalled submissions are done: the signal counts down from 0 by one per completed packet."""
    (value,) = struct.unpack("<q", self.regs.read_vram(self.lay.signal_off + 8, 8))
    return -value

  def submit(self, packet: bytes, signal: bool = True) -> int:
    """Write one AQL packet (its completion signal replaced by the queue's when `signal`), publish it and ring the
    doorbell; returns the count `wait` takes."""
    if self.put - self._rptr() >= self.entries: raise QueueError("the compute queue's ring is full", "wait for earlier work first")
    if signal: packet = packet[:56] + self.signal_va.to_bytes(8, "little")
    slot = self.lay.at + RING_OFF + (self.put % self.entries) * aql.PACKET_SIZE
    self.regs.write_vram(slot + 4, packet[4:])
    self.regs.write_vram(slot, packet[:4])          # header last: the packet processor takes a slot once its type is valid
    self.put += 1
    self.regs.write_vram(self.lay.at + PTRS_OFF + aql.AmdQueue.write_dispatch_id.offset, struct.pack("<Q", self.put))
    self.flush()
    doorbell.ring(self.bell, doorbell.MEC_RING0, self.put - 1)
    if signal: self.submitted += 1
    return self.submitted

  def clear_timestamps(self) -> None:
    """Zero the completion signal's start_ts/end_ts, so what a wait on the next dispatch reads is that dispatch's
    (the queue runs in order: the last packet to complete writes them last)."""
    self.regs.write_vram(self.lay.signal_off + aql.AmdSignal.start_ts.offset, bytes(16))
    self.flush()

  def gpu_seconds(self) -> float | None:
    """The last completed packet's duration by the GPU's clock: the completion signal's end_ts - start_ts, which the
    packet processor writes because amd_queue_t's ENABLE_PROFILING is set, at TIMESTAMP_HZ; None where it wrote none."""
    start, end = struct.unpack("<QQ", self.regs.read_vram(self.lay.signal_off + aql.AmdSignal.start_ts.offset, 16))
    if not start or end < start: return None
    return (end - start) / TIMESTAMP_HZ

  def _rptr(self) -> int:
    return struct.unpack("<Q", self.regs.read_vram(self.lay.at + PTRS_OFF + aql.AmdQueue.read_dispatch_id.offset, 8))[0]

  def wait(self, value: int, timeout: float = 2.0, sleep: Callable[[float], None] = time.sleep) -> None:
    """Poll the completion signal until `value` submissions are done (no interrupt handler: polling is the design)."""
    ok, done = poll(self.completed, lambda done: done >= value, timeout, sleep, interval=0.0002)
    if not ok:
      ptrs = f"read pointer {self._rptr()}, write pointer {self.put}"
      raise QueueError(f"MEC queue (ME {ME} pipe {PIPE} queue {QUEUE}, VMID {VMID}): {done} of {value} submissions done after "
                       f"{timeout:g} s ({ptrs})",
                       "the CP did not run the packets: check the doorbell routing and the queue's VM mappings, and reset the GPU",
                       reason=ptrs, value=value, timed_out=True)


def setup(regs: GPURegisters, gc: IPBlock, lay: Layout, mc_base: int, bell: MMIO | None,
          flush: Callable[[], None] | None = None) -> tuple[ComputeQueue, str]:
  """With the queue's VRAM already mapped in its VMID (`lay`: plugrt_amd_pci.compute maps it): write the queue, enable
  the MEC, load the HQD."""
  q = ComputeQueue(regs, bell, lay, mc_base, flush)
  mqd = q.write()
  compute_enable(regs, gc)
  n = hqd_load(regs, gc, mqd)
  return q, (f"MEC compute queue: ME {ME} pipe {PIPE} queue {QUEUE}, VMID {VMID}, AQL, {RING_BYTES >> 10} KiB ring at VA "
             f"0x{lay.va(RING_OFF):x}, MQD at MC 0x{mc_base + lay.at:x}, doorbell {doorbell.MEC_RING0} (BAR2 offset "
             f"0x{doorbell.MEC_RING0 * 8:x}); MEC enabled, HQD loaded ({n} register writes, as {HQD_LOAD.get(gc.version[0], 'hqd_load_v11')}); "
             "completion by polling "
             "the packet's signal (no interrupt handler)")
