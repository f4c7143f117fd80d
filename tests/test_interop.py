"""Zero-copy interop: Tensor.from_blob, DLPack both ways with numpy and torch (CPU here; the same API serves CUDA)."""
import gc

import numpy as np
import pytest

from plugrt import Tensor, dtypes
from plugrt.errors import UnsupportedError
from plugrt.frontend import dlpack as D

HOST = ["CPU", "PYTHON"]  # devices whose memory is host memory


@pytest.mark.parametrize("dev", HOST)
def test_from_blob_wraps_for_real(dev):
  host = np.arange(6, dtype=np.float32)
  t = Tensor.from_blob(host.ctypes.data, (2, 3), dtype=dtypes.float32, device=dev, keepalive=host)
  t.assign(t + 1)  # written through plugrt...
  assert host.tolist() == [1, 2, 3, 4, 5, 6]  # ...seen by the owner
  host[0] = 100  # written by the owner...
  assert t.numpy()[0, 0] == 100  # ...seen through plugrt
  assert (t * 2).tolist() == [[200, 4, 6], [8, 10, 12]]


def test_from_blob_refuses_where_memory_cannot_be_wrapped(plugrt_registry):
  import types

  from plugrt.hookspecs import BackendSpec, CompilerSpec, Probe, hookimpl
  from plugrt.reference.backend import PythonAllocator, PythonCompiler, PythonProgram

  class NoWrap(PythonAllocator):  # memory neither wrappable nor exportable (as on a device without host access)
    supports_wrap = False
    def dlpack_device(self): return None
  mod = types.ModuleType("nowrap_backend")
  mod.plugrt_backends = hookimpl(lambda: [BackendSpec("NOWRAP", "1.0", lambda: Probe.found(1), (CompilerSpec("PY"),))])
  mod.plugrt_allocator = hookimpl(lambda device: NoWrap(device))
  mod.plugrt_compiler = hookimpl(lambda device, compiler: PythonCompiler(device))
  mod.plugrt_program = hookimpl(lambda device: PythonProgram)
  host = np.zeros(4, np.float32)
  with plugrt_registry([mod]):
    with pytest.raises(UnsupportedError, match="cannot wrap external memory"):
      Tensor.from_blob(host.ctypes.data, 4, dtypes.float32, "NOWRAP")
    t = Tensor([1.0, 2.0], device="NOWRAP")
    with pytest.raises(UnsupportedError, match="DLPack"): np.from_dlpack(t)


@pytest.mark.parametrize("dev", HOST)
def test_numpy_both_ways(dev):
  a = np.arange(12, dtype=np.int64).reshape(3, 4)
  t = Tensor.from_dlpack(a, dev)
  assert t.device == dev and t.dtype is dtypes.int64 and t.shape == (3, 4)
  a[1, 1] = -5
  assert t.numpy()[1, 1] == -5  # zero copy
  strided = Tensor.from_dlpack(a[:, ::-2], dev)  # negative, non-unit strides
  assert strided.tolist() == a[:, ::-2].tolist()
  back = np.from_dlpack(t * 2)
  assert back.tolist() == (a * 2).tolist() and back.flags.writeable
  view = np.from_dlpack(t.T)  # strides travel
  assert view.tolist() == a.T.tolist()
  out = Tensor(np.zeros(3, np.float32), device=dev)
  np.from_dlpack(out)[1] = 7  # writable, and it is the tensor's memory
  assert out.tolist() == [0, 7, 0]


def test_lifetimes():
  t = Tensor([1.0, 2.0, 3.0], device="CPU") * 2
  arr = np.from_dlpack(t)
  del t
  gc.collect()
  assert arr.tolist() == [2.0, 4.0, 6.0] and len(D._exported) >= 1  # the consumer keeps the memory alive
  n = len(D._exported)
  del arr
  gc.collect()
  assert len(D._exported) == n - 1  # and lets go
  capsule = Tensor([1.0], device="CPU").__dlpack__()
  n = len(D._exported)
  del capsule  # never consumed: its destructor queues the release, the next DLPack call (here: _drain) does it
  gc.collect()
  D._drain()
  assert len(D._exported) == n - 1 or D._DESTRUCTOR is None
  a = np.ones(4, np.float32)
  imported = Tensor.from_dlpack(a)
  del a  # plugrt keeps the producer's memory alive
  gc.collect()
  assert imported.tolist() == [1, 1, 1, 1]


def test_a_refused_capsule_keeps_the_consumers_error(monkeypatch):
  """numpy refuses memory that is not on the host; its error must survive the capsule's destruction."""
  from plugrt import Device
  monkeypatch.setattr(type(Device["CPU"].allocator), "dlpack_device", lambda self: (2, 0))  # pretend it is a GPU's
  with pytest.raises((RuntimeError, BufferError, ValueError)) as e: np.from_dlpack(Tensor([1.0], device="CPU") * 2)
  assert not isinstance(e.value, SystemError)
  gc.collect()


def test_dlpack_device_and_dtypes():
  assert Tensor([1], device="CPU").__dlpack_device__() == (1, 0)
  for dt in dtypes.all():
    assert D.dtype_from_code(*D.dtype_code(dt), 1) is dt
  with pytest.raises(UnsupportedError): D.dtype_from_code(2, 16, 4)
  with pytest.raises(TypeError): Tensor.from_dlpack([1, 2])


class _TorchLikeDtype:
  """Looks like a torch dtype to plugrt (its type's module is torch): plugrt must map it without importing torch."""
  __module__ = "torch"
  def __init__(self, name: str): self.name = name
  def __str__(self) -> str: return f"torch.{self.name}"


def test_torch_dtypes_are_recognised_without_torch():
  assert dtypes.as_dtype(_TorchLikeDtype("int32")) is dtypes.int32 and dtypes.from_torch(_TorchLikeDtype("bfloat16")) is dtypes.bfloat16
  with pytest.raises(TypeError, match=r"torch dtype torch\.complex64 has no plugrt dtype; use one of bool, "):
    dtypes.from_torch(_TorchLikeDtype("complex64"))
  with pytest.raises(TypeError, match="is not a torch dtype"): dtypes.from_torch(np.float32)


torch = pytest.importorskip("torch")


def test_torch_both_ways():
  x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
  t = Tensor.from_dlpack(x)
  x[0, 0] = 42
  assert t.numpy()[0, 0] == 42
  y = torch.from_dlpack((t + 1).realize())
  assert y.tolist() == [[43, 2, 3], [4, 5, 6]]
  z = torch.zeros(4)
  w = Tensor.from_dlpack(z)
  w.assign(w + 3)
  assert z.tolist() == [3, 3, 3, 3]
  for tdt, pdt in ((torch.bfloat16, dtypes.bfloat16), (torch.float16, dtypes.float16), (torch.bool, dtypes.bool), (torch.uint8, dtypes.uint8)):
    src = torch.ones(3, dtype=tdt)
    got = Tensor.from_dlpack(src)
    assert got.dtype is pdt and torch.from_dlpack(got).dtype == tdt
  tt = Tensor.from_dlpack(torch.arange(12).reshape(3, 4).t())
  assert tt.tolist() == torch.arange(12).reshape(3, 4).t().tolist()


def test_the_seed_example_on_host_memory():
  """The seeds' usage, with a torch CPU tensor: wrap its memory, compute, write back, see it through torch."""
  x = torch.ones(8, dtype=torch.float32)
  t = Tensor.from_blob(x.data_ptr(), x.shape, dtype=dtypes.float32, device="CPU", keepalive=x)
  (t + 1).realize()
  t.assign(t + 1).realize()
  assert x.tolist() == [2.0] * 8 and t.to("CPU").numpy().tolist() == [2.0] * 8


def test_torch_dtypes_both_ways(monkeypatch):
  pairs = {torch.bool: dtypes.bool, torch.int8: dtypes.int8, torch.int16: dtypes.int16, torch.int32: dtypes.int32, torch.int64: dtypes.int64,
           torch.uint8: dtypes.uint8, torch.uint16: dtypes.uint16, torch.uint32: dtypes.uint32, torch.uint64: dtypes.uint64,
           torch.float16: dtypes.float16, torch.bfloat16: dtypes.bfloat16, torch.float32: dtypes.float32, torch.float64: dtypes.float64}
  assert set(pairs.values()) == set(dtypes.all())
  for tdt, dt in pairs.items():
    assert dtypes.from_torch(tdt) is dt and dtypes.as_dtype(tdt) is dt and dtypes.to_torch(dt) is tdt and dtypes.to_torch(dt.name) is tdt
  assert dtypes.as_dtype(torch.half) is dtypes.float16 and dtypes.as_dtype(torch.long) is dtypes.int64
  assert dtypes.as_dtype(torch.float) is dtypes.float32
  for tdt in (torch.complex64, torch.float8_e4m3fn, torch.qint8):
    with pytest.raises(TypeError, match=f"torch dtype {tdt} has no plugrt dtype"): dtypes.from_torch(tdt)
  monkeypatch.delattr(torch, "uint32")  # a torch before 2.3
  with pytest.raises(TypeError, match="has no dtype for uint32"): dtypes.to_torch(dtypes.uint32)


def test_torch_dtypes_wherever_a_dtype_is_taken():
  """The seeds' snippet passes dtype=_from_torch_dtype(t.dtype); a torch dtype itself works too."""
  x = torch.ones(4, dtype=torch.float16)
  t = Tensor.from_blob(x.data_ptr(), tuple(x.shape), dtype=x.dtype, device="CPU", keepalive=x)
  assert t.dtype is dtypes.float16
  assert Tensor([1, 2], dtype=torch.int64).dtype is dtypes.int64 and Tensor([1, 2]).cast(torch.bfloat16).dtype is dtypes.bfloat16
  assert torch.from_dlpack(Tensor([1, 2], dtype=torch.uint8).realize()).dtype == dtypes.to_torch(dtypes.uint8)


@pytest.mark.parametrize("name", ["CPU", "CL", "WEBGPU", "PYTHON"])
def test_a_dropped_from_blob_buffer_never_waits_for_the_device_in_its_finalizer(name):
  """A finalizer runs on whichever thread the collector runs on, which may be one the device's progress depends on (a
  fake GPU's command processor deadlocked on QCOM, waiting for itself): dropping a wrapped buffer never waits for the
  device; its owner goes at the device's next synchronize (or a later from_blob past a bound)."""
  import gc
  import weakref

  import numpy as np

  from plugrt import Buffer, Device
  from plugrt.dtype import dtypes
  if name not in Device.available(): pytest.skip(f"{name} is not available here")
  dev = Device[name]
  if not dev.allocator.supports_wrap: pytest.skip(f"{name} does not wrap host memory")
  state = dev.info.state
  waits = []
  if state is not None:
    real = state.synchronize
    state.synchronize = lambda: (waits.append(1), real())[1]
  try:
    host = np.arange(16, dtype=np.float32)
    owner = weakref.ref(host)
    ext = Buffer.from_blob(host.ctypes.data, 16, dtypes.float32, dev, keepalive=host)
    del host, ext
    gc.collect()
    assert waits == []  # the finalizer did not wait
    assert (owner() is not None) == (state is not None)  # a device with a queue keeps the owner until it has waited
    dev.synchronize()
    gc.collect()
    assert owner() is None
  finally:
    if state is not None: del state.synchronize


def test_a_process_waits_for_each_opened_devices_queued_work_at_exit():
  """At exit every opened device waits for its queued work before the interpreter tears down what that work reads (the
  owners of dropped wrapped buffers, which go at a synchronize), on each device that queues work."""
  import subprocess
  import sys

  from plugrt import Device
  names = [n for n in ("CL", "WEBGPU") if n in Device.available()]
  if not names: pytest.skip("no device here queues work")
  code = """
import sys
from plugrt import Device
for name in sys.argv[1:]:
  state = Device[name].info.state
  real = state.synchronize
  state.synchronize = lambda real=real, name=name: (print("waited", name, flush=True), real())[1]
"""
  r = subprocess.run([sys.executable, "-c", code, *names], capture_output=True, text=True, timeout=120)
  assert r.returncode == 0, r.stderr[-2000:]
  assert sorted(r.stdout.split("\n")[:-1]) == sorted(f"waited {n}" for n in names), r.stdout


def test_dropping_a_from_blob_buffer_waits_for_the_work_queued_on_it():
  """An external buffer lets go of its owner (keepalive) only after the device has finished the work queued on it: a
  kernel still reading a dropped from_blob array must not read freed memory. 64 MiB arrays are unmapped by free, so a
  read after it would fault or read garbage; run in a fresh process on every device that wraps memory."""
  import subprocess
  import sys
  code = """
import gc, numpy as np
from plugrt import Buffer, Device, KernelBuilder, dtypes
from plugrt.errors import UnsupportedError
dev = Device[DEVICE]
if not dev.allocator.supports_wrap: raise SystemExit(0)
b = KernelBuilder("copy"); out, x = b.buffer("out", dtypes.float32), b.buffer("x", dtypes.float32)
i = b.global_id(0); out[i] = x[i] * 2.0
prg = dev.program(b.finish())
n = 1 << 24 if DEVICE != "PYTHON" else 1 << 12  # PYTHON runs each launch to its end in the call: small is enough there
for round in range(3):
  host = np.arange(n, dtype=np.float32)
  try: ext = Buffer.from_blob(host.ctypes.data, n, dtypes.float32, dev, keepalive=host)
  except UnsupportedError: raise SystemExit(0)  # wraps device memory only (CUDA): host memory is never wrapped there
  res = Buffer(dev, n, dtypes.float32)
  prg(res, ext, global_size=(n // 256,), local_size=(256,))
  prg(Buffer(dev, 1, dtypes.float32), Buffer(dev, 1, dtypes.float32))  # the program lets go of ext
  del host, ext
  gc.collect()
  got = res.numpy()
  assert (got == np.arange(n, dtype=np.float32) * 2).all(), (round, np.flatnonzero(got != np.arange(n, dtype=np.float32) * 2)[:5])
print("ok")
"""
  from plugrt import Device
  for name in Device.available():
    r = subprocess.run([sys.executable, "-c", f"DEVICE = {name!r}\n" + code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{name}: exit {r.returncode}\n{r.stdout}\n{r.stderr[-2000:]}"
