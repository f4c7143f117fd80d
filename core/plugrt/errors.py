"""Typed errors. Every error names the problem and the fix.

Each class also derives from the builtin exception a caller would naturally catch
(ValueError for bad names, TypeError for bad arguments, MemoryError for
out-of-memory), so code that does not know plugrt still handles them sensibly.
"""
from __future__ import annotations

import enum
from collections.abc import Iterable


class Reason(enum.Enum):
  """Why a backend is unavailable. Each has a default fix hint."""
  NOT_INSTALLED = "not installed"
  IMPORT_ERROR = "import error"
  HOOK_ERROR = "hook error"
  INCOMPATIBLE_API = "incompatible plugin API"
  NAME_CONFLICT = "name claimed twice"
  DISABLED = "disabled by environment"
  NO_DEVICE = "no device"
  MISSING_TOOLCHAIN = "missing toolchain"
  OPEN_FAILED = "open failed"
  TIMED_OUT = "timed out"         # a plugin's import, probe or open ran past its time limit (PLUGRT_PROBE_TIMEOUT, PLUGRT_OPEN_TIMEOUT)
  BAD_NAME = "invalid name"       # a plugin declared a device, compiler, interface or alias name the grammar cannot hold


class PlugrtError(Exception):
  """Base of every plugrt error."""
  def __init__(self, message: str, hint: str = ""):
    super().__init__(message + (f" (fix: {hint})" if hint else ""))
    self.message, self.hint = message, hint


class EnvError(PlugrtError, ValueError):
  """An environment variable has a value plugrt cannot use."""


class UnknownDeviceError(PlugrtError, ValueError):
  """A device, compiler or interface name that no installed backend declares."""


class ConflictError(PlugrtError, ValueError):
  """Two requests (environment variables, or two plugins) contradict each other."""


class DeviceUnavailable(PlugrtError, RuntimeError):
  """A device the user asked for cannot be used; `reason` says why."""
  def __init__(self, message: str, reason: Reason, hint: str = "", available: Iterable[str] | None = None):
    self.reason, self.available = reason, None if available is None else tuple(available)
    listed = "" if self.available is None else f"; available: {', '.join(self.available)}" if self.available else "; no other device is available"
    super().__init__(f"{message} [{reason.value}]{listed}", hint)


class CompileError(PlugrtError, RuntimeError):
  """A compiler rejected a kernel; `log` holds what it printed."""
  def __init__(self, message: str, log: str = "", hint: str = ""):
    self.log = log
    super().__init__(message + (f"\n{log.strip()}" if log.strip() else ""), hint)


class IRError(PlugrtError, ValueError):
  """A kernel's IR is malformed (bad types, scoping, unbalanced control flow)."""


class UnsupportedError(PlugrtError, NotImplementedError):
  """The device or backend cannot do what was asked (wrap external memory, say)."""


class RenderError(UnsupportedError):
  """A renderer cannot express part of a kernel on its device (an unsupported dtype, say)."""


class LaunchError(PlugrtError, ValueError):
  """A launch asks for more than its device runs: too many groups or threads along an axis, or per group."""


class ImageError(PlugrtError, ValueError):
  """An image dtype that cannot be: a bad (height, width), a texel type images do not hold, or a size past the device's
  largest image."""


class OutOfMemoryError(PlugrtError, MemoryError):
  """A device allocation failed even after the allocator's cache was freed."""


class PluginError(PlugrtError, RuntimeError):
  """A plugin broke its contract while being used (not while being discovered)."""


def did_you_mean(name: str, known: Iterable[str]) -> str:
  """' (did you mean X?)' for the closest known name, or ''."""
  import difflib
  known = list(known)
  close = difflib.get_close_matches(name.upper(), [k.upper() for k in known], n=1, cutoff=0.6)
  if not close: return ""
  return f" (did you mean {next(k for k in known if k.upper() == close[0])}?)"


class VideoStreamError(PlugrtError, ValueError):
  """A video byte stream is malformed or truncated; `offset` is the byte in the stream where the problem is."""
  def __init__(self, message: str, offset: int, hint: str = ""):
    self.offset = offset
    super().__init__(f"{message} (at byte {offset})", hint)


class VideoDecoderUnavailable(PlugrtError, RuntimeError):
  """No video decoder can decode this stream here; `reason` (a Reason) and `reasons` (decoder -> why) say why."""
  def __init__(self, message: str, reason: Reason, hint: str = "", reasons: dict[str, str] | None = None):
    self.reason, self.reasons = reason, dict(reasons or {})
    super().__init__(f"{message} [{reason.value}]", hint)


class StagedCopyWarning(UserWarning):
  """A copy between two devices of one backend went through host memory instead of device to device (peer): said
  once per pair of devices and direction, with how it travels and why (Allocator.peer_path)."""


class EnvWarning(UserWarning):
  """A variable that reads like a device request with a typo in the device's name (CUDAA=1): plugrt does not act on
  it, and says so once, with the likely intent (plugrt.selection.mistyped)."""


class CollectiveError(PlugrtError, RuntimeError):
  """A collective (plugrt.distributed) failed: the engine reported an error, or the communicator was aborted or closed.
  `rank` is this process's rank in the communicator, where known."""
  def __init__(self, message: str, hint: str = "", rank: int | None = None):
    self.rank = rank
    super().__init__(message if rank is None else f"rank {rank}: {message}", hint)


class CollectiveTimeout(CollectiveError, TimeoutError):
  """A collective did not finish within the communicator's timeout: a rank died, hangs, or called another collective.
  The communicator is aborted (NCCL) or marked broken (MPI) and refuses further work."""


class CollectiveMismatch(CollectiveError, ValueError):
  """The ranks called different collectives, or one collective with different sizes, dtypes, ops or roots. Every
  rank raises it (the metadata check compares what each rank asked for) and the communicator stays usable."""


class RankError(PlugrtError, ValueError):
  """A rank, root, peer or world size that cannot be: negative, past the world size, or a peer that is oneself."""


class CollectiveUnavailable(PlugrtError, RuntimeError):
  """No collective engine can serve these devices here; `reason` (a Reason) and `reasons` (engine -> why) say why."""
  def __init__(self, message: str, reason: Reason, hint: str = "", reasons: dict[str, str] | None = None):
    self.reason, self.reasons = reason, dict(reasons or {})
    super().__init__(f"{message} [{reason.value}]", hint)
