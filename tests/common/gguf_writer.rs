//! A minimal GGUF writer for tests: valid files, plus the byte positions of every field so tests
//! can corrupt them. Shared by the integration tests (`mod common` / `tiny_gguf`) and, through
//! `#[path]`, by the library's unit tests as `convert::gguf::testutil` (`cfg(test)` only, never
//! part of the library).
#![allow(dead_code)] // each test binary uses its own subset
use cflow::convert::gguf::{GgufArray, GgufValue, GgufValueType};

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
    GgufValue::Array(GgufArray {
        elem_type: GgufValueType::String,
        values: items
            .iter()
            .map(|s| GgufValue::String(s.as_ref().to_string()))
            .collect(),
    })
}

/// Convenience: an array of i32.
pub fn i32_array(items: &[i32]) -> GgufValue {
    GgufValue::Array(GgufArray {
        elem_type: GgufValueType::I32,
        values: items.iter().map(|&i| GgufValue::I32(i)).collect(),
    })
}

/// Convenience: an array of f32.
pub fn f32_array(items: &[f32]) -> GgufValue {
    GgufValue::Array(GgufArray {
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
