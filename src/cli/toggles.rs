//! The command line's view of the engine's toggle enums: `clap::ValueEnum` for [`Layout`],
//! [`FetchMode`], [`ExpertTier`] and [`Schedule`] (the engine derives no clap traits), and the
//! `on|off` parser of `--prefetch`. The spellings are the enums' own `name()`s.

use crate::engine::{ExpertTier, FetchMode, Layout, Schedule};
use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use clap::ValueEnum;

/// `ValueEnum` from a toggle's `ALL` and `name()`.
macro_rules! value_enum {
    ($($t:ident),+) => {$(
        impl ValueEnum for $t {
            fn value_variants<'a>() -> &'a [Self] {
                $t::ALL
            }

            fn to_possible_value(&self) -> Option<PossibleValue> {
                Some(PossibleValue::new(self.name()))
            }
        }
    )+};
}

value_enum!(Layout, FetchMode, ExpertTier);

impl ValueEnum for Schedule {
    fn value_variants<'a>() -> &'a [Self] {
        Schedule::ALL
    }

    /// Each value with its help line (shown by `--help`).
    fn to_possible_value(&self) -> Option<PossibleValue> {
        let help = match self {
            Schedule::Sequential => "Layer after layer; every matvec is split over all threads",
            Schedule::Vertical => {
                "Stage-major: the dense FFN of layer ℓ+δd (input ready δd layers early) and the \
                 experts routed at ℓ (needed δe layers later) run on a second core while the \
                 attention of the next layers runs on the first. Tokens are bit-identical to \
                 `Sequential`"
            }
            Schedule::Auto => {
                "The faster of the two on the model at hand, as measured: the first decode steps \
                 alternate the schedules (outputs are identical, so this is invisible) and the \
                 faster is kept"
            }
        };
        Some(PossibleValue::new(self.name()).help(help))
    }
}

/// `--prefetch on|off` as the engine's `bool`.
pub fn on_off() -> impl TypedValueParser<Value = bool> {
    PossibleValuesParser::new(["on", "off"]).map(|s| s == "on")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The command line accepts exactly the names the trace writes.
    #[test]
    fn value_names_are_the_enum_names() {
        for l in Layout::ALL {
            assert_eq!(Layout::from_str(l.name(), false), Ok(*l));
        }
        for f in FetchMode::ALL {
            assert_eq!(FetchMode::from_str(f.name(), false), Ok(*f));
        }
        for t in ExpertTier::ALL {
            assert_eq!(ExpertTier::from_str(t.name(), false), Ok(*t));
        }
        for s in Schedule::ALL {
            assert_eq!(Schedule::from_str(s.name(), false), Ok(*s));
        }
        assert!(Layout::from_str("row-major", false).is_err());
    }
}
