"""plugrt-qcom's KGSL ABI, PM4 encoding and program-binary reading, checked against values worked out by hand: struct
sizes and offsets from msm_kgsl.h's field order with LP64 alignment, request numbers from Linux's _IOC encoding, packet
headers from adreno_pm4.xml's bit layout."""
from __future__ import annotations

import ctypes
import struct

import pytest
from plugrt_qcom import adreno as A
from plugrt_qcom import binary, cmd, kgsl
from qcom_standin import build

from plugrt import dtypes
from plugrt.compiler import samples as K
from plugrt.errors import CompileError

LAYOUTS: dict[type, tuple[int, dict[str, int]]] = {
  kgsl.DevInfo: (40, {"device_id": 0, "chip_id": 4, "mmu_enabled": 8, "gmem_gpubaseaddr": 16, "gpu_id": 24, "gmem_sizebytes": 32}),
  kgsl.DeviceGetProperty: (24, {"type": 0, "value": 8, "sizebytes": 16}),
  kgsl.DeviceWaitTimestampCtxtId: (12, {"context_id": 0, "timestamp": 4, "timeout": 8}),
  kgsl.CmdstreamReadTimestampCtxtId: (12, {"context_id": 0, "type": 4, "timestamp": 8}),
  kgsl.DrawctxtCreate: (8, {"flags": 0, "drawctxt_id": 4}),
  kgsl.DrawctxtDestroy: (4, {"drawctxt_id": 0}),
  kgsl.TimestampEvent: (32, {"type": 0, "timestamp": 4, "context_id": 8, "priv": 16, "len": 24}),
  kgsl.GpuobjAlloc: (48, {"size": 0, "flags": 8, "va_len": 16, "mmapsize": 24, "id": 32, "metadata_len": 36, "metadata": 40}),
  kgsl.GpuobjFree: (32, {"flags": 0, "priv": 8, "id": 16, "type": 20, "len": 24}),
  kgsl.GpuobjInfo: (48, {"gpuaddr": 0, "flags": 8, "size": 16, "va_len": 24, "va_addr": 32, "id": 40}),
  kgsl.MapUserMem: (48, {"fd": 0, "gpuaddr": 8, "len": 16, "offset": 24, "hostptr": 32, "memtype": 40, "flags": 44}),
  kgsl.SharedmemFree: (8, {"gpuaddr": 0}),
  kgsl.CommandObject: (32, {"offset": 0, "gpuaddr": 8, "size": 16, "flags": 24, "id": 28}),
  kgsl.GpuCommand: (64, {"flags": 0, "cmdlist": 8, "cmdsize": 16, "numcmds": 20, "objlist": 24, "objsize": 32, "numobjs": 36,
                         "synclist": 40, "syncsize": 48, "numsyncs": 52, "context_id": 56, "timestamp": 60}),
}

# (direction << 30 | size << 16 | 0x09 << 8 | nr), direction 1 = _IOW, 3 = _IOWR
REQUESTS = {
  kgsl.IOCTL_KGSL_DEVICE_GETPROPERTY: 0xC0180902, kgsl.IOCTL_KGSL_DEVICE_WAITTIMESTAMP_CTXTID: 0x400C0907,
  kgsl.IOCTL_KGSL_DRAWCTXT_CREATE: 0xC0080913, kgsl.IOCTL_KGSL_DRAWCTXT_DESTROY: 0x40040914, kgsl.IOCTL_KGSL_MAP_USER_MEM: 0xC0300915,
  kgsl.IOCTL_KGSL_CMDSTREAM_READTIMESTAMP_CTXTID: 0xC00C0916, kgsl.IOCTL_KGSL_SHAREDMEM_FREE: 0x40080921,
  kgsl.IOCTL_KGSL_TIMESTAMP_EVENT: 0xC0200933, kgsl.IOCTL_KGSL_GPUOBJ_ALLOC: 0xC0300945, kgsl.IOCTL_KGSL_GPUOBJ_FREE: 0x40200946,
  kgsl.IOCTL_KGSL_GPUOBJ_INFO: 0xC0300947, kgsl.IOCTL_KGSL_GPU_COMMAND: 0xC040094A,
}


@pytest.mark.parametrize("struct_type", list(LAYOUTS), ids=lambda t: t.__name__)
def test_struct_layouts(struct_type):
  size, offsets = LAYOUTS[struct_type]
  assert ctypes.sizeof(struct_type) == size
  assert {name: getattr(struct_type, name).offset for name, _ in struct_type._fields_} == offsets


def test_request_numbers():
  assert {k: hex(k) for k in REQUESTS} == {k: hex(v) for k, v in REQUESTS.items()}
  assert set(kgsl.REQUESTS) == set(REQUESTS)


def test_flags_and_chip_ids():
  assert kgsl.field(12, kgsl.KGSL_MEMALIGN_SHIFT, kgsl.KGSL_MEMALIGN_MASK) == 0x000C0000
  assert kgsl.field(kgsl.KGSL_CONTEXT_TYPE_CL, kgsl.KGSL_CONTEXT_TYPE_SHIFT, kgsl.KGSL_CONTEXT_TYPE_MASK) == 0x00200000
  assert kgsl.chip_generation(0x06030001) == (6, 3, 0) and kgsl.chip_generation(0x07030001) == (7, 3, 0)


def test_packet_headers_and_parity():
  # CP_WAIT_FOR_IDLE (0x26, 3 bits set: parity 0), no payload (parity 1): 0x70000000 | 1 << 15 | 0x26 << 16
  assert cmd.pkt7(A.CP_WAIT_FOR_IDLE) == [0x70268000]
  # one register write to 0xA9BC (9 bits set: parity 0), count 1 (1 bit: parity 0); three to 0xBB08 (7 bits: 0), count 3 (2 bits: 1)
  assert cmd.pkt4(A.REG_A6XX_SP_CS_INSTR_SIZE, 5) == [0x40000000 | 1 | 0xA9BC << 8, 5]
  assert cmd.pkt4(A.REG_A6XX_SP_UPDATE_CNTL, 0, 0, 0) == [0x40000000 | 3 | 1 << 7 | 0xBB08 << 8, 0, 0, 0]
  assert cmd.pkt4(0xA9B1, 0)[0] >> 27 & 1 == 1  # 0xA9B1: 8 bits set
  words = cmd.launch(cmd.Shader(0x10000, 300), 0x20000, (8, 1, 1), (4, 1, 1), ntex=1, nsamp=2, nuav=1) + cmd.timestamp(0x3000, 7)
  packets = cmd.decode(words)
  assert packets[-1].code == A.CP_EVENT_WRITE and packets[-1].values == (A.CACHE_FLUSH_TS, 0x3000, 0, 7)
  st = cmd.ComputeState()
  for p in packets: st.apply(p)
  assert st.local_size() == (8, 1, 1) and st.groups() == (4, 1, 1) and st.global_size() == (32, 1, 1)
  assert st.reg64(A.REG_A6XX_SP_CS_BASE) == 0x10000 and st.regs[A.REG_A6XX_SP_CS_INSTR_SIZE] == 3  # 300 bytes: 3 units of 128
  assert st.loads[(A.ST6_CONSTANTS, A.SB6_CS_TEX)] == (0x20000 + cmd.DESC_OFF + cmd.DESC_BYTES, 1)
  for bad in ([w ^ 1 << 15 if i == 0 else w for i, w in enumerate(words)], words[:-1], [0x12345678]):
    with pytest.raises(cmd.PacketError): cmd.decode(bad)


def test_field_overflow_is_refused():
  with pytest.raises(ValueError, match="does not fit"): A.pack((A.A6XX_SP_CS_NDRANGE_0_LOCALSIZEX, 1024))


def test_texture_descriptor_round_trip():
  img = dtypes.imageh((3, 5))
  d = cmd.TexDescriptor.decode(cmd.tex_descriptor(img, 0x1_2345_6740))
  assert (d.fmt, d.width, d.height, d.pitch, d.type, d.address) == (A.FMT6_16_16_16_16_FLOAT, 5, 3, 64, A.A6XX_TEX_2D, 0x1_2345_6740)
  assert cmd.image_pitch(dtypes.imagef((1, 5))) == 128
  with pytest.raises(ValueError, match="aligned"): cmd.tex_descriptor(img, 0x1010)


def test_binary_layout():
  k = K.saxpy_kernel()
  lib, layout = build(k, k.name, consts=((0x3F800000, 3, 1), (7, 2, 0)))
  sb = binary.parse(lib, k.name)
  assert [a.offset for a in sb.args] == [layout.bases[0], layout.offsets[0], layout.bases[1], layout.offsets[1], layout.bases[2],
                                         layout.offsets[2], *layout.scalars]
  assert (sb.full_regs, sb.half_regs, sb.branch_stack, sb.samplers) == (8, 2, 3, 0) and len(sb.code) == layout.code_size
  assert sb.consts == [(0x3F800000, 12, 4), (7, 4, 2)]
  with pytest.raises(CompileError, match="not kernel other's"): binary.parse(lib, "other")
  with pytest.raises(CompileError, match="too short"): binary.parse(lib[:0x40], k.name)
  bad = bytearray(lib)
  struct.pack_into("<I", bad, 0x100, len(lib))
  with pytest.raises(CompileError, match="outside"): binary.parse(bytes(bad), k.name)
