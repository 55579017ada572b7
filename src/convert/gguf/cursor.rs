//! The bounds-checked byte cursor the parser reads with: every read checks the bytes left, every
//! count is checked against them before allocation, and parsed metadata is charged against
//! [`MAX_METADATA_MEMORY`].

use super::{GgufArray, GgufError, GgufValue, GgufValueType, MAX_ARRAY_DEPTH, MAX_METADATA_MEMORY};

/// Estimated bytes of one parsed value (the enum) and of a string's heap allocation overhead.
pub(super) const VALUE_COST: u64 = std::mem::size_of::<GgufValue>() as u64;
const STRING_OVERHEAD: u64 = 16;

pub(super) struct Cursor<'a> {
    pub(super) file: &'a str,
    pub(super) buf: &'a [u8],
    pub(super) pos: usize,
    /// Estimated bytes the parsed metadata may still take (see [`MAX_METADATA_MEMORY`]).
    pub(super) mem_left: u64,
}

impl<'a> Cursor<'a> {
    pub(super) fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    pub(super) fn take(
        &mut self,
        n: u64,
        what: &dyn Fn() -> String,
    ) -> Result<&'a [u8], GgufError> {
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

    pub(super) fn array<const N: usize>(
        &mut self,
        what: &dyn Fn() -> String,
    ) -> Result<[u8; N], GgufError> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    pub(super) fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    pub(super) fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// Charges `bytes` of parsed metadata against the memory bound.
    pub(super) fn charge(
        &mut self,
        bytes: u64,
        what: &dyn Fn() -> String,
    ) -> Result<(), GgufError> {
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

    pub(super) fn string(&mut self, what: &dyn Fn() -> String) -> Result<String, GgufError> {
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
    pub(super) fn check_count(
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

    pub(super) fn value(
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

pub(super) fn align_up(x: u64, a: u64) -> Option<u64> {
    x.checked_add(a - 1).map(|v| v / a * a)
}
