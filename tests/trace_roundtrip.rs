//! Trace format tests: record → replay round trip, tolerant reading of damaged traces, the
//! summary, the Chrome export's structure, and validation of recorded lines against
//! `assets/trace.schema.json` (validated with the `jsonschema` crate, JSON Schema 2020-12).

use cflow::telemetry::chrome::{
    chrome_events, export_chrome, TID_COMPUTE, TID_IO, TID_POOL, TID_PREFETCH, TID_WAIT,
};
use cflow::telemetry::machine::MachineProfile;
use cflow::telemetry::recorder::{Recorder, TraceError, TraceHeader};
use cflow::telemetry::replay::{summary, Replay};
use cflow::telemetry::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

fn model() -> ModelSummary {
    ModelSummary {
        name: "arch2_4_combined".into(),
        arch: "cflow-moe".into(),
        synthetic: true,
        n_layers: 2,
        d_model: 512,
        n_heads: 8,
        n_kv_heads: 8,
        d_ff: 2048,
        n_experts: 4,
        top_k: 2,
        expert_ffn: 512,
        vocab: 50257,
        max_ctx: 2048,
        dense_delay: 1,
        expert_delay: 2,
        combine_style: "DelayedSum".into(),
        quant_types: vec!["Q4_0".into(), "F32".into()],
        has_chat_template: false,
        layer_payload_bytes: Vec::new(),
        layer_payload_bytes_all: Vec::new(),
        layer_bytes: vec![
            StreamBytes {
                attn: 1 << 20,
                dense: 2 << 20,
                experts: 1 << 20,
            };
            2
        ],
        lm_head_bytes: 14 << 20,
        file_hash: "00ff".into(),
        ..Default::default()
    }
}

fn config(prefetch: bool) -> EngineConfigInfo {
    EngineConfigInfo {
        threads: 2,
        isa: "avx2+fma".into(),
        prefetch,
        weights: "mmap".into(),
        repacked: false,
        readers: 1,
        fetch: cflow::engine::FetchMode::Staged,
        expert_tier: cflow::engine::ExpertTier::Mmap,
        layout: cflow::engine::Layout::Cflow,
        layouts_available: vec![
            cflow::engine::Layout::Cflow,
            cflow::engine::Layout::RowMajor,
        ],
        notes: vec![],
    }
}

fn header() -> TraceHeader {
    let machine = MachineProfile {
        cpu_model: "Test CPU".into(),
        physical_cores: 2,
        logical_cores: 2,
        isa: "avx2+fma".into(),
        ram_bytes: 24 << 30,
        l1d_bytes: Some(32 << 10),
        l2_bytes: Some(512 << 10),
        l3_bytes: None,
        kernel: Some("6.18".into()),
        bandwidth: Some(cflow::telemetry::machine::Bandwidth {
            read_gbps_1t: 20.5,
            read_gbps_nt: 33.0,
            threads: 2,
            buffer_bytes: 256 << 20,
            probe_ms: 250.0,
            init_ms: 120.5,
            passes: 4,
            measured: "2026-11-29T11:44:04.123Z".into(),
            ..Default::default()
        }),
    };
    TraceHeader::new(model(), config(false), Some(machine))
}

fn stats(index: u32) -> TokenStats {
    let layer = |l: u16| LayerStat {
        bytes: StreamBytes {
            attn: 1 << 20,
            dense: 2 << 20,
            experts: 1 << 20,
        },
        ns_attn: 100_000,
        ns_dense: 200_000,
        ns_router: 5_000,
        ns_experts: 150_000,
        routing: vec![
            ((index as u16 + l) % 4, 0.618_034),
            ((index as u16 + l + 1) % 4, 0.381_966),
        ],
        io: (l == 1).then_some(LayerIo {
            compute_ns: 150_000,
            io_ns: 400_000,
            wait_ns: 50_000,
            bytes: 1 << 20,
        }),
    };
    TokenStats {
        index,
        pos: 5 + index,
        ns_total: 1_000_000,
        ns_lm_head: 80_000,
        lm_head_bytes: 14 << 20,
        layers: vec![layer(0), layer(1)],
        // Odd tokens ran with the prefetch thread (the field is absent from the others' lines).
        prefetch: (index % 2 == 1).then_some(cflow::telemetry::PrefetchStat {
            sent: 5,
            dropped: 1,
            predicted: 2,
            hits: 1,
            wasted_bytes: 4096,
        }),
        // Even tokens carry the engine's report of what it ran (the schema checks it).
        ran: index.is_multiple_of(2).then(|| cflow::telemetry::RunInfo {
            prefetch: false,
            fetch: Some(cflow::engine::FetchMode::Staged),
            tier: Some(cflow::engine::ExpertTier::Direct),
            layout: cflow::engine::Layout::Cflow,
            schedule: cflow::engine::Schedule::Sequential,
            threads: 2,
            weights: "mmap".into(),
            act: "q8".into(),
            kv: "f16".into(),
            expert_cache_mib: 64,
        }),
        // Even tokens also ran with the direct tier's expert cache.
        expert_cache: index
            .is_multiple_of(2)
            .then_some(cflow::telemetry::ExpertCacheStat {
                hits: 3,
                misses: 5,
                capacity_bytes: 64 << 20,
                cached_bytes: 10 << 20,
            }),
        // Odd tokens carry the pool threads' busy time (engine thread + 2 workers); even tokens
        // do not, as in traces recorded before the field existed.
        pool_threads: (index % 2 == 1).then(|| {
            Box::new(cflow::telemetry::PoolThreads(vec![
                cflow::telemetry::PoolThreadStat {
                    busy_ns: 700_000,
                    tasks: 40,
                },
                cflow::telemetry::PoolThreadStat {
                    busy_ns: 650_000,
                    tasks: 38,
                },
                cflow::telemetry::PoolThreadStat {
                    busy_ns: 2_000_000,
                    tasks: 30,
                },
            ]))
        }),
        pmu: Some(PmuSample {
            unavailable: Some("no hardware PMU: perf_event_open(L1-dcache-loads) failed".into()),
            phases: vec![
                (
                    "attention".into(),
                    vec![("task-clock".into(), 200_000), ("page-faults".into(), 1)],
                ),
                ("dense".into(), vec![("task-clock".into(), 400_000)]),
            ],
            software: vec![
                ("task-clock".into(), 1_000_000),
                ("page-faults".into(), 2),
                ("context-switches".into(), 0),
            ],
        }),
    }
}

/// A session covering every event kind: 4 tokens, a prefetch toggle after token 2.
fn events() -> Vec<Stamped> {
    let mut t = 1_000u64;
    let mut v = Vec::new();
    let mut push = |dt: u64, event: Event| {
        t += dt;
        v.push(Stamped { t_ns: t, event });
    };
    push(
        0,
        Event::Session {
            model: Box::new(model()),
            config: config(false),
        },
    );
    push(
        10_000,
        Event::Prompt {
            text: "Once upon a time".into(),
            tokens: vec![1, 2, 3, 4, 5],
            chat: false,
        },
    );
    push(
        2_000_000,
        Event::Prefill {
            n_tokens: 5,
            ns: 2_000_000,
        },
    );
    for i in 0..4u32 {
        if i == 2 {
            push(1_000, Event::Config(config(true)));
        }
        push(
            1_050_000,
            Event::Token {
                index: i,
                id: 100 + i,
                text: ["é", " the", "\"q\"", "\n"][i as usize].into(),
            },
        );
        push(1_000, Event::Stats(stats(i)));
    }
    push(
        1_000,
        Event::Done {
            reason: StopReason::Length,
            n_tokens: 4,
            decode_ns: 4_000_000,
            pos: Some(9),
            ttft_ns: Some(3_100_000),
        },
    );
    push(
        1_000,
        Event::Notice {
            message: "dropped 2 oldest turns".into(),
        },
    );
    push(
        1_000,
        Event::Error {
            message: "expert read short".into(),
            fatal: false,
        },
    );
    push(1_000, Event::Reset);
    v
}

fn record(path: &Path) -> Vec<Stamped> {
    let evs = events();
    let mut r = Recorder::create(path, header()).expect("create");
    for e in &evs {
        r.record(e).expect("record");
    }
    assert_eq!(r.events_written(), evs.len() as u64);
    r.finish().expect("finish");
    evs
}

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

#[test]
fn roundtrip_identical() {
    let d = tmp();
    let p = d.path().join("t.jsonl");
    let evs = record(&p);
    let rep = Replay::open(&p).unwrap();
    // `created` is stamped at recording time; compare everything else exactly.
    let mut want = header();
    want.created = rep.header.created.clone();
    assert_eq!(rep.header, want);
    assert_eq!(rep.events, evs);
    assert!(rep.warnings.is_empty(), "{:?}", rep.warnings);
    assert!(rep.skipped.is_empty());
    assert_eq!(rep.lines, evs.len() as u64 + 1);
    let text = std::fs::read_to_string(&p).unwrap();
    assert!(text.starts_with("{\"format\":\"cflow-trace\",\"version\":\"2.0\""));
    assert_eq!(text.lines().count(), evs.len() + 1);
}

#[test]
fn flushed_per_token_without_finish() {
    let d = tmp();
    let p = d.path().join("t.jsonl");
    let evs = events();
    let mut r = Recorder::create(&p, header()).unwrap();
    for e in &evs[..5] {
        r.record(e).unwrap();
    }
    // Still open (as if the process were killed now): everything up to the last token is on disk.
    let rep = Replay::open(&p).unwrap();
    assert_eq!(rep.events, evs[..5]);
    drop(r);
}

#[test]
fn disk_full_is_an_error_not_a_panic() {
    if !Path::new("/dev/full").exists() {
        return;
    }
    let err = match Recorder::create("/dev/full", header()) {
        Ok(mut r) => r.record(&events()[0]).unwrap_err(),
        Err(e) => e,
    };
    let msg = err.to_string();
    assert!(matches!(err, TraceError::Io { .. }), "{msg}");
    assert!(msg.contains("/dev/full"), "{msg}");
}

#[test]
fn rfc3339_header_time() {
    let h = header();
    let c = h.created.as_bytes();
    assert_eq!(c.len(), 24, "{}", h.created);
    assert_eq!(
        (c[4], c[7], c[10], c[13], c[16], c[19], c[23]),
        (b'-', b'-', b'T', b':', b':', b'.', b'Z')
    );
    assert!(h.created.as_str() > "2024");
}

fn write_raw(dir: &Path, name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

#[test]
fn truncated_last_line_replays_with_warning() {
    let d = tmp();
    let p = d.path().join("t.jsonl");
    let evs = record(&p);
    let mut bytes = std::fs::read(&p).unwrap();
    bytes.truncate(bytes.len() - 7); // cut the last line ("reset") mid-way, no newline
    let p2 = write_raw(d.path(), "cut.jsonl", &bytes);
    let rep = Replay::open(&p2).unwrap();
    assert_eq!(rep.events, evs[..evs.len() - 1]);
    assert_eq!(rep.warnings.len(), 1);
    let w = &rep.warnings[0];
    assert!(
        w.contains("truncated") && w.contains(&format!("line {}", evs.len() + 1)),
        "{w}"
    );

    // Cut in the middle of a big Stats line too.
    let text = std::fs::read_to_string(&p).unwrap();
    let stats_line = text
        .lines()
        .position(|l| l.contains("\"kind\":\"stats\""))
        .unwrap();
    let keep: usize = text.lines().take(stats_line).map(|l| l.len() + 1).sum();
    let p3 = write_raw(d.path(), "cut2.jsonl", &text.as_bytes()[..keep + 40]);
    let rep = Replay::open(&p3).unwrap();
    assert_eq!(rep.events.len(), stats_line - 1);
    assert_eq!(rep.warnings.len(), 1);
}

#[test]
fn garbage_line_names_the_line() {
    let d = tmp();
    let p = d.path().join("t.jsonl");
    record(&p);
    let text = std::fs::read_to_string(&p).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    lines[4] = "this is {not json";
    let p2 = write_raw(d.path(), "bad.jsonl", (lines.join("\n") + "\n").as_bytes());
    let err = Replay::open(&p2).unwrap_err();
    assert!(matches!(err, TraceError::Corrupt { line: 5, .. }), "{err}");
    assert!(err.to_string().contains("line 5"), "{err}");

    // Valid JSON, known kind, wrong shape.
    lines[4] = r#"{"t_ns":5,"kind":"token","index":"zero"}"#;
    let p3 = write_raw(d.path(), "bad2.jsonl", (lines.join("\n") + "\n").as_bytes());
    let err = Replay::open(&p3).unwrap_err();
    assert!(
        err.to_string().contains("line 5") && err.to_string().contains("token"),
        "{err}"
    );

    // No kind at all.
    lines[4] = r#"{"t_ns":5}"#;
    let p4 = write_raw(d.path(), "bad3.jsonl", (lines.join("\n") + "\n").as_bytes());
    let err = Replay::open(&p4).unwrap_err();
    assert!(
        err.to_string().contains("line 5") && err.to_string().contains("kind"),
        "{err}"
    );
}

fn header_line(format: &str, version: &str) -> String {
    let mut v = serde_json::to_value(header()).unwrap();
    v["format"] = format.into();
    v["version"] = version.into();
    v.to_string() + "\n"
}

#[test]
fn wrong_format_name() {
    let d = tmp();
    let p = write_raw(
        d.path(),
        "w.jsonl",
        header_line("chrome-trace", "1.0").as_bytes(),
    );
    let err = Replay::open(&p).unwrap_err();
    assert!(matches!(err, TraceError::WrongFormat { .. }), "{err}");
    assert!(err.to_string().contains("not a cflow trace"), "{err}");
    // Not JSON at all.
    let p = write_raw(d.path(), "w2.jsonl", b"\x89PNG\r\n\x1a\n\0\0garbage\n");
    let err = Replay::open(&p).unwrap_err();
    assert!(matches!(err, TraceError::Corrupt { line: 1, .. }), "{err}");
}

#[test]
fn future_major_version_refused_newer_minor_tolerated() {
    let d = tmp();
    let p = write_raw(
        d.path(),
        "v3.jsonl",
        header_line("cflow-trace", "3.0").as_bytes(),
    );
    let err = Replay::open(&p).unwrap_err();
    assert!(
        matches!(err, TraceError::UnsupportedVersion { .. }),
        "{err}"
    );
    let msg = err.to_string();
    assert!(msg.contains("3.0") && msg.contains("newer"), "{msg}");

    let p = write_raw(
        d.path(),
        "vx.jsonl",
        header_line("cflow-trace", "one").as_bytes(),
    );
    assert!(Replay::open(&p)
        .unwrap_err()
        .to_string()
        .contains("version"));

    // 2.3: unknown kinds and unknown fields are skipped.
    let mut hv = serde_json::to_value(header()).unwrap();
    hv["version"] = "2.3".into();
    hv["future_field"] = serde_json::json!({"x": 1});
    let mut s = hv.to_string() + "\n";
    s += r#"{"t_ns":1,"kind":"gpu_stats","sm":3}"#;
    s += "\n";
    s += &serde_json::to_string(&events()[3]).unwrap();
    s += "\n";
    s += r#"{"t_ns":9,"kind":"gpu_stats"}"#;
    s += "\n";
    let p = write_raw(d.path(), "v13.jsonl", s.as_bytes());
    let rep = Replay::open(&p).unwrap();
    assert_eq!(rep.events, events()[3..4]);
    assert_eq!(rep.skipped.get("gpu_stats"), Some(&2));
    assert!(
        rep.warnings.iter().any(|w| w.contains("unknown")),
        "{:?}",
        rep.warnings
    );
    assert_eq!(summary(&rep).skipped_unknown.get("gpu_stats"), Some(&2));
}

#[test]
fn empty_file() {
    let d = tmp();
    for (name, content) in [("e.jsonl", &b""[..]), ("ws.jsonl", &b"\n\n  \n"[..])] {
        let p = write_raw(d.path(), name, content);
        let err = Replay::open(&p).unwrap_err();
        assert!(matches!(err, TraceError::Empty { .. }), "{err}");
        assert!(err.to_string().contains("empty"), "{err}");
    }
    let err = Replay::open(d.path().join("missing.jsonl")).unwrap_err();
    assert!(matches!(err, TraceError::Io { .. }), "{err}");
}

#[test]
fn hundred_megabyte_line_is_refused_with_bounded_memory() {
    let d = tmp();
    let p = d.path().join("big.jsonl");
    {
        let mut f = std::io::BufWriter::new(std::fs::File::create(&p).unwrap());
        f.write_all(header_line("cflow-trace", "1.0").as_bytes())
            .unwrap();
        f.write_all(serde_json::to_string(&events()[0]).unwrap().as_bytes())
            .unwrap();
        f.write_all(b"\n{\"t_ns\":1,\"kind\":\"notice\",\"message\":\"")
            .unwrap();
        let chunk = vec![b'a'; 1 << 20];
        for _ in 0..100 {
            f.write_all(&chunk).unwrap();
        }
        f.write_all(b"\"}\n").unwrap();
    }
    let err = Replay::open(&p).unwrap_err();
    assert!(
        matches!(err, TraceError::LineTooLong { line: 3, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("line 3"), "{err}");
}

#[test]
fn summary_numbers() {
    let d = tmp();
    let p = d.path().join("t.jsonl");
    record(&p);
    let rep = Replay::open(&p).unwrap();
    let s = summary(&rep);
    assert_eq!(s.token_ids, vec![100, 101, 102, 103]);
    assert_eq!(s.text, "é the\"q\"\n");
    assert_eq!(s.n_stats, 4);
    assert!((s.decode_tok_s.unwrap() - 1000.0).abs() < 1e-9);
    assert!((s.prefill_tok_s.unwrap() - 2500.0).abs() < 1e-9);
    assert!((s.mean_token_ms.unwrap() - 1.0).abs() < 1e-12);
    let m = &s.mib_per_token;
    assert_eq!(
        (m.attn, m.dense, m.experts, m.lm_head, m.total),
        (2.0, 4.0, 2.0, 14.0, 22.0)
    );
    // Layer 0 routes (i, i+1) mod 4, layer 1 (i+1, i+2) mod 4, i = 0..4: every expert twice.
    assert_eq!(s.routing, vec![vec![2, 2, 2, 2], vec![2, 2, 2, 2]]);
    assert_eq!(s.toggles.len(), 1);
    assert_eq!(s.toggles[0].after_tokens, 2);
    assert_eq!(
        s.toggles[0].changes,
        vec!["prefetch: false → true".to_string()]
    );
    assert_eq!(s.pmu.tokens_with_pmu, 4);
    assert!(s
        .pmu
        .unavailable
        .as_deref()
        .unwrap()
        .contains("no hardware PMU"));
    assert_eq!(s.pmu.software["task-clock"], 4_000_000);
    assert_eq!(s.pmu.phases["attention"]["page-faults"], 4);
    assert_eq!(s.event_counts["stats"], 4);
    assert_eq!(s.event_counts["token"], 4);
    assert_eq!(s.event_counts.values().sum::<u64>(), s.n_events);
    assert_eq!(s.errors, vec!["expert read short".to_string()]);
    let shown = s.to_string();
    println!("{shown}");
    for needle in [
        "1000.0 tok/s",
        "synthetic",
        "prefetch: false → true",
        "routing",
        "task-clock",
    ] {
        assert!(shown.contains(needle), "missing {needle:?} in\n{shown}");
    }
    // The summary itself is serializable.
    let back: cflow::telemetry::replay::ReplaySummary =
        serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
    assert_eq!(back, s);
}

/// X spans per (pid, tid) must nest: sorted by start, each span ends before its enclosing one.
fn check_nesting(evs: &[Value]) -> usize {
    let ns = |v: &Value| (v.as_f64().unwrap() * 1000.0).round() as u64;
    let mut by_tid: std::collections::BTreeMap<u64, Vec<(u64, u64)>> = Default::default();
    for e in evs.iter().filter(|e| e["ph"] == "X") {
        let (s, d) = (ns(&e["ts"]), ns(&e["dur"]));
        by_tid
            .entry(e["tid"].as_u64().unwrap())
            .or_default()
            .push((s, s + d));
    }
    let mut n = 0;
    for spans in by_tid.values_mut() {
        spans.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
        let mut stack: Vec<u64> = Vec::new();
        for &(s, e) in spans.iter() {
            while stack.last().is_some_and(|&top| top <= s) {
                stack.pop();
            }
            if let Some(&top) = stack.last() {
                assert!(
                    e <= top,
                    "span [{s}, {e}) overlaps its parent ending at {top}"
                );
            }
            stack.push(e);
            n += 1;
        }
    }
    n
}

#[test]
fn chrome_export_structure() {
    let d = tmp();
    let p = d.path().join("t.jsonl");
    record(&p);
    let rep = Replay::open(&p).unwrap();
    let mut out = Vec::new();
    export_chrome(&rep, &mut out).unwrap();
    let doc: Value = serde_json::from_slice(&out).unwrap();
    let evs = doc["traceEvents"].as_array().unwrap();
    for e in evs {
        let ph = e["ph"].as_str().unwrap();
        assert!(["X", "C", "i", "M"].contains(&ph), "{e}");
        assert!(e["name"].is_string() && e["pid"].is_u64(), "{e}");
        if ph != "M" {
            assert!(e["ts"].as_f64().unwrap() >= 0.0, "{e}");
        }
        if ph == "X" {
            assert!(
                e["dur"].as_f64().unwrap() >= 0.0 && e["tid"].is_u64(),
                "{e}"
            );
        }
    }
    let count = |f: &dyn Fn(&Value) -> bool| evs.iter().filter(|e| f(e)).count();
    assert_eq!(count(&|e| e["ph"] == "X" && e["cat"] == "token"), 4);
    assert_eq!(count(&|e| e["ph"] == "X" && e["name"] == "attention"), 8);
    assert_eq!(count(&|e| e["ph"] == "X" && e["name"] == "lm_head"), 4);
    assert_eq!(count(&|e| e["ph"] == "X" && e["name"] == "prefill"), 1);
    assert_eq!(count(&|e| e["ph"] == "X" && e["tid"] == TID_IO), 4);
    assert_eq!(
        count(&|e| e["ph"] == "i" && e["s"] == "t" && e["name"] == "token"),
        4
    );
    assert_eq!(count(&|e| e["ph"] == "C" && e["name"] == "MiB/token"), 4);
    assert_eq!(count(&|e| e["ph"] == "C" && e["name"] == "pmu software"), 4);
    assert!(count(&|e| e["ph"] == "M" && e["name"] == "thread_name") >= 3);
    assert_eq!(count(&|e| e["ph"] == "i" && e["name"] == "config"), 1);
    let tok0 = evs
        .iter()
        .find(|e| e["ph"] == "i" && e["name"] == "token" && e["args"]["index"] == 0)
        .unwrap();
    assert_eq!(tok0["args"]["text"], "é");
    // Slice names carry no token index (Perfetto aggregates slices by name).
    assert!(
        evs.iter()
            .all(|e| !e["name"].as_str().unwrap_or("").starts_with("token ")),
        "a slice name with a token index"
    );
    assert_eq!(count(&|e| e["ph"] == "X" && e["name"] == "token"), 4);
    assert!(check_nesting(evs) > 30);

    // Token spans end at their Stats t_ns (laid back from it).
    let stats_t: Vec<u64> = rep
        .iter()
        .filter(|e| matches!(e.event, Event::Stats(_)))
        .map(|e| e.t_ns)
        .collect();
    let mut tok_end: Vec<u64> = evs
        .iter()
        .filter(|e| e["ph"] == "X" && e["cat"] == "token" && e["tid"] == TID_COMPUTE)
        .map(|e| ((e["ts"].as_f64().unwrap() + e["dur"].as_f64().unwrap()) * 1000.0).round() as u64)
        .collect();
    tok_end.sort();
    assert_eq!(tok_end, stats_t);
}

/// Every X span well formed, and per track (tid) the spans' start times never go back.
fn check_tracks(evs: &[Value]) -> std::collections::BTreeMap<u64, usize> {
    let mut last: std::collections::BTreeMap<u64, f64> = Default::default();
    let mut n: std::collections::BTreeMap<u64, usize> = Default::default();
    for e in evs.iter().filter(|e| e["ph"] == "X") {
        let tid = e["tid"].as_u64().expect("tid");
        let ts = e["ts"].as_f64().expect("ts");
        let dur = e["dur"].as_f64().expect("dur");
        assert!(
            ts >= 0.0 && dur >= 0.0 && ts.is_finite() && dur.is_finite(),
            "{e}"
        );
        assert!(e["name"].is_string() && e["pid"] == 1, "{e}");
        let prev = last.insert(tid, ts).unwrap_or(0.0);
        assert!(ts >= prev, "tid {tid}: ts {ts} after {prev}: {e}");
        *n.entry(tid).or_default() += 1;
    }
    n
}

/// Thread names from the metadata events, by tid.
fn thread_names(evs: &[Value]) -> std::collections::BTreeMap<u64, String> {
    evs.iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "thread_name")
        .map(|e| {
            (
                e["tid"].as_u64().unwrap(),
                e["args"]["name"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// Issue 43: one track per engine and pool thread, and I/O tracks, each named; pool spans last
/// the thread's measured busy time within its token; slice names carry no token index.
#[test]
fn chrome_export_has_thread_and_io_tracks() {
    let d = tmp();
    let p = d.path().join("t.jsonl");
    record(&p);
    let rep = Replay::open(&p).unwrap();
    let evs = chrome_events(&rep);
    let per_tid = check_tracks(&evs);
    check_nesting(&evs);
    let names = thread_names(&evs);
    let pool: Vec<u64> = (0..3).map(|i| (TID_POOL + i) as u64).collect();
    assert_eq!(names[&(TID_COMPUTE as u64)], "engine thread");
    assert_eq!(names[&(TID_IO as u64)], "expert reads");
    assert_eq!(names[&(TID_WAIT as u64)], "disk wait");
    assert_eq!(names[&(TID_PREFETCH as u64)], "prefetch thread");
    assert_eq!(names[&pool[0]], "pool thread 0 (engine)");
    assert_eq!(names[&pool[2]], "pool thread 2");
    assert!(per_tid.len() >= 6, "thread tracks with spans: {per_tid:?}");
    for t in &pool {
        // Two of the four tokens carry pool_threads.
        assert_eq!(per_tid[t], 2, "{per_tid:?}");
    }
    assert_eq!(per_tid[&(TID_IO as u64)], 4);
    assert_eq!(per_tid[&(TID_WAIT as u64)], 4);
    // Pool spans: inside their token's span on the engine thread, busy time clamped to it.
    let tokens: Vec<(f64, f64, u64)> = evs
        .iter()
        .filter(|e| e["ph"] == "X" && e["name"] == "token")
        .map(|e| {
            let ts = e["ts"].as_f64().unwrap();
            (
                ts,
                ts + e["dur"].as_f64().unwrap(),
                e["args"]["index"].as_u64().unwrap(),
            )
        })
        .collect();
    for e in evs.iter().filter(|e| e["ph"] == "X" && e["cat"] == "pool") {
        assert_eq!(e["name"], "pool tasks");
        let i = e["args"]["index"].as_u64().unwrap();
        assert_eq!(i % 2, 1, "only odd tokens have pool_threads");
        let (t0, t1, _) = tokens.iter().find(|t| t.2 == i).copied().unwrap();
        let (s, end) = (
            e["ts"].as_f64().unwrap(),
            e["ts"].as_f64().unwrap() + e["dur"].as_f64().unwrap(),
        );
        assert!(
            s >= t0 && end <= t1 + 1e-9,
            "{e} outside token [{t0}, {t1}]"
        );
        let want = if e["tid"] == pool[1] {
            650.0
        } else if e["tid"] == pool[2] {
            t1 - t0
        } else {
            700.0
        };
        assert!((e["dur"].as_f64().unwrap() - want).abs() < 1e-6, "{e}");
    }
    for e in evs.iter().filter(|e| e["ph"] == "X" && e["cat"] == "io") {
        assert!(
            ["expert read", "disk wait"].contains(&e["name"].as_str().unwrap()),
            "{e}"
        );
        assert_eq!(e["args"]["layer"], 1, "{e}");
    }
    let hints = evs.iter().filter(|e| e["name"] == "prefetch hints").count();
    assert_eq!(hints, 2, "odd tokens ran with the prefetch thread");
    // No slice or instant name carries a number (token or layer index) except `L{l}` layers.
    for e in evs.iter().filter(|e| e["ph"] == "X" || e["ph"] == "i") {
        let n = e["name"].as_str().unwrap();
        let layer = n.starts_with('L') && n[1..].parse::<u32>().is_ok();
        assert!(layer || !n.chars().any(|c| c.is_ascii_digit()), "{n}");
    }
}

/// Traces recorded before `pool_threads` existed (the committed ones) still export: the engine,
/// I/O and prefetch tracks, no pool tracks, every track well formed.
#[test]
fn old_traces_export_without_pool_tracks() {
    for file in [
        "traces/demo-toggles.trace.jsonl",
        "traces/smollm2-chat.trace.jsonl",
    ] {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/").to_string() + file;
        let r = Replay::open(&path).unwrap();
        let evs = chrome_events(&r);
        let per_tid = check_tracks(&evs);
        check_nesting(&evs);
        assert!(per_tid[&(TID_COMPUTE as u64)] > 10, "{file}: {per_tid:?}");
        assert!(
            per_tid.keys().all(|t| *t < TID_POOL as u64),
            "{file}: {per_tid:?}"
        );
        let mut out = Vec::new();
        export_chrome(&r, &mut out).unwrap();
        let doc: Value = serde_json::from_slice(&out).unwrap();
        assert!(doc["traceEvents"].as_array().unwrap().len() == evs.len());
    }
}

#[test]
fn chrome_nesting_survives_overlapping_tokens() {
    // Stats events closer together than ns_total and phases longer than ns_total: the export
    // must shift tokens instead of overlapping them.
    let mut evs = Vec::new();
    for i in 0..5u32 {
        let mut st = stats(i);
        st.ns_total = 10;
        evs.push(Stamped {
            t_ns: 1_000 + i as u64 * 100,
            event: Event::Stats(st),
        });
    }
    let rep = Replay {
        header: header(),
        events: evs,
        warnings: vec![],
        skipped: Default::default(),
        lines: 6,
    };
    let out = chrome_events(&rep);
    assert!(check_nesting(&out) > 30);
}

// ---------------------------------------------------------------- schema validation

/// `assets/trace.schema.json` compiled by the `jsonschema` crate: the whole schema (every
/// line) and each of its `$defs` (a header line, an event line).
struct Schema {
    root: jsonschema::Validator,
    defs: BTreeMap<String, jsonschema::Validator>,
}

impl Schema {
    fn load() -> Schema {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/trace.schema.json");
        let root: Value = serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap();
        assert_eq!(
            root["$schema"],
            "https://json-schema.org/draft/2020-12/schema"
        );
        let defs = ["header", "event"]
            .into_iter()
            .map(|d| {
                let mut s = root.clone();
                s["$ref"] = format!("#/$defs/{d}").into();
                (d.to_string(), jsonschema::validator_for(&s).unwrap())
            })
            .collect();
        Schema {
            root: jsonschema::validator_for(&root).unwrap(),
            defs,
        }
    }

    fn errors(v: &jsonschema::Validator, x: &Value) -> Result<(), String> {
        let errs: Vec<String> = v
            .iter_errors(x)
            .map(|e| format!("{}: {e}", e.instance_path))
            .collect();
        if errs.is_empty() {
            Ok(())
        } else {
            Err(errs.join("; "))
        }
    }

    fn check(&self, v: &Value) -> Result<(), String> {
        Self::errors(&self.root, v)
    }

    fn check_def(&self, def: &str, v: &Value) -> Result<(), String> {
        Self::errors(&self.defs[def], v)
    }
}

#[test]
fn recorded_trace_matches_schema() {
    let schema = Schema::load();
    let d = tmp();
    let p = d.path().join("t.jsonl");
    record(&p);
    let text = std::fs::read_to_string(&p).unwrap();
    for (i, line) in text.lines().enumerate() {
        let v: Value = serde_json::from_str(line).unwrap();
        let def = if i == 0 { "header" } else { "event" };
        schema
            .check_def(def, &v)
            .unwrap_or_else(|e| panic!("line {}: {e}", i + 1));
        // The root schema accepts every line too.
        schema.check(&v).unwrap();
    }
    // A header without a machine (null) is valid as well.
    let mut h = serde_json::to_value(header()).unwrap();
    h["machine"] = Value::Null;
    schema.check_def("header", &h).unwrap();
}

#[test]
fn schema_rejects_drift() {
    let schema = Schema::load();
    let ev = |e: &Stamped| serde_json::to_value(e).unwrap();
    let evs = events();
    let stats = evs
        .iter()
        .find(|e| matches!(e.event, Event::Stats(_)))
        .unwrap();
    let mut v = ev(stats);
    v["layers"][0]["routing"][0] = serde_json::json!([1, 0.5, 3]);
    assert!(schema.check_def("event", &v).is_err());
    let mut v = ev(stats);
    v["surprise"] = 1.into();
    assert!(schema.check_def("event", &v).is_err());
    let mut v = ev(&evs[0]);
    v["kind"] = "sessionx".into();
    assert!(schema.check_def("event", &v).is_err());
    let mut v = ev(&evs[2]);
    v["ns"] = (-5).into();
    assert!(schema.check_def("event", &v).is_err());
    let mut h = serde_json::to_value(header()).unwrap();
    h.as_object_mut().unwrap().remove("model");
    assert!(schema.check_def("header", &h).is_err());
}

/// The toggle commands and the trace's `config` carry the engine's toggle enums; the trace format
/// did not change (the same strings). Every committed trace, recorded before the change, still
/// replays, and the toggles its state implies come out as typed commands.
#[test]
fn old_traces_replay_and_their_toggles_become_typed_commands() {
    use cflow::engine::{ExpertTier, FetchMode};
    use cflow::telemetry::Command;
    use cflow::tui::app::{Action, App, Msg};
    for file in [
        "traces/demo-toggles.trace.jsonl",
        "traces/smollm2-chat.trace.jsonl",
    ] {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/").to_string() + file;
        let r = cflow::telemetry::replay::Replay::open(&path).unwrap();
        assert!(r.skipped.is_empty(), "{file}: {:?}", r.skipped);
        let mut app = App::default();
        for e in r.events.iter().cloned() {
            app.apply(Msg::Stamped(e));
        }
        let cfg = app.live.config.clone().expect(file);
        let (fetch, tier) = (cfg.fetch, cfg.expert_tier);
        app.generating = false;
        if !app.live.has_experts() {
            // A dense model (SmolLM2): fetch and tier do nothing; nothing is sent (issue 43).
            for a in [Action::ToggleFetch, Action::ToggleTier] {
                assert!(app.apply(Msg::Action(a)).commands.is_empty(), "{file}");
            }
            continue;
        }
        let fx = app.apply(Msg::Action(Action::ToggleFetch));
        let other = FetchMode::ALL
            .iter()
            .find(|a| **a != fetch)
            .copied()
            .unwrap();
        assert_eq!(fx.commands, vec![Command::SetFetch(other)], "{file}");
        let fx = app.apply(Msg::Action(Action::ToggleTier));
        let other = [ExpertTier::Mmap, ExpertTier::Direct]
            .into_iter()
            .find(|a| *a != tier)
            .unwrap();
        assert_eq!(fx.commands, vec![Command::SetExpertTier(other)], "{file}");
    }
}

/// A trace (format 1.0) with every toggle string the engine has written: `config`'s `fetch`
/// (sync, staged), `expert_tier` (mmap, direct, auto), `layout` and `layouts_available` (cflow,
/// vflow, rowmajor); `ran`'s `fetch` and `tier` ("" when not in effect), `layout` and `schedule`
/// (sequential, vertical); and tokens without `ran`. It parses into the engine's toggle enums,
/// writes the same strings back, and its summary and A/B keys are those of the build that had
/// strings (the summary's changes below are that build's output on this file).
#[test]
fn a_trace_with_the_old_toggle_strings_replays_into_the_engine_enums() {
    use cflow::engine::{ExpertTier, FetchMode, Layout, Schedule};
    use cflow::telemetry::ab::{Arm, Setting, Toggle};
    use cflow::tui::app::{App, Msg};
    use ExpertTier::{Auto, Direct, Mmap};
    use FetchMode::{Staged, Sync};
    use Layout::{Cflow, RowMajor, Vflow};
    use Schedule::{Sequential, Vertical};
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/traces/old-toggle-strings.trace.jsonl"
    );
    let r = Replay::open(path).unwrap();
    assert!(r.skipped.is_empty(), "{:?}", r.skipped);
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);

    // Written again, every event carries the file's toggle strings.
    let text = std::fs::read_to_string(path).unwrap();
    let old: Vec<Value> = text
        .lines()
        .skip(1)
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(old.len(), r.events.len());
    let config = |v: &Value| match v["kind"].as_str() {
        Some("session") => v["config"].clone(),
        Some("config") => v.clone(),
        _ => Value::Null,
    };
    for (o, e) in old.iter().zip(&r.events) {
        let n = serde_json::to_value(e).unwrap();
        for k in [
            "prefetch",
            "fetch",
            "expert_tier",
            "layout",
            "layouts_available",
        ] {
            assert_eq!(config(o)[k], config(&n)[k], "{k}: {o}");
        }
        for k in ["prefetch", "fetch", "tier", "layout", "schedule"] {
            assert_eq!(o["ran"][k], n["ran"][k], "ran.{k}: {o}");
        }
    }

    // The typed values.
    let configs: Vec<&EngineConfigInfo> = r
        .iter()
        .filter_map(|e| match &e.event {
            Event::Session { config, .. } | Event::Config(config) => Some(config),
            _ => None,
        })
        .collect();
    assert_eq!(
        configs
            .iter()
            .map(|c| (c.prefetch, c.fetch, c.expert_tier, c.layout))
            .collect::<Vec<_>>(),
        [
            (false, Staged, Direct, Cflow),
            (false, Sync, Direct, Cflow),
            (true, Sync, Direct, Cflow),
            (false, Sync, Mmap, Cflow),
            (false, Sync, Mmap, RowMajor),
            (false, Staged, Direct, Vflow),
            (false, Staged, Auto, Cflow),
        ]
    );
    assert_eq!(configs[0].layouts_available, [Cflow, RowMajor]);
    assert_eq!(configs[5].layouts_available, [Cflow, Vflow, RowMajor]);
    let stats: Vec<&TokenStats> = r
        .iter()
        .filter_map(|e| match &e.event {
            Event::Stats(s) => Some(s),
            _ => None,
        })
        .collect();
    assert_eq!(
        stats
            .iter()
            .map(|s| s
                .ran
                .as_ref()
                .map(|r| (r.fetch, r.tier, r.layout, r.schedule)))
            .collect::<Vec<_>>(),
        [
            Some((Some(Staged), Some(Direct), Cflow, Sequential)),
            Some((Some(Staged), Some(Direct), Cflow, Vertical)),
            Some((Some(Sync), Some(Direct), Cflow, Vertical)),
            Some((Some(Sync), Some(Direct), Cflow, Sequential)),
            Some((None, Some(Mmap), Cflow, Sequential)),
            Some((None, Some(Mmap), RowMajor, Sequential)),
            Some((Some(Staged), Some(Direct), Vflow, Vertical)),
            Some((None, None, Vflow, Sequential)),
            None,
            None,
        ]
    );

    // The summary's changes, as the string-typed build printed them.
    let changes: Vec<Vec<String>> = summary(&r).toggles.into_iter().map(|t| t.changes).collect();
    assert_eq!(
        changes,
        [
            vec!["fetch: staged → sync"],
            vec!["prefetch: false → true"],
            vec!["prefetch: true → false", "expert_tier: direct → mmap"],
            vec!["layout: cflow → rowmajor"],
            vec![
                "fetch: sync → staged",
                "expert_tier: mmap → direct",
                "layout: rowmajor → vflow"
            ],
            vec!["expert_tier: direct → auto", "layout: vflow → cflow"],
        ]
    );

    // A/B keys: the engine's report where there is one, else the configuration in force.
    let mut app = App::default();
    for e in r.events.iter().cloned() {
        app.apply(Msg::Stamped(e));
    }
    let last = app.live.last.clone().unwrap();
    let key = Setting::of_stats(&last, app.live.config.as_ref()).unwrap();
    assert_eq!(key.arm(Toggle::Tier), Some(Arm::Tier(Auto)));
    assert_eq!(key.arm(Toggle::Fetch), Some(Arm::Fetch(Staged)));
    assert_eq!(key.arm(Toggle::Schedule), None);
    app.live.ab.flush();
    let arms = |t: Toggle| -> Vec<String> {
        app.live
            .ab
            .view(t)
            .arms
            .iter()
            .map(|(l, _)| l.clone())
            .collect()
    };
    assert_eq!(arms(Toggle::Fetch), ["sync", "staged"]);
    assert_eq!(arms(Toggle::Layout), ["cflow", "vflow", "rowmajor"]);
    assert_eq!(arms(Toggle::Tier), ["mmap", "direct", "auto"]);
    assert_eq!(arms(Toggle::Schedule), ["sequential", "vertical"]);
    assert_eq!(arms(Toggle::Prefetch), ["on", "off"]);
}

// ---------------------------------------------------------------- CSV tables (issue 43 §5)

/// A minimal RFC 4180 reader: rows of fields (quoted fields may hold commas, quotes, newlines).
fn parse_csv(text: &str) -> Vec<Vec<String>> {
    let (mut rows, mut row, mut f) = (Vec::new(), Vec::new(), String::new());
    let mut chars = text.chars().peekable();
    let mut quoted = false;
    while let Some(c) = chars.next() {
        match (quoted, c) {
            (true, '"') if chars.peek() == Some(&'"') => {
                chars.next();
                f.push('"');
            }
            (true, '"') => quoted = false,
            (true, c) => f.push(c),
            (false, '"') => quoted = true,
            (false, ',') => row.push(std::mem::take(&mut f)),
            (false, '\n') => {
                row.push(std::mem::take(&mut f));
                rows.push(std::mem::take(&mut row));
            }
            (false, c) => f.push(c),
        }
    }
    assert!(
        !quoted && f.is_empty() && row.is_empty(),
        "unterminated last row"
    );
    rows
}

fn csv_of(rep: &Replay, t: cflow::telemetry::csv::Table) -> (Vec<String>, Vec<Vec<String>>) {
    let mut out = Vec::new();
    let n = cflow::telemetry::csv::write_table(rep, t, &mut out).unwrap();
    let mut rows = parse_csv(std::str::from_utf8(&out).unwrap());
    let header = rows.remove(0);
    assert_eq!(header, t.columns(), "{}", t.name());
    assert_eq!(rows.len() as u64, n);
    for r in &rows {
        assert_eq!(r.len(), header.len(), "{}: {r:?}", t.name());
    }
    (header, rows)
}

fn col<'a>(h: &[String], r: &'a [String], name: &str) -> &'a str {
    &r[h.iter()
        .position(|c| c == name)
        .unwrap_or_else(|| panic!("no column {name}"))]
}

/// A recorded trace round-trips to the three tables: one token row per `stats` event, one
/// routing row per (token, layer, expert), one A/B row per keyed token; the values are the
/// trace's, in the documented units; text with quotes and newlines survives.
#[test]
fn csv_tables_match_the_trace() {
    use cflow::telemetry::csv::Table;
    let d = tmp();
    let p = d.path().join("t.jsonl");
    let evs = record(&p);
    let rep = Replay::open(&p).unwrap();
    let stats: Vec<&TokenStats> = evs
        .iter()
        .filter_map(|e| match &e.event {
            Event::Stats(s) => Some(s),
            _ => None,
        })
        .collect();
    let (h, rows) = csv_of(&rep, Table::Tokens);
    assert_eq!(rows.len(), stats.len());
    for (r, st) in rows.iter().zip(&stats) {
        assert_eq!(col(&h, r, "index"), st.index.to_string());
        assert_eq!(col(&h, r, "pos"), st.pos.to_string());
        assert_eq!(col(&h, r, "prompt"), "0");
        assert_eq!(col(&h, r, "total_ms"), "1");
        assert_eq!(col(&h, r, "lm_head_ms"), "0.08");
        assert_eq!(col(&h, r, "attention_ms"), "0.2");
        assert_eq!(col(&h, r, "attention_mib"), "2");
        assert_eq!(col(&h, r, "lm_head_mib"), "14");
        assert_eq!(col(&h, r, "total_mib"), "22");
        assert_eq!(col(&h, r, "io_wait_ms"), "0.05");
        assert_eq!(col(&h, r, "expert_read_mib"), "1");
        let odd = st.index % 2 == 1;
        assert_eq!(col(&h, r, "pool_threads"), if odd { "3" } else { "" });
        assert_eq!(col(&h, r, "pool_busy_ms"), if odd { "3.35" } else { "" });
        assert_eq!(col(&h, r, "prefetch_hits"), if odd { "1" } else { "" });
        assert_eq!(col(&h, r, "expert_tier"), if odd { "" } else { "direct" });
        assert_eq!(
            col(&h, r, "expert_cache_capacity_mib"),
            if odd { "" } else { "64" }
        );
    }
    let texts: Vec<&str> = rows.iter().map(|r| col(&h, r, "text")).collect();
    assert_eq!(texts, ["é", " the", "\"q\"", "\n"]);

    let (h, rows) = csv_of(&rep, Table::Routing);
    let n: usize = stats
        .iter()
        .map(|s| s.layers.iter().map(|l| l.routing.len()).sum::<usize>())
        .sum();
    assert_eq!(rows.len(), n);
    assert_eq!(col(&h, &rows[0], "layer"), "0");
    assert_eq!(col(&h, &rows[0], "rank"), "0");
    assert_eq!(col(&h, &rows[0], "expert"), "0");
    assert_eq!(col(&h, &rows[0], "weight"), "0.618034");

    // Every token has a key: the even ones from the engine's report, the odd ones from the
    // configuration in force.
    let (h, rows) = csv_of(&rep, Table::Ab);
    assert_eq!(rows.len(), stats.len());
    let keys: Vec<&str> = rows.iter().map(|r| col(&h, r, "key")).collect();
    assert_eq!(keys, ["ran", "config", "ran", "config"]);
    assert!(
        rows.iter().all(|r| col(&h, r, "block").is_empty()),
        "runs too short for a block"
    );
}

/// The CLI writes PREFIX.{tokens,ab,routing}.csv; a malformed trace is a typed error naming
/// the file and line (no panic, no output file); the trace itself is never an output.
#[test]
fn export_csv_cli_and_malformed_trace() {
    let bin = env!("CARGO_BIN_EXE_cflow-tui");
    let d = tmp();
    let p = d.path().join("t.jsonl");
    record(&p);
    let prefix = d.path().join("out.csv");
    let o = std::process::Command::new(bin)
        .arg("export")
        .arg(&p)
        .arg("--csv")
        .arg(&prefix)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let err = String::from_utf8_lossy(&o.stderr);
    for t in ["tokens", "ab", "routing"] {
        let f = d.path().join(format!("out.{t}.csv"));
        assert!(f.is_file(), "{f:?}");
        assert!(err.contains(&format!("out.{t}.csv")), "{err}");
    }

    let mut bad = std::fs::read_to_string(&p).unwrap();
    bad.insert_str(
        bad.find('\n').unwrap() + 1,
        "{\"t_ns\":1,\"kind\":\"stats\",\"index\":\"x\"}\n",
    );
    let badp = d.path().join("bad.jsonl");
    std::fs::write(&badp, bad).unwrap();
    let o = std::process::Command::new(bin)
        .arg("export")
        .arg(&badp)
        .arg("--csv")
        .arg(d.path().join("bad"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("bad.jsonl") && err.contains("line 2"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(!d.path().join("bad.tokens.csv").exists());

    // The trace as an output (its own prefix) is refused and left intact.
    let before = std::fs::read(&p).unwrap();
    let same = d.path().join("t");
    std::fs::hard_link(&p, d.path().join("t.tokens.csv")).unwrap();
    let o = std::process::Command::new(bin)
        .arg("export")
        .arg(&p)
        .arg("--csv")
        .arg(&same)
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("same file as the input"));
    assert_eq!(std::fs::read(&p).unwrap(), before);
}
