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
