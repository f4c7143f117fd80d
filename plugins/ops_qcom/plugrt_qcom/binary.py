"""The shader inside a program binary from Qualcomm's OpenCL driver (clGetProgramInfo(CL_PROGRAM_BINARIES)), and the
layout of its constants and descriptors.

The binary is an undocumented container; what is read here is what the seeds' system (tinygrad's ops_qcom) reads,
as facts about the layout (docs/research/qcom.md): little-endian 32-bit words at fixed offsets of the file point at
- the shader code: offset at 0xC0, size at 0x100;
- the register footprint: a block whose offset is at 0x34, full registers at +0x14, half registers at +0x18;
- the shader descriptor: offset at 0x110; in it the first instruction's offset (+0xC4), private memory per thread
  (+0xC8), local memory (+0xD8), the number of samplers (+0xDC), twice the branch stack depth (+0x108), and the kernel's
  name at +0x158 (its length is not stored: the reader knows the name, and the next field may overwrite its terminator);
- the kernel arguments, in declaration order, from the first 4-byte boundary after the name plus 8 bytes per sampler:
  records of eight words (length in bytes, -, -, offset in the constant file in 32-bit words, -, -, -, kind), ended by a
  length of 0; kind 1 is an image read through a texture, kind 2 an image written through a UAV, others a plain argument;
- immediate constants the shader expects in the constant file (when the word at 0xB0 is not 0): 40-byte records from
  the offset at 0xAC up to the shader code: value (+0), offset in units of the value's size (+16), 32-bit flag (+24).
Anything out of range is a CompileError naming the field, never an IndexError.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

from plugrt.errors import CompileError

ARG_TEXTURE, ARG_UAV = 1, 2


@dataclass(frozen=True)
class Argument:
  offset: int   # byte offset in the constant file
  kind: int     # ARG_TEXTURE, ARG_UAV, or another value for a plain argument


@dataclass
class ShaderBinary:
  code: bytes
  entry: int
  full_regs: int
  half_regs: int
  branch_stack: int
  private: int
  shared: int
  samplers: int
  name: str
  args: list[Argument] = field(default_factory=list)
  consts: list[tuple[int, int, int]] = field(default_factory=list)  # (value, byte offset, size in bytes)

  @property
  def textures(self) -> int: return sum(a.kind == ARG_TEXTURE for a in self.args)
  @property
  def uavs(self) -> int: return sum(a.kind == ARG_UAV for a in self.args)


def parse(lib: bytes, name: str) -> ShaderBinary:
  """The shader and its layout from a Qualcomm OpenCL program binary of the kernel `name` (see the module docstring)."""
  def u32(off: int, what: str) -> int:
    if not 0 <= off <= len(lib) - 4: raise CompileError(f"the Qualcomm program binary ({len(lib)} bytes) is too short for its {what} at {off:#x}")
    return struct.unpack_from("<I", lib, off)[0]
  code_off, code_size = u32(0xC0, "shader offset"), u32(0x100, "shader size")
  if code_size == 0 or code_off + code_size > len(lib):
    raise CompileError(f"the Qualcomm program binary's shader ({code_size} bytes at {code_off:#x}) lies outside its {len(lib)} bytes")
  regs = u32(0x34, "register block offset")
  desc = u32(0x110, "shader descriptor offset")
  samplers = u32(desc + 0xDC, "sampler count")
  name_at = desc + 0x158
  if lib[name_at:name_at + len(name)] != name.encode():
    raise CompileError(f"the Qualcomm program binary is not kernel {name}'s: it names {lib[name_at:name_at + len(name)]!r}")
  sb = ShaderBinary(lib[code_off:code_off + code_size], u32(desc + 0xC4, "entry offset"), u32(regs + 0x14, "full registers"),
                    u32(regs + 0x18, "half registers"), u32(desc + 0x108, "branch stack") // 2, u32(desc + 0xC8, "private memory"),
                    u32(desc + 0xD8, "local memory"), samplers, name)
  at = -(-(name_at + len(name)) // 4) * 4 + 8 * samplers
  while at + 32 <= len(lib):
    length, _, _, offset_words, _, _, _, kind = struct.unpack_from("<8I", lib, at)
    if length == 0: break
    if length < 32: raise CompileError(f"the Qualcomm program binary's argument record at {at:#x} claims {length} bytes (at least 32)")
    sb.args.append(Argument(offset_words * 4, kind))
    at += length
  if u32(0xB0, "constant count") != 0:
    at = u32(0xAC, "constant records offset")
    while at + 40 <= code_off:
      value, = struct.unpack_from("<I", lib, at)
      offset_units, _, is32 = struct.unpack_from("<3I", lib, at + 16)
      size = 2 << (is32 & 1)
      sb.consts.append((value, offset_units * size, size))
      at += 40
  return sb
