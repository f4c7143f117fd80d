"""The compiler layer: the kernel IR (ir, arith), its lowering, the reference interpreter, the renderers, and the
sample kernels with known answers that doctor and the conformance suite run (samples).

It stands on the backend-facing layer (plugrt's top-level modules: dtype, errors, launchargs, runtime, device) and
nothing above it; backends import their renderer base from here (plugrt.compiler.renderer.cstyle).
"""
