"""DLPack, both ways, for Buffers viewed with shape, strides and an offset: Tensor.__dlpack__ / __dlpack_device__
and Tensor.from_dlpack are built on it (this module knows Buffers, not Tensors).

Zero copy in both directions. Export hands out the tensor's own memory (realised
first, strides and offset kept); the tensor stays alive until the consumer calls the
deleter. Import wraps the producer's memory with Buffer.from_blob on the matching
plugrt device and calls the producer's deleter when the last plugrt view of it is
gone. Only devices whose allocator reports a DLPack device (`dlpack_device()`) and
addresses (`_pointer`) take part; others raise UnsupportedError.

Both capsule kinds: DLPack 1.0's versioned one ("dltensor_versioned", which carries a
read-only flag, so consumers such as numpy give writable arrays) when the consumer asks
with max_version >= (1, 0), else the legacy "dltensor".
"""
from __future__ import annotations

import ctypes
import math
import struct
from typing import TYPE_CHECKING, Any, NamedTuple

from plugrt.dtype import DType, dtypes
from plugrt.errors import UnsupportedError

if TYPE_CHECKING:
  from plugrt.device import Buffer, RuntimeDevice

KDL_CPU, KDL_CUDA, KDL_CUDA_HOST, KDL_OPENCL, KDL_VULKAN, KDL_METAL, KDL_ROCM, KDL_WEBGPU = 1, 2, 3, 4, 7, 8, 10, 15
_DEVICE_NAMES = {KDL_CPU: "host", KDL_CUDA: "CUDA", KDL_ROCM: "AMD", KDL_METAL: "METAL", KDL_OPENCL: "CL", KDL_WEBGPU: "WEBGPU"}
_CODES = {"i": 0, "u": 1, "f": 2, "b": 6}  # kDLInt, kDLUInt, kDLFloat, kDLBool; bfloat16 is kDLBfloat (4)


class DLDevice(ctypes.Structure): _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]
class DLDataType(ctypes.Structure): _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
  _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32), ("dtype", DLDataType),
              ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure): pass


DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER)]


class DLPackVersion(ctypes.Structure): _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]
class DLManagedTensorVersioned(ctypes.Structure): pass


DELETER_V = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensorVersioned))
DLManagedTensorVersioned._fields_ = [("version", DLPackVersion), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER_V),
                                     ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]
FLAG_READ_ONLY = 1
# PyCapsule_SetName keeps the pointer it is given: these names must live as long as the process
_USED = {b"dltensor": b"used_dltensor", b"dltensor_versioned": b"used_dltensor_versioned"}

_api = ctypes.pythonapi
_api.PyCapsule_New.restype, _api.PyCapsule_New.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_api.PyCapsule_GetPointer.restype, _api.PyCapsule_GetPointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_SetName.restype, _api.PyCapsule_SetName.argtypes = ctypes.c_int, [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_IsValid.restype, _api.PyCapsule_IsValid.argtypes = ctypes.c_int, [ctypes.py_object, ctypes.c_char_p]
# The capsule destructor runs while the capsule is being destroyed, often while the consumer's own exception is
# pending (numpy refusing a GPU tensor). CPython rejects a Python callback returning in that state and the
# consumer's error is lost, so the destructor is machine code (plugrt.machinecode): if the capsule still carries one
# of our names (it was never consumed; PyCapsule_New keeps the pointer it is given), it appends the capsule's
# pointer to a ring that Python drains on the next DLPack call. Without it (not x86-64) capsules get no
# destructor, and one that is never consumed keeps its tensor alive until the process ends.
_NAME, _NAME_V = b"dltensor", b"dltensor_versioned"
_RING_SLOTS = 1024  # unconsumed capsules between two drains (more are not released: kept alive, never a crash)
_ring = (ctypes.c_uint64 * (1 + _RING_SLOTS))()  # [count, pointers...]
_drained = 0


def _make_destructor() -> int | None:
  from plugrt import machinecode
  name = lambda b: ctypes.cast(ctypes.c_char_p(b), ctypes.c_void_p).value or 0
  second = bytes.fromhex("48ba") + machinecode.imm64(name(_NAME_V)) + bytes.fromhex("4839d0")  # mov rdx, _NAME_V; cmp rax, rdx
  found = b"".join([
    bytes.fromhex("488b4710"),                                       # mov rax, [rdi+16]  the capsule's pointer
    bytes.fromhex("48b9") + machinecode.imm64(ctypes.addressof(_ring)),  # mov rcx, ring
    bytes.fromhex("ba01000000" "f0480fc111"),                       # mov edx, 1; lock xadd [rcx], rdx
    bytes.fromhex("4881e2") + struct.pack("<I", _RING_SLOTS - 1),   # and rdx, slots-1
    bytes.fromhex("488944d108")])                                    # mov [rcx+8+rdx*8], rax
  asm = b"".join([
    bytes.fromhex("488b4718"),                                       # mov rax, [rdi+24]  the capsule's name
    bytes.fromhex("48ba") + machinecode.imm64(name(_NAME)) + bytes.fromhex("4839d0"),  # mov rdx, _NAME; cmp rax, rdx
    bytes([0x74, len(second) + 2]),                                  # je found
    second, bytes([0x75, len(found)]),                               # jne done
    found, bytes.fromhex("c3")])                                     # done: ret
  return machinecode.code(asm)


_DESTRUCTOR = _make_destructor()


def _drain() -> None:
  """Release what unconsumed capsules held (their pointers wait in the ring)."""
  global _drained
  count = _ring[0]
  for i in range(max(_drained, count - _RING_SLOTS), count): _exported.pop(_ring[1 + (i & (_RING_SLOTS - 1))], None)
  _drained = count


def dtype_code(dt: DType) -> tuple[int, int]:
  return (4, 16) if dt is dtypes.bfloat16 else (_CODES[dt.kind], dt.bits)


def dtype_from_code(code: int, bits: int, lanes: int) -> DType:
  if lanes != 1: raise UnsupportedError(f"DLPack tensors with {lanes} lanes are not supported", "pass a scalar-typed tensor")
  if (code, bits) == (4, 16): return dtypes.bfloat16
  for dt in dtypes.all():
    if dt is not dtypes.bfloat16 and dtype_code(dt) == (code, bits): return dt
  raise UnsupportedError(f"DLPack dtype (code {code}, {bits} bits) has no plugrt dtype")


def dlpack_device(dev: RuntimeDevice) -> tuple[int, int]:
  d = dev.allocator.dlpack_device()
  if d is None: raise UnsupportedError(f"{dev.canonical} memory cannot be shared through DLPack", "copy the tensor to a host device with .to('CPU')")
  return d


# ---------------------------------------------------------------- export

_exported: dict[int, Any] = {}  # manager address -> what must stay alive until the consumer lets go


def _release(managed: Any) -> None:
  _exported.pop(ctypes.addressof(managed.contents), None)  # dict.pop is atomic under the GIL


_deleter, _deleter_v = DELETER(_release), DELETER_V(_release)


def to_dlpack(buffer: Buffer, shape: tuple[int, ...], strides: tuple[int, ...], offset: int, owner: Any, stream: Any = None,
              **kwargs: Any) -> Any:
  """A "dltensor" capsule for the elements of `buffer` at offset + sum(i_d * strides_d) (in elements), for consumers
  such as np.from_dlpack and torch.from_dlpack. `owner` (the exported tensor) stays alive until the consumer lets go.
  kwargs: the __dlpack__ protocol's dl_device and max_version (copy is the caller's: it hands over a copy's memory)."""
  dev = buffer.device
  dl_dev = dlpack_device(dev)
  if dl_dev[0] != KDL_CPU: dev.synchronize()  # the consumer may read on any stream: finish plugrt's work first
  if (want := kwargs.get("dl_device")) is not None and tuple(want) != dl_dev:
    raise BufferError(f"the tensor lives on {dev.canonical} (DLPack device {dl_dev}), not on {tuple(want)}")
  ndim = len(shape)
  versioned = tuple(kwargs.get("max_version") or (0, 0)) >= (1, 0)
  m: Any = DLManagedTensorVersioned() if versioned else DLManagedTensor()
  shape_arr, strides_arr = (ctypes.c_int64 * max(ndim, 1))(*shape), (ctypes.c_int64 * max(ndim, 1))(*strides)
  m.dl_tensor.data = dev.allocator._pointer(buffer.handle)
  m.dl_tensor.device = DLDevice(*dl_dev)
  m.dl_tensor.ndim = ndim
  code, bits = dtype_code(buffer.dtype)
  m.dl_tensor.dtype = DLDataType(code, bits, 1)
  m.dl_tensor.shape = ctypes.cast(shape_arr, ctypes.POINTER(ctypes.c_int64))
  m.dl_tensor.strides = ctypes.cast(strides_arr, ctypes.POINTER(ctypes.c_int64))
  m.dl_tensor.byte_offset = offset * buffer.dtype.itemsize
  if versioned:
    m.version, m.flags, m.deleter = DLPackVersion(1, 0), 0, _deleter_v
  else: m.deleter = _deleter
  addr = ctypes.addressof(m)
  _exported[addr] = (m, shape_arr, strides_arr, buffer, owner)
  _drain()
  return _api.PyCapsule_New(addr, _NAME_V if versioned else _NAME, _DESTRUCTOR)


# ---------------------------------------------------------------- import

class _Producer:
  """Owns an imported DLManagedTensor: its deleter runs when plugrt no longer holds the memory."""
  def __init__(self, managed: Any): self.managed = managed
  def __del__(self) -> None:
    try:
      if self.managed.contents.deleter: self.managed.contents.deleter(self.managed)
    except Exception: pass  # interpreter shutdown


def _host_device(requested: Any) -> Any:
  from plugrt.device import Device, _device
  if requested is not None: return _device(requested)
  default = _device(None)
  if default.allocator.dlpack_device() == (KDL_CPU, 0): return default
  for name in Device.available():
    dev = Device[name]
    if dev.allocator.dlpack_device() == (KDL_CPU, 0) and dev.allocator.supports_wrap: return dev
  raise UnsupportedError("no plugrt device can wrap host memory", "install plugrt-cpu")


class Imported(NamedTuple):
  """A producer's memory as plugrt sees it: element (i0, i1, ...) is buffer[offset + sum(i_d * strides_d)]."""
  buffer: Buffer
  shape: tuple[int, ...]
  strides: tuple[int, ...]
  offset: int


def from_dlpack(obj: Any, device: Any = None) -> Imported:
  """Wrap the memory of any object implementing __dlpack__ (numpy, torch, cupy, ...) as a Buffer, zero copy;
  Tensor.from_dlpack makes a Tensor of it (Tensor.from_buffer)."""
  from plugrt.device import Buffer, _device
  if not hasattr(obj, "__dlpack__"): raise TypeError(f"{type(obj).__name__} does not implement __dlpack__")
  dev_type, dev_id = obj.__dlpack_device__() if hasattr(obj, "__dlpack_device__") else (KDL_CPU, 0)
  if dev_type in (KDL_CPU, KDL_CUDA_HOST): dev = _host_device(device)
  elif dev_type in _DEVICE_NAMES: dev = _device(device or f"{_DEVICE_NAMES[dev_type]}:{dev_id}")
  else: raise UnsupportedError(f"DLPack device type {dev_type} has no plugrt backend")
  if dev.allocator.dlpack_device() not in ((dev_type, dev_id), (KDL_CPU, 0) if dev_type == KDL_CUDA_HOST else None):
    raise UnsupportedError(f"{dev.canonical} cannot address memory of DLPack device ({dev_type}, {dev_id})", "pass a matching device=")
  # a GPU producer makes its data ready for the stream we name: 1, CUDA's legacy default stream, which plugrt uses
  stream = {"stream": 1} if dev_type == KDL_CUDA else {"stream": 0} if dev_type == KDL_ROCM else {}  # ROCm: 0 (1 and 2 are CUDA-only)
  try: capsule = obj.__dlpack__(max_version=(1, 0), **stream)
  except TypeError: capsule = obj.__dlpack__(**stream)  # a producer from before DLPack 1.0
  versioned = bool(_api.PyCapsule_IsValid(capsule, b"dltensor_versioned"))
  name = b"dltensor_versioned" if versioned else b"dltensor"
  ptr = _api.PyCapsule_GetPointer(capsule, name)
  managed = ctypes.cast(ptr, ctypes.POINTER(DLManagedTensorVersioned if versioned else DLManagedTensor))
  _api.PyCapsule_SetName(capsule, _USED[name])  # ours now: the producer's capsule destructor must not free it
  owner = _Producer(managed)
  if versioned and managed.contents.flags & FLAG_READ_ONLY:
    del owner
    raise UnsupportedError("the DLPack producer marks this memory read-only; plugrt tensors are writable", "import a copy: Tensor(np.array(x))")
  t = managed.contents.dl_tensor
  dt = dtype_from_code(t.dtype.code, t.dtype.bits, t.dtype.lanes)
  shape = tuple(t.shape[i] for i in range(t.ndim))
  strides = tuple(t.strides[i] for i in range(t.ndim)) if t.strides else None
  strides = strides if strides is not None else tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))
  if t.byte_offset % dt.itemsize: raise UnsupportedError("a DLPack byte offset that is not a whole number of elements")
  lo = sum(min(0, (d - 1) * s) for d, s in zip(shape, strides)) if math.prod(shape) else 0
  hi = sum(max(0, (d - 1) * s) for d, s in zip(shape, strides)) + 1 if math.prod(shape) else 0
  base = (t.data or 0) + t.byte_offset + lo * dt.itemsize
  if base == 0 or hi - lo <= 0:  # empty: nothing to wrap
    return Imported(Buffer(dev, 0, dt), shape, (0,) * len(shape), 0)
  if dev_type == KDL_METAL and (start := t.byte_offset + lo * dt.itemsize):  # Metal's data is an MTLBuffer: wrap it, view inside
    whole = Buffer.from_blob(t.data, start // dt.itemsize + hi - lo, dt, dev, keepalive=owner)
    return Imported(whole.view(hi - lo, offset=start), shape, strides, -lo)
  return Imported(Buffer.from_blob(base, hi - lo, dt, dev, keepalive=owner), shape, strides, -lo)
