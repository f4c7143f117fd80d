"""The CPU device's C means the same to gcc as to clang: CC may name any C compiler, and a construct one of them does not
know must be an error, never a kernel that runs wrongly (gcc ignored clang's ext_vector_type with a warning, compiled the
vector type as a scalar, and a vector store wrote one element of four)."""
from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from plugrt import Buffer, dtypes
from plugrt.compiler.ir import KernelBuilder
from plugrt.registry import Registry

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is not installed")


@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.int32, dtypes.uint8, dtypes.float64, dtypes.bool])
def test_vector_loads_and_stores_compiled_by_gcc(dt) -> None:
  reg = Registry(env={**os.environ, "CC": "gcc", "DEV": "CPU:CLANG", "PLUGRT_CACHE": "0"})
  try:
    dev = reg.open("CPU")
    assert dev.compiler.cc.endswith("gcc"), dev.compiler.cc
    w = min(4, 16 // dt.itemsize)
    b = KernelBuilder("vcopy")
    o, x = b.buffer("o", dt), b.buffer("x", dt)
    i = b.global_id(0) * w
    o.vstore(i, list(x.vload(i, w)))
    prg = dev.program(b.finish())
    host = (np.arange(4 * w) % 2).astype(dt.numpy) if dt is dtypes.bool else np.arange(1, 4 * w + 1).astype(dt.numpy)
    xb, ob = Buffer.from_numpy(host, dev), Buffer.from_numpy(np.zeros_like(host), dev)
    prg(ob, xb, global_size=(4, 1, 1), wait=True)
    assert ob.numpy().tolist() == host.tolist()
  finally: reg.close()
