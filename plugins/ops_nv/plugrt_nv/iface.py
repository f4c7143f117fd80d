"""What an NV interface plugin provides: the contract between plugrt-nv's device code and a way of reaching the GPU.

An interface plugin (plugrt-nv-nvk through the kernel driver; plugrt-nv-pci, which would drive the GPU without
one) returns a `GPUInterface` from `plugrt_open_interface`. The device code (device.py) needs only what is here:
memory at one address for the CPU and the GPU, a compute and a copy channel with a doorbell, the GPU's classes
and sizes, and the driver's account of a fault. Everything per launch then happens in user space.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from plugrt.hwqueue import QueueError
from plugrt_nv import hw


class NVError(QueueError):
  """The GPU or its driver reported an error: a refused call, a channel fault, work that did not finish in time
  (then `reason`, `value` and `timed_out` say more: see plugrt.hwqueue.QueueError)."""


@dataclass
class Mem:
  """GPU memory at virtual address `va`; for kinds "mapped" and "host" the CPU sees it at the same address."""
  va: int
  size: int
  kind: str                 # "device" (GPU only), "mapped" (GPU memory the CPU writes, write-combined), "host" (CPU memory the GPU reads and writes)
  private: Any = field(default=None, repr=False)  # the interface's own bookkeeping


@dataclass
class Channel:
  """A GPFIFO channel: its ring of entries and control area (USERD), both CPU-mapped, and the doorbell token."""
  name: str
  ring: int        # CPU (= GPU) address of the ring: `entries` 8-byte GPFIFO entries
  entries: int
  userd: int       # CPU address of the control area: GP_PUT at +0x8C, GP_GET at +0x88
  token: int       # written to the doorbell after GP_PUT moves


class GPUInterface:
  """A GPU opened through some interface. Subclasses fill these in when they open."""
  name = "?"
  classes: hw.Classes
  sm_version = 0
  gr: dict[str, int]      # gpcs, tpc_per_gpc, sm_per_tpc, warps_per_sm, sms
  doorbell = 0            # CPU address of the 32-bit doorbell register
  description = ""
  bus_id = ""             # PCI location "0000:18:00.0", where the interface knows it

  @property
  def arch(self) -> str: return hw.arch_of(self.sm_version)

  def alloc(self, size: int, kind: str = "device") -> Mem:
    """Memory of `kind` (see Mem), at a GPU address below 2^40; raises MemoryError when the device is full."""
    raise NotImplementedError

  def free(self, mem: Mem) -> None: raise NotImplementedError

  def channels(self, entries: int) -> tuple[Channel, Channel]:
    """A compute and a copy channel of `entries` ring entries each, scheduled and ready for commands."""
    raise NotImplementedError

  def video_channel(self, entries: int) -> Channel:
    """A channel of `entries` ring entries on the first video decode engine (NVDEC0), with the video decoder
    object (classes.video) bound to it, ready for commands; NVError when this GPU or interface has none."""
    raise NVError(f"the {self.name} interface does not open video decode channels")

  def fault(self, deep: bool = False) -> str:
    """What the driver says went wrong on the channels ("" when it reports nothing). Cheap unless `deep`, which
    also asks the driver for the SMs' and the MMU's error state (for the report after a fault or a timeout)."""
    return ""

  def peer_access(self, other: GPUInterface) -> str:
    """Let this GPU and `other` (another GPU of this process) map each other's memory: "" once they may (asked of the
    driver once per pair), else why not (copies between them are then staged through host memory)."""
    return f"the {self.name} interface maps no memory between GPUs"

  def map_peer(self, mem: Mem, other: GPUInterface) -> None:
    """Map `mem`, this GPU's memory, at its own address into `other`'s VA space as well (after peer_access allowed
    it, for video memory; host memory needs no peer access). Once per (mem, other): a repeat does nothing. Freeing
    `mem` removes the other GPU's mapping too. NVError when the driver refuses."""
    raise NVError(self.peer_access(other))

  def close(self) -> None: pass
