"""The PYTHON backend's objects: allocator, compiler (IR -> Python source), program.

Memory is a bytearray; every load and store goes through `struct`, so the backend
works for every dtype and checks every index (and that every vector access is aligned). Each operation rounds or wraps its
result to its dtype, which makes this an independent implementation of the IR's
semantics (the conformance suite compares it with the numpy interpreter). Images are plain memory too, in the
layout every backend copies them in and out with: h*w*4 scalars, texel (x, y) at (y*w + x)*4.
"""
from __future__ import annotations

import ctypes
import math
import struct
import sys
from collections.abc import Sequence
from functools import partial
from typing import Any

from plugrt.compiler.ir import BINARY, COMPARE, Kernel, Ops, Signature, UOp
from plugrt.compiler.lowering import serialize_groups
from plugrt.dtype import DType, cast_value, dtypes
from plugrt.errors import CompileError
from plugrt.hookspecs import DeviceInfo
from plugrt.launchargs import PreparedCall, value_packer
from plugrt.runtime import Allocator, Compiler, Program

# ---------------------------------------------------------------- memory

class PythonAllocator(Allocator[memoryview]):
  supports_wrap = True  # its memory is host memory, so it can wrap any host pointer
  supports_images = True  # an image is h*w*4 packed scalars (the IR's layout); TEXEL_LOAD/STORE are rendered below

  def _alloc(self, nbytes: int, options: Any) -> memoryview:
    try: return memoryview(bytearray(nbytes))
    except (MemoryError, OverflowError) as e: raise MemoryError(str(e)) from None
  def _offset(self, handle: memoryview, offset: int, nbytes: int) -> memoryview: return handle[offset:offset + nbytes]
  def _wrap(self, ptr: int, nbytes: int) -> memoryview: return memoryview((ctypes.c_char * nbytes).from_address(ptr)).cast("B")
  def _wrap_image(self, ptr: int, nbytes: int, image: Any) -> memoryview: return self._wrap(ptr, nbytes)  # packed texels in host memory
  def _copyin(self, dest: memoryview, src: memoryview) -> None: dest[:] = src
  def _copyout(self, dest: memoryview, src: memoryview) -> None: dest[:] = src
  def _copy(self, dest: memoryview, src: memoryview, nbytes: int) -> None: dest[:nbytes] = src[:nbytes]
  def dlpack_device(self) -> tuple[int, int]: return (1, 0)  # kDLCPU: it is host memory
  def _pointer(self, handle: memoryview) -> int: return ctypes.addressof(ctypes.c_char.from_buffer(handle)) if len(handle) else 0


# ---------------------------------------------------------------- what generated code calls

class ops:
  """Helpers the generated source calls as `_r.<name>`: rounding, wrapping, safe math."""
  INF, NAN = math.inf, math.nan

  @staticmethod
  def fix(dt: DType) -> str:
    """The helper that brings a Python result back into dtype `dt` ('' when none is needed)."""
    if dt.kind in "iu": return f"_r.wrap_{dt.name}"
    if dt is dtypes.float64 or dt is dtypes.bool: return ""
    return f"_r.round_{dt.name}"

  @staticmethod
  def round_float32(x: float) -> float:
    try: return struct.unpack("<f", struct.pack("<f", x))[0]
    except OverflowError: return math.copysign(math.inf, x)

  @staticmethod
  def round_float16(x: float) -> float:
    try: return struct.unpack("<e", struct.pack("<e", x))[0]
    except OverflowError: return math.copysign(math.inf, x)

  @staticmethod
  def round_bfloat16(x: float) -> float: return ops.bf2f(ops.f2bf(ops.round_float32(x)))

  @staticmethod
  def f2bf(x: float) -> int:
    u = struct.unpack("<I", struct.pack("<f", ops.round_float32(x)))[0]
    if (u & 0x7FFFFFFF) > 0x7F800000: return (u >> 16) | 0x40
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF

  @staticmethod
  def bf2f(b: int) -> float: return struct.unpack("<f", struct.pack("<I", (b & 0xFFFF) << 16))[0]

  @staticmethod
  def fdiv(a: float, b: float) -> float:
    try: return a / b
    except ZeroDivisionError:
      if a != a or a == 0: return math.nan
      return math.copysign(math.inf, a) * math.copysign(1.0, b)

  @staticmethod
  def idiv(a: int, b: int) -> int:
    if b == 0: return 0  # undefined in the IR
    q = abs(a) // abs(b)
    return -q if (a < 0) != (b < 0) else q

  @staticmethod
  def imod(a: int, b: int) -> int: return a - b * ops.idiv(a, b) if b else 0

  @staticmethod
  def exp2(x: float) -> float:
    try: return math.exp2(x)
    except OverflowError: return math.inf

  @staticmethod
  def log2(x: float) -> float:
    if x != x or x < 0: return math.nan
    if x == 0: return -math.inf
    return math.log2(x)

  @staticmethod
  def sin(x: float) -> float: return math.sin(x) if math.isfinite(x) else math.nan

  @staticmethod
  def sqrt(x: float) -> float: return math.sqrt(x) if x >= 0 else (math.nan if x != 0 else x)

  @staticmethod
  def trunc(x: float) -> float: return math.copysign(float(math.trunc(x)), x) if math.isfinite(x) else x  # keeps -0.0 (trunc(-0.5))

  @staticmethod
  def cast(x: Any, dst: DType) -> Any:
    if dst is dtypes.bool: return x != 0
    if dst.kind in "iu":
      if isinstance(x, float): x = math.trunc(x) if math.isfinite(x) else 0
      return cast_value(int(x), dst)
    f = getattr(ops, f"round_{dst.name}", None)
    if f is None: return float(x)
    # float(x) rounds an integer past 2**53 once already: round it to the target's precision first, so that there is
    # one rounding (bfloat16 from an integer goes through float32, as in the interpreter and the CPU backend)
    if isinstance(x, int) and abs(x) >> 53: x = ops.round_int(x, 11 if dst is dtypes.float16 else 24)
    return f(float(x))

  @staticmethod
  def round_int(x: int, bits: int) -> int:
    """`x` rounded to `bits` significant bits, to nearest even."""
    n = abs(x).bit_length() - bits
    if n <= 0: return x
    q, r = divmod(abs(x), 1 << n)
    q += r > (half := 1 << (n - 1)) or (r == half and q & 1)
    return q << n if x > 0 else -(q << n)

  @staticmethod
  def bitcast(x: Any, src: DType, dst: DType) -> Any:
    raw = ops.f2bf(x) if src is dtypes.bfloat16 else x
    out = struct.unpack("<" + dst.fmt, struct.pack("<" + src.fmt, raw))[0]
    return ops.bf2f(out) if dst is dtypes.bfloat16 else out

  @staticmethod
  def load(mem: memoryview, i: int, code: str, size: int, name: str) -> Any:
    if not 0 <= i * size < len(mem): raise IndexError(f"kernel reads element {i} of {name!r}, which has {len(mem) // size} elements")
    return struct.unpack_from(code, mem, i * size)[0]

  @staticmethod
  def store(mem: memoryview, i: int, value: Any, code: str, size: int, name: str) -> None:
    if not 0 <= i * size < len(mem): raise IndexError(f"kernel writes element {i} of {name!r}, which has {len(mem) // size} elements")
    struct.pack_into(code, mem, i * size, value)


  @staticmethod
  def address(mem: memoryview) -> int:
    """Where a buffer's memory starts (vector accesses must be aligned in it, as on a GPU)."""
    return ctypes.addressof(ctypes.c_char.from_buffer(mem)) if len(mem) else 0

  @staticmethod
  def _vector(mem: memoryview, i: int, addr: int, width: int, size: int, name: str, what: str) -> None:
    if i < 0 or (i + width) * size > len(mem):
      raise IndexError(f"kernel {what} elements {i}..{i + width - 1} of {name!r}, which has {len(mem) // size} elements")
    if (addr + i * size) % (width * size):
      raise IndexError(f"kernel {what} {width} elements at element {i} of {name!r}, whose address {addr + i * size:#x} is not a "
                       f"multiple of {width * size} (a vector access must be aligned)")

  @staticmethod
  def vload(mem: memoryview, i: int, addr: int, code: str, width: int, size: int, name: str) -> tuple:
    ops._vector(mem, i, addr, width, size, name, "reads")
    return struct.unpack_from(code, mem, i * size)

  @staticmethod
  def vstore(mem: memoryview, i: int, values: tuple, addr: int, code: str, width: int, size: int, name: str) -> None:
    ops._vector(mem, i, addr, width, size, name, "writes")
    struct.pack_into(code, mem, i * size, *values)

  @staticmethod
  def texel_load(mem: memoryview, x: int, y: int, c: int, h: int, w: int, code: str, size: int) -> Any:
    """Channel c of texel (x, y), the coordinates clamped to the edge (the IR's TEXEL_LOAD)."""
    x, y = min(max(x, 0), w - 1), min(max(y, 0), h - 1)
    return struct.unpack_from(code, mem, ((y * w + x) * 4 + c) * size)[0]

  @staticmethod
  def texel_store(mem: memoryview, x: int, y: int, rgba: tuple, h: int, w: int, code: str, size: int, name: str) -> None:
    if not (0 <= x < w and 0 <= y < h): raise IndexError(f"kernel writes texel (x={x}, y={y}) of {name!r}, a {w}x{h} (width x height) image")
    struct.pack_into(code, mem, (y * w + x) * 4 * size, *rgba)


def _wrapper(dt: DType) -> Any:
  bits, signed = dt.bits, dt.kind == "i"
  mask, half = (1 << bits) - 1, 1 << (bits - 1)
  if signed: return lambda x: ((int(x) + half) & mask) - half
  return lambda x: int(x) & mask


for _dt in dtypes.all():
  if _dt.kind in "iu": setattr(ops, f"wrap_{_dt.name}", staticmethod(_wrapper(_dt)))


# ---------------------------------------------------------------- IR -> Python source

_PY_INFIX = {Ops.ADD: "+", Ops.SUB: "-", Ops.MUL: "*", Ops.AND: "&", Ops.OR: "|", Ops.XOR: "^",
             Ops.CMPLT: "<", Ops.CMPLE: "<=", Ops.CMPEQ: "==", Ops.CMPNE: "!="}


def _literal(x: Any) -> str:
  if isinstance(x, float) and not math.isfinite(x): return "_r.NAN" if x != x else ("-_r.INF" if x < 0 else "_r.INF")
  return repr(x)


def _call(fn: str, expr: str) -> str: return f"{fn}({expr})" if fn else expr


class PythonRenderer:
  """Renders a (group-serialised) kernel as one Python function."""

  def render(self, kernel: Kernel) -> str:
    k = serialize_groups(kernel)
    names = {u: f"v{i}" for i, u in enumerate(k.uops)}
    memname: dict[UOp, str] = {}
    lines = [f"def {k.name}(_bufs, _vals, _ng, _ls, _g0, _g1):"]
    if k.buffers: lines.append(f"  {', '.join(names[b] for b in k.buffers)}, = _bufs")
    if k.scalars: lines.append(f"  {', '.join(names[s] for s in k.scalars)}, = _vals")
    vector_bufs = dict.fromkeys(u.src[0] for u in k.uops if u.op in (Ops.VLOAD, Ops.VSTORE))
    for b in vector_bufs: lines.append(f"  {names[b]}_at = _r.address({names[b]})")
    lines += ["  ng0, ng1, ng2 = _ng", "  ls0, ls1, ls2 = _ls", "  for _g in range(_g0, _g1):",
              "    gid0, gid1, gid2 = _g % ng0, (_g // ng0) % ng1, _g // (ng0 * ng1)"]
    depth = 2
    for u in k.uops:
      op, dt, v = u.op, u.dtype, names[u]
      s = [names[x] for x in u.src]
      pad = "  " * depth
      if op in (Ops.BUFFER, Ops.SCALAR): memname[u] = u.arg[1] if op is Ops.BUFFER else ""
      elif op is Ops.CONST: names[u] = _literal(u.arg)
      elif op is Ops.SPECIAL: names[u] = {"group_id": "gid", "num_groups": "ng", "local_size": "ls"}[u.arg[0]] + str(u.arg[1])
      elif op is Ops.SHARED:
        lines.append(f"{pad}{v} = memoryview(bytearray({u.arg[1] * dt.base.itemsize}))")
        memname[u] = u.arg[0]
      elif op is Ops.SPILL:
        lines.append(f"{pad}{v} = memoryview(bytearray({s[0]} * {dt.base.itemsize}))")
        memname[u] = "spill"
      elif op is Ops.LOAD:
        e = f"_r.load({s[0]}, {s[1]}, {self._code(dt)!r}, {dt.itemsize}, {memname[u.src[0]]!r})"
        lines.append(f"{pad}{v} = {'_r.bf2f(' + e + ')' if dt is dtypes.bfloat16 else e}")
      elif op is Ops.STORE:
        vdt = u.src[2].dtype
        val = f"_r.f2bf({s[2]})" if vdt is dtypes.bfloat16 else s[2]
        lines.append(f"{pad}_r.store({s[0]}, {s[1]}, {val}, {self._code(vdt)!r}, {vdt.itemsize}, {memname[u.src[0]]!r})")
      elif op is Ops.VLOAD:
        code = "<" + str(u.arg) + dt.fmt
        lines.append(f"{pad}{v} = _r.vload({s[0]}, {s[1]}, {s[0]}_at, {code!r}, {u.arg}, {dt.itemsize}, {memname[u.src[0]]!r})")
      elif op is Ops.LANE: lines.append(f"{pad}{v} = {'_r.bf2f(' + s[0] + f'[{u.arg}])' if dt is dtypes.bfloat16 else f'{s[0]}[{u.arg}]'}")
      elif op is Ops.VSTORE:
        vdt, width = u.src[2].dtype, len(u.src) - 2
        vals = ", ".join(f"_r.f2bf({x})" if vdt is dtypes.bfloat16 else x for x in s[2:])
        lines.append(f"{pad}_r.vstore({s[0]}, {s[1]}, ({vals},), {s[0]}_at, {'<' + str(width) + vdt.fmt!r}, {width}, {vdt.itemsize}, "
                     f"{memname[u.src[0]]!r})")
      elif op is Ops.TEXEL_LOAD:
        (h, w), code = u.src[0].dtype.base.shape, self._code(dt)
        lines.append(f"{pad}{v} = _r.texel_load({s[0]}, {s[1]}, {s[2]}, {u.arg}, {h}, {w}, {code!r}, {dt.itemsize})")
      elif op is Ops.TEXEL_STORE:
        img = u.src[0].dtype.base
        (h, w), code = img.shape, "<" + img.base.fmt * 4  # the four channels at once
        lines.append(f"{pad}_r.texel_store({s[0]}, {s[1]}, {s[2]}, ({', '.join(s[3:])}), {h}, {w}, {code!r}, {img.itemsize}, "
                     f"{memname[u.src[0]]!r})")
      elif op in (Ops.VAR, Ops.READ): lines.append(f"{pad}{v} = {s[0]}")
      elif op is Ops.WRITE: lines.append(f"{pad}{s[0]} = {s[1]}")
      elif op is Ops.RANGE:
        lines += [f"{pad}for {v} in range({s[0]}, {s[1]}):", f"{pad}  pass"]
        depth += 1
      elif op is Ops.IF:
        lines += [f"{pad}if {s[0]}:", f"{pad}  pass"]
        depth += 1
      elif op is Ops.ELSE: lines += [f"{'  ' * (depth - 1)}else:", f"{pad}pass"]
      elif op in (Ops.ENDRANGE, Ops.ENDIF): depth -= 1
      elif op is Ops.BARRIER: raise AssertionError("serialize_groups leaves no barriers")
      else: lines.append(f"{pad}{v} = {self._alu(u, s)}")
    return "\n".join(lines) + "\n"

  @staticmethod
  def _code(dt: DType) -> str: return "<" + dt.fmt

  def _alu(self, u: UOp, s: Sequence[str]) -> str:
    op, dt = u.op, u.dtype
    fix = ops.fix(dt)
    if op is Ops.CAST: return f"_r.cast({s[0]}, _dt.{dt.name})"
    if op is Ops.BITCAST: return f"_r.bitcast({s[0]}, _dt.{u.src[0].dtype.name}, _dt.{dt.name})"
    if op is Ops.WHERE: return f"({s[1]} if {s[0]} else {s[2]})"
    if op is Ops.NOT: return f"(not {s[0]})" if dt is dtypes.bool else _call(fix, f"~{s[0]}")
    if op is Ops.NEG: return _call(fix, f"-{s[0]}")
    if op in (Ops.MAX, Ops.MIN): return f"{'max' if op is Ops.MAX else 'min'}({s[0]}, {s[1]})"
    if op is Ops.DIV: return _call(fix, f"_r.fdiv({s[0]}, {s[1]})")
    if op is Ops.IDIV: return _call(fix, f"_r.idiv({s[0]}, {s[1]})")
    if op is Ops.MOD: return _call(fix, f"_r.imod({s[0]}, {s[1]})")
    if op in (Ops.SHL, Ops.SHR): return _call(fix, f"({s[0]} {'<<' if op is Ops.SHL else '>>'} ({s[1]} & {dt.bits - 1}))")
    if op in COMPARE: return f"({s[0]} {_PY_INFIX[op]} {s[1]})"
    if op in BINARY:
      e = f"({s[0]} {_PY_INFIX[op]} {s[1]})"
      return f"bool{e}" if dt is dtypes.bool else _call(fix, e)
    if op is Ops.RECIP: return _call(fix, f"_r.fdiv(1.0, {s[0]})")
    return _call(fix, f"_r.{op.name.lower()}({s[0]})")


class PythonCompiler(Compiler):
  name = "PY"
  cache_namespace = ""  # compiling Python is cheaper than a cache lookup

  def __init__(self, device: DeviceInfo):
    super().__init__(device)
    self.renderer = PythonRenderer()

  def render(self, kernel: Kernel) -> str: return self.renderer.render(kernel)
  def toolchain(self) -> tuple[str, ...]: return (sys.version,)

  def compile_uncached(self, src: str) -> bytes:
    try: compile(src, "<plugrt kernel>", "exec")  # fail now, not at launch
    except SyntaxError as e: raise CompileError(f"kernel source is not valid Python: {e}", src) from None
    return src.encode()


# ---------------------------------------------------------------- programs

class PythonProgram(Program):
  """The rendered kernel as a Python function; a launch calls it on the buffers' numpy arrays (see the core's launch
  protocol, plugrt.runtime.Program)."""
  scalar_packer = staticmethod(value_packer)

  def __init__(self, device: Any, name: str, lib: bytes, signature: Signature):
    super().__init__(device, name, lib, signature)
    ns: dict[str, Any] = {"_r": ops, "_dt": dtypes}
    exec(compile(lib.decode(), f"<plugrt kernel {name}>", "exec"), ns)
    self.fn = ns[name]

  def _encode(self, bufs: tuple, scalars: tuple, gs: tuple[int, int, int], ls: tuple[int, int, int]) -> PreparedCall:
    return PreparedCall(submit=partial(self.fn, [b.handle for b in bufs], list(scalars), gs, ls, 0, gs[0] * gs[1] * gs[2]))


__all__ = ["PythonAllocator", "PythonCompiler", "PythonProgram", "PythonRenderer", "ops"]
