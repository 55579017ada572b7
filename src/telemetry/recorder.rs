//! Trace recording: the event stream as JSON Lines (`docs/TRACE.md`, `assets/trace.schema.json`).
//!
//! Line 1 is a [`TraceHeader`]; every further line is one [`Stamped`] event (`{"t_ns":…,
//! "kind":…, …}`). The recorder flushes after every event (so at least after every Token, Stats
//! and Done): a crash loses at most the line being written, which the tolerant replay reader
//! reports as a truncated last line. I/O errors (disk full, closed pipe) are returned, never
//! panicked on.
//!
//! Where traces go ([`crate::output::Output`]): a device or FIFO (`--record /dev/stdout`) is
//! written directly. A regular or new file gets its header line in a temporary file next to it,
//! which then replaces the path at once; every event after that is appended and flushed under
//! the final name. So crash-safety wins over all-or-nothing atomicity: a crash or signal keeps
//! every event so far, while a recording that cannot even write its header leaves an existing
//! file at the path untouched. The TUI's recordings ([`Recorder::create_unique_in`]) get a new
//! name created with O_EXCL and never replace anything.

use super::event::{EngineConfigInfo, ModelSummary, Stamped};
use super::machine::MachineProfile;
use crate::output::Output;
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};
use time::macros::format_description;

/// Value of the header's `format` field.
pub const TRACE_FORMAT: &str = "cflow-trace";
/// Version written by this build ("MAJOR.MINOR"). Readers accept any minor of their major.
/// 2.0 renamed `vocab_bytes` (header `model`, `stats` events) to `lm_head_bytes`.
pub const TRACE_VERSION: &str = "2.0";
/// Newest major version this build reads; older majors read too (1.x's `vocab_bytes` through
/// serde aliases).
pub const TRACE_MAJOR: u32 = 2;

/// Errors of recording and replaying traces.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("trace I/O error on {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Output(#[from] crate::output::OutputError),
    #[error("cannot serialize trace event: {0}")]
    Serialize(#[from] serde_json::Error),
    #[error("{path}: empty file (no trace header)")]
    Empty { path: String },
    #[error("{path}: not a cflow trace (format {found:?}, expected \"cflow-trace\")")]
    WrongFormat { path: String, found: String },
    #[error(
        "{path}: trace version {found} is newer than this build supports (major {supported}); \
         upgrade cflow-tui to replay it"
    )]
    UnsupportedVersion {
        path: String,
        found: String,
        supported: u32,
    },
    #[error("{path}: line {line}: {message}")]
    Corrupt {
        path: String,
        line: u64,
        message: String,
    },
    #[error("{path}: line {line} is longer than {limit} bytes; refusing to load it")]
    LineTooLong {
        path: String,
        line: u64,
        limit: usize,
    },
}

/// First line of every trace.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TraceHeader {
    /// Always "cflow-trace".
    pub format: String,
    /// "MAJOR.MINOR", currently "2.0".
    pub version: String,
    /// RFC 3339 UTC creation time.
    pub created: String,
    pub model: ModelSummary,
    pub config: EngineConfigInfo,
    #[serde(default)]
    pub machine: Option<MachineProfile>,
}

impl TraceHeader {
    /// A header of the current format/version created now.
    pub fn new(
        model: ModelSummary,
        config: EngineConfigInfo,
        machine: Option<MachineProfile>,
    ) -> Self {
        TraceHeader {
            format: TRACE_FORMAT.into(),
            version: TRACE_VERSION.into(),
            created: rfc3339(SystemTime::now()),
            model,
            config,
            machine,
        }
    }
}

/// Writes a trace, one JSON line per event. See the module docs.
pub struct Recorder<W: Write = File> {
    out: BufWriter<W>,
    path: PathBuf,
    events: u64,
    line: Vec<u8>,
    /// The file this recording replaced, put back if a write fails (disk full).
    backup: Option<crate::output::Backup>,
    /// A write failed and the replaced file was put back.
    restored: bool,
}

impl Recorder<File> {
    /// Records to `path` (see the module docs for devices, FIFOs and existing files).
    pub fn create(path: impl AsRef<Path>, header: TraceHeader) -> Result<Self, TraceError> {
        Self::create_for(path.as_ref(), header, &[])
    }

    /// [`Recorder::create`], refusing a `path` that is the same file as one of `inputs` (the
    /// model being run), before anything is opened for writing.
    pub fn create_for(
        path: &Path,
        header: TraceHeader,
        inputs: &[&Path],
    ) -> Result<Self, TraceError> {
        let out = Output::create(path, inputs)?;
        Self::start(out, header)
    }

    /// Records to a new file in `dir` named after the current UTC time,
    /// `cflow-YYYYMMDDTHHMMSSZ.trace.jsonl` (then `…Z-2`, `…Z-3`, … when taken), created with
    /// O_EXCL: never replaces or truncates an existing file.
    pub fn create_unique_in(dir: &Path, header: TraceHeader) -> Result<Self, TraceError> {
        let stamp = basic_utc(SystemTime::now());
        for n in 1u32..10_000 {
            let name = if n == 1 {
                format!("cflow-{stamp}.trace.jsonl")
            } else {
                format!("cflow-{stamp}-{n}.trace.jsonl")
            };
            match Output::create_new(&dir.join(name)) {
                Ok(out) => return Self::start(out, header),
                Err(e) if e.io_kind() == Some(std::io::ErrorKind::AlreadyExists) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(TraceError::Io {
            path: dir
                .join(format!("cflow-{stamp}-*.trace.jsonl"))
                .display()
                .to_string(),
            source: std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "every counter for this second is taken",
            ),
        })
    }

    /// Writes the header into `out`, commits it (an atomic replace happens now) and goes on
    /// appending to the committed file.
    fn start(mut out: Output, header: TraceHeader) -> Result<Self, TraceError> {
        let path = out.path().to_path_buf();
        let mut line = serde_json::to_vec(&header)?;
        line.push(b'\n');
        out.file_mut()
            .write_all(&line)
            .map_err(|e| io_err(&path, e))?;
        // The old trace (if any) stays reachable until this recording is complete.
        let backup = if out.is_direct() {
            None
        } else {
            crate::output::Backup::of(&path).map_err(|e| io_err(&path, e))?
        };
        let f = out.commit()?;
        Ok(Recorder {
            out: BufWriter::with_capacity(64 << 10, f),
            path,
            events: 0,
            line: Vec::with_capacity(4096),
            backup,
            restored: false,
        })
    }
}

impl<W: Write> Recorder<W> {
    /// Record into any writer; `name` is used in error messages.
    pub fn from_writer(
        w: W,
        name: impl AsRef<Path>,
        header: TraceHeader,
    ) -> Result<Self, TraceError> {
        let mut r = Recorder {
            out: BufWriter::with_capacity(64 << 10, w),
            path: name.as_ref().to_path_buf(),
            events: 0,
            line: Vec::with_capacity(4096),
            backup: None,
            restored: false,
        };
        r.write_line(&header)?;
        r.flush()?;
        Ok(r)
    }

    fn write_line<T: Serialize>(&mut self, v: &T) -> Result<(), TraceError> {
        self.line.clear();
        serde_json::to_writer(&mut self.line, v)?;
        self.line.push(b'\n');
        let path = &self.path;
        self.out.write_all(&self.line).map_err(|e| io_err(path, e))
    }

    /// Append one event and flush it to the OS.
    /// On a write error the file this recording replaced, if any, is put back
    /// ([`Recorder::restored`]).
    pub fn record(&mut self, ev: &Stamped) -> Result<(), TraceError> {
        let r = self.write_line(ev).and_then(|()| {
            self.events += 1;
            self.flush()
        });
        if r.is_err() {
            if let Some(b) = self.backup.take() {
                self.restored = b.restore().is_ok();
            }
        }
        r
    }

    /// A write failed and the file this recording replaced was put back at the path.
    pub fn restored(&self) -> bool {
        self.restored
    }

    /// Flush buffered lines to the OS.
    pub fn flush(&mut self) -> Result<(), TraceError> {
        let path = &self.path;
        self.out.flush().map_err(|e| io_err(path, e))
    }

    /// Number of events recorded (header excluded).
    pub fn events_written(&self) -> u64 {
        self.events
    }

    /// The path (or name) being written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Flush and return the writer.
    pub fn finish(mut self) -> Result<W, TraceError> {
        self.flush()?;
        let path = self.path.clone();
        self.out
            .into_inner()
            .map_err(|e| io_err(&path, e.into_error()))
    }
}

/// Monotonic session clock producing [`Stamped`] events (`t_ns` = ns since `start`).
#[derive(Clone, Copy, Debug)]
pub struct SessionClock {
    start: std::time::Instant,
}

impl SessionClock {
    /// A clock starting now.
    pub fn start() -> Self {
        SessionClock {
            start: std::time::Instant::now(),
        }
    }

    /// Nanoseconds since the session started.
    pub fn now_ns(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    /// Stamp an event with the current time.
    pub fn stamp(&self, event: super::event::Event) -> Stamped {
        Stamped {
            t_ns: self.now_ns(),
            event,
        }
    }
}

/// The recorder tap every event source shares (the engine thread behind the TUI, and the
/// headless `run` / `chat`): stamps each event with the session clock and, while a recording is
/// on, appends it to the trace. A write error (disk full, closed pipe) stops the recording —
/// every complete line so far stays — and is kept for the caller to report once
/// ([`Tap::take_error`]).
pub struct Tap<W: Write = File> {
    clock: SessionClock,
    rec: Option<Recorder<W>>,
    error: Option<String>,
}

impl<W: Write> Tap<W> {
    /// A tap whose session clock starts now, not recording.
    pub fn new() -> Self {
        Tap {
            clock: SessionClock::start(),
            rec: None,
            error: None,
        }
    }

    /// Stamps `event` with the session clock.
    pub fn stamp(&self, event: super::event::Event) -> Stamped {
        self.clock.stamp(event)
    }

    /// Starts recording into `r` (a recording in progress is finished first).
    pub fn start(&mut self, r: Recorder<W>) {
        if let Some(old) = self.rec.replace(r) {
            let _ = old.finish();
        }
    }

    /// A recording is on.
    pub fn recording(&self) -> bool {
        self.rec.is_some()
    }

    /// Stops the recording and returns its recorder (None when none was on).
    pub fn stop(&mut self) -> Option<Recorder<W>> {
        self.rec.take()
    }

    /// Records `st` when recording; a write error stops the recording (see the type's docs).
    pub fn record(&mut self, st: &Stamped) {
        if let Some(r) = self.rec.as_mut() {
            if let Err(err) = r.record(st) {
                self.error = Some(if r.restored() {
                    format!(
                        "recording stopped: {err} (the previous file at {} was put back)",
                        r.path().display()
                    )
                } else {
                    format!("recording stopped: {err} (the trace keeps every line written so far)")
                });
                self.rec = None;
            }
        }
    }

    /// Stamps and records `event`; returns it stamped.
    pub fn emit(&mut self, event: super::event::Event) -> Stamped {
        let st = self.stamp(event);
        self.record(&st);
        st
    }

    /// The write error that stopped the recording, once.
    pub fn take_error(&mut self) -> Option<String> {
        self.error.take()
    }
}

impl<W: Write> Default for Tap<W> {
    fn default() -> Self {
        Self::new()
    }
}

fn io_err(path: &Path, source: std::io::Error) -> TraceError {
    TraceError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Format a time as RFC 3339 UTC with millisecond precision, e.g. `2026-11-29T11:44:04.123Z`.
/// Times before the epoch are clamped to it.
pub fn rfc3339(t: SystemTime) -> String {
    utc(
        t,
        format_description!("[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"),
    )
}

/// A time as ISO 8601 basic UTC to the second, e.g. `20261129T114404Z` (for file names).
pub fn basic_utc(t: SystemTime) -> String {
    utc(
        t,
        format_description!("[year][month][day]T[hour][minute][second]Z"),
    )
}

/// `t` in UTC formatted by `f` (the `time` crate); times before the epoch are clamped to it, and
/// one it cannot format (beyond year 9999) gives the epoch's.
fn utc(t: SystemTime, f: &[time::format_description::BorrowedFormatItem<'_>]) -> String {
    let t = time::OffsetDateTime::from(t.max(UNIX_EPOCH));
    t.format(f)
        .or_else(|_| time::OffsetDateTime::UNIX_EPOCH.format(f))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::{EngineConfigInfo, ModelSummary};
    use std::time::Duration;

    /// Accepts `ok` writes, then fails every write like a full disk.
    struct FullAfter {
        ok: usize,
        got: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    }

    impl Write for FullAfter {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            if self.ok == 0 {
                return Err(std::io::Error::from_raw_os_error(libc::ENOSPC));
            }
            self.ok -= 1;
            self.got.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn the_tap_stops_recording_on_a_write_error_and_reports_it_once() {
        use crate::telemetry::event::Event;
        let got = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let w = FullAfter {
            ok: 2,
            got: got.clone(),
        };
        let mut tap: Tap<FullAfter> = Tap::new();
        let before = tap.emit(Event::Reset);
        assert!(!tap.recording());
        tap.start(Recorder::from_writer(w, "full.jsonl", header()).unwrap());
        assert!(tap.recording());
        let a = tap.emit(Event::Reset);
        assert!(a.t_ns >= before.t_ns);
        assert_eq!(tap.take_error(), None);
        // The next write fails: the recording stops, the error is reported once.
        tap.emit(Event::Reset);
        assert!(!tap.recording());
        let e = tap.take_error().unwrap();
        assert!(
            e.contains("recording stopped") && e.contains("full.jsonl"),
            "{e}"
        );
        assert_eq!(tap.take_error(), None);
        tap.emit(Event::Reset);
        assert_eq!(tap.take_error(), None);
        let text = String::from_utf8(got.lock().unwrap().clone()).unwrap();
        assert_eq!(text.lines().count(), 2, "{text}");
        assert!(
            text.lines().nth(1).unwrap().contains("\"kind\":\"reset\""),
            "{text}"
        );
    }

    #[test]
    fn clock_is_monotonic() {
        let c = SessionClock::start();
        let a = c.stamp(crate::telemetry::event::Event::Reset);
        let b = c.stamp(crate::telemetry::event::Event::Reset);
        assert!(b.t_ns >= a.t_ns);
    }

    fn header() -> TraceHeader {
        TraceHeader::new(
            ModelSummary::default(),
            EngineConfigInfo {
                threads: 1,
                isa: "scalar".into(),
                prefetch: false,
                weights: "mmap".into(),
                repacked: false,
                readers: 1,
                fetch: crate::toggles::FetchMode::Staged,
                expert_tier: crate::toggles::ExpertTier::Mmap,
                layout: crate::toggles::Layout::Cflow,
                layouts_available: vec![crate::toggles::Layout::Cflow],
                notes: vec![],
            },
            None,
        )
    }

    #[test]
    fn unique_recordings_in_one_second_get_distinct_names_and_never_truncate() {
        let d = tempfile::tempdir().unwrap();
        let a = Recorder::create_unique_in(d.path(), header()).unwrap();
        let pa = a.path().to_path_buf();
        drop(a);
        let before = std::fs::read(&pa).unwrap();
        let mut paths = vec![pa.clone()];
        for _ in 0..3 {
            let r = Recorder::create_unique_in(d.path(), header()).unwrap();
            paths.push(r.path().to_path_buf());
        }
        let mut uniq = paths.clone();
        uniq.sort();
        uniq.dedup();
        assert_eq!(uniq.len(), paths.len(), "{paths:?}");
        assert_eq!(std::fs::read(&pa).unwrap(), before);
        let name = pa.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            name.starts_with("cflow-2") && name.ends_with("Z.trace.jsonl"),
            "{name}"
        );
    }

    #[test]
    fn basic_utc_known_date() {
        assert_eq!(
            basic_utc(UNIX_EPOCH + Duration::from_secs(1_234_567_890)),
            "20090213T233130Z"
        );
    }

    #[test]
    fn rfc3339_known_dates() {
        let at = |s: u64, ms: u64| rfc3339(UNIX_EPOCH + Duration::from_millis(s * 1000 + ms));
        assert_eq!(at(0, 0), "1970-01-01T00:00:00.000Z");
        assert_eq!(at(951_782_400, 5), "2000-02-29T00:00:00.005Z");
        assert_eq!(at(1_709_164_800, 0), "2024-02-29T00:00:00.000Z");
        assert_eq!(at(4_102_444_799, 999), "2099-12-31T23:59:59.999Z");
        assert_eq!(at(1_234_567_890, 0), "2009-02-13T23:31:30.000Z");
    }
}
