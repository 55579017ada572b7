//! The vertical schedule (paper §4.4, Claim 8): tokens and logits are bit-identical to the
//! sequential schedule for every combine style, layout, expert tier and thread count, the
//! delayed work really runs on the second core, and the dense FFNs whose input is known to be
//! zero (the first δd layers) are skipped: exactly their bytes are not read, with unchanged
//! logits.

use cflow::convert::generate::{generate, GenSpec};
use cflow::engine::sampler::argmax;
use cflow::engine::ExpertTier;
use cflow::engine::{stream_bytes, Engine, EngineOptions, Layout, Schedule};
use cflow::format::vflow::{convert, VflowFile};
use cflow::format::CflowFile;
use cflow::quant::QuantType;
use std::path::{Path, PathBuf};
use std::sync::Arc;

const ARCHS: [&str; 9] = [
    "parallel_sqrt2",
    "arch1",
    "arch2_4_combined",
    "arch2_4_sync",
    "arch3",
    "arch4_async_experts",
    "arch5",
    "llama",
    "mixtral",
];

fn gen(dir: &Path, arch: &str) -> PathBuf {
    let p = dir.join(format!("{arch}.cflow"));
    let mut spec = GenSpec::new(arch);
    spec.seed = 11;
    spec.layers = Some(4);
    spec.hidden = Some(128);
    spec.heads = Some(4);
    spec.ffn = Some(256);
    spec.expert_ffn = Some(128);
    spec.vocab = Some(384);
    spec.ctx = Some(128);
    spec.quant = QuantType::Q4_0;
    generate(&spec, &p, |_, _| {}).unwrap();
    p
}

/// Greedy decode of `n` tokens after a fixed prompt: the tokens and every step's logits' bits.
fn decode(e: &mut Engine, n: usize) -> (Vec<u32>, Vec<Vec<u32>>) {
    e.reset();
    let (mut toks, mut logits) = (Vec::new(), Vec::new());
    let mut last = 0;
    for &t in &[1u32, 17, 99, 3] {
        last = argmax(e.step(t, true).unwrap().unwrap()) as u32;
    }
    for _ in 0..n {
        toks.push(last);
        let l = e.step(last, true).unwrap().unwrap();
        logits.push(l.iter().map(|v| v.to_bits()).collect());
        last = argmax(l) as u32;
    }
    (toks, logits)
}

fn engine(c: &Arc<CflowFile>, v: &Arc<CflowFile>, layout: Layout, opts: EngineOptions) -> Engine {
    let mut e = Engine::new(c.clone(), opts);
    e.attach_vflow(v.clone()).unwrap();
    e.set_layout(layout).unwrap();
    e
}

#[test]
fn vertical_is_bit_identical_to_sequential_everywhere() {
    let dir = tempfile::tempdir().unwrap();
    for arch in ARCHS {
        let p = gen(dir.path(), arch);
        let c = Arc::new(CflowFile::open(&p).unwrap());
        let vp = p.with_extension("vflow");
        convert(&c, &vp, 2).unwrap();
        let v = Arc::new(VflowFile::open(&vp).unwrap().into_file());
        let (dd, de) = (c.cfg.dense_delay, c.cfg.expert_delay);
        for layout in [Layout::Cflow, Layout::Vflow, Layout::RowMajor] {
            for tier in [ExpertTier::Mmap, ExpertTier::Direct] {
                if tier == ExpertTier::Direct && !c.cfg.has_experts() {
                    continue;
                }
                for threads in [1, 2, 3] {
                    let opts = |schedule| EngineOptions {
                        threads,
                        expert_tier: tier,
                        schedule,
                        ..Default::default()
                    };
                    let what = format!("{arch} (δd {dd}, δe {de}) {layout:?} {tier:?} t{threads}");
                    let mut seq = engine(&c, &v, layout, opts(Schedule::Sequential));
                    let mut ver = engine(&c, &v, layout, opts(Schedule::Vertical));
                    let a = decode(&mut seq, 6);
                    let b = decode(&mut ver, 6);
                    assert_eq!(a.0, b.0, "tokens differ: {what}");
                    assert!(a.1 == b.1, "logits differ: {what}");
                    assert_eq!(seq.vertical_jobs(), 0, "{what}");
                    // The delayed work ran on the second core whenever there is some.
                    let applies = ver.vertical_applies();
                    assert_eq!(ver.schedule().1 == Schedule::Vertical, applies, "{what}");
                    assert_eq!(ver.vertical_jobs() > 0, applies, "{what}");
                    if dd >= 1 {
                        assert!(applies, "{what}");
                    }
                    // Auto alternates both, then keeps one: the same tokens again.
                    let mut auto = engine(&c, &v, layout, opts(Schedule::Auto));
                    let (t1, l1) = decode(&mut auto, 6);
                    let (t2, l2) = decode(&mut auto, 6);
                    assert!(t1 == a.0 && t2 == a.0 && l1 == a.1 && l2 == a.1, "{what}");
                }
            }
        }
    }
}

#[test]
fn switching_the_schedule_between_tokens_keeps_the_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let p = gen(dir.path(), "arch2_4_combined");
    let c = Arc::new(CflowFile::open(&p).unwrap());
    let opts = |schedule| EngineOptions {
        threads: 2,
        schedule,
        ..Default::default()
    };
    let mut seq = Engine::new(c.clone(), opts(Schedule::Sequential));
    let (want, _) = decode(&mut seq, 10);
    let mut e = Engine::new(c.clone(), opts(Schedule::Sequential));
    e.reset();
    let mut last = 0;
    for &t in &[1u32, 17, 99, 3] {
        last = argmax(e.step(t, true).unwrap().unwrap()) as u32;
    }
    let mut got = Vec::new();
    for i in 0..10 {
        e.set_schedule(if i % 2 == 0 {
            Schedule::Vertical
        } else {
            Schedule::Sequential
        });
        got.push(last);
        last = argmax(e.step(last, true).unwrap().unwrap()) as u32;
    }
    assert_eq!(got, want);
    assert!(e.vertical_jobs() > 0);
}

#[test]
fn the_zero_input_ffns_of_the_first_delta_d_layers_are_not_read() {
    let dir = tempfile::tempdir().unwrap();
    for arch in ["arch2_4_combined", "arch2_4_sync"] {
        let p = gen(dir.path(), arch);
        let c = Arc::new(CflowFile::open(&p).unwrap());
        let dd = c.cfg.dense_delay;
        assert!(dd >= 1, "{arch}: a dense delay");
        // Exactly the dense weights of the first δd layers.
        let skipped: u64 = c.layers[..dd]
            .iter()
            .map(|l| {
                [&l.gate, &l.up, &l.down]
                    .iter()
                    .map(|m| m.as_ref().unwrap().bytes() as u64)
                    .sum::<u64>()
            })
            .sum();
        assert!(skipped > 0);
        for schedule in [Schedule::Sequential, Schedule::Vertical] {
            let run = |read_known_zero| {
                let mut e = Engine::new(
                    c.clone(),
                    EngineOptions {
                        threads: 2,
                        schedule,
                        read_known_zero,
                        ..Default::default()
                    },
                );
                let (toks, logits) = decode(&mut e, 4);
                let dense: Vec<u64> = e.stats().layers.iter().map(|l| l.bytes.dense).collect();
                (toks, logits, dense)
            };
            let (t0, l0, read) = run(true);
            let (t1, l1, skip) = run(false);
            assert_eq!(t0, t1, "{arch} {schedule:?}");
            assert!(l0 == l1, "{arch} {schedule:?}: logits changed");
            assert_eq!(
                read.iter().sum::<u64>() - skip.iter().sum::<u64>(),
                skipped,
                "{arch} {schedule:?}"
            );
            assert!(skip[..dd].iter().all(|&b| b == 0));
            // The byte accounting the Streams pane and `inspect` show is the measured one.
            let model: Vec<u64> = stream_bytes(&c).iter().map(|s| s.dense).collect();
            assert_eq!(model, skip, "{arch}: stream_bytes");
        }
    }
}
