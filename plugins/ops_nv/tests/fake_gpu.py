"""A fake NV interface for tests without a GPU: memory is host memory at the addresses NV asks for, and each channel
is a thread that decodes the real command stream from its GPFIFO ring: host semaphores (release with a timestamp,
circular acquire), the copy engine (linear copies, semaphore release) and compute launches, whose QMD and constant
bank 0 it reads back and hands to a Python stand-in for the kernel, registered by program address. So everything
NV writes for the GPU, the fake reads the way the hardware documents it."""
from __future__ import annotations

import ctypes
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

from plugrt_nv import hw
from plugrt_nv.iface import Channel, GPUInterface, Mem
from plugrt_nv_nvk.nvk import PAGE, PROCESS_VA, libc

HOPPER = {0xCBC0, 0xC8B5, 0xC86F, 0xC661}


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


class FakeGPU(GPUInterface):
  name = "FAKE"

  def __init__(self, classes: set[int] = HOPPER):
    self.classes = hw.pick_classes(classes)  # type: ignore[assignment]
    self.sm_version = 0x900
    self.gr = {"gpcs": 2, "tpc_per_gpc": 2, "sm_per_tpc": 2, "warps_per_sm": 64, "sms": 8}
    self.va, self.mems = PROCESS_VA, []
    self.doorbell_mem = self.alloc(PAGE, "host")
    self.doorbell = self.doorbell_mem.va + 0x90
    self.kernels: dict[int, Callable[[Launch], None]] = {}  # program address -> stand-in
    self.launches: list[Launch] = []
    self.log: list[tuple[str, int, int]] = []  # (channel, method, data) of every method seen
    self.error = ""      # set to make fault() report, as a faulting channel would
    self.hang = False    # set to stop executing (a kernel that never ends)
    self.threads: list[threading.Thread] = []
    self.stop = False

  def alloc(self, size: int, kind: str = "device") -> Mem:
    size = (max(size, 1) + PAGE - 1) // PAGE * PAGE
    va = self.va.alloc(size, PAGE)
    addr = libc().mmap(va, size, 3, 0x01 | 0x20 | 0x100000, -1, 0)
    assert addr == va, "the fake could not map memory where NV asked"
    self.mems.append(m := Mem(va, size, kind))
    return m

  def free(self, mem: Mem) -> None:
    self.mems.remove(mem)
    libc().munmap(mem.va, mem.size)
    self.va.release(mem.va, mem.size)

  def channels(self, entries: int) -> tuple[Channel, Channel]:
    area = self.alloc(0x200000, "mapped")
    chans = [Channel(n, area.va + off, entries, area.va + off + entries * 8, tok) for n, off, tok in (("compute", 0, 10), ("copy", 0x100000, 11))]
    for ch in chans:
      t = threading.Thread(target=self._run, args=(ch,), daemon=True)
      t.start()
      self.threads.append(t)
    return chans[0], chans[1]

  def fault(self, deep: bool = False) -> str: return self.error

  def close(self) -> None:
    if self.stop: return
    self.stop = True
    for t in self.threads: t.join(5)
    for m in list(self.mems): self.free(m)

  # ------------------------------------------------------------ the "GPU"
  def _run(self, ch: Channel) -> None:
    get = 0
    gp_put = ctypes.c_uint32.from_address(ch.userd + hw.USERD_GP_PUT)
    gp_get = ctypes.c_uint32.from_address(ch.userd + hw.USERD_GP_GET)
    st: dict[str, Any] = {}
    while not self.stop:
      if self.hang or gp_put.value == get:
        time.sleep(0.0002)
        continue
      entry = ctypes.c_uint64.from_address(ch.ring + 8 * get).value
      va, words = entry & 0xFFFFFFFFFC, entry >> 42 & 0x1FFFFF
      data = struct.unpack_from(f"<{words}I", ctypes.string_at(va, words * 4))
      i = 0
      while i < len(data):
        w = data[i]
        assert w >> 29 == 1, f"{ch.name}: not an incrementing method header: {w:#x}"
        count, subch, method = w >> 16 & 0x1FFF, w >> 13 & 7, (w & 0xFFF) << 2
        for k in range(count): self._method(ch, st, subch, method + 4 * k, data[i + 1 + k])
        i += 1 + count
      get = (get + 1) % ch.entries
      gp_get.value = get

  def _method(self, ch: Channel, st: dict[str, Any], subch: int, m: int, v: int) -> None:
    self.log.append((ch.name, m | subch << 16, v))
    st[(subch, m)] = v
    if m == hw.Host.SEM_EXECUTE and m < 0x100:
      addr = st[(subch, 0x60)] << 32 | st[(subch, 0x5C)]
      payload = st[(subch, 0x64)]
      if v & 7 == hw.Host.SEM_RELEASE:
        ctypes.c_uint32.from_address(addr).value = payload
        if v & hw.Host.SEM_TIMESTAMP: ctypes.c_uint64.from_address(addr + 8).value = time.monotonic_ns()
      elif v & 7 == hw.Host.SEM_ACQ_CIRC_GEQ:
        while ((ctypes.c_uint32.from_address(addr).value - payload) & 0xFFFFFFFF) >= 1 << 31 and not self.stop: time.sleep(0.0001)
    elif subch == hw.SUBCH_COPY and m == hw.Copy.LAUNCH_DMA:
      if v & 3:
        src = st[(subch, 0x400)] << 32 | st[(subch, 0x404)]
        dst = st[(subch, 0x408)] << 32 | st[(subch, 0x40C)]
        ctypes.memmove(dst, src, st[(subch, 0x418)])
      if v >> 3 & 3:
        addr = st[(subch, 0x240)] << 32 | st[(subch, 0x244)]
        ctypes.c_uint32.from_address(addr).value = st[(subch, 0x248)]
        ctypes.c_uint64.from_address(addr + 8).value = time.monotonic_ns()
    elif subch == hw.SUBCH_COMPUTE and m == hw.Compute.SEND_SIGNALING_PCAS2_B:
      qmd = st[(subch, hw.Compute.SEND_PCAS_A)] << 8
      L = hw.QMD[self.classes.family.qmd]
      ln = Launch(L, ctypes.string_at(qmd, L.size))
      self.launches.append(ln)
      if ln.program in self.kernels: self.kernels[ln.program](ln)
