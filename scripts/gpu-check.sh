#!/usr/bin/env bash
# Everything plugrt checks on the lent GPU machine, in one call: install, list devices, run the tests marked `gpu`
# (and the suites that run on every available device), then the benchmarks. Logs go to $OUT (the device tool
# brings them back). Usage (from the repo root): bash scripts/gpu-check.sh [--quick] [--only=tests|bench|cuda|webgpu|nv|video|nvvideo|multi]
# (--only=cuda: the CUDA tests and benches alone; --only=webgpu, nv, nvvideo (NV's own video engine) or multi (two or more GPUs:
# indices, peer copies, CUDA_VISIBLE_DEVICES, collectives, bench/multi_gpu.py) or launch (CUDA's and NV's launches and graphs, the
# seeds' GPU snippets, NVDEC, and the launch rows against .ab-old where it travels) or rows (issue 30's GPU rows) or profile (a
# Tensor realize's host time by function, NV's GPU tests, NV's launch rows): install, then that section alone; the full run
# includes multi where `nvidia-smi -L` lists two GPUs or more). Each step has its own time limit, so one hang costs one step.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/plugrt-gpu}; mkdir -p "$OUT"
# the device tool brings back at most 8 files: every log and JSON goes into one archive at the end
pack() { (cd "$OUT" && ls ./*.txt ./*.json >/dev/null 2>&1 && tar czf gpu-check.tgz ./*.txt ./*.json && rm -f ./*.txt ./*.json); }
trap pack EXIT; trap 'exit 143' TERM INT
QUICK=""; ONLY=""
for a in "$@"; do case "$a" in --quick) QUICK="--quick";; --only=*) ONLY="${a#--only=}";; esac; done
export PYTHONUNBUFFERED=1 PLUGRT_CACHE_DIR=/tmp/plugrt-cache
# NVLink multicast stays off on shared multi-GPU hosts (it can take the host's GPUs out of service): kept set for every child
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PY=${PY:-python3}
echo "== machine"; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
$PY -c "import sys, numpy, pluggy; print(sys.version.split()[0], 'numpy', numpy.__version__, 'pluggy', pluggy.__version__)"
echo "== install (no network: --no-deps, no build isolation)"
PKGS="./core ./testkit ./plugins/ops_cpu ./plugins/nvidia_toolchain ./plugins/ops_cuda"
for p in ./plugins/ops_cl ./plugins/ops_webgpu ./plugins/ops_webgpu/iface_wgpu ./plugins/ops_webgpu/iface_dawn \
         ./plugins/ops_nv ./plugins/ops_nv/iface_nvk ./plugins/ops_nv/iface_pci \
         ./plugins/ops_amd ./plugins/ops_amd/iface_kfd ./plugins/ops_amd/iface_pci ./plugins/ops_amd/iface_usb ./plugins/ops_metal ./plugins/ops_qcom; do [ -f "$p/pyproject.toml" ] && PKGS="$PKGS $p"; done
$PY -m pip install -q --upgrade --no-deps --no-build-isolation --no-compile --target /tmp/site $PKGS 2>&1 | tail -3
[ -d .whl ] && $PY -m pip install -q --upgrade --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -3
export PYTHONPATH=/tmp/site
$PY -m plugrt devices 2>&1 | tee "$OUT/devices.txt" | head -20
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ "$ONLY" = "multi" ] || { [ -z "$ONLY" ] && [ "$NGPU" -ge 2 ]; }; then
  # several GPUs (issue 20): every index its own GPU, copies between GPUs (peer or reported as staged), CUDA_VISIBLE_DEVICES
  # renumbering, plugrt.distributed's collectives where they exist; then peer bandwidth against cupy and the link
  echo "== several GPUs ($NGPU): indices, peer copies, CUDA_VISIBLE_DEVICES, collectives"
  nvidia-smi topo -m 2>&1 | tee "$OUT/topo.txt"
  MULTI="plugins/ops_cuda/tests/test_multi_gpu.py plugins/ops_nv/tests/test_nv_multi_gpu.py"
  [ -f plugins/ops_cuda/tests/test_distributed_gpu.py ] && MULTI="$MULTI plugins/ops_cuda/tests/test_distributed_gpu.py"
  PLUGRT_NV_TIMEOUT=10 timeout ${MULTI_TESTS_S:-300} $PY -m pytest -v -p no:cacheprovider -o faulthandler_timeout=150 --tb=short -rfEsP -m gpu $MULTI \
    2>&1 | tee "$OUT/multi_tests.txt" | grep -E "^(FAILED|ERROR)|passed|failed|SKIPPED|path 0->1" | tail -40
  PLUGRT_NV_TIMEOUT=10 timeout ${MULTI_BENCH_S:-300} $PY bench/multi_gpu.py $QUICK --no-install --json "$OUT/bench_multi.json" 2>&1 | tee "$OUT/bench_multi.txt"
  [ "$ONLY" = "multi" ] && exit 0
fi
# video (issue 12): PyAV (~35 MB) and PyNvVideoCodec (~27 MB) wheels travel in .video-whl, in a device call of their own
[ -d .video-whl ] && $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .video-whl/*.whl 2>&1 | tail -3
if [ "$ONLY" = "launch" ]; then
  # the core-owned launch (issue 28): CUDA's and NV's programs and graphs on the GPU, the seeds' GPU snippets, NVDEC (its
  # decoder opens on the registry's worker since issue 32), then the launch rows of the tree before (.ab-old) and this one
  echo "== launch: CUDA tests, seeds' snippets, NVDEC"
  [ "${LAUNCH_TESTS:-1}" != 0 ] && timeout ${LAUNCH_CUDA_S:-240} $PY -m pytest -q -p no:cacheprovider -o faulthandler_timeout=200 --tb=short -rfE plugins/ops_cuda/tests \
    tests/test_launchargs.py tests/test_launch_protocol.py tests/test_seed_snippets.py tests/test_conformance.py tests/test_adversarial_threads.py \
    tests/test_vector_ir.py tests/test_adversarial_vector.py tests/test_tensor.py \
    -k "not multi and not Multi and not thousand" \
    2>&1 | tee "$OUT/launch_cuda_tests.txt" | grep -E "^(FAILED|ERROR)|passed|failed" | tail -30
  # NV's PCI interface: its probe (reads sysfs files and links only) lists the GPU and says why it is not opened
  echo "== NV PCI probe: $($PY -c 'from plugrt_nv_pci import probe_tree; from plugrt_nv_pci.sysfs import PCI_DEVICES; print(probe_tree(PCI_DEVICES))' 2>&1)"
  echo "== launch: NV tests"
  [ "${LAUNCH_TESTS:-1}" != 0 ] && env PLUGRT_PLUGINS=nv,nv-nvk,nv-pci,cpu,python PLUGRT_NV_TIMEOUT=10 timeout ${LAUNCH_NV_S:-150} $PY -m pytest -q -p no:cacheprovider \
    -o faulthandler_timeout=120 --tb=short -rfE plugins/ops_nv/tests tests/test_dsl.py tests/test_tensor.py -k "not multi" \
    2>&1 | tee "$OUT/launch_nv_tests.txt" | grep -E "^(FAILED|ERROR)|NVError|passed|failed" | tail -30
  AB_OLD=${AB_OLD:-.ab-old}  # the tree before (git archive of a commit), e.g. AB_OLD=.ab-step3
  if [ -d "$AB_OLD" ]; then  # the launch rows of the tree before, alternating with this one (installed beside /tmp/site)
    AB="./core ./plugins/ops_cpu ./plugins/ops_cuda ./plugins/ops_nv ./plugins/ops_nv/iface_nvk"
    for t in ./plugins/nvidia_toolchain ./plugins/ops_cuda/toolchain; do [ -d "$AB_OLD/$t" ] && AB="$AB $t"; done
    (cd "$AB_OLD" && $PY -m pip install -q --no-deps --no-build-isolation --no-compile --target /tmp/ab-old $AB 2>&1 | tail -2)
    for r in $(seq 1 "${AB_ROUNDS:-3}"); do for side in /tmp/site /tmp/ab-old; do
      b=bench; [ "$side" = /tmp/ab-old ] && [ -f "$AB_OLD/bench/cuda_launch.py" ] && b="$AB_OLD/bench"  # each tree's own script
      echo "-- $side NV: $(PYTHONPATH=$side timeout 60 $PY $b/nv_launch_parts.py 2>&1 | head -1)"
      echo "-- $side CUDA: $(PYTHONPATH=$side timeout 90 $PY $b/cuda_launch.py 2>&1 | grep -E 'plugrt prg' | tr -s ' ')"
    done; done 2>&1 | tee "$OUT/launch_ab.txt"
  fi
  exit 0
fi
if [ "$ONLY" = "profile" ]; then
  # where a Tensor realize's host time goes (cProfile on CUDA and NV), NV's own tests on the GPU, and NV's launch rows
  echo "== profile: bench/tensor_realize_parts.py (CUDA, NV), NV's GPU tests, bench/nv.py --quick"
  for d in CUDA NV; do PLUGRT_NV_TIMEOUT=10 timeout ${PROFILE_S:-120} $PY bench/tensor_realize_parts.py $d 2>&1 | tee "$OUT/realize_parts_$d.txt" | head -44; done
  env PLUGRT_PLUGINS=nv,nv-nvk,nv-pci,cpu,python PLUGRT_NV_TIMEOUT=10 timeout ${PROFILE_NV_S:-150} $PY -m pytest -q -p no:cacheprovider \
    -o faulthandler_timeout=120 --tb=short -rfE plugins/ops_nv/tests/test_nv_gpu.py plugins/ops_nv/tests/test_nv_fake.py tests/test_dsl.py -k "NV or nv or fake" \
    2>&1 | tee "$OUT/profile_nv_tests.txt" | grep -E "^(FAILED|ERROR)|NVError|passed|failed" | tail -20
  PLUGRT_NV_TIMEOUT=10 timeout ${ROWS_NV_S:-150} $PY bench/nv.py --quick --json "$OUT/bench_nv.json" 2>&1 | tee "$OUT/bench_nv.txt" | tail -12
  exit 0
fi
if [ "$ONLY" = "rows" ]; then
  # issue 30's rows: elementwise and sum against a device copy (CUDA), NV's launch and copies (bench/nv.py, the copy
  # kernel's variants against CUDA's cuMemcpyDtoD)
  echo "== rows: bench/gpu_cuda.py, bench/nv.py, bench/nv_copy_variants.py"
  # (--quick: 2^24-element rows, where a Tensor row's host time, graph and launch, outweighs its kernel: the issue's rows
  # are the full bench's 2^28)
  timeout ${ROWS_CUDA_S:-360} $PY bench/gpu_cuda.py $QUICK --json "$OUT/bench_cuda.json" 2>&1 | tee "$OUT/bench_cuda.txt" | tail -50
  PLUGRT_NV_TIMEOUT=10 timeout ${ROWS_NV_S:-150} $PY bench/nv.py --quick --json "$OUT/bench_nv.json" 2>&1 | tee "$OUT/bench_nv.txt" | tail -12
  [ "${ROWS_COPY:-1}" != 0 ] && PLUGRT_NV_TIMEOUT=10 timeout ${ROWS_COPY_S:-150} $PY bench/nv_copy_variants.py --sizes 16M,256M,1G --reps 5 2>&1 \
    | tee "$OUT/nv_copy.txt" | tail -30
  exit 0
fi
if [ -z "$ONLY" ] || [ "$ONLY" = "video" -a "${NV_VIDEO:-1}" != 0 ] || [ "$ONLY" = "nvvideo" ]; then
  # NV's own video engine (plugrt_nv.nvvideo, no libnvcuvid): the engine-opening test first, then every frame vs PyAV
  echo "== video on NV's own decode engine (decoder NV_NVDEC, device NV) against PyAV"
  head -1 /proc/driver/nvidia/version
  PLUGRT_NV_TIMEOUT=10 timeout ${NV_VIDEO_S:-300} $PY -m pytest -v -p no:cacheprovider -o faulthandler_timeout=150 --tb=short -rfEs \
    plugins/ops_nv/tests/test_nv_video_gpu.py plugins/ops_nv/tests/test_nv_video_fake.py plugins/ops_nv/tests/test_nv_video_setup.py \
    2>&1 | tee "$OUT/nv_video_tests.txt" | grep -E "^(FAILED|ERROR)|NVError|passed|failed|SKIPPED" | tail -30
  [ "$ONLY" = "nvvideo" ] && exit 0
fi
if [ -z "$ONLY" ] || [ "$ONLY" = "video" ]; then
  echo "== video: NVDEC (plugrt_cuda.cuvid) against PyAV, leaks, the software path, then bench/video.py"
  [ "${VIDEO_TESTS:-1}" != 0 ] && timeout ${VIDEO_TESTS_S:-300} $PY -m pytest -v -p no:cacheprovider -o faulthandler_timeout=200 --tb=short -rfEs plugins/ops_cuda/tests/test_cuvid.py \
    tests/test_video.py tests/test_video_hevc.py tests/test_video_convert.py -k "not thousand" 2>&1 | tee "$OUT/video_tests.txt" | grep -E "^(FAILED|ERROR)|passed|failed|SKIPPED" | tail -30
  # the 1000 open/close cycles alone, in a step of its own: about 0.28 s a cycle on Hopper (the driver's decoder create and destroy)
  [ "${VIDEO_CYCLES:-${VIDEO_TESTS:-1}}" != 0 ] && timeout ${VIDEO_CYCLES_S:-360} $PY -m pytest -q -s -p no:cacheprovider -o faulthandler_timeout=350 --tb=short \
    plugins/ops_cuda/tests/test_cuvid.py -k thousand 2>&1 | tee "$OUT/video_cycles.txt" | grep -E "^cycle [0-9]*00:|^(FAILED|ERROR)|passed|failed" | tail -12
  [ "$ONLY" = "video" ] && [ -n "${VIDEO_SPREAD:-}" ] && timeout ${VIDEO_SPREAD_S:-200} $PY bench/video.py $QUICK --no-install --spread 2>&1 | tee "$OUT/bench_video_spread.txt"
  [ "$ONLY" = "video" ] && [ -n "${VIDEO_SWEEP:-}" ] && timeout ${VIDEO_SWEEP_S:-300} $PY bench/video.py $QUICK --no-install --sweep 2>&1 | tee "$OUT/bench_video_sweep.txt"
  [ "$ONLY" = "video" ] && timeout ${VIDEO_BENCH_S:-420} $PY bench/video.py $QUICK --no-install --json "$OUT/bench_video.json" 2>&1 | tee "$OUT/bench_video.txt"
  [ "$ONLY" = "video" ] && exit 0
fi
if [ "$ONLY" != "bench" ] && [ "$ONLY" != "webgpu" ] && [ "$ONLY" != "nv" ] && [ "$ONLY" != "multi" ]; then
  echo "== tests"
  timeout ${TESTS_S:-480} $PY -m pytest -q -p no:cacheprovider --tb=short -rfE plugins/ops_cuda tests/test_dsl.py tests/test_tensor.py tests/test_interop.py \
    tests/test_conformance.py tests/test_adversarial_threads.py tests/test_adversarial_limits.py tests/test_plugin_context.py tests/test_hwqueue.py tests/test_launchargs.py \
    plugins/nvidia_toolchain 2>&1 | tee "$OUT/tests.txt" | grep -E "^(FAILED|ERROR)|passed|failed" | tail -40
fi
if [ "$ONLY" != "tests" ] && [ "$ONLY" != "webgpu" ] && [ "$ONLY" != "nv" ] && [ "$ONLY" != "multi" ]; then
  echo "== bench"
  timeout 360 $PY bench/gpu_cuda.py $QUICK --json "$OUT/bench_cuda.json" 2>&1 | tee "$OUT/bench_cuda.txt"
  timeout 90 $PY bench/cuda_launch.py 2>&1 | tee "$OUT/cuda_launch.txt"
fi
if [ "$ONLY" != "webgpu" ] && [ "$ONLY" != "nv" ] && [ "$ONLY" != "cuda" ] && [ "$ONLY" != "multi" ]; then
echo "== OpenCL on this machine"
ls -l /etc/OpenCL/vendors 2>/dev/null && for f in /etc/OpenCL/vendors/*.icd; do echo "  $f -> $(cat "$f")"; done || echo "  no /etc/OpenCL/vendors"
ldconfig -p | grep -i opencl || echo "  no OpenCL library in the linker cache"
if grep -qsil nvidia /etc/OpenCL/vendors/*.icd || [ "$(ldconfig -p | grep -c libnvidia-opencl)" -gt 0 ]; then
  if ! grep -qsil nvidia /etc/OpenCL/vendors/*.icd; then  # containers often mount the library without its manifest
    d=$(mktemp -d); echo libnvidia-opencl.so.1 > "$d/nvidia.icd"; export OCL_ICD_VENDORS="$d"; fi
  CL_PLATFORM=nvidia $PY -m plugrt devices --json > "$OUT/cl_devices.json" 2>&1
  CL_PLATFORM=nvidia timeout 150 $PY -m pytest -q -p no:cacheprovider --tb=short plugins/ops_cl/tests tests/test_images.py 2>&1 | tee "$OUT/cl_tests.txt" | tail -8
  [ "$ONLY" != "tests" ] && CL_PLATFORM=nvidia timeout 150 $PY bench/cl.py --quick --json "$OUT/bench_cl.json" 2>&1 | tee "$OUT/bench_cl.txt"
else echo "no NVIDIA OpenCL driver here: the CL suite is not run on the GPU"; fi
fi
if [ "$ONLY" != "nv" ] && [ "$ONLY" != "cuda" ] && [ "$ONLY" != "multi" ]; then
echo "== WebGPU through the NVIDIA Vulkan driver"
# The machine has the driver's Vulkan ICD but no loader: the loader debs travel in .gl (see docs/hardware.md).
if [ -d .gl ] && command -v nvidia-smi >/dev/null; then for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig; fi
icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
[ -f "$icd" ] && export VK_DRIVER_FILES="$icd"
if ldconfig -p | grep -q libvulkan.so.1; then
  for iface in WGPU DAWN; do
    echo "-- WEBGPU_IFACE=$iface"
    WEBGPU_IFACE=$iface timeout 60 $PY -m plugrt devices 2>&1 | grep -i webgpu
    [ "$ONLY" != "bench" ] && WEBGPU_IFACE=$iface timeout 200 $PY -m pytest -q -p no:cacheprovider -o faulthandler_timeout=40 --tb=short -rfE plugins/ops_webgpu/tests \
      tests/test_dsl.py tests/test_tensor.py -k "WEBGPU or webgpu" 2>&1 | tee "$OUT/webgpu_tests_$iface.txt" | grep -E "^(FAILED|ERROR)|passed|failed" | tail -20
  done
  [ "$ONLY" != "tests" ] && timeout 240 $PY bench/webgpu.py --quick --json "$OUT/bench_webgpu.json" 2>&1 | tee "$OUT/bench_webgpu.txt"
else echo "no Vulkan loader here: WebGPU is not run on the GPU"; fi
fi
if [ -z "$ONLY" ] || [ "$ONLY" = "nv" ]; then
  # NV: the GPU through the kernel driver with user-space submission (no libcuda). Layer by layer first, so a failure
  # says where; then its tests, the conformance suite, the DSL and Tensor tests on NV alone. Every wait is bounded
  # (PLUGRT_NV_TIMEOUT), and every step has its own time limit.
  echo "== NV (plugrt-nv through the kernel driver)"
  head -1 /proc/driver/nvidia/version; ls /dev/nvidia*
  PLUGRT_NV_TIMEOUT=10 timeout 100 $PY -m plugrt_nv --out "$OUT" 2>&1 | tee "$OUT/nv_selftest.txt"
  nv_ok=${PIPESTATUS[0]}
  [ -f "$OUT/tiny.cubin" ] && command -v cuobjdump >/dev/null && cuobjdump -sass "$OUT/tiny.cubin" > "$OUT/nv_tiny_sass.txt" 2>&1
  if [ "$nv_ok" -eq 0 ]; then
    NVENV="PLUGRT_PLUGINS=nv,nv-nvk,nv-pci,cpu,python PLUGRT_NV_TIMEOUT=10"
    env $NVENV timeout ${NV_TEST_S:-150} $PY -m pytest -v -p no:cacheprovider -o faulthandler_timeout=120 --tb=short -rfEsP \
      plugins/ops_nv/tests tests/test_dsl.py tests/test_tensor.py tests/test_adversarial_threads.py tests/test_adversarial_limits.py > "$OUT/nv_tests.txt" 2>&1
    grep -E "^(FAILED|ERROR)|NVError|passed|failed" "$OUT/nv_tests.txt" | tail -30
    echo "NV-parametrized tests passed: $(grep -E '\[.*NV.*\] PASSED|::TestNV::.* PASSED' "$OUT/nv_tests.txt" | wc -l), failed: $(grep -E '\[.*NV.*\] FAILED|::TestNV::.* FAILED' "$OUT/nv_tests.txt" | wc -l)"
    echo "-- selection: NV=1, NV_PTX=1, DEV=NVK+NV, DEV=NV:PTX (the PCI interface is never named on this machine)"
    for e in "NV=1" "NV=1 NV_PTX=1" "DEV=NVK+NV" "DEV=NV:PTX"; do
      env $e timeout 60 $PY -c "from plugrt import Device, Tensor; d = Device[Device.DEFAULT]; t = (Tensor([1.0, 2.0], device=d.info.canonical) * 3).numpy(); print('  $e ->', d.info.canonical, d.info.interface, d.info.compiler, t)" 2>&1 | tail -1
    done
    for asm in ptxas nvjitlink; do
      echo "-- the DSL and Tensor tests with NV_PTX=1, and the conformance suite's PTX half, PTX assembled by $asm"
      env $NVENV NV_PTX=1 PLUGRT_NV_ASSEMBLER=$asm PLUGRT_CACHE_DIR=/tmp/plugrt-cache-$asm timeout ${NV_TEST_S:-150} $PY -m pytest -v \
        -p no:cacheprovider -o faulthandler_timeout=120 --tb=short -rfE tests/test_dsl.py tests/test_tensor.py plugins/ops_nv/tests/test_nv_gpu.py \
        plugins/ops_nv/tests/test_nv_encoding.py -k "(NV or PTX or nvjitlink) and not CUDA and not CPU and not PYTHON" > "$OUT/nv_tests_$asm.txt" 2>&1
      grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/nv_tests_$asm.txt" | tail -20
    done
    [ "$ONLY" = "nv" ] && [ -f bench/nv.py ] && timeout ${NV_BENCH_S:-240} $PY bench/nv.py $QUICK --json "$OUT/bench_nv.json" 2>&1 | tee "$OUT/bench_nv.txt"
  else echo "NV self-check failed (above): tests not run"; fi
fi
