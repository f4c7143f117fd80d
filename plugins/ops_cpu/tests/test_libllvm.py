"""PLUGRT_CPU_LIBLLVM: the LLVM compiler on the system's libLLVM (opt-in): found or refused with a typed reason,
the same kernels as llvmlite's, its own cache entries. The whole CPU suite also runs under
PLUGRT_CPU_LIBLLVM=system CPU_LLVM=1 (docs/performance.md, issue 17)."""
from __future__ import annotations

import numpy as np
import pytest

from plugrt import Buffer, KernelBuilder, dtypes
from plugrt.errors import DeviceUnavailable, Reason
from plugrt.registry import Registry
from plugrt_cpu.libllvm import MIN_VERSION, find_libllvm, library_version

pytest.importorskip("llvmlite")
SYSTEM, _ = find_libllvm("system")
needs_libllvm = pytest.mark.skipif(SYSTEM is None, reason=f"no libLLVM {MIN_VERSION}+ on this machine")


def cpu(env: dict[str, str]):
  return Registry(env={"PATH": "/usr/bin:/bin", **env}).load().open("CPU")


def saxpy():
  b = KernelBuilder("saxpy_sys")
  out, x, y, a = b.buffer("out", dtypes.float32), b.buffer("x", dtypes.float32), b.buffer("y", dtypes.float32), b.scalar("a", dtypes.float32)
  i = b.global_id(0)
  with b.if_(i < 1000): out[i] = a * x[i] + y[i]
  return b.finish()


def test_library_versions_from_file_names() -> None:
  assert library_version("/usr/lib/llvm-19/lib/libLLVM-19.so") == 19
  assert library_version("/usr/lib/x86_64-linux-gnu/libLLVM.so.19.1") == 19
  assert library_version("/usr/lib/x86_64-linux-gnu/libLLVM-15.0.6.so.1") == 15
  assert library_version("/usr/lib/libfoo.so") is None


@pytest.mark.parametrize("setting,why", [("relative/libLLVM.so", "absolute path"), ("/nonexistent/libLLVM-19.so", "no such file")])
def test_a_bad_setting_is_a_missing_toolchain(setting: str, why: str, tmp_path) -> None:
  dev = cpu({"PLUGRT_CPU_LIBLLVM": setting})
  with pytest.raises(DeviceUnavailable, match=why) as e: dev.compiler_for("LLVM")
  assert e.value.reason is Reason.MISSING_TOOLCHAIN
  assert dev.compiler_for("CLANG") is not None  # the other compiler is unaffected


def test_an_old_libllvm_is_refused(tmp_path) -> None:
  old = tmp_path / "libLLVM-14.so"
  old.write_bytes(b"")
  path, why = find_libllvm(str(old))
  assert path is None and "LLVM 14" in why


@needs_libllvm
def test_system_libllvm_compiles_the_same_kernels(tmp_path) -> None:
  env = {"PLUGRT_CACHE_DIR": str(tmp_path)}
  sys_dev, lite_dev = cpu({**env, "PLUGRT_CPU_LIBLLVM": "system"}), cpu(env)
  sys_comp, lite_comp = sys_dev.compiler_for("LLVM"), lite_dev.compiler_for("LLVM")
  assert type(sys_comp).__name__ == "LibLLVMCompiler" and sys_comp.api.path == SYSTEM
  k = saxpy()
  assert sys_comp.render(k) == lite_comp.render(k)  # one renderer
  assert sys_comp.cache_key(sys_comp.render(k)) != lite_comp.cache_key(lite_comp.render(k))  # its own entries
  rng = np.random.default_rng(0)
  x, y = rng.random(1024, np.float32), rng.random(1024, np.float32)
  want = np.float32(2.5) * x + y
  for dev in (sys_dev, lite_dev):
    prg = dev.program(k, "LLVM")
    out, bx, by = Buffer(dev, 1024).copyin(np.zeros(1024, np.float32)), Buffer(dev, 1024).copyin(x), Buffer(dev, 1024).copyin(y)
    prg(out, bx, by, global_size=(4,), local_size=(256,), vals=(2.5,), wait=True)
    got = out.numpy()
    assert np.array_equal(got[:1000], want[:1000]) and not got[1000:].any()


@needs_libllvm
def test_bad_ir_is_a_compile_error() -> None:
  from plugrt.errors import CompileError
  comp = cpu({"PLUGRT_CPU_LIBLLVM": "system"}).compiler_for("LLVM")
  with pytest.raises(CompileError, match="rejected"): comp.compile_uncached("define void @f() { ret i32 0 }")
  with pytest.raises(CompileError, match="rejected"): comp.compile_uncached("this is not IR")
  assert comp.compile_uncached("define void @f() {\n  ret void\n}\n")[:4] == b"\x7fELF"  # and it still works after
