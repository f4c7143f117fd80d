"""What the PCI interface raises: each error names what happened and what to do, and carries the step it stopped at.

GSPError derives from plugrt_nv's NVError (a plugrt.hwqueue.QueueError), so a caller of the NV device catches one type
for everything the GPU or its firmware reports; `step` names the boot step, `timed_out` tells a GSP that never
answered from one that answered with an error.
"""
from __future__ import annotations

from plugrt.errors import DeviceUnavailable, PlugrtError, Reason, UnsupportedError
from plugrt_nv.iface import NVError

DEBIAN_PACKAGE = "firmware-nvidia-graphics"
HINT_FIRMWARE = (f"install linux-firmware's NVIDIA files (Debian: apt-get install {DEBIAN_PACKAGE} from non-free-firmware), "
                 "or point PLUGRT_NV_FIRMWARE at a folder that holds nvidia/<chip>/gsp/")


class AcknowledgementRequired(UnsupportedError):
  """Opening would take the GPU from its kernel driver, and PLUGRT_NV_ALLOW_UNBIND=1 was not given."""


class MissingFirmware(DeviceUnavailable):
  """A firmware file the boot needs is not installed; `path` names it, `package` the Debian package that ships it."""

  def __init__(self, path: str, what: str, package: str = DEBIAN_PACKAGE):
    self.path, self.package = path, package
    super().__init__(f"{what} is missing: {path} does not exist", Reason.NO_DEVICE, HINT_FIRMWARE)


class FirmwareError(PlugrtError, ValueError):
  """A firmware file exists but is not what its name promises (truncated, another format, no such section)."""


class GSPError(NVError):
  """The GSP (or a falcon on the way to it) failed a boot step or an RPC: `step` says which; `timed_out` that it never
  answered within the bound (then `reason` says what was last seen), rather than answering with an error."""

  def __init__(self, message: str, hint: str = "", *, step: str = "", reason: str = "", timed_out: bool = False):
    super().__init__(message, hint, reason=reason, timed_out=timed_out)
    self.step = step


class RPCError(GSPError):
  """GSP-RM answered an RPC with an error status: `function` is the RPC, `status` the NV_STATUS (or RPC result) code."""

  def __init__(self, message: str, hint: str = "", *, function: int = 0, status: int = 0, step: str = ""):
    super().__init__(message, hint, step=step)
    self.function, self.status = function, status


class MalformedRPC(GSPError):
  """A message in the GSP's status queue broke the queue's rules (checksum, sequence number, length, header)."""


class NoDMAPath(DeviceUnavailable):
  """Neither host-memory path works for the function: /proc/self/pagemap's physical addresses (refused behind a
  translating IOMMU) nor VFIO (the function not bound to vfio-pci, no IOMMU group, vfio-pci not loaded)."""

  def __init__(self, message: str, hint: str):
    super().__init__(message, Reason.NO_DEVICE, hint)


class VFIOError(DeviceUnavailable):
  """A VFIO step failed: `step` names it (the ioctl or file), `errno` is the kernel's answer (0 when the kernel
  answered but not with what plugrt needs)."""

  def __init__(self, message: str, hint: str = "", *, step: str = "", errno: int = 0):
    self.step, self.errno = step, errno
    super().__init__(message, Reason.NO_DEVICE, hint)


class GroupNotViable(VFIOError):
  """The function's IOMMU group is not viable: `blockers` maps each device of the group that holds it back to its
  driver (every device of a group must be bound to vfio-pci, or to no driver, before VFIO hands the group out)."""

  def __init__(self, group: str, blockers: dict[str, str], hint: str):
    self.group, self.blockers = group, blockers
    named = ", ".join(f"{a} (bound to {d})" for a, d in blockers.items()) or "a device the sysfs tree does not show"
    super().__init__(f"IOMMU group {group} is not viable for VFIO: {named} not bound to vfio-pci", hint, step="VFIO_GROUP_GET_STATUS")
