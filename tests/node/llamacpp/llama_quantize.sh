#!/usr/bin/env bash
# Writes llama.cpp-quantized copies of a GGUF file with llama.cpp's own quantizer
# (llama_model_quantize in node-llama-cpp's prebuilt libllama; scripts/setup-llamacpp.sh installs
# it), for checking `kvgw eval` against llama.cpp on files kvgw did not write:
#
#   tests/node/llamacpp/llama_quantize.sh IN.gguf OUTDIR [q4_k_m q4_0 ...]
#
# writes OUTDIR/<basename of IN>-<type>.gguf for each type (default: q4_k_m q4_0). llama.h is
# taken from the llama.cpp source bundled in node-llama-cpp (llama/gitRelease.bundle, the very
# release of the binaries) and llama_quantize.c is compiled in a temporary directory; nothing is
# downloaded. Exit status 77 (skipped) when node-llama-cpp is not installed.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
if [ $# -lt 2 ]; then
    echo "usage: $0 IN.gguf OUTDIR [q4_k_m q4_0 q5_k_m q8_0 ...]" >&2
    exit 2
fi
in="$1" out="$2"
shift 2
types=("$@")
[ ${#types[@]} -gt 0 ] || types=(q4_k_m q4_0)
nlc="${KVGW_LLAMACPP_DIR:-$here}/node_modules"
bundle="$nlc/node-llama-cpp/llama/gitRelease.bundle"
bins="$nlc/@node-llama-cpp/linux-x64/bins/linux-x64"
if [ ! -f "$bundle" ] || [ ! -d "$bins" ]; then
    echo "llama_quantize: SKIP: node-llama-cpp is not installed; run scripts/setup-llamacpp.sh" >&2
    exit 77
fi
[ -f "$in" ] || { echo "llama_quantize: $in: no such file" >&2; exit 1; }
mkdir -p "$out"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
git clone -q --no-checkout "$bundle" "$tmp/src" 2>/dev/null
git -C "$tmp/src" checkout -q HEAD -- include/llama.h ggml/include 2>/dev/null
lib="$(ls "$bins"/libllama.*so | head -n1)"
cc -O1 -o "$tmp/llama_quantize" "$here/llama_quantize.c" -I"$tmp/src/include" \
    -I"$tmp/src/ggml/include" "$lib" -Wl,-rpath,"$bins"
base="$(basename "$in" .gguf)"
for t in "${types[@]}"; do
    "$tmp/llama_quantize" "$in" "$out/$base-$t.gguf" "$t" >"$tmp/log" 2>&1 ||
        { cat "$tmp/log" >&2; exit 1; }
    echo "llama_quantize: wrote $out/$base-$t.gguf"
done
