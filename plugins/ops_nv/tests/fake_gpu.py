"""A fake NV interface for tests without a GPU: the NV-specific part of a fake GPU, on plugrt_testing.fakegpu.

Memory is host memory at the addresses NV asks for (FakeMemory, placed in NV's VA window), and each channel is a
queue thread (FakeDevice.serve) that decodes the real command stream from its GPFIFO ring: host semaphores
(release with a timestamp, circular acquire), the copy engine (linear copies, semaphore release) and compute
launches, whose QMD and constant bank 0 it reads back. A launch of a program registered with `load` runs through
the reference interpreter (DispatchRunner) on the arguments read out of constant bank 0; one registered in
`kernels` runs a Python stand-in given the decoded `Launch`. So everything NV writes for the GPU, the fake reads
the way the hardware documents it.

The decoding is `FakeEngine`: it reaches every address a command names through `at(address, nbytes)`, which here is
the address itself (the fake's memory is host memory at the GPU address); the driverless PCI fake (fake_nvpci.py)
runs the same engine behind its GPU page tables by resolving `at` through them. A program the fake was not told about
with `load` is found among the cubins given to `register` (the session plugins' compilers register each one they
build): the one whose relocated image lies at the launched program's address.

Several fake GPUs of one test share a `FakeRM` (the process's one RM client and UVM file, as plugrt_nv_nvk's
client.py shares them): it answers the P2P caps query (yes, or a reason for no), enables peer access for a pair,
and maps one GPU's allocation into another's VA space. Each fake GPU's copy engine and semaphore acquires only
reach addresses in its own VA space (its memory, and what was mapped into it from a peer), so a peer copy whose
mapping is missing faults as the hardware would."""
from __future__ import annotations

import ctypes
import itertools
import struct
from collections.abc import Callable
from typing import Any

import numpy as np

from plugrt.compiler.ir import Kernel
from plugrt_nv import hw
from plugrt_nv.iface import Channel, GPUInterface, Mem, NVError
from plugrt_nv_nvk.nvk import PAGE, PROCESS_VA
from plugrt_testing.fakegpu import FakeDevice, FakeMemory, acquire, release

HOPPER = {0xCBC0, 0xC8B5, 0xC86F, 0xC661, 0xB8B0}


class FakeRM:
  """The RM client and UVM file fake GPUs share. `p2p`: True (every pair can reach each other's memory) or the
  reason the P2P caps query gives for no. `refs` counts the GPUs open on it; `closed` once the last one closed.
  `calls` records what was asked: ("P2P_CAPS" | "ENABLE_PEER" | "MAP", details...)."""

  def __init__(self, p2p: bool | str = True):
    self.p2p, self.refs, self.closed = p2p, 0, False
    self.gpus: list[FakeGPU] = []
    self.peers: set[frozenset[bytes]] = set()
    self.calls: list[tuple[Any, ...]] = []

  def attach(self, gpu: FakeGPU) -> None:
    assert not self.closed, "a fake GPU opened on a closed client"
    self.refs += 1
    self.gpus.append(gpu)

  def detach(self, gpu: FakeGPU) -> None:
    self.gpus.remove(gpu)
    self.peers = {k for k in self.peers if gpu.uuid not in k}
    for other in self.gpus:  # what this GPU lent is unmapped, what it borrowed goes with its VA space
      for va in [va for va, (_, owner) in other.peer_maps.items() if owner is gpu]: del other.peer_maps[va]
      other.lent = {va: rest for va, borrowers in other.lent.items() if (rest := borrowers - {gpu})}
    self.refs -= 1
    self.closed = self.refs == 0


def block_linear(x: Any, y: Any, pitch: int) -> Any:
  """Byte offsets of byte columns x, rows y (numpy arrays) in a block-linear plane of `pitch` bytes a row, written
  from the GOB description (64 bytes x 8 rows, two GOBs a block; inside: x[3:0], y[1:0], x[4], y[2], x[5])."""
  gob = ((y // 16) * (pitch // 64) + x // 64) * 2 + (y // 8) % 2
  return gob * 512 + x % 16 + (y % 4) * 16 + (x // 16 % 2) * 64 + (y // 4 % 2) * 128 + (x // 32 % 2) * 256


class Launch:
  """What the fake read from a QMD and its constant bank 0."""
  def __init__(self, L: hw.QmdLayout, qmd: bytes):
    n = int.from_bytes(qmd, "little")
    get = lambda f, i=0: n >> L.bits(f, i)[1] & ((1 << (L.bits(f, i)[0] - L.bits(f, i)[1] + 1)) - 1)
    self.grid = (get("grid_x"), get("grid_y"), get("grid_z"))
    self.block = (get("block_x"), get("block_y"), get("block_z"))
    self.program = (get("program_hi") << 32 | get("program_lo")) << L.shifts.get("program", 0)
    self.cbuf0 = (get("cbuf_addr_hi") << 32 | get("cbuf_addr_lo")) << L.shifts.get("cbuf_addr", 0)
    self.cbuf0_size = get("cbuf_size") << 4
    self.valid = get("cbuf_valid")
    self.regs, self.shared, self.major = get("regs"), get("shared_size"), get("major")

  def args(self, base: int, fmt: str) -> tuple:
    return struct.unpack_from(fmt, ctypes.string_at(self.cbuf0 + base, struct.calcsize(fmt)))


class FakeEngine(FakeDevice):
  """The NV command decoder: channel threads that read GPFIFO entries, methods, QMDs and constant banks, applying
  semaphores, copies and launches. `at(address, nbytes)` is where the engine finds GPU memory in this process."""

  def __init__(self, memory: Any, classes: set[int] = HOPPER):
    super().__init__(memory)
    self.classes = hw.pick_classes(classes)  # type: ignore[assignment]
    self.kernels: dict[int, Callable[[Launch], None]] = {}  # program address -> Python stand-in
    self.params: dict[int, tuple[int, list[int]]] = {}      # program address -> (constant bank 0 offset of the parameters, their offsets)
    self.registered: list[tuple[bytes, Kernel]] = []        # cubins a launch may name, with their IR (register)
    self.launches: list[Launch] = []
    self.log: list[tuple[str, int, int]] = []  # (channel, method, data) of every method seen
    self.acquires: list[tuple[str, int, int]] = []  # (channel, address, value) of every semaphore acquire run
    self.pictures: list[tuple[Any, bytes, dict]] = []  # the video engine's pictures: setup, bitstream, the methods in force
    self.video_decode: Callable[[Any, bytes], tuple[Any, Any]] = lambda pic, bits: (_ for _ in ()).throw(AssertionError("no video_decode"))

  def at(self, addr: int, n: int) -> int:
    """The host address where the GPU's [addr, addr + n) lives: here the address itself."""
    return addr

  def visible(self, addr: int, n: int) -> None:
    """The GPU's MMU: [addr, addr + n) must lie in one allocation (a KeyError, the fake's page fault, otherwise)."""
    m = self.memory.find(addr)
    if addr + n > m.va + m.size: raise KeyError(f"the fake GPU has no memory at {addr + n - 1:#x}")

  def load(self, prg: Any, kernel: Kernel) -> None:
    """Run `prg`'s launches (an NVProgram) through the reference interpreter as `kernel`, its IR; where its
    parameters sit in constant bank 0 comes from the cubin, as the compiled code reads them."""
    k = prg.kernel
    address = prg.mem.va + k.entry
    self.runner.load(address, kernel)
    self.params[address] = (k.param_base, [off for off, _ in k.params])

  def register(self, lib: bytes, kernel: Kernel) -> None:
    """`kernel` is the IR of cubin `lib`, wherever its image gets loaded (found at its first launch: _resolve)."""
    self.registered.append((lib, kernel))

  def _resolve(self, program: int) -> None:
    """The registered cubin whose image, relocated to where it would lie, is the memory at launch address `program`."""
    from plugrt_nv import cubin
    for lib, kernel in reversed(self.registered):
      k = cubin.parse(lib, kernel.name)
      base = program - k.entry
      image = k.relocated(base)
      try: here = ctypes.string_at(self.at(base, len(image)), len(image))
      except KeyError: continue
      if here == bytes(image):
        self.runner.load(program, kernel)
        self.params[program] = (k.param_base, [off for off, _ in k.params])
        return

  def _video_execute(self, st: dict[Any, int]) -> None:
    from plugrt_nv import nvdec
    get = lambda m: st[(nvdec.SUBCH_VIDEO, m)]
    setup = get(nvdec.Method.SET_DRV_PIC_SETUP_OFFSET) << 8
    pic = nvdec.HEVC_PIC.from_buffer_copy(ctypes.string_at(setup, ctypes.sizeof(nvdec.HEVC_PIC)))
    bitstream = ctypes.string_at(get(nvdec.Method.SET_IN_BUF_BASE_OFFSET) << 8, pic.stream_len)
    idx = pic.curr_pic_idx
    luma, chroma = get(nvdec.Method.SET_PICTURE_LUMA_OFFSET0 + 4 * idx) << 8, get(nvdec.Method.SET_PICTURE_CHROMA_OFFSET0 + 4 * idx) << 8
    self.pictures.append((pic, bitstream, dict(st)))
    y, uv = self.video_decode(pic, bitstream)  # numpy planes of the picture's samples: (H, W) and (H/2, W) interleaved Cb/Cr
    for plane, base in ((y, luma), (uv, chroma)):
      rows, cols = np.mgrid[0:plane.shape[0], 0:plane.shape[1] * plane.itemsize]
      offsets = block_linear(cols.ravel(), rows.ravel(), pic.framestride[0] * (2 if pic.bit_depth_luma > 8 else 1))  # samples a row
      dest = np.ctypeslib.as_array(ctypes.cast(base, ctypes.POINTER(ctypes.c_uint8)), (int(offsets.max()) + 1,))
      dest[offsets] = plane.view(np.uint8).reshape(plane.shape[0], -1).ravel()

  # ------------------------------------------------------------ the "GPU"
  def _channel(self, ch: Channel) -> Callable[[], bool]:
    """One GPFIFO entry per step: the methods of the command buffer it points at."""
    gp_put = ctypes.c_uint32.from_address(ch.userd + hw.USERD_GP_PUT)
    gp_get = ctypes.c_uint32.from_address(ch.userd + hw.USERD_GP_GET)
    st: dict[Any, int] = {"get": 0}

    def step() -> bool:
      get = st["get"]
      if gp_put.value == get: return False
      entry = ctypes.c_uint64.from_address(self.at(ch.ring + 8 * get, 8)).value
      va, words = entry & 0xFFFFFFFFFC, entry >> 42 & 0x1FFFFF
      data = struct.unpack_from(f"<{words}I", ctypes.string_at(self.at(va, words * 4), words * 4))
      i = 0
      while i < len(data):
        w = data[i]
        assert w >> 29 == 1, f"{ch.name}: not an incrementing method header: {w:#x}"
        count, subch, method = w >> 16 & 0x1FFF, w >> 13 & 7, (w & 0xFFF) << 2
        for k in range(count): self._method(ch, st, subch, method + 4 * k, data[i + 1 + k])
        i += 1 + count
      st["get"] = get = (get + 1) % ch.entries
      gp_get.value = get
      return True
    return step

  def _method(self, ch: Channel, st: dict[Any, int], subch: int, m: int, v: int) -> None:
    self.log.append((ch.name, m | subch << 16, v))
    st[(subch, m)] = v
    if ch.name == "video" and m >= 0x100:
      if m == 0x300: self._video_execute(st)   # EXECUTE
      elif m == 0x304:                          # SEMAPHORE_D: release the payload (with a timestamp) at SEMAPHORE_A/B
        release(st[(subch, 0x240)] << 32 | st[(subch, 0x244)], st[(subch, 0x248)], timestamp_at=(st[(subch, 0x240)] << 32 | st[(subch, 0x244)]) + 8)
    elif m == hw.Host.SEM_EXECUTE and m < 0x100:
      addr = st[(subch, 0x60)] << 32 | st[(subch, 0x5C)]
      payload = st[(subch, 0x64)]
      if v & 7 == hw.Host.SEM_RELEASE:
        host = self.at(addr, 16 if v & hw.Host.SEM_TIMESTAMP else 4)
        release(host, payload, timestamp_at=host + 8 if v & hw.Host.SEM_TIMESTAMP else None)
      elif v & 7 == hw.Host.SEM_ACQ_CIRC_GEQ:
        self.visible(addr, 4)  # another GPU's timeline only once mapped here
        self.acquires.append((ch.name, addr, payload))
        acquire(self.at(addr, 4), payload, stop=lambda: self.stop)
    elif subch == hw.SUBCH_COPY and m == hw.Copy.LAUNCH_DMA:
      if v & 3:
        src = st[(subch, 0x400)] << 32 | st[(subch, 0x404)]
        dst = st[(subch, 0x408)] << 32 | st[(subch, 0x40C)]
        n = st[(subch, 0x418)]
        self.visible(src, n)  # a peer's buffer resolves to that GPU's memory only through a mapping made here
        self.visible(dst, n)
        ctypes.memmove(self.at(dst, n), self.at(src, n), n)
      if v >> 3 & 3:
        host = self.at(st[(subch, 0x240)] << 32 | st[(subch, 0x244)], 16)
        release(host, st[(subch, 0x248)], timestamp_at=host + 8)
    elif subch == hw.SUBCH_COMPUTE and m == hw.Compute.SEND_SIGNALING_PCAS2_B:
      qmd = st[(subch, hw.Compute.SEND_PCAS_A)] << 8
      L = hw.QMD[self.classes.family.qmd]
      ln = Launch(L, ctypes.string_at(self.at(qmd, L.size), L.size))
      self.launches.append(ln)
      if ln.program in self.kernels: self.kernels[ln.program](ln)
      else:
        if ln.program not in self.runner.programs and self.registered: self._resolve(ln.program)
        if ln.program in self.runner.programs: self._dispatch(ln)

  def _dispatch(self, ln: Launch) -> None:
    """A registered program's launch through the reference interpreter: buffer addresses (8 bytes each) and scalars
    read from constant bank 0 where the cubin put the parameters."""
    kernel = self.runner.programs[ln.program]
    base, offs = self.params[ln.program]
    nbufs = len(kernel.signature.buffers)
    at = [ln.cbuf0 + base + off for off in offs]
    bufs = [ctypes.c_uint64.from_address(self.at(a, 8)).value for a in at[:nbufs]]
    scalars = self.runner.decode_scalars(kernel.signature, lambda i, n: ctypes.string_at(self.at(at[nbufs + i], n), n))
    self.runner.run(kernel, bufs, scalars, ln.grid, ln.block)


class FakeGPU(FakeEngine, GPUInterface):
  name = "FAKE"
  _serial = itertools.count(1)

  def __init__(self, classes: set[int] = HOPPER, client: FakeRM | None = None):
    self.client = client or FakeRM()
    self.uuid = next(FakeGPU._serial).to_bytes(16, "little")
    self.peer_maps: dict[int, tuple[int, FakeGPU]] = {}  # another GPU's memory mapped here: address -> (size, owner)
    self.lent: dict[int, set[FakeGPU]] = {}               # this GPU's memory mapped into others: address -> those GPUs
    self.client.attach(self)
    super().__init__(FakeMemory(place=lambda size: PROCESS_VA.alloc(size, PAGE), unplace=PROCESS_VA.release, page=PAGE), classes)
    self.sm_version = 0x900
    self.gr = {"gpcs": 2, "tpc_per_gpc": 2, "sm_per_tpc": 2, "warps_per_sm": 64, "sms": 8}
    self.doorbell_mem = self.alloc(PAGE, "host")
    self.doorbell = self.doorbell_mem.va + 0x90

  def alloc(self, size: int, kind: str = "device") -> Mem:
    m = self.memory.map(size, kind)
    return Mem(m.va, m.size, kind, m)

  def free(self, mem: Mem) -> None:
    for other in self.lent.pop(mem.va, ()): other.peer_maps.pop(mem.va, None)  # UVM_FREE unmaps it from every GPU
    self.memory.unmap(mem.va)

  # ------------------------------------------------------------ peers (the shared FakeRM answers)
  def peer_access(self, other: GPUInterface) -> str:
    if not isinstance(other, FakeGPU) or other.client is not self.client: return "the two fake GPUs have different RM clients"
    key = frozenset((self.uuid, other.uuid))
    if key in self.client.peers: return ""
    self.client.calls.append(("P2P_CAPS", self.uuid, other.uuid))
    if self.client.p2p is not True: return f"the driver reports no peer reads between them: {self.client.p2p}"
    self.client.calls.append(("ENABLE_PEER", self.uuid, other.uuid))
    self.client.peers.add(key)
    return ""

  def map_peer(self, mem: Mem, other: GPUInterface) -> None:
    assert isinstance(other, FakeGPU) and mem.va in self.memory.maps, "map_peer of memory this fake GPU does not own"
    if other in self.lent.get(mem.va, ()): return
    if mem.kind != "host" and frozenset((self.uuid, other.uuid)) not in self.client.peers:
      raise NVError("UVM_MAP_EXTERNAL_ALLOCATION: NV_ERR_INVALID_DEVICE (0x...) (peer access is not enabled)")  # UVM's rule for video memory
    self.client.calls.append(("MAP", mem.va, self.uuid, other.uuid))
    other.peer_maps[mem.va] = (mem.size, self)
    self.lent.setdefault(mem.va, set()).add(other)

  def visible(self, addr: int, n: int) -> None:
    """The GPU's MMU: [addr, addr + n) must lie in one allocation of this GPU, or one mapped here from a peer (a
    KeyError, the fake's page fault, otherwise; the queue then faults and the backend's wait reports it)."""
    for va, (size, _) in list(self.peer_maps.items()):  # (a snapshot: the host thread may be adding one)
      if va <= addr and addr + n <= va + size: return
    m = self.memory.find(addr)
    if addr + n > m.va + m.size: raise KeyError(f"the fake GPU has no memory at {addr + n - 1:#x}")

  def close(self) -> None:
    if not self.stop: self.client.detach(self)
    super().close()

  def video_channel(self, entries: int) -> Channel:
    """A channel whose subchannel-4 methods are the video decoder's: EXECUTE hands the picture (its setup, read back
    from memory, and its bitstream) to `self.video_decode`, which returns the picture's planes, and writes them in
    block-linear layout where SET_PICTURE_LUMA/CHROMA_OFFSET of its index point."""
    if not self.classes.video: raise NVError("the fake GPU offers no video decoder class")
    area = self.alloc(entries * 8 + PAGE, "mapped")
    ch = Channel("video", area.va, entries, area.va + entries * 8, 12)
    self.serve(ch.name, self._channel(ch))
    return ch

  def channels(self, entries: int) -> tuple[Channel, Channel]:
    area = self.alloc(0x200000, "mapped")
    chans = [Channel(n, area.va + off, entries, area.va + off + entries * 8, tok) for n, off, tok in (("compute", 0, 10), ("copy", 0x100000, 11))]
    for ch in chans: self.serve(ch.name, self._channel(ch))
    return chans[0], chans[1]
