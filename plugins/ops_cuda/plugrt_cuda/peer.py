"""Copies between two CUDA GPUs without the host: peer access, enabled once per pair, and cuMemcpyPeerAsync.

The first copy between two GPUs asks cuDeviceCanAccessPeer both ways and, where it may, enables each context's access
to the other's memory (cuCtxEnablePeerAccess; "already enabled" by torch or cupy in the same primary context counts
as enabled). A copy is then ordered against both devices' queued work without the host waiting: an event recorded on
the source's stream, which the destination's stream waits for, the copy on the destination's stream, and an event
after it that the source's stream waits for (so a later kernel on the source cannot overwrite what is being read).

Where peer access is impossible (no NVLink and no PCIe peer support between them, or too many peers), the same call
still works: the driver stages the copy through host memory. `PeerLink.path` says which, Allocator.peer_path returns
it, and the core warns once per pair (StagedCopyWarning) when it is staged.
"""
from __future__ import annotations

import ctypes
import threading
from typing import Any

from plugrt_cuda import driver as D

CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, CUDA_ERROR_TOO_MANY_PEERS = 704, 711
CU_EVENT_DISABLE_TIMING = 2
PEER = "peer"

_lock = threading.Lock()
_links: dict[tuple[int, int], PeerLink] = {}  # (source ctx, destination ctx) -> its link, made on first use


class PeerLink:
  """Copies from `src` to `dest` (two CUDAStates): the path they take, and the two events that order them."""

  def __init__(self, src: Any, dest: Any, path: str):
    self.src, self.dest, self.path, self.lib = src, dest, path, src.lib
    self.after_src, self.after_copy = ctypes.c_void_p(), ctypes.c_void_p()
    src.make_current()  # an event is recorded on a stream of its own context
    D.call("cuEventCreate", ctypes.byref(self.after_src), CU_EVENT_DISABLE_TIMING)
    dest.make_current()
    D.call("cuEventCreate", ctypes.byref(self.after_copy), CU_EVENT_DISABLE_TIMING)

  def copy(self, dest: int, src: int, nbytes: int) -> None:
    """Queue `nbytes` from `src` (on self.src) into `dest` (on self.dest): after the work queued on both, before what is
    queued on either later. The host does not wait."""
    lib, s, d = self.lib, self.src, self.dest
    s.make_current()
    D.check(lib.cuEventRecord(self.after_src, s.stream), "cuEventRecord (source)")
    d.make_current()
    D.check(lib.cuStreamWaitEvent(d.stream, self.after_src, 0), "cuStreamWaitEvent (destination waits for the source)")
    D.check(lib.cuMemcpyPeerAsync(ctypes.c_uint64(dest), d.ctx, ctypes.c_uint64(src), s.ctx, ctypes.c_size_t(nbytes), d.stream),
            f"cuMemcpyPeerAsync CUDA:{s.index} -> CUDA:{d.index}")
    D.check(lib.cuEventRecord(self.after_copy, d.stream), "cuEventRecord (copy)")
    s.make_current()
    D.check(lib.cuStreamWaitEvent(s.stream, self.after_copy, 0), "cuStreamWaitEvent (the source waits for the copy)")


def link(src: Any, dest: Any) -> PeerLink:
  """The link from `src` to `dest` (two CUDAStates of different GPUs), peer access enabled the first time."""
  key = (src.ctx.value, dest.ctx.value)
  if (ln := _links.get(key)) is not None: return ln
  with _lock:
    if (ln := _links.get(key)) is None:
      ln = _links[key] = PeerLink(src, dest, _enable(src, dest))
  return ln


def _enable(a: Any, b: Any) -> str:
  """Enable peer access between a and b both ways where the driver allows it (a pair is enabled once: the first link of
  either direction does it); PEER, or a sentence saying how the driver stages copies instead and why."""
  for other in _links.values():
    if {other.src.ctx.value, other.dest.ctx.value} == {a.ctx.value, b.ctx.value}: return other.path
  can = ctypes.c_int()
  why = []
  for x, y in ((a, b), (b, a)):
    D.call("cuDeviceCanAccessPeer", ctypes.byref(can), x.dev, y.dev)
    if not can.value:
      why.append(f"cuDeviceCanAccessPeer says CUDA:{x.index} cannot reach CUDA:{y.index}'s memory")
      continue
    x.make_current()  # enables the current context's access to y's memory
    r = a.lib.cuCtxEnablePeerAccess(y.ctx, 0)
    if r == CUDA_ERROR_TOO_MANY_PEERS: why.append(f"CUDA:{x.index} has too many peers enabled already")
    elif r not in (D.CUDA_SUCCESS, CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED): D.check(r, f"cuCtxEnablePeerAccess CUDA:{x.index} -> CUDA:{y.index}")
  if not why: return PEER
  return "staged through host memory by the CUDA driver (" + "; ".join(why) + ")"
