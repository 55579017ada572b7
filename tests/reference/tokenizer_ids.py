#!/usr/bin/env python3
"""Golden token ids from llama.cpp (via llama-cpp-python) for tests/tokenizer_parity.rs.

Usage: python tokenizer_ids.py MODEL.gguf > tests/reference/goldens/tokenizer_ids.json
       python tokenizer_ids.py --set gemma3 GEMMA3.gguf > tests/reference/goldens/tokenizer_ids_gemma3.json
Tokenizes each prompt with vocab_only=True, add_bos=False, special=True (special tokens such as
<|im_start|> are parsed). The gemma3 set (SentencePiece `llama` vocabulary) also records the ids
with add_bos=True (`ids_bos`).
"""
import json
import sys

from llama_cpp import Llama

PROMPTS = [
    ("english", "The quick brown fox jumps over the lazy dog. It wasn't me, they'd said!"),
    ("code", "fn main() {\n    let x: Vec<u32> = (0..10).map(|i| i * 2).collect();\n    println!(\"{:?}\", x);\n}\n"),
    ("digits_punct", "Pi is 3.14159, e is 2.71828; 1,000,000 + 42 = 1000042?! (yes) #100% @home $5.99"),
    ("non_ascii", "Café résumé naïve — 日本語のテキスト, 中文, Ελληνικά, русский 🦀🚀👍🏽 ok"),
    ("chatml", "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHello, who are you?<|im_end|>\n<|im_start|>assistant\n"),
    ("whitespace", "  leading spaces\tand tabs\n\n\nnewlines   trailing   "),
    ("empty", ""),
    ("mixed_special", "a<|endoftext|>b <|im_end|> c"),
]

# Gemma 3: runs of raw spaces, tabs and newlines are user-defined tokens; ▁ for spaces, no space
# prefix; byte fallback for characters outside the vocabulary.
GEMMA3_PROMPTS = [
    ("english", "The quick brown fox jumps over the lazy dog. It wasn't me, they'd said!"),
    ("code", "def fib(n):\n    if n < 2:\n        return n\n\treturn fib(n - 1) + fib(n - 2)\n\n\nprint([fib(i) for i in range(10)])\n"),
    ("digits_punct", "Pi is 3.14159, e is 2.71828; 1,000,000 + 42 = 1000042?! (yes) #100% @home $5.99 0x7fff_ffff"),
    ("non_ascii", "Café résumé naïve — 日本語のテキスト, 中文, Ελληνικά, русский 🦀🚀👍🏽 ok"),
    ("whitespace", "  leading spaces\tand tabs\n\n\nnewlines   trailing   "),
    ("long_space_run", "a" + " " * 40 + "b\n" + "\t" * 3 + "c" + "\n" * 35 + "d"),
    ("empty", ""),
    ("leading_space", " hello world"),
    ("gemma_turns", "<start_of_turn>user\nWrite a haiku.<end_of_turn>\n<start_of_turn>model\n"),
    ("html_user_defined", "<table><tr><td>1</td></tr></table><h1>Title</h1><code>x</code>"),
    ("byte_fallback", "\u0001\u007f\ue000\U0010fffd \u2028 x"),
    ("mixed_special", "a<eos>b <bos> c<pad>"),
]


def main():
    args = sys.argv[1:]
    prompts, extra_bos = PROMPTS, False
    if args[:1] == ["--set"]:
        if args[1] != "gemma3":
            sys.exit(f"unknown set {args[1]}")
        prompts, extra_bos, args = GEMMA3_PROMPTS, True, args[2:]
    path = args[0]
    llm = Llama(model_path=path, vocab_only=True, verbose=False)
    out = {"model": path.rsplit("/", 1)[-1], "add_bos": False, "special": True, "prompts": []}
    for name, text in prompts:
        ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        p = {"name": name, "text": text, "ids": ids}
        if extra_bos:
            p["ids_bos"] = llm.tokenize(text.encode("utf-8"), add_bos=True, special=True)
        out["prompts"].append(p)
    # One prompt per line keeps diffs readable.
    head = {k: v for k, v in out.items() if k != "prompts"}
    lines = [json.dumps(p, ensure_ascii=False) for p in out["prompts"]]
    sys.stdout.write(json.dumps(head, ensure_ascii=False)[:-1] + ', "prompts": [\n ')
    sys.stdout.write(",\n ".join(lines) + "\n]}\n")


if __name__ == "__main__":
    main()
