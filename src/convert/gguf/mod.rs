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
//! Parts: [`types`] (GGML tensor types), [`value`] (metadata values), [`cursor`] (the bounded
//! byte reader), [`reader`] ([`GgufFile`]: open, parse, tensor views), [`metadata`] (typed
//! accessors), [`error`]. Tokenizer building from the metadata lives in `convert::gguf_tokenizer`.
//! The small GGUF writer tests use to build valid and corrupted files is
//! `tests/common/gguf_writer.rs`; the library's own unit tests include it as `testutil`
//! (`cfg(test)` only, never compiled into the library).

mod cursor;
mod error;
mod metadata;
mod reader;
mod types;
mod value;

pub use error::GgufError;
pub use reader::{GgufFile, GgufTensorInfo, TensorView};
pub use types::GgmlType;
pub use value::{GgufArray, GgufValue, GgufValueType};

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

/// The test GGUF writer (`tests/common/gguf_writer.rs`), for the unit tests only.
#[cfg(test)]
#[path = "../../../tests/common/gguf_writer.rs"]
pub mod testutil;

#[cfg(test)]
mod tests {
    use super::testutil::*;
    use super::types::GGML_TYPES;
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
