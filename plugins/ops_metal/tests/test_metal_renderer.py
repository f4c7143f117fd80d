"""The MSL renderer: every conformance kernel (float64 ones without their float64 parts, which Metal refuses) compiled
as C++ by clang against tests/msl/metal_decls.h, a small model of Metal's declarations, so syntax and type errors
show here without a Mac; and the renderer's MSL-specific choices (signature attributes, address spaces, barriers,
bfloat only from MSL 3.1, no double)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from plugrt_metal.renderer import MetalRenderer

from plugrt.compiler import samples as K
from plugrt.dtype import dtypes
from plugrt.errors import RenderError

MSL = Path(__file__).parent / "msl"
CLANG = shutil.which("clang++")
SUPPORTED = [d for d in K.ALL if d is not dtypes.float64]


def metal_cases() -> list[K.Case]:
  """What the conformance suite runs on METAL: every case without float64 (casts and bitcasts keep their other dtypes)."""
  cases = [c for c in K.all_cases() if not c.name.startswith(("cast_", "bitcast_"))
           or c.name.startswith("bitcast_literal")]
  cases += [K.cast_case(d, to=SUPPORTED) for d in SUPPORTED]
  cases += [K.bitcast_case([d for d in g if d is not dtypes.float64]) for g in K.BITCAST_GROUPS]
  return [c for c in cases if not any(getattr(u.dtype, "base", u.dtype) is dtypes.float64 for u in c.kernel.uops)]


def check_msl(src: str, tmp_path: Path, name: str = "kernel") -> subprocess.CompletedProcess[str]:
  path = tmp_path / f"{name}.metal"
  path.write_text(src)
  return subprocess.run([CLANG, "-x", "c++", "-fsyntax-only", "-std=c++17", "-Wno-unknown-attributes", "-I", str(MSL),
                         "-include", "metal_decls.h", str(path)], capture_output=True, text=True, timeout=120)


needs_clang = pytest.mark.skipif(CLANG is None, reason="clang++ is not installed")


@needs_clang
@pytest.mark.parametrize("case", metal_cases(), ids=lambda c: c.name)
def test_every_conformance_kernel_compiles_as_msl(case: K.Case, tmp_path: Path) -> None:
  src = MetalRenderer("METAL", (3, 1)).render(case.kernel)
  r = check_msl(src, tmp_path, case.name)
  assert r.returncode == 0, f"{case.name}: the generated MSL does not compile against metal_decls.h:\n{r.stderr[-3000:]}\n\n{src}"


@needs_clang
def test_the_header_catches_what_metal_rejects(tmp_path: Path) -> None:
  """The check can fail: double, mismatched as_type sizes, half from float without a conversion, a write to a
  constant argument are errors against metal_decls.h as they are in Metal."""
  head = "#include <metal_stdlib>\nusing namespace metal;\n"
  bad = {"double": "kernel void k(device float* o [[buffer(0)]]) { double d = 1.0; o[0] = d; }",
         "as_type size": "kernel void k(device float* o [[buffer(0)]]) { o[0] = as_type<float>(ushort(1)); }",
         "implicit half": "kernel void k(device half* o [[buffer(0)]]) { o[0] = 1.5f; }",
         "constant write": "kernel void k(constant int& n [[buffer(0)]]) { n = 3; }",
         "unknown math": "kernel void k(device float* o [[buffer(0)]]) { o[0] = metal::precise::tanhh(o[0]); }"}
  for what, body in bad.items(): assert check_msl(head + body, tmp_path).returncode != 0, f"metal_decls.h accepts {what}"
  good = "kernel void k(device half* o [[buffer(0)]]) { o[0] = half(metal::precise::sin(float(o[1]))); }"
  assert check_msl(head + good, tmp_path).returncode == 0


def test_signature_address_spaces_and_barrier() -> None:
  src = MetalRenderer().render(K.reduce_case().kernel)
  assert ("kernel void reduce_groups(device int* out [[buffer(0)]], device int* last [[buffer(1)]], const device int* x [[buffer(2)]], "
          "uint3 plugrt_gid [[threadgroup_position_in_grid]], uint3 plugrt_lid [[thread_position_in_threadgroup]], "
          "uint3 plugrt_ngroups [[threadgroups_per_grid]], uint3 plugrt_lsize [[threads_per_threadgroup]]) {") in src
  lines = src.splitlines()
  start = next(i for i, ln in enumerate(lines) if ln.startswith("kernel void"))
  assert lines[start + 1] == "  threadgroup int part[32];"  # at kernel scope, before any block
  assert src.count("threadgroup_barrier(mem_flags::mem_device | mem_flags::mem_threadgroup);") == 2


def test_scalars_are_constant_references_after_the_buffers() -> None:
  src = MetalRenderer().render(K.saxpy_kernel(dtypes.float16))
  assert "constant half& a_arg [[buffer(3)]], constant int& n [[buffer(4)]]" in src and "float a = float(a_arg);" in src
  assert "device half* out [[buffer(0)]]" in src
  b = MetalRenderer().render(K.scalar_case(dtypes.bool).kernel)
  assert "constant uchar& s_arg [[buffer(1)]]" in b and "device uchar* out" in b


def test_halves_round_after_every_op_and_math_is_precise() -> None:
  src = MetalRenderer("METAL", (3, 1)).render(K.ops_case(dtypes.bfloat16).kernel)
  assert "float(bfloat(" in src and "metal::precise::sin(" in src and "metal::precise::divide(" in src
  assert "metal::fast::" not in src and "double" not in src and "long long" not in src and "__builtin" not in src


def test_float64_and_old_bfloat_are_refused_by_name() -> None:
  with pytest.raises(RenderError, match=r"METAL cannot run kernel saxpy: .* no float64"): MetalRenderer().render(K.saxpy_kernel(dtypes.float64))
  with pytest.raises(RenderError, match="no bfloat16"): MetalRenderer("METAL", (3, 0)).render(K.saxpy_kernel(dtypes.bfloat16))
  assert "bfloat" in MetalRenderer("METAL", (3, 1)).render(K.saxpy_kernel(dtypes.bfloat16))


def test_reserved_names_are_renamed() -> None:
  from plugrt import KernelBuilder
  b = KernelBuilder("names")
  dev, half = b.buffer("device", dtypes.float32), b.buffer("half", dtypes.float32)
  dev[0] = half[0]
  src = MetalRenderer().render(b.finish())
  assert "device float* device_ [[buffer(0)]]" in src and "const device float* half_ [[buffer(1)]]" in src
