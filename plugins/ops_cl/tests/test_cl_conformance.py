"""plugrt's conformance suite on the CL device (skipped where pyopencl or an OpenCL platform is missing)."""
from plugrt.testing.conformance import ConformanceSuite


class TestCL(ConformanceSuite):
  device = "CL"
  # Every dtype can be held (a buffer is bytes); float64 kernels on a device without cl_khr_fp64 raise RenderError
  # when rendered, which the suite reports as a skip naming the device: nothing to list here.
  unsupported_dtypes = ()
