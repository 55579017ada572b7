//! The weight types of a model file, matrix by matrix: each layer's matrices by name, and the
//! whole file's mix (a Q4_K_M GGUF imported with `--quant keep` mixes Q5_0, Q4_K, Q6_K and
//! Q8_0 matrices), labelled with the GGUF file type the import recorded when it did
//! (`provenance.file_type`).

use super::reader::{CflowFile, LayerView};
use crate::quant::QuantType;

/// A layer's weight matrices and their types, in file order: `q`, `k`, `v`, `o`, then `gate`,
/// `up`, `down` (the dense FFN, or Qwen2-MoE's shared expert) where present, then
/// `expert_gate`, `expert_up`, `expert_down` (expert 0's; every expert of a layer has the
/// types of one GGUF tensor).
pub fn layer_matrices(l: &LayerView) -> Vec<(&'static str, QuantType)> {
    let mut m = vec![
        ("q", l.q.quant),
        ("k", l.k.quant),
        ("v", l.v.quant),
        ("o", l.o.quant),
    ];
    for (name, x) in [("gate", &l.gate), ("up", &l.up), ("down", &l.down)] {
        if let Some(x) = x {
            m.push((name, x.quant));
        }
    }
    if let Some(e) = l.experts.first() {
        m.push(("expert_gate", e.gate.quant));
        m.push(("expert_up", e.up.quant));
        m.push(("expert_down", e.down.quant));
    }
    m
}

/// How many of the file's weight matrices are of each type, the most common first (ties in
/// type order): every layer's matrices (each expert's own), the embedding and an untied LM head.
pub fn mix(f: &CflowFile) -> Vec<(QuantType, usize)> {
    let mut counts: Vec<(QuantType, usize)> = Vec::new();
    let mut add = |q: QuantType, n: usize| match counts.iter_mut().find(|(t, _)| *t == q) {
        Some((_, c)) => *c += n,
        None => counts.push((q, n)),
    };
    for l in &f.layers {
        let experts = l.experts.len().max(1);
        for (name, q) in layer_matrices(l) {
            add(
                q,
                if name.starts_with("expert_") {
                    experts
                } else {
                    1
                },
            );
        }
    }
    add(f.vocab.embedding.quant, 1);
    if let Some(lm) = &f.vocab.lm_head {
        add(lm.quant, 1);
    }
    counts.sort_by(|a, b| b.1.cmp(&a.1).then((a.0 as u8).cmp(&(b.0 as u8))));
    counts
}

/// The GGUF file type the import recorded (`Q4_K_M`, ...), if any.
pub fn file_type(f: &CflowFile) -> Option<String> {
    f.cfg.meta.provenance["file_type"]
        .as_str()
        .map(str::to_string)
}

/// One type: its name (`Q4_0`). Several: `Q4_K_M mix: Q5_0 ×81 · Q4_K ×27 · Q6_K ×10 · Q8_0 ×1`
/// (without the file type when the import did not record it).
pub fn label(file_type: Option<&str>, mix: &[(String, u64)]) -> String {
    match mix {
        [] => String::new(),
        [(q, _)] => q.clone(),
        _ => {
            let parts: Vec<String> = mix.iter().map(|(q, n)| format!("{q} ×{n}")).collect();
            match file_type {
                Some(t) => format!("{t} mix: {}", parts.join(" · ")),
                None => format!("mix: {}", parts.join(" · ")),
            }
        }
    }
}

/// The name llama.cpp gives a GGUF `general.file_type` (`llama_ftype`), for the mixes it makes.
pub fn gguf_file_type_name(ftype: u32) -> Option<&'static str> {
    Some(match ftype {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K",
        11 => "Q3_K_S",
        12 => "Q3_K_M",
        13 => "Q3_K_L",
        14 => "Q4_K_S",
        15 => "Q4_K_M",
        16 => "Q5_K_S",
        17 => "Q5_K_M",
        18 => "Q6_K",
        32 => "BF16",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_type_is_its_name_and_a_mix_lists_every_type() {
        let s = |v: &[(&str, u64)]| -> Vec<(String, u64)> {
            v.iter().map(|(q, n)| (q.to_string(), *n)).collect()
        };
        assert_eq!(label(None, &s(&[("Q4_0", 40)])), "Q4_0");
        let m = s(&[("Q5_0", 81), ("Q4_K", 27), ("Q6_K", 10), ("Q8_0", 1)]);
        assert_eq!(
            label(Some("Q4_K_M"), &m),
            "Q4_K_M mix: Q5_0 ×81 · Q4_K ×27 · Q6_K ×10 · Q8_0 ×1"
        );
        assert_eq!(label(None, &m[..2]), "mix: Q5_0 ×81 · Q4_K ×27");
        assert_eq!(gguf_file_type_name(15), Some("Q4_K_M"));
        assert_eq!(gguf_file_type_name(99), None);
    }
}
