//! Safe output targets: every file the program writes (`gen`, `import`, `convert`, `export`,
//! `--record`, `--dump-logits`, the TUI's `r`, `pull`, cache entries) is opened through
//! [`Output`], which decides *how* to write from what the path is:
//!
//! | the path is | what happens |
//! |---|---|
//! | missing, or a regular file | a temporary file in the same directory (`tempfile`: O_EXCL, unpredictable name, removed on drop), renamed over the path by [`Output::commit`]: the old content stays intact until the new one is complete |
//! | a character device or FIFO (`/dev/null`, `/dev/stdout` on a terminal or pipe) | written directly, opened without truncating; the node stays what it is |
//! | a symbolic link to a regular file | the link's *target* is replaced atomically (temporary file next to the target); the link itself is kept |
//! | a symbolic link to a device or FIFO | written directly, like the device |
//! | `/dev/stdout`, `/dev/stderr`, `/dev/fd/N`, `/proc/self/fd/N` | written directly, appending, whatever the descriptor points to (so `--record /dev/stdout > t.jsonl` appends to the shell's file instead of renaming over it) |
//! | a dangling symbolic link, a directory, a socket or block device | a clear error naming the path; nothing is created |
//!
//! Before anything is opened for writing, the target is compared by (device, inode) with every
//! input of the command ([`OutputError::SameAsInput`]): symlinks, hard links and other spellings
//! (`./m.cflow`) of an input are refused. An input that is a directory (a HuggingFace model)
//! counts with every entry in it.
//!
//! Temporary files never outlive the process: they are removed on drop (every error path, early
//! return or panic), and on every catchable terminating signal ([`TERMINATING_SIGNALS`]: SIGINT,
//! SIGTERM, SIGHUP, SIGQUIT, SIGUSR1/2, SIGALRM, SIGXFSZ when `ulimit -f` is exceeded, …) a
//! watcher thread removes the live ones before the process dies with the default action (exit
//! status "killed by signal" as before).
//! Signals whose disposition is not the default (ignored under `nohup`, or `run`/`chat`'s own
//! SIGINT handler) are left alone. Only SIGKILL (or a crash) can leave one behind, named
//! `.NAME.XXXXXX.tmp` (NAME cut short when the whole would exceed 255 bytes).
//!
//! Every error names its path ([`OutputError`]); bytes written through `impl Write for Output`
//! fail with an `io::Error` of the same kind whose message names the output path.

use std::fs::{File, Metadata, OpenOptions, Permissions};
use std::io::{self, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, Once};
use tempfile::NamedTempFile;

/// Why an output cannot be opened or written. Every variant names the path.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    // `err` is printed here and deliberately not a `#[source]`: `{:#}` chains would repeat it.
    #[error("{}: cannot {what}: {err}", path.display())]
    Io {
        path: PathBuf,
        what: &'static str,
        err: io::Error,
    },
    #[error("{}: is a directory; give a file name", path.display())]
    IsDirectory { path: PathBuf },
    #[error(
        "{}: is a symbolic link to {}, which does not exist; refusing to write through a \
         dangling link (remove it or give another path)",
        path.display(),
        target.display()
    )]
    DanglingSymlink { path: PathBuf, target: PathBuf },
    #[error(
        "{}: is a {kind}; only a regular file, a character device or a FIFO can be an output",
        path.display()
    )]
    Unsupported { path: PathBuf, kind: &'static str },
    #[error(
        "{}: is the same file as the input {}; refusing to overwrite an input (choose another \
         output path)",
        path.display(),
        input.display()
    )]
    SameAsInput { path: PathBuf, input: PathBuf },
}

impl OutputError {
    fn io(path: &Path, what: &'static str, err: io::Error) -> OutputError {
        OutputError::Io {
            path: path.to_path_buf(),
            what,
            err,
        }
    }

    /// The underlying I/O error kind, if any (e.g. `AlreadyExists` from [`Output::create_new`]).
    pub fn io_kind(&self) -> Option<io::ErrorKind> {
        match self {
            OutputError::Io { err, .. } => Some(err.kind()),
            _ => None,
        }
    }
}

/// An open output; see the module docs. Write to it (or to [`Output::file_mut`]), then call
/// [`Output::commit`]. Dropping it uncommitted removes the temporary file (the previous content
/// of the path, if any, is untouched).
pub struct Output {
    path: PathBuf,
    sink: Sink,
}

enum Sink {
    /// Atomic replace of `target` (the path, or a symlink's resolved target).
    Replace {
        tmp: Option<NamedTempFile>,
        target: PathBuf,
    },
    /// A device, FIFO or descriptor alias, written in place (or a file created with O_EXCL).
    Direct(File),
    /// A direct target that cannot seek, for a writer that needs to: the bytes go to an unnamed
    /// temporary file and are copied into `dev` by `commit`.
    Spooled { spool: File, dev: File },
}

/// How the path is to be written (the classification of the module docs).
enum Plan {
    Replace {
        target: PathBuf,
        existing: Option<Metadata>,
    },
    Direct {
        meta: Metadata,
        append: bool,
    },
}

impl Output {
    /// Opens `path` for a streaming writer, after refusing it if it is one of `inputs`.
    pub fn create(path: &Path, inputs: &[&Path]) -> Result<Output, OutputError> {
        Self::open(path, inputs, false)
    }

    /// Like [`Output::create`] for a writer that seeks: a non-seekable device or FIFO is
    /// spooled through an unnamed temporary file (in `$TMPDIR`) and copied at `commit`.
    pub fn create_seekable(path: &Path, inputs: &[&Path]) -> Result<Output, OutputError> {
        Self::open(path, inputs, true)
    }

    /// Creates `path` with O_EXCL (never replacing anything) and writes it in place. Fails with
    /// an `AlreadyExists` [`OutputError::io_kind`] when the name is taken.
    pub fn create_new(path: &Path) -> Result<Output, OutputError> {
        let f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(|e| OutputError::io(path, "create", e))?;
        Ok(Output {
            path: path.to_path_buf(),
            sink: Sink::Direct(f),
        })
    }

    fn open(path: &Path, inputs: &[&Path], seekable: bool) -> Result<Output, OutputError> {
        let plan = classify(path)?;
        let target_meta = match &plan {
            Plan::Replace { existing, .. } => existing.as_ref(),
            Plan::Direct { meta, .. } => Some(meta),
        };
        if let Some(m) = target_meta {
            refuse_inputs(path, m, inputs)?;
        }
        let sink = match plan {
            Plan::Replace { target, existing } => {
                let tmp = temp_next_to(&target, existing.as_ref())
                    .map_err(|e| OutputError::io(path, "create a temporary file next to it", e))?;
                Sink::Replace {
                    tmp: Some(tmp),
                    target,
                }
            }
            Plan::Direct { append, .. } => {
                let f = OpenOptions::new()
                    .write(true)
                    .append(append)
                    .custom_flags(libc::O_NOCTTY)
                    .open(path)
                    .map_err(|e| OutputError::io(path, "open for writing", e))?;
                let mut f = f;
                if seekable && f.stream_position().is_err() {
                    let spool = tempfile::tempfile()
                        .map_err(|e| OutputError::io(path, "create a spool file in $TMPDIR", e))?;
                    Sink::Spooled { spool, dev: f }
                } else {
                    Sink::Direct(f)
                }
            }
        };
        Ok(Output {
            path: path.to_path_buf(),
            sink,
        })
    }

    /// The path as the user gave it (what error messages name).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the bytes go straight to the path (device, FIFO, descriptor alias, O_EXCL file)
    /// rather than through a temporary file renamed at `commit`.
    pub fn is_direct(&self) -> bool {
        !matches!(self.sink, Sink::Replace { .. })
    }

    /// The file being written (the temporary file, the device or the spool). Its raw I/O
    /// errors do not name the path; see [`Output::error`].
    pub fn file_mut(&mut self) -> &mut File {
        match &mut self.sink {
            Sink::Replace { tmp, .. } => tmp
                .as_mut()
                .expect("output used after commit")
                .as_file_mut(),
            Sink::Direct(f) => f,
            Sink::Spooled { spool, .. } => spool,
        }
    }

    /// An error about this output (for callers writing through [`Output::file_mut`]).
    pub fn error(&self, what: &'static str, source: io::Error) -> OutputError {
        OutputError::io(&self.path, what, source)
    }

    /// Writes `bytes` to `path` as one output ([`Output::create`], then [`Output::commit`]): a
    /// reader never sees a half-written file.
    pub fn write_all_at(path: &Path, bytes: &[u8]) -> Result<(), OutputError> {
        let mut o = Output::create(path, &[])?;
        io::Write::write_all(&mut o, bytes).map_err(|e| o.error("write", e))?;
        o.commit()?;
        Ok(())
    }

    /// Finishes the output: a temporary file is synced and renamed over its target; a spool is
    /// copied into its device. Returns the file, still open at its end (a recorder goes on
    /// appending to it under the final name).
    pub fn commit(mut self) -> Result<File, OutputError> {
        let path = self.path.clone();
        match &mut self.sink {
            Sink::Replace { tmp, target } => {
                let t = tmp.take().expect("commit once");
                let tmp_path = t.path().to_path_buf();
                let res = match t.as_file().sync_all() {
                    Err(e) => Err(OutputError::io(&path, "write (sync)", e)),
                    Ok(()) => t.persist(&*target).map_err(|e| {
                        // `e.file` drops here: the temporary file is removed.
                        OutputError::io(
                            &path,
                            "rename the finished temporary file over it",
                            e.error,
                        )
                    }),
                };
                unregister(&tmp_path);
                res
            }
            Sink::Direct(f) => f
                .try_clone()
                .map_err(|e| OutputError::io(&path, "finish", e)),
            Sink::Spooled { spool, dev } => {
                spool
                    .seek(SeekFrom::Start(0))
                    .map_err(|e| OutputError::io(&path, "read back the spool file", e))?;
                io::copy(spool, dev).map_err(|e| OutputError::io(&path, "write", e))?;
                dev.try_clone()
                    .map_err(|e| OutputError::io(&path, "finish", e))
            }
        }
    }
}

impl Drop for Output {
    fn drop(&mut self) {
        if let Sink::Replace { tmp, .. } = &mut self.sink {
            if let Some(t) = tmp.take() {
                let p = t.path().to_path_buf();
                let _ = t.close();
                unregister(&p);
            }
        }
    }
}

impl Write for Output {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let r = self.file_mut().write(buf);
        r.map_err(|e| self.wrap(e))
    }
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        let r = self.file_mut().write_all(buf);
        r.map_err(|e| self.wrap(e))
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Output {
    /// An `io::Error` of the same kind whose message names the path.
    fn wrap(&self, e: io::Error) -> io::Error {
        io::Error::new(e.kind(), OutputError::io(&self.path, "write", e))
    }
}

/// Whether `path` names a file descriptor of this process rather than a file.
fn is_fd_alias(path: &Path) -> bool {
    let s = path.as_os_str().as_encoded_bytes();
    s == b"/dev/stdout"
        || s == b"/dev/stderr"
        || s.starts_with(b"/dev/fd/")
        || s.starts_with(b"/proc/self/fd/")
        || s.starts_with(b"/proc/thread-self/fd/")
}

fn kind_name(m: &Metadata) -> &'static str {
    let t = m.file_type();
    if t.is_block_device() {
        "block device"
    } else if t.is_socket() {
        "socket"
    } else {
        "special file"
    }
}

fn classify(path: &Path) -> Result<Plan, OutputError> {
    if is_fd_alias(path) {
        let m = std::fs::metadata(path).map_err(|e| OutputError::io(path, "inspect", e))?;
        let t = m.file_type();
        return if t.is_file() || t.is_char_device() || t.is_fifo() {
            Ok(Plan::Direct {
                append: t.is_file(),
                meta: m,
            })
        } else if t.is_dir() {
            Err(OutputError::IsDirectory { path: path.into() })
        } else {
            Err(OutputError::Unsupported {
                path: path.into(),
                kind: kind_name(&m),
            })
        };
    }
    let lm = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Ok(Plan::Replace {
                target: path.to_path_buf(),
                existing: None,
            })
        }
        Err(e) => return Err(OutputError::io(path, "inspect", e)),
    };
    let (target, m) = if lm.file_type().is_symlink() {
        match std::fs::metadata(path) {
            Ok(m) => {
                let t = std::fs::canonicalize(path)
                    .map_err(|e| OutputError::io(path, "resolve the symbolic link", e))?;
                (t, m)
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(OutputError::DanglingSymlink {
                    path: path.into(),
                    target: std::fs::read_link(path).unwrap_or_default(),
                })
            }
            Err(e) => return Err(OutputError::io(path, "follow the symbolic link", e)),
        }
    } else {
        (path.to_path_buf(), lm)
    };
    let t = m.file_type();
    if t.is_file() {
        Ok(Plan::Replace {
            target,
            existing: Some(m),
        })
    } else if t.is_char_device() || t.is_fifo() {
        Ok(Plan::Direct {
            meta: m,
            append: false,
        })
    } else if t.is_dir() {
        Err(OutputError::IsDirectory { path: path.into() })
    } else {
        Err(OutputError::Unsupported {
            path: path.into(),
            kind: kind_name(&m),
        })
    }
}

fn same_file(a: &Metadata, b: &Metadata) -> bool {
    a.dev() == b.dev() && a.ino() == b.ino()
}

/// Refuses `path` (whose target has metadata `out`) when it is one of `inputs` (or, for an
/// input directory, one of its entries). Inputs that cannot be inspected are skipped: they
/// cannot be the output's inode.
fn refuse_inputs(path: &Path, out: &Metadata, inputs: &[&Path]) -> Result<(), OutputError> {
    for &input in inputs {
        let Ok(im) = std::fs::metadata(input) else {
            continue;
        };
        if same_file(&im, out) {
            return Err(OutputError::SameAsInput {
                path: path.into(),
                input: input.into(),
            });
        }
        if im.is_dir() {
            for entry in std::fs::read_dir(input).into_iter().flatten().flatten() {
                let p = entry.path();
                if std::fs::metadata(&p).is_ok_and(|m| same_file(&m, out)) {
                    return Err(OutputError::SameAsInput {
                        path: path.into(),
                        input: p,
                    });
                }
            }
        }
    }
    Ok(())
}

/// A temporary file in `target`'s directory named `.NAME.XXXXXX.tmp`, with `existing`'s mode
/// (and owner, when permitted) or the default 0666 & ~umask for a new file; registered for
/// removal on a fatal signal.
fn temp_next_to(target: &Path, existing: Option<&Metadata>) -> io::Result<NamedTempFile> {
    install_signal_cleanup();
    let dir = match target.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "output".into());
    let prefix = format!(".{}.", temp_stem(&name));
    let mut b = tempfile::Builder::new();
    b.prefix(&prefix).suffix(".tmp");
    if existing.is_none() {
        b.permissions(Permissions::from_mode(0o666));
    }
    // Register under the lock so a signal between creation and registration cannot miss it.
    let mut live = lock_live();
    let t = b.tempfile_in(dir)?;
    live.push(t.path().to_path_buf());
    drop(live);
    if let Some(m) = existing {
        let f = t.as_file();
        f.set_permissions(Permissions::from_mode(m.mode() & 0o7777))?;
        if m.uid() != f.metadata()?.uid() || m.gid() != f.metadata()?.gid() {
            // Best effort (needs privileges): keep the replaced file's owner.
            let _ = std::os::unix::fs::fchown(f, Some(m.uid()), Some(m.gid()));
        }
    }
    Ok(t)
}

/// A hard link to a file about to be replaced, `.NAME.XXXXXX.old` next to it: an output
/// that is committed first and written on (a trace recording) can put the old content back
/// with [`Backup::restore`] when a later write fails. Costs no space (a second name for the
/// same inode). Removed on drop and, like the temporary files, on a terminating signal.
pub struct Backup {
    link: PathBuf,
    target: PathBuf,
}

impl Backup {
    /// A backup of `path` when it is (a symlink to) a regular file; `None` when it does not
    /// exist or is something else.
    pub fn of(path: &Path) -> io::Result<Option<Backup>> {
        let target = match std::fs::canonicalize(path) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        if !std::fs::metadata(&target)?.is_file() {
            return Ok(None);
        }
        install_signal_cleanup();
        let dir = target.parent().unwrap_or(Path::new("/"));
        let name = target
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        for _ in 0..100 {
            let link = dir.join(format!(
                ".{}.{}.old",
                temp_stem(&name),
                std::iter::repeat_with(fastrand::alphanumeric)
                    .take(6)
                    .collect::<String>()
            ));
            let mut live = lock_live();
            match std::fs::hard_link(&target, &link) {
                Ok(()) => {
                    live.push(link.clone());
                    return Ok(Some(Backup { link, target }));
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
        Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            "no free backup name",
        ))
    }

    /// Puts the old content back at the path (an atomic rename; needs no space).
    pub fn restore(self) -> io::Result<()> {
        let r = std::fs::rename(&self.link, &self.target);
        unregister(&self.link);
        std::mem::forget(self);
        r
    }
}

impl Drop for Backup {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.link);
        unregister(&self.link);
    }
}

/// The longest file name (`NAME_MAX` on Linux file systems).
const NAME_MAX: usize = 255;

/// `name`, cut (at a character boundary) so that `.NAME.XXXXXX.tmp` fits in [`NAME_MAX`]
/// bytes: an output name of 244–255 bytes is valid, its temporary name must be too.
fn temp_stem(name: &str) -> &str {
    const EXTRA: usize = ".".len() + ".".len() + 6 + ".tmp".len();
    let max = NAME_MAX - EXTRA;
    if name.len() <= max {
        return name;
    }
    let mut end = max;
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    &name[..end]
}

/// Signals whose default action terminates the process and that can be caught: the watcher
/// removes the live temporary files on each (SIGKILL cannot be caught; SIGSEGV, SIGILL, SIGFPE
/// and SIGABRT are faults of this process, SIGBUS is `format::sigbus`'s; SIGPIPE is ignored by
/// the Rust runtime).
pub const TERMINATING_SIGNALS: [libc::c_int; 13] = [
    libc::SIGHUP,
    libc::SIGINT,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGALRM,
    libc::SIGTERM,
    libc::SIGXCPU,
    libc::SIGXFSZ,
    libc::SIGVTALRM,
    libc::SIGPROF,
    libc::SIGIO,
    libc::SIGPWR,
];

/// Temporary files alive right now (removed by the signal watcher).
static LIVE: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

fn lock_live() -> std::sync::MutexGuard<'static, Vec<PathBuf>> {
    LIVE.lock().unwrap_or_else(|e| e.into_inner())
}

fn unregister(p: &Path) {
    lock_live().retain(|q| q != p);
}

/// Starts (once) the thread that removes live temporary files on any of the
/// [`TERMINATING_SIGNALS`] and then lets the signal take its default action. See the module docs.
fn install_signal_cleanup() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let sigs: Vec<i32> = TERMINATING_SIGNALS
            .into_iter()
            .filter(|&s| crate::io::signal::has_default_action(s))
            .collect();
        let Ok(mut signals) = signal_hook::iterator::Signals::new(&sigs) else {
            return;
        };
        let _ = std::thread::Builder::new()
            .name("cflow-output-cleanup".into())
            .spawn(move || {
                for sig in signals.forever() {
                    // A REPL or `run` that handles Ctrl-C itself (`io::signal::on_sigint`)
                    // stops its work and exits on its own: SIGINT does not end it here.
                    if sig == libc::SIGINT && crate::io::signal::sigint_taken() {
                        continue;
                    }
                    // Keep the lock until the process is gone: no new temporary file appears.
                    let live = lock_live();
                    for p in live.iter() {
                        let _ = std::fs::remove_file(p);
                    }
                    let _ = signal_hook::low_level::emulate_default_handler(sig);
                    drop(live);
                    break;
                }
            });
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn new_file_appears_only_at_commit() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("out.bin");
        let mut o = Output::create(&p, &[]).unwrap();
        o.write_all(b"hello").unwrap();
        assert!(!p.exists());
        assert_eq!(names(d.path()).len(), 1);
        o.commit().unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"hello");
        assert_eq!(names(d.path()), vec!["out.bin"]);
    }

    #[test]
    fn dropped_output_leaves_the_old_file_and_no_temp() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("out.bin");
        std::fs::write(&p, b"old").unwrap();
        let mut o = Output::create(&p, &[]).unwrap();
        o.write_all(b"new and longer").unwrap();
        drop(o);
        assert_eq!(std::fs::read(&p).unwrap(), b"old");
        assert_eq!(names(d.path()), vec!["out.bin"]);
        assert!(!lock_live().iter().any(|q| q.starts_with(d.path())));
    }

    #[test]
    fn replacing_keeps_the_mode() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("out.bin");
        std::fs::write(&p, b"old").unwrap();
        std::fs::set_permissions(&p, Permissions::from_mode(0o640)).unwrap();
        let mut o = Output::create(&p, &[]).unwrap();
        o.write_all(b"new").unwrap();
        o.commit().unwrap();
        let m = std::fs::metadata(&p).unwrap();
        assert_eq!(m.mode() & 0o7777, 0o640);
    }

    #[test]
    fn symlink_to_a_file_replaces_the_target_and_keeps_the_link() {
        let d = tempfile::tempdir().unwrap();
        let real = d.path().join("real.bin");
        let link = d.path().join("link.bin");
        std::fs::write(&real, b"old").unwrap();
        std::os::unix::fs::symlink("real.bin", &link).unwrap();
        let mut o = Output::create(&link, &[]).unwrap();
        o.write_all(b"new").unwrap();
        o.commit().unwrap();
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(std::fs::read(&real).unwrap(), b"new");
    }

    #[test]
    fn dangling_symlink_directory_and_socket_are_errors() {
        let d = tempfile::tempdir().unwrap();
        let link = d.path().join("dangling");
        std::os::unix::fs::symlink(d.path().join("victim"), &link).unwrap();
        let e = Output::create(&link, &[]).err().unwrap();
        assert!(matches!(e, OutputError::DanglingSymlink { .. }), "{e}");
        assert!(e.to_string().contains("dangling"), "{e}");
        assert!(!d.path().join("victim").exists());
        let e = Output::create(d.path(), &[]).err().unwrap();
        assert!(matches!(e, OutputError::IsDirectory { .. }), "{e}");
        let sock = d.path().join("s.sock");
        let _l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let e = Output::create(&sock, &[]).err().unwrap();
        assert!(e.to_string().contains("socket"), "{e}");
    }

    #[test]
    fn same_inode_as_an_input_is_refused_in_every_spelling() {
        let d = tempfile::tempdir().unwrap();
        let input = d.path().join("m.cflow");
        std::fs::write(&input, b"model").unwrap();
        let hard = d.path().join("hard.cflow");
        std::fs::hard_link(&input, &hard).unwrap();
        let sym = d.path().join("sym.cflow");
        std::os::unix::fs::symlink(&input, &sym).unwrap();
        let dotted = d.path().join(".").join("m.cflow");
        for out in [&input, &hard, &sym, &dotted] {
            let e = Output::create(out, &[&input]).err().unwrap();
            assert!(matches!(e, OutputError::SameAsInput { .. }), "{e}");
        }
        // An input directory covers its entries.
        let e = Output::create(&hard, &[d.path()]).err().unwrap();
        assert!(matches!(e, OutputError::SameAsInput { .. }), "{e}");
        assert_eq!(std::fs::read(&input).unwrap(), b"model");
        assert_eq!(names(d.path()), vec!["hard.cflow", "m.cflow", "sym.cflow"]);
    }

    #[test]
    fn dev_null_stays_a_device_and_spools_for_seeking_writers() {
        let mut o = Output::create(Path::new("/dev/null"), &[]).unwrap();
        assert!(o.is_direct());
        o.write_all(b"x").unwrap();
        o.commit().unwrap();
        let mut o = Output::create_seekable(Path::new("/dev/null"), &[]).unwrap();
        o.file_mut().write_all(b"abc").unwrap();
        o.file_mut().seek(SeekFrom::Start(0)).unwrap();
        o.commit().unwrap();
        let m = std::fs::metadata("/dev/null").unwrap();
        assert!(m.file_type().is_char_device());
    }

    #[test]
    fn names_up_to_name_max_get_a_temporary_name_that_fits() {
        let d = tempfile::tempdir().unwrap();
        for name in [
            "a".repeat(243),
            "b".repeat(244),
            "c".repeat(255),
            "é".repeat(127) + "x",
        ] {
            assert!(name.len() <= NAME_MAX);
            let p = d.path().join(&name);
            std::fs::write(&p, b"old").unwrap();
            let mut o = Output::create(&p, &[]).unwrap();
            o.write_all(b"new").unwrap();
            o.commit().unwrap();
            assert_eq!(std::fs::read(&p).unwrap(), b"new");
            std::fs::remove_file(&p).unwrap();
        }
        assert_eq!(names(d.path()), Vec::<String>::new());
        assert_eq!(temp_stem("short"), "short");
        assert_eq!(temp_stem(&"é".repeat(127)).len(), 242);
    }

    #[test]
    fn create_new_never_replaces() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("a");
        std::fs::write(&p, b"keep").unwrap();
        let e = Output::create_new(&p).err().unwrap();
        assert_eq!(e.io_kind(), Some(io::ErrorKind::AlreadyExists));
        assert_eq!(std::fs::read(&p).unwrap(), b"keep");
    }

    #[test]
    fn write_errors_name_the_path() {
        if !Path::new("/dev/full").exists() {
            return;
        }
        let mut o = Output::create(Path::new("/dev/full"), &[]).unwrap();
        let e = o.write_all(&[0u8; 10]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::StorageFull);
        assert!(e.to_string().contains("/dev/full"), "{e}");
    }
}
