#!/usr/bin/env bash
# Sets everything up on a fresh Debian 12 machine and runs the gateway on its embedded default
# (conf/kvgw.yaml: CPU workers, the generated demo model, a local ledger). Extra arguments go to
# `kvgw serve`. Until the gateway lands (see the open issues), this builds the binary, makes the
# models and runs what exists: the radix benchmark.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc 2>/dev/null || echo 2)"
if [ -x scripts/models.sh ]; then bash scripts/models.sh; fi
if build/bin/kvgw serve --help >/dev/null 2>&1; then
    exec build/bin/kvgw serve "$@"
fi
echo "kvgw: the gateway (kvgw serve) is not built yet; running the radix benchmark instead."
build/bin/kvgw --help
exec build/bin/kvgw bench radix
