#!/usr/bin/env python3
"""Where a prefill's time goes, cflow against llama.cpp, on one GGUF (issue 41's "if a target is
missed"): `perf record -e cpu-clock` of `cflow-tui bench decode -p P -n 1` and of
`llama-bench -p P -n 0`, each symbol put in a category (matmul kernels, attention, the rest;
start-up work such as the resident copy and the model hash is counted apart and left out of the
shares), and each category's time per prompt token = its share × (1 / the run's own tok/s).

Usage: benches/prefill_profile.py MODEL.gguf [--prompt 256,2048] [--threads 1] [--out F.json]
Environment: CFLOW_BIN [target/release/cflow-tui], LLAMA_BENCH [/tmp/anchor/llcpp-build/bin/llama-bench].
Needs `perf` (software events only; no hardware PMU is required)."""
import argparse, json, os, re, subprocess, sys, tempfile

CATS = [
    ("startup", r"clear_page|copy_to_iter|sha2|pack_tile|filemap|memcpy_orig|rep_movs|do_huge_pmd|"
                r"tokenizers|load_all_data|llama_model_loader|gguf_init"),
    ("attention", r"attention::|flash_attn|soft_max|softmax"),
    ("matmul", r"tile_matmul|tile_matvec|packed_amx|packed::avx512|kquant|gemm|gemv|tinyBLAS|"
               r"tiled_run_micro|vec_dot|mul_mat"),
]

def categorize(report):
    shares = {c: 0.0 for c, _ in CATS}
    shares["other"] = 0.0
    top = []
    for line in report.splitlines():
        m = re.match(r"\s*([0-9.]+)%\s+\S+\s+\[[.k]\]\s+(.*\S)", line)
        if not m:
            continue
        pct, sym = float(m.group(1)), m.group(2)
        cat = next((c for c, rx in CATS if re.search(rx, sym)), "other")
        shares[cat] += pct
        if len(top) < 8:
            top.append({"symbol": sym[:120].strip(), "pct": pct, "category": cat})
    return shares, top

def perf(cmd, env=None, sampling=("-F", "2000"), report=()):
    """`perf record -e cpu-clock` of `cmd` (its `sampling` arguments), then `perf report` by
    shared object and symbol (plus `report`); returns (cmd's stdout, the report). Shared with
    depth_profile.py."""
    with tempfile.NamedTemporaryFile(suffix=".data", delete=False) as f:
        data = f.name
    out = subprocess.run(["perf", "record", "-e", "cpu-clock", *sampling, "-o", data, "--"] + cmd,
                         capture_output=True, text=True, env=env)
    if out.returncode != 0:
        sys.exit(f"perf record failed: {' '.join(cmd)}\n{out.stderr[-2000:]}")
    rep = subprocess.run(["perf", "report", "-i", data, "--no-children", "--sort", "dso,symbol",
                          *report, "--stdio"], capture_output=True, text=True).stdout
    os.unlink(data)
    return out.stdout, rep

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--prompt", default="256,2048")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out")
    a = ap.parse_args()
    if not os.path.isfile(a.model):
        sys.exit(f"{a.model}: no such file")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cflow = os.environ.get("CFLOW_BIN", os.path.join(repo, "target/release/cflow-tui"))
    llama = os.environ.get("LLAMA_BENCH", "/tmp/anchor/llcpp-build/bin/llama-bench")
    env = dict(os.environ, LD_LIBRARY_PATH=os.path.dirname(llama))
    rows = []
    for p in [int(x) for x in a.prompt.split(",")]:
        out, rep = perf([cflow, "bench", "decode", a.model, "-p", str(p), "-n", "1", "-r", "3",
                         "-t", str(a.threads), "--json"])
        tok_s = json.loads(out)["rows"][0]["prefill_tok_s"]["median"]
        rows.append(("cflow", p, tok_s, rep))
        out, rep = perf([llama, "-m", a.model, "-p", str(p), "-n", "0", "-t", str(a.threads),
                         "-r", "3", "-o", "json"], env=env)
        tok_s = json.loads(out)[0]["avg_ts"]
        rows.append(("llama.cpp", p, tok_s, rep))
    result = {"model": os.path.basename(a.model), "threads": a.threads, "rows": []}
    print(f"{'engine':<10} {'prompt':>6} {'tok/s':>8} {'matmul ms/tok':>14} {'attention':>10} {'other':>8}")
    for eng, p, tok_s, rep in rows:
        shares, top = categorize(rep)
        compute = sum(v for k, v in shares.items() if k != "startup") or 1.0
        ms = {k: round(shares[k] / compute * 1000.0 / tok_s, 3) for k in ("matmul", "attention", "other")}
        result["rows"].append({"engine": eng, "prompt": p, "prefill_tok_s": round(tok_s, 1),
                               "ms_per_token": ms, "startup_pct_of_samples": round(shares["startup"], 2),
                               "top_symbols": top})
        print(f"{eng:<10} {p:>6} {tok_s:>8.1f} {ms['matmul']:>14.3f} {ms['attention']:>10.3f} {ms['other']:>8.3f}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")

if __name__ == "__main__":
    main()
