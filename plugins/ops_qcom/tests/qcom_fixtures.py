"""Opening QCOM on the fake KGSL: plugrt-qcom's own hooks, with the probes forced true (there is no Adreno here), the
device state opened on a FakeKGSL and the compiler replaced by the stand-in (there is no Qualcomm driver here)."""
from __future__ import annotations

import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import plugrt_qcom
from fake_kgsl import FakeKGSL
from qcom_standin import StandInCompiler

from plugrt.hookspecs import CompilerSpec, Probe, hookimpl
from plugrt.registry import isolated

ENV = {"QCOM": "1", "PLUGRT_CACHE": "0", "PLUGRT_QCOM_TIMEOUT": "10"}


def fake_plugins(fake: FakeKGSL) -> list[Any]:
  mod = types.ModuleType("fake_plugrt_qcom")
  found = lambda *a: Probe.found(1, "fake")
  spec = plugrt_qcom.plugrt_backends()[0]._replace(probe=found, compilers=(CompilerSpec("CL", "the stand-in compiler", found),))
  mod.plugrt_backends = hookimpl(lambda: [spec])  # type: ignore[attr-defined]

  def open_device(device: Any) -> Any:
    from plugrt_qcom.device import QCOMState
    return QCOMState(device, ops=fake)
  mod.plugrt_open_device = hookimpl(open_device)  # type: ignore[attr-defined]
  mod.plugrt_allocator = plugrt_qcom.plugrt_allocator  # type: ignore[attr-defined]
  mod.plugrt_compiler = hookimpl(lambda device, compiler: StandInCompiler(device))  # type: ignore[attr-defined]
  mod.plugrt_program = plugrt_qcom.plugrt_program  # type: ignore[attr-defined]
  return [mod, "plugrt.reference"]


@contextmanager
def fake_qcom(env: dict[str, str] | None = None, **kw: Any) -> Iterator[tuple[FakeKGSL, Any]]:
  """(the fake KGSL, the QCOM device opened on it), in a registry of exactly QCOM and PYTHON made the process's own."""
  fake = FakeKGSL(**kw)
  try:
    with isolated(fake_plugins(fake), env={**ENV, **(env or {})}) as reg: yield fake, reg.open("QCOM")
  finally: fake.shutdown()
