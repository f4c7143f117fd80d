"""Copies between two NV GPUs: through a peer mapping where the driver allows it, staged through host memory where not.

A link from GPU S to GPU D is set up the first time a copy between them is asked about (Allocator.peer_path, which
the core calls before the first copy): the interface enables peer access for the pair (NVK: RM's P2P caps, then
UVM_ENABLE_PEER_ACCESS), and each GPU's timeline page is mapped into the other's VA space, so each queue can wait
on the other's timeline. If anything refuses, the link keeps the reason and copies are staged (`path` says so).

A peer copy runs on D: S's buffer is mapped into D's VA space at its own address (once per buffer, kept until the
buffer is freed: the process-wide GPU address range keeps the two GPUs' addresses apart), and one copy-engine command
moves the bytes, or from 1 MiB D's copy kernel (the SMs reach NVLink's rate; one copy engine does not).
It is ordered on the GPUs, without the host waiting:
- D's submission first waits until S's timeline reaches S's last submitted value (the copy sees S's queued kernels);
- S's next submission, on either channel, first waits until D's timeline reaches the copy's value (a later kernel
  or copy on S cannot overwrite what the copy still reads): NVState.wait_for;
- freeing the buffer on S waits for every copy on another GPU that read it (NVState.lent).
Locks: both GPUs' locks, taken in index order, so copies both ways at once cannot deadlock.
"""
from __future__ import annotations

import warnings
from contextlib import ExitStack
from typing import Any

from plugrt_nv import cmd
from plugrt_nv.iface import Mem, NVError

STAGED = "staged through host memory, device to host on one GPU then host to device on the other"


def locked(*states: Any) -> ExitStack:
  """The states' locks, taken in index order (the same order for every pair, so two threads cannot deadlock)."""
  stack = ExitStack()
  for st in sorted(set(states), key=lambda s: s.index): stack.enter_context(st.lock)
  return stack


class PeerLink:
  """Copies from `src` to `dst`, two NVStates of different GPUs. `why` is "" when they go through a peer mapping, else
  why not; `mapped` holds the addresses of src's allocations already mapped into dst's VA space."""

  def __init__(self, src: Any, dst: Any):
    self.src, self.dst = src, dst
    self.mapped: set[int] = set()
    self.why = self._setup()

  @property
  def path(self) -> str: return "peer" if not self.why else f"{STAGED} ({self.why})"

  def _setup(self) -> str:
    s, d = self.src, self.dst
    try:
      why = s.iface.peer_access(d.iface)
      if why: return why
      s.iface.map_peer(s.signals, d.iface)  # D's copy waits on S's timeline
      d.iface.map_peer(d.signals, s.iface)  # S's later work waits on D's
    except NVError as e: return e.message
    return ""

  def copy(self, dest: int, src: int, nbytes: int, mem: Mem, kernel: Any = None) -> bool:
    """Copy `nbytes` from `src` (inside `mem`, an allocation of the source GPU) to `dest` on the destination GPU;
    False (nothing done) when this buffer cannot be mapped: the caller stages it, and `path` says why from then on.
    `kernel(dest, src, nbytes)`, when given, queues the copy as a kernel on the destination's compute channel instead
    of one copy-engine command (either way on the destination's timeline, so the ordering below holds for both)."""
    s, d = self.src, self.dst
    with locked(s, d):
      for st in (s, d):
        if st.broken: raise NVError(f"NV:{st.index} cannot run more work: {st.broken}", "restart the process")
      if mem.va not in self.mapped:
        try: s.iface.map_peer(mem, d.iface)
        except NVError as e:
          self.why = f"mapping a buffer of NV:{s.index} into NV:{d.index} failed: {e.message}"
          warnings.warn(f"plugrt: copies from NV:{s.index} to NV:{d.index} are {self.path}", _staged_warning(), stacklevel=5)
          return False
        self.mapped.add(mem.va)
      if s.completed() < s.value: d.wait_for(s.sem, s.value)  # the copy sees what S's queued work writes
      if kernel is not None:
        kernel(dest, src, nbytes)
        value = d.value
      else: value = d.submit(d.copy, cmd.copy(dest, src, nbytes))
      s.wait_for(d.sem, value)                                 # S's next work may overwrite what the copy reads
      readers = s.lent.setdefault(mem.va, {})
      readers[d] = max(readers.get(d, 0), value)
    return True


def _staged_warning() -> type[Warning]:
  from plugrt.errors import StagedCopyWarning
  return StagedCopyWarning


def link(src: Any, dst: Any) -> PeerLink:
  """The link from `src` to `dst` (made, and peer access asked for, the first time)."""
  with locked(src, dst):
    if (ln := src.links.get(dst)) is None:
      ln = src.links[dst] = PeerLink(src, dst)
      src.partners.add(dst)
      dst.partners.add(src)
    return ln


def forget(st: Any) -> None:
  """`st` is closing: every GPU linked with it finishes what may still read its memory or wait on its timeline, and
  drops its links, waits and records that name it (its memory and timeline page are about to be unmapped)."""
  for o in list(st.partners):
    with locked(st, o):
      try:
        if not o.broken: o.synchronize()
      except NVError: pass  # that GPU failed (and says so on its next use); this one still closes
      o.links.pop(st, None)
      o.partners.discard(st)
      o.after.pop(st.sem, None)
      for readers in o.lent.values(): readers.pop(st, None)
  st.partners.clear()
  st.links.clear()
