#!/usr/bin/env bash
# Install plugrt with the backends this machine can run, on a fresh Debian/Ubuntu machine.
#   bash scripts/setup.sh            the runtime: clang, binutils, PoCL and Mesa (apt); plugrt, plugrt-cpu, plugrt-cl and
#                                    plugrt-webgpu with both engines (pip), and the backends whose device this machine can
#                                    have: plugrt-cuda and plugrt-nv with its interfaces (and plugrt-nvidia-toolchain, which
#                                    both require) where /dev/nvidia* or libcuda is, plugrt-amd with its interfaces where
#                                    /dev/kfd or an AMD GPU on PCI is, plugrt-qcom where /dev/kgsl-3d0 is, plugrt-metal on
#                                    macOS. It says what it skipped and the one command that adds each.
#   bash scripts/setup.sh --all      every backend, also those this machine cannot run (their compilers and renderers work)
#   bash scripts/setup.sh --test     every backend (the test suite runs each against its fake), plus the authoring kit (plugrt-testing) and what the tests need
#   --dry-run (with any of those)    print what would be installed and skipped, and install nothing
# pip installs into the active virtual or conda environment, or else into .venv in this checkout (scripts/env.sh);
# scripts/run COMMAND runs a command there.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
MODE=default
DRY=0
for arg in "$@"; do
  case "$arg" in
    --test) MODE=test ;;
    --all) MODE=all ;;
    --dry-run) DRY=1 ;;
    *) echo "scripts/setup.sh: unknown option $arg (options: --all, --test, --dry-run)" >&2; exit 2 ;;
  esac
done

# The backends by the folders pip installs (a requirement one of them provides, plugrt-nvidia-toolchain, comes first),
# and whether this machine can have their device: the same facts their probes look at, read without Python.
BASE="./core ./plugins/ops_cpu ./plugins/ops_cl ./plugins/ops_webgpu ./plugins/ops_webgpu/iface_wgpu ./plugins/ops_webgpu/iface_dawn"
folders() {
  case "$1" in
    CUDA) echo "./plugins/nvidia_toolchain ./plugins/ops_cuda" ;;
    NV) echo "./plugins/nvidia_toolchain ./plugins/ops_nv ./plugins/ops_nv/iface_nvk ./plugins/ops_nv/iface_pci" ;;
    AMD) echo "./plugins/ops_amd ./plugins/ops_amd/iface_kfd ./plugins/ops_amd/iface_pci ./plugins/ops_amd/iface_usb" ;;
    METAL) echo "./plugins/ops_metal" ;;
    QCOM) echo "./plugins/ops_qcom" ;;
  esac
}
nvidia_here() {
  ls /dev/nvidiactl /dev/nvidia[0-9]* >/dev/null 2>&1 && return 0
  local ldc
  for ldc in "$(command -v ldconfig || true)" /sbin/ldconfig /usr/sbin/ldconfig; do
    [ -x "$ldc" ] && "$ldc" -p 2>/dev/null | grep -qE '^[[:space:]]*libcuda\.so' && return 0
  done
  return 1
}
amd_here() {
  [ -e /dev/kfd ] && return 0
  local d
  for d in /sys/bus/pci/devices/*; do
    [ "$(cat "$d/vendor" 2>/dev/null)" = 0x1002 ] && case "$(cat "$d/class" 2>/dev/null)" in 0x03*|0x12*) return 0 ;; esac
  done
  return 1
}
# why a backend's device cannot be here, or nothing when it can
absent() {
  case "$1" in
    CUDA|NV) nvidia_here || echo "no /dev/nvidia* and no libcuda: no NVIDIA GPU or driver" ;;
    AMD) amd_here || echo "no /dev/kfd and no AMD GPU on PCI" ;;
    METAL) [ "$(uname -s)" = Darwin ] || echo "Metal needs macOS" ;;
    QCOM) [ -e /dev/kgsl-3d0 ] || echo "no /dev/kgsl-3d0: no Adreno GPU" ;;
  esac
}
FOLDERS_NOW="$BASE"
SKIPPED=()
for b in CUDA NV AMD METAL QCOM; do
  why=$(absent "$b")
  if [ "$MODE" != default ] || [ -z "$why" ]; then FOLDERS_NOW="$FOLDERS_NOW $(folders "$b")"; else SKIPPED+=("$b|$why"); fi
done
# the tests run with the authoring kit (its pytest plugin and conformance suite): its own distribution
[ "$MODE" = test ] && FOLDERS_NOW="$FOLDERS_NOW ./testkit"
FOLDERS_NOW=$(echo "$FOLDERS_NOW" | tr ' ' '\n' | awk '!seen[$0]++' | tr '\n' ' ')
skipped_report() {
  [ ${#SKIPPED[@]} -gt 0 ] || return 0
  echo "skipped, as this machine cannot run them (their packages stay uninstalled; add one with its command):"
  local s
  for s in "${SKIPPED[@]}"; do
    echo "  ${s%%|*}: ${s#*|}"
    echo "      scripts/run python3 -m pip install $(folders "${s%%|*}")"
  done
  echo "  or every backend: bash scripts/setup.sh --all"
}
if [ "$DRY" = 1 ]; then
  echo "would install: $FOLDERS_NOW"
  [ "$MODE" = test ] && echo "would install: -r requirements-test.txt"
  skipped_report
  exit 0
fi
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
# shellcheck disable=SC2086
$PIP $FOLDERS_NOW
if [ "$MODE" = test ]; then
  $PIP -r requirements-test.txt
fi
if [ "$KIND" = venv ]; then
  echo "plugrt is installed in $PLUGRT_VENV: run commands there with scripts/run COMMAND, or . .venv/bin/activate"
else
  echo "plugrt is installed in $($PY -c 'import sys; print(sys.prefix)')"
fi
skipped_report
