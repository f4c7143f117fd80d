"""The compute stage of the driverless bring-up: GMC 11 page tables (plugrt_amd_pci.vm) decoded and walked by the fake
hub (fake_amdq.FakeVM), the golden registers and compute VMIDs (gc_init), doorbell routing (doorbell), the MEC queue
(mec) checked by the fake MEC when it is activated, and a kernel dispatched through the PCI path and run on the fake
(the fake KFD's AQL decoding and DispatchRunner). Values the kernel writes are worked out here by hand."""
from __future__ import annotations

import os
import struct
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests"))
import fake_amdfw
import fake_amdgpu
import fake_amdq
from amd_fixtures import axpy_kernel

from plugrt_amd import aql
from plugrt_amd.device import AMDNotImplemented
from plugrt_amd_pci import bringup, compute, doorbell, gmc, mec, scratch, vm
from plugrt_amd_pci.regs import GPURegisters

GC0, GC1 = fake_amdgpu.GC_BASES[0], fake_amdgpu.GC_BASES[1]


#: an RDNA4-like board (RX 9070's IP versions; the fake's bases are RDNA3's, synthetic either way)
RDNA4 = dict(gc=(12, 0, 0), mp0=(14, 0, 2), mp1=(14, 0, 2), sdma=(7, 0, 0), mmhub=(4, 1, 0), nbio=(6, 3, 1))
SOS14 = ("sos", "sys_drv", "kdb", "toc", "spl", "soc_drv", "intf_drv", "dbg_drv", "ras_drv", "ipkeymgr_drv")


def gpu(tmp_path, nbio=(4, 3, 0), board: dict | None = None):
  """An RDNA3-like fake (or `board`: RDNA4) with every firmware file, a dense VRAM, the fake MEC and its doorbell BAR."""
  kw = {"pair": (0xE, 0xF)} if nbio[:2] == (7, 4) else {}          # NBIO 7.4's PCIE_INDEX2/DATA2 in segment 0
  v = board or {"nbio": nbio}
  gen = v.get("gc", (11,))[0]
  regs, vram = fake_amdgpu.fake_gpu(blob=fake_amdgpu.table(**v), mib=64, dense=True, gmc=gen, **kw)
  sos = fake_amdgpu.sos_file(parts=SOS14) if gen == 12 else fake_amdgpu.sos_file()
  mp0v = v.get("mp0", (13, 0, 0))
  (tmp_path / f"psp_{'_'.join(map(str, mp0v))}_sos.bin").write_bytes(sos)
  blobs, want = fake_amdfw.ip_files(v["gc"], v["mp1"], v["sdma"], 4) if gen == 12 else fake_amdfw.ip_files()
  for name, blob in blobs.items(): (tmp_path / name).write_bytes(blob)
  mp0 = fake_amdgpu.FakeMP0(regs, vram, sos, mp0=mp0v, mmhub=v.get("mmhub", (3, 0, 0)))
  mp1 = fake_amdfw.FakeMP1(regs, v.get("mp1", (13, 0, 0)), if_version=0x26 if gen == 12 else 0x3D)
  fake_amdfw.FakeIPFirmware(mp0, want, mp1, fake_amdfw.FakeRLC(regs, v.get("gc", (11, 0, 0))))
  fake_amdfw.FakeCP(regs)
  mecf = fake_amdq.FakeMEC(regs, vram, fake_amdgpu.MC_BASE)
  return GPURegisters(regs, vram, mecf.doorbells), mecf, mp0


def test_page_tables_in_gmc11_format_translate_in_the_fake_hub() -> None:
  regs, vram = fake_amdgpu.fake_gpu(mib=64)
  phys = 0x1_0000_0000                                      # VRAM's physical base: PDEs and PTEs carry physical addresses
  space = vm.AddressSpace(GPURegisters(regs, vram), phys)
  space.map(0x7F00_0000_0000, 32 << 20, 4 << 20)           # 4 MiB, 2 MiB aligned on both sides: fragment 9
  space.map(0x1000, 40 << 20, 0x3000, vm.PTE_READABLE)      # 3 pages, read-only, 4 KiB aligned: fragments 0
  assert space.commit() == 1 + 4 + 3       # the root; PDB1, PDB0 and two PTBs (4 MiB spans two PDB0 entries); PDB1, PDB0, PTB
  assert space.pd_address == phys + vm.POOL_AT | 1
  hub = fake_amdq.FakeVM(regs, vram, phys)
  gmc.apply(GPURegisters(regs, vram), GC0, gmc.vmid_config_ops(), gmc.GFXHUBS[(11, 0, 0)])
  gmc.set_page_table(GPURegisters(regs, vram), GC0, gmc.GFXHUBS[(11, 0, 0)], 8, space.pd_address)
  with pytest.raises(fake_amdq.Fault, match="changed after the last TLB flush of VMID 8"): hub.translate(0x7F00_0000_0000, 8)
  gmc.flush_tlb(GPURegisters(regs, vram), GC0, gmc.GFXHUBS[(11, 0, 0)], 8)
  assert hub.translate(0x7F00_0000_0000 + 0x12345, 8) == (32 << 20) + 0x12345
  assert hub.last_pte == phys + (32 << 20) + 0x12000 | 1 | 0x70 | 9 << 7      # PA | VALID | X R W | fragment 9, MTYPE NC
  assert hub.translate(0x7F00_0000_0000 + (4 << 20) - 4, 8) == (36 << 20) - 4
  assert hub.translate(0x2FFC, 8) == (40 << 20) + 0x1FFC and hub.last_pte == phys + (40 << 20) + 0x1000 | 1 | 0x20
  with pytest.raises(fake_amdq.Fault, match="lacks the w permission"): hub.translate(0x1000, 8, access="w")
  with pytest.raises(fake_amdq.Fault, match="PTE not valid"): hub.translate(0x4000, 8)
  with pytest.raises(fake_amdq.Fault, match="PDE at level shift 39 not valid"): hub.translate(0x1000_0000_0000, 8)
  with pytest.raises(fake_amdq.Fault, match="context 9 has no valid page-table base"): hub.translate(0x1000, 9)



def test_a_commit_writes_again_only_the_entries_that_changed() -> None:
  """A table already in VRAM gets only its changed span written: a page mapped (then unmapped) into an existing PTB is
  one 8-byte PTE, not the table's 4 KiB (over USB each dword of VRAM written is bridge commands)."""
  regs, vram = fake_amdgpu.fake_gpu(mib=64)
  phys = 0x1_0000_0000
  space = vm.AddressSpace(GPURegisters(regs, vram), phys)
  space.map(0x1000, 40 << 20, 0x1000)
  writes: list[tuple[int, int]] = []
  write_vram = space.regs.write_vram
  space.regs.write_vram = lambda at, data: (writes.append((at, len(data))), write_vram(at, data))[1]
  assert space.commit() == 4 and sum(n for _, n in writes) == 4 * vm.PAGE     # new tables: written whole
  ptb = max(at for at, _ in writes)
  writes.clear()
  space.map(0x5000, 44 << 20, 0x2000)                                         # PTEs 5 and 6 of the same PTB
  assert space.commit() == 1 and writes == [(ptb + 5 * 8, 16)]
  hub = fake_amdq.FakeVM(regs, vram, phys)
  gmc.apply(GPURegisters(regs, vram), GC0, gmc.vmid_config_ops(), gmc.GFXHUBS[(11, 0, 0)])
  gmc.set_page_table(GPURegisters(regs, vram), GC0, gmc.GFXHUBS[(11, 0, 0)], 8, space.pd_address)
  gmc.flush_tlb(GPURegisters(regs, vram), GC0, gmc.GFXHUBS[(11, 0, 0)], 8)
  assert hub.translate(0x1FFC, 8) == (40 << 20) + 0xFFC and hub.translate(0x6004, 8) == (44 << 20) + 0x1004
  writes.clear()
  space.unmap(0x5000)
  assert space.commit() == 1 and writes == [(ptb + 5 * 8, 16)]
  gmc.flush_tlb(GPURegisters(regs, vram), GC0, gmc.GFXHUBS[(11, 0, 0)], 8)
  with pytest.raises(fake_amdq.Fault, match="PTE not valid"): hub.translate(0x5000, 8)
  assert hub.translate(0x1000, 8) == 40 << 20

def test_fragments_and_refusals() -> None:
  assert vm.fragment(0, 0, 2 << 20) == 9 and vm.fragment(0x1000, 0x1000, 2 << 20) == 0 and vm.fragment(0x10000, 0x30000, 0x10000) == 4
  assert vm.fragment(0, 0x1000, 2 << 20) == 0                   # VA and PA aligned differently: no fragment
  assert vm.pte(0x5000, vm.PTE_READABLE, 2, vm.MTYPE_UC) == 0x5000 | 1 | 0x20 | 2 << 7 | 3 << 48
  regs, vram = fake_amdgpu.fake_gpu()
  space = vm.AddressSpace(GPURegisters(regs, vram), 0, pool_size=3 * 0x1000)
  with pytest.raises(vm.VMError, match="whole 4 KiB pages"): space.map(0x1800, 0, 0x1000)
  with pytest.raises(vm.VMError, match="beyond the 48-bit"): space.map(1 << 48, 0, 0x1000)
  with pytest.raises(vm.VMError, match="no page table left"): space.map(0x1000, 0, 0x1000)    # needs 3 more tables, the pool has 2
  space = vm.AddressSpace(GPURegisters(regs, vram), 0)
  space.map(0x10000, 0, 0x2000)
  with pytest.raises(vm.VMError, match="overlaps"): space.map(0x11000, 0x5000, 0x1000)
  with pytest.raises(vm.VMError, match="not a 64-byte-aligned"): vm.pde(0x1010)


def test_bring_up_to_an_aql_queue_and_run_a_kernel_through_the_pci_path(tmp_path) -> None:
  r, mecf, mp0 = gpu(tmp_path)
  b = bringup.bring_up(r, "AMD:0", str(tmp_path))
  assert mp0.violations == [] and mecf.violations == [] and b.compute is not None and b.compute.queue is not None
  regs = r.mmio
  # golden register (TCP_CNTL bit 29), SH_MEM per compute VMID under its GRBM selection, GDS cleared
  assert regs.regs[GC1 + 0x19A2] == 0x20000000
  assert mecf.sh_mem == {v: (0x3 << 2 | 0x3 << 14, 0x00010002) for v in range(8, 16)}
  assert regs.regs[GC0 + 0x1F72] & 8 and regs.regs[GC0 + 0x20A0 + 16] == 0
  assert regs.regs[GC1 + 0x4C80] == 0x3                                        # RLC_SRM_CNTL: SRM_ENABLE | AUTO_INCR_ADDR
  # doorbell routing: NBIO seg 2 + 0xc0 bit 0; S2A entries through the SMN pair (segment 3 is beyond the BAR)
  assert regs.regs[fake_amdgpu.NBIO_BASES[2] + 0xC0] & 1
  assert regs.smn[(fake_amdgpu.NBIO_BASES[3] + 0x4F7740) * 4] == 0x30000007 and regs.smn[(fake_amdgpu.NBIO_BASES[3] + 0x4F7743) * 4] == 0x3000000D
  # the HQD: what the fake MEC recorded under ME 1 pipe 0 queue 0, against numbers worked out from the KFD's MQD
  h = mecf.hqd[(1, 0, 0)]
  R = fake_amdq.R
  ring_va = mec.VA_BASE + mec.QUEUE_AT + mec.RING_OFF
  assert h[R["PQ_CONTROL"]] == 5 << 8 | 13 | 1 << 14 | 2 << 18 | 1 << 27          # 64 KiB = 16384 dwords: 2 << 13
  assert (h[R["PQ_BASE"]], h[R["PQ_BASE_HI"]]) == ((ring_va >> 8) & 0xFFFFFFFF, ring_va >> 40)
  assert h[R["DOORBELL"]] == 6 << 2 | 1 << 1 | 1 << 30 and h[R["VMID"]] == 8 and h[R["AQL_CONTROL"]] == 1
  assert h[R["EOP_CONTROL"]] == 9 and h[R["EOP_RPTR"]] == 1 << 31 and h[R["ACTIVE"]] == 1
  assert (h[R["MQD_BASE"]], h[R["MQD_BASE_HI"]]) == ((fake_amdgpu.MC_BASE + (15 << 20)) & 0xFFFFFFFF, (fake_amdgpu.MC_BASE + (15 << 20)) >> 32)
  assert (h[R["PERSISTENT"]], h[R["MQD_CONTROL"]], h[R["QUANTUM"]], h[R["IB_CONTROL"]]) == (0x5501, 0x100, 0x111, 3 << 20)
  assert (regs.regs[GC0 + 0x1DFC], regs.regs[GC0 + 0x1DFD]) == (0, 0x8A * 2 * 4) and regs.regs[GC1 + 0x900] == 0
  assert 6 in mecf.queues and mecf.queues[6]["size"] == 0x10000
  # VMID 8's page directory on both hubs (CONTEXT0 base + 2 * 8), each hub's TLB flushed for VMID 8 (request 0x00f80100)
  mm = fake_amdgpu.MMHUB_BASES[0]
  pd = vm.POOL_AT | 1
  assert (regs.regs[mm + 0x7AB + 16], regs.regs[mm + 0x7AC + 16]) == (pd, 0)
  assert (regs.regs[GC0 + 0x16F3 + 16], regs.regs[GC0 + 0x16F4 + 16]) == (pd, 0)
  assert 0x00F80100 in regs.invalidation.requests and 0x00F80100 in regs.gc_invalidation.requests
  assert regs.invalidation.violations == [] and not regs.invalidation.held          # the MMHUB's semaphore taken and released
  # the queue's ring, as the CP sees it through VMID 8: 1024 invalid AQL slots
  assert mecf.vm.read(ring_va, 2, 8) == struct.pack("<H", aql.PACKET_TYPE_INVALID)
  with pytest.raises(AMDNotImplemented, match="next, not implemented: a plugrt device on this queue"): b.stop()

  # a kernel: descriptor, arguments and buffers in plugrt's VRAM heap (VMID 8), one dispatch, completion by polling
  c = b.compute
  k = axpy_kernel()
  n = 1000
  code_va, code_at = c.alloc(4096)
  kd = aql.KernelDescriptor()
  kd.kernarg_size, kd.kernel_code_entry_byte_offset = 32, 256
  kd.kernel_code_properties = aql.KCP_ENABLE_SGPR_KERNARG_SEGMENT_PTR | aql.KCP_ENABLE_WAVEFRONT_SIZE32
  r.write_vram(code_at, bytes(kd))
  mecf.load(code_va, k)
  rng = np.random.default_rng(0)
  a, bb = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
  bufs = [c.alloc(n * 4) for _ in range(3)]
  r.write_vram(bufs[1][1], a.tobytes())
  r.write_vram(bufs[2][1], bb.tobytes())
  args_va, args_at = c.alloc(4096)
  r.write_vram(args_at, struct.pack("<QQQfi", bufs[0][0], bufs[1][0], bufs[2][0], 2.5, n))
  assert c.heap <= c.heap_end and all(at >= b.heap_at for _, at, _ in c.allocations)
  done = c.queue.submit(aql.dispatch_packet(code_va, args_va, (1024, 1, 1), (256, 1, 1)))
  c.queue.wait(done, timeout=0.5)
  got = np.frombuffer(r.read_vram(bufs[0][1], n * 4), np.float32)
  np.testing.assert_allclose(got, a * np.float32(2.5) + bb, rtol=1e-6)
  assert len(mecf.dispatches) == 1 and mecf.violations == [] and c.queue.completed() == 1
  assert struct.unpack("<Q", r.read_vram(mec.QUEUE_AT + mec.PTRS_OFF + 128, 8))[0] == 1      # read_dispatch_id reported
  assert mecf.doorbells.writes[-1] == (mec.doorbell.MEC_RING0 * 8, 0)                      # the packet's index, 64-bit store
  # a second submission: index 1
  done = c.queue.submit(aql.dispatch_packet(code_va, args_va, (1024, 1, 1), (256, 1, 1)))
  c.queue.wait(done, timeout=0.5)
  assert done == 2 and mecf.doorbells.writes[-1] == (24, 1)
  with pytest.raises(vm.VMError, match="no room for"): c.alloc(c.heap_end)


def test_a_dispatch_that_faults_stops_the_queue_and_the_wait_says_so(tmp_path) -> None:
  r, mecf, _ = gpu(tmp_path)
  c = bringup.bring_up(r, "AMD:0", str(tmp_path)).compute
  code_va, code_at = c.alloc(4096)
  kd = aql.KernelDescriptor()
  kd.kernarg_size, kd.kernel_code_properties = 32, aql.KCP_ENABLE_SGPR_KERNARG_SEGMENT_PTR
  r.write_vram(code_at, bytes(kd))
  mecf.load(code_va, axpy_kernel())
  args_va, args_at = c.alloc(4096)
  r.write_vram(args_at, struct.pack("<QQQfi", 0x7000_0000_0000, args_va, args_va, 1.0, 4))    # out: never mapped
  done = c.queue.submit(aql.dispatch_packet(code_va, args_va, (4, 1, 1), (4, 1, 1)))
  with pytest.raises(mec.QueueError, match="0 of 1 submissions done"): c.queue.wait(done, timeout=0.05)
  assert mecf.faults == ["VA 0x700000000000: PDE at level shift 39 not valid"]
  done = c.queue.submit(aql.barrier_and_packet())             # the stopped queue runs nothing more
  with pytest.raises(mec.QueueError): c.queue.wait(done, timeout=0.02)


def test_a_queue_the_cp_never_runs_is_a_bounded_typed_error(tmp_path) -> None:
  r, mecf, _ = gpu(tmp_path)
  b = bringup.bring_up(r, "AMD:0", str(tmp_path))
  assert b.compute is not None and b.compute.queue is not None
  mecf.queues.clear()                                         # the doorbell reaches nothing (as without the NBIO routing)
  done = b.compute.queue.submit(aql.barrier_and_packet())
  with pytest.raises(mec.QueueError, match=r"0 of 1 submissions done after 0.05 s \(read pointer 0, write pointer 1\)") as e:
    b.compute.queue.wait(done, timeout=0.05)
  assert "doorbell routing" in e.value.hint and "no active queue" in mecf.violations[0]


def test_the_fake_mec_refuses_what_the_kernel_would_not_do(tmp_path) -> None:
  r, mecf, _ = gpu(tmp_path)
  b = bringup.bring_up(r, "AMD:0", str(tmp_path))
  q = b.compute.queue
  r.vram.write(0, b"\0" * 4)                                  # a CPU write left in the HDP before the doorbell
  doorbell.ring(r.doorbell, doorbell.MEC_RING0, 0)
  assert "HDP" in mecf.violations[-1]
  mecf.violations.clear()
  mqd = mec.build_mqd(0, 0x1000, 0x1000, 0, 0, 0x2000, 0x1000, 6, 8)
  r.vram.device_write(mec.QUEUE_AT, mqd)
  mec.hqd_load(r, b.table.find("GC"), mqd)                    # registers that no longer match the MQD at CP_MQD_BASE_ADDR 0
  assert any("not in VRAM's system aperture" in v for v in mecf.violations)
  with pytest.raises(doorbell.RegisterError, match="no doorbell BAR"): doorbell.ring(None, 3, 0)
  assert q is not None


def test_an_nbio_without_known_doorbell_routing_stops_before_the_queue(tmp_path) -> None:
  r, _, _ = gpu(tmp_path, nbio=(7, 4, 0))                     # no HDP remap and no doorbell table for NBIO 7.4
  b = bringup.bring_up(r, "AMD:0", str(tmp_path))
  assert b.gfxhub and b.compute is None
  assert "compute not set up: the doorbell routing of NBIO 7.4.0 is not known" in b.summary()
  with pytest.raises(AMDNotImplemented, match="the golden registers, compute VMIDs, doorbell routing"): b.stop()


def test_compute_start_needs_a_gc_and_mmhub_of_one_generation() -> None:
  for kw in (dict(gc=(11, 0, 3)), dict(gc=(12, 0, 0)), dict(gc=(11, 0, 0), mmhub=(4, 1, 0))):
    t = fake_amdgpu.discovery.parse(fake_amdgpu.table(**kw))
    c, steps = compute.start(None, t, 0, 0, 0, 64 << 20, None)     # type: ignore[arg-type]
    assert c is None and "GC 11.0.0/11.0.2 with MMHUB 3.0.0 and GC 12.0.0/12.0.1 with MMHUB 4.1.0" in steps[0], kw


def test_rdna4_brings_up_to_an_aql_queue_and_runs_a_kernel_through_the_pci_path(tmp_path) -> None:
  """The RDNA4 board end to end on the fakes: GMC 12 page tables (MTYPE bits 54-55), both hubs' GMC 12 registers, the
  NBIF 6.3.1 doorbell entries, no GDS, the same MQD/HQD as GC 11 (v12_compute_mqd), and a dispatch that runs."""
  r, mecf, mp0 = gpu(tmp_path, board=RDNA4)
  b = bringup.bring_up(r, "AMD:0", str(tmp_path))
  assert mp0.violations == [] and mecf.violations == [] and b.compute is not None and b.compute.queue is not None, b.summary()
  regs = r.mmio
  nb = fake_amdgpu.NBIO_BASES
  assert regs.regs[nb[2] + 0xC0] & 1 and (regs.regs[nb[2] + 0x1CB], regs.regs[nb[2] + 0x1CE]) == (0x30000007, 0x3000000D)
  assert (nb[3] + 0x4F7740) * 4 not in regs.smn and (nb[3] + 0x4F7743) * 4 not in regs.smn          # not NBIO 4.3's entries
  assert mecf.sh_mem == {v: (0xC00C, 0x10002) for v in range(8, 16)} and GC0 + 0x20A0 + 16 not in regs.regs     # no GDS writes
  mm, pd = fake_amdgpu.MMHUB_BASES[0], vm.POOL_AT | 1
  assert regs.regs[mm + 0x5CF + 16] == pd and regs.regs[GC0 + 0x168F + 16] == pd            # VMID 8 on both GMC 12 hubs
  assert b.compute.space.gmc == 12
  c, k, n = b.compute, axpy_kernel(), 512
  code_va, code_at = c.alloc(4096)
  kd = aql.KernelDescriptor()
  kd.kernarg_size, kd.kernel_code_properties = 32, aql.KCP_ENABLE_SGPR_KERNARG_SEGMENT_PTR
  r.write_vram(code_at, bytes(kd))
  mecf.load(code_va, k)
  a, bb = np.arange(n, dtype=np.float32), np.ones(n, np.float32)
  bufs = [c.alloc(n * 4) for _ in range(3)]
  r.write_vram(bufs[1][1], a.tobytes())
  r.write_vram(bufs[2][1], bb.tobytes())
  args_va, args_at = c.alloc(4096)
  r.write_vram(args_at, struct.pack("<QQQfi", bufs[0][0], bufs[1][0], bufs[2][0], 3.0, n))
  c.queue.wait(c.queue.submit(aql.dispatch_packet(code_va, args_va, (n, 1, 1), (128, 1, 1))), timeout=0.5)
  np.testing.assert_array_equal(np.frombuffer(r.read_vram(bufs[0][1], n * 4), np.float32), a * 3 + 1)
  assert mecf.faults == [] and mecf.vm.last_mtype == vm.MTYPE_NC
  # an uncached mapping lands in GMC 12's field (bits 54-55); GMC 11's place (48-50) would be a fault in the fake hub
  va = 1 << 39
  c.space.map(va, 0x200000, 0x1000, mtype=vm.MTYPE_UC)
  c.bind()
  mecf.vm.translate(va, 8)
  assert mecf.vm.last_pte >> 54 & 3 == vm.MTYPE_UC and mecf.vm.last_pte >> 48 & 0x3F == 0
  old = vm.AddressSpace(r, 0, pool_at=40 << 20, pool_size=16 << 12, gmc=11)        # GMC 11's format on a GMC 12 hub
  old.map(va, 0x200000, 0x1000, mtype=vm.MTYPE_UC)
  old.commit(b.hdp_flush)
  hub12 = gmc.GFXHUBS[(12, 0, 0)]
  gmc.set_page_table(r, GC0, hub12, 9, old.pd_address)
  gmc.flush_tlb(r, GC0, hub12, 9)
  with pytest.raises(fake_amdq.Fault, match="outside GMC 12's MTYPE field"): mecf.vm.translate(va, 9)
  assert vm.pte(0x5000, mtype=vm.MTYPE_UC, gmc=12) == 0x5000 | 1 | 0x70 | 3 << 54
  with pytest.raises(vm.VMError, match="does not fit GMC 12's 2-bit field"): vm.pte(0x5000, mtype=4, gmc=12)
  with pytest.raises(vm.VMError, match="page-table format of GMC 13"): vm.AddressSpace(r, 0, gmc=13)
  with pytest.raises(AMDNotImplemented, match="next, not implemented: a plugrt device on this queue"): b.stop()


def test_a_code_object_from_amd_llvm_loaded_and_launched_through_the_pci_queue(tmp_path) -> None:
  from plugrt.errors import CompileError
  from plugrt_amd import compiler_for
  try: comp = compiler_for("gfx1100")
  except CompileError as e: pytest.skip(f"AMD_LLVM's toolchain is missing here: {e}")
  k = axpy_kernel()
  lib = comp.compile(comp.render(k))
  r, mecf, _ = gpu(tmp_path)
  c = bringup.bring_up(r, "AMD:0", str(tmp_path)).compute
  mecf.register(lib, k)
  co, va = compute.load(c, lib)
  info = co.kernels["axpy"]
  assert r.read_vram(c.allocations[-1][1], co.image_size) == bytes(co.image(va))      # relocated to its VA
  n = 1000
  rng = np.random.default_rng(1)
  a, bb = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
  bufs = [c.alloc(n * 4) for _ in range(3)]
  r.write_vram(bufs[1][1], a.tobytes())
  r.write_vram(bufs[2][1], bb.tobytes())
  scalars = [struct.pack("<f", 0.5), struct.pack("<i", n)]
  done = compute.launch(c, co, va, "axpy", [b[0] for b in bufs], scalars, (4, 1, 1), (256, 1, 1))
  c.queue.wait(done, timeout=0.5)
  np.testing.assert_allclose(np.frombuffer(r.read_vram(bufs[0][1], n * 4), np.float32), a * np.float32(0.5) + bb, rtol=1e-6)
  p = mecf.dispatches[-1]
  assert p.kernel_object == va + info.kd_offset and p.kernarg_address == c.kernargs and mecf.infos[p.kernel_object] == info
  assert mecf.violations == [] and mecf.faults == []
  # the second launch takes the next kernarg slot; a kernel with a private segment gets the queue's scratch first
  done = compute.launch(c, co, va, "axpy", [b[0] for b in bufs], scalars, (4, 1, 1), (256, 1, 1))
  c.queue.wait(done, timeout=0.5)
  assert mecf.dispatches[-1].kernarg_address == c.kernargs + compute.KERNARG_SLOT and c.scratch is None
  import dataclasses
  co.kernels["axpy"] = dataclasses.replace(info, private_segment_size=16)      # as a kernel with a private array says
  done = compute.launch(c, co, va, "axpy", [b[0] for b in bufs], scalars, (4, 1, 1), (256, 1, 1))
  c.queue.wait(done, timeout=0.5)
  assert c.scratch is not None and scratch.read_desc(c.queue).scratch_backing_memory_location == c.scratch[0]
  assert mecf.dispatches[-1].private_segment_size == 16 and c.queue.submitted == 3 and mecf.faults == []
