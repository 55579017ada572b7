#!/usr/bin/env python3
"""A tiny trained Gemma 3 (HF `transformers` Gemma3ForCausalLM) exported as a `gemma3` GGUF, with
goldens, for tests/gemma3_tiny.rs: the outside oracle of our gemma3 architecture.

The model has llama.cpp's default layer pattern (7 layers: local ×5, global, local; sliding window
4 so the window matters within the 24 golden positions), RoPE base 1e6 global / 1e4 local, 4 query
heads and 2 KV heads of head_dim 32 (q_dim 128 ≠ d 64), per-head Q/K norms, post-norms, GeGLU
(tanh GELU), embedding × √d, tied output. Every parameter is re-initialised with a seeded
generator (norm weights too, so Gemma's 1 + w matters), then trained for 300 Adam steps on the
synthetic Markov corpus (synthetic_corpus.py: wide top-1 margins). The matrices (and the
embedding) are then rounded to Q8_0 and the HF model is given the dequantized values, so the GGUF
(matrices Q8_0, norms F32 holding 1 + w as llama.cpp's converter writes them) is exactly the
model HF runs.

Writes into OUT_DIR (default tests/reference/gemma3_tiny):
* model.gguf — the GGUF (tokenizer: a tiny SentencePiece-style `llama` vocabulary, byte tokens);
* goldens.json — `ids` (a held-out 24-token sequence), `hf_logits` [24][vocab] (float32 forward,
  eager attention, CPU), `f64_logits` [24][vocab] (gemma3_f64_reference.py on model.gguf),
  `margins`, `train_loss`, `layer_types`.

Usage: PYTHONPATH=<llama.cpp>/gguf-py python tests/reference/gemma3_tiny.py [OUT_DIR]
Deterministic for a given torch version (fixed seeds, one CPU thread).
Needs torch, transformers (v5), numpy, gguf-py.
"""
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf  # noqa: E402
from gguf.quants import dequantize, quantize  # noqa: E402
from synthetic_corpus import Corpus, margins, train  # noqa: E402
from transformers import Gemma3ForCausalLM, Gemma3TextConfig  # noqa: E402

import gemma3_f64_reference  # noqa: E402

VOCAB = 320
SEQ = 24
D, FF, LAYERS, HEADS, KV, HD = 64, 128, 7, 4, 2, 32
WINDOW = 4
EPS = 1e-6
Q8 = gguf.GGMLQuantizationType.Q8_0


def layer_types():
    # llama.cpp's default pattern (6): every 6th layer (index 5, 11, ...) is global.
    return ["full_attention" if i % 6 == 5 else "sliding_attention" for i in range(LAYERS)]


def build():
    cfg = Gemma3TextConfig(
        vocab_size=VOCAB, hidden_size=D, intermediate_size=FF, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=KV, head_dim=HD, query_pre_attn_scalar=HD,
        sliding_window=WINDOW, layer_types=layer_types(), max_position_embeddings=256,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
        },
        rms_norm_eps=EPS, tie_word_embeddings=True, pad_token_id=0, eos_token_id=1,
        bos_token_id=2, final_logit_softcapping=None, attn_logit_softcapping=None,
        hidden_activation="gelu_pytorch_tanh",
    )
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    m = Gemma3ForCausalLM(cfg).float().eval()
    g = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for name, p in m.named_parameters():
            std = 0.3 if "norm" in name else 0.08
            p.copy_(torch.randn(p.shape, generator=g) * std)
    return m


def tokenizer_vocab():
    toks = ["<pad>", "<eos>", "<bos>", "<unk>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [3, 3, 3, 2] + [6] * 256
    scores = [0.0] * len(toks)
    pieces = ["▁", "e", "t", "a", "o", "n", "▁t", "he", "▁the", "▁a", "in", "er", "on", "▁o",
              "re", "at", "en", "▁s", "is", "▁w", "it", "or", "an", "▁c", "es", "▁th", "ed",
              "▁b", "ar", "▁f", "▁p", "ng", "▁m", "al", "▁in", "ou", "le", "▁d", "nd", "▁to",
              "i", "s", "h", "r", "d", "l", "u", "c", "m", "w", "f", "g", "y", "p", "b", "v",
              "k", "x", "j", "q"]
    for i, p in enumerate(pieces[: VOCAB - len(toks)]):
        toks.append(p)
        types.append(1)
        scores.append(-float(i))
    while len(toks) < VOCAB:
        toks.append(f"<unused{len(toks)}>")
        types.append(3)
        scores.append(-1000.0)
    return toks, scores, types


def q8_round(t):
    """Rounds a 2-D float tensor to Q8_0 (rows of 32-blocks); returns (bytes, dequantized)."""
    a = t.detach().float().numpy().astype(np.float32)
    qb = quantize(a, Q8)
    return qb, torch.from_numpy(dequantize(qb, Q8).reshape(a.shape).astype(np.float32))


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "gemma3_tiny")
    os.makedirs(out_dir, exist_ok=True)
    torch.set_num_threads(1)
    m = build()
    corpus = Corpus(VOCAB)
    params = [p for p in m.parameters() if p.requires_grad]
    m.train()
    first, last = train(params, lambda x: m(input_ids=x, labels=x).loss, corpus, seed=5)
    m.eval()

    # Round every matrix to Q8_0 and give HF the dequantized values.
    qbytes = {}
    with torch.no_grad():
        for name, p in m.named_parameters():
            if p.dim() == 2:
                qb, deq = q8_round(p)
                qbytes[name] = qb
                p.copy_(deq)

    ids = corpus.heldout(SEQ)
    with torch.no_grad():
        logits = m(input_ids=torch.tensor([ids])).logits[0].float()

    path = os.path.join(out_dir, "model.gguf")
    w = gguf.GGUFWriter(path, "gemma3")
    w.add_name("gemma3-tiny (cflow-tui test oracle)")
    w.add_block_count(LAYERS)
    w.add_context_length(256)
    w.add_embedding_length(D)
    w.add_feed_forward_length(FF)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV)
    w.add_key_length(HD)
    w.add_value_length(HD)
    w.add_layer_norm_rms_eps(EPS)
    w.add_rope_freq_base(1000000.0)
    w.add_sliding_window(WINDOW)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    toks, scores, types = tokenizer_vocab()
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(toks)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_unk_token_id(3)
    w.add_pad_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(False)

    sd = dict(m.named_parameters())

    def norm(name):
        # Gemma multiplies by (1 + w); llama.cpp's converter stores 1 + w.
        return (sd[name].detach().float() + 1.0).numpy().astype(np.float32)

    def mat(gname, hname):
        w.add_tensor(gname, qbytes[hname], raw_dtype=Q8)

    mat("token_embd.weight", "model.embed_tokens.weight")
    w.add_tensor("output_norm.weight", norm("model.norm.weight"))
    for i in range(LAYERS):
        p, h = f"blk.{i}.", f"model.layers.{i}."
        mat(p + "attn_q.weight", h + "self_attn.q_proj.weight")
        mat(p + "attn_k.weight", h + "self_attn.k_proj.weight")
        mat(p + "attn_v.weight", h + "self_attn.v_proj.weight")
        mat(p + "attn_output.weight", h + "self_attn.o_proj.weight")
        mat(p + "ffn_gate.weight", h + "mlp.gate_proj.weight")
        mat(p + "ffn_up.weight", h + "mlp.up_proj.weight")
        mat(p + "ffn_down.weight", h + "mlp.down_proj.weight")
        w.add_tensor(p + "attn_norm.weight", norm(h + "input_layernorm.weight"))
        w.add_tensor(p + "attn_q_norm.weight", norm(h + "self_attn.q_norm.weight"))
        w.add_tensor(p + "attn_k_norm.weight", norm(h + "self_attn.k_norm.weight"))
        w.add_tensor(p + "post_attention_norm.weight", norm(h + "post_attention_layernorm.weight"))
        w.add_tensor(p + "ffn_norm.weight", norm(h + "pre_feedforward_layernorm.weight"))
        w.add_tensor(p + "post_ffw_norm.weight", norm(h + "post_feedforward_layernorm.weight"))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    f64 = gemma3_f64_reference.forward(path, ids)
    err = float(np.abs(f64 - logits.double().numpy()).max())
    print(f"HF f32 vs f64 reference: max |dlogit| {err:.2e}; train loss {first:.3f} -> {last:.3f}")
    gold = {
        "ids": ids,
        "layer_types": layer_types(),
        "train_loss": [first, last],
        "margins": margins(logits),
        "hf_f64_max_abs": err,
        "hf_logits": logits.tolist(),
        "f64_logits": f64.tolist(),
    }
    with open(os.path.join(out_dir, "goldens.json"), "w") as f:
        json.dump(gold, f)


if __name__ == "__main__":
    main()
