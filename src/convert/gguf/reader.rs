//! [`GgufFile`]: opening (mmap) and parsing a GGUF container (header, metadata, tensor infos,
//! data section), validating all of it against the bytes present, and zero-copy tensor views.

use super::cursor::{align_up, Cursor, VALUE_COST};
use super::{
    GgmlType, GgufError, GgufValue, GgufValueType, DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_DIMS,
    MAX_METADATA_MEMORY, MAX_TENSORS,
};
use crate::format::mmap::MappedInput;
use std::collections::HashMap;
use std::fmt;
use std::path::Path;
use std::sync::Arc;

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
    pub(super) name: String,
    bytes: Bytes,
    /// The mapping behind `bytes` when opened from a path (for [`GgufFile::input_changed`]).
    input: Option<Arc<MappedInput>>,
    version: u32,
    pub(super) metadata: Vec<(String, GgufValue)>,
    pub(super) kv_index: HashMap<String, usize>,
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
        let (file, meta) = crate::input::open_nonblocking(path).map_err(io)?;
        if let Some(kind) = crate::input::non_regular_kind(&meta) {
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
