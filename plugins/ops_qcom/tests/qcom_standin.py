"""A stand-in for Qualcomm's OpenCL compiler in tests (the real one exists only on an Adreno device).

`StandInCompiler` renders the kernel with the real renderer (the OpenCL C QCOM would hand the driver) and builds a
program binary with the container structure plugrt_qcom.binary parses, written here from the documented layout
(docs/research/qcom.md), not from the extractor: the shader code is a marker and a key naming the kernel, and the
argument records put each parameter of the OpenCL C (a buffer's base and offset, an image and its offset, then the
scalars) at an offset in the constant file as a compiler would. `PROGRAMS` maps the key to the kernel's IR and that
layout, which the fake KGSL uses to run a dispatch through the reference interpreter and to check what plugrt wrote.
"""
from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

from plugrt.compiler.ir import Kernel
from plugrt.compiler.renderer.opencl import OpenCLRenderer
from plugrt.dtype import ImageDType, dtypes
from plugrt.errors import CompileError
from plugrt.hookspecs import DeviceInfo
from plugrt.runtime import Compiler

MARKER = b"PLUGRT-FAKE-ADRENO-SHADER\0\0\0\0\0\0\0"  # 32 bytes, then the 32-byte key
TEXTURE, UAV, PLAIN = 1, 2, 0


@dataclass
class Layout:
  """Where the stand-in compiler put each parameter in the constant file (byte offsets), and the images' kinds."""
  kernel: Kernel
  bases: list[int]        # per buffer (or image): its base address argument
  offsets: list[int]      # per buffer: its byte-offset argument
  scalars: list[int]
  kinds: list[int]        # per buffer: PLAIN, TEXTURE or UAV
  code_size: int


PROGRAMS: dict[bytes, Layout] = {}


def storage_size(dt) -> int:  # what the OpenCL C parameter of a scalar takes
  return 1 if dt is dtypes.bool else dt.itemsize


def build(kernel: Kernel, name: str, *, samplers: int = 0, consts: tuple[tuple[int, int, int], ...] = (), code_size: int = 384,
          arg_kinds: list[int] | None = None, drop_args: int = 0) -> tuple[bytes, Layout]:
  """A program binary for `kernel` (and its Layout). consts: (value, offset in units, is32) immediate constants;
  arg_kinds / drop_args: to build a binary that disagrees with the kernel (tests of the checks)."""
  sig = kernel.signature
  at, bases, offsets, scalars, kinds, records = 0, [], [], [], [], []
  def place(size: int, kind: int) -> int:
    nonlocal at
    at = -(-at // max(4, size)) * max(4, size)
    off = at
    at += max(4, size)
    records.append((off, kind))
    return off
  for dt, written in zip(sig.buffers, sig.written or (False,) * len(sig.buffers)):
    kind = (UAV if written else TEXTURE) if isinstance(dt, ImageDType) else PLAIN
    kinds.append(kind)
    bases.append(place(8, kind))
    offsets.append(place(8, PLAIN))
  for dt in sig.scalars: scalars.append(place(storage_size(dt), PLAIN))
  if arg_kinds is not None: records = [(off, k) for (off, _), k in zip(records, arg_kinds)]
  if drop_args: records = records[:-drop_args]
  key = hashlib.sha256(f"{name}:{kernel!r}:{len(PROGRAMS)}".encode()).digest()
  code = (MARKER + key).ljust(code_size, b"\0")
  # the container: header words at fixed offsets, then the register block, the shader descriptor with the name,
  # the sampler slots and the argument records, the constant records, and the shader code last
  regs, desc = 0x200, 0x300
  name_b = name.encode()  # no terminator: the argument records may start right after it
  args_at = -(-(desc + 0x158 + len(name_b)) // 4) * 4 + 8 * samplers
  rec = b"".join(struct.pack("<8I", 32, 0, 0, off // 4, 0, 0, 0, kind) for off, kind in records) + bytes(32)
  crec = b"".join(struct.pack("<4I", value, 0, 0, 0) + struct.pack("<3I", units, 0, is32) + bytes(12) for value, units, is32 in consts)
  code_at = -(-(args_at + len(rec) + len(crec)) // 256) * 256
  consts_at = code_at - len(crec)  # the constant records run up to the shader code (the reader stops there)
  blob = bytearray(code_at + len(code))
  struct.pack_into("<I", blob, 0x34, regs)
  struct.pack_into("<I", blob, 0xAC, consts_at)
  struct.pack_into("<I", blob, 0xB0, len(consts))
  struct.pack_into("<I", blob, 0xC0, code_at)
  struct.pack_into("<I", blob, 0x100, len(code))
  struct.pack_into("<I", blob, 0x110, desc)
  struct.pack_into("<II", blob, regs + 0x14, 8, 2)                 # full and half registers
  struct.pack_into("<II", blob, desc + 0xC4, 0, 0)                 # entry offset, private memory
  struct.pack_into("<II", blob, desc + 0xD8, 0, samplers)          # local memory, samplers
  struct.pack_into("<I", blob, desc + 0x108, 2 * 3)                # twice the branch stack
  blob[desc + 0x158:desc + 0x158 + len(name_b)] = name_b
  blob[args_at:args_at + len(rec)] = rec
  blob[consts_at:consts_at + len(crec)] = crec
  blob[code_at:] = code
  layout = Layout(kernel, bases, offsets, scalars, kinds, len(code))
  PROGRAMS[key] = layout
  return bytes(blob), layout


class StandInCompiler(Compiler):
  """QCOM's compiler with the driver replaced: the real OpenCL C, a binary from `build`."""
  name = "CL"
  cache_namespace = ""

  def __init__(self, device: DeviceInfo):
    super().__init__(device)
    self.renderer = OpenCLRenderer("QCOM", fp64=False)
    self.rendered: dict[str, Kernel] = {}

  def render(self, kernel: Kernel) -> str:
    src = self.renderer.render(kernel)
    self.rendered[src] = kernel
    return src

  def toolchain(self) -> tuple[str, ...]: return ("stand-in",)

  def compile_uncached(self, src: str) -> bytes:
    if (kernel := self.rendered.get(src)) is None: raise CompileError("the stand-in compiler builds only kernels it rendered")
    samplers = 1 if "plugrt_smp" in src and any(k == TEXTURE for k in self._kinds(kernel)) else 0
    return build(kernel, kernel.name, samplers=samplers)[0]

  @staticmethod
  def _kinds(kernel: Kernel) -> list[int]:
    sig = kernel.signature
    return [(UAV if w else TEXTURE) if isinstance(dt, ImageDType) else PLAIN for dt, w in zip(sig.buffers, sig.written or (False,) * 99)]
