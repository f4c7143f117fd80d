"""NV's device layer against a fake GPU (fake_gpu.py): the real plugrt-nv code opens the device, fills command slots,
rings, semaphores, QMDs and constant banks; threads standing in for the channels decode all of it. Kernels are
real cubins (ptxas, from the PTX renderer) whose effect a Python stand-in applies from the arguments it reads back
out of constant bank 0. Runs on any machine with ptxas."""
from __future__ import annotations

import os
import types
from typing import Any

import numpy as np
import pytest
from fake_gpu import FakeGPU

import plugrt_nv
from plugrt import Buffer, dtypes
from plugrt.compiler import samples as K
from plugrt.errors import EnvError
from plugrt.hookspecs import InterfaceSpec, Probe, hookimpl
from plugrt_nv import fastlaunch, hw
from plugrt_nv.iface import NVError
from plugrt_nvidia_toolchain import ptxas

pytestmark = pytest.mark.skipif(ptxas.path(os.environ) is None, reason="ptxas is not installed (pip install nvidia-cuda-nvcc)")


def fake_plugins(gpu: FakeGPU) -> list[types.ModuleType]:
  """plugrt-nv with its probe forced true (there is no driver here), and an interface plugin that opens `gpu`."""
  nv = types.ModuleType("fake_plugrt_nv")
  spec = plugrt_nv.plugrt_backends()[0]._replace(probe=lambda: Probe.found(1, "fake"))
  nv.plugrt_backends = hookimpl(lambda: [spec])  # type: ignore[attr-defined]
  for hook in ("plugrt_open_device", "plugrt_allocator", "plugrt_compiler", "plugrt_program", "plugrt_graph"):
    setattr(nv, hook, getattr(plugrt_nv, hook))
  iface = types.ModuleType("fake_nv_iface")
  iface.plugrt_interfaces = hookimpl(lambda: [InterfaceSpec("NV", "FAKE", lambda: Probe.found(1, "fake"))])  # type: ignore[attr-defined]
  iface.plugrt_open_interface = hookimpl(lambda device, interface: gpu)  # type: ignore[attr-defined]
  return [nv, iface]


@pytest.fixture(params=["native", "python"])
def fake(plugrt_registry, monkeypatch, request):
  """A fake GPU opened as NV, its resident launches made by the machine code (plugrt_nv.fastlaunch) or, where that
  cannot run, by the Python path: both run every test here."""
  monkeypatch.setenv("PLUGRT_NV_TIMEOUT", "5")
  if request.param == "python": monkeypatch.setattr(fastlaunch, "functions", lambda: None)
  gpu = FakeGPU()
  with plugrt_registry(fake_plugins(gpu), env={"NV": "1", "NV_PTX": "1", "PLUGRT_CACHE": "0", "PLUGRT_NV_TIMEOUT": "5"}) as reg:
    dev = reg.open("NV")
    assert dev.compiler.name == "PTX"  # the kernels are real cubins from ptxas (NVRTC may be missing)
    yield gpu, dev
  gpu.close()


def test_open_sets_up_both_channels(fake):
  gpu, dev = fake
  st = dev.info.state
  seen = {(ch, m & 0xFFFF, m >> 16): v for ch, m, v in gpu.log}
  assert seen[("compute", hw.Compute.SET_OBJECT, hw.SUBCH_COMPUTE)] == 0xCBC0 and seen[("copy", 0, hw.SUBCH_COPY)] == 0xC8B5
  assert ("compute", hw.Compute.SET_SHADER_LOCAL_MEMORY_A, hw.SUBCH_COMPUTE) in seen  # local memory for CUDA stacks
  assert st.completed() == st.value >= 3 and st.slm >= hw.LOCAL_ABI


def test_copies_through_the_copy_engine(fake):
  _, dev = fake
  x = np.random.default_rng(1).integers(0, 1 << 30, 3 << 20, dtype=np.int32)  # 12 MiB: several staging rounds with a small stage
  dev.allocator.staging.chunk = 1 << 20
  dev.allocator.kcopy = False  # large device-to-device copies would run as a kernel, which the fake cannot run: the copy engine here
  b = Buffer(dev, x.size, dtypes.int32).copyin(x)
  assert np.array_equal(b.numpy(), x)
  c = Buffer(dev, x.size, dtypes.int32)
  b.copy_to(c)
  assert np.array_equal(c.numpy(), x) and np.array_equal(c.view(16, offset=64).numpy(), x[16:32])


def test_launch_writes_qmd_and_arguments(fake):
  gpu, dev = fake
  n = 1000
  x = np.arange(n, dtype=np.float32)
  out, xb, yb = Buffer(dev, n, dtypes.float32), Buffer.from_numpy(x, dev), Buffer.from_numpy(2 * x, dev)
  prg = dev.program(K.saxpy_kernel())
  k = prg.kernel
  gpu.load(prg, K.saxpy_kernel())  # the fake runs it through the reference interpreter, on the arguments it reads back
  t = prg(out, xb, yb, global_size=(4, 1, 1), local_size=(256, 1, 1), vals=(3.0, n), wait=True)
  assert np.array_equal(out.numpy(), 5 * x) and isinstance(t, float) and t >= 0
  ln = gpu.launches[-1]
  assert ln.grid == (4, 1, 1) and ln.block == (256, 1, 1) and ln.regs == k.regs and ln.shared >= hw.SHARED_RESERVE
  # constant bank 0: the driver area (launch dimensions, shared and local windows, stack top), then the parameters
  assert ln.args(0, "<6I") == (*ln.block, *ln.grid) and ln.cbuf0 % 64 == 0 and ln.valid == 1 and ln.major == 4
  assert ln.args(0x18, "<QQI") == (0x7E00_0000_0000, 0x7F00_0000_0000, hw.STACK_TOP)
  assert ln.args(k.param_base, "<QQQfi") == (out.handle, xb.handle, yb.handle, 3.0, n)
  assert gpu.runner.runs[-1] == ("saxpy", (4, 1, 1), (256, 1, 1))
  for i in range(600):  # more launches than command slots: the ring wraps and waits for finished slots
    prg(out, xb, yb, global_size=(4, 1, 1), local_size=(256, 1, 1), vals=(float(i), n))
  dev.synchronize()
  assert np.array_equal(out.numpy(), 599 * x + 2 * x) and len(gpu.launches) == 601 and len(gpu.runner.runs) == 601


def test_python_stand_in_sees_the_launch(fake):
  """A stand-in registered by program address gets the decoded launch (for kernels the interpreter should not run)."""
  gpu, dev = fake
  prg = dev.program(K.saxpy_kernel())
  k = prg.kernel
  seen: list[tuple] = []
  gpu.kernels[prg.mem.va + k.entry] = lambda ln: seen.append(ln.args(k.param_base, "<QQQfi"))
  a = Buffer(dev, 4, dtypes.float32)
  prg(a, a, a, vals=(2.5, 4), wait=True)
  assert seen == [(a.handle, a.handle, a.handle, 2.5, 4)]


def test_dispatch_fault_reaches_the_caller(fake):
  """A dispatch the interpreter refuses (an access past the end of its memory) faults the fake's channel, and the
  launch's wait reports that as NV reports a real fault: an NVError with the reason, the device failed for good."""
  gpu, dev = fake
  prg = dev.program(K.saxpy_kernel())
  gpu.load(prg, K.saxpy_kernel())
  a = Buffer(dev, 4, dtypes.float32)
  with pytest.raises(NVError, match="compute: InterpreterError") as e:
    prg(a, a, a, global_size=(1 << 12, 1, 1), local_size=(256, 1, 1), vals=(1.0, 1 << 30), wait=True)
  assert not e.value.timed_out and "InterpreterError" in e.value.reason
  with pytest.raises(NVError, match="cannot run"): prg(a, a, a, vals=(1.0, 4))


def test_launches_and_copies_from_threads(fake):
  """Threads sharing one program (as Tensor users do) and the device's slots, rings and staging: each thread's launches
  read its own buffers and scalars, and its copies its own data."""
  import sys
  import threading
  gpu, dev = fake
  n, nthreads = 256, 6
  prg = dev.program(K.saxpy_kernel())
  gpu.load(prg, K.saxpy_kernel())
  errors: list[BaseException] = []
  start = threading.Barrier(nthreads)

  def work(t: int) -> None:
    try:
      start.wait()
      x = np.arange(n, dtype=np.float32) + 1000 * t
      xb, yb = Buffer.from_numpy(x, dev), Buffer.from_numpy(2 * x, dev)
      outs = [Buffer(dev, n, dtypes.float32) for _ in range(2)]
      for i in range(40):
        out = outs[i % 2]
        prg(out, xb, yb, global_size=(1, 1, 1), local_size=(n, 1, 1), vals=(float(t + i // 4), n))
        np.testing.assert_array_equal(out.numpy(), (t + i // 4) * x + 2 * x, err_msg=f"thread {t}, launch {i}")
    except BaseException as e: errors.append(e)

  interval = sys.getswitchinterval()
  sys.setswitchinterval(1e-6)
  try:
    threads = [threading.Thread(target=work, args=(t,)) for t in range(nthreads)]
    for th in threads: th.start()
    for th in threads: th.join()
  finally: sys.setswitchinterval(interval)
  if errors: raise errors[0]


def test_launches_without_the_lock_beside_locked_work_from_threads(fake, request):
  """A repeated launch submits without the device's lock (PreparedCall.unlocked: the machine code, declining while
  another thread holds the lock) while other threads copy and launch with changing arguments under it: every launch
  counts and every copy arrives. With the machine code, launches did take the unlocked path."""
  import sys
  import threading
  gpu, dev = fake
  _, prg = add1_program(fake)
  sax = dev.program(K.saxpy_kernel())
  gpu.load(sax, K.saxpy_kernel())
  counter = Buffer(dev, 4, dtypes.int32).copyin(np.zeros(4, np.int32))
  prg(counter, global_size=(1, 1, 1), local_size=(4, 1, 1))
  prg(counter, global_size=(1, 1, 1), local_size=(4, 1, 1))  # prepared, the fast path open
  real, took = prg._prepared.unlocked, [0]
  if real is not None:
    def counted() -> int:
      took[0] += bool(done := real())
      return done
    prg._prepared.unlocked = counted
  errors: list[BaseException] = []
  n, start = 1000, threading.Barrier(3)

  def repeats() -> None:
    start.wait()
    for _ in range(n): prg(counter, global_size=(1, 1, 1), local_size=(4, 1, 1))

  def copies() -> None:
    start.wait()
    rng = np.random.default_rng(1)
    for _ in range(150):
      data = rng.integers(0, 1 << 30, 64, dtype=np.int32)
      src, dst = Buffer.from_numpy(data, dev), Buffer(dev, 64, dtypes.int32)
      src.copy_to(dst)
      if not np.array_equal(dst.numpy(), data): errors.append(AssertionError("a copy beside unlocked launches differs"))

  def changing() -> None:
    start.wait()
    x = np.arange(64, dtype=np.float32)
    xb, yb, out = Buffer.from_numpy(x, dev), Buffer.from_numpy(2 * x, dev), Buffer(dev, 64, dtypes.float32)
    for i in range(150):
      sax(out, xb, yb, global_size=(1, 1, 1), local_size=(64, 1, 1), vals=(float(i), 64))
      if not np.array_equal(out.numpy(), i * x + 2 * x): errors.append(AssertionError(f"saxpy {i} beside unlocked launches differs"))

  def guarded(fn: Any) -> Any:
    def run() -> None:
      try: fn()
      except BaseException as e: errors.append(e)
    return run
  interval = sys.getswitchinterval()
  sys.setswitchinterval(1e-6)
  try:
    threads = [threading.Thread(target=guarded(f)) for f in (repeats, copies, changing)]
    for th in threads: th.start()
    for th in threads: th.join()
  finally: sys.setswitchinterval(interval)
  if errors: raise errors[0]
  assert counter.numpy().tolist() == [n + 2] * 4
  assert (took[0] > 0) == (request.node.callspec.params["fake"] == "native"), f"{took[0]} launches took the unlocked path"


def test_launch_checks(fake):
  _, dev = fake
  prg = dev.program(K.saxpy_kernel())
  out = Buffer(dev, 4, dtypes.float32)
  with pytest.raises(ValueError, match="threads per group"): prg(out, out, out, local_size=(2048, 1, 1), vals=(1.0, 4))
  with pytest.raises(ValueError, match="70000 groups along axis 1; NV runs at most 65535 "):
    prg(out, out, out, global_size=(1, 70000, 1), vals=(1.0, 4))


def test_fault_and_timeout_become_errors(fake):
  gpu, dev = fake
  a = Buffer(dev, 1, dtypes.float32)
  prg = dev.program(K.tiny_kernel())
  gpu.error = "compute channel: Xid 31: GPU memory page fault"
  gpu.hang = True
  with pytest.raises(NVError, match="Xid 31"): prg(a, a, wait=True)
  with pytest.raises(NVError, match="cannot run"): prg(a, a)  # the device stays failed, loudly


def test_timeout(fake, monkeypatch):
  gpu, dev = fake
  dev.info.state.timeout = 0.3
  gpu.hang = True
  a = Buffer(dev, 1, dtypes.float32)
  with pytest.raises(NVError, match=r"did not finish .* within 0.3 s"): a.numpy()


def test_blackwell_launches_with_qmd_v5_and_its_constant_bank(plugrt_registry, monkeypatch):
  """A Blackwell GPU (its classes, GR's SM version 0xa04: sm_120) gets QMD v5 launches whose constant bank 0 has the
  launch dimensions, windows and stack where sm_120 code reads them (block 0x360, grid 0x370, windows 0x2f0, stack
  0x37c) and the arguments where the sm_120 cubin says (0x380); the fake runs it through the reference interpreter."""
  if ptxas.path(os.environ) is None: pytest.skip("ptxas is not installed")
  monkeypatch.setenv("PLUGRT_NV_TIMEOUT", "5")
  gpu = FakeGPU({0xCEC0, 0xCAB5, 0xCA6F, 0xC761})
  gpu.sm_version = 0xA04
  try:
    with plugrt_registry(fake_plugins(gpu), env={"NV": "1", "NV_PTX": "1", "PLUGRT_CACHE": "0", "PLUGRT_NV_TIMEOUT": "5"}) as reg:
      dev = reg.open("NV")
      n = 300
      x = np.arange(n, dtype=np.float32)
      out, xb, yb = Buffer(dev, n, dtypes.float32), Buffer.from_numpy(x, dev), Buffer.from_numpy(2 * x, dev)
      prg = dev.program(K.saxpy_kernel())
      gpu.load(prg, K.saxpy_kernel())
      prg(out, xb, yb, global_size=(2, 1, 1), local_size=(256, 1, 1), vals=(3.0, n), wait=True)
      assert np.array_equal(out.numpy(), 5 * x)
      ln, k = gpu.launches[-1], prg.kernel
      assert ln.major == 5 and k.param_base == 0x380 and ln.grid == (2, 1, 1) and ln.block == (256, 1, 1)
      assert ln.args(0x360, "<3I") == ln.block and ln.args(0x370, "<3I") == ln.grid and ln.args(0, "<6I") == (0,) * 6
      assert ln.args(0x2F0, "<QQ") == (0x7E00_0000_0000, 0x7F00_0000_0000) and ln.args(0x37C, "<I") == (hw.STACK_TOP,)
      assert ln.args(k.param_base, "<QQQfi") == (out.handle, xb.handle, yb.handle, 3.0, n)
  finally: gpu.close()


@pytest.mark.parametrize("env,match", [({"PLUGRT_NV_TIMEOUT": "soon"}, "PLUGRT_NV_TIMEOUT='soon' is not a number"),
                                       ({"PLUGRT_NV_TIMEOUT": "0"}, "PLUGRT_NV_TIMEOUT='0' is out of range"),
                                       ({"PLUGRT_NV_SLOTS": "vram"}, "PLUGRT_NV_SLOTS='vram' is not one of mapped, host")])
def test_bad_settings_are_env_errors(plugrt_registry, monkeypatch, env, match):
  """The device reads its settings through its context (the registry's environment) and names a bad one."""
  for k, v in env.items(): monkeypatch.setenv(k, v)  # the process environment too, while DeviceInfo.context may fall back to it
  gpu = FakeGPU()
  with plugrt_registry(fake_plugins(gpu), env={"NV": "1", **env}) as reg, pytest.raises(EnvError, match=match): reg.open("NV")
  gpu.close()


def test_settings_from_the_context(plugrt_registry, monkeypatch):
  env = {"PLUGRT_NV_TIMEOUT": "7.5", "PLUGRT_NV_SLOTS": "HOST"}
  for k, v in env.items(): monkeypatch.setenv(k, v)
  gpu = FakeGPU()
  with plugrt_registry(fake_plugins(gpu), env={"NV": "1", "NV_PTX": "1", "PLUGRT_CACHE": "0", **env}) as reg:
    st = reg.open("NV").info.state
    assert st.timeout == 7.5 and st.slots_mem.kind == "host" and st.timeout_setting == "PLUGRT_NV_TIMEOUT"
  gpu.close()


def test_a_resident_launch_tells_equal_looking_scalars_apart(fake):
  """A resident launch is reused only for the very same arguments: -0.0 after 0.0 gives -inf, not the +inf of the
  launch prepared for 0.0 (0.0 == -0.0 in Python), and True after 1 for an int is refused as on a first call."""
  from plugrt import kernel

  @kernel
  def recip(out: dtypes.float32[:], a: dtypes.float32):
    out[0] = 1.0 / a

  gpu, dev = fake
  out = Buffer(dev, 1, dtypes.float32)
  prg = dev.program(recip.ir())
  gpu.load(prg, recip.ir())
  for a, want in ((0.0, np.inf), (-0.0, -np.inf), (-0.0, -np.inf), (0.0, np.inf), (2.0, 0.5), (2, 0.5), (True, 1.0)):
    prg(out, vals=(a,))
    dev.synchronize()
    assert out.numpy()[0] == want, f"1/{a!r}"


def test_a_resident_launch_sees_a_changed_list(fake):
  """Sizes and scalars given as lists the caller changes between launches are other launches, not the resident one."""
  from plugrt import kernel
  from plugrt.frontend.dsl import global_id

  @kernel
  def recip_each(out: dtypes.float32[:], a: dtypes.float32):
    out[global_id(0)] = 1.0 / a

  gpu, dev = fake
  out = Buffer(dev, 16, dtypes.float32).copyin(np.zeros(16, np.float32))
  prg = dev.program(recip_each.ir())
  gpu.load(prg, recip_each.ir())
  gs, vals = [1, 1, 1], [2.0]
  for _ in range(2): prg(out, global_size=gs, local_size=(4, 1, 1), vals=vals)
  gs[0], vals[0] = 3, 4.0
  prg(out, global_size=gs, local_size=(4, 1, 1), vals=vals)
  dev.synchronize()
  assert out.numpy().tolist() == [0.25] * 12 + [0.0] * 4


def test_a_graph_keeps_its_own_launches(fake):
  """An NV graph (the core's HCQGraph) holds resident launches of its own: direct launches of the same program with
  more argument sets than the program keeps resident entries for (which rewrites them) leave the graph's intact."""
  from plugrt import kernel
  from plugrt.frontend.dsl import global_id
  from plugrt.hwqueue import HCQGraph
  from plugrt.runtime import Launch

  @kernel
  def axpb(x: dtypes.int32[:], a: dtypes.int32, c: dtypes.int32):
    i = global_id(0)
    x[i] = x[i] * a + c

  gpu, dev = fake
  prg = dev.program(axpb.ir())
  gpu.load(prg, axpb.ir())
  xs = [Buffer(dev, 4, dtypes.int32).copyin(np.arange(4, dtype=np.int32)) for _ in range(2)]
  graph = dev.graph([Launch(prg, [xs[0]], (1, 1, 1), (4, 1, 1), (2, 1)), Launch(prg, [xs[1]], (1, 1, 1), (4, 1, 1), (3, 0))])
  assert isinstance(graph, HCQGraph)
  junk = Buffer(dev, 4, dtypes.int32).copyin(np.zeros(4, np.int32))
  for rep in range(3):
    graph()
    for k in range(2 * prg.ENTRIES): prg(junk, global_size=(1, 1, 1), local_size=(4, 1, 1), vals=(1, k + 10 * rep))
    dev.synchronize()
  want0, want1 = np.arange(4), np.arange(4)
  for _ in range(3): want0, want1 = want0 * 2 + 1, want1 * 3
  assert xs[0].numpy().tolist() == want0.tolist() and xs[1].numpy().tolist() == want1.tolist()


def add1_program(fake: tuple) -> tuple:
  """(device, program) of `x[i] += 1` on the fake GPU, whose engine runs it through the reference interpreter."""
  from plugrt import kernel
  from plugrt.frontend.dsl import global_id

  @kernel
  def add1(x: dtypes.int32[:]):
    i = global_id(0)
    x[i] = x[i] + 1

  gpu, dev = fake
  prg = dev.program(add1.ir())
  gpu.load(prg, add1.ir())
  return dev, prg


def test_a_graph_replay_tells_the_gpu_once(fake):
  """An NV graph queues every launch's words and ring entry, then fences and rings the doorbell once for the batch
  (HCQGraph with the prepared calls' `queue`), where launches one by one move GP_PUT each time; the results are the same."""
  from plugrt.runtime import Launch
  gpu, _ = fake
  dev, prg = add1_program(fake)
  x = Buffer(dev, 4, dtypes.int32).copyin(np.zeros(4, np.int32))
  st = dev.info.state
  ch, publishes, real = st.compute, [], st.publish_queued
  st.publish_queued = lambda: (publishes.append(ch.put_register.value), real())[1]
  try:
    graph = dev.graph([Launch(prg, [x], (1, 1, 1), (4, 1, 1)) for _ in range(3)])
    graph(); dev.synchronize()  # prepared, entries written, the fast path open
    publishes.clear()
    gpu.hang = True  # (the fake leaves the channel alone meanwhile)
    put = ch.put
    graph()
    assert ch.put == put + 3 and publishes == [put % ch.entries], f"a replay of 3 launches published {publishes} (ring at {put})"
    assert ch.put_register.value == (put + 3) % ch.entries
    for k in range(3):
      prg(x, global_size=(1, 1, 1), local_size=(4, 1, 1))
      assert ch.put_register.value == (put + 4 + k) % ch.entries, "a launch one by one did not move GP_PUT"
    assert len(publishes) == 1
  finally:
    gpu.hang = False
    st.publish_queued = real
  dev.synchronize()
  assert x.numpy().tolist() == [9] * 4


def test_a_call_that_finds_its_entry_again_takes_the_fast_path(fake):
  """Alternating between two argument sets prepares each call again (the core keeps the last one), and each finds the
  resident entry holding its bytes: every launch then takes the fast path, none the slot path."""
  dev, prg = add1_program(fake)
  xs = [Buffer(dev, 4, dtypes.int32).copyin(np.zeros(4, np.int32)) for _ in range(2)]
  slotted, real = [], prg._slot_launch
  prg._slot_launch = lambda *a: (slotted.append(a), real(*a))[1]  # (before anything is prepared: launches keep what they were made with)
  for k in range(4): prg(xs[k % 2], global_size=(1, 1, 1), local_size=(4, 1, 1))  # both entries written, the fast path open
  dev.synchronize()
  slotted.clear()
  for k in range(10): prg(xs[k % 2], global_size=(1, 1, 1), local_size=(4, 1, 1))
  assert not slotted, f"{len(slotted)} of 10 alternating launches took the slot path"
  dev.synchronize()
  assert xs[0].numpy().tolist() == xs[1].numpy().tolist() == [7] * 4


def test_a_launch_whose_slot_holds_its_words_writes_only_the_payload(fake):
  """Once every command slot holds a resident launch's fast-path words, repeating that launch finds them there (the
  device's slot_holds) and writes only the release's payload word; a copy's words in a slot clear its mark."""
  from plugrt_nv.device import SLOTS
  dev, prg = add1_program(fake)
  st = dev.info.state
  x = Buffer(dev, 4, dtypes.int32).copyin(np.zeros(4, np.int32))
  for _ in range(SLOTS + 8): prg(x, global_size=(1, 1, 1), local_size=(4, 1, 1))  # every slot written once
  dev.synchronize()
  generation = prg._prepared.entry.generation
  assert all(h == generation for h in st.slot_holds), "a slot the fast path wrote does not say it holds the launch's words"
  before = bytes(st.slots.view[:SLOTS * 4096])
  for _ in range(SLOTS): prg(x, global_size=(1, 1, 1), local_size=(4, 1, 1))
  dev.synchronize()
  after = bytes(st.slots.view[:SLOTS * 4096])
  changed = {i // 4 for i in range(len(after)) if after[i] != before[i]}
  assert {w % 1024 for w in changed} <= {36 // 4}, "a repeated launch changed more of its slot than the payload word"
  assert x.numpy().tolist() == [2 * SLOTS + 8] * 4
  Buffer(dev, 4, dtypes.int32).copy_to(Buffer(dev, 4, dtypes.int32))
  assert 0 in st.slot_holds  # the copy's slot


def test_a_slot_other_words_were_written_into_gets_the_launchs_words_again(fake):
  """Copies (the copy channel's words) and slot-path launches write slots the fast path filled before; a fast launch
  that comes round to such a slot writes its whole words again, so every launch counts."""
  from plugrt_nv.device import SLOTS
  dev, prg = add1_program(fake)
  x = Buffer(dev, 4, dtypes.int32).copyin(np.zeros(4, np.int32))
  src, dst = Buffer(dev, 4, dtypes.int32).copyin(np.arange(4, dtype=np.int32)), Buffer(dev, 4, dtypes.int32)
  n = 0
  for k in range(3 * SLOTS):
    prg(x, global_size=(1, 1, 1), local_size=(4, 1, 1))
    n += 1
    if k % 97 == 0: src.copy_to(dst)  # a copy in some slot; the launch after it takes the slot path
  dev.synchronize()
  assert x.numpy().tolist() == [n] * 4 and dst.numpy().tolist() == [0, 1, 2, 3]


def test_new_buffers_with_the_same_scalars_reuse_the_launchs_qmd(fake):
  """A call repeating the scalars and sizes with other buffers (a new result buffer each call, as Tensor's realize
  makes) puts only the buffers' addresses into the last launch's QMD and constants: no QMD field is set again, and
  each launch updates its own buffer."""
  dev, prg = add1_program(fake)
  calls, real = [], prg.qmd.set_dims
  prg.qmd.set_dims = lambda *a: (calls.append(a), real(*a))[1]
  xs = [Buffer(dev, 4, dtypes.int32).copyin(np.full(4, k, np.int32)) for k in range(6)]
  for x in xs: prg(x, global_size=(1, 1, 1), local_size=(4, 1, 1))
  dev.synchronize()
  assert len(calls) == 1, f"the QMD's sizes were set {len(calls)} times for 6 calls that differ only in their buffer"
  assert [x.numpy().tolist() for x in xs] == [[k + 1] * 4 for k in range(6)]


_AFTER_CLOSE = """
import sys
sys.path.insert(0, {here!r})
import numpy as np
from fake_gpu import FakeGPU
from test_nv_fake import fake_plugins
from plugrt import Buffer, dtypes
from plugrt.compiler import samples as K
from plugrt.registry import isolated
from plugrt_nv import fastlaunch
from plugrt_nv.iface import NVError
if {python}: fastlaunch.functions = lambda: None
gpu = FakeGPU()
with isolated(fake_plugins(gpu), env={{"NV": "1", "NV_PTX": "1", "PLUGRT_CACHE": "0"}}) as reg:
  dev = reg.open("NV")
  prg = dev.program(K.tiny_kernel())
  a, b = Buffer(dev, 1, dtypes.float32), Buffer(dev, 1, dtypes.float32).copyin(np.ones(1, np.float32))
  for _ in range(3): prg(a, b)  # prepared, the fast path open
  dev.synchronize()
  dev.close()
  try: prg(a, b)
  except NVError as e: print("raised:", e.message)
"""


@pytest.mark.parametrize("path", ["native", "python"])
def test_a_launch_after_the_device_closed_raises(path):
  """Closing the device takes the fast path away before its memory goes, so a prepared launch repeated afterwards is
  an NVError naming the closed device, not stores into memory that is no longer the GPU's (a crash: in a child)."""
  import subprocess
  import sys
  code = _AFTER_CLOSE.format(here=os.path.dirname(os.path.abspath(__file__)), python=path == "python")
  r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
  assert r.returncode == 0 and "raised:" in r.stdout and "was closed" in r.stdout, (r.returncode, r.stdout, r.stderr[-2000:])
