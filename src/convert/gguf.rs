//! Validating GGUF v2/v3 reader.
//!
//! Owns: parsing the GGUF container (header, metadata key/value pairs of every value type including
//! nested arrays, tensor infos, alignment, data section), validating all of it against the bytes
//! actually present (counts vs remaining bytes before any allocation, string lengths, dimension
//! overflow, tensor extents, alignment, overlap, unknown types), typed metadata accessors, and
//! tensor lookup returning zero-copy byte views. Nothing here trusts the file: every failure is a
//! [`GgufError`] naming the file, the field and the offending value, never a panic.
//!
//! The reader works on any byte source (`Vec<u8>`, an mmap owned by an `unsafe`-allowed module,
//! ...) through [`GgufFile::parse`]; [`GgufFile::open`] memory-maps the file (`format::mmap`:
//! only a regular file, never read into memory whole; a truncation during the import is flagged,
//! [`GgufFile::input_changed`]). The parsed metadata is bounded in memory ([`MAX_METADATA_MEMORY`],
//! besides every count being bounded by the bytes left in the file) and so is the tensor count
//! ([`MAX_TENSORS`]), so a crafted header cannot make the parser allocate gigabytes.
//!
//! [`testutil`] holds a small GGUF writer used by tests to build valid and corrupted files.

use crate::format::mmap::MappedInput;
use std::collections::HashMap;
use std::fmt;
use std::path::Path;
use std::sync::Arc;

/// The four magic bytes at the start of every GGUF file.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// Default data alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Maximum number of tensor dimensions (GGML_MAX_DIMS).
pub const MAX_DIMS: u32 = 4;
/// Maximum nesting depth of metadata arrays (arrays of arrays of ...).
pub const MAX_ARRAY_DEPTH: usize = 4;
/// Bound on the parsed metadata's memory (estimated: every value as a [`GgufValue`], strings
/// with their heap bytes). The largest real tokenizers (262k tokens with scores and types, 150k
/// merges) take ~40 MiB; a 1-byte `u8` array element costs 32 bytes parsed, so without this bound
/// 100 MB of `u8` metadata took 3.2 GB.
pub const MAX_METADATA_MEMORY: u64 = 256 << 20;
/// Bound on the number of tensors (real models have at most tens of thousands).
pub const MAX_TENSORS: u64 = 1 << 18;
/// Estimated bytes of one parsed value (the enum) and of a string's heap allocation overhead.
const VALUE_COST: u64 = std::mem::size_of::<GgufValue>() as u64;
const STRING_OVERHEAD: u64 = 16;

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

/// GGML tensor storage types (ids as stored in GGUF). Only some are importable by cflow
/// (F32, F16, Q4_0, Q4_1, Q8_0); the others are recognised so that files open and importers can
/// reject them with a clear message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    IQ2_XXS,
    IQ2_XS,
    IQ3_XXS,
    IQ1_S,
    IQ4_NL,
    IQ3_S,
    IQ2_S,
    IQ4_XS,
    I8,
    I16,
    I32,
    I64,
    F64,
    IQ1_M,
    BF16,
    TQ1_0,
    TQ2_0,
    MXFP4,
}

/// (type, id, block size in elements, bytes per block, name)
const GGML_TYPES: &[(GgmlType, u32, u64, u64, &str)] = &[
    (GgmlType::F32, 0, 1, 4, "F32"),
    (GgmlType::F16, 1, 1, 2, "F16"),
    (GgmlType::Q4_0, 2, 32, 18, "Q4_0"),
    (GgmlType::Q4_1, 3, 32, 20, "Q4_1"),
    (GgmlType::Q5_0, 6, 32, 22, "Q5_0"),
    (GgmlType::Q5_1, 7, 32, 24, "Q5_1"),
    (GgmlType::Q8_0, 8, 32, 34, "Q8_0"),
    (GgmlType::Q8_1, 9, 32, 36, "Q8_1"),
    (GgmlType::Q2_K, 10, 256, 84, "Q2_K"),
    (GgmlType::Q3_K, 11, 256, 110, "Q3_K"),
    (GgmlType::Q4_K, 12, 256, 144, "Q4_K"),
    (GgmlType::Q5_K, 13, 256, 176, "Q5_K"),
    (GgmlType::Q6_K, 14, 256, 210, "Q6_K"),
    (GgmlType::Q8_K, 15, 256, 292, "Q8_K"),
    (GgmlType::IQ2_XXS, 16, 256, 66, "IQ2_XXS"),
    (GgmlType::IQ2_XS, 17, 256, 74, "IQ2_XS"),
    (GgmlType::IQ3_XXS, 18, 256, 98, "IQ3_XXS"),
    (GgmlType::IQ1_S, 19, 256, 50, "IQ1_S"),
    (GgmlType::IQ4_NL, 20, 32, 18, "IQ4_NL"),
    (GgmlType::IQ3_S, 21, 256, 110, "IQ3_S"),
    (GgmlType::IQ2_S, 22, 256, 82, "IQ2_S"),
    (GgmlType::IQ4_XS, 23, 256, 136, "IQ4_XS"),
    (GgmlType::I8, 24, 1, 1, "I8"),
    (GgmlType::I16, 25, 1, 2, "I16"),
    (GgmlType::I32, 26, 1, 4, "I32"),
    (GgmlType::I64, 27, 1, 8, "I64"),
    (GgmlType::F64, 28, 1, 8, "F64"),
    (GgmlType::IQ1_M, 29, 256, 56, "IQ1_M"),
    (GgmlType::BF16, 30, 1, 2, "BF16"),
    (GgmlType::TQ1_0, 34, 256, 54, "TQ1_0"),
    (GgmlType::TQ2_0, 35, 256, 66, "TQ2_0"),
    (GgmlType::MXFP4, 39, 32, 17, "MXFP4"),
];

impl GgmlType {
    fn entry(self) -> &'static (GgmlType, u32, u64, u64, &'static str) {
        // Every variant has exactly one table row (checked by a unit test).
        GGML_TYPES
            .iter()
            .find(|e| e.0 == self)
            .unwrap_or(&GGML_TYPES[0])
    }

    /// Type from its GGUF id, `None` if unknown or removed (4, 5, 31..=33, 36..=38).
    pub fn from_id(id: u32) -> Option<GgmlType> {
        GGML_TYPES.iter().find(|e| e.1 == id).map(|e| e.0)
    }

    /// The GGUF type id.
    pub fn id(self) -> u32 {
        self.entry().1
    }

    /// Elements per block.
    pub fn block_size(self) -> u64 {
        self.entry().2
    }

    /// Bytes per block.
    pub fn type_size(self) -> u64 {
        self.entry().3
    }

    /// Canonical name ("Q4_1", ...).
    pub fn name(self) -> &'static str {
        self.entry().4
    }

    /// Whether cflow can import this type without re-quantization.
    pub fn is_importable(self) -> bool {
        matches!(
            self,
            GgmlType::F32 | GgmlType::F16 | GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0
        )
    }

    /// Bytes occupied by `n_elements` of this type (which must be a multiple of the block size),
    /// `None` on overflow or a partial block.
    pub fn bytes_for(self, n_elements: u64) -> Option<u64> {
        let bs = self.block_size();
        if !n_elements.is_multiple_of(bs) {
            return None;
        }
        (n_elements / bs).checked_mul(self.type_size())
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// GGUF metadata value type ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GgufValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl GgufValueType {
    /// From the on-disk id.
    pub fn from_id(id: u32) -> Option<Self> {
        use GgufValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// Minimum encoded size of one value of this type (strings: the u64 length; arrays: type +
    /// count).
    fn min_size(self) -> u64 {
        use GgufValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | String => 8,
            Array => 12,
        }
    }

    fn name(self) -> &'static str {
        use GgufValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }
}

/// A metadata array: element type plus values (all of that type).
#[derive(Clone, Debug, PartialEq)]
pub struct GgufArray {
    pub elem_type: GgufValueType,
    pub values: Vec<GgufValue>,
}

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(GgufArray),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl GgufValue {
    /// The value's type.
    pub fn value_type(&self) -> GgufValueType {
        match self {
            GgufValue::U8(_) => GgufValueType::U8,
            GgufValue::I8(_) => GgufValueType::I8,
            GgufValue::U16(_) => GgufValueType::U16,
            GgufValue::I16(_) => GgufValueType::I16,
            GgufValue::U32(_) => GgufValueType::U32,
            GgufValue::I32(_) => GgufValueType::I32,
            GgufValue::F32(_) => GgufValueType::F32,
            GgufValue::Bool(_) => GgufValueType::Bool,
            GgufValue::String(_) => GgufValueType::String,
            GgufValue::Array(_) => GgufValueType::Array,
            GgufValue::U64(_) => GgufValueType::U64,
            GgufValue::I64(_) => GgufValueType::I64,
            GgufValue::F64(_) => GgufValueType::F64,
        }
    }

    /// Human-readable type ("u32", "array<string>", ...), for error messages.
    pub fn type_name(&self) -> String {
        match self {
            GgufValue::Array(a) => format!("array<{}>", a.elem_type.name()),
            v => v.value_type().name().to_string(),
        }
    }

    /// Any integer value as i128 (lossless), `None` for non-integers.
    pub fn as_int(&self) -> Option<i128> {
        Some(match *self {
            GgufValue::U8(v) => v.into(),
            GgufValue::I8(v) => v.into(),
            GgufValue::U16(v) => v.into(),
            GgufValue::I16(v) => v.into(),
            GgufValue::U32(v) => v.into(),
            GgufValue::I32(v) => v.into(),
            GgufValue::U64(v) => v.into(),
            GgufValue::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// Float or integer value as f64.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::F32(v) => Some(v.into()),
            GgufValue::F64(v) => Some(v),
            _ => self.as_int().map(|i| i as f64),
        }
    }

    /// String value.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }
}

/// Metadata of one tensor, validated against the file.
#[derive(Clone, Debug)]
pub struct GgufTensorInfo {
    pub name: String,
    /// Dimensions in GGUF order (ne[0] = innermost / row length first).
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Offset relative to the data section start.
    pub offset: u64,
    /// Size in bytes of the tensor data.
    pub size: u64,
}

impl GgufTensorInfo {
    /// Number of elements.
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// A zero-copy view of one tensor.
#[derive(Clone, Copy, Debug)]
pub struct TensorView<'a> {
    pub name: &'a str,
    pub ggml_type: GgmlType,
    pub dims: &'a [u64],
    pub data: &'a [u8],
}

type Bytes = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// A shared mapped input as a byte source.
struct SharedInput(Arc<MappedInput>);

impl AsRef<[u8]> for SharedInput {
    fn as_ref(&self) -> &[u8] {
        self.0.bytes()
    }
}

/// A parsed, validated GGUF file.
pub struct GgufFile {
    name: String,
    bytes: Bytes,
    /// The mapping behind `bytes` when opened from a path (for [`GgufFile::input_changed`]).
    input: Option<Arc<MappedInput>>,
    version: u32,
    metadata: Vec<(String, GgufValue)>,
    kv_index: HashMap<String, usize>,
    tensors: Vec<GgufTensorInfo>,
    tensor_index: HashMap<String, usize>,
    alignment: u64,
    data_start: u64,
}

impl fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufFile")
            .field("name", &self.name)
            .field("version", &self.version)
            .field("n_kv", &self.metadata.len())
            .field("n_tensors", &self.tensors.len())
            .field("alignment", &self.alignment)
            .field("data_start", &self.data_start)
            .finish()
    }
}

struct Cursor<'a> {
    file: &'a str,
    buf: &'a [u8],
    pos: usize,
    /// Estimated bytes the parsed metadata may still take (see [`MAX_METADATA_MEMORY`]).
    mem_left: u64,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() {
            return Err(GgufError::Truncated {
                file: self.file.to_string(),
                what: what(),
                offset: self.pos as u64,
                need: n,
                have: self.remaining(),
            });
        }
        let n = n as usize;
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N], GgufError> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// Charges `bytes` of parsed metadata against the memory bound.
    fn charge(&mut self, bytes: u64, what: &dyn Fn() -> String) -> Result<(), GgufError> {
        if bytes > self.mem_left {
            return Err(GgufError::MetadataTooLarge {
                file: self.file.to_string(),
                what: what(),
                limit: MAX_METADATA_MEMORY >> 20,
            });
        }
        self.mem_left -= bytes;
        Ok(())
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String, GgufError> {
        let at = self.pos as u64;
        let len = self.u64(&|| format!("length of {}", what()))?;
        if len <= self.remaining() {
            self.charge(STRING_OVERHEAD + len.next_multiple_of(16), what)?;
        }
        if len > self.remaining() {
            return Err(GgufError::StringPastEof {
                file: self.file.to_string(),
                what: what(),
                offset: at,
                len,
                remaining: self.remaining(),
            });
        }
        let raw = self.take(len, what)?;
        String::from_utf8(raw.to_vec()).map_err(|_| GgufError::InvalidUtf8 {
            file: self.file.to_string(),
            what: what(),
            offset: at,
        })
    }

    /// Reject `count` items of at least `min_each` bytes if they cannot fit in what remains.
    fn check_count(
        &self,
        field: &dyn Fn() -> String,
        count: u64,
        min_each: u64,
    ) -> Result<(), GgufError> {
        let min_bytes = count as u128 * min_each as u128;
        if min_bytes > self.remaining() as u128 {
            return Err(GgufError::AbsurdCount {
                file: self.file.to_string(),
                field: field(),
                count,
                min_bytes,
                remaining: self.remaining(),
            });
        }
        Ok(())
    }

    fn value(
        &mut self,
        key: &str,
        ty: GgufValueType,
        depth: usize,
    ) -> Result<GgufValue, GgufError> {
        let what = || format!("value of {key:?}");
        Ok(match ty {
            GgufValueType::U8 => GgufValue::U8(self.array::<1>(&what)?[0]),
            GgufValueType::I8 => GgufValue::I8(self.array::<1>(&what)?[0] as i8),
            GgufValueType::U16 => GgufValue::U16(u16::from_le_bytes(self.array(&what)?)),
            GgufValueType::I16 => GgufValue::I16(i16::from_le_bytes(self.array(&what)?)),
            GgufValueType::U32 => GgufValue::U32(u32::from_le_bytes(self.array(&what)?)),
            GgufValueType::I32 => GgufValue::I32(i32::from_le_bytes(self.array(&what)?)),
            GgufValueType::F32 => GgufValue::F32(f32::from_le_bytes(self.array(&what)?)),
            GgufValueType::Bool => GgufValue::Bool(self.array::<1>(&what)?[0] != 0),
            GgufValueType::String => GgufValue::String(self.string(&what)?),
            GgufValueType::U64 => GgufValue::U64(u64::from_le_bytes(self.array(&what)?)),
            GgufValueType::I64 => GgufValue::I64(i64::from_le_bytes(self.array(&what)?)),
            GgufValueType::F64 => GgufValue::F64(f64::from_le_bytes(self.array(&what)?)),
            GgufValueType::Array => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(GgufError::ArrayTooDeep {
                        file: self.file.to_string(),
                        key: key.to_string(),
                        max: MAX_ARRAY_DEPTH,
                    });
                }
                let type_id = self.u32(&|| format!("array element type of {key:?}"))?;
                let elem_type =
                    GgufValueType::from_id(type_id).ok_or_else(|| GgufError::UnknownValueType {
                        file: self.file.to_string(),
                        key: key.to_string(),
                        type_id,
                    })?;
                let count = self.u64(&|| format!("array length of {key:?}"))?;
                self.check_count(
                    &|| format!("array length of {key:?}"),
                    count,
                    elem_type.min_size(),
                )?;
                self.charge(count.saturating_mul(VALUE_COST), &|| {
                    format!("the {count} elements of {key:?}")
                })?;
                let mut values = Vec::with_capacity(count.min(1 << 16) as usize);
                for _ in 0..count {
                    values.push(self.value(key, elem_type, depth + 1)?);
                }
                GgufValue::Array(GgufArray { elem_type, values })
            }
        })
    }
}

fn align_up(x: u64, a: u64) -> Option<u64> {
    x.checked_add(a - 1).map(|v| v / a * a)
}

impl GgufFile {
    /// Memory-map `path` (a regular file; a FIFO or device is refused without blocking on it)
    /// and parse it. The file is paged in as tensors are read, never held in memory whole.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        let path = path.as_ref();
        let name = path.display().to_string();
        let io = |source| GgufError::Io {
            file: name.clone(),
            source,
        };
        let (file, meta) = crate::format::mmap::open_nonblocking(path).map_err(io)?;
        if let Some(kind) = crate::format::mmap::non_regular_kind(&meta) {
            return Err(GgufError::NotRegular { file: name, kind });
        }
        let map = Arc::new(MappedInput::from_file(&file, meta.len()).map_err(io)?);
        let mut g = Self::parse(SharedInput(map.clone()), &name)?;
        g.input = Some(map);
        Ok(g)
    }

    /// True once pages of the mapped input vanished while it was read (the file was truncated
    /// during the import: what was read from there is zeros). Always false for [`GgufFile::parse`].
    pub fn input_changed(&self) -> bool {
        self.input.as_ref().is_some_and(|m| m.changed())
    }

    /// Parse and validate GGUF bytes from any owner (a `Vec<u8>`, an `Arc<[u8]>`, an mmap).
    /// `name` is used in error messages.
    pub fn parse<B>(bytes: B, name: &str) -> Result<GgufFile, GgufError>
    where
        B: AsRef<[u8]> + Send + Sync + 'static,
    {
        let bytes: Bytes = Arc::new(bytes);
        let file = name.to_string();
        let buf: &[u8] = (*bytes).as_ref();
        let mut c = Cursor {
            file: name,
            buf,
            pos: 0,
            mem_left: MAX_METADATA_MEMORY,
        };

        let magic = c.take(4, &|| "magic".into())?;
        if magic != GGUF_MAGIC {
            return Err(GgufError::BadMagic {
                file,
                found: magic.to_vec(),
            });
        }
        let version = c.u32(&|| "version".into())?;
        if version != 2 && version != 3 {
            let hint = if version == 1 {
                " (GGUF v1 predates 64-bit counts; re-convert the model)"
            } else if version.swap_bytes() == 2 || version.swap_bytes() == 3 {
                " (this looks like a big-endian GGUF, which is not supported)"
            } else {
                ""
            };
            return Err(GgufError::UnsupportedVersion {
                file,
                version,
                hint,
            });
        }
        let n_tensors = c.u64(&|| "tensor count".into())?;
        let n_kv = c.u64(&|| "metadata KV count".into())?;
        // A KV is at least key length (8) + type (4) + 1 value byte; a tensor info at least
        // name length (8) + n_dims (4) + one dim (8) + type (4) + offset (8).
        c.check_count(&|| "metadata KV count".into(), n_kv, 13)?;
        c.check_count(&|| "tensor count".into(), n_tensors, 32)?;
        if n_tensors > MAX_TENSORS {
            return Err(GgufError::TooManyTensors {
                file,
                count: n_tensors,
                max: MAX_TENSORS,
            });
        }

        let mut metadata = Vec::with_capacity(n_kv.min(1 << 12) as usize);
        let mut kv_index = HashMap::new();
        for i in 0..n_kv {
            let key = c.string(&|| format!("metadata key #{i}"))?;
            // The value itself, the key's copy in the index and the index entry.
            c.charge(2 * VALUE_COST + key.len() as u64, &|| {
                format!("metadata key {key:?}")
            })?;
            let type_id = c.u32(&|| format!("value type of {key:?}"))?;
            let ty =
                GgufValueType::from_id(type_id).ok_or_else(|| GgufError::UnknownValueType {
                    file: file.clone(),
                    key: key.clone(),
                    type_id,
                })?;
            let value = c.value(&key, ty, 0)?;
            if kv_index.insert(key.clone(), metadata.len()).is_some() {
                return Err(GgufError::DuplicateKey { file, key });
            }
            metadata.push((key, value));
        }

        let alignment = match kv_index.get("general.alignment").map(|&i| &metadata[i].1) {
            None => DEFAULT_ALIGNMENT,
            Some(v) => match v.as_int() {
                Some(a) if a > 0 && a <= u32::MAX as i128 && (a as u64).is_power_of_two() => {
                    a as u64
                }
                Some(a) => {
                    return Err(GgufError::BadAlignment {
                        file,
                        value: a.clamp(0, u64::MAX as i128) as u64,
                    })
                }
                None => {
                    return Err(GgufError::WrongType {
                        file,
                        key: "general.alignment".into(),
                        expected: "integer",
                        found: v.type_name(),
                    })
                }
            },
        };

        // Re-check the tensor count now that the metadata has been consumed.
        c.check_count(&|| "tensor count".into(), n_tensors, 32)?;
        let mut tensors = Vec::with_capacity(n_tensors.min(1 << 12) as usize);
        let mut tensor_index = HashMap::new();
        for i in 0..n_tensors {
            let name = c.string(&|| format!("tensor name #{i}"))?;
            let n_dims = c.u32(&|| format!("n_dims of tensor {name:?}"))?;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return Err(GgufError::BadDimCount {
                    file,
                    tensor: name,
                    n_dims,
                    max: MAX_DIMS,
                });
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for d in 0..n_dims {
                dims.push(c.u64(&|| format!("dim {d} of tensor {name:?}"))?);
            }
            let type_id = c.u32(&|| format!("type of tensor {name:?}"))?;
            let offset = c.u64(&|| format!("data offset of tensor {name:?}"))?;
            let ggml_type =
                GgmlType::from_id(type_id).ok_or_else(|| GgufError::UnknownTensorType {
                    file: file.clone(),
                    tensor: name.clone(),
                    type_id,
                })?;
            if dims.contains(&0) {
                return Err(GgufError::ZeroDim {
                    file,
                    tensor: name,
                    dims,
                });
            }
            let n_el = dims
                .iter()
                .try_fold(1u64, |acc, &d| acc.checked_mul(d))
                .filter(|&n| n <= i64::MAX as u64);
            let Some(n_el) = n_el else {
                return Err(GgufError::DimsOverflow {
                    file,
                    tensor: name,
                    dims,
                });
            };
            if !dims[0].is_multiple_of(ggml_type.block_size()) {
                return Err(GgufError::RowNotBlockMultiple {
                    file,
                    tensor: name,
                    ggml_type,
                    ne0: dims[0],
                    block: ggml_type.block_size(),
                });
            }
            let Some(size) = ggml_type.bytes_for(n_el) else {
                return Err(GgufError::DimsOverflow {
                    file,
                    tensor: name,
                    dims,
                });
            };
            if !offset.is_multiple_of(alignment) {
                return Err(GgufError::MisalignedTensor {
                    file,
                    tensor: name,
                    offset,
                    alignment,
                });
            }
            if tensor_index.insert(name.clone(), tensors.len()).is_some() {
                return Err(GgufError::DuplicateTensor { file, tensor: name });
            }
            tensors.push(GgufTensorInfo {
                name,
                dims,
                ggml_type,
                offset,
                size,
            });
        }

        let header_end = c.pos as u64;
        let data_start = align_up(header_end, alignment).unwrap_or(u64::MAX);
        let data_len = (buf.len() as u64).saturating_sub(data_start);
        if data_start > buf.len() as u64 && !tensors.is_empty() {
            return Err(GgufError::Truncated {
                file,
                what: "padding before the tensor data section".into(),
                offset: header_end,
                need: data_start - header_end,
                have: buf.len() as u64 - header_end,
            });
        }
        for t in &tensors {
            let end = t.offset.checked_add(t.size);
            if end.is_none_or(|e| e > data_len) {
                return Err(GgufError::TensorPastEof {
                    file,
                    tensor: t.name.clone(),
                    offset: t.offset,
                    size: t.size,
                    data_len,
                });
            }
        }
        let mut order: Vec<usize> = (0..tensors.len()).collect();
        order.sort_by_key(|&i| tensors[i].offset);
        for w in order.windows(2) {
            let (a, b) = (&tensors[w[0]], &tensors[w[1]]);
            if a.offset + a.size > b.offset {
                return Err(GgufError::OverlappingTensors {
                    file,
                    first: a.name.clone(),
                    first_offset: a.offset,
                    first_size: a.size,
                    second: b.name.clone(),
                    second_offset: b.offset,
                });
            }
        }

        let data_start = data_start.min(buf.len() as u64);
        Ok(GgufFile {
            name: file,
            bytes,
            input: None,
            version,
            metadata,
            kv_index,
            tensors,
            tensor_index,
            alignment,
            data_start,
        })
    }

    /// Name used in messages (the path for [`GgufFile::open`]).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Data alignment (`general.alignment`, default 32).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute byte offset of the tensor data section.
    pub fn data_start(&self) -> u64 {
        self.data_start
    }

    /// The whole file.
    pub fn bytes(&self) -> &[u8] {
        (*self.bytes).as_ref()
    }

    /// All metadata in file order.
    pub fn metadata(&self) -> &[(String, GgufValue)] {
        &self.metadata
    }

    /// All tensor infos in file order.
    pub fn tensors(&self) -> &[GgufTensorInfo] {
        &self.tensors
    }

    /// Raw metadata value.
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.kv_index.get(key).map(|&i| &self.metadata[i].1)
    }

    fn wrong(&self, key: &str, expected: &'static str, v: &GgufValue) -> GgufError {
        GgufError::WrongType {
            file: self.name.clone(),
            key: key.to_string(),
            expected,
            found: v.type_name(),
        }
    }

    fn need(&self, key: &str) -> Result<&GgufValue, GgufError> {
        self.get(key).ok_or_else(|| GgufError::MissingKey {
            file: self.name.clone(),
            key: key.to_string(),
        })
    }

    /// Integer metadata that fits in u32 (any integer type accepted).
    pub fn get_u32(&self, key: &str) -> Result<u32, GgufError> {
        let v = self.need(key)?;
        v.as_int()
            .and_then(|i| u32::try_from(i).ok())
            .ok_or_else(|| self.wrong(key, "integer in u32 range", v))
    }

    /// Integer metadata that fits in u64 (any integer type accepted).
    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        let v = self.need(key)?;
        v.as_int()
            .and_then(|i| u64::try_from(i).ok())
            .ok_or_else(|| self.wrong(key, "integer in u64 range", v))
    }

    /// Float metadata (f32, f64 or integer accepted).
    pub fn get_f32(&self, key: &str) -> Result<f32, GgufError> {
        let v = self.need(key)?;
        v.as_f64()
            .map(|f| f as f32)
            .ok_or_else(|| self.wrong(key, "float", v))
    }

    /// Boolean metadata (bool or 0/1 integer accepted).
    pub fn get_bool(&self, key: &str) -> Result<bool, GgufError> {
        let v = self.need(key)?;
        match v {
            GgufValue::Bool(b) => Ok(*b),
            _ => match v.as_int() {
                Some(0) => Ok(false),
                Some(1) => Ok(true),
                _ => Err(self.wrong(key, "bool", v)),
            },
        }
    }

    /// String metadata.
    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        let v = self.need(key)?;
        v.as_str().ok_or_else(|| self.wrong(key, "string", v))
    }

    /// Array metadata.
    pub fn get_arr(&self, key: &str) -> Result<&GgufArray, GgufError> {
        let v = self.need(key)?;
        match v {
            GgufValue::Array(a) => Ok(a),
            _ => Err(self.wrong(key, "array", v)),
        }
    }

    /// Array of strings.
    pub fn get_str_array(&self, key: &str) -> Result<Vec<&str>, GgufError> {
        let a = self.get_arr(key)?;
        a.values
            .iter()
            .map(|v| v.as_str())
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                self.wrong(
                    key,
                    "array<string>",
                    self.get(key).unwrap_or(&GgufValue::U8(0)),
                )
            })
    }

    /// Array of integers, each converted to i64.
    pub fn get_int_array(&self, key: &str) -> Result<Vec<i64>, GgufError> {
        let a = self.get_arr(key)?;
        a.values
            .iter()
            .map(|v| v.as_int().and_then(|i| i64::try_from(i).ok()))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                self.wrong(
                    key,
                    "array<integer>",
                    self.get(key).unwrap_or(&GgufValue::U8(0)),
                )
            })
    }

    /// Array of floats (f32/f64/integers accepted).
    pub fn get_f32_array(&self, key: &str) -> Result<Vec<f32>, GgufError> {
        let a = self.get_arr(key)?;
        a.values
            .iter()
            .map(|v| v.as_f64().map(|f| f as f32))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                self.wrong(
                    key,
                    "array<float>",
                    self.get(key).unwrap_or(&GgufValue::U8(0)),
                )
            })
    }

    /// Optional variants: `Ok(None)` when the key is absent, an error when present but mistyped.
    pub fn opt_u32(&self, key: &str) -> Result<Option<u32>, GgufError> {
        self.get(key).map(|_| self.get_u32(key)).transpose()
    }

    /// See [`GgufFile::opt_u32`].
    pub fn opt_f32(&self, key: &str) -> Result<Option<f32>, GgufError> {
        self.get(key).map(|_| self.get_f32(key)).transpose()
    }

    /// See [`GgufFile::opt_u32`].
    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>, GgufError> {
        self.get(key).map(|_| self.get_bool(key)).transpose()
    }

    /// See [`GgufFile::opt_u32`].
    pub fn opt_str(&self, key: &str) -> Result<Option<&str>, GgufError> {
        self.get(key).map(|_| self.get_str(key)).transpose()
    }

    /// Tensor info by name.
    pub fn tensor_info(&self, name: &str) -> Option<&GgufTensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// Tensor by name: type, dims and its bytes (validated in-bounds at parse time).
    pub fn tensor(&self, name: &str) -> Result<TensorView<'_>, GgufError> {
        let t = self
            .tensor_info(name)
            .ok_or_else(|| GgufError::TensorNotFound {
                file: self.name.clone(),
                tensor: name.to_string(),
            })?;
        Ok(self.view(t))
    }

    /// View of a tensor from [`GgufFile::tensors`].
    pub fn view<'a>(&'a self, t: &'a GgufTensorInfo) -> TensorView<'a> {
        let start = (self.data_start + t.offset) as usize;
        let data = self
            .bytes()
            .get(start..start + t.size as usize)
            .unwrap_or(&[]);
        TensorView {
            name: &t.name,
            ggml_type: t.ggml_type,
            dims: &t.dims,
            data,
        }
    }
}

/// A minimal GGUF writer for tests (valid files, plus positions so tests can corrupt them).
pub mod testutil {
    use super::{GgufValue, GgufValueType};

    /// One tensor to write: raw type id (so unknown ids can be written), dims and data bytes.
    #[derive(Clone, Debug)]
    pub struct TestTensor {
        pub name: String,
        pub dims: Vec<u64>,
        pub type_id: u32,
        pub data: Vec<u8>,
        /// Write this offset instead of the computed one.
        pub offset_override: Option<u64>,
    }

    impl TestTensor {
        pub fn new(name: &str, dims: &[u64], type_id: u32, data: Vec<u8>) -> Self {
            TestTensor {
                name: name.to_string(),
                dims: dims.to_vec(),
                type_id,
                data,
                offset_override: None,
            }
        }
    }

    /// A GGUF file description.
    #[derive(Clone, Debug)]
    pub struct TestGguf {
        pub version: u32,
        pub alignment: u64,
        pub kvs: Vec<(String, GgufValue)>,
        pub tensors: Vec<TestTensor>,
        pub tensor_count_override: Option<u64>,
        pub kv_count_override: Option<u64>,
    }

    /// Bytes plus where things landed.
    #[derive(Clone, Debug)]
    pub struct Written {
        pub bytes: Vec<u8>,
        /// Byte position of each KV (its key length field).
        pub kv_pos: Vec<usize>,
        /// Byte position of each tensor info (its name length field).
        pub tensor_info_pos: Vec<usize>,
        /// Byte position of each tensor's offset field.
        pub tensor_offset_pos: Vec<usize>,
        pub data_start: usize,
    }

    impl Default for TestGguf {
        fn default() -> Self {
            TestGguf {
                version: 3,
                alignment: 32,
                kvs: Vec::new(),
                tensors: Vec::new(),
                tensor_count_override: None,
                kv_count_override: None,
            }
        }
    }

    fn put_str(out: &mut Vec<u8>, s: &str) {
        out.extend_from_slice(&(s.len() as u64).to_le_bytes());
        out.extend_from_slice(s.as_bytes());
    }

    /// Encode one value (without its type id).
    pub fn put_value(out: &mut Vec<u8>, v: &GgufValue) {
        match v {
            GgufValue::U8(x) => out.push(*x),
            GgufValue::I8(x) => out.push(*x as u8),
            GgufValue::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
            GgufValue::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
            GgufValue::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
            GgufValue::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
            GgufValue::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
            GgufValue::Bool(x) => out.push(*x as u8),
            GgufValue::String(s) => put_str(out, s),
            GgufValue::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
            GgufValue::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
            GgufValue::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
            GgufValue::Array(a) => {
                out.extend_from_slice(&(a.elem_type as u32).to_le_bytes());
                out.extend_from_slice(&(a.values.len() as u64).to_le_bytes());
                for e in &a.values {
                    put_value(out, e);
                }
            }
        }
    }

    /// Convenience: an array of strings.
    pub fn str_array<S: AsRef<str>>(items: &[S]) -> GgufValue {
        GgufValue::Array(super::GgufArray {
            elem_type: GgufValueType::String,
            values: items
                .iter()
                .map(|s| GgufValue::String(s.as_ref().to_string()))
                .collect(),
        })
    }

    /// Convenience: an array of i32.
    pub fn i32_array(items: &[i32]) -> GgufValue {
        GgufValue::Array(super::GgufArray {
            elem_type: GgufValueType::I32,
            values: items.iter().map(|&i| GgufValue::I32(i)).collect(),
        })
    }

    /// Convenience: an array of f32.
    pub fn f32_array(items: &[f32]) -> GgufValue {
        GgufValue::Array(super::GgufArray {
            elem_type: GgufValueType::F32,
            values: items.iter().map(|&i| GgufValue::F32(i)).collect(),
        })
    }

    impl TestGguf {
        /// Add a KV.
        pub fn kv(mut self, key: &str, v: GgufValue) -> Self {
            self.kvs.push((key.to_string(), v));
            self
        }

        /// Add a tensor.
        pub fn tensor(mut self, t: TestTensor) -> Self {
            self.tensors.push(t);
            self
        }

        /// Serialize. Tensor data is packed in order, each aligned to `alignment`.
        pub fn write(&self) -> Written {
            let a = self.alignment.max(1) as usize;
            let mut out = Vec::new();
            out.extend_from_slice(b"GGUF");
            out.extend_from_slice(&self.version.to_le_bytes());
            let nt = self
                .tensor_count_override
                .unwrap_or(self.tensors.len() as u64);
            let nk = self.kv_count_override.unwrap_or(self.kvs.len() as u64);
            out.extend_from_slice(&nt.to_le_bytes());
            out.extend_from_slice(&nk.to_le_bytes());
            let mut kv_pos = Vec::new();
            for (k, v) in &self.kvs {
                kv_pos.push(out.len());
                put_str(&mut out, k);
                out.extend_from_slice(&(v.value_type() as u32).to_le_bytes());
                put_value(&mut out, v);
            }
            let mut tensor_info_pos = Vec::new();
            let mut tensor_offset_pos = Vec::new();
            let mut offsets = Vec::new();
            let mut cur = 0usize;
            for t in &self.tensors {
                tensor_info_pos.push(out.len());
                put_str(&mut out, &t.name);
                out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
                for d in &t.dims {
                    out.extend_from_slice(&d.to_le_bytes());
                }
                out.extend_from_slice(&t.type_id.to_le_bytes());
                tensor_offset_pos.push(out.len());
                let off = t.offset_override.unwrap_or(cur as u64);
                out.extend_from_slice(&off.to_le_bytes());
                offsets.push(cur);
                cur = (cur + t.data.len()).div_ceil(a) * a;
            }
            let data_start = out.len().div_ceil(a) * a;
            out.resize(data_start, 0);
            for (t, &off) in self.tensors.iter().zip(&offsets) {
                out.resize(data_start + off, 0);
                out.extend_from_slice(&t.data);
            }
            Written {
                bytes: out,
                kv_pos,
                tensor_info_pos,
                tensor_offset_pos,
                data_start,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testutil::*;
    use super::*;

    #[test]
    fn type_table_is_consistent() {
        for e in GGML_TYPES {
            assert_eq!(GgmlType::from_id(e.1), Some(e.0));
            assert_eq!(e.0.id(), e.1);
            assert_eq!(e.0.name(), e.4);
        }
        assert_eq!(GgmlType::from_id(4), None);
        assert_eq!(GgmlType::from_id(31), None);
        assert_eq!(GgmlType::Q4_0.bytes_for(64), Some(36));
        assert_eq!(GgmlType::Q4_1.bytes_for(32), Some(20));
        assert_eq!(GgmlType::Q8_0.bytes_for(32), Some(34));
        assert_eq!(GgmlType::Q6_K.bytes_for(256), Some(210));
        assert_eq!(GgmlType::BF16.bytes_for(3), Some(6));
        assert_eq!(GgmlType::Q4_0.bytes_for(33), None);
    }

    fn sample() -> TestGguf {
        TestGguf::default()
            .kv("general.architecture", GgufValue::String("llama".into()))
            .kv("llama.block_count", GgufValue::U32(2))
            .kv("llama.rope.freq_base", GgufValue::F32(10000.0))
            .kv("tokenizer.ggml.tokens", str_array(&["a", "b", "<s>"]))
            .kv(
                "nested",
                GgufValue::Array(GgufArray {
                    elem_type: GgufValueType::Array,
                    values: vec![i32_array(&[1, 2]), i32_array(&[])],
                }),
            )
            .tensor(TestTensor::new("w", &[4, 2], 0, vec![1u8; 32]))
            .tensor(TestTensor::new("q", &[32, 1], 2, vec![7u8; 18]))
    }

    #[test]
    fn roundtrip_sample() {
        let w = sample().write();
        let f = GgufFile::parse(w.bytes, "sample").unwrap();
        assert_eq!(f.version(), 3);
        assert_eq!(f.alignment(), 32);
        assert_eq!(f.get_str("general.architecture").unwrap(), "llama");
        assert_eq!(f.get_u32("llama.block_count").unwrap(), 2);
        assert_eq!(f.get_f32("llama.rope.freq_base").unwrap(), 10000.0);
        assert_eq!(
            f.get_str_array("tokenizer.ggml.tokens").unwrap(),
            vec!["a", "b", "<s>"]
        );
        assert_eq!(f.get_arr("nested").unwrap().values.len(), 2);
        assert!(matches!(
            f.get_u32("general.architecture"),
            Err(GgufError::WrongType { .. })
        ));
        assert!(matches!(
            f.get_u32("nope"),
            Err(GgufError::MissingKey { .. })
        ));
        assert_eq!(f.opt_u32("nope").unwrap(), None);
        let t = f.tensor("w").unwrap();
        assert_eq!(t.ggml_type, GgmlType::F32);
        assert_eq!(t.dims, &[4, 2]);
        assert_eq!(t.data, &[1u8; 32][..]);
        let q = f.tensor("q").unwrap();
        assert_eq!(q.ggml_type, GgmlType::Q4_0);
        assert_eq!(q.data, &[7u8; 18][..]);
        assert!(matches!(
            f.tensor("zz"),
            Err(GgufError::TensorNotFound { .. })
        ));
    }

    #[test]
    fn custom_alignment() {
        let w = sample().kv("general.alignment", GgufValue::U32(64)).write();
        let mut g = sample().kv("general.alignment", GgufValue::U32(64));
        g.alignment = 64;
        let w2 = g.write();
        // Written with 32-byte alignment while claiming 64: second tensor offset 32 is misaligned.
        assert!(GgufFile::parse(w.bytes, "a").is_err());
        let f = GgufFile::parse(w2.bytes, "b").unwrap();
        assert_eq!(f.alignment(), 64);
        assert_eq!(f.data_start() % 64, 0);
        assert_eq!(f.tensor("q").unwrap().data, &[7u8; 18][..]);
    }

    #[test]
    fn every_truncation_is_an_error() {
        let w = sample().write();
        for len in 0..w.bytes.len() {
            let r = GgufFile::parse(w.bytes[..len].to_vec(), "t");
            assert!(r.is_err(), "prefix of {len} bytes parsed");
        }
    }
}
