"""The Objective-C call layer against a fake runtime (fake_objc.FakeRuntime): opening, compiling (success and an
NSError), pipelines, a dispatch's encoder calls in order with their buffer indices and MTLSize values,
completion/timeout/error, timing, and from_blob's accept and refuse paths. The whole device path runs through a
plugrt Registry, as on a Mac; only libobjc is replaced."""
from __future__ import annotations

import ctypes
import mmap
import struct
import sys
from pathlib import Path

import numpy as np
import plugrt_metal
import pytest
from plugrt_metal import objc
from plugrt_metal.compiler import METALLIB, SOURCE, frame, language_version, unframe
from plugrt_metal.device import MetalCommandError, MetalTimeoutError

from plugrt import Buffer, KernelBuilder, dtypes
from plugrt.compiler.samples import saxpy_kernel, tiny_kernel
from plugrt.errors import CompileError, DeviceUnavailable, EnvError, LaunchError, RenderError, UnsupportedError
from plugrt.registry import Registry

sys.path.insert(0, str(Path(__file__).parent))
from fake_objc import COMMITTED, ERROR, FakeRuntime

LAUNCH = ("commandBuffer", "computeCommandEncoder", "setComputePipelineState:", "setBuffer:offset:atIndex:", "setBytes:length:atIndex:",
          "dispatchThreadgroups:threadsPerThreadgroup:", "endEncoding", "commit", "retain")


@pytest.fixture
def on_a_fake_mac(monkeypatch, tmp_path):
  monkeypatch.setattr(plugrt_metal, "PLATFORM", "darwin")
  monkeypatch.setattr(plugrt_metal, "FRAMEWORK", str(tmp_path))  # a folder that exists, as Metal.framework does
  prev = objc.use_runtime(None)
  yield
  objc.use_runtime(prev)


def open_metal(rt: FakeRuntime, **env: str):
  objc.use_runtime(rt)
  reg = Registry(plugins=[plugrt_metal], env={"PLUGRT_CACHE": "0", "PATH": "/nonexistent", "PLUGRT_METAL_MSL": "3.1", **env})
  return reg.open("METAL")


def test_open_device(on_a_fake_mac):
  rt = FakeRuntime()
  dev = open_metal(rt)
  st = dev.info.state
  assert st.name == "Fake Apple GPU" and st.unified and st.max_threads == (1024, 1024, 1024) and st.msl_version == (3, 1)
  assert [m[1] for m in rt.log][:1] == ["newCommandQueue"] or "newCommandQueue" in [m[1] for m in rt.log]
  assert dev.allocator.max_alloc_bytes == 1 << 30  # maxBufferLength
  assert dev.allocator.dlpack_device() == (8, 0)  # kDLMetal


def test_no_device_and_bad_settings(on_a_fake_mac):
  with pytest.raises(DeviceUnavailable, match="MTLCreateSystemDefaultDevice returned no device"): open_metal(FakeRuntime(device=False))
  with pytest.raises(EnvError, match=r"PLUGRT_METAL_MSL='2\.9'"): open_metal(FakeRuntime(), PLUGRT_METAL_MSL="2.9")


def test_compile_from_source_with_fast_math_off(on_a_fake_mac):
  rt = FakeRuntime()
  dev = open_metal(rt)
  comp = dev.compiler
  src = comp.render(saxpy_kernel())
  lib = comp.compile(src)
  assert unframe(lib, "saxpy") == (SOURCE, src.encode())
  (library,) = rt.live("MTLLibrary")
  assert library.options["MathMode"] == 0 and library.options["LanguageVersion"] == language_version((3, 1)) == (3 << 16) + 1
  assert not rt.live("NSString") and not rt.live("MTLCompileOptions")  # what compiling made for itself is released
  assert comp.toolchain()[1:] == ("MSL 3.1", "Fake Apple GPU", "newLibraryWithSource")


def test_compile_error_carries_the_compiler_log(on_a_fake_mac):
  rt = FakeRuntime()
  dev = open_metal(rt)
  with pytest.raises(CompileError, match="Metal compiler rejected") as ei: dev.compiler.compile("this is not a kernel {{{")
  assert "unknown type name 'this'" in ei.value.log and "(code 3)" in ei.value.log


def test_fast_math_flag_before_macos_15(on_a_fake_mac):
  rt = FakeRuntime(responds=frozenset({"hasUnifiedMemory"}))  # no setMathMode: (macOS 14 and older)
  open_metal(rt).compiler.compile(open_metal(rt).compiler.render(tiny_kernel()))
  assert [m for m in rt.messages("setFastMathEnabled:")] == [("MTLCompileOptions", "setFastMathEnabled:", (False,))]
  assert not rt.messages("setMathMode:")


def test_float64_kernels_are_refused_by_name(on_a_fake_mac):
  dev = open_metal(FakeRuntime())
  with pytest.raises(RenderError, match="no float64"): dev.program(saxpy_kernel(dtypes.float64))
  dev30 = open_metal(FakeRuntime(), PLUGRT_METAL_MSL="3.0")
  with pytest.raises(RenderError, match="no bfloat16"): dev30.program(saxpy_kernel(dtypes.bfloat16))
  dev30.program(saxpy_kernel(dtypes.float16))  # half is in every MSL version


def test_dispatch_encodes_in_order_with_indices_and_sizes(on_a_fake_mac):
  rt = FakeRuntime()
  dev = open_metal(rt)
  prg = dev.program(saxpy_kernel())
  assert prg.simd_width == 32 and prg.launch_limits.max_local_total == 1024
  x = np.arange(16, dtype=np.float32)
  out, xb, ybase = Buffer(dev, 16, dtypes.float32), Buffer.from_numpy(x, dev), Buffer.from_numpy(np.arange(20, dtype=np.float32), dev)
  yb = ybase.view(16, offset=16)  # a view: its buffer at byte offset 16
  assert np.array_equal(xb.numpy(), x) and np.array_equal(yb.numpy(), np.arange(4, 20, dtype=np.float32))  # real bytes moved
  del rt.log[:]
  assert prg(out, xb, yb, global_size=(2, 1, 1), local_size=(8, 1, 1), vals=(2.5, 16)) is None
  launch = rt.messages(*LAUNCH)
  assert [m[1] for m in launch] == ["commandBuffer", "computeCommandEncoder", "setComputePipelineState:"] + \
    ["setBuffer:offset:atIndex:"] * 3 + ["setBytes:length:atIndex:"] * 2 + \
    ["dispatchThreadgroups:threadsPerThreadgroup:", "endEncoding", "commit", "retain"]
  bufs = [m[2] for m in launch if m[1] == "setBuffer:offset:atIndex:"]
  assert bufs == [(out.handle.buf, 0, 0), (xb.handle.buf, 0, 1), (ybase.handle.buf, 16, 2)]
  assert [m[2] for m in launch if m[1] == "setBytes:length:atIndex:"] == [(struct.pack("<f", 2.5), 4, 3), (struct.pack("<i", 16), 4, 4)]
  assert [m[2] for m in launch if m[1].startswith("dispatch")] == [((2, 1, 1), (8, 1, 1))]
  (pso,) = rt.live("MTLComputePipelineState")
  assert launch[2][2] == (next(k for k, v in rt.objects.items() if v is pso),)
  assert rt.pools == 0  # every pool pushed was popped
  assert len(rt.live("MTLCommandBuffer")) >= 1


def test_a_repeated_launch_looks_nothing_up(on_a_fake_mac):
  rt = FakeRuntime()
  dev = open_metal(rt)
  prg = dev.program(saxpy_kernel())
  bufs = [Buffer(dev, 4, dtypes.float32) for _ in range(3)]
  prg(*bufs, global_size=(1, 1, 1), local_size=(4, 1, 1), vals=(1.0, 4))
  sels, sigs = dict(rt.sel_ids), set(rt.signatures)
  calls_before = len(rt.log)
  prg(*bufs, global_size=(1, 1, 1), local_size=(4, 1, 1), vals=(1.0, 4))
  assert rt.sel_ids == sels and rt.signatures == sigs  # no selector registered, no objc_msgSend typed, per launch
  assert [m[1] for m in rt.log[calls_before:]] == [*LAUNCH[:4], LAUNCH[3], LAUNCH[3], *LAUNCH[4:5], LAUNCH[4], *LAUNCH[5:], "release"]
  dev.synchronize()


def test_each_call_is_encoded_as_called(on_a_fake_mac):
  """The launch memo (the core's) on Metal's encoding: a size list the caller changed, and -0.0 after 0.0, are other
  launches: the dispatch and the scalar's bytes follow the call, not the last one prepared."""
  rt = FakeRuntime()
  dev = open_metal(rt)
  prg = dev.program(saxpy_kernel())
  bufs = [Buffer(dev, 16, dtypes.float32) for _ in range(3)]
  gs = [1, 1, 1]
  for _ in range(2): prg(*bufs, global_size=gs, local_size=(4, 1, 1), vals=(1.0, 16))
  gs[0] = 3
  del rt.log[:]
  prg(*bufs, global_size=gs, local_size=(4, 1, 1), vals=(1.0, 16))
  assert [m[2] for m in rt.messages("dispatchThreadgroups:threadsPerThreadgroup:")] == [((3, 1, 1), (4, 1, 1))]
  for a in (0.0, -0.0, 0.0):
    del rt.log[:]
    prg(*bufs, global_size=(1, 1, 1), local_size=(4, 1, 1), vals=(a, 16))
    assert next(m[2] for m in rt.messages("setBytes:length:atIndex:")) == (struct.pack("<f", a), 4, 3)
  dev.synchronize()


def test_pipelines_are_built_once_per_binary(on_a_fake_mac):
  rt = FakeRuntime()
  dev = open_metal(rt)
  k = tiny_kernel("once")
  lib = dev.compiler.compile(dev.compiler.render(k))
  a, b = dev.load("once", lib, k.signature), dev.load("once", lib, k.signature)
  assert a.pipeline is b.pipeline and len(rt.messages("newComputePipelineStateWithDescriptor:options:reflection:error:")) == 1
  assert len(rt.messages("newLibraryWithSource:options:error:")) == 1  # the loader took the library compile() built
  assert rt.messages("setSupportIndirectCommandBuffers:") == [("MTLComputePipelineDescriptor", "setSupportIndirectCommandBuffers:", (True,))]
  assert not rt.live("MTLComputePipelineDescriptor") and a.pipeline.indirect


def test_without_pipeline_descriptors_the_function_path_is_used(on_a_fake_mac):
  rt = FakeRuntime(indirect=False)
  dev = open_metal(rt)
  prg = dev.program(tiny_kernel())
  assert len(rt.messages("newComputePipelineStateWithFunction:error:")) == 1 and not prg.pipeline.indirect
  from plugrt.runtime import Graph, Launch
  g = dev.graph([Launch(prg, [Buffer(dev, 1, dtypes.float32), Buffer(dev, 1, dtypes.float32)])])
  assert type(g) is Graph  # the core's launch-by-launch replay


def test_a_cached_metallib_loads_with_newLibraryWithData(on_a_fake_mac):
  rt = FakeRuntime()
  dev = open_metal(rt)
  k = tiny_kernel("offline")
  src = dev.compiler.render(k)
  dev.load("offline", frame(METALLIB, src.encode()), k.signature)  # the fake's "metallib" is the source's bytes
  assert len(rt.messages("newLibraryWithData:error:")) == 1 and not rt.messages("newLibraryWithSource:options:error:")
  with pytest.raises(Exception, match="plugrt-metal-library frame"): dev.load("offline", b"MTLB junk", k.signature)


def test_local_size_past_the_pipeline_limit(on_a_fake_mac):
  rt = FakeRuntime(max_total=64)
  dev = open_metal(rt)
  prg = dev.program(saxpy_kernel())
  bufs = [Buffer(dev, 4, dtypes.float32) for _ in range(3)]
  n = len(rt.log)
  with pytest.raises(LaunchError, match=r"METAL.*at most 64"): prg(*bufs, global_size=(1, 1, 1), local_size=(128, 1, 1), vals=(1.0, 4))
  assert not rt.messages("commandBuffer")[0:0] and "commandBuffer" not in [m[1] for m in rt.log[n:]]  # nothing encoded


def test_wait_returns_gpu_time(on_a_fake_mac):
  dev = open_metal(FakeRuntime())
  prg = dev.program(tiny_kernel())
  t = prg(Buffer(dev, 1, dtypes.float32), Buffer(dev, 1, dtypes.float32), wait=True)
  assert t == pytest.approx(0.00025, abs=1e-9)


def test_timeout_is_a_typed_error(on_a_fake_mac):
  rt = FakeRuntime(end_status=COMMITTED)  # never completes
  dev = open_metal(rt, PLUGRT_METAL_TIMEOUT="0.05")
  prg = dev.program(tiny_kernel())
  with pytest.raises(MetalTimeoutError, match=r"did not complete within 0.05 s \(status: committed\)"):
    prg(Buffer(dev, 1, dtypes.float32), Buffer(dev, 1, dtypes.float32), wait=True)
  assert isinstance(MetalTimeoutError("x"), TimeoutError)


def test_command_buffer_error_is_a_typed_error(on_a_fake_mac):
  rt = FakeRuntime(end_status=ERROR)
  dev = open_metal(rt)
  prg = dev.program(tiny_kernel())
  prg(Buffer(dev, 1, dtypes.float32), Buffer(dev, 1, dtypes.float32))
  with pytest.raises(MetalCommandError, match="aborted due to an error"): dev.synchronize()
  dev.synchronize()  # reported once


def test_from_blob_wraps_an_mtlbuffer(on_a_fake_mac):
  rt = FakeRuntime()
  dev = open_metal(rt)
  ours = Buffer.from_numpy(np.arange(8, dtype=np.float32), dev)  # stands in for an MPS tensor's storage (an MTLBuffer)
  b = Buffer.from_blob(ours.handle.buf, 8, dtypes.float32, dev, keepalive=ours)
  assert b.handle.buf == ours.handle.buf and np.array_equal(b.numpy(), np.arange(8, dtype=np.float32))
  with pytest.raises(ValueError, match="holds 32 bytes"): Buffer.from_blob(ours.handle.buf, 9, dtypes.float32, dev)
  foreign = rt._new("MTLBuffer", length=64, host=0, device=rt._new("MTLDevice", name="other"))
  with pytest.raises(UnsupportedError, match="another Metal device"): Buffer.from_blob(foreign, 4, dtypes.float32, dev)


def test_from_blob_wraps_page_aligned_host_memory(on_a_fake_mac):
  rt = FakeRuntime()
  dev = open_metal(rt)
  page = mmap.PAGESIZE
  m = mmap.mmap(-1, 2 * page)
  arr = np.frombuffer(m, np.float32)
  arr[:] = 7
  ptr = ctypes.addressof(ctypes.c_char.from_buffer(m))
  b = Buffer.from_blob(ptr, arr.size, dtypes.float32, dev, keepalive=m)
  (call,) = rt.messages("newBufferWithBytesNoCopy:length:options:deallocator:")
  assert call[2] == (ptr, 2 * page, 0, None)  # shared storage, no deallocator: the memory stays the caller's
  assert b.numpy()[0] == 7
  with pytest.raises(UnsupportedError, match="not page-aligned"): Buffer.from_blob(ptr + 64, 16, dtypes.float32, dev)
  with pytest.raises(UnsupportedError, match="not page-aligned"): Buffer.from_blob(ptr, 16, dtypes.float32, dev)  # 64 bytes: no whole page
  assert len(rt.messages("newBufferWithBytesNoCopy:length:options:deallocator:")) == 1  # refusals made nothing
  del b


def test_from_blob_refuses_host_memory_without_unified_memory(on_a_fake_mac):
  dev = open_metal(FakeRuntime(unified=False))
  m = mmap.mmap(-1, mmap.PAGESIZE)
  with pytest.raises(UnsupportedError, match="no unified memory"):
    Buffer.from_blob(ctypes.addressof(ctypes.c_char.from_buffer(m)), mmap.PAGESIZE // 4, dtypes.float32, dev)


def test_dlpack_pointer_is_the_mtlbuffer(on_a_fake_mac):
  dev = open_metal(FakeRuntime())
  b = Buffer(dev, 8, dtypes.float32)
  assert dev.allocator._pointer(b.handle) == b.handle.buf
  with pytest.raises(UnsupportedError, match="view at a byte offset"): dev.allocator._pointer(b.view(4, offset=16).handle)


def test_shared_memory_kernel_renders_and_dispatches(on_a_fake_mac):
  rt = FakeRuntime()
  dev = open_metal(rt)
  b = KernelBuilder("rev")
  out, x = b.buffer("out", dtypes.float32), b.buffer("x", dtypes.float32)
  tile = b.shared("tile", dtypes.float32, 8)
  tile[b.local_id(0)] = x[b.global_id(0)]
  b.barrier()
  out[b.global_id(0)] = tile[7 - b.local_id(0)]
  prg = dev.program(b.finish())
  prg(Buffer(dev, 16, dtypes.float32), Buffer(dev, 16, dtypes.float32), global_size=(2, 1, 1), local_size=(8, 1, 1))
  assert [m[2] for m in rt.messages("dispatchThreadgroups:threadsPerThreadgroup:")][-1] == ((2, 1, 1), (8, 1, 1))


def test_graph_encodes_an_indirect_command_buffer_once(on_a_fake_mac):
  from plugrt_metal.graph import MetalGraph

  from plugrt.runtime import Launch
  rt = FakeRuntime()
  dev = open_metal(rt)
  saxpy, tiny = dev.program(saxpy_kernel()), dev.program(tiny_kernel())
  out, x, y = (Buffer(dev, 8, dtypes.float32) for _ in range(3))
  launches = [Launch(saxpy, [out, x, y.view(4, offset=16)], (1, 1, 1), (4, 1, 1), (2.0, 4)), Launch(tiny, [x, out])]
  g = dev.graph(launches)
  assert isinstance(g, MetalGraph)
  (icb,) = rt.live("MTLIndirectCommandBuffer")
  assert icb.count == 2 and icb.descriptor["CommandTypes"] == 1 << 5 and icb.descriptor["InheritBuffers"] is False
  assert icb.descriptor["InheritPipelineState"] is False and icb.descriptor["MaxKernelBufferBindCount"] == 31
  binds = [m[2] for m in rt.messages("setKernelBuffer:offset:atIndex:")]
  assert binds == [(out.handle.buf, 0, 0), (x.handle.buf, 0, 1), (y.handle.buf, 16, 2), (g.scalars, 0, 3), (g.scalars, 256, 4),
                   (x.handle.buf, 0, 0), (out.handle.buf, 0, 1)]
  host = rt.obj(g.scalars).host
  assert ctypes.string_at(host, 4) == struct.pack("<f", 2.0) and ctypes.string_at(host + 256, 4) == struct.pack("<i", 4)
  assert [m[2] for m in rt.messages("concurrentDispatchThreadgroups:threadsPerThreadgroup:")] == [((1, 1, 1), (4, 1, 1)), ((1, 1, 1), (1, 1, 1))]
  assert len(rt.messages("setBarrier")) == 2
  del rt.log[:]
  assert g(wait=True) == pytest.approx(0.00025, abs=1e-9)
  names = [m[1] for m in rt.log if m[1] not in ("status", "GPUStartTime", "GPUEndTime", "release")]
  assert names == ["commandBuffer", "computeCommandEncoder", "useResources:count:usage:", "executeCommandsInBuffer:withRange:",
                   "endEncoding", "commit", "retain"]
  (use,) = rt.messages("useResources:count:usage:")
  assert sorted(use[2][0]) == sorted({out.handle.buf, x.handle.buf, y.handle.buf, g.scalars}) and use[2][1:] == (4, 3)
  assert rt.messages("executeCommandsInBuffer:withRange:")[0][2] == (next(k for k, v in rt.objects.items() if v is icb), (0, 2))
  assert rt.pools == 0
  del g
  assert not rt.live("MTLIndirectCommandBuffer")


def test_graph_falls_back_where_no_indirect_command_buffer_is_made(on_a_fake_mac):
  from plugrt.runtime import Graph, Launch
  rt = FakeRuntime(icb=False)
  dev = open_metal(rt)
  prg = dev.program(tiny_kernel())
  bufs = [Buffer(dev, 1, dtypes.float32), Buffer(dev, 1, dtypes.float32)]
  g = dev.graph([Launch(prg, bufs)])
  assert type(g) is Graph and len(rt.live("MTLBuffer")) == 2  # the graph's scalar buffer was released again
  g(wait=True)


def test_dlpack_round_trip_of_a_view_wraps_the_mtlbuffer(on_a_fake_mac):
  from plugrt import Tensor
  from plugrt.frontend.dlpack import from_dlpack
  rt = FakeRuntime()
  dev = open_metal(rt)
  buf = Buffer.from_numpy(np.arange(8, dtype=np.float32), dev)
  t = Tensor.from_buffer(buf, (4,), offset=2)  # DLPack: data = the MTLBuffer, byte_offset = 8
  assert t.__dlpack_device__() == (8, 0)
  imported = from_dlpack(t, device=dev)
  assert imported.buffer.base.handle.buf == buf.handle.buf and imported.buffer.offset == 8  # a view of the same MTLBuffer
  assert np.array_equal(imported.buffer.numpy(), np.arange(2, 6, dtype=np.float32))
  assert not rt.messages("newBufferWithBytesNoCopy:length:options:deallocator:")  # no host wrap, no copy
