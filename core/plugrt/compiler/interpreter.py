"""The reference interpreter: runs any IR kernel on numpy. It defines what the IR means.

Every thread of the launch is one lane of a numpy array; all lanes step through the
kernel together, with a mask for the lanes that are active inside IF and RANGE
blocks. Lockstep execution makes BARRIER a no-op by construction. Loads and stores
by active lanes are bounds-checked, so the interpreter also finds out-of-bounds
accesses in kernels, and checks that every vector access (VLOAD, VSTORE) is aligned: the address of its first element
(the numpy array's own, which is the device's address where the arrays are device memory, as in the fake GPUs) a
multiple of its size. Images are the same 1-D arrays (h*w*4 scalars, texel (x, y) at (y*w + x)*4): a
TEXEL_LOAD clamps its coordinates to the edge, a TEXEL_STORE outside the image raises.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from plugrt.compiler.ir import Kernel, Ops, UOp
from plugrt.dtype import DType, ImageDType, bf16_to_f32, cast_value, dtypes, f32_to_bf16

_NP_UNARY = {Ops.EXP2: np.exp2, Ops.LOG2: np.log2, Ops.SIN: np.sin, Ops.SQRT: np.sqrt, Ops.TRUNC: np.trunc}
_NP_BINARY = {Ops.ADD: np.add, Ops.SUB: np.subtract, Ops.MUL: np.multiply, Ops.DIV: np.divide, Ops.MAX: np.maximum,
              Ops.MIN: np.minimum, Ops.AND: np.bitwise_and, Ops.OR: np.bitwise_or, Ops.XOR: np.bitwise_xor,
              Ops.CMPLT: np.less, Ops.CMPLE: np.less_equal, Ops.CMPEQ: np.equal, Ops.CMPNE: np.not_equal}


def _value_np(dt: DType) -> np.dtype:
  """How values of a dtype are held: bfloat16 values live in float32 arrays, already rounded."""
  return np.dtype(np.float32) if dt is dtypes.bfloat16 else dt.numpy


def _round(arr: np.ndarray, dt: DType) -> np.ndarray:
  return bf16_to_f32(f32_to_bf16(arr)) if dt is dtypes.bfloat16 else arr


def _trunc_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  b = np.where(b == 0, 1, b).astype(a.dtype)  # division by zero is undefined: any value will do
  q = a // b
  fix = ((a - q * b) != 0) & ((a < 0) != (b < 0))
  return (q + fix.astype(a.dtype)).astype(a.dtype)


class InterpreterError(IndexError):
  """An out-of-bounds access or an invalid launch found while interpreting."""


def run(kernel: Kernel, buffers: Sequence[np.ndarray], scalars: Sequence[Any] = (),
        global_size: Sequence[int] = (1, 1, 1), local_size: Sequence[int] = (1, 1, 1), *, serial_groups: bool = False) -> None:
  """Run `kernel` on numpy `buffers` (1-D, storage dtypes; changed in place).

  global_size is the number of groups per axis, local_size the threads per group.
  With serial_groups=True each group is one lane: for lowered kernels
  (plugrt.compiler.lowering.serialize_groups) that loop over their threads themselves.
  """
  _Interp(kernel, buffers, scalars, global_size, local_size, serial_groups).run()


class _Interp:
  def __init__(self, kernel: Kernel, buffers: Sequence[np.ndarray], scalars: Sequence[Any], global_size: Sequence[int],
               local_size: Sequence[int], serial_groups: bool):
    sig = kernel.signature
    if len(buffers) != len(sig.buffers) or len(scalars) != len(sig.scalars):
      raise TypeError(f"kernel {kernel.name} takes {len(sig.buffers)} buffers and {len(sig.scalars)} scalars, "
                      f"got {len(buffers)} and {len(scalars)}")
    for i, (buf, dt) in enumerate(zip(buffers, sig.buffers)):
      if not isinstance(buf, np.ndarray) or buf.ndim != 1 or buf.dtype != dt.numpy:
        raise TypeError(f"buffer {i} of kernel {kernel.name} must be a 1-D numpy array of {dt.numpy}, got "
                        f"{getattr(buf, 'dtype', type(buf).__name__)}")
      if isinstance(dt, ImageDType) and buf.shape[0] != dt.size:
        raise TypeError(f"buffer {i} of kernel {kernel.name} is an image {dt!r}: it must have h*w*4 = {dt.size} elements, not {buf.shape[0]}")
    self.k, self.uops = kernel, kernel.uops
    self.gs, self.ls = tuple(int(x) for x in global_size), tuple(int(x) for x in local_size)
    if len(self.gs) != 3 or len(self.ls) != 3 or min(self.gs + self.ls) < 1:
      raise InterpreterError(f"global_size and local_size must be 3 positive ints, got {global_size}, {local_size}")
    self.ngroups, self.nlocal = math.prod(self.gs), (1 if serial_groups else math.prod(self.ls))
    self.lanes = self.ngroups * self.nlocal
    lane = np.arange(self.lanes, dtype=np.int64)
    self.group_flat, lid_flat = lane // self.nlocal, lane % self.nlocal
    self.serial = serial_groups
    self.ids = {"group_id": _unflatten(self.group_flat, self.gs), "local_id": _unflatten(lid_flat, (1, 1, 1) if serial_groups else self.ls)}
    self.buffers, self.scalars = list(buffers), list(scalars)
    self.env: dict[UOp, Any] = {}
    self.pos = {u: i for i, u in enumerate(self.uops)}
    self.match: dict[int, tuple[int, ...]] = {}
    stack: list[int] = []
    for i, u in enumerate(self.uops):
      if u.op in (Ops.RANGE, Ops.IF): stack.append(i)
      elif u.op is Ops.ELSE: self.match[stack[-1]] = (i,)
      elif u.op in (Ops.ENDRANGE, Ops.ENDIF): self.match[j] = self.match.get(j := stack.pop(), ()) + (i,)

  def run(self) -> None:
    with np.errstate(all="ignore"): self.block(0, len(self.uops), np.ones(self.lanes, dtype=bool))

  def full(self, value: Any, dt: DType) -> np.ndarray: return np.full(self.lanes, value, dtype=_value_np(dt))

  def block(self, start: int, end: int, mask: np.ndarray) -> None:
    i = start
    while i < end:
      u = self.uops[i]
      if u.op is Ops.RANGE:
        close = self.match[i][-1]
        idx = self.env[u.src[0]].copy()
        stop = self.env[u.src[1]]
        live = mask & (idx < stop)
        while live.any():
          self.env[u] = idx
          self.block(i + 1, close, live)
          idx = idx + np.asarray(1, dtype=idx.dtype)
          live = live & (idx < stop)
        i = close + 1
      elif u.op is Ops.IF:
        parts = self.match[i]
        cond = self.env[u.src[0]]
        if len(parts) == 2:
          self.block(i + 1, parts[0], mask & cond)
          self.block(parts[0] + 1, parts[1], mask & ~cond)
        else: self.block(i + 1, parts[0], mask & cond)
        i = parts[-1] + 1
      else:
        self.step(u, mask)
        i += 1

  def _addr(self, u: UOp, ptr: UOp, idx: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(array, flat element indices) for a load/store; raises for an active lane out of bounds."""
    if ptr.op is Ops.BUFFER: arr, per_lane = self.buffers[ptr.arg[0]], idx.astype(np.int64)
    else:
      arr, count = self.env[ptr]
      per_lane = idx.astype(np.int64)
      bad = mask & ((per_lane < 0) | (per_lane >= count))
      if bad.any(): self._oob(u, ptr, per_lane, bad, count)
      return arr, np.where(mask, self.group_flat * count + per_lane, 0)
    bad = mask & ((per_lane < 0) | (per_lane >= arr.shape[0]))
    if bad.any(): self._oob(u, ptr, per_lane, bad, arr.shape[0])
    return arr, np.where(mask, per_lane, 0)

  def _vector(self, u: UOp, mask: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """(array, flat indices) per lane of a VLOAD/VSTORE; raises for an active lane out of bounds or not aligned."""
    ptr, idx = u.src[0], self.env[u.src[1]].astype(np.int64)
    width = u.arg if u.op is Ops.VLOAD else len(u.src) - 2
    arr = self.buffers[ptr.arg[0]]
    size = width * arr.itemsize
    bad = mask & ((arr.ctypes.data + idx * arr.itemsize) % size != 0)
    if bad.any():
      lane = int(np.argmax(bad))
      raise InterpreterError(f"kernel {self.k.name}: {u.op.name} %{self.pos[u]} of {width} elements at element {int(idx[lane])} of "
                             f"{ptr.arg[1]!r} is not aligned: its address {arr.ctypes.data + int(idx[lane]) * arr.itemsize:#x} is not a "
                             f"multiple of {size} (thread {lane})")
    return [self._addr(u, ptr, idx + j, mask) for j in range(width)]

  def _oob(self, u: UOp, ptr: UOp, idx: np.ndarray, bad: np.ndarray, size: int) -> None:
    lane = int(np.argmax(bad))
    name = ptr.arg[1] if ptr.op is Ops.BUFFER else ptr.arg[0] if ptr.op is Ops.SHARED else "spill"
    raise InterpreterError(f"kernel {self.k.name}: {u.op.name} %{self.pos[u]} reads or writes element {int(idx[lane])} of "
                           f"{name!r}, which has {size} elements (thread {lane})")

  def step(self, u: UOp, mask: np.ndarray) -> None:
    op, env = u.op, self.env
    if op is Ops.CONST: env[u] = self.full(u.arg, u.dtype)
    elif op is Ops.SCALAR: env[u] = self.full(cast_value(self.scalars[u.arg[0]], u.dtype), u.dtype)
    elif op is Ops.BUFFER: pass
    elif op is Ops.SPECIAL:
      kind, axis = u.arg
      if kind == "num_groups": env[u] = self.full(self.gs[axis], dtypes.int32)
      elif kind == "local_size": env[u] = self.full(self.ls[axis], dtypes.int32)
      elif kind == "local_id" and self.serial: raise InterpreterError(f"kernel {self.k.name}: local_id in a serial-groups run")
      else: env[u] = self.ids[kind][axis].astype(np.int32)
    elif op is Ops.SHARED: env[u] = (np.zeros(self.ngroups * u.arg[1], dtype=u.dtype.base.numpy), u.arg[1])
    elif op is Ops.SPILL:
      count = int(env[u.src[0]].max()) if self.lanes else 0
      env[u] = (np.zeros(self.ngroups * max(count, 1), dtype=u.dtype.base.numpy), count)
    elif op is Ops.LOAD:
      arr, flat = self._addr(u, u.src[0], env[u.src[1]], mask)
      got = arr[flat]
      env[u] = bf16_to_f32(got) if u.dtype is dtypes.bfloat16 else got
    elif op is Ops.STORE:
      arr, flat = self._addr(u, u.src[0], env[u.src[1]], mask)
      val = env[u.src[2]]
      if u.src[2].dtype is dtypes.bfloat16: val = f32_to_bf16(val)
      arr[flat[mask]] = val[mask]
    elif op is Ops.VLOAD:
      lanes = self._vector(u, mask)
      env[u] = [bf16_to_f32(arr[flat]) if u.dtype is dtypes.bfloat16 else arr[flat] for arr, flat in lanes]
    elif op is Ops.LANE: env[u] = env[u.src[0]][u.arg]
    elif op is Ops.VSTORE:
      for (arr, flat), s in zip(self._vector(u, mask), u.src[2:]):
        val = f32_to_bf16(env[s]) if s.dtype is dtypes.bfloat16 else env[s]
        arr[flat[mask]] = val[mask]
    elif op is Ops.TEXEL_LOAD:
      img = u.src[0].dtype.base
      h, w = img.shape
      x, y = np.clip(env[u.src[1]], 0, w - 1).astype(np.int64), np.clip(env[u.src[2]], 0, h - 1).astype(np.int64)
      env[u] = self.buffers[u.src[0].arg[0]][(y * w + x) * 4 + u.arg]
    elif op is Ops.TEXEL_STORE:
      img = u.src[0].dtype.base
      h, w = img.shape
      x, y = env[u.src[1]].astype(np.int64), env[u.src[2]].astype(np.int64)
      bad = mask & ((x < 0) | (x >= w) | (y < 0) | (y >= h))
      if bad.any():
        lane = int(np.argmax(bad))
        raise InterpreterError(f"kernel {self.k.name}: TEXEL_STORE %{self.pos[u]} writes texel (x={int(x[lane])}, y={int(y[lane])}) of "
                               f"{u.src[0].arg[1]!r}, a {w}x{h} (width x height) image (thread {lane})")
      arr, flat = self.buffers[u.src[0].arg[0]], ((y * w + x) * 4)[mask]
      for c in range(4): arr[flat + c] = env[u.src[3 + c]][mask]
    elif op is Ops.VAR: env[u] = env[u.src[0]].copy()
    elif op is Ops.READ: env[u] = env[u.src[0]].copy()
    elif op is Ops.WRITE: env[u.src[0]][mask] = env[u.src[1]][mask]
    elif op is Ops.BARRIER or op is Ops.ENDRANGE or op is Ops.ENDIF or op is Ops.ELSE: pass
    else: env[u] = _alu(u, [env[s] for s in u.src])


def _unflatten(flat: np.ndarray, dims: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  x = flat % dims[0]
  y = (flat // dims[0]) % dims[1]
  z = flat // (dims[0] * dims[1])
  return x, y, z


def _alu(u: UOp, s: list[np.ndarray]) -> np.ndarray:
  op, dt = u.op, u.dtype
  if op in _NP_BINARY: out = _NP_BINARY[op](s[0], s[1])
  elif op in _NP_UNARY: out = _NP_UNARY[op](s[0])
  elif op is Ops.RECIP: out = np.divide(np.asarray(1, dtype=s[0].dtype), s[0])
  elif op is Ops.NEG: out = np.negative(s[0])
  elif op is Ops.NOT: out = np.logical_not(s[0]) if dt is dtypes.bool else np.invert(s[0])
  elif op is Ops.IDIV: out = _trunc_div(s[0], s[1])
  elif op is Ops.MOD: out = s[0] - _trunc_div(s[0], s[1]) * np.where(s[1] == 0, 1, s[1]).astype(s[0].dtype)
  elif op is Ops.SHL: out = np.left_shift(s[0], s[1] & (dt.bits - 1))
  elif op is Ops.SHR: out = np.right_shift(s[0], s[1] & (dt.bits - 1))
  elif op is Ops.WHERE: out = np.where(s[0], s[1], s[2])
  elif op is Ops.CAST: return _cast(s[0], u.src[0].dtype, dt)
  elif op is Ops.BITCAST:
    raw = f32_to_bf16(s[0]) if u.src[0].dtype is dtypes.bfloat16 else s[0]
    out = raw.view(dt.numpy)
    return bf16_to_f32(out) if dt is dtypes.bfloat16 else out
  else: raise NotImplementedError(f"interpreter has no rule for {op.name}")
  return _round(np.asarray(out, dtype=_value_np(dt)), dt)


def _cast(x: np.ndarray, src: DType, dt: DType) -> np.ndarray:
  if dt is dtypes.bool: return x != 0
  if dt.kind in "iu" and src.kind == "f":
    # truncate toward zero; out-of-range is undefined, so clamp to keep numpy quiet and deterministic
    t = np.trunc(x.astype(np.float64))
    t = np.nan_to_num(t, nan=0.0, posinf=0.0, neginf=0.0)
    return np.clip(t, dt.min, dt.max).astype(np.float64).astype(dt.numpy) if dt.bits < 64 else \
      np.where((t >= float(dt.min)) & (t < float(dt.max)), t, 0).astype(dt.numpy)
  if dt is dtypes.bfloat16: return bf16_to_f32(f32_to_bf16(x.astype(np.float32)))
  if dt is dtypes.float16 and src.kind in "iu" and src.bits > 32:
    return x.astype(np.float64).astype(np.float16)
  return x.astype(_value_np(dt))
