#!/usr/bin/env bash
# Install plugrt with the backends that run on a machine without a GPU, on a fresh Debian/Ubuntu machine.
#   bash scripts/setup.sh          the runtime: clang, binutils, PoCL and Mesa (apt); plugrt, plugrt-cpu, plugrt-cl,
#                                  plugrt-webgpu with both engines, plugrt-cuda, plugrt-nv and plugrt-amd with their interfaces
#                                  (and plugrt-nvidia-toolchain, which both of those require), plugrt-metal ("Metal needs macOS" here; its
#                                  renderer and Objective-C layer are tested), plugrt-qcom ("no device" without an Adreno; its KGSL layer
#                                  runs against a fake KGSL)
#                                  (pip; CUDA and NV stay "no device" without a GPU, but their compilers are tested)
#   bash scripts/setup.sh --test   the same, plus what the test suite needs
# pip installs into the active virtual or conda environment, or else into .venv in this checkout (scripts/env.sh);
# scripts/run COMMAND runs a command there.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
# clang: the CPU backend; PoCL: OpenCL on the CPU; Mesa's lavapipe (Vulkan) and llvmpipe (OpenGL): WebGPU on the CPU;
# python3-venv: Debian and Ubuntu keep `python3 -m venv` (ensurepip) out of python3; libllvm19: the CPU's opt-in
# PLUGRT_CPU_LIBLLVM compiler (its tests skip without a libLLVM 15+);
# lld-19: AMD_LLVM links its code objects with ld.lld; llvm-19: llvm-readelf/llvm-objdump that know gfx942 and gfx12 (the AMD tests);
# where a distribution has no 19 (Ubuntu 22.04), its own lld and llvm (AMD_LLVM links with any lld; the AMD tool checks then skip)
APT="clang binutils pocl-opencl-icd ocl-icd-libopencl1 mesa-vulkan-drivers libvulkan1 libegl1 libgl1-mesa-dri python3 python3-venv"
APT_LLVM="lld-19 llvm-19 libllvm19"
KIND=$(plugrt_env_kind)
if ! command -v clang >/dev/null || ! command -v ld >/dev/null || ! [ -e /etc/OpenCL/vendors/pocl.icd ] || \
   ! ls /usr/share/vulkan/icd.d/lvp_icd.*.json >/dev/null 2>&1 || ! command -v python3 >/dev/null || \
   { ! [ -x /usr/lib/llvm-19/bin/ld.lld ] && ! command -v ld.lld >/dev/null; } || \
   { [ "$KIND" = venv ] && ! python3 -c "import ensurepip" 2>/dev/null; }; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $APT >/dev/null
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $APT_LLVM >/dev/null 2>&1 || \
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq lld llvm >/dev/null
  KIND=$(plugrt_env_kind)
fi
python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))' || { echo "plugrt needs Python >= 3.10; python3 is $(python3 -V)" >&2; exit 1; }
PY=python3
if [ "$KIND" = venv ]; then
  # a .venv whose interpreter is gone (made by a Python since removed) is made again
  "$PLUGRT_VENV/bin/python3" -c "" 2>/dev/null || python3 -m venv --clear "$PLUGRT_VENV"
  PY="$PLUGRT_VENV/bin/python3"
fi
PIP="$PY -m pip install -q --disable-pip-version-check"
# one pip call: a requirement that one of these folders provides (plugrt, plugrt-nvidia-toolchain) is taken from it
$PIP ./core ./plugins/ops_cpu ./plugins/ops_cl ./plugins/ops_cuda/toolchain ./plugins/ops_cuda \
  ./plugins/ops_webgpu ./plugins/ops_webgpu/iface_wgpu ./plugins/ops_webgpu/iface_dawn \
  ./plugins/ops_nv ./plugins/ops_nv/iface_nvk ./plugins/ops_nv/iface_pci \
  ./plugins/ops_amd ./plugins/ops_amd/iface_kfd ./plugins/ops_amd/iface_pci ./plugins/ops_amd/iface_usb ./plugins/ops_metal ./plugins/ops_qcom
if [ "${1:-}" = "--test" ]; then
  $PIP -r requirements-test.txt
fi
if [ "$KIND" = venv ]; then
  echo "plugrt is installed in $PLUGRT_VENV: run commands there with scripts/run COMMAND, or . .venv/bin/activate"
else
  echo "plugrt is installed in $($PY -c 'import sys; print(sys.prefix)')"
fi
