"""PTX renderer tests; none needs a GPU.

- Every conformance kernel and a set of extra kernels (every op x dtype, casts, bitcasts, loops with every index
  dtype, VARs, shared memory of every dtype, barriers, constant corner cases) render and assemble with
  `ptxas -arch=sm_90` (and sm_80 / sm_120 where this ptxas knows them); skipped where ptxas is not on PATH.
- The .entry parameter layout is the documented one; unsupported things raise RenderError.
- The generated PTX runs in `_Machine`, a small PTX interpreter written here (one thread at a time, bar.sync
  honoured, shared memory per group), on the conformance cases, compared with plugrt's reference interpreter the
  way the conformance suite compares a device; and the math helpers (.func) are swept over wide input ranges
  against Python's math module. The interpreter models PTX as the ISA manual describes it, so it checks the
  renderer's logic, not the hardware: the GPU run of the conformance suite remains the final word.
"""
from __future__ import annotations

import functools
import math
import random
import re
import struct
import subprocess
from collections.abc import Callable, Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cuda_tools import toolkit_program

from plugrt.compiler import samples as K
from plugrt.compiler.ir import Kernel, KernelBuilder, Ops
from plugrt.dtype import DType, bf16_to_f32, dtypes, f32_to_bf16
from plugrt.errors import RenderError
from plugrt_nvidia_toolchain.arch import min_ptx_version
from plugrt_nvidia_toolchain.ptx import PTXRenderer
from plugrt_nvidia_toolchain.ptx_math import HELPER_PREFIX, constants, helper_ptx

ALL = K.ALL
INTS = K.INTS
FLOATS = K.FLOATS
TARGETS = (("sm_90", "8.0"), ("sm_80", "7.0"), ("sm_120", "8.7"))


# ---------------------------------------------------------------- extra kernels

def _extra_kernels() -> list[Kernel]:
  ks: list[Kernel] = []
  for dt in ALL:
    # WHERE, VAR/READ/WRITE, a loop carrying a value, loads/stores through shared memory with a barrier
    b = KernelBuilder(f"x_misc_{dt.name}")
    out, a, c, flag = b.buffer("out", dt), b.buffer("a", dt), b.buffer("c", dt), b.buffer("flag", dtypes.bool)
    tile = b.shared("tile", dt, 8)
    lid = b.local_id(0)
    i = b.global_id(0)
    v = b.var(a[i], name="v")
    with b.range(3):
      v.value = flag[i].where(c[i], v.value)
    tile[lid] = v.value
    b.barrier()
    out[i] = tile[7 - lid]
    ks.append(b.finish())
    # constants: special values and extremes
    b = KernelBuilder(f"x_const_{dt.name}")
    out = b.buffer("out", dt)
    if dt.kind == "f": vals: list[Any] = [0.0, -0.0, 1.5, math.inf, -math.inf, math.nan, 65504.0 if dt is dtypes.float16 else 3.0e38]
    elif dt.kind == "b": vals = [True, False]
    else: vals = [0, 1, int(dt.min), int(dt.max)]
    for k, x in enumerate(vals): out[k] = b.const(x, dt)
    ks.append(b.finish())
  for idt in INTS:
    # a loop whose index has this dtype, indices of this dtype for global and shared memory, shifts and
    # divisions by constants (0, -1, in-range and out-of-range shift amounts)
    b = KernelBuilder(f"x_index_{idt.name}")
    out, x = b.buffer("out", dtypes.int32), b.buffer("x", idt)
    sh = b.shared("sh", dtypes.int64, 4)
    acc = b.var(0, dtypes.int32)
    with b.range(b.const(1, idt), b.const(4, idt)) as j:
      sh[j] = x[j].cast(dtypes.int64)
      acc.value = acc.value + sh[j].cast(dtypes.int32)
    out[b.const(0, idt)] = acc.value
    xs = x[b.const(2, idt)]
    consts = [0, 3, 5, idt.bits - 1, idt.bits + 1] if idt.bits + 1 <= idt.max else [0, 3, 5, idt.bits - 1]
    k = 1
    for c in consts:
      out[k] = b.alu(Ops.SHL, xs, b.const(c, idt)).cast(dtypes.int32); k += 1
      out[k] = b.alu(Ops.SHR, xs, b.const(c, idt)).cast(dtypes.int32); k += 1
      out[k] = b.alu(Ops.IDIV, xs, b.const(c, idt)).cast(dtypes.int32); k += 1
      out[k] = b.alu(Ops.MOD, xs, b.const(c, idt)).cast(dtypes.int32); k += 1
    if idt.kind == "i":
      out[k] = b.alu(Ops.IDIV, xs, b.const(-1, idt)).cast(dtypes.int32); k += 1
      out[k] = b.alu(Ops.MOD, xs, b.const(-1, idt)).cast(dtypes.int32); k += 1
    ks.append(b.finish())
  # every special register on every axis, nested IF/ELSE, bool logic, no parameters at all
  b = KernelBuilder("x_specials")
  out = b.buffer("out", dtypes.int32)
  gx, gy, gz = (b.global_id(a) for a in range(3))
  me = ((gz * b.num_groups(1) * b.local_size(1) + gy) * b.num_groups(0) * b.local_size(0) + gx) * 3  # where only this thread writes
  tot = b.var(0, dtypes.int32)
  for axis in range(3):
    for kind in ("group_id", "local_id", "num_groups", "local_size"):
      tot.value = tot.value * 3 + b.special(kind, axis)
  t = tot.value
  p, q = t > 5, (t % 2).eq(0)
  with b.if_((p & ~q) | (p ^ q)):
    with b.if_(p.eq(q)): out[me] = t
    with b.else_(): out[me + 1] = t
  with b.else_():
    with b.if_(b.alu(Ops.CMPLT, p, q) | b.alu(Ops.CMPLE, q, p)): out[me + 2] = t
  ks.append(b.finish())
  for dt in FLOATS:  # compares and != 0 with NaN, inf and -0 operands
    b = KernelBuilder(f"x_nan_{dt.name}")
    cmp, a, c = b.buffer("cmp", dtypes.bool), b.buffer("a", dt), b.buffer("c", dt)
    i = b.global_id(0)
    for k, op in enumerate((Ops.CMPLT, Ops.CMPLE, Ops.CMPEQ, Ops.CMPNE)): cmp[i * 5 + k] = b.alu(op, a[i], c[i])
    cmp[i * 5 + 4] = a[i].cast(dtypes.bool)
    ks.append(b.finish())
  for dt in INTS:  # division by runtime divisors 0 and -1, MIN as the dividend
    b = KernelBuilder(f"x_divmod_{dt.name}")
    q, r, a, c = b.buffer("q", dt), b.buffer("r", dt), b.buffer("a", dt), b.buffer("c", dt)
    i = b.global_id(0)
    q[i], r[i] = a[i] // c[i], a[i] % c[i]
    ks.append(b.finish())
  b = KernelBuilder("x_f64_to_half")  # float64 -> float16 rounds once (through float32 it would round twice)
  o, a = b.buffer("o", dtypes.float16), b.buffer("a", dtypes.float64)
  o[b.global_id(0)] = a[b.global_id(0)].cast(dtypes.float16)
  ks.append(b.finish())
  b = KernelBuilder("x_empty")
  b.barrier()
  ks.append(b.finish())
  return ks


@functools.cache
def _all_kernels() -> tuple[Kernel, ...]:
  return tuple(c.kernel for c in K.all_cases()) + tuple(_extra_kernels())


# ---------------------------------------------------------------- assembling with ptxas

def _ptxas() -> str:
  exe = toolkit_program("ptxas")
  if exe is None: pytest.skip("ptxas is not installed (pip install nvidia-cuda-nvcc, see requirements-test.txt)")
  return exe


def _assemble(text: str, arch: str, tmp: Path, name: str) -> None:
  path = tmp / f"{name}.ptx"
  path.write_text(text)
  r = subprocess.run([_ptxas(), f"-arch={arch}", "-o", "/dev/null", str(path)], capture_output=True, text=True)
  assert r.returncode == 0, f"ptxas -arch={arch} rejected {name}:\n{r.stderr[:4000]}"


@pytest.mark.parametrize("arch,version", TARGETS, ids=[t[0] for t in TARGETS])
def test_everything_assembles(arch: str, version: str, tmp_path: Path) -> None:
  """All kernels in one module (one .entry each) per target: one ptxas call."""
  _ptxas()
  path = tmp_path / "probe.ptx"
  path.write_text(f".version {version}\n.target {arch}\n.address_size 64\n.visible .entry k()\n{{\n\tret;\n}}\n")
  if subprocess.run([_ptxas(), f"-arch={arch}", "-o", "/dev/null", str(path)], capture_output=True).returncode != 0:
    pytest.skip(f"this ptxas does not know {arch} with PTX {version}")
  _assemble(PTXRenderer(arch, version).render_many(_all_kernels()), arch, tmp_path, f"all_{arch}")


@pytest.mark.parametrize("dt", FLOATS, ids=lambda d: d.name)
def test_single_kernel_modules_assemble(dt: DType, tmp_path: Path) -> None:
  """render() alone: a module holds exactly the helpers (and table) its kernel needs."""
  _ptxas()
  _assemble(PTXRenderer().render(K.ops_case(dt).kernel), "sm_90", tmp_path, dt.name)


def test_newest_ptx_version_assembles(tmp_path: Path) -> None:
  _ptxas()
  _assemble(PTXRenderer("sm_90", "8.7").render(K.ops_case(dtypes.float64).kernel), "sm_90", tmp_path, "v87")


# ---------------------------------------------------------------- module shape and parameters

def _entry_params(text: str, name: str) -> list[tuple[str, str]]:
  m = re.search(rf"\.visible \.entry {name}\((.*?)\)\s*\{{", text, re.S)
  assert m is not None, text
  return [tuple(p.split()[1:3]) for p in m[1].split(",") if p.strip()]  # (".u64", "buf0_out")


def test_parameter_layout() -> None:
  b = KernelBuilder("layout")
  scalars = {dt: b.scalar(f"s_{dt.name}", dt) for dt in ALL}
  bufs = [b.buffer(f"b{k}", dt) for k, dt in enumerate((dtypes.float16, dtypes.bool, dtypes.int64))]
  i = b.global_id(0)
  bufs[2][i] = scalars[dtypes.int64] + scalars[dtypes.int8].cast(dtypes.int64)
  text = PTXRenderer().render(b.finish())
  want_scalar = {dtypes.bool: ".u8", dtypes.int8: ".s8", dtypes.int16: ".s16", dtypes.int32: ".s32", dtypes.int64: ".s64",
                 dtypes.uint8: ".u8", dtypes.uint16: ".u16", dtypes.uint32: ".u32", dtypes.uint64: ".u64",
                 dtypes.float16: ".b16", dtypes.bfloat16: ".b16", dtypes.float32: ".f32", dtypes.float64: ".f64"}
  want = [(".u64", f"buf{k}_b{k}") for k in range(3)] + [(want_scalar[dt], f"arg{k}_s_{dt.name}") for k, dt in enumerate(ALL)]
  assert _entry_params(text, "layout") == want
  assert text.splitlines()[1:4] == [".version 8.0", ".target sm_90", ".address_size 64"]
  assert ".ftz" not in text


def test_no_ftz_and_no_contraction() -> None:
  text = PTXRenderer().render_many([K.ops_case(dt).kernel for dt in FLOATS])
  assert ".ftz" not in text
  for line in text.splitlines():  # every float add/sub/mul carries .rn, which ptxas never fuses into an fma
    m = re.match(r"\s*(add|sub|mul)\.(f16|f32|f64)\b", line.strip())
    assert m is None, line


def test_min_ptx_version() -> None:
  assert min_ptx_version("sm_90") == "7.8" and min_ptx_version("sm_90a") == "8.0" and min_ptx_version("sm_120") == "8.7"
  assert min_ptx_version("sm_80") == "7.0"


# ---------------------------------------------------------------- RenderError cases

def test_render_errors() -> None:
  from plugrt.compiler.lowering import serialize_groups
  lowered = serialize_groups(K.reduce_case().kernel)
  if any(u.op is Ops.SPILL for u in lowered.uops):
    with pytest.raises(RenderError, match="SPILL"): PTXRenderer().render(lowered)
  b = KernelBuilder("bf")
  o = b.buffer("o", dtypes.bfloat16)
  o[0] = o[1] + o[2]
  bf = b.finish()
  with pytest.raises(RenderError, match=r"bfloat16.*sm_80"): PTXRenderer("sm_75", "7.0").render(bf)
  PTXRenderer("sm_80", "7.0").render(bf)
  b = KernelBuilder("big_shared")
  sh = b.shared("sh", dtypes.float64, 7000)
  sh[0] = 1.0
  with pytest.raises(RenderError, match="shared memory"): PTXRenderer().render(b.finish())
  with pytest.raises(RenderError, match="sm_XY"): PTXRenderer("compute_90")
  with pytest.raises(RenderError, match=r"X\.Y"): PTXRenderer("sm_90", "8")
  with pytest.raises(RenderError, match=r"8\.7"): PTXRenderer("sm_120", "8.0")
  with pytest.raises(RenderError, match=r"7\.8"): PTXRenderer("sm_90", "7.0")
  with pytest.raises(RenderError, match="PTX entry name"): PTXRenderer().render(KernelBuilder("_").finish())
  with pytest.raises(RenderError, match="repeat"): PTXRenderer().render_many([K.tiny_kernel(), K.tiny_kernel()])


# ---------------------------------------------------------------- a PTX interpreter for the renderer's output

def _b2f(v: int, w: int) -> float:
  if w == 16: return float(np.array([v & 0xFFFF], np.uint16).view(np.float16)[0])
  fmt = ("<I", "<f") if w == 32 else ("<Q", "<d")
  return struct.unpack(fmt[1], struct.pack(fmt[0], v & ((1 << w) - 1)))[0]


def _f2b(x: float, w: int) -> int:
  if w == 16: return int(np.array([x], np.float16).view(np.uint16)[0])
  fmt = ("<I", "<f") if w == 32 else ("<Q", "<d")
  return struct.unpack(fmt[0], struct.pack(fmt[1], x))[0]


def _round_fraction(x: Fraction, w: int) -> float:
  """x correctly rounded to binary32/binary64 (nearest even, subnormals, overflow to inf)."""
  p, emin, emax = (24, -126, 127) if w == 32 else (53, -1022, 1023)
  if x == 0: return 0.0
  a = abs(x)
  e = a.numerator.bit_length() - a.denominator.bit_length()
  if Fraction(2) ** e > a: e -= 1
  e = max(e, emin)
  q = a / Fraction(2) ** (e - p + 1)
  n, rem = divmod(q.numerator, q.denominator)
  if 2 * rem > q.denominator or (2 * rem == q.denominator and n & 1): n += 1
  v = math.inf if e - p + n.bit_length() > emax else math.ldexp(n, e - p + 1)
  return -v if x < 0 else v


def _wrap(v: int, ty: str) -> int:
  w = int(ty[1:])
  v &= (1 << w) - 1
  return v - (1 << w) if ty[0] == "s" and v >> (w - 1) else v


def _bf16_round(x: float) -> int:
  """float32 value -> bfloat16 bits, nearest even (what cvt.rn.bf16.f32 does; its NaN is some NaN)."""
  return int(f32_to_bf16(np.float32(x)))


def _fval(raw: int, ty: str) -> float:
  if ty == "bf16": return float(bf16_to_f32(np.uint16(raw & 0xFFFF)))
  return _b2f(raw, 16 if ty == "f16" else int(ty[1:]))


def _fbits(x: float, ty: str) -> int:
  if ty == "bf16": return _bf16_round(x)
  return _f2b(x, 16 if ty == "f16" else int(ty[1:]))


def _fround(x: float, ty: str) -> float:
  """x (a float64) rounded to the float type ty."""
  if ty == "f64": return x
  if ty == "f32": return float(np.float32(x))
  with np.errstate(over="ignore"):
    if ty == "f16": return float(np.float16(x))
  return float(bf16_to_f32(f32_to_bf16(np.float32(x))))


def _fma(a: float, b: float, c: float, ty: str) -> float:
  if not (math.isfinite(a) and math.isfinite(b) and math.isfinite(c)):
    with np.errstate(all="ignore"): return float(np.float64(a) * np.float64(b) + np.float64(c))
  exact = Fraction(a) * Fraction(b) + Fraction(c)
  if exact == 0:  # the sign of an exact zero: -0 only when both the product and c are -0
    return -0.0 if math.copysign(1, a) * math.copysign(1, b) < 0 and math.copysign(1, c) < 0 else 0.0
  return _round_fraction(exact, int(ty[1:]))


def _f2i(x: float, ty: str, mode: str) -> int:
  w = int(ty[1:])
  lo, hi = (0, (1 << w) - 1) if ty[0] == "u" else (-(1 << (w - 1)), (1 << (w - 1)) - 1)
  if math.isnan(x): return 0
  if math.isinf(x): return hi if x > 0 else lo
  return min(max(math.trunc(x) if mode == "rzi" else round(x), lo), hi)


class _Func:
  """One .entry or .func: its parameters, instructions (pre-split) and labels."""
  def __init__(self, text: str):
    head, body = text.split("{", 1)
    m = re.search(r"\.(?:entry|func)\s*(?:\(\.param \.\w+ (\w+)\)\s*)?(\w+)\((.*)\)", head, re.S)
    assert m is not None, head
    self.ret, self.name = m[1], m[2]
    self.params = [(p.split()[1][1:], p.split()[2]) for p in m[3].split(",") if p.strip()]
    self.code: list[tuple[str | None, bool, list[str], list[str]]] = []
    self.labels: dict[str, int] = {}
    self.shared: dict[str, int] = {}
    for raw in body.rsplit("}", 1)[0].splitlines():
      ln = raw.strip().rstrip(";").strip()
      if not ln or ln.startswith(".reg") or ln in ("{", "}") or ln.startswith(".param"): continue
      if ln.startswith(".shared"):
        sm = re.match(r"\.shared \.align \d+ \.b8 (\w+)\[(\d+)\]", ln)
        self.shared[sm[1]] = int(sm[2])
        continue
      if ln.endswith(":"): self.labels[ln[:-1]] = len(self.code); continue
      pm = re.match(r"^(?:@(!?)(%\w+)\s+)?([\w.]+)\s*(.*)$", ln)
      ops = [o.strip() for o in re.split(r",(?![^({\[]*[)}\]])", pm[4])] if pm[4] else []
      self.code.append((pm[2], pm[1] == "!", pm[3].split("."), ops))


class _Machine:
  """Runs a PTX module's entries and helper functions, one thread at a time, on numpy buffers."""
  GLOBAL_BASE = 1 << 40  # buffer i lives at GLOBAL_BASE * (i + 1): addresses tell the buffer apart

  def __init__(self, text: str):
    self.consts = {m[1]: [int(w, 16) for w in m[3].split(",")] for m in re.finditer(r"\.const \.align 8 \.u64 (\w+)\[(\d+)\] = \{(.*?)\};", text)}
    self.funcs: dict[str, _Func] = {}
    for m in re.finditer(r"^\.(?:visible \.entry|func) .*?^\}", text, re.S | re.M):
      fn = _Func(m[0])
      self.funcs[fn.name] = fn
    self.global_mem: dict[int, bytearray] = {}
    self.steps = 0

  # memory: (bytearray, offset) of an address
  def _mem(self, space: str, addr: int, ctx: dict) -> tuple[bytearray, int]:
    if space == "shared": return ctx["shared"], addr
    if space == "const":
      sym, off = ctx["symaddr"][addr >> 32], addr & 0xFFFFFFFF
      return ctx["constmem"][sym], off
    base = addr // self.GLOBAL_BASE * self.GLOBAL_BASE
    buf = self.global_mem[base]
    off = addr - base
    assert 0 <= off < len(buf), f"global access out of bounds: {off} of {len(buf)}"
    return buf, off

  def call(self, name: str, x: float) -> float:
    """Run a helper .func on one float."""
    fn = self.funcs[name]
    ty = fn.params[0][0]
    w = int(ty[1:])
    frame = {"arg": _f2b(x, w)}
    for _ in self.run(fn, frame, self._ctx()): pass
    return _b2f(frame["ret"], w)

  def _ctx(self, special: dict[str, int] | None = None, shared: bytearray | None = None) -> dict:
    constmem = {k: bytearray(b"".join(struct.pack("<Q", w) for w in v)) for k, v in self.consts.items()}
    return {"special": special or {}, "shared": shared, "constmem": constmem, "symaddr": {}, "shared_syms": {}}

  def launch(self, name: str, buffers: list[np.ndarray], scalars: list[tuple[str, Any]], gs: tuple[int, ...], ls: tuple[int, ...]) -> None:
    fn = self.funcs[name]
    self.global_mem = {}
    params: dict[str, int] = {}
    pnames = [p[1] for p in fn.params]
    for k, arr in enumerate(buffers):
      base = self.GLOBAL_BASE * (k + 1)
      self.global_mem[base] = bytearray(arr.tobytes())
      params[pnames[k]] = base
    for (_, pname), (_, raw) in zip(fn.params[len(buffers):], scalars): params[pname] = raw
    for gz in range(gs[2]):
      for gy in range(gs[1]):
        for gx in range(gs[0]):
          shared = bytearray(sum(fn.shared.values()) + 64 * len(fn.shared))
          threads = []
          for tz in range(ls[2]):
            for ty_ in range(ls[1]):
              for tx in range(ls[0]):
                sp = {"%ctaid": (gx, gy, gz), "%tid": (tx, ty_, tz), "%nctaid": gs, "%ntid": ls}
                threads.append(self.run(fn, dict(params), self._ctx(sp, shared)))
          live = threads
          while live:  # run every thread to its next bar.sync (or its end), then release the barrier
            live = [t for t in live if next(t, StopIteration) is not StopIteration]
    for k, arr in enumerate(buffers):
      arr[:] = np.frombuffer(bytes(self.global_mem[self.GLOBAL_BASE * (k + 1)]), dtype=arr.dtype)

  def run(self, fn: _Func, frame: dict[str, int], ctx: dict) -> Iterator[None]:
    """Execute fn; frame holds its .param values by name (and receives `ret`). Yields at each bar.sync."""
    regs: dict[str, int] = {}
    carry, pc = 0, 0
    if fn.shared and not ctx["shared_syms"]:
      off = 0
      for sym, size in fn.shared.items():
        ctx["shared_syms"][sym] = off
        off += (size + 63) // 64 * 64
    while pc < len(fn.code):
      self.steps += 1
      pred, neg, parts, ops = fn.code[pc]
      pc += 1
      if pred is not None and bool(regs[pred]) == neg: continue
      base, ty = parts[0], parts[-1]
      if base == "ret": return
      if base == "bra": pc = fn.labels[ops[0]]; continue
      if base == "bar": yield; continue
      if base == "call":
        ret, fname, arg = (o.strip("()") for o in ops)
        callee = self.funcs[fname]
        sub = {callee.params[0][1]: frame[arg]}
        yield from self.run(callee, sub, ctx)
        frame[ret] = sub[callee.ret]
        continue
      if base in ("ld", "st") and parts[1] == "param":
        w = 16 if ty in ("f16", "bf16") else int(ty[1:])
        if base == "st": frame[ops[0].strip("[]")] = regs[ops[1]] & ((1 << w) - 1)
        else:
          v = frame[ops[1].strip("[]")] & ((1 << w) - 1)
          regs[ops[0]] = _wrap(v, ty) if ty[0] == "s" else v
        continue
      if base in ("ld", "st"):
        space = parts[1]
        addr_op = ops[1] if base == "ld" else ops[0]
        reg, off = (addr_op.strip("[]").split("+") + ["0"])[:2]
        addr = (regs[reg] if reg in regs else ctx["shared_syms"][reg]) + int(off)
        mem, o = self._mem(space, addr, ctx)
        nbytes = int(ty[1:]) // 8
        # ld/st.v2/.v4: one register per element, {%a, %b, ...}; the address must be aligned to the whole vector
        names = (ops[0] if base == "ld" else ops[1]).strip("{}").split(",")
        if len(names) > 1: assert addr % (nbytes * len(names)) == 0, f"{base}.v{len(names)} at {addr:#x} is not aligned to {nbytes * len(names)}"
        for j, name in enumerate(n.strip() for n in names):
          at = o + j * nbytes
          assert at + nbytes <= len(mem), f"{space} access out of bounds: {at} of {len(mem)}"
          if base == "ld":
            v = int.from_bytes(mem[at:at + nbytes], "little")
            regs[name] = _wrap(v, ty) if ty[0] == "s" else v
          else: mem[at:at + nbytes] = (regs[name] & ((1 << (8 * nbytes)) - 1)).to_bytes(nbytes, "little")
        continue
      if base == "mov" and len(ops) == 2:
        src = ops[1]
        if src in self.consts:  # a .const symbol: a fake address whose high half names it
          key = len(ctx["symaddr"]) + 1
          ctx["symaddr"][key] = src
          regs[ops[0]] = key << 32
          continue
        if src in fn.shared: regs[ops[0]] = ctx["shared_syms"][src]; continue
        sm = re.match(r"(%ctaid|%tid|%nctaid|%ntid)\.([xyz])$", src)
        if sm: regs[ops[0]] = ctx["special"][sm[1]]["xyz".index(sm[2])]; continue
      regs[ops[0]], carry = self._alu(parts, ops, regs, carry)

  def _read(self, o: str, t: str, regs: dict[str, int]) -> Any:
    if t == "pred": return bool(regs[o]) if o in regs else o == "1"
    if o in regs: raw = regs[o]
    elif o[:2] in ("0f", "0d"): raw = int(o[2:], 16)
    else:
      n = int(o, 0)
      if t[0] == "f" or t == "bf16": return float(n)
      return _wrap(n, "u" + t[1:] if t[0] == "b" else t)
    if t[0] == "f" or t == "bf16": return _fval(raw, t)
    return _wrap(raw, "u" + t[1:] if t[0] == "b" else t)

  def _alu(self, parts: list[str], ops: list[str], regs: dict[str, int], carry: int) -> tuple[int, int]:
    base, ty, mods = parts[0], parts[-1], parts[1:-1]
    if base == "cvt": src_tys, dst_ty = [parts[-1]], parts[-2]
    elif base == "cvta": src_tys, dst_ty = [ty], ty
    elif base == "selp": src_tys, dst_ty = [ty, ty, "pred"], ty
    elif base == "setp": src_tys, dst_ty = [ty, ty], "pred"
    elif base in ("shl", "shr"): src_tys, dst_ty = [ty, "u32"], ty
    elif base == "mul" and "wide" in mods: src_tys, dst_ty = [ty, ty], f"u{2 * int(ty[1:])}"
    else: src_tys, dst_ty = [ty] * (len(ops) - 1), ty
    a = [self._read(o, t, regs) for o, t in zip(ops[1:], src_tys)]
    res, carry = _exec(base, mods, ty, a, carry, parts)
    if dst_ty == "pred": return int(bool(res)), carry
    if dst_ty[0] == "f" or dst_ty == "bf16": return _fbits(res, dst_ty), carry
    return int(res) & ((1 << int(dst_ty[1:])) - 1), carry


def _exec(base: str, mods: list[str], ty: str, a: list[Any], carry: int, parts: list[str]) -> tuple[Any, int]:
  if ty == "pred":
    if base in ("mov",): return a[0], carry
    if base == "not": return not a[0], carry
    return {"and": a[0] and a[1], "or": a[0] or a[1], "xor": a[0] != a[1]}[base], carry
  if base == "setp":
    x, y, cmp = a[0], a[1], mods[0]
    if cmp == "nan": return math.isnan(x) or math.isnan(y), carry
    if cmp == "neu": return not x == y, carry
    if cmp == "ne" and isinstance(x, float): return x != y and not math.isnan(x) and not math.isnan(y), carry  # ordered
    return {"lt": x < y, "le": x <= y, "gt": x > y, "ge": x >= y, "eq": x == y, "ne": x != y}[cmp], carry
  if base == "selp": return (a[0] if a[2] else a[1]), carry
  if base == "cvta": return a[0], carry
  if base == "cvt":
    dst, src = parts[-2], parts[-1]
    rnd = next((m for m in mods if m in ("rn", "rni", "rzi")), None)
    if src[0] == "f" or src == "bf16":
      x = a[0]
      if dst[0] == "f" or dst == "bf16":
        if rnd == "rni" and math.isfinite(x): return math.copysign(float(round(x)), x), carry
        if rnd == "rzi" and math.isfinite(x): return math.copysign(float(math.trunc(x)), x), carry
        if dst == "f16" and src == "f64":
          with np.errstate(over="ignore"): return float(np.float16(np.float64(x))), carry  # one rounding, as numpy
        return _fround(x, dst), carry
      return _f2i(x, dst, rnd or "rzi"), carry
    if dst[0] == "f" or dst == "bf16":
      if dst == "bf16": return float(bf16_to_f32(f32_to_bf16(np.float32(_round_fraction(Fraction(a[0]), 32))))), carry
      return _round_fraction(Fraction(a[0]), 16 if dst == "f16" else int(dst[1:])) if dst != "f16" else float(np.float16(a[0])), carry
    return _wrap(a[0], dst), carry
  if ty[0] == "f" or ty == "bf16":
    x = a
    with np.errstate(all="ignore"):
      if base == "mov": return x[0], carry
      if base == "abs": return abs(x[0]), carry
      if base == "neg": return -x[0], carry
      if base == "fma": return _fma(x[0], x[1], x[2], ty), carry
      if base == "ex2": return float(np.float32(np.exp2(np.float64(x[0])))), carry  # the ISA promises 2 ulp; modelled as exact
      if base in ("max", "min"):
        if math.isnan(x[0]) or math.isnan(x[1]): return (x[1] if math.isnan(x[0]) else x[0]), carry
        return (max if base == "max" else min)(x[0], x[1]), carry
      f = {"f16": np.float16, "f32": np.float32, "f64": np.float64}[ty]
      if base == "sqrt": return float(np.sqrt(f(x[0]))), carry
      if base == "rcp": return float(f(1.0) / f(x[0])), carry
      return float({"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}[base](f(x[0]), f(x[1]))), carry
  w = int(ty[1:])
  mask = (1 << w) - 1
  x = a
  if base == "mov": return x[0], carry
  if base == "add":
    s = (x[0] & mask) + (x[1] & mask)
    return s, (s >> w if "cc" in mods else carry)
  if base == "addc": return (x[0] & mask) + (x[1] & mask) + carry, carry
  if base == "sub": return x[0] - x[1], carry
  if base == "neg": return -x[0], carry
  if base == "not": return ~x[0], carry
  if base == "mul":
    if "hi" in mods: return (x[0] * x[1]) >> w, carry
    return x[0] * x[1], carry
  if base == "mad": return x[0] * x[1] + x[2], carry
  if base in ("div", "rem"):
    assert x[1] != 0, "division by zero reached the hardware instruction"
    assert not (ty[0] == "s" and x[1] == -1 and x[0] == -(1 << (w - 1))), "MIN / -1 reached the hardware instruction (unspecified)"
    q = abs(x[0]) // abs(x[1]) * (1 if (x[0] < 0) == (x[1] < 0) else -1)
    return (q if base == "div" else x[0] - q * x[1]), carry
  if base in ("max", "min"): return (max if base == "max" else min)(x[0], x[1]), carry
  if base in ("and", "or", "xor"): return {"and": x[0] & x[1], "or": x[0] | x[1], "xor": x[0] ^ x[1]}[base], carry
  if base == "shl": return (x[0] & mask) << min(x[1], w), carry
  if base == "shr": return (x[0] >> min(x[1], w)) if ty[0] == "s" else ((x[0] & mask) >> min(x[1], w)), carry
  raise NotImplementedError(f"the test's PTX interpreter has no {'.'.join(parts)}")


def _scalar_raw(dt: DType, v: Any) -> int:
  """A scalar argument's bits as the host passes them (see the renderer's docstring)."""
  if dt is dtypes.bool: return int(bool(v))
  if dt.kind in "iu": return int(v) & ((1 << dt.bits) - 1)
  if dt is dtypes.bfloat16: return int(f32_to_bf16(np.float32(v)))
  return _f2b(float(v), dt.bits)


def _run_emulated(case: K.Case) -> None:
  """K.run_case with the PTX interpreter as the device."""
  from plugrt.compiler import interpreter
  sig = case.kernel.signature
  m = _Machine(PTXRenderer().render(case.kernel))
  got = [np.ascontiguousarray(a).copy() for a in case.inputs]
  scalars = [(dt, _scalar_raw(dt, v)) for dt, v in zip(sig.scalars, case.vals)]
  m.launch(case.kernel.name, got, scalars, case.global_size, case.local_size)
  want = [a.copy() for a in case.inputs]
  interpreter.run(case.kernel, want, case.vals, case.global_size, case.local_size)
  for i, (g, w, dt, written) in enumerate(zip(got, want, sig.buffers, sig.written)):
    if not written: continue
    for start, stop, nulps, atol in case.ulps.get(i, [(0, len(w), 0, 0.0)]):
      K.compare(f"{case.name}: buffer {case.kernel.buffers[i].arg[1]}[{start}:{stop}]", g[start:stop], w[start:stop], dt, nulps, atol)


@pytest.mark.parametrize("case", K.all_cases(), ids=lambda c: c.name)
def test_conformance_cases_in_ptx_interpreter(case: K.Case) -> None:
  _run_emulated(case)


def _extra_cases() -> list[K.Case]:
  """The extra kernels as cases with inputs: index dtypes, shifts/divisions by constants, shared memory of each dtype,
  NaN compares, division by 0 and -1, float64 -> float16 double-rounding traps."""
  rng = np.random.default_rng(7)
  cases = []
  for k in _extra_kernels():
    sig = k.signature
    if k.name.startswith("x_misc_"):
      dt = sig.buffers[0]
      inputs = [np.zeros(16, dt.numpy), K.values(dt, 16, rng), K.values(dt, 16, rng), rng.random(16) < 0.5]
      case = K.Case(k.name, k, inputs, (), (2, 1, 1), (8, 1, 1))
    elif k.name.startswith("x_index_"):
      inputs = [np.zeros(40, np.int32), K.values(sig.buffers[1], 8, rng)]
      case = K.Case(k.name, k, inputs)
    elif k.name == "x_specials":
      case = K.Case(k.name, k, [np.full(72, -1, np.int32)], (), (2, 3, 1), (1, 2, 2))
    elif k.name.startswith("x_nan_"):
      dt = sig.buffers[1]
      sp = [math.nan, math.inf, -math.inf, 0.0, -0.0, 1.0, -2.5]
      av, cv = [x for x in sp for _ in sp], [y for _ in sp for y in sp]
      ins = [f32_to_bf16(np.array(v, np.float32)) if dt is dtypes.bfloat16 else np.array(v, dt.numpy) for v in (av, cv)]
      case = K.Case(k.name, k, [np.zeros(5 * len(av), np.bool_), *ins], (), (len(av), 1, 1))
    elif k.name.startswith("x_divmod_"):
      dt = sig.buffers[0]
      m1 = -1 if dt.kind == "i" else 1
      av = [int(dt.min), int(dt.min), int(dt.max), 7, -7 if dt.kind == "i" else 7, 0, int(dt.min), 5, 7, int(dt.max)]
      cv = [m1, 0, 0, 2, 2, 0, 3, int(dt.max), m1, m1]
      n = len(av)
      case = K.Case(k.name, k, [np.zeros(n, dt.numpy), np.zeros(n, dt.numpy), np.array(av, dt.numpy), np.array(cv, dt.numpy)],
                    (), (n, 1, 1))
    elif k.name == "x_f64_to_half":
      av = np.array([1 + 2.0 ** -11 + 2.0 ** -40, -(1 + 2.0 ** -11 + 2.0 ** -40), 65519.99, 65520.0, 2.0 ** -25 + 2.0 ** -60, 1e-30])
      case = K.Case(k.name, k, [np.zeros(6, np.float16), av], (), (6, 1, 1))
    elif k.name.startswith("x_const_"):
      case = K.Case(k.name, k, [np.zeros(8, sig.buffers[0].numpy)])
    else:
      case = K.Case(k.name, k, [], (), (2, 1, 1), (4, 1, 1))
    cases.append(case)
  return cases


def test_extra_cases_in_ptx_interpreter() -> None:
  for case in _extra_cases(): _run_emulated(case)


# ---------------------------------------------------------------- the math helpers, swept

@functools.cache
def _helpers() -> _Machine:
  table = ", ".join(f"0x{w:016X}" for w in constants().table)
  text = f".const .align 8 .u64 {HELPER_PREFIX}two_over_pi[{len(constants().table)}] = {{{table}}};\n"
  return _Machine(text + "\n".join(helper_ptx(n) for n in ("sin_f64", "sin_f32", "log2_f32", "log2_f64", "exp2_f64")))


def _ulps(got: float, want: float, bits: int) -> float:
  if math.isnan(want): return 0.0 if math.isnan(got) else math.inf
  if math.isinf(want) or math.isinf(got): return 0.0 if got == want else math.inf
  if bits == 64: return abs(got - want) / (math.ulp(want) if want else 5e-324)
  return abs(got - want) / float(np.spacing(np.float32(abs(want)))) if want else abs(got) / 1.4e-45


def _sweep(name: str, ref: Callable[[float], float], gen: Callable[[random.Random], float], bits: int, n: int, limit: float = 1.0) -> None:
  m, rng = _helpers(), random.Random(f"{name}{n}")
  for _ in range(n):
    x = gen(rng)
    if bits == 32: x = float(np.float32(x))
    got = m.call(f"{HELPER_PREFIX}{name}", x)
    want = ref(x) if bits == 64 else float(np.float32(ref(x)))
    assert _ulps(got, want, bits) <= limit, f"{name}({x!r}) = {got!r}, want {want!r}"


def _logu(lo: float, hi: float) -> Callable[[random.Random], float]:
  return lambda r: math.copysign(2.0 ** r.uniform(lo, hi), r.choice((-1, 1)))


def _log2_ref(x: float) -> float: return math.log2(x) if x > 0 else -math.inf if x == 0 else math.nan


def test_sin_f64_accuracy() -> None:
  _sweep("sin_f64", math.sin, _logu(-30, 3), 64, 150)
  _sweep("sin_f64", math.sin, _logu(3, 20), 64, 150)          # Cody-Waite
  _sweep("sin_f64", math.sin, _logu(19.9, 21), 64, 100, 2.0)  # across the switch at 2^20
  _sweep("sin_f64", math.sin, _logu(20, 1023.9), 64, 200, 2.0)  # Payne-Hanek: the fraction is rounded twice more
  _sweep("sin_f64", math.sin, lambda r: round(r.uniform(1, 1e6)) * math.pi / 2 * (1 + r.uniform(-1e-15, 1e-15)), 64, 100)


def test_sin_f32_accuracy() -> None:
  _sweep("sin_f32", math.sin, _logu(-20, 3), 32, 150)
  _sweep("sin_f32", math.sin, _logu(3, 17.5), 32, 200)        # |x| up to ~1e4 is what the IR's users need
  _sweep("sin_f32", math.sin, _logu(17, 127.9), 32, 40)       # through the float64 routine


def test_log2_exp2_accuracy() -> None:
  _sweep("log2_f64", _log2_ref, lambda r: 2.0 ** r.uniform(-1074, 1023.9), 64, 150)
  _sweep("log2_f64", _log2_ref, lambda r: 1 + r.uniform(-0.3, 0.5), 64, 150)
  _sweep("log2_f64", _log2_ref, lambda r: 1 + r.uniform(-1e-6, 1e-6), 64, 50)
  _sweep("log2_f32", _log2_ref, lambda r: 2.0 ** r.uniform(-149, 127.9), 32, 150)
  _sweep("log2_f32", _log2_ref, lambda r: 1 + r.uniform(-0.3, 0.5), 32, 150)
  _sweep("exp2_f64", lambda x: 2.0 ** x if x < 1024 else math.inf, lambda r: r.uniform(-1080, 1030), 64, 150)
  _sweep("exp2_f64", lambda x: 2.0 ** x, _logu(-60, 3), 64, 150)


@pytest.mark.parametrize("x", [0.0, -0.0, math.inf, -math.inf, math.nan, 5e-324, -5e-324, 1.0, -1.0, 1e300, -2.5e-310])
def test_math_helpers_special_values(x: float) -> None:
  m = _helpers()
  def same(got: float, want: float) -> bool:
    return (math.isnan(got) and math.isnan(want)) or (got == want and math.copysign(1, got) == math.copysign(1, want))
  for name, ref, bits in (("sin_f64", math.sin, 64), ("log2_f64", _log2_ref, 64), ("exp2_f64", lambda v: 2.0 ** v, 64),
                          ("sin_f32", math.sin, 32), ("log2_f32", _log2_ref, 32)):
    with np.errstate(over="ignore"): xx = float(np.float32(x)) if bits == 32 else x
    try: want = ref(xx)
    except (ValueError, OverflowError): want = math.nan if name.startswith("sin") else math.inf
    if bits == 32: want = float(np.float32(want))
    got = m.call(f"{HELPER_PREFIX}{name}", xx)
    assert same(got, want) or _ulps(got, want, bits) <= 1, f"{name}({xx!r}) = {got!r}, want {want!r}"
