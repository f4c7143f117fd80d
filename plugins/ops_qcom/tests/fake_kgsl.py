"""A fake KGSL for tests without an Adreno: the kernel below plugrt-qcom's one seam (KGSLOps), on
plugrt_testing.fakegpu.

It answers the real kgsl.py structs: DEVICE_GETPROPERTY (DEVICE_INFO with a chip id, GPU_RESET_STAT), DRAWCTXT_CREATE
and DESTROY, GPUOBJ_ALLOC / INFO / FREE and the mmap of the KGSL fd at id << 12 (FakeMemory: the CPU and the "GPU"
share the address, as USE_CPU_MAP promises), GPU_COMMAND (the command objects read from the caller's list, each an
indirect buffer inside a GPU object), DEVICE_WAITTIMESTAMP_CTXTID (blocks until the context's timestamp retires, or
ETIMEDOUT; EDEADLK once the context faulted) and CMDSTREAM_READTIMESTAMP_CTXTID.

One thread (FakeDevice.serve) plays the command processor of the chip id's generation (A6XX or A7XX: plugrt_qcom.cmd's
Generation gives the register offsets it reads): it decodes each submission's PM4 packets with the same parity rules
as the CP (plugrt_qcom.cmd.decode), refuses a write to a compute register of the other generation (a 6xx stream on a
7xx, or the reverse), keeps the register and state-load state, and on CP_RUN_OPENCL or CP_EXEC_CS checks the launch:
the shader address in SP_CS_BASE holds a program the stand-in compiler built (qcom_standin.PROGRAMS) and, on 6xx, is
where the shader was loaded from; its size matches SP_CS_INSTR_SIZE; SP_CS_CONFIG's texture / UAV counts match the
kernel's images and what was loaded; each image descriptor (format, size, pitch, type) matches the image the kernel
takes; the grid in SP_CS_NDRANGE_* agrees with the group counts; the work-item register names the slots; on 7xx the
last work-group's size (SP_CS_NDRANGE_7) and the thread size in SP_CS_WIE_CNTL_1 agree with the launch. Then it runs
the kernel through the reference interpreter with the buffer addresses and scalars read out of the constant file
where the program's layout put them, and the generation's event write stores its value: CP_EVENT_WRITE(CACHE_FLUSH_TS)
on 6xx, CP_EVENT_WRITE7(CACHE_CLEAN, WRITE_ENABLED, 32-bit payload to memory) on 7xx; any other event write is refused.
Anything wrong faults the context: the thread stops, `error` says what, GPU_RESET_STAT reports the context guilty and
waits return EDEADLK, as KGSL does after a GPU fault. `hang` stops the command processor (a kernel that never ends).
"""
from __future__ import annotations

import ctypes
import errno
import struct
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np
from plugrt_qcom import adreno as A
from plugrt_qcom import cmd, kgsl
from plugrt_qcom.kgsldev import KGSLOps, adreno_generation
from qcom_standin import MARKER, PROGRAMS, TEXTURE, UAV, Layout

from plugrt.dtype import ImageDType
from plugrt_testing.fakegpu import FakeDevice, FakeMemory, Mapping, release

FD = 1000
ADRENO_630 = 0x06030001
ADRENO_730 = 0x07030001  # Mesa's freedreno_devices.py: FD730 (A7XX)
ADRENO_740 = 0x43050A01  # FD740, a 7xx part that reports core 0x43
ADRENO_702 = 0x07000200  # FD702: core 7, but Mesa files it as A6XX
CHIPS = {"a630": ADRENO_630, "a740": ADRENO_740}  # what qcom_session and the conformance suite run on


@dataclass
class GpuObject:
  id: int
  size: int
  flags: int
  va: int = 0


@dataclass
class Context:
  id: int
  flags: int
  timestamp: int = 0    # the last one handed out
  retired: int = 0      # the last one the command processor finished


class FakeKGSL(FakeDevice, KGSLOps):
  name = "FAKE-KGSL"

  def __init__(self, chip_id: int = ADRENO_630, present: bool = True, memory_limit: int = 1 << 30):
    super().__init__(FakeMemory())
    self.chip_id, self.present, self.memory_left = chip_id, present, memory_limit
    self.gen = cmd.GENERATIONS.get(adreno_generation(chip_id), cmd.A6XX)  # the command processor's register map
    self.objects: dict[int, GpuObject] = {}
    self.contexts: dict[int, Context] = {}
    self.queue: deque[tuple[Context, int, list[tuple[int, int]]]] = deque()
    self.next_id = 1
    self.fds: set[int] = set()
    self.requests: list[str] = []
    self.dispatches: list[dict[str, Any]] = []   # what each launch's state said (tests read it)
    self.faulted: set[int] = set()               # contexts a fault invalidated
    self.lock = threading.Lock()
    self.serve("cp", self._step)

  # ------------------------------------------------------------ the seam
  def exists(self, path: str) -> bool: return self.present and path == kgsl.DEVICE

  def open(self, path: str) -> int:
    if not self.exists(path): raise OSError(errno.ENOENT, path)
    self.fds.add(FD)
    return FD

  def close(self, fd: int) -> None:  # type: ignore[override]  # KGSLOps.close(fd) and FakeDevice.close() share a name
    self.fds.discard(fd)


  def mmap(self, length: int, fd: int, offset: int) -> int:
    obj = self.objects.get(offset >> 12)
    if fd not in self.fds or obj is None or offset & 0xFFF: raise OSError(errno.EINVAL, f"no KGSL object at mmap offset {offset:#x}")
    if length != obj.size: raise OSError(errno.EINVAL, f"mmap of {length:#x} bytes of a {obj.size:#x}-byte object")
    obj.va = self.memory.map(obj.size).va
    return obj.va

  def munmap(self, addr: int, length: int) -> None:
    self.memory.unmap(addr)
    for o in self.objects.values():
      if o.va == addr: o.va = 0

  def ioctl(self, fd: int, request: int, arg: ctypes.Structure) -> None:
    if fd not in self.fds: raise OSError(errno.EBADF, "not an open KGSL fd")
    name, struct_type = kgsl.REQUESTS.get(request, ("?", None))
    if struct_type is None or not isinstance(arg, struct_type): raise OSError(errno.ENOTTY, f"unknown KGSL request {request:#x}")
    self.requests.append(name)
    getattr(self, "_" + name.lower())(arg)

  # ------------------------------------------------------------ requests
  def _device_getproperty(self, a: kgsl.DeviceGetProperty) -> None:
    if a.type == kgsl.KGSL_PROP_DEVICE_INFO:
      if a.sizebytes != ctypes.sizeof(kgsl.DevInfo): raise OSError(errno.EINVAL, "DEVICE_INFO of the wrong size")
      info = kgsl.DevInfo.from_address(a.value)
      info.device_id, info.chip_id, info.mmu_enabled, info.gpu_id = 1, self.chip_id, 1, 630
    elif a.type == kgsl.KGSL_PROP_GPU_RESET_STAT:
      if a.sizebytes != 4: raise OSError(errno.EINVAL, "GPU_RESET_STAT takes a 32-bit context id")
      v = ctypes.c_uint32.from_address(a.value)
      if v.value not in self.contexts: raise OSError(errno.EINVAL, f"no context {v.value}")
      v.value = kgsl.KGSL_CTX_STAT_GUILTY_CONTEXT_RESET_EXT if v.value in self.faulted else kgsl.KGSL_CTX_STAT_NO_ERROR
    else: raise OSError(errno.EINVAL, f"property {a.type:#x}")

  def _drawctxt_create(self, a: kgsl.DrawctxtCreate) -> None:
    c = Context(len(self.contexts) + 1, a.flags)
    self.contexts[c.id] = c
    a.drawctxt_id = c.id

  def _drawctxt_destroy(self, a: kgsl.DrawctxtDestroy) -> None:
    if self.contexts.pop(a.drawctxt_id, None) is None: raise OSError(errno.EINVAL, f"no context {a.drawctxt_id}")

  def _gpuobj_alloc(self, a: kgsl.GpuobjAlloc) -> None:
    if not a.flags & kgsl.KGSL_MEMFLAGS_USE_CPU_MAP: raise OSError(errno.EINVAL, "the fake only makes USE_CPU_MAP objects")
    size = -(-a.size // 0x1000) * 0x1000
    if size > self.memory_left: raise OSError(errno.ENOMEM, "out of GPU memory")
    self.memory_left -= size
    o = GpuObject(self.next_id, size, a.flags)
    self.next_id += 1
    self.objects[o.id] = o
    a.id, a.mmapsize = o.id, size

  def _gpuobj_info(self, a: kgsl.GpuobjInfo) -> None:
    o = self._object(a.id)
    a.gpuaddr, a.flags, a.size, a.va_len, a.va_addr = o.va, o.flags, o.size, o.size, o.va

  def _gpuobj_free(self, a: kgsl.GpuobjFree) -> None:
    o = self._object(a.id)
    if o.va: self.munmap(o.va, o.size)
    del self.objects[a.id]
    self.memory_left += o.size

  def _map_user_mem(self, a: kgsl.MapUserMem) -> None:
    if a.memtype != kgsl.KGSL_USER_MEM_TYPE_ADDR or a.hostptr & 0xFFF or a.len & 0xFFF or a.len == 0:
      raise OSError(errno.EINVAL, "MAP_USER_MEM takes whole pages of type ADDR")
    try:
      self.memory.find(a.hostptr)
      raise OSError(errno.EFAULT, "not host memory: a KGSL mapping")  # (pin_user_pages refuses the driver's own mappings)
    except KeyError: pass
    with self.memory.lock: self.memory.maps[a.hostptr] = Mapping(a.hostptr, a.len, "user")  # the GPU sees it at its host address
    a.gpuaddr = a.hostptr

  def _sharedmem_free(self, a: kgsl.SharedmemFree) -> None:
    with self.memory.lock: m = self.memory.maps.get(a.gpuaddr)
    if m is None or m.kind != "user": raise OSError(errno.EINVAL, f"nothing mapped by MAP_USER_MEM at {a.gpuaddr:#x}")
    with self.memory.lock: del self.memory.maps[a.gpuaddr]

  def shutdown(self) -> None:
    with self.memory.lock:
      for va in [va for va, m in self.memory.maps.items() if m.kind == "user"]: del self.memory.maps[va]  # not ours to munmap
    FakeDevice.close(self)

  def _object(self, id_: int) -> GpuObject:
    if (o := self.objects.get(id_)) is None: raise OSError(errno.EINVAL, f"no GPU object {id_}")
    return o

  def _gpu_command(self, a: kgsl.GpuCommand) -> None:
    c = self.contexts.get(a.context_id)
    if c is None: raise OSError(errno.EINVAL, f"no context {a.context_id}")
    if c.id in self.faulted: raise OSError(errno.EDEADLK, "the context was invalidated by a GPU fault")
    if a.cmdsize != ctypes.sizeof(kgsl.CommandObject) or not 1 <= a.numcmds <= 16: raise OSError(errno.EINVAL, "bad command list")
    ibs = []
    for k in range(a.numcmds):
      obj = kgsl.CommandObject.from_address(a.cmdlist + k * a.cmdsize)
      if not obj.flags & kgsl.KGSL_CMDLIST_IB or obj.size % 4 or obj.size == 0: raise OSError(errno.EINVAL, "not an indirect buffer")
      try: m = self.memory.find(obj.gpuaddr)
      except KeyError as e: raise OSError(errno.EINVAL, f"indirect buffer at {obj.gpuaddr:#x} is not GPU memory") from e
      if obj.gpuaddr + obj.size > m.va + m.size: raise OSError(errno.EINVAL, "indirect buffer past the end of its object")
      ibs.append((obj.gpuaddr, obj.size))
    with self.lock:
      c.timestamp += 1
      a.timestamp = c.timestamp
      self.queue.append((c, c.timestamp, ibs))

  def _device_waittimestamp_ctxtid(self, a: kgsl.DeviceWaitTimestampCtxtId) -> None:
    c = self.contexts.get(a.context_id)
    if c is None: raise OSError(errno.EINVAL, f"no context {a.context_id}")
    deadline = time.monotonic() + a.timeout / 1000
    while (c.retired - a.timestamp) & 0xFFFFFFFF >= 1 << 31:
      if c.id in self.faulted: raise OSError(errno.EDEADLK, "the context was invalidated by a GPU fault")
      if time.monotonic() >= deadline: raise OSError(errno.ETIMEDOUT, "timestamp not retired")
      time.sleep(0.0002)

  def _cmdstream_readtimestamp_ctxtid(self, a: kgsl.CmdstreamReadTimestampCtxtId) -> None:
    a.timestamp = self.contexts[a.context_id].retired

  # ------------------------------------------------------------ the command processor
  def _step(self) -> bool:
    with self.lock:
      if not self.queue: return False
      c, ts, ibs = self.queue[0]
    try:
      for addr, size in ibs: self._run(struct.unpack_from(f"<{size // 4}I", ctypes.string_at(addr, size)))
    except Exception:
      self.faulted.add(c.id)
      raise
    with self.lock:
      self.queue.popleft()
      c.retired = ts
    return True

  def _run(self, words: tuple[int, ...]) -> None:
    state, gen = cmd.ComputeState(self.gen), self.gen
    for p in cmd.decode(words):
      if p.type == 4 and (bad := gen.foreign.intersection(range(p.code, p.code + len(p.values)))):
        raise ValueError(f"{p}: writes {', '.join(f'{r:#x}' for r in sorted(bad))}, compute registers of another generation than {gen!r}")
      state.apply(p)
      if p.type != 7: continue
      if p.code in (A.CP_RUN_OPENCL, A.CP_EXEC_CS): self._dispatch(state, p)
      elif p.code == A.CP_EVENT_WRITE: self._event_write(p)  # (CP_EVENT_WRITE7 on 7xx: the same opcode)
      elif p.code not in (A.CP_SET_MARKER, A.CP_WAIT_FOR_IDLE, A.CP_LOAD_STATE6_FRAG, A.CP_NOP, A.CP_WAIT_MEM_WRITES):
        raise ValueError(f"the fake command processor does not execute {p}")

  def _event_write(self, p: cmd.Packet) -> None:
    """A6XX: CP_EVENT_WRITE(CACHE_FLUSH_TS) with an address and a value stores the value. A7XX: CP_EVENT_WRITE7 stores
    only with WRITE_ENABLED, and plugrt's form is CACHE_CLEAN with a 32-bit user payload to memory."""
    w0 = p.values[0]
    if self.gen.number == 6:
      if A.get(w0, A.CP_EVENT_WRITE_0_EVENT) == A.CACHE_FLUSH_TS and len(p.values) == 4: release(p.values[2] << 32 | p.values[1], p.values[3])
      return
    want = A.pack((A.CP_EVENT_WRITE7_0_EVENT, A.CACHE_CLEAN), (A.CP_EVENT_WRITE7_0_WRITE_SRC, A.EV_WRITE_USER_32B),
                  (A.CP_EVENT_WRITE7_0_WRITE_DST, A.EV_DST_RAM), (A.CP_EVENT_WRITE7_0_WRITE_ENABLED, 1))
    if w0 != want or len(p.values) != 4:
      raise ValueError(f"{p}: not the CP_EVENT_WRITE7 this fake executes (dword 0 {want:#x} and address, payload: 4 words)")
    release(p.values[2] << 32 | p.values[1], p.values[3])

  def _dispatch(self, st: cmd.ComputeState, p: cmd.Packet) -> None:
    gen = st.gen
    shader = st.reg64(A.REG_A6XX_SP_CS_BASE)
    loaded, units = st.loads.get((A.ST6_SHADER, A.SB6_CS_SHADER), (None, st.regs.get(A.REG_A6XX_SP_CS_INSTR_SIZE, 0)))
    if gen.preload_shader and loaded != shader: raise ValueError(f"SP_CS_BASE is {shader:#x} but the shader was loaded from {loaded}")
    if not gen.preload_shader and loaded is not None: raise ValueError(f"a {gen!r} stream preloads the shader (Mesa fetches it from SP_CS_BASE)")
    head = ctypes.string_at(shader, 64)
    if head[:32] != MARKER or (prg := PROGRAMS.get(head[32:])) is None: raise ValueError(f"no program at shader address {shader:#x}")
    if st.regs.get(A.REG_A6XX_SP_CS_INSTR_SIZE) != units or units * cmd.SHADER_UNIT < prg.code_size:
      raise ValueError(f"SP_CS_INSTR_SIZE {st.regs.get(A.REG_A6XX_SP_CS_INSTR_SIZE)} / loaded {units} units for {prg.code_size} bytes")
    config = st.regs.get(A.REG_A6XX_SP_CS_CONFIG, 0)
    ntex, nuav = A.get(config, A.A6XX_SP_CS_CONFIG_NTEX), A.get(config, A.A6XX_SP_CS_CONFIG_NUAV)
    if not A.get(config, A.A6XX_SP_CS_CONFIG_ENABLED): raise ValueError("SP_CS_CONFIG does not enable the compute shader")
    if (ntex, nuav) != (prg.kinds.count(TEXTURE), prg.kinds.count(UAV)):
      raise ValueError(f"SP_CS_CONFIG says {ntex} textures and {nuav} UAVs; the kernel reads {prg.kinds.count(TEXTURE)} and writes "
                       f"{prg.kinds.count(UAV)} images")
    for n, reg, block, what in ((nuav, gen.uav_base, (A.ST6_UAV, A.SB6_CS_SHADER), "SP_CS_UAV_BASE"),
                                (ntex, A.REG_A6XX_SP_CS_TEXMEMOBJ_BASE, (A.ST6_CONSTANTS, A.SB6_CS_TEX), "SP_CS_TEXMEMOBJ_BASE")):
      if n and st.reg64(reg) != st.loads.get(block, (None, 0))[0]:
        raise ValueError(f"{what} is {st.reg64(reg):#x}, not where the descriptors were loaded from")
    consts, cunits = st.loads.get((A.ST6_CONSTANTS, A.SB6_CS_SHADER), (0, 0))
    need = max([*prg.bases, *prg.offsets, *prg.scalars, 0]) + 8
    if cunits * 16 < need: raise ValueError(f"{cunits} units of constants loaded; the kernel's arguments need {need} bytes")
    local = st.local_size()
    groups = tuple(p.values[1:4]) if p.code == A.CP_EXEC_CS else st.groups()
    if tuple(g * l for g, l in zip(groups, local)) != st.global_size():
      raise ValueError(f"SP_CS_NDRANGE says {st.global_size()} threads, but {groups} groups of {local}")
    self._check_work_items(st, local)
    kernel = prg.kernel
    sig = kernel.signature
    q = lambda off: ctypes.c_uint64.from_address(consts + off).value
    addrs: list[int] = []
    images: list[tuple[int, Any, int]] = []  # (buffer index, ImageDType, its descriptor's address)
    tex_k = uav_k = 0
    for i, dt in enumerate(sig.buffers):
      if isinstance(dt, ImageDType):
        kind = prg.kinds[i]
        block = (A.ST6_CONSTANTS, A.SB6_CS_TEX) if kind == TEXTURE else (A.ST6_UAV, A.SB6_CS_SHADER)
        base, n = st.loads.get(block, (0, 0))
        k = tex_k if kind == TEXTURE else uav_k
        if k >= n: raise ValueError(f"image argument {i}: only {n} {'texture' if kind == TEXTURE else 'UAV'} descriptors loaded")
        d = cmd.TexDescriptor.decode(struct.unpack_from("<16I", ctypes.string_at(base + k * cmd.DESC_BYTES, cmd.DESC_BYTES)))
        want = (cmd.image_format(dt), dt.width, dt.height, cmd.image_pitch(dt), A.A6XX_TEX_2D)
        if (d.fmt, d.width, d.height, d.pitch, d.type) != want:
          raise ValueError(f"image argument {i}: the descriptor says format {d.fmt}, {d.width}x{d.height}, pitch {d.pitch}, type {d.type}; "
                           f"the kernel's {dt.name} needs {want}")
        if kind == TEXTURE: tex_k += 1
        else: uav_k += 1
        images.append((i, dt, d.address))
        addrs.append(d.address)
      else: addrs.append(q(prg.bases[i]) + q(prg.offsets[i]))
    scalars = self.runner.decode_scalars(sig, lambda i, n: ctypes.string_at(consts + prg.scalars[i], n))
    self.dispatches.append({"kernel": kernel.name, "groups": groups, "local": local, "shader": shader, "buffers": addrs, "scalars": scalars,
                            "ntex": ntex, "nuav": nuav, "op": A.OPCODES[p.code], "gen": gen.number})
    self._run_kernel(prg, addrs, images, scalars, groups, local)

  def _check_work_items(self, st: cmd.ComputeState, local: tuple[int, ...]) -> None:
    """The registers that say where work-item ids arrive, and on 7xx the last group's size and the thread size."""
    gen = st.gen
    slots = (A.QCOM_WGIDCONSTID, A.QCOM_WGSIZECONSTID, A.QCOM_WGOFFSETCONSTID, A.QCOM_LOCALIDREGID)
    fields = (A.A6XX_SP_CS_CONST_CONFIG_0_WGIDCONSTID, A.A6XX_SP_CS_CONST_CONFIG_0_WGSIZECONSTID,
              A.A6XX_SP_CS_CONST_CONFIG_0_WGOFFSETCONSTID, A.A6XX_SP_CS_CONST_CONFIG_0_LOCALIDREGID)
    wi = st.regs.get(gen.work_item)
    if wi is None or tuple(A.get(wi, f) for f in fields) != slots:
      raise ValueError(f"{gen.names.get(gen.work_item)} is {wi}: not the work-item slots the compiler's shaders read {slots}")
    wge = st.regs.get(gen.wge_cntl, 0)
    if A.get(wge, A.A6XX_SP_CS_WGE_CNTL_LINEARLOCALIDREGID) != A.REGID_INVALID:
      raise ValueError(f"SP_CS_WGE_CNTL {wge:#x} has the hardware write the linear local id into a register the shader owns")
    if gen.number == 7:
      last = st.regs.get(A.REG_A7XX_SP_CS_NDRANGE_7)
      got = None if last is None else tuple(A.get(last, f) + 1 for f in (A.A7XX_SP_CS_NDRANGE_7_LOCALSIZEX, A.A7XX_SP_CS_NDRANGE_7_LOCALSIZEY,
                                                                           A.A7XX_SP_CS_NDRANGE_7_LOCALSIZEZ))
      if got != tuple(local): raise ValueError(f"SP_CS_NDRANGE_7 says the last work-group is {got}; every group of this launch is {local}")
      wie1 = st.regs.get(A.REG_A6XX_SP_CS_WIE_CNTL_1)
      if wie1 is None or A.get(wie1, A.A7XX_SP_CS_WIE_CNTL_1_THREADSIZE) != A.get(wge, A.A6XX_SP_CS_WGE_CNTL_THREADSIZE):
        raise ValueError(f"SP_CS_WIE_CNTL_1 is {wie1}: its thread size must match SP_CS_WGE_CNTL's")

  def _run_kernel(self, prg: Layout, addrs: list[int], images: list[tuple[int, Any, int]], scalars: list[Any], groups: Any, local: Any) -> None:
    """The interpreter sees an image as exactly its texels, rows packed: each image is read from its padded rows into
    an array, and written back after the kernel ran."""
    from plugrt.compiler import interpreter
    sig = prg.kernel.signature
    arrays = [self.memory.array(a, dt) for a, dt in zip(addrs, sig.buffers)]
    packed = {i: image_rows(addr, dt).ravel().copy() for i, dt, addr in images}
    for i, a in packed.items(): arrays[i] = a
    self.runner.runs.append((prg.kernel.name, tuple(groups), tuple(local)))
    interpreter.run(prg.kernel, arrays, scalars, tuple(groups), tuple(local))
    for i, dt, addr in images:
      row, pitch, raw = dt.width * 4 * dt.itemsize, cmd.image_pitch(dt), packed[i].tobytes()
      for y in range(dt.height): ctypes.memmove(addr + y * pitch, raw[y * row:(y + 1) * row], row)


def image_rows(addr: int, dt: ImageDType) -> np.ndarray:
  """An image's texels as an (h, w, 4) array read from its padded rows (for tests)."""
  pitch, row = cmd.image_pitch(dt), dt.width * 4 * dt.itemsize
  raw = b"".join(ctypes.string_at(addr + y * pitch, row) for y in range(dt.height))
  return np.frombuffer(raw, dtype=dt.base.numpy).reshape(dt.height, dt.width, 4)
