//! Opening models for the commands: the built-in demo, `--vflow` twins, engine and session
//! construction, and the progress bar the long steps share.

use super::args::EngineArgs;
use crate::convert::generate::{generate, GenSpec};
use crate::engine::forward::{Engine, EngineOptions, Layout};
use crate::engine::session::Session;
use crate::errln;
use crate::format::CflowFile;
use crate::telemetry::SamplingParams;
use crate::util::cache_dir;
use anyhow::{bail, Result};
use std::path::{Path, PathBuf};
use std::sync::Arc;

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
pub(super) fn new_engine(
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

/// Largest context a `.cflow` file may declare (the reader's `max_ctx` bound).
pub(super) const MAX_CTX: usize = 1 << 24;

pub(super) fn build_session(
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

/// SIGINT sets `stop` (the engine stops within one layer) instead of killing the process.
pub(super) fn install_sigint(
    stop: Arc<std::sync::atomic::AtomicBool>,
    flag: Arc<std::sync::atomic::AtomicBool>,
) {
    // A watcher thread polls a process-wide flag set by the handler in `util`.
    crate::io::signal::on_sigint(move || {
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        flag.store(true, std::sync::atomic::Ordering::Relaxed);
    });
}
