"""METAL graphs: a batch of launches encoded once into an MTLIndirectCommandBuffer, replayed with one command buffer.

Made once (plugrt_graph's factory): an indirect command buffer of ConcurrentDispatch commands that inherit neither
buffers nor pipeline state, one command per launch with its pipeline (made with supportIndirectCommandBuffers), its
buffers (setKernelBuffer:offset:atIndex:), its scalars (indirect commands have no setBytes: each scalar lives in one
shared MTLBuffer of the graph, 256 bytes apart, the alignment constant-address-space offsets need on macOS, bound at
its index), its sizes (concurrentDispatchThreadgroups:threadsPerThreadgroup:) and a barrier (setBarrier), so each
launch sees the one before, as launch-by-launch replay does. A replay: a command buffer, a compute encoder,
useResources:count:usage: for every buffer the commands use (an indirect command buffer's resources are not made
resident by themselves), executeCommandsInBuffer:withRange:, endEncoding, commit. Where the device makes no indirect
command buffer, the core's launch-by-launch Graph is used instead.
"""
from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

from plugrt.runtime import Graph, Launch
from plugrt_metal.device import MTL_RESOURCE_STORAGE_MODE_SHARED, MetalError, MetalState
from plugrt_metal.objc import MTLSize, NSRange

MTL_INDIRECT_COMMAND_TYPE_CONCURRENT_DISPATCH = 1 << 5  # MTLIndirectCommandType (MTLIndirectCommandBuffer.h)
MTL_RESOURCE_USAGE_READ_WRITE = (1 << 0) | (1 << 1)     # MTLResourceUsageRead | MTLResourceUsageWrite (MTLComputeCommandEncoder.h)
MAX_BUFFER_BINDS = 31                                   # buffer argument table entries of a compute function
SCALAR_STRIDE = 256


class MetalGraph(Graph):
  def __init__(self, device: Any, launches: Sequence[Launch]):
    super().__init__(device, launches)
    st: MetalState = device.info.state
    self.state = st
    c, S = st.calls, st.calls.S
    binds = max((ln.program.nbufs + ln.program.nvals for ln in self.launches), default=0)
    if binds > MAX_BUFFER_BINDS: raise MetalError(f"{st.label}: a launch binds {binds} buffers; an indirect command binds at most {MAX_BUFFER_BINDS}")
    # every scalar of every launch in one shared buffer
    packed = [pack(v) for ln in self.launches for pack, v in zip(ln.program._packers, ln.vals)]
    self.scalars = c.id_ulong_ulong(st.device, S.newBufferWithLength_options_, max(1, SCALAR_STRIDE * len(packed)), MTL_RESOURCE_STORAGE_MODE_SHARED)
    if not self.scalars: raise MemoryError(f"{st.label}: no memory for a graph's {len(packed)} scalars")
    host = c.id(self.scalars, S.contents)
    for k, data in enumerate(packed): ctypes.memmove(host + k * SCALAR_STRIDE, data, len(data))
    desc = c.new("MTLIndirectCommandBufferDescriptor")
    try:
      c.void_ulong(desc, S.setCommandTypes_, MTL_INDIRECT_COMMAND_TYPE_CONCURRENT_DISPATCH)
      c.void_bool(desc, S.setInheritBuffers_, False)
      c.void_bool(desc, S.setInheritPipelineState_, False)
      c.void_ulong(desc, S.setMaxKernelBufferBindCount_, MAX_BUFFER_BINDS)
      self.icb = c.id_id_ulong_ulong(st.device, S.newIndirectCommandBufferWithDescriptor_maxCommandCount_options_, desc,
                                     max(1, len(self.launches)), 0)
    finally: c.release(desc)
    if not self.icb:
      c.release(self.scalars)
      raise MetalError(f"{st.label}: newIndirectCommandBufferWithDescriptor returned nil")
    k, used = 0, {self.scalars}
    for i, ln in enumerate(self.launches):
      cmd = c.id_ulong(self.icb, S.indirectComputeCommandAtIndex_, i)
      c.void_id(cmd, S.setComputePipelineState_, ln.program.pipeline.pso)
      for j, b in enumerate(ln.bufs):
        c.set_buffer(cmd, S.setKernelBuffer_offset_atIndex_, b.handle.buf, b.handle.offset, j)
        used.add(b.handle.buf)
      for j in range(ln.program.nvals):
        c.set_buffer(cmd, S.setKernelBuffer_offset_atIndex_, self.scalars, k * SCALAR_STRIDE, ln.program.nbufs + j)
        k += 1
      c.dispatch(cmd, S.concurrentDispatchThreadgroups_threadsPerThreadgroup_, MTLSize(*ln.global_size), MTLSize(*ln.local_size))
      c.void(cmd, S.setBarrier)
    self.resources = (ctypes.c_void_p * len(used))(*sorted(used))
    self.range = NSRange(0, len(self.launches))
    self.keep = [ln.bufs for ln in self.launches]  # the buffers the commands point at stay alive with the graph

  def _replay(self) -> Any:
    """One command buffer executing the indirect commands, committed; returns it."""
    st = self.state
    c, S = st.calls, st.calls.S
    pool = st.rt.pool_push()
    try:
      cb = c.id(st.queue, S.commandBuffer)
      enc = c.id(cb, S.computeCommandEncoder)
      c.use_resources(enc, S.useResources_count_usage_, self.resources, len(self.resources), MTL_RESOURCE_USAGE_READ_WRITE)
      c.execute(enc, S.executeCommandsInBuffer_withRange_, self.icb, self.range)
      c.void(enc, S.endEncoding)
      c.void(cb, S.commit)
      c.id(cb, S.retain)
    finally: st.rt.pool_pop(pool)
    st.committed(cb)
    return cb

  def _timed(self) -> float:
    cb = self._replay()
    self.state.wait(cb)
    return self.state.gpu_seconds(cb)

  def __del__(self) -> None:
    try:
      self.state.synchronize()  # a replay in flight still reads the commands
      self.state.calls.release(self.icb)
      self.state.calls.release(self.scalars)
    except Exception: pass  # interpreter shutdown


def make_graph(device: Any, launches: Sequence[Launch]) -> Graph:
  """An indirect-command-buffer graph where every program's pipeline allows it, else the core's launch-by-launch one."""
  launches = list(launches)
  if launches and all(getattr(getattr(ln.program, "pipeline", None), "indirect", False) for ln in launches):
    try: return MetalGraph(device, launches)
    except MetalError: pass  # no indirect command buffers on this device
  return Graph(device, launches)
