"""Synthetic training corpus and training loop for the tiny reference models.

Used by hf_goldens.py and pipeline_native.py. Why the tiny models are trained at all:
tests/hf_import.rs checks quantized imports (Q8_0, Q4_0) by teacher-forced top-1 agreement with
the float goldens. That is only meaningful when the golden top-1/top-2 logit margins exceed the
quantization noise, as they do in trained models (the situation the paper's §5.11 bar is about).
Random-init models have near-ties at some positions (top-1/top-2 gaps down to ~0.003 logit), so on
them the agreement measures quantization noise, not the engine. So every model is randomly
initialised with a fixed seed and then trained for a few hundred Adam steps on this corpus, and
the goldens are taken on a HELD-OUT sequence from the same distribution (never a training
sequence).

The corpus is a fixed-seed first-order Markov chain over the content tokens 3 .. vocab-1 (0, 1, 2
are <unk>, <s>, </s>): every token has one main successor (a fixed random permutation), taken with
probability P_MAIN; otherwise the next token is uniform over the content tokens. A sequence
starts at a uniformly random content token (no <s>: the prediction after <s> would be uniform, a
near-tie by construction). The structure is learnable in seconds on a CPU, and a trained model
predicts the main successor at every position with a wide margin.
"""
import torch

FIRST = 3  # first content token
P_MAIN = 0.9
CHAIN_SEED = 7  # the chain itself (shared by every model)
HELDOUT_SEED = 99991  # the held-out stream, disjoint from every training stream


class Corpus:
    def __init__(self, vocab):
        self.vocab = vocab
        g = torch.Generator().manual_seed(CHAIN_SEED)
        n = vocab - FIRST
        self.succ = torch.randperm(n, generator=g) + FIRST  # main successor of FIRST + i
        self.seen = set()

    def sample(self, g, batch, length):
        """[batch, length] token ids: a random start, then `length - 1` steps of the chain."""
        n = self.vocab - FIRST
        out = torch.empty(batch, length, dtype=torch.long)
        out[:, 0] = torch.randint(FIRST, self.vocab, (batch,), generator=g)
        for t in range(1, length):
            main = self.succ[out[:, t - 1] - FIRST]
            noise = torch.randint(FIRST, self.vocab, (batch,), generator=g)
            keep = torch.rand(batch, generator=g) < P_MAIN
            out[:, t] = torch.where(keep, main, noise)
        assert n > 0
        return out

    def train_batch(self, g, batch, length):
        x = self.sample(g, batch, length)
        for row in x.tolist():
            self.seen.add(tuple(row))
        return x

    def heldout(self, length):
        """One sequence from the held-out stream that is not a prefix of any training sequence."""
        g = torch.Generator().manual_seed(HELDOUT_SEED)
        while True:
            s = self.sample(g, 1, length)[0].tolist()
            if not any(tuple(r[:length]) == tuple(s) for r in self.seen):
                return s


def train(params, loss_fn, corpus, seed, steps=300, batch=32, length=33, lr=3e-3):
    """Adam on next-token cross-entropy. `loss_fn(tokens [B, T]) -> scalar`. Returns the losses
    of the first and last step."""
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(params, lr=lr)
    first = last = None
    for step in range(steps):
        x = corpus.train_batch(g, batch, length)
        loss = loss_fn(x)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if first is None:
            first = loss.item()
        last = loss.item()
    return first, last


def margins(logits):
    """Top-1 minus top-2 logit per position ([T, V] tensor) as a list."""
    top = logits.topk(2, dim=-1).values
    return (top[:, 0] - top[:, 1]).tolist()
