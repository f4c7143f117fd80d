"""The hardware-queue layer: what a backend that submits work to its GPU from user space needs, apart from how the
GPU's commands are encoded.

A user-space backend (plugrt-nv; plugrt-amd through KFD; plugrt-qcom through KGSL) writes commands into memory
the GPU reads, tells the GPU where they end, and learns that they are done by reading memory the GPU writes. The
pieces of that which do not depend on the GPU are here:

- `Timeline`: the submission counter. Every submission ends by having the GPU write the next value of a counter in
  host memory (NV: a host semaphore release; AMD: a signal written by RELEASE_MEM or an AQL completion signal;
  QCOM: the timestamp CP_EVENT_WRITE stores). `completed()` reads it (a 32- or 64-bit counter that may wrap), and
  `wait(value)` waits for it, bounded: past the device's timeout, or as soon as the device reports a fault, the wait
  marks the device failed and raises the backend's `QueueError` with the device's reason and a hint.
- `CommandSlots`: a ring of fixed-size slots of command memory, each remembering the timeline value of the last
  submission written into it, so a slot is reused only after the GPU finished reading it.
- `DoorbellRing`: a ring the GPU fetches from (NV's GPFIFO of 8-byte entries, an AMD AQL queue of 64-byte
  packets, a KGSL ringbuffer): the put counter the CPU advances, the register the GPU reads it from, the doorbell,
  and how far the GPU has consumed.
- `ResidentLaunch` / `ResidentLaunches`: launches kept prepared in device memory (descriptor and arguments written
  once per set of arguments), so a launch with the same arguments only writes its few command words.
- `PinnedStaging`: host copies of pageable memory in chunks through pinned host buffers, double-buffered, the CPU
  side in parallel pieces; the backend supplies the buffers and the DMA (its copy engine, or its driver's async copy).
- `StagedAllocator`: GPU memory whose handle is its GPU address, freed after the device is idle, host copies through
  a `PinnedStaging`; the backend supplies the allocation, the release and its device-to-device copy, and where it
  can, copies to another device of the backend through a peer mapping (`_peer_copy`; else through host memory).
- `HCQState`, `HCQProgram`, `HCQGraph`: what every such device's programs and graphs share: the launch under the
  device's lock, timed launches by the device's clock, graphs replayed under the lock; a backend supplies only its
  command encoding (`HCQProgram._encode`) and its state's waits.

The per-launch path stays in the backend, inline: the classes here are plain objects with `__slots__` whose fields
the backend's fast path reads directly (no method call, no allocation per launch); their methods are for the slow
paths. See docs/architecture.md ("The hardware-queue layer") for how a new backend puts them together.
"""
from __future__ import annotations

import ctypes
import os
import threading
import time
from typing import TYPE_CHECKING, Any, NoReturn

from plugrt.context import DeviceInfo, PluginContext
from plugrt.errors import PlugrtError
from plugrt.launchargs import NO_CALL, PreparedCall
from plugrt.runtime import Allocator, DeviceState, Graph, Launch, LockedProgram, buffer_address

if TYPE_CHECKING:
  from plugrt.launchargs import Signature


def round_up(x: int, a: int) -> int: return (x + a - 1) // a * a


_libc: Any = None


def libc() -> Any:
  """The C library already in the process (CDLL(None): no find_library, which runs ldconfig) with the calls a
  user-space backend's interface and its fake make typed once: ioctl(fd, request, struct*), mmap, munmap. One shared
  object, so every caller sees the same argument types."""
  global _libc
  if _libc is None:
    c = ctypes.CDLL(None, use_errno=True)
    c.ioctl.argtypes, c.ioctl.restype = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p], ctypes.c_int
    c.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    c.mmap.restype = ctypes.c_void_p
    c.munmap.argtypes, c.munmap.restype = [ctypes.c_void_p, ctypes.c_size_t], ctypes.c_int
    _libc = c
  return _libc


class QueueError(PlugrtError, RuntimeError):
  """Work on a hardware queue failed: the GPU reported a fault, or did not reach a timeline value within the
  timeout. `reason` is the device's account of it (the driver's fault report, ring positions), `value` the
  timeline value that was waited for, `timed_out` whether the time ran out (rather than a fault being reported).
  Backends subclass it (plugrt-nv's NVError) so their users catch one type."""

  def __init__(self, message: str, hint: str = "", *, reason: str = "", value: int | None = None, timed_out: bool = False):
    super().__init__(message, hint)
    self.reason, self.value, self.timed_out = reason, value, timed_out


def queue_timeout(ctx: PluginContext, variable: str, default: float = 30.0) -> float:
  """The longest a device waits for its GPU, in seconds, from `variable` in the device's context (an EnvError
  names the variable when the value is not a positive number)."""
  return ctx.number(variable, default, lo=0.001, unit="seconds")


class Timeline:
  """A counter the GPU writes in memory the CPU reads: every submission ends by writing the next value.

  `value` is the last value submitted, `done` the highest value known to be completed. A device state inherits
  this (so its fast path reads `state.value` and `state.done` with no extra attribute hop) and calls
  `Timeline.__init__` once the counter's memory exists. The counter may be narrower than Python's integers
  (`bits`, 32 for NV's semaphores, 64 for AMD's signals): `completed()` unwraps it, which holds while fewer than
  2**(bits-1) submissions are in flight.

  Subclasses override `fault()` (a cheap check the wait makes every FAULT_CHECK_S: "" while the device reports nothing)
  and `fault_report()` (the full account, read once when the wait gives up), and set `error` to their QueueError
  subclass.
  """
  error: type[QueueError] = QueueError
  FAULT_CHECK_S = 0.02  # how often a wait reads the device's error state
  SPINS = 1000          # completions read before a wait starts watching the clock (most waits end here)

  def __init__(self, counter: int, *, timeout: float, label: str, setting: str, bits: int = 32):
    """counter: CPU address of the counter; timeout: seconds a wait may take (`queue_timeout`); label: the device
    as messages name it ("NV:0"); setting: the variable that sets the timeout, for the hint."""
    if bits not in (32, 64): raise ValueError(f"a timeline counter has 32 or 64 bits, not {bits}")
    self._counter = (ctypes.c_uint32 if bits == 32 else ctypes.c_uint64).from_address(counter)
    self._wrap = (1 << bits) - 1
    self.counter_address, self.timeout, self.label, self.timeout_setting = counter, timeout, label, setting
    self.value = self.done = 0
    self.broken = ""  # why the device cannot run more work ("" while it can)

  def completed(self) -> int:
    """The highest timeline value the GPU has written (read now)."""
    done = self.value - ((self.value - self._counter.value) & self._wrap)
    if done > self.done: self.done = done
    return self.done

  def wait(self, value: int, timeout: float | None = None) -> None:
    """Return once the GPU reached `value`; raise `error` (and mark the device broken) on a fault or after
    `timeout` seconds (default: the device's)."""
    if self.done >= value: return
    for _ in range(self.SPINS):
      if self.completed() >= value: return
    limit = self.timeout if timeout is None else timeout
    deadline, check = time.monotonic() + limit, 0.0
    while self.completed() < value:
      now = time.monotonic()
      if now >= check:  # the device's error state: plain memory reads for the backends here
        if self.fault(): self.fail(f"the GPU reported an error while running submission {value}", value)
        check = now + self.FAULT_CHECK_S
      if now > deadline: self.fail(f"the GPU did not finish submission {value} within {limit:g} s (timeline at {self.completed()})", value, True)
      time.sleep(0)

  def synchronize(self) -> None: self.wait(self.value)

  def fault(self) -> str:
    """What the device reports went wrong, cheaply ("" while nothing did)."""
    return ""

  def fault_report(self) -> str:
    """The device's full account after a fault or a timeout (driver's error state, ring positions)."""
    return self.fault()

  def fail(self, what: str, value: int | None = None, timed_out: bool = False) -> NoReturn:
    """Mark the device failed and raise: a kernel that faults or never ends leaves the queue in a state the
    process cannot recover from, so every later submission raises too (see `broken`)."""
    reason = self.fault_report() or "the driver reports no channel error"
    self.broken = f"{what}; {reason}"
    raise self.error(f"{self.label}: {self.broken}",
                     f"a kernel that faults or never ends leaves this device unusable in this process: fix it and restart; "
                     f"{self.timeout_setting}=<seconds> allows longer work", reason=reason, value=value, timed_out=timed_out)


class CommandSlots:
  """A ring of `count` slots of `size` bytes at CPU address `base`, where the CPU writes command words.

  Each slot remembers (`last_use`) the timeline value of the last submission written into it; `take()` hands out
  the next slot in turn, first waiting until the GPU finished that submission, so the CPU never overwrites words
  the GPU may still read. At most `count` submissions are in flight, which also bounds how full a `DoorbellRing`
  can get when each submission takes one slot and one ring entry.
  Fast paths inline `take()` on the fields (`next`, `last_use`, `view`, `base`)."""
  __slots__ = ("base", "size", "count", "view", "last_use", "next")

  def __init__(self, base: int, size: int, count: int):
    self.base, self.size, self.count = base, size, count
    self.view = memoryview((ctypes.c_char * (size * count)).from_address(base)).cast("B")  # the slots, for slice writes
    self.last_use = [0] * count  # timeline value of each slot's last submission
    self.next = 0                # the slot the next submission takes

  def take(self, timeline: Timeline) -> int:
    """The next slot's index, once the GPU is done with what was last written there."""
    i = self.next
    self.next = (i + 1) % self.count
    if self.last_use[i] > timeline.done: timeline.wait(self.last_use[i])
    return i

  def address(self, i: int) -> int: return self.base + i * self.size


class DoorbellRing:
  """A ring of `entries` entries the GPU fetches from, with the CPU's put counter, the register the GPU reads it
  from, the doorbell the CPU writes after moving it, and the register where the GPU reports how far it read.

  `put` counts entries ever written (it does not wrap); the entry goes at `put % entries`. NV's GPFIFO: 8-byte
  entries (`push`), GP_PUT holds `put % entries` (`wrap_put`), the doorbell takes the channel's token. An AMD AQL
  queue: 64-byte packets written by the backend at `index(put)` (header last), the write index register and the
  doorbell both take `put` itself (`wrap_put=False`, `token=None`). A KGSL ringbuffer is advanced by the kernel
  driver; a QCOM backend keeps only `put` and `consumed()` here.
  Fast paths inline `push` and `publish` on the fields."""
  __slots__ = ("name", "ring", "entries", "put", "put_register", "get_register", "doorbell", "token", "wrap_put")

  def __init__(self, name: str, ring: Any, entries: int, put_register: Any, get_register: Any, doorbell: Any,
               token: int | None, wrap_put: bool = True):
    """ring: the entries as a ctypes array (or the backend's view of them); *_register and doorbell: ctypes
    integers at the registers' CPU addresses; token: what the doorbell takes (None: the put counter)."""
    self.name, self.ring, self.entries = name, ring, entries
    self.put_register, self.get_register, self.doorbell, self.token, self.wrap_put = put_register, get_register, doorbell, token, wrap_put
    self.put = 0

  def index(self, n: int) -> int: return n % self.entries

  def push(self, entry: int) -> None:
    """Write one integer entry at the put position and advance it (not yet visible to the GPU: `publish`)."""
    self.ring[self.put % self.entries] = entry
    self.put += 1

  def publish(self) -> None:
    """Tell the GPU about every entry pushed: move the put register, ring the doorbell. On write-combined memory
    the caller fences before this, so the entries reach the GPU before the register that points past them."""
    self.put_register.value = self.put % self.entries if self.wrap_put else self.put
    self.doorbell.value = self.put if self.token is None else self.token

  def consumed(self) -> int:
    """The GPU's read position, as its register holds it (modulo `entries` when `wrap_put`)."""
    return self.get_register.value

  def in_flight(self) -> int:
    """Entries published that the GPU has not read yet."""
    return (self.put - self.consumed()) % self.entries if self.wrap_put else self.put - self.consumed()

  def describe(self) -> str:
    return f"{self.name} ring read {self.consumed()} / written {self.put % self.entries if self.wrap_put else self.put}"


class ResidentLaunch:
  """One launch kept prepared in device memory: its descriptor and arguments were written for `key`, so a launch
  with those arguments only writes `commands` (patching in its timeline value) and rings the doorbell.

  NV: `descriptor` is the GPU address of a QMD followed by constant bank 0 (the arguments); AMD: the address of a
  kernel-argument block beside a prepared AQL dispatch packet; QCOM: an indirect buffer of state and draw words."""
  __slots__ = ("key", "descriptor", "last_use", "commands")

  def __init__(self, descriptor: int):
    self.key: Any = None                 # the arguments it holds, compared with ==; None while being (re)written
    self.descriptor = descriptor         # GPU address of the launch descriptor and its arguments
    self.last_use = 0                    # timeline value of the last launch that read it: rewrite only once completed
    self.commands = bytearray()          # the fast path's command words, ready but for the per-launch payload

  def __repr__(self) -> str: return f"ResidentLaunch(descriptor={self.descriptor:#x}, last_use={self.last_use}, key={self.key!r})"


class ResidentLaunches:
  """Up to `capacity` resident launches of one program, `stride` bytes apart from GPU address `base`.

  The launch path looks a key up in `entries` inline; `claim()` picks an entry to rewrite for a new key: a new one
  while there is room (rewriting one that the next call may want again would thrash: alternating buffers, as in a
  chain of dependent launches, then stay resident), else the least recently used one the GPU has finished with,
  else None (every entry is in use: the launch then carries its descriptor in its command slot). `entry`: the
  class of the entries (a backend's ResidentLaunch subclass keeps fields where its native launch code reads them)."""
  __slots__ = ("base", "stride", "capacity", "entries", "entry")

  def __init__(self, base: int, stride: int, capacity: int, entry: type[ResidentLaunch] = ResidentLaunch):
    self.base, self.stride, self.capacity, self.entry = base, stride, capacity, entry
    self.entries: list[ResidentLaunch] = []

  def find(self, key: Any) -> ResidentLaunch | None:
    for e in self.entries:
      if e.key == key: return e
    return None

  def claim(self, done: int) -> ResidentLaunch | None:
    """An entry free to rewrite (its key cleared), given that the timeline reached `done`; None when all are busy."""
    if len(self.entries) < self.capacity:
      e = self.entry(self.base + len(self.entries) * self.stride)
      self.entries.append(e)
    elif free := [e for e in self.entries if e.last_use <= done]: e = min(free, key=lambda e: e.last_use)
    else: return None
    e.key = None
    return e


class PinnedStaging:
  """Host <-> device copies of pageable host memory through pinned host buffers that the DMA engine reads and writes.

  A copy is cut into chunks of `chunk` bytes; each goes through one of `buffers` pinned buffers in turn
  (double-buffered with two): the CPU copies one chunk between the user's memory and a pinned buffer while the
  DMA of the previous one runs. The CPU copy of a large chunk is split across a thread pool (ctypes.memmove lets
  the GIL go, and one core's copy is well below what a DMA engine moves).

  A backend subclasses it and supplies the buffers and the DMA: `_new_buffer()` (a pinned buffer of `chunk`
  bytes: its address), `_to_device(dest, k, n)` / `_from_device(k, src, n)` (start a DMA between device address
  dest/src and pinned buffer k, `buffers[k]`, ordered after everything queued before; return a token) and
  `_wait(token)`. The device's queue must run DMAs in the order they were queued (so a buffer that an earlier
  copy-in still reads is safe to DMA into for a copy-out). `_copied_in()` runs at the end of a copy-in (a backend
  whose callers expect the data to have landed waits there).
  """
  def __init__(self, lock: Any, chunk: int = 64 << 20, buffers: int = 2, parallel_min: int = 1 << 20, align: int = 1,
               threads: int | None = None, thread_name: str = "plugrt-copy"):
    """lock: held around a whole copy (the buffers are shared; a device's RLock works); parallel_min: CPU copies
    from this size are split across threads; align: pieces start at multiples of it; threads: the pool's size
    (default: the CPU count, at most 16)."""
    self.lock, self.chunk, self.nbuffers, self.parallel_min, self.align = lock, chunk, buffers, parallel_min, align
    self.threads = threads if threads is not None else max(1, min(16, os.cpu_count() or 2))
    self.thread_name = thread_name
    self.buffers: list[int] = []          # pinned buffers' host addresses, made on first use
    self.tokens: list[Any] = [None] * buffers  # each buffer's last copy-in DMA (None: none yet)
    self.turn = 0                         # the buffer the next copy-in starts with (copies alternate across calls too)
    self.pool: Any = None

  # ------------------------------------------------------------ what a backend supplies
  def _new_buffer(self) -> int: raise NotImplementedError
  def _to_device(self, dest: int, k: int, n: int) -> Any: raise NotImplementedError
  def _from_device(self, k: int, src: int, n: int) -> Any: raise NotImplementedError
  def _wait(self, token: Any) -> None: raise NotImplementedError
  def _copied_in(self) -> None: pass

  # ------------------------------------------------------------ the copies
  def buffer(self, k: int) -> int:
    """Pinned buffer k's address (made when first needed)."""
    while len(self.buffers) <= k: self.buffers.append(self._new_buffer())
    return self.buffers[k]

  def memcpy(self, dst: int, src: int, n: int) -> None:
    """A host copy, split across the pool's threads from `parallel_min` bytes."""
    if n < self.parallel_min or self.threads <= 1:
      ctypes.memmove(dst, src, n)
      return
    if self.pool is None:
      from concurrent.futures import ThreadPoolExecutor
      self.pool = ThreadPoolExecutor(self.threads, thread_name_prefix=self.thread_name)
    step = round_up(-(-n // self.threads), self.align)
    futures = [self.pool.submit(ctypes.memmove, dst + o, src + o, min(step, n - o)) for o in range(0, n, step)]
    for f in futures: f.result()

  def chunks(self, n: int) -> list[tuple[int, int]]:
    """(offset, size) of each chunk of an n-byte copy."""
    return [(off, min(self.chunk, n - off)) for off in range(0, n, self.chunk)]

  def copyin(self, dest: int, host: int, n: int) -> None:
    """n bytes from host address `host` to device address `dest`. The user's memory is free again on return."""
    with self.lock:
      for off, m in self.chunks(n):
        k = self.turn
        self.turn = (k + 1) % self.nbuffers
        buf = self.buffer(k)
        if self.tokens[k] is not None: self._wait(self.tokens[k])  # the DMA that last read this buffer is done
        self.memcpy(buf, host + off, m)
        self.tokens[k] = self._to_device(dest + off, k, m)
      self._copied_in()

  def copyout(self, host: int, src: int, n: int) -> None:
    """n bytes from device address `src` to host address `host`; the DMA of the next chunks runs while the CPU
    copies this one out."""
    with self.lock:
      chunks, ahead = self.chunks(n), self.nbuffers - 1
      def start(i: int) -> Any:
        k = i % self.nbuffers
        self.buffer(k)
        return self._from_device(k, src + chunks[i][0], chunks[i][1])
      tokens = [start(i) for i in range(min(ahead, len(chunks)))]
      for i, (off, m) in enumerate(chunks):
        if i + ahead < len(chunks): tokens.append(start(i + ahead))
        self._wait(tokens[i])
        self.memcpy(host + off, self.buffer(i % self.nbuffers), m)


STAGED_PIECE = 64 << 20  # the host buffer a copy between two devices is staged through, at most


class StagedAllocator(Allocator[int]):
  """Device memory of a user-space backend: a handle is the memory's GPU address (views are offsets), host copies go
  through the backend's `PinnedStaging`, and a copy between two devices of the backend goes through `_peer_copy` where
  the backend has a peer path, else through host memory.

  The device's state (`device.state`) has `lock`, `broken` and `synchronize()`. The backend sets `staging` in its
  __init__ and supplies `_alloc` (recording each allocation in `mems` by its address), `_free_memory(mem)` (give one
  allocation back to the driver; called under the lock once the device is idle) and `_copy`.
  """
  supports_transfer = True
  staging: PinnedStaging

  def __init__(self, device: DeviceInfo):
    super().__init__(device)
    self.state: Any = device.state
    self.mems: dict[int, Any] = {}  # GPU address -> the driver's record of that allocation
    self._bounce: bytearray | None = None  # the host buffer copies to another device are staged through (made once)
    self._bounce_lock = threading.Lock()

  def _free_memory(self, mem: Any) -> None: raise NotImplementedError

  def _free(self, handle: int, nbytes: int, options: Any) -> None:
    st = self.state
    with st.lock:
      mem = self.mems.pop(handle)
      if st.broken: return  # the GPU may still hold it; the process is going to exit anyway
      st.synchronize()
      self._free_memory(mem)

  def _offset(self, handle: int, offset: int, nbytes: int) -> int: return handle + offset

  def _copyin(self, dest: int, src: memoryview) -> None: self.staging.copyin(dest, buffer_address(src), src.nbytes)

  def _copyout(self, dest: memoryview, src: int) -> None: self.staging.copyout(buffer_address(dest), src, dest.nbytes)

  def peer_path(self, dest_dev: Any) -> str:
    return "staged through host memory (no peer mappings: device to host on one GPU, then host to device on the other)"

  def _peer_copy(self, dest: int, src: int, nbytes: int, dest_dev: Any) -> bool:
    """A copy from this device to another one of the backend without host memory (a peer mapping), ordered with both
    devices' queued work: True when done, False to have it staged. A backend with peer mappings overrides this and
    peer_path (plugrt-nv: plugrt_nv/peer.py)."""
    return False

  def _transfer(self, dest: int, src: int, nbytes: int, src_dev: Any, dest_dev: Any) -> None:
    if src_dev is dest_dev: return self._copy(dest, src, nbytes)
    if self._peer_copy(dest, src, nbytes, dest_dev): return
    # between two GPUs through the host (peer_path says so, and the core warns once a pair), in pieces through one
    # host buffer kept for the next copy: a fresh buffer each copy would pay its page faults every time
    with self._bounce_lock:
      if self._bounce is None or len(self._bounce) < min(nbytes, STAGED_PIECE): self._bounce = bytearray(min(nbytes, STAGED_PIECE))
      host = memoryview(self._bounce)
      for off in range(0, nbytes, len(host)):
        piece = host[:min(len(host), nbytes - off)]
        src_dev.allocator._copyout(piece, src + off)
        dest_dev.allocator._copyin(dest + off, piece)


# ---------------------------------------------------------------- HCQ: programs and graphs of user-space-queue devices

class HCQState(DeviceState):
  """What a user-space-queue device's state gives its programs and graphs (NV, AMD through KFD or PCI, QCOM).

  `lock` is held around everything that writes the device's submission state (command memory, rings, timelines, the
  programs' resident launches), so threads take turns. A program's launch returns the timeline value that says it
  finished; `launch_wait(value)` waits for it (bounded: faults and timeouts are the backend's QueueError). Where the
  device measures launches by its own clock, `launch_clock_start()` resets that measure before a timed launch and
  `launch_seconds()` reads it after (None: the device has none, the host's clock is used)."""
  lock: Any

  def publish_queued(self) -> None:
    """Tell the GPU of the launches a graph queued (PreparedCall.queue, where a program gives one)."""

  def launch_wait(self, value: int) -> None:
    """Wait for a launch's timeline value (this default: the state's own `wait`, as a Timeline has it)."""
    self.wait(value)  # type: ignore[attr-defined]
  def launch_clock_start(self) -> None: pass
  def launch_seconds(self) -> float | None: return None


class HCQProgram(LockedProgram):
  """A program on an HCQState device. The launch is the core's (plugrt.runtime.Program), under the device's lock; the
  backend supplies only its command encoding: _encode makes the launch's descriptor and arguments (a QMD and constant
  bank, an AQL packet and kernarg block, CP words) into a PreparedCall whose submit writes its commands and returns
  their timeline value. A prepared call stays valid while it lives, whatever the program launches after it (a backend
  whose resident launch memory is shared between calls overrides _graph_encode to give a graph's launches their own).
  A timed launch (wait=True) waits for that value and returns the device's own measure of it where it has one."""

  def __init__(self, device: Any, name: str, lib: bytes, signature: Signature):
    super().__init__(device, name, lib, signature)
    self.state: HCQState = device.info.state
    self.launch_lock = self.state.lock

  def _timed(self, prepared: PreparedCall) -> float:
    st = self.state
    st.launch_clock_start()
    t = time.perf_counter()
    st.launch_wait(self._submit_timed(prepared))
    host = time.perf_counter() - t
    return host if (gpu := st.launch_seconds()) is None else gpu

  def _submit_timed(self, prepared: PreparedCall) -> int:
    """Submit a launch whose time is measured; its timeline value (a backend that marks the start overrides this)."""
    return prepared.submit()

  def _graph_step(self, launch: Launch) -> PreparedCall:
    with self.launch_lock: return self._graph_encode(launch)

  def _graph_encode(self, launch: Launch) -> PreparedCall:
    """A prepared call of `launch` for a graph, valid while the graph lives."""
    return self._prepare(NO_CALL, launch.bufs, launch.vals, launch.global_size, launch.local_size)


class HCQGraph(Graph):
  """A fixed batch of launches on one HCQState device: each launch prepared once, for the graph alone
  (HCQProgram._graph_encode), and a replay submits them in order under the device's lock, so that no other thread's
  work falls between them. Where every launch's prepared call can be queued (a `queue` that writes the launch without
  telling the GPU), a replay queues them all and tells the GPU once (HCQState.publish_queued: one doorbell for the
  batch). The backends' plugrt_graph hooks return this class."""

  def _replay(self) -> None:
    if (steps := self._steps) is None:
      steps = self._steps = [ln.program._graph_step(ln) for ln in self.launches]
      self._queues = [q for s in steps if (q := getattr(s, "queue", None)) is not None]
    st = self.device.info.state
    with st.lock:
      if len(self._queues) == len(steps):
        for queue in self._queues: queue()
        st.publish_queued()
      else:
        for step in steps: step.submit()
