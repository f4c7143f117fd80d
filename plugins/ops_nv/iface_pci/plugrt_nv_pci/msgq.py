"""The GSP-RM message queues: the CPU's command queue and the GSP's status queue in one block of host memory both sides
read and write (DMA), and RPC records carried in them. docs/research/nv-pci.md (section "Message queues") gives the
sources: open-gpu-kernel-modules 570.144's msgq_priv.h, msgq.c, message_queue_priv.h, message_queue_cpu.c,
g_rpc-message-header.h, rpc_headers.h and rpc_global_enums.h.

Layout of the shared block (message_queue_cpu.c): a page table (the bus address of each 4 KiB page of the whole block,
itself included), then the command queue (256 KiB), then the status queue (256 KiB). Each queue starts with its
writer's msgqTxHeader (version 0, size, msgSize 4096, msgCount, writePtr, flags SWAP_RX, rxHdrOff 32, entryOff 4096);
with SWAP_RX both sides set, the reader's read pointer (msgqRxHeader) of a queue lives in the *other* queue's block:
the CPU's read pointer of the status queue at the command queue's rxHdrOff, the GSP's read pointer of the command
queue at the status queue's rxHdrOff. A message is one or more 4 KiB elements: GSP_MSG_QUEUE_ELEMENT (16 bytes auth
tag, 16 bytes AAD, checkSum, seqNum, elemCount; the RPC header at 0x30), checksummed so that the XOR of its 64-bit words
over header + RPC length, folded to 32 bits, is zero. A message longer than 16 elements continues in
CONTINUATION_RECORD messages. The CPU tells the GSP about new commands by writing NV_PGSP_QUEUE_HEAD(0).
"""
from __future__ import annotations

import ctypes
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from plugrt_nv_nvk.rm import status_name
from plugrt_nv_pci.errors import GSPError, MalformedRPC, RPCError

PAGE = 0x1000
QUEUE_SIZE = 0x40000
MSG_SIZE = PAGE
MAX_ELEMENTS = 16                       # queueElementSizeMax = 16 pages
ELEMENT_HEADER = 0x30                   # offsetof(GSP_MSG_QUEUE_ELEMENT, rpc)
RPC_HEADER = 0x20                       # sizeof(rpc_message_header_v03_00)
MAX_PAYLOAD = MAX_ELEMENTS * MSG_SIZE - ELEMENT_HEADER - RPC_HEADER
TX_HEADER = struct.Struct("<8I")        # msgqTxHeader: version size msgSize msgCount writePtr flags rxHdrOff entryOff
RX_HDR_OFF, ENTRY_OFF = 0x20, 0x1000    # NV_ALIGN_UP(32, 1 << 4), NV_ALIGN_UP(36, 1 << 12)
FLAGS_SWAP_RX = 1
ELEMENT = struct.Struct("<16s16sIII")   # authTagBuffer aadBuffer checkSum seqNum elemCount
RPC = struct.Struct("<8I")              # header_version signature length function rpc_result rpc_result_private sequence spare
HEADER_VERSION = 3 << 24                # NV_VGPU_MSG_HEADER_VERSION_MAJOR_TOT 3, MINOR 0
SIGNATURE = 0x43505256                  # NV_VGPU_MSG_SIGNATURE_VALID ("VRPC")
RESULT_PENDING = 0xFFFFFFFF
PGSP_QUEUE_HEAD0 = 0x110C00             # NV_PGSP_QUEUE_HEAD(0) (dev_gsp.h): the command queue's doorbell


class Function:
  """RPC functions (rpc_global_enums.h, NV_VGPU_MSG_FUNCTION_*) and events (NV_VGPU_MSG_EVENT_*) plugrt uses."""
  FREE, ALLOC_MEMORY, UNLOADING_GUEST_DRIVER, SET_PAGE_DIRECTORY = 10, 4, 47, 54
  CONTINUATION_RECORD, GSP_SET_SYSTEM_INFO, SET_REGISTRY, GSP_RM_CONTROL, GSP_RM_ALLOC = 71, 72, 73, 76, 103
  GSP_INIT_DONE, GSP_RUN_CPU_SEQUENCER, POST_EVENT, RC_TRIGGERED, MMU_FAULT_QUEUED, OS_ERROR_LOG = 0x1001, 0x1002, 0x1003, 0x1004, 0x1005, 0x1006
  UCODE_LIBOS_PRINT, GSP_LOCKDOWN_NOTICE, GSP_POST_NOCAT_RECORD = 0x100C, 0x101C, 0x1020


NAMES = {v: k for k, v in vars(Function).items() if isinstance(v, int)}
#: RPC results outside NV_STATUS (rpc_headers.h, NV_VGPU_MSG_RESULT_RPC_*)
RPC_RESULTS = {0xFF100001: "the GSP does not know this RPC function", 0xFF100002: "the GSP found the message malformed",
               0xFF100003: "no object with that handle", 0xFF100004: "an object with that handle exists already",
               0xFF100005: "an unknown RM error", 0xFF100007: "the handle is reserved"}


def name_of(function: int) -> str: return NAMES.get(function, f"function {function:#x}")


def checksum(data: bytes) -> int:
  """_checkSum32: XOR of the 64-bit little-endian words (zero padded to 8 bytes), high half XOR low half."""
  data = data + bytes(-len(data) % 8)
  x = 0
  for (w,) in struct.iter_unpack("<Q", data): x ^= w
  return (x >> 32 ^ x) & 0xFFFFFFFF


def tx_header(size: int = QUEUE_SIZE) -> bytes:
  return TX_HEADER.pack(0, size, MSG_SIZE, (size - ENTRY_OFF) // MSG_SIZE, 0, FLAGS_SWAP_RX, RX_HDR_OFF, ENTRY_OFF)


@dataclass
class Message:
  function: int
  result: int
  payload: bytes
  sequence: int


def pack_message(function: int, payload: bytes, seq: int, result: int = RESULT_PENDING, rpc_sequence: int = 0) -> bytes:
  """One queue message (element header, RPC header, payload) padded to whole elements, with its checksum set."""
  rpc = RPC.pack(HEADER_VERSION, SIGNATURE, RPC_HEADER + len(payload), function, result, result, rpc_sequence, 0)
  n = -(-(ELEMENT_HEADER + len(rpc) + len(payload)) // MSG_SIZE)
  body = rpc + payload
  head = ELEMENT.pack(bytes(16), bytes(16), 0, seq, n) + bytes(ELEMENT_HEADER - ELEMENT.size)
  cs = checksum(head + body)
  head = ELEMENT.pack(bytes(16), bytes(16), cs, seq, n) + bytes(ELEMENT_HEADER - ELEMENT.size)
  msg = head + body
  return msg + bytes(n * MSG_SIZE - len(msg))


class Queue:
  """One side's view of a queue block at CPU address `base`: its tx header, entries, and the rx pointer stored there."""

  def __init__(self, base: int):
    self.base = base

  def header(self) -> tuple[int, ...]: return TX_HEADER.unpack(ctypes.string_at(self.base, TX_HEADER.size))
  def write_ptr(self) -> int: return ctypes.c_uint32.from_address(self.base + 16).value
  def set_write_ptr(self, v: int) -> None: ctypes.c_uint32.from_address(self.base + 16).value = v
  def rx_ptr(self) -> int: return ctypes.c_uint32.from_address(self.base + RX_HDR_OFF).value
  def set_rx_ptr(self, v: int) -> None: ctypes.c_uint32.from_address(self.base + RX_HDR_OFF).value = v
  def element(self, i: int) -> int: return self.base + ENTRY_OFF + i * MSG_SIZE


class GSPQueues:
  """The CPU's side: send RPCs on the command queue (whose header `tx_header()` the boot wrote before the GSP
  started), read the status queue, wait (bounded) for a function's reply.

  `doorbell(value)` writes NV_PGSP_QUEUE_HEAD(0); `on_event(message)` sees every event that is not the awaited reply
  (the GSP's CPU sequencer, its error log, faults) and may raise. `timeout` bounds each wait, in seconds."""

  def __init__(self, cmd_base: int, stat_base: int, doorbell: Callable[[int], None], timeout: float = 10.0,
               on_event: Callable[[Message], None] | None = None):
    self.cmd, self.stat = Queue(cmd_base), Queue(stat_base)
    self.doorbell, self.timeout = doorbell, timeout
    self.on_event = on_event or (lambda m: None)
    self.tx_seq = self.rx_seq = 0
    self.rpc_seq = 0
    self.count = (QUEUE_SIZE - ENTRY_OFF) // MSG_SIZE
    self.linked = False
    self.pending: list[Message] = []   # replies read while waiting for another one
    self.broken = ""                    # why the status queue cannot be read on (a malformed message stays where it is)

  # ------------------------------------------------------------ sending
  def send(self, function: int, payload: bytes, step: str = "") -> None:
    """Queue `function` with `payload` (split into continuation records past MAX_PAYLOAD) and ring the doorbell."""
    parts = [payload[:MAX_PAYLOAD]] + [payload[o:o + MAX_PAYLOAD] for o in range(MAX_PAYLOAD, len(payload), MAX_PAYLOAD)]
    for i, part in enumerate(parts):
      self._put(function if i == 0 else Function.CONTINUATION_RECORD, part, step)
    self.doorbell(0)

  def _put(self, function: int, payload: bytes, step: str) -> None:
    msg = pack_message(function, payload, self.tx_seq, rpc_sequence=self.rpc_seq)
    n = len(msg) // MSG_SIZE
    deadline = time.monotonic() + self.timeout
    while True:  # free elements: up to the GSP's read pointer (kept in the status queue's block), one always left empty
      wp = self.cmd.write_ptr()
      if (self.stat.rx_ptr() - wp - 1) % self.count >= n: break
      if time.monotonic() > deadline:
        raise GSPError(f"the GSP did not take commands off its queue within {self.timeout:g} s (need {n} free elements)",
                       "the GSP has stopped; reset the GPU (unbind and bind the driver back)", step=step or name_of(function), timed_out=True,
                       reason=f"command queue write pointer {wp}, GSP read pointer {self.stat.rx_ptr()}")
      time.sleep(0.0005)
    for i in range(n): ctypes.memmove(self.cmd.element((wp + i) % self.count), msg[i * MSG_SIZE:(i + 1) * MSG_SIZE], MSG_SIZE)
    self.cmd.set_write_ptr((wp + n) % self.count)
    self.tx_seq += 1
    self.rpc_seq += 1

  # ------------------------------------------------------------ receiving
  def link(self, step: str = "waiting for the GSP's status queue") -> None:
    """Wait until GSP-RM has written its status queue's header, and check it (msgqRxLink's checks)."""
    deadline = time.monotonic() + self.timeout
    while self.stat.header()[7] != ENTRY_OFF:
      if time.monotonic() > deadline:
        raise GSPError(f"the GSP did not set up its status queue within {self.timeout:g} s", "the GSP did not start; see the boot steps above",
                       step=step, timed_out=True, reason=f"status queue header {self.stat.header()}")
      time.sleep(0.0005)
    version, size, msg_size, count, _, _, rx_off, entry_off = self.stat.header()
    if (version, size, msg_size, rx_off) != (0, QUEUE_SIZE, MSG_SIZE, RX_HDR_OFF) or count != (size - entry_off) // msg_size:
      raise MalformedRPC(f"the GSP's status queue header is not one plugrt can read: {self.stat.header()}", step=step)
    self.linked = True

  def messages(self, step: str = "") -> Iterator[Message]:
    """Every complete message in the status queue now, checked and consumed, continuation records joined."""
    if self.broken: raise MalformedRPC(f"the GSP's status queue is unreadable since {self.broken}", "reset the GPU", step=step)
    if not self.linked: self.link()
    try: yield from self._read(step)
    except MalformedRPC as e:
      self.broken = e.message
      raise

  def _read(self, step: str) -> Iterator[Message]:
    while (rp := self.cmd.rx_ptr()) != self.stat.write_ptr():
      head = ctypes.string_at(self.stat.element(rp), ELEMENT_HEADER + RPC_HEADER)
      _, _, _, seq, n = ELEMENT.unpack_from(head)
      version, sig, length, function, result, _, rpc_seq, _ = RPC.unpack_from(head, ELEMENT_HEADER)
      where = f"status queue element {rp}"
      if not 1 <= n <= MAX_ELEMENTS or not RPC_HEADER <= length <= n * MSG_SIZE - ELEMENT_HEADER:
        raise MalformedRPC(f"{where}: {n} elements with an RPC of {length} bytes", step=step or name_of(function))
      data = b"".join(ctypes.string_at(self.stat.element((rp + i) % self.count), MSG_SIZE) for i in range(n))
      if checksum(data[:ELEMENT_HEADER + length]) != 0:
        raise MalformedRPC(f"{where}: the checksum of {name_of(function)} does not add up", step=step or name_of(function))
      if seq != self.rx_seq:
        raise MalformedRPC(f"{where}: sequence number {seq}, expected {self.rx_seq}", step=step or name_of(function))
      if sig != SIGNATURE or version >> 24 != 3:
        raise MalformedRPC(f"{where}: RPC header signature {sig:#x} version {version:#x}", step=step or name_of(function))
      self.cmd.set_rx_ptr((rp + n) % self.count)
      self.rx_seq += 1
      payload = data[ELEMENT_HEADER + RPC_HEADER:ELEMENT_HEADER + length]
      if function == Function.CONTINUATION_RECORD:
        if not self.pending: raise MalformedRPC(f"{where}: a continuation record follows no message", step=step)
        self.pending[-1].payload += payload
        continue
      self.pending.append(Message(function, result, payload, rpc_seq))
    # (a reply longer than one message arrives with its continuation records in one go: the GSP moves its write
    # pointer after the whole reply; the replies plugrt asks for fit one message)
    while self.pending: yield self.pending.pop(0)

  def wait(self, function: int, step: str = "", timeout: float | None = None) -> Message:
    """The GSP's reply to `function` (or event `function`); other events go to on_event. A reply with an error result
    raises RPCError; no reply within the bound, GSPError(timed_out=True)."""
    limit = self.timeout if timeout is None else timeout
    deadline = time.monotonic() + limit
    while True:
      for m in self.messages(step):
        if m.function == function:
          if m.result != 0:
            raise RPCError(f"{step + ': ' if step else ''}the GSP answered {name_of(function)} with {result_name(m.result)}", function=function,
                           status=m.result,
                           step=step or name_of(function))
          return m
        self.on_event(m)
      if time.monotonic() > deadline:
        raise GSPError(f"the GSP did not answer {name_of(function)} within {limit:g} s", "the GSP has stopped or is busy; reset the GPU",
                       step=step or name_of(function), timed_out=True,
                       reason=f"status queue write pointer {self.stat.write_ptr()}, read pointer {self.cmd.rx_ptr()}")
      time.sleep(0.0002)

  def call(self, function: int, payload: bytes, step: str = "") -> bytes:
    self.send(function, payload, step)
    return self.wait(function, step).payload


def result_name(code: int) -> str:
  """An RPC result: the RPC layer's own codes, else an NV_STATUS (the codes the kernel driver's ioctls return too)."""
  return f"{RPC_RESULTS[code]} ({code:#x})" if code in RPC_RESULTS else status_name(code)
