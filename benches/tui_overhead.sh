#!/usr/bin/env bash
# Does rendering slow decode? Decode tok/s of the demo model with the TUI open (driven in tmux at
# 160x48) vs headless `run`, REPEATS pairs in ABBA order (odd pairs TUI first, even pairs headless
# first, so a drift of the machine does not favour one arm). Both arms record a trace and the tok/s
# comes from `replay --summary --json` (tokens / decode time of the engine thread), and both are
# waited for by the same watcher (benches/wait_for_done.py: one process, no forks while decoding),
# so the harness loads both arms alike. Prints per-pair figures, the medians, the median of the
# pair ratios with a 95% bootstrap CI, and the UI thread's own CPU time during the reply
# (/proc/PID/task/PID/schedstat: the main thread draws the TUI), the direct cost of rendering.
# Usage: REPEATS=10 N=512 THREADS=2 benches/tui_overhead.sh [MODEL]
set -euo pipefail
BIN=${BIN:-target/release/cflow-tui}
REPEATS=${REPEATS:-5}
N=${N:-512}
THREADS=${THREADS:-2}
HERE=$(cd "$(dirname "$0")" && pwd)
model=("$@")
# The real interpreter, not a shim: a pyenv `python3` shim is a bash script that burns ~0.3 s of
# CPU per start, and the watchers below start while the engine loads.
PY=$(python3 -c 'import sys; print(sys.executable)')
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"; tmux kill-session -t cflow-ovh 2>/dev/null || true' EXIT
tok_s() { "$BIN" replay --summary --json "$1" | python3 -c 'import json,sys; print(json.load(sys.stdin)["decode_tok_s"])'; }
# CPU ns of the TUI's main (drawing) thread: the child of the tmux pane's shell.
ui_ns() {
    local pp pid
    pp=$(tmux display -p -t cflow-ovh '#{pane_pid}')
    pid=$(pgrep -P "$pp" | head -1)
    awk '{print $1}' "/proc/$pid/task/$pid/schedstat"
}
tui_arm() {
    local t="$TMP/tui$1.jsonl"
    tmux kill-session -t cflow-ovh 2>/dev/null || true
    tmux new-session -d -s cflow-ovh -x 160 -y 48 \
        "$BIN ${model[*]} --record $t --max-tokens $N --threads $THREADS --no-pmu; sleep 30"
    for _ in $(seq 1 300); do
        grep -q '"kind":"settings"' "$t" 2>/dev/null && break; sleep 0.1
    done
    sleep 1
    local u0 w0 u1 w1
    # The watcher starts (and finishes starting) before the prompt is sent: its start-up must not
    # fall inside the measured reply.
    "$PY" "$HERE/wait_for_done.py" "$t" 120 & local wpid=$!
    sleep 1
    u0=$(ui_ns); w0=$(date +%s%N)
    tmux send-keys -t cflow-ovh -l "Once upon a time"; tmux send-keys -t cflow-ovh Enter
    wait "$wpid"
    u1=$(ui_ns); w1=$(date +%s%N)
    UI=$(python3 -c "print(f'{100*($u1-$u0)/($w1-$w0):.2f}')")
    tmux send-keys -t cflow-ovh Tab; tmux send-keys -t cflow-ovh q; sleep 0.5
    tmux kill-session -t cflow-ovh 2>/dev/null || true
    TUI=$(tok_s "$t")
}
headless_arm() {
    local h="$TMP/h$1.jsonl"
    # Same watcher, started the same 1 s ahead (it polls for the file to appear).
    "$PY" "$HERE/wait_for_done.py" "$h" 120 & local wpid=$!
    sleep 1
    "$BIN" run "${model[@]}" --prompt "Once upon a time" -n "$N" --threads "$THREADS" --record "$h" > /dev/null 2>&1 &
    local pid=$!
    wait "$wpid"
    wait "$pid"
    HEADLESS=$(tok_s "$h")
}
tui=(); headless=(); ui=()
for r in $(seq 1 "$REPEATS"); do
    if (( r % 2 )); then tui_arm "$r"; headless_arm "$r"; else headless_arm "$r"; tui_arm "$r"; fi
    tui+=("$TUI"); headless+=("$HEADLESS"); ui+=("$UI")
    echo "pair $r: TUI $TUI tok/s (UI thread $UI% of a core) | headless $HEADLESS tok/s   [$(uptime | sed 's/.*load/load/')]"
done
PAIR_CI_DIR=$(dirname "$0") python3 - "${tui[*]}" "${headless[*]}" "${ui[*]}" <<'PY'
import os, statistics as S, sys
sys.path.insert(0, os.environ["PAIR_CI_DIR"])
from pair_ci import median_ci, verdict
t = [float(x) for x in sys.argv[1].split()]; h = [float(x) for x in sys.argv[2].split()]
u = [float(x) for x in sys.argv[3].split()]
r = [a / b for a, b in zip(t, h)]
_, lo, hi = median_ci(r)
print(f"UI thread CPU during the reply: median {S.median(u):.2f}% of a core (min {min(u):.2f}, max {max(u):.2f})")
mt, mh = S.median(t), S.median(h)
print(f"median TUI {mt:.1f} tok/s (min {min(t):.1f}, max {max(t):.1f}) | headless {mh:.1f} (min {min(h):.1f}, max {max(h):.1f}) | ratio of medians {mt/mh:.3f}")
v = verdict(lo, hi, "TUI slower", "TUI faster")
print(f"TUI/headless: median of pair ratios {S.median(r):.3f}, 95% bootstrap CI [{lo:.3f}, {hi:.3f}], n={len(r)}: {v}")
PY
