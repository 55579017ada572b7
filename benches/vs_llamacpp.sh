#!/usr/bin/env bash
# vs_llamacpp.sh - one benchmark for issue 18: llama.cpp (llama-bench) vs cflow-tui on one GGUF.
#
# Usage:
#   benches/vs_llamacpp.sh MODEL.gguf [MODEL.cflow] [extra vs_llamacpp.py compare options]
#
# Runs benches/vs_llamacpp.py compare: REPEATS rounds; in each, for threads 1 and 2, alternating
# fresh processes: membw (the DRAM read roofline, measured in the same run), llama-bench tg128 +
# pp256, then cflow-tui `bench decode` decode (8-token prompt + 128 greedy steps) and pp256 for
# the default numerics and for the other --act mode. Prints one table: decode and prefill tok/s
# median (min-max), the median per-round ratio to llama-bench, effective GB/s and % of the
# roofline. The .cflow argument is optional; without it only llama.cpp is measured.
# `--llama-python` also times llama.cpp through llama-cpp-python (the harness of issue 18's table).
# `--depth 1024` compares decode after 1024 cached positions instead (llama-bench -d; no prefill).
#
# Environment (defaults in brackets):
#   ANCHOR_DIR  [/tmp/anchor]                 venv (gguf-py; llama-cpp-python) and the membw probe
#   PYTHON      [$ANCHOR_DIR/venv/bin/python]
#   CFLOW_BIN   [<repo>/target/release/cflow-tui]
#   LLAMA_BENCH [$ANCHOR_DIR/llcpp-build/bin/llama-bench]
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
LLAMA_BENCH="${LLAMA_BENCH:-$ANCHOR_DIR/llcpp-build/bin/llama-bench}"
OUT="${OUT:-${TMPDIR:-/tmp}/cflow-bench/vs_llamacpp-$(date +%Y%m%d-%H%M%S).json}"

gguf="$1"; shift
cflow=""
if [[ $# -gt 0 && "$1" != --* ]]; then cflow="$1"; shift; fi

[[ -f "$gguf" ]] || { echo "no such GGUF: $gguf" >&2; exit 1; }
"$PYTHON" -c 'import gguf' 2>/dev/null || {
    echo "$PYTHON cannot import gguf; build the venv with shared/bench/setup.sh (ANCHOR_DIR=$ANCHOR_DIR)" >&2; exit 1; }
mkdir -p "$(dirname "$OUT")"

echo "== $(date '+%F %T')  $(uname -n)  $(nproc) cpus  uptime:$(uptime | sed 's/.*load average/ load average/')"
echo "== llama-bench $LLAMA_BENCH  python $PYTHON"

args=(compare "$gguf" --threads "$THREADS" --repeats "$REPEATS" --tokens "$TOKENS"
      --cflow-bin "$CFLOW_BIN" --membw "$MEMBW" --llama-bench "$LLAMA_BENCH" --json "$OUT")
[[ -n "$cflow" ]] && args+=(--cflow "$cflow")
[[ -n "${DRAM_GBS:-}" ]] && args+=(--dram-gbs "$DRAM_GBS")

# The llama.cpp workers and membw get OMP_PROC_BIND=close OMP_PLACES=cores (set by the driver),
# as in shared/bench/run_all.sh.
exec "$PYTHON" "$here/vs_llamacpp.py" "${args[@]}" "$@"
