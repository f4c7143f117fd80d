"""Installing plugrt: the distributions and extras this repository ships, the wheelhouse, and the install hints."""
from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import zipfile
from concurrent.futures import ThreadPoolExecutor

import pytest

from plugrt.probing import DISTRIBUTIONS, LOCAL_REQUIREMENTS, install_hint, installed_from
from plugrt.registry import FIRST_PARTY

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _project(folder: str) -> dict:
  with open(os.path.join(ROOT, folder, "pyproject.toml"), "rb") as f: return tomllib.load(f)["project"]


def test_distributions_are_the_repository_folders():
  found = [glob.glob(os.path.join(ROOT, "plugins", *parts, "pyproject.toml")) for parts in (("*",), ("*", "iface_*"))]
  folders = ["core", "testkit"] + sorted(os.path.relpath(os.path.dirname(p), ROOT) for ps in found for p in ps)
  assert {_project(f)["name"]: f for f in folders} == DISTRIBUTIONS


def test_local_requirements_are_the_libraries_each_distribution_requires():
  """A checkout's install command names the folders of the libraries a distribution requires (distributions of this
  repository with no plugrt entry point, which no other hint names and no index has): each pyproject.toml's own list."""
  def name(req: str) -> str: return req.split("[")[0].split("=")[0].split(">")[0].split("<")[0].strip()
  libraries = {d for d, f in DISTRIBUTIONS.items() if "plugrt" not in _project(f).get("entry-points", {})}
  assert libraries == {"plugrt-nvidia-toolchain", "plugrt-testing"}  # the toolchain, and the authoring kit
  for dist, folder in DISTRIBUTIONS.items():
    ours = [name(r) for r in _project(folder).get("dependencies", []) if name(r) in libraries]
    assert tuple(ours) == LOCAL_REQUIREMENTS.get(dist, ()), dist
  assert "plugrt-cuda" not in LOCAL_REQUIREMENTS["plugrt-nv"]  # NV shares the toolchain with CUDA, not CUDA itself


def test_every_extra_names_a_shipped_distribution():
  def name(req: str) -> str: return req.split("[")[0].split("=")[0].split(">")[0].split("<")[0].strip()
  extras = _project("core")["optional-dependencies"]
  assert [name(r) for r in extras.pop("video")] == ["av"]  # third-party extras: PyAV for plugrt.video's software decoder,
  assert [name(r.split(";")[0]) for r in extras.pop("distributed")] == ["mpi4py", "mpich"]  # MPI for plugrt.distributed's
  for reqs in extras.values(): assert all(name(r) in DISTRIBUTIONS for r in reqs), reqs
  for folder in DISTRIBUTIONS.values():  # the plugins' own extras, where they name plugrt distributions
    for reqs in _project(folder).get("optional-dependencies", {}).values():
      assert all(name(r) in DISTRIBUTIONS for r in reqs if name(r).startswith("plugrt")), reqs
  assert set(extras["all"]) >= {r for k, v in extras.items() if k not in ("all", "dawn", "webgpu", "testing") for r in v}  # all: the backends
  assert any(r.startswith("plugrt-webgpu[wgpu") for r in extras["webgpu"])  # the WebGPU extra brings its default engine


def _site(tmp_path, direct_url: dict | None) -> str:
  """A site-packages folder with plugrt in it, installed as direct_url says; returns the package folder."""
  site = tmp_path / "site-packages"
  (site / "plugrt").mkdir(parents=True)
  meta = site / "plugrt-0.1.0.dist-info"
  meta.mkdir()
  (meta / "METADATA").write_text("Name: plugrt\nVersion: 0.1.0\n")
  if direct_url is not None: (meta / "direct_url.json").write_text(json.dumps(direct_url))
  (site / "plugrt_cpu-0.1.0.dist-info").mkdir()  # another distribution's metadata is not plugrt's
  return str(site / "plugrt")


def test_hint_for_a_checkout_on_the_path(tmp_path):
  (tmp_path / "core" / "plugrt").mkdir(parents=True)
  (tmp_path / "core" / "pyproject.toml").write_text("")
  (tmp_path / "plugins").mkdir()
  pkg = str(tmp_path / "core" / "plugrt")
  assert installed_from(pkg) == ("checkout", str(tmp_path))
  assert install_hint("plugrt-webgpu", "plugrt-webgpu-wgpu", package_dir=pkg) == \
    f"pip install {tmp_path}/plugins/ops_webgpu {tmp_path}/plugins/ops_webgpu/iface_wgpu"
  # what a distribution requires from this repository comes first, once (no index has it)
  assert install_hint("plugrt-nv", package_dir=pkg) == f"pip install {tmp_path}/plugins/nvidia_toolchain {tmp_path}/plugins/ops_nv"
  assert install_hint("plugrt-cuda", "plugrt-nv", package_dir=pkg) == \
    f"pip install {tmp_path}/plugins/nvidia_toolchain {tmp_path}/plugins/ops_cuda {tmp_path}/plugins/ops_nv"


def test_hint_for_an_install_from_a_checkout(tmp_path):
  checkout = tmp_path / "src"
  (checkout / "plugins").mkdir(parents=True)
  pkg = _site(tmp_path, {"url": f"file://{checkout}/core", "dir_info": {}})
  assert install_hint("plugrt-cl", package_dir=pkg) == f"pip install {checkout}/plugins/ops_cl"


def test_hint_for_a_wheel_installed_by_path(tmp_path):
  (tmp_path / "my wheels").mkdir()
  pkg = _site(tmp_path, {"url": f"file://{tmp_path}/my%20wheels/plugrt-0.1.0-py3-none-any.whl", "archive_info": {}})
  assert install_hint("plugrt-cl", package_dir=pkg) == f"pip install --find-links {tmp_path}/my wheels plugrt-cl"


@pytest.mark.parametrize("direct_url", [None, {"url": "https://example.com/plugrt-0.1.0-py3-none-any.whl", "archive_info": {}},
                                        {"url": "file:///nowhere/core", "dir_info": {}}])
def test_hint_for_an_index_or_a_source_gone(tmp_path, direct_url):
  pkg = _site(tmp_path, direct_url)
  assert installed_from(pkg) == ("index", "")
  assert install_hint("plugrt-cl", package_dir=pkg).startswith("pip install plugrt-cl (")


def test_no_install_command_for_what_is_not_written():
  assert all(d in DISTRIBUTIONS for dists, _ in FIRST_PARTY.values() for d in dists.split())  # every first-party backend is written now
  dist = "plugrt-someday"  # a name the registry might list before its package exists
  assert dist not in DISTRIBUTIONS and install_hint(dist) == f"none from plugrt yet: {dist} is not written"



# ---------------------------------------------------------------- what the AMD distributions ship

#: the driverless bring-up of an AMD GPU (and the register tables it programs): modules only the PCI and USB interfaces use
AMD_DRIVERLESS = ("bringup", "compute", "discovery", "doorbell", "driverless", "firmware", "gc_init", "gfx", "gmc", "hdp", "mec", "psp",
                  "psp_firmware", "psp_load", "regs", "regtables", "scratch", "smu", "ucode", "vm")


def _requirement(req: str) -> tuple[str, list[str]]:
  """(name, extras) of a requirement string such as "plugrt-amd[kfd]==0.1.0"."""
  head = req.split(";")[0].split("=")[0].split(">")[0].split("<")[0].strip()
  name, _, extras = head.partition("[")
  return name.strip(), [e.strip() for e in extras.rstrip("]").split(",") if e.strip()]


def _closure(reqs: list[str]) -> set[str]:
  """The distributions of this repository that installing `reqs` brings in (their dependencies and the extras named)."""
  todo, found = list(reqs), set()
  while todo:
    name, extras = _requirement(todo.pop())
    if name not in DISTRIBUTIONS: continue
    project = _project(DISTRIBUTIONS[name])
    todo += [] if name in found else project.get("dependencies", [])
    todo += [r for e in extras for r in project.get("optional-dependencies", {}).get(e, [])]
    found.add(name)
  return found


def _wheel_files(dist: str, tmp_path) -> list[str]:
  """The files of the wheel pip builds of `dist` (from a copy of its folder: the checkout keeps no build leftovers)."""
  src, out = tmp_path / dist, tmp_path / f"{dist}-wheel"
  skip = shutil.ignore_patterns("build", "*.egg-info", "__pycache__", "tests", "iface_*")  # the interfaces' folders are their own
  shutil.copytree(os.path.join(ROOT, DISTRIBUTIONS[dist]), src, ignore=skip)
  r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "--no-deps", "--no-build-isolation",
                      "-w", str(out), str(src)], capture_output=True, text=True, env=_env())
  assert r.returncode == 0, r.stderr[-3000:]
  (wheel,) = glob.glob(str(out / "*.whl"))
  with zipfile.ZipFile(wheel) as z: return z.namelist()


def _modules(files: list[str]) -> set[str]:
  """The module names (a package's name for its folder) under each top-level package of a wheel's file list."""
  return {parts[1].removesuffix(".py") for f in files if len(parts := f.split("/")) > 1 and not parts[0].endswith(".dist-info")}


def test_the_amd_extra_installs_no_driverless_code(tmp_path):
  """`pip install plugrt[amd]` is the device and its kernel-driver interface (plugrt-amd, plugrt-amd-kfd): what it
  installs holds none of the driverless bring-up, which is plugrt-amd-pci's (plugrt-amd-usb requires it)."""
  pytest.importorskip("setuptools")
  pytest.importorskip("wheel")
  amd = _closure(_project("core")["optional-dependencies"]["amd"])
  assert amd == {"plugrt", "plugrt-amd", "plugrt-amd-kfd"}, amd
  shipped = {d: _modules(_wheel_files(d, tmp_path)) for d in ("plugrt-amd", "plugrt-amd-kfd", "plugrt-amd-pci")}
  for dist in ("plugrt-amd", "plugrt-amd-kfd"):
    assert {"__init__"} < shipped[dist] and not shipped[dist] & set(AMD_DRIVERLESS), (dist, sorted(shipped[dist] & set(AMD_DRIVERLESS)))
  assert set(AMD_DRIVERLESS) <= shipped["plugrt-amd-pci"], sorted(set(AMD_DRIVERLESS) - shipped["plugrt-amd-pci"])
  assert {"runtime", "iface", "codeobject", "aql"} <= shipped["plugrt-amd"]  # the one device every interface runs on
  assert "plugrt-amd-pci" in _closure(["plugrt-amd-usb"])

# ---------------------------------------------------------------- scripts/setup.sh's environment

MANAGED = sorted(glob.glob("/usr/lib/python3*/EXTERNALLY-MANAGED"))


def test_scripts_run_uses_the_active_venv_or_else_the_checkouts(tmp_path):
  (tmp_path / "scripts").mkdir()  # a checkout's scripts
  for f in ("env.sh", "run"): shutil.copy2(os.path.join(ROOT, "scripts", f), tmp_path / "scripts" / f)
  def where(path: str) -> subprocess.CompletedProcess:
    env = {**_env(), "PATH": f"{path}:{os.environ['PATH']}"}
    run = str(tmp_path / "scripts" / "run")
    return subprocess.run([run, "python3", "-c", "import sys; print(sys.prefix)"], capture_output=True, text=True, env=env)
  user = os.path.dirname(_venv(tmp_path / "user-venv"))
  assert where(user).stdout.strip() == str(tmp_path / "user-venv")  # the active venv: installed into, run from
  if not MANAGED: pytest.skip("no externally managed python3 in /usr/bin here")
  r = where("/usr/bin")  # Debian's python3 (PEP 668): the checkout's .venv, which does not exist yet
  assert r.returncode == 1 and "run bash scripts/setup.sh first" in r.stderr
  subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(tmp_path / ".venv")], check=True)
  assert where("/usr/bin").stdout.strip() == str(tmp_path / ".venv")


# ---------------------------------------------------------------- scripts/setup.sh's choice of backends

#: the folder each optional backend's package is in (setup.sh installs it with its interfaces)
BACKEND_FOLDERS = {"CUDA": "./plugins/ops_cuda", "NV": "./plugins/ops_nv", "AMD": "./plugins/ops_amd", "METAL": "./plugins/ops_metal",
                   "QCOM": "./plugins/ops_qcom"}
ALWAYS = {"./core", "./plugins/ops_cpu", "./plugins/ops_cl", "./plugins/ops_webgpu", "./plugins/ops_webgpu/iface_wgpu",
          "./plugins/ops_webgpu/iface_dawn"}


def _setup_plan(*args: str) -> tuple[list[str], str]:
  """(the folders `bash scripts/setup.sh --dry-run ARGS` would pip install, in order; its whole output)."""
  r = subprocess.run(["bash", os.path.join(ROOT, "scripts", "setup.sh"), "--dry-run", *args], capture_output=True, text=True, timeout=60)
  assert r.returncode == 0, r.stderr
  first = r.stdout.splitlines()[0]
  assert first.startswith("would install: "), r.stdout
  return first.removeprefix("would install: ").split(), r.stdout


def _devices_possible_here() -> dict[str, bool]:
  """Whether this machine can have each optional backend's device, read the way setup.sh's header says it reads it."""
  ldconfig = next((p for p in (shutil.which("ldconfig"), "/sbin/ldconfig", "/usr/sbin/ldconfig") if p and os.path.exists(p)), None)
  libs = subprocess.run([ldconfig, "-p"], capture_output=True, text=True).stdout if ldconfig else ""
  nvidia = bool(glob.glob("/dev/nvidia[0-9]*")) or os.path.exists("/dev/nvidiactl") or any(
    line.strip().startswith("libcuda.so") for line in libs.splitlines())
  def read(path: str) -> str:
    try:
      with open(path) as f: return f.read().strip()
    except OSError: return ""
  amd = os.path.exists("/dev/kfd") or any(read(f"{d}/vendor") == "0x1002" and read(f"{d}/class")[:4] in ("0x03", "0x12")
                                          for d in glob.glob("/sys/bus/pci/devices/*"))
  return {"CUDA": nvidia, "NV": nvidia, "AMD": amd, "METAL": sys.platform == "darwin", "QCOM": os.path.exists("/dev/kgsl-3d0")}


def test_setup_installs_the_backends_this_machine_can_run_and_names_the_rest():
  folders, out = _setup_plan()
  assert ALWAYS <= set(folders) and len(folders) == len(set(folders))
  possible = _devices_possible_here()
  for name, folder in BACKEND_FOLDERS.items():
    assert (folder in folders) == possible[name], (name, folders)
    if possible[name]: continue
    lines = out.splitlines()
    at = lines.index(next(line for line in lines if line.startswith(f"  {name}: ")))  # what it skipped, and why
    add = lines[at + 1].strip()
    assert add.startswith("scripts/run python3 -m pip install ") and folder in add.split(), add  # the one command that adds it
    assert all(os.path.isdir(os.path.join(ROOT, f)) for f in add.split()[5:]), add
    if name in ("CUDA", "NV"): assert add.split()[5] == "./plugins/nvidia_toolchain"  # what both require, first
  if not all(possible.values()): assert "or every backend: bash scripts/setup.sh --all" in out
  assert "plugins/nvidia_toolchain" not in " ".join(folders) or possible["CUDA"]


@pytest.mark.parametrize("mode", ["--all", "--test"])
def test_setup_all_and_test_install_every_backend(mode):
  folders, out = _setup_plan(mode)
  every = {"./" + f for f in DISTRIBUTIONS.values()} - ({"./testkit"} if mode == "--all" else set())  # the kit: for tests
  assert set(folders) == every and "skipped" not in out  # every distribution of this repository: their fakes test them all
  assert ("would install: -r requirements-test.txt" in out) == (mode == "--test")
  assert folders.index("./plugins/nvidia_toolchain") < folders.index("./plugins/ops_cuda")


def test_setup_refuses_an_unknown_option():
  r = subprocess.run(["bash", os.path.join(ROOT, "scripts", "setup.sh"), "--dry-run", "--gpu"], capture_output=True, text=True, timeout=60)
  assert r.returncode == 2 and "unknown option --gpu" in r.stderr and r.stdout == ""


# ---------------------------------------------------------------- the wheelhouse, for real

#: what `plugrt devices --json` shows installed for each extra (the core's PYTHON always)
EXTRA_DEVICES = {"cpu": {"CPU"}, "cl": {"CL"}, "cuda": {"CUDA"}, "nv": {"NV"}, "amd": {"AMD"}, "webgpu": {"WEBGPU"},
                 "dawn": {"WEBGPU"}, "metal": {"METAL"}, "qcom": {"QCOM"}, "all": {"CPU", "CL", "CUDA", "NV", "AMD", "WEBGPU", "METAL", "QCOM"}}


def _venv(path) -> str:
  subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
  return str(path / "bin" / "python")


def _env() -> dict[str, str]:  # the venv's own packages only
  return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PLUGRT_PLUGINS", "PLUGRT_DISABLE", "PLUGRT_EXTRA_PLUGINS")}


def _pip(python: str, *args: str) -> None:
  r = subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--disable-pip-version-check", *args],
                     capture_output=True, text=True, env=_env())
  assert r.returncode == 0, r.stderr[-3000:]


def _devices(python: str) -> dict:
  r = subprocess.run([python, "-m", "plugrt", "devices", "--json"], capture_output=True, text=True, env=_env(), cwd="/")
  assert r.returncode == 0, r.stderr
  return {b["device"]: b for b in json.loads(r.stdout)["backends"]}


def _installed(rows: dict) -> set[str]: return {d for d, b in rows.items() if b["reason"] != "not installed" and d != "PYTHON"}


@pytest.mark.slow
def test_wheelhouse_installs_every_extra_and_hints_work(tmp_path):
  r = subprocess.run(["bash", os.path.join(ROOT, "scripts", "wheelhouse.sh")], capture_output=True, text=True)
  assert r.returncode == 0, r.stderr[-3000:]
  dist = os.path.join(ROOT, "dist")
  wheels = {os.path.basename(w).split("-")[0].replace("_", "-") for w in glob.glob(os.path.join(dist, "plugrt*.whl"))}
  assert wheels == set(DISTRIBUTIONS)
  def install(extra: str) -> dict:
    py = _venv(tmp_path / extra)
    _pip(py, "--find-links", dist, f"plugrt[{extra}]")
    return _devices(py)
  with ThreadPoolExecutor(3) as pool: found = dict(zip(EXTRA_DEVICES, pool.map(install, EXTRA_DEVICES)))  # pip waits on the network
  for extra, rows in found.items():
    assert _installed(rows) == EXTRA_DEVICES[extra], (extra, {d: b["reason"] for d, b in rows.items()})
    assert rows["PYTHON"]["available"]
    if extra == "webgpu": assert rows["WEBGPU"]["available"], rows["WEBGPU"]  # its engine came along
  # the hint of a missing backend is a command that installs it: plugrt's wheel installed by path, and from the checkout
  left = ["core/build", "core/plugrt.egg-info", "plugins/ops_cpu/build", "plugins/ops_cpu/plugrt_cpu.egg-info"]  # by in-tree builds
  made = [p for p in (os.path.join(ROOT, f) for f in left) if not os.path.exists(p)]
  try:
    for how, core in (("wheel", glob.glob(os.path.join(dist, "plugrt-0.1.0-*.whl"))[0]), ("checkout", os.path.join(ROOT, "core"))):
      py = _venv(tmp_path / how)
      _pip(py, core)
      hint = _devices(py)["CPU"]["hint"]
      where = f"--find-links {dist} " if how == "wheel" else os.path.join(ROOT, "plugins", "ops_cpu")
      assert hint.startswith("pip install ") and where in hint, hint
      _pip(py, *hint.split()[2:])
      assert "CPU" in _installed(_devices(py)), how
  finally:
    for p in made: shutil.rmtree(p, ignore_errors=True)  # what the in-tree builds left in the checkout
