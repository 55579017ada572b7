#!/usr/bin/env python3
"""Tiny trained HuggingFace models + goldens for tests/hf_import.rs.

For each supported architecture this builds a small model with `transformers` (fixed seeds),
re-initialises every parameter with a seeded generator (so biases and norm weights are not
trivially 0/1), then TRAINS it for a few hundred Adam steps on the synthetic Markov-chain corpus
of synthetic_corpus.py (why: top-1 agreement of quantized imports is only meaningful when the
golden top-1/top-2 margins exceed quantization noise, as in trained models; random-init models
have near-ties — see synthetic_corpus.py). It then rounds the weights to the dtype they are saved
in (so the goldens are exact for the stored checkpoint), saves it with `save_pretrained`
(safetensors), and records, for a 16-token HELD-OUT sequence of the corpus (not a training
sequence) run in float32 on CPU with eager attention:

* `logits`: [16][vocab]
* `layer_norms`: [n_layers][16] — L2 norm of the residual stream leaving each decoder layer
  (a forward hook on the decoder layer; the last one is the final hidden state before the final
  norm).
* `train_loss`: [first step, last step]; `margins`: the golden top-1 minus top-2 logit per
  position (informative).
* OLMoE only: `clip_qkv` and `clip_logits` — the same model run with `config.clip_qkv` set (the
  saved config keeps `clip_qkv: null`; the test sets it in a copy).

Usage: python tests/reference/hf_goldens.py [OUT_DIR]   (default tests/reference/hf)
Deterministic for a given torch version (fixed seeds, one CPU thread); about a minute on a CPU.
Needs: torch, transformers (v4.4x or v5), safetensors, tokenizers.
"""
import json
import os
import sys

import torch
from synthetic_corpus import Corpus, margins, train
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    OlmoeConfig,
    OlmoeForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

VOCAB = 128
SEQ = 16  # golden positions
CLIP_QKV = 1.0  # OLMoE clip goldens
CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }} {{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant {% endif %}"
)


def write_tokenizer(d):
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for i in range(3, VOCAB):
        vocab[f"w{i}"] = i
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "add_bos_token": True,
                "chat_template": CHAT_TEMPLATE,
            },
            f,
            indent=1,
        )


def reinit(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if "norm" in name:
                v = 1.0 + 0.1 * torch.randn(p.shape, generator=g)
            elif name.endswith("bias"):
                v = 0.1 * torch.randn(p.shape, generator=g)
            elif "embed_tokens" in name:
                v = torch.randn(p.shape, generator=g)
            else:
                fan_in = p.shape[-1]
                v = torch.randn(p.shape, generator=g) / fan_in**0.5
            p.copy_(v)


def goldens(model, tokens):
    model.eval()
    norms = []
    hooks = [
        layer.register_forward_hook(
            lambda _m, _i, out: norms.append(
                (out[0] if isinstance(out, tuple) else out)[0].norm(dim=-1).tolist()
            )
        )
        for layer in model.model.layers
    ]
    with torch.no_grad():
        out = model(torch.tensor([tokens]), use_cache=False)
    for h in hooks:
        h.remove()
    return {
        "tokens": tokens,
        "logits": out.logits[0].tolist(),
        "layer_norms": norms,
        "margins": margins(out.logits[0]),
    }


def fit(model, corpus, seed):
    """Trains `model` (float32) on the corpus; returns [first loss, last loss]."""
    model.train()

    def loss_fn(x):
        return model(x, labels=x, use_cache=False).loss

    return list(train(list(model.parameters()), loss_fn, corpus, seed))


def round_to(model, dtype):
    """Rounds every parameter to the stored dtype so the goldens describe the saved checkpoint."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(dtype).to(torch.float32))


COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    bos_token_id=1,
    eos_token_id=2,
    attn_implementation="eager",
)

# (dir name, config class, model class, extra config, save dtype, max shard size, seed)
MODELS = [
    ("llama", LlamaConfig, LlamaForCausalLM, dict(intermediate_size=128, rope_theta=10000.0), torch.float32, None, 1),
    ("mistral", MistralConfig, MistralForCausalLM, dict(intermediate_size=128, sliding_window=6, rope_theta=10000.0), torch.bfloat16, "40KB", 2),
    ("qwen2", Qwen2Config, Qwen2ForCausalLM, dict(intermediate_size=128, tie_word_embeddings=True, rope_theta=1000000.0), torch.float16, None, 3),
    ("mixtral", MixtralConfig, MixtralForCausalLM, dict(intermediate_size=64, num_local_experts=4, num_experts_per_tok=2, rope_theta=1000000.0), torch.bfloat16, None, 4),
    ("olmoe", OlmoeConfig, OlmoeForCausalLM, dict(intermediate_size=64, num_experts=4, num_experts_per_tok=2, norm_topk_prob=False), torch.bfloat16, None, 5),
]


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "hf")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    corpus = Corpus(VOCAB)
    for name, C, M, extra, dtype, shard, seed in MODELS:
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        for f in os.listdir(d):
            os.remove(os.path.join(d, f))
        kw = dict(COMMON)
        kw.update(extra)
        torch.manual_seed(seed)
        model = M(C(**kw)).to(torch.float32)
        reinit(model, seed)
        loss = fit(model, corpus, seed)
        round_to(model, dtype)
        g = goldens(model, corpus.heldout(SEQ))
        g["train_loss"] = loss
        if name == "olmoe":
            model.config.clip_qkv = CLIP_QKV
            clipped = goldens(model, g["tokens"])["logits"]
            model.config.clip_qkv = None
            dl = max(abs(a - b) for ra, rb in zip(clipped, g["logits"]) for a, b in zip(ra, rb))
            assert dl > 1e-2, f"clip_qkv {CLIP_QKV} does not clip anything (max change {dl})"
            g["clip_qkv"] = CLIP_QKV
            g["clip_logits"] = clipped
        g["arch"] = name
        g["save_dtype"] = str(dtype).replace("torch.", "")
        g["transformers"] = __import__("transformers").__version__
        save_kw = {"max_shard_size": shard} if shard else {}
        model.to(dtype).save_pretrained(d, **save_kw)
        write_tokenizer(d)
        with open(os.path.join(d, "goldens.json"), "w") as f:
            json.dump(g, f)
        print(f"{name:8} loss {loss[0]:.3f} -> {loss[1]:.3f}  min margin {min(g['margins']):.3f}")


if __name__ == "__main__":
    main()
