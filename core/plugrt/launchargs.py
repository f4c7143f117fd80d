"""Launch arguments: scalar packers for each kind of argument slot, and the record of the call a launch was prepared for.

A Program (plugrt.runtime) turns its `vals` into what the device reads once per new set of arguments, and on every
call compares the call with the one it prepared last; a call that repeats it reuses what was prepared, so a repeated
launch is one comparison and the native call. The comparison stays inline in the core's Program.__call__, reading the
attributes of a PreparedCall:

    p = self._prepared
    if bufs != p.bufs or vals != p.vals or (global_size, local_size) != p.dims:
      p = self._prepared = self._prepare(p, bufs, vals, global_size, local_size)  # check_args, pack, the backend's _encode
    p.submit()

Which scalars are the same argument: Python's == says 1 == 1.0 == True and 0.0 == -0.0, yet -0.0 is another
argument than 0.0 (1/x), and True is no int32 (check_args refuses it). Telling them apart takes a type-exact
serialisation of the scalars (marshal's format: each value's type and exact bits), a large share of a CPU
launch (docs/performance.md); so only where those twins are what code passes, when a prepared scalar is a bool or
equals 0 or 1 (False/0/0.0/-0.0, True/1/1.0), does a PreparedCall keep its scalars as ExactScalars: a tuple that Python's
comparison asks first (a subclass's reflected method has priority), which compares exactly unless it is handed the
call's own tuple. Every other launch compares plain tuples, at no cost over ==; what == lets through there is the same
number in another type (2 for 2.0: the same bits in a float slot; 2.0 for an int slot is taken as the 2 it equals,
where a first call would have raised TypeError).

Packers: every float goes through plugrt.dtype's rule (IEEE rounding to nearest even, past the dtype's range
+-inf), the same on every device; ints arrive checked to fit their dtype (Program.check_args).
"""
from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from marshal import dumps as _exact_bytes
from typing import Any
from weakref import ref

from plugrt.dtype import DType, cast_value, dtypes, float_bits, float_packer, float_value


@dataclass(frozen=True)
class Signature:
  """What a program takes: its buffers' element dtypes (and whether each is written), then its scalars."""
  buffers: tuple[DType, ...]
  scalars: tuple[DType, ...]
  written: tuple[bool, ...] = ()


# marshal's format 2: each value's type and exact bits (numpy scalars: their bytes), and no back-references (format 3 on
# marks objects by their reference count, so equal scalars could serialise differently)
_EXACT = 2
_U64 = 0xFFFFFFFFFFFFFFFF
_NO_SOURCE = object()  # ExactScalars.source of scalars given as a list: identical to no call's scalars
_ZERO_ONE = frozenset((0, 1))  # equal to False/0/0.0/-0.0 and True/1/1.0 (their hashes are 0 and 1 too)


def slot_packer(dt: DType) -> Callable[[Any], int]:
  """A scalar -> its 8-byte argument slot as an unsigned int: bool 1/0, ints in two's complement (-1 -> 2**64 - 1),
  floats their bits (float32's in the low 32 bits)."""
  if dt is dtypes.bool: return lambda v: 1 if v else 0
  if dt.kind in "iu": return lambda v: v & _U64
  return float_packer(dt)


def bytes_packer(dt: DType) -> Callable[[Any], bytes]:
  """A scalar -> its dtype's little-endian bytes (dt.itemsize of them): bool one byte 1/0, float16 and bfloat16
  their 16 bits."""
  if dt is dtypes.bool: return lambda v: b"\x01" if v else b"\x00"
  if dt.kind == "f":
    bits, n = float_packer(dt), dt.itemsize
    return lambda v: bits(v).to_bytes(n, "little")
  return struct.Struct("<" + dt.fmt).pack


def value_packer(dt: DType) -> Callable[[Any], Any]:
  """A scalar -> its value as the dtype holds it, a Python bool, int or float (floats rounded to the dtype, ints
  wrapped to its width), for backends that run kernels in Python."""
  return lambda v: cast_value(v, dt)


#: the ctypes type holding each dtype as a kernel parameter (float16 and bfloat16: their raw 16 bits)
SCALAR_CTYPES: dict[DType, type] = {
  dtypes.bool: ctypes.c_uint8, dtypes.int8: ctypes.c_int8, dtypes.int16: ctypes.c_int16, dtypes.int32: ctypes.c_int32,
  dtypes.int64: ctypes.c_int64, dtypes.uint8: ctypes.c_uint8, dtypes.uint16: ctypes.c_uint16, dtypes.uint32: ctypes.c_uint32,
  dtypes.uint64: ctypes.c_uint64, dtypes.float16: ctypes.c_uint16, dtypes.bfloat16: ctypes.c_uint16, dtypes.float32: ctypes.c_float,
  dtypes.float64: ctypes.c_double}


def ctypes_packer(dt: DType) -> Callable[[Any], Any]:
  """A scalar -> a new ctypes object of SCALAR_CTYPES[dt] holding it (for APIs that take a pointer per parameter)."""
  ct = SCALAR_CTYPES[dt]
  if dt is dtypes.bool: return lambda v: ct(1 if v else 0)
  if dt.kind in "iu": return ct
  if dt.itemsize == 2: return lambda v: ct(float_bits(v, dt))
  return lambda v: ct(float_value(v, dt))  # exactly the dtype's value: ctypes stores it without rounding again


def _exact(vals: Any) -> bytes | None:
  """The type-exact serialisation of a tuple or list of scalars; None for a scalar marshal cannot write."""
  try: return _exact_bytes(vals if type(vals) is tuple else tuple(vals), _EXACT)
  except (ValueError, TypeError): return None  # an IntEnum member, or not a sequence


class ExactScalars(tuple):
  """A call's scalars that compare exactly: equal to the call's own tuple, and to scalars of the same types and bits,
  never to 1.0 or True for 1, nor to -0.0 for 0.0 (see the module docstring). `vals != exact` asks this class first,
  a subclass of tuple."""

  def __new__(cls, vals: Sequence[Any], key: bytes | None) -> ExactScalars:
    self = super().__new__(cls, vals)
    # the caller's own tuple, equal by identity (never a list: the caller may change it); key None: a scalar marshal cannot write
    self.source, self.key = (vals if type(vals) is tuple else _NO_SOURCE), key
    return self

  def __ne__(self, other: object) -> bool:  # what a launch asks (`vals != prepared.vals`): the common cases first
    if other is self.source: return False
    if type(other) is tuple:
      try: return _exact_bytes(other, _EXACT) != self.key  # a key of None differs from any bytes
      except ValueError: return True  # a scalar marshal cannot write: another call, which check_args sees
    if other is self: return False
    if type(other) is ExactScalars: return self.key is None or other.key != self.key
    return self.key is None or _exact(other) != self.key

  def __eq__(self, other: object) -> bool: return not self.__ne__(other)

  __hash__ = tuple.__hash__


class WrappedBuffers(tuple):
  """A call's Buffers, as the record of a program's last call keeps them, when one of them wraps memory plugrt does not
  own (Buffer.from_blob, DLPack): each such Buffer by a weak reference, the others as they are. A program keeps its last
  call until it is called with other arguments, which may be never: a wrapped Buffer it kept would keep its owner's
  memory (`keepalive`) and the backend's mapping of it alive after the caller dropped it. A repeated call needs only
  the Buffers' identity, and the caller holds each Buffer it passes. `bufs != recorded` asks this class first (a
  subclass of tuple), as for ExactScalars: equal to a tuple of the same Buffers while each lives, never once one is gone."""
  __slots__ = ()

  def __new__(cls, bufs: Sequence[Any]) -> WrappedBuffers:
    return super().__new__(cls, [ref(b) if b._external else b for b in bufs])

  def live(self) -> tuple | None:
    """The Buffers, or None once a wrapped one is gone."""
    out = tuple([b() if type(b) is ref else b for b in self])
    return None if any(b is None for b in out) else out

  def __ne__(self, other: object) -> bool:  # what a launch asks (`bufs != prepared.bufs`): the call's own tuple first
    if type(other) is tuple and len(other) == len(self):
      for mine, b in zip(self, other):
        if (mine() if type(mine) is ref else mine) is not b or b is None: return True  # (a gone one reads None)
      return False
    if other is self: return False
    live = self.live()
    return live is None or live != (other.live() if type(other) is WrappedBuffers else other)

  def __eq__(self, other: object) -> bool: return not self.__ne__(other)

  __hash__ = tuple.__hash__


def call_key(vals: Sequence[Any], global_size: Any, local_size: Any) -> tuple[Sequence[Any], tuple[Any, Any]]:
  """(vals, (global_size, local_size)) as a PreparedCall keeps them, for arguments Program.check_args passed: scalars
  with a bool or a value equal to 0 or 1 among them (by hash and ==, at C speed) as ExactScalars; lists copied (the
  caller may change its list; the copy still compares equal to an equal list)."""
  if type(global_size) is list: global_size = list(global_size)
  if type(local_size) is list: local_size = list(local_size)
  if not _ZERO_ONE.isdisjoint(vals): return ExactScalars(vals, _exact(vals)), (global_size, local_size)
  return (list(vals) if type(vals) is list else vals), (global_size, local_size)


def _no_submit() -> None: raise RuntimeError("this prepared call was never encoded: it cannot be submitted")


class PreparedCall:
  """The arguments one launch was prepared for, and what the backend made of them, never changed once built but for
  `bufs`: a self-contained program (Program.self_contained) drops them when the call stops being its last, keeping it
  by the buffers' handles, and gives it the Buffers of a later call over the same memory.
  Program.__call__ compares a call with it inline (see the module docstring); replacing the program's prepared call by
  a single assignment lets threads share the program: a launch reads either the old or the new one, never a mix.

  The call: bufs, the Buffers (compared by identity; WrappedBuffers where one wraps memory plugrt does not own); vals,
  the scalars (ExactScalars where == cannot tell twins apart; a list copied); dims, (global_size, local_size) as given,
  lists copied.
  What the core checked and packed for it: sizes, the checked (global_size, local_size) as 3-tuples; scalars, the
  scalars packed by the program's scalar_packer.
  What the backend made of it (Program._encode): submit, a callable of no arguments that enqueues the launch (what it
  returns, if anything, is for the backend's own Program._timed); unlocked, for a LockedProgram's call, None or a
  callable of no arguments that enqueues the launch without the launch lock, atomically with respect to every other
  thread, and returns nonzero when it did, 0 when it declined (a native call holding the GIL that declines while
  another thread holds the lock): a repeated call tries it before taking the lock. A backend subclasses PreparedCall
  to keep its native argument block beside it; `submit` must not hold the PreparedCall itself (a cycle would keep its
  buffers alive until the garbage collector runs): a Graph keeps each launch's PreparedCall alive while it may submit
  it.
  """
  __slots__ = ("bufs", "dims", "scalars", "sizes", "submit", "unlocked", "vals")

  def __init__(self, bufs: tuple = (), call: tuple[Sequence[Any], tuple[Any, Any]] = ((), (None, None)),
               submit: Callable[[], Any] = _no_submit):
    """`call`: call_key() of the arguments, or `prepared.call` of a launch with the same scalars and sizes (the core's
    Program sets bufs, vals, dims, scalars and sizes on what _encode returns; a backend need not pass them, and a
    subclass whose __init__ is on a launch path may skip this one, setting only `submit`)."""
    self.bufs, (self.vals, self.dims) = bufs, call
    self.scalars: tuple = ()
    self.sizes: tuple[tuple[int, int, int], tuple[int, int, int]] = ((1, 1, 1), (1, 1, 1))
    self.submit = submit
    self.unlocked: Callable[[], int] | None = None

  @property
  def call(self) -> tuple[Sequence[Any], tuple[Any, Any]]: return (self.vals, self.dims)

  def repeated_by(self, bufs: tuple, vals: Sequence[Any], global_size: Any, local_size: Any) -> bool:
    """Whether a call with these arguments repeats this one: the negation of what a program's __call__ computes inline."""
    return not (bufs != self.bufs or vals != self.vals or (global_size, local_size) != self.dims)


#: matches no call: a program's first launch prepares
NO_CALL = PreparedCall()


__all__ = ["NO_CALL", "SCALAR_CTYPES", "ExactScalars", "PreparedCall", "WrappedBuffers", "bytes_packer", "call_key", "ctypes_packer",
           "slot_packer", "value_packer"]
