"""Where AMD's tools are, as the plugin context's environment sees them: LLVM's linker and binary tools (ld.lld,
llvm-readelf, llvm-objdump) and ROCm's runtime compiler (hiprtc). Only paths are looked at here: nothing runs.

LLVM tools are searched in order: the variable naming the tool (PLUGRT_AMD_LLD for ld.lld), the plain name on
PATH, versioned names on PATH (ld.lld-22 down to ld.lld-14), then /usr/lib/llvm-<N>/bin (newest first), which is
where Debian's and Ubuntu's llvm-<N> and lld-<N> packages put them.
"""
from __future__ import annotations

import glob
import os
import re

from plugrt.context import PluginContext

LLD_HINT = "apt-get install lld (or lld-19), or name the linker with PLUGRT_AMD_LLD=/path/to/ld.lld"
LLVM_TOOLS_HINT = "apt-get install llvm-19 (llvm-readelf and llvm-objdump 19 or newer know gfx942 and gfx12 code objects)"
HIP_HINT = ("install ROCm's HIP runtime compiler (libhiprtc.so: apt-get install hip-runtime-amd from repo.radeon.com, "
            "or the ROCm SDK), or set ROCM_PATH or LD_LIBRARY_PATH to where it is; AMD_LLVM=1 needs no ROCm")
#: newest first; the range covers every LLVM with AMDGPU code object v5
VERSIONS = tuple(range(22, 13, -1))
_VARIABLE = {"ld.lld": "PLUGRT_AMD_LLD"}


def llvm_tool(ctx: PluginContext, name: str, min_version: int = 0) -> str | None:
  """The path of LLVM tool `name` (ld.lld, llvm-readelf, llvm-objdump), or None. With min_version, a tool whose
  version is known from its name or folder and is older is passed over (one on PATH without a version is taken)."""
  if (var := _VARIABLE.get(name)) and (given := ctx.get(var)): return ctx.which(given)
  if (p := ctx.which(name)) is not None and min_version <= 0: return p
  for v in VERSIONS:
    if v < min_version: break
    if (p := ctx.which(f"{name}-{v}")) is not None: return p
  for folder in sorted(glob.glob("/usr/lib/llvm-*/bin"), key=_folder_version, reverse=True):
    if _folder_version(folder) < min_version: break
    if os.access(p := os.path.join(folder, name), os.X_OK): return p
  return ctx.which(name) if min_version > 0 else None


def _folder_version(folder: str) -> int:
  m = re.search(r"llvm-(\d+)", folder)
  return int(m.group(1)) if m else 0


def rocm_dirs(ctx: PluginContext) -> list[str]:
  """Where ROCm's libraries are: LD_LIBRARY_PATH, $ROCM_PATH/lib, /opt/rocm/lib, then the system's folders."""
  extra = [os.path.join(r, "lib") for r in (ctx.get("ROCM_PATH"), "/opt/rocm") if r]
  return ctx.library_dirs(*extra, *sorted(glob.glob("/opt/rocm-*/lib"), reverse=True))


def hiprtc_path(ctx: PluginContext) -> str | None:
  """libhiprtc.so (PLUGRT_HIPRTC names it), or None."""
  if (given := ctx.get("PLUGRT_HIPRTC")): return given if os.path.exists(given) else None
  return ctx.find_library("libhiprtc.so", "libhiprtc.so.*", dirs=rocm_dirs(ctx))


def comgr_path(ctx: PluginContext) -> str | None:
  """libamd_comgr.so, or None (found for `plugrt devices`; plugrt compiles HIP through hiprtc)."""
  return ctx.find_library("libamd_comgr.so", "libamd_comgr.so.*", dirs=rocm_dirs(ctx))
