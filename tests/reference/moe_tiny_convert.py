#!/usr/bin/env python3
"""Runs llama.cpp's OWN convert_hf_to_gguf.py on a tiny moe_tiny.py checkpoint.

Usage: python tests/reference/moe_tiny_convert.py --pre NAME HF_DIR --outtype f32 --outfile X.gguf
  (every argument except `--pre NAME` goes to convert_hf_to_gguf.py unchanged)
Environment: LLAMA_CPP_DIR = the llama.cpp source tree (default: the one vendored in the
llama-cpp-python sdist, /tmp/anchor/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp). Its gguf-py
is put first on sys.path, because the converter must match it.

The ONE change: the converter's gpt2-vocabulary path identifies the pre-tokenizer by hashing how
the HF tokenizer splits a check string (`TextModel.get_vocab_base_pre`) and refuses hashes it does
not know. Our tiny byte-level BPE tokenizer (moe_tiny.py) matches no real model's hash, so this
wrapper imports convert_hf_to_gguf as a module, replaces ONLY that method by one that returns
NAME -- the `tokenizer.ggml.pre` value real GGUF files of that family carry (qwen2 for
qwen2moe/qwen3/qwen3moe, olmo for OLMoE, llama-bpe for Mixtral, whose tokenizer.json-only
byte-level BPE also takes the gpt2 path) -- and then calls the converter's main(). Everything else,
in particular the tensor conversion (names, stacking of experts, Q/K permutation, Q8_0
quantisation) and the hyperparameter metadata, is llama.cpp's, unchanged. The pre-tokenizer only
affects how llama.cpp splits TEXT; the goldens pass token ids directly.
"""
import os
import sys

DEFAULT_LLAMA_CPP = "/tmp/anchor/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp"


def main():
    args = sys.argv[1:]
    if "--pre" not in args:
        sys.exit(__doc__)
    i = args.index("--pre")
    pre = args[i + 1]
    del args[i:i + 2]

    root = os.path.abspath(os.environ.get("LLAMA_CPP_DIR", DEFAULT_LLAMA_CPP))
    sys.path.insert(0, os.path.join(root, "gguf-py"))
    sys.path.insert(0, root)
    import gguf
    assert os.path.abspath(gguf.__file__).startswith(root), f"gguf-py not from {root}: {gguf.__file__}"
    import convert_hf_to_gguf
    from conversion.base import TextModel

    def get_vocab_base_pre(self, tokenizer):
        return pre

    TextModel.get_vocab_base_pre = get_vocab_base_pre
    sys.argv = [os.path.join(root, "convert_hf_to_gguf.py")] + args
    convert_hf_to_gguf.main()


if __name__ == "__main__":
    main()
