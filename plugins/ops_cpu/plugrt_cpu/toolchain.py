"""What the CPU device's compilers and its entry module share: which C compiler the context names, its probe, and the
CPU's limits a compiler checks kernels against. A leaf (standard library and plugrt only), so that the entry module
and the compilers can both import it.
"""
from __future__ import annotations

from plugrt.context import PluginContext
from plugrt.errors import Reason
from plugrt.hookspecs import Probe

#: the most bytes of shared arrays a CPU kernel's group may have: they live on the stack of the thread running the group
#: (a caller's thread, or a worker's with the platform's default stack, 8 MiB on Linux), where 8 MiB of them crashed
MAX_SHARED_BYTES = 1 << 20


def which_cc(ctx: PluginContext) -> tuple[str | None, str]:
  """(path of the C compiler, how it was named): the context's CC when set, else clang from its PATH."""
  cc = ctx.get("CC")
  return (ctx.which(cc), f"CC={cc}") if cc else (ctx.which("clang"), "clang")


def probe_clang(ctx: PluginContext) -> Probe:
  cc, what = which_cc(ctx)
  if cc is None:
    hint = "install it or unset CC" if what.startswith("CC=") else "apt-get install clang (or set CC to a C compiler)"
    return Probe.missing(Reason.MISSING_TOOLCHAIN, f"{what} is not on PATH", hint)
  return Probe.found(1, cc)
