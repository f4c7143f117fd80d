"""An opened device (RuntimeDevice) and typed memory on one (Buffer): what the registry makes and users hold.

The registry opens a device once (its hooks build the allocator, program factory and compiler then) and keeps the
RuntimeDevice; plugrt.device's `Device["CPU"]` asks it. This module sits below the registry: a device named by a string
(`Buffer("CPU", 4)`) is opened through the opener the registry installs here when it loads (`open_by_name`).
"""
from __future__ import annotations

import atexit
import math
import weakref
from _thread import allocate_lock  # threading's locks, without importing threading (discovery would pay for it)
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from plugrt.context import BufferBase, DeviceInfo
from plugrt.dtype import DType, ImageDType, dtypes
from plugrt.errors import RenderError, UnknownDeviceError

if TYPE_CHECKING:
  from plugrt.runtime import Allocator, Compiler, KernelLike, Program

#: opens a device by name (None: the default) in the process's registry; plugrt.registry installs it when it loads
open_by_name: Callable[[str | None], RuntimeDevice] | None = None

_OPENED: weakref.WeakSet[RuntimeDevice] = weakref.WeakSet()


@atexit.register
def _wait_for_queued_work_at_exit() -> None:
  """A process that ends with work still queued waits for it before the interpreter tears down: the work may read
  memory whose owner goes with the interpreter (wrapped host arrays let go at a synchronize), and a driver's worker
  threads may still run it (PoCL's did, and the process died at exit). A device that cannot wait raises: ignored here."""
  for dev in list(_OPENED):
    try: dev.synchronize()
    except Exception: pass


class RuntimeDevice:
  """An opened device: its allocator, its program factory and its compilers."""

  def __init__(self, registry: Any, backend: Any, info: DeviceInfo):
    """registry: the plugrt.registry.Registry that opened it; backend: its record of the device's backend."""
    self.registry, self.backend, self.info = registry, backend, info
    self.name, self.index, self.canonical = info.name, info.index, info.canonical
    self.allocator: Allocator = registry.build(info, backend, "plugrt_allocator")
    self.program_factory = registry.build(info, backend, "plugrt_program")
    self._compilers: dict[str, Compiler] = {}
    self._programs: dict[tuple[str, str, Any], Program] = {}
    self._kernel_programs: dict[tuple[int, str], tuple[KernelLike, Program]] = {}
    self._lock = allocate_lock()
    self._graph_factory: Any = None
    self._peer_paths: dict[str, str] = {}  # destination device -> how copies to it travel (Allocator.peer_path), asked once
    #: owners (keepalive) of dropped wrapped buffers that queued work may still read: let go at the next synchronize
    self._owners_after_work: list[Any] = []
    _OPENED.add(self)

  @property
  def compiler(self) -> Compiler | None:
    """The device's chosen compiler, built on first use (opening a device to copy memory builds none)."""
    return self.compiler_for(self.info.compiler) if self.info.compiler else None

  def __repr__(self) -> str: return f"<Device {self.canonical} compiler={self.info.compiler or '-'}>"
  def __str__(self) -> str: return self.canonical

  def compiler_for(self, name: str) -> Compiler:
    """The device's compiler named `name` (built once)."""
    name = name.upper()
    if (c := self._compilers.get(name)) is None:
      spec = self.backend.spec
      known = [c.name for c in spec.compilers] if spec else []
      if name not in known:
        from plugrt.errors import did_you_mean
        raise UnknownDeviceError(f"{self.name} has no compiler {name}{did_you_mean(name, known)}", f"{self.name} compilers: {', '.join(known)}")
      if name != self.info.compiler:
        p = self.registry.compiler_probe(self.name, name)
        if not p.ok:
          from plugrt.errors import DeviceUnavailable, Reason
          raise DeviceUnavailable(f"compiler {name} of {self.name} cannot be used: {p.detail}", p.reason or Reason.MISSING_TOOLCHAIN, p.hint)
      c = self._compilers[name] = self.registry.build(self.info, self.backend, "plugrt_compiler", compiler=name)
    return c

  def program(self, kernel: KernelLike, compiler: str | None = None) -> Program:
    """Render, compile (through the disk cache) and load `kernel`; the same kernel object
    or the same source gives the same Program without compiling again."""
    comp = self.compiler if compiler is None else self.compiler_for(compiler)
    if comp is None: raise UnknownDeviceError(f"{self.name} declares no compiler")
    if (hit := self._kernel_programs.get((id(kernel), comp.name))) is not None and hit[0] is kernel: return hit[1]
    if not self.allocator.supports_images and (imgs := kernel.images):
      from plugrt.errors import UnsupportedError
      raise UnsupportedError(f"{self.canonical} has no image support: kernel {kernel.name} takes image {imgs[0].arg[1]!r} "
                             f"({imgs[0].dtype.base!r})", "run image kernels on an image device (CL, or PYTHON for the reference)")
    if comp.max_shared_bytes is not None and (shared := kernel.shared_bytes) > comp.max_shared_bytes:
      raise RenderError(f"{self.canonical}:{comp.name} cannot run kernel {kernel.name}: its shared arrays take {shared} bytes per group "
                        f"and {comp.name} allows {comp.max_shared_bytes}", "use smaller shared arrays, or keep the data in a buffer")
    src = comp.render(kernel)
    # the signature is part of the key: two kernels may render alike (LLVM IR has one i32 for int32 and uint32) and a
    # Program checks its arguments' dtypes against the signature it was loaded with
    key = (comp.name, src, kernel.signature)
    if (prg := self._programs.get(key)) is None:
      lib, cached = comp.compile_cached(src)
      try: prg = self.load(kernel.name, lib, kernel.signature)
      except Exception as e:
        if not cached:
          comp.forget(src)  # a fresh binary that does not load is a real error; it is not served from the cache either
          raise
        prg = self.load(kernel.name, comp.recompile(src, e), kernel.signature)  # the cache held a binary that does not load
      self._programs[key] = prg
    self._kernel_programs[(id(kernel), comp.name)] = (kernel, prg)
    return prg

  def load(self, name: str, lib: bytes, signature: Any) -> Program:
    """A Program from an already compiled binary."""
    return self.program_factory(self, name, lib, signature)

  def buffer(self, size: int, dtype: DType = dtypes.float32) -> Buffer: return Buffer(self, size, dtype)

  def host_array(self, shape: Any, dtype: DType = dtypes.float32) -> Any:
    """A numpy array in the host memory this device copies from and to fastest: page-locked on GPUs (copies
    then run at DMA speed, with no staging), plain memory elsewhere. Freed with the array."""
    import numpy as np
    dtype = dtypes.as_dtype(dtype)
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    from plugrt.runtime import check_nbytes
    for d in shape: check_nbytes(d, "a dimension")
    nbytes = max(math.prod(shape) * dtype.itemsize, 1)  # Python ints: numpy's prod would wrap at 2**63
    if nbytes > self.allocator.max_alloc_bytes:
      from plugrt.errors import OutOfMemoryError
      from plugrt.runtime import size_str
      raise OutOfMemoryError(f"{self.canonical}: a host array of {size_str(nbytes)} is larger than any allocation can be", "allocate less")
    got = self.allocator._host_alloc(nbytes)
    if got is None: return np.empty(shape, dtype.numpy)
    addr, free = got
    import ctypes
    raw = (ctypes.c_uint8 * nbytes).from_address(addr)
    import weakref
    weakref.finalize(raw, free)  # the array keeps `raw` alive through its base; when both go, the memory is freed
    return np.frombuffer(raw, dtype.numpy, math.prod(shape)).reshape(shape)

  def graph(self, launches: Any) -> Any:
    """A Graph replaying `launches` (plugrt.runtime.Launch) as one batch, natively where the backend can."""
    from plugrt.runtime import Graph
    if self._graph_factory is None:
      self._graph_factory = self.registry.call_hook(self.backend.plugin, "plugrt_graph", device=self.info) or Graph
    return self._graph_factory(self, list(launches))

  def synchronize(self) -> None:
    """Wait for everything queued on this device; then memory it wrapped (from_blob) shows every write to its owner,
    and the owners of wrapped buffers dropped before the wait are let go."""
    owners, self._owners_after_work = self._owners_after_work, []  # work on each was queued before it was dropped
    if self.info.state is not None: self.info.state.synchronize()
    del owners

  def close(self) -> None:
    self.allocator.free_cache()
    if self.info.state is not None: self.info.state.close()
    self._owners_after_work = []


#: how many owners of dropped wrapped buffers a device holds before the next from_blob waits for it and lets them go
_OWNERS_AFTER_WORK_MAX = 64


def _device(device: str | RuntimeDevice | None) -> RuntimeDevice:
  if isinstance(device, RuntimeDevice): return device
  if open_by_name is None: raise RuntimeError("plugrt.registry is not loaded: import plugrt.device (or plugrt) to open devices by name")
  return open_by_name(device)


def _fmt_kind(fmt: str) -> str:
  c = fmt.lstrip("<>=@!")
  return "raw" if c in ("B", "b", "c") else "i" if c in "hilq" else "u" if c in "HILQ" else "f" if c in "efd" else "b" if c == "?" else c


def _byte_view(src: Any, dtype: DType, nbytes: int, what: str) -> memoryview:
  """`src` as a flat byte view of exactly nbytes, after dtype and size checks."""
  if type(src).__module__ == "numpy" and hasattr(src, "dtype"):
    import numpy as np
    want = dtype.numpy
    if src.dtype != want and not (dtype is dtypes.bfloat16 and src.dtype.name == "bfloat16"):
      raise TypeError(f"{what}: the buffer holds {dtype.name}, the array is {src.dtype}; convert it with .astype({want.name!r})")
    if not src.flags.c_contiguous: raise ValueError(f"{what}: the array is not contiguous; use np.ascontiguousarray first")
    mv = memoryview(src.reshape(-1).view(np.uint8)) if src.size else memoryview(b"")
  else:
    try: mv = memoryview(src)
    except TypeError: raise TypeError(f"{what}: {type(src).__name__} does not expose its memory (use bytes, a memoryview or a numpy array)") from None
    if not mv.c_contiguous: raise ValueError(f"{what}: the source is not contiguous; copy it first")
    kind = _fmt_kind(mv.format)
    if kind != "raw" and (kind != dtype.kind or mv.itemsize != dtype.itemsize):
      raise TypeError(f"{what}: source elements are {mv.format!r} ({mv.itemsize} bytes), the buffer holds {dtype.name}")
    mv = mv.cast("B") if (mv.ndim != 1 or mv.format != "B") and mv.nbytes else mv
  if mv.nbytes != nbytes:
    raise ValueError(f"{what}: the buffer holds {nbytes // dtype.itemsize} {dtype.name} ({nbytes} bytes), "
                     f"the source has {mv.nbytes} bytes")
  return mv


def _check_image_size(dtype: ImageDType, size: int) -> None:
  if size != dtype.size:
    from plugrt.errors import ImageError
    raise ImageError(f"a buffer of {dtype!r} holds h*w*4 = {dtype.size} {dtype.base.name} elements, not {size}",
                     f"pass size {dtype.size} (the image's height * width * 4 channels)")


class Buffer(BufferBase):
  """`size` elements of `dtype` on `device`. A view (Buffer.view) shares its base's memory. A buffer of an image dtype
  (dtypes.imagef((h, w))) has size h*w*4 and no views."""
  __slots__ = ("__weakref__", "_external", "_keepalive", "base", "device", "dtype", "handle", "nbytes", "offset", "size")

  def __init__(self, device: str | RuntimeDevice | None, size: int, dtype: DType = dtypes.float32):
    if type(size) is not int or size < 0:  # (the check's import only on this error path: tensors make a buffer per op)
      from plugrt.runtime import check_nbytes
      check_nbytes(size)
    if not isinstance(dtype, DType): dtype = dtypes.as_dtype(dtype)
    self.device, self.size, self.dtype, self.nbytes = device if type(device) is RuntimeDevice else _device(device), size, dtype, size * dtype.itemsize
    self.base: Buffer | None = None
    self.offset, self._external, self._keepalive = 0, False, None
    if isinstance(dtype, ImageDType):  # an image: its own kind of memory on the device (options tell the allocator)
      _check_image_size(dtype, size)
      self.handle = self.device.allocator.alloc(self.nbytes, dtype)
    else: self.handle = self.device.allocator.alloc(self.nbytes)

  @classmethod
  def _make(cls, device: RuntimeDevice, size: int, dtype: DType, handle: Any, base: Buffer | None, offset: int,
            external: bool = False, keepalive: Any = None) -> Buffer:
    b = cls.__new__(cls)
    b.device, b.size, b.dtype, b.nbytes, b.handle = device, size, dtype, size * dtype.itemsize, handle
    b.base, b.offset, b._external, b._keepalive = base, offset, external, keepalive
    return b

  @classmethod
  def from_numpy(cls, arr: Any, device: str | RuntimeDevice | None = None) -> Buffer:
    import numpy as np
    arr = np.ascontiguousarray(arr).reshape(-1)
    buf = cls(device, arr.size, dtypes.from_numpy(arr.dtype))
    buf.copyin(arr)
    return buf

  @classmethod
  def from_blob(cls, ptr: int, size: int, dtype: DType = dtypes.float32, device: str | RuntimeDevice | None = None,
                keepalive: Any = None) -> Buffer:
    """Wrap memory plugrt does not own (zero copy). The memory must outlive the Buffer and
    everything queued on it; pass its owner as `keepalive` to tie their lifetimes.
    Devices whose allocator cannot wrap memory raise UnsupportedError: never a copy."""
    if not isinstance(ptr, int) or isinstance(ptr, bool) or not 0 < ptr < 1 << 64:
      raise TypeError(f"ptr must be an address, an int from 1 to 2**64 - 1, got {ptr!r}")
    from plugrt.runtime import check_nbytes
    check_nbytes(size)  # before the device opens: a bad size is the caller's error whatever the device
    dev = _device(device)
    if len(dev._owners_after_work) >= _OWNERS_AFTER_WORK_MAX: dev.synchronize()  # dropped owners waiting for no sync: let them go
    dtype = dtypes.as_dtype(dtype)
    if isinstance(dtype, ImageDType):
      _check_image_size(dtype, size)
      return cls._make(dev, size, dtype, dev.allocator.wrap(ptr, size * dtype.itemsize, dtype), None, 0, True, keepalive)
    return cls._make(dev, size, dtype, dev.allocator.wrap(ptr, size * dtype.itemsize), None, 0, True, keepalive)

  def __repr__(self) -> str:
    return f"<Buffer {self.device.canonical} {self.size}x{self.dtype.name}{' view+' + str(self.offset) if self.base else ''}>"

  def __del__(self) -> None:
    try:
      if self.base is None and self.handle is not None:
        if not self._external: self.device.allocator.free(self.handle, self.nbytes, self.dtype if isinstance(self.dtype, ImageDType) else None)
        # a kernel queued on wrapped memory may still read it: its owner (keepalive) goes at the device's next
        # synchronize. A finalizer never waits for the device: it runs on whichever thread the collector runs on, which
        # may be one the device's progress depends on (a poller thread, a fake GPU's command processor)
        elif self._keepalive is not None and self.device.info.state is not None: self.device._owners_after_work.append(self._keepalive)
    except Exception: pass  # interpreter shutdown
    self.handle = None

  def view(self, size: int | None = None, dtype: DType | None = None, offset: int = 0) -> Buffer:
    """A buffer over this one's memory from byte `offset`: `size` elements of `dtype` (default: the rest)."""
    dtype = self.dtype if dtype is None else dtypes.as_dtype(dtype)
    if isinstance(dtype, ImageDType) or isinstance(self.dtype, ImageDType):
      from plugrt.errors import UnsupportedError
      raise UnsupportedError(f"{self!r}: image buffers have no views, and a view cannot be an image", "copy the data with Buffer.copy_to")
    if not isinstance(offset, int) or offset < 0 or offset > self.nbytes:
      raise ValueError(f"offset {offset} is outside the buffer's {self.nbytes} bytes")
    if offset % dtype.itemsize: raise ValueError(f"offset {offset} is not a multiple of {dtype.name}'s {dtype.itemsize} bytes")
    if size is None: size = (self.nbytes - offset) // dtype.itemsize
    from plugrt.runtime import check_nbytes
    check_nbytes(size)
    if offset + size * dtype.itemsize > self.nbytes:
      raise ValueError(f"a view of {size} {dtype.name} at byte {offset} does not fit in {self.nbytes} bytes")
    root = self.base or self
    total = self.offset + offset
    return Buffer._make(self.device, size, dtype, self.device.allocator.offset(root.handle, total, size * dtype.itemsize), root, total,
                        self._external, self._keepalive)

  def copyin(self, src: Any) -> Buffer:
    """Copy host data in: bytes, a memoryview or a numpy array of exactly this buffer's size and dtype."""
    mv = _byte_view(src, self.dtype, self.nbytes, f"copyin to {self!r}")
    if self.nbytes: self.device.allocator._copyin(self.handle, mv)
    return self._written()

  def _written(self) -> Buffer:
    """Called after plugrt queued a write into this buffer. Wrapped memory (from_blob, DLPack) shows the write to its
    owner when the call that made it returns: the device synchronises, which brings wrapped memory current
    (DeviceState.synchronize's contract; OpenCL maps it). Memory plugrt owns needs nothing: its reads are queued after."""
    if self._external: self.device.synchronize()
    return self

  def copyout(self, dest: Any) -> Any:
    """Copy into a writable host buffer (bytearray, memoryview, numpy array) of this buffer's size."""
    mv = _byte_view(dest, self.dtype, self.nbytes, f"copyout from {self!r}")
    if mv.readonly: raise TypeError(f"copyout from {self!r}: the destination is read-only")
    if self.nbytes: self.device.allocator._copyout(mv, self.handle)
    return dest

  def numpy(self) -> Any:
    import numpy as np
    out = np.empty(self.size, dtype=self.dtype.numpy)
    if self.nbytes: self.device.allocator._copyout(memoryview(out).cast("B"), self.handle)
    return out

  def tobytes(self) -> bytes:
    out = bytearray(self.nbytes)
    if self.nbytes: self.device.allocator._copyout(memoryview(out), self.handle)
    return bytes(out)

  def copy_to(self, dest: Buffer) -> Buffer:
    """Copy into `dest` (same byte size), device to device where the backend can, else through the host."""
    if dest.nbytes != self.nbytes: raise ValueError(f"cannot copy {self.nbytes} bytes into a buffer of {dest.nbytes}")
    a, b = self.device, dest.device
    if a.index != b.index and a.backend is b.backend: _report_path(a, b)  # (one index opened twice, LLVM beside CPU, is one device)
    if a.backend is b.backend and a.allocator.supports_transfer:
      a.allocator._transfer(dest.handle, self.handle, self.nbytes, a, b)
    elif a is not b or a.allocator._copy(dest.handle, self.handle, self.nbytes) is NotImplemented:  # no device copy: the host
      host = bytearray(self.nbytes)
      if self.nbytes:
        a.allocator._copyout(memoryview(host), self.handle)
        b.allocator._copyin(dest.handle, memoryview(host))
    return dest._written()

  def to(self, device: str | RuntimeDevice) -> Buffer:
    """A copy of this buffer on `device`."""
    return self.copy_to(Buffer(device, self.size, self.dtype))


def _report_path(a: RuntimeDevice, b: RuntimeDevice) -> None:
  """Warn once per pair and direction when copies between two devices of one backend go through host memory."""
  if b.canonical in a._peer_paths: return
  how = a._peer_paths[b.canonical] = a.allocator.peer_path(b)
  if how.startswith("staged"):
    import warnings

    from plugrt.errors import StagedCopyWarning
    warnings.warn(f"plugrt: copies from {a.canonical} to {b.canonical} are {how}", StagedCopyWarning, stacklevel=4)
