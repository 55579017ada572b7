//! Engine options: everything a caller can choose about how a token is computed (threads, ISA,
//! activations, layout, expert tier, schedule), with the `CFLOW_*` environment knobs read once,
//! here, when the options are built — never inside a token.
//!
//! Environment knobs (documented in the README, "Environment"):
//! - `CFLOW_FORCE_INT=1`: Q8 activations and integer dot products also with `--isa scalar`
//!   ([`EngineOptions::force_int`]).
//! - `CFLOW_NO_BATCH_PREFILL=1`: prefill token by token even where batching is possible
//!   ([`EngineOptions::batch_prefill`]).
//! - `CFLOW_ISA` (kernels, read by `Isa::detect`) and `CFLOW_SPIN_US` (thread pool, read when a
//!   pool is built) are read by their own modules, also once.

use crate::io::FetchHooks;
use crate::kernels::Isa;
use crate::model::kv::KvType;
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
    /// once a twin is attached with [`super::Engine::attach_vflow`].
    Vflow,
    /// The naive baseline: an in-memory row-major copy of the same quantized weights.
    RowMajor,
}

toggle_names!(Layout {
    Cflow => "cflow",
    Vflow => "vflow",
    RowMajor => "rowmajor",
});

/// How the streams of a token are placed on the cores (paper §4.4, Claim 8): `--schedule`, the
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

#[derive(Clone, Debug)]
pub struct EngineOptions {
    pub threads: usize,
    pub isa: Isa,
    /// Quantize activations to Q8 and use integer dot products for block types.
    pub int_act: bool,
    /// Use Q8 activations even on the scalar ISA (`CFLOW_FORCE_INT`).
    pub force_int: bool,
    pub layout: Layout,
    /// Collect per-layer timings (bytes are always counted).
    pub timings: bool,
    /// Time each decode step's pool runs on the engine thread (`engine::step_split`, read by
    /// `bench decode`): three clock reads per pool run, so off unless asked for.
    pub step_split: bool,
    /// What cached keys/values are stored as: f16 (llama.cpp's default KV type, half the bytes)
    /// or f32.
    pub kv: KvType,
    /// When expert bytes are read on the direct tier (sync at routing, staged until injection).
    pub fetch: FetchMode,
    /// Expert weights from the memory map or read (O_DIRECT) into staging slots.
    pub expert_tier: ExpertTier,
    /// Reader threads of the expert fetcher.
    pub readers: usize,
    /// Run the PREFETCHT0 prefetch thread.
    pub prefetch: bool,
    /// Test hooks of the expert fetcher (force buffered reads, slow readers).
    pub fetch_hooks: FetchHooks,
    /// Batch the prompt where the model allows it (off with `CFLOW_NO_BATCH_PREFILL`).
    pub batch_prefill: bool,
    /// Placement of the streams on the cores.
    pub schedule: Schedule,
    /// Read the weights of FFNs whose input is known to be zero (the first δd layers under a
    /// dense delay; a gated FFN of zero is zero). Off: they are skipped. On only to measure
    /// the saving; the tokens are the same.
    pub read_known_zero: bool,
    /// Diagnostic, not a router: every MoE layer runs the K experts with the largest hidden
    /// activation norm ‖h_e‖ on the layer's own input, computing all E experts' gate and up
    /// projections to find them (moefy's upper bound; `perplexity --oracle-router`).
    pub oracle_router: bool,
    /// Run a layer's shared expert (its dense FFN) and its routed experts in the same two pool
    /// runs when they read the same input and the routed selection is already known (a
    /// route-ahead model, `meta.route_ahead` ≥ 1, on the mmap tier or resident, sequential
    /// schedule): gate/up of all of them in one run, their down projections in another, instead
    /// of four runs. The outputs are bit-identical; the run's time is split between `ns_dense`
    /// and `ns_experts` in proportion to their bytes (a modelled split, docs/SEMANTICS.md X3).
    pub fuse_shared: bool,
    /// The direct tier's expert cache: MiB of expert regions kept in memory after their experts
    /// ran, served again without a read (0: off; [`super::CACHE_AUTO`]: sized when the engine
    /// opens the model, see [`super::auto_cache_mib`]). No effect on the mmap tier (the page
    /// cache plays that part there).
    pub expert_cache_mib: u64,
}

impl EngineOptions {
    /// The numerics these options actually run with, as `run --json`, `bench --json` and the
    /// trace's settings name them (docs/JSON.md): `act` is the activations fed to the quantized
    /// matvecs (`q8` only where an integer kernel exists: see [`super::weights::use_q8`]), `kv`
    /// what the KV cache stores (`f16` or `f32`).
    pub fn numerics(&self) -> (&'static str, &'static str) {
        (
            if super::weights::use_q8(self.int_act, self.force_int, self.isa) {
                "q8"
            } else {
                "f32"
            },
            self.kv.name(),
        )
    }
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            threads: default_threads(),
            isa: Isa::detect(),
            int_act: true,
            force_int: std::env::var_os("CFLOW_FORCE_INT").is_some(),
            layout: Layout::Cflow,
            timings: true,
            step_split: false,
            // As `--kv`'s default (cli::args): f16, chosen by KL divergence (docs/PERFORMANCE.md).
            kv: KvType::F16,
            fetch: FetchMode::Staged,
            expert_tier: ExpertTier::Mmap,
            readers: 2,
            prefetch: false,
            fetch_hooks: FetchHooks::default(),
            batch_prefill: std::env::var_os("CFLOW_NO_BATCH_PREFILL").is_none(),
            schedule: Schedule::Auto,
            read_known_zero: false,
            oracle_router: false,
            fuse_shared: true,
            expert_cache_mib: 0,
        }
    }
}

/// Physical cores (falls back to logical CPUs).
pub fn default_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
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
