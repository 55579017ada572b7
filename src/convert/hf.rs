//! HuggingFace safetensors directory → `.cflow` import.
//!
//! Reads `config.json`, `model.safetensors` (or the shards listed in
//! `model.safetensors.index.json`, or every `*.safetensors` when there is no index),
//! `tokenizer.json`, `tokenizer_config.json` and `generation_config.json`. Shards are
//! memory-mapped and converted one tensor at a time (bf16/f16/f32 → f32 → the target quant
//! type), one layer is held in memory at a time, and the output is written atomically
//! (`CflowWriter` writes a temporary file and renames it).
//!
//! Architectures: Llama, Mistral (sliding window), Qwen2 (Q/K/V bias), Mixtral (softmax over
//! the top-k router logits), OLMoE (whole-projection Q/K RMSNorm → `FLAG_QK_NORM`, softmax over
//! all experts then top-k, optional `clip_qkv`) and our `PipelineNativeForCausalLM` (delays,
//! combine style, MoE; the `config.json` schema and tensor names are in `docs/FORMAT.md`). HF
//! rotary embeddings are split-half (`rotate_half`), which is `RopeStyle::SplitHalf`: no Q/K row
//! permutation is needed.

use crate::format::mmap::MappedInput;
use crate::format::{CflowWriter, ExpertData, FormatError, LayerData, MatrixData, VocabData};
use crate::model::{
    CombineStyle, FfnAct, ModelConfig, ModelMeta, RopeStyle, RouterNorm, FLAG_QKV_BIAS,
    FLAG_QK_NORM, FLAG_TIED_EMBED,
};
use crate::quant::QuantType;
use safetensors::tensor::{Metadata, TensorInfo};
use safetensors::{Dtype, SafeTensors};
use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The `architectures` values this importer accepts.
pub const SUPPORTED: [&str; 6] = [
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "MixtralForCausalLM",
    "OlmoeForCausalLM",
    "PipelineNativeForCausalLM",
];

/// Default context when the config's `max_position_embeddings` is larger (the KV cache is
/// allocated for `max_ctx`); `--max-ctx` overrides.
pub const DEFAULT_MAX_CTX: usize = 8192;

#[derive(Debug, thiserror::Error)]
pub enum HfError {
    #[error("{file}: {source}")]
    Io {
        file: PathBuf,
        source: std::io::Error,
    },
    #[error("{file}: invalid JSON: {source}")]
    Json {
        file: PathBuf,
        source: serde_json::Error,
    },
    #[error("{dir}: not a HuggingFace model directory: {what} (need config.json and model.safetensors, or model.safetensors.index.json with its shards)")]
    MissingFile { dir: PathBuf, what: String },
    #[error("{file}: {why}")]
    Config { file: PathBuf, why: String },
    #[error("{file}: unsupported architecture `{arch}` (supported: {})", SUPPORTED.join(", "))]
    Arch { file: PathBuf, arch: String },
    #[error("{file}: {arch}: {why} (supported: {})", SUPPORTED.join(", "))]
    Unsupported {
        file: PathBuf,
        arch: String,
        why: String,
    },
    #[error("{file}: corrupt safetensors file: {why}")]
    Safetensors { file: PathBuf, why: String },
    #[error("missing tensor `{tensor}` (looked in {files})")]
    Missing { tensor: String, files: String },
    #[error("{file}: tensor `{tensor}`: {why}")]
    Tensor {
        file: PathBuf,
        tensor: String,
        why: String,
    },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error(transparent)]
    Format(#[from] FormatError),
    #[error(transparent)]
    NonFinite(#[from] super::validate::NonFiniteTensor),
}

/// Size caps for the small files an import reads whole (`config.json`, `generation_config.json`,
/// `chat_template.jinja`; `tokenizer_config.json` and the shard index can legitimately list
/// many tokens / tensors; `tokenizer.json` holds a whole vocabulary).
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;
pub const MAX_TEMPLATE_FILE_BYTES: u64 = 1 << 20;
pub const MAX_TOKENIZER_CONFIG_BYTES: u64 = 16 << 20;
pub const MAX_INDEX_BYTES: u64 = 16 << 20;
pub const MAX_TOKENIZER_JSON_BYTES: u64 = 64 << 20;

fn io_err(path: &Path, kind: std::io::ErrorKind, why: String) -> HfError {
    HfError::Io {
        file: path.to_path_buf(),
        source: std::io::Error::new(kind, why),
    }
}

/// Whether `real` (a canonical path) lies inside the model directory `root` (canonical). A
/// HuggingFace hub cache snapshot (`…/snapshots/<rev>/`) holds symlinks into the repository's
/// `…/blobs/`, which count as inside.
fn inside_model_dir(root: &Path, real: &Path) -> bool {
    if real.starts_with(root) {
        return true;
    }
    let snapshots = root.parent();
    if snapshots.and_then(Path::file_name) == Some(std::ffi::OsStr::new("snapshots")) {
        if let Some(repo) = snapshots.and_then(Path::parent) {
            return real.starts_with(repo.join("blobs"));
        }
    }
    false
}

/// Read a small model-directory file as UTF-8 text: only a regular file inside the directory
/// (symlinks are resolved and must stay inside), at most `cap` bytes, opened without blocking
/// (a FIFO is refused, never waited on). `Ok(None)` when the file does not exist; every other
/// failure is an error naming the file.
fn read_model_file(path: &Path, cap: u64) -> Result<Option<String>, HfError> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let real = match std::fs::canonicalize(path) {
        Ok(r) => r,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // A dangling symlink is not "absent": it names something that is not there.
            if std::fs::symlink_metadata(path).is_ok() {
                return Err(io_err(
                    path,
                    std::io::ErrorKind::NotFound,
                    "is a symlink to a file that does not exist".into(),
                ));
            }
            return Ok(None);
        }
        Err(e) => {
            return Err(HfError::Io {
                file: path.to_path_buf(),
                source: e,
            })
        }
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let root = std::fs::canonicalize(dir).map_err(|e| HfError::Io {
        file: dir.to_path_buf(),
        source: e,
    })?;
    if !inside_model_dir(&root, &real) {
        return Err(io_err(
            path,
            std::io::ErrorKind::PermissionDenied,
            format!(
                "resolves to {}, outside the model directory {}: refusing to read it",
                real.display(),
                root.display()
            ),
        ));
    }
    let not_regular = |ft: std::fs::FileType| {
        io_err(
            path,
            std::io::ErrorKind::InvalidInput,
            format!("is not a regular file ({ft:?}): refusing to read it"),
        )
    };
    let md = std::fs::metadata(&real).map_err(|e| HfError::Io {
        file: path.to_path_buf(),
        source: e,
    })?;
    if !md.is_file() {
        return Err(not_regular(md.file_type()));
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
        .open(&real)
        .map_err(|e| HfError::Io {
            file: path.to_path_buf(),
            source: e,
        })?;
    // Re-check on the open handle: the path may have been swapped since the check above.
    let md = file.metadata().map_err(|e| HfError::Io {
        file: path.to_path_buf(),
        source: e,
    })?;
    if !md.is_file() {
        return Err(not_regular(md.file_type()));
    }
    let too_big = |n: u64| {
        io_err(
            path,
            std::io::ErrorKind::InvalidData,
            format!("is {n} bytes, more than the {cap}-byte limit for this file"),
        )
    };
    if md.len() > cap {
        return Err(too_big(md.len()));
    }
    let mut bytes = Vec::with_capacity(md.len() as usize);
    // Read at most cap + 1 bytes: a file growing while it is read is caught too.
    file.take(cap + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| HfError::Io {
            file: path.to_path_buf(),
            source: e,
        })?;
    if bytes.len() as u64 > cap {
        return Err(too_big(bytes.len() as u64));
    }
    String::from_utf8(bytes).map(Some).map_err(|e| {
        io_err(
            path,
            std::io::ErrorKind::InvalidData,
            format!("is not valid UTF-8 ({e})"),
        )
    })
}

fn parse_json(path: &Path, text: &str) -> Result<Value, HfError> {
    serde_json::from_str(text).map_err(|e| HfError::Json {
        file: path.to_path_buf(),
        source: e,
    })
}

fn read_json(path: &Path, cap: u64) -> Result<Value, HfError> {
    match read_model_file(path, cap)? {
        Some(text) => parse_json(path, &text),
        None => Err(io_err(
            path,
            std::io::ErrorKind::NotFound,
            "no such file".into(),
        )),
    }
}

fn read_json_opt(path: &Path, cap: u64) -> Result<Option<Value>, HfError> {
    match read_model_file(path, cap)? {
        Some(text) => parse_json(path, &text).map(Some),
        None => Ok(None),
    }
}

// ---------------------------------------------------------------------------------------------
// Safetensors shards

struct Shard {
    path: PathBuf,
    map: MappedInput,
    /// Start of the data section (8 + header length).
    data_start: usize,
    meta: Metadata,
}

/// All tensors of a checkpoint, by name, across shards.
struct Weights {
    shards: Vec<Shard>,
    by_name: HashMap<String, usize>,
}

/// A tensor as f32 with its shape.
struct Tensor {
    shape: Vec<usize>,
    data: Vec<f32>,
}

impl Weights {
    fn open(dir: &Path) -> Result<Weights, HfError> {
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

    fn files(&self) -> String {
        self.shards
            .iter()
            .map(|s| s.path.file_name().unwrap_or_default().to_string_lossy())
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn has(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    fn info(&self, name: &str) -> Option<(&Shard, &TensorInfo)> {
        let s = &self.shards[*self.by_name.get(name)?];
        Some((s, s.meta.info(name)?))
    }

    fn missing(&self, name: &str) -> HfError {
        HfError::Missing {
            tensor: name.into(),
            files: self.files(),
        }
    }

    /// Loads a tensor as f32 (bf16 / f16 / f32 sources).
    fn load(&self, name: &str) -> Result<Tensor, HfError> {
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

    fn shaped(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, HfError> {
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

    fn matrix(
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
        super::validate::matrix(&file.unwrap_or_default(), name, &m)?;
        Ok(m)
    }

    fn vector(&self, name: &str, n: usize) -> Result<Vec<f32>, HfError> {
        self.shaped(name, &[n])
    }
}

// ---------------------------------------------------------------------------------------------
// config.json

struct Cfg<'a> {
    v: &'a Value,
    file: &'a Path,
}

impl Cfg<'_> {
    fn err(&self, why: String) -> HfError {
        HfError::Config {
            file: self.file.to_path_buf(),
            why,
        }
    }
    fn usize_opt(&self, k: &str) -> Result<Option<usize>, HfError> {
        match self.v.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(x) => x
                .as_u64()
                .map(|n| Some(n as usize))
                .ok_or_else(|| self.err(format!("`{k}` must be a non-negative integer, got {x}"))),
        }
    }
    fn usize(&self, k: &str) -> Result<usize, HfError> {
        self.usize_opt(k)?
            .ok_or_else(|| self.err(format!("missing `{k}`")))
    }
    fn f32_opt(&self, k: &str) -> Result<Option<f32>, HfError> {
        match self.v.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(x) => x
                .as_f64()
                .map(|n| Some(n as f32))
                .ok_or_else(|| self.err(format!("`{k}` must be a number, got {x}"))),
        }
    }
    fn bool_opt(&self, k: &str) -> Result<Option<bool>, HfError> {
        match self.v.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(x) => x
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.err(format!("`{k}` must be true or false, got {x}"))),
        }
    }
    fn str_opt(&self, k: &str) -> Result<Option<&str>, HfError> {
        match self.v.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(x) => x
                .as_str()
                .map(Some)
                .ok_or_else(|| self.err(format!("`{k}` must be a string, got {x}"))),
        }
    }
    /// `bos_token_id` / `eos_token_id`: an integer or a list of integers.
    fn ids(&self, k: &str) -> Vec<u32> {
        match self.v.get(k) {
            Some(Value::Number(n)) => n.as_u64().map(|n| vec![n as u32]).unwrap_or_default(),
            Some(Value::Array(a)) => a
                .iter()
                .filter_map(|x| x.as_u64().map(|n| n as u32))
                .collect(),
            _ => Vec::new(),
        }
    }
}

/// Which family a config describes (decides tensor names and semantics).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Family {
    Llama,
    Mistral,
    Qwen2,
    Mixtral,
    Olmoe,
    PipelineNative,
}

/// Tensor names of the MoE block (per-expert tensors, or the fused/stacked layout newer
/// `transformers` versions write).
struct MoeNames {
    router: String,
    per_expert: [String; 3],
    fused_gate_up: String,
    fused_down: String,
}

fn moe_names(fam: Family, i: usize) -> MoeNames {
    let l = format!("model.layers.{i}");
    match fam {
        Family::Mixtral => MoeNames {
            router: format!("{l}.block_sparse_moe.gate.weight"),
            per_expert: [
                format!("{l}.block_sparse_moe.experts.{{e}}.w1.weight"),
                format!("{l}.block_sparse_moe.experts.{{e}}.w3.weight"),
                format!("{l}.block_sparse_moe.experts.{{e}}.w2.weight"),
            ],
            fused_gate_up: format!("{l}.mlp.experts.gate_up_proj"),
            fused_down: format!("{l}.mlp.experts.down_proj"),
        },
        Family::Olmoe => MoeNames {
            router: format!("{l}.mlp.gate.weight"),
            per_expert: [
                format!("{l}.mlp.experts.{{e}}.gate_proj.weight"),
                format!("{l}.mlp.experts.{{e}}.up_proj.weight"),
                format!("{l}.mlp.experts.{{e}}.down_proj.weight"),
            ],
            fused_gate_up: format!("{l}.mlp.experts.gate_up_proj"),
            fused_down: format!("{l}.mlp.experts.down_proj"),
        },
        _ => MoeNames {
            router: format!("{l}.moe.router.weight"),
            per_expert: [
                format!("{l}.moe.experts.{{e}}.gate_proj.weight"),
                format!("{l}.moe.experts.{{e}}.up_proj.weight"),
                format!("{l}.moe.experts.{{e}}.down_proj.weight"),
            ],
            fused_gate_up: format!("{l}.moe.experts.gate_up_proj"),
            fused_down: format!("{l}.moe.experts.down_proj"),
        },
    }
}

fn parse_style(s: &str) -> Option<CombineStyle> {
    let k: String = s
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .collect::<String>()
        .to_ascii_lowercase();
    Some(match k.as_str() {
        "parallelsqrt2" | "0" => CombineStyle::ParallelSqrt2,
        "delayedsum" | "1" => CombineStyle::DelayedSum,
        "asyncexperts" | "2" => CombineStyle::AsyncExperts,
        "sequential" | "3" => CombineStyle::Sequential,
        "decoupledstreams" | "4" => CombineStyle::DecoupledStreams,
        "pipelineregisters" | "5" => CombineStyle::PipelineRegisters,
        "fixedpoint" | "6" => CombineStyle::FixedPoint,
        _ => return None,
    })
}

/// Everything decided from config.json before any tensor is read.
struct Plan {
    fam: Family,
    cfg: ModelConfig,
    /// Dense FFN present.
    dense: bool,
    /// Tied embeddings decided by the config (or by a missing `lm_head.weight`).
    tied: bool,
}

fn plan(dir: &Path, w: &Weights, max_ctx: Option<usize>, q: QuantType) -> Result<Plan, HfError> {
    let cfg_path = dir.join("config.json");
    if !cfg_path.is_file() {
        return Err(HfError::MissingFile {
            dir: dir.to_path_buf(),
            what: "no config.json".into(),
        });
    }
    let v = read_json(&cfg_path, MAX_CONFIG_BYTES)?;
    let c = Cfg {
        v: &v,
        file: &cfg_path,
    };
    let arch = match v.get("architectures").and_then(Value::as_array) {
        Some(a) if !a.is_empty() => a[0].as_str().unwrap_or("").to_string(),
        _ => {
            return Err(c.err(format!(
                "no `architectures` list (supported: {})",
                SUPPORTED.join(", ")
            )))
        }
    };
    let unsupported = |why: String| HfError::Unsupported {
        file: cfg_path.clone(),
        arch: arch.clone(),
        why,
    };
    let fam = match arch.as_str() {
        "LlamaForCausalLM" => Family::Llama,
        "MistralForCausalLM" => Family::Mistral,
        "Qwen2ForCausalLM" => Family::Qwen2,
        "MixtralForCausalLM" => Family::Mixtral,
        "OlmoeForCausalLM" => Family::Olmoe,
        "PipelineNativeForCausalLM" => Family::PipelineNative,
        _ => {
            return Err(HfError::Arch {
                file: cfg_path.clone(),
                arch,
            })
        }
    };

    let d = c.usize("hidden_size")?;
    let n_layers = c.usize("num_hidden_layers")?;
    let n_heads = c.usize("num_attention_heads")?;
    let n_kv = c.usize_opt("num_key_value_heads")?.unwrap_or(n_heads);
    if n_heads == 0 || n_kv == 0 || !n_heads.is_multiple_of(n_kv) {
        return Err(c.err(format!(
            "num_key_value_heads {n_kv} must divide num_attention_heads {n_heads}"
        )));
    }
    let head_dim = match c.usize_opt("head_dim")? {
        Some(h) => h,
        None if d.is_multiple_of(n_heads) => d / n_heads,
        None => {
            return Err(c.err(format!(
                "hidden_size {d} is not a multiple of {n_heads} heads"
            )))
        }
    };
    let vocab = c.usize("vocab_size")?;
    let eps = c.f32_opt("rms_norm_eps")?.unwrap_or(1e-6);
    // rope_theta: top level, or inside `rope_parameters` (newer transformers).
    let rp = v.get("rope_parameters").filter(|x| x.is_object());
    let theta = match (
        c.f32_opt("rope_theta")?,
        rp.and_then(|r| r.get("rope_theta")),
    ) {
        (Some(t), _) => t,
        (None, Some(t)) => t.as_f64().unwrap_or(10000.0) as f32,
        _ => 10000.0,
    };
    if !crate::model::rope_theta_ok(theta) {
        return Err(c.err(format!(
            "rope_theta = {theta}: {}",
            crate::model::ROPE_THETA_RULE
        )));
    }
    for key in ["rope_scaling", "rope_parameters"] {
        if let Some(rs) = v.get(key).filter(|x| x.is_object()) {
            let ty = rs
                .get("rope_type")
                .or_else(|| rs.get("type"))
                .and_then(Value::as_str)
                .unwrap_or("default");
            if ty != "default" {
                return Err(unsupported(format!(
                    "{key}.rope_type `{ty}` (RoPE scaling) is not supported; only plain RoPE"
                )));
            }
        }
    }
    let rope_dims = match c.f32_opt("partial_rotary_factor")? {
        Some(f) if f > 0.0 && f < 1.0 => {
            let r = (head_dim as f32 * f) as u32;
            if !r.is_multiple_of(2) {
                return Err(c.err(format!("partial rotary dims {r} must be even")));
            }
            r
        }
        _ => 0,
    };
    let ffn_act = match c.str_opt("hidden_act")?.unwrap_or("silu") {
        "silu" | "swish" => FfnAct::Swiglu,
        "gelu_pytorch_tanh" | "gelu_new" | "gelu_tanh" => FfnAct::Geglu,
        other => {
            return Err(unsupported(format!(
                "hidden_act `{other}` (supported: silu, gelu_pytorch_tanh)"
            )))
        }
    };
    if c.bool_opt("mlp_bias")?.unwrap_or(false) {
        return Err(unsupported("mlp_bias = true (FFN biases)".into()));
    }
    let attention_bias = c.bool_opt("attention_bias")?.unwrap_or(false);
    let qkv_bias = match fam {
        Family::Qwen2 => true,
        Family::PipelineNative => attention_bias,
        _ if attention_bias => {
            return Err(unsupported(
                "attention_bias = true puts a bias on o_proj too, which .cflow cannot store \
                 (Q/K/V biases only)"
                    .into(),
            ))
        }
        _ => false,
    };

    // MoE and dense geometry.
    let (mut dense, mut d_ff) = (true, c.usize_opt("intermediate_size")?.unwrap_or(0));
    let (mut n_experts, mut top_k, mut expert_ffn) = (0, 0, 0);
    let mut router_norm = RouterNorm::SoftmaxTopk;
    let (mut style, mut dd, mut de) = (CombineStyle::Sequential, 0usize, 0usize);
    let (mut merge_interval, mut fp_iters) = (3u32, 3u32);
    let mut arch_name = match fam {
        Family::Llama => "llama",
        Family::Mistral => "mistral",
        Family::Qwen2 => "qwen2",
        Family::Mixtral => "mixtral",
        Family::Olmoe => "olmoe",
        Family::PipelineNative => "pipeline_native",
    }
    .to_string();
    let mut clip_qkv = 0.0f32;
    match fam {
        Family::Mixtral => {
            dense = false;
            n_experts = c.usize("num_local_experts")?;
            top_k = c.usize("num_experts_per_tok")?;
            expert_ffn = d_ff;
            d_ff = 0;
        }
        Family::Olmoe => {
            // Every layer is MoE; `intermediate_size` is the expert hidden size. The router takes
            // a softmax over all experts, then the top-k: without `norm_topk_prob` the selected
            // probabilities are used as they are (SoftmaxAll); renormalising them over the top-k
            // equals a softmax over the top-k logits (SoftmaxTopk).
            dense = false;
            n_experts = c
                .usize_opt("num_experts")?
                .or(c.usize_opt("num_local_experts")?)
                .ok_or_else(|| c.err("missing `num_experts`".into()))?;
            top_k = c.usize("num_experts_per_tok")?;
            expert_ffn = d_ff;
            d_ff = 0;
            router_norm = if c.bool_opt("norm_topk_prob")?.unwrap_or(false) {
                RouterNorm::SoftmaxTopk
            } else {
                RouterNorm::SoftmaxAll
            };
            if let Some(cl) = c.f32_opt("clip_qkv")? {
                if !(cl.is_finite() && cl > 0.0) {
                    return Err(c.err(format!("clip_qkv {cl} must be > 0 (or null)")));
                }
                clip_qkv = cl;
            }
        }
        Family::PipelineNative => {
            let s = c
                .str_opt("combine_style")?
                .ok_or_else(|| c.err("missing `combine_style`".into()))?;
            style = parse_style(s).ok_or_else(|| {
                c.err(format!(
                    "combine_style `{s}` (expected parallel_sqrt2, delayed_sum, async_experts, \
                     sequential, decoupled_streams, pipeline_registers or fixed_point)"
                ))
            })?;
            dd = c.usize_opt("dense_delay")?.unwrap_or(0);
            de = c.usize_opt("expert_delay")?.unwrap_or(0);
            n_experts = c.usize_opt("num_experts")?.unwrap_or(0);
            top_k = c.usize_opt("num_experts_per_tok")?.unwrap_or(0);
            expert_ffn = c.usize_opt("moe_intermediate_size")?.unwrap_or(0);
            dense = d_ff > 0;
            router_norm = match c.str_opt("router_norm")?.unwrap_or("softmax_topk") {
                "softmax_topk" => RouterNorm::SoftmaxTopk,
                "softmax_all" => RouterNorm::SoftmaxAll,
                other => {
                    return Err(c.err(format!(
                        "router_norm `{other}` (expected softmax_topk or softmax_all)"
                    )))
                }
            };
            let small = |k: &str, n: usize| {
                u32::try_from(n).map_err(|_| c.err(format!("`{k}` = {n} is out of range")))
            };
            merge_interval = small(
                "merge_interval",
                c.usize_opt("merge_interval")?.unwrap_or(3),
            )?;
            fp_iters = small(
                "fixed_point_iterations",
                c.usize_opt("fixed_point_iterations")?.unwrap_or(3),
            )?;
            if merge_interval == 0 || fp_iters == 0 {
                return Err(c.err("merge_interval and fixed_point_iterations must be >= 1".into()));
            }
            if dd > 255 || de > 255 {
                return Err(c.err("dense_delay and expert_delay must be <= 255".into()));
            }
            if let Some(a) = c.str_opt("variant")? {
                arch_name = a.to_string();
            }
            if n_experts > 0 && (top_k == 0 || expert_ffn == 0) {
                return Err(c.err(
                    "num_experts > 0 needs num_experts_per_tok and moe_intermediate_size".into(),
                ));
            }
            if !dense && n_experts == 0 {
                return Err(c.err("neither a dense FFN nor experts".into()));
            }
        }
        _ => {}
    }
    if n_experts == 0 {
        if !dense {
            return Err(c.err("neither a dense FFN nor experts".into()));
        }
        // A dense model: MoE keys without experts (`num_experts_per_tok`, an expert width) mean
        // nothing; the file format stores top-k 0 and no expert width then.
        top_k = 0;
        expert_ffn = 0;
    }
    if n_experts > 0 && (top_k == 0 || top_k > n_experts || n_experts > 255) {
        return Err(c.err(format!(
            "top-k {top_k} must be in 1..={n_experts} and experts <= 255"
        )));
    }
    let eff_layers = if style == CombineStyle::FixedPoint {
        n_layers.saturating_mul(fp_iters as usize)
    } else {
        n_layers
    };
    if n_layers == 0 || n_layers > 4096 || dd >= eff_layers.max(1) {
        return Err(c.err(format!(
            "num_hidden_layers {n_layers} must be in 1..=4096 and exceed dense_delay {dd}"
        )));
    }
    if d == 0 || vocab == 0 || head_dim == 0 || !head_dim.is_multiple_of(2) {
        return Err(c.err(format!(
            "bad geometry: hidden_size {d}, vocab_size {vocab}, head_dim {head_dim} (must be even)"
        )));
    }
    if dense && d_ff == 0 {
        return Err(c.err("intermediate_size must be > 0".into()));
    }
    if q.is_blocked() {
        for (what, n) in [
            ("hidden_size", d),
            (
                "num_attention_heads × head_dim",
                n_heads.saturating_mul(head_dim),
            ),
            ("intermediate_size", d_ff),
            ("expert intermediate size", expert_ffn),
        ] {
            if !n.is_multiple_of(q.block_len()) {
                return Err(c.err(format!(
                    "{what} = {n} is not a multiple of {}, which {q} needs; use --quant f16 or f32",
                    q.block_len()
                )));
            }
        }
    }
    for (what, n) in [
        ("hidden_size", d),
        ("q dim", n_heads.saturating_mul(head_dim)),
        ("intermediate size", d_ff.max(expert_ffn)),
    ] {
        if n > u16::MAX as usize {
            return Err(c.err(format!("{what} {n} exceeds 65535 columns")));
        }
    }

    // Sliding window: Mistral everywhere; Qwen2 from max_window_layers on when enabled;
    // `layer_types` when present.
    let window = c
        .usize_opt("sliding_window")?
        .unwrap_or(0)
        .min(u32::MAX as usize) as u32;
    let mut sliding = Vec::new();
    if let Some(lt) = v.get("layer_types").and_then(Value::as_array) {
        if lt.len() != n_layers {
            return Err(c.err(format!("layer_types has {} entries", lt.len())));
        }
        for t in lt {
            sliding.push(match t.as_str() {
                Some("full_attention") => 0,
                Some("sliding_attention") => window,
                other => return Err(c.err(format!("layer_types entry {other:?}"))),
            });
        }
    } else {
        match fam {
            Family::Mistral | Family::Mixtral | Family::PipelineNative => {
                sliding = vec![window; n_layers]
            }
            Family::Qwen2 => {
                if c.bool_opt("use_sliding_window")?.unwrap_or(false) {
                    let from = c.usize_opt("max_window_layers")?.unwrap_or(n_layers);
                    sliding = (0..n_layers)
                        .map(|i| if i >= from { window } else { 0 })
                        .collect();
                }
            }
            Family::Llama | Family::Olmoe => {}
        }
    }
    if sliding.iter().all(|&w| w == 0) {
        sliding.clear();
    }

    // Tied embeddings: the config says so, or the checkpoint has no lm_head.
    let tie_cfg = c.bool_opt("tie_word_embeddings")?;
    let tied = match tie_cfg {
        Some(true) => true,
        Some(false) => false,
        None => !w.has("lm_head.weight"),
    };
    let ctx_cfg = c.usize_opt("max_position_embeddings")?.unwrap_or(4096);
    let max_ctx = max_ctx.unwrap_or(ctx_cfg.min(DEFAULT_MAX_CTX)).max(1);

    let mut eos = c.ids("eos_token_id");
    let bos = c.ids("bos_token_id").first().copied();
    if let Some(g) = read_json_opt(&dir.join("generation_config.json"), MAX_CONFIG_BYTES)? {
        let gc = Cfg {
            v: &g,
            file: &cfg_path,
        };
        for id in gc.ids("eos_token_id") {
            if !eos.contains(&id) {
                eos.push(id);
            }
        }
    }
    let final_softcap = c.f32_opt("final_logit_softcapping")?.unwrap_or(0.0);
    let attn_softcap = c.f32_opt("attn_logit_softcapping")?.unwrap_or(0.0);
    let meta = ModelMeta {
        arch: arch_name,
        name: dir
            .file_name()
            .map(|s| s.to_string_lossy().to_string())
            .unwrap_or_else(|| "imported".into()),
        synthetic: false,
        rope_style: RopeStyle::SplitHalf,
        rope_dims,
        sliding_window: sliding,
        attn_logit_softcap: attn_softcap,
        clip_qkv,
        ffn_act,
        router_norm,
        merge_interval,
        fixed_point_iterations: fp_iters,
        bos_id: bos,
        eos_ids: eos,
        add_bos: false,
        tokenizer_json: None,
        chat_template: None,
        provenance: serde_json::json!({
            "source": dir.file_name().map(|s| s.to_string_lossy().to_string()),
            "architecture": arch,
            "converter": "cflow-tui import (HF safetensors)",
            "quant": q.name(),
        }),
        ..Default::default()
    };
    let cfg = ModelConfig {
        n_layers,
        d_model: d,
        n_heads,
        n_kv_heads: n_kv,
        head_dim,
        d_ff: if dense { d_ff } else { 0 },
        n_experts,
        top_k,
        expert_ffn,
        vocab,
        max_ctx,
        rms_eps: eps,
        rope_theta: theta,
        dense_delay: dd,
        expert_delay: de,
        combine_style: style,
        feature_flags: if tied { FLAG_TIED_EMBED } else { 0 }
            | if qkv_bias { FLAG_QKV_BIAS } else { 0 }
            | if fam == Family::Olmoe {
                FLAG_QK_NORM
            } else {
                0
            },
        final_logit_softcap: final_softcap,
        meta,
    };
    Ok(Plan {
        fam,
        cfg,
        dense,
        tied,
    })
}

// ---------------------------------------------------------------------------------------------
// Tokenizer

fn token_str(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(Value::as_str).map(String::from),
        _ => None,
    }
}

fn load_tokenizer(dir: &Path, meta: &mut ModelMeta, vocab: usize) -> Result<(), HfError> {
    let tj = dir.join("tokenizer.json");
    let tc = read_json_opt(
        &dir.join("tokenizer_config.json"),
        MAX_TOKENIZER_CONFIG_BYTES,
    )?;
    let tok = match read_model_file(&tj, MAX_TOKENIZER_JSON_BYTES)? {
        Some(text) => {
            let t = crate::chat::tokenizer_load::load(&text)
                .map_err(|e| HfError::Tokenizer(format!("{}: {e}", tj.display())))?;
            meta.tokenizer_json = Some(std::sync::Arc::from(text));
            Some(t)
        }
        None => None,
    };
    let Some(tc) = tc else {
        return Ok(());
    };
    meta.chat_template = match tc.get("chat_template") {
        Some(Value::String(s)) => Some(s.clone()),
        // A list of named templates: take "default", else the first.
        Some(Value::Array(a)) => a
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
            .or_else(|| a.first())
            .and_then(|t| t.get("template"))
            .and_then(Value::as_str)
            .map(String::from),
        _ => None,
    };
    if meta.chat_template.is_none() {
        meta.chat_template =
            read_model_file(&dir.join("chat_template.jinja"), MAX_TEMPLATE_FILE_BYTES)?;
    }
    if let Some(b) = tc.get("add_bos_token").and_then(Value::as_bool) {
        meta.add_bos = b;
    }
    if let Some(t) = &tok {
        let id = |k: &str| token_str(tc.get(k)).and_then(|s| t.token_to_id(&s));
        if meta.bos_id.is_none() {
            meta.bos_id = id("bos_token");
        }
        if let Some(e) = id("eos_token") {
            if !meta.eos_ids.contains(&e) {
                meta.eos_ids.push(e);
            }
        }
    }
    if let Some(b) = meta.bos_id {
        if b as usize >= vocab {
            meta.bos_id = None;
        }
    }
    meta.eos_ids.retain(|&e| (e as usize) < vocab);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Import

fn experts(
    w: &Weights,
    names: &MoeNames,
    c: &ModelConfig,
    q: QuantType,
) -> Result<Vec<ExpertData>, HfError> {
    let (e_n, f, d) = (c.n_experts, c.expert_ffn, c.d_model);
    let per = |k: usize, e: usize| names.per_expert[k].replace("{e}", &e.to_string());
    if w.has(&per(0, 0)) {
        return (0..e_n)
            .map(|e| {
                Ok(ExpertData {
                    gate: w.matrix(&per(0, e), f, d, q)?,
                    up: w.matrix(&per(1, e), f, d, q)?,
                    down: w.matrix(&per(2, e), d, f, q)?,
                })
            })
            .collect();
    }
    if !w.has(&names.fused_gate_up) {
        return Err(w.missing(&per(0, 0)));
    }
    // Stacked layout: gate_up_proj [E, 2F, d] (gate rows first), down_proj [E, d, F].
    let gu = w.shaped(&names.fused_gate_up, &[e_n, 2 * f, d])?;
    let dn = w.shaped(&names.fused_down, &[e_n, d, f])?;
    Ok((0..e_n)
        .map(|e| {
            let g0 = e * 2 * f * d;
            ExpertData {
                gate: MatrixData::quantize(q, f, d, &gu[g0..g0 + f * d]),
                up: MatrixData::quantize(q, f, d, &gu[g0 + f * d..g0 + 2 * f * d]),
                down: MatrixData::quantize(q, d, f, &dn[e * d * f..(e + 1) * d * f]),
            }
        })
        .collect())
}

/// Imports the HuggingFace model directory `dir` into `out` (.cflow), quantizing every matrix
/// to `quant`. `max_ctx` overrides the stored context (default: `max_position_embeddings`,
/// capped at [`DEFAULT_MAX_CTX`]). `progress(done, total)` after each layer.
pub fn import_hf(
    dir: &Path,
    out: &Path,
    quant: QuantType,
    max_ctx: Option<usize>,
    mut progress: impl FnMut(usize, usize),
) -> Result<ModelConfig, HfError> {
    if !dir.is_dir() {
        return Err(HfError::MissingFile {
            dir: dir.to_path_buf(),
            what: "not a directory".into(),
        });
    }
    if !dir.join("config.json").is_file() {
        return Err(HfError::MissingFile {
            dir: dir.to_path_buf(),
            what: "no config.json".into(),
        });
    }
    let w = Weights::open(dir)?;
    let Plan {
        fam,
        mut cfg,
        dense,
        tied,
    } = plan(dir, &w, max_ctx, quant)?;
    load_tokenizer(dir, &mut cfg.meta, cfg.vocab)?;
    let (d, qd, kvd) = (cfg.d_model, cfg.q_dim(), cfg.kv_dim());
    let q = quant;
    let mut wr = CflowWriter::create_for(out, &cfg, &[dir])?;
    let total = cfg.n_layers + 1;
    for i in 0..cfg.n_layers {
        let p = |s: &str| format!("model.layers.{i}.{s}");
        let bias = |s: &str, n: usize| -> Result<Option<Vec<f32>>, HfError> {
            if cfg.qkv_bias() {
                w.vector(&p(s), n).map(Some)
            } else if w.has(&p(s)) {
                Err(HfError::Config {
                    file: dir.join("config.json"),
                    why: format!(
                        "checkpoint has `{}` but the config declares no Q/K/V bias",
                        p(s)
                    ),
                })
            } else {
                Ok(None)
            }
        };
        if w.has(&p("self_attn.o_proj.bias")) {
            return Err(HfError::Unsupported {
                file: dir.join("config.json"),
                arch: cfg.meta.arch.clone(),
                why: "o_proj.bias cannot be stored in .cflow".into(),
            });
        }
        let mut l = LayerData {
            q: w.matrix(&p("self_attn.q_proj.weight"), qd, d, q)?,
            k: w.matrix(&p("self_attn.k_proj.weight"), kvd, d, q)?,
            v: w.matrix(&p("self_attn.v_proj.weight"), kvd, d, q)?,
            o: w.matrix(&p("self_attn.o_proj.weight"), d, qd, q)?,
            q_bias: bias("self_attn.q_proj.bias", qd)?,
            k_bias: bias("self_attn.k_proj.bias", kvd)?,
            v_bias: bias("self_attn.v_proj.bias", kvd)?,
            q_norm: None,
            k_norm: None,
            post_attn_norm: None,
            post_ffn_norm: None,
            shared_gate: None,
            router_bias: None,
            gate: None,
            up: None,
            down: None,
            attn_norm: w.vector(&p("input_layernorm.weight"), d)?,
            ffn_norm: None,
            moe_norm: None,
            router: None,
            experts: Vec::new(),
        };
        if cfg.qk_norm() {
            l.q_norm = Some(w.vector(&p("self_attn.q_norm.weight"), qd)?);
            l.k_norm = Some(w.vector(&p("self_attn.k_norm.weight"), kvd)?);
        }
        if dense {
            l.ffn_norm = Some(w.vector(&p("post_attention_layernorm.weight"), d)?);
            l.gate = Some(w.matrix(&p("mlp.gate_proj.weight"), cfg.d_ff, d, q)?);
            l.up = Some(w.matrix(&p("mlp.up_proj.weight"), cfg.d_ff, d, q)?);
            l.down = Some(w.matrix(&p("mlp.down_proj.weight"), d, cfg.d_ff, q)?);
        }
        if cfg.has_experts() {
            let names = moe_names(fam, i);
            let mut router = names.router.clone();
            if fam == Family::Mixtral && !w.has(&router) && w.has(&p("mlp.gate.weight")) {
                router = p("mlp.gate.weight");
            }
            l.moe_norm = Some(match fam {
                Family::PipelineNative => w.vector(&p("moe_norm.weight"), d)?,
                _ => w.vector(&p("post_attention_layernorm.weight"), d)?,
            });
            l.router = Some(w.shaped(&router, &[cfg.n_experts, d])?);
            l.experts = experts(&w, &names, &cfg, q)?;
        }
        wr.write_layer(&l)?;
        progress(i + 1, total);
    }
    let embedding = w.matrix("model.embed_tokens.weight", cfg.vocab, d, q)?;
    let lm_head = if tied {
        None
    } else {
        Some(w.matrix("lm_head.weight", cfg.vocab, d, q)?)
    };
    let final_norm = w.vector("model.norm.weight", d)?;
    // A shard truncated while mapped reads as zeros (`format::sigbus`): write nothing then.
    if let Some(s) = w.shards.iter().find(|s| s.map.changed()) {
        return Err(HfError::Io {
            file: s.path.clone(),
            source: std::io::Error::other("truncated while it was being imported"),
        });
    }
    wr.finish(
        &VocabData {
            embedding,
            lm_head,
            final_norm,
        },
        &cfg.meta,
    )?;
    progress(total, total);
    Ok(cfg)
}
