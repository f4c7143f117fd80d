"""NV's device-to-device copy kernel in variants, against CUDA's cuMemcpyDtoD, on the GPU machine (issue 30, item 4).

  python bench/nv_copy_variants.py [--sizes 1M,16M,256M,1G] [--reps 7]

Each variant is plugrt-nv's copy kernel (plugrt_nv.device.copy_kernel_source) with another number of 16-byte loads
in flight per thread, threads per block and blocks per multiprocessor, compiled by NVRTC and launched through
plugrt-nv as the allocator launches it; CUDA's row is plugrt-cuda's Buffer.copy_to (cuMemcpyDtoD) in the same process
on the same GPU, as is the copy engine's (NV's copies below the kernel threshold). Every figure is the median of
`reps` timed copies (each waited for), GB/s counting the bytes copied once; every copy is checked. Printed: per size,
each variant's GB/s and its ratio to CUDA's, best first, then the variant the allocator uses now.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from functools import partial
from types import SimpleNamespace
from typing import Any

import numpy as np


def parse_size(text: str) -> int:
  mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
  return int(text[:-1]) * mult[text[-1]] if text[-1] in mult else int(text)


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--sizes", default="1M,16M,256M,1G")
  ap.add_argument("--reps", type=int, default=7)
  args = ap.parse_args()
  from plugrt import Buffer, Device, dtypes
  from plugrt.compiler.ir import Signature
  from plugrt_nv import cmd
  from plugrt_nv import device as nvd
  from plugrt_nvidia_toolchain import nvrtc
  nv, cu = Device["NV"], Device["CUDA"]
  st = nv.info.state
  sms = st.iface.gr.get("sms", 1)
  shim = SimpleNamespace(info=SimpleNamespace(state=st), allocator=nv.allocator)  # as the allocator builds its copy kernel
  programs = {k: nvd.NVProgram(shim, "plugrt_nv_copy", nvrtc.compile_cubin(nvd.copy_kernel_source(k), st.arch, nv.info.context.env),
                               Signature((), (dtypes.uint64,) * 3)) for k in (4, 8)}
  variants = [(k, threads, per_sm) for k in programs for threads in (256, 512, 1024) for per_sm in (4, 8, 16, 32)]

  def timed(fn: Any, reps: int) -> float:
    fn(); nv.synchronize(); cu.synchronize()
    got = []
    for _ in range(reps):
      t = time.perf_counter(); fn(); nv.synchronize(); cu.synchronize(); got.append(time.perf_counter() - t)
    return statistics.median(got)

  def kernel_copy(prg: Any, blocks: int, threads: int, dst: Any, src: Any, size: int) -> None:
    prg(global_size=(blocks, 1, 1), local_size=(threads, 1, 1), vals=(dst.handle, src.handle, size))

  print(f"NV copy kernel variants against CUDA's cuMemcpyDtoD; {sms} multiprocessors; GB/s counts the bytes copied once")
  for size in (parse_size(s) for s in args.sizes.split(",")):
    n = size // 4
    host = np.random.default_rng(size).integers(0, 1 << 30, n, dtype=np.int32)
    src, dst = Buffer.from_numpy(host, nv), Buffer(nv, n, dtypes.int32)
    csrc, cdst = Buffer.from_numpy(host, cu), Buffer(cu, n, dtypes.int32)
    cuda = size / timed(partial(csrc.copy_to, cdst), args.reps) / 1e9
    assert np.array_equal(cdst.numpy(), host)
    rows = []
    for inflight, threads, per_sm in variants:
      run = partial(kernel_copy, programs[inflight], max(1, min(-(-size // (threads * 16)), sms * per_sm)), threads, dst, src, size)
      gbs = size / timed(run, args.reps) / 1e9
      dst.copyin(np.zeros(n, np.int32))
      run(); nv.synchronize()
      assert np.array_equal(dst.numpy(), host), (inflight, threads, per_sm)
      rows.append((gbs, f"{inflight} in flight, {threads} threads, {per_sm} blocks/SM"))
    engine = size / timed(partial(st.submit, st.copy, cmd.copy(dst.handle, src.handle, size)), args.reps) / 1e9
    now = size / timed(partial(src.copy_to, dst), args.reps) / 1e9
    print(f"\n{size >> 20} MiB: CUDA {cuda:7.1f} GB/s; NV as the allocator copies now {now:7.1f} ({now / cuda:.3f}); copy engine {engine:7.1f} "
          f"({engine / cuda:.3f})")
    for gbs, what in sorted(rows, reverse=True)[:8]: print(f"  {gbs:7.1f} GB/s  {gbs / cuda:.3f}  {what}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
