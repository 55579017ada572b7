//! The GGUF architectures `import` runs, as data: for each `general.architecture` name, the
//! semantics llama.cpp's graph for it hard-codes (`src/models/<arch>.cpp` in llama.cpp) that the
//! metadata does not carry: RoPE pairing, Q/K/V bias, Q/K norms, how router logits become
//! expert weights, and whether layers carry a gated shared expert. The metadata keys (expert
//! counts, widths, norms, RoPE) are read by `import_gguf`; this file is the one place that
//! matches on the architecture name.

use crate::model::{RopeStyle, RouterNorm};

/// How Q and K are RMS-normalised after their projections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QkNorm {
    None,
    /// One RMS over the whole projection output (OLMoE).
    Whole,
    /// One RMS per head (Qwen3, Gemma 3).
    PerHead,
}

/// What a MoE layer's FFN is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Moe {
    /// No experts: a dense gated FFN (`ffn_gate`/`ffn_up`/`ffn_down`).
    Never,
    /// Experts when `expert_count` > 0, else dense (`llama`: Mixtral vs Llama).
    IfExperts,
    /// Always experts (`expert_count` must be > 0).
    Always,
}

/// The fixed semantics of one GGUF architecture.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArchSpec {
    pub name: &'static str,
    pub rope: RopeStyle,
    /// Q/K/V projections carry biases (`attn_q.bias` …), required.
    pub qkv_bias: bool,
    pub qk_norm: QkNorm,
    pub moe: Moe,
    /// Router logits → weights: softmax over the selected top-k (llama.cpp's `norm_w = true`:
    /// softmax over all then renormalised over the k, the same numbers), or softmax over all
    /// without renormalising (`norm_w = false`).
    pub router: RouterNorm,
    /// Each MoE layer also has a shared expert (`ffn_*_shexp`) scaled by σ(`ffn_gate_inp_shexp`
    /// · x̂) (Qwen2-MoE).
    pub shared_expert: bool,
    /// Gemma 3's extras (layer pattern, post-norms, GeGLU, embedding scale): `gguf_gemma3`.
    pub gemma3: bool,
}

const BASE: ArchSpec = ArchSpec {
    name: "",
    rope: RopeStyle::SplitHalf,
    qkv_bias: false,
    qk_norm: QkNorm::None,
    moe: Moe::Never,
    router: RouterNorm::SoftmaxTopk,
    shared_expert: false,
    gemma3: false,
};

/// Every architecture `import` runs. Rope: llama.cpp's converter permutes the Q/K rows of
/// `llama`/`mistral` for its NORM rope (adjacent pairs); every other one here is NEOX
/// (`llama_model_rope_type`), i.e. HF's `rotate_half`.
pub const ARCHS: &[ArchSpec] = &[
    // Llama, and Mixtral (`llama` with `expert_count`): `norm_w = true` in llama.cpp's graph.
    ArchSpec {
        name: "llama",
        rope: RopeStyle::Adjacent,
        moe: Moe::IfExperts,
        ..BASE
    },
    ArchSpec {
        name: "mistral",
        rope: RopeStyle::Adjacent,
        ..BASE
    },
    ArchSpec {
        name: "qwen2",
        qkv_bias: true,
        ..BASE
    },
    ArchSpec {
        name: "qwen3",
        qk_norm: QkNorm::PerHead,
        ..BASE
    },
    // qwen3moe.cpp passes norm_w = true whatever `norm_topk_prob` was.
    ArchSpec {
        name: "qwen3moe",
        qk_norm: QkNorm::PerHead,
        moe: Moe::Always,
        ..BASE
    },
    // olmoe.cpp: Q/K norm over the whole projection, norm_w = false, no QKV clamp.
    ArchSpec {
        name: "olmoe",
        qk_norm: QkNorm::Whole,
        moe: Moe::Always,
        router: RouterNorm::SoftmaxAll,
        ..BASE
    },
    // qwen2moe.cpp: QKV bias, norm_w = false, shared expert with a sigmoid gate.
    ArchSpec {
        name: "qwen2moe",
        qkv_bias: true,
        moe: Moe::Always,
        router: RouterNorm::SoftmaxAll,
        shared_expert: true,
        ..BASE
    },
    ArchSpec {
        name: "gemma3",
        qk_norm: QkNorm::PerHead,
        gemma3: true,
        ..BASE
    },
];

/// The spec of `arch`, if `import` runs it.
pub fn arch_spec(arch: &str) -> Option<&'static ArchSpec> {
    ARCHS.iter().find(|a| a.name == arch)
}

/// "llama (and Mixtral), mistral, …" for error messages and `--help`.
pub fn supported_list() -> String {
    ARCHS
        .iter()
        .map(|a| {
            if a.moe == Moe::IfExperts {
                format!("{} (dense, or Mixtral-style with experts)", a.name)
            } else {
                a.name.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_found() {
        for a in ARCHS {
            assert_eq!(arch_spec(a.name), Some(a));
            assert_eq!(ARCHS.iter().filter(|b| b.name == a.name).count(), 1);
        }
        assert!(arch_spec("deepseek2").is_none());
        assert!(arch_spec("gpt-oss").is_none());
        let s = supported_list();
        for n in ["qwen3moe", "olmoe", "qwen2moe", "qwen3", "llama", "gemma3"] {
            assert!(s.contains(n), "{s}");
        }
    }

    #[test]
    fn moe_semantics_follow_llama_cpp_graphs() {
        let q3 = arch_spec("qwen3moe").unwrap();
        assert_eq!(q3.router, RouterNorm::SoftmaxTopk);
        assert_eq!(q3.qk_norm, QkNorm::PerHead);
        let ol = arch_spec("olmoe").unwrap();
        assert_eq!(
            (ol.router, ol.qk_norm),
            (RouterNorm::SoftmaxAll, QkNorm::Whole)
        );
        let q2 = arch_spec("qwen2moe").unwrap();
        assert!(q2.shared_expert && q2.qkv_bias);
        assert_eq!(q2.router, RouterNorm::SoftmaxAll);
        assert_eq!(arch_spec("llama").unwrap().rope, RopeStyle::Adjacent);
    }
}
