"""Launch and allocation limits, and the errors at the edges (issue 19's audit, D2 and D3 and the minor items).

Launches past what a device runs are a LaunchError from Program.check_args, before anything reaches native code, on
every device and compiler, also after a launch that took a backend's fast path; allocation sizes no allocator could
satisfy are OutOfMemoryError before any allocator sees them; from_blob sizes and Tensor shapes are checked; float
scalars out of a dtype's range round to inf on every device. What used to crash the process (SIGFPE, SIGSEGV, PoCL's
abort) runs in a child process, so that a regression fails a test instead of taking pytest down.
"""
from __future__ import annotations

import ctypes
import math
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from plugrt import Buffer, Device, KernelBuilder, Tensor, dtypes
from plugrt.errors import CompileError, LaunchError, OutOfMemoryError
from plugrt.runtime import INT32_MAX, MAX_ALLOC_BYTES
from plugrt_testing.fuzz import ir_targets

ROOT = Path(__file__).resolve().parents[1]

TARGETS = [str(t) for t in ir_targets()]  # every device and compiler: CPU:CLANG, CPU:LLVM, CL:..., WEBGPU:WGSL, PYTHON:PY


@pytest.fixture(params=TARGETS)
def target(request) -> str: return request.param


@pytest.fixture(params=Device.available())
def dev(request) -> str: return request.param


def saxpy():
  b = KernelBuilder("saxpy")
  out, x, y = (b.buffer(n, dtypes.float32) for n in ("out", "x", "y"))
  a, n = b.scalar("a", dtypes.float32), b.scalar("n", dtypes.int32)
  i = b.global_id(0)
  with b.if_(i < n):
    out[i] = a * x[i] + y[i]
  return b.finish()


def program(target: str, kernel):
  name, _, compiler = target.partition(":")
  d = Device[name]
  return d, d.program(kernel, compiler or None)


def run_child(code: str, **env: str) -> subprocess.CompletedProcess:
  """Python code in a fresh interpreter with this one's environment plus `env`."""
  return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120,
                        env={**os.environ, **env})


# ---------------------------------------------------------------- D2: launch sizes

#: (global_size, local_size) that no device runs: past 32 bits, at 2**31, past int32 along an axis through the product
#: group x local, or past 2**40 threads in all. Each used to pass the check (2**40 threads only was refused).
TOO_LARGE = [((2**32 + 1,), (1,)), ((2**32,), (1,)), ((2**31 + 5,), (1,)), ((2**39 - 1,), (1,)), ((2**16,), (2**15,)),
             ((1, 2**31), (1,)), ((1, 1, 2**17), (1, 1, 2**14)), ((2**20, 2**20, 2), (1,))]


@pytest.mark.parametrize("gs,ls", TOO_LARGE)
def test_launch_past_the_limits_is_a_launch_error(target, gs, ls):
  d, prg = program(target, saxpy())
  bufs = [Buffer(d, 4) for _ in range(3)]
  with pytest.raises(LaunchError) as info: prg.check_args(bufs, (2.0, 4), gs, ls)
  assert isinstance(info.value, ValueError) and d.canonical in str(info.value) and f"program {prg.name}" in str(info.value)
  assert info.value.hint


def test_each_device_declares_its_own_limits(dev):
  """The limits are the device's: a group count or group size over them names the limit and the device."""
  d, prg = program(dev, saxpy())
  lim = prg.launch_limits
  assert all(1 <= m <= INT32_MAX for m in (*lim.max_groups, *lim.max_local, lim.max_local_total))
  bufs = [Buffer(d, 4) for _ in range(3)]
  for gs, ls, limit in [((lim.max_groups[0] + 1,), (1,), lim.max_groups[0]), ((1,), (lim.max_local[0] + 1,), lim.max_local[0]),
                        ((1, 1, lim.max_groups[2] + 1), (1,), lim.max_groups[2])]:
    with pytest.raises(LaunchError, match=f"at most {limit}"): prg.check_args(bufs, (1.0, 4), gs, ls)
  if lim.max_local_total < math.prod(lim.max_local):  # a group over the total, each axis within its own limit
    ls = [1, 1, 1]
    for ax in range(3):
      ls[ax] = min(lim.max_local[ax], -(-(lim.max_local_total + 1) // math.prod(ls)))
    if math.prod(ls) > lim.max_local_total:
      with pytest.raises(LaunchError, match=f"at most {lim.max_local_total}"): prg.check_args(bufs, (1.0, 4), (1,), tuple(ls))
  assert prg.check_args(bufs, (1.0, 4), (lim.max_groups[0],), (1,)) == ((lim.max_groups[0], 1, 1), (1, 1, 1))
  if dev == "WEBGPU": assert lim.max_groups[0] == d.program(saxpy()).engine.limits.max_workgroups_per_dimension
  if dev == "CL":
    st = d.info.state
    assert lim.max_local_total == st.max_group and lim.max_local == tuple(st.max_items[:3])


def test_a_launch_after_a_fast_launch_is_still_checked(target):
  """A backend skips the full check when a launch repeats the last one's arguments; new sizes always get it. These
  launches used to crash the process (SIGFPE at 2**32 groups, SIGSEGV at 2**31+5, PoCL's abort): so in a child."""
  r = run_child(f"""
    import numpy as np
    from plugrt import Buffer, Device
    from plugrt.errors import LaunchError
    import test_adversarial_limits as T
    d, prg = T.program({target!r}, T.saxpy())
    out, x, y = Buffer(d, 4), Buffer.from_numpy(np.arange(4, dtype=np.float32), d), Buffer.from_numpy(np.ones(4, np.float32), d)
    sizes = [(2**32 + 1,), (2**32,), (2**31 + 5,), (2**39 - 1,)] + ([(2**20, 2**13, 1)] if d.name == "CL" else [])  # PoCL: 2**33 groups
    for gs in sizes:
      for _ in range(2): prg(out, x, y, global_size=(1,), local_size=(4,), vals=(2.0, 4))  # the second call takes the fast path
      try: prg(out, x, y, global_size=gs, local_size=(1,), vals=(2.0, 4)); print("LAUNCHED", gs, flush=True)
      except LaunchError as e: print("REFUSED", gs, flush=True)
    prg(out, x, y, global_size=(1,), local_size=(4,), vals=(2.0, 4)); d.synchronize()
    print("RESULT", out.numpy().tolist())
  """, PYTHONPATH=os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")]))
  assert r.returncode == 0, f"the child died ({r.returncode}): {r.stdout[-2000:]}{r.stderr[-2000:]}"
  assert r.stdout.count("REFUSED") == (5 if target.startswith("CL") else 4) and "LAUNCHED" not in r.stdout, r.stdout
  assert "RESULT [1.0, 3.0, 5.0, 7.0]" in r.stdout, r.stdout


@pytest.mark.parametrize("compiler", ["CLANG", "LLVM"])
def test_cpu_group_size_is_bounded(compiler):
  """A CPU group's threads run as loops, and a value kept across a barrier lives in a stack array of one element per
  thread: 2**22 threads per group overflowed the stack (SIGSEGV). So a CPU group has at most MAX_GROUP_THREADS."""
  if f"CPU:{compiler}" not in TARGETS: pytest.skip(f"CPU:{compiler} is not available here")
  r = run_child(f"""
    import numpy as np
    from plugrt import Buffer, Device, KernelBuilder, dtypes
    from plugrt.errors import LaunchError
    from plugrt_cpu.program import MAX_GROUP_THREADS
    b = KernelBuilder("spill")
    out, x = b.buffer("out", dtypes.float32), b.buffer("x", dtypes.float32)
    lid = b.local_id(0)
    v = x[lid] * 2.0  # per thread, kept across the barrier
    b.barrier()
    out[lid] = v + 1.0
    d = Device["CPU"]
    prg = d.program(b.finish(), {compiler!r})
    for n in (MAX_GROUP_THREADS, 1 << 22):
      xs, o = Buffer.from_numpy(np.ones(n, np.float32), d), Buffer(d, n)
      try: prg(o, xs, global_size=(1,), local_size=(n,)); print("RAN", n, float(o.numpy().min()))
      except LaunchError as e: print("REFUSED", n, "at most 4096" in str(e))
  """)
  assert r.returncode == 0, f"the child died ({r.returncode}): {r.stdout[-2000:]}{r.stderr[-2000:]}"
  assert "RAN 4096 3.0" in r.stdout and f"REFUSED {1 << 22} True" in r.stdout, r.stdout


def ids_kernel():
  """out[gid - top] = gid for the threads with gid >= top, on the axis given by the scalar `axis`."""
  b = KernelBuilder("top_ids")
  out = b.buffer("out", dtypes.int32)
  top, axis = b.scalar("top", dtypes.int32), b.scalar("axis", dtypes.int32)
  gid = axis.eq(0).where(b.global_id(0), axis.eq(1).where(b.global_id(1), b.global_id(2)))
  with b.if_(gid >= top):
    out[gid - top] = gid
  return b.finish()


@pytest.mark.parametrize("compiler", ["CLANG", "LLVM"])
@pytest.mark.parametrize("axis,gs,ls", [(0, (INT32_MAX, 1, 1), (1, 1, 1)), (1, (1, INT32_MAX, 1), (1, 1, 1)),
                                        (2, (1, 1, INT32_MAX), (1, 1, 1)), (0, ((1 << 21) - 1, 1, 1), (1024, 1, 1)),
                                        (1, (1, INT32_MAX // 7, 1), (1, 7, 1))])
def test_largest_accepted_launch_has_exact_ids(compiler, axis, gs, ls):
  """The largest launch the CPU accepts along an axis, run for its last groups only (the CPU's kernels run any range
  of groups): the top ids are exact, no wrap."""
  if f"CPU:{compiler}" not in TARGETS: pytest.skip(f"CPU:{compiler} is not available here")
  d, prg = program(f"CPU:{compiler}", ids_kernel())
  n = gs[axis] * ls[axis]
  assert n <= INT32_MAX
  out = Buffer.from_numpy(np.full(4, -1, np.int32), d)
  prg.check_args([out], (n - 3, axis), gs, ls)  # accepted
  prg(out, global_size=(1,), local_size=(1,), vals=(n - 3, axis))  # a tiny launch, then the big one's arguments by hand:
  launch = prg._prepare(prg._prepared, (out,), (n - 3, axis), gs, ls)
  assert math.prod(gs) == gs[axis]  # one axis of groups: group k along it is flat group k
  prg._fn(launch.argp, ctypes.c_uint64((n - 3) // ls[axis]), ctypes.c_uint64(gs[axis]))  # the groups holding the top 3 ids
  assert out.numpy().tolist() == [n - 3, n - 2, n - 1, -1]


# ---------------------------------------------------------------- D3: allocation sizes

@pytest.mark.parametrize("size,dtype", [(2**62 + 4, dtypes.float32), (2**61, dtypes.float64), (MAX_ALLOC_BYTES + 1, dtypes.uint8),
                                        (2**64, dtypes.uint8)])
def test_sizes_no_allocator_can_satisfy_are_out_of_memory(dev, size, dtype):
  with pytest.raises(OutOfMemoryError) as info: Buffer(dev, size, dtype)
  assert Device[dev].canonical in str(info.value)
  b = Buffer(dev, 4, dtypes.float32).copyin(np.arange(4, dtype=np.float32))  # the device still works
  assert b.numpy().tolist() == [0, 1, 2, 3]


def test_host_array_size_is_checked(dev):
  with pytest.raises(OutOfMemoryError): Device[dev].host_array((2**31, 2**31, 4), dtypes.float32)  # numpy's prod wraps to 0
  with pytest.raises(ValueError): Device[dev].host_array((4, -1))


def test_huge_tensor_is_out_of_memory_not_a_crash(dev):
  r = run_child(f"""
    from plugrt import Tensor
    from plugrt.errors import OutOfMemoryError
    for shape in [(2**31, 2**31), (2**62, 4), (2**47, 2**2)]:
      try: Tensor.zeros(shape, device={dev!r}).realize(); print("REALIZED", shape)
      except OutOfMemoryError as e: print("OOM", shape)
    print("ALIVE", (Tensor.zeros((3,), device={dev!r}) + 1).tolist())
  """)
  assert r.returncode == 0, f"the child died ({r.returncode}): {r.stdout[-2000:]}{r.stderr[-2000:]}"
  assert r.stdout.count("OOM") == 3 and "ALIVE [1.0, 1.0, 1.0]" in r.stdout, r.stdout


def test_from_blob_sizes_and_shapes_are_checked(dev):
  host = np.arange(8, dtype=np.float32)
  ptr = host.ctypes.data
  for size, err in [(-5, ValueError), (2.5, TypeError), (True, TypeError), ("8", TypeError)]:
    with pytest.raises(err): Buffer.from_blob(ptr, size, dtypes.float32, dev, keepalive=host)
  for shape, err in [((2, -5), ValueError), (-1, ValueError), (2.5, TypeError), ((2, 2.5), TypeError), ("8", TypeError)]:
    with pytest.raises(err): Tensor.from_blob(ptr, shape, dtypes.float32, dev, keepalive=host)
  with pytest.raises(ValueError): Buffer.from_blob(ptr, 2**62, dtypes.float32, dev, keepalive=host)  # 2**64 bytes: would wrap
  for bad in (1 << 64, 1 << 70, 0, -ptr):  # no address: the TypeError a bad pointer gets (2**64 was a raw OverflowError)
    with pytest.raises(TypeError, match="address"): Buffer.from_blob(bad, 8, dtypes.float32, dev, keepalive=host)
    with pytest.raises(TypeError, match="address"): Tensor.from_blob(bad, (8,), dtypes.float32, dev, keepalive=host)
  for shape, err in [((2, -5), ValueError), ((2.5,), TypeError)]:
    with pytest.raises(err): Tensor.zeros(shape, device=dev)
  b = Buffer(dev, 8, dtypes.float32)
  with pytest.raises(TypeError): b.view(size=2.5)


# ---------------------------------------------------------------- shared memory (issue 32, item 5)

@pytest.mark.parametrize("target", TARGETS)
def test_shared_arrays_past_the_device_limit_are_refused_at_program(target):
  """A group's shared arrays past what the device holds are a RenderError from program(), before any compile: on the CPU
  8 MiB of them overflowed the thread's stack (SIGSEGV), on PoCL past CL_DEVICE_LOCAL_MEM_SIZE an assertion aborted the
  process. In a child, so that a regression fails this test instead of ending pytest; the largest allowed array runs."""
  r = run_child(f"""
    from plugrt import Buffer, Device, KernelBuilder, dtypes
    from plugrt.errors import RenderError
    def big(n):
      b = KernelBuilder("big_shared")
      o, sh = b.buffer("o", dtypes.float32), b.shared("sh", dtypes.float32, n)
      i = b.local_id(0)
      sh[i * (n // 4) + (n // 4 - 1)] = i.cast(dtypes.float32)
      b.barrier()
      o[i] = sh[i * (n // 4) + (n // 4 - 1)]
      return b.finish()
    name, _, comp = {target!r}.partition(":")
    dev = Device[name]
    limit = dev.compiler_for(comp or None).max_shared_bytes
    for n in (1 << 21, 1 << 24):
      if limit is None or n * 4 <= limit: continue
      try: dev.program(big(n), comp or None)
      except RenderError as e: assert "shared arrays" in str(e) and str(limit) in str(e), e
      else: raise AssertionError(f"{{n * 4}} bytes of shared arrays past {{limit}} were compiled")
    if limit is not None:
      out = Buffer(dev, 4, dtypes.float32)
      dev.program(big(limit // 4), comp or None)(out, local_size=(4, 1, 1), wait=True)
      assert out.numpy().tolist() == [0, 1, 2, 3], out.numpy()
    print("ok", limit)
  """)
  assert r.returncode == 0 and "ok" in r.stdout, f"exit {r.returncode}: {r.stdout[-1000:]} {r.stderr[-2000:]}"
  if target.startswith(("CPU", "CL")): assert "ok None" not in r.stdout, f"{target} declares no shared-memory limit"


# ---------------------------------------------------------------- minor items

def test_bad_alloc_cache_variable_is_an_env_error_on_the_default_device():
  r = run_child("""
    from plugrt import Buffer
    from plugrt.errors import EnvError
    try: Buffer(None, 4)
    except EnvError as e: print("ENVERROR", e)
  """, PLUGRT_ALLOC_CACHE_MB="abc")
  assert r.returncode == 0 and "ENVERROR PLUGRT_ALLOC_CACHE_MB='abc'" in r.stdout, r.stdout + r.stderr


@pytest.mark.skipif("CPU" not in Device.available(), reason="no CPU device")
def test_cpu_threads_has_an_upper_bound():
  cores = len(os.sched_getaffinity(0))
  code = """
    from plugrt import Device
    from plugrt.errors import EnvError
    try: Device["CPU"]; print("OPENED")
    except EnvError as e: print("ENVERROR", e)
  """
  r = run_child(code, PLUGRT_CPU_THREADS="100000")
  assert r.returncode == 0 and "ENVERROR PLUGRT_CPU_THREADS=100000" in r.stdout, r.stdout + r.stderr
  r = run_child(code, PLUGRT_CPU_THREADS=str(4 * cores))
  assert r.returncode == 0 and "OPENED" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64])
def test_float_scalars_out_of_range_round_to_inf_everywhere(target, dtype):
  """One rule on every device: IEEE rounding, so a float past the dtype's largest value is +-inf (as numpy and the IR's
  cast from float64 have it), never a raw OverflowError on some devices and inf on others."""
  b = KernelBuilder("scalar_out")
  out, a = b.buffer("out", dtypes.float32), b.scalar("a", dtype)
  out[0] = a.cast(dtypes.float32)
  k = b.finish()
  from plugrt.errors import RenderError
  try: d, prg = program(target, k)
  except RenderError as e: pytest.skip(e.message)  # float64 or float16 on a WebGPU adapter without it
  o = Buffer(d, 1)
  for v, want in [(1e300, math.inf), (-1e300, -math.inf), (10**400, math.inf), (-(10**400), -math.inf), (1.5, 1.5)]:
    prg(o, vals=(v,))
    d.synchronize()
    assert o.numpy()[0] == want, (v, o.numpy()[0])


@pytest.mark.skipif("CPU:CLANG" not in TARGETS, reason="no clang here")
@pytest.mark.parametrize("cc", [shutil.which("false") or "/bin/false", shutil.which("true") or "/bin/true"])
def test_broken_c_compiler_is_a_toolchain_problem(monkeypatch, cc):
  from plugrt_cpu.clang import ClangCompiler
  usual_cc = os.environ.get("CC")  # the compiler CPU:CLANG found (a machine may name it by CC, with no clang on PATH)
  monkeypatch.setenv("CC", cc)
  comp = ClangCompiler(Device["CPU"].info)
  with pytest.raises(CompileError) as info: comp.compile_uncached(comp.render(saxpy()))
  msg = str(info.value)
  assert f"CC={cc}" in msg and "toolchain" in msg and "renderer bug" not in msg
  if usual_cc is None: monkeypatch.delenv("CC")
  else: monkeypatch.setenv("CC", usual_cc)
  comp = ClangCompiler(Device["CPU"].info)
  with pytest.raises(CompileError, match="renderer bug"): comp.compile_uncached("void f(void) { int x = ; }")  # a real source error


# ---------------------------------------------------------------- acknowledgement variables: exactly 1

ACK_REFUSED, ACK_BAD = [None, "", "0", " 0 "], ["yes", "true", "on", "YES", "2", "01", "1 1", "-1", "y"]


def test_an_acknowledgement_is_exactly_1():
  """PluginContext.acknowledged, the one rule of every acknowledgement variable: 1 acknowledges, unset, blank or 0
  refuses, anything else is an EnvError that names the variable and the accepted values (never consent)."""
  from plugrt.context import PluginContext
  from plugrt.errors import EnvError
  assert PluginContext({"ACK": "1"}).acknowledged("ACK") and PluginContext({"ACK": " 1\n"}).acknowledged("ACK")
  for v in ACK_REFUSED: assert not PluginContext({} if v is None else {"ACK": v}).acknowledged("ACK")
  for v in ACK_BAD:
    with pytest.raises(EnvError, match=f"ACK={v!r} is not an acknowledgement: only 1 acknowledges") as e:
      PluginContext({"ACK": v}).acknowledged("ACK")
    assert "set ACK=1 to acknowledge, or ACK=0" in e.value.hint


def _amd_fakes() -> object:
  sys.path.insert(0, str(ROOT / "plugins" / "ops_amd" / "tests"))
  try: return __import__("fake_amdgpu")
  finally: sys.path.pop(0)


@pytest.mark.parametrize("value", ACK_BAD)
def test_amd_takes_a_gpu_from_its_driver_only_on_exactly_1(tmp_path, value):
  """PLUGRT_AMD_ALLOW_UNBIND=yes used to count as consent to unbind amdgpu (PCI) or detach usb-storage (USB): it is an
  EnvError now, before anything is touched, and 0 or unset still refuses with the command to do it by hand."""
  pci, usb = pytest.importorskip("plugrt_amd_pci"), pytest.importorskip("plugrt_amd_usb")
  from plugrt.context import DeviceInfo, PluginContext
  from plugrt.errors import EnvError
  from plugrt_amd.device import AcknowledgementRequired
  fake = _amd_fakes()

  def info(iface: str, env: dict[str, str]) -> DeviceInfo: return DeviceInfo("AMD", 0, "LLVM", iface, context=PluginContext(env))
  devices, drivers = fake.make_sysfs(str(tmp_path / "sys"))
  kernel = fake.KernelWrites(devices, drivers)
  bridge = fake.FakeASM24(*fake.fake_gpu())
  with pytest.raises(EnvError, match=f"PLUGRT_AMD_ALLOW_UNBIND={value!r} is not an acknowledgement"):
    pci.open_pci(info("PCI", {"PLUGRT_AMD_ALLOW_UNBIND": value}), devices, drivers, kernel)
  with pytest.raises(EnvError, match=f"PLUGRT_AMD_ALLOW_UNBIND={value!r} is not an acknowledgement"):
    usb.open_usb(info("USB", {"PLUGRT_AMD_ALLOW_UNBIND": value}), bridge)
  assert kernel.log == [] and os.path.islink(os.path.join(devices, "0000:03:00.0", "driver")) and bridge.commands == 0
  for refused in ACK_REFUSED:
    env = {} if refused is None else {"PLUGRT_AMD_ALLOW_UNBIND": refused}
    with pytest.raises(AcknowledgementRequired, match="PLUGRT_AMD_ALLOW_UNBIND=1 is not set"):
      pci.open_pci(info("PCI", env), devices, drivers, kernel)
    with pytest.raises(AcknowledgementRequired, match="PLUGRT_AMD_ALLOW_UNBIND=1 is not set"): usb.open_usb(info("USB", env), bridge)
  assert kernel.log == [] and bridge.commands == 0


def test_every_acknowledgement_variable_is_read_by_the_one_rule():
  """No code reads an acknowledgement variable (PLUGRT_*_ALLOW_*) other than through PluginContext.acknowledged:
  a `flag` (which takes yes/true/on) or a raw environment lookup of one would bring the lenient reading back."""
  import ast
  found, wrong = set(), []
  for path in [*(ROOT / "core" / "plugrt").rglob("*.py"), *(ROOT / "plugins").rglob("plugrt_*/**/*.py")]:
    if "build" in path.relative_to(ROOT).parts: continue  # (setuptools' copies, made and removed by the install tests)
    tree = ast.parse(path.read_text())
    names = {t.id for n in ast.walk(tree) if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
             and isinstance(n.value.value, str) and re.fullmatch(r"PLUGRT_\w*_ALLOW_\w+", n.value.value)
             for t in n.targets if isinstance(t, ast.Name)}
    for n in ast.walk(tree):
      if not isinstance(n, ast.Call) or not n.args: continue
      arg = n.args[0]
      is_ack = (isinstance(arg, ast.Name) and arg.id in names) or (isinstance(arg, ast.Constant) and isinstance(arg.value, str)
                                                                    and re.fullmatch(r"PLUGRT_\w*_ALLOW_\w+", arg.value))
      if not is_ack: continue
      how = n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", "?")
      (found if how == "acknowledged" else wrong).add(f"{path.relative_to(ROOT)}:{n.lineno} {how}")
  assert found and not wrong, wrong
