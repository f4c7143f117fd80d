"""CL programs: a kernel object prepared once, arguments set only when they change.

A program holds its cl.Kernel for its whole life. A launch compares the buffers,
scalars and sizes with the previous launch's (a plugrt.launchargs.PreparedCall: tuple
identity and equality, well under a microsecond) and only for what differs calls
clSetKernelArg, through pyopencl's raw setters; then one clEnqueueNDRangeKernel with
positional arguments (pybind11 is slow with keywords). `wait=True` waits for the queue
and reads the launch's own profiling event: the device's start-to-end time, not the
host's.

Threads: the kernel's arguments are state of the one cl.Kernel (OpenCL's one call that
is not thread-safe is clSetKernelArg on a shared kernel), so a launch's compare, set and
enqueue run under the program's lock together; the queue itself is thread-safe.
"""
from __future__ import annotations

import struct
from _thread import allocate_lock
from collections.abc import Sequence
from typing import Any

import pyopencl as cl

from plugrt.device import Buffer
from plugrt.errors import PluginError
from plugrt.ir import Signature
from plugrt.launchargs import NO_CALL, PreparedCall, bytes_packer, call_key
from plugrt.runtime import Program
from plugrt_cl.compiler import build, unframe
from plugrt_cl.device import CLState

_enqueue = cl._cl.enqueue_nd_range_kernel
_START, _END = cl.profiling_info.START, cl.profiling_info.END
_U64 = struct.Struct("<Q").pack


class CLProgram(Program):
  def __init__(self, device: Any, name: str, lib: bytes, signature: Signature, prg: Any):
    super().__init__(device, name, lib, signature)
    self.state: CLState = device.info.state
    self.program = prg
    try: self.kernel = cl._cl.Kernel(prg, name)
    except cl.Error as e: raise PluginError(f"{self.state.label}: program {name} has no kernel {name}: {e}") from None
    self._queue = self.state.queue
    self._pack = [bytes_packer(dt) for dt in signature.scalars]  # bool: unsigned char; float16/bfloat16: their 16 bits
    self._set_mem, self._set_bytes = self.kernel.set_arg, self.kernel._set_arg_buf
    self._last: PreparedCall = NO_CALL  # the call the kernel's arguments are set for
    self._set: list[Any] = [None] * (2 * self.nbufs + self.nvals)  # what each kernel argument is set to now (scalars: (type, value))
    self._gs, self._ls = (1, 1, 1), (1, 1, 1)
    self._lock = allocate_lock()
    self.launch_limits = self.state.launch_limits

  def __call__(self, *bufs: Buffer, global_size: Any = (1, 1, 1), local_size: Any = (1, 1, 1), vals: Sequence[Any] = (),
               wait: bool = False) -> float | None:
    with self._lock:  # see the module docstring
      last = self._last
      if bufs != last.bufs or vals != last.vals or (global_size, local_size) != last.dims:  # see plugrt.launchargs
        self._prepare(bufs, vals, global_size, local_size)
      ev = _enqueue(self._queue, self.kernel, self._gs, self._ls, None, None, True, False)  # True: global = groups x local
    if wait:
      self._queue.finish()  # cheaper than the event's own wait on PoCL (15 us against 25 us)
      return (ev.get_profiling_info(_END) - ev.get_profiling_info(_START)) * 1e-9
    return None

  def _prepare(self, bufs: Sequence[Buffer], vals: Sequence[Any], global_size: Any, local_size: Any) -> None:
    last = self._last
    new_buffers_only = self.repeats_but_buffers(last, bufs, vals, global_size, local_size)
    if not new_buffers_only: gs, ls = self.check_args(bufs, vals, global_size, local_size)  # with the device's work-group limits
    cur = self._set
    for i, b in enumerate(bufs):  # only the arguments that differ from what the kernel holds
      h = b.handle
      if cur[2 * i] is not h.buf: self._set_mem(2 * i, h.buf); cur[2 * i] = h.buf
      if cur[2 * i + 1] != h.offset: self._set_bytes(2 * i + 1, _U64(h.offset)); cur[2 * i + 1] = h.offset
    if new_buffers_only:
      self._last = PreparedCall(tuple(bufs), (last.vals, last.dims))  # new buffers only: the scalars are set
      return
    base = 2 * self.nbufs
    for j, (v, pack) in enumerate(zip(vals, self._pack)):
      # (type, value): 1, 1.0 and True differ; a float zero is set every time (0.0 == -0.0, and -0.0 is another argument)
      if cur[base + j] != (key := (type(v), v)) or (v == 0 and type(v) is float):
        self._set_bytes(base + j, pack(v)); cur[base + j] = key
    self._gs, self._ls = gs, ls
    self._last = PreparedCall(tuple(bufs), call_key(vals, global_size, local_size))

def load_program(device: Any, name: str, lib: bytes, signature: Signature) -> CLProgram:
  """The program for `lib`: the one compile_uncached just built, else a build from the binary (a disk-cache hit)."""
  st: CLState = device.info.state
  fresh = st.fresh.pop(lib, None)
  prg = fresh[0] if fresh is not None else build(st, None, unframe(lib, name), "", name)
  return CLProgram(device, name, lib, signature, prg)
