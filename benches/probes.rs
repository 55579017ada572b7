//! Print-only probes of the measuring tools themselves (no assertions; numbers vary by machine):
//! the default memory-bandwidth probe, five times (compare with `membw 256` run alongside), and
//! the cost of one software-counter `Pmu::phase` call, enabled and disabled.
//! `cargo bench --bench probes`.

use cflow::telemetry::machine::probe_bandwidth;
use cflow::telemetry::membw::{BUFFER_BYTES, SAMPLES, SAMPLE_BYTES};
use cflow::telemetry::pmu::{Pmu, PmuPhase};

fn bandwidth() {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    for _ in 0..5 {
        let bw = probe_bandwidth(BUFFER_BYTES, threads, SAMPLES, SAMPLE_BYTES);
        println!(
            "bandwidth probe: 1t {:.2} GB/s  {}t {:.2} GB/s  total {:.0} ms  init {:.0} ms  passes {}",
            bw.read_gbps_1t, bw.threads, bw.read_gbps_nt, bw.probe_ms, bw.init_ms, bw.passes
        );
    }
}

fn pmu_overhead() {
    for (name, mut pmu) in [("new()", Pmu::new()), ("disabled()", Pmu::disabled())] {
        let n = 20_000u32;
        pmu.begin_token();
        let t = std::time::Instant::now();
        for _ in 0..n {
            pmu.phase(PmuPhase::Attention);
        }
        let per = t.elapsed().as_nanos() as f64 / n as f64;
        let _ = pmu.end_token();
        println!("Pmu::{name}: {per:.0} ns per phase() call");
    }
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs this with no arguments and
    // should stay quick.
    if std::env::args().any(|a| a == "--bench") {
        bandwidth();
        pmu_overhead();
    }
}
