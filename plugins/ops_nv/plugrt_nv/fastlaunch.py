"""NV's fast launch in machine code, and the memory it shares with the Python side.

A resident launch (NVProgram._submitters) repeats a few stores: its command words into the next slot, the release's
payload, a GPFIFO entry, a store fence, GP_PUT and the doorbell. In Python those stores and the bookkeeping around
them are most of a launch's cost, so on x86-64 one call into gen/fastlaunch.c's code makes them (its bytes:
fastlaunch_x86_64.py, written by gen/fastlaunch.py). It declines (returns 0) whatever needs a decision: the device
off the fast path, an entry rewritten since the call was prepared, a slot still in use; the Python path then takes the
launch, as it does wherever the code cannot run (another architecture, no executable pages).

Both paths keep their counters in the same memory: `State` (the device's timeline value, the compute ring's put
counter, the next command slot, whether the fast path is open), each slot's last timeline value and the entry whose
words it holds, and per resident entry an `Entry` (its generation and last timeline value). The device state's
`value` and `fast`, its slots' `next` and `last_use`, the compute ring's `put` and the entries' `last_use` are views
of it (plugrt_nv.device), so the general paths read and write what the machine code does.
"""
from __future__ import annotations

import ctypes
import itertools
import sys
from _thread import RLock
from typing import Any

from plugrt import machinecode
from plugrt.hwqueue import CommandSlots, DoorbellRing, ResidentLaunch

u64 = ctypes.c_uint64


class State(ctypes.Structure):
  """A device's launch state (struct state in gen/fastlaunch.c)."""
  _fields_ = [(name, u64) for name in ("value", "put", "next", "fast", "counter", "ring", "ring_mask", "put_register", "doorbell",
                                        "token", "slots", "slot_size", "slot_mask", "last_use", "holds", "gp_entries", "payload", "busy")]


class Entry(ctypes.Structure):
  """A resident launch's share (struct entry): its generation (new whenever it is written: never 0, never reused),
  its last timeline value, its fast-path command words."""
  _fields_ = [("generation", u64), ("last_use", u64), ("words", u64 * 6)]


class Call(ctypes.Structure):
  """A prepared launch (struct call): the device, the entry, and the generation it was prepared for."""
  _fields_ = [("state", ctypes.c_void_p), ("entry", ctypes.c_void_p), ("generation", u64)]


generations = itertools.count(1)


class SharedSlots(CommandSlots):
  """Command slots whose `next` is the State's and whose `last_use` is an array the machine code writes too."""
  __slots__ = ("shared",)

  def __init__(self, shared: State, base: int, size: int, count: int):
    self.shared = shared
    super().__init__(base, size, count)
    self.last_use = (u64 * count)()  # type: ignore[assignment]

  @property  # type: ignore[override]
  def next(self) -> int: return self.shared.next

  @next.setter
  def next(self, i: int) -> None: self.shared.next = i


class SharedRing(DoorbellRing):
  """The compute channel's ring, its put counter the State's."""
  __slots__ = ("shared",)

  def __init__(self, shared: State, *args: Any):
    self.shared = shared
    super().__init__(*args)

  @property  # type: ignore[override]
  def put(self) -> int: return self.shared.put

  @put.setter
  def put(self, n: int) -> None: self.shared.put = n


class SharedEntry(ResidentLaunch):
  """A resident launch whose generation and last timeline value live in an Entry: setting `key` (the entry cleared
  or rewritten) starts a new generation, so calls prepared for the old contents are declined."""
  __slots__ = ("shared", "_key")

  def __init__(self, descriptor: int):
    self.shared = Entry()
    super().__init__(descriptor)

  @property  # type: ignore[override]
  def key(self) -> Any: return self._key

  @key.setter
  def key(self, key: Any) -> None:
    self._key = key
    self.shared.generation = next(generations)

  @property  # type: ignore[override]
  def last_use(self) -> int: return self.shared.last_use

  @last_use.setter
  def last_use(self, value: int) -> None: self.shared.last_use = value

  @property
  def generation(self) -> int: return self.shared.generation

class DeviceLock:
  """The device's lock (reentrant, as the RLock it wraps), which also sets the State's `busy` while a thread holds it:
  a repeated launch submits without the lock (`submit_unlocked`, PreparedCall.unlocked), and declines while `busy`,
  since the holder may be in the middle of changing the counters it reads."""
  __slots__ = ("_lock", "_shared", "_depth")

  def __init__(self, shared: State):
    self._lock, self._shared, self._depth = RLock(), shared, 0

  def __enter__(self) -> DeviceLock:
    self._lock.acquire()
    self._depth += 1
    self._shared.busy = 1  # (before the holder reads anything: a launch that ran since it took the lock is no matter)
    return self

  def __exit__(self, *exc: Any) -> None:
    self._depth -= 1
    if not self._depth: self._shared.busy = 0
    self._lock.release()


_code: Any = None


def functions() -> tuple[Any, Any, Any] | None:
  """(submit, queue, submit_unlocked): the machine code's entries as ctypes functions of a Call's address, returning
  the launch's timeline value or 0 (declined); None where the code cannot run. submit_unlocked is None where threads
  run Python at once (a free-threaded build): it relies on the GIL to keep every other thread out while it runs."""
  global _code
  if _code is None:
    from plugrt_nv.fastlaunch_x86_64 import CODE, QUEUE, SUBMIT, SUBMIT_UNLOCKED
    addr = machinecode.code(CODE)
    # PYFUNCTYPE keeps the GIL: the code runs for a few stores, and no other thread may run meanwhile (see DeviceLock)
    kind = ctypes.PYFUNCTYPE(u64, ctypes.c_void_p)
    gil = getattr(sys, "_is_gil_enabled", lambda: True)()
    _code = (kind(addr + SUBMIT), kind(addr + QUEUE), kind(addr + SUBMIT_UNLOCKED) if gil else None) if addr else False
  return _code or None
