#!/usr/bin/env bash
# The GPU half of issue 14 in one call, on a machine with an NVIDIA GPU:
#
#   1. nvidia-smi and the CUDA toolkit's version (a driver older than the toolkit is the usual
#      reason a GPU is "not found": CUDA 13 needs driver >= 580);
#   2. a Release build with CUDA for this GPU's architecture (KVGW_CUDA_ARCHS, from
#      nvidia-smi's compute capability; 80-real;90-real when it cannot tell);
#   3. the host-side kernel tests (test_krn_plan, test_krn_ref) and every gpu-labelled test with
#      KVGW_REQUIRE_GPU=1, so a missing or unusable device fails instead of skipping;
#   4. `kvgw bench kernels` (the decode-attention grid against the card's peak bandwidth, the
#      sampler, GEMMs, prefill attention, and the engine end to end on models/kvgw-bench.gguf
#      when it exists or scripts/models.sh can write it; --no-e2e otherwise).
#
#   scripts/gpu-check.sh [--no-build] [--bench-only] [--tests-only]
#
# Output: every step's log and a summary.txt (one line per step with its exit status) in $OUT
# when set (the device tool's folder), else build-gpu/gpu-check. Environment: KVGW_GPU_BUILD
# (the build directory, default build-gpu), KVGW_CUDA_ARCHS (overrides the detection), JOBS.
# Exit status: 0 when every step passed, 1 otherwise.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${KVGW_GPU_BUILD:-$root/build-gpu}
out=${OUT:-$build/gpu-check}
jobs=${JOBS:-$(nproc 2>/dev/null || echo 4)}
do_build=1
do_tests=1
do_bench=1
for arg in "$@"; do
    case "$arg" in
    --no-build) do_build=0 ;;
    --bench-only) do_tests=0 ;;
    --tests-only) do_bench=0 ;;
    -h | --help)
        sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'
        exit 0
        ;;
    *)
        echo "gpu-check: unknown option $arg" >&2
        exit 2
        ;;
    esac
done
mkdir -p "$out"
cd "$root" || exit 1 # the benchmarks find models/ from here
summary=$out/summary.txt
: >"$summary"
failed=0

# step NAME COMMAND...: runs the command with its output in $out/NAME.log, records the status.
step() {
    local name=$1
    shift
    local t0=$SECONDS
    echo "== $name: $*" | tee -a "$out/$name.log"
    "$@" >>"$out/$name.log" 2>&1
    local rc=$?
    printf '%-14s rc=%d  %ds  %s\n' "$name" "$rc" $((SECONDS - t0)) "$*" | tee -a "$summary"
    tail -n 25 "$out/$name.log"
    [ "$rc" -eq 0 ] || failed=1
    return "$rc"
}

export PATH=/usr/local/cuda/bin:$PATH
step gpu-info bash -c 'nvidia-smi && nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv && nvcc --version'

if [ -z "${KVGW_CUDA_ARCHS:-}" ]; then
    cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' .')
    if [[ "$cap" =~ ^[0-9]+$ ]]; then
        KVGW_CUDA_ARCHS="${cap}-real"
    else
        KVGW_CUDA_ARCHS="80-real;90-real"
    fi
fi
echo "gpu-check: architectures $KVGW_CUDA_ARCHS, build $build, output $out" | tee -a "$summary"

if [ $do_build -eq 1 ]; then
    step configure cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DKVGW_CUDA=ON \
        -DCMAKE_CUDA_COMPILER="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)" \
        "-DKVGW_CUDA_ARCHS=$KVGW_CUDA_ARCHS" &&
        step build cmake --build "$build" -j "$jobs" --target kvgw test_krn_gpu test_krn_plan \
            test_krn_ref
    if [ $failed -ne 0 ]; then
        echo "gpu-check: the build failed; see $out/configure.log and $out/build.log" >&2
        exit 1
    fi
fi

if [ $do_tests -eq 1 ]; then
    step host-tests ctest --test-dir "$build" -R '^test_krn_(plan|ref)$' --output-on-failure
    # Every gpu test, required to run: a skip is a failure here.
    KVGW_REQUIRE_GPU=1 step gpu-tests ctest --test-dir "$build" -L gpu --output-on-failure \
        --timeout 900
fi

if [ $do_bench -eq 1 ]; then
    kvgw=$build/bin/kvgw
    if [ ! -x "$kvgw" ]; then
        echo "bench          rc=1  $kvgw not built" | tee -a "$summary"
        exit 1
    fi
    e2e=()
    if [ ! -f "$root/models/kvgw-bench.gguf" ]; then
        KVGW=$kvgw step bench-model "$root/scripts/models.sh" bench || e2e=(--no-e2e)
    fi
    step bench "$kvgw" bench kernels "${e2e[@]}"
    grep '^{' "$out/bench.log" | tail -n 1 >"$out/bench_kernels.json" || true
    # The benchmark exits 0 with no figures where it finds no device: here that is a failure.
    if ! grep -q '"figures": {"' "$out/bench_kernels.json"; then
        echo "bench          no figures measured (see bench.log)" | tee -a "$summary"
        failed=1
    fi
fi

echo "gpu-check: summary ($summary)"
cat "$summary"
exit $failed
