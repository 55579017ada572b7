//! The special tokens of a model's vocabulary (BOS, EOS, end of turn, ...) and its BOS/EOS
//! policy: stored in the model's metadata beside the tokenizer JSON, written by the importers
//! (`convert`) and read by the tokenizer (`chat`) and the session (`engine`).

use serde::{Deserialize, Serialize};

/// Special token ids and the BOS/EOS policy, kept beside the tokenizer JSON.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpecialTokens {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    /// End of turn (`<|im_end|>`, `<|eot_id|>`, ...), if distinct.
    pub eot: Option<u32>,
    pub unk: Option<u32>,
    pub pad: Option<u32>,
    /// Every id that ends generation (EOS, EOT, EOM, ...), sorted.
    pub eog: Vec<u32>,
    pub add_bos: bool,
    pub add_eos: bool,
}
