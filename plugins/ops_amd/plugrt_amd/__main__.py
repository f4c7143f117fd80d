"""`python -m plugrt_amd [ARCH...]`: what plugrt-amd finds here, layer by layer, and a kernel built for each arch.

Prints the device and interface probes (sysfs and /dev names only), the toolchains, then compiles plugrt's saxpy
for each ARCH (default: the four tested ones) and shows what its code object tells a dispatcher. Exit status 0 when
every compile worked.
"""
from __future__ import annotations

import sys

from plugrt.context import PluginContext


def main(argv: list[str]) -> int:
  import plugrt_amd
  from plugrt.compiler import samples as K
  from plugrt.errors import PlugrtError
  from plugrt_amd import codeobject, hw
  ctx = PluginContext.from_process()
  for what, probe in (("device", plugrt_amd.probe_amd), ("compiler LLVM", plugrt_amd.probe_llvm), ("compiler HIP", plugrt_amd.probe_hip)):
    p = probe(ctx)
    print(f"{what:14} {'ok' if p.ok else 'no'}: {p.detail}" + (f"\n{'':15} fix: {p.hint}" if p.hint else ""))
  for mod in ("plugrt_amd_kfd", "plugrt_amd_pci", "plugrt_amd_usb"):
    try: iface = __import__(mod)
    except ImportError: print(f"interface {mod}: not installed"); continue
    p = iface.probe(ctx) if iface.probe.__code__.co_argcount else iface.probe()
    print(f"interface {iface.NAME:4} {'ok' if p.ok else 'no'}: {p.detail}")
  failed = 0
  for arch in argv or hw.TESTED_ARCHS:
    try:
      c = plugrt_amd.compiler_for(arch)
      co = codeobject.parse(c.compile(c.render(K.saxpy_kernel())))
    except PlugrtError as e:
      print(f"{arch}: {e}"); failed += 1; continue
    k = co.kernels["saxpy"]
    print(f"{co.arch}: code object v{co.code_object_version}, {len(co.blob)} bytes; saxpy: descriptor at 0x{k.kd_offset:x}, "
          f"kernargs {k.kernarg_size} B ({len(k.explicit_args)} explicit, hidden from {k.implicit_offset}), wave{k.wavefront_size}, "
          f"{k.vgpr_count} VGPRs, {k.sgpr_count} SGPRs, LDS {k.group_segment_size} B")
  print("never run on an AMD GPU: this release compiles and checks code objects; dispatch (the KFD queue layer) is the next step")
  return 1 if failed else 0


if __name__ == "__main__": sys.exit(main(sys.argv[1:]))
