#!/usr/bin/env bash
# vs_llamacpp.sh - llama.cpp (llama-bench) vs cflow-tui, side by side (issues 18 and 41).
#
# Usage:
#   benches/vs_llamacpp.sh --models LIST [options]       # one command, the whole table
#   benches/vs_llamacpp.sh MODEL.gguf [MODEL.cflow] [options]
#
#   LIST is comma-separated: smollm2-q4_1 (the pulled SmolLM2 Q4_1), smollm2-KIND (that file
#   requantized by llama-quantize --allow-requantize to KIND: q4_0, q4_k_m, q6_k, ...; made once
#   into ~/.cache/cflow-tui/smollm2/, as the parity tests' files are), gemma3-q4_k_m (the pulled
#   Gemma 3 270M), table (those five: q4_1, q4_0, q4_k_m, q6_k, gemma3), or PATH.gguf[:PATH.cflow].
#   Named models are imported to a .cflow beside their GGUF (cflow-tui import, --quant keep) when
#   missing; without a .cflow, cflow-tui opens the GGUF itself (imported once into its cache).
#
# Runs benches/vs_llamacpp.py compare: REPEATS rounds; in each, for threads 1 and 2: the read
# roofline (membw, and cflow-tui bench membw over 2 MiB pages), then for each model fresh
# processes of both engines, alternating (llama-bench first in even rounds, cflow first in odd):
#   tg      decode tok/s: llama-bench tg128; cflow bench decode -p 8 -n 128
#   pp      prefill tok/s, pp256: llama-bench -p 256; cflow bench decode -p 256 -n 1
#   pp_long pp2048, and the time to first token of a 2,048-token prompt (cflow: measured, the
#           ttft_ms of bench decode --json; llama-bench: 2048 / its pp2048 tok/s)
#   depth   decode at depth 4096: llama-bench -p 0 -n 128 -d 4096; cflow bench decode -d 4096 -p 1
#   rss     peak RSS (/usr/bin/time -v) at the larger thread count of cflow-tui run and of
#           llama-bench -p 0 -n 16 -d 4080, the same file with the same 4,096 positions filled
# and prints Markdown tables (for docs/PERFORMANCE.md): per model and thread count, cflow median
# (min-max), llama-bench median (min-max), the median (min-max) of the per-round ratios, % of the
# roofline for decode, and the peak RSS of both with their ratio.
#
# Options (passed to vs_llamacpp.py compare; `benches/vs_llamacpp.py compare --help` lists all):
#   --quick               smoke test: REPEATS=1 unless set, columns tg,pp,rss, RSS context 1024
#   --columns LIST        any of tg,pp,pp_long,depth,rss (default: all)
#   --depth D             the depth column's cached positions [4096] (0: no depth column)
#   --prefill-long N      the pp_long/TTFT prompt [2048]     --prefill-len N  the pp prompt [256]
#   --rss-ctx C           the RSS column's context [4096]
#   --other-act           also cflow's other --act mode (f32 is slow on the K-quants)
#   --default-only        accepted for old command lines (the default now)
#   --llama-python        also llama.cpp through llama-cpp-python (tg and pp)
#
# Environment (defaults in brackets):
#   ANCHOR_DIR  [/tmp/anchor]                 venv (gguf-py; llama-cpp-python) and the membw probe
#   PYTHON      [$ANCHOR_DIR/venv/bin/python]
#   CFLOW_BIN   [<repo>/target/release/cflow-tui]
#   LLAMA_BENCH [$ANCHOR_DIR/llcpp-build/bin/llama-bench]   LLAMA_QUANTIZE [beside llama-bench]
#   THREADS     [1,2]    REPEATS [5; 1 with --quick]    TOKENS [128]
#   MEMBW       [$ANCHOR_DIR/membw]       DRAM_GBS  e.g. "1=20.3,2=33.3" to skip both read probes
#   CFLOW_CACHE [~/.cache/cflow-tui]      CFLOW_SMOLLM2, CFLOW_GEMMA3: the pulled GGUFs elsewhere
#   OUT         [${TMPDIR:-/tmp}/cflow-bench/vs_llamacpp-<date>.json]  raw samples, summary, Markdown
#               (e.g. OUT=docs/data/vs_llamacpp.json for the committed table)
set -euo pipefail

if [[ $# -lt 1 || "$1" == -h || "$1" == --help ]]; then
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
    exit 0
fi

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
ANCHOR_DIR="${ANCHOR_DIR:-/tmp/anchor}"
PYTHON="${PYTHON:-$ANCHOR_DIR/venv/bin/python}"
CFLOW_BIN="${CFLOW_BIN:-$repo/target/release/cflow-tui}"
THREADS="${THREADS:-1,2}"
TOKENS="${TOKENS:-128}"
MEMBW="${MEMBW:-$ANCHOR_DIR/membw}"
LLAMA_BENCH="${LLAMA_BENCH:-$ANCHOR_DIR/llcpp-build/bin/llama-bench}"
LLAMA_QUANTIZE="${LLAMA_QUANTIZE:-$(dirname "$LLAMA_BENCH")/llama-quantize}"
OUT="${OUT:-${TMPDIR:-/tmp}/cflow-bench/vs_llamacpp-$(date +%Y%m%d-%H%M%S).json}"
command="benches/vs_llamacpp.sh $*"
[[ -n "${REPEATS:-}" ]] && command="REPEATS=$REPEATS $command"

args=(compare)
if [[ "$1" != --* ]]; then
    gguf="$1"; shift
    [[ -f "$gguf" ]] || { echo "no such GGUF: $gguf" >&2; exit 1; }
    args+=("$gguf")
    if [[ $# -gt 0 && "$1" != --* ]]; then args+=(--cflow "$1"); shift; fi
fi

"$PYTHON" -c 'import gguf' 2>/dev/null || {
    echo "$PYTHON cannot import gguf; build the venv with shared/bench/setup.sh (ANCHOR_DIR=$ANCHOR_DIR)" >&2; exit 1; }
mkdir -p "$(dirname "$OUT")"

echo "== $(date '+%F %T')  $(uname -n)  $(nproc) cpus  uptime:$(uptime | sed 's/.*load average/ load average/')"
echo "== llama-bench $LLAMA_BENCH  cflow-tui $CFLOW_BIN  python $PYTHON"

args+=(--threads "$THREADS" --tokens "$TOKENS" --cflow-bin "$CFLOW_BIN" --membw "$MEMBW"
       --llama-bench "$LLAMA_BENCH" --llama-quantize "$LLAMA_QUANTIZE" --json "$OUT" --command "$command")
[[ -n "${REPEATS:-}" ]] && args+=(--repeats "$REPEATS")
[[ -n "${DRAM_GBS:-}" ]] && args+=(--dram-gbs "$DRAM_GBS")

# The llama.cpp workers and membw get OMP_PROC_BIND=close OMP_PLACES=cores (set by the driver),
# as in shared/bench/run_all.sh.
exec "$PYTHON" "$here/vs_llamacpp.py" "${args[@]}" "$@"
