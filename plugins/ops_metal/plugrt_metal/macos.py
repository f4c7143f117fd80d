"""What the METAL device knows of macOS: where the Metal framework is, and which Metal Shading Language version each
release brings. A leaf (standard library and plugrt only) that the entry module's probe and the device share.
"""
from __future__ import annotations

from plugrt.context import PluginContext
from plugrt.errors import EnvError

METAL_FRAMEWORK = "/System/Library/Frameworks/Metal.framework"

#: the Metal Shading Language version each macOS release brings (Apple's MSL specification, "Metal Shading Language
#: versions"); plugrt targets the newest one the OS has (MSL 3.1, macOS 14, is the first with bfloat)
MSL_BY_MACOS = {11: (2, 3), 12: (2, 4), 13: (3, 0), 14: (3, 1), 15: (3, 2)}
MSL_VERSIONS = frozenset(MSL_BY_MACOS.values())


def mac_release() -> str:
  import platform  # here, not at the top: its import would cost every process's discovery, and only a Mac asks
  return platform.mac_ver()[0]


def macos_major(release: str | None = None) -> int:
  """The macOS major version (14 for "14.5"), 0 when unknown."""
  release = mac_release() if release is None else release
  try: return int(release.split(".")[0])
  except ValueError: return 0


def msl_version_for_macos(ctx: PluginContext, release: str | None = None) -> tuple[int, int]:
  """PLUGRT_METAL_MSL=major.minor if set, else the newest MSL version of this macOS release (MSL_BY_MACOS; a release
  newer than the table gets the table's newest)."""
  if (v := ctx.get("PLUGRT_METAL_MSL")):
    try: want = tuple(int(x) for x in v.split("."))
    except ValueError: want = ()
    if want not in MSL_VERSIONS:
      raise EnvError(f"PLUGRT_METAL_MSL={v!r} is not a Metal Shading Language version plugrt knows",
                     f"one of {', '.join(f'{a}.{b}' for a, b in sorted(MSL_VERSIONS))}, or unset it for the OS's own")
    return want  # type: ignore[return-value]
  major = macos_major(release)
  if major in MSL_BY_MACOS: return MSL_BY_MACOS[major]
  return max(MSL_VERSIONS) if major > max(MSL_BY_MACOS) else min(MSL_VERSIONS)
