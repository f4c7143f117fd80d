"""NV's fast launch in machine code (plugrt_nv.fastlaunch) against plain host memory standing in for the command
slots, the GPFIFO, GP_PUT, the doorbell and the timeline counter: what it writes, and when it declines."""
from __future__ import annotations

import ctypes
import os
import re
import subprocess
import sys

import pytest

from plugrt_nv import fastlaunch

pytestmark = pytest.mark.skipif(fastlaunch.functions() is None, reason="the fast launch's machine code runs on x86-64 only")

SLOTS, SLOT, ENTRIES, PAYLOAD = 8, 256, 16, 36
u64, u32 = ctypes.c_uint64, ctypes.c_uint32


class Bench:
  """A State over host memory, one entry with recognisable words, and the Call prepared for it."""

  def __init__(self) -> None:
    self.slots = (ctypes.c_uint8 * (SLOT * SLOTS))()
    self.ring, self.counter, self.gp_put, self.doorbell = (u64 * ENTRIES)(), u32(), u32(), u32()
    self.last_use, self.holds = (u64 * SLOTS)(), (u64 * SLOTS)()
    self.gp_entries = (u64 * SLOTS)(*[0x1000 + i for i in range(SLOTS)])
    st = self.st = fastlaunch.State()
    st.fast, st.counter, st.ring, st.ring_mask, st.token = 1, ctypes.addressof(self.counter), ctypes.addressof(self.ring), ENTRIES - 1, 0x77
    st.put_register, st.doorbell = ctypes.addressof(self.gp_put), ctypes.addressof(self.doorbell)
    st.slots, st.slot_size = ctypes.addressof(self.slots), SLOT
    st.slot_mask, st.payload = SLOTS - 1, PAYLOAD
    st.last_use, st.holds, st.gp_entries = (ctypes.addressof(a) for a in (self.last_use, self.holds, self.gp_entries))
    self.entry = fastlaunch.Entry(generation=5)
    self.entry.words[:] = [0x1111_0000_0000_0000 + k for k in range(6)]
    self.call = fastlaunch.Call(ctypes.addressof(st), ctypes.addressof(self.entry), 5)
    self.submit, self.queue, self.unlocked = (lambda f=f: f(ctypes.addressof(self.call)) for f in fastlaunch.functions())

  def slot(self, i: int) -> bytes: return bytes(self.slots[i * SLOT:(i + 1) * SLOT])

  def counters(self) -> tuple:
    st = self.st
    return (st.value, st.put, st.next, list(self.last_use), list(self.holds), list(self.ring), self.gp_put.value, self.doorbell.value,
            bytes(self.slots))


def test_a_launch_writes_its_words_payload_ring_entry_and_rings_the_doorbell():
  b = Bench()
  assert b.submit() == 1
  words = b"".join(w.to_bytes(8, "little") for w in b.entry.words)
  want = bytearray(words)
  want[PAYLOAD:PAYLOAD + 4] = (1).to_bytes(4, "little")
  assert b.slot(0)[:48] == want and b.slot(0)[48:] == bytes(SLOT - 48)
  assert b.ring[0] == 0x1000 and b.st.put == 1 and b.gp_put.value == 1 and b.doorbell.value == 0x77
  assert (b.st.value, b.st.next, b.last_use[0], b.entry.last_use, b.holds[0]) == (1, 1, 1, 1, 5)


def test_a_queued_launch_leaves_gp_put_and_the_doorbell_alone():
  b = Bench()
  assert [b.queue() for _ in range(3)] == [1, 2, 3]
  assert b.st.put == 3 and list(b.ring[:3]) == [0x1000, 0x1001, 0x1002]
  assert b.gp_put.value == 0 and b.doorbell.value == 0
  assert b.submit() == 4 and b.gp_put.value == 4


def test_a_slot_that_holds_the_words_gets_only_the_payload():
  b = Bench()
  for _ in range(SLOTS): b.submit()
  b.counter.value = SLOTS  # the GPU finished them
  b.slots[0:48] = bytes(48)  # were the words written again, they would reappear here
  assert b.submit() == SLOTS + 1
  assert b.slot(0)[:PAYLOAD] == bytes(PAYLOAD) and int.from_bytes(b.slot(0)[PAYLOAD:PAYLOAD + 4], "little") == SLOTS + 1
  b.holds[1] = 0  # another submission wrote slot 1: the words go in again
  assert b.submit() == SLOTS + 2 and b.slot(1)[:8] == b.entry.words[0].to_bytes(8, "little")


def test_the_slot_and_ring_counters_wrap():
  b = Bench()
  for k in range(3 * ENTRIES):
    b.counter.value = k  # everything before this launch is done
    assert b.submit() == k + 1
  assert b.st.put == 3 * ENTRIES and b.gp_put.value == 0 and b.st.next == 3 * ENTRIES % SLOTS


@pytest.mark.parametrize("why", ["device off the fast path", "entry rewritten", "slot in use", "slot in use across the counter's wrap"])
def test_it_declines_and_changes_nothing(why):
  b = Bench()
  if why == "device off the fast path": b.st.fast = 0
  elif why == "entry rewritten": b.entry.generation = 6
  else:
    base = (1 << 32) - 2 if "wrap" in why else 0
    b.st.value = base + SLOTS
    b.counter.value = (base + 3) & 0xFFFFFFFF  # the GPU finished up to base + 3; slot 0 last took base + 4
    b.last_use[0] = base + 4
  before = b.counters()
  assert b.submit() == 0 and b.queue() == 0 and b.unlocked() == 0
  assert b.counters() == before


def test_without_the_lock_it_declines_while_a_thread_holds_it():
  """submit_unlocked (a repeated launch that takes no lock) declines while the device's lock is held, whatever else
  would let it through; the DeviceLock sets and clears `busy`, reentrantly."""
  b = Bench()
  lock = fastlaunch.DeviceLock(b.st)
  with lock:
    with lock: assert b.st.busy == 1
    assert b.st.busy == 1
    before = b.counters()
    assert b.unlocked() == 0 and b.counters() == before
    assert b.submit() == 1  # (the holder's own launch)
  assert b.st.busy == 0
  assert b.unlocked() == 2 and b.gp_put.value == 2 and b.doorbell.value == 0x77


def test_a_slot_done_across_the_counters_wrap_is_taken():
  b = Bench()
  b.st.value = (1 << 32) + 5
  b.counter.value = 5  # the 32-bit counter wrapped: the GPU is at 2**32 + 5, past slot 0's last use
  b.last_use[0] = (1 << 32) + 1
  assert b.submit() == (1 << 32) + 6
  assert int.from_bytes(b.slot(0)[PAYLOAD:PAYLOAD + 4], "little") == 6


def test_the_machine_code_is_what_its_source_compiles_to():
  """fastlaunch_x86_64.py is gen/fastlaunch.c compiled (the generator's --check), where the clang here has the major
  version the file was made with (another may lay the same code out otherwise)."""
  from plugrt_nv import fastlaunch_x86_64
  try: here = subprocess.run(["clang", "--version"], capture_output=True, text=True).stdout
  except OSError: pytest.skip("clang is not installed")
  major = [re.search(r"clang version (\d+)", text) for text in (here, fastlaunch_x86_64.__doc__ or "")]
  if not major[0] or not major[1] or major[0][1] != major[1][1]: pytest.skip("not the clang the machine code was made with")
  gen = os.path.join(os.path.dirname(__file__), "..", "gen", "fastlaunch.py")
  r = subprocess.run([sys.executable, gen, "--check"], capture_output=True, text=True)
  assert r.returncode == 0, r.stdout + r.stderr
