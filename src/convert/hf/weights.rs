//! The safetensors shards: which tensors exist, their shapes and dtypes, and reading one as
//! f32.

use super::*;
use crate::format::mmap::MappedInput;
use crate::format::MatrixData;
use crate::quant::QuantType;
use safetensors::tensor::{Metadata, TensorInfo};
use safetensors::{Dtype, SafeTensors};
use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

pub(super) struct Shard {
    pub(super) path: PathBuf,
    pub(super) map: MappedInput,
    /// Start of the data section (8 + header length).
    pub(super) data_start: usize,
    pub(super) meta: Metadata,
}

/// All tensors of a checkpoint, by name, across shards.
pub(super) struct Weights {
    pub(super) shards: Vec<Shard>,
    pub(super) by_name: HashMap<String, usize>,
}

/// A tensor as f32 with its shape.
pub(super) struct Tensor {
    pub(super) shape: Vec<usize>,
    pub(super) data: Vec<f32>,
}

impl Weights {
    pub(super) fn open(dir: &Path) -> Result<Weights, HfError> {
        let index = dir.join("model.safetensors.index.json");
        let single = dir.join("model.safetensors");
        let mut files: Vec<PathBuf> = Vec::new();
        let mut weight_map: Vec<(String, String)> = Vec::new();
        if index.is_file() {
            let v = read_json(&index, MAX_INDEX_BYTES)?;
            let wm = v
                .get("weight_map")
                .and_then(Value::as_object)
                .ok_or_else(|| HfError::Config {
                    file: index.clone(),
                    why: "no `weight_map` object".into(),
                })?;
            for (name, f) in wm {
                let f = f.as_str().ok_or_else(|| HfError::Config {
                    file: index.clone(),
                    why: format!("weight_map[{name}] is not a file name"),
                })?;
                if f.contains('/') || f.contains('\\') || f.starts_with('.') {
                    return Err(HfError::Config {
                        file: index.clone(),
                        why: format!("weight_map[{name}] = `{f}` is not a plain file name"),
                    });
                }
                if !files.iter().any(|p| p.file_name().is_some_and(|n| n == f)) {
                    files.push(dir.join(f));
                }
                weight_map.push((name.clone(), f.to_string()));
            }
            for f in &files {
                if !f.is_file() {
                    return Err(HfError::MissingFile {
                        dir: dir.to_path_buf(),
                        what: format!(
                            "shard {} listed in model.safetensors.index.json is missing",
                            f.file_name().unwrap_or_default().to_string_lossy()
                        ),
                    });
                }
            }
        } else if single.is_file() {
            files.push(single);
        } else {
            let rd = std::fs::read_dir(dir).map_err(|e| HfError::Io {
                file: dir.to_path_buf(),
                source: e,
            })?;
            for e in rd.flatten() {
                let p = e.path();
                if p.extension().is_some_and(|x| x == "safetensors") && p.is_file() {
                    files.push(p);
                }
            }
            files.sort();
            if files.is_empty() {
                return Err(HfError::MissingFile {
                    dir: dir.to_path_buf(),
                    what: "no *.safetensors file".into(),
                });
            }
        }
        let mut w = Weights {
            shards: Vec::new(),
            by_name: HashMap::new(),
        };
        for path in files {
            let map = MappedInput::open(&path).map_err(|e| HfError::Io {
                file: path.clone(),
                source: e,
            })?;
            let (n, meta) =
                SafeTensors::read_metadata(map.bytes()).map_err(|e| HfError::Safetensors {
                    file: path.clone(),
                    why: e.to_string(),
                })?;
            let si = w.shards.len();
            for name in meta.tensors().keys() {
                w.by_name.insert(name.clone(), si);
            }
            w.shards.push(Shard {
                path,
                map,
                data_start: 8 + n,
                meta,
            });
        }
        // The index must not promise tensors its shards do not hold.
        for (name, f) in &weight_map {
            match w.by_name.get(name) {
                Some(&si) if w.shards[si].path.file_name().is_some_and(|n| n == f.as_str()) => {}
                _ => {
                    return Err(HfError::Safetensors {
                        file: dir.join(f),
                        why: format!(
                            "model.safetensors.index.json maps `{name}` here, but the shard does not contain it"
                        ),
                    })
                }
            }
        }
        Ok(w)
    }

    pub(super) fn files(&self) -> String {
        self.shards
            .iter()
            .map(|s| s.path.file_name().unwrap_or_default().to_string_lossy())
            .collect::<Vec<_>>()
            .join(", ")
    }

    pub(super) fn has(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    pub(super) fn info(&self, name: &str) -> Option<(&Shard, &TensorInfo)> {
        let s = &self.shards[*self.by_name.get(name)?];
        Some((s, s.meta.info(name)?))
    }

    pub(super) fn missing(&self, name: &str) -> HfError {
        HfError::Missing {
            tensor: name.into(),
            files: self.files(),
        }
    }

    /// Loads a tensor as f32 (bf16 / f16 / f32 sources).
    pub(super) fn load(&self, name: &str) -> Result<Tensor, HfError> {
        let (s, info) = self.info(name).ok_or_else(|| self.missing(name))?;
        let terr = |why: String| HfError::Tensor {
            file: s.path.clone(),
            tensor: name.into(),
            why,
        };
        let (a, b) = info.data_offsets;
        let bytes = s
            .data_start
            .checked_add(a)
            .zip(s.data_start.checked_add(b))
            .and_then(|(a, b)| s.map.bytes().get(a..b))
            .ok_or_else(|| terr("data offsets past the end of the file".into()))?;
        let n: usize = info.shape.iter().product();
        let data: Vec<f32> = match info.dtype {
            Dtype::F32 => bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            Dtype::F16 => bytes
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            Dtype::BF16 => bytes
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            other => {
                return Err(terr(format!(
                    "dtype {other:?} is not supported (importable: F32, F16, BF16)"
                )))
            }
        };
        if data.len() != n {
            return Err(terr(format!(
                "{} bytes do not hold shape {:?}",
                bytes.len(),
                info.shape
            )));
        }
        if let Some(i) = data.iter().position(|v| !v.is_finite()) {
            return Err(terr(format!("non-finite value at element {i}")));
        }
        Ok(Tensor {
            shape: info.shape.clone(),
            data,
        })
    }

    pub(super) fn shaped(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, HfError> {
        let t = self.load(name)?;
        if t.shape != shape {
            let file = self
                .info(name)
                .map(|(s, _)| s.path.clone())
                .unwrap_or_default();
            return Err(HfError::Tensor {
                file,
                tensor: name.into(),
                why: format!("shape {:?}, but config.json implies {:?}", t.shape, shape),
            });
        }
        Ok(t.data)
    }

    pub(super) fn matrix(
        &self,
        name: &str,
        rows: usize,
        cols: usize,
        q: QuantType,
    ) -> Result<MatrixData, HfError> {
        let w = self.shaped(name, &[rows, cols])?;
        let m = MatrixData::quantize(q, rows, cols, &w);
        // Finite weights can still overflow an f16 block scale (|w| > 65504 · 7 for Q4_0).
        let file = self.info(name).map(|(s, _)| s.path.display().to_string());
        crate::convert::validate::matrix(&file.unwrap_or_default(), name, &m)?;
        Ok(m)
    }

    pub(super) fn vector(&self, name: &str, n: usize) -> Result<Vec<f32>, HfError> {
        self.shaped(name, &[n])
    }
}
