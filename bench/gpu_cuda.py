"""CUDA on the GPU machine: plugrt side by side with cupy and tinygrad 0.14 in one process.

    python bench/gpu_cuda.py [--quick] [--json PATH]

Rows (medians; ratio = other / plugrt for times, plugrt / other for bandwidths, so above 1 is plugrt ahead):
- launch: the tiny kernel (out[0] = x[0] + 1), N launches then one synchronize, per launch:
  plugrt's Program call, cupy's RawKernel, tinygrad's direct CUDA program call.
- graph replay: 1000 tiny launches captured once, replayed; per kernel: plugrt's Graph, cupy's stream-captured graph.
- H2D / D2H: 256 MiB, each side from pinned host memory (plugrt: Device.host_array; cupy: alloc_pinned_memory;
  the target's reference) and from the same pageable numpy array (plugrt stages it through pinned buffers).
- elementwise: out = a * x + y over 2^28 floats (3 GiB moved) as a plugrt kernel, against a device-to-device
  copy of 2 GiB (bytes read + written), the memory ceiling; and both against cupy's ElementwiseKernel and copyto.
  Written twice with the IR: one element a thread (saxpy_kernel), and with vector access (saxpy_vector_kernel: 4
  contiguous floats a thread, one 16-byte load of x and of y and one store, the n % 4 tail element by element).
- Tensor x*2+y: the same bytes through a fused Tensor expression (chunks of 4 with vector loads and stores, one pass),
  timed from the host; then its kernel's variants (tensor_u*_l*_g*: the knobs of plugrt.frontend.tensor) with events.
- Tensor sum: x.sum() over 2^28 floats (1 GiB read, in two launches: a partial result per group, then one group),
  GB/s read against the D2D copy's GB/s read + written (both what the memory moves), and against cupy's x.sum() (GB/s
  read); then its variants (tensor_sum_g*_u*_l*). tensor_*_host_us: the Python of one realize, the GPU behind it.
tinygrad is taken from the carried wheel (.whl) or an install; a side that cannot run shows '-' and why.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

TARGETS = {"launch": "<= 4 us (cupy 4.4-5.4, C floor 3.06)", "graph": "<= 1.0 us/kernel (C floor 0.73)",
           "h2d": ">= 90% of cupy pinned", "d2h": ">= 90% of cupy pinned", "elementwise": ">= 85% of D2D copy",
           "vector": ">= 95% of D2D copy (issue 30)", "sum": ">= 80% of D2D copy (issue 30)"}


def median_of(fn: Callable[[], float], reps: int) -> float:
  fn()  # warm-up
  return statistics.median(fn() for _ in range(reps))


def plugrt_side(quick: bool) -> dict[str, Any]:
  from plugrt import Buffer, Device, dtypes
  from plugrt.compiler.samples import saxpy_kernel, saxpy_vector_kernel, tiny_kernel
  from plugrt.runtime import Launch
  dev = Device["CUDA"]
  out: dict[str, Any] = {"device": dev.info.state.name}
  a, b = Buffer(dev, 1, dtypes.float32), Buffer.from_numpy(np.ones(1, np.float32), dev)
  prg = dev.program(tiny_kernel())
  n = 2000 if quick else 20000

  def launches() -> float:
    t = time.perf_counter()
    for _ in range(n): prg(a, b)
    dev.synchronize()
    return (time.perf_counter() - t) / n
  out["launch_us"] = median_of(launches, 5 if quick else 15) * 1e6
  assert a.numpy()[0] == 2.0, a.numpy()
  graph = dev.graph([Launch(prg, [a, b]) for _ in range(1000)])
  out["graph_us"] = median_of(lambda: graph(wait=True) / 1000, 5 if quick else 15) * 1e6
  size = (64 if quick else 256) << 20
  host = np.random.default_rng(0).integers(0, 255, size, dtype=np.uint8)
  buf = Buffer(dev, size, dtypes.uint8)

  def h2d() -> float:
    t = time.perf_counter()
    buf.copyin(host)
    return size / (time.perf_counter() - t) / 1e9
  out["h2d_gbs"] = median_of(h2d, 5)
  back = np.empty_like(host)

  def d2h() -> float:
    t = time.perf_counter()
    buf.copyout(back)
    return size / (time.perf_counter() - t) / 1e9
  out["d2h_gbs"] = median_of(d2h, 5)
  assert np.array_equal(back, host)
  pinned = dev.host_array(size, dtypes.uint8)  # page-locked host memory: the DMA reads and writes it directly
  pinned[:] = host

  def h2d_pinned() -> float:
    t = time.perf_counter()
    buf.copyin(pinned)
    return size / (time.perf_counter() - t) / 1e9

  def d2h_pinned() -> float:
    t = time.perf_counter()
    buf.copyout(pinned)
    return size / (time.perf_counter() - t) / 1e9
  out["h2d_pinned_gbs"], out["d2h_pinned_gbs"] = median_of(h2d_pinned, 5), median_of(d2h_pinned, 5)
  count = (1 << 24) if quick else (1 << 28)
  x, y, res = Buffer(dev, count, dtypes.float32), Buffer(dev, count, dtypes.float32), Buffer(dev, count, dtypes.float32)
  sax = dev.program(saxpy_kernel())
  sax(res, x, y, global_size=(count // 256, 1, 1), local_size=(256, 1, 1), vals=(2.0, count))
  out["elementwise_gbs"] = median_of(lambda: 3 * 4 * count / sax(res, x, y, global_size=(count // 256, 1, 1), local_size=(256, 1, 1),
                                                                   vals=(2.0, count), wait=True) / 1e9, 10)
  sax4 = dev.program(saxpy_vector_kernel())  # 4 floats a thread: count // 4 threads
  sax4(res, x, y, global_size=(count // 1024, 1, 1), local_size=(256, 1, 1), vals=(2.0, count), wait=True)
  out["elementwise_vector_gbs"] = median_of(lambda: 3 * 4 * count / sax4(res, x, y, global_size=(count // 1024, 1, 1), local_size=(256, 1, 1),
                                                                          vals=(2.0, count), wait=True) / 1e9, 10)
  src, dst = Buffer(dev, count * 2, dtypes.float32), Buffer(dev, count * 2, dtypes.float32)
  st = dev.info.state

  def copy_gbs() -> float:
    return 2 * 8 * count / st.timed(lambda: dev.allocator._copy(dst.handle, src.handle, 8 * count)) / 1e9
  out["d2d_copy_gbs"] = median_of(copy_gbs, 10)
  from plugrt import Tensor  # what users get: a fused elementwise Tensor expression
  tx, ty = Tensor.full(count, 1.5, dtypes.float32, "CUDA").realize(), Tensor.full(count, 0.5, dtypes.float32, "CUDA").realize()

  def tensor_gbs() -> float:
    dev.synchronize()
    t = time.perf_counter()
    (tx * 2.0 + ty).realize()
    dev.synchronize()
    return 3 * 4 * count / (time.perf_counter() - t) / 1e9
  out["tensor_elementwise_gbs"] = median_of(tensor_gbs, 10)
  want = float(np.float64(1.5) * count)
  got = tx.sum().item()
  assert abs(got - want) <= 1e-3 * want, f"Tensor sum {got}, want {want}"  # a staged sum of 1.5s in float32 is close
  out["tensor_sum_gbs"] = median_of(lambda: 4 * count / st.timed(lambda: tx.sum().realize()) / 1e9, 10)
  # the host's share of those rows: a realize's Python before and around its launches (the GPU runs behind it)
  def host_us(fn: Callable[[], Any]) -> float:
    dev.synchronize()
    t = time.perf_counter()
    fn()
    took = time.perf_counter() - t
    dev.synchronize()
    return took * 1e6
  out["tensor_elementwise_host_us"] = median_of(lambda: host_us(lambda: (tx * 2.0 + ty).realize()), 10)
  out["tensor_sum_host_us"] = median_of(lambda: host_us(lambda: tx.sum().realize()), 10)
  # the Tensor kernels' knobs (plugrt.frontend.tensor), each variant checked and timed with events around realize (so
  # with the Python before the first launch): x*2+y by chunks a thread (u), threads a group (l) and groups an axis (g:
  # 65535 takes a second axis past it, 2**31-1 one axis); the sum by groups of its first stage (g), chunks a thread
  # and step (u) and threads a group (l)
  from plugrt.frontend import tensor as T
  saved = T._UNROLL, T._GROUP, T._MAX_GROUPS, T._REDUCE_GROUPS, T._REDUCE_UNROLL
  want_ew = 1.5 * 2.0 + 0.5
  for unroll, group, groups in ((1, 256, 65535), (1, 256, 2**31 - 1), (1, 128, 65535), (1, 512, 65535), (1, 1024, 65535), (2, 256, 65535),
                                (4, 256, 65535)):
    T._UNROLL, T._GROUP, T._MAX_GROUPS = unroll, group, groups
    T._KERNELS.clear()
    r = (tx * 2.0 + ty).realize()
    assert r.min().item() == r.max().item() == want_ew, (unroll, group, groups, r.min().item(), r.max().item())
    del r
    out[f"tensor_u{unroll}_l{group}_g{groups}_gbs"] = median_of(lambda: 3 * 4 * count / st.timed(lambda: (tx * 2.0 + ty).realize()) / 1e9, 10)
  T._UNROLL, T._GROUP, T._MAX_GROUPS = saved[:3]
  for groups, unroll, group in ((512, 4, 256), (1024, 4, 256), (2048, 4, 256), (4096, 4, 256), (1024, 2, 256), (1024, 8, 256),
                                (2048, 8, 256), (4096, 8, 256), (1024, 4, 512)):
    T._REDUCE_GROUPS, T._REDUCE_UNROLL, T._GROUP = groups, unroll, group
    T._KERNELS.clear()
    got = tx.sum().item()
    assert abs(got - want) <= 1e-3 * want, (groups, unroll, group, got, want)
    out[f"tensor_sum_g{groups}_u{unroll}_l{group}_gbs"] = median_of(lambda: 4 * count / st.timed(lambda: tx.sum().realize()) / 1e9, 10)
  T._UNROLL, T._GROUP, T._MAX_GROUPS, T._REDUCE_GROUPS, T._REDUCE_UNROLL = saved
  T._KERNELS.clear()
  # what the elementwise figure is made of: the group size, and whether the compiler may assume no aliasing
  kern = saxpy_kernel()
  comp = dev.compiler_for("CUDA")
  src = comp.render(kern)
  restrict = src.replace("const float* x", "const float* __restrict__ x").replace("const float* y", "const float* __restrict__ y")
  variants = {f"ls{ls}": (sax, ls) for ls in (128, 256, 512, 1024)}
  variants["restrict_ls256"] = (dev.load(kern.name, comp.compile(restrict.replace("float* out", "float* __restrict__ out")), kern.signature), 256)
  # hand-written 16-byte loads and stores: what the vector-access IR kernel above should match
  vec4 = ('extern "C" __global__ void saxpy(float* out, const float* x, const float* y, float a, int n) {\n'
          '  int i = (blockIdx.x * blockDim.x + threadIdx.x) * 4;\n  if (i + 3 >= n) return;\n'
          '  float4 xv = *(const float4*)(x + i), yv = *(const float4*)(y + i);\n'
          '  *(float4*)(out + i) = make_float4(a * xv.x + yv.x, a * xv.y + yv.y, a * xv.z + yv.z, a * xv.w + yv.w);\n}\n')
  variants["float4_ls256"] = (dev.load(kern.name, comp.compile(vec4), kern.signature), 256)
  # four scalar elements per thread, a whole grid apart (coalesced, four loads of each input in flight): whether
  # unrolling alone, without vector types, reaches the copy
  x4 = ('extern "C" __global__ void saxpy(float* out, const float* x, const float* y, float a, int n) {\n'
        '  int t = gridDim.x * blockDim.x, i = blockIdx.x * blockDim.x + threadIdx.x;\n  if (i + 3 * t >= n) return;\n'
        '  float x0 = x[i], x1 = x[i + t], x2 = x[i + 2 * t], x3 = x[i + 3 * t];\n'
        '  float y0 = y[i], y1 = y[i + t], y2 = y[i + 2 * t], y3 = y[i + 3 * t];\n'
        '  out[i] = a * x0 + y0; out[i + t] = a * x1 + y1; out[i + 2 * t] = a * x2 + y2; out[i + 3 * t] = a * x3 + y3;\n}\n')
  variants["scalar4_ls256"] = (dev.load(kern.name, comp.compile(x4), kern.signature), 256)
  for label, (prg, ls) in variants.items():
    def gbs(prg: Any = prg, ls: int = ls, per: int = 4 if label.startswith(("float4", "scalar4")) else 1) -> float:
      return 3 * 4 * count / prg(res, x, y, global_size=(count // ls // per, 1, 1), local_size=(ls, 1, 1), vals=(2.0, count), wait=True) / 1e9
    out[f"elementwise_{label}_gbs"] = median_of(gbs, 10)
  return out


def cupy_side(quick: bool) -> dict[str, Any]:
  import cupy as cp
  out: dict[str, Any] = {}
  k = cp.RawKernel(r'extern "C" __global__ void tiny(float* out, const float* x) { out[0] = x[0] + 1.0f; }', "tiny")
  a, b = cp.zeros(1, cp.float32), cp.ones(1, cp.float32)
  n = 2000 if quick else 20000

  def launches() -> float:
    t = time.perf_counter()
    for _ in range(n): k((1,), (1,), (a, b))
    cp.cuda.runtime.deviceSynchronize()
    return (time.perf_counter() - t) / n
  out["launch_us"] = median_of(launches, 5 if quick else 15) * 1e6
  stream = cp.cuda.Stream(non_blocking=True)
  with stream:
    stream.begin_capture()
    for _ in range(1000): k((1,), (1,), (a, b))
    graph = stream.end_capture()
  start, end = cp.cuda.Event(), cp.cuda.Event()

  def replay() -> float:
    start.record(stream)
    graph.launch(stream)
    end.record(stream)
    end.synchronize()
    return cp.cuda.get_elapsed_time(start, end) / 1e3 / 1000
  out["graph_us"] = median_of(replay, 5 if quick else 15) * 1e6
  size = (64 if quick else 256) << 20
  pinned_mem = cp.cuda.alloc_pinned_memory(size)
  pinned = np.frombuffer(pinned_mem, np.uint8, size)
  pinned[:] = 1
  pageable = np.ones(size, np.uint8)
  dev_arr = cp.empty(size, cp.uint8)

  def h2d(src: np.ndarray) -> Callable[[], float]:
    def run() -> float:
      t = time.perf_counter()
      dev_arr.set(src)
      cp.cuda.runtime.deviceSynchronize()
      return size / (time.perf_counter() - t) / 1e9
    return run

  def d2h(dst: np.ndarray) -> Callable[[], float]:
    def run() -> float:
      t = time.perf_counter()
      dev_arr.get(out=dst)
      cp.cuda.runtime.deviceSynchronize()
      return size / (time.perf_counter() - t) / 1e9
    return run
  out["h2d_pinned_gbs"], out["h2d_pageable_gbs"] = median_of(h2d(pinned), 5), median_of(h2d(pageable), 5)
  out["d2h_pinned_gbs"], out["d2h_pageable_gbs"] = median_of(d2h(pinned), 5), median_of(d2h(pageable), 5)
  # cupy's own elementwise saxpy and device-to-device copy, same sizes as plugrt's rows, timed with events
  count = (1 << 24) if quick else (1 << 28)
  saxpy = cp.ElementwiseKernel("float32 a, float32 x, float32 y", "float32 out", "out = a * x + y", "bench_saxpy")
  x, y, res = cp.full(count, 1.5, cp.float32), cp.full(count, 0.5, cp.float32), cp.empty(count, cp.float32)
  src, dst = cp.ones(2 * count, cp.float32), cp.empty(2 * count, cp.float32)

  def timed(fn: Callable[[], Any]) -> float:
    start.record()
    fn()
    end.record()
    end.synchronize()
    return cp.cuda.get_elapsed_time(start, end) / 1e3
  out["elementwise_gbs"] = median_of(lambda: 3 * 4 * count / timed(lambda: saxpy(np.float32(2.0), x, y, res)) / 1e9, 10)
  out["d2d_copy_gbs"] = median_of(lambda: 2 * 8 * count / timed(lambda: cp.copyto(dst, src)) / 1e9, 10)
  out["sum_gbs"] = median_of(lambda: 4 * count / timed(lambda: x.sum()) / 1e9, 10)
  return out


def tinygrad_side(quick: bool) -> dict[str, Any]:
  """tinygrad 0.14's CUDA device: the tiny kernel as a direct program call, as bench/_tinygrad.py does on the CPU."""
  from tinygrad import Device, UOp, dtypes
  from tinygrad.codegen import do_to_program
  from tinygrad.device import Buffer
  from tinygrad.uop.ops import KernelInfo
  dev = Device["CUDA"]
  out_p, x_p = UOp.param(0, dtypes.float32, (1,)), UOp.param(1, dtypes.float32, (1,))
  ast = out_p[0].store(x_p[0] + 1.0).sink(arg=KernelInfo("bench_tiny"), tag=1)
  prg = do_to_program(ast, dev.renderer)
  rt = dev.runtime(prg.to_elf())
  a = Buffer("CUDA", 1, dtypes.float32).allocate()
  b = Buffer("CUDA", 1, dtypes.float32, initial_value=b"\x00\x00\x80\x3f")
  ab, bb = a._buf, b._buf
  n = 2000 if quick else 20000

  def launches() -> float:
    t = time.perf_counter()
    for _ in range(n): rt(ab, bb)
    dev.synchronize()
    return (time.perf_counter() - t) / n
  return {"launch_us": median_of(launches, 5 if quick else 15) * 1e6}


def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--quick", action="store_true")
  ap.add_argument("--json")
  args = ap.parse_args(argv)
  res: dict[str, Any] = {}
  for name, fn in (("plugrt", plugrt_side), ("cupy", cupy_side), ("tinygrad", tinygrad_side)):
    try: res[name] = fn(args.quick)
    except Exception as e:  # a side that cannot run here is reported, not fatal
      res[name] = {"error": f"{type(e).__name__}: {e}"}
      print(f"{name}: {res[name]['error']}", file=sys.stderr)
  p, c, t = res["plugrt"], res["cupy"], res["tinygrad"]

  def ratio(a: Any, b: Any) -> str: return f"{a / b:.2f}x" if isinstance(a, float) and isinstance(b, float) and b else "-"
  def row(label: str, mine: str, other: Any, key: str, faster_is_lower: bool, target: str = "") -> tuple:
    a, b = p.get(mine), other.get(key)
    return (label, a, b, t.get(mine) if other is c and mine == "launch_us" else None, ratio(b, a) if faster_is_lower else ratio(a, b), target)
  rows = [row("launch (us)", "launch_us", c, "launch_us", True, TARGETS["launch"]),
          row("graph replay (us/kernel)", "graph_us", c, "graph_us", True, TARGETS["graph"]),
          row("H2D pinned (GB/s) vs cupy pinned", "h2d_pinned_gbs", c, "h2d_pinned_gbs", False, TARGETS["h2d"]),
          row("H2D pageable (GB/s) vs cupy pageable", "h2d_gbs", c, "h2d_pageable_gbs", False),
          row("D2H pinned (GB/s) vs cupy pinned", "d2h_pinned_gbs", c, "d2h_pinned_gbs", False, TARGETS["d2h"]),
          row("D2H pageable (GB/s) vs cupy pageable", "d2h_gbs", c, "d2h_pageable_gbs", False),
          row("elementwise kernel vs D2D copy (GB/s)", "elementwise_gbs", p, "d2d_copy_gbs", False, TARGETS["elementwise"]),
          row("IR elementwise, vector access, vs D2D copy", "elementwise_vector_gbs", p, "d2d_copy_gbs", False, TARGETS["vector"]),
          row("Tensor x*2+y vs D2D copy (GB/s)", "tensor_elementwise_gbs", p, "d2d_copy_gbs", False, TARGETS["vector"]),
          row("Tensor sum (GB/s read) vs D2D copy", "tensor_sum_gbs", p, "d2d_copy_gbs", False, TARGETS["sum"]),
          row("Tensor sum vs cupy's x.sum() (GB/s read)", "tensor_sum_gbs", c, "sum_gbs", False),
          row("elementwise kernel vs cupy's", "elementwise_gbs", c, "elementwise_gbs", False),
          row("D2D copy vs cupy's copyto", "d2d_copy_gbs", c, "d2d_copy_gbs", False)]
  def f(v: Any) -> str: return f"{v:.2f}" if isinstance(v, float) else "-"
  print("variants (GB/s; host: us):")  # first, so that the table ends the output
  for k, v in sorted(p.items()):
    if k.startswith(("elementwise_", "tensor_")) and k not in ("elementwise_gbs", "tensor_sum_gbs", "tensor_elementwise_gbs"):
      print(f"    {k:<36} {f(v):>10}")
  print(f"CUDA bench on {p.get('device', '?')}{' (quick)' if args.quick else ''}: plugrt | cupy (or the reference) | tinygrad | ratio | target")
  for label, a, b, tg, r, target in rows: print(f"  {label:<32} {f(a):>10} {f(b):>10} {f(tg):>10} {r:>8}  {target}")
  if args.json:
    with open(args.json, "w") as fh: json.dump(res, fh, indent=2)
  return 0


if __name__ == "__main__":
  sys.exit(main())
