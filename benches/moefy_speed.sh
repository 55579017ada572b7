#!/usr/bin/env bash
# moefy_speed.sh - decode speed of a moefied model against its dense source, alternating
# A B A B (`bench decode --repeat 1`, one run per turn) at each thread count, both with the same
# --weights (WEIGHTS, default auto: each model's default, resident and repacked when it fits a
# quarter of available memory; mmap compares the file layout's kernels) and default numerics.
# Prints per thread count: each arm's median/min/max tok/s, the median of the pair ratios with
# its 95 % bootstrap CI (benches/pair_ci.py), and the
# FFN-bytes prediction (dense total bytes / MoE total bytes per token from `run --json`).
# With OUT=FILE.json, appends one row per thread count (every pair's tok/s, the ratios, the
# bytes prediction and the load average) to that JSON list.
# MOE_ARGS: extra flags for the MoE arm only, e.g. MOE_ARGS="--experts-used 8" (every expert: the
# dense model's bytes in the MoE's layout).
# Usage: PAIRS=6 TOKENS=64 [WEIGHTS=auto|mmap|resident] [MOE_ARGS=...] [OUT=F.json] benches/moefy_speed.sh DENSE.cflow MOE.cflow
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: [PAIRS=6 TOKENS=64 WEIGHTS=auto MOE_ARGS=... OUT=F.json] $0 DENSE.cflow MOE.cflow" >&2; exit 2; }
# The model paths as given (relative to the caller's directory), before moving to the repository.
dense=$(realpath -e -- "$1") || { echo "$0: no such model: $1" >&2; exit 2; }
moe=$(realpath -e -- "$2") || { echo "$0: no such model: $2" >&2; exit 2; }
[ -z "${OUT:-}" ] || OUT=$(realpath -m -- "$OUT")
[ -z "${BIN:-}" ] || BIN=$(realpath -e -- "$BIN")
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/cflow-tui}; PAIRS=${PAIRS:-6}; TOKENS=${TOKENS:-64}; WEIGHTS=${WEIGHTS:-auto}
tok() { "$BIN" bench decode "$1" --threads "$2" ${3:-} --repeat 1 --tokens "$TOKENS" --weights "$WEIGHTS" --json 2>/dev/null \
  | python3 -c 'import json,sys; d=json.load(sys.stdin); r=d["rows"] if isinstance(d,dict) else d; print(r[0]["decode_tok_s"]["median"])'; }
mib() { "$BIN" run "$1" ${2:-} --token-ids 1,2,3 -n 8 --json --weights "$WEIGHTS" 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["mib_per_token"]["total"])'; }
MOE_ARGS=${MOE_ARGS:-}
md=$(mib "$dense"); mm=$(mib "$moe" "$MOE_ARGS")
for t in ${THREADS:-1 2}; do
  a=(); b=()
  for i in $(seq 1 "$PAIRS"); do
    if (( i % 2 )); then a+=("$(tok "$dense" "$t")"); b+=("$(tok "$moe" "$t" "$MOE_ARGS")"); else b+=("$(tok "$moe" "$t" "$MOE_ARGS")"); a+=("$(tok "$dense" "$t")"); fi
  done
  PAIR_CI_DIR=benches python3 - "$t" "$md" "$mm" "${a[*]}" "${b[*]}" <<'PY'
import json, os, statistics as s, sys
sys.path.insert(0, os.environ["PAIR_CI_DIR"])
from pair_ci import median_ci
t, md, mm, a, b = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), list(map(float, sys.argv[4].split())), list(map(float, sys.argv[5].split()))
r = [y / x for x, y in zip(a, b)]
m, lo, hi = median_ci(r)
out = os.environ.get("OUT")
if out:
    rows = json.load(open(out)) if os.path.exists(out) and os.path.getsize(out) else []
    rows.append({"threads": int(t), "weights": os.environ.get("WEIGHTS", "auto"),
                 "moe_args": os.environ.get("MOE_ARGS", ""),
                 "dense_tok_s": a, "moe_tok_s": b, "pair_ratios": r,
                 "median_ratio": m, "ci95": [lo, hi], "bytes_predict": md / mm,
                 "dense_mib_per_token": md, "moe_mib_per_token": mm,
                 "load_avg": os.getloadavg()[0]})
    json.dump(rows, open(out, "w"), indent=1)
print(f"{t} thread(s), weights {os.environ.get('WEIGHTS','auto')}: dense {s.median(a):.1f} [{min(a):.1f}-{max(a):.1f}] tok/s, moe {s.median(b):.1f} [{min(b):.1f}-{max(b):.1f}]; "
      f"moe/dense median of pair ratios {m:.3f}, 95% bootstrap CI [{lo:.3f}, {hi:.3f}], min-max [{min(r):.3f}-{max(r):.3f}] (n={len(r)}); bytes predict {md/mm:.3f} ({md:.1f} vs {mm:.1f} MiB/token)")
PY
done
