//! One name, one number: the JSON keys that `run --json` and `inspect --json` share mean the
//! same thing and carry the same values for the same model.

mod common;

use common::{tiny_model, BIN};
use std::process::Command;

fn json(args: &[&str]) -> serde_json::Value {
    let o = Command::new(BIN).args(args).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn critical_path_is_the_same_object_in_run_and_inspect() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny_model(dir.path(), "2048");
    let m = m.to_str().unwrap();
    let run = json(&["run", m, "--tokens", "1,2", "-n", "2", "--json"]);
    let ins = json(&["inspect", m, "--json"]);
    let (a, b) = (&run["critical_path_mib"], &ins["critical_path_mib"]);
    assert_eq!(
        a, b,
        "run --json and inspect --json disagree on critical_path_mib"
    );
    for k in ["payload", "with_scales"] {
        for f in ["naive", "delayed", "ratio"] {
            assert!(a[k][f].as_f64().is_some(), "missing {k}.{f} in {a}");
        }
    }
    // Payload excludes the block scales and tile headers, so it is strictly smaller.
    assert!(a["payload"]["naive"].as_f64() < a["with_scales"]["naive"].as_f64());
}
