"""QCOM's runtime objects: the device state (KGSL context, timeline, command slots), the allocator, programs.

Memory is KGSL GPU objects mapped for the CPU at their GPU address (plugrt_qcom.kgsldev), so a buffer's handle is its
address, host copies are memmoves after the GPU finished with it, and an image is linear RGBA memory whose rows are
`cmd.image_pitch` bytes apart (a `QCOMImage` handle: the address and the dtype).

Every launch is one submission: the CPU writes the kernel's arguments and descriptors into a command slot's
argument block, the launch's PM4 words after them (plugrt_qcom.cmd), and the timeline store that ends it, then hands
the slot to the driver with one GPU_COMMAND ioctl. Waits are KGSLTimeline's: bounded (PLUGRT_QCOM_TIMEOUT seconds,
30 by default), blocking in the driver, a reset reported by the driver becomes KGSLFault.
"""
from __future__ import annotations

import ctypes
import struct
import weakref
from _thread import RLock
from array import array
from collections.abc import Sequence
from functools import partial
from typing import Any

from plugrt.compiler.ir import Signature
from plugrt.dtype import ImageDType, dtypes
from plugrt.errors import CompileError, UnsupportedError
from plugrt.hookspecs import DeviceInfo
from plugrt.hwqueue import CommandSlots, HCQProgram, HCQState, queue_timeout, round_up
from plugrt.launchargs import PreparedCall, bytes_packer
from plugrt.runtime import Allocator, LaunchLimits, buffer_address
from plugrt_qcom import binary, cmd
from plugrt_qcom.kgsldev import GpuMem, KGSLDevice, KGSLError, KGSLOps, KGSLTimeline

SLOT, SLOTS = 8192, 256     # command slots: the argument block (constants, descriptors) then the launch's words at IB_OFF
IB_OFF = 4096               # (the constants load reads 4 KiB from the block's start: the descriptors are inside it)
MAX_ARG_BYTES = cmd.DESC_OFF


class HostMapping:
  """Host memory mapped for the GPU by from_blob (MAP_USER_MEM): unmapped when the last handle that holds it goes (the
  core never frees wrapped memory itself; it synchronises the device before the wrapped buffer's owner may go)."""
  __slots__ = ("state", "gpuaddr")

  def __init__(self, state: QCOMState, gpuaddr: int): self.state, self.gpuaddr = state, gpuaddr

  def __del__(self) -> None:
    st = self.state
    try:
      if not st.closed:
        with st.lock: st.kgsl.unmap_host(self.gpuaddr)
    except Exception: pass  # a failed device, or interpreter shutdown: closing the device unmaps it anyway


class HostAddress(int):
  """A buffer handle (its GPU address) of wrapped host memory, holding the mapping."""
  mapping: HostMapping | None = None


class GpuAddress(int):
  """A buffer handle of GPU memory the CPU cannot see (a cl_mem's, wrapped by from_blob): copies go through the GPU."""


class QCOMImage:
  """An image's handle: its GPU (= CPU) address and dtype; rows are cmd.image_pitch(dtype) bytes apart."""
  __slots__ = ("address", "dtype", "pitch", "external", "mapping")

  def __init__(self, address: int, dtype: ImageDType, external: bool = False, mapping: HostMapping | None = None):
    self.address, self.dtype, self.pitch, self.external, self.mapping = address, dtype, cmd.image_pitch(dtype), external, mapping

  @property
  def gpu_only(self) -> bool: return self.external and self.mapping is None


def gpu_only(handle: Any) -> bool:
  """Whether the CPU cannot read or write this memory (a cl_mem's): copies then run as a kernel on the GPU."""
  return isinstance(handle, GpuAddress) or (isinstance(handle, QCOMImage) and handle.gpu_only)

  def __repr__(self) -> str: return f"QCOMImage({self.address:#x}, {self.dtype!r})"


class QCOMState(KGSLTimeline, HCQState):
  """One Adreno GPU through KGSL: the context, the timeline (inherited), the command slots, private memory."""

  def __init__(self, info: DeviceInfo, ops: KGSLOps | None = None):
    self.index, self.lock = info.index, RLock()
    ctx = info.context
    self.kgsl = kg = KGSLDevice(ops)
    try:
      self.signals = kg.alloc(0x1000, uncached=True)
      self.init_timeline(kg, self.signals.va, timeout=queue_timeout(ctx, "PLUGRT_QCOM_TIMEOUT"), label=f"QCOM:{info.index}",
                         setting="PLUGRT_QCOM_TIMEOUT")
      self.slots_mem = kg.alloc(SLOT * SLOTS)
      self.slots = CommandSlots(self.slots_mem.va, SLOT, SLOTS)
      self.run_opencl = ctx.choice("PLUGRT_QCOM_DISPATCH", ("run_opencl", "exec_cs"), "run_opencl") == "run_opencl"
      self.gen = cmd.GENERATIONS[kg.generation]  # the A6XX or A7XX command stream
    except BaseException:
      kg.close()
      raise
    self.private: GpuMem | None = None
    self.description = f"{kg.name} through KGSL"

  def ensure_private(self, nbytes: int) -> int:
    """GPU address of at least `nbytes` of private (stack) memory for the shaders, grown after the GPU is idle."""
    if nbytes == 0: return self.private.va if self.private else 0
    if self.private is None or self.private.size < nbytes:
      self.synchronize()
      if self.private is not None: self.kgsl.free(self.private)
      self.private = self.kgsl.alloc(nbytes)
    return self.private.va

  def take_slot(self) -> tuple[int, int]:
    """(slot index, its address), once the GPU finished the submission that last used it."""
    if self.broken: raise KGSLError(f"QCOM:{self.index} cannot run more work: {self.broken}", "restart the process")
    i = self.slots.take(self)
    return i, self.slots.address(i)

  def submit(self, slot: int, words: array, value: int) -> None:
    """Write `words` (ending with the timeline store of `value`, the next timeline value) at the slot's IB_OFF and
    submit them."""
    n = len(words) * 4
    if n > SLOT - IB_OFF: raise KGSLError(f"internal: {len(words)} command words do not fit a command slot")
    o = slot * SLOT + IB_OFF
    self.slots.view[o:o + n] = memoryview(words).cast("B")
    ts = self.kgsl.submit(self.slots.base + o, n)
    self.value = self.slots.last_use[slot] = value
    self.submitted(value, ts)

  def close(self) -> None:
    if self.closed: return
    try: self.synchronize()
    except KGSLError: pass
    self.closed = True
    self.kgsl.close()


class QCOMAllocator(Allocator[Any]):
  supports_wrap = True
  supports_images = True
  max_image = (16384, 16384)  # TEX_CONST_1's WIDTH is 15 bits; Adreno 6xx's OpenCL reports 16384 x 16384 images

  def __init__(self, device: DeviceInfo):
    super().__init__(device)
    self.state: QCOMState = device.state
    self.mems: dict[int, GpuMem] = {}
    self.kcopy: QCOMProgram | None = None  # the copy kernel for GPU-only memory, made on first use

  def _alloc(self, nbytes: int, options: Any) -> Any:
    st = self.state
    if isinstance(options, ImageDType):
      with st.lock: m = st.kgsl.alloc(cmd.image_pitch(options) * options.height)
      self.mems[m.va] = m
      return QCOMImage(m.va, options)
    with st.lock: m = st.kgsl.alloc(nbytes)
    self.mems[m.va] = m
    return m.va

  def _free(self, handle: Any, nbytes: int, options: Any) -> None:
    addr = handle.address if isinstance(handle, QCOMImage) else handle
    st = self.state
    if st.closed: return  # closing the device freed every GPU object
    if (m := self.mems.pop(addr, None)) is None: return  # external GPU memory (from_blob of a cl_mem): not ours to free
    with st.lock:
      if not st.broken: st.synchronize()  # the GPU may still use it (a failed context runs nothing more)
      st.kgsl.free(m)

  def _offset(self, handle: Any, offset: int, nbytes: int) -> Any:
    if isinstance(handle, QCOMImage): raise UnsupportedError("an image has no views", "copy the texels out with Buffer.numpy()")
    return GpuAddress(handle + offset) if isinstance(handle, GpuAddress) else handle + offset

  def _wrap(self, ptr: int, nbytes: int) -> Any:
    """Host memory is mapped for the GPU (MAP_USER_MEM); an address the driver does not take as host memory is GPU
    memory already (a cl_mem's address from plugrt_qcom.interop) and is used as it is."""
    st = self.state
    with st.lock: addr = st.kgsl.map_host(ptr, nbytes)
    if addr is None: return GpuAddress(ptr)
    h = HostAddress(addr)
    h.mapping = HostMapping(st, addr)
    return h

  def _wrap_image(self, ptr: int, nbytes: int, image: Any) -> Any:
    """A cl_mem image's GPU address (plugrt_qcom.interop): rows padded to cmd.image_pitch, as Qualcomm's driver lays them
    out. Host memory holds packed rows, which an Adreno descriptor can describe only when a row is a multiple of 64 bytes."""
    if ptr & 0x3F: raise UnsupportedError(f"an Adreno image must start 64-byte aligned, not at {ptr:#x}", "pass the address a cl_mem image has")
    row = image.width * 4 * image.itemsize
    st = self.state
    with st.lock: addr = st.kgsl.map_host(ptr, row * image.height)
    if addr is None: return QCOMImage(ptr, image, external=True)
    if row % cmd.IMAGE_PITCH_ALIGN:
      with st.lock: st.kgsl.unmap_host(addr)
      per = cmd.IMAGE_PITCH_ALIGN // (4 * image.itemsize)
      raise UnsupportedError(f"host memory of {image!r} has {row}-byte rows; an Adreno image's rows are {cmd.IMAGE_PITCH_ALIGN}-byte multiples",
                             f"wrap a cl_mem image (plugrt_qcom.interop), or an image whose width is a multiple of {per}")
    return QCOMImage(addr, image, external=True, mapping=HostMapping(st, addr))

  def _rows(self, handle: QCOMImage) -> tuple[int, int, int]:
    img = handle.dtype
    return img.height, img.width * 4 * img.itemsize, handle.pitch

  def _copyin(self, dest: Any, src: memoryview) -> None:
    if gpu_only(dest): return self._through_gpu(dest, src, into=True)
    self.state.synchronize()  # the GPU is done with what it was doing to this memory
    host = buffer_address(src)
    if isinstance(dest, QCOMImage):
      h, row, pitch = self._rows(dest)
      for y in range(h): ctypes.memmove(dest.address + y * pitch, host + y * row, row)
    else: ctypes.memmove(dest, host, src.nbytes)

  def _copyout(self, dest: memoryview, src: Any) -> None:
    if gpu_only(src): return self._through_gpu(src, dest, into=False)
    self.state.synchronize()
    host = buffer_address(dest)
    if isinstance(src, QCOMImage):
      h, row, pitch = self._rows(src)
      for y in range(h): ctypes.memmove(host + y * row, src.address + y * pitch, row)
    else: ctypes.memmove(host, src, dest.nbytes)

  def _copy(self, dest: Any, src: Any, nbytes: int) -> Any:
    if isinstance(dest, QCOMImage) or isinstance(src, QCOMImage): return NotImplemented
    if gpu_only(dest) or gpu_only(src):
      self._gpu_copy(dest, src, nbytes)
      return None
    self.state.synchronize()
    ctypes.memmove(dest, src, nbytes)
    return None

  # ------------------------------------------------------------ memory only the GPU sees (a cl_mem's)
  def _through_gpu(self, mem: Any, host: memoryview, into: bool) -> None:
    """A host copy to or from GPU-only memory: through a staging GPU object and the copy kernel (an image's rows as
    the GPU lays them out, padded to its pitch)."""
    st = self.state
    addr = mem.address if isinstance(mem, QCOMImage) else int(mem)
    size = mem.pitch * mem.dtype.height if isinstance(mem, QCOMImage) else host.nbytes
    with st.lock: stage = st.kgsl.alloc(size)
    try:
      staged = QCOMImage(stage.va, mem.dtype) if isinstance(mem, QCOMImage) else stage.va
      if into:
        self._copyin(staged, host)
        self._gpu_copy(addr, stage.va, size)
      else:
        self._gpu_copy(stage.va, addr, size)
        self._copyout(host, staged)
    finally:
      with st.lock:
        if not st.broken: st.synchronize()
        st.kgsl.free(stage)

  def _gpu_copy(self, dest: int, src: int, nbytes: int) -> None:
    """Copy nbytes between GPU addresses with the copy kernel (compiled on first use by the device's compiler)."""
    if nbytes == 0: return
    prg = self._copy_program()
    local, groups = 256, max(1, min(-(-nbytes // 256), 1024))
    threads = local * groups
    prg.launch((int(dest), int(src)), (nbytes, threads, -(-nbytes // threads)), (groups, 1, 1), (local, 1, 1), wait=True)

  def _copy_program(self) -> QCOMProgram:
    if self.kcopy is None:
      from plugrt.device import Device
      self.kcopy = Device[self.device.canonical].program(copy_kernel())
    return self.kcopy


def copy_kernel() -> Any:
  """The byte copy QCOM runs for memory only the GPU sees: thread t copies bytes k*threads + t, k < per."""
  from plugrt.compiler.ir import KernelBuilder
  b = KernelBuilder("plugrt_qcom_copy")
  dst, src = b.buffer("dst", dtypes.uint8), b.buffer("src", dtypes.uint8)
  n, threads, per = b.scalar("n", dtypes.int32), b.scalar("threads", dtypes.int32), b.scalar("per", dtypes.int32)
  t = b.global_id(0)
  with b.range(per) as k:
    j = k * threads + t
    with b.if_(j < n): dst[j] = src[j]
  return b.finish()


def _release_program(st: QCOMState, mem: GpuMem) -> None:
  if st.closed: return
  try:
    with st.lock:
      st.synchronize()
      st.kgsl.free(mem)
  except Exception: pass  # the device may be closed already


class QCOMProgram(HCQProgram):
  """A kernel compiled by Qualcomm's OpenCL driver: its shader in GPU memory, and where each argument goes. A launch
  writes its argument block and command words into one of the device's command slots, under the device's lock."""
  scalar_packer = staticmethod(bytes_packer)

  def __init__(self, device: Any, name: str, lib: bytes, signature: Signature):
    super().__init__(device, name, lib, signature)
    st: QCOMState = self.state
    sb = binary.parse(lib, name)
    want = 2 * self.nbufs + self.nvals  # the renderer's parameters: (base, offset) per buffer or image, then the scalars
    if len(sb.args) != want:
      raise CompileError(f"the program binary of {name} lists {len(sb.args)} arguments; its OpenCL C declares {want}")
    self.images: list[tuple[int, int]] = []  # (buffer index, argument kind) of each image
    for i, dt in enumerate(signature.buffers):
      kind = sb.args[2 * i].kind
      if isinstance(dt, ImageDType) != (kind in (binary.ARG_TEXTURE, binary.ARG_UAV)):
        raise CompileError(f"the program binary of {name} says argument {2 * i} is {'an image' if kind in (1, 2) else 'a buffer'}; "
                           f"the kernel's is {dt.name}")
      if isinstance(dt, ImageDType): self.images.append((i, kind))
    if any(a.offset + 8 > MAX_ARG_BYTES for a in sb.args):
      raise UnsupportedError(f"kernel {name} has more arguments than QCOM's {MAX_ARG_BYTES}-byte argument block holds")
    self.ntex, self.nuav = sb.textures, sb.uavs
    self.nsamp = sb.samplers + 1 if sb.samplers else 0  # the driver's samplers, and the one after them the compiler expects
    if cmd.DESC_OFF + (self.ntex + self.nuav) * cmd.DESC_BYTES + self.nsamp * cmd.SAMP_BYTES > IB_OFF:
      raise UnsupportedError(f"kernel {name} uses {self.ntex + self.nuav} images; QCOM's argument block holds fewer")
    self.binary = sb
    with st.lock: self.mem = st.kgsl.alloc(len(sb.code) + cmd.SHADER_UNIT)  # room past the end: the SP prefetches
    ctypes.memmove(self.mem.va, sb.code, len(sb.code))
    self.shader = cmd.Shader(self.mem.va, len(sb.code), sb.entry, sb.full_regs, sb.half_regs, sb.branch_stack, sb.shared, sb.private)
    self.private_bytes = round_up(sb.private, 512) * 128 * 2 * 16 if sb.private else 0
    self.buf_offs = [a.offset for a in sb.args[:2 * self.nbufs:2]]
    self.off_offs = [a.offset for a in sb.args[1:2 * self.nbufs:2]]
    self.val_offs = [a.offset for a in sb.args[2 * self.nbufs:]]
    self.consts = bytearray(MAX_ARG_BYTES)
    for value, off, size in sb.consts: self.consts[off:off + size] = value.to_bytes(size, "little")
    self.samplers = b"".join(struct.pack("<4I", *cmd.sampler()) for _ in range(self.nsamp))
    regs = max(1, sb.full_regs + round_up(sb.half_regs, 2) // 2)
    self.max_threads = max(64, min(1024, (384 * 32) // (regs * 128) * 128))  # the register file as Qualcomm's driver divides it
    self.launch_limits = LaunchLimits(str(device), (65535, 65535, 65535), (1024, 1024, 1024), self.max_threads)
    self.words: dict[Any, tuple[array, list[int]]] = {}  # (grid, block, private memory) -> the launch's words and where its argument block goes
    weakref.finalize(self, _release_program, st, self.mem)

  def _words_for(self, key: tuple[tuple[int, int, int], tuple[int, int, int], int]) -> tuple[array, list[int]]:
    """The launch's words for this grid with the argument block at address 0 and timeline value 0, and where the
    block's address goes (found by building them for two addresses): a launch copies them and patches those words."""
    st = self.state
    gs, ls, private = key
    def words(args: int) -> list[int]:
      return cmd.launch(self.shader, args, ls, gs, ntex=self.ntex, nsamp=self.nsamp, nuav=self.nuav, private_base=private,
                        run_opencl=st.run_opencl, gen=st.gen) + st.gen.timestamp(st.counter_address, 0)
    a, b = words(0), words(0x10000)
    prep = array("I", a), [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
    if len(self.words) >= 64: self.words.clear()
    self.words[key] = prep
    return prep

  def _encode(self, bufs: tuple, scalars: tuple, gs: tuple[int, int, int], ls: tuple[int, int, int]) -> PreparedCall:
    return PreparedCall(submit=partial(self._submit, tuple(b.handle for b in bufs), scalars, gs, ls))

  def launch(self, handles: Sequence[Any], vals: Sequence[Any], gs: tuple[int, int, int], ls: tuple[int, int, int],
             wait: bool = False) -> None:
    """One launch on raw handles (GPU addresses, QCOMImages) and scalars the caller checked (the device's own copies)."""
    with self.launch_lock:
      value = self._submit(handles, tuple(pack(v) for pack, v in zip(self._packers, vals)), gs, ls)
      if wait: self.state.wait(value)

  def _submit(self, handles: Sequence[Any], scalars: Sequence[bytes], gs: tuple[int, int, int], ls: tuple[int, int, int]) -> int:
    """The launch's argument block and words into a command slot, submitted (under the device's lock); its timeline value."""
    st = self.state
    slot, base = st.take_slot()
    o = slot * SLOT
    view = st.slots.view
    view[o:o + MAX_ARG_BYTES] = self.consts
    uav_at, tex_at = o + cmd.DESC_OFF, o + cmd.DESC_OFF + self.nuav * cmd.DESC_BYTES
    for h, off in zip(handles, self.buf_offs):
      struct.pack_into("<Q", view, o + off, h.address if isinstance(h, QCOMImage) else h)
    for off in self.off_offs: struct.pack_into("<Q", view, o + off, 0)
    for off, raw in zip(self.val_offs, scalars): view[o + off:o + off + len(raw)] = raw
    for i, kind in self.images:
      h = handles[i]
      if kind == binary.ARG_UAV:
        struct.pack_into("<16I", view, uav_at, *cmd.tex_descriptor(h.dtype, h.address, store=True))
        uav_at += cmd.DESC_BYTES
      else:
        struct.pack_into("<16I", view, tex_at, *cmd.tex_descriptor(h.dtype, h.address))
        tex_at += cmd.DESC_BYTES
    if self.nsamp:
      s = o + cmd.DESC_OFF + (self.nuav + self.ntex) * cmd.DESC_BYTES
      view[s:s + len(self.samplers)] = self.samplers
    key = (gs, ls, st.ensure_private(self.private_bytes) if self.private_bytes else 0)  # private memory may have moved
    if (prep := self.words.get(key)) is None: prep = self._words_for(key)
    template, lows = prep
    words = array("I", template)
    for i in lows:  # the argument block's address, in each place the launch names it (low word, then high word)
      a = template[i] + base
      words[i], words[i + 1] = a & 0xFFFFFFFF, a >> 32
    value = st.value + 1
    words[-1] = value & 0xFFFFFFFF  # the timeline store's payload
    st.submit(slot, words, value)
    return value
