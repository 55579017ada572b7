//! Cache entries shared between processes (the pulled SmolLM2 import, the demo model, `bench`'s
//! generated models): a file in the cache directory that one process at a time builds, under an
//! exclusive lock on `.NAME.lock` beside it (a second process waits, then reuses the result).
//! Once the entry is complete its sha256 is recorded in `NAME.sha256` (`sha256sum -c` format),
//! and the entry is reused only while it still matches that hash; otherwise (a corrupted,
//! replaced or half-written file, or an entry from a build that recorded no hash) it is rebuilt,
//! with a message. Entries are written through [`crate::output::Output`] (atomic replace).

use crate::output::{Output, OutputError};
use anyhow::{Context, Result};
use sha2::{Digest, Sha256};
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Hex sha256 of a file's content.
pub fn sha256_file(p: &Path) -> std::io::Result<String> {
    let named = |e: std::io::Error| {
        std::io::Error::new(e.kind(), format!("{}: cannot read: {e}", p.display()))
    };
    let (mut f, _) = crate::input::open_regular(p).map_err(named)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(named)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex(&h.finalize()))
}

/// Lower-case hex of a digest.
pub fn hex(d: &[u8]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// An exclusive lock on a cache entry, released on drop.
pub struct EntryLock {
    _file: File,
}

fn sibling(entry: &Path, f: impl Fn(&str) -> String) -> PathBuf {
    let name = entry
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    entry.with_file_name(f(&name))
}

/// Whether `path` exists and its sha256 is `pinned` (a file fetched to a known hash, e.g. a
/// pulled GGUF). A file that exists with another hash is reported through `log`, with `redo`
/// saying what happens next, and gives `false` (the caller rebuilds it).
pub fn matches_pinned(
    path: &Path,
    pinned: &str,
    redo: &str,
    log: &mut dyn FnMut(&str),
) -> std::io::Result<bool> {
    if !path.exists() {
        return Ok(false);
    }
    let sum = sha256_file(path)?;
    if sum == pinned {
        return Ok(true);
    }
    log(&format!(
        "{}: sha256 {sum} does not match the pinned {pinned}; {redo}",
        path.display()
    ));
    Ok(false)
}

/// The lock file of `entry`: `.NAME.lock` in the same directory.
pub fn lock_path(entry: &Path) -> PathBuf {
    sibling(entry, |n| format!(".{n}.lock"))
}

/// The hash record of `entry`: `NAME.sha256` in the same directory.
pub fn sidecar_path(entry: &Path) -> PathBuf {
    sibling(entry, |n| format!("{n}.sha256"))
}

fn open_lock_file(lp: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .custom_flags(libc::O_NOFOLLOW)
        .open(lp)
}

/// Takes the exclusive lock of `entry`, waiting (with a message) while another process holds it.
pub fn lock(entry: &Path, log: &mut dyn FnMut(&str)) -> Result<EntryLock> {
    let lp = lock_path(entry);
    let f = open_lock_file(&lp)
        .with_context(|| format!("{}: cannot create the lock file", lp.display()))?;
    lock_file(f, &lp, entry, log)
}

fn lock_file(f: File, lp: &Path, entry: &Path, log: &mut dyn FnMut(&str)) -> Result<EntryLock> {
    match f.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            log(&format!(
                "waiting for another cflow-tui process building {} (lock {})...",
                entry.display(),
                lp.display()
            ));
            f.lock()
                .with_context(|| format!("{}: cannot lock", lp.display()))?;
        }
        Err(std::fs::TryLockError::Error(e)) => {
            return Err(e).with_context(|| format!("{}: cannot lock", lp.display()))
        }
    }
    Ok(EntryLock { _file: f })
}

fn read_only(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EROFS | libc::EACCES | libc::EPERM)
    )
}

/// What [`verify`] found.
#[derive(Debug, PartialEq)]
pub enum Check {
    /// The entry matches its recorded hash.
    Valid,
    /// No entry yet.
    Missing,
    /// The entry exists but cannot be trusted (the reason).
    Stale(String),
}

/// Checks `entry` against its recorded hash (call under the lock).
pub fn verify(entry: &Path) -> Result<Check> {
    if !entry.exists() {
        return Ok(Check::Missing);
    }
    let side = sidecar_path(entry);
    let recorded = match crate::input::read_regular(&side, 4096) {
        Ok(s) => String::from_utf8_lossy(&s)
            .split_whitespace()
            .next()
            .unwrap_or("")
            .to_string(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(Check::Stale(format!(
                "no recorded sha256 ({})",
                side.display()
            )))
        }
        Err(e) => return Err(e).with_context(|| format!("{}: cannot read", side.display())),
    };
    let actual = sha256_file(entry)?;
    if actual == recorded {
        Ok(Check::Valid)
    } else {
        Ok(Check::Stale(format!(
            "sha256 {actual} does not match the recorded {recorded} ({})",
            side.display()
        )))
    }
}

/// Records `entry`'s current content hash (atomically replacing the sidecar).
pub fn record(entry: &Path) -> Result<()> {
    let sum = sha256_file(entry)?;
    let name = entry
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let side = sidecar_path(entry);
    let mut o = Output::create(&side, &[])?;
    writeln!(o, "{sum}  {name}").map_err(|e| o.error("write", e))?;
    o.commit()?;
    Ok(())
}

/// Returns `entry`, building it with `build(entry, log)` first unless it exists and matches its
/// recorded hash. `what` names the entry in messages ("the built-in demo model"). `build` must
/// write `entry` atomically (through [`Output`]); its hash is recorded after it returns.
pub fn ensure(
    entry: &Path,
    what: &str,
    log: &mut dyn FnMut(&str),
    build: impl FnOnce(&Path, &mut dyn FnMut(&str)) -> Result<()>,
) -> Result<PathBuf> {
    let lp = lock_path(entry);
    let _lock = match open_lock_file(&lp) {
        Ok(f) => lock_file(f, &lp, entry, log)?,
        // A read-only cache (no lock file possible) still serves an entry that verifies; it
        // cannot be built there anyway.
        Err(e) if read_only(&e) && verify(entry)? == Check::Valid => {
            return Ok(entry.to_path_buf());
        }
        Err(e) => {
            let what = format!("{}: cannot create the lock file", lp.display());
            return Err(e).context(what);
        }
    };
    match verify(entry)? {
        Check::Valid => return Ok(entry.to_path_buf()),
        Check::Missing => {}
        Check::Stale(why) => log(&format!("{}: {why}; rebuilding {what}", entry.display())),
    }
    let side = sidecar_path(entry);
    match std::fs::remove_file(&side) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(OutputError::Io {
                path: side,
                what: "remove the stale hash record",
                err: e,
            }
            .into())
        }
    }
    build(entry, log)?;
    record(entry)?;
    Ok(entry.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    fn build_with(p: &Path, content: &[u8]) -> Result<()> {
        let mut o = Output::create(p, &[])?;
        o.write_all(content)?;
        o.commit()?;
        Ok(())
    }

    #[test]
    fn matches_pinned_says_why_a_file_is_fetched_again() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("m.gguf");
        let mut logs = Vec::new();
        let mut log = |m: &str| logs.push(m.to_string());
        // sha256("abc")
        let pin = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        assert!(!matches_pinned(&f, pin, "again", &mut log).unwrap());
        std::fs::write(&f, b"abc").unwrap();
        assert!(matches_pinned(&f, pin, "again", &mut log).unwrap());
        std::fs::write(&f, b"abd").unwrap();
        assert!(!matches_pinned(&f, pin, "extracting it again", &mut log).unwrap());
        assert_eq!(logs.len(), 1, "{logs:?}");
        assert!(
            logs[0].contains("does not match the pinned")
                && logs[0].ends_with("extracting it again")
        );
    }

    #[test]
    fn builds_once_records_the_hash_and_reuses() {
        let d = tempfile::tempdir().unwrap();
        let e = d.path().join("entry.bin");
        ensure(&e, "the entry", &mut |_| {}, |p, _| build_with(p, b"v1")).unwrap();
        let side = std::fs::read_to_string(sidecar_path(&e)).unwrap();
        assert_eq!(side, format!("{}  entry.bin\n", sha256_file(&e).unwrap()));
        let built = AtomicUsize::new(0);
        ensure(&e, "the entry", &mut |_| {}, |_, _| {
            built.fetch_add(1, Ordering::Relaxed);
            Ok(())
        })
        .unwrap();
        assert_eq!(built.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_corrupted_entry_is_rebuilt_with_a_message() {
        let d = tempfile::tempdir().unwrap();
        let e = d.path().join("entry.bin");
        ensure(&e, "the entry", &mut |_| {}, |p, _| build_with(p, b"good")).unwrap();
        std::fs::write(&e, b"gXod").unwrap();
        let mut msgs = Vec::new();
        ensure(
            &e,
            "the entry",
            &mut |m| msgs.push(m.to_string()),
            |p, _| build_with(p, b"good"),
        )
        .unwrap();
        assert_eq!(std::fs::read(&e).unwrap(), b"good");
        assert!(
            msgs.iter()
                .any(|m| m.contains("does not match") && m.contains("rebuilding the entry")),
            "{msgs:?}"
        );
        assert_eq!(verify(&e).unwrap(), Check::Valid);
    }

    #[test]
    fn a_read_only_cache_serves_a_verified_entry_without_a_lock_file() {
        let d = tempfile::tempdir().unwrap();
        let ro = d.path().join("ro");
        std::fs::create_dir(&ro).unwrap();
        let e = ro.join("entry.bin");
        ensure(&e, "the entry", &mut |_| {}, |p, _| build_with(p, b"v1")).unwrap();
        std::fs::remove_file(lock_path(&e)).unwrap();
        let mounted = std::process::Command::new("mount")
            .args(["--bind", "-o", "ro"])
            .arg(&ro)
            .arg(&ro)
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !mounted {
            eprintln!("SKIP: cannot bind-mount read-only");
            return;
        }
        // Some kernels need a remount for the read-only flag of a bind mount.
        let _ = std::process::Command::new("mount")
            .args(["-o", "remount,bind,ro"])
            .arg(&ro)
            .status();
        let got = ensure(&e, "the entry", &mut |_| {}, |_, _| {
            anyhow::bail!("must not rebuild")
        });
        let _ = std::process::Command::new("umount").arg(&ro).status();
        assert_eq!(got.unwrap(), e);
    }

    #[test]
    fn a_second_builder_waits_and_reuses() {
        let d = tempfile::tempdir().unwrap();
        let e = Arc::new(d.path().join("entry.bin"));
        let builds = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (e, builds) = (e.clone(), builds.clone());
                std::thread::spawn(move || {
                    ensure(&e, "the entry", &mut |_| {}, |p, _| {
                        builds.fetch_add(1, Ordering::SeqCst);
                        std::thread::sleep(std::time::Duration::from_millis(100));
                        build_with(p, b"once")
                    })
                    .unwrap();
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(builds.load(Ordering::SeqCst), 1);
        assert_eq!(verify(&e).unwrap(), Check::Valid);
    }
}
