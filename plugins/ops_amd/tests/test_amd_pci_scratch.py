"""The PCI device's scratch (private segment) and GPU timestamps, on the fake GPU: a kernel whose private array LLVM
keeps in scratch (test_amd_queue_features' kernel) gets the MEC queue's scratch in VRAM mapped in VMID 8, described
in its amd_queue_t, which the fake MEC checks per dispatch as the fake KFD does; a larger need grows it, one that
cannot fit is a typed error; `wait=True` returns the completion signal's start_ts/end_ts."""
from __future__ import annotations

import numpy as np
import pytest
from amd_pci_fixtures import fake_pci_amd
from test_amd_queue_features import pick_kernel, pick_llvm_ir

from plugrt import Buffer, dtypes
from plugrt.compiler import samples as K
from plugrt.context import PluginContext
from plugrt.errors import UnsupportedError
from plugrt.hwqueue import QueueError
from plugrt_amd import aql
from plugrt_amd.toolchain import llvm_tool
from plugrt_amd_pci import mec, scratch, vm

pytestmark = pytest.mark.skipif(llvm_tool(PluginContext.from_process(), "ld.lld") is None, reason="ld.lld is not installed (apt-get install lld)")


def load_pick(fake, dev):
  k = pick_kernel()
  lib = dev.compiler.compile(pick_llvm_ir(dev.compiler.render(k)))
  fake.register(lib, k)
  return dev.load(k.name, lib, k.signature)


def run_pick(dev, prg, seed: int = 0) -> np.ndarray:
  x = (np.arange(-300, 724, dtype=np.int32) + seed) * 977
  out, xb = Buffer(dev, x.size, dtypes.int32), Buffer.from_numpy(x, dev)
  prg(out, xb, global_size=(8, 1, 1), local_size=(128, 1, 1), wait=True)
  assert np.array_equal(out.numpy(), x + (x & 63) * 7)
  return x


@pytest.mark.parametrize("gen", [11, 12])
def test_a_kernel_with_a_private_array_runs_on_the_pci_queue_with_its_scratch(gen: int) -> None:
  with fake_pci_amd(gen=gen) as (fake, dev):
    c = dev.info.state.iface.compute
    assert c.scratch is None                       # none until a kernel needs it
    prg = load_pick(fake, dev)
    need = prg.info.private_segment_size
    assert need >= 256 and prg.info.descriptor.private_segment_fixed_size == need
    va, size = c.scratch
    d = scratch.read_desc(c.queue)
    per_item = aql.scratch_per_item(need, gen)
    assert (d.scratch_backing_memory_location, d.scratch_backing_memory_byte_size, d.scratch_wave64_lane_byte_size) == (va, size, per_item)
    assert size == per_item * 64 * scratch.SLOTS_PER_CU * scratch.cu_count(c.gc) and scratch.cu_count(c.gc) == 96  # 6 SEs x 2 SAs x 4 WGPs x 2
    waves, wave_bytes = aql.tmpring_fields(d.compute_tmpring_size, gen)
    assert c.major == gen and wave_bytes == 64 * per_item and 0 < waves and waves * wave_bytes <= size
    assert list(d.scratch_resource_descriptor)[:3] == [va & 0xFFFFFFFF, (va >> 32) | 1 << 30, size]
    assert (va, va - mec.VA_BASE, size) in c.allocations                # VRAM of plugrt's heap, mapped in VMID 8
    fake.mec.vm.translate(va + size - 1, mec.VMID, access="w")
    run_pick(dev, prg)
    assert fake.mec.dispatches[-1].private_segment_size == need and fake.mec.scratch_checked == 1 and fake.mec.faults == []
    # the scratch gone from amd_queue_t: the fake CP stops the queue, and the device reports it (typed, bounded)
    scratch.describe(c.queue, 0, 0, 0, gen, 1, 1)
    dev.info.state.iface.timeout = 0.2
    with pytest.raises(QueueError): run_pick(dev, prg)
    assert "needs" in fake.mec.faults[-1] and "scratch" in fake.mec.faults[-1]


def test_more_scratch_than_the_queue_has_grows_it_and_too_much_is_a_typed_error() -> None:
  with fake_pci_amd() as (fake, dev):
    c = dev.info.state.iface.compute
    prg = load_pick(fake, dev)
    run_pick(dev, prg)
    old, per_item = c.scratch, c.scratch_per_item
    scratch.ensure(c, per_item)                   # enough already: kept
    assert c.scratch == old
    scratch.ensure(c, 2 * per_item)               # a kernel needing more: the queue idle, a larger scratch replaces it
    assert c.scratch_per_item == 2 * per_item and c.scratch[1] > old[1]
    assert scratch.read_desc(c.queue).scratch_backing_memory_location == c.scratch[0]
    assert not any(a == old[0] for a, _, _ in c.allocations) or c.scratch[0] == old[0]   # the old one freed (its range reusable)
    run_pick(dev, prg, seed=5)
    assert fake.mec.faults == []
    with pytest.raises(UnsupportedError, match="COMPUTE_TMPRING_SIZE"): scratch.ensure(c, 1 << 20)   # one wave's slice over WAVESIZE


def test_scratch_in_a_small_heap_takes_fewer_waves_and_too_much_is_a_typed_error() -> None:
  with fake_pci_amd(vram_mib=48) as (fake, dev):
    c = dev.info.state.iface.compute
    prg = load_pick(fake, dev)
    full = c.scratch_per_item * 64 * scratch.SLOTS_PER_CU * scratch.cu_count(c.gc)
    assert full > c.heap_end - c.heap and c.scratch[1] < full     # the topology's size does not fit: fewer waves, still correct
    waves, _ = aql.tmpring_fields(scratch.read_desc(c.queue).compute_tmpring_size, 11)
    assert waves * c.scratch_per_item * 64 * c.gc.num_se <= c.scratch[1]
    run_pick(dev, prg)
    with pytest.raises(vm.VMError, match="one wave per shader engine"): scratch.ensure(c, 100 << 10)
    assert c.scratch is None and scratch.read_desc(c.queue).scratch_backing_memory_location == 0
    run_pick(dev, prg, seed=9)                    # the next launch makes it again
    assert c.scratch is not None and fake.mec.faults == []


def test_wait_returns_the_gpus_own_time_on_the_pci_queue() -> None:
  with fake_pci_amd() as (fake, dev):
    q = dev.info.state.iface.queue
    d = scratch.read_desc(q)
    assert d.queue_properties & aql.AMD_QUEUE_PROPERTIES_ENABLE_PROFILING and d.private_segment_aperture_base_hi == 2 << 16
    n = 256
    x = Buffer.from_numpy(np.ones(n, np.float32), dev)
    prg = dev.program(K.saxpy_kernel())
    t = prg(x, x, x, global_size=(1, 1, 1), local_size=(n, 1, 1), vals=(1.0, n), wait=True)
    start, end = fake.mec.profiled[-1]
    assert end > start and t == (end - start) / mec.TIMESTAMP_HZ
    assert prg(x, x, x, global_size=(1, 1, 1), local_size=(n, 1, 1), vals=(1.0, n)) is None
    # profiling off in amd_queue_t: the CP writes no timestamps, and wait=True falls back to the host's clock
    at = q.lay.at + mec.PTRS_OFF + aql.AmdQueue.queue_properties.offset
    dev.info.state.iface.regs.write_vram(at, aql.AMD_QUEUE_PROPERTIES_IS_PTR64.to_bytes(4, "little"))
    n_profiled = len(fake.mec.profiled)
    t2 = prg(x, x, x, global_size=(1, 1, 1), local_size=(n, 1, 1), vals=(1.0, n), wait=True)
    assert len(fake.mec.profiled) == n_profiled and q.gpu_seconds() is None and isinstance(t2, float) and t2 > 0


def test_the_usb_device_gets_scratch_and_gpu_time_too() -> None:
  """The USB interface's device is the same device on the same queue: its scratch and timestamps through the bridge."""
  from amd_usb_fixtures import fake_usb_amd
  with fake_usb_amd() as (fake, dev):
    c = dev.info.state.iface.compute
    prg = load_pick(fake, dev)
    assert c.scratch is not None and scratch.read_desc(c.queue).scratch_backing_memory_location == c.scratch[0]
    x = np.arange(256, dtype=np.int32) * 31
    out, xb = Buffer(dev, x.size, dtypes.int32), Buffer.from_numpy(x, dev)
    n = len(fake.mec.profiled)
    t = prg(out, xb, global_size=(2, 1, 1), local_size=(128, 1, 1), wait=True)
    assert fake.mec.dispatches[-1].kernel_object == prg.mem.va + prg.info.kd_offset and len(fake.mec.profiled) == n + 1
    start, end = fake.mec.profiled[-1]
    assert t == (end - start) / mec.TIMESTAMP_HZ
    assert np.array_equal(out.numpy(), x + (x & 63) * 7) and fake.mec.scratch_checked >= 1 and fake.mec.faults == []
