#!/usr/bin/env bash
# Optional: installs llama.cpp, prebuilt, from npm (node-llama-cpp 3.22.1 and its linux-x64 CPU
# binaries, about 85 MB) into tests/node/llamacpp, for tests/node/llamacpp/llamacpp_ref.mjs, which
# measures kvgw's accuracy and speed beside llama.cpp's. Nothing else needs it, and scripts/setup.sh
# does not run it: without it the reference script exits 77 (SKIPPED) with a message.
#
# Nothing is compiled or downloaded beyond the npm packages: optional dependencies are omitted
# (node-llama-cpp lists a binary package per platform, the CUDA and Vulkan ones hundreds of MB;
# the linux-x64 one is a direct dependency instead), install scripts are not run (node-llama-cpp's
# postinstall would otherwise try to download and build llama.cpp when its binaries fail to load),
# and the script refuses a machine the binaries are not built for. `npm install` with the lock
# rather than `npm ci`: the lock leaves out the other platforms' packages, which npm ci refuses.
set -euo pipefail
cd "$(dirname "$0")/../tests/node/llamacpp"
if [ "$(uname -s)-$(uname -m)" != "Linux-x86_64" ]; then
    echo "setup-llamacpp: prebuilt binaries only for Linux x86-64 here; skipped" >&2
    exit 0
fi
stamp=node_modules/.kvgw-lock-stamp
if [ -f "$stamp" ] && cmp -s package-lock.json "$stamp"; then
    echo "setup-llamacpp: node_modules up to date"
    exit 0
fi
NODE_LLAMA_CPP_SKIP_DOWNLOAD=true npm install --omit=optional --ignore-scripts --no-save \
    --no-audit --no-fund --loglevel=error
cp package-lock.json "$stamp"
echo "setup-llamacpp: installed"
