"""Which WebGPU drivers this machine has, from files alone, and the declaration each engine makes: the engines'
probes and declaration hooks call this during discovery, so it imports only the standard library and plugrt
(loading a Vulkan or OpenGL driver starts threads and takes tens of milliseconds; engines do that only when a
device opens)."""
from __future__ import annotations

import glob
import os
import sys
from collections.abc import Mapping
from typing import Any

from plugrt.context import PluginContext
from plugrt.hookspecs import InterfaceSpec


def _find_lib(env: Mapping[str, str], *names: str) -> str | None:
  return PluginContext(env).find_library(*names)


def vulkan_icds(env: Mapping[str, str]) -> list[str]:
  """The Vulkan driver manifests a loader started with `env` would read (its own search order, files only)."""
  for var in ("VK_DRIVER_FILES", "VK_ICD_FILENAMES"):  # these replace the search
    if v := env.get(var, "").strip():
      return [f for f in v.split(os.pathsep) if os.path.isfile(f) or (os.path.isdir(f) and glob.glob(os.path.join(f, "*.json")))]
  dirs = [os.path.join(d, "vulkan", "icd.d") for d in (env.get("XDG_DATA_DIRS") or "/usr/local/share:/usr/share").split(os.pathsep)]
  dirs += ["/etc/vulkan/icd.d", "/usr/share/vulkan/icd.d", "/usr/local/share/vulkan/icd.d"]
  extra = [f for f in env.get("VK_ADD_DRIVER_FILES", "").split(os.pathsep) if f and os.path.isfile(f)]
  return sorted(set(extra + [f for d in dirs for f in glob.glob(os.path.join(d, "*.json"))]))


def drivers(opengl: bool, env: Mapping[str, str]) -> tuple[bool, str]:
  """(a driver an engine can use is installed, what was found): looks at files only, loads nothing.
  Linux needs the Vulkan loader and a driver manifest, or (opengl=True, for wgpu-native) an EGL library;
  other systems have their native API (Metal, D3D12). `env` is the plugin context's: the loader reads the
  same variables (VK_DRIVER_FILES, LD_LIBRARY_PATH) from the process environment."""
  if sys.platform != "linux": return True, sys.platform
  loader, icds = _find_lib(env, "libvulkan.so.1", "libvulkan.so"), vulkan_icds(env)
  egl = _find_lib(env, "libEGL.so.1", "libEGL.so") if opengl else None
  found = []
  if loader and icds: found.append(f"Vulkan ({', '.join(os.path.basename(i).removesuffix('.json') for i in icds)})")
  if egl: found.append("OpenGL through EGL")
  if found: return True, " and ".join(found)
  why = "no Vulkan loader (libvulkan.so.1)" if not loader else "no Vulkan driver manifest (icd.d/*.json)"
  return False, why + (" and no EGL library" if opengl else "")


ADAPTER_ENV = "PLUGRT_WEBGPU_ADAPTER"
DRIVER_HINT = "apt-get install mesa-vulkan-drivers libvulkan1 (lavapipe, a CPU Vulkan driver) or your GPU's Vulkan driver"


def runtime_dir() -> None:
  """Gives the process an XDG_RUNTIME_DIR when it has none (or a relative one), before an engine loads the drivers.

  Mesa's EGL, which wgpu-native and Dawn load, tries Wayland, and libwayland prints "error: XDG_RUNTIME_DIR is invalid
  or not set in the environment." for every attempt when the variable is unset (a headless machine, a container, a
  shell without a login session): nothing a user can act on. The XDG base-directory spec's answer is a replacement
  directory owned by the user with mode 0700, which this makes. A driver workaround, not selection: it writes the
  process environment (the driver reads it with getenv) and nothing plugrt chooses depends on it; an absolute
  XDG_RUNTIME_DIR the user set is kept."""
  if os.name != "posix" or os.path.isabs(os.environ.get("XDG_RUNTIME_DIR", "")): return
  import stat
  import tempfile
  path = os.path.join(tempfile.gettempdir(), f"plugrt-runtime-{os.getuid()}")
  try: os.mkdir(path, 0o700)
  except FileExistsError: pass
  except OSError: path = ""
  try: st = os.lstat(path) if path else None
  except OSError: st = None
  if st is None or not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
    path = tempfile.mkdtemp(prefix="plugrt-runtime-")  # someone else's, or not private: a new one (mkdtemp makes it 0700)
  os.environ["XDG_RUNTIME_DIR"] = path


def engine_interface(**fields: Any) -> InterfaceSpec:
  """An engine's InterfaceSpec for the WEBGPU device. `priority` (which engine is the default) is given only where
  the core's InterfaceSpec has that field: cores before plugin API 1.1 do not."""
  return InterfaceSpec(**{k: v for k, v in fields.items() if k in InterfaceSpec.__annotations__})
