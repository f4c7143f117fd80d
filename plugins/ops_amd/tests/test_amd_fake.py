"""The AMD device end to end against the fake KFD: plugrt-amd opened through plugrt-amd-kfd with the fake as its
KFDOps seam, real code objects from AMD_LLVM loaded into executable VRAM, kernargs (explicit and hidden) written
into kernarg blocks, AQL dispatches the fake decodes, checks against the descriptor and runs through the reference
interpreter, SDMA copies through GTT staging; and the conformance suite on that path."""
from __future__ import annotations

import ctypes
import json
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
from amd_fixtures import fake_amd
from fake_kfd import GFX942

from plugrt import Buffer, dtypes
from plugrt.compiler import samples as K
from plugrt.context import PluginContext
from plugrt_amd.runtime import AMDAllocator, AMDProgram, AMDState
from plugrt_amd.toolchain import llvm_tool
from plugrt_amd_kfd.gpu import KFDGPU
from plugrt_amd_kfd.kfdev import KFDHardwareFault, KFDMemoryFault, KFDTimeout
from plugrt_testing.conformance import ConformanceSuite

pytestmark = pytest.mark.skipif(llvm_tool(PluginContext.from_process(), "ld.lld") is None, reason="ld.lld is not installed (apt-get install lld)")


@pytest.fixture
def amd():
  with fake_amd() as (fake, dev): yield fake, dev


def test_saxpy_through_aql(amd):
  fake, dev = amd
  # the device, allocator and program every interface gets, on the KFD interface's GPUInterface
  assert isinstance(dev.info.state, AMDState) and isinstance(dev.allocator, AMDAllocator) and isinstance(dev.info.state.iface, KFDGPU)
  n = 1000
  x = np.arange(n, dtype=np.float32)
  out, xb, yb = Buffer(dev, n, dtypes.float32), Buffer.from_numpy(x, dev), Buffer.from_numpy(2 * x, dev)
  prg = dev.program(K.saxpy_kernel())
  assert isinstance(prg, AMDProgram)
  t = prg(out, xb, yb, global_size=(4, 1, 1), local_size=(256, 1, 1), vals=(3.0, n), wait=True)
  assert np.array_equal(out.numpy(), 5 * x) and isinstance(t, float) and t >= 0
  p = fake.dispatches[-1]
  info = prg.info
  assert p.kernel_object == prg.kernel_object == prg.mem.va + info.kd_offset and p.kernel_object % 64 == 0
  assert (p.grid_size_x, p.workgroup_size_x) == (1024, 256)
  # the kernarg block: the explicit arguments at the code object's offsets, then the hidden block count and group size
  args = ctypes.string_at(p.kernarg_address, info.kernarg_size)
  assert args == bytes(info.kernargs([out.handle, xb.handle, yb.handle], [np.float32(3.0).tobytes(), np.int32(n).tobytes()], (4, 1, 1), (256, 1, 1)))
  assert fake.bos[prg.mem.va].kind == "vram" and fake.bos[out.handle].kind == "vram"
  assert fake.copies, "host copies go through SDMA"
  for i in range(600):  # more launches than kernarg blocks and AQL slots: both wrap and wait for finished ones
    prg(out, xb, yb, global_size=(4, 1, 1), local_size=(256, 1, 1), vals=(float(i % 7), n))
  dev.synchronize()
  assert np.array_equal(out.numpy(), 599 % 7 * x + 2 * x) and len(fake.dispatches) == 601


def test_arch_follows_the_opened_gpu():
  """On an MI300 (gfx942, wave64) the compiler builds for gfx942 and the fake accepts the wave64 descriptor."""
  with fake_amd(props=GFX942) as (fake, dev):
    assert dev.compiler.arch == "gfx942"
    prg = dev.program(K.saxpy_kernel())
    assert prg.code.arch == "gfx942" and prg.info.wavefront_size == 64
    x = np.arange(512, dtype=np.float32)
    out, xb = Buffer(dev, 512, dtypes.float32), Buffer.from_numpy(x, dev)
    prg(out, xb, xb, global_size=(2, 1, 1), local_size=(256, 1, 1), vals=(2.0, 512), wait=True)
    assert np.array_equal(out.numpy(), 3 * x) and fake.dispatches


def test_launches_and_copies_from_threads(amd):
  """Threads sharing one program and the device's kernarg blocks, AQL ring and staging buffers."""
  import threading
  _, dev = amd
  n, nthreads = 256, 4
  prg = dev.program(K.saxpy_kernel())
  errors: list[BaseException] = []

  def work(t: int) -> None:
    try:
      x = np.arange(n, dtype=np.float32) + 1000 * t
      xb, yb, out = Buffer.from_numpy(x, dev), Buffer.from_numpy(2 * x, dev), Buffer(dev, n, dtypes.float32)
      for i in range(20):
        prg(out, xb, yb, global_size=(1, 1, 1), local_size=(n, 1, 1), vals=(float(t + i), n))
        np.testing.assert_array_equal(out.numpy(), (t + i) * x + 2 * x, err_msg=f"thread {t}, launch {i}")
    except BaseException as e: errors.append(e)

  threads = [threading.Thread(target=work, args=(t,)) for t in range(nthreads)]
  for th in threads: th.start()
  for th in threads: th.join()
  if errors: raise errors[0]


def test_device_copy_and_views(amd):
  _, dev = amd
  x = np.random.default_rng(1).integers(0, 1 << 30, 5 << 20, dtype=np.int32)  # 20 MiB: more than one 16 MiB staging chunk
  b = Buffer(dev, x.size, dtypes.int32).copyin(x)
  assert np.array_equal(b.numpy(), x)
  c = Buffer(dev, x.size, dtypes.int32)
  b.copy_to(c)
  assert np.array_equal(c.numpy(), x) and np.array_equal(c.view(16, offset=64).numpy(), x[16:32])


def test_hidden_arguments_are_checked(amd):
  """The fake checks the hidden block count the code reads against the dispatch: a kernarg block that lies about it
  is the hardware fault a real GPU would turn into a wrong result."""
  fake, dev = amd
  prg = dev.program(K.saxpy_kernel())
  a = Buffer(dev, 256, dtypes.float32)
  prg(a, a, a, global_size=(1, 1, 1), local_size=(256, 1, 1), vals=(1.0, 256), wait=True)
  bc = prg.info.hidden("block_count_x")
  ctypes.c_uint32.from_address(ctypes.addressof(prg._prepared.args) + bc.offset).value = 7  # the prepared kernarg bytes
  with pytest.raises(KFDHardwareFault, match="GPU hang"):
    prg(a, a, a, global_size=(1, 1, 1), local_size=(256, 1, 1), vals=(1.0, 256), wait=True)
  assert "hidden_block_count_x" in fake.error
  with pytest.raises(KFDHardwareFault, match="cannot run"): prg(a, a, a, global_size=(1, 1, 1), local_size=(256, 1, 1), vals=(1.0, 256))


def test_fault_in_a_kernel_is_a_memory_fault(amd):
  _, dev = amd
  prg = dev.program(K.saxpy_kernel())
  a = Buffer(dev, 4, dtypes.float32)
  with pytest.raises(KFDMemoryFault):
    prg(a, a, a, global_size=(1 << 12, 1, 1), local_size=(256, 1, 1), vals=(1.0, 1 << 20), wait=True)


def test_hang_is_a_timeout(amd):
  fake, dev = amd
  st = dev.info.state
  st.iface.compute.timeout = 0.3
  prg = dev.program(K.tiny_kernel())
  a = Buffer(dev, 1, dtypes.float32)
  fake.hang = True
  with pytest.raises(KFDTimeout, match=r"within 0\.3 s"): prg(a, a, wait=True)


class _OnInstances:
  """The device's name on a test instance, "" on the class: plugrt's pytest plugin parametrizes a suite class by the
  process's registry, which has no AMD GPU; this module parametrizes the compiler itself and opens AMD on the fake."""
  def __get__(self, obj: Any, cls: Any) -> str: return "AMD" if obj is not None else ""


class TestAMDConformance(ConformanceSuite):
  device = _OnInstances()  # type: ignore[assignment]

  @pytest.fixture(params=["LLVM"])
  def compiler(self, request: pytest.FixtureRequest) -> str: return request.param

  @pytest.fixture
  def dev(self, compiler: str) -> Any:
    with fake_amd() as (_, dev): yield dev

  def test_fuzz(self) -> None:  # type: ignore[override]
    pytest.skip("plugrt's pytest plugin parametrizes fuzz seeds only for a suite whose class names a device of the process's "
                "registry, which has no AMD GPU")

  def test_entry_module_imports_only_stdlib(self) -> None:
    code = ("import importlib, json, sys\nimport plugrt.registry\nbefore = set(sys.modules)\nimportlib.import_module('plugrt_amd')\n"
            "from plugrt._entrypoints import foreign_modules\nprint(json.dumps(foreign_modules(sorted(set(sys.modules) - before), 'plugrt_amd')))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == []
