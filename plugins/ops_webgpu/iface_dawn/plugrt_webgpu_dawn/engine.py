"""The DAWN engine: Google's Dawn through dawn-python's ctypes binding (`pydawn.webgpu`).

Only the binding's structures and functions are used (its `utils` module creates an
instance on import, which a plugin must not do behind the user's back). Set-up calls
go through the binding and are checked with error scopes; the launch calls Dawn's
functions through lean ctypes prototypes on integer handles, which skips the
binding's per-call argument conversion.

Dawn's default of quantising timestamps (a browser's defence against timing attacks)
is switched off with its `timestamp_quantization` toggle, so `wait=True` reports the
GPU's own time.
"""
from __future__ import annotations

import ctypes
import struct
import threading
from collections.abc import Sequence
from typing import Any

from plugrt.errors import CompileError, PluginError
from plugrt_webgpu.drivers import runtime_dir
from plugrt_webgpu.engine import FEATURE_F16, FEATURE_TIMESTAMP, STAGING_BOUND, AdapterInfo, Engine, Limits, NoAdapter, Pipeline, choose_adapter

V = ctypes.c_void_p
_W: Any = None  # pydawn.webgpu, loaded on first use (it loads the Dawn library)
_INSTANCE: Any = None
_LOCK = threading.Lock()


def _webgpu() -> tuple[Any, Any]:
  """(the binding, the process's Dawn instance), made once."""
  global _W, _INSTANCE
  with _LOCK:
    if _W is None:
      runtime_dir()
      from pydawn import webgpu
      desc = webgpu.WGPUInstanceDescriptor()
      desc.features.timedWaitAnyEnable = True
      _INSTANCE = webgpu.wgpuCreateInstance(desc)
      _W = webgpu
  return _W, _INSTANCE


def _sv(text: str) -> Any:
  """A WGPUStringView over a new buffer (kept on the view so it outlives the call)."""
  W = _W
  raw = text.encode()
  buf = ctypes.create_string_buffer(raw)
  view = W.WGPUStringView()
  view.data, view.length = ctypes.cast(buf, ctypes.POINTER(ctypes.c_char)), len(raw)
  view._keep = buf  # type: ignore[attr-defined]
  return view


def _str(view: Any) -> str: return ctypes.string_at(view.data, view.length).decode(errors="replace") if view.data else ""
def _int(handle: Any) -> int: return ctypes.cast(handle, V).value or 0


def _wait(future: Any) -> None:
  W, inst = _webgpu()
  info = W.WGPUFutureWaitInfo()
  info.future = future
  if (st := W.wgpuInstanceWaitAny(inst, 1, info, 2**64 - 1)) != W.WGPUWaitStatus_Success:
    raise PluginError(f"WEBGPU engine DAWN: waiting on a future failed ({W.WGPUWaitStatus__enumvalues.get(st, st)})")


_FEATURES = {FEATURE_F16: "WGPUFeatureName_ShaderF16", FEATURE_TIMESTAMP: "WGPUFeatureName_TimestampQuery"}
_BACKENDS = (("Vulkan", "WGPUBackendType_Vulkan"), ("OpenGL", "WGPUBackendType_OpenGL"), ("OpenGLES", "WGPUBackendType_OpenGLES"),
             ("Metal", "WGPUBackendType_Metal"), ("D3D12", "WGPUBackendType_D3D12"))


def _request_adapter(backend: int = 0) -> Any:
  W, inst = _webgpu()
  got: dict[str, Any] = {}
  def cb(status: int, adapter: Any, msg: Any, _: Any) -> None: got.update(status=status, adapter=adapter, msg=_str(msg))
  info = W.WGPURequestAdapterCallbackInfo()
  info.mode = W.WGPUCallbackMode_WaitAnyOnly
  info.callback = type(info.callback)(cb)
  opts = W.WGPURequestAdapterOptions()
  opts.powerPreference = W.WGPUPowerPreference_HighPerformance
  opts.backendType = backend
  _wait(W.wgpuInstanceRequestAdapterF(inst, opts, info))
  if got.get("status") != W.WGPURequestAdapterStatus_Success or not got.get("adapter"): return None
  return got["adapter"]


def _adapter_info(adapter: Any) -> AdapterInfo:
  W, _ = _webgpu()
  i = W.WGPUAdapterInfo()
  W.wgpuAdapterGetInfo(adapter, i)
  sf = W.WGPUSupportedFeatures()
  W.wgpuAdapterGetFeatures(adapter, sf)
  names = {W.WGPUFeatureName__enumvalues.get(sf.features[k], "") for k in range(sf.featureCount)}
  feats = tuple(sorted(f for f, n in _FEATURES.items() if n in names))
  backend = W.WGPUBackendType__enumvalues.get(i.backendType, "").replace("WGPUBackendType_", "")
  kind = W.WGPUAdapterType__enumvalues.get(i.adapterType, "").replace("WGPUAdapterType_", "")
  return AdapterInfo(name=_str(i.device) or "?", vendor=_str(i.vendor), backend=backend, kind=kind, driver=_str(i.description), features=feats)


def list_adapters() -> list[tuple[AdapterInfo, Any]]:
  """One adapter per backend Dawn can open here (this binding has no adapter enumeration)."""
  W, _ = _webgpu()
  out: list[tuple[AdapterInfo, Any]] = []
  for _, enum in _BACKENDS:
    if (a := _request_adapter(getattr(W, enum))) is not None:
      info = _adapter_info(a)
      if all(info != o for o, _ in out): out.append((info, a))
  return out


class DawnBuffer:
  __slots__ = ("__weakref__", "handle", "ptr", "size")
  def __init__(self, handle: Any, size: int): self.handle, self.ptr, self.size = handle, _int(handle), size


def _fn(name: str, restype: Any, *argtypes: Any) -> Any:
  """A lean prototype of a Dawn function: integer handles in and out, no per-call conversion."""
  return ctypes.CFUNCTYPE(restype, *argtypes)(ctypes.cast(getattr(_W, name), V).value)


class DawnEngine(Engine):
  name = "DAWN"

  def __init__(self, adapter: str = ""):
    W, self._inst = _webgpu()
    self.W = W
    try:
      if adapter.strip():
        found = list_adapters()
        ad = found[choose_adapter([i for i, _ in found], adapter)][1]  # type: ignore[index]
      else: ad = _request_adapter()
    except ValueError as e: raise NoAdapter(self.name, str(e), "see the adapters with `python -m plugrt_webgpu`") from None
    except Exception as e: raise NoAdapter(self.name, f"Dawn found none: {e}") from e
    if ad is None: raise NoAdapter(self.name, "Dawn found none")
    self.adapter = _adapter_info(ad)
    if self.adapter.backend in ("Null", ""):  # Dawn's stand-in when nothing else works: it runs no shader
      raise NoAdapter(self.name, "Dawn found only its Null backend (no Vulkan driver it can use)")
    try:
      from importlib.metadata import version
      self.version = f"dawn-python {version('dawn-python')}"
    except Exception: self.version = "dawn-python ?"
    self._errors: list[str] = []
    self._device = self._create_device(ad)
    self._queue = W.wgpuDeviceGetQueue(self._device)
    self._D, self._Q = _int(self._device), _int(self._queue)
    sl = W.WGPUSupportedLimits()
    W.wgpuDeviceGetLimits(self._device, sl)
    li = sl.limits
    self.limits = Limits(
      max_buffer_size=li.maxBufferSize, max_storage_binding_size=li.maxStorageBufferBindingSize,
      max_storage_buffers=li.maxStorageBuffersPerShaderStage,
      min_storage_offset_alignment=li.minStorageBufferOffsetAlignment,
      max_workgroup_size=(li.maxComputeWorkgroupSizeX, li.maxComputeWorkgroupSizeY, li.maxComputeWorkgroupSizeZ),
      max_invocations_per_workgroup=li.maxComputeInvocationsPerWorkgroup, max_workgroups_per_dimension=li.maxComputeWorkgroupsPerDimension,
      max_workgroup_storage=li.maxComputeWorkgroupStorageSize)
    self._lock = threading.Lock()
    self._staging: DawnBuffer | None = None
    self.staged_bytes = 0  # written since the last submit of staged writes (see write)
    # the launch path's functions, prototyped on integer handles
    self._create_enc = _fn("wgpuDeviceCreateCommandEncoder", V, V, V)
    self._begin = _fn("wgpuCommandEncoderBeginComputePass", V, V, V)
    self._set_pipeline = _fn("wgpuComputePassEncoderSetPipeline", None, V, V)
    self._set_group = _fn("wgpuComputePassEncoderSetBindGroup", None, V, ctypes.c_uint32, V, ctypes.c_size_t, V)
    self._dispatch = _fn("wgpuComputePassEncoderDispatchWorkgroups", None, V, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_uint32)
    self._end = _fn("wgpuComputePassEncoderEnd", None, V)
    self._release_pass = _fn("wgpuComputePassEncoderRelease", None, V)
    self._finish = _fn("wgpuCommandEncoderFinish", V, V, V)
    self._release_enc = _fn("wgpuCommandEncoderRelease", None, V)
    self._submit = _fn("wgpuQueueSubmit", None, V, ctypes.c_size_t, V)
    self._release_cb = _fn("wgpuCommandBufferRelease", None, V)
    self._copy_b2b = _fn("wgpuCommandEncoderCopyBufferToBuffer", None, V, V, ctypes.c_uint64, V, ctypes.c_uint64, ctypes.c_uint64)
    self._write = _fn("wgpuQueueWriteBuffer", None, V, V, ctypes.c_uint64, V, ctypes.c_size_t)
    self.timer = "wall"
    if FEATURE_TIMESTAMP in self.features:
      qd = W.WGPUQuerySetDescriptor()
      qd.type, qd.count = W.WGPUQueryType_Timestamp, 2
      self._qs = W.wgpuDeviceCreateQuerySet(self._device, qd)
      self._resolve = self._buffer(16, W.WGPUBufferUsage_QueryResolve | W.WGPUBufferUsage_CopySrc)
      self._ts = self._buffer(16, W.WGPUBufferUsage_MapRead | W.WGPUBufferUsage_CopyDst)
      self._tsw = W.WGPUComputePassTimestampWrites()
      self._tsw.querySet, self._tsw.beginningOfPassWriteIndex, self._tsw.endOfPassWriteIndex = self._qs, 0, 1
      self._ts_pass = W.WGPUComputePassDescriptor()
      self._ts_pass.timestampWrites = ctypes.pointer(self._tsw)
      self.timer = "timestamp-query"

  def _create_device(self, adapter: Any) -> Any:
    W = self.W
    want = [f for f in (FEATURE_F16, FEATURE_TIMESTAMP) if f in self.adapter.features]
    feats = (W.WGPUFeatureName * max(len(want), 1))(*[getattr(W, _FEATURES[f]) for f in want])
    desc = W.WGPUDeviceDescriptor()
    desc.requiredFeatureCount, desc.requiredFeatures = len(want), feats
    sl = W.WGPUSupportedLimits()
    W.wgpuAdapterGetLimits(adapter, sl)
    rl = W.WGPURequiredLimits()
    rl.limits = sl.limits  # everything the adapter allows (the WebGPU defaults are 8 storage buffers, 128 MiB bindings)
    desc.requiredLimits = ctypes.pointer(rl)
    toggles = W.WGPUDawnTogglesDescriptor()
    toggles.chain.sType = W.WGPUSType_DawnTogglesDescriptor
    off = ctypes.create_string_buffer(b"timestamp_quantization")
    off_list = (ctypes.POINTER(ctypes.c_char) * 1)(ctypes.cast(off, ctypes.POINTER(ctypes.c_char)))
    toggles.disabledToggleCount, toggles.disabledToggles = 1, off_list
    desc.nextInChain = ctypes.cast(ctypes.pointer(toggles), ctypes.POINTER(W.struct_WGPUChainedStruct))

    def on_error(_dev: Any, kind: int, msg: Any, _u1: Any, _u2: Any) -> None:
      self._errors.append(f"{W.WGPUErrorType__enumvalues.get(kind, kind)}: {_str(msg).strip()}")
    self._on_error = type(desc.uncapturedErrorCallbackInfo2.callback)(on_error)  # kept: Dawn calls it for the device's lifetime
    desc.uncapturedErrorCallbackInfo2.callback = self._on_error
    dev = W.wgpuAdapterCreateDevice(adapter, desc)
    if not dev: raise NoAdapter(self.name, f"Dawn could not create a device on {self.adapter.summary()}")
    self.features = frozenset(want)
    return dev

  # ---- errors
  def _scoped(self, fn: Any, *args: Any) -> tuple[Any, str]:
    """fn(*args) inside a validation error scope: (result, the error message or "")."""
    W = self.W
    W.wgpuDevicePushErrorScope(self._device, W.WGPUErrorFilter_Validation)
    out = fn(*args)
    got: dict[str, str] = {}
    def cb(status: int, kind: int, msg: Any, _: Any) -> None:
      if kind != W.WGPUErrorType_NoError: got["e"] = _str(msg)
    info = W.WGPUPopErrorScopeCallbackInfo()
    info.mode = W.WGPUCallbackMode_WaitAnyOnly
    info.callback = type(info.callback)(cb)
    _wait(W.wgpuDevicePopErrorScopeF(self._device, info))
    return out, got.get("e", "")

  def _raise_pending(self) -> None:
    if self._errors:
      errs, self._errors[:] = list(self._errors), []
      raise PluginError(f"WEBGPU engine DAWN reported: {errs[0]}" + (f" (and {len(errs) - 1} more)" if len(errs) > 1 else ""))

  # ---- memory
  def _buffer(self, nbytes: int, usage: int) -> DawnBuffer:
    W = self.W
    d = W.WGPUBufferDescriptor()
    d.size, d.usage = nbytes, usage
    W.wgpuDevicePushErrorScope(self._device, W.WGPUErrorFilter_OutOfMemory)
    h, err = self._scoped(W.wgpuDeviceCreateBuffer, self._device, d)
    got: dict[str, str] = {}
    def cb(status: int, kind: int, msg: Any, _: Any) -> None:
      if kind != W.WGPUErrorType_NoError: got["e"] = _str(msg)
    info = W.WGPUPopErrorScopeCallbackInfo()
    info.mode, info.callback = W.WGPUCallbackMode_WaitAnyOnly, type(info.callback)(cb)
    _wait(W.wgpuDevicePopErrorScopeF(self._device, info))
    if err or got or not h: raise MemoryError((err or got.get("e", "") or "buffer creation failed").strip().splitlines()[0])
    return DawnBuffer(h, nbytes)

  def alloc(self, nbytes: int) -> Any:
    W = self.W
    return self._buffer(nbytes, W.WGPUBufferUsage_Storage | W.WGPUBufferUsage_CopySrc | W.WGPUBufferUsage_CopyDst)

  def free(self, buf: Any) -> None:
    self.W.wgpuBufferDestroy(buf.handle)
    self.W.wgpuBufferRelease(buf.handle)
    buf.handle, buf.ptr = None, 0

  def write(self, buf: Any, offset: int, data: memoryview) -> None:
    n = data.nbytes
    if n == 0: return
    src = data if not data.readonly else memoryview(bytearray(data))
    addr = ctypes.addressof((ctypes.c_char * n).from_buffer(src))
    self._write(self._Q, buf.ptr, offset, addr, n)  # Dawn copies the bytes before it returns, into staging kept until a submit is done
    self.staged_bytes += n
    if self.staged_bytes >= STAGING_BOUND: self.synchronize()

  def _one_shot(self, record: Any) -> None:
    enc = self._create_enc(self._D, None)
    record(enc)
    cbs = (V * 1)(self._finish(enc, None))
    self._release_enc(enc)
    self._submit(self._Q, 1, ctypes.addressof(cbs))
    self._release_cb(cbs[0])

  def _map_read(self, buf: DawnBuffer, n: int, dest: memoryview | None = None) -> bytes | None:
    W = self.W
    got: dict[str, Any] = {}
    def cb(status: int, msg: Any, _u1: Any, _u2: Any) -> None: got.update(status=status, msg=_str(msg))
    info = W.WGPUBufferMapCallbackInfo2()
    info.mode, info.callback = W.WGPUCallbackMode_WaitAnyOnly, type(info.callback)(cb)
    _wait(W.wgpuBufferMapAsync2(buf.handle, W.WGPUMapMode_Read, 0, n, info))
    if got.get("status") != W.WGPUMapAsyncStatus_Success:
      self._raise_pending()
      raise PluginError(f"WEBGPU engine DAWN: mapping a buffer failed: {got.get('msg', '')}")
    try:
      ptr = W.wgpuBufferGetConstMappedRange(buf.handle, 0, n)
      if dest is None: return ctypes.string_at(ptr, n)
      ctypes.memmove((ctypes.c_char * n).from_buffer(dest), ptr, n)
      return None
    finally: W.wgpuBufferUnmap(buf.handle)

  def read(self, buf: Any, offset: int, dest: memoryview) -> None:
    n = dest.nbytes
    if n == 0: return
    W = self.W
    with self._lock:
      if self._staging is None or self._staging.size < n:
        if self._staging is not None: self.free(self._staging)
        self._staging = self._buffer(max(n, 4096), W.WGPUBufferUsage_MapRead | W.WGPUBufferUsage_CopyDst)
      st = self._staging
      self._one_shot(lambda enc: self._copy_b2b(enc, buf.ptr, offset, st.ptr, 0, n))
      self._map_read(st, n, dest if not dest.readonly else None)
    self._raise_pending()

  def copy(self, src: Any, src_offset: int, dest: Any, dest_offset: int, nbytes: int) -> None:
    self._one_shot(lambda enc: self._copy_b2b(enc, src.ptr, src_offset, dest.ptr, dest_offset, nbytes))

  # ---- programs
  def create_module(self, wgsl: str) -> Any:
    W = self.W
    source = W.WGPUShaderSourceWGSL()
    source.chain.sType = W.WGPUSType_ShaderSourceWGSL
    source.code = _sv(wgsl)
    desc = W.WGPUShaderModuleDescriptor()
    desc.nextInChain = ctypes.cast(ctypes.pointer(source), ctypes.POINTER(W.struct_WGPUChainedStruct))
    module, err = self._scoped(W.wgpuDeviceCreateShaderModule, self._device, desc)
    if err:
      if module: W.wgpuShaderModuleRelease(module)
      raise CompileError(f"WEBGPU engine {self.name} rejected the WGSL", err, "see the log; a WGSL kernel plugrt rendered is a plugrt bug")
    return module

  def create_pipeline(self, module: Any, entry: str, nstorage: int, constants: dict[str, float],
                      workgroup_size: tuple[int, int, int]) -> Pipeline:
    W = self.W
    entries = (W.WGPUBindGroupLayoutEntry * (nstorage + 1))()
    for i in range(nstorage + 1):
      entries[i].binding, entries[i].visibility = i, W.WGPUShaderStage_Compute
      entries[i].buffer.type = W.WGPUBufferBindingType_Uniform if i == 0 else W.WGPUBufferBindingType_Storage
    bd = W.WGPUBindGroupLayoutDescriptor()
    bd.entryCount, bd.entries = nstorage + 1, entries
    bgl, err = self._scoped(W.wgpuDeviceCreateBindGroupLayout, self._device, bd)
    if err: raise CompileError(f"WEBGPU engine {self.name} could not build the bind group layout of {entry}", err)
    layouts = (W.WGPUBindGroupLayout * 1)(bgl)
    pd = W.WGPUPipelineLayoutDescriptor()
    pd.bindGroupLayoutCount, pd.bindGroupLayouts = 1, layouts
    layout, err = self._scoped(W.wgpuDeviceCreatePipelineLayout, self._device, pd)
    if err: raise CompileError(f"WEBGPU engine {self.name} could not build the pipeline layout of {entry}", err)
    consts = (W.WGPUConstantEntry * max(len(constants), 1))()
    for i, (k, v) in enumerate(constants.items()): consts[i].key, consts[i].value = _sv(k), float(v)
    cd = W.WGPUComputePipelineDescriptor()
    cd.layout = layout
    cd.compute.module, cd.compute.entryPoint = module, _sv(entry)
    cd.compute.constantCount, cd.compute.constants = len(constants), consts
    pipe, err = self._scoped(W.wgpuDeviceCreateComputePipeline, self._device, cd)
    if err or not pipe: raise CompileError(f"WEBGPU engine {self.name} could not build the pipeline of {entry}", err)
    return Pipeline(pipe, bgl, nstorage, workgroup_size, {"layout": layout})

  def create_uniform(self, nbytes: int) -> Any:
    return self._buffer(nbytes, self.W.WGPUBufferUsage_Uniform | self.W.WGPUBufferUsage_CopyDst)

  def create_bind_group(self, pipeline: Pipeline, uniform: Any, bindings: Sequence[tuple[Any, int, int]]) -> Any:
    W = self.W
    entries = (W.WGPUBindGroupEntry * (len(bindings) + 1))()
    for i, (b, off, n) in enumerate([(uniform, 0, uniform.size), *bindings]):
      entries[i].binding, entries[i].buffer, entries[i].offset, entries[i].size = i, b.handle, off, n
    gd = W.WGPUBindGroupDescriptor()
    gd.layout, gd.entryCount, gd.entries = pipeline.layout, len(bindings) + 1, entries
    group, err = self._scoped(W.wgpuDeviceCreateBindGroup, self._device, gd)
    if err: raise PluginError(f"WEBGPU engine {self.name}: bind group rejected: {err.strip()}")
    return group

  def launcher(self, pipeline: Pipeline, bind_group: Any, groups: tuple[int, int, int]) -> Any:
    x, y, z = groups
    D, Q, P, G = self._D, self._Q, _int(pipeline.handle), _int(bind_group)
    create, begin, set_pipeline, set_group = self._create_enc, self._begin, self._set_pipeline, self._set_group
    dispatch, end, release_pass, finish = self._dispatch, self._end, self._release_pass, self._finish
    release_enc, submit, release_cb = self._release_enc, self._submit, self._release_cb
    cbs = (V * 1)()
    cbp = ctypes.addressof(cbs)
    keep = (pipeline, bind_group)  # the launcher holds what its handles point to

    def launch(keep: Any = keep) -> None:
      enc = create(D, None)
      cp = begin(enc, None)
      set_pipeline(cp, P)
      set_group(cp, 0, G, 0, None)
      dispatch(cp, x, y, z)
      end(cp)
      release_pass(cp)
      cbs[0] = cb = finish(enc, None)
      release_enc(enc)
      submit(Q, 1, cbp)
      release_cb(cb)
    return launch

  def timed_launcher(self, pipeline: Pipeline, bind_group: Any, groups: tuple[int, int, int]) -> Any:
    if self.timer != "timestamp-query": return self.wall_timed(self.launcher(pipeline, bind_group, groups))
    W = self.W
    x, y, z = groups

    def timed() -> float:
      with self._lock:
        enc = W.wgpuDeviceCreateCommandEncoder(self._device, None)
        cp = W.wgpuCommandEncoderBeginComputePass(enc, self._ts_pass)
        W.wgpuComputePassEncoderSetPipeline(cp, pipeline.handle)
        W.wgpuComputePassEncoderSetBindGroup(cp, 0, bind_group, 0, None)
        W.wgpuComputePassEncoderDispatchWorkgroups(cp, x, y, z)
        W.wgpuComputePassEncoderEnd(cp)
        W.wgpuComputePassEncoderRelease(cp)
        W.wgpuCommandEncoderResolveQuerySet(enc, self._qs, 0, 2, self._resolve.handle, 0)
        self._copy_b2b(_int(enc), self._resolve.ptr, 0, self._ts.ptr, 0, 16)
        cb = W.wgpuCommandEncoderFinish(enc, None)
        W.wgpuCommandEncoderRelease(enc)
        W.wgpuQueueSubmit(self._queue, 1, (W.WGPUCommandBuffer * 1)(cb))
        W.wgpuCommandBufferRelease(cb)
        raw = self._map_read(self._ts, 16)
      self._raise_pending()
      t0, t1 = struct.unpack("<QQ", raw)  # type: ignore[arg-type]
      return max(t1 - t0, 0) * 1e-9  # Dawn resolves timestamps in nanoseconds
    return timed

  def release(self, obj: Any) -> None:
    W = self.W
    if isinstance(obj, Pipeline):
      W.wgpuComputePipelineRelease(obj.handle)
      W.wgpuPipelineLayoutRelease(obj.extra["layout"])
      W.wgpuBindGroupLayoutRelease(obj.layout)
    elif isinstance(obj, ctypes.POINTER(W.struct_WGPUBindGroupImpl)) and obj: W.wgpuBindGroupRelease(obj)
    elif isinstance(obj, ctypes.POINTER(W.struct_WGPUShaderModuleImpl)) and obj: W.wgpuShaderModuleRelease(obj)

  def synchronize(self) -> None:
    W = self.W
    self.staged_bytes = 0
    self._submit(self._Q, 0, None)  # carries the writes queued since the last submit: their staging is freed once it is done
    got: dict[str, int] = {}
    def cb(status: int, _u1: Any, _u2: Any) -> None: got["s"] = status
    info = W.WGPUQueueWorkDoneCallbackInfo2()
    info.mode, info.callback = W.WGPUCallbackMode_WaitAnyOnly, type(info.callback)(cb)
    _wait(W.wgpuQueueOnSubmittedWorkDone2(self._queue, info))
    self._raise_pending()
    if got.get("s") != W.WGPUQueueWorkDoneStatus_Success: raise PluginError(f"WEBGPU engine DAWN: the queue failed (status {got.get('s')})")

  def close(self) -> None:
    if self._staging is not None: self.free(self._staging)
    self._staging = None
