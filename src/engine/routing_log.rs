//! The routing of every position an engine runs, kept on request (`run --dump-routing`): per
//! position, each MoE layer's selected experts and their weights, best first, as the router
//! produced them (`moe::route`). Written as JSON Lines (docs/JSON.md, "Routing dump").

use crate::telemetry::TokenStats;
use serde::Serialize;

/// One layer's selection at one position.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LayerRouting {
    /// Execution step (the layer index for every non-FixedPoint model).
    pub layer: u32,
    /// Selected expert ids, best first.
    pub experts: Vec<u16>,
    /// Their weights, in the same order (the model's router normalisation).
    pub weights: Vec<f32>,
}

/// Every MoE layer's selection at one position.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RoutedPosition {
    pub pos: u32,
    pub token: u32,
    pub layers: Vec<LayerRouting>,
}

impl RoutedPosition {
    /// The routing recorded in `stats` for `token` at `pos` (layers without experts left out).
    pub fn of(pos: usize, token: u32, stats: &TokenStats) -> RoutedPosition {
        RoutedPosition {
            pos: pos as u32,
            token,
            layers: stats
                .layers
                .iter()
                .enumerate()
                .filter(|(_, l)| !l.routing.is_empty())
                .map(|(i, l)| LayerRouting {
                    layer: i as u32,
                    experts: l.routing.iter().map(|r| r.0).collect(),
                    weights: l.routing.iter().map(|r| r.1).collect(),
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::LayerStat;

    #[test]
    fn keeps_routed_layers_in_order() {
        let mut st = TokenStats {
            layers: vec![LayerStat::default(); 3],
            ..Default::default()
        };
        st.layers[0].routing = vec![(3, 0.75), (1, 0.25)];
        st.layers[2].routing = vec![(0, 0.6), (2, 0.4)];
        let r = RoutedPosition::of(5, 42, &st);
        assert_eq!((r.pos, r.token), (5, 42));
        assert_eq!(r.layers.len(), 2);
        assert_eq!(r.layers[0].experts, vec![3, 1]);
        assert_eq!(r.layers[1].layer, 2);
        assert_eq!(r.layers[1].weights, vec![0.6, 0.4]);
    }
}
