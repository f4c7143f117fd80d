"""AQL, the HSA queue packet format an AMD compute queue of type COMPUTE_AQL executes: packets as bytes, and back.

Layouts (docs/research/amd-kfd.md says where each comes from): the 64-byte kernel-dispatch and barrier-AND
packets of the HSA runtime specification (hsa.h), the 64-byte `amd_signal_t` a packet's completion signal points
at (ROCR's amd_hsa_signal.h), and the 64-byte kernel descriptor the packet's kernel_object points at (LLVM's
AMDGPUUsage, "Kernel Descriptor", code object v3 and later).

A packet is written body first and header last (`write_packet`): the packet processor treats a slot whose
header type is INVALID as not yet written, so the 32-bit store of header and setup is what publishes it.
Every builder has its decoder (`decode_packet`, `KernelDescriptor.from_address`), which the fake KFD uses to read
back exactly what the backend wrote.
"""
from __future__ import annotations

import ctypes
import struct

u16, u32, u64, i64 = ctypes.c_uint16, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int64

PACKET_SIZE = 64

# hsa_packet_type_t
PACKET_TYPE_VENDOR_SPECIFIC, PACKET_TYPE_INVALID, PACKET_TYPE_KERNEL_DISPATCH = 0, 1, 2
PACKET_TYPE_BARRIER_AND, PACKET_TYPE_AGENT_DISPATCH, PACKET_TYPE_BARRIER_OR = 3, 4, 5
PACKET_TYPE_NAMES = {0: "VENDOR_SPECIFIC", 1: "INVALID", 2: "KERNEL_DISPATCH", 3: "BARRIER_AND", 4: "AGENT_DISPATCH", 5: "BARRIER_OR"}

# hsa_packet_header_t: bit offsets in the 16-bit header
HEADER_TYPE, HEADER_BARRIER, HEADER_SCACQUIRE_FENCE_SCOPE, HEADER_SCRELEASE_FENCE_SCOPE = 0, 8, 9, 11
# hsa_fence_scope_t
FENCE_SCOPE_NONE, FENCE_SCOPE_AGENT, FENCE_SCOPE_SYSTEM = 0, 1, 2
# hsa_kernel_dispatch_packet_setup_t: dimensions in bits 0..1 of setup
SETUP_DIMENSIONS = 0

MAX_WORKGROUP_SIZE = 1024  # what every AMD GPU's dispatcher accepts (workgroup_size_x*y*z)


def header(packet_type: int, barrier: bool = True, acquire: int = FENCE_SCOPE_SYSTEM, release: int = FENCE_SCOPE_SYSTEM) -> int:
  """A packet header: its type, whether it waits for the packets before it to complete (barrier bit), and the
  memory scopes its start acquires and its end releases (SYSTEM: the CPU sees results once the signal says done)."""
  return (packet_type << HEADER_TYPE | int(barrier) << HEADER_BARRIER | acquire << HEADER_SCACQUIRE_FENCE_SCOPE
          | release << HEADER_SCRELEASE_FENCE_SCOPE)


class _Struct(ctypes.Structure):
  def __repr__(self) -> str:
    return f"{type(self).__name__}(" + ", ".join(f"{n}={getattr(self, n)!r}" for n, *_ in self._fields_ if not n.startswith("reserved")) + ")"


class KernelDispatchPacket(_Struct):
  """hsa_kernel_dispatch_packet_t. grid_size_* counts work-items (not workgroups) and need not be a multiple of
  the workgroup size (the last workgroup of a dimension is then partial); the segment sizes are bytes per
  work-item (private) and per workgroup (group), at least what the kernel descriptor declares."""
  _fields_ = [("header", u16), ("setup", u16), ("workgroup_size_x", u16), ("workgroup_size_y", u16), ("workgroup_size_z", u16),
              ("reserved0", u16), ("grid_size_x", u32), ("grid_size_y", u32), ("grid_size_z", u32),
              ("private_segment_size", u32), ("group_segment_size", u32), ("kernel_object", u64), ("kernarg_address", u64),
              ("reserved2", u64), ("completion_signal", u64)]


class BarrierAndPacket(_Struct):
  """hsa_barrier_and_packet_t: completes once every nonzero dep_signal has reached 0."""
  _fields_ = [("header", u16), ("reserved0", u16), ("reserved1", u32), ("dep_signal", u64 * 5), ("reserved2", u64), ("completion_signal", u64)]


assert ctypes.sizeof(KernelDispatchPacket) == ctypes.sizeof(BarrierAndPacket) == PACKET_SIZE


def dispatch_packet(kernel_object: int, kernarg_address: int, grid: tuple[int, int, int], workgroup: tuple[int, int, int],
                    group_segment_size: int = 0, private_segment_size: int = 0, completion_signal: int = 0,
                    barrier: bool = True, acquire: int = FENCE_SCOPE_SYSTEM, release: int = FENCE_SCOPE_SYSTEM) -> bytes:
  """A KERNEL_DISPATCH packet. grid: work-items per dimension; workgroup: work-items per workgroup; the dimension
  count (setup) is the highest dimension whose grid or workgroup is not 1. completion_signal: the address of an
  amd_signal_t the packet processor decrements by one when the kernel is done (0: none)."""
  if not all(1 <= w <= 0xFFFF for w in workgroup) or workgroup[0] * workgroup[1] * workgroup[2] > MAX_WORKGROUP_SIZE:
    raise ValueError(f"workgroup {workgroup}: each size from 1 and at most {MAX_WORKGROUP_SIZE} work-items in all")
  if not all(1 <= g < 1 << 32 for g in grid): raise ValueError(f"grid {grid}: each size from 1 to 2**32-1 work-items")
  dims = max((d + 1 for d in range(3) if grid[d] > 1 or workgroup[d] > 1), default=1)
  p = KernelDispatchPacket(header(PACKET_TYPE_KERNEL_DISPATCH, barrier, acquire, release), dims << SETUP_DIMENSIONS, *workgroup, 0, *grid,
                           private_segment_size, group_segment_size, kernel_object, kernarg_address, 0, completion_signal)
  return bytes(p)


def barrier_and_packet(deps: tuple[int, ...] = (), completion_signal: int = 0, barrier: bool = True,
                       acquire: int = FENCE_SCOPE_SYSTEM, release: int = FENCE_SCOPE_SYSTEM) -> bytes:
  """A BARRIER_AND packet waiting on up to five signals (addresses of amd_signal_t; 0 entries are ignored)."""
  if len(deps) > 5: raise ValueError(f"a BARRIER_AND packet waits on at most 5 signals, not {len(deps)}")
  return bytes(BarrierAndPacket(header(PACKET_TYPE_BARRIER_AND, barrier, acquire, release), 0, 0, (u64 * 5)(*deps), 0, completion_signal))


class PacketError(ValueError):
  """A ring slot that holds no packet the packet processor accepts."""


def packet_type(raw: bytes) -> int: return raw[0]


def decode_packet(raw: bytes) -> KernelDispatchPacket | BarrierAndPacket:
  """The packet in a 64-byte ring slot; PacketError for a type the compute queue does not execute or a malformed field."""
  if len(raw) != PACKET_SIZE: raise PacketError(f"an AQL packet is {PACKET_SIZE} bytes, not {len(raw)}")
  hdr = struct.unpack_from("<H", raw)[0]
  t = hdr & 0xFF
  if t == PACKET_TYPE_KERNEL_DISPATCH:
    p: KernelDispatchPacket | BarrierAndPacket = KernelDispatchPacket.from_buffer_copy(raw)
    dims = p.setup & 3
    if not 1 <= dims <= 3: raise PacketError(f"dispatch packet header {hdr:#06x}: setup {p.setup:#x} gives {dims} dimensions (1..3)")
  elif t == PACKET_TYPE_BARRIER_AND: p = BarrierAndPacket.from_buffer_copy(raw)
  else: raise PacketError(f"packet header {hdr:#06x}: type {t} ({PACKET_TYPE_NAMES.get(t, 'not a packet type')}) is not executed by this queue")
  for name, shift in (("acquire", HEADER_SCACQUIRE_FENCE_SCOPE), ("release", HEADER_SCRELEASE_FENCE_SCOPE)):
    if hdr >> shift & 3 == 3: raise PacketError(f"packet header {hdr:#06x}: {name} fence scope 3 is reserved")
  if hdr >> 13: raise PacketError(f"packet header {hdr:#06x}: reserved bits 13..15 are set")
  return p


def write_packet(slot: int, raw: bytes) -> None:
  """Write a packet into the ring slot at CPU address `slot`: bytes 4..63 first, then header and setup in one
  32-bit store, so the packet processor never sees a valid header over a half-written body."""
  ctypes.memmove(slot + 4, raw[4:], PACKET_SIZE - 4)
  ctypes.c_uint32.from_address(slot).value = int.from_bytes(raw[:4], "little")


def invalidate_slot(slot: int) -> None:
  """Mark a ring slot INVALID (a new queue starts with every slot so: a packet processor reaching a slot whose header
  was not written yet waits instead of executing stale bytes)."""
  ctypes.c_uint16.from_address(slot).value = PACKET_TYPE_INVALID << HEADER_TYPE


# ---------------------------------------------------------------- amd_signal_t (ROCR amd_hsa_signal.h)

AMD_SIGNAL_KIND_INVALID, AMD_SIGNAL_KIND_USER, AMD_SIGNAL_KIND_DOORBELL, AMD_SIGNAL_KIND_LEGACY_DOORBELL = 0, 1, -1, -2
SIGNAL_ALIGN = 64


class AmdSignal(_Struct):
  """The memory a signal handle points at. value: what waits compare (the packet processor decrements it when
  the packet that names it completes); event_mailbox_ptr/event_id: when nonzero, the packet processor then
  writes event_id there and raises an interrupt, which wakes a KFD WAIT_EVENTS on that signal event;
  start_ts/end_ts: the packet's begin and end in GPU clock ticks (when profiling is enabled on the queue)."""
  _fields_ = [("kind", i64), ("value", i64), ("event_mailbox_ptr", u64), ("event_id", u32), ("reserved1", u32),
              ("start_ts", u64), ("end_ts", u64), ("queue_ptr", u64), ("reserved3", u32 * 2)]


assert ctypes.sizeof(AmdSignal) == 64


def init_signal(address: int, value: int = 0, mailbox: int = 0, event_id: int = 0) -> AmdSignal:
  """Lay out a user signal at `address` (64-byte aligned) and return the ctypes view of it."""
  if address % SIGNAL_ALIGN: raise ValueError(f"an amd_signal_t is {SIGNAL_ALIGN}-byte aligned, not at {address:#x}")
  s = AmdSignal.from_address(address)
  ctypes.memset(address, 0, ctypes.sizeof(AmdSignal))
  s.kind, s.value, s.event_mailbox_ptr, s.event_id = AMD_SIGNAL_KIND_USER, value, mailbox, event_id
  return s


# ---------------------------------------------------------------- the kernel descriptor (AMDGPUUsage, code object v3+)

KERNEL_DESCRIPTOR_SIZE, KERNEL_DESCRIPTOR_ALIGN = 64, 64
# kernel_code_properties bits
KCP_ENABLE_SGPR_PRIVATE_SEGMENT_BUFFER = 1 << 0
KCP_ENABLE_SGPR_DISPATCH_PTR = 1 << 1
KCP_ENABLE_SGPR_QUEUE_PTR = 1 << 2
KCP_ENABLE_SGPR_KERNARG_SEGMENT_PTR = 1 << 3
KCP_ENABLE_SGPR_DISPATCH_ID = 1 << 4
KCP_ENABLE_SGPR_FLAT_SCRATCH_INIT = 1 << 5
KCP_ENABLE_SGPR_PRIVATE_SEGMENT_SIZE = 1 << 6
KCP_ENABLE_WAVEFRONT_SIZE32 = 1 << 10
KCP_USES_DYNAMIC_STACK = 1 << 11


class KernelDescriptor(_Struct):
  """kernel_descriptor_t: what the packet processor reads at kernel_object before it launches waves.
  compute_pgm_rsrc1: GRANULATED_WORKITEM_VGPR_COUNT in bits 0..5, GRANULATED_WAVEFRONT_SGPR_COUNT 6..9;
  compute_pgm_rsrc2: ENABLE_PRIVATE_SEGMENT bit 0, USER_SGPR_COUNT 1..5, ENABLE_SGPR_WORKGROUP_ID_X/Y/Z 7..9,
  ENABLE_VGPR_WORKITEM_ID 11..12, GRANULATED_LDS_SIZE 15..23 (the CP fills it from the packet: must be 0)."""
  _fields_ = [("group_segment_fixed_size", u32), ("private_segment_fixed_size", u32), ("kernarg_size", u32), ("reserved0", u32),
              ("kernel_code_entry_byte_offset", i64), ("reserved1", ctypes.c_uint8 * 20), ("compute_pgm_rsrc3", u32),
              ("compute_pgm_rsrc1", u32), ("compute_pgm_rsrc2", u32), ("kernel_code_properties", u16), ("kernarg_preload", u16),
              ("reserved3", u32)]

  @property
  def vgpr_granules(self) -> int: return self.compute_pgm_rsrc1 & 0x3F
  @property
  def sgpr_granules(self) -> int: return self.compute_pgm_rsrc1 >> 6 & 0xF
  @property
  def user_sgpr_count(self) -> int: return self.compute_pgm_rsrc2 >> 1 & 0x1F
  @property
  def granulated_lds_size(self) -> int: return self.compute_pgm_rsrc2 >> 15 & 0x1FF
  @property
  def wave32(self) -> bool: return bool(self.kernel_code_properties & KCP_ENABLE_WAVEFRONT_SIZE32)


assert ctypes.sizeof(KernelDescriptor) == KERNEL_DESCRIPTOR_SIZE


# ---------------------------------------------------------------- amd_queue_t (ROCR amd_hsa_queue.h)

# hsa_queue_feature_t (hsa.h) and amd_queue_properties_t bits (amd_hsa_queue.h)
HSA_QUEUE_FEATURE_KERNEL_DISPATCH = 1
AMD_QUEUE_PROPERTIES_ENABLE_TRAP_HANDLER = 1 << 0
AMD_QUEUE_PROPERTIES_IS_PTR64 = 1 << 1
AMD_QUEUE_PROPERTIES_ENABLE_PROFILING = 1 << 3
AMD_QUEUE_SIZE = 256


class HsaQueue(_Struct):
  """hsa_queue_t, the first 40 bytes of amd_queue_t: size counts packets."""
  _fields_ = [("type", u32), ("features", u32), ("base_address", u64), ("doorbell_signal", u64), ("size", u32), ("reserved1", u32), ("id", u64)]


class AmdQueue(_Struct):
  """amd_queue_t: the queue descriptor the packet processor reads next to the AQL ring. CREATE_QUEUE's write and read
  pointers point at write_dispatch_id and read_dispatch_id inside it; read_dispatch_id_field_base_byte_offset tells the
  firmware where the struct starts. Per dispatch it takes from here: the scratch (private segment) setup for kernels
  whose descriptor enables it (scratch_resource_descriptor, scratch_backing_memory_location, compute_tmpring_size,
  scratch_wave64_lane_byte_size) and queue_properties' ENABLE_PROFILING, which makes it write a completed packet's
  start and end GPU timestamps into the completion signal (amd_signal_t start_ts/end_ts)."""
  _fields_ = [("hsa_queue", HsaQueue), ("caps", u32), ("reserved1", u32 * 3), ("write_dispatch_id", u64),
              ("group_segment_aperture_base_hi", u32), ("private_segment_aperture_base_hi", u32), ("max_cu_id", u32), ("max_wave_id", u32),
              ("max_legacy_doorbell_dispatch_id_plus_1", u64), ("legacy_doorbell_lock", u32), ("reserved2", u32 * 9),
              ("read_dispatch_id", u64), ("read_dispatch_id_field_base_byte_offset", u32), ("compute_tmpring_size", u32),
              ("scratch_resource_descriptor", u32 * 4), ("scratch_backing_memory_location", u64), ("scratch_backing_memory_byte_size", u64),
              ("scratch_wave64_lane_byte_size", u32), ("queue_properties", u32), ("reserved3", u32 * 2), ("queue_inactive_signal", u64),
              ("reserved4", u32 * 14)]


assert ctypes.sizeof(AmdQueue) == AMD_QUEUE_SIZE and AmdQueue.write_dispatch_id.offset == 56 and AmdQueue.read_dispatch_id.offset == 128

# ---------------------------------------------------------------- scratch (private segment) setup

# compute_pgm_rsrc2 bit 0: the kernel uses a private segment (scratch)
RSRC2_ENABLE_PRIVATE_SEGMENT = 1 << 0
SCRATCH_LANES = 64  # scratch is sized for 64-lane waves (a wave32 kernel uses half of each wave's slice)
# buffer resource descriptor fields (SQ_BUF_RSRC_WORD1/3) and values
SQ_SEL_X, SQ_SEL_Y, SQ_SEL_Z, SQ_SEL_W = 4, 5, 6, 7
BUF_NUM_FORMAT_UINT, BUF_DATA_FORMAT_32, BUF_FORMAT_32_UINT, SQ_RSRC_BUF = 4, 4, 20, 0


def scratch_alignment(major: int) -> int:
  """The unit of COMPUTE_TMPRING_SIZE.WAVESIZE in bytes: 1 KiB on gfx9/gfx10, 256 bytes on gfx11 and later."""
  return 256 if major >= 11 else 1024


def scratch_per_item(private_segment_size: int, major: int) -> int:
  """Bytes of scratch per work-item a queue provides for a kernel needing `private_segment_size`: rounded so that
  a 64-lane wave's slice is a whole number of WAVESIZE units."""
  unit = scratch_alignment(major) // SCRATCH_LANES
  return -(-private_segment_size // unit) * unit


def scratch_bytes(per_item: int, cus: int, slots_per_cu: int) -> int:
  """The scratch a queue needs so every wave that can hold scratch at once has its slice: per-item bytes x 64 lanes
  x the scratch wave slots of a CU (topology's max_slots_scratch_cu) x the CUs (all XCCs)."""
  return per_item * SCRATCH_LANES * slots_per_cu * cus


def scratch_srd(base: int, size: int, major: int) -> tuple[int, int, int, int]:
  """The four dwords of the scratch buffer resource descriptor: base (48 bits), swizzled, `size` records of bytes,
  64 consecutive lanes per index (ADD_TID), word 3 as each generation encodes it."""
  sel = SQ_SEL_X | SQ_SEL_Y << 3 | SQ_SEL_Z << 6 | SQ_SEL_W << 9
  if major >= 11:
    w1 = (base >> 32 & 0xFFFF) | 1 << 30                           # SWIZZLE_ENABLE is bits 30..31 from gfx11
    w3 = sel | BUF_FORMAT_32_UINT << 12 | 1 << 23 | 2 << 28 | SQ_RSRC_BUF << 30   # ADD_TID, OOB_SELECT 2; INDEX_STRIDE: the CP's
  elif major == 10:
    w1 = (base >> 32 & 0xFFFF) | 1 << 31
    w3 = sel | BUF_FORMAT_32_UINT << 12 | 3 << 21 | 1 << 23 | 1 << 24 | 2 << 28 | SQ_RSRC_BUF << 30  # INDEX_STRIDE 64, RESOURCE_LEVEL
  else:
    w1 = (base >> 32 & 0xFFFF) | 1 << 31                           # SWIZZLE_ENABLE bit 31
    w3 = sel | BUF_NUM_FORMAT_UINT << 12 | BUF_DATA_FORMAT_32 << 15 | 1 << 19 | 3 << 21 | 1 << 23 | SQ_RSRC_BUF << 30
  return base & 0xFFFFFFFF, w1, size & 0xFFFFFFFF, w3


def tmpring_size(major: int, per_item: int, size_per_xcc: int, max_waves: int, engines: int) -> int:
  """COMPUTE_TMPRING_SIZE: WAVES (bits 0..11: waves that may hold scratch at once; per shader engine from gfx11) and
  WAVESIZE (from bit 12: one wave's slice in scratch_alignment units; 13 bits gfx9/10, 15 gfx11, 18 gfx12)."""
  unit = scratch_alignment(major)
  wave = -(-SCRATCH_LANES * per_item // unit)
  waves = size_per_xcc // (wave * unit)
  if major >= 11: waves //= max(engines, 1)
  width = 18 if major >= 12 else 15 if major == 11 else 13
  if wave >= 1 << width: raise ValueError(f"{per_item} bytes of scratch per work-item is more than COMPUTE_TMPRING_SIZE can describe")
  return min(waves, max_waves, 0xFFF) | wave << 12


def tmpring_fields(value: int, major: int) -> tuple[int, int]:
  """(WAVES, WAVESIZE in bytes) of a COMPUTE_TMPRING_SIZE value."""
  width = 18 if major >= 12 else 15 if major == 11 else 13
  return value & 0xFFF, (value >> 12 & (1 << width) - 1) * scratch_alignment(major)
