//! docs/REPRODUCTION.md's summary table is generated from docs/data/repro/ by
//! scripts/reproduce.py: the committed table must be exactly what the committed data gives, and
//! the check must catch a changed figure on either side.
mod common;

use std::path::Path;
use std::process::Command;

fn python() -> Option<&'static str> {
    let ok = Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        common::missing_oracle(
            "PYTHON",
            "python3 not found (scripts/reproduce.py needs it)",
        );
        return None;
    }
    Some("python3")
}

fn check(root: &Path) -> (bool, String) {
    let o = Command::new("python3")
        .arg(root.join("scripts/reproduce.py"))
        .arg("--check")
        .output()
        .expect("running scripts/reproduce.py --check");
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr),
    )
}

/// A copy of what the check reads: the two scripts, the two docs and the data.
fn copy_tree(to: &Path) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for dir in ["scripts", "docs", "docs/data/repro"] {
        std::fs::create_dir_all(to.join(dir)).unwrap();
    }
    for f in [
        "scripts/reproduce.py",
        "scripts/reproduce_rows.py",
        "docs/REPRODUCTION.md",
        "docs/SEMANTICS.md",
    ] {
        std::fs::copy(root.join(f), to.join(f)).unwrap();
    }
    for e in std::fs::read_dir(root.join("docs/data/repro")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "json") {
            std::fs::copy(&p, to.join("docs/data/repro").join(p.file_name().unwrap())).unwrap();
        }
    }
}

#[test]
fn the_committed_table_is_what_the_committed_data_gives() {
    if python().is_none() {
        return;
    }
    let (ok, out) = check(Path::new(env!("CARGO_MANIFEST_DIR")));
    assert!(ok, "{out}");
}

#[test]
fn a_changed_figure_in_the_data_or_the_table_fails_the_check() {
    if python().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    copy_tree(dir.path());
    assert!(
        check(dir.path()).0,
        "the copy must pass before it is changed"
    );

    // The data: the §6.2.1 attention bytes change; the table no longer matches.
    let data = dir.path().join("docs/data/repro/analytic.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&data).unwrap()).unwrap();
    v["output"]["gemma4_6_2_1"]["b_attn_mb"] = serde_json::json!(99.0);
    std::fs::write(&data, serde_json::to_string(&v).unwrap()).unwrap();
    let (ok, out) = check(dir.path());
    assert!(!ok, "a changed data file must fail the check: {out}");

    // The table: restore the data, then edit one figure in the generated table by hand.
    copy_tree(dir.path());
    let doc = dir.path().join("docs/REPRODUCTION.md");
    let text = std::fs::read_to_string(&doc).unwrap();
    let edited = text.replacen("15.86 / 8.92 / 23.79 MB", "15.80 / 8.92 / 23.79 MB", 1);
    assert_ne!(text, edited, "the Gemma 4 row must be in the table");
    std::fs::write(&doc, edited).unwrap();
    let (ok, out) = check(dir.path());
    assert!(!ok, "a hand-edited table must fail the check: {out}");

    // A data file without its provenance fails too.
    copy_tree(dir.path());
    v = serde_json::from_str(&std::fs::read_to_string(&data).unwrap()).unwrap();
    v.as_object_mut().unwrap().remove("commit");
    std::fs::write(&data, serde_json::to_string(&v).unwrap()).unwrap();
    let (ok, out) = check(dir.path());
    assert!(!ok && out.contains("lacks commit"), "{out}");
}
