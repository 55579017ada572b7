"""The reference-logits file of `cflow-tui perplexity --save-logits / --kl-divergence`, in Python.

The format is documented in docs/FORMAT.md ("Reference logits") and owned by
src/ppl/logits_file.rs; this module writes the same bytes (same quantization of each row) so the
llama.cpp and float64 references can be compared by `cflow-tui perplexity --kl-divergence`.
"""
import os
import struct
import tempfile

import numpy as np

MAGIC = b"CFLOGIT1"
VERSION = 1
RANGE = 32.0


def positions(n_tokens, n_ctx):
    full, rem = divmod(n_tokens, n_ctx)
    return full * (n_ctx - 1) + max(rem - 1, 0)


def read_header(path):
    """Header fields and tokens (the rows are not read)."""
    with open(path, "rb") as f:
        head = f.read(32)
        if head[:8] != MAGIC:
            raise ValueError(f"{path}: not a reference-logits file")
        version, n_vocab, n_ctx, n_tokens, n_pos, label_len = struct.unpack("<6I", head[8:32])
        if version != VERSION:
            raise ValueError(f"{path}: version {version}")
        label = f.read(label_len).decode("utf-8")
        tokens = list(struct.unpack(f"<{n_tokens}I", f.read(4 * n_tokens)))
    if n_pos != positions(n_tokens, n_ctx):
        raise ValueError(f"{path}: n_positions {n_pos} does not match")
    return dict(n_vocab=n_vocab, n_ctx=n_ctx, label=label, tokens=tokens)


def log_softmax(logits):
    x = np.asarray(logits, dtype=np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - (m + np.log(np.exp(x - m).sum(axis=-1, keepdims=True)))


def encode_row(lp, target):
    mx, mn = float(lp.max()), float(lp.min())
    lo = max(mn, mx - RANGE)
    lo32, sc32 = np.float32(lo), np.float32((mx - lo) / 65535.0)
    if sc32 > 0:
        q = np.clip(np.round((np.maximum(lp, lo) - float(lo32)) / float(sc32)), 0, 65535).astype("<u2")
    else:
        q = np.zeros(lp.shape[0], dtype="<u2")
    return struct.pack("<fff", lo32, sc32, np.float32(lp[target])) + q.tobytes()


class Writer:
    """Writes PATH atomically: a temporary file in the same directory, renamed by finish()."""

    def __init__(self, path, n_vocab, n_ctx, tokens, label):
        self.path, self.n_vocab = path, n_vocab
        self.expected, self.written = positions(len(tokens), n_ctx), 0
        d = os.path.dirname(os.path.abspath(path))
        self.f = tempfile.NamedTemporaryFile(dir=d, prefix="." + os.path.basename(path) + ".", suffix=".tmp",
                                             delete=False)
        lab = label.encode("utf-8")[:1024]
        self.f.write(MAGIC + struct.pack("<6I", VERSION, n_vocab, n_ctx, len(tokens), self.expected, len(lab)))
        self.f.write(lab + struct.pack(f"<{len(tokens)}I", *tokens))

    def push(self, lp, target):
        assert lp.shape == (self.n_vocab,)
        self.f.write(encode_row(lp, target))
        self.written += 1

    def finish(self):
        if self.written != self.expected:
            self.abort()
            raise RuntimeError(f"{self.path}: {self.written} rows, expected {self.expected}")
        self.f.flush()
        os.fsync(self.f.fileno())
        self.f.close()
        os.replace(self.f.name, self.path)

    def abort(self):
        if not self.f.closed:
            self.f.close()
        if os.path.exists(self.f.name):
            os.unlink(self.f.name)


def chunks(tokens, n_ctx, max_chunks=None):
    out = [tokens[i:i + n_ctx] for i in range(0, len(tokens), n_ctx)]
    return out if max_chunks is None else out[:max_chunks]


def truncate(src, dst, chunks=None):
    """Writes DST: the first CHUNKS whole chunks of SRC (default: as many as SRC holds complete
    rows for; SRC may be the temporary file of a run still in progress). Returns the chunk count."""
    h = read_header(src)
    n_ctx, n_vocab, toks = h["n_ctx"], h["n_vocab"], h["tokens"]
    row = 12 + 2 * n_vocab
    start = 32 + len(h["label"].encode("utf-8")) + 4 * len(toks)
    have = (os.path.getsize(src) - start) // row
    k = have // (n_ctx - 1)
    k = min(k, len(toks) // n_ctx) if chunks is None else chunks
    if k * (n_ctx - 1) > have:
        raise ValueError(f"{src}: holds {have} rows, fewer than {k} chunks")
    tokens = toks[:k * n_ctx]
    w = Writer(dst, n_vocab, n_ctx, tokens, h["label"])
    with open(src, "rb") as f:
        f.seek(start)
        for _ in range(w.expected):
            w.f.write(f.read(row))
            w.written += 1
    w.finish()
    return k


def concat(srcs, dst):
    """Writes DST: the chunks of each SRC in turn (all of whole chunks, same n_vocab and n_ctx;
    the label of the first)."""
    hs = [read_header(s) for s in srcs]
    n_ctx, n_vocab = hs[0]["n_ctx"], hs[0]["n_vocab"]
    for s, h in zip(srcs, hs):
        if (h["n_ctx"], h["n_vocab"]) != (n_ctx, n_vocab) or len(h["tokens"]) % n_ctx:
            raise ValueError(f"{s}: other geometry, or not whole chunks")
    w = Writer(dst, n_vocab, n_ctx, [t for h in hs for t in h["tokens"]], hs[0]["label"])
    row = 12 + 2 * n_vocab
    for s, h in zip(srcs, hs):
        with open(s, "rb") as f:
            f.seek(32 + len(h["label"].encode("utf-8")) + 4 * len(h["tokens"]))
            for _ in range(positions(len(h["tokens"]), n_ctx)):
                w.f.write(f.read(row))
                w.written += 1
    w.finish()
    return w.written


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="truncate SRC DST [--chunks K] | concat DST SRC...")
    ap.add_argument("cmd", choices=["truncate", "concat"])
    ap.add_argument("paths", nargs="+")
    ap.add_argument("--chunks", type=int, default=None)
    a = ap.parse_args()
    if a.cmd == "truncate":
        src, dst = a.paths
        print(f"{dst}: {truncate(src, dst, a.chunks)} chunks")
    else:
        print(f"{a.paths[0]}: {concat(a.paths[1:], a.paths[0])} positions")
