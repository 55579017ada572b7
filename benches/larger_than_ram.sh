#!/usr/bin/env bash
# larger_than_ram.sh - a MoE larger than memory: the same qwen3moe GGUF on llama.cpp
# (llama-bench, mmap as users run it) and on cflow (`bench decode` on its import of that GGUF),
# under the same memory-cgroup limit, alternating the arms (ABBA over pairs), at 2 and 1 threads.
#
# Usage: benches/larger_than_ram.sh [MODEL.gguf]
#   default model: ~/.cache/cflow-tui/q3moe30b/qwen3moe-30b-a3b-synth.Q4_0.gguf, made by
#   `python3 benches/make_qwen3moe_30b.py OUT.gguf` (needs numpy; ~17 GB, deterministic). Its
#   routers are random: the routing is close to uniform, the worst case for any expert cache.
# Disk: the GGUF (~17 GB) plus its .cflow import beside it (~17 GB): ~35 GB in all. The script
#   imports the .cflow when it is missing and refuses when the disk lacks the space.
# Needs root (cgroups, dropping the page cache between runs) and llama-bench (LLAMA_BENCH,
#   default /tmp/anchor/llcpp-build/bin/llama-bench from ../shared/bench/setup.sh).
# Knobs: LIMITS="none 8G 4G" THREADS="2 1" PAIRS=3 TOKENS=64 (without a limit) TOKENS_LIMITED=8
#   (under one) PROMPT=8 CACHE="none=8192,8G=4096,4G=1536"
#   (an extra arm with the expert cache of that many MiB under that limit), ARMS (a regular
#   expression: only the arms whose names match, e.g. 'llama|mmap|resident'), OUT (the JSON,
#   default docs/data/larger_than_ram.json; finished runs in it are kept and skipped).
# Each run starts with the page cache dropped; the cgroup is created per run and removed after
# it, also on Ctrl-C. Prints a Markdown table; the JSON has every run.
# A .cflow argument runs cflow's arms alone (no GGUF twin, e.g. moefy's smollm2-moe: learned
#   routing, which shows whether the expert cache pays), feeding its own greedy text:
#   LIMITS="none 64M" CACHE="64M=8|16|32" OUT=docs/data/larger_than_ram_smollm2_moe.json \
#   benches/larger_than_ram.sh ~/.cache/cflow-tui/smollm2/SmolLM2-135M-Instruct.Q4_1.moe-e8k6s256d1.cflow
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "${1:-}" == *.cflow ]]; then
    BIN=${BIN:-target/release/cflow-tui}
    [ "$(id -u)" = 0 ] || { echo "larger_than_ram.sh: needs root (memory cgroups, drop_caches)" >&2; exit 2; }
    [ -s "$1" ] || { echo "larger_than_ram.sh: no model at $1" >&2; exit 2; }
    [ -x "$BIN" ] || cargo build --release --quiet
    exec python3 benches/larger_than_ram.py --cflow-only --cflow-model "$1" --cflow "$BIN" \
        --limits "${LIMITS:-none 64M}" --threads "${THREADS:-2 1}" --pairs "${PAIRS:-3}" \
        --tokens "${TOKENS:-64}" --tokens-limited "${TOKENS_LIMITED:-64}" --prompt "${PROMPT:-8}" \
        --cache-mib "${CACHE:-64M=8|16|32}" --feed sampled \
        --routing "learned (moefy): the model's own greedy text" \
        --out "${OUT:-docs/data/larger_than_ram_smollm2_moe.json}"
fi
GGUF=${1:-$HOME/.cache/cflow-tui/q3moe30b/qwen3moe-30b-a3b-synth.Q4_0.gguf}
CFLOW_MODEL=${GGUF%.gguf}.cflow
BIN=${BIN:-target/release/cflow-tui}
LLAMA_BENCH=${LLAMA_BENCH:-/tmp/anchor/llcpp-build/bin/llama-bench}
OUT=${OUT:-docs/data/larger_than_ram.json}
[ "$(id -u)" = 0 ] || { echo "larger_than_ram.sh: needs root (memory cgroups, drop_caches)" >&2; exit 2; }
[ -x "$LLAMA_BENCH" ] || { echo "larger_than_ram.sh: no llama-bench at $LLAMA_BENCH (run ../shared/bench/setup.sh or set LLAMA_BENCH)" >&2; exit 2; }
free_bytes() { df -B1 --output=avail "$1" | tail -1; }
if [ ! -s "$GGUF" ]; then
    need=$((18 * 1024 * 1024 * 1024))
    dir=$(dirname "$GGUF"); mkdir -p "$dir"
    [ "$(free_bytes "$dir")" -gt "$need" ] || { echo "larger_than_ram.sh: $GGUF is missing and $dir has less than 18 GiB free to make it (35 GiB with the .cflow)" >&2; exit 2; }
    echo "making $GGUF (python3 benches/make_qwen3moe_30b.py; numpy needed)" >&2
    python3 benches/make_qwen3moe_30b.py "$GGUF" >&2
fi
[ -x "$BIN" ] || cargo build --release --quiet
if [ ! -s "$CFLOW_MODEL" ]; then
    size=$(stat -c %s "$GGUF")
    [ "$(free_bytes "$(dirname "$CFLOW_MODEL")")" -gt $((size + (1 << 30))) ] ||
        { echo "larger_than_ram.sh: importing $GGUF needs $((size >> 30)) GiB + 1 GiB free beside it" >&2; exit 2; }
    "$BIN" import "$GGUF" -o "$CFLOW_MODEL" >&2
fi
exec python3 benches/larger_than_ram.py --gguf "$GGUF" --cflow-model "$CFLOW_MODEL" --cflow "$BIN" \
    --llama-bench "$LLAMA_BENCH" --limits "${LIMITS:-none 8G 4G}" --threads "${THREADS:-2 1}" \
    --pairs "${PAIRS:-3}" --tokens "${TOKENS:-64}" --tokens-limited "${TOKENS_LIMITED:-8}" --prompt "${PROMPT:-8}" \
    --cache-mib "${CACHE:-none=8192,8G=4096,4G=1536}" --arms "${ARMS:-}" --out "$OUT"
