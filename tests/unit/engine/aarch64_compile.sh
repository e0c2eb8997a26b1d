#!/usr/bin/env bash
# The CPU backend's aarch64 side (the NEON and portable kernels behind __aarch64__) compiled for
# aarch64 with the cross compiler from scripts/setup.sh (gcc-aarch64-linux-gnu): no ARM machine
# is at hand, so this proves the code builds there; the portable kernels' results are tested on
# x86 (test_cpu_kernels, KVGW_CPU_ISA=portable). Exit 77 (SKIPPED) without the cross compiler.
set -euo pipefail
cd "$(dirname "$0")/../../.."
cc=aarch64-linux-gnu-gcc
command -v "$cc" >/dev/null 2>&1 || { echo "no $cc: skipped"; exit 77; }
blas=$(pkg-config --cflags-only-I openblas 2>/dev/null || true)
for f in engine/cpu_portable.c engine/cpu_pool.c engine/cpu_isa.c engine/cpu_kernels.c \
    engine/backend_cpu.c engine/half.c engine/vexp.c engine/sampling.c common/pc_exp.c; do
    "$cc" -std=gnu11 -O2 -Wall -Wextra -Wno-unused-parameter -Werror -S -o /dev/null \
        -Iengine -Icommon -Iradix $blas "$f"
    echo "aarch64: $f compiles"
done
