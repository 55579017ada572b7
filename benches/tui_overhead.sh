#!/usr/bin/env bash
# Does rendering slow decode? Decode tok/s of the demo model with the TUI open (driven in tmux)
# vs headless `run`, alternating, REPEATS times each; both record a trace and the tok/s comes from
# `replay --summary --json` (Σ tokens / Σ decode time of the engine thread), so both arms are
# measured the same way. Prints per-run figures and the medians' ratio.
set -euo pipefail
BIN=${BIN:-target/release/cflow-tui}
REPEATS=${REPEATS:-5}
N=${N:-128}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"; tmux kill-session -t cflow-ovh 2>/dev/null || true' EXIT
tok_s() { "$BIN" replay --summary --json "$1" | python3 -c 'import json,sys; print(json.load(sys.stdin)["decode_tok_s"])'; }
tui=(); headless=()
for r in $(seq 1 "$REPEATS"); do
    t="$TMP/tui$r.jsonl"
    tmux kill-session -t cflow-ovh 2>/dev/null || true
    tmux new-session -d -s cflow-ovh -x 160 -y 48 "$BIN --record $t --max-tokens $N --no-pmu; sleep 30"
    sleep 2
    tmux send-keys -t cflow-ovh -l "Once upon a time"; tmux send-keys -t cflow-ovh Enter
    for _ in $(seq 1 600); do
        grep -q '"kind":"done"' "$t" 2>/dev/null && break; sleep 0.1
    done
    tmux send-keys -t cflow-ovh Tab; tmux send-keys -t cflow-ovh q; sleep 0.5
    tui+=("$(tok_s "$t")")
    h="$TMP/h$r.jsonl"
    "$BIN" run --prompt "Once upon a time" -n "$N" --record "$h" > /dev/null 2>&1
    headless+=("$(tok_s "$h")")
    echo "run $r: TUI ${tui[-1]} tok/s | headless ${headless[-1]} tok/s   [$(uptime | sed 's/.*load/load/')]"
done
python3 - "${tui[*]}" "${headless[*]}" <<'PY'
import statistics, sys
t = [float(x) for x in sys.argv[1].split()]; h = [float(x) for x in sys.argv[2].split()]
mt, mh = statistics.median(t), statistics.median(h)
print(f"median TUI {mt:.1f} tok/s (min {min(t):.1f}, max {max(t):.1f}) | headless {mh:.1f} (min {min(h):.1f}, max {max(h):.1f}) | TUI/headless {mt/mh:.3f}")
PY
