"""The WGSL renderer on its own: no engine, no adapter, no GPU."""
from __future__ import annotations

import re

import pytest

pytest.importorskip("plugrt_webgpu")

from plugrt.compiler import samples as K
from plugrt.compiler.ir import _KINDS, BINARY, COMPARE, UNARY, Kernel, KernelBuilder, Ops, UOp
from plugrt.dtype import DType, PtrDType, dtypes
from plugrt.errors import RenderError
from plugrt_webgpu.wgsl import BEGIN, END, BufferParam, WGSLRenderer, buffer_section, parse_header, specialize

NARROW = tuple(d for d in K.ALL if d not in (dtypes.int64, dtypes.uint64, dtypes.float64))
R = WGSLRenderer("WEBGPU", f16=True, max_storage_buffers=32)


def one_op(op: Ops, dt: DType) -> str:
  """A kernel applying `op` to loaded values of dt, rendered."""
  b = KernelBuilder(f"k_{op.name.lower()}_{dt.name}")
  res_dt = dtypes.bool if op in COMPARE else dt
  out, x, y = b.buffer("out", res_dt), b.buffer("x", dt), b.buffer("y", dt)
  i = b.global_id(0)
  out[i] = b.alu(op, x[i]) if op in UNARY else b.alu(op, x[i], y[i])
  return R.render(b.finish())


SPELLING = {Ops.ADD: " + ", Ops.SUB: " - ", Ops.MUL: " * ", Ops.DIV: " / ", Ops.IDIV: " / ", Ops.MOD: " % ", Ops.MAX: "max(", Ops.MIN: "min(",
            Ops.SHL: " << ", Ops.SHR: " >> ", Ops.CMPLT: " < ", Ops.CMPLE: " <= ", Ops.CMPEQ: " == ", Ops.CMPNE: " != ",
            Ops.EXP2: "exp2(", Ops.LOG2: "log2(", Ops.SIN: "pr_sin(", Ops.SQRT: "sqrt(", Ops.TRUNC: "trunc(", Ops.RECIP: " / ", Ops.NEG: "(-"}


@pytest.mark.parametrize("dt", NARROW, ids=lambda d: d.name)
def test_every_op_on_every_dtype_renders(dt: DType) -> None:
  for op in sorted(UNARY | BINARY, key=lambda o: o.value):
    if dt.kind not in _KINDS[op]: continue
    src = one_op(op, dt)
    assert parse_header(src).entry == f"k_k_{op.name.lower()}_{dt.name}"
    special = (op is Ops.NEG and dt.kind == "u") or (op is Ops.MOD and dt.kind == "i") or (dt is dtypes.bool and op in (Ops.CMPLT, Ops.CMPLE))
    if op in SPELLING and not special:
      assert SPELLING[op] in src, (op, dt, src)
    if op is Ops.NEG and dt.kind == "u": assert "(0u - " in src
    if op is Ops.MOD and dt.kind == "i": assert re.search(r"\(v\d+ - \(v\d+ / v\d+\) \* v\d+\)", src)  # never `%` on signed values
    if op is Ops.NOT: assert ("(!" if dt is dtypes.bool else "(~") in src
    if op is Ops.XOR and dt is dtypes.bool: assert " != " in src and " ^ " not in src  # WGSL has no ^ on bool
    if dt is dtypes.bfloat16 and op not in COMPARE | {Ops.MAX, Ops.MIN}: assert "pr_bf16(" in src, op
    if dt in (dtypes.int8, dtypes.int16) and op in (Ops.ADD, Ops.SUB, Ops.MUL, Ops.SHL, Ops.NEG, Ops.IDIV):
      assert f"pr_sx{dt.bits}(" in src.split("fn k_", 1)[1], op  # wraps after the op
    if dt in (dtypes.uint8, dtypes.uint16) and op in (Ops.ADD, Ops.SUB, Ops.MUL, Ops.SHL):
      assert f"& {hex((1 << dt.bits) - 1)}u)" in src.split("fn k_", 1)[1], op


@pytest.mark.parametrize("dt", NARROW, ids=lambda d: d.name)
def test_the_core_cases_render(dt: DType) -> None:
  for case in (K.ops_case(dt), K.scalar_case(dt)):
    src = R.render(case.kernel)
    assert src.startswith("// plugrt-wgsl 1 entry=") and src.count(BEGIN) == 1 and src.count(END) == 1
    assert ("enable f16;" in src) == (dt is dtypes.float16)
    assert "i64" not in src and "f64" not in src and "u64" not in src


def test_control_flow_shared_and_barriers_render() -> None:
  for case in (K.control_case(), K.reverse_case(), K.reduce_case(), K.grid3d_case()):
    src = R.render(case.kernel)
    assert src.count("{") == src.count("}")
  src = R.render(K.reduce_case().kernel)
  assert "var<workgroup> " in src and "array<i32, 32>" in src
  assert "storageBarrier();\n" in src and "workgroupBarrier();" in src
  assert re.search(r"for \(var v\d+: i32 = v\d+; v\d+ < v\d+; v\d+ = v\d+ \+ 1i\) \{", src)
  src = R.render(K.grid3d_case().kernel)
  for special in ("pr_wg.z", "pr_li.y", "pr_ng.x", "pr_lx", "pr_ly"): assert special in src
  assert "@compute @workgroup_size(pr_lx, pr_ly, pr_lz)" in src and "override pr_lz: u32 = 1u;" in src


@pytest.mark.parametrize("dt", [dtypes.int64, dtypes.uint64, dtypes.float64], ids=lambda d: d.name)
def test_64_bit_dtypes_fail_at_render_time_naming_dtype_and_device(dt: DType) -> None:
  r = WGSLRenderer("WEBGPU:0", f16=True, adapter="WGPU on llvmpipe")
  for kernel in (K.ops_case(dt).kernel, K.scalar_case(dt).kernel, K.cast_case(dtypes.int32).kernel):
    with pytest.raises(RenderError) as ei:
      r.render(kernel)
    msg = str(ei.value)
    assert "WEBGPU:0 (WGPU on llvmpipe) cannot run kernel" in msg and "64-bit" in msg
    assert dt.name in msg or kernel.name.startswith("cast")
  # a 64-bit value used only inside the kernel (a cast through int64) is refused too
  b = KernelBuilder("through64")
  out, x = b.buffer("out", dtypes.int32), b.buffer("x", dtypes.int32)
  out[0] = x[0].cast(dt).cast(dtypes.int32)
  with pytest.raises(RenderError, match=f"uses {dt.name} \\(in CAST\\)"): r.render(b.finish())


def test_float16_needs_shader_f16() -> None:
  r = WGSLRenderer("WEBGPU", f16=False)
  with pytest.raises(RenderError, match="float16 needs the adapter feature shader-f16"): r.render(K.ops_case(dtypes.float16).kernel)
  assert "enable f16;" in WGSLRenderer("WEBGPU", f16=True).render(K.ops_case(dtypes.float16).kernel)
  r.render(K.ops_case(dtypes.bfloat16).kernel)  # bfloat16 is emulated in f32: no feature needed


def test_device_limits_fail_at_render_time() -> None:
  with pytest.raises(RenderError, match="takes 16 buffers and the device allows 10 storage buffers"):
    WGSLRenderer("WEBGPU", f16=True, max_storage_buffers=10).render(K.bitcast_case(K.BITCAST_GROUPS[0]).kernel)
  b = KernelBuilder("big_shared")
  out = b.buffer("out", dtypes.float32)
  sh = b.shared("tile", dtypes.float32, 8192)
  sh[0] = 1.0
  out[0] = sh[0]
  with pytest.raises(RenderError, match="shared arrays take 32768 bytes and the device allows 16384"): WGSLRenderer("WEBGPU").render(b.finish())
  spill = Kernel("spilled", (UOp(Ops.SPILL, PtrDType(dtypes.int32, "private"), (UOp(Ops.CONST, dtypes.int32, (), 4),)),))
  with pytest.raises(RenderError, match="spill"): R.check(spill)


def test_small_dtypes_are_packed_and_written_with_atomics() -> None:
  src = R.render(K.ops_case(dtypes.uint8).kernel)
  head = parse_header(src)
  assert [p.token for p in head.buffers] == ["1w", "1w", "1r", "1r", "1r", "1r", "1r"]  # out and cmp (bool) are written
  assert src.count("array<atomic<u32>>") == 2 and src.count("var<storage, read_write>") == 7
  assert "atomicAnd(&pb0[b >> 2u], ~(0xffu << s)); atomicOr(&pb0[b >> 2u], (v & 0xffu) << s);" in src
  assert "fn st2(" not in src  # read-only arguments get no store accessor
  src16 = R.render(K.ops_case(dtypes.int16).kernel)
  assert "let b = i * 2u + pa.w[0].x;" in src16 and "0xffffu" in src16
  f32 = R.render(K.ops_case(dtypes.float32).kernel)  # 4-byte dtypes are plain words; the bool comparison buffer is packed
  assert "var<storage, read_write> pb0: array<u32>;" in f32 and "var<storage, read_write> pb1: array<atomic<u32>>;" in f32
  assert "fn st0(i: u32, v: u32) { pb0[i + pa.w[0].x] = v; }" in f32


def test_constants_are_lets_never_folded_literals() -> None:
  b = KernelBuilder("consts")
  out = b.buffer("out", dtypes.int32)
  f = b.buffer("f", dtypes.float32)
  out[0] = b.const(2147483647, dtypes.int32) + b.const(1, dtypes.int32)  # wraps at run time; folded, WGSL would reject it
  out[1] = b.const(-(1 << 31), dtypes.int32)
  f[0] = b.const(float("inf"), dtypes.float32)
  f[1] = b.const(float("nan"), dtypes.float32)
  f[2] = b.const(float("-inf"), dtypes.float32)
  src = R.render(b.finish())
  assert re.search(r"let v\d+: i32 = 2147483647i;", src) and re.search(r"let v\d+: i32 = \(v\d+ \+ v\d+\);", src)
  assert "(-2147483647i - 1i)" in src and "-2147483648" not in src
  assert "= 0x7f800000u;" in src and "= 0x7fc00000u;" in src and "= 0xff800000u;" in src  # inf/nan come from private variables
  assert "inf" not in src.lower().replace("info", "") and "nan" not in src.lower()


def test_header_roundtrip_and_specialisation_for_aliased_views() -> None:
  src = R.render(K.saxpy_kernel())
  head = parse_header(src)
  assert head.entry == "k_saxpy" and [p.token for p in head.buffers] == ["4w", "4r", "4r"] and head.nscalars == 2
  assert head.uniform_words == 5 and head.uniform_bytes == 32
  merged = specialize(src, (0, 0, 1))  # out and x are views of one allocation
  assert merged.count("var<storage, read_write>") == 2 and "@binding(3)" not in merged
  assert "fn ld1(i: u32) -> u32 { return pb0[i + pa.w[0].y]; }" in merged and "fn ld2(i: u32) -> u32 { return pb1[i + pa.w[0].z]; }" in merged
  assert merged.replace(buffer_section(head.buffers, (0, 0, 1)), "") == src.replace(buffer_section(head.buffers), "")
  # a packed written argument makes its binding atomic for every argument sharing it
  sec = buffer_section([BufferParam(4, False), BufferParam(1, True)], (0, 0))
  assert sec.count("var<storage") == 1 and "array<atomic<u32>>" in sec and "fn ld0(i: u32) -> u32 { return atomicLoad(&pb0[i + pa.w[0].x]); }" in sec
  with pytest.raises(ValueError, match="not a plugrt WGSL kernel"): parse_header("@compute fn main() {}")


def test_casts_and_bitcasts_spell_wgsl_conversions() -> None:
  r = WGSLRenderer("WEBGPU", f16=True)
  assert r.cast("x", dtypes.uint32, dtypes.int32) == "bitcast<i32>(x)"
  assert r.cast("x", dtypes.float32, dtypes.int8) == "pr_sx8(i32(x))"
  assert r.cast("x", dtypes.int32, dtypes.uint8) == "(bitcast<u32>(x) & 0xffu)"
  assert r.cast("x", dtypes.int32, dtypes.bfloat16) == "pr_bf16(f32(x))"  # through float32, as the IR's interpreter does
  assert r.cast("x", dtypes.int32, dtypes.float16) == "f16(x)"           # one rounding
  assert r.cast("x", dtypes.float32, dtypes.bool) == "((bitcast<u32>(x) & 0x7fffffffu) != 0u)"  # NaN is true: the bits, not a compare
  assert r.cast("h", dtypes.float16, dtypes.bool) == "((bitcast<u32>(f32(h)) & 0x7fffffffu) != 0u)"
  assert r.cast("i", dtypes.int8, dtypes.bool) == "(i != 0i)" and r.cast("b", dtypes.bool, dtypes.float16) == "select(0.0h, 1.0h, b)"
  assert r.bitcast("x", dtypes.float32, dtypes.uint32) == "bitcast<u32>(x)" and r.bitcast("x", dtypes.int32, dtypes.int32) == "x"
  assert r.bitcast("x", dtypes.bfloat16, dtypes.int16) == "pr_sx16(bitcast<i32>((bitcast<u32>(x) >> 16u)))"
  assert r.bitcast("x", dtypes.int16, dtypes.float16) == "pr_f16from((bitcast<u32>(x) & 0xffffu))"
  assert r.bitcast("x", dtypes.uint8, dtypes.int8) == "pr_sx8(bitcast<i32>(x))"
  # bool -> 8-bit integer: the bool's byte, 0 or 1 (WGSL has no bitcast of a bool); 8-bit integer -> bool: != 0
  assert r.bitcast("b", dtypes.bool, dtypes.int8) == "pr_sx8(bitcast<i32>(select(0u, 1u, b)))"
  assert r.bitcast("b", dtypes.bool, dtypes.uint8) == "select(0u, 1u, b)" and r.bitcast("b", dtypes.bool, dtypes.bool) == "b"
  assert r.bitcast("x", dtypes.int8, dtypes.bool) == "((bitcast<u32>(x) & 0xffu) != 0u)" and r.bitcast("x", dtypes.uint8, dtypes.bool) == "(x != 0u)"


def test_nan_is_tested_through_the_bits_only_where_it_changes_a_result() -> None:
  """WGSL compilers assume finite math (x != x folds to false): CMPNE on floats adds a bit test per operand that may
  be NaN (not for a finite constant), x != x is the bit test alone; ordered compares and integers stay as they are."""
  for dt, nan in ((dtypes.float32, "pr_nan(v)"), (dtypes.bfloat16, "pr_nan(v)"), (dtypes.float16, "pr_nan(f32(v))")):
    b = KernelBuilder(f"ne_{dt.name}")
    out, x, y = b.buffer("out", dtypes.bool), b.buffer("x", dt), b.buffer("y", dt)
    i = b.global_id(0)
    a, c = x[i], y[i]
    for k, r in enumerate([a.ne(c), a.ne(a), a.ne(b.const(1.5, dt)), a.ne(b.const(float("nan"), dt)), a.eq(c), a < c]): out[i * 6 + k] = r
    body = R.render(b.finish()).split("fn k_", 1)[1]
    lines = [re.sub(r"v\d+", "v", ln.split(" = ", 1)[1]) for ln in body.splitlines() if ": bool = " in ln]  # the compares, in order
    assert lines == [f"((v != v) | {nan} | {nan});", f"{nan};", f"((v != v) | {nan});", f"((v != v) | {nan} | {nan});",
                     "(v == v);", "(v < v);"], lines  # 1.5 is never NaN; the NaN constant is tested like any value
  assert "pr_nan" not in one_op(Ops.CMPNE, dtypes.int32) and "fn pr_nan" in one_op(Ops.CMPNE, dtypes.float32)
  assert "fn pr_nan" not in one_op(Ops.CMPLT, dtypes.float32) and "fn pr_nan" not in one_op(Ops.ADD, dtypes.float32)


def test_sin_is_an_own_routine_rendered_only_where_used() -> None:
  """SIN calls pr_sin (argument reduction, then polynomials; float16 through float32): WGSL's sin is accurate only
  near [-pi, pi]. The helper and its table of 2/pi come with kernels that use SIN, and only with those."""
  from plugrt.compiler.renderer import floatmath
  src = one_op(Ops.SIN, dtypes.float32)
  assert "fn pr_sin(x: f32) -> f32" in src and "const pr_2opi = array<u32, 7>(" in src and " sin(" not in src
  assert "f16(pr_sin(f32(v" in one_op(Ops.SIN, dtypes.float16) and "pr_bf16(pr_sin(v" in one_op(Ops.SIN, dtypes.bfloat16)
  assert "pr_sin" not in one_op(Ops.EXP2, dtypes.float32) and "pr_2opi" not in one_op(Ops.MUL, dtypes.float32)
  # the constants: pi from Machin's formula against its known hex digits, the table is 16 zero bits then 2/pi's bits
  assert abs(floatmath.pi_fixed(128) - 0x3243F6A8885A308D313198A2E03707344) <= 1
  assert "0x0000a2f9u, 0x836e4e44u, 0x1529fc27u, 0x57d1f534u, 0xddc0db62u, 0x95993c43u, 0x9041fe51u" in src


def test_reserved_looking_names_are_prefixed() -> None:
  b = KernelBuilder("loop")  # a WGSL keyword as the kernel name, parameters named like WGSL types and builtins
  out, arr = b.buffer("f32", dtypes.float32), b.buffer("array", dtypes.float32)
  n = b.scalar("select", dtypes.int32)
  with b.if_(b.global_id(0) < n):
    out[0] = arr[0]
  src = R.render(b.finish())
  assert "fn k_loop(" in src and "let s0_select: i32" in src
