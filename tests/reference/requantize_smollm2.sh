#!/usr/bin/env bash
# Issue 19: the K-quant SmolLM2s the parity tests need (never committed: they are derived models).
# Makes /tmp/SmolLM2-135M-Instruct.{Q4_K_M,Q6_K}.gguf (OUT=dir to change) from the pulled Q4_1
# GGUF with llama.cpp's llama-quantize --allow-requantize (LLAMA_BIN=dir holding llama-quantize,
# default /tmp/anchor/llcpp-build/bin, built from the same sdist as llama-bench by
# /work/shared/bench/setup.sh). With GOLDENS=1 also regenerates the committed goldens
# tests/reference/goldens/smollm2_{q4_k_m,q6_k}_llamacpp{,_fa_off}.json with llamacpp_goldens.py
# (PYTHON = an interpreter with llama-cpp-python, default /tmp/anchor/venv/bin/python).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="${LLAMA_BIN:-/tmp/anchor/llcpp-build/bin}"
out="${OUT:-/tmp}"
py="${PYTHON:-/tmp/anchor/venv/bin/python}"
src="${CFLOW_SMOLLM2:-$HOME/.cache/cflow-tui/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}"
[ -f "$src" ] || { echo "no SmolLM2 GGUF at $src (cflow-tui pull smollm2)" >&2; exit 1; }
[ -x "$bin/llama-quantize" ] || { echo "no llama-quantize in $bin" >&2; exit 1; }
for kind in Q4_K_M Q6_K; do
    dst="$out/SmolLM2-135M-Instruct.$kind.gguf"
    LD_LIBRARY_PATH="$bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
        "$bin/llama-quantize" --allow-requantize "$src" "$dst" "$kind" 1 >"$dst.log" 2>&1 ||
        { echo "llama-quantize failed, see $dst.log" >&2; exit 1; }
    echo "$dst: $(sha256sum "$dst" | cut -c1-16)…"
    if [ "${GOLDENS:-0}" = 1 ]; then
        g="$here/goldens/smollm2_${kind,,}_llamacpp"
        "$py" "$here/llamacpp_goldens.py" "$dst" -o "$g.json"
        "$py" "$here/llamacpp_goldens.py" "$dst" --flash-attn off -o "${g}_fa_off.json" \
            --compare-with "$g.json"
    fi
done
