#!/usr/bin/env python3
"""llama.cpp's own distributions on the tokens of a reference-logits file, in the same format.

Usage (the venv of shared/bench/setup.sh):
  /tmp/anchor/venv/bin/python tests/reference/llamacpp_logits.py MODEL.gguf --tokens-from REF.logits \
      -o llamacpp.logits [--threads 2] [--chunks N]
On a CPU where the venv's native build crashes in its AMX kernels (the Intel guest of
docs/PERFORMANCE.md: a segmentation fault on Gemma 3), point llama-cpp-python at the build without
AMX: LLAMA_CPP_LIB_PATH=$ANCHOR_DIR/llcpp-noamx/bin (benches/build_llamacpp_noamx.sh).

Reads the token ids and the chunk length from REF (written by `cflow-tui perplexity
--save-logits`, so both engines see identical tokens and chunking), evaluates each chunk in one
llama_decode batch with logits for every position (a fresh KV cache per chunk, n_ctx = the chunk
length, llama.cpp's default numerics: Q8 activations, f16 KV cache), and writes every predicted
position's log-softmax to OUT. Compare with
  cflow-tui perplexity --kl-divergence EXACT.logits --logits llamacpp.logits
"""
import argparse
import ctypes
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import logits_file as lf  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("gguf")
    ap.add_argument("--tokens-from", required=True)
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--chunks", type=int, default=None, help="only N chunks")
    ap.add_argument("--skip", type=int, default=0,
                    help="start at chunk SKIP (chunks are independent; `logits_file.py concat` joins the parts)")
    a = ap.parse_args()

    import llama_cpp as L

    h = lf.read_header(a.tokens_from)
    n_ctx = h["n_ctx"]
    chunks = lf.chunks(h["tokens"], n_ctx)[a.skip:]
    chunks = chunks if a.chunks is None else chunks[:a.chunks]
    tokens = [t for c in chunks for t in c]

    @L.llama_log_callback
    def quiet(level, text, user_data):
        pass

    L.llama_log_set(quiet, ctypes.c_void_p())
    L.llama_backend_init()
    model = L.llama_model_load_from_file(a.gguf.encode(), L.llama_model_default_params())
    if not model:
        sys.exit(f"failed to load {a.gguf}")
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    if n_vocab != h["n_vocab"]:
        sys.exit(f"vocab {n_vocab} != the reference's {h['n_vocab']}")
    cp = L.llama_context_default_params()
    cp.n_ctx = n_ctx
    cp.n_batch = cp.n_ubatch = n_ctx
    cp.n_threads = cp.n_threads_batch = a.threads
    ctx = L.llama_init_from_model(model, cp)
    mem = L.llama_get_memory(ctx)
    label = f"llama.cpp (llama-cpp-python {L.__version__}) default numerics, {os.path.basename(a.gguf)}"
    w = lf.Writer(a.out, n_vocab, n_ctx, tokens, label)
    try:
        batch = L.llama_batch_init(n_ctx, 0, 1)
        for ci, ch in enumerate(chunks):
            L.llama_memory_clear(mem, True)
            batch.n_tokens = len(ch)
            for i, t in enumerate(ch):
                batch.token[i] = t
                batch.pos[i] = i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = 1
            if L.llama_decode(ctx, batch) != 0:
                raise RuntimeError(f"llama_decode failed on chunk {ci}")
            logits = np.ctypeslib.as_array(L.llama_get_logits(ctx), shape=(len(ch), n_vocab)).copy()
            lp = lf.log_softmax(logits)
            for i in range(len(ch) - 1):
                w.push(lp[i], ch[i + 1])
            print(f"chunk {ci + 1}/{len(chunks)}", file=sys.stderr, flush=True)
        L.llama_batch_free(batch)
        w.finish()
    except BaseException:
        if w.written != w.expected:
            w.abort()
        raise
    print(f"wrote {w.written} positions to {a.out}")


if __name__ == "__main__":
    main()
