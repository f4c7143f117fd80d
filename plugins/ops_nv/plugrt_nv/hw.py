"""NVIDIA hardware tables, as data: GPU families (the classes each offers), method offsets, QMD layouts.

A new GPU family is one `Family` entry; a new QMD version is one entry in `QMD`. Only what this backend uses
is here. Facts come from NVIDIA's published class headers (open-gpu-doc, open-gpu-kernel-modules), as
collected in docs/research/nv-hopper-compute.md; `tested` says which family has run on hardware.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
  name: str
  compute: tuple[int, ...]     # compute classes, preferred first (the first one the GPU lists is used)
  copy: tuple[int, ...]        # DMA copy classes
  gpfifo: tuple[int, ...]      # channel (GPFIFO) classes
  usermode: tuple[int, ...]    # usermode (doorbell) classes
  qmd: int                     # QMD major version its compute class reads
  carveouts_kb: tuple[int, ...]  # legal shared-memory carveouts per SM, ascending
  # constant bank 0's driver area (byte offsets): block dims (3 words), grid dims (3 words), shared+local windows (2 x 8 bytes), stack
  # top; None: not known, plugrt-nv refuses to launch rather than guess
  cbuf0: tuple[int, int, int, int] | None = (0x00, 0x0C, 0x18, 0x28)
  tested: bool = False         # has this family run plugrt's conformance suite?
  video: tuple[int, ...] = ()  # video decoder (NVDEC) classes, preferred first (plugrt_nv.nvdec)


FAMILIES = (
  # Blackwell moved constant bank 0's driver area: block dims at 0x360, grid dims at 0x370, the windows at 0x2f0 and the stack top
  # at 0x37c, as ptxas 13.0 compiles %ntid, %nctaid, cvta.shared/local and the stack pointer for sm_100 and sm_120
  # (docs/research/nv-pci.md, "Blackwell GB20x"); never run on hardware
  Family("Blackwell", compute=(0xCEC0, 0xCDC0), copy=(0xCAB5, 0xC9B5), gpfifo=(0xCA6F, 0xC96F), usermode=(0xC761,), qmd=5,
         carveouts_kb=(0, 8, 16, 32, 64, 100), cbuf0=(0x360, 0x370, 0x2F0, 0x37C), video=(0xCFB0, 0xCDB0)),
  Family("Hopper", compute=(0xCBC0,), copy=(0xC8B5,), gpfifo=(0xC86F, 0xC56F), usermode=(0xC661,), qmd=4,
         carveouts_kb=(0, 8, 16, 32, 64, 100, 132, 164, 196, 228), tested=True, video=(0xB8B0,)),
  Family("Ada", compute=(0xC9C0,), copy=(0xC7B5,), gpfifo=(0xC56F,), usermode=(0xC561, 0xC461), qmd=3, carveouts_kb=(0, 8, 16, 32, 64, 100),
         video=(0xC9B0,)),
  Family("Ampere", compute=(0xC7C0, 0xC6C0), copy=(0xC7B5, 0xC6B5), gpfifo=(0xC56F,), usermode=(0xC561, 0xC461), qmd=3,
         carveouts_kb=(0, 8, 16, 32, 64, 100), video=(0xC7B0, 0xC6B0)),
)


@dataclass(frozen=True)
class Classes:
  family: Family
  compute: int
  copy: int
  gpfifo: int
  usermode: int
  video: int = 0   # the video decoder class, 0 when the GPU offers none of the family's


def pick_classes(offered: set[int]) -> Classes | None:
  """The newest family whose compute, copy, channel and usermode classes the GPU all offers (and its video decoder
  class, where it offers one); None: no family fits."""
  for f in FAMILIES:
    got = [next((c for c in cands if c in offered), None) for cands in (f.compute, f.copy, f.gpfifo, f.usermode)]
    if all(c is not None for c in got): return Classes(f, *got, next((c for c in f.video if c in offered), 0))  # type: ignore[arg-type]
  return None


def arch_of(sm_version: int) -> str:
  """GR's SM version as a compiler target: 0x900 -> "sm_90", 0x806 -> "sm_86" (0xa04, Blackwell desktop parts, is sm_120)."""
  return {0xA04: "sm_120"}.get(sm_version) or f"sm_{sm_version >> 8}{sm_version & 0xFF}"


# ---------------------------------------------------------------- methods (byte offsets; the same on Ampere..Blackwell)

class Host:  # channel (GPFIFO class) methods, any subchannel
  SEM_ADDR_LO, SEM_EXECUTE = 0x5C, 0x6C
  SEM_ACQ_CIRC_GEQ, SEM_RELEASE = 3, 1
  SEM_RELEASE_WFI, SEM_PAYLOAD_64, SEM_TIMESTAMP = 1 << 20, 1 << 24, 1 << 25


class Compute:
  SET_OBJECT = 0x0000
  SET_SHADER_SHARED_MEMORY_WINDOW_A = 0x02A0
  SEND_PCAS_A, SEND_SIGNALING_PCAS2_B = 0x02B4, 0x02C0
  PCAS_PREFETCH_SCHEDULE = 9
  SET_SHADER_LOCAL_MEMORY_NON_THROTTLED_A = 0x02E4
  SET_SHADER_LOCAL_MEMORY_A = 0x0790
  SET_SHADER_LOCAL_MEMORY_WINDOW_A = 0x07B0
  INVALIDATE_SHADER_CACHES_NO_WFI = 0x1698
  INVALIDATE_ALL = 1 | 1 << 4 | 1 << 12  # instruction, global data, constant
  INVALIDATE_GLOBAL_DATA = 1 << 4        # what every launch needs (without it a dependent kernel reads stale data)


class Copy:
  SET_SEMAPHORE_A = 0x0240
  LAUNCH_DMA = 0x0300
  OFFSET_IN_UPPER = 0x0400
  LINE_LENGTH_IN = 0x0418
  DMA_COPY = 2 | 1 << 7 | 1 << 8   # non-pipelined transfer, source and destination pitch (linear) layout
  DMA_RELEASE = 1 << 2 | 2 << 3    # flush, then release a four-word semaphore (payload + timestamp)
  MAX_LINE = 1 << 31               # one LAUNCH_DMA moves at most this many bytes


SUBCH_COMPUTE, SUBCH_COPY = 1, 4
USERMODE_DOORBELL = 0x90   # usermode page: write a channel's work-submit token here
USERD_GP_PUT, USERD_GP_GET = 0x8C, 0x88
SHARED_RESERVE = 0x400     # CUDA code on sm_80+ keeps the first 1 KiB of shared memory for itself
STACK_TOP = 0xFFFDC0       # initial stack pointer in the local-memory window (the cbuf0 word at Family.cbuf0[3])
LOCAL_ABI = 0x240          # bytes of local memory above STACK_TOP every CUDA thread may touch


# ---------------------------------------------------------------- QMD layouts
# Each field: (hi, lo, stride): bit positions in the QMD as one little-endian bit string; field i of an indexed
# field is at lo + i * stride. Shifted fields (the address or size stored >> n) are noted in SHIFTS.

@dataclass(frozen=True)
class QmdLayout:
  version: int
  size: int                         # bytes
  fields: dict[str, tuple[int, int, int]]
  shifts: dict[str, int]            # field -> the value is stored >> this many bits

  def bits(self, name: str, i: int = 0) -> tuple[int, int]:
    hi, lo, stride = self.fields[name]
    return hi + i * stride, lo + i * stride


QMD: dict[int, QmdLayout] = {
  3: QmdLayout(3, 256, {
    "group_id": (133, 128, 0), "sm_global_caching": (134, 134, 0),
    "inv_texture_header": (186, 186, 0), "inv_texture_sampler": (187, 187, 0), "inv_texture_data": (188, 188, 0),
    "inv_shader_data": (189, 189, 0), "inv_instruction": (190, 190, 0), "inv_shader_constant": (191, 191, 0),
    "cwd_membar": (369, 368, 0), "call_limit": (378, 378, 0), "sampler_index": (382, 382, 0),
    "grid_x": (415, 384, 0), "grid_y": (431, 416, 0), "grid_z": (463, 448, 0),
    "shared_size": (561, 544, 0), "smem_min": (567, 562, 0), "smem_max": (574, 569, 0),
    "minor": (579, 576, 0), "major": (583, 580, 0),
    "block_x": (607, 592, 0), "block_y": (623, 608, 0), "block_z": (639, 624, 0),
    "cbuf_valid": (640, 640, 1), "regs": (656, 648, 0), "smem_target": (662, 657, 0),
    "local_low": (759, 736, 0), "barriers": (767, 763, 0),
    "cbuf_addr_lo": (1055, 1024, 64), "cbuf_addr_hi": (1072, 1056, 64), "cbuf_invalidate": (1074, 1074, 64), "cbuf_size": (1087, 1075, 64),
    "program_lo": (1567, 1536, 0), "program_hi": (1584, 1568, 0), "local_high": (1623, 1600, 0), "sass_version": (1663, 1656, 0),
  }, {"cbuf_size": 4}),
  4: QmdLayout(4, 384, {
    "group_id": (21, 16, 0), "type": (25, 23, 0),
    "cbuf_valid": (416, 416, 4), "cbuf_invalidate": (419, 419, 4),
    "local_low": (535, 512, 0), "sass_version": (543, 536, 0), "local_high": (567, 544, 0),
    "call_limit": (568, 568, 0), "sampler_index": (569, 569, 0), "minor": (579, 576, 0), "major": (583, 580, 0),
    "shared_size": (601, 584, 0),
    "inv_texture_header": (602, 602, 0), "inv_texture_sampler": (603, 603, 0), "inv_texture_data": (604, 604, 0),
    "inv_shader_data": (605, 605, 0), "inv_instruction": (606, 606, 0), "inv_shader_constant": (607, 607, 0),
    "smem_min": (613, 608, 0), "smem_max": (619, 614, 0), "smem_target": (625, 620, 0),
    "grid_x": (1055, 1024, 0), "grid_y": (1071, 1056, 0), "grid_z": (1103, 1088, 0), "cwd_membar": (1137, 1136, 0),
    "block_x": (1167, 1152, 0), "block_y": (1183, 1168, 0), "block_z": (1199, 1184, 0),
    "regs": (1208, 1200, 0), "barriers": (1215, 1211, 0), "program_lo": (1247, 1216, 0), "program_hi": (1272, 1248, 0),
    "cbuf_addr_lo": (1567, 1536, 64), "cbuf_addr_hi": (1586, 1568, 64), "cbuf_size": (1599, 1587, 64),
  }, {"cbuf_addr": 6, "cbuf_size": 4}),
  5: QmdLayout(5, 384, {
    "group_id": (149, 144, 0), "type": (153, 151, 0), "sass_version": (455, 448, 0), "call_limit": (456, 456, 0), "sampler_index": (457, 457, 0),
    "minor": (467, 464, 0), "major": (471, 468, 0),
    "inv_texture_header": (472, 472, 0), "inv_texture_sampler": (473, 473, 0), "inv_texture_data": (474, 474, 0),
    "inv_shader_data": (475, 475, 0), "inv_instruction": (476, 476, 0), "inv_shader_constant": (477, 477, 0),
    "cwd_membar": (625, 624, 0), "program_lo": (1055, 1024, 0), "program_hi": (1076, 1056, 0),
    "block_x": (1103, 1088, 0), "block_y": (1119, 1104, 0), "block_z": (1127, 1120, 0),
    "regs": (1136, 1128, 0), "barriers": (1141, 1137, 0), "shared_size": (1162, 1152, 0),
    "smem_min": (1168, 1163, 0), "smem_max": (1174, 1169, 0), "smem_target": (1180, 1175, 0),
    "local_low": (1199, 1184, 0), "local_high": (1215, 1200, 0),
    "grid_x": (1279, 1248, 0), "grid_y": (1295, 1280, 0), "grid_z": (1327, 1312, 0),
    "cbuf_addr_lo": (1375, 1344, 64), "cbuf_addr_hi": (1394, 1376, 64), "cbuf_size": (1407, 1395, 64),
    "cbuf_valid": (1856, 1856, 4), "cbuf_invalidate": (1859, 1859, 4),
  }, {"program": 4, "shared_size": 7, "local": 4, "cbuf_addr": 6, "cbuf_size": 4}),
}
QMD_TYPE_GRID_CTA = 2
CWD_MEMBAR_SYSMEMBAR = 1


# ---------------------------------------------------------------- channel errors (Xid numbers the driver writes into error notifiers)

XID = {8: "the channel stopped making progress (idle timeout)", 13: "graphics engine exception (an illegal instruction or address in a kernel)",
       31: "GPU memory page fault (a kernel or copy touched an address that is not mapped)", 32: "invalid or corrupted push buffer stream",
       43: "the GPU stopped processing (a software-induced fault)", 45: "preemptive cleanup (another channel of the group faulted)",
       48: "double-bit ECC error", 69: "graphics engine class error (an invalid method or argument)", 79: "the GPU has fallen off the bus",
       109: "context-switch timeout", 119: "GSP RPC timeout", 120: "GSP error"}
