"""The WGPU engine: wgpu-native through wgpu-py.

Set-up (adapter, device, buffers, modules, pipelines, bind groups) goes through
wgpu-py's object API, which validates and raises. The launch itself calls
wgpu-native's C functions through wgpu-py's cffi binding (`wgpu.backends.wgpu_native.lib`)
on the objects' native handles: the object API builds several Python objects per
pass, which every launch would pay (docs/performance.md). Where a wgpu-py version lacks
what the fast path uses, launches fall back to the object API.
"""
from __future__ import annotations

import struct
import threading
from collections.abc import Sequence
from typing import Any

from plugrt.errors import CompileError, PluginError
from plugrt_webgpu.drivers import runtime_dir
from plugrt_webgpu.engine import (
  ADAPTER_ENV,
  FEATURE_F16,
  FEATURE_TIMESTAMP,
  STAGING_BOUND,
  AdapterInfo,
  Engine,
  Limits,
  NoAdapter,
  Pipeline,
  choose_adapter,
)

_LIMIT_KEYS = ("max-buffer-size", "max-storage-buffer-binding-size", "max-storage-buffers-per-shader-stage",
               "max-compute-workgroup-size-x", "max-compute-workgroup-size-y", "max-compute-workgroup-size-z",
               "max-compute-invocations-per-workgroup", "max-compute-workgroups-per-dimension", "max-compute-workgroup-storage-size")


def _info(adapter: Any) -> AdapterInfo:
  i = adapter.info
  return AdapterInfo(name=i.get("device", "") or "?", vendor=i.get("vendor", ""), backend=i.get("backend_type", ""),
                     kind=i.get("adapter_type", ""), driver=i.get("description", ""), features=tuple(sorted(adapter.features)))


def list_adapters() -> list[tuple[AdapterInfo, Any]]:
  runtime_dir()
  import wgpu
  return [(_info(a), a) for a in wgpu.gpu.enumerate_adapters_sync()]


class WgpuEngine(Engine):
  name = "WGPU"

  def __init__(self, adapter: str = ""):
    runtime_dir()
    import wgpu
    from wgpu.backends import wgpu_native
    self.wgpu = wgpu
    try:
      if adapter.strip():
        found = list_adapters()
        ad = found[choose_adapter([i for i, _ in found], adapter)][1]  # type: ignore[index]
      else: ad = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    except ValueError as e: raise NoAdapter(self.name, str(e), "see the adapters with `python -m plugrt_webgpu`") from None
    except Exception as e:
      raise NoAdapter(self.name, f"wgpu-native found none: {e}") from e
    if ad is None: raise NoAdapter(self.name, "wgpu-native found none")
    self.adapter = _info(ad)
    self.version = f"wgpu-py {wgpu.__version__}, wgpu-native {'.'.join(map(str, getattr(wgpu_native, 'lib_version_info', ())))}"
    want = [f for f in (FEATURE_F16, FEATURE_TIMESTAMP) if f in ad.features]
    lim = ad.limits
    try: self.device = ad.request_device_sync(required_features=want, required_limits={k: lim[k] for k in _LIMIT_KEYS if k in lim})
    except Exception as e:  # e.g. wgpu-native's OpenGL backend on a driver whose GL version it cannot compute with
      raise NoAdapter(self.name, f"adapter {self.adapter.name} ({self.adapter.backend}) gave no compute device: {e}",
                      f"pick another adapter with {ADAPTER_ENV} (list them with `python -m plugrt_webgpu`)") from e
    self.queue = self.device.queue
    self.features = frozenset(self.device.features)
    dl = self.device.limits
    self.limits = Limits(
      max_buffer_size=dl["max-buffer-size"], max_storage_binding_size=dl["max-storage-buffer-binding-size"],
      max_storage_buffers=dl["max-storage-buffers-per-shader-stage"], min_storage_offset_alignment=dl["min-storage-buffer-offset-alignment"],
      max_workgroup_size=(dl["max-compute-workgroup-size-x"], dl["max-compute-workgroup-size-y"], dl["max-compute-workgroup-size-z"]),
      max_invocations_per_workgroup=dl["max-compute-invocations-per-workgroup"],
      max_workgroups_per_dimension=dl["max-compute-workgroups-per-dimension"], max_workgroup_storage=dl["max-compute-workgroup-storage-size"])
    self._usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
    self._lock = threading.Lock()
    self._staging: Any = None
    self.staged_bytes = 0  # written since the last submit of staged writes (see write)
    # the fast path: wgpu-native's C API on the objects' handles
    try:
      self._ffi, self._lib = wgpu_native.ffi, wgpu_native.lib
      self._D, self._Q = self.device._internal, self.queue._internal
      self._pass_desc = self._ffi.new("WGPUComputePassDescriptor *")
      self._enc_desc = self._ffi.new("WGPUCommandEncoderDescriptor *")
      self._cb_desc = self._ffi.new("WGPUCommandBufferDescriptor *")
      self.fast = True
    except (AttributeError, TypeError):
      self.fast = False
    self.timer = "wall"
    if FEATURE_TIMESTAMP in self.features:
      self._qs = self.device.create_query_set(type=wgpu.QueryType.timestamp, count=2)
      self._resolve = self.device.create_buffer(size=16, usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)
      self._ts = self.device.create_buffer(size=16, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)
      get_period = getattr(self._lib, "wgpuQueueGetTimestampPeriod", None) if self.fast else None
      period = get_period(self._Q) if get_period is not None else 1.0
      self._ns = float(period) or 1.0  # wgpu-native resolves raw ticks: period ns per tick
      self.timer = "timestamp-query"

  # ---- memory
  def alloc(self, nbytes: int) -> Any:
    try: return self.device.create_buffer(size=nbytes, usage=self._usage)
    except self.wgpu.GPUOutOfMemoryError as e: raise MemoryError(str(e)) from None
    except self.wgpu.GPUValidationError as e: raise MemoryError(str(e).strip().splitlines()[-1]) from None

  def free(self, buf: Any) -> None: buf.destroy()

  def write(self, buf: Any, offset: int, data: memoryview) -> None:
    if data.readonly: data = memoryview(bytearray(data))  # wgpu-py takes the address of a writable buffer
    self.queue.write_buffer(buf, offset, data)
    self.staged_bytes += data.nbytes  # wgpu-native keeps the staging copy until a submit carries it and completes
    if self.staged_bytes >= STAGING_BOUND: self.synchronize()

  def read(self, buf: Any, offset: int, dest: memoryview) -> None:
    n = dest.nbytes
    with self._lock:
      if self._staging is None or self._staging.size < n:  # one mappable buffer, reused (grown to the largest read)
        if self._staging is not None: self._staging.destroy()
        self._staging = self.device.create_buffer(size=max(n, 4096), usage=self.wgpu.BufferUsage.MAP_READ | self.wgpu.BufferUsage.COPY_DST)
      enc = self.device.create_command_encoder()
      enc.copy_buffer_to_buffer(buf, offset, self._staging, 0, n)
      self.queue.submit([enc.finish()])
      self._staging.map_sync(self.wgpu.MapMode.READ, 0, n)
      try: dest[:] = self._staging.read_mapped(0, n, copy=False).cast("B")
      finally: self._staging.unmap()

  def copy(self, src: Any, src_offset: int, dest: Any, dest_offset: int, nbytes: int) -> None:
    enc = self.device.create_command_encoder()
    enc.copy_buffer_to_buffer(src, src_offset, dest, dest_offset, nbytes)
    self.queue.submit([enc.finish()])

  # ---- programs
  def create_module(self, wgsl: str) -> Any:
    try: return self.device.create_shader_module(code=wgsl)
    except self.wgpu.GPUError as e:
      raise CompileError(f"WEBGPU engine {self.name} rejected the WGSL", str(e),
                         "see the log; a WGSL kernel plugrt rendered is a plugrt bug") from None

  def create_pipeline(self, module: Any, entry: str, nstorage: int, constants: dict[str, float],
                      workgroup_size: tuple[int, int, int]) -> Pipeline:
    wgpu = self.wgpu
    entries = [{"binding": 0, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": {"type": wgpu.BufferBindingType.uniform}}]
    entries += [{"binding": i + 1, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": {"type": wgpu.BufferBindingType.storage}}
                for i in range(nstorage)]
    try:
      bgl = self.device.create_bind_group_layout(entries=entries)
      layout = self.device.create_pipeline_layout(bind_group_layouts=[bgl])
      pipe = self.device.create_compute_pipeline(layout=layout, compute={"module": module, "entry_point": entry, "constants": constants})
    except wgpu.GPUError as e:
      raise CompileError(f"WEBGPU engine {self.name} could not build the pipeline of {entry}", str(e)) from None
    return Pipeline(pipe, bgl, nstorage, workgroup_size, {"layout": layout})

  def create_uniform(self, nbytes: int) -> Any:
    return self.device.create_buffer(size=nbytes, usage=self.wgpu.BufferUsage.UNIFORM | self.wgpu.BufferUsage.COPY_DST)

  def create_bind_group(self, pipeline: Pipeline, uniform: Any, bindings: Sequence[tuple[Any, int, int]]) -> Any:
    entries = [{"binding": 0, "resource": {"buffer": uniform, "offset": 0, "size": uniform.size}}]
    entries += [{"binding": i + 1, "resource": {"buffer": b, "offset": o, "size": n}} for i, (b, o, n) in enumerate(bindings)]
    try: return self.device.create_bind_group(layout=pipeline.layout, entries=entries)
    except self.wgpu.GPUError as e: raise PluginError(f"WEBGPU engine {self.name}: bind group rejected: {e}") from None

  def launcher(self, pipeline: Pipeline, bind_group: Any, groups: tuple[int, int, int]) -> Any:
    x, y, z = groups
    if not self.fast:
      def slow() -> None:
        enc = self.device.create_command_encoder()
        cp = enc.begin_compute_pass()
        cp.set_pipeline(pipeline.handle); cp.set_bind_group(0, bind_group); cp.dispatch_workgroups(x, y, z); cp.end()
        self.queue.submit([enc.finish()])
      return slow
    lib, ffi = self._lib, self._ffi
    create, begin, finish = lib.wgpuDeviceCreateCommandEncoder, lib.wgpuCommandEncoderBeginComputePass, lib.wgpuCommandEncoderFinish
    set_pipeline, set_group = lib.wgpuComputePassEncoderSetPipeline, lib.wgpuComputePassEncoderSetBindGroup
    dispatch = lib.wgpuComputePassEncoderDispatchWorkgroups
    end, release_pass, release_enc = lib.wgpuComputePassEncoderEnd, lib.wgpuComputePassEncoderRelease, lib.wgpuCommandEncoderRelease
    submit, release_cb = lib.wgpuQueueSubmit, lib.wgpuCommandBufferRelease
    D, Q, P, G, null = self._D, self._Q, pipeline.handle._internal, bind_group._internal, ffi.NULL
    enc_desc, pass_desc, cb_desc = self._enc_desc, self._pass_desc, self._cb_desc
    cbs = ffi.new("WGPUCommandBuffer[1]")
    keep = (pipeline, bind_group)  # the wgpu-py objects own the handles: keep them alive with the launcher

    def launch(keep: Any = keep) -> None:
      enc = create(D, enc_desc)
      cp = begin(enc, pass_desc)
      set_pipeline(cp, P)
      set_group(cp, 0, G, 0, null)
      dispatch(cp, x, y, z)
      end(cp)
      release_pass(cp)
      cbs[0] = cb = finish(enc, cb_desc)
      release_enc(enc)
      submit(Q, 1, cbs)
      release_cb(cb)
    return launch

  def timed_launcher(self, pipeline: Pipeline, bind_group: Any, groups: tuple[int, int, int]) -> Any:
    if self.timer != "timestamp-query": return self.wall_timed(self.launcher(pipeline, bind_group, groups))
    x, y, z = groups
    writes = {"query_set": self._qs, "beginning_of_pass_write_index": 0, "end_of_pass_write_index": 1}

    def timed() -> float:
      with self._lock:
        enc = self.device.create_command_encoder()
        cp = enc.begin_compute_pass(timestamp_writes=writes)
        cp.set_pipeline(pipeline.handle); cp.set_bind_group(0, bind_group); cp.dispatch_workgroups(x, y, z); cp.end()
        enc.resolve_query_set(self._qs, 0, 2, self._resolve, 0)
        enc.copy_buffer_to_buffer(self._resolve, 0, self._ts, 0, 16)
        self.queue.submit([enc.finish()])
        self._ts.map_sync(self.wgpu.MapMode.READ, 0, 16)
        try: t0, t1 = struct.unpack("<QQ", self._ts.read_mapped(0, 16))
        finally: self._ts.unmap()
      return max(t1 - t0, 0) * self._ns * 1e-9
    return timed

  def release(self, obj: Any) -> None: pass  # wgpu-py releases a handle when its object is collected

  def synchronize(self) -> None:
    self.staged_bytes = 0
    self.queue.submit([])  # carries the writes queued since the last submit: their staging is freed once it is done
    if self.fast: self._lib.wgpuDevicePoll(self._D, True, self._ffi.NULL)
    else: self.device._poll_wait()

  def close(self) -> None:
    if self._staging is not None: self._staging.destroy()
    self._staging = None
