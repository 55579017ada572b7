#!/usr/bin/env python3
"""Pools the per-round ratios of several `vs_llamacpp.sh` runs (their `OUT` JSON files): for each
model, thread count and column, every round in which both engines ran gives one ratio, cflow ÷
llama-bench (for ttft_ms too, where below 1 is faster), paired by round as each run's own summary
pairs them. Prints, per cell, the
median over all the pooled rounds with its 95 % bootstrap interval (`pair_ci.median_ci`), the
min–max and the count n, and each file's own median.

On a host whose speed moves between rounds, one run's median of 2 or 3 rounds flips around a
threshold from run to run; pooling the rounds of runs of the same code gives the median more
rounds. Pool only runs whose code does not differ on the cells compared (their `meta`
`cflow_version` is printed).

With `--read-share X` (decode columns, tg and tg_depth) it also sets each round's decode rate
against that round's own read probe (the larger of its `membw` and 2 MiB-page samples at that
thread count): the bytes a token reads (weights and K/V, as `vs_llamacpp.py` counts them) times
tok/s, as % of the probe, for each engine, and the share cflow would need to be X × llama-bench
in that round. The probe is one short read per round, not a ceiling (an engine can read faster
than its round's probe); where the need sits near or past ~90 % in many rounds, the host's read
rate more than the engine decides whether the ratio reaches X. It also counts the rounds where
cflow itself read more than its round's probe.

Usage: benches/pool_rounds.py RUN.json [RUN.json ...] [--columns tg,pp,pp_long,tg_depth]
       [--models NAME,...] [--read-share X] [--out F.json]"""
import argparse, json, os, statistics, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pair_ci import median_ci  # noqa: E402
from vs_llamacpp import decode_bytes_per_token  # noqa: E402

COLUMNS = ["tg", "pp", "pp_long", "ttft_ms", "tg_depth"]

READ_SHARE_MEANING = (
    "measured: per round, an engine's decode tok/s x the bytes a token reads (weights + F16 K/V, "
    "vs_llamacpp.decode_bytes_per_token) as % of that round's read probe (the larger of its membw and "
    "2 MiB-page samples at that thread count; one short read, not a ceiling). 'rounds' lists "
    "[cflow %, llama-bench %, % needed for target x llama-bench] per round; the *_median fields are "
    "medians over them, rounds_* count rounds above 90 / 100 %.")


def by_round(run, column):
    """{(model, threads, round): {engine: value of `column`}} of one run's raw samples."""
    by = {}
    for r in run["runs"]:
        if r.get("group", "main") not in ("main", "depth") or column not in r:
            continue
        by.setdefault((r["model"], r["threads"], r["round"]), {})[r["engine"]] = r[column]
    return by


def ratios(run, column):
    """{(model, threads): [cflow ÷ llama-bench per round]} of one run's raw samples."""
    out = {}
    for (model, t, _), e in sorted(by_round(run, column).items()):
        c, l = e.get("cflow"), e.get("llama-bench")
        if isinstance(c, (int, float)) and isinstance(l, (int, float)) and l > 0:
            out.setdefault((model, t), []).append(c / l)
    return out


def read_shares(run, column, target):
    """{(model, threads): [(cflow %, llama-bench %, % needed for `target` ×) per round]}: each
    engine's decode bytes per second as % of the round's best read probe (decode columns only)."""
    st = run.get("settings", {})
    probes = {}
    for key in ("membw_samples", "membw_huge_samples"):
        for t, v in run.get(key, {}).items():
            for rd, g in enumerate(v):
                probes[(int(t), rd)] = max(probes.get((int(t), rd), 0), g or 0)
    per_tok = {}
    for m in run.get("models", []):
        b = m.get("bytes") if isinstance(m, dict) else None
        if b:
            per_tok[m["name"]] = decode_bytes_per_token(
                b, column, st.get("prompt_len", 8), st.get("depth", 4096), st.get("tokens", 128))
    out = {}
    for (model, t, rd), e in sorted(by_round(run, column).items()):
        c, l, g = e.get("cflow"), e.get("llama-bench"), probes.get((t, rd))
        if not (c and l and g and model in per_tok):
            continue
        pct = lambda tok_s: 100 * tok_s * per_tok[model] / (g * 1e9)  # noqa: E731
        out.setdefault((model, t), []).append((pct(c), pct(l), pct(target * l)))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--columns", default="tg,pp,pp_long,tg_depth")
    ap.add_argument("--models", help="only these models (the runs' names, e.g. smollm2-q4_0)")
    ap.add_argument("--read-share", type=float, metavar="X", default=None,
                    help="for tg/tg_depth, each round's rates as %% of that round's read probe, and the share X × llama-bench needs")
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.read_share is not None and a.read_share <= 0:
        sys.exit("--read-share takes a ratio above 0, e.g. 2")
    cols = a.columns.split(",")
    for c in cols:
        if c not in COLUMNS:
            sys.exit(f"unknown column {c!r}; one of {', '.join(COLUMNS)}")
    if len(set(map(os.path.realpath, a.runs))) < len(a.runs):
        sys.exit("a file is given twice: its rounds would count twice")
    only = set(a.models.split(",")) if a.models else None
    runs = []
    for f in a.runs:
        try:
            with open(f) as fh:
                runs.append((f, json.load(fh)))
        except (OSError, ValueError) as e:
            sys.exit(f"{f}: {e}")
        if "runs" not in runs[-1][1]:
            sys.exit(f"{f}: no 'runs' (not a vs_llamacpp.sh OUT file)")
    for f, r in runs:
        print(f"{f}: {r.get('meta', {}).get('cflow_version', '?')}, {r.get('meta', {}).get('date', '?')}")
    labels = {}
    for _, r in runs:
        for m in r.get("models", []):
            if isinstance(m, dict) and "name" in m:
                labels[m["name"]] = m.get("label", m["name"])
    result = []
    for c in cols:
        pooled = {}
        per_file = {}
        for f, r in runs:
            for k, v in ratios(r, c).items():
                if only is not None and k[0] not in only:
                    continue
                pooled.setdefault(k, []).extend(v)
                per_file.setdefault(k, []).append((f, statistics.median(v), len(v)))
        if not pooled:
            continue
        print(f"\n{c} (cflow ÷ llama-bench per round)")
        print(f"{'model':<32} {'threads':>7} {'pooled median [95 % CI] (min–max)':>36} {'n':>3}   per run")
        for (model, t), v in sorted(pooled.items()):
            med, lo, hi = median_ci(v)
            runs_s = ", ".join(f"{m:.2f} (n={n})" for _, m, n in per_file[(model, t)])
            print(f"{labels.get(model, model):<32} {t:>7} {med:>6.2f} [{lo:.2f}, {hi:.2f}] ({min(v):.2f}–{max(v):.2f}) "
                  f"{len(v):>3}   {runs_s}")
            result.append({"column": c, "model": model, "threads": t, "median": round(med, 3),
                           "ci95": [round(lo, 3), round(hi, 3)],
                           "min": round(min(v), 3), "max": round(max(v), 3), "n": len(v),
                           "ratios": [round(x, 3) for x in v],
                           "per_run": [{"file": f, "median": round(m, 3), "n": n} for f, m, n in per_file[(model, t)]]})
    shares = []
    if a.read_share and not {"tg", "tg_depth"} & set(cols):
        print("\n--read-share: no decode column (tg, tg_depth) in --columns; nothing to set against the probes")
    for c in cols if a.read_share else []:
        if c not in ("tg", "tg_depth"):
            continue
        pooled = {}
        for _, r in runs:
            for k, v in read_shares(r, c, a.read_share).items():
                if only is None or k[0] in only:
                    pooled.setdefault(k, []).extend(v)
        if not pooled:
            continue
        x = a.read_share
        print(f"\n{c}: % of each round's read probe (median over rounds); {x:g}x llama-bench needs")
        print(f"{'model':<32} {'threads':>7} {'cflow':>6} {'llama':>6} {'needs':>6} {'>90 %':>6} {'>100 %':>7}"
              f" {'cflow >100 %':>13} {'n':>3}")
        for (model, t), v in sorted(pooled.items()):
            cf, ll, need = (statistics.median(z[i] for z in v) for i in range(3))
            over90, over100 = sum(z[2] > 90 for z in v), sum(z[2] > 100 for z in v)
            cf100 = sum(z[0] > 100 for z in v)
            print(f"{labels.get(model, model):<32} {t:>7} {cf:>5.0f}% {ll:>5.0f}% {need:>5.0f}% {over90:>6} {over100:>7}"
                  f" {cf100:>13} {len(v):>3}")
            shares.append({"column": c, "model": model, "threads": t, "target": x,
                           "cflow_pct_median": round(cf, 1), "llama_pct_median": round(ll, 1),
                           "needed_pct_median": round(need, 1), "rounds_needing_over_90": over90,
                           "rounds_needing_over_100": over100, "rounds_cflow_over_100": cf100, "n": len(v),
                           "rounds": [[round(z[0], 1), round(z[1], 1), round(z[2], 1)] for z in v]})
    if not result:
        sys.exit("no rounds with both engines in these files for columns " + ", ".join(cols))
    if a.out:
        with open(a.out, "w") as fh:
            json.dump({"command": "benches/pool_rounds.py " + " ".join(sys.argv[1:]),
                       "runs": [{"file": f, "cflow_version": r.get("meta", {}).get("cflow_version"),
                                 "date": r.get("meta", {}).get("date")} for f, r in runs],
                       "cells": result,
                       **({"read_share_meaning": READ_SHARE_MEANING, "read_share": shares} if shares else {})},
                      fh, indent=1)
            fh.write("\n")


if __name__ == "__main__":
    main()
