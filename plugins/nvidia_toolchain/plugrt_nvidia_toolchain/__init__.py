"""plugrt-nvidia-toolchain: what turns plugrt's kernel IR into code for NVIDIA GPUs, shared by plugrt-cuda (through
CUDA's driver) and plugrt-nv (from user space), so a kernel is the same text and rounds the same way on both.

Modules (import the one you need; this package imports nothing at import):

- `arch`: target names (sm_90), the PTX ISA version a target needs, the architecture a device builds for
- `cuda_c`: kernel IR -> CUDA C (`CUDARenderer`)
- `ptx`: kernel IR -> PTX (`PTXRenderer`); `ptx_math`: its exp2/log2/sin routines
- `nvrtc`: CUDA C -> cubin through NVRTC (libnvrtc), with the options that keep the IR's rounding
- `toolkit`: the CUDA toolkit's programs on disk; `ptxas`: PTX -> cubin with ptxas; `jitlink`: the same with nvJitLink

Every lookup that reads an environment variable (CUDA_HOME, CUDA_PATH, PLUGRT_NVRTC, PLUGRT_PTXAS,
PLUGRT_NVJITLINK) takes the environment as a parameter: pass the device's `device.context.env`.
"""
__version__ = "0.1.0"
