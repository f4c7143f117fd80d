"""Scaffolding for fake GPUs: test a user-space backend's queue code (plugrt.hwqueue and its command encoding)
on a machine without the hardware.

A fake GPU stands in below the backend's interface: the backend maps memory, writes commands into rings and
command buffers, rings doorbells and waits on timelines exactly as it does on hardware, and threads of the fake
read all of it back the way the hardware documents it. The part of a fake that knows a GPU's packets is the
backend's own (plugins/ops_nv/tests/fake_gpu.py decodes NV's GPFIFO entries, methods and QMDs); everything else is
here, so each backend's fake stays a packet decoder:

- `FakeMemory`: GPU memory as host memory at the GPU address (the CPU and the GPU see one address, as with NV's
  mappings, KFD's SVM and KGSL's GPU objects), with the ranges handed out, so any address resolves to its
  allocation and a buffer address becomes a numpy array over the rest of that allocation.
- `release` / `acquired` / `acquire`: timeline semantics: the GPU writing a value (and its timestamp) where the
  backend reads it, and a queue waiting until a counter reaches a value (circular compare, 32 or 64 bits).
- `DispatchRunner`: runs a dispatch, given the program's IR kernel, the buffers' addresses, the scalar values and
  the grid, through the reference interpreter (plugrt.compiler.interpreter) on the fake's memory: what the hardware would
  have computed. `load(address, kernel)` registers the kernel under its code address, as the decoder sees it;
  `decode_scalars` turns the argument bytes a launch wrote into values.
- `FakeDevice`: the fake's state and its queue threads: `serve(step)` runs a decoder's step function on a thread
  until `close()`, pausing while `hang` is set (a kernel that never ends); `error` is what `fault()` reports.

How a fake plugs in (NV does this today; AMD and QCOM are written the same way):

- NV: each channel's thread reads GPFIFO entries between GP_GET and GP_PUT, decodes the methods in the command
  buffer each points at, applies semaphore releases and acquires with `release`/`acquire`, copy-engine copies with
  ctypes.memmove, and for a compute launch reads the QMD (grid, block, program address, constant bank 0), unpacks
  the arguments from constant bank 0 (`decode_scalars`) and calls `runner.run`.
- AMD (KFD, AQL): a thread per queue reads 64-byte AQL packets between the read index it keeps and the write index
  the backend publishes; a KERNEL_DISPATCH packet gives the grid and workgroup sizes, `kernel_object` (look the
  program up in `runner.programs`) and `kernarg_address` (buffers' addresses and scalars at the offsets the code
  object's metadata lists: `decode_scalars`), then `runner.run`, then `release` of its completion signal (64-bit,
  `bits=64`); a BARRIER_AND packet waits with `acquire`. PM4 queues decode RELEASE_MEM the same way.
- QCOM (KGSL): the fake answers the GPU-object and submit ioctls of its interface with `FakeMemory` and a thread
  that reads the indirect buffers' CP packets: the compute state (shader address, constants holding the buffers'
  addresses and the scalars) and CP_EXEC_CS (the grid) become `runner.run`; CP_EVENT_WRITE with a timestamp
  becomes `release`.
"""
from __future__ import annotations

import ctypes
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from plugrt.compiler.ir import Kernel, Signature
from plugrt.dtype import DType, bf16_to_f32, dtypes
from plugrt.hwqueue import libc

PAGE = 4096
_PROT_RW, _MAP_PRIVATE_ANON, _MAP_FIXED, _MAP_FIXED_NOREPLACE = 3, 0x02 | 0x20, 0x10, 0x100000


@dataclass(frozen=True)
class Mapping:
  """A range of fake GPU memory: host memory at GPU address `va`."""
  va: int
  size: int
  kind: str = "device"


class FakeMemory:
  """GPU memory backed by anonymous host mappings at the GPU addresses.

  `place(size) -> address` picks where a mapping goes (a backend whose GPU addresses must lie in a window passes
  its own address allocator, with `unplace(address, size)` to give the range back); without it the kernel picks
  any free address. Mappings are page-rounded and zero-filled."""

  def __init__(self, place: Callable[[int], int] | None = None, unplace: Callable[[int, int], None] | None = None, page: int = PAGE):
    self.place, self.unplace, self.page = place, unplace, page
    self.maps: dict[int, Mapping] = {}
    self.lock = threading.Lock()
    self._libc = libc()

  def map(self, size: int, kind: str = "device", replace: bool = False) -> Mapping:
    """`replace`: the placed range is the caller's own reservation (a PROT_NONE mapping), replaced in one mmap call;
    unmapping it first would let another thread's mapping land in the hole before this one."""
    size = (max(size, 1) + self.page - 1) // self.page * self.page
    want = self.place(size) if self.place is not None else None
    flags = _MAP_PRIVATE_ANON | ((_MAP_FIXED if replace else _MAP_FIXED_NOREPLACE) if want is not None else 0)
    addr = self._libc.mmap(want, size, _PROT_RW, flags, -1, 0)
    if addr in (None, ctypes.c_void_p(-1).value) or (want is not None and addr != want):
      raise MemoryError(f"the fake GPU could not map {size} bytes" + (f" at {want:#x}" if want is not None else ""))
    with self.lock: self.maps[addr] = m = Mapping(addr, size, kind)
    return m

  def unmap(self, va: int) -> None:
    with self.lock: m = self.maps.pop(va)
    self._libc.munmap(m.va, m.size)
    if self.unplace is not None: self.unplace(m.va, m.size)

  def find(self, addr: int) -> Mapping:
    """The mapping that holds `addr` (a KeyError names the address when none does: the fake's page fault)."""
    with self.lock:
      for m in self.maps.values():
        if m.va <= addr < m.va + m.size: return m
    raise KeyError(f"the fake GPU has no memory at {addr:#x}")

  def array(self, addr: int, dtype: DType) -> np.ndarray:
    """The memory from `addr` to the end of its mapping as a 1-D numpy array of `dtype`'s storage type (a kernel's
    view of a buffer: the interpreter checks its accesses against the mapping's end)."""
    m = self.find(addr)
    n = (m.va + m.size - addr) // dtype.itemsize
    return np.frombuffer((ctypes.c_char * (n * dtype.itemsize)).from_address(addr), dtype=dtype.numpy, count=n)

  def read(self, addr: int, n: int) -> bytes: return ctypes.string_at(addr, n)
  def write(self, addr: int, data: bytes) -> None: ctypes.memmove(addr, data, len(data))

  def close(self) -> None:
    for va in list(self.maps): self.unmap(va)


# ---------------------------------------------------------------- timeline semantics

def release(addr: int, value: int, bits: int = 32, timestamp_at: int | None = None) -> None:
  """The GPU writing `value` (`bits` wide) at `addr`, and when asked its clock (ns, 64 bits) at `timestamp_at`."""
  (ctypes.c_uint32 if bits == 32 else ctypes.c_uint64).from_address(addr).value = value & ((1 << bits) - 1)
  if timestamp_at is not None: ctypes.c_uint64.from_address(timestamp_at).value = time.monotonic_ns()


def acquired(addr: int, value: int, bits: int = 32) -> bool:
  """Whether the counter at `addr` has reached `value`, compared circularly (as a GPU compares a wrapping counter)."""
  now = (ctypes.c_uint32 if bits == 32 else ctypes.c_uint64).from_address(addr).value
  return (now - value) & ((1 << bits) - 1) < 1 << (bits - 1)


def acquire(addr: int, value: int, bits: int = 32, stop: Callable[[], bool] = lambda: False) -> None:
  """A queue waiting until the counter at `addr` reaches `value` (or `stop()` says the fake is closing)."""
  while not acquired(addr, value, bits) and not stop(): time.sleep(0.0001)


# ---------------------------------------------------------------- dispatches

_SCALAR = {dtypes.bool: "<B", dtypes.int8: "<b", dtypes.uint8: "<B", dtypes.int16: "<h", dtypes.uint16: "<H", dtypes.int32: "<i",
           dtypes.uint32: "<I", dtypes.int64: "<q", dtypes.uint64: "<Q", dtypes.float16: "<e", dtypes.bfloat16: "<H",
           dtypes.float32: "<f", dtypes.float64: "<d"}


def decode_scalar(dt: DType, raw: bytes) -> Any:
  """A scalar argument's value from the bytes a launch wrote for it (bfloat16 as its 16 raw bits)."""
  (v,) = struct.unpack_from(_SCALAR[dt], raw)
  if dt is dtypes.bfloat16: return float(bf16_to_f32(np.array([v], np.uint16))[0])
  return bool(v) if dt is dtypes.bool else v


class DispatchRunner:
  """Runs dispatches through the reference interpreter on a `FakeMemory`; programs are registered by code address."""

  def __init__(self, memory: FakeMemory):
    self.memory = memory
    self.programs: dict[int, Kernel] = {}  # code address -> the kernel's IR
    self.runs: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = []  # (kernel name, grid, block) of every dispatch run

  def load(self, address: int, kernel: Kernel) -> None: self.programs[address] = kernel

  def decode_scalars(self, signature: Signature, raw: Callable[[int, int], bytes]) -> list[Any]:
    """The scalar arguments' values; raw(i, nbytes) returns the bytes the launch wrote for scalar i."""
    return [decode_scalar(dt, raw(i, struct.calcsize(_SCALAR[dt]))) for i, dt in enumerate(signature.scalars)]

  def run(self, kernel: Kernel, buffers: Sequence[int], scalars: Sequence[Any], grid: Sequence[int], block: Sequence[int]) -> None:
    """What the GPU would compute: `kernel` on the buffers at these GPU addresses, with these scalars and sizes."""
    from plugrt.compiler import interpreter
    arrays = [self.memory.array(a, dt) for a, dt in zip(buffers, kernel.signature.buffers)]
    self.runs.append((kernel.name, tuple(grid), tuple(block)))
    interpreter.run(kernel, arrays, scalars, tuple(grid), tuple(block))


# ---------------------------------------------------------------- the device and its queue threads

class FakeDevice:
  """A fake GPU's memory, dispatch runner, fault state and queue threads; a backend's fake subclasses it (and its
  interface class) and adds the decoding."""

  def __init__(self, memory: FakeMemory | None = None):
    self.memory = memory or FakeMemory()
    self.runner = DispatchRunner(self.memory)
    self.error = ""      # set to make fault() report, as a faulting queue would
    self.hang = False    # set to stop executing (a kernel that never ends)
    self.stop = False
    self.threads: list[threading.Thread] = []

  def serve(self, name: str, step: Callable[[], bool]) -> threading.Thread:
    """Run `step` on a thread of its own until close(): it does one unit of work (a ring entry) and returns False
    when there was none, and the thread then sleeps a little. While `hang` is set the thread does nothing. An
    exception (an undecodable packet, a dispatch's out-of-bounds access) faults the queue: `error` says what, and
    the thread stops, so the backend's wait reports the fault."""
    def loop() -> None:
      while not self.stop:
        try:
          if self.hang or not step(): time.sleep(0.0002)
        except Exception as e:  # what the hardware does with a bad packet or an out-of-bounds access: the queue faults and stops
          self.error = f"{name}: {type(e).__name__}: {e}"
          return
    t = threading.Thread(target=loop, name=f"fake-gpu-{name}", daemon=True)
    t.start()
    self.threads.append(t)
    return t

  def fault(self, deep: bool = False) -> str: return self.error

  def close(self) -> None:
    if self.stop: return
    self.stop = True
    for t in self.threads: t.join(5)
    self.memory.close()


# ---------------------------------------------------------------- a fake device for a whole pytest session

def use_fake_for_session(fake: Any, plugins: Sequence[Any], env: dict[str, str], disable: Sequence[str]) -> Callable[[], None]:
  """Make the fake-backed `plugins` devices of the process's registry until the returned function is called: the
  usual registry (every installed plugin, `env` over the process's environment) with the real distributions named in
  `disable` turned off, so the tests that run "on every available device" run through the backend's real command
  path against `fake` (a backend's `<name>_session.py` pytest plugin calls this from pytest_configure, and the
  returned function from pytest_unconfigure; it closes the registry and shuts the fake down)."""
  import os

  from plugrt.registry import Registry, use
  full = {**os.environ, **env}
  full["PLUGRT_DISABLE"] = ",".join(filter(None, [full.get("PLUGRT_DISABLE", ""), *disable]))
  reg = Registry(plugins=list(plugins), env=full, autoload=True)
  ctx = use(reg)
  ctx.__enter__()

  def undo() -> None:
    ctx.__exit__(None, None, None)
    reg.close()
    fake.shutdown()
  return undo
