"""plugrt's conformance suite on the CL device (skipped, saying why, where pyopencl or an OpenCL platform is missing;
a CL plugin that is broken fails)."""
from plugrt_testing.conformance import ConformanceSuite


class TestCL(ConformanceSuite):
  device = "CL"
  hardware_optional = True  # an OpenCL platform (and pyopencl) is the machine's, not the plugin's
  # Every dtype can be held (a buffer is bytes); float64 kernels on a device without cl_khr_fp64 raise RenderError
  # when rendered, which the suite reports as a skip naming the device: nothing to list here.
  unsupported_dtypes = ()
