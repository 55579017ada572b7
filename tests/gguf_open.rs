//! Opening a `.gguf` directly (issue 43 §4): `cflow-tui model.gguf`, `run`, `chat`, `bench`,
//! `perplexity` and `inspect` import it once into the cache, keyed by the sha256 of its bytes,
//! then open the cached `.cflow`; an unchanged file is neither hashed nor imported again, a
//! changed one is; a corrupt GGUF gives `import`'s error and leaves no cache entry.

#[path = "common/tiny_gguf.rs"]
mod tiny_gguf;

mod common;

use cflow::cache::sha256_file;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_cflow-tui");

fn cli(args: &[&str], cache: &Path) -> Output {
    Command::new(BIN)
        .args(args)
        .env("CFLOW_CACHE", cache)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn ok(args: &[&str], cache: &Path) -> (String, String) {
    let o = cli(args, cache);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{args:?}: {err}");
    (String::from_utf8_lossy(&o.stdout).into_owned(), err)
}

/// The files of the cache's `gguf` directory, lock files left out.
fn entries(cache: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(cache.join("gguf"))
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| !n.ends_with(".lock"))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

fn entry_of(gguf: &Path, cache: &Path) -> PathBuf {
    cache
        .join("gguf")
        .join(format!("{}.cflow", sha256_file(gguf).unwrap()))
}

#[test]
fn a_gguf_is_imported_once_and_reopened_from_the_cache() {
    let d = tempfile::tempdir().unwrap();
    let cache = d.path().join("cache");
    let gguf = d.path().join("tiny.gguf");
    tiny_gguf::write(&gguf, 3, 64, 1);
    let g = gguf.to_str().unwrap();
    let run = [
        "run",
        g,
        "--token-ids",
        "5,6,7",
        "-n",
        "3",
        "-t",
        "1",
        "--json",
    ];
    let (first, err) = ok(&run, &cache);
    let entry = entry_of(&gguf, &cache);
    assert!(
        err.contains(&format!(
            "importing {g} into the cache (once) → {}",
            entry.display()
        )),
        "{err}"
    );
    assert!(entry.is_file());
    // The cached .cflow is what `import` writes.
    let direct = d.path().join("direct.cflow");
    ok(&["import", g, "-o", direct.to_str().unwrap()], &cache);
    let (want, _) = ok(
        &[
            "run",
            direct.to_str().unwrap(),
            "--token-ids",
            "5,6,7",
            "-n",
            "3",
            "-t",
            "1",
            "--json",
        ],
        &cache,
    );
    let tokens = |s: &str| serde_json::from_str::<serde_json::Value>(s).unwrap()["tokens"].clone();
    assert_eq!(tokens(&first), tokens(&want));
    let mtime = std::fs::metadata(&entry).unwrap().modified().unwrap();
    // The index is written only when a file was hashed.
    let index = cache.join("gguf").join("index.json");
    let hashed = std::fs::read(&index).unwrap();
    assert!(String::from_utf8_lossy(&hashed).contains(&sha256_file(&gguf).unwrap()));
    let index_mtime = std::fs::metadata(&index).unwrap().modified().unwrap();
    // Second open: neither hashed nor imported.
    let (again, err) = ok(&run, &cache);
    assert!(!err.contains("importing"), "{err}");
    assert!(err.contains("from the cache"), "{err}");
    assert_eq!(tokens(&again), tokens(&first));
    assert_eq!(
        std::fs::metadata(&entry).unwrap().modified().unwrap(),
        mtime
    );
    assert_eq!(
        std::fs::metadata(&index).unwrap().modified().unwrap(),
        index_mtime,
        "an unchanged file was hashed again"
    );
    assert_eq!(
        entries(&cache),
        vec![
            entry.file_name().unwrap().to_string_lossy().into_owned(),
            "index.json".into()
        ]
    );
    // Every command that takes a model takes the GGUF: inspect, bench, perplexity, chat and the
    // TUI's default command (headless without a terminal).
    let (ins, _) = ok(&["inspect", g, "--json"], &cache);
    let ins: serde_json::Value = serde_json::from_str(&ins).unwrap();
    assert_eq!(ins["file"], entry.display().to_string());
    ok(
        &[
            "bench", "decode", g, "-n", "2", "-p", "2", "-r", "1", "-t", "1", "--json",
        ],
        &cache,
    );
    let text = d.path().join("t.txt");
    std::fs::write(&text, "hello world, hello there. ".repeat(4)).unwrap();
    ok(
        &[
            "perplexity",
            g,
            "-f",
            text.to_str().unwrap(),
            "-c",
            "8",
            "-t",
            "1",
        ],
        &cache,
    );
    let (_, err) = ok(&[g, "--no-tui", "-n", "2", "-t", "1"], &cache);
    assert!(err.contains("from the cache"), "{err}");
    let mut chat = Command::new(BIN)
        .args(["chat", g, "-n", "2", "-t", "1"])
        .env("CFLOW_CACHE", &cache)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    chat.stdin.take().unwrap().write_all(b"hello\n").unwrap();
    let o = chat.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // Still one import.
    assert_eq!(entries(&cache).len(), 2, "{:?}", entries(&cache));
}

#[test]
fn a_changed_gguf_is_hashed_and_imported_again() {
    let d = tempfile::tempdir().unwrap();
    let cache = d.path().join("cache");
    let gguf = d.path().join("m.gguf");
    tiny_gguf::write(&gguf, 3, 64, 1);
    let g = gguf.to_str().unwrap();
    let run = ["run", g, "--token-ids", "5,6", "-n", "2", "-t", "1"];
    let (_, err) = ok(&run, &cache);
    assert!(err.contains("importing"), "{err}");
    let first = entry_of(&gguf, &cache);
    // Other weights, same size: a new content, a new entry.
    tiny_gguf::write(&gguf, 99, 64, 1);
    let (_, err) = ok(&run, &cache);
    assert!(err.contains("importing"), "{err}");
    let second = entry_of(&gguf, &cache);
    assert_ne!(first, second);
    assert!(first.is_file() && second.is_file());
    // Back to the first content: its import is found by hash, without importing.
    tiny_gguf::write(&gguf, 3, 64, 1);
    let (_, err) = ok(&run, &cache);
    assert!(
        !err.contains("importing") && err.contains("from the cache"),
        "{err}"
    );
    // The same content under another name opens the same entry.
    let copy = d.path().join("copy.gguf");
    std::fs::copy(&gguf, &copy).unwrap();
    let (_, err) = ok(&["inspect", copy.to_str().unwrap()], &cache);
    assert!(err.contains(&first.display().to_string()), "{err}");
}

#[test]
fn a_corrupt_gguf_gives_imports_error_and_leaves_no_cache_entry() {
    let d = tempfile::tempdir().unwrap();
    let cache = d.path().join("cache");
    let src = d.path().join("good.gguf");
    tiny_gguf::write(&src, 3, 64, 1);
    let good = std::fs::read(&src).unwrap();
    // Cut inside the tensor data, and a bare header without metadata.
    let cut = d.path().join("cut.gguf");
    std::fs::write(&cut, &good[..good.len() - 100]).unwrap();
    let bare = d.path().join("bare.gguf");
    let mut h = b"GGUF".to_vec();
    h.extend_from_slice(&3u32.to_le_bytes());
    h.extend_from_slice(&[0u8; 16]);
    std::fs::write(&bare, &h).unwrap();
    for p in [&cut, &bare] {
        let g = p.to_str().unwrap();
        let imp = cli(
            &[
                "import",
                g,
                "-o",
                d.path().join("x.cflow").to_str().unwrap(),
            ],
            &cache,
        );
        assert!(!imp.status.success());
        let imp_err = String::from_utf8_lossy(&imp.stderr);
        let want = imp_err
            .lines()
            .find_map(|l| l.strip_prefix("error: "))
            .unwrap_or_else(|| panic!("{imp_err}"));
        for args in [
            vec!["run", g, "--token-ids", "1"],
            vec![g, "--no-tui"],
            vec!["inspect", g],
        ] {
            let o = cli(&args, &cache);
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
            assert!(
                err.contains(&format!("error: {want}")),
                "{args:?}: {err}\nimport: {want}"
            );
            assert!(err.contains(g), "{err}");
            assert!(!err.contains("panicked"), "{err}");
        }
        // No entry and no temporary file: only the index of hashes.
        assert_eq!(entries(&cache), vec!["index.json".to_string()], "{g}");
    }
    assert!(!d.path().join("x.cflow").exists());
}

/// The real SmolLM2 GGUF opens directly and decodes the same tokens as its `import`.
#[test]
fn smollm2_gguf_opens_directly() {
    let Some(gguf) = common::smollm2_gguf() else {
        return;
    };
    let d = tempfile::tempdir().unwrap();
    let cache = d.path().join("cache");
    let g = gguf.to_str().unwrap();
    let run = |m: &str| {
        let (out, _) = ok(
            &[
                "run",
                m,
                "-p",
                "The capital of France is",
                "-n",
                "4",
                "-t",
                "1",
                "--json",
            ],
            &cache,
        );
        serde_json::from_str::<serde_json::Value>(&out).unwrap()["tokens"].clone()
    };
    let via_cache = run(g);
    let direct = d.path().join("s.cflow");
    ok(&["import", g, "-o", direct.to_str().unwrap()], &cache);
    assert_eq!(via_cache, run(direct.to_str().unwrap()));
    assert_eq!(
        sha256_file(&entry_of(&gguf, &cache)).unwrap(),
        sha256_file(&direct).unwrap(),
        "the cached import is the file `import` writes"
    );
}

#[test]
fn concurrent_opens_of_one_gguf_import_it_once() {
    let d = tempfile::tempdir().unwrap();
    let cache = d.path().join("cache");
    let gguf = d.path().join("big.gguf");
    // ~28 MB of f32 weights: the import takes long enough for the opens to overlap.
    tiny_gguf::write(&gguf, 3, 512, 4);
    let children: Vec<_> = (0..3)
        .map(|_| {
            Command::new(BIN)
                .args(["inspect", gguf.to_str().unwrap()])
                .env("CFLOW_CACHE", &cache)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let errs: Vec<String> = children
        .into_iter()
        .map(|c| {
            let o = c.wait_with_output().unwrap();
            let e = String::from_utf8_lossy(&o.stderr).into_owned();
            assert!(o.status.success(), "{e}");
            e
        })
        .collect();
    let imports = errs.iter().filter(|e| e.contains("importing")).count();
    assert_eq!(imports, 1, "{errs:#?}");
    assert_eq!(entries(&cache).len(), 2, "{:?}", entries(&cache));
}
