"""Data types of kernel values and buffers.

Every dtype is a singleton, so `dt is dtypes.float32` is the cheap comparison the
launch path uses. `bfloat16` has no numpy type: on the host it is stored as its raw
16 bits (numpy uint16) and the helpers here convert to and from float32.
"""
from __future__ import annotations

import math
import re
import struct
from collections.abc import Callable, Iterator
from typing import Any

# The classes here are written out rather than made with @dataclass: a frozen dataclass compiles its
# methods with exec when the module is imported, and `import plugrt` loads this module.


class DType:
  """A data type; immutable, compared by identity (each exists once, in `dtypes`)."""
  __slots__ = ("name", "itemsize", "kind", "fmt")
  name: str
  itemsize: int
  kind: str  # "b" bool, "i" signed int, "u" unsigned int, "f" float
  fmt: str   # struct format of one element (bfloat16: its raw 16 bits, "H")

  def __init__(self, name: str, itemsize: int, kind: str, fmt: str):
    for k, v in (("name", name), ("itemsize", itemsize), ("kind", kind), ("fmt", fmt)): object.__setattr__(self, k, v)

  def __setattr__(self, name: str, value: Any) -> None: raise AttributeError(f"DType is immutable: cannot set {name}")
  def __delattr__(self, name: str) -> None: raise AttributeError(f"DType is immutable: cannot delete {name}")
  def __repr__(self) -> str: return f"dtypes.{self.name}"
  def __reduce__(self) -> Any: return (getattr, (dtypes, self.name))
  @property
  def is_float(self) -> bool: return self.kind == "f"
  @property
  def is_int(self) -> bool: return self.kind in "iu"
  @property
  def is_unsigned(self) -> bool: return self.kind == "u"
  @property
  def is_bool(self) -> bool: return self.kind == "b"
  @property
  def bits(self) -> int: return self.itemsize * 8

  @property
  def min(self) -> int | float:
    if self.kind == "b": return False
    if self.kind == "u": return 0
    if self.kind == "i": return -(1 << (self.bits - 1))
    return -math.inf

  @property
  def max(self) -> int | float:
    if self.kind == "b": return True
    if self.kind == "u": return (1 << self.bits) - 1
    if self.kind == "i": return (1 << (self.bits - 1)) - 1
    return math.inf

  def __getitem__(self, s: Any) -> BufType:
    """`dtypes.float32[:]`: the type of a buffer parameter of a @kernel."""
    if s != slice(None): raise TypeError(f"write {self!r}[:] for a buffer of {self.name}")
    return BufType(self)

  @property
  def numpy(self) -> Any:
    """The numpy dtype that holds this dtype's bytes (bfloat16: uint16 raw bits)."""
    import numpy as np
    return np.dtype("uint16") if self is dtypes.bfloat16 else np.dtype(self.fmt if self.kind != "b" else "bool")


class BufType:
  """The annotation of a @kernel buffer parameter: `dtypes.float32[:]`."""
  __slots__ = ("dtype",)
  dtype: DType

  def __init__(self, dtype: DType): object.__setattr__(self, "dtype", dtype)
  def __setattr__(self, name: str, value: Any) -> None: raise AttributeError(f"BufType is immutable: cannot set {name}")
  def __repr__(self) -> str: return f"{self.dtype!r}[:]"
  def __eq__(self, other: object) -> bool: return isinstance(other, BufType) and other.dtype is self.dtype
  def __hash__(self) -> int: return hash(("BufType", self.dtype.name))
  def __reduce__(self) -> Any: return (BufType, (self.dtype,))


class PtrDType:
  """The type of a buffer parameter or shared array: a pointer to `base` elements."""
  __slots__ = ("base", "addrspace")
  base: DType
  addrspace: str  # "global", "shared" or "private"

  def __init__(self, base: DType, addrspace: str = "global"):
    object.__setattr__(self, "base", base)
    object.__setattr__(self, "addrspace", addrspace)

  def __setattr__(self, name: str, value: Any) -> None: raise AttributeError(f"PtrDType is immutable: cannot set {name}")
  def __reduce__(self) -> Any: return (PtrDType, (self.base, self.addrspace))
  def __repr__(self) -> str: return f"{self.base!r}.ptr({self.addrspace!r})"
  def __eq__(self, other: object) -> bool:
    return isinstance(other, PtrDType) and other.base is self.base and other.addrspace == self.addrspace
  def __hash__(self) -> int: return hash((self.base.name, self.addrspace))


class ImageDType(DType):
  """A 2D image of h x w RGBA texels of `base` (float32: `dtypes.imagef((h, w))`, float16: `dtypes.imageh((h, w))`).

  A buffer of an image dtype holds h*w*4 scalars of `base`: `itemsize`, `kind`, `fmt` and `numpy` are the base's,
  so `Buffer(dev, h*w*4, dtypes.imagef((h, w)))` has nbytes h*w*4*4 and reads back as a numpy array of float32,
  laid out as an (h, w, 4) array: texel (x, y), channel c is element (y*w + x)*4 + c (x is the column, y the row).
  On a device with images the memory is the device's image object (OpenCL's image2d_t) rather than a plain buffer;
  kernels reach its texels only through the IR's TEXEL_LOAD and TEXEL_STORE (plain loads and stores are refused).
  Image dtypes are interned: the same (base, shape) is the same object, so `is` compares them, as for every dtype.
  """
  __slots__ = ("base", "shape")
  base: DType
  shape: tuple[int, int]  # (height, width) in texels

  def __new__(cls, base: DType, shape: tuple[int, int]) -> ImageDType:
    key = (base.name, shape)
    if (found := _IMAGES.get(key)) is None:
      found = _IMAGES[key] = object.__new__(cls)
      DType.__init__(found, f"image{_IMAGE_BASES[base]}_{shape[0]}x{shape[1]}", base.itemsize, base.kind, base.fmt)
      object.__setattr__(found, "base", base)
      object.__setattr__(found, "shape", shape)
    return found

  def __init__(self, base: DType, shape: tuple[int, int]): pass  # __new__ did the work (and returns the interned one)
  def __repr__(self) -> str: return f"dtypes.image{_IMAGE_BASES[self.base]}(({self.shape[0]}, {self.shape[1]}))"
  def __reduce__(self) -> Any: return (image_dtype, (self.base, self.shape))
  def __eq__(self, other: object) -> bool: return other is self
  def __hash__(self) -> int: return hash(("image", self.base.name, self.shape))
  @property
  def height(self) -> int: return self.shape[0]
  @property
  def width(self) -> int: return self.shape[1]
  @property
  def size(self) -> int:
    """Scalars of `base` the image holds: h*w*4 (the size of a Buffer of this dtype)."""
    return self.shape[0] * self.shape[1] * 4


_IMAGES: dict[tuple[str, tuple[int, int]], ImageDType] = {}
_IMAGE_BASES: dict[DType, str] = {}  # base dtype -> the letter of its constructor (f: float32, h: float16); filled below


def image_dtype(base: DType, shape: Any, max_size: tuple[int, int] | None = None) -> ImageDType:
  """The image dtype of `base` texels (float32 or float16) and shape (height, width): positive ints, each at most
  `max_size`'s (height, width) where a device's limit is known. ImageError (a ValueError) names what is wrong."""
  from plugrt.errors import ImageError
  if base not in _IMAGE_BASES: raise ImageError(f"images hold float32 or float16 texels, not {base!r}", "use dtypes.imagef or dtypes.imageh")
  if not isinstance(shape, (tuple, list)) or len(shape) != 2:
    raise ImageError(f"an image shape is (height, width), got {shape!r}", "e.g. dtypes.imagef((480, 640))")
  for d in shape:
    if not isinstance(d, int) or isinstance(d, bool) or d <= 0:
      raise ImageError(f"image shape {tuple(shape)!r}: height and width must be positive ints, not {d!r}", "e.g. dtypes.imagef((480, 640))")
  h, w = int(shape[0]), int(shape[1])
  if max_size is not None and (h > max_size[0] or w > max_size[1]):
    raise ImageError(f"image shape ({h}, {w}) is larger than the device's largest image ({max_size[0]}, {max_size[1]}) (height, width)",
                     "split the image into tiles, or use a plain buffer")
  return ImageDType(base, (h, w))


def is_image(dt: Any) -> bool:
  """Whether `dt` is an image dtype."""
  return isinstance(dt, ImageDType)


class dtypes:
  bool = DType("bool", 1, "b", "?")
  int8 = DType("int8", 1, "i", "b")
  int16 = DType("int16", 2, "i", "h")
  int32 = DType("int32", 4, "i", "i")
  int64 = DType("int64", 8, "i", "q")
  uint8 = DType("uint8", 1, "u", "B")
  uint16 = DType("uint16", 2, "u", "H")
  uint32 = DType("uint32", 4, "u", "I")
  uint64 = DType("uint64", 8, "u", "Q")
  float16 = DType("float16", 2, "f", "e")
  bfloat16 = DType("bfloat16", 2, "f", "H")
  float32 = DType("float32", 4, "f", "f")
  float64 = DType("float64", 8, "f", "d")
  # the usual short names
  half, float, double = float16, float32, float64
  char, uchar, short, ushort, int, uint, long, ulong = int8, uint8, int16, uint16, int32, uint32, int64, uint64
  default_float, default_int = float32, int32

  @staticmethod
  def imagef(shape: tuple[int, int]) -> ImageDType:
    """A 2D image of (height, width) RGBA texels of float32 (see ImageDType)."""
    return image_dtype(dtypes.float32, shape)

  @staticmethod
  def imageh(shape: tuple[int, int]) -> ImageDType:
    """A 2D image of (height, width) RGBA texels of float16 (see ImageDType)."""
    return image_dtype(dtypes.float16, shape)

  @staticmethod
  def all() -> tuple[DType, ...]: return _ALL

  @staticmethod
  def from_name(name: str) -> DType:
    if isinstance(found := getattr(dtypes, str(name), None), DType): return found
    if (m := _IMAGE_NAME.match(str(name))) is not None:  # an image dtype's name: imagef_480x640 (height x width)
      return image_dtype({"f": dtypes.float32, "h": dtypes.float16}[m[1]], (int(m[2]), int(m[3])))
    raise ValueError(f"unknown dtype {name!r}; known: {', '.join(d.name for d in _ALL)}")

  @staticmethod
  def from_numpy(npdtype: Any) -> DType:
    """The dtype for a numpy dtype (raises TypeError for ones plugrt has no dtype for)."""
    import numpy as np
    nd = np.dtype(npdtype)
    if nd == np.bool_: return dtypes.bool
    for dt in _ALL:
      if dt.kind == nd.kind and dt.itemsize == nd.itemsize and dt is not dtypes.bfloat16: return dt
    if nd.name == "bfloat16": return dtypes.bfloat16  # ml_dtypes' bfloat16
    raise TypeError(f"numpy dtype {nd} has no plugrt dtype; use one of {', '.join(d.name for d in _ALL)}")

  @staticmethod
  def from_py(x: Any) -> DType:
    """The default dtype for a Python scalar."""
    if isinstance(x, bool): return dtypes.bool
    if isinstance(x, int): return dtypes.default_int
    if isinstance(x, float): return dtypes.default_float
    raise TypeError(f"no dtype for Python value {x!r} of type {type(x).__name__}")

  @staticmethod
  def from_torch(torch_dtype: Any) -> DType:
    """The dtype for a torch dtype (torch.float32 -> dtypes.float32), without importing torch: a torch dtype is
    recognised by its type's module and named by its str ("torch.float32"). TypeError for ones plugrt lacks."""
    if type(torch_dtype).__module__ != "torch": raise TypeError(f"{torch_dtype!r} is not a torch dtype")
    name = str(torch_dtype).removeprefix("torch.")  # torch's aliases print their canonical name: str(torch.half) is torch.float16
    if (found := _BY_NAME.get(name)) is not None: return found
    raise TypeError(f"torch dtype {torch_dtype} has no plugrt dtype; use one of {', '.join(d.name for d in _ALL)}")

  @staticmethod
  def to_torch(dtype: DType | str | Any) -> Any:
    """The torch dtype for a dtype (imports torch). TypeError where this torch has no such dtype (uint16, uint32 and
    uint64 came in torch 2.3)."""
    import torch
    dt = dtypes.as_dtype(dtype)
    if isinstance(found := getattr(torch, dt.name, None), torch.dtype): return found
    raise TypeError(f"torch {torch.__version__} has no dtype for {dt.name}; cast to another dtype first, or use a newer torch")

  @staticmethod
  def as_dtype(x: DType | str | Any) -> DType:
    """Accept a DType, a name ("float32"), a numpy dtype or scalar type (np.float32) or a torch dtype (torch.float32);
    TypeError for anything else (None included: numpy would read it as float64)."""
    if isinstance(x, DType): return x
    if isinstance(x, str): return dtypes.from_name(x)
    if type(x).__module__ == "torch": return dtypes.from_torch(x)
    if isinstance(x, type) or type(x).__module__.split(".")[0] == "numpy":  # np.float32, ml_dtypes.bfloat16, np.dtype("f4")
      return dtypes.from_numpy(x)
    raise TypeError(f"{x!r} ({type(x).__name__}) is not a dtype; pass a plugrt dtype (dtypes.float32), its name ('float32'), "
                    "a numpy dtype (np.float32) or a torch dtype")


_ALL: tuple[DType, ...] = (dtypes.bool, dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64, dtypes.uint8, dtypes.uint16,
                           dtypes.uint32, dtypes.uint64, dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64)
_BY_NAME: dict[str, DType] = {d.name: d for d in _ALL}
_IMAGE_BASES.update({dtypes.float32: "f", dtypes.float16: "h"})
_IMAGE_NAME = re.compile(r"^image([fh])_(\d+)x(\d+)$")  # canonical names only (not "half", "long": torch's mean other things)


def iter_dtypes() -> Iterator[DType]: return iter(_ALL)


# The seeds' spellings (tinygrad.dtype's), kept beside plugrt's own so their torch interop code runs unchanged:
# `from plugrt.dtype import _from_torch_dtype` is dtypes.from_torch, `_to_torch_dtype` dtypes.to_torch.
_from_torch_dtype = dtypes.from_torch
_to_torch_dtype = dtypes.to_torch


def bf16_to_f32(raw: Any) -> Any:
  """numpy uint16 raw bfloat16 bits -> float32 (exact)."""
  import numpy as np
  return (np.asarray(raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x: Any) -> Any:
  """float32 -> raw bfloat16 bits, rounding to nearest even; NaN stays a quiet NaN."""
  import numpy as np
  u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
  rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
  nan = np.isnan(np.asarray(x, dtype=np.float32))
  return np.where(nan, ((u >> 16) | 0x40).astype(np.uint16), rounded)


def float_bits(x: float | int, dt: DType) -> int:
  """The bits of a Python number as float dtype `dt`, rounded the IEEE way: to nearest even, and past the largest
  finite value to +-inf (1e300 as float32 is inf, as numpy and the IR's cast from float64 have it). Every backend packs
  float scalars (`vals=`) with this, so a value out of a dtype's range means the same on every device."""
  if dt is dtypes.bfloat16:  # float32 first, then bfloat16 to nearest even: the IR's cast to bfloat16
    u = float_bits(x, dtypes.float32)
    if (u & 0x7FFFFFFF) > 0x7F800000: return (u >> 16) | 0x40  # NaN stays a quiet NaN
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF
  inf = -math.inf if x < 0 else math.inf
  try: f = float(x)
  except OverflowError: f = inf  # an int past float64's range
  try: return int.from_bytes(struct.pack("<" + dt.fmt, f), "little")
  except OverflowError: return int.from_bytes(struct.pack("<" + dt.fmt, inf), "little")  # rounds past dt's largest value


def float_packer(dt: DType) -> Callable[[float | int], int]:
  """float_bits for one dtype, as fast as a plain struct round trip for values in range (a launch packs with it)."""
  if dt is dtypes.bfloat16 or dt.kind != "f": return lambda x: float_bits(x, dt)
  pack, unpack = struct.Struct("<" + dt.fmt).pack, struct.Struct("<" + {2: "H", 4: "I", 8: "Q"}[dt.itemsize]).unpack

  def bits(x: float | int) -> int:
    try: return unpack(pack(x))[0]
    except (OverflowError, struct.error): return float_bits(x, dt)  # out of range (or an int past float64's): the full rule
  return bits


def float_value(x: float | int, dt: DType) -> float:
  """A Python number rounded to float dtype `dt` (see float_bits), as a Python float."""
  bits = float_bits(x, dt)
  if dt is dtypes.bfloat16: return struct.unpack("<f", (bits << 16).to_bytes(4, "little"))[0]
  return struct.unpack("<" + dt.fmt, bits.to_bytes(dt.itemsize, "little"))[0]


#: float16, float32 and float64 as struct packs them: a Python float or int rounded to one of them is one pack and
#: unpack (float_value's rounding; past the dtype's range the pack raises, and float_value gives inf)
_ROUNDS = {dtypes.float16: struct.Struct("<e"), dtypes.float32: struct.Struct("<f"), dtypes.float64: struct.Struct("<d")}


def cast_value(x: Any, dt: DType) -> Any:
  """A Python scalar converted the way a kernel's cast would (ints wrap, floats round)."""
  if ((t := type(x)) is float or t is int) and (st := _ROUNDS.get(dt)) is not None:  # (every Tensor op with a number asks)
    try: return st.unpack(st.pack(x))[0]
    except (OverflowError, struct.error): pass  # past float64's range as an int, or the dtype's
  if dt.kind == "b": return bool(x)
  if dt.kind in "iu":
    v = int(x) & ((1 << dt.bits) - 1)
    return v - (1 << dt.bits) if dt.kind == "i" and v >> (dt.bits - 1) else v
  if isinstance(x, (int, float)): return float_value(x, dt)  # IEEE rounding, out of range: inf (no numpy overflow warning)
  import numpy as np
  if dt is dtypes.bfloat16: return float(bf16_to_f32(f32_to_bf16(np.float32(x))))
  return float(np.array(x, dtype=dt.numpy))
