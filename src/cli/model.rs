//! Opening models for the commands: the built-in demo, `--vflow` twins, engine and session
//! construction, and the progress bar the long steps share.

use super::args::{EngineArgs, WeightsArg};
use crate::convert::generate::{generate, GenSpec};
use crate::engine::session::Session;
use crate::engine::{Engine, EngineOptions, ExpertTier, Layout};
use crate::errln;
use crate::format::CflowFile;
use crate::telemetry::SamplingParams;
use crate::util::cache_dir;
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use crate::console::progress_bar;

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

/// The model file a command opens: MODEL, or for a `.gguf` its import in the cache (imported
/// once, keyed by content hash: [`crate::gguf_cache`]), or the built-in demo. A directory or a
/// missing file is refused in one line saying what to do.
pub fn resolve_model(model: Option<PathBuf>) -> Result<PathBuf> {
    match model {
        Some(p) => match sniff_model(&p)? {
            ModelKind::Gguf => {
                let opened = crate::gguf_cache::open(&p, &cache_dir()?, &mut |m| errln!("{m}"))?;
                Ok(opened.cflow)
            }
            ModelKind::Cflow | ModelKind::Vflow => Ok(p),
        },
        None => demo_model_path(),
    }
}

/// Opens a model file: a `.cflow`, or a `.vflow` (self-contained: its views are an ordinary
/// `CflowFile`), reading it through its mapping. A directory, a GGUF (give it to
/// [`resolve_model`] first) or a missing file is refused in one line saying what to do.
pub fn open_model(path: &Path) -> Result<Arc<CflowFile>> {
    Ok(Arc::new(open_mapped(path)?))
}

fn open_mapped(path: &Path) -> Result<CflowFile> {
    Ok(match sniff_model(path)? {
        ModelKind::Vflow => crate::format::vflow::open_views(path)?,
        ModelKind::Cflow => CflowFile::open(path)?,
        ModelKind::Gguf => {
            let out = path.with_extension("cflow");
            bail!(
                "{}: a GGUF file, not a .cflow model: import it first: cflow-tui import {} -o {}",
                path.display(),
                path.display(),
                out.display()
            )
        }
    })
}

/// A model opened to decode from, and its tokenizer.
pub(super) struct Opened {
    pub file: Arc<CflowFile>,
    pub tokenizer: Option<crate::chat::tokenizer::TokenizerWrap>,
}

/// Opens a model to decode from, placing its weights as `--weights` says ([`weights_placement`]),
/// with its tokenizer loaded first: building Gemma 3's peaks ~40 MB above what it keeps, and
/// before the weights are copied that peak does not add to them (peak RSS 421 → 390 MB).
pub(super) fn open_for_decode(path: &Path, eng: &EngineArgs) -> Result<Opened> {
    let mut file = open_mapped(path)?;
    eng.apply_experts_used(path, &mut file.cfg)?;
    let avail = crate::engine::kv_budget::available_memory().map(|a| a.bytes);
    let twin = twin_path(path, eng).is_some();
    let direct = eng.expert_tier == ExpertTier::Direct;
    let placement = weights_placement(eng.weights, &file, twin, direct, avail);
    if placement == Placement::Resident {
        // Opening read the whole mapping; the copy reads it again piece by piece.
        file.release_pages();
    }
    let tokenizer = crate::engine::session::load_tokenizer(&file.cfg)
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    // Built: the text is not needed for the rest of the run.
    if tokenizer.is_some() {
        file.cfg.meta.tokenizer_json = None;
        file.cfg.meta.tokenizer_loaded = true;
    }
    match placement {
        Placement::Resident => file.make_resident(eng.repack()?)?,
        Placement::Mmap(Some(why)) => {
            if let Some(hint) = resident_hint(file.bytes().len() as u64, avail, why) {
                eprintln!("{}: {hint}", path.display());
            }
        }
        Placement::Mmap(None) => {}
    }
    // Every matrix's kernel, chosen once for its type, its layout (repacked by the resident
    // copy or not) and the ISA (`kernels::dot::select`).
    crate::kernels::dot::select::bind(&mut file, eng.isa.resolve()?);
    Ok(Opened {
        file: Arc::new(file),
        tokenizer,
    })
}

/// What `--weights auto` tells a user whose model it left on the mapping although the model
/// fits in the memory available: that `--weights resident` would copy it (on the 17 GB
/// qwen3moe, 1.56× llama.cpp against 0.96–0.98× on the mapping: docs/MOE.md, "Without a
/// limit"). `None` when the model does not fit or the mapping was chosen for another reason.
pub fn resident_hint(size: u64, available: Option<u64>, why: &str) -> Option<String> {
    let avail = available?;
    (why == QUARTER && size < avail).then(|| {
        format!(
            "reading the weights from the mapping ({why}: {:.1} of {:.1} GiB available); \
             --weights resident copies them into memory, faster when nothing else needs it",
            size as f64 / (1u64 << 30) as f64,
            avail as f64 / (1u64 << 30) as f64
        )
    })
}

/// Why `auto` maps a model that takes more than a quarter of the memory available.
const QUARTER: &str = "the model is larger than a quarter of available memory";

/// Where decode reads a model's weights from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// The file's mapping (page cache); with why `auto` chose it, when it did.
    Mmap(Option<&'static str>),
    /// A private copy in transparent huge pages (`CflowFile::make_resident`).
    Resident,
}

/// The `--weights` policy. `auto` copies a model into memory only when nothing the tool shows
/// is about its mapping: no `.vflow` twin (whose layout A/B would compare a copy with a
/// mapping), not a `.vflow` itself, not `--expert-tier direct` asked for explicitly (it reads
/// the experts from the file; a copy would only hold memory), and at most a quarter of the
/// available memory (the rest is left to the KV cache and the page cache). A model with
/// experts that fits is copied too: its experts are repacked like the dense matrices, and the
/// direct tier, when toggled on, still reads them from the file.
pub fn weights_placement(
    want: WeightsArg,
    file: &CflowFile,
    twin: bool,
    direct_tier: bool,
    available: Option<u64>,
) -> Placement {
    match want {
        WeightsArg::Mmap => Placement::Mmap(None),
        WeightsArg::Resident => Placement::Resident,
        WeightsArg::Auto => {
            let why = if file.cfg.has_experts() && direct_tier {
                Some("--expert-tier direct reads the experts from the file")
            } else if twin {
                Some("a .vflow twin is attached (its layout A/B reads a mapping)")
            } else if file.is_vflow_view() {
                Some("a .vflow file")
            } else if available.is_none() {
                Some("available memory is unknown")
            } else if available.is_some_and(|a| (file.bytes().len() as u64).saturating_mul(4) > a) {
                Some(QUARTER)
            } else {
                None
            };
            match why {
                Some(w) => Placement::Mmap(Some(w)),
                None => Placement::Resident,
            }
        }
    }
}

/// The `.vflow` twin decode would attach: `--vflow FILE`, or `MODEL.vflow` when it exists.
fn twin_path(path: &Path, eng: &EngineArgs) -> Option<PathBuf> {
    eng.vflow.clone().or_else(|| {
        let p = path.with_extension("vflow");
        (p != path && p.exists()).then_some(p)
    })
}

/// What [`open_model`] opens a path as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelKind {
    Cflow,
    Vflow,
    /// A GGUF file (by its magic, or a `.gguf` too short to have one).
    Gguf,
}

/// Classifies `path` by its first bytes (a `.vflow` or a GGUF by its magic), refusing, with
/// what to do, a directory (import it) or a missing file. Anything else, including a device or
/// a FIFO (not read here), goes to the `.cflow` reader, whose errors name the field.
pub fn sniff_model(path: &Path) -> Result<ModelKind> {
    use std::io::Read;
    let shown = path.display();
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            bail!("{shown}: no such file (give a .cflow or .vflow model; `cflow-tui pull smollm2` fetches one)")
        }
        Err(e) => bail!("{shown}: cannot open: {e}"),
    };
    if meta.is_dir() {
        bail!(
            "{shown}: is a directory, not a model file (a Hugging Face model directory? import it first: cflow-tui import {shown} -o MODEL.cflow)"
        );
    }
    let mut magic = [0u8; 8];
    let n = if meta.is_file() {
        let (mut f, _) =
            crate::input::open_regular(path).with_context(|| format!("{shown}: cannot open"))?;
        f.read(&mut magic)
            .with_context(|| format!("{shown}: cannot read"))?
    } else {
        0
    };
    let gguf_ext = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"));
    if magic[..n.min(4)] == *b"GGUF" || (gguf_ext && n < 4) {
        return Ok(ModelKind::Gguf);
    }
    if n == 8 && magic == crate::format::vflow::VFLOW_MAGIC {
        return Ok(ModelKind::Vflow);
    }
    Ok(ModelKind::Cflow)
}

/// An engine over `file`, with its `.vflow` twin attached (`--vflow FILE`, or `MODEL.vflow` when
/// it exists and matches) and `--layout vflow` applied.
pub(super) fn new_engine(
    path: &Path,
    file: Arc<CflowFile>,
    opts: EngineOptions,
    eng: &EngineArgs,
) -> Result<Engine> {
    use crate::format::vflow::{check_twin, VflowFile};
    let want = opts.layout;
    let twin = twin_path(path, eng);
    let mut engine = Engine::new(file, opts);
    if let Some(vp) = twin {
        let explicit = eng.vflow.is_some();
        let attached = VflowFile::open(&vp)
            .map_err(|e| e.to_string())
            .and_then(|v| {
                for (f, what) in [(&**engine.file(), "model"), (&v.file, "twin")] {
                    if !f.has_recorded_content_hash() {
                        errln!(
                            "cflow-tui: {} has no recorded content hash (written by an older \
                             version): hashing the {what} to match the twin",
                            f.path.display()
                        );
                    }
                }
                check_twin(&v, engine.file()).map(|()| v)
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

/// Largest context a `.cflow` file may declare (the reader's `max_ctx` bound).
pub(super) const MAX_CTX: usize = 1 << 24;

pub(super) fn build_session(
    model: Option<PathBuf>,
    eng: &EngineArgs,
    sampling: SamplingParams,
) -> Result<Session> {
    let path = resolve_model(model)?;
    let opened = open_for_decode(&path, eng)?;
    let opts = eng.options()?;
    let report = crate::inspect::report(&opened.file);
    let engine = new_engine(&path, opened.file, opts, eng)?;
    let mut session =
        Session::with_tokenizer(engine, sampling, opened.tokenizer).map_err(anyhow::Error::msg)?;
    session.report = Some(report);
    Ok(session)
}

/// SIGINT sets `stop` (the engine stops within one layer) instead of killing the process.
pub(super) fn install_sigint(
    stop: Arc<std::sync::atomic::AtomicBool>,
    flag: Arc<std::sync::atomic::AtomicBool>,
) {
    // A watcher thread (io::signal) runs this on every SIGINT.
    crate::io::signal::on_sigint(move || {
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        flag.store(true, std::sync::atomic::Ordering::Relaxed);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(dir: &Path, arch: &str) -> CflowFile {
        let path = dir.join(format!("{arch}.cflow"));
        let mut s = GenSpec::new(arch);
        s.layers = Some(2);
        s.hidden = Some(64);
        s.heads = Some(4);
        s.ffn = Some(128);
        s.vocab = Some(130);
        if arch != "llama" {
            s.experts = Some(4);
            s.expert_ffn = Some(64);
        }
        generate(&s, &path, |_, _| {}).expect("generate");
        CflowFile::open(&path).expect("open")
    }

    #[test]
    fn auto_copies_a_model_without_twin_that_fits() {
        let dir = tempfile::tempdir().unwrap();
        let dense = model(dir.path(), "llama");
        let moe = model(dir.path(), "arch2_4_combined");
        let size = dense.bytes().len() as u64;
        let plenty = Some(1 << 40);
        let auto = |f: &CflowFile, twin: bool, avail: Option<u64>| {
            weights_placement(WeightsArg::Auto, f, twin, false, avail)
        };
        assert_eq!(auto(&dense, false, plenty), Placement::Resident);
        assert_eq!(auto(&dense, false, Some(4 * size)), Placement::Resident);
        let why = |p: Placement| match p {
            Placement::Mmap(Some(w)) => w,
            p => panic!("{p:?}"),
        };
        // A model with experts that fits is copied (and its experts repacked), unless the
        // direct tier was asked for.
        assert_eq!(auto(&moe, false, plenty), Placement::Resident);
        let direct = weights_placement(WeightsArg::Auto, &moe, false, true, plenty);
        assert!(why(direct).contains("direct"));
        assert!(why(auto(&moe, false, Some(4 * moe.bytes().len() as u64 - 1))).contains("quarter"));
        assert!(why(auto(&dense, true, plenty)).contains("twin"));
        assert!(why(auto(&dense, false, Some(4 * size - 1))).contains("quarter"));
        assert!(why(auto(&dense, false, None)).contains("unknown"));
        // An explicit choice is followed whatever the model.
        let mmap = weights_placement(WeightsArg::Mmap, &dense, false, false, plenty);
        assert_eq!(mmap, Placement::Mmap(None));
        let res = weights_placement(WeightsArg::Resident, &moe, true, true, None);
        assert_eq!(res, Placement::Resident);
    }

    #[test]
    fn auto_on_the_mapping_hints_resident_only_when_the_model_fits() {
        let gib = 1u64 << 30;
        let hint = resident_hint(17 * gib, Some(22 * gib), QUARTER).expect("fits: a hint");
        assert!(hint.contains("--weights resident") && hint.contains("17.0 of 22.0 GiB"));
        assert_eq!(resident_hint(17 * gib, Some(4 * gib), QUARTER), None);
        assert_eq!(resident_hint(17 * gib, None, QUARTER), None);
        assert_eq!(resident_hint(gib, Some(22 * gib), "a .vflow file"), None);
    }
}
