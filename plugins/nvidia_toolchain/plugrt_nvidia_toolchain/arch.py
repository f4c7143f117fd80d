"""NVIDIA target names (sm_90, sm_90a, sm_100f), the PTX ISA version each one needs, and the architecture a device
builds for. Standard library and plugrt.errors only."""
from __future__ import annotations

import re
from typing import TYPE_CHECKING

from plugrt.errors import RenderError

if TYPE_CHECKING:
  from plugrt.context import DeviceInfo

#: the architecture a device builds for when neither the user nor the opened GPU names one
DEFAULT_ARCH = "sm_90"
#: the lowest PTX ISA version plugrt emits: older ones lack instructions the PTX renderer uses on every target
BASE_PTX_VERSION = "8.0"

# the lowest PTX ISA version each target accepts (probed with ptxas of CUDA 13.0)
_MIN_PTX = {50: (4, 0), 52: (4, 0), 53: (4, 2), 60: (5, 0), 61: (5, 0), 62: (5, 0), 70: (6, 0), 72: (6, 1), 75: (6, 3), 80: (7, 0),
            86: (7, 1), 87: (7, 4), 88: (7, 3), 89: (7, 8), 90: (7, 8), 100: (8, 6), 101: (8, 6), 103: (8, 8), 110: (9, 0),
            120: (8, 7), 121: (8, 8)}
_ARCH_RE = re.compile(r"^sm_(\d+)([af]?)$")


def parse_arch(arch: str) -> tuple[int, str]:
  """'sm_90a' -> (90, 'a'); RenderError for anything that is not a PTX target name."""
  m = _ARCH_RE.match(arch)
  if m is None: raise RenderError(f"PTX target {arch!r} is not of the form sm_XY[a|f]", "pass e.g. arch='sm_90'")
  return int(m[1]), m[2]


def min_ptx_version(arch: str) -> str:
  """The lowest PTX ISA version that `.target arch` accepts, e.g. '7.8' for sm_90. A target newer than this table
  is assumed to need at least the newest version in it (new targets always came with new PTX versions)."""
  sm, suffix = parse_arch(arch)
  newest = max(_MIN_PTX.values())
  major, minor = _MIN_PTX.get(sm, newest if sm > max(_MIN_PTX) else (4, 0))
  if suffix == "a" and sm == 90: major, minor = 8, 0
  if suffix == "f": major, minor = max((major, minor), (8, 8))
  return f"{major}.{minor}"


def version_tuple(version: str) -> tuple[int, int]:
  """'8.0' -> (8, 0)."""
  major, minor = version.split(".")
  return int(major), int(minor)


def ptx_version(arch: str) -> str:
  """The PTX ISA version plugrt emits for `arch`: the lowest the target accepts (sm_100 needs 8.6, sm_120 8.7), and at
  least BASE_PTX_VERSION. The lowest, so the widest range of drivers and assemblers accepts the module."""
  return max(BASE_PTX_VERSION, min_ptx_version(arch), key=version_tuple)


def device_arch(device: DeviceInfo) -> str:
  """The architecture to build for: what the user asked (DEV=CUDA::sm_90), else the opened GPU's (its state's
  `arch`), else DEFAULT_ARCH."""
  return device.arch or getattr(device.state, "arch", None) or DEFAULT_ARCH
