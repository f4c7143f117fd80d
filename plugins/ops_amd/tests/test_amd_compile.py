"""AMD_LLVM and AMD_HIP without a GPU: every conformance kernel built for gfx90a, gfx942, gfx1100 and gfx1201, its code
object parsed by plugrt_amd.codeobject and cross-checked with LLVM's own tools (llvm-readelf --notes, llvm-objdump -d);
the HIP C of every kernel checked by clang's HIP mode. Execution through the fake KFD: test_amd_fake.py."""
from __future__ import annotations

import ctypes
import functools
import math
import os
import subprocess

import numpy as np
import pytest
from amd_tools import hip_clang, need, readelf_kernels, run

from plugrt.compiler import samples as K
from plugrt.dtype import dtypes
from plugrt.errors import CompileError, EnvError, PluginError, RenderError
from plugrt_amd import codeobject, compiler_for, hw
from plugrt_amd.codeobject import unpackb

ENV = {"PATH": os.environ.get("PATH", ""), "PLUGRT_CACHE": "0"}
CASES = K.all_cases()


@functools.cache
def compiler(arch: str):
  return compiler_for(arch, env=ENV)


@functools.cache
def built(arch: str) -> dict[str, tuple[bytes, codeobject.CodeObject]]:
  """Every conformance kernel's code object for `arch` (compiled once per test session)."""
  c, out = compiler(arch), {}
  for case in CASES:
    blob = c.compile_uncached(c.render(case.kernel))
    out[case.kernel.name] = (blob, codeobject.parse(blob))
  return out


def shared_bytes(kernel) -> int:
  from plugrt.compiler.ir import Ops
  total = 0
  for u in kernel.uops:
    if u.op is Ops.SHARED: total = (total + 15) // 16 * 16 + u.arg[1] * u.dtype.base.itemsize
  return total


@pytest.mark.parametrize("arch", hw.TESTED_ARCHS)
def test_every_conformance_kernel_builds_a_code_object_v5(arch: str) -> None:
  a = hw.ARCHS[arch]
  for case in CASES:
    blob, co = built(arch)[case.kernel.name]
    assert blob[:4] == b"\x7fELF" and co.abi_version == hw.ELFABIVERSION_AMDGPU_HSA_V5 and co.code_object_version == 5
    assert co.arch == arch and co.e_flags & hw.EF_AMDGPU_MACH == a.mach and co.target.startswith(f"amdgcn-amd-amdhsa--{arch}")
    k = co.kernels[case.kernel.name]
    kd = k.descriptor
    # the descriptor agrees with the metadata, and with the kernel
    assert kd.kernarg_size == k.kernarg_size and kd.group_segment_fixed_size == k.group_segment_size == shared_bytes(case.kernel)
    assert kd.private_segment_fixed_size == k.private_segment_size
    assert k.wavefront_size == a.wavefront and kd.wavefront_size32 == (a.wavefront == 32)
    assert 0 < k.vgpr_count + k.agpr_count <= kd.vgpr_limit(arch, k.wavefront_size)
    if (limit := kd.sgpr_limit(arch)) is not None: assert 0 < k.sgpr_count <= limit
    else: assert kd.granulated_sgpr_count == 0
    assert "kernarg_segment_ptr" in kd.user_sgprs and k.max_flat_workgroup_size == 1024
    # the code entry lies in the executable segment
    text = next(s for s in co.segments if s.flags & 1)
    assert text.vaddr <= k.code_offset < text.vaddr + text.memsz
    # explicit arguments: buffers are 8-byte global pointers, scalars by value in their own size, in order
    sig = case.kernel.signature
    explicit = k.explicit_args
    assert [a.kind for a in explicit] == ["global_buffer"] * len(sig.buffers) + ["by_value"] * len(sig.scalars)
    assert [a.size for a in explicit] == [8] * len(sig.buffers) + [max(dt.itemsize, 1) for dt in sig.scalars]
    assert all(a.offset % min(a.size, 8) == 0 for a in explicit)
    # the launch geometry the renderer reads from the hidden arguments, where it reads it
    if (bc := k.hidden("block_count_x")) is not None:
      assert bc.offset == k.implicit_offset + hw.HIDDEN_BLOCK_COUNT
    if (gs := k.hidden("group_size_x")) is not None:
      assert gs.offset == k.implicit_offset + hw.HIDDEN_GROUP_SIZE and gs.size == 2
    assert k.implicit_offset <= k.kernarg_size


@pytest.mark.parametrize("arch", hw.TESTED_ARCHS)
def test_llvm_readelf_agrees_with_our_parser(arch: str, tmp_path) -> None:
  readelf = need("llvm-readelf")
  for name, (blob, co) in built(arch).items():
    out = run([readelf, "--notes"], blob, tmp_path)
    assert "Invalid AMDGPU Metadata" not in out
    theirs = readelf_kernels(out)[name]
    k = co.kernels[name]
    for key, ours in ((".kernarg_segment_size", k.kernarg_size), (".group_segment_fixed_size", k.group_segment_size),
                      (".private_segment_fixed_size", k.private_segment_size), (".sgpr_count", k.sgpr_count),
                      (".vgpr_count", k.vgpr_count), (".wavefront_size", k.wavefront_size)):
      assert int(theirs[key[1:]]) == ours, (name, key)
    assert [(int(a["offset"]), int(a["size"]), a["value_kind"]) for a in theirs["args"]] == [(a.offset, a.size, a.kind) for a in k.args]


@pytest.mark.parametrize("arch", hw.TESTED_ARCHS)
def test_llvm_objdump_shows_barriers_and_lds(arch: str, tmp_path) -> None:
  objdump = need("llvm-objdump")
  reduce = K.reduce_case()
  blob, co = built(arch)[reduce.kernel.name]
  asm = run([objdump, "-d", f"--mcpu={arch}"], blob, tmp_path)
  assert ("s_barrier_signal" if arch.startswith("gfx12") else "s_barrier") in asm
  assert "ds_store" in asm or "ds_write" in asm
  assert "ds_load" in asm or "ds_read" in asm
  assert co.kernels[reduce.kernel.name].group_segment_size > 0
  tiny = K.tiny_kernel()
  asm = run([objdump, "-d", f"--mcpu={arch}"], compiler(arch).compile_uncached(compiler(arch).render(tiny)), tmp_path, "tiny.co")
  assert "s_barrier" not in asm and "ds_" not in asm and "s_endpgm" in asm


def test_every_arch_in_the_table_has_its_mach_and_wave_size() -> None:
  for a in hw.ARCHS.values():
    co = codeobject.parse(compiler(a.name).compile_uncached(compiler(a.name).render(K.tiny_kernel())))
    assert co.arch == a.name and co.kernels["tiny"].wavefront_size == a.wavefront
    assert hw.arch_from_target_version(a.target_version) == a.name


def test_float64_transcendentals_come_from_our_helpers() -> None:
  """The AMDGPU backend ends the process on llvm.exp2/log2/sin of double: the renderer never emits them, and the compiler refuses them."""
  src = compiler("gfx1100").render(K.ops_case(dtypes.float64).kernel)
  assert "@__plugrt_amd_sin_f64" in src and "@llvm.sin.f64" not in src and "@llvm.exp2.f64" not in src
  with pytest.raises(CompileError, match=r"cannot lower llvm\.exp2\.f64"):
    compiler("gfx1100").compile_uncached("define amdgpu_kernel void @k(ptr addrspace(1) %o) {\n  %x = call double @llvm.exp2.f64(double 1.0)\n"
                                         "  ret void\n}\ndeclare double @llvm.exp2.f64(double)\n")


def test_float64_helpers_are_accurate_on_the_host() -> None:
  """The same helper IR, built for this CPU, within 2 ulp of numpy (itself within 1) over wide ranges, with the special values."""
  import llvmlite.binding as llvm

  from plugrt_amd.llvm_math import NAMES, helper
  llvm.initialize_native_target(); llvm.initialize_native_asmprinter()
  parts, decls = [], {}
  for n in NAMES:
    _, text, d = helper(n, "nounwind")
    parts.append(text.replace("define internal", "define")); decls.update(d)
  mod = llvm.parse_assembly("\n".join(parts + list(decls.values())))
  engine = llvm.create_mcjit_compiler(mod, llvm.Target.from_default_triple().create_target_machine())
  engine.finalize_object()
  fn = {n: ctypes.CFUNCTYPE(ctypes.c_double, ctypes.c_double)(engine.get_function_address(f"__plugrt_amd_{n}_f64")) for n in NAMES}
  rng = np.random.default_rng(3)
  inputs = {"exp2": (np.concatenate([rng.uniform(-60, 60, 2000), rng.uniform(-1074, 1023.9, 1000)]), np.exp2),
            "log2": (np.concatenate([np.exp(rng.uniform(-700, 700, 2000)), rng.uniform(0.5, 2, 1000), [5e-324, 1e-310]]), np.log2),
            "sin": (np.concatenate([rng.uniform(-10, 10, 2000), rng.uniform(-1e6, 1e6, 1000), rng.uniform(-1e-6, 1e-6, 200)]), np.sin)}
  for n, (xs, ref) in inputs.items():
    got = np.array([fn[n](float(x)) for x in xs])
    want = ref(xs)
    err = np.abs(got - want) / np.spacing(np.abs(want))
    assert err.max() <= 2, (n, xs[err.argmax()], got[err.argmax()], want[err.argmax()])
  specials = {"exp2": [(0.0, 1.0), (-0.0, 1.0), (math.inf, math.inf), (-math.inf, 0.0), (1024.0, math.inf), (-1075.0, 0.0), (-1074.0, 5e-324)],
              "log2": [(0.0, -math.inf), (-0.0, -math.inf), (math.inf, math.inf), (1.0, 0.0), (8.0, 3.0), (5e-324, -1074.0)],
              "sin": [(0.0, 0.0), (1e-300, 1e-300)]}
  for n, pairs in specials.items():
    for x, want in pairs: assert fn[n](x) == want, (n, x)
    assert math.isnan(fn[n](math.nan))
  assert math.isnan(fn["log2"](-1.0)) and math.isnan(fn["sin"](math.inf)) and math.isnan(fn["sin"](-math.inf))
  assert math.copysign(1, fn["sin"](-0.0)) < 0


def test_code_object_refusals() -> None:
  blob = compiler("gfx1100").compile_uncached(compiler("gfx1100").render(K.tiny_kernel()))
  with pytest.raises(PluginError, match="no ELF header"): codeobject.parse(b"not an elf" * 10)
  with pytest.raises(PluginError, match="past"): codeobject.parse(blob[: len(blob) // 2])
  wrong = bytearray(blob); wrong[18:20] = (62).to_bytes(2, "little")  # EM_X86_64
  with pytest.raises(PluginError, match="machine 62"): codeobject.parse(bytes(wrong))
  relocatable = compiler("gfx1100").compile_object(compiler("gfx1100").render(K.tiny_kernel()))
  with pytest.raises(PluginError, match="ELF type 1"): codeobject.parse(relocatable)


def test_image_places_segments_at_their_addresses() -> None:
  _, co = built("gfx1100")[K.reduce_case().kernel.name]
  img = co.image(0x7000_0000_0000)
  assert len(img) == co.image_size
  k = next(iter(co.kernels.values()))
  assert bytes(img[k.kd_offset:k.kd_offset + 64]) == k.descriptor.raw


def test_msgpack_decoder() -> None:
  assert unpackb(bytes([0x93, 0x01, 0xCC, 0xFF, 0xE0])) == [1, 255, -32]
  assert unpackb(bytes([0x82, 0xA1, 0x61, 0xC3, 0xA1, 0x62, 0xC0])) == {"a": True, "b": None}
  assert unpackb(b"\xcd\x01\x00") == 256 and unpackb(b"\xd1\xff\x00") == -256 and unpackb(b"\xcf" + (2**64 - 1).to_bytes(8, "big")) == 2**64 - 1
  assert unpackb(b"\xcb" + (1.5).hex().encode()[:0] + bytes.fromhex("3ff8000000000000")) == 1.5
  assert unpackb(b"\xd9\x03abc") == "abc" and unpackb(b"\xc4\x02\x00\x01") == b"\x00\x01"
  assert unpackb(b"\xdc\x00\x02\x01\x02") == [1, 2] and unpackb(b"\xde\x00\x01\x01\x02") == {1: 2}
  for bad in (b"\x92\x01", b"\xa5ab", b"\xcd\x01", b"\xc7\x01\x01\x00", b"\x01\x02", b""):
    with pytest.raises(ValueError): unpackb(bad)


def test_cache_key_names_llvm_arch_and_code_object_version() -> None:
  c, d = compiler("gfx1100"), compiler("gfx942")
  tc = c.toolchain()
  assert any(t.startswith("LLVM ") for t in tc) and "gfx1100" in tc and "code object v5" in tc and any("LLD" in t for t in tc)
  src = c.render(K.tiny_kernel())
  assert c.cache_key(src) == c.cache_key(src) != d.cache_key(src)


def test_arch_choice_and_refusals() -> None:
  assert compiler_for(env=ENV).arch == hw.DEFAULT_ARCH == "gfx1100"
  assert compiler_for("GFX90A:xnack-", env=ENV).arch == "gfx90a"
  with pytest.raises(EnvError, match=r"no architecture 'gfx1101x'.*did you mean gfx1101"): compiler_for("gfx1101x", env=ENV)
  with pytest.raises(CompileError, match=r"ld\.lld is not installed") as e: compiler_for(env={**ENV, "PLUGRT_AMD_LLD": "/nonexistent/ld.lld"})
  assert "lld" in e.value.hint
  from plugrt.compiler.lowering import serialize_groups
  with pytest.raises(RenderError): compiler("gfx1100").render(serialize_groups(K.reduce_case().kernel))


def test_hip_compiler_is_missing_here_with_its_reason() -> None:
  import plugrt_amd
  from plugrt.context import PluginContext
  from plugrt.errors import Reason
  ctx = PluginContext({"PATH": "", "PLUGRT_HIPRTC": "/nonexistent/libhiprtc.so"})
  p = plugrt_amd.probe_hip(ctx)
  assert not p.ok and p.reason is Reason.MISSING_TOOLCHAIN and "hiprtc" in p.detail and "ROCm" in p.hint
  with pytest.raises(CompileError, match="hiprtc"): compiler_for(compiler="HIP", env={"PLUGRT_HIPRTC": "/nonexistent/libhiprtc.so"})


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_hip_c_of_every_conformance_kernel_passes_clang(case: K.Case, tmp_path) -> None:
  from plugrt_amd.hip import HIPRenderer
  clang = hip_clang()
  if clang is None: pytest.skip("no clang with HIP support (apt-get install clang; CI has it)")
  src = tmp_path / "k.hip"
  src.write_text(HIPRenderer().render(case.kernel))
  r = subprocess.run([clang, "-x", "hip", "--cuda-gpu-arch=gfx90a", "-nogpulib", "-nogpuinc", "--cuda-device-only", "-fsyntax-only",
                      "-Werror=implicit-function-declaration", "-Werror=return-type", str(src)], capture_output=True, text=True, timeout=120)
  assert r.returncode == 0, r.stderr


def test_disk_cache_round_trip(tmp_path) -> None:
  c = compiler_for("gfx1201", env={"PATH": os.environ.get("PATH", ""), "PLUGRT_CACHE_DIR": str(tmp_path)})
  src = c.render(K.saxpy_kernel())
  first, hit = c.compile_cached(src)
  again, hit2 = c.compile_cached(src)
  assert not hit and hit2 and first == again and codeobject.parse(again).arch == "gfx1201"


def test_kernargs_fill_explicit_and_hidden_arguments() -> None:
  import struct
  co = codeobject.parse(compiler("gfx942").compile_uncached(compiler("gfx942").render(K.saxpy_kernel())))
  k = co.kernels[K.saxpy_kernel().name]
  seg = k.kernargs([0x1000, 0x2000, 0x3000], [struct.pack("<f", 2.5), struct.pack("<i", 77)], (4, 2, 1), (64, 1, 1))
  assert len(seg) == k.kernarg_size == k.descriptor.kernarg_size
  offs = [a.offset for a in k.explicit_args]
  assert [struct.unpack_from("<Q", seg, o)[0] for o in offs[:3]] == [0x1000, 0x2000, 0x3000]
  assert struct.unpack_from("<f", seg, offs[3])[0] == 2.5 and struct.unpack_from("<i", seg, offs[4])[0] == 77
  base = k.implicit_offset
  assert struct.unpack_from("<3I", seg, base + hw.HIDDEN_BLOCK_COUNT) == (4, 2, 1)
  assert struct.unpack_from("<3H", seg, base + hw.HIDDEN_GROUP_SIZE) == (64, 1, 1)
  with pytest.raises(ValueError, match="3 buffers and 2 scalars"): k.kernargs([1], [], (1, 1, 1), (1, 1, 1))
  with pytest.raises(ValueError, match="is 4 bytes, not 8"): k.kernargs([1, 2, 3], [bytes(8), bytes(4)], (1, 1, 1), (1, 1, 1))


def test_hiprtc_binding_against_a_fake_library(tmp_path) -> None:
  """plugrt_amd.hip's ctypes calls, their arguments and its error path, on a stand-in library (hiprtc itself never ran here)."""
  import plugrt_amd
  from plugrt.context import PluginContext
  cc = os.environ.get("CC", "cc") if not hip_clang() else hip_clang()
  lib = tmp_path / "libhiprtc.so"
  r = subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(lib), os.path.join(os.path.dirname(__file__), "fake_hiprtc.c")],
                     capture_output=True, text=True)
  if r.returncode: pytest.skip(f"no C compiler for the fake hiprtc: {r.stderr[:200]}")
  env = {"PLUGRT_HIPRTC": str(lib), "PLUGRT_CACHE": "0"}
  assert plugrt_amd.probe_hip(PluginContext(env)).ok
  c = compiler_for("gfx942", "HIP", env=env)
  src = c.render(K.saxpy_kernel())
  assert c.compile_uncached(src) == src.encode()  # the fake's "code" is the source
  opts = ctypes.CDLL(str(lib)).fake_last_options
  opts.restype = ctypes.c_char_p
  assert opts().decode().split() == ["--offload-arch=gfx942", "-O3", "-ffp-contract=off", "-mcode-object-version=5"]
  assert c.toolchain()[0] == "hiprtc 6.2" and "gfx942" in c.toolchain()
  with pytest.raises(CompileError, match="HIPRTC_ERROR_COMPILATION") as e: c.compile_uncached(src + "\nSYNTAX_ERROR\n")
  assert "bad syntax" in e.value.log
