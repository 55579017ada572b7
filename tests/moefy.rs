//! `moefy` end to end on a tiny generated dense model (F32 weights, so cutting the FFN into
//! experts is exact): K = E is the dense model (logits within 1e-4, `--act f32 --kv f32`), also
//! with a shared expert and with route-ahead; the same seed gives a bit-identical file (routers
//! included); `run --dump-routing` on the MoE shows K distinct experts per layer; the retrofitted
//! expert delay and a random router run.

use cflow::convert::generate::{generate, GenSpec};
use cflow::convert::moefy::{moefy, Cluster, MoefySpec, RouterKind};
use cflow::engine::kv::KvType;
use cflow::engine::{Engine, EngineOptions};
use cflow::format::CflowFile;
use cflow::quant::QuantType;
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn dense(dir: &Path) -> PathBuf {
    dense_with(dir, QuantType::F32, 128)
}

/// A generated dense model of `quant` weights and FFN width `ffn`.
fn dense_with(dir: &Path, quant: QuantType, ffn: usize) -> PathBuf {
    let p = dir.join(format!("dense-{}-{ffn}.cflow", quant.name()));
    let mut s = GenSpec::new("llama");
    s.seed = 5;
    s.layers = Some(3);
    s.hidden = Some(64);
    s.heads = Some(4);
    s.ffn = Some(ffn);
    s.vocab = Some(300);
    s.ctx = Some(512);
    s.quant = quant;
    generate(&s, &p, |_, _| {}).unwrap();
    p
}

fn tokens(n: usize) -> Vec<u32> {
    let mut x = 12345u32;
    (0..n)
        .map(|_| {
            x = x.wrapping_mul(1103515245).wrapping_add(12345);
            (x >> 16) % 300
        })
        .collect()
}

fn spec(e: usize, k: usize) -> MoefySpec {
    MoefySpec {
        experts: e,
        top_k: k,
        shared: 0,
        route_from: 0,
        expert_delay: 0,
        cluster: Cluster::CoActivation,
        router: RouterKind::Trained,
        seed: 1,
        threads: 1,
        ridge: 1e-3,
    }
}

fn logits(f: &Arc<CflowFile>, ids: &[u32]) -> Vec<Vec<f32>> {
    let mut e = Engine::new(
        f.clone(),
        EngineOptions {
            threads: 1,
            int_act: false,
            kv: KvType::F32,
            ..Default::default()
        },
    );
    ids.iter()
        .map(|&t| e.step(t, true).unwrap().unwrap().to_vec())
        .collect()
}

/// `n` steps of `m` on the sequential schedule at `threads` threads, shared expert fused or
/// not, with the step split on: each step's logits, and the engine (its split and notes).
fn run_steps(m: &Arc<CflowFile>, fuse: bool, threads: usize, n: usize) -> (Vec<Vec<f32>>, Engine) {
    let mut e = Engine::new(
        m.clone(),
        EngineOptions {
            threads,
            fuse_shared: fuse,
            step_split: true,
            schedule: cflow::engine::options::Schedule::Sequential,
            ..Default::default()
        },
    );
    let out = tokens(n)
        .iter()
        .map(|&t| e.step(t, true).unwrap().unwrap().to_vec())
        .collect();
    (out, e)
}

fn make(src: &Path, s: &MoefySpec, out: &Path) -> Arc<CflowFile> {
    let f = Arc::new(CflowFile::open(src).unwrap());
    moefy(&f, &tokens(512), s, out, &mut |_, _, _| {}).unwrap();
    Arc::new(CflowFile::open(out).unwrap())
}

#[test]
fn k_equal_e_is_the_dense_model() {
    let dir = tempfile::tempdir().unwrap();
    let src = dense(dir.path());
    let want = logits(&Arc::new(CflowFile::open(&src).unwrap()), &tokens(40)[..40]);
    let cases = [
        ("plain", spec(4, 4)),
        (
            "shared",
            MoefySpec {
                shared: 32,
                ..spec(4, 4)
            },
        ),
        (
            "route-from-1",
            MoefySpec {
                route_from: 1,
                ..spec(4, 4)
            },
        ),
        (
            "weights-clusters",
            MoefySpec {
                cluster: Cluster::Weights,
                ..spec(2, 2)
            },
        ),
    ];
    for (name, s) in cases {
        let out = dir.path().join(format!("{name}.cflow"));
        let m = make(&src, &s, &out);
        assert_eq!(m.cfg.n_experts, s.experts);
        assert_eq!(m.cfg.d_ff, s.shared);
        let got = logits(&m, &tokens(40)[..40]);
        let mut max = 0f32;
        for (a, b) in got.iter().zip(&want) {
            for (x, y) in a.iter().zip(b) {
                max = max.max((x - y).abs());
            }
        }
        assert!(max < 1e-4, "{name}: max |Δlogit| {max} vs dense");
    }
}

/// docs/SEMANTICS.md X3: with route-ahead, the shared expert and the routed experts run
/// together; the logits are bit-identical to running them apart, on the integer (Q8) path at
/// 2 threads, and every layer whose selection was known before its FFN (all but the first)
/// saves two pool runs (here 3 tasks at 2 threads: two runs by stripe, against the dense FFN's
/// two and the experts' two).
#[test]
fn shared_and_routed_experts_fused_are_bit_identical_in_fewer_pool_runs() {
    let dir = tempfile::tempdir().unwrap();
    // FFN 288 = a shared expert of 32 + 4 experts of 64: whole Q4_1 blocks.
    let src = dense_with(dir.path(), QuantType::Q4_1, 288);
    let s = MoefySpec {
        shared: 32,
        route_from: 1,
        ..spec(4, 2)
    };
    let m = make(&src, &s, &dir.path().join("fused.cflow"));
    let run = |fuse: bool| {
        let (out, mut e) = run_steps(&m, fuse, 2, 12);
        let split = e.take_step_split();
        // The UI's notes say when the dense/expert times are a modelled split.
        let noted = e.config_info().notes.iter().any(|n| n.contains("fused"));
        assert_eq!(noted, fuse, "notes: {:?}", e.config_info().notes);
        (out, split.pool.runs, split.steps)
    };
    let (fused, fused_runs, steps) = run(true);
    let (apart, apart_runs, steps2) = run(false);
    assert_eq!(steps, 12);
    assert_eq!(steps2, 12);
    assert!(fused == apart, "fused logits differ from the separate runs");
    let layers = m.cfg.n_layers as u64;
    assert_eq!(
        apart_runs - fused_runs,
        2 * (layers - 1) * steps,
        "pool runs: {apart_runs} apart, {fused_runs} fused over {steps} steps"
    );
}

/// The fused experts run one task per expert when there are at least three per pool thread,
/// else in two pool runs split by stripes (`engine::moe`): the same bits either way. Eight
/// experts of 32 units and a shared expert of 32, top 6: 7 tasks, by expert at 1 and 2 threads,
/// by stripe at 3 (one more pool run per layer and step), each equal to the 1-thread run with
/// the shared expert apart.
#[test]
fn fused_experts_by_expert_and_by_stripe_are_bit_identical() {
    let dir = tempfile::tempdir().unwrap();
    let src = dense_with(dir.path(), QuantType::Q4_1, 288);
    let s = MoefySpec {
        shared: 32,
        route_from: 1,
        ..spec(8, 6)
    };
    let m = make(&src, &s, &dir.path().join("by_expert.cflow"));
    let run = |fuse: bool, threads: usize| {
        let (out, mut e) = run_steps(&m, fuse, threads, 10);
        (out, e.take_step_split().pool.runs)
    };
    let (want, _) = run(false, 1);
    let mut runs = Vec::new();
    for threads in [1, 2, 3] {
        let (got, n) = run(true, threads);
        assert!(got == want, "fused at {threads} threads differs");
        assert!(
            run(false, threads).0 == want,
            "apart at {threads} threads differs"
        );
        runs.push(n);
    }
    // Every layer's experts are fused (layer 0's without the shared expert: 6 tasks).
    let per_layer_step = m.cfg.n_layers as u64 * 10;
    assert_eq!(runs[0], runs[1], "by expert at 1 and 2 threads: {runs:?}");
    assert_eq!(
        runs[2] - runs[1],
        per_layer_step,
        "by stripe at 3: {runs:?}"
    );
}

#[test]
fn same_seed_same_file_and_fewer_experts_differ() {
    let dir = tempfile::tempdir().unwrap();
    let src = dense(dir.path());
    let s = MoefySpec {
        shared: 32,
        route_from: 1,
        ..spec(4, 2)
    };
    let a = dir.path().join("a.cflow");
    let b = dir.path().join("b.cflow");
    let fa = make(&src, &s, &a);
    make(&src, &s, &b);
    assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
    for l in &fa.layers {
        assert_eq!(l.experts.len(), 4);
        assert!(l.router_bias.is_some());
    }
    assert_eq!(fa.cfg.meta.route_ahead, 1);
    // K < E is a different model.
    let want = logits(&Arc::new(CflowFile::open(&src).unwrap()), &tokens(8));
    let got = logits(&fa, &tokens(8));
    assert!(got
        .iter()
        .flatten()
        .zip(want.iter().flatten())
        .any(|(x, y)| (x - y).abs() > 1e-3));
    // The retrofitted delay and the random router make runnable models.
    for (name, s) in [
        (
            "delay",
            MoefySpec {
                expert_delay: 1,
                ..spec(4, 2)
            },
        ),
        (
            "random",
            MoefySpec {
                router: RouterKind::Random,
                ..spec(4, 2)
            },
        ),
    ] {
        let m = make(&src, &s, &dir.path().join(format!("{name}.cflow")));
        assert_eq!(m.cfg.expert_delay, s.expert_delay);
        assert!(logits(&m, &tokens(4))
            .iter()
            .flatten()
            .all(|v| v.is_finite()));
    }
}

#[test]
fn dump_routing_shows_k_distinct_experts_per_layer() {
    let dir = tempfile::tempdir().unwrap();
    let src = dense(dir.path());
    let out = dir.path().join("moe.cflow");
    make(
        &src,
        &MoefySpec {
            route_from: 1,
            ..spec(4, 2)
        },
        &out,
    );
    let dump = dir.path().join("r.jsonl");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_cflow-tui"))
        .arg("run")
        .arg(&out)
        .args([
            "--token-ids",
            "5,6,7,8",
            "-n",
            "3",
            "--threads",
            "1",
            "--ignore-eos",
        ])
        .arg("--dump-routing")
        .arg(&dump)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = std::fs::read_to_string(&dump).unwrap();
    assert_eq!(text.lines().count(), 7);
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let layers = v["layers"].as_array().unwrap();
        assert_eq!(layers.len(), 3, "{line}");
        for l in layers {
            let mut ids: Vec<u64> = l["experts"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap())
                .collect();
            ids.sort_unstable();
            ids.dedup();
            assert_eq!(ids.len(), 2, "{line}");
            assert!(l["weights"].as_array().unwrap().iter().all(|w| w == 1.0));
        }
    }
}

/// Mean over positions of max |Δlogit| against `want`.
fn mean_max_diff(got: &[Vec<f32>], want: &[Vec<f32>]) -> f32 {
    let per: Vec<f32> = got
        .iter()
        .zip(want)
        .map(|(a, b)| {
            a.iter()
                .zip(b)
                .map(|(x, y)| (x - y).abs())
                .fold(0f32, f32::max)
        })
        .collect();
    per.iter().sum::<f32>() / per.len() as f32
}

fn logits_with(f: &Arc<CflowFile>, ids: &[u32], oracle: bool) -> Vec<Vec<f32>> {
    let mut e = Engine::new(
        f.clone(),
        EngineOptions {
            threads: 2,
            int_act: false,
            kv: KvType::F32,
            ..Default::default()
        },
    );
    e.set_oracle_router(oracle).unwrap();
    ids.iter()
        .map(|&t| e.step(t, true).unwrap().unwrap().to_vec())
        .collect()
}

/// `--oracle-router` (the diagnostic bound of the MoE table): with K = E it runs every expert,
/// so it is the dense model; with K < E it picks the experts with the largest hidden activation,
/// which is closer to dense than the router trained to predict them and much closer than the
/// experts with the smallest (a random router); a dense model refuses it.
#[test]
fn oracle_router_bounds_the_trained_router() {
    let dir = tempfile::tempdir().unwrap();
    let src = dense(dir.path());
    let dense_f = Arc::new(CflowFile::open(&src).unwrap());
    let ids = &tokens(48)[..48];
    let want = logits(&dense_f, ids);
    let all = make(&src, &spec(4, 4), &dir.path().join("k4.cflow"));
    let d = mean_max_diff(&logits_with(&all, ids, true), &want);
    assert!(
        d < 1e-4,
        "oracle with K = E: mean max |Δlogit| {d} vs dense"
    );
    let two = make(&src, &spec(4, 2), &dir.path().join("k2.cflow"));
    let oracle = mean_max_diff(&logits_with(&two, ids, true), &want);
    let trained = mean_max_diff(&logits_with(&two, ids, false), &want);
    let random = make(
        &src,
        &MoefySpec {
            router: RouterKind::Random,
            ..spec(4, 2)
        },
        &dir.path().join("k2r.cflow"),
    );
    let random = mean_max_diff(&logits_with(&random, ids, false), &want);
    assert!(
        oracle <= trained && oracle < random,
        "oracle {oracle} trained {trained} random {random} (mean max |Δlogit| vs dense)"
    );
    let mut e = Engine::new(dense_f, EngineOptions::default());
    let err = e.set_oracle_router(true).unwrap_err();
    assert!(err.contains("no routed experts"), "{err}");
}

/// `--experts-used N` routes every token to N experts instead of the file's top-k: on a moefied
/// F32 model, N = E gives the dense model's greedy tokens (`run`), `bench decode --json` reports
/// the N that ran, and an N outside 1..=E, or any N on a dense model, is refused naming the flag.
#[test]
fn experts_used_overrides_top_k_and_all_experts_decode_as_dense() {
    let dir = tempfile::tempdir().unwrap();
    let src = dense(dir.path());
    let out = dir.path().join("k2.cflow");
    let s = MoefySpec {
        shared: 32,
        route_from: 1,
        ..spec(4, 2)
    };
    make(&src, &s, &out);
    let bin = env!("CARGO_BIN_EXE_cflow-tui");
    let run = |model: &Path, extra: &[&str]| {
        let mut args = vec!["run".to_string(), model.display().to_string()];
        args.extend(
            [
                "--token-ids",
                "5,17,99",
                "-n",
                "24",
                "--act",
                "f32",
                "--kv",
                "f32",
                "-t",
                "1",
            ]
            .map(String::from),
        );
        args.extend(extra.iter().map(|s| s.to_string()));
        args.push("--json".into());
        std::process::Command::new(bin)
            .args(&args)
            .output()
            .unwrap()
    };
    let ids = |o: &std::process::Output| -> Vec<u64> {
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        v["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap())
            .collect()
    };
    let dense_ids = ids(&run(&src, &[]));
    assert_eq!(ids(&run(&out, &["--experts-used", "4"])), dense_ids);
    assert_ne!(
        ids(&run(&out, &[])),
        dense_ids,
        "K = 2 should differ from dense here"
    );
    for (model, n, want) in [
        (&out, "5", "between 1 and the 4 experts"),
        (&out, "0", "between 1 and the 4 experts"),
        (&src, "2", "has no routed experts"),
    ] {
        let o = run(model, &["--experts-used", n]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success() && err.contains("--experts-used") && err.contains(want),
            "{err}"
        );
    }
    let o = std::process::Command::new(bin)
        .args(["bench", "decode"])
        .arg(&out)
        .args([
            "--experts-used",
            "3",
            "-n",
            "4",
            "-r",
            "1",
            "-t",
            "1",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["experts_used"], 3);
}

/// `inspect` on a moefied model reports its shared expert (the layers' dense FFN, always run,
/// without a gate) and its router rule, in text and in JSON that matches
/// assets/schema/inspect.json; without a shared expert it says so.
#[test]
fn inspect_reports_a_moefied_models_shared_expert_and_router() {
    let dir = tempfile::tempdir().unwrap();
    let src = dense(dir.path());
    let bin = env!("CARGO_BIN_EXE_cflow-tui");
    let schema: serde_json::Value =
        serde_json::from_str(include_str!("../assets/schema/inspect.json")).unwrap();
    let validator = jsonschema::validator_for(&schema).unwrap();
    for (shared, text) in [
        (32, "shared expert FFN 32 (always run)"),
        (0, "no shared expert"),
    ] {
        let out = dir.path().join(format!("shared{shared}.cflow"));
        make(
            &src,
            &MoefySpec {
                shared,
                ..spec(4, 2)
            },
            &out,
        );
        let o = std::process::Command::new(bin)
            .arg("inspect")
            .arg(&out)
            .arg("--json")
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let errors: Vec<String> = validator.iter_errors(&v).map(|e| e.to_string()).collect();
        assert!(errors.is_empty(), "{errors:?}");
        let m = &v["moe"];
        assert_eq!(m["shared_expert"], shared > 0);
        assert_eq!(m["shared_expert_ffn"], shared);
        assert_eq!(m["shared_expert_gated"], false);
        assert_eq!(m["router"], "topk_unweighted");
        let o = std::process::Command::new(bin)
            .arg("inspect")
            .arg(&out)
            .output()
            .unwrap();
        let t = String::from_utf8_lossy(&o.stdout);
        assert!(t.contains(text), "{t}");
    }
}
