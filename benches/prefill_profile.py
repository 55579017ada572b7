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
import argparse, json, os, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import profile_common as pc  # noqa: E402  (perf, categories, the subtraction, the geometry)
import vs_llamacpp  # noqa: E402  (its formulas; importing it needs no gguf)

# (category, symbol pattern, shared-object pattern); the first match wins. "startup" is a check.
CATS = [
    ("startup", r"clear_page|copy_to_iter|sha2|pack_tile|filemap|memcpy_orig|rep_movs|do_huge_pmd|"
                r"tokenizers|load_all_data|llama_model_loader|gguf_init", None),
    ("attention", r"attention::|attention_block|attention_bf16|flash_attn|soft_max|softmax", None),
    # A thread waiting for the others: cflow's pool (its workers spin, then park), llama.cpp's
    # barrier and OpenMP runtime (libgomp's spin has no symbol: matched by its shared object).
    ("waiting", r"pool::|ThreadPool|__rust_begin_short_backtrace|ggml_barrier|gomp_|omp_|sched_yield|"
                r"futex|do_idle", r"libgomp"),
    ("matmul", r"tile_matmul|tile_matvec|packed_amx|packed::avx512|kquant|gemm|gemv|tinyBLAS|"
               r"tiled_run_micro|vec_dot|mul_mat", None),
]


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
    b = pc.geometry(a.model)  # exits with a message when no gguf-py is found
    reps = a.repeats

    def cflow_run(p, r):
        out, rep = pc.perf([cflow, "bench", "decode", a.model, "-p", str(p), "-n", "1", "-r", str(r),
                            "-t", str(a.threads), "--json"])
        return json.loads(out)["rows"][0]["prefill_tok_s"]["median"], rep

    def llama_run(p, r):
        out, rep = pc.perf([llama, "-m", a.model, "-p", str(p), "-n", "0", "-t", str(a.threads),
                            "-r", str(r), "-o", "json"], env=env)
        return json.loads(out)[0]["avg_ts"], rep

    result = {"model": os.path.basename(a.model), "threads": a.threads, "repeats": reps,
              "perf_period_ns": pc.PERIOD_NS, "command": "benches/prefill_profile.py " + " ".join(sys.argv[1:]),
              "categories": {c: [rx, drx] for c, rx, drx in CATS}, "rows": []}
    print(f"{'engine':<10} {'prompt':>6} {'tok/s':>8} {'matmul':>8} {'GFLOP/s':>8} {'attention':>10} "
          f"{'GFLOP/s':>8} {'waiting':>8} {'other':>8}   (CPU ms per prompt token; check: startup)")
    for p in prompts:
        flops = {"matmul": 2 * b["layer_matrix_params"],
                 "attention": sum(vs_llamacpp.attention_flops(b, q) for q in range(p)) / p}
        for eng, run in (("cflow", cflow_run), ("llama.cpp", llama_run)):
            tok_s, long_rep = run(p, reps)
            _, short_rep = run(p, 1)
            ms, top = pc.subtract(long_rep, short_rep, CATS, (reps - 1) * p)
            gf = {k: round(flops[k] / (ms[k] / 1e3) / 1e9, 1) if ms[k] > 0 else None for k in flops}
            result["rows"].append({"engine": eng, "prompt": p, "prefill_tok_s": round(tok_s, 1),
                                   "cpu_ms_per_token": ms, "flops_per_token": flops, "GFLOP_s": gf,
                                   "top_symbols_ms_per_token": top})
            print(f"{eng:<10} {p:>6} {tok_s:>8.1f} {ms['matmul']:>8.3f} {gf['matmul'] or 0:>8.1f} "
                  f"{ms['attention']:>10.3f} {gf['attention'] or 0:>8.1f} {ms['waiting']:>8.3f} {ms['other']:>8.3f}"
                  f"   startup {ms['startup']:.3f}", flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")

if __name__ == "__main__":
    main()
