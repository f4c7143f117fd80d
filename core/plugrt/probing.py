"""Helpers for backends' probes, which must stay cheap: they run at discovery, in every process.

`which` is shutil.which without importing shutil, which brings zlib, bz2 and lzma along (a cost on every
`import plugrt`, and a probe needs none of them). `library_dirs`, `find_library`, `has_module` and `device_nodes`
are the looks at the machine that backends share; a plugin reaches the environment-dependent ones through its
plugrt.context.PluginContext (``ctx.which``, ``ctx.find_library``) so that ``Registry(env=...)`` governs them.
`install_hint` says how to install a missing plugrt
distribution the way plugrt itself was installed.
"""
from __future__ import annotations

import os


def which(program: str, path: str | None = None) -> str | None:
  """The path of `program` as the shell would run it (a path is checked as given, a name searched on `path`,
  default the process's PATH; plugins pass their context's: ``ctx.which``), or None."""
  def runnable(p: str) -> bool: return os.path.isfile(p) and os.access(p, os.X_OK)
  if os.path.dirname(program): return program if runnable(program) else None
  for d in (os.environ.get("PATH", os.defpath) if path is None else path).split(os.pathsep):
    if d and runnable(candidate := os.path.join(d, program)): return candidate
  return None


#: where shared libraries usually live when the dynamic loader is not told otherwise (ld.so.conf may add more)
SYSTEM_LIBRARY_DIRS = ("/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/lib/aarch64-linux-gnu",
                       "/usr/lib64", "/lib64", "/usr/lib", "/lib", "/usr/local/lib")


def library_dirs(first: list[str] | tuple[str, ...] = (), *extra: str) -> list[str]:
  """Folders to look for a shared library in, in the loader's order: `first` (LD_LIBRARY_PATH), `extra`, the system's."""
  out: list[str] = []
  for d in (*first, *extra, *SYSTEM_LIBRARY_DIRS):
    if d and d not in out: out.append(d)
  return out


def find_library(*patterns: str, dirs: list[str] | tuple[str, ...] | None = None) -> str | None:
  """The first existing file matching one of `patterns` ("libOpenCL.so.1", or a glob like "libcuda.so*"), looked for
  folder by folder in `dirs` (default: library_dirs() with no LD_LIBRARY_PATH), or None. A pattern with a folder
  in it is checked as given."""
  import glob
  for pat in patterns:
    if os.path.dirname(pat) and (hits := sorted(glob.glob(pat))): return hits[0]
  for d in library_dirs() if dirs is None else dirs:
    for pat in patterns:
      if os.path.dirname(pat): continue
      if not glob.has_magic(pat):
        if os.path.exists(p := os.path.join(d, pat)): return p
      elif hits := sorted(glob.glob(os.path.join(glob.escape(d), pat))): return hits[0]
  return None


def has_module(name: str) -> bool:
  """Whether `name` can be imported, found without importing it (a broken parent package counts as missing)."""
  import importlib.util
  try: return importlib.util.find_spec(name) is not None
  except (ImportError, ValueError): return False


def device_nodes(prefix: str) -> list[str]:
  """The numbered nodes of a driver, sorted by number: device_nodes("/dev/nvidia") -> ["/dev/nvidia0", ...]
  (/dev/nvidiactl and /dev/nvidia-uvm are not numbered, so not listed)."""
  folder, stem = os.path.split(prefix)
  try: names = os.listdir(folder or ".")
  except OSError: return []
  found = [n for n in names if n.startswith(stem) and n[len(stem):].isdigit()]
  return [os.path.join(folder, n) for n in sorted(found, key=lambda n: int(n[len(stem):]))]


#: The distributions this repository ships, and each one's folder in a checkout. No index has them yet:
#: `bash scripts/wheelhouse.sh` builds all of them into dist/, and `pip install --find-links dist 'plugrt[cl]'` picks.
DISTRIBUTIONS: dict[str, str] = {
  "plugrt": "core",
  "plugrt-testing": "testkit",
  "plugrt-cpu": "plugins/ops_cpu",
  "plugrt-cl": "plugins/ops_cl",
  "plugrt-cuda": "plugins/ops_cuda",
  "plugrt-nvidia-toolchain": "plugins/nvidia_toolchain",
  "plugrt-nv": "plugins/ops_nv",
  "plugrt-nv-nvk": "plugins/ops_nv/iface_nvk",
  "plugrt-nv-pci": "plugins/ops_nv/iface_pci",
  "plugrt-amd": "plugins/ops_amd",
  "plugrt-amd-kfd": "plugins/ops_amd/iface_kfd",
  "plugrt-amd-pci": "plugins/ops_amd/iface_pci",
  "plugrt-amd-usb": "plugins/ops_amd/iface_usb",
  "plugrt-webgpu": "plugins/ops_webgpu",
  "plugrt-webgpu-wgpu": "plugins/ops_webgpu/iface_wgpu",
  "plugrt-webgpu-dawn": "plugins/ops_webgpu/iface_dawn",
  "plugrt-metal": "plugins/ops_metal",
  "plugrt-qcom": "plugins/ops_qcom",
}

#: The libraries of this repository (distributions with no plugrt entry point) each distribution requires: installing
#: from a checkout by path, pip finds them on no index, so the install command names their folders too.
LOCAL_REQUIREMENTS: dict[str, tuple[str, ...]] = {
  "plugrt-cuda": ("plugrt-nvidia-toolchain",),
  "plugrt-nv": ("plugrt-nvidia-toolchain",),
}

_source: tuple[str, str] | None = None  # (how, where) plugrt was installed from, found once per process


def installed_from(package_dir: str | None = None) -> tuple[str, str]:
  """How plugrt (the package in `package_dir`, default the imported one) was installed: ("checkout", its root) when
  it runs from a source tree (PYTHONPATH, `pip install -e`) or was installed from one (`pip install ./core`);
  ("wheelhouse", the folder) when its wheel was installed by path; ("index", "") otherwise (an index, or
  --find-links, which pip does not record). Reads the direct_url.json pip writes (PEP 610): one directory listing."""
  global _source
  if package_dir is None and _source is not None: return _source
  here = os.path.dirname(os.path.abspath(package_dir or os.path.dirname(__file__)))  # the folder holding the plugrt package
  found = ("index", "")
  if os.path.isfile(os.path.join(here, "pyproject.toml")) and os.path.isdir(os.path.join(here, "..", "plugins")):
    found = ("checkout", os.path.dirname(here))
  else:
    try: metas = [d for d in os.listdir(here) if d.startswith("plugrt-") and d[7:8].isdigit() and d.endswith(".dist-info")]
    except OSError: metas = []
    if metas: found = _from_direct_url(os.path.join(here, metas[0], "direct_url.json"))
  if package_dir is None: _source = found
  return found


def _from_direct_url(path: str) -> tuple[str, str]:
  import json
  from urllib.parse import unquote, urlsplit
  try:
    with open(path, encoding="utf-8") as f: url = urlsplit(json.load(f).get("url", ""))
  except (OSError, ValueError, AttributeError): return ("index", "")
  if url.scheme != "file": return ("index", "")
  where = unquote(url.path)
  if where.endswith(".whl") and os.path.isdir(os.path.dirname(where)): return ("wheelhouse", os.path.dirname(where))
  root = os.path.dirname(where.rstrip("/"))  # pip install <root>/core
  if os.path.isdir(os.path.join(root, "plugins")): return ("checkout", root)
  return ("index", "")


def install_hint(*dists: str, package_dir: str | None = None) -> str:
  """The command that installs plugrt distributions `dists` (names, no extras), for the way plugrt was installed:
  `pip install <checkout>/plugins/ops_cl`, `pip install --find-links <wheelhouse> plugrt-cl`, or `pip install plugrt-cl`.
  From a checkout the folders of what they require (LOCAL_REQUIREMENTS) come first; a wheelhouse or an index has
  those itself. A name this repository does not ship gets no command: nothing installs it."""
  missing = [d for d in dists if d not in DISTRIBUTIONS]
  if missing: return f"none from plugrt yet: {' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not written"
  how, where = installed_from(package_dir)
  if how == "checkout":
    folders = [DISTRIBUTIONS[r] for d in dists for r in LOCAL_REQUIREMENTS.get(d, ())] + [DISTRIBUTIONS[d] for d in dists]
    return "pip install " + " ".join(os.path.join(where, f) for f in dict.fromkeys(folders))
  if how == "wheelhouse": return f"pip install --find-links {where} {' '.join(dists)}"
  return f"pip install {' '.join(dists)} (from the index or --find-links wheelhouse plugrt came from)"
