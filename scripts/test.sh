#!/usr/bin/env bash
# The whole test suite, exactly as CI runs it (.ci/run calls this script):
#   1. setup (Debian packages, npm packages) — idempotent
#   2. Release build (-O2, warnings as errors) + every test but the fuzzers
#   3. ASan + UBSan build (gcc) + the unit tests, and the integration tests that feed the gateway
#      untrusted input (HTTP, SDKs, the worker link; label `sanitized`) against the ASan binary
#   4. clang build of the whole tree with warnings as errors, which is also the libFuzzer build:
#      every fuzz target for a bounded time
#   5. formatting check (.clang-format)
# Options: --quick skips the sanitizer and fuzz builds (for local iteration).
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
[ "${1:-}" = "--quick" ] && quick=1
jobs=$(nproc 2>/dev/null || echo 2)

bash scripts/setup.sh
fail=0
n_pass=0 n_fail=0 n_skip=0
step() { printf '\n==== %s ====\n' "$*"; }
# Runs ctest with the given arguments, shows its output, and adds its counts to the totals.
run_ctest() {
    local log rc=0 total failed skipped
    log=$(mktemp)
    ctest --output-on-failure -j"$jobs" "$@" 2>&1 | tee "$log" || rc=1
    [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
    total=$(sed -n 's/.*tests failed out of \([0-9]*\).*/\1/p' "$log" | tail -n 1)
    failed=$(sed -n 's/.*, \([0-9]*\) tests failed out of.*/\1/p' "$log" | tail -n 1)
    skipped=$(grep -c '\*\*\*Skipped' "$log" || true)
    rm -f "$log"
    total=${total:-0} failed=${failed:-0}
    n_fail=$((n_fail + failed))
    n_skip=$((n_skip + skipped))
    n_pass=$((n_pass + total - failed - skipped))
    return $rc
}

step "Release build"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DKVGW_WERROR=ON >/dev/null
cmake --build build -j"$jobs"
if [ -x scripts/models.sh ]; then bash scripts/models.sh; fi

step "Tests (Release)"
run_ctest --test-dir build -LE '^(fuzz|bench)$' || fail=1

if [ $quick -eq 0 ]; then
    step "Sanitizer build (ASan + UBSan)"
    cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DKVGW_SANITIZE=ON -DKVGW_WERROR=ON >/dev/null
    cmake --build build-asan -j"$jobs"
    step "Unit tests and untrusted-input integration tests (ASan + UBSan)"
    # `sanitized`: gateway_sdk, gateway_cluster, gateway_http_edge, ... run on the ASan kvgw;
    # any sanitizer report in any kvgw process's stderr fails sanitizer_check (see
    # tests/integration/CMakeLists.txt).
    export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1
    run_ctest --test-dir build-asan -L '^(unit|slow|sanitized)$' -LE gpu || fail=1
    unset ASAN_OPTIONS UBSAN_OPTIONS

    # One clang build serves twice: the whole tree (gateway, engine, billing, bench, every test)
    # compiled by clang with warnings as errors, and the libFuzzer targets. scripts/setup.sh
    # installs clang, so a missing one is an error, not a skip.
    step "clang build, warnings as errors + fuzz targets (libFuzzer, bounded time)"
    CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVGW_SANITIZE=ON \
        -DKVGW_FUZZ=ON -DKVGW_WERROR=ON >/dev/null
    cmake --build build-fuzz -j"$jobs"
    run_ctest --test-dir build-fuzz -L '^fuzz$' || fail=1
fi

step "Format check"
if bash scripts/format.sh --check; then n_pass=$((n_pass + 1)); else n_fail=$((n_fail + 1)) fail=1; fi

# One closing line over every stage (Release, sanitizers, fuzzers, format).
echo
echo "total: $n_pass passed, $n_fail failed, $n_skip skipped"

if [ $fail -ne 0 ]; then
    echo "kvgw tests: FAILED"
    exit 1
fi
echo "kvgw tests: all passed"
