"""A fake Objective-C runtime with a fake Metal: what plugrt_metal.objc.use_runtime takes in tests on Linux.

It hands out the same things the real Runtime does (class and selector ids, typed "objc_msgSend" functions with the
calling convention f(receiver, sel, *args), pool push/pop, dispatch data), records every message as
(receiver kind, selector, arguments) in `log`, and answers like Metal does: objects are ints, buffers have real
host memory at `contents` (so copies really move bytes), a library compiles unless its source contains
`fail_marker` (then the NSError out-parameter is set and nil returned), command buffers end in the status
`end_status` (COMPLETED, ERROR, or COMMITTED for one that never finishes). Nothing here runs a kernel.
"""
from __future__ import annotations

import ctypes
from typing import Any

from plugrt_metal.objc import MTLSize, NSRange

COMMITTED, COMPLETED, ERROR = 2, 4, 5


class Obj:
  def __init__(self, kind: str, **attrs: Any):
    self.kind, self.refs = kind, 1
    self.__dict__.update(attrs)

  def __repr__(self) -> str: return f"<fake {self.kind}>"


class FakeRuntime:
  def __init__(self, *, unified: bool = True, max_total: int = 1024, simd_width: int = 32, fail_marker: str = "this is not a kernel",
               end_status: int = COMPLETED, responds: frozenset[str] = frozenset({"setMathMode:", "hasUnifiedMemory"}),
               device: bool = True, indirect: bool = True, icb: bool = True):
    self.unified, self.max_total, self.simd_width, self.fail_marker = unified, max_total, simd_width, fail_marker
    self.end_status, self.responds, self.has_device, self.icb_ok = end_status, responds, device, icb
    self.objects: dict[int, Obj] = {}
    self.sels: dict[int, str] = {}
    self.sel_ids: dict[str, int] = {}
    self.log: list[tuple[str, str, tuple[Any, ...]]] = []
    self.signatures: set[tuple[Any, ...]] = set()
    self.pools = 0
    self._memory: list[Any] = []
    self._next = 0x10000
    names = ("NSString", "MTLCompileOptions", "MTLIndirectCommandBufferDescriptor") + (("MTLComputePipelineDescriptor",) if indirect else ())
    self.classes = {n: self._new("class", name=n) for n in names}
    self.device = self._new("MTLDevice", name="Fake Apple GPU")

  # ---- the Runtime interface
  def cls(self, name: str) -> int | None: return self.classes.get(name)

  def sel(self, name: str) -> int:
    if name not in self.sel_ids:
      self.sel_ids[name] = 0x1000 + len(self.sel_ids)
      self.sels[self.sel_ids[name]] = name
    return self.sel_ids[name]

  def send(self, restype: Any, *argtypes: Any) -> Any:
    self.signatures.add((restype, *argtypes))
    def msg_send(receiver: int, sel: int, *args: Any) -> Any:
      assert len(args) == len(argtypes), f"{self.sels.get(sel)}: {len(args)} arguments to a function typed for {len(argtypes)}"
      return self._dispatch(receiver, self.sels[sel], args)
    return msg_send

  def create_system_default_device(self) -> int | None: return self.device if self.has_device else None

  def pool_push(self) -> int:
    self.pools += 1
    return 0xB00 + self.pools

  def pool_pop(self, pool: int) -> None: self.pools -= 1

  def dispatch_data(self, data: bytes) -> int: return self._new("dispatch_data", data=bytes(data))

  def is_object_conforming(self, ptr: int, protocol: str, fallback_selectors: tuple[str, ...]) -> bool:
    return ptr in self.objects and self.objects[ptr].kind == protocol

  # ---- helpers for tests
  def obj(self, oid: int) -> Obj: return self.objects[oid]
  def messages(self, *selectors: str) -> list[tuple[str, str, tuple[Any, ...]]]:
    return [m for m in self.log if not selectors or m[1] in selectors]
  def live(self, kind: str) -> list[Obj]: return [o for o in self.objects.values() if o.kind == kind and o.refs > 0]

  def _new(self, kind: str, **attrs: Any) -> int:
    self._next += 0x40
    self.objects[self._next] = Obj(kind, **attrs)
    return self._next

  def _error(self, out: Any, text: str, code: int = 3) -> None:
    if out is not None: out._obj.value = self._new("NSError", text=text, code=code)

  # ---- Metal, as far as plugrt uses it
  def _dispatch(self, receiver: int, name: str, args: tuple[Any, ...]) -> Any:
    o = self.objects[receiver]
    self.log.append((o.kind if o.kind != "class" else o.name, name, tuple(_plain(a) for a in args)))
    if name == "alloc": return self._new(o.name, text="")
    if name == "init": return receiver
    if name == "retain": o.refs += 1; return receiver
    if name == "release": o.refs -= 1; return None
    if name == "respondsToSelector:": return self.sels[args[0]] in self.responds
    if name == "initWithUTF8String:": o.text = args[0].decode(); return receiver
    if name == "UTF8String": return o.text.encode()
    # (methods not named alloc/new/copy/init... return objects the caller does not own: refs 0 here)
    if name == "localizedDescription": return self._new("NSString", text=o.text, refs=0)
    if name == "code": return o.code
    if name == "name": return self._new("NSString", text=o.name, refs=0)
    if name == "newCommandQueue": return self._new("MTLCommandQueue")
    if name == "maxThreadsPerThreadgroup": return MTLSize(1024, 1024, 1024)
    if name == "maxBufferLength": return 1 << 30
    if name == "hasUnifiedMemory": return self.unified
    if name == "newBufferWithLength:options:":
      mem = ctypes.create_string_buffer(args[0])
      self._memory.append(mem)
      return self._new("MTLBuffer", length=args[0], options=args[1], host=ctypes.addressof(mem), device=receiver)
    if name == "newBufferWithBytesNoCopy:length:options:deallocator:":
      return self._new("MTLBuffer", length=args[1], options=args[2], host=args[0], device=receiver)
    if name == "contents": return o.host
    if name == "length": return o.length
    if name == "device": return o.device
    if name in ("setMathMode:", "setFastMathEnabled:", "setLanguageVersion:"): setattr(o, name[3:-1], args[0]); return None
    if name == "newLibraryWithSource:options:error:":
      src = self.objects[args[0]].text
      if self.fail_marker in src:
        self._error(args[2], "program_source:1:1: error: unknown type name 'this'")
        return None
      return self._new("MTLLibrary", source=src, options=dict(self.objects[args[1]].__dict__))
    if name == "newLibraryWithData:error:": return self._new("MTLLibrary", source=self.objects[args[0]].data.decode(errors="replace"))
    if name == "newFunctionWithName:":
      fn = self.objects[args[0]].text
      return self._new("MTLFunction", name=fn) if f"kernel void {fn}(" in o.source else None
    if name == "newComputePipelineStateWithFunction:error:":
      return self._new("MTLComputePipelineState", function=self.objects[args[0]].name, indirect=False)
    if name == "newComputePipelineStateWithDescriptor:options:reflection:error:":
      desc = self.objects[args[0]]
      return self._new("MTLComputePipelineState", function=self.objects[desc.ComputeFunction].name, indirect=desc.SupportIndirectCommandBuffers)
    if name in ("setComputeFunction:", "setSupportIndirectCommandBuffers:", "setCommandTypes:", "setInheritBuffers:",
                "setInheritPipelineState:", "setMaxKernelBufferBindCount:"):
      setattr(o, name[3:-1], args[0]); return None
    if name == "newIndirectCommandBufferWithDescriptor:maxCommandCount:options:":
      if not self.icb_ok: return None
      return self._new("MTLIndirectCommandBuffer", descriptor=dict(self.objects[args[0]].__dict__), count=args[1], commands={})
    if name == "indirectComputeCommandAtIndex:":
      assert args[0] < o.count, "an index past the indirect command buffer's maxCommandCount"
      return o.commands.setdefault(args[0], self._new("MTLIndirectComputeCommand", refs=0))
    if name == "maxTotalThreadsPerThreadgroup": return self.max_total
    if name == "threadExecutionWidth": return self.simd_width
    if name == "commandBuffer": return self._new("MTLCommandBuffer", status=0, refs=0)
    if name == "computeCommandEncoder": return self._new("MTLComputeCommandEncoder", refs=0)
    if name == "commit": o.status = self.end_status; return None
    if name == "waitUntilCompleted":
      assert o.status != COMMITTED, "waitUntilCompleted on a command buffer that never completes would hang"
      return None
    if name == "status": return o.status
    if name == "error": return self._new("NSError", text="Execution of the command buffer was aborted due to an error", code=2, refs=0)
    if name == "GPUStartTime": return 100.0
    if name == "GPUEndTime": return 100.00025
    if name in ("setComputePipelineState:", "setBuffer:offset:atIndex:", "setBytes:length:atIndex:",
                "dispatchThreadgroups:threadsPerThreadgroup:", "endEncoding", "setKernelBuffer:offset:atIndex:",
                "concurrentDispatchThreadgroups:threadsPerThreadgroup:", "setBarrier", "useResources:count:usage:",
                "executeCommandsInBuffer:withRange:"):
      return None
    raise AssertionError(f"the fake Metal does not know -[{o.kind} {name}]")


def _plain(a: Any) -> Any:
  """A logged argument as plain data: MTLSize and NSRange as tuples, a ctypes array as a list."""
  if isinstance(a, MTLSize): return (a.width, a.height, a.depth)
  if isinstance(a, NSRange): return (a.location, a.length)
  if isinstance(a, ctypes.Array): return list(a)
  return a
