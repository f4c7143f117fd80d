"""plugrt-nvidia-toolchain below the hardware: every lookup reads the environment it is given (never the process's),
the architecture and PTX version choices, and the float constants it shares with the WGSL renderer."""
from __future__ import annotations

import math
import os
import threading
import time
import types
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from plugrt.compiler.renderer import floatmath
from plugrt.context import PluginContext
from plugrt.errors import CompileError, RenderError
from plugrt.hookspecs import DeviceInfo
from plugrt_nvidia_toolchain import arch, jitlink, nvrtc, ptx_math, ptxas, toolkit


def _program(folder: Path, name: str, text: str = "#!/bin/sh\necho 'fake 1.0'\n") -> str:
  folder.mkdir(parents=True, exist_ok=True)
  (p := folder / name).write_text(text)
  p.chmod(0o755)
  return str(p)


# ---------------------------------------------------------------- the environment is a parameter

def test_lookups_read_the_given_environment_not_the_process(monkeypatch, tmp_path):
  for v in ("PLUGRT_NVRTC", "PLUGRT_NVJITLINK", "PLUGRT_PTXAS", "CUDA_HOME", "CUDA_PATH"):
    monkeypatch.setenv(v, str(tmp_path / "from-the-process" / v))
  lib = tmp_path / "libnvrtc.so.99"
  lib.write_bytes(b"")
  assert nvrtc.candidates({"PLUGRT_NVRTC": str(lib)})[0] == str(lib) and nvrtc.available({"PLUGRT_NVRTC": str(lib)})
  assert not any("from-the-process" in p for p in nvrtc.candidates({}))
  link = tmp_path / "libnvJitLink.so.13"
  link.write_bytes(b"")
  assert jitlink.path({"PLUGRT_NVJITLINK": str(link)}) == str(link)
  assert not any("from-the-process" in p for p in jitlink.candidates({}))
  home = tmp_path / "cuda"
  fake_ptxas = _program(home / "bin", "ptxas")
  assert toolkit.program("ptxas", {"CUDA_HOME": str(home), "PATH": ""}) == fake_ptxas
  assert ptxas.path({"CUDA_PATH": str(home), "PATH": ""}) == fake_ptxas
  assert ptxas.path({"PLUGRT_PTXAS": fake_ptxas, "PATH": ""}) == fake_ptxas
  on_path = _program(tmp_path / "path", "nvcc")
  assert toolkit.program("nvcc", {"PATH": str(tmp_path / "path")}) == on_path
  assert ptxas.version(fake_ptxas) == "fake 1.0"


def test_a_failing_ptxas_is_a_compile_error_with_its_output(tmp_path):
  bad = _program(tmp_path, "ptxas", "#!/bin/sh\necho 'ptxas fatal: unknown op' >&2\nexit 1\n")
  with pytest.raises(CompileError, match="ptxas failed to assemble the kernel for sm_90") as ei: ptxas.assemble(bad, ".entry k {}", "sm_90")
  assert "unknown op" in ei.value.log
  good = _program(tmp_path / "ok", "ptxas", '#!/bin/sh\nwhile [ "$1" != "-o" ]; do shift; done\nprintf CUBIN > "$2"\n')
  assert ptxas.assemble(good, ".entry k {}", "sm_90") == b"CUBIN"


def test_nvrtc_loads_once_for_threads_that_ask_together(monkeypatch):
  """Threads compiling their first kernels at the same moment all find NVRTC: a loader that marks itself 'tried' before
  it finishes would tell every other thread 'NVRTC is not installed' (8 threads' first Tensor ops on the H100 did)."""
  class FakeLib:
    def __getattr__(self, name: str) -> types.SimpleNamespace:
      setattr(self, name, v := types.SimpleNamespace())
      return v

  def slow_load(path: str) -> FakeLib:
    time.sleep(0.05)  # the window in which other threads ask
    return FakeLib()
  monkeypatch.setattr(nvrtc, "_lib", None)
  monkeypatch.setattr(nvrtc, "candidates", lambda env: [env["PLUGRT_NVRTC"]])
  monkeypatch.setattr(nvrtc.ctypes, "CDLL", slow_load)
  got: list = []
  threads = [threading.Thread(target=lambda: got.append(nvrtc.library({"PLUGRT_NVRTC": "/opt/fake/libnvrtc.so.13"}))) for _ in range(4)]
  for t in threads: t.start()
  for t in threads: t.join()
  assert len(got) == 4 and all(isinstance(lib, FakeLib) and lib.path == "/opt/fake/libnvrtc.so.13" for lib in got), got


def test_nvrtc_missing_is_a_compile_error(monkeypatch):
  monkeypatch.setattr(nvrtc, "_lib", False)  # looked for, not found
  assert nvrtc.library({}) is None
  with pytest.raises(CompileError, match="NVRTC") as ei: nvrtc.compile_cubin('extern "C" __global__ void k() {}', "sm_90", {})
  assert ei.value.hint == nvrtc.HINT
  assert nvrtc.kernel_name('extern "C" __global__ void saxpy(float* o) {}') == "saxpy"


# ---------------------------------------------------------------- targets

def test_architecture_and_ptx_version():
  assert arch.parse_arch("sm_90a") == (90, "a") and arch.min_ptx_version("sm_100") == "8.6"
  assert arch.ptx_version("sm_75") == arch.BASE_PTX_VERSION == "8.0"  # at least 8.0 ...
  assert arch.ptx_version("sm_120") == "8.7" and arch.ptx_version("sm_103") == "8.8"  # ... and what the target needs
  with pytest.raises(RenderError, match="sm_XY"): arch.ptx_version("gfx1100")
  asked = DeviceInfo("NV", 0, "PTX", arch="sm_80", context=PluginContext({}))
  assert arch.device_arch(asked) == "sm_80"
  opened = DeviceInfo("NV", 0, "PTX", context=PluginContext({}))
  assert arch.device_arch(opened) == arch.DEFAULT_ARCH
  opened.state = type("State", (), {"arch": "sm_120"})()  # type: ignore[assignment]
  assert arch.device_arch(opened) == "sm_120"


# ---------------------------------------------------------------- the shared float constants

def test_float_constants_are_exact():
  assert math.isclose(float(floatmath.pi()), math.pi, rel_tol=0, abs_tol=0) and float(floatmath.ln2()) == math.log(2)
  assert abs(floatmath.pi(400) - floatmath.pi()) < Fraction(2, 1 << 400)
  c = ptx_math.constants()
  assert sum(map(Fraction, c.pio2_f64)) - floatmath.pi() / 2 < Fraction(1, 1 << 150)
  # the 2/pi table: the same bits whatever the word size, after the padding
  w32 = floatmath.two_over_pi_words(8, 32, 16)
  w64 = floatmath.two_over_pi_words(4, 64, 16)
  assert int("".join(f"{w:032b}" for w in w32), 2) == int("".join(f"{w:064b}" for w in w64), 2)
  assert w32[0] >> 16 == 0 and Fraction(int("".join(f"{w:032b}" for w in w32), 2), 1 << (256 - 16)) - 2 / floatmath.pi() < Fraction(1, 1 << 230)
  assert c.table == floatmath.two_over_pi_words(ptx_math.TABLE_WORDS, 64, ptx_math.TABLE_PAD)


def test_round_f32_matches_numpy():
  rng = np.random.default_rng(0)
  for x in [*rng.standard_normal(2000) * 10.0 ** rng.integers(-30, 30, 2000), 1 + 2 ** -24, 1 + 3 * 2 ** -24, -(1 + 2 ** -24)]:
    assert floatmath.round_f32(Fraction(float(x))) == float(np.float32(x)), x  # numpy rounds a double to nearest even
  assert floatmath.round_f32_ratio(1, 3) == float(np.float32(1 / 3)) and floatmath.round_f32(0) == 0.0
  assert floatmath.f32_bits(floatmath.SIN_F32_EXACT_BELOW) == 0x39800000


def test_ptx_math_uses_the_shared_sine_bound():
  assert ptx_math.f32_hex(floatmath.SIN_F32_EXACT_BELOW) in ptx_math.helper_ptx("sin_f32")


def test_no_process_environment_in_the_toolchain():
  """The toolchain's sources never read os.environ or os.getenv: callers pass the environment."""
  root = Path(nvrtc.__file__).parent
  for path in root.glob("*.py"):
    text = path.read_text()
    assert "os.environ" not in text and "getenv" not in text, path.name
  assert os.path.basename(root) == "plugrt_nvidia_toolchain"
