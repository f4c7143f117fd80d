"""Scratch (the private segment) for the driverless MEC queue: what the KFD path's AQLQueue.ensure_scratch does through
KFD, done on plugrt's own VMID 8. For an AQL queue the packet processor takes a dispatch's scratch set-up from the
queue's amd_queue_t (amd_hsa_queue.h; ROCr's AqlQueue fills the same fields): scratch_backing_memory_location and
_byte_size, scratch_wave64_lane_byte_size, the buffer resource descriptor scratch_resource_descriptor and
compute_tmpring_size (COMPUTE_TMPRING_SIZE: WAVES, WAVESIZE), and the private aperture's high dword. The MQD is left
as kfd_mqd_manager_v11.c init_mqd leaves it for an AQL queue: v11_compute_mqd's compute_tmpring_size (dword 25, saved
dispatch state outside the HQD registers hqd_load writes) stays 0, as no public KFD source assigns it.

Size: per-item bytes (the descriptor's private_segment_fixed_size, rounded to WAVESIZE units) x 64 lanes x 32 scratch
wave slots per CU (what KFD's topology reports as max_slots_scratch_cu) x the CUs the discovery table's GC info
counts. Where VRAM lacks room for that, fewer waves (down to one per shader engine): COMPUTE_TMPRING_SIZE.WAVES caps
how many waves hold scratch at once, so a smaller scratch is slower, never wrong. Grows only: a larger need replaces
it once the queue is idle. **Never run on an AMD GPU**: checked by the fake MEC (plugins/ops_amd/tests/fake_amdq.py).
"""
from __future__ import annotations

from typing import Any

from plugrt.errors import UnsupportedError
from plugrt_amd import aql
from plugrt_amd_pci import mec, vm

SLOTS_PER_CU = 32        # KFD topology's max_slots_scratch_cu on gfx9..gfx12 (kfd_topology.c: 32)


def cu_count(gc: Any) -> int:
  """CUs from the discovery table's GC info (v1, RDNA: SEs x SAs x WGPs x 2; v2: SEs x CUs per SH); 1 when absent."""
  if gc is None: return 1
  if gc.num_wgp_per_sa: return max(1, gc.num_se * max(gc.num_sa_per_se, 1) * gc.num_wgp_per_sa * 2)
  return max(1, gc.num_se * gc.num_cu_per_sh)


def describe(queue: mec.ComputeQueue, va: int, size: int, per_item: int, major: int, max_waves: int, engines: int) -> None:
  """Write the scratch fields of the queue's amd_queue_t in VRAM (the queue idle: the CP reads them per dispatch);
  per_item 0: no scratch."""
  at = queue.lay.at + mec.PTRS_OFF
  d = aql.AmdQueue.from_buffer_copy(queue.regs.read_vram(at, aql.AMD_QUEUE_SIZE))
  d.scratch_backing_memory_location, d.scratch_backing_memory_byte_size = va, size
  d.scratch_wave64_lane_byte_size = per_item
  d.scratch_resource_descriptor[:] = aql.scratch_srd(va, size, major) if per_item else (0, 0, 0, 0)
  d.compute_tmpring_size = aql.tmpring_size(major, per_item, size, max_waves, engines) if per_item else 0
  lo, hi = aql.AmdQueue.compute_tmpring_size.offset, aql.AmdQueue.queue_properties.offset
  queue.regs.write_vram(at + lo, bytes(d)[lo:hi])      # only the scratch fields: the pointers stay the CP's
  queue.flush()


def ensure(c: Any, private_segment_size: int) -> None:
  """Give `c`'s queue (a plugrt_amd_pci.compute.Compute) scratch for `private_segment_size` bytes a work-item; a no-op when
  it has enough. vm.VMError when not even one wave per shader engine fits in the VRAM heap, UnsupportedError when one
  wave's slice is more than COMPUTE_TMPRING_SIZE can describe."""
  major, gc = c.major, c.gc
  per_item = aql.scratch_per_item(max(private_segment_size, 4), major)
  if per_item <= c.scratch_per_item: return
  engines = max(gc.num_se if gc is not None else 1, 1)
  try: aql.tmpring_size(major, per_item, 0, 1, 1)
  except ValueError as e:
    raise UnsupportedError(f"scratch: {e} (GC {major}: one wave's slice must be under the register's WAVESIZE limit)",
                           "use less private memory per work-item (smaller private arrays)") from None
  wave = -(-aql.SCRATCH_LANES * per_item // aql.scratch_alignment(major)) * aql.scratch_alignment(major)
  waves = cu_count(gc) * SLOTS_PER_CU
  if c.queue.submitted > c.queue.completed(): c.queue.wait(c.queue.submitted, c.timeout)   # a running kernel may use the old one
  old = c.scratch
  if old is not None: c.free(old[0])
  while True:
    try:
      va, _ = c.alloc(wave * waves, vm.PTE_READABLE | vm.PTE_WRITEABLE)
      break
    except vm.VMError as e:
      if waves // 2 < engines:
        c.scratch, c.scratch_per_item = None, 0
        if old is not None: describe(c.queue, 0, 0, 0, major, 1, engines)
        raise vm.VMError(f"scratch: {per_item} bytes a work-item needs {wave * engines} bytes of VRAM for one wave per shader "
                         f"engine, and plugrt's heap has no such range ({e.message})",
                         "free buffers, or use less private memory per work-item (smaller private arrays)") from None
      waves //= 2
  c.scratch, c.scratch_per_item = (va, wave * waves), per_item
  describe(c.queue, va, wave * waves, per_item, major, waves, engines)


def read_desc(queue: mec.ComputeQueue) -> aql.AmdQueue:
  """The queue's amd_queue_t as it stands in VRAM (tests and error messages)."""
  return aql.AmdQueue.from_buffer_copy(queue.regs.read_vram(queue.lay.at + mec.PTRS_OFF, aql.AMD_QUEUE_SIZE))

