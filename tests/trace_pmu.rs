//! PMU, machine profile and process-stats tests (run on the real machine; the software-counter
//! path must work even where the hardware PMU does not, e.g. KVM guests).

use cflow::telemetry::machine::{probe_bandwidth, process_stats, MachineProfile};
use cflow::telemetry::pmu::{Pmu, PmuPhase, SW_COUNTERS};
use std::time::Duration;

fn spin(ms: u64) -> u64 {
    let t = std::time::Instant::now();
    let mut x = 1u64;
    while t.elapsed() < Duration::from_millis(ms) {
        for _ in 0..1000 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
    }
    x
}

#[test]
fn software_counters_tick() {
    let mut pmu = Pmu::software_only();
    assert!(
        pmu.is_enabled(),
        "software counters must open: {:?}",
        pmu.unavailable()
    );
    assert!(!pmu.has_hardware());
    pmu.begin_token();
    spin(5);
    pmu.phase(PmuPhase::Attention);
    let v: Vec<u8> = vec![1; 8 << 20]; // page faults
    std::hint::black_box(&v);
    pmu.phase(PmuPhase::Dense);
    spin(2);
    pmu.phase(PmuPhase::Attention); // accumulates into the first entry
    let s = pmu.end_token();
    let tc = s
        .software
        .iter()
        .find(|(k, _)| k == "task-clock")
        .unwrap()
        .1;
    // Wall-clock spinning on a shared machine: only require that CPU time was counted.
    assert!(tc >= 1_000_000, "task-clock {tc} ns for 7 ms of spinning");
    let names: Vec<&str> = s.software.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(names, SW_COUNTERS);
    let phase_names: Vec<&str> = s.phases.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(&phase_names[..2], ["attention", "dense"]);
    let attn_tc = s.phases[0]
        .1
        .iter()
        .find(|(k, _)| k == "task-clock")
        .unwrap()
        .1;
    assert!(attn_tc > 0, "{attn_tc}");
    let dense_pf = s.phases[1]
        .1
        .iter()
        .find(|(k, _)| k == "page-faults")
        .unwrap()
        .1;
    assert!(dense_pf > 0, "8 MiB fresh allocation should fault");
    // Phase totals never exceed the token totals.
    let sum: u64 = s
        .phases
        .iter()
        .map(|(_, v)| v.iter().find(|(k, _)| k == "task-clock").unwrap().1)
        .sum();
    assert_eq!(sum, tc);
    assert!(s.unavailable.is_some());

    // A second token starts from zero.
    pmu.begin_token();
    let s2 = pmu.end_token();
    let tc2 = s2
        .software
        .iter()
        .find(|(k, _)| k == "task-clock")
        .unwrap()
        .1;
    assert!(tc2 < tc, "{tc2} vs {tc}");
}

#[test]
fn hardware_or_readable_reason() {
    let mut pmu = Pmu::new();
    println!("{pmu:?}");
    match pmu.unavailable() {
        None => assert!(pmu.has_hardware()),
        Some(reason) => {
            assert!(!pmu.has_hardware());
            assert!(reason.len() > 20 && reason.is_ascii(), "{reason}");
            // Names what was tried and carries the OS error.
            assert!(reason.contains("L1-dcache-loads") || reason.contains("perf_event_open"));
            assert!(reason.contains("os error"), "{reason}");
        }
    }
    pmu.begin_token();
    spin(2);
    pmu.phase(PmuPhase::Experts);
    let s = pmu.end_token();
    assert!(!s.software.is_empty());
    assert_eq!(s.phases[0].0, "experts");
    if pmu.has_hardware() {
        let hw = &s.phases[0].1;
        assert!(hw.iter().any(|(k, v)| k == "instructions" && *v > 0));
    }
}

#[test]
fn disabled_is_inert() {
    let mut pmu = Pmu::disabled();
    assert!(!pmu.is_enabled());
    pmu.begin_token();
    pmu.phase(PmuPhase::Attention);
    let s = pmu.end_token();
    assert!(s.phases.is_empty() && s.software.is_empty());
    assert_eq!(s.unavailable.as_deref(), Some("PMU disabled"));
}

#[test]
fn machine_profile_detects() {
    let p = MachineProfile::detect("avx2+fma");
    println!("{p:#?}");
    assert!(p.logical_cores >= 1 && p.physical_cores >= 1);
    assert!(p.ram_bytes > 100 << 20);
    assert_eq!(p.isa, "avx2+fma");
    assert!(!p.cpu_model.is_empty());
    if std::path::Path::new("/sys/devices/system/cpu/cpu0/cache/index0").exists() {
        assert!(p.l1d_bytes.is_some());
    }
    let back: MachineProfile = serde_json::from_str(&serde_json::to_string(&p).unwrap()).unwrap();
    assert_eq!(back, p);
}

#[test]
fn bandwidth_probe_and_cache() {
    let dir = tempfile::tempdir().unwrap();
    std::env::set_var("CFLOW_CACHE", dir.path());
    let t = std::time::Instant::now();
    let p = MachineProfile::load_or_probe("scalar");
    let first = t.elapsed();
    let bw = p.bandwidth.clone().unwrap();
    println!(
        "probe: 1 thread {:.1} GB/s, {} threads {:.1} GB/s, {} MiB, {:.0} ms (init {:.0} ms, {} passes)",
        bw.read_gbps_1t,
        bw.threads,
        bw.read_gbps_nt,
        bw.buffer_bytes >> 20,
        bw.probe_ms,
        bw.init_ms,
        bw.passes
    );
    assert!(bw.read_gbps_1t > 0.5 && bw.read_gbps_nt > 0.5);
    // ≥ 1 GiB, best of N, every thread count (a few seconds once per machine).
    assert!(bw.buffer_bytes >= 1 << 30, "{bw:?}");
    assert_eq!(bw.per_threads.len() as u32, p.logical_cores);
    assert!(!bw.method.is_empty());
    let files: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(files.len(), 1);
    let t = std::time::Instant::now();
    let p2 = MachineProfile::load_or_probe("scalar");
    assert!(t.elapsed() < first, "cached lookup must not probe again");
    assert_eq!(p2.bandwidth, p.bandwidth);
}

#[test]
fn tiny_probe_is_sane() {
    // L2-sized buffer: must be far above DRAM speed and never zero.
    let bw = probe_bandwidth(256 << 10, 1, 2, 64 << 20);
    assert!(bw.read_gbps_1t > 1.0, "{bw:?}");
}

#[test]
fn process_stats_reports_rss() {
    let a = process_stats();
    spin(250);
    let b = process_stats();
    println!("{a:?} {b:?}");
    assert!(b.rss_bytes > 1 << 20);
    assert!(
        b.cpu_percent > 10.0,
        "spinning should show CPU: {}",
        b.cpu_percent
    );
}
