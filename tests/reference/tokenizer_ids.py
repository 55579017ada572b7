#!/usr/bin/env python3
"""Golden token ids from llama.cpp (via llama-cpp-python) for tests/tokenizer_parity.rs.

Usage: python tokenizer_ids.py MODEL.gguf > tests/reference/goldens/tokenizer_ids.json
Tokenizes each prompt with vocab_only=True, add_bos=False, special=True (special tokens such as
<|im_start|> are parsed), and records llama.cpp's detokenization too.
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


def main():
    path = sys.argv[1]
    llm = Llama(model_path=path, vocab_only=True, verbose=False)
    out = {"model": path.rsplit("/", 1)[-1], "add_bos": False, "special": True, "prompts": []}
    for name, text in PROMPTS:
        ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        out["prompts"].append({"name": name, "text": text, "ids": ids})
    # One prompt per line keeps diffs readable.
    head = {k: v for k, v in out.items() if k != "prompts"}
    lines = [json.dumps(p, ensure_ascii=False) for p in out["prompts"]]
    sys.stdout.write(json.dumps(head, ensure_ascii=False)[:-1] + ', "prompts": [\n ')
    sys.stdout.write(",\n ".join(lines) + "\n]}\n")


if __name__ == "__main__":
    main()
