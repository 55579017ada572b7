//! The live A/B toggles, one type each: weight layout, stream schedule, expert fetch and expert
//! tier. The same value is the command-line flag (`cli::toggles`), the TUI's command, the
//! engine option (`engine::EngineOptions`), the trace's string and the A/B book's key; old
//! traces read back because the strings never changed. Below the engine and the telemetry, so
//! both use them without depending on each other.

use serde::{Deserialize, Serialize};

/// `ALL`, `name()` and `Display` of a toggle enum: `name()` is the one spelling everywhere (the
/// command line, the TUI, `Command`s, the trace's strings; serde's `rename_all = "lowercase"`
/// gives the same, checked by a test).
macro_rules! toggle_names {
    ($name:ident { $($v:ident => $s:literal),+ $(,)? }) => {
        impl $name {
            /// Every value, in the order the command line lists them.
            pub const ALL: &'static [$name] = &[$($name::$v),+];

            /// The spelling of the command line and the trace.
            pub fn name(self) -> &'static str {
                match self {
                    $($name::$v => $s),+
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.name())
            }
        }
    };
}

/// Weight layout the matvecs read from (`--layout`, the TUI's `l`, `Command::SetLayout`, the
/// trace's `layout`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Layout {
    /// Tiles in consumption order, straight from the mapped `.cflow` file.
    #[default]
    Cflow,
    /// The same tiles from the `.vflow` twin (vertical groups + expert bank, §3.4); available
    /// once a twin is attached with `Engine::attach_vflow`.
    Vflow,
    /// The naive baseline: an in-memory row-major copy of the same quantized weights.
    RowMajor,
}

toggle_names!(Layout {
    Cflow => "cflow",
    Vflow => "vflow",
    RowMajor => "rowmajor",
});

/// How the streams of a token are placed on the cores (paper §4.4, the stage-major schedule): `--schedule`, the
/// TUI's `v`, `Command::SetSchedule`, the trace's `schedule` (as run: never `auto`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Schedule {
    /// Layer after layer; every matvec is split over all threads.
    Sequential,
    /// Stage-major: the dense FFN of layer ℓ+δd (input ready δd layers early) and the experts
    /// routed at ℓ (needed δe layers later) run on a second core while the attention of the
    /// next layers runs on the first. Tokens are bit-identical to `Sequential`.
    Vertical,
    /// The faster of the two on the model at hand, as measured: the first decode steps alternate
    /// the schedules (outputs are identical, so this is invisible) and the faster is kept.
    #[default]
    Auto,
}

toggle_names!(Schedule {
    Sequential => "sequential",
    Vertical => "vertical",
    Auto => "auto",
});

/// When the selected experts' bytes are read on the direct tier (`--fetch`, the TUI's `s`,
/// `Command::SetFetch`, the trace's `fetch`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FetchMode {
    /// Read blocking at the routing layer.
    Sync,
    /// Submit at the routing layer, await at the injection layer ℓ+δe.
    #[default]
    Staged,
}

toggle_names!(FetchMode {
    Sync => "sync",
    Staged => "staged",
});

/// Where expert weights are read from (`--expert-tier`, the TUI's `t`, `Command::SetExpertTier`,
/// the trace's `expert_tier` and, as run, `tier`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExpertTier {
    /// Straight from the memory map (the page cache).
    #[default]
    Mmap,
    /// Read with `O_DIRECT` (or buffered `pread` as a fallback) into staging slots.
    Direct,
    /// Chosen when the engine opens the model: direct when the model file is larger than the
    /// memory available to this process (cgroup limits included), else mmap
    /// ([`ExpertTier::resolve`]).
    Auto,
}

toggle_names!(ExpertTier {
    Mmap => "mmap",
    Direct => "direct",
    Auto => "auto",
});

impl ExpertTier {
    /// The tier `auto` picks for a model of `model_bytes` with `available` bytes of memory
    /// (None: unknown, then mmap), and why. Measured (docs/MOE.md, "Larger than memory"): with
    /// the model in memory the map is fastest (no reads at all); once it does not fit, the page
    /// cache thrashes (readahead reads several times the routed experts' bytes) and reading
    /// just the routed experts with `O_DIRECT` is faster. A `resident` model (its weights
    /// already copied into memory, `--weights resident`) takes the map: its experts are in
    /// memory whatever is available now.
    pub fn resolve(
        self,
        model_bytes: u64,
        available: Option<u64>,
        resident: bool,
    ) -> (ExpertTier, Option<String>) {
        if self != ExpertTier::Auto {
            return (self, None);
        }
        if resident {
            return (ExpertTier::Mmap, None);
        }
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        match available {
            Some(a) if model_bytes > a => (
                ExpertTier::Direct,
                Some(format!(
                    "expert tier auto: direct (the model's {:.1} GiB exceed the {:.1} GiB of memory available)",
                    gib(model_bytes),
                    gib(a)
                )),
            ),
            _ => (ExpertTier::Mmap, None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The serde strings (traces, `Config` events) are the command line's spellings.
    #[test]
    fn serde_strings_are_the_names() {
        fn check<T>(all: &[T], name: fn(T) -> &'static str)
        where
            T: Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
            T: std::fmt::Display + Copy,
        {
            for &v in all {
                let s = serde_json::to_string(&v).unwrap();
                assert_eq!(s, format!("\"{}\"", name(v)));
                assert_eq!(serde_json::from_str::<T>(&s).unwrap(), v);
                assert_eq!(v.to_string(), name(v));
            }
        }
        check(Layout::ALL, Layout::name);
        check(Schedule::ALL, Schedule::name);
        check(FetchMode::ALL, FetchMode::name);
        check(ExpertTier::ALL, ExpertTier::name);
        assert_eq!(
            Layout::ALL.iter().map(|l| l.name()).collect::<Vec<_>>(),
            ["cflow", "vflow", "rowmajor"]
        );
        assert!(serde_json::from_str::<Layout>("\"row-major\"").is_err());
    }

    /// `--expert-tier auto`: direct exactly when the model is larger than the memory
    /// available, mmap when it fits or the memory is unknown; explicit tiers stay as asked.
    #[test]
    fn auto_tier_is_direct_only_for_a_model_larger_than_memory() {
        let g = 1u64 << 30;
        let (t, why) = ExpertTier::Auto.resolve(17 * g, Some(8 * g), false);
        assert_eq!(t, ExpertTier::Direct);
        assert!(why.unwrap().contains("17.0 GiB exceed the 8.0 GiB"));
        assert_eq!(
            ExpertTier::Auto.resolve(4 * g, Some(8 * g), false),
            (ExpertTier::Mmap, None)
        );
        assert_eq!(
            ExpertTier::Auto.resolve(17 * g, None, false),
            (ExpertTier::Mmap, None)
        );
        assert_eq!(
            ExpertTier::Mmap.resolve(17 * g, Some(g), false).0,
            ExpertTier::Mmap
        );
        assert_eq!(
            ExpertTier::Direct.resolve(g, Some(8 * g), true).0,
            ExpertTier::Direct
        );
        // A resident copy holds the experts in memory, whatever is available after the copy.
        assert_eq!(
            ExpertTier::Auto.resolve(17 * g, Some(4 * g), true),
            (ExpertTier::Mmap, None)
        );
    }
}
