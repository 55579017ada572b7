#!/usr/bin/env bash
# vs_llamacpp.sh - side-by-side decode benchmark, llama.cpp vs cflow-tui, on one GGUF.
#
# Usage:
#   benches/vs_llamacpp.sh MODEL.gguf [MODEL.cflow] [extra vs_llamacpp.py compare options]
#
# Runs benches/vs_llamacpp.py compare: for threads 1 and 2, REPEATS alternating pairs
# (A = fresh llama.cpp process, B = fresh cflow-tui processes), 8-token prompt + 128 greedy
# decode steps, plus a 256-token prefill; prints decode tok/s median (min-max) per engine, the
# cflow/llama.cpp ratio of every pair, prefill tok/s, bytes/token, effective GB/s and % of the
# DRAM read ceiling (measured with membw unless --dram-gbs is passed). The .cflow argument is
# optional; without it (or if the file/binary is missing) only llama.cpp is measured.
#
# Environment (defaults in brackets):
#   ANCHOR_DIR  [/tmp/anchor]                 venv with llama-cpp-python, and the membw probe
#   PYTHON      [$ANCHOR_DIR/venv/bin/python]
#   CFLOW_BIN   [<repo>/target/release/cflow-tui]
#   THREADS     [1,2]    REPEATS [5]    TOKENS [128]
#   MEMBW       [$ANCHOR_DIR/membw]       DRAM_GBS  e.g. "1=20.3,2=33.3" to skip membw
#   OUT         [${TMPDIR:-/tmp}/cflow-bench/vs_llamacpp-<date>.json]  raw samples + summary
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
REPEATS="${REPEATS:-5}"
TOKENS="${TOKENS:-128}"
MEMBW="${MEMBW:-$ANCHOR_DIR/membw}"
OUT="${OUT:-${TMPDIR:-/tmp}/cflow-bench/vs_llamacpp-$(date +%Y%m%d-%H%M%S).json}"

gguf="$1"; shift
cflow=""
if [[ $# -gt 0 && "$1" != --* ]]; then cflow="$1"; shift; fi

[[ -f "$gguf" ]] || { echo "no such GGUF: $gguf" >&2; exit 1; }
"$PYTHON" -c 'import llama_cpp' 2>/dev/null || {
    echo "$PYTHON cannot import llama_cpp; build it with shared/bench/setup.sh (ANCHOR_DIR=$ANCHOR_DIR)" >&2; exit 1; }
mkdir -p "$(dirname "$OUT")"

echo "== $(date '+%F %T')  $(uname -n)  $(nproc) cpus  uptime:$(uptime | sed 's/.*load average/ load average/')"
echo "== llama-cpp-python $("$PYTHON" -c 'import llama_cpp; print(llama_cpp.__version__)')  python $PYTHON"

args=(compare "$gguf" --threads "$THREADS" --repeats "$REPEATS" --tokens "$TOKENS"
      --cflow-bin "$CFLOW_BIN" --membw "$MEMBW" --json "$OUT")
[[ -n "$cflow" ]] && args+=(--cflow "$cflow")
[[ -n "${DRAM_GBS:-}" ]] && args+=(--dram-gbs "$DRAM_GBS")

# The llama.cpp workers and membw get OMP_PROC_BIND=close OMP_PLACES=cores (set by the driver),
# as in shared/bench/run_all.sh.
exec "$PYTHON" "$here/vs_llamacpp.py" "${args[@]}" "$@"
