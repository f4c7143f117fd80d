"""The AMD device through the USB interface, end to end on the fake bridge and GPU (amd_usb_fixtures): bring-up over
the bridge's commands to the MEC queue, then plugrt-amd's device on it with the USB copy path (plugrt_amd_usb.gpu
.SRAMPath): kernels rung by doorbell TLPs, host writes as bulk bursts into the bridge's SRAM and a copy kernel from the
SRAM's VMID 8 mapping, reads as a copy kernel into the SRAM and XDATA reads back, TLPs for small and unaligned parts;
what each way costs in bridge commands per MiB."""
from __future__ import annotations

import numpy as np
import pytest
from amd_usb_fixtures import fake_usb_amd

from plugrt import Buffer, dtypes
from plugrt.compiler import samples as K
from plugrt.context import PluginContext
from plugrt.hwqueue import QueueError
from plugrt_amd.runtime import AMDState
from plugrt_amd.toolchain import llvm_tool
from plugrt_amd_pci import mec
from plugrt_amd_pci.driverless import NoDMA
from plugrt_amd_usb import sram
from plugrt_amd_usb.gpu import BULK_MIN, SRAM_VA, USBGPU, SRAMPath, TLPPath

pytestmark = pytest.mark.skipif(llvm_tool(PluginContext.from_process(), "ld.lld") is None, reason="ld.lld is not installed (apt-get install lld)")
MiB = 1 << 20


def clean(fake) -> None:
  assert fake.mec.violations == [] and fake.mec.faults == [] and fake.mp0.violations == [] and fake.gart.violations == []
  assert fake.bridge.sram_violations == []


@pytest.mark.parametrize("gen", [11, 12])
def test_open_runs_kernels_through_the_bridge_and_close_gives_it_back(gen: int) -> None:
  with fake_usb_amd(gen=gen) as (fake, dev):
    st = dev.info.state
    assert isinstance(st, AMDState) and isinstance(st.iface, USBGPU) and isinstance(st.iface.path, SRAMPath)
    assert st.iface.compute.space.gmc == gen
    x = np.arange(1000, dtype=np.float32)
    out, xb = Buffer(dev, 1000, dtypes.float32), Buffer.from_numpy(x, dev)
    prg = dev.program(K.saxpy_kernel())
    rung = len(fake.mec.doorbells.writes)
    prg(out, xb, xb, global_size=(4, 1, 1), local_size=(256, 1, 1), vals=(2.0, 1000), wait=True)
    assert len(fake.mec.doorbells.writes) > rung                  # the doorbell is a TLP into BAR2
    assert np.array_equal(out.numpy(), 3 * x)
    # the SRAM in VMID 8: system pages at bus 0x200000, uncached (MTYPE UC in GMC `gen`'s field), not snooped
    assert fake.mec.vm.translate(SRAM_VA + 0x1234, 8, system=True) == sram.SRAM_BUS + 0x1234 and fake.mec.vm.last_system
    assert fake.mec.vm.last_mtype == 3 and not fake.mec.vm.last_pte & 4
    clean(fake)
  assert st.iface.closed


def test_copies_are_byte_exact_on_both_paths() -> None:
  with fake_usb_amd(env={"PLUGRT_ALLOC_CACHE_MB": "0"}) as (fake, dev):
    path: SRAMPath = dev.info.state.iface.path
    rng = np.random.default_rng(1)
    n = 3 * sram.SRAM_READ_MAX + 1000
    buf = Buffer(dev, n, dtypes.uint8)
    for off, size in ((0, n), (1, n - 3), (3, BULK_MIN + 5), (2, BULK_MIN - 8), (5, 7), (n - 3, 3)):
      data = rng.integers(0, 256, size, dtype=np.uint8)
      before = path.dispatches
      view = buf.view(size, dtypes.uint8, off) if (off, size) != (0, n) else buf
      view.copyin(data)
      back = np.empty(size, np.uint8)
      view.copyout(back)
      assert np.array_equal(back, data), (off, size)
      middle = ((off + size) & ~3) - ((off + 3) & ~3)               # the dword-aligned part (the buffer starts page aligned)
      assert (path.dispatches > before) == (middle >= BULK_MIN), (off, size, path.dispatches - before)
    whole = buf.numpy()                                            # the neighbours of every edge are intact
    assert whole[n - 3:].tolist() == data.tolist()
    clean(fake)


def test_bridge_commands_per_mib_both_ways() -> None:
  """The SRAM path against dword TLPs on the same fake, scaled to 1 MiB (TLPs measured on 16 KiB: linear in size)."""
  with fake_usb_amd(env={"PLUGRT_ALLOC_CACHE_MB": "0"}) as (fake, dev):
    st, b = dev.info.state, fake.bridge
    data = np.random.default_rng(2).integers(-2**31, 2**31, MiB // 4, dtype=np.int32)
    buf = Buffer(dev, MiB // 4, dtypes.int32)
    buf.view(BULK_MIN, dtypes.uint8).copyin(bytes(BULK_MIN))        # the copy kernel loaded (once per device)
    c = b.commands
    buf.copyin(data)
    sram_in = b.commands - c
    c = b.commands
    back = buf.numpy()
    sram_out = b.commands - c
    assert np.array_equal(back, data)
    tlp, at, small = TLPPath(st.iface.regs, st.iface.bridge), buf.handle - mec.VA_BASE, 16 << 10
    c = b.commands
    tlp.write(at, data.tobytes()[:small], "AMD:0")
    tlp_in = (b.commands - c) * (MiB // small)
    c = b.commands
    assert tlp.read(at, small, "AMD:0") == data.tobytes()[:small]
    tlp_out = (b.commands - c) * (MiB // small)
    # measured on the fake: about 3,200 commands in and 400,000 out through the SRAM; 4.2 M each way by TLPs (16 a dword)
    assert sram_in < 4000 and tlp_in > 4_000_000 and sram_out < 450_000 and tlp_out > 4_000_000, (sram_in, sram_out, tlp_in, tlp_out)
    clean(fake)


def test_host_memory_is_refused_over_usb_and_the_hint_names_the_copy_path() -> None:
  with fake_usb_amd() as (_, dev):
    host = np.zeros(16, np.float32)
    with pytest.raises(NoDMA, match="through USB cannot wrap") as e: Buffer.from_blob(host.ctypes.data, 16, dtypes.float32, dev)
    assert "the USB bridge's SRAM window" in e.value.hint and "AMD_IFACE=KFD" in e.value.hint


def test_a_copy_the_queue_never_runs_is_bounded_and_breaks_the_device() -> None:
  """The SRAM path's copy kernel waits like any launch: bounded by PLUGRT_AMD_TIMEOUT, then every copy through the SRAM
  is refused at once (small ones still go by TLPs, which need no queue)."""
  with fake_usb_amd(env={"PLUGRT_AMD_TIMEOUT": "0.05", "PLUGRT_ALLOC_CACHE_MB": "0"}) as (fake, dev):
    buf = Buffer(dev, 4096, dtypes.int32)
    buf.copyin(np.zeros(4096, np.int32))                        # the copy kernel loaded and run once
    fake.mec.queues.clear()                                      # the doorbell reaches nothing: the CP never runs the copy
    with pytest.raises(QueueError, match=r"0\.05 s") as e: buf.copyin(np.ones(4096, np.int32))
    assert e.value.timed_out
    with pytest.raises(QueueError, match="AMD:0: the MEC queue stopped"): buf.numpy()         # the device's wait says it
    with pytest.raises(QueueError, match="cannot copy through the SRAM: the MEC queue stopped"):       # and the path itself
      dev.info.state.iface.path.read(buf.handle - mec.VA_BASE, 4096, "AMD:0")
