"""The USB interface's object, `DeviceInfo.iface_object` of an AMD device opened with AMD_IFACE=USB once the bring-up
over the bridge reached the MEC queue: a `plugrt_amd_pci.driverless.DriverlessGPU`, as the PCI interface's `PCIGPU`
is, whose `path` is the copy path that fits a bridge (`SRAMPath`), plus `bridge`.

Host copies over USB (`SRAMPath`, what the DriverlessGPU calls through its HostPath seam). A dword memory TLP costs
16 bridge commands either way (XDATA writes of data, address, type, byte enables, the start, and the status poll),
4.2 million commands per MiB. The bridge's SRAM window (plugrt_amd_usb.sram) takes 512 KiB in 44 commands and the
GPU reaches it at bus 0x200000. The public reference moves bulk data that way with the GPU's SDMA engine (a SCSI
write into the SRAM, SDMA from bus 0x200000 into VRAM; reads back through XDATA 0xF000, 4 KiB at most); plugrt has
no SDMA queue on this path, so it maps the SRAM into its VMID 8 (128 system pages, uncached, at `SRAM_VA`) and
copies with a small kernel on the MEC queue:
- host to VRAM: a bulk burst into the SRAM (at most 512 KiB at a time), then `plugrt_copy32` from the SRAM's VA
  into the buffer;
- VRAM to host: `plugrt_copy32` from the buffer into the SRAM, then XDATA reads of the SRAM's first 4 KiB (255
  bytes a command; the only part of the SRAM the controller reads back), 4 KiB a dispatch.
Each dispatch costs a kernarg block, a packet, the doorbell and the completion polls by TLPs (about 1,500 commands on
the fake), so small transfers, and the unaligned edge bytes of any transfer, go by TLPs (`TLPPath`, 4 commands a
byte); from `BULK_MIN` the SRAM path is the cheaper by a margin. Measured on the fake per MiB (test_amd_usb_device.py):
about 3,200 commands in and 400,000 out through the SRAM, 4.2 million each way by TLPs. Never run on a bridge or a GPU:
tested against the fake bridge, whose GPU side reads and writes the fake SRAM through the fake hub's system-page
translation (plugins/ops_amd/tests, amd_usb_session).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from plugrt.compiler.ir import Kernel, KernelBuilder
from plugrt.hookspecs import DeviceInfo
from plugrt_amd_pci import compute, mec, vm
from plugrt_amd_pci.driverless import DriverlessGPU
from plugrt_amd_pci.regs import GPURegisters
from plugrt_amd_usb import sram
from plugrt_amd_usb.asm24 import ASM24Bridge

SRAM_VA = 1 << 39                      # below plugrt's VRAM mappings (mec.VA_BASE = 2^40): VMID 8's view of the SRAM
SRAM_FLAGS = vm.PTE_SYSTEM | vm.PTE_READABLE | vm.PTE_WRITEABLE      # not snooped: the bridge is no CPU cache
BULK_MIN = 0x400                       # bytes from which the SRAM path costs clearly fewer commands than TLPs (~375 break even)
LOCAL = 256


class TLPPath:
  """Host copies of VRAM by dword memory TLPs through the bridge, byte-exact: the edge dwords of an unaligned range
  are read first and their other bytes kept. `commands()` says what the bridge executed so far, where it counts."""
  where = "memory TLPs through the USB bridge"

  def __init__(self, regs: GPURegisters, bridge: ASM24Bridge):
    self.regs, self.bridge = regs, bridge

  def attach(self, gpu: DriverlessGPU, info: DeviceInfo) -> None: pass
  def read(self, at: int, n: int, label: str) -> bytes: return self.regs.read_vram_bytes(at, n)
  def write(self, at: int, data: bytes | memoryview, label: str) -> None: self.regs.write_vram_bytes(at, data)


def copy_kernel() -> Kernel:
  """out[i] = x[i] for i < n, 32 bits a work-item: the GPU side of SRAMPath (the bits pass unchanged)."""
  from plugrt import dtypes
  b = KernelBuilder("plugrt_copy32")
  out, x = b.buffer("out", dtypes.int32), b.buffer("x", dtypes.int32)
  n = b.scalar("n", dtypes.int32)
  i = b.global_id(0)
  with b.if_(i < n): out[i] = x[i]
  return b.finish()


class SRAMPath(TLPPath):
  """Host copies through the bridge's SRAM and a copy kernel (module docstring); TLPs below BULK_MIN and for edge
  bytes. `attach(gpu, info)` (when the device opens) maps the SRAM into VMID 8; the copy kernel is compiled on first use by
  `compiler(info)` (AMD_LLVM by default; tests pass a compiler that tells the fake MEC the kernel's IR)."""
  where = "the USB bridge's SRAM window and a copy kernel (TLPs for small or unaligned parts)"

  def __init__(self, regs: GPURegisters, bridge: ASM24Bridge):
    super().__init__(regs, bridge)
    self.gpu: DriverlessGPU | None = None
    self.info: Any = None
    self.compiler: Callable[[Any], Any] | None = None
    self.program: tuple[Any, int] | None = None     # (code object, image VA) of plugrt_copy32
    self.dispatches = 0

  def attach(self, gpu: DriverlessGPU, info: DeviceInfo) -> None:
    c = gpu.compute
    c.space.map(SRAM_VA, sram.SRAM_BUS, sram.SRAM_SIZE, SRAM_FLAGS, mtype=vm.MTYPE_UC)
    c.bind()
    self.gpu, self.info = gpu, info

  def _copy(self, dst: int, src: int, dwords: int) -> None:
    """dwords words from VA src to VA dst on the MEC queue, waited for (the caller holds the device's lock)."""
    st = self.gpu
    assert st is not None
    if st.broken: raise mec.QueueError(f"{st.label} cannot copy through the SRAM: {st.broken}", "restart the process (and reset the GPU)")
    if self.program is None:
      if self.compiler is None:
        from plugrt_amd.llvm import AMDLLVMCompiler
        self.compiler = AMDLLVMCompiler
      comp, k = self.compiler(self.info), copy_kernel()
      lib, _ = comp.compile_cached(comp.render(k))
      self.program = compute.load(st.compute, lib)
    co, va = self.program
    groups = (-(-dwords // LOCAL), 1, 1)
    value = compute.launch(st.compute, co, va, "plugrt_copy32", [dst, src], [dwords.to_bytes(4, "little")], groups, (LOCAL, 1, 1))
    self.dispatches += 1
    st.wait(value)

  def _bulk(self, at: int, n: int) -> tuple[int, int]:
    """The dword-aligned middle [lo, hi) of [at, at+n) that goes through the SRAM (empty when too small or not attached)."""
    lo, hi = (at + 3) & ~3, (at + n) & ~3
    return (lo, hi) if self.gpu is not None and hi - lo >= BULK_MIN else (at, at)

  def read(self, at: int, n: int, label: str) -> bytes:
    lo, hi = self._bulk(at, n)
    if lo == hi: return super().read(at, n, label)
    out = bytearray(super().read(at, lo - at, label)) if lo > at else bytearray()
    for pos in range(lo, hi, sram.SRAM_READ_MAX):
      k = min(sram.SRAM_READ_MAX, hi - pos)
      self._copy(SRAM_VA, mec.VA_BASE + pos, k // 4)
      out += sram.sram_read(self.bridge, 0, k)
    if at + n > hi: out += super().read(hi, at + n - hi, label)
    return bytes(out)

  def write(self, at: int, data: bytes | memoryview, label: str) -> None:
    data = memoryview(data).cast("B")
    lo, hi = self._bulk(at, len(data))
    if lo == hi: return super().write(at, data, label)
    if lo > at: super().write(at, data[:lo - at], label)
    for pos in range(lo, hi, sram.SRAM_SIZE):
      k = min(sram.SRAM_SIZE, hi - pos)
      sram.sram_write(self.bridge, bytes(data[pos - at:pos - at + k]))
      self._copy(mec.VA_BASE + pos, SRAM_VA, k // 4)
    if at + len(data) > hi: super().write(hi, data[hi - at:], label)


class USBGPU(DriverlessGPU):
  """One AMD GPU behind an ASM24xx bridge after bring-up: a DriverlessGPU whose host copies go through the bridge
  (`path`, an SRAMPath); `close()` closes the transport plugrt opened (which re-attaches the bridge's kernel driver)
  and is idempotent."""
  name = "USB"
  reaches = "its VRAM and the bridge's SRAM"
  path: SRAMPath

  def __init__(self, label: str, bridge: ASM24Bridge, regs: GPURegisters, bringup: Any, vram_bar_size: int,
               release: Callable[[], None] | None):
    super().__init__(label, regs, bringup, SRAMPath(regs, bridge))
    self.bridge, self.vram_bar_size = bridge, vram_bar_size
    self._release, self._closed = release, False

  @property
  def closed(self) -> bool: return self._closed

  def close(self) -> None:
    if not self._closed:
      self._closed = True
      if self._release is not None: self._release()
