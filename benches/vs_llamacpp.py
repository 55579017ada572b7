#!/usr/bin/env python3
"""Side-by-side benchmark: llama.cpp (llama-bench) vs cflow-tui on the same model (issue 18 §4).

Normally called by benches/vs_llamacpp.sh. Subcommands:

  compare GGUF [--cflow FILE.cflow] [--threads 1,2] [--repeats 5] [--tokens 128] ...
      The harness. For each round and each thread count T it runs, alternating, one process each:
        membw      OMP_NUM_THREADS=T MEMBW 1024 5 ("read best" GB/s: the roofline, same run)
        cflow-tui bench membw --threads T --json   (the same read over 2 MiB pages, the kind of
                   memory the resident weights live in: "paired 2M")
        llama-bench -m GGUF -t T -p 256 -n 128 -r 1 -o json          (tg128 and pp256)
        [llama-cpp-python worker, with --llama-python]
        cflow-tui bench decode FILE.cflow --threads T --act M --tokens 128 --prompt-len 8
            --repeat 1 --json                    (decode tok/s), and --tokens 1 --prompt-len 256
            (prefill tok/s), for M = the default numerics (the `act` that `bench decode --json`
            reports without --act) and then the other mode.
      It prints one table: per thread count and engine, decode and prefill tok/s median
      (min-max) over the rounds, the median of the per-round ratios to llama-bench, effective
      GB/s (weight bytes/token from the GGUF tensor sizes) and % of the roofline: against the
      best membw of the run ("roofline") and, round by round, against that round's membw
      ("paired", the median over rounds), and round by round against that round's huge-page
      read ("paired 2M"). membw's buffer is in 4 KiB pages, which under KVM cost two-level page
      walks that the weights' 2 MiB pages do not: it can read less than decode streams.
      --depth D compares decode at long context instead: llama-bench -p 0 -n 128 -d D against
      `bench decode --prompt-len D --tokens 128` (the KV cache holds D positions before the first
      timed step); no prefill is measured then.
  llama-worker GGUF --threads T [--tokens 128] [--prompt-len 8] [--prefill-len 256]
      One llama.cpp sample through llama-cpp-python, printed as one JSON line. One untimed
      warm-up round, then: prefill = one llama_decode of a 256-token batch; decode = an 8-token
      prompt batch, then 128 single-token llama_decode calls, greedy argmax, EOS ignored; tok/s =
      n_eval / t_eval from llama_perf_context, and by wall clock. Prompt ids are
      (i*7919 + 13) % n_vocab, the synthetic prompt `cflow-tui bench decode` uses.
  bytes GGUF
      Weight bytes read per decoded token: every tensor except token_embd, plus token_embd read
      in full when it is tied (no output.weight: it is the LM head) or one row (get_rows) when not.

Every sample records the 1-minute load average: the machine is shared, numbers are noisy.
"""
import argparse
import ctypes
import json
import os
import re
import statistics
import subprocess
import sys
import time

PROMPT_SEED = (7919, 13)  # ids (i*7919 + 13) % vocab, as in cflow-tui's `bench decode`
LLAMA_ENV = {"OMP_PROC_BIND": "close", "OMP_PLACES": "cores"}


def synthetic_prompt(n, vocab):
    a, b = PROMPT_SEED
    return [(i * a + b) % vocab for i in range(n)]


# ----------------------------------------------------------------------------- bytes/token
def bytes_per_token(gguf_path):
    import gguf

    r = gguf.GGUFReader(gguf_path)
    names = {t.name for t in r.tensors}
    tied = "output.weight" not in names
    other, emb_full, emb_row = 0, 0, 0
    for t in r.tensors:
        n = int(t.n_bytes)
        if t.name == "token_embd.weight":
            emb_full = n
            emb_row = n // int(t.shape[-1])  # gguf shape is [n_embd, n_vocab]
        else:
            other += n
    total = other + (emb_full if tied else emb_row)

    def field(key):
        f = r.fields.get(key)
        return None if f is None else f.contents()

    arch = field("general.architecture")
    n_layer = field(f"{arch}.block_count")
    n_head = field(f"{arch}.attention.head_count")
    n_kv = field(f"{arch}.attention.head_count_kv") or n_head
    d = field(f"{arch}.embedding_length")
    kv_per_pos = 2 * n_layer * n_kv * (d // n_head) * 2  # K and V, F16
    return dict(path=gguf_path, tied_embedding=tied, non_embedding_bytes=other,
                embedding_bytes_read=emb_full if tied else emb_row, weight_bytes_per_token=total,
                kv_bytes_per_position=kv_per_pos,
                types=sorted({t.tensor_type.name for t in r.tensors}))


# ----------------------------------------------------------------------------- llama.cpp worker
def llama_worker(a):
    import numpy as np
    import llama_cpp as L

    @L.llama_log_callback
    def quiet(level, text, user_data):
        pass

    L.llama_log_set(quiet, ctypes.c_void_p())
    L.llama_backend_init()
    model = L.llama_model_load_from_file(a.gguf.encode(), L.llama_model_default_params())
    if not model:
        sys.exit(f"failed to load {a.gguf}")
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    cp = L.llama_context_default_params()
    cp.n_ctx = max(512, a.prefill_len + 8, a.prompt_len + a.tokens + 8)
    cp.n_batch = cp.n_ubatch = max(a.prefill_len, a.prompt_len)
    cp.n_threads = cp.n_threads_batch = a.threads
    cp.no_perf = False
    ctx = L.llama_init_from_model(model, cp)
    mem = L.llama_get_memory(ctx)

    def batch_decode(ids):
        arr = (L.llama_token * len(ids))(*ids)
        if L.llama_decode(ctx, L.llama_batch_get_one(arr, len(ids))) != 0:
            raise RuntimeError("decode failed")

    def argmax_last():
        return int(np.argmax(np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, -1), shape=(n_vocab,))))

    long_prompt = synthetic_prompt(a.prefill_len, n_vocab)
    short_prompt = synthetic_prompt(a.prompt_len, n_vocab)
    out = {}
    for rnd in range(2):  # round 0 = warm-up
        # prefill: one batch of prefill_len tokens
        L.llama_memory_clear(mem, True)
        L.llama_perf_context_reset(ctx)
        t0 = time.perf_counter()
        batch_decode(long_prompt)
        L.llama_synchronize(ctx)  # perf stats are booked at synchronize
        wall_pre = time.perf_counter() - t0
        pd = L.llama_perf_context(ctx)
        pre_perf = 1000.0 * pd.n_p_eval / pd.t_p_eval_ms if pd.t_p_eval_ms > 0 else None
        # decode: short prompt batch, then single-token greedy steps
        L.llama_memory_clear(mem, True)
        batch_decode(short_prompt)
        tok = argmax_last()
        L.llama_perf_context_reset(ctx)
        seq = []
        one = (L.llama_token * 1)()
        t0 = time.perf_counter()
        for _ in range(a.tokens):
            one[0] = tok
            if L.llama_decode(ctx, L.llama_batch_get_one(one, 1)) != 0:
                raise RuntimeError("decode failed")
            tok = argmax_last()
            seq.append(tok)
        wall = time.perf_counter() - t0
        pd = L.llama_perf_context(ctx)
        out = dict(engine="llama.cpp", threads=a.threads, tokens=a.tokens, n_eval=pd.n_eval,
                   decode_tok_s=1000.0 * pd.n_eval / pd.t_eval_ms, decode_wall_tok_s=a.tokens / wall,
                   prefill_len=a.prefill_len, prefill_tok_s=pre_perf, prefill_wall_tok_s=a.prefill_len / wall_pre,
                   first_tokens=seq[:8])
    L.llama_free(ctx)
    L.llama_model_free(model)
    print(json.dumps(out))


# ----------------------------------------------------------------------------- harness
def load1():
    return round(os.getloadavg()[0], 2)


def run_membw(membw, threads, mib=1024, reps=5):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), **LLAMA_ENV)
    txt = subprocess.run([membw, str(mib), str(reps)], env=env, capture_output=True, text=True, check=True).stdout
    m = re.search(r"read\s+best\s+([\d.]+)\s*GB/s", txt)
    if not m:
        raise RuntimeError(f"cannot parse membw output: {txt!r}")
    return float(m.group(1))


def run_membw_huge(cflow_bin, threads, reps=5):
    """`cflow-tui bench membw`: the read over 2 MiB pages, GB/s at `threads` threads."""
    txt = subprocess.run([cflow_bin, "bench", "membw", "--threads", str(threads), "--samples", str(reps), "--json"],
                         capture_output=True, text=True, check=True).stdout
    per = {c["threads"]: c["read_gbps"] for c in json.loads(txt)["per_threads"]}
    return per[threads]


def sample_llama(a, t):
    cmd = [sys.executable, os.path.abspath(__file__), "llama-worker", a.gguf, "--threads", str(t),
           "--tokens", str(a.tokens), "--prompt-len", str(a.prompt_len), "--prefill-len", str(a.prefill_len)]
    env = dict(os.environ, **LLAMA_ENV)
    load = load1()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=a.sample_timeout)
    if r.returncode != 0:
        raise RuntimeError(f"llama-worker failed: {r.stderr[-2000:]}")
    res = json.loads(r.stdout.strip().splitlines()[-1])
    res["load1"] = load
    return res


def run_cflow_json(a, t, tokens, prompt_len, act=None):
    cmd = [a.cflow_bin, "bench", "decode", a.cflow, "--threads", str(t), "--tokens", str(tokens),
           "--prompt-len", str(prompt_len), "--repeat", "1", "--json"]
    if act:
        cmd += ["--act", act]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=a.sample_timeout)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {r.stderr[-2000:]}")
    rep = json.loads(r.stdout.strip().splitlines()[-1])
    row = next(x for x in rep["rows"] if x["threads"] == t)
    return rep, row


def default_act(a):
    """The activation mode `bench decode` uses when --act is not given (its `act` field)."""
    rep, _ = run_cflow_json(a, 1, 1, 1)
    return rep["act"], rep["kv"], rep.get("weights", "?")


def decode_context(a):
    """Cached positions before the first timed decode step: --depth, else the short prompt."""
    return a.depth if a.depth else a.prompt_len


def sample_cflow(a, t, act):
    load = load1()
    rep, dec = run_cflow_json(a, t, a.tokens, decode_context(a), act)
    # At depth only decode is compared (llama-bench's pp would also run at depth).
    pre = None if a.depth else run_cflow_json(a, t, 1, a.prefill_len, act)[1]["prefill_tok_s"]["median"]
    return dict(engine=f"cflow {act}", act=rep["act"], kv=rep["kv"], weights=rep.get("weights"), threads=t,
                tokens=a.tokens, depth=a.depth, load1=load,
                decode_tok_s=dec["decode_tok_s"]["median"], prefill_tok_s=pre,
                prefill_len=a.prefill_len, mib_per_token=dec.get("mib_per_token"))


def sample_llama_bench(a, t):
    """One llama-bench process: tg{tokens} and pp{prefill_len}, one repetition each."""
    load = load1()
    cmd = [a.llama_bench, "-m", a.gguf, "-t", str(t), "-p", "0" if a.depth else str(a.prefill_len),
           "-n", str(a.tokens), "-r", "1", "-o", "json"]
    if a.depth:
        cmd += ["-d", str(a.depth)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=a.sample_timeout,
                       env=dict(os.environ, **LLAMA_ENV))
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {r.stderr[-2000:]}")
    res = json.loads(r.stdout)
    tg = next(x["avg_ts"] for x in res if x["n_gen"] == a.tokens and x["n_prompt"] == 0)
    pp = None if a.depth else next(x["avg_ts"] for x in res if x["n_prompt"] == a.prefill_len and x["n_gen"] == 0)
    return dict(engine="llama-bench", threads=t, load1=load, decode_tok_s=tg, prefill_tok_s=pp,
                build=res[0].get("build_commit"), cpu=res[0].get("cpu_info"))


def mmm(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return None
    return dict(median=statistics.median(xs), min=min(xs), max=max(xs), n=len(xs))


def fmt1(x):
    return "n/a" if x is None else f"{x:.1f}"


def fmt(s, prec=1):
    if not s:
        return "n/a"
    return f"{s['median']:.{prec}f} ({s['min']:.{prec}f}-{s['max']:.{prec}f})"


def compare(a):
    threads = [int(x) for x in a.threads.split(",")]
    bpt = bytes_per_token(a.gguf)
    w = bpt["weight_bytes_per_token"]
    if a.depth and a.llama_python:
        sys.exit("--depth compares llama-bench -d with cflow; it does not apply to --llama-python")
    kv_avg = bpt["kv_bytes_per_position"] * (decode_context(a) + (a.tokens - 1) / 2)

    cflow_ok = True
    if not a.cflow or not os.path.exists(a.cflow):
        print(f"[cflow side skipped: .cflow file {a.cflow or '(none given)'} not found; make it with "
              f"`cflow-tui import {os.path.basename(a.gguf)} -o FILE.cflow`]")
        cflow_ok = False
    elif not os.access(a.cflow_bin, os.X_OK):
        print(f"[cflow side skipped: binary {a.cflow_bin} not found; run `cargo build --release`]")
        cflow_ok = False
    lb_ok = bool(a.llama_bench) and os.access(a.llama_bench, os.X_OK)
    if not lb_ok:
        print(f"[llama-bench side skipped: {a.llama_bench} not found; build it with shared/bench/setup.sh]")
    modes = []
    if cflow_ok:
        dflt, kv, weights = default_act(a)
        modes = [dflt] + [m for m in ("q8", "f32") if m != dflt]
        print(f"cflow default numerics: act={dflt} kv={kv}, weights {weights} (from `bench decode --json`); other mode: "
              + (modes[1] if a.other_mode else f"{modes[1]} (skipped: --default-only)"))
        if not a.other_mode:
            modes = modes[:1]

    results = dict(gguf=a.gguf, depth=a.depth, cflow=a.cflow if cflow_ok else None, bytes=bpt, dram_read_gbs={},
                   modes=modes, date=time.strftime("%Y-%m-%d %H:%M:%S"), runs=[])
    ceiling = results["dram_read_gbs"]
    if a.dram_gbs:
        for kv_ in a.dram_gbs.split(","):
            k, v = kv_.split("=")
            ceiling[int(k)] = float(v)

    print(f"model {a.gguf}: {w:,} weight B/token ({w / 1e6:.2f} MB; tied embedding={bpt['tied_embedding']}, "
          f"embedding part {bpt['embedding_bytes_read']:,} B) + ~{kv_avg / 1e6:.2f} MB avg KV (F16)")
    if a.depth:
        print(f"workload: decode = {a.tokens} greedy steps after {a.depth} cached positions (llama-bench -n {a.tokens} "
              f"-d {a.depth}; cflow bench decode --prompt-len {a.depth}); no prefill at depth; "
              f"{a.repeats} alternating rounds per thread count")
    else:
        print(f"workload: decode = {a.prompt_len}-token prompt + {a.tokens} greedy steps (llama-bench tg{a.tokens}: "
              f"{a.tokens} steps from an empty context); prefill = one {a.prefill_len}-token prompt "
              f"(pp{a.prefill_len}); {a.repeats} alternating rounds per thread count")

    membw_ok = a.membw and os.access(a.membw, os.X_OK)
    membw_samples = {t: [] for t in threads}
    huge_samples = {t: [] for t in threads}
    for r in range(a.repeats):
        for t in threads:
            # One round: membw, llama-bench, [llama-cpp-python], then each cflow mode.
            if membw_ok and t not in ceiling:
                membw_samples[t].append(run_membw(a.membw, t))
            line = f"t={t} round {r + 1}/{a.repeats}  [load {load1()}]"
            if cflow_ok:
                huge_samples[t].append(run_membw_huge(a.cflow_bin, t))
            if membw_samples[t]:
                line += f" membw {membw_samples[t][-1]:.1f} GB/s"
            if huge_samples[t]:
                line += f" (2 MiB pages {huge_samples[t][-1]:.1f})"
            if lb_ok:
                s = sample_llama_bench(a, t)
                results["runs"].append(s)
                line += f" | llama-bench tg {s['decode_tok_s']:.1f} pp {fmt1(s['prefill_tok_s'])}"
            if a.llama_python:
                s = sample_llama(a, t)
                results["runs"].append(s)
                line += f" | llama.cpp(py) tg {s['decode_tok_s']:.1f} pp {s['prefill_tok_s']:.1f}"
            for m in modes:
                c = sample_cflow(a, t, m)
                results["runs"].append(c)
                line += f" | cflow {m} tg {c['decode_tok_s']:.1f} pp {fmt1(c['prefill_tok_s'])}"
            print(line, flush=True)
    for t in threads:
        if membw_samples[t]:
            ceiling[t] = max(membw_samples[t])  # "read best", as membw itself reports
    results["membw_samples"] = membw_samples
    results["membw_huge_samples"] = huge_samples

    base = "llama-bench" if lb_ok else ("llama.cpp" if a.llama_python else None)

    def pair_ratios(eng, key, t):
        """Ratio to the baseline of the same round, for each round."""
        rs = [x for x in results["runs"] if x["threads"] == t]
        mine = [x[key] for x in rs if x["engine"] == eng]
        theirs = [x[key] for x in rs if x["engine"] == base]
        return [m / b for m, b in zip(mine, theirs) if m and b]

    print()
    hdr = (f"{'thr':>3} {'engine':12} | {'decode tok/s med (min-max)':>26} | {'x base':>6} | "
           f"{'pp' + str(a.prefill_len) + ' tok/s med (min-max)':>26} | {'x base':>6} | {'GB/s':>6} | "
           f"{'roofline':>8} | {'paired':>6} | {'paired 2M':>9} | load1")
    print(hdr)
    print("-" * len(hdr))
    summary = []
    engines = ([base] if base else []) + (["llama.cpp"] if a.llama_python and base != "llama.cpp" else []) + \
        [f"cflow {m}" for m in modes]
    for t in threads:
        for eng in engines:
            rs = [x for x in results["runs"] if x["threads"] == t and x["engine"] == eng]
            if not rs:
                continue
            dec, pre = mmm([x["decode_tok_s"] for x in rs]), mmm([x["prefill_tok_s"] for x in rs])
            gbs = dec["median"] * w / 1e9
            pct = 100 * gbs / ceiling[t] if t in ceiling else None
            # Each round's decode against that round's membw, median over rounds: the membw
            # probe swings between rounds on a shared host, and the max above takes its best.
            paired = [100 * x["decode_tok_s"] * w / 1e9 / bw
                      for x, bw in zip(rs, membw_samples.get(t, [])) if x["decode_tok_s"] and bw]
            paired_m = statistics.median(paired) if paired else None
            paired2 = [100 * x["decode_tok_s"] * w / 1e9 / bw
                       for x, bw in zip(rs, huge_samples.get(t, [])) if x["decode_tok_s"] and bw]
            paired2_m = statistics.median(paired2) if paired2 else None
            rd = pair_ratios(eng, "decode_tok_s", t) if eng != base else []
            rp = pair_ratios(eng, "prefill_tok_s", t) if eng != base else []
            rd_m = statistics.median(rd) if rd else None
            rp_m = statistics.median(rp) if rp else None
            loads = [x["load1"] for x in rs]
            print(f"{t:>3} {eng:12} | {fmt(dec):>26} | {rd_m and f'{rd_m:.2f}' or '':>6} | {fmt(pre):>26} | "
                  f"{rp_m and f'{rp_m:.2f}' or '':>6} | {gbs:6.2f} | {pct and f'{pct:.0f} %' or 'n/a':>8} | "
                  f"{paired_m and f'{paired_m:.0f} %' or 'n/a':>6} | {paired2_m and f'{paired2_m:.0f} %' or 'n/a':>9} | "
                  f"{min(loads):.1f}-{max(loads):.1f}")
            summary.append(dict(threads=t, engine=eng, decode_tok_s=dec, prefill_tok_s=pre, eff_gbs=gbs,
                                pct_roofline=pct, pct_roofline_paired=paired_m, pct_roofline_rounds=paired,
                                pct_huge_paired=paired2_m, pct_huge_rounds=paired2,
                                decode_ratios=rd, prefill_ratios=rp,
                                decode_ratio_median=rd_m, prefill_ratio_median=rp_m))
    if cflow_ok:
        mibs = [x["mib_per_token"] for x in results["runs"] if x["engine"].startswith("cflow") and x.get("mib_per_token")]
        if mibs:
            print(f"cflow reports {statistics.median(mibs):.2f} MiB/token ({statistics.median(mibs) * 1048576 / 1e6:.2f} MB) "
                  f"vs {w / 1e6:.2f} MB from the GGUF tensor sizes (GB/s and roofline use the GGUF figure for all)")
    if ceiling:
        print("roofline = decode tok/s x weight bytes/token / membw read best GB/s (same run): " + ", ".join(
            f"{tt} thread(s) {ceiling[tt]:.1f} GB/s -> {ceiling[tt] * 1e9 / w:.0f} tok/s" for tt in threads if tt in ceiling))
        print("paired = median over rounds of (decode tok/s x weight bytes/token / that round's membw)")
    if any(huge_samples.values()):
        print("paired 2M = the same against that round's `cflow-tui bench membw` (the read over 2 MiB pages, "
              "like the resident weights): " + ", ".join(
                  f"{tt} thread(s) {min(huge_samples[tt]):.1f}-{max(huge_samples[tt]):.1f} GB/s" for tt in threads if huge_samples[tt]))
    print(f"x base = median over rounds of (engine / {base} in the same round)")
    results["summary"] = summary
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
        print(f"raw results: {a.json}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("gguf")
    common.add_argument("--tokens", type=int, default=128)
    common.add_argument("--prompt-len", type=int, default=8)
    common.add_argument("--prefill-len", type=int, default=256)

    c = sub.add_parser("compare", parents=[common])
    c.add_argument("--cflow", default=None, help="the .cflow made from the same GGUF")
    c.add_argument("--cflow-bin", default="target/release/cflow-tui")
    c.add_argument("--threads", default="1,2")
    c.add_argument("--repeats", type=int, default=5)
    c.add_argument("--depth", type=int, default=0,
                   help="decode after DEPTH cached positions (llama-bench -d, cflow --prompt-len); "
                        "decode only, no prefill")
    c.add_argument("--membw", default="/tmp/anchor/membw")
    c.add_argument("--dram-gbs", default=None, help="skip membw: e.g. 1=20.3,2=33.3")
    c.add_argument("--json", default=None, help="write raw samples + summary here")
    c.add_argument("--llama-bench", default="/tmp/anchor/llcpp-build/bin/llama-bench")
    c.add_argument("--default-only", dest="other_mode", action="store_false",
                   help="measure only cflow's default numerics (skip the other --act mode, e.g. the "
                        "slow f32 path of the K-quant types)")
    c.add_argument("--llama-python", action="store_true",
                   help="also time llama.cpp through llama-cpp-python (the llama-worker below)")
    c.add_argument("--sample-timeout", type=float, default=900,
                   help="seconds per engine process; a timed-out sample aborts the run (overloaded machine)")

    wk = sub.add_parser("llama-worker", parents=[common])
    wk.add_argument("--threads", type=int, required=True)

    b = sub.add_parser("bytes")
    b.add_argument("gguf")

    a = ap.parse_args()
    if a.cmd == "compare":
        compare(a)
    elif a.cmd == "llama-worker":
        llama_worker(a)
    else:
        print(json.dumps(bytes_per_token(a.gguf), indent=1))


if __name__ == "__main__":
    main()
