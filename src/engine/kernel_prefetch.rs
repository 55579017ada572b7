//! `--kernel-prefetch`: whether the weight-streaming kernels issue their own prefetches
//! ([`KernelPrefetch`]), resolved once per process and set for every kernel. `on` and `off` set
//! every family; `auto` (the default) uses this machine's probe ([`prefetch_probe`]), measured
//! on first use (~0.3 s) and cached per machine in the cache directory, like the bandwidth
//! ceiling. The setting changes when bytes arrive, never a value.

use crate::kernels::prefetch::{self, KernelPrefetch};
use crate::kernels::prefetch_probe::{self, Probe};
use crate::kernels::Isa;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// What the user asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Auto,
    On,
    Off,
}

/// Where the setting came from.
#[derive(Clone, Debug, PartialEq)]
pub enum Source {
    /// `--kernel-prefetch on|off`.
    Flag,
    /// This machine's probe, measured now or read from the cache (`cached`).
    Probe { probe: Probe, cached: bool },
    /// `auto` where there is nothing to measure (`--isa scalar`, whose kernels never
    /// prefetch): the built-in setting, every family on.
    Default,
}

/// The resolved setting.
#[derive(Clone, Debug, PartialEq)]
pub struct Resolved {
    pub setting: KernelPrefetch,
    pub source: Source,
}

impl Resolved {
    /// The `kernel_prefetch` object of `bench decode --json` (docs/JSON.md).
    pub fn json(&self) -> serde_json::Value {
        let source = match &self.source {
            Source::Flag => "flag",
            Source::Probe { .. } => "probe",
            Source::Default => "default",
        };
        let probe = match &self.source {
            Source::Probe { probe, .. } => serde_json::to_value(probe).unwrap_or_default(),
            _ => serde_json::Value::Null,
        };
        serde_json::json!({
            "repacked": self.setting.repacked,
            "split": self.setting.split,
            "superblock": self.setting.superblock,
            "source": source,
            "probe": probe,
        })
    }

    /// One line for `--help`-style reports, e.g. `repacked off, split on, superblock on
    /// (measured on this CPU)`.
    pub fn describe(&self) -> String {
        let why = match &self.source {
            Source::Flag => "--kernel-prefetch",
            Source::Probe { .. } => "measured on this CPU",
            Source::Default => "built-in default",
        };
        format!("{} ({why})", self.setting.describe())
    }
}

/// The process's resolution (one probe per process at most).
static RESOLVED: Mutex<Option<(Mode, Resolved)>> = Mutex::new(None);

/// Resolves `mode` for `isa` (probing or reading this machine's cache for `auto`; `before_probe`
/// is called before a probe starts, to tell the user), sets it for every kernel, and returns it.
/// Later calls with the same mode return the first result.
pub fn resolve(mode: Mode, isa: Isa, before_probe: &dyn Fn()) -> Resolved {
    let mut g = RESOLVED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((m, r)) = g.as_ref() {
        if *m == mode {
            prefetch::set_kernel(r.setting);
            return r.clone();
        }
    }
    let r = match mode {
        Mode::On => Resolved {
            setting: KernelPrefetch::ALL,
            source: Source::Flag,
        },
        Mode::Off => Resolved {
            setting: KernelPrefetch::NONE,
            source: Source::Flag,
        },
        Mode::Auto => auto(isa, before_probe),
    };
    prefetch::set_kernel(r.setting);
    *g = Some((mode, r.clone()));
    r
}

/// `auto`: the cached probe of this machine and ISA, else a new one (saved; a cache that
/// cannot be written only means the next process probes again).
fn auto(isa: Isa, before_probe: &dyn Fn()) -> Resolved {
    // The scalar kernels never prefetch: nothing to measure.
    if isa == Isa::Scalar {
        return Resolved {
            setting: KernelPrefetch::ALL,
            source: Source::Default,
        };
    }
    let m = crate::telemetry::machine::MachineProfile::detect(isa.name());
    let key = cache_key(&m.cpu_model, m.logical_cores, isa);
    let path = crate::util::cache_dir().ok().map(|d| cache_file(&d, &key));
    if let Some(probe) = path.as_deref().and_then(|p| read_cached(p, &key)) {
        return Resolved {
            setting: probe.choice(),
            source: Source::Probe {
                probe,
                cached: true,
            },
        };
    }
    before_probe();
    let probe = prefetch_probe::run(isa, prefetch_probe::pass_bytes(m.l3_bytes));
    if let Some(p) = path.as_deref() {
        let _ = save(p, &key, &probe);
    }
    Resolved {
        setting: probe.choice(),
        source: Source::Probe {
            probe,
            cached: false,
        },
    }
}

/// The probe's method version: a probe measured by an older method is measured again.
const METHOD_VERSION: u32 = 2;

fn cache_key(cpu: &str, logical: u32, isa: Isa) -> String {
    format!(
        "{cpu} | {logical} cpus | {} | kernel prefetch probe v{METHOD_VERSION}",
        isa.name()
    )
}

fn cache_file(dir: &Path, key: &str) -> PathBuf {
    dir.join(format!(
        "kernel-prefetch-{:016x}.json",
        crate::util::fnv1a(key.as_bytes())
    ))
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Cached {
    key: String,
    probe: Probe,
}

/// The probe cached at `path` for `key` (None when absent, unreadable, malformed or for
/// another machine).
fn read_cached(path: &Path, key: &str) -> Option<Probe> {
    crate::input::read_regular(path, 1 << 20)
        .ok()
        .and_then(|b| serde_json::from_slice::<Cached>(&b).ok())
        .filter(|c| c.key == key)
        .map(|c| c.probe)
}

/// Saves `probe` for `key` at `path` (atomic replace).
fn save(path: &Path, key: &str, probe: &Probe) -> anyhow::Result<()> {
    let c = Cached {
        key: key.to_string(),
        probe: probe.clone(),
    };
    let s = serde_json::to_vec_pretty(&c)?;
    let mut o = crate::output::Output::create(path, &[])?;
    std::io::Write::write_all(&mut o, &s).map_err(|e| o.error("write", e))?;
    o.commit()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::prefetch_probe::{Family, FamilyProbe};

    fn probe(repacked: bool) -> Probe {
        Probe {
            bytes: 1 << 26,
            rounds: 7,
            families: vec![FamilyProbe {
                family: Family::Repacked,
                quant: "Q4_1".into(),
                on_ms: 3.0,
                off_ms: 2.4,
                on_over_off: 1.25,
                prefetch: repacked,
            }],
        }
    }

    #[test]
    fn cache_round_trips_for_its_key_only() {
        let d = tempfile::tempdir().unwrap();
        let key = cache_key("Some CPU", 2, Isa::Avx2);
        let f = cache_file(d.path(), &key);
        assert_eq!(read_cached(&f, &key), None);
        save(&f, &key, &probe(false)).unwrap();
        assert_eq!(read_cached(&f, &key), Some(probe(false)));
        assert_eq!(read_cached(&f, &cache_key("Other CPU", 2, Isa::Avx2)), None);
        assert!(!read_cached(&f, &key).unwrap().choice().repacked);
        // A malformed cache is ignored (probed again), never an error.
        std::fs::write(&f, b"{not json").unwrap();
        assert_eq!(read_cached(&f, &key), None);
    }

    #[test]
    fn scalar_kernels_are_not_probed() {
        let r = auto(Isa::Scalar, &|| panic!("no probe for the scalar kernels"));
        assert_eq!(r.source, Source::Default);
        assert_eq!(r.setting, KernelPrefetch::ALL);
    }

    #[test]
    fn flags_set_every_family() {
        let _g = prefetch::tests::LOCK
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let off = resolve(Mode::Off, Isa::cached(), &|| {});
        assert_eq!(off.setting, KernelPrefetch::NONE);
        assert_eq!(prefetch::kernel(), KernelPrefetch::NONE);
        assert_eq!(off.json()["source"], "flag");
        let on = resolve(Mode::On, Isa::cached(), &|| {});
        assert_eq!(prefetch::kernel(), KernelPrefetch::ALL);
        assert_eq!(on.json()["split"], true);
    }
}
