"""The AMD device through the PCI interface, end to end on the fake GPU (amd_pci_fixtures): the function taken from
amdgpu for the device's life and given back on close, VRAM allocations mapped into VMID 8 and unmapped when freed
(their range reused), CPU copies through the VRAM BAR, code objects from AMD_LLVM launched on the MEC queue, and what
the PCI path refuses (host memory: no DMA; host access beyond a small BAR), each typed; then the
conformance suite on that path."""
from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np
import pytest
from amd_pci_fixtures import FakePCIGPU, env_for, fake_pci_amd, fake_pci_plugins
from fake_amdq import Fault

from plugrt import Buffer, dtypes
from plugrt.compiler import samples as K
from plugrt.compiler.ir import KernelBuilder
from plugrt.context import PluginContext
from plugrt.errors import EnvError, LaunchError
from plugrt.hwqueue import QueueError
from plugrt.registry import isolated
from plugrt_amd.runtime import AMDAllocator, AMDProgram, AMDState
from plugrt_amd.toolchain import llvm_tool
from plugrt_amd_pci import mec
from plugrt_amd_pci.driverless import BARTooSmall, NoDMA, check_descriptor
from plugrt_amd_pci.gpu import PCIGPU
from plugrt_testing.conformance import ConformanceSuite

pytestmark = pytest.mark.skipif(llvm_tool(PluginContext.from_process(), "ld.lld") is None, reason="ld.lld is not installed (apt-get install lld)")
ADDR = "0000:03:00.0"


def copy_kernel() -> Any:
  b = KernelBuilder("copy")
  out, x = b.buffer("out", dtypes.int32), b.buffer("x", dtypes.int32)
  n = b.scalar("n", dtypes.int32)
  i = b.global_id(0)
  with b.if_(i < n): out[i] = x[i] + 1
  return b.finish()


def test_open_runs_kernels_and_close_gives_the_gpu_back() -> None:
  with fake_pci_amd() as (fake, dev):
    assert isinstance(dev.info.state, AMDState) and isinstance(dev.allocator, AMDAllocator) and isinstance(dev.info.state.iface, PCIGPU)
    assert [w for w, _ in fake.kernel.log] == [f"devices/{ADDR}/driver/unbind", f"devices/{ADDR}/enable"]
    assert not os.path.lexists(os.path.join(fake.devices, ADDR, "driver"))          # amdgpu stays unbound while open
    prg = dev.program(K.saxpy_kernel())
    assert isinstance(prg, AMDProgram)
    x = np.arange(1000, dtype=np.float32)
    out, xb = Buffer(dev, 1000, dtypes.float32), Buffer.from_numpy(x, dev)
    t = prg(out, xb, xb, global_size=(4, 1, 1), local_size=(256, 1, 1), vals=(2.0, 1000), wait=True)
    assert t is not None and t > 0 and np.array_equal(out.numpy(), 3 * x)
    p = fake.mec.dispatches[-1]
    assert p.kernel_object == prg.mem.va + prg.info.kd_offset and fake.mec.vm.translate(p.kernel_object, 8, access="x") >= 0
    assert fake.mec.violations == [] and fake.mec.faults == []
  assert [w for w, _ in fake.kernel.log][2:] == [f"devices/{ADDR}/enable", "drivers/amdgpu/bind"]   # disabled, bound back


def test_the_rdna4_board_is_the_same_device_on_gmc12_page_tables() -> None:
  """gen=12: GC 12.0.0, MP0 14.0.2, MMHUB 4.1.0, NBIF 6.3.1. The device's buffers live in GMC 12 page tables (MTYPE at
  bits 54-55; a GMC 11 PTE would fault in the fake's GMC 12 hub) and its kernels run on the MEC queue."""
  with fake_pci_amd(gen=12) as (fake, dev):
    st = dev.info.state
    assert isinstance(st, AMDState) and st.iface.compute.space.gmc == 12 and fake.regs.gmc == 12
    assert fake.mp0.version == (14, 0, 2)
    prg = dev.program(copy_kernel())
    x = np.arange(-500, 500, dtype=np.int32)
    out, xb = Buffer(dev, 1000, dtypes.int32), Buffer.from_numpy(x, dev)
    prg(out, xb, global_size=(4, 1, 1), local_size=(256, 1, 1), vals=(1000,), wait=True)
    assert np.array_equal(out.numpy(), x + 1)
    pte = fake.mec.vm.translate(out.handle, 8)
    assert pte >= 0 and fake.mec.vm.last_pte >> 48 & 0x3F == 0          # nothing in GMC 11's MTYPE field
    assert fake.mec.violations == [] and fake.mec.faults == [] and fake.mp0.violations == []


def test_freed_vram_is_unmapped_and_reused() -> None:
  with fake_pci_amd(env={"PLUGRT_ALLOC_CACHE_MB": "0"}) as (fake, dev):
    c = dev.info.state.iface.compute
    a = Buffer(dev, 3 << 20, dtypes.uint8)                     # 3 MiB: 2 MiB aligned
    va = a.handle
    assert fake.mec.vm.translate(va + 5, 8) == va - mec.VA_BASE + 5
    fence = Buffer(dev, 3 << 20, dtypes.uint8)                 # above it: its range cannot merge back into the heap's top
    del a
    with pytest.raises(Fault, match="PTE not valid"): fake.mec.vm.translate(va, 8)   # unmapped, and the TLB flushed
    at = va - mec.VA_BASE
    assert any(h <= at and at + (3 << 20) <= h + n for h, n in c.holes) and fence.handle > va
    top = c.heap
    b = Buffer(dev, 3 << 20, dtypes.uint8)                     # the freed range again (2 MiB aligned), the heap's top unchanged
    assert b.handle == va and c.heap == top
    b.copyin(np.full(3 << 20, 7, np.uint8))
    assert fake.mec.vm.read(va + 12345, 1, 8) == b"\x07"


def test_a_full_page_table_pool_is_out_of_memory_and_changes_nothing() -> None:
  from plugrt.errors import OutOfMemoryError
  with fake_pci_amd(env={"PLUGRT_ALLOC_CACHE_MB": "0"}) as (fake, dev):
    c = dev.info.state.iface.compute
    c.space.pool_end = c.space.next                               # no page table left
    heap, holes, mapped = c.heap, list(c.holes), list(c.space.mapped)
    with pytest.raises(OutOfMemoryError, match="no page table left"): Buffer(dev, 8 << 20, dtypes.uint8)
    assert (c.heap, c.holes, c.space.mapped) == (heap, holes, mapped)
    with pytest.raises(Fault, match="not valid"): fake.mec.vm.translate(mec.VA_BASE + heap, 8)


def test_copies_are_byte_exact_through_the_bar() -> None:
  with fake_pci_amd() as (_, dev):
    x = np.arange(4099, dtype=np.uint8)
    b = Buffer(dev, x.size, dtypes.uint8).copyin(x)
    b.view(3, offset=5).copyin(np.array([200, 201, 202], np.uint8))   # not dword aligned: its neighbours untouched
    want = x.copy(); want[5:8] = [200, 201, 202]
    assert np.array_equal(b.numpy(), want) and np.array_equal(b.view(7, offset=1).numpy(), want[1:8])
    c = Buffer(dev, x.size, dtypes.uint8)
    b.copy_to(c)                                                # device to device: a CPU copy through the BAR
    assert np.array_equal(c.numpy(), want)


def test_host_memory_is_refused_without_dma() -> None:
  with fake_pci_amd() as (_, dev):
    host = np.zeros(16, np.float32)
    with pytest.raises(NoDMA, match="no DMA") as e: Buffer.from_blob(host.ctypes.data, 16, dtypes.float32, dev)
    assert "Buffer.copyin" in e.value.hint and "AMD_IFACE=KFD" in e.value.hint


def test_a_small_bar_refuses_host_access_beyond_it_and_kernels_still_use_that_vram() -> None:
  with fake_pci_amd(bar0_mib=32, env={"PLUGRT_ALLOC_CACHE_MB": "0"}) as (_, dev):
    st = dev.info.state
    assert st.iface.path.size == 32 << 20
    n = 1 << 20
    near = Buffer(dev, n, dtypes.int32).copyin(np.arange(n, dtype=np.int32))     # inside the BAR
    pad = Buffer(dev, (32 << 20) - (near.handle - mec.VA_BASE), dtypes.uint8)      # pushes the next one past 32 MiB
    far, back = Buffer(dev, n, dtypes.int32), Buffer(dev, n, dtypes.int32)
    assert far.handle - mec.VA_BASE >= 32 << 20
    with pytest.raises(BARTooSmall, match=r"the first 32 MiB of VRAM") as e: far.copyin(np.zeros(n, np.int32))
    assert "Resizable BAR" in e.value.hint
    with pytest.raises(BARTooSmall): far.numpy()
    prg = dev.program(copy_kernel())
    prg(far, near, global_size=(n // 256, 1, 1), local_size=(256, 1, 1), vals=(n,))
    if back.handle - mec.VA_BASE + 4 * n > st.iface.path.size: back = near                      # a host-visible one to read it through
    prg(back, far, global_size=(n // 256, 1, 1), local_size=(256, 1, 1), vals=(n,), wait=True)
    assert np.array_equal(back.numpy(), np.arange(n, dtype=np.int32) + 2) and pad.handle


def test_a_queue_that_stops_is_a_bounded_typed_error_and_breaks_the_device() -> None:
  with fake_pci_amd(env={"PLUGRT_AMD_TIMEOUT": "0.05"}) as (fake, dev):
    prg = dev.program(copy_kernel())
    a = Buffer(dev, 256, dtypes.int32)
    prg(a, a, global_size=(1, 1, 1), local_size=(256, 1, 1), vals=(256,), wait=True)
    fake.mec.queues.clear()                                     # the doorbell reaches nothing: the CP never runs the packet
    with pytest.raises(mec.QueueError, match=r"0\.05 s") as e: prg(a, a, global_size=(1, 1, 1), local_size=(256, 1, 1), vals=(256,), wait=True)
    assert isinstance(e.value, QueueError) and e.value.timed_out
    with pytest.raises(QueueError, match="cannot run copy: the MEC queue stopped"):
      prg(a, a, global_size=(1, 1, 1), local_size=(256, 1, 1), vals=(256,))
  assert [w for w, _ in fake.kernel.log][-1] == "drivers/amdgpu/bind"   # still given back


def test_launch_checks_as_the_kfd_path() -> None:
  with fake_pci_amd() as (_, dev):
    prg = dev.program(copy_kernel())
    a = Buffer(dev, 4, dtypes.int32)
    with pytest.raises(TypeError, match="takes 1 scalar"): prg(a, a, global_size=(1, 1, 1), local_size=(4, 1, 1))
    with pytest.raises(LaunchError): prg(a, a, global_size=(1, 1, 1), local_size=(2048, 1, 1), vals=(4,))
    with pytest.raises(LaunchError, match="kernarg_size"): check_descriptor(dataclasses.replace(prg.info, kernarg_size=8), "copy", 65536)
    assert check_descriptor(dataclasses.replace(prg.info, private_segment_size=16), "copy", 65536) is None  # scratch: the queue's


def test_an_open_that_fails_after_bring_up_gives_the_gpu_back() -> None:
  fake = FakePCIGPU()
  try:
    with isolated(fake_pci_plugins(fake), env=env_for(fake, {"PLUGRT_AMD_TIMEOUT": "soon"})) as reg:
      with pytest.raises(EnvError, match="PLUGRT_AMD_TIMEOUT"): reg.open("AMD")
    assert [w for w, _ in fake.kernel.log][-1] == "drivers/amdgpu/bind"
  finally: fake.shutdown()


class _OnInstances:
  """The device's name on a test instance, "" on the class (as test_amd_fake's: the process's registry has no AMD)."""
  def __get__(self, obj: Any, cls: Any) -> str: return "AMD" if obj is not None else ""


class TestAMDPCIConformance(ConformanceSuite):
  device = _OnInstances()  # type: ignore[assignment]

  @pytest.fixture(params=["LLVM"])
  def compiler(self, request: pytest.FixtureRequest) -> str: return request.param

  @pytest.fixture
  def dev(self, compiler: str) -> Any:
    with fake_pci_amd() as (_, dev): yield dev

  def test_fuzz(self) -> None:  # type: ignore[override]
    pytest.skip("plugrt's pytest plugin parametrizes fuzz seeds only for a suite whose class names a device of the process's "
                "registry, which has no AMD GPU")
