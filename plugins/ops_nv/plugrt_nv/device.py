"""NV's runtime objects: the device state (channels, timeline, command slots), the allocator, programs.

The device-independent parts (timeline, command slots, doorbell rings, resident launches, pinned staging) are
plugrt.hwqueue's; what is here is how NV uses them and encodes its commands.

Everything the GPU runs goes through one timeline (hwqueue.Timeline): every submission, on the compute or the copy
channel, ends by writing the next value of a 32-bit counter in host memory (with the GPU's timestamp beside it), and
a submission that follows one on the other channel first makes that channel wait for the previous value. Waiting is
reading that counter; it is bounded (PLUGRT_NV_TIMEOUT seconds, 30 by default) and checks the driver's error
notifiers, so a faulting or hung kernel becomes an NVError with the driver's reason, never a hang.

Commands live in a ring of fixed slots (hwqueue.CommandSlots) in GPU memory that the CPU writes (write-combined). A program keeps its
launch descriptors (QMD + constant bank 0 with the arguments) in a few resident entries of its own, one per set of
arguments; a launch whose arguments an entry holds writes 12 words into a slot (invalidate the SMs' data caches,
start the grid, release the timeline), appends one GPFIFO entry, fences (sfence), moves GP_PUT and writes the
channel's token to the doorbell: no system call, and one call into machine code (plugrt_nv.fastlaunch; its cost:
docs/performance.md). A launch after new code or constants were written, after work on the copy channel, or with
wait=True (timing) takes the general path (full cache invalidation, a wait for the copy channel, timestamps).

Host copies go through two pinned staging buffers and the copy engine, the CPU side in parallel pieces; device
copies from 1 MiB run as a kernel (the SMs move device memory far faster than the copy engine: docs/backends/nv.md).
"""
from __future__ import annotations

import bisect
import ctypes
import struct
import weakref
from collections.abc import Callable
from functools import partial
from typing import Any, NoReturn

from plugrt.compiler.ir import Signature
from plugrt.dtype import dtypes
from plugrt.errors import CompileError, UnsupportedError
from plugrt.hookspecs import DeviceInfo
from plugrt.hwqueue import (
  DoorbellRing,
  HCQProgram,
  HCQState,
  PinnedStaging,
  ResidentLaunches,
  StagedAllocator,
  Timeline,
  queue_timeout,
  round_up,
)
from plugrt.launchargs import PreparedCall, bytes_packer
from plugrt.probing import install_hint
from plugrt.runtime import Launch, LaunchLimits
from plugrt_nv import cmd, cubin, fastlaunch, hw, nvdec
from plugrt_nv.iface import Channel, GPUInterface, Mem, NVError

M32 = 0xFFFFFFFF
SLOT, SLOTS, ENTRIES = 4096, 512, 0x4000   # command slots (one per submission in flight), GPFIFO entries per channel
VIDEO_ENTRIES = 2048                       # GPFIFO entries of the video channel
CBUF_OFF = 512                             # in a launch slot: QMD at 0 (256-aligned), constant bank 0 at 512 (64-aligned), commands after it
SHARED_WINDOW, LOCAL_WINDOW = 0x7E00_0000_0000, 0x7F00_0000_0000  # generic-address windows, 4 GiB aligned, far from every buffer
FENCE = bytes.fromhex("0faef8c3")         # sfence; ret: write-combined stores reach the GPU before the doorbell does
MAX_SHARED = 227 << 10
KERNEL_COPY_MIN = 1 << 20                  # device-to-device copies from this size run as a kernel
#: the copy kernel's shape (bench/nv_copy_variants.py measures the alternatives; docs/performance.md has the figures):
#: 16-byte loads in flight per thread, then (threads per block, blocks per multiprocessor) below COPY_LARGE bytes and
#: from it: small grids start sooner, large ones keep more loads in flight (a grid-stride loop covers the rest)
COPY_INFLIGHT, COPY_SMALL, COPY_LARGE_SHAPE, COPY_LARGE = 4, (256, 8), (1024, 16), 64 << 20


def copy_kernel_source(inflight: int = COPY_INFLIGHT) -> str:
  """The device-to-device copy kernel: `inflight` 16-byte loads per thread issued before their stores (aligned
  ranges), a grid-stride loop, bytes one at a time at the tail and for unaligned ranges."""
  loads = ", ".join(f"a{j} = S[k + {j} * step]" for j in range(inflight))
  stores = " ".join(f"D[k + {j} * step] = a{j};" for j in range(inflight))
  return rf"""extern "C" __global__ void plugrt_nv_copy(unsigned long long d, unsigned long long s, unsigned long long n) {{
  unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x, step = (unsigned long long)gridDim.x * blockDim.x, k;
  if (((d | s) & 15) == 0) {{
    unsigned long long n16 = n >> 4;
    const uint4* S = (const uint4*)s;
    uint4* D = (uint4*)d;
    for (k = i; k + {inflight - 1} * step < n16; k += {inflight} * step) {{
      uint4 {loads};
      {stores}
    }}
    for (; k < n16; k += step) D[k] = S[k];
    for (k = (n16 << 4) + i; k < n; k += step) ((unsigned char*)d)[k] = ((const unsigned char*)s)[k];
  }} else {{
    for (k = i; k < n; k += step) ((unsigned char*)d)[k] = ((const unsigned char*)s)[k];
  }}
}}"""
FAST_WORDS, FAST_PAYLOAD = 12, 36          # a fast-path launch: invalidate data (2 words), start a QMD (4), release (6; payload at byte 36)
FAST_ENTRY = 1 << 41 | FAST_WORDS << 42    # its GPFIFO entry's flags and length
_ADDRESS = struct.Struct("<Q").pack_into  # a buffer's address into constant bank 0


class NVState(Timeline, HCQState):  # Timeline first: its synchronize() is the device's
  """One GPU opened through an interface: its channels, the timeline (inherited: `value`, `done`, `wait`), the
  command slots, local memory."""
  error = NVError

  def __init__(self, info: DeviceInfo):
    iface: GPUInterface | None = info.iface_object
    if iface is None: raise UnsupportedError("NV needs an interface to reach the GPU, and none was opened", install_hint("plugrt-nv-nvk"))
    # the launch counters the fast launch's machine code shares (plugrt_nv.fastlaunch): first, as `value` and `fast` are views of it
    self.shared = fastlaunch.State()
    self.iface, self.index, self.broken, self.closed = iface, info.index, "", False
    # held around everything that writes the submission state (slots, rings, timeline, staging, programs' entries): one
    # device's commands go through one sequence of slots, so threads launching or copying on it take turns
    self.lock = fastlaunch.DeviceLock(self.shared)
    fam = iface.classes.family
    if fam.cbuf0 is None:
      raise UnsupportedError(f"NV:{info.index} is a {fam.name} GPU: plugrt-nv does not know its constant-bank layout yet, so it cannot launch there",
                             "use the CUDA device (plugrt-cuda) on this GPU")
    self.family, self.layout, self.arch = fam, hw.QMD[fam.qmd], iface.arch
    from plugrt import machinecode
    addr = machinecode.code(FENCE)
    if addr is None: raise UnsupportedError("NV needs an executable page for its store fence (x86-64, no W^X policy)", "use the CUDA device")
    self._fence = ctypes.PYFUNCTYPE(None)(addr)  # keeps the GIL: a fence takes nanoseconds, and the device lock is held around it
    ctx = info.context
    timeout = queue_timeout(ctx, "PLUGRT_NV_TIMEOUT")
    kind = ctx.choice("PLUGRT_NV_SLOTS", ("mapped", "host"), "mapped")  # where the command slots live: GPU memory the CPU writes, or host memory
    doorbell = ctypes.c_uint32.from_address(iface.doorbell)
    compute, copy = iface.channels(ENTRIES)
    self.compute, self.copy = self._ring(compute, doorbell, self.shared), self._ring(copy, doorbell)
    self.video: DoorbellRing | None = None  # the video decode engine's channel, opened by the first stream (video_ring)
    self.signals = iface.alloc(0x1000, "host")
    self.sem, self.ts = self.signals.va, self.signals.va + 16  # the timeline (value, pad, timestamp) and a start-timestamp slot
    Timeline.__init__(self, self.sem, timeout=timeout, label=f"NV:{info.index}", setting="PLUGRT_NV_TIMEOUT")
    self.last: DoorbellRing | None = None
    self.slots_mem = iface.alloc(SLOT * SLOTS, kind)
    self.slots = fastlaunch.SharedSlots(self.shared, self.slots_mem.va, SLOT, SLOTS)
    # per slot, the generation of the resident entry whose fast-path words it holds, 0 for any other: a launch repeating
    # what its slot holds writes only the release's payload word (slot_words: the slots as 32-bit words)
    self.slot_holds = (ctypes.c_uint64 * SLOTS)()
    self.slot_words = self.slots.view.cast("I")
    # per slot, the fast path's GPFIFO entry and the index of its payload word in slot_words (looked up, not computed, per launch)
    self.fast_entries = [self.slots.address(i) | FAST_ENTRY for i in range(SLOTS)]
    self.fast_payloads = [(i * SLOT + FAST_PAYLOAD) >> 2 for i in range(SLOTS)]
    self._gp_entries = (ctypes.c_uint64 * SLOTS)(*self.fast_entries)
    fs, ring = self.shared, self.compute
    fs.counter, fs.ring, fs.ring_mask, fs.token = self.sem, ctypes.addressof(ring.ring), ring.entries - 1, ring.token
    fs.put_register, fs.doorbell = ctypes.addressof(ring.put_register), ctypes.addressof(ring.doorbell)
    fs.slots, fs.slot_size, fs.slot_mask, fs.payload = self.slots_mem.va, SLOT, SLOTS - 1, FAST_PAYLOAD
    fs.last_use, fs.holds, fs.gp_entries = (ctypes.addressof(a) for a in (self.slots.last_use, self.slot_holds, self._gp_entries))
    self.slm, self.local_mem = 0, None
    # other GPUs (plugrt_nv.peer): semaphores of theirs the next submission here waits for (address -> value), the links
    # from this GPU, the GPUs linked either way, and which of this GPU's allocations their copies read (address -> {GPU: value})
    self.after: dict[int, int] = {}
    self.links: dict[NVState, Any] = {}
    self.partners: set[NVState] = set()
    self.lent: dict[int, dict[NVState, int]] = {}
    # may the next launch take the fast path? Not after work on the copy channel (the launch must wait for it), nor after new
    # code or constants were written where the GPU may have cached old ones (the launch invalidates those caches first)
    self.fast = False
    self.submit(self.compute, cmd.compute_setup(iface.classes.compute, SHARED_WINDOW, LOCAL_WINDOW))
    self.submit(self.copy, cmd.copy_setup(iface.classes.copy))
    try: self.wait(self.value, timeout=min(self.timeout, 10.0))
    except NVError as e:
      raise NVError(f"NV:{info.index} opened, but the GPU did not run its first commands: {e.message}",
                    "the channel, doorbell or semaphore path does not work with this GPU and driver; use the CUDA device") from None
    self.ensure_local(hw.LOCAL_ABI)

  @staticmethod
  def _ring(ch: Channel, doorbell: ctypes.c_uint32, shared: fastlaunch.State | None = None) -> DoorbellRing:
    """A channel's GPFIFO as a doorbell ring: 8-byte entries, GP_PUT wraps, the doorbell takes the channel's token
    (with `shared`: its put counter that State's, for the compute channel the fast launch appends to)."""
    args = (ch.name, (ctypes.c_uint64 * ch.entries).from_address(ch.ring), ch.entries,
            ctypes.c_uint32.from_address(ch.userd + hw.USERD_GP_PUT), ctypes.c_uint32.from_address(ch.userd + hw.USERD_GP_GET), doorbell, ch.token)
    if shared is None: return DoorbellRing(*args)
    if ch.entries & (ch.entries - 1): raise NVError(f"internal: the compute channel has {ch.entries} GPFIFO entries, not a power of two")
    return fastlaunch.SharedRing(shared, *args)

  # the timeline's value and whether a launch may take the fast path: the State's (the machine code reads and writes them)
  @property  # type: ignore[override]
  def value(self) -> int: return self.shared.value

  @value.setter
  def value(self, v: int) -> None: self.shared.value = v

  @property
  def fast(self) -> bool: return bool(self.shared.fast)

  @fast.setter
  def fast(self, on: bool) -> None: self.shared.fast = on

  # ------------------------------------------------------------ submission
  def _kick(self, ch: DoorbellRing, va: int, nwords: int, value: int, slot: int) -> None:
    ch.push(va | 1 << 41 | nwords << 42)
    # The fence comes before GP_PUT: a busy channel reads GP_PUT on its own, without waiting for the doorbell, and
    # write-combined stores reach the GPU in any order, so it could fetch the new entry, or run the slot's words of
    # an earlier launch, before they arrive (dependent launches read stale data that way: docs/hardware.md).
    # The doorbell is an uncached store, which drains the write-combining buffers (GP_PUT) before it.
    self._fence()
    ch.publish()
    self.value, self.slots.last_use[slot], self.last = value, value, ch
    self.slot_holds[slot] = 0
    if ch is not self.compute: self.fast = False

  def submit(self, ch: DoorbellRing, body: list[int]) -> int:
    """Run `body` (command words) on channel `ch` after everything submitted before; returns its timeline value."""
    with self.lock:
      if self.broken: raise NVError(f"NV:{self.index} cannot run more work: {self.broken}", "restart the process")
      slot = self.slots.take(self)
      va, value = self.slots.address(slot), self.value + 1
      words = self.waits(ch) + body
      if ch is self.copy: words += cmd.copy_release(self.sem, value)
      elif ch is self.video: words += nvdec.release(self.sem, value)
      else: words += cmd.sem_release(self.sem, value)
      if len(words) * 4 > SLOT: raise NVError(f"internal: {len(words)} command words do not fit a {SLOT}-byte slot")
      data = cmd.words(words)
      ctypes.memmove(va, data, len(data))
      self._kick(ch, va, len(words), value, slot)
      return value

  def waits(self, ch: DoorbellRing) -> list[int]:
    """The acquires a submission on `ch` starts with: the previous submission when it was on another channel, and
    whatever another GPU's work asked this GPU's next submission to wait for (wait_for; consumed here)."""
    words = cmd.sem_acquire(self.sem, self.value) if self.last is not ch else []
    if self.after:
      for sem, value in self.after.items(): words += cmd.sem_acquire(sem, value)
      self.after.clear()
    return words

  def wait_for(self, sem: int, value: int) -> None:
    """Make this GPU's next submission (on any channel) wait until another GPU's timeline at `sem`, mapped into this
    GPU's VA space, reaches `value`. Later submissions follow it (each channel waits for the other's last one)."""
    with self.lock:
      self.after[sem] = max(value, self.after.get(sem, 0))
      self.fast = False  # the fast launch path writes no acquire

  def video_ring(self) -> DoorbellRing:
    """The channel on the video decode engine (opened once, with the video decoder object): NVError when it cannot be."""
    with self.lock:
      if self.video is None:
        ring = self._ring(self.iface.video_channel(VIDEO_ENTRIES), ctypes.c_uint32.from_address(self.iface.doorbell))
        self.video = ring
        value = self.submit(ring, nvdec.set_object(self.iface.classes.video))
        try: self.wait(value, timeout=min(self.timeout, 10.0))
        except NVError as e:
          raise NVError(f"NV:{self.index}'s video channel opened, but the engine did not run its first commands: {e.message}",
                        "the video engine path does not work with this GPU and driver; decode on the CUDA device or in software") from None
      return self.video

  # ------------------------------------------------------------ waiting (Timeline's wait, with the driver's account of faults)
  def fault(self) -> str: return self.iface.fault()  # the error notifiers: plain memory reads

  def fault_report(self) -> str:
    rings = ", ".join(f"{c.name} ring GP_GET {c.consumed()} / GP_PUT {c.put % c.entries}" for c in (self.compute, self.copy))
    return f"{self.iface.fault(deep=True) or 'the driver reports no channel error'} ({rings})"

  def fail(self, what: str, value: int | None = None, timed_out: bool = False) -> NoReturn:
    self.fast = False
    super().fail(what, value, timed_out)

  # ------------------------------------------------------------ a launch's wait and its time (HCQState)
  def publish_queued(self) -> None:
    """Tell the GPU of the launches queued on the compute channel (their slots and ring entries first: see _kick)."""
    self._fence()
    self.compute.publish()

  def launch_seconds(self) -> float | None:
    """A timed launch's duration by the GPU's clock: its start timestamp (written before the grid) to its release's."""
    t0, t1 = ctypes.c_uint64.from_address(self.ts + 8).value, ctypes.c_uint64.from_address(self.sem + 8).value
    return (t1 - t0) / 1e9 if 0 < t1 - t0 < 10 ** 12 else None


  def ensure_local(self, need: int) -> None:
    """Enough local memory (stacks) for `need` bytes per thread on every thread the GPU can hold at once."""
    with self.lock:
      if need <= self.slm: return
      g, slm = self.iface.gr, round_up(need, 32)
      per_tpc = round_up(round_up(slm * 32, 0x200) * g["warps_per_sm"] * g["sm_per_tpc"], 0x8000)
      mem = self.iface.alloc(round_up(per_tpc * g["tpc_per_gpc"] * g["gpcs"], 0x20000), "device")
      self.submit(self.compute, cmd.local_memory(mem.va, per_tpc))
      self.synchronize()
      if self.local_mem is not None: self.iface.free(self.local_mem)
      self.local_mem, self.slm = mem, slm

  def close(self) -> None:
    if self.closed: return
    self.closed, self.fast = True, False  # no launch writes into its slots once they are unmapped (the general path sees `broken`)
    from plugrt_nv import peer
    try:
      if not self.broken: self.synchronize()
    finally:
      try: peer.forget(self)  # GPUs that read this one's memory or wait on its timeline finish first, and forget it
      finally:
        self.iface.close()
        self.broken = self.broken or f"NV:{self.index} was closed"  # buffers freed later leave its (gone) memory alone


class NVStaging(PinnedStaging):
  """Host copies through two pinned staging buffers in host memory and the copy engine; a staging buffer's token is
  the timeline value of the copy that used it (the copy channel runs in submission order)."""

  def __init__(self, state: NVState, chunk: int, piece: int):
    # pieces of the CPU copy start on page boundaries; below two pieces one thread copies
    super().__init__(state.lock, chunk=chunk, buffers=2, parallel_min=piece * 2, align=4096, thread_name="plugrt-nv-copy")
    self.state = state
    self.mems: list[Mem] = []

  def _new_buffer(self) -> int:
    self.mems.append(mem := self.state.iface.alloc(self.chunk, "host"))
    return mem.va

  def _to_device(self, dest: int, k: int, n: int) -> int:
    st = self.state
    return st.submit(st.copy, cmd.copy(dest, self.buffers[k], n))

  def _from_device(self, k: int, src: int, n: int) -> int:
    st = self.state
    return st.submit(st.copy, cmd.copy(self.buffers[k], src, n))

  def _wait(self, token: int) -> None: self.state.wait(token)


class NVAllocator(StagedAllocator):
  """GPU memory in the device's VA space; a handle is its GPU address. Host copies go through two pinned staging
  buffers and the copy engine (NVStaging); device-to-device copies are one copy-engine command, or a kernel."""
  STAGE, PIECE = 64 << 20, 4 << 20  # two staging buffers of 64 MiB, CPU copies in up to 16 pieces: what the CUDA backend found best here
  kcopy: Any = None  # the device-to-device copy kernel (None: not built yet, False: not available)

  def __init__(self, device: DeviceInfo):
    super().__init__(device)
    self.state: NVState = device.state
    self.staging = NVStaging(self.state, self.STAGE, self.PIECE)
    self.bases: list[int] = []  # the allocations' addresses, sorted (find)

  def _alloc(self, nbytes: int, options: Any) -> int:
    with self.state.lock:
      mem = self.state.iface.alloc(nbytes, "device")
      self.mems[mem.va] = mem
      bisect.insort(self.bases, mem.va)
    return mem.va

  def _free_memory(self, mem: Mem) -> None:
    st = self.state
    for reader, value in st.lent.pop(mem.va, {}).items():  # copies on other GPUs that read it (plugrt_nv.peer)
      if not reader.broken: reader.wait(value)
    for ln in st.links.values(): ln.mapped.discard(mem.va)  # the interface's free unmaps it from every GPU
    self.bases.remove(mem.va)
    st.iface.free(mem)

  def find(self, addr: int, nbytes: int) -> Mem | None:
    """The allocation that holds [addr, addr + nbytes), or None."""
    i = bisect.bisect_right(self.bases, addr) - 1
    mem = self.mems.get(self.bases[i]) if i >= 0 else None
    return mem if mem is not None and addr + nbytes <= mem.va + mem.size else None

  def peer_path(self, dest_dev: Any) -> str:
    """"peer" when copies from this GPU to `dest_dev` go through a peer mapping, else how they are staged and why."""
    from plugrt_nv import peer
    return peer.link(self.state, dest_dev.allocator.state).path

  def _peer_copy(self, dest: int, src: int, nbytes: int, dest_dev: Any) -> bool:
    from plugrt_nv import peer
    ln = peer.link(self.state, dest_dev.allocator.state)
    if ln.why: return False
    with self.state.lock: mem = self.find(src, nbytes)  # (a Buffer's memory is always one allocation of this allocator)
    # a large copy runs as the destination's copy kernel, reading the source through the peer mapping: one copy
    # engine falls well short of NVLink's rate, which the SMs reach (docs/multi-gpu.md)
    kernel = dest_dev.allocator._kernel_copier() if nbytes >= KERNEL_COPY_MIN else None
    return mem is not None and ln.copy(dest, src, nbytes, mem, kernel)

  def _copy(self, dest: int, src: int, nbytes: int) -> None:
    """Device to device: large copies between ranges that do not overlap run as a kernel (the SMs move memory far
    faster than one copy engine: docs/backends/nv.md);
    the rest, and everything when no kernel compiler is here, go through the copy engine."""
    st = self.state
    if nbytes >= KERNEL_COPY_MIN and (dest + nbytes <= src or src + nbytes <= dest) and (copy := self._kernel_copier()) is not None:
      copy(dest, src, nbytes)
      return
    st.submit(st.copy, cmd.copy(dest, src, nbytes))

  def _kernel_copier(self) -> Any:
    """A function (dest, src, nbytes) that queues the copy kernel on this GPU's compute channel, or None without one."""
    if (prg := self._copy_kernel()) is None: return None
    sms = self.state.iface.gr.get("sms", 1)

    def copy(dest: int, src: int, nbytes: int) -> None:
      threads, per_sm = COPY_LARGE_SHAPE if nbytes >= COPY_LARGE else COPY_SMALL
      blocks = max(1, min(-(-nbytes // (threads * 16)), sms * per_sm))
      prg(global_size=(blocks, 1, 1), local_size=(threads, 1, 1), vals=(dest, src, nbytes))
    return copy

  def _copy_kernel(self) -> Any:
    if self.kcopy is None:
      self.kcopy = False
      try:
        from types import SimpleNamespace

        from plugrt_nvidia_toolchain import nvrtc
        env = self.device.context.env
        if nvrtc.available(env):
          lib = nvrtc.compile_cubin(copy_kernel_source(), self.state.arch, env)
          shim = SimpleNamespace(info=SimpleNamespace(state=self.state), allocator=self)
          self.kcopy = NVProgram(shim, "plugrt_nv_copy", lib, Signature((), (dtypes.uint64,) * 3))
      except Exception: self.kcopy = False  # no NVRTC, or it failed: the copy engine does it
    return self.kcopy or None


def _release_program(state: NVState, *mems: Mem) -> None:
  try:
    with state.lock:
      if not state.broken:
        state.synchronize()
        for mem in mems: state.iface.free(mem)
  except Exception: pass  # interpreter shutdown, or a device that failed meanwhile


class _Launch(PreparedCall):
  """A launch's QMD and constant bank 0 (`blob`, with the constant bank's address left 0: wherever it goes patches its
  own), the resident entry holding them (None: they travel in the launch's command slot), and `queue`: the launch
  written without telling the GPU (HCQGraph's batches)."""
  __slots__ = ("__weakref__", "blob", "entry", "queue")


class NVProgram(HCQProgram):
  """A cubin loaded into GPU memory, with prepared launches. A launch descriptor (QMD) and its constant bank 0 (the
  arguments) are written once per set of arguments into one of the program's own resident entries in GPU memory that
  the CPU writes; a launch with arguments an entry already holds then writes only its 12 command words (start that
  QMD, release the timeline) into a command slot and rings the doorbell. Up to ENTRIES argument sets stay resident
  (alternating buffers, as in a chain of dependent launches, stay on that path); an entry is rewritten only once the
  GPU has finished every launch that used it, and when none is free the launch carries its QMD and constant bank in
  its command slot instead."""
  ENTRIES = 4
  scalar_packer = staticmethod(bytes_packer)  # each scalar's bytes (IEEE rounding, out of range: inf)
  self_contained = True  # a launch is its blob (an entry rewritten since sends the blob in a slot): Program.self_contained

  def __init__(self, device: Any, name: str, lib: bytes, signature: Signature):
    super().__init__(device, name, lib, signature)
    st: NVState = self.state
    k = cubin.parse(lib, name)
    want = [8] * self.nbufs + [dt.itemsize for dt in signature.scalars]
    if [s for _, s in k.params] != want:
      raise CompileError(f"cubin for {name} takes parameters of sizes {[s for _, s in k.params]}, its signature needs {want}")
    with st.lock: self.mem = st.iface.alloc(len(k.image) + 0x1000, "device")  # room after the code: the SMs prefetch instructions past its end
    device.allocator._copyin(self.mem.va, memoryview(k.relocated(self.mem.va)))
    st.fast = False
    st.ensure_local(k.stack + hw.LOCAL_ABI)
    shared = round_up(hw.SHARED_RESERVE + k.shared, 256)
    if shared > MAX_SHARED: raise UnsupportedError(f"kernel {name} needs {shared} bytes of shared memory; a block may have {MAX_SHARED}")
    L, fam = st.layout, st.family
    q = cmd.Qmd(L).set("major", L.version).set("call_limit", 1).set("cwd_membar", hw.CWD_MEMBAR_SYSMEMBAR)
    for f in ("inv_texture_header", "inv_texture_sampler", "inv_texture_data", "inv_shader_data"): q.set(f, 1)
    if "type" in L.fields: q.set("type", hw.QMD_TYPE_GRID_CTA)
    if "sm_global_caching" in L.fields: q.set("sm_global_caching", 1)
    if L.version != 4:  # what the drivers that run v3 and v5 write; Hopper's v4 runs with these left zero
      q.set("group_id", 0x3F).set("sampler_index", 1).set("sass_version", (st.iface.sm_version >> 4 & 0xF0) | (st.iface.sm_version & 0xF))
    q.set_program(self.mem.va + k.entry).set("regs", k.regs).set("barriers", max(1, k.barriers)).set_shared(shared)
    carve = next(c for c in fam.carveouts_kb if c << 10 >= shared)
    q.set("smem_min", carve // 4 + 1).set("smem_target", carve // 4 + 1).set("smem_max", fam.carveouts_kb[-1] // 4 + 1)
    q.set_local_high(st.slm)
    for bank, (off, size) in k.banks.items(): q.set_cbuf(bank, self.mem.va + off, round_up(size, 16))
    cb0 = round_up(len(k.cbuf0), 16)
    q.set_cbuf(0, 0, cb0)
    self.qmd, self.cbuf_patch = q, q.cbuf_patch(0)
    self.cmd_off = CBUF_OFF + cb0  # QMD + constant bank 0: what an entry holds; in a slot, the command words follow
    if self.cmd_off + 24 * 4 > SLOT:
      raise UnsupportedError(f"kernel {name} has {k.params[-1][0] + k.params[-1][1] if k.params else 0} bytes of parameters; NV takes up to "
                             f"{SLOT - 24 * 4 - CBUF_OFF - k.param_base}")
    self.blob = bytearray(self.cmd_off)
    self.blob[CBUF_OFF:CBUF_OFF + len(k.cbuf0)] = k.cbuf0
    block, grid, windows, stack = fam.cbuf0
    struct.pack_into("<QQ", self.blob, CBUF_OFF + windows, SHARED_WINDOW, LOCAL_WINDOW)
    struct.pack_into("<I", self.blob, CBUF_OFF + stack, hw.STACK_TOP)
    self.block_off, self.grid_off = CBUF_OFF + block, CBUF_OFF + grid
    self.arg_offs = [CBUF_OFF + k.param_base + off for off, _ in k.params]
    self.max_threads = min(1024, 65536 // round_up(max(1, k.regs) * 32, 256) // 4 * 4 * 32)
    # the QMD's grid (x < 2**31, y and z < 65536) and block (1024, 1024, 64) fields; threads per block as this kernel's registers allow
    self.launch_limits = LaunchLimits(str(device), ((1 << 31) - 1, 65535, 65535), (1024, 1024, 64), self.max_threads)
    self.kernel = k
    # resident launches: each a QMD with its constant bank 0 (the descriptor), in GPU memory the CPU writes
    self.entry_size = round_up(self.cmd_off, 256)
    with st.lock: self.res = st.iface.alloc(self.entry_size * self.ENTRIES, "mapped")
    self.resident = ResidentLaunches(self.res.va, self.entry_size, self.ENTRIES, fastlaunch.SharedEntry)
    self.entries = self.resident.entries  # the launch path searches this list inline
    weakref.finalize(self, _release_program, st, self.mem, self.res)

  # ---- under the device's lock (the launch lock): its slots, rings and timeline, and this program's entries
  def _encode(self, bufs: tuple, scalars: tuple, gs: tuple[int, int, int], ls: tuple[int, int, int]) -> _Launch:
    """The launch's QMD and constant bank 0, and the resident entry that holds the same bytes."""
    blob = self.blob
    self.qmd.set_dims(gs, ls)
    blob[:len(self.qmd.buf)] = self.qmd.buf
    struct.pack_into("<3I", blob, self.block_off, *ls)
    struct.pack_into("<3I", blob, self.grid_off, *gs)
    for o, arg in zip(self.arg_offs[self.nbufs:], scalars): blob[o:o + len(arg)] = arg
    off, _, hi = self.cbuf_patch
    struct.pack_into("<II", blob, off, 0, hi)  # the constant bank's address: wherever the blob goes patches its own
    return self._launch_of(blob, bufs)

  def _rebind(self, last: PreparedCall, bufs: tuple) -> _Launch:
    """last's QMD and constants (its blob) with other buffers' addresses: no QMD field is set again."""
    assert isinstance(last, _Launch)
    return self._launch_of(bytearray(last.blob), bufs)

  def _launch_of(self, blob: bytearray, bufs: tuple) -> _Launch:
    """The launch of `blob` (QMD and constant bank 0 but for the buffers) with `bufs`' addresses put in."""
    for o, b in zip(self.arg_offs, bufs): _ADDRESS(blob, o, b.handle)
    p = _Launch()
    p.entry = self._resident(key := bytes(blob))
    p.blob = key if p.entry is None else p.entry.key  # the entry's own bytes object: its launches check `e.key is blob`
    p.submit, p.queue, p.unlocked = self._submitters(p.entry, p.blob)
    return p

  def _resident(self, blob: bytes) -> fastlaunch.SharedEntry | None:
    """The resident entry holding `blob`: one that holds it already, a free one (its launches done) rewritten, a new
    one, or None (all busy: the launch carries its QMD and constants in its command slot)."""
    for e in self.entries:
      if e.key == blob: return e
    if (e := self.resident.claim(self.state.completed())) is None: return None
    assert isinstance(e, fastlaunch.SharedEntry)
    self._write_entry(e, blob)
    return e

  def _write_entry(self, e: fastlaunch.SharedEntry, blob: bytes) -> None:
    """`blob` into the entry's descriptor memory (its constant bank's address patched in), and the entry's fast-path words."""
    st = self.state
    ctypes.memmove(e.descriptor, blob, self.cmd_off)
    self._patch_cbuf(e.descriptor)
    e.key = blob
    st.fast = False  # the GPU may hold the entry's old constants in its caches
    # the fast path's words: invalidate the data caches only, start the grid, release the timeline (no timestamp); each
    # launch writes its release's payload into its slot
    e.commands = cmd.words(cmd.launch(e.descriptor, hw.Compute.INVALIDATE_GLOBAL_DATA) + cmd.sem_release(st.sem, 0, timestamp=False))
    assert len(e.commands) == FAST_WORDS * 4 and e.commands[FAST_PAYLOAD:FAST_PAYLOAD + 4] == bytes(4)
    ctypes.memmove(e.shared.words, e.commands, FAST_WORDS * 4)

  def _patch_cbuf(self, va: int) -> None:
    """Point the QMD at `va` (CPU-writable GPU memory holding a blob) to its constant bank, right after it."""
    off, shift, hi = self.cbuf_patch
    cb = (va + CBUF_OFF) >> shift
    struct.pack_into("<II", (ctypes.c_char * 8).from_address(va + off), 0, cb & M32, hi | cb >> 32)

  def _graph_encode(self, launch: Launch) -> _Launch:
    """A graph's launch holds an entry of its own (the program's entries are rewritten by later launches), freed with it."""
    p = super()._graph_encode(launch)
    assert isinstance(p, _Launch)
    st = self.state
    mem = st.iface.alloc(self.entry_size, "mapped")
    weakref.finalize(p, _release_program, st, mem)
    p.entry = fastlaunch.SharedEntry(mem.va)
    self._write_entry(p.entry, p.blob)
    p.submit, p.queue, p.unlocked = self._submitters(p.entry, p.blob)
    return p

  def _submitters(self, e: fastlaunch.SharedEntry | None, blob: bytes) \
      -> tuple[Callable[[], int], Callable[[], int], Callable[[], int] | None]:
    """The prepared call's (submit, queue, unlocked), each returning the launch's timeline value. `queue` writes the
    launch but does not tell the GPU (a graph tells it once, after its last launch: HCQGraph); `unlocked` submits
    without the device's lock, or declines (0: PreparedCall.unlocked). With a resident entry, the machine code
    (plugrt_nv.fastlaunch) makes the launch where it can, else these closures do: over what every launch of it reads
    (the device's slots and compute ring, the entry's words), so a launch is one Python frame of local reads."""
    st, slot_launch = self.state, self._slot_launch
    if e is None:
      def slotted() -> int: return slot_launch(None, blob, False)
      return slotted, slotted, None
    slots, ch, view, ring, entries, fence = st.slots, st.compute, st.slots.view, st.compute.ring, st.compute.entries, st._fence
    last_use, put_register, doorbell, token, holds, payloads = slots.last_use, ch.put_register, ch.doorbell, ch.token, st.slot_holds, st.slot_words
    gp_entries, payload_at, words, generation = st.fast_entries, st.fast_payloads, e.commands, e.generation

    def queue() -> int:
      # (an entry rewritten since for other bytes, or a device that must invalidate first: the slot path, with this blob,
      # which tells the GPU of everything queued before it too)
      if not st.fast or e.key is not blob: return slot_launch(e if e.key is blob else None, blob, False)
      # the fast path: 12 words into a slot (the payload alone where the slot holds the rest) and a ring entry
      # (CommandSlots.take and DoorbellRing.push, inline)
      i = slots.next
      if last_use[i] > st.done: st.wait(last_use[i])
      slots.next = (i + 1) % SLOTS
      value = st.value + 1
      if holds[i] != generation:
        o = i * SLOT
        view[o:o + FAST_WORDS * 4] = words
        holds[i] = generation
      payloads[payload_at[i]] = value & M32
      put = ch.put
      ring[put % entries] = gp_entries[i]
      ch.put = put + 1
      st.value = last_use[i] = e.last_use = value
      return value

    def submit() -> int:
      value = queue()
      fence()  # the slot and the ring entry first: see _kick
      put_register.value = ch.put % entries  # DoorbellRing.publish, inline
      doorbell.value = token
      return value
    if (native := fastlaunch.functions()) is None: return submit, queue, None
    call = fastlaunch.Call(ctypes.addressof(st.shared), ctypes.addressof(e.shared), generation)
    at, (native_submit, native_queue, native_unlocked) = ctypes.addressof(call), native

    def submit_native() -> int:
      return native_submit(at) or submit()  # (`call` lives with these closures)

    def queue_native() -> int:
      return native_queue(at) or queue()
    submit_native.call = queue_native.call = call  # type: ignore[attr-defined]
    return submit_native, queue_native, None if native_unlocked is None else partial(native_unlocked, at)

  def _slot_launch(self, e: fastlaunch.SharedEntry | None, blob: bytes, timed: bool) -> int:
    """A launch whose commands (and, without a resident entry, its QMD and constants) go in a command slot, after the
    device's pending waits, with a start timestamp when timed; returns its timeline value."""
    st = self.state
    if st.broken: raise NVError(f"NV:{st.index} cannot run {self.name}: {st.broken}", "restart the process")
    slot = st.slots.take(st)
    va, value = st.slots.address(slot), st.value + 1
    if e is None:  # no resident entry free: QMD and constant bank travel in the slot
      ctypes.memmove(va, blob, self.cmd_off)
      self._patch_cbuf(va)
      qmd, c = va, self.cmd_off
    else: qmd, c, e.last_use = e.descriptor, 0, value
    words = st.waits(st.compute) + (cmd.sem_release(st.ts, value) if timed else [])
    words += cmd.launch(qmd) + cmd.sem_release(st.sem, value)  # with the cache invalidation
    struct.pack_into(f"<{len(words)}I", st.slots.view, slot * SLOT + c, *words)
    st._kick(st.compute, va + c, len(words), value, slot)
    st.fast = True
    return value

  def _submit_timed(self, prepared: PreparedCall) -> int:
    assert isinstance(prepared, _Launch)
    return self._slot_launch(prepared.entry, prepared.blob, timed=True)  # a start timestamp before the grid (launch_seconds)
