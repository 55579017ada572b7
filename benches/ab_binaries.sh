#!/usr/bin/env bash
# Alternating A/B speed: OLD vs NEW binary, `bench decode --repeat 1 --json`, PAIRS pairs.
# Usage: OLD=bin NEW=bin PAIRS=7 THREADS=2 TOKENS=128 benches/ab_binaries.sh [MODEL] [extra args for both]
# METRIC=prefill compares prefill tok/s of a PROMPT-token prompt (default 256) instead of decode.
set -euo pipefail
OLD=${OLD:?}; NEW=${NEW:?}; PAIRS=${PAIRS:-7}; THREADS=${THREADS:-2}; TOKENS=${TOKENS:-128}
METRIC=${METRIC:-decode}; PROMPT=${PROMPT:-256}
case "$METRIC" in
  decode) key=decode_tok_s; extra=() ;;
  prefill) key=prefill_tok_s; extra=(--prompt-len "$PROMPT") ;;
  *) echo "METRIC must be decode or prefill, not $METRIC" >&2; exit 2 ;;
esac
model=("$@")
tok() { "$1" bench decode "${model[@]}" --threads "$THREADS" --repeat 1 --tokens "$TOKENS" --act q8 "${extra[@]}" --json 2>/dev/null \
  | python3 -c 'import json,sys; d=json.load(sys.stdin); r=d["rows"] if isinstance(d,dict) else d; print(r[0][sys.argv[1]]["median"])' "$key"; }
o=(); n=()
for i in $(seq 1 "$PAIRS"); do
  if (( i % 2 )); then o+=("$(tok "$OLD")"); n+=("$(tok "$NEW")"); else n+=("$(tok "$NEW")"); o+=("$(tok "$OLD")"); fi
  echo "pair $i: old ${o[-1]} new ${n[-1]}  [$(uptime | sed 's/.*load/load/')]"
done
PAIR_CI_DIR=$(dirname "$0") python3 - "${o[*]}" "${n[*]}" "$METRIC" <<'PY'
import os, statistics as S, sys
sys.path.insert(0, os.environ["PAIR_CI_DIR"])
from pair_ci import median_ci
o=[float(x) for x in sys.argv[1].split()]; n=[float(x) for x in sys.argv[2].split()]
m, lo, hi = median_ci([b/a for a,b in zip(o,n)])
print(f"{sys.argv[3]} tok/s: old median {S.median(o):.2f} (min {min(o):.2f} max {max(o):.2f}) | new median {S.median(n):.2f} (min {min(n):.2f} max {max(n):.2f})")
print(f"new/old: ratio of medians {S.median(n)/S.median(o):.3f}; median of pair ratios {m:.3f}, 95% bootstrap CI [{lo:.3f}, {hi:.3f}], n={len(o)}")
PY
