"""AMD GPU architectures as data: what the compilers and (next) the queue layer need to know of each.

Sources (docs/research/amd.md): LLVM's AMDGPUUsage (processor table: wavefront size, LDS size; ELF header table:
EF_AMDGPU_MACH values and the xnack/sramecc feature bits of code object v4+), the Linux kernel's KFD topology
(`gfx_target_version` = major * 10000 + minor * 100 + stepping, hex digits for minor and stepping as gfxNNN spells
them), and the products named for each.
"""
from __future__ import annotations

from typing import NamedTuple


class Arch(NamedTuple):
  name: str              # LLVM processor name: gfx1100
  family: str            # CDNA2, CDNA3, RDNA3, RDNA4
  products: str          # what users have
  wavefront: int         # the wavefront size the compilers build for (RDNA: 32, CDNA: 64)
  mach: int              # EF_AMDGPU_MACH in the code object's e_flags (low byte)
  lds_bytes: int         # LDS (shared memory) one workgroup may allocate
  target_version: int    # KFD topology's gfx_target_version


ARCHS: dict[str, Arch] = {a.name: a for a in (
  Arch("gfx90a", "CDNA2", "Instinct MI210, MI250, MI250X", 64, 0x03F, 65536, 90010),
  Arch("gfx942", "CDNA3", "Instinct MI300A, MI300X, MI325X", 64, 0x04C, 65536, 90402),
  Arch("gfx950", "CDNA4", "Instinct MI350X, MI355X", 64, 0x04F, 163840, 90500),
  Arch("gfx1030", "RDNA2", "Radeon RX 6800, 6900", 32, 0x036, 65536, 100300),
  Arch("gfx1100", "RDNA3", "Radeon RX 7900 XTX, XT, GRE; Radeon PRO W7900", 32, 0x041, 65536, 110000),
  Arch("gfx1101", "RDNA3", "Radeon RX 7800 XT, 7700 XT", 32, 0x046, 65536, 110001),
  Arch("gfx1102", "RDNA3", "Radeon RX 7600", 32, 0x047, 65536, 110002),
  Arch("gfx1200", "RDNA4", "Radeon RX 9060 XT", 32, 0x048, 65536, 120000),
  Arch("gfx1201", "RDNA4", "Radeon RX 9070, 9070 XT", 32, 0x04E, 65536, 120001),
)}
#: the arch compiled for when neither DEV's ARCH nor an opened device says
DEFAULT_ARCH = "gfx1100"
#: the four the tests build every conformance kernel for
TESTED_ARCHS = ("gfx90a", "gfx942", "gfx1100", "gfx1201")

# ELF header of an AMDGPU code object (AMDGPUUsage, "ELF Header")
EM_AMDGPU = 224
ELFOSABI_AMDGPU_HSA = 64
ELFABIVERSION_AMDGPU_HSA_V5 = 3        # code object v5
CODE_OBJECT_VERSION = 5
EF_AMDGPU_MACH = 0x0FF
EF_AMDGPU_FEATURE_XNACK_V4 = 0x300      # 0x000 unsupported, 0x100 any, 0x200 off, 0x300 on
EF_AMDGPU_FEATURE_SRAMECC_V4 = 0xC00    # 0x000 unsupported, 0x400 any, 0x800 off, 0xC00 on
NT_AMDGPU_METADATA = 32                 # note type of the msgpack metadata, owner "AMDGPU"

# kernels read their launch geometry from the v5 hidden kernel arguments (the implicit argument block after the
# explicit arguments): byte offsets inside that block (AMDGPUUsage, "Code Object V5 Metadata", hidden arguments)
HIDDEN_BLOCK_COUNT = 0    # u32 x3: groups per axis
HIDDEN_GROUP_SIZE = 12    # u16 x3: work-items per group per axis
HIDDEN_REMAINDER = 18     # u16 x3


def arch_from_target_version(v: int) -> str:
  """KFD's gfx_target_version (110000) -> "gfx1100"; 90010 -> "gfx90a" (minor and stepping as hex digits)."""
  major, minor, step = v // 10000, v // 100 % 100, v % 100
  return f"gfx{major}{minor:x}{step:x}"


def lookup(name: str) -> Arch:
  """The Arch for `name` (case and an xnack/sramecc suffix ignored: "gfx90a:xnack-"); KeyError with the known ones."""
  base = name.strip().lower().split(":")[0]
  if base not in ARCHS: raise KeyError(base)
  return ARCHS[base]
