"""Adreno 6xx/7xx command-processor facts as data: PM4 packet types and opcodes, the compute registers plugrt-qcom
writes, and the fields it sets in them.

Every value is checked against Mesa's freedreno register database XML itself (src/freedreno/registers/adreno/
adreno_pm4.xml for packets and events, a6xx.xml and a6xx_enums.xml for registers, texture descriptors and enums);
names are Mesa 25/26's (older names in comments). docs/research/qcom.md has the table, value by value, with the
commits read; tests/test_qcom_xml.py checks every value here against a vendored excerpt of that XML
(tests/data/freedreno_excerpt.xml). The REG_A6XX_* offsets are the A6XX variants: several compute registers sit
elsewhere on A7XX (REG_A7XX_* below), A7XX has compute registers A6XX lacks, and its event-write packet
(CP_EVENT_WRITE7) and cache events differ.
A field is (shift, mask); `pack(fields, **values)` puts values in a register word.
"""
from __future__ import annotations

# ---------------------------------------------------------------- packets (adreno_pm4.xml)
CP_TYPE4_PKT = 0x40000000   # register write: bits 28-31 = 4
CP_TYPE7_PKT = 0x70000000   # opcode packet: bits 28-31 = 7

CP_NOP = 0x10
CP_WAIT_MEM_WRITES = 0x12
CP_WAIT_FOR_IDLE = 0x26
CP_RUN_OPENCL = 0x31
CP_EXEC_CS = 0x33
CP_LOAD_STATE6_FRAG = 0x34
CP_REG_TO_MEM = 0x3E
CP_EVENT_WRITE = 0x46       # A2XX-A6XX payload; A7XX calls 0x46 CP_EVENT_WRITE7, whose dword 0 and payload differ
CP_SET_MODE = 0x63
CP_SET_MARKER = 0x65

OPCODES = {v: k for k, v in dict(globals()).items() if k.startswith("CP_") and not k.startswith("CP_TYPE") and isinstance(v, int)}
CP_EVENT_WRITE7 = 0x46      # A7XX- (the same opcode as CP_EVENT_WRITE, another payload)

# events (vgt_event_type)
CACHE_FLUSH_TS = 4          # write back the caches, then write the packet's value at its address
CACHE_INVALIDATE = 49       # A6XX only: on A7XX event 49 is CACHE_CLEAN and the invalidate is CACHE_INVALIDATE7 = 51
CACHE_INVALIDATE7 = 51      # A7XX
CACHE_CLEAN = 49            # A7XX: write back dirty cache lines (A6XX's CACHE_FLUSH_TS does that and stores a value)
CP_EVENT_WRITE_0_EVENT = (0, 0xFF)

# CP_EVENT_WRITE7 dword 0 (A7XX); with WRITE_DST = RAM, dwords 1-2 are the address and dword 3 the 32-bit payload
CP_EVENT_WRITE7_0_EVENT = (0, 0x000000FF)
CP_EVENT_WRITE7_0_WRITE_SRC = (20, 0x00700000)
CP_EVENT_WRITE7_0_WRITE_DST = (24, 0x01000000)
CP_EVENT_WRITE7_0_WRITE_ENABLED = (27, 0x08000000)
EV_WRITE_USER_32B = 0       # event_write_src: write payload[0]
EV_DST_RAM = 0              # event_write_dst: to memory

# CP_SET_MARKER (a6xx_marker)
RM6_COMPUTE = 8
CP_SET_MARKER_0_MODE = (0, 0xF)

# CP_LOAD_STATE6 dword 0
CP_LOAD_STATE6_0_DST_OFF = (0, 0x00003FFF)
CP_LOAD_STATE6_0_STATE_TYPE = (14, 0x0000C000)
CP_LOAD_STATE6_0_STATE_SRC = (16, 0x00030000)
CP_LOAD_STATE6_0_STATE_BLOCK = (18, 0x003C0000)
CP_LOAD_STATE6_0_NUM_UNIT = (22, 0xFFC00000)
ST6_SHADER, ST6_CONSTANTS, ST6_UBO, ST6_UAV = 0, 1, 2, 3   # a6xx_state_type (ST6_UAV: Mesa's older ST6_IBO)
SS6_DIRECT, SS6_BINDLESS, SS6_INDIRECT = 0, 1, 2           # a6xx_state_src
SB6_CS_TEX, SB6_CS_SHADER = 5, 13                          # a6xx_state_block

# ---------------------------------------------------------------- registers (a6xx.xml, A6XX variants; see REG_A7XX_* for 7xx)
REG_A6XX_SP_CS_CNTL_0 = 0xA9B0                 # SP_CS_CTRL_REG0
REG_A6XX_SP_CS_CNTL_1 = 0xA9B1                 # SP_CS_UNKNOWN_A9B1
REG_A6XX_SP_CS_PROGRAM_COUNTER_OFFSET = 0xA9B3  # SP_CS_OBJ_FIRST_EXEC_OFFSET
REG_A6XX_SP_CS_BASE = 0xA9B4                   # SP_CS_OBJ_START (64 bits: 0xA9B4, 0xA9B5)
REG_A6XX_SP_CS_PVT_MEM_PARAM = 0xA9B6
REG_A6XX_SP_CS_PVT_MEM_BASE = 0xA9B7           # 64 bits
REG_A6XX_SP_CS_PVT_MEM_SIZE = 0xA9B9
REG_A6XX_SP_CS_TSIZE = 0xA9BA
REG_A6XX_SP_CS_CONFIG = 0xA9BB
REG_A6XX_SP_CS_INSTR_SIZE = 0xA9BC             # SP_CS_INSTRLEN
REG_A6XX_SP_CS_PVT_MEM_STACK_OFFSET = 0xA9BD
REG_A6XX_SP_CS_SAMPLER_BASE = 0xA9E2           # SP_CS_TEX_SAMP (64 bits)
REG_A6XX_SP_CS_TEXMEMOBJ_BASE = 0xA9E6         # SP_CS_TEX_CONST (64 bits)
REG_A6XX_SP_CS_UAV_BASE = 0xA9F2               # SP_CS_IBO (64 bits)
REG_A6XX_SP_CS_USIZE = 0xAA00
REG_A6XX_SP_MODE_CNTL = 0xAB00
REG_A6XX_TPL1_MODE_CNTL = 0xB309               # SP_TP_MODE_CNTL
REG_A6XX_SP_CS_CONST_CONFIG = 0xB987           # HLSQ_CS_CNTL
REG_A6XX_SP_CS_NDRANGE_0 = 0xB990              # HLSQ_CS_NDRANGE_0; _1.._6 follow: global size x, offset x, y, offset y, z, offset z
REG_A6XX_SP_CS_CONST_CONFIG_0 = 0xB997          # HLSQ_CS_CNTL_0
REG_A6XX_SP_CS_WGE_CNTL = 0xB998                # HLSQ_CS_CNTL_1
REG_A6XX_SP_CS_KERNEL_GROUP_X = 0xB999          # HLSQ_CS_KERNEL_GROUP_X; _Y, _Z follow
REG_A6XX_SP_UPDATE_CNTL = 0xBB08                # HLSQ_UPDATE_CNTL

REG_A6XX_SP_CS_WIE_CNTL_0 = 0xA9C2             # SP_CS_CNTL_0 in older Mesa; A6XX gen4+ and A7XX (same offset)
REG_A6XX_SP_CS_WIE_CNTL_1 = 0xA9C3             # A7XX moves its THREADSIZE to bit 8

REGISTERS = {v: k[9:] for k, v in dict(globals()).items() if k.startswith("REG_A6XX_")}

# The A7XX variants of the compute registers that move (a6xx.xml variants="A7XX-"); every other REG_A6XX_* offset above
# is the same on A7XX. SP_CS_CONST_CONFIG_0 (0xB997) has no A7XX variant.
REG_A7XX_SP_CS_UAV_BASE = 0xA9F8
REG_A7XX_SP_CS_CONST_CONFIG = 0xA9CD
REG_A7XX_SP_CS_NDRANGE_0 = 0xA9D4             # _1.._6 follow (0xA9D5-0xA9DA)
REG_A7XX_SP_CS_WGE_CNTL = 0xA9DB
REG_A7XX_SP_CS_KERNEL_GROUP_X = 0xA9DC        # _Y, _Z follow
REG_A7XX_SP_UPDATE_CNTL = 0xAB1F
# compute registers A7XX has and A6XX has not (a6xx.xml variants="A7XX-")
REG_A7XX_SP_CS_UNKNOWN_A9BE = 0xA9BE
REG_A7XX_SP_CS_VGS_CNTL = 0xA9C5
REG_A7XX_SP_PS_WAVE_CNTL = 0xA9C6             # HLSQ_FS_CNTL_0 in older Mesa; A6XX's is 0xB980
REG_A7XX_SP_CS_NDRANGE_7 = 0xA9DF             # HLSQ_CS_LAST_LOCAL_SIZE in older Mesa: the last work-group's size

REGISTERS_A7XX = {**REGISTERS, **{v: k[9:] for k, v in dict(globals()).items() if k.startswith("REG_A7XX_")}}

# fields
A6XX_SP_CS_NDRANGE_0_KERNELDIM = (0, 0x00000003)
A6XX_SP_CS_NDRANGE_0_LOCALSIZEX = (2, 0x00000FFC)
A6XX_SP_CS_NDRANGE_0_LOCALSIZEY = (12, 0x003FF000)
A6XX_SP_CS_NDRANGE_0_LOCALSIZEZ = (22, 0xFFC00000)
A6XX_SP_CS_CNTL_0_HALFREGFOOTPRINT = (1, 0x0000007E)
A6XX_SP_CS_CNTL_0_FULLREGFOOTPRINT = (7, 0x00001F80)
A6XX_SP_CS_CNTL_0_BRANCHSTACK = (14, 0x000FC000)
A6XX_SP_CS_CNTL_0_THREADSIZE = (20, 0x00100000)
A6XX_SP_CS_CNTL_1_SHARED_SIZE = (0, 0x0000001F)
A6XX_SP_CS_CNTL_1_CONSTANTRAMMODE = (5, 0x00000060)
A6XX_SP_CS_CONFIG_ENABLED = (8, 0x00000100)
A6XX_SP_CS_CONFIG_NTEX = (9, 0x0001FE00)
A6XX_SP_CS_CONFIG_NSAMP = (17, 0x003E0000)
A6XX_SP_CS_CONFIG_NUAV = (22, 0x1FC00000)
A6XX_SP_CS_CONST_CONFIG_CONSTLEN = (0, 0x000000FF)
A6XX_SP_CS_CONST_CONFIG_ENABLED = (8, 0x00000100)
A6XX_SP_CS_WGE_CNTL_LINEARLOCALIDREGID = (0, 0x000000FF)
A6XX_SP_CS_WGE_CNTL_THREADSIZE = (9, 0x00000200)
# SP_CS_CONST_CONFIG_0 (A6XX) and SP_CS_WIE_CNTL_0 (A6XX gen4+, A7XX): which registers the work-item ids arrive in
A6XX_SP_CS_CONST_CONFIG_0_WGIDCONSTID = (0, 0x000000FF)
A6XX_SP_CS_CONST_CONFIG_0_WGSIZECONSTID = (8, 0x0000FF00)
A6XX_SP_CS_CONST_CONFIG_0_WGOFFSETCONSTID = (16, 0x00FF0000)
A6XX_SP_CS_CONST_CONFIG_0_LOCALIDREGID = (24, 0xFF000000)
A7XX_SP_CS_WIE_CNTL_1_LINEARLOCALIDREGID = (0, 0x000000FF)
A7XX_SP_CS_WIE_CNTL_1_THREADSIZE = (8, 0x00000100)
A7XX_SP_CS_WIE_CNTL_1_WORKITEMRASTORDER = (15, 0x00008000)
A7XX_SP_CS_NDRANGE_7_LOCALSIZEX = (2, 0x00000FFC)
A7XX_SP_CS_NDRANGE_7_LOCALSIZEY = (12, 0x003FF000)
A7XX_SP_CS_NDRANGE_7_LOCALSIZEZ = (22, 0xFFC00000)
A7XX_SP_PS_WAVE_CNTL_THREADSIZE = (0, 0x00000001)
WORKITEMRASTORDER_LINEAR = 0    # a7xx_workitem_rast_order
A6XX_SP_UPDATE_CNTL_CS_STATE = (5, 0x00000020)
A6XX_SP_UPDATE_CNTL_CS_UAV = (6, 0x00000040)
A6XX_SP_MODE_CNTL_ISAMMODE = (1, 0x00000006)
A6XX_TPL1_MODE_CNTL_ISAMMODE = (0, 0x00000003)
A6XX_SP_CS_PVT_MEM_PARAM_MEMSIZEPERITEM = (0, 0x000000FF)
A6XX_SP_CS_PVT_MEM_SIZE_TOTALPVTMEMSIZE = (0, 0x0003FFFF)
A6XX_SP_CS_PVT_MEM_STACK_OFFSET_OFFSET = (0, 0x0007FFFF)
THREAD64, THREAD128 = 0, 1      # a6xx_threadsize
CONSTLEN_256 = 2                # a6xx_const_ram_mode
ISAMMODE_CL = 1                 # a6xx_isam_mode
# Not register facts (so not in the XML check): "no register" in an a3xx_regid field is regid(63, 0) = 63 << 2 in Mesa's
# ir3 (INVALID_REG); the work-item constant slots are the ones the seeds' system names for Qualcomm-compiled shaders.
REGID_INVALID = 0xFC
QCOM_WGIDCONSTID, QCOM_WGSIZECONSTID, QCOM_WGOFFSETCONSTID, QCOM_LOCALIDREGID = 0xCF, 0xC0, 0xCC, 0x00

# ---------------------------------------------------------------- texture / UAV descriptors (a6xx.xml, A6XX_TEX_CONST: 16 dwords)
TEX_CONST_DWORDS = 16
TEX_SAMP_DWORDS = 4
A6XX_TEX_CONST_0_TILE_MODE = (0, 0x00000003)
A6XX_TEX_CONST_0_SWIZ_X = (4, 0x00000070)
A6XX_TEX_CONST_0_SWIZ_Y = (7, 0x00000380)
A6XX_TEX_CONST_0_SWIZ_Z = (10, 0x00001C00)
A6XX_TEX_CONST_0_SWIZ_W = (13, 0x0000E000)
A6XX_TEX_CONST_0_FMT = (22, 0x3FC00000)
A6XX_TEX_CONST_1_WIDTH = (0, 0x00007FFF)
A6XX_TEX_CONST_1_HEIGHT = (15, 0x3FFF8000)
A6XX_TEX_CONST_2_PITCHALIGN = (0, 0x0000000F)
A6XX_TEX_CONST_2_PITCH = (7, 0x1FFFFF80)
A6XX_TEX_CONST_2_TYPE = (29, 0xE0000000)
A6XX_TEX_CONST_4_BASE_LO = (5, 0xFFFFFFE0)     # the address's bits 5-31 in place (the field holds address >> 5 at shift 5)
A6XX_TEX_CONST_5_BASE_HI = (0, 0x0001FFFF)
A6XX_TEX_SAMP_0_WRAP_S = (5, 0x000000E0)
A6XX_TEX_SAMP_0_WRAP_T = (8, 0x00000700)
A6XX_TEX_SAMP_0_WRAP_R = (11, 0x00003800)
A6XX_TEX_SAMP_1_UNNORM_COORDS = (5, 0x00000020)
TILE6_LINEAR = 0
A6XX_TEX_X, A6XX_TEX_Y, A6XX_TEX_Z, A6XX_TEX_W = 0, 1, 2, 3
A6XX_TEX_2D = 1
A6XX_TEX_CLAMP_TO_EDGE = 1
FMT6_16_16_16_16_FLOAT = 98
FMT6_32_32_32_32_FLOAT = 130


def pack(*pairs: tuple[tuple[int, int], int]) -> int:
  """One register word from (field, value) pairs; a value that does not fit its field is an error (never truncated)."""
  word = 0
  for (shift, mask), value in pairs:
    if (value << shift) & ~mask & 0xFFFFFFFF or value < 0:
      raise ValueError(f"{value} does not fit the register field {mask:#010x}")
    word |= value << shift & mask
  return word


def get(word: int, f: tuple[int, int]) -> int:
  """A field's value from a register word."""
  return (word & f[1]) >> f[0]
