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

Usage: benches/pool_rounds.py RUN.json [RUN.json ...] [--columns tg,pp,pp_long,tg_depth]
       [--models NAME,...] [--out F.json]"""
import argparse, json, os, statistics, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pair_ci import median_ci  # noqa: E402

COLUMNS = ["tg", "pp", "pp_long", "ttft_ms", "tg_depth"]


def ratios(run, column):
    """{(model, threads): [cflow ÷ llama-bench per round]} of one run's raw samples."""
    by = {}
    for r in run["runs"]:
        if r.get("group", "main") not in ("main", "depth") or column not in r or r["engine"] not in ("cflow", "llama-bench"):
            continue
        by.setdefault((r["model"], r["threads"], r["round"]), {})[r["engine"]] = r[column]
    out = {}
    for (model, t, _), e in sorted(by.items()):
        c, l = e.get("cflow"), e.get("llama-bench")
        if isinstance(c, (int, float)) and isinstance(l, (int, float)) and l > 0:
            out.setdefault((model, t), []).append(c / l)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--columns", default="tg,pp,pp_long,tg_depth")
    ap.add_argument("--models", help="only these models (the runs' names, e.g. smollm2-q4_0)")
    ap.add_argument("--out")
    a = ap.parse_args()
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
    if not result:
        sys.exit("no rounds with both engines in these files for columns " + ", ".join(cols))
    if a.out:
        with open(a.out, "w") as fh:
            json.dump({"command": "benches/pool_rounds.py " + " ".join(sys.argv[1:]),
                       "runs": [{"file": f, "cflow_version": r.get("meta", {}).get("cflow_version"),
                                 "date": r.get("meta", {}).get("date")} for f, r in runs],
                       "cells": result}, fh, indent=1)
            fh.write("\n")


if __name__ == "__main__":
    main()
