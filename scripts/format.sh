#!/usr/bin/env bash
# Applies (default) or checks (--check) the house .clang-format on every C/CUDA source we own.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-fix}
mapfile -t files < <(git ls-files -co --exclude-standard -- '*.c' '*.h' '*.cu' '*.cuh' | grep -v '^tests/fuzz/corpus/' || true)
[ ${#files[@]} -gt 0 ] || exit 0
if [ "$mode" = "--check" ]; then
    bad=0
    for f in "${files[@]}"; do
        if ! clang-format --style=file "$f" | cmp -s - "$f"; then
            echo "format: $f differs from .clang-format (run scripts/format.sh)"
            bad=1
        fi
    done
    exit $bad
fi
clang-format --style=file -i "${files[@]}"
