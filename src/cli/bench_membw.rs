//! `bench membw`: the DRAM read ceiling behind every roofline figure of cflow-tui (the Streams
//! pane's "% of the read ceiling"), measured on demand. Runs `telemetry::membw::probe_bandwidth`
//! (a read over a buffer in the weights' kind of memory: anonymous, 2 MiB pages where the kernel
//! grants them) for every thread count up to `--threads`, and prints GB/s per thread count with
//! the method. `--save` stores the result as this machine's profile, which the TUI reads.

use crate::outln;
use crate::telemetry::machine::MachineProfile;
use crate::telemetry::membw::{probe_bandwidth, SAMPLE_BYTES};
use anyhow::{bail, Result};
use clap::Args;

#[derive(Args, Debug)]
#[command(after_help = "Examples:\n  cflow-tui bench membw\n  \
    cflow-tui bench membw --threads 2 --samples 10 --json\n  \
    cflow-tui bench membw --save     # refresh the ceiling the TUI compares against")]
pub struct MembwArgs {
    /// Largest thread count; every count from 1 up is measured (default: all logical cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Buffer size in MiB (far larger than the last-level cache, or it measures the cache).
    #[arg(long, default_value_t = 1024)]
    pub mib: usize,
    /// Timed samples per thread count; the best (shortest) is reported, as `membw` does.
    #[arg(long, default_value_t = crate::telemetry::membw::SAMPLES)]
    pub samples: u32,
    /// Store the result as this machine's profile (the ceiling the TUI's Streams pane uses).
    #[arg(long)]
    pub save: bool,
    /// Print one JSON object: the probe's result as a trace header's `machine.bandwidth`
    /// (docs/TRACE.md).
    #[arg(long)]
    pub json: bool,
}

pub fn bench(a: &MembwArgs) -> Result<()> {
    if a.mib < 64 {
        bail!(
            "--mib {} is too small: use at least 64 (1024, the default, is far beyond any L3)",
            a.mib
        );
    }
    if a.samples == 0 {
        bail!("--samples must be >= 1");
    }
    let mut profile = MachineProfile::detect(crate::kernels::Isa::detect().name());
    // The buffer is first-touched in full: keep it well inside memory rather than let the
    // kernel's OOM killer end the run.
    let half_ram_mib = (profile.ram_bytes / 2) >> 20;
    if half_ram_mib > 0 && a.mib as u64 > half_ram_mib {
        bail!(
            "--mib {} is more than half of this machine's {} MiB of RAM: use at most {half_ram_mib}",
            a.mib,
            profile.ram_bytes >> 20
        );
    }
    let threads = match a.threads {
        Some(0) => bail!("--threads must be >= 1"),
        Some(t) => t,
        None => profile.logical_cores.max(1) as usize,
    };
    if !a.json {
        crate::errln!(
            "probing {} thread count(s) over {} MiB, {} samples each…",
            threads,
            a.mib,
            a.samples
        );
    }
    let bw = probe_bandwidth(a.mib << 20, threads, a.samples, SAMPLE_BYTES);
    let saved = if a.save {
        Some(profile.save_probe(&bw)?)
    } else {
        None
    };
    if a.json {
        outln!("{}", serde_json::to_string(&bw)?)?;
        return Ok(());
    }
    outln!("read ceiling, {}", bw.method)?;
    outln!("threads | read GB/s")?;
    for c in &bw.per_threads {
        outln!("{:7} | {:9.2}", c.threads, c.read_gbps)?;
    }
    outln!(
        "probe {:.1} s (allocating and first touch {:.1} s); GB = 1e9 bytes",
        bw.probe_ms / 1e3,
        bw.init_ms / 1e3
    )?;
    if let Some(p) = saved {
        outln!("saved as this machine's profile: {}", p.display())?;
    }
    Ok(())
}
