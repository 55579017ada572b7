//! Incremental, UTF-8-safe detokenizer.
//!
//! Owns: [`Detok`], which turns a stream of token ids into text pieces as they are generated.
//! Byte-level tokens can split one multi-byte character across several tokens; `push` returns only
//! complete UTF-8 text and holds back an incomplete tail (at most 3 bytes) until the next token
//! completes it. Bytes that can never form valid UTF-8 are emitted as U+FFFD (exactly as a
//! lossy whole-sequence decode would), so output is never stuck. Special (control) tokens are
//! skipped unless asked for.

use std::sync::Arc;

use super::tokenizer::TokenBytes;

/// Streaming detokenizer over a [`TokenBytes`] table.
#[derive(Clone, Debug)]
pub struct Detok {
    table: Arc<TokenBytes>,
    pending: Vec<u8>,
    at_start: bool,
    show_special: bool,
}

impl Detok {
    /// New detokenizer; special tokens are skipped.
    pub fn new(table: Arc<TokenBytes>) -> Self {
        Detok {
            table,
            pending: Vec::new(),
            at_start: true,
            show_special: false,
        }
    }

    /// Render special tokens (e.g. `<|im_end|>`) as their text instead of skipping them.
    pub fn with_special(mut self, show: bool) -> Self {
        self.show_special = show;
        self
    }

    /// Start a new stream (e.g. a new turn): drops held-back bytes.
    pub fn reset(&mut self) {
        self.pending.clear();
        self.at_start = true;
    }

    /// Feed one id; returns the newly completed text (possibly empty).
    pub fn push(&mut self, id: u32) -> String {
        if self.table.is_special(id) && !self.show_special {
            return String::new();
        }
        let b = self.table.get(id);
        if self.at_start && !b.is_empty() {
            self.at_start = false;
            if self.table.strip_leading_space && b[0] == b' ' {
                self.pending.extend_from_slice(&b[1..]);
                return self.drain(false);
            }
        }
        self.pending.extend_from_slice(b);
        self.drain(false)
    }

    /// End of stream: returns whatever is held back (incomplete sequences as U+FFFD).
    pub fn flush(&mut self) -> String {
        self.drain(true)
    }

    /// Bytes currently held back.
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    fn drain(&mut self, all: bool) -> String {
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (good, bad) = rest.split_at(e.valid_up_to());
                    // `good` is valid by construction.
                    out.push_str(std::str::from_utf8(good).unwrap_or_default());
                    match e.error_len() {
                        Some(n) => {
                            out.push('\u{FFFD}');
                            rest = &bad[n..];
                        }
                        None => {
                            // Incomplete sequence at the end: wait for more bytes.
                            if all {
                                out.push('\u{FFFD}');
                                rest = &[];
                            } else {
                                rest = bad;
                            }
                            break;
                        }
                    }
                }
            }
        }
        self.pending = rest.to_vec();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(tokens: &[&[u8]]) -> Arc<TokenBytes> {
        Arc::new(TokenBytes::new(
            tokens.iter().map(|t| t.to_vec()).collect(),
            tokens
                .iter()
                .map(|t| *t == b"<|im_end|>".as_slice())
                .collect(),
            false,
        ))
    }

    #[test]
    fn multibyte_split_across_tokens() {
        // "é" = C3 A9, "日" = E6 97 A5, "🦀" = F0 9F A6 80
        let t = table(&[
            b"caf",
            b"\xC3",
            b"\xA9",
            b"\xE6\x97",
            b"\xA5",
            b"\xF0",
            b"\x9F\xA6",
            b"\x80",
            b"<|im_end|>",
        ]);
        let mut d = Detok::new(t);
        assert_eq!(d.push(0), "caf");
        assert_eq!(d.push(1), "");
        assert_eq!(d.pending_len(), 1);
        assert_eq!(d.push(2), "é");
        assert_eq!(d.push(3), "");
        assert_eq!(d.push(4), "日");
        assert_eq!(d.push(5), "");
        assert_eq!(d.push(6), "");
        assert_eq!(d.push(8), ""); // special skipped, pending kept
        assert_eq!(d.push(7), "🦀");
        assert_eq!(d.flush(), "");
    }

    #[test]
    fn invalid_bytes_become_replacement() {
        let t = table(&[b"a", b"\xFF", b"\xC3", b"b"]);
        let mut d = Detok::new(t);
        assert_eq!(d.push(0), "a");
        assert_eq!(d.push(1), "\u{FFFD}");
        assert_eq!(d.push(2), "");
        // C3 followed by 'b' is invalid: replacement, then 'b'.
        assert_eq!(d.push(3), "\u{FFFD}b");
        assert_eq!(d.push(2), "");
        assert_eq!(d.flush(), "\u{FFFD}");
        // unknown id: nothing
        assert_eq!(d.push(99), "");
    }

    #[test]
    fn special_shown_on_request_and_leading_space_strip() {
        let mut tb = (*table(&[b" hi", b" there", b"<|im_end|>"])).clone();
        tb.strip_leading_space = true;
        let mut d = Detok::new(Arc::new(tb)).with_special(true);
        assert_eq!(d.push(0), "hi");
        assert_eq!(d.push(1), " there");
        assert_eq!(d.push(2), "<|im_end|>");
        d.reset();
        assert_eq!(d.push(1), "there");
    }
}
