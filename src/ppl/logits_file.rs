//! The reference-logits file of `perplexity --save-logits` / `--kl-divergence` (docs/FORMAT.md,
//! "Reference logits"): the token ids of a teacher-forced evaluation and, for every predicted
//! position, the full log-softmax distribution quantized to 16 bits (llama.cpp's
//! `--kl-divergence-base` idea), so a 49k vocabulary costs ~96 KiB a position.
//!
//! Layout (little endian):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | magic `CFLOGIT1` |
//! | 8 | 4 | `version` = 1 |
//! | 12 | 4 | `n_vocab` |
//! | 16 | 4 | `n_ctx`: chunk length; chunk *c* is tokens `c·n_ctx ..` |
//! | 20 | 4 | `n_tokens` |
//! | 24 | 4 | `n_positions` = Σ over chunks of (chunk length − 1) |
//! | 28 | 4 | `label_len` (≤ 1024) |
//! | 32 | `label_len` | `label`: UTF-8, what produced the file |
//! | … | 4·`n_tokens` | token ids (u32, each < `n_vocab`) |
//! | … | `n_positions` × (12 + 2·`n_vocab`) | rows |
//!
//! A row predicts the token after a position: f32 `lo`, f32 `scale`, f32 `target_lp` (the exact
//! log-probability of the next token), then `n_vocab` u16 `q`; the log-probability of token *j*
//! is `lo + scale·q[j]`, renormalized on reading. `lo` is the smallest log-probability but at
//! most [`RANGE`] below the largest (smaller ones are stored as `lo`; their mass is below
//! `n_vocab·e^-32`), so the rounding error is at most `RANGE/65535/2` ≈ 2.4e-4 nat.
//!
//! The file is untrusted: [`LogitsReader::open`] checks the magic, version, every count, the
//! token ids and the exact file length before any row is read, and each row's floats as it is
//! read; every error is a [`LogitsFileError`] naming the file and the field.

use crate::output::Output;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

pub const MAGIC: [u8; 8] = *b"CFLOGIT1";
pub const VERSION: u32 = 1;
/// Dynamic range of a row, in nats below the most likely token.
pub const RANGE: f64 = 32.0;
/// Bounds on the header counts.
pub const MAX_VOCAB: u32 = 1 << 22;
pub const MAX_TOKENS: u32 = 1 << 26;
pub const MAX_LABEL: u32 = 1024;
const HEADER: u64 = 32;

/// Why a reference-logits file cannot be read or written. Every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum LogitsFileError {
    #[error("{}: cannot {what}: {err}", path.display())]
    Io {
        path: PathBuf,
        what: &'static str,
        err: std::io::Error,
    },
    #[error("{}: not a reference-logits file (magic {found:?}, expected \"CFLOGIT1\"; write one with `perplexity --save-logits`)", path.display())]
    Magic { path: PathBuf, found: String },
    #[error("{}: version {found} (this build reads version {VERSION})", path.display())]
    Version { path: PathBuf, found: u32 },
    #[error("{}: header field {field} = {value}: {why}", path.display())]
    Field {
        path: PathBuf,
        field: &'static str,
        value: u64,
        why: String,
    },
    #[error("{}: label is not UTF-8", path.display())]
    Label { path: PathBuf },
    #[error("{}: token {index} is {id}, out of range (n_vocab {n_vocab})", path.display())]
    Token {
        path: PathBuf,
        index: usize,
        id: u32,
        n_vocab: u32,
    },
    #[error("{}: file is {found} bytes; the header says {expected} (truncated or trailing data)", path.display())]
    Size {
        path: PathBuf,
        expected: u64,
        found: u64,
    },
    #[error("{}: row {row}: {field} = {value} is invalid", path.display())]
    Row {
        path: PathBuf,
        row: usize,
        field: &'static str,
        value: f32,
    },
    #[error("{}: all {rows} rows were read", path.display())]
    Exhausted { path: PathBuf, rows: usize },
    #[error("{}: {what}: the file has {file}, expected {expected}", path.display())]
    Mismatch {
        path: PathBuf,
        what: &'static str,
        file: u64,
        expected: u64,
    },
    #[error("{}: {written} rows written, the header announced {expected}", path.display())]
    Incomplete {
        path: PathBuf,
        written: usize,
        expected: usize,
    },
    #[error(transparent)]
    Output(#[from] crate::output::OutputError),
}

/// Number of predicted positions of `n_tokens` tokens evaluated in chunks of `n_ctx`.
pub fn positions(n_tokens: usize, n_ctx: usize) -> usize {
    if n_ctx == 0 {
        return 0;
    }
    let full = n_tokens / n_ctx;
    let rem = n_tokens % n_ctx;
    full * (n_ctx - 1) + rem.saturating_sub(1)
}

/// Bytes of one row.
pub fn row_bytes(n_vocab: usize) -> usize {
    12 + 2 * n_vocab
}

/// Quantizes one row: the log-softmax `lp` (f64, as [`super::kld::log_softmax`] gives) and the
/// next token's log-probability, into `out` ([`row_bytes`] long).
pub fn encode_row(lp: &[f64], target: usize, out: &mut [u8]) {
    let max = lp.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let min = lp.iter().copied().fold(f64::INFINITY, f64::min);
    let lo = min.max(max - RANGE);
    let scale = (max - lo) / 65535.0;
    let (lo32, scale32) = (lo as f32, scale as f32);
    out[0..4].copy_from_slice(&lo32.to_le_bytes());
    out[4..8].copy_from_slice(&scale32.to_le_bytes());
    out[8..12].copy_from_slice(&(lp[target] as f32).to_le_bytes());
    for (j, &v) in lp.iter().enumerate() {
        let q = if scale32 > 0.0 {
            ((v.max(lo) - lo32 as f64) / scale32 as f64)
                .round()
                .clamp(0.0, 65535.0) as u16
        } else {
            0
        };
        out[12 + 2 * j..14 + 2 * j].copy_from_slice(&q.to_le_bytes());
    }
}

/// The header of a reference-logits file.
#[derive(Debug, Clone, PartialEq)]
pub struct LogitsHeader {
    pub n_vocab: usize,
    pub n_ctx: usize,
    pub label: String,
    pub tokens: Vec<u32>,
}

impl LogitsHeader {
    pub fn n_positions(&self) -> usize {
        positions(self.tokens.len(), self.n_ctx)
    }

    /// Total file size this header implies.
    pub fn file_len(&self) -> u64 {
        HEADER
            + self.label.len() as u64
            + 4 * self.tokens.len() as u64
            + self.n_positions() as u64 * row_bytes(self.n_vocab) as u64
    }
}

/// Writes a reference-logits file atomically ([`Output`]: a temporary file renamed over the
/// path by [`LogitsWriter::finish`]; nothing appears on error).
pub struct LogitsWriter {
    path: PathBuf,
    w: BufWriter<Output>,
    n_vocab: usize,
    expected: usize,
    written: usize,
    row: Vec<u8>,
}

impl LogitsWriter {
    /// Creates `path` (refused when it is one of `inputs`) and writes the header.
    pub fn create(
        path: &Path,
        inputs: &[&Path],
        h: &LogitsHeader,
    ) -> Result<LogitsWriter, LogitsFileError> {
        let out = Output::create(path, inputs)?;
        let mut w = BufWriter::with_capacity(1 << 20, out);
        let label = h.label.as_bytes();
        let label = &label[..label.len().min(MAX_LABEL as usize)];
        let mut head = Vec::with_capacity(HEADER as usize + label.len() + 4 * h.tokens.len());
        head.extend_from_slice(&MAGIC);
        for v in [
            VERSION,
            h.n_vocab as u32,
            h.n_ctx as u32,
            h.tokens.len() as u32,
            h.n_positions() as u32,
            label.len() as u32,
        ] {
            head.extend_from_slice(&v.to_le_bytes());
        }
        head.extend_from_slice(label);
        for t in &h.tokens {
            head.extend_from_slice(&t.to_le_bytes());
        }
        let io = |err| LogitsFileError::Io {
            path: path.to_path_buf(),
            what: "write",
            err,
        };
        w.write_all(&head).map_err(io)?;
        Ok(LogitsWriter {
            path: path.to_path_buf(),
            w,
            n_vocab: h.n_vocab,
            expected: h.n_positions(),
            written: 0,
            row: vec![0; row_bytes(h.n_vocab)],
        })
    }

    /// Appends the row of one predicted position.
    pub fn push(&mut self, lp: &[f64], target: usize) -> Result<(), LogitsFileError> {
        assert_eq!(lp.len(), self.n_vocab, "row width");
        encode_row(lp, target, &mut self.row);
        self.w
            .write_all(&self.row)
            .map_err(|err| LogitsFileError::Io {
                path: self.path.clone(),
                what: "write",
                err,
            })?;
        self.written += 1;
        Ok(())
    }

    /// Checks the row count and renames the file into place.
    pub fn finish(self) -> Result<(), LogitsFileError> {
        if self.written != self.expected {
            return Err(LogitsFileError::Incomplete {
                path: self.path,
                written: self.written,
                expected: self.expected,
            });
        }
        let path = self.path;
        let out = self.w.into_inner().map_err(|e| LogitsFileError::Io {
            path: path.clone(),
            what: "write",
            err: e.into_error(),
        })?;
        out.commit()?;
        Ok(())
    }
}

/// Reads a reference-logits file row by row, validating as it goes.
pub struct LogitsReader {
    path: PathBuf,
    pub header: LogitsHeader,
    r: BufReader<File>,
    row: usize,
    buf: Vec<u8>,
}

/// One decoded row: the renormalized log-probabilities are in the caller's buffer.
#[derive(Debug, Clone, Copy)]
pub struct Row {
    /// Log-probability of the token that follows, as the producer computed it (unquantized).
    pub target_lp: f64,
}

impl LogitsReader {
    pub fn open(path: &Path) -> Result<LogitsReader, LogitsFileError> {
        let p = || path.to_path_buf();
        let io = |what| {
            move |err| LogitsFileError::Io {
                path: path.to_path_buf(),
                what,
                err,
            }
        };
        // A FIFO, directory or device is refused before it is read (`input::open_regular`).
        let (f, meta) = crate::input::open_regular(path).map_err(|err| {
            if err.kind() == std::io::ErrorKind::InvalidInput {
                LogitsFileError::Field {
                    path: p(),
                    field: "file type",
                    value: 0,
                    why: err.to_string(),
                }
            } else {
                io("open")(err)
            }
        })?;
        if !meta.is_file() {
            return Err(LogitsFileError::Field {
                path: p(),
                field: "file type",
                value: 0,
                why: "not a regular file".into(),
            });
        }
        let len = meta.len();
        let mut r = BufReader::with_capacity(1 << 20, f);
        let mut head = [0u8; HEADER as usize];
        if len < HEADER {
            return Err(LogitsFileError::Size {
                path: p(),
                expected: HEADER,
                found: len,
            });
        }
        r.read_exact(&mut head).map_err(io("read the header"))?;
        if head[..8] != MAGIC {
            return Err(LogitsFileError::Magic {
                path: p(),
                found: String::from_utf8_lossy(&head[..8]).into_owned(),
            });
        }
        let u = |i: usize| u32::from_le_bytes(head[i..i + 4].try_into().expect("4 bytes"));
        let version = u(8);
        if version != VERSION {
            return Err(LogitsFileError::Version {
                path: p(),
                found: version,
            });
        }
        let field = |field, value: u32, why: &str| LogitsFileError::Field {
            path: p(),
            field,
            value: value as u64,
            why: why.into(),
        };
        let (n_vocab, n_ctx, n_tokens, n_pos, label_len) = (u(12), u(16), u(20), u(24), u(28));
        if !(2..=MAX_VOCAB).contains(&n_vocab) {
            return Err(field("n_vocab", n_vocab, "must be between 2 and 4194304"));
        }
        if n_ctx < 2 {
            return Err(field("n_ctx", n_ctx, "must be at least 2"));
        }
        if n_tokens > MAX_TOKENS {
            return Err(field("n_tokens", n_tokens, "more than 67108864 tokens"));
        }
        let want = positions(n_tokens as usize, n_ctx as usize);
        if n_pos as usize != want {
            return Err(field(
                "n_positions",
                n_pos,
                &format!("{n_tokens} tokens in chunks of {n_ctx} predict {want} positions"),
            ));
        }
        if label_len > MAX_LABEL {
            return Err(field("label_len", label_len, "longer than 1024 bytes"));
        }
        // The exact length, before reading the variable parts.
        let expected = HEADER
            + label_len as u64
            + 4 * n_tokens as u64
            + want as u64 * row_bytes(n_vocab as usize) as u64;
        if len != expected {
            return Err(LogitsFileError::Size {
                path: p(),
                expected,
                found: len,
            });
        }
        let mut label = vec![0u8; label_len as usize];
        r.read_exact(&mut label).map_err(io("read the label"))?;
        let label = String::from_utf8(label).map_err(|_| LogitsFileError::Label { path: p() })?;
        let mut raw = vec![0u8; 4 * n_tokens as usize];
        r.read_exact(&mut raw).map_err(io("read the tokens"))?;
        let tokens: Vec<u32> = raw
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect();
        if let Some((index, &id)) = tokens.iter().enumerate().find(|(_, &t)| t >= n_vocab) {
            return Err(LogitsFileError::Token {
                path: p(),
                index,
                id,
                n_vocab,
            });
        }
        Ok(LogitsReader {
            path: p(),
            header: LogitsHeader {
                n_vocab: n_vocab as usize,
                n_ctx: n_ctx as usize,
                label,
                tokens,
            },
            r,
            row: 0,
            buf: vec![0; row_bytes(n_vocab as usize)],
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A typed error when the file's `what` is `file`, not `expected`.
    pub fn mismatch(&self, what: &'static str, file: u64, expected: u64) -> LogitsFileError {
        LogitsFileError::Mismatch {
            path: self.path.clone(),
            what,
            file,
            expected,
        }
    }

    /// Reads the next row: the renormalized log-probabilities into `lp` (`n_vocab` long).
    pub fn next_row(&mut self, lp: &mut [f64]) -> Result<Row, LogitsFileError> {
        let n = self.header.n_positions();
        if self.row >= n {
            return Err(LogitsFileError::Exhausted {
                path: self.path.clone(),
                rows: n,
            });
        }
        self.r
            .read_exact(&mut self.buf)
            .map_err(|err| LogitsFileError::Io {
                path: self.path.clone(),
                what: "read a row",
                err,
            })?;
        let f = |i: usize| f32::from_le_bytes(self.buf[i..i + 4].try_into().expect("4 bytes"));
        let (lo, scale, target) = (f(0), f(4), f(8));
        let bad = |field, value| LogitsFileError::Row {
            path: self.path.clone(),
            row: self.row,
            field,
            value,
        };
        // Log-probabilities are ≤ 0; the span of a row is at most RANGE (plus rounding).
        if !lo.is_finite() || !(-1e6..=1e-3).contains(&lo) {
            return Err(bad("lo", lo));
        }
        if !scale.is_finite() || scale < 0.0 || scale as f64 * 65535.0 > RANGE + 1.0 {
            return Err(bad("scale", scale));
        }
        if !target.is_finite() || target > 1e-3 {
            return Err(bad("target_lp", target));
        }
        for (j, o) in lp.iter_mut().enumerate() {
            let q = u16::from_le_bytes([self.buf[12 + 2 * j], self.buf[13 + 2 * j]]);
            *o = lo as f64 + scale as f64 * q as f64;
        }
        let lse = super::kld::logsumexp(lp);
        lp.iter_mut().for_each(|v| *v -= lse);
        self.row += 1;
        Ok(Row {
            target_lp: target as f64,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_count_each_chunk_minus_one() {
        assert_eq!(positions(10, 4), 3 + 3 + 1);
        assert_eq!(positions(9, 4), 3 + 3);
        assert_eq!(positions(8, 4), 6);
        assert_eq!(positions(1, 4), 0);
        assert_eq!(positions(0, 4), 0);
    }

    #[test]
    fn rows_round_trip_within_the_quantization_step() {
        let logits: Vec<f32> = (0..300)
            .map(|i| ((i * 37) % 101) as f32 * 0.13 - 5.0)
            .collect();
        let mut lp = vec![0.0; 300];
        crate::ppl::kld::log_softmax(&logits, &mut lp);
        let mut row = vec![0u8; row_bytes(300)];
        encode_row(&lp, 7, &mut row);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.logits");
        let h = LogitsHeader {
            n_vocab: 300,
            n_ctx: 2,
            label: "test".into(),
            tokens: vec![7, 7],
        };
        let mut w = LogitsWriter::create(&path, &[], &h).unwrap();
        w.push(&lp, 7).unwrap();
        w.finish().unwrap();
        let mut r = LogitsReader::open(&path).unwrap();
        assert_eq!(r.header, h);
        let mut back = vec![0.0; 300];
        let row = r.next_row(&mut back).unwrap();
        assert!((row.target_lp - lp[7]).abs() < 1e-6);
        let step = (RANGE.min(
            lp.iter().copied().fold(f64::MIN, f64::max)
                - lp.iter().copied().fold(f64::MAX, f64::min),
        )) / 65535.0;
        for (a, b) in lp.iter().zip(&back) {
            assert!((a - b).abs() <= step, "{a} vs {b} (step {step})");
        }
        assert!(matches!(
            r.next_row(&mut back),
            Err(LogitsFileError::Exhausted { .. })
        ));
    }

    #[test]
    fn an_unfinished_writer_leaves_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.logits");
        let h = LogitsHeader {
            n_vocab: 4,
            n_ctx: 3,
            label: String::new(),
            tokens: vec![0, 1, 2],
        };
        let w = LogitsWriter::create(&path, &[], &h).unwrap();
        assert!(matches!(
            w.finish(),
            Err(LogitsFileError::Incomplete {
                written: 0,
                expected: 2,
                ..
            })
        ));
        assert!(!path.exists());
    }

    /// A valid 2-row file (vocab 5, ctx 3, tokens 0 1 2) as bytes.
    fn valid_bytes(dir: &Path) -> Vec<u8> {
        let path = dir.join("ok.logits");
        let h = LogitsHeader {
            n_vocab: 5,
            n_ctx: 3,
            label: "lab".into(),
            tokens: vec![0, 1, 2],
        };
        let mut w = LogitsWriter::create(&path, &[], &h).unwrap();
        let mut lp = vec![0.0; 5];
        crate::ppl::kld::log_softmax(&[0.0, 1.0, 2.0, 3.0, 4.0], &mut lp);
        w.push(&lp, 1).unwrap();
        w.push(&lp, 2).unwrap();
        w.finish().unwrap();
        std::fs::read(&path).unwrap()
    }

    fn open_bytes(dir: &Path, b: &[u8]) -> Result<LogitsReader, LogitsFileError> {
        let p = dir.join("bad.logits");
        std::fs::write(&p, b).unwrap();
        LogitsReader::open(&p)
    }

    fn read_all(dir: &Path, b: &[u8]) -> Result<(), LogitsFileError> {
        let mut r = open_bytes(dir, b)?;
        let mut lp = vec![0.0; r.header.n_vocab];
        for _ in 0..r.header.n_positions() {
            r.next_row(&mut lp)?;
        }
        Ok(())
    }

    fn set_u32(b: &mut [u8], at: usize, v: u32) {
        b[at..at + 4].copy_from_slice(&v.to_le_bytes());
    }

    /// Every corruption of the header, the tokens, the length or a row is a typed error naming
    /// the file and the field; none panics.
    #[test]
    fn corrupt_files_give_typed_errors() {
        let dir = tempfile::tempdir().unwrap();
        let ok = valid_bytes(dir.path());
        read_all(dir.path(), &ok).unwrap();
        // Rows start after the 32-byte header, the 3-byte label and 3 tokens.
        let row0 = 32 + 3 + 12;
        type Check = fn(&LogitsFileError) -> bool;
        let cases: Vec<(&str, Vec<u8>, Check)> = vec![
            (
                "magic",
                {
                    let mut b = ok.clone();
                    b[0] = b'X';
                    b
                },
                |e| matches!(e, LogitsFileError::Magic { .. }),
            ),
            (
                "version",
                {
                    let mut b = ok.clone();
                    set_u32(&mut b, 8, 2);
                    b
                },
                |e| matches!(e, LogitsFileError::Version { found: 2, .. }),
            ),
            (
                "n_vocab 0",
                {
                    let mut b = ok.clone();
                    set_u32(&mut b, 12, 0);
                    b
                },
                |e| {
                    matches!(
                        e,
                        LogitsFileError::Field {
                            field: "n_vocab",
                            ..
                        }
                    )
                },
            ),
            (
                "n_vocab huge",
                {
                    let mut b = ok.clone();
                    set_u32(&mut b, 12, u32::MAX);
                    b
                },
                |e| {
                    matches!(
                        e,
                        LogitsFileError::Field {
                            field: "n_vocab",
                            ..
                        }
                    )
                },
            ),
            (
                "n_vocab other",
                {
                    let mut b = ok.clone();
                    set_u32(&mut b, 12, 6);
                    b
                },
                |e| matches!(e, LogitsFileError::Size { .. }),
            ),
            (
                "n_ctx",
                {
                    let mut b = ok.clone();
                    set_u32(&mut b, 16, 1);
                    b
                },
                |e| matches!(e, LogitsFileError::Field { field: "n_ctx", .. }),
            ),
            (
                "n_tokens",
                {
                    let mut b = ok.clone();
                    set_u32(&mut b, 20, u32::MAX);
                    b
                },
                |e| {
                    matches!(
                        e,
                        LogitsFileError::Field {
                            field: "n_tokens",
                            ..
                        }
                    )
                },
            ),
            (
                "n_positions",
                {
                    let mut b = ok.clone();
                    set_u32(&mut b, 24, 3);
                    b
                },
                |e| {
                    matches!(
                        e,
                        LogitsFileError::Field {
                            field: "n_positions",
                            ..
                        }
                    )
                },
            ),
            (
                "label_len",
                {
                    let mut b = ok.clone();
                    set_u32(&mut b, 28, 5000);
                    b
                },
                |e| {
                    matches!(
                        e,
                        LogitsFileError::Field {
                            field: "label_len",
                            ..
                        }
                    )
                },
            ),
            (
                "label utf-8",
                {
                    let mut b = ok.clone();
                    b[32] = 0xff;
                    b
                },
                |e| matches!(e, LogitsFileError::Label { .. }),
            ),
            (
                "token id",
                {
                    let mut b = ok.clone();
                    set_u32(&mut b, 35 + 4, 5);
                    b
                },
                |e| {
                    matches!(
                        e,
                        LogitsFileError::Token {
                            index: 1,
                            id: 5,
                            ..
                        }
                    )
                },
            ),
            ("truncated", ok[..ok.len() - 1].to_vec(), |e| {
                matches!(e, LogitsFileError::Size { .. })
            }),
            (
                "trailing",
                {
                    let mut b = ok.clone();
                    b.push(0);
                    b
                },
                |e| matches!(e, LogitsFileError::Size { .. }),
            ),
            ("header only", ok[..20].to_vec(), |e| {
                matches!(e, LogitsFileError::Size { .. })
            }),
            (
                "lo NaN",
                {
                    let mut b = ok.clone();
                    b[row0..row0 + 4].copy_from_slice(&f32::NAN.to_le_bytes());
                    b
                },
                |e| {
                    matches!(
                        e,
                        LogitsFileError::Row {
                            row: 0,
                            field: "lo",
                            ..
                        }
                    )
                },
            ),
            (
                "scale < 0",
                {
                    let mut b = ok.clone();
                    b[row0 + 4..row0 + 8].copy_from_slice(&(-1f32).to_le_bytes());
                    b
                },
                |e| matches!(e, LogitsFileError::Row { field: "scale", .. }),
            ),
            (
                "scale huge",
                {
                    let mut b = ok.clone();
                    b[row0 + 4..row0 + 8].copy_from_slice(&1f32.to_le_bytes());
                    b
                },
                |e| matches!(e, LogitsFileError::Row { field: "scale", .. }),
            ),
            (
                "target_lp > 0",
                {
                    let mut b = ok.clone();
                    let r1 = row0 + row_bytes(5);
                    b[r1 + 8..r1 + 12].copy_from_slice(&3f32.to_le_bytes());
                    b
                },
                |e| {
                    matches!(
                        e,
                        LogitsFileError::Row {
                            row: 1,
                            field: "target_lp",
                            ..
                        }
                    )
                },
            ),
        ];
        for (what, bytes, check) in cases {
            let e = read_all(dir.path(), &bytes).expect_err(what);
            assert!(check(&e), "{what}: {e:?}");
            assert!(e.to_string().contains("bad.logits"), "{what}: {e}");
        }
        // Not a file at all.
        let e = LogitsReader::open(dir.path()).err().unwrap();
        assert!(
            matches!(
                e,
                LogitsFileError::Field {
                    field: "file type",
                    ..
                }
            ),
            "{e:?}"
        );
        let e = LogitsReader::open(&dir.path().join("missing"))
            .err()
            .unwrap();
        assert!(
            matches!(e, LogitsFileError::Io { what: "open", .. }),
            "{e:?}"
        );
    }
}
