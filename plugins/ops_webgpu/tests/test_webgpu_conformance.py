"""plugrt's conformance suite on the WEBGPU device, once per engine (wgpu-native, Dawn), and on
wgpu-native's OpenGL adapter too where there is one.

Kernels using 64-bit dtypes skip with the renderer's RenderError (WGSL has none);
float16 kernels skip the same way on adapters without shader-f16. Memory tests run
for every dtype: WebGPU holds any bytes.
"""
from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from webgpu_engines import device as engine_device

from plugrt.compiler import samples as K
from plugrt.dtype import DType, dtypes
from plugrt.registry import use
from plugrt_testing.conformance import ConformanceSuite

WIDE = (dtypes.int64, dtypes.uint64, dtypes.float64)


class _EngineSuite(ConformanceSuite):
  device = "WEBGPU"
  engine = ""
  adapter = ""  # PLUGRT_WEBGPU_ADAPTER for this class; "" = the engine's (or the environment's) choice
  # WGSL allows approximate transcendentals (sin: 2^-11 absolute inside [-pi, pi], nothing promised outside).
  # NVIDIA's Vulkan driver was measured 5.2e-7 off on float32 sin over [-12, 12], past the suite's 4e-7;
  # 2^-19 admits hardware sin while still catching a wrong renderer.
  transcendental_atol = {dtypes.float32: 2.0 ** -19}
  # WGSL compilers do fast math: lavapipe folds (a+b)-a to b (docs/fuzzing.md)
  reassociates_floats = True
  # and fuse a multiply and an add (naga and Tint emit no NoContraction): NVIDIA's Vulkan driver computes
  # ((a-b)*c)+b with one rounding, 1 ulp off the IR's two (measured on the H100, 2026-11-25)
  contracts_floats = True

  @pytest.fixture
  def dev(self, compiler: str) -> Iterator[Any]:
    d = engine_device(self.engine, self.adapter)
    with use(d.registry): yield d  # Buffer(...) and the suite's device lookups see this engine's registry

  @pytest.mark.parametrize("dt", K.ALL, ids=lambda d: d.name)
  def test_casts(self, dev: Any, compiler: str, dt: DType, monkeypatch: pytest.MonkeyPatch) -> None:
    """The core's cast case writes all 13 dtypes from one kernel: more storage buffers than WebGPU
    guarantees, and 64-bit ones WGSL cannot hold. Run it in pieces the device can bind, over the
    dtypes WGSL has (the 64-bit ones are covered by the RenderError tests)."""
    self.skip_dtype(dt)
    if dt in WIDE: pytest.skip(f"WEBGPU has no {dt.name} (RenderError)")
    f16 = "shader-f16" in dev.info.iface_object.features
    if dt is dtypes.float16 and not f16: pytest.skip("this adapter has no shader-f16")
    targets = [d for d in K.ALL if d not in WIDE and (f16 or d is not dtypes.float16)]
    per = max(1, dev.info.iface_object.limits.max_storage_buffers - 3)  # the case's own inputs take up to 3
    for i in range(0, len(targets), per):
      monkeypatch.setattr(K, "ALL", tuple(targets[i:i + per]))
      self.run(dev, K.cast_case(dt), compiler)


  @pytest.mark.parametrize("group", K.BITCAST_GROUPS, ids=lambda g: f"{g[0].itemsize * 8}bit")
  def test_bitcasts(self, dev: Any, compiler: str, group: tuple[DType, ...]) -> None:
    """A group of n dtypes takes n*n buffers (16 for the 16-bit group): where the device binds fewer,
    run every pair (with a float beside two integers, so the case has float bits to start from)."""
    for dt in group: self.skip_dtype(dt)
    if len(group) ** 2 <= dev.info.iface_object.limits.max_storage_buffers:
      self.run(dev, K.bitcast_case(group), compiler)
      return
    floats = [d for d in group if d.kind == "f"]
    for a, b in itertools.combinations(group, 2):
      self.run(dev, K.bitcast_case((a, b) if a.kind == "f" or b.kind == "f" or not floats else (floats[0], a, b)), compiler)


class TestWebGPUOnWgpu(_EngineSuite):
  engine = "WGPU"


class TestWebGPUOnDawn(_EngineSuite):
  engine = "DAWN"


class TestWebGPUOnWgpuOpenGL(_EngineSuite):
  """wgpu-native's OpenGL backend (llvmpipe through EGL here): WGSL goes to GLSL instead of SPIR-V."""
  engine = "WGPU"
  adapter = "opengl"
