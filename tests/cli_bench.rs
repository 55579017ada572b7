//! `bench decode --depth` and the time to first token (issue 41): the figures vs_llamacpp.sh
//! puts beside llama-bench's `-d 4096` and pp2048 columns. Driven through the real binary on the
//! tiny generated model.

mod common;

use common::{tiny_model, BIN};
use std::process::Command;

fn json(args: &[&str]) -> serde_json::Value {
    let o = Command::new(BIN).args(args).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

fn f(v: &serde_json::Value, k: &str, s: &str) -> f64 {
    v[k][s]
        .as_f64()
        .unwrap_or_else(|| panic!("{k}.{s} missing in {v}"))
}

/// `ttft_ms` is measured, per repeat, from the start of the prompt's prefill to the first
/// sampled token: never less than that repeat's prefill time (prompt / prefill tok/s), and
/// never more than the whole repeat.
#[test]
fn bench_decode_reports_a_time_to_first_token_no_shorter_than_the_prefill() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny_model(dir.path(), "2048");
    let bench = json(&[
        "bench",
        "decode",
        m.to_str().unwrap(),
        "--threads",
        "1",
        "--prompt-len",
        "64",
        "--tokens",
        "4",
        "--repeat",
        "3",
        "--json",
    ]);
    assert_eq!(bench["depth"], 0, "{bench}");
    let row = &bench["rows"][0];
    let prompt = 64.0;
    // The slowest prefill is the longest; min/max of ttft bound each repeat's own.
    let prefill_ms_max = prompt / f(row, "prefill_tok_s", "min") * 1e3;
    let prefill_ms_min = prompt / f(row, "prefill_tok_s", "max") * 1e3;
    let (lo, med, hi) = (
        f(row, "ttft_ms", "min"),
        f(row, "ttft_ms", "median"),
        f(row, "ttft_ms", "max"),
    );
    assert!(lo > 0.0 && lo <= med && med <= hi, "{row}");
    assert!(lo >= prefill_ms_min * (1.0 - 1e-9), "{row}");
    assert!(hi >= prefill_ms_max * (1.0 - 1e-9), "{row}");
    // Less than a second for a 64-token prompt on a 64-wide model: not a unit slip (ns, µs).
    assert!(hi < 1e3, "{row}");
}

/// `--depth N` is recorded, the measured prompt and decode run after it, and a depth that does
/// not fit in the context is refused before anything is measured.
#[test]
fn bench_decode_depth_runs_after_the_filled_context_and_is_checked() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny_model(dir.path(), "2048");
    let m = m.to_str().unwrap();
    let base = [
        "bench",
        "decode",
        m,
        "--threads",
        "1",
        "--tokens",
        "4",
        "--repeat",
        "1",
    ];
    let deep = json(
        &[
            &base[..],
            &["--depth", "1500", "--prompt-len", "8", "--json"],
        ]
        .concat(),
    );
    assert_eq!(deep["depth"], 1500, "{deep}");
    assert_eq!(deep["prompt_tokens"], 8, "{deep}");
    let row = &deep["rows"][0];
    assert!(f(row, "decode_tok_s", "median") > 0.0, "{row}");
    assert!(f(row, "ttft_ms", "median") > 0.0, "{row}");
    // The KV cache read per step is its own column: it grows with the depth (positions
    // ~1,510 against ~10) while the weight bytes stay, and an f32 cache reads twice an f16 one.
    let kv = |v: &serde_json::Value| v["rows"][0]["kv_mib_per_token"].as_f64().unwrap();
    let weights = |v: &serde_json::Value| v["rows"][0]["mib_per_token"].as_f64().unwrap();
    let shallow = json(&[&base[..], &["--prompt-len", "8", "--json"]].concat());
    let ratio = kv(&deep) / kv(&shallow);
    assert!((100.0..200.0).contains(&ratio), "{ratio} {deep} {shallow}");
    assert_eq!(weights(&deep), weights(&shallow));
    let f32_cache = json(
        &[
            &base[..],
            &[
                "--depth",
                "1500",
                "--prompt-len",
                "8",
                "--kv",
                "f32",
                "--json",
            ],
        ]
        .concat(),
    );
    assert_eq!(kv(&f32_cache), 2.0 * kv(&deep), "{f32_cache}");

    let o = Command::new(BIN)
        .args(base)
        .args(["--depth", "2040", "--prompt-len", "8"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains("--depth 2040 + --prompt-len 8 + --tokens 4 positions do not fit"),
        "{err}"
    );
    assert!(!err.contains("repeat 1: decode"), "measured first: {err}");
    // No prompt: nothing to decode from, refused before anything is opened (it used to report
    // 0 tok/s as a measurement).
    let o = Command::new(BIN)
        .args(base)
        .args(["--depth", "16", "--prompt-len", "0"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(err.contains("--prompt-len must be at least 1"), "{err}");
    // The text report says the depth.
    let o = Command::new(BIN)
        .args(base)
        .args(["--depth", "16"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("prompt 8 tokens at depth 16"), "{text}");
    assert!(text.contains("TTFT ms med (min-max)"), "{text}");
}

/// `run --json` carries the same `ttft_ms` (a number; no less than the prefill) and the text
/// report prints it.
#[test]
fn run_reports_the_time_to_first_token() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny_model(dir.path(), "2048");
    let ids = (1..=32)
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let args = ["run", m.to_str().unwrap(), "--token-ids", &ids, "-n", "3"];
    let run = json(&[&args[..], &["--threads", "1", "--json"]].concat());
    let ttft = run["ttft_ms"].as_f64().expect("ttft_ms");
    let prefill_ms = 32.0 / run["prefill_tok_s"].as_f64().unwrap() * 1e3;
    assert!(ttft >= prefill_ms * (1.0 - 1e-9), "{run}");
    let o = Command::new(BIN)
        .args(args)
        .args(["--threads", "1"])
        .output()
        .unwrap();
    assert!(o.status.success());
    let text = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
    assert!(text.contains(" · TTFT "), "{text}");
    // The KV cache read per step is reported beside the weights (`run` and `bench decode` name
    // it alike): positive, and twice as much from an f32 cache as from an f16 one.
    let kv = run["kv_mib_per_token"].as_f64().expect("kv_mib_per_token");
    assert!(kv > 0.0, "{run}");
    let f32_cache = json(&[&args[..], &["--threads", "1", "--kv", "f32", "--json"]].concat());
    assert_eq!(
        f32_cache["kv_mib_per_token"].as_f64(),
        Some(2.0 * kv),
        "{f32_cache}"
    );
    assert!(
        text.contains("weight MiB/token") && text.contains("KV cache "),
        "{text}"
    );
}

/// `bench readahead` (paper Claim 8): both layouts run under both schedules in every round,
/// the model's twin is required, and each arm starts with both files evicted (where the file
/// system reports residency) and its bytes counted.
#[test]
fn bench_readahead_runs_every_arm_cold_and_needs_the_twin() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny_model(dir.path(), "64");
    let ms = m.to_str().unwrap();
    let no_twin = Command::new(BIN)
        .args(["bench", "readahead", ms, "--json"])
        .output()
        .unwrap();
    assert!(!no_twin.status.success());
    let err = String::from_utf8_lossy(&no_twin.stderr);
    assert!(
        err.contains("no .vflow twin") && err.contains("cflow-tui convert"),
        "{err}"
    );

    let o = Command::new(BIN).args(["convert", ms]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v = json(&[
        "bench",
        "readahead",
        ms,
        "--threads",
        "2",
        "--tokens",
        "3",
        "--repeat",
        "2",
        "--json",
    ]);
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2 * 2 * 2, "rounds × schedules × layouts: {v}");
    for sched in ["sequential", "vertical"] {
        for layout in ["cflow", "vflow"] {
            let n = runs
                .iter()
                .filter(|r| r["schedule"] == sched && r["layout"] == layout)
                .count();
            assert_eq!(n, 2, "{sched}/{layout}");
        }
        assert_eq!(
            v["vflow_over_cflow_cold_time_per_round"][sched]
                .as_array()
                .unwrap()
                .len(),
            2
        );
    }
    // The order flips every round: round 0 starts with cflow, round 1 with vflow.
    assert_eq!(runs[0]["layout"], "cflow");
    assert_eq!(runs[4]["layout"], "vflow");
    for r in runs {
        assert!(r["cold_first_token_ms"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["warm_ms_per_token"].as_f64().is_some(), "{r}");
    }
    for f in ["cflow", "vflow"] {
        let d = &v["device_sequential_walk"][f];
        assert!(d["normal_mb_s"]["median"].as_f64().unwrap() > 0.0, "{d}");
        assert!(d["random_mb_s"]["median"].as_f64().unwrap() > 0.0, "{d}");
    }
}

/// `--kernel-prefetch`: `off` and `on` set every kernel family and say so; `auto` (the default)
/// measures this machine once, reports the measurement, and the next process reads the same
/// measurement from the per-machine cache instead of probing again. The logits are the same
/// bits in every setting (a prefetch is a hint).
#[test]
fn kernel_prefetch_flag_and_cached_probe() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny_model(dir.path(), "256");
    let cache = dir.path().join("cache");
    let bench = |pf: &str| {
        let o = Command::new(BIN)
            .env("CFLOW_CACHE", &cache)
            .args([
                "bench",
                "decode",
                m.to_str().unwrap(),
                "--threads",
                "1",
                "--tokens",
                "2",
                "--repeat",
                "1",
                "--kernel-prefetch",
                pf,
                "--json",
            ])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        (
            v["kernel_prefetch"].clone(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    for (pf, want) in [("off", false), ("on", true)] {
        let (k, _) = bench(pf);
        assert_eq!(k["source"], "flag", "{k}");
        assert!(k["probe"].is_null(), "{k}");
        for f in ["repacked", "split", "superblock"] {
            assert_eq!(k[f], want, "{pf}: {k}");
        }
    }
    let (first, said) = bench("auto");
    assert_eq!(first["source"], "probe", "{first}");
    assert!(
        said.contains("measuring whether the kernels' prefetch pays"),
        "{said}"
    );
    let fams = first["probe"]["families"].as_array().unwrap();
    assert!(fams.len() >= 2, "{first}");
    for f in fams {
        let name = f["family"].as_str().unwrap();
        let on = f["on_over_off"].as_f64().unwrap() <= 1.03;
        assert_eq!(f["prefetch"], on, "{f}");
        assert_eq!(first[name], on, "{first}");
    }
    let (again, said) = bench("auto");
    assert_eq!(again, first, "the second process reads the cached probe");
    assert!(!said.contains("measuring"), "{said}");
    // Same logits with the prefetch on and off.
    let logits = |pf: &str| {
        let out = dir.path().join(format!("logits-{pf}.jsonl"));
        let o = Command::new(BIN)
            .env("CFLOW_CACHE", &cache)
            .args([
                "run",
                m.to_str().unwrap(),
                "--token-ids",
                "1,2,3,4,5",
                "--dump-logits",
            ])
            .arg(&out)
            .args(["--kernel-prefetch", pf])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        std::fs::read(out).unwrap()
    };
    assert_eq!(logits("on"), logits("off"));
}
