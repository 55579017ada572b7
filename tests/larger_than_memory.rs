//! A MoE larger than its memory limit: the real binary, in a memory cgroup whose limit (which
//! covers the page cache) is below the model's size, gives the same tokens as without a limit,
//! on the direct tier with the expert cache off and on, and on the mmap tier. Needs root and a
//! memory cgroup hierarchy (v1 or v2); prints SKIP where the kernel does not allow it.

use std::path::{Path, PathBuf};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_cflow-tui");

/// A memory cgroup made for this test and removed on drop (moving nothing: the child joins it
/// itself before exec).
struct Cgroup {
    dir: PathBuf,
}

impl Cgroup {
    fn new(limit: u64) -> Option<Cgroup> {
        let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
        let root = if v2 {
            PathBuf::from("/sys/fs/cgroup")
        } else {
            PathBuf::from("/sys/fs/cgroup/memory")
        };
        let dir = root.join(format!("cflow-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).ok()?;
        let knob = if v2 {
            "memory.max"
        } else {
            "memory.limit_in_bytes"
        };
        if std::fs::write(dir.join(knob), limit.to_string()).is_err() {
            let _ = std::fs::remove_dir(&dir);
            return None;
        }
        Some(Cgroup { dir })
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new("sh");
        c.arg("-c")
            .arg(format!(
                "echo $$ > '{}' && exec \"$@\"",
                self.dir.join("cgroup.procs").display()
            ))
            .arg("sh")
            .arg(BIN)
            .args(args);
        c
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
}

fn tokens(out: &std::process::Output, what: &str) -> Vec<u64> {
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["tokens"]
        .as_array()
        .unwrap_or_else(|| panic!("{what}: no tokens in {v}"))
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect()
}

fn drop_page_cache() {
    let _ = Command::new("sync").status();
    let _ = std::fs::write("/proc/sys/vm/drop_caches", "1");
}

#[test]
fn same_tokens_under_a_limit_below_the_model_size() {
    let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
    let model = dir.path().join("moe.cflow");
    let m = model.to_str().unwrap();
    // ~100 MB: 16 experts of 1024 × 512 per layer, Q8_0.
    let st = Command::new(BIN)
        .args([
            "gen",
            "--arch",
            "mixtral",
            "--layers",
            "4",
            "--hidden",
            "512",
            "--heads",
            "8",
            "--experts",
            "16",
            "--top-k",
            "2",
            "--expert-ffn",
            "1024",
            "--ffn",
            "1024",
            "--vocab",
            "512",
            "--quant",
            "q8_0",
            "-o",
            m,
        ])
        .output()
        .unwrap();
    assert!(
        st.status.success(),
        "{}",
        String::from_utf8_lossy(&st.stderr)
    );
    let size = std::fs::metadata(&model).unwrap().len();
    let limit = 48u64 << 20;
    assert!(
        size > 2 * limit,
        "model {size} B should exceed twice the limit"
    );
    let run = |extra: &[&str]| {
        let mut a = vec![
            m,
            "--token-ids",
            "1,2,3",
            "-n",
            "12",
            "--max-ctx",
            "64",
            "--json",
            // The same kernels in every run: unlimited, `auto` would copy and repack the model
            // (other float rounding than the file layout that the limited runs read).
            "--weights",
            "mmap",
        ];
        a.extend_from_slice(extra);
        a.iter().map(|s| s.to_string()).collect::<Vec<_>>()
    };
    let want = tokens(
        &Command::new(BIN)
            .arg("run")
            .args(run(&["--expert-tier", "mmap"]))
            .output()
            .unwrap(),
        "unlimited mmap",
    );
    let Some(cg) = Cgroup::new(limit) else {
        eprintln!("SKIP: cannot create a memory cgroup here (needs root and a memory hierarchy)");
        return;
    };
    for extra in [
        vec!["--expert-tier", "mmap"],
        vec!["--expert-tier", "direct", "--fetch", "staged"],
        vec![
            "--expert-tier",
            "direct",
            "--fetch",
            "sync",
            "--expert-cache-mib",
            "8",
        ],
        vec![
            "--expert-tier",
            "direct",
            "--fetch",
            "staged",
            "--expert-cache-mib",
            "16",
            "--prefetch",
            "on",
        ],
    ] {
        drop_page_cache();
        let mut args = vec!["run".to_string()];
        args.extend(run(&extra));
        let a: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
        let got = tokens(
            &cg.command(&a).output().unwrap(),
            &format!("limited {extra:?}"),
        );
        assert_eq!(got, want, "under a {limit} B limit with {extra:?}");
    }
    // The default tier (auto) reads the experts directly under the limit and maps them without.
    let tier = |o: std::process::Output| -> String {
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        j["expert_tier"].as_str().unwrap_or("").to_string()
    };
    let mut args = vec!["run".to_string()];
    args.extend(run(&[]));
    let a: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    assert_eq!(tier(cg.command(&a).output().unwrap()), "direct");
    assert_eq!(tier(Command::new(BIN).args(&a).output().unwrap()), "mmap");
}
