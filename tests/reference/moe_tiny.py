#!/usr/bin/env python3
"""Tiny trained HF `transformers` models of five architectures (qwen3 dense, qwen3moe, olmoe,
mixtral, qwen2moe) plus `qwen3moe_k`, saved with `save_pretrained` for llama.cpp's own converter,
with HF goldens: the outside oracle of our GGUF importer for these architectures.

Each model (fixed seeds, one CPU thread) is built from its HF config class, every parameter is
re-initialised with a seeded generator (as hf_goldens.py does: norm weights 1 + 0.1·N(0,1),
biases 0.1·N(0,1), embeddings N(0,1), matrices N(0,1)/sqrt(fan_in)), so norms and biases are not
trivially 1/0, then trained for 300 Adam steps on the synthetic Markov corpus of
synthetic_corpus.py (wide top-1 margins, see there). The model is saved in float32 (so the HF
goldens describe the saved checkpoint exactly, and the F32 GGUF is the same numbers) together with
a tiny byte-level BPE tokenizer (tokenizer.json; 3 special tokens, 256 byte tokens, merges up to
the vocabulary size) that loads in AutoTokenizer, in convert_hf_to_gguf.py and in llama.cpp. The
corpus works on ids, so the tokenizer's content does not matter for the goldens.

Common shape: vocab 320, d_model 64, 2 layers, 4 query heads of head_dim 16, 2 KV heads (OLMoE: 4,
it has no GQA), RMSNorm eps 1e-6 (OLMoE: 1e-5, because llama.cpp's OLMoE converter writes 1e-5
whatever the config says), RoPE theta 10000, max positions 256, tied/untied as the HF class
defaults. MoE: 4 experts, top-2, expert FFN 64. qwen3 dense FFN 128. qwen2moe: shared expert FFN
128 with its sigmoid gate, norm_topk_prob False. qwen3moe: norm_topk_prob True (llama.cpp's
qwen3moe graph always renormalises). OLMoE: norm_topk_prob False, clip_qkv None. qwen3moe_k: like
qwen3moe but d_model 256, head_dim 64 (4 x 64 = 256), expert FFN 256, so that every matrix row
length is a multiple of 256 and llama-quantize's Q4_K_M really picks Q4_K/Q6_K (at d 64 it falls
back to legacy types).

Writes OUT_DIR/goldens.json:
  arch          GGUF architecture name (mixtral -> "llama")
  name          this directory's case name (qwen3, qwen3moe, olmoe, mixtral, qwen2moe, qwen3moe_k)
  hf_class, transformers, torch   versions / class
  config        the HF config dict (config.json's content)
  ids           a held-out sequence of 24 token ids from the corpus (not a training sequence)
  hf_logits     [24][vocab] float32 forward, eager attention, eager experts, CPU (exact float32
                values as JSON doubles)
  margins       top-1 minus top-2 logit per position
  train_loss    [first step, last step]
  router        (MoE only) [n_layers][24] {"ids": the top-k expert ids as the HF router selects
                them (best first), "probs": the top-(k+1) softmax probabilities over ALL experts,
                descending}, from the router logits of this forward (forward hook on mlp.gate)
  router_near_ties  (MoE only) number of (layer, position) with probs[k-1] - probs[k] < 1e-4
  expert_use    (MoE only) [n_layers][n_experts] how often each expert is selected in the golden
                sequence (informative)

Usage: python tests/reference/moe_tiny.py ARCH HF_DIR OUT_DIR
  ARCH in qwen3 qwen3moe olmoe mixtral qwen2moe qwen3moe_k; HF_DIR is a scratch directory
  (emptied, then save_pretrained + tokenizer); OUT_DIR receives goldens.json.
Deterministic for a given torch/transformers version (fixed seeds, one CPU thread).
Needs torch, transformers (v5), tokenizers, safetensors.
"""
import json
import os
import shutil
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import transformers  # noqa: E402
from synthetic_corpus import Corpus, margins, train  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers  # noqa: E402
from transformers import (  # noqa: E402
    MixtralConfig,
    MixtralForCausalLM,
    OlmoeConfig,
    OlmoeForCausalLM,
    Qwen2MoeConfig,
    Qwen2MoeForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

VOCAB = 320
SEQ = 24
NEAR_TIE = 1e-4
SPECIALS = ["<unk>", "<s>", "</s>"]  # ids 0, 1, 2 (the corpus never emits them)

COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=None,
    attn_implementation="eager",
    experts_implementation="eager",
)

MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64)

# name -> (GGUF arch, config class, model class, config overrides, seed)
CASES = {
    "qwen3": ("qwen3", Qwen3Config, Qwen3ForCausalLM, dict(intermediate_size=128), 21),
    "qwen3moe": ("qwen3moe", Qwen3MoeConfig, Qwen3MoeForCausalLM,
                 dict(MOE, intermediate_size=128, norm_topk_prob=True, decoder_sparse_step=1,
                      mlp_only_layers=[]), 22),
    "olmoe": ("olmoe", OlmoeConfig, OlmoeForCausalLM,
              dict(num_experts=4, num_experts_per_tok=2, intermediate_size=64, num_key_value_heads=4,
                   norm_topk_prob=False, clip_qkv=None, rms_norm_eps=1e-5), 23),
    "mixtral": ("llama", MixtralConfig, MixtralForCausalLM,
                dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=64,
                     router_jitter_noise=0.0, sliding_window=None), 24),
    "qwen2moe": ("qwen2moe", Qwen2MoeConfig, Qwen2MoeForCausalLM,
                 dict(MOE, intermediate_size=128, shared_expert_intermediate_size=128,
                      norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[]), 25),
    "qwen3moe_k": ("qwen3moe", Qwen3MoeConfig, Qwen3MoeForCausalLM,
                   dict(MOE, hidden_size=256, head_dim=64, moe_intermediate_size=256,
                        intermediate_size=512, norm_topk_prob=True, decoder_sparse_step=1,
                        mlp_only_layers=[]), 26),
}


def bytes_to_unicode():
    """GPT-2's byte -> printable unicode character map (the ByteLevel alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


# Merges (each part is a byte token or an earlier merge); "Ġ" is the byte-level space.
MERGES = [
    ("Ġ", "t"), ("h", "e"), ("i", "n"), ("r", "e"), ("o", "n"), ("Ġ", "a"), ("e", "r"), ("a", "t"),
    ("Ġt", "he"), ("e", "n"), ("o", "r"), ("e", "s"), ("Ġ", "s"), ("a", "n"), ("Ġ", "w"), ("e", "d"),
    ("i", "s"), ("Ġ", "c"), ("i", "t"), ("a", "r"), ("a", "l"), ("Ġ", "o"), ("Ġ", "b"), ("Ġ", "f"),
    ("Ġ", "p"), ("o", "u"), ("Ġ", "m"), ("l", "e"), ("Ġ", "d"), ("n", "d"), ("in", "g"), ("Ġ", "h"),
    ("Ġ", "i"), ("Ġ", "l"), ("Ġ", "n"), ("Ġ", "e"), ("Ġ", "g"), ("Ġ", "r"), ("s", "t"), ("Ġ", "I"),
    ("Ġ", "T"), ("Ġ", "A"), ("l", "l"), ("o", "m"), ("i", "c"), ("v", "e"), ("Ġo", "f"), ("Ġa", "nd"),
    ("Ġt", "o"), ("Ġi", "n"), ("Ġ", "1"), ("Ġ", "2"), ("Ġ", "3"), ("1", "0"), ("0", "0"), ("e", "l"),
    ("r", "o"), ("i", "on"), ("a", "s"), ("u", "r"), ("e", "t"),
]


def write_tokenizer(d):
    """A byte-level BPE tokenizer of exactly VOCAB tokens: specials, 256 bytes, merges."""
    vocab = {s: i for i, s in enumerate(SPECIALS)}
    for _b, ch in sorted(bytes_to_unicode().items()):
        vocab[ch] = len(vocab)
    for a, b in MERGES:
        assert a in vocab and b in vocab and a + b not in vocab, (a, b)
        vocab[a + b] = len(vocab)
    assert len(vocab) == VOCAB, len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=MERGES, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    tok.save(os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": "<s>",
            "eos_token": "</s>",
            "unk_token": "<unk>",
            "add_bos_token": False,
            "add_eos_token": False,
            "model_max_length": 256,
        }, f, indent=1)


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


def build(name):
    arch, C, M, extra, seed = CASES[name]
    kw = dict(COMMON)
    kw.update(extra)
    cfg = C(**kw)
    torch.manual_seed(seed)
    model = M(cfg).to(torch.float32)
    reinit(model, seed)
    return arch, model, seed


def goldens(model, ids, moe):
    model.eval()
    routers = []
    hooks = []
    if moe:
        for layer in model.model.layers:
            hooks.append(layer.mlp.gate.register_forward_hook(
                lambda _m, _i, out: routers.append((out[0].detach().float(), out[2].detach()))))
    with torch.no_grad():
        out = model(torch.tensor([ids]), use_cache=False)
    for h in hooks:
        h.remove()
    logits = out.logits[0].float()
    g = {"ids": ids, "hf_logits": logits.tolist(), "margins": margins(logits)}
    if moe:
        k = model.config.num_experts_per_tok
        n_exp = getattr(model.config, "num_experts", None) or model.config.num_local_experts
        router, ties, use = [], 0, []
        for rl, idx in routers:
            assert rl.shape == (len(ids), n_exp), rl.shape
            probs = torch.softmax(rl, dim=-1)
            top = probs.topk(k + 1, dim=-1).values
            rows = []
            count = [0] * n_exp
            for t in range(len(ids)):
                sel = idx[t].tolist()
                for e in sel:
                    count[e] += 1
                p = top[t].tolist()
                ties += int(p[k - 1] - p[k] < NEAR_TIE)
                rows.append({"ids": sel, "probs": p})
            router.append(rows)
            use.append(count)
        g["router"] = router
        g["router_near_ties"] = ties
        g["expert_use"] = use
    return g


def main():
    if len(sys.argv) != 4 or sys.argv[1] not in CASES:
        sys.exit(f"usage: {sys.argv[0]} {{{'|'.join(CASES)}}} HF_DIR OUT_DIR")
    name, hf_dir, out_dir = sys.argv[1:]
    torch.set_num_threads(1)
    torch.manual_seed(0)
    arch, model, seed = build(name)
    moe = arch != "qwen3"
    corpus = Corpus(VOCAB)
    model.train()
    first, last = train(list(model.parameters()), lambda x: model(x, labels=x, use_cache=False).loss,
                        corpus, seed)
    g = goldens(model, corpus.heldout(SEQ), moe)
    doc = {
        "arch": arch,
        "name": name,
        "hf_class": type(model).__name__,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "config": json.loads(model.config.to_json_string(use_diff=False)),
        "train_loss": [first, last],
    }
    doc.update(g)

    if os.path.isdir(hf_dir):
        shutil.rmtree(hf_dir)
    os.makedirs(hf_dir)
    model.save_pretrained(hf_dir)  # float32 safetensors
    write_tokenizer(hf_dir)
    # the saved checkpoint reloads to the same logits
    re = type(model).from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager",
                                     experts_implementation="eager")
    re.eval()
    with torch.no_grad():
        again = re(torch.tensor([g["ids"]]), use_cache=False).logits[0]
    dl = float((again - torch.tensor(g["hf_logits"])).abs().max())
    assert dl == 0.0, f"reloaded checkpoint differs: max |dlogit| {dl}"
    tok = transformers.AutoTokenizer.from_pretrained(hf_dir)
    assert len(tok) == VOCAB, len(tok)

    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "goldens.json"), "w") as f:
        json.dump(doc, f)
    msg = f"{name:10} loss {first:.3f} -> {last:.3f}  min margin {min(g['margins']):.3f}"
    if moe:
        msg += f"  router near-ties {g['router_near_ties']}  expert use {g['expert_use']}"
    print(msg)


if __name__ == "__main__":
    main()
