//! HF import reads only regular files inside the model directory, with size caps (issue 14
//! item 10): a `chat_template.jinja` (or `config.json`, `tokenizer.json`, ...) that is a symlink
//! out of the directory, a device, a FIFO or an oversized file is an error naming the file,
//! never embedded, never read until memory runs out, never waited on. Symlinks that stay inside
//! the directory, and the HuggingFace hub cache layout (`snapshots/<rev>/x -> ../../blobs/<sha>`),
//! still import.

use cflow::convert::hf::{
    import_hf, MAX_CONFIG_BYTES, MAX_TEMPLATE_FILE_BYTES, MAX_TOKENIZER_JSON_BYTES,
};
use cflow::format::CflowFile;
use cflow::quant::QuantType;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn ref_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/reference/hf/llama")
}

/// A copy of the llama reference checkpoint whose tokenizer_config.json has no inline
/// chat_template, so that `chat_template.jinja` is the template source.
fn model_copy(dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(ref_dir()).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
    }
    let p = dst.join("tokenizer_config.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    v.as_object_mut().unwrap().remove("chat_template");
    std::fs::write(&p, serde_json::to_string(&v).unwrap()).unwrap();
}

/// Import `dir` on a helper thread so that a hang fails the test instead of blocking it.
fn import_with_deadline(dir: &Path, out: &Path) -> Result<Option<String>, String> {
    let (d, o) = (dir.to_path_buf(), out.to_path_buf());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let r = import_hf(&d, &o, QuantType::F32, None, |_, _| {})
            .map_err(|e| e.to_string())
            .map(|_| {
                CflowFile::open(&o)
                    .expect("imported file opens")
                    .cfg
                    .meta
                    .chat_template
                    .clone()
            });
        let _ = tx.send(r);
    });
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(r) => r,
        Err(_) => panic!("import of {} hung for 60 s", dir.display()),
    }
}

fn expect_refusal(what: &str, dir: &Path, file: &str, needle: &str) {
    let out = dir.parent().unwrap().join(format!("{what}.cflow"));
    let t0 = Instant::now();
    let r = import_with_deadline(dir, &out);
    let e = match r {
        Ok(t) => panic!(
            "{what}: import succeeded (template {:?} bytes)",
            t.map(|t| t.len())
        ),
        Err(e) => e,
    };
    eprintln!("{what}: {e} ({:?})", t0.elapsed());
    assert!(e.contains(file), "{what}: error does not name {file}: {e}");
    assert!(e.contains(needle), "{what}: expected `{needle}` in: {e}");
    assert!(!out.exists(), "{what}: output written");
    assert!(t0.elapsed() < Duration::from_secs(20), "{what}: too slow");
}

#[test]
fn chat_template_symlink_out_of_the_directory_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().join("m");
    model_copy(&d);
    // The environment (tokens, keys) must never end up inside a model file.
    std::os::unix::fs::symlink("/proc/self/environ", d.join("chat_template.jinja")).unwrap();
    expect_refusal(
        "environ",
        &d,
        "chat_template.jinja",
        "outside the model directory",
    );
    // A relative link escaping upwards, to an ordinary file.
    std::fs::write(tmp.path().join("secret.txt"), "{{ 'secret' }}").unwrap();
    std::fs::remove_file(d.join("chat_template.jinja")).unwrap();
    std::os::unix::fs::symlink("../secret.txt", d.join("chat_template.jinja")).unwrap();
    expect_refusal(
        "updir",
        &d,
        "chat_template.jinja",
        "outside the model directory",
    );
    // Other files too.
    std::fs::remove_file(d.join("chat_template.jinja")).unwrap();
    std::fs::rename(d.join("config.json"), tmp.path().join("config.json")).unwrap();
    std::os::unix::fs::symlink("../config.json", d.join("config.json")).unwrap();
    expect_refusal("config", &d, "config.json", "outside the model directory");
}

#[test]
fn devices_fifos_and_dangling_links_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().join("m");
    model_copy(&d);
    let link = d.join("chat_template.jinja");
    // /dev/zero through a symlink: outside the directory.
    std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
    expect_refusal(
        "devzero",
        &d,
        "chat_template.jinja",
        "outside the model directory",
    );
    std::fs::remove_file(&link).unwrap();
    // A FIFO in the directory: refused at once, never waited on.
    // mkfifo(1) keeps this test free of unsafe code.
    let st = std::process::Command::new("mkfifo")
        .arg(&link)
        .status()
        .unwrap();
    assert!(st.success());
    expect_refusal("fifo", &d, "chat_template.jinja", "not a regular file");
    std::fs::remove_file(&link).unwrap();
    // A directory of that name.
    std::fs::create_dir(&link).unwrap();
    expect_refusal("dir", &d, "chat_template.jinja", "not a regular file");
    std::fs::remove_dir(&link).unwrap();
    // A dangling symlink is not "no template".
    std::os::unix::fs::symlink("nowhere.jinja", &link).unwrap();
    expect_refusal("dangling", &d, "chat_template.jinja", "does not exist");
}

#[test]
fn oversized_files_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().join("m");
    model_copy(&d);
    let big = "x".repeat(MAX_TEMPLATE_FILE_BYTES as usize + 1);
    std::fs::write(d.join("chat_template.jinja"), &big).unwrap();
    expect_refusal("template", &d, "chat_template.jinja", "limit");
    std::fs::remove_file(d.join("chat_template.jinja")).unwrap();
    // config.json: valid JSON padded with whitespace past the cap.
    let cfg = std::fs::read_to_string(d.join("config.json")).unwrap();
    let pad = " ".repeat(MAX_CONFIG_BYTES as usize);
    std::fs::write(d.join("config.json"), format!("{cfg}{pad}")).unwrap();
    expect_refusal("config", &d, "config.json", "limit");
    std::fs::write(d.join("config.json"), cfg).unwrap();
    // tokenizer.json past 64 MiB (sparse: no 64 MiB write needed).
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(d.join("tokenizer.json"))
        .unwrap();
    f.set_len(MAX_TOKENIZER_JSON_BYTES + 1).unwrap();
    expect_refusal("tokenizer", &d, "tokenizer.json", "limit");
}

#[test]
fn links_inside_the_directory_and_the_hub_cache_layout_still_import() {
    let tmp = tempfile::tempdir().unwrap();
    // A plain file and a symlink within the directory.
    let d = tmp.path().join("m");
    model_copy(&d);
    std::fs::create_dir(d.join("templates")).unwrap();
    std::fs::write(d.join("templates/t.jinja"), "{{ 'inside' }}").unwrap();
    std::os::unix::fs::symlink("templates/t.jinja", d.join("chat_template.jinja")).unwrap();
    let t = import_with_deadline(&d, &tmp.path().join("a.cflow")).unwrap();
    assert_eq!(t.as_deref(), Some("{{ 'inside' }}"));
    // No template file at all: no template, no error.
    std::fs::remove_file(d.join("chat_template.jinja")).unwrap();
    let t = import_with_deadline(&d, &tmp.path().join("b.cflow")).unwrap();
    assert_eq!(t, None);
    // The HF hub cache: every file of snapshots/<rev>/ links to ../../blobs/<name>.
    let repo = tmp.path().join("models--x--y");
    let snap = repo.join("snapshots/0123abcd");
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::create_dir_all(repo.join("blobs")).unwrap();
    std::fs::write(d.join("chat_template.jinja"), "{{ 'hub' }}").unwrap();
    for e in std::fs::read_dir(&d).unwrap() {
        let e = e.unwrap();
        if !e.file_type().unwrap().is_file() {
            continue;
        }
        let blob = format!("blob-{}", e.file_name().to_string_lossy());
        std::fs::copy(e.path(), repo.join("blobs").join(&blob)).unwrap();
        std::os::unix::fs::symlink(format!("../../blobs/{blob}"), snap.join(e.file_name()))
            .unwrap();
    }
    let t = import_with_deadline(&snap, &tmp.path().join("c.cflow")).unwrap();
    assert_eq!(t.as_deref(), Some("{{ 'hub' }}"));
}
