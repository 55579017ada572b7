//! `bench readahead`: the paper's Claim 8 (§5.10) and Claim 5 (§5.7) measured. A `.cflow`
//! and its `.vflow` twin are read cold through the page cache: plain mmap faults served by the
//! kernel's readahead, as decode reads them. Before every arm both files are evicted with
//! `posix_fadvise(DONTNEED)` (those files only, not the machine's page cache). Each arm is one
//! engine that decodes `--tokens` tokens. The first token faults in every weight it reads, so its
//! time is the cold read; the others are warm. The arms alternate layout (cflow, vflow) under
//! each schedule (sequential, vertical), and the order flips every repeat. The device's own
//! readahead is measured beside them: a sequential walk over each cold mapping, with the
//! default advice and with `MADV_RANDOM`.

use crate::cli::bench::{proc_read_bytes, stats3};
use crate::engine::{EngineOptions, Layout, Schedule};
use crate::io::page_cache::{evict, resident_fraction, touch_mapped, Readahead};
use crate::outln;
use anyhow::{bail, Context, Result};
use clap::Args;
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Args, Debug)]
#[command(
    after_help = "Make a model large enough that a cold read takes seconds, and its twin:\n  \
cflow-tui gen --arch arch2_4_combined --hidden 2048 --ffn 8192 --experts 8 --expert-ffn 2048 --layers 24 -o big.cflow\n  \
cflow-tui convert big.cflow            # writes big.vflow\n  \
cflow-tui bench readahead big.cflow --threads 2 --repeat 3"
)]
pub struct ReadaheadArgs {
    /// The `.cflow` model; its `.vflow` twin is MODEL.vflow or `--vflow`.
    pub model: PathBuf,
    /// Tokens per arm: the first is the cold one.
    #[arg(long, default_value_t = 4)]
    pub tokens: usize,
    /// Rounds; each runs every arm once (order flipped every round).
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub engine: crate::cli::EngineArgs,
}

/// One arm's run: cold first token, warm tokens, bytes read from storage.
#[derive(Debug, Clone, serde::Serialize)]
struct ArmRun {
    layout: &'static str,
    schedule: &'static str,
    resident_pct_before: f64,
    /// After the engine was built, before the first token: what opening the model read.
    resident_pct_open: f64,
    cold_first_token_ms: f64,
    warm_ms_per_token: Option<f64>,
    disk_read_mib: Option<f64>,
    cold_mb_s: Option<f64>,
}

fn evict_both(files: &[&Path]) -> Result<f64> {
    let mut resident = 0.0f64;
    for f in files {
        evict(f).with_context(|| format!("evicting {} from the page cache", f.display()))?;
        resident = resident.max(resident_fraction(f).unwrap_or(0.0));
    }
    Ok(resident * 100.0)
}

fn run_arm(
    a: &ReadaheadArgs,
    base: &EngineOptions,
    files: &[&Path],
    layout: Layout,
    schedule: Schedule,
) -> Result<ArmRun> {
    // Evict before mapping: pages this process maps cannot be dropped.
    let resident_pct_before = evict_both(files)?;
    let file = crate::cli::open_model(&a.model)?;
    let opts = EngineOptions {
        layout,
        schedule,
        ..base.clone()
    };
    let mut e = crate::cli::model::new_engine(&a.model, file, opts, &a.engine)?;
    let vocab = e.cfg().vocab as u32;
    // Opening validates the files through their mappings, which reads them: unmap those pages
    // from this process and evict again. `resident_pct_open` records what is left.
    e.release_pages();
    let resident_pct_open = evict_both(files)?;
    let r0 = proc_read_bytes();
    let t0 = Instant::now();
    e.step(1, true).map_err(|err| anyhow::anyhow!("{err}"))?;
    let cold = t0.elapsed().as_secs_f64() * 1e3;
    let r1 = proc_read_bytes();
    let t1 = Instant::now();
    for i in 1..a.tokens {
        e.step((i as u32 * 7919 + 13) % vocab, true)
            .map_err(|err| anyhow::anyhow!("{err}"))?;
    }
    let warm = (a.tokens > 1).then(|| t1.elapsed().as_secs_f64() * 1e3 / (a.tokens - 1) as f64);
    let read = r0.zip(r1).map(|(x, y)| y.saturating_sub(x) as f64);
    Ok(ArmRun {
        layout: match layout {
            Layout::Vflow => "vflow",
            _ => "cflow",
        },
        schedule: match schedule {
            Schedule::Vertical => "vertical",
            _ => "sequential",
        },
        resident_pct_before,
        resident_pct_open,
        cold_first_token_ms: cold,
        warm_ms_per_token: warm,
        disk_read_mib: read.map(|b| b / 1048576.0),
        cold_mb_s: read.map(|b| b / 1e6 / (cold / 1e3)),
    })
}

/// `{median, min, max, n}` of the rounds.
fn stats_n(v: &[f64]) -> serde_json::Value {
    let mut s = stats3(v);
    s["n"] = v.len().into();
    s
}

pub fn bench(a: &ReadaheadArgs) -> Result<()> {
    a.engine.require_mapped("bench readahead")?;
    if a.tokens == 0 || a.repeat == 0 {
        bail!("--tokens and --repeat must be >= 1");
    }
    // The model and its twin are opened (and checked) once before anything is timed: a missing
    // or damaged file fails here, naming it, not after minutes of device walks.
    drop(crate::cli::open_model(&a.model)?);
    let twin = a
        .engine
        .vflow
        .clone()
        .unwrap_or_else(|| a.model.with_extension("vflow"));
    if !twin.exists() {
        bail!(
            "{}: no .vflow twin at {} (make it with `cflow-tui convert {}`, or give --vflow)",
            a.model.display(),
            twin.display(),
            a.model.display()
        );
    }
    drop(crate::format::vflow::VflowFile::open(&twin)?);
    let threads = a.engine.thread_count()?.unwrap_or(1);
    let base = EngineOptions {
        timings: false,
        ..a.engine.with_threads(threads).options()?
    };
    let files = [a.model.as_path(), twin.as_path()];
    let size = |p: &Path| std::fs::metadata(p).map(|m| m.len() as f64 / 1048576.0);
    let (cflow_mib, vflow_mib) = (size(&a.model)?, size(&twin)?);

    // The device: a sequential walk over each cold mapping, readahead on and off.
    let mut device = serde_json::Map::new();
    for (name, p) in [("cflow", &a.model), ("vflow", &twin)] {
        let (mut normal, mut random) = (Vec::new(), Vec::new());
        for round in 0..a.repeat {
            for (adv, out) in [
                (Readahead::Normal, &mut normal),
                (Readahead::Random, &mut random),
            ] {
                // Without readahead a walk of a large file takes minutes: two rounds of it.
                if adv == Readahead::Random && round >= 2 {
                    continue;
                }
                evict_both(&files)?;
                let t = Instant::now();
                let n = touch_mapped(p, adv)?;
                out.push(n as f64 / 1e6 / t.elapsed().as_secs_f64());
            }
        }
        device.insert(
            name.into(),
            serde_json::json!({"normal_mb_s": stats_n(&normal), "random_mb_s": stats_n(&random)}),
        );
    }

    let mut runs: Vec<ArmRun> = Vec::new();
    for round in 0..a.repeat {
        for schedule in [Schedule::Sequential, Schedule::Vertical] {
            let order = if round % 2 == 0 {
                [Layout::Cflow, Layout::Vflow]
            } else {
                [Layout::Vflow, Layout::Cflow]
            };
            for layout in order {
                runs.push(run_arm(a, &base, &files, layout, schedule)?);
            }
        }
    }
    // Per round and schedule: vflow / cflow cold first-token time.
    let mut ratios = serde_json::Map::new();
    let mut arms = serde_json::Map::new();
    for sched in ["sequential", "vertical"] {
        let pick = |l: &str| -> Vec<f64> {
            runs.iter()
                .filter(|r| r.layout == l && r.schedule == sched)
                .map(|r| r.cold_first_token_ms)
                .collect()
        };
        let (c, v) = (pick("cflow"), pick("vflow"));
        let per_round: Vec<f64> = c.iter().zip(&v).map(|(c, v)| v / c).collect();
        ratios.insert(sched.into(), serde_json::json!(per_round));
        arms.insert(
            sched.into(),
            serde_json::json!({"cflow_cold_ms": stats_n(&c), "vflow_cold_ms": stats_n(&v)}),
        );
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let out = serde_json::json!({
        "model": a.model, "vflow": twin, "cflow_mib": cflow_mib, "vflow_mib": vflow_mib,
        "threads": threads, "tokens_per_arm": a.tokens, "repeat": a.repeat,
        "cold_start": {"method": "posix_fadvise(DONTNEED) on the .cflow and the .vflow only"},
        "device_sequential_walk": device, "arms": arms,
        "vflow_over_cflow_cold_time_per_round": ratios, "runs": runs,
        "loadavg_end": load.split_whitespace().next(),
    });
    if a.json {
        outln!("{}", serde_json::to_string(&out)?)?;
        return Ok(());
    }
    outln!(
        "{} ({cflow_mib:.0} MiB) and {} ({vflow_mib:.0} MiB), {threads} thread(s), {} tokens per arm, {} rounds; \
         both files evicted before every arm (posix_fadvise DONTNEED on them only)",
        a.model.display(),
        twin.display(),
        a.tokens,
        a.repeat
    )?;
    for (name, d) in &device {
        outln!(
            "  device, sequential mmap walk of the cold {name}: readahead {:.0} MB/s, MADV_RANDOM {:.0} MB/s (medians)",
            d["normal_mb_s"]["median"].as_f64().unwrap_or(0.0),
            d["random_mb_s"]["median"].as_f64().unwrap_or(0.0)
        )?;
    }
    for sched in ["sequential", "vertical"] {
        let r: Vec<f64> = ratios[sched]
            .as_array()
            .map(|v| v.iter().filter_map(|x| x.as_f64()).collect())
            .unwrap_or_default();
        let lo = r.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = r.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let verdict = if r.len() < 3 {
            "too few rounds to judge (--repeat 3 or more)"
        } else if lo <= 1.0 && hi >= 1.0 {
            "no difference measured (the rounds straddle 1)"
        } else if hi < 1.0 {
            "vflow faster in every round"
        } else {
            "vflow slower in every round"
        };
        outln!(
            "  {sched}: cold first token cflow {:.0} ms, vflow {:.0} ms (medians); vflow/cflow per round {:.3}–{:.3}: {verdict}",
            arms[sched]["cflow_cold_ms"]["median"].as_f64().unwrap_or(0.0),
            arms[sched]["vflow_cold_ms"]["median"].as_f64().unwrap_or(0.0),
            lo,
            hi
        )?;
    }
    Ok(())
}
