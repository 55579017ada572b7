#!/usr/bin/env python3
"""Side-by-side benchmark: llama.cpp (llama-bench) vs cflow-tui on the same models (issues 18, 41).

Normally called by benches/vs_llamacpp.sh. Subcommands:

  compare [GGUF] [--cflow FILE] [--models LIST] [--threads 1,2] [--repeats 5] [--quick] ...
      The harness. The models are GGUF (positional, with --cflow) or --models, a comma-separated
      list of names and paths (see `models` below). Every round, for each thread count T: one
      membw probe (the DRAM read roofline, measured in the same run) and, for each model, fresh
      processes of both engines, alternating (llama.cpp first in even rounds, cflow first in
      odd ones), one column group at a time:
        membw      OMP_NUM_THREADS=T MEMBW 1024 5 ("read best" GB/s, 4 KiB pages)
        cflow-tui bench membw --threads T --json   (the same read over 2 MiB pages, the memory
                   resident weights live in)
        tg, pp, pp_long: llama-bench -m GGUF -t T -p 256,2048 -n 128 -r 1 -o json
                   cflow-tui bench decode CFLOW -t T -p 8 -n 128 -r 1 --json      (decode)
                   cflow-tui bench decode CFLOW -t T -p 256 -n 1 -r 1 --json      (pp256)
                   cflow-tui bench decode CFLOW -t T -p 2048 -n 1 -r 1 --json     (pp2048, TTFT)
        depth:     llama-bench -m GGUF -t T -p 0 -n 128 -d 4096 -r 1 -o json
                   cflow-tui bench decode CFLOW -t T -d 4096 -p 1 -n 128 -r 1 --json
        rss (once per round and model, at the largest T): /usr/bin/time -v of
                   cflow-tui run CFLOW -c C --token-ids <C-16 ids> -n 16 --ignore-eos   and
                   llama-bench -m GGUF -p 0 -n 16 -d C-16 -r 1   (n_ctx = C; llama-bench takes
                   token counts, so both processes hold the same C positions: C = --rss-ctx)
      Every llama-bench test does its own untimed warm-up; every `bench decode` one warm-up
      repeat. Both engines get the synthetic ids (i*7919 + 13) % n_vocab where ids are chosen.
      Then it prints Markdown tables (paste into docs/PERFORMANCE.md): per model and thread
      count, each column as cflow median (min-max) over the rounds, llama-bench median (min-max),
      and the median (min-max) of the per-round ratios; decode also as % of the roofline (the
      best read of the run, membw or the 2 MiB-page read, whichever is higher); peak RSS of both.
      --json FILE gets the raw samples, the summary and the Markdown.
  models LIST
      Resolves (and prepares) the --models entries and prints them as JSON: name, GGUF, .cflow.
      smollm2-q4_1     the pulled SmolLM2-135M-Instruct Q4_1 (cflow-tui pull smollm2)
      smollm2-KIND     that file requantized by llama-quantize --allow-requantize to KIND
                       (q4_0, q4_k_m, q6_k, q8_0, ...), as tests/reference/requantize_smollm2.sh
                       makes the parity tests' files; cached in the cache's smollm2/ directory
      gemma3-q4_k_m    the pulled Gemma 3 270M (cflow-tui pull gemma3-270m --accept-license)
      table            the five above, PERFORMANCE.md's table (q4_1, q4_0, q4_k_m, q6_k, gemma3);
                       `issue41` is an older name for it
      PATH.gguf[:PATH.cflow]  a file; without the .cflow, cflow-tui opens the GGUF itself (imported
                       once into its cache)
      Named models are imported to a .cflow beside their GGUF with `cflow-tui import` (--quant
      keep, as the parity tests import) when it is missing or older than the GGUF.
  llama-worker GGUF --threads T [--tokens 128] [--prompt-len 8] [--prefill-len 256]
      One llama.cpp sample through llama-cpp-python, printed as one JSON line (the harness of
      issue 18; `compare --llama-python` adds it as an engine, tg and pp columns only).
  bytes GGUF
      Weight bytes read per decoded token: every tensor except token_embd, plus token_embd read
      in full when it is tied (no output.weight: it is the LM head) or one row (get_rows) when not;
      and the F16 KV bytes per cached position (sliding-window layers capped at their window).

Every sample records the 1-minute load average: the machine is shared, numbers are noisy.
"""
import argparse
import ctypes
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time

PROMPT_SEED = (7919, 13)  # ids (i*7919 + 13) % vocab, as in cflow-tui's `bench decode`
LLAMA_ENV = {"OMP_PROC_BIND": "close", "OMP_PLACES": "cores"}
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TABLE = ["smollm2-q4_1", "smollm2-q4_0", "smollm2-q4_k_m", "smollm2-q6_k", "gemma3-q4_k_m"]
COLUMNS = ["tg", "pp", "pp_long", "depth", "rss"]
SMOLLM2 = "SmolLM2-135M-Instruct"


def synthetic_prompt(n, vocab, start=0):
    a, b = PROMPT_SEED
    return [(i * a + b) % vocab for i in range(start, start + n)]


# ----------------------------------------------------------------------------- bytes/token
def bytes_per_token(gguf_path):
    import gguf

    r = gguf.GGUFReader(gguf_path)
    names = {t.name for t in r.tensors}
    tied = "output.weight" not in names
    other, emb_full, emb_row, n_vocab = 0, 0, 0, None
    # Weights multiplied per token (matrices only, for the FLOP counts: 2 per weight): the layers'
    # and the LM head's (the tied embedding's when there is no output.weight).
    layer_params, head_params = 0, 0
    arch0 = r.fields.get("general.architecture")
    arch0 = arch0.contents() if arch0 is not None else ""
    experts = r.fields.get(f"{arch0}.expert_count")
    experts = int(experts.contents()) if experts is not None else 0
    experts_used = r.fields.get(f"{arch0}.expert_used_count")
    experts_used = int(experts_used.contents()) if experts_used is not None else experts
    for t in r.tensors:
        n = int(t.n_bytes)
        dims = [int(x) for x in t.shape if int(x) > 1]
        if t.name == "token_embd.weight":
            emb_full = n
            n_vocab = int(t.shape[-1])  # gguf shape is [n_embd, n_vocab]
            emb_row = n // n_vocab
            if tied:
                head_params = int(t.n_elements)
        else:
            other += n
            if len(dims) >= 2:
                if t.name == "output.weight":
                    head_params = int(t.n_elements)
                elif len(dims) == 3 and experts:
                    # A MoE's stacked experts: a token multiplies the ones its router picks.
                    layer_params += int(t.n_elements) * experts_used // experts
                else:
                    layer_params += int(t.n_elements)
    total = other + (emb_full if tied else emb_row)

    def field(key):
        f = r.fields.get(key)
        return None if f is None else f.contents()

    arch = field("general.architecture")
    n_layer = field(f"{arch}.block_count")
    n_head = field(f"{arch}.attention.head_count")
    n_kv = field(f"{arch}.attention.head_count_kv") or n_head
    d = field(f"{arch}.embedding_length")
    k_len = field(f"{arch}.attention.key_length") or d // n_head
    v_len = field(f"{arch}.attention.value_length") or d // n_head
    window = field(f"{arch}.attention.sliding_window")
    # Which layers read only a window of the cache: Gemma 3 puts a global layer every sixth
    # (llama.cpp's swa pattern 6: layer il is local when il % 6 < 5).
    local = [bool(window) and arch == "gemma3" and il % 6 < 5 for il in range(n_layer)]
    per_layer_pos = n_kv * (k_len + v_len) * 2  # K and V, F16
    return dict(path=gguf_path, arch=arch, n_vocab=n_vocab, tied_embedding=tied, non_embedding_bytes=other,
                embedding_bytes_read=emb_full if tied else emb_row, weight_bytes_per_token=total,
                kv_bytes_per_position=per_layer_pos * n_layer, kv_bytes_per_layer_position=per_layer_pos,
                sliding_window=window, local_layers=sum(local), n_layer=n_layer, n_head=n_head,
                n_head_kv=n_kv, key_length=k_len, value_length=v_len,
                layer_matrix_params=layer_params, lm_head_params=head_params,
                types=sorted({t.tensor_type.name for t in r.tensors}))


def positions_read(bpt, pos):
    """Cached positions one query at position `pos` reads, summed over the layers: pos + 1 in
    each global layer, at most the window in each local one."""
    w, nl, loc = bpt["sliding_window"], bpt["n_layer"], bpt["local_layers"]
    seen = pos + 1
    return (nl - loc) * seen + loc * (min(seen, w) if w else seen)


def attention_flops(bpt, pos):
    """FLOPs of one query's attention at position `pos`: per layer, head and position read
    ([`positions_read`]) 2 · (key_length + value_length) (the scores' dot products and the
    weighted sum of V)."""
    return 2 * bpt["n_head"] * (bpt["key_length"] + bpt["value_length"]) * positions_read(bpt, pos)


def kv_read_bytes(bpt, first, n):
    """Mean F16 KV bytes one decode step reads over positions first..first+n-1 (a step at
    position p attends over p+1 cached positions; local layers over at most their window)."""
    per = bpt["kv_bytes_per_layer_position"]
    return sum(per * positions_read(bpt, p) for p in range(first, first + n)) / max(n, 1)


def decode_bytes_per_token(bpt, column, prompt_len, depth, tokens):
    """Bytes one decode step of `column` reads, on average: the weights plus the F16 K/V of its
    positions ([`kv_read_bytes`]): `tg` from `prompt_len`, `tg_depth` from `depth + 1` (0 K/V
    when no depth was run)."""
    if column == "tg":
        kv = kv_read_bytes(bpt, prompt_len, tokens)
    else:
        kv = kv_read_bytes(bpt, depth + 1, tokens) if depth else 0
    return bpt["weight_bytes_per_token"] + kv


# ----------------------------------------------------------------------------- models
def cache_dir():
    return os.environ.get("CFLOW_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "cflow-tui")


def smollm2_source():
    p = os.environ.get("CFLOW_SMOLLM2") or os.path.join(cache_dir(), "smollm2", f"{SMOLLM2}.Q4_1.gguf")
    if not os.path.isfile(p):
        sys.exit(f"no SmolLM2 GGUF at {p}: run `cflow-tui pull smollm2` (or set CFLOW_SMOLLM2)")
    return p


def requantize(src, dst, kind, llama_quantize):
    """llama-quantize --allow-requantize SRC DST KIND 1, as tests/reference/requantize_smollm2.sh."""
    if not os.access(llama_quantize, os.X_OK):
        sys.exit(f"{dst} is missing and there is no llama-quantize at {llama_quantize} (LLAMA_QUANTIZE=...)")
    tmp = dst + ".part"
    print(f"[making {os.path.basename(dst)}: llama-quantize --allow-requantize {os.path.basename(src)} {kind}]",
          flush=True)
    env = dict(os.environ)
    bindir = os.path.dirname(llama_quantize)
    env["LD_LIBRARY_PATH"] = bindir + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    with open(dst + ".log", "w") as log:
        r = subprocess.run([llama_quantize, "--allow-requantize", src, tmp, kind, "1"], stdout=log,
                           stderr=subprocess.STDOUT, env=env)
    if r.returncode != 0:
        sys.exit(f"llama-quantize failed, see {dst}.log")
    os.replace(tmp, dst)


def import_cflow(cflow_bin, gguf, cflow):
    """`cflow-tui import GGUF -o CFLOW` (--quant keep) unless CFLOW is newer than GGUF."""
    if os.path.exists(cflow) and os.path.getmtime(cflow) >= os.path.getmtime(gguf):
        return
    if not os.access(cflow_bin, os.X_OK):
        sys.exit(f"{cflow} is missing and there is no cflow-tui at {cflow_bin} to import it (cargo build --release)")
    print(f"[importing {os.path.basename(gguf)} -> {cflow}]", flush=True)
    r = subprocess.run([cflow_bin, "import", gguf, "-o", cflow], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"cflow-tui import {gguf} failed: {r.stderr[-2000:]}")


def resolve_models(spec, cflow_bin, llama_quantize, prepare=True):
    """The --models list as [{name, label, gguf, cflow}], requantizing and importing as needed."""
    out = []
    items = [x.strip() for x in spec.split(",") if x.strip()]
    expanded = []
    for it in items:
        expanded += TABLE if it in ("table", "issue41") else [it]
    for it in expanded:
        m = re.fullmatch(r"smollm2-([a-z0-9_]+)", it.lower())
        if m:
            kind = m.group(1).upper()
            src = smollm2_source()
            if kind == "Q4_1":
                gguf = src
            else:
                gguf = os.path.join(cache_dir(), "smollm2", f"{SMOLLM2}.{kind}.gguf")
                if prepare and not os.path.exists(gguf):
                    requantize(src, gguf, kind, llama_quantize)
            stem = os.path.splitext(os.path.basename(gguf))[0]
            cflow = os.path.join(cache_dir(), "smollm2", stem + ".cflow")
            label = f"SmolLM2 {kind}" + ("" if kind == "Q4_1" else " (requantized)")
        elif it.lower() == "gemma3-q4_k_m":
            gguf = os.environ.get("CFLOW_GEMMA3") or os.path.join(cache_dir(), "gemma3-270m", "gemma-3-270m-q4_k_m.gguf")
            if not os.path.isfile(gguf):
                sys.exit(f"no Gemma 3 GGUF at {gguf}: run `cflow-tui pull gemma3-270m --accept-license`")
            cflow = os.path.join(cache_dir(), "gemma3-270m", "gemma-3-270m-q4_k_m.cflow")
            label = "Gemma 3 270M Q4_K_M"
        elif ".gguf" in it:
            gguf, _, cflow = it.partition(":")
            if not os.path.isfile(gguf):
                sys.exit(f"no such GGUF: {gguf}")
            out.append(dict(name=it, label=os.path.basename(gguf), gguf=os.path.abspath(gguf),
                            cflow=os.path.abspath(cflow or gguf)))
            continue
        else:
            sys.exit(f"--models: unknown entry {it!r} (smollm2-q4_1, smollm2-KIND, gemma3-q4_k_m, table, "
                     f"or PATH.gguf[:PATH.cflow])")
        if prepare:
            import_cflow(cflow_bin, gguf, cflow)
        out.append(dict(name=it, label=label, gguf=gguf, cflow=cflow))
    return out


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


# ----------------------------------------------------------------------------- processes
def load1():
    return round(os.getloadavg()[0], 2)


def run(cmd, a, env=None, what=None):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=a.sample_timeout,
                       env=dict(os.environ, **(env or {})))
    if r.returncode != 0:
        raise RuntimeError(f"{what or ' '.join(cmd[:6])} failed (exit {r.returncode}): {r.stderr[-2000:]}")
    return r


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


def cflow_decode(a, model, t, act, tokens, prompt_len, depth=0):
    """One `cflow-tui bench decode` process (a warm-up repeat, then one measured); its row."""
    cmd = [a.cflow_bin, "bench", "decode", model["cflow"], "--threads", str(t), "--tokens", str(tokens),
           "--prompt-len", str(prompt_len), "--repeat", "1", "--json"]
    if depth:
        cmd += ["--depth", str(depth)]
    if act:
        cmd += ["--act", act]
    rep = json.loads(run(cmd, a).stdout.strip().splitlines()[-1])
    return rep, next(x for x in rep["rows"] if x["threads"] == t)


def default_act(a, model):
    """The activation mode `bench decode` uses when --act is not given (its `act` field). The
    first open of a .gguf imports it into cflow-tui's cache: here, untimed."""
    rep, _ = cflow_decode(a, model, 1, None, 1, 1)
    return rep["act"], rep["kv"], rep.get("weights", "?"), rep.get("kernels")


def llama_bench(a, model, t, prompts, tokens, depth=0):
    """One llama-bench process, one repetition of each test (after its own warm-up)."""
    cmd = [a.llama_bench, "-m", model["gguf"], "-t", str(t), "-p", ",".join(str(p) for p in prompts) or "0",
           "-n", str(tokens), "-r", "1", "-o", "json"]
    if depth:
        cmd += ["-d", str(depth)]
    return json.loads(run(cmd, a, env=LLAMA_ENV).stdout)


def sample_llama(a, model, t, cols):
    """llama-bench: tg, pp and pp_long in one process; depth in another."""
    out = []
    prompts = [p for p, c in ((a.prefill_len, "pp"), (a.prefill_long, "pp_long")) if c in cols]
    if "tg" in cols or prompts:
        load = load1()
        res = llama_bench(a, model, t, prompts, a.tokens if "tg" in cols else 0)
        s = dict(engine="llama-bench", group="main", load1=load, build=res[0].get("build_commit"),
                 cpu=res[0].get("cpu_info"))
        for x in res:
            if x["n_prompt"] == 0 and x["n_gen"] == a.tokens:
                s["tg"] = x["avg_ts"]
            elif x["n_gen"] == 0 and x["n_prompt"] == a.prefill_len:
                s["pp"] = x["avg_ts"]
            elif x["n_gen"] == 0 and x["n_prompt"] == a.prefill_long:
                s["pp_long"] = x["avg_ts"]
                # llama-bench reports no time to first token; its pp run is the prefill with the
                # last position's logits, no sampling: prompt / pp tok/s.
                s["ttft_ms"] = 1e3 * a.prefill_long / x["avg_ts"]
        out.append(s)
    if "depth" in cols:
        load = load1()
        res = llama_bench(a, model, t, [], a.tokens, depth=a.depth)
        x = next(x for x in res if x["n_gen"] == a.tokens and x.get("n_depth", a.depth) == a.depth)
        out.append(dict(engine="llama-bench", group="depth", load1=load, tg_depth=x["avg_ts"]))
    return out


def sample_llama_python(a, model, t):
    cmd = [sys.executable, os.path.abspath(__file__), "llama-worker", model["gguf"], "--threads", str(t),
           "--tokens", str(a.tokens), "--prompt-len", str(a.prompt_len), "--prefill-len", str(a.prefill_len)]
    load = load1()
    res = json.loads(run(cmd, a, env=LLAMA_ENV, what="llama-worker").stdout.strip().splitlines()[-1])
    return [dict(engine="llama.cpp (python)", group="main", load1=load, tg=res["decode_tok_s"],
                 pp=res["prefill_tok_s"], first_tokens=res["first_tokens"])]


def sample_cflow(a, model, t, act, cols):
    """cflow-tui bench decode: one process per column (tg, pp, pp_long + TTFT, depth)."""
    eng = "cflow" if act == model["default_act"] else f"cflow {act}"
    s = dict(engine=eng, group="main", act=act, load1=load1())
    if "tg" in cols:
        _, row = cflow_decode(a, model, t, act, a.tokens, a.prompt_len)
        s["tg"] = row["decode_tok_s"]["median"]
        s["mib_per_token"] = row.get("mib_per_token")
    if "pp" in cols:
        _, row = cflow_decode(a, model, t, act, 1, a.prefill_len)
        s["pp"] = row["prefill_tok_s"]["median"]
    if "pp_long" in cols:
        _, row = cflow_decode(a, model, t, act, 1, a.prefill_long)
        s["pp_long"] = row["prefill_tok_s"]["median"]
        s["ttft_ms"] = row["ttft_ms"]["median"]
    out = [s] if any(k in s for k in ("tg", "pp", "pp_long")) else []
    if "depth" in cols:
        load = load1()
        _, row = cflow_decode(a, model, t, act, a.tokens, 1, depth=a.depth)
        out.append(dict(engine=eng, group="depth", act=act, load1=load, tg_depth=row["decode_tok_s"]["median"]))
    return out


def peak_rss_kib(a, cmd, env=None):
    """Maximum resident set size (KiB) of `cmd` under /usr/bin/time -v, and its stdout."""
    r = run([a.time_bin, "-v"] + cmd, a, env=env, what=" ".join(cmd[:3]))
    m = re.search(r"Maximum resident set size \(kbytes\):\s*(\d+)", r.stderr)
    if not m:
        raise RuntimeError(f"no 'Maximum resident set size' in {a.time_bin} -v output: {r.stderr[-500:]}")
    return int(m.group(1)), r.stdout


def sample_rss(a, model, t, first_llama):
    """Peak RSS of `cflow-tui run` and of llama-bench holding the same C positions."""
    c = a.rss_ctx
    n = 16
    ids = ",".join(str(x) for x in synthetic_prompt(c - n, model["bytes"]["n_vocab"]))
    cflow_cmd = [a.cflow_bin, "run", model["cflow"], "--threads", str(t), "-c", str(c), "--token-ids", ids,
                 "-n", str(n), "--ignore-eos"]
    llama_cmd = [a.llama_bench, "-m", model["gguf"], "-t", str(t), "-p", "0", "-n", str(n), "-d", str(c - n),
                 "-r", "1", "-o", "json"]
    out = dict(engine="rss", group="rss", threads=t, ctx=c, load1=load1())
    for arm in (["llama", "cflow"] if first_llama else ["cflow", "llama"]):
        if arm == "llama":
            out["llama_kib"], txt = peak_rss_kib(a, llama_cmd, env=LLAMA_ENV)
            try:
                out["build"] = json.loads(txt)[0].get("build_commit")
            except (ValueError, IndexError, AttributeError):
                pass
        else:
            out["cflow_kib"], _ = peak_rss_kib(a, cflow_cmd)
    return out


# ----------------------------------------------------------------------------- summary
def mmm(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return None
    return dict(median=statistics.median(xs), min=min(xs), max=max(xs), n=len(xs))


def fmt(s, prec=1):
    if not s:
        return "–"
    if s["n"] == 1 or s["min"] == s["max"]:
        return f"{s['median']:.{prec}f}"
    return f"{s['median']:.{prec}f} ({s['min']:.{prec}f}–{s['max']:.{prec}f})"


def fmt_ratio(s):
    return fmt(s, 2) if s else "–"


def values(runs, model, t, eng, key):
    return {x["round"]: x[key] for x in runs
            if x["model"] == model and x["threads"] == t and x["engine"] == eng and x.get(key) is not None}


def summarize(a, res, threads, models):
    """Per model, thread count, engine and column: median (min-max); ratios to llama-bench per
    round; % of the roofline."""
    runs = res["runs"]
    ceiling = res["roofline_gbs"]
    summary = []
    keys = ["tg", "pp", "pp_long", "ttft_ms", "tg_depth"]
    for m in models:
        bpt = m["bytes"]
        engines = sorted({x["engine"] for x in runs if x["model"] == m["name"] and x["engine"] != "rss"},
                         key=lambda e: (e != "cflow", e))
        for t in threads:
            for eng in engines:
                row = dict(model=m["name"], label=m["label"], threads=t, engine=eng)
                for k in keys:
                    mine = values(runs, m["name"], t, eng, k)
                    if not mine:
                        continue
                    row[k] = mmm(list(mine.values()))
                    if eng != "llama-bench":
                        base = values(runs, m["name"], t, "llama-bench", k)
                        rs = [mine[r] / base[r] for r in sorted(mine) if r in base and base[r]]
                        row[k + "_ratio"] = mmm(rs)
                        row[k + "_ratios"] = rs
                for k in ("tg", "tg_depth"):
                    if k in row and t in ceiling:
                        per_tok = decode_bytes_per_token(bpt, k, a.prompt_len, a.depth, a.tokens)
                        gbs = row[k]["median"] * per_tok / 1e9
                        row[k + "_gbs"] = gbs
                        row[k + "_pct_roofline"] = 100 * gbs / ceiling[t]
                summary.append(row)
        rss = [x for x in runs if x["model"] == m["name"] and x["engine"] == "rss"]
        if rss:
            summary.append(dict(model=m["name"], label=m["label"], engine="rss", threads=rss[0]["threads"],
                                ctx=rss[0]["ctx"], cflow_kib=mmm([x["cflow_kib"] for x in rss]),
                                llama_kib=mmm([x["llama_kib"] for x in rss]),
                                ratio=mmm([x["cflow_kib"] / x["llama_kib"] for x in rss])))
    return summary


def markdown(a, res, threads, models, cols, command):
    s = res["summary"]
    out = []
    meta = res["meta"]
    out.append(f"cflow-tui vs llama.cpp, {meta['date']} on {meta['cpu']} ({meta['nproc']} CPUs), "
               f"load1 {meta['load_min']:.1f}–{meta['load_max']:.1f}; {meta['cflow_version']}, "
               f"llama.cpp {meta.get('llama_build') or '?'} (llama-bench).")
    out.append("")
    out.append(f"`{command}`: {a.repeats} round(s); in each, for each thread count and model, both engines in "
               f"fresh processes, alternating (llama-bench first in even rounds). Cells: median (min–max) over "
               f"the rounds; × = median (min–max) of the per-round ratios cflow / llama-bench.")

    def rows(eng_filter=lambda e: True):
        for m in models:
            for t in threads:
                cf = next((r for r in s if r["model"] == m["name"] and r["threads"] == t and r["engine"] == "cflow"),
                          None)
                lb = next((r for r in s if r["model"] == m["name"] and r["threads"] == t
                           and r["engine"] == "llama-bench"), None)
                others = [r for r in s if r["model"] == m["name"] and r["threads"] == t
                          and r["engine"] not in ("cflow", "llama-bench", "rss") and eng_filter(r["engine"])]
                yield m, t, cf or {}, lb or {}, others

    def pct(r, k):
        v = r.get(k + "_pct_roofline")
        return "–" if v is None else f"{v:.0f} %"

    if "tg" in cols:
        out += ["", f"**Decode** (tok/s; cflow: {a.prompt_len}-token prompt then {a.tokens} greedy steps; "
                    f"llama-bench tg{a.tokens}). % of roofline = tok/s × (weight + KV bytes per token) / the best "
                    f"read of the run.", "",
                "| model | threads | cflow | llama-bench | × | cflow % of roofline | llama-bench % of roofline |",
                "|---|---|---|---|---|---|---|"]
        for m, t, cf, lb, others in rows():
            out.append(f"| {m['label']} | {t} | {fmt(cf.get('tg'))} | {fmt(lb.get('tg'))} | "
                       f"{fmt_ratio(cf.get('tg_ratio'))} | {pct(cf, 'tg')} | {pct(lb, 'tg')} |")
            for o in others:
                out.append(f"| {m['label']}, {o['engine']} | {t} | {fmt(o.get('tg'))} | | "
                           f"{fmt_ratio(o.get('tg_ratio'))} | {pct(o, 'tg')} | |")
    pcols = [(k, n) for k, n in (("pp", a.prefill_len), ("pp_long", a.prefill_long)) if k in cols]
    if pcols:
        out += ["", "**Prefill** (tok/s; one prompt of " + " / ".join(str(n) for _, n in pcols) + " tokens).", "",
                "| model | threads | " + " | ".join(f"cflow pp{n} | llama-bench pp{n} | ×" for _, n in pcols) + " |",
                "|---|---|" + "---|---|---|" * len(pcols)]
        for m, t, cf, lb, others in rows():
            for who, r in [("", cf)] + [(f", {o['engine']}", o) for o in others]:
                cells = [f"{fmt(r.get(k))} | {fmt(lb.get(k)) if not who else ''} | {fmt_ratio(r.get(k + '_ratio'))}"
                         for k, _ in pcols]
                out.append(f"| {m['label']}{who} | {t} | " + " | ".join(cells) + " |")
    if "pp_long" in cols:
        out += ["", f"**Time to first token**, {a.prefill_long}-token prompt (ms; cflow: `bench decode` `ttft_ms`, "
                    f"measured from the start of the prefill to the first token sampled; llama-bench reports "
                    f"none: {a.prefill_long} / its pp{a.prefill_long} tok/s, the prefill with the last "
                    f"position's logits, no sampling). × = cflow / llama-bench: below 1 is faster.", "",
                "| model | threads | cflow TTFT ms | llama-bench ms | × |", "|---|---|---|---|---|"]
        for m, t, cf, lb, others in rows(lambda e: e.startswith("cflow")):
            out.append(f"| {m['label']} | {t} | {fmt(cf.get('ttft_ms'))} | {fmt(lb.get('ttft_ms'))} | "
                       f"{fmt_ratio(cf.get('ttft_ms_ratio'))} |")
            for o in others:
                out.append(f"| {m['label']}, {o['engine']} | {t} | {fmt(o.get('ttft_ms'))} | | "
                           f"{fmt_ratio(o.get('ttft_ms_ratio'))} |")
    if "depth" in cols:
        out += ["", f"**Decode at depth {a.depth}** (tok/s; {a.tokens} steps with {a.depth} positions cached: "
                    f"llama-bench `-d {a.depth}` tg{a.tokens}; cflow `bench decode --depth {a.depth} -p 1 "
                    f"-n {a.tokens}`). Roofline as above, with the KV cache read (sliding-window layers: their "
                    f"window).", "",
                "| model | threads | cflow | llama-bench | × | cflow % of roofline | llama-bench % of roofline |",
                "|---|---|---|---|---|---|---|"]
        for m, t, cf, lb, others in rows(lambda e: e.startswith("cflow")):
            out.append(f"| {m['label']} | {t} | {fmt(cf.get('tg_depth'))} | {fmt(lb.get('tg_depth'))} | "
                       f"{fmt_ratio(cf.get('tg_depth_ratio'))} | {pct(cf, 'tg_depth')} | {pct(lb, 'tg_depth')} |")
            for o in others:
                out.append(f"| {m['label']}, {o['engine']} | {t} | {fmt(o.get('tg_depth'))} | | "
                           f"{fmt_ratio(o.get('tg_depth_ratio'))} | {pct(o, 'tg_depth')} | |")
    rss = [r for r in s if r["engine"] == "rss"]
    if rss:
        out += ["", f"**Peak RSS** (KiB, `/usr/bin/time -v`, at {rss[0]['threads']} thread(s); context "
                    f"{a.rss_ctx} positions, all filled: `cflow-tui run -c {a.rss_ctx}` with a "
                    f"{a.rss_ctx - 16}-token prompt and 16 generated; llama-bench `-p 0 -n 16 -d {a.rss_ctx - 16}` "
                    f"(no llama-cli/llama-simple here, and llama-bench takes token counts); cflow with its "
                    f"default `--weights auto`). × = cflow / llama-bench: below 1 is less memory.", "",
                "| model | cflow `run` KiB | llama-bench KiB | × |", "|---|---|---|---|"]
        for m in models:
            r = next((r for r in rss if r["model"] == m["name"]), None)
            if r:
                out.append(f"| {m['label']} | {fmt(r['cflow_kib'], 0)} | {fmt(r['llama_kib'], 0)} | "
                           f"{fmt_ratio(r['ratio'])} |")
    ce, mb, hg = res["roofline_gbs"], res["membw_samples"], res["membw_huge_samples"]
    if ce:
        parts = []
        for t in threads:
            if t in ce:
                p = f"{t} thread(s) {ce[t]:.1f} GB/s"
                extra = []
                if mb.get(t):
                    extra.append(f"membw {min(mb[t]):.1f}–{max(mb[t]):.1f}")
                if hg.get(t):
                    extra.append(f"2 MiB pages {min(hg[t]):.1f}–{max(hg[t]):.1f}")
                parts.append(p + (f" ({'; '.join(extra)})" if extra else ""))
        out += ["", "Roofline (best read of the run): " + ", ".join(parts) + "."]
    out += ["", "Bytes per token (GGUF tensor sizes): " + "; ".join(
        f"{m['label']} {m['bytes']['weight_bytes_per_token'] / 1e6:.2f} MB weights + "
        f"{m['bytes']['kv_bytes_per_position']:,} B KV per cached position" for m in models) + "."]
    return "\n".join(out)


# ----------------------------------------------------------------------------- compare
def compare(a):
    threads = [int(x) for x in a.threads.split(",")]
    if a.quick:
        a.repeats = 1 if a.repeats is None else a.repeats
        a.columns = a.columns or "tg,pp,rss"
        a.rss_ctx = a.rss_ctx or 1024
    a.repeats = a.repeats or 5
    a.rss_ctx = a.rss_ctx or 4096
    cols = [c.strip() for c in (a.columns or ",".join(COLUMNS)).split(",") if c.strip()]
    for c in cols:
        if c not in COLUMNS:
            sys.exit(f"--columns: unknown column {c!r} (any of {', '.join(COLUMNS)})")
    if not a.depth:
        cols = [c for c in cols if c != "depth"]
    if not a.prefill_long:
        cols = [c for c in cols if c != "pp_long"]
    if a.rss_ctx <= 32 and "rss" in cols:
        sys.exit("--rss-ctx must be more than 32")

    if a.models and a.gguf:
        sys.exit("give either GGUF [--cflow FILE] or --models, not both")
    if not a.models and not a.gguf:
        sys.exit("no model: give GGUF [--cflow FILE] or --models LIST")
    if a.models:
        models = resolve_models(a.models, a.cflow_bin, a.llama_quantize)
    else:
        if not os.path.isfile(a.gguf):
            sys.exit(f"no such GGUF: {a.gguf}")
        # Without --cflow, cflow-tui opens the GGUF itself (imported once into its cache).
        models = [dict(name=os.path.basename(a.gguf), label=os.path.basename(a.gguf), gguf=os.path.abspath(a.gguf),
                       cflow=os.path.abspath(a.cflow or a.gguf))]

    if not os.access(a.cflow_bin, os.X_OK):
        sys.exit(f"no cflow-tui binary at {a.cflow_bin}: run `cargo build --release` (CFLOW_BIN=...)")
    if not os.access(a.llama_bench, os.X_OK):
        sys.exit(f"no llama-bench at {a.llama_bench}: build it with shared/bench/setup.sh (LLAMA_BENCH=...)")
    if "rss" in cols and not os.access(a.time_bin, os.X_OK):
        sys.exit(f"no {a.time_bin} for the RSS column: apt-get install time (or --columns without rss)")
    for m in models:
        if not os.path.exists(m["cflow"]):
            sys.exit(f"{m['name']}: no such .cflow: {m['cflow']} (make it with `cflow-tui import {m['gguf']} "
                     f"-o FILE.cflow`, or leave it out: cflow-tui opens the GGUF itself)")
        m["bytes"] = bytes_per_token(m["gguf"])
        act, kv, weights, kernels = default_act(a, m)
        m.update(default_act=act, kv=kv, weights=weights, kernels=kernels)
        m["acts"] = [act] + ([x for x in ("q8", "f32") if x != act] if a.other_act else [])
        print(f"{m['label']}: {m['gguf']} | {m['cflow']}\n  {m['bytes']['weight_bytes_per_token']:,} weight B/token "
              f"(types {', '.join(m['bytes']['types'])}), {m['bytes']['kv_bytes_per_position']:,} B KV/position; "
              f"cflow default act={act} kv={kv} weights={weights}" +
              (f"; also --act {', '.join(m['acts'][1:])}" if len(m["acts"]) > 1 else ""), flush=True)

    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")),
               platform.processor())
    ver = subprocess.run([a.cflow_bin, "--version"], capture_output=True, text=True).stdout.strip()
    rev = subprocess.run(["git", "-C", REPO, "describe", "--always", "--dirty"], capture_output=True,
                         text=True).stdout.strip()
    res = dict(meta=dict(date=time.strftime("%Y-%m-%d %H:%M %Z"), host=platform.node(), cpu=cpu, nproc=os.cpu_count(),
                         cflow_version=f"{ver} ({rev})" if rev else ver, cflow_bin=a.cflow_bin,
                         llama_bench=a.llama_bench, argv=sys.argv[1:]),
               settings=dict(threads=threads, repeats=a.repeats, tokens=a.tokens, prompt_len=a.prompt_len,
                             prefill_len=a.prefill_len, prefill_long=a.prefill_long, depth=a.depth,
                             rss_ctx=a.rss_ctx, columns=cols),
               models=[{k: v for k, v in m.items()} for m in models], runs=[], roofline_gbs={})
    ceiling = res["roofline_gbs"]
    if a.dram_gbs:
        for kv_ in a.dram_gbs.split(","):
            k, v = kv_.split("=")
            ceiling[int(k)] = float(v)
    membw_ok = bool(a.membw) and os.access(a.membw, os.X_OK)
    if not membw_ok and not a.dram_gbs:
        print(f"[membw probe {a.membw} not found: the roofline uses `cflow-tui bench membw` alone]")
    mb = {t: [] for t in threads}
    hg = {t: [] for t in threads}
    print(f"columns: {', '.join(cols)}; threads {a.threads}; {a.repeats} round(s)", flush=True)

    for r in range(a.repeats):
        first_llama = r % 2 == 0
        for t in threads:
            line = f"round {r + 1}/{a.repeats} t={t} [load {load1()}]"
            if not a.dram_gbs:
                if membw_ok:
                    mb[t].append(run_membw(a.membw, t))
                    line += f" membw {mb[t][-1]:.1f}"
                hg[t].append(run_membw_huge(a.cflow_bin, t))
                line += f" 2M {hg[t][-1]:.1f} GB/s"
            print(line, flush=True)
            for m in models:
                tag = dict(model=m["name"], round=r, threads=t)
                got = []
                arms = ["llama", "cflow"] if first_llama else ["cflow", "llama"]
                for group in (["tg", "pp", "pp_long"], ["depth"]):
                    gcols = [c for c in group if c in cols]
                    if not gcols:
                        continue
                    for arm in arms:
                        if arm == "llama":
                            got += sample_llama(a, m, t, gcols)
                            if a.llama_python and group[0] == "tg":
                                got += sample_llama_python(a, m, t)
                        else:
                            for act in m["acts"]:
                                got += sample_cflow(a, m, t, act, gcols)
                if "rss" in cols and t == max(threads):
                    got.append(sample_rss(a, m, t, first_llama))
                for s in got:
                    s.update(tag)
                    res["runs"].append(s)
                print("  " + m["label"] + ": " + " | ".join(
                    s["engine"] + " " + " ".join(f"{k} {s[k]:.{0 if k.endswith('kib') else 1}f}" for k in
                                                 ("tg", "pp", "pp_long", "ttft_ms", "tg_depth", "cflow_kib",
                                                  "llama_kib") if s.get(k) is not None)
                    for s in got), flush=True)
    for t in threads:
        if t not in ceiling and (mb[t] or hg[t]):
            ceiling[t] = max(mb[t] + hg[t])  # the best read of the run, either probe
    res["membw_samples"], res["membw_huge_samples"] = mb, hg
    loads = [x["load1"] for x in res["runs"]]
    res["meta"].update(load_min=min(loads), load_max=max(loads),
                       llama_build=next((x.get("build") for x in res["runs"] if x.get("build")), None))
    res["summary"] = summarize(a, res, threads, models)
    command = a.command or "benches/vs_llamacpp.sh " + " ".join(sys.argv[2:])
    res["markdown"] = markdown(a, res, threads, models, cols, command)
    print()
    print(res["markdown"])
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
            f.write("\n")
        print(f"\nraw samples + summary: {a.json}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)

    c = sub.add_parser("compare")
    c.add_argument("gguf", nargs="?", help="one GGUF (or use --models)")
    c.add_argument("--cflow", default=None, help="the .cflow made from GGUF (or the GGUF itself)")
    c.add_argument("--models", default=None,
                   help="comma-separated: smollm2-q4_1, smollm2-KIND (requantized), gemma3-q4_k_m, table, "
                        "PATH.gguf[:PATH.cflow]")
    c.add_argument("--threads", default="1,2")
    c.add_argument("--repeats", type=int, default=None, help="rounds (default 5; 1 with --quick)")
    c.add_argument("--tokens", type=int, default=128, help="decode steps (tg)")
    c.add_argument("--prompt-len", type=int, default=8, help="cflow's prompt before the tg decode")
    c.add_argument("--prefill-len", type=int, default=256, help="the pp column's prompt")
    c.add_argument("--prefill-long", type=int, default=2048, help="the pp_long column's prompt, and TTFT's (0: off)")
    c.add_argument("--depth", type=int, default=4096, help="cached positions of the depth column (0: off)")
    c.add_argument("--rss-ctx", type=int, default=None, help="context of the RSS column (default 4096; 1024 with --quick)")
    c.add_argument("--columns", default=None,
                   help=f"which columns, of {','.join(COLUMNS)} (default all; tg,pp,rss with --quick)")
    c.add_argument("--quick", action="store_true", help="a smoke test: 1 round, columns tg,pp,rss, RSS at 1024")
    c.add_argument("--other-act", action="store_true",
                   help="also measure cflow's other --act mode (e.g. the slow f32 path of the K-quants)")
    c.add_argument("--default-only", action="store_true",
                   help="cflow's default numerics only: the default now (kept for old command lines)")
    c.add_argument("--llama-python", action="store_true",
                   help="also time llama.cpp through llama-cpp-python (llama-worker; tg and pp only)")
    c.add_argument("--cflow-bin", default=os.path.join(REPO, "target", "release", "cflow-tui"))
    c.add_argument("--llama-bench", default="/tmp/anchor/llcpp-build/bin/llama-bench")
    c.add_argument("--llama-quantize", default=None, help="default: llama-quantize beside llama-bench")
    c.add_argument("--membw", default="/tmp/anchor/membw")
    c.add_argument("--dram-gbs", default=None, help="skip both read probes: e.g. 1=20.3,2=33.3")
    c.add_argument("--time-bin", default="/usr/bin/time")
    c.add_argument("--json", default=None, help="write raw samples + summary + the Markdown here")
    c.add_argument("--command", default=None, help="the command line to quote in the Markdown")
    c.add_argument("--sample-timeout", type=float, default=1800,
                   help="seconds per process; a timed-out sample aborts the run (overloaded machine)")

    mo = sub.add_parser("models")
    mo.add_argument("list")
    mo.add_argument("--cflow-bin", default=os.path.join(REPO, "target", "release", "cflow-tui"))
    mo.add_argument("--llama-quantize", default="/tmp/anchor/llcpp-build/bin/llama-quantize")

    wk = sub.add_parser("llama-worker")
    wk.add_argument("gguf")
    wk.add_argument("--threads", type=int, required=True)
    wk.add_argument("--tokens", type=int, default=128)
    wk.add_argument("--prompt-len", type=int, default=8)
    wk.add_argument("--prefill-len", type=int, default=256)

    b = sub.add_parser("bytes")
    b.add_argument("gguf")

    a = ap.parse_args()
    if a.cmd == "compare":
        a.llama_quantize = a.llama_quantize or os.path.join(os.path.dirname(a.llama_bench), "llama-quantize")
        compare(a)
    elif a.cmd == "models":
        print(json.dumps(resolve_models(a.list, a.cflow_bin, a.llama_quantize), indent=1))
    elif a.cmd == "llama-worker":
        llama_worker(a)
    else:
        print(json.dumps(bytes_per_token(a.gguf), indent=1))


if __name__ == "__main__":
    main()
