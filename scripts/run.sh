#!/usr/bin/env bash
# Sets everything up on a fresh Debian 12 machine and runs the gateway on its embedded default
# (conf/kvgw.yaml: in-process CPU workers, the generated demo model, a local ledger under var/)
# at http://127.0.0.1:8080. Extra arguments go to `kvgw serve` (e.g. --listen 127.0.0.1:9090; a
# public address needs your own secrets: the demo ones stay on loopback, conf/README.md `server`).
# Ctrl-C stops it cleanly: in-flight requests finish, the ledger is flushed.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
# Only the binary (the tests and benchmarks are test.sh's): a shorter first start.
cmake --build build -j"$(nproc 2>/dev/null || echo 2)" --target kvgw
bash scripts/models.sh demo
exec build/bin/kvgw serve "$@"
