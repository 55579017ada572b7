#!/usr/bin/env bash
# Does rendering slow decode? Decode tok/s of the demo model with the TUI open (driven in tmux)
# vs headless `run`, alternating, REPEATS times each; both record a trace and the tok/s comes from
# `replay --summary --json` (Σ tokens / Σ decode time of the engine thread), so both arms are
# measured the same way. Prints per-run figures and the medians' ratio, and the UI thread's own
# CPU time during the reply (/proc/PID/task/PID/schedstat, ns: the main thread draws the TUI),
# which machine load disturbs far less than tok/s.
set -euo pipefail
BIN=${BIN:-target/release/cflow-tui}
REPEATS=${REPEATS:-5}
N=${N:-128}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"; tmux kill-session -t cflow-ovh 2>/dev/null || true' EXIT
tok_s() { "$BIN" replay --summary --json "$1" | python3 -c 'import json,sys; print(json.load(sys.stdin)["decode_tok_s"])'; }
tui=(); headless=(); ui=()
# CPU ns of the TUI's main (drawing) thread: the child of the tmux pane's shell.
ui_ns() {
    local pp pid
    pp=$(tmux display -p -t cflow-ovh '#{pane_pid}')
    pid=$(pgrep -P "$pp" | head -1)
    awk '{print $1}' "/proc/$pid/task/$pid/schedstat"
}
for r in $(seq 1 "$REPEATS"); do
    t="$TMP/tui$r.jsonl"
    tmux kill-session -t cflow-ovh 2>/dev/null || true
    tmux new-session -d -s cflow-ovh -x 160 -y 48 "$BIN --record $t --max-tokens $N --no-pmu; sleep 30"
    for _ in $(seq 1 300); do
        grep -q '"kind":"settings"' "$t" 2>/dev/null && break; sleep 0.1
    done
    sleep 1
    u0=$(ui_ns); w0=$(date +%s%N)
    tmux send-keys -t cflow-ovh -l "Once upon a time"; tmux send-keys -t cflow-ovh Enter
    for _ in $(seq 1 600); do
        grep -q '"kind":"done"' "$t" 2>/dev/null && break; sleep 0.1
    done
    u1=$(ui_ns); w1=$(date +%s%N)
    ui+=("$(python3 -c "print(f'{100*($u1-$u0)/($w1-$w0):.2f}')")")
    tmux send-keys -t cflow-ovh Tab; tmux send-keys -t cflow-ovh q; sleep 0.5
    tui+=("$(tok_s "$t")")
    h="$TMP/h$r.jsonl"
    "$BIN" run --prompt "Once upon a time" -n "$N" --record "$h" > /dev/null 2>&1
    headless+=("$(tok_s "$h")")
    echo "run $r: TUI ${tui[-1]} tok/s (UI thread ${ui[-1]}% of a core) | headless ${headless[-1]} tok/s   [$(uptime | sed 's/.*load/load/')]"
done
python3 - "${tui[*]}" "${headless[*]}" "${ui[*]}" <<'PY'
import statistics, sys
t = [float(x) for x in sys.argv[1].split()]; h = [float(x) for x in sys.argv[2].split()]
u = [float(x) for x in sys.argv[3].split()]
print(f"UI thread CPU during the reply: median {statistics.median(u):.2f}% of a core (min {min(u):.2f}, max {max(u):.2f})")
mt, mh = statistics.median(t), statistics.median(h)
print(f"median TUI {mt:.1f} tok/s (min {min(t):.1f}, max {max(t):.1f}) | headless {mh:.1f} (min {min(h):.1f}, max {max(h):.1f}) | TUI/headless {mt/mh:.3f}")
PY
