"""The Objective-C runtime through ctypes: classes, selectors and typed message sends (no pyobjc).

Metal is an Objective-C API: every call is `objc_msgSend(receiver, selector, args...)`, a C function that must be
called through a pointer of the exact prototype of the method it reaches. `Runtime.send(restype, *argtypes)` makes
such a typed function pointer once; callers keep it, with the selectors they use (`Runtime.sel`), so a launch does
no lookup at all: it calls prepared ctypes functions with prepared arguments.

The seam for tests: everything plugrt_metal knows of the machine goes through one Runtime object, `runtime()`.
`use_runtime(fake)` puts a fake in its place (tests/fake_objc.py records every selector and argument); the typed
functions a fake hands out are plain Python callables with the same calling convention `(receiver, sel, *args)`.
The production path pays nothing for the seam: it is consulted when a device opens, never per call.
"""
from __future__ import annotations

import ctypes
import platform
from collections.abc import Callable
from typing import Any

from plugrt_metal.macos import METAL_FRAMEWORK

_FRAMEWORKS = ("/System/Library/Frameworks/Foundation.framework/Foundation",
               # a process that never loaded CoreGraphics gets no device from MTLCreateSystemDefaultDevice (command-line tools)
               "/System/Library/Frameworks/CoreGraphics.framework/CoreGraphics")

ID, SEL, NSUInteger, NSInteger, BOOL = ctypes.c_void_p, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_long, ctypes.c_bool


class MTLSize(ctypes.Structure):
  """Metal's MTLSize: three NSUIntegers, passed by value (MTLTypes.h)."""
  _fields_ = [("width", NSUInteger), ("height", NSUInteger), ("depth", NSUInteger)]

  def __repr__(self) -> str: return f"MTLSize({self.width}, {self.height}, {self.depth})"


class NSRange(ctypes.Structure):
  """Foundation's NSRange: location and length, two NSUIntegers, passed by value (NSRange.h)."""
  _fields_ = [("location", NSUInteger), ("length", NSUInteger)]


class Runtime:
  """libobjc, libdispatch and the Metal framework, loaded once (macOS only)."""

  def __init__(self) -> None:
    self.objc = ctypes.CDLL("/usr/lib/libobjc.A.dylib")
    self.system = ctypes.CDLL("/usr/lib/libSystem.B.dylib")
    for path in _FRAMEWORKS: ctypes.CDLL(path)
    self.metal = ctypes.CDLL(METAL_FRAMEWORK + "/Metal")
    o, s, m = self.objc, self.system, self.metal
    for fn, res, args in ((o.objc_getClass, ID, [ctypes.c_char_p]), (o.sel_registerName, SEL, [ctypes.c_char_p]),
                          (o.objc_getProtocol, ctypes.c_void_p, [ctypes.c_char_p]), (o.object_getClass, ctypes.c_void_p, [ID]),
                          (o.class_conformsToProtocol, BOOL, [ctypes.c_void_p, ctypes.c_void_p]),
                          (o.class_respondsToSelector, BOOL, [ctypes.c_void_p, SEL]),
                          (o.objc_autoreleasePoolPush, ctypes.c_void_p, []), (o.objc_autoreleasePoolPop, None, [ctypes.c_void_p]),
                          (s.malloc_zone_from_ptr, ctypes.c_void_p, [ctypes.c_void_p]),
                          (s.dispatch_data_create, ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p]),
                          (m.MTLCreateSystemDefaultDevice, ID, [])):
      fn.restype, fn.argtypes = res, args
    self._msg_send = ctypes.cast(o.objc_msgSend, ctypes.c_void_p).value
    # x86-64 returns structs over 16 bytes through objc_msgSend_stret; arm64 through objc_msgSend itself
    self._msg_send_stret = ctypes.cast(o.objc_msgSend_stret, ctypes.c_void_p).value if platform.machine() == "x86_64" else self._msg_send
    #: push and pop an autorelease pool: ctypes functions of their own, called around each launch
    self.pool_push, self.pool_pop = o.objc_autoreleasePoolPush, o.objc_autoreleasePoolPop
    self._classes: set[int] = set()

  def cls(self, name: str) -> int | None: return self.objc.objc_getClass(name.encode())
  def sel(self, name: str) -> int: return self.objc.sel_registerName(name.encode())

  def send(self, restype: Any, *argtypes: Any) -> Callable[..., Any]:
    """objc_msgSend as a C function of this prototype: f(receiver, selector, *args) -> restype."""
    big = isinstance(restype, type) and issubclass(restype, ctypes.Structure) and ctypes.sizeof(restype) > 16
    return ctypes.CFUNCTYPE(restype, ID, SEL, *argtypes)(self._msg_send_stret if big else self._msg_send)

  def create_system_default_device(self) -> int | None: return self.metal.MTLCreateSystemDefaultDevice()

  def dispatch_data(self, data: bytes) -> int:
    """A dispatch_data_t holding a copy of `data` (the default destructor copies), for newLibraryWithData:error:."""
    buf = ctypes.create_string_buffer(data, len(data))
    return self.system.dispatch_data_create(buf, len(data), None, None)

  def is_object_conforming(self, ptr: int, protocol: str, fallback_selectors: tuple[str, ...]) -> bool:
    """Whether `ptr` is a live Objective-C object whose class adopts `protocol`, without sending it anything: `ptr`
    must start a malloc block (so reading its first word is safe), and the class that word names must be one the
    runtime registered (compared by address, never dereferenced) before the class is asked about the protocol. A
    protocol the runtime does not know by name is checked by the selectors its objects answer."""
    o = self.objc
    if not self.system.malloc_zone_from_ptr(ptr): return False
    cls = o.object_getClass(ptr)
    if not cls: return False
    if cls not in self._classes: self._load_classes()
    if cls not in self._classes: return False
    if (proto := o.objc_getProtocol(protocol.encode())): return bool(o.class_conformsToProtocol(cls, proto))
    return all(o.class_respondsToSelector(cls, self.sel(s)) for s in fallback_selectors)

  def _load_classes(self) -> None:
    o = self.objc
    o.objc_copyClassList.restype, o.objc_copyClassList.argtypes = ctypes.POINTER(ctypes.c_void_p), [ctypes.POINTER(ctypes.c_uint)]
    n = ctypes.c_uint()
    arr = o.objc_copyClassList(ctypes.byref(n))
    self._classes = {arr[i] for i in range(n.value)}
    self.system.free.argtypes = [ctypes.c_void_p]
    self.system.free(arr)


_runtime: Any = None


def runtime() -> Any:
  """The process's Runtime (or the fake a test installed). Loads libobjc and Metal on first use: macOS only."""
  global _runtime
  if _runtime is None: _runtime = Runtime()
  return _runtime


def use_runtime(rt: Any) -> Any:
  """Install `rt` (a fake, in tests) as the runtime; returns the previous one. None: load the real one when next asked."""
  global _runtime
  prev, _runtime = _runtime, rt
  return prev
