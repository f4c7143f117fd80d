#!/usr/bin/env bash
# The GPU launch rows of two trees side by side in one run, rounds alternating: a refactor must not slow a launch,
# and two runs on a lent machine differ more than the change does. Usage, from the repo root on the GPU machine:
#   git archive <old commit> | (mkdir -p .ab-old && tar x -C .ab-old)    # here, then carry .ab-old to the machine
#   bash bench/ab_gpu_launch.sh .ab-old [rounds]
# Runs bench/cuda_launch.py (plugrt's prg(a, b) beside cupy and the C floor) and bench/nv.py --quick (NV beside CUDA
# and cupy) from each tree, installed into its own folder, `rounds` times (default 3), old then new then new then old.
set -uo pipefail
OLD=${1:?usage: bash bench/ab_gpu_launch.sh OLD_TREE [ROUNDS]}; ROUNDS=${2:-3}
PY=${PY:-python3}
install() {  # tree -> /tmp/ab-<name> (plugins/ops_cuda/toolchain: where an older tree keeps the NVIDIA toolchain)
  local pkgs=""
  for p in core plugins/ops_cpu plugins/nvidia_toolchain plugins/ops_cuda/toolchain plugins/ops_cuda plugins/ops_nv plugins/ops_nv/iface_nvk; do
    [ -f "$1/$p/pyproject.toml" ] && pkgs="$pkgs $1/$p"; done
  $PY -m pip install -q --no-deps --no-build-isolation --no-compile --target "/tmp/ab-$2" $pkgs 2>&1 | tail -2
}
install "$OLD" old; install . new
side() {  # name tree
  PYTHONPATH=/tmp/ab-$1 $PY -c "from plugrt_cuda import trampoline; print('-- $1: launch trampoline', 'in use' if trampoline.make() else 'NOT available')"
  echo "-- $1: cuda_launch"; PYTHONPATH=/tmp/ab-$1 PLUGRT_CACHE_DIR=/tmp/ab-cache-$1 timeout 120 $PY "$2/bench/cuda_launch.py" 2>&1 | grep -E "plugrt|cupy|floor"
  echo "-- $1: nv"; PYTHONPATH=/tmp/ab-$1 PLUGRT_CACHE_DIR=/tmp/ab-cache-$1 timeout 150 $PY "$2/bench/nv.py" --quick 2>&1 | grep -E "^launch|best"
}
for r in $(seq "$ROUNDS"); do
  echo "== round $r"
  if [ $((r % 2)) -eq 1 ]; then side old "$OLD"; side new .; else side new .; side old "$OLD"; fi
done
