//! One name, one number: the JSON keys that `run --json`, `replay --summary --json`,
//! `inspect --json` and `bench decode --json` share mean the same thing and carry the same values
//! for the same model; each output matches its schema in assets/schema/ (docs/JSON.md).

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
    let run = json(&["run", m, "--token-ids", "1,2", "-n", "2", "--json"]);
    let ins = json(&["inspect", m, "--json"]);
    let (a, b) = (&run["critical_path_mib"], &ins["critical_path_mib"]);
    assert_eq!(
        a, b,
        "run --json and inspect --json disagree on critical_path_mib"
    );
    for k in ["payload", "payload_read", "with_scales"] {
        for f in ["naive", "delayed", "ratio"] {
            assert!(a[k][f].as_f64().is_some(), "missing {k}.{f} in {a}");
        }
    }
    // Over the same reads, payload excludes the block scales and tile headers: strictly smaller.
    assert!(a["payload_read"]["naive"].as_f64() < a["with_scales"]["naive"].as_f64());
    // Skipping the zero-input dense FFN (δd = 1) never reads more than the paper's all-weights
    // payload (here its layer-0 term is tied with the experts'; strict at the paper's geometry).
    assert!(a["payload_read"]["naive"].as_f64() <= a["payload"]["naive"].as_f64());
}

/// At the paper's arch2_4_combined geometry, `payload` is Table 4.1's eq. 4.23 figure over every
/// layer's weights (9.00 → 4.50 MiB/token), and `payload_read` leaves out layer 0's dense FFN,
/// whose input is zero and which the engine does not read (1.50 MiB: 8.25 → 4.25).
#[test]
fn critical_path_payload_is_table_4_1_and_payload_read_skips_the_zero_input_ffn() {
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("paper.cflow");
    let o = Command::new(BIN)
        .args(["gen", "--arch", "arch2_4_combined", "--vocab", "130", "-o"])
        .arg(&m)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let ins = json(&["inspect", m.to_str().unwrap(), "--json"]);
    let c = &ins["critical_path_mib"];
    let pair = |k: &str| {
        format!(
            "{:.2} → {:.2}",
            c[k]["naive"].as_f64().unwrap(),
            c[k]["delayed"].as_f64().unwrap()
        )
    };
    assert_eq!(pair("payload"), "9.00 → 4.50", "{c}");
    assert_eq!(pair("payload_read"), "8.25 → 4.25", "{c}");
}

/// The schemas in assets/schema/, by output.
const SCHEMAS: [(&str, &str); 6] = [
    ("run", include_str!("../assets/schema/run.json")),
    (
        "replay-summary",
        include_str!("../assets/schema/replay-summary.json"),
    ),
    ("inspect", include_str!("../assets/schema/inspect.json")),
    (
        "bench-decode",
        include_str!("../assets/schema/bench-decode.json"),
    ),
    (
        "perplexity",
        include_str!("../assets/schema/perplexity.json"),
    ),
    (
        "bench-membw",
        include_str!("../assets/schema/bench-membw.json"),
    ),
];

fn schema(name: &str) -> serde_json::Value {
    let (_, text) = SCHEMAS.iter().find(|(n, _)| *n == name).unwrap();
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{name}.json: {e}"))
}

/// Validates `doc` against assets/schema/`name`.json; returns the errors.
fn errors(name: &str, doc: &serde_json::Value) -> Vec<String> {
    let v = jsonschema::validator_for(&schema(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    v.iter_errors(doc)
        .map(|e| format!("{}: {e}", e.instance_path))
        .collect()
}

fn assert_valid(name: &str, doc: &serde_json::Value) {
    let e = errors(name, doc);
    assert!(e.is_empty(), "{name}: {e:#?}\n{doc:#}");
}

/// Issue 16 (Structure): `run --json`, `replay --summary --json`, `inspect --json` and
/// `bench decode --json` each match their schema, and share one vocabulary: `tokens` is the
/// generated ids everywhere, `act` and `kv` the numerics used, `mib_per_token` the same stream
/// names.
#[test]
fn every_json_output_matches_its_schema_with_one_vocabulary() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny_model(dir.path(), "2048");
    let trace = dir.path().join("t.trace.jsonl");
    let m = m.to_str().unwrap();
    let run = json(&[
        "run",
        m,
        "--token-ids",
        "1,2",
        "-n",
        "3",
        "--json",
        "--threads",
        "1",
        "--kv",
        "f32",
        "--record",
        trace.to_str().unwrap(),
    ]);
    assert_valid("run", &run);
    let rep = json(&["replay", trace.to_str().unwrap(), "--summary", "--json"]);
    assert_valid("replay-summary", &rep);
    assert_valid("inspect", &json(&["inspect", m, "--json"]));
    let bench = json(&[
        "bench",
        "decode",
        m,
        "--threads",
        "1",
        "--tokens",
        "2",
        "--repeat",
        "1",
        "--kv",
        "f32",
        "--json",
    ]);
    assert_valid("bench-decode", &bench);

    assert_eq!(run["tokens"], rep["tokens"]);
    assert_eq!(run["tokens"].as_array().unwrap().len(), 3);
    for k in ["act", "kv"] {
        assert_eq!(run[k], bench[k], "{k}");
        // The replay summary reads them from the trace's settings event.
        assert_eq!(run[k], rep[k], "replay summary {k}");
    }
    assert_eq!(
        (run["act"].as_str(), run["kv"].as_str()),
        (Some("q8"), Some("f32"))
    );
    for s in ["attention", "dense", "experts", "lm_head", "total"] {
        let (a, b) = (&run["mib_per_token"][s], &rep["mib_per_token"][s]);
        assert!(
            (a.as_f64().unwrap() - b.as_f64().unwrap()).abs() < 1e-9,
            "{s}: {a} vs {b}"
        );
    }
    // The schemas can fail: the old names are refused.
    let mut old = run.clone();
    let ids = old.as_object_mut().unwrap().remove("tokens").unwrap();
    old["token_ids"] = ids;
    assert!(!errors("run", &old).is_empty());
    let mut old = bench.clone();
    old.as_object_mut().unwrap().remove("act");
    assert!(!errors("bench-decode", &old).is_empty());
}

/// `bench membw --json` is the probe's result, as a trace header's `machine.bandwidth`: one GB/s
/// per thread count, the method, and the share of the buffer in huge pages.
#[test]
fn bench_membw_json_matches_its_schema() {
    let bw = json(&[
        "bench",
        "membw",
        "--threads",
        "2",
        "--mib",
        "64",
        "--samples",
        "1",
        "--json",
    ]);
    assert_valid("bench-membw", &bw);
    let per = bw["per_threads"].as_array().unwrap();
    assert_eq!(per.len(), 2, "{bw}");
    assert!(
        per.iter().all(|c| c["read_gbps"].as_f64().unwrap() > 0.0),
        "{bw}"
    );
    assert!(
        bw["method"]
            .as_str()
            .unwrap()
            .contains("read Σu64 over 64 MiB"),
        "{bw}"
    );
    // The schema can fail: a probe without its thread counts is refused.
    let mut old = bw.clone();
    old.as_object_mut().unwrap().remove("per_threads");
    assert!(!errors("bench-membw", &old).is_empty());
    // Bad arguments are errors, not panics.
    for bad in [
        &["--mib", "1"][..],
        &["--mib", "100000000"],
        &["--samples", "0"],
        &["--threads", "0"],
    ] {
        let o = Command::new(BIN)
            .args(["bench", "membw"])
            .args(bad)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(1), "{bad:?}");
        assert!(String::from_utf8_lossy(&o.stderr).contains("--"), "{bad:?}");
    }
}

/// A definition shared by several schemas (`$defs`) is the same text in each: one vocabulary.
#[test]
fn shared_schema_definitions_are_identical() {
    let mut seen: std::collections::BTreeMap<String, (String, serde_json::Value)> =
        Default::default();
    for (name, _) in SCHEMAS {
        let s = schema(name);
        jsonschema::meta::validate(&s).unwrap_or_else(|e| panic!("{name}: {e}"));
        for (k, v) in s["$defs"].as_object().into_iter().flatten() {
            match seen.get(k) {
                Some((first, w)) => assert_eq!(v, w, "$defs/{k} differs in {name} and {first}"),
                None => {
                    seen.insert(k.clone(), (name.to_string(), v.clone()));
                }
            }
        }
    }
    assert!(
        seen.contains_key("tokens") && seen.contains_key("act"),
        "{seen:?}"
    );
}

/// Issue 18: `act` is what runs. On the scalar ISA there is no integer kernel, so the forward
/// pass keeps f32 activations and `run --json` / `bench decode --json` say `f32` (they said `q8`,
/// the request, while the trace's settings said `f32`).
#[test]
fn act_reports_the_numerics_that_run() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny_model(dir.path(), "2048");
    let m = m.to_str().unwrap();
    for (isa, act) in [("scalar", "f32"), ("auto", "q8")] {
        let base = ["--threads", "1", "--isa", isa, "--act", "q8"];
        let run = json(
            &[
                &["run", m, "--token-ids", "1,2", "-n", "2", "--json"][..],
                &base,
            ]
            .concat(),
        );
        let bench = json(
            &[
                &[
                    "bench", "decode", m, "--tokens", "2", "--repeat", "1", "--json",
                ][..],
                &base,
            ]
            .concat(),
        );
        if isa == "auto" && run["isa"] == "scalar" {
            continue; // no SIMD on this CPU: q8 never runs
        }
        assert_eq!(run["act"], act, "run --isa {isa}");
        assert_eq!(bench["act"], act, "bench decode --isa {isa}");
    }
}

/// Issue 18 §1: q8 is the default everywhere, chat included (`run --chat` ran f32 under
/// `--act auto`); `--act f32` still selects the exact path.
#[test]
fn q8_is_the_default_for_chat_too() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny_model(dir.path(), "2048");
    let m = m.to_str().unwrap();
    let base = [
        "run",
        m,
        "--token-ids",
        "1,2",
        "-n",
        "2",
        "--json",
        "--threads",
        "1",
    ];
    let chat = json(&[&base[..], &["--chat"]].concat());
    if chat["isa"] == "scalar" {
        return; // no integer kernel on this CPU: f32 whatever the default
    }
    assert_eq!(chat["act"], "q8", "run --chat");
    assert_eq!(json(&base)["act"], "q8", "run");
    let exact = json(&[&base[..], &["--chat", "--act", "f32"]].concat());
    assert_eq!(exact["act"], "f32");
}

/// `bench decode --json` splits each measured decode step on the engine thread's clock: the
/// fractions are shares of the step time (in pool runs + serial = 1, the wait inside the pool
/// runs), every step makes pool runs, and `--no-timings` leaves the split out. Resident weights
/// with a list of thread counts (that open once refused the list before the sixteenth session).
#[test]
fn bench_decode_splits_each_step_into_pool_runs_waiting_and_serial() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny_model(dir.path(), "2048");
    let m = m.to_str().unwrap();
    let args = [
        "bench",
        "decode",
        m,
        "--weights",
        "resident",
        "--schedule",
        "sequential",
        "--threads",
        "1,2",
        "--tokens",
        "4",
        "--repeat",
        "2",
        "--json",
    ];
    let bench = json(&args);
    assert_valid("bench-decode", &bench);
    for row in bench["rows"].as_array().unwrap() {
        let sp = &row["time_split"];
        let f = |k: &str| sp[k].as_f64().unwrap_or_else(|| panic!("{k} in {row}"));
        // 2 repeats of 4 tokens: the tiny model prefills token by token, so each repeat's
        // first token comes from the prompt's last single-token step.
        assert_eq!(sp["steps"], 8, "2 repeats of 4 steps: {row}");
        assert!(f("pool_runs_per_step") >= 1.0, "{row}");
        assert!(f("ms_per_step") > 0.0, "{row}");
        assert!(
            (f("in_pool_runs") + f("serial") - 1.0).abs() < 1e-9,
            "{row}"
        );
        assert!(f("waiting_in_pool_runs") <= f("in_pool_runs"), "{row}");
        if row["threads"] == 1 {
            assert_eq!(
                f("waiting_in_pool_runs"),
                0.0,
                "one thread never waits: {row}"
            );
        }
    }
    let quiet = json(&[&args[..], &["--no-timings"]].concat());
    assert_valid("bench-decode", &quiet);
    for row in quiet["rows"].as_array().unwrap() {
        assert!(row.get("time_split").is_none(), "{row}");
    }
}

/// A bad count in a `--threads` list is refused before any count is measured.
#[test]
fn bench_decode_refuses_a_bad_thread_count_before_measuring() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny_model(dir.path(), "2048");
    let o = Command::new(BIN)
        .args(["bench", "decode", m.to_str().unwrap(), "--threads", "1,0"])
        .args(["--tokens", "2", "--repeat", "1"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains("--threads 0: must be between 1 and 256"),
        "{err}"
    );
    assert!(
        !err.contains("repeat 1: decode"),
        "measured before refusing: {err}"
    );
}
