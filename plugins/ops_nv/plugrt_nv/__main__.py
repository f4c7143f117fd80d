"""`python -m plugrt_nv [index] [--out DIR]`: check the NV device layer by layer and say where it stops.

1. the probe; 2. the interface alone (driver, classes, VA space, memory of each kind, CPU access), the one the
registry would open the device with (NV_IFACE, else the automatic choice), opened through its hook; 3. the device
(channels, doorbell, first commands); 4. copies, and what bounds a host copy; 5. kernels (a tiny one, saxpy, a 3-D
grid, shared memory, timing); 6. launch overhead, and the cost of each store a launch makes; 7. with a second GPU,
copies between the two (the path: a peer mapping, or staged and why) both ways, checked and timed. Each step prints OK
with its figures or FAILED with the error, and the run stops at the first failure (exit status 1).
"""
from __future__ import annotations

import ctypes
import os
import sys
import time
import traceback

from plugrt import Device
from plugrt.context import DeviceInfo
from plugrt.errors import DeviceUnavailable, Reason
from plugrt.probing import install_hint
from plugrt_nv.iface import GPUInterface


def step(name: str, fn):  # type: ignore[no-untyped-def]
  t = time.perf_counter()
  try: out = fn()
  except BaseException as e:
    print(f"FAILED {name} ({time.perf_counter() - t:.3f} s): {type(e).__name__}: {e}", flush=True)
    traceback.print_exc()
    sys.exit(1)
  print(f"OK     {name} ({time.perf_counter() - t:.3f} s){': ' + str(out) if out is not None else ''}", flush=True)
  return out


def interface_alone(index: int) -> str:
  """Open GPU `index` through the interface the registry chooses for NV (its plugrt_open_interface hook, as opening
  the device would), allocate memory of each kind and check the CPU's view of it, then close the interface."""
  reg = Device.registry
  chosen = reg.choose_interface("NV")
  if chosen is None: raise DeviceUnavailable("no NV interface is installed", Reason.NOT_INSTALLED, install_hint("plugrt-nv-nvk"))
  spec, rec = chosen
  iface: GPUInterface = reg.call_hook(rec, "plugrt_open_interface", device=DeviceInfo("NV", index, "", spec.name, context=reg.context),
                             interface=spec.name)
  try:
    for kind in ("device", "mapped", "host"):
      m = iface.alloc(1 << 20, kind)
      if kind != "device":
        ctypes.memset(m.va, 0x5A, m.size)
        assert ctypes.string_at(m.va + 12345, 4) == b"ZZZZ", f"{kind} memory does not read back what the CPU wrote"
      iface.free(m)
    return f"{spec.name}: {iface.description}; GR {iface.gr}"
  finally: iface.close()


def main() -> None:
  args = sys.argv[1:]
  out_dir = args[args.index("--out") + 1] if "--out" in args else ""
  index = int(next((a for a in args if a.isdigit()), "0"))
  import numpy as np

  import plugrt_nv
  from plugrt import Buffer, dtypes
  from plugrt.compiler import samples as K
  from plugrt.context import PluginContext
  probe = step("probe", lambda: plugrt_nv.probe_nv(PluginContext.from_process()))

  step("interface: driver, classes, VA space, memory", lambda: interface_alone(index))
  dev = step("device: channels, doorbell, first commands", lambda: Device[f"NV:{index}" if index else "NV"])
  st = dev.info.state
  print(f"       slots at {st.slots.base:#x}, signals at {st.sem:#x}, local memory {st.slm} B/thread, tokens {st.compute.token}/{st.copy.token}")

  def copies() -> str:
    rng = np.random.default_rng(0)
    res = []
    for n in (16, 1 << 20, 100 << 20):
      x = rng.integers(0, 255, n, dtype=np.uint8)
      b = Buffer(dev, n, dtypes.uint8).copyin(x)
      t = time.perf_counter()
      y = b.numpy()
      dt = time.perf_counter() - t
      assert np.array_equal(x, y), f"copy of {n} bytes came back different"
      c = Buffer(dev, n, dtypes.uint8)
      b.copy_to(c)
      assert np.array_equal(c.numpy(), x), "device-to-device copy differs"
      res.append(f"{n} B ok ({n / dt / 1e9:.2f} GB/s out)")
    return ", ".join(res)
  step("copies (host: the copy engine; device to device: a kernel from 1 MiB)", copies)

  def copy_parts() -> str:
    """What bounds a host copy: the copy engine between GPU memory and a pinned staging buffer, and the CPU's copy
    between a numpy array and that buffer (one thread, and the allocator's parallel pieces)."""
    from plugrt_nv import cmd
    st, al = dev.info.state, dev.allocator
    staging = al.staging
    stage, n, reps = staging.buffer(0), staging.chunk, 8
    d = Buffer(dev, n, dtypes.uint8)
    host = np.ones(n, np.uint8)
    addr = host.ctypes.data
    def rate(fn) -> float:
      fn()
      t = time.perf_counter()
      for _ in range(reps): fn()
      dev.synchronize()
      return n * reps / (time.perf_counter() - t) / 1e9
    out = {"DMA host->GPU": rate(lambda: st.submit(st.copy, cmd.copy(d.handle, stage, n))),
           "DMA GPU->host": rate(lambda: st.submit(st.copy, cmd.copy(stage, d.handle, n))),
           "CPU copy, 1 thread": rate(lambda: ctypes.memmove(stage, addr, n)),
           f"CPU copy, {staging.threads} threads": rate(lambda: staging.memcpy(stage, addr, n)),
           "CPU copy back, threads": rate(lambda: staging.memcpy(addr, stage, n))}
    return ", ".join(f"{k} {v:.1f} GB/s" for k, v in out.items()) + f" ({n >> 20} MiB pieces)"
  step("where a host copy's time goes", copy_parts)

  def kernels() -> str:
    a, b = Buffer(dev, 1, dtypes.float32), Buffer.from_numpy(np.array([41], np.float32), dev)
    prg = dev.program(K.tiny_kernel())
    if out_dir:
      with open(os.path.join(out_dir, "tiny.cubin"), "wb") as f: f.write(prg.lib)
    t = prg(a, b, wait=True)
    assert a.numpy()[0] == 42.0, f"tiny kernel wrote {a.numpy()[0]}, not 42"
    n = 1 << 20
    x = np.arange(n, dtype=np.float32)
    out, xb, yb = Buffer(dev, n, dtypes.float32), Buffer.from_numpy(x, dev), Buffer.from_numpy(x * 2, dev)
    prg2 = dev.program(K.saxpy_kernel())
    t2 = prg2(out, xb, yb, global_size=(n // 256, 1, 1), local_size=(256, 1, 1), vals=(3.0, n), wait=True)
    assert np.array_equal(out.numpy(), 3 * x + 2 * x), "saxpy is wrong"
    for case in (K.grid3d_case(), K.reverse_case(), K.reduce_case(), K.control_case()): K.run_case(dev, case, "CUDA")
    return f"tiny {t * 1e6:.1f} us, saxpy 1M {t2 * 1e6:.1f} us; grid3d, shared memory, barriers, control flow match the interpreter"
  step("kernels (NVRTC cubins, QMD launches)", kernels)

  def overhead() -> str:
    a, b = Buffer(dev, 1, dtypes.float32), Buffer.from_numpy(np.array([1], np.float32), dev)
    prg = dev.program(K.tiny_kernel())
    for _ in range(1200): prg(a, b)  # every command slot used once
    dev.synchronize()
    enq = total = 1e9
    for _ in range(5):
      t = time.perf_counter()
      for _ in range(400): prg(a, b)
      enq = min(enq, (time.perf_counter() - t) / 400)
      dev.synchronize()
      t = time.perf_counter()
      for _ in range(2000): prg(a, b)
      dev.synchronize()
      total = min(total, (time.perf_counter() - t) / 2000)
    assert a.numpy()[0] == 2.0
    return f"{enq * 1e6:.2f} us per launch to enqueue (400, no wait); {total * 1e6:.2f} us per launch for 2000 then one wait"
  step("launch overhead", overhead)

  def breakdown() -> str:
    """The stores a fast-path launch makes, each timed alone (the doorbell is rung with no new work: harmless)."""
    import struct
    st = dev.info.state
    ch, mv, n = st.compute, st.slots.view, 4000
    data = bytes(48)
    dev.synchronize()
    def timed(fn) -> float:
      t = time.perf_counter()
      for i in range(n): fn(i)
      return (time.perf_counter() - t) / n * 1e6
    put = ch.put % ch.entries
    entry = ch.ring[put]
    rows = {"48 B into a slot": timed(lambda i: mv.__setitem__(slice(i % 256 * 4096, i % 256 * 4096 + 48), data)),
            "payload word": timed(lambda i: struct.pack_into("<I", mv, i % 256 * 4096 + 36, i)),
            "ring entry": timed(lambda i: ch.ring.__setitem__(put, entry)),
            "GP_PUT": timed(lambda i: setattr(ch.put_register, "value", put)),
            "fence": timed(lambda i: st._fence()),
            "doorbell": timed(lambda i: setattr(ch.doorbell, "value", ch.token)),
            "empty loop": timed(lambda i: None)}
    dev.synchronize()
    st.slot_holds[:] = [0] * len(st.slot_holds)  # the slots written above hold no launch's words now
    return ", ".join(f"{k} {v:.3f} us" for k, v in rows.items()) + f" (slots: {st.slots_mem.kind})"
  step("where a launch's time goes", breakdown)

  def between_gpus() -> str:
    other = Device["NV:1" if index == 0 else "NV"]
    n, res = 64 << 20, []
    x = np.random.default_rng(1).integers(0, 255, n, dtype=np.uint8)
    for s, d in ((dev, other), (other, dev)):
      a, b = Buffer(s, n, dtypes.uint8).copyin(x), Buffer(d, n, dtypes.uint8)
      a.copy_to(b)  # the first copy sets the pair up (peer access, mappings)
      d.synchronize()
      t = time.perf_counter()
      for _ in range(4): a.copy_to(b)
      d.synchronize()
      rate = 4 * n / (time.perf_counter() - t) / 1e9
      assert np.array_equal(b.numpy(), x), f"the copy from {s.canonical} to {d.canonical} differs from its source"
      res.append(f"{s.canonical} -> {d.canonical}: {s.allocator.peer_path(d)}, {rate:.1f} GB/s")
    return "; ".join(res)
  if probe.count >= 2: step("copies between two GPUs (a peer mapping where the driver allows it)", between_gpus)
  print("NV works on this machine")


if __name__ == "__main__":
  main()
