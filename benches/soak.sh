#!/usr/bin/env bash
# Soak: the TUI on the demo model in tmux for MINUTES, recording a trace, resetting and
# re-prompting continuously while flipping prefetch / fetch / layout / tier at random between
# tokens. Samples RSS every 10 s. Afterwards: RSS after warm-up vs at the end, decode tok/s in the
# first and last five minutes (from the trace's Stats events), toggle count, and whether every
# generation in the trace produced the same tokens as a headless greedy run (all A/B arms must
# be bit-identical).
set -euo pipefail
BIN=${BIN:-$(pwd)/target/release/cflow-tui}
MINUTES=${MINUTES:-30}
OUT=${OUT:-/tmp/cflow-soak}
N=${N:-64}
mkdir -p "$OUT"; rm -f "$OUT"/*
T="$OUT/soak.trace.jsonl"
tmux kill-session -t cflow-soak 2>/dev/null || true
tmux new-session -d -s cflow-soak -x 160 -y 48 "$BIN --record $T --max-tokens $N --expert-tier direct; echo EXITED \$? > $OUT/exit; sleep 5"
sleep 3
PID=$(pgrep -n -x cflow-tui)   # the TUI itself (not the tmux shell wrapper)
end=$(( $(date +%s) + MINUTES * 60 ))
keys=(p s l t)
toggles=0
while [ "$(date +%s)" -lt "$end" ]; do
    tmux send-keys -t cflow-soak M-x            # reset the context (Alt+x)
    tmux send-keys -t cflow-soak i
    tmux send-keys -t cflow-soak -l "Once upon a time"; tmux send-keys -t cflow-soak Enter
    sleep 0.05; tmux send-keys -t cflow-soak Tab
    for _ in 1 2 3; do
        sleep 0.0$((RANDOM % 9 + 1))
        tmux send-keys -t cflow-soak "${keys[RANDOM % 4]}"; toggles=$((toggles + 1))
    done
    sleep 0.3
    echo "$(date +%s) $(ps -o rss= -p "$PID" 2>/dev/null || echo 0)" >> "$OUT/rss.txt"
done
tmux send-keys -t cflow-soak Escape; sleep 0.5; tmux send-keys -t cflow-soak Tab q
sleep 2
echo "toggle keys sent: $toggles" | tee "$OUT/summary.txt"
cat "$OUT/exit" 2>/dev/null | tee -a "$OUT/summary.txt" || echo "no exit code (hung?)" | tee -a "$OUT/summary.txt"
python3 - "$T" "$OUT/rss.txt" "$BIN" <<'PY' | tee -a "$OUT/summary.txt"
import json, subprocess, sys, statistics
trace, rssf, binp = sys.argv[1:4]
lines = open(trace).read().splitlines()
evs = [json.loads(l) for l in lines[1:]]
t_end = max(e["t_ns"] for e in evs)
stats = [e for e in evs if e["kind"] == "stats"]
def tps(a, b):
    s = [e["ns_total"] for e in stats if a <= e["t_ns"] < b]
    return len(s) / (sum(s) / 1e9) if s else float("nan"), len(s)
first, nf = tps(0, 300e9)
last, nl = tps(t_end - 300e9, t_end + 1)
print(f"decode tok/s first 5 min {first:.1f} (n={nf}) · last 5 min {last:.1f} (n={nl}) · ratio {last/first:.3f}")
configs = [e for e in evs if e["kind"] == "config"]
print(f"config changes applied by the engine: {len(configs)}")
rss = [tuple(map(int, l.split())) for l in open(rssf) if len(l.split()) == 2 and l.split()[1] != "0"]
t0 = rss[0][0]
warm = [r for t, r in rss if t - t0 >= 120] or [r for _, r in rss]
print(f"RSS after warm-up (2 min) {warm[0]/1024:.1f} MiB · at end {warm[-1]/1024:.1f} MiB · growth {100*(warm[-1]/warm[0]-1):+.2f}% · max {max(r for _, r in rss)/1024:.1f} MiB")
# Tokens per generation (between prompt and done).
# Only generations whose prompt is exactly the driver's text (keystrokes typed while the input box
# was busy can merge into "Once upon a timeOnce upon a time"; those are a different prompt).
gens, cur, other = [], None, 0
for e in evs:
    if e["kind"] == "prompt":
        cur = [] if e["text"] == "Once upon a time" else None
        other += cur is None
    elif e["kind"] == "token" and cur is not None: cur.append(e["id"])
    elif e["kind"] == "done" and cur is not None:
        if e["reason"] == "length": gens.append(tuple(cur))
        cur = None
ref = json.loads(subprocess.run([binp, "run", "--prompt", "Once upon a time", "-n", str(len(gens[0]) if gens else 64), "--json"], capture_output=True, text=True).stdout)["tokens"]
same = sum(1 for g in gens if list(g) == ref[:len(g)])
print(f"complete generations of the driver prompt: {len(gens)} · identical to the headless greedy run: {same} · (prompts merged by the keystroke driver, not compared: {other})")
# The replayer reads the whole trace back: same token ids, in order, as the recorded events.
rep = json.loads(subprocess.run([binp, "replay", "--summary", "--json", trace], capture_output=True, text=True).stdout)
recorded = [e["id"] for e in evs if e["kind"] == "token"]
print(f"replay: {len(rep['token_ids'])} tokens, identical to the {len(recorded)} recorded: {rep['token_ids'] == recorded} · warnings: {len(rep['warnings'])}")
PY
