#!/usr/bin/env python3
"""llama.cpp goldens for a moe_tiny GGUF, teacher-forced on the held-out ids of goldens.json.

Usage:
    python tests/reference/moe_tiny_llamacpp.py MODEL.gguf --ids-json goldens.json -o llamacpp_q8_0.json
    python tests/reference/moe_tiny_llamacpp.py MODEL.gguf --ids-json goldens.json --flash-attn off \
        -o llamacpp_q8_0_fa_off.json --compare-with llamacpp_q8_0.json

Reuses llamacpp_goldens.py's run_prompt (llama-cpp-python's low-level ctypes API): a fresh context,
`ids` passed directly (no BOS added, no tokenization), all evaluated in ONE batch with logits for
every position, then a greedy continuation of --n-greedy (16) single-token decodes on the same KV
cache. Output (flat, one line per position of `top`):
  header       generator, llama_cpp_python, llama_cpp_version, ggml_commit, model_file,
               model_bytes, model_sha256, n_vocab, n_threads, flash_attn, n_ctx, top_k, n_greedy,
               logit_decimals, system_info
  ids          the teacher-forced ids (= goldens.json `ids`)
  top          [len(ids)][top_k] of [id, logit], best first; top[i] predicts position i+1
  logsumexp    per position, over the full vocabulary (float64)
  greedy, greedy_stop, greedy_margin, greedy_text   as in llamacpp_goldens.py
  agreement_with     (--compare-with) this run's full logits vs the other file's top-k: top-1
                     agreement and max |dlogit| over the other file's top-k
  agreement_with_hf  (always) this run's full logits vs goldens.json `hf_logits`: top-1 agreement
                     and max |dlogit| over the full vocabulary
"""
import argparse
import ctypes
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_cpp as L  # noqa: E402
from llamacpp_goldens import _quiet, ggml_commit, run_prompt, sha256_file  # noqa: E402


def dump(doc, f):
    keys = list(doc.keys())
    f.write("{\n")
    for ki, key in enumerate(keys):
        sep = "," if ki + 1 < len(keys) else ""
        if key == "top":
            rows = ",\n  ".join(json.dumps(r, separators=(",", ":")) for r in doc[key])
            f.write(f' "top": [\n  {rows}\n ]{sep}\n')
        else:
            f.write(f" {json.dumps(key)}: {json.dumps(doc[key], ensure_ascii=False)}{sep}\n")
    f.write("}\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--ids-json", required=True, help="goldens.json of moe_tiny.py (its `ids`, `hf_logits`)")
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--top-k", type=int, default=10)
    ap.add_argument("--n-greedy", type=int, default=16)
    ap.add_argument("--decimals", type=int, default=5)
    ap.add_argument("--n-ctx", type=int, default=256)
    ap.add_argument("--flash-attn", choices=["auto", "on", "off"], default="auto",
                    help="llama.cpp's flash_attn_type (auto resolves to on for the CPU backend)")
    ap.add_argument("--compare-with", metavar="LLAMACPP.json")
    ap.add_argument("--verbose", action="store_true")
    a = ap.parse_args()

    gold = json.load(open(a.ids_json, encoding="utf-8"))
    ids = [int(t) for t in gold["ids"]]
    if not a.verbose:
        L.llama_log_set(_quiet, ctypes.c_void_p())
    L.llama_backend_init()
    mp = L.llama_model_default_params()
    model = L.llama_model_load_from_file(a.model.encode(), mp)
    if not model:
        sys.exit(f"failed to load {a.model}")
    vocab = L.llama_model_get_vocab(model)
    n_vocab = L.llama_vocab_n_tokens(vocab)
    cp = L.llama_context_default_params()
    cp.n_ctx = a.n_ctx
    cp.n_batch = a.n_ctx
    cp.n_ubatch = a.n_ctx
    cp.n_threads = a.threads
    cp.n_threads_batch = a.threads
    cp.flash_attn_type = {"auto": -1, "on": 1, "off": 0}[a.flash_attn]
    ctx = L.llama_init_from_model(model, cp)
    if not ctx:
        sys.exit("llama_init_from_model failed")

    full = []
    res = run_prompt(ctx, vocab, n_vocab, ids, a.top_k, a.decimals, a.n_greedy, full)
    doc = {
        "generator": "tests/reference/moe_tiny_llamacpp.py",
        "llama_cpp_python": L.__version__,
        "llama_cpp_version": L.llama_version().decode(),
        "ggml_commit": ggml_commit(),
        "model_file": os.path.basename(a.model),
        "model_bytes": os.path.getsize(a.model),
        "model_sha256": sha256_file(a.model),
        "n_vocab": n_vocab,
        "n_threads": a.threads,
        "flash_attn": a.flash_attn,
        "n_ctx": a.n_ctx,
        "top_k": a.top_k,
        "n_greedy": a.n_greedy,
        "logit_decimals": a.decimals,
        "system_info": L.llama_print_system_info().decode().strip(),
        "notes": "ids passed directly (no BOS, no tokenization), one batch, logits for every "
                 "position; top[i] predicts position i+1; greedy = single-token decodes after the batch",
        "ids": ids,
    }
    doc.update(res)
    hf = np.array(gold["hf_logits"], dtype=np.float64)
    lc = np.array(full, dtype=np.float64)
    assert hf.shape == lc.shape, (hf.shape, lc.shape)
    doc["agreement_with_hf"] = {
        "positions": len(ids),
        "top1_agree": int((hf.argmax(-1) == lc.argmax(-1)).sum()),
        "max_abs_dlogit": round(float(np.abs(hf - lc).max()), 6),
    }
    msg = (f"{os.path.basename(a.model)} fa={a.flash_attn}: vs HF top-1 "
           f"{doc['agreement_with_hf']['top1_agree']}/{len(ids)}, max |dlogit| "
           f"{doc['agreement_with_hf']['max_abs_dlogit']:.5f}")
    if a.compare_with:
        o = json.load(open(a.compare_with, encoding="utf-8"))
        if o["ids"] != ids:
            sys.exit("--compare-with goldens have other ids")
        agree, max_dl = 0, 0.0
        for lg, otop in zip(full, o["top"]):
            agree += int(np.argmax(lg)) == otop[0][0]
            max_dl = max(max_dl, max(abs(float(lg[i]) - v) for i, v in otop))
        doc["agreement_with"] = {
            "goldens": os.path.basename(a.compare_with),
            "positions": len(ids),
            "top1_agree": agree,
            "max_abs_dlogit_over_their_topk": round(max_dl, 5),
        }
        msg += f" | vs {os.path.basename(a.compare_with)} top-1 {agree}/{len(ids)}, max |dlogit| {max_dl:.5f}"
    L.llama_free(ctx)
    L.llama_model_free(model)
    with open(a.output, "w", encoding="utf-8") as f:
        dump(doc, f)
    print(msg, file=sys.stderr)


if __name__ == "__main__":
    main()
