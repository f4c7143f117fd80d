"""Hand a few bytes (NCCL's unique id) from rank 0 to every rank, at MASTER_ADDR:MASTER_PORT, within a timeout.

Two ways, picked by PLUGRT_DIST_RENDEZVOUS (default `auto`):
  torch  torch.distributed's TCPStore: under torchrun the launcher's own store (TORCHELASTIC_USE_AGENT_STORE) is
         joined as a client, and a store torch.distributed already serves at that port is shared, so plugrt and
         torch.distributed live in one job without fighting over the port.
  tcp    the standard library: rank 0 listens at MASTER_PORT (MASTER_ADDR is where the others connect), answers each
         rank once, and closes. For jobs without torch.
`auto` is torch where torch is importable, else tcp. Only the bytes travel here; the collectives run on the engine.
"""
from __future__ import annotations

import itertools
import socket
import struct
import time
from collections.abc import Callable, Mapping
from typing import Any

from plugrt.errors import CollectiveTimeout, EnvError

_MAGIC = b"PLUGRTRV"
_rounds = itertools.count()  # one per communicator made in this process: every rank makes them in the same order
_stores: dict[tuple[str, int], Any] = {}  # torch TCPStores by (addr, port), kept for the process's life


def share_from_env(make: Callable[[], bytes], rank: int, size: int, env: Mapping[str, str], timeout: float) -> bytes:
  """Rank 0's make() on every rank, through MASTER_ADDR:MASTER_PORT."""
  addr, port = env.get("MASTER_ADDR", ""), env.get("MASTER_PORT", "")
  if not addr or not port.isdigit() or not 0 < int(port) < 65536:
    raise EnvError(f"MASTER_ADDR={addr!r} and MASTER_PORT={port!r} must name rank 0's host and a free port",
                   "torchrun sets both; elsewhere set them (e.g. MASTER_ADDR=127.0.0.1 MASTER_PORT=29500), or use from_mpi(comm)")
  how = env.get("PLUGRT_DIST_RENDEZVOUS", "auto")
  if how not in ("auto", "torch", "tcp"): raise EnvError(f"PLUGRT_DIST_RENDEZVOUS={how!r} must be auto, torch or tcp")
  key = f"plugrt/{next(_rounds)}"
  if how == "auto":
    import importlib.util
    how = "torch" if importlib.util.find_spec("torch") is not None else "tcp"
  if size == 1: return make()
  if how == "torch": return _torch_store(make, rank, size, addr, int(port), key, timeout, env.get("TORCHELASTIC_USE_AGENT_STORE") == "True")
  return tcp_share(make if rank == 0 else None, rank, size, addr, int(port), key, timeout)


def _torch_store(make: Callable[[], bytes], rank: int, size: int, addr: str, port: int, key: str, timeout: float, agent: bool) -> bytes:
  import datetime

  from torch.distributed import TCPStore
  wait = datetime.timedelta(seconds=timeout)
  # one store per address for the process's life: rank 0's holds the server, which must outlive every other rank's get
  if (store := _stores.get((addr, port))) is None:
    try: store = TCPStore(addr, port, size, rank == 0 and not agent, timeout=wait)
    except RuntimeError:  # rank 0: torch.distributed already serves a store at this port: share it as a client
      store = TCPStore(addr, port, size, False, timeout=wait)
    _stores[addr, port] = store
  if rank == 0: store.set(key, make())
  try: return bytes(store.get(key))
  except RuntimeError as e:
    raise CollectiveTimeout(f"rank 0's id did not arrive through torch's TCPStore at {addr}:{port} within {timeout:g} s ({e})",
                            "start every rank; check MASTER_ADDR/MASTER_PORT", rank=rank) from None


def _recv_exact(s: socket.socket, n: int) -> bytes:
  out = b""
  while len(out) < n:
    if not (part := s.recv(n - len(out))): raise ConnectionError("closed early")
    out += part
  return out


def tcp_share(data: Callable[[], bytes] | None, rank: int, size: int, addr: str, port: int, key: str, timeout: float) -> bytes:
  """Rank 0 (data given) serves data() to size-1 ranks; the others connect (retrying until rank 0 listens)."""
  deadline = time.monotonic() + timeout
  k = key.encode()
  if rank == 0:
    assert data is not None
    blob = data()
    with socket.create_server(("", port), reuse_port=False) as srv:  # SO_REUSEADDR (set by create_server): quick rebinds
      served: set[int] = set()
      while len(served) < size - 1:
        srv.settimeout(max(deadline - time.monotonic(), 0.001))
        try: conn, _ = srv.accept()
        except TimeoutError:
          missing = sorted(set(range(1, size)) - served)
          raise CollectiveTimeout(f"ranks {missing} did not reach the rendezvous at port {port} within {timeout:g} s",
                                  "start every rank, with the same MASTER_ADDR/MASTER_PORT", rank=0) from None
        with conn:
          conn.settimeout(5)
          try:
            magic, their_rank, klen = struct.unpack("<8sII", _recv_exact(conn, 16))
            their_key = _recv_exact(conn, klen)
            if magic != _MAGIC or their_key != k:  # another job, or a rank a round ahead: it retries
              conn.sendall(struct.pack("<q", -1))
              continue
            conn.sendall(struct.pack("<q", len(blob)) + blob)
            served.add(their_rank)
          except (OSError, struct.error): continue
    return blob
  while True:
    try:
      with socket.create_connection((addr, port), timeout=max(min(deadline - time.monotonic(), 5), 0.001)) as s:
        s.sendall(struct.pack("<8sII", _MAGIC, rank, len(k)) + k)
        (n,) = struct.unpack("<q", _recv_exact(s, 8))
        if n >= 0: return _recv_exact(s, n)
    except (OSError, ConnectionError, struct.error): pass
    if time.monotonic() > deadline:
      raise CollectiveTimeout(f"rank 0's rendezvous at {addr}:{port} did not answer within {timeout:g} s",
                              "start rank 0; check MASTER_ADDR/MASTER_PORT (rank 0 listens on MASTER_PORT)", rank=rank)
    time.sleep(0.05)
