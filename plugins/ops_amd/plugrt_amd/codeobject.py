"""An AMDGPU HSA code object (v5, an ELF shared object), parsed into what a dispatcher needs.

`parse(blob)` checks the ELF (plugrt.elf.check_elf), reads its loadable segments, dynamic symbols, relocations
and the NT_AMDGPU_METADATA note (MessagePack, decoded by `unpackb` here: no msgpack dependency), and decodes every
kernel's 64-byte kernel descriptor. Layouts: LLVM's AMDGPUUsage ("Kernel Descriptor", "Code Object V5 Metadata",
"ELF Header", "Relocation Records"); see docs/research/amd.md. A dispatcher (and the fake KFD) uses:

- `CodeObject.image(base)`: the bytes to place at GPU address `base` (segments at their virtual addresses,
  R_AMDGPU_RELATIVE64 relocations applied);
- per kernel (`CodeObject.kernels[name]`): the descriptor's offset in that image (an AQL packet's kernel_object is
  base + kd_offset), the kernarg segment size and alignment, each argument's offset, size and kind (buffers, scalars,
  and the hidden arguments the dispatcher fills: block counts, group sizes, ...), LDS and scratch sizes, wavefront
  size, and the register counts from both the descriptor and the metadata.
"""
from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from plugrt.elf import ET_DYN, check_elf
from plugrt.errors import PluginError
from plugrt_amd import hw

KD_SIZE = 64
SHT_SYMTAB, SHT_NOTE, SHT_RELA, SHT_DYNSYM = 2, 7, 4, 11
PT_LOAD = 1
STT_OBJECT, STT_FUNC = 1, 2
R_AMDGPU_RELATIVE64 = 13


# ---------------------------------------------------------------- MessagePack (the subset the metadata uses, and the rest of the format's scalars)

def unpackb(data: bytes) -> Any:
  """The one MessagePack value in `data` (maps -> dict, arrays -> list, str -> str, bin -> bytes); ValueError when
  it is truncated, has bytes left over, or uses an extension type."""
  value, end = _unpack(memoryview(data), 0)
  if end != len(data): raise ValueError(f"msgpack: {len(data) - end} bytes after the value")
  return value


def _unpack(b: memoryview, i: int) -> tuple[Any, int]:
  def take(n: int) -> tuple[bytes, int]:
    if i + 1 + n > len(b): raise ValueError(f"msgpack: truncated at byte {i}")
    return bytes(b[i + 1:i + 1 + n]), i + 1 + n
  def sized(fmt: str, k: int) -> tuple[int, int]:  # a length field after the tag
    raw, j = take(k)
    return struct.unpack(fmt, raw)[0], j
  def seq(n: int, j: int, is_map: bool) -> tuple[Any, int]:
    if is_map:
      out: dict = {}
      for _ in range(n):
        k, j = _unpack(b, j)
        v, j = _unpack(b, j)
        out[k if not isinstance(k, list) else tuple(k)] = v
      return out, j
    items = []
    for _ in range(n):
      v, j = _unpack(b, j)
      items.append(v)
    return items, j
  def blob(n: int, j: int, text: bool) -> tuple[Any, int]:
    if j + n > len(b): raise ValueError(f"msgpack: a string runs past the end at byte {j}")
    raw = bytes(b[j:j + n])
    return (raw.decode("utf-8", "replace") if text else raw), j + n

  if i >= len(b): raise ValueError("msgpack: truncated")
  t = b[i]
  if t <= 0x7F: return t, i + 1
  if t >= 0xE0: return t - 0x100, i + 1
  if 0x80 <= t <= 0x8F: return seq(t & 0x0F, i + 1, True)
  if 0x90 <= t <= 0x9F: return seq(t & 0x0F, i + 1, False)
  if 0xA0 <= t <= 0xBF: return blob(t & 0x1F, i + 1, True)
  if t == 0xC0: return None, i + 1
  if t in (0xC2, 0xC3): return t == 0xC3, i + 1
  if t in (0xC4, 0xC5, 0xC6):
    n, j = sized({0xC4: "<B", 0xC5: ">H", 0xC6: ">I"}[t], {0xC4: 1, 0xC5: 2, 0xC6: 4}[t])
    return blob(n, j, False)
  if t == 0xCA: raw, j = take(4); return struct.unpack(">f", raw)[0], j
  if t == 0xCB: raw, j = take(8); return struct.unpack(">d", raw)[0], j
  ints = {0xCC: (">B", 1), 0xCD: (">H", 2), 0xCE: (">I", 4), 0xCF: (">Q", 8), 0xD0: (">b", 1), 0xD1: (">h", 2), 0xD2: (">i", 4), 0xD3: (">q", 8)}
  if t in ints: return sized(*ints[t])
  if t in (0xD9, 0xDA, 0xDB):
    n, j = sized({0xD9: ">B", 0xDA: ">H", 0xDB: ">I"}[t], {0xD9: 1, 0xDA: 2, 0xDB: 4}[t])
    return blob(n, j, True)
  if t in (0xDC, 0xDD):
    n, j = sized(">H" if t == 0xDC else ">I", 2 if t == 0xDC else 4)
    return seq(n, j, False)
  if t in (0xDE, 0xDF):
    n, j = sized(">H" if t == 0xDE else ">I", 2 if t == 0xDE else 4)
    return seq(n, j, True)
  raise ValueError(f"msgpack: type byte 0x{t:02X} (an extension type) at byte {i} is not used by AMDGPU metadata")


# ---------------------------------------------------------------- the kernel descriptor

@dataclass(frozen=True)
class KernelDescriptor:
  """The 64-byte kernel descriptor (AMDGPUUsage, "Kernel Descriptor for GFX6-GFX12"), its fields decoded."""
  raw: bytes
  group_segment_fixed_size: int
  private_segment_fixed_size: int
  kernarg_size: int
  kernel_code_entry_byte_offset: int   # signed, from the descriptor's own address to the code
  compute_pgm_rsrc3: int
  compute_pgm_rsrc1: int
  compute_pgm_rsrc2: int
  kernel_code_properties: int
  kernarg_preload: int

  @classmethod
  def decode(cls, raw: bytes) -> KernelDescriptor:
    if len(raw) != KD_SIZE: raise PluginError(f"a kernel descriptor is {KD_SIZE} bytes, not {len(raw)}")
    g, p, k = struct.unpack_from("<III", raw, 0)
    entry, = struct.unpack_from("<q", raw, 16)
    r3, r1, r2 = struct.unpack_from("<III", raw, 44)
    props, preload = struct.unpack_from("<HH", raw, 56)
    return cls(bytes(raw), g, p, k, entry, r3, r1, r2, props, preload)

  # compute_pgm_rsrc1
  @property
  def granulated_vgpr_count(self) -> int: return self.compute_pgm_rsrc1 & 0x3F
  @property
  def granulated_sgpr_count(self) -> int: return (self.compute_pgm_rsrc1 >> 6) & 0xF
  @property
  def ieee_mode(self) -> bool: return bool(self.compute_pgm_rsrc1 >> 23 & 1)
  # compute_pgm_rsrc2
  @property
  def private_segment_enabled(self) -> bool: return bool(self.compute_pgm_rsrc2 & 1)
  @property
  def user_sgpr_count(self) -> int: return (self.compute_pgm_rsrc2 >> 1) & 0x1F
  @property
  def workgroup_id_sgprs(self) -> tuple[bool, bool, bool]: return tuple(bool(self.compute_pgm_rsrc2 >> b & 1) for b in (7, 8, 9))  # type: ignore[return-value]
  @property
  def workitem_id_vgprs(self) -> int:
    """How many work-item id VGPRs the hardware initialises: 1 (x), 2 (x, y) or 3 (x, y, z)."""
    return ((self.compute_pgm_rsrc2 >> 11) & 3) + 1
  # kernel_code_properties
  @property
  def wavefront_size32(self) -> bool: return bool(self.kernel_code_properties >> 10 & 1)
  @property
  def uses_dynamic_stack(self) -> bool: return bool(self.kernel_code_properties >> 11 & 1)
  @property
  def user_sgprs(self) -> tuple[str, ...]:
    """The enabled user SGPR inputs, in the order the hardware loads them (kernel_code_properties bits 0-6)."""
    names = ("private_segment_buffer", "dispatch_ptr", "queue_ptr", "kernarg_segment_ptr", "dispatch_id", "flat_scratch_init",
             "private_segment_size")
    return tuple(n for b, n in enumerate(names) if self.kernel_code_properties >> b & 1)
  @property
  def accum_offset(self) -> int:
    """gfx90a/gfx942: the first AccVGPR, (ACCUM_OFFSET + 1) * 4 (compute_pgm_rsrc3 bits 0-5)."""
    return ((self.compute_pgm_rsrc3 & 0x3F) + 1) * 4

  def vgpr_limit(self, arch: str, wavefront: int) -> int:
    """The VGPRs (arch + acc) the descriptor reserves per work-item: (granules + 1) * the encoding granule."""
    a = hw.lookup(arch)
    granule = 8 if a.name in ("gfx90a", "gfx942", "gfx950") or (a.family.startswith("RDNA") and wavefront == 32) else 4
    return (self.granulated_vgpr_count + 1) * granule

  def sgpr_limit(self, arch: str) -> int | None:
    """GFX9: the SGPRs reserved, (granules / 2 + 1) * 16; GFX10 and later allocate SGPRs themselves (None)."""
    return None if hw.lookup(arch).family.startswith("RDNA") else (self.granulated_sgpr_count // 2 + 1) * 16


# ---------------------------------------------------------------- kernels and the code object

@dataclass(frozen=True)
class KernelArg:
  name: str
  offset: int
  size: int
  kind: str            # .value_kind: global_buffer, by_value, hidden_block_count_x, ...
  address_space: str   # "global" for buffers, "" otherwise

  @property
  def hidden(self) -> bool: return self.kind.startswith("hidden_")


@dataclass(frozen=True)
class KernelInfo:
  name: str
  kd_offset: int                 # the descriptor's virtual address in the image
  code_offset: int               # the code's virtual address (kd_offset + kernel_code_entry_byte_offset)
  descriptor: KernelDescriptor
  kernarg_size: int
  kernarg_align: int
  args: tuple[KernelArg, ...]
  group_segment_size: int        # LDS bytes (static)
  private_segment_size: int      # scratch bytes per work-item
  wavefront_size: int
  sgpr_count: int
  vgpr_count: int
  agpr_count: int
  max_flat_workgroup_size: int
  metadata: dict = field(repr=False, compare=False, default_factory=dict)

  @property
  def explicit_args(self) -> tuple[KernelArg, ...]: return tuple(a for a in self.args if not a.hidden)
  @property
  def hidden_args(self) -> tuple[KernelArg, ...]: return tuple(a for a in self.args if a.hidden)

  def hidden(self, kind: str) -> KernelArg | None:
    """The hidden argument of `kind` ("hidden_block_count_x", or "block_count_x"), or None when the kernel has none."""
    kind = kind if kind.startswith("hidden_") else "hidden_" + kind
    return next((a for a in self.args if a.kind == kind), None)

  def kernargs(self, buffers: Sequence[int], scalars: Sequence[bytes], groups: Sequence[int], local: Sequence[int]) -> bytearray:
    """The kernel argument segment for one launch: buffer addresses and scalars' bytes (little-endian, their own sizes)
    at their offsets, and the hidden arguments a plugrt kernel reads (block counts, group sizes; remainders 0: plugrt
    launches whole groups; grid dims 3; global offsets 0). Every other hidden argument (hostcall, heap, queue and
    aperture pointers) stays 0: plugrt's renderers never use them. The reference a dispatcher's prepared launch
    (and the fake KFD's check of it) is measured against; ValueError when the counts or sizes disagree with the kernel."""
    explicit = self.explicit_args
    ptrs = [a for a in explicit if a.kind == "global_buffer"]
    vals = [a for a in explicit if a.kind != "global_buffer"]
    if len(ptrs) != len(buffers) or len(vals) != len(scalars):
      raise ValueError(f"kernel {self.name} takes {len(ptrs)} buffers and {len(vals)} scalars, not {len(buffers)} and {len(scalars)}")
    out = bytearray(self.kernarg_size)
    for a, ptr in zip(ptrs, buffers): struct.pack_into("<Q", out, a.offset, ptr)
    for a, raw in zip(vals, scalars):
      if len(raw) != a.size: raise ValueError(f"kernel {self.name}: scalar {a.name or a.offset} is {a.size} bytes, not {len(raw)}")
      out[a.offset:a.offset + a.size] = raw
    for a in self.hidden_args:
      axis = "xyz".find(a.kind[-1]) if a.kind[-2:-1] == "_" else -1
      if a.kind.startswith("hidden_block_count_"): struct.pack_into("<I", out, a.offset, groups[axis])
      elif a.kind.startswith("hidden_group_size_"): struct.pack_into("<H", out, a.offset, local[axis])
      elif a.kind == "hidden_grid_dims": struct.pack_into("<H", out, a.offset, 3)
    return out

  @property
  def implicit_offset(self) -> int:
    """Where the hidden arguments begin (what llvm.amdgcn.implicitarg.ptr points at): the first hidden argument."""
    h = self.hidden_args
    return min(a.offset for a in h) if h else self.kernarg_size


@dataclass(frozen=True)
class Segment:
  vaddr: int
  offset: int
  filesz: int
  memsz: int
  flags: int


@dataclass(frozen=True)
class CodeObject:
  arch: str                       # gfx1100, from e_flags (the metadata's amdhsa.target agrees)
  e_flags: int
  abi_version: int                # EI_ABIVERSION: 3 is code object v5
  target: str                     # amdhsa.target: amdgcn-amd-amdhsa--gfx90a:sramecc+:xnack-
  kernels: dict[str, KernelInfo]
  segments: tuple[Segment, ...]
  relocations: tuple[tuple[int, int, int], ...]   # (offset, type, addend)
  image_size: int
  metadata: dict = field(repr=False, compare=False, default_factory=dict)
  blob: bytes = field(repr=False, compare=False, default=b"")

  @property
  def code_object_version(self) -> int: return {1: 3, 2: 4, 3: 5, 4: 6}.get(self.abi_version, 0)

  def image(self, base: int = 0) -> bytearray:
    """The loaded image for GPU address `base`: segments at their virtual addresses, relative relocations applied."""
    out = bytearray(self.image_size)
    for s in self.segments: out[s.vaddr:s.vaddr + s.filesz] = self.blob[s.offset:s.offset + s.filesz]
    for off, kind, addend in self.relocations:
      if kind == R_AMDGPU_RELATIVE64: struct.pack_into("<Q", out, off, (base + addend) & (1 << 64) - 1)
    return out


def _arch_of(e_flags: int) -> str:
  mach = e_flags & hw.EF_AMDGPU_MACH
  return next((a.name for a in hw.ARCHS.values() if a.mach == mach), f"mach 0x{mach:03X}")


def notes(blob: bytes, offset: int, size: int) -> list[tuple[str, int, bytes]]:
  """The ELF notes in blob[offset:offset+size]: (owner, type, description)."""
  out, i, end = [], offset, offset + size
  while i + 12 <= end:
    namesz, descsz, kind = struct.unpack_from("<III", blob, i)
    name_at, desc_at = i + 12, i + 12 + (namesz + 3) // 4 * 4
    nxt = desc_at + (descsz + 3) // 4 * 4
    if desc_at + descsz > end: raise PluginError("AMD code object: a note runs past its section")
    out.append((blob[name_at:name_at + namesz].rstrip(b"\0").decode("ascii", "replace"), kind, blob[desc_at:desc_at + descsz]))
    i = nxt
  return out


def parse(blob: bytes) -> CodeObject:
  """The description of code object `blob`; PluginError when it is not a loadable AMDGPU code object."""
  blob = bytes(blob)
  check_elf(blob, "AMD code object", (ET_DYN,), hw.EM_AMDGPU)
  abi_version, e_flags = blob[8], struct.unpack_from("<I", blob, 48)[0]
  phoff, shoff = struct.unpack_from("<QQ", blob, 32)
  _, phnum, _, shnum, _ = struct.unpack_from("<HHHHH", blob, 54)
  segments = []
  for i in range(phnum):
    p_type, p_flags, p_offset, p_vaddr, _, p_filesz, p_memsz, _ = struct.unpack_from("<IIQQQQQQ", blob, phoff + i * 56)
    if p_type == PT_LOAD: segments.append(Segment(p_vaddr, p_offset, p_filesz, p_memsz, p_flags))
  sections = [struct.unpack_from("<IIQQQQIIQQ", blob, shoff + i * 64) for i in range(shnum)]
  symbols: dict[str, tuple[int, int, int]] = {}  # name -> (value, size, type)
  relocations: list[tuple[int, int, int]] = []
  metadata: dict = {}
  for _, sh_type, _, _, off, size, link, _, _, entsize in sections:
    if sh_type in (SHT_SYMTAB, SHT_DYNSYM) and entsize:
      stroff = sections[link][4]
      for pos in range(off + entsize, off + size, entsize):
        st_name, st_info, _, _, st_value, st_size = struct.unpack_from("<IBBHQQ", blob, pos)
        if not st_name: continue
        name = blob[stroff + st_name:blob.index(b"\0", stroff + st_name)].decode("utf-8", "replace")
        symbols.setdefault(name, (st_value, st_size, st_info & 0xF))
    elif sh_type == SHT_RELA and entsize:
      for pos in range(off, off + size, entsize):
        r_offset, r_info, r_addend = struct.unpack_from("<QQq", blob, pos)
        relocations.append((r_offset, r_info & 0xFFFFFFFF, r_addend))
    elif sh_type == SHT_NOTE:
      for owner, kind, desc in notes(blob, off, size):
        if owner == "AMDGPU" and kind == hw.NT_AMDGPU_METADATA:
          try: metadata = unpackb(desc)
          except ValueError as e: raise PluginError(f"AMD code object: its metadata note is not MessagePack: {e}") from None
  if not metadata: raise PluginError("AMD code object: no NT_AMDGPU_METADATA note (is it code object v3 or newer?)")
  image_size = max((s.vaddr + s.memsz for s in segments), default=0)
  image = bytearray(image_size)
  for s in segments: image[s.vaddr:s.vaddr + s.filesz] = blob[s.offset:s.offset + s.filesz]
  kernels = {}
  for meta in metadata.get("amdhsa.kernels", []):
    name, sym = meta.get(".name", ""), meta.get(".symbol", meta.get(".name", "") + ".kd")
    if sym not in symbols: raise PluginError(f"AMD code object: kernel {name!r} has no descriptor symbol {sym!r}")
    kd_at = symbols[sym][0]
    if kd_at + KD_SIZE > image_size: raise PluginError(f"AMD code object: kernel {name!r}'s descriptor lies outside the image")
    kd = KernelDescriptor.decode(bytes(image[kd_at:kd_at + KD_SIZE]))
    args = tuple(KernelArg(a.get(".name", ""), a[".offset"], a[".size"], a.get(".value_kind", ""), a.get(".address_space", ""))
                 for a in meta.get(".args", []))
    kernels[name] = KernelInfo(name, kd_at, kd_at + kd.kernel_code_entry_byte_offset, kd, meta.get(".kernarg_segment_size", 0),
                               meta.get(".kernarg_segment_align", 8), args, meta.get(".group_segment_fixed_size", 0),
                               meta.get(".private_segment_fixed_size", 0), meta.get(".wavefront_size", 64), meta.get(".sgpr_count", 0),
                               meta.get(".vgpr_count", 0), meta.get(".agpr_count", 0), meta.get(".max_flat_workgroup_size", 0), meta)
  return CodeObject(_arch_of(e_flags), e_flags, abi_version, metadata.get("amdhsa.target", ""), kernels, tuple(segments),
                    tuple(relocations), image_size, metadata, blob)
