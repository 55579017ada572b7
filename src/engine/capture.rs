//! What the dense FFN of each layer saw at the last step, kept on request for offline analysis
//! (`moefy` collects its statistics with the engine itself): the FFN's residual input, its
//! normalized input and its gated hidden activation `act(W_gate x̂) ⊙ W_up x̂`.

/// One layer's dense FFN at the last step.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FfnCapture {
    /// The residual the FFN read (`x_mid` for the standard pre-norm layer), before its norm.
    pub residual: Vec<f32>,
    /// `N_f(residual)`: the FFN's normalized input.
    pub input: Vec<f32>,
    /// The gated hidden activation, one value per FFN unit (`d_ff`).
    pub hidden: Vec<f32>,
}
