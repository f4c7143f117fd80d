"""Communicator: collectives over plugrt Buffers (and Tensors), checked before they reach an engine.

Every call is checked here (types, devices, sizes, ranks); then, unless the check is off, the ranks compare what
each asked for (the metadata check) so a mismatch is CollectiveMismatch on every rank instead of a hang or garbage;
then the engine runs it. A `group()` batches calls: they are issued together and waited for together.
"""
from __future__ import annotations

import struct
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from plugrt.distributed.engine import KINDS, OPS, Call, Engine
from plugrt.dtype import dtypes
from plugrt.errors import CollectiveError, CollectiveMismatch, RankError

#: one call's metadata: sequence number, kind, dtype, count, op, root/peer, the caller's rank, the group's length (8 int64)
_META = struct.Struct("<8q")
_DTYPE_CODES = {d.name: i for i, d in enumerate(dtypes.all())}


class _Clique:
  """What the communicators of one engine object share: the engine, whether it is broken, the group being built."""
  def __init__(self, engine: Engine, local: bool, check: bool):
    self.engine, self.local, self.check = engine, local, check
    self.broken: str | None = None
    self.seq = 0  # collectives run so far (the same on every rank while they agree)
    self.lock = threading.Lock()


_tls = threading.local()  # the group being collected on this thread: a list of (communicator, Call)


@contextmanager
def group() -> Iterator[None]:
  """Batch the calls made inside the block: nothing runs until it ends, then all are issued together and waited for
  together. Needed where calls would wait on each other (a ring of send/recv, or Communicator.local's communicators,
  which one thread drives: each needs one call per communicator in one group)."""
  outer = getattr(_tls, "calls", None)
  if outer is not None:  # nested: the outermost group runs everything
    yield
    return
  _tls.calls = calls = []
  try: yield
  except BaseException:
    _tls.calls = None
    raise
  _tls.calls = None
  if calls: _run_group(calls)


def _run_group(calls: list[tuple[Communicator, Call]]) -> None:
  clique = calls[0][0]._clique
  if any(c._clique is not clique for c, _ in calls):
    raise TypeError("a group's calls must all be on communicators made together (one Communicator.local, or one rank's communicator)")
  with clique.lock:
    try:
      if clique.check: _check(clique, calls)
      clique.engine.run([c for _, c in calls])
    except CollectiveMismatch: raise  # the check found it before anything ran: the communicator is fine
    except CollectiveError as e:
      clique.broken = f"{type(e).__name__}: {e.message}"
      raise


def _describe(meta: tuple[int, ...]) -> str:
  _, kind, dt, count, op, peer = meta[:6]
  what = KINDS[kind]
  if what == "barrier": return "barrier"
  s = f"{what} of {count} {dtypes.all()[dt].name}"
  if what in ("all_reduce", "reduce_scatter"): s += f" ({OPS[op]})"
  if what == "broadcast": s += f" from root {peer}"
  if what in ("send", "recv"): s += f" {'to' if what == 'send' else 'from'} rank {peer}"
  return s


def _meta(seq: int, c: Call) -> tuple[int, ...]:
  return (seq, KINDS.index(c.kind), _DTYPE_CODES[c.dtype.name], c.count, OPS.index(c.op) if c.op else -1, c.peer, c.rank)


def _check(clique: _Clique, calls: list[tuple[Communicator, Call]]) -> None:
  """Compare what the ranks asked for; raise CollectiveMismatch (on every rank) where they differ."""
  colls = [c for _, c in calls if c.kind not in ("send", "recv")]
  p2p = [c for _, c in calls if c.kind in ("send", "recv")]
  seq0 = clique.seq
  if clique.local:  # every rank is in this process: the group itself holds every rank's calls
    by_rank: dict[int, list[tuple[int, ...]]] = {}
    for c in colls: by_rank.setdefault(c.rank, []).append(_meta(0, c)[1:6])
    size = calls[0][0].size
    if colls and (len(by_rank) != size or len({tuple(v) for v in by_rank.values()}) != 1):
      missing = sorted(set(range(size)) - set(by_rank))
      raise CollectiveMismatch("the local communicators' calls differ: " + "; ".join(
        f"rank {r}: {', '.join(_describe((0, *m, r)) for m in v)}" for r, v in sorted(by_rank.items())) +
        (f"; ranks {missing} made none" if missing else ""),
        "inside one group(), make the same collectives on every communicator of Communicator.local")
    pairs: dict[tuple[int, int], tuple[list[Call], list[Call]]] = {}  # (from, to) -> (its sends, its recvs), in call order
    for c in p2p:
      key = (c.rank, c.peer) if c.kind == "send" else (c.peer, c.rank)
      pairs.setdefault(key, ([], []))[c.kind == "recv"].append(c)
    for (src, dst), (ss, rs) in sorted(pairs.items()):
      if [(s.count, s.dtype) for s in ss] != [(r.count, r.dtype) for r in rs]:
        raise CollectiveMismatch(f"send/recv from rank {src} to rank {dst} do not match: "
                                 f"{', '.join(_describe(_meta(0, s)) for s in ss) or 'no send'}; "
                                 f"{', '.join(_describe(_meta(0, r)) for r in rs) or 'no recv'}",
                                 "each send needs a recv of the same size and dtype on its peer, in the same group()")
    clique.seq += bool(colls)
    return
  engine = clique.engine
  if colls:
    metas = [_meta(seq0 + i, c) for i, c in enumerate(colls)]
    # one round for a group of one collective (the common case): the first call's metadata and the group's length;
    # a second round only for the rest of a longer group, once every rank is known to hold as many calls
    every = [_META.unpack(b) for b in engine.allgather_meta(_META.pack(*metas[0], len(colls)))]
    if len({t[7] for t in every}) > 1:
      raise CollectiveMismatch(f"the ranks' groups hold different numbers of collectives: {({t[6]: t[7] for t in every})} (rank: count)",
                               "make the same collectives, in the same order, on every rank", rank=colls[0].rank)
    rows = [[t[:7]] for t in every]
    if len(colls) > 1:
      rest = engine.allgather_meta(b"".join(_META.pack(*m, 0) for m in metas[1:]))
      for row, blob in zip(rows, rest): row += [_META.unpack_from(blob, k * _META.size)[:7] for k in range(len(colls) - 1)]
    clique.seq += len(colls)
    want = [m[1:6] for m in metas]
    bad = [row for row in rows if [t[1:6] for t in row] != want]
    if bad:
      others = "; ".join(f"rank {row[0][6]}: {', '.join(_describe(t) for t in row)}" +
                         (f" (its collective #{row[0][0]}, this rank's #{seq0})" if row[0][0] != seq0 else "") for row in bad)
      raise CollectiveMismatch(f"the ranks asked for different collectives: this rank {', '.join(_describe(m) for m in metas)}; {others}",
                               "make the same collective with the same size, dtype, op and root on every rank (or "
                               "check=False to skip this check: a mismatch may then hang until the timeout)",
                               rank=colls[0].rank)
  if p2p: _check_p2p(engine, p2p)


def _check_p2p(engine: Engine, p2p: list[Call]) -> None:
  """Each pair of ranks swaps the metadata of its calls with the other (every pair at once: a ring must not wait on
  itself). Both ends then compare this rank's sends with the peer's recvs, and the reverse, in call order: both raise."""
  peers: dict[int, list[tuple[int, ...]]] = {}
  for c in p2p: peers.setdefault(c.peer, []).append(_meta(0, c))
  order = sorted(peers)
  first = engine.swap_meta([(p, _META.pack(*peers[p][0], len(peers[p]))) for p in order])
  theirs = {p: [_META.unpack(b)] for p, b in zip(order, first)}
  longer = [p for p in order if max(len(peers[p]), theirs[p][0][7]) > 1]
  if longer:  # a second round where either end holds more than one call: lengths are known now, the bytes may differ
    rest = engine.swap_meta([(p, b"".join(_META.pack(*m, 0) for m in peers[p][1:]), (theirs[p][0][7] - 1) * _META.size) for p in longer])
    for p, blob in zip(longer, rest): theirs[p] += [_META.unpack_from(blob, k * _META.size) for k in range(len(blob) // _META.size)]
  send, recv = KINDS.index("send"), KINDS.index("recv")
  for p in order:
    for mine_kind, their_kind in ((send, recv), (recv, send)):
      a = [m for m in peers[p] if m[1] == mine_kind]
      b = [t for t in theirs[p] if t[1] == their_kind]
      if [m[2:4] for m in a] != [t[2:4] for t in b]:
        rank = p2p[0].rank
        raise CollectiveMismatch(f"this rank's {', '.join(map(_describe, a)) or 'nothing'} met rank {p}'s "
                                 f"{', '.join(map(_describe, b)) or 'nothing'}",
                                 "each send needs a recv of the same size and dtype on its peer, in the same order", rank=rank)


def _as_buffer(x: Any, what: str, write: bool) -> Any:
  """`x` as a plugrt Buffer: a Buffer as is, a Tensor's contiguous memory (a Tensor written into must be contiguous)."""
  from plugrt.device import Buffer
  if isinstance(x, Buffer): return x
  from plugrt.frontend.tensor import Tensor
  if isinstance(x, Tensor):
    if not write: return x.contiguous_buffer()
    n = x.realize().node
    if n.op != "buf" or not n.view.is_contiguous:
      raise TypeError(f"{what}: the tensor is a strided view; pass t.contiguous() (and read the result from that tensor)")
    b = n.buffer
    off = n.view.offset * b.dtype.itemsize
    return b if off == 0 and b.size == x.numel() else b.view(x.numel(), offset=off)
  raise TypeError(f"{what} must be a plugrt Buffer or Tensor, not {type(x).__name__}")


class Communicator:
  """One rank of a group of devices that run collectives together. Made by Communicator.local (one process, several
  devices), from_env (torchrun's or mpiexec's variables) or from_mpi (an mpi4py communicator); see docs/distributed.md.

  Every method takes plugrt Buffers or Tensors on this communicator's device and returns when the operation is done.
  A call that does not finish within `timeout` seconds raises CollectiveTimeout and leaves the communicator unusable.
  """

  def __init__(self, clique: _Clique, device: Any, rank: int, size: int):
    self._clique, self.device, self.rank, self.size = clique, device, rank, size

  def __repr__(self) -> str:
    return f"<Communicator rank {self.rank}/{self.size} on {self.device.canonical} ({self.engine.name})>"

  @property
  def engine(self) -> Engine: return self._clique.engine

  local: Any  # Communicator.local(devices): set by plugrt.distributed (its __init__)

  # ---- the collectives
  def all_reduce(self, buf: Any, op: str = "sum", out: Any = None) -> Any:
    """Reduce `buf` over the ranks with `op` (sum, prod, min, max) into `out` (default: in place); returns it."""
    src = _as_buffer(buf, "all_reduce's buffer", out is None)
    dst = src if out is None else _as_buffer(out, "all_reduce's out", True)
    self._same(src, dst, "all_reduce")
    return self._submit(self._reduction("all_reduce", src, dst, src.size, op), out if out is not None else buf)

  def all_gather(self, send: Any, recv: Any) -> Any:
    """Every rank's `send` (n elements) into `recv` (size * n elements), rank r's at [r*n, (r+1)*n); returns recv."""
    s, r = _as_buffer(send, "all_gather's send", False), _as_buffer(recv, "all_gather's recv", True)
    self._on_device(s, r)
    if r.dtype is not s.dtype or r.size != s.size * self.size:
      raise ValueError(f"all_gather: recv must hold {self.size} x {s.size} {s.dtype.name} (the world size times send), "
                       f"got {r.size} {r.dtype.name}")
    return self._submit(Call("all_gather", self.rank, s, r, s.size, s.dtype), recv)

  def reduce_scatter(self, send: Any, recv: Any, op: str = "sum") -> Any:
    """Reduce `send` (size * n elements) over the ranks; rank r gets elements [r*n, (r+1)*n) in `recv` (n); returns recv."""
    s, r = _as_buffer(send, "reduce_scatter's send", False), _as_buffer(recv, "reduce_scatter's recv", True)
    self._on_device(s, r)
    if r.dtype is not s.dtype or s.size != r.size * self.size:
      raise ValueError(f"reduce_scatter: send must hold {self.size} x recv's elements of one dtype; got send {s.size} {s.dtype.name}, "
                       f"recv {r.size} {r.dtype.name}")
    return self._submit(self._reduction("reduce_scatter", s, r, s.size, op), recv)

  def broadcast(self, buf: Any, root: int = 0) -> Any:
    """Rank `root`'s `buf` into every rank's `buf` (in place); returns it."""
    b = _as_buffer(buf, "broadcast's buffer", True)
    self._on_device(b)
    return self._submit(Call("broadcast", self.rank, b, b, b.size, b.dtype, "", self._rank(root, "root")), buf)

  def send(self, buf: Any, peer: int) -> None:
    """Send `buf` to rank `peer` (which calls recv with a buffer of the same size and dtype)."""
    b = _as_buffer(buf, "send's buffer", False)
    self._on_device(b)
    self._submit(Call("send", self.rank, b, None, b.size, b.dtype, "", self._rank(peer, "peer", p2p=True)), None)

  def recv(self, buf: Any, peer: int) -> Any:
    """Receive into `buf` what rank `peer` sends; returns buf."""
    b = _as_buffer(buf, "recv's buffer", True)
    self._on_device(b)
    return self._submit(Call("recv", self.rank, None, b, b.size, b.dtype, "", self._rank(peer, "peer", p2p=True)), buf)

  def barrier(self) -> None:
    """Return once every rank has called barrier."""
    self._submit(Call("barrier", self.rank, None, None, 0, dtypes.uint8), None)

  def close(self) -> None:
    """Free the engine's resources (every rank closes; the communicator refuses work afterwards)."""
    clique = self._clique
    if clique.broken is None or not clique.broken.startswith("closed"):
      clique.broken = "closed"
      try: clique.engine.close()
      except Exception: clique.engine.abort()

  def abort(self) -> None:
    """Tear the communicator down now, without waiting for the other ranks."""
    self._clique.broken = "aborted"
    self._clique.engine.abort()

  def __enter__(self) -> Communicator: return self
  def __exit__(self, *exc: Any) -> None: self.close() if exc[0] is None else self.abort()

  # ---- checks
  def _rank(self, r: Any, what: str, p2p: bool = False) -> int:
    if not isinstance(r, int) or isinstance(r, bool): raise TypeError(f"{what} must be an int rank, not {type(r).__name__}")
    if not 0 <= r < self.size: raise RankError(f"{what} {r} is not a rank of this communicator (0 to {self.size - 1})")
    if p2p and r == self.rank: raise RankError(f"{what} {r} is this rank itself", "send to and receive from another rank")
    return r

  def _on_device(self, *bufs: Any) -> None:
    for b in bufs:
      if b.device is not self.device:
        raise TypeError(f"rank {self.rank} works on {self.device.canonical}: a buffer on {b.device.canonical} cannot take part; "
                        f"copy it with buf.to({self.device.canonical!r})")
      if b.dtype.name.startswith("image"): raise TypeError(f"image buffers ({b.dtype!r}) cannot take part in collectives")

  def _same(self, src: Any, dst: Any, what: str) -> None:
    self._on_device(src, dst)
    if dst.dtype is not src.dtype or dst.size != src.size:
      raise ValueError(f"{what}: out must match the buffer ({src.size} {src.dtype.name}), got {dst.size} {dst.dtype.name}")

  def _reduction(self, kind: str, s: Any, r: Any, count: int, op: Any) -> Call:
    op = str(getattr(op, "value", op)).lower()
    if op not in OPS: raise ValueError(f"{kind}: op must be one of {', '.join(OPS)}, not {op!r}")
    if s.dtype is dtypes.bool:  # numpy's bool sum is or, prod is and: max and min of the 0/1 bytes
      op, s, r = ("max" if op == "sum" else "min" if op == "prod" else op), s.view(dtype=dtypes.uint8), r.view(dtype=dtypes.uint8)
    return Call(kind, self.rank, s, r, count, s.dtype, op)

  def _submit(self, call: Call, result: Any) -> Any:
    if (why := self._clique.broken) is not None:
      raise CollectiveError(f"the communicator is unusable: {why}", "make a new communicator (every rank)", rank=self.rank)
    pending = getattr(_tls, "calls", None)
    if pending is not None:
      pending.append((self, call))
      return result
    if self._clique.local and self.size > 1:
      raise CollectiveError("the communicators of Communicator.local run together: make one call per communicator inside "
                            "`with plugrt.distributed.group():`", "wrap the calls in a group()", rank=self.rank)
    _run_group([(self, call)])
    return result


def make_communicators(engine: Engine, devices: Sequence[Any], ranks: Sequence[int], size: int, local: bool, check: bool) -> list[Communicator]:
  clique = _Clique(engine, local, check)
  return [Communicator(clique, d, r, size) for d, r in zip(devices, ranks)]
