"""What an AMD interface plugin provides: the contract between plugrt-amd's device code and a way of reaching the GPU.

An interface plugin (plugrt-amd-kfd through the amdgpu kernel driver; plugrt-amd-pci and plugrt-amd-usb, which bring
the GPU up without one) returns a `GPUInterface` from `plugrt_open_interface`. The device code (plugrt_amd.runtime:
one device state, one allocator, one HCQ program for every interface) needs only what is here. What the interfaces
do differently is theirs to supply: where memory comes from and how the host reaches it (KFD: GTT staging and SDMA
copies; PCI: CPU copies through the VRAM BAR; USB: the bridge's SRAM and a copy kernel), and how a dispatch is
queued (KFD: kernarg blocks in GTT and KFD's AQL queue; PCI and USB: kernarg blocks in VRAM and plugrt's own queue on
the MEC). The command encoding both share, the AQL dispatch packet and the kernarg segment, is plugrt-amd's
(plugrt_amd.aql, plugrt_amd.codeobject).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from plugrt.hookspecs import DeviceInfo
from plugrt_amd.codeobject import CodeObject, KernelInfo


@dataclass
class Mem:
  """GPU memory at virtual address `va` (`size` bytes), as the interface allocated it."""
  va: int
  size: int
  private: Any = field(default=None, repr=False)  # the interface's own record of it


class GPUInterface:
  """An AMD GPU opened through some interface. Subclasses fill these in when they open and implement the methods;
  every method that submits or copies is called with `lock` (given by `start`) held or takes it itself, as its
  docstring says."""
  name = "?"              # the interface: "KFD", "PCI", "USB"
  label = "AMD:0"         # how errors name the device
  arch = ""               # the GPU's arch ("gfx1100"), where the interface knows it
  max_lds = 65536         # bytes of LDS (shared memory) a workgroup may use
  kernarg_bytes = 4096    # the largest kernarg segment one dispatch takes
  wraps = False           # wrap() takes external memory at its own address (from_blob); False: wrap() refuses
  dlpack_type: int | None = None  # DLPack device type of this memory (10: kDLROCM); None: not shared through DLPack
  copy_path = ""          # how host copies travel, for messages ("GTT staging and SDMA", "the VRAM BAR", ...)

  def start(self, lock: Any, timeout: float, info: DeviceInfo) -> None:
    """Make what the device runs on (queues, kernarg blocks, copy paths), once, when the device opens. `lock` is the
    device's: held around everything that writes submission state; `timeout` bounds every wait (PLUGRT_AMD_TIMEOUT)."""
    raise NotImplementedError

  @property
  def broken(self) -> str:
    """Why the GPU runs nothing more ("" while it does): a fault, a queue that stopped, the interface closed."""
    raise NotImplementedError

  # ------------------------------------------------------------ memory
  def alloc(self, size: int) -> Mem:
    """`size` bytes of device memory for a buffer, at a GPU address; MemoryError when the device is full."""
    raise NotImplementedError

  def free(self, mem: Mem) -> None:
    """Give memory back (a buffer or a loaded program; the device made sure the GPU is done with it)."""
    raise NotImplementedError

  def copyin(self, va: int, src: memoryview) -> None:
    """Host -> device: `src`'s bytes to GPU address `va`, after the work queued before; the data has landed on return."""
    raise NotImplementedError

  def copyout(self, dest: memoryview, va: int) -> None:
    """Device -> host: dest.nbytes bytes at GPU address `va`, once the work queued before is done."""
    raise NotImplementedError

  def copy(self, dest: int, src: int, nbytes: int) -> None:
    """Device to device on this GPU, ordered after the work queued before (the ranges may overlap)."""
    raise NotImplementedError

  def wrap(self, ptr: int, nbytes: int) -> int:
    """External memory at `ptr` as a buffer's GPU address (never a copy); an UnsupportedError saying why not otherwise
    (where `wraps` is False, always)."""
    raise NotImplementedError

  # ------------------------------------------------------------ programs and dispatch
  def load(self, code: CodeObject) -> Mem:
    """Place a code object where the GPU executes it: its image, relocated to the returned memory's `va`."""
    raise NotImplementedError

  def check_program(self, info: KernelInfo, name: str) -> None:
    """Refuse (a LaunchError) a kernel whose descriptor disagrees with its code object or with this GPU (kernarg
    size, LDS), once per program."""
    raise NotImplementedError

  def ensure_scratch(self, private_segment_size: int) -> None:
    """Give the queue scratch (the private segment) for `private_segment_size` bytes per work-item, once per program
    that needs it (called with the lock held)."""
    raise NotImplementedError

  def prepare(self, kernel_object: int, grid: tuple[int, int, int], workgroup: tuple[int, int, int], group_segment_size: int,
              private_segment_size: int, needs_scratch: bool) -> Any:
    """A dispatch of the kernel whose descriptor is at `kernel_object` (grid and workgroup in work-items; the kernel
    uses the queue's scratch when `needs_scratch`), kept for `dispatch`: built once per prepared launch, never changed
    after."""
    raise NotImplementedError

  def dispatch(self, prepared: Any, kernargs: int, size: int, name: str) -> int:
    """The launch: the `size` kernarg bytes at host address `kernargs` into a kernarg block the GPU is done with, the
    prepared dispatch onto the queue; returns the timeline value that says it finished (called with the lock held).
    A broken GPU is refused with the interface's QueueError naming program `name`."""
    raise NotImplementedError

  # ------------------------------------------------------------ the timeline
  def wait(self, value: int) -> None:
    """Until the dispatch whose timeline value is `value` finished (bounded; a fault or a timeout is the interface's
    plugrt.hwqueue.QueueError, and breaks the GPU)."""
    raise NotImplementedError

  def synchronize(self) -> None:
    """Until everything queued finished (called with the lock held)."""
    raise NotImplementedError

  def clear_timestamps(self) -> None:
    """Before a timed launch: forget the last dispatch's GPU timestamps."""

  def gpu_seconds(self) -> float | None:
    """The last finished dispatch's duration by the GPU's clock; None where the GPU wrote none."""
    return None

  def close(self) -> None:
    """Give the GPU back (idempotent)."""
