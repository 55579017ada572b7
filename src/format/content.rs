//! Content hashes: the SHA-256 of a `.cflow`'s data, i.e. every byte from the start of layer
//! region 0 to the end of the vocabulary region (directories, tiles, vectors, experts and the
//! padding between regions: all the weights). The writer hashes those bytes as it writes them
//! and records the result in the metadata JSON (`"content_hash": "sha256:<hex>"`), so matching a
//! file costs nothing at open; a `.vflow` records its source's hash (`"source_content_hash"`).
//! Files written before the key existed are hashed on demand (one pass over the data).
//!
//! Recording is an additive metadata key: readers that predate it ignore it, and the layout and
//! version stay the same (docs/FORMAT.md, "Versioning").

use super::error::FormatError;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use std::path::Path;

/// Metadata key of a `.cflow`'s own content hash.
pub const CONTENT_HASH_KEY: &str = "content_hash";
/// Metadata key (embedded metadata of a `.vflow`) of the source `.cflow`'s content hash.
pub const SOURCE_HASH_KEY: &str = "source_content_hash";
const PREFIX: &str = "sha256:";

/// A SHA-256 content hash.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ContentHash(pub [u8; 32]);

impl ContentHash {
    /// `sha256:<64 hex digits>`, as stored in the metadata.
    pub fn to_tag(&self) -> String {
        let mut s = String::with_capacity(PREFIX.len() + 64);
        s.push_str(PREFIX);
        for b in self.0 {
            s.push_str(&format!("{b:02x}"));
        }
        s
    }

    /// Parses [`ContentHash::to_tag`]'s form.
    pub fn from_tag(s: &str) -> Option<ContentHash> {
        let hex = s.strip_prefix(PREFIX)?;
        if hex.len() != 64 || !hex.bytes().all(|c| c.is_ascii_hexdigit()) {
            return None;
        }
        let mut out = [0u8; 32];
        for (i, o) in out.iter_mut().enumerate() {
            *o = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(ContentHash(out))
    }

    /// The first 16 hex digits (for messages).
    pub fn short(&self) -> String {
        self.to_tag()[PREFIX.len()..PREFIX.len() + 16].to_string()
    }
}

impl std::fmt::Debug for ContentHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.to_tag())
    }
}

/// Incremental hasher (the writer feeds it the bytes of every region as it writes them).
#[derive(Clone, Default)]
pub struct ContentHasher(Sha256);

impl ContentHasher {
    pub fn new() -> ContentHasher {
        ContentHasher(Sha256::new())
    }
    pub fn update(&mut self, b: &[u8]) {
        self.0.update(b);
    }
    pub fn finish(self) -> ContentHash {
        ContentHash(self.0.finalize().into())
    }
}

/// Hash of `bytes` in one go.
pub fn hash_bytes(bytes: &[u8]) -> ContentHash {
    let mut h = ContentHasher::new();
    // Chunked so the page cache is streamed, not one huge update (same result).
    for c in bytes.chunks(1 << 20) {
        h.update(c);
    }
    h.finish()
}

/// `json` (a serialized JSON object, non-empty) with `"key": "<tag>"` appended as its last
/// member. The existing members keep their bytes and order.
pub fn append_to_metadata(mut json: Vec<u8>, key: &str, h: &ContentHash) -> Vec<u8> {
    while json.last().is_some_and(|c| c.is_ascii_whitespace()) {
        json.pop();
    }
    debug_assert_eq!(json.last(), Some(&b'}'));
    json.pop();
    let empty = json.iter().rev().find(|c| !c.is_ascii_whitespace()) == Some(&b'{');
    if !empty {
        json.push(b',');
    }
    json.extend_from_slice(format!("\"{key}\":\"{}\"}}", h.to_tag()).as_bytes());
    json
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Keys {
    content_hash: Option<serde_json::Value>,
    source_content_hash: Option<serde_json::Value>,
}

/// The hashes recorded in a metadata JSON: (`content_hash`, `source_content_hash`). A key that
/// is present but not a `sha256:<64 hex>` string is a typed error naming the field.
pub fn read_from_metadata(
    file: &Path,
    json: &[u8],
) -> Result<(Option<ContentHash>, Option<ContentHash>), FormatError> {
    let k: Keys = serde_json::from_slice(json).map_err(|e| FormatError::BadMetadata {
        file: file.into(),
        why: e.to_string(),
    })?;
    let one = |field: &'static str, v: Option<serde_json::Value>| match v {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(v) => v
            .as_str()
            .and_then(ContentHash::from_tag)
            .map(Some)
            .ok_or_else(|| FormatError::BadMetaField {
                file: file.into(),
                field,
                value: v.to_string().chars().take(80).collect(),
                why: "must be \"sha256:\" followed by 64 hex digits".into(),
            }),
    };
    Ok((
        one(CONTENT_HASH_KEY, k.content_hash)?,
        one(SOURCE_HASH_KEY, k.source_content_hash)?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_roundtrip_and_reject_garbage() {
        let h = hash_bytes(b"abc");
        assert_eq!(
            h.to_tag(),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(ContentHash::from_tag(&h.to_tag()), Some(h));
        for bad in ["", "sha256:", "sha256:zz", "md5:00", &h.to_tag()[..70]] {
            assert_eq!(ContentHash::from_tag(bad), None, "{bad}");
        }
    }

    #[test]
    fn appending_keeps_the_json_valid_and_readable() {
        let h = hash_bytes(b"x");
        let j = append_to_metadata(br#"{"a":1,"b":[2]}"#.to_vec(), CONTENT_HASH_KEY, &h);
        let v: serde_json::Value = serde_json::from_slice(&j).unwrap();
        assert_eq!(v["a"], 1);
        let p = Path::new("m.cflow");
        assert_eq!(read_from_metadata(p, &j).unwrap(), (Some(h), None));
        let j = append_to_metadata(b"{ }\n".to_vec(), SOURCE_HASH_KEY, &h);
        assert_eq!(read_from_metadata(p, &j).unwrap(), (None, Some(h)));
        let e = read_from_metadata(p, br#"{"content_hash":"sha256:12"}"#).unwrap_err();
        assert!(e.to_string().contains("content_hash"), "{e}");
    }
}
