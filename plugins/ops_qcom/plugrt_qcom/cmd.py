"""Adreno 6xx/7xx PM4 command streams for compute: the packets plugrt-qcom writes into its indirect buffers, and a
decoder for them (the fake KGSL reads plugrt's stream with it; `plugrt-qcom`'s tests check both directions).

Two packet kinds (adreno_pm4.xml): type 4 writes `count` consecutive registers from `reg`; type 7 runs `opcode` with
`count` payload words. Both headers carry odd-parity bits over the count and the register/opcode, which the command
processor checks: a header whose parity is wrong is a corrupt stream, and the decoder refuses it as the CP would.

A compute launch (`launch`): the compute marker, the shader's control registers (register footprint, thread size,
shared memory, code address and length, private memory), the grid (SP_CS_NDRANGE_* and SP_CS_KERNEL_GROUP_*), the
constants (kernel arguments) loaded by CP_LOAD_STATE6 from the launch's argument block, the texture descriptors,
samplers and UAV (image store) descriptors the program uses, SP_CS_CONFIG with their counts, then the dispatch:
CP_RUN_OPENCL (what shaders compiled by Qualcomm's OpenCL driver are dispatched with) or CP_EXEC_CS (group counts in
the packet). `timestamp` ends a submission: wait for idle, then an event write that writes back the caches and stores
the timeline value.

Adreno 6xx and 7xx share the stream's shape; what differs is a `Generation` (A6XX, A7XX below): where the compute
registers that moved live, the 7xx-only registers a dispatch programs, whether the shader is preloaded, and the
event packet (A6XX: CP_EVENT_WRITE with CACHE_FLUSH_TS; A7XX: CP_EVENT_WRITE7 with CACHE_CLEAN and WRITE_ENABLED).
`GENERATIONS` maps KGSLDevice.generation to it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from plugrt.dtype import ImageDType, dtypes
from plugrt_qcom import adreno as A

ARGS_CONST_UNITS = 256        # vec4 units of constants each launch loads from its argument block (4 KiB)
DESC_OFF = 2048               # in the argument block: UAV descriptors, then texture descriptors, then samplers
DESC_BYTES = A.TEX_CONST_DWORDS * 4
SAMP_BYTES = A.TEX_SAMP_DWORDS * 4
IMAGE_PITCH_ALIGN = 64        # bytes: an image row's pitch is a multiple of this (what Qualcomm's driver uses for images)
SHADER_UNIT = 128             # bytes of shader code per SP_CS_INSTR_SIZE / CP_LOAD_STATE6 unit (16 instructions of 8 bytes)


class PacketError(ValueError):
  """A command stream the command processor would not execute (bad header, parity, or a packet past the end)."""


def parity(x: int) -> int:
  """The odd-parity bit the CP expects beside `x`: 1 when x has an even number of set bits."""
  return (bin(x).count("1") + 1) & 1


def pkt7(opcode: int, *payload: int) -> list[int]:
  n = len(payload)
  return [A.CP_TYPE7_PKT | n & 0x3FFF | parity(n) << 15 | (opcode & 0x7F) << 16 | parity(opcode) << 23, *payload]


def pkt4(reg: int, *values: int) -> list[int]:
  n = len(values)
  return [A.CP_TYPE4_PKT | n & 0x7F | parity(n) << 7 | (reg & 0x3FFFF) << 8 | parity(reg) << 27, *values]


def lo_hi(addr: int) -> tuple[int, int]: return addr & 0xFFFFFFFF, addr >> 32 & 0xFFFFFFFF


def load_state6(state_type: int, block: int, units: int, address: int) -> list[int]:
  """CP_LOAD_STATE6_FRAG of `units` units from memory at `address` (indirect)."""
  w0 = A.pack((A.CP_LOAD_STATE6_0_STATE_TYPE, state_type), (A.CP_LOAD_STATE6_0_STATE_SRC, A.SS6_INDIRECT),
              (A.CP_LOAD_STATE6_0_STATE_BLOCK, block), (A.CP_LOAD_STATE6_0_NUM_UNIT, units))
  return pkt7(A.CP_LOAD_STATE6_FRAG, w0, *lo_hi(address))


@dataclass(frozen=True)
class Generation:
  """What a compute stream writes differently on one Adreno generation (everything else is shared)."""
  number: int                  # 6 or 7
  update_cntl: int             # SP_UPDATE_CNTL
  const_config: int            # SP_CS_CONST_CONFIG
  ndrange_0: int               # SP_CS_NDRANGE_0; _1.._6 follow
  wge_cntl: int                # SP_CS_WGE_CNTL
  kernel_group_x: int          # SP_CS_KERNEL_GROUP_X; _Y, _Z follow
  uav_base: int                # SP_CS_UAV_BASE (64 bits)
  work_item: int               # the register naming the work-item ids' registers: SP_CS_CONST_CONFIG_0 / SP_CS_WIE_CNTL_0
  preload_shader: bool         # CP_LOAD_STATE6 of the shader's code (Mesa does on A6XX only; A7XX fetches it from SP_CS_BASE)
  foreign: frozenset[int]      # compute registers of the other generation, which a stream for this one never writes
  names: dict[int, str] = field(default_factory=dict, compare=False)

  def __post_init__(self) -> None:  # a launch writes SP_CS_WGE_CNTL and the group counts in one packet
    assert self.kernel_group_x == self.wge_cntl + 1, "SP_CS_KERNEL_GROUP_X must follow SP_CS_WGE_CNTL"

  def timestamp(self, address: int, value: int) -> list[int]:
    """End of a submission: wait for the launches before, write back the caches, store `value` at `address` (the
    value is the stream's last word, which a launch patches)."""
    if self.number == 6:
      ev = pkt7(A.CP_EVENT_WRITE, A.pack((A.CP_EVENT_WRITE_0_EVENT, A.CACHE_FLUSH_TS)), *lo_hi(address), value & 0xFFFFFFFF)
    else:  # KGSL's own gen7 ringbuffer stores its timestamps this way (CACHE_CLEAN with WRITE_ENABLED, 32-bit user payload)
      w0 = A.pack((A.CP_EVENT_WRITE7_0_EVENT, A.CACHE_CLEAN), (A.CP_EVENT_WRITE7_0_WRITE_SRC, A.EV_WRITE_USER_32B),
                  (A.CP_EVENT_WRITE7_0_WRITE_DST, A.EV_DST_RAM), (A.CP_EVENT_WRITE7_0_WRITE_ENABLED, 1))
      ev = pkt7(A.CP_EVENT_WRITE7, w0, *lo_hi(address), value & 0xFFFFFFFF)
    return pkt7(A.CP_WAIT_FOR_IDLE) + ev

  def __repr__(self) -> str: return f"A{self.number}XX"


_NDRANGE6 = range(A.REG_A6XX_SP_CS_NDRANGE_0, A.REG_A6XX_SP_CS_NDRANGE_0 + 7)
_NDRANGE7 = range(A.REG_A7XX_SP_CS_NDRANGE_0, A.REG_A7XX_SP_CS_NDRANGE_0 + 7)
_GROUPS6 = range(A.REG_A6XX_SP_CS_KERNEL_GROUP_X, A.REG_A6XX_SP_CS_KERNEL_GROUP_X + 3)
_GROUPS7 = range(A.REG_A7XX_SP_CS_KERNEL_GROUP_X, A.REG_A7XX_SP_CS_KERNEL_GROUP_X + 3)
_ONLY6 = frozenset({A.REG_A6XX_SP_UPDATE_CNTL, A.REG_A6XX_SP_CS_CONST_CONFIG, A.REG_A6XX_SP_CS_CONST_CONFIG_0, A.REG_A6XX_SP_CS_WGE_CNTL,
                    A.REG_A6XX_SP_CS_UAV_BASE, A.REG_A6XX_SP_CS_UAV_BASE + 1, *_NDRANGE6, *_GROUPS6})
_ONLY7 = frozenset({A.REG_A7XX_SP_UPDATE_CNTL, A.REG_A7XX_SP_CS_CONST_CONFIG, A.REG_A7XX_SP_CS_WGE_CNTL, A.REG_A7XX_SP_CS_UAV_BASE,
                    A.REG_A7XX_SP_CS_UAV_BASE + 1, A.REG_A7XX_SP_CS_NDRANGE_7, A.REG_A7XX_SP_CS_UNKNOWN_A9BE, A.REG_A7XX_SP_CS_VGS_CNTL,
                    A.REG_A7XX_SP_PS_WAVE_CNTL, *_NDRANGE7, *_GROUPS7})
A6XX = Generation(6, A.REG_A6XX_SP_UPDATE_CNTL, A.REG_A6XX_SP_CS_CONST_CONFIG, A.REG_A6XX_SP_CS_NDRANGE_0, A.REG_A6XX_SP_CS_WGE_CNTL,
                  A.REG_A6XX_SP_CS_KERNEL_GROUP_X, A.REG_A6XX_SP_CS_UAV_BASE, A.REG_A6XX_SP_CS_CONST_CONFIG_0, True, _ONLY7 - _ONLY6,
                  A.REGISTERS)
A7XX = Generation(7, A.REG_A7XX_SP_UPDATE_CNTL, A.REG_A7XX_SP_CS_CONST_CONFIG, A.REG_A7XX_SP_CS_NDRANGE_0, A.REG_A7XX_SP_CS_WGE_CNTL,
                  A.REG_A7XX_SP_CS_KERNEL_GROUP_X, A.REG_A7XX_SP_CS_UAV_BASE, A.REG_A6XX_SP_CS_WIE_CNTL_0, False, _ONLY6 - _ONLY7,
                  A.REGISTERS_A7XX)
GENERATIONS = {6: A6XX, 7: A7XX}


def timestamp(address: int, value: int, gen: Generation = A6XX) -> list[int]:
  """End of a submission on `gen`: wait for the launches before, write back the caches, store `value` at `address`."""
  return gen.timestamp(address, value)


# ---------------------------------------------------------------- descriptors
def image_pitch(img: ImageDType) -> int:
  """Bytes from one image row to the next in QCOM's image memory (RGBA texels, rows padded to IMAGE_PITCH_ALIGN)."""
  row = img.width * 4 * img.itemsize
  return -(-row // IMAGE_PITCH_ALIGN) * IMAGE_PITCH_ALIGN


def image_format(img: ImageDType) -> int:
  return A.FMT6_32_32_32_32_FLOAT if img.base is dtypes.float32 else A.FMT6_16_16_16_16_FLOAT


def tex_descriptor(img: ImageDType, address: int, store: bool = False) -> list[int]:
  """The 16-dword A6XX_TEX_CONST of a linear 2D RGBA image at `address` (a texture, or with `store` a UAV)."""
  if address & 0x3F: raise ValueError(f"an image's memory must be 64-byte aligned, not at {address:#x}")
  pitch = image_pitch(img)
  swiz = () if store else ((A.A6XX_TEX_CONST_0_SWIZ_X, A.A6XX_TEX_X), (A.A6XX_TEX_CONST_0_SWIZ_Y, A.A6XX_TEX_Y),
                           (A.A6XX_TEX_CONST_0_SWIZ_Z, A.A6XX_TEX_Z), (A.A6XX_TEX_CONST_0_SWIZ_W, A.A6XX_TEX_W))
  w = [0] * A.TEX_CONST_DWORDS
  w[0] = A.pack((A.A6XX_TEX_CONST_0_TILE_MODE, A.TILE6_LINEAR), (A.A6XX_TEX_CONST_0_FMT, image_format(img)), *swiz)
  w[1] = A.pack((A.A6XX_TEX_CONST_1_WIDTH, img.width), (A.A6XX_TEX_CONST_1_HEIGHT, img.height))
  w[2] = A.pack((A.A6XX_TEX_CONST_2_TYPE, A.A6XX_TEX_2D), (A.A6XX_TEX_CONST_2_PITCH, pitch),
                (A.A6XX_TEX_CONST_2_PITCHALIGN, (pitch & -pitch).bit_length() - 1 - 6))
  w[4], w[5] = address & 0xFFFFFFE0, A.pack((A.A6XX_TEX_CONST_5_BASE_HI, address >> 32))
  return w


def sampler() -> list[int]:
  """A6XX_TEX_SAMP for the renderer's sampler: nearest, clamp to edge, unnormalised coordinates."""
  clamp = A.A6XX_TEX_CLAMP_TO_EDGE
  return [A.pack((A.A6XX_TEX_SAMP_0_WRAP_S, clamp), (A.A6XX_TEX_SAMP_0_WRAP_T, clamp), (A.A6XX_TEX_SAMP_0_WRAP_R, clamp)),
          A.pack((A.A6XX_TEX_SAMP_1_UNNORM_COORDS, 1)), 0, 0]


@dataclass(frozen=True)
class TexDescriptor:
  """What a texture/UAV descriptor says, read back."""
  fmt: int
  width: int
  height: int
  pitch: int
  type: int
  address: int

  @staticmethod
  def decode(w: list[int] | tuple[int, ...]) -> TexDescriptor:
    return TexDescriptor(A.get(w[0], A.A6XX_TEX_CONST_0_FMT), A.get(w[1], A.A6XX_TEX_CONST_1_WIDTH), A.get(w[1], A.A6XX_TEX_CONST_1_HEIGHT),
                         A.get(w[2], A.A6XX_TEX_CONST_2_PITCH), A.get(w[2], A.A6XX_TEX_CONST_2_TYPE),
                         (w[5] & 0x1FFFF) << 32 | w[4] & 0xFFFFFFE0)


# ---------------------------------------------------------------- a launch
@dataclass
class Shader:
  """What the command stream says about a program's shader (from its binary)."""
  address: int            # GPU address of the code
  size: int               # bytes of code
  entry: int = 0          # byte offset of the first instruction (SP_CS_PROGRAM_COUNTER_OFFSET)
  full_regs: int = 1
  half_regs: int = 0
  branch_stack: int = 0
  shared: int = 0         # bytes of local memory
  private: int = 0        # bytes of private memory per thread (the stack)


def launch(sh: Shader, args: int, local: tuple[int, int, int], groups: tuple[int, int, int], *, ntex: int = 0, nsamp: int = 0,
           nuav: int = 0, private_base: int = 0, run_opencl: bool = True, gen: Generation = A6XX) -> list[int]:
  """The words of one compute launch of `sh` on an Adreno of generation `gen` with its argument block at GPU address
  `args` (constants, then the descriptors at DESC_OFF: `nuav` UAVs, `ntex` textures, `nsamp` samplers), `groups`
  work-groups of `local` threads."""
  units = -(-sh.size // SHADER_UNIT)
  per_item = -(-sh.private // 512)
  w = pkt7(A.CP_SET_MARKER, A.pack((A.CP_SET_MARKER_0_MODE, A.RM6_COMPUTE)))
  w += pkt4(gen.update_cntl, A.pack((A.A6XX_SP_UPDATE_CNTL_CS_STATE, 1), (A.A6XX_SP_UPDATE_CNTL_CS_UAV, 1)))
  w += pkt4(gen.update_cntl, 0)
  w += pkt4(A.REG_A6XX_SP_MODE_CNTL, A.pack((A.A6XX_SP_MODE_CNTL_ISAMMODE, A.ISAMMODE_CL)))
  w += pkt4(A.REG_A6XX_TPL1_MODE_CNTL, A.pack((A.A6XX_TPL1_MODE_CNTL_ISAMMODE, A.ISAMMODE_CL)))
  w += pkt7(A.CP_WAIT_FOR_IDLE)
  ndr0 = A.pack((A.A6XX_SP_CS_NDRANGE_0_KERNELDIM, 3), (A.A6XX_SP_CS_NDRANGE_0_LOCALSIZEX, local[0] - 1),
                (A.A6XX_SP_CS_NDRANGE_0_LOCALSIZEY, local[1] - 1), (A.A6XX_SP_CS_NDRANGE_0_LOCALSIZEZ, local[2] - 1))
  g = [groups[i] * local[i] for i in range(3)]
  w += pkt4(gen.ndrange_0, ndr0, g[0], 0, g[1], 0, g[2], 0)
  # no linear local id register (REGID_INVALID: as Mesa and the seeds' system write it); A7XX's work-group tiling fields stay 0
  w += pkt4(gen.wge_cntl, A.pack((A.A6XX_SP_CS_WGE_CNTL_LINEARLOCALIDREGID, A.REGID_INVALID),
                                 (A.A6XX_SP_CS_WGE_CNTL_THREADSIZE, A.THREAD64)), *groups)  # SP_CS_KERNEL_GROUP_* follow it
  # where the work-item ids arrive: the slots Qualcomm-compiled shaders read (the seeds' system's SP_CS_CONST_CONFIG_0
  # on 6xx; A7XX carries the same fields in SP_CS_WIE_CNTL_0)
  w += pkt4(gen.work_item, A.pack((A.A6XX_SP_CS_CONST_CONFIG_0_WGIDCONSTID, A.QCOM_WGIDCONSTID),
                                  (A.A6XX_SP_CS_CONST_CONFIG_0_WGSIZECONSTID, A.QCOM_WGSIZECONSTID),
                                  (A.A6XX_SP_CS_CONST_CONFIG_0_WGOFFSETCONSTID, A.QCOM_WGOFFSETCONSTID),
                                  (A.A6XX_SP_CS_CONST_CONFIG_0_LOCALIDREGID, A.QCOM_LOCALIDREGID)))
  if gen.number == 7:  # the 7xx-only compute state Mesa programs for every A7XX dispatch (turnip and freedreno)
    w += pkt4(A.REG_A7XX_SP_CS_NDRANGE_7, A.pack((A.A7XX_SP_CS_NDRANGE_7_LOCALSIZEX, local[0] - 1),  # whole groups: the last is full
                                                 (A.A7XX_SP_CS_NDRANGE_7_LOCALSIZEY, local[1] - 1),
                                                 (A.A7XX_SP_CS_NDRANGE_7_LOCALSIZEZ, local[2] - 1)))
    w += pkt4(A.REG_A6XX_SP_CS_WIE_CNTL_1, A.pack((A.A7XX_SP_CS_WIE_CNTL_1_LINEARLOCALIDREGID, A.REGID_INVALID),
                                                  (A.A7XX_SP_CS_WIE_CNTL_1_THREADSIZE, A.THREAD64),
                                                  (A.A7XX_SP_CS_WIE_CNTL_1_WORKITEMRASTORDER, A.WORKITEMRASTORDER_LINEAR)))
    w += pkt4(A.REG_A7XX_SP_PS_WAVE_CNTL, A.pack((A.A7XX_SP_PS_WAVE_CNTL_THREADSIZE, A.THREAD64)))
    w += pkt4(A.REG_A7XX_SP_CS_UNKNOWN_A9BE, 0)
    w += pkt4(A.REG_A7XX_SP_CS_VGS_CNTL, 0)
  cntl0 = A.pack((A.A6XX_SP_CS_CNTL_0_THREADSIZE, A.THREAD64), (A.A6XX_SP_CS_CNTL_0_HALFREGFOOTPRINT, sh.half_regs),
                 (A.A6XX_SP_CS_CNTL_0_FULLREGFOOTPRINT, sh.full_regs), (A.A6XX_SP_CS_CNTL_0_BRANCHSTACK, sh.branch_stack))
  cntl1 = A.pack((A.A6XX_SP_CS_CNTL_1_CONSTANTRAMMODE, A.CONSTLEN_256), (A.A6XX_SP_CS_CNTL_1_SHARED_SIZE, max(0, (sh.shared - 1) // 1024)))
  w += pkt4(A.REG_A6XX_SP_CS_CNTL_0, cntl0, cntl1, 0, sh.entry, *lo_hi(sh.address),
            A.pack((A.A6XX_SP_CS_PVT_MEM_PARAM_MEMSIZEPERITEM, per_item)), *lo_hi(private_base),
            A.pack((A.A6XX_SP_CS_PVT_MEM_SIZE_TOTALPVTMEMSIZE, per_item * 128 * 2)))
  w += load_state6(A.ST6_CONSTANTS, A.SB6_CS_SHADER, ARGS_CONST_UNITS, args)
  if gen.preload_shader: w += load_state6(A.ST6_SHADER, A.SB6_CS_SHADER, units, sh.address)
  w += pkt4(gen.const_config,
            A.pack((A.A6XX_SP_CS_CONST_CONFIG_CONSTLEN, ARGS_CONST_UNITS - 1), (A.A6XX_SP_CS_CONST_CONFIG_ENABLED, 1)))
  w += pkt4(A.REG_A6XX_SP_CS_INSTR_SIZE, units)
  uav, tex = args + DESC_OFF, args + DESC_OFF + nuav * DESC_BYTES
  samp = tex + ntex * DESC_BYTES
  if nsamp:
    w += load_state6(A.ST6_SHADER, A.SB6_CS_TEX, nsamp, samp)
    w += pkt4(A.REG_A6XX_SP_CS_SAMPLER_BASE, *lo_hi(samp))
  if ntex:
    w += load_state6(A.ST6_CONSTANTS, A.SB6_CS_TEX, ntex, tex)
    w += pkt4(A.REG_A6XX_SP_CS_TEXMEMOBJ_BASE, *lo_hi(tex))
  if nuav:
    w += load_state6(A.ST6_UAV, A.SB6_CS_SHADER, nuav, uav)
    w += pkt4(gen.uav_base, *lo_hi(uav))
  w += pkt4(A.REG_A6XX_SP_CS_CONFIG, A.pack((A.A6XX_SP_CS_CONFIG_ENABLED, 1), (A.A6XX_SP_CS_CONFIG_NSAMP, nsamp),
                                            (A.A6XX_SP_CS_CONFIG_NTEX, ntex), (A.A6XX_SP_CS_CONFIG_NUAV, nuav)))
  w += pkt7(A.CP_RUN_OPENCL, 0) if run_opencl else pkt7(A.CP_EXEC_CS, 0, *groups)
  return w


# ---------------------------------------------------------------- decoding
@dataclass(frozen=True)
class Packet:
  """A decoded packet: type 4 (`reg`, `values`) or type 7 (`opcode`, `values`: the payload)."""
  type: int
  code: int
  values: tuple[int, ...]
  at: int                       # word index of its header

  def __str__(self) -> str:
    name = A.REGISTERS_A7XX.get(self.code, hex(self.code)) if self.type == 4 else A.OPCODES.get(self.code, hex(self.code))
    return f"{'PKT4' if self.type == 4 else 'PKT7'} {name} {[hex(v) for v in self.values]}"


def decode(words: list[int] | tuple[int, ...]) -> list[Packet]:
  """The packets of a stream; PacketError where the CP would stop (unknown packet type, parity, past the end)."""
  out, i, n = [], 0, len(words)
  while i < n:
    h = words[i]
    kind = h >> 28
    if kind == 7:
      cnt, op = h & 0x3FFF, h >> 16 & 0x7F
      if h >> 15 & 1 != parity(cnt) or h >> 23 & 1 != parity(op):
        raise PacketError(f"word {i}: type-7 header {h:#010x} fails its parity check")
    elif kind == 4:
      cnt, op = h & 0x7F, h >> 8 & 0x3FFFF
      if h >> 7 & 1 != parity(cnt) or h >> 27 & 1 != parity(op):
        raise PacketError(f"word {i}: type-4 header {h:#010x} fails its parity check")
    else: raise PacketError(f"word {i}: {h:#010x} is not a type-4 or type-7 packet header")
    if i + 1 + cnt > n: raise PacketError(f"word {i}: the packet's {cnt} words run past the end of the buffer ({n} words)")
    out.append(Packet(kind, op, tuple(words[i + 1:i + 1 + cnt]), i))
    i += 1 + cnt
  return out


@dataclass
class ComputeState:
  """The compute state a stream leaves on an Adreno of generation `gen`: registers written and the last address each
  state block was loaded from."""
  gen: Generation = A6XX
  regs: dict[int, int] = field(default_factory=dict)
  loads: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)  # (state type, block) -> (address, units)

  def reg64(self, reg: int) -> int: return self.regs.get(reg + 1, 0) << 32 | self.regs.get(reg, 0)

  def apply(self, p: Packet) -> None:
    if p.type == 4:
      for k, v in enumerate(p.values): self.regs[p.code + k] = v
    elif p.code == A.CP_LOAD_STATE6_FRAG:
      w0 = p.values[0]
      if A.get(w0, A.CP_LOAD_STATE6_0_STATE_SRC) != A.SS6_INDIRECT: raise PacketError(f"CP_LOAD_STATE6 from source other than memory: {w0:#x}")
      key = (A.get(w0, A.CP_LOAD_STATE6_0_STATE_TYPE), A.get(w0, A.CP_LOAD_STATE6_0_STATE_BLOCK))
      self.loads[key] = (p.values[2] << 32 | p.values[1], A.get(w0, A.CP_LOAD_STATE6_0_NUM_UNIT))

  def local_size(self) -> tuple[int, int, int]:
    w = self.regs.get(self.gen.ndrange_0, 0)
    return (A.get(w, A.A6XX_SP_CS_NDRANGE_0_LOCALSIZEX) + 1, A.get(w, A.A6XX_SP_CS_NDRANGE_0_LOCALSIZEY) + 1,
            A.get(w, A.A6XX_SP_CS_NDRANGE_0_LOCALSIZEZ) + 1)

  def global_size(self) -> tuple[int, int, int]:
    return tuple(self.regs.get(self.gen.ndrange_0 + 1 + 2 * k, 0) for k in range(3))  # type: ignore[return-value]

  def groups(self) -> tuple[int, int, int]:
    return tuple(self.regs.get(self.gen.kernel_group_x + k, 0) for k in range(3))  # type: ignore[return-value]
