#!/usr/bin/env python3
"""Where a decode token's time goes at depth, cflow against llama.cpp, on one GGUF (issue 41's
"if a target is missed"): `perf record -e cpu-clock` of each engine filling D cached positions
and then decoding N tokens, and of the same engine filling them and decoding 2 tokens. Each
symbol's samples go to a category (weight matvecs, attention, waiting, other; by symbol, or by
shared object for libgomp's unnamed spin code); a category's CPU time per decoded token is (its
samples in the long run − in the short one) × the sample period (0.5 ms of CPU time) ÷ the
tokens decoded in addition, so the fill, the start-up and each engine's warm-up cancel. Two
checks are reported that should come out near 0: "fill" (the batched prompt kernels) and
"startup" (page clearing, hashing, the tokenizer).
`bench decode` decodes its N tokens twice (an untimed warm-up repeat, then the timed one),
llama-bench once (its warm-up is one token in both runs).

The decode rates are the engines' own (`bench decode --json` `decode_tok_s`, llama-bench's tg
`avg_ts`), from the long runs. At one thread the categories add up to about the wall time per
token; at two they add up to the CPU time of both threads (a spinning thread counts as waiting).
The subtraction leaves noise: each round's figures are kept, and the rounds alternate engines.

Against the work: a token's weight bytes and matvec FLOPs (2 per weight of every matrix, the LM
head's included), and the K/V bytes and attention FLOPs of its mean position (GGUF geometry:
`vs_llamacpp.py bytes`), each category's figures as GB/s and GFLOP/s of CPU time.

Usage: benches/depth_profile.py MODEL.gguf [MODEL.cflow] [--depth 4096] [--tokens 512]
       [--threads 1] [--rounds 2] [--out F.json]
Environment: CFLOW_BIN [target/release/cflow-tui], LLAMA_BENCH [/tmp/anchor/llcpp-build/bin/llama-bench],
PYTHON [$ANCHOR_DIR/venv/bin/python, ANCHOR_DIR /tmp/anchor: a Python with gguf-py].
Needs `perf` (software events only; no hardware PMU is required)."""
import argparse, json, os, statistics, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import profile_common as pc  # noqa: E402  (perf, categories, the subtraction, the geometry)
import vs_llamacpp  # noqa: E402  (its formulas; importing it needs no gguf)

# (category, symbol pattern, shared-object pattern); the first match wins. "fill" is the prompt
# kernels that fill the cache (cflow's batched ones, llama.cpp's repacked gemm): the subtraction
# should leave it near 0, and it is reported as a check, as is "startup".
CATS = [
    ("startup", r"clear_page|copy_to_iter|sha2|pack_tile|filemap|memcpy_orig|rep_movs|do_huge_pmd|"
                r"tokenizers|load_all_data|llama_model_loader|gguf_init|vocab|page_fault|"
                r"tokenizer|from_doc|serde|hashbrown|malloc|free", None),
    ("fill", r"run_batch|run_k_batch|tile_matmul|attention_block|packed_amx|kquant_batch|gemm_", None),
    ("attention", r"attention::|attention_bf16|flash_attn|soft_max|softmax|vec_dot_f16|vec_mad_f16|"
                  r"expf", None),
    ("waiting", r"pool::|ThreadPool|crossbeam|ggml_barrier|gomp_|omp_|sched_yield|futex|__sched|"
                r"do_idle|pv_native|__rust_begin_short_backtrace", r"libgomp"),
    ("weight matvecs", r"tile_matvec|packed::|kquant|gemv|tinyBLAS|tiled_run_micro|vec_dot|mul_mat|"
                       r"matvec|dot::", None),
]
REPORTED = ["weight matvecs", "attention", "waiting", "other"]


def work(gguf_path, depth, tokens):
    """A decode token's work (`vs_llamacpp.py bytes`, run by a Python with gguf-py): weight bytes
    and matvec FLOPs; K/V bytes and attention FLOPs at the mean position of the timed tokens."""
    b = pc.geometry(gguf_path)
    return {"weight_bytes": b["weight_bytes_per_token"],
            "matvec_flops": 2 * (b["layer_matrix_params"] + b["lm_head_params"]),
            "kv_bytes": round(vs_llamacpp.kv_read_bytes(b, depth, tokens)),
            "attention_flops": vs_llamacpp.attention_flops(b, depth + tokens // 2), "geometry": b}


def rates(ms, w):
    """GB/s and GFLOP/s of the weight matvecs and the attention, from CPU ms per token."""
    r = {}
    for cat, by, fl in (("weight matvecs", "weight_bytes", "matvec_flops"),
                        ("attention", "kv_bytes", "attention_flops")):
        t = ms[cat] / 1e3
        r[cat] = {"GB_s": round(w[by] / t / 1e9, 2), "GFLOP_s": round(w[fl] / t / 1e9, 2)} if t > 0 else None
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gguf")
    ap.add_argument("cflow_model", nargs="?", help="the .cflow of the same file (default: the GGUF)")
    ap.add_argument("--depth", type=int, default=4096)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out")
    a = ap.parse_args()
    for p in [a.gguf] + ([a.cflow_model] if a.cflow_model else []):
        if not os.path.isfile(p):
            sys.exit(f"{p}: no such file")
    if a.tokens <= 2:
        sys.exit("--tokens must be above 2 (the short run decodes 2)")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cflow = os.environ.get("CFLOW_BIN", os.path.join(repo, "target/release/cflow-tui"))
    llama = os.environ.get("LLAMA_BENCH", "/tmp/anchor/llcpp-build/bin/llama-bench")
    env = dict(os.environ, LD_LIBRARY_PATH=os.path.dirname(llama))
    model = a.cflow_model or a.gguf
    t, d = str(a.threads), str(a.depth)
    w = work(a.gguf, a.depth, a.tokens)
    print(f"a token's work: {w['weight_bytes'] / 1e6:.1f} MB of weights, {w['matvec_flops'] / 1e9:.3f} GFLOP of matvecs; "
          f"{w['kv_bytes'] / 1e6:.2f} MB of K/V, {w['attention_flops'] / 1e9:.3f} GFLOP of attention (mean position)", flush=True)

    def cflow_run(n):
        out, rep = pc.perf([cflow, "bench", "decode", model, "--depth", d, "--tokens", str(n),
                         "--repeat", "1", "-t", t, "--json"], env)
        return json.loads(out)["rows"][0]["decode_tok_s"]["median"], rep, 2 * n

    def llama_run(n):
        out, rep = pc.perf([llama, "-m", a.gguf, "-p", "0", "-n", str(n), "-d", d, "-t", t, "-r", "1",
                         "-o", "json"], env)
        return json.loads(out)[0]["avg_ts"], rep, n

    engines = [("cflow", cflow_run), ("llama.cpp", llama_run)]
    rounds = []
    for r in range(a.rounds):
        order = engines if r % 2 == 0 else engines[::-1]
        row = {}
        for name, run in order:
            tok_s, long_rep, n_long = run(a.tokens)
            _, short_rep, n_short = run(2)
            extra = n_long - n_short
            ms, top = pc.subtract(long_rep, short_rep, CATS, extra)
            row[name] = {"decode_tok_s": round(tok_s, 2), "wall_ms_per_token": round(1000.0 / tok_s, 3),
                         "cpu_ms_per_token": ms, "top_symbols_ms_per_token": top}
            print(f"round {r + 1} {name:<10} {tok_s:7.2f} tok/s, wall {1000.0 / tok_s:6.2f} ms/token; CPU ms/token: "
                  + ", ".join(f"{c} {ms[c]:.2f}" for c in REPORTED)
                  + f" (checks, ~0: fill {ms['fill']:.2f}, startup {ms['startup']:.2f})", flush=True)
        rounds.append(row)
    cats = REPORTED + ["fill", "startup"]
    summary = {}
    for name, _ in engines:
        summary[name] = {"wall_ms_per_token": statistics.median(x[name]["wall_ms_per_token"] for x in rounds),
                         "cpu_ms_per_token": {c: statistics.median(x[name]["cpu_ms_per_token"][c] for x in rounds)
                                              for c in cats}}
    print(f"\nmedian over {a.rounds} rounds, ms per token at depth {a.depth}, {a.threads} thread(s):")
    print(f"{'engine':<10} {'wall':>7} " + " ".join(f"{c:>15}" for c in cats))
    for name, s in summary.items():
        print(f"{name:<10} {s['wall_ms_per_token']:7.2f} " + " ".join(f"{s['cpu_ms_per_token'][c]:15.2f}" for c in cats))
    print("\nagainst the work (CPU time of each category):")
    for name, s in summary.items():
        s["rates"] = rates(s["cpu_ms_per_token"], w)
        print(f"{name:<10} " + "; ".join(f"{c}: {v['GB_s']:.1f} GB/s, {v['GFLOP_s']:.1f} GFLOP/s" if v else f"{c}: -"
                                         for c, v in s["rates"].items()))
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"model": os.path.basename(a.gguf), "depth": a.depth, "tokens": a.tokens,
                       "threads": a.threads, "work_per_token": w, "perf_period_ns": pc.PERIOD_NS, "categories": {c: [rx, drx] for c, rx, drx in CATS},
                       "command": "benches/depth_profile.py " + " ".join(sys.argv[1:]),
                       "rounds": rounds, "summary": summary}, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
