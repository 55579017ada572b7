//! The architectures: which family a config names, its MoE tensor names, and the
//! pipeline-native combine styles.

use crate::model::CombineStyle;

/// Which family a config describes (decides tensor names and semantics).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Family {
    Llama,
    Mistral,
    Qwen2,
    Mixtral,
    Olmoe,
    PipelineNative,
}

impl Family {
    /// The `.cflow` architecture name of the family (pipeline-native files may name a variant).
    pub(super) fn arch_name(self) -> &'static str {
        match self {
            Family::Llama => "llama",
            Family::Mistral => "mistral",
            Family::Qwen2 => "qwen2",
            Family::Mixtral => "mixtral",
            Family::Olmoe => "olmoe",
            Family::PipelineNative => "pipeline_native",
        }
    }
}

/// Tensor names of the MoE block (per-expert tensors, or the fused/stacked layout newer
/// `transformers` versions write).
pub(super) struct MoeNames {
    pub(super) router: String,
    pub(super) per_expert: [String; 3],
    pub(super) fused_gate_up: String,
    pub(super) fused_down: String,
}

pub(super) fn moe_names(fam: Family, i: usize) -> MoeNames {
    let l = format!("model.layers.{i}");
    match fam {
        Family::Mixtral => MoeNames {
            router: format!("{l}.block_sparse_moe.gate.weight"),
            per_expert: [
                format!("{l}.block_sparse_moe.experts.{{e}}.w1.weight"),
                format!("{l}.block_sparse_moe.experts.{{e}}.w3.weight"),
                format!("{l}.block_sparse_moe.experts.{{e}}.w2.weight"),
            ],
            fused_gate_up: format!("{l}.mlp.experts.gate_up_proj"),
            fused_down: format!("{l}.mlp.experts.down_proj"),
        },
        Family::Olmoe => MoeNames {
            router: format!("{l}.mlp.gate.weight"),
            per_expert: [
                format!("{l}.mlp.experts.{{e}}.gate_proj.weight"),
                format!("{l}.mlp.experts.{{e}}.up_proj.weight"),
                format!("{l}.mlp.experts.{{e}}.down_proj.weight"),
            ],
            fused_gate_up: format!("{l}.mlp.experts.gate_up_proj"),
            fused_down: format!("{l}.mlp.experts.down_proj"),
        },
        _ => MoeNames {
            router: format!("{l}.moe.router.weight"),
            per_expert: [
                format!("{l}.moe.experts.{{e}}.gate_proj.weight"),
                format!("{l}.moe.experts.{{e}}.up_proj.weight"),
                format!("{l}.moe.experts.{{e}}.down_proj.weight"),
            ],
            fused_gate_up: format!("{l}.moe.experts.gate_up_proj"),
            fused_down: format!("{l}.moe.experts.down_proj"),
        },
    }
}

pub(super) fn parse_style(s: &str) -> Option<CombineStyle> {
    let k: String = s
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .collect::<String>()
        .to_ascii_lowercase();
    Some(match k.as_str() {
        "parallelsqrt2" | "0" => CombineStyle::ParallelSqrt2,
        "delayedsum" | "1" => CombineStyle::DelayedSum,
        "asyncexperts" | "2" => CombineStyle::AsyncExperts,
        "sequential" | "3" => CombineStyle::Sequential,
        "decoupledstreams" | "4" => CombineStyle::DecoupledStreams,
        "pipelineregisters" | "5" => CombineStyle::PipelineRegisters,
        "fixedpoint" | "6" => CombineStyle::FixedPoint,
        _ => return None,
    })
}
