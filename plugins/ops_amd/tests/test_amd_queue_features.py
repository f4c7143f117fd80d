"""The AQL queue's amd_queue_t features and memory from other runtimes, against the fake KFD: scratch (private segment)
memory for a kernel whose private array LLVM cannot promote, the GPU's own timestamps for wait=True, and
Buffer.from_blob / DLPack (device type 10, kDLROCM) of memory another runtime of the process allocated through KFD
(what hipMalloc under torch's ROCm build does), with the refusals for memory this GPU cannot reach."""
from __future__ import annotations

import ctypes
import mmap
import re

import numpy as np
import pytest
from amd_fixtures import fake_amd
from amd_tools import need, readelf_kernels, run
from fake_kfd import FOREIGN_DRM_FD, TIMESTAMP_KHZ

from plugrt import Buffer, Tensor, dtypes
from plugrt.compiler import samples as K
from plugrt.compiler.ir import KernelBuilder
from plugrt.context import PluginContext
from plugrt.errors import UnsupportedError
from plugrt.frontend.dlpack import KDL_ROCM
from plugrt_amd import aql
from plugrt_amd.toolchain import llvm_tool
from plugrt_amd_kfd.kfdev import KFDHardwareFault, KFDNotVisible

pytestmark = pytest.mark.skipif(llvm_tool(PluginContext.from_process(), "ld.lld") is None, reason="ld.lld is not installed (apt-get install lld)")


def pick_kernel():
  """out[i] = x[i] + 7 * (x[i] & 63), as plugrt IR (what the fake runs) ..."""
  b = KernelBuilder("scratch_pick")
  out, x = b.buffer("out", dtypes.int32), b.buffer("x", dtypes.int32)
  i = b.global_id(0)
  v = x[i]
  out[i] = v + (v & 63) * 7
  return b.finish()


def pick_llvm_ir(src: str) -> str:
  """... and as the LLVM IR AMD_LLVM renders for it, changed to read the value from a private array of 64 ints filled
  in a loop and indexed by data: LLVM keeps such an array in scratch (address space 5), so the kernel needs the queue's
  private segment."""
  m = re.search(r"  (%v\d+) = and i32 %v7, 63\n  (%v\d+) = mul i32 \1, 7\n  (%v\d+) = add i32 %v7, \2\n", src)
  assert m, src
  old, result = m.group(0), m.group(3)
  loop = ("  br label %fill\nfill:\n  %j = phi i32 [0, %entry], [%jn, %fill]\n  %jv = mul i32 %j, 7\n  %val = add i32 %jv, %v7\n"
          "  %p = getelementptr inbounds [64 x i32], ptr addrspace(5) %arr, i32 0, i32 %j\n  store volatile i32 %val, ptr addrspace(5) %p, align 4\n"
          "  %jn = add i32 %j, 1\n  %done = icmp eq i32 %jn, 64\n  br i1 %done, label %pick, label %fill\npick:\n"
          "  %idx = and i32 %v7, 63\n  %q = getelementptr inbounds [64 x i32], ptr addrspace(5) %arr, i32 0, i32 %idx\n"
          f"  {result} = load volatile i32, ptr addrspace(5) %q, align 4\n")
  return src.replace(old, loop).replace("entry:\n", "entry:\n  %arr = alloca [64 x i32], align 4, addrspace(5)\n", 1)


def scratch_program(fake, dev):
  k = pick_kernel()
  comp = dev.compiler
  lib = comp.compile(pick_llvm_ir(comp.render(k)))
  fake.register(lib, k)
  return dev.load(k.name, lib, k.signature), lib


def test_a_kernel_with_a_private_array_gets_the_queues_scratch(tmp_path):
  with fake_amd() as (fake, dev):
    prg, lib = scratch_program(fake, dev)
    need_bytes = prg.info.private_segment_size
    assert need_bytes >= 256 and prg.info.descriptor.private_segment_fixed_size == need_bytes
    if (readelf := need("llvm-readelf")):  # LLVM's own reading of the code object agrees
      assert int(readelf_kernels(run([readelf, "--notes"], lib, tmp_path))["scratch_pick"]["private_segment_fixed_size"]) == need_bytes
    q = dev.info.state.iface.compute
    d = q.desc
    assert q.scratch is not None and d.scratch_backing_memory_location == q.scratch.va and fake.bos[q.scratch.va].gpu_mapped
    node = dev.info.state.iface.kfd.node
    per_item = aql.scratch_per_item(need_bytes, node.major)
    assert d.scratch_wave64_lane_byte_size == per_item >= need_bytes
    assert q.scratch.size == per_item * 64 * node.scratch_slots_per_cu * node.cu_count  # sized by the topology
    waves, wave_bytes = aql.tmpring_fields(d.compute_tmpring_size, node.major)
    assert wave_bytes == 64 * per_item and 0 < waves and waves * wave_bytes <= d.scratch_backing_memory_byte_size
    assert list(d.scratch_resource_descriptor)[:3] == [q.scratch.va & 0xFFFFFFFF, (q.scratch.va >> 32) | 1 << 30, q.scratch.size]
    x = np.arange(-300, 724, dtype=np.int32) * 977
    out, xb = Buffer(dev, x.size, dtypes.int32), Buffer.from_numpy(x, dev)
    prg(out, xb, global_size=(8, 1, 1), local_size=(128, 1, 1), wait=True)
    assert np.array_equal(out.numpy(), x + (x & 63) * 7) and fake.dispatches[-1].private_segment_size >= need_bytes
    # the queue's scratch gone from amd_queue_t: the packet processor refuses the dispatch, a typed error
    d.scratch_backing_memory_location = 0
    with pytest.raises(KFDHardwareFault, match="reset"):
      prg(out, xb, global_size=(8, 1, 1), local_size=(128, 1, 1), wait=True)
    assert "needs" in fake.error and "scratch" in fake.error


def test_kernels_without_private_memory_get_no_scratch():
  with fake_amd() as (_, dev):
    prg = dev.program(K.saxpy_kernel())
    assert prg.info.private_segment_size == 0 and dev.info.state.iface.compute.scratch is None


def test_wait_returns_the_gpus_own_time():
  with fake_amd() as (fake, dev):
    q = dev.info.state.iface.compute
    assert q.desc.queue_properties & aql.AMD_QUEUE_PROPERTIES_ENABLE_PROFILING and dev.info.state.iface.kfd.timestamp_hz == TIMESTAMP_KHZ * 1000
    n = 256
    x = Buffer.from_numpy(np.ones(n, np.float32), dev)
    prg = dev.program(K.saxpy_kernel())
    t = prg(x, x, x, global_size=(1, 1, 1), local_size=(n, 1, 1), vals=(1.0, n), wait=True)
    start, end = fake.profiled[-1]
    assert q.signal.start_ts == start and q.signal.end_ts == end and t == (end - start) / (TIMESTAMP_KHZ * 1000)
    # the firmware writes no timestamps (profiling off): the host's clock, not a stale or zero GPU time
    q.desc.queue_properties &= ~aql.AMD_QUEUE_PROPERTIES_ENABLE_PROFILING
    n_profiled = len(fake.profiled)
    t2 = prg(x, x, x, global_size=(1, 1, 1), local_size=(n, 1, 1), vals=(1.0, n), wait=True)
    assert len(fake.profiled) == n_profiled and q.signal.start_ts == 0 and isinstance(t2, float) and t2 > 0


def rocm_runtime_first(fake) -> None: fake.foreign_runtime()


def test_from_blob_of_memory_a_rocm_runtime_allocated():
  """torch's ROCm build allocates through ROCr, which acquired the GPU's VM first: plugrt adopts ROCr's render-node
  file (ACQUIRE_VM with its own is EBUSY) and wraps hipMalloc'd memory at its own address."""
  with fake_amd(before_open=rocm_runtime_first) as (fake, dev):
    kfd = dev.info.state.iface.kfd
    assert kfd.shared_vm and kfd.drm_fd == FOREIGN_DRM_FD
    n = 1000
    x_ptr, y_ptr = fake.foreign_alloc(n * 4), fake.foreign_alloc(n * 4)
    np.ctypeslib.as_array((ctypes.c_float * n).from_address(x_ptr))[:] = np.arange(n)
    np.ctypeslib.as_array((ctypes.c_float * n).from_address(y_ptr))[:] = 1.0
    xb, yb = Buffer.from_blob(x_ptr, n, dtypes.float32, dev), Buffer.from_blob(y_ptr, n, dtypes.float32, dev)
    assert xb.handle == x_ptr and kfd.check_visible(x_ptr, n * 4) == "kfd"
    assert np.array_equal(xb.numpy(), np.arange(n, dtype=np.float32))  # read through SDMA from the foreign memory
    dev.program(K.saxpy_kernel())(yb, xb, yb, global_size=(4, 1, 1), local_size=(250, 1, 1), vals=(2.0, n), wait=True)
    want = 2 * np.arange(n, dtype=np.float32) + 1
    assert np.array_equal(np.ctypeslib.as_array((ctypes.c_float * n).from_address(y_ptr)), want)  # written in place, no copy


def test_from_blob_refuses_memory_this_gpu_cannot_reach():
  with fake_amd() as (fake, dev):
    host = np.zeros(4096, np.uint8)  # ordinary host memory, XNACK off
    with pytest.raises(KFDNotVisible, match="XNACK is off"): Buffer.from_blob(host.ctypes.data, 1024, dtypes.uint8, dev)
    assert issubclass(KFDNotVisible, UnsupportedError)
    gone = mmap.mmap(-1, 8192)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(gone))
    gone.close()
    with pytest.raises(KFDNotVisible, match="not mapped"): Buffer.from_blob(addr, 64, dtypes.uint8, dev)
    fake.xnack = True  # with XNACK the GPU reaches any host memory of the process (retry faults)
    assert dev.info.state.iface.kfd.check_visible(host.ctypes.data, 1024) == "svm"


def test_dlpack_round_trip_as_rocm_device_memory():
  with fake_amd(before_open=rocm_runtime_first) as (fake, _):
    t = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4), device="AMD") * 2
    assert t.__dlpack_device__() == (KDL_ROCM, 0)
    back = Tensor.from_dlpack(t)  # export then import: the same GPU memory, checked visible, no copy
    assert back.device == t.device and np.array_equal(back.numpy(), np.arange(12, dtype=np.float32).reshape(3, 4) * 2)
    assert back.node.buffer.handle == t.node.buffer.handle or back.node.buffer._external
    # a producer of foreign ROCm memory (what torch's ROCm tensors are): imported as DLPack device (10, 0)
    n = 64
    ptr = fake.foreign_alloc(n * 4)
    np.ctypeslib.as_array((ctypes.c_int32 * n).from_address(ptr))[:] = np.arange(n)
    producer = Tensor.from_blob(ptr, (8, 8), dtypes.int32, device="AMD")
    imported = Tensor.from_dlpack(producer)
    assert imported.node.buffer.handle == ptr and np.array_equal(imported.numpy(), np.arange(n).reshape(8, 8))


def test_kernels_that_render_alike_keep_their_own_signatures():
  """Found by the differential fuzzer on AMD (tensor seed 360 after a few hundred cases): a uint32 sum and an int32 sum
  render to the same LLVM IR (one i32), and the device handed the uint32 kernel the Program loaded with the int32
  signature, which then refused uint32 buffers. Programs are keyed by signature too."""
  def total(dt):
    b = KernelBuilder("same_sum")
    out, x = b.buffer("out", dt), b.buffer("x", dt)
    i = b.global_id(0)
    out[i] = x[i] + x[i]
    return b.finish()
  with fake_amd() as (_, dev):
    signed, unsigned = dev.program(total(dtypes.int32)), dev.program(total(dtypes.uint32))
    assert dev.compiler.render(total(dtypes.int32)) == dev.compiler.render(total(dtypes.uint32)) and signed is not unsigned
    x = Buffer.from_numpy(np.array([1, 2**31 + 5], np.uint32), dev)
    out = Buffer(dev, 2, dtypes.uint32)
    unsigned(out, x, global_size=(2, 1, 1), wait=True)
    assert out.numpy().tolist() == [2, 10]
