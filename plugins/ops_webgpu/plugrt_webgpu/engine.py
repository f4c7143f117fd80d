"""The engine protocol: what the WEBGPU device needs from a WebGPU implementation.

An engine is one WebGPU implementation (wgpu-native through wgpu-py, Google's Dawn
through dawn-python, or a third party's) opened on one adapter. Each engine ships as
an interface plugin: its package declares ``InterfaceSpec(device="WEBGPU", name=...)``
through ``plugrt_interfaces()`` and returns an opened engine from
``plugrt_open_interface()``; the WEBGPU device reaches it as ``device.iface_object``.

The surface is deliberately small, and everything on it is built once except
``launch``: the device renders WGSL, asks for a shader module, then for a pipeline
per workgroup size, a bind group per set of buffers, and finally a launcher (a
closure over native handles) that encodes one compute pass and submits it.

Conventions every engine keeps:
- buffers are created with STORAGE | COPY_SRC | COPY_DST usage; offsets and sizes
  passed to write/read/copy are multiples of 4 (the device rounds and pads);
- binding 0 of group 0 is a small uniform buffer, bindings 1..n are read_write
  storage buffers, in that order (an explicit layout, never "auto");
- write() stages its bytes: an engine submits (and waits for) what it staged once it passes
  STAGING_BOUND bytes, and synchronize() submits staged writes first, so staging stays bounded;
- errors: a shader the engine rejects raises plugrt.errors.CompileError with the
  engine's log; an allocation it cannot make raises MemoryError; ``NoAdapter`` when
  the machine has no usable adapter.

This module imports only the standard library and plugrt, so an engine package can
import it from its entry module.
"""
from __future__ import annotations

import abc
import time
from _thread import RLock  # threading's RLock, without importing threading in an entry module's import chain
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from plugrt.errors import DeviceUnavailable, Reason
from plugrt_webgpu.drivers import ADAPTER_ENV, DRIVER_HINT  # engines import both from here too

#: bytes of queued writes an engine keeps staged before it submits them: write() copies into staging memory that the
#: engine frees only once a submit has carried the write and finished, so an upload-only loop would otherwise grow without end
STAGING_BOUND = 64 << 20

#: WebGPU feature names (the spec's spelling) that change what the device can run
FEATURE_F16 = "shader-f16"
FEATURE_TIMESTAMP = "timestamp-query"


@dataclass(frozen=True)
class AdapterInfo:
  """One adapter as an engine sees it."""
  name: str                  # "llvmpipe (LLVM 15.0.6, 256 bits)", a GPU's model
  vendor: str = ""           # "mesa", "nvidia", ...
  backend: str = ""          # "Vulkan", "OpenGL", "Metal", "D3D12"
  kind: str = ""             # "CPU", "DiscreteGPU", "IntegratedGPU", "Unknown"
  driver: str = ""           # driver description: "Mesa 22.3.6 (LLVM 15.0.6)"
  features: tuple[str, ...] = ()

  @property
  def is_cpu(self) -> bool: return self.kind.upper() == "CPU"

  def summary(self) -> str:
    parts = [p for p in (self.kind or "?", self.backend, self.vendor) if p]
    return f"{self.name} ({', '.join(parts)})"


@dataclass(frozen=True)
class Limits:
  """The device limits the WEBGPU device checks against (engines request the adapter's maximum)."""
  max_buffer_size: int = 256 << 20
  max_storage_binding_size: int = 128 << 20
  max_storage_buffers: int = 8                         # per shader stage
  min_storage_offset_alignment: int = 256
  max_workgroup_size: tuple[int, int, int] = (256, 256, 64)
  max_invocations_per_workgroup: int = 256
  max_workgroups_per_dimension: int = 65535
  max_workgroup_storage: int = 16384


@dataclass
class Pipeline:
  """What ``Engine.create_pipeline`` returns: the engine's own handles plus what the device reads."""
  handle: Any                 # the native compute pipeline
  layout: Any                 # its bind group layout
  nstorage: int               # storage bindings after the uniform
  workgroup_size: tuple[int, int, int]
  extra: dict[str, Any] = field(default_factory=dict)  # whatever else the engine keeps alive


Launcher = Callable[[], None]
TimedLauncher = Callable[[], float]


class NoAdapter(DeviceUnavailable):
  """The engine loaded but found no adapter (no Vulkan/GL driver, or none that works)."""
  def __init__(self, engine: str, detail: str, hint: str = ""):
    super().__init__(f"WEBGPU engine {engine}: no adapter: {detail}", Reason.NO_DEVICE, hint or DRIVER_HINT)


_BACKENDS = {"vulkan": "vulkan", "vk": "vulkan", "opengl": "opengl", "gl": "opengl", "gles": "opengles", "opengles": "opengles",
             "metal": "metal", "d3d12": "d3d12", "dx12": "d3d12", "d3d11": "d3d11"}


def choose_adapter(adapters: Sequence[AdapterInfo], want: str) -> int | None:
  """Which adapter PLUGRT_WEBGPU_ADAPTER=`want` names: a backend (vulkan, opengl, metal, d3d12),
  a kind (cpu, gpu), an index into `adapters`, or a piece of the adapter's name; None for "",
  and ValueError when nothing matches."""
  w = want.strip().lower()
  if not w: return None
  if w.isdigit():
    if int(w) < len(adapters): return int(w)
  else:
    for i, a in enumerate(adapters):
      kind = a.kind.lower()
      if (_BACKENDS.get(w) == a.backend.lower()) or (w == "cpu" and kind == "cpu") or (w == "gpu" and "gpu" in kind) or w in a.name.lower():
        return i
  listed = "; ".join(f"{i}: {a.summary()}" for i, a in enumerate(adapters)) or "none"
  raise ValueError(f"{ADAPTER_ENV}={want!r} names no adapter (adapters: {listed})")


class Engine(abc.ABC):
  """One WebGPU implementation opened on one adapter (a WebGPU device and its queue).

  Engines are used from one thread at a time: the WEBGPU device holds `lock` around every call it makes.
  """
  name: ClassVar[str] = "?"   # the interface name: "WGPU", "DAWN"
  version: str = ""           # the native library's version (part of the compile cache key)
  adapter: AdapterInfo
  features: frozenset[str] = frozenset()   # features enabled on the device (spec spelling)
  limits: Limits = Limits()
  #: how launch(..., wait=True) is timed: "timestamp-query" (GPU timestamps around the pass) or "wall"
  timer: str = "wall"

  @property
  def lock(self) -> Any:
    """The reentrant lock the device holds around every use of this engine (made on first use)."""
    try: return self.__dict__["_device_lock"]
    except KeyError: return self.__dict__.setdefault("_device_lock", RLock())  # setdefault: two first callers get one lock

  # ---- memory
  @abc.abstractmethod
  def alloc(self, nbytes: int) -> Any:
    """A storage buffer of nbytes (a multiple of 4); MemoryError when it cannot be made."""
  @abc.abstractmethod
  def free(self, buf: Any) -> None: ...
  @abc.abstractmethod
  def write(self, buf: Any, offset: int, data: memoryview) -> None:
    """Queue a host-to-buffer copy (ordered after work already submitted)."""
  @abc.abstractmethod
  def read(self, buf: Any, offset: int, dest: memoryview) -> None:
    """Copy buffer bytes to the host, after all submitted work; returns when done."""
  @abc.abstractmethod
  def copy(self, src: Any, src_offset: int, dest: Any, dest_offset: int, nbytes: int) -> None:
    """Queue a buffer-to-buffer copy."""

  # ---- programs
  @abc.abstractmethod
  def create_module(self, wgsl: str) -> Any:
    """A shader module; raises CompileError with the engine's messages when the source is rejected."""
  @abc.abstractmethod
  def create_pipeline(self, module: Any, entry: str, nstorage: int, constants: dict[str, float],
                      workgroup_size: tuple[int, int, int]) -> Pipeline:
    """A compute pipeline with an explicit layout: binding 0 uniform, 1..nstorage read_write storage."""
  @abc.abstractmethod
  def create_uniform(self, nbytes: int) -> Any:
    """A UNIFORM | COPY_DST buffer of nbytes (a multiple of 16); written with write()."""
  @abc.abstractmethod
  def create_bind_group(self, pipeline: Pipeline, uniform: Any, bindings: Sequence[tuple[Any, int, int]]) -> Any:
    """A bind group of pipeline's layout: the uniform, then (buffer, offset, size) per storage binding."""
  @abc.abstractmethod
  def launcher(self, pipeline: Pipeline, bind_group: Any, groups: tuple[int, int, int]) -> Launcher:
    """A callable that encodes one compute pass (pipeline, bind group, dispatch groups) and submits it."""
  @abc.abstractmethod
  def timed_launcher(self, pipeline: Pipeline, bind_group: Any, groups: tuple[int, int, int]) -> TimedLauncher:
    """Like launcher, but waits and returns the run time in seconds (see `timer`)."""
  def wall_timed(self, launch: Launcher) -> TimedLauncher:
    """A timed launcher by the wall clock, for an engine that has no timestamp queries."""
    def timed() -> float:
      t = time.perf_counter()
      launch()
      self.synchronize()
      return time.perf_counter() - t
    return timed
  def release(self, obj: Any) -> None:  # noqa: B027 (optional: engines whose handles are not garbage-collected override it)
    """Give back a bind group, Pipeline or shader module the device no longer uses."""

  # ---- the queue
  @abc.abstractmethod
  def synchronize(self) -> None:
    """Submit the writes still staged, wait for all submitted work; raises PluginError for errors the engine reported meanwhile."""
  def close(self) -> None: ...  # noqa: B027 (optional)

  def describe(self) -> str:
    extra = ", ".join(sorted(f for f in self.features if f in (FEATURE_F16, FEATURE_TIMESTAMP)))
    return f"{self.name} {self.version} on {self.adapter.summary()}" + (f" [{extra}]" if extra else "")
