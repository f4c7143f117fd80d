"""Vector access in the IR (VLOAD, LANE, VSTORE): the builder's and the verifier's rules, the listing, the lowering of a
kernel whose vector values cross a barrier, the DSL's vload/vstore, and what every renderer emits for them."""
import numpy as np
import pytest

from plugrt import Buffer, Device, kernel
from plugrt.compiler import interpreter
from plugrt.compiler import samples as K
from plugrt.compiler.ir import Kernel, KernelBuilder, Ops, UOp, parse, verify
from plugrt.compiler.lowering import serialize_groups
from plugrt.dtype import dtypes
from plugrt.errors import IRError
from plugrt.frontend.dsl import KernelSyntaxError, barrier, global_id, local_id, vload, vstore


def flip4() -> Kernel:
  b = KernelBuilder("flip4")
  out, x = b.buffer("out", dtypes.float32), b.buffer("x", dtypes.float32)
  i = b.global_id(0) * 4
  a0, a1, a2, a3 = x.vload(i)
  out.vstore(i, (a3, a2, a1 * 2.0, a0))
  return b.finish()


def test_vload_is_followed_by_its_lanes_and_the_listing_round_trips():
  k = flip4()
  ops = [u.op for u in k.uops]
  at = ops.index(Ops.VLOAD)
  assert ops[at:at + 5] == [Ops.VLOAD, *[Ops.LANE] * 4] and [u.arg for u in k.uops[at:at + 5]] == [4, 0, 1, 2, 3]
  assert k.signature.written == (True, False)  # a VSTORE writes its buffer
  assert parse(k.dump()).dump() == k.dump()
  out, x = np.zeros(8, np.float32), np.arange(8, dtype=np.float32)
  interpreter.run(k, [out, x], (), (2, 1, 1))
  assert out.tolist() == [3, 2, 2, 0, 7, 6, 10, 4]


@pytest.mark.parametrize("build, message", [
  (lambda b: b.buffer("x", dtypes.float32).vload(0, 3), "width must be one of"),
  (lambda b: b.buffer("x", dtypes.float64).vload(0, 4), "32 bytes; one vector access moves at most 16 .use width 2"),
  (lambda b: b.buffer("x", dtypes.float32).vload(b.const(1.0)), "index must be an integer"),
  (lambda b: b.shared("s", dtypes.float32, 8).vload(0), "take a buffer parameter"),
  (lambda b: b.buffer("x", dtypes.int32).vstore(0, (1, 2, 3)), "2 or 4 values, got 5 sources"),
  (lambda b: b.buffer("x", dtypes.float32).vload(0, True), "width is an int"),
  (lambda b: b.buffer("x", dtypes.imagef((2, 2))).vload(0), "is an image"),
  (lambda b: b.buffer("x", dtypes.imagef((2, 2))).vstore(0, (1.0, 2.0)), "is an image"),
])
def test_builder_refuses_bad_vector_access(build, message):
  with pytest.raises(IRError, match=message): build(KernelBuilder("k"))


def test_verifier_keeps_lanes_right_after_their_vload():
  uops = list(flip4().uops)
  at = next(n for n, u in enumerate(uops) if u.op is Ops.VLOAD)
  c = UOp(Ops.CONST, dtypes.int32, (), 1)
  with pytest.raises(IRError, match=r"followed directly by its LANE ops 0\.\.3"): verify(Kernel("k", tuple(uops[:at + 1] + [c] + uops[at + 1:])))
  swapped = uops[:at + 1] + [uops[at + 2], uops[at + 1]] + uops[at + 3:]
  with pytest.raises(IRError, match="in order"): verify(Kernel("k", tuple(swapped)))
  with pytest.raises(IRError, match="not followed by all of its LANE ops"): verify(Kernel("k", tuple(uops[:at + 3])))
  neg = UOp(Ops.NEG, dtypes.float32, (uops[at],))
  with pytest.raises(IRError, match="uses a VLOAD as a value"): verify(Kernel("k", tuple(uops[:at + 5] + [neg])))
  stray = UOp(Ops.LANE, dtypes.float32, (uops[at],), 0)
  with pytest.raises(IRError, match="must directly follow its VLOAD"): verify(Kernel("k", tuple(uops[:at + 5] + [stray])))
  b = KernelBuilder("k")
  v = b.emit(Ops.VLOAD, dtypes.float32, (b.buffer("x", dtypes.float32), b.const(0)), 2)
  with pytest.raises(IRError, match="lane 2 of a VLOAD of width 2"): b.emit(Ops.LANE, dtypes.float32, (v,), 2)
  with pytest.raises(IRError, match="takes a VLOAD"): b.emit(Ops.LANE, dtypes.int32, (b.const(1),), 0)


def barrier_kernel() -> Kernel:
  """Lanes of a VLOAD used after a barrier: the lowering keeps the VLOAD with its LANEs and spills the lanes."""
  b = KernelBuilder("vector_barrier")
  out, x = b.buffer("out", dtypes.int32), b.buffer("x", dtypes.int32)
  tile = b.shared("tile", dtypes.int32, 32)
  lid, i = b.local_id(0), b.global_id(0) * 4
  a0, a1, a2, a3 = x.vload(i)
  tile[lid] = a0 + a1 + a2 + a3
  b.barrier()
  out.vstore(i, (tile[7 - lid], a3, a2 * 2, a1 - a0))
  return b.finish()


def test_lowering_keeps_a_vload_with_its_lanes_across_barriers():
  k = barrier_kernel()
  low = serialize_groups(k)
  at = next(n for n, u in enumerate(low.uops) if u.op is Ops.VLOAD)
  assert [u.op for u in low.uops[at:at + 5]] == [Ops.VLOAD, *[Ops.LANE] * 4]
  assert sum(u.op is Ops.SPILL for u in low.uops) == 4  # the four lanes cross the barrier, never the VLOAD itself
  x = np.arange(64, dtype=np.int32) * 3 - 50
  want, got = np.zeros(64, np.int32), np.zeros(64, np.int32)
  interpreter.run(k, [want, x], (), (2, 1, 1), (8, 1, 1))
  interpreter.run(low, [got, x], (), (2, 1, 1), (8, 1, 1), serial_groups=True)
  assert np.array_equal(got, want)


@pytest.mark.parametrize("device, compiler", [("PYTHON", "PY"), ("CPU", "CLANG"), ("CPU", "LLVM"), ("CL", "CL")])
def test_vector_values_across_a_barrier_run(device, compiler):
  if device not in Device.available(): pytest.skip(f"{device} is not available here")
  x = np.arange(64, dtype=np.int32) * 3 - 50
  K.run_case(Device[device], K.Case("vector_barrier", barrier_kernel(), [np.zeros(64, np.int32), x], (), (2, 1, 1), (8, 1, 1)), compiler)


@kernel
def scale4(out: dtypes.float32[:], x: dtypes.float32[:], n: dtypes.int32):
  i = global_id(0) * 4
  if i + 3 < n:
    a, b, c, d = vload(x, i, 4)
    vstore(out, i, (a * 2, b * 2, c * 2, d * 2))
  else:
    for j in range(i, n):
      out[j] = x[j] * 2


@kernel
def pairs(out: dtypes.int16[:], x: dtypes.int16[:]):
  i = global_id(0) * 2
  v = vload(x, i, 2)
  barrier()
  vstore(out, i, (v[1], v[0] + local_id(0)))


@pytest.mark.parametrize("device", ["PYTHON", "CPU", "CL", "WEBGPU"])
def test_dsl_vload_and_vstore(device):
  if device not in Device.available(): pytest.skip(f"{device} is not available here")
  x = np.arange(11, dtype=np.float32) - 3.5
  out = Buffer(device, 11, dtypes.float32)
  scale4[1, 3, device](out, Buffer.from_numpy(x, device), 11)
  assert out.numpy().tolist() == (x * 2).tolist()
  xs = np.arange(16, dtype=np.int16) * 100
  o16 = Buffer(device, 16, dtypes.int16)
  pairs[2, 4, device](o16, Buffer.from_numpy(xs, device))
  assert o16.numpy().reshape(8, 2).tolist() == [[xs[2 * t + 1], xs[2 * t] + t % 4] for t in range(8)]


@pytest.mark.parametrize("body, message", [
  ("def w3(x: dtypes.float32[:]):\n  a, b, c = vload(x, 0, 3)", "width must be one of"),
  ("def wn(x: dtypes.float32[:], n: dtypes.int32):\n  a, b = vload(x, 0, n)", "width must be an integer constant"),
  ("def st(x: dtypes.float32[:]):\n  vstore(x, 0, 1.0)", "takes its values as a tuple"),
  ("def sc(x: dtypes.float32[:], n: dtypes.int32):\n  a, b = vload(n, 0, 2)", "first argument must be a buffer"),
  ("def un(x: dtypes.float32[:]):\n  v = vload(x, 0, 2)\n  x[0] = v", "a texel or a vector is several values"),
  ("def ix(x: dtypes.float32[:]):\n  v = vload(x, 0, 2)\n  x[0] = v[2]", "a constant from 0 to 1"),
])
def test_dsl_names_what_vector_access_takes(tmp_path, body, message):
  import importlib.util
  src = tmp_path / "bad_vector_kernel.py"
  src.write_text(f"from plugrt import kernel, dtypes\nfrom plugrt.frontend.dsl import vload, vstore\n@kernel\n{body}\n")
  spec = importlib.util.spec_from_file_location("bad_vector_kernel", src)
  with pytest.raises(KernelSyntaxError, match=message): spec.loader.exec_module(importlib.util.module_from_spec(spec))


def _renderers():
  """Each renderer's text for flip4, and what shows its vector load and store (an empty tuple: element by element)."""
  from plugrt.compiler.renderer.opencl import OpenCLRenderer
  out = {"OpenCL C": (OpenCLRenderer().render(flip4()), ("*((__global const float4*)(x + ", "*((__global float4*)(out + "))}
  try:
    from plugrt_nvidia_toolchain.cuda_c import CUDARenderer
    from plugrt_nvidia_toolchain.ptx import PTXRenderer
    out["CUDA C"] = (CUDARenderer().render(flip4()), ("*((const float4*)(x + ", "*((float4*)(out + "))
    out["PTX"] = (PTXRenderer().render(flip4()), ("ld.global.v4.f32 {", "st.global.v4.f32 ["))
  except ImportError: pass
  try:
    from plugrt_metal.renderer import MetalRenderer
    out["Metal"] = (MetalRenderer().render(flip4()), ("*((const device float4*)(x + ", "*((device float4*)(out + "))
  except ImportError: pass
  try:
    from plugrt_amd.hip import HIPRenderer
    from plugrt_amd.llvm import AMDLLVMRenderer
    out["HIP C"] = (HIPRenderer().render(flip4()), ("__attribute__((ext_vector_type(4)));", "*((const __plugrt_float4*)(x + "))
    out["AMD LLVM"] = (AMDLLVMRenderer("gfx90a").render(flip4()), ("load <4 x float>", "align 16", "store <4 x float>"))
  except ImportError: pass
  from plugrt_cpu.crender import CPUCRenderer
  from plugrt_cpu.llvm import CPULLVMRenderer
  out["CPU C"] = (CPUCRenderer().render(flip4()), ("vector_size(16), aligned(4)", "*((const __plugrt_float4*)(x + "))
  out["CPU LLVM"] = (CPULLVMRenderer().render(flip4()), ("load <4 x float>, ptr", "align 4", "store <4 x float>"))
  try:
    from plugrt_webgpu.wgsl import WGSLRenderer
    out["WGSL"] = (WGSLRenderer().render(flip4()), ("ld1(u32(v", ") + 3u)", "st0(u32("))
  except ImportError: pass
  return out


@pytest.mark.parametrize("language", list(_renderers()))
def test_each_renderer_emits_one_wide_access_where_its_language_has_one(language):
  text, wants = _renderers()[language]
  for want in wants: assert want in text, f"{language}: {want!r} not in\n{text}"
  if language == "CPU LLVM": assert "align 16" not in text  # the CPU claims only an element's alignment (movups)


@pytest.mark.parametrize("device", ["PYTHON", "CPU", "CL", "WEBGPU"])
@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.float64, dtypes.int16], ids=lambda d: d.name)
def test_the_benchmarks_vector_saxpy(device, dt):
  """bench/gpu_cuda.py's IR elementwise row with vector access: every length, the tail element by element."""
  if device not in Device.available(): pytest.skip(f"{device} is not available here")
  if device == "WEBGPU" and dt is dtypes.float64: pytest.skip("WEBGPU has no float64")
  for n in (1, 4, 1027):
    rng = np.random.default_rng(n)
    x, y = K.values(dt, n, rng, "small"), K.values(dt, n, rng, "small")
    fma = {0: [(0, n, 1, 0.0)]} if dt.kind == "f" else {}  # a shading compiler may fuse a * x + y (WGSL)
    case = K.Case("saxpy4", K.saxpy_vector_kernel(dt), [np.zeros(n, dt.numpy), x, y], (3, n), (-(-n // 4 // 8), 1, 1), (8, 1, 1), fma)
    K.run_case(Device[device], case)
