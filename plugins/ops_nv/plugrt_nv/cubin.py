"""Cubins (NVIDIA's ELF kernels, from NVRTC or ptxas) read without the CUDA driver: the loadable image, the
kernel's resource needs (registers, shared and local memory, barriers), its parameter layout in constant
bank 0, other constant banks, and the relocations to apply once the image has a GPU address.

`.nv.info` records are (format u8, attribute u8, u16) headers; format 4 carries a u16-sized payload, the
others keep their value in the u16. The attributes read are listed in ATTR.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

from plugrt.errors import CompileError

SHT_PROGBITS, SHT_SYMTAB, SHT_RELA, SHT_NOBITS, SHT_REL = 1, 2, 4, 8, 9
SHF_ALLOC = 0x2
STT_FUNC = 2
ATTR = {"param_cbank": 0x0A, "frame_size": 0x11, "min_stack_size": 0x12, "kparam_info": 0x17, "cbank_param_size": 0x19,
        "regcount": 0x2F, "num_barriers": 0x4C}
R_CUDA_64, R_CUDA_ABS32_LO, R_CUDA_ABS32_HI = 0x02, 0x38, 0x39
# an absolute code address inside a 128-bit instruction: CALL.ABS.NOINC, which nvJitLink's linked cubins keep for calls
# between functions (ptxas alone inlines them or calls relative). The address in 4-byte units, split into (bit, width)
# pieces, low bits first. The unit is what the hardware showed: with byte addresses the call faulted at 4x the target
# (docs/research/nv-hopper-compute.md).
R_CUDA_ABS55_16_34 = 0x4B
INSN_FIELDS = {R_CUDA_ABS55_16_34: (2, ((16, 8), (34, 47)))}
RELOCS = (R_CUDA_64, R_CUDA_ABS32_LO, R_CUDA_ABS32_HI, *INSN_FIELDS)


def patch_insn(img: bytearray, at: int, kind: int, va: int) -> None:
  """Write address `va` into the instruction at `at` for relocation `kind`; the fields must be zero (as the linker leaves them)."""
  insn = int.from_bytes(img[at:at + 16], "little")
  shift, pieces = INSN_FIELDS[kind]
  v = va >> shift
  if va & ((1 << shift) - 1) or v >> sum(w for _, w in pieces): raise CompileError(f"code address {va:#x} does not fit relocation {kind:#x}")
  for bit, width in pieces:
    mask = (1 << width) - 1
    if insn >> bit & mask: raise CompileError(f"relocation {kind:#x} at {at:#x}: the instruction's address field is not empty")
    insn |= (v & mask) << bit
    v >>= width
  img[at:at + 16] = insn.to_bytes(16, "little")
SECTION_ALIGN = 128  # code and constant banks start on 128-byte boundaries


@dataclass
class Section:
  name: str
  type: int
  flags: int
  offset: int
  size: int
  link: int
  info: int
  align: int
  entsize: int
  addr: int = -1  # where it lies in the loaded image; -1: not loaded


@dataclass
class Kernel:
  """One kernel of a cubin, ready to load: `image` goes to GPU memory at some base; addresses below are offsets in it."""
  name: str
  image: bytearray
  entry: int                       # offset of the kernel's code in the image
  code_size: int
  regs: int
  shared: int                      # static shared memory (bytes, as the cubin's .nv.shared.<name> says)
  barriers: int
  stack: int                       # local memory each thread needs below the stack top (bytes)
  param_base: int                  # where parameters start in constant bank 0 (0x210 on sm_90, 0x160 before)
  params: list[tuple[int, int]]    # (offset from param_base, size) per parameter, in declaration order
  cbuf0: bytes                     # constant bank 0's initial contents (driver area + parameters), all zero in practice
  banks: dict[int, tuple[int, int]] = field(default_factory=dict)   # other constant banks: bank -> (image offset, size)
  relocs: list[tuple[int, int, int]] = field(default_factory=list)  # (image offset, type, target image offset incl. addend)

  def relocated(self, base: int) -> bytes:
    """The image with every relocation resolved for a load at GPU address `base`."""
    img = bytearray(self.image)
    for at, kind, target in self.relocs:
      va = base + target
      if kind == R_CUDA_64: struct.pack_into("<Q", img, at, va)
      elif kind == R_CUDA_ABS32_LO: struct.pack_into("<I", img, at + 4, va & 0xFFFFFFFF)
      elif kind == R_CUDA_ABS32_HI: struct.pack_into("<I", img, at + 4, va >> 32)
      elif kind in INSN_FIELDS: patch_insn(img, at, kind, va)
    return bytes(img)


def _cstr(blob: bytes, off: int) -> str: return blob[off:blob.index(b"\0", off)].decode()


def _records(data: bytes):
  """(attribute, payload bytes or u16 value) of every record in a .nv.info section."""
  o = 0
  while o + 4 <= len(data):
    fmt, attr, v = struct.unpack_from("<BBH", data, o)
    o += 4
    if fmt == 4: yield attr, data[o:o + v]; o += v
    else: yield attr, v


EM_CUDA = 190


def parse(blob: bytes, name: str | None = None) -> Kernel:
  """The kernel `name` (or the cubin's only kernel) of `blob`; a file that is not a cubin raises CompileError."""
  if blob[:4] != b"\x7fELF" or blob[4] != 2:
    raise CompileError("not a cubin: the NV device loads 64-bit ELF kernels (NVRTC -cubin or ptxas output)",
                       hint="compile with the NV device's compiler")
  from plugrt.elf import ET_EXEC, ET_REL, check_elf
  check_elf(blob, "cubin", (ET_EXEC, ET_REL), EM_CUDA)  # every table inside the file: a truncated cubin raises, not uploads garbage
  shoff, = struct.unpack_from("<Q", blob, 0x28)
  shentsize, shnum, shstrndx = struct.unpack_from("<HHH", blob, 0x3A)
  raw = [struct.unpack_from("<IIQQQQIIQQ", blob, shoff + i * shentsize) for i in range(shnum)]
  strtab_off = raw[shstrndx][4]
  secs = [Section(_cstr(blob, strtab_off + r[0]), r[1], r[2], r[4], r[5], r[6], r[7], r[8], r[9]) for r in raw]
  content = lambda s: blob[s.offset:s.offset + s.size]
  symtab = next((s for s in secs if s.type == SHT_SYMTAB), None)
  if symtab is None: raise CompileError("cubin has no symbol table")
  strs = secs[symtab.link].offset
  syms = [struct.unpack_from("<IBBHQQ", blob, symtab.offset + o) for o in range(0, symtab.size, 24)]
  funcs = {_cstr(blob, strs + s[0]): i for i, s in enumerate(syms) if s[1] & 0xF == STT_FUNC and s[1] >> 4 == 1}  # global functions
  if name is None:
    if len(funcs) != 1: raise CompileError(f"cubin has {len(funcs)} kernels ({', '.join(funcs)}); name the one to load")
    name = next(iter(funcs))
  if name not in funcs: raise CompileError(f"cubin has no kernel named {name!r} (it has {', '.join(funcs) or 'none'})")
  ksym = funcs[name]

  # the image: allocated sections (code, constant banks, globals), each aligned; shared memory is not in it
  image = bytearray()
  for s in secs:
    if not s.flags & SHF_ALLOC or s.type not in (SHT_PROGBITS, SHT_NOBITS) or s.name.startswith(".nv.shared"): continue
    image += bytes(-len(image) % max(s.align, SECTION_ALIGN))
    s.addr = len(image)
    image += content(s) if s.type == SHT_PROGBITS else bytes(s.size)
  text = next((s for s in secs if s.name == f".text.{name}"), None)
  if text is None or text.addr < 0: raise CompileError(f"cubin has no code section for {name}")
  entry = text.addr + syms[ksym][4]

  relocs = []
  for s in secs:
    if s.type not in (SHT_REL, SHT_RELA) or not s.size or secs[s.info].addr < 0: continue
    step = 24 if s.type == SHT_RELA else 16
    for o in range(s.offset, s.offset + s.size, step):
      off, info = struct.unpack_from("<QQ", blob, o)
      addend = struct.unpack_from("<q", blob, o + 16)[0] if s.type == SHT_RELA else 0
      kind, sym = info & 0xFFFFFFFF, syms[info >> 32]
      if kind not in RELOCS:
        raise CompileError(f"cubin for {name} needs relocation type {kind:#x} in {s.name}, which plugrt-nv does not apply yet")
      if sym[3] == 0 or secs[sym[3]].addr < 0:
        raise CompileError(f"cubin for {name} relocates against {_cstr(blob, strs + sym[0])}, which is not loaded")
      relocs.append((secs[s.info].addr + off, kind, secs[sym[3]].addr + sym[4] + addend))

  info = {a: v for s in secs if s.name == f".nv.info.{name}" for a, v in _records(content(s))}
  per_kernel = [(a, v) for s in secs if s.name == f".nv.info.{name}" for a, v in _records(content(s))]
  regs = stack = 0
  for s in secs:
    if s.name != ".nv.info": continue
    for a, v in _records(content(s)):
      if not isinstance(v, bytes) or len(v) < 8: continue
      sym, val = struct.unpack_from("<II", v)
      if a == ATTR["regcount"] and sym == ksym: regs = val
      if a == ATTR["min_stack_size"]: stack = max(stack, val)  # the kernel's own, or a callee's: local memory is per device anyway
  if ATTR["param_cbank"] not in info: raise CompileError(f"cubin for {name} does not say where its parameters are (no EIATTR_PARAM_CBANK)")
  _, param_base, param_size = struct.unpack_from("<IHH", info[ATTR["param_cbank"]])
  params = sorted(struct.unpack_from("<IHHI", v)[1:] for a, v in per_kernel if a == ATTR["kparam_info"])
  c0 = next((s for s in secs if s.name == f".nv.constant0.{name}"), None)
  cbuf0 = content(c0) if c0 is not None and c0.type == SHT_PROGBITS else bytes(param_base + param_size)
  banks = {}
  for s in secs:
    if s.name.startswith(".nv.constant") and not s.name.startswith(".nv.constant0") and s.addr >= 0:
      banks[int(s.name[len(".nv.constant"):].split(".")[0])] = (s.addr, s.size)
  shared = next((s.size for s in secs if s.name == f".nv.shared.{name}"), 0)
  barriers = info.get(ATTR["num_barriers"], 0)
  return Kernel(name, image, entry, text.size, regs, shared, barriers & 0xFF if isinstance(barriers, int) else 0, stack, param_base,
                [(off, flags >> 18 & 0x3FFF) for _, off, flags in params], cbuf0, banks, relocs)
