//! Typed errors of the format reader and writer. Every variant names the file and the field.

use std::path::PathBuf;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum FormatError {
    // The I/O error is printed in the message and deliberately not a `#[source]` (nor a field
    // named `source`): `{:#}` chains would print it twice.
    #[error("{file}: cannot open: {err}")]
    Io { file: PathBuf, err: std::io::Error },
    #[error("{file}: {kind}, not a regular file: give the path of a model file")]
    NotRegular { file: PathBuf, kind: &'static str },
    /// The file changed while it was mapped (truncated, rewritten in place): what was computed
    /// from it is unreliable and the file must be opened again.
    #[error("model file {file} changed while it was mapped: reopen it ({why})")]
    Changed { file: PathBuf, why: String },
    #[error("{file}: file is {size} bytes, too small for the {needed}-byte header")]
    TooSmall {
        file: PathBuf,
        size: u64,
        needed: u64,
    },
    #[error("{file}: bad magic {found:?} (expected \"CFLOW\\0\\0\\0\"): not a .cflow file")]
    BadMagic { file: PathBuf, found: [u8; 8] },
    #[error("{file}: unsupported version {found} (this build reads version {expected})")]
    BadVersion {
        file: PathBuf,
        found: u32,
        expected: u32,
    },
    #[error("{file}: header field `{field}` has invalid value {value}: {why}")]
    BadField {
        file: PathBuf,
        field: &'static str,
        value: String,
        why: String,
    },
    #[error("{file}: {what} at offset {offset} length {len} lies outside the file ({size} bytes)")]
    OutOfBounds {
        file: PathBuf,
        what: String,
        offset: u64,
        len: u64,
        size: u64,
    },
    #[error("{file}: {what} [{a_off}, +{a_len}) overlaps {other} [{b_off}, +{b_len})")]
    Overlap {
        file: PathBuf,
        what: String,
        a_off: u64,
        a_len: u64,
        other: String,
        b_off: u64,
        b_len: u64,
    },
    #[error("{file}: {what}: expected {expected}, found {found}")]
    Mismatch {
        file: PathBuf,
        what: String,
        expected: String,
        found: String,
    },
    #[error("{file}: metadata field `{field}` has invalid value {value}: {why}")]
    BadMetaField {
        file: PathBuf,
        field: &'static str,
        value: String,
        why: String,
    },
    #[error("{file}: metadata is not valid JSON: {why}")]
    BadMetadata { file: PathBuf, why: String },
    #[error("{file}: size arithmetic overflows for {what}")]
    Overflow { file: PathBuf, what: String },
    /// Printed like `Io` (the cause in the message, not a source).
    #[error("{file}: write failed: {err}")]
    Write { file: PathBuf, err: std::io::Error },
    #[error(transparent)]
    Output(#[from] crate::output::OutputError),
    #[error("invalid model data: {0}")]
    Invalid(String),
}
