#!/usr/bin/env bash
# The whole test suite, exactly as CI runs it (.ci/run calls this script):
#   1. setup (Debian packages, npm packages) — idempotent
#   2. Release build (-O2, warnings as errors) + every test but the fuzzers
#   3. ASan + UBSan build + the unit tests
#   4. with clang: libFuzzer build + every fuzz target for a bounded time
#   5. formatting check (.clang-format)
# Options: --quick skips the sanitizer and fuzz builds (for local iteration).
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
[ "${1:-}" = "--quick" ] && quick=1
jobs=$(nproc 2>/dev/null || echo 2)

bash scripts/setup.sh
fail=0
step() { printf '\n==== %s ====\n' "$*"; }

step "Release build"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DKVGW_WERROR=ON >/dev/null
cmake --build build -j"$jobs"
if [ -x scripts/models.sh ]; then bash scripts/models.sh; fi

step "Tests (Release)"
ctest --test-dir build --output-on-failure -j"$jobs" -LE '^(fuzz|bench)$' || fail=1

if [ $quick -eq 0 ]; then
    step "Sanitizer build (ASan + UBSan)"
    cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DKVGW_SANITIZE=ON -DKVGW_WERROR=ON >/dev/null
    cmake --build build-asan -j"$jobs"
    step "Unit tests (ASan + UBSan)"
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
        ctest --test-dir build-asan --output-on-failure -j"$jobs" -L unit -LE gpu || fail=1

    if command -v clang >/dev/null 2>&1; then
        step "Fuzz targets (libFuzzer, bounded time)"
        CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVGW_SANITIZE=ON \
            -DKVGW_FUZZ=ON >/dev/null
        cmake --build build-fuzz -j"$jobs"
        ctest --test-dir build-fuzz --output-on-failure -j"$jobs" -L '^fuzz$' || fail=1
    else
        echo "clang not found: fuzz targets only replay their corpus (in the unit tests)"
    fi
fi

step "Format check"
bash scripts/format.sh --check || fail=1

if [ $fail -ne 0 ]; then
    echo "kvgw tests: FAILED"
    exit 1
fi
echo "kvgw tests: all passed"
