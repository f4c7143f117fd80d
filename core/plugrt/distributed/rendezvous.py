"""Hand a few bytes (NCCL's unique id) from rank 0 to every rank, at MASTER_ADDR:MASTER_PORT, within a timeout.

Two ways, picked by PLUGRT_DIST_RENDEZVOUS (default `auto`):
  torch  torch.distributed's TCPStore: under torchrun the launcher's own store (TORCHELASTIC_USE_AGENT_STORE) is
         joined as a client, and a store torch.distributed already serves at that port is shared, so plugrt and
         torch.distributed live in one job without fighting over the port.
  tcp    the standard library: rank 0 listens at MASTER_PORT (MASTER_ADDR is where the others connect), answers each
         rank once, and closes. For jobs without torch.
`auto` is torch where torch is importable, else tcp. Only the bytes travel here; the collectives run on the engine.

`before_mpi_init` is a roll call of another kind: MPI_Init waits for every rank of the job with no limit (and holds the
GIL while it does), so the MPI engine first meets every rank here, within the communicator's timeout, and a rank that
never comes is a CollectiveTimeout naming it instead of a hang.
"""
from __future__ import annotations

import itertools
import os
import socket
import struct
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

from plugrt.errors import CollectiveTimeout, CollectiveUnavailable, EnvError, Reason

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


# ---------------------------------------------------------------- the roll call before MPI_Init

_ROLL = b"PLUGRTMI"


def _job(env: Mapping[str, str]) -> str | None:
  """What names this MPI job on this host, the same in each of its ranks and in no other job's: PMIx's namespace (Open
  MPI, Slurm with PMIx), or the process at the other end of PMI_FD (MPICH's hydra_pmi_proxy, Slurm's slurmstepd: one per
  job and host). None where neither is known."""
  if (ns := env.get("PMIX_NAMESPACE")): return f"pmix-{ns}"
  fd = env.get("PMI_FD", "")
  if not fd.isdigit() or not hasattr(socket, "SO_PEERCRED"): return None
  try:
    with socket.socket(fileno=os.dup(int(fd))) as s:  # a duplicate: the PMI stream itself is neither read nor closed
      pid = struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[0]
  except (OSError, struct.error): return None
  return f"pmi-{pid}" if pid > 0 else None


def mpi_meeting_point(env: Mapping[str, str], size: int) -> tuple[socket.AddressFamily, Any, bytes] | None:
  """Where the ranks of an MPI job meet before MPI_Init: (family, address, key). On one Linux host, a private abstract
  socket named after the job; across hosts, MASTER_ADDR:MASTER_PORT when the job sets them; else None (no roll call).
  Only for ranks an MPI launcher started (PMI_RANK or OMPI_COMM_WORLD_RANK set)."""
  if "PMI_RANK" not in env and "OMPI_COMM_WORLD_RANK" not in env: return None
  local = any(env.get(n) == str(size) for n in ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE"))
  if local and sys.platform.startswith("linux") and (job := _job(env)) is not None:
    name = f"plugrt-mpi-{os.getuid()}-{job}-{size}"
    return socket.AF_UNIX, "\0" + name, name.encode()
  addr, port = env.get("MASTER_ADDR", ""), env.get("MASTER_PORT", "")
  if addr and port.isdigit() and 0 < int(port) < 65536: return socket.AF_INET, (addr, int(port)), f"plugrt-mpi-{size}".encode()
  return None


def before_mpi_init(rank: int, size: int, env: Mapping[str, str], timeout: float) -> None:
  """Return once every rank of the job has reached this call, within `timeout` seconds; else CollectiveTimeout naming
  the ranks that did not. Rank 0 waits for the others at the meeting point (mpi_meeting_point) and tells each, at
  once or at its deadline, who is missing; the others look for rank 0 until theirs. Nothing happens where there is no
  meeting point (MPI_Init then waits as MPI does)."""
  if size < 2 or (where := mpi_meeting_point(env, size)) is None: return
  family, address, key = where
  shown = f"{address[0]}:{address[1]}" if family == socket.AF_INET else "a socket of this host"
  fix = ("start every rank; a rank that hangs or waits on something else before from_env keeps the others out of MPI_Init. "
         "Raise timeout= (PLUGRT_DIST_TIMEOUT) if ranks only start slowly")
  missing = _roll_serve(family, address, key, size, timeout, shown) if rank == 0 else _roll_answer(family, address, key, rank, timeout)
  if missing is None:
    raise CollectiveTimeout(f"rank 0 did not meet this rank before MPI_Init within {timeout:g} s at {shown}: it did not start, hangs "
                            "before from_env, or gave up waiting for another rank", fix, rank=rank)
  if missing:
    which = f"rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} of {size}"
    raise CollectiveTimeout(f"{which} did not reach MPI_Init within {timeout:g} s (plugrt meets every rank first: MPI_Init would wait "
                            "for them forever)", fix, rank=rank)


def _roll_serve(family: socket.AddressFamily, address: Any, key: bytes, size: int, timeout: float, shown: str) -> list[int]:
  """Rank 0: the ranks (1..size-1) that did not arrive within `timeout`; each one that did is told who did not."""
  deadline = time.monotonic() + timeout
  try:
    if family == socket.AF_INET: srv = socket.create_server(("", address[1]))
    else:
      srv = socket.socket(family, socket.SOCK_STREAM)
      srv.bind(address)
      srv.listen(size)
  except OSError as e:
    raise CollectiveUnavailable(f"rank 0 cannot wait for the other ranks before MPI_Init at {shown}: {e}", Reason.OPEN_FAILED,
                                "another job holds it: free MASTER_PORT, or give this job another") from None
  came: dict[int, socket.socket] = {}
  with srv:
    try:
      while len(came) < size - 1 and (left := deadline - time.monotonic()) > 0:
        srv.settimeout(left)
        try: conn, _ = srv.accept()
        except TimeoutError: break
        try:
          conn.settimeout(5)
          magic, their, klen = struct.unpack("<8sII", _recv_exact(conn, 16))
          if magic != _ROLL or _recv_exact(conn, klen) != key or not 0 < their < size:
            conn.sendall(struct.pack("<i", -1))  # another job's or another round's: not ours to count
            conn.close()
            continue
          if their in came: came[their].close()  # it came again (its first connection broke): the latest counts
          came[their] = conn
        except (OSError, struct.error):
          conn.close()
      missing = sorted(set(range(1, size)) - came.keys())
      verdict = struct.pack(f"<i{len(missing)}i", len(missing), *missing)
      for conn in came.values():
        try: conn.sendall(verdict)
        except OSError: pass
    finally:
      for conn in came.values(): conn.close()
  return missing


def _roll_answer(family: socket.AddressFamily, address: Any, key: bytes, rank: int, timeout: float) -> list[int] | None:
  """Any rank but 0: the ranks rank 0 says are missing ([] when all came), or None when rank 0 was not there in time."""
  deadline = time.monotonic() + timeout
  while True:
    try:
      s = socket.socket(family, socket.SOCK_STREAM)
      with s:
        s.settimeout(max(min(deadline - time.monotonic(), 5), 0.001))
        s.connect(address)
        s.sendall(struct.pack("<8sII", _ROLL, rank, len(key)) + key)
        # rank 0 was listening before this connection, so it answers within `timeout` of now
        s.settimeout(timeout + 1)
        (n,) = struct.unpack("<i", _recv_exact(s, 4))
        if n >= 0: return list(struct.unpack(f"<{n}i", _recv_exact(s, 4 * n)))
    except (OSError, ConnectionError, struct.error): pass  # not listening yet, or it gave up: look again until the deadline
    if time.monotonic() > deadline: return None
    time.sleep(0.05)
