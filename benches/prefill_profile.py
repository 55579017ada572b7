#!/usr/bin/env python3
"""Where a prefill's time goes, cflow against llama.cpp, on one GGUF (issue 41's "if a target is
missed"): `perf record -e cpu-clock -c 0.5ms` of `cflow-tui bench decode -p P -n 1` and of
`llama-bench -p P -n 0`, each symbol put in a category (matmul kernels, attention, waiting for
the other threads, the rest; start-up work such as the resident copy and the model hash is a
check that should come out near 0), once with R prompt repeats and once with 1: a category's CPU
ms per prompt token = (its samples in the long run − in the short one) × 0.5 ms ÷ ((R − 1) · P),
so start-up and warm-up cancel. At two threads the categories add up to both threads' CPU time.
The rates are each engine's own (the long run's).

Against the work: per prompt token, the layers' matmul FLOPs (2 per weight; the LM head runs for
the last token only) and the attention's (its mean over the causal positions), as GFLOP/s of each
category's CPU time (GGUF geometry: `vs_llamacpp.py bytes`, by `PYTHON`, as depth_profile.py).

Usage: benches/prefill_profile.py MODEL.gguf [--prompt 256,2048] [--threads 1] [--repeats 6] [--out F.json]
Environment: CFLOW_BIN [target/release/cflow-tui], LLAMA_BENCH [/tmp/anchor/llcpp-build/bin/llama-bench],
PYTHON [$ANCHOR_DIR/venv/bin/python, ANCHOR_DIR /tmp/anchor: a Python with gguf-py].
Needs `perf` (software events only; no hardware PMU is required)."""
import argparse, json, os, re, subprocess, sys, tempfile

CATS = [
    ("startup", r"clear_page|copy_to_iter|sha2|pack_tile|filemap|memcpy_orig|rep_movs|do_huge_pmd|"
                r"tokenizers|load_all_data|llama_model_loader|gguf_init"),
    ("attention", r"attention::|attention_block|attention_bf16|flash_attn|soft_max|softmax"),
    # A thread waiting for the others: cflow's pool (its workers spin, then park), llama.cpp's
    # barrier and OpenMP runtime (libgomp's spin has no symbol: matched by its shared object).
    ("waiting", r"pool::|ThreadPool|__rust_begin_short_backtrace|ggml_barrier|gomp_|omp_|sched_yield|"
                r"futex|do_idle|libgomp"),
    ("matmul", r"tile_matmul|tile_matvec|packed_amx|packed::avx512|kquant|gemm|gemv|tinyBLAS|"
               r"tiled_run_micro|vec_dot|mul_mat"),
]

PERIOD_NS = 500_000  # `perf record -c`: one sample per 0.5 ms of CPU time


def categorize(report):
    """Samples per category, and the top symbols, from `perf report -n` lines."""
    counts = {c: 0 for c, _ in CATS}
    counts["other"] = 0
    per_symbol = {}
    for line in report.splitlines():
        m = re.match(r"\s*[0-9.]+%\s+(\d+)\s+(\S+)\s+\[[.k]\]\s+(.*\S)", line)
        if not m:
            continue
        n, sym = int(m.group(1)), m.group(2) + " " + m.group(3)
        cat = next((c for c, rx in CATS if re.search(rx, sym)), "other")
        counts[cat] += n
        key = (sym[:120].strip(), cat)
        per_symbol[key] = per_symbol.get(key, 0) + n
    return counts, per_symbol


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
    ap.add_argument("--repeats", type=int, default=6, help="prompt repeats of the long run (the short one runs 1)")
    ap.add_argument("--out")
    a = ap.parse_args()
    if not os.path.isfile(a.model):
        sys.exit(f"{a.model}: no such file")
    try:
        prompts = [int(x) for x in a.prompt.split(",")]
    except ValueError:
        sys.exit(f"--prompt {a.prompt!r}: comma-separated token counts, e.g. 256,2048")
    if not prompts or min(prompts) < 1:
        sys.exit("--prompt: every prompt needs at least 1 token")
    if a.repeats < 2:
        sys.exit("--repeats must be at least 2 (the short run has 1)")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cflow = os.environ.get("CFLOW_BIN", os.path.join(repo, "target/release/cflow-tui"))
    llama = os.environ.get("LLAMA_BENCH", "/tmp/anchor/llcpp-build/bin/llama-bench")
    env = dict(os.environ, LD_LIBRARY_PATH=os.path.dirname(llama))
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import depth_profile, vs_llamacpp  # noqa: E402  (the geometry; importing them needs no gguf)
    geo = depth_profile.work(a.model, 0, 2)  # exits with a message when no gguf-py is found
    b = geo["geometry"]
    reps = a.repeats

    def cflow_run(p, r):
        out, rep = perf([cflow, "bench", "decode", a.model, "-p", str(p), "-n", "1", "-r", str(r),
                         "-t", str(a.threads), "--json"], sampling=("-c", str(PERIOD_NS)), report=("-n",))
        return json.loads(out)["rows"][0]["prefill_tok_s"]["median"], rep

    def llama_run(p, r):
        out, rep = perf([llama, "-m", a.model, "-p", str(p), "-n", "0", "-t", str(a.threads),
                         "-r", str(r), "-o", "json"], env=env, sampling=("-c", str(PERIOD_NS)), report=("-n",))
        return json.loads(out)[0]["avg_ts"], rep

    result = {"model": os.path.basename(a.model), "threads": a.threads, "repeats": reps,
              "perf_period_ns": PERIOD_NS, "command": "benches/prefill_profile.py " + " ".join(sys.argv[1:]),
              "categories": dict(CATS), "rows": []}
    print(f"{'engine':<10} {'prompt':>6} {'tok/s':>8} {'matmul':>8} {'GFLOP/s':>8} {'attention':>10} "
          f"{'GFLOP/s':>8} {'waiting':>8} {'other':>8}   (CPU ms per prompt token; check: startup)")
    for p in prompts:
        flops = {"matmul": 2 * b["layer_matrix_params"],
                 "attention": sum(vs_llamacpp.attention_flops(b, q) for q in range(p)) / p}
        for eng, run in (("cflow", cflow_run), ("llama.cpp", llama_run)):
            tok_s, long_rep = run(p, reps)
            _, short_rep = run(p, 1)
            (lc, lsym), (sc, ssym) = categorize(long_rep), categorize(short_rep)
            extra = (reps - 1) * p
            ms = {c: round((lc[c] - sc[c]) * PERIOD_NS / 1e6 / extra, 4) for c in lc}
            gf = {k: round(flops[k] / (ms[k] / 1e3) / 1e9, 1) if ms[k] > 0 else None for k in flops}
            top = sorted(((lsym.get(k, 0) - ssym.get(k, 0), k) for k in lsym), reverse=True)[:8]
            result["rows"].append({"engine": eng, "prompt": p, "prefill_tok_s": round(tok_s, 1),
                                   "cpu_ms_per_token": ms, "flops_per_token": flops, "GFLOP_s": gf,
                                   "top_symbols_ms_per_token": [
                                       {"symbol": k[0], "category": k[1], "ms": round(n * PERIOD_NS / 1e6 / extra, 4)}
                                       for n, k in top]})
            print(f"{eng:<10} {p:>6} {tok_s:>8.1f} {ms['matmul']:>8.3f} {gf['matmul'] or 0:>8.1f} "
                  f"{ms['attention']:>10.3f} {gf['attention'] or 0:>8.1f} {ms['waiting']:>8.3f} {ms['other']:>8.3f}"
                  f"   startup {ms['startup']:.3f}", flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")

if __name__ == "__main__":
    main()
