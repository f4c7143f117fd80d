"""METAL programs: a compute pipeline built once, a launch encoded from prepared arguments.

Loading a binary makes its MTLLibrary, the kernel's MTLFunction and an MTLComputePipelineState once (the device keeps
them per binary and kernel name, so loading the same binary again builds nothing). The pipeline's
maxTotalThreadsPerThreadgroup bounds local_size (a LaunchError naming the device before anything is encoded);
threadExecutionWidth is the SIMD-group size, kept as `simd_width`.

A launch (the core's protocol: plugrt.runtime.Program; a MetalProgram is a LockedProgram, its own lock around
prepare and submit), in one Python frame after the core's comparison: push an autorelease pool, [queue commandBuffer],
[cb computeCommandEncoder], setComputePipelineState:, setBuffer:offset:atIndex: per buffer (a view is its buffer
and byte offset), setBytes:length:atIndex: per scalar, dispatchThreadgroups:threadsPerThreadgroup: (MTLSize by
value: global_size groups of local_size threads), endEncoding, commit, retain the command buffer for the device's
waits, pop the pool. Every call goes through a typed objc_msgSend made when the device opened, with selectors
resolved then; the arguments (buffer triples, packed scalars, the two MTLSizes) are prepared (_encode) when the call
differs from the previous one (plugrt.launchargs). wait=True waits (bounded) and returns GPUEndTime - GPUStartTime.
"""
from __future__ import annotations

import ctypes
from functools import partial
from typing import Any

from plugrt.compiler.ir import Signature
from plugrt.errors import CompileError, PluginError
from plugrt.launchargs import PreparedCall, bytes_packer
from plugrt.runtime import LockedProgram
from plugrt_metal.compiler import BUG_HINT, load_library
from plugrt_metal.device import MetalState
from plugrt_metal.objc import MTLSize


class Pipeline:
  """A kernel's MTLLibrary, MTLFunction and MTLComputePipelineState, and the pipeline's limits. `indirect`: made with
  supportIndirectCommandBuffers, so indirect command buffers (plugrt_metal.graph) may use it."""
  __slots__ = ("function", "indirect", "library", "max_total", "pso", "simd_width")

  def __init__(self, library: int, function: int, pso: int, max_total: int, simd_width: int, indirect: bool):
    self.library, self.function, self.pso, self.max_total, self.simd_width = library, function, pso, max_total, simd_width
    self.indirect = indirect


MTL_PIPELINE_OPTION_NONE = 0  # MTLPipelineOption (MTLDevice.h)


def build_pipeline(state: MetalState, lib: bytes, name: str) -> Pipeline:
  if (hit := state.pipelines.get((lib, name))) is not None: return hit
  c, S = state.calls, state.calls.S
  library = load_library(state, lib, name)
  ns = c.nsstring(name)
  try: fn = c.id_id(library, S.newFunctionWithName_, ns)
  finally: c.release(ns)
  if not fn: raise PluginError(f"{state.label}: the library of program {name} has no kernel function {name}", BUG_HINT)
  err = ctypes.c_void_p()
  if (indirect := bool(state.rt.cls("MTLComputePipelineDescriptor"))):  # a pipeline indirect command buffers can use too
    desc = c.new("MTLComputePipelineDescriptor")
    try:
      c.void_id(desc, S.setComputeFunction_, fn)
      c.void_bool(desc, S.setSupportIndirectCommandBuffers_, True)
      pso = c.id_id_ulong_ptr_err(state.device, S.newComputePipelineStateWithDescriptor_options_reflection_error_, desc,
                                  MTL_PIPELINE_OPTION_NONE, None, ctypes.byref(err))
    finally: c.release(desc)
  else: pso = c.id_id_err(state.device, S.newComputePipelineStateWithFunction_error_, fn, ctypes.byref(err))
  if not pso: raise CompileError(f"{state.label}: Metal cannot make a compute pipeline of kernel {name}", c.error_text(err.value), BUG_HINT)
  p = Pipeline(library, fn, pso, int(c.ulong(pso, S.maxTotalThreadsPerThreadgroup)), int(c.ulong(pso, S.threadExecutionWidth)), indirect)
  state.pipelines[(lib, name)] = p
  return p


class MetalProgram(LockedProgram):
  scalar_packer = staticmethod(bytes_packer)  # bool: one byte (uchar); float16/bfloat16: their 16 bits

  def __init__(self, device: Any, name: str, lib: bytes, signature: Signature, pipeline: Pipeline):
    super().__init__(device, name, lib, signature)
    st: MetalState = device.info.state
    self.state, self.pipeline, self.simd_width = st, pipeline, pipeline.simd_width
    self.launch_limits = st.launch_limits(pipeline.max_total)
    c, S = st.calls, st.calls.S
    # what a launch calls: typed objc_msgSend functions, selectors and objects, each one attribute away
    self._queue, self._pso, self._push, self._pop = st.queue, pipeline.pso, st.rt.pool_push, st.rt.pool_pop
    self._id, self._void, self._void_id, self._set_buffer, self._set_bytes, self._dispatch = \
      c.id, c.void, c.void_id, c.set_buffer, c.set_bytes, c.dispatch
    self._sels = (S.commandBuffer, S.computeCommandEncoder, S.setComputePipelineState_, S.setBuffer_offset_atIndex_,
                  S.setBytes_length_atIndex_, S.dispatchThreadgroups_threadsPerThreadgroup_, S.endEncoding, S.commit, S.retain, S.release)

  def _encode(self, bufs: tuple, scalars: tuple, gs: tuple[int, int, int], ls: tuple[int, int, int]) -> PreparedCall:
    bind = tuple((b.handle.buf, b.handle.offset, i) for i, b in enumerate(bufs))  # (MTLBuffer, byte offset, index) per buffer
    base = self.nbufs
    data = tuple((d, len(d), base + j) for j, d in enumerate(scalars))  # (packed scalar, length, index) per scalar
    return PreparedCall(submit=partial(self._submit, bind, data, MTLSize(*gs), MTLSize(*ls)))

  def _submit(self, bind: tuple, data: tuple, groups: Any, threads: Any) -> Any:
    """Encode and commit one command buffer (under the program's lock); returns it."""
    s_cb, s_enc, s_pso, s_buf, s_bytes, s_dispatch, s_end, s_commit, s_retain, s_release = self._sels
    ident, void, set_buffer, set_bytes = self._id, self._void, self._set_buffer, self._set_bytes
    pool = self._push()
    try:
      cb = ident(self._queue, s_cb)
      enc = ident(cb, s_enc)
      self._void_id(enc, s_pso, self._pso)
      for buf, off, i in bind: set_buffer(enc, s_buf, buf, off, i)
      for d, n, i in data: set_bytes(enc, s_bytes, d, n, i)
      self._dispatch(enc, s_dispatch, groups, threads)
      void(enc, s_end)
      void(cb, s_commit)
      ident(cb, s_retain)  # past the pool: the device waits on it; the one it waited on before is let go
      st = self.state
      prev, st.last = st.last, cb  # MetalState.committed, inline
      if prev: void(prev, s_release)
    finally: self._pop(pool)
    return cb

  def _timed(self, prepared: PreparedCall) -> float:
    cb = prepared.submit()
    self.state.wait(cb)
    return self.state.gpu_seconds(cb)


def load_program(device: Any, name: str, lib: bytes, signature: Signature) -> MetalProgram:
  return MetalProgram(device, name, lib, signature, build_pipeline(device.info.state, lib, name))
