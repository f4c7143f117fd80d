"""The conformance suite every backend runs against its device.

In your backend package's tests:

    from plugrt_testing.conformance import ConformanceSuite

    class TestMyDevice(ConformanceSuite):
        device = "MYDEV"            # the name your BackendSpec declares

pytest then runs every test below once per compiler your device declares (the
`compiler` fixture; set `compilers = ("X",)` to restrict it). A device that is not
available here fails, with the registry's reason and fix: a backend that does not
import, declares the wrong API version or whose probe raises never passes as skipped
(set `hardware_optional = True` for hardware the test machine may lack: only then is a
missing device a skip). Kernels are checked against the reference interpreter: integers
exactly, floats to a few ulps where the IR allows it; a mismatch names the op, the dtype
and the inputs. `pytest --plugrt-fuzz=N` also runs N seeds of the differential fuzzer.
"""
from __future__ import annotations

import dataclasses
import gc
import json
import subprocess
import sys

import numpy as np
import pytest

from plugrt.compiler import samples as K
from plugrt.device import Buffer, RuntimeDevice
from plugrt.dtype import DType, dtypes
from plugrt.errors import CompileError, LaunchError, OutOfMemoryError, RenderError, UnsupportedError

ALL = K.ALL


def _available() -> list[str]:
  from plugrt.device import Device
  return Device.available()


def _loosen(case: K.Case, atol: dict[DType, float]) -> K.Case:
  """`case` with its transcendental ranges (those compared with an absolute tolerance) allowed `atol[dtype]`."""
  sig = case.kernel.signature
  ulps = {i: [(a, b, n, max(t, atol.get(sig.buffers[i], t)) if t else t) for a, b, n, t in ranges] for i, ranges in case.ulps.items()}
  return dataclasses.replace(case, ulps=ulps)


class ConformanceSuite:
  """Subclass with `device = "NAME"`; see the module docstring."""
  device: str = ""
  compilers: tuple[str, ...] | None = None
  #: dtypes the device cannot hold at all (their tests are skipped, not failed)
  unsupported_dtypes: tuple[DType, ...] = ()
  #: True for hardware the machine running the suite may lack (a GPU on CI): then, and only when the registry says
  #: the device or its toolchain is absent (Reason NO_DEVICE or MISSING_TOOLCHAIN), the suite skips instead of failing
  hardware_optional: bool = False
  #: True when the device's compiler may reassociate float additions (WGSL's fast math): the chain cases leave out
  #: the chains reassociation folds ((a+b)-a), and still check every other chain's per-op rounding
  reassociates_floats: bool = False
  #: True when the device's compiler may fuse a multiply and an add into one fma (SPIR-V and WGSL compilers do, unless
  #: told not to): the chain cases leave out the multiply-then-add chains, and still check every other chain's rounding
  contracts_floats: bool = False

  @pytest.fixture
  def dev(self, compiler: str) -> RuntimeDevice:
    from plugrt.device import Device
    return Device[self.device]

  #: per float dtype, the absolute error this device's SIN, EXP2 and LOG2 may have when that is more than the
  #: suite's default (for shading languages that allow approximate transcendentals; say where the figure comes from)
  transcendental_atol: dict[DType, float] = {}

  def run(self, dev: RuntimeDevice, case: K.Case, compiler: str) -> None:
    if self.transcendental_atol: case = _loosen(case, self.transcendental_atol)
    try: K.run_case(dev, case, compiler)
    except RenderError as e: pytest.skip(f"{self.device}:{compiler} cannot express {case.name}: {e.message}")

  def skip_dtype(self, dt: DType) -> None:
    if dt in self.unsupported_dtypes: pytest.skip(f"{self.device} has no {dt.name}")

  # ------------------------------------------------------------ memory
  @pytest.mark.parametrize("dt", ALL, ids=lambda d: d.name)
  def test_copy_roundtrip(self, dev: RuntimeDevice, dt: DType) -> None:
    self.skip_dtype(dt)
    data = K.values(dt, 1000, np.random.default_rng(5))
    buf = Buffer(dev, len(data), dt).copyin(data)
    assert buf.numpy().tobytes() == data.tobytes()
    out = np.zeros_like(data)
    buf.copyout(out)
    assert out.tobytes() == data.tobytes()
    assert buf.tobytes() == data.tobytes()
    assert Buffer(dev, 4, dt).copyin(data[:4].tobytes()).numpy().tobytes() == data[:4].tobytes()

  def test_copy_checks(self, dev: RuntimeDevice) -> None:
    buf = Buffer(dev, 8, dtypes.float32)
    with pytest.raises(ValueError, match="8 float32"): buf.copyin(np.zeros(7, np.float32))
    with pytest.raises(TypeError, match="astype"): buf.copyin(np.zeros(8, np.float64))
    with pytest.raises(TypeError): buf.copyin(12)
    with pytest.raises(TypeError, match="read-only"): buf.copyout(bytes(32))
    with pytest.raises(ValueError): Buffer(dev, -1, dtypes.float32)
    with pytest.raises(TypeError): Buffer(dev, 2.5, dtypes.float32)  # type: ignore[arg-type]

  def test_zero_size(self, dev: RuntimeDevice) -> None:
    buf = Buffer(dev, 0, dtypes.int32)
    assert buf.numpy().shape == (0,)
    buf.copyin(np.zeros(0, np.int32))

  def test_views_and_offsets(self, dev: RuntimeDevice, compiler: str) -> None:
    base = Buffer(dev, 64, dtypes.float32).copyin(np.arange(64, dtype=np.float32))
    view = base.view(16, offset=32 * 4)
    assert view.numpy().tolist() == list(range(32, 48))
    view.copyin(np.full(16, -1, np.float32))
    got = base.numpy()
    assert (got[32:48] == -1).all() and got[31] == 31 and got[48] == 48
    inner = view.view(4, offset=8)  # a view of a view: offsets add up
    assert inner.numpy().tolist() == [-1.0] * 4
    prg = dev.program(K.tiny_kernel(), compiler)
    prg(base.view(4, offset=0), base.view(4, offset=50 * 4), wait=True)  # out[0] = x[0] + 1 through views
    assert base.numpy()[0] == 51.0
    as_int = base.view(dtype=dtypes.int32)
    assert as_int.numpy()[1] == np.float32(1).view(np.int32)
    with pytest.raises(ValueError): base.view(65)
    with pytest.raises(ValueError): base.view(4, offset=2)  # not aligned to float32

  def test_copy_between_buffers(self, dev: RuntimeDevice) -> None:
    a = Buffer(dev, 100, dtypes.int64).copyin(np.arange(100, dtype=np.int64))
    b = Buffer(dev, 100, dtypes.int64)
    a.copy_to(b)
    assert b.numpy().tolist() == list(range(100))
    assert a.to(dev).numpy().tolist() == list(range(100))
    if "PYTHON" in _available() and dev.name != "PYTHON":  # across devices, through the host
      assert a.to("PYTHON").to(dev).numpy().tolist() == list(range(100))
    with pytest.raises(ValueError): a.copy_to(Buffer(dev, 99, dtypes.int64))

  def test_out_of_memory(self, dev: RuntimeDevice) -> None:
    with pytest.raises(MemoryError) as info:
      Buffer(dev, 1 << 62, dtypes.uint8)
    assert isinstance(info.value, OutOfMemoryError) and dev.canonical in str(info.value)
    Buffer(dev, 16, dtypes.uint8)  # the device still works

  def test_from_blob(self, dev: RuntimeDevice, compiler: str) -> None:
    """External memory is wrapped for real (a write through one side shows through the other) or refused; never
    copied. Its owner sees a write plugrt makes into it when the call that makes it returns (Tensor.assign,
    Buffer.copyin, Buffer.copy_to), and a kernel's write once dev.synchronize() returns (docs/authoring.md)."""
    from plugrt.frontend.tensor import Tensor
    n = 1 << 16  # enough work that a write still queued when the call returns is caught
    host = np.zeros(n, np.float32)
    if not dev.allocator.supports_wrap:
      with pytest.raises(UnsupportedError): Buffer.from_blob(host.ctypes.data, n, dtypes.float32, dev)
      return
    with pytest.raises(TypeError): Buffer.from_blob(0, n, dtypes.float32, dev)
    try:
      ptr, keep = host.ctypes.data, host
      ext = Buffer.from_blob(ptr, n, dtypes.float32, dev, keepalive=keep)
      def owner_reads() -> np.ndarray: return host
      def owner_writes(i: int, v: float) -> None: host[i] = v
    except UnsupportedError:  # host memory this device cannot address (a GPU): wrap another library's device memory instead
      if dev.allocator.dlpack_device() is None: raise
      owner = Buffer(dev, n, dtypes.float32).copyin(host)
      ptr, keep = dev.allocator._pointer(owner.handle), owner
      ext = Buffer.from_blob(ptr, n, dtypes.float32, dev, keepalive=keep)
      def owner_reads() -> np.ndarray: return owner.numpy()
      def owner_writes(i: int, v: float) -> None: owner.view(1, offset=4 * i).copyin(np.array([v], np.float32))
    owner_writes(1, 7.0)
    assert (got := ext.numpy()[1]) == 7.0, f"from_blob must wrap the memory itself, not a copy: its owner wrote 7 and the buffer reads {got}"
    ext.copyin(np.full(n, 3, np.float32))
    assert (got := owner_reads()[n - 1]) == 3.0, f"Buffer.copyin into from_blob memory returned before its owner saw the data (it reads {got})"
    dev.program(K.tiny_kernel(), compiler)(ext, Buffer(dev, 1, dtypes.float32).copyin(np.array([41], np.float32)))  # ext[0] = 42
    dev.synchronize()
    assert (got := owner_reads()[0]) == 42.0, f"a kernel wrote 42 into from_blob memory, and after {dev}.synchronize() its owner " \
      f"reads {got}: DeviceState.synchronize() must bring wrapped memory up to date for its owner (docs/authoring.md, _wrap)"
    t = Tensor.from_blob(ptr, n, dtypes.float32, dev, keepalive=keep)
    for k in range(1, 6):  # a stale read is a race: several tries
      t.assign(k)
      got = owner_reads()
      assert got[n - 1] == k and (got == k).all(), f"Tensor.assign returned before its write reached the from_blob memory's " \
        f"owner: it reads {got[n - 1]} at index {n - 1}, not {k}; the owner must see the result when assign returns"
    Buffer(dev, n, dtypes.float32).copyin(np.full(n, 9, np.float32)).copy_to(ext)
    assert (got := owner_reads()[n - 1]) == 9.0, f"Buffer.copy_to into from_blob memory returned before its owner saw the data (it reads {got})"
    del ext, t
    gc.collect()
    assert (owner_reads() == 9).all()  # the wrapped memory was not freed by plugrt

  # ------------------------------------------------------------ kernels against the interpreter
  @pytest.mark.parametrize("dt", ALL, ids=lambda d: d.name)
  def test_ops(self, dev: RuntimeDevice, compiler: str, dt: DType) -> None:
    self.skip_dtype(dt)
    self.run(dev, K.ops_case(dt), compiler)

  @pytest.mark.parametrize("dt", [d for d in ALL if d is not dtypes.bool], ids=lambda d: d.name)
  def test_chains(self, dev: RuntimeDevice, compiler: str, dt: DType) -> None:
    """Ops feeding ops: each intermediate result is rounded (wrapped) to dt, as the IR defines, not kept wider."""
    self.skip_dtype(dt)
    self.run(dev, K.chain_case(dt, reassociates=self.reassociates_floats, contracts=self.contracts_floats), compiler)

  @pytest.mark.parametrize("dt", ALL, ids=lambda d: d.name)
  def test_casts(self, dev: RuntimeDevice, compiler: str, dt: DType) -> None:
    self.skip_dtype(dt)
    self.run(dev, K.cast_case(dt, to=[d for d in ALL if d not in self.unsupported_dtypes]), compiler)

  @pytest.mark.parametrize("group", K.BITCAST_GROUPS, ids=lambda g: f"{g[0].itemsize * 8}bit")
  def test_bitcasts(self, dev: RuntimeDevice, compiler: str, group: tuple[DType, ...]) -> None:
    group = tuple(d for d in group if d not in self.unsupported_dtypes)  # the rest of a group still bitcast to each other
    if len(group) < 2: pytest.skip(f"{self.device} has fewer than two dtypes of this size")
    self.run(dev, K.bitcast_case(group), compiler)

  @pytest.mark.parametrize("dt", ALL, ids=lambda d: d.name)
  def test_scalar_args(self, dev: RuntimeDevice, compiler: str, dt: DType) -> None:
    self.skip_dtype(dt)
    self.run(dev, K.scalar_case(dt), compiler)

  @pytest.mark.parametrize("dt", [d for d in ALL if d.kind in "if"], ids=lambda d: d.name)
  def test_negative_literals(self, dev: RuntimeDevice, compiler: str, dt: DType) -> None:
    self.skip_dtype(dt)
    self.run(dev, K.literal_case(dt), compiler)

  @pytest.mark.parametrize("pair", K.BITCAST_LITERAL_PAIRS, ids=lambda p: f"{p[0].name}-{p[1].name}")
  def test_bitcast_of_literals(self, dev: RuntimeDevice, compiler: str, pair: tuple[DType, DType]) -> None:
    for dt in pair: self.skip_dtype(dt)
    self.run(dev, K.bitcast_literal_case(*pair), compiler)

  def test_control_flow(self, dev: RuntimeDevice, compiler: str) -> None: self.run(dev, K.control_case(), compiler)
  def test_shared_and_barrier(self, dev: RuntimeDevice, compiler: str) -> None: self.run(dev, K.reverse_case(), compiler)
  def test_loop_with_barriers(self, dev: RuntimeDevice, compiler: str) -> None: self.run(dev, K.reduce_case(), compiler)
  def test_3d_grid(self, dev: RuntimeDevice, compiler: str) -> None: self.run(dev, K.grid3d_case(), compiler)

  @pytest.mark.parametrize("dt", ALL, ids=lambda d: d.name)
  def test_vector_access(self, dev: RuntimeDevice, compiler: str, dt: DType) -> None:
    """Vector loads and stores (VLOAD, VSTORE) of each width dt allows give the interpreter's bits, the same as the
    scalar loads and stores beside them, in whole buffers and in views 16 and 48 bytes into larger ones (aligned: the
    bytes around the views must stay as they were); the last elements of an odd length are scalar."""
    self.skip_dtype(dt)
    case = K.vector_case(dt)
    self.run(dev, case, compiler)
    for offset in (16, 48): K.run_case(dev, case, compiler, view_offset=offset)

  def test_big_grid(self, dev: RuntimeDevice, compiler: str) -> None:
    """Enough threads that a multi-core backend splits the grid."""
    n = 1 << 16
    x = np.arange(n, dtype=np.float32)
    out, xb, yb = Buffer(dev, n, dtypes.float32), Buffer.from_numpy(x, dev), Buffer.from_numpy(x * 2, dev)
    dev.program(K.saxpy_kernel(), compiler)(out, xb, yb, global_size=(n // 64, 1, 1), local_size=(64, 1, 1), vals=(3.0, n))
    assert np.array_equal(out.numpy(), 3 * x + 2 * x)

  # ------------------------------------------------------------ images (devices whose allocator has supports_images)
  def refuses_images(self, dev: RuntimeDevice, compiler: str, base: DType) -> bool:
    """On a device without images: checks that it refuses image buffers and kernels (UnsupportedError, before any native
    call), and returns True; the image tests then have nothing more to run there."""
    if dev.allocator.supports_images: return False
    img = dtypes.imagef((2, 2)) if base is dtypes.float32 else dtypes.imageh((2, 2))
    with pytest.raises(UnsupportedError, match="image"): Buffer(dev, 16, img)
    with pytest.raises(UnsupportedError, match="image"): dev.program(K.image_case(base).kernel, compiler)
    return True

  @pytest.mark.parametrize("base", [dtypes.float32, dtypes.float16], ids=["imagef", "imageh"])
  def test_images(self, dev: RuntimeDevice, compiler: str, base: DType) -> None:
    """TEXEL_LOAD (clamped to the edge) and TEXEL_STORE on a non-square image, against the interpreter; a device without
    images (allocator.supports_images False) must refuse them instead."""
    if self.refuses_images(dev, compiler, base): return
    self.run(dev, K.image_case(base), compiler)

  @pytest.mark.parametrize("base", [dtypes.float32, dtypes.float16], ids=["imagef", "imageh"])
  def test_image_copies(self, dev: RuntimeDevice, compiler: str, base: DType) -> None:
    """An image's bytes go in and come out as the (h, w, 4) texels, rows packed; image to image and to another device."""
    if self.refuses_images(dev, compiler, base): return
    h, w = 3, 5
    img = dtypes.imagef((h, w)) if base is dtypes.float32 else dtypes.imageh((h, w))
    data = np.arange(h * w * 4).astype(base.numpy)
    buf = Buffer(dev, h * w * 4, img).copyin(data)
    assert np.array_equal(buf.numpy(), data) and buf.tobytes() == data.tobytes()
    other = buf.copy_to(Buffer(dev, h * w * 4, img))
    assert np.array_equal(other.numpy(), data)
    plain = buf.copy_to(Buffer(dev, h * w * 4, base))  # an image into a plain buffer: the same packed texels
    assert np.array_equal(plain.numpy(), data)
    if "PYTHON" in _available() and dev.name != "PYTHON":
      assert np.array_equal(buf.to("PYTHON").numpy(), data)
      assert np.array_equal(Buffer("PYTHON", h * w * 4, img).copyin(data).to(dev).numpy(), data)
    with pytest.raises(ValueError, match=str(h * w * 4)): Buffer(dev, h * w * 4 - 1, img)

  @pytest.mark.parametrize("shape", ["flat", "hw4"])
  @pytest.mark.parametrize("base", [dtypes.float32, dtypes.float16], ids=["imagef", "imageh"])
  def test_image_tensors(self, dev: RuntimeDevice, compiler: str, base: DType, shape: str) -> None:
    """An image tensor keeps the caller's shape ((h*w*4,) as the seeds pass it, or (h, w, 4)); elementwise ops, a strided
    view, reductions and .numpy() read its texels as the texel type into plain results, against numpy. A device without
    images refuses the tensor (UnsupportedError naming images)."""
    from plugrt.frontend.tensor import Tensor
    h, w = 3, 5
    img = dtypes.imagef((h, w)) if base is dtypes.float32 else dtypes.imageh((h, w))
    data = (np.arange(h * w * 4) % 23 - 7).astype(base.numpy)
    data = data.reshape((h * w * 4,) if shape == "flat" else (h, w, 4))
    if not dev.allocator.supports_images:
      with pytest.raises(UnsupportedError, match="image"): Tensor(data, dtype=img, device=dev)
      return
    t = Tensor(data, dtype=img, device=dev)
    assert t.shape == data.shape and t.dtype is img
    got = t.numpy()
    assert got.dtype == base.numpy and got.shape == data.shape and np.array_equal(got, data)
    out = (t * 2 + 1).numpy()
    assert out.dtype == base.numpy and np.array_equal(out, data * base.numpy.type(2) + base.numpy.type(1))
    assert np.array_equal((t.maximum(t * -1)).numpy(), np.maximum(data, -data))
    assert t.sum().item() == float(data.astype(np.float64).sum()) and t.max().item() == float(data.max())
    view = t.reshape(h, w, 4)[1:, ::2, 1:3]  # texels of a strided view
    want = data.reshape(h, w, 4)[1:, ::2, 1:3]
    assert np.array_equal(view.numpy(), want) and np.array_equal(view.sum(axis=1).numpy(), want.sum(axis=1, dtype=base.numpy))
    assert (t + Tensor(data.astype(np.float32), device=dev)).dtype is dtypes.float32  # meets a plain tensor as its texel type

  # ------------------------------------------------------------ programs
  def test_timing(self, dev: RuntimeDevice, compiler: str) -> None:
    prg = dev.program(K.tiny_kernel(), compiler)
    a, b = Buffer(dev, 1, dtypes.float32), Buffer(dev, 1, dtypes.float32)
    t = prg(a, b, wait=True)
    assert isinstance(t, float) and 0 <= t < 10
    assert prg(a, b) is None
    dev.synchronize()

  def test_program_is_cached(self, dev: RuntimeDevice, compiler: str) -> None:
    k = K.tiny_kernel("cached_tiny")
    assert dev.program(k, compiler) is dev.program(k, compiler)
    assert dev.program(K.tiny_kernel("cached_tiny"), compiler) is dev.program(k, compiler)  # same source, same program

  def test_argument_errors(self, dev: RuntimeDevice, compiler: str) -> None:
    prg = dev.program(K.saxpy_kernel(), compiler)
    out, x, y = (Buffer(dev, 4, dtypes.float32) for _ in range(3))
    with pytest.raises(TypeError, match="buffer"): prg(out, x, vals=(1.0, 4))
    with pytest.raises(TypeError, match="Buffer"): prg(out, x, 12, vals=(1.0, 4))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="scalar"): prg(out, x, y, vals=(1.0,))
    with pytest.raises(TypeError, match="int32"): prg(out, x, y, vals=(1.0, 2.5))
    with pytest.raises(TypeError, match="float32"): prg(out, x, Buffer(dev, 4, dtypes.int32), vals=(1.0, 4))
    with pytest.raises(TypeError): prg(out, x, y, global_size="big", vals=(1.0, 4))  # type: ignore[arg-type]
    with pytest.raises(ValueError): prg(out, x, y, global_size=(0, 1, 1), vals=(1.0, 4))
    with pytest.raises(ValueError): prg(out, x, y, vals=(1.0, 1 << 40))
    prg(out, x, y, global_size=(1, 1, 1), local_size=(4, 1, 1), vals=(1.0, 4), wait=True)  # still usable after errors
    if dev.name != "PYTHON" and "PYTHON" in _available():
      other = Buffer("PYTHON", 4, dtypes.float32)
      with pytest.raises(TypeError, match="copy it"): prg(out, x, other, vals=(1.0, 4))

  def test_launch_limits(self, dev: RuntimeDevice, compiler: str) -> None:
    """Sizes past the device's launch_limits (and past the IR's int32 ids) are LaunchErrors naming the device, also
    right after a launch that took the backend's fast path; nothing past them reaches the device."""
    prg = dev.program(K.saxpy_kernel(), compiler)
    x = np.arange(4, dtype=np.float32)
    out, xb, yb = Buffer(dev, 4, dtypes.float32), Buffer.from_numpy(x, dev), Buffer.from_numpy(x, dev)
    lim = prg.launch_limits
    for gs, ls in [((2**32 + 1, 1, 1), (1, 1, 1)), ((2**31, 1, 1), (1, 1, 1)), ((1, 2**31 - 1, 1), (1, 2, 1)),
                   ((lim.max_groups[0] + 1, 1, 1), (1, 1, 1)), ((1, 1, 1), (lim.max_local[0] + 1, 1, 1))]:
      for _ in range(2): prg(out, xb, yb, global_size=(1, 1, 1), local_size=(4, 1, 1), vals=(1.0, 4))
      with pytest.raises(LaunchError, match=dev.canonical): prg(out, xb, yb, global_size=gs, local_size=ls, vals=(1.0, 4))
    prg(out, xb, yb, global_size=(1, 1, 1), local_size=(4, 1, 1), vals=(2.0, 4))
    assert np.array_equal(out.numpy(), 3 * x)

  def test_each_call_is_seen_exactly(self, dev: RuntimeDevice, compiler: str) -> None:
    """A launch that looks like the last one to Python's == is not always the same call: a list the caller changed
    since (the sizes, the scalars), or -0.0 after 0.0 (1/a). A backend's memo of its last launch must see each."""
    from plugrt.compiler.ir import KernelBuilder
    b = KernelBuilder("recip_each")
    out, a = b.buffer("out", dtypes.float32), b.scalar("a", dtypes.float32)
    out[b.global_id(0)] = 1.0 / a
    prg = dev.program(b.finish(), compiler)
    o = Buffer(dev, 16, dtypes.float32).copyin(np.zeros(16, np.float32))
    gs, vals = [1, 1, 1], [2.0]
    for _ in range(2): prg(o, global_size=gs, local_size=(4, 1, 1), vals=vals)
    gs[0], vals[0] = 3, 4.0  # the same lists, changed: another launch
    prg(o, global_size=gs, local_size=(4, 1, 1), vals=vals)
    assert o.numpy().tolist() == [0.25] * 12 + [0.0] * 4, f"{dev.canonical}:{compiler} ran the last launch's sizes or scalars again"
    for a_, want in ((0.0, np.inf), (-0.0, -np.inf), (-0.0, -np.inf), (0.0, np.inf), (-0.0, -np.inf)):
      prg(o, global_size=(4, 1, 1), local_size=(4, 1, 1), vals=(a_,))
      assert (o.numpy() == want).all(), f"{dev.canonical}:{compiler}: 1/{a_!r} after another sign gave {o.numpy()[0]}"

  def test_graph_replays_its_launches(self, dev: RuntimeDevice, compiler: str) -> None:
    """A graph of launches of one program with different buffers and scalars replays each with its own arguments, in
    order, also after the program was launched directly with others in between (backends keep a prepared launch per
    call: the graph's must be its own), and times a replay with wait=True."""
    from plugrt.compiler.ir import KernelBuilder
    from plugrt.runtime import Launch
    b = KernelBuilder("axpb_inplace")
    x, a, c = b.buffer("x", dtypes.int32), b.scalar("a", dtypes.int32), b.scalar("c", dtypes.int32)
    i = b.global_id(0)
    x[i] = x[i] * a + c
    prg = dev.program(b.finish(), compiler)
    xs = [Buffer.from_numpy(np.arange(8, dtype=np.int32) + 10 * k, dev) for k in range(3)]
    steps = [(0, 2, 1), (1, 3, 0), (0, 1, 5), (2, -1, 7)]  # (buffer, a, c): buffer 0 twice, in this order
    graph = dev.graph([Launch(prg, [xs[k]], (2, 1, 1), (4, 1, 1), (a_, c_)) for k, a_, c_ in steps])
    want = [np.arange(8, dtype=np.int64) + 10 * k for k in range(3)]
    other = Buffer.from_numpy(np.zeros(8, np.int32), dev)
    for rep in range(3):
      t = graph(wait=rep == 1)
      assert t is None if rep != 1 else isinstance(t, float)
      for k, a_, c_ in steps: want[k] = want[k] * a_ + c_
      prg(other, global_size=(2, 1, 1), local_size=(4, 1, 1), vals=(1, rep + 100))  # another call of the program between replays
    dev.synchronize()
    for k in range(3): assert xs[k].numpy().tolist() == want[k].tolist(), f"{dev.canonical}:{compiler}: graph buffer {k}"
    assert other.numpy().tolist() == [sum(range(100, 103))] * 8

  def test_compile_error(self, dev: RuntimeDevice, compiler: str) -> None:
    with pytest.raises(CompileError): dev.compiler_for(compiler).compile("this is not a kernel in any language {{{")

  # ------------------------------------------------------------ the plugin itself
  def test_entry_module_imports_only_stdlib(self) -> None:
    """The entry module, imported in a fresh interpreter after plugrt, loads nothing but the standard library,
    plugrt and its own package: plugrt imports it in every process that lists devices."""
    from plugrt.registry import current
    rec = current().backend(self.device).plugin
    if rec is None: pytest.fail(f"no installed plugin declares {self.device}: {current().backend(self.device).detail}")
    code = ("import importlib, json, sys\nimport plugrt.registry\nbefore = set(sys.modules)\n"
            f"importlib.import_module({rec.module_name!r})\n"
            "from plugrt._entrypoints import foreign_modules\n"
            f"print(json.dumps(foreign_modules(sorted(set(sys.modules) - before), {rec.module_name!r})))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"importing the entry module {rec.module_name} in a fresh interpreter failed:\n{r.stderr[-2000:]}"
    foreign = json.loads(r.stdout.strip().splitlines()[-1])
    assert foreign == [], (f"the entry module {rec.module_name} imports {', '.join(foreign)}: an entry module imports only the standard "
                           "library and plugrt; import the rest inside the hooks that build the device's objects")

  # ------------------------------------------------------------ differential fuzzing (pytest --plugrt-fuzz=N)
  def test_fuzz(self, dev: RuntimeDevice, compiler: str, fuzz_seed: int, request: pytest.FixtureRequest) -> None:
    """One seed of plugrt's differential fuzzer on this device: a random IR kernel on this compiler, and (on the
    device's default compiler) a random @kernel function and a Tensor expression. Runs with --plugrt-fuzz=N."""
    from plugrt_testing import fuzz
    outs = fuzz.run_ir(fuzz_seed, [fuzz.Target(self.device, compiler)])
    if compiler == dev.info.compiler:
      outs += fuzz.run_dsl(fuzz_seed, [self.device]) + fuzz.run_tensor(fuzz_seed, [self.device])
    failed = [o for o in outs if o.status == "fail"]
    again = f"python -m pytest '{request.node.nodeid}' --plugrt-fuzz=1 --plugrt-fuzz-seed={fuzz_seed}"
    assert not failed, f"reproduce: {again}\n\n" + "\n\n".join(o.describe() for o in failed)
