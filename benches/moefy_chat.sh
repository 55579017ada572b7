#!/usr/bin/env bash
# moefy_chat.sh - the chat half of moefy's default rule (docs/MOE.md, "The default"): five
# factual prompts, greedy (`run --chat --temperature 0 --repeat-penalty 1.1`, chat's default
# penalty, 40 tokens), on the dense model and on
# each MoE given; a MoE "answers as the dense model does" on a prompt when its reply contains
# the same key fact (a keyword per prompt, case-insensitive) exactly when the dense reply does.
# Writes the replies and verdicts as JSON (OUT, default docs/data/moefy_chat.json).
# Usage: benches/moefy_chat.sh DENSE.cflow MOE.cflow [MOE.cflow ...]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/cflow-tui}
OUT=${OUT:-docs/data/moefy_chat.json}
N=${N:-40}
[ $# -ge 2 ] || { echo "usage: $0 DENSE.cflow MOE.cflow [MOE.cflow ...]" >&2; exit 2; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
prompts=(
  "What is the capital of France?|paris"
  "Who wrote the play Romeo and Juliet?|shakespeare"
  "What is the chemical symbol for water?|h2o"
  "What is the tallest mountain in the world?|everest"
  "Which planet is known as the Red Planet?|mars"
)
i=0
for m in "$@"; do
  for p in "${prompts[@]}"; do
    q=${p%%|*}
    "$BIN" run "$m" --chat --prompt "$q" -n "$N" --temperature 0 --repeat-penalty 1.1 --threads 1 2>/dev/null > "$tmp/$i.txt" || true
    i=$((i + 1))
  done
done
python3 - "$tmp" "$OUT" "$N" "${prompts[@]}" -- "$@" <<'PY'
import json, sys, os
args = sys.argv[1:]
tmp, out, n = args[0], args[1], int(args[2])
sep = args.index("--")
prompts = [p.split("|") for p in args[3:sep]]
models = args[sep + 1:]
replies = {}
i = 0
for m in models:
    replies[m] = []
    for _ in prompts:
        replies[m].append(open(os.path.join(tmp, f"{i}.txt"), errors="replace").read().strip())
        i += 1
def has(reply, keys):
    r = reply.lower()
    return any(k in r for k in keys)
dense = models[0]
rows = []
for m in models:
    verdicts = []
    for (q, *keys), rep, drep in zip(prompts, replies[m], replies[dense]):
        verdicts.append({"prompt": q, "keywords": keys, "reply": rep,
                         "has_fact": has(rep, keys), "same_as_dense": has(rep, keys) == has(drep, keys)})
    rows.append({"model": os.path.basename(m), "dense": m == dense,
                 "same_as_dense": sum(v["same_as_dense"] for v in verdicts), "of": len(verdicts),
                 "prompts": verdicts})
json.dump({"tokens": n, "decoding": "greedy, repeat penalty 1.1, --chat (the model's template)", "rows": rows},
          open(out, "w"), indent=1, ensure_ascii=False)
for r in rows:
    facts = "".join("+" if v["has_fact"] else "-" for v in r["prompts"])
    print(f"{r['model']}: key facts {facts}; answers as dense {r['same_as_dense']}/{r['of']}")
PY
