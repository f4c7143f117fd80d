/* The C floor of a CUDA launch: cuLaunchKernel of a tiny kernel in a loop, then one synchronize (bench/cuda_launch.py
   builds and runs it). argv: cubin path, kernel name, launches, stream kind (0: legacy default, 1: non-blocking). */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#define CK(x) do { CUresult r_ = (x); if (r_) { fprintf(stderr, "%s failed: %d\n", #x, (int)r_); return 1; } } while (0)
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main(int argc, char **argv) {
  CUdevice dev; CUcontext ctx; CUmodule mod; CUfunction fn; CUdeviceptr a, b; CUstream stream = 0;
  int n = atoi(argv[3]);
  CK(cuInit(0)); CK(cuDeviceGet(&dev, 0)); CK(cuDevicePrimaryCtxRetain(&ctx, dev)); CK(cuCtxSetCurrent(ctx));
  CK(cuModuleLoad(&mod, argv[1])); CK(cuModuleGetFunction(&fn, mod, argv[2]));
  CK(cuMemAlloc(&a, 4)); CK(cuMemAlloc(&b, 4));
  if (atoi(argv[4])) CK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  void *params[] = {&a, &b};
  for (int r = 0; r < 3; r++) {
    double t = now();
    for (int i = 0; i < n; i++) CK(cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, stream, params, NULL));
    CK(cuCtxSynchronize());
    printf("%.3f\n", (now() - t) / n * 1e6);
  }
  return 0;
}
