"""CL programs: a kernel object prepared once, arguments set only when they change.

A program holds its cl.Kernel for its whole life. The core's launch protocol compares a call with the last one
(plugrt.runtime.Program); a new one calls clSetKernelArg, through pyopencl's raw setters, only for the arguments that
differ from what the kernel holds; a launch is one clEnqueueNDRangeKernel with positional arguments (pybind11 is
slow with keywords). `wait=True` waits for the queue and reads the launch's own profiling event: the device's
start-to-end time, not the host's.

Threads: the kernel's arguments are state of the one cl.Kernel (OpenCL's one call that is not thread-safe is
clSetKernelArg on a shared kernel), so a CLProgram is a LockedProgram: compare, set and enqueue run under its lock
together; the queue itself is thread-safe.
"""
from __future__ import annotations

import struct
from functools import partial
from typing import Any

import pyopencl as cl

from plugrt.compiler.ir import Signature
from plugrt.errors import PluginError
from plugrt.launchargs import PreparedCall, bytes_packer
from plugrt.runtime import LockedProgram
from plugrt_cl.compiler import build, unframe
from plugrt_cl.device import CLState

_enqueue = cl._cl.enqueue_nd_range_kernel
_START, _END = cl.profiling_info.START, cl.profiling_info.END
_U64 = struct.Struct("<Q").pack


class CLProgram(LockedProgram):
  scalar_packer = staticmethod(bytes_packer)  # bool: unsigned char; float16/bfloat16: their 16 bits

  def __init__(self, device: Any, name: str, lib: bytes, signature: Signature, prg: Any):
    super().__init__(device, name, lib, signature)
    self.state: CLState = device.info.state
    self.program = prg
    try: self.kernel = cl._cl.Kernel(prg, name)
    except cl.Error as e: raise PluginError(f"{self.state.label}: program {name} has no kernel {name}: {e}") from None
    self._queue = self.state.queue
    self._set_mem, self._set_bytes = self.kernel.set_arg, self.kernel._set_arg_buf
    self._set: list[Any] = [None] * (2 * self.nbufs + self.nvals)  # what each kernel argument is set to now (scalars: their bytes)
    self.launch_limits = self.state.launch_limits

  # ---- under the program's lock (see the module docstring): each sets only the kernel arguments that differ
  def _encode(self, bufs: tuple, scalars: tuple, gs: tuple[int, int, int], ls: tuple[int, int, int]) -> PreparedCall:
    self._set_buffers(bufs)
    cur, base = self._set, 2 * self.nbufs
    for j, data in enumerate(scalars):  # bytes: 1, 1.0 and True, and 0.0 and -0.0, differ
      if cur[base + j] != data: self._set_bytes(base + j, data); cur[base + j] = data
    return self._enqueuer(gs, ls)

  def _rebind(self, last: PreparedCall, bufs: tuple) -> PreparedCall:
    self._set_buffers(bufs)
    return self._enqueuer(*last.sizes)

  def _set_buffers(self, bufs: tuple) -> None:
    cur = self._set
    for i, b in enumerate(bufs):
      h = b.handle
      if cur[2 * i] is not h.buf: self._set_mem(2 * i, h.buf); cur[2 * i] = h.buf
      if cur[2 * i + 1] != h.offset: self._set_bytes(2 * i + 1, _U64(h.offset)); cur[2 * i + 1] = h.offset

  def _enqueuer(self, gs: tuple[int, int, int], ls: tuple[int, int, int]) -> PreparedCall:
    return PreparedCall(submit=partial(_enqueue, self._queue, self.kernel, gs, ls, None, None, True, False))  # True: global = groups x local

  def _timed(self, prepared: PreparedCall) -> float:
    ev = prepared.submit()
    self._queue.finish()  # cheaper than the event's own wait on PoCL
    return (ev.get_profiling_info(_END) - ev.get_profiling_info(_START)) * 1e-9


def load_program(device: Any, name: str, lib: bytes, signature: Signature) -> CLProgram:
  """The program for `lib`: the one compile_uncached just built, else a build from the binary (a disk-cache hit)."""
  st: CLState = device.info.state
  fresh = st.fresh.pop(lib, None)
  prg = fresh[0] if fresh is not None else build(st, None, unframe(lib, name), "", name)
  return CLProgram(device, name, lib, signature, prg)
