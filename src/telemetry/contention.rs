//! Contention on this machine, for the status bar and the default thread count: the run queue
//! (`procs_running` in /proc/stat: threads running or runnable now, ours included), the CPU
//! time the hypervisor stole (the `steal` column of /proc/stat's `cpu` line, as a share of
//! all CPU time between two samples), the 1-minute load average (/proc/loadavg) and the CPU
//! time other processes used between two samples (all busy time minus this process's own,
//! from /proc/self/stat). Measured, Linux only; `None` elsewhere.
//!
//! The default compute thread count follows from the last: every CPU less those other
//! processes keep busy ([`default_threads`]). Measured with `bench decode --threads
//! 2,1,2,1,2,1` on SmolLM2 on a 2-vCPU KVM guest while other builds ran (load 5.1–5.3):
//! 1 thread 102 / 252 / 169 tok/s against 2 threads 96 / 63 / 130 (medians of 3): a pool
//! thread whose core is taken makes every matvec wait for it (36 % of a step waiting). At load
//! ~3 the same pairs were 2 threads 304 / 250 against 1 thread 191 / 259.

use std::time::Instant;

/// One reading of the machine's contention.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Contention {
    /// Threads running or runnable at the sample (ours included).
    pub run_queue: u32,
    /// Logical CPUs.
    pub cpus: u32,
    /// Stolen CPU time, % of all CPU time since the previous sample.
    pub steal_pct: f32,
    /// 1-minute load average.
    pub load1: f32,
    /// CPUs' worth of time other processes were busy since the previous sample.
    pub others_busy_cpus: f32,
}

/// The `cpu` line of /proc/stat, in clock ticks.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CpuTimes {
    pub busy: u64,
    pub total: u64,
    pub steal: u64,
}

/// (cpu times, procs_running) from the text of /proc/stat.
pub fn parse_proc_stat(s: &str) -> Option<(CpuTimes, u32)> {
    let mut cpu = None;
    let mut running = None;
    for line in s.lines() {
        let mut f = line.split_whitespace();
        match f.next() {
            Some("cpu") => {
                let v: Vec<u64> = f.filter_map(|x| x.parse().ok()).collect();
                if v.len() < 4 {
                    return None;
                }
                // user nice system idle iowait irq softirq steal (guest time is inside user).
                let at = |i: usize| v.get(i).copied().unwrap_or(0);
                let total: u64 = (0..8).map(at).sum();
                let idle = at(3) + at(4);
                cpu = Some(CpuTimes {
                    busy: total - idle - at(7),
                    total,
                    steal: at(7),
                });
            }
            Some("procs_running") => running = f.next().and_then(|x| x.parse().ok()),
            _ => {}
        }
    }
    Some((cpu?, running?))
}

/// The 1-minute load average from the text of /proc/loadavg.
pub fn parse_loadavg(s: &str) -> Option<f32> {
    s.split_whitespace().next()?.parse().ok()
}

/// This process's CPU time (utime + stime, clock ticks) from the text of /proc/self/stat.
pub fn parse_self_ticks(s: &str) -> Option<u64> {
    // The command name (field 2) may hold spaces: fields are counted after its ')'.
    let rest = &s[s.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After ')': state is field 3, so utime (14) and stime (15) are at 11 and 12.
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

/// Successive readings: steal and other processes' busy time are deltas between samples.
#[derive(Default)]
pub struct Sampler {
    last: Option<(Instant, CpuTimes, u64)>,
}

impl Sampler {
    /// Reads /proc now; the first call has no deltas (steal and others' time 0).
    pub fn sample(&mut self) -> Option<Contention> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let (cpu, run_queue) = parse_proc_stat(&stat)?;
        let load1 = std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|s| parse_loadavg(&s))
            .unwrap_or(0.0);
        let own = std::fs::read_to_string("/proc/self/stat")
            .ok()
            .and_then(|s| parse_self_ticks(&s))
            .unwrap_or(0);
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
        let now = Instant::now();
        let mut c = Contention {
            run_queue,
            cpus,
            load1,
            ..Default::default()
        };
        if let Some((_, prev, prev_own)) = self.last {
            c = between(c, &prev, &cpu, own.saturating_sub(prev_own));
        }
        self.last = Some((now, cpu, own));
        Some(c)
    }
}

/// Fills steal % and others' busy CPUs from two `cpu` lines and this process's ticks between.
pub fn between(mut c: Contention, a: &CpuTimes, b: &CpuTimes, own_ticks: u64) -> Contention {
    let total = b.total.saturating_sub(a.total);
    if total > 0 {
        c.steal_pct = 100.0 * b.steal.saturating_sub(a.steal) as f32 / total as f32;
        let others = b.busy.saturating_sub(a.busy).saturating_sub(own_ticks);
        c.others_busy_cpus = c.cpus as f32 * others as f32 / total as f32;
    }
    c
}

/// The default compute thread count: the logical CPUs less the CPUs other processes kept busy
/// over a 100 ms sample (rounded), at least 1; and, when that is fewer than the CPUs, why.
/// Sampled once per process.
pub fn default_threads() -> (usize, Option<String>) {
    static RULE: std::sync::OnceLock<(usize, Option<String>)> = std::sync::OnceLock::new();
    RULE.get_or_init(|| {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let mut s = Sampler::default();
        if s.sample().is_none() {
            return (cpus, None);
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        let Some(c) = s.sample() else {
            return (cpus, None);
        };
        threads_for(cpus, c.others_busy_cpus)
    })
    .clone()
}

/// [`default_threads`]' rule on a reading: `cpus` less `others_busy` CPUs, rounded, at least 1.
pub fn threads_for(cpus: usize, others_busy: f32) -> (usize, Option<String>) {
    let busy = (others_busy.max(0.0).round() as usize).min(cpus.saturating_sub(1));
    if busy == 0 {
        return (cpus, None);
    }
    let t = cpus - busy;
    (
        t,
        Some(format!(
            "{t} compute thread{} of {cpus} CPUs: other processes kept {others_busy:.1} CPUs \
             busy (measured at start; --threads {cpus} uses them all)",
            if t == 1 { "" } else { "s" }
        )),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "cpu  1829775 233106 148363 277830 3331 0 963 3544 0 0\n\
cpu0 914887 116553 74181 138915 1665 0 481 1772 0 0\n\
intr 1 2 3\nctxt 99\nprocs_running 4\nprocs_blocked 0\n";

    #[test]
    fn parses_proc_files_and_computes_the_deltas() {
        let (cpu, rq) = parse_proc_stat(STAT).unwrap();
        assert_eq!(rq, 4);
        assert_eq!(cpu.steal, 3544);
        assert_eq!(
            cpu.total,
            1829775 + 233106 + 148363 + 277830 + 3331 + 963 + 3544
        );
        assert_eq!(cpu.busy, cpu.total - 277830 - 3331 - 3544);
        assert_eq!(parse_loadavg("3.13 2.89 2.49 4/102 11063\n"), Some(3.13));
        let self_stat = "123 (cflow tui) R 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 5";
        assert_eq!(parse_self_ticks(self_stat), Some(300));
        // Two CPUs over 200 ticks: 150 busy, 100 of them ours, 10 stolen.
        let a = CpuTimes::default();
        let b = CpuTimes {
            busy: 150,
            total: 200,
            steal: 10,
        };
        let c = between(
            Contention {
                cpus: 2,
                ..Default::default()
            },
            &a,
            &b,
            100,
        );
        assert!((c.steal_pct - 5.0).abs() < 1e-6);
        assert!((c.others_busy_cpus - 0.5).abs() < 1e-6);
        assert_eq!(parse_proc_stat("nothing"), None);
    }

    #[test]
    fn the_default_leaves_the_cpus_others_keep_busy() {
        assert_eq!(threads_for(2, 0.3).0, 2);
        assert!(threads_for(2, 0.3).1.is_none());
        let (t, why) = threads_for(2, 1.2);
        assert_eq!(t, 1);
        assert!(why.unwrap().contains("other processes kept 1.2 CPUs busy"));
        assert_eq!(threads_for(2, 5.0).0, 1, "at least one");
        assert_eq!(threads_for(8, 2.6).0, 5);
    }
}
