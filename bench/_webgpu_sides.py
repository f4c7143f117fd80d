"""The sides of bench/webgpu.py: plugrt's WEBGPU device on each engine, raw wgpu-py, and tinygrad 0.14's WEBGPU.

Every side runs the same tiny kernel, out[0] = x[0] + 1 on 1-float buffers, and offers:
- dispatch(n): seconds per launch over n launches queued back to back, the queue drained at
  the end (so queued work is paid for, not just its submission);
- dispatch_wait(n): seconds per launch that waits for its own completion;
- compile(): seconds from a never-seen source to the engine's shader module (no cache);
- first_result(): seconds from a never-seen kernel to its result on the host (module,
  pipeline, bindings, one dispatch, the copy back).

How tinygrad 0.14's WEBGPU is driven (read from tinygrad/runtime/ops_webgpu.py): it loads Dawn
through ctypes from $WEBGPU_PATH (dawn-python's library); its compiler returns the WGSL text,
WebGPUProgram(dev, TinyELF) makes the shader module, and every call builds a bind group layout,
pipeline layout, bind group and compute pipeline, then releases them.
"""
from __future__ import annotations

import importlib.util
import itertools
import os
import struct
import time
from collections.abc import Callable
from typing import Any

from _common import NotAvailable, per_call

ONE = struct.pack("<f", 1.0)
TWO = struct.pack("<f", 2.0)
_names = itertools.count()
STAMP = f"{os.getpid()}_{time.time_ns()}"


def fresh_name(prefix: str) -> str: return f"{prefix}_{STAMP}_{next(_names)}"


class PlugrtSide:
  """plugrt's WEBGPU device with the engine `engine` (a registry of its own, WEBGPU_IFACE=engine)."""

  def __init__(self, engine: str):
    try:
      from plugrt.errors import PlugrtError
      from plugrt.registry import Registry
    except ImportError as e: raise NotAvailable(f"plugrt is not installed: {e}") from e
    mods = ["plugrt_webgpu", {"WGPU": "plugrt_webgpu_wgpu", "DAWN": "plugrt_webgpu_dawn"}[engine]]
    try:
      for m in mods: __import__(m)
    except ImportError as e:
      raise NotAvailable(f"{e.name} is not installed: pip install ./plugins/ops_webgpu ./plugins/ops_webgpu/iface_{engine.lower()}") from e
    self.reg = Registry(plugins=mods, env={"WEBGPU_IFACE": engine}, autoload=False)
    try: self.dev = self.reg.open("WEBGPU")
    except PlugrtError as e: raise NotAvailable(f"plugrt WEBGPU on {engine} cannot open: {e}") from e
    self.engine = self.dev.info.iface_object
    from plugrt import Buffer
    from plugrt.compiler.samples import tiny_kernel
    self.Buffer, self.tiny = Buffer, tiny_kernel
    self.a, self.b = Buffer(self.dev, 1), Buffer(self.dev, 1).copyin(memoryview(bytearray(ONE)))
    self.prg = self.dev.program(tiny_kernel(fresh_name("tiny")))
    self.prg(self.a, self.b, wait=True)
    if self.a.tobytes() != TWO: raise RuntimeError(f"plugrt WEBGPU on {engine}: the tiny kernel gave {self.a.tobytes()!r}")

  def describe(self) -> str: return f"plugrt {self.engine.describe()}; wait=True timer: {self.engine.timer}"

  def dispatch(self, n: int) -> Callable[[], float]:
    prg, a, b, sync = self.prg, self.a, self.b, self.dev.synchronize
    def run() -> float:
      t = time.perf_counter()
      for _ in range(n): prg(a, b)
      sync()
      return (time.perf_counter() - t) / n
    return run

  def dispatch_wait(self, n: int) -> Callable[[], float]:
    prg, a, b, sync = self.prg, self.a, self.b, self.dev.synchronize
    def one() -> None:
      prg(a, b)
      sync()
    return lambda: per_call(one, n)

  def compile(self) -> Callable[[], float]:
    comp = self.dev.compiler
    def once() -> float:
      src = comp.render(self.tiny(fresh_name("fresh")))
      t = time.perf_counter()
      comp.compile_uncached(src)
      return time.perf_counter() - t
    return once

  def first_result(self) -> Callable[[], float]:
    comp, dev = self.dev.compiler, self.dev
    def once() -> float:
      t = time.perf_counter()
      kernel = self.tiny(fresh_name("first"))
      prg = dev.load(kernel.name, comp.compile_uncached(comp.render(kernel)), kernel.signature)
      prg(self.a, self.b)
      got = self.a.tobytes()
      dt = time.perf_counter() - t
      if got != TWO: raise RuntimeError("plugrt: wrong result")
      return dt
    return once


RAW_WGSL = """
@group(0) @binding(0) var<storage, read_write> out: array<f32>;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@compute @workgroup_size(1) fn NAME() { out[0] = x[0] + 1.0; }
"""


class RawWgpu:
  """wgpu-py's public object API, written as a careful user would: pipeline and bind group built once,
  per launch an encoder, a pass, a submit."""

  def __init__(self) -> None:
    if importlib.util.find_spec("wgpu") is None: raise NotAvailable("wgpu is not installed (pip install wgpu)")
    import wgpu
    self.wgpu = wgpu
    ad = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    if ad is None: raise NotAvailable("wgpu-py found no adapter")
    self.adapter = ad.summary
    self.device = ad.request_device_sync()
    usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST | wgpu.BufferUsage.COPY_SRC
    self.a, self.b = self.device.create_buffer(size=4, usage=usage), self.device.create_buffer(size=4, usage=usage)
    self.device.queue.write_buffer(self.b, 0, bytearray(ONE))
    self.bgl = self.device.create_bind_group_layout(entries=[
      {"binding": i, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": {"type": wgpu.BufferBindingType.storage}} for i in range(2)])
    self.layout = self.device.create_pipeline_layout(bind_group_layouts=[self.bgl])
    self.bg = self.device.create_bind_group(layout=self.bgl, entries=[
      {"binding": 0, "resource": {"buffer": self.a, "offset": 0, "size": 4}}, {"binding": 1, "resource": {"buffer": self.b, "offset": 0, "size": 4}}])
    self.pipe = self._pipeline("tiny")
    self._launch(self.pipe)
    if bytes(self.device.queue.read_buffer(self.a)) != TWO: raise RuntimeError("raw wgpu-py: wrong result")

  def describe(self) -> str: return f"wgpu-py {self.wgpu.__version__} object API on {self.adapter}"

  def _pipeline(self, name: str) -> Any:
    sm = self.device.create_shader_module(code=RAW_WGSL.replace("NAME", name))
    return self.device.create_compute_pipeline(layout=self.layout, compute={"module": sm, "entry_point": name})

  def _launch(self, pipe: Any) -> None:
    enc = self.device.create_command_encoder()
    cp = enc.begin_compute_pass()
    cp.set_pipeline(pipe)
    cp.set_bind_group(0, self.bg)
    cp.dispatch_workgroups(1, 1, 1)
    cp.end()
    self.device.queue.submit([enc.finish()])

  def _sync(self) -> None:
    # wgpu-py 0.32's on_submitted_work_done_sync() fails against its own wgpu-native (a callback signature mismatch)
    if hasattr(self.device, "_poll_wait"): self.device._poll_wait()
    else: self.device.queue.on_submitted_work_done_sync()

  def dispatch(self, n: int) -> Callable[[], float]:
    launch, pipe = self._launch, self.pipe
    def run() -> float:
      t = time.perf_counter()
      for _ in range(n): launch(pipe)
      self._sync()
      return (time.perf_counter() - t) / n
    return run

  def dispatch_wait(self, n: int) -> Callable[[], float]:
    def one() -> None:
      self._launch(self.pipe)
      self._sync()
    return lambda: per_call(one, n)

  def compile(self) -> Callable[[], float]:
    def once() -> float:
      src = RAW_WGSL.replace("NAME", fresh_name("fresh"))
      t = time.perf_counter()
      self.device.create_shader_module(code=src)
      return time.perf_counter() - t
    return once

  def first_result(self) -> Callable[[], float]:
    def once() -> float:
      t = time.perf_counter()
      self._launch(self._pipeline(fresh_name("first")))
      got = bytes(self.device.queue.read_buffer(self.a))
      dt = time.perf_counter() - t
      if got != TWO: raise RuntimeError("raw wgpu-py: wrong result")
      return dt
    return once


def dawn_library() -> str:
  """dawn-python's Dawn library, for tinygrad's WEBGPU_PATH; NotAvailable if there is none."""
  spec = importlib.util.find_spec("pydawn")
  if spec is None or not spec.submodule_search_locations: raise NotAvailable("dawn-python is not installed (tinygrad's WEBGPU needs it)")
  libdir = os.path.join(next(iter(spec.submodule_search_locations)), "lib")
  import platform
  name = {"Linux": f"libwebgpu_dawn_{platform.machine()}.so", "Darwin": f"libwebgpu_dawn_{platform.machine()}.dylib"}.get(platform.system(), "")
  path = os.path.join(libdir, name)
  if not os.path.isfile(path): raise NotAvailable(f"dawn-python has no Dawn library for this machine ({path} is missing)")
  return path


class TinygradWebGPU:
  """tinygrad 0.14's WEBGPU device (Dawn through ctypes), its tiny kernel built from UOps."""

  def __init__(self) -> None:
    os.environ.setdefault("WEBGPU_PATH", dawn_library())  # read when tinygrad loads its Dawn binding
    try:
      from tinygrad import Device, UOp, dtypes
      from tinygrad.codegen import do_to_program
      from tinygrad.device import Buffer
      from tinygrad.uop.ops import KernelInfo
    except ImportError as e: raise NotAvailable(f"tinygrad is not installed: {e}") from e
    try: self.dev = Device["WEBGPU"]
    except Exception as e: raise NotAvailable(f"tinygrad's WEBGPU device does not open: {type(e).__name__}: {e}") from e
    self.UOp, self.dtypes, self.do_to_program, self.KernelInfo = UOp, dtypes, do_to_program, KernelInfo
    self.a = Buffer("WEBGPU", 1, dtypes.float32).allocate()
    self.b = Buffer("WEBGPU", 1, dtypes.float32, initial_value=ONE)
    self.ab, self.bb = self.a._buf, self.b._buf
    self.rt = self._runtime("bench_tiny")
    self.rt(self.ab, self.bb)
    self.dev.synchronize()
    if bytes(self.a.as_memoryview()) != TWO: raise RuntimeError(f"tinygrad WEBGPU: the tiny kernel gave {self.a.numpy()}")

  def describe(self) -> str: return f"tinygrad WEBGPU on Dawn (WEBGPU_PATH={os.environ.get('WEBGPU_PATH')})"

  def _program(self, name: str) -> Any:
    U, dt = self.UOp, self.dtypes
    out, x = U.param(0, dt.float32, (1,)), U.param(1, dt.float32, (1,))
    ast = out[0].store(x[0] + 1.0).sink(arg=self.KernelInfo(name), tag=1)  # tag=1: no optimisation passes
    return self.do_to_program(ast, self.dev.renderer)

  def _runtime(self, name: str) -> Any: return self.dev.runtime(self._program(name).to_elf())

  def dispatch(self, n: int) -> Callable[[], float]:
    rt, ab, bb, sync = self.rt, self.ab, self.bb, self.dev.synchronize
    def run() -> float:
      t = time.perf_counter()
      for _ in range(n): rt(ab, bb)
      sync()
      return (time.perf_counter() - t) / n
    return run

  def dispatch_wait(self, n: int) -> Callable[[], float]:
    def one() -> None:
      self.rt(self.ab, self.bb)
      self.dev.synchronize()
    return lambda: per_call(one, n)

  def compile(self) -> Callable[[], float]:
    """tinygrad's WEBGPU compiler returns the WGSL text; the shader module is made when the program loads: that is timed."""
    def once() -> float:
      elf = self._program(fresh_name("fresh")).to_elf()
      t = time.perf_counter()
      self.dev.runtime(elf)
      return time.perf_counter() - t
    return once

  def first_result(self) -> Callable[[], float]:
    def once() -> float:
      t = time.perf_counter()
      rt = self._runtime(fresh_name("first"))
      rt(self.ab, self.bb)
      got = bytes(self.a.as_memoryview())
      dt = time.perf_counter() - t
      if got != TWO: raise RuntimeError("tinygrad: wrong result")
      return dt
    return once
