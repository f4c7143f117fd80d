"""plugrt-amd-kfd's queue layer against the fake KFD (fake_kfd.py): the KFD ABI's layouts, memory, queues, AQL
dispatches checked against a hand-built kernel descriptor and run through the reference interpreter, SDMA copies,
and the typed errors of a fault, a corrupted packet, a kernarg-size mismatch and a hang."""
from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import time

import numpy as np
import pytest
from amd_fixtures import axpy_kernel
from fake_kfd import GFX942, GFX1100, GPU_ID, FakeKFD, expected_cwsr, natural_kernarg_layout

from plugrt.errors import DeviceUnavailable
from plugrt_amd import aql, sdma
from plugrt_amd_kfd import kfd
from plugrt_amd_kfd.kfdev import (
  GPUNode,
  KFDDevice,
  KFDHardwareFault,
  KFDLaunchError,
  KFDMemoryFault,
  KFDPacketError,
  KFDTimeout,
  check_dispatch,
  cwsr_sizes,
  gfx_arch,
  read_topology,
)

# ---------------------------------------------------------------- the ABI, from kfd_ioctl.h (ABI 1.18) by hand
# struct -> (size, {field: offset}); each offset follows from the header's field order and C's natural alignment
LAYOUTS: dict[type, tuple[int, dict[str, int]]] = {
  kfd.GetVersionArgs: (8, {"major_version": 0, "minor_version": 4}),
  kfd.AcquireVmArgs: (8, {"drm_fd": 0, "gpu_id": 4}),
  kfd.ProcessDeviceApertures: (56, {"lds_base": 0, "lds_limit": 8, "scratch_base": 16, "scratch_limit": 24, "gpuvm_base": 32,
                                    "gpuvm_limit": 40, "gpu_id": 48, "pad": 52}),
  kfd.GetProcessAperturesNewArgs: (16, {"kfd_process_device_apertures_ptr": 0, "num_of_nodes": 8, "pad": 12}),
  kfd.RuntimeEnableArgs: (16, {"r_debug": 0, "mode_mask": 8, "capabilities_mask": 12}),
  kfd.AllocMemoryOfGpuArgs: (40, {"va_addr": 0, "size": 8, "handle": 16, "mmap_offset": 24, "gpu_id": 32, "flags": 36}),
  kfd.FreeMemoryOfGpuArgs: (8, {"handle": 0}),
  kfd.MapMemoryToGpuArgs: (24, {"handle": 0, "device_ids_array_ptr": 8, "n_devices": 16, "n_success": 20}),
  kfd.UnmapMemoryFromGpuArgs: (24, {"handle": 0, "device_ids_array_ptr": 8, "n_devices": 16, "n_success": 20}),
  kfd.CreateQueueArgs: (96, {"ring_base_address": 0, "write_pointer_address": 8, "read_pointer_address": 16, "doorbell_offset": 24,
                             "ring_size": 32, "gpu_id": 36, "queue_type": 40, "queue_percentage": 44, "queue_priority": 48, "queue_id": 52,
                             "eop_buffer_address": 56, "eop_buffer_size": 64, "ctx_save_restore_address": 72, "ctx_save_restore_size": 80,
                             "ctl_stack_size": 84, "sdma_engine_id": 88, "pad": 92}),
  kfd.DestroyQueueArgs: (8, {"queue_id": 0, "pad": 4}),
  kfd.CreateEventArgs: (32, {"event_page_offset": 0, "event_trigger_data": 8, "event_type": 12, "auto_reset": 16, "node_id": 20,
                             "event_id": 24, "event_slot_index": 28}),
  kfd.DestroyEventArgs: (8, {"event_id": 0, "pad": 4}),
  kfd.SetEventArgs: (8, {"event_id": 0}),
  kfd.ResetEventArgs: (8, {"event_id": 0}),
  kfd.MemoryExceptionFailure: (16, {"NotPresent": 0, "ReadOnly": 4, "NoExecute": 8, "imprecise": 12}),
  kfd.MemoryExceptionData: (32, {"failure": 0, "va": 16, "gpu_id": 24, "ErrorType": 28}),
  kfd.HwExceptionData: (16, {"reset_type": 0, "reset_cause": 4, "memory_lost": 8, "gpu_id": 12}),
  kfd.EventData: (48, {"memory_exception_data": 0, "hw_exception_data": 0, "signal_event_data": 0, "kfd_event_data_ext": 32, "event_id": 40,
                       "pad": 44}),
  kfd.WaitEventsArgs: (24, {"events_ptr": 0, "num_events": 8, "wait_for_all": 12, "timeout": 16, "wait_result": 20}),
  aql.KernelDispatchPacket: (64, {"header": 0, "setup": 2, "workgroup_size_x": 4, "workgroup_size_y": 6, "workgroup_size_z": 8, "grid_size_x": 12,
                                  "grid_size_y": 16, "grid_size_z": 20, "private_segment_size": 24, "group_segment_size": 28, "kernel_object": 32,
                                  "kernarg_address": 40, "completion_signal": 56}),
  aql.BarrierAndPacket: (64, {"header": 0, "dep_signal": 8, "completion_signal": 56}),
  aql.AmdSignal: (64, {"kind": 0, "value": 8, "event_mailbox_ptr": 16, "event_id": 24, "start_ts": 32, "end_ts": 40, "queue_ptr": 48}),
  aql.KernelDescriptor: (64, {"group_segment_fixed_size": 0, "private_segment_fixed_size": 4, "kernarg_size": 8, "kernel_code_entry_byte_offset": 16,
                              "compute_pgm_rsrc3": 44, "compute_pgm_rsrc1": 48, "compute_pgm_rsrc2": 52, "kernel_code_properties": 56,
                              "kernarg_preload": 58}),
}


def offset(st: type, name: str) -> int: return getattr(st, name).offset  # an anonymous union's fields too


@pytest.mark.parametrize("st", list(LAYOUTS), ids=lambda s: s.__name__)
def test_struct_layouts(st):
  size, fields = LAYOUTS[st]
  assert ctypes.sizeof(st) == size
  assert {n: offset(st, n) for n in fields} == fields


def test_ioctl_numbers():
  # _IOWR('K', 0x16, 40 bytes) = 3 << 30 | 40 << 16 | 0x4B << 8 | 0x16, and so on: the encoding <linux/ioctl.h> defines
  assert kfd.AMDKFD_IOC_GET_VERSION == 0x80084B01
  assert kfd.AMDKFD_IOC_CREATE_QUEUE == 0xC0604B02
  assert kfd.AMDKFD_IOC_ACQUIRE_VM == 0x40084B15
  assert kfd.AMDKFD_IOC_ALLOC_MEMORY_OF_GPU == 0xC0284B16
  assert kfd.AMDKFD_IOC_FREE_MEMORY_OF_GPU == 0x40084B17
  assert kfd.AMDKFD_IOC_WAIT_EVENTS == 0xC0184B0C
  assert kfd.AMDKFD_IOC_RUNTIME_ENABLE == 0xC0104B25
  assert kfd.AMDKFD_IOC_SVM == 0xC0184B20 and kfd.DRM_IOCTL_AMDGPU_INFO == 0x40206445  # svm_args head 24 bytes; drm_amdgpu_info 32
  assert len(set(kfd.REQUESTS)) == len(kfd.REQUESTS) == 17


CLANG = shutil.which("clang") or shutil.which("clang-14")


@pytest.mark.skipif(CLANG is None or not os.path.exists("/usr/include/linux/kfd_ioctl.h"), reason="needs clang and the kernel's uapi headers")
def test_layouts_match_the_installed_header(tmp_path):
  """Where the machine's <linux/kfd_ioctl.h> has a struct with the same size, every offset agrees (the installed
  header may be older than ABI 1.18: create_queue gained sdma_engine_id in 1.17)."""
  names = {kfd.GetVersionArgs: "kfd_ioctl_get_version_args", kfd.AllocMemoryOfGpuArgs: "kfd_ioctl_alloc_memory_of_gpu_args",
           kfd.MapMemoryToGpuArgs: "kfd_ioctl_map_memory_to_gpu_args", kfd.CreateEventArgs: "kfd_ioctl_create_event_args",
           kfd.EventData: "kfd_event_data", kfd.WaitEventsArgs: "kfd_ioctl_wait_events_args",
           kfd.MemoryExceptionData: "kfd_hsa_memory_exception_data", kfd.ProcessDeviceApertures: "kfd_process_device_apertures"}
  lines = ["#include <stdio.h>", "#include <stddef.h>", "#include <linux/kfd_ioctl.h>", "int main(void) {"]
  for st, c in names.items():
    lines.append(f'printf("{st.__name__} sizeof %zu\\n", sizeof(struct {c}));')
    for n in LAYOUTS[st][1]:
      if n in ("memory_exception_data", "hw_exception_data", "signal_event_data", "ErrorType"): continue
      lines.append(f'printf("{st.__name__} {n} %zu\\n", offsetof(struct {c}, {n}));')
  (tmp_path / "l.c").write_text("\n".join([*lines, "return 0; }"]))
  (tmp_path / "drm").mkdir()  # the header includes <drm/drm.h> for the __u32/__u64 types only (libdrm-dev may be absent)
  (tmp_path / "drm" / "drm.h").write_text("#include <linux/types.h>\n")
  cc = subprocess.run([CLANG, "-I", str(tmp_path), "-o", str(tmp_path / "l"), str(tmp_path / "l.c")], capture_output=True, text=True)
  assert cc.returncode == 0, cc.stderr
  out = subprocess.run([str(tmp_path / "l")], check=True, capture_output=True, text=True).stdout.split("\n")
  by = {st.__name__: st for st in names}
  for line in filter(None, out):
    sname, field, value = line.split()
    st = by[sname]
    assert int(value) == (LAYOUTS[st][0] if field == "sizeof" else LAYOUTS[st][1][field]), line


# ---------------------------------------------------------------- topology and CWSR

def test_topology_and_arch():
  fake = FakeKFD(GFX942)
  (node,) = read_topology(fake)
  assert node.gpu_id == GPU_ID and node.arch == "gfx942" and node.xccs == 8 and node.cu_count == 304 and node.wave_size == 64
  assert [gfx_arch(v) for v in (90010, 90402, 110000, 120001, 100300)] == ["gfx90a", "gfx942", "gfx1100", "gfx1201", "gfx1030"]


@pytest.mark.parametrize("props", [GFX1100, GFX942], ids=["gfx1100", "gfx942"])
def test_cwsr_sizes_are_kfds(props):
  s = cwsr_sizes(GPUNode(1, GPU_ID, props))
  assert (s.ctx_save_restore_size, s.ctl_stack_size, s.debug_memory_size) == expected_cwsr(props)
  assert s.eop_buffer_size == 4096
  if props is GFX1100:  # 96 CUs, 3072 waves: ctl stack 40 + 3072*12 + 8 -> 0xA000; wg data 96 * 0x75000 -> 0x2BE0000
    assert (s.ctl_stack_size, s.ctx_save_restore_size, s.debug_memory_size) == (0xA000, 0x2BE0000 + 0xA000, 3072 * 32)


# ---------------------------------------------------------------- the device

@pytest.fixture
def fake():
  f = FakeKFD()
  yield f
  f.shutdown()


@pytest.fixture
def dev(fake):
  d = KFDDevice(fake, timeout=5)
  yield d
  d.close()


def test_open_sequence(fake, dev):
  assert fake.log[:4] == ["GET_VERSION", "ACQUIRE_VM", "GET_PROCESS_APERTURES_NEW", "RUNTIME_ENABLE"]
  assert dev.version == (1, 18) and dev.node.arch == "gfx1100" and dev.aperture.gpu_id == GPU_ID
  assert dev.signal_mailbox == dev.event_page.va + 8 * dev.signal_event.event_slot_index


def test_old_kfd_has_no_runtime_enable():
  f = FakeKFD(version=(1, 11))
  d = KFDDevice(f)
  assert "RUNTIME_ENABLE" not in f.log and not f.runtime_enabled
  d.close()
  f.shutdown()


def test_unavailable_without_kfd(monkeypatch):
  f = FakeKFD()
  monkeypatch.setattr(f, "exists", lambda path: False)
  with pytest.raises(DeviceUnavailable, match="/dev/kfd does not exist"): KFDDevice(f)
  with pytest.raises(DeviceUnavailable, match="no GPU 3"): KFDDevice(FakeKFD(), 3)
  f.shutdown()


@pytest.mark.parametrize("kind", ["vram", "gtt", "userptr"])
def test_memory_shares_the_address(fake, dev, kind):
  m = dev.alloc(10000, kind)
  assert m.size == 12288 and m.va % 4096 == 0 and fake.bos[m.va].gpu_mapped and fake.bos[m.va].kind == kind
  m.view()[:5] = b"hello"
  assert fake.memory.read(m.va, 5) == b"hello"  # what the CPU wrote is what the GPU reads at the same address
  dev.free(m)
  assert m.va not in fake.bos and "UNMAP_MEMORY_FROM_GPU" in fake.log
  assert fake.log[-2:] == ["UNMAP_MEMORY_FROM_GPU", "FREE_MEMORY_OF_GPU"]


def test_userptr_registers_host_memory(fake, dev):
  host = fake.mmap(0, 8192, 3, 0x21)  # memory the process already has (what Tensor.from_blob would register)
  m = dev.alloc(8192, "userptr", host=host)
  assert m.va == host and not m.owned and fake.bos[host].kind == "userptr"
  dev.free(m)
  fake.munmap(host, 8192)


def test_out_of_vram(fake, dev):
  from plugrt.errors import OutOfMemoryError
  with pytest.raises(OutOfMemoryError, match="no 0x80000000 bytes of vram"): dev.alloc(2 << 30, "vram")
  assert not fake.reserved  # the reservation was given back


def test_queues_create_and_destroy(fake, dev):
  q = dev.compute_queue(64)
  s = dev.sdma_queue()
  assert set(fake.queues) == {q.queue_id, s.queue_id} and fake.queues[q.queue_id].kind == "aql"
  sizes = cwsr_sizes(dev.node)
  assert q.extra[1].size == sizes.buffer_size and q.extra[0].size == 4096
  n = len(fake.bos)
  dev.destroy_queue(q)
  assert q.queue_id not in fake.queues and len(fake.bos) == n - 4  # ring, pointers, EOP, CWSR


def test_kfd_refuses_wrong_cwsr_sizes(fake, dev, monkeypatch):
  from plugrt_amd_kfd import kfdev
  right = kfdev.cwsr_sizes(dev.node)
  monkeypatch.setattr(kfdev, "cwsr_sizes", lambda node: kfdev.CWSRSizes(right.ctx_save_restore_size - 4096, right.ctl_stack_size,
                                                                       right.debug_memory_size, 4096, 1))
  n = len(fake.bos)
  with pytest.raises(OSError, match="KFD wants"): dev.compute_queue(16)
  assert len(fake.bos) == n  # its buffers were given back


# ---------------------------------------------------------------- dispatch

def kernel_descriptor(kernarg_size: int, group: int = 0, wave32: bool = True) -> bytes:
  """A minimal code-object-v5 kernel descriptor (AMDGPUUsage's table), as the compiler would emit it for a kernel
  with a kernarg pointer, workgroup id X and work-item id X: 64 bytes, the entry 256 bytes after it."""
  kd = aql.KernelDescriptor()
  kd.group_segment_fixed_size, kd.private_segment_fixed_size, kd.kernarg_size = group, 0, kernarg_size
  kd.kernel_code_entry_byte_offset = 256
  kd.compute_pgm_rsrc1 = 2 | 1 << 6             # 3 VGPR granules, 2 SGPR granules
  kd.compute_pgm_rsrc2 = 2 << 1 | 1 << 7        # 2 user SGPRs (the kernarg pointer), workgroup id X
  kd.compute_pgm_rsrc3 = 0
  kd.kernel_code_properties = aql.KCP_ENABLE_SGPR_KERNARG_SEGMENT_PTR | (aql.KCP_ENABLE_WAVEFRONT_SIZE32 if wave32 else 0)
  return bytes(kd)


class Loaded:
  """axpy with its descriptor in executable memory and its arguments in a kernarg segment."""
  def __init__(self, fake: FakeKFD, dev: KFDDevice, n: int = 1000, kernarg_size: int | None = None):
    k = axpy_kernel()
    self.offsets, self.size = natural_kernarg_layout(k.signature)
    assert self.offsets == [0, 8, 16, 24, 28] and self.size == 32
    self.code = dev.alloc(4096, "vram", executable=True)
    self.code.view()[:64] = kernel_descriptor(self.size if kernarg_size is None else kernarg_size)
    fake.load(self.code.va, k)
    self.n = n
    rng = np.random.default_rng(0)
    self.a, self.b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    self.bufs = [dev.alloc(n * 4, "vram") for _ in range(3)]
    for m, x in zip(self.bufs[1:], (self.a, self.b)): m.view(0, n * 4)[:] = x.tobytes()
    self.kernargs = dev.alloc(4096, "gtt")
    args = bytearray(self.size)
    for o, m in zip(self.offsets, self.bufs): args[o:o + 8] = m.va.to_bytes(8, "little")
    args[24:28] = np.float32(2.5).tobytes()
    args[28:32] = n.to_bytes(4, "little")
    self.kernargs.view()[:self.size] = args

  def out(self) -> np.ndarray: return np.frombuffer(bytes(self.bufs[0].view(0, self.n * 4)), np.float32)
  def want(self) -> np.ndarray: return self.a * np.float32(2.5) + self.b


def test_dispatch_runs_the_kernel(fake, dev):
  L = Loaded(fake, dev)
  q = dev.compute_queue(64)
  kd = aql.KernelDescriptor.from_buffer_copy(bytes(L.code.view(0, 64)))
  check_dispatch(kd, L.size, (64, 1, 1))
  v = q.dispatch(L.code.va, L.kernargs.va, (1024, 1, 1), (64, 1, 1))
  q.wait(v)
  np.testing.assert_array_equal(L.out(), L.want())
  p = fake.dispatches[-1]
  assert p.header & 0xFF == aql.PACKET_TYPE_KERNEL_DISPATCH and p.setup == 1 and p.completion_signal == q.signal_address
  assert fake.runner.runs[-1] == ("axpy", (16, 1, 1), (64, 1, 1))
  assert q.signal.value == -1 and q.completed() == 1 == q.rptr.value
  assert ctypes.c_uint64.from_address(dev.signal_mailbox).value == dev.signal_event.event_id  # the interrupt's mailbox
  assert dev.sleep(100)  # and KFD's signal event fired


def test_many_dispatches_wrap_the_ring(fake, dev):
  L = Loaded(fake, dev, n=64)
  q = dev.compute_queue(16)
  for _ in range(40): v = q.dispatch(L.code.va, L.kernargs.va, (64, 1, 1), (64, 1, 1))
  q.wait(v)
  assert v == 40 and q.rptr.value == 40 and len(fake.dispatches) == 40
  np.testing.assert_array_equal(L.out(), L.want())


def test_prepared_launches_with_kernarg_slots(fake, dev):
  """The launch path: a prepared packet pushed with a kernarg block per launch from kernarg_slots, blocks reused
  only once the GPU is done with them."""
  L = Loaded(fake, dev, n=256)
  q = dev.compute_queue(16)
  _, slots = dev.kernarg_slots(L.size, 3)
  outs = [dev.alloc(256 * 4, "gtt") for _ in range(8)]
  prep = q.prepare(L.code.va, 0, (256, 1, 1), (64, 1, 1))
  base = bytes(L.kernargs.view(0, L.size))
  for k, o in enumerate(outs):
    i = slots.take(q)
    args = bytearray(base)
    args[0:8], args[24:28] = o.va.to_bytes(8, "little"), np.float32(k).tobytes()
    slots.view[i * slots.size:i * slots.size + L.size] = args
    slots.last_use[i] = v = q.push_args(prep, slots.address(i))
  q.wait(v)
  for k, o in enumerate(outs):
    np.testing.assert_array_equal(np.frombuffer(bytes(o.view(0, 1024)), np.float32), L.a * np.float32(k) + L.b)
  assert {p.kernarg_address for p in fake.dispatches} == {slots.address(i) for i in range(3)}
  q.wait(q.push(q.prepare(L.code.va, L.kernargs.va, (256, 1, 1), (64, 1, 1))))
  np.testing.assert_array_equal(L.out(), L.want())


def test_barrier_packet(fake, dev):
  q = dev.compute_queue(16)
  q.wait(q.barrier())
  assert q.completed() == 1


def test_packet_builders_round_trip():
  raw = aql.dispatch_packet(0x1000, 0x2000, (256, 4, 1), (64, 2, 1), 512, 16, 0x3000)
  p = aql.decode_packet(raw)
  assert (p.grid_size_x, p.grid_size_y, p.workgroup_size_y, p.setup, p.group_segment_size, p.private_segment_size) == (256, 4, 2, 2, 512, 16)
  assert p.header == 2 | 1 << 8 | 2 << 9 | 2 << 11
  assert list(aql.decode_packet(aql.barrier_and_packet((5, 6))).dep_signal) == [5, 6, 0, 0, 0]
  with pytest.raises(ValueError, match="1024"): aql.dispatch_packet(0, 0, (64, 1, 1), (64, 32, 1))
  with pytest.raises(aql.PacketError, match="type 7"): aql.decode_packet(b"\x07" + bytes(63))
  words = sdma.copy_linear(0x10, 0x20, (4 << 20) + 5) + sdma.fence(0x40, 9) + sdma.trap(3)
  got = list(sdma.decode(words))
  assert [x.op for x in got] == ["COPY_LINEAR", "COPY_LINEAR", "FENCE", "TRAP"]
  assert got[1].fields == {"count": 5, "parameter": 0, "src": 0x20 + (4 << 20), "dst": 0x10 + (4 << 20)}
  assert got[2].fields == {"mtype": 3, "address": 0x40, "value": 9} and got[3].fields == {"int_context": 3}
  with pytest.raises(sdma.SDMAError, match="opcode 3"): list(sdma.decode([3]))


# ---------------------------------------------------------------- SDMA

def test_sdma_copy(fake, dev):
  s = dev.sdma_queue(0x1000)
  src, dst = dev.alloc(3 << 20, "gtt"), dev.alloc(3 << 20, "vram")
  data = np.random.default_rng(1).integers(0, 255, 3 << 20, np.uint8)
  src.view()[:] = data.tobytes()
  for _ in range(3): v = s.copy(dst.va, src.va, 3 << 20)  # more than the ring holds: it waits for room and wraps
  s.wait(v)
  assert bytes(dst.view()) == data.tobytes() and s.completed() == v
  assert fake.copies[-1] == (dst.va, src.va, 3 << 20)


# ---------------------------------------------------------------- faults and typed errors

def test_kernarg_size_disagreeing_with_the_descriptor(fake, dev):
  L = Loaded(fake, dev, kernarg_size=24)  # the descriptor says 24 bytes, the kernel's arguments take 32
  kd = aql.KernelDescriptor.from_buffer_copy(bytes(L.code.view(0, 64)))
  with pytest.raises(KFDLaunchError, match="take 32 bytes, its kernel descriptor's kernarg_size is 24"): check_dispatch(kd, L.size, (64, 1, 1))
  q = dev.compute_queue(16)
  v = q.dispatch(L.code.va, L.kernargs.va, (64, 1, 1), (64, 1, 1))  # past the check: what the GPU does with it
  with pytest.raises(KFDHardwareFault, match="reset one engine after a GPU hang") as e: q.wait(v)
  assert "kernarg_size 24" in str(e.value) and "kernarg_size is 24" in fake.error and not e.value.timed_out
  with pytest.raises(KFDHardwareFault): q.dispatch(L.code.va, L.kernargs.va, (64, 1, 1), (64, 1, 1))  # the device stays failed


def test_memory_fault_names_the_address(fake, dev):
  L = Loaded(fake, dev)
  gone = L.bufs[0].va
  ids = (ctypes.c_uint32 * 1)(GPU_ID)
  dev.ioctl(kfd.AMDKFD_IOC_UNMAP_MEMORY_FROM_GPU, kfd.UnmapMemoryFromGpuArgs(L.bufs[0].handle, ctypes.addressof(ids), 1, 0))
  q = dev.compute_queue(16)
  with pytest.raises(KFDMemoryFault, match=f"GPU memory fault at {gone:#x} \\(page not present\\)") as e:
    q.wait(q.dispatch(L.code.va, L.kernargs.va, (1024, 1, 1), (64, 1, 1)))
  assert e.value.va == gone and e.value.not_present and not e.value.read_only
  fake.bos[gone].gpu_mapped = True  # so teardown frees it


def test_corrupted_packet(fake, dev):
  L = Loaded(fake, dev)
  q = dev.compute_queue(16)
  q.timeout = 0.5
  raw = bytearray(aql.dispatch_packet(L.code.va, L.kernargs.va, (64, 1, 1), (64, 1, 1)))
  raw[0] = 7  # no such packet type
  v = q.submit(bytes(raw))
  t = time.monotonic()
  with pytest.raises(KFDPacketError, match=r"packet 0 at the read pointer: packet header 0x1507: type 7 \(not a packet type\)") as e: q.wait(v)
  assert e.value.timed_out and time.monotonic() - t < 3 and q.rptr.value == 0


def test_hang_times_out(fake, dev):
  L = Loaded(fake, dev)
  q = dev.compute_queue(16)
  q.timeout = 0.3
  fake.hang = True
  v = q.dispatch(L.code.va, L.kernargs.va, (64, 1, 1), (64, 1, 1))
  with pytest.raises(KFDTimeout, match=r"did not finish submission 1 within 0\.3 s") as e: q.wait(v)
  assert e.value.timed_out and "read 0 / written 1" in str(e.value) and "KernelDispatchPacket" in str(e.value)
  assert "kernarg_size 32" in str(e.value)  # the report reads the descriptor the stuck dispatch names
  fake.hang = False


def test_doorbell_is_what_publishes(fake, dev):
  L = Loaded(fake, dev, n=64)
  q = dev.compute_queue(16)
  aql.write_packet(q.ring.va, aql.dispatch_packet(L.code.va, L.kernargs.va, (64, 1, 1), (64, 1, 1), completion_signal=q.signal_address))
  q.wptr.value = 1  # the write pointer moved, the doorbell not rung: the packet processor does not look
  time.sleep(0.05)
  assert not fake.dispatches
  q.doorbell.value = 0
  deadline = time.monotonic() + 5
  while q.signal.value != -1 and time.monotonic() < deadline: time.sleep(0.001)
  assert len(fake.dispatches) == 1
