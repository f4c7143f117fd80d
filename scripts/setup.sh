#!/usr/bin/env bash
# Install plugrt with the backends that run on a machine without a GPU, on a fresh Debian/Ubuntu machine.
#   bash scripts/setup.sh          the runtime: clang, binutils, PoCL and Mesa (apt); plugrt, plugrt-cpu, plugrt-cl,
#                                  plugrt-webgpu with both engines, plugrt-cuda and plugrt-nv with its interfaces
#                                  (pip; CUDA and NV stay "no device" without a GPU, but their compilers are tested)
#   bash scripts/setup.sh --test   the same, plus what the test suite needs
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
# clang: the CPU backend; PoCL: OpenCL on the CPU; Mesa's lavapipe (Vulkan) and llvmpipe (OpenGL): WebGPU on the CPU
APT="clang binutils pocl-opencl-icd ocl-icd-libopencl1 mesa-vulkan-drivers libvulkan1 libegl1 libgl1-mesa-dri"
if ! command -v clang >/dev/null || ! command -v ld >/dev/null || ! [ -e /etc/OpenCL/vendors/pocl.icd ] || \
   ! ls /usr/share/vulkan/icd.d/lvp_icd.*.json >/dev/null 2>&1; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $APT >/dev/null
fi
PIP="python3 -m pip install -q --disable-pip-version-check"
$PIP ./core ./plugins/ops_cpu ./plugins/ops_cl ./plugins/ops_cuda \
  ./plugins/ops_webgpu ./plugins/ops_webgpu/iface_wgpu ./plugins/ops_webgpu/iface_dawn \
  ./plugins/ops_nv ./plugins/ops_nv/iface_nvk ./plugins/ops_nv/iface_pci
if [ "${1:-}" = "--test" ]; then
  $PIP -r requirements-test.txt
fi
