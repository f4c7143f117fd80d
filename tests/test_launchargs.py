"""plugrt.launchargs: the scalar packers against numpy's bytes, and PreparedCall, the record of the last call a launch
was prepared for (hits, and misses on a change of buffer, size, value, type or sign); then the same on real programs."""
import ctypes
import enum
import gc
import math
import warnings
import weakref

import numpy as np
import pytest

from plugrt import Buffer, Device, dtypes, kernel
from plugrt.dtype import f32_to_bf16, iter_dtypes
from plugrt.errors import UnsupportedError
from plugrt.launchargs import NO_CALL, SCALAR_CTYPES, ExactScalars, PreparedCall, WrappedBuffers, bytes_packer, call_key, ctypes_packer, slot_packer

ALL = list(iter_dtypes())
FLOATS = [dt for dt in ALL if dt.kind == "f"]
INTS = [dt for dt in ALL if dt.kind in "iu"]

# values for each float dtype: ordinary, needing rounding (to nearest even), subnormal, largest, past the range (inf),
# ints past float64's range, signed zeros, infinities, NaN
FLOAT_VALUES = [0.0, -0.0, 1.0, -2.5, 0.1, 1 / 3, 2049.0, 2051.0, 65504.0, 65519.0, 65520.0, 6e-8, 1e-40, 3.4028234e38, 3.5e38,
                1e300, -1e300, 10 ** 400, -(10 ** 400), 7, True, False, math.inf, -math.inf, math.nan]


def numpy_bytes(v, dt) -> bytes:
  """What numpy holds for `v` as `dt` (bfloat16: float32 first, then to nearest even: the IR's cast), with numpy's
  overflow to +-inf (a Python int past float64's range is +-inf of any float dtype)."""
  if dt.kind == "f" and isinstance(v, int) and not isinstance(v, bool) and abs(v) > 1e308: v = math.inf if v > 0 else -math.inf
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", RuntimeWarning)  # numpy's overflow warning: the overflow to inf is what we compare
    if dt is dtypes.bfloat16: return np.asarray(f32_to_bf16(np.float32(v)), np.uint16).tobytes()
    return np.array(v, dt.numpy).tobytes()


def int_values(dt):
  lo, hi = int(dt.min), int(dt.max)
  return sorted({lo, lo + 1, -1 if lo < 0 else 0, 0, 1, 2, hi // 2, hi - 1, hi})


def cases():
  for dt in ALL:
    if dt is dtypes.bool: values = [True, False]
    elif dt.kind == "f": values = FLOAT_VALUES
    else: values = int_values(dt)
    for v in values: yield pytest.param(dt, v, id=f"{dt.name}-{v!r}"[:40])


@pytest.mark.parametrize("dt,v", list(cases()))
def test_bytes_packer_matches_numpy(dt, v):
  got, want = bytes_packer(dt)(v), numpy_bytes(v, dt)
  assert len(got) == dt.itemsize
  if dt.kind == "f" and isinstance(v, float) and math.isnan(v):  # a NaN: exponent all ones, mantissa not zero
    bits = int.from_bytes(got, "little")
    exp = {2: (0x7C00, 0x03FF) if dt is dtypes.float16 else (0x7F80, 0x007F), 4: (0x7F800000, 0x7FFFFF), 8: (0x7FF << 52, (1 << 52) - 1)}
    e, m = exp[dt.itemsize]
    assert bits & e == e and bits & m
    return
  assert got == want, f"{dt.name} {v!r}: {got.hex()} != numpy's {want.hex()}"


@pytest.mark.parametrize("dt,v", list(cases()))
def test_slot_packer_is_the_bytes_in_an_8_byte_slot(dt, v):
  """The CPU's slot: floats' bits in its low bytes, the rest zero; ints in two's complement over all 64 bits."""
  slot = slot_packer(dt)(v)
  assert 0 <= slot < 1 << 64
  if dt.kind == "f" and isinstance(v, float) and math.isnan(v): return  # bits checked in test_bytes_packer_matches_numpy
  if dt.kind in "iu":
    assert slot.to_bytes(8, "little") == np.array(v, np.int64 if v < 0 else np.uint64).tobytes()
    assert slot.to_bytes(8, "little")[:dt.itemsize] == numpy_bytes(v, dt)
  else:
    assert slot.to_bytes(8, "little") == numpy_bytes(v, dt).ljust(8, b"\0")


@pytest.mark.parametrize("dt,v", list(cases()))
def test_ctypes_packer_holds_the_same_bytes(dt, v):
  obj = ctypes_packer(dt)(v)
  assert type(obj) is SCALAR_CTYPES[dt] and ctypes.sizeof(obj) == dt.itemsize
  assert bytes(obj) == bytes_packer(dt)(v)


def test_bool_and_int_rules():
  assert [slot_packer(dtypes.bool)(v) for v in (True, False)] == [1, 0]
  assert [bytes_packer(dtypes.bool)(v) for v in (True, False)] == [b"\x01", b"\x00"]
  assert ctypes_packer(dtypes.bool)(True).value == 1
  assert slot_packer(dtypes.int8)(-1) == slot_packer(dtypes.int64)(-1) == (1 << 64) - 1  # sign-extended to 64 bits
  assert slot_packer(dtypes.int64)(-(1 << 63)) == 1 << 63 and slot_packer(dtypes.uint64)((1 << 64) - 1) == (1 << 64) - 1
  assert slot_packer(dtypes.uint32)(0xFFFFFFFF) == 0xFFFFFFFF
  assert bytes_packer(dtypes.int16)(-2) == b"\xfe\xff"


@pytest.mark.parametrize("dt", FLOATS, ids=lambda d: d.name)
def test_floats_round_to_nearest_even_and_overflow_to_inf_everywhere(dt):
  inf, ninf = numpy_bytes(math.inf, dt), numpy_bytes(-math.inf, dt)
  big = {dtypes.float16: 65520.0, dtypes.bfloat16: 3.4e38 * 2, dtypes.float32: 3.5e38, dtypes.float64: 10 ** 400}[dt]
  for pack in (bytes_packer(dt), lambda v: bytes(ctypes_packer(dt)(v)), lambda v: slot_packer(dt)(v).to_bytes(8, "little")[:dt.itemsize]):
    assert pack(big) == inf and pack(-big) == ninf
    assert pack(-0.0) != pack(0.0)
  if dt is dtypes.float16:  # 2049 lies halfway between 2048 and 2050: to the even 2048; 2051 to 2052
    assert np.frombuffer(bytes_packer(dt)(2049.0), np.float16)[0] == 2048 and np.frombuffer(bytes_packer(dt)(2051.0), np.float16)[0] == 2052


# ---------------------------------------------------------------- PreparedCall

class Buf:  # stands for a Buffer: compared by identity
  pass


A, B = Buf(), Buf()
G, L = (4, 1, 1), (64, 1, 1)


def prepared(bufs=(A, B), vals=(2.5, 7), gs=G, ls=L) -> PreparedCall: return PreparedCall(bufs, call_key(vals, gs, ls))


def test_no_call_matches_nothing():
  assert not NO_CALL.repeated_by((), (), (1, 1, 1), (1, 1, 1)) and not NO_CALL.repeated_by((), (), 1, 1)


def test_same_call_hits_with_the_tuple_itself_or_an_equal_one():
  vals = (2.5, 7)
  p = prepared(vals=vals)
  assert type(p.vals) is tuple  # no bool and no 0 or 1: == alone decides
  assert p.repeated_by((A, B), vals, G, L) and p.repeated_by((A, B), (2.5, 7), (4, 1, 1), (64, 1, 1))
  q = prepared(vals=(1, 0.0, True))
  assert type(q.vals) is ExactScalars
  assert q.repeated_by((A, B), q.vals, G, L) and q.repeated_by((A, B), (1, 0.0, True), G, L)


def test_buffer_and_size_changes_miss():
  p = prepared()
  assert not p.repeated_by((B, A), (2.5, 7), G, L) and not p.repeated_by((A, Buf()), (2.5, 7), G, L)
  assert not p.repeated_by((A,), (2.5, 7), G, L)
  assert not p.repeated_by((A, B), (2.5, 7), (8, 1, 1), L) and not p.repeated_by((A, B), (2.5, 7), G, (32, 1, 1))
  assert not p.repeated_by((A, B), (2.5, 8), G, L) and not p.repeated_by((A, B), (2.5,), G, L)


@pytest.mark.parametrize("first,then", [(1, 1.0), (1, True), (1.0, True), (True, 1), (1.0, 1), (0, False), (0, 0.0), (0.0, -0.0),
                                        (-0.0, 0.0), (False, 0.0)])
def test_a_change_of_type_or_sign_misses(first, then):
  for before, after in (((first,), (then,)), ((2.5, first, 9), (2.5, then, 9))):
    p = prepared(vals=before)
    assert before == after and not p.repeated_by((A, B), after, G, L), f"{before} then {after}"
    assert prepared(vals=after).repeated_by((A, B), after, G, L)


def test_exact_scalars_compare_exactly_both_ways():
  vals = (1, 0.0)
  e = call_key(vals, G, L)[0]
  assert type(e) is ExactScalars and e.source is vals and tuple(e) == vals
  assert e == vals and not e != vals and vals == e and (1, 0.0) == e and e == [1, 0.0]  # its own tuple, an exact copy, a list
  for other in ((True, 0.0), (1.0, 0.0), (1, -0.0), (1, False), (1, 0.0, 2), [1, -0.0]):
    assert other != e and e != other and not other == e, other
  assert e == call_key((1, 0.0), G, L)[0] and e != call_key((1, -0.0), G, L)[0]
  assert hash(e) == hash(vals)


def test_a_list_is_kept_as_a_copy():
  for start in ([1.5, 3], [1.5, 1]):  # plain, and exact scalars
    gs, vals = [4, 1, 1], list(start)
    p = prepared(vals=vals, gs=gs)
    assert p.repeated_by((A, B), list(start), [4, 1, 1], L) and p.repeated_by((A, B), vals, gs, L)
    gs[0], vals[0] = 8, 2.5  # the caller changes its lists: the next call is another call
    assert not p.repeated_by((A, B), vals, [4, 1, 1], L) and not p.repeated_by((A, B), list(start), gs, L)


class Flag(enum.IntEnum):
  ON = 1


def test_a_scalar_marshal_cannot_write_prepares_again_without_raising():
  p = prepared(vals=(1,))
  assert not p.repeated_by((A, B), (Flag.ON,), G, L)  # an int subclass, equal to 1, that marshal refuses
  q = prepared(vals=(Flag.ON,))
  assert q.vals.key is None and not q.repeated_by((A, B), (Flag.ON,), G, L) and q.repeated_by((A, B), q.vals.source, G, L)
  assert not prepared(vals=(np.float64(0.0),)).repeated_by((A, B), (np.float64(-0.0),), G, L)  # numpy's: written as their bytes


class Wrapped:  # stands for a Buffer over memory plugrt does not own (from_blob)
  _external = True


class Owned:
  _external = False


def test_wrapped_buffers_match_the_same_buffers_while_they_live():
  """A call's record holds a wrapped buffer weakly, an owned one as it is; a call compares equal while each lives (the
  call's tuple on the left, as Program.__call__ writes it), and differs once the wrapped one is gone, without raising."""
  w, o = Wrapped(), Owned()
  p = PreparedCall(WrappedBuffers((w, o)), call_key((2.5,), G, L))
  assert p.repeated_by((w, o), (2.5,), G, L) and not ((w, o) != p.bufs) and p.bufs == (w, o) and p.bufs.live() == (w, o)
  assert not p.repeated_by((o, w), (2.5,), G, L) and not p.repeated_by((w, Owned()), (2.5,), G, L) and not p.repeated_by((w,), (2.5,), G, L)
  assert type(p.bufs[0]) is weakref.ref and p.bufs[1] is o  # the record keeps the wrapped one by a weak reference only
  gone = weakref.ref(w)
  del w
  gc.collect()
  assert gone() is None and p.bufs.live() is None
  assert not p.repeated_by((Wrapped(), o), (2.5,), G, L) and not p.repeated_by((None, o), (2.5,), G, L)


# ---------------------------------------------------------------- on real programs

@kernel
def recip(out: dtypes.float32[:], a: dtypes.float32):
  out[0] = 1.0 / a


@kernel
def store_int(out: dtypes.int32[:], n: dtypes.int32):
  out[0] = n


DEVICES = [d for d in ("CPU", "CL", "PYTHON", "CUDA", "NV") if d in Device.available()]


@pytest.mark.parametrize("dev", DEVICES)
def test_a_program_sees_each_call_exactly(dev):
  """A repeated launch must not reuse arguments prepared for an equal-looking call: -0.0 after 0.0 gives -inf, and an
  int argument given True after 1 is refused as it would be on a first call."""
  d = Device[dev]
  out = Buffer(d, 1, dtypes.float32)
  prg = d.program(recip.ir())
  for a, want in ((0.0, math.inf), (-0.0, -math.inf), (-0.0, -math.inf), (0.0, math.inf), (2.0, 0.5), (2, 0.5), (True, 1.0)):
    prg(out, vals=(a,))
    assert out.numpy()[0] == want, f"{dev}: 1/{a!r}"
  other = Buffer(d, 1, dtypes.float32)
  for o, a, want in ((out, 0.0, math.inf), (other, -0.0, -math.inf), (out, 0.0, math.inf)):  # new buffers and another sign at once
    prg(o, vals=(a,))
    assert o.numpy()[0] == want, f"{dev}: 1/{a!r}"
  iout = Buffer(d, 1, dtypes.int32)
  prg = d.program(store_int.ir())
  prg(iout, vals=(1,))
  with pytest.raises(TypeError, match="must be a int32"): prg(iout, vals=(True,))
  with pytest.raises(TypeError, match="must be a int32"): prg(iout, vals=(1.0,))
  prg(iout, vals=(1,))
  assert iout.numpy()[0] == 1


@kernel
def axpy(out: dtypes.float32[:], x: dtypes.float32[:], a: dtypes.float32, b: dtypes.float32):
  out[0] = a * x[0] + b


@pytest.mark.parametrize("dev", DEVICES)
def test_the_same_scalars_with_new_buffers_each_call(dev):
  """A kernel run on each new frame: the scalars and sizes repeat, the buffers are new every call. Every result lands
  in its own buffer from its own input, and a wrong buffer is refused on that path as on a first call."""
  d = Device[dev]
  prg = d.program(axpy.ir())
  outs = [Buffer(d, 1, dtypes.float32) for _ in range(6)]
  ins = [Buffer(d, 1, dtypes.float32).copyin(np.array([k], np.float32)) for k in range(6)]
  for k in range(6): prg(outs[k], ins[k], vals=(2.0, 0.5))
  assert [o.numpy()[0] for o in outs] == [2 * k + 0.5 for k in range(6)]
  with pytest.raises(TypeError, match="must be a buffer of float32"): prg(outs[0], Buffer(d, 1, dtypes.int32), vals=(2.0, 0.5))
  with pytest.raises(TypeError, match="takes 2 buffer"): prg(outs[0], vals=(2.0, 0.5))
  if dev != "PYTHON":
    with pytest.raises(TypeError, match="is a buffer on"): prg(outs[0], Buffer(Device["PYTHON"], 1, dtypes.float32), vals=(2.0, 0.5))
  prg(outs[1], ins[5], vals=(2.0, -0.0))  # the same numbers but one: prepared again in full
  prg(outs[2], ins[4], vals=(-1.0, 0.0))
  assert (outs[1].numpy()[0], outs[2].numpy()[0]) == (10.0, -4.0)


@pytest.mark.parametrize("dev", DEVICES)
def test_a_new_result_buffer_each_call_reuses_the_launch_over_its_memory(dev):
  """A result buffer per call, the last dropped (as Tensor's realize does): the program holds its last call's buffers, so
  the blocks alternate, and a program whose launches are self-contained submits the call before the last again over the
  same memory instead of encoding it (_rebind). Every result lands in its own buffer; other scalars are prepared anew."""
  d = Device[dev]
  prg = d.program(axpy.ir())
  x = Buffer(d, 1, dtypes.float32).copyin(np.array([3.0], np.float32))
  rebinds, real = [], prg._rebind
  prg._rebind = lambda last, bufs: (rebinds.append(len(bufs)), real(last, bufs))[1]  # (not the buffers: kept, they would take new blocks)
  seen = set()
  for k in range(12):
    if k == 4: rebinds.clear()  # (the first calls may take blocks freed before)
    out = Buffer(d, 1237, dtypes.float32).copyin(np.full(1237, np.nan, np.float32))  # (a size no other test leaves cached)
    if k >= 4: seen.add(out.handle if isinstance(out.handle, int) else id(out.handle))
    prg(out, x, vals=(2.0, 0.5))
    assert out.numpy()[0] == 6.5, f"{dev}: call {k} wrote {out.numpy()[0]}"
  if prg.self_contained:
    assert len(seen) == 2, f"{dev}: the results took {len(seen)} blocks (the allocator's cache hands the last freed back)"
    assert not rebinds, f"{dev}: {len(rebinds)} of 8 calls over two blocks were encoded again"
  out = Buffer(d, 1, dtypes.float32)
  prg(out, x, vals=(2.0, 1.5))  # other scalars: prepared in full
  assert out.numpy()[0] == 7.5


def test_a_cuda_launch_with_new_buffers_keeps_the_packed_scalars():
  if "CUDA" not in DEVICES: pytest.skip("no CUDA device here")
  d = Device["CUDA"]
  prg = d.program(axpy.ir())
  a, b, c = (Buffer(d, 1, dtypes.float32) for _ in range(3))
  prg(a, b, vals=(3.0, 1.0))
  first = prg._prepared
  prg(c, b, vals=(3.0, 1.0))
  again = prg._prepared
  assert again is not first and again.bufs == (c, b) and again.values[2:] == first.values[2:] and again.values[2] is first.values[2]
  assert again.slots[10] != first.slots[10] and list(again.slots)[:10] == list(first.slots)[:10]


def test_a_repeated_cpu_launch_reuses_its_prepared_launch():
  if "CPU" not in DEVICES: pytest.skip("no CPU device here")
  d = Device["CPU"]
  out = Buffer(d, 1, dtypes.float32)
  prg = d.program(recip.ir())
  for a in (3.0, 1.0, 0.0):
    prg(out, vals=(a,))
    launch = prg._prepared
    prg(out, vals=(a * 1,))  # a new, equal tuple (with 1.0 and 0.0: compared exactly, and still the same)
    assert prg._prepared is launch


@pytest.mark.parametrize("dev", DEVICES)
def test_a_program_keeps_no_wrapped_buffer_of_its_last_call(dev):
  """A program records its last call until it is called with other arguments, which may be never: a wrapped buffer
  (from_blob) dropped by its caller goes, and its owner (keepalive) with the device's next synchronize, however the
  program was called. A repeated call over live wrapped buffers still submits what was prepared."""
  d = Device[dev]
  if not d.allocator.supports_wrap: pytest.skip(f"{dev} does not wrap host memory")
  prg = d.program(axpy.ir())
  host, out_host = np.array([3.0], np.float32), np.zeros(1, np.float32)
  try: x = Buffer.from_blob(host.ctypes.data, 1, dtypes.float32, d, keepalive=host)
  except UnsupportedError: pytest.skip(f"{dev} wraps device memory only")  # (CUDA: the core's record is the same there)
  out = Buffer.from_blob(out_host.ctypes.data, 1, dtypes.float32, d, keepalive=out_host)
  prg(out, x, vals=(2.0, 0.5))
  launch = prg._prepared
  prg(out, x, vals=(2.0, 0.5))
  assert prg._prepared is launch and out.numpy()[0] == 6.5
  owned = Buffer(d, 1, dtypes.float32)
  prg(owned, x, vals=(2.0, 0.5))  # an owned result beside a wrapped input: prepared with the buffers alone new
  assert owned.numpy()[0] == 6.5
  buffers, owners = [weakref.ref(x), weakref.ref(out)], [weakref.ref(host), weakref.ref(out_host)]
  del x, out, host, out_host
  gc.collect()
  d.synchronize()
  assert [b() for b in buffers] == [None, None], f"{dev}: the program keeps a dropped wrapped buffer"
  assert [o() for o in owners] == [None, None], f"{dev}: a dropped wrapped buffer's owner is still alive"
  again = Buffer(d, 1, dtypes.float32).copyin(np.array([4.0], np.float32))
  prg(owned, again, vals=(2.0, 0.5))  # the same scalars over other memory: the gone buffers are not the call's
  assert owned.numpy()[0] == 8.5
