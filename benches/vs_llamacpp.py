#!/usr/bin/env python3
"""Side-by-side decode benchmark: llama.cpp (llama-cpp-python) vs cflow-tui on the same model.

Normally called by benches/vs_llamacpp.sh. Subcommands:

  compare GGUF [--cflow FILE.cflow] [--threads 1,2] [--repeats 5] [--tokens 128] ...
      The harness. For each thread count T and each repeat it runs, alternating A B A B:
        A  a fresh llama.cpp process (`llama-worker`, below)
        B  fresh cflow-tui processes:
             target/release/cflow-tui bench decode FILE.cflow --threads T --tokens 128
                 --prompt-len 8 --repeat 1 --json                    (decode tok/s)
             ... --tokens 1 --prompt-len 256 --repeat 1 --json      (prefill tok/s)
      and prints decode tok/s median (min-max) per engine, the cflow/llama.cpp ratio of each
      A-B pair, prefill tok/s for a 256-token prompt, bytes/token (from the GGUF tensor sizes),
      effective GB/s and % of the DRAM read ceiling. If the .cflow file or the binary is missing
      the cflow side is skipped with a message (llama.cpp is still measured).
  llama-worker GGUF --threads T [--tokens 128] [--prompt-len 8] [--prefill-len 256]
      One llama.cpp sample, printed as one JSON line. One untimed warm-up round, then:
      prefill = one llama_decode of a 256-token batch (logits for the last token only), timed by
      wall clock and by llama_perf_context; decode = an 8-token prompt batch, then 128 single-token
      llama_decode calls, greedy argmax, EOS ignored; tok/s = n_eval / t_eval from
      llama_perf_context (time inside llama.cpp, as in shared/bench/RESULTS.md) and by wall clock.
      Prompt ids are (i*7919 + 13) % n_vocab, the same synthetic prompt `cflow-tui bench decode` uses.
  bytes GGUF
      Weight bytes read per decoded token: every tensor except token_embd, plus token_embd read
      in full when it is tied (no output.weight: it is the LM head) or one row (get_rows) when not.

Bandwidth ceiling: `OMP_NUM_THREADS=T OMP_PROC_BIND=close OMP_PLACES=cores MEMBW 1024 5`
(shared/bench/membw.c, "read best" GB/s), unless --dram-gbs 1=20.3,2=33.3 is given.
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


def run_cflow_json(a, t, tokens, prompt_len):
    cmd = [a.cflow_bin, "bench", "decode", a.cflow, "--threads", str(t), "--tokens", str(tokens),
           "--prompt-len", str(prompt_len), "--repeat", "1", "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=a.sample_timeout)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {r.stderr[-2000:]}")
    arr = json.loads(r.stdout.strip().splitlines()[-1])
    return next(x for x in arr if x["threads"] == t)


def sample_cflow(a, t):
    load = load1()
    dec = run_cflow_json(a, t, a.tokens, a.prompt_len)
    pre = run_cflow_json(a, t, 1, a.prefill_len)
    return dict(engine="cflow", threads=t, tokens=a.tokens, load1=load,
                decode_tok_s=dec["decode_tok_s"]["median"], prefill_tok_s=pre["prefill_tok_s"]["median"],
                prefill_len=a.prefill_len, mib_per_token=dec.get("mib_per_token"))


def mmm(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return None
    return dict(median=statistics.median(xs), min=min(xs), max=max(xs), n=len(xs))


def fmt(s, prec=1):
    if not s:
        return "n/a"
    return f"{s['median']:.{prec}f} ({s['min']:.{prec}f}-{s['max']:.{prec}f})"


def compare(a):
    threads = [int(x) for x in a.threads.split(",")]
    bpt = bytes_per_token(a.gguf)
    w = bpt["weight_bytes_per_token"]
    kv_avg = bpt["kv_bytes_per_position"] * (a.prompt_len + (a.tokens - 1) / 2)

    cflow_ok = True
    if not a.cflow or not os.path.exists(a.cflow):
        print(f"[cflow side skipped: .cflow file {a.cflow or '(none given)'} not found; make it with "
              f"`cflow-tui import {os.path.basename(a.gguf)} -o FILE.cflow`]")
        cflow_ok = False
    elif not os.access(a.cflow_bin, os.X_OK):
        print(f"[cflow side skipped: binary {a.cflow_bin} not found; run `cargo build --release`]")
        cflow_ok = False

    ceiling = {}
    if a.dram_gbs:
        for kv in a.dram_gbs.split(","):
            k, v = kv.split("=")
            ceiling[int(k)] = float(v)
    for t in threads:
        if t in ceiling:
            continue
        if a.membw and os.access(a.membw, os.X_OK):
            load = load1()
            ceiling[t] = run_membw(a.membw, t)
            print(f"membw {t} thread(s): DRAM read best {ceiling[t]:.1f} GB/s (load1 {load})")
        else:
            print(f"[no membw binary and no --dram-gbs for {t} thread(s): % of ceiling not reported]")

    print(f"model {a.gguf}: {w:,} weight B/token ({w / 1e6:.2f} MB; tied embedding={bpt['tied_embedding']}, "
          f"embedding part {bpt['embedding_bytes_read']:,} B) + ~{kv_avg / 1e6:.2f} MB avg KV (F16)")
    print(f"workload: {a.prompt_len}-token prompt + {a.tokens} greedy decode steps (EOS ignored); "
          f"prefill = one {a.prefill_len}-token prompt; {a.repeats} alternating A/B repeats per thread count")

    results = dict(gguf=a.gguf, cflow=a.cflow if cflow_ok else None, bytes=bpt, dram_read_gbs=ceiling,
                   date=time.strftime("%Y-%m-%d %H:%M:%S"), runs=[])
    for t in threads:
        for r in range(a.repeats):
            s = sample_llama(a, t)
            results["runs"].append(s)
            line = (f"t={t} rep {r + 1}/{a.repeats}  A llama.cpp decode {s['decode_tok_s']:7.1f} tok/s "
                    f"(wall {s['decode_wall_tok_s']:.1f}), prefill {s['prefill_tok_s']:7.1f} tok/s  [load {s['load1']}]")
            if cflow_ok:
                c = sample_cflow(a, t)
                c["pair_ratio"] = c["decode_tok_s"] / s["decode_tok_s"]
                results["runs"].append(c)
                line += (f" | B cflow decode {c['decode_tok_s']:7.1f}, prefill {c['prefill_tok_s']:7.1f}  "
                         f"ratio {c['pair_ratio']:.2f} [load {c['load1']}]")
            print(line, flush=True)

    print()
    hdr = (f"{'thr':>3} {'engine':9} | {'decode tok/s med (min-max)':>28} | {'prefill' + str(a.prefill_len) + ' tok/s med (min-max)':>32} "
           f"| {'GB/s eff (+KV)':>15} | {'% DRAM':>7} | load1")
    print(hdr)
    print("-" * len(hdr))
    summary = []
    for t in threads:
        for eng in (["llama.cpp", "cflow"] if cflow_ok else ["llama.cpp"]):
            rs = [x for x in results["runs"] if x["threads"] == t and x["engine"] == eng]
            dec, pre = mmm([x["decode_tok_s"] for x in rs]), mmm([x["prefill_tok_s"] for x in rs])
            gbs = dec["median"] * w / 1e9
            gbs_kv = dec["median"] * (w + kv_avg) / 1e9
            pct = f"{100 * gbs / ceiling[t]:.0f} %" if t in ceiling else "n/a"
            loads = [x["load1"] for x in rs]
            print(f"{t:>3} {eng:9} | {fmt(dec):>28} | {fmt(pre):>32} | {gbs:6.2f} ({gbs_kv:5.2f}) | {pct:>7} | "
                  f"{min(loads):.1f}-{max(loads):.1f}")
            summary.append(dict(threads=t, engine=eng, decode_tok_s=dec, prefill_tok_s=pre, eff_gbs=gbs,
                                eff_gbs_kv=gbs_kv, pct_dram=(100 * gbs / ceiling[t]) if t in ceiling else None))
        if cflow_ok:
            ratios = [x["pair_ratio"] for x in results["runs"] if x["threads"] == t and x["engine"] == "cflow"]
            print(f"{t:>3} ratio cflow/llama.cpp per pair: {', '.join(f'{x:.2f}' for x in ratios)} "
                  f"-> median {statistics.median(ratios):.2f}")
            summary.append(dict(threads=t, pair_ratios=ratios, ratio_median=statistics.median(ratios)))
    if cflow_ok:
        mibs = [x["mib_per_token"] for x in results["runs"] if x["engine"] == "cflow" and x.get("mib_per_token")]
        if mibs:
            print(f"cflow reports {statistics.median(mibs):.2f} MiB/token ({statistics.median(mibs) * 1048576 / 1e6:.2f} MB) "
                  f"vs {w / 1e6:.2f} MB from the GGUF tensor sizes (GB/s above use the GGUF figure for both)")
    if ceiling:
        print("roofline at the DRAM read ceiling: " + ", ".join(
            f"{tt} thread(s) {ceiling[tt] * 1e9 / w:.0f} tok/s" for tt in threads if tt in ceiling))
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
    c.add_argument("--membw", default="/tmp/anchor/membw")
    c.add_argument("--dram-gbs", default=None, help="skip membw: e.g. 1=20.3,2=33.3")
    c.add_argument("--json", default=None, help="write raw samples + summary here")
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
