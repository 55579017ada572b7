#!/usr/bin/env python3
"""Golden tokenization, teacher-forced logits and greedy continuations from llama.cpp.

Usage:
    python llamacpp_goldens.py MODEL.gguf -o goldens.json [--threads 2] [--top-k 10] [--n-greedy 32]
    python llamacpp_goldens.py MODEL.gguf --flash-attn off -o goldens/smollm2_llamacpp_fa_off.json \
        --compare-with goldens/smollm2_llamacpp.json     # llama.cpp's own noise floor
    python llamacpp_goldens.py --set gemma3 GEMMA3.gguf -o goldens/gemma3_llamacpp.json
        # Gemma 3 270M (a base model): five completion prompts and a >= 500-token English text

Runs llama.cpp (through llama-cpp-python's low-level ctypes API) on a fixed set of prompts and
writes, per prompt:
  name, text    the prompt
  ids           llama.cpp's tokenization: BOS added only if the GGUF metadata asks for it
                (tokenizer.ggml.add_bos_token; `add_special=True` honours it), special tokens
                such as <|im_start|> parsed as special (parse_special=True)
  top           teacher forcing: all of `ids` evaluated in ONE batch with logits requested for
                every position; top[i] = the top-k [[id, logit], ...] (best first) of the
                prediction for position i+1 (i.e. after reading ids[0..=i])
  logsumexp     per position i, logsumexp over the full vocabulary of those logits (float64)
  greedy        llama.cpp's greedy continuation after `ids` (argmax, up to --n-greedy tokens);
                generation stops at the first end-of-generation token, which IS recorded
  greedy_stop   "eog" or "length"
  greedy_margin per greedy step, top-1 minus top-2 logit (small margins = fragile ties)
  greedy_text   llama.cpp's detokenization of `greedy` (specials rendered), for humans

The greedy steps are single-token decodes after the teacher-forced batch (the same KV cache),
so greedy[0] is the argmax of top[-1]'s logits as computed by the batch path.
Tolerance note (measured with SmolLM2 Q4_1, llama.cpp 0c1e570): the teacher-forced batch logits
are bit-identical at 1 and 2 threads and identical to token-by-token decoding, but single-token
decodes at long context are not thread-invariant: long_english's greedy run diverges at step 29
between 1 and 2 threads (top-1/top-2 margin 0.02). Compare greedy ids only up to the first step
whose greedy_margin is below a tolerance (e.g. 0.1), and logits with an absolute tolerance.
Logits are rounded to --decimals (default 5) to keep the file small. The header records the
llama-cpp-python version, llama.cpp version/commit, model size and sha256, and the settings.
"""
import argparse
import ctypes
import hashlib
import json
import os
import sys

import numpy as np
import llama_cpp as L

# The long prompt is original text written for this file (>= 400 SmolLM2 tokens).
LONG_TEXT = (
    "Before the age of satellites, a ship approaching an unfamiliar coast at night depended on a "
    "chain of lighthouses, each one with its own signature of flashes so that a navigator could "
    "tell them apart. A keeper's day was built around the lamp. In the morning he trimmed the "
    "wicks, polished the brass and the great glass lens, and wrote in the logbook how much oil had "
    "burned during the night. In the afternoon he painted railings, repaired the shutters, and "
    "checked the clockwork that turned the lens, because a light that stopped rotating would look "
    "like a different light entirely and could lead a captain onto the rocks. At dusk he climbed "
    "the spiral stairs, lit the lamp, and wound the weights, and then he kept watch until dawn, "
    "climbing again every few hours to rewind the mechanism. Storms made the work harder. Salt "
    "spray crusted the windows, wind shook the tower, and fog sometimes swallowed the beam so "
    "completely that the keeper had to sound a horn or ring a bell instead, counting the seconds "
    "between blasts for hours on end. Families often lived at the station, and children learned to "
    "read the weather before they learned to read books. Supplies arrived by boat when the sea "
    "allowed it, which in winter might mean weeks of rationing flour, coffee and lamp oil. Over the "
    "twentieth century electricity, automatic timers and radio beacons replaced most of these "
    "routines, and one by one the keepers left. Many towers still stand, some still flashing their "
    "old patterns, others turned into museums where visitors climb the same stairs and look out at "
    "the same water. The lenses, built from dozens of carefully ground prisms, remain remarkable "
    "objects: a single flame, bent and gathered by the glass, could be seen more than twenty miles "
    "away. Historians who study the logbooks find a quiet record of ordinary diligence, written one "
    "night at a time, by people whose success was measured by nothing happening at all. If a ship "
    "passed safely, nobody wrote a letter of thanks; the only proof of good work was an empty beach "
    "in the morning and another line in the book, noting the wind, the visibility, and the oil."
)

PROMPTS = [
    ("english", "The quick brown fox jumps over the lazy dog, and then it takes a long nap in the sun."),
    ("code_python",
     "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    a, b = 0, 1\n"
     "    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n\nprint(fibonacci(10))\n"),
    ("digits_punct", "Order #4521: 3 x $19.99 = $59.97 (tax 8.25%) -- due 2024-03-15, 10:30am; ref: A/B-7?!"),
    ("non_ascii", "Café crème, Müller über Zürich; 日本語のテキストです。 Emoji: 🦀🚀😀👍🏽 — fin."),
    # SmolLM2's chat template (tokenizer.chat_template) rendered with add_generation_prompt=True.
    ("chatml",
     "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
     "<|im_start|>user\nHi! Can you help me plan a picnic?<|im_end|>\n"
     "<|im_start|>assistant\nOf course! Where and when would you like to have it?<|im_end|>\n"
     "<|im_start|>user\nIn the park on Saturday. What food should I bring?<|im_end|>\n"
     "<|im_start|>assistant\n"),
    # A short chat whose greedy reply ends with <|im_end|> (exercises the EOG stop).
    ("chatml_eog",
     "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
     "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
     "<|im_start|>assistant\n"),
    ("long_english", LONG_TEXT),
]

# Original text for the Gemma 3 set: with LONG_TEXT, more than 500 Gemma tokens of English.
LONG_TEXT_2 = (
    " The same patience shows up in other trades that nobody notices until they fail. A bridge "
    "inspector walks the underside of a span with a hammer, tapping rivets and listening for the "
    "dull note that means rust has eaten the metal from inside. A water engineer reads pressure "
    "charts every morning, looking for the slow drift that warns of a leak long before a street "
    "floods. A librarian repairs the spine of a book that a hundred students have opened, so that "
    "the next hundred can open it too. None of them expects applause. Their work is judged by what "
    "does not happen: the bridge that does not fall, the pipe that does not burst, the page that "
    "does not tear. Perhaps that is why the old keepers wrote so carefully in their logbooks, "
    "recording small facts about wind and oil. The entries were a way of saying that someone had "
    "been there, awake, paying attention, and that the quiet morning was not an accident."
)

# Gemma 3 270M is a base model: completion prompts, no chat template.
GEMMA3_PROMPTS = [
    ("capital", "The capital of France is"),
    ("story", "Once upon a time, in a small village at the edge of a forest, there lived"),
    ("code_python", "def is_prime(n):\n    \"\"\"Return True if n is a prime number.\"\"\"\n"),
    ("list", "Three reasons to learn a second language:\n1."),
    ("science", "Photosynthesis is the process by which plants"),
    ("long_english", LONG_TEXT + LONG_TEXT_2),
]


@L.llama_log_callback
def _quiet(level, text, user_data):  # drop llama.cpp's logging
    pass


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def ggml_commit():
    """ggml's build commit string, read from the libggml-base shipped with llama-cpp-python."""
    libdir = os.path.join(os.path.dirname(L.__file__), "lib")
    try:
        lib = ctypes.CDLL(os.path.join(libdir, "libggml-base.so"))
        lib.ggml_commit.restype = ctypes.c_char_p
        return lib.ggml_commit().decode()
    except (OSError, AttributeError):
        return None


def tokenize(vocab, text):
    raw = text.encode("utf-8")
    cap = len(raw) + 16
    buf = (L.llama_token * cap)()
    n = L.llama_tokenize(vocab, raw, len(raw), buf, cap, True, True)  # add_special, parse_special
    if n < 0:
        raise RuntimeError(f"tokenize: need {-n} slots")
    return list(buf[:n])


def detokenize(vocab, ids):
    arr = (L.llama_token * max(1, len(ids)))(*ids)
    cap = 64 + 32 * len(ids)
    out = ctypes.create_string_buffer(cap)
    n = L.llama_detokenize(vocab, arr, len(ids), out, cap, False, True)  # render specials
    if n < 0:
        raise RuntimeError("detokenize buffer too small")
    return out.raw[:n].decode("utf-8", errors="replace")


def top_k(logits, k, decimals):
    idx = np.argpartition(-logits, k)[:k]
    idx = idx[np.lexsort((idx, -logits[idx]))]  # best first; ties broken by lower id
    return [[int(i), round(float(logits[i]), decimals)] for i in idx]


def logsumexp(logits):
    x = logits.astype(np.float64)
    m = x.max()
    return float(m + np.log(np.exp(x - m).sum()))


def run_prompt(ctx, vocab, n_vocab, ids, k, decimals, n_greedy, sink=None):
    mem = L.llama_get_memory(ctx)
    L.llama_memory_clear(mem, True)
    n = len(ids)
    batch = L.llama_batch_init(n, 0, 1)
    try:
        for i, t in enumerate(ids):
            batch.token[i] = t
            batch.pos[i] = i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = 1  # logits for every position (teacher forcing)
        batch.n_tokens = n
        if L.llama_decode(ctx, batch) != 0:
            raise RuntimeError("batch decode failed")
        top, lse = [], []
        last = None
        for i in range(n):
            lg = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, i), shape=(n_vocab,)).copy()
            top.append(top_k(lg, k, decimals))
            if sink is not None:
                sink.append(lg)
            lse.append(round(logsumexp(lg), decimals))
            last = lg
    finally:
        L.llama_batch_free(batch)

    greedy, margins, stop = [], [], "length"
    one = (L.llama_token * 1)()
    lg = last
    for step in range(n_greedy):
        two = np.argpartition(-lg, 2)[:2]
        two = two[np.lexsort((two, -lg[two]))]
        tok = int(two[0])
        greedy.append(tok)
        margins.append(round(float(lg[two[0]] - lg[two[1]]), decimals))
        if L.llama_vocab_is_eog(vocab, tok):
            stop = "eog"
            break
        if step + 1 == n_greedy:
            break
        one[0] = tok
        if L.llama_decode(ctx, L.llama_batch_get_one(one, 1)) != 0:
            raise RuntimeError("decode failed")
        lg = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, -1), shape=(n_vocab,)).copy()
    return dict(top=top, logsumexp=lse, greedy=greedy, greedy_stop=stop, greedy_margin=margins,
                greedy_text=detokenize(vocab, greedy))


def dump(doc, f):
    """JSON with one line per prompt field and one line per position of `top`: small, diffable."""
    head = {k: v for k, v in doc.items() if k != "prompts"}
    f.write(json.dumps(head, ensure_ascii=False)[:-1] + ',\n "prompts": [\n')
    for pi, p in enumerate(doc["prompts"]):
        f.write("  {\n")
        keys = list(p.keys())
        for ki, key in enumerate(keys):
            sep = "," if ki + 1 < len(keys) else ""
            if key == "top":
                rows = ",\n    ".join(json.dumps(r, separators=(",", ":")) for r in p[key])
                f.write(f'   "top": [\n    {rows}\n   ]{sep}\n')
            else:
                f.write(f"   {json.dumps(key)}: {json.dumps(p[key], ensure_ascii=False)}{sep}\n")
        f.write("  }" + ("," if pi + 1 < len(doc["prompts"]) else "") + "\n")
    f.write(" ]\n}\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--top-k", type=int, default=10)
    ap.add_argument("--n-greedy", type=int, default=32)
    ap.add_argument("--decimals", type=int, default=5)
    ap.add_argument("--n-ctx", type=int, default=1024)
    ap.add_argument("--flash-attn", choices=["auto", "on", "off"], default="auto",
                    help="llama.cpp's flash_attn_type (auto resolves to on for the CPU backend)")
    ap.add_argument("--compare-with", metavar="GOLDENS.json",
                    help="also measure this run against other goldens of the same prompts (e.g. the "
                         "flash-attention-on run) with full logits: top-1 agreement and max |dlogit| "
                         "over their top-k; written to the header as `agreement_with`")
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--set", choices=["smollm2", "gemma3"], default="smollm2",
                    help="prompt set (gemma3: completion prompts for the base model)")
    a = ap.parse_args()
    prompts = GEMMA3_PROMPTS if a.set == "gemma3" else PROMPTS

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
    cp.n_ubatch = a.n_ctx  # whole prompt in one ubatch
    cp.n_threads = a.threads
    cp.n_threads_batch = a.threads
    cp.flash_attn_type = {"auto": -1, "on": 1, "off": 0}[a.flash_attn]
    ctx = L.llama_init_from_model(model, cp)
    if not ctx:
        sys.exit("llama_init_from_model failed")

    doc = {
        "generator": "tests/reference/llamacpp_goldens.py",
        "llama_cpp_python": L.__version__,
        "llama_cpp_version": L.llama_version().decode(),
        "ggml_commit": ggml_commit(),
        "model_file": os.path.basename(a.model),
        "model_bytes": os.path.getsize(a.model),
        "model_sha256": sha256_file(a.model),
        "n_vocab": n_vocab,
        "bos_id": L.llama_vocab_bos(vocab),
        "eos_id": L.llama_vocab_eos(vocab),
        "add_bos": bool(L.llama_vocab_get_add_bos(vocab)),
        "parse_special": True,
        "n_threads": a.threads,
        "flash_attn": a.flash_attn,
        "n_ctx": a.n_ctx,
        "top_k": a.top_k,
        "n_greedy": a.n_greedy,
        "prompt_set": a.set,
        "logit_decimals": a.decimals,
        "system_info": L.llama_print_system_info().decode().strip(),
        "notes": "top[i] predicts position i+1; greedy stops at and includes the first EOG token; "
                 "compare greedy only up to the first step with a small greedy_margin (llama.cpp's "
                 "own 1- vs 2-thread runs diverge where the margin is ~0.02)",
        "prompts": [],
    }
    other = None
    if a.compare_with:
        other = {p["name"]: p for p in json.load(open(a.compare_with, encoding="utf-8"))["prompts"]}
    agree = total = 0
    max_dl = 0.0
    for name, text in prompts:
        ids = tokenize(vocab, text)
        if len(ids) + a.n_greedy > a.n_ctx:
            sys.exit(f"{name}: {len(ids)} tokens do not fit n_ctx {a.n_ctx}")
        full = []
        res = run_prompt(ctx, vocab, n_vocab, ids, a.top_k, a.decimals, a.n_greedy, full)
        if other is not None:
            o = other[name]
            if o["ids"] != ids:
                sys.exit(f"{name}: --compare-with goldens tokenize differently")
            for lg, otop in zip(full, o["top"]):
                total += 1
                agree += int(np.argmax(lg)) == otop[0][0]
                max_dl = max(max_dl, max(abs(float(lg[i]) - v) for i, v in otop))
        doc["prompts"].append(dict(name=name, text=text, ids=ids, **res))
        print(f"{name:14s} {len(ids):4d} ids | greedy {len(res['greedy'])} ({res['greedy_stop']}) "
              f"min margin {min(res['greedy_margin']):.4f} | {res['greedy_text']!r:.60}", file=sys.stderr)
    if other is not None:
        doc["agreement_with"] = {
            "goldens": os.path.basename(a.compare_with),
            "positions": total,
            "top1_agree": agree,
            "top1_rate": round(agree / total, 5),
            "max_abs_dlogit_over_their_topk": round(max_dl, 5),
        }
        print(f"vs {a.compare_with}: top-1 {agree}/{total} = {100 * agree / total:.2f}%, "
              f"max |dlogit| over its top-{a.top_k} {max_dl:.4f}", file=sys.stderr)
    L.llama_free(ctx)
    L.llama_model_free(model)
    with open(a.output, "w", encoding="utf-8") as f:
        dump(doc, f)
    print(f"wrote {a.output} ({os.path.getsize(a.output)} bytes)", file=sys.stderr)


if __name__ == "__main__":
    main()
