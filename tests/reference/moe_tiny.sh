#!/usr/bin/env bash
# Builds the moe_tiny outside-oracle data (tests/reference/moe_tiny/README.md) for qwen3, qwen3moe,
# olmoe, mixtral, qwen2moe (+ qwen3moe_k, Q4_K_M only):
#   moe_tiny.py          HF model: build, train, save_pretrained to $SCRATCH/<case>, goldens.json
#   moe_tiny_convert.py  llama.cpp's own convert_hf_to_gguf.py -> model-f32.gguf, model-q8_0.gguf
#   llama-quantize       model-f32.gguf -> model-q4_k_m.gguf (Q4_K_M)
#   moe_tiny_llamacpp.py llama.cpp goldens on goldens.json's ids, flash attention default and off
# Idempotent: a step runs only when its output is missing (FORCE=1 regenerates everything).
# Usage: tests/reference/moe_tiny.sh [CASE ...]        (default: all six)
# Environment (defaults in brackets):
#   HF_PY          python with torch, transformers v5, tokenizers, safetensors [/tmp/hfvenv/bin/python]
#   LLAMA_PY       python with llama-cpp-python and numpy [/tmp/anchor/venv/bin/python]
#   LLAMA_CPP_DIR  llama.cpp source tree (convert_hf_to_gguf.py, gguf-py)
#                  [/tmp/anchor/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp]
#   LLAMA_QUANTIZE llama-quantize binary built from that tree [/tmp/anchor/llcpp-build/bin/llama-quantize]
#   SCRATCH        HF checkpoints and uncommitted intermediates [/tmp/moe_tiny_hf]
#   OUT            output root [tests/reference/moe_tiny]
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
HF_PY=${HF_PY:-/tmp/hfvenv/bin/python}
LLAMA_PY=${LLAMA_PY:-/tmp/anchor/venv/bin/python}
LLAMA_CPP_DIR=${LLAMA_CPP_DIR:-/tmp/anchor/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp}
LLAMA_QUANTIZE=${LLAMA_QUANTIZE:-/tmp/anchor/llcpp-build/bin/llama-quantize}
SCRATCH=${SCRATCH:-/tmp/moe_tiny_hf}
OUT=${OUT:-$HERE/moe_tiny}
export LLAMA_CPP_DIR
export OMP_NUM_THREADS=1

CASES=("$@")
[ ${#CASES[@]} -gt 0 ] || CASES=(qwen3 qwen3moe olmoe mixtral qwen2moe qwen3moe_k)

pre_of() {  # tokenizer.ggml.pre that real GGUFs of the family carry
    case "$1" in
        qwen3|qwen3moe|qwen3moe_k|qwen2moe) echo qwen2 ;;
        olmoe) echo olmo ;;
        mixtral) echo llama-bpe ;;
        *) echo "unknown case $1" >&2; exit 1 ;;
    esac
}

for c in "${CASES[@]}"; do
    d="$OUT/$c"
    hf="$SCRATCH/$c"
    pre=$(pre_of "$c")
    mkdir -p "$d"
    if [ "${FORCE:-0}" = 1 ]; then
        rm -rf "$hf"
        rm -f "$d"/goldens.json "$d"/model-*.gguf "$d"/llamacpp_*.json
    fi
    if [ "$c" = qwen3moe_k ]; then
        quants=(q4_k_m)
        f32="$hf/model-f32.gguf"   # intermediate only: not committed (8 MB)
    else
        quants=(f32 q8_0 q4_k_m)
        f32="$d/model-f32.gguf"
    fi
    need_hf=0
    [ -f "$d/goldens.json" ] || need_hf=1
    for q in "${quants[@]}"; do [ -f "$d/model-$q.gguf" ] || need_hf=1; done
    if [ $need_hf = 1 ] && [ ! -f "$hf/model.safetensors" -o ! -f "$d/goldens.json" ]; then
        echo "== $c: HF build + train"
        "$HF_PY" "$HERE/moe_tiny.py" "$c" "$hf" "$d" 2>&1 | grep -v "Writing model shards\|Loading weights"
    fi
    if [ ! -f "$f32" ] && { [ "$c" != qwen3moe_k ] || [ ! -f "$d/model-q4_k_m.gguf" ]; }; then
        echo "== $c: convert f32"
        "$HF_PY" "$HERE/moe_tiny_convert.py" --pre "$pre" "$hf" --outtype f32 --outfile "$f32" > "$SCRATCH/$c.convert-f32.log" 2>&1
    fi
    if [ "$c" != qwen3moe_k ] && [ ! -f "$d/model-q8_0.gguf" ]; then
        echo "== $c: convert q8_0"
        "$HF_PY" "$HERE/moe_tiny_convert.py" --pre "$pre" "$hf" --outtype q8_0 --outfile "$d/model-q8_0.gguf" > "$SCRATCH/$c.convert-q8_0.log" 2>&1
    fi
    if [ ! -f "$d/model-q4_k_m.gguf" ]; then
        echo "== $c: llama-quantize Q4_K_M"
        "$LLAMA_QUANTIZE" "$f32" "$d/model-q4_k_m.gguf" Q4_K_M 1 > "$SCRATCH/$c.quantize.log" 2>&1
    fi
    for q in "${quants[@]}"; do
        if [ ! -f "$d/llamacpp_$q.json" ]; then
            "$LLAMA_PY" "$HERE/moe_tiny_llamacpp.py" "$d/model-$q.gguf" --ids-json "$d/goldens.json" \
                -o "$d/llamacpp_$q.json"
        fi
        if [ ! -f "$d/llamacpp_${q}_fa_off.json" ]; then
            "$LLAMA_PY" "$HERE/moe_tiny_llamacpp.py" "$d/model-$q.gguf" --ids-json "$d/goldens.json" \
                --flash-attn off -o "$d/llamacpp_${q}_fa_off.json" --compare-with "$d/llamacpp_$q.json"
        fi
    done
    if [ "$c" = qwen3moe_k ] && [ -f "$f32" ] && [ ! -f "$hf/llamacpp_f32.json" ]; then
        # not committed: checks the conversion (HF vs llama.cpp F32) for the README
        "$LLAMA_PY" "$HERE/moe_tiny_llamacpp.py" "$f32" --ids-json "$d/goldens.json" -o "$hf/llamacpp_f32.json"
    fi
done
PYTHONPATH="$LLAMA_CPP_DIR/gguf-py" "$HF_PY" "$HERE/moe_tiny_report.py" "$OUT" "$SCRATCH"
