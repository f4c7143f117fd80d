"""The WEBGPU device's first-party engines and how to install the default one: what the entry module's probe, the
device and `python -m plugrt_webgpu` share, in a leaf of its own (standard library and plugrt only)."""
from __future__ import annotations

from plugrt.probing import install_hint

#: first-party engines: (interface, its package's module, the library it drives, distribution to install)
ENGINES = (("WGPU", "plugrt_webgpu_wgpu", "wgpu", "plugrt-webgpu-wgpu"), ("DAWN", "plugrt_webgpu_dawn", "pydawn", "plugrt-webgpu-dawn"))


def engine_hint() -> str:
  """How to install the default engine, the way plugrt was installed."""
  return f"{install_hint('plugrt-webgpu-wgpu')} (wgpu-native; or plugrt-webgpu-dawn: Dawn)"
