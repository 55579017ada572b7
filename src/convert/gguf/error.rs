//! [`GgufError`]: every way reading or querying a GGUF file fails, each naming the file.

use super::GgmlType;

/// Errors from reading or querying a GGUF file. Every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("{file}: cannot read file: {source}")]
    Io {
        file: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{file}: bad magic {found:02x?} (expected \"GGUF\" = [47, 47, 55, 46])")]
    BadMagic { file: String, found: Vec<u8> },
    #[error("{file}: unsupported GGUF version {version} (supported: 2, 3){hint}")]
    UnsupportedVersion {
        file: String,
        version: u32,
        hint: &'static str,
    },
    #[error("{file}: truncated: reading {what} at byte {offset} needs {need} bytes but only {have} remain")]
    Truncated {
        file: String,
        what: String,
        offset: u64,
        need: u64,
        have: u64,
    },
    #[error("{file}: {field} = {count} is absurd: needs at least {min_bytes} bytes but only {remaining} remain")]
    AbsurdCount {
        file: String,
        field: String,
        count: u64,
        min_bytes: u128,
        remaining: u64,
    },
    #[error("{file}: string {what} at byte {offset} has length {len}, past end of file ({remaining} bytes remain)")]
    StringPastEof {
        file: String,
        what: String,
        offset: u64,
        len: u64,
        remaining: u64,
    },
    #[error("{file}: string {what} at byte {offset} is not valid UTF-8")]
    InvalidUtf8 {
        file: String,
        what: String,
        offset: u64,
    },
    #[error("{file}: metadata key {key:?} has unknown value type id {type_id}")]
    UnknownValueType {
        file: String,
        key: String,
        type_id: u32,
    },
    #[error("{file}: metadata key {key:?}: arrays nested deeper than {max}")]
    ArrayTooDeep {
        file: String,
        key: String,
        max: usize,
    },
    #[error("{file}: duplicate metadata key {key:?}")]
    DuplicateKey { file: String, key: String },
    #[error("{file}: metadata key {key:?} has type {found}, expected {expected}")]
    WrongType {
        file: String,
        key: String,
        expected: &'static str,
        found: String,
    },
    #[error("{file}: metadata key {key:?} is missing")]
    MissingKey { file: String, key: String },
    #[error("{file}: general.alignment = {value} is not a non-zero power of two")]
    BadAlignment { file: String, value: u64 },
    #[error("{file}: tensor {tensor:?} has {n_dims} dimensions (supported: 1..={max})")]
    BadDimCount {
        file: String,
        tensor: String,
        n_dims: u32,
        max: u32,
    },
    #[error("{file}: tensor {tensor:?} has a zero dimension: {dims:?}")]
    ZeroDim {
        file: String,
        tensor: String,
        dims: Vec<u64>,
    },
    #[error("{file}: tensor {tensor:?} dimensions {dims:?} overflow the element/byte count")]
    DimsOverflow {
        file: String,
        tensor: String,
        dims: Vec<u64>,
    },
    #[error("{file}: tensor {tensor:?} has unknown ggml type id {type_id}")]
    UnknownTensorType {
        file: String,
        tensor: String,
        type_id: u32,
    },
    #[error("{file}: tensor {tensor:?} of type {ggml_type}: row length {ne0} is not a multiple of the block size {block}")]
    RowNotBlockMultiple {
        file: String,
        tensor: String,
        ggml_type: GgmlType,
        ne0: u64,
        block: u64,
    },
    #[error("{file}: duplicate tensor name {tensor:?}")]
    DuplicateTensor { file: String, tensor: String },
    #[error("{file}: tensor {tensor:?} data offset {offset} is not a multiple of the alignment {alignment}")]
    MisalignedTensor {
        file: String,
        tensor: String,
        offset: u64,
        alignment: u64,
    },
    #[error("{file}: tensor {tensor:?} data [{offset}, {offset}+{size}) runs past the end of the data section ({data_len} bytes)")]
    TensorPastEof {
        file: String,
        tensor: String,
        offset: u64,
        size: u64,
        data_len: u64,
    },
    #[error("{file}: tensors {first:?} and {second:?} overlap (data at {first_offset}+{first_size} and {second_offset})")]
    OverlappingTensors {
        file: String,
        first: String,
        first_offset: u64,
        first_size: u64,
        second: String,
        second_offset: u64,
    },
    #[error("{file}: no tensor named {tensor:?}")]
    TensorNotFound { file: String, tensor: String },
    #[error("{file}: {kind}, not a regular file: give the path of a .gguf file")]
    NotRegular { file: String, kind: &'static str },
    #[error("{file}: metadata too large: {what} would take the parsed metadata past {limit} MiB in memory")]
    MetadataTooLarge {
        file: String,
        what: String,
        limit: u64,
    },
    #[error("{file}: tensor count {count} exceeds the supported {max}")]
    TooManyTensors { file: String, count: u64, max: u64 },
}
