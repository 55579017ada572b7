//! Typed metadata accessors of [`GgufFile`] (`get_u32`, `get_str_array`, `opt_f32`, ...): what
//! the importers and the tokenizer builder read the metadata through. A missing key or a value of
//! the wrong type is a [`GgufError`] naming the file and the key.

use super::{GgufArray, GgufError, GgufFile, GgufValue};

impl GgufFile {
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
}
