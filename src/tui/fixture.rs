//! Deterministic, realistic event sequences for tests, snapshots and demos of the UI without an
//! engine: the paper's demo MoE (6 layers, d=512, E=8, k=2, δd=1, δe=2, staged expert fetch, no
//! hardware PMU) and a dense Llama-like chat model (SmolLM2-135M geometry, hardware counters).

use crate::engine::{ExpertTier, FetchMode, Layout, Schedule};
use crate::rng::Rng;
use crate::telemetry::event::{
    EngineConfigInfo, Event, LayerIo, LayerStat, ModelSummary, PmuSample, Stamped, StopReason,
    StreamBytes, TokenStats,
};

/// Six equal demo layers; with `skip`, layer 0 reads no dense bytes (its input is zero, δd = 1).
fn demo_layers(attn: u64, dense: u64, experts: u64, skip: bool) -> Vec<StreamBytes> {
    (0..6)
        .map(|l| StreamBytes {
            attn,
            dense: if skip && l == 0 { 0 } else { dense },
            experts,
        })
        .collect()
}

/// The built-in demo model's summary (paper geometry).
pub fn demo_model() -> ModelSummary {
    ModelSummary {
        name: "demo".into(),
        arch: "arch2_4_combined".into(),
        synthetic: true,
        n_layers: 6,
        d_model: 512,
        n_heads: 8,
        n_kv_heads: 8,
        d_ff: 2048,
        n_experts: 8,
        top_k: 2,
        expert_ffn: 512,
        vocab: 50257,
        max_ctx: 2048,
        dense_delay: 1,
        expert_delay: 2,
        route_ahead: 0,
        combine_style: "DelayedSum".into(),
        quant_types: vec!["Q4_0".into()],
        has_chat_template: false,
        // Payload at 0.5 B/param over every layer: the paper's 9.00 → 4.50. As read, layer 0's
        // dense FFN (input zero, ℓ < δd = 1) is skipped: 8.25 → 4.25. As stored, a full Q4_0 tile
        // is 18,448 bytes for 16,384 payload bytes.
        layer_payload_bytes_all: demo_layers(524_288, 1_572_864, 786_432, false),
        layer_payload_bytes: demo_layers(524_288, 1_572_864, 786_432, true),
        layer_bytes: demo_layers(590_336, 1_771_008, 885_504, true),
        lm_head_bytes: 50257 * 512 / 32 * 18,
        kv_dim: 512,
        kv_elem_bytes: 4,
        kv_window: Vec::new(),
        inspect: None,
        file_hash: "3f1c9a0d".into(),
    }
}

/// A machine profile's bandwidth as the probe reports it (2 threads).
pub fn demo_bandwidth() -> crate::telemetry::membw::Bandwidth {
    use crate::telemetry::membw::{Bandwidth, ThreadCeiling};
    Bandwidth {
        read_gbps_1t: 20.3,
        read_gbps_nt: 33.3,
        threads: 2,
        buffer_bytes: 1 << 30,
        probe_ms: 2600.0,
        init_ms: 900.0,
        passes: 5,
        measured: "2026-12-01T11:00:00Z".into(),
        per_threads: vec![
            ThreadCeiling {
                threads: 1,
                read_gbps: 20.3,
            },
            ThreadCeiling {
                threads: 2,
                read_gbps: 33.3,
            },
        ],
        method:
            "2 MiB pages (100%), read Σu64 over 1024 MiB, best of 5 × 1024 MiB per thread count"
                .into(),
        huge_page_share: Some(1.0),
    }
}

/// A dense Llama-like chat model (SmolLM2-135M-Instruct geometry).
pub fn dense_model() -> ModelSummary {
    ModelSummary {
        name: "SmolLM2-135M-Instruct".into(),
        arch: "llama".into(),
        synthetic: false,
        n_layers: 30,
        d_model: 576,
        n_heads: 9,
        n_kv_heads: 3,
        d_ff: 1536,
        n_experts: 0,
        top_k: 0,
        expert_ffn: 0,
        vocab: 49152,
        max_ctx: 2048,
        dense_delay: 0,
        expert_delay: 0,
        route_ahead: 0,
        combine_style: "Sequential".into(),
        quant_types: vec!["Q4_1".into(), "Q8_0".into(), "F32".into()],
        has_chat_template: true,
        layer_payload_bytes: vec![
            StreamBytes {
                attn: 442_368,
                dense: 1_327_104,
                experts: 0,
            };
            30
        ],
        // δd = 0: nothing is skipped, so every layer's payload is what is read.
        layer_payload_bytes_all: vec![
            StreamBytes {
                attn: 442_368,
                dense: 1_327_104,
                experts: 0,
            };
            30
        ],
        layer_bytes: vec![
            StreamBytes {
                attn: 552_960,
                dense: 1_658_880,
                experts: 0,
            };
            30
        ],
        lm_head_bytes: 49152 * 576 / 32 * 34,
        kv_dim: 192,
        kv_elem_bytes: 4,
        kv_window: Vec::new(),
        inspect: None,
        file_hash: "a81b22e4".into(),
    }
}

/// Engine config of the demo (prefetch off, staged fetch, vflow unavailable).
pub fn demo_config(fetch: FetchMode) -> EngineConfigInfo {
    EngineConfigInfo {
        threads: 2,
        isa: "AVX2".into(),
        prefetch: false,
        weights: "mmap".into(),
        repacked: false,
        readers: 2,
        fetch,
        expert_tier: ExpertTier::Direct,
        layout: Layout::Cflow,
        layouts_available: vec![Layout::Cflow, Layout::RowMajor],
        notes: vec![],
    }
}

/// Engine config of the dense model.
pub fn dense_config() -> EngineConfigInfo {
    EngineConfigInfo {
        threads: 2,
        isa: "AVX2".into(),
        prefetch: false,
        weights: "resident".into(),
        repacked: false,
        readers: 1,
        fetch: FetchMode::Staged,
        expert_tier: ExpertTier::Mmap,
        layout: Layout::Cflow,
        layouts_available: vec![Layout::Cflow, Layout::Vflow, Layout::RowMajor],
        notes: vec![],
    }
}

/// The engine's report of a token run exactly as `cfg` asks (sequential schedule, q8 numerics
/// with an f16 KV cache); `experts`: the model has experts.
pub fn ran_of(cfg: &EngineConfigInfo, experts: bool) -> crate::telemetry::RunInfo {
    let direct = experts && cfg.expert_tier == ExpertTier::Direct && cfg.layout != Layout::RowMajor;
    crate::telemetry::RunInfo {
        prefetch: cfg.prefetch && cfg.layout != Layout::RowMajor,
        fetch: direct.then_some(cfg.fetch),
        tier: experts.then_some(if direct {
            ExpertTier::Direct
        } else {
            ExpertTier::Mmap
        }),
        layout: cfg.layout,
        schedule: Schedule::Sequential,
        threads: cfg.threads,
        weights: cfg.weights.clone(),
        act: "q8".into(),
        kv: "f16".into(),
        expert_cache_mib: 0,
    }
}

const NOISE: &[&str] = &[
    " quarterly",
    " the",
    " Venn",
    " ascended",
    " of",
    " pixel",
    " harbour",
    ",",
    " mint",
    " and",
    " sovereign",
    " gl",
    "imm",
    "ering",
    " 1987",
    " to",
    " lantern",
    ".",
    " orbit",
    " a",
    " marrow",
    " ledger",
];

/// Stats of one demo token: staged fetch (or sync), per-layer bytes, routing and I/O.
pub fn demo_stats(index: u32, pos: u32, fetch: FetchMode, rng: &mut Rng) -> TokenStats {
    let model = demo_model();
    let staged = fetch == FetchMode::Staged;
    let mut layers = Vec::new();
    let mut prev: Vec<u16> = Vec::new();
    for (l, b) in model.layer_bytes.iter().enumerate() {
        // Routing: keep one of the previous layer's experts ~40% of the time.
        let first = if !prev.is_empty() && rng.below(10) < 4 {
            prev[0]
        } else {
            ((rng.below(8) as u32 + l as u32) % 8) as u16
        };
        let mut second = ((first as u32 + 1 + rng.below(7) as u32) % 8) as u16;
        if second == first {
            second = (first + 1) % 8;
        }
        let w = 0.5 + rng.below(40) as f32 / 100.0;
        let routing = vec![(first, w), (second, 1.0 - w)];
        prev = vec![first, second];
        let jitter = rng.below(40_000) as u64;
        let compute = 380_000 + jitter;
        let io_ns = 520_000 + rng.below(60_000) as u64;
        let wait = if staged {
            io_ns.saturating_sub(compute) / 2 + 20_000
        } else {
            io_ns
        };
        layers.push(LayerStat {
            bytes: *b,
            ns_attn: 140_000 + jitter / 2,
            ns_dense: 360_000 + jitter,
            ns_router: 4_000,
            ns_experts: 190_000 + wait,
            routing,
            io: Some(LayerIo {
                compute_ns: compute,
                io_ns,
                wait_ns: wait,
                bytes: b.experts,
            }),
        });
    }
    let layer_ns: u64 = layers
        .iter()
        .map(|l| l.ns_attn + l.ns_dense + l.ns_router + l.ns_experts)
        .sum();
    let ns_lm_head = 1_900_000;
    let phase_ns = [
        layers.iter().map(|l| l.ns_attn).sum::<u64>(),
        layers.iter().map(|l| l.ns_dense).sum::<u64>(),
        layers
            .iter()
            .map(|l| l.ns_router + l.ns_experts)
            .sum::<u64>(),
        ns_lm_head,
    ];
    TokenStats {
        ran: Some(ran_of(&demo_config(fetch), true)),
        index,
        pos,
        ns_total: layer_ns + ns_lm_head,
        ns_lm_head,
        lm_head_bytes: model.lm_head_bytes,
        layers,
        prefetch: None,
        expert_cache: None,
        pool_threads: None,
        pmu: Some(PmuSample {
            unavailable: Some(
                "perf_event_open: hardware events not supported (KVM guest without vPMU)".into(),
            ),
            // Per phase, the software counters (what the engine records without a PMU).
            phases: ["attention", "dense", "experts", "lm_head"]
                .iter()
                .zip(phase_ns)
                .enumerate()
                .map(|(i, (p, ns))| {
                    (
                        p.to_string(),
                        vec![
                            ("task-clock".into(), ns - 10_000),
                            ("page-faults".into(), [2, 3, 7, 0][i]),
                            ("context-switches".into(), [0, 1, 2, 0][i]),
                        ],
                    )
                })
                .collect(),
            software: vec![
                ("task-clock".into(), layer_ns + ns_lm_head - 40_000),
                ("page-faults".into(), 12 + rng.below(4) as u64),
                ("context-switches".into(), 3 + rng.below(3) as u64),
            ],
        }),
    }
}

/// A demo session: a completion prompt, `n` tokens (the first half staged, then a toggle to sync
/// so both A/B arms have samples), and optionally the `Done` event.
pub fn demo_events(n: u32, done: bool) -> Vec<Stamped> {
    let mut rng = Rng::new(7);
    let mut t = 0u64;
    let mut out = Vec::new();
    let mut push = |t: &mut u64, dt: u64, event: Event| {
        *t += dt;
        out.push(Stamped { t_ns: *t, event });
    };
    push(
        &mut t,
        0,
        Event::Session {
            model: Box::new(demo_model()),
            config: demo_config(FetchMode::Staged),
        },
    );
    let prompt_tokens = vec![7454, 2402, 257, 640];
    push(
        &mut t,
        1_000_000,
        Event::Prompt {
            text: "Once upon a time".into(),
            tokens: prompt_tokens.clone(),
            chat: false,
        },
    );
    push(
        &mut t,
        6_500_000,
        Event::Prefill {
            n_tokens: 4,
            ns: 6_500_000,
        },
    );
    let mut fetch = FetchMode::Staged;
    let mut decode_ns = 0;
    for i in 0..n {
        if i == n / 2 {
            fetch = FetchMode::Sync;
            push(&mut t, 10_000, Event::Config(demo_config(FetchMode::Sync)));
        }
        let piece = NOISE[rng.below(NOISE.len())];
        let stats = demo_stats(i, prompt_tokens.len() as u32 + i, fetch, &mut rng);
        decode_ns += stats.ns_total;
        let dt = stats.ns_total;
        push(
            &mut t,
            dt,
            Event::Token {
                index: i,
                id: 1000 + i,
                text: piece.into(),
            },
        );
        push(&mut t, 50_000, Event::Stats(stats));
    }
    if done {
        push(
            &mut t,
            100_000,
            Event::Done {
                reason: StopReason::Length,
                n_tokens: n,
                decode_ns,
                pos: None,
                // The prefill, then the first token's sampling.
                ttft_ns: Some(6_540_000),
            },
        );
    }
    out
}

/// Stats of one dense-model token with hardware counters per phase.
pub fn dense_stats(index: u32, pos: u32, rng: &mut Rng) -> TokenStats {
    let model = dense_model();
    let layers: Vec<LayerStat> = model
        .layer_bytes
        .iter()
        .map(|b| LayerStat {
            bytes: *b,
            ns_attn: 60_000 + rng.below(8_000) as u64,
            ns_dense: 150_000 + rng.below(15_000) as u64,
            ns_router: 0,
            ns_experts: 0,
            routing: vec![],
            io: None,
        })
        .collect();
    let layer_ns: u64 = layers.iter().map(|l| l.ns_attn + l.ns_dense).sum();
    let ns_lm_head = 2_400_000;
    let phase = |name: &str, acc: u64, miss: u64, ins: u64, cyc: u64| {
        (
            name.to_string(),
            vec![
                ("L1-dcache-loads".to_string(), acc),
                ("L1-dcache-load-misses".to_string(), miss),
                ("instructions".to_string(), ins),
                ("cycles".to_string(), cyc),
            ],
        )
    };
    TokenStats {
        ran: Some(ran_of(&dense_config(), false)),
        index,
        pos,
        ns_total: layer_ns + ns_lm_head,
        ns_lm_head,
        lm_head_bytes: model.lm_head_bytes,
        layers,
        prefetch: None,
        expert_cache: None,
        pool_threads: None,
        pmu: Some(PmuSample {
            unavailable: None,
            phases: vec![
                phase("attention", 2_810_000, 121_000, 9_400_000, 6_100_000),
                phase("dense", 7_950_000, 402_000, 27_300_000, 16_900_000),
                phase("lm_head", 9_420_000, 955_000, 31_800_000, 22_700_000),
            ],
            software: vec![
                ("task-clock".into(), layer_ns + ns_lm_head),
                ("page-faults".into(), 0),
                ("context-switches".into(), 1),
            ],
        }),
    }
}

/// A dense chat session: one finished turn and a second one still streaming.
pub fn dense_events() -> Vec<Stamped> {
    let mut rng = Rng::new(11);
    let mut t = 0u64;
    let mut out = Vec::new();
    let mut push = |t: &mut u64, dt: u64, event: Event| {
        *t += dt;
        out.push(Stamped { t_ns: *t, event });
    };
    push(
        &mut t,
        0,
        Event::Session {
            model: Box::new(dense_model()),
            config: dense_config(),
        },
    );
    let turns: [(&str, &[&str], bool); 2] = [
        (
            "What is the capital of France?",
            &["The", " capital", " of", " France", " is", " Paris", "."],
            true,
        ),
        (
            "And of Italy? Answer in one line.",
            &["The", " capital", " of", " Italy", " is"],
            false,
        ),
    ];
    let mut pos = 0u32;
    let mut index_base = 0;
    for (prompt, pieces, finished) in turns {
        let n_prompt = 24;
        push(
            &mut t,
            2_000_000,
            Event::Prompt {
                text: prompt.into(),
                tokens: (0..n_prompt).collect(),
                chat: true,
            },
        );
        push(
            &mut t,
            40_000_000,
            Event::Prefill {
                n_tokens: n_prompt,
                ns: 40_000_000,
            },
        );
        pos += n_prompt;
        let mut decode_ns = 0;
        for (i, p) in pieces.iter().enumerate() {
            let s = dense_stats(i as u32, pos, &mut rng);
            decode_ns += s.ns_total;
            push(
                &mut t,
                s.ns_total,
                Event::Token {
                    index: i as u32,
                    id: 100 + index_base + i as u32,
                    text: (*p).into(),
                },
            );
            push(&mut t, 30_000, Event::Stats(s));
            pos += 1;
        }
        index_base += pieces.len() as u32;
        if finished {
            push(
                &mut t,
                50_000,
                Event::Done {
                    reason: StopReason::Eos,
                    n_tokens: pieces.len() as u32,
                    decode_ns,
                    pos: None,
                    // The prefill, then the first token's sampling.
                    ttft_ns: Some(40_050_000),
                },
            );
        }
    }
    out
}

/// A synthetic A/B experiment on the demo model: one long completion whose ms/token rises with
/// the context position (8 ms + 0.02 ms per position, ±3% noise), prefetch off for the first
/// 40% of the tokens, on for the next 40% (a manual toggle between "replies"), then alternating
/// every 8 tokens (A/B auto). Tokens run with prefetch on take `on_factor` times as long.
pub fn ab_events(on_factor: f64, n: u32) -> Vec<Stamped> {
    let mut rng = Rng::new(23);
    let mut t = 0u64;
    let mut out = Vec::new();
    let mut push = |t: &mut u64, dt: u64, event: Event| {
        *t += dt;
        out.push(Stamped { t_ns: *t, event });
    };
    let cfg = |on: bool| EngineConfigInfo {
        prefetch: on,
        readers: 1,
        ..demo_config(FetchMode::Staged)
    };
    push(
        &mut t,
        0,
        Event::Session {
            model: Box::new(demo_model()),
            config: cfg(false),
        },
    );
    push(
        &mut t,
        1_000_000,
        Event::Prompt {
            text: "Once upon a time".into(),
            tokens: vec![7454, 2402, 257, 640],
            chat: false,
        },
    );
    push(
        &mut t,
        6_500_000,
        Event::Prefill {
            n_tokens: 4,
            ns: 6_500_000,
        },
    );
    let arm = |i: u32| {
        if i < n * 2 / 5 {
            false
        } else if i < n * 4 / 5 {
            true
        } else {
            ((i - n * 4 / 5) / crate::telemetry::ab::AUTO_BLOCK) % 2 == 1
        }
    };
    for i in 0..n {
        if i > 0 && arm(i) != arm(i - 1) {
            push(&mut t, 10_000, Event::Config(cfg(arm(i))));
        }
        let pos = 4 + i;
        let mut stats = demo_stats(i, pos, FetchMode::Staged, &mut rng);
        stats.ran = Some(ran_of(&cfg(arm(i)), true));
        let noise = 1.0 + (rng.below(6001) as f64 - 3000.0) / 100_000.0;
        let factor = if arm(i) { on_factor } else { 1.0 };
        let ms = (8.0 + 0.02 * pos as f64) * noise * factor;
        stats.ns_total = (ms * 1e6) as u64;
        let dt = stats.ns_total;
        let piece = NOISE[rng.below(NOISE.len())];
        push(
            &mut t,
            dt,
            Event::Token {
                index: i,
                id: 1000 + i,
                text: piece.into(),
            },
        );
        push(&mut t, 50_000, Event::Stats(stats));
    }
    out
}
