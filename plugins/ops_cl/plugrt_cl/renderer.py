"""The OpenCL C renderer: it lives in the core (plugrt.compiler.renderer.opencl) because plugrt-qcom renders the same OpenCL C
for Qualcomm's driver; this module keeps plugrt-cl's name for it."""
from plugrt.compiler.renderer.opencl import BARE_PRELUDE, SAMPLER, OpenCLRenderer

__all__ = ["BARE_PRELUDE", "SAMPLER", "OpenCLRenderer"]
